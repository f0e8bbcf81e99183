//! Manifest text to card parts. Pure: the caller reads the files (and bounds their size).

use serde::de::DeserializeOwned;
use serde::Deserialize;
use serde_json::Value;

use super::{Kind, ManifestError};
use crate::card::{check_id, to_raw, AgentCard, Capability, CardError};
use crate::defaults::MAX_MANIFEST_DESCRIPTION_BYTES;

/// `CAPABILITY.yaml`. Unknown fields are an error, so a misspelt optional field is reported rather
/// than silently ignored.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CapabilityYaml {
    name: String,
    kind: String,
    description: String,
    #[serde(default)]
    id: Option<String>,
    #[serde(default)]
    tags: Vec<String>,
    #[serde(default)]
    category: Option<String>,
    #[serde(default)]
    requires: Vec<String>,
    #[serde(default)]
    required_secrets: Vec<String>,
    #[serde(default)]
    has_side_effects: bool,
    #[serde(default)]
    input_schema: Option<Value>,
    #[serde(default)]
    output_schema: Option<Value>,
    #[serde(default)]
    examples: Vec<Value>,
    #[serde(default)]
    confidence_hint: Option<f64>,
    #[serde(default)]
    metadata: crate::card::Metadata,
}

/// `AGENT.yaml`: every field optional.
#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields, default)]
struct AgentYaml {
    agent_id: Option<String>,
    name: Option<String>,
    description: Option<String>,
    version: Option<String>,
    base_url: Option<String>,
    tags: Vec<String>,
    category: Option<String>,
    group_id: Option<String>,
    metadata: crate::card::Metadata,
}

/// The texts that make one capability: its `CAPABILITY.yaml` and, when present, `SKILL.md` and
/// `schema.json`. `*_path` are the files' paths as errors name them.
pub struct CapabilityFiles<'a> {
    pub yaml_path: &'a str,
    pub yaml: &'a str,
    pub skill_path: &'a str,
    pub skill: Option<&'a str>,
    pub schema_path: &'a str,
    pub schema: Option<&'a str>,
}

/// One capability from its files, checked by the card's own rules for a capability.
pub fn capability(files: &CapabilityFiles<'_>) -> Result<(Kind, Capability), ManifestError> {
    let path = files.yaml_path;
    let y: CapabilityYaml = from_yaml(path, files.yaml)?;
    let kind = match y.kind.as_str() {
        "skill" => Kind::Skill,
        "reasoner" => Kind::Reasoner,
        other => {
            return Err(ManifestError::new(
                path,
                Some("kind"),
                format!("expected skill or reasoner, got {other:?}"),
            ))
        }
    };
    if y.name.trim().is_empty() {
        return Err(ManifestError::new(path, Some("name"), "must not be empty"));
    }
    if y.description.trim().is_empty() {
        return Err(ManifestError::new(path, Some("description"), "must not be empty"));
    }
    let id = match y.id {
        Some(id) => id,
        None => {
            check_id("id", &y.name).map_err(|e| {
                let reason = card_reason(&e);
                let message =
                    format!("none given, and name {:?} is not a valid id ({reason}): add an id", y.name);
                ManifestError::new(path, Some("id"), message)
            })?;
            y.name.clone()
        }
    };
    let description = describe(path, y.description.trim(), files.skill)?;
    let input_schema = match (y.input_schema, files.schema) {
        (Some(_), Some(_)) => {
            let message = format!("given both here and in {}; keep one", files.schema_path);
            return Err(ManifestError::new(path, Some("input_schema"), message));
        }
        (Some(inline), None) => Some(inline),
        (None, Some(text)) => Some(schema_file(files.schema_path, text)?),
        (None, None) => None,
    };
    let capability = Capability {
        id,
        name: Some(y.name),
        description: Some(description),
        tags: y.tags,
        input_schema: input_schema.as_ref().map(to_raw),
        output_schema: y.output_schema.as_ref().map(to_raw),
        examples: y.examples.iter().map(to_raw).collect(),
        category: y.category,
        requires: y.requires,
        required_secrets: y.required_secrets,
        has_side_effects: y.has_side_effects,
        confidence_hint: y.confidence_hint,
        metadata: y.metadata,
        input_modes: Vec::new(),
        output_modes: Vec::new(),
        a2a: None,
    };
    let capability = capability.normalized("").map_err(|e| card_error(path, &e))?;
    Ok((kind, capability))
}

/// The agent a directory describes, as a card with no capabilities yet. `yaml` is `AGENT.yaml` when
/// the directory has one; `default_id` (the directory's name made an id) and `default_base_url` (this
/// node's HTTP address) fill what it leaves out.
pub fn agent(
    path: &str,
    yaml: Option<&str>,
    default_id: &str,
    default_base_url: &str,
) -> Result<AgentCard, ManifestError> {
    let y: AgentYaml = match yaml {
        Some(text) if !text.trim().is_empty() => from_yaml(path, text)?,
        _ => AgentYaml::default(),
    };
    let mut fields = serde_json::Map::new();
    fields.insert("agent_id".into(), y.agent_id.unwrap_or_else(|| default_id.to_owned()).into());
    fields.insert("base_url".into(), y.base_url.unwrap_or_else(|| default_base_url.to_owned()).into());
    fields.insert("tags".into(), y.tags.into());
    fields.insert("metadata".into(), serde_json::json!(y.metadata));
    for (name, value) in [
        ("name", y.name),
        ("description", y.description),
        ("version", y.version),
        ("category", y.category),
        ("group_id", y.group_id),
    ] {
        if let Some(value) = value {
            fields.insert(name.into(), value.into());
        }
    }
    let card: AgentCard = serde_json::from_value(Value::Object(fields))
        .map_err(|e| ManifestError::new(path, None, e.to_string()))?;
    card.normalized().map_err(|e| card_error(path, &e))
}

/// A directory's file name made a valid agent id: characters an id may not hold become `-`, cut at
/// [`crate::defaults::MAX_ID_LEN`]; `agent` when nothing is left.
pub fn default_agent_id(dir_name: &str) -> String {
    let id: String = dir_name
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.') { c } else { '-' })
        .take(crate::defaults::MAX_ID_LEN)
        .collect();
    let id = id.trim_matches('-');
    if id.is_empty() || id.chars().all(|c| c == '.') {
        "agent".to_owned()
    } else {
        id.to_owned()
    }
}

/// The capability's description: the YAML `description`, then a blank line and `SKILL.md` (without a
/// leading `---` front-matter block, which repeats the YAML), at most
/// [`MAX_MANIFEST_DESCRIPTION_BYTES`] in all; SKILL.md is cut at the last line that fits.
pub fn describe(path: &str, description: &str, skill: Option<&str>) -> Result<String, ManifestError> {
    if description.len() > MAX_MANIFEST_DESCRIPTION_BYTES {
        let message = format!("longer than {MAX_MANIFEST_DESCRIPTION_BYTES} bytes");
        return Err(ManifestError::new(path, Some("description"), message));
    }
    let body = skill.map(without_front_matter).map(str::trim).unwrap_or_default();
    if body.is_empty() {
        return Ok(description.to_owned());
    }
    let room = MAX_MANIFEST_DESCRIPTION_BYTES.saturating_sub(description.len() + 2);
    let body = if body.len() <= room {
        body
    } else {
        let mut cut = room;
        while !body.is_char_boundary(cut) {
            cut -= 1;
        }
        let head = &body[..cut];
        head.rfind('\n').map_or(head, |line_end| &head[..line_end]).trim_end()
    };
    if body.is_empty() {
        return Ok(description.to_owned());
    }
    Ok(format!("{description}\n\n{body}"))
}

fn without_front_matter(text: &str) -> &str {
    let Some(rest) = text.strip_prefix("---\n").or_else(|| text.strip_prefix("---\r\n")) else {
        return text;
    };
    let mut offset = 0;
    for line in rest.split_inclusive('\n') {
        offset += line.len();
        if line.trim_end() == "---" {
            return &rest[offset..];
        }
    }
    text
}

fn schema_file(path: &str, text: &str) -> Result<Value, ManifestError> {
    let value: Value =
        serde_json::from_str(text).map_err(|e| ManifestError::new(path, None, e.to_string()))?;
    if !value.is_object() {
        return Err(ManifestError::new(path, None, "must be a JSON object (a JSON Schema)"));
    }
    Ok(value)
}

/// Deserialises YAML into `T`, naming the field and, where the parser knows it, the line and column of
/// a problem.
fn from_yaml<T: DeserializeOwned>(path: &str, text: &str) -> Result<T, ManifestError> {
    let mut at = None;
    let parsed = serde_saphyr::with_deserializer_from_str(text, |de| {
        serde_path_to_error::deserialize(de).map_err(|e| {
            at = Some(e.path().to_string());
            e.into_inner()
        })
    });
    parsed.map_err(|e| yaml_error(path, at.as_deref(), &e))
}

fn yaml_error(path: &str, at: Option<&str>, error: &serde_saphyr::Error) -> ManifestError {
    let error = error.without_snippet();
    let mut message = error.to_string();
    // A syntax error is about the text, not a field, wherever the parser was when it met it.
    let syntax = matches!(error, serde_saphyr::Error::ExternalMessage { source, .. }
        if matches!(**source, serde_saphyr::ExternalMessageSource::Parser(_)));
    // serde names a missing or unknown field only in its message; the path is then the map's.
    let named = ["missing field `", "unknown field `"]
        .iter()
        .find_map(|prefix| message.find(prefix).map(|i| &message[i + prefix.len()..]))
        .and_then(|rest| rest.split('`').next())
        .map(str::to_owned);
    let field = named.or_else(|| at.filter(|p| !matches!(*p, "" | "." | "?")).map(str::to_owned));
    if let Some(location) = error.location() {
        let (line, column) = (location.line(), location.column());
        let suffix = format!(" at line {line}, column {column}");
        if let Some(bare) = message.strip_suffix(&suffix) {
            message = bare.to_owned();
        }
        message = format!("line {line} column {column}: {message}");
    }
    ManifestError { path: path.to_owned(), field: if syntax { None } else { field }, message }
}

/// A card error about a manifest: the field without the card's path prefix.
fn card_error(path: &str, error: &CardError) -> ManifestError {
    let field = error.field().map(|f| f.trim_start_matches('.')).filter(|f| !f.is_empty() && *f != "card");
    ManifestError::new(path, field, card_reason(error))
}

fn card_reason(error: &CardError) -> String {
    match error {
        CardError::Malformed { reason, .. } | CardError::Invalid { reason, .. } => reason.clone(),
        CardError::TooLarge { .. } => error.to_string(),
    }
}
