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

use std::collections::hash_map::Entry;
use std::collections::{HashMap, VecDeque};
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
    /// The memory the body holds: its buffer's capacity, which the cache counts (a body in a buffer
    /// from the pool may have up to a quarter more room than it fills).
    held: usize,
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
    /// Each entry with the number of its insertion.
    entries: HashMap<String, (u64, Cached)>,
    /// Keys in insertion order, each with the number it was inserted under: an entry inserted again
    /// since is no longer that number, and its older place is skipped.
    order: VecDeque<(u64, String)>,
    inserted: u64,
    /// Sum of the cached bodies' buffers ([`Cached::held`]).
    bytes: usize,
}

impl CacheState {
    fn clear(&mut self) {
        self.entries.clear();
        self.order.clear();
        self.bytes = 0;
    }

    /// Drops the oldest entry; false when there is none.
    fn evict_oldest(&mut self) -> bool {
        while let Some((n, key)) = self.order.pop_front() {
            if let Entry::Occupied(entry) = self.entries.entry(key) {
                if entry.get().0 == n {
                    self.bytes -= entry.remove().1.held;
                    return true;
                }
            }
        }
        false
    }

    /// Forgets the places of entries inserted again since, once they outnumber the entries.
    fn compact_order(&mut self) {
        if self.order.len() > 2 * self.entries.len() + 16 {
            let entries = &self.entries;
            self.order.retain(|(n, key)| entries.get(key).is_some_and(|(at, _)| at == n));
        }
    }
}

/// Rendered discovery responses keyed by the canonical query.
#[derive(Default)]
pub struct ResponseCache {
    state: Mutex<CacheState>,
}

impl ResponseCache {
    /// Bytes of rendered answers held (their buffers' capacities).
    pub fn bytes(&self) -> usize {
        self.state.lock().unwrap_or_else(|p| p.into_inner()).bytes
    }

    fn get(&self, key: &str, tag: (u64, u64), now: Millis) -> Option<Cached> {
        let state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if state.tag != tag {
            return None;
        }
        state.entries.get(key).map(|(_, c)| c).filter(|c| now < c.expires).cloned()
    }

    fn put(&self, key: String, tag: (u64, u64), value: Cached) {
        let size = value.held;
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
            state.clear();
        }
        if let Some((_, old)) = state.entries.remove(&key) {
            state.bytes -= old.held;
        }
        // The oldest go first, one at a time: under a load of queries new to the cache each answer
        // frees one older answer, so their buffers go back to the pool as steadily as they are taken.
        while state.entries.len() >= CACHE_ENTRIES || state.bytes + size > CACHE_MAX_BYTES {
            if !state.evict_oldest() {
                break;
            }
        }
        state.inserted += 1;
        let n = state.inserted;
        state.order.push_back((n, key.clone()));
        state.entries.insert(key, (n, value));
        state.bytes += size;
        state.compact_order();
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
    let held = body.capacity();
    let body = render::buffers::share(body);
    let cached = Cached { body, held, format: query.format, expires, total_agents, returned };
    app.cache.put(key, tag, cached.clone());
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

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(bytes: usize) -> Cached {
        Cached {
            body: Bytes::from(vec![b' '; bytes]),
            held: bytes,
            format: Format::Json,
            expires: 1_000,
            total_agents: 0,
            returned: 0,
        }
    }

    fn keys(cache: &ResponseCache) -> Vec<String> {
        let state = cache.state.lock().unwrap();
        let mut keys: Vec<String> = state.entries.keys().cloned().collect();
        keys.sort();
        keys
    }

    /// A full cache makes room by dropping its oldest answers, one at a time, not every answer at once.
    #[test]
    fn a_full_cache_drops_its_oldest_answers_first() {
        let cache = ResponseCache::default();
        let size = CACHE_MAX_BYTES / 8;
        for n in 0..8 {
            cache.put(format!("q{n}"), (1, 0), answer(size));
        }
        assert_eq!(cache.bytes(), CACHE_MAX_BYTES);
        cache.put("q8".into(), (1, 0), answer(size));
        assert_eq!(keys(&cache), ["q1", "q2", "q3", "q4", "q5", "q6", "q7", "q8"]);
        assert!(cache.get("q8", (1, 0), 0).is_some());
        // Answered again, an answer counts as new: after q1, q3 is the oldest.
        cache.put("q2".into(), (1, 0), answer(size));
        cache.put("q9".into(), (1, 0), answer(size));
        cache.put("q10".into(), (1, 0), answer(size));
        assert_eq!(keys(&cache), ["q10", "q2", "q4", "q5", "q6", "q7", "q8", "q9"]);
        assert_eq!(cache.bytes(), CACHE_MAX_BYTES);
    }

    #[test]
    fn answers_of_an_older_view_are_dropped_and_never_replace_newer_ones() {
        let cache = ResponseCache::default();
        cache.put("q".into(), (2, 0), answer(10));
        assert!(cache.get("q", (2, 1), 0).is_none(), "the health epoch moved");
        cache.put("old".into(), (1, 5), answer(10));
        assert_eq!(keys(&cache), ["q"]);
        cache.put("new".into(), (3, 0), answer(10));
        assert_eq!((keys(&cache), cache.bytes()), (vec!["new".to_string()], 10));
    }

    /// A body counts by the memory its buffer holds, not by the bytes it fills.
    #[test]
    fn a_body_counts_by_its_buffer() {
        let cache = ResponseCache::default();
        let mut roomy = answer(1000);
        roomy.held = 1250;
        cache.put("q".into(), (1, 0), roomy);
        assert_eq!(cache.bytes(), 1250);
        cache.put("q".into(), (1, 0), answer(1000));
        assert_eq!(cache.bytes(), 1000, "the answer it replaced no longer counts");
    }

    /// The same query answered again and again keeps one entry, and the insertion order does not grow
    /// with the answers.
    #[test]
    fn the_order_of_answers_stays_bounded_by_the_entries() {
        let cache = ResponseCache::default();
        for _ in 0..10_000 {
            cache.put("same".into(), (1, 0), answer(100));
        }
        let state = cache.state.lock().unwrap();
        assert_eq!((state.entries.len(), state.bytes), (1, 100));
        assert!(state.order.len() <= 2 * state.entries.len() + 17, "{}", state.order.len());
    }
}
