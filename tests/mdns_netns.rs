//! mDNS discovery between real processes: two daemons in two network namespaces joined by a veth pair,
//! with no bootstrap address, find each other and share their cards. Needs root (it creates the
//! namespaces; CI runs as root) and iproute2's `ip`.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_agentmesh");
const DEADLINE: Duration = Duration::from_secs(20);

/// Two namespaces `a` and `b`, veth-linked on a private /24 that exists only between them.
struct Namespaces {
    a: String,
    b: String,
    /// a's end of the veth pair.
    va: String,
}

/// Tests of one process run in parallel: each pair of namespaces needs its own names.
static PAIRS: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);

fn ip(args: &[&str]) {
    let out = Command::new("ip").args(args).output().expect("iproute2 `ip` is installed");
    assert!(
        out.status.success(),
        "ip {}: {} (this test needs root)",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
}

impl Namespaces {
    fn create() -> Self {
        let tag =
            format!("{}x{}", std::process::id(), PAIRS.fetch_add(1, std::sync::atomic::Ordering::Relaxed));
        let (a, b) = (format!("amtest-a-{tag}"), format!("amtest-b-{tag}"));
        let (va, vb) = (format!("amva{tag}"), format!("amvb{tag}"));
        ip(&["netns", "add", &a]);
        let ns = Namespaces { a: a.clone(), b: b.clone(), va: va.clone() };
        ip(&["netns", "add", &b]);
        ip(&["link", "add", &va, "type", "veth", "peer", "name", &vb]);
        ip(&["link", "set", &va, "netns", &a]);
        ip(&["link", "set", &vb, "netns", &b]);
        ip(&["-n", &a, "addr", "add", "10.231.7.1/24", "dev", &va]);
        ip(&["-n", &b, "addr", "add", "10.231.7.2/24", "dev", &vb]);
        for (n, v) in [(&a, &va), (&b, &vb)] {
            ip(&["-n", n, "link", "set", v, "up"]);
            ip(&["-n", n, "link", "set", "lo", "up"]);
        }
        ns
    }

    fn run(&self, ns: &str, args: &[&str]) -> Command {
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", ns, BIN]).args(args);
        cmd
    }
}

impl Drop for Namespaces {
    fn drop(&mut self) {
        // Deleting a namespace deletes its end of the veth pair, and with it the other end.
        for n in [&self.a, &self.b] {
            let _ = Command::new("ip").args(["netns", "del", n]).status();
        }
    }
}

struct Daemon(Child);

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn two_namespaces_find_each_other_by_mdns_alone() {
    let ns = Namespaces::create();
    let dir = tempfile::tempdir().unwrap();
    let card = dir.path().join("card.json");
    std::fs::copy(concat!(env!("CARGO_MANIFEST_DIR"), "/config/cards/research-agent.json"), &card).unwrap();
    let start = |name: &str, extra: &[&str]| {
        let data = dir.path().join(name);
        let data = data.to_str().unwrap();
        let mut args =
            vec!["run", "--data-dir", data, "--http", "127.0.0.1:18080", "--listen", "/ip4/0.0.0.0/tcp/4001"];
        args.extend_from_slice(extra);
        let namespace = if name == "a" { &ns.a } else { &ns.b };
        Daemon(ns.run(namespace, &args).stdout(Stdio::null()).stderr(Stdio::null()).spawn().unwrap())
    };
    // a's identity exists before a runs, so the id printed is the one a will use.
    let a_id = String::from_utf8(
        ns.run(&ns.a, &["id", "--data-dir", dir.path().join("a").to_str().unwrap()]).output().unwrap().stdout,
    )
    .unwrap()
    .trim()
    .to_owned();

    // b first, and serving, before a exists: b's first mDNS query finds nobody, and when a's PeerId is
    // the higher one a does not dial, so the pair meets only when b asks again.
    let _b = start("b", &[]);
    let begun = Instant::now();
    while !ns.run(&ns.b, &["peers", "--api", "http://127.0.0.1:18080"]).output().unwrap().status.success() {
        assert!(begun.elapsed() < DEADLINE, "b never started");
        std::thread::sleep(Duration::from_millis(50));
    }
    let _a = start("a", &["--card", card.to_str().unwrap()]);
    let begun = Instant::now();
    loop {
        let out = ns.run(&ns.b, &["peers", "--api", "http://127.0.0.1:18080"]).output().unwrap();
        let shown = String::from_utf8_lossy(&out.stdout);
        // Connected to a, over the veth, and holding a's agent.
        if shown.contains(&a_id)
            && shown.contains("/ip4/10.231.7.1/tcp/4001")
            && shown.contains("\"active\":1")
        {
            break;
        }
        assert!(begun.elapsed() < DEADLINE, "b never found a by mDNS:\n{shown}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// A peer whose network vanishes without a goodbye (no FIN: its address is gone) and comes back at a
/// new address is reached again: the dead connection fails its pings and is closed, so mDNS redials.
#[test]
fn a_peer_cut_off_and_back_at_a_new_address_is_reconnected() {
    let ns = Namespaces::create();
    let dir = tempfile::tempdir().unwrap();
    let start = |name: &str| {
        let data = dir.path().join(name);
        let args = [
            "run",
            "--data-dir",
            data.to_str().unwrap(),
            "--http",
            "127.0.0.1:18080",
            "--listen",
            "/ip4/0.0.0.0/tcp/4001",
        ];
        let namespace = if name == "a" { &ns.a } else { &ns.b };
        Daemon(ns.run(namespace, &args).stdout(Stdio::null()).stderr(Stdio::null()).spawn().unwrap())
    };
    let a_id = String::from_utf8(
        ns.run(&ns.a, &["id", "--data-dir", dir.path().join("a").to_str().unwrap()]).output().unwrap().stdout,
    )
    .unwrap()
    .trim()
    .to_owned();
    let _a = start("a");
    let _b = start("b");
    let b_sees = |needle: &str, patience: Duration| {
        let begun = Instant::now();
        loop {
            let out = ns.run(&ns.b, &["peers", "--api", "http://127.0.0.1:18080"]).output().unwrap();
            let shown = String::from_utf8_lossy(&out.stdout).into_owned();
            if shown.lines().any(|l| l.contains(&a_id) && l.contains(needle)) {
                return;
            }
            assert!(begun.elapsed() < patience, "b never saw a at {needle}:\n{shown}");
            std::thread::sleep(Duration::from_millis(200));
        }
    };
    b_sees("/ip4/10.231.7.1/", DEADLINE);

    // a's address disappears under its open connections, and a returns at another one.
    ip(&["-n", &ns.a, "addr", "del", "10.231.7.1/24", "dev", &ns.va]);
    ip(&["-n", &ns.a, "addr", "add", "10.231.7.3/24", "dev", &ns.va]);
    // Ping period + timeout (20 s), then an mDNS query (5 s) and a dial.
    b_sees("/ip4/10.231.7.3/", Duration::from_secs(60));
}
