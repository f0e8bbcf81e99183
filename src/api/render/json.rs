//! `format=json`: the AgentField discovery response, plus mesh facts as extra keys per agent.

use std::borrow::Cow;
use std::collections::BTreeMap;

use serde::Serialize;
use serde_json::value::RawValue;

use super::{reasoner_target, skill_target};
use crate::card::held::{CapRef, CardRef, MetadataRef};
use crate::clock::rfc3339;
use crate::query::{Hit, Query, Selection};
use crate::registry::health::Millis;

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
    let views: Vec<CardRef<'_>> = sel.page.iter().map(|h| h.entry.card.view()).collect();
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
