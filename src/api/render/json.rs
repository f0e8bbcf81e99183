//! `format=json`: the AgentField discovery response, plus mesh facts as extra keys per agent.

use serde::Serialize;
use serde_json::value::RawValue;

use super::{reasoner_target, rfc3339, skill_target};
use crate::card::Capability;
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
    base_url: &'a str,
    version: &'a str,
    health_status: &'static str,
    deployment_type: &'a str,
    last_heartbeat: String,
    reasoners: Vec<Cap<'a>>,
    skills: Vec<Cap<'a>>,
    /// PeerId of the node that signed and published the card.
    publisher: String,
    /// Whether the agent is registered with this node.
    local: bool,
    seq: u64,
}

#[derive(Serialize)]
struct Cap<'a> {
    id: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    description: Option<&'a str>,
    tags: &'a [String],
    #[serde(skip_serializing_if = "Option::is_none")]
    input_schema: Option<&'a RawValue>,
    #[serde(skip_serializing_if = "Option::is_none")]
    output_schema: Option<&'a RawValue>,
    #[serde(skip_serializing_if = "Option::is_none")]
    examples: Option<&'a [Box<RawValue>]>,
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

fn cap<'a>(c: &'a Capability, target: String, inc: Include) -> Cap<'a> {
    Cap {
        id: &c.id,
        description: c.description.as_deref().filter(|_| inc.descriptions),
        tags: &c.tags,
        input_schema: c.input_schema.as_deref().filter(|_| inc.input_schema),
        output_schema: c.output_schema.as_deref().filter(|_| inc.output_schema),
        examples: Some(c.examples.as_slice()).filter(|e| inc.examples && !e.is_empty()),
        invocation_target: target,
    }
}

fn agent<'a>(hit: &Hit<'a>, q: &Query) -> Agent<'a> {
    let e = hit.entry;
    let card = &e.card;
    let for_reasoners = Include {
        descriptions: q.include_descriptions,
        input_schema: q.include_input_schema,
        output_schema: q.include_output_schema,
        examples: q.include_examples,
    };
    let for_skills = Include { output_schema: false, examples: false, ..for_reasoners };
    Agent {
        agent_id: &card.agent_id,
        base_url: &card.base_url,
        version: &card.version,
        health_status: hit.health.as_str(),
        deployment_type: &card.deployment_type,
        last_heartbeat: rfc3339(hit.last_heartbeat.unwrap_or(e.updated_at)),
        reasoners: hit
            .reasoners
            .iter()
            .map(|&i| cap(&card.reasoners[i], reasoner_target(card, i), for_reasoners))
            .collect(),
        skills: hit.skills.iter().map(|&i| cap(&card.skills[i], skill_target(card, i), for_skills)).collect(),
        publisher: e.key.publisher.to_base58(),
        local: e.is_local(),
        seq: e.seq,
    }
}

pub fn render(sel: &Selection<'_>, q: &Query, now: Millis) -> Vec<u8> {
    let response = Response {
        discovered_at: rfc3339(now),
        total_agents: sel.total_agents,
        total_reasoners: sel.total_reasoners,
        total_skills: sel.total_skills,
        pagination: Pagination { limit: q.limit, offset: q.offset, has_more: sel.has_more },
        capabilities: sel.page.iter().map(|h| agent(h, q)).collect(),
    };
    // Only strings, numbers and already-valid raw JSON: serialisation cannot fail.
    serde_json::to_vec(&response).unwrap_or_default()
}
