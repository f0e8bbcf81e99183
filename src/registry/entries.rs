//! The writer's map of the view: every entry by its record key, the key read from the entry itself,
//! and each publisher's entries by agent id.
//!
//! A `BTreeMap<RecordKey, Arc<Entry>>` kept a second copy of every key (a PeerId of 80 bytes and the
//! agent id's text) beside the entry that already holds it: about 130 bytes a record, 6.5 MB at 50,000.
//!
//! A heartbeat names one publisher's agents, which the key order scatters over the whole view. Each
//! snapshot therefore carries every publisher's entries as a list of their own ([`Publishers`]), kept
//! here as the view changes: a new snapshot copies only the lists of the publishers whose entries
//! changed since the last one, and shares the others. Grouping the whole view anew for each snapshot
//! cost O(view) every time a node catching up applied a batch.

use std::borrow::Borrow;
use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

use libp2p::PeerId;

use super::{Entry, RecordKey};

/// Each publisher's entries in agent id order, as a snapshot holds them.
pub type Publishers = HashMap<PeerId, Arc<[Arc<Entry>]>>;

/// An entry ordered, compared and looked up by its agent id (within one publisher's entries).
#[derive(Debug, Clone)]
struct ByAgent(Arc<Entry>);

impl Borrow<str> for ByAgent {
    fn borrow(&self) -> &str {
        &self.0.key.agent_id
    }
}

impl PartialEq for ByAgent {
    fn eq(&self, other: &Self) -> bool {
        self.0.key.agent_id == other.0.key.agent_id
    }
}

impl Eq for ByAgent {}

impl PartialOrd for ByAgent {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for ByAgent {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.0.key.agent_id.cmp(&other.0.key.agent_id)
    }
}

/// One publisher's entries, with the list the last snapshot was given while it is still current.
#[derive(Debug, Default)]
struct Published {
    entries: BTreeSet<ByAgent>,
    shared: Option<Arc<[Arc<Entry>]>>,
}

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

/// Entries by record key, in key order (the view's discovery order), and by publisher.
#[derive(Debug, Default)]
pub struct Entries {
    all: BTreeSet<ByKey>,
    publishers: HashMap<PeerId, Published>,
}

impl Entries {
    pub fn get(&self, key: &RecordKey) -> Option<&Arc<Entry>> {
        self.all.get(key).map(|e| &e.0)
    }

    /// Puts `entry` in, in place of any entry of the same key.
    pub fn insert(&mut self, entry: Arc<Entry>) {
        let published = self.publishers.entry(entry.key.publisher).or_default();
        published.entries.replace(ByAgent(entry.clone()));
        published.shared = None;
        self.all.replace(ByKey(entry));
    }

    pub fn remove(&mut self, key: &RecordKey) -> Option<Arc<Entry>> {
        let removed = self.all.take(key).map(|e| e.0)?;
        if let Some(published) = self.publishers.get_mut(&key.publisher) {
            published.entries.remove(key.agent_id.as_str());
            published.shared = None;
            if published.entries.is_empty() {
                self.publishers.remove(&key.publisher);
            }
        }
        Some(removed)
    }

    /// Every entry, in key order.
    pub fn values(&self) -> impl Iterator<Item = &Arc<Entry>> {
        self.all.iter().map(|e| &e.0)
    }

    /// Every publisher's entries for a new snapshot: the lists of publishers unchanged since the last
    /// call are shared with the snapshots that hold them, the others are copied anew (O(their
    /// entries)).
    pub fn publishers(&mut self) -> Publishers {
        self.publishers
            .iter_mut()
            .map(|(publisher, published)| {
                let list = published
                    .shared
                    .get_or_insert_with(|| published.entries.iter().map(|e| e.0.clone()).collect());
                (*publisher, list.clone())
            })
            .collect()
    }
}

/// Every publisher's entries in `entries`, grouped anew (O(view)): for a view not kept in [`Entries`].
pub fn group(entries: &[Arc<Entry>]) -> Publishers {
    let mut lists: HashMap<PeerId, Vec<Arc<Entry>>> = HashMap::new();
    for entry in entries {
        lists.entry(entry.key.publisher).or_default().push(entry.clone());
    }
    lists
        .into_iter()
        .map(|(publisher, mut list)| {
            list.sort_by(|a, b| a.key.agent_id.cmp(&b.key.agent_id));
            (publisher, list.into())
        })
        .collect()
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
        assert!(map.get(&key("b", q)).is_none());
        let mut keys: Vec<RecordKey> = map.values().map(|e| e.key.clone()).collect();
        let listed = keys.clone();
        keys.sort();
        assert_eq!(listed, keys);
        assert_eq!(map.remove(&key("b", p)).map(|e| e.seq), Some(1));
        assert!(map.remove(&key("b", p)).is_none());
        assert_eq!(map.values().count(), 3);
    }

    #[test]
    fn each_publisher_s_list_follows_its_entries_and_unchanged_lists_are_shared() {
        let (p, q) = (libp2p::PeerId::random(), libp2p::PeerId::random());
        let mut map = Entries::default();
        for (id, publisher) in [("c", p), ("a", q), ("a", p), ("b", p)] {
            map.insert(entry(id, publisher, 1));
        }
        let listed = |lists: &Publishers, publisher| -> Vec<(String, u64)> {
            lists
                .get(&publisher)
                .map_or_else(Vec::new, |l| l.iter().map(|e| (e.key.agent_id.clone(), e.seq)).collect())
        };
        let first = map.publishers();
        let ids = |v: &[(&str, u64)]| v.iter().map(|(id, seq)| (id.to_string(), *seq)).collect::<Vec<_>>();
        assert_eq!(listed(&first, p), ids(&[("a", 1), ("b", 1), ("c", 1)]), "in agent id order");
        assert_eq!(listed(&first, q), ids(&[("a", 1)]));

        // A new version of one of p's agents: p's list is made anew, q's is the very same list.
        map.insert(entry("b", p, 2));
        let second = map.publishers();
        assert_eq!(listed(&second, p), ids(&[("a", 1), ("b", 2), ("c", 1)]));
        assert!(Arc::ptr_eq(&first[&q], &second[&q]), "an unchanged publisher's list is shared");
        assert!(!Arc::ptr_eq(&first[&p], &second[&p]));
        assert_eq!(
            listed(&first, p),
            ids(&[("a", 1), ("b", 1), ("c", 1)]),
            "an older snapshot keeps its own"
        );

        // Removing q's last entry forgets q; removing one of p's takes it out of p's list.
        let key = |id: &str, publisher| RecordKey { agent_id: id.to_owned(), publisher };
        map.remove(&key("a", q));
        map.remove(&key("c", p));
        let third = map.publishers();
        assert!(!third.contains_key(&q));
        assert_eq!(listed(&third, p), ids(&[("a", 1), ("b", 2)]));

        // The same lists as grouping the whole view anew.
        let all: Vec<Arc<Entry>> = map.values().cloned().collect();
        let grouped = group(&all);
        assert_eq!(listed(&grouped, p), listed(&third, p));
        assert_eq!(grouped.len(), third.len());
    }
}
