//! Helpers for integration tests: real nodes on 127.0.0.1:0 with their own data directories.
#![allow(dead_code)]

pub mod daemon;

use std::path::Path;
use std::time::{Duration, Instant};

use agentmesh::config::Config;
use agentmesh::node::Node;
use serde_json::{json, Value};

pub const DEADLINE: Duration = Duration::from_secs(10);

/// `len` lowercase letters from a xorshift stream seeded by `seed`: text that zstd cannot compress, for
/// cards that must take their full size on the heap or on disk (the store keeps cards compressed).
pub fn incompressible_text(seed: u64, len: usize) -> String {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            char::from(b'a' + (x % 26) as u8)
        })
        .collect()
}

/// A node config for tests: ephemeral HTTP port, no mDNS, no listen address.
pub fn config(dir: &Path) -> Config {
    Config {
        data_dir: dir.to_owned(),
        http: "127.0.0.1:0".parse().unwrap(),
        listen: Vec::new(),
        mdns: false,
        ..Config::default()
    }
}

pub struct TestNode {
    pub node: Node,
    pub base: String,
    pub http: reqwest::Client,
}

impl TestNode {
    pub async fn start(config: Config) -> TestNode {
        let node = Node::start(config).await.expect("node starts");
        let base = format!("http://{}", node.http_addr());
        TestNode { node, base, http: reqwest::Client::new() }
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{}", self.base, path)
    }

    /// GET returning (status, headers, body text).
    pub async fn get_raw(&self, path: &str) -> (u16, reqwest::header::HeaderMap, String) {
        let r = self.http.get(self.url(path)).send().await.expect("GET");
        let status = r.status().as_u16();
        let headers = r.headers().clone();
        (status, headers, r.text().await.unwrap())
    }

    pub async fn get(&self, path: &str) -> (u16, Value) {
        let (status, _, body) = self.get_raw(path).await;
        (status, serde_json::from_str(&body).unwrap_or_else(|e| panic!("{path}: {e}: {body}")))
    }

    pub async fn send(&self, method: reqwest::Method, path: &str, body: Option<&Value>) -> (u16, Value) {
        let mut req = self.http.request(method, self.url(path));
        if let Some(b) = body {
            req = req.json(b);
        }
        let r = req.send().await.expect("request");
        let status = r.status().as_u16();
        let text = r.text().await.unwrap();
        (status, serde_json::from_str(&text).unwrap_or(Value::String(text)))
    }

    pub async fn post(&self, path: &str, body: &Value) -> (u16, Value) {
        self.send(reqwest::Method::POST, path, Some(body)).await
    }

    /// Registers a native card and asserts success.
    pub async fn register(&self, card: &Value) {
        let (status, body) = self.post("/api/v1/agents", card).await;
        assert!(status == 201 || status == 200, "{status} {body}");
    }

    /// Discovery agent ids for a query string.
    pub async fn discover_ids(&self, query: &str) -> Vec<String> {
        let (status, body) = self.get(&format!("/api/v1/discovery/capabilities?{query}")).await;
        assert_eq!(status, 200, "{body}");
        body["capabilities"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["agent_id"].as_str().unwrap().to_owned())
            .collect()
    }

    /// Polls `check` until it returns Some, or panics at the deadline.
    pub async fn wait_for<T, F, Fut>(&self, what: &str, mut check: F) -> T
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Option<T>>,
    {
        let start = Instant::now();
        loop {
            if let Some(v) = check().await {
                return v;
            }
            assert!(start.elapsed() < DEADLINE, "timed out waiting for {what}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    pub async fn health_of(&self, id: &str) -> String {
        let (status, body) = self.get(&format!("/api/v1/agents/{id}")).await;
        assert_eq!(status, 200, "{body}");
        body["health_status"].as_str().unwrap().to_owned()
    }
}

/// A mesh node: ephemeral ports, short intervals so that health changes within a test's patience.
pub fn mesh_config(dir: &Path, bootstrap: Vec<String>) -> Config {
    Config {
        listen: vec!["/ip4/127.0.0.1/tcp/0".parse().unwrap()],
        bootstrap: bootstrap.iter().map(|a| a.parse().unwrap()).collect(),
        heartbeat_interval: Duration::from_millis(100),
        degraded_after: Duration::from_millis(600),
        inactive_after: Duration::from_millis(1200),
        evict_after: Duration::from_millis(2500),
        ..config(dir)
    }
}

/// The node's first listen address with its PeerId, once it listens.
pub async fn dial_addr(n: &TestNode) -> String {
    let peer = n.node.peer_id();
    let addr = n
        .wait_for("a listen address", || async {
            let (_, status) = n.get("/api/v1/mesh/status").await;
            status["listen_addrs"][0].as_str().map(str::to_owned)
        })
        .await;
    format!("{addr}/p2p/{peer}")
}

/// The discovery fixture: three agents with capabilities and one without.
pub fn fixture_cards() -> Vec<Value> {
    vec![
        json!({
            "agent_id": "alpha-research", "base_url": "http://127.0.0.1:9001", "version": "1.2.0",
            "description": "Research agent", "tags": ["research"],
            "reasoners": [
                {"id": "deep_research", "description": "Researches a topic in depth", "tags": ["research", "ml"],
                 "input_schema": {"type": "object", "properties": {
                     "query": {"type": "string", "description": "topic", "minLength": 1},
                     "options": {"type": "object", "properties": {"depth": {"type": "integer", "default": 3, "maximum": 10}}}
                 }, "required": ["query"]},
                 "output_schema": {"type": "object", "properties": {"report": {"type": "string"}}},
                 "examples": [{"query": "rust"}]},
                {"id": "summarize", "description": "Summarises text", "tags": ["nlp"]}
            ],
            "skills": [
                {"id": "web_search", "description": "Searches the web", "tags": ["web"],
                 "input_schema": {"type": "object", "properties": {"q": {"type": "string"}}}}
            ]
        }),
        json!({
            "agent_id": "beta-analytics", "base_url": "http://127.0.0.1:9002",
            "reasoners": [
                {"id": "quick_research", "tags": ["research"]},
                {"id": "analyze_data", "tags": ["analytics", "ml"]}
            ],
            "skills": [{"id": "sql_query", "tags": ["db"]}]
        }),
        json!({
            "agent_id": "gamma-i18n", "base_url": "http://127.0.0.1:9003",
            "skills": [{"id": "translate", "description": "Translates", "tags": ["nlp", "i18n"]}]
        }),
        json!({"agent_id": "delta-empty", "base_url": "http://127.0.0.1:9004"}),
    ]
}

/// A node in a fresh temp dir with the fixture registered.
pub async fn fixture_node(dir: &Path) -> TestNode {
    let node = TestNode::start(config(dir)).await;
    for card in fixture_cards() {
        node.register(&card).await;
    }
    node
}

/// An AgentField SDK registration payload, as the Python SDK sends it.
pub fn sdk_registration(id: &str) -> Value {
    json!({
        "id": id, "team_id": "default", "base_url": "http://127.0.0.1:8001", "version": "1.0.0",
        "reasoners": [{"id": "plan", "input_schema": {"type": "object"}, "output_schema": {"type": "object"},
                       "memory_config": {"auto_inject": []}, "tags": ["planning"]}],
        "skills": [{"id": "lookup", "input_schema": {"type": "object"}, "tags": ["tools"]}],
        "communication_config": {"protocols": ["http"], "websocket_endpoint": "", "heartbeat_interval": "5s"},
        "health_status": "healthy", "last_heartbeat": "2026-01-01T00:00:00Z", "registered_at": "2026-01-01T00:00:00Z",
        "features": {"ab_testing": false, "experimental": {}},
        "metadata": {"deployment": {"environment": "development", "platform": "python", "region": "local",
                                    "tags": {"sdk_version": "0.1.39", "language": "python"}},
                     "performance": {"latency_ms": 0, "throughput_ps": 0}, "custom": {}}
    })
}
