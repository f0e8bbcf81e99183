//! The rules of remote records, free of I/O: which card version wins, tombstones, per-publisher and
//! view limits, leave and return, heartbeat lists, declarations of a publisher down, and eviction.
//!
//! [`Records`] decides; whoever holds the cards (the registry's view and store in the daemon, a map in
//! the simulator) carries out. It never reads a clock: every call that depends on time takes `now`.
//!
//! Every map here is bounded by a named limit (`crate::defaults`): publishers tracked
//! (`MAX_TRACKED_PUBLISHERS`), list entries (`LIST_ENTRIES_PER_RECORD` per record the view may hold),
//! tombstones (`MAX_TOMBSTONES`), and the records themselves ([`Limits`]). Beyond a bound, what matters
//! least goes first: state of publishers that hold no record here, least recently heard first; the
//! oldest tombstones.

use std::collections::HashMap;
use std::sync::Arc;

use libp2p::identity::PeerId;

use crate::card::reported::Reported;
use crate::clock::Millis;
use crate::defaults::{self, LIST_ENTRIES_PER_RECORD, MAX_TOMBSTONES, MAX_TRACKED_PUBLISHERS};
use crate::wire::HeartbeatAgent;

/// A record's identity: the same agent id from two publishers is two records.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct RecordKey {
    pub agent_id: String,
    pub publisher: PeerId,
}

/// The rule of versions: highest seq wins; equal or older is stale.
pub fn accepts(held: Option<u64>, incoming: u64) -> bool {
    held.is_none_or(|held| incoming > held)
}

/// The rule of leaving: a publisher's goodbye at `leave_seq` removes its records held at older seqs (a
/// card it published after saying goodbye stays).
pub fn left_behind(held_seq: u64, leave_seq: u64) -> bool {
    held_seq < leave_seq
}

/// The rule of eviction: a remote record is evicted once nothing has been heard of it since `horizon`
/// (no heartbeat naming it, and it did not arrive since); local records never are.
pub fn silent(remote: bool, last_heard: Option<Millis>, arrived: Millis, horizon: Millis) -> bool {
    remote && last_heard.unwrap_or(arrived) < horizon
}

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

/// What to do with a card version that arrived.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admission {
    /// Take it: it replaces the version held (`created` false) or is new here (`created` true; a new
    /// remote record is counted against the limits already, see [`Records::release`]).
    Take { created: bool },
    /// Not newer than what is held or than the removal remembered.
    Stale,
    /// New here, but its publisher or the view is full.
    Over(Limit),
}

/// The signed messages that carry an agent list: one heartbeat, or every chunk of a long list.
pub type SignedList = Arc<[Arc<[u8]>]>;

/// An agent list as it arrived: its agents and the signed messages that carried it.
pub type CarriedList = (Vec<HeartbeatAgent>, Vec<Arc<[u8]>>);

/// A publisher's agent list, its digest, and the signed messages that carried it (the heartbeat, or
/// the chunks of a long list), served to nodes that missed it.
struct KnownList {
    digest: u64,
    agents: Arc<Vec<HeartbeatAgent>>,
    signed: SignedList,
}

/// The newest heartbeat heard from a publisher.
#[derive(Clone, Default)]
struct Newest {
    sent_at: u64,
    digest: u64,
    /// When it arrived (this node's clock).
    at: Millis,
    /// The heartbeat as its publisher signed it, when the caller kept it (see [`Records::keep_signed`]):
    /// what a node that just joined is given (see [`Records::newest_heartbeats`]).
    signed: Option<Arc<[u8]>>,
}

/// A publisher's newest heartbeat, as [`Records::newest_heartbeats`] gives it.
#[derive(Debug, Clone)]
pub struct Alive {
    pub publisher: PeerId,
    pub sent_at: u64,
    pub digest: u64,
    /// The heartbeat as signed, when kept.
    pub signed: Option<Arc<[u8]>>,
    /// The signed messages that carried the list it names, when held (as [`Records::signed_list`]).
    pub list: Option<SignedList>,
}

/// What this node knows of one remote publisher besides its records.
#[derive(Default)]
struct PublisherState {
    newest: Newest,
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
        order.sort_unstable();
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

/// What a heartbeat (or a fetched list) means for the records of its publisher.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Heard {
    /// An older or repeated heartbeat: ignored.
    pub replayed: bool,
    /// An older heartbeat that brought the list of the newest digest (fetched after `unknown_list`).
    pub list_installed: bool,
    /// A digest-only heartbeat whose list this node does not hold: fetch it from the sender. Meanwhile
    /// the publisher's records held here count as heard with their last reported state.
    pub unknown_list: bool,
    /// When the newest heartbeat arrived: the liveness the list's agents get.
    pub at: Millis,
    /// The publisher's current list, when known.
    pub list: Option<Arc<Vec<HeartbeatAgent>>>,
}

/// How a list compares with the records held: which to refresh, which are missing.
#[derive(Debug, PartialEq, Eq)]
pub struct Beats<T> {
    /// Records held at the listed seq or newer (as `held` gave them): alive as of the heartbeat, in
    /// the state reported.
    pub refresh: Vec<(T, Reported)>,
    /// Agents named at a seq this node lacks, with that seq: fetch their cards from the sender.
    pub missing: Vec<(String, u64)>,
}

/// The messages of `list` that follow `heartbeat` in an answer: all of them but the heartbeat itself,
/// when it is the one that carried the list (a list is never sent twice in one answer).
pub fn after<'a>(heartbeat: &'a [u8], list: &'a SignedList) -> impl Iterator<Item = &'a Arc<[u8]>> + Clone {
    list.iter().filter(move |m| m[..] != *heartbeat)
}

/// Compares a publisher's agent list with the records held (`held(agent_id)`: the record held and its
/// seq). Nothing is copied for the agents held, the common case of every heartbeat.
pub fn beats<'a, T>(
    list: &'a [HeartbeatAgent],
    mut held: impl FnMut(&'a str) -> Option<(T, u64)>,
) -> Beats<T> {
    let mut beats = Beats { refresh: Vec::with_capacity(list.len()), missing: Vec::new() };
    for agent in list {
        match held(&agent.agent_id) {
            Some((record, seq)) if seq >= agent.seq => beats.refresh.push((record, agent.reported)),
            _ => beats.missing.push((agent.agent_id.clone(), agent.seq)),
        }
    }
    beats
}

/// Mesh bookkeeping of the remote records, beside the view.
pub struct Records {
    me: PeerId,
    limits: Limits,
    /// Records removed recently, with the removal's seq and when: an older card arriving later (a
    /// replay, or a slow path through the mesh) must not bring the agent back. At most
    /// `MAX_TOMBSTONES`, forgotten at eviction.
    tombstones: HashMap<RecordKey, (u64, Millis)>,
    /// Records held per remote publisher, bounded by `Limits::per_publisher`, and in all.
    counts: Counts,
    /// Newest heartbeat, agent list, leave and declaration per publisher.
    publishers: Publishers,
}

impl Records {
    pub fn new(me: PeerId, limits: Limits) -> Self {
        let max_list_entries = LIST_ENTRIES_PER_RECORD * limits.remote_records;
        Self {
            me,
            limits,
            tombstones: HashMap::new(),
            counts: Counts::default(),
            publishers: Publishers { max_list_entries, ..Publishers::default() },
        }
    }

    pub fn limits(&self) -> Limits {
        self.limits
    }

    /// Decides on a card version `seq` of `key`, remote or this node's own, while `held` is held.
    /// A new remote record that is taken is counted against the limits at once.
    pub fn admit(&mut self, key: &RecordKey, held: Option<u64>, seq: u64, remote: bool) -> Admission {
        if !accepts(held, seq) || !self.outranks_tombstone(key, seq) {
            return Admission::Stale;
        }
        let created = held.is_none();
        if created && remote {
            if let Err(limit) = self.count(key.publisher) {
                return Admission::Over(limit);
            }
        }
        Admission::Take { created }
    }

    fn outranks_tombstone(&self, key: &RecordKey, seq: u64) -> bool {
        self.tombstones.get(key).is_none_or(|&(removed, _)| seq > removed)
    }

    /// Counts a new record of `publisher`, unless the publisher or the whole view is at its limit.
    fn count(&mut self, publisher: PeerId) -> Result<(), Limit> {
        let Counts { per_publisher, total } = &mut self.counts;
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
    pub fn count_loaded(&mut self, publisher: PeerId) {
        *self.counts.per_publisher.entry(publisher).or_default() += 1;
        self.counts.total += 1;
    }

    /// Uncounts a remote record that went (removed, evicted, or a write that failed after
    /// [`Records::admit`]); true when that was the publisher's last one here.
    pub fn release(&mut self, publisher: PeerId) -> bool {
        let Counts { per_publisher, total } = &mut self.counts;
        let Some(count) = per_publisher.get_mut(&publisher) else { return false };
        *count = count.saturating_sub(1);
        *total = total.saturating_sub(1);
        if *count == 0 {
            per_publisher.remove(&publisher);
            return true;
        }
        false
    }

    /// A record was removed at `seq`: remember it, so that an older card cannot bring it back.
    pub fn removed(&mut self, key: RecordKey, seq: u64, now: Millis) {
        let slot = self.tombstones.entry(key).or_insert((seq, now));
        if seq >= slot.0 {
            *slot = (seq, now);
        }
        if self.tombstones.len() > MAX_TOMBSTONES {
            // The oldest eighth goes: an older copy of one of those cards could come back, which is
            // what eviction would allow later anyway.
            let mut ages: Vec<Millis> = self.tombstones.values().map(|&(_, at)| at).collect();
            let cut = ages.len() - (MAX_TOMBSTONES - MAX_TOMBSTONES / 8);
            let (_, &mut horizon, _) = ages.select_nth_unstable(cut);
            self.tombstones.retain(|_, &mut (_, at)| at > horizon);
        }
    }

    fn trim_publishers(&mut self, keep: PeerId) {
        if self.publishers.over_bounds() {
            let counts = &self.counts;
            self.publishers.bound(|p| counts.per_publisher.contains_key(p), keep);
        }
    }

    /// A heartbeat of `publisher` sent at `sent_at` (`None`: a fetched list, not a heartbeat), naming
    /// list `digest` and carrying the list itself when `carried`, received at `now`. Liveness never
    /// depends on the publisher's clock, only the ordering of its heartbeats does.
    ///
    /// An older heartbeat is a replay, except one that carries the list of the newest digest heard (the
    /// answer to a list fetch): that list is installed, and its agents count as heard when the newest
    /// heartbeat arrived, never later, so replaying it cannot keep a silent publisher alive.
    pub fn heard(
        &mut self,
        publisher: PeerId,
        sent_at: Option<u64>,
        digest: u64,
        carried: Option<CarriedList>,
        now: Millis,
    ) -> Heard {
        let mut heard = Heard::default();
        if publisher == self.me {
            heard.replayed = true;
            return heard;
        }
        let known = self.publishers.map.get(&publisher);
        let newer = sent_at.is_some_and(|at| {
            known.is_none_or(|s| at > s.newest.sent_at && s.down.is_none_or(|last_seen| at > last_seen))
        });
        // Only a newer heartbeat makes an entry: a replay, or a list nobody asked for, of a publisher
        // not tracked here leaves nothing behind.
        let state = if newer {
            let state = self.publishers.map.entry(publisher).or_default();
            state.newest = Newest { sent_at: sent_at.unwrap_or_default(), digest, at: now, signed: None };
            state.down = None;
            state
        } else {
            let wanted = carried.is_some()
                && known.is_some_and(|s| {
                    s.newest.at > 0
                        && s.down.is_none()
                        && digest == s.newest.digest
                        && s.list.as_ref().is_none_or(|l| l.digest != digest)
                });
            let Some(state) = self.publishers.map.get_mut(&publisher).filter(|_| wanted) else {
                heard.replayed = true;
                return heard;
            };
            heard.list_installed = true;
            state
        };
        state.touched = now;
        heard.at = state.newest.at;
        let returned = match (sent_at, state.left) {
            (Some(at), Some(leave)) if at > leave => {
                state.left = None;
                Some(leave)
            }
            _ => None,
        };
        heard.list = match carried {
            Some((agents, signed)) => {
                let agents = Arc::new(agents);
                let known = KnownList { digest, agents: agents.clone(), signed: signed.into() };
                self.publishers.set_list(publisher, Some(known));
                Some(agents)
            }
            None => state.list.as_ref().filter(|l| l.digest == digest).map(|l| l.agents.clone()),
        };
        heard.unknown_list = heard.list.is_none();
        if let Some(leave) = returned {
            // Back after its leave: the tombstones of that leave no longer hide the records it still
            // holds (at their old seqs).
            self.tombstones.retain(|key, &mut (seq, _)| key.publisher != publisher || seq != leave);
        }
        self.trim_publishers(publisher);
        heard
    }

    /// A declaration that `publisher` is down, made by a node whose newest heartbeat of it was sent at
    /// `last_seen`: true when it holds here (the publisher is known, and no newer heartbeat was heard),
    /// and its records should turn offline until a heartbeat sent after `last_seen` arrives.
    pub fn down(&mut self, publisher: PeerId, last_seen: u64) -> bool {
        if publisher == self.me {
            return false;
        }
        let Some(state) = self.publishers.map.get_mut(&publisher) else { return false };
        if state.newest.sent_at > last_seen || state.down.is_some_and(|d| d >= last_seen) {
            return false;
        }
        state.down = Some(last_seen);
        true
    }

    /// Keeps the signed message of `publisher`'s heartbeat sent at `sent_at`, when that is the newest
    /// heard (call it after [`Records::heard`] took the heartbeat).
    pub fn keep_signed(&mut self, publisher: &PeerId, sent_at: u64, signed: Arc<[u8]>) {
        if let Some(state) = self.publishers.map.get_mut(publisher) {
            if state.newest.sent_at == sent_at && state.newest.at > 0 {
                state.newest.signed = Some(signed);
            }
        }
    }

    /// The newest heartbeat of every publisher whose newest heartbeat arrived at `since` or later and
    /// that no declaration has marked down since: who is alive, as this node knows it. A node that just
    /// joined asks a peer for these (the heartbeat topic would take a heartbeat interval or more to
    /// tell it). At most `max` of them, the most recently heard first.
    pub fn newest_heartbeats(&self, since: Millis, max: usize) -> Vec<Alive> {
        let mut alive: Vec<(Millis, Alive)> = self
            .publishers
            .map
            .iter()
            .filter(|(_, s)| s.newest.at > 0 && s.newest.at >= since && s.down.is_none() && s.left.is_none())
            .map(|(p, s)| {
                let n = &s.newest;
                (
                    n.at,
                    Alive {
                        publisher: *p,
                        sent_at: n.sent_at,
                        digest: n.digest,
                        signed: n.signed.clone(),
                        list: s.list.as_ref().filter(|l| l.digest == n.digest).map(|l| l.signed.clone()),
                    },
                )
            })
            .collect();
        alive.sort_unstable_by(|a, b| b.0.cmp(&a.0).then(a.1.publisher.cmp(&b.1.publisher)));
        alive.into_iter().take(max).map(|(_, alive)| alive).collect()
    }

    /// The `sent_at` of the newest heartbeat heard of `publisher`, if any.
    pub fn heard_sent_at(&self, publisher: &PeerId) -> Option<u64> {
        self.publishers.map.get(publisher).map(|s| s.newest.sent_at).filter(|&at| at > 0)
    }

    /// `publisher`'s current agent list, with when its newest heartbeat arrived.
    pub fn current_list(&self, publisher: &PeerId) -> Option<(Millis, Arc<Vec<HeartbeatAgent>>)> {
        let state = self.publishers.map.get(publisher)?;
        let list = state.list.as_ref().filter(|l| l.digest == state.newest.digest && state.newest.at > 0)?;
        Some((state.newest.at, list.agents.clone()))
    }

    /// The signed messages that carried `publisher`'s current agent list, for a node that missed it.
    pub fn signed_list(&self, publisher: &PeerId) -> Option<SignedList> {
        let state = self.publishers.map.get(publisher)?;
        state.list.as_ref().filter(|l| l.digest == state.newest.digest).map(|l| l.signed.clone())
    }

    /// `publisher` left at `seq` (its records older than `seq` are gone, each remembered through
    /// [`Records::removed`]): forget what was known of it but the leave.
    pub fn left(&mut self, publisher: PeerId, seq: u64, now: Millis) {
        if publisher == self.me {
            return;
        }
        self.publishers.remove(&publisher);
        self.publishers
            .map
            .insert(publisher, PublisherState { left: Some(seq), touched: now, ..Default::default() });
        self.trim_publishers(publisher);
    }

    /// Forgets tombstones older than `horizon`, and publishers not heard of since then that hold no
    /// record here any more (call after evicting the silent records).
    pub fn evict(&mut self, horizon: Millis) {
        self.tombstones.retain(|_, &mut (_, at)| at >= horizon);
        let counts = &self.counts;
        let silent: Vec<PeerId> = self
            .publishers
            .map
            .iter()
            .filter(|(p, s)| s.touched < horizon && !counts.per_publisher.contains_key(p))
            .map(|(p, _)| *p)
            .collect();
        for publisher in &silent {
            self.publishers.remove(publisher);
        }
    }

    /// Publishers tracked, list entries and tombstones held: the bounded mesh state.
    pub fn sizes(&self) -> (usize, usize, usize) {
        (self.publishers.map.len(), self.publishers.list_entries, self.tombstones.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(id: &str, publisher: PeerId) -> RecordKey {
        RecordKey { agent_id: id.to_owned(), publisher }
    }

    fn agent(id: &str, seq: u64) -> HeartbeatAgent {
        HeartbeatAgent { agent_id: id.to_owned(), seq, reported: Reported::Ready }
    }

    #[test]
    fn a_leave_removes_older_records_and_silence_evicts_remote_ones_only() {
        assert!(
            left_behind(4, 5) && !left_behind(5, 5) && !left_behind(6, 5),
            "cards after the goodbye stay"
        );
        // Heard at 100 (a heartbeat named it), arrived at 10: silent before a horizon past 100 only.
        assert!(!silent(true, Some(100), 10, 100) && silent(true, Some(100), 10, 101));
        // Never named by a heartbeat: its arrival counts.
        assert!(!silent(true, None, 10, 10) && silent(true, None, 10, 11));
        assert!(!silent(false, None, 0, Millis::MAX), "local records are never evicted");
    }

    #[test]
    fn versions_tombstones_and_limits_decide_admission() {
        let (me, p) = (PeerId::random(), PeerId::random());
        let mut r = Records::new(me, Limits { per_publisher: 2, remote_records: 3 });
        let a = key("a", p);
        assert_eq!(r.admit(&a, None, 5, true), Admission::Take { created: true });
        assert_eq!(r.admit(&a, Some(5), 5, true), Admission::Stale);
        assert_eq!(r.admit(&a, Some(5), 6, true), Admission::Take { created: false });
        // Removed at 7: the card of seq 6 cannot come back; a later one can.
        r.release(p);
        r.removed(a.clone(), 7, 100);
        assert_eq!(r.admit(&a, None, 6, true), Admission::Stale);
        assert_eq!(r.admit(&a, None, 8, true), Admission::Take { created: true });
        assert_eq!(r.admit(&key("b", p), None, 1, true), Admission::Take { created: true });
        assert_eq!(r.admit(&key("c", p), None, 1, true), Admission::Over(Limit::Publisher));
        let q = PeerId::random();
        assert_eq!(r.admit(&key("a", q), None, 1, true), Admission::Take { created: true });
        assert_eq!(r.admit(&key("b", q), None, 1, true), Admission::Over(Limit::View));
        // This node's own records are not counted against remote limits.
        assert_eq!(r.admit(&key("x", me), None, 1, false), Admission::Take { created: true });
    }

    #[test]
    fn newer_heartbeats_count_and_replays_do_not() {
        let p = PeerId::random();
        let mut r = Records::new(PeerId::random(), Limits::default());
        let list = vec![agent("a", 3)];
        let h = r.heard(p, Some(10), 1, Some((list.clone(), vec![])), 1_000);
        assert!(!h.replayed && !h.unknown_list);
        assert_eq!(h.at, 1_000);
        assert!(r.heard(p, Some(10), 1, None, 2_000).replayed);
        // A digest-only heartbeat of the same list: the list held is used.
        let h = r.heard(p, Some(11), 1, None, 3_000);
        assert_eq!(h.list.as_deref(), Some(&list));
        // A new digest: unknown until fetched; a fetched older heartbeat installs it at the time the
        // newest arrived, never later.
        let h = r.heard(p, Some(12), 2, None, 4_000);
        assert!(h.unknown_list);
        let h = r.heard(p, Some(11), 2, Some((vec![agent("b", 1)], vec![])), 9_000);
        assert!(h.list_installed);
        assert_eq!(h.at, 4_000);
        assert_eq!(r.current_list(&p).map(|(at, l)| (at, l.len())), Some((4_000, 1)));
    }

    #[test]
    fn a_declaration_holds_until_a_later_heartbeat() {
        let p = PeerId::random();
        let mut r = Records::new(PeerId::random(), Limits::default());
        assert!(!r.down(p, 5), "an unknown publisher is not declared down");
        r.heard(p, Some(10), 1, None, 1_000);
        assert!(!r.down(p, 9), "a declaration older than the newest heartbeat");
        assert!(r.down(p, 10));
        assert!(!r.down(p, 10), "the same declaration again changes nothing");
        assert!(r.heard(p, Some(10), 1, None, 2_000).replayed);
        assert!(!r.heard(p, Some(11), 1, None, 2_000).replayed);
        assert!(r.down(p, 11));
    }

    #[test]
    fn a_publisher_back_after_its_leave_lifts_its_tombstones() {
        let p = PeerId::random();
        let mut r = Records::new(PeerId::random(), Limits::default());
        let a = key("a", p);
        r.removed(a.clone(), 50, 100);
        r.left(p, 50, 100);
        assert_eq!(r.admit(&a, None, 40, true), Admission::Stale);
        r.heard(p, Some(51), 1, None, 200);
        assert_eq!(r.admit(&a, None, 40, true), Admission::Take { created: true });
    }

    #[test]
    fn lists_compare_with_what_is_held() {
        let list = vec![agent("a", 3), agent("b", 4), agent("c", 1)];
        let held = |id: &str| match id {
            "a" => Some(("record a", 3)),
            "b" => Some(("record b", 2)),
            _ => None,
        };
        let b = beats(&list, held);
        assert_eq!(b.refresh, vec![("record a", Reported::Ready)]);
        assert_eq!(b.missing, vec![("b".to_owned(), 4), ("c".to_owned(), 1)]);
    }

    #[test]
    fn tombstones_are_bounded_oldest_first() {
        let mut r = Records::new(PeerId::random(), Limits::default());
        let publisher = PeerId::random();
        let key = |i: usize| RecordKey { agent_id: format!("a{i}"), publisher };
        for i in 0..MAX_TOMBSTONES + 10 {
            r.removed(key(i), 1, i as u64);
        }
        assert!(r.sizes().2 <= MAX_TOMBSTONES);
        assert!(!r.outranks_tombstone(&key(MAX_TOMBSTONES + 9), 1), "the newest is kept");
        assert!(r.outranks_tombstone(&key(0), 1), "the oldest went");
    }

    #[test]
    fn eviction_forgets_old_tombstones_and_silent_publishers() {
        let (p, q) = (PeerId::random(), PeerId::random());
        let mut r = Records::new(PeerId::random(), Limits::default());
        r.heard(p, Some(1), 1, None, 100);
        r.heard(q, Some(1), 1, None, 100);
        r.count_loaded(q);
        r.removed(key("a", p), 3, 100);
        r.evict(1_000);
        assert_eq!(r.sizes(), (1, 0, 0), "q still holds a record here");
    }
}
