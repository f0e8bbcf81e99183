//! One render step per discovery format. Each takes the same [`Selection`](crate::query::Selection) and
//! returns the body bytes. Page hits are read through [`CardRef`](crate::card::held::CardRef), a
//! zero-copy view of the held card.

pub mod buffers;
pub mod compact;
pub mod json;
pub mod prepared;
pub mod xml;

/// `<agent_id>:<reasoner_id>`.
pub fn reasoner_target(agent_id: &str, reasoner_id: &str) -> String {
    format!("{agent_id}:{reasoner_id}")
}

/// `<agent_id>:skill:<skill_id>`.
pub fn skill_target(agent_id: &str, skill_id: &str) -> String {
    format!("{agent_id}:skill:{skill_id}")
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::prepared::{Form, PreparedCache};
    use crate::card::AgentCard;
    use crate::query::{select, Query, Selection};
    use crate::registry::health::{Millis, Reported, Thresholds};
    use crate::registry::{Entry, Liveness, Origin, RecordKey};

    /// Three records: one with every field a format shows (markup, quotes, non-ASCII, schemas with
    /// fields, examples), and two plain ones; with health from heartbeats or none.
    fn entries() -> Vec<Arc<Entry>> {
        let publisher = libp2p::PeerId::random();
        let cards = [
            serde_json::json!({"agent_id": "a1", "base_url": "http://h:1/?a=1&b=<2>", "version": "1.0.0",
                "description": "say \"hi\" \u{e9}", "category": "ops", "group_id": "g",
                "metadata": {"owner_team": "pay\"ments", "tier": "1"},
                "reasoners": [
                    {"id": "r1", "description": "one\nline <b>&amp;'x'", "tags": ["t1", "t\u{e9}"],
                     "input_schema": {"type": "object", "required": ["q"], "properties": {
                        "q": {"type": "string", "description": "the <query>", "minLength": 1},
                        "opts": {"type": "object", "properties": {"n": {"type": ["integer", "null"], "default": 3}}}}},
                     "output_schema": {"type": "string"}, "examples": [{"q": "x"}, "plain"],
                     "category": "math", "requires": ["b:r"], "has_side_effects": true,
                     "confidence_hint": 0.5, "metadata": {"k": "v"}},
                    {"id": "r2"}],
                "skills": [{"id": "s1", "description": "d", "tags": ["t1"], "input_schema": {"type": "object"},
                            "required_secrets": ["KEY"]}]}),
            serde_json::json!({"agent_id": "a2", "base_url": "http://h:2", "skills": [{"id": "s"}]}),
            serde_json::json!({"agent_id": "a3", "base_url": "http://h:3", "reasoners": [{"id": "x"}]}),
        ];
        let mut out: Vec<Arc<Entry>> = cards
            .iter()
            .enumerate()
            .map(|(i, json)| {
                let card = AgentCard::from_json(json.to_string().as_bytes()).unwrap();
                let key = RecordKey { agent_id: card.agent_id.clone(), publisher };
                let origin = if i == 0 { Origin::Local(Liveness::Agent) } else { Origin::Remote };
                let entry = Entry::new(key, 7 + i as u64, &card, origin, 1_000);
                if i < 2 {
                    entry.beat(5_000, if i == 0 { Reported::Busy } else { Reported::Degraded });
                }
                Arc::new(entry)
            })
            .collect();
        out.sort_by(|a, b| a.key.cmp(&b.key));
        out
    }

    /// Asserts that `prepared` answers every query of a varied set with the bytes `plain` renders,
    /// both when it prepares the records and when it finds them held.
    fn same_bytes(
        plain: impl Fn(&Selection<'_>, &Query, Millis) -> Vec<u8>,
        prepared: impl Fn(&Selection<'_>, &Query, Millis, &PreparedCache) -> Vec<u8>,
        form: impl Fn(&Query) -> Form,
    ) {
        let entries = entries();
        let cache = PreparedCache::default();
        for raw in [
            "",
            "include_input_schema=true&include_output_schema=true&include_examples=true",
            "include_descriptions=false",
            "reasoner=r1",
            "skill=s*&tags=t1",
            "limit=1&offset=1",
            "limit=0",
            "include_examples=true&include_descriptions=false&tags=t%C3%A9",
            "include_input_schema=true&reasoner=*1",
        ] {
            let q = Query::parse(raw).unwrap();
            for now in [6_000, 30_000] {
                let sel = select(&entries, &q, now, &Thresholds::default());
                let want = plain(&sel, &q, now);
                // Twice: prepared, then from the cache.
                assert_eq!(
                    String::from_utf8(prepared(&sel, &q, now, &cache)).unwrap(),
                    String::from_utf8(want.clone()).unwrap(),
                    "{raw}"
                );
                let body = prepared(&sel, &q, now, &cache);
                assert_eq!(body, want, "{raw}, cached");
                // The page was written into the room taken for it, never grown (these pages are below
                // the pool's sizes, so the room is exactly what was asked).
                let records = cache.page(&sel.page, form(&q), |_| unreachable!("prepared above"));
                assert_eq!(body.capacity(), super::prepared::page_len(&records), "{raw}: the room taken");
            }
        }
        assert!(cache.bytes() > 0);
    }

    #[test]
    fn every_prepared_renderer_gives_the_plain_renderers_bytes() {
        same_bytes(super::json::render, super::json::render_prepared, Form::json);
        same_bytes(super::xml::render, super::xml::render_prepared, Form::xml);
        same_bytes(
            |sel, _, now| super::compact::render(sel, now),
            |sel, _, now, cache| super::compact::render_prepared(sel, now, cache),
            |_| Form::compact(),
        );
    }
}
