//! `GET /api/v1/discovery/capabilities` and its response cache.
//!
//! A miss is computed at most `DISCOVERY_CONCURRENCY` at a time (the costly ones inside
//! `block_in_place`, so the runtime keeps serving heartbeats and cache hits meanwhile), and a burst of
//! identical misses is computed once.
//!
//! The cache never serves a result that misses a change: an entry is tagged with the snapshot
//! generation (bumped by every registration and removal) and the registry's health epoch (bumped when a
//! heartbeat changes some agent's health), and it expires at the first instant at which any agent the
//! query looked at would change health by itself. Both tags are read before the result is computed, so
//! a change that races with the computation makes the entry stale at once rather than wrong.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Instant;

use axum::body::Bytes;
use axum::extract::{RawQuery, State};
use axum::http::header::{CACHE_CONTROL, CONTENT_TYPE};
use axum::http::HeaderValue;
use axum::response::{IntoResponse, Response};

use super::error::ApiError;
use super::AppState;
use super::{metrics, render};
use crate::clock::now_millis;
use crate::defaults::{CACHE_ENTRIES, CACHE_MAX_AGE, CACHE_MAX_BYTES, CACHE_MAX_KEY_BYTES};
use crate::query::{select, Format, Query};
use crate::registry::health::Millis;

const X_CACHE: &str = "x-cache";

#[derive(Clone)]
struct Cached {
    body: Bytes,
    format: Format,
    expires: Millis,
    /// Agents that matched, and agents on the page: for the request log.
    total_agents: usize,
    returned: usize,
}

#[derive(Default)]
struct CacheState {
    /// (snapshot generation, health epoch) every entry below belongs to.
    tag: (u64, u64),
    entries: HashMap<String, Cached>,
    /// Sum of the cached bodies' lengths.
    bytes: usize,
}

/// Rendered discovery responses keyed by the canonical query.
#[derive(Default)]
pub struct ResponseCache {
    state: Mutex<CacheState>,
}

impl ResponseCache {
    /// Bytes of rendered answers held.
    pub fn bytes(&self) -> usize {
        self.state.lock().unwrap_or_else(|p| p.into_inner()).bytes
    }

    fn get(&self, key: &str, tag: (u64, u64), now: Millis) -> Option<Cached> {
        let state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if state.tag != tag {
            return None;
        }
        state.entries.get(key).filter(|c| now < c.expires).cloned()
    }

    fn put(&self, key: String, tag: (u64, u64), value: Cached, now: Millis) {
        let size = value.body.len();
        if key.len() > CACHE_MAX_KEY_BYTES || size > CACHE_MAX_BYTES / 8 {
            return;
        }
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if state.tag != tag {
            // Only a newer view replaces the tag; a slow request computed on an older one is dropped.
            if tag < state.tag {
                return;
            }
            state.tag = tag;
            state.entries.clear();
            state.bytes = 0;
        }
        if state.entries.len() >= CACHE_ENTRIES || state.bytes + size > CACHE_MAX_BYTES {
            state.entries.retain(|_, c| c.expires > now);
            if state.entries.len() >= CACHE_ENTRIES || state.bytes + size > CACHE_MAX_BYTES {
                state.entries.clear();
            }
            state.bytes = state.entries.values().map(|c| c.body.len()).sum();
        }
        if let Some(old) = state.entries.insert(key, value) {
            state.bytes -= old.body.len();
        }
        state.bytes += size;
    }
}

/// Answers a discovery request, counts it in the metrics and logs "discovery request completed" with
/// its filters, result counts, duration and whether the cache answered.
pub async fn capabilities(State(app): State<AppState>, RawQuery(raw): RawQuery) -> Response {
    let started = Instant::now();
    let query = match Query::parse(raw.as_deref().unwrap_or_default()) {
        Ok(query) => query,
        Err(error) => {
            app.metrics.record(None, 400, started.elapsed(), None);
            tracing::info!(target: "agentmesh::discovery", status = 400, %error, "discovery request refused");
            return ApiError::from(error).into_response();
        }
    };
    let (response, cached) = match answer(&app, &query).await {
        Ok((cached, hit)) => (respond(cached.clone(), if hit { "hit" } else { "miss" }), Some((cached, hit))),
        Err(error) => (error.into_response(), None),
    };
    let took = started.elapsed();
    let status = response.status().as_u16();
    app.metrics.record(Some(&query), status, took, cached.as_ref().map(|(_, hit)| *hit));
    let (total_agents, returned) = cached.as_ref().map_or((0, 0), |(c, _)| (c.total_agents, c.returned));
    tracing::info!(
        target: "agentmesh::discovery",
        format = metrics::format_name(query.format),
        status,
        filters = ?metrics::filter_names(&query),
        total_agents,
        returned,
        duration_ms = took.as_secs_f64() * 1000.0,
        cache_hit = cached.as_ref().is_some_and(|(_, hit)| *hit),
        "discovery request completed"
    );
    response
}

/// The rendered answer, and whether it came from the cache.
async fn answer(app: &AppState, query: &Query) -> Result<(Cached, bool), ApiError> {
    let key = query.cache_key();
    let now = now_millis();
    let snapshot = app.registry.snapshot();
    let tag = (snapshot.generation, app.registry.health_epoch());
    if let Some(hit) = app.cache.get(&key, tag, now) {
        return Ok((hit, true));
    }
    let _permit = app.discovery_permits.acquire().await.map_err(|e| ApiError::internal(&e))?;
    // Requests for the same page that arrive together (a cache entry just expired under load) queue
    // here; all but the first find the answer the first one cached.
    if let Some(hit) = app.cache.get(&key, tag, now) {
        return Ok((hit, true));
    }
    let compute = || {
        // The filter index answers; an id allow-list, or an index another request is bringing up to
        // date right now, is answered by the scan (the same answer).
        let index = if query.ids.is_empty() { app.filters.index(&snapshot) } else { None };
        let thresholds = app.registry.thresholds();
        let sel = match &index {
            Some(index) => crate::query::index::select(index, query, now, thresholds),
            None => select(&snapshot.entries, query, now, thresholds),
        };
        let body = match query.format {
            Format::Json => render::json::render_prepared(&sel, query, now, &app.prepared),
            Format::Compact => render::compact::render_prepared(&sel, now, &app.prepared),
            Format::Xml => render::xml::render_prepared(&sel, query, now, &app.prepared),
        };
        (body, sel.valid_until, sel.total_agents, sel.page.len())
    };
    // A JSON or compact page from an up-to-date filter index and the prepared records is a fraction
    // of a millisecond: handing the worker's other tasks to another thread would cost more than it.
    // XML (whose records, when first prepared, expand every schema), the filters that read cards or
    // the whole view, and bringing the index up to date can take milliseconds: let the runtime move
    // other tasks off this worker meanwhile.
    let index_current = app.filters.current().is_some_and(|i| i.generation() == snapshot.generation);
    let light = matches!(query.format, Format::Json | Format::Compact)
        && !query.needs_card()
        && query.version.is_none()
        && (index_current || !query.ids.is_empty());
    let (body, valid_until, total_agents, returned) = if light { compute() } else { off_the_worker(compute) };
    let max_age = now + CACHE_MAX_AGE.as_millis() as u64;
    let expires = valid_until.map_or(max_age, |t| t.min(max_age));
    let cached = Cached { body: Bytes::from(body), format: query.format, expires, total_agents, returned };
    app.cache.put(key, tag, cached.clone(), now);
    Ok((cached, false))
}

/// Runs CPU-bound work without starving the multi-threaded runtime (`block_in_place`); inline on a
/// current-thread runtime, where there is no other worker to hand tasks to.
pub(crate) fn off_the_worker<T>(work: impl FnOnce() -> T) -> T {
    match tokio::runtime::Handle::current().runtime_flavor() {
        tokio::runtime::RuntimeFlavor::MultiThread => tokio::task::block_in_place(work),
        _ => work(),
    }
}

fn respond(cached: Cached, cache: &'static str) -> Response {
    let content_type = match cached.format {
        Format::Xml => "application/xml",
        Format::Json | Format::Compact => "application/json",
    };
    let mut response = cached.body.into_response();
    let headers = response.headers_mut();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    headers.insert(CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    headers.insert(X_CACHE, HeaderValue::from_static(cache));
    response
}
