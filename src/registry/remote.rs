//! What the registry does for the mesh: per-publisher limits, tombstones, heartbeats from other nodes,
//! eviction, and the digest and signed messages that anti-entropy exchanges.
//!
//! Every map here is bounded by a named limit (`crate::defaults`): publishers tracked
//! (`MAX_TRACKED_PUBLISHERS`), list entries (`LIST_ENTRIES_PER_RECORD` per record the view may hold),
//! tombstones (`MAX_TOMBSTONES`), and the records themselves (`Limits`). Beyond a bound, what matters least goes first: state of
//! publishers that hold no record here, least recently heard first; the oldest tombstones.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use libp2p::identity::PeerId;

use super::health::{Health, Millis, Reported};
use super::{Origin, RecordKey, Registry, RegistryError};
use crate::defaults::{self, LIST_ENTRIES_PER_RECORD, MAX_TOMBSTONES, MAX_TRACKED_PUBLISHERS};
use crate::wire::{HeartbeatAgent, HeartbeatBody};

/// How many records the view takes: the same numbers decide what this node admits locally and what
/// it takes from the mesh.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Records one publisher may have, this node included (`max_agents_per_publisher`).
    pub per_publisher: usize,
    /// Remote records held in all (`max_remote_records`).
    pub remote_records: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            per_publisher: defaults::MAX_AGENTS_PER_PUBLISHER,
            remote_records: defaults::MAX_REMOTE_RECORDS,
        }
    }
}

/// Why a new remote record was not admitted. Neither blames the sender: a card alone does not prove
/// its publisher is over the limit (a removal that frees a slot may still be on its way, or the
/// publisher's node may be configured with a higher limit), and a full view is this node's state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Limit {
    /// The publisher already has `Limits::per_publisher` records here.
    Publisher,
    /// The view already holds `Limits::remote_records` remote records.
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

/// A publisher's agent list, its digest, and the signed messages that carried it (the heartbeat, or
/// the chunks of a long list), served to nodes that missed it.
struct KnownList {
    digest: u64,
    agents: Arc<Vec<HeartbeatAgent>>,
    signed: SignedList,
}

/// The signed messages that carry an agent list: one heartbeat, or every chunk of a long list.
pub type SignedList = Arc<[Arc<[u8]>]>;

/// The newest heartbeat heard from a publisher.
#[derive(Clone, Copy, Default)]
struct Heard {
    sent_at: u64,
    digest: u64,
    /// When it arrived (this node's clock).
    at: Millis,
}

/// What this node knows of one remote publisher besides its records.
#[derive(Default)]
struct PublisherState {
    heard: Heard,
    list: Option<KnownList>,
    /// Its leave, with the leave's seq: the tombstones of that leave hold until a heartbeat sent after
    /// it shows the publisher back.
    left: Option<u64>,
    /// Last time anything of this publisher arrived, for eviction order.
    touched: Millis,
    /// Declared down (failure detection), with the declaration's `last_seen`: heartbeats sent up to
    /// then are old news; a later one shows it alive and clears this.
    down: Option<u64>,
}

/// Per-publisher mesh state, bounded in publishers and in list entries.
#[derive(Default)]
struct Publishers {
    map: HashMap<PeerId, PublisherState>,
    /// Entries of every list held.
    list_entries: usize,
    /// The bound on `list_entries`.
    max_list_entries: usize,
}

impl Publishers {
    fn over_bounds(&self) -> bool {
        self.map.len() > MAX_TRACKED_PUBLISHERS || self.list_entries > self.max_list_entries
    }

    fn set_list(&mut self, publisher: PeerId, list: Option<KnownList>) {
        let Some(state) = self.map.get_mut(&publisher) else { return };
        let added = list.as_ref().map_or(0, |l| l.agents.len());
        let removed = std::mem::replace(&mut state.list, list).map_or(0, |l| l.agents.len());
        self.list_entries = self.list_entries + added - removed;
    }

    fn remove(&mut self, publisher: &PeerId) {
        if let Some(state) = self.map.remove(publisher) {
            self.list_entries -= state.list.map_or(0, |l| l.agents.len());
        }
    }

    /// Publishers by how little they matter: no record here first, then least recently heard.
    fn eviction_order(&self, holds: impl Fn(&PeerId) -> bool, keep: PeerId) -> Vec<PeerId> {
        let mut order: Vec<(bool, Millis, PeerId)> =
            self.map.iter().filter(|(p, _)| **p != keep).map(|(p, s)| (holds(p), s.touched, *p)).collect();
        order.sort_unstable_by_key(|&(holds, touched, _)| (holds, touched));
        order.into_iter().map(|(_, _, p)| p).collect()
    }

    /// Brings the table back under its bounds, sparing `keep` (the publisher just heard). Trims to 7/8
    /// of a bound at once, so a stream of fresh keys pays for one sort per many arrivals.
    fn bound(&mut self, holds: impl Fn(&PeerId) -> bool, keep: PeerId) {
        if self.map.len() > MAX_TRACKED_PUBLISHERS {
            let target = MAX_TRACKED_PUBLISHERS - MAX_TRACKED_PUBLISHERS / 8;
            let excess = self.map.len() - target;
            for publisher in self.eviction_order(&holds, keep).into_iter().take(excess) {
                self.remove(&publisher);
            }
        }
        if self.list_entries > self.max_list_entries {
            let target = self.max_list_entries - self.max_list_entries / 8;
            for publisher in self.eviction_order(&holds, keep) {
                if self.list_entries <= target {
                    break;
                }
                self.set_list(publisher, None);
            }
        }
    }
}

#[derive(Default)]
struct Counts {
    per_publisher: HashMap<PeerId, usize>,
    total: usize,
}

/// Mesh bookkeeping that lives beside the view, in memory only.
#[derive(Default)]
pub(super) struct RemoteState {
    limits: Limits,
    /// Records removed recently, with the removal's seq and when: an older card arriving later (a
    /// replay, or a slow path through the mesh) must not bring the agent back. At most
    /// `MAX_TOMBSTONES`, forgotten after `evict_after`.
    tombstones: Mutex<HashMap<RecordKey, (u64, Millis)>>,
    /// Records held per remote publisher, bounded by `Limits::per_publisher`, and in all.
    counts: Mutex<Counts>,
    /// Newest heartbeat, agent list and leave per publisher. Lock order: `publishers`, then `counts`.
    publishers: Mutex<Publishers>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl RemoteState {
    pub(super) fn new(limits: Limits) -> Self {
        let max_list_entries = LIST_ENTRIES_PER_RECORD * limits.remote_records;
        let publishers = Mutex::new(Publishers { max_list_entries, ..Publishers::default() });
        Self { limits, publishers, ..Self::default() }
    }

    pub(super) fn limits(&self) -> Limits {
        self.limits
    }

    pub(super) fn outranks_tombstone(&self, key: &RecordKey, seq: u64) -> bool {
        lock(&self.tombstones).get(key).is_none_or(|&(removed, _)| seq > removed)
    }

    /// A heartbeat sent at `sent_at`: if the publisher had left before then, it is back, and the
    /// tombstones of its leave no longer hide the records it still holds (at their old seqs).
    fn returned(&self, state: &mut PublisherState, publisher: PeerId, sent_at: u64) {
        let Some(leave) = state.left else { return };
        if sent_at > leave {
            state.left = None;
            lock(&self.tombstones).retain(|key, &mut (seq, _)| key.publisher != publisher || seq != leave);
        }
    }

    pub(super) fn remember_tombstone(&self, key: RecordKey, seq: u64, now: Millis) {
        let mut tombstones = lock(&self.tombstones);
        let slot = tombstones.entry(key).or_insert((seq, now));
        if seq >= slot.0 {
            *slot = (seq, now);
        }
        if tombstones.len() > MAX_TOMBSTONES {
            // The oldest eighth goes: an older copy of one of those cards could come back, which is
            // what eviction would allow later anyway.
            let mut ages: Vec<Millis> = tombstones.values().map(|&(_, at)| at).collect();
            let cut = ages.len() - (MAX_TOMBSTONES - MAX_TOMBSTONES / 8);
            let (_, &mut horizon, _) = ages.select_nth_unstable(cut);
            tombstones.retain(|_, &mut (_, at)| at > horizon);
        }
    }

    /// Brings the publisher table back under its bounds (called with it locked: lock order
    /// `publishers`, then `counts`).
    fn trim_publishers(&self, publishers: &mut Publishers, keep: PeerId) {
        if publishers.over_bounds() {
            let counts = lock(&self.counts);
            publishers.bound(|p| counts.per_publisher.contains_key(p), keep);
        }
    }

    /// Counts a new record of `publisher`, unless the publisher or the whole view is at its limit.
    pub(super) fn admit(&self, publisher: PeerId) -> Result<(), Limit> {
        let mut counts = lock(&self.counts);
        let Counts { per_publisher, total } = &mut *counts;
        let count = per_publisher.entry(publisher).or_default();
        if *count >= self.limits.per_publisher {
            return Err(Limit::Publisher);
        }
        if *total >= self.limits.remote_records {
            if *count == 0 {
                per_publisher.remove(&publisher);
            }
            return Err(Limit::View);
        }
        *count += 1;
        *total += 1;
        Ok(())
    }

    /// Counts a record loaded from the store (limits apply to what arrives, not to what was kept).
    pub(super) fn count_loaded(&self, publisher: PeerId) {
        let mut counts = lock(&self.counts);
        *counts.per_publisher.entry(publisher).or_default() += 1;
        counts.total += 1;
    }

    /// Uncounts a record; true when that was the publisher's last one here.
    pub(super) fn release(&self, publisher: PeerId) -> bool {
        let mut counts = lock(&self.counts);
        let Counts { per_publisher, total } = &mut *counts;
        let Some(count) = per_publisher.get_mut(&publisher) else { return false };
        *count = count.saturating_sub(1);
        *total = total.saturating_sub(1);
        if *count == 0 {
            per_publisher.remove(&publisher);
            return true;
        }
        false
    }

    /// Publishers tracked and list entries held (status and tests).
    pub(super) fn tracked(&self) -> (usize, usize) {
        let publishers = lock(&self.publishers);
        (publishers.map.len(), publishers.list_entries)
    }

    /// Tombstones held (status and tests).
    pub(super) fn tombstones(&self) -> usize {
        lock(&self.tombstones).len()
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

/// A list as it arrived: its agents and the signed messages that carried it.
type CarriedList = (Vec<HeartbeatAgent>, Vec<Arc<[u8]>>);

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
        let carried = body.agents.as_ref().map(|agents| (agents.clone(), vec![Arc::<[u8]>::from(signed)]));
        self.heard(publisher, Some(body.sent_at), body.digest, carried, now)
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

    /// A heartbeat (`sent_at` set) or a fetched list (`None`) of `publisher`, naming list `digest`, and
    /// carrying the list itself when `carried`.
    fn heard(
        &self,
        publisher: PeerId,
        sent_at: Option<u64>,
        digest: u64,
        carried: Option<CarriedList>,
        now: Millis,
    ) -> HeartbeatOutcome {
        let mut outcome = HeartbeatOutcome::default();
        if publisher == self.me {
            return outcome;
        }
        let (heard, list) = {
            let mut publishers = lock(&self.remote.publishers);
            let known = publishers.map.get(&publisher);
            let newer = sent_at.is_some_and(|at| {
                known.is_none_or(|s| at > s.heard.sent_at && s.down.is_none_or(|last_seen| at > last_seen))
            });
            // Only a newer heartbeat makes an entry: a replay, or a list nobody asked for, of a
            // publisher not tracked here leaves nothing behind.
            let state = if newer {
                let state = publishers.map.entry(publisher).or_default();
                state.heard = Heard { sent_at: sent_at.unwrap_or_default(), digest, at: now };
                state.down = None;
                state
            } else {
                let wanted = carried.is_some()
                    && known.is_some_and(|s| {
                        s.heard.at > 0
                            && s.down.is_none()
                            && digest == s.heard.digest
                            && s.list.as_ref().is_none_or(|l| l.digest != digest)
                    });
                let Some(state) = publishers.map.get_mut(&publisher).filter(|_| wanted) else {
                    outcome.replayed = true;
                    return outcome;
                };
                outcome.list_installed = true;
                state
            };
            state.touched = now;
            if let Some(at) = sent_at {
                self.remote.returned(state, publisher, at);
            }
            let heard = state.heard;
            let list = match carried {
                Some((agents, signed)) => {
                    let agents = Arc::new(agents);
                    let known = KnownList { digest, agents: agents.clone(), signed: signed.into() };
                    publishers.set_list(publisher, Some(known));
                    Some(agents)
                }
                None => state.list.as_ref().filter(|l| l.digest == digest).map(|l| l.agents.clone()),
            };
            self.remote.trim_publishers(&mut publishers, publisher);
            (heard, list)
        };
        let snapshot = self.snapshot();
        let list = list.unwrap_or_else(|| {
            // A list this node missed: the publisher is alive, so its agents held here stay fresh with
            // the states last heard until the fetched list arrives.
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
        });
        let mut changed = false;
        for agent in list.iter() {
            match snapshot.get(&agent.agent_id, &publisher) {
                Some(entry) if entry.seq >= agent.seq => {
                    changed |= entry.beat_changes_health(heard.at, agent.reported, &self.thresholds);
                    outcome.refreshed += 1;
                }
                _ => outcome.missing.push((agent.agent_id.clone(), agent.seq)),
            }
        }
        if changed {
            self.health_epoch.fetch_add(1, Ordering::AcqRel);
        }
        outcome
    }

    /// Applies a declaration that `publisher` is down, made by a node whose newest heartbeat of it was
    /// sent at `last_seen`: its agents held here turn offline (derived health `inactive`) until a
    /// heartbeat sent after `last_seen` arrives. Ignored when this node heard a newer heartbeat, or the
    /// publisher is unknown here; true when it changed something.
    pub fn remote_down(&self, publisher: PeerId, last_seen: u64) -> bool {
        if publisher == self.me {
            return false;
        }
        {
            let mut publishers = lock(&self.remote.publishers);
            let Some(state) = publishers.map.get_mut(&publisher) else { return false };
            if state.heard.sent_at > last_seen || state.down.is_some_and(|d| d >= last_seen) {
                return false;
            }
            state.down = Some(last_seen);
        }
        let snapshot = self.snapshot();
        let mut marked = 0;
        for entry in snapshot.entries.iter().filter(|e| e.key.publisher == publisher) {
            entry.down();
            marked += 1;
        }
        self.health_epoch.fetch_add(1, Ordering::AcqRel);
        tracing::info!(%publisher, agents = marked, "publisher declared down");
        true
    }

    /// The `sent_at` of the newest heartbeat heard of `publisher`, if any.
    pub fn heard_sent_at(&self, publisher: &PeerId) -> Option<u64> {
        let publishers = lock(&self.remote.publishers);
        publishers.map.get(publisher).map(|s| s.heard.sent_at).filter(|&at| at > 0)
    }

    /// The current agent list of each remote publisher of these updates, with when its newest heartbeat
    /// was heard.
    pub(super) fn remote_lists(
        &self,
        updates: &[super::Update],
    ) -> HashMap<PeerId, (Millis, Arc<Vec<HeartbeatAgent>>)> {
        let publishers = lock(&self.remote.publishers);
        let mut lists = HashMap::new();
        for update in updates {
            if let super::Update::Upsert { publisher, origin: Origin::Remote, .. } = update {
                if lists.contains_key(publisher) {
                    continue;
                }
                let Some(state) = publishers.map.get(publisher) else { continue };
                if let Some(list) =
                    state.list.as_ref().filter(|l| l.digest == state.heard.digest && state.heard.at > 0)
                {
                    lists.insert(*publisher, (state.heard.at, list.agents.clone()));
                }
            }
        }
        lists
    }

    /// The signed messages that carried `publisher`'s current agent list, for a node that missed it.
    pub fn signed_list(&self, publisher: &PeerId) -> Option<SignedList> {
        let publishers = lock(&self.remote.publishers);
        let state = publishers.map.get(publisher)?;
        state.list.as_ref().filter(|l| l.digest == state.heard.digest).map(|l| l.signed.clone())
    }

    /// Publishers tracked, list entries and tombstones held: the bounded mesh state.
    pub fn mesh_state_size(&self) -> (usize, usize, usize) {
        let (publishers, list_entries) = self.remote.tracked();
        (publishers, list_entries, self.remote.tombstones())
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
        let mut publishers = lock(&self.remote.publishers);
        publishers.remove(&publisher);
        publishers
            .map
            .insert(publisher, PublisherState { left: Some(seq), touched: now, ..Default::default() });
        self.remote.trim_publishers(&mut publishers, publisher);
        Ok(doomed.len())
    }

    /// Drops remote records not heard of for `evict_after`, and tombstones older than that.
    pub async fn evict(&self, now: Millis, evict_after: Duration) -> Result<usize, RegistryError> {
        let evicted = self.evict_records(now, evict_after).await?;
        // Then the publishers not heard of since the horizon that hold nothing here any more.
        let horizon = now.saturating_sub(evict_after.as_millis() as u64);
        let mut publishers = lock(&self.remote.publishers);
        let counts = lock(&self.remote.counts);
        let silent: Vec<PeerId> = publishers
            .map
            .iter()
            .filter(|(p, s)| s.touched < horizon && !counts.per_publisher.contains_key(p))
            .map(|(p, _)| *p)
            .collect();
        drop(counts);
        for publisher in &silent {
            publishers.remove(publisher);
        }
        Ok(evicted)
    }

    async fn evict_records(&self, now: Millis, evict_after: Duration) -> Result<usize, RegistryError> {
        let horizon = now.saturating_sub(evict_after.as_millis() as u64);
        lock(&self.remote.tombstones).retain(|_, &mut (_, at)| at >= horizon);
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
                self.release(key.publisher);
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
            self.release(key.publisher);
        }
        if !gone.is_empty() {
            self.store.flush().await?;
            self.publish(&map);
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
            let (publishers, list_entries) = r.remote.tracked();
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
        assert_eq!(r.remote.tracked().0, 0, "the honest one was silent too, and evicted with its record");
    }

    #[test]
    fn tombstones_are_bounded_oldest_first() {
        let state = RemoteState::new(Limits::default());
        let publisher = PeerId::random();
        let key = |i: usize| RecordKey { agent_id: format!("a{i}"), publisher };
        for i in 0..MAX_TOMBSTONES + 10 {
            state.remember_tombstone(key(i), 1, i as u64);
        }
        assert!(state.tombstones() <= MAX_TOMBSTONES);
        assert!(!state.outranks_tombstone(&key(MAX_TOMBSTONES + 9), 1), "the newest is kept");
        assert!(state.outranks_tombstone(&key(0), 1), "the oldest went");
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
