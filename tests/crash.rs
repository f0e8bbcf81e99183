//! Crash safety: the daemon is killed with SIGKILL in the middle of sustained registration writes, a
//! hundred times in a row on the same data directory. After every restart the store opens, nothing
//! stored is unreadable, and every registration that was acknowledged is there, at least at the
//! version acknowledged.

mod common;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::daemon::Daemon;
use rand::Rng;
use serde_json::json;

/// Kill -9 rounds (`AGENTMESH_CRASH_ROUNDS` overrides, for longer runs by hand).
const ROUNDS: usize = 100;
/// Distinct agents written over and over (new ones and updates).
const AGENTS: u64 = 150;

fn rounds() -> usize {
    std::env::var("AGENTMESH_CRASH_ROUNDS").ok().and_then(|v| v.parse().ok()).unwrap_or(ROUNDS)
}

/// Registers agents as fast as the daemon acknowledges them, recording each acknowledged version.
async fn write_until_killed(http: String, acked: Arc<Mutex<HashMap<u64, u64>>>, mut counter: u64) -> u64 {
    let mut done = 0;
    let client = reqwest::Client::builder().timeout(Duration::from_secs(5)).build().unwrap();
    loop {
        counter += 1;
        let agent = counter % AGENTS;
        let card = json!({
            "agent_id": format!("crash-{agent}"), "base_url": "http://127.0.0.1:9",
            "version": format!("{counter}.0.0"), "skills": [{"id": "s", "tags": ["t"]}]
        });
        match client.post(format!("{http}/api/v1/agents")).json(&card).send().await {
            Ok(r) if r.status().is_success() => {
                acked.lock().unwrap().insert(agent, counter);
                done += 1;
            }
            // The daemon is gone: this write was never acknowledged.
            _ => return done,
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_acknowledged_registration_survives_a_hundred_kill_9s() {
    let dir = tempfile::tempdir().unwrap();
    let acked: Arc<Mutex<HashMap<u64, u64>>> = Arc::default();
    let mut rng = rand::rng();
    let mut writes = 0u64;
    for round in 0..rounds() {
        let mut daemon = Daemon::start_in(dir.path(), &[]).unwrap_or_else(|e| panic!("round {round}: {e}"));
        assert_eq!(daemon.store_opened["unreadable"], 0, "round {round}: {}", daemon.store_opened);

        // Everything acknowledged before the last kill is there.
        let expected = acked.lock().unwrap().clone();
        let listed = daemon.get("/api/v1/agents?limit=1000").await;
        let held: HashMap<String, u64> = listed["agents"]
            .as_array()
            .unwrap()
            .iter()
            .map(|a| {
                let version = a["card"]["version"].as_str().unwrap();
                (
                    a["agent_id"].as_str().unwrap().to_owned(),
                    version.split('.').next().unwrap().parse().unwrap(),
                )
            })
            .collect();
        for (agent, version) in &expected {
            let id = format!("crash-{agent}");
            let stored = held.get(&id).copied();
            assert!(
                stored.is_some_and(|s| s >= *version),
                "round {round}: {id} acknowledged at version {version}, stored {stored:?}"
            );
        }

        // Write, and kill -9 at a random moment.
        let counter = (round as u64 + 1) * 1_000_000;
        let writer = tokio::spawn(write_until_killed(daemon.http.clone(), acked.clone(), counter));
        tokio::time::sleep(Duration::from_millis(rng.random_range(20..250))).await;
        daemon.child.kill().unwrap();
        daemon.child.wait().unwrap();
        writes += writer.await.unwrap();
    }
    assert!(writes > rounds() as u64, "writes were under way when the kills came ({writes} acknowledged)");
    eprintln!("crash: {} kill -9 rounds, {writes} registrations acknowledged in all", rounds());
}
