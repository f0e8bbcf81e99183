//! A2A 1.0 agent cards: `GET /.well-known/agent-card.json` (this node's agent; also at
//! `/.well-known/agent.json`, the path of A2A before 0.3, for older clients) and
//! `GET /api/v1/agents/{id}/agent-card.json` (any agent in the view), each with the publisher's own
//! signature, an `ETag` and `Cache-Control: max-age`.

use std::sync::Arc;

use axum::extract::{Path, RawQuery, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use sha2::Digest as _;

use super::error::ApiError;
use super::AppState;
use crate::card::{a2a, AgentCard};
use crate::defaults::A2A_CARD_MAX_AGE;
use crate::registry::Entry;

/// This node's agent. With several local agents: the configured `well_known_agent`, else the one with
/// the smallest agent id (the view is sorted by id), so the choice is stable across restarts.
pub async fn well_known(State(app): State<AppState>, headers: HeaderMap) -> Result<Response, ApiError> {
    let snapshot = app.registry.snapshot();
    let mut local = snapshot.entries.iter().filter(|e| e.is_local());
    let entry = match app.well_known_agent.as_deref() {
        Some(id) => local.find(|e| e.key.agent_id == id),
        None => local.next(),
    }
    .ok_or_else(|| ApiError::NotFound("local agent".into()))?;
    card_response(entry, &headers)
}

/// Any agent in the view. The same agent id from several publishers: `?publisher=<PeerId>` picks one;
/// without it this node's own comes first, then the smallest PeerId.
pub async fn agent_card(
    State(app): State<AppState>,
    Path(id): Path<String>,
    RawQuery(raw): RawQuery,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let snapshot = app.registry.snapshot();
    let entry = super::agents::pick(&snapshot, &id, raw.as_deref())?;
    card_response(entry, &headers)
}

fn card_response(entry: &Arc<Entry>, headers: &HeaderMap) -> Result<Response, ApiError> {
    let card = AgentCard::from_json(entry.card.text().as_bytes()).map_err(|e| ApiError::internal(&e))?;
    let served = a2a::served(&card).ok_or_else(|| {
        ApiError::NotFound(format!(
            "A2A card of agent `{}` (it has no reasoner or skill, and an A2A card needs one)",
            entry.key.agent_id
        ))
    })?;
    let body = serde_json::to_vec(&served).map_err(|e| ApiError::internal(&e))?;
    let etag = etag(&body);
    let mut response = if none_match(headers, &etag) {
        StatusCode::NOT_MODIFIED.into_response()
    } else {
        ([(header::CONTENT_TYPE, "application/json")], body).into_response()
    };
    let h = response.headers_mut();
    let value = |s: String| HeaderValue::from_str(&s).map_err(|e| ApiError::internal(&e));
    h.insert(header::ETAG, value(etag)?);
    h.insert(header::CACHE_CONTROL, value(format!("public, max-age={}", A2A_CARD_MAX_AGE.as_secs()))?);
    h.insert("x-agentmesh-publisher", value(entry.publisher_name.to_string())?);
    h.insert("x-agentmesh-seq", value(entry.seq.to_string())?);
    Ok(response)
}

/// A strong entity tag for a body: the first 16 bytes of its SHA-256, in hex.
pub(super) fn etag(body: &[u8]) -> String {
    let hash = sha2::Sha256::digest(body);
    format!("\"{}\"", hash[..16].iter().map(|b| format!("{b:02x}")).collect::<String>())
}

/// Does `If-None-Match` name this entity tag (weak comparison, RFC 9110 13.1.2)?
pub(super) fn none_match(headers: &HeaderMap, etag: &str) -> bool {
    headers.get_all(header::IF_NONE_MATCH).iter().filter_map(|v| v.to_str().ok()).any(|list| {
        list.split(',').map(str::trim).any(|tag| tag == "*" || tag.trim_start_matches("W/") == etag)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn if_none_match_takes_lists_weak_tags_and_star() {
        let etag = "\"abc\"";
        let with = |v: &str| {
            let mut h = HeaderMap::new();
            h.insert(header::IF_NONE_MATCH, v.parse().unwrap());
            none_match(&h, etag)
        };
        assert!(with("\"abc\""));
        assert!(with("\"x\", W/\"abc\""));
        assert!(with("*"));
        assert!(!with("\"abcd\""));
        assert!(!none_match(&HeaderMap::new(), etag));
    }
}
