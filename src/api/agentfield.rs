//! AgentField drop-in routes, so agents built on the AgentField SDK register with their sidecar
//! unchanged: register, heartbeat, shutdown, node listing, health update, and a DID stub the SDK
//! tolerates.

use axum::extract::{Path, State};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Value};

use super::agents::{deregister, registered};
use super::body::{parse_json, RawBody};
use super::error::ApiError;
use super::AppState;
use crate::card::{to_raw, AgentCard, Capability};
use crate::clock::now_millis;
use crate::clock::rfc3339;
use crate::registry::health::{Health, Reported};
use crate::registry::{Entry, Liveness};

/// The registration payload the SDK sends. Unknown keys (team_id, features, communication_config, …)
/// are accepted and not kept.
#[derive(Deserialize)]
struct Registration {
    id: String,
    base_url: String,
    #[serde(default)]
    version: Option<String>,
    #[serde(default)]
    deployment_type: Option<String>,
    #[serde(default)]
    description: Option<String>,
    #[serde(default)]
    tags: Option<Vec<String>>,
    /// The SDK's agent-level tags (`Agent(tags=...)`).
    #[serde(default)]
    proposed_tags: Option<Vec<String>>,
    #[serde(default)]
    reasoners: Option<Vec<SdkCapability>>,
    #[serde(default)]
    skills: Option<Vec<SdkCapability>>,
    #[serde(default)]
    category: Option<String>,
    #[serde(default)]
    group_id: Option<String>,
    #[serde(default)]
    metadata: Option<Value>,
}

#[derive(Deserialize)]
struct SdkCapability {
    id: String,
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    description: Option<String>,
    #[serde(default)]
    tags: Option<Vec<String>>,
    #[serde(default)]
    input_schema: Option<Value>,
    #[serde(default)]
    output_schema: Option<Value>,
    #[serde(default)]
    examples: Option<Vec<Value>>,
    #[serde(default)]
    category: Option<String>,
    #[serde(default)]
    requires: Option<Vec<String>>,
    #[serde(default)]
    required_secrets: Option<Vec<String>>,
    #[serde(default)]
    has_side_effects: Option<bool>,
}

impl SdkCapability {
    fn into_capability(self) -> Capability {
        // `null` schemas mean "none"; anything else is kept and validated as a card field.
        let schema = |v: Option<Value>| v.filter(|v| !v.is_null()).map(|v| to_raw(&v));
        Capability {
            id: self.id,
            name: self.name,
            description: self.description,
            tags: self.tags.unwrap_or_default(),
            input_schema: schema(self.input_schema),
            output_schema: schema(self.output_schema),
            examples: self.examples.unwrap_or_default().iter().map(to_raw).collect(),
            category: self.category,
            requires: self.requires.unwrap_or_default(),
            required_secrets: self.required_secrets.unwrap_or_default(),
            has_side_effects: self.has_side_effects.unwrap_or(false),
            confidence_hint: None,
            metadata: Default::default(),
            input_modes: Vec::new(),
            output_modes: Vec::new(),
            a2a: None,
        }
    }
}

/// The SDK's `metadata.custom` entries that fit a card's metadata: string values under keys the card
/// allows, up to `MAX_METADATA` (the SDK puts whatever the agent's author gave there, and a registration
/// must not fail over a value the discovery view cannot hold). `name`, `description`, `tags` and
/// `category` have card fields of their own.
fn custom_metadata(custom: Option<&Value>) -> crate::card::Metadata {
    let Some(Value::Object(custom)) = custom else { return Default::default() };
    let entries = custom
        .iter()
        .filter(|(key, _)| !matches!(key.as_str(), "name" | "description" | "tags" | "category"))
        .filter_map(|(key, value)| Some((key.clone(), value.as_str()?.to_owned())));
    crate::card::keep_metadata(entries)
}

impl Registration {
    fn into_card(self) -> Result<AgentCard, ApiError> {
        let custom = self.metadata.as_ref().and_then(|m| m.get("custom"));
        let text = |key: &str| custom.and_then(|c| c.get(key)).and_then(Value::as_str).map(str::to_owned);
        let tags = self.tags.or(self.proposed_tags.filter(|t| !t.is_empty())).unwrap_or_else(|| {
            custom
                .and_then(|c| c.get("tags"))
                .and_then(Value::as_array)
                .map(|a| a.iter().filter_map(Value::as_str).map(str::to_owned).collect())
                .unwrap_or_default()
        });
        let card = AgentCard {
            name: text("name").unwrap_or_default(),
            description: self.description.or_else(|| text("description")).unwrap_or_default(),
            version: self.version.filter(|v| !v.is_empty()).unwrap_or_else(|| "0.0.0".to_owned()),
            base_url: self.base_url,
            deployment_type: self
                .deployment_type
                .filter(|d| !d.is_empty())
                .unwrap_or_else(|| "long_running".to_owned()),
            tags,
            category: self.category.or_else(|| text("category")),
            group_id: self.group_id.filter(|g| !g.is_empty()),
            metadata: custom_metadata(custom),
            reasoners: self
                .reasoners
                .unwrap_or_default()
                .into_iter()
                .map(SdkCapability::into_capability)
                .collect(),
            skills: self.skills.unwrap_or_default().into_iter().map(SdkCapability::into_capability).collect(),
            input_modes: vec!["application/json".to_owned()],
            output_modes: vec!["application/json".to_owned()],
            interfaces: Vec::new(),
            a2a: None,
            a2a_signature: None,
            agent_id: self.id,
        };
        Ok(card.normalized()?)
    }
}

pub async fn register(State(app): State<AppState>, RawBody(body): RawBody) -> Result<Response, ApiError> {
    let registration: Registration = parse_json(&body)?;
    let card = registration.into_card()?;
    super::agents::check_duplicates(&app, &card)?;
    let agent_id = card.agent_id.clone();
    let applied = app.registry.register_local(card, Liveness::Agent, now_millis()).await?;
    Ok(registered(&app, &agent_id, applied))
}

/// `{"status": ..}` (heartbeat) or `{"health_status"|"lifecycle_status": ..}` (health update); all optional.
#[derive(Deserialize, Default)]
struct StatusReport {
    #[serde(default)]
    status: Option<String>,
    #[serde(default)]
    health_status: Option<String>,
    #[serde(default)]
    lifecycle_status: Option<String>,
}

impl StatusReport {
    fn parse(body: &[u8]) -> Result<Option<Reported>, ApiError> {
        let report: Option<StatusReport> = parse_json(body)?;
        let report = report.unwrap_or_default();
        let given = [
            ("status", report.status),
            ("health_status", report.health_status),
            ("lifecycle_status", report.lifecycle_status),
        ]
        .into_iter()
        .find_map(|(k, v)| v.filter(|v| !v.is_empty()).map(|v| (k, v)));
        match given {
            None => Ok(None),
            Some((key, value)) => Reported::parse(&value).map(Some).ok_or_else(|| ApiError::InvalidBody {
                message: format!(
                    "unknown {key} `{value}` (expected starting, ready, busy, draining, degraded or offline)"
                ),
                field: Some(key.to_owned()),
            }),
        }
    }
}

pub async fn heartbeat(
    State(app): State<AppState>,
    Path(id): Path<String>,
    RawBody(body): RawBody,
) -> Result<Response, ApiError> {
    let reported = StatusReport::parse(&body)?;
    let health = app.registry.heartbeat_local(&id, reported, now_millis())?;
    Ok(Json(json!({"success": true, "node_id": id, "health_status": health.as_str()})).into_response())
}

pub async fn update_health(
    State(app): State<AppState>,
    Path(id): Path<String>,
    RawBody(body): RawBody,
) -> Result<Response, ApiError> {
    let reported = StatusReport::parse(&body)?;
    let now = now_millis();
    app.registry.heartbeat_local(&id, reported, now)?;
    node(&app, &id)
}

pub async fn shutdown(
    State(app): State<AppState>,
    Path(id): Path<String>,
    RawBody(body): RawBody,
) -> Result<Response, ApiError> {
    // The body (`reason`, `timeout_seconds`) is optional and only checked for being JSON.
    let _: Option<Value> = parse_json(&body)?;
    deregister(&app, &id).await
}

/// DIDs are not offered: 404 (the SDK carries on without one, as it does against a control plane
/// that has DIDs off).
pub async fn did_register() -> ApiError {
    ApiError::NotFound("DID registration (not offered by this daemon)".into())
}

fn lifecycle(health: Health, reported: Reported) -> &'static str {
    match health {
        Health::Inactive => "offline",
        Health::Degraded => "degraded",
        Health::Unknown => "starting",
        Health::Active => reported.as_str(),
    }
}

/// An entry as AgentField shows a node: the card's fields plus status.
fn node_json(e: &Entry, app: &AppState, now: u64) -> Value {
    let health = e.health(now, app.registry.thresholds());
    let mut node: Value = serde_json::from_str(&e.card.text()).unwrap_or_else(|_| json!({}));
    if let Some(fields) = node.as_object_mut() {
        if let Some(id) = fields.shift_remove("agent_id") {
            fields.insert("id".into(), id);
        }
        fields.insert("health_status".into(), health.as_str().into());
        fields.insert("lifecycle_status".into(), lifecycle(health, e.reported()).into());
        fields.insert("last_heartbeat".into(), rfc3339(e.last_heartbeat(now).unwrap_or(e.updated_at)).into());
        fields.insert("registered_at".into(), rfc3339(e.updated_at).into());
        fields.insert("publisher".into(), e.publisher_name.as_ref().into());
        fields.insert("local".into(), e.is_local().into());
    }
    node
}

fn node(app: &AppState, id: &str) -> Result<Response, ApiError> {
    let snapshot = app.registry.snapshot();
    let found = snapshot.by_agent_id(id);
    let entry = found.first().ok_or_else(|| ApiError::NotFound(format!("node `{id}`")))?;
    Ok(Json(node_json(entry, app, now_millis())).into_response())
}

pub async fn list_nodes(State(app): State<AppState>) -> Json<Value> {
    let now = now_millis();
    let snapshot = app.registry.snapshot();
    let nodes: Vec<Value> = snapshot.entries.iter().map(|e| node_json(e, &app, now)).collect();
    Json(json!({"nodes": nodes, "count": nodes.len()}))
}

pub async fn get_node(State(app): State<AppState>, Path(id): Path<String>) -> Result<Response, ApiError> {
    node(&app, &id)
}
