//! A witness of the local agents the store holds, kept beside it, so that a store that lost some of
//! them (a truncated or corrupted file that sled opens anyway, by dropping what it cannot read) is
//! noticed at start instead of serving a silently smaller view.
//!
//! The witness is the count of local records and an order-independent digest of their
//! `(agent_id, seq)`, written (to a temporary file, fsynced, renamed) before each durable local change,
//! together with that change. At start the store must match the witness either before or after its
//! pending change: a crash between the two writes is not a loss. Remote records are not witnessed:
//! the mesh sends them again.

use std::io::Write;
use std::path::{Path, PathBuf};

use sha2::Digest as _;

/// The witness file, inside the store directory (deleting the store deletes it too).
pub const WITNESS_FILE: &str = "agentmesh-local.sum";
const HEADER: &str = "agentmesh local records v1";

#[derive(Debug, thiserror::Error)]
pub enum WitnessError {
    #[error("cannot write {path}: {source}")]
    Write { path: PathBuf, source: std::io::Error },
    #[error("{path} is damaged ({reason}); remove it to trust the store as it is")]
    Corrupt { path: PathBuf, reason: String },
    #[error(
        "the store at {path} does not hold the local agents it acknowledged ({found} found, {expected} \
         expected, or not at their acknowledged versions): its files were truncated, corrupted or \
         replaced. Restore the data directory from a backup, or start once with --accept-store-loss to \
         continue with what it holds"
    )]
    Lost { path: PathBuf, expected: u64, found: u64 },
}

/// Count and digest of a set of local records.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Sum {
    pub count: u64,
    pub digest: u64,
}

fn record_hash(agent_id: &str, seq: u64) -> u64 {
    let mut h = sha2::Sha256::new();
    h.update(agent_id.as_bytes());
    h.update([0]);
    h.update(seq.to_be_bytes());
    u64::from_be_bytes(h.finalize()[..8].try_into().unwrap_or_default())
}

impl Sum {
    pub fn add(&mut self, agent_id: &str, seq: u64) {
        self.count += 1;
        self.digest ^= record_hash(agent_id, seq);
    }

    pub fn remove(&mut self, agent_id: &str, seq: u64) {
        self.count = self.count.saturating_sub(1);
        self.digest ^= record_hash(agent_id, seq);
    }
}

/// One durable local change: a record's seq before (`None`: new) and after (`None`: removed).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Change {
    pub agent_id: String,
    pub before: Option<u64>,
    pub after: Option<u64>,
}

impl Change {
    fn apply(&self, mut sum: Sum) -> Sum {
        if let Some(seq) = self.before {
            sum.remove(&self.agent_id, seq);
        }
        if let Some(seq) = self.after {
            sum.add(&self.agent_id, seq);
        }
        sum
    }
}

/// What the file holds: the sum of what is stored, and the sum once the change being made is in
/// (equal when none is).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct Written {
    committed: Sum,
    pending: Sum,
}

impl Written {
    fn encode(&self) -> String {
        let body = format!(
            "{HEADER}\n{} {:016x}\n{} {:016x}\n",
            self.committed.count, self.committed.digest, self.pending.count, self.pending.digest
        );
        let check = sha2::Sha256::digest(body.as_bytes());
        format!("{body}{}\n", hex8(&check[..8]))
    }

    fn decode(text: &str) -> Result<Written, String> {
        let lines: Vec<&str> = text.lines().collect();
        let [header, committed, pending, check] = lines.as_slice() else {
            return Err(format!("{} lines, expected 4", lines.len()));
        };
        if *header != HEADER {
            return Err("unknown header".into());
        }
        let body = format!("{header}\n{committed}\n{pending}\n");
        if hex8(&sha2::Sha256::digest(body.as_bytes())[..8]) != *check {
            return Err("checksum does not match".into());
        }
        let sum = |line: &str| -> Result<Sum, String> {
            let (count, digest) = line.split_once(' ').ok_or("malformed line")?;
            Ok(Sum {
                count: count.parse().map_err(|_| "malformed count")?,
                digest: u64::from_str_radix(digest, 16).map_err(|_| "malformed digest")?,
            })
        };
        Ok(Written { committed: sum(committed)?, pending: sum(pending)? })
    }
}

fn hex8(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The witness of one store directory.
#[derive(Debug)]
pub struct Witness {
    path: PathBuf,
    /// The sum after every change written so far.
    current: Sum,
}

impl Witness {
    /// Checks the store's local records (`found`) against the witness in `store_dir`. No witness (a
    /// new store, or one from a version without it): the store is trusted and a witness is started.
    pub fn open(store_dir: &Path, found: Sum, accept_loss: bool) -> Result<Witness, WitnessError> {
        let path = store_dir.join(WITNESS_FILE);
        let this = Witness { path: path.clone(), current: found };
        match std::fs::read_to_string(&path) {
            Ok(text) => {
                let witness = Written::decode(&text)
                    .map_err(|reason| WitnessError::Corrupt { path: path.clone(), reason })?;
                let matches = found == witness.committed || found == witness.pending;
                if !matches && !accept_loss {
                    let expected = witness.committed.count.max(witness.pending.count);
                    return Err(WitnessError::Lost {
                        path: store_dir.to_owned(),
                        expected,
                        found: found.count,
                    });
                }
                if !matches {
                    tracing::warn!(
                        expected = witness.committed.count,
                        found = found.count,
                        "continuing with a store that lost local agents (--accept-store-loss)"
                    );
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(WitnessError::Corrupt { path, reason: e.to_string() }),
        }
        this.write(&Written { committed: found, pending: found })?;
        Ok(this)
    }

    /// Records changes about to be written to the store at once (one write or one atomic batch). Call
    /// before the store write; an error means the changes must not be made.
    pub fn before_all(&mut self, changes: &[Change]) -> Result<(), WitnessError> {
        let after = changes.iter().fold(self.current, |sum, change| change.apply(sum));
        self.write(&Written { committed: self.current, pending: after })?;
        self.current = after;
        Ok(())
    }

    /// Local records held, as of the last change recorded.
    pub fn local_records(&self) -> usize {
        self.current.count as usize
    }

    /// Forgets changes that were recorded but failed in the store.
    pub fn undo(&mut self, changes: &[Change]) {
        for change in changes {
            let undone =
                Change { agent_id: change.agent_id.clone(), before: change.after, after: change.before };
            self.current = undone.apply(self.current);
        }
    }

    fn write(&self, witness: &Written) -> Result<(), WitnessError> {
        let err = |source| WitnessError::Write { path: self.path.clone(), source };
        let tmp = self.path.with_extension("tmp");
        let mut file = std::fs::File::create(&tmp).map_err(err)?;
        file.write_all(witness.encode().as_bytes()).map_err(err)?;
        file.sync_all().map_err(err)?;
        std::fs::rename(&tmp, &self.path).map_err(err)?;
        if let Some(dir) = self.path.parent() {
            std::fs::File::open(dir).and_then(|d| d.sync_all()).map_err(err)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sum(records: &[(&str, u64)]) -> Sum {
        let mut s = Sum::default();
        for (id, seq) in records {
            s.add(id, *seq);
        }
        s
    }

    #[test]
    fn a_store_matching_before_or_after_the_pending_change_passes_and_anything_else_fails() {
        // Crashed before the store write, or after it: both fine.
        for stored in [sum(&[("a", 1)]), sum(&[("a", 1), ("b", 5)])] {
            let dir = tempfile::tempdir().unwrap();
            let mut g = Witness::open(dir.path(), sum(&[("a", 1)]), false).unwrap();
            g.before_all(&[Change { agent_id: "b".into(), before: None, after: Some(5) }]).unwrap();
            Witness::open(dir.path(), stored, false).unwrap();
        }
        let dir = tempfile::tempdir().unwrap();
        let mut g = Witness::open(dir.path(), sum(&[("a", 1), ("b", 5)]), false).unwrap();
        g.before_all(&[Change { agent_id: "a".into(), before: Some(1), after: Some(2) }]).unwrap();
        // The store lost b: refused, naming the counts.
        let e = Witness::open(dir.path(), sum(&[("a", 2)]), false).unwrap_err();
        assert!(matches!(e, WitnessError::Lost { expected: 2, found: 1, .. }), "{e}");
        // Same count, other content (an older version of a after a rollback): refused too.
        assert!(Witness::open(dir.path(), sum(&[("a", 1), ("b", 4)]), false).is_err());
        // Accepting the loss rebases the witness.
        Witness::open(dir.path(), sum(&[("a", 2)]), true).unwrap();
        Witness::open(dir.path(), sum(&[("a", 2)]), false).unwrap();
    }

    #[test]
    fn a_damaged_witness_is_a_clear_error() {
        let dir = tempfile::tempdir().unwrap();
        Witness::open(dir.path(), sum(&[("a", 1)]), false).unwrap();
        let path = dir.path().join(WITNESS_FILE);
        let text = std::fs::read_to_string(&path).unwrap().replace("1 ", "7 ");
        std::fs::write(&path, text).unwrap();
        let e = Witness::open(dir.path(), sum(&[("a", 1)]), false).unwrap_err();
        assert!(e.to_string().contains("damaged") && e.to_string().contains(WITNESS_FILE), "{e}");
    }

    #[test]
    fn a_new_store_starts_a_witness() {
        let dir = tempfile::tempdir().unwrap();
        Witness::open(dir.path(), Sum::default(), false).unwrap();
        assert!(dir.path().join(WITNESS_FILE).exists());
        let e = Witness::open(dir.path(), sum(&[("x", 1)]), false);
        assert!(
            e.is_err(),
            "records that were never witnessed appeared: not a loss, but not this store either"
        );
    }
}
