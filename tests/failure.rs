//! Failure detection: a node whose process dies is declared down by the peers that lost their
//! connection to it, once the peers they ask cannot reach it either, and its agents leave `active`
//! everywhere long before their heartbeats would have aged; live nodes are never declared down.

mod common;

use std::time::{Duration, Instant};

use common::daemon::Daemon;
use serde_json::{json, Value};

/// The daemon's default `degraded_after`: without failure detection, a dead node's agents stay
/// `active` this long.
const DEGRADED_AFTER: Duration = Duration::from_secs(7);

async fn seed_addr(seed: &Daemon) -> String {
    let status = seed.status().await;
    format!("{}/p2p/{}", status["listen_addrs"][0].as_str().unwrap(), seed.peer_id)
}

async fn health(node: &Daemon, id: &str) -> Option<String> {
    let v: Value = node.get(&format!("/api/v1/agents/{id}")).await;
    v["health_status"].as_str().map(str::to_owned)
}

async fn wait_health(node: &Daemon, id: &str, want: &str, deadline: Duration) {
    let start = Instant::now();
    loop {
        if health(node, id).await.as_deref() == Some(want) {
            return;
        }
        assert!(start.elapsed() < deadline, "{id} not {want} on {} after {deadline:?}", node.peer_id);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_node_is_declared_down_everywhere_before_its_heartbeats_age() {
    let seed = Daemon::start(&[]);
    let bootstrap = seed_addr(&seed).await;
    let live: Vec<Daemon> = (0..2).map(|_| Daemon::start(&["--bootstrap", &bootstrap])).collect();
    let doomed = Daemon::start(&["--bootstrap", &bootstrap]);
    let card = |id: &str| json!({"agent_id": id, "base_url": "http://127.0.0.1:9", "skills": [{"id": "s"}]});
    assert!(doomed.register(&card("doomed")).await.status().is_success());
    for (i, node) in live.iter().enumerate() {
        assert!(node.register(&card(&format!("alive-{i}"))).await.status().is_success());
    }
    let everyone: Vec<&Daemon> = std::iter::once(&seed).chain(&live).collect();
    for node in &everyone {
        wait_health(node, "doomed", "active", Duration::from_secs(30)).await;
        for i in 0..live.len() {
            wait_health(node, &format!("alive-{i}"), "active", Duration::from_secs(30)).await;
        }
    }

    drop(doomed); // SIGKILL: no goodbye, only closed connections.
    let killed = Instant::now();
    for node in &everyone {
        // Inactive on every node before `degraded_after` has passed since the kill: the declaration, not
        // heartbeat age (which would show `degraded` first, and only then).
        wait_health(node, "doomed", "inactive", DEGRADED_AFTER.saturating_sub(killed.elapsed())).await;
    }
    // No false alarm: every live node's agent is still active everywhere.
    for node in &everyone {
        for i in 0..live.len() {
            assert_eq!(health(node, &format!("alive-{i}")).await.as_deref(), Some("active"));
        }
    }
    let declared: u64 = {
        let mut sum = 0;
        for node in &everyone {
            sum += node.status().await["peers_declared_down"].as_u64().unwrap();
        }
        sum
    };
    assert!(declared >= 1, "someone who lost it declared it");
}
