//! What the registry does for the mesh: it applies what [`Records`]
//! decides about remote records (heartbeats, lists, leaves, declarations, eviction) to the view and
//! the store.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

use libp2p::identity::PeerId;

use super::health::{Health, Millis, Reported};
use super::{Entry, Live, Origin, RecordKey, Registry, RegistryError};
use crate::defaults::{MAX_HEARTBEATS_ANSWER, MAX_HEARTBEATS_ANSWER_BYTES, MAX_TRACKED_PUBLISHERS};
use crate::proto::records::{self, CarriedList, Records};
use crate::wire::{HeartbeatAgent, HeartbeatBody};

pub use crate::proto::records::{Limit, Limits, SignedList};

/// The record rules' state, beside the view, in memory only.
pub(super) struct RemoteState(Mutex<Records>);

impl RemoteState {
    pub(super) fn new(me: PeerId, limits: Limits) -> Self {
        Self(Mutex::new(Records::new(me, limits)))
    }

    pub(super) fn lock(&self) -> MutexGuard<'_, Records> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// The last walk of each publisher's agent list along its records in the view (see
/// [`Registry::remote_heartbeat`]), kept while neither changes: a publisher at rest sends the same
/// list (by digest) every beat, and its records change seldom, so a beat then touches the liveness of
/// the records the list named last time, instead of finding each record by its agent id. At most
/// [`MAX_TRACKED_PUBLISHERS`] walks are kept; a walk that found agents missing is not kept (their cards
/// are fetched, and the publisher's records change).
#[derive(Default)]
pub(super) struct Walks(Mutex<HashMap<PeerId, Walk>>);

/// One walk: the list and the publisher's records it was made with (weak: a walk keeps neither alive,
/// and a dead one's allocation is never reused while held, so identity by address is sound), and what
/// it found.
struct Walk {
    list: Weak<Vec<HeartbeatAgent>>,
    records: Weak<[Arc<Entry>]>,
    refresh: Listed,
}

/// The liveness of each remote record a walk found named by the list, with the state the list gives
/// it: a beat by the walk touches these alone, not the entries around them.
type Listed = Arc<[(Arc<Live>, Reported)]>;

impl Walks {
    fn lock(&self) -> MutexGuard<'_, HashMap<PeerId, Walk>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The walk of `list` along `records`, if the last walk of `publisher` was made with both.
    fn find(
        &self,
        publisher: &PeerId,
        list: &Arc<Vec<HeartbeatAgent>>,
        records: &Arc<[Arc<Entry>]>,
    ) -> Option<Listed> {
        let walks = self.lock();
        let walk = walks.get(publisher)?;
        let same = std::ptr::eq(walk.list.as_ptr(), Arc::as_ptr(list))
            && std::ptr::eq(walk.records.as_ptr().cast::<()>(), Arc::as_ptr(records).cast::<()>());
        same.then(|| walk.refresh.clone())
    }

    fn keep(&self, publisher: PeerId, walk: Walk) {
        let mut walks = self.lock();
        if walks.len() >= MAX_TRACKED_PUBLISHERS && !walks.contains_key(&publisher) {
            walks.clear();
        }
        walks.insert(publisher, walk);
    }

    fn forget(&self, publisher: &PeerId) {
        self.lock().remove(publisher);
    }
}

/// What a remote heartbeat did.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct HeartbeatOutcome {
    /// Agents it refreshed.
    pub refreshed: usize,
    /// Agents it names at a seq this node lacks, with that seq: fetch their cards from the sender.
    pub missing: Vec<(String, u64)>,
    /// An older or repeated heartbeat: ignored.
    pub replayed: bool,
    /// A digest-only heartbeat whose list this node does not hold: fetch it from the sender.
    pub unknown_list: bool,
    /// An older heartbeat that brought the list of the newest digest (fetched after `unknown_list`).
    pub list_installed: bool,
}

impl Registry {
    /// Applies a verified heartbeat of `publisher`, received at `now` (this node's clock: liveness never
    /// depends on the publisher's clock, only the ordering of its heartbeats does). `signed` is the
    /// message as received, kept when it carries a list.
    ///
    /// An older heartbeat is a replay, except one that carries the list of the newest digest heard (the
    /// answer to a list fetch): that list is installed, and its agents count as heard when the newest
    /// heartbeat arrived, never later, so replaying it cannot keep a silent publisher alive.
    pub fn remote_heartbeat(
        &self,
        publisher: PeerId,
        body: &HeartbeatBody,
        signed: &[u8],
        now: Millis,
    ) -> HeartbeatOutcome {
        let signed = Arc::<[u8]>::from(signed);
        let carried = body.agents.as_ref().map(|agents| (agents.clone(), vec![signed.clone()]));
        self.heard(publisher, Some((body.sent_at, signed)), body.digest, carried, now)
    }

    /// The newest heartbeat of every remote publisher heard within `degraded_after` and not declared
    /// down since, as signed, each followed by the signed messages that carried its current agent list
    /// (the most recently heard first; at most `MAX_HEARTBEATS_ANSWER` heartbeats and
    /// `MAX_HEARTBEATS_ANSWER_BYTES` in all, a list that does not fit left out): what a node that just
    /// joined is told of who is alive and what each says of its agents, without a `List` question per
    /// publisher.
    pub fn newest_heartbeats(&self, now: Millis) -> Vec<Arc<[u8]>> {
        let since = now.saturating_sub(self.thresholds.degraded_after.as_millis() as u64);
        let records = self.remote.lock();
        let mut answer = Vec::new();
        let mut bytes = 0;
        for alive in records.newest_heartbeats(since, MAX_HEARTBEATS_ANSWER) {
            let Some(signed) = alive.signed else { continue };
            if bytes + signed.len() > MAX_HEARTBEATS_ANSWER_BYTES {
                break;
            }
            bytes += signed.len();
            // The heartbeat first: an older one that carried the list of its digest is then taken
            // as that list (`Records::heard`).
            let carriers = alive.list.iter().flat_map(|list| records::after(&signed, list));
            let size: usize = carriers.clone().map(|m| m.len()).sum();
            answer.push(signed.clone());
            if bytes + size <= MAX_HEARTBEATS_ANSWER_BYTES {
                bytes += size;
                answer.extend(carriers.cloned());
            }
        }
        answer
    }

    /// Applies a publisher's long agent list, reassembled from its signed chunks (the answer to a list
    /// fetch): installed when it is the list of the newest heartbeat heard, like a fetched heartbeat.
    pub fn remote_list(
        &self,
        publisher: PeerId,
        digest: u64,
        agents: Vec<HeartbeatAgent>,
        chunks: Vec<Arc<[u8]>>,
        now: Millis,
    ) -> HeartbeatOutcome {
        self.heard(publisher, None, digest, Some((agents, chunks)), now)
    }

    /// A heartbeat (`sent`: when, and the signed message) or a fetched list (`None`) of `publisher`,
    /// naming list `digest`, and carrying the list itself when `carried`: [`Records::heard`] decides,
    /// the view's entries beat.
    fn heard(
        &self,
        publisher: PeerId,
        sent: Option<(u64, Arc<[u8]>)>,
        digest: u64,
        carried: Option<CarriedList>,
        now: Millis,
    ) -> HeartbeatOutcome {
        let mut outcome = HeartbeatOutcome::default();
        let heard = {
            let mut records = self.remote.lock();
            let heard = records.heard(publisher, sent.as_ref().map(|(at, _)| *at), digest, carried, now);
            if let (false, Some((sent_at, signed))) = (heard.replayed, sent) {
                records.keep_signed(&publisher, sent_at, signed);
            }
            heard
        };
        outcome.replayed = heard.replayed;
        outcome.list_installed = heard.list_installed;
        outcome.unknown_list = heard.unknown_list;
        if heard.replayed {
            return outcome;
        }
        let snapshot = self.snapshot();
        let records = snapshot.publisher_records(&publisher);
        // A list heard before, along the same records: the records it named last time beat.
        if let (Some(list), Some(records)) = (&heard.list, records) {
            if let Some(refresh) = self.walks.find(&publisher, list, records) {
                let mut changed = false;
                for (live, reported) in refresh.iter() {
                    changed |= live.beat_changes_health(heard.at, *reported, &self.thresholds, false);
                }
                outcome.refreshed = refresh.len();
                if changed {
                    self.health_epoch.fetch_add(1, Ordering::AcqRel);
                }
                return outcome;
            }
        }
        // The publisher's records held here, in agent id order. A publisher lists its agents in that
        // order too, so one walk along both finds them all; an agent listed out of order is looked up
        // by binary search instead (nothing relies on the order).
        let held: &[Arc<Entry>] = records.map_or(&[], |r| &r[..]);
        // `next`: every record before it sorts before the agent last found by walking.
        let mut next = 0;
        let find = |agent_id: &str| {
            let behind = next > 0 && held[next - 1].key.agent_id.as_str() >= agent_id;
            let found = if behind {
                held.binary_search_by(|e| e.key.agent_id.as_str().cmp(agent_id)).ok()
            } else {
                while held.get(next).is_some_and(|e| e.key.agent_id.as_str() < agent_id) {
                    next += 1;
                }
                held.get(next).filter(|e| e.key.agent_id == agent_id).map(|_| next)
            };
            found.map(|i| (i, held[i].seq))
        };
        let (list, kept) = match heard.list {
            Some(list) => (list, true),
            // A list this node missed: the publisher is alive, so its agents held here stay fresh with
            // the states last heard until the fetched list arrives (a declaration of the publisher down,
            // which this newer heartbeat refutes, is not one of them).
            None => (
                Arc::new(
                    held.iter()
                        .map(|e| HeartbeatAgent {
                            agent_id: e.key.agent_id.clone(),
                            seq: e.seq,
                            reported: e.last_reported(),
                        })
                        .collect(),
                ),
                false,
            ),
        };
        let beats = records::beats(&list, find);
        let mut changed = false;
        for &(at, reported) in &beats.refresh {
            changed |= held[at].beat_changes_health(heard.at, reported, &self.thresholds);
        }
        outcome.refreshed = beats.refresh.len();
        if changed {
            self.health_epoch.fetch_add(1, Ordering::AcqRel);
        }
        let remote = beats.refresh.iter().all(|&(at, _)| held[at].origin == Origin::Remote);
        match records {
            Some(records) if kept && remote && beats.missing.is_empty() => {
                let refresh =
                    beats.refresh.iter().map(|&(at, reported)| (held[at].live.clone(), reported)).collect();
                let walk = Walk { list: Arc::downgrade(&list), records: Arc::downgrade(records), refresh };
                self.walks.keep(publisher, walk);
            }
            _ => self.walks.forget(&publisher),
        }
        outcome.missing = beats.missing;
        outcome
    }

    /// Applies a declaration that `publisher` is down, made by a node whose newest heartbeat of it was
    /// sent at `last_seen`: its agents held here turn offline (derived health `inactive`) until a
    /// heartbeat sent after `last_seen` arrives. Ignored when this node heard a newer heartbeat, or the
    /// publisher is unknown here; true when it changed something.
    pub fn remote_down(&self, publisher: PeerId, last_seen: u64) -> bool {
        if !self.remote.lock().down(publisher, last_seen) {
            return false;
        }
        let snapshot = self.snapshot();
        let mut marked = 0;
        for entry in snapshot.of_publisher(&publisher) {
            entry.down();
            marked += 1;
        }
        self.health_epoch.fetch_add(1, Ordering::AcqRel);
        tracing::info!(%publisher, agents = marked, "publisher declared down");
        true
    }

    /// The `sent_at` of the newest heartbeat heard of `publisher`, if any.
    pub fn heard_sent_at(&self, publisher: &PeerId) -> Option<u64> {
        self.remote.lock().heard_sent_at(publisher)
    }

    /// The current agent list of each remote publisher of these updates, with when its newest heartbeat
    /// was heard.
    pub(super) fn remote_lists(
        &self,
        updates: &[super::Update],
    ) -> HashMap<PeerId, (Millis, Arc<Vec<HeartbeatAgent>>)> {
        let records = self.remote.lock();
        let mut lists = HashMap::new();
        for update in updates {
            if let super::Update::Upsert { publisher, origin: Origin::Remote, .. } = update {
                if lists.contains_key(publisher) {
                    continue;
                }
                if let Some(list) = records.current_list(publisher) {
                    lists.insert(*publisher, list);
                }
            }
        }
        lists
    }

    /// The signed messages that carried `publisher`'s current agent list, for a node that missed it.
    pub fn signed_list(&self, publisher: &PeerId) -> Option<SignedList> {
        self.remote.lock().signed_list(publisher)
    }

    /// Publishers tracked, list entries and tombstones held: the bounded mesh state.
    pub fn mesh_state_size(&self) -> (usize, usize, usize) {
        self.remote.lock().sizes()
    }

    /// This node's agent list for its heartbeat: every local agent with its card seq and its state as
    /// this node sees it.
    pub fn local_agents(&self, now: Millis) -> Vec<HeartbeatAgent> {
        let snapshot = self.snapshot();
        // This node's records, in agent id order, without walking the whole view.
        snapshot
            .of_publisher(&self.me)
            .filter(|e| e.is_local())
            .map(|e| HeartbeatAgent {
                agent_id: e.key.agent_id.clone(),
                seq: e.seq,
                reported: match e.health(now, &self.thresholds) {
                    Health::Active => e.reported(),
                    Health::Degraded => Reported::Degraded,
                    Health::Inactive => Reported::Offline,
                    Health::Unknown => Reported::Starting,
                },
            })
            .collect()
    }

    /// Removes every record of `publisher` older than `seq` (the publisher left the mesh).
    pub async fn remove_publisher(
        &self,
        publisher: PeerId,
        seq: u64,
        now: Millis,
    ) -> Result<usize, RegistryError> {
        if publisher == self.me {
            return Ok(0);
        }
        let mut map = self.writer.lock().await;
        let doomed: Vec<RecordKey> = map
            .values()
            .filter(|e| e.key.publisher == publisher && records::left_behind(e.seq, seq))
            .map(|e| e.key.clone())
            .collect();
        let mut result = Ok(());
        for key in &doomed {
            let agent_id = key.agent_id.clone();
            let update = super::Update::Remove { publisher, agent_id, seq };
            if let Err(e) = self.apply_locked(&mut map, update, now).await {
                result = Err(e);
                break;
            }
        }
        if !doomed.is_empty() {
            self.publish(&mut map);
        }
        result?;
        self.remote.lock().left(publisher, seq, now);
        Ok(doomed.len())
    }

    /// Drops remote records not heard of for `evict_after`, then tombstones older than that and the
    /// publishers silent since then that hold nothing here any more.
    pub async fn evict(&self, now: Millis, evict_after: Duration) -> Result<usize, RegistryError> {
        let horizon = now.saturating_sub(evict_after.as_millis() as u64);
        let evicted = self.evict_records(horizon).await?;
        self.remote.lock().evict(horizon);
        Ok(evicted)
    }

    async fn evict_records(&self, horizon: Millis) -> Result<usize, RegistryError> {
        let snapshot = self.snapshot();
        let silent =
            |e: &Entry| records::silent(e.origin == Origin::Remote, e.live.last(), e.updated_at, horizon);
        let stale: Vec<(RecordKey, u64)> =
            snapshot.entries.iter().filter(|e| silent(e)).map(|e| (e.key.clone(), e.seq)).collect();
        if stale.is_empty() {
            return Ok(0);
        }
        let mut map = self.writer.lock().await;
        let mut evicted = 0;
        for (key, seq) in stale {
            // Still the same version and still silent: an update that raced this sweep wins.
            let current = map.get(&key).filter(|e| e.seq == seq && silent(e));
            if current.is_some() {
                self.store.remove(&key.agent_id, &key.publisher.to_bytes(), false).await?;
                map.remove(&key);
                self.release(key.publisher);
                evicted += 1;
            }
        }
        if evicted > 0 {
            self.publish(&mut map);
        }
        Ok(evicted)
    }

    /// Removes every remote record whose publisher `keep` refuses (a publisher allow-list applied to
    /// what an earlier run stored). Returns how many went.
    pub async fn forget_publishers(&self, keep: impl Fn(&PeerId) -> bool) -> Result<usize, RegistryError> {
        let mut map = self.writer.lock().await;
        let gone: Vec<RecordKey> = map
            .values()
            .filter(|e| e.origin == Origin::Remote && !keep(&e.key.publisher))
            .map(|e| e.key.clone())
            .collect();
        for key in &gone {
            self.store.remove(&key.agent_id, &key.publisher.to_bytes(), false).await?;
            map.remove(key);
            self.release(key.publisher);
        }
        if !gone.is_empty() {
            self.store.flush().await?;
            self.publish(&mut map);
        }
        Ok(gone.len())
    }

    /// The signed card message of a record, exactly as its publisher made it.
    pub fn signed_card(&self, key: &RecordKey) -> Option<Vec<u8>> {
        self.snapshot().get(&key.agent_id, &key.publisher).map(|e| e.signed_message())
    }

    /// Number of records per derived health, for status.
    pub fn health_counts(&self, now: Millis) -> HashMap<Health, usize> {
        let mut counts = HashMap::new();
        for e in &self.snapshot().entries {
            *counts.entry(e.health(now, &self.thresholds)).or_default() += 1;
        }
        counts
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::card::AgentCard;
    use crate::defaults::{LIST_ENTRIES_PER_RECORD, MAX_TRACKED_PUBLISHERS};
    use crate::registry::health::Thresholds;
    use crate::registry::{Applied, Liveness, Update};
    use crate::wire::{self, CardBody};
    use libp2p::identity::Keypair;

    fn card(id: &str, version: &str) -> AgentCard {
        let json = format!(
            r#"{{"agent_id":"{id}","base_url":"http://127.0.0.1:1","version":"{version}","skills":[{{"id":"s"}}]}}"#
        );
        AgentCard::from_json(json.as_bytes()).unwrap()
    }

    fn signed(key: &Keypair, card: &AgentCard, seq: u64) -> Update {
        let card = &card.clone().signed(key);
        let body = CardBody {
            agent_id: card.agent_id.clone(),
            seq,
            card: String::from_utf8(card.to_json()).unwrap(),
        };
        let sig = wire::sign_card(key, &body);
        Update::upsert(key.public().to_peer_id(), seq, card.clone(), Origin::Remote, sig)
    }

    fn registry(dir: &std::path::Path) -> Registry {
        Registry::open(dir, Keypair::generate_ed25519(), Thresholds::default()).unwrap().0
    }

    const SMALL: Limits = Limits { per_publisher: 50, remote_records: 1_000 };

    fn small_registry(dir: &std::path::Path, key: &Keypair) -> Registry {
        Registry::open_checked(dir, key.clone(), Thresholds::default(), SMALL, false).unwrap().0
    }

    /// A registry holding one remote card, `a` at seq 5, with its publisher's key and id.
    async fn holding_remote_a_at_5() -> (tempfile::TempDir, Registry, Keypair, PeerId) {
        let dir = tempfile::tempdir().unwrap();
        let r = registry(dir.path());
        let peer = Keypair::generate_ed25519();
        let p = peer.public().to_peer_id();
        r.apply(signed(&peer, &card("a", "1"), 5), 0).await.unwrap();
        (dir, r, peer, p)
    }

    #[tokio::test]
    async fn remote_cards_follow_seq_and_tombstones() {
        let dir = tempfile::tempdir().unwrap();
        let r = registry(dir.path());
        let peer = Keypair::generate_ed25519();
        let p = peer.public().to_peer_id();
        assert_eq!(
            r.apply(signed(&peer, &card("a", "1"), 10), 0).await.unwrap(),
            Applied::Created { seq: 10 }
        );
        assert_eq!(
            r.apply(signed(&peer, &card("a", "0"), 9), 0).await.unwrap(),
            Applied::Stale { held: Some(10) }
        );
        assert_eq!(
            r.apply(signed(&peer, &card("a", "1"), 10), 0).await.unwrap(),
            Applied::Stale { held: Some(10) }
        );
        let remove = Update::Remove { publisher: p, agent_id: "a".into(), seq: 11 };
        assert_eq!(r.apply(remove, 0).await.unwrap(), Applied::Removed { seq: 11 });
        assert_eq!(
            r.apply(signed(&peer, &card("a", "1"), 10), 0).await.unwrap(),
            Applied::Stale { held: None },
            "replay after removal"
        );
        assert_eq!(
            r.apply(signed(&peer, &card("a", "2"), 12), 0).await.unwrap(),
            Applied::Created { seq: 12 }
        );
        // The same agent id from another publisher is another record.
        let other = Keypair::generate_ed25519();
        assert_eq!(
            r.apply(signed(&other, &card("a", "9"), 1), 0).await.unwrap(),
            Applied::Created { seq: 1 }
        );
        assert_eq!(r.snapshot().by_agent_id("a").len(), 2);
        // The signed message is re-created exactly and verifies.
        let key = RecordKey { agent_id: "a".into(), publisher: p };
        let msg = r.signed_card(&key).unwrap();
        assert_eq!(wire::open(&msg).unwrap().publisher, p);
    }

    #[tokio::test]
    async fn heartbeats_refresh_report_missing_and_ignore_replays() {
        let (_dir, r, _, p) = holding_remote_a_at_5().await;
        let t = *r.thresholds();
        let entry = || r.snapshot().by_agent_id("a")[0].clone();
        assert_eq!(entry().health(1_000, &t), Health::Unknown);
        let hb = |sent_at, seq| {
            let agents = vec![
                HeartbeatAgent { agent_id: "a".into(), seq, reported: Reported::Ready },
                HeartbeatAgent { agent_id: "b".into(), seq: 1, reported: Reported::Ready },
            ];
            HeartbeatBody { sent_at, digest: wire::agents_digest(&agents), agents: Some(agents) }
        };
        let out = r.remote_heartbeat(p, &hb(100, 5), b"m100", 1_000);
        assert_eq!((out.refreshed, out.missing.clone(), out.replayed), (1, vec![("b".to_owned(), 1)], false));
        assert_eq!(entry().health(1_000, &t), Health::Active);
        assert!(r.remote_heartbeat(p, &hb(100, 5), b"m100", 2_000).replayed, "same sent_at");
        assert!(r.remote_heartbeat(p, &hb(99, 5), b"m99", 2_000).replayed, "older sent_at");
        assert_eq!(entry().health(1_000 + t.degraded_after.as_millis() as u64, &t), Health::Degraded);
        // A digest-only heartbeat of the known list refreshes like the full one, and the signed message
        // that carried the list is what a node that missed it is given.
        let compact = HeartbeatBody { agents: None, ..hb(101, 5) };
        let out = r.remote_heartbeat(p, &compact, b"m101", 5_000);
        assert_eq!((out.refreshed, out.unknown_list), (1, false));
        assert_eq!(entry().health(5_000, &t), Health::Active);
        assert_eq!(r.signed_list(&p).as_deref(), Some(&[Arc::<[u8]>::from(&b"m100"[..])][..]));
        // One of an unknown list still keeps the held agents of a live publisher fresh, and the list
        // this node has is no longer current, so it serves none.
        let unknown = HeartbeatBody { sent_at: 102, digest: 42, agents: None };
        let out = r.remote_heartbeat(p, &unknown, b"m102", 9_000);
        assert_eq!((out.refreshed, out.unknown_list), (1, true));
        assert_eq!(entry().health(9_000, &t), Health::Active);
        assert_eq!(r.signed_list(&p), None);
        let out = r.remote_heartbeat(p, &hb(103, 6), b"m103", 10_000);
        assert_eq!(
            out.missing,
            [("a".to_owned(), 6), ("b".to_owned(), 1)],
            "a newer seq than held is fetched"
        );
    }

    /// A registry holding `ids` at seq 5 from two publishers, so that the other's records sit between
    /// the first's in the view's order; with the first publisher's key and id, and the other's key.
    async fn two_publishers_holding(ids: &[&str]) -> (tempfile::TempDir, Registry, Keypair, PeerId, Keypair) {
        let dir = tempfile::tempdir().unwrap();
        let r = registry(dir.path());
        let (peer, other) = (Keypair::generate_ed25519(), Keypair::generate_ed25519());
        for id in ids {
            r.apply(signed(&peer, &card(id, "1"), 5), 0).await.unwrap();
            r.apply(signed(&other, &card(id, "1"), 5), 0).await.unwrap();
        }
        let p = peer.public().to_peer_id();
        (dir, r, peer, p, other)
    }

    #[tokio::test]
    async fn a_list_in_any_order_refreshes_every_agent_held_and_names_every_one_missing() {
        let (_dir, r, _, p, _) = two_publishers_holding(&["b", "d", "f", "h"]).await;
        let t = *r.thresholds();
        let listed = |ids: &[&str]| -> Vec<HeartbeatAgent> {
            ids.iter()
                .map(|id| HeartbeatAgent { agent_id: (*id).into(), seq: 5, reported: Reported::Ready })
                .collect()
        };
        let orders: [&[&str]; 4] = [
            &["a", "b", "c", "d", "f", "g", "h", "i"],
            &["i", "h", "g", "f", "d", "c", "b", "a"],
            &["d", "a", "h", "b", "i", "f", "c", "g"],
            &["b", "b", "h", "a", "h", "d", "f", "f"],
        ];
        for (n, ids) in orders.into_iter().enumerate() {
            let agents = listed(ids);
            let sent_at = 100 + n as u64;
            let at = 1_000 * (n as u64 + 1) * 10;
            let hb = HeartbeatBody { sent_at, digest: wire::agents_digest(&agents), agents: Some(agents) };
            let out = r.remote_heartbeat(p, &hb, b"m", at);
            let held = ids.iter().filter(|id| ["b", "d", "f", "h"].contains(id)).count();
            let mut missing: Vec<_> = out.missing.iter().map(|(id, _)| id.as_str()).collect();
            missing.sort_unstable();
            let mut want: Vec<_> =
                ids.iter().copied().filter(|id| !["b", "d", "f", "h"].contains(id)).collect();
            want.sort_unstable();
            assert_eq!((out.refreshed, missing), (held, want), "order {ids:?}");
            for entry in r.snapshot().entries.iter() {
                let health = entry.health(at, &t);
                let want = if entry.key.publisher == p { Health::Active } else { Health::Unknown };
                assert_eq!(health, want, "{} of order {ids:?}", entry.key.agent_id);
            }
        }
    }

    /// A beat of the list heard last time, along the same records, goes by the last walk; any change
    /// of the publisher's records (a removal, a new version, a new agent) or of its list walks again.
    #[tokio::test]
    async fn a_repeated_list_beats_the_same_records_until_the_records_or_the_list_change() {
        let (_dir, r, peer, p, other) = two_publishers_holding(&["a", "b", "c"]).await;
        let t = *r.thresholds();
        let degraded = t.degraded_after.as_millis() as u64;
        let listed = |agents: &[(&str, u64, Reported)]| -> Vec<HeartbeatAgent> {
            agents
                .iter()
                .map(|&(id, seq, reported)| HeartbeatAgent { agent_id: id.into(), seq, reported })
                .collect()
        };
        let beat = |sent_at: u64, agents: &[HeartbeatAgent], at: Millis| {
            let body = HeartbeatBody { sent_at, digest: wire::agents_digest(agents), agents: None };
            let out = r.remote_heartbeat(p, &body, b"m", at);
            let mut missing: Vec<String> = out.missing.into_iter().map(|(id, _)| id).collect();
            missing.sort_unstable();
            (out.refreshed, missing)
        };
        let health =
            |id: &str, at: Millis| r.snapshot().get(id, &p).map(|e| (e.health(at, &t), e.reported()));
        let first = listed(&[("a", 5, Reported::Ready), ("b", 5, Reported::Busy), ("c", 5, Reported::Ready)]);
        let body =
            HeartbeatBody { sent_at: 1, digest: wire::agents_digest(&first), agents: Some(first.clone()) };
        assert_eq!(r.remote_heartbeat(p, &body, b"m1", 1_000).refreshed, 3);
        // The same list again, many beats apart: each one keeps all three alive in their states.
        let mut at = 1_000;
        for sent_at in 2..6 {
            at += degraded - 1;
            assert_eq!(beat(sent_at, &first, at), (3, vec![]));
            assert_eq!(health("b", at + degraded - 1), Some((Health::Active, Reported::Busy)));
            assert_eq!(health("c", at + degraded - 1), Some((Health::Active, Reported::Ready)));
        }
        // The other publisher's records were never beaten.
        assert_eq!(
            r.snapshot().get("a", &other.public().to_peer_id()).unwrap().health(at, &t),
            Health::Unknown
        );
        // `b` removed: the same list finds it missing, and beats the other two.
        let remove = Update::Remove { publisher: p, agent_id: "b".into(), seq: 6 };
        r.apply(remove, 0).await.unwrap();
        at += 1_000;
        assert_eq!(beat(6, &first, at), (2, vec!["b".to_owned()]));
        assert_eq!(health("c", at + degraded - 1), Some((Health::Active, Reported::Ready)));
        // A new version of `a`, and a new agent `ab` that sorts between `a` and `c`: a new list walks
        // the new records, and the same list again goes by that walk.
        r.apply(signed(&peer, &card("a", "2"), 7), 0).await.unwrap();
        r.apply(signed(&peer, &card("ab", "1"), 5), 0).await.unwrap();
        let second =
            listed(&[("a", 7, Reported::Ready), ("ab", 5, Reported::Draining), ("c", 5, Reported::Ready)]);
        let body =
            HeartbeatBody { sent_at: 7, digest: wire::agents_digest(&second), agents: Some(second.clone()) };
        at += 1_000;
        assert_eq!(r.remote_heartbeat(p, &body, b"m7", at).refreshed, 3);
        for sent_at in 8..10 {
            at += degraded - 1;
            assert_eq!(beat(sent_at, &second, at), (3, vec![]));
            assert_eq!(health("a", at + degraded - 1), Some((Health::Active, Reported::Ready)));
            assert_eq!(health("ab", at + degraded - 1), Some((Health::Active, Reported::Draining)));
            assert_eq!(health("c", at + degraded - 1), Some((Health::Active, Reported::Ready)));
        }
    }

    #[tokio::test]
    async fn who_is_alive_is_the_newest_signed_heartbeat_of_each_publisher_heard_lately() {
        let dir = tempfile::tempdir().unwrap();
        let r = registry(dir.path());
        let t = *r.thresholds();
        let recent = t.degraded_after.as_millis() as u64;
        let (a, b, c) = (PeerId::random(), PeerId::random(), PeerId::random());
        let beat = |p, sent_at, at, signed: &[u8]| {
            let body = HeartbeatBody { sent_at, digest: 7, agents: None };
            r.remote_heartbeat(p, &body, signed, at)
        };
        beat(a, 1, 1_000, b"a1");
        beat(a, 2, 2_000, b"a2");
        beat(a, 1, 2_500, b"a1 replayed");
        beat(b, 5, 1_500, b"b5");
        beat(c, 9, 100, b"c9");
        let now = 100 + recent + 1;
        let alive: Vec<Vec<u8>> = r.newest_heartbeats(now).iter().map(|m| m.to_vec()).collect();
        assert_eq!(alive, vec![b"a2".to_vec(), b"b5".to_vec()], "newest first; c heard too long ago");
        // A publisher declared down is not alive; a later heartbeat makes it so again.
        assert!(r.remote_down(b, 5));
        let alive: Vec<Vec<u8>> = r.newest_heartbeats(now).iter().map(|m| m.to_vec()).collect();
        assert_eq!(alive, vec![b"a2".to_vec()]);
        beat(b, 6, now, b"b6");
        let alive: Vec<Vec<u8>> = r.newest_heartbeats(now).iter().map(|m| m.to_vec()).collect();
        assert_eq!(alive, vec![b"b6".to_vec(), b"a2".to_vec()]);
    }

    #[tokio::test]
    async fn who_is_alive_carries_each_publishers_list_after_its_heartbeat() {
        let dir = tempfile::tempdir().unwrap();
        let r = registry(dir.path());
        let (a, b) = (PeerId::random(), PeerId::random());
        let list = vec![HeartbeatAgent { agent_id: "x".into(), seq: 1, reported: Reported::Ready }];
        let digest = crate::wire::agents_digest(&list);
        // a: its list came in an older heartbeat, the newest names it by digest.
        let carrier = HeartbeatBody { sent_at: 1, digest, agents: Some(list.clone()) };
        r.remote_heartbeat(a, &carrier, b"a1 with the list", 1_000);
        r.remote_heartbeat(a, &HeartbeatBody { sent_at: 2, digest, agents: None }, b"a2", 2_000);
        // b: its newest heartbeat carried the list itself.
        r.remote_heartbeat(b, &HeartbeatBody { sent_at: 5, digest, agents: Some(list) }, b"b5", 1_500);
        let answer: Vec<Vec<u8>> = r.newest_heartbeats(2_000).iter().map(|m| m.to_vec()).collect();
        let want: Vec<&[u8]> = vec![b"a2", b"a1 with the list", b"b5"];
        assert_eq!(answer, want.iter().map(|m| m.to_vec()).collect::<Vec<_>>(), "b5 not sent twice");
    }

    #[tokio::test]
    async fn a_declared_down_publisher_is_inactive_until_a_later_heartbeat() {
        let (_dir, r, _key, p) = holding_remote_a_at_5().await;
        let t = r.thresholds();
        let entry = || r.snapshot().get("a", &p).unwrap().clone();
        let hb = |sent_at| {
            let agents = vec![HeartbeatAgent { agent_id: "a".into(), seq: 5, reported: Reported::Ready }];
            HeartbeatBody { sent_at, digest: wire::agents_digest(&agents), agents: Some(agents) }
        };
        assert!(!r.remote_down(p, 100), "unknown publisher: nothing to mark");
        r.remote_heartbeat(p, &hb(100), b"m100", 1_000);
        assert_eq!(entry().health(1_000, t), Health::Active);
        assert!(!r.remote_down(p, 99), "this node heard a newer heartbeat than the declarer");
        assert!(r.remote_down(p, 100));
        assert_eq!(entry().health(1_001, t), Health::Inactive);
        assert!(!r.remote_down(p, 100), "once");
        // A heartbeat sent before the declaration's last one is old news, even arriving late.
        r.remote_heartbeat(p, &hb(100), b"m100", 1_100);
        assert_eq!(entry().health(1_100, t), Health::Inactive);
        // A later one refutes it.
        let out = r.remote_heartbeat(p, &hb(101), b"m101", 1_200);
        assert!(!out.replayed);
        assert_eq!(entry().health(1_200, t), Health::Active);
    }

    #[tokio::test]
    async fn a_later_heartbeat_of_a_list_not_held_still_refutes_a_declaration() {
        let (_dir, r, _key, p) = holding_remote_a_at_5().await;
        let t = r.thresholds();
        let entry = || r.snapshot().get("a", &p).unwrap().clone();
        let agents = vec![HeartbeatAgent { agent_id: "a".into(), seq: 5, reported: Reported::Degraded }];
        let full = HeartbeatBody { sent_at: 100, digest: wire::agents_digest(&agents), agents: Some(agents) };
        r.remote_heartbeat(p, &full, b"m100", 1_000);
        assert_eq!(entry().health(1_000, t), Health::Degraded);
        assert!(r.remote_down(p, 100));
        assert_eq!(entry().health(1_001, t), Health::Inactive);
        // Back with a list this node never got (say, a card changed while it was cut off): alive, in
        // the state it last reported, until the fetched list says more.
        let out =
            r.remote_heartbeat(p, &HeartbeatBody { sent_at: 101, digest: 42, agents: None }, b"m101", 1_200);
        assert!(out.unknown_list);
        assert_eq!(entry().health(1_200, t), Health::Degraded);
        assert_eq!(entry().reported(), Reported::Degraded);
    }

    #[tokio::test]
    async fn a_publisher_back_after_its_leave_is_accepted_at_its_old_seqs() {
        let (_dir, r, peer, p) = holding_remote_a_at_5().await;
        assert_eq!(r.remove_publisher(p, 1_000, 10).await.unwrap(), 1);
        // The same card again (a replay, or sync from a node that missed the leave): still hidden.
        assert!(matches!(
            r.apply(signed(&peer, &card("a", "1"), 5), 20).await.unwrap(),
            Applied::Stale { .. }
        ));
        // A heartbeat sent before the leave changes nothing; one sent after it shows the publisher back.
        let hb = |sent_at| HeartbeatBody { sent_at, digest: 0, agents: None };
        r.remote_heartbeat(p, &hb(900), b"", 30);
        assert!(matches!(
            r.apply(signed(&peer, &card("a", "1"), 5), 40).await.unwrap(),
            Applied::Stale { .. }
        ));
        r.remote_heartbeat(p, &hb(1_001), b"", 50);
        assert!(matches!(
            r.apply(signed(&peer, &card("a", "1"), 5), 60).await.unwrap(),
            Applied::Created { .. }
        ));
    }

    #[tokio::test]
    async fn a_fetched_list_is_installed_but_never_makes_a_silent_publisher_look_alive() {
        let (_dir, r, _, p) = holding_remote_a_at_5().await;
        let t = *r.thresholds();
        let entry = || r.snapshot().by_agent_id("a")[0].clone();
        let agents = vec![HeartbeatAgent { agent_id: "a".into(), seq: 5, reported: Reported::Degraded }];
        let digest = wire::agents_digest(&agents);
        let full = HeartbeatBody { sent_at: 100, digest, agents: Some(agents) };
        // This node joined late: it hears only digest-only heartbeats of that list.
        let out = r.remote_heartbeat(p, &HeartbeatBody { sent_at: 105, digest, agents: None }, b"m", 1_000);
        assert!(out.unknown_list);
        assert_eq!(entry().reported(), Reported::Ready, "no state heard yet");
        // The fetched (older) full heartbeat installs the list and the agent's own state...
        let out = r.remote_heartbeat(p, &full, b"full", 3_000);
        assert!(out.list_installed && !out.replayed);
        assert_eq!(entry().reported(), Reported::Degraded);
        assert_eq!(entry().last_heartbeat(3_000), Some(1_000), "heard when the newest beat came, not later");
        // ...once: replaying it again, or later, is a replay and refreshes nothing.
        assert!(r.remote_heartbeat(p, &full, b"full", 30_000).replayed);
        assert_eq!(entry().health(30_000, &t), Health::Inactive);
        // A fetched list for an older digest is refused.
        let stale = HeartbeatBody { sent_at: 90, digest: 7, agents: Some(vec![]) };
        assert!(r.remote_heartbeat(p, &stale, b"stale", 20_000).replayed);
    }

    #[tokio::test]
    async fn one_publisher_cannot_fill_the_view_beyond_its_limit() {
        const MAX_AGENTS_PER_PUBLISHER: usize = SMALL.per_publisher;
        let dir = tempfile::tempdir().unwrap();
        let me = Keypair::generate_ed25519();
        let r = small_registry(dir.path(), &me);
        let flooder = Keypair::generate_ed25519();
        let template = card("x", "1");
        for i in 0..MAX_AGENTS_PER_PUBLISHER {
            let mut c = template.clone();
            c.agent_id = format!("flood-{i}");
            assert!(matches!(r.apply(signed(&flooder, &c, 1), 0).await.unwrap(), Applied::Created { .. }));
        }
        let mut extra = template.clone();
        extra.agent_id = "one-too-many".into();
        assert_eq!(
            r.apply(signed(&flooder, &extra, 1), 0).await.unwrap(),
            Applied::OverLimit(Limit::Publisher)
        );
        // Updates of what it holds still apply, and other publishers are unaffected.
        let mut again = template.clone();
        again.agent_id = "flood-0".into();
        assert!(matches!(r.apply(signed(&flooder, &again, 2), 0).await.unwrap(), Applied::Updated { .. }));
        let honest = Keypair::generate_ed25519();
        assert!(matches!(r.apply(signed(&honest, &extra, 1), 0).await.unwrap(), Applied::Created { .. }));
        // A removal frees a slot.
        let p = flooder.public().to_peer_id();
        r.apply(Update::Remove { publisher: p, agent_id: "flood-1".into(), seq: 5 }, 0).await.unwrap();
        assert!(matches!(r.apply(signed(&flooder, &extra, 1), 0).await.unwrap(), Applied::Created { .. }));
        // The limit holds across a restart: stored records count.
        r.store.flush().await.unwrap();
        drop(r);
        let r = small_registry(dir.path(), &me);
        let mut late = template.clone();
        late.agent_id = "after-restart".into();
        assert_eq!(
            r.apply(signed(&flooder, &late, 1), 0).await.unwrap(),
            Applied::OverLimit(Limit::Publisher)
        );
        // An allow-list applied later forgets the publisher's stored records, and frees its count.
        assert_eq!(r.forget_publishers(|peer| *peer != p).await.unwrap(), MAX_AGENTS_PER_PUBLISHER);
        assert_eq!(r.snapshot().entries.len(), 1, "the honest publisher's card stays");
        assert!(matches!(r.apply(signed(&flooder, &late, 1), 0).await.unwrap(), Applied::Created { .. }));
    }

    /// Heartbeats from more fresh keys than the table tracks: it stays bounded in publishers and list
    /// entries, and the publisher whose agents the view holds keeps its state.
    #[tokio::test]
    async fn publisher_state_is_bounded_and_spares_publishers_with_records() {
        let dir = tempfile::tempdir().unwrap();
        let r = small_registry(dir.path(), &Keypair::generate_ed25519());
        let honest = Keypair::generate_ed25519();
        let h = honest.public().to_peer_id();
        r.apply(signed(&honest, &card("a", "1"), 5), 0).await.unwrap();
        let beat = |sent_at, agents: Vec<HeartbeatAgent>| HeartbeatBody {
            sent_at,
            digest: wire::agents_digest(&agents),
            agents: Some(agents),
        };
        let own = vec![HeartbeatAgent { agent_id: "a".into(), seq: 5, reported: Reported::Ready }];
        r.remote_heartbeat(h, &beat(1, own), b"honest", 1);
        let ghosts: Vec<HeartbeatAgent> = (0..5)
            .map(|i| HeartbeatAgent { agent_id: format!("ghost-{i}"), seq: 1, reported: Reported::Ready })
            .collect();
        for i in 0..MAX_TRACKED_PUBLISHERS + 500 {
            let now = 2 + i as u64;
            r.remote_heartbeat(PeerId::random(), &beat(1, ghosts.clone()), b"ghost", now);
            let (publishers, list_entries, _) = r.mesh_state_size();
            assert!(publishers <= MAX_TRACKED_PUBLISHERS);
            assert!(list_entries <= LIST_ENTRIES_PER_RECORD * SMALL.remote_records);
        }
        assert_eq!(
            r.signed_list(&h).as_deref().map(|l| l.len()),
            Some(1),
            "the honest publisher's list stays"
        );
        // Eviction forgets the silent publishers that hold nothing here.
        r.evict(1_000_000, Duration::from_secs(60)).await.unwrap();
        assert_eq!(r.mesh_state_size().0, 0, "the honest one was silent too, and evicted with its record");
    }

    #[tokio::test]
    async fn silent_remote_records_are_evicted_and_local_ones_never() {
        let dir = tempfile::tempdir().unwrap();
        let r = registry(dir.path());
        let peer = Keypair::generate_ed25519();
        r.apply(signed(&peer, &card("a", "1"), 5), 1_000).await.unwrap();
        r.register_local(card("mine", "1"), Liveness::Agent, 1_000).await.unwrap();
        let after = Duration::from_secs(60);
        assert_eq!(r.evict(50_000, after).await.unwrap(), 0);
        assert_eq!(r.evict(62_000, after).await.unwrap(), 1);
        let ids: Vec<_> = r.snapshot().entries.iter().map(|e| e.key.agent_id.clone()).collect();
        assert_eq!(ids, ["mine"]);
    }

    #[tokio::test]
    async fn reopening_reverifies_remote_signatures() {
        let dir = tempfile::tempdir().unwrap();
        let key = Keypair::generate_ed25519();
        let peer = Keypair::generate_ed25519();
        {
            let (r, _) = Registry::open(dir.path(), key.clone(), Thresholds::default()).unwrap();
            r.apply(signed(&peer, &card("good", "1"), 5), 0).await.unwrap();
            let mut forged = signed(&peer, &card("forged", "1"), 5);
            if let Update::Upsert { sig, .. } = &mut forged {
                sig[0] ^= 1;
            }
            // The registry trusts its callers (the mesh verifies first); the store keeps what it got.
            r.apply(forged, 0).await.unwrap();
            // A card stored without its A2A signature (a store from before them), envelope intact.
            let body = CardBody {
                agent_id: "unsigned".into(),
                seq: 5,
                card: String::from_utf8(card("unsigned", "1").to_json()).unwrap(),
            };
            let sig = wire::sign_card(&peer, &body);
            let update =
                Update::upsert(peer.public().to_peer_id(), 5, card("unsigned", "1"), Origin::Remote, sig);
            r.apply(update, 0).await.unwrap();
            r.register_local(card("mine", "1"), Liveness::Node, 0).await.unwrap();
        }
        // Rows as a version before seals wrote them: every one is verified again.
        {
            let store = crate::registry::store::Store::reopen(dir.path()).unwrap();
            let mut rows = Vec::new();
            store.load(|row| rows.push(row)).unwrap();
            for mut row in rows {
                row.seal = Default::default();
                store.put(&row, true).await.unwrap();
            }
        }
        let (r, report) = Registry::open(dir.path(), key, Thresholds::default()).unwrap();
        let ids: Vec<_> = r.snapshot().entries.iter().map(|e| e.key.agent_id.clone()).collect();
        assert_eq!(ids, ["good", "mine"]);
        assert_eq!((report.local, report.remote, report.unreadable, report.sealed), (1, 1, 2, 0));
    }
}
