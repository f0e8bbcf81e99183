//! The shape of an A2A 1.0 AgentCard (its protobuf messages, as they read in JSON), and the one walk
//! that reads a JSON value against it ([`normalize`]).
//!
//! A2A verifiers (the A2A SDK) check a card's signature over the card as their protobuf model sees it:
//! a field the model does not define is dropped, a `bool` without presence is left out when `false`
//! (its default), and a value of the wrong type is an error. A card whose A2A fields went through
//! [`normalize`] holds what such a verifier rebuilds, so a signature over it verifies there. The walk is
//! a fixed point, so a stored card re-checked by another node comes out byte for byte the same.
//!
//! Empty values (`""`, `[]`, `{}`) are kept as given: A2A's canonical form drops them before signing,
//! so they do not change what is signed, and a client still sees, say, a security requirement that
//! names a scheme with no scopes.

use serde_json::value::RawValue;
use serde_json::{Map, Value};

use super::EXTENSION_URI;
use crate::card::{to_raw, CardError};
use crate::defaults::MAX_A2A_PARAMS_DEPTH;

/// What a field holds, as protobuf JSON writes it.
#[derive(Debug)]
pub enum Kind {
    /// `string`.
    Text,
    /// `bool` without presence: `false` is its default, which protobuf JSON leaves out.
    Flag,
    /// `optional bool`: `false` is a value of its own, kept.
    OptionalFlag,
    /// `repeated string`.
    Texts,
    /// A message.
    Message(&'static Message),
    /// `repeated` message.
    Messages(&'static Message),
    /// `map<string, message>`.
    MessageMap(&'static Message),
    /// `map<string, string>`.
    TextMap,
    /// `google.protobuf.Struct`: any JSON object, kept as given.
    Struct,
}

#[derive(Debug)]
pub struct Field {
    /// The JSON name (lowerCamelCase); the protobuf name (snake_case) is read too, as protobuf JSON
    /// readers do.
    pub name: &'static str,
    pub kind: Kind,
}

#[derive(Debug)]
pub struct Message {
    pub fields: &'static [Field],
    /// Every field is a member of one `oneof`: at most one may be set.
    pub oneof: bool,
}

/// What to do with a field the message does not define.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unknown {
    /// Drop it, as A2A verifiers do: cards written for other A2A versions carry fields 1.0 lacks.
    Drop,
    /// Refuse it: in agentmesh's own card form a misspelt field is reported, not lost.
    Refuse,
}

const fn field(name: &'static str, kind: Kind) -> Field {
    Field { name, kind }
}

const fn message(fields: &'static [Field]) -> Message {
    Message { fields, oneof: false }
}

use Kind::{Flag, OptionalFlag, Struct, Text, TextMap, Texts};

/// `AgentCard`.
pub static CARD: Message = message(&[
    field("name", Text),
    field("description", Text),
    field("supportedInterfaces", Kind::Messages(&INTERFACE)),
    field("provider", Kind::Message(&PROVIDER)),
    field("version", Text),
    field("documentationUrl", Text),
    field("capabilities", Kind::Message(&CAPABILITIES)),
    field("securitySchemes", Kind::MessageMap(&SECURITY_SCHEME)),
    field("securityRequirements", Kind::Messages(&SECURITY_REQUIREMENT)),
    field("defaultInputModes", Texts),
    field("defaultOutputModes", Texts),
    field("skills", Kind::Messages(&SKILL)),
    field("signatures", Kind::Messages(&SIGNATURE)),
    field("iconUrl", Text),
]);

/// The A2A fields of a card that the agentmesh card has no field of its own for
/// ([`AgentCard::a2a`](crate::card::AgentCard::a2a)).
pub static CARD_EXTRAS: Message = message(&[
    field("provider", Kind::Message(&PROVIDER)),
    field("documentationUrl", Text),
    field("iconUrl", Text),
    field("capabilities", Kind::Message(&CAPABILITIES)),
    field("securitySchemes", Kind::MessageMap(&SECURITY_SCHEME)),
    field("securityRequirements", Kind::Messages(&SECURITY_REQUIREMENT)),
]);

/// The A2A fields of a skill that a capability has no field of its own for
/// ([`Capability::a2a`](crate::card::Capability::a2a)).
pub static SKILL_EXTRAS: Message =
    message(&[field("securityRequirements", Kind::Messages(&SECURITY_REQUIREMENT))]);

static INTERFACE: Message = message(&[
    field("url", Text),
    field("protocolBinding", Text),
    field("tenant", Text),
    field("protocolVersion", Text),
]);

static PROVIDER: Message = message(&[field("url", Text), field("organization", Text)]);

static CAPABILITIES: Message = message(&[
    field("streaming", OptionalFlag),
    field("pushNotifications", OptionalFlag),
    field("extensions", Kind::Messages(&EXTENSION)),
    field("extendedAgentCard", OptionalFlag),
]);

static EXTENSION: Message = message(&[
    field("uri", Text),
    field("description", Text),
    field("required", Flag),
    field("params", Struct),
]);

static SKILL: Message = message(&[
    field("id", Text),
    field("name", Text),
    field("description", Text),
    field("tags", Texts),
    field("examples", Texts),
    field("inputModes", Texts),
    field("outputModes", Texts),
    field("securityRequirements", Kind::Messages(&SECURITY_REQUIREMENT)),
]);

static SIGNATURE: Message =
    message(&[field("protected", Text), field("signature", Text), field("header", Struct)]);

static SECURITY_REQUIREMENT: Message = message(&[field("schemes", Kind::MessageMap(&STRING_LIST))]);

static STRING_LIST: Message = message(&[field("list", Texts)]);

static SECURITY_SCHEME: Message = Message {
    fields: &[
        field("apiKeySecurityScheme", Kind::Message(&API_KEY)),
        field("httpAuthSecurityScheme", Kind::Message(&HTTP_AUTH)),
        field("oauth2SecurityScheme", Kind::Message(&OAUTH2)),
        field("openIdConnectSecurityScheme", Kind::Message(&OPEN_ID_CONNECT)),
        field("mtlsSecurityScheme", Kind::Message(&MUTUAL_TLS)),
    ],
    oneof: true,
};

static API_KEY: Message =
    message(&[field("description", Text), field("location", Text), field("name", Text)]);

static HTTP_AUTH: Message =
    message(&[field("description", Text), field("scheme", Text), field("bearerFormat", Text)]);

static OAUTH2: Message = message(&[
    field("description", Text),
    field("flows", Kind::Message(&OAUTH_FLOWS)),
    field("oauth2MetadataUrl", Text),
]);

static OPEN_ID_CONNECT: Message = message(&[field("description", Text), field("openIdConnectUrl", Text)]);

static MUTUAL_TLS: Message = message(&[field("description", Text)]);

static OAUTH_FLOWS: Message = Message {
    fields: &[
        field("authorizationCode", Kind::Message(&AUTHORIZATION_CODE)),
        field("clientCredentials", Kind::Message(&CLIENT_CREDENTIALS)),
        field("implicit", Kind::Message(&IMPLICIT)),
        field("password", Kind::Message(&PASSWORD)),
        field("deviceCode", Kind::Message(&DEVICE_CODE)),
    ],
    oneof: true,
};

static AUTHORIZATION_CODE: Message = message(&[
    field("authorizationUrl", Text),
    field("tokenUrl", Text),
    field("refreshUrl", Text),
    field("scopes", TextMap),
    field("pkceRequired", Flag),
]);

static CLIENT_CREDENTIALS: Message =
    message(&[field("tokenUrl", Text), field("refreshUrl", Text), field("scopes", TextMap)]);

static IMPLICIT: Message =
    message(&[field("authorizationUrl", Text), field("refreshUrl", Text), field("scopes", TextMap)]);

static PASSWORD: Message =
    message(&[field("tokenUrl", Text), field("refreshUrl", Text), field("scopes", TextMap)]);

static DEVICE_CODE: Message = message(&[
    field("deviceAuthorizationUrl", Text),
    field("tokenUrl", Text),
    field("refreshUrl", Text),
    field("scopes", TextMap),
]);

/// Reads `value` as `message`: fields in the message's order, each checked for its type, `null`s
/// and `false` flags without presence left out, unknown fields dropped or refused. `at` is the path of
/// `value` in the card, for errors (`securitySchemes.oauth.oauth2SecurityScheme.flows`).
pub fn normalize(
    value: Value,
    message: &Message,
    at: &str,
    unknown: Unknown,
) -> Result<Map<String, Value>, CardError> {
    let Value::Object(mut input) = value else {
        return Err(malformed(at, "expected an object"));
    };
    let mut out = Map::new();
    for field in message.fields {
        let value = match input.remove(field.name) {
            Some(value) => value,
            None => match input.remove(&snake_case(field.name)) {
                Some(value) => value,
                None => continue,
            },
        };
        let path = join(at, field.name);
        if let Some(value) = read(value, &field.kind, &path, unknown)? {
            out.insert(field.name.to_owned(), value);
        }
    }
    if unknown == Unknown::Refuse {
        if let Some(key) = input.keys().next() {
            return Err(CardError::invalid(join(at, key), "not a field of A2A 1.0"));
        }
    }
    if message.oneof && out.len() > 1 {
        let names: Vec<&str> = out.keys().map(String::as_str).collect();
        return Err(CardError::invalid(
            at,
            format!("sets {}, and A2A allows one of them", names.join(" and ")),
        ));
    }
    Ok(out)
}

fn read(value: Value, kind: &Kind, at: &str, unknown: Unknown) -> Result<Option<Value>, CardError> {
    if value.is_null() {
        return Ok(None);
    }
    let value = match kind {
        Text => Some(text(value, at)?),
        Flag => match value {
            Value::Bool(true) => Some(value),
            Value::Bool(false) => None,
            _ => return Err(malformed(at, "expected true or false")),
        },
        OptionalFlag => match value {
            Value::Bool(_) => Some(value),
            _ => return Err(malformed(at, "expected true or false")),
        },
        Texts => Some(Value::Array(list(value, at, text)?)),
        Kind::Message(message) => Some(Value::Object(normalize(value, message, at, unknown)?)),
        Kind::Messages(message) => Some(Value::Array(list(value, at, |item, at| {
            normalize(item, message, at, unknown).map(Value::Object)
        })?)),
        Kind::MessageMap(message) => Some(Value::Object(map(value, at, |item, at| {
            normalize(item, message, at, unknown).map(Value::Object)
        })?)),
        TextMap => Some(Value::Object(map(value, at, text)?)),
        Struct => {
            if !value.is_object() {
                return Err(malformed(at, "expected an object"));
            }
            if depth(&value) > MAX_A2A_PARAMS_DEPTH {
                return Err(CardError::invalid(
                    at,
                    format!("nested deeper than {MAX_A2A_PARAMS_DEPTH} levels"),
                ));
            }
            Some(value)
        }
    };
    Ok(value)
}

fn text(value: Value, at: &str) -> Result<Value, CardError> {
    match value {
        Value::String(_) => Ok(value),
        _ => Err(malformed(at, "expected a string")),
    }
}

fn list(
    value: Value,
    at: &str,
    item: impl Fn(Value, &str) -> Result<Value, CardError>,
) -> Result<Vec<Value>, CardError> {
    let Value::Array(items) = value else {
        return Err(malformed(at, "expected a list"));
    };
    items.into_iter().enumerate().map(|(i, v)| item(v, &format!("{at}[{i}]"))).collect()
}

fn map(
    value: Value,
    at: &str,
    item: impl Fn(Value, &str) -> Result<Value, CardError>,
) -> Result<Map<String, Value>, CardError> {
    let Value::Object(entries) = value else {
        return Err(malformed(at, "expected an object"));
    };
    entries.into_iter().map(|(k, v)| Ok((k.clone(), item(v, &join(at, &k))?))).collect()
}

/// Levels of objects and arrays in `value`, itself included.
fn depth(value: &Value) -> usize {
    match value {
        Value::Array(items) => 1 + items.iter().map(depth).max().unwrap_or(0),
        Value::Object(map) => 1 + map.values().map(depth).max().unwrap_or(0),
        _ => 0,
    }
}

/// The protobuf field name of a JSON name: `oauth2MetadataUrl` is `oauth2_metadata_url`.
fn snake_case(name: &str) -> String {
    let mut out = String::with_capacity(name.len() + 4);
    for c in name.chars() {
        if c.is_ascii_uppercase() {
            out.push('_');
            out.push(c.to_ascii_lowercase());
        } else {
            out.push(c);
        }
    }
    out
}

fn join(at: &str, name: &str) -> String {
    if at.is_empty() {
        name.to_owned()
    } else {
        format!("{at}.{name}")
    }
}

fn malformed(at: &str, reason: &str) -> CardError {
    CardError::Malformed {
        field: if at.is_empty() { "card".to_owned() } else { at.to_owned() },
        reason: reason.to_owned(),
    }
}

/// The held form of a card's or a capability's A2A fields (`a2a`): read as `message` (unknown fields
/// refused), fields with an empty value left out, agentmesh's own extension refused (it is derived from
/// the card), minified. `None` when nothing is left.
pub fn held(
    raw: Option<Box<RawValue>>,
    message: &Message,
    at: &str,
) -> Result<Option<Box<RawValue>>, CardError> {
    let Some(raw) = raw else { return Ok(None) };
    let value: Value = serde_json::from_str(raw.get())
        .map_err(|e| CardError::Malformed { field: at.to_owned(), reason: e.to_string() })?;
    let mut fields = normalize(value, message, at, Unknown::Refuse)?;
    fields.retain(|_, v| !is_empty(v));
    let extensions = fields.get("capabilities").and_then(|c| c.get("extensions")).and_then(Value::as_array);
    if let Some(i) = extensions.and_then(|list| list.iter().position(|e| e["uri"] == EXTENSION_URI)) {
        return Err(CardError::invalid(
            format!("{at}.capabilities.extensions[{i}].uri"),
            "agentmesh's own extension is derived from the card, not given",
        ));
    }
    Ok((!fields.is_empty()).then(|| to_raw(&Value::Object(fields))))
}

/// Checks that `raw` is already in its held form ([`held`]), as every stored card's is.
pub fn check_held(raw: &RawValue, message: &Message, at: &str) -> Result<(), CardError> {
    let again = held(Some(raw.to_owned()), message, at)?;
    if again.as_deref().map(RawValue::get) == Some(raw.get()) {
        Ok(())
    } else {
        Err(CardError::invalid(at, "not in its stored form (minified A2A 1.0 fields, none empty)"))
    }
}

/// `""`, `[]` or `{}`.
pub fn is_empty(value: &Value) -> bool {
    match value {
        Value::String(s) => s.is_empty(),
        Value::Array(items) => items.is_empty(),
        Value::Object(map) => map.is_empty(),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn card(value: Value) -> Result<Value, CardError> {
        normalize(value, &CARD, "", Unknown::Drop).map(Value::Object)
    }

    #[test]
    fn fields_come_out_in_message_order_with_defaults_and_unknowns_dropped() {
        let out = card(json!({
            "skills": [], "name": "n", "future_field": 1, "icon_url": "http://i",
            "capabilities": {"extensions": [{"required": false, "uri": "u", "params": {"a": [], "b": null}}],
                "streaming": false},
            "provider": null,
        }))
        .unwrap();
        assert_eq!(
            serde_json::to_string(&out).unwrap(),
            r#"{"name":"n","capabilities":{"streaming":false,"extensions":[{"uri":"u","params":{"a":[],"b":null}}]},"skills":[],"iconUrl":"http://i"}"#,
            "optional flags keep false, plain flags drop it, params are kept as given"
        );
        assert_eq!(card(out.clone()).unwrap(), out, "a fixed point");
    }

    #[test]
    fn wrong_types_and_two_members_of_a_oneof_name_their_field() {
        let field = |v: Value| card(v).unwrap_err().field().map(str::to_owned);
        assert_eq!(field(json!({"skills": [{"id": "a"}, {"id": 5}]})).as_deref(), Some("skills[1].id"));
        assert_eq!(
            field(json!({"capabilities": {"streaming": "yes"}})).as_deref(),
            Some("capabilities.streaming")
        );
        let two = json!({"securitySchemes": {"s": {"mtlsSecurityScheme": {},
            "httpAuthSecurityScheme": {"scheme": "bearer"}}}});
        assert_eq!(field(two).as_deref(), Some("securitySchemes.s"));
        let flows = json!({"securitySchemes": {"o": {"oauth2SecurityScheme": {"flows": {
            "authorizationCode": {}, "clientCredentials": {}}}}}});
        assert_eq!(field(flows).as_deref(), Some("securitySchemes.o.oauth2SecurityScheme.flows"));
        let scopes = json!({"securityRequirements": [{"schemes": {"o": {"list": ["a", 1]}}}]});
        assert_eq!(field(scopes).as_deref(), Some("securityRequirements[0].schemes.o.list[1]"));
        assert_eq!(field(json!([])).as_deref(), Some("card"));
    }

    #[test]
    fn held_fields_refuse_unknowns_and_agentmeshs_own_extension_and_drop_empties() {
        let held_of = |v: Value| held(Some(to_raw(&v)), &CARD_EXTRAS, "a2a");
        let out = held_of(json!({"provider": {}, "iconUrl": "", "documentationUrl": "http://d",
            "securityRequirements": [{"schemes": {"bearer": {"list": []}}}]}))
        .unwrap()
        .unwrap();
        assert_eq!(
            out.get(),
            r#"{"documentationUrl":"http://d","securityRequirements":[{"schemes":{"bearer":{"list":[]}}}]}"#,
            "empty fields go, empty scope lists inside a kept field stay"
        );
        check_held(&out, &CARD_EXTRAS, "a2a").unwrap();
        assert!(held_of(json!({"provider": {}})).unwrap().is_none());
        assert_eq!(held_of(json!({"providr": {}})).unwrap_err().field(), Some("a2a.providr"));
        let own = json!({"capabilities": {"extensions": [{"uri": "x"}, {"uri": EXTENSION_URI}]}});
        assert_eq!(held_of(own).unwrap_err().field(), Some("a2a.capabilities.extensions[1].uri"));
        let spaced = RawValue::from_string(r#"{"iconUrl": "http://i"}"#.to_owned()).unwrap();
        assert!(check_held(&spaced, &CARD_EXTRAS, "a2a").is_err(), "not minified");
    }

    #[test]
    fn params_nesting_is_bounded() {
        let mut deep = json!(1);
        for _ in 0..MAX_A2A_PARAMS_DEPTH {
            deep = json!([deep]);
        }
        let ext = |params: Value| json!({"capabilities": {"extensions": [{"uri": "u", "params": params}]}});
        assert!(card(ext(json!({"x": deep.clone()}))).is_err());
        assert!(card(ext(json!({"x": deep[0].clone()}))).is_ok());
    }
}
