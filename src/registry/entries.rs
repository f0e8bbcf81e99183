//! The writer's map of the view: every entry by its record key, the key read from the entry itself.
//!
//! A `BTreeMap<RecordKey, Arc<Entry>>` kept a second copy of every key (a PeerId of 80 bytes and the
//! agent id's text) beside the entry that already holds it: about 130 bytes a record, 6.5 MB at 50,000.

use std::borrow::Borrow;
use std::collections::BTreeSet;
use std::sync::Arc;

use super::{Entry, RecordKey};

/// An entry ordered, compared and looked up by its key.
#[derive(Debug, Clone)]
struct ByKey(Arc<Entry>);

impl Borrow<RecordKey> for ByKey {
    fn borrow(&self) -> &RecordKey {
        &self.0.key
    }
}

impl PartialEq for ByKey {
    fn eq(&self, other: &Self) -> bool {
        self.0.key == other.0.key
    }
}

impl Eq for ByKey {}

impl PartialOrd for ByKey {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for ByKey {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.0.key.cmp(&other.0.key)
    }
}

/// Entries by record key, in key order (the view's discovery order).
#[derive(Debug, Default)]
pub struct Entries(BTreeSet<ByKey>);

impl Entries {
    pub fn get(&self, key: &RecordKey) -> Option<&Arc<Entry>> {
        self.0.get(key).map(|e| &e.0)
    }

    pub fn contains_key(&self, key: &RecordKey) -> bool {
        self.0.contains(key)
    }

    /// Puts `entry` in, in place of any entry of the same key.
    pub fn insert(&mut self, entry: Arc<Entry>) {
        self.0.replace(ByKey(entry));
    }

    pub fn remove(&mut self, key: &RecordKey) -> Option<Arc<Entry>> {
        self.0.take(key).map(|e| e.0)
    }

    /// Every entry, in key order.
    pub fn values(&self) -> impl Iterator<Item = &Arc<Entry>> {
        self.0.iter().map(|e| &e.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::card::AgentCard;
    use crate::registry::Origin;

    fn entry(agent_id: &str, publisher: libp2p::PeerId, seq: u64) -> Arc<Entry> {
        let card =
            AgentCard::from_json(format!(r#"{{"agent_id":"{agent_id}","base_url":"http://x"}}"#).as_bytes())
                .unwrap();
        let key = RecordKey { agent_id: agent_id.to_owned(), publisher };
        Arc::new(Entry::new(key, seq, &card, Origin::Remote, 0))
    }

    #[test]
    fn entries_are_found_replaced_and_removed_by_key_and_listed_in_key_order() {
        let (p, q) = (libp2p::PeerId::random(), libp2p::PeerId::random());
        let mut map = Entries::default();
        for (id, publisher) in [("b", p), ("a", q), ("a", p), ("c", q)] {
            map.insert(entry(id, publisher, 1));
        }
        assert_eq!(map.values().count(), 4);
        map.insert(entry("a", p, 2));
        assert_eq!(map.values().count(), 4, "the same key replaces");
        let key = |id: &str, publisher| RecordKey { agent_id: id.to_owned(), publisher };
        assert_eq!(map.get(&key("a", p)).map(|e| e.seq), Some(2));
        assert_eq!(map.get(&key("a", q)).map(|e| e.seq), Some(1));
        assert!(!map.contains_key(&key("b", q)));
        let mut keys: Vec<RecordKey> = map.values().map(|e| e.key.clone()).collect();
        let listed = keys.clone();
        keys.sort();
        assert_eq!(listed, keys);
        assert_eq!(map.remove(&key("b", p)).map(|e| e.seq), Some(1));
        assert!(map.remove(&key("b", p)).is_none());
        assert_eq!(map.values().count(), 3);
    }
}
