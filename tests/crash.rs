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

/// Agents a node catches up with from its peer (remote rows, flushed on sled's own schedule).
const REMOTE_AGENTS: usize = 300;

/// Records a node holds, whatever their health (its mesh status counts them by health).
fn held(status: &serde_json::Value) -> u64 {
    status["records"].as_object().map_or(0, |by_health| by_health.values().filter_map(|n| n.as_u64()).sum())
}

/// A node killed with SIGKILL right after it caught up may lose the remote rows its store had not
/// flushed yet (`STORE_FLUSH_EVERY`): those are not acknowledged writes of its own, and the mesh sends
/// them again. The node starts on what its store kept, with nothing unreadable and no witness alarm,
/// and holds the whole view again once it reaches its peer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn remote_rows_lost_to_a_kill_9_come_back_from_the_mesh() {
    let publisher = Daemon::start(&[]);
    for n in 0..REMOTE_AGENTS {
        let card = json!({
            "agent_id": format!("remote-{n}"), "base_url": "http://127.0.0.1:9",
            "skills": [{"id": "s", "tags": ["t"]}]
        });
        assert!(publisher.register(&card).await.status().is_success());
    }
    let status = publisher.status().await;
    let bootstrap = format!("{}/p2p/{}", status["listen_addrs"][0].as_str().unwrap(), publisher.peer_id);

    let dir = tempfile::tempdir().unwrap();
    let mut joiner = Daemon::start_in(dir.path(), &["--bootstrap", &bootstrap]).unwrap();
    joiner.wait_for("the joiner to hold every agent", |s| held(s) >= REMOTE_AGENTS as u64).await;
    joiner.child.kill().unwrap();
    joiner.child.wait().unwrap();

    let joiner = Daemon::start_in(dir.path(), &["--bootstrap", &bootstrap]).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(joiner.store_opened["unreadable"], 0, "{}", joiner.store_opened);
    eprintln!("remote rows the store kept through the kill: {}", joiner.store_opened["remote"]);
    joiner
        .wait_for("the restarted joiner to hold every agent again", |s| held(s) >= REMOTE_AGENTS as u64)
        .await;
}
