//! An inverted index of every capability in the view, scored with BM25F, kept up to date with the
//! view by difference: a new snapshot re-indexes only the cards that changed (unchanged cards are the
//! same `Arc<Entry>` in both snapshots).
//!
//! Relevance is comparable across queries: it is mostly *coverage*, the share of the query's
//! information (the IDF of its terms) that the capability matches, plus a little of the BM25F score
//! for ordering among capabilities that cover the same terms. Both parts are in 0..=1.

use std::collections::HashMap;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::Arc;

use serde_json::Value;

use super::text::Analyzer;
use super::thesaurus::Thesaurus;
use crate::card::held::{CapRef, CardRef};
use crate::registry::{Entry, Snapshot};

/// The fields of a capability that are indexed, in this order.
pub const FIELDS: usize = 7;
/// Names of the fields, as `matched` reports them.
pub const FIELD_NAMES: [&str; FIELDS] =
    ["id", "name", "tags", "category", "description", "input_schema", "agent"];
/// How much a match in each field counts (BM25F field weights): a word of the capability's id or name
/// says what it does; its agent's description only hints.
const WEIGHT: [f32; FIELDS] = [2.5, 2.5, 2.0, 1.5, 1.0, 0.8, 0.4];
/// Length normalisation per field: long descriptions should not win by length; short fields barely vary.
const B: [f32; FIELDS] = [0.3, 0.3, 0.3, 0.3, 0.75, 0.6, 0.5];
/// BM25 term-frequency saturation.
const K1: f32 = 1.2;
/// Share of relevance that is coverage; the rest is the BM25F score scaled to 0..=1.
const COVERAGE_SHARE: f32 = 0.85;
/// Weight of a query term that no capability has, relative to the mean IDF of the query's known
/// terms: an unknown word (a city, a name) is mostly an argument, not what the capability must do.
const UNKNOWN_TERM_WEIGHT: f32 = 0.5;
/// Credit for matching a term related to a query term (the thesaurus), relative to the term itself.
/// Chosen on the labelled set in `benches/search/` among 0.35, 0.5, 0.6 and 0.7: a related word says
/// less than the word itself, and past 0.6 task-intent queries start to lose to loose matches.
pub const RELATED_WEIGHT: f32 = 0.6;
/// Longest property description read from an input schema, and most properties read.
const MAX_PARAM_TEXT: usize = 512;
const MAX_PARAMS: usize = 64;

/// Per-query state of a document slot while scoring.
const UNSEEN: u8 = 0;
const ADMITTED: u8 = 1;
const REFUSED: u8 = 2;

/// One capability in the index.
#[derive(Debug)]
pub struct Doc {
    pub entry: Arc<Entry>,
    pub reasoner: bool,
    /// Position in its kind's list on the card.
    pub cap: u16,
    lens: [u16; FIELDS],
    /// Graph facts: hashes of the lower-cased tags and of the effective category (0: none).
    pub tags: Box<[u64]>,
    pub category: u64,
    /// Targets or ids it requires, as written on the card.
    pub requires: Box<[Box<str>]>,
}

impl Doc {
    pub fn agent_id(&self) -> &str {
        &self.entry.key.agent_id
    }

    pub fn kind(&self) -> &'static str {
        if self.reasoner {
            "reasoner"
        } else {
            "skill"
        }
    }
}

#[derive(Debug, Clone, Copy)]
struct Posting {
    doc: u32,
    tf: [u8; FIELDS],
}

#[derive(Debug, Default)]
struct Term {
    postings: Vec<Posting>,
    /// Live documents holding the term.
    df: u32,
}

/// A word of a query and the terms that count for it: the word's own term first (weight 1), then the
/// terms related to it (weight [`RELATED_WEIGHT`]).
#[derive(Debug, Clone)]
pub struct Concept {
    pub alternatives: Vec<(String, f32)>,
}

/// A scored capability.
#[derive(Debug, Clone, Copy)]
pub struct Scored {
    pub doc: u32,
    pub relevance: f32,
    /// Bit `f` set: field `f` matched a query term.
    pub fields: u8,
}

#[derive(Debug, Default)]
pub struct Index {
    analyzer: Analyzer,
    terms: HashMap<Box<str>, u32>,
    term_data: Vec<Term>,
    docs: Vec<Option<Doc>>,
    /// Slots no posting points at, free for new documents.
    free: Vec<u32>,
    live: usize,
    /// Removed documents whose postings are still in the lists.
    dead: usize,
    len_sum: [u64; FIELDS],
    /// The indexed entries in view order, with their documents.
    entries: Vec<(Arc<Entry>, Vec<u32>)>,
    generation: u64,
}

impl Index {
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// Capabilities indexed.
    pub fn len(&self) -> usize {
        self.live
    }

    pub fn is_empty(&self) -> bool {
        self.live == 0
    }

    /// Document slots (live or free): every document id is below it.
    pub fn slots(&self) -> u32 {
        self.docs.len() as u32
    }

    pub fn doc(&self, id: u32) -> Option<&Doc> {
        self.docs.get(id as usize).and_then(Option::as_ref)
    }

    /// The documents of the entry with this key, if indexed.
    pub fn docs_of(&self, agent_id: &str, publisher: &libp2p::PeerId) -> &[u32] {
        let at = self
            .entries
            .partition_point(|(e, _)| (e.key.agent_id.as_str(), &e.key.publisher) < (agent_id, publisher));
        match self.entries.get(at) {
            Some((e, docs)) if e.key.agent_id == agent_id && e.key.publisher == *publisher => docs,
            _ => &[],
        }
    }

    /// Brings the index to `snapshot`, re-indexing only the entries that changed.
    pub fn refresh(&mut self, snapshot: &Snapshot) {
        if snapshot.generation == self.generation {
            return;
        }
        let old = std::mem::take(&mut self.entries);
        let mut next = Vec::with_capacity(snapshot.entries.len());
        let mut old = old.into_iter().peekable();
        for entry in &snapshot.entries {
            // Both lists are sorted by key: drop the old entries before this one, keep an unchanged one.
            while let Some((e, _)) = old.peek() {
                if e.key < entry.key {
                    let (gone, docs) = old.next().unwrap_or_else(|| unreachable!());
                    self.remove(&gone, &docs);
                } else {
                    break;
                }
            }
            match old.peek() {
                Some((e, _)) if Arc::ptr_eq(e, entry) => {
                    next.push(old.next().unwrap_or_else(|| unreachable!()));
                }
                Some((e, _)) if e.key == entry.key => {
                    let (replaced, docs) = old.next().unwrap_or_else(|| unreachable!());
                    self.remove(&replaced, &docs);
                    let docs = self.add(entry);
                    next.push((entry.clone(), docs));
                }
                _ => {
                    let docs = self.add(entry);
                    next.push((entry.clone(), docs));
                }
            }
        }
        for (gone, docs) in old {
            self.remove(&gone, &docs);
        }
        self.entries = next;
        self.generation = snapshot.generation;
        if self.dead > 1024 && self.dead > self.live / 2 {
            self.compact();
        }
    }

    fn add(&mut self, entry: &Arc<Entry>) -> Vec<u32> {
        let card_text = entry.card.text();
        let card = card_text.view();
        let agent_text = agent_text(&card);
        let mut ids = Vec::with_capacity(card.reasoners.len() + card.skills.len());
        for (reasoner, list) in [(true, &card.reasoners), (false, &card.skills)] {
            for (i, cap) in list.iter().enumerate() {
                ids.push(self.add_doc(entry, &card, reasoner, i, cap, &agent_text));
            }
        }
        ids
    }

    fn add_doc(
        &mut self,
        entry: &Arc<Entry>,
        card: &CardRef<'_>,
        reasoner: bool,
        at: usize,
        cap: &CapRef<'_>,
        agent_text: &str,
    ) -> u32 {
        let fields = fields(cap, card, agent_text);
        let mut tfs: HashMap<String, [u8; FIELDS]> = HashMap::new();
        let mut lens = [0u16; FIELDS];
        for (f, text) in fields.iter().enumerate() {
            self.analyzer.terms(text, |term| {
                lens[f] = lens[f].saturating_add(1);
                let tf = tfs.entry(term).or_default();
                tf[f] = tf[f].saturating_add(1);
            });
        }
        let doc = Doc {
            entry: entry.clone(),
            reasoner,
            cap: at as u16,
            lens,
            tags: cap.tags.iter().map(|t| hash_word(t)).collect(),
            category: cap.category_in(card).map_or(0, hash_word),
            requires: cap.requires.iter().map(|r| Box::from(&**r)).collect(),
        };
        let id = match self.free.pop() {
            Some(id) => {
                self.docs[id as usize] = Some(doc);
                id
            }
            None => {
                self.docs.push(Some(doc));
                (self.docs.len() - 1) as u32
            }
        };
        for (term, tf) in tfs {
            let t = match self.terms.get(term.as_str()) {
                Some(&t) => t,
                None => {
                    let t = self.term_data.len() as u32;
                    self.terms.insert(term.into_boxed_str(), t);
                    self.term_data.push(Term::default());
                    t
                }
            };
            let data = &mut self.term_data[t as usize];
            data.postings.push(Posting { doc: id, tf });
            data.df += 1;
        }
        for (sum, len) in self.len_sum.iter_mut().zip(lens) {
            *sum += u64::from(len);
        }
        self.live += 1;
        id
    }

    /// Removes the documents of one entry (all from the same card, read once to find their terms
    /// again: cheaper than keeping every document's terms).
    fn remove(&mut self, entry: &Entry, docs: &[u32]) {
        let card_text = entry.card.text();
        let card = card_text.view();
        let agent_text = agent_text(&card);
        for &id in docs {
            let Some(doc) = self.docs.get_mut(id as usize).and_then(Option::take) else { continue };
            let list = if doc.reasoner { &card.reasoners } else { &card.skills };
            if let Some(cap) = list.get(doc.cap as usize) {
                let mut seen = std::collections::HashSet::new();
                for text in fields(cap, &card, &agent_text) {
                    self.analyzer.terms(&text, |term| {
                        if seen.insert(term.clone()) {
                            if let Some(&t) = self.terms.get(term.as_str()) {
                                let df = &mut self.term_data[t as usize].df;
                                *df = df.saturating_sub(1);
                            }
                        }
                    });
                }
            }
            for (sum, len) in self.len_sum.iter_mut().zip(doc.lens) {
                *sum -= u64::from(len);
            }
            self.live -= 1;
            self.dead += 1;
        }
    }

    /// Drops the postings of removed documents and the terms no document holds any more.
    fn compact(&mut self) {
        let docs = &self.docs;
        let old_terms = std::mem::take(&mut self.terms);
        let mut old_data = std::mem::take(&mut self.term_data);
        for (term, t) in old_terms {
            let mut data = std::mem::take(&mut old_data[t as usize]);
            data.postings.retain(|p| docs[p.doc as usize].is_some());
            if data.postings.is_empty() {
                continue;
            }
            data.postings.shrink_to_fit();
            self.terms.insert(term, self.term_data.len() as u32);
            self.term_data.push(data);
        }
        self.free = (0..self.docs.len() as u32).filter(|&i| self.docs[i as usize].is_none()).collect();
        self.dead = 0;
    }

    /// The query's concepts: its terms, deduplicated, in order, each with the terms `thesaurus` relates
    /// to it (those that are not themselves terms of the query).
    pub fn query(&self, q: &str, thesaurus: Option<&Thesaurus>) -> Vec<Concept> {
        let mut terms = self.analyzer.collect(q);
        let mut seen = std::collections::HashSet::new();
        terms.retain(|t| seen.insert(t.clone()));
        // A related term counts for the first query term it relates to, not again for a later one.
        let mut used = seen;
        terms
            .iter()
            .map(|term| {
                let mut alternatives = vec![(term.clone(), 1.0)];
                for related in thesaurus.map_or(&[][..], |t| t.related(term)) {
                    if used.insert(related.to_string()) {
                        alternatives.push((related.to_string(), RELATED_WEIGHT));
                    }
                }
                Concept { alternatives }
            })
            .collect()
    }

    /// Every live document matching at least one of the concepts, with its relevance; `admit` filters
    /// documents before they are scored further. Unordered.
    ///
    /// Each concept carries the information (IDF) of its own term, or, when no capability has that
    /// term, the mean IDF of its related terms that some capability has. A document covers a concept
    /// by its best alternative: an exact match in full, a related term for its weight.
    pub fn score(&self, concepts: &[Concept], mut admit: impl FnMut(&Doc) -> bool) -> Vec<Scored> {
        if self.live == 0 || concepts.is_empty() {
            return Vec::new();
        }
        let n = self.live as f32;
        let avg: [f32; FIELDS] = std::array::from_fn(|f| (self.len_sum[f] as f32 / n).max(1.0));
        let idf = |df: u32| (1.0 + (n - df as f32 + 0.5) / (df as f32 + 0.5)).ln();
        // Per concept: its information and the alternatives some document holds.
        let mut known: Vec<(f32, Vec<(&Term, f32)>)> = Vec::new();
        let mut unknown = 0usize;
        for concept in concepts {
            let alternatives: Vec<(&Term, f32)> = concept
                .alternatives
                .iter()
                .filter_map(|(t, w)| self.terms.get(t.as_str()).map(|&t| (&self.term_data[t as usize], *w)))
                .filter(|(data, _)| data.df > 0)
                .collect();
            let own = alternatives.first().filter(|(_, w)| *w >= 1.0).map(|(data, _)| idf(data.df));
            let information = own.or_else(|| {
                (!alternatives.is_empty()).then(|| {
                    alternatives.iter().map(|(data, _)| idf(data.df)).sum::<f32>() / alternatives.len() as f32
                })
            });
            match information {
                Some(info) => known.push((info, alternatives)),
                None => unknown += 1,
            }
        }
        if known.is_empty() {
            return Vec::new();
        }
        let mean_idf = known.iter().map(|(info, _)| info).sum::<f32>() / known.len() as f32;
        let information =
            known.iter().map(|(info, _)| info).sum::<f32>() + unknown as f32 * UNKNOWN_TERM_WEIGHT * mean_idf;
        let best_score = known.iter().map(|(info, _)| info * (K1 + 1.0)).sum::<f32>();
        // Dense accumulators per document slot, and the slots touched: cheaper than a map at any size
        // the view allows (a few bytes per capability, reset per query).
        let mut acc: Vec<(f32, f32, u8)> = vec![(0.0, 0.0, 0); self.docs.len()];
        let mut state: Vec<u8> = vec![UNSEEN; self.docs.len()];
        let mut touched: Vec<u32> = Vec::new();
        // The best match of each document for the concept being scored, and the documents it holds.
        let mut concept_best: Vec<(f32, f32)> = vec![(0.0, 0.0); self.docs.len()];
        let mut in_concept: Vec<u32> = Vec::new();
        for (info, alternatives) in &known {
            for (data, weight) in alternatives {
                for p in &data.postings {
                    let at = p.doc as usize;
                    match state[at] {
                        REFUSED => continue,
                        UNSEEN => {
                            let admitted = self.docs[at].as_ref().is_some_and(&mut admit);
                            state[at] = if admitted { ADMITTED } else { REFUSED };
                            if !admitted {
                                continue;
                            }
                            touched.push(p.doc);
                        }
                        _ => {}
                    }
                    let Some(doc) = self.docs[at].as_ref() else { continue };
                    let mut tf = 0.0;
                    let mut fields = 0u8;
                    for f in 0..FIELDS {
                        if p.tf[f] > 0 {
                            let norm = 1.0 - B[f] + B[f] * f32::from(doc.lens[f]) / avg[f];
                            tf += WEIGHT[f] * f32::from(p.tf[f]) / norm;
                            fields |= 1 << f;
                        }
                    }
                    let saturated = tf * (K1 + 1.0) / (tf + K1);
                    let best = &mut concept_best[at];
                    if best.0 == 0.0 && best.1 == 0.0 {
                        in_concept.push(p.doc);
                    }
                    best.0 = best.0.max(weight * saturated.min(1.0));
                    best.1 = best.1.max(weight * saturated);
                    acc[at].2 |= fields;
                }
            }
            for doc in in_concept.drain(..) {
                let best = std::mem::take(&mut concept_best[doc as usize]);
                let slot = &mut acc[doc as usize];
                slot.0 += info * best.0;
                slot.1 += info * best.1;
            }
        }
        touched
            .into_iter()
            .map(|doc| {
                let (coverage, score, fields) = acc[doc as usize];
                Scored {
                    doc,
                    relevance: (COVERAGE_SHARE * (coverage / information).min(1.0)
                        + (1.0 - COVERAGE_SHARE) * (score / best_score).min(1.0))
                    .clamp(0.0, 1.0),
                    fields,
                }
            })
            .collect()
    }

    /// Documents whose capability id is exactly `id` (any agent), found through the id's terms.
    pub fn with_id(&self, id: &str) -> Vec<u32> {
        let Some(first) = self.analyzer.collect(id).into_iter().next() else { return Vec::new() };
        let Some(&t) = self.terms.get(first.as_str()) else { return Vec::new() };
        self.term_data[t as usize]
            .postings
            .iter()
            .filter(|p| p.tf[0] > 0)
            .filter_map(|p| self.doc(p.doc).map(|d| (p.doc, d)))
            .filter(|(_, d)| cap_id(d).as_deref() == Some(id))
            .map(|(id, _)| id)
            .collect()
    }
}

/// The id of a document's capability, read from its card's packed index.
pub fn cap_id(doc: &Doc) -> Option<String> {
    let mut caps = if doc.reasoner { doc.entry.card.reasoners() } else { doc.entry.card.skills() };
    caps.nth(doc.cap as usize).map(|c| c.id.to_owned())
}

/// A word's identity for graph edges: a hash of its lower-case form.
pub fn hash_word(word: &str) -> u64 {
    let mut h = DefaultHasher::new();
    word.to_lowercase().hash(&mut h);
    h.finish() | 1
}

/// What a card says of its agent (name, description, tags): the `agent` field of each capability.
fn agent_text(card: &CardRef<'_>) -> String {
    let mut text = String::new();
    for part in [&*card.name, &*card.description].into_iter().chain(card.tags.iter().map(|t| &**t)) {
        text.push_str(part);
        text.push(' ');
    }
    text
}

/// The text of each field of a capability, in [`FIELDS`] order.
fn fields(cap: &CapRef<'_>, card: &CardRef<'_>, agent_text: &str) -> [String; FIELDS] {
    let mut agent = agent_text.to_owned();
    for r in &cap.requires {
        agent.push_str(r);
        agent.push(' ');
    }
    [
        cap.id.to_string(),
        cap.name.as_deref().unwrap_or_default().to_owned(),
        cap.tags.join(" "),
        cap.category_in(card).unwrap_or_default().to_owned(),
        cap.description.as_deref().unwrap_or_default().to_owned(),
        cap.input_schema.map(|raw| schema_text(raw.get())).unwrap_or_default(),
        agent,
    ]
}

/// Property names and descriptions of a JSON Schema's top-level `properties`.
pub fn schema_text(schema: &str) -> String {
    let Ok(Value::Object(root)) = serde_json::from_str::<Value>(schema) else { return String::new() };
    let mut out = String::new();
    if let Some(Value::Object(props)) = root.get("properties") {
        for (name, prop) in props.iter().take(MAX_PARAMS) {
            out.push_str(name);
            out.push(' ');
            if let Some(d) = prop.get("description").and_then(Value::as_str) {
                let cut = d.char_indices().nth(MAX_PARAM_TEXT).map_or(d.len(), |(i, _)| i);
                out.push_str(&d[..cut]);
                out.push(' ');
            }
        }
    }
    out
}
