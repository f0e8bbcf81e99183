//! Several real nodes in one process, joined over TCP on 127.0.0.1 by bootstrap addresses (mDNS off).

mod common;

use std::time::Duration;

use agentmesh::config::Config;
use agentmesh::net;
use common::{dial_addr, fixture_cards, mesh_config, sdk_registration, TestNode};
use reqwest::Method;
use serde_json::Value;

async fn start(dir: &std::path::Path, bootstrap: Vec<String>) -> TestNode {
    TestNode::start(mesh_config(dir, bootstrap)).await
}

async fn health_on(n: &TestNode, id: &str) -> Option<String> {
    let (status, body) = n.get(&format!("/api/v1/agents/{id}")).await;
    (status == 200).then(|| body["health_status"].as_str().unwrap_or_default().to_owned())
}

async fn wait_health(n: &TestNode, id: &str, want: &str) {
    n.wait_for(&format!("{id} {want}"), || async {
        (health_on(n, id).await.as_deref() == Some(want)).then_some(())
    })
    .await;
}

async fn wait_gone(n: &TestNode, id: &str) {
    n.wait_for(&format!("{id} gone"), || async { health_on(n, id).await.is_none().then_some(()) }).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_card_crosses_a_line_of_three_and_its_removal_follows() {
    let dirs: Vec<_> = (0..3).map(|_| tempfile::tempdir().unwrap()).collect();
    let a = start(dirs[0].path(), vec![]).await;
    let b = start(dirs[1].path(), vec![dial_addr(&a).await]).await;
    let c = start(dirs[2].path(), vec![dial_addr(&b).await]).await;
    // Wait until the line is up, so the test measures gossip, not joining.
    for n in [&b, &c] {
        n.wait_for("a connected peer", || async {
            let (_, s) = n.get("/api/v1/mesh/status").await;
            (s["connected_peers"].as_u64() >= Some(1)
                && s["mesh_peers"]["agentmesh/cards/1"].as_u64() >= Some(1))
            .then_some(())
        })
        .await;
    }
    a.register(&fixture_cards()[0]).await;
    wait_health(&c, "alpha-research", "active").await;
    let (_, on_c) =
        c.get("/api/v1/discovery/capabilities?agent=alpha-research&include_input_schema=true").await;
    let (_, on_a) =
        a.get("/api/v1/discovery/capabilities?agent=alpha-research&include_input_schema=true").await;
    assert_eq!(on_c["capabilities"][0]["reasoners"], on_a["capabilities"][0]["reasoners"]);
    assert_eq!(on_c["capabilities"][0]["publisher"], a.node.peer_id().to_base58());
    assert_eq!(on_c["capabilities"][0]["local"], false);
    // The signed card is served unchanged everywhere: same seq, same card.
    let (_, rec_a) = a.get("/api/v1/agents/alpha-research").await;
    let (_, rec_c) = c.get("/api/v1/agents/alpha-research").await;
    assert_eq!((&rec_a["seq"], &rec_a["card"]), (&rec_c["seq"], &rec_c["card"]));
    // A remote agent cannot be removed from another node.
    let (status, _) = c.send(Method::DELETE, "/api/v1/agents/alpha-research", None).await;
    assert_eq!(status, 403);

    let (status, _) = a.send(Method::DELETE, "/api/v1/agents/alpha-research", None).await;
    assert_eq!(status, 200);
    wait_gone(&c, "alpha-research").await;
    wait_gone(&b, "alpha-research").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_joiner_gets_the_full_view_by_sync() {
    let dirs: Vec<_> = (0..3).map(|_| tempfile::tempdir().unwrap()).collect();
    let a = start(dirs[0].path(), vec![]).await;
    for card in fixture_cards() {
        a.register(&card).await;
    }
    let b = start(dirs[1].path(), vec![dial_addr(&a).await]).await;
    b.register(&fixture_cards()[1].clone()).await; // the same agent id from another publisher
                                                   // C joins through B only, after everything was announced: nothing is re-announced for it.
    let c = start(dirs[2].path(), vec![dial_addr(&b).await]).await;
    c.wait_for("five records on c", || async {
        let (_, list) = c.get("/api/v1/agents").await;
        (list["total"].as_u64() == Some(5)).then_some(())
    })
    .await;
    let (_, body) = c.get("/api/v1/discovery/capabilities?agent=beta-analytics").await;
    let publishers: Vec<&str> =
        body["capabilities"].as_array().unwrap().iter().map(|c| c["publisher"].as_str().unwrap()).collect();
    assert_eq!(publishers.len(), 2, "one entry per publisher: {body}");
    let (_, status) = c.get("/api/v1/mesh/status").await;
    assert!(status["sync_rounds"].as_u64() >= Some(1), "{status}");
    assert!(status["last_sync"].is_string());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_node_goes_inactive_then_evicted_and_a_leaving_one_at_once() {
    let dirs: Vec<_> = (0..3).map(|_| tempfile::tempdir().unwrap()).collect();
    let a = start(dirs[0].path(), vec![]).await;
    let b = start(dirs[1].path(), vec![dial_addr(&a).await]).await;
    // c knows b directly, so b's goodbye reaches it after a is gone.
    let c = start(dirs[2].path(), vec![dial_addr(&a).await, dial_addr(&b).await]).await;
    a.register(&fixture_cards()[0]).await;
    b.register(&fixture_cards()[2]).await;
    wait_health(&c, "alpha-research", "active").await;
    wait_health(&c, "gamma-i18n", "active").await;

    // kill: no goodbye, but its connections close: b and c declare it down (inactive at once, no
    // degraded stage), then it is evicted by age.
    a.node.kill();
    wait_health(&c, "alpha-research", "inactive").await;
    wait_gone(&c, "alpha-research").await;

    // graceful: the tombstone removes b's agents on c well before they could age out.
    let started = std::time::Instant::now();
    b.node.shutdown().await.unwrap();
    wait_gone(&c, "gamma-i18n").await;
    assert!(started.elapsed() < Duration::from_millis(2500), "left by tombstone, not by eviction");

    // b comes back on the same data dir, its records at the same seqs as before it left: its first
    // heartbeat, newer than the leave, lifts the leave's tombstones and its agents reappear.
    // (c forgets the leave's tombstones only after evict_after, 2.5 s.)
    let restarted = std::time::Instant::now();
    let b = start(dirs[1].path(), vec![dial_addr(&c).await]).await;
    wait_health(&c, "gamma-i18n", "active").await;
    assert!(restarted.elapsed() < Duration::from_millis(1500), "back at once, not when c forgot the leave");
    drop(b);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sdk_agent_health_travels_with_the_publishers_heartbeats() {
    let dirs: Vec<_> = (0..2).map(|_| tempfile::tempdir().unwrap()).collect();
    let a = start(dirs[0].path(), vec![]).await;
    let b = start(dirs[1].path(), vec![dial_addr(&a).await]).await;
    let (status, _) = a.post("/api/v1/nodes/register", &sdk_registration("sdk-agent")).await;
    assert_eq!(status, 201);
    wait_health(&b, "sdk-agent", "active").await;
    // The agent reports itself degraded to its own sidecar: every node shows it.
    a.post("/api/v1/nodes/sdk-agent/heartbeat", &serde_json::json!({"status": "degraded"})).await;
    wait_health(&b, "sdk-agent", "degraded").await;
    // It stops heartbeating: its sidecar sees it inactive and says so; the node itself is alive.
    wait_health(&b, "sdk-agent", "inactive").await;
    let (_, status) = b.get("/api/v1/mesh/status").await;
    let records: &Value = &status["records"];
    assert_eq!(records["inactive"], 1, "{status}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_joiner_learns_agent_states_announced_before_it_came() {
    let dirs: Vec<_> = (0..3).map(|_| tempfile::tempdir().unwrap()).collect();
    let a = start(dirs[0].path(), vec![]).await;
    let a_addr = dial_addr(&a).await;
    // c is there from the start, so a's heartbeats have somewhere to go.
    let c = start(dirs[2].path(), vec![a_addr.clone()]).await;
    let (status, _) = a.post("/api/v1/nodes/register", &sdk_registration("sdk-agent")).await;
    assert_eq!(status, 201);
    // The agent heartbeats its sidecar, reporting itself degraded, as an SDK agent does.
    let beats = a.http.clone();
    let url = format!("{}/api/v1/nodes/sdk-agent/heartbeat", a.base);
    let agent = tokio::spawn(async move {
        loop {
            let _ = beats.post(&url).json(&serde_json::json!({"status": "degraded"})).send().await;
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    });
    wait_health(&c, "sdk-agent", "degraded").await;
    // Let a's heartbeats that carry the changed agent list go by: afterwards they carry only a digest.
    let (_, status) = a.get("/api/v1/mesh/status").await;
    let sent = status["messages_out"].as_u64().unwrap();
    a.wait_for("the list's repeats sent", || async {
        let (_, status) = a.get("/api/v1/mesh/status").await;
        (status["messages_out"].as_u64().unwrap() >= sent + u64::from(agentmesh::wire::LIST_REPEATS))
            .then_some(())
    })
    .await;
    // b comes later: it gets the card by sync and the agent's own state by fetching a's signed list.
    let b = start(dirs[1].path(), vec![a_addr]).await;
    wait_health(&b, "sdk-agent", "degraded").await;
    agent.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_node_reloads_its_view_then_catches_up() {
    let dirs: Vec<_> = (0..2).map(|_| tempfile::tempdir().unwrap()).collect();
    let a = start(dirs[0].path(), vec![]).await;
    let a_addr = dial_addr(&a).await;
    let b = start(dirs[1].path(), vec![a_addr.clone()]).await;
    a.register(&fixture_cards()[0]).await;
    wait_health(&b, "alpha-research", "active").await;
    b.node.shutdown().await.unwrap();

    // While b is down: a new agent, and a new version of the old one.
    a.register(&fixture_cards()[1]).await;
    let mut changed = fixture_cards()[0].clone();
    changed["version"] = serde_json::json!("2.0.0");
    a.register(&changed).await;

    let b = start(dirs[1].path(), vec![a_addr]).await;
    let (status, record) = b.get("/api/v1/agents/alpha-research").await;
    assert_eq!(status, 200, "reloaded from disk at once");
    assert!(record["card"]["version"].is_string());
    b.wait_for("the new version on b", || async {
        let (_, r) = b.get("/api/v1/agents/alpha-research").await;
        (r["card"]["version"] == "2.0.0").then_some(())
    })
    .await;
    wait_health(&b, "beta-analytics", "active").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partition_heals_and_both_sides_converge() {
    let dirs: Vec<_> = (0..3).map(|_| tempfile::tempdir().unwrap()).collect();
    // a and c know each other only through b.
    let b = start(dirs[1].path(), vec![]).await;
    let b_addr = dial_addr(&b).await;
    let a = start(dirs[0].path(), vec![b_addr.clone()]).await;
    let c = start(dirs[2].path(), vec![b_addr]).await;
    a.register(&fixture_cards()[0]).await;
    wait_health(&c, "alpha-research", "active").await;

    // Cut the bridge; each side changes.
    let b_config = mesh_config(dirs[1].path(), vec![dial_addr(&a).await, dial_addr(&c).await]);
    b.node.kill();
    a.register(&fixture_cards()[1]).await;
    c.register(&fixture_cards()[2]).await;

    // Heal: the bridge comes back on the same data directory and dials both sides.
    let b = TestNode::start(b_config).await;
    wait_health(&a, "gamma-i18n", "active").await;
    wait_health(&c, "beta-analytics", "active").await;
    wait_health(&b, "gamma-i18n", "active").await;
    wait_health(&b, "beta-analytics", "active").await;
}

/// A closed mesh: `key` is the network key file (None: open), `allowed` the publisher allow-list.
fn closed_config(
    dir: &std::path::Path,
    bootstrap: Vec<String>,
    key: Option<&std::path::Path>,
    allowed: Vec<String>,
) -> Config {
    Config {
        network_key: key.map(|k| k.to_owned()),
        allowed_publishers: allowed.iter().map(|p| p.parse().unwrap()).collect(),
        ..mesh_config(dir, bootstrap)
    }
}

fn network_key_file(dir: &std::path::Path, name: &str) -> std::path::PathBuf {
    let out =
        std::process::Command::new(env!("CARGO_BIN_EXE_agentmesh")).arg("network-key").output().unwrap();
    assert!(out.status.success());
    let path = dir.join(name);
    std::fs::write(&path, out.stdout).unwrap();
    path
}

async fn counter(n: &TestNode, name: &str) -> u64 {
    let (_, status) = n.get("/api/v1/mesh/status").await;
    status[name].as_u64().unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_without_the_network_key_cannot_join_a_closed_mesh() {
    let dirs: Vec<_> = (0..4).map(|_| tempfile::tempdir().unwrap()).collect();
    let keys = tempfile::tempdir().unwrap();
    let key = network_key_file(keys.path(), "mesh.key");
    let other_key = network_key_file(keys.path(), "other.key");
    let a = TestNode::start(closed_config(dirs[0].path(), vec![], Some(&key), vec![])).await;
    let a_addr = dial_addr(&a).await;
    let b = TestNode::start(closed_config(dirs[1].path(), vec![a_addr.clone()], Some(&key), vec![])).await;
    let keyless = start(dirs[2].path(), vec![a_addr.clone()]).await;
    let wrong_key =
        TestNode::start(closed_config(dirs[3].path(), vec![a_addr], Some(&other_key), vec![])).await;
    a.register(&fixture_cards()[0]).await;
    wait_health(&b, "alpha-research", "active").await;
    let (_, status) = a.get("/api/v1/mesh/status").await;
    assert_eq!(status["closed_mesh"], true);

    // Both outsiders dialled a and failed at the handshake (at the latest when it times out).
    let deadline = std::time::Instant::now() + net::HANDSHAKE_TIMEOUT * 3;
    for outsider in [&keyless, &wrong_key] {
        while counter(outsider, "connection_errors").await == 0 {
            assert!(std::time::Instant::now() < deadline, "no failed dial of a");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert_eq!(counter(outsider, "connected_peers").await, 0);
        assert_eq!(health_on(outsider, "alpha-research").await, None, "nothing of the closed mesh leaked");
    }
    assert_eq!(counter(&a, "connected_peers").await, 1, "a is connected to b only");
    assert!(counter(&a, "connection_errors").await >= 1, "a saw an outsider's handshake fail");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_publisher_outside_the_allow_list_is_not_accepted() {
    let dirs: Vec<_> = (0..3).map(|_| tempfile::tempdir().unwrap()).collect();
    let id = |d: &tempfile::TempDir| {
        agentmesh::identity::Identity::load_or_create(d.path()).unwrap().peer_id().to_base58()
    };
    let (a_id, b_id) = (id(&dirs[0]), id(&dirs[1]));
    // a takes only b's agents; c (an outsider publisher) is connected to a directly.
    let a = TestNode::start(closed_config(dirs[0].path(), vec![], None, vec![b_id, a_id.clone()])).await;
    let a_addr = dial_addr(&a).await;
    let b = start(dirs[1].path(), vec![a_addr.clone()]).await;
    let c = start(dirs[2].path(), vec![a_addr]).await;
    b.register(&fixture_cards()[1]).await;
    c.register(&fixture_cards()[2]).await;
    wait_health(&a, "beta-analytics", "active").await;
    // b, which has no allow-list, hears c's agent (through a's relay or directly): a refused it.
    wait_health(&b, "gamma-i18n", "active").await;
    a.wait_for("refusals of c's messages", || async {
        let (_, status) = a.get("/api/v1/mesh/status").await;
        (status["rejected"]["publisher_not_allowed"].as_u64().unwrap_or(0) >= 2).then_some(())
    })
    .await;
    assert_eq!(health_on(&a, "gamma-i18n").await, None, "c's agent is not in a's view");
    let ids = a.discover_ids("").await;
    assert!(ids.contains(&"beta-analytics".to_owned()) && !ids.contains(&"gamma-i18n".to_owned()), "{ids:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_at_its_connection_limit_refuses_more_and_keeps_serving_the_peers_it_has() {
    let dirs: Vec<_> = (0..3).map(|_| tempfile::tempdir().unwrap()).collect();
    let a = TestNode::start(Config { max_connections: 1, ..mesh_config(dirs[0].path(), vec![]) }).await;
    let a_addr = dial_addr(&a).await;
    let b = start(dirs[1].path(), vec![a_addr.clone()]).await;
    a.register(&fixture_cards()[0]).await;
    wait_health(&b, "alpha-research", "active").await;

    // c has only a to join by, and a has no room: c is refused at the handshake, not served.
    let c = start(dirs[2].path(), vec![a_addr]).await;
    a.wait_for("a refusing c", || async { (counter(&a, "connections_denied").await >= 1).then_some(()) })
        .await;
    assert_eq!(counter(&a, "connected_peers").await, 1, "a kept its one connection, to b");
    assert_eq!(counter(&c, "connected_peers").await, 0);
    assert_eq!(health_on(&c, "alpha-research").await, None, "c learnt nothing through a refused connection");
    // The peer a keeps is served as before: a new card still reaches b, and a's agent stays active there.
    a.register(&fixture_cards()[1]).await;
    wait_health(&b, "beta-analytics", "active").await;
    assert_eq!(health_on(&b, "alpha-research").await.as_deref(), Some("active"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dial_past_the_nodes_own_limit_is_refused_not_counted_as_a_failed_peer() {
    let dirs: Vec<_> = (0..3).map(|_| tempfile::tempdir().unwrap()).collect();
    let b = start(dirs[0].path(), vec![]).await;
    let c = start(dirs[1].path(), vec![]).await;
    let bootstrap = vec![dial_addr(&b).await, dial_addr(&c).await];
    // a dials both at start with room for one: the second to finish its handshake is its own refusal.
    let a = TestNode::start(Config { max_connections: 1, ..mesh_config(dirs[2].path(), bootstrap) }).await;
    a.wait_for("a refusing its own second dial", || async {
        (counter(&a, "connections_denied").await >= 1).then_some(())
    })
    .await;
    assert_eq!(counter(&a, "connected_peers").await, 1);
    assert_eq!(counter(&a, "connection_errors").await, 0, "a refusal of its own is not a failed dial");
    assert_eq!(counter(&a, "peers_declared_down").await, 0);
}

/// The connection target: every node bootstraps to one hub, and every node, the hub included, ends
/// within `peer_high` connections by partings both sides agreed to: no node is declared down, every
/// agent stays active everywhere, and gossip still reaches every node afterwards.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodes_keep_their_connection_target_by_agreed_partings_without_false_alarms() {
    const NODES: usize = 7;
    const HIGH: u64 = 3;
    let small = |dir: &std::path::Path, bootstrap| Config {
        peer_low: 2,
        peer_high: HIGH as usize,
        ..mesh_config(dir, bootstrap)
    };
    let dirs: Vec<_> = (0..NODES).map(|_| tempfile::tempdir().unwrap()).collect();
    let hub = TestNode::start(small(dirs[0].path(), vec![])).await;
    let hub_addr = dial_addr(&hub).await;
    let mut nodes = vec![hub];
    for dir in &dirs[1..] {
        nodes.push(TestNode::start(small(dir.path(), vec![hub_addr.clone()])).await);
    }
    let card = |i: usize| {
        let mut card = fixture_cards()[1].clone();
        card["agent_id"] = format!("agent-{i}").into();
        card
    };
    for (i, n) in nodes.iter().enumerate() {
        n.register(&card(i)).await;
    }
    // Settling takes partings and shuffles (every `SHUFFLE_INTERVAL`): a longer deadline than
    // `wait_for`'s.
    let deadline = std::time::Instant::now() + Duration::from_secs(90);
    let mut counts = Vec::new();
    loop {
        counts.clear();
        let mut settled = true;
        for n in &nodes {
            let (_, s) = n.get("/api/v1/mesh/status").await;
            let connected = s["connected_peers"].as_u64().unwrap();
            counts.push(connected);
            settled &= (1..=HIGH).contains(&connected);
        }
        if settled {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "not settled: connections per node {counts:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Every agent active on every node (heartbeats every 100 ms here: a busy machine may show one
    // `degraded` for a moment, so this is waited for, not sampled).
    for n in &nodes {
        n.wait_for("every agent active", || async {
            let (_, s) = n.get("/api/v1/mesh/status").await;
            (s["records"]["active"].as_u64() == Some(NODES as u64)).then_some(())
        })
        .await;
    }
    let mut parted = 0;
    for n in &nodes {
        assert_eq!(counter(n, "peers_declared_down").await, 0, "a parting is no failure");
        parted += counter(n, "peers_parted").await;
        let (_, s) = n.get("/api/v1/mesh/status").await;
        assert_eq!((s["peer_low"].as_u64(), s["peer_high"].as_u64()), (Some(2), Some(HIGH)));
    }
    assert!(parted >= 1, "the hub's {} joiners left it by partings", NODES - 1);
    // Gossip still reaches every node, and nobody went degraded meanwhile.
    nodes[NODES - 1].register(&card(NODES)).await;
    for n in &nodes {
        wait_health(n, &format!("agent-{NODES}"), "active").await;
        n.wait_for("every agent active", || async {
            let (_, s) = n.get("/api/v1/mesh/status").await;
            (s["records"]["active"].as_u64() == Some(NODES as u64 + 1)).then_some(())
        })
        .await;
    }
}

/// A node that starts with more card files than it gossips one by one per heartbeat interval
/// (`proto::announce`) leaves them to its agent list and reconciliation: its peer gets every card, and
/// the node's own gossip is its heartbeats, not its cards.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cards_past_the_gossip_budget_reach_a_peer_by_sync_not_by_gossip() {
    const CARDS: u64 = 40;
    let dirs: Vec<_> = (0..2).map(|_| tempfile::tempdir().unwrap()).collect();
    let b = start(dirs[0].path(), vec![]).await;
    let cards = dirs[1].path().join("cards");
    std::fs::create_dir(&cards).unwrap();
    for i in 0..CARDS {
        let id = format!("bulk-{i:02}");
        let card = serde_json::json!({"agent_id": id, "base_url": "http://127.0.0.1:1", "version": "1.0.0"});
        std::fs::write(cards.join(format!("{id}.json")), card.to_string()).unwrap();
    }
    // Heartbeats a second apart, so that the few this test lasts are told apart from the cards.
    let config = Config {
        cards: vec![cards],
        heartbeat_interval: Duration::from_secs(1),
        degraded_after: Duration::from_secs(7),
        inactive_after: Duration::from_secs(14),
        evict_after: Duration::from_secs(60),
        ..mesh_config(dirs[1].path(), vec![dial_addr(&b).await])
    };
    let started = std::time::Instant::now();
    let a = TestNode::start(config).await;
    b.wait_for("every card on b", || async {
        let (_, list) = b.get("/api/v1/agents?limit=0").await;
        (list["total"].as_u64() == Some(CARDS)).then_some(())
    })
    .await;
    // Three heartbeats published (a heartbeat with no peer is not), so the first one a peer heard, after
    // which cards that found no peer would have been announced again, is past.
    a.wait_for("three heartbeats from a", || async {
        (counter(&a, "messages_out").await >= 3).then_some(())
    })
    .await;
    let sent = counter(&a, "messages_out").await;
    // One heartbeat a second, the first at once: no card, not even a budget's worth announced again.
    let heartbeats = started.elapsed().as_secs() + 1;
    assert!(
        sent <= heartbeats,
        "a's gossip is its heartbeats: {sent} messages in {heartbeats} beats at most"
    );
}
