//! The view's filter index: discovery filters answered from columns instead of a walk over every card.
//!
//! The view is cut into chunks of at most [`INDEX_CHUNK`] records in discovery order. A chunk holds its
//! records plus, as flat arrays, the term number of every capability id and tag. Terms are numbered
//! by a dictionary shared by every generation of the index ([`Terms`], grow-only), so a filter
//! pattern is matched once against the dictionary, not once per capability: a wildcard becomes a set
//! of term numbers, and each capability costs a bit test.
//!
//! Kept in step with the registry by difference ([`Indexer::index`]): a new snapshot reuses every chunk
//! whose records are the same `Arc<Entry>` as before and rebuilds only the chunks that changed, so one
//! new card costs one chunk, not the view. Indexes are immutable once built: readers never wait for a
//! writer. A reader that finds the index behind its snapshot while another thread is bringing it up to
//! date does not wait either: it answers by the scan ([`super::select`]), which gives the same answer.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, RwLock};

use arc_swap::ArcSwapOption;

use super::{note_change, Hit, Latest, Pattern, Query, Selection, VersionFilter};
use crate::card::held::CardRef;
use crate::defaults::{INDEX_CHUNK, INDEX_TERM_SLACK};
use crate::registry::health::{Millis, Thresholds};
use crate::registry::{Entry, Snapshot};

/// A chunk smaller than this is merged with the next one when either changes.
const MIN_CHUNK: usize = INDEX_CHUNK / 4;

/// Every capability id and tag seen by an index generation, numbered in order of first sight.
#[derive(Debug, Default)]
pub struct Terms {
    table: RwLock<TermTable>,
}

#[derive(Debug, Default)]
struct TermTable {
    numbers: HashMap<Arc<str>, u32>,
    names: Vec<Arc<str>>,
}

impl Terms {
    /// Terms numbered so far (every number is below it).
    pub fn len(&self) -> usize {
        self.read().names.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, TermTable> {
        self.table.read().unwrap_or_else(|e| e.into_inner())
    }

    /// Numbers `names` in one critical section, appending each to `out`.
    fn number_all<'s>(&self, names: impl Iterator<Item = &'s str>, out: &mut Vec<u32>) {
        let mut table = self.table.write().unwrap_or_else(|e| e.into_inner());
        for name in names {
            let n = match table.numbers.get(name) {
                Some(&n) => n,
                None => {
                    let n = table.names.len() as u32;
                    let shared: Arc<str> = name.into();
                    table.names.push(shared.clone());
                    table.numbers.insert(shared, n);
                    n
                }
            };
            out.push(n);
        }
    }

    /// The terms a pattern matches, as a set of numbers.
    fn matching(&self, pattern: &Pattern) -> TermSet {
        let table = self.read();
        if !pattern.wildcard {
            return table.numbers.get(pattern.source.as_str()).map_or(TermSet::Empty, |&n| TermSet::One(n));
        }
        let mut bits = vec![0u64; table.names.len().div_ceil(64)];
        for (n, name) in table.names.iter().enumerate() {
            if pattern.matches(name) {
                bits[n / 64] |= 1 << (n % 64);
            }
        }
        TermSet::Bits(bits)
    }

    /// The terms any of the patterns matches.
    fn matching_any(&self, patterns: &[Pattern]) -> TermSet {
        patterns.iter().map(|p| self.matching(p)).fold(TermSet::Empty, TermSet::union)
    }
}

/// A set of term numbers.
#[derive(Debug, Clone)]
enum TermSet {
    Empty,
    One(u32),
    Bits(Vec<u64>),
}

impl TermSet {
    #[inline]
    fn has(&self, n: u32) -> bool {
        match self {
            TermSet::Empty => false,
            TermSet::One(one) => *one == n,
            TermSet::Bits(bits) => bits.get(n as usize / 64).is_some_and(|w| w & (1 << (n % 64)) != 0),
        }
    }

    fn union(self, other: TermSet) -> TermSet {
        match (self, other) {
            (TermSet::Empty, x) | (x, TermSet::Empty) => x,
            (TermSet::One(a), TermSet::One(b)) if a == b => TermSet::One(a),
            (a, b) => {
                let mut bits = a.into_bits();
                let other = b.into_bits();
                if bits.len() < other.len() {
                    bits.resize(other.len(), 0);
                }
                bits.iter_mut().zip(&other).for_each(|(w, o)| *w |= o);
                TermSet::Bits(bits)
            }
        }
    }

    fn into_bits(self) -> Vec<u64> {
        match self {
            TermSet::Empty => Vec::new(),
            TermSet::One(n) => {
                let mut bits = vec![0u64; n as usize / 64 + 1];
                bits[n as usize / 64] |= 1 << (n % 64);
                bits
            }
            TermSet::Bits(bits) => bits,
        }
    }
}

/// Up to [`INDEX_CHUNK`] consecutive records of the view, with their capabilities as columns.
#[derive(Debug)]
struct Chunk {
    entries: Box<[Arc<Entry>]>,
    /// Record `i`'s capabilities are `caps[i]..caps[i + 1]`: its reasoners, then its skills.
    caps: Box<[u32]>,
    reasoners: Box<[u16]>,
    /// The term number of each capability's id.
    cap_term: Box<[u32]>,
    /// Capability `c`'s tags are `tag_term[tags[c]..tags[c + 1]]`.
    tags: Box<[u32]>,
    tag_term: Box<[u32]>,
    /// Records with at least one capability, and the capabilities of each kind: the unfiltered answer.
    agents: u32,
    total_reasoners: u32,
    total_skills: u32,
}

impl Chunk {
    fn build(entries: &[Arc<Entry>], terms: &Terms) -> Chunk {
        let mut caps = Vec::with_capacity(entries.len() + 1);
        let mut reasoners = Vec::with_capacity(entries.len());
        let mut ids: Vec<&str> = Vec::new();
        let mut tags = vec![0u32];
        let mut tag_names: Vec<&str> = Vec::new();
        let (mut agents, mut total_reasoners, mut total_skills) = (0, 0, 0);
        caps.push(0);
        for entry in entries {
            let card = &entry.card;
            for cap in card.reasoners().chain(card.skills()) {
                ids.push(cap.id);
                tag_names.extend(cap.tags);
                tags.push(tag_names.len() as u32);
            }
            caps.push(ids.len() as u32);
            reasoners.push(card.reasoner_count() as u16);
            agents += u32::from(card.reasoner_count() + card.skill_count() > 0);
            total_reasoners += card.reasoner_count() as u32;
            total_skills += card.skill_count() as u32;
        }
        let mut numbers = Vec::with_capacity(ids.len() + tag_names.len());
        terms.number_all(ids.iter().chain(&tag_names).copied(), &mut numbers);
        let tag_term = numbers.split_off(ids.len());
        Chunk {
            entries: entries.into(),
            caps: caps.into(),
            reasoners: reasoners.into(),
            cap_term: numbers.into(),
            tags: tags.into(),
            tag_term: tag_term.into(),
            agents,
            total_reasoners,
            total_skills,
        }
    }

    fn len(&self) -> usize {
        self.entries.len()
    }
}

/// The filter index of one snapshot generation.
#[derive(Debug)]
pub struct ViewIndex {
    generation: u64,
    chunks: Vec<Arc<Chunk>>,
    terms: Arc<Terms>,
    /// Capability ids and tags held, counted with repeats: the dictionary is rebuilt once it holds
    /// many more terms than this (the rest are names no record uses any more).
    term_uses: usize,
}

impl ViewIndex {
    /// Indexes a whole snapshot with a fresh dictionary.
    pub fn build(snapshot: &Snapshot) -> ViewIndex {
        Self::refreshed(None, snapshot)
    }

    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// Records indexed.
    pub fn len(&self) -> usize {
        self.chunks.iter().map(|c| c.len()).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.chunks.is_empty()
    }

    /// Chunks in the index (for tests and metrics).
    pub fn chunks(&self) -> usize {
        self.chunks.len()
    }

    /// Terms in the dictionary this generation numbers with.
    pub fn terms(&self) -> usize {
        self.terms.len()
    }

    /// The index of `snapshot`, made from `previous` by difference: chunks whose records are the very
    /// same entries are shared, the others rebuilt (a chunk left small merges with the next one).
    fn refreshed(previous: Option<&ViewIndex>, snapshot: &Snapshot) -> ViewIndex {
        let previous = previous.filter(|p| p.terms.len() <= 2 * p.term_uses + INDEX_TERM_SLACK);
        let terms = previous.map_or_else(|| Arc::new(Terms::default()), |p| p.terms.clone());
        let mut out: Vec<Arc<Chunk>> = Vec::new();
        let mut pending: Vec<Arc<Entry>> = Vec::new();
        let entries = &snapshot.entries;
        let mut at = 0;
        let old = previous.map_or(&[][..], |p| &p.chunks[..]);
        for (i, chunk) in old.iter().enumerate() {
            // The records of the new view that fall in this chunk's key range: up to the next chunk's
            // first key (the first chunk also takes whatever sorts before it).
            let end = match old.get(i + 1).and_then(|next| next.entries.first()) {
                Some(bound) => at + entries[at..].partition_point(|e| e.key < bound.key),
                None => entries.len(),
            };
            let slice = &entries[at..end];
            at = end;
            let same = slice.len() == chunk.len()
                && slice.iter().zip(&chunk.entries[..]).all(|(a, b)| Arc::ptr_eq(a, b));
            if same && (pending.is_empty() || pending.len() >= MIN_CHUNK) {
                flush(&mut pending, &mut out, &terms);
                out.push(chunk.clone());
            } else {
                pending.extend(slice.iter().cloned());
                if pending.len() >= 2 * INDEX_CHUNK {
                    let rest = pending.split_off(INDEX_CHUNK);
                    out.push(Arc::new(Chunk::build(&pending, &terms)));
                    pending = rest;
                }
            }
        }
        pending.extend(entries[at..].iter().cloned());
        flush(&mut pending, &mut out, &terms);
        let term_uses = out.iter().map(|c| c.cap_term.len() + c.tag_term.len()).sum();
        ViewIndex { generation: snapshot.generation, chunks: out, terms, term_uses }
    }
}

/// Turns the pending records into chunks of at most `INDEX_CHUNK`, as even as can be.
fn flush(pending: &mut Vec<Arc<Entry>>, out: &mut Vec<Arc<Chunk>>, terms: &Terms) {
    if pending.is_empty() {
        return;
    }
    let pieces = pending.len().div_ceil(INDEX_CHUNK);
    let size = pending.len().div_ceil(pieces);
    for piece in pending.chunks(size) {
        out.push(Arc::new(Chunk::build(piece, terms)));
    }
    pending.clear();
}

/// Keeps a [`ViewIndex`] in step with the registry's snapshots, built on demand.
#[derive(Debug, Default)]
pub struct Indexer {
    current: ArcSwapOption<ViewIndex>,
    /// Held by the one thread bringing the index up to date.
    building: Mutex<()>,
}

impl Indexer {
    /// The index of `snapshot`: the current one when it is of that generation, else one brought up to
    /// date by difference. `None` when another thread is doing that right now (the caller scans).
    pub fn index(&self, snapshot: &Snapshot) -> Option<Arc<ViewIndex>> {
        if let Some(current) = self.current.load_full().filter(|c| c.generation == snapshot.generation) {
            return Some(current);
        }
        let _building = self.building.try_lock().ok()?;
        let previous = self.current.load_full();
        if let Some(current) = previous.as_ref().filter(|c| c.generation == snapshot.generation) {
            return Some(current.clone());
        }
        let next = Arc::new(ViewIndex::refreshed(previous.as_deref(), snapshot));
        // A snapshot older than the index held (a slow reader) is answered but not kept.
        if previous.as_ref().is_none_or(|p| p.generation < next.generation) {
            self.current.store(Some(next.clone()));
        }
        Some(next)
    }

    /// The index last built, if any.
    pub fn current(&self) -> Option<Arc<ViewIndex>> {
        self.current.load_full()
    }
}

/// Runs `query` over the indexed view: the same answer as [`super::select`] over the snapshot the
/// index was built from, at the cost of bit tests over columns. An id allow-list is answered by the
/// scan, which looks those ids up directly.
pub fn select<'a>(
    index: &'a ViewIndex,
    query: &Query,
    now: Millis,
    thresholds: &Thresholds,
) -> Selection<'a> {
    let mut sel = Selection {
        total_agents: 0,
        total_reasoners: 0,
        total_skills: 0,
        has_more: false,
        page: Vec::new(),
        valid_until: None,
    };
    let page_end = query.offset.saturating_add(query.limit);
    let reasoner = query.reasoner.as_ref().map(|p| index.terms.matching(p));
    let skill = query.skill.as_ref().map(|p| index.terms.matching(p));
    let tags = (!query.tags.is_empty()).then(|| index.terms.matching_any(&query.tags));
    let latest = matches!(query.version, Some(VersionFilter::Latest))
        .then(|| Latest::of(index.chunks.iter().flat_map(|c| c.entries.iter().map(AsRef::as_ref))));
    let agent_filters = query.lifecycle.is_some() || query.version.is_some();
    let by_columns = reasoner.is_none() && skill.is_none() && tags.is_none();
    let plain = by_columns && !agent_filters && !query.needs_card() && query.health.is_none();
    // With a health filter, every record the other filters let through decides the answer, so each
    // one's next change of health bounds how long the answer holds; without one, the page's records do.
    let health_ok = |sel: &mut Selection<'a>, entry: &'a Entry| match query.health {
        Some(wanted) => {
            note_change(sel, entry, now, thresholds);
            entry.health(now, thresholds) == wanted
        }
        None => true,
    };
    for chunk in &index.chunks {
        // No filter at all: the chunk's totals answer, unless the page starts inside it.
        if plain && (sel.total_agents + chunk.agents as usize <= query.offset || sel.total_agents >= page_end)
        {
            sel.total_agents += chunk.agents as usize;
            sel.total_reasoners += chunk.total_reasoners as usize;
            sel.total_skills += chunk.total_skills as usize;
            continue;
        }
        for (i, entry) in chunk.entries.iter().enumerate() {
            let (start, end) = (chunk.caps[i] as usize, chunk.caps[i + 1] as usize);
            let split = start + chunk.reasoners[i] as usize;
            let cap_ok = |c: usize, pattern: &Option<TermSet>| {
                pattern.as_ref().is_none_or(|p| p.has(chunk.cap_term[c]))
                    && tags.as_ref().is_none_or(|t| {
                        chunk.tag_term[chunk.tags[c] as usize..chunk.tags[c + 1] as usize]
                            .iter()
                            .any(|&n| t.has(n))
                    })
            };
            let (mut reasoners, mut skills) = if by_columns {
                (split - start, end - split)
            } else {
                (
                    (start..split).filter(|&c| cap_ok(c, &reasoner)).count(),
                    (split..end).filter(|&c| cap_ok(c, &skill)).count(),
                )
            };
            if reasoners == 0 && skills == 0 {
                continue;
            }
            if agent_filters && !query.admits_agent(entry, latest.as_ref()) {
                continue;
            }
            // Metadata and media types: read from the card, for the records the columns let through.
            let view: Option<CardRef<'_>> = query.needs_card().then(|| entry.card.view());
            let fields_ok = |reasoner: bool, at: usize| match &view {
                Some(v) => {
                    let list = if reasoner { &v.reasoners } else { &v.skills };
                    list.get(at).is_some_and(|c| query.admits_fields(v, c))
                }
                None => true,
            };
            if view.is_some() {
                reasoners =
                    (start..split).filter(|&c| cap_ok(c, &reasoner) && fields_ok(true, c - start)).count();
                skills = (split..end).filter(|&c| cap_ok(c, &skill) && fields_ok(false, c - split)).count();
                if reasoners == 0 && skills == 0 {
                    continue;
                }
            }
            if !health_ok(&mut sel, entry) {
                continue;
            }
            let position = sel.total_agents;
            sel.total_agents += 1;
            sel.total_reasoners += reasoners;
            sel.total_skills += skills;
            if position >= query.offset && position < page_end {
                if query.health.is_none() {
                    note_change(&mut sel, entry, now, thresholds);
                }
                sel.page.push(Hit {
                    entry,
                    health: entry.health(now, thresholds),
                    last_heartbeat: entry.last_heartbeat(now),
                    reasoners: (start..split)
                        .filter(|&c| cap_ok(c, &reasoner) && fields_ok(true, c - start))
                        .map(|c| c - start)
                        .collect(),
                    skills: (split..end)
                        .filter(|&c| cap_ok(c, &skill) && fields_ok(false, c - split))
                        .map(|c| c - split)
                        .collect(),
                });
            }
        }
    }
    sel.has_more = page_end < sel.total_agents;
    sel
}

#[cfg(test)]
mod tests;
