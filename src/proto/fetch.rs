//! Which records to fetch, and from whom: a record that reconciliation or a heartbeat shows missing is
//! asked of one peer at a time. A newcomer reconciling with several peers at once learns the same
//! missing records from each; only the first claim sends a request, the others find it taken. A claim
//! ends when its answer has had time to be applied, or at once when the request fails, and then the
//! record may be asked of someone else. Pure: time is a parameter.

use std::collections::HashMap;

use super::reconcile::RecordId;
use crate::clock::Millis;
pub use crate::defaults::{FETCH_BATCH, FETCH_GRACE, FETCH_TIMEOUT, MAX_PENDING_FETCHES};

/// Records asked for and not yet given up on, each with the time its claim lapses.
#[derive(Debug, Default)]
pub struct Fetches {
    claimed: HashMap<RecordId, Millis>,
}

impl Fetches {
    /// Claims those of `ids` nobody is fetching, until `now + FETCH_TIMEOUT`, as requests of at most
    /// `FETCH_BATCH` ids. At most `MAX_PENDING_FETCHES` claims are held: the rest waits for a later
    /// round (a peer that claims a million records costs a bounded table).
    pub fn claim(&mut self, ids: impl IntoIterator<Item = RecordId>, now: Millis) -> Vec<Vec<RecordId>> {
        self.expire(now);
        let lapse = now + FETCH_TIMEOUT.as_millis() as Millis;
        let mut batches: Vec<Vec<RecordId>> = Vec::new();
        for id in ids {
            if self.claimed.len() >= MAX_PENDING_FETCHES {
                break;
            }
            if self.claimed.contains_key(&id) {
                continue;
            }
            self.claimed.insert(id, lapse);
            match batches.last_mut() {
                Some(batch) if batch.len() < FETCH_BATCH => batch.push(id),
                _ => batches.push(vec![id]),
            }
        }
        batches
    }

    /// The answer came: the claims hold a little longer, while the ingest worker applies it, so that a
    /// reconciliation meanwhile does not ask again for what is on its way into the view.
    pub fn answered(&mut self, ids: &[RecordId], now: Millis) {
        let lapse = now + FETCH_GRACE.as_millis() as Millis;
        for id in ids {
            if let Some(at) = self.claimed.get_mut(id) {
                *at = lapse;
            }
        }
    }

    /// The request failed, or its answer was applied: the records may be asked for again at once
    /// (those applied are no longer missing).
    pub fn failed(&mut self, ids: &[RecordId]) {
        for id in ids {
            self.claimed.remove(id);
        }
        self.give_back();
    }

    /// Records claimed now.
    pub fn claimed(&self) -> usize {
        self.claimed.len()
    }

    pub fn expire(&mut self, now: Millis) {
        self.claimed.retain(|_, &mut at| at > now);
        self.give_back();
    }

    /// A catch-up claims the whole view at once; once its claims are settled the table shrinks back
    /// instead of keeping room for all of them for the node's life (0.7 MB at 10,000 records).
    fn give_back(&mut self) {
        let room = self.claimed.capacity();
        if room > KEPT_ROOM && room > 4 * self.claimed.len() {
            self.claimed.shrink_to((2 * self.claimed.len()).max(KEPT_ROOM));
        }
    }
}

/// Claims the table keeps room for when it shrinks: one fetch request's worth, so that the usual
/// trickle of fetches never reallocates it.
const KEPT_ROOM: usize = FETCH_BATCH;

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(range: std::ops::Range<u32>) -> Vec<RecordId> {
        range
            .map(|i| {
                let mut id = [0u8; 32];
                id[..4].copy_from_slice(&i.to_be_bytes());
                id
            })
            .collect()
    }

    #[test]
    fn a_record_is_asked_of_one_peer_at_a_time() {
        let mut f = Fetches::default();
        let first = f.claim(ids(0..1000), 0);
        assert_eq!(first.iter().map(Vec::len).sum::<usize>(), 1000);
        assert!(first.iter().all(|b| b.len() <= FETCH_BATCH));
        // A second peer shows the same records and 10 more: only the 10 are asked of it.
        let second = f.claim(ids(0..1010), 5);
        assert_eq!(second.concat(), ids(1000..1010));
        // The first answer came: still not asked again while it is applied.
        f.answered(&first.concat(), 10);
        assert!(f.claim(ids(0..1000), 11).is_empty());
        // Not applied by the end of the grace (refused, say): asked again.
        let grace = FETCH_GRACE.as_millis() as u64;
        assert_eq!(f.claim(ids(0..1000), 11 + grace).concat().len(), 1000);
    }

    #[test]
    fn a_failed_request_frees_its_records_and_a_silent_one_lapses() {
        let mut f = Fetches::default();
        let batch = f.claim(ids(0..10), 0).concat();
        f.failed(&batch[..5]);
        assert_eq!(f.claim(ids(0..10), 1).concat(), ids(0..5));
        let timeout = FETCH_TIMEOUT.as_millis() as u64;
        assert_eq!(f.claim(ids(0..10), timeout + 2).concat().len(), 10, "lapsed claims are taken again");
    }

    #[test]
    fn the_table_shrinks_back_once_a_catch_up_is_settled() {
        let mut f = Fetches::default();
        let catch_up = f.claim(ids(0..10_000), 0).concat();
        assert!(f.claimed.capacity() >= 10_000);
        f.failed(&catch_up[..9_000]);
        assert!(
            f.claimed.capacity() <= 4 * 1_000,
            "room for {} claims with 1,000 held",
            f.claimed.capacity()
        );
        f.expire(FETCH_TIMEOUT.as_millis() as u64 + 1);
        assert!(f.claimed.is_empty());
        assert!(
            f.claimed.capacity() <= 2 * KEPT_ROOM,
            "room for {} claims with none held",
            f.claimed.capacity()
        );
        assert_eq!(f.claim(ids(0..10), 1_000_000).concat(), ids(0..10), "and claims as before");
    }

    #[test]
    fn claims_are_bounded() {
        let mut f = Fetches::default();
        let n = MAX_PENDING_FETCHES as u32;
        assert_eq!(f.claim(ids(0..n + 10), 0).concat().len(), MAX_PENDING_FETCHES);
        assert_eq!(f.claimed.len(), MAX_PENDING_FETCHES);
        assert!(f.claim(ids(n..n + 10), 1).is_empty(), "the rest waits for a later round");
    }
}
