//! The A2A 1.0 view of a card, its JWS signature, and A2A cards as input.
//!
//! The view is a pure function of the card, so every node derives the same A2A card from the same
//! canonical card JSON. The publishing node signs that view (JWS, EdDSA, detached payload over its RFC
//! 8785 canonical form, `kid` = the publisher's PeerId) and the signature travels inside the card
//! ([`AgentCard::a2a_signature`]), covered by the mesh envelope's signature: every node serves the
//! publisher's own signature, and checks it before it stores the card.
//!
//! What the A2A SDK signs and verifies is the card as its protobuf model sees it, with empty values
//! (`""`, `[]`, `{}`, `null`) removed at every depth. The view is built in that form ([`clean`]), so the
//! bytes we sign are the bytes a verifier canonicalises. Numbers are canonicalised as doubles, as both
//! RFC 8785 and the SDK's `Struct` do.

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use libp2p::identity::{Keypair, PeerId};
use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};

use super::{to_raw, AgentCard, Capability, CardError, Interface};
use crate::defaults::MAX_ID_LEN;

/// The extension that carries what A2A has no field for: the agent id, which A2A skills are reasoners,
/// input and output JSON schemas, card tags.
pub const EXTENSION_URI: &str = "urn:agentmesh:capabilities:v1";
/// `protocolVersion` of the interface derived from `base_url` when a card names none.
pub const PROTOCOL_VERSION: &str = "1.0";
/// `protocolBinding` of that interface: AgentField agents answer plain HTTP with JSON bodies.
pub const DEFAULT_BINDING: &str = "HTTP+JSON";
/// The only JWS algorithm we make or accept (Ed25519 node keys).
pub const JWS_ALG: &str = "EdDSA";
/// Longest `protected` header and `signature` accepted in a card (base64url text).
pub const MAX_JWS_PART: usize = 1024;

/// Why an A2A signature does not verify.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SignatureError {
    #[error("the card has reasoners or skills but no A2A signature")]
    Missing,
    #[error("the card has no reasoner or skill, so no A2A view, yet carries an A2A signature")]
    Unexpected,
    #[error("malformed JWS protected header: {0}")]
    Header(String),
    #[error("JWS `alg` must be EdDSA")]
    Algorithm,
    #[error("JWS `kid` is not the publisher's PeerId")]
    KeyId,
    #[error("publisher is not an Ed25519 PeerId")]
    Publisher,
    #[error("JWS signature does not verify")]
    Invalid,
}

/// One A2A `signatures` entry: JWS with a detached payload (RFC 7515 appendix F).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JwsSignature {
    pub protected: String,
    pub signature: String,
}

impl JwsSignature {
    /// The decoded protected header.
    pub fn header(&self) -> Result<Value, SignatureError> {
        let bytes =
            URL_SAFE_NO_PAD.decode(&self.protected).map_err(|e| SignatureError::Header(e.to_string()))?;
        serde_json::from_slice(&bytes).map_err(|e| SignatureError::Header(e.to_string()))
    }

    /// The `kid` of the protected header, if it has one.
    pub fn kid(&self) -> Option<String> {
        self.header().ok()?.get("kid").and_then(Value::as_str).map(str::to_owned)
    }

    pub(super) fn validate(&self) -> Result<(), CardError> {
        for (part, name) in [(&self.protected, "protected"), (&self.signature, "signature")] {
            let ok = !part.is_empty()
                && part.len() <= MAX_JWS_PART
                && part.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
            if !ok {
                return Err(CardError::invalid(
                    format!("a2a_signature.{name}"),
                    format!("must be 1 to {MAX_JWS_PART} base64url characters"),
                ));
            }
        }
        Ok(())
    }
}

/// The A2A card of `card`, without `signatures`, in the form that is signed. `None` when the card has
/// no reasoner or skill: an A2A card needs at least one skill.
pub fn view(card: &AgentCard) -> Option<Value> {
    if !card.has_a2a_view() {
        return None;
    }
    let mut skills = Vec::new();
    let mut details = Map::new();
    for (kind, list) in [("reasoner", &card.reasoners), ("skill", &card.skills)] {
        for cap in list {
            let id = skill_id(card, kind, cap);
            skills.push(skill(kind, &id, cap));
            details.insert(
                id,
                json!({"kind": kind, "id": cap.id, "tags": cap.tags,
                "input_schema": cap.input_schema, "output_schema": cap.output_schema,
                "category": cap.category, "requires": cap.requires,
                "required_secrets": cap.required_secrets,
                "has_side_effects": cap.has_side_effects.then_some(true)}),
            );
        }
    }
    let interfaces: Vec<Value> = if card.interfaces.is_empty() {
        vec![json!({"url": card.base_url, "protocolBinding": DEFAULT_BINDING,
            "protocolVersion": PROTOCOL_VERSION})]
    } else {
        card.interfaces
            .iter()
            .map(|i| {
                json!({"url": i.url, "protocolBinding": i.protocol_binding,
                "protocolVersion": i.protocol_version})
            })
            .collect()
    };
    let description = if card.description.is_empty() { card.display_name() } else { &card.description };
    let view = json!({
        "name": card.display_name(),
        "description": description,
        "version": if card.version.is_empty() { "0.0.0" } else { &card.version },
        "supportedInterfaces": interfaces,
        "capabilities": {"extensions": [{
            "uri": EXTENSION_URI,
            "description": "agentmesh: agent id, reasoners, input and output JSON schemas",
            "params": {"agent_id": card.agent_id, "base_url": card.base_url,
                "deployment_type": card.deployment_type, "tags": card.tags,
                "category": card.category, "skills": details},
        }]},
        "defaultInputModes": card.input_modes,
        "defaultOutputModes": card.output_modes,
        "skills": skills,
    });
    clean(view)
}

/// A2A skill ids are unique within a card; a skill that shares its id with a reasoner is `skill:<id>`
/// (`:` never occurs in agentmesh ids).
fn skill_id(card: &AgentCard, kind: &str, cap: &Capability) -> String {
    if kind == "skill" && card.reasoners.iter().any(|r| r.id == cap.id) {
        format!("skill:{}", cap.id)
    } else {
        cap.id.clone()
    }
}

fn skill(kind: &str, id: &str, cap: &Capability) -> Value {
    let name = cap.name.as_deref().filter(|n| !n.is_empty()).unwrap_or(&cap.id);
    let description = cap.description.as_deref().filter(|d| !d.is_empty()).unwrap_or(name);
    // A2A needs at least one tag per skill: an untagged capability is tagged with its kind.
    let tags = if cap.tags.is_empty() { vec![kind.to_owned()] } else { cap.tags.clone() };
    let examples: Vec<String> = cap
        .examples
        .iter()
        .map(|e| match serde_json::from_str::<Value>(e.get()) {
            Ok(Value::String(s)) => s,
            _ => e.get().to_owned(),
        })
        .collect();
    json!({"id": id, "name": name, "description": description, "tags": tags, "examples": examples})
}

/// Removes empty strings, arrays, objects and nulls at every depth, as the A2A SDK does before it
/// canonicalises. `None` when nothing is left.
pub fn clean(value: Value) -> Option<Value> {
    match value {
        Value::Null => None,
        Value::String(s) if s.is_empty() => None,
        Value::Array(items) => {
            let items: Vec<Value> = items.into_iter().filter_map(clean).collect();
            (!items.is_empty()).then_some(Value::Array(items))
        }
        Value::Object(map) => {
            let map: Map<String, Value> =
                map.into_iter().filter_map(|(k, v)| clean(v).map(|v| (k, v))).collect();
            (!map.is_empty()).then_some(Value::Object(map))
        }
        other => Some(other),
    }
}

/// RFC 8785 canonical bytes of a JSON value.
pub fn canonical(value: &Value) -> Vec<u8> {
    // A `Value` holds only JSON (finite numbers, string keys): canonicalising it cannot fail.
    serde_json_canonicalizer::to_vec(value).unwrap_or_default()
}

fn signing_input(protected: &str, view: &Value) -> String {
    format!("{protected}.{}", URL_SAFE_NO_PAD.encode(canonical(view)))
}

/// Signs an A2A view as `key`'s node.
pub fn sign(key: &Keypair, view: &Value) -> JwsSignature {
    let header = json!({"alg": JWS_ALG, "typ": "JOSE", "kid": key.public().to_peer_id().to_base58()});
    let protected = URL_SAFE_NO_PAD.encode(canonical(&header));
    let signature = key.sign(signing_input(&protected, view).as_bytes()).unwrap_or_default();
    JwsSignature { protected, signature: URL_SAFE_NO_PAD.encode(signature) }
}

/// Checks that `sig` is `publisher`'s EdDSA signature over `view`. The key comes from the PeerId the
/// mesh envelope was verified against, never from the header.
pub fn verify(publisher: &PeerId, view: &Value, sig: &JwsSignature) -> Result<(), SignatureError> {
    let claim = claim(publisher, view, sig)?;
    let key = crate::identity::public_key(publisher).ok_or(SignatureError::Publisher)?;
    if key.verify(&claim.input, &claim.signature) {
        Ok(())
    } else {
        Err(SignatureError::Invalid)
    }
}

/// What a JWS claims to sign, checked in everything but the signature itself (so that many can be
/// verified in one batch): the header names EdDSA and `publisher`, and the signature decodes.
#[derive(Debug, Clone)]
pub struct Claim {
    pub input: Vec<u8>,
    pub signature: Vec<u8>,
}

pub fn claim(publisher: &PeerId, view: &Value, sig: &JwsSignature) -> Result<Claim, SignatureError> {
    let header = sig.header()?;
    if header.get("alg").and_then(Value::as_str) != Some(JWS_ALG) {
        return Err(SignatureError::Algorithm);
    }
    if header.get("kid").and_then(Value::as_str) != Some(publisher.to_base58().as_str()) {
        return Err(SignatureError::KeyId);
    }
    let signature = URL_SAFE_NO_PAD.decode(&sig.signature).map_err(|_| SignatureError::Invalid)?;
    Ok(Claim { input: signing_input(&sig.protected, view).into_bytes(), signature })
}

/// What the `signatures` of an A2A card as received cover: the card without them, with empty values
/// removed, as A2A verifiers compute it. Verify over this, never over a card rebuilt from a model.
pub fn signed_payload(card: &Value) -> Option<Value> {
    let mut unsigned = card.clone();
    unsigned.as_object_mut()?.remove("signatures");
    clean(unsigned)
}

/// The A2A card as served: the view plus its `signatures`.
pub fn served(card: &AgentCard) -> Option<Value> {
    let mut view = view(card)?;
    if let (Some(sig), Value::Object(map)) = (&card.a2a_signature, &mut view) {
        map.insert("signatures".into(), json!([sig]));
    }
    Some(view)
}

/// Is this JSON object an A2A card rather than an agentmesh card? agentmesh cards always name their
/// `agent_id`; A2A cards never do.
pub fn looks_like_a2a(value: &Value) -> bool {
    value.as_object().is_some_and(|m| !m.contains_key("agent_id") && m.contains_key("name"))
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct InCard {
    name: String,
    #[serde(default)]
    description: String,
    #[serde(default)]
    version: String,
    #[serde(default)]
    supported_interfaces: Vec<InInterface>,
    /// A2A 0.3's single URL, still sent by older agents.
    #[serde(default)]
    url: Option<String>,
    #[serde(default)]
    capabilities: InCapabilities,
    #[serde(default)]
    default_input_modes: Vec<String>,
    #[serde(default)]
    default_output_modes: Vec<String>,
    #[serde(default)]
    skills: Vec<InSkill>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct InInterface {
    url: String,
    #[serde(default)]
    protocol_binding: String,
    #[serde(default)]
    protocol_version: String,
}

#[derive(Default, Deserialize)]
struct InCapabilities {
    #[serde(default)]
    extensions: Vec<InExtension>,
}

#[derive(Deserialize)]
struct InExtension {
    #[serde(default)]
    uri: String,
    #[serde(default)]
    params: Value,
}

#[derive(Deserialize)]
struct InSkill {
    id: String,
    #[serde(default)]
    name: String,
    #[serde(default)]
    description: String,
    #[serde(default)]
    tags: Vec<String>,
    #[serde(default)]
    examples: Vec<String>,
}

/// Reads an A2A card (1.0, or 0.3's `url`) as an agentmesh card. The agentmesh extension, when present
/// (a card this daemon served), restores the agent id, reasoners and schemas exactly; otherwise the
/// agent id comes from the name and every A2A skill is a skill. Signatures on the input are not kept:
/// the node signs what it publishes.
pub fn from_a2a(value: Value) -> Result<AgentCard, CardError> {
    let input: InCard = serde_path_to_error::deserialize(value).map_err(|e| CardError::Malformed {
        field: match e.path().to_string() {
            p if p == "." => "card".to_owned(),
            p => p,
        },
        reason: e.inner().to_string(),
    })?;
    let ext = input
        .capabilities
        .extensions
        .into_iter()
        .find(|e| e.uri == EXTENSION_URI)
        .map(|e| e.params)
        .unwrap_or(Value::Null);
    let text = |key: &str| ext.get(key).and_then(Value::as_str).map(str::to_owned);
    let details = ext.get("skills").and_then(Value::as_object);
    let interfaces: Vec<Interface> = input
        .supported_interfaces
        .into_iter()
        .map(|i| Interface {
            url: i.url,
            protocol_binding: i.protocol_binding,
            protocol_version: i.protocol_version,
        })
        .collect();
    let base_url =
        text("base_url").or_else(|| interfaces.first().map(|i| i.url.clone())).or(input.url).ok_or_else(
            || CardError::invalid("supportedInterfaces", "needs at least one interface with a url"),
        )?;
    let agent_id = match text("agent_id") {
        Some(id) => id,
        None => id_from_name(&input.name)?,
    };
    let derived_interface = interfaces.len() == 1
        && interfaces[0].url == base_url
        && interfaces[0].protocol_binding == DEFAULT_BINDING
        && interfaces[0].protocol_version == PROTOCOL_VERSION;
    let mut card = AgentCard {
        name: input.name,
        description: input.description,
        version: if input.version.is_empty() { "0.0.0".into() } else { input.version },
        deployment_type: text("deployment_type").unwrap_or_else(|| "long_running".into()),
        tags: string_list(ext.get("tags")),
        category: text("category"),
        input_modes: non_empty_or_json(input.default_input_modes),
        output_modes: non_empty_or_json(input.default_output_modes),
        interfaces: if derived_interface { Vec::new() } else { interfaces },
        reasoners: Vec::new(),
        skills: Vec::new(),
        a2a_signature: None,
        agent_id,
        base_url,
    };
    for skill in input.skills {
        let detail = details.and_then(|d| d.get(&skill.id));
        let (kind, cap) = capability(skill, detail);
        if kind == "reasoner" {
            card.reasoners.push(cap);
        } else {
            card.skills.push(cap);
        }
    }
    if card.description == card.name {
        card.description.clear();
    }
    card.normalized()
}

fn capability(skill: InSkill, detail: Option<&Value>) -> (&'static str, Capability) {
    let field = |key: &str| detail.and_then(|d| d.get(key));
    let kind = if field("kind").and_then(Value::as_str) == Some("reasoner") { "reasoner" } else { "skill" };
    let id = field("id").and_then(Value::as_str).map_or(skill.id, str::to_owned);
    // With the extension, tags are the card's own (an untagged capability got its kind as its A2A tag).
    let tags = if detail.is_some() { string_list(field("tags")) } else { skill.tags };
    let name = (!skill.name.is_empty() && skill.name != id).then_some(skill.name);
    let shown_name = name.as_deref().unwrap_or(&id);
    let description =
        (!skill.description.is_empty() && skill.description != shown_name).then_some(skill.description);
    let examples = skill
        .examples
        .into_iter()
        .map(|e| match serde_json::from_str::<Value>(&e) {
            Ok(v @ (Value::Object(_) | Value::Array(_))) => to_raw(&v),
            _ => to_raw(&Value::String(e)),
        })
        .collect();
    let schema = |key: &str| field(key).filter(|v| v.is_object()).map(to_raw);
    let cap = Capability {
        category: field("category").and_then(Value::as_str).map(str::to_owned),
        requires: string_list(field("requires")),
        required_secrets: string_list(field("required_secrets")),
        has_side_effects: field("has_side_effects").and_then(Value::as_bool).unwrap_or(false),
        input_schema: schema("input_schema"),
        output_schema: schema("output_schema"),
        id,
        name,
        description,
        tags,
        examples,
    };
    (kind, cap)
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
fn id_from_name(name: &str) -> Result<String, CardError> {
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

#[cfg(test)]
mod tests;
