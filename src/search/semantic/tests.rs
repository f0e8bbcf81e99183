//! The semantic ranker's plumbing on a tiny BERT (always): plans, the disk cache, the slot table,
//! the query LRU, fusion staying in 0..=1; and ranking by meaning on the real model when
//! `AGENTMESH_TEST_MODEL_DIR` names its directory.

use std::path::Path;
use std::sync::Arc;

use libp2p::identity::Keypair;
use serde_json::json;

use super::*;
use crate::card::AgentCard;
use crate::registry::health::Thresholds;
use crate::registry::{Entry, Origin, RecordKey, Snapshot};
use crate::search::{Engine, Request};

fn view(cards: &[serde_json::Value], generation: u64) -> Snapshot {
    let publisher = Keypair::generate_ed25519().public().to_peer_id();
    let mut entries: Vec<Arc<Entry>> = cards
        .iter()
        .map(|c| {
            let card = AgentCard::from_json(c.to_string().as_bytes()).unwrap();
            let key = RecordKey { agent_id: card.agent_id.clone(), publisher };
            Arc::new(Entry::new(key, 1, &card, Origin::Remote, 1))
        })
        .collect();
    entries.sort_by(|a, b| a.key.cmp(&b.key));
    Snapshot::new(generation, entries)
}

fn cards() -> Vec<serde_json::Value> {
    vec![
        json!({"agent_id": "weather", "base_url": "http://w", "skills": [
            {"id": "forecast", "description": "Hourly and daily forecast: temperature, precipitation, wind."},
            {"id": "air_quality", "description": "Air quality index and pollutant levels."}]}),
        json!({"agent_id": "fx", "base_url": "http://f", "skills": [
            {"id": "convert_currency", "description": "Converts an amount between two currencies at today's rate."}]}),
        json!({"agent_id": "mail", "base_url": "http://m", "skills": [
            {"id": "send_email", "description": "Sends an email message to one or more recipients."}]}),
    ]
}

fn tiny_semantic(cache: Option<&Path>) -> (tempfile::TempDir, Semantic) {
    let dir = tempfile::tempdir().unwrap();
    crate::search::embed::tests::tiny(dir.path());
    let semantic = Semantic::load(dir.path(), cache).unwrap();
    (dir, semantic)
}

#[test]
fn the_text_says_what_the_capability_does() {
    let card = AgentCard::from_json(
        json!({"agent_id": "a", "base_url": "http://a", "category": "weather", "skills": [
            {"id": "get_forecast", "description": "Daily forecast.", "tags": ["rain", "sun"],
             "input_schema": {"type": "object", "properties": {"city": {"type": "string", "description": "City name"}}},
             "requires": ["geo:skill:geocode"]}]})
        .to_string()
        .as_bytes(),
    )
    .unwrap();
    let bytes = serde_json::to_vec(&card).unwrap();
    let view: crate::card::held::CardRef<'_> = serde_json::from_slice(&bytes).unwrap();
    assert_eq!(embedding_text(&view.skills[0]), "get forecast. Daily forecast.");
}

#[test]
fn embeddings_are_planned_computed_once_and_kept_on_disk() {
    let cache = tempfile::tempdir().unwrap();
    let snap = view(&cards(), 1);
    {
        let (_model, semantic) = tiny_semantic(Some(cache.path()));
        let engine = Engine::with_semantic(Arc::new(semantic));
        assert_eq!(engine.catch_up(&snap, || false).unwrap(), 4, "every capability embedded");
        assert_eq!(engine.catch_up(&snap, || false).unwrap(), 0, "nothing twice");
        assert_eq!(engine.semantic().unwrap().len(), 4);
    }
    // A restart with the same model and cache re-embeds nothing.
    let (_model, semantic) = tiny_semantic(Some(cache.path()));
    let engine = Engine::with_semantic(Arc::new(semantic));
    assert_eq!(engine.catch_up(&snap, || false).unwrap(), 0, "read back from the disk cache");
    assert_eq!(engine.semantic().unwrap().len(), 4);

    // A changed card: only its text is new.
    let mut changed = cards();
    changed[1]["skills"][0]["description"] = json!("Converts money between currencies.");
    let snap2 = view(&changed, 2);
    assert_eq!(engine.catch_up(&snap2, || false).unwrap(), 1);
}

#[test]
fn a_stopped_catch_up_leaves_the_rest_for_later_and_search_uses_what_is_ready() {
    let (_model, semantic) = tiny_semantic(None);
    let engine = Engine::with_semantic(Arc::new(semantic));
    let snap = view(&cards(), 1);
    assert_eq!(engine.catch_up(&snap, || true).unwrap(), 0, "stopped before the first batch");
    let mut req = Request::new("forecast");
    req.graph = false;
    let lexical_only = engine.search(&snap, &req, 10, &Thresholds::default());
    assert_eq!(lexical_only.ranking, "lexical", "no embedding ready yet: words alone");
    assert_eq!(lexical_only.results[0].target, "weather:skill:forecast");
    engine.catch_up(&snap, || false).unwrap();
    let answer = engine.search(&snap, &req, 10, &Thresholds::default());
    assert_eq!(answer.ranking, "hybrid");
    for f in &answer.results {
        assert!((0.0..=1.0).contains(&f.relevance), "{f:?}");
    }
    // A new view: the table is for the old index until the next catch-up, so words alone again.
    let mut more = cards();
    more.push(json!({"agent_id": "x", "base_url": "http://x", "skills": [{"id": "forecast_x"}]}));
    let snap2 = view(&more, 2);
    assert_eq!(engine.search(&snap2, &req, 10, &Thresholds::default()).ranking, "lexical");
    engine.catch_up(&snap2, || false).unwrap();
    assert_eq!(engine.search(&snap2, &req, 10, &Thresholds::default()).ranking, "hybrid");
}

#[test]
fn query_embeddings_come_from_the_lru_the_second_time() {
    let (_model, semantic) = tiny_semantic(None);
    let a = semantic.query("the cat sat").unwrap();
    let b = semantic.query("the cat sat").unwrap();
    assert!(Arc::ptr_eq(&a, &b), "the second is the cached one");
    let mut lru = Queries::default();
    for i in 0..QUERY_CACHE + 10 {
        lru.put(format!("q{i}"), a.clone());
    }
    assert_eq!(lru.map.len(), QUERY_CACHE, "bounded");
    assert!(lru.get("q0").is_none() && lru.get(&format!("q{}", QUERY_CACHE + 9)).is_some(), "oldest out");
}

fn real_model(test: &str) -> Option<std::path::PathBuf> {
    let dir = std::env::var_os("AGENTMESH_TEST_MODEL_DIR").map(std::path::PathBuf::from);
    if dir.is_none() {
        println!("{test} skipped: set AGENTMESH_TEST_MODEL_DIR to a sentence-transformers all-MiniLM-L6-v2 directory");
    }
    dir
}

#[test]
fn real_model_finds_a_capability_that_shares_no_word_with_the_query() {
    let Some(dir) = real_model("real_model_finds_a_capability_that_shares_no_word_with_the_query") else {
        return;
    };
    let engine = Engine::with_semantic(Arc::new(Semantic::load(&dir, None).unwrap()));
    let snap = view(&cards(), 1);
    engine.catch_up(&snap, || false).unwrap();
    let search = |q: &str| {
        let mut req = Request::new(q);
        req.graph = false;
        engine.search(&snap, &req, 10, &Thresholds::default())
    };
    // No word in common with "Hourly and daily forecast..." (nor its id).
    let answer = search("will I need an umbrella tomorrow");
    assert_eq!(answer.ranking, "hybrid");
    assert_eq!(
        answer.results.first().map(|f| f.target.as_str()),
        Some("weather:skill:forecast"),
        "{answer:?}"
    );
    assert!(answer.results[0].matched.contains(&"meaning"));
    let answer = search("change dollars into euros");
    assert_eq!(answer.results.first().map(|f| f.target.as_str()), Some("fx:skill:convert_currency"));
    // Lexical queries keep their answer.
    let answer = search("send email");
    assert_eq!(answer.results.first().map(|f| f.target.as_str()), Some("mail:skill:send_email"));
}
