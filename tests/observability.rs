//! What operators watch: Prometheus metrics and the JSON request log.

mod common;

use std::collections::HashMap;

use common::daemon::Daemon;
use common::{dial_addr, fixture_cards, mesh_config, TestNode};

/// The samples of a Prometheus text exposition, by name with labels (`name{a="b"}`).
async fn scrape(node: &TestNode) -> HashMap<String, f64> {
    let (status, headers, body) = node.get_raw("/metrics").await;
    assert_eq!(status, 200);
    assert!(headers["content-type"].to_str().unwrap().starts_with("text/plain; version=0.0.4"));
    body.lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .map(|l| {
            let (name, value) = l.rsplit_once(' ').unwrap_or_else(|| panic!("bad sample line {l}"));
            (name.to_owned(), value.parse().unwrap_or_else(|_| panic!("bad value in {l}")))
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_count_discovery_requests_and_the_mesh() {
    let (da, db) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let a = TestNode::start(mesh_config(da.path(), Vec::new())).await;
    let b = TestNode::start(mesh_config(db.path(), vec![dial_addr(&a).await])).await;
    for card in fixture_cards() {
        a.register(&card).await;
    }
    for query in [
        "format=json&tags=ml",
        "format=json&tags=ml",
        "format=xml&reasoner=*research*",
        "format=compact",
        "limit=-1",
    ] {
        a.get_raw(&format!("/api/v1/discovery/capabilities?{query}")).await;
    }
    let m = scrape(&a).await;
    let at = |k: &str| *m.get(k).unwrap_or_else(|| panic!("no sample {k}"));
    assert_eq!(at(r#"agentmesh_discovery_requests_total{format="json",status="200"}"#), 2.0);
    assert_eq!(at(r#"agentmesh_discovery_requests_total{format="xml",status="200"}"#), 1.0);
    assert_eq!(at(r#"agentmesh_discovery_requests_total{format="compact",status="200"}"#), 1.0);
    assert_eq!(at(r#"agentmesh_discovery_requests_total{format="invalid",status="400"}"#), 1.0);
    assert_eq!(at("agentmesh_discovery_cache_hits_total"), 1.0, "the repeated query");
    assert_eq!(at("agentmesh_discovery_cache_misses_total"), 3.0);
    assert_eq!(at(r#"agentmesh_discovery_request_duration_seconds_bucket{le="+Inf"}"#), 5.0);
    assert_eq!(at(r#"agentmesh_discovery_filter_usage_total{filter="tags"}"#), 2.0);
    assert_eq!(at(r#"agentmesh_discovery_filter_usage_total{filter="reasoner"}"#), 1.0);
    assert_eq!(at("agentmesh_local_agents"), 4.0);
    assert_eq!(at(r#"agentmesh_records{health="active"}"#), 4.0);

    // The other node heard the cards over gossip or sync and counts its peer.
    b.wait_for("b to hold the four cards and count its peer", || async {
        let m = scrape(&b).await;
        let get = |k: &str| m.get(k).copied().unwrap_or_default();
        (get("agentmesh_agents") == 4.0
            && get("agentmesh_peers") == 1.0
            && get(r#"agentmesh_records{health="active"}"#) == 4.0
            && get(r#"agentmesh_gossip_messages_total{direction="in"}"#) > 0.0)
            .then_some(())
    })
    .await;
    let m = scrape(&b).await;
    assert!(m.contains_key("agentmesh_sync_rounds_total"));
    assert!(m.contains_key("agentmesh_signature_failures_total"));
    assert!(m.contains_key(r#"agentmesh_gossip_verdicts_total{verdict="accepted"}"#));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_logs_carry_each_discovery_request_with_filters_counts_duration_and_cache() {
    let daemon = Daemon::start(&[]);
    for card in fixture_cards() {
        assert!(daemon.register(&card).await.status().is_success());
    }
    let url = format!("{}/api/v1/discovery/capabilities?tags=research&format=xml&limit=1", daemon.http);
    let completed = |e: &serde_json::Value| e["message"] == "discovery request completed";
    for expect_hit in [false, true] {
        assert_eq!(reqwest::get(&url).await.unwrap().status(), 200);
        let event = daemon.wait_log("discovery request completed", completed);
        assert_eq!(event["level"], "INFO");
        assert_eq!(event["format"], "xml");
        assert_eq!(event["status"], 200);
        assert_eq!(event["filters"], r#"["tags"]"#);
        assert_eq!(event["total_agents"], 2, "{event}");
        assert_eq!(event["returned"], 1);
        assert!(event["duration_ms"].as_f64().unwrap() >= 0.0);
        assert_eq!(event["cache_hit"], expect_hit);
    }
    let bad = format!("{}/api/v1/discovery/capabilities?limit=abc", daemon.http);
    assert_eq!(reqwest::get(&bad).await.unwrap().status(), 400);
    let event = daemon.wait_log("refused", |e| e["message"] == "discovery request refused");
    assert_eq!(event["status"], 400);
}
