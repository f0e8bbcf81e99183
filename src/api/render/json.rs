//! `format=json`: the AgentField discovery response, plus mesh facts as extra keys per agent.

use std::borrow::Cow;
use std::collections::BTreeMap;

use serde::Serialize;
use serde_json::value::RawValue;

use super::prepared::{self, Form, Prepared, PreparedCache};
use super::{reasoner_target, skill_target};
use crate::card::held::{CapRef, CardRef, CardText, MetadataRef};
use crate::clock::rfc3339;
use crate::query::{Hit, Query, Selection};
use crate::registry::health::Millis;
use crate::registry::Entry;

#[derive(Serialize)]
struct Response<'a> {
    discovered_at: String,
    total_agents: usize,
    total_reasoners: usize,
    total_skills: usize,
    pagination: Pagination,
    capabilities: Vec<Agent<'a>>,
}

#[derive(Serialize)]
struct Pagination {
    limit: usize,
    offset: usize,
    has_more: bool,
}

#[derive(Serialize)]
struct Agent<'a> {
    agent_id: &'a str,
    /// AgentField's group: the card's `group_id`, else the agent id.
    group_id: &'a str,
    base_url: &'a str,
    version: &'a str,
    health_status: &'static str,
    /// Whether it takes new work: `ready`, `busy` or `draining`, as it reports.
    lifecycle: &'static str,
    deployment_type: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    category: Option<&'a str>,
    last_heartbeat: String,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    metadata: &'a MetadataRef<'a>,
    reasoners: Vec<Cap<'a>>,
    skills: Vec<Cap<'a>>,
    /// PeerId of the node that signed and published the card.
    publisher: &'a str,
    /// Whether the agent is registered with this node.
    local: bool,
    seq: u64,
}

#[derive(Serialize)]
struct Cap<'a> {
    id: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    description: Option<&'a str>,
    tags: &'a [Cow<'a, str>],
    #[serde(skip_serializing_if = "Option::is_none")]
    input_schema: Option<&'a RawValue>,
    #[serde(skip_serializing_if = "Option::is_none")]
    output_schema: Option<&'a RawValue>,
    #[serde(skip_serializing_if = "Option::is_none")]
    examples: Option<&'a [&'a RawValue]>,
    #[serde(skip_serializing_if = "Option::is_none")]
    category: Option<&'a str>,
    #[serde(skip_serializing_if = "<[_]>::is_empty")]
    requires: &'a [Cow<'a, str>],
    #[serde(skip_serializing_if = "<[_]>::is_empty")]
    required_secrets: &'a [Cow<'a, str>],
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    has_side_effects: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    confidence_hint: Option<f64>,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    metadata: &'a MetadataRef<'a>,
    invocation_target: String,
}

/// Which optional keys a capability carries; skills never carry output schemas or examples.
#[derive(Clone, Copy)]
struct Include {
    descriptions: bool,
    input_schema: bool,
    output_schema: bool,
    examples: bool,
}

fn cap<'a>(c: &'a CapRef<'a>, card: &'a CardRef<'a>, target: String, inc: Include) -> Cap<'a> {
    Cap {
        category: c.category_in(card),
        requires: &c.requires,
        required_secrets: &c.required_secrets,
        has_side_effects: c.has_side_effects,
        confidence_hint: c.confidence_hint,
        metadata: &c.metadata,
        id: &c.id,
        description: c.description.as_deref().filter(|_| inc.descriptions),
        tags: &c.tags,
        input_schema: c.input_schema.filter(|_| inc.input_schema),
        output_schema: c.output_schema.filter(|_| inc.output_schema),
        examples: Some(c.examples.as_slice()).filter(|e| inc.examples && !e.is_empty()),
        invocation_target: target,
    }
}

fn agent<'a>(hit: &'a Hit<'a>, card: &'a CardRef<'a>, q: &Query) -> Agent<'a> {
    let e = hit.entry;
    let for_reasoners = Include {
        descriptions: q.include_descriptions,
        input_schema: q.include_input_schema,
        output_schema: q.include_output_schema,
        examples: q.include_examples,
    };
    let for_skills = Include { output_schema: false, examples: false, ..for_reasoners };
    let pick = |list: &'a [CapRef<'a>], at: &'a [usize], target: fn(&str, &str) -> String, inc: Include| {
        at.iter()
            .filter_map(|&i| list.get(i))
            .map(|c| cap(c, card, target(&card.agent_id, &c.id), inc))
            .collect::<Vec<_>>()
    };
    Agent {
        agent_id: &card.agent_id,
        group_id: card.group(),
        base_url: &card.base_url,
        version: &card.version,
        health_status: hit.health.as_str(),
        lifecycle: e.lifecycle().as_str(),
        metadata: &card.metadata,
        deployment_type: &card.deployment_type,
        category: card.category.as_deref(),
        last_heartbeat: rfc3339(hit.last_heartbeat.unwrap_or(e.updated_at)),
        reasoners: pick(&card.reasoners, &hit.reasoners, reasoner_target, for_reasoners),
        skills: pick(&card.skills, &hit.skills, skill_target, for_skills),
        publisher: &e.publisher_name,
        local: e.is_local(),
        seq: e.seq,
    }
}

pub fn render(sel: &Selection<'_>, q: &Query, now: Millis) -> Vec<u8> {
    let texts: Vec<CardText> = sel.page.iter().map(|h| h.entry.card.text()).collect();
    let views: Vec<CardRef<'_>> = texts.iter().map(CardText::view).collect();
    let response = Response {
        discovered_at: rfc3339(now),
        total_agents: sel.total_agents,
        total_reasoners: sel.total_reasoners,
        total_skills: sel.total_skills,
        pagination: Pagination { limit: q.limit, offset: q.offset, has_more: sel.has_more },
        capabilities: sel.page.iter().zip(&views).map(|(h, v)| agent(h, v, q)).collect(),
    };
    // Only strings, numbers and already-valid raw JSON: serialisation cannot fail.
    serde_json::to_vec(&response).unwrap_or_default()
}

/// The record of `entry` prepared for JSON answers with `q`'s include flags: pieces `{"agent_id":…,
/// "health_status":`, `,"deployment_type":…,"last_heartbeat":`, `,"metadata":…,"reasoners":[` and
/// `],"publisher":…}`, and each capability's object.
fn prepare(entry: &Entry, q: &Query) -> Prepared {
    let card_text = entry.card.text();
    let view = card_text.view();
    let hit = prepared::whole(entry, view.reasoners.len(), view.skills.len());
    let agent = agent(&hit, &view, q);
    let json = |value: &dyn erased::Json| value.bytes();
    let mut head = br#"{"agent_id":"#.to_vec();
    for (key, value) in [
        ("", &agent.agent_id as &dyn erased::Json),
        ("group_id", &agent.group_id),
        ("base_url", &agent.base_url),
        ("version", &agent.version),
    ] {
        if !key.is_empty() {
            head.extend_from_slice(format!(",\"{key}\":").as_bytes());
        }
        head.extend_from_slice(&json(value));
    }
    head.extend_from_slice(br#","health_status":"#);
    let mut middle = br#","deployment_type":"#.to_vec();
    middle.extend_from_slice(&json(&agent.deployment_type));
    if let Some(category) = &agent.category {
        middle.extend_from_slice(br#","category":"#);
        middle.extend_from_slice(&json(category));
    }
    middle.extend_from_slice(br#","last_heartbeat":"#);
    let mut before_caps = Vec::new();
    if !agent.metadata.is_empty() {
        before_caps.extend_from_slice(br#","metadata":"#);
        before_caps.extend_from_slice(&json(&agent.metadata));
    }
    before_caps.extend_from_slice(br#","reasoners":["#);
    let mut tail = br#"],"publisher":"#.to_vec();
    tail.extend_from_slice(&json(&agent.publisher));
    tail.extend_from_slice(format!(",\"local\":{},\"seq\":{}}}", agent.local, agent.seq).as_bytes());
    let caps = |list: &[Cap<'_>]| list.iter().map(|c| json(c)).collect();
    Prepared::new(vec![head, middle, before_caps, tail], caps(&agent.reasoners), caps(&agent.skills))
}

/// Appends the agent object of `hit` from its prepared record.
fn write(p: &Prepared, hit: &Hit<'_>, out: &mut Vec<u8>) {
    let json = |out: &mut Vec<u8>, s: &str| {
        // Health, lifecycle and a timestamp: plain ASCII, nothing to escape.
        out.push(b'"');
        out.extend_from_slice(s.as_bytes());
        out.push(b'"');
    };
    out.extend_from_slice(p.piece(0));
    json(out, hit.health.as_str());
    out.extend_from_slice(br#","lifecycle":"#);
    json(out, hit.entry.lifecycle().as_str());
    out.extend_from_slice(p.piece(1));
    out.push(b'"');
    crate::clock::write_rfc3339(hit.last_heartbeat.unwrap_or(hit.entry.updated_at), out);
    out.push(b'"');
    out.extend_from_slice(p.piece(2));
    Prepared::caps(&p.reasoners, &hit.reasoners, b",", out);
    out.extend_from_slice(br#"],"skills":["#);
    Prepared::caps(&p.skills, &hit.skills, b",", out);
    out.extend_from_slice(p.piece(3));
}

/// Serialises one value to compact JSON, as the response's serialiser would inside the response.
mod erased {
    pub trait Json {
        fn bytes(&self) -> Vec<u8>;
    }

    impl<T: serde::Serialize + ?Sized> Json for T {
        fn bytes(&self) -> Vec<u8> {
            // Strings, maps of strings and valid raw JSON: serialisation cannot fail.
            serde_json::to_vec(self).unwrap_or_default()
        }
    }
}

/// The same bytes as [`render`], from records prepared once per set of include flags.
pub fn render_prepared(sel: &Selection<'_>, q: &Query, now: Millis, cache: &PreparedCache) -> Vec<u8> {
    let prepared = cache.page(&sel.page, Form::json(q), |entry| prepare(entry, q));
    let mut out = super::buffers::take(super::prepared::page_len(&prepared));
    out.extend_from_slice(br#"{"discovered_at":"#);
    out.extend_from_slice(&erased::Json::bytes(&rfc3339(now)));
    out.extend_from_slice(
        format!(
            ",\"total_agents\":{},\"total_reasoners\":{},\"total_skills\":{},\"pagination\":{{\"limit\":{},\"offset\":{},\"has_more\":{}}},\"capabilities\":[",
            sel.total_agents, sel.total_reasoners, sel.total_skills, q.limit, q.offset, sel.has_more
        )
        .as_bytes(),
    );
    for (n, (hit, p)) in sel.page.iter().zip(&prepared).enumerate() {
        if n > 0 {
            out.push(b',');
        }
        write(p, hit, &mut out);
    }
    out.extend_from_slice(b"]}");
    out
}
