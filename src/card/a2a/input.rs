//! A2A cards as input: an A2A 1.0 card (or a 0.3 one, read as 1.0 by [`legacy`]) as an
//! agentmesh card that serves the same A2A card back.
//!
//! The fields agentmesh has its own form for (name, description, version, interfaces, modes, skills)
//! become card fields; the others (provider, documentation and icon URLs, capability flags, other
//! extensions, security) are held as given in the card's `a2a` object, and each skill's own security
//! requirements in its capability's. The agentmesh extension, when present (a card this daemon served),
//! restores the agent id, reasoners and schemas exactly.

use serde_json::{Map, Value};

use super::schema::{self, Unknown};
use super::{legacy, DEFAULT_BINDING, EXTENSION_URI, PROTOCOL_VERSION};
use crate::card::{to_raw, AgentCard, Capability, CardError, Interface};
use crate::defaults::MAX_ID_LEN;

/// Card fields held in `AgentCard::a2a`, as they are named in an A2A card.
const CARD_EXTRAS: [&str; 5] =
    ["provider", "documentationUrl", "iconUrl", "securitySchemes", "securityRequirements"];

/// Reads an A2A card as an agentmesh card. Without the agentmesh extension the agent id comes from the
/// name and every A2A skill is a skill. Fields A2A 1.0 does not define are dropped, as A2A verifiers
/// drop them. Signatures on the input are not kept: the node signs what it publishes.
pub fn from_a2a(value: Value) -> Result<AgentCard, CardError> {
    let Value::Object(mut card) = value else {
        return Err(CardError::Malformed { field: "card".into(), reason: "expected an object".into() });
    };
    card.remove("signatures");
    legacy::upgrade(&mut card)?;
    let mut card = schema::normalize(Value::Object(card), &schema::CARD, "", Unknown::Drop)?;
    let mut extras = Map::new();
    for key in CARD_EXTRAS {
        if let Some(value) = card.remove(key).filter(|v| !schema::is_empty(v)) {
            extras.insert(key.to_owned(), value);
        }
    }
    let ext = match card.remove("capabilities") {
        Some(Value::Object(capabilities)) => split_capabilities(capabilities, &mut extras),
        _ => Value::Null,
    };
    let text = |key: &str| ext.get(key).and_then(Value::as_str).map(str::to_owned);
    let details = ext.get("skills").and_then(Value::as_object);
    let interfaces = interfaces(card.remove("supportedInterfaces"));
    let base_url = text("base_url").or_else(|| base_url(&interfaces)).ok_or_else(|| {
        CardError::invalid("supportedInterfaces", "needs at least one interface with a url")
    })?;
    let name = take_text(&mut card, "name");
    let agent_id = match text("agent_id") {
        Some(id) => id,
        None => id_from_name(&name)?,
    };
    let derived_interface = interfaces.len() == 1
        && interfaces[0].url == base_url
        && interfaces[0].protocol_binding == DEFAULT_BINDING
        && interfaces[0].protocol_version == PROTOCOL_VERSION
        && interfaces[0].tenant.is_empty();
    let version = take_text(&mut card, "version");
    let mut out = AgentCard {
        description: take_text(&mut card, "description"),
        version: if version.is_empty() { "0.0.0".into() } else { version },
        deployment_type: text("deployment_type").unwrap_or_else(|| "long_running".into()),
        tags: string_list(ext.get("tags")),
        category: text("category"),
        group_id: text("group_id"),
        metadata: metadata(ext.get("metadata")),
        input_modes: non_empty_or_json(take_texts(&mut card, "defaultInputModes")),
        output_modes: non_empty_or_json(take_texts(&mut card, "defaultOutputModes")),
        interfaces: if derived_interface { Vec::new() } else { interfaces },
        a2a: (!extras.is_empty()).then(|| to_raw(&Value::Object(extras))),
        reasoners: Vec::new(),
        skills: Vec::new(),
        a2a_signature: None,
        name,
        agent_id,
        base_url,
    };
    for skill in objects(card.remove("skills")) {
        let (kind, cap) = capability(skill, details);
        if kind == "reasoner" {
            out.reasoners.push(cap);
        } else {
            out.skills.push(cap);
        }
    }
    if out.description == out.name {
        out.description.clear();
    }
    out.normalized()
}

fn interfaces(list: Option<Value>) -> Vec<Interface> {
    objects(list)
        .map(|mut i| Interface {
            url: take_text(&mut i, "url"),
            protocol_binding: take_text(&mut i, "protocolBinding"),
            protocol_version: Some(take_text(&mut i, "protocolVersion"))
                .filter(|v| !v.is_empty())
                .unwrap_or_else(|| PROTOCOL_VERSION.to_owned()),
            tenant: take_text(&mut i, "tenant"),
        })
        .collect()
}

/// The agent's own address, what AgentField agents, probes and discovery call `base_url`: its first
/// HTTP interface, else its first.
fn base_url(interfaces: &[Interface]) -> Option<String> {
    let http = |i: &&Interface| i.url.starts_with("http://") || i.url.starts_with("https://");
    interfaces.iter().find(http).or(interfaces.first()).map(|i| i.url.clone())
}

/// The agentmesh extension's params, out of `capabilities`; what is left of it (flags, other
/// extensions) goes to `extras` when not empty.
fn split_capabilities(mut capabilities: Map<String, Value>, extras: &mut Map<String, Value>) -> Value {
    let mut params = Value::Null;
    if let Some(Value::Array(list)) = capabilities.remove("extensions") {
        let mut others = Vec::with_capacity(list.len());
        for ext in list {
            if ext.get("uri").and_then(Value::as_str) == Some(EXTENSION_URI) {
                params = ext.get("params").cloned().unwrap_or(Value::Null);
            } else {
                others.push(ext);
            }
        }
        if !others.is_empty() {
            capabilities.insert("extensions".into(), Value::Array(others));
        }
    }
    if !capabilities.is_empty() {
        extras.insert("capabilities".into(), Value::Object(capabilities));
    }
    params
}

fn capability(
    mut skill: Map<String, Value>,
    details: Option<&Map<String, Value>>,
) -> (&'static str, Capability) {
    let a2a_id = take_text(&mut skill, "id");
    let detail = details.and_then(|d| d.get(&a2a_id));
    let field = |key: &str| detail.and_then(|d| d.get(key));
    let kind = if field("kind").and_then(Value::as_str) == Some("reasoner") { "reasoner" } else { "skill" };
    let id = field("id").and_then(Value::as_str).map_or(a2a_id, str::to_owned);
    // With the extension, tags are the card's own (an untagged capability got its kind as its A2A tag).
    let tags = take_texts(&mut skill, "tags");
    let tags = if detail.is_some() { string_list(field("tags")) } else { tags };
    let name = Some(take_text(&mut skill, "name")).filter(|n| !n.is_empty() && *n != id);
    let shown_name = name.as_deref().unwrap_or(&id);
    let description = Some(take_text(&mut skill, "description")).filter(|d| !d.is_empty() && d != shown_name);
    let examples = take_texts(&mut skill, "examples").into_iter().map(|e| example(&e)).collect();
    let security = skill.remove("securityRequirements").filter(|v| !schema::is_empty(v));
    let schema = |key: &str| field(key).filter(|v| v.is_object()).map(to_raw);
    let cap = Capability {
        category: field("category").and_then(Value::as_str).map(str::to_owned),
        requires: string_list(field("requires")),
        required_secrets: string_list(field("required_secrets")),
        has_side_effects: field("has_side_effects").and_then(Value::as_bool).unwrap_or(false),
        input_schema: schema("input_schema"),
        output_schema: schema("output_schema"),
        input_modes: take_texts(&mut skill, "inputModes"),
        output_modes: take_texts(&mut skill, "outputModes"),
        a2a: security.map(|s| to_raw(&serde_json::json!({ "securityRequirements": s }))),
        confidence_hint: field("confidence_hint").and_then(Value::as_f64),
        metadata: metadata(field("metadata")),
        id,
        name,
        description,
        tags,
        examples,
    };
    (kind, cap)
}

/// An A2A example is text. Text that is exactly the minified JSON of an object or array (how the view
/// writes a structured example) is read back as that JSON; any other text stays text, as written.
fn example(text: &str) -> Box<serde_json::value::RawValue> {
    match serde_json::from_str::<Value>(text) {
        Ok(v @ (Value::Object(_) | Value::Array(_))) if to_raw(&v).get() == text => to_raw(&v),
        _ => to_raw(&Value::String(text.to_owned())),
    }
}

/// The objects of a normalised list (anything else is absent).
fn objects(value: Option<Value>) -> impl Iterator<Item = Map<String, Value>> {
    let items = match value {
        Some(Value::Array(items)) => items,
        _ => Vec::new(),
    };
    items.into_iter().filter_map(|v| match v {
        Value::Object(map) => Some(map),
        _ => None,
    })
}

fn take_text(map: &mut Map<String, Value>, key: &str) -> String {
    match map.remove(key) {
        Some(Value::String(s)) => s,
        _ => String::new(),
    }
}

/// A normalised list of strings, without its empty ones (A2A's canonical form drops them).
fn take_texts(map: &mut Map<String, Value>, key: &str) -> Vec<String> {
    let items = match map.remove(key) {
        Some(Value::Array(items)) => items,
        _ => Vec::new(),
    };
    items
        .into_iter()
        .filter_map(|v| match v {
            Value::String(s) if !s.is_empty() => Some(s),
            _ => None,
        })
        .collect()
}

fn string_list(value: Option<&Value>) -> Vec<String> {
    value
        .and_then(Value::as_array)
        .map(|items| items.iter().filter_map(Value::as_str).map(str::to_owned).collect())
        .unwrap_or_default()
}

fn non_empty_or_json(modes: Vec<String>) -> Vec<String> {
    if modes.is_empty() {
        vec!["application/json".to_owned()]
    } else {
        modes
    }
}

/// An agent id from an A2A name: lower case, runs of other characters as one `-`.
pub(crate) fn id_from_name(name: &str) -> Result<String, CardError> {
    let mut id = String::new();
    for c in name.chars() {
        if c.is_ascii_alphanumeric() || c == '_' || c == '.' {
            id.push(c.to_ascii_lowercase());
        } else if !id.ends_with('-') {
            id.push('-');
        }
    }
    let id: String = id.trim_matches('-').chars().take(MAX_ID_LEN).collect();
    if id.is_empty() {
        return Err(CardError::invalid(
            "name",
            "an A2A card's name must hold a letter or digit to make an agent id",
        ));
    }
    Ok(id)
}

/// Metadata as the agentmesh extension carries it: an object of strings (anything else is not ours).
fn metadata(value: Option<&Value>) -> crate::card::Metadata {
    value
        .and_then(Value::as_object)
        .map(|m| m.iter().filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_owned()))).collect())
        .unwrap_or_default()
}
