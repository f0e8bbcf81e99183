//! A node with more agents than a publisher could have before, and nodes joining it: limits that
//! agree. Every joiner holds every agent `active`, nobody is refused anything, nobody is banned.

mod common;

use std::time::{Duration, Instant};

use agentmesh::card::AgentCard;
use agentmesh::registry::Liveness;
use common::{dial_addr, mesh_config, TestNode};
use serde_json::Value;

/// More than the old per-publisher limit (4,096), and more than one list chunk.
const AGENTS: usize = 5_000;
const JOINERS: usize = 3;
/// Verifying 5,000 cards three times over on two cores, with debug builds of everything but the
/// signature crates.
const DEADLINE: Duration = Duration::from_secs(120);

fn card(i: usize) -> AgentCard {
    let json = format!(
        r#"{{"agent_id":"gateway-agent-{i:05}","base_url":"http://127.0.0.1:9","skills":[{{"id":"s{i}","tags":["t"]}}]}}"#
    );
    AgentCard::from_json(json.as_bytes()).unwrap()
}

/// A mesh node with the daemon's own proportions at a faster pace: four nodes in one debug process
/// verifying 15,000 cards on two cores can stall a node's loop for seconds, which the millisecond
/// thresholds of the small mesh tests would turn into evictions.
fn scale_config(dir: &std::path::Path, bootstrap: Vec<String>) -> agentmesh::config::Config {
    agentmesh::config::Config {
        heartbeat_interval: Duration::from_millis(500),
        degraded_after: Duration::from_secs(3),
        inactive_after: Duration::from_secs(6),
        evict_after: Duration::from_secs(120),
        ..mesh_config(dir, bootstrap)
    }
}

async fn status(n: &TestNode) -> Value {
    n.get("/api/v1/mesh/status").await.1
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn joiners_hold_every_agent_of_a_big_publisher_active_and_nobody_is_banned() {
    let dirs: Vec<_> = (0..=JOINERS).map(|_| tempfile::tempdir().unwrap()).collect();
    let gateway = TestNode::start(scale_config(dirs[0].path(), vec![])).await;
    let cards = (0..AGENTS).map(card).collect();
    let registered =
        gateway.node.registry().register_local_many(cards, Liveness::Node, 1).await.unwrap().len();
    assert_eq!(registered, AGENTS);
    let addr = dial_addr(&gateway).await;
    let mut joiners = Vec::new();
    for dir in &dirs[1..] {
        joiners.push(TestNode::start(scale_config(dir.path(), vec![addr.clone()])).await);
    }
    let start = Instant::now();
    for (i, joiner) in joiners.iter().enumerate() {
        loop {
            let s = status(joiner).await;
            let active = s["records"]["active"].as_u64().unwrap_or(0);
            if active == AGENTS as u64 {
                eprintln!("joiner {i}: {AGENTS} agents active after {:?}", start.elapsed());
                break;
            }
            assert!(start.elapsed() < DEADLINE, "joiner {i} holds {active} of {AGENTS} active: {s}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    for (name, n) in std::iter::once(("gateway", &gateway)).chain(joiners.iter().map(|j| ("joiner", j))) {
        let s = status(n).await;
        assert_eq!(s["peers_banned"], 0, "{name}: {s}");
        assert_eq!(s["rejected"], serde_json::json!({}), "{name} refused nothing: {s}");
    }
    // The agents stay active: heartbeats (digest-only, the list in chunks) keep refreshing them.
    let joiner = &joiners[0];
    let s = status(joiner).await;
    assert_eq!(s["records"]["active"], AGENTS as u64, "{s}");
    let (_, view) = joiner.get("/api/v1/discovery/capabilities?agent_ids=gateway-agent-04999").await;
    assert_eq!(view["capabilities"][0]["health_status"], "active", "{view}");
}

/// A local registration past the per-publisher limit is refused, naming the limit, and nothing of it
/// is written: the node never publishes what its peers would refuse.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_registration_past_the_per_publisher_limit_is_refused_whole() {
    let dir = tempfile::tempdir().unwrap();
    let config = agentmesh::config::Config { max_agents_per_publisher: 3, ..common::config(dir.path()) };
    let node = TestNode::start(config).await;
    for i in 0..3 {
        node.register(&serde_json::json!({"agent_id": format!("a{i}"), "base_url": "http://127.0.0.1:9", "skills": [{"id": "s"}]}))
            .await;
    }
    let (status, body) = node
        .post(
            "/api/v1/agents",
            &serde_json::json!({"agent_id": "a3", "base_url": "http://127.0.0.1:9", "skills": [{"id": "s"}]}),
        )
        .await;
    assert_eq!(status, 409, "{body}");
    assert_eq!(body["error"], "limit_reached");
    assert_eq!(body["details"]["setting"], "max_agents_per_publisher");
    assert_eq!(body["details"]["limit"], 3);
    assert!(body["message"].as_str().unwrap().contains("at most 3"), "{body}");
    // Re-registering a held agent still works; a bulk load past the limit is refused whole.
    node.register(
        &serde_json::json!({"agent_id": "a0", "base_url": "http://127.0.0.1:8", "skills": [{"id": "s"}]}),
    )
    .await;
    let bulk = node.node.registry().register_local_many(vec![card(1), card(2)], Liveness::Node, 5).await;
    assert!(bulk.is_err());
    let (_, view) = node.get("/api/v1/discovery/capabilities?limit=10").await;
    assert_eq!(view["total_agents"], 3, "{view}");
}
