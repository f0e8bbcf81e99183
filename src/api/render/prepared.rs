//! Records rendered in advance, for every format: the bytes of one record's part of a response around
//! the values that change from one request to the next (health, lifecycle, last heartbeat), and each
//! capability's bytes. A page of records seen before is then rendered by copying bytes; what a format
//! puts between the pieces is its own ([`json`](super::json), [`xml`](super::xml),
//! [`compact`](super::compact)).

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};

use crate::defaults::RENDER_CACHE_BYTES;
use crate::query::{Hit, Query};
use crate::registry::{Entry, EntryId};

/// Which render a record was prepared for: the format and the include flags it shows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Form(u8);

impl Form {
    /// JSON agents with the capabilities' optional keys `q` asks for.
    pub fn json(q: &Query) -> Form {
        Form(include_bits(q))
    }

    /// XML agents with the capabilities' elements `q` asks for.
    pub fn xml(q: &Query) -> Form {
        Form(0x10 | include_bits(q))
    }

    /// Compact items: ids, targets and tags only, whatever the flags.
    pub fn compact() -> Form {
        Form(0x20)
    }
}

/// Which optional parts the capabilities of a response carry.
fn include_bits(q: &Query) -> u8 {
    u8::from(q.include_descriptions)
        | u8::from(q.include_input_schema) << 1
        | u8::from(q.include_output_schema) << 2
        | u8::from(q.include_examples) << 3
}

/// Bytes a format writes for one record beyond its prepared parts and a separator after each, at
/// most: the request-time values (health, lifecycle, last heartbeat) and the glue between them.
const PER_RECORD: usize = 128;
/// Bytes a page writes around its records (its opening with the totals, its close), at most.
const PAGE_AROUND: usize = 512;

/// Room for a page of `records` in any format: what its buffer is taken for, so that writing the page
/// never grows it (a grown buffer is of no size class of `render::buffers`, which then frees it).
pub fn page_len(records: &[Arc<Prepared>]) -> usize {
    PAGE_AROUND + records.iter().map(|p| p.len + p.parts + PER_RECORD).sum::<usize>()
}

/// One record rendered once for one [`Form`].
#[derive(Debug)]
pub struct Prepared {
    /// The record's own bytes, in order, between which the format writes the request-time values.
    pub pieces: Box<[Box<[u8]>]>,
    /// Each reasoner's and each skill's bytes, in card order.
    pub reasoners: Box<[Box<[u8]>]>,
    pub skills: Box<[Box<[u8]>]>,
    /// The sum of every part's length, counted once: a page asks it of each of its records
    /// ([`page_len`]), and walking the parts again read memory the copy would not otherwise touch.
    len: usize,
    /// The number of parts.
    parts: usize,
}

impl Prepared {
    pub fn new(pieces: Vec<Vec<u8>>, reasoners: Vec<Vec<u8>>, skills: Vec<Vec<u8>>) -> Prepared {
        let all = || pieces.iter().chain(&reasoners).chain(&skills);
        let (len, parts) = (all().map(Vec::len).sum(), all().count());
        let boxed = |list: Vec<Vec<u8>>| list.into_iter().map(Vec::into_boxed_slice).collect();
        Prepared { pieces: boxed(pieces), reasoners: boxed(reasoners), skills: boxed(skills), len, parts }
    }

    /// Bytes held (an estimate that counts the allocations' overhead).
    pub fn bytes(&self) -> usize {
        self.len + 32 * self.parts + 128
    }

    /// The piece at `n`, empty when the format made fewer.
    pub fn piece(&self, n: usize) -> &[u8] {
        self.pieces.get(n).map_or(&[], |p| p)
    }

    /// Appends the bytes of the capabilities at `at` (indexes into `list`), `sep` between two.
    pub fn caps(list: &[Box<[u8]>], at: &[usize], sep: &[u8], out: &mut Vec<u8>) {
        for (n, cap) in at.iter().filter_map(|&i| list.get(i)).enumerate() {
            if n > 0 {
                out.extend_from_slice(sep);
            }
            out.extend_from_slice(cap);
        }
    }
}

/// Hashes an entry's number (already unique): one multiplication, not SipHash.
#[derive(Default)]
struct AddressHasher(u64);

impl std::hash::Hasher for AddressHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        bytes.iter().for_each(|&b| self.write_u64(u64::from(b)));
    }

    fn write_u64(&mut self, n: u64) {
        self.0 = (self.0.rotate_left(5) ^ n).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }

    fn write_usize(&mut self, n: usize) {
        self.write_u64(n as u64);
    }

    fn write_u8(&mut self, n: u8) {
        self.write_u64(u64::from(n));
    }
}

/// Kept under the entry it was made from (an entry's content never changes: a new version of a record
/// is a new entry), so a lookup reads no more than the map's own slot.
type Key = (EntryId, Form);
type ByAddress = HashMap<Key, (Arc<Prepared>, u64), std::hash::BuildHasherDefault<AddressHasher>>;

#[derive(Default)]
struct PreparedMap {
    map: ByAddress,
    /// Keys in the order they were inserted, with the insertion number: the oldest go first.
    order: VecDeque<(Key, u64)>,
    inserted: u64,
    bytes: usize,
}

impl PreparedMap {
    /// Keeps `prepared` under `key`, dropping the oldest records while the bound would be passed.
    fn insert(&mut self, key: Key, prepared: Arc<Prepared>) {
        let size = prepared.bytes();
        while self.bytes + size > RENDER_CACHE_BYTES {
            let Some((old, number)) = self.order.pop_front() else { break };
            // A key inserted again since is further back in the queue: only its last insertion counts.
            if self.map.get(&old).is_some_and(|(_, n)| *n == number) {
                if let Some((gone, _)) = self.map.remove(&old) {
                    self.bytes -= gone.bytes();
                }
            }
        }
        self.inserted += 1;
        if let Some((old, _)) = self.map.insert(key, (prepared, self.inserted)) {
            self.bytes -= old.bytes();
        }
        self.order.push_back((key, self.inserted));
        self.bytes += size;
        // Keys inserted again leave stale queue slots behind; bound the queue by the map.
        if self.order.len() > 2 * self.map.len() + 1024 {
            let map = &self.map;
            self.order.retain(|(k, n)| map.get(k).is_some_and(|(_, m)| m == n));
        }
    }
}

/// Prepared records of every format, bounded together by `RENDER_CACHE_BYTES`, oldest out first.
#[derive(Default)]
pub struct PreparedCache {
    state: Mutex<PreparedMap>,
}

impl PreparedCache {
    /// Bytes held (an estimate that counts the allocations' overhead).
    pub fn bytes(&self) -> usize {
        self.state.lock().map(|s| s.bytes).unwrap_or(0)
    }

    /// The prepared form of each record of a page: those held are taken under one lock, the others
    /// made by `make` outside it and then kept.
    pub fn page(
        &self,
        page: &[Hit<'_>],
        form: Form,
        make: impl Fn(&Entry) -> Prepared,
    ) -> Vec<Arc<Prepared>> {
        let key = |entry: &Entry| (entry.id, form);
        let mut found: Vec<Option<Arc<Prepared>>> = match self.state.lock() {
            Ok(state) => page.iter().map(|h| state.map.get(&key(h.entry)).map(|(p, _)| p.clone())).collect(),
            Err(_) => vec![None; page.len()],
        };
        let mut made = Vec::new();
        for (slot, hit) in found.iter_mut().zip(page) {
            if slot.is_none() {
                let prepared = Arc::new(make(hit.entry));
                made.push((key(hit.entry), prepared.clone()));
                *slot = Some(prepared);
            }
        }
        if !made.is_empty() {
            if let Ok(mut state) = self.state.lock() {
                for (k, prepared) in made {
                    if prepared.bytes() <= RENDER_CACHE_BYTES / 64 {
                        state.insert(k, prepared);
                    }
                }
            }
        }
        found.into_iter().flatten().collect()
    }
}

/// A page hit that shows every capability of its record, with no health yet: what a record is
/// prepared from.
pub fn whole(entry: &Entry, reasoners: usize, skills: usize) -> Hit<'_> {
    Hit {
        entry,
        health: crate::registry::health::Health::Unknown,
        last_heartbeat: None,
        reasoners: (0..reasoners).collect(),
        skills: (0..skills).collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::card::AgentCard;
    use crate::registry::{Origin, RecordKey};

    fn entry(seq: u64, url: &str) -> Entry {
        entry_of(RecordKey { agent_id: "a".into(), publisher: libp2p::PeerId::random() }, seq, url)
    }

    fn entry_of(key: RecordKey, seq: u64, url: &str) -> Entry {
        let json = serde_json::json!({"agent_id": "a", "base_url": url, "skills": [{"id": "s"}]});
        let card = AgentCard::from_json(json.to_string().as_bytes()).unwrap();
        Entry::new(key, seq, &card, Origin::Remote, 0)
    }

    fn made(entry: &Entry) -> Prepared {
        Prepared::new(
            vec![entry.card.text().view().base_url.as_bytes().to_vec()],
            vec![],
            vec![b"s".to_vec()],
        )
    }

    #[test]
    fn a_new_version_of_a_record_is_never_served_from_an_older_one() {
        let cache = PreparedCache::default();
        let old = entry(1, "http://old");
        let first = cache.page(&[whole(&old, 0, 1)], Form::compact(), made).remove(0);
        assert_eq!(first.piece(0), b"http://old");
        // Another version of the same record, even one that takes the old one's place in memory.
        let new = entry_of(old.key.clone(), 2, "http://new");
        drop(old);
        let served = cache.page(&[whole(&new, 0, 1)], Form::compact(), made).remove(0);
        assert_eq!(served.piece(0), b"http://new");
        assert!(cache.page(&[whole(&new, 0, 1)], Form::compact(), |_| unreachable!()).len() == 1, "kept");
    }

    #[test]
    fn each_form_of_a_record_is_kept_apart() {
        let cache = PreparedCache::default();
        let e = entry(1, "http://x");
        let hit = [whole(&e, 0, 1)];
        let piece = |form, text: &str| {
            let p = cache.page(&hit, form, |_| Prepared::new(vec![text.as_bytes().to_vec()], vec![], vec![]));
            p[0].piece(0).to_vec()
        };
        let q = Query::default();
        assert_eq!(piece(Form::json(&q), "json"), b"json");
        assert_eq!(piece(Form::xml(&q), "xml"), b"xml");
        assert_eq!(piece(Form::compact(), "compact"), b"compact");
        assert_eq!(piece(Form::json(&q), "again"), b"json", "held from the first request");
    }

    #[test]
    fn the_prepared_records_stay_within_their_bound_oldest_out_first() {
        let e = entry(1, "http://x");
        let one = Arc::new(made(&e));
        let mut map = PreparedMap::default();
        let fits = RENDER_CACHE_BYTES / one.bytes();
        let key = |n: usize| (EntryId::of(n as u64), Form::compact());
        for n in 0..3 * fits {
            map.insert(key(n), one.clone());
            // Insert some keys again: the queue keeps only their last insertion.
            if n % 7 == 0 {
                map.insert(key(n), one.clone());
            }
            assert!(map.bytes <= RENDER_CACHE_BYTES);
        }
        assert_eq!(map.map.len(), fits);
        assert_eq!(map.bytes, fits * one.bytes());
        assert!(
            map.map.contains_key(&key(3 * fits - 1)) && !map.map.contains_key(&key(0)),
            "the oldest went"
        );
        assert!(map.order.len() <= 2 * map.map.len() + 1024);
    }
}
