//! What the registry does for the mesh: per-publisher limits, tombstones, heartbeats from other nodes,
//! eviction, and the digest and signed messages that anti-entropy exchanges.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use libp2p::identity::PeerId;

use super::health::{Health, Millis, Reported};
use super::{Origin, RecordKey, Registry, RegistryError};
use crate::wire::{HeartbeatAgent, HeartbeatBody, MAX_AGENTS_PER_PUBLISHER};

/// Remote records held in all, whoever published them: a bound on the memory that many publishers
/// (or many keys of one hostile peer) can take. About 5 KB each at most: some 250 MB at the limit.
pub const MAX_REMOTE_RECORDS: usize = 50_000;

/// Why a new remote record was not admitted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Limit {
    /// The publisher already has `MAX_AGENTS_PER_PUBLISHER` records here.
    Publisher,
    /// The view already holds `MAX_REMOTE_RECORDS` remote records (counted, but the sender is not
    /// penalised: a full view is this node's state, not the sender's doing).
    View,
}

impl Limit {
    /// The rejection reason counted in the mesh status.
    pub fn reason(self) -> &'static str {
        match self {
            Limit::Publisher => "publisher_over_limit",
            Limit::View => "view_full",
        }
    }
}

/// A publisher's agent list, its digest, and the signed heartbeat that carried it (served to nodes
/// that missed it).
struct KnownList {
    digest: u64,
    agents: Arc<Vec<HeartbeatAgent>>,
    signed: Arc<[u8]>,
}

/// The newest heartbeat heard from a publisher.
#[derive(Clone, Copy, Default)]
struct Heard {
    sent_at: u64,
    digest: u64,
    /// When it arrived (this node's clock).
    at: Millis,
}

#[derive(Default)]
struct Counts {
    per_publisher: HashMap<PeerId, usize>,
    total: usize,
}

/// Mesh bookkeeping that lives beside the view, in memory only.
#[derive(Default)]
pub(super) struct RemoteState {
    /// Records removed recently, with the removal's seq and when: an older card arriving later (a
    /// replay, or a slow path through the mesh) must not bring the agent back.
    tombstones: Mutex<HashMap<RecordKey, (u64, Millis)>>,
    /// Records held per remote publisher, bounded by `MAX_AGENTS_PER_PUBLISHER`, and in all.
    counts: Mutex<Counts>,
    /// A lower bound than `MAX_REMOTE_RECORDS` for tests (0: none).
    #[cfg(test)]
    max_records: std::sync::atomic::AtomicUsize,
    /// Publishers that announced their leave, with its seq: their records' tombstones hold until a
    /// heartbeat sent after the leave shows the publisher back.
    /// Forgotten with the tombstones, after `evict_after`.
    left: Mutex<HashMap<PeerId, (u64, Millis)>>,
    /// The newest heartbeat seen per publisher: older or equal ones are replays.
    last_heartbeat: Mutex<HashMap<PeerId, Heard>>,
    /// The last full agent list per publisher, by digest, for the heartbeats that carry only the digest.
    lists: Mutex<HashMap<PeerId, KnownList>>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl RemoteState {
    pub(super) fn outranks_tombstone(&self, key: &RecordKey, seq: u64) -> bool {
        lock(&self.tombstones).get(key).is_none_or(|&(removed, _)| seq > removed)
    }

    /// A heartbeat sent at `sent_at`: if the publisher had left before then, it is back, and the
    /// tombstones of its leave no longer hide the records it still holds (at their old seqs).
    fn returned(&self, publisher: PeerId, sent_at: u64) {
        let mut left = lock(&self.left);
        let Some(&(leave, _)) = left.get(&publisher) else { return };
        if sent_at > leave {
            left.remove(&publisher);
            lock(&self.tombstones).retain(|key, &mut (seq, _)| key.publisher != publisher || seq != leave);
        }
    }

    pub(super) fn remember_tombstone(&self, key: RecordKey, seq: u64, now: Millis) {
        let mut tombstones = lock(&self.tombstones);
        let slot = tombstones.entry(key).or_insert((seq, now));
        if seq >= slot.0 {
            *slot = (seq, now);
        }
    }

    /// Counts a new record of `publisher`, unless the publisher or the whole view is at its limit.
    pub(super) fn admit(&self, publisher: PeerId) -> Result<(), Limit> {
        let mut counts = lock(&self.counts);
        let Counts { per_publisher, total } = &mut *counts;
        let count = per_publisher.entry(publisher).or_default();
        if *count >= MAX_AGENTS_PER_PUBLISHER {
            return Err(Limit::Publisher);
        }
        if *total >= self.max_records() {
            if *count == 0 {
                per_publisher.remove(&publisher);
            }
            return Err(Limit::View);
        }
        *count += 1;
        *total += 1;
        Ok(())
    }

    fn max_records(&self) -> usize {
        #[cfg(test)]
        match self.max_records.load(Ordering::Relaxed) {
            0 => {}
            n => return n,
        }
        MAX_REMOTE_RECORDS
    }

    /// Counts a record loaded from the store (limits apply to what arrives, not to what was kept).
    pub(super) fn count_loaded(&self, publisher: PeerId) {
        let mut counts = lock(&self.counts);
        *counts.per_publisher.entry(publisher).or_default() += 1;
        counts.total += 1;
    }

    pub(super) fn release(&self, publisher: PeerId) {
        let mut counts = lock(&self.counts);
        let Counts { per_publisher, total } = &mut *counts;
        if let Some(count) = per_publisher.get_mut(&publisher) {
            *count = count.saturating_sub(1);
            *total = total.saturating_sub(1);
            if *count == 0 {
                per_publisher.remove(&publisher);
            }
        }
    }
}

/// What a remote heartbeat did.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct HeartbeatOutcome {
    /// Agents it refreshed.
    pub refreshed: usize,
    /// Agents it names at a seq this node lacks: pull their cards from the sender.
    pub missing: Vec<String>,
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
        let mut outcome = HeartbeatOutcome::default();
        if publisher == self.me {
            return outcome;
        }
        let heard = {
            let mut last = lock(&self.remote.last_heartbeat);
            let seen = last.entry(publisher).or_default();
            if body.sent_at <= seen.sent_at {
                let wanted = body.agents.is_some()
                    && body.digest == seen.digest
                    && lock(&self.remote.lists).get(&publisher).is_none_or(|l| l.digest != body.digest);
                if !wanted {
                    outcome.replayed = true;
                    return outcome;
                }
                outcome.list_installed = true;
                *seen
            } else {
                *seen = Heard { sent_at: body.sent_at, digest: body.digest, at: now };
                *seen
            }
        };
        self.remote.returned(publisher, body.sent_at);
        let snapshot = self.snapshot();
        let list = match &body.agents {
            Some(agents) => {
                let list = Arc::new(agents.clone());
                let known = KnownList { digest: body.digest, agents: list.clone(), signed: signed.into() };
                lock(&self.remote.lists).insert(publisher, known);
                list
            }
            None => match lock(&self.remote.lists).get(&publisher) {
                Some(known) if known.digest == body.digest => known.agents.clone(),
                // A list this node missed: the publisher is alive, so its agents held here stay fresh
                // with the states last heard until the fetched list arrives.
                _ => {
                    outcome.unknown_list = true;
                    Arc::new(
                        snapshot
                            .entries
                            .iter()
                            .filter(|e| e.key.publisher == publisher)
                            .map(|e| HeartbeatAgent {
                                agent_id: e.key.agent_id.clone(),
                                seq: e.seq,
                                reported: e.reported(),
                            })
                            .collect(),
                    )
                }
            },
        };
        let mut changed = false;
        for agent in list.iter() {
            match snapshot.get(&agent.agent_id, &publisher) {
                Some(entry) if entry.seq >= agent.seq => {
                    changed |= entry.beat_changes_health(heard.at, agent.reported, &self.thresholds);
                    outcome.refreshed += 1;
                }
                _ => outcome.missing.push(agent.agent_id.clone()),
            }
        }
        if changed {
            self.health_epoch.fetch_add(1, Ordering::AcqRel);
        }
        outcome
    }

    /// The signed heartbeat that carried `publisher`'s current agent list, for a node that missed it.
    pub fn signed_list(&self, publisher: &PeerId) -> Option<Arc<[u8]>> {
        let digest = lock(&self.remote.last_heartbeat).get(publisher)?.digest;
        lock(&self.remote.lists).get(publisher).filter(|l| l.digest == digest).map(|l| l.signed.clone())
    }

    /// This node's agent list for its heartbeat: every local agent with its card seq and its state as
    /// this node sees it.
    pub fn local_agents(&self, now: Millis) -> Vec<HeartbeatAgent> {
        let snapshot = self.snapshot();
        snapshot
            .entries
            .iter()
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
            .filter(|e| e.key.publisher == publisher && e.seq < seq)
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
            self.publish(&map);
        }
        result?;
        lock(&self.remote.left).insert(publisher, (seq, now));
        lock(&self.remote.last_heartbeat).remove(&publisher);
        lock(&self.remote.lists).remove(&publisher);
        Ok(doomed.len())
    }

    /// Drops remote records not heard of for `evict_after`, and tombstones older than that.
    pub async fn evict(&self, now: Millis, evict_after: Duration) -> Result<usize, RegistryError> {
        let horizon = now.saturating_sub(evict_after.as_millis() as u64);
        lock(&self.remote.tombstones).retain(|_, &mut (_, at)| at >= horizon);
        lock(&self.remote.left).retain(|_, &mut (_, at)| at >= horizon);
        let snapshot = self.snapshot();
        let stale: Vec<(RecordKey, u64)> = snapshot
            .entries
            .iter()
            .filter(|e| e.origin == Origin::Remote && e.live.last().unwrap_or(e.updated_at) < horizon)
            .map(|e| (e.key.clone(), e.seq))
            .collect();
        if stale.is_empty() {
            return Ok(0);
        }
        let mut map = self.writer.lock().await;
        let mut evicted = 0;
        for (key, seq) in stale {
            // Still the same version and still silent: an update that raced this sweep wins.
            let current =
                map.get(&key).filter(|e| e.seq == seq && e.live.last().unwrap_or(e.updated_at) < horizon);
            if current.is_some() {
                self.store.remove(&key.agent_id, &key.publisher.to_bytes(), false).await?;
                map.remove(&key);
                self.remote.release(key.publisher);
                evicted += 1;
            }
        }
        if evicted > 0 {
            self.publish(&map);
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
            self.remote.release(key.publisher);
        }
        if !gone.is_empty() {
            self.store.flush().await?;
            self.publish(&map);
        }
        Ok(gone.len())
    }

    /// Lowers the limit of remote records in all, so that tests can reach it.
    #[cfg(test)]
    pub(crate) fn limit_remote_records(&self, n: usize) {
        self.remote.max_records.store(n, Ordering::Relaxed);
    }

    /// `(publisher, agent_id, seq)` of every record held: what anti-entropy compares.
    pub fn digest(&self) -> Vec<(PeerId, String, u64)> {
        self.snapshot().entries.iter().map(|e| (e.key.publisher, e.key.agent_id.clone(), e.seq)).collect()
    }

    /// An order-independent fingerprint of every `(publisher, agent_id, seq)` held, and the count: two
    /// nodes with the same view have the same fingerprint.
    pub fn fingerprint(&self) -> (u64, u64) {
        use sha2::Digest as _;
        let snapshot = self.snapshot();
        let mut sum = 0u64;
        for e in &snapshot.entries {
            let mut h = sha2::Sha256::new();
            h.update(e.key.publisher.to_bytes());
            h.update([0]);
            h.update(e.key.agent_id.as_bytes());
            h.update(e.seq.to_be_bytes());
            let digest = h.finalize();
            sum = sum.wrapping_add(u64::from_be_bytes(digest[..8].try_into().unwrap_or_default()));
        }
        (sum, snapshot.entries.len() as u64)
    }

    /// The signed card message of a record, exactly as its publisher made it.
    pub fn signed_card(&self, key: &RecordKey) -> Option<Vec<u8>> {
        self.snapshot().get(&key.agent_id, &key.publisher).map(|e| e.signed_message())
    }

    /// Signed messages for every record held that `theirs` lacks or holds at an older seq.
    pub fn newer_than(&self, theirs: &HashMap<(PeerId, String), u64>) -> Vec<Vec<u8>> {
        let snapshot = self.snapshot();
        snapshot
            .entries
            .iter()
            .filter(|e| theirs.get(&(e.key.publisher, e.key.agent_id.clone())).is_none_or(|&seq| seq < e.seq))
            .map(|e| e.signed_message())
            .collect()
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
        Update::Upsert {
            publisher: key.public().to_peer_id(),
            seq,
            card: card.clone(),
            origin: Origin::Remote,
            sig,
        }
    }

    fn registry(dir: &std::path::Path) -> Registry {
        Registry::open(dir, Keypair::generate_ed25519(), Thresholds::default()).unwrap().0
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
        assert_eq!((out.refreshed, out.missing.clone(), out.replayed), (1, vec!["b".to_owned()], false));
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
        assert_eq!(r.signed_list(&p).as_deref(), Some(&b"m100"[..]));
        // One of an unknown list still keeps the held agents of a live publisher fresh, and the list
        // this node has is no longer current, so it serves none.
        let unknown = HeartbeatBody { sent_at: 102, digest: 42, agents: None };
        let out = r.remote_heartbeat(p, &unknown, b"m102", 9_000);
        assert_eq!((out.refreshed, out.unknown_list), (1, true));
        assert_eq!(entry().health(9_000, &t), Health::Active);
        assert_eq!(r.signed_list(&p), None);
        let out = r.remote_heartbeat(p, &hb(103, 6), b"m103", 10_000);
        assert_eq!(out.missing, ["a", "b"], "a newer seq than held is pulled");
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
        let dir = tempfile::tempdir().unwrap();
        let r = registry(dir.path());
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
        let r = registry(dir.path());
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

    #[tokio::test]
    async fn equal_views_have_equal_fingerprints() {
        let (d1, d2) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let (r1, r2) = (registry(d1.path()), registry(d2.path()));
        let peer = Keypair::generate_ed25519();
        assert_eq!(r1.fingerprint(), r2.fingerprint());
        r1.apply(signed(&peer, &card("a", "1"), 5), 0).await.unwrap();
        assert_ne!(r1.fingerprint(), r2.fingerprint());
        r2.apply(signed(&peer, &card("a", "1"), 5), 0).await.unwrap();
        assert_eq!(r1.fingerprint(), r2.fingerprint());
        r2.apply(signed(&peer, &card("a", "2"), 6), 0).await.unwrap();
        assert_ne!(r1.fingerprint(), r2.fingerprint(), "a newer seq differs");
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
            let update = Update::Upsert {
                publisher: peer.public().to_peer_id(),
                seq: 5,
                card: card("unsigned", "1"),
                origin: Origin::Remote,
                sig,
            };
            r.apply(update, 0).await.unwrap();
            r.register_local(card("mine", "1"), Liveness::Node, 0).await.unwrap();
        }
        let (r, report) = Registry::open(dir.path(), key, Thresholds::default()).unwrap();
        let ids: Vec<_> = r.snapshot().entries.iter().map(|e| e.key.agent_id.clone()).collect();
        assert_eq!(ids, ["good", "mine"]);
        assert_eq!((report.local, report.remote, report.unreadable), (1, 1, 2));
    }
}
