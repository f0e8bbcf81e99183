//! Bad environments, with the real binary: a truncated, corrupted or emptied store, a read-only data
//! directory, a full disk, ports another node holds. Each is a clear error at start, or a documented
//! degraded mode (writes refused with 507 while reads go on); an acknowledged local agent is never lost
//! silently.
//!
//! The read-only and full-disk cases mount small tmpfs file systems, so they need root (as do the
//! network-namespace tests).

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::daemon::{Daemon, BIN};
use serde_json::json;

const AGENTS: usize = 30;

/// A card whose description is `padding` letters that do not compress (the full-disk case must fill
/// its disk).
fn card(i: usize, padding: usize) -> serde_json::Value {
    let description = common::incompressible_text(i as u64, padding);
    json!({"agent_id": format!("agent-{i}"), "base_url": "http://127.0.0.1:9", "description": description,
           "skills": [{"id": "s"}]})
}

/// A data directory holding `AGENTS` acknowledged local agents.
async fn populated(dir: &Path) {
    let daemon = Daemon::start_in(dir, &[]).unwrap();
    for i in 0..AGENTS {
        let r = daemon.register(&card(i, 10)).await;
        assert!(r.status().is_success());
    }
}

fn db_file(dir: &Path) -> PathBuf {
    dir.join("store").join("db")
}

/// A copy of a populated data directory, damaged by `damage`.
fn damaged(source: &Path, damage: impl FnOnce(&Path)) -> tempfile::TempDir {
    let copy = tempfile::tempdir().unwrap();
    let status = Command::new("cp")
        .arg("-a")
        .arg(format!("{}/.", source.display()))
        .arg(copy.path())
        .status()
        .unwrap();
    assert!(status.success());
    damage(copy.path());
    copy
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_that_lost_acknowledged_agents_is_an_error_at_start_unless_accepted() {
    let source = tempfile::tempdir().unwrap();
    populated(source.path()).await;

    let truncated = damaged(source.path(), |d| {
        let f = std::fs::OpenOptions::new().write(true).open(db_file(d)).unwrap();
        f.set_len(1000).unwrap();
    });
    let corrupted = damaged(source.path(), |d| {
        let mut bytes = std::fs::read(db_file(d)).unwrap();
        for b in &mut bytes[300..500] {
            *b ^= 0x5a;
        }
        std::fs::write(db_file(d), bytes).unwrap();
    });
    for (what, dir) in [("truncated", &truncated), ("corrupted", &corrupted)] {
        let e = Daemon::start_in(dir.path(), &[]).err().unwrap_or_else(|| panic!("{what}: started"));
        assert!(e.contains("does not hold the local agents it acknowledged"), "{what}: {e}");
        assert!(e.contains("--accept-store-loss"), "{what}: {e}");
        // Accepting the loss starts with what is left, and says so.
        let daemon = Daemon::start_in(dir.path(), &["--accept-store-loss"]).unwrap();
        let left = daemon.get("/api/v1/agents?limit=0").await["total"].as_u64().unwrap();
        assert!(left < AGENTS as u64, "{what}: {left} left");
        drop(daemon);
        // From then on it is the new baseline.
        Daemon::start_in(dir.path(), &[]).unwrap();
    }

    // An emptied store file is refused by the store itself, naming it.
    let emptied = damaged(source.path(), |d| std::fs::write(db_file(d), b"").unwrap());
    let e = Daemon::start_in(emptied.path(), &[]).err().expect("an empty store file is refused");
    assert!(e.contains("cannot open store") && e.contains("store"), "{e}");

    // The untouched original still has everything.
    let daemon = Daemon::start_in(source.path(), &[]).unwrap();
    assert_eq!(daemon.get("/api/v1/agents?limit=0").await["total"], AGENTS);
}

/// A second node on ports a running node holds. libp2p marks its listening sockets `SO_REUSEPORT`, so
/// without a check of its own the second node started and the kernel split incoming mesh connections
/// between the two. Each port in use is one clear error at start, said once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ports_a_running_node_holds_are_an_error_at_start() {
    let first = Daemon::start(&[]);
    let mesh = first.status().await["listen_addrs"][0].as_str().unwrap().to_owned();
    let other = tempfile::tempdir().unwrap();
    let e =
        Daemon::start_in(other.path(), &["--listen", &mesh]).err().expect("a mesh port in use is refused");
    assert!(e.contains(&format!("cannot listen on {mesh}: Address already in use")), "{e}");
    assert_eq!(e.matches("Address already in use").count(), 1, "said once: {e}");

    // `Daemon::start_in` picks its own HTTP port, so the binary is run directly.
    let http = first.http.trim_start_matches("http://");
    let out = Command::new(BIN)
        .args(["run", "--no-mdns", "--listen", "/ip4/127.0.0.1/tcp/0", "--http", http])
        .arg("--data-dir")
        .arg(other.path())
        .output()
        .unwrap();
    assert!(!out.status.success());
    let e = String::from_utf8_lossy(&out.stderr);
    assert!(e.contains(&format!("cannot listen for HTTP on {http}: Address already in use")), "{e}");
    assert_eq!(e.matches("Address already in use").count(), 1, "said once: {e}");
}

/// A tmpfs mounted on a fresh directory, unmounted on drop.
struct Tmpfs {
    dir: tempfile::TempDir,
}

impl Tmpfs {
    fn mount(size: &str) -> Tmpfs {
        let dir = tempfile::tempdir().unwrap();
        let status = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(dir.path())
            .status()
            .expect("mount (needs root)");
        assert!(status.success(), "mount tmpfs (needs root)");
        Tmpfs { dir }
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }

    fn remount(&self, options: &str) {
        let status = Command::new("mount")
            .args(["-o", &format!("remount,{options}")])
            .arg(self.path())
            .status()
            .unwrap();
        assert!(status.success());
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(self.dir.path()).status();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_only_data_directory_is_an_error_at_start() {
    let fs = Tmpfs::mount("16m");
    let data = fs.path().join("data");
    populated(&data).await;
    fs.remount("ro");
    let e = Daemon::start_in(&data, &[]).err().expect("a read-only data directory is refused");
    assert!(e.contains("Read-only file system") && e.contains("store"), "{e}");
    // Nothing was lost: writable again, everything is there.
    fs.remount("rw");
    let daemon = Daemon::start_in(&data, &[]).unwrap();
    assert_eq!(daemon.get("/api/v1/agents?limit=0").await["total"], AGENTS);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_disk_refuses_writes_with_507_keeps_serving_and_loses_nothing_acknowledged() {
    let fs = Tmpfs::mount("4m");
    let data = fs.path().join("data");
    let daemon = Daemon::start_in(&data, &[]).unwrap();
    let mut acknowledged = Vec::new();
    let mut refused = None;
    for i in 0..2000 {
        let r = daemon.register(&card(i, 4000)).await;
        if r.status().is_success() {
            acknowledged.push(i);
        } else {
            refused = Some((r.status(), r.json::<serde_json::Value>().await.unwrap()));
            break;
        }
    }
    let (status, body) = refused.expect("the disk filled up");
    assert_eq!(status, 507, "{body}");
    assert_eq!(body["error"], "storage_unavailable", "{body}");
    assert!(body["message"].as_str().unwrap().contains("No space left"), "{body}");
    // Reads go on, with everything acknowledged.
    let total = daemon.get("/api/v1/agents?limit=0").await["total"].as_u64().unwrap();
    assert_eq!(total, acknowledged.len() as u64);
    let health = daemon.get("/api/v1/health").await;
    assert_eq!(
        (health["status"].as_str(), health["store_writable"].as_bool()),
        (Some("degraded"), Some(false)),
        "{health}"
    );
    // With room again, a write either works (the full disk was met writing the witness) or is still
    // refused (sled keeps an I/O error until restart); health says which.
    fs.remount("size=64m");
    let status = daemon.register(&card(9999, 10)).await.status();
    let health = daemon.get("/api/v1/health").await;
    match status.as_u16() {
        201 => assert_eq!(health["store_writable"], true, "{health}"),
        507 => assert_eq!(health["store_writable"], false, "{health}"),
        other => panic!("{other}"),
    }
    eprintln!("full disk: a write after room came back: {status}");
    drop(daemon);

    // After a restart with room again, everything acknowledged is there.
    let daemon = Daemon::start_in(&data, &[]).unwrap();
    let held = daemon.get("/api/v1/agents?limit=1000").await;
    let ids: Vec<&str> =
        held["agents"].as_array().unwrap().iter().map(|a| a["agent_id"].as_str().unwrap()).collect();
    for i in &acknowledged {
        assert!(ids.contains(&format!("agent-{i}").as_str()), "agent-{i} was acknowledged and is gone");
    }
    assert_eq!(daemon.get("/api/v1/health").await["status"], "healthy");
    let r = daemon.register(&card(10_000, 10)).await;
    assert!(r.status().is_success(), "writes work again after the restart");
    eprintln!(
        "full disk: {} registrations acknowledged before the 507; all present after restart",
        acknowledged.len()
    );
}
