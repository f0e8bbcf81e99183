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
    /// `ready`, `busy` or `draining`, as the agent reports.
    pub lifecycle: &'static str,
    pub last_heartbeat: Option<String>,
    pub updated_at: String,
    pub card: crate::card::CardText,
}

pub fn record_view<'a>(e: &'a Entry, app: &AppState, now: u64) -> RecordView<'a> {
    RecordView {
        agent_id: &e.key.agent_id,
        publisher: e.publisher_name.to_string(),
        seq: e.seq,
        local: e.is_local(),
        health_status: e.health(now, app.registry.thresholds()).as_str(),
        lifecycle: e.lifecycle().as_str(),
        last_heartbeat: e.last_heartbeat(now).map(rfc3339),
        updated_at: rfc3339(e.updated_at),
        card: e.card.text(),
    }
}

/// Under `duplicate_capabilities = "reject"`, refuses a card that offers a capability id (reasoner or
/// skill) another agent id of the view already offers. The check reads the view as it is: two
/// registrations racing on two nodes can both pass, and then `resolve` routes between them.
pub fn check_duplicates(app: &AppState, card: &AgentCard) -> Result<(), ApiError> {
    if app.duplicates == crate::config::DuplicatePolicy::Route {
        return Ok(());
    }
    let offered: std::collections::HashSet<&str> =
        card.reasoners.iter().chain(&card.skills).map(|c| c.id.as_str()).collect();
    let snapshot = app.registry.snapshot();
    for entry in snapshot.entries.iter().filter(|e| e.key.agent_id != card.agent_id) {
        let held = &entry.card;
        if let Some(cap) = held.reasoners().chain(held.skills()).find(|c| offered.contains(c.id)) {
            return Err(ApiError::DuplicateCapability {
                capability: cap.id.to_owned(),
                agent_id: entry.key.agent_id.clone(),
            });
        }
    }
    Ok(())
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
    check_duplicates(&app, &card)?;
    let agent_id = card.agent_id.clone();
    let applied = app.registry.register_local(card, Liveness::Node, now_millis()).await?;
    Ok(registered(&app, &agent_id, applied))
}

/// `GET /api/v1/agents`: every record, by agent id (`limit`, `offset`); or, for aggregators that poll,
/// the records this node accepted since a time (`updated_since`) or since the last page (`cursor`), in
/// the order it accepted them, with a `next_cursor` to continue from.
pub async fn list(State(app): State<AppState>, RawQuery(raw): RawQuery) -> Result<Response, ApiError> {
    let mut limit = LIST_LIMIT;
    let mut offset = 0;
    let mut after: Option<Position> = None;
    for (k, v) in form_urlencoded::parse(raw.unwrap_or_default().as_bytes()) {
        match k.as_ref() {
            "limit" => limit = crate::query::parse_int("limit", &v, MAX_LIST_LIMIT, &["0-1000"])?,
            "offset" => offset = crate::query::parse_int("offset", &v, usize::MAX, &["0-"])?,
            "updated_since" if after.is_none() => after = Some(Position::since(&v)?),
            "cursor" => after = Some(Position::cursor(&v)?),
            _ => {}
        }
    }
    let now = now_millis();
    let snapshot = app.registry.snapshot();
    let Some(after) = after else {
        let agents: Vec<_> =
            snapshot.entries.iter().skip(offset).take(limit).map(|e| record_view(e, &app, now)).collect();
        let body = json!({
            "agents": agents,
            "total": snapshot.entries.len(),
            "limit": limit,
            "offset": offset,
        });
        return Ok(Json(body).into_response());
    };
    let mut changed: Vec<&Arc<Entry>> = snapshot.entries.iter().filter(|e| after.before(e)).collect();
    changed.sort_unstable_by(|a, b| Position::of(a).cmp(&Position::of(b)));
    let total = changed.len();
    let page: Vec<&Arc<Entry>> = changed.into_iter().take(limit).collect();
    let next_cursor = page.last().map(|e| Position::of(e).to_cursor());
    let agents: Vec<_> = page.iter().map(|e| record_view(e, &app, now)).collect();
    let body = json!({
        "agents": agents,
        "total": total,
        "limit": limit,
        "has_more": total > agents.len(),
        // Where the next poll starts: after the last record returned, or where this one started.
        "next_cursor": next_cursor.unwrap_or_else(|| after.to_cursor()),
    });
    Ok(Json(body).into_response())
}

/// A place in the order records were accepted in: (accepted at, publisher, agent id).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct Position {
    at: u64,
    publisher: String,
    agent_id: String,
}

const SINCE_ALLOWED: &[&str] = &["an RFC 3339 time", "milliseconds since the epoch"];
const CURSOR_ALLOWED: &[&str] = &["a next_cursor from an earlier answer"];

/// Separates a cursor's parts: not in RFC 3339 times, base58 PeerIds or agent ids.
const CURSOR_SEP: char = '~';

impl Position {
    fn of(e: &Entry) -> Self {
        Self { at: e.updated_at, publisher: e.publisher_name.to_string(), agent_id: e.key.agent_id.clone() }
    }

    /// Just before everything accepted after `since`: an RFC 3339 time, or milliseconds since the epoch.
    fn since(v: &str) -> Result<Self, ApiError> {
        let at = match v.parse::<u64>() {
            Ok(ms) => ms,
            Err(_) => humantime::parse_rfc3339_weak(v)
                .ok()
                .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
                .map(|d| d.as_millis() as u64)
                .ok_or_else(|| bad_param("updated_since", v, SINCE_ALLOWED))?,
        };
        // Everything accepted after `at` ms: past the last position at that millisecond.
        Ok(Self { at, publisher: char::MAX.to_string(), agent_id: String::new() })
    }

    fn cursor(v: &str) -> Result<Self, ApiError> {
        let mut parts = v.splitn(3, CURSOR_SEP);
        let (Some(at), Some(publisher), Some(agent_id)) = (parts.next(), parts.next(), parts.next()) else {
            return Err(bad_param("cursor", v, CURSOR_ALLOWED));
        };
        let at = at.parse().map_err(|_| bad_param("cursor", v, CURSOR_ALLOWED))?;
        Ok(Self { at, publisher: publisher.to_owned(), agent_id: agent_id.to_owned() })
    }

    fn to_cursor(&self) -> String {
        format!("{}{CURSOR_SEP}{}{CURSOR_SEP}{}", self.at, self.publisher, self.agent_id)
    }

    /// Whether `e` comes after this position.
    fn before(&self, e: &Entry) -> bool {
        Position::of(e) > *self
    }
}

fn bad_param(parameter: &'static str, provided: &str, allowed: &'static [&'static str]) -> ApiError {
    ApiError::from(crate::query::ParamError { parameter, provided: provided.to_owned(), allowed })
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
