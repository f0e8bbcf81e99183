//! What a card's A2A signature covers, written straight from the card: the same bytes as
//! `canonical(&payload(&view(card)))`, without the view.
//!
//! Every card a node receives has its A2A signature checked, so these bytes are made for every card
//! heard. Building the view as a `Value` tree, cleaning it and canonicalising it allocated every name
//! and string, re-parsed every schema into a tree of maps, and cost more than the signature checks.
//! Here each part of the view is written in its clean canonical form as it is derived
//! (`cleaned::Writer`): derived members in name order, raw JSON streamed through the parser.
//! [`view`](super::view) stays what is served, and the definition these bytes must match.

use std::borrow::Cow;

use serde_json::value::RawValue;
use serde_json::Number;

use super::cleaned::{self, Members, Writer};
use super::{skill_id, DEFAULT_BINDING, EXTENSION_URI, PROTOCOL_VERSION};
use crate::card::{AgentCard, Capability};

type Result<T> = std::result::Result<T, serde_json::Error>;

/// The RFC 8785 bytes of the card's A2A view cleaned: what its signature covers. `None` when the card
/// has no A2A view, or holds raw JSON that does not read as JSON values (never a card
/// [`AgentCard::from_json`] made: it reads every schema and example as a value).
pub fn payload_bytes(card: &AgentCard) -> Option<Vec<u8>> {
    if !card.has_a2a_view() {
        return None;
    }
    let mut writer = Writer::with_capacity(estimated_size(card));
    let kept = view(&mut writer, card).ok()?;
    Some(writer.finish(kept))
}

/// Room for the payload, so that it is seldom grown: the card's raw JSON plus its texts, roughly.
fn estimated_size(card: &AgentCard) -> usize {
    let raw = |r: &Option<Box<RawValue>>| r.as_ref().map_or(0, |r| r.get().len());
    let caps = card.reasoners.iter().chain(&card.skills);
    let per_cap: usize =
        caps.map(|c| 256 + raw(&c.input_schema) + raw(&c.output_schema) + raw(&c.a2a) + c.id.len() * 3).sum();
    512 + raw(&card.a2a) + per_cap
}

/// The view's members in name order (the order RFC 8785 writes them in).
fn view<'a>(w: &mut Writer<'a>, card: &'a AgentCard) -> Result<bool> {
    let held = Members::of(card.a2a.as_deref());
    let name = card.display_name();
    let description = if card.description.is_empty() { name } else { &card.description };
    let version = if card.version.is_empty() { "0.0.0" } else { &card.version };
    let object = w.begin_object();
    w.member("capabilities", |w| capabilities(w, card, held.last("capabilities")))?;
    w.member("defaultInputModes", |w| Ok(w.texts(&card.input_modes)))?;
    w.member("defaultOutputModes", |w| Ok(w.texts(&card.output_modes)))?;
    w.member("description", |w| Ok(w.text(description)))?;
    held_member(w, &held, "documentationUrl")?;
    held_member(w, &held, "iconUrl")?;
    w.member("name", |w| Ok(w.text(name)))?;
    held_member(w, &held, "provider")?;
    held_member(w, &held, "securityRequirements")?;
    held_member(w, &held, "securitySchemes")?;
    w.member("skills", |w| skills(w, card))?;
    w.member("supportedInterfaces", |w| interfaces(w, card))?;
    w.member("version", |w| Ok(w.text(version)))?;
    Ok(w.end_object(object))
}

/// A held A2A field the view takes as it is, when the card holds it.
fn held_member<'a>(w: &mut Writer<'a>, held: &Members<'a>, name: &'static str) -> Result<()> {
    match held.last(name) {
        Some(raw) => w.member(name, |w| w.raw(raw.get())),
        None => Ok(()),
    }
}

fn interfaces<'a>(w: &mut Writer<'a>, card: &'a AgentCard) -> Result<bool> {
    let array = w.begin_array();
    if card.interfaces.is_empty() {
        w.element(|w| {
            let object = w.begin_object();
            w.member("protocolBinding", |w| Ok(w.text(DEFAULT_BINDING)))?;
            w.member("protocolVersion", |w| Ok(w.text(PROTOCOL_VERSION)))?;
            w.member("url", |w| Ok(w.text(&card.base_url)))?;
            Ok(w.end_object(object))
        })?;
    }
    for i in &card.interfaces {
        w.element(|w| {
            let object = w.begin_object();
            w.member("protocolBinding", |w| Ok(w.text(&i.protocol_binding)))?;
            w.member("protocolVersion", |w| Ok(w.text(&i.protocol_version)))?;
            w.member("tenant", |w| Ok(w.text(&i.tenant)))?;
            w.member("url", |w| Ok(w.text(&i.url)))?;
            Ok(w.end_object(object))
        })?;
    }
    Ok(w.end_array(array))
}

/// The held `capabilities` (when an object) but for its `extensions`, then `extensions`: the held ones
/// (when an array) with agentmesh's own last.
fn capabilities<'a>(w: &mut Writer<'a>, card: &'a AgentCard, held: Option<&'a RawValue>) -> Result<bool> {
    let held = Members::of(held);
    let object = w.begin_object();
    for (name, raw) in &held.0 {
        if name != "extensions" {
            w.member(name.clone(), |w| w.raw(raw.get()))?;
        }
    }
    let held_extensions = held.last("extensions").and_then(cleaned::elements).unwrap_or_default();
    w.member("extensions", |w| {
        let array = w.begin_array();
        for raw in held_extensions {
            w.element(|w| w.raw(raw.get()))?;
        }
        w.element(|w| own_extension(w, card))?;
        Ok(w.end_array(array))
    })?;
    Ok(w.end_object(object))
}

/// agentmesh's extension: what A2A has no field for, and each skill's details by A2A skill id.
fn own_extension<'a>(w: &mut Writer<'a>, card: &'a AgentCard) -> Result<bool> {
    let object = w.begin_object();
    w.member("description", |w| Ok(w.text(super::EXTENSION_DESCRIPTION)))?;
    w.member("params", |w| {
        let params = w.begin_object();
        w.member("agent_id", |w| Ok(w.text(&card.agent_id)))?;
        w.member("base_url", |w| Ok(w.text(&card.base_url)))?;
        w.member("category", |w| Ok(card.category.as_deref().is_some_and(|c| w.text(c))))?;
        w.member("deployment_type", |w| Ok(w.text(&card.deployment_type)))?;
        w.member("group_id", |w| Ok(card.group_id.as_deref().is_some_and(|g| w.text(g))))?;
        w.member("metadata", |w| Ok(w.text_map(&card.metadata)))?;
        w.member("skills", |w| {
            let details = w.begin_object();
            for (kind, cap) in capabilities_of(card) {
                w.member(skill_id(card, kind, cap), |w| skill_details(w, kind, cap))?;
            }
            Ok(w.end_object(details))
        })?;
        w.member("tags", |w| Ok(w.texts(&card.tags)))?;
        Ok(w.end_object(params))
    })?;
    w.member("uri", |w| Ok(w.text(EXTENSION_URI)))?;
    Ok(w.end_object(object))
}

/// Reasoners, then skills, each with its kind: the order of the view's skills.
fn capabilities_of(card: &AgentCard) -> impl Iterator<Item = (&'static str, &Capability)> {
    let reasoners = card.reasoners.iter().map(|c| ("reasoner", c));
    reasoners.chain(card.skills.iter().map(|c| ("skill", c)))
}

fn skill_details<'a>(w: &mut Writer<'a>, kind: &'static str, cap: &'a Capability) -> Result<bool> {
    let object = w.begin_object();
    w.member("category", |w| Ok(cap.category.as_deref().is_some_and(|c| w.text(c))))?;
    w.member("confidence_hint", |w| {
        Ok(cap.confidence_hint.and_then(Number::from_f64).is_some_and(|n| w.number(&n)))
    })?;
    w.member("has_side_effects", |w| Ok(cap.has_side_effects && w.flag(true)))?;
    w.member("id", |w| Ok(w.text(&cap.id)))?;
    raw_member(w, "input_schema", cap.input_schema.as_deref())?;
    w.member("kind", |w| Ok(w.text(kind)))?;
    w.member("metadata", |w| Ok(w.text_map(&cap.metadata)))?;
    raw_member(w, "output_schema", cap.output_schema.as_deref())?;
    w.member("required_secrets", |w| Ok(w.texts(&cap.required_secrets)))?;
    w.member("requires", |w| Ok(w.texts(&cap.requires)))?;
    w.member("tags", |w| Ok(w.texts(&cap.tags)))?;
    Ok(w.end_object(object))
}

fn raw_member<'a>(w: &mut Writer<'a>, name: &'static str, raw: Option<&'a RawValue>) -> Result<()> {
    match raw {
        Some(raw) => w.member(name, |w| w.raw(raw.get())),
        None => Ok(()),
    }
}

fn skills<'a>(w: &mut Writer<'a>, card: &'a AgentCard) -> Result<bool> {
    let array = w.begin_array();
    for (kind, cap) in capabilities_of(card) {
        w.element(|w| skill(w, kind, skill_id(card, kind, cap), cap))?;
    }
    Ok(w.end_array(array))
}

/// One A2A skill: its derived fields, then the A2A fields the capability holds, which win over them.
fn skill<'a>(w: &mut Writer<'a>, kind: &'static str, id: String, cap: &'a Capability) -> Result<bool> {
    let name = cap.name.as_deref().filter(|n| !n.is_empty()).unwrap_or(&cap.id);
    let description = cap.description.as_deref().filter(|d| !d.is_empty()).unwrap_or(name);
    let object = w.begin_object();
    w.member("description", |w| Ok(w.text(description)))?;
    w.member("examples", |w| {
        let array = w.begin_array();
        for example in &cap.examples {
            w.element(|w| Ok(w.text(&example_text(example))))?;
        }
        Ok(w.end_array(array))
    })?;
    w.member("id", |w| Ok(w.text(&id)))?;
    w.member("inputModes", |w| Ok(w.texts(&cap.input_modes)))?;
    w.member("name", |w| Ok(w.text(name)))?;
    w.member("outputModes", |w| Ok(w.texts(&cap.output_modes)))?;
    // A2A needs at least one tag per skill: an untagged capability is tagged with its kind.
    w.member("tags", |w| Ok(if cap.tags.is_empty() { w.texts(&[kind]) } else { w.texts(&cap.tags) }))?;
    for (name, raw) in Members::of(cap.a2a.as_deref()).0 {
        w.member(name, |w| w.raw(raw.get()))?;
    }
    Ok(w.end_object(object))
}

/// An example as the view's skill lists it: a JSON string as its text, anything else as its JSON.
fn example_text(raw: &RawValue) -> Cow<'_, str> {
    cleaned::json_string(raw.get()).unwrap_or(Cow::Borrowed(raw.get()))
}

#[cfg(test)]
mod tests;
