//! The labelled set in this folder (`agents.json`, `queries.json`) and the retrieval measures, shared by
//! `benches/search.rs` and `benches/embed.rs`.

use std::collections::HashMap;
use std::time::Duration;

use serde_json::Value;

const DIR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/benches/search");

pub struct Labelled {
    pub q: String,
    pub kind: String,
    pub grades: HashMap<String, u32>,
}

pub fn load() -> (Vec<Value>, Vec<Labelled>) {
    let read = |name: &str| -> Value {
        serde_json::from_str(&std::fs::read_to_string(format!("{DIR}/{name}")).expect("read")).expect("json")
    };
    let agents = read("agents.json").as_array().cloned().unwrap_or_default();
    let queries = read("queries.json")
        .as_array()
        .cloned()
        .unwrap_or_default()
        .into_iter()
        .map(|q| {
            let mut grades: HashMap<String, u32> = HashMap::new();
            if let Some(g) = q["graded"].as_object() {
                for (t, v) in g {
                    grades.insert(t.clone(), v.as_u64().unwrap_or(0) as u32);
                }
            }
            for t in q["relevant"].as_array().into_iter().flatten() {
                grades.insert(t.as_str().unwrap_or_default().to_owned(), 2);
            }
            Labelled {
                q: q["q"].as_str().unwrap_or_default().to_owned(),
                kind: q["type"].as_str().unwrap_or_default().to_owned(),
                grades,
            }
        })
        .collect();
    (agents, queries)
}

#[derive(Default, Clone, Copy)]
pub struct Scores {
    pub n: f64,
    pub hit1: f64,
    pub hit5: f64,
    pub mrr: f64,
    pub ndcg5: f64,
}

impl Scores {
    pub fn add(&mut self, ranked: &[impl AsRef<str>], grades: &HashMap<String, u32>) {
        self.n += 1.0;
        let top = |k: usize| ranked.iter().take(k).any(|t| grades.get(t.as_ref()) == Some(&2));
        self.hit1 += f64::from(u8::from(top(1)));
        self.hit5 += f64::from(u8::from(top(5)));
        if let Some(pos) = ranked.iter().position(|t| grades.get(t.as_ref()) == Some(&2)) {
            self.mrr += 1.0 / (pos + 1) as f64;
        }
        let gain = |g: u32| f64::from((1u32 << g) - 1);
        let dcg: f64 = ranked
            .iter()
            .take(5)
            .enumerate()
            .map(|(i, t)| gain(*grades.get(t.as_ref()).unwrap_or(&0)) / ((i + 2) as f64).log2())
            .sum();
        let mut ideal: Vec<u32> = grades.values().copied().collect();
        ideal.sort_by(|a, b| b.cmp(a));
        let idcg: f64 =
            ideal.iter().take(5).enumerate().map(|(i, g)| gain(*g) / ((i + 2) as f64).log2()).sum();
        if idcg > 0.0 {
            self.ndcg5 += dcg / idcg;
        }
    }

    pub fn row(&self, ranker: &str, kind: &str) -> String {
        let n = self.n.max(1.0);
        format!(
            "| {ranker} | {kind} | {:.0} | {:.3} | {:.3} | {:.3} | {:.3} |",
            self.n,
            self.hit1 / n,
            self.hit5 / n,
            self.mrr / n,
            self.ndcg5 / n
        )
    }
}

pub fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}
