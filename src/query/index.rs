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
use crate::card::held::{CardRef, CardText};
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
    /// The record each capability belongs to (its position in the chunk).
    cap_entry: Box<[u16]>,
    /// The capabilities holding each term: as their id, and as one of their tags.
    by_id: Postings,
    by_tag: Postings,
    /// Records with at least one capability, and the capabilities of each kind: the unfiltered answer.
    agents: u32,
    total_reasoners: u32,
    total_skills: u32,
}

/// For each distinct term of a chunk (sorted), the chunk's capabilities that hold it.
#[derive(Debug)]
struct Postings {
    terms: Box<[u32]>,
    /// Term `i`'s capabilities are `caps[start[i]..start[i + 1]]`.
    start: Box<[u32]>,
    caps: Box<[u32]>,
}

impl Postings {
    fn build(mut pairs: Vec<(u32, u32)>) -> Postings {
        pairs.sort_unstable();
        pairs.dedup();
        let mut terms = Vec::new();
        let mut start = Vec::new();
        for (i, &(term, _)) in pairs.iter().enumerate() {
            if terms.last() != Some(&term) {
                terms.push(term);
                start.push(i as u32);
            }
        }
        start.push(pairs.len() as u32);
        Postings {
            terms: terms.into(),
            start: start.into(),
            caps: pairs.into_iter().map(|(_, cap)| cap).collect(),
        }
    }

    /// Calls `f` with every capability holding a term of `set` (once per term it holds).
    fn each(&self, set: &TermSet, mut f: impl FnMut(u32)) {
        let mut postings = |i: usize| {
            let range = self.start[i] as usize..self.start[i + 1] as usize;
            self.caps[range].iter().for_each(|&c| f(c));
        };
        match set {
            TermSet::Empty => {}
            TermSet::One(n) => {
                if let Ok(i) = self.terms.binary_search(n) {
                    postings(i);
                }
            }
            TermSet::Bits(_) => {
                for (i, &term) in self.terms.iter().enumerate() {
                    if set.has(term) {
                        postings(i);
                    }
                }
            }
        }
    }
}

/// Per-query marks over one chunk's capabilities and records, cleared after each chunk.
#[derive(Default)]
struct Scratch {
    cap: Vec<bool>,
    caps: Vec<u32>,
    entry: Vec<bool>,
    entries: Vec<u16>,
}

impl Scratch {
    /// Marks capability `c`; true when it was not marked yet.
    fn mark_cap(&mut self, c: u32) -> bool {
        let slot = &mut self.cap[c as usize];
        let new = !*slot;
        if new {
            *slot = true;
            self.caps.push(c);
        }
        new
    }

    fn mark_entry(&mut self, e: u16) {
        let slot = &mut self.entry[e as usize];
        if !*slot {
            *slot = true;
            self.entries.push(e);
        }
    }

    fn clear(&mut self) {
        self.caps.drain(..).for_each(|c| self.cap[c as usize] = false);
        self.entries.drain(..).for_each(|e| self.entry[e as usize] = false);
    }
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
        let cap_entry: Vec<u16> =
            (0..entries.len()).flat_map(|e| (caps[e]..caps[e + 1]).map(move |_| e as u16)).collect();
        let by_id = Postings::build(numbers.iter().enumerate().map(|(c, &t)| (t, c as u32)).collect());
        let by_tag = Postings::build(
            (0..ids.len())
                .flat_map(|c| (tags[c]..tags[c + 1]).map(move |at| (at, c as u32)))
                .map(|(at, c)| (tag_term[at as usize], c))
                .collect(),
        );
        Chunk {
            entries: entries.into(),
            caps: caps.into(),
            reasoners: reasoners.into(),
            cap_term: numbers.into(),
            tags: tags.into(),
            tag_term: tag_term.into(),
            cap_entry: cap_entry.into(),
            by_id,
            by_tag,
            agents,
            total_reasoners,
            total_skills,
        }
    }

    fn len(&self) -> usize {
        self.entries.len()
    }

    fn is_reasoner(&self, c: u32) -> bool {
        let e = self.cap_entry[c as usize] as usize;
        c < self.caps[e] + u32::from(self.reasoners[e])
    }

    /// Agents, reasoners and skills that the id and tag patterns let through, from the postings of
    /// the matching terms: the cost grows with what matches, not with the chunk.
    fn count(&self, f: &ColumnFilter<'_>, scratch: &mut Scratch) -> (usize, usize, usize) {
        scratch.cap.resize(scratch.cap.len().max(self.cap_term.len()), false);
        scratch.entry.resize(scratch.entry.len().max(self.len()), false);
        let (mut reasoners, mut skills) = (0, 0);
        // `n` capabilities of one kind of record `e` pass.
        let mut take = |scratch: &mut Scratch, e: u16, reasoner: bool, n: usize| {
            if reasoner {
                reasoners += n;
            } else {
                skills += n;
            }
            scratch.mark_entry(e);
        };
        if let Some(tags) = f.tags {
            // Every capability with a matching tag, once, then its kind's id pattern.
            self.by_tag.each(tags, |c| {
                scratch.mark_cap(c);
            });
            for i in 0..scratch.caps.len() {
                let c = scratch.caps[i];
                let reasoner = self.is_reasoner(c);
                let pattern = if reasoner { f.reasoner } else { f.skill };
                if pattern.is_none_or(|p| p.has(self.cap_term[c as usize])) {
                    take(scratch, self.cap_entry[c as usize], reasoner, 1);
                }
            }
        } else {
            for (reasoner, pattern) in [(true, f.reasoner), (false, f.skill)] {
                match pattern {
                    Some(set) => self.by_id.each(set, |c| {
                        if self.is_reasoner(c) == reasoner && scratch.mark_cap(c) {
                            take(scratch, self.cap_entry[c as usize], reasoner, 1);
                        }
                    }),
                    // No pattern on this kind: every capability of it passes.
                    None => {
                        for e in 0..self.len() {
                            let own = self.reasoners[e] as usize;
                            let all = (self.caps[e + 1] - self.caps[e]) as usize;
                            let n = if reasoner { own } else { all - own };
                            if n > 0 {
                                take(scratch, e as u16, reasoner, n);
                            }
                        }
                    }
                }
            }
        }
        let agents = scratch.entries.len();
        scratch.clear();
        (agents, reasoners, skills)
    }
}

/// The id and tag patterns of a query as term sets (`None`: no pattern).
struct ColumnFilter<'a> {
    reasoner: Option<&'a TermSet>,
    skill: Option<&'a TermSet>,
    tags: Option<&'a TermSet>,
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
    // Only id and tag patterns: each chunk off the page is counted from its postings.
    let columns_only = !by_columns && !agent_filters && !query.needs_card() && query.health.is_none();
    let filter = ColumnFilter { reasoner: reasoner.as_ref(), skill: skill.as_ref(), tags: tags.as_ref() };
    let mut scratch = Scratch::default();
    for chunk in &index.chunks {
        let off_page = |sel: &Selection<'_>, agents: usize| {
            sel.total_agents + agents <= query.offset || sel.total_agents >= page_end
        };
        // No filter at all: the chunk's totals answer, unless the page starts inside it.
        if plain && off_page(&sel, chunk.agents as usize) {
            sel.total_agents += chunk.agents as usize;
            sel.total_reasoners += chunk.total_reasoners as usize;
            sel.total_skills += chunk.total_skills as usize;
            continue;
        }
        if columns_only {
            let (agents, reasoners, skills) = chunk.count(&filter, &mut scratch);
            if off_page(&sel, agents) {
                sel.total_agents += agents;
                sel.total_reasoners += reasoners;
                sel.total_skills += skills;
                continue;
            }
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
            let text = query.needs_card().then(|| entry.card.text());
            let view: Option<CardRef<'_>> = text.as_ref().map(CardText::view);
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
