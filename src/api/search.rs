//! Capability search for LLM agents: `GET /api/v1/discovery/search` (ranked results),
//! `GET /api/v1/discovery/context` (token-budgeted tiers for a prompt) and
//! `GET /api/v1/discovery/tool` (the `discover_capabilities` tool definition for an LLM API).

use std::time::Instant;

use axum::extract::{RawQuery, State};
use axum::http::header::CONTENT_TYPE;
use axum::http::HeaderValue;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Value};

use super::error::ApiError;
use super::AppState;
use crate::clock::now_millis;
use crate::query::{first_params, parse_bool, parse_int, ParamError, Query};
use crate::registry::Snapshot;
use crate::search::context::{self, Budgets, Counter};
use crate::search::{Answer, Kind, Request, DEFAULT_LIMIT, MAX_QUERY_CHARS, MAX_RESULTS};

/// The discovery filters a search accepts, passed to the discovery query parser as they came.
/// Besides these, every `metadata.KEY` parameter.
const FILTERS: &[&str] = &[
    "agent",
    "agent_ids",
    "node_id",
    "node_ids",
    "reasoner",
    "skill",
    "tags",
    "health_status",
    "version",
    "lifecycle",
    "input_mode",
    "output_mode",
];
const KIND_ALLOWED: &[&str] = &["reasoner", "skill", "any"];
const LIMIT_ALLOWED: &[&str] = &["1-50"];
const RELEVANCE_ALLOWED: &[&str] = &["0.0-1.0"];
const FORMAT_ALLOWED: &[&str] = &["text", "json"];
const FLAVOR_ALLOWED: &[&str] = &["openai", "anthropic", "mcp"];
const TOKENIZER_ALLOWED: &[&str] = &["chars4", "cl100k_base", "o200k_base"];
const TOKENS_ALLOWED: &[&str] = &["0-32000"];
const TOP_K_ALLOWED: &[&str] = &["0-50"];

/// The tool's description: what an LLM reads to decide to call it (about 80 tokens).
pub const TOOL_DESCRIPTION: &str = "Search the agent mesh for capabilities (reasoners and skills offered by \
other agents) by describing what you need in plain words. Use it when none of your own tools fits the task. \
Returns the best matches, each with a relevance from 0 to 1, a one-line summary and the target \
(agent_id:kind:id) to call; ask for a target's detail to get its exact input schema.";

/// The query parameters, first occurrence wins.
struct Params(Vec<(String, String)>);

fn is_filter(name: &str) -> bool {
    FILTERS.contains(&name) || name.starts_with(crate::query::METADATA_PREFIX)
}

impl Params {
    fn parse(raw: &str) -> Self {
        Self(first_params(raw))
    }

    fn get(&self, name: &str) -> Option<&str> {
        self.0.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str())
    }

    /// The discovery filters among the parameters, parsed as discovery parses them.
    fn filters(&self) -> Result<Query, ParamError> {
        let filters: Vec<(String, String)> = self.0.iter().filter(|(k, _)| is_filter(k)).cloned().collect();
        Query::from_params(&filters)
    }

    fn int(
        &self,
        name: &'static str,
        default: usize,
        min: usize,
        max: usize,
        allowed: &'static [&'static str],
    ) -> Result<usize, ParamError> {
        let Some(v) = self.get(name) else { return Ok(default) };
        let n = parse_int(name, v, max, allowed)?;
        if n < min {
            return Err(ParamError { parameter: name, provided: v.to_owned(), allowed });
        }
        Ok(n)
    }

    fn request(&self) -> Result<Request, ParamError> {
        let q = self.get("q").map(str::trim).unwrap_or_default();
        let chars = q.chars().count();
        if q.is_empty() || chars > MAX_QUERY_CHARS {
            return Err(ParamError {
                parameter: "q",
                provided: if q.is_empty() { String::new() } else { format!("{chars} characters") },
                allowed: &["1-1024 characters"],
            });
        }
        let mut req = Request::new(q);
        req.limit = self.int("limit", DEFAULT_LIMIT, 1, MAX_RESULTS, LIMIT_ALLOWED)?;
        if let Some(v) = self.get("min_relevance") {
            let bad = || ParamError {
                parameter: "min_relevance",
                provided: v.to_owned(),
                allowed: RELEVANCE_ALLOWED,
            };
            // Plain decimals only: no sign, exponent, `inf` or `NaN`.
            let plain = !v.is_empty() && v.len() <= 16 && v.bytes().all(|b| b.is_ascii_digit() || b == b'.');
            let x: f32 = if plain { v.parse().map_err(|_| bad())? } else { return Err(bad()) };
            if !(0.0..=1.0).contains(&x) {
                return Err(bad());
            }
            req.min_relevance = x;
        }
        if let Some(v) = self.get("kind") {
            req.kind = Kind::parse(v).ok_or_else(|| ParamError {
                parameter: "kind",
                provided: v.to_owned(),
                allowed: KIND_ALLOWED,
            })?;
        }
        req.graph = parse_bool("graph", self.get("graph"), true)?;
        req.related = parse_bool("related", self.get("related"), true)?;
        req.filters = self.filters()?;
        Ok(req)
    }
}

/// Runs `req` over `snapshot`, one at a time with discovery's cache misses (`discovery_permits`).
pub(super) async fn run(app: &AppState, snapshot: &Snapshot, req: &Request) -> Result<Answer, ApiError> {
    let _permit = app.discovery_permits.acquire().await.map_err(|e| ApiError::internal(&e))?;
    let now = now_millis();
    Ok(super::discovery::off_the_worker(|| app.search.search(snapshot, req, now, app.registry.thresholds())))
}

/// `GET /api/v1/discovery/search`.
pub async fn search(State(app): State<AppState>, RawQuery(raw): RawQuery) -> Result<Response, ApiError> {
    let started = Instant::now();
    let req = Params::parse(raw.as_deref().unwrap_or_default()).request()?;
    let answer = run(&app, &app.registry.snapshot(), &req).await?;
    let results: Vec<Value> = answer
        .results
        .iter()
        .enumerate()
        .map(|(i, f)| {
            let card_text = f.entry.card.text();
            let card = card_text.view();
            let list = if f.reasoner { &card.reasoners } else { &card.skills };
            let cap = list.get(f.cap);
            json!({
                "rank": i + 1,
                // Rounded in f64: an f32 widened as it is would print as 0.5509999990463257.
                "relevance": (f64::from(f.relevance) * 1000.0).round() / 1000.0,
                "agent_id": f.entry.key.agent_id,
                "kind": f.kind(),
                "id": f.id,
                "target": f.target,
                "description": cap.and_then(|c| c.description.as_deref()),
                "tags": cap.map(|c| c.tags.iter().map(|t| t.to_string()).collect::<Vec<_>>()).unwrap_or_default(),
                "category": cap.and_then(|c| c.category_in(&card)),
                "health_status": f.health.as_str(),
                "publisher": &*f.entry.publisher_name,
                "matched": f.matched,
            })
        })
        .collect();
    tracing::info!(
        target: "agentmesh::search",
        results = results.len(),
        indexed = answer.total_indexed,
        took_us = started.elapsed().as_micros() as u64,
        "search request completed"
    );
    Ok(Json(json!({
        "query": req.q,
        "ranking": answer.ranking,
        "total_indexed": answer.total_indexed,
        "results": results,
    }))
    .into_response())
}

/// `GET /api/v1/discovery/context`.
pub async fn context(State(app): State<AppState>, RawQuery(raw): RawQuery) -> Result<Response, ApiError> {
    let params = Params::parse(raw.as_deref().unwrap_or_default());
    let mut req = params.request()?;
    let tokens = |name, default| params.int(name, default, 0, context::MAX_TIER_TOKENS, TOKENS_ALLOWED);
    let top_k = |name, default| params.int(name, default, 0, context::MAX_TOP_K, TOP_K_ALLOWED);
    let budgets = Budgets {
        tier0: tokens("tier0_tokens", context::TIER0_TOKENS)?,
        tier1: tokens("tier1_tokens", context::TIER1_TOKENS)?,
        tier1_top_k: top_k("tier1_top_k", context::TIER1_TOP_K)?,
        tier2: tokens("tier2_tokens", context::TIER2_TOKENS)?,
        tier2_top_k: top_k("tier2_top_k", context::TIER2_TOP_K)?,
    };
    let format = params.get("format").unwrap_or_default();
    let text = match format.to_ascii_lowercase().as_str() {
        "" | "text" => true,
        "json" => false,
        _ => {
            let error =
                ParamError { parameter: "format", provided: format.to_owned(), allowed: FORMAT_ALLOWED };
            return Err(error.into());
        }
    };
    req.limit = budgets.tier1_top_k.max(budgets.tier2_top_k).max(1);
    // One snapshot for the search and Tier 0, so that both describe the same view.
    let snapshot = app.registry.snapshot();
    let answer = run(&app, &snapshot, &req).await?;
    let counter = match params.get("tokenizer") {
        None => app.tokenizer,
        Some(name) => Counter::parse(name).ok_or_else(|| ParamError {
            parameter: "tokenizer",
            provided: name.to_owned(),
            allowed: TOKENIZER_ALLOWED,
        })?,
    };
    let tiers = app.search.context(&snapshot, &answer.results, &budgets, counter, text);
    if text {
        let mut response = tiers.text().into_response();
        response.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static("text/plain; charset=utf-8"));
        return Ok(response);
    }
    Ok(Json(json!({
        "query": req.q,
        "tokenizer": counter.name(),
        "tier0": tiers.tier0,
        "tier1": tiers.tier1,
        "tier2": tiers.tier2,
        "total_tokens": tiers.total_tokens(),
    }))
    .into_response())
}

/// The JSON Schema of the tool's arguments.
pub fn tool_schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "query": {"type": "string", "description": "What the capability should do, in plain words.",
                      "minLength": 1, "maxLength": MAX_QUERY_CHARS},
            "kind": {"type": "string", "enum": ["reasoner", "skill", "any"],
                     "description": "Only reasoners, only skills, or both (default)."},
            "tags": {"type": "array", "items": {"type": "string"},
                     "description": "Only capabilities with one of these tags (wildcards allowed)."},
            "limit": {"type": "integer", "minimum": 1, "maximum": MAX_RESULTS,
                      "description": "Most results (default 5)."}
        },
        "required": ["query"],
        "additionalProperties": false
    })
}

/// `GET /api/v1/discovery/tool?flavor=openai|anthropic|mcp`.
pub async fn tool(RawQuery(raw): RawQuery) -> Result<Response, ApiError> {
    let params = Params::parse(raw.as_deref().unwrap_or_default());
    let flavor = params.get("flavor").unwrap_or("openai").to_ascii_lowercase();
    let name = "discover_capabilities";
    let body = match flavor.as_str() {
        "openai" => json!({"type": "function", "function": {
            "name": name, "description": TOOL_DESCRIPTION, "parameters": tool_schema()}}),
        "anthropic" => json!({"name": name, "description": TOOL_DESCRIPTION, "input_schema": tool_schema()}),
        "mcp" => json!({"name": name, "description": TOOL_DESCRIPTION, "inputSchema": tool_schema()}),
        _ => {
            return Err(ParamError { parameter: "flavor", provided: flavor, allowed: FLAVOR_ALLOWED }.into());
        }
    };
    Ok(Json(body).into_response())
}
