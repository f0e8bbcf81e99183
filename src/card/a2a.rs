//! The A2A 1.0 view of a card, its JWS signature, and A2A cards as input.
//!
//! The view is a pure function of the card, so every node derives the same A2A card from the same
//! canonical card JSON. The publishing node signs that view (JWS, EdDSA, detached payload over its RFC
//! 8785 canonical form, `kid` = the publisher's PeerId) and the signature travels inside the card
//! ([`AgentCard::a2a_signature`]), covered by the mesh envelope's signature: every node serves the
//! publisher's own signature, and checks it before it stores the card.
//!
//! What the A2A SDK signs and verifies is the card as its protobuf model sees it, with empty values
//! (`""`, `[]`, `{}`, `null`) removed at every depth. The parts of the view derived from agentmesh's
//! own fields are built in that form; the A2A fields a card holds as given ([`AgentCard::a2a`], checked
//! against the A2A model by [`schema`]) may keep empty values (a security requirement with no scopes),
//! so what is signed is the view [`clean`]ed: the bytes a verifier canonicalises. Numbers are
//! canonicalised as doubles, as both RFC 8785 and the SDK's `Struct` do.
//!
//! Layout: [`schema`] (the A2A 1.0 card's shape, and the walk that reads JSON against it), [`legacy`]
//! (A2A 0.3 cards read as 1.0), [`input`] (an A2A card as an agentmesh card, [`from_a2a`]), [`signed`]
//! (the bytes a card's signature covers, written from the card without building its view), `cleaned`
//! (the writer of clean canonical JSON it uses).

mod cleaned;
pub mod input;
mod jcs;
pub mod legacy;
pub mod schema;
pub mod signed;

use std::borrow::Cow;

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use libp2p::identity::{Keypair, PeerId};
use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};

pub use input::from_a2a;

use super::{AgentCard, Capability, CardError};

/// The extension that carries what A2A has no field for: the agent id, which A2A skills are reasoners,
/// input and output JSON schemas, card tags.
pub const EXTENSION_URI: &str = "urn:agentmesh:capabilities:v1";
/// The `description` of that extension in every view.
const EXTENSION_DESCRIPTION: &str = "agentmesh: agent id, reasoners, input and output JSON schemas";
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
        decode_header(&self.protected)
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

/// The A2A card of `card`, without `signatures`: what is served (the signature covers it [`clean`]ed).
/// `None` when the card has no reasoner or skill: an A2A card needs at least one skill.
pub fn view(card: &AgentCard) -> Option<Value> {
    if !card.has_a2a_view() {
        return None;
    }
    let (skills, details) = skills(card);
    let mut extras = held_fields(card.a2a.as_deref());
    let capabilities = capabilities(card, extras.remove("capabilities"), details);
    let description = if card.description.is_empty() { card.display_name() } else { &card.description };
    let mut view = Map::new();
    view.insert("name".into(), json!(card.display_name()));
    view.insert("description".into(), json!(description));
    view.insert("version".into(), json!(if card.version.is_empty() { "0.0.0" } else { &card.version }));
    move_fields(&mut extras, &mut view, &["provider", "documentationUrl", "iconUrl"]);
    view.insert("supportedInterfaces".into(), Value::Array(interfaces(card)));
    view.insert("capabilities".into(), capabilities);
    move_fields(&mut extras, &mut view, &["securitySchemes", "securityRequirements"]);
    for (key, modes) in [("defaultInputModes", &card.input_modes), ("defaultOutputModes", &card.output_modes)]
    {
        if let Some(modes) = clean(json!(modes)) {
            view.insert(key.into(), modes);
        }
    }
    view.insert("skills".into(), Value::Array(skills));
    Some(Value::Object(view))
}

/// The A2A skills of a card, reasoners first, and what the agentmesh extension says of each (by A2A
/// skill id).
fn skills(card: &AgentCard) -> (Vec<Value>, Map<String, Value>) {
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
                "has_side_effects": cap.has_side_effects.then_some(true),
                "confidence_hint": cap.confidence_hint, "metadata": cap.metadata}),
            );
        }
    }
    (skills, details)
}

fn interfaces(card: &AgentCard) -> Vec<Value> {
    if card.interfaces.is_empty() {
        return vec![json!({"url": card.base_url, "protocolBinding": DEFAULT_BINDING,
            "protocolVersion": PROTOCOL_VERSION})];
    }
    card.interfaces
        .iter()
        .filter_map(|i| {
            clean(json!({"url": i.url, "protocolBinding": i.protocol_binding,
            "protocolVersion": i.protocol_version, "tenant": i.tenant}))
        })
        .collect()
}

/// The card's held `capabilities` (flags, other extensions), with the agentmesh extension last.
fn capabilities(card: &AgentCard, held: Option<Value>, details: Map<String, Value>) -> Value {
    let own = clean(json!({
        "uri": EXTENSION_URI,
        "description": EXTENSION_DESCRIPTION,
        "params": {"agent_id": card.agent_id, "base_url": card.base_url,
            "deployment_type": card.deployment_type, "tags": card.tags,
            "category": card.category, "group_id": card.group_id, "metadata": card.metadata,
            "skills": details},
    }));
    let mut capabilities = match held {
        Some(Value::Object(map)) => map,
        _ => Map::new(),
    };
    let mut extensions = match capabilities.remove("extensions") {
        Some(Value::Array(list)) => list,
        _ => Vec::new(),
    };
    extensions.extend(own);
    capabilities.insert("extensions".into(), Value::Array(extensions));
    Value::Object(capabilities)
}

/// The A2A fields a card or capability holds (`a2a`, checked when the card was): an object, or none.
fn held_fields(raw: Option<&serde_json::value::RawValue>) -> Map<String, Value> {
    match raw.map(|r| serde_json::from_str(r.get())) {
        Some(Ok(Value::Object(map))) => map,
        _ => Map::new(),
    }
}

fn move_fields(from: &mut Map<String, Value>, to: &mut Map<String, Value>, keys: &[&str]) {
    for key in keys {
        if let Some(value) = from.remove(*key) {
            to.insert((*key).to_owned(), value);
        }
    }
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
    let derived = json!({"id": id, "name": name, "description": description, "tags": tags,
        "examples": examples, "inputModes": cap.input_modes, "outputModes": cap.output_modes});
    let mut skill = match clean(derived) {
        Some(Value::Object(map)) => map,
        _ => Map::new(),
    };
    skill.extend(held_fields(cap.a2a.as_deref()));
    Value::Object(skill)
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
    jcs::to_vec(value)
}

/// What is signed of a view: the view [`clean`]ed, as A2A verifiers compute it.
fn payload(view: &Value) -> Cow<'_, Value> {
    if is_clean(view) {
        Cow::Borrowed(view)
    } else {
        Cow::Owned(clean(view.clone()).unwrap_or(Value::Null))
    }
}

fn is_clean(value: &Value) -> bool {
    match value {
        Value::Null => false,
        Value::String(s) => !s.is_empty(),
        Value::Array(items) => !items.is_empty() && items.iter().all(is_clean),
        Value::Object(map) => !map.is_empty() && map.values().all(is_clean),
        _ => true,
    }
}

/// The JWS signing input over `payload`, the canonical bytes of a clean view.
fn signing_input(protected: &str, payload: &[u8]) -> String {
    format!("{protected}.{}", URL_SAFE_NO_PAD.encode(payload))
}

/// What is signed of `view`, as bytes. A card's own view is not built to be signed or checked: its
/// bytes are written straight from the card by [`signed::payload_bytes`].
fn payload_of(view: &Value) -> Vec<u8> {
    canonical(&payload(view))
}

/// The protected header of every JWS this node makes: EdDSA, `kid` its PeerId.
fn protected_header(key: &Keypair) -> String {
    let header = json!({"alg": JWS_ALG, "typ": "JOSE", "kid": key.public().to_peer_id().to_base58()});
    URL_SAFE_NO_PAD.encode(canonical(&header))
}

/// A detached JWS in compact form (`protected..signature`, RFC 7515 appendix F) over `payload` as
/// `key`'s node: what this node's AI Catalog and webhook deliveries carry.
pub fn detached_jws(key: &Keypair, payload: &[u8]) -> String {
    let protected = protected_header(key);
    let input = format!("{protected}.{}", URL_SAFE_NO_PAD.encode(payload));
    let signature = key.sign(input.as_bytes()).unwrap_or_default();
    format!("{protected}..{}", URL_SAFE_NO_PAD.encode(signature))
}

/// Signs what an A2A view's signature covers (its clean canonical bytes, [`signed::payload_bytes`]) as
/// `key`'s node.
pub fn sign_payload(key: &Keypair, payload: &[u8]) -> JwsSignature {
    let protected = protected_header(key);
    let signature = key.sign(signing_input(&protected, payload).as_bytes()).unwrap_or_default();
    JwsSignature { protected, signature: URL_SAFE_NO_PAD.encode(signature) }
}

/// Checks that `sig` is `publisher`'s EdDSA signature over `view`. The key comes from the PeerId the
/// mesh envelope was verified against, never from the header.
pub fn verify(publisher: &PeerId, view: &Value, sig: &JwsSignature) -> Result<(), SignatureError> {
    verify_payload(publisher, &payload_of(view), sig)
}

/// [`verify`] over a view's clean canonical bytes.
pub fn verify_payload(publisher: &PeerId, payload: &[u8], sig: &JwsSignature) -> Result<(), SignatureError> {
    let claim = claim_payload(publisher, payload, sig)?;
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

/// The claim of `sig` over `payload`, a view's clean canonical bytes.
pub fn claim_payload(
    publisher: &PeerId,
    payload: &[u8],
    sig: &JwsSignature,
) -> Result<Claim, SignatureError> {
    check_header(publisher, &sig.protected)?;
    let signature = URL_SAFE_NO_PAD.decode(&sig.signature).map_err(|_| SignatureError::Invalid)?;
    Ok(Claim { input: signing_input(&sig.protected, payload).into_bytes(), signature })
}

/// A protected header (base64url of its JSON), decoded.
fn decode_header(protected: &str) -> Result<Value, SignatureError> {
    let bytes = URL_SAFE_NO_PAD.decode(protected).map_err(|e| SignatureError::Header(e.to_string()))?;
    serde_json::from_slice(&bytes).map_err(|e| SignatureError::Header(e.to_string()))
}

/// Protected headers found acceptable, per thread: for each publisher, the last header that named
/// EdDSA and that publisher as `kid`. A publisher signs all its cards under the same header, so a mesh
/// catching up checks each publisher's header once instead of decoding it, parsing its JSON and
/// writing the publisher's id in base58 for every card. Emptied when it holds this many publishers.
pub const HEADER_CACHE: usize = 1024;

/// Does the protected header name EdDSA and `publisher` as its `kid`? A pure function of its two
/// arguments; [`HEADER_CACHE`] remembers the answers that were yes.
fn check_header(publisher: &PeerId, protected: &str) -> Result<(), SignatureError> {
    thread_local! {
        static ACCEPTED: std::cell::RefCell<crate::identity::PerPublisher<String>> =
            std::cell::RefCell::new(crate::identity::PerPublisher::new(HEADER_CACHE));
    }
    let known = ACCEPTED.with(|cache| cache.borrow().get(publisher).is_some_and(|h| h == protected));
    if known {
        return Ok(());
    }
    let header = decode_header(protected)?;
    if header.get("alg").and_then(Value::as_str) != Some(JWS_ALG) {
        return Err(SignatureError::Algorithm);
    }
    if header.get("kid").and_then(Value::as_str) != Some(publisher.to_base58().as_str()) {
        return Err(SignatureError::KeyId);
    }
    ACCEPTED.with(|cache| cache.borrow_mut().insert(*publisher, protected.to_owned()));
    Ok(())
}

/// What the `signatures` of an A2A card as received cover: the card without them as the A2A model
/// reads it (fields A2A does not define dropped, `false` flags without presence left out), with empty
/// values removed, as A2A verifiers compute it. Verify over this, never over a card rebuilt from a
/// model. `None` when the card does not read as an A2A card.
pub fn signed_payload(card: &Value) -> Option<Value> {
    let mut unsigned = card.as_object()?.clone();
    unsigned.remove("signatures");
    let read = schema::normalize(Value::Object(unsigned), &schema::CARD, "", schema::Unknown::Drop).ok()?;
    clean(Value::Object(read))
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

#[cfg(test)]
mod tests;
