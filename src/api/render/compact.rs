//! `format=compact`: flat lists of reasoners and skills with their targets.

use serde::Serialize;

use super::{reasoner_target, skill_target};
use crate::clock::rfc3339;
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
        let kinds = [
            (
                hit.entry.card.reasoners(),
                &hit.reasoners,
                &mut response.reasoners,
                reasoner_target as fn(&str, &str) -> String,
            ),
            (hit.entry.card.skills(), &hit.skills, &mut response.skills, skill_target),
        ];
        for (caps, wanted, out, target) in kinds {
            for (_, cap) in caps.enumerate().filter(|(i, _)| wanted.contains(i)) {
                out.push(Item {
                    id: cap.id,
                    agent_id,
                    target: target(agent_id, cap.id),
                    tags: cap.tags.collect(),
                });
            }
        }
    }
    serde_json::to_vec(&response).unwrap_or_default()
}
