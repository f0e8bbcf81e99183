//! The connection target: a node keeps between `low` and `high` connections instead of one to every
//! node it ever met (`docs/SCALE.md`, section 4.1).
//!
//! - **Below `low`** it dials peers it knows and is not connected to, as many at once as connections
//!   are missing (at most [`MAX_FILL_DIALS`]; the shuffle's own dial aside); the shell lets Kademlia
//!   and mDNS dial on their own only while below `low` too ([`Target::wants_peers`]).
//! - **Above `high`** it asks as many peers to part as it holds connections over `high` (at most
//!   [`MAX_PART_ASKS`] awaiting answers at once): never one in the middle of a sync with it or one
//!   connected for less than [`PART_MIN_AGE`]; a gossip mesh peer only when no other is left, and one
//!   of its bootstrap peers after that (the shell gives both sets). The peer agrees while it keeps
//!   more than `low` others and no sync with the asker is under way ([`Target::part_asked`]); a
//!   bootstrap node's joiners thus leave it once they hold others, and dial it again only below
//!   `low`. Both sides record the parting, so the close that follows starts no suspicion and no
//!   redial, and neither dials the other again for [`PART_MEMORY`] (unless below `low` with nobody
//!   else to try). A parting whose connection is still open [`PART_CLOSE_WAIT`] later (the asker
//!   never had the answer) is forgotten.
//! - **Every [`SHUFFLE_INTERVAL`]** it dials one peer it knows and is not connected to, those it lost
//!   (a close it did not agree to) first, least recently tried first, even while a dial below `low`
//!   hangs; once above `high` again, the parting trims a connection. During a partition each side's
//!   connections stay on its own side; the shuffle is what bridges the two once it heals.
//!
//! Pure: time is a parameter, choices are drawn from the caller's rng.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use libp2p::identity::PeerId;
use rand::seq::IteratorRandom as _;
use rand::Rng;

use crate::clock::Millis;
pub use crate::defaults::{
    DECLINED_MEMORY, LOST_FIRST, MAX_FILL_DIALS, MAX_KNOWN_PEERS, MAX_PART_ASKS, PART_CLOSE_WAIT,
    PART_MEMORY, PART_MIN_AGE, PEER_HIGH, PEER_LOW, SHUFFLE_INTERVAL, TARGET_DIAL_TIMEOUT,
};

/// How many connections a node keeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bounds {
    /// Below it, the node dials peers it knows.
    pub low: usize,
    /// Above it, the node asks peers to part.
    pub high: usize,
}

impl Default for Bounds {
    fn default() -> Self {
        Self { low: PEER_LOW, high: PEER_HIGH }
    }
}

/// What the connection target asks of its shell.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Ask `peer` to part; its answer comes back through [`Target::answered`].
    AskToPart(PeerId),
    /// `peer` agreed to part: close the connections to it.
    Disconnect(PeerId),
    /// Dial `peer`; the outcome comes back as [`Target::connected`] or [`Target::dial_failed`].
    Dial(PeerId),
}

/// A peer this node was connected to and is not now.
#[derive(Debug, Clone, Copy)]
struct Known {
    /// When its connection closed without a parting (a crash, a partition, a ping timeout).
    lost: Option<Millis>,
    /// When this node last dialled it for the target.
    tried: Millis,
    /// When this node last saw it (connected, or its close).
    seen: Millis,
}

/// The connection target of one node.
#[derive(Debug)]
pub struct Target {
    bounds: Bounds,
    /// Connected peers, and since when.
    connected: BTreeMap<PeerId, Millis>,
    /// Peers asked to part last of all: bootstrap peers (set by the shell).
    keep: BTreeSet<PeerId>,
    /// Gossip mesh peers: asked to part only when no other peer may be (set by the shell).
    mesh: BTreeSet<PeerId>,
    /// Peers parted with, until when neither side dials the other (at most `MAX_KNOWN_PEERS`).
    parted: HashMap<PeerId, Millis>,
    /// Peers that declined to part, until when they are not asked again (`DECLINED_MEMORY`, at most
    /// `MAX_KNOWN_PEERS`).
    declined: HashMap<PeerId, Millis>,
    /// Peers met before and not connected now (at most `MAX_KNOWN_PEERS`).
    known: HashMap<PeerId, Known>,
    /// Peers asked to part, awaiting their answers (at most `MAX_PART_ASKS`).
    asking: BTreeSet<PeerId>,
    /// The dials under way below `low`, and when each started: as many as connections are missing, at
    /// most `MAX_FILL_DIALS` (a node back from an outage has several to make, and a dial to an address
    /// that moved hangs).
    filling: Vec<(PeerId, Millis)>,
    /// The shuffle's dial under way, and when it started: apart from `filling`, so that a dial hanging
    /// across a partition does not hold back the shuffle that would bridge it once it heals.
    shuffling: Option<(PeerId, Millis)>,
    next_shuffle: Option<Millis>,
}

impl Target {
    pub fn new(bounds: Bounds) -> Self {
        Self {
            bounds,
            connected: BTreeMap::new(),
            keep: BTreeSet::new(),
            mesh: BTreeSet::new(),
            parted: HashMap::new(),
            declined: HashMap::new(),
            known: HashMap::new(),
            asking: BTreeSet::new(),
            filling: Vec::new(),
            shuffling: None,
            next_shuffle: None,
        }
    }

    pub fn bounds(&self) -> Bounds {
        self.bounds
    }

    /// Connected peers.
    pub fn len(&self) -> usize {
        self.connected.len()
    }

    pub fn is_empty(&self) -> bool {
        self.connected.is_empty()
    }

    /// Whether dials made by discovery (Kademlia, mDNS) are welcome: below `low`.
    pub fn wants_peers(&self) -> bool {
        self.connected.len() < self.bounds.low
    }

    /// Whether the next ticks have work to do at once: above `high` (peers to ask to part), or below
    /// `low` with a dial to spare and a peer known to dial. Everything else the tick does (the shuffle,
    /// dials and partings that lapse) runs on a scale of seconds.
    pub fn unsettled(&self) -> bool {
        let n = self.connected.len();
        let asks = n.saturating_sub(self.bounds.high).min(MAX_PART_ASKS);
        let dials = self.bounds.low.saturating_sub(n).min(MAX_FILL_DIALS);
        self.asking.len() < asks || (self.filling.len() < dials && !self.known.is_empty())
    }

    /// When the next shuffle is due (0: at the next tick).
    pub fn next_shuffle(&self) -> Millis {
        self.next_shuffle.unwrap_or(0)
    }

    /// Whether `peer` and this node parted within `PART_MEMORY` (neither redials the other).
    pub fn is_parted(&self, peer: &PeerId, now: Millis) -> bool {
        self.parted.get(peer).is_some_and(|&until| until > now)
    }

    /// The peers asked to part last of all (bootstrap peers) and those asked only before them (gossip
    /// mesh peers), as the shell sees them now.
    pub fn keep(&mut self, bootstrap: BTreeSet<PeerId>, mesh: BTreeSet<PeerId>) {
        self.keep = bootstrap;
        self.mesh = mesh;
    }

    /// A first connection to `peer`.
    pub fn connected(&mut self, peer: PeerId, now: Millis) {
        self.connected.insert(peer, now);
        self.known.remove(&peer);
        self.dial_ended(peer);
    }

    /// This node heard of `peer` (mDNS, or a peer's address book): a candidate for later dials.
    pub fn heard_of(&mut self, peer: PeerId, now: Millis) {
        if !self.connected.contains_key(&peer) && !self.known.contains_key(&peer) {
            Self::make_room(&mut self.known, |k| k.seen);
            self.known.insert(peer, Known { lost: None, tried: 0, seen: now });
        }
    }

    /// This node's network changed (an address came up: an interface back after a cut, a laptop
    /// resumed): every known peer is worth a dial again at once, and dials under way may have gone
    /// through the old network. The shuffle runs at the next tick.
    pub fn network_changed(&mut self) {
        for k in self.known.values_mut() {
            k.tried = 0;
        }
        self.filling.clear();
        self.shuffling = None;
        self.next_shuffle = None;
    }

    /// The last connection to `peer` closed. True if the two had agreed to part: the close is no
    /// sign of failure.
    pub fn closed(&mut self, peer: PeerId, now: Millis) -> bool {
        self.connected.remove(&peer);
        self.asking.remove(&peer);
        let parted = self.is_parted(&peer, now);
        Self::make_room(&mut self.known, |k| k.seen);
        let tried = self.known.get(&peer).map_or(0, |k| k.tried);
        self.known.insert(peer, Known { lost: (!parted).then_some(now), tried, seen: now });
        parted
    }

    /// A dial of `peer` failed.
    pub fn dial_failed(&mut self, peer: PeerId) {
        self.dial_ended(peer);
    }

    fn dial_ended(&mut self, peer: PeerId) {
        self.filling.retain(|(p, _)| *p != peer);
        if self.shuffling.is_some_and(|(p, _)| p == peer) {
            self.shuffling = None;
        }
    }

    /// `peer` asks this node to part. Agreed while this node keeps more than `low` others and is not
    /// `busy` with `peer` (a sync under way). A bootstrap peer may ask too: a node needs its bootstrap
    /// peers to join, not once it holds `low` others (it dials them again only below `low`).
    pub fn part_asked(&mut self, peer: PeerId, busy: bool, now: Millis) -> bool {
        let agree = self.connected.contains_key(&peer) && self.connected.len() > self.bounds.low && !busy;
        if agree {
            Self::make_room(&mut self.parted, |&until| until);
            self.parted.insert(peer, now + PART_MEMORY.as_millis() as Millis);
        }
        agree
    }

    /// `peer`'s answer to this node's request to part (`None`: no answer).
    pub fn answered(&mut self, peer: PeerId, agreed: Option<bool>, now: Millis) -> Vec<Action> {
        self.asking.remove(&peer);
        if agreed == Some(true) && self.connected.contains_key(&peer) {
            Self::make_room(&mut self.parted, |&until| until);
            self.parted.insert(peer, now + PART_MEMORY.as_millis() as Millis);
            return vec![Action::Disconnect(peer)];
        }
        Self::make_room(&mut self.declined, |&until| until);
        self.declined.insert(peer, now + DECLINED_MEMORY.as_millis() as Millis);
        Vec::new()
    }

    /// Runs at every tick of the shell (every `DETECT_TICK` while [`unsettled`](Self::unsettled)): asks
    /// a peer to part above `high`, dials one below `low` or at the shuffle. `busy(peer)`: a sync with `peer` is under way.
    pub fn tick(&mut self, now: Millis, busy: impl Fn(&PeerId) -> bool, rng: &mut impl Rng) -> Vec<Action> {
        let mut out = Vec::new();
        // A parting whose connection outlived `PART_CLOSE_WAIT` never completed (the answer was lost):
        // forgotten, so that the close, when it comes, is a loss like any other.
        let (memory, wait) = (PART_MEMORY.as_millis() as Millis, PART_CLOSE_WAIT.as_millis() as Millis);
        let connected = &self.connected;
        self.parted.retain(|p, &mut until| {
            until > now && !(connected.contains_key(p) && until.saturating_sub(memory) + wait <= now)
        });
        self.declined.retain(|_, &mut until| until > now);
        let timeout = TARGET_DIAL_TIMEOUT.as_millis() as Millis;
        self.filling.retain(|(_, at)| at + timeout > now);
        if self.shuffling.is_some_and(|(_, at)| at + timeout <= now) {
            self.shuffling = None;
        }
        // As many asked at once as there are connections over `high` (at most `MAX_PART_ASKS`): a
        // bootstrap node that a whole mesh joined through sheds them in round trips, not one per tick.
        let excess = self.connected.len().saturating_sub(self.bounds.high);
        let room = excess.min(MAX_PART_ASKS).saturating_sub(self.asking.len());
        if room > 0 {
            let min_age = PART_MIN_AGE.as_millis() as Millis;
            let eligible: Vec<PeerId> = self
                .connected
                .iter()
                .filter(|(p, &since)| {
                    since + min_age <= now
                        && !self.declined.contains_key(p)
                        && !self.asking.contains(p)
                        && !busy(p)
                })
                .map(|(p, _)| *p)
                .collect();
            // Gossip mesh peers only when no other is left: gossipsub grafts another at its next
            // heartbeat, but a message under way may take the longer path meanwhile. Bootstrap peers
            // last of all: without them, a node whose other peers all hold just `low` (and decline)
            // would stay over `high` until those partings expire.
            let tier = |p: &PeerId| u8::from(self.mesh.contains(p)) + 2 * u8::from(self.keep.contains(p));
            let mut chosen = Vec::with_capacity(room);
            for t in 0..=3 {
                let left = room - chosen.len();
                chosen.extend(eligible.iter().filter(|p| tier(p) == t).copied().choose_multiple(rng, left));
            }
            for peer in chosen {
                self.asking.insert(peer);
                out.push(Action::AskToPart(peer));
            }
        }
        let shuffle = self.next_shuffle.is_none_or(|at| now >= at);
        if shuffle {
            self.next_shuffle = Some(now + SHUFFLE_INTERVAL.as_millis() as Millis);
        }
        // A peer being dialled was tried just now: `pick` passes it over.
        let missing = self.bounds.low.saturating_sub(self.connected.len()).min(MAX_FILL_DIALS);
        while self.filling.len() < missing {
            let Some(dial) = self.dial(now, false, &mut out) else { break };
            self.filling.push(dial);
        }
        if shuffle && self.shuffling.is_none() {
            self.shuffling = self.dial(now, true, &mut out);
        }
        out
    }

    /// Picks a peer to dial (see [`pick`](Self::pick)) and dials it: the dial under way, if any.
    fn dial(&mut self, now: Millis, shuffle: bool, out: &mut Vec<Action>) -> Option<(PeerId, Millis)> {
        let peer = self.pick(now, shuffle)?;
        if let Some(k) = self.known.get_mut(&peer) {
            k.tried = now;
        }
        out.push(Action::Dial(peer));
        Some((peer, now))
    }

    /// The next peer to dial, none tried within `TARGET_DIAL_TIMEOUT`. For the shuffle, one lost within `LOST_FIRST` (a close it did not agree
    /// to: across a partition, say) before any other, never one parted within `PART_MEMORY`. Below
    /// `low`, the least recently tried first and, of those, one not lost first (it most likely
    /// answers); one parted with only when nobody else is left (it asked to part when it held more
    /// than `high`).
    fn pick(&self, now: Millis, shuffle: bool) -> Option<PeerId> {
        let recent = LOST_FIRST.as_millis() as Millis;
        let retry = TARGET_DIAL_TIMEOUT.as_millis() as Millis;
        self.known
            .iter()
            .filter(|(p, k)| !self.connected.contains_key(*p) && (k.tried == 0 || k.tried + retry <= now))
            .filter(|(p, _)| !shuffle || !self.is_parted(p, now))
            .min_by_key(|(p, k)| {
                let lost = k.lost.is_some_and(|at| at + recent > now);
                if shuffle {
                    (false, !lost as u64, k.tried, **p)
                } else {
                    (self.is_parted(p, now), k.tried, lost as u64, **p)
                }
            })
            .map(|(p, _)| *p)
    }

    /// Drops the entry with the smallest `key` when `map` is full.
    fn make_room<V>(map: &mut HashMap<PeerId, V>, key: impl Fn(&V) -> Millis) {
        if map.len() >= MAX_KNOWN_PEERS {
            if let Some(oldest) = map.iter().min_by_key(|(_, v)| key(v)).map(|(p, _)| *p) {
                map.remove(&oldest);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use libp2p::identity::Keypair;
    use rand::SeedableRng;

    fn peer(n: u16) -> PeerId {
        let mut bytes = [7u8; 32];
        bytes[..2].copy_from_slice(&n.to_be_bytes());
        Keypair::ed25519_from_bytes(bytes).unwrap().public().to_peer_id()
    }

    fn rng() -> rand::rngs::StdRng {
        rand::rngs::StdRng::seed_from_u64(3)
    }

    const AGE: Millis = PART_MIN_AGE.as_millis() as Millis;

    fn target(low: usize, high: usize, connected: u16) -> Target {
        let mut t = Target::new(Bounds { low, high });
        for i in 1..=connected {
            t.connected(peer(i), 0);
        }
        t
    }

    fn asked(actions: &[Action]) -> Vec<PeerId> {
        actions.iter().filter_map(|a| if let Action::AskToPart(p) = a { Some(*p) } else { None }).collect()
    }

    #[test]
    fn above_high_as_many_as_are_over_are_asked_to_part_never_one_busy_or_new_bootstrap_last() {
        let mut t = target(2, 4, 6);
        t.keep([peer(1), peer(2)].into(), [peer(5), peer(6)].into());
        assert!(asked(&t.tick(AGE - 1, |_| false, &mut rng())).is_empty(), "connections too new");
        let busy = peer(3);
        let first = asked(&t.tick(AGE, |p| *p == busy, &mut rng()));
        assert_eq!(first.len(), 2, "two over high: two asked");
        assert_eq!(first[0], peer(4), "a gossip mesh peer only when no other may be asked");
        assert!([peer(5), peer(6)].contains(&first[1]));
        assert!(asked(&t.tick(AGE + 1, |_| false, &mut rng())).is_empty(), "both still awaiting answers");
        // One agrees: disconnect, and the close that follows is no failure.
        assert_eq!(t.answered(first[0], Some(true), AGE + 2), vec![Action::Disconnect(first[0])]);
        assert!(t.closed(first[0], AGE + 3));
        assert!(t.is_parted(&first[0], AGE + 3));
        assert!(asked(&t.tick(AGE + 4, |_| false, &mut rng())).is_empty(), "one over, one asked");
        // The other declines: not asked again for a while, another one is.
        assert!(t.answered(first[1], Some(false), AGE + 5).is_empty());
        let second = asked(&t.tick(AGE + 6, |_| false, &mut rng()));
        assert_eq!(second.len(), 1);
        assert_ne!(second[0], first[1]);
        t.answered(second[0], None, AGE + 7);
        for at in AGE + 8..AGE + 40 {
            for p in asked(&t.tick(at, |_| false, &mut rng())) {
                assert_ne!(p, first[1]);
                t.answered(p, None, at);
            }
        }
        // Every other peer declined: a bootstrap peer is asked rather than staying over `high`.
        let mut t = target(2, 4, 5);
        t.keep([peer(1), peer(2)].into(), [peer(3)].into());
        let first = asked(&t.tick(AGE, |_| false, &mut rng()));
        assert_eq!(first, vec![peer(4)], "neither kept nor in the gossip mesh: asked first");
        t.answered(peer(4), Some(false), AGE);
        assert_eq!(asked(&t.tick(AGE + 1, |_| false, &mut rng())), vec![peer(5)]);
        t.answered(peer(5), Some(false), AGE + 1);
        assert_eq!(asked(&t.tick(AGE + 2, |_| false, &mut rng())), vec![peer(3)], "then the mesh peer");
        t.answered(peer(3), Some(false), AGE + 2);
        let last = asked(&t.tick(AGE + 3, |_| false, &mut rng()));
        assert!(last == vec![peer(1)] || last == vec![peer(2)], "then a bootstrap peer: {last:?}");
        // Far over high: at most `MAX_PART_ASKS` at once.
        let mut t = target(2, 4, 40);
        assert_eq!(asked(&t.tick(AGE, |_| false, &mut rng())).len(), MAX_PART_ASKS);
        // Four left, the high bound: nobody else is asked.
        let mut t = target(2, 4, 4);
        assert!(asked(&t.tick(AGE, |_| false, &mut rng())).is_empty());
    }

    #[test]
    fn a_peer_agrees_to_part_only_while_it_keeps_more_than_low() {
        let mut t = target(3, 6, 4);
        assert!(!t.part_asked(peer(1), true, 0), "a sync under way");
        assert!(!t.part_asked(peer(9), false, 0), "not connected");
        assert!(t.part_asked(peer(1), false, 0));
        assert!(!t.closed(peer(3), 1), "a close it did not agree to is a loss");
        assert!(t.closed(peer(1), 1), "the agreed close is no failure");
        assert!(!t.part_asked(peer(4), false, 2), "three left: the low bound");
        assert!(!t.is_parted(&peer(1), PART_MEMORY.as_millis() as Millis + 1));
    }

    fn dials(actions: Vec<Action>) -> Vec<PeerId> {
        actions.into_iter().filter_map(|a| if let Action::Dial(p) = a { Some(p) } else { None }).collect()
    }

    #[test]
    fn below_low_it_dials_peers_likely_to_answer_one_at_a_time() {
        let mut t = target(3, 6, 5);
        t.tick(0, |_| false, &mut rng()); // the first shuffle: nobody known yet
        t.part_asked(peer(1), false, 1);
        assert!(t.closed(peer(1), 2), "parted");
        assert!(!t.closed(peer(2), 3), "lost");
        t.heard_of(peer(20), 4);
        assert!(!t.wants_peers(), "three left: the low bound");
        assert!(dials(t.tick(5, |_| false, &mut rng())).is_empty(), "no shuffle due yet");
        t.closed(peer(3), 6);
        assert!(t.wants_peers());
        let first = dials(t.tick(7, |_| false, &mut rng()));
        assert_eq!(first, vec![peer(20)], "one not lost first, never one parted with");
        assert!(dials(t.tick(8, |_| false, &mut rng())).is_empty(), "one dial at a time");
        t.dial_failed(peer(20));
        let second = dials(t.tick(9, |_| false, &mut rng()));
        assert_eq!(second.len(), 1);
        assert!([peer(2), peer(3)].contains(&second[0]), "then the lost; one parted with last");
        // A dial that never reports back is given up after its timeout. (The shuffle, due by then too,
        // dials beside it.)
        let later = 9 + TARGET_DIAL_TIMEOUT.as_millis() as Millis;
        let third = dials(t.tick(later, |_| false, &mut rng()));
        assert_eq!(third.len(), 2, "{third:?}");
        assert_ne!(third[0], second[0], "the least recently tried first");
        assert!([peer(2), peer(3)].contains(&third[0]));
        t.connected(third[0], later + 1);
        assert!(!t.wants_peers());
    }

    #[test]
    fn it_wants_fast_ticks_only_with_a_peer_to_dial_or_to_ask_to_part() {
        let mut t = target(3, 6, 2);
        assert!(!t.unsettled(), "below low with nobody to dial: a lone node rests");
        assert_eq!(t.next_shuffle(), 0, "the first shuffle at the next tick");
        t.tick(0, |_| false, &mut rng());
        assert_eq!(t.next_shuffle(), SHUFFLE_INTERVAL.as_millis() as Millis);
        t.heard_of(peer(20), 1);
        assert!(t.unsettled(), "a peer to dial");
        assert_eq!(dials(t.tick(2, |_| false, &mut rng())), vec![peer(20)]);
        assert!(!t.unsettled(), "the one dial missing is under way");
        t.connected(peer(20), 3);
        assert!(!t.unsettled(), "at low");
        for i in 21..=24 {
            t.connected(peer(i), 4);
        }
        assert!(t.unsettled(), "one over high");
        assert_eq!(asked(&t.tick(AGE, |_| false, &mut rng())).len(), 1);
        assert!(!t.unsettled(), "its answer is awaited");
    }

    #[test]
    fn a_peer_parted_with_is_dialled_below_low_only_when_nobody_else_is_left_to_try() {
        let mut t = target(3, 6, 4);
        t.tick(0, |_| false, &mut rng());
        t.part_asked(peer(1), false, 1);
        t.closed(peer(1), 2);
        t.closed(peer(2), 3); // lost, and dead
        let retry = TARGET_DIAL_TIMEOUT.as_millis() as Millis;
        assert_eq!(dials(t.tick(4, |_| false, &mut rng())), vec![peer(2)]);
        t.dial_failed(peer(2));
        // The dead one is not dialled again within the retry time: the one parted with is.
        assert_eq!(dials(t.tick(5, |_| false, &mut rng())), vec![peer(1)]);
        t.dial_failed(peer(1));
        assert!(dials(t.tick(6, |_| false, &mut rng())).is_empty(), "both wait out the retry time");
        assert_eq!(dials(t.tick(4 + retry, |_| false, &mut rng())), vec![peer(2)]);
    }

    #[test]
    fn the_shuffle_dials_one_peer_every_interval_lost_ones_first() {
        let mut t = target(2, 8, 4);
        t.heard_of(peer(30), 0);
        t.closed(peer(4), 0); // lost: across a partition, say
        let shuffle = SHUFFLE_INTERVAL.as_millis() as Millis;
        assert_eq!(t.tick(1, |_| false, &mut rng()), vec![Action::Dial(peer(4))]);
        t.dial_failed(peer(4));
        assert!(t.tick(2, |_| false, &mut rng()).is_empty(), "not before the next shuffle");
        // A peer lost is tried again at every shuffle while it was lost recently...
        assert_eq!(t.tick(1 + shuffle, |_| false, &mut rng()), vec![Action::Dial(peer(4))]);
        t.dial_failed(peer(4));
        // ... and then takes its turn with the others, the least recently tried first.
        let late = LOST_FIRST.as_millis() as Millis;
        assert_eq!(t.tick(late, |_| false, &mut rng()), vec![Action::Dial(peer(30))]);
        t.dial_failed(peer(30));
        assert_eq!(t.tick(late + shuffle, |_| false, &mut rng()), vec![Action::Dial(peer(4))]);
    }

    #[test]
    fn the_shuffle_dials_beside_a_dial_that_hangs() {
        let mut t = target(2, 8, 2);
        t.tick(0, |_| false, &mut rng()); // the first shuffle: nobody known yet
        t.closed(peer(1), 1); // lost: across a partition, say
        t.heard_of(peer(3), 1);
        // One below low: one dial, which hangs (the other side of a cut drops it).
        let first = dials(t.tick(2, |_| false, &mut rng()));
        assert_eq!(first.len(), 1);
        let shuffle = SHUFFLE_INTERVAL.as_millis() as Millis;
        let next = dials(t.tick(shuffle, |_| false, &mut rng()));
        assert_eq!(next.len(), 1, "the shuffle does not wait for the hanging dial");
        assert_ne!(next, first, "nor dials the same peer");
    }

    #[test]
    fn a_parting_whose_close_never_comes_is_forgotten() {
        let mut t = target(2, 8, 4);
        assert!(t.part_asked(peer(1), false, 0));
        assert!(t.part_asked(peer(2), false, 0));
        // The asker closes one connection; the other's answer was lost and its connection stays.
        assert!(t.closed(peer(1), 100));
        let wait = PART_CLOSE_WAIT.as_millis() as Millis;
        t.tick(wait - 1, |_| false, &mut rng());
        assert!(t.is_parted(&peer(2), wait - 1));
        t.tick(wait, |_| false, &mut rng());
        assert!(!t.is_parted(&peer(2), wait), "still connected after the wait: no parting");
        assert!(!t.closed(peer(2), wait + 1), "its close is a loss");
        assert!(t.is_parted(&peer(1), wait + 1), "the parting that completed is remembered");
    }

    #[test]
    fn far_below_low_several_peers_are_dialled_at_once() {
        let mut t = target(8, 16, 0);
        t.tick(0, |_| false, &mut rng()); // the first shuffle: nobody known yet
        for i in 1..=6 {
            t.heard_of(peer(i), 0);
        }
        let first = dials(t.tick(1, |_| false, &mut rng()));
        assert_eq!(first.len(), MAX_FILL_DIALS, "eight missing: at most {MAX_FILL_DIALS} at once");
        assert!(dials(t.tick(2, |_| false, &mut rng())).is_empty(), "all under way");
        t.connected(first[0], 3);
        t.dial_failed(first[1]);
        let next = dials(t.tick(4, |_| false, &mut rng()));
        assert_eq!(next.len(), 2, "two dials ended: two more, of the two left untried");
        assert!(next.iter().all(|p| !first.contains(p)));
    }

    #[test]
    fn a_network_that_comes_back_is_dialled_through_at_once() {
        let mut t = target(2, 8, 2);
        t.tick(0, |_| false, &mut rng());
        // Cut off: both connections die, and every dial fails until the network is back.
        t.closed(peer(1), 1);
        t.closed(peer(2), 1);
        for at in 2..5 {
            for p in dials(t.tick(at, |_| false, &mut rng())) {
                t.dial_failed(p);
            }
        }
        assert!(dials(t.tick(6, |_| false, &mut rng())).is_empty(), "both tried within the retry time");
        t.network_changed();
        let now = dials(t.tick(7, |_| false, &mut rng()));
        assert_eq!(now.len(), 2, "a dial below low and the shuffle's, at once: {now:?}");
    }

    #[test]
    fn what_it_remembers_is_bounded() {
        let mut t = target(1, 2, 0);
        for i in 0..(MAX_KNOWN_PEERS as u16 + 10) {
            t.connected(peer(i), i as Millis);
            t.closed(peer(i), i as Millis);
            t.heard_of(peer(i.wrapping_add(20_000)), i as Millis);
        }
        assert!(t.known.len() <= MAX_KNOWN_PEERS);
        assert!(t.parted.len() <= MAX_KNOWN_PEERS && t.declined.len() <= MAX_KNOWN_PEERS);
    }
}
