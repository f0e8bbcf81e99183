//! Strikes and bans: a peer that keeps sending what verification refuses (forged signatures,
//! oversized or malformed messages, publishers outside the allow-list or over their limit) is
//! disconnected and refused for a while. Gossipsub's peer score already stops forwarding to and from
//! it; this also frees the connection and the work of verifying its flood.
//!
//! Pure: time is a parameter (milliseconds), so the rules are unit-tested without waiting.

use libp2p::identity::PeerId;
use std::collections::HashMap;

pub use crate::defaults::{BAN_FOR, MAX_STRIKES, MAX_TRACKED_PEERS, STRIKE_WINDOW};

#[derive(Debug, Clone, Copy)]
struct Strikes {
    since: u64,
    count: u32,
}

#[derive(Debug, Default)]
pub struct BanList {
    strikes: HashMap<PeerId, Strikes>,
    banned: HashMap<PeerId, u64>,
}

impl BanList {
    /// Records `count` rejected messages from `peer`; true when this bans it (once per ban).
    pub fn strike(&mut self, peer: PeerId, count: u32, now: u64) -> bool {
        if self.is_banned(&peer, now) {
            return false;
        }
        let window = STRIKE_WINDOW.as_millis() as u64;
        let entry = self.strikes.entry(peer).or_insert(Strikes { since: now, count: 0 });
        if now.saturating_sub(entry.since) > window {
            *entry = Strikes { since: now, count: 0 };
        }
        entry.count = entry.count.saturating_add(count);
        if entry.count < MAX_STRIKES {
            self.bound(now);
            return false;
        }
        self.strikes.remove(&peer);
        self.banned.insert(peer, now.saturating_add(BAN_FOR.as_millis() as u64));
        self.bound(now);
        true
    }

    pub fn is_banned(&self, peer: &PeerId, now: u64) -> bool {
        self.banned.get(peer).is_some_and(|&until| now < until)
    }

    /// Peers banned right now.
    pub fn banned(&self, now: u64) -> usize {
        self.banned.values().filter(|&&until| now < until).count()
    }

    /// Forgets expired bans and old strikes; returns the peers whose ban ended.
    pub fn expire(&mut self, now: u64) -> Vec<PeerId> {
        let window = STRIKE_WINDOW.as_millis() as u64;
        self.strikes.retain(|_, s| now.saturating_sub(s.since) <= window);
        let mut ended: Vec<PeerId> =
            self.banned.iter().filter(|(_, &until)| now >= until).map(|(peer, _)| *peer).collect();
        ended.sort_unstable();
        for peer in &ended {
            self.banned.remove(peer);
        }
        ended
    }

    fn bound(&mut self, now: u64) {
        if self.strikes.len() + self.banned.len() <= MAX_TRACKED_PEERS {
            return;
        }
        self.expire(now);
        while self.strikes.len() + self.banned.len() > MAX_TRACKED_PEERS {
            // Strikes go before bans, oldest first.
            if let Some(peer) = self.strikes.iter().min_by_key(|(_, s)| s.since).map(|(p, _)| *p) {
                self.strikes.remove(&peer);
            } else if let Some(peer) = self.banned.iter().min_by_key(|(_, &until)| until).map(|(p, _)| *p) {
                self.banned.remove(&peer);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_peer_is_banned_after_enough_strikes_in_the_window_and_released_after_the_ban() {
        let mut g = BanList::default();
        let p = PeerId::random();
        for i in 0..MAX_STRIKES - 1 {
            assert!(!g.strike(p, 1, u64::from(i)));
        }
        assert!(g.strike(p, 1, 100), "the last strike bans");
        assert!(g.is_banned(&p, 100));
        assert!(!g.strike(p, 5, 200), "a banned peer is not banned again");
        assert_eq!(g.banned(200), 1);
        let end = 100 + BAN_FOR.as_millis() as u64;
        assert!(g.is_banned(&p, end - 1));
        assert_eq!(g.expire(end), vec![p]);
        assert!(!g.is_banned(&p, end));
    }

    #[test]
    fn strikes_spread_beyond_the_window_do_not_add_up() {
        let mut g = BanList::default();
        let p = PeerId::random();
        let step = STRIKE_WINDOW.as_millis() as u64 / 4;
        for i in 0..(4 * MAX_STRIKES) {
            assert!(!g.strike(p, 1, u64::from(i / (MAX_STRIKES / 4)) * step * 2));
        }
        assert!(g.strike(p, MAX_STRIKES, 100 * step), "a batch of rejections counts in full");
    }

    #[test]
    fn tracking_is_bounded() {
        let mut g = BanList::default();
        for _ in 0..MAX_TRACKED_PEERS + 100 {
            g.strike(PeerId::random(), 1, 5);
        }
        assert!(g.strikes.len() + g.banned.len() <= MAX_TRACKED_PEERS);
    }
}
