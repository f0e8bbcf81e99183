use std::sync::Arc;

use libp2p::identity::PeerId;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::*;
use crate::card::AgentCard;
use crate::registry::health::Reported;
use crate::registry::{Origin, RecordKey};

const T: Thresholds = Thresholds {
    degraded_after: std::time::Duration::from_secs(6),
    inactive_after: std::time::Duration::from_secs(20),
};
const WORDS: [&str; 6] = ["plan", "search", "sum", "x", "research", "plant"];
const TAGS: [&str; 5] = ["ml", "nlp", "vision", "m", "web"];

fn pick<'a>(rng: &mut StdRng, list: &[&'a str]) -> &'a str {
    list[rng.random_range(0..list.len())]
}

/// A random card: up to three reasoners and skills, ids made of the words (so patterns overlap),
/// tags, metadata, media types, a version and a group.
fn card(rng: &mut StdRng, id: &str) -> AgentCard {
    let mut caps = |kind: &str| {
        (0..rng.random_range(0..4))
            .map(|k| {
                let tags: Vec<&str> = (0..rng.random_range(0..3)).map(|_| pick(rng, &TAGS)).collect();
                let mut cap = serde_json::json!({
                    "id": format!("{}_{}{kind}{k}", pick(rng, &WORDS), pick(rng, &WORDS)),
                    "tags": tags,
                });
                if rng.random_bool(0.3) {
                    cap["metadata"] = serde_json::json!({"team": pick(rng, &["pay", "ops"])});
                }
                if rng.random_bool(0.3) {
                    cap["input_modes"] = serde_json::json!([pick(rng, &["audio/wav", "text/plain"])]);
                }
                cap
            })
            .collect::<Vec<_>>()
    };
    let (reasoners, skills) = (caps("r"), caps("s"));
    let json = serde_json::json!({
        "agent_id": id,
        "base_url": "http://127.0.0.1:1",
        "version": format!("1.{}.0", rng.random_range(0..3)),
        "group_id": pick(rng, &["g1", "g2"]),
        "reasoners": reasoners,
        "skills": skills,
    });
    AgentCard::from_json(json.to_string().as_bytes()).expect("valid random card")
}

fn entry(rng: &mut StdRng, id: &str, publisher: PeerId) -> Arc<Entry> {
    let key = RecordKey { agent_id: id.to_owned(), publisher };
    let entry = Entry::new(key, 1, &card(rng, id), Origin::Remote, 0);
    match rng.random_range(0..4) {
        0 => {}
        1 => entry.beat(rng.random_range(0..30_000), Reported::Ready),
        2 => entry.beat(rng.random_range(0..30_000), Reported::Degraded),
        _ => entry.beat(rng.random_range(0..30_000), Reported::Busy),
    }
    Arc::new(entry)
}

fn snapshot(generation: u64, mut entries: Vec<Arc<Entry>>) -> Snapshot {
    entries.sort_by(|a, b| a.key.cmp(&b.key));
    Snapshot::new(generation, entries)
}

fn random_query(rng: &mut StdRng) -> String {
    let pattern = |rng: &mut StdRng, list: &[&str]| {
        let word = pick(rng, list);
        match rng.random_range(0..6) {
            0 => word.to_owned(),
            1 => format!("{word}*"),
            2 => format!("*{word}"),
            3 => format!("*{word}*"),
            4 => format!("{}*{}", &word[..1], &word[word.len() - 1..]),
            _ => format!("{word}_{}", pick(rng, list)),
        }
    };
    let mut params = Vec::new();
    if rng.random_bool(0.4) {
        params.push(format!("reasoner={}", pattern(rng, &WORDS)));
    }
    if rng.random_bool(0.4) {
        params.push(format!("skill={}", pattern(rng, &WORDS)));
    }
    if rng.random_bool(0.4) {
        let tags: Vec<String> = (0..rng.random_range(1..3)).map(|_| pattern(rng, &TAGS)).collect();
        params.push(format!("tags={}", tags.join(",")));
    }
    if rng.random_bool(0.3) {
        params.push(format!("health_status={}", pick(rng, &["active", "degraded", "inactive", "unknown"])));
    }
    if rng.random_bool(0.15) {
        params.push(format!("version={}", pick(rng, &["latest", "1.1.0"])));
    }
    if rng.random_bool(0.15) {
        params.push(format!("lifecycle={}", pick(rng, &["ready", "busy"])));
    }
    if rng.random_bool(0.15) {
        params.push(format!("metadata.team={}", pick(rng, &["pay", "o*"])));
    }
    if rng.random_bool(0.15) {
        params.push("input_mode=audio/*".to_owned());
    }
    params.push(format!("limit={}", rng.random_range(0..8)));
    // Pages at the start, and anywhere in the view (in a later chunk).
    let offset = if rng.random_bool(0.5) { rng.random_range(0..6) } else { rng.random_range(0..600) };
    params.push(format!("offset={offset}"));
    params.join("&")
}

/// What a user sees of a selection: the counts, and each page record with its capabilities.
fn seen(sel: &Selection<'_>) -> impl PartialEq + std::fmt::Debug {
    let page: Vec<_> = sel
        .page
        .iter()
        .map(|h| (h.entry.key.clone(), h.health, h.last_heartbeat, h.reasoners.clone(), h.skills.clone()))
        .collect();
    (sel.total_agents, sel.total_reasoners, sel.total_skills, sel.has_more, sel.valid_until, page)
}

fn agree(index: &ViewIndex, snapshot: &Snapshot, raw: &str, now: Millis) {
    let query = Query::parse(raw).expect("valid random query");
    let scanned = super::super::select(&snapshot.entries, &query, now, &T);
    let indexed = select(index, &query, now, &T);
    assert_eq!(seen(&indexed), seen(&scanned), "query {raw}");
}

#[test]
fn the_index_answers_as_the_scan_does() {
    for seed in 0..20 {
        let mut rng = StdRng::seed_from_u64(seed);
        let publishers = [PeerId::random(), PeerId::random()];
        let entries: Vec<_> = (0..rng.random_range(0..700))
            .map(|i| {
                let publisher = publishers[rng.random_range(0..2)];
                entry(&mut rng, &format!("agent-{:03}", i % 500), publisher)
            })
            .collect();
        let mut dedup = std::collections::BTreeMap::new();
        for e in entries {
            dedup.insert(e.key.clone(), e);
        }
        let snap = snapshot(1, dedup.into_values().collect());
        let index = ViewIndex::build(&snap);
        assert_eq!(index.len(), snap.entries.len());
        for _ in 0..60 {
            let raw = random_query(&mut rng);
            agree(&index, &snap, &raw, rng.random_range(0..40_000));
        }
    }
}

#[test]
fn a_refreshed_index_answers_as_a_fresh_one_and_shares_what_did_not_change() {
    let mut rng = StdRng::seed_from_u64(7);
    let publisher = PeerId::random();
    let mut entries: Vec<Arc<Entry>> =
        (0..3000).map(|i| entry(&mut rng, &format!("agent-{i:05}"), publisher)).collect();
    let mut snap = snapshot(1, entries.clone());
    let mut index = ViewIndex::build(&snap);
    for generation in 2..60 {
        // A handful of changes: new records, replaced ones (a new card version), removed ones.
        let changes = rng.random_range(1..4);
        for _ in 0..changes {
            match rng.random_range(0..3) {
                0 => {
                    let id = format!("agent-{:05}", rng.random_range(0..9999));
                    entries.push(entry(&mut rng, &id, publisher));
                }
                1 if !entries.is_empty() => {
                    let at = rng.random_range(0..entries.len());
                    let id = entries[at].key.agent_id.clone();
                    entries[at] = entry(&mut rng, &id, publisher);
                }
                _ if !entries.is_empty() => {
                    entries.swap_remove(rng.random_range(0..entries.len()));
                }
                _ => {}
            }
        }
        let mut dedup = std::collections::BTreeMap::new();
        for e in &entries {
            dedup.insert(e.key.clone(), e.clone());
        }
        entries = dedup.into_values().collect();
        snap = snapshot(generation, entries.clone());
        let next = ViewIndex::refreshed(Some(&index), &snap);
        assert_eq!(next.len(), snap.entries.len());
        let shared = next.chunks.iter().filter(|c| index.chunks.iter().any(|o| Arc::ptr_eq(o, c))).count();
        assert!(
            shared + 2 * changes + 1 >= next.chunks.len(),
            "generation {generation}: {changes} changes rebuilt {} of {} chunks",
            next.chunks.len() - shared,
            next.chunks.len()
        );
        assert!(next.chunks.iter().all(|c| c.len() <= INDEX_CHUNK));
        for _ in 0..10 {
            let raw = random_query(&mut rng);
            agree(&next, &snap, &raw, rng.random_range(0..40_000));
        }
        index = next;
    }
}

#[test]
fn removals_merge_small_chunks_and_the_order_holds() {
    let mut rng = StdRng::seed_from_u64(3);
    let publisher = PeerId::random();
    let all: Vec<Arc<Entry>> = (0..2000).map(|i| entry(&mut rng, &format!("a{i:05}"), publisher)).collect();
    let mut index = ViewIndex::build(&snapshot(1, all.clone()));
    // Keep one record in ten: chunks shrink below the minimum and merge.
    let kept: Vec<_> = all.iter().step_by(10).cloned().collect();
    let snap = snapshot(2, kept);
    index = ViewIndex::refreshed(Some(&index), &snap);
    assert!(
        index.chunks.len() <= snap.entries.len().div_ceil(MIN_CHUNK) + 1,
        "{} chunks",
        index.chunks.len()
    );
    let order: Vec<_> = index.chunks.iter().flat_map(|c| c.entries.iter().map(|e| e.key.clone())).collect();
    let want: Vec<_> = snap.entries.iter().map(|e| e.key.clone()).collect();
    assert_eq!(order, want);
    agree(&index, &snap, "limit=500", 0);
}

#[test]
fn a_dictionary_full_of_unused_names_is_started_afresh() {
    let mut rng = StdRng::seed_from_u64(11);
    let publisher = PeerId::random();
    let mut index = ViewIndex::build(&snapshot(1, vec![entry(&mut rng, "a", publisher)]));
    let first = index.terms.clone();
    // One record whose capability ids change on every generation: each version adds new names.
    for generation in 2..(INDEX_TERM_SLACK as u64 / 4 + 10) {
        let json = serde_json::json!({
            "agent_id": "a", "base_url": "http://127.0.0.1:1",
            "reasoners": [{"id": format!("r{generation}")}, {"id": format!("q{generation}")}],
            "skills": [{"id": format!("s{generation}"), "tags": [format!("t{generation}")]}],
        });
        let card = AgentCard::from_json(json.to_string().as_bytes()).unwrap();
        let key = RecordKey { agent_id: "a".into(), publisher };
        let snap =
            snapshot(generation, vec![Arc::new(Entry::new(key, generation, &card, Origin::Remote, 0))]);
        index = ViewIndex::refreshed(Some(&index), &snap);
        assert!(index.terms() <= 2 * 4 + INDEX_TERM_SLACK + 4, "the dictionary stays bounded");
        agree(&index, &snap, &format!("reasoner=r{generation}"), 0);
    }
    assert!(!Arc::ptr_eq(&first, &index.terms), "a fresh dictionary was started");
}

#[test]
fn the_indexer_follows_generations_and_never_waits() {
    let mut rng = StdRng::seed_from_u64(5);
    let publisher = PeerId::random();
    let indexer = Indexer::default();
    let a = snapshot(1, (0..10).map(|i| entry(&mut rng, &format!("a{i}"), publisher)).collect());
    let first = indexer.index(&a).expect("nobody else is building");
    assert_eq!(first.generation(), 1);
    assert!(Arc::ptr_eq(&first, &indexer.index(&a).unwrap()), "the same generation is served as is");
    let b = snapshot(2, (0..12).map(|i| entry(&mut rng, &format!("a{i}"), publisher)).collect());
    {
        let _other_builder = indexer.building.lock().unwrap();
        assert!(indexer.index(&b).is_none(), "while another thread builds, the caller scans");
        assert!(indexer.index(&a).is_some(), "the generation held is still served");
    }
    assert_eq!(indexer.index(&b).unwrap().len(), 12);
    // A slow reader with the older snapshot gets its own answer; the newer index stays.
    assert_eq!(indexer.index(&a).unwrap().generation(), 1);
    assert_eq!(indexer.current().unwrap().generation(), 2);
}
