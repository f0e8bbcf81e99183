//! Registration over a real socket: the AgentField drop-in routes, the native routes, card files, bad
//! input, and restarts on the same data directory.

mod common;

use common::{config, fixture_cards, sdk_registration, TestNode};
use reqwest::Method;
use serde_json::{json, Value};

#[tokio::test]
async fn agentfield_sdk_lifecycle() {
    let dir = tempfile::tempdir().unwrap();
    let n = TestNode::start(config(dir.path())).await;
    let (status, body) = n.get("/api/v1/health").await;
    assert_eq!((status, body["status"].as_str()), (200, Some("healthy")));

    let (status, body) = n.post("/api/v1/nodes/register", &sdk_registration("sdk-agent")).await;
    assert_eq!(status, 201, "{body}");
    assert_eq!(body["success"], true);
    assert_eq!(body["node_id"], "sdk-agent");
    // Immediately discoverable, with the SDK's reasoners and skills.
    let (_, b) = n.get("/api/v1/discovery/capabilities?agent=sdk-agent&include_input_schema=true").await;
    assert_eq!(b["capabilities"][0]["reasoners"][0]["invocation_target"], "sdk-agent:plan");
    assert_eq!(b["capabilities"][0]["skills"][0]["input_schema"], json!({"type": "object"}));
    assert_eq!(b["capabilities"][0]["health_status"], "active");

    // Registering again with a change updates; the same payload again changes nothing.
    let mut changed = sdk_registration("sdk-agent");
    changed["version"] = json!("2.0.0");
    let (status, first) = n.post("/api/v1/nodes/register", &changed).await;
    assert_eq!(status, 200);
    let (status, second) = n.post("/api/v1/nodes/register", &changed).await;
    assert_eq!(status, 200);
    assert_eq!(first["seq"], second["seq"], "identical re-registration keeps the seq");

    let (status, body) = n
        .post(
            "/api/v1/nodes/sdk-agent/heartbeat",
            &json!({"status": "ready", "timestamp": "x", "version": "2.0.0", "instance_id": "i"}),
        )
        .await;
    assert_eq!((status, body["health_status"].as_str()), (200, Some("active")));
    let r = n.http.post(n.url("/api/v1/nodes/sdk-agent/heartbeat")).send().await.unwrap();
    assert_eq!(r.status(), 200, "an empty heartbeat body is fine");
    let (status, body) = n.post("/api/v1/nodes/sdk-agent/heartbeat", &json!({"status": "sleepy"})).await;
    assert_eq!(status, 400);
    assert_eq!(body["details"]["field"], "status");
    let (status, body) = n.post("/api/v1/nodes/ghost/heartbeat", &json!({})).await;
    assert_eq!((status, body["error"].as_str()), (404, Some("not_found")));

    let (status, body) = n
        .send(Method::PUT, "/api/v1/nodes/sdk-agent/health", Some(&json!({"health_status": "degraded"})))
        .await;
    assert_eq!(status, 200);
    assert_eq!(
        (body["health_status"].as_str(), body["lifecycle_status"].as_str()),
        (Some("degraded"), Some("degraded"))
    );
    let (_, body) = n.get("/api/v1/nodes").await;
    assert_eq!(body["count"], 1);
    assert_eq!(body["nodes"][0]["version"], "2.0.0");
    let (status, _) = n.get("/api/v1/nodes/nobody").await;
    assert_eq!(status, 404);

    let (status, _) = n.post("/api/v1/did/register", &json!({})).await;
    assert_eq!(status, 404, "the SDK tolerates 404/501 here");

    let (status, _) =
        n.post("/api/v1/nodes/sdk-agent/shutdown", &json!({"reason": "bye", "timeout_seconds": 5})).await;
    assert_eq!(status, 200);
    assert!(n.discover_ids("").await.is_empty(), "gone at once after shutdown");
    let (status, _) = n.post("/api/v1/nodes/sdk-agent/shutdown", &json!({})).await;
    assert_eq!(status, 404);
}

#[tokio::test]
async fn native_crud() {
    let dir = tempfile::tempdir().unwrap();
    let n = TestNode::start(config(dir.path())).await;
    let card = &fixture_cards()[0];
    let (status, created) = n.post("/api/v1/agents", card).await;
    assert_eq!(status, 201);
    let mut changed = card.clone();
    changed["description"] = json!("changed");
    let (status, updated) = n.post("/api/v1/agents", &changed).await;
    assert_eq!(status, 200);
    assert!(updated["seq"].as_u64() > created["seq"].as_u64());

    let (status, body) = n.get("/api/v1/agents/alpha-research").await;
    assert_eq!(status, 200);
    assert_eq!(body["card"]["description"], "changed");
    assert_eq!(body["local"], true);
    assert_eq!(body["health_status"], "active");
    n.register(&fixture_cards()[1]).await;
    let (_, list) = n.get("/api/v1/agents?limit=1").await;
    assert_eq!((list["total"].as_u64(), list["agents"].as_array().unwrap().len()), (Some(2), 1));
    let (status, _) = n.get("/api/v1/agents?limit=abc").await;
    assert_eq!(status, 400);

    let (status, _) = n.send(Method::DELETE, "/api/v1/agents/alpha-research", None).await;
    assert_eq!(status, 200);
    let (status, body) = n.send(Method::DELETE, "/api/v1/agents/alpha-research", None).await;
    assert_eq!((status, body["error"].as_str()), (404, Some("not_found")));
    let (status, _) = n.get("/api/v1/agents/alpha-research").await;
    assert_eq!(status, 404);
}

#[tokio::test]
async fn bad_input_gets_a_clear_error_and_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let n = TestNode::start(config(dir.path())).await;
    n.register(&fixture_cards()[1]).await;
    let (_, before) = n.get("/api/v1/agents").await;

    let raw = |path: &'static str, body: Vec<u8>| {
        let n = &n;
        async move {
            let r = n
                .http
                .post(n.url(path))
                .header("content-type", "application/json")
                .body(body)
                .send()
                .await
                .unwrap();
            let status = r.status().as_u16();
            let ct = r.headers()["content-type"].to_str().unwrap().to_owned();
            let body: Value = serde_json::from_str(&r.text().await.unwrap()).unwrap();
            assert_eq!(ct, "application/json");
            (status, body)
        }
    };
    let (status, body) = raw("/api/v1/agents", b"{\"agent_id\": \"x\",".to_vec()).await;
    assert_eq!(
        (status, body["error"].as_str(), body["details"]["field"].as_str()),
        (400, Some("invalid_request"), Some("card"))
    );
    let (status, body) = raw(
        "/api/v1/agents",
        br#"{"agent_id":"x","base_url":"http://x","reasoners":[{"id":"r","tags":"ml"}]}"#.to_vec(),
    )
    .await;
    assert_eq!((status, body["details"]["field"].as_str()), (400, Some("reasoners[0].tags")));
    let (status, body) = raw("/api/v1/agents", br#"{"agent_id":"x"}"#.to_vec()).await;
    assert_eq!(status, 400, "{body}");
    assert!(body["message"].as_str().unwrap().contains("base_url"));
    let (status, body) =
        raw("/api/v1/agents", br#"{"agent_id":"bad/id","base_url":"http://x"}"#.to_vec()).await;
    assert_eq!((status, body["details"]["field"].as_str()), (400, Some("agent_id")));
    let (status, body) = raw(
        "/api/v1/nodes/register",
        br#"{"id":"x","base_url":"http://x","reasoners":[{"id":"r","input_schema":"str"}]}"#.to_vec(),
    )
    .await;
    assert_eq!((status, body["details"]["field"].as_str()), (400, Some("reasoners[0].input_schema")));
    let (status, body) = raw("/api/v1/nodes/register", br#"{"id":5}"#.to_vec()).await;
    assert_eq!((status, body["details"]["field"].as_str()), (400, Some("id")));
    let big =
        format!(r#"{{"agent_id":"x","base_url":"http://x","description":"{}"}}"#, "d".repeat(70 * 1024));
    let (status, body) = raw("/api/v1/agents", big.into_bytes()).await;
    assert_eq!(status, 400, "a card over 64 KiB: {body}");
    let (status, body) = raw("/api/v1/agents", vec![b' '; 300 * 1024]).await;
    assert_eq!((status, body["error"].as_str()), (413, Some("payload_too_large")));

    let (_, after) = n.get("/api/v1/agents").await;
    let records = |v: &Value| -> Vec<(Value, Value, Value)> {
        v["agents"]
            .as_array()
            .unwrap()
            .iter()
            .map(|a| (a["agent_id"].clone(), a["seq"].clone(), a["card"].clone()))
            .collect()
    };
    assert_eq!(records(&before), records(&after), "nothing was written");
    let (status, body) = n.get("/api/v1/no/such/route").await;
    assert_eq!((status, body["error"].as_str()), (404, Some("not_found")));
}

#[tokio::test]
async fn restart_on_the_same_data_dir_keeps_every_agent() {
    let dir = tempfile::tempdir().unwrap();
    let card_file = dir.path().join("card.json");
    std::fs::write(&card_file, serde_json::to_vec(&fixture_cards()[2]).unwrap()).unwrap();
    let data = dir.path().join("data");
    let mut cfg = config(&data);
    cfg.cards = vec![card_file.clone()];

    let n = TestNode::start(cfg.clone()).await;
    let peer = n.node.peer_id();
    n.register(&fixture_cards()[0]).await;
    n.post("/api/v1/nodes/register", &sdk_registration("sdk-agent")).await;
    let (_, before) = n.get("/api/v1/agents").await;
    n.node.shutdown().await.unwrap();

    let n = TestNode::start(cfg).await;
    assert_eq!(n.node.peer_id(), peer, "same identity");
    let (_, after) = n.get("/api/v1/agents").await;
    assert_eq!(after["total"], 3);
    for (b, a) in before["agents"].as_array().unwrap().iter().zip(after["agents"].as_array().unwrap()) {
        assert_eq!(
            (&b["agent_id"], &b["seq"], &b["card"]),
            (&a["agent_id"], &a["seq"], &a["card"]),
            "same records, same seqs"
        );
    }
    assert_eq!(n.health_of("gamma-i18n").await, "active", "card file agents are vouched for by the node");
    assert_eq!(n.health_of("alpha-research").await, "active");
    assert_eq!(n.health_of("sdk-agent").await, "unknown", "an SDK agent is unknown until its next heartbeat");
    n.post("/api/v1/nodes/sdk-agent/heartbeat", &json!({})).await;
    assert_eq!(n.health_of("sdk-agent").await, "active");
}

#[tokio::test]
async fn a_bad_card_file_refuses_start_naming_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let card_file = dir.path().join("broken.json");
    std::fs::write(&card_file, br#"{"agent_id":"x","base_url":"http://x","skills":[{"id":""}]}"#).unwrap();
    let mut cfg = config(&dir.path().join("data"));
    cfg.cards = vec![card_file];
    let err = agentmesh::node::Node::start(cfg).await.err().expect("start fails").to_string();
    assert!(err.contains("broken.json") && err.contains("skills[0].id"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn probes_report_a_card_agent_that_stops_answering() {
    // The agent: a real HTTP server answering /health, which we can stop.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let agent_addr = listener.local_addr().unwrap();
    let app = axum::Router::new().route("/health", axum::routing::get(|| async { "ok" }));
    let server = tokio::spawn(async move { axum::serve(listener, app).await });

    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(dir.path());
    cfg.probe_interval = Some(std::time::Duration::from_millis(100));
    let n = TestNode::start(cfg).await;
    let mut card = fixture_cards()[2].clone();
    card["base_url"] = serde_json::json!(format!("http://{agent_addr}"));
    n.register(&card).await;
    assert_eq!(n.health_of("gamma-i18n").await, "active");

    server.abort();
    let _ = server.await;
    n.wait_for("degraded after a failed probe", || async {
        (n.health_of("gamma-i18n").await == "degraded").then_some(())
    })
    .await;
    n.wait_for("inactive after three", || async {
        (n.health_of("gamma-i18n").await == "inactive").then_some(())
    })
    .await;
}
