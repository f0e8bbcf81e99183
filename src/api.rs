//! The loopback HTTP API: discovery, native and AgentField registration, health.
//!
//! [`router`] builds the whole app from an [`AppState`]; tests and the node serve it the same way.
//! Every route that writes sits behind `require_writer`: a loopback client, or a valid API key.

pub mod a2a;
pub mod agentfield;
pub mod agents;
pub mod body;
pub mod catalog;
pub mod discovery;
pub mod error;
pub mod events;
pub mod mcp;
pub mod metrics;
pub mod render;
pub mod resolve;
pub mod search;
pub mod server;
pub mod ui;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;

use axum::extract::{ConnectInfo, DefaultBodyLimit, Request, State};
use axum::http::{HeaderMap, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, put};
use axum::{Json, Router};
use serde_json::json;
use tower_http::timeout::TimeoutLayer;
use tracing::Instrument;

use crate::clock::now_millis;
use crate::defaults::{
    DISCOVERY_CONCURRENCY, HTTP_REQUEST_TIMEOUT, MAX_BODY_BYTES, MAX_REQUEST_ID_LEN, MAX_WATCHERS,
};
use crate::registry::Registry;
use error::ApiError;

/// What every handler shares.
#[derive(Clone)]
pub struct AppState {
    pub registry: Arc<Registry>,
    pub cache: Arc<discovery::ResponseCache>,
    /// The discovery filter index, kept in step with the registry's view.
    pub filters: Arc<crate::query::index::Indexer>,
    /// Records rendered for JSON answers, by the include flags asked.
    pub prepared: Arc<render::prepared::PreparedCache>,
    /// The capability search index, kept in step with the registry's view.
    pub search: Arc<crate::search::Engine>,
    /// Every metric family `/metrics` serves, and the discovery counters the request path updates.
    pub metrics: Arc<metrics::Metrics>,
    /// Registry change events for watch streams.
    pub watch: Arc<crate::watch::Watch>,
    /// Bounds open watch streams.
    pub watchers: Arc<tokio::sync::Semaphore>,
    /// Bounds discovery cache misses computed at once.
    pub discovery_permits: Arc<tokio::sync::Semaphore>,
    /// Lets non-loopback clients write. `None`: only loopback clients may write.
    pub api_key: Option<Arc<str>>,
    pub started: Instant,
    /// The mesh, when this node runs one.
    pub net: Option<crate::net::NetHandle>,
    /// The local agent `/.well-known/agent-card.json` serves; `None`: the smallest local agent id.
    pub well_known_agent: Option<Arc<str>>,
    /// How the context tiers count tokens when a request names no tokenizer.
    pub tokenizer: crate::search::context::Counter,
    /// What the capability-manifest directories serve, when the node has any.
    pub manifests: Option<Arc<crate::manifest::reload::Manifests>>,
    /// The last AI Catalog built, by view generation.
    pub catalog: Arc<catalog::CatalogCache>,
    /// What a registration offering another agent's capability gets.
    pub duplicates: crate::config::DuplicatePolicy,
}

impl AppState {
    pub fn new(registry: Arc<Registry>, api_key: Option<String>) -> Self {
        let now = now_millis();
        // Ids start at the start time in microseconds, so they keep increasing across restarts.
        let watch = Arc::new(crate::watch::Watch::asleep(now * 1000));
        let metrics = Arc::new(metrics::Metrics::new(registry.clone(), Default::default()));
        Self {
            registry,
            cache: Arc::default(),
            filters: Arc::default(),
            prepared: Arc::default(),
            search: Arc::default(),
            metrics,
            watch,
            watchers: Arc::new(tokio::sync::Semaphore::new(MAX_WATCHERS)),
            discovery_permits: Arc::new(tokio::sync::Semaphore::new(DISCOVERY_CONCURRENCY)),
            api_key: api_key.map(Into::into),
            started: Instant::now(),
            net: None,
            well_known_agent: None,
            tokenizer: Default::default(),
            manifests: None,
            catalog: Arc::default(),
            duplicates: crate::config::DuplicatePolicy::Route,
        }
    }

    pub fn with_tokenizer(mut self, tokenizer: crate::search::context::Counter) -> Self {
        self.tokenizer = tokenizer;
        self
    }

    pub fn with_well_known_agent(mut self, agent_id: Option<String>) -> Self {
        self.well_known_agent = agent_id.map(Into::into);
        self
    }

    /// Search with this engine (one that also ranks by meaning, say).
    pub fn with_search(mut self, search: Arc<crate::search::Engine>) -> Self {
        self.search = search;
        self
    }

    pub fn with_manifests(mut self, manifests: Arc<crate::manifest::reload::Manifests>) -> Self {
        self.manifests = Some(manifests);
        self
    }

    pub fn with_duplicates(mut self, policy: crate::config::DuplicatePolicy) -> Self {
        self.duplicates = policy;
        self
    }

    pub fn with_net(mut self, net: crate::net::NetHandle) -> Self {
        self.net = Some(net);
        self
    }

    /// Serves libp2p's families too: `libp2p` is the registry the mesh records into. Call before the
    /// state serves: the node's families start again from zero.
    pub fn with_libp2p_metrics(mut self, libp2p: prometheus_client::registry::Registry) -> Self {
        self.metrics = Arc::new(metrics::Metrics::new(self.registry.clone(), libp2p));
        self
    }
}

pub fn router(state: AppState) -> Router {
    let writes = Router::new()
        .route("/api/v1/agents", post(agents::register))
        .route("/api/v1/agents/{id}", axum::routing::delete(agents::remove))
        .route("/api/v1/agents/{id}/heartbeat", post(agentfield::heartbeat))
        .route("/api/v1/nodes/register", post(agentfield::register))
        .route("/api/v1/nodes/{id}/heartbeat", post(agentfield::heartbeat))
        .route("/api/v1/nodes/{id}/shutdown", post(agentfield::shutdown))
        .route("/api/v1/nodes/{id}/health", put(agentfield::update_health))
        .route("/api/v1/did/register", post(agentfield::did_register))
        .route_layer(middleware::from_fn_with_state(state.clone(), require_writer));
    Router::new()
        .route("/api/v1/health", get(health))
        .route("/openapi.json", get(openapi))
        .route("/metrics", get(metrics::metrics))
        .route("/api/v1/discovery/capabilities", get(discovery::capabilities))
        .route("/api/v1/discovery/search", get(search::search))
        .route("/api/v1/discovery/context", get(search::context))
        .route("/api/v1/discovery/tool", get(search::tool))
        .route("/api/v1/discovery/resolve", get(resolve::resolve))
        .route("/.well-known/ai-catalog.json", get(catalog::catalog))
        .route("/mcp", post(mcp::post))
        .route("/api/v1/discovery/events", get(events::events))
        .route("/api/v1/agents", get(agents::list))
        .route("/api/v1/agents/{id}", get(agents::get))
        .route("/api/v1/agents/{id}/agent-card.json", get(a2a::agent_card))
        .route("/.well-known/agent-card.json", get(a2a::well_known))
        .route("/.well-known/agent.json", get(a2a::well_known))
        .route("/api/v1/nodes", get(agentfield::list_nodes))
        .route("/api/v1/nodes/{id}", get(agentfield::get_node))
        .route("/api/v1/mesh/status", get(mesh_status))
        .route("/api/v1/mesh/peers", get(mesh_peers))
        .route("/api/v1/manifests", get(manifests))
        .merge(writes)
        .merge(ui::routes())
        .fallback(|| async { ApiError::NotFound("route".into()) })
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .layer(TimeoutLayer::with_status_code(StatusCode::REQUEST_TIMEOUT, HTTP_REQUEST_TIMEOUT))
        .layer(middleware::from_fn(trace_request))
        .with_state(state)
}

/// The header that names a request in the logs: taken from the client when it sends a usable one,
/// made here otherwise, and always sent back.
pub const REQUEST_ID_HEADER: &str = "x-request-id";

/// Runs each request in a `request` span (its id, method and path), so every log line written while it
/// is handled carries them, answers with its `X-Request-Id`, and logs its completion (debug).
async fn trace_request(req: Request, next: Next) -> Response {
    let started = Instant::now();
    let id = request_id(req.headers());
    let span = tracing::info_span!(
        "request",
        request_id = %id,
        method = %req.method(),
        path = %req.uri().path(),
    );
    let mut response = next.run(req).instrument(span.clone()).await;
    span.in_scope(|| {
        tracing::debug!(
            status = response.status().as_u16(),
            duration_ms = started.elapsed().as_secs_f64() * 1000.0,
            "request completed"
        )
    });
    if let Ok(value) = axum::http::HeaderValue::from_str(&id) {
        response.headers_mut().insert(REQUEST_ID_HEADER, value);
    }
    response
}

/// The client's `X-Request-Id` when it is 1 to `MAX_REQUEST_ID_LEN` visible ASCII characters, else a
/// new random one (16 hex digits).
fn request_id(headers: &HeaderMap) -> String {
    headers
        .get(REQUEST_ID_HEADER)
        .and_then(|v| v.to_str().ok())
        .filter(|v| !v.is_empty() && v.len() <= MAX_REQUEST_ID_LEN && v.bytes().all(|b| b.is_ascii_graphic()))
        .map_or_else(|| format!("{:016x}", rand::random::<u64>()), str::to_owned)
}

/// The OpenAPI 3.1 document of every route (`docs/openapi.json`, built in).
pub const OPENAPI: &str = include_str!("../docs/openapi.json");

async fn openapi() -> Response {
    ([(axum::http::header::CONTENT_TYPE, "application/json")], OPENAPI).into_response()
}

async fn health(State(app): State<AppState>) -> Json<serde_json::Value> {
    let snapshot = app.registry.snapshot();
    let store_error = app.registry.store_error();
    Json(json!({
        // Reads go on when the store refuses writes (a full disk): degraded, not down.
        "status": if store_error.is_none() { "healthy" } else { "degraded" },
        "store_writable": store_error.is_none(),
        "store_error": store_error,
        "peer_id": app.registry.local_peer_id().to_base58(),
        "version": env!("CARGO_PKG_VERSION"),
        "agents": snapshot.entries.len(),
        "local_agents": snapshot.of_publisher(&app.registry.local_peer_id()).filter(|e| e.is_local()).count(),
        "uptime_seconds": app.started.elapsed().as_secs(),
    }))
}

fn mesh(app: &AppState) -> Result<&crate::net::NetHandle, ApiError> {
    app.net.as_ref().ok_or_else(|| ApiError::NotFound("mesh (this node runs none)".into()))
}

async fn mesh_status(State(app): State<AppState>) -> Result<Response, ApiError> {
    let status = mesh(&app)?.status().await.map_err(|e| ApiError::internal(&e))?;
    Ok(Json(status).into_response())
}

async fn mesh_peers(State(app): State<AppState>) -> Result<Response, ApiError> {
    let peers = mesh(&app)?.peers().await.map_err(|e| ApiError::internal(&e))?;
    Ok(Json(json!({"peers": peers, "count": peers.len()})).into_response())
}

/// What each capability-manifest directory serves and what is wrong with it (empty without any).
async fn manifests(State(app): State<AppState>) -> Json<serde_json::Value> {
    let reports = app.manifests.as_ref().map(|m| m.reports()).unwrap_or_default();
    Json(json!({ "dirs": reports.as_slice() }))
}

/// Lets a write through when the client is on loopback or presents the API key (`X-API-Key` or
/// `Authorization: Bearer`).
async fn require_writer(State(app): State<AppState>, req: Request, next: Next) -> Response {
    let loopback = req
        .extensions()
        .get::<ConnectInfo<SocketAddr>>()
        .is_some_and(|ConnectInfo(addr)| addr.ip().is_loopback());
    if loopback || key_matches(app.api_key.as_deref(), req.headers()) {
        next.run(req).await
    } else {
        ApiError::Unauthorized.into_response()
    }
}

fn key_matches(expected: Option<&str>, headers: &HeaderMap) -> bool {
    let Some(expected) = expected else {
        return false;
    };
    let presented = headers.get("x-api-key").and_then(|v| v.to_str().ok()).or_else(|| {
        headers.get("authorization").and_then(|v| v.to_str().ok()).and_then(|v| v.strip_prefix("Bearer "))
    });
    presented.is_some_and(|p| constant_time_eq(p.as_bytes(), expected.as_bytes()))
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn api_key_from_either_header() {
        let mut h = HeaderMap::new();
        assert!(!key_matches(Some("k"), &h));
        h.insert("x-api-key", "k".parse().unwrap());
        assert!(key_matches(Some("k"), &h));
        assert!(!key_matches(None, &h), "no key configured: nothing matches");
        let mut h = HeaderMap::new();
        h.insert("authorization", "Bearer k".parse().unwrap());
        assert!(key_matches(Some("k"), &h));
        assert!(!key_matches(Some("kk"), &h));
    }
}

#[cfg(test)]
mod openapi_tests {
    /// Every route the router serves is in the OpenAPI document, with its method, and the document
    /// names no route the router lacks. (schemathesis, in CI, checks the answers against the schemas.)
    #[test]
    fn the_document_describes_exactly_the_routes_served() {
        let doc: serde_json::Value = serde_json::from_str(super::OPENAPI).unwrap();
        let mut documented: Vec<String> = Vec::new();
        for (path, ops) in doc["paths"].as_object().unwrap() {
            for method in ops.as_object().unwrap().keys() {
                documented.push(format!("{method} {path}"));
            }
        }
        let source = include_str!("api.rs");
        let mut served: Vec<String> = Vec::new();
        for line in source.lines().map(str::trim).filter(|l| l.starts_with(".route(\"")) {
            let path = line.split('"').nth(1).unwrap();
            let handlers = line.split_once(", ").unwrap().1;
            for method in ["get", "post", "put", "delete"] {
                if handlers.contains(&format!("{method}("))
                    || handlers.contains(&format!("routing::{method}("))
                {
                    served.push(format!("{method} {path}"));
                }
            }
        }
        documented.sort();
        served.sort();
        assert!(served.len() >= 20, "{served:?}");
        assert_eq!(served, documented);
    }
}

#[cfg(test)]
mod auth_tests {
    use super::*;
    use crate::registry::health::Thresholds;
    use axum::body::Body;
    use tower::ServiceExt;

    async fn call(app: Router, from: &str, key: Option<&str>) -> StatusCode {
        let mut req = Request::post("/api/v1/agents")
            .body(Body::from(r#"{"agent_id":"a","base_url":"http://x","skills":[{"id":"s"}]}"#))
            .unwrap();
        req.extensions_mut().insert(ConnectInfo(from.parse::<SocketAddr>().unwrap()));
        if let Some(key) = key {
            req.headers_mut().insert("x-api-key", key.parse().unwrap());
        }
        app.oneshot(req).await.unwrap().status()
    }

    #[tokio::test]
    async fn writes_need_loopback_or_the_key() {
        let dir = tempfile::tempdir().unwrap();
        let me = crate::identity::Identity::ephemeral().keypair().clone();
        let (registry, _) = Registry::open(dir.path(), me, Thresholds::default()).unwrap();
        let registry = Arc::new(registry);
        let key = "0123456789abcdef-key";
        let app = router(AppState::new(registry.clone(), Some(key.into())));
        assert_eq!(call(app.clone(), "192.0.2.7:5000", None).await, StatusCode::UNAUTHORIZED);
        assert_eq!(
            call(app.clone(), "192.0.2.7:5000", Some("wrong-key-wrong-key")).await,
            StatusCode::UNAUTHORIZED
        );
        assert!(registry.snapshot().entries.is_empty(), "a refused write writes nothing");
        assert_eq!(call(app.clone(), "192.0.2.7:5000", Some(key)).await, StatusCode::CREATED);
        assert_eq!(call(app.clone(), "127.0.0.1:5000", None).await, StatusCode::OK);
        assert_eq!(call(app.clone(), "[::1]:5000", None).await, StatusCode::OK);
        let no_key = router(AppState::new(registry, None));
        assert_eq!(call(no_key, "192.0.2.7:5000", Some(key)).await, StatusCode::UNAUTHORIZED);
    }
}
