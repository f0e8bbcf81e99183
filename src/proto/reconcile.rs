//! Anti-entropy by range-based set reconciliation (Negentropy): two nodes compare fingerprints of
//! sorted ranges of their record sets and split only the ranges that differ, so the bytes exchanged
//! grow with the difference, not with the view. Two views of 10,000 records that differ by one card
//! reconcile in 1.7 KB, both ways together (the unit test below asserts at most 2 KiB).
//!
//! A record is its id, `SHA-256(publisher ‖ 0 ‖ agent_id ‖ seq)`, ordered by `(seq, id)`: seqs start at
//! wall-clock milliseconds, so recent changes sit together at the end of the order. A newer seq of a
//! record is a different id: the initiator sees it as one it needs (and one it holds that the other
//! lacks). Each frame stands alone (no session state on either side), so a round can be resumed
//! against a view that changed meanwhile. Pure: no I/O, no clock.

use libp2p::identity::PeerId;
use negentropy::{Id, Negentropy, NegentropyStorageVector};
use sha2::Digest as _;

pub use crate::defaults::RECONCILE_FRAME_BYTES;

/// A record's identity and version: `(publisher, agent_id, seq)` hashed.
pub type RecordId = [u8; 32];

#[derive(Debug, thiserror::Error)]
pub enum ReconcileError {
    #[error("reconciliation frame refused: {0}")]
    Frame(String),
}

impl From<negentropy::Error> for ReconcileError {
    fn from(e: negentropy::Error) -> Self {
        ReconcileError::Frame(e.to_string())
    }
}

/// The id of a record at a seq.
pub fn record_id(publisher: &PeerId, agent_id: &str, seq: u64) -> RecordId {
    let mut h = sha2::Sha256::new();
    h.update(publisher.to_bytes());
    h.update([0]);
    h.update(agent_id.as_bytes());
    h.update(seq.to_be_bytes());
    h.finalize().into()
}

/// Every record a node holds, as reconciliation sees them, with the way back from an id to the record.
pub struct Index {
    storage: NegentropyStorageVector,
    /// Each record's id and its position in the order [`Index::build`] was given the records, sorted by
    /// id: 36 bytes a record, where a map to each record's key took about 180 (9 MB at 50,000 records).
    /// The caller keeps the records in that order and finds them again by position.
    positions: Vec<(RecordId, u32)>,
}

impl std::fmt::Debug for Index {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Index").field("records", &self.positions.len()).finish()
    }
}

/// What one reply taught the initiator.
#[derive(Debug, Default)]
pub struct Step {
    /// The next frame to send, or `None` when the two sets are reconciled.
    pub next: Option<Vec<u8>>,
    /// Records the other side holds and this one does not (or not at that seq).
    pub need: Vec<RecordId>,
    /// How many records this side holds that the other lacks (it fetches them when it reconciles).
    pub have: usize,
}

impl Index {
    /// Indexes `(publisher, agent_id, seq)` of every record held (at most `u32::MAX` of them: the view
    /// is bounded far below that).
    pub fn build<'a>(records: impl IntoIterator<Item = (&'a PeerId, &'a str, u64)>) -> Index {
        Index::of_ids(
            records.into_iter().map(|(publisher, agent_id, seq)| (seq, record_id(publisher, agent_id, seq))),
        )
    }

    /// [`Index::build`] for a caller that keeps each record's id ([`record_id`]) beside it: `(seq, id)`
    /// of every record held. The daemon rebuilds its index whenever the view changed, and hashing
    /// every record again each time was most of the rebuild.
    pub fn of_ids(records: impl IntoIterator<Item = (u64, RecordId)>) -> Index {
        let records = records.into_iter();
        let mut storage = NegentropyStorageVector::with_capacity(records.size_hint().0);
        let mut positions = Vec::with_capacity(records.size_hint().0);
        for (position, (seq, id)) in (0u32..).zip(records) {
            // Inserting into an unsealed vector cannot fail.
            let _ = storage.insert(seq, Id::from_byte_array(id));
            positions.push((id, position));
        }
        let _ = storage.seal();
        positions.sort_unstable_by_key(|&(id, _)| id);
        Index { storage, positions }
    }

    /// The position, in the order [`Index::build`] was given them, of the record an id names, if held
    /// at exactly that seq.
    pub fn position(&self, id: &RecordId) -> Option<usize> {
        let at = self.positions.binary_search_by(|(held, _)| held.cmp(id)).ok()?;
        self.positions.get(at).map(|&(_, position)| position as usize)
    }

    fn session(&self) -> Result<Negentropy<'_, NegentropyStorageVector>, ReconcileError> {
        Ok(Negentropy::borrowed(&self.storage, RECONCILE_FRAME_BYTES as u64)?)
    }

    /// The first frame of a reconciliation this node starts.
    pub fn initiate(&self) -> Result<Vec<u8>, ReconcileError> {
        Ok(self.session()?.initiate()?)
    }

    /// The answer to a peer's frame.
    pub fn respond(&self, frame: &[u8]) -> Result<Vec<u8>, ReconcileError> {
        Ok(self.session()?.reconcile(frame)?)
    }

    /// Reads the answer to a frame this node sent.
    pub fn step(&self, reply: &[u8]) -> Result<Step, ReconcileError> {
        let mut session = self.session()?;
        session.set_initiator();
        let (mut have, mut need) = (Vec::new(), Vec::new());
        let next = session.reconcile_with_ids(reply, &mut have, &mut need)?;
        let need = need.into_iter().map(|id| id.to_bytes()).collect();
        Ok(Step { next, need, have: have.len() })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use libp2p::identity::Keypair;

    fn peer(n: u8) -> PeerId {
        Keypair::ed25519_from_bytes([n; 32]).unwrap().public().to_peer_id()
    }

    fn records(publisher: PeerId, n: usize, seq: u64) -> Vec<(PeerId, String, u64)> {
        (0..n).map(|i| (publisher, format!("agent-{i}"), seq + i as u64)).collect()
    }

    fn index(records: &[(PeerId, String, u64)]) -> Index {
        Index::build(records.iter().map(|(p, a, s)| (p, a.as_str(), *s)))
    }

    /// Runs a whole reconciliation; returns what the initiator needs and the bytes both ways.
    fn reconcile(mine: &Index, theirs: &Index) -> (Vec<RecordId>, usize, usize) {
        let mut frame = mine.initiate().unwrap();
        let (mut need, mut bytes, mut rounds) = (Vec::new(), 0, 0);
        loop {
            rounds += 1;
            let reply = theirs.respond(&frame).unwrap();
            bytes += frame.len() + reply.len();
            let step = mine.step(&reply).unwrap();
            need.extend(step.need);
            match step.next {
                Some(next) => frame = next,
                None => return (need, bytes, rounds),
            }
        }
    }

    #[test]
    fn a_newcomer_learns_every_record_it_lacks() {
        let p = peer(1);
        let held = records(p, 10_000, 1_700_000_000_000);
        let full = index(&held);
        let empty = index(&[]);
        let (need, bytes, rounds) = reconcile(&empty, &full);
        assert_eq!(need.len(), 10_000);
        for id in &need {
            let (publisher, agent_id, seq) =
                &held[full.position(id).expect("every id maps back to a record")];
            assert_eq!(record_id(publisher, agent_id, *seq), *id, "to the record it names");
        }
        assert_eq!(full.position(&record_id(&p, "agent-0", 1)), None, "another seq is another record");
        // Ids at 32 bytes each, in frames of at most RECONCILE_FRAME_BYTES.
        assert!(bytes < 10_000 * 40, "{bytes} bytes");
        assert!(rounds >= 2, "{rounds} rounds");
    }

    #[test]
    fn one_changed_card_in_ten_thousand_costs_under_two_kilobytes() {
        let p = peer(1);
        let base = records(p, 10_000, 1_700_000_000_000);
        let mut newer = base.clone();
        newer[4_321].2 = 1_800_000_000_000;
        let (need, bytes, _) = reconcile(&index(&base), &index(&newer));
        assert_eq!(need, vec![record_id(&p, "agent-4321", 1_800_000_000_000)]);
        // Printed for BENCHMARKS.md (`cargo test --lib one_changed_card -- --nocapture`).
        eprintln!("one changed card in 10,000: {bytes} bytes both ways");
        assert!(bytes <= 2048, "{bytes} bytes for one change");
        let (need, _, rounds) = reconcile(&index(&base), &index(&base));
        assert!(need.is_empty());
        assert_eq!(rounds, 1, "equal sets agree on the first frame");
    }

    #[test]
    fn both_sides_learn_their_differences_whoever_starts() {
        let (a, b) = (peer(1), peer(2));
        let mut left = records(a, 500, 10);
        let mut right = left[100..].to_vec();
        right.extend(records(b, 300, 50_000));
        left.truncate(450);
        let (l, r) = (index(&left), index(&right));
        let (need, _, _) = reconcile(&l, &r);
        let want: std::collections::HashSet<_> =
            right.iter().filter(|x| !left.contains(x)).map(|(p, id, s)| record_id(p, id, *s)).collect();
        assert_eq!(need.into_iter().collect::<std::collections::HashSet<_>>(), want);
        let (need, _, _) = reconcile(&r, &l);
        assert_eq!(need.len(), 100, "the first hundred are only on the left");
    }

    #[test]
    fn garbage_frames_are_refused_not_panicked_on() {
        let index = index(&records(peer(1), 100, 1));
        for frame in [&b""[..], &[0x61], &[0x61, 0xff, 0xff, 0xff], &[0x00; 40], &[0x61; 4096]] {
            let _ = index.respond(frame);
            let _ = index.step(frame);
        }
    }
}
