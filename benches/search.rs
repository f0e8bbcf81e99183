//! Capability search, measured: quality on the labelled set in `benches/search/` (hit@1, hit@5, MRR,
//! NDCG@5 per query type, for plain BM25 as the floor, the lexical ranker, and lexical + graph), the
//! token reduction of the context tiers, and speed and memory at 10,000 agents / 40,000 capabilities.
//!
//! `cargo bench --bench search` prints Markdown tables for BENCHMARKS.md.
//! `cargo bench --bench search -- --quality` skips the speed part.

use std::alloc::{GlobalAlloc, Layout, System};
use std::collections::HashMap;
use std::sync::atomic::{AtomicIsize, Ordering};
use std::sync::Arc;
use std::time::Instant;

use agentmesh::card::AgentCard;
use agentmesh::registry::health::Thresholds;
use agentmesh::registry::{Entry, Origin, RecordKey, Snapshot};
use agentmesh::search::context::{Budgets, Counter};
use agentmesh::search::semantic::Semantic;
use agentmesh::search::text::words;
use agentmesh::search::{Engine, Request};
use libp2p::identity::Keypair;
use serde_json::Value;

#[path = "search/labelled.rs"]
mod labelled;
use labelled::{load, percentile, Labelled, Scores};

/// Counts live heap bytes, to measure what the index adds.
struct Counting;

static LIVE: AtomicIsize = AtomicIsize::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LIVE.fetch_add(layout.size() as isize, Ordering::Relaxed);
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size() as isize, Ordering::Relaxed);
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

fn snapshot(cards: &[Value], copies: usize) -> Snapshot {
    let publisher = Keypair::generate_ed25519().public().to_peer_id();
    let mut entries = Vec::new();
    for copy in 0..copies {
        for card in cards {
            let mut card = card.clone();
            if copy > 0 {
                let id = format!("{}-{copy}", card["agent_id"].as_str().unwrap_or_default());
                card["agent_id"] = Value::String(id);
            }
            let card = AgentCard::from_json(card.to_string().as_bytes()).expect("valid card");
            let key = RecordKey { agent_id: card.agent_id.clone(), publisher };
            entries.push(Arc::new(Entry::new(key, 1, &card, Origin::Remote, 1)));
        }
    }
    entries.sort_by(|a, b| a.key.cmp(&b.key));
    Snapshot::new(1, entries)
}

/// Plain BM25 (k1 1.2, b 0.75) over each capability's id, name, description and tags as one field:
/// words lower-cased, no stemming, no stop words. The floor the lexical ranker must beat.
struct Plain {
    docs: Vec<(String, HashMap<String, f32>, f32)>,
    df: HashMap<String, f32>,
    avg: f32,
}

impl Plain {
    fn new(cards: &[Value]) -> Self {
        let mut docs = Vec::new();
        for card in cards {
            let agent = card["agent_id"].as_str().unwrap_or_default();
            for kind in ["reasoner", "skill"] {
                for cap in card[format!("{kind}s")].as_array().into_iter().flatten() {
                    let id = cap["id"].as_str().unwrap_or_default();
                    let mut text = format!(
                        "{} {} {}",
                        id,
                        cap["name"].as_str().unwrap_or(""),
                        cap["description"].as_str().unwrap_or("")
                    );
                    for t in cap["tags"].as_array().into_iter().flatten() {
                        text.push(' ');
                        text.push_str(t.as_str().unwrap_or_default());
                    }
                    let mut tf: HashMap<String, f32> = HashMap::new();
                    let mut len = 0.0;
                    words(&text, |w| {
                        *tf.entry(w.to_owned()).or_default() += 1.0;
                        len += 1.0;
                    });
                    docs.push((format!("{agent}:{kind}:{id}"), tf, len));
                }
            }
        }
        let mut df: HashMap<String, f32> = HashMap::new();
        for (_, tf, _) in &docs {
            for t in tf.keys() {
                *df.entry(t.clone()).or_default() += 1.0;
            }
        }
        let avg = docs.iter().map(|d| d.2).sum::<f32>() / docs.len().max(1) as f32;
        Self { docs, df, avg }
    }

    fn rank(&self, q: &str) -> Vec<String> {
        let mut terms = Vec::new();
        words(q, |w| terms.push(w.to_owned()));
        terms.sort();
        terms.dedup();
        let n = self.docs.len() as f32;
        let mut scored: Vec<(f32, &str)> = self
            .docs
            .iter()
            .map(|(target, tf, len)| {
                let s: f32 = terms
                    .iter()
                    .filter_map(|t| Some((tf.get(t)?, self.df.get(t)?)))
                    .map(|(f, df)| {
                        let idf = (1.0 + (n - df + 0.5) / (df + 0.5)).ln();
                        idf * f * 2.2 / (f + 1.2 * (0.25 + 0.75 * len / self.avg))
                    })
                    .sum();
                (s, target.as_str())
            })
            .filter(|(s, _)| *s > 0.0)
            .collect();
        scored.sort_by(|a, b| b.0.partial_cmp(&a.0).unwrap_or(std::cmp::Ordering::Equal).then(a.1.cmp(b.1)));
        scored.into_iter().map(|(_, t)| t.to_owned()).collect()
    }
}

/// What a ranker uses: words, the thesaurus's related words, the graph.
#[derive(Clone, Copy)]
struct Signals {
    lexical: bool,
    related: bool,
    graph: bool,
}

const WORDS: Signals = Signals { lexical: true, related: true, graph: false };
const WORDS_ONLY: Signals = Signals { related: false, ..WORDS };
const WORDS_GRAPH: Signals = Signals { graph: true, ..WORDS };
const MEANING_ONLY: Signals = Signals { lexical: false, related: false, graph: false };

/// A ranker over `engine`: the whole set, best first, with the signals asked for.
fn ranker<'a>(
    engine: &'a Engine,
    snap: &'a Snapshot,
    thresholds: &'a Thresholds,
    signals: Signals,
) -> impl Fn(&str) -> Vec<String> + 'a {
    move |q: &str| {
        let mut req = Request::new(q);
        req.limit = 10;
        req.min_relevance = 0.0;
        req.graph = signals.graph;
        req.lexical = signals.lexical;
        req.related = signals.related;
        engine.search(snap, &req, 10, thresholds).results.into_iter().map(|f| f.target).collect()
    }
}

/// `misses`: the name of a ranker whose misses (right answer not in its top 5) are listed to stderr.
fn quality(cards: &[Value], queries: &[Labelled], misses: Option<&String>) {
    let snap = snapshot(cards, 1);
    let engine = Engine::default();
    let thresholds = Thresholds::default();
    let plain = Plain::new(cards);
    println!("| ranker | queries | n | hit@1 | hit@5 | MRR | NDCG@5 |");
    println!("|---|---|---|---|---|---|---|");
    type Ranker<'a> = (&'a str, Box<dyn Fn(&str) -> Vec<String> + 'a>);
    // With a model (AGENTMESH_TEST_MODEL_DIR: a sentence-transformers directory), the semantic and
    // hybrid rankers too.
    let model = std::env::var_os("AGENTMESH_TEST_MODEL_DIR").map(std::path::PathBuf::from);
    let with_model = model.map(|dir| {
        let semantic = Semantic::load(&dir, None).expect("the model loads");
        let engine = Engine::with_semantic(Arc::new(semantic));
        let started = Instant::now();
        let n = engine.catch_up(&snap, || false).expect("capabilities embed");
        eprintln!("embedded {n} capabilities in {:.1} s", started.elapsed().as_secs_f64());
        // Query embeddings: the first time from the model, then from the LRU.
        let semantic = engine.semantic().expect("a semantic engine");
        let (mut cold, mut cached) = (Vec::new(), Vec::new());
        for q in queries {
            let t = Instant::now();
            semantic.query(&q.q).expect("embeds");
            cold.push(t.elapsed());
            let t = Instant::now();
            semantic.query(&q.q).expect("embeds");
            cached.push(t.elapsed());
        }
        cold.sort();
        cached.sort();
        println!(
            "Query embeddings over {} queries: from the model p50 {:.2} ms, p99 {:.2} ms; from the LRU p50 {:.4} ms, p99 {:.4} ms.\n",
            queries.len(),
            percentile(&cold, 0.5).as_secs_f64() * 1e3,
            percentile(&cold, 0.99).as_secs_f64() * 1e3,
            percentile(&cached, 0.5).as_secs_f64() * 1e3,
            percentile(&cached, 0.99).as_secs_f64() * 1e3,
        );
        engine
    });
    let mut rankers: Vec<Ranker<'_>> = vec![
        ("plain BM25", Box::new(|q: &str| plain.rank(q))),
        ("lexical, no thesaurus", Box::new(ranker(&engine, &snap, &thresholds, WORDS_ONLY))),
        ("lexical", Box::new(ranker(&engine, &snap, &thresholds, WORDS))),
        ("lexical+graph", Box::new(ranker(&engine, &snap, &thresholds, WORDS_GRAPH))),
    ];
    if let Some(engine) = &with_model {
        rankers.push(("semantic", Box::new(ranker(engine, &snap, &thresholds, MEANING_ONLY))));
        rankers.push(("hybrid, no thesaurus", Box::new(ranker(engine, &snap, &thresholds, WORDS_ONLY))));
        rankers.push(("hybrid", Box::new(ranker(engine, &snap, &thresholds, WORDS))));
        rankers.push(("hybrid+graph", Box::new(ranker(engine, &snap, &thresholds, WORDS_GRAPH))));
    }
    for (name, rank) in &rankers {
        let mut by_kind: Vec<(String, Scores)> = Vec::new();
        let mut all = Scores::default();
        for q in queries {
            let ranked = rank(&q.q);
            if misses.is_some_and(|m| m == name)
                && !ranked.iter().take(5).any(|t| q.grades.get(t) == Some(&2))
            {
                let at = ranked.iter().position(|t| q.grades.get(t) == Some(&2));
                eprintln!(
                    "miss {} {:?} | at {:?} | top {:?} | want {:?}",
                    q.kind,
                    q.q,
                    at,
                    &ranked[..ranked.len().min(3)],
                    q.grades.iter().filter(|(_, g)| **g == 2).map(|(t, _)| t).collect::<Vec<_>>()
                );
            }
            all.add(&ranked, &q.grades);
            match by_kind.iter_mut().find(|(k, _)| *k == q.kind) {
                Some((_, s)) => s.add(&ranked, &q.grades),
                None => {
                    let mut s = Scores::default();
                    s.add(&ranked, &q.grades);
                    by_kind.push((q.kind.clone(), s));
                }
            }
        }
        for (kind, s) in &by_kind {
            println!("{}", s.row(name, kind));
        }
        println!("{}", all.row(name, "all"));
    }
    // Relevance calibration: how often the right answer clears the default floor of 0.3.
    for (name, engine) in [("lexical", Some(&engine)), ("hybrid", with_model.as_ref())] {
        let Some(engine) = engine else { continue };
        let mut above = 0;
        let mut top_right = 0;
        for q in queries {
            let mut req = Request::new(&q.q);
            req.graph = false;
            let found = engine.search(&snap, &req, 10, &thresholds).results;
            if found.first().is_some_and(|f| q.grades.get(&f.target) == Some(&2)) {
                top_right += 1;
            }
            if found.iter().any(|f| q.grades.get(&f.target) == Some(&2)) {
                above += 1;
            }
        }
        println!(
            "\nWith the default min_relevance 0.3 and limit 5 ({name}): a right answer is returned for {above} of {} queries, first for {top_right}.",
            queries.len()
        );
    }
    // Tokens: the tiers for each query against every schema dumped into the prompt.
    let counter = Counter::Chars4;
    let dump: usize = cards
        .iter()
        .flat_map(|c| ["reasoners", "skills"].map(|k| c[k].as_array().cloned().unwrap_or_default()))
        .flatten()
        .map(|cap| counter.count(&cap.to_string()))
        .sum();
    let mut worst = 0;
    let mut sum = 0;
    for q in queries {
        let mut req = Request::new(&q.q);
        req.limit = 5;
        let found = engine.search(&snap, &req, 10, &thresholds).results;
        let tiers = engine.context(&snap, &found, &Budgets::default(), counter, true);
        let total = counter.count(&tiers.text());
        worst = worst.max(total);
        sum += total;
    }
    println!(
        "Context: every capability's JSON (schemas included) is {dump} tokens; the three tiers take {:.0} on average and {worst} at most over {} queries ({:.1}% less on average).",
        sum as f64 / queries.len() as f64,
        queries.len(),
        100.0 * (1.0 - sum as f64 / queries.len() as f64 / dump as f64)
    );
}

fn speed(cards: &[Value], queries: &[Labelled]) {
    let caps: usize = cards
        .iter()
        .map(|c| ["reasoners", "skills"].iter().map(|k| c[*k].as_array().map_or(0, Vec::len)).sum::<usize>())
        .sum();
    let copies = 40_000usize.div_ceil(caps);
    let snap = snapshot(cards, copies);
    let engine = Engine::default();
    let before = LIVE.load(Ordering::Relaxed);
    let started = Instant::now();
    engine.refresh(&snap);
    let built = started.elapsed();
    let added = LIVE.load(Ordering::Relaxed) - before;
    let thresholds = Thresholds::default();
    let mut times = Vec::new();
    for round in 0..3 {
        for q in queries {
            let mut req = Request::new(&q.q);
            req.graph = round % 2 == 0;
            let t = Instant::now();
            std::hint::black_box(engine.search(&snap, &req, 10, &thresholds));
            times.push(t.elapsed());
        }
    }
    times.sort();
    println!(
        "\n{} agents, {} capabilities: index built in {:.0} ms, {} bytes per capability; search over {} queries: p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms",
        snap.entries.len(),
        engine.len(),
        built.as_secs_f64() * 1e3,
        added / engine.len().max(1) as isize,
        times.len(),
        percentile(&times, 0.5).as_secs_f64() * 1e3,
        percentile(&times, 0.99).as_secs_f64() * 1e3,
        times.last().copied().unwrap_or_default().as_secs_f64() * 1e3,
    );
    // One card changes: the index follows by difference.
    let mut entries = snap.entries.clone();
    let changed = entries[0].clone();
    let card = AgentCard::from_json(changed.card.text().as_bytes()).expect("card");
    entries[0] = Arc::new(Entry::new(changed.key.clone(), changed.seq + 1, &card, Origin::Remote, 2));
    let next = Snapshot::new(2, entries);
    let t = Instant::now();
    engine.refresh(&next);
    println!("One changed card re-indexed in {:.2} ms.", t.elapsed().as_secs_f64() * 1e3);
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let (cards, queries) = load();
    // `--misses RANKER`: list the queries that ranker misses in its top 5, to stderr.
    let misses = args.iter().position(|a| a == "--misses").and_then(|i| args.get(i + 1));
    quality(&cards, &queries, misses);
    if !args.iter().any(|a| a == "--quality") {
        speed(&cards, &queries);
    }
}
