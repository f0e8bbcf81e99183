//! A2A 0.3 cards read as 1.0, mapped as the A2A SDK maps an older card it reads: `url`,
//! `preferredTransport` and `additionalInterfaces` become `supportedInterfaces` with their bindings,
//! `security` becomes `securityRequirements`, security schemes tagged by `type` become the 1.0 wrapper
//! of that type, and `supportsAuthenticatedExtendedCard` becomes `capabilities.extendedAgentCard`.
//! A 1.0 card passes unchanged. Pure.

use serde_json::{json, Map, Value};

use crate::card::CardError;

/// `protocolVersion` of a 0.3 card that names none.
pub const LEGACY_PROTOCOL_VERSION: &str = "0.3.0";
/// The binding at a 0.3 card's `url` when it names no `preferredTransport` (0.3's default).
pub const LEGACY_TRANSPORT: &str = "JSONRPC";

/// 1.0 allows one OAuth flow per scheme, 0.3 several: the first of these that a 0.3 scheme has is kept.
const FLOW_ORDER: [&str; 4] = ["authorizationCode", "clientCredentials", "implicit", "password"];

/// Rewrites the 0.3 fields of `card` as their 1.0 equivalents.
pub fn upgrade(card: &mut Map<String, Value>) -> Result<(), CardError> {
    if card.remove("supportsAuthenticatedExtendedCard") == Some(Value::Bool(true)) {
        if let Some(caps) = card.entry("capabilities").or_insert_with(|| json!({})).as_object_mut() {
            caps.entry("extendedAgentCard").or_insert(Value::Bool(true));
        }
    }
    interfaces(card)?;
    if let Some(legacy) = card.remove("security") {
        if !card.contains_key("securityRequirements") {
            card.insert("securityRequirements".into(), requirements(legacy, "security")?);
        }
    }
    if let Some(Value::Array(skills)) = card.get_mut("skills") {
        for (i, skill) in skills.iter_mut().enumerate() {
            let Some(skill) = skill.as_object_mut() else { continue };
            if let Some(legacy) = skill.remove("security") {
                if !skill.contains_key("securityRequirements") {
                    let at = format!("skills[{i}].security");
                    skill.insert("securityRequirements".into(), requirements(legacy, &at)?);
                }
            }
        }
    }
    if let Some(Value::Object(schemes)) = card.get_mut("securitySchemes") {
        for (name, scheme) in schemes.iter_mut() {
            if let Some(scheme) = scheme.as_object_mut() {
                security_scheme(scheme, &format!("securitySchemes.{name}"))?;
            }
        }
    }
    Ok(())
}

/// 0.3's main `url` (at `preferredTransport`, JSONRPC by default) then its `additionalInterfaces`,
/// each at the card's `protocolVersion`; an additional interface that repeats the main one is left out.
fn interfaces(card: &mut Map<String, Value>) -> Result<(), CardError> {
    let url = card.remove("url").filter(|v| !v.is_null());
    let transport = optional_text(card.remove("preferredTransport"), "preferredTransport")?;
    let version = optional_text(card.remove("protocolVersion"), "protocolVersion")?;
    let additional = card.remove("additionalInterfaces").filter(|v| !v.is_null());
    let Some(url) = url else { return Ok(()) };
    if card.contains_key("supportedInterfaces") {
        return Ok(());
    }
    let url = optional_text(Some(url), "url")?.unwrap_or_default();
    let version = version.unwrap_or_else(|| LEGACY_PROTOCOL_VERSION.to_owned());
    let mut list = vec![(url, transport.unwrap_or_else(|| LEGACY_TRANSPORT.to_owned()))];
    if let Some(additional) = additional {
        let Value::Array(items) = additional else {
            return Err(malformed("additionalInterfaces", "expected a list"));
        };
        for (i, item) in items.into_iter().enumerate() {
            let at = format!("additionalInterfaces[{i}]");
            let Value::Object(mut item) = item else { return Err(malformed(&at, "expected an object")) };
            let url = optional_text(item.remove("url"), &format!("{at}.url"))?.unwrap_or_default();
            let binding =
                optional_text(item.remove("transport"), &format!("{at}.transport"))?.unwrap_or_default();
            if !list.contains(&(url.clone(), binding.clone())) {
                list.push((url, binding));
            }
        }
    }
    let list = list
        .into_iter()
        .map(|(url, binding)| json!({"url": url, "protocolBinding": binding, "protocolVersion": version}))
        .collect();
    card.insert("supportedInterfaces".into(), Value::Array(list));
    Ok(())
}

/// 0.3's `[{"scheme": ["scope", ...]}]` as 1.0's `[{"schemes": {"scheme": {"list": [...]}}}]`.
fn requirements(legacy: Value, at: &str) -> Result<Value, CardError> {
    let Value::Array(items) = legacy else { return Err(malformed(at, "expected a list")) };
    let mut out = Vec::with_capacity(items.len());
    for (i, item) in items.into_iter().enumerate() {
        let Value::Object(schemes) = item else {
            return Err(malformed(&format!("{at}[{i}]"), "expected an object"));
        };
        let schemes: Map<String, Value> =
            schemes.into_iter().map(|(name, scopes)| (name, json!({ "list": scopes }))).collect();
        out.push(json!({ "schemes": schemes }));
    }
    Ok(Value::Array(out))
}

fn security_scheme(scheme: &mut Map<String, Value>, at: &str) -> Result<(), CardError> {
    let Some(kind) = scheme.remove("type") else { return Ok(()) };
    let wrapper = match kind.as_str() {
        Some("apiKey") => "apiKeySecurityScheme",
        Some("http") => "httpAuthSecurityScheme",
        Some("oauth2") => "oauth2SecurityScheme",
        Some("openIdConnect") => "openIdConnectSecurityScheme",
        Some("mutualTLS") => "mtlsSecurityScheme",
        _ => {
            return Err(CardError::invalid(
                format!("{at}.type"),
                "must be apiKey, http, oauth2, openIdConnect or mutualTLS",
            ))
        }
    };
    if let Some(location) = scheme.remove("in") {
        scheme.entry("location").or_insert(location);
    }
    if let Some(Value::Object(flows)) = scheme.get_mut("flows") {
        if let Some(first) = FLOW_ORDER.iter().find(|f| flows.get(**f).is_some_and(|v| !v.is_null())) {
            flows.retain(|name, _| name == first);
        }
    }
    let inner = std::mem::take(scheme);
    scheme.insert(wrapper.into(), Value::Object(inner));
    Ok(())
}

fn optional_text(value: Option<Value>, at: &str) -> Result<Option<String>, CardError> {
    match value {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s)),
        Some(_) => Err(malformed(at, "expected a string")),
    }
}

fn malformed(at: &str, reason: &str) -> CardError {
    CardError::Malformed { field: at.to_owned(), reason: reason.to_owned() }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn upgraded(value: Value) -> Value {
        let Value::Object(mut map) = value else { panic!("an object") };
        upgrade(&mut map).unwrap();
        Value::Object(map)
    }

    #[test]
    fn the_preferred_transport_is_the_main_urls_binding() {
        let card = upgraded(json!({"name": "x", "url": "http://h/a2a", "preferredTransport": "GRPC",
            "protocolVersion": "0.3.0", "additionalInterfaces": [
                {"url": "http://h/a2a", "transport": "GRPC"},
                {"url": "http://h/rest", "transport": "HTTP+JSON"}]}));
        assert_eq!(
            card,
            json!({"name": "x", "supportedInterfaces": [
                {"url": "http://h/a2a", "protocolBinding": "GRPC", "protocolVersion": "0.3.0"},
                {"url": "http://h/rest", "protocolBinding": "HTTP+JSON", "protocolVersion": "0.3.0"}]})
        );
        let plain = upgraded(json!({"url": "http://h"}));
        assert_eq!(
            plain["supportedInterfaces"],
            json!([{"url": "http://h", "protocolBinding": "JSONRPC", "protocolVersion": "0.3.0"}]),
            "0.3's default transport is JSON-RPC"
        );
        let both = upgraded(json!({"url": "http://old", "supportedInterfaces": [{"url": "http://new"}]}));
        assert_eq!(both, json!({"supportedInterfaces": [{"url": "http://new"}]}), "1.0's list wins");
    }

    #[test]
    fn security_is_rewritten_in_1_0_form() {
        let card = upgraded(json!({
            "securitySchemes": {
                "key": {"type": "apiKey", "in": "header", "name": "X-Key"},
                "oauth": {"type": "oauth2", "flows": {
                    "password": {"tokenUrl": "http://t", "scopes": {}},
                    "clientCredentials": {"tokenUrl": "http://t", "scopes": {"read": "Read"}}}},
                "done": {"apiKeySecurityScheme": {"location": "query", "name": "k"}}},
            "security": [{"oauth": ["read"]}, {"key": []}],
            "supportsAuthenticatedExtendedCard": true,
            "skills": [{"id": "s", "security": [{"key": []}]}]}));
        assert_eq!(
            card,
            json!({
                "securitySchemes": {
                    "key": {"apiKeySecurityScheme": {"name": "X-Key", "location": "header"}},
                    "oauth": {"oauth2SecurityScheme": {"flows": {
                        "clientCredentials": {"tokenUrl": "http://t", "scopes": {"read": "Read"}}}}},
                    "done": {"apiKeySecurityScheme": {"location": "query", "name": "k"}}},
                "securityRequirements": [{"schemes": {"oauth": {"list": ["read"]}}},
                    {"schemes": {"key": {"list": []}}}],
                "capabilities": {"extendedAgentCard": true},
                "skills": [{"id": "s", "securityRequirements": [{"schemes": {"key": {"list": []}}}]}]})
        );
        let mut bad = json!({"securitySchemes": {"x": {"type": "kerberos"}}}).as_object().unwrap().clone();
        assert_eq!(upgrade(&mut bad).unwrap_err().field(), Some("securitySchemes.x.type"));
    }
}
