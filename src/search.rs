//! Capability search for LLM agents: ranked retrieval over the node's whole view, on the node, with
//! no network call per query and nothing downloaded.
//!
//! [`Engine`] keeps an inverted index ([`index`]) in step with the registry's snapshots; a search
//! applies the discovery filters first, scores with BM25F over stemmed terms ([`text`]), optionally
//! re-ranks through the capability graph ([`graph`]), and returns capabilities with a relevance in
//! 0..=1 that means the same across queries. [`context`] builds the token-budgeted tiers from it.

pub mod context;
pub mod embed;
pub mod graph;
pub mod index;
pub mod semantic;
pub mod text;
pub mod thesaurus;

use std::cmp::Ordering;
use std::sync::{Arc, Mutex, RwLock};

use context::{Budgets, Counter, Tier, Tiers};

use index::{Doc, Index, FIELDS, FIELD_NAMES};

use crate::query::{Latest, Query, VersionFilter};
use crate::registry::health::{Health, Millis, Thresholds};
use crate::registry::{Entry, Snapshot};

/// Longest query, in characters after trimming.
pub const MAX_QUERY_CHARS: usize = 1024;
/// Most results one search returns.
pub const MAX_RESULTS: usize = 50;
/// Results by default.
pub const DEFAULT_LIMIT: usize = 5;
/// Most candidates tied at the cut that are carried into the final ordering.
const MAX_TIED: usize = 2_000;
/// Results below this relevance are dropped by default.
pub const DEFAULT_MIN_RELEVANCE: f32 = 0.3;

/// Which kind of capability a search looks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Kind {
    #[default]
    Any,
    Reasoner,
    Skill,
}

impl Kind {
    pub fn parse(s: &str) -> Option<Kind> {
        match s.to_ascii_lowercase().as_str() {
            "any" | "" => Some(Kind::Any),
            "reasoner" => Some(Kind::Reasoner),
            "skill" => Some(Kind::Skill),
            _ => None,
        }
    }

    fn admits(self, reasoner: bool) -> bool {
        match self {
            Kind::Any => true,
            Kind::Reasoner => reasoner,
            Kind::Skill => !reasoner,
        }
    }
}

/// One search.
#[derive(Debug, Clone)]
pub struct Request {
    pub q: String,
    pub limit: usize,
    pub min_relevance: f32,
    pub kind: Kind,
    /// Re-rank through the capability graph.
    pub graph: bool,
    /// Score words. Off (with a model): rank by meaning alone, as the benchmark compares.
    pub lexical: bool,
    /// Let a query word also match the words the built-in thesaurus relates to it.
    pub related: bool,
    /// The discovery filters (ids, reasoner/skill patterns, tags, health), applied before ranking.
    pub filters: Query,
}

impl Request {
    pub fn new(q: impl Into<String>) -> Self {
        Self {
            q: q.into(),
            limit: DEFAULT_LIMIT,
            min_relevance: DEFAULT_MIN_RELEVANCE,
            kind: Kind::Any,
            graph: true,
            lexical: true,
            related: true,
            filters: Query::default(),
        }
    }
}

/// A capability found.
#[derive(Debug, Clone)]
pub struct Found {
    pub entry: Arc<Entry>,
    pub reasoner: bool,
    /// Position in its kind's list on the card.
    pub cap: usize,
    pub id: String,
    /// `agent_id:kind:id`.
    pub target: String,
    /// 0..=1, rounded to three decimals.
    pub relevance: f32,
    /// The fields that matched the query, in [`FIELD_NAMES`] order.
    pub matched: Vec<&'static str>,
    pub health: Health,
}

impl Found {
    pub fn kind(&self) -> &'static str {
        if self.reasoner {
            "reasoner"
        } else {
            "skill"
        }
    }
}

/// What a search found.
#[derive(Debug, Clone)]
pub struct Answer {
    pub results: Vec<Found>,
    /// Capabilities in the index (the whole view).
    pub total_indexed: usize,
    /// The signals used: `lexical`, `lexical+graph`, `hybrid` or `hybrid+graph` (hybrid: a model ranks
    /// by meaning too).
    pub ranking: &'static str,
}

/// View generation, budget and counter of a Tier 0.
type Tier0Key = (u64, usize, Counter);

/// The search index of one node, kept in step with its registry.
#[derive(Debug, Default)]
pub struct Engine {
    index: RwLock<Index>,
    /// The semantic ranker, when a model is configured.
    semantic: Option<Arc<semantic::Semantic>>,
    /// The last Tier 0 built, and what it was built for.
    tier0: Mutex<Option<(Tier0Key, Tier)>>,
}

impl Engine {
    /// An engine that also ranks by meaning with `semantic`.
    pub fn with_semantic(semantic: Arc<semantic::Semantic>) -> Self {
        Self { semantic: Some(semantic), ..Self::default() }
    }

    pub fn semantic(&self) -> Option<&Arc<semantic::Semantic>> {
        self.semantic.as_ref()
    }

    /// Embeds what `snapshot` holds that has no embedding yet (off the request path: the node runs
    /// it as the view changes). Stops early when `stop` says so. Returns how many the model computed.
    pub fn catch_up(
        &self,
        snapshot: &Snapshot,
        stop: impl FnMut() -> bool,
    ) -> Result<usize, embed::EmbedError> {
        let Some(semantic) = &self.semantic else { return Ok(0) };
        self.refresh(snapshot);
        let plan = semantic.plan(&self.index.read().unwrap_or_else(|e| e.into_inner()));
        semantic.apply(plan, stop)
    }

    /// Brings the index to `snapshot` (only the cards that changed are re-indexed).
    pub fn refresh(&self, snapshot: &Snapshot) {
        let current = self.index.read().map(|i| i.generation()).unwrap_or(0);
        if current == snapshot.generation {
            return;
        }
        let mut index = self.index.write().unwrap_or_else(|e| e.into_inner());
        index.refresh(snapshot);
    }

    /// Tier 0 of the context for `snapshot`: built once per view and budget, then served as is.
    pub fn tier0(&self, snapshot: &Snapshot, counter: Counter, budget: usize) -> Tier {
        let key = (snapshot.generation, budget, counter);
        let mut cached = self.tier0.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((k, tier)) = cached.as_ref() {
            if *k == key {
                return tier.clone();
            }
        }
        let (heading, entries) = context::tier0_entries(snapshot);
        let tier = context::build(counter, budget, &heading, &entries);
        *cached = Some((key, tier.clone()));
        tier
    }

    /// The three context tiers for `results` (a search's answer, best first) over `snapshot`.
    pub fn context(
        &self,
        snapshot: &Snapshot,
        results: &[Found],
        budgets: &Budgets,
        counter: Counter,
        for_text: bool,
    ) -> Tiers {
        Tiers::new(self.tier0(snapshot, counter, budgets.tier0), results, budgets, counter, for_text)
    }

    /// Capabilities indexed.
    pub fn len(&self) -> usize {
        self.index.read().map(|i| i.len()).unwrap_or(0)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Runs `req` over `snapshot` at `now`. The same request over the same view gives the same order.
    pub fn search(&self, snapshot: &Snapshot, req: &Request, now: Millis, thresholds: &Thresholds) -> Answer {
        self.refresh(snapshot);
        let index = self.index.read().unwrap_or_else(|e| e.into_inner());
        let concepts = index.query(&req.q, req.related.then(thesaurus::Thesaurus::builtin));
        let latest = matches!(req.filters.version, Some(VersionFilter::Latest))
            .then(|| Latest::of(snapshot.entries.iter().map(AsRef::as_ref)));
        let admit = |doc: &Doc| admits(doc, req, now, thresholds, latest.as_ref());
        let mut scored = if req.lexical { index.score(&concepts, admit) } else { Vec::new() };
        let ready = self.semantic.as_ref().and_then(|s| s.ready(&req.q, index.generation()));
        if let Some(ready) = &ready {
            scored = fuse(&index, &scored, ready, admit);
        }
        let hybrid = ready.is_some();
        drop(ready);
        let order = |a: &index::Scored, b: &index::Scored| {
            b.relevance.partial_cmp(&a.relevance).unwrap_or(Ordering::Equal).then_with(|| a.doc.cmp(&b.doc))
        };
        // Only the best few become results; everything tied with the last of them comes along, so
        // that ties are broken by target, not by index order (up to `MAX_TIED`). The graph looks at
        // more candidates, and may lift any of them; what it does not look at keeps its place.
        let keep = req.limit * 4 + 16;
        if req.graph {
            // Which documents matched at all (a bit each): a neighbour that did keeps its own score.
            let words = scored.iter().map(|s| s.doc as usize / 64 + 1).max().unwrap_or(0);
            let mut matched = vec![0u64; words];
            for s in &scored {
                matched[s.doc as usize / 64] |= 1 << (s.doc % 64);
            }
            let matched = |d: u32| matched.get(d as usize / 64).is_some_and(|w| w & (1 << (d % 64)) != 0);
            best(&mut scored, keep + graph::MAX_CANDIDATES, order);
            graph::rerank(&index, &mut scored, req.limit, matched, admit);
            scored.sort_unstable_by(order);
        }
        best(&mut scored, keep, order);
        let mut found: Vec<Found> = scored
            .iter()
            .filter(|s| rounded(s.relevance) >= req.min_relevance)
            .filter_map(|s| {
                let doc = index.doc(s.doc)?;
                let id = index::cap_id(doc)?;
                Some(Found {
                    entry: doc.entry.clone(),
                    reasoner: doc.reasoner,
                    cap: doc.cap as usize,
                    target: format!("{}:{}:{id}", doc.agent_id(), doc.kind()),
                    id,
                    relevance: rounded(s.relevance),
                    matched: (0..FIELDS)
                        .filter(|f| s.fields & (1 << f) != 0)
                        .map(|f| FIELD_NAMES[f])
                        .chain((s.fields & MEANING != 0).then_some("meaning"))
                        .collect(),
                    health: doc.entry.health(now, thresholds),
                })
            })
            .collect();
        // Best first; ties in target order, then the local copy, then publisher.
        found.sort_by(|a, b| {
            b.relevance
                .partial_cmp(&a.relevance)
                .unwrap_or(Ordering::Equal)
                .then_with(|| a.target.cmp(&b.target))
                .then_with(|| b.entry.is_local().cmp(&a.entry.is_local()))
                .then_with(|| a.entry.key.publisher.cmp(&b.entry.key.publisher))
        });
        // One result per target: the same agent published by several nodes is one capability.
        let mut seen = std::collections::HashSet::new();
        found.retain(|f| seen.insert(f.target.clone()));
        found.truncate(req.limit);
        Answer {
            results: found,
            total_indexed: index.len(),
            ranking: match (hybrid, req.graph) {
                (false, false) => "lexical",
                (false, true) => "lexical+graph",
                (true, false) => "hybrid",
                (true, true) => "hybrid+graph",
            },
        }
    }
}

/// `Scored::fields` bit: the capability's meaning matched (the semantic ranker).
const MEANING: u8 = 1 << FIELDS;

/// Lexical and semantic relevance on one scale: a fixed share of each, the same for every query.
/// Capabilities not embedded yet keep their lexical relevance; those that match by meaning alone
/// join the candidates if the request admits them.
fn fuse(
    index: &Index,
    lexical: &[index::Scored],
    ready: &semantic::Ready<'_>,
    mut admit: impl FnMut(&Doc) -> bool,
) -> Vec<index::Scored> {
    let slots = index.slots() as usize;
    let mut lex: Vec<Option<(f32, u8)>> = vec![None; slots];
    for s in lexical {
        if let Some(slot) = lex.get_mut(s.doc as usize) {
            *slot = Some((s.relevance, s.fields));
        }
    }
    let mut out = Vec::with_capacity(lexical.len() * 2);
    for (slot, lexical) in lex.into_iter().enumerate() {
        let doc = slot as u32;
        let Some(meaning) = ready.relevance(doc) else {
            if let Some((relevance, fields)) = lexical {
                out.push(index::Scored { doc, relevance, fields });
            }
            continue;
        };
        let (l, fields) = match lexical {
            Some(found) => found,
            None if meaning > 0.0 && index.doc(doc).is_some_and(&mut admit) => (0.0, 0),
            None => continue,
        };
        let relevance = semantic::SEMANTIC_SHARE * meaning + (1.0 - semantic::SEMANTIC_SHARE) * l;
        let fields = if meaning > 0.0 { fields | MEANING } else { fields };
        if relevance > 0.0 {
            out.push(index::Scored { doc, relevance, fields });
        }
    }
    out
}

/// 0..=1 rounded to three decimals, as results show it.
fn rounded(r: f32) -> f32 {
    (r * 1000.0).round() / 1000.0
}

/// Keeps the best `m` of `scored`, sorted by `order`, and every later one tied with the last of them
/// (rounded as shown, up to [`MAX_TIED`] more). Partial selection: linear in the candidates, then a
/// sort of the few kept.
fn best(
    scored: &mut Vec<index::Scored>,
    m: usize,
    order: impl Fn(&index::Scored, &index::Scored) -> Ordering,
) {
    if m > 0 && scored.len() > m {
        scored.select_nth_unstable_by(m - 1, &order);
        let floor = rounded(scored[m - 1].relevance);
        let mut end = m;
        for i in m..scored.len() {
            if end == m + MAX_TIED {
                break;
            }
            if rounded(scored[i].relevance) >= floor {
                scored.swap(end, i);
                end += 1;
            }
        }
        scored.truncate(end);
    }
    scored.sort_unstable_by(order);
}

/// Whether a capability passes the request's kind and discovery filters.
fn admits(doc: &Doc, req: &Request, now: Millis, thresholds: &Thresholds, latest: Option<&Latest>) -> bool {
    if !req.kind.admits(doc.reasoner) {
        return false;
    }
    if req.filters.admits_all() {
        return true;
    }
    if !req.filters.admits_capability(&doc.entry, doc.reasoner, doc.cap as usize, latest) {
        return false;
    }
    req.filters.health.is_none_or(|wanted| doc.entry.health(now, thresholds) == wanted)
}

#[cfg(test)]
mod tests;
