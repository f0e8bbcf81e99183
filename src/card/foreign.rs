//! Card shapes other registries write, read as agentmesh cards: AgentSpec documents and
//! openribcage-style cards. Pure: JSON in, a validated [`AgentCard`] out, every refusal naming a field.
//!
//! AgentSpec (an agent reached through a message bus): `agent_type` is the agent id; each capability
//! (keyed by `name`) becomes a reasoner with its schemas and `confidence_hint`; the agent is reached at
//! `nats:<nats_subject>`, so it needs no base URL; `tags` (a key/value map) becomes tags `key:value` (of
//! the agent and of each capability, which is what the `tags` filter reads) and metadata; the operational fields (`owner_team`, `tenant_scope`, `consumer_group`,
//! `supported_patterns`, `tools`, limits and timeouts, `status`) become metadata, lists joined by `,`.
//! Fields the view keeps of itself (`registered_at`, `last_heartbeat`) are not kept.
//!
//! openribcage: `capabilities` is a list of names (each a skill), `endpoints[{type, url, methods}]` says
//! where it is reached (the first HTTP one is the base URL; others become interfaces by their type), and
//! `metadata` keeps its string, number and boolean values.

use serde_json::{Map, Value};

use super::a2a::input::id_from_name;
use super::{AgentCard, Capability, CardError, Interface, Metadata};
use crate::defaults::MAX_SHORT_TEXT;

/// The binding of an interface reached over NATS by subject.
pub const NATS_BINDING: &str = "NATS";
/// The base URL scheme of an agent reached by a NATS subject.
pub const NATS_SCHEME: &str = "nats:";

/// AgentSpec fields that become metadata, as they are named there.
const AGENTSPEC_METADATA: &[&str] = &[
    "owner_team",
    "tenant_scope",
    "consumer_group",
    "supported_patterns",
    "max_concurrent_tasks",
    "task_timeout_ms",
    "llm_timeout_ms",
    "max_retries",
    "tools",
    "evaluators",
    "reflection_config",
    "status",
    "nats_subject",
];

/// An AgentSpec document names its `agent_type` and has no `agent_id`.
pub fn looks_like_agentspec(value: &Value) -> bool {
    value
        .as_object()
        .is_some_and(|m| !m.contains_key("agent_id") && m.get("agent_type").is_some_and(Value::is_string))
}

/// An openribcage card lists `endpoints`, or its `capabilities` as names.
pub fn looks_like_openribcage(value: &Value) -> bool {
    value.as_object().is_some_and(|m| {
        !m.contains_key("agent_id")
            && (m.get("endpoints").is_some_and(Value::is_array)
                || m.get("capabilities")
                    .and_then(Value::as_array)
                    .is_some_and(|c| c.iter().all(Value::is_string)))
    })
}

fn text(m: &Map<String, Value>, key: &str) -> Option<String> {
    m.get(key).and_then(Value::as_str).map(str::trim).filter(|s| !s.is_empty()).map(str::to_owned)
}

/// A metadata value from any JSON scalar or list of scalars (joined by `,`); objects as compact JSON.
/// None when it is empty or would not fit a metadata value.
fn metadata_value(value: &Value) -> Option<String> {
    let text = match value {
        Value::Null => return None,
        Value::String(s) => s.clone(),
        Value::Bool(_) | Value::Number(_) => value.to_string(),
        Value::Array(items) => items
            .iter()
            .map(|v| match v {
                Value::String(s) => s.clone(),
                other => other.to_string(),
            })
            .collect::<Vec<_>>()
            .join(","),
        Value::Object(_) => value.to_string(),
    };
    (!text.is_empty() && text.len() <= MAX_SHORT_TEXT && !text.chars().any(char::is_control)).then_some(text)
}

fn malformed(field: &str, reason: &str) -> CardError {
    CardError::Malformed { field: field.to_owned(), reason: reason.to_owned() }
}

/// Reads an AgentSpec document as an agentmesh card (see the module docs for the mapping).
pub fn from_agentspec(value: Value) -> Result<AgentCard, CardError> {
    let Value::Object(m) = value else { return Err(malformed("card", "expected a JSON object")) };
    let agent_id =
        text(&m, "agent_type").ok_or_else(|| malformed("agent_type", "expected a non-empty string"))?;
    let subject = text(&m, "nats_subject").ok_or_else(|| CardError::Invalid {
        field: "nats_subject".into(),
        reason: "an AgentSpec agent is reached by its subject".into(),
    })?;
    let base_url = format!("{NATS_SCHEME}{subject}");
    let mut metadata = Metadata::new();
    let mut tags = Vec::new();
    match m.get("tags") {
        Some(Value::Object(pairs)) => {
            for (key, value) in pairs {
                if let Some(value) = metadata_value(value) {
                    tags.push(format!("{key}:{value}"));
                    metadata.insert(key.clone(), value);
                }
            }
        }
        Some(Value::Array(list)) => tags.extend(list.iter().filter_map(Value::as_str).map(str::to_owned)),
        _ => {}
    }
    for key in AGENTSPEC_METADATA {
        if let Some(value) = m.get(*key).and_then(metadata_value) {
            metadata.insert((*key).to_owned(), value);
        }
    }
    let caps = m.get("capabilities").and_then(Value::as_array).cloned().unwrap_or_default();
    let mut reasoners = Vec::with_capacity(caps.len());
    for (i, cap) in caps.into_iter().enumerate() {
        let at = format!("capabilities[{i}]");
        let Value::Object(c) = cap else { return Err(malformed(&at, "expected an object with a name")) };
        let name = text(&c, "name")
            .ok_or_else(|| malformed(&format!("{at}.name"), "expected a non-empty string"))?;
        let schema = |key: &str| c.get(key).filter(|v| v.is_object()).map(super::to_raw);
        reasoners.push(Capability {
            id: id_from_name(&name)
                .map_err(|_| malformed(&format!("{at}.name"), "must hold a letter or digit"))?,
            name: Some(name),
            description: text(&c, "description"),
            input_schema: schema("input_schema"),
            output_schema: schema("output_schema"),
            confidence_hint: c.get("confidence_hint").and_then(Value::as_f64),
            // Discovery's `tags` filter reads capability tags: each capability carries the document's.
            tags: tags.clone(),
            ..Capability::default()
        });
    }
    let card = AgentCard {
        agent_id,
        name: text(&m, "name").unwrap_or_default(),
        description: text(&m, "description").unwrap_or_default(),
        version: text(&m, "version").unwrap_or_else(|| "0.0.0".to_owned()),
        base_url: base_url.clone(),
        tags,
        metadata: super::keep_metadata(metadata),
        reasoners,
        interfaces: vec![Interface {
            url: base_url,
            protocol_binding: NATS_BINDING.to_owned(),
            protocol_version: super::a2a::PROTOCOL_VERSION.to_owned(),
            tenant: String::new(),
        }],
        ..AgentCard::default()
    };
    card.normalized()
}

/// Reads an openribcage card as an agentmesh card (see the module docs for the mapping).
pub fn from_openribcage(value: Value) -> Result<AgentCard, CardError> {
    let Value::Object(m) = value else { return Err(malformed("card", "expected a JSON object")) };
    let name = text(&m, "name");
    let agent_id = match text(&m, "id") {
        Some(id) => id,
        None => id_from_name(name.as_deref().ok_or_else(|| malformed("name", "expected a name or an id"))?)?,
    };
    let mut base_url = text(&m, "url");
    let mut interfaces = Vec::new();
    let mut metadata = Metadata::new();
    let endpoints = m.get("endpoints").and_then(Value::as_array).cloned().unwrap_or_default();
    for (i, endpoint) in endpoints.iter().enumerate() {
        let at = format!("endpoints[{i}]");
        let url = endpoint
            .get("url")
            .and_then(Value::as_str)
            .ok_or_else(|| malformed(&format!("{at}.url"), "expected a URL"))?;
        let kind = endpoint.get("type").and_then(Value::as_str).unwrap_or("http").to_ascii_lowercase();
        let binding = match kind.as_str() {
            "http" | "https" | "rest" => "HTTP+JSON",
            "jsonrpc" | "a2a" => "JSONRPC",
            "grpc" => "GRPC",
            _ => {
                if let Some(url) = metadata_value(&Value::String(url.to_owned())) {
                    metadata.insert(format!("endpoint.{kind}"), url);
                }
                continue;
            }
        };
        if binding == "HTTP+JSON" && base_url.is_none() {
            base_url = Some(url.to_owned());
        }
        if let Some(methods) = endpoint.get("methods").and_then(metadata_value) {
            metadata.insert(format!("endpoint.{kind}.methods"), methods);
        }
        interfaces.push(Interface {
            url: url.to_owned(),
            protocol_binding: binding.to_owned(),
            protocol_version: super::a2a::PROTOCOL_VERSION.to_owned(),
            tenant: String::new(),
        });
    }
    let base_url = base_url.or_else(|| interfaces.first().map(|i| i.url.clone())).ok_or_else(|| {
        CardError::Invalid { field: "endpoints".into(), reason: "needs at least one endpoint URL".into() }
    })?;
    if let Some(Value::Object(pairs)) = m.get("metadata") {
        for (key, value) in pairs {
            if let Some(value) = metadata_value(value) {
                metadata.insert(key.clone(), value);
            }
        }
    }
    let mut skills = Vec::new();
    for (i, cap) in m.get("capabilities").and_then(Value::as_array).into_iter().flatten().enumerate() {
        let name = cap.as_str().ok_or_else(|| malformed(&format!("capabilities[{i}]"), "expected a name"))?;
        let id = id_from_name(name)
            .map_err(|_| malformed(&format!("capabilities[{i}]"), "must hold a letter or digit"))?;
        skills.push(Capability { id, name: Some(name.to_owned()), ..Capability::default() });
    }
    // An interface that only repeats the base URL as HTTP+JSON says nothing the base URL does not.
    if let [only] = interfaces.as_slice() {
        if only.url == base_url && only.protocol_binding == "HTTP+JSON" {
            interfaces.clear();
        }
    }
    let tags = m
        .get("tags")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .map(str::to_owned)
        .collect();
    let card = AgentCard {
        agent_id,
        name: name.unwrap_or_default(),
        description: text(&m, "description").unwrap_or_default(),
        version: text(&m, "version").unwrap_or_else(|| "0.0.0".to_owned()),
        base_url,
        tags,
        metadata: super::keep_metadata(metadata),
        skills,
        interfaces,
        ..AgentCard::default()
    };
    card.normalized()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn agentspec() -> Value {
        json!({
            "agent_type": "refund-processor", "version": "2.3.0", "description": "Processes refunds",
            "capabilities": [
                {"name": "process_refund", "description": "Refund an order", "confidence_hint": 0.92,
                 "input_schema": {"type": "object", "properties": {"order_id": {"type": "string"}}},
                 "output_schema": {"type": "object"}},
                {"name": "Check Refund Status"}
            ],
            "nats_subject": "agents.payments.refund", "consumer_group": "refund-workers",
            "supported_patterns": ["request_reply", "pub_sub"], "max_concurrent_tasks": 8,
            "task_timeout_ms": 30000, "llm_timeout_ms": 12000, "max_retries": 3,
            "reflection_config": {"enabled": true}, "evaluators": ["accuracy"], "tools": ["stripe", "ledger"],
            "owner_team": "payments", "tenant_scope": "eu", "tags": {"domain": "finance", "tier": "gold"},
            "status": "active", "registered_at": "2026-01-01T00:00:00Z", "last_heartbeat": "2026-01-01T00:00:05Z"
        })
    }

    #[test]
    fn an_agentspec_document_becomes_a_card_reached_by_its_subject() {
        assert!(looks_like_agentspec(&agentspec()));
        assert!(!looks_like_openribcage(&agentspec()));
        let card = from_agentspec(agentspec()).unwrap();
        assert_eq!(card.agent_id, "refund-processor");
        assert_eq!(card.version, "2.3.0");
        assert_eq!(card.base_url, "nats:agents.payments.refund");
        assert_eq!(card.interfaces[0].protocol_binding, "NATS");
        let ids: Vec<&str> = card.reasoners.iter().map(|r| r.id.as_str()).collect();
        assert_eq!(ids, ["process_refund", "check-refund-status"]);
        assert_eq!(card.reasoners[0].confidence_hint, Some(0.92));
        assert!(card.reasoners[0].input_schema.as_ref().unwrap().get().contains("order_id"));
        assert_eq!(card.tags, ["domain:finance", "tier:gold"]);
        assert_eq!(card.reasoners[1].tags, card.tags);
        for (k, v) in [
            ("owner_team", "payments"),
            ("tenant_scope", "eu"),
            ("domain", "finance"),
            ("consumer_group", "refund-workers"),
            ("supported_patterns", "request_reply,pub_sub"),
            ("max_concurrent_tasks", "8"),
            ("tools", "stripe,ledger"),
            ("reflection_config", r#"{"enabled":true}"#),
            ("nats_subject", "agents.payments.refund"),
        ] {
            assert_eq!(card.metadata.get(k).map(String::as_str), Some(v), "{k}");
        }
        assert!(!card.metadata.contains_key("registered_at"));
    }

    #[test]
    fn an_agentspec_document_without_a_subject_or_with_a_bad_capability_names_the_field() {
        let mut no_subject = agentspec();
        no_subject.as_object_mut().unwrap().remove("nats_subject");
        assert_eq!(from_agentspec(no_subject).unwrap_err().field(), Some("nats_subject"));
        let mut bad = agentspec();
        bad["capabilities"][1] = json!({"description": "no name"});
        assert_eq!(from_agentspec(bad).unwrap_err().field(), Some("capabilities[1].name"));
        let mut hint = agentspec();
        hint["capabilities"][0]["confidence_hint"] = json!(3);
        assert_eq!(from_agentspec(hint).unwrap_err().field(), Some("reasoners[0].confidence_hint"));
    }

    #[test]
    fn an_openribcage_card_becomes_skills_with_its_endpoints() {
        let card = json!({
            "name": "Invoice Bot", "description": "Reads invoices", "version": "1.2.0",
            "capabilities": ["extract_totals", "Detect Fraud"],
            "endpoints": [
                {"type": "http", "url": "http://10.0.0.7:8080/api", "methods": ["POST"]},
                {"type": "jsonrpc", "url": "http://10.0.0.7:8080/rpc"},
                {"type": "websocket", "url": "ws://10.0.0.7:8081/stream"}
            ],
            "metadata": {"owner": "ap-team", "replicas": 3, "nested": {"a": 1}, "bad key": "x"}
        });
        assert!(looks_like_openribcage(&card));
        let card = from_openribcage(card).unwrap();
        assert_eq!(card.agent_id, "invoice-bot");
        assert_eq!(card.base_url, "http://10.0.0.7:8080/api");
        let skills: Vec<&str> = card.skills.iter().map(|s| s.id.as_str()).collect();
        assert_eq!(skills, ["extract_totals", "detect-fraud"]);
        let bindings: Vec<&str> = card.interfaces.iter().map(|i| i.protocol_binding.as_str()).collect();
        assert_eq!(bindings, ["HTTP+JSON", "JSONRPC"]);
        assert_eq!(card.metadata["owner"], "ap-team");
        assert_eq!(card.metadata["replicas"], "3");
        assert_eq!(card.metadata["endpoint.websocket"], "ws://10.0.0.7:8081/stream");
        assert_eq!(card.metadata["endpoint.http.methods"], "POST");
        assert!(!card.metadata.contains_key("bad key"));
    }

    #[test]
    fn an_openribcage_card_with_no_endpoint_is_refused() {
        let err = from_openribcage(json!({"name": "x", "capabilities": ["a"]})).unwrap_err();
        assert_eq!(err.field(), Some("endpoints"));
    }
}
