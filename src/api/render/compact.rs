//! `format=compact`: flat lists of reasoners and skills with their targets.

use serde::Serialize;

use super::{reasoner_target, rfc3339, skill_target};
use crate::query::Selection;
use crate::registry::health::Millis;

#[derive(Serialize)]
struct Response<'a> {
    discovered_at: String,
    reasoners: Vec<Item<'a>>,
    skills: Vec<Item<'a>>,
}

#[derive(Serialize)]
struct Item<'a> {
    id: &'a str,
    agent_id: &'a str,
    target: String,
    tags: Vec<&'a str>,
}

pub fn render(sel: &Selection<'_>, now: Millis) -> Vec<u8> {
    let mut response = Response { discovered_at: rfc3339(now), reasoners: Vec::new(), skills: Vec::new() };
    for hit in &sel.page {
        let agent_id = hit.entry.key.agent_id.as_str();
        // The packed index holds exactly what this format shows: no need to parse the card.
        for (_, cap) in hit.entry.card.reasoners().enumerate().filter(|(i, _)| hit.reasoners.contains(i)) {
            response.reasoners.push(Item {
                id: cap.id,
                agent_id,
                target: reasoner_target(agent_id, cap.id),
                tags: cap.tags.collect(),
            });
        }
        for (_, cap) in hit.entry.card.skills().enumerate().filter(|(i, _)| hit.skills.contains(i)) {
            response.skills.push(Item {
                id: cap.id,
                agent_id,
                target: skill_target(agent_id, cap.id),
                tags: cap.tags.collect(),
            });
        }
    }
    serde_json::to_vec(&response).unwrap_or_default()
}
