//! The MCP server: `POST /mcp` speaks the Model Context Protocol (JSON-RPC 2.0, the streamable HTTP
//! transport of revision 2025-11-25, stateless) with two tools over the node's view:
//! `discover_capabilities` (a search, answered with Tier 1 lines and their targets) and
//! `get_capability` (a target's Tier 2 detail with its exact input schema).
//!
//! `agentmesh mcp` ([`crate::client::mcp_stdio`]) carries the same messages over stdio to this route,
//! so both transports answer from one implementation.
//!
//! The server keeps no session: it issues no `Mcp-Session-Id`, so clients open no GET stream, and
//! every request is answered on its own POST with `application/json`. Notifications and responses
//! are accepted with `202 Accepted`.

use axum::extract::State;
use axum::http::header::{CONTENT_TYPE, ORIGIN};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Map, Value};

use super::body::RawBody;
use super::search::{run, tool_schema, TOOL_DESCRIPTION};
use super::AppState;
use crate::card::held::CardRef;
use crate::clock::now_millis;
use crate::defaults::MAX_TARGET_LEN;
use crate::query::Query;
use crate::search::{context, Found, Kind, Request, MAX_QUERY_CHARS, MAX_RESULTS};

/// The revision this server prefers, and offers to a client that asks for one it does not know.
pub const LATEST_VERSION: &str = "2025-11-25";
/// Every revision the server answers with the `initialize` handshake (all serve the same tools).
pub const VERSIONS: &[&str] = &["2025-11-25", "2025-06-18", "2025-03-26", "2024-11-05"];
/// The header that carries the negotiated revision on every request after `initialize`.
pub const VERSION_HEADER: &str = "mcp-protocol-version";
/// Most tags one `discover_capabilities` call may filter on.
pub const MAX_TOOL_TAGS: usize = 32;

/// JSON-RPC error codes.
pub const PARSE_ERROR: i64 = -32700;
pub const INVALID_REQUEST: i64 = -32600;
pub const METHOD_NOT_FOUND: i64 = -32601;
pub const INVALID_PARAMS: i64 = -32602;
pub const INTERNAL_ERROR: i64 = -32603;

const DISCOVER: &str = "discover_capabilities";
const GET: &str = "get_capability";

/// What the server tells a client about itself at `initialize`.
const INSTRUCTIONS: &str = "This server searches an agent mesh for capabilities (reasoners and skills \
of other agents). Call discover_capabilities with what you need in plain words; call get_capability \
with a result's target for its exact input schema and where to call it.";

/// One JSON-RPC message from a client.
#[derive(Debug, PartialEq)]
enum Message {
    Request {
        id: Value,
        method: String,
        params: Value,
    },
    /// A notification, or a response to a request the server never sends: nothing to answer.
    NoAnswer,
}

/// A JSON-RPC error answer.
fn error(id: Value, code: i64, message: impl Into<String>) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "error": {"code": code, "message": message.into()}})
}

fn result(id: Value, result: Value) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "result": result})
}

/// Sorts a parsed message; a malformed one is the error answer to send back.
fn classify(message: Value) -> Result<Message, Value> {
    let Value::Object(mut object) = message else {
        let what = if message.is_array() { "batches are not supported" } else { "not a JSON object" };
        return Err(error(Value::Null, INVALID_REQUEST, format!("invalid request: {what}")));
    };
    let id = object.remove("id");
    if object.get("jsonrpc").and_then(Value::as_str) != Some("2.0") {
        let id = id.filter(valid_id).unwrap_or(Value::Null);
        return Err(error(id, INVALID_REQUEST, "invalid request: \"jsonrpc\" must be \"2.0\""));
    }
    match (object.remove("method"), id) {
        (Some(Value::String(method)), Some(id)) if valid_id(&id) => {
            let params = object.remove("params").unwrap_or(Value::Null);
            if !(params.is_null() || params.is_object()) {
                return Err(error(id, INVALID_PARAMS, "invalid params: \"params\" must be an object"));
            }
            Ok(Message::Request { id, method, params })
        }
        (Some(Value::String(_)), Some(_)) => {
            Err(error(Value::Null, INVALID_REQUEST, "invalid request: \"id\" must be a string or an integer"))
        }
        (Some(Value::String(_)), None) => Ok(Message::NoAnswer),
        (None, Some(_)) if object.contains_key("result") || object.contains_key("error") => {
            Ok(Message::NoAnswer)
        }
        (Some(_), id) => Err(error(
            id.filter(valid_id).unwrap_or(Value::Null),
            INVALID_REQUEST,
            "invalid request: \"method\" must be a string",
        )),
        (None, id) => Err(error(
            id.filter(valid_id).unwrap_or(Value::Null),
            INVALID_REQUEST,
            "invalid request: no \"method\"",
        )),
    }
}

/// MCP ids are strings or integers (never null).
fn valid_id(id: &Value) -> bool {
    id.is_string() || id.as_i64().is_some() || id.as_u64().is_some()
}

/// Answers one message: `None` for a notification or a response.
pub async fn handle(app: &AppState, message: Value) -> Option<Value> {
    let (id, method, params) = match classify(message) {
        Ok(Message::Request { id, method, params }) => (id, method, params),
        Ok(Message::NoAnswer) => return None,
        Err(answer) => return Some(answer),
    };
    let answer = match method.as_str() {
        "initialize" => initialize(&params).map(|r| result(id.clone(), r)),
        "ping" => Ok(result(id.clone(), json!({}))),
        "tools/list" => Ok(result(id.clone(), json!({"tools": tools()}))),
        "tools/call" => call(app, &params).await.map(|r| result(id.clone(), r)),
        _ => Err((METHOD_NOT_FOUND, format!("method not found: {method}"))),
    };
    Some(answer.unwrap_or_else(|(code, message)| error(id, code, message)))
}

/// The `initialize` result: the client's revision when this server speaks it, else the latest.
fn initialize(params: &Value) -> Result<Value, (i64, String)> {
    let Some(asked) = params.get("protocolVersion").and_then(Value::as_str) else {
        return Err((INVALID_PARAMS, "invalid params: \"protocolVersion\" (a string) is required".into()));
    };
    let version = VERSIONS.iter().find(|v| **v == asked).copied().unwrap_or(LATEST_VERSION);
    Ok(json!({
        "protocolVersion": version,
        "capabilities": {"tools": {"listChanged": false}},
        "serverInfo": {
            "name": "agentmesh",
            "title": "agentmesh capability discovery",
            "version": env!("CARGO_PKG_VERSION"),
        },
        "instructions": INSTRUCTIONS,
    }))
}

/// The two tools, as `tools/list` describes them.
pub fn tools() -> Value {
    let read_only = json!({"readOnlyHint": true, "destructiveHint": false, "idempotentHint": true,
                           "openWorldHint": false});
    json!([
        {
            "name": DISCOVER,
            "title": "Discover capabilities",
            "description": TOOL_DESCRIPTION,
            "inputSchema": tool_schema(),
            "outputSchema": {
                "type": "object",
                "properties": {
                    "query": {"type": "string"},
                    "total_indexed": {"type": "integer"},
                    "results": {"type": "array", "items": {
                        "type": "object",
                        "properties": {
                            "target": {"type": "string"},
                            "agent_id": {"type": "string"},
                            "kind": {"type": "string", "enum": ["reasoner", "skill"]},
                            "id": {"type": "string"},
                            "relevance": {"type": "number", "minimum": 0, "maximum": 1},
                            "summary": {"type": "string"},
                            "category": {"type": ["string", "null"]},
                            "health_status": {"type": "string"}
                        },
                        "required": ["target", "agent_id", "kind", "id", "relevance", "summary", "health_status"]
                    }}
                },
                "required": ["query", "total_indexed", "results"]
            },
            "annotations": read_only,
        },
        {
            "name": GET,
            "title": "Get a capability's detail",
            "description": "The full detail of one capability found by discover_capabilities: what it does, \
    its exact input schema (JSON Schema), what it returns, what it needs, and where to call it.",
            "inputSchema": {
                "type": "object",
                "properties": {
                    "target": {"type": "string", "minLength": 1, "maxLength": MAX_TARGET_LEN,
                               "description": "A result's target: agent_id:kind:id."}
                },
                "required": ["target"],
                "additionalProperties": false
            },
            "outputSchema": {
                "type": "object",
                "properties": {
                    "target": {"type": "string"},
                    "agent_id": {"type": "string"},
                    "kind": {"type": "string", "enum": ["reasoner", "skill"]},
                    "id": {"type": "string"},
                    "name": {"type": "string"},
                    "description": {"type": ["string", "null"]},
                    "category": {"type": ["string", "null"]},
                    "input_schema": {},
                    "output_schema": {},
                    "requires": {"type": "array", "items": {"type": "string"}},
                    "required_secrets": {"type": "array", "items": {"type": "string"}},
                    "has_side_effects": {"type": "boolean"},
                    "health_status": {"type": "string"},
                    "base_url": {"type": "string"}
                },
                "required": ["target", "agent_id", "kind", "id", "name", "health_status", "base_url"]
            },
            "annotations": read_only,
        }
    ])
}

/// A `tools/call`: a protocol error (unknown tool, no name) is a JSON-RPC error; bad arguments and
/// unknown targets are tool errors (`isError`), which the model reads and can correct.
async fn call(app: &AppState, params: &Value) -> Result<Value, (i64, String)> {
    let Some(name) = params.get("name").and_then(Value::as_str) else {
        return Err((INVALID_PARAMS, "invalid params: \"name\" (a string) is required".into()));
    };
    let empty = Map::new();
    let arguments = match params.get("arguments") {
        None | Some(Value::Null) => &empty,
        Some(Value::Object(a)) => a,
        Some(_) => return Ok(tool_error("arguments must be an object")),
    };
    let outcome = match name {
        DISCOVER => discover(app, arguments).await,
        GET => get_capability(app, arguments),
        _ => return Err((INVALID_PARAMS, format!("unknown tool: {name}"))),
    };
    Ok(outcome.unwrap_or_else(|message| tool_error(&message)))
}

fn tool_error(message: &str) -> Value {
    json!({"content": [{"type": "text", "text": message}], "isError": true})
}

fn tool_result(text: String, structured: Value) -> Value {
    json!({"content": [{"type": "text", "text": text}], "structuredContent": structured, "isError": false})
}

/// Refuses arguments the tool does not take (a typo should not be silently ignored).
fn only(arguments: &Map<String, Value>, known: &[&str]) -> Result<(), String> {
    match arguments.keys().find(|k| !known.contains(&k.as_str())) {
        Some(k) => Err(format!("unknown argument {k:?} (takes {})", known.join(", "))),
        None => Ok(()),
    }
}

/// The search a `discover_capabilities` call asks for.
fn discover_request(arguments: &Map<String, Value>) -> Result<Request, String> {
    only(arguments, &["query", "kind", "tags", "limit"])?;
    let q = match arguments.get("query") {
        Some(Value::String(q)) => q.trim(),
        Some(_) => return Err("query must be a string".into()),
        None => return Err("query is required: what the capability should do, in plain words".into()),
    };
    if q.is_empty() || q.chars().count() > MAX_QUERY_CHARS {
        return Err(format!("query must have 1 to {MAX_QUERY_CHARS} characters"));
    }
    let mut req = Request::new(q);
    match arguments.get("kind") {
        None | Some(Value::Null) => {}
        Some(Value::String(k)) => {
            req.kind = Kind::parse(k).ok_or_else(|| format!("kind {k:?}: use reasoner, skill or any"))?
        }
        Some(_) => return Err("kind must be a string: reasoner, skill or any".into()),
    }
    match arguments.get("limit") {
        None | Some(Value::Null) => {}
        Some(v) => match v.as_u64() {
            Some(n) if (1..=MAX_RESULTS as u64).contains(&n) => req.limit = n as usize,
            _ => return Err(format!("limit must be an integer from 1 to {MAX_RESULTS}")),
        },
    }
    match arguments.get("tags") {
        None | Some(Value::Null) => {}
        Some(Value::Array(tags)) => {
            if tags.len() > MAX_TOOL_TAGS {
                return Err(format!("at most {MAX_TOOL_TAGS} tags"));
            }
            let tags: Option<Vec<&str>> = tags.iter().map(Value::as_str).collect();
            let tags = tags.ok_or("tags must be strings")?;
            if tags.iter().any(|t| t.contains(',')) {
                return Err("a tag cannot contain a comma".into());
            }
            if !tags.is_empty() {
                let params = [("tags".to_owned(), tags.join(","))];
                req.filters = Query::from_params(&params).map_err(|e| e.to_string())?;
            }
        }
        Some(_) => return Err("tags must be an array of strings".into()),
    }
    Ok(req)
}

async fn discover(app: &AppState, arguments: &Map<String, Value>) -> Result<Value, String> {
    let req = discover_request(arguments)?;
    let snapshot = app.registry.snapshot();
    let answer = run(app, &snapshot, &req).await.map_err(|e| e.to_string())?;
    let lines = context::tier1_entries(&answer.results);
    let text = if lines.is_empty() {
        format!(
            "No capability matched {:?} among {} on the mesh. Try other words, or fewer filters.",
            req.q, answer.total_indexed
        )
    } else {
        format!(
            "Capabilities matching {:?} (relevance 0-1); call get_capability with a target for its input schema:\n{}",
            req.q,
            lines.concat()
        )
    };
    let results: Vec<Value> = answer
        .results
        .iter()
        .map(|f| {
            let card_text = f.entry.card.text();
            let card = card_text.view();
            let list = if f.reasoner { &card.reasoners } else { &card.skills };
            json!({
                "target": f.target,
                "agent_id": f.entry.key.agent_id,
                "kind": f.kind(),
                "id": f.id,
                "relevance": f.relevance,
                "summary": context::summary(f),
                "category": list.get(f.cap).and_then(|c| c.category_in(&card)),
                "health_status": f.health.as_str(),
            })
        })
        .collect();
    let structured = json!({"query": req.q, "total_indexed": answer.total_indexed, "results": results});
    Ok(tool_result(text, structured))
}

/// Splits `agent_id:kind:id`.
fn parse_target(target: &str) -> Result<(&str, bool, &str), String> {
    let bad = || format!("target {target:?} is not agent_id:kind:id (kind: reasoner or skill)");
    let mut parts = target.splitn(3, ':');
    let (Some(agent), Some(kind), Some(id)) = (parts.next(), parts.next(), parts.next()) else {
        return Err(bad());
    };
    let reasoner = match kind {
        "reasoner" => true,
        "skill" => false,
        _ => return Err(bad()),
    };
    if agent.is_empty() || id.is_empty() {
        return Err(bad());
    }
    Ok((agent, reasoner, id))
}

fn get_capability(app: &AppState, arguments: &Map<String, Value>) -> Result<Value, String> {
    only(arguments, &["target"])?;
    let target = match arguments.get("target") {
        Some(Value::String(t)) if t.len() <= MAX_TARGET_LEN => t.trim(),
        Some(Value::String(_)) => return Err(format!("target is longer than {MAX_TARGET_LEN} bytes")),
        Some(_) => return Err("target must be a string".into()),
        None => return Err("target is required: a discover_capabilities result's target".into()),
    };
    let (agent_id, reasoner, id) = parse_target(target)?;
    let snapshot = app.registry.snapshot();
    let now = now_millis();
    // The local copy first, then by publisher: the same agent published by several nodes is one.
    let found = snapshot.by_agent_id(agent_id).into_iter().find_map(|entry| {
        let card_text = entry.card.text();
        let card = card_text.view();
        let list = if reasoner { &card.reasoners } else { &card.skills };
        let cap = list.iter().position(|c| c.id == id)?;
        Some(Found {
            entry: entry.clone(),
            reasoner,
            cap,
            id: id.to_owned(),
            target: target.to_owned(),
            relevance: 1.0,
            matched: Vec::new(),
            health: entry.health(now, app.registry.thresholds()),
        })
    });
    let Some(f) = found else {
        return Err(format!(
            "no capability {target} in this node's view; search again with discover_capabilities"
        ));
    };
    let text = context::detail(&f);
    let card_text = f.entry.card.text();
    let card: CardRef<'_> = card_text.view();
    let list = if f.reasoner { &card.reasoners } else { &card.skills };
    let Some(cap) = list.get(f.cap) else { return Err(format!("no capability {target}")) };
    let schema = |raw: Option<&serde_json::value::RawValue>| {
        raw.and_then(|r| serde_json::from_str::<Value>(r.get()).ok()).unwrap_or(Value::Null)
    };
    let structured = json!({
        "target": f.target,
        "agent_id": card.agent_id,
        "kind": f.kind(),
        "id": f.id,
        "name": cap.name.as_deref().unwrap_or(&cap.id),
        "description": cap.description.as_deref(),
        "category": cap.category_in(&card),
        "input_schema": schema(cap.input_schema),
        "output_schema": schema(cap.output_schema),
        "requires": cap.requires,
        "required_secrets": cap.required_secrets,
        "has_side_effects": cap.has_side_effects,
        "health_status": f.health.as_str(),
        "base_url": card.base_url,
    });
    Ok(tool_result(text, structured))
}

/// Whether a browser page from `origin` may call: only pages served from loopback (DNS rebinding
/// would otherwise let any web page query the node through a victim's browser).
fn origin_allowed(origin: &str) -> bool {
    let Some(rest) = origin.split_once("://").map(|(_, r)| r) else { return false };
    let host = rest.split('/').next().unwrap_or_default();
    let host = match host.strip_prefix('[') {
        Some(v6) => v6.split(']').next().unwrap_or_default(),
        None => host.rsplit_once(':').map(|(h, _)| h).unwrap_or(host),
    };
    host.eq_ignore_ascii_case("localhost")
        || host.parse::<std::net::IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

/// An HTTP-level refusal, with a JSON-RPC error body.
fn refuse(status: StatusCode, code: i64, message: impl Into<String>) -> Response {
    (status, Json(error(Value::Null, code, message))).into_response()
}

/// `POST /mcp`.
pub async fn post(State(app): State<AppState>, headers: HeaderMap, RawBody(body): RawBody) -> Response {
    if let Some(origin) = headers.get(ORIGIN) {
        if !origin.to_str().is_ok_and(origin_allowed) {
            return refuse(StatusCode::FORBIDDEN, INVALID_REQUEST, "origin not allowed");
        }
    }
    let json_body = headers.get(CONTENT_TYPE).and_then(|v| v.to_str().ok()).is_some_and(|v| {
        v.split(';').next().is_some_and(|t| t.trim().eq_ignore_ascii_case("application/json"))
    });
    if !json_body {
        return refuse(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            INVALID_REQUEST,
            "content-type must be application/json",
        );
    }
    if let Some(v) = headers.get(VERSION_HEADER) {
        if !v.to_str().is_ok_and(|v| VERSIONS.contains(&v)) {
            let asked = String::from_utf8_lossy(v.as_bytes()).into_owned();
            return refuse(
                StatusCode::BAD_REQUEST,
                INVALID_REQUEST,
                format!("unsupported {VERSION_HEADER} {asked:?} (supported: {})", VERSIONS.join(", ")),
            );
        }
    }
    let message: Value = match serde_json::from_slice(&body) {
        Ok(m) => m,
        Err(e) => return refuse(StatusCode::BAD_REQUEST, PARSE_ERROR, format!("parse error: {e}")),
    };
    let method = message.get("method").and_then(Value::as_str).unwrap_or_default().to_owned();
    match handle(&app, message).await {
        None => StatusCode::ACCEPTED.into_response(),
        Some(answer) => {
            let failed = answer.get("error").is_some();
            tracing::debug!(target: "agentmesh::mcp", %method, failed, "mcp request answered");
            // Malformed messages are refused at the HTTP level too; answered requests are 200.
            let status = match answer["error"]["code"].as_i64() {
                Some(INVALID_REQUEST) if answer["id"].is_null() => StatusCode::BAD_REQUEST,
                _ => StatusCode::OK,
            };
            (status, Json(answer)).into_response()
        }
    }
}

#[cfg(test)]
mod tests;
