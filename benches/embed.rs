//! The sentence embedder, measured: query latency one at a time on one thread, batch throughput on
//! capability texts, and semantic-only retrieval quality on the labelled set in `benches/search/`
//! (hit@1, hit@5, MRR, NDCG@5 per query type, computed as `benches/search.rs` does), for a few
//! recipes of the text a capability is embedded from.
//!
//! `AGENTMESH_TEST_MODEL_DIR=/path/to/all-MiniLM-L6-v2 cargo bench --bench embed`, or the directory
//! as the argument: `cargo bench --bench embed -- /path/to/model`. Prints Markdown.
//!
//! One thread: the embedder runs its forward passes on its own rayon pool of one thread (see
//! `agentmesh::search::embed`), and tokenisation runs on the calling thread, which waits meanwhile.
//! The process's CPU time over the timed loop is printed next to its wall time to show it.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use agentmesh::search::embed::{similarity, Embedder};
use serde_json::Value;

#[path = "search/labelled.rs"]
mod labelled;
use labelled::{load, percentile, Scores};

#[derive(Clone, Copy)]
struct Recipe {
    name: &'static str,
    category_tags: bool,
    params: bool,
    param_descriptions: bool,
    requires: bool,
}

const RECIPES: [Recipe; 5] = [
    Recipe {
        name: "name, description",
        category_tags: false,
        params: false,
        param_descriptions: false,
        requires: false,
    },
    Recipe {
        name: "+ category, tags",
        category_tags: true,
        params: false,
        param_descriptions: false,
        requires: false,
    },
    Recipe {
        name: "+ parameter names",
        category_tags: true,
        params: true,
        param_descriptions: false,
        requires: false,
    },
    Recipe {
        name: "+ parameter descriptions",
        category_tags: true,
        params: true,
        param_descriptions: true,
        requires: false,
    },
    Recipe {
        name: "+ requires",
        category_tags: true,
        params: true,
        param_descriptions: true,
        requires: true,
    },
];

fn words(s: &str) -> String {
    s.replace(['_', '-'], " ")
}

fn text(cap: &Value, r: Recipe) -> String {
    let s = |v: &Value| v.as_str().unwrap_or_default().to_owned();
    let mut t = format!("{}. {}", s(&cap["name"]), s(&cap["description"]));
    if !t.ends_with('.') {
        t.push('.');
    }
    if r.category_tags {
        let tags: Vec<String> = cap["tags"].as_array().into_iter().flatten().map(|t| words(&s(t))).collect();
        t.push_str(&format!(" Category: {}. Tags: {}.", words(&s(&cap["category"])), tags.join(", ")));
    }
    if r.params {
        let params: Vec<String> = cap["input_schema"]["properties"]
            .as_object()
            .into_iter()
            .flatten()
            .map(|(name, p)| {
                let d = s(&p["description"]);
                if r.param_descriptions && !d.is_empty() {
                    format!("{} ({d})", words(name))
                } else {
                    words(name)
                }
            })
            .collect();
        if !params.is_empty() {
            t.push_str(&format!(" Inputs: {}.", params.join(", ")));
        }
    }
    if r.requires {
        let req: Vec<String> = cap["requires"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|q| words(s(q).rsplit(':').next().unwrap_or_default()))
            .collect();
        if !req.is_empty() {
            t.push_str(&format!(" Requires: {}.", req.join(", ")));
        }
    }
    t
}

/// Every capability as (target, capability JSON), target as `benches/search.rs` builds it.
fn capabilities(cards: &[Value]) -> Vec<(String, Value)> {
    let mut out = Vec::new();
    for card in cards {
        let agent = card["agent_id"].as_str().unwrap_or_default();
        for kind in ["reasoner", "skill"] {
            for cap in card[format!("{kind}s")].as_array().into_iter().flatten() {
                let id = cap["id"].as_str().unwrap_or_default();
                out.push((format!("{agent}:{kind}:{id}"), cap.clone()));
            }
        }
    }
    out
}

/// Process CPU time (user + system) so far.
fn cpu_time() -> Duration {
    // SAFETY: getrusage writes into the struct it is given and reads nothing else.
    let usage = unsafe {
        let mut u: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_SELF, &mut u);
        u
    };
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    tv(usage.ru_utime) + tv(usage.ru_stime)
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn main() {
    let dir = std::env::args()
        .skip(1)
        .find(|a| !a.starts_with('-'))
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("AGENTMESH_TEST_MODEL_DIR").map(PathBuf::from));
    let Some(dir) = dir else {
        println!(
            "skipped: set AGENTMESH_TEST_MODEL_DIR (or pass the directory) to a sentence-transformers model"
        );
        return;
    };
    let (cards, queries) = load();
    let caps = capabilities(&cards);

    let t = Instant::now();
    let embedder = Embedder::load(&dir).expect("load the model");
    let loaded = t.elapsed();
    println!(
        "Model {} ({} dims, id {}…), loaded in {:.0} ms (SHA-256 of the files included), {} thread.\n",
        dir.display(),
        embedder.dim(),
        &embedder.model_id()[..12],
        ms(loaded),
        embedder.threads()
    );

    // Latency: every labelled query once, one at a time; no query repeats, so nothing is cached.
    let t = Instant::now();
    embedder.embed(&["first call after loading"]).expect("embed");
    let first = t.elapsed();
    let mut times = Vec::with_capacity(queries.len());
    let mut query_vectors = Vec::with_capacity(queries.len());
    let (wall0, cpu0) = (Instant::now(), cpu_time());
    for q in &queries {
        let t = Instant::now();
        let v = embedder.embed(&[&q.q]).expect("embed");
        times.push(t.elapsed());
        query_vectors.extend(v);
    }
    let (wall, cpu) = (wall0.elapsed(), cpu_time() - cpu0);
    times.sort();
    println!("| measure | value |");
    println!("|---|---|");
    println!("| query embedding, one at a time, 1 thread: p50 | {:.2} ms |", ms(percentile(&times, 0.5)));
    println!("| p99 | {:.2} ms |", ms(percentile(&times, 0.99)));
    println!("| max | {:.2} ms |", ms(times.last().copied().unwrap_or_default()));
    println!("| first call after loading | {:.2} ms |", ms(first));
    println!(
        "| process CPU time / wall time over the {} queries | {:.0} ms / {:.0} ms |",
        queries.len(),
        ms(cpu),
        ms(wall)
    );

    // Throughput: every capability's text in one call (sorted by length, batches of 32).
    let best = RECIPES[RECIPES.len() - 1];
    let texts: Vec<String> = caps.iter().map(|(_, c)| text(c, best)).collect();
    let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
    let mut runs = Vec::new();
    for _ in 0..3 {
        let t = Instant::now();
        std::hint::black_box(embedder.embed(&refs).expect("embed"));
        runs.push(t.elapsed());
    }
    runs.sort();
    let chars = texts.iter().map(String::len).sum::<usize>() / texts.len().max(1);
    println!(
        "| batch embedding of {} capability texts (mean {chars} chars, recipe \"{}\"), 1 thread, median of 3 | {:.0} ms, {:.0} texts/s |",
        texts.len(),
        best.name,
        ms(runs[1]),
        texts.len() as f64 / runs[1].as_secs_f64()
    );
    if let Ok(two) = Embedder::load_with_threads(&dir, 2) {
        let t = Instant::now();
        std::hint::black_box(two.embed(&refs).expect("embed"));
        let d = t.elapsed();
        println!(
            "| the same on 2 threads, once | {:.0} ms, {:.0} texts/s |",
            ms(d),
            texts.len() as f64 / d.as_secs_f64()
        );
    }

    // Quality: cosine between the query and each capability's text, every capability ranked.
    println!("\n| capability text | queries | n | hit@1 | hit@5 | MRR | NDCG@5 |");
    println!("|---|---|---|---|---|---|---|");
    let mut summary = Vec::new();
    for recipe in RECIPES {
        let texts: Vec<String> = caps.iter().map(|(_, c)| text(c, recipe)).collect();
        let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
        let vectors = embedder.embed(&refs).expect("embed");
        let mut by_kind: Vec<(String, Scores)> = Vec::new();
        let mut all = Scores::default();
        for (q, qv) in queries.iter().zip(&query_vectors) {
            let mut scored: Vec<(f32, &str)> =
                caps.iter().zip(&vectors).map(|((t, _), v)| (similarity(qv, v), t.as_str())).collect();
            scored.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(b.1)));
            let ranked: Vec<&str> = scored.iter().map(|(_, t)| *t).collect();
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
            println!("{}", s.row(recipe.name, kind));
        }
        println!("{}", all.row(recipe.name, "all"));
        let pi: (f64, f64) = by_kind
            .iter()
            .filter(|(k, _)| k == "paraphrase" || k == "intent")
            .fold((0.0, 0.0), |acc, (_, s)| (acc.0 + s.hit5, acc.1 + s.n));
        summary.push((recipe.name, pi.0 / pi.1.max(1.0)));
    }
    println!();
    for (name, hit5) in summary {
        println!("- \"{name}\": paraphrase + intent hit@5 {hit5:.3}");
    }
}
