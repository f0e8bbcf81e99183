//! `format=xml`: the same page as XML, with schemas as `<field>` elements (the form the discovery spec
//! gives for putting capabilities into an LLM prompt).
//!
//! Well-formed whatever the cards hold: quick-xml escapes markup, and [`clean`] replaces the characters
//! that XML 1.0 forbids even when escaped (most C0 controls, lone surrogates cannot occur in `str`).

use std::borrow::Cow;

use quick_xml::events::{BytesDecl, BytesEnd, BytesStart, BytesText, Event};
use quick_xml::Writer;
use serde_json::Value;

use super::prepared::{Form, Prepared, PreparedCache};
use super::{reasoner_target, skill_target};
use crate::card::held::{CapRef, CardRef};
use crate::clock::rfc3339;
use crate::query::{Hit, Query, Selection};
use crate::registry::health::Millis;
use crate::registry::Entry;

/// Nested schema objects deeper than this are not expanded.
const MAX_SCHEMA_DEPTH: usize = 8;

fn is_xml_char(c: char) -> bool {
    matches!(c, '\u{9}' | '\u{A}' | '\u{D}' | '\u{20}'..='\u{D7FF}' | '\u{E000}'..='\u{FFFD}' | '\u{10000}'..)
}

/// The text with every character XML 1.0 forbids replaced by U+FFFD.
pub fn clean(s: &str) -> Cow<'_, str> {
    if s.chars().all(is_xml_char) {
        Cow::Borrowed(s)
    } else {
        Cow::Owned(s.chars().map(|c| if is_xml_char(c) { c } else { '\u{FFFD}' }).collect())
    }
}

struct Xml {
    w: Writer<Vec<u8>>,
}

impl Xml {
    fn event(&mut self, e: Event<'_>) {
        // Writing into a Vec cannot fail.
        let _ = self.w.write_event(e);
    }

    fn start(&mut self, name: &str, attrs: &[(&str, &str)]) {
        self.event(Event::Start(tag(name, attrs)));
    }

    fn empty(&mut self, name: &str, attrs: &[(&str, &str)]) {
        self.event(Event::Empty(tag(name, attrs)));
    }

    fn end(&mut self, name: &str) {
        self.event(Event::End(BytesEnd::new(name)));
    }

    fn text(&mut self, text: &str) {
        self.event(Event::Text(BytesText::new(&clean(text))));
    }

    fn text_element(&mut self, name: &str, text: &str) {
        self.start(name, &[]);
        self.text(text);
        self.end(name);
    }
}

fn tag<'a>(name: &'a str, attrs: &[(&str, &str)]) -> BytesStart<'a> {
    let mut start = BytesStart::new(name);
    for (k, v) in attrs {
        start.push_attribute((*k, clean(v).as_ref()));
    }
    start
}

/// The declaration, the `<discovery>` start and the summary, up to `<capabilities>`.
fn opening(x: &mut Xml, sel: &Selection<'_>, q: &Query, now: Millis) {
    x.event(Event::Decl(BytesDecl::new("1.0", Some("UTF-8"), None)));
    x.start("discovery", &[("discovered_at", &rfc3339(now))]);
    x.empty(
        "summary",
        &[
            ("total_agents", &sel.total_agents.to_string()),
            ("total_reasoners", &sel.total_reasoners.to_string()),
            ("total_skills", &sel.total_skills.to_string()),
            ("limit", &q.limit.to_string()),
            ("offset", &q.offset.to_string()),
            ("has_more", if sel.has_more { "true" } else { "false" }),
        ],
    );
    x.start("capabilities", &[]);
}

pub fn render(sel: &Selection<'_>, q: &Query, now: Millis) -> Vec<u8> {
    let mut x = Xml { w: Writer::new(Vec::with_capacity(4096)) };
    opening(&mut x, sel, q, now);
    for hit in &sel.page {
        agent(&mut x, hit, q);
    }
    x.end("capabilities");
    x.end("discovery");
    x.w.into_inner()
}

/// The same bytes as [`render`], from records prepared once per set of include flags.
pub fn render_prepared(sel: &Selection<'_>, q: &Query, now: Millis, cache: &PreparedCache) -> Vec<u8> {
    let prepared = cache.page(&sel.page, Form::xml(q), |entry| prepare(entry, q));
    let mut x = Xml { w: Writer::new(super::buffers::take(super::prepared::page_len(&prepared))) };
    opening(&mut x, sel, q, now);
    let mut out = x.w.into_inner();
    for (hit, p) in sel.page.iter().zip(&prepared) {
        out.extend_from_slice(p.piece(0));
        out.extend_from_slice(hit.health.as_str().as_bytes());
        out.extend_from_slice(p.piece(1));
        crate::clock::write_rfc3339(hit.last_heartbeat.unwrap_or(hit.entry.updated_at), &mut out);
        out.extend_from_slice(p.piece(2));
        Prepared::caps(&p.reasoners, &hit.reasoners, b"", &mut out);
        out.extend_from_slice(b"</reasoners><skills>");
        Prepared::caps(&p.skills, &hit.skills, b"", &mut out);
        out.extend_from_slice(p.piece(3));
    }
    out.extend_from_slice(b"</capabilities></discovery>");
    out
}

/// Stands in for the health and the last heartbeat in a prepared start tag: a byte that no cleaned
/// text and no escape can hold, so the tag splits exactly there.
const SLOT: &str = "\u{0}";

/// The record of `entry` prepared for XML answers with `q`'s include flags: the `<agent>` start tag
/// split around its health and last heartbeat, `</skills></agent>`, and each capability's element.
fn prepare(entry: &Entry, q: &Query) -> Prepared {
    let card_text = entry.card.text();
    let card = card_text.view();
    let mut x = Xml { w: Writer::new(Vec::new()) };
    x.event(Event::Start(agent_tag(entry, &card, SLOT, SLOT)));
    x.start("reasoners", &[]);
    let tag = x.w.into_inner();
    let mut pieces: Vec<Vec<u8>> = tag.split(|&b| b == 0).map(<[u8]>::to_vec).collect();
    pieces.push(b"</skills></agent>".to_vec());
    let element = |name, c: &CapRef<'_>, target: &str, is_reasoner| {
        let mut x = Xml { w: Writer::new(Vec::new()) };
        capability(&mut x, name, c, &card, target, q, is_reasoner);
        x.w.into_inner()
    };
    let reasoners =
        card.reasoners.iter().map(|c| element("reasoner", c, &reasoner_target(&card.agent_id, &c.id), true));
    let skills = card.skills.iter().map(|c| element("skill", c, &skill_target(&card.agent_id, &c.id), false));
    Prepared::new(pieces, reasoners.collect(), skills.collect())
}

/// `<agent …>`; `health` and `last` (ASCII, from this node) are written as given, the card's texts
/// cleaned.
fn agent_tag<'a>(e: &Entry, card: &CardRef<'_>, health: &str, last: &str) -> BytesStart<'a> {
    let mut start = BytesStart::new("agent");
    let attrs = [
        ("id", card.agent_id.as_ref(), true),
        ("base_url", &card.base_url, true),
        ("version", &card.version, true),
        ("health_status", health, false),
        ("deployment_type", &card.deployment_type, true),
        ("last_heartbeat", last, false),
        ("publisher", &e.publisher_name, true),
    ];
    let category = card.category.as_deref().map(|c| ("category", c, true));
    for (name, value, from_card) in attrs.into_iter().chain(category) {
        if from_card {
            start.push_attribute((name, clean(value).as_ref()));
        } else {
            start.push_attribute((name, value));
        }
    }
    start
}

fn agent(x: &mut Xml, hit: &Hit<'_>, q: &Query) {
    let e = hit.entry;
    let card_text = e.card.text();
    let card = card_text.view();
    let last = rfc3339(hit.last_heartbeat.unwrap_or(e.updated_at));
    x.event(Event::Start(agent_tag(e, &card, hit.health.as_str(), &last)));
    x.start("reasoners", &[]);
    for c in hit.reasoners.iter().filter_map(|&i| card.reasoners.get(i)) {
        capability(x, "reasoner", c, &card, &reasoner_target(&card.agent_id, &c.id), q, true);
    }
    x.end("reasoners");
    x.start("skills", &[]);
    for c in hit.skills.iter().filter_map(|&i| card.skills.get(i)) {
        capability(x, "skill", c, &card, &skill_target(&card.agent_id, &c.id), q, false);
    }
    x.end("skills");
    x.end("agent");
}

fn capability(
    x: &mut Xml,
    name: &str,
    c: &CapRef<'_>,
    card: &CardRef<'_>,
    target: &str,
    q: &Query,
    is_reasoner: bool,
) {
    let mut attrs: Vec<(&str, &str)> = vec![("id", &c.id), ("target", target)];
    if let Some(category) = c.category_in(card) {
        attrs.push(("category", category));
    }
    if c.has_side_effects {
        attrs.push(("has_side_effects", "true"));
    }
    x.start(name, &attrs);
    if q.include_descriptions {
        if let Some(d) = &c.description {
            x.text_element("description", d);
        }
    }
    x.start("tags", &[]);
    for t in &c.tags {
        x.text_element("tag", t);
    }
    x.end("tags");
    for (list, outer, inner) in
        [(&c.requires, "requires", "target"), (&c.required_secrets, "required_secrets", "secret")]
    {
        if !list.is_empty() {
            x.start(outer, &[]);
            for item in list {
                x.text_element(inner, item);
            }
            x.end(outer);
        }
    }
    if q.include_input_schema {
        schema(x, "input_schema", c.input_schema);
    }
    if is_reasoner && q.include_output_schema {
        schema(x, "output_schema", c.output_schema);
    }
    if is_reasoner && q.include_examples && !c.examples.is_empty() {
        x.start("examples", &[]);
        for ex in &c.examples {
            x.text_element("example", ex.get());
        }
        x.end("examples");
    }
    x.end(name);
}

fn schema(x: &mut Xml, name: &str, raw: Option<&serde_json::value::RawValue>) {
    let Some(raw) = raw else { return };
    let Ok(value) = serde_json::from_str::<Value>(raw.get()) else {
        return;
    };
    x.start(name, &[]);
    fields(x, &value, 0);
    x.end(name);
}

/// One `<field>` per property; nested object properties (and those of array items) nest.
fn fields(x: &mut Xml, schema: &Value, depth: usize) {
    let Some(props) = schema.get("properties").and_then(Value::as_object) else {
        return;
    };
    let required: Vec<&str> = schema
        .get("required")
        .and_then(Value::as_array)
        .map(|r| r.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    for (name, prop) in props {
        let ty = match prop.get("type") {
            Some(Value::String(s)) => s.clone(),
            Some(Value::Array(a)) => a.iter().filter_map(Value::as_str).collect::<Vec<_>>().join("|"),
            _ => "any".to_owned(),
        };
        let mut attrs: Vec<(&str, String)> = vec![("name", name.clone()), ("type", ty)];
        if required.contains(&name.as_str()) {
            attrs.push(("required", "true".to_owned()));
        }
        let bound = |keys: &[&str]| keys.iter().find_map(|k| prop.get(*k)).map(scalar);
        if let Some(min) = bound(&["minimum", "exclusiveMinimum", "minLength", "minItems"]) {
            attrs.push(("min", min));
        }
        if let Some(max) = bound(&["maximum", "exclusiveMaximum", "maxLength", "maxItems"]) {
            attrs.push(("max", max));
        }
        if let Some(default) = prop.get("default") {
            attrs.push(("default", scalar(default)));
        }
        let attrs: Vec<(&str, &str)> = attrs.iter().map(|(k, v)| (*k, v.as_str())).collect();
        let description = prop.get("description").and_then(Value::as_str).unwrap_or("");
        let nested = [Some(prop), prop.get("items")]
            .into_iter()
            .flatten()
            .find(|p| p.get("properties").is_some_and(Value::is_object));
        match nested {
            Some(inner) if depth < MAX_SCHEMA_DEPTH => {
                x.start("field", &attrs);
                x.text(description);
                fields(x, inner, depth + 1);
                x.end("field");
            }
            _ if description.is_empty() => x.empty("field", &attrs),
            _ => {
                x.start("field", &attrs);
                x.text(description);
                x.end("field");
            }
        }
    }
}

fn scalar(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn forbidden_characters_are_replaced() {
        assert_eq!(clean("a\u{0}b\u{1F}c\td"), "a\u{FFFD}b\u{FFFD}c\td");
        assert!(matches!(clean("plain <&>"), Cow::Borrowed(_)));
    }
}
