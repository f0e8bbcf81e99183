//! Native registration: `POST/GET /api/v1/agents`, `GET/DELETE /api/v1/agents/{id}`.

use axum::extract::{Path, RawQuery, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Serialize;
use serde_json::json;
use std::sync::Arc;

use super::body::RawBody;
use super::error::ApiError;
use super::AppState;
use crate::card::AgentCard;
use crate::clock::now_millis;
use crate::clock::rfc3339;
use crate::registry::{Applied, Entry, Liveness, Snapshot};

/// Default and largest page of `GET /api/v1/agents`.
const LIST_LIMIT: usize = 100;
const MAX_LIST_LIMIT: usize = 1000;

/// One record as the native API shows it: the card plus what this node knows about it.
#[derive(Serialize)]
pub struct RecordView<'a> {
    pub agent_id: &'a str,
    pub publisher: String,
    pub seq: u64,
    pub local: bool,
    pub health_status: &'static str,
    pub last_heartbeat: Option<String>,
    pub updated_at: String,
    pub card: &'a serde_json::value::RawValue,
}

pub fn record_view<'a>(e: &'a Entry, app: &AppState, now: u64) -> RecordView<'a> {
    RecordView {
        agent_id: &e.key.agent_id,
        publisher: e.publisher_name.to_string(),
        seq: e.seq,
        local: e.is_local(),
        health_status: e.health(now, app.registry.thresholds()).as_str(),
        last_heartbeat: e.last_heartbeat(now).map(rfc3339),
        updated_at: rfc3339(e.updated_at),
        card: e.card.raw(),
    }
}

/// Registration answer shared by the native and AgentField routes: 201 when new, 200 when updated.
pub fn registered(app: &AppState, agent_id: &str, applied: Applied) -> Response {
    let (status, seq) = match applied {
        Applied::Created { seq } => (StatusCode::CREATED, seq),
        Applied::Updated { seq } | Applied::Removed { seq } | Applied::Unchanged { seq } => {
            (StatusCode::OK, seq)
        }
        Applied::Stale { held } => (StatusCode::OK, held.unwrap_or_default()),
        // Limits apply to remote records only; a local registration never meets one.
        Applied::OverLimit(_) => (StatusCode::OK, 0),
    };
    tracing::info!(agent_id, seq, created = status == StatusCode::CREATED, "local agent registered");
    let body = json!({
        "success": true,
        "message": "agent registered",
        "agent_id": agent_id,
        "node_id": agent_id,
        "publisher": app.registry.local_peer_id().to_base58(),
        "seq": seq,
    });
    (status, Json(body)).into_response()
}

pub async fn register(State(app): State<AppState>, RawBody(body): RawBody) -> Result<Response, ApiError> {
    let card = AgentCard::from_json_any(&body)?;
    let agent_id = card.agent_id.clone();
    let applied = app.registry.register_local(card, Liveness::Node, now_millis()).await?;
    Ok(registered(&app, &agent_id, applied))
}

pub async fn list(State(app): State<AppState>, RawQuery(raw): RawQuery) -> Result<Response, ApiError> {
    let mut limit = LIST_LIMIT;
    let mut offset = 0;
    for (k, v) in form_urlencoded::parse(raw.unwrap_or_default().as_bytes()) {
        match k.as_ref() {
            "limit" => limit = crate::query::parse_int("limit", &v, MAX_LIST_LIMIT, &["0-1000"])?,
            "offset" => offset = crate::query::parse_int("offset", &v, usize::MAX, &["0-"])?,
            _ => {}
        }
    }
    let now = now_millis();
    let snapshot = app.registry.snapshot();
    let agents: Vec<_> =
        snapshot.entries.iter().skip(offset).take(limit).map(|e| record_view(e, &app, now)).collect();
    let body = json!({
        "agents": agents,
        "total": snapshot.entries.len(),
        "limit": limit,
        "offset": offset,
    });
    Ok(Json(body).into_response())
}

pub async fn get(
    State(app): State<AppState>,
    Path(id): Path<String>,
    RawQuery(raw): RawQuery,
) -> Result<Response, ApiError> {
    let snapshot = app.registry.snapshot();
    let entry = pick(&snapshot, &id, raw.as_deref())?;
    Ok(Json(record_view(entry, &app, now_millis())).into_response())
}

/// One record of an agent id. The same id from several publishers: `publisher=<PeerId>` in the query
/// picks one; without it this node's own comes first, then the smallest PeerId.
pub fn pick<'a>(snapshot: &'a Snapshot, id: &str, query: Option<&str>) -> Result<&'a Arc<Entry>, ApiError> {
    let publisher = form_urlencoded::parse(query.unwrap_or_default().as_bytes())
        .find(|(k, _)| k == "publisher")
        .map(|(_, v)| v.into_owned());
    let found = snapshot.by_agent_id(id);
    let entry = match &publisher {
        Some(p) => found.into_iter().find(|e| e.key.publisher.to_base58() == *p),
        // `by_agent_id` puts this node's own record first.
        None => found.first().copied(),
    };
    entry.ok_or_else(|| match publisher {
        Some(p) => ApiError::NotFound(format!("agent `{id}` from publisher `{p}`")),
        None => ApiError::NotFound(format!("agent `{id}`")),
    })
}

pub async fn remove(State(app): State<AppState>, Path(id): Path<String>) -> Result<Response, ApiError> {
    deregister(&app, &id).await
}

/// Removes a local agent; another publisher's agent cannot be removed from here.
pub async fn deregister(app: &AppState, id: &str) -> Result<Response, ApiError> {
    let snapshot = app.registry.snapshot();
    let found = snapshot.by_agent_id(id);
    if found.is_empty() {
        return Err(ApiError::NotFound(format!("agent `{id}`")));
    }
    if !found.iter().any(|e| e.is_local()) {
        return Err(ApiError::Forbidden(format!(
            "agent `{id}` is published by another node and can only be removed there"
        )));
    }
    let applied = app.registry.deregister_local(id, now_millis()).await?;
    let seq = match applied {
        Applied::Removed { seq } => seq,
        _ => return Err(ApiError::NotFound(format!("agent `{id}`"))),
    };
    tracing::info!(agent_id = id, seq, "local agent removed");
    Ok(Json(json!({"success": true, "agent_id": id, "removed": true, "seq": seq})).into_response())
}
