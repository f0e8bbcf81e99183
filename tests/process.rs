//! The real binary as an operator runs it: start, serve, SIGTERM, exit 0; `agentmesh id`; bad settings.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

const BIN: &str = env!("CARGO_BIN_EXE_agentmesh");
const DEADLINE: Duration = Duration::from_secs(10);

#[test]
fn runs_serves_and_stops_cleanly_on_sigterm() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let mut child = Command::new(BIN)
        .args([
            "run",
            "--http",
            "127.0.0.1:0",
            "--log-format",
            "json",
            "--no-mdns",
            "--listen",
            "/ip4/127.0.0.1/tcp/0",
        ])
        .arg("--data-dir")
        .arg(&data)
        .env_remove("RUST_LOG")
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let (tx, rx) = mpsc::channel();
    let stderr = child.stderr.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let started = loop {
        let line = rx.recv_timeout(DEADLINE).expect("node started log line");
        let v: serde_json::Value = serde_json::from_str(&line).unwrap_or_else(|e| panic!("{e}: {line}"));
        if v["message"] == "node started" {
            break v;
        }
    };
    let addr = started["http_addr"].as_str().unwrap().to_owned();
    let peer_id = started["peer_id"].as_str().unwrap().to_owned();

    let rt = tokio::runtime::Runtime::new().unwrap();
    let health: serde_json::Value = rt.block_on(async {
        reqwest::get(format!("http://{addr}/api/v1/health")).await.unwrap().json().await.unwrap()
    });
    assert_eq!(health["peer_id"], peer_id.as_str());

    let out = Command::new(BIN).args(["peers", "--api", &format!("http://{addr}")]).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let shown = String::from_utf8(out.stdout).unwrap();
    assert!(shown.contains(&peer_id) && shown.contains("listening on   /ip4/127.0.0.1/tcp/"), "{shown}");

    let status = Command::new("kill").args(["-TERM", &child.id().to_string()]).status().unwrap();
    assert!(status.success());
    let start = std::time::Instant::now();
    let exit = loop {
        if let Some(exit) = child.try_wait().unwrap() {
            break exit;
        }
        assert!(start.elapsed() < Duration::from_secs(5), "still running 5 s after SIGTERM");
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(exit.success(), "{exit:?}");

    let out = Command::new(BIN).arg("id").arg("--data-dir").arg(&data).output().unwrap();
    assert!(out.status.success());
    assert_eq!(String::from_utf8(out.stdout).unwrap().trim(), peer_id, "the identity is reused");
}

#[test]
fn peers_names_an_unreachable_daemon() {
    let out = Command::new(BIN).args(["peers", "--api", "http://127.0.0.1:9"]).output().unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("cannot reach the daemon at http://127.0.0.1:9"), "{err}");
}

#[test]
fn an_invalid_setting_is_refused_at_start_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(BIN)
        .args(["run", "--http", "127.0.0.1:0", "--listen", "/ip4/127.0.0.1/tcp/0", "--degraded-after", "1s"])
        .arg("--data-dir")
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("degraded_after"), "{err}");

    let file = dir.path().join("bad.toml");
    std::fs::write(&file, "mdns = \"perhaps\"\n").unwrap();
    let out = Command::new(BIN).args(["run", "--config"]).arg(&file).output().unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("mdns") && err.contains("bad.toml"), "{err}");
}
