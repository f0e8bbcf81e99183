//! `GET /.well-known/ai-catalog.json`: an AI Catalog (specification 1.0) of every agent in the view,
//! each entry an A2A agent card as its publisher signed it, the whole catalog signed by this node.
//!
//! The catalog is rebuilt only when the view changes (its generation), and served with an `ETag` so
//! aggregators that poll it pay for a body only when something changed.

use std::sync::{Arc, Mutex};

use axum::extract::State;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};

use super::error::ApiError;
use super::AppState;
use crate::card::{a2a, AgentCard};
use crate::clock::rfc3339;
use crate::defaults::A2A_CARD_MAX_AGE;
use crate::registry::Snapshot;

/// The AI Catalog media type.
pub const MEDIA_TYPE: &str = "application/ai-catalog+json";
/// The entry type of an A2A agent card.
pub const A2A_ENTRY_TYPE: &str = "application/a2a-agent-card+json";

/// The last catalog built, by view generation.
#[derive(Default)]
pub struct CatalogCache {
    built: Mutex<Option<(u64, Arc<Built>)>>,
}

struct Built {
    body: Vec<u8>,
    etag: String,
}

pub async fn catalog(State(app): State<AppState>, headers: HeaderMap) -> Result<Response, ApiError> {
    let snapshot = app.registry.snapshot();
    let built = {
        let mut cached = app.catalog.built.lock().unwrap_or_else(|e| e.into_inner());
        match &*cached {
            Some((generation, built)) if *generation == snapshot.generation => built.clone(),
            _ => {
                let built = Arc::new(build(&app, &snapshot));
                *cached = Some((snapshot.generation, built.clone()));
                built
            }
        }
    };
    let mut response = if super::a2a::none_match(&headers, &built.etag) {
        StatusCode::NOT_MODIFIED.into_response()
    } else {
        ([(header::CONTENT_TYPE, "application/json")], built.body.clone()).into_response()
    };
    let h = response.headers_mut();
    let value = |s: String| HeaderValue::from_str(&s).map_err(|e| ApiError::internal(&e));
    h.insert(header::ETAG, value(built.etag.clone())?);
    h.insert(header::CACHE_CONTROL, value(format!("public, max-age={}", A2A_CARD_MAX_AGE.as_secs()))?);
    Ok(response)
}

fn build(app: &AppState, snapshot: &Snapshot) -> Built {
    let me = app.registry.local_peer_id().to_base58();
    let entries: Vec<Value> = snapshot.entries.iter().filter_map(|e| entry(e)).collect();
    let mut document = json!({
        "specVersion": "1.0",
        "host": {"displayName": format!("agentmesh node {me}"), "identifier": me},
        "entries": entries,
    });
    // Over the RFC 8785 form of the document without its signature, as AI Catalog verifiers compute it.
    let payload = a2a::canonical(&document);
    document["signature"] = Value::String(app.registry.sign_detached(&payload));
    let body = serde_json::to_vec(&document).unwrap_or_default();
    Built { etag: super::a2a::etag(&body), body }
}

/// One agent as a catalog entry: its A2A card (with its publisher's signature) inline. Agents with no
/// A2A card (no reasoner or skill) are left out.
fn entry(e: &crate::registry::Entry) -> Option<Value> {
    let card = AgentCard::from_json(e.card.text().as_bytes()).ok()?;
    let served = a2a::served(&card)?;
    let publisher = e.publisher_name.to_string();
    Some(json!({
        "identifier": format!("urn:agentmesh:{publisher}:{}", e.key.agent_id),
        "type": A2A_ENTRY_TYPE,
        "tags": card.tags,
        "updatedAt": rfc3339(e.updated_at),
        "publisher": {"identifier": publisher, "displayName": publisher},
        "data": served,
    }))
}
