//! The discovery endpoint over a real socket: the sixteen cases of the discovery spec.

mod common;

use std::time::Duration;

use common::{config, fixture_node, sdk_registration, TestNode};
use serde_json::{json, Value};

const CAPS: &str = "/api/v1/discovery/capabilities";

#[tokio::test]
async fn basic_listing_counts_and_order() {
    let dir = tempfile::tempdir().unwrap();
    let n = fixture_node(dir.path()).await;
    let (status, body) = n.get(CAPS).await;
    assert_eq!(status, 200);
    assert_eq!(
        n.discover_ids("").await,
        ["alpha-research", "beta-analytics", "gamma-i18n"],
        "sorted; no agent without capabilities"
    );
    assert_eq!(
        (body["total_agents"].as_u64(), body["total_reasoners"].as_u64(), body["total_skills"].as_u64()),
        (Some(3), Some(4), Some(3))
    );
    assert_eq!(body["pagination"], json!({"limit": 100, "offset": 0, "has_more": false}));
    let gamma = &body["capabilities"][2];
    assert_eq!(gamma["reasoners"], json!([]), "empty lists are [] not null");
    assert_eq!(gamma["health_status"], "active");
    assert!(body["discovered_at"].as_str().unwrap().ends_with('Z'));
}

#[tokio::test]
async fn one_agent_id() {
    let dir = tempfile::tempdir().unwrap();
    let n = fixture_node(dir.path()).await;
    assert_eq!(n.discover_ids("agent=beta-analytics").await, ["beta-analytics"]);
    assert!(n.discover_ids("agent=nobody").await.is_empty());
}

#[tokio::test]
async fn several_agent_ids() {
    let dir = tempfile::tempdir().unwrap();
    let n = fixture_node(dir.path()).await;
    assert_eq!(
        n.discover_ids("agent_ids=gamma-i18n%2Calpha-research").await,
        ["alpha-research", "gamma-i18n"]
    );
    assert_eq!(
        n.discover_ids("agent_ids=gamma-i18n,%20alpha-research,,gamma-i18n").await,
        ["alpha-research", "gamma-i18n"]
    );
}

#[tokio::test]
async fn id_aliases_merge() {
    let dir = tempfile::tempdir().unwrap();
    let n = fixture_node(dir.path()).await;
    assert_eq!(n.discover_ids("node_id=gamma-i18n").await, ["gamma-i18n"]);
    assert_eq!(n.discover_ids("node_ids=beta-analytics,gamma-i18n").await, ["beta-analytics", "gamma-i18n"]);
    assert_eq!(
        n.discover_ids("agent=alpha-research&node_id=gamma-i18n").await,
        ["alpha-research"],
        "agent wins over node_id"
    );
    assert_eq!(
        n.discover_ids("agent=alpha-research&node_ids=gamma-i18n").await,
        ["alpha-research", "gamma-i18n"]
    );
}

#[tokio::test]
async fn wildcards_contains_prefix_suffix() {
    let dir = tempfile::tempdir().unwrap();
    let n = fixture_node(dir.path()).await;
    let reasoners = |body: &Value| -> Vec<String> {
        body["capabilities"]
            .as_array()
            .unwrap()
            .iter()
            .flat_map(|c| {
                c["reasoners"].as_array().unwrap().iter().map(|r| r["id"].as_str().unwrap().to_owned())
            })
            .collect()
    };
    let (_, b) = n.get(&format!("{CAPS}?reasoner=%2Aresearch%2A")).await;
    assert_eq!(reasoners(&b), ["deep_research", "quick_research"]);
    let (_, b) = n.get(&format!("{CAPS}?reasoner=deep_*")).await;
    assert_eq!(reasoners(&b), ["deep_research"]);
    let (_, b) = n.get(&format!("{CAPS}?reasoner=*_data")).await;
    assert_eq!(reasoners(&b), ["analyze_data"]);
    let (_, b) = n.get(&format!("{CAPS}?reasoner=a*a")).await;
    assert_eq!(reasoners(&b), ["analyze_data"]);
    let (_, b) = n.get(&format!("{CAPS}?reasoner=Deep_*")).await;
    assert_eq!(reasoners(&b), Vec::<String>::new(), "case-sensitive");
    let (_, b) = n.get(&format!("{CAPS}?reasoner=research")).await;
    assert_eq!(b["total_reasoners"], 0, "no * means exact match");
}

#[tokio::test]
async fn tag_wildcards() {
    let dir = tempfile::tempdir().unwrap();
    let n = fixture_node(dir.path()).await;
    let (_, b) = n.get(&format!("{CAPS}?tags=i18*,web")).await;
    assert_eq!(b["total_agents"], 2);
    assert_eq!(b["total_skills"], 2);
    assert_eq!(b["total_reasoners"], 0);
    let (_, b) = n.get(&format!("{CAPS}?tags=*l")).await;
    let ids: Vec<_> =
        b["capabilities"][0]["reasoners"].as_array().unwrap().iter().map(|r| r["id"].clone()).collect();
    assert_eq!(ids, [json!("deep_research")]);
    assert_eq!(b["total_reasoners"], 2, "deep_research and analyze_data carry ml");
}

#[tokio::test]
async fn reasoner_filter_leaves_skills() {
    let dir = tempfile::tempdir().unwrap();
    let n = fixture_node(dir.path()).await;
    let (_, b) = n.get(&format!("{CAPS}?reasoner=summarize")).await;
    assert_eq!(b["total_reasoners"], 1);
    assert_eq!(b["total_skills"], 3, "reasoner= does not filter skills");
    assert_eq!(b["capabilities"][0]["reasoners"][0]["invocation_target"], "alpha-research:summarize");
}

#[tokio::test]
async fn skill_filter_leaves_reasoners() {
    let dir = tempfile::tempdir().unwrap();
    let n = fixture_node(dir.path()).await;
    let (_, b) = n.get(&format!("{CAPS}?skill=translate")).await;
    assert_eq!(b["total_skills"], 1);
    assert_eq!(b["total_reasoners"], 4);
    let gamma = b["capabilities"].as_array().unwrap().iter().find(|c| c["agent_id"] == "gamma-i18n").unwrap();
    assert_eq!(gamma["skills"][0]["invocation_target"], "gamma-i18n:skill:translate");
    let (_, b) = n.get(&format!("{CAPS}?skill=translate&reasoner=none")).await;
    assert_eq!(n.discover_ids("skill=translate&reasoner=none").await, ["gamma-i18n"]);
    assert_eq!(b["total_reasoners"], 0);
}

#[tokio::test]
async fn schema_and_include_flags() {
    let dir = tempfile::tempdir().unwrap();
    let n = fixture_node(dir.path()).await;
    let (_, b) = n.get(&format!("{CAPS}?agent=alpha-research")).await;
    let r = &b["capabilities"][0]["reasoners"][0];
    assert!(
        r.get("input_schema").is_none() && r.get("output_schema").is_none() && r.get("examples").is_none()
    );
    assert_eq!(r["description"], "Researches a topic in depth", "descriptions on by default");

    let (_, b) = n.get(&format!("{CAPS}?agent=alpha-research&include_input_schema=true&include_output_schema=1&include_examples=yes&include_descriptions=false")).await;
    let r = &b["capabilities"][0]["reasoners"][0];
    assert_eq!(r["input_schema"]["required"], json!(["query"]));
    assert_eq!(r["output_schema"]["properties"]["report"]["type"], "string");
    assert_eq!(r["examples"], json!([{"query": "rust"}]));
    assert!(r.get("description").is_none());
    let s = &b["capabilities"][0]["skills"][0];
    assert_eq!(s["input_schema"]["properties"]["q"]["type"], "string");
    assert!(s.get("output_schema").is_none());
    // A capability without a schema has no key at all, even when asked for.
    assert!(b["capabilities"][0]["reasoners"][1].get("input_schema").is_none());
}

#[tokio::test]
async fn json_format_shape() {
    let dir = tempfile::tempdir().unwrap();
    let n = fixture_node(dir.path()).await;
    let (status, headers, body) = n.get_raw(&format!("{CAPS}?format=JSON")).await;
    assert_eq!(status, 200);
    assert_eq!(headers["content-type"], "application/json");
    let b: Value = serde_json::from_str(&body).unwrap();
    let a = &b["capabilities"][0];
    for key in [
        "agent_id",
        "base_url",
        "version",
        "health_status",
        "deployment_type",
        "last_heartbeat",
        "reasoners",
        "skills",
    ] {
        assert!(a.get(key).is_some(), "missing {key}");
    }
    assert_eq!(a["version"], "1.2.0");
    assert_eq!(a["deployment_type"], "long_running");
    assert_eq!(a["local"], true);
    assert_eq!(a["publisher"], n.node.peer_id().to_base58());
    assert!(humantime::parse_rfc3339(a["last_heartbeat"].as_str().unwrap()).is_ok());
}

#[tokio::test]
async fn xml_format_parses_back() {
    let dir = tempfile::tempdir().unwrap();
    let n = fixture_node(dir.path()).await;
    // Hostile text: markup, quotes, CDATA terminator and a control character XML 1.0 forbids.
    n.register(&json!({
        "agent_id": "evil", "base_url": "http://127.0.0.1:1/?a=1&b=<2>",
        "reasoners": [{"id": "r", "description": "<x>&\"'</x> ]]> \u{1} \u{FFFF}", "tags": ["<tag>", "a&b"],
                       "input_schema": {"type": "object", "properties": {"p\"<": {"type": "string", "description": "]]>&", "default": "<d>"}}}}]
    })).await;
    let (status, headers, body) =
        n.get_raw(&format!("{CAPS}?format=xml&include_input_schema=true&include_output_schema=true")).await;
    assert_eq!(status, 200);
    assert_eq!(headers["content-type"], "application/xml");
    let doc = roxmltree::Document::parse(&body).unwrap_or_else(|e| panic!("{e}: {body}"));
    let root = doc.root_element();
    assert_eq!(root.tag_name().name(), "discovery");
    let summary = root.children().find(|c| c.has_tag_name("summary")).unwrap();
    assert_eq!(summary.attribute("total_agents"), Some("4"));
    let agents: Vec<_> = root.descendants().filter(|d| d.has_tag_name("agent")).collect();
    assert_eq!(
        agents.iter().map(|a| a.attribute("id").unwrap()).collect::<Vec<_>>(),
        ["alpha-research", "beta-analytics", "evil", "gamma-i18n"]
    );
    let evil = agents[2];
    assert_eq!(evil.attribute("base_url"), Some("http://127.0.0.1:1/?a=1&b=<2>"));
    let desc = evil.descendants().find(|d| d.has_tag_name("description")).unwrap().text().unwrap();
    assert!(desc.starts_with("<x>&\"'</x> ]]> "), "{desc}");
    let tags: Vec<_> =
        evil.descendants().filter(|d| d.has_tag_name("tag")).map(|t| t.text().unwrap()).collect();
    assert_eq!(tags, ["<tag>", "a&b"]);
    let field = evil.descendants().find(|d| d.has_tag_name("field")).unwrap();
    assert_eq!(field.attribute("name"), Some("p\"<"));
    assert_eq!(field.attribute("default"), Some("<d>"));
    // Schemas as fields: required, bounds and nesting.
    let alpha = agents[0];
    let query = alpha.descendants().find(|d| d.attribute("name") == Some("query")).unwrap();
    assert_eq!(
        (query.attribute("type"), query.attribute("required"), query.attribute("min")),
        (Some("string"), Some("true"), Some("1"))
    );
    let depth = alpha.descendants().find(|d| d.attribute("name") == Some("depth")).unwrap();
    assert_eq!(depth.parent().unwrap().attribute("name"), Some("options"), "nested properties nest");
    assert_eq!((depth.attribute("max"), depth.attribute("default")), (Some("10"), Some("3")));
    let skill = alpha.descendants().find(|d| d.has_tag_name("skill")).unwrap();
    assert_eq!(skill.attribute("target"), Some("alpha-research:skill:web_search"));
}

#[tokio::test]
async fn compact_format() {
    let dir = tempfile::tempdir().unwrap();
    let n = fixture_node(dir.path()).await;
    let (status, b) = n.get(&format!("{CAPS}?format=compact&limit=2")).await;
    assert_eq!(status, 200);
    let keys: Vec<_> = b.as_object().unwrap().keys().cloned().collect();
    assert_eq!(keys, ["discovered_at", "reasoners", "skills"]);
    assert_eq!(b["reasoners"].as_array().unwrap().len(), 4, "alpha and beta's reasoners: page of two agents");
    assert_eq!(
        b["reasoners"][0],
        json!({"id": "deep_research", "agent_id": "alpha-research", "target": "alpha-research:deep_research", "tags": ["research", "ml"]})
    );
    assert_eq!(b["skills"][1]["target"], "beta-analytics:skill:sql_query");
}

#[tokio::test]
async fn pagination() {
    let dir = tempfile::tempdir().unwrap();
    let n = fixture_node(dir.path()).await;
    let (_, b) = n.get(&format!("{CAPS}?limit=2")).await;
    assert_eq!(b["pagination"], json!({"limit": 2, "offset": 0, "has_more": true}));
    assert_eq!(b["total_agents"], 3);
    assert_eq!(n.discover_ids("limit=2&offset=2").await, ["gamma-i18n"]);
    let (_, b) = n.get(&format!("{CAPS}?limit=2&offset=2")).await;
    assert_eq!(b["pagination"]["has_more"], false);
    let (_, b) = n.get(&format!("{CAPS}?limit=0")).await;
    assert_eq!(
        (b["capabilities"].clone(), b["pagination"]["has_more"].clone(), b["total_agents"].clone()),
        (json!([]), json!(true), json!(3))
    );
    let (_, b) = n.get(&format!("{CAPS}?offset=50")).await;
    assert_eq!((b["capabilities"].clone(), b["total_agents"].clone()), (json!([]), json!(3)));
    assert_eq!(b["total_reasoners"], 4, "totals count before pagination");
}

fn short_health(dir: &std::path::Path) -> agentmesh::config::Config {
    agentmesh::config::Config {
        heartbeat_interval: Duration::from_millis(50),
        degraded_after: Duration::from_millis(400),
        inactive_after: Duration::from_millis(900),
        evict_after: Duration::from_secs(60),
        ..config(dir)
    }
}

#[tokio::test]
async fn health_filter_follows_heartbeat_age() {
    let dir = tempfile::tempdir().unwrap();
    let n = TestNode::start(short_health(dir.path())).await;
    n.register(&common::fixture_cards()[1]).await;
    let (status, _) = n.post("/api/v1/nodes/register", &sdk_registration("sdk-agent")).await;
    assert_eq!(status, 201);
    assert_eq!(n.discover_ids("health_status=active").await, ["beta-analytics", "sdk-agent"]);
    n.wait_for("sdk-agent degraded", || async {
        n.discover_ids("health_status=degraded").await.first().cloned()
    })
    .await;
    assert_eq!(
        n.discover_ids("health_status=active").await,
        ["beta-analytics"],
        "the node vouches for its card agents"
    );
    n.wait_for("sdk-agent inactive", || async {
        n.discover_ids("health_status=INACTIVE").await.first().cloned()
    })
    .await;
    let (status, _) = n.post("/api/v1/nodes/sdk-agent/heartbeat", &json!({"status": "ready"})).await;
    assert_eq!(status, 200);
    assert_eq!(n.discover_ids("health_status=active").await, ["beta-analytics", "sdk-agent"]);
    let (status, _) = n.post("/api/v1/nodes/sdk-agent/heartbeat", &json!({"status": "offline"})).await;
    assert_eq!(status, 200);
    assert_eq!(
        n.discover_ids("health_status=inactive").await,
        ["sdk-agent"],
        "the agent's own status counts"
    );
}

#[tokio::test]
async fn cache_never_serves_a_stale_result() {
    let dir = tempfile::tempdir().unwrap();
    let n = TestNode::start(short_health(dir.path())).await;
    n.register(&common::fixture_cards()[0]).await;
    let q = format!("{CAPS}?tags=*");
    let (_, h1, b1) = n.get_raw(&q).await;
    let (_, h2, b2) = n.get_raw(&q).await;
    assert_eq!((h1["x-cache"].to_str().unwrap(), h2["x-cache"].to_str().unwrap()), ("miss", "hit"));
    assert_eq!(b1, b2);

    // A registration is seen at once.
    n.register(&common::fixture_cards()[1]).await;
    assert_eq!(n.discover_ids("tags=*").await, ["alpha-research", "beta-analytics"]);
    // So is an update.
    let mut changed = common::fixture_cards()[1].clone();
    changed["version"] = json!("9.9.9");
    n.register(&changed).await;
    let (_, b) = n.get(&q).await;
    assert_eq!(b["capabilities"][1]["version"], "9.9.9");
    // And a removal.
    let (status, _) = n.send(reqwest::Method::DELETE, "/api/v1/agents/beta-analytics", None).await;
    assert_eq!(status, 200);
    assert_eq!(n.discover_ids("tags=*").await, ["alpha-research"]);

    // A health change reported by a heartbeat.
    n.post("/api/v1/nodes/register", &sdk_registration("sdk-agent")).await;
    let active = n.discover_ids("tags=*&health_status=active").await;
    assert_eq!(active, ["alpha-research", "sdk-agent"]);
    n.post("/api/v1/nodes/sdk-agent/heartbeat", &json!({"status": "degraded"})).await;
    assert_eq!(n.discover_ids("tags=*&health_status=active").await, ["alpha-research"]);
    n.post("/api/v1/nodes/sdk-agent/heartbeat", &json!({"status": "ready"})).await;
    assert_eq!(n.discover_ids("tags=*&health_status=active").await, ["alpha-research", "sdk-agent"]);

    // A health change by age alone: fill the cache, wait until the registry itself says degraded,
    // then the cached query must agree.
    let warm = n.discover_ids("tags=*&health_status=active").await;
    assert_eq!(warm, ["alpha-research", "sdk-agent"]);
    n.wait_for("sdk-agent degraded", || async {
        (n.health_of("sdk-agent").await == "degraded").then_some(())
    })
    .await;
    assert_eq!(n.discover_ids("tags=*&health_status=active").await, ["alpha-research"]);
}

#[tokio::test]
async fn invalid_parameters_get_exact_400s() {
    let dir = tempfile::tempdir().unwrap();
    let n = fixture_node(dir.path()).await;
    let bools = json!(["true", "false"]);
    let cases = [
        ("include_input_schema=maybe", "include_input_schema", "maybe", bools.clone()),
        ("include_output_schema=2", "include_output_schema", "2", bools.clone()),
        ("include_descriptions=on", "include_descriptions", "on", bools.clone()),
        ("include_examples=x", "include_examples", "x", bools.clone()),
        ("format=yaml", "format", "yaml", json!(["json", "xml", "compact"])),
        ("format=", "format", "", json!(["json", "xml", "compact"])),
        (
            "format=xml&health_status=dead",
            "health_status",
            "dead",
            json!(["active", "inactive", "degraded", "unknown"]),
        ),
        ("limit=-1", "limit", "-1", json!(["0-500"])),
        ("limit=501", "limit", "501", json!(["0-500"])),
        ("limit=10abc", "limit", "10abc", json!(["0-500"])),
        ("limit=1e3", "limit", "1e3", json!(["0-500"])),
        ("limit=0x10", "limit", "0x10", json!(["0-500"])),
        ("offset=-5", "offset", "-5", json!(["0-1000000"])),
        ("offset=1000001", "offset", "1000001", json!(["0-1000000"])),
        ("limit=x&offset=x&format=bad", "format", "bad", json!(["json", "xml", "compact"])),
    ];
    for (query, parameter, provided, allowed) in cases {
        let (status, headers, body) = n.get_raw(&format!("{CAPS}?{query}")).await;
        assert_eq!(status, 400, "{query}");
        assert_eq!(headers["content-type"], "application/json", "{query}: errors are JSON even for xml");
        let body: Value = serde_json::from_str(&body).unwrap();
        let want = json!({"error": "invalid_parameter", "message": format!("invalid {parameter} parameter"),
                          "details": {"parameter": parameter, "provided": provided, "allowed": allowed}});
        assert_eq!(body, want, "{query}");
    }
    // Unknown parameters are ignored.
    let (status, _) = n.get(&format!("{CAPS}?colour=blue")).await;
    assert_eq!(status, 200);
}

/// Answers are written into buffers other answers were written into before (a page over 16 KiB goes
/// back to a pool once the cache and the connection let go of it): every page of many, each rendered
/// again after the view changed, reads whole and lists exactly the agents at its offset.
#[tokio::test]
async fn pages_written_into_used_buffers_are_exact() {
    let dir = tempfile::tempdir().unwrap();
    let n = TestNode::start(config(dir.path())).await;
    let card = |i: usize, version: &str| {
        let reasoners: Vec<Value> = (0..6)
            .map(
                |r| json!({"id": format!("task-{r}"), "description": format!("{r} {}", "words ".repeat(40))}),
            )
            .collect();
        json!({"agent_id": format!("agent-{i:02}"), "base_url": "http://127.0.0.1:9", "version": version,
            "reasoners": reasoners})
    };
    const AGENTS: usize = 60;
    const PAGE: usize = 20;
    for i in 0..AGENTS {
        n.register(&card(i, "1.0.0")).await;
    }
    let ids: Vec<String> = (0..AGENTS).map(|i| format!("agent-{i:02}")).collect();
    let mut seed = 7u64;
    for round in 0..12 {
        // A new view: every cached answer is dropped and its buffer freed for the next ones.
        n.register(&card(round, &format!("2.0.{round}"))).await;
        for _ in 0..8 {
            seed = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
            let offset = (seed >> 33) as usize % (AGENTS - PAGE + 1);
            let (status, _, body) =
                n.get_raw(&format!("{CAPS}?limit={PAGE}&offset={offset}&include_descriptions=true")).await;
            assert_eq!(status, 200);
            assert!(body.len() > 16 * 1024, "a page the pool keeps: {} bytes", body.len());
            let page: Value = serde_json::from_str(&body).expect("the whole body is one JSON document");
            let listed: Vec<&str> = page["capabilities"]
                .as_array()
                .unwrap()
                .iter()
                .map(|a| a["agent_id"].as_str().unwrap())
                .collect();
            assert_eq!(listed, ids[offset..offset + PAGE], "round {round}, offset {offset}");
            assert_eq!(page["total_agents"], AGENTS);
        }
    }
}
