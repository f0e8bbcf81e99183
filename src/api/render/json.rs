//! `format=json`: the AgentField discovery response, plus mesh facts as extra keys per agent.

use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

use serde::Serialize;
use serde_json::value::RawValue;

use super::{reasoner_target, skill_target};
use crate::card::held::{CapRef, CardRef, MetadataRef};
use crate::clock::rfc3339;
use crate::defaults::RENDER_CACHE_BYTES;
use crate::query::{Hit, Query, Selection};
use crate::registry::health::Millis;
use crate::registry::{Entry, RecordKey};

#[derive(Serialize)]
struct Response<'a> {
    discovered_at: String,
    total_agents: usize,
    total_reasoners: usize,
    total_skills: usize,
    pagination: Pagination,
    capabilities: Vec<Agent<'a>>,
}

#[derive(Serialize)]
struct Pagination {
    limit: usize,
    offset: usize,
    has_more: bool,
}

#[derive(Serialize)]
struct Agent<'a> {
    agent_id: &'a str,
    /// AgentField's group: the card's `group_id`, else the agent id.
    group_id: &'a str,
    base_url: &'a str,
    version: &'a str,
    health_status: &'static str,
    /// Whether it takes new work: `ready`, `busy` or `draining`, as it reports.
    lifecycle: &'static str,
    deployment_type: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    category: Option<&'a str>,
    last_heartbeat: String,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    metadata: &'a MetadataRef<'a>,
    reasoners: Vec<Cap<'a>>,
    skills: Vec<Cap<'a>>,
    /// PeerId of the node that signed and published the card.
    publisher: &'a str,
    /// Whether the agent is registered with this node.
    local: bool,
    seq: u64,
}

#[derive(Serialize)]
struct Cap<'a> {
    id: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    description: Option<&'a str>,
    tags: &'a [Cow<'a, str>],
    #[serde(skip_serializing_if = "Option::is_none")]
    input_schema: Option<&'a RawValue>,
    #[serde(skip_serializing_if = "Option::is_none")]
    output_schema: Option<&'a RawValue>,
    #[serde(skip_serializing_if = "Option::is_none")]
    examples: Option<&'a [&'a RawValue]>,
    #[serde(skip_serializing_if = "Option::is_none")]
    category: Option<&'a str>,
    #[serde(skip_serializing_if = "<[_]>::is_empty")]
    requires: &'a [Cow<'a, str>],
    #[serde(skip_serializing_if = "<[_]>::is_empty")]
    required_secrets: &'a [Cow<'a, str>],
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    has_side_effects: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    confidence_hint: Option<f64>,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    metadata: &'a MetadataRef<'a>,
    invocation_target: String,
}

/// Which optional keys a capability carries; skills never carry output schemas or examples.
#[derive(Clone, Copy)]
struct Include {
    descriptions: bool,
    input_schema: bool,
    output_schema: bool,
    examples: bool,
}

fn cap<'a>(c: &'a CapRef<'a>, card: &'a CardRef<'a>, target: String, inc: Include) -> Cap<'a> {
    Cap {
        category: c.category_in(card),
        requires: &c.requires,
        required_secrets: &c.required_secrets,
        has_side_effects: c.has_side_effects,
        confidence_hint: c.confidence_hint,
        metadata: &c.metadata,
        id: &c.id,
        description: c.description.as_deref().filter(|_| inc.descriptions),
        tags: &c.tags,
        input_schema: c.input_schema.filter(|_| inc.input_schema),
        output_schema: c.output_schema.filter(|_| inc.output_schema),
        examples: Some(c.examples.as_slice()).filter(|e| inc.examples && !e.is_empty()),
        invocation_target: target,
    }
}

fn agent<'a>(hit: &'a Hit<'a>, card: &'a CardRef<'a>, q: &Query) -> Agent<'a> {
    let e = hit.entry;
    let for_reasoners = Include {
        descriptions: q.include_descriptions,
        input_schema: q.include_input_schema,
        output_schema: q.include_output_schema,
        examples: q.include_examples,
    };
    let for_skills = Include { output_schema: false, examples: false, ..for_reasoners };
    let pick = |list: &'a [CapRef<'a>], at: &'a [usize], target: fn(&str, &str) -> String, inc: Include| {
        at.iter()
            .filter_map(|&i| list.get(i))
            .map(|c| cap(c, card, target(&card.agent_id, &c.id), inc))
            .collect::<Vec<_>>()
    };
    Agent {
        agent_id: &card.agent_id,
        group_id: card.group(),
        base_url: &card.base_url,
        version: &card.version,
        health_status: hit.health.as_str(),
        lifecycle: e.lifecycle().as_str(),
        metadata: &card.metadata,
        deployment_type: &card.deployment_type,
        category: card.category.as_deref(),
        last_heartbeat: rfc3339(hit.last_heartbeat.unwrap_or(e.updated_at)),
        reasoners: pick(&card.reasoners, &hit.reasoners, reasoner_target, for_reasoners),
        skills: pick(&card.skills, &hit.skills, skill_target, for_skills),
        publisher: &e.publisher_name,
        local: e.is_local(),
        seq: e.seq,
    }
}

pub fn render(sel: &Selection<'_>, q: &Query, now: Millis) -> Vec<u8> {
    let views: Vec<CardRef<'_>> = sel.page.iter().map(|h| h.entry.card.view()).collect();
    let response = Response {
        discovered_at: rfc3339(now),
        total_agents: sel.total_agents,
        total_reasoners: sel.total_reasoners,
        total_skills: sel.total_skills,
        pagination: Pagination { limit: q.limit, offset: q.offset, has_more: sel.has_more },
        capabilities: sel.page.iter().zip(&views).map(|(h, v)| agent(h, v, q)).collect(),
    };
    // Only strings, numbers and already-valid raw JSON: serialisation cannot fail.
    serde_json::to_vec(&response).unwrap_or_default()
}

/// Which optional keys the capabilities of a response carry, as a cache key.
fn include_bits(q: &Query) -> u8 {
    u8::from(q.include_descriptions)
        | u8::from(q.include_input_schema) << 1
        | u8::from(q.include_output_schema) << 2
        | u8::from(q.include_examples) << 3
}

/// One record rendered once for a set of include flags: the bytes of its agent object around the
/// values that change from one request to the next (health, lifecycle, last heartbeat), and each
/// capability's object. A response is then mostly concatenation.
#[derive(Debug)]
pub struct Prepared {
    /// The record version it was made from: a record's content is fixed by its key and seq.
    key: RecordKey,
    seq: u64,
    /// `{"agent_id":…,"health_status":`
    head: Box<[u8]>,
    /// `,"deployment_type":…,"last_heartbeat":`
    middle: Box<[u8]>,
    /// `,"metadata":…,"reasoners":[`
    before_caps: Box<[u8]>,
    /// `],"publisher":…}`
    tail: Box<[u8]>,
    reasoners: Box<[Box<[u8]>]>,
    skills: Box<[Box<[u8]>]>,
}

impl Prepared {
    fn new(entry: &Entry, q: &Query) -> Prepared {
        let view = entry.card.view();
        let hit = Hit {
            entry,
            health: crate::registry::health::Health::Unknown,
            last_heartbeat: None,
            reasoners: (0..view.reasoners.len()).collect(),
            skills: (0..view.skills.len()).collect(),
        };
        let agent = agent(&hit, &view, q);
        let json = |value: &dyn erased::Json| value.bytes();
        let mut head = br#"{"agent_id":"#.to_vec();
        for (key, value) in [
            ("", &agent.agent_id as &dyn erased::Json),
            ("group_id", &agent.group_id),
            ("base_url", &agent.base_url),
            ("version", &agent.version),
        ] {
            if !key.is_empty() {
                head.extend_from_slice(format!(",\"{key}\":").as_bytes());
            }
            head.extend_from_slice(&json(value));
        }
        head.extend_from_slice(br#","health_status":"#);
        let mut middle = br#","deployment_type":"#.to_vec();
        middle.extend_from_slice(&json(&agent.deployment_type));
        if let Some(category) = &agent.category {
            middle.extend_from_slice(br#","category":"#);
            middle.extend_from_slice(&json(category));
        }
        middle.extend_from_slice(br#","last_heartbeat":"#);
        let mut before_caps = Vec::new();
        if !agent.metadata.is_empty() {
            before_caps.extend_from_slice(br#","metadata":"#);
            before_caps.extend_from_slice(&json(&agent.metadata));
        }
        before_caps.extend_from_slice(br#","reasoners":["#);
        let mut tail = br#"],"publisher":"#.to_vec();
        tail.extend_from_slice(&json(&agent.publisher));
        tail.extend_from_slice(format!(",\"local\":{},\"seq\":{}}}", agent.local, agent.seq).as_bytes());
        let caps = |list: &[Cap<'_>]| list.iter().map(|c| json(c).into_boxed_slice()).collect();
        Prepared {
            key: entry.key.clone(),
            seq: entry.seq,
            head: head.into(),
            middle: middle.into(),
            before_caps: before_caps.into(),
            tail: tail.into(),
            reasoners: caps(&agent.reasoners),
            skills: caps(&agent.skills),
        }
    }

    fn bytes(&self) -> usize {
        let caps: usize = self.reasoners.iter().chain(self.skills.iter()).map(|c| c.len() + 32).sum();
        self.head.len() + self.middle.len() + self.before_caps.len() + self.tail.len() + caps + 160
    }

    /// Appends the agent object of `hit` (its record is this one).
    fn write(&self, hit: &Hit<'_>, out: &mut Vec<u8>) {
        let json = |out: &mut Vec<u8>, s: &str| {
            // Health, lifecycle and a timestamp: plain ASCII, nothing to escape.
            out.push(b'"');
            out.extend_from_slice(s.as_bytes());
            out.push(b'"');
        };
        out.extend_from_slice(&self.head);
        json(out, hit.health.as_str());
        out.extend_from_slice(br#","lifecycle":"#);
        json(out, hit.entry.lifecycle().as_str());
        out.extend_from_slice(&self.middle);
        json(out, &rfc3339(hit.last_heartbeat.unwrap_or(hit.entry.updated_at)));
        out.extend_from_slice(&self.before_caps);
        let caps = |out: &mut Vec<u8>, list: &[Box<[u8]>], at: &[usize]| {
            for (n, cap) in at.iter().filter_map(|&i| list.get(i)).enumerate() {
                if n > 0 {
                    out.push(b',');
                }
                out.extend_from_slice(cap);
            }
        };
        caps(out, &self.reasoners, &hit.reasoners);
        out.extend_from_slice(br#"],"skills":["#);
        caps(out, &self.skills, &hit.skills);
        out.extend_from_slice(&self.tail);
    }
}

/// Serialises one value to compact JSON, as the response's serialiser would inside the response.
mod erased {
    pub trait Json {
        fn bytes(&self) -> Vec<u8>;
    }

    impl<T: serde::Serialize + ?Sized> Json for T {
        fn bytes(&self) -> Vec<u8> {
            // Strings, maps of strings and valid raw JSON: serialisation cannot fail.
            serde_json::to_vec(self).unwrap_or_default()
        }
    }
}

/// Hashes a record's address (already unique per live record): one multiplication, not SipHash.
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

type ByAddress = HashMap<(usize, u8), (Arc<Prepared>, u64), std::hash::BuildHasherDefault<AddressHasher>>;

#[derive(Default)]
struct PreparedMap {
    map: ByAddress,
    /// Keys in the order they were inserted, with the insertion number: the oldest go first.
    order: std::collections::VecDeque<((usize, u8), u64)>,
    inserted: u64,
    bytes: usize,
}

impl PreparedMap {
    /// Keeps `prepared` under `key`, dropping the oldest records while the bound would be passed.
    fn insert(&mut self, key: (usize, u8), prepared: Arc<Prepared>) {
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

/// Records rendered for the include flags they were asked with, bounded by `RENDER_CACHE_BYTES`:
/// a page of records seen before is rendered by copying bytes.
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
    /// made outside it and then kept.
    fn page(&self, page: &[Hit<'_>], q: &Query) -> Vec<Arc<Prepared>> {
        let bits = include_bits(q);
        // Looked up by the record's address, and taken only when it is of the same record version
        // (an address can be reused by another record once the first is gone).
        let key = |entry: &Entry| (entry as *const Entry as usize, bits);
        let mut found: Vec<Option<Arc<Prepared>>> = match self.state.lock() {
            Ok(state) => page
                .iter()
                .map(|h| {
                    let held = state.map.get(&key(h.entry)).map(|(p, _)| p);
                    held.filter(|p| p.seq == h.entry.seq && p.key == h.entry.key).cloned()
                })
                .collect(),
            Err(_) => vec![None; page.len()],
        };
        let mut made = Vec::new();
        for (slot, hit) in found.iter_mut().zip(page) {
            if slot.is_none() {
                let prepared = Arc::new(Prepared::new(hit.entry, q));
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

/// The same bytes as [`render`], from records prepared once per set of include flags.
pub fn render_prepared(sel: &Selection<'_>, q: &Query, now: Millis, cache: &PreparedCache) -> Vec<u8> {
    let prepared = cache.page(&sel.page, q);
    let mut out = Vec::with_capacity(256 + prepared.iter().map(|p| p.bytes()).sum::<usize>());
    out.extend_from_slice(br#"{"discovered_at":"#);
    out.extend_from_slice(&erased::Json::bytes(&rfc3339(now)));
    out.extend_from_slice(
        format!(
            ",\"total_agents\":{},\"total_reasoners\":{},\"total_skills\":{},\"pagination\":{{\"limit\":{},\"offset\":{},\"has_more\":{}}},\"capabilities\":[",
            sel.total_agents, sel.total_reasoners, sel.total_skills, q.limit, q.offset, sel.has_more
        )
        .as_bytes(),
    );
    for (n, (hit, p)) in sel.page.iter().zip(&prepared).enumerate() {
        if n > 0 {
            out.push(b',');
        }
        p.write(hit, &mut out);
    }
    out.extend_from_slice(b"]}");
    out
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::card::AgentCard;
    use crate::query::{select, Query};
    use crate::registry::health::{Reported, Thresholds};
    use crate::registry::{Liveness, Origin};

    fn entries() -> Vec<Arc<Entry>> {
        let publisher = libp2p::PeerId::random();
        let cards = [
            serde_json::json!({"agent_id": "a1", "base_url": "http://h:1", "version": "1.0.0",
                "description": "say \"hi\" \u{e9}", "category": "ops", "group_id": "g",
                "metadata": {"owner_team": "pay\"ments", "tier": "1"},
                "reasoners": [
                    {"id": "r1", "description": "one\nline", "tags": ["t1", "t\u{e9}"],
                     "input_schema": {"type": "object", "properties": {"q": {"type": "string"}}},
                     "output_schema": {"type": "string"}, "examples": [{"q": "x"}],
                     "category": "math", "requires": ["b:r"], "has_side_effects": true,
                     "confidence_hint": 0.5, "metadata": {"k": "v"}},
                    {"id": "r2"}],
                "skills": [{"id": "s1", "description": "d", "tags": ["t1"], "input_schema": {"type": "object"},
                            "required_secrets": ["KEY"]}]}),
            serde_json::json!({"agent_id": "a2", "base_url": "http://h:2", "skills": [{"id": "s"}]}),
            serde_json::json!({"agent_id": "a3", "base_url": "http://h:3", "reasoners": [{"id": "x"}]}),
        ];
        let mut out: Vec<Arc<Entry>> = cards
            .iter()
            .enumerate()
            .map(|(i, json)| {
                let card = AgentCard::from_json(json.to_string().as_bytes()).unwrap();
                let key = RecordKey { agent_id: card.agent_id.clone(), publisher };
                let origin = if i == 0 { Origin::Local(Liveness::Agent) } else { Origin::Remote };
                let entry = Entry::new(key, 7 + i as u64, &card, origin, 1_000);
                if i < 2 {
                    entry.beat(5_000, if i == 0 { Reported::Busy } else { Reported::Degraded });
                }
                Arc::new(entry)
            })
            .collect();
        out.sort_by(|a, b| a.key.cmp(&b.key));
        out
    }

    #[test]
    fn prepared_records_render_the_same_bytes_as_the_serialiser() {
        let entries = entries();
        let cache = PreparedCache::default();
        for raw in [
            "",
            "include_input_schema=true&include_output_schema=true&include_examples=true",
            "include_descriptions=false",
            "reasoner=r1",
            "skill=s*&tags=t1",
            "limit=1&offset=1",
            "limit=0",
            "include_examples=true&include_descriptions=false&tags=t%C3%A9",
        ] {
            let q = Query::parse(raw).unwrap();
            for now in [6_000, 30_000] {
                let sel = select(&entries, &q, now, &Thresholds::default());
                let want = render(&sel, &q, now);
                // Twice: prepared, then from the cache.
                assert_eq!(
                    String::from_utf8(render_prepared(&sel, &q, now, &cache)).unwrap(),
                    String::from_utf8(want.clone()).unwrap(),
                    "{raw}"
                );
                assert_eq!(render_prepared(&sel, &q, now, &cache), want, "{raw}, cached");
            }
        }
        assert!(cache.bytes() > 0);
    }

    #[test]
    fn a_new_version_of_a_record_is_never_served_from_an_older_one() {
        let cache = PreparedCache::default();
        let q = Query::default();
        let publisher = libp2p::PeerId::random();
        let key = RecordKey { agent_id: "a".into(), publisher };
        let card = |url: &str| {
            let json = serde_json::json!({"agent_id": "a", "base_url": url, "skills": [{"id": "s"}]});
            AgentCard::from_json(json.to_string().as_bytes()).unwrap()
        };
        let old = Entry::new(key.clone(), 1, &card("http://old"), Origin::Remote, 0);
        let hit = |entry| Hit {
            entry,
            health: crate::registry::health::Health::Unknown,
            last_heartbeat: None,
            reasoners: vec![],
            skills: vec![],
        };
        let first = cache.page(&[hit(&old)], &q).remove(0);
        assert!(String::from_utf8_lossy(&first.head).contains("http://old"));
        // Another version of the record at the address the old one had (a freed allocation reused).
        let new = Entry::new(key, 2, &card("http://new"), Origin::Remote, 0);
        let address = (&new as *const Entry as usize, include_bits(&q));
        cache.state.lock().unwrap().insert(address, first);
        let served = cache.page(&[hit(&new)], &q).remove(0);
        assert!(String::from_utf8_lossy(&served.head).contains("http://new"));
        assert_eq!(served.seq, 2);
    }

    #[test]
    fn the_prepared_records_stay_within_their_bound_oldest_out_first() {
        let entries = entries();
        let q = Query::default();
        let one = Arc::new(Prepared::new(&entries[0], &q));
        let mut map = PreparedMap::default();
        let fits = RENDER_CACHE_BYTES / one.bytes();
        for n in 0..3 * fits {
            map.insert((n, 0), one.clone());
            // Insert some keys again: the queue keeps only their last insertion.
            if n % 7 == 0 {
                map.insert((n, 0), one.clone());
            }
            assert!(map.bytes <= RENDER_CACHE_BYTES);
        }
        assert_eq!(map.map.len(), fits);
        assert_eq!(map.bytes, fits * one.bytes());
        assert!(
            map.map.contains_key(&(3 * fits - 1, 0)) && !map.map.contains_key(&(0, 0)),
            "the oldest went"
        );
        assert!(map.order.len() <= 2 * map.map.len() + 1024);
    }
}
