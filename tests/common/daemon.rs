//! The real binary as a child process, for tests that measure it from outside (memory, sockets).

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use libp2p::PeerId;
use serde_json::Value;

pub const BIN: &str = env!("CARGO_BIN_EXE_agentmesh");
pub const DEADLINE: Duration = Duration::from_secs(60);

/// The 99th percentile of some latencies (sorts them).
pub fn p99(latencies: &mut [Duration]) -> Duration {
    latencies.sort();
    latencies[(latencies.len() * 99 / 100).min(latencies.len() - 1)]
}

pub struct Daemon {
    pub child: Child,
    pub http: String,
    pub peer_id: PeerId,
    /// The "store opened" log event: what the store held at start.
    pub store_opened: Value,
    /// Log lines printed after start, for tests that read them (kept in memory otherwise).
    logs: std::sync::Mutex<std::sync::mpsc::Receiver<String>>,
    _dir: Option<tempfile::TempDir>,
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Daemon {
    /// Starts the binary on ephemeral ports with mDNS off, plus `args`, in a fresh data directory.
    pub fn start(args: &[&str]) -> Daemon {
        let dir = tempfile::tempdir().unwrap();
        let mut daemon = Daemon::start_in(dir.path(), args).unwrap_or_else(|e| panic!("{e}"));
        daemon._dir = Some(dir);
        daemon
    }

    /// Starts the binary on `data_dir`; the error is what it printed when it did not start.
    pub fn start_in(data_dir: &std::path::Path, args: &[&str]) -> Result<Daemon, String> {
        Daemon::start_filtered(data_dir, args, None)
    }

    /// Starts the binary like [`Daemon::start`], logging what `filter` (a `RUST_LOG` directive) lets through.
    pub fn start_logging(filter: &str, args: &[&str]) -> Daemon {
        let dir = tempfile::tempdir().unwrap();
        let mut daemon =
            Daemon::start_filtered(dir.path(), args, Some(filter)).unwrap_or_else(|e| panic!("{e}"));
        daemon._dir = Some(dir);
        daemon
    }

    fn start_filtered(
        data_dir: &std::path::Path,
        args: &[&str],
        filter: Option<&str>,
    ) -> Result<Daemon, String> {
        let mut command = Command::new(BIN);
        match filter {
            Some(filter) => command.env("RUST_LOG", filter),
            None => command.env_remove("RUST_LOG"),
        };
        let mut child = command
            .args(["run", "--http", "127.0.0.1:0", "--log-format", "json", "--no-mdns"])
            .args(["--listen", "/ip4/127.0.0.1/tcp/0"])
            .args(args)
            .arg("--data-dir")
            .arg(data_dir)
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let stderr = BufReader::new(child.stderr.take().unwrap());
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in stderr.lines().map_while(Result::ok) {
                let _ = tx.send(line);
            }
        });
        let mut store_opened = Value::Null;
        let mut printed = Vec::new();
        let started = loop {
            let Ok(line) = rx.recv_timeout(DEADLINE) else {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!("did not start: {}", printed.join("\n")));
            };
            let v: Value = serde_json::from_str(&line).unwrap_or(Value::Null);
            if v["message"] == "store opened" {
                store_opened = v.clone();
            }
            if v["message"] == "node started" {
                break v;
            }
            printed.push(line);
        };
        // The reader thread keeps draining the pipe, so the daemon never blocks on it.
        Ok(Daemon {
            child,
            http: format!("http://{}", started["http_addr"].as_str().unwrap()),
            peer_id: started["peer_id"].as_str().unwrap().parse().unwrap(),
            store_opened,
            logs: std::sync::Mutex::new(rx),
            _dir: None,
        })
    }

    pub async fn get(&self, path: &str) -> Value {
        reqwest::get(format!("{}{path}", self.http)).await.unwrap().json().await.unwrap()
    }

    /// Registers a card through the native API.
    pub async fn register(&self, card: &Value) -> reqwest::Response {
        let url = format!("{}/api/v1/agents", self.http);
        reqwest::Client::new().post(url).json(card).send().await.unwrap()
    }

    /// The next JSON log event (after those already read) for which `matches` holds.
    pub fn wait_log(&self, what: &str, matches: impl Fn(&Value) -> bool) -> Value {
        let logs = self.logs.lock().unwrap();
        let start = Instant::now();
        loop {
            let left = DEADLINE.saturating_sub(start.elapsed());
            let line = logs.recv_timeout(left).unwrap_or_else(|_| panic!("no log event: {what}"));
            let event: Value = serde_json::from_str(&line).unwrap_or(Value::Null);
            if matches(&event) {
                return event;
            }
        }
    }

    pub async fn status(&self) -> Value {
        self.get("/api/v1/mesh/status").await
    }

    pub fn rss_mb(&self) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id())).unwrap();
        let kb: u64 = status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse().ok())
            .unwrap();
        kb / 1024
    }

    pub async fn wait_for(&self, what: &str, check: impl Fn(&Value) -> bool) -> Value {
        let start = Instant::now();
        loop {
            let status = self.status().await;
            if check(&status) {
                return status;
            }
            assert!(start.elapsed() < DEADLINE, "timed out waiting for {what}: {status}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}
