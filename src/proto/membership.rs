//! Failure detection sooner than heartbeat age, with no false alarm (SWIM-style indirect confirmation).
//!
//! A process that dies closes its connections, and every peer connected to it sees the close within a
//! millisecond or so. A close alone proves little (one flaky link, one restarted router), so the node
//! that saw it only *suspects* the peer: it asks up to [`PROBE_HELPERS`] other connected peers whether
//! they still reach it, and it redials it. It declares the peer down when no helper reaches it and there
//! is evidence of death: a helper lost it too, or the redial failed, or the redial has not connected by
//! [`SUSPECT_TIMEOUT`] (a host that vanished with its process, as a killed container does, leaves a dial
//! to the kernel's neighbour timeout, about 3 s). A helper that still reaches it, or a new connection,
//! clears the suspicion. A host that goes silent without closing anything (no FIN) is left to
//! heartbeat age: the connection its failed pings close starts no suspicion ([`Membership::went_quiet`]),
//! since helpers behind the same partition would confirm it, and declare live nodes down once it heals.
//!
//! The declaration is gossiped, signed by the node that makes it, so that nodes not connected to the
//! peer learn it too; a live node that hears itself declared down refutes it at once with a fresh
//! heartbeat. Pure: time is a parameter, helpers are drawn from a caller's rng.

use std::collections::{BTreeSet, HashMap};

use libp2p::identity::PeerId;
use rand::seq::IteratorRandom as _;
use rand::Rng;

use crate::clock::Millis;
pub use crate::defaults::{LOST_MEMORY, MAX_SUSPECTS, MAX_TRACKED_PEERS, PROBE_HELPERS, SUSPECT_TIMEOUT};

/// A helper's answer about a peer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reach {
    /// Connected to it now.
    Reached,
    /// It lost its connection to it within `LOST_MEMORY`.
    Lost,
    /// Neither: no evidence.
    Unknown,
}

impl Reach {
    pub fn to_u8(self) -> u8 {
        match self {
            Reach::Reached => 1,
            Reach::Lost => 2,
            Reach::Unknown => 0,
        }
    }

    pub fn from_u8(v: u8) -> Reach {
        match v {
            1 => Reach::Reached,
            2 => Reach::Lost,
            _ => Reach::Unknown,
        }
    }
}

/// What the detector asks of its shell.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Ask `helper` whether it reaches `target`, answered with [`Membership::answer`].
    Probe { helper: PeerId, target: PeerId },
    /// Dial `target` again; a failure comes back through [`Membership::dial_failed`].
    Redial(PeerId),
    /// `target` is down: announce it.
    Declare(PeerId),
}

#[derive(Debug, Clone)]
struct Suspicion {
    since: Millis,
    asked: usize,
    answered: usize,
    /// A helper lost it too, or the redial failed.
    evidence: bool,
}

/// The failure detector of one node.
#[derive(Debug, Default)]
pub struct Membership {
    connected: BTreeSet<PeerId>,
    /// Peers whose last connection closed, and when (kept `LOST_MEMORY`, at most `MAX_TRACKED_PEERS`).
    lost: HashMap<PeerId, Millis>,
    suspects: HashMap<PeerId, Suspicion>,
}

impl Membership {
    /// A first connection to `peer`: it is alive, whatever was suspected.
    pub fn connected(&mut self, peer: PeerId) {
        self.connected.insert(peer);
        self.lost.remove(&peer);
        self.suspects.remove(&peer);
    }

    /// The last connection to `peer` closed after the two agreed to part: no sign of failure, and no
    /// evidence for anyone who asks whether this node reaches it.
    pub fn parted(&mut self, peer: PeerId) {
        self.connected.remove(&peer);
        self.lost.remove(&peer);
        self.suspects.remove(&peer);
    }

    /// The last connection to `peer` was closed because its pings failed: the path went quiet (a
    /// partition, an address that went away), which a process that died does not do (its host closes
    /// its connections). No suspicion, and no evidence for anyone who asks: heartbeat age judges it.
    pub fn went_quiet(&mut self, peer: PeerId) {
        self.connected.remove(&peer);
        self.suspects.remove(&peer);
    }

    /// The last connection to `peer` closed. `watched`: this node holds records `peer` published, so
    /// its death matters here. Starts a suspicion: probes and a redial.
    pub fn closed(&mut self, peer: PeerId, watched: bool, now: Millis, rng: &mut impl Rng) -> Vec<Action> {
        self.connected.remove(&peer);
        self.remember_lost(peer, now);
        if !watched || self.suspects.contains_key(&peer) || self.suspects.len() >= MAX_SUSPECTS {
            return Vec::new();
        }
        let helpers: Vec<PeerId> = self.connected.iter().copied().choose_multiple(rng, PROBE_HELPERS);
        let mut actions: Vec<Action> =
            helpers.iter().map(|&helper| Action::Probe { helper, target: peer }).collect();
        actions.push(Action::Redial(peer));
        self.suspects
            .insert(peer, Suspicion { since: now, asked: helpers.len(), answered: 0, evidence: false });
        actions
    }

    /// Whether a suspicion is open: its timeout is due within `SUSPECT_TIMEOUT`.
    pub fn suspecting(&self) -> bool {
        !self.suspects.is_empty()
    }

    fn remember_lost(&mut self, peer: PeerId, now: Millis) {
        if self.lost.len() >= MAX_TRACKED_PEERS {
            let window = LOST_MEMORY.as_millis() as Millis;
            self.lost.retain(|_, &mut at| at + window > now);
            if self.lost.len() >= MAX_TRACKED_PEERS {
                if let Some(oldest) = self.lost.iter().min_by_key(|(_, &at)| at).map(|(p, _)| *p) {
                    self.lost.remove(&oldest);
                }
            }
        }
        self.lost.insert(peer, now);
    }

    /// This node's answer to a peer asking whether it reaches `target`.
    pub fn reach(&self, target: &PeerId, now: Millis) -> Reach {
        if self.connected.contains(target) {
            Reach::Reached
        } else if self.lost.get(target).is_some_and(|&at| at + LOST_MEMORY.as_millis() as Millis > now) {
            Reach::Lost
        } else {
            Reach::Unknown
        }
    }

    /// A helper's answer about a suspect.
    pub fn answer(&mut self, target: PeerId, reach: Reach) -> Vec<Action> {
        let Some(s) = self.suspects.get_mut(&target) else { return Vec::new() };
        match reach {
            // Alive for someone: no alarm. If this node's own link is what broke, its redial or the
            // next heartbeat settles it.
            Reach::Reached => {
                self.suspects.remove(&target);
                return Vec::new();
            }
            Reach::Lost => s.evidence = true,
            Reach::Unknown => {}
        }
        s.answered += 1;
        self.decide(target, false)
    }

    /// A probe could not be asked (the helper went away): it counts as an answer without evidence.
    pub fn probe_failed(&mut self, target: PeerId) -> Vec<Action> {
        self.answer(target, Reach::Unknown)
    }

    /// The redial of a suspect failed.
    pub fn dial_failed(&mut self, peer: PeerId) -> Vec<Action> {
        let Some(s) = self.suspects.get_mut(&peer) else { return Vec::new() };
        s.evidence = true;
        self.decide(peer, false)
    }

    /// Settles suspicions at `SUSPECT_TIMEOUT`: no helper reached the peer (some did not answer in
    /// time) and the redial has not connected, so the peer is declared down.
    pub fn tick(&mut self, now: Millis) -> Vec<Action> {
        let timeout = SUSPECT_TIMEOUT.as_millis() as Millis;
        let mut due: Vec<PeerId> =
            self.suspects.iter().filter(|(_, s)| s.since + timeout <= now).map(|(p, _)| *p).collect();
        // In a fixed order, so that a seeded run repeats exactly.
        due.sort_unstable();
        due.into_iter().flat_map(|p| self.decide(p, true)).collect()
    }

    /// Declares `target` once every helper answered without reaching it and there is evidence; at the
    /// timeout, unless a helper reached it or the redial connected (either clears the suspicion).
    fn decide(&mut self, target: PeerId, timed_out: bool) -> Vec<Action> {
        let Some(s) = self.suspects.get(&target) else { return Vec::new() };
        // At the timeout, a redial that has not connected is evidence too: a live process on a live
        // host answers a dial within round trips, while a host that vanished with its process (a
        // killed container, whose address goes with it) leaves the dial to the kernel's neighbour
        // timeout, seconds later.
        if timed_out || (s.evidence && s.answered >= s.asked) {
            self.suspects.remove(&target);
            return vec![Action::Declare(target)];
        }
        Vec::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use libp2p::identity::Keypair;
    use rand::SeedableRng;

    fn peer(n: u8) -> PeerId {
        Keypair::ed25519_from_bytes([n; 32]).unwrap().public().to_peer_id()
    }

    fn rng() -> rand::rngs::StdRng {
        rand::rngs::StdRng::seed_from_u64(7)
    }

    fn with_peers(n: u8) -> Membership {
        let mut m = Membership::default();
        for i in 1..=n {
            m.connected(peer(i));
        }
        m
    }

    fn probes(actions: &[Action]) -> Vec<PeerId> {
        actions
            .iter()
            .filter_map(|a| if let Action::Probe { helper, .. } = a { Some(*helper) } else { None })
            .collect()
    }

    #[test]
    fn a_dead_peer_is_declared_once_helpers_lost_it_too() {
        let mut m = with_peers(6);
        let x = peer(1);
        assert!(!m.suspecting());
        let actions = m.closed(x, true, 1_000, &mut rng());
        assert!(m.suspecting(), "its timeout needs the fast tick");
        let helpers = probes(&actions);
        assert_eq!(helpers.len(), PROBE_HELPERS);
        assert!(!helpers.contains(&x) && actions.contains(&Action::Redial(x)));
        assert!(m.answer(x, Reach::Lost).is_empty(), "waits for every helper");
        assert!(m.answer(x, Reach::Unknown).is_empty());
        assert_eq!(m.answer(x, Reach::Unknown), vec![Action::Declare(x)]);
        assert!(!m.suspects.contains_key(&x) && !m.suspecting());
    }

    #[test]
    fn a_connection_whose_pings_failed_raises_no_suspicion_and_is_no_evidence() {
        let mut m = with_peers(5);
        let x = peer(1);
        m.went_quiet(x);
        assert!(m.suspects.is_empty(), "heartbeat age judges it");
        assert_eq!(m.reach(&x, 10), Reach::Unknown, "a quiet path is no evidence for another's suspicion");
        assert!(m.dial_failed(x).is_empty() && m.tick(60_000).is_empty());
    }

    #[test]
    fn a_failed_redial_is_evidence_enough_when_nobody_else_knows() {
        let mut m = with_peers(1);
        let x = peer(1);
        assert_eq!(m.closed(x, true, 0, &mut rng()), vec![Action::Redial(x)], "no helper to ask");
        assert_eq!(m.dial_failed(x), vec![Action::Declare(x)]);
    }

    #[test]
    fn a_peer_someone_still_reaches_is_never_declared() {
        let mut m = with_peers(5);
        let x = peer(1);
        m.closed(x, true, 0, &mut rng());
        assert!(m.answer(x, Reach::Lost).is_empty());
        assert!(m.answer(x, Reach::Reached).is_empty());
        assert!(m.dial_failed(x).is_empty(), "suspicion cleared");
        assert!(m.tick(60_000).is_empty());
    }

    #[test]
    fn a_reconnected_peer_is_cleared_and_a_redial_that_hangs_is_evidence() {
        let mut m = with_peers(4);
        let x = peer(1);
        m.closed(x, true, 0, &mut rng());
        m.connected(x);
        assert!(m.dial_failed(x).is_empty() && m.tick(10_000).is_empty());
        // Helpers that know nothing and a redial that has not connected by the timeout: declared
        // (the host went away with its address), no sooner.
        m.closed(x, true, 20_000, &mut rng());
        for _ in 0..3 {
            assert!(m.answer(x, Reach::Unknown).is_empty());
        }
        let timeout = SUSPECT_TIMEOUT.as_millis() as u64;
        assert!(m.tick(20_000 + timeout - 1).is_empty());
        assert_eq!(m.tick(20_000 + timeout), vec![Action::Declare(x)]);
        assert!(!m.suspects.contains_key(&x));
    }

    #[test]
    fn at_the_timeout_evidence_without_every_answer_declares() {
        let mut m = with_peers(5);
        let x = peer(1);
        m.closed(x, true, 0, &mut rng());
        m.answer(x, Reach::Lost);
        assert!(m.tick(SUSPECT_TIMEOUT.as_millis() as u64 - 1).is_empty());
        assert_eq!(m.tick(SUSPECT_TIMEOUT.as_millis() as u64), vec![Action::Declare(x)]);
    }

    #[test]
    fn unwatched_peers_are_not_suspected_and_helpers_answer_from_what_they_saw() {
        let mut m = with_peers(3);
        assert!(m.closed(peer(1), false, 0, &mut rng()).is_empty());
        assert_eq!(m.reach(&peer(1), 10), Reach::Lost);
        assert_eq!(m.reach(&peer(2), 10), Reach::Reached);
        assert_eq!(m.reach(&peer(9), 10), Reach::Unknown);
        assert_eq!(m.reach(&peer(1), LOST_MEMORY.as_millis() as u64 + 1), Reach::Unknown);
    }

    #[test]
    fn lost_peers_and_suspects_are_bounded() {
        let mut m = Membership::default();
        let mut r = rng();
        for i in 0..(MAX_TRACKED_PEERS + 10) {
            let mut bytes = [0u8; 32];
            bytes[..8].copy_from_slice(&(i as u64).to_be_bytes());
            let p = Keypair::ed25519_from_bytes(bytes).unwrap().public().to_peer_id();
            m.connected(p);
            m.closed(p, true, i as u64, &mut r);
        }
        assert!(m.lost.len() <= MAX_TRACKED_PEERS);
        assert!(m.suspects.len() <= MAX_SUSPECTS);
    }
}
