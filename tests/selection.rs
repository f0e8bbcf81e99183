//! Selection and catalogs on real nodes: metadata, versions and lifecycle as discovery filters,
//! `/resolve`, the AI Catalog, and polling the agent list by what changed.

mod common;

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use common::{config, dial_addr, mesh_config, TestNode};
use serde_json::{json, Value};

fn card(agent: &str, version: &str, team: &str, confidence: Option<f64>) -> Value {
    let mut refund = json!({"id": "refund", "tags": ["payments"], "metadata": {"region": "eu"}});
    if let Some(c) = confidence {
        refund["confidence_hint"] = json!(c);
    }
    json!({
        "agent_id": agent, "base_url": format!("http://127.0.0.1:9/{agent}"), "version": version,
        "metadata": {"owner_team": team, "region": "us"},
        "reasoners": [refund],
        "skills": [{"id": "status", "tags": ["payments"]}],
    })
}

/// `(agent_id, version)` of each agent a discovery query returns.
async fn found(n: &TestNode, query: &str) -> Vec<(String, String)> {
    let (status, body) = n.get(&format!("/api/v1/discovery/capabilities?{query}")).await;
    assert_eq!(status, 200, "{query}: {body}");
    body["capabilities"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| (a["agent_id"].as_str().unwrap().to_owned(), a["version"].as_str().unwrap().to_owned()))
        .collect()
}

fn pairs(list: &[(&str, &str)]) -> Vec<(String, String)> {
    list.iter().map(|(a, v)| (a.to_string(), v.to_string())).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metadata_lifecycle_and_version_filter_discovery_and_search() {
    let dir = tempfile::tempdir().unwrap();
    let n = TestNode::start(config(dir.path())).await;
    n.register(&card("payments", "2.1.0", "payments", None)).await;
    n.register(&card("ledger", "1.0.0", "finance", None)).await;
    n.register(&card("legacy", "v1-final", "payments", None)).await;

    // Agent metadata, with the wildcard rules; a capability's own entry wins over its agent's.
    assert_eq!(n.discover_ids("metadata.owner_team=payments").await, ["legacy", "payments"]);
    assert_eq!(n.discover_ids("metadata.owner_team=fin*").await, ["ledger"]);
    let (_, body) = n.get("/api/v1/discovery/capabilities?agent=payments&metadata.region=eu").await;
    let agent = &body["capabilities"][0];
    assert_eq!(agent["reasoners"].as_array().unwrap().len(), 1, "{body}");
    assert_eq!(agent["skills"].as_array().unwrap().len(), 0, "the skill inherits region=us: {body}");
    assert_eq!(agent["metadata"]["owner_team"], "payments");
    assert_eq!(agent["reasoners"][0]["metadata"]["region"], "eu");
    assert_eq!(agent["group_id"], "payments");
    assert_eq!(agent["lifecycle"], "ready");

    // Exact semantic versions; a version that is not one matches no exact filter.
    assert_eq!(found(&n, "version=1.0.0").await, pairs(&[("ledger", "1.0.0")]));
    assert!(found(&n, "version=1.0.1").await.is_empty());

    // Lifecycle, reported through the AgentField heartbeat, filters at once (no stale cached answer).
    assert_eq!(n.discover_ids("lifecycle=busy").await, Vec::<String>::new());
    let (status, _) = n.post("/api/v1/agents/ledger/heartbeat", &json!({"status": "busy"})).await;
    assert_eq!(status, 200);
    assert_eq!(n.discover_ids("lifecycle=busy").await, ["ledger"]);
    assert_eq!(n.discover_ids("lifecycle=ready").await, ["legacy", "payments"]);
    let (_, record) = n.get("/api/v1/agents/ledger").await;
    assert_eq!(record["lifecycle"], "busy");
    assert_eq!(record["health_status"], "active", "busy is alive");

    // The same filters in search.
    let (status, body) =
        n.get("/api/v1/discovery/search?q=refund&format=json&metadata.owner_team=finance").await;
    assert_eq!(status, 200, "{body}");
    let agents: Vec<&str> =
        body["results"].as_array().unwrap().iter().map(|r| r["agent_id"].as_str().unwrap()).collect();
    assert_eq!(agents, ["ledger"], "{body}");

    // Bad values are refused with the parameter named.
    for (query, parameter) in [
        ("version=2.x", "version"),
        ("lifecycle=sleeping", "lifecycle"),
        ("metadata.bad%20key=x", "metadata"),
    ] {
        let (status, body) = n.get(&format!("/api/v1/discovery/capabilities?{query}")).await;
        assert_eq!(status, 400, "{query}: {body}");
        assert_eq!(body["details"]["parameter"], parameter, "{body}");
    }
    // Metadata the card rules refuse is refused at registration, naming the field.
    let mut bad = card("bad", "1.0.0", "x", None);
    bad["metadata"]["has space"] = json!("v");
    let (status, body) = n.post("/api/v1/agents", &bad).await;
    assert_eq!(status, 400, "{body}");
    assert_eq!(body["details"]["field"], "metadata.has space", "{body}");
    let mut bad = card("bad", "1.0.0", "x", Some(1.5));
    bad["metadata"] = json!({});
    let (status, body) = n.post("/api/v1/agents", &bad).await;
    assert_eq!(status, 400, "{body}");
    assert_eq!(body["details"]["field"], "reasoners[0].confidence_hint", "{body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rolling_update_shows_two_versions_then_one_and_resolve_follows_the_policy() {
    let (da, db) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let a = TestNode::start(mesh_config(da.path(), Vec::new())).await;
    let b = TestNode::start(mesh_config(db.path(), vec![dial_addr(&a).await])).await;
    // The old replica on A, the new one coming up on B: two versions side by side, everywhere.
    a.register(&card("payments", "1.4.0", "payments", Some(0.6))).await;
    b.register(&card("payments", "2.0.0", "payments", Some(0.9))).await;
    for n in [&a, &b] {
        n.wait_for("both versions, active", || async {
            (found(n, "agent=payments&health_status=active").await.len() == 2).then_some(())
        })
        .await;
        assert_eq!(found(n, "version=latest").await, pairs(&[("payments", "2.0.0")]));
        assert_eq!(found(n, "version=1.4.0").await, pairs(&[("payments", "1.4.0")]));
    }

    // Both healthy and ready: the higher confidence_hint wins, the other is the failover.
    let (status, picked) = a.get("/api/v1/discovery/resolve?capability=refund").await;
    assert_eq!(status, 200, "{picked}");
    assert_eq!(picked["target"], "payments:refund");
    assert_eq!(picked["version"], "2.0.0", "{picked}");
    assert_eq!(picked["publisher"], b.node.peer_id().to_base58());
    assert_eq!(picked["failover"], json!(["payments:refund"]), "{picked}");
    assert!(picked["reason"].as_str().unwrap().contains("confidence"), "{picked}");
    // The filters narrow the choice.
    let (_, picked) = a.get("/api/v1/discovery/resolve?capability=refund&version=1.4.0").await;
    assert_eq!(picked["version"], "1.4.0", "{picked}");
    assert_eq!(picked["failover"], json!([]), "{picked}");
    // The new replica drains: it takes no new work, so the old one is picked on every node.
    let (status, _) = b.post("/api/v1/nodes/payments/heartbeat", &json!({"status": "draining"})).await;
    assert_eq!(status, 200);
    for n in [&a, &b] {
        n.wait_for("the draining replica passed over", || async {
            let (_, picked) = n.get("/api/v1/discovery/resolve?capability=refund").await;
            (picked["version"] == "1.4.0").then_some(())
        })
        .await;
    }
    // Then it is gone: one version again.
    let (status, _) = b.send(reqwest::Method::DELETE, "/api/v1/agents/payments", None).await;
    assert_eq!(status, 200);
    a.wait_for("one version left", || async {
        (found(&a, "agent=payments").await == pairs(&[("payments", "1.4.0")])).then_some(())
    })
    .await;

    // Nothing qualifies: 404 no_match; no capability named: 400.
    let (status, body) = a.get("/api/v1/discovery/resolve?capability=teleport").await;
    assert_eq!((status, body["error"].as_str()), (404, Some("no_match")), "{body}");
    let (status, body) = a.get("/api/v1/discovery/resolve").await;
    assert_eq!(status, 400, "{body}");
    assert_eq!(body["details"]["parameter"], "capability");
}

/// Checks a detached compact JWS (`protected..signature`, EdDSA) over the RFC 8785 form of `document`
/// without its `signature`, as `signer`'s.
fn verify_detached(document: &Value, signer: &libp2p::PeerId) -> bool {
    let jws = document["signature"].as_str().unwrap();
    let (protected, signature) = jws.split_once("..").unwrap();
    let header: Value = serde_json::from_slice(&URL_SAFE_NO_PAD.decode(protected).unwrap()).unwrap();
    assert_eq!(header["alg"], "EdDSA");
    assert_eq!(header["kid"], signer.to_base58());
    let mut unsigned = document.clone();
    unsigned.as_object_mut().unwrap().remove("signature");
    let payload = serde_json_canonicalizer::to_vec(&unsigned).unwrap();
    let input = format!("{protected}.{}", URL_SAFE_NO_PAD.encode(payload));
    let key = libp2p::identity::PublicKey::try_decode_protobuf(&signer.to_bytes()[2..]).unwrap();
    key.verify(input.as_bytes(), &URL_SAFE_NO_PAD.decode(signature).unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_ai_catalog_lists_every_card_signed_by_this_node() {
    let (da, db) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let a = TestNode::start(mesh_config(da.path(), Vec::new())).await;
    let b = TestNode::start(mesh_config(db.path(), vec![dial_addr(&a).await])).await;
    a.register(&card("payments", "1.0.0", "payments", None)).await;
    b.register(&card("ledger", "1.0.0", "finance", None)).await;
    b.register(&json!({"agent_id": "bare", "base_url": "http://127.0.0.1:9"})).await;
    a.wait_for("the other node's agents", || async { (a.discover_ids("").await.len() == 2).then_some(()) })
        .await;

    let (status, headers, text) = a.get_raw("/.well-known/ai-catalog.json").await;
    assert_eq!(status, 200);
    assert!(headers["content-type"].to_str().unwrap().starts_with("application/json"));
    let catalog: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(catalog["specVersion"], "1.0");
    assert!(verify_detached(&catalog, &a.node.peer_id()), "the catalog verifies as node A's");
    let entries = catalog["entries"].as_array().unwrap();
    let names: Vec<&str> = entries.iter().map(|e| e["data"]["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["ledger", "payments"], "an agent with no capability has no A2A card: {catalog}");
    for entry in entries {
        assert_eq!(entry["type"], "application/a2a-agent-card+json");
        assert!(
            entry["data"]["signatures"][0]["signature"].is_string(),
            "each card keeps its publisher's JWS"
        );
    }
    assert_eq!(entries[0]["publisher"]["identifier"], b.node.peer_id().to_base58());

    // Unchanged view, same ETag: 304.
    let etag = headers["etag"].to_str().unwrap().to_owned();
    let catalog_status = || async {
        let r = a.http.get(a.url("/.well-known/ai-catalog.json")).header("if-none-match", &etag).send();
        r.await.unwrap().status()
    };
    assert_eq!(catalog_status().await, 304);
    a.register(&card("refunds", "1.0.0", "payments", None)).await;
    assert_eq!(catalog_status().await, 200, "a changed view is a new catalog");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_aggregator_polls_what_changed_with_updated_since_and_a_cursor() {
    let dir = tempfile::tempdir().unwrap();
    let n = TestNode::start(config(dir.path())).await;
    for agent in ["c", "a", "b"] {
        n.register(&card(agent, "1.0.0", "t", None)).await;
    }
    let ids = |body: &Value| -> Vec<String> {
        body["agents"]
            .as_array()
            .unwrap()
            .iter()
            .map(|a| a["agent_id"].as_str().unwrap().to_owned())
            .collect()
    };
    // In the order this node accepted them, two at a time.
    let (status, first) = n.get("/api/v1/agents?updated_since=0&limit=2").await;
    assert_eq!(status, 200, "{first}");
    assert_eq!(ids(&first), ["c", "a"]);
    assert_eq!((first["total"].as_u64(), first["has_more"].as_bool()), (Some(3), Some(true)));
    let cursor = first["next_cursor"].as_str().unwrap().to_owned();
    let (_, second) = n.get(&format!("/api/v1/agents?cursor={cursor}&limit=2")).await;
    assert_eq!(ids(&second), ["b"]);
    let cursor = second["next_cursor"].as_str().unwrap().to_owned();
    // Nothing new: empty, and the cursor stays where it was.
    let (_, idle) = n.get(&format!("/api/v1/agents?cursor={cursor}")).await;
    assert_eq!(ids(&idle), Vec::<String>::new());
    assert_eq!(idle["next_cursor"], cursor.as_str());
    // A new agent and an updated one come next, once each.
    n.register(&card("d", "1.0.0", "t", None)).await;
    n.register(&card("a", "1.0.1", "t", None)).await;
    let (_, next) = n.get(&format!("/api/v1/agents?cursor={cursor}")).await;
    assert_eq!(ids(&next), ["d", "a"]);
    // An RFC 3339 time works as well; garbage is a 400 naming the parameter.
    let (status, body) = n.get("/api/v1/agents?updated_since=2000-01-01T00:00:00Z").await;
    assert_eq!((status, body["total"].as_u64()), (200, Some(4)), "{body}");
    for (query, parameter) in [("updated_since=yesterday", "updated_since"), ("cursor=nope", "cursor")] {
        let (status, body) = n.get(&format!("/api/v1/agents?{query}")).await;
        assert_eq!(status, 400, "{body}");
        assert_eq!(body["details"]["parameter"], parameter, "{body}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agentspec_and_openribcage_documents_register_travel_and_resolve() {
    let (da, db) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let a = TestNode::start(mesh_config(da.path(), Vec::new())).await;
    let b = TestNode::start(mesh_config(db.path(), vec![dial_addr(&a).await])).await;
    let spec = json!({
        "agent_type": "refund-processor", "version": "2.3.0", "description": "Processes refunds",
        "capabilities": [{"name": "process_refund", "description": "Refund an order", "confidence_hint": 0.92,
                          "input_schema": {"type": "object", "properties": {"order_id": {"type": "string"}}}}],
        "nats_subject": "agents.payments.refund", "consumer_group": "refund-workers",
        "supported_patterns": ["request_reply"], "max_concurrent_tasks": 8, "task_timeout_ms": 30000,
        "owner_team": "payments", "tenant_scope": "eu", "tags": {"domain": "finance"},
        "status": "active", "registered_at": "2026-01-01T00:00:00Z"
    });
    let (status, body) = a.post("/api/v1/agents", &spec).await;
    assert_eq!(status, 201, "{body}");
    let ribcage = json!({
        "name": "Invoice Bot", "version": "1.2.0", "capabilities": ["extract_totals"],
        "endpoints": [{"type": "http", "url": "http://127.0.0.1:9/api", "methods": ["POST"]}],
        "metadata": {"owner_team": "ap"}
    });
    let (status, body) = a.post("/api/v1/agents", &ribcage).await;
    assert_eq!(status, 201, "{body}");

    // Seen on the other node, filterable by what the documents said.
    b.wait_for("both documents' agents", || async {
        (b.discover_ids("").await == ["invoice-bot", "refund-processor"]).then_some(())
    })
    .await;
    assert_eq!(
        b.discover_ids("metadata.owner_team=payments&metadata.tenant_scope=eu").await,
        ["refund-processor"]
    );
    assert_eq!(b.discover_ids("tags=domain:finance").await, ["refund-processor"]);
    assert_eq!(b.discover_ids("skill=extract_totals&metadata.owner_team=ap").await, ["invoice-bot"]);
    b.wait_for("the spec agent active", || async {
        (b.discover_ids("health_status=active&agent=refund-processor").await.len() == 1).then_some(())
    })
    .await;
    let (status, picked) = b.get("/api/v1/discovery/resolve?capability=process_refund").await;
    assert_eq!(status, 200, "{picked}");
    assert_eq!(picked["base_url"], "nats:agents.payments.refund", "reached by its subject: {picked}");
    assert_eq!(picked["confidence_hint"], 0.92);
    let (_, record) = b.get("/api/v1/agents/refund-processor").await;
    assert_eq!(record["card"]["metadata"]["consumer_group"], "refund-workers");
    assert_eq!(record["card"]["interfaces"][0]["protocol_binding"], "NATS");

    // A document missing what it needs is refused, naming the field.
    let (status, body) = a.post("/api/v1/agents", &json!({"agent_type": "x", "capabilities": []})).await;
    assert_eq!(status, 400, "{body}");
    assert_eq!(body["details"]["field"], "nats_subject", "{body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn duplicate_capabilities_are_routed_by_default_and_refused_when_the_node_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let n = TestNode::start(config(dir.path())).await;
    n.register(&card("payments", "1.0.0", "payments", None)).await;
    n.register(&card("payments-eu", "1.0.0", "payments", None)).await;
    assert_eq!(n.discover_ids("reasoner=refund").await, ["payments", "payments-eu"], "route: both serve it");

    let dir = tempfile::tempdir().unwrap();
    let strict = agentmesh::config::Config {
        duplicate_capabilities: agentmesh::config::DuplicatePolicy::Reject,
        ..config(dir.path())
    };
    let n = TestNode::start(strict).await;
    n.register(&card("payments", "1.0.0", "payments", None)).await;
    let (status, body) = n.post("/api/v1/agents", &card("payments-eu", "1.0.0", "payments", None)).await;
    assert_eq!(status, 409, "{body}");
    assert_eq!(body["error"], "duplicate_capability");
    assert_eq!(body["details"]["agent_id"], "payments", "{body}");
    // Through the AgentField route too; the agent's own re-registration is not a duplicate.
    let sdk = json!({"id": "refunder", "base_url": "http://127.0.0.1:9", "reasoners": [{"id": "refund"}]});
    let (status, _) = n.post("/api/v1/nodes/register", &sdk).await;
    assert_eq!(status, 409);
    let (status, body) = n.post("/api/v1/agents", &card("payments", "1.0.1", "payments", None)).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(n.discover_ids("").await, ["payments"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn media_types_filter_by_a_capability_s_own_modes_else_its_card_s() {
    let dir = tempfile::tempdir().unwrap();
    let n = TestNode::start(config(dir.path())).await;
    n.register(&json!({
        "agent_id": "transcriber", "base_url": "http://127.0.0.1:9", "input_modes": ["audio/wav", "audio/mpeg"],
        "skills": [{"id": "transcribe"}, {"id": "summarize", "input_modes": ["text/plain"]}]
    }))
    .await;
    n.register(&json!({
        "agent_id": "imager", "base_url": "http://127.0.0.1:9",
        "skills": [{"id": "caption", "input_modes": ["image/*"], "output_modes": ["text/plain; charset=utf-8"]}]
    }))
    .await;
    let skills = |body: &Value| -> Vec<String> {
        body["capabilities"]
            .as_array()
            .unwrap()
            .iter()
            .flat_map(|a| {
                a["skills"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|s| s["invocation_target"].as_str().unwrap().to_owned())
            })
            .collect()
    };
    for (query, expected) in [
        ("input_mode=audio/wav", vec!["transcriber:skill:transcribe"]),
        ("input_mode=AUDIO/MPEG", vec!["transcriber:skill:transcribe"]),
        ("input_mode=audio/*", vec!["transcriber:skill:transcribe"]),
        ("input_mode=image/png", vec!["imager:skill:caption"]),
        ("input_mode=text/plain", vec!["transcriber:skill:summarize"]),
        ("output_mode=text/plain", vec!["imager:skill:caption"]),
        ("output_mode=application/json&input_mode=audio/wav", vec!["transcriber:skill:transcribe"]),
        ("input_mode=video/mp4", vec![]),
    ] {
        let (status, body) = n.get(&format!("/api/v1/discovery/capabilities?{query}")).await;
        assert_eq!(status, 200, "{query}: {body}");
        assert_eq!(skills(&body), expected, "{query}");
    }
    let (_, picked) = n.get("/api/v1/discovery/resolve?capability=*&input_mode=image/jpeg").await;
    assert_eq!(picked["target"], "imager:skill:caption", "{picked}");
    let (status, body) = n.get("/api/v1/discovery/capabilities?input_mode=wav").await;
    assert_eq!((status, body["details"]["parameter"].as_str()), (400, Some("input_mode")), "{body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_versions_side_by_side_on_one_node_are_one_group() {
    let dir = tempfile::tempdir().unwrap();
    let n = TestNode::start(config(dir.path())).await;
    let versioned = |agent: &str, version: &str| {
        let mut c = card(agent, version, "payments", None);
        c["group_id"] = json!("payments");
        c
    };
    n.register(&versioned("payments-v1", "1.9.0")).await;
    n.register(&versioned("payments-v2", "2.0.0")).await;
    n.register(&card("ledger", "0.1.0", "finance", None)).await;
    assert_eq!(
        found(&n, "version=latest").await,
        pairs(&[("ledger", "0.1.0"), ("payments-v2", "2.0.0")]),
        "latest compares within a group: payments-v1 is the older version of payments"
    );
    let (_, picked) = n
        .get("/api/v1/discovery/resolve?capability=refund&version=latest&metadata.owner_team=payments")
        .await;
    assert_eq!(picked["agent_id"], "payments-v2", "{picked}");
    let (_, body) = n.get("/api/v1/discovery/capabilities?agent=payments-v1").await;
    assert_eq!(body["capabilities"][0]["group_id"], "payments");
    // The new version done, the old one leaves: one version again, and latest is unchanged.
    let (status, _) = n.send(reqwest::Method::DELETE, "/api/v1/agents/payments-v1", None).await;
    assert_eq!(status, 200);
    assert_eq!(found(&n, "metadata.owner_team=payments").await, pairs(&[("payments-v2", "2.0.0")]));
}
