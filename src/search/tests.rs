use std::sync::Arc;

use libp2p::identity::Keypair;
use libp2p::PeerId;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::json;

use super::context::{self, Budgets, Counter};
use super::*;
use crate::card::AgentCard;
use crate::query::Query;
use crate::registry::{Entry, Origin, RecordKey};

fn peer() -> PeerId {
    Keypair::generate_ed25519().public().to_peer_id()
}

fn entry(publisher: PeerId, card: serde_json::Value, seq: u64) -> Arc<Entry> {
    let card = AgentCard::from_json(card.to_string().as_bytes()).unwrap();
    let key = RecordKey { agent_id: card.agent_id.clone(), publisher };
    Arc::new(Entry::new(key, seq, &card, Origin::Remote, 1))
}

fn snapshot(generation: u64, mut entries: Vec<Arc<Entry>>) -> Snapshot {
    entries.sort_by(|a, b| a.key.cmp(&b.key));
    Snapshot::new(generation, entries)
}

fn view(p: PeerId) -> Vec<Arc<Entry>> {
    vec![
        entry(
            p,
            json!({"agent_id": "weather", "base_url": "http://w", "category": "weather",
            "description": "Weather data for any place on earth",
            "skills": [
              {"id": "get_forecast", "description": "Daily weather forecast for a city: temperature, rain, wind.",
               "tags": ["weather", "forecast"],
               "input_schema": {"type": "object", "properties": {"city": {"type": "string", "description": "City name"}}}},
              {"id": "air_quality", "description": "Current air quality index and pollutants.", "tags": ["weather", "air"]}
            ]}),
            1,
        ),
        entry(
            p,
            json!({"agent_id": "fx", "base_url": "http://fx", "category": "finance",
              "reasoners": [
                {"id": "convertCurrency", "description": "Converts an amount between currencies at live exchange rates.",
                 "tags": ["finance", "currency"], "requires": ["fx:skill:rates"]}
              ],
              "skills": [{"id": "rates", "description": "Latest exchange rates table.", "tags": ["finance", "currency"]}]}),
            1,
        ),
        entry(
            p,
            json!({"agent_id": "mailer", "base_url": "http://m", "category": "messaging",
              "skills": [{"id": "send-email", "description": "Sends an email message to one or more recipients.",
                          "tags": ["email"], "has_side_effects": true, "required_secrets": ["SMTP_PASSWORD"]}]}),
            1,
        ),
    ]
}

fn thresholds() -> Thresholds {
    Thresholds::default()
}

fn targets(a: &Answer) -> Vec<&str> {
    a.results.iter().map(|f| f.target.as_str()).collect()
}

#[test]
fn words_of_any_form_find_the_capability_that_does_it() {
    let engine = Engine::default();
    let snap = snapshot(1, view(peer()));
    let search = |q: &str| engine.search(&snap, &Request::new(q), 10, &thresholds());
    assert_eq!(targets(&search("weather forecasts for Lisbon"))[0], "weather:skill:get_forecast");
    assert_eq!(targets(&search("convert currency"))[0], "fx:reasoner:convertCurrency");
    assert_eq!(targets(&search("sending emails"))[0], "mailer:skill:send-email");
    let a = search("send_email");
    assert!(a.results[0].relevance >= 0.8, "an exact id match is near 1: {:?}", a.results[0]);
    assert!(a.results[0].matched.contains(&"id"));
    // Nothing in the view knows this: no result clears the default floor.
    assert!(search("quantum chromodynamics lattice").results.is_empty());
    assert_eq!(engine.len(), 5);
}

#[test]
fn relevance_is_in_range_descending_and_repeatable() {
    let engine = Engine::default();
    let snap = snapshot(1, view(peer()));
    let mut req = Request::new("weather rates email currency");
    req.min_relevance = 0.0;
    req.limit = MAX_RESULTS;
    let a = engine.search(&snap, &req, 10, &thresholds());
    assert!(a.results.len() >= 4);
    assert!(a.results.iter().all(|f| (0.0..=1.0).contains(&f.relevance)));
    assert!(a.results.windows(2).all(|w| w[0].relevance >= w[1].relevance));
    let again = Engine::default().search(&snap, &req, 10, &thresholds());
    assert_eq!(targets(&a), targets(&again));
}

#[test]
fn filters_apply_before_ranking() {
    let engine = Engine::default();
    let snap = snapshot(1, view(peer()));
    let mut req = Request::new("currency exchange rates");
    req.kind = Kind::Skill;
    assert_eq!(targets(&engine.search(&snap, &req, 10, &thresholds())), ["fx:skill:rates"]);
    req.kind = Kind::Any;
    req.filters = Query::parse("agent=weather").unwrap();
    assert!(engine.search(&snap, &req, 10, &thresholds()).results.is_empty());
    req.filters = Query::parse("tags=email").unwrap();
    req.q = "send a message".into();
    assert_eq!(targets(&engine.search(&snap, &req, 10, &thresholds())), ["mailer:skill:send-email"]);
}

#[test]
fn the_index_follows_the_view_by_difference() {
    let p = peer();
    let engine = Engine::default();
    let mut entries = view(p);
    engine.refresh(&snapshot(1, entries.clone()));
    assert_eq!(engine.len(), 5);
    // Replace the mailer with one that sends SMS; drop fx.
    entries.retain(|e| e.key.agent_id == "weather");
    entries.push(entry(
        p,
        json!({"agent_id": "mailer", "base_url": "http://m",
          "skills": [{"id": "send_sms", "description": "Sends a text message to a phone number."}]}),
        2,
    ));
    let snap = snapshot(2, entries);
    let req = |q: &str| Request::new(q);
    assert_eq!(
        targets(&engine.search(&snap, &req("text message phone"), 10, &thresholds())),
        ["mailer:skill:send_sms"]
    );
    assert!(engine
        .search(&snap, &req("send email"), 10, &thresholds())
        .results
        .iter()
        .all(|f| f.id != "send-email"));
    assert!(engine.search(&snap, &req("currency"), 10, &thresholds()).results.is_empty());
    assert_eq!(engine.len(), 3);
    // Churn far past the compaction threshold keeps the index exact.
    for generation in 3..40 {
        let entries: Vec<_> = (0..60)
            .map(|i| {
                entry(
                    p,
                    json!({"agent_id": format!("a{i}"), "base_url": "http://x",
                      "skills": [{"id": format!("s{generation}"), "description": format!("word{generation} thing")}]}),
                    generation,
                )
            })
            .collect();
        engine.refresh(&snapshot(generation, entries));
        assert_eq!(engine.len(), 60);
    }
    let snap = snapshot(40, Vec::new());
    engine.refresh(&snap);
    assert_eq!(engine.len(), 0);
}

#[test]
fn one_result_per_target_across_publishers() {
    let (a, b) = (peer(), peer());
    let mut entries = view(a);
    entries.extend(view(b));
    let engine = Engine::default();
    let answer = engine.search(&snapshot(1, entries), &Request::new("weather forecast"), 10, &thresholds());
    let t = targets(&answer);
    let unique: std::collections::HashSet<&str> = t.iter().copied().collect();
    assert!(!t.is_empty());
    assert_eq!(unique.len(), t.len(), "{t:?}");
    assert_eq!(answer.total_indexed, 10);
}

#[test]
fn the_graph_lifts_neighbours_and_pulls_in_dependencies() {
    let engine = Engine::default();
    let snap = snapshot(1, view(peer()));
    let mut req = Request::new("convert money amount");
    req.min_relevance = 0.0;
    req.graph = false;
    // Words only: the thesaurus relates "money" to "currency", which `rates` carries.
    req.related = false;
    let plain = engine.search(&snap, &req, 10, &thresholds());
    req.graph = true;
    let graph = engine.search(&snap, &req, 10, &thresholds());
    let rel = |a: &Answer, t: &str| a.results.iter().find(|f| f.target == t).map(|f| f.relevance);
    // `rates` is what convertCurrency requires: no word of the query, so only the graph brings it;
    // the capability that requires it is found either way, never lower with the graph.
    assert!(rel(&plain, "fx:reasoner:convertCurrency").is_some());
    assert!(rel(&plain, "fx:skill:rates").is_none());
    assert!(rel(&graph, "fx:skill:rates").is_some());
    assert!(rel(&graph, "fx:reasoner:convertCurrency") >= rel(&plain, "fx:reasoner:convertCurrency"));
    assert_eq!(graph.ranking, "lexical+graph");
}

/// Every tier stays within its budget, and the text form within the sum, for random views and
/// budgets; Tier 0 depends on the view alone.
#[test]
fn tiers_never_exceed_their_budgets() {
    let mut rng = StdRng::seed_from_u64(7);
    let words =
        ["weather", "send", "email", "currency", "pdf", "convert", "calendar", "event", "search", "image"];
    for round in 0..60 {
        let p = peer();
        let agents = rng.random_range(0..12);
        let entries: Vec<_> = (0..agents)
            .map(|i| {
                let skills: Vec<_> = (0..rng.random_range(1..6))
                    .map(|j| {
                        let d: Vec<&str> = (0..rng.random_range(1..30)).map(|_| words[rng.random_range(0..words.len())]).collect();
                        json!({"id": format!("s{j}"), "description": d.join(" "),
                               "category": words[rng.random_range(0..words.len())],
                               "input_schema": {"type": "object", "properties": {"x": {"type": "string", "description": d.join(" ")}}}})
                    })
                    .collect();
                entry(p, json!({"agent_id": format!("agent{i}"), "base_url": "http://x", "skills": skills}), 1)
            })
            .collect();
        let snap = snapshot(round + 1, entries);
        let engine = Engine::default();
        let budgets: [usize; 3] = std::array::from_fn(|_| rng.random_range(0..400));
        let q = words[rng.random_range(0..words.len())];
        let mut req = Request::new(q);
        req.min_relevance = 0.0;
        req.limit = 10;
        let answer = engine.search(&snap, &req, 10, &thresholds());
        let c = Counter::ALL[round as usize % Counter::ALL.len()];
        let b = Budgets {
            tier0: budgets[0],
            tier1: budgets[1],
            tier1_top_k: rng.random_range(0..8),
            tier2: budgets[2],
            tier2_top_k: rng.random_range(0..4),
        };
        for for_text in [false, true] {
            let tiers = engine.context(&snap, &answer.results, &b, c, for_text);
            for (tier, budget) in [(&tiers.tier0, b.tier0), (&tiers.tier1, b.tier1), (&tiers.tier2, b.tier2)]
            {
                assert!(tier.tokens <= budget, "round {round}: {tier:?} over {budget}");
                assert_eq!(tier.tokens, c.count(&tier.text));
            }
            assert!(tiers.tier1.entries <= b.tier1_top_k && tiers.tier2.entries <= b.tier2_top_k);
            if for_text {
                assert!(
                    c.count(&tiers.text()) <= budgets.iter().sum::<usize>(),
                    "round {round}: text over the sum"
                );
            }
        }
        let t0 = engine.tier0(&snap, c, budgets[0]);
        let (heading, entries) = context::tier0_entries(&snap);
        assert_eq!(t0, context::build(c, budgets[0], &heading, &entries), "Tier 0 is the view's alone");
    }
}

fn reminders_view(p: PeerId) -> Vec<Arc<Entry>> {
    vec![entry(
        p,
        json!({"agent_id": "planner", "base_url": "http://p",
        "skills": [
          {"id": "set_reminder", "description": "Creates a reminder that fires at the given time."},
          {"id": "delete_file", "description": "Deletes a file from the drive."},
          {"id": "remove_member", "description": "Removes a member from a team."}
        ]}),
        1,
    )]
}

#[test]
fn everyday_words_reach_the_capability_through_the_thesaurus() {
    let engine = Engine::default();
    let snap = snapshot(1, reminders_view(peer()));
    let run = |q: &str, related: bool| {
        let mut req = Request::new(q);
        req.related = related;
        engine.search(&snap, &req, 10, &thresholds())
    };
    // "nudge" is no word of the card; the thesaurus relates it to "reminder".
    let a = run("nudge me", true);
    assert_eq!(targets(&a), ["planner:skill:set_reminder"]);
    assert!(a.results[0].matched.contains(&"id"), "{:?}", a.results[0].matched);
    assert!(targets(&run("nudge me", false)).is_empty());
    // A related word earns less than the word itself.
    let exact = run("set a reminder", true).results[0].relevance;
    assert!(a.results[0].relevance < exact, "{} vs {exact}", a.results[0].relevance);
}

#[test]
fn the_query_s_own_words_outrank_related_ones() {
    let engine = Engine::default();
    let snap = snapshot(1, reminders_view(peer()));
    let search = |q: &str| {
        let mut req = Request::new(q);
        req.min_relevance = 0.0;
        engine.search(&snap, &req, 10, &thresholds())
    };
    assert_eq!(targets(&search("delete a file"))[0], "planner:skill:delete_file");
    let found = search("remove member");
    assert_eq!(targets(&found)[0], "planner:skill:remove_member");
    // "remove" relates to "delete": the file skill is found too, below.
    assert!(targets(&found).contains(&"planner:skill:delete_file"), "{:?}", targets(&found));
}
