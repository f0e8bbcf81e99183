//! `format=compact`: flat lists of reasoners and skills with their targets.

use serde::Serialize;

use super::prepared::{Form, Prepared, PreparedCache};
use super::{reasoner_target, skill_target};
use crate::clock::rfc3339;
use crate::query::Selection;
use crate::registry::health::Millis;
use crate::registry::Entry;

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

/// The record of `entry` prepared for compact answers: each capability's item.
fn prepare(entry: &Entry) -> Prepared {
    let agent_id = entry.key.agent_id.as_str();
    let items = |caps: crate::card::held::Caps<'_>, target: fn(&str, &str) -> String| {
        caps.map(|cap| {
            let item =
                Item { id: cap.id, agent_id, target: target(agent_id, cap.id), tags: cap.tags.collect() };
            // Strings only: serialisation cannot fail.
            serde_json::to_vec(&item).unwrap_or_default()
        })
        .collect()
    };
    let reasoners = items(entry.card.reasoners(), reasoner_target);
    Prepared::new(Vec::new(), reasoners, items(entry.card.skills(), skill_target))
}

/// The same bytes as [`render`], from records prepared once.
pub fn render_prepared(sel: &Selection<'_>, now: Millis, cache: &PreparedCache) -> Vec<u8> {
    let prepared = cache.page(&sel.page, Form::compact(), prepare);
    let mut out = super::buffers::take(super::prepared::page_len(&prepared));
    out.extend_from_slice(br#"{"discovered_at":""#);
    out.extend_from_slice(rfc3339(now).as_bytes());
    out.extend_from_slice(br#"","reasoners":["#);
    // Every reasoner of the page, then every skill.
    let list = |reasoners: bool, out: &mut Vec<u8>| {
        let mut first = true;
        for (hit, p) in sel.page.iter().zip(&prepared) {
            let (caps, at) =
                if reasoners { (&p.reasoners, &hit.reasoners) } else { (&p.skills, &hit.skills) };
            for item in at.iter().filter_map(|&i| caps.get(i)) {
                if !first {
                    out.push(b',');
                }
                first = false;
                out.extend_from_slice(item);
            }
        }
    };
    list(true, &mut out);
    out.extend_from_slice(br#"],"skills":["#);
    list(false, &mut out);
    out.extend_from_slice(b"]}");
    out
}
