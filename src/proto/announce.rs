//! Which of its own cards a node gossips one by one.
//!
//! A card registered alone reaches every node by gossip in tens of milliseconds. Many at once (a node
//! starting with card files or on a stored view, a burst of registrations) are cheaper pulled: peers
//! learn of them from the publisher's agent list (the digest in its next heartbeat) and fetch them
//! over sync, in batches, each card once per node. Gossiped, each card reaches each node once per
//! gossip mesh peer that took it, and is checked, applied and forwarded a few at a time; in a 50-node
//! mesh starting with 10,000 agents, most copies arrived after the same card had been fetched
//! (BENCHMARKS.md, "Cards many at once are pulled, not gossiped").
//!
//! So a node gossips at most [`ANNOUNCE_BUDGET`] of its cards per heartbeat interval; the others reach
//! the mesh through its list and sync. A card whose announcement found no gossip peer (registered before
//! the mesh formed) is announced again at the next heartbeat, unless it came in a bulk, more than the
//! budget in one interval: then every peer reconciles with this node when it connects and sees the rest
//! in its list, and gossiping a few of them too only adds copies (a 50-node mesh starting with 200 cards
//! a node reached the full view about 3 s later when each node gossiped 8 of them at its first
//! heartbeat). Removals are always gossiped: a tombstone is small and a list does not say that an agent
//! left.

pub use crate::defaults::ANNOUNCE_BUDGET;

/// What is left of this heartbeat interval's budget of cards gossiped one by one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Announcements {
    left: usize,
    /// Whether a card of this interval found the budget spent.
    overdrawn: bool,
}

impl Default for Announcements {
    fn default() -> Self {
        Self { left: ANNOUNCE_BUDGET, overdrawn: false }
    }
}

impl Announcements {
    /// Whether one more card may be gossiped in this interval; if so, it is taken from the budget.
    pub fn take(&mut self) -> bool {
        if self.left == 0 {
            self.overdrawn = true;
            return false;
        }
        self.left -= 1;
        true
    }

    /// A heartbeat: a new interval, with the whole budget. Returns whether the interval that ended
    /// asked for more than its budget: a bulk, whose cards not announced yet are left to sync as well.
    pub fn refill(&mut self) -> bool {
        self.left = ANNOUNCE_BUDGET;
        std::mem::take(&mut self.overdrawn)
    }
}

/// The cards a node starting on its store announces again at its first heartbeat, of `own` (its
/// cards): all of them when they are within the budget, none when they are a bulk.
pub fn again_at_start<T>(own: impl IntoIterator<Item = T>) -> Vec<T> {
    let mut again: Vec<T> = own.into_iter().take(ANNOUNCE_BUDGET + 1).collect();
    if again.len() > ANNOUNCE_BUDGET {
        again.clear();
    }
    again
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_burst_is_gossiped_up_to_the_budget_per_interval_and_the_rest_is_left_to_sync() {
        let mut announcements = Announcements::default();
        let gossiped = (0..ANNOUNCE_BUDGET * 3).filter(|_| announcements.take()).count();
        assert_eq!(gossiped, ANNOUNCE_BUDGET);
        assert!(!announcements.take(), "nothing more in this interval");
        assert!(announcements.refill(), "the interval that ended was a bulk");
        assert!(announcements.take(), "the next interval has its own budget");
        assert_eq!((0..ANNOUNCE_BUDGET * 2).filter(|_| announcements.take()).count(), ANNOUNCE_BUDGET - 1);
        assert!(announcements.refill());
        // An interval within its budget is no bulk.
        assert!((0..ANNOUNCE_BUDGET).all(|_| announcements.take()));
        assert!(!announcements.refill());
        assert_eq!(again_at_start(0..ANNOUNCE_BUDGET), Vec::from_iter(0..ANNOUNCE_BUDGET));
        assert!(again_at_start(0..ANNOUNCE_BUDGET + 1).is_empty(), "a store of more is a bulk");
    }
}
