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
    tags: &'a [String],
}

pub fn render(sel: &Selection<'_>, now: Millis) -> Vec<u8> {
    let mut response = Response { discovered_at: rfc3339(now), reasoners: Vec::new(), skills: Vec::new() };
    for hit in &sel.page {
        let card = &hit.entry.card;
        for &i in &hit.reasoners {
            let r = &card.reasoners[i];
            response.reasoners.push(Item {
                id: &r.id,
                agent_id: &card.agent_id,
                target: reasoner_target(card, i),
                tags: &r.tags,
            });
        }
        for &i in &hit.skills {
            let s = &card.skills[i];
            response.skills.push(Item {
                id: &s.id,
                agent_id: &card.agent_id,
                target: skill_target(card, i),
                tags: &s.tags,
            });
        }
    }
    serde_json::to_vec(&response).unwrap_or_default()
}
