//! Capability search over HTTP on real nodes: ranked search, the context tiers and the tool
//! definition, with a capability registered on one node found through another.

mod common;

use common::{dial_addr, mesh_config, TestNode};
use serde_json::{json, Value};

async fn start(dir: &std::path::Path, bootstrap: Vec<String>) -> TestNode {
    TestNode::start(mesh_config(dir, bootstrap)).await
}

fn weather_card() -> Value {
    json!({
        "agent_id": "weather", "base_url": "http://127.0.0.1:9101", "category": "weather",
        "description": "Weather data for any city",
        "skills": [
            {"id": "get_forecast", "name": "Forecast",
             "description": "Daily weather forecast for a city: temperature, chance of rain and wind.",
             "tags": ["weather", "forecast"],
             "input_schema": {"type": "object", "required": ["city"],
                              "properties": {"city": {"type": "string", "description": "City name"},
                                             "days": {"type": "integer", "description": "Days ahead, 1 to 7"}}}},
            {"id": "weather_alerts", "description": "Severe weather warnings for a region.", "tags": ["weather"]}
        ]
    })
}

fn mail_card() -> Value {
    json!({
        "agent_id": "mailer", "base_url": "http://127.0.0.1:9102", "category": "messaging",
        "reasoners": [
            {"id": "draft_reply", "description": "Writes a reply to an email thread in the sender's tone.",
             "tags": ["email", "writing"], "requires": ["mailer:skill:send-email"]}
        ],
        "skills": [
            {"id": "send-email", "description": "Sends an email to one or more recipients.",
             "tags": ["email"], "has_side_effects": true, "required_secrets": ["SMTP_PASSWORD"]}
        ]
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_capability_registered_on_one_node_is_found_by_what_it_does_on_another() {
    let dirs: Vec<_> = (0..2).map(|_| tempfile::tempdir().unwrap()).collect();
    let a = start(dirs[0].path(), vec![]).await;
    let b = start(dirs[1].path(), vec![dial_addr(&a).await]).await;
    a.register(&weather_card()).await;
    a.register(&mail_card()).await;
    let found = b
        .wait_for("the weather card on b", || async {
            let (status, body) =
                b.get("/api/v1/discovery/search?q=will%20it%20rain%20tomorrow%20forecast").await;
            assert_eq!(status, 200, "{body}");
            (body["results"].as_array().is_some_and(|r| !r.is_empty())).then_some(body)
        })
        .await;
    let top = &found["results"][0];
    assert_eq!(top["target"], "weather:skill:get_forecast");
    assert_eq!(top["rank"], 1);
    assert_eq!(top["kind"], "skill");
    assert_eq!(top["publisher"], a.node.peer_id().to_base58());
    assert_eq!(top["category"], "weather");
    // A native card whose agent never reported: `unknown` until the publisher's first heartbeat
    // reaches b (which vouches for it as `starting`, alive by age), `active` after.
    assert!(["unknown", "active"].contains(&top["health_status"].as_str().unwrap()), "{found}");
    let relevance = top["relevance"].as_f64().unwrap();
    assert!((0.3..=1.0).contains(&relevance), "{found}");
    // Three decimals as printed, not an f32 widened to 17 digits.
    assert!(top["relevance"].to_string().len() <= 5, "{found}");
    assert!(top["matched"].as_array().unwrap().contains(&json!("description")), "{found}");
    assert!(found["ranking"].as_str().unwrap().starts_with("lexical"));

    // Filters apply before ranking; kind narrows.
    b.wait_for("the mail card on b", || async {
        let (_, body) = b.get("/api/v1/discovery/search?q=email&kind=skill").await;
        (body["results"][0]["target"] == "mailer:skill:send-email").then_some(())
    })
    .await;
    let (_, body) = b.get("/api/v1/discovery/search?q=email&agent=weather").await;
    assert_eq!(body["results"], json!([]));
    let (_, body) = b.get("/api/v1/discovery/search?q=email&kind=reasoner&min_relevance=0").await;
    assert!(body["results"].as_array().unwrap().iter().all(|r| r["kind"] == "reasoner"), "{body}");

    // The same request twice gives the same answer. Health is part of a result and moves on its own when
    // the publisher's first heartbeat reaches b, so the two requests wait for it first.
    b.wait_for("the publisher's heartbeat on b", || async {
        let (_, body) = b.get("/api/v1/discovery/search?q=weather%20email&limit=10&min_relevance=0").await;
        let results = body["results"].as_array()?.clone();
        (results.len() >= 4 && results.iter().all(|r| r["health_status"] == "active")).then_some(())
    })
    .await;
    let (_, one) = b.get("/api/v1/discovery/search?q=weather%20email&limit=10&min_relevance=0").await;
    let (_, two) = b.get("/api/v1/discovery/search?q=weather%20email&limit=10&min_relevance=0").await;
    assert_eq!(one["results"], two["results"]);
    assert!(one["total_indexed"].as_u64() >= Some(4));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_search_parameters_get_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let n = TestNode::start(common::config(dir.path())).await;
    for (query, parameter) in [
        ("", "q"),
        ("q=%20%20", "q"),
        ("q=x&limit=0", "limit"),
        ("q=x&limit=51", "limit"),
        ("q=x&min_relevance=1.5", "min_relevance"),
        ("q=x&min_relevance=-1", "min_relevance"),
        ("q=x&kind=tool", "kind"),
        ("q=x&health_status=sleepy", "health_status"),
    ] {
        let (status, body) = n.get(&format!("/api/v1/discovery/search?{query}")).await;
        assert_eq!(status, 400, "{query}: {body}");
        assert_eq!(body["error"], "invalid_parameter", "{query}: {body}");
        assert_eq!(body["details"]["parameter"], parameter, "{query}: {body}");
    }
    let long = "a".repeat(1025);
    let (status, body) = n.get(&format!("/api/v1/discovery/search?q={long}")).await;
    assert_eq!((status, body["details"]["parameter"].as_str()), (400, Some("q")));
    let (status, body) = n.get("/api/v1/discovery/context?q=x&tier0_tokens=40000").await;
    assert_eq!((status, body["details"]["parameter"].as_str()), (400, Some("tier0_tokens")));
    let (status, body) = n.get("/api/v1/discovery/tool?flavor=cobol").await;
    assert_eq!((status, body["details"]["parameter"].as_str()), (400, Some("flavor")));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn context_tiers_keep_their_budgets_and_tier0_depends_on_the_view_alone() {
    let dir = tempfile::tempdir().unwrap();
    let n = TestNode::start(common::config(dir.path())).await;
    n.register(&weather_card()).await;
    n.register(&mail_card()).await;
    let (status, ctx) = n.get("/api/v1/discovery/context?q=send%20an%20email&format=json").await;
    assert_eq!(status, 200, "{ctx}");
    for (tier, budget) in [("tier0", 200), ("tier1", 800), ("tier2", 2000)] {
        let t = &ctx[tier];
        assert!(t["tokens"].as_u64().unwrap() <= budget, "{tier}: {t}");
        assert_eq!(
            t["tokens"].as_u64().unwrap() as usize,
            t["text"].as_str().unwrap().chars().count().div_ceil(4)
        );
    }
    assert!(ctx["tier0"]["text"].as_str().unwrap().contains("weather (2)"), "{ctx}");
    assert!(ctx["tier1"]["text"].as_str().unwrap().contains("mailer:skill:send-email"), "{ctx}");
    let detail = ctx["tier2"]["text"].as_str().unwrap();
    assert!(detail.contains("Has side effects: yes") && detail.contains("SMTP_PASSWORD"), "{detail}");
    let total: u64 = ["tier0", "tier1", "tier2"].iter().map(|t| ctx[*t]["tokens"].as_u64().unwrap()).sum();
    assert_eq!(ctx["total_tokens"].as_u64(), Some(total));

    // Tier 0 is byte-identical whatever the query.
    let (_, other) = n.get("/api/v1/discovery/context?q=forecast&format=json").await;
    assert_eq!(ctx["tier0"], other["tier0"]);

    // Tight budgets: cut at entry boundaries, with what was left out counted.
    let (_, tight) =
        n.get("/api/v1/discovery/context?q=weather&format=json&tier0_tokens=20&tier1_tokens=30&tier2_tokens=60&min_relevance=0")
            .await;
    for (tier, budget) in [("tier0", 20), ("tier1", 30), ("tier2", 60)] {
        assert!(tight[tier]["tokens"].as_u64().unwrap() <= budget, "{tier}: {tight}");
    }
    assert!(tight["tier0"]["omitted"].as_u64() >= Some(1), "{tight}");

    // The text form stays within the sum of the budgets, separators included.
    let (status, headers, text) = n
        .get_raw("/api/v1/discovery/context?q=weather&tier0_tokens=50&tier1_tokens=60&tier2_tokens=90")
        .await;
    assert_eq!(status, 200);
    assert!(headers["content-type"].to_str().unwrap().starts_with("text/plain"));
    assert!(text.chars().count().div_ceil(4) <= 200, "{text}");
    assert!(!text.is_empty());

    // Exact counts with a BPE tokenizer, under the same budgets.
    for name in ["cl100k_base", "o200k_base"] {
        let (status, exact) = n
            .get(&format!(
                "/api/v1/discovery/context?q=send%20an%20email&format=json&tokenizer={name}&tier1_tokens=40"
            ))
            .await;
        assert_eq!(status, 200, "{exact}");
        assert_eq!(exact["tokenizer"], name);
        let bpe = if name == "cl100k_base" {
            tiktoken_rs::cl100k_base_singleton()
        } else {
            tiktoken_rs::o200k_base_singleton()
        };
        for (tier, budget) in [("tier0", 200), ("tier1", 40), ("tier2", 2000)] {
            let t = &exact[tier];
            let counted = bpe.count_ordinary(t["text"].as_str().unwrap());
            assert_eq!(t["tokens"].as_u64(), Some(counted as u64), "{name} {tier}: {t}");
            assert!(counted <= budget, "{name} {tier}: {t}");
        }
    }
    let (status, body) = n.get("/api/v1/discovery/context?q=x&tokenizer=gpt2").await;
    assert_eq!((status, body["details"]["parameter"].as_str()), (400, Some("tokenizer")));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_tool_definition_comes_in_each_vendor_shape() {
    let dir = tempfile::tempdir().unwrap();
    let n = TestNode::start(common::config(dir.path())).await;
    let (_, openai) = n.get("/api/v1/discovery/tool?flavor=openai").await;
    assert_eq!(openai["type"], "function");
    assert_eq!(openai["function"]["name"], "discover_capabilities");
    assert_eq!(openai["function"]["parameters"]["required"], json!(["query"]));
    let (_, anthropic) = n.get("/api/v1/discovery/tool?flavor=anthropic").await;
    assert_eq!(anthropic["input_schema"], openai["function"]["parameters"]);
    let (_, mcp) = n.get("/api/v1/discovery/tool?flavor=mcp").await;
    assert_eq!(mcp["inputSchema"], openai["function"]["parameters"]);
    let description = mcp["description"].as_str().unwrap();
    // About 80 tokens at four characters a token.
    assert!((200..=480).contains(&description.len()), "{}", description.len());
}

/// With `--embedding-model` (the real all-MiniLM-L6-v2 in `AGENTMESH_TEST_MODEL_DIR`; CI sets it), a
/// node embeds its view in the background, ranks by meaning too, and keeps the embeddings on disk.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_a_model_a_node_finds_capabilities_by_meaning() {
    let Some(model) = std::env::var_os("AGENTMESH_TEST_MODEL_DIR") else {
        println!("with_a_model_a_node_finds_capabilities_by_meaning skipped: set AGENTMESH_TEST_MODEL_DIR to a sentence-transformers all-MiniLM-L6-v2 directory");
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let mut config = common::config(dir.path());
    config.embedding_model = Some(model.into());
    let n = TestNode::start(config).await;
    n.register(&weather_card()).await;
    n.register(&mail_card()).await;
    // No word of the query is in the forecast's id, name, description or tags.
    let q = "/api/v1/discovery/search?q=do%20I%20need%20an%20umbrella%20on%20Saturday";
    let body = n
        .wait_for("hybrid ranking", || async {
            let (status, body) = n.get(q).await;
            assert_eq!(status, 200, "{body}");
            (body["ranking"] == "hybrid+graph").then_some(body)
        })
        .await;
    assert_eq!(body["results"][0]["target"], "weather:skill:get_forecast", "{body}");
    assert!(body["results"][0]["matched"].as_array().unwrap().contains(&json!("meaning")), "{body}");
    let (_, lexical) = n.get("/api/v1/discovery/search?q=send%20an%20email&limit=1").await;
    assert_eq!(lexical["results"][0]["target"], "mailer:skill:send-email", "{lexical}");
    assert!(dir.path().join("embeddings").is_dir(), "the embedding cache is on disk");
}

/// A model directory that is not one stops the node at start, naming the file at fault.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_model_directory_stops_the_start_with_the_file_named() {
    let dir = tempfile::tempdir().unwrap();
    let model = tempfile::tempdir().unwrap();
    let mut config = common::config(dir.path());
    config.embedding_model = Some(model.path().to_owned());
    let error = agentmesh::node::Node::start(config).await.err().expect("no model, no start").to_string();
    assert!(error.contains("embedding model") && error.contains("config.json"), "{error}");
    std::fs::write(model.path().join("config.json"), r#"{"model_type": "gpt2"}"#).unwrap();
    let mut config = common::config(dir.path());
    config.embedding_model = Some(model.path().to_owned());
    let error = agentmesh::node::Node::start(config).await.err().expect("not BERT, no start").to_string();
    assert!(error.contains("not a BERT model") && error.contains("gpt2"), "{error}");
}
