//! The discovery query path at scale, in process: select + render over a registry of synthetic agents.
//!
//! `cargo bench --bench discovery` prints a Markdown table for BENCHMARKS.md.
//! `cargo bench --bench discovery -- --populate DIR [AGENTS]` writes a data directory holding AGENTS
//! local agents (default 10,000) for the HTTP load run (`simulations/bench-http.sh`).

use std::path::Path;
use std::time::{Duration, Instant};

use agentmesh::api::render;
use agentmesh::card::{a2a, AgentCard};
use agentmesh::defaults::{MAX_AGENTS_PER_PUBLISHER, MAX_REMOTE_RECORDS, STORE_DIR};
use agentmesh::identity::Identity;
use agentmesh::query::index::{self, ViewIndex};
use agentmesh::query::{select, Format, Query};
use agentmesh::registry::health::Thresholds;
use agentmesh::registry::{Limits, Liveness, Registry};
use agentmesh::watch::Watch;

#[path = "common/cards.rs"]
mod cards;
use cards::card;

const AGENTS: usize = 10_000;

fn now_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

async fn populate(dir: &Path, agents: usize) -> Registry {
    let identity = Identity::load_or_create(dir).expect("identity");
    // A node holding more local agents than the default limit is configured for it
    // (`max_agents_per_publisher`); so is this one.
    let limits = Limits {
        per_publisher: agents.max(MAX_AGENTS_PER_PUBLISHER),
        remote_records: agents.max(MAX_REMOTE_RECORDS),
    };
    let (registry, _) = Registry::open_checked(
        &dir.join(STORE_DIR),
        identity.keypair().clone(),
        Thresholds::default(),
        limits,
        false,
    )
    .expect("store opens");
    let cards: Vec<AgentCard> = (0..agents).map(card).collect();
    for chunk in cards.chunks(1000) {
        registry.register_local_many(chunk.to_vec(), Liveness::Node, now_ms()).await.expect("bulk insert");
    }
    registry
}

fn measure(name: &str, registry: &Registry, index: &ViewIndex, raw: &str) {
    // `cargo bench --bench discovery -- WORD` runs only the cases whose name contains WORD.
    if let Some(only) = std::env::args().skip(1).find(|a| !a.starts_with("--") && a.parse::<usize>().is_err())
    {
        if !name.contains(&only) {
            return;
        }
    }
    let query = Query::parse(raw).expect("valid query");
    let snapshot = registry.snapshot();
    // As the API does: JSON pages are assembled from records rendered once (warmed below).
    let prepared = render::prepared::PreparedCache::default();
    let thresholds = registry.thresholds();
    // As the API does: the index answers, an id allow-list is looked up in the snapshot.
    let pick = |now| {
        if query.ids.is_empty() {
            index::select(index, &query, now, thresholds)
        } else {
            select(&snapshot.entries, &query, now, thresholds)
        }
    };
    let run = || {
        let now = now_ms();
        let sel = pick(now);
        let body = match query.format {
            Format::Json => render::json::render_prepared(&sel, &query, now, &prepared),
            Format::Compact => render::compact::render_prepared(&sel, now, &prepared),
            Format::Xml => render::xml::render_prepared(&sel, &query, now, &prepared),
        };
        (body.len(), sel.total_agents)
    };
    for _ in 0..20 {
        std::hint::black_box(run());
    }
    let mut samples = Vec::new();
    let mut bytes = 0;
    let mut total = 0;
    let start = Instant::now();
    while samples.len() < 50 || (start.elapsed() < Duration::from_secs(2) && samples.len() < 5000) {
        let t = Instant::now();
        (bytes, total) = std::hint::black_box(run());
        samples.push(t.elapsed());
    }
    samples.sort();
    let times = |work: &dyn Fn() -> usize| {
        let mut t: Vec<Duration> = (0..samples.len().clamp(50, 1000))
            .map(|_| {
                let at = Instant::now();
                std::hint::black_box(work());
                at.elapsed()
            })
            .collect();
        t.sort();
        t
    };
    let indexed = times(&|| pick(now_ms()).total_agents);
    let scanned = times(&|| select(&snapshot.entries, &query, now_ms(), thresholds).total_agents);
    let at = |t: &[Duration], p: f64| t[((t.len() - 1) as f64 * p) as usize].as_secs_f64() * 1e3;
    let mean = samples.iter().sum::<Duration>().as_secs_f64() * 1e3 / samples.len() as f64;
    println!(
        "| {name} | `{raw}` | {total} | {bytes} | {mean:.3} | {:.3} | {:.3} | {:.3} | {:.3} | {:.3} | {} |",
        at(&samples, 0.5),
        at(&samples, 0.99),
        at(&indexed, 0.5),
        at(&indexed, 0.99),
        at(&scanned, 0.5),
        samples.len()
    );
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).filter(|a| a != "--bench").collect();
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    if let Some(at) = args.iter().position(|a| a == "--populate") {
        let dir = Path::new(args.get(at + 1).expect("--populate DIR"));
        let agents = args.get(at + 2).map_or(AGENTS, |n| n.parse().expect("agent count"));
        rt.block_on(populate(dir, agents));
        println!("populated {} with {agents} agents", dir.display());
        return;
    }
    // `--agents N`: a view of N agents instead of 10,000.
    let agents = args
        .iter()
        .position(|a| a == "--agents")
        .map_or(AGENTS, |at| args.get(at + 1).and_then(|n| n.parse().ok()).expect("--agents N"));
    let dir = tempfile::tempdir().expect("temp dir");
    let registry = rt.block_on(populate(dir.path(), agents));
    let built = Instant::now();
    let index = ViewIndex::build(&registry.snapshot());
    let index_ms = built.elapsed().as_secs_f64() * 1e3;
    let caps: usize = registry
        .snapshot()
        .entries
        .iter()
        .map(|e| e.card.reasoners().count() + e.card.skills().count())
        .sum();
    // `--while-embedding` (with AGENTMESH_TEST_MODEL_DIR): the same cases while another thread embeds
    // capability texts without pause, as a node with `--embedding-model` does as a large view arrives.
    let embedding = args.iter().any(|a| a == "--while-embedding").then(|| {
        let dir = std::env::var_os("AGENTMESH_TEST_MODEL_DIR")
            .expect("--while-embedding needs AGENTMESH_TEST_MODEL_DIR");
        let model = agentmesh::search::embed::Embedder::load(Path::new(&dir)).expect("the model loads");
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let texts: Vec<String> = registry
            .snapshot()
            .entries
            .iter()
            .take(64)
            .map(|e| format!("{} {}", e.key.agent_id, e.card.text().chars().take(200).collect::<String>()))
            .collect();
        let flag = stop.clone();
        let worker = std::thread::spawn(move || {
            let mut embedded = 0usize;
            while !flag.load(std::sync::atomic::Ordering::Relaxed) {
                for batch in texts.chunks(32) {
                    let batch: Vec<&str> = batch.iter().map(String::as_str).collect();
                    embedded += model.embed_background(&batch).map(|v| v.len()).unwrap_or(0);
                }
            }
            embedded
        });
        (stop, worker, Instant::now())
    });
    let while_embedding = if embedding.is_some() { ", while another thread embeds texts" } else { "" };
    println!("{agents} agents, {caps} capabilities, one thread, select + render (no HTTP, no cache){while_embedding}");
    println!("filter index built in {index_ms:.1} ms: {} chunks, {} terms\n", index.chunks(), index.terms());
    println!("| case | query | matched agents | body bytes | mean ms | p50 ms | p99 ms | select, p50 ms | select, p99 ms | scan select, p50 ms | runs |");
    println!("|---|---|---|---|---|---|---|---|---|---|---|");
    measure("json, page of 100, no schemas", &registry, &index, "limit=100");
    measure(
        "json, page of 100, with schemas",
        &registry,
        &index,
        "limit=100&include_input_schema=true&include_output_schema=true",
    );
    measure(
        "xml, page of 100, with schemas",
        &registry,
        &index,
        "format=xml&limit=100&include_input_schema=true&include_output_schema=true",
    );
    measure("compact, page of 100", &registry, &index, "format=compact&limit=100");
    measure("json, wildcard reasoner filter", &registry, &index, "reasoner=*research*&limit=100");
    measure("json, tag filter", &registry, &index, "tags=ml,vision&limit=100");
    measure("json, one agent", &registry, &index, "agent=agent-04242");
    measure("json, last page", &registry, &index, "limit=100&offset=9900");
    random_pages(&registry, &index, agents);
    if let Some((stop, worker, started)) = embedding {
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let embedded = worker.join().expect("the embedding thread");
        let secs = started.elapsed().as_secs_f64();
        println!(
            "\nMeanwhile {embedded} texts embedded in {secs:.1} s ({:.0} a second).",
            embedded as f64 / secs
        );
        return;
    }
    if std::env::args().skip(1).any(|a| !a.starts_with("--")) {
        return;
    }
    println!("\nOther per-request and per-tick work at {agents} agents:\n");
    println!("| work | p50 ms | p99 ms | runs |");
    println!("|---|---|---|---|");
    let snapshot = registry.snapshot();
    let t = *registry.thresholds();
    let watch = Watch::new(&snapshot.entries, now_ms(), &t, 0);
    time("watch tick, nothing changed (`Watch::advance`, every 250 ms)", || {
        watch.advance(&snapshot.entries, now_ms(), &t)
    });
    let entry = &snapshot.entries[agents / 2];
    time("A2A card of one agent (parse, view, serialise; `GET .../agent-card.json`)", || {
        let card = AgentCard::from_json(entry.card.text().as_bytes()).expect("held cards are valid");
        serde_json::to_vec(&a2a::served(&card)).map(|b| b.len()).unwrap_or_default()
    });
    let card = AgentCard::from_json(entry.card.text().as_bytes()).expect("held cards are valid");
    let key = Identity::ephemeral().keypair().clone();
    time("A2A signature of one card (view, RFC 8785, Ed25519; at registration)", || {
        card.clone().signed(&key)
    });
    let publisher = entry.key.publisher;
    time("A2A signature check of one card (view, RFC 8785, Ed25519; every card received)", || {
        card.verify_a2a(&publisher).is_ok()
    });
}

/// Random pages of 100 (`limit=100&offset=RANDOM`, as `simulations/wrk-uncached.lua` asks): select
/// and render, first with nothing rendered in advance, then once every record has been rendered once.
fn random_pages(registry: &Registry, index: &ViewIndex, agents: usize) {
    if std::env::args().skip(1).any(|a| {
        !a.starts_with("--") && a.parse::<usize>().is_err() && !"json, random page of 100".contains(&a)
    }) {
        return;
    }
    let prepared = render::prepared::PreparedCache::default();
    let thresholds = registry.thresholds();
    let mut seed = 0x2545_f491_4f6c_dd1du64;
    let mut page = || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        let query =
            Query::parse(&format!("limit=100&offset={}", seed % agents.saturating_sub(99).max(1) as u64))
                .expect("valid query");
        let now = now_ms();
        let sel = index::select(index, &query, now, thresholds);
        render::json::render_prepared(&sel, &query, now, &prepared).len()
    };
    for (name, runs) in
        [("json, random page of 100, first sight", 200), ("json, random page of 100, warm", 2000)]
    {
        if name.ends_with("warm") {
            for _ in 0..agents / 10 {
                page();
            }
        }
        let mut samples: Vec<Duration> = (0..runs)
            .map(|_| {
                let t = Instant::now();
                std::hint::black_box(page());
                t.elapsed()
            })
            .collect();
        samples.sort();
        let at = |p: f64| samples[((samples.len() - 1) as f64 * p) as usize].as_secs_f64() * 1e3;
        let mean = samples.iter().sum::<Duration>().as_secs_f64() * 1e3 / samples.len() as f64;
        println!(
            "| {name} | `limit=100&offset=RANDOM` | {agents} | | {mean:.3} | {:.3} | {:.3} | | | | {runs} |",
            at(0.5),
            at(0.99)
        );
    }
    println!("\nRecords rendered in advance after the warm run: {:.1} MB.", prepared.bytes() as f64 / 1e6);
}

/// Times `work` (warm-up, then at least 50 runs or 2 s) and prints a table row.
fn time<T>(name: &str, mut work: impl FnMut() -> T) {
    for _ in 0..20 {
        std::hint::black_box(work());
    }
    let mut samples = Vec::new();
    let start = Instant::now();
    while samples.len() < 50 || (start.elapsed() < Duration::from_secs(2) && samples.len() < 5000) {
        let t = Instant::now();
        std::hint::black_box(work());
        samples.push(t.elapsed());
    }
    samples.sort();
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    let p99 = samples[(samples.len() * 99 / 100).min(samples.len() - 1)];
    println!("| {name} | {:.3} | {:.3} | {} |", ms(samples[samples.len() / 2]), ms(p99), samples.len());
}
