//! The capability graph: edges between capabilities from what their cards say, used to re-rank a
//! result list (a capability whose neighbours also match the query rises) and to pull in what the top
//! results depend on or are composed with.
//!
//! Edges (weights add up): DEPENDS_ON 1.0 (one lists the other in `requires`, by target or by id),
//! COMPOSED_WITH 0.5 (both on the same card), TAGGED_WITH 0.3 per shared tag when they share at least
//! two, SAME_CATEGORY 0.1.

use std::sync::Arc;

use super::index::{cap_id, Doc, Index, Scored};

pub const DEPENDS_ON: f32 = 1.0;
pub const COMPOSED_WITH: f32 = 0.5;
pub const TAGGED_WITH: f32 = 0.3;
pub const SAME_CATEGORY: f32 = 0.1;
/// How far the neighbours' relevance can lift a capability (a share of what it lacks to reach 1).
pub const BOOST: f32 = 0.15;
/// Candidates the re-ranking looks at: the best ones by lexical relevance.
pub const MAX_CANDIDATES: usize = 100;

/// `agent_id:kind:id` of a document.
pub fn target(doc: &Doc) -> String {
    format!("{}:{}:{}", doc.agent_id(), doc.kind(), cap_id(doc).unwrap_or_default())
}

fn depends(a: &Doc, b_target: &str, b_id: &str) -> bool {
    a.requires.iter().any(|r| &**r == b_target || &**r == b_id)
}

/// The weight of the edge between two documents (0: none).
pub fn edge(a: &Doc, b: &Doc, a_names: (&str, &str), b_names: (&str, &str)) -> f32 {
    let mut w = 0.0;
    if depends(a, b_names.0, b_names.1) || depends(b, a_names.0, a_names.1) {
        w += DEPENDS_ON;
    }
    if Arc::ptr_eq(&a.entry, &b.entry) {
        w += COMPOSED_WITH;
    }
    let shared = a.tags.iter().filter(|t| b.tags.contains(t)).count();
    if shared >= 2 {
        w += TAGGED_WITH * shared as f32;
    }
    if a.category != 0 && a.category == b.category {
        w += SAME_CATEGORY;
    }
    w
}

/// Re-ranks `scored` (sorted best first) in place, and pulls in the DEPENDS_ON and COMPOSED_WITH
/// neighbours of the best `top` that `admit` lets through and that did not match the query
/// themselves (`matched`: those keep their own score). Relevance stays in 0..=1.
pub fn rerank(
    index: &Index,
    scored: &mut Vec<Scored>,
    top: usize,
    matched: impl Fn(u32) -> bool,
    mut admit: impl FnMut(&Doc) -> bool,
) {
    let n = scored.len().min(MAX_CANDIDATES);
    let names: Vec<(String, String)> = scored[..n]
        .iter()
        .map(|s| {
            index.doc(s.doc).map_or_else(Default::default, |d| (target(d), cap_id(d).unwrap_or_default()))
        })
        .collect();
    let before: Vec<f32> = scored[..n].iter().map(|s| s.relevance).collect();
    for i in 0..n {
        let Some(a) = index.doc(scored[i].doc) else { continue };
        let mut lift = 0.0;
        for j in 0..n {
            if i == j {
                continue;
            }
            let Some(b) = index.doc(scored[j].doc) else { continue };
            let w = edge(a, b, (&names[i].0, &names[i].1), (&names[j].0, &names[j].1));
            lift += w * before[j];
        }
        let r = before[i];
        scored[i].relevance = (r + BOOST * lift.min(1.0) * (1.0 - r)).clamp(0.0, 1.0);
    }
    // Pull in what the best results depend on or are composed with.
    let mut extra = Vec::new();
    for s in scored.iter().take(top.min(n)) {
        let Some(doc) = index.doc(s.doc) else { continue };
        let mut neighbours: Vec<(u32, f32)> = Vec::new();
        for r in doc.requires.iter() {
            let found = match r.split(':').collect::<Vec<_>>()[..] {
                [agent, kind, id] => index
                    .with_id(id)
                    .into_iter()
                    .filter(|&d| index.doc(d).is_some_and(|d| d.agent_id() == agent && d.kind() == kind))
                    .collect(),
                _ => index.with_id(r),
            };
            neighbours.extend(found.into_iter().map(|d| (d, DEPENDS_ON)));
        }
        neighbours.extend(
            index.docs_of(doc.agent_id(), &doc.entry.key.publisher).iter().map(|&d| (d, COMPOSED_WITH)),
        );
        for (d, w) in neighbours {
            if matched(d) || extra.iter().any(|x: &Scored| x.doc == d) {
                continue;
            }
            let Some(nd) = index.doc(d) else { continue };
            if admit(nd) {
                extra.push(Scored { doc: d, relevance: (BOOST * w * s.relevance).min(1.0), fields: 0 });
            }
        }
    }
    scored.extend(extra);
}
