//! The agent card: one record type for an agent, and the rules a card must meet before it enters the
//! registry (from a local registration or, later, from the mesh).
//!
//! Schemas and examples are kept as raw, minified JSON: the query path copies them into responses
//! without re-encoding, and a parsed `serde_json::Value` tree would cost several times the memory.

pub mod a2a;
mod compact;
pub mod foreign;
pub mod held;
pub mod reported;

pub use a2a::JwsSignature;
pub use held::{CardText, HeldCard};

use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

/// Longest card text read at all: the bound on JSON before it is parsed, and on a stored card's
/// text (a card at `MAX_CARD_BYTES` grows past it when signed, and its input may carry whitespace).
pub const MAX_CARD_TEXT: usize = MAX_CARD_BYTES * 4;

use crate::defaults::{
    MAX_CAPABILITIES, MAX_CARD_BYTES, MAX_ID_LEN, MAX_INTERFACES, MAX_METADATA, MAX_REQUIRES, MAX_SHORT_TEXT,
    MAX_TAGS, MAX_TAG_LEN, MAX_TARGET_LEN, MAX_URL_LEN,
};

/// Why a card was refused. `field` is a path into the card (`reasoners[2].id`).
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum CardError {
    #[error("malformed card JSON at `{field}`: {reason}")]
    Malformed { field: String, reason: String },
    #[error("invalid card field `{field}`: {reason}")]
    Invalid { field: String, reason: String },
    #[error("card is {size} bytes, over the {max} byte limit")]
    TooLarge { size: usize, max: usize },
}

impl CardError {
    /// The same error with its field named inside `at` (`id` within `skills[2]` is `skills[2].id`):
    /// paths are built only for an error, not for every field checked.
    fn within(self, at: &str) -> Self {
        match self {
            Self::Malformed { field, reason } => Self::Malformed { field: format!("{at}.{field}"), reason },
            Self::Invalid { field, reason } => Self::Invalid { field: format!("{at}.{field}"), reason },
            other => other,
        }
    }
}

/// Expands `${NAME}` placeholders in a card file from `lookup` (the environment), so that one card file
/// can serve many replicas: `"agent_id": "summarizer-${HOSTNAME}"`. Values are limited to the characters
/// an agent id may hold, so an expansion can never change the JSON's structure. Pure.
pub fn expand_placeholders(text: &str, lookup: impl Fn(&str) -> Option<String>) -> Result<String, CardError> {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(start) = rest.find("${") {
        out.push_str(&rest[..start]);
        let after = &rest[start + 2..];
        let end =
            after.find('}').ok_or_else(|| CardError::invalid("${", "placeholder without a closing `}`"))?;
        let name = &after[..end];
        let valid_name = !name.is_empty()
            && !name.starts_with(|c: char| c.is_ascii_digit())
            && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
        if !valid_name {
            return Err(CardError::invalid(format!("${{{name}}}"), "not a variable name"));
        }
        let value =
            lookup(name).ok_or_else(|| CardError::invalid(format!("${{{name}}}"), "variable is not set"))?;
        if value.is_empty() || !value.chars().all(|c| c.is_ascii_alphanumeric() || "._-".contains(c)) {
            return Err(CardError::invalid(
                format!("${{{name}}}"),
                "value must be letters, digits, '.', '_' or '-'",
            ));
        }
        out.push_str(&value);
        rest = &after[end + 1..];
    }
    out.push_str(rest);
    Ok(out)
}

impl CardError {
    fn invalid(field: impl Into<String>, reason: impl Into<String>) -> Self {
        Self::Invalid { field: field.into(), reason: reason.into() }
    }

    /// The card field the error is about, if any.
    pub fn field(&self) -> Option<&str> {
        match self {
            Self::Malformed { field, .. } | Self::Invalid { field, .. } => Some(field),
            Self::TooLarge { .. } => None,
        }
    }
}

/// An agent as the mesh knows it. Field names follow AgentField's node model; the A2A view is derived.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AgentCard {
    pub agent_id: String,
    /// Human name; defaults to the agent id.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub name: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub description: String,
    #[serde(default = "default_version")]
    pub version: String,
    /// The group the agent belongs to (AgentField's `group_id`: replicas and versions of one service);
    /// none: the agent id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group_id: Option<String>,
    pub base_url: String,
    #[serde(default = "default_deployment_type")]
    pub deployment_type: String,
    #[serde(default)]
    pub tags: Vec<String>,
    /// A short lower-case word (`weather`) that groups the agent's capabilities in search and in the
    /// context tiers; a capability without its own inherits it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub category: Option<String>,
    /// Free key/value facts about the agent (`owner_team`, `tenant_scope`, …), filterable in discovery
    /// as `metadata.KEY=VALUE`; a capability's own entries override these for that capability.
    #[serde(default, skip_serializing_if = "Metadata::is_empty")]
    pub metadata: Metadata,
    #[serde(default)]
    pub reasoners: Vec<Capability>,
    #[serde(default)]
    pub skills: Vec<Capability>,
    /// A2A `defaultInputModes` (media types).
    #[serde(default = "default_modes")]
    pub input_modes: Vec<String>,
    /// A2A `defaultOutputModes` (media types).
    #[serde(default = "default_modes")]
    pub output_modes: Vec<String>,
    /// A2A `supportedInterfaces`. Empty: one `HTTP+JSON` interface at `base_url`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub interfaces: Vec<Interface>,
    /// The A2A fields the card has no field of its own for, as an A2A 1.0 card writes them:
    /// `provider`, `documentationUrl`, `iconUrl`, `capabilities` (`streaming`, `pushNotifications`,
    /// `extendedAgentCard`, `extensions` other than agentmesh's own), `securitySchemes`,
    /// `securityRequirements`. Held minified, checked against the A2A model ([`a2a::schema`]), and
    /// served in the card's A2A view.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub a2a: Option<Box<RawValue>>,
    /// The publisher's JWS over the card's A2A view ([`a2a`]). Set by the publishing node, checked by
    /// every node that receives the card; whatever a registering client puts here is replaced.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub a2a_signature: Option<JwsSignature>,
}

/// One A2A interface: where and how the agent is reached.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Interface {
    pub url: String,
    /// `JSONRPC`, `GRPC` or `HTTP+JSON`.
    pub protocol_binding: String,
    /// The A2A protocol version the interface speaks (`1.0`).
    pub protocol_version: String,
    /// A2A `tenant`: the tenant to name in requests sent to this interface, if any.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub tenant: String,
}

/// A reasoner or a skill.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Capability {
    pub id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    #[serde(default)]
    pub tags: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input_schema: Option<Box<RawValue>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_schema: Option<Box<RawValue>>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub examples: Vec<Box<RawValue>>,
    /// The capability's own category; none: the agent's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub category: Option<String>,
    /// What it depends on: targets (`agent_id:kind:id`), bare capability ids or tool names.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub requires: Vec<String>,
    /// Names of the secrets it needs to run (names only, never values).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub required_secrets: Vec<String>,
    /// Whether calling it changes something outside (sends, writes, pays, deletes).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub has_side_effects: bool,
    /// How well the agent expects to do this, 0 to 1 (AgentSpec's `confidence_hint`): `resolve` prefers
    /// the higher among otherwise equal targets.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub confidence_hint: Option<f64>,
    /// Key/value facts about this capability, over the agent's.
    #[serde(default, skip_serializing_if = "Metadata::is_empty")]
    pub metadata: Metadata,
    /// A2A `inputModes`: the media types it takes. Empty: the card's `input_modes`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub input_modes: Vec<String>,
    /// A2A `outputModes`: the media types it answers with. Empty: the card's `output_modes`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub output_modes: Vec<String>,
    /// The A2A skill fields it has no field of its own for (`securityRequirements`), as an A2A 1.0
    /// card writes them; held like the card's `a2a`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub a2a: Option<Box<RawValue>>,
}

/// Key/value metadata, in key order (so the card's canonical JSON is stable).
pub type Metadata = std::collections::BTreeMap<String, String>;

/// An empty card with the defaults a JSON card gets for what it leaves out (for building cards in code).
impl Default for AgentCard {
    fn default() -> Self {
        Self {
            agent_id: String::new(),
            name: String::new(),
            description: String::new(),
            version: default_version(),
            group_id: None,
            base_url: String::new(),
            deployment_type: default_deployment_type(),
            tags: Vec::new(),
            category: None,
            metadata: Metadata::new(),
            reasoners: Vec::new(),
            skills: Vec::new(),
            input_modes: default_modes(),
            output_modes: default_modes(),
            interfaces: Vec::new(),
            a2a: None,
            a2a_signature: None,
        }
    }
}

fn default_version() -> String {
    "0.0.0".to_owned()
}

fn default_deployment_type() -> String {
    "long_running".to_owned()
}

fn default_modes() -> Vec<String> {
    vec!["application/json".to_owned()]
}

impl AgentCard {
    /// Parses and validates a card from JSON. Type errors name the offending field.
    pub fn from_json(bytes: &[u8]) -> Result<Self, CardError> {
        if bytes.len() > MAX_CARD_TEXT {
            return Err(CardError::TooLarge { size: bytes.len(), max: MAX_CARD_BYTES });
        }
        // Tracking the path slows every parse down, and only an error reads it: a card that parses is
        // taken as it is, one that does not is parsed again to name the field.
        if let Ok(card) = serde_json::from_slice::<AgentCard>(bytes) {
            return card.normalized();
        }
        let de = &mut serde_json::Deserializer::from_slice(bytes);
        let card: AgentCard = serde_path_to_error::deserialize(de).map_err(|e| {
            let field = match e.path().to_string() {
                p if p == "?" || p == "." => "card".to_owned(),
                p => p,
            };
            CardError::Malformed { field, reason: e.inner().to_string() }
        })?;
        card.normalized()
    }

    /// Minifies schemas and examples, fills defaults, then validates. The result is what gets stored.
    pub fn normalized(mut self) -> Result<Self, CardError> {
        if self.name.is_empty() {
            self.name = self.agent_id.clone();
        }
        for (list, kind) in [(&mut self.reasoners, "reasoners"), (&mut self.skills, "skills")] {
            for (i, cap) in list.iter_mut().enumerate() {
                cap.minify().map_err(|e| e.within(&format!("{kind}[{i}]")))?;
            }
        }
        self.a2a = a2a::schema::held(self.a2a.take(), &a2a::schema::CARD_EXTRAS, "a2a")?;
        self.validate()?;
        Ok(self)
    }

    /// The card as stored and signed: compact JSON.
    pub fn to_json(&self) -> Vec<u8> {
        // A card is plain data (strings, vectors, raw JSON): serialising it cannot fail.
        serde_json::to_vec(self).unwrap_or_default()
    }

    /// Checks every rule a stored card meets. Pure; called on every path into the registry.
    pub fn validate(&self) -> Result<(), CardError> {
        check_id("agent_id", &self.agent_id)?;
        check_text("name", &self.name, MAX_SHORT_TEXT)?;
        check_text("version", &self.version, MAX_SHORT_TEXT)?;
        check_text("deployment_type", &self.deployment_type, MAX_SHORT_TEXT)?;
        check_url("base_url", &self.base_url)?;
        check_tags("tags", &self.tags)?;
        if let Some(category) = &self.category {
            check_category("category", category)?;
        }
        if let Some(group) = &self.group_id {
            check_id("group_id", group)?;
        }
        check_metadata("metadata", &self.metadata)?;
        check_modes("input_modes", &self.input_modes)?;
        check_modes("output_modes", &self.output_modes)?;
        if self.interfaces.len() > MAX_INTERFACES {
            return Err(CardError::invalid("interfaces", format!("more than {MAX_INTERFACES} interfaces")));
        }
        for (i, iface) in self.interfaces.iter().enumerate() {
            check_interface_url(&format!("interfaces[{i}].url"), &iface.url)?;
            // A binding is a name (`JSONRPC`) or, for a custom binding, a URI.
            for (text, name, max) in [
                (&iface.protocol_binding, "protocol_binding", MAX_SHORT_TEXT),
                (&iface.protocol_version, "protocol_version", MAX_TAG_LEN),
            ] {
                if text.is_empty() || text.len() > max || text.chars().any(char::is_control) {
                    return Err(CardError::invalid(
                        format!("interfaces[{i}].{name}"),
                        format!("must be 1 to {max} bytes, without control characters"),
                    ));
                }
            }
            check_text(&format!("interfaces[{i}].tenant"), &iface.tenant, MAX_SHORT_TEXT)?;
        }
        if let Some(raw) = &self.a2a {
            a2a::schema::check_held(raw, &a2a::schema::CARD_EXTRAS, "a2a")?;
        }
        if let Some(sig) = &self.a2a_signature {
            sig.validate()?;
        }
        let count = self.reasoners.len() + self.skills.len();
        if count > MAX_CAPABILITIES {
            return Err(CardError::invalid(
                "reasoners",
                format!("{count} reasoners and skills, over the limit of {MAX_CAPABILITIES}"),
            ));
        }
        for (list, kind) in [(&self.reasoners, "reasoners"), (&self.skills, "skills")] {
            let mut seen = std::collections::HashSet::new();
            for (i, cap) in list.iter().enumerate() {
                cap.validate().map_err(|e| e.within(&format!("{kind}[{i}]")))?;
                if !seen.insert(cap.id.as_str()) {
                    return Err(CardError::invalid(format!("{kind}[{i}].id"), "duplicate id"));
                }
            }
        }
        // The A2A signature is left out of the size, so that signing a valid card never makes it invalid
        // (the signature has its own bound, `MAX_JWS_PART`).
        let signature = self
            .a2a_signature
            .as_ref()
            .map_or(0, |s| serde_json::to_vec(s).map_or(0, |json| json.len()) + r#","a2a_signature":"#.len());
        let size = self.to_json().len() - signature;
        if size > MAX_CARD_BYTES {
            return Err(CardError::TooLarge { size, max: MAX_CARD_BYTES });
        }
        Ok(())
    }

    /// The card signed as `key`'s node: its A2A signature made (or dropped when it has no A2A view).
    /// Ed25519 is deterministic, so the same card always comes out the same.
    pub fn signed(mut self, key: &libp2p::identity::Keypair) -> Self {
        self.a2a_signature = None;
        self.a2a_signature =
            a2a::signed::payload_bytes(&self).map(|payload| a2a::sign_payload(key, &payload));
        self
    }

    /// Whether the card has an A2A view (and so must carry an A2A signature): A2A needs a skill.
    pub fn has_a2a_view(&self) -> bool {
        !(self.reasoners.is_empty() && self.skills.is_empty())
    }

    /// Checks the card's A2A signature as `publisher`'s: present exactly when the card has an A2A view,
    /// and valid over it.
    pub fn verify_a2a(&self, publisher: &libp2p::PeerId) -> Result<(), a2a::SignatureError> {
        match (a2a::signed::payload_bytes(self), &self.a2a_signature) {
            (None, None) => Ok(()),
            (None, Some(_)) => Err(a2a::SignatureError::Unexpected),
            (Some(_), None) => Err(a2a::SignatureError::Missing),
            (Some(payload), Some(sig)) => a2a::verify_payload(publisher, &payload, sig),
        }
    }

    /// What [`verify_a2a`](Self::verify_a2a) checks, with the signature itself left to the caller (to
    /// verify many in one batch): `None` when the card has no A2A view and no signature.
    pub fn a2a_claim(&self, publisher: &libp2p::PeerId) -> Result<Option<a2a::Claim>, a2a::SignatureError> {
        match (a2a::signed::payload_bytes(self), &self.a2a_signature) {
            (None, None) => Ok(None),
            (None, Some(_)) => Err(a2a::SignatureError::Unexpected),
            (Some(_), None) => Err(a2a::SignatureError::Missing),
            (Some(payload), Some(sig)) => a2a::claim_payload(publisher, &payload, sig).map(Some),
        }
    }

    /// Parses a card in any form it is registered in: an agentmesh card; an AgentSpec document
    /// (`agent_type`) or an openribcage card (`endpoints`, or `capabilities` as names), see [`foreign`];
    /// or an A2A card (no `agent_id`).
    pub fn from_json_any(bytes: &[u8]) -> Result<Self, CardError> {
        if bytes.len() > MAX_CARD_TEXT {
            return Err(CardError::TooLarge { size: bytes.len(), max: MAX_CARD_BYTES });
        }
        let value: serde_json::Value = serde_json::from_slice(bytes)
            .map_err(|e| CardError::Malformed { field: "card".into(), reason: e.to_string() })?;
        if foreign::looks_like_agentspec(&value) {
            foreign::from_agentspec(value)
        } else if foreign::looks_like_openribcage(&value) {
            foreign::from_openribcage(value)
        } else if a2a::looks_like_a2a(&value) {
            a2a::from_a2a(value)
        } else {
            Self::from_json(bytes)
        }
    }

    /// Human name for display and the A2A view.
    pub fn display_name(&self) -> &str {
        if self.name.is_empty() {
            &self.agent_id
        } else {
            &self.name
        }
    }
}

impl Capability {
    /// Minifies schemas and examples, then checks the rules one capability meets on its own (those of
    /// a whole card, such as unique ids and the size limit, are [`AgentCard::validate`]'s). `at` prefixes
    /// the field paths of errors (`skills[2]`). Lets a caller refuse one bad capability and keep the rest.
    pub fn normalized(mut self, at: &str) -> Result<Self, CardError> {
        self.minify().and_then(|()| self.validate()).map_err(|e| e.within(at))?;
        Ok(self)
    }

    fn minify(&mut self) -> Result<(), CardError> {
        for (slot, name) in
            [(&mut self.input_schema, "input_schema"), (&mut self.output_schema, "output_schema")]
        {
            if let Some(raw) = slot.take() {
                // A publisher's card arrives normalised: keep a schema already in its compact form.
                if raw.get().starts_with('{') && compact::is_compact(raw.get()) {
                    *slot = Some(raw);
                    continue;
                }
                let value: serde_json::Value = serde_json::from_str(raw.get())
                    .map_err(|e| CardError::Malformed { field: name.into(), reason: e.to_string() })?;
                if !value.is_object() {
                    return Err(CardError::invalid(name, "must be a JSON object"));
                }
                *slot = Some(to_raw(&value));
            }
        }
        for example in &mut self.examples {
            if compact::is_compact(example.get()) {
                continue;
            }
            let value: serde_json::Value = serde_json::from_str(example.get())
                .map_err(|e| CardError::Malformed { field: "examples".into(), reason: e.to_string() })?;
            *example = to_raw(&value);
        }
        self.a2a = a2a::schema::held(self.a2a.take(), &a2a::schema::SKILL_EXTRAS, "a2a")?;
        Ok(())
    }

    fn validate(&self) -> Result<(), CardError> {
        check_id("id", &self.id)?;
        if let Some(name) = &self.name {
            check_text("name", name, MAX_SHORT_TEXT)?;
        }
        check_tags("tags", &self.tags)?;
        if let Some(category) = &self.category {
            check_category("category", category)?;
        }
        check_names("requires", &self.requires, MAX_REQUIRES, MAX_TARGET_LEN, ":")?;
        check_names("required_secrets", &self.required_secrets, MAX_REQUIRES, MAX_TAG_LEN, "")?;
        if let Some(hint) = self.confidence_hint {
            if !(0.0..=1.0).contains(&hint) {
                return Err(CardError::invalid("confidence_hint", "must be a number from 0 to 1"));
            }
        }
        check_metadata("metadata", &self.metadata)?;
        for (slot, name) in [(&self.input_schema, "input_schema"), (&self.output_schema, "output_schema")] {
            if let Some(raw) = slot {
                if !raw.get().starts_with('{') {
                    return Err(CardError::invalid(name, "must be a JSON object"));
                }
            }
        }
        check_tags("input_modes", &self.input_modes)?;
        check_tags("output_modes", &self.output_modes)?;
        if let Some(raw) = &self.a2a {
            a2a::schema::check_held(raw, &a2a::schema::SKILL_EXTRAS, "a2a")?;
        }
        Ok(())
    }
}

/// Raw JSON of a value that came from JSON: re-encoding cannot fail.
pub(crate) fn to_raw(value: &serde_json::Value) -> Box<RawValue> {
    serde_json::value::to_raw_value(value)
        .unwrap_or_else(|_| RawValue::from_string("null".to_owned()).unwrap_or_default())
}

/// Ids appear in invocation targets (`agent:reasoner`, `agent:skill:id`) and URL paths, so they keep to
/// a charset that needs no escaping anywhere and has no `:`.
pub fn check_id(field: &str, id: &str) -> Result<(), CardError> {
    if id.is_empty() {
        return Err(CardError::invalid(field, "must not be empty"));
    }
    if id.len() > MAX_ID_LEN {
        return Err(CardError::invalid(field, format!("longer than {MAX_ID_LEN} bytes")));
    }
    if let Some(bad) = id.chars().find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'))) {
        return Err(CardError::invalid(
            field,
            format!("character {bad:?} not allowed (use A-Z a-z 0-9 _ - .)"),
        ));
    }
    Ok(())
}

fn check_text(field: &str, text: &str, max: usize) -> Result<(), CardError> {
    if text.len() > max {
        return Err(CardError::invalid(field, format!("longer than {max} bytes")));
    }
    Ok(())
}

fn check_url(field: &str, url: &str) -> Result<(), CardError> {
    if url.is_empty() {
        return Err(CardError::invalid(field, "must not be empty"));
    }
    if url.len() > MAX_URL_LEN {
        return Err(CardError::invalid(field, format!("longer than {MAX_URL_LEN} bytes")));
    }
    // An agent reached over NATS (AgentSpec) is named by its subject: `nats:agents.payments.refund`.
    if let Some(subject) = url.strip_prefix(foreign::NATS_SCHEME) {
        let ok =
            !subject.is_empty() && subject.chars().all(|c| c.is_ascii_alphanumeric() || "._-*>".contains(c));
        return if ok {
            Ok(())
        } else {
            Err(CardError::invalid(field, "a nats: URL names a subject (A-Z a-z 0-9 . _ - * >)"))
        };
    }
    let rest = url.strip_prefix("http://").or_else(|| url.strip_prefix("https://"));
    match rest {
        Some(host) if !host.is_empty() && !host.contains(char::is_whitespace) => Ok(()),
        _ => Err(CardError::invalid(field, "must be an http:// or https:// URL (or nats:SUBJECT)")),
    }
}

/// An A2A interface may be reached over other schemes than HTTP (`wss://`, a custom binding's), so
/// its URL needs only a scheme and something after it; or it is a NATS subject (`nats:SUBJECT`).
fn check_interface_url(field: &str, url: &str) -> Result<(), CardError> {
    if url.starts_with(foreign::NATS_SCHEME) {
        return check_url(field, url);
    }
    if url.is_empty() || url.len() > MAX_URL_LEN {
        return Err(CardError::invalid(field, format!("must be 1 to {MAX_URL_LEN} bytes")));
    }
    let ok = url.split_once("://").is_some_and(|(scheme, rest)| {
        scheme.starts_with(|c: char| c.is_ascii_alphabetic())
            && scheme.chars().all(|c| c.is_ascii_alphanumeric() || "+-.".contains(c))
            && !rest.is_empty()
            && !rest.contains(char::is_whitespace)
    });
    if ok {
        Ok(())
    } else {
        Err(CardError::invalid(field, "must be a URL (scheme://...)"))
    }
}

fn check_tags(field: &str, tags: &[String]) -> Result<(), CardError> {
    if tags.len() > MAX_TAGS {
        return Err(CardError::invalid(field, format!("more than {MAX_TAGS} tags")));
    }
    for (i, tag) in tags.iter().enumerate() {
        if tag.is_empty() || tag.len() > MAX_TAG_LEN {
            return Err(CardError::invalid(
                format!("{field}[{i}]"),
                format!("must be 1 to {MAX_TAG_LEN} bytes"),
            ));
        }
        if tag.chars().any(|c| c.is_control() || c == ',') {
            return Err(CardError::invalid(
                format!("{field}[{i}]"),
                "control characters and ',' are not allowed",
            ));
        }
    }
    Ok(())
}

/// A category is a short word: lower-case letters, digits, `_` and `-`, at most `MAX_TAG_LEN` bytes.
fn check_category(field: &str, category: &str) -> Result<(), CardError> {
    let ok = !category.is_empty()
        && category.len() <= MAX_TAG_LEN
        && category.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'-');
    if ok {
        Ok(())
    } else {
        Err(CardError::invalid(
            field,
            format!("must be 1 to {MAX_TAG_LEN} bytes of a-z 0-9 _ - (a short lower-case word)"),
        ))
    }
}

/// A list of names (`requires`, `required_secrets`): at most `max` entries of 1 to `len` bytes, in the
/// id charset plus `extra`.
fn check_names(field: &str, names: &[String], max: usize, len: usize, extra: &str) -> Result<(), CardError> {
    if names.len() > max {
        return Err(CardError::invalid(field, format!("more than {max} entries")));
    }
    for (i, name) in names.iter().enumerate() {
        let ok = !name.is_empty()
            && name.len() <= len
            && name.chars().all(|c| c.is_ascii_alphanumeric() || "_-.".contains(c) || extra.contains(c));
        if !ok {
            return Err(CardError::invalid(
                format!("{field}[{i}]"),
                format!("must be 1 to {len} bytes of A-Z a-z 0-9 _ - .{extra}"),
            ));
        }
    }
    Ok(())
}

/// Metadata: at most `MAX_METADATA` entries; keys of 1 to `MAX_TAG_LEN` bytes in the id charset (so
/// `metadata.KEY=` parses the same everywhere), values of at most `MAX_SHORT_TEXT` bytes with no control
/// characters.
pub fn check_metadata(field: &str, metadata: &Metadata) -> Result<(), CardError> {
    if metadata.len() > MAX_METADATA {
        return Err(CardError::invalid(field, format!("more than {MAX_METADATA} entries")));
    }
    for (key, value) in metadata {
        if !metadata_key_ok(key) {
            return Err(CardError::invalid(
                format!("{field}.{key}"),
                format!("keys must be 1 to {MAX_TAG_LEN} bytes of A-Z a-z 0-9 _ - ."),
            ));
        }
        if !metadata_value_ok(value) {
            return Err(CardError::invalid(
                format!("{field}.{key}"),
                format!("values must be at most {MAX_SHORT_TEXT} bytes with no control characters"),
            ));
        }
    }
    Ok(())
}

fn metadata_key_ok(key: &str) -> bool {
    !key.is_empty()
        && key.len() <= MAX_TAG_LEN
        && key.chars().all(|c| c.is_ascii_alphanumeric() || "_-.".contains(c))
}

fn metadata_value_ok(value: &str) -> bool {
    value.len() <= MAX_SHORT_TEXT && !value.chars().any(char::is_control)
}

/// The entries a card's metadata can hold, at most `MAX_METADATA` of them: for documents from other
/// registries (AgentField's `metadata.custom`, AgentSpec, openribcage), whose extra fields must not
/// make a registration fail.
pub fn keep_metadata(entries: impl IntoIterator<Item = (String, String)>) -> Metadata {
    entries
        .into_iter()
        .filter(|(k, v)| metadata_key_ok(k) && metadata_value_ok(v))
        .take(MAX_METADATA)
        .collect()
}

fn check_modes(field: &str, modes: &[String]) -> Result<(), CardError> {
    if modes.is_empty() {
        return Err(CardError::invalid(field, "needs at least one media type"));
    }
    check_tags(field, modes)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn card(json: &str) -> Result<AgentCard, CardError> {
        AgentCard::from_json(json.as_bytes())
    }

    /// Every node re-parses a card it hears and refuses it unless the stored form comes out the same, so
    /// the stored form must be a fixed point, numbers too (found by fuzzing: an 85-digit integer
    /// parsed inexactly came out one ULP off on the second parse).
    #[test]
    fn the_stored_form_is_a_fixed_point_even_for_huge_numbers() {
        let huge = "2".repeat(85);
        let json = format!(
            r#"{{"agent_id":"a","base_url":"http://h","skills":[{{"id":"s","examples":[{{"n":{huge}0}},{{"x":0.1e-320}},{{"y":1.7976931348623157e308}}]}}]}}"#
        );
        let stored = card(&json).unwrap().to_json();
        assert_eq!(AgentCard::from_json(&stored).unwrap().to_json(), stored);
    }

    #[test]
    fn minimal_card_gets_defaults() {
        let c = card(r#"{"agent_id":"a1","base_url":"http://127.0.0.1:9000"}"#).unwrap();
        assert_eq!(c.name, "a1");
        assert_eq!(c.version, "0.0.0");
        assert_eq!(c.deployment_type, "long_running");
        assert_eq!(c.input_modes, vec!["application/json"]);
    }

    #[test]
    fn schemas_are_minified_and_keep_key_order() {
        let c = card(
            r#"{"agent_id":"a","base_url":"http://x","reasoners":[{"id":"r","input_schema":{ "z": 1, "a" : 2 }}]}"#,
        )
        .unwrap();
        assert_eq!(c.reasoners[0].input_schema.as_ref().unwrap().get(), r#"{"z":1,"a":2}"#);
    }

    #[test]
    fn errors_name_the_field() {
        let e = card(r#"{"agent_id":"a","base_url":"http://x","reasoners":[{"id":"ok"},{"id":"bad id"}]}"#)
            .unwrap_err();
        assert_eq!(e.field(), Some("reasoners[1].id"));
        let e =
            card(r#"{"agent_id":"a","base_url":"http://x","skills":[{"id":"s","tags":[1]}]}"#).unwrap_err();
        assert_eq!(e.field(), Some("skills[0].tags[0]"));
        let e = card(r#"{"agent_id":"a","base_url":"http://x","skills":[{"id":"s","input_schema":[1]}]}"#)
            .unwrap_err();
        assert_eq!(e.field(), Some("skills[0].input_schema"));
        let e = card(r#"{"agent_id":"","base_url":"http://x"}"#).unwrap_err();
        assert_eq!(e.field(), Some("agent_id"));
        let e = card(r#"{"agent_id":"a","base_url":"ftp://x"}"#).unwrap_err();
        assert_eq!(e.field(), Some("base_url"));
        let e = card(r#"{"agent_id":"a","base_url":"http://x","surprise":1}"#).unwrap_err();
        assert!(matches!(e, CardError::Malformed { .. }));
        let e =
            card(r#"{"agent_id":"a","base_url":"http://x","skills":[{"id":"s"},{"id":"s"}]}"#).unwrap_err();
        assert_eq!(e.field(), Some("skills[1].id"));
    }

    #[test]
    fn ids_are_bounded() {
        assert!(check_id("x", &"a".repeat(MAX_ID_LEN)).is_ok());
        assert!(check_id("x", &"a".repeat(MAX_ID_LEN + 1)).is_err());
        assert!(check_id("x", "a:b").is_err());
    }

    #[test]
    fn signing_a_card_at_the_size_limit_keeps_it_valid() {
        let key = libp2p::identity::Keypair::ed25519_from_bytes([1u8; 32]).unwrap();
        let base = r#"{"agent_id":"a","base_url":"http://x","description":"","skills":[{"id":"s"}]}"#;
        let one = base.replace(r#""description":"""#, r#""description":"x""#);
        let fill = MAX_CARD_BYTES - AgentCard::from_json(one.as_bytes()).unwrap().to_json().len() + 1;
        let json = base.replace(r#""description":"""#, &format!(r#""description":"{}""#, "x".repeat(fill)));
        let card = AgentCard::from_json(json.as_bytes()).unwrap();
        assert_eq!(card.to_json().len(), MAX_CARD_BYTES);
        let signed = card.signed(&key);
        assert!(signed.to_json().len() > MAX_CARD_BYTES);
        let stored = signed.to_json();
        let again = AgentCard::from_json(&stored).expect("a signed card at the limit is still accepted");
        assert_eq!(again.to_json(), stored);
        let mut over = json.clone();
        over.insert(over.find("xxx").unwrap(), 'x');
        assert!(matches!(AgentCard::from_json(over.as_bytes()), Err(CardError::TooLarge { .. })));
    }

    #[test]
    fn oversized_card_is_refused() {
        let big = "x".repeat(MAX_CARD_BYTES);
        let json = format!(r#"{{"agent_id":"a","base_url":"http://x","description":"{big}"}}"#);
        assert!(matches!(card(&json), Err(CardError::TooLarge { .. })));
    }
    #[test]
    fn placeholders_expand_from_the_environment_and_only_to_safe_text() {
        let env = |name: &str| match name {
            "HOSTNAME" => Some("3f2a9c1b".to_owned()),
            "EVIL" => Some("x\",\"admin\":true".to_owned()),
            "EMPTY" => Some(String::new()),
            _ => None,
        };
        let expanded = expand_placeholders(r#"{"agent_id":"sum-${HOSTNAME}"}"#, env).unwrap();
        assert_eq!(expanded, r#"{"agent_id":"sum-3f2a9c1b"}"#);
        assert_eq!(expand_placeholders("no placeholders $HOME {}", env).unwrap(), "no placeholders $HOME {}");
        for bad in ["${MISSING}", "${EVIL}", "${EMPTY}", "${1X}", "${}", "${HOSTNAME"] {
            assert!(expand_placeholders(bad, env).is_err(), "{bad}");
        }
    }
}
