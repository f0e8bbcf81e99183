//! The sled store: one tree of records, keyed `agent_id \0 publisher`. Values are versioned CBOR.
//!
//! Only writers touch it; queries read the in-memory snapshot. Heartbeat times are not stored at all
//! (they are worthless after a restart), so a heartbeat never rewrites a card row.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use serde_bytes::ByteBuf;

use crate::defaults::SLED_CACHE_BYTES;

/// Version of the row format; a row of another version is reported, never misread.
const ROW_VERSION: u8 = 1;
const RECORDS_TREE: &str = "records";
/// How often, and how far apart, `reopen` retries a lock not yet released (2 s in all).
const REOPEN_ATTEMPTS: u32 = 100;
const REOPEN_PAUSE: std::time::Duration = std::time::Duration::from_millis(20);

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("cannot open store at {path}: {source}")]
    Open { path: PathBuf, source: sled::Error },
    #[error("store write failed: {0}")]
    Write(sled::Error),
    #[error("store read failed: {0}")]
    Read(sled::Error),
}

/// One stored record, as written.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Row {
    pub version: u8,
    /// PeerId bytes of the publisher.
    pub publisher: ByteBuf,
    pub agent_id: String,
    pub seq: u64,
    /// 0 remote, 1 local with its own heartbeats, 2 local vouched for by this node.
    pub origin: u8,
    pub updated_at: u64,
    /// The card as canonical compact JSON: the text the publisher signed.
    pub card: String,
    /// The publisher's signature over the card message (see `wire`).
    #[serde(default)]
    pub sig: ByteBuf,
}

impl Row {
    pub fn new(
        publisher: &[u8],
        agent_id: String,
        seq: u64,
        origin: u8,
        updated_at: u64,
        card: String,
        sig: &[u8],
    ) -> Self {
        Self {
            version: ROW_VERSION,
            publisher: ByteBuf::from(publisher),
            agent_id,
            seq,
            origin,
            updated_at,
            card,
            sig: ByteBuf::from(sig),
        }
    }

    fn key(&self) -> Vec<u8> {
        row_key(&self.agent_id, &self.publisher)
    }
}

pub fn row_key(agent_id: &str, publisher: &[u8]) -> Vec<u8> {
    let mut key = Vec::with_capacity(agent_id.len() + 1 + publisher.len());
    key.extend_from_slice(agent_id.as_bytes());
    key.push(0);
    key.extend_from_slice(publisher);
    key
}

#[derive(Clone)]
pub struct Store {
    db: sled::Db,
    records: sled::Tree,
}

impl Store {
    pub fn open(dir: &Path) -> Result<Self, StoreError> {
        let open_err = |source| StoreError::Open { path: dir.to_owned(), source };
        let db = sled::Config::new().path(dir).cache_capacity(SLED_CACHE_BYTES).open().map_err(open_err)?;
        let records = db.open_tree(RECORDS_TREE).map_err(open_err)?;
        Ok(Self { db, records })
    }

    /// Opens a store, waiting briefly for its file lock: sled releases the lock from a background thread
    /// after the handle is dropped, so a store this process has just closed (a restart in place, the
    /// reopen after loading) can find it still held. Another live process keeps it, and fails after 2 s.
    pub fn reopen(dir: &Path) -> Result<Self, StoreError> {
        let mut attempts = 0;
        loop {
            match Self::open(dir) {
                Err(StoreError::Open { source: sled::Error::Io(e), .. })
                    if e.kind() == std::io::ErrorKind::WouldBlock || e.to_string().contains("lock") =>
                {
                    attempts += 1;
                    if attempts >= REOPEN_ATTEMPTS {
                        return Self::open(dir);
                    }
                    std::thread::sleep(REOPEN_PAUSE);
                }
                other => return other,
            }
        }
    }

    /// Hands every row to `visit`, one at a time, so a large store is never held twice in memory.
    /// A row that does not decode is counted and skipped (and left on disk for inspection); returns
    /// that count.
    pub fn load(&self, mut visit: impl FnMut(Row)) -> Result<usize, StoreError> {
        let mut unreadable = 0;
        for item in self.records.iter() {
            let (key, value) = item.map_err(StoreError::Read)?;
            match ciborium::from_reader::<Row, _>(value.as_ref()) {
                Ok(row) if row.version == ROW_VERSION && row.key() == key.as_ref() => visit(row),
                Ok(row) => {
                    tracing::warn!(version = row.version, "skipping store row of unknown version or key");
                    unreadable += 1;
                }
                Err(error) => {
                    tracing::warn!(%error, "skipping unreadable store row");
                    unreadable += 1;
                }
            }
        }
        Ok(unreadable)
    }

    /// Writes the row; with `durable`, returns only once it is on disk. Local records are durable
    /// before they are acknowledged; remote ones can always be fetched again from the mesh, so they ride
    /// on sled's periodic flush instead of paying an fsync each.
    pub async fn put(&self, row: &Row, durable: bool) -> Result<(), StoreError> {
        let mut value = Vec::with_capacity(row.card.len() + 64);
        // Encoding into a Vec cannot fail for this plain struct.
        ciborium::into_writer(row, &mut value)
            .map_err(|e| StoreError::Write(sled::Error::Unsupported(e.to_string())))?;
        self.records.insert(row.key(), value).map_err(StoreError::Write)?;
        if durable {
            self.flush().await?;
        }
        Ok(())
    }

    /// Removes the row; with `durable`, returns only once that is on disk.
    pub async fn remove(&self, agent_id: &str, publisher: &[u8], durable: bool) -> Result<(), StoreError> {
        self.records.remove(row_key(agent_id, publisher)).map_err(StoreError::Write)?;
        if durable {
            self.flush().await?;
        }
        Ok(())
    }

    pub async fn flush(&self) -> Result<(), StoreError> {
        self.db.flush_async().await.map(|_| ()).map_err(StoreError::Write)
    }

    /// Writes many rows with one flush (bulk loads and tooling).
    pub async fn put_many(&self, rows: &[Row]) -> Result<(), StoreError> {
        let mut batch = sled::Batch::default();
        for row in rows {
            let mut value = Vec::new();
            ciborium::into_writer(row, &mut value)
                .map_err(|e| StoreError::Write(sled::Error::Unsupported(e.to_string())))?;
            batch.insert(row.key(), value);
        }
        self.records.apply_batch(batch).map_err(StoreError::Write)?;
        self.flush().await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn rows_survive_reopen_and_bad_rows_are_skipped() {
        let dir = tempfile::tempdir().unwrap();
        let row = Row::new(&[1, 2, 3], "a".into(), 7, 1, 42, "{}".into(), &[9; 64]);
        {
            let store = Store::open(dir.path()).unwrap();
            store.put(&row, true).await.unwrap();
            store.records.insert(b"junk", b"not cbor".to_vec()).unwrap();
            store.flush().await.unwrap();
        }
        let store = Store::reopen(dir.path()).unwrap();
        let mut rows = Vec::new();
        assert_eq!(store.load(|r| rows.push(r)).unwrap(), 1, "one unreadable row");
        assert_eq!(rows, vec![row.clone()]);
        store.remove("a", &[1, 2, 3], true).await.unwrap();
        let mut count = 0;
        store.load(|_| count += 1).unwrap();
        assert_eq!(count, 0);
    }
}
