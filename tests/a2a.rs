//! A2A 1.0 cards over real HTTP: served signed by the publisher on every node, cached by ETag, taken as
//! input, and polled from an agent's own card URL.

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use agentmesh::card::a2a;
use agentmesh::card::JwsSignature;
use axum::http::StatusCode;
use common::{config, dial_addr, fixture_cards, mesh_config, TestNode};
use serde_json::{json, Value};

/// Checks a served card's signature as `publisher`'s, over the card as served minus `signatures`.
fn verify_served(card: &Value, publisher: &str) -> Result<(), a2a::SignatureError> {
    let sig: JwsSignature = serde_json::from_value(card["signatures"][0].clone()).unwrap();
    a2a::verify(&publisher.parse().unwrap(), &a2a::signed_payload(card).unwrap(), &sig)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_node_serves_the_publishers_signed_card_with_cache_headers() {
    let (da, db) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let a = TestNode::start(mesh_config(da.path(), Vec::new())).await;
    let b = TestNode::start(mesh_config(db.path(), vec![dial_addr(&a).await])).await;
    for card in fixture_cards() {
        a.register(&card).await;
    }
    let publisher = a.node.peer_id().to_base58();

    // With several local agents and none configured, the well-known card is the smallest agent id.
    let (status, headers, body) = a.get_raw("/.well-known/agent-card.json").await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(headers["content-type"], "application/json");
    assert!(headers["cache-control"].to_str().unwrap().contains("max-age="));
    let etag = headers["etag"].to_str().unwrap().to_owned();
    let card: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(card["name"], "alpha-research");
    for field in [
        "name",
        "description",
        "version",
        "capabilities",
        "supportedInterfaces",
        "defaultInputModes",
        "defaultOutputModes",
        "skills",
        "signatures",
    ] {
        assert!(card.get(field).is_some(), "{field} missing from {card}");
    }
    verify_served(&card, &publisher).expect("the publisher's signature verifies");
    let schemas = &card["capabilities"]["extensions"][0]["params"]["skills"]["deep_research"];
    assert_eq!(schemas["input_schema"]["required"], json!(["query"]), "schemas travel in the extension");

    // A client holding the same version gets 304 and no body.
    let r = a
        .http
        .get(a.url("/.well-known/agent-card.json"))
        .header("if-none-match", &etag)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::NOT_MODIFIED);
    assert_eq!(r.headers()["etag"].to_str().unwrap(), etag);
    assert!(r.text().await.unwrap().is_empty());

    // The path of A2A before 0.3 answers the same card, with the same headers.
    let (status, legacy_headers, legacy) = a.get_raw("/.well-known/agent.json").await;
    assert_eq!(status, 200, "{legacy}");
    assert_eq!(legacy, body, "the same card at both well-known paths");
    for header in ["content-type", "cache-control", "etag", "x-agentmesh-publisher"] {
        assert_eq!(legacy_headers[header], headers[header], "{header}");
    }
    let r = a.http.get(a.url("/.well-known/agent.json")).header("if-none-match", &etag).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::NOT_MODIFIED);

    // The other node serves the same bytes: the publisher's signature, carried through the mesh.
    let path = "/api/v1/agents/alpha-research/agent-card.json";
    let (_, a_headers, on_a) = a.get_raw(path).await;
    let on_b = b
        .wait_for("the card on the second node", || async {
            let (status, headers, body) = b.get_raw(path).await;
            (status == 200).then_some((headers, body))
        })
        .await;
    assert_eq!(on_b.1, on_a, "served unchanged on every node");
    assert_eq!(on_b.0["etag"], a_headers["etag"]);
    assert_eq!(on_b.0["x-agentmesh-publisher"].to_str().unwrap(), publisher);

    // A tampered copy fails verification.
    let mut tampered: Value = serde_json::from_str(&on_b.1).unwrap();
    tampered["skills"][0]["description"] = json!("does something else");
    assert_eq!(verify_served(&tampered, &publisher), Err(a2a::SignatureError::Invalid));

    // No reasoner or skill: no A2A card, and a clear 404.
    let (status, body) = a.get("/api/v1/agents/delta-empty/agent-card.json").await;
    assert_eq!(status, 404, "{body}");
    assert!(body["message"].as_str().unwrap().contains("needs one"), "{body}");
    let (status, _) = a.get("/api/v1/agents/nobody/agent-card.json").await;
    assert_eq!(status, 404);
    let (status, _) = a.get(&format!("{path}?publisher=12D3KooWNotThisOne")).await;
    assert_eq!(status, 404);
    let (status, _) = a.get(&format!("{path}?publisher={publisher}")).await;
    assert_eq!(status, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_a2a_card_registers_and_is_found_and_the_well_known_agent_is_configurable() {
    let dir = tempfile::tempdir().unwrap();
    let node = TestNode::start(agentmesh::config::Config {
        well_known_agent: Some("currency-agent".into()),
        ..config(dir.path())
    })
    .await;
    node.register(&fixture_cards()[0]).await;
    let a2a_card = json!({
        "name": "Currency Agent", "description": "Converts currencies", "version": "0.3.1",
        "supportedInterfaces": [{"url": "http://127.0.0.1:10000/a2a", "protocolBinding": "JSONRPC",
            "protocolVersion": "1.0"}],
        "capabilities": {}, "defaultInputModes": ["text/plain"], "defaultOutputModes": ["text/plain"],
        "skills": [{"id": "convert", "name": "Convert", "description": "Convert an amount", "tags": ["fx"]}]
    });
    let (status, body) = node.post("/api/v1/agents", &a2a_card).await;
    assert_eq!(status, 201, "{body}");
    assert_eq!(body["agent_id"], "currency-agent");
    assert_eq!(node.discover_ids("tags=fx").await, ["currency-agent"]);

    let (status, card) = node.get("/.well-known/agent-card.json").await;
    assert_eq!(status, 200);
    assert_eq!(card["name"], "Currency Agent", "the configured agent, not the smallest id");
    assert_eq!(card["supportedInterfaces"][0]["protocolBinding"], "JSONRPC");
    verify_served(&card, &node.node.peer_id().to_base58()).unwrap();

    let (status, body) = node.post("/api/v1/agents", &json!({"name": "x", "skills": [{"id": 1}]})).await;
    assert_eq!(status, 400, "{body}");
}

/// A card shape of `tests/a2a-cards`: the card as registered, and the A2A fields it must be served with
/// (`NAME.expected.json`, else the card itself without `signatures`).
struct Fixture {
    name: String,
    input: Value,
    expected: Value,
}

fn a2a_fixtures() -> Vec<Fixture> {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/a2a-cards");
    let read = |path: &std::path::Path| -> Value {
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
    };
    let mut paths: Vec<_> = std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().path()).collect();
    paths.sort();
    let mut out = Vec::new();
    for path in paths {
        let file = path.file_name().unwrap().to_string_lossy().into_owned();
        let Some(name) = file.strip_suffix(".json").filter(|s| !s.ends_with(".expected")) else { continue };
        let input = read(&path);
        let expected_path = dir.join(format!("{name}.expected.json"));
        let mut expected = if expected_path.exists() { read(&expected_path) } else { input.clone() };
        expected.as_object_mut().unwrap().remove("signatures");
        out.push(Fixture { name: name.to_owned(), input, expected });
    }
    out
}

/// A served card's A2A fields: without `signatures` and without agentmesh's own extension.
fn a2a_fields(served: &Value) -> Value {
    let mut card = served.clone();
    let map = card.as_object_mut().unwrap();
    map.remove("signatures");
    let caps = map["capabilities"].as_object_mut().unwrap();
    let list = caps["extensions"].as_array_mut().unwrap();
    list.retain(|e| e["uri"] != a2a::EXTENSION_URI);
    if list.is_empty() {
        caps.remove("extensions");
    }
    card
}

/// Every A2A card shape of `tests/a2a-cards` (1.0 and 0.3, minimal to maximal: each type of security
/// scheme, extensions with params, several interfaces, skills with their own modes and security)
/// registered on one node is served by another, through the mesh, with every A2A field it was given,
/// the same bytes on both, signed by the publisher.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_a2a_field_survives_registration_gossip_and_serving() {
    let fixtures = a2a_fixtures();
    assert!(fixtures.len() >= 12, "{} card shapes", fixtures.len());
    let (da, db) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let a = TestNode::start(mesh_config(da.path(), Vec::new())).await;
    let b = TestNode::start(mesh_config(db.path(), vec![dial_addr(&a).await])).await;
    let publisher = a.node.peer_id().to_base58();
    let mut ids = Vec::new();
    for f in &fixtures {
        let (status, body) = a.post("/api/v1/agents", &f.input).await;
        assert_eq!(status, 201, "{}: {body}", f.name);
        ids.push(body["agent_id"].as_str().unwrap().to_owned());
    }
    for (f, id) in fixtures.iter().zip(&ids) {
        let path = format!("/api/v1/agents/{id}/agent-card.json");
        let on_b = b
            .wait_for(&format!("{} on the second node", f.name), || async {
                let (status, _, body) = b.get_raw(&path).await;
                (status == 200).then_some(body)
            })
            .await;
        let (_, _, on_a) = a.get_raw(&path).await;
        assert_eq!(on_b, on_a, "{}: the same bytes on every node", f.name);
        let served: Value = serde_json::from_str(&on_b).unwrap();
        verify_served(&served, &publisher).unwrap_or_else(|e| panic!("{}: {e}", f.name));
        assert_eq!(a2a_fields(&served), f.expected, "{}: served {served:#}", f.name);
    }
}

async fn version(node: &TestNode) -> Option<String> {
    let (status, body) = node.get("/api/v1/agents/poller").await;
    (status == 200).then(|| body["card"]["version"].as_str().unwrap_or_default().to_owned())
}

/// A local agent's own card server: its card can be changed, and it can fail.
#[derive(Clone)]
struct AgentServer {
    card: Arc<Mutex<Option<Value>>>,
}

async fn serve_card(server: AgentServer) -> String {
    let app = axum::Router::new().route(
        "/.well-known/agent-card.json",
        axum::routing::get(move || {
            let card = server.card.lock().unwrap().clone();
            async move {
                match card {
                    Some(c) => (StatusCode::OK, axum::Json(c)),
                    None => (StatusCode::SERVICE_UNAVAILABLE, axum::Json(json!({}))),
                }
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    format!("http://{addr}/.well-known/agent-card.json")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_polled_card_url_is_republished_on_change_and_its_failures_are_reported() {
    let card = |version: &str| {
        json!({"name": "Poller", "version": version, "supportedInterfaces": [{"url": "http://127.0.0.1:9",
            "protocolBinding": "JSONRPC", "protocolVersion": "1.0"}], "capabilities": {},
            "defaultInputModes": ["text/plain"], "defaultOutputModes": ["text/plain"],
            "skills": [{"id": "poll", "name": "Poll", "description": "Polls", "tags": ["t"]}]})
    };
    let server = AgentServer { card: Arc::new(Mutex::new(Some(card("1.0.0")))) };
    let url = serve_card(server.clone()).await;
    let dir = tempfile::tempdir().unwrap();
    let node = TestNode::start(agentmesh::config::Config {
        card_urls: vec![url.clone()],
        card_poll_interval: Duration::from_millis(100),
        ..config(dir.path())
    })
    .await;
    node.wait_for("the polled card", || async {
        (version(&node).await.as_deref() == Some("1.0.0")).then_some(())
    })
    .await;
    assert_eq!(node.health_of("poller").await, "active");

    *server.card.lock().unwrap() = Some(card("2.0.0"));
    node.wait_for("the changed card", || async {
        (version(&node).await.as_deref() == Some("2.0.0")).then_some(())
    })
    .await;

    *server.card.lock().unwrap() = None;
    node.wait_for("degraded after failed fetches", || async {
        (node.health_of("poller").await == "degraded").then_some(())
    })
    .await;
    *server.card.lock().unwrap() = Some(card("2.0.0"));
    node.wait_for("active again", || async { (node.health_of("poller").await == "active").then_some(()) })
        .await;

    // After a restart with the agent down, its stored card is not vouched for: the node still knows
    // which agent the URL registered and reports it failing.
    node.node.shutdown().await.unwrap();
    *server.card.lock().unwrap() = None;
    let node = TestNode::start(agentmesh::config::Config {
        card_urls: vec![url],
        card_poll_interval: Duration::from_millis(100),
        ..config(dir.path())
    })
    .await;
    node.wait_for("degraded after the restart", || async {
        (node.health_of("poller").await == "degraded").then_some(())
    })
    .await;
}
