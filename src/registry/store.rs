//! The sled store: one tree of records, keyed `agent_id \0 publisher`. Values are versioned CBOR.
//!
//! Only writers touch it; queries read the in-memory snapshot. Heartbeat times are not stored at all
//! (they are worthless after a restart), so a heartbeat never rewrites a card row.
//!
//! Each row carries a seal: a keyed BLAKE3 hash, under a key only this node's identity can derive
//! ([`SealKey`]), of everything the row says (rows sealed by older versions carry an HMAC-SHA256). A
//! row is written only after what it holds was verified (signatures, canonical form), so at start a row
//! whose seal checks is taken as it is: a few microseconds instead of two Ed25519 verifications and a
//! card parse. A row without a valid seal (written by an older version, damaged, or from another node's
//! data directory) is verified in full.

use std::path::{Path, PathBuf};

use hmac::Mac as _;
use serde::{Deserialize, Serialize};
use serde_bytes::ByteBuf;

use crate::defaults::{SLED_CACHE_BYTES, STORE_FLUSH_EVERY};

/// Version of the row format this node writes: the card's text as the view holds it, compressed, so
/// that a start takes it as it is instead of compressing every card again (a third of a start's work),
/// and a row is about a third of the size. A row of another version is reported, never misread.
const ROW_VERSION: u8 = 2;
/// Rows written by older versions: the card's text as it is. Still read.
const ROW_VERSION_TEXT: u8 = 1;
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
    #[error("store closed: its last reopen failed ({0}); the next one is tried shortly")]
    Closed(String),
    /// A batch of rows that failed as a whole: each of its rows reports the one error.
    #[error("store write of a batch failed: {0}")]
    Batch(String),
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
    /// Version 1: the card as canonical compact JSON, the text the publisher signed. Version 2: empty.
    pub card: String,
    /// The publisher's signature over the card message (see `wire`).
    #[serde(default)]
    pub sig: ByteBuf,
    /// This node's seal over the row ([`SealKey`]); empty on rows written before seals.
    #[serde(default)]
    pub seal: ByteBuf,
    /// Version 2: the card's canonical compact JSON as one zstd frame, as the view holds it
    /// ([`crate::card::held::HeldCard::packed`]).
    #[serde(default)]
    pub packed: ByteBuf,
}

type HmacSha256 = hmac::Hmac<sha2::Sha256>;

/// The first byte of a seal made with keyed BLAKE3 (33 bytes in all). A seal of 32 bytes on a version 1
/// row is an HMAC-SHA256, as rows were sealed before: still accepted, never made.
const SEAL_BLAKE3: u8 = 2;

/// The keys of the rows' seals, derived from the node's identity: the Ed25519 signature of a fixed
/// label (deterministic, and unforgeable without the secret key), hashed. Never logged.
///
/// Seals are keyed BLAKE3: over a card of 2.5 KB it is several times cheaper than HMAC-SHA256 on a CPU
/// without SHA instructions, where the HMAC was about a tenth of what a card costs the node that takes
/// it, and every row's seal is checked again at start. The HMAC key is kept to accept older rows.
#[derive(Clone)]
pub struct SealKey {
    blake3: [u8; 32],
    hmac: [u8; 32],
}

impl std::fmt::Debug for SealKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SealKey(..)")
    }
}

const SEAL_LABEL: &[u8] = b"agentmesh store row seal v1";
/// BLAKE3's key derivation context for the seal key (its own domain, apart from the HMAC key's).
const SEAL_CONTEXT: &str = "agentmesh 2026-11 store row seal v2";

impl SealKey {
    pub fn derive(signer: &libp2p::identity::Keypair) -> Self {
        use sha2::Digest as _;
        // Signing with an Ed25519 key cannot fail; were it to, the key would still be this node's
        // own (a hash of the label), and other nodes' rows would still fail over to full verification.
        let signature = signer.sign(SEAL_LABEL).unwrap_or_default();
        Self {
            blake3: blake3::derive_key(SEAL_CONTEXT, &signature),
            hmac: sha2::Sha256::new().chain_update(SEAL_LABEL).chain_update(&signature).finalize().into(),
        }
    }

    /// Feeds what a seal covers to `update`: length-prefixed fields, so no two rows share a message
    /// (a version 1 row's message is what it was when such rows were written).
    fn message(row: &Row, mut update: impl FnMut(&[u8])) {
        let packed = (row.version != ROW_VERSION_TEXT).then_some(&row.packed[..]);
        let fields = [&row.publisher[..], row.agent_id.as_bytes(), row.card.as_bytes(), &row.sig[..]];
        for field in fields.into_iter().chain(packed) {
            update(&(field.len() as u64).to_le_bytes());
            update(field);
        }
        update(&row.seq.to_le_bytes());
        update(&[row.version, row.origin]);
    }

    fn blake3(&self, row: &Row) -> blake3::Hash {
        let mut hasher = blake3::Hasher::new_keyed(&self.blake3);
        Self::message(row, |bytes| {
            hasher.update(bytes);
        });
        hasher.finalize()
    }

    fn hmac(&self, row: &Row) -> HmacSha256 {
        let mut mac =
            HmacSha256::new_from_slice(&self.hmac).unwrap_or_else(|_| unreachable!("any key length"));
        Self::message(row, |bytes| mac.update(bytes));
        mac
    }

    /// Seals `row` (written into it).
    pub fn seal(&self, row: &mut Row) {
        let mut seal = Vec::with_capacity(1 + blake3::OUT_LEN);
        seal.push(SEAL_BLAKE3);
        seal.extend_from_slice(self.blake3(row).as_bytes());
        row.seal = ByteBuf::from(seal);
    }

    /// Whether `row` carries this key's seal over what it holds now (constant-time comparison).
    pub fn sealed(&self, row: &Row) -> bool {
        // Told apart by length first: an HMAC is 32 bytes of any value, so one in 256 starts with the
        // BLAKE3 tag.
        match row.seal.split_first() {
            Some((&SEAL_BLAKE3, mac)) if mac.len() == blake3::OUT_LEN => {
                let mac = <[u8; blake3::OUT_LEN]>::try_from(mac).unwrap_or_else(|_| unreachable!());
                // `Hash`'s equality is constant-time.
                self.blake3(row) == blake3::Hash::from_bytes(mac)
            }
            // HMACs were made only by versions that wrote version 1 rows.
            _ if row.holds_text() && row.seal.len() == 32 => self.hmac(row).verify_slice(&row.seal).is_ok(),
            _ => false,
        }
    }
}

impl Row {
    /// A row of the current version; `packed` is the card's text as the view holds it.
    pub fn new(
        publisher: &[u8],
        agent_id: String,
        seq: u64,
        origin: u8,
        updated_at: u64,
        packed: &[u8],
        sig: &[u8],
    ) -> Self {
        Self {
            version: ROW_VERSION,
            publisher: ByteBuf::from(publisher),
            agent_id,
            seq,
            origin,
            updated_at,
            card: String::new(),
            sig: ByteBuf::from(sig),
            seal: ByteBuf::new(),
            packed: ByteBuf::from(packed),
        }
    }

    /// Whether the row holds the card's text as it is (version 1) rather than compressed.
    pub fn holds_text(&self) -> bool {
        self.version == ROW_VERSION_TEXT
    }

    /// The card's canonical text; `None` when a compressed text does not decompress to at most
    /// `MAX_CARD_TEXT` bytes of UTF-8.
    pub fn text(&self) -> Option<String> {
        if self.holds_text() {
            Some(self.card.clone())
        } else {
            crate::card::held::unpack(&self.packed)
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
        let db = sled::Config::new()
            .path(dir)
            .cache_capacity(SLED_CACHE_BYTES)
            .flush_every_ms(Some(STORE_FLUSH_EVERY.as_millis() as u64))
            .open()
            .map_err(open_err)?;
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
                Ok(row)
                    if (row.version == ROW_VERSION || row.version == ROW_VERSION_TEXT)
                        && row.key() == key.as_ref() =>
                {
                    visit(row)
                }
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
        self.records.insert(row.key(), encode(row)?).map_err(StoreError::Write)?;
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
        self.put_rows(rows)?;
        self.flush().await
    }

    /// Writes many rows as one atomic batch, without a flush: all of them or none.
    pub fn put_rows(&self, rows: &[Row]) -> Result<(), StoreError> {
        let mut batch = sled::Batch::default();
        for row in rows {
            batch.insert(row.key(), encode(row)?);
        }
        self.records.apply_batch(batch).map_err(StoreError::Write)
    }
}

/// A row as the store holds it (CBOR).
fn encode(row: &Row) -> Result<Vec<u8>, StoreError> {
    let mut value = Vec::with_capacity(row.card.len() + row.packed.len() + row.sig.len() + 96);
    // Encoding into a Vec cannot fail for this plain struct.
    ciborium::into_writer(row, &mut value)
        .map_err(|e| StoreError::Write(sled::Error::Unsupported(e.to_string())))?;
    Ok(value)
}

/// The store as the registry writes it: closed and reopened after a burst of writes, because sled keeps
/// every page a write touched in memory whatever its cache capacity (a node that had just caught up
/// with 10,000 remote agents held 23 MB in sled, and was 35 MB larger than the same node restarted on
/// the same data). Writes take the lock shared; a reopen takes it alone, so it waits for the writes
/// in flight and the writes that follow wait for it.
pub struct Reopening {
    dir: PathBuf,
    /// An error only while a reopen failed: writes fail until the next one succeeds.
    store: tokio::sync::RwLock<Result<Store, String>>,
    /// Rows written or removed since the store was last opened.
    written: std::sync::atomic::AtomicUsize,
}

impl Reopening {
    pub fn new(dir: &Path, store: Store) -> Self {
        Self { dir: dir.to_owned(), store: tokio::sync::RwLock::new(Ok(store)), written: Default::default() }
    }

    /// Rows written or removed since the store was last opened.
    pub fn written(&self) -> usize {
        self.written.load(std::sync::atomic::Ordering::Relaxed)
    }

    async fn with<T>(
        &self,
        rows: usize,
        write: impl AsyncFnOnce(&Store) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        let store = self.store.read().await;
        let store = store.as_ref().map_err(|e| StoreError::Closed(e.clone()))?;
        let done = write(store).await?;
        self.written.fetch_add(rows, std::sync::atomic::Ordering::Relaxed);
        Ok(done)
    }

    pub async fn put(&self, row: &Row, durable: bool) -> Result<(), StoreError> {
        self.with(1, async |s| s.put(row, durable).await).await
    }

    pub async fn remove(&self, agent_id: &str, publisher: &[u8], durable: bool) -> Result<(), StoreError> {
        self.with(1, async |s| s.remove(agent_id, publisher, durable).await).await
    }

    pub async fn put_many(&self, rows: &[Row]) -> Result<(), StoreError> {
        self.with(rows.len(), async |s| s.put_many(rows).await).await
    }

    /// Closes the store as a failed reopen leaves it: every write fails until the next reopen.
    #[cfg(test)]
    pub async fn fail_writes(&self) {
        *self.store.write().await = Err("closed by a test".to_owned());
    }

    /// [`Store::put_rows`]: one batch, no flush.
    pub async fn put_rows(&self, rows: &[Row]) -> Result<(), StoreError> {
        self.with(rows.len(), async |s| s.put_rows(rows)).await
    }

    pub async fn flush(&self) -> Result<(), StoreError> {
        self.with(0, async |s| s.flush().await).await
    }

    /// Flushes, closes and reopens the store, giving back the memory sled held; a store whose last
    /// reopen failed is opened again. A flush that fails leaves the store open as it was; a reopen that
    /// fails leaves the count of rows written as it was, so the caller's policy tries again.
    pub async fn reopen(&self) -> Result<(), StoreError> {
        let mut held = self.store.write().await;
        if let Ok(store) = &*held {
            store.flush().await?;
        }
        let closing = std::mem::replace(&mut *held, Err("being reopened".to_owned()));
        let dir = self.dir.clone();
        // sled frees its memory when its last handle closes, and releases the file lock from a
        // background thread just after: `Store::reopen` waits for it, so this runs off the workers.
        let reopened = tokio::task::spawn_blocking(move || {
            drop(closing);
            release_free_memory();
            Store::reopen(&dir)
        })
        .await
        .unwrap_or_else(|e| Err(StoreError::Closed(e.to_string())));
        if reopened.is_ok() {
            self.written.store(0, std::sync::atomic::Ordering::Relaxed);
        }
        let result = reopened.as_ref().map(|_| ()).map_err(|e| StoreError::Closed(e.to_string()));
        *held = reopened.map_err(|e| e.to_string());
        result
    }
}

/// Deferred frees handed on per call of [`release_deferred`]: each moves the thread's bag on and runs
/// up to eight bags of the shared queue (crossbeam-epoch's step), so a backlog of thousands of replaced
/// nodes drains within a few calls.
const EPOCH_FLUSHES: usize = 16;

/// Frees what sled replaced on the calling thread. sled frees a tree node it replaced only once no
/// reader can still hold it (crossbeam-epoch): until then the node, with every row in it, waits in a
/// bag of the thread that replaced it, and the bag moves on only when that thread uses the epoch again.
/// A runtime worker that wrote a catch-up's rows and then had no more store writes kept its bag, and
/// those rows, for good, also across [`Reopening::reopen`]: about 6 MB on a member of a 10-node mesh of
/// 10,000 agents (BENCHMARKS.md, "A mesh member's memory is mostly what its catch-up left behind"). The
/// daemon calls it on each runtime worker as it goes idle; cheap when nothing waits.
pub fn release_deferred() {
    for _ in 0..EPOCH_FLUSHES {
        crossbeam_epoch::pin().flush();
    }
}

/// Loading a large store, or writing many rows, churns through buffers several times the size of what
/// is kept. Hand freed memory back so that the resident size reflects the view: glibc keeps freed memory
/// in its heap (the library's tests, tools), mimalloc (the daemon) returns most of it by itself.
pub fn release_free_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only returns free heap pages to the kernel; it touches no live allocation.
    unsafe {
        libc::malloc_trim(0);
    }
    crate::heap::collect_thread();
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What the daemon relies on: a free deferred on a thread (as sled defers a replaced node) waits for
    /// that thread whatever the others do, and `release_deferred` on it lets it run.
    #[test]
    fn a_free_deferred_on_a_quiet_thread_runs_once_that_thread_releases_it() {
        use std::sync::atomic::{AtomicBool, Ordering};
        use std::sync::Arc;
        let freed = Arc::new(AtomicBool::new(false));
        let (deferred_tx, deferred_rx) = std::sync::mpsc::channel();
        let (release_tx, release_rx) = std::sync::mpsc::channel::<()>();
        let quiet = std::thread::spawn({
            let freed = freed.clone();
            move || {
                let guard = crossbeam_epoch::pin();
                let set = freed.clone();
                guard.defer(move || set.store(true, Ordering::SeqCst));
                drop(guard);
                deferred_tx.send(()).unwrap();
                release_rx.recv().unwrap();
                let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
                // The epoch has to move on twice first; another thread pinned for a moment delays that.
                while !freed.load(Ordering::SeqCst) && std::time::Instant::now() < deadline {
                    release_deferred();
                    std::thread::yield_now();
                }
            }
        });
        deferred_rx.recv().unwrap();
        // Other threads collecting cannot reach the quiet thread's bag.
        for _ in 0..1_000 {
            crossbeam_epoch::pin().flush();
        }
        assert!(!freed.load(Ordering::SeqCst), "freed before its own thread released it");
        release_tx.send(()).unwrap();
        quiet.join().unwrap();
        assert!(freed.load(Ordering::SeqCst), "release_deferred let the deferred free run within 10 s");
    }

    #[tokio::test]
    async fn a_reopened_store_keeps_every_row_and_counts_writes_anew() {
        let dir = tempfile::tempdir().unwrap();
        let store = Reopening::new(dir.path(), Store::open(dir.path()).unwrap());
        let rows: Vec<Row> =
            (0..3u64).map(|i| Row::new(&[1], format!("a{i}"), i, 0, 0, b"{}", &[])).collect();
        store.put_many(&rows[..2]).await.unwrap();
        store.put(&rows[2], false).await.unwrap();
        store.remove("a0", &[1], false).await.unwrap();
        assert_eq!(store.written(), 4);
        store.reopen().await.unwrap();
        assert_eq!(store.written(), 0);
        // Rows written without a flush of their own survive the reopen.
        store.put(&Row::new(&[1], "b".into(), 9, 0, 0, b"{}", &[]), false).await.unwrap();
        store.reopen().await.unwrap();
        let reader = store.store.read().await;
        let mut ids = Vec::new();
        reader.as_ref().unwrap().load(|r| ids.push(r.agent_id)).unwrap();
        assert_eq!(ids, ["a1", "a2", "b"]);
    }

    #[tokio::test]
    async fn rows_survive_reopen_and_bad_rows_are_skipped() {
        let dir = tempfile::tempdir().unwrap();
        let row = Row::new(&[1, 2, 3], "a".into(), 7, 1, 42, b"{}", &[9; 64]);
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

    #[test]
    fn a_seal_covers_every_field_and_only_its_key_makes_it() {
        let node = libp2p::identity::Keypair::generate_ed25519();
        let key = SealKey::derive(&node);
        let mut row = Row::new(&[1, 2, 3], "a".into(), 7, 1, 42, br#"{"agent_id":"a"}"#, &[9; 64]);
        assert!(!key.sealed(&row), "a row written before seals has none");
        key.seal(&mut row);
        assert!(key.sealed(&row));
        assert!(SealKey::derive(&node).sealed(&row), "the key is the same on every start");
        let other = SealKey::derive(&libp2p::identity::Keypair::generate_ed25519());
        assert!(!other.sealed(&row), "another node's key does not make this seal");
        assert!(!format!("{key:?}").contains(|c: char| c.is_ascii_digit()), "the key is never printed");
        let changes: [&dyn Fn(&mut Row); 7] = [
            &|r| r.publisher = ByteBuf::from(vec![1, 2, 4]),
            &|r| r.agent_id = "b".into(),
            &|r| r.seq = 8,
            &|r| r.origin = 0,
            &|r| r.card = r#"{"agent_id":"b"}"#.into(),
            &|r| r.sig = ByteBuf::from(vec![9; 63]),
            &|r| r.packed = ByteBuf::from(b"{}".to_vec()),
        ];
        for change in changes {
            let mut changed = row.clone();
            change(&mut changed);
            assert!(!key.sealed(&changed), "{changed:?}");
        }
        // A seal of the versions before (HMAC-SHA256 under the same identity, on a version 1 row) is
        // still accepted; a truncated or unknown one is not.
        let mut legacy = Row { version: ROW_VERSION_TEXT, card: r#"{"agent_id":"a"}"#.into(), ..row.clone() };
        legacy.packed = ByteBuf::new();
        legacy.seal = ByteBuf::from(key.hmac(&legacy).finalize().into_bytes().to_vec());
        assert_eq!(legacy.seal.len(), 32);
        assert!(key.sealed(&legacy));
        assert!(!other.sealed(&legacy));
        // One in 256 HMACs starts with the BLAKE3 tag: still an HMAC.
        let tagged = (0..4096)
            .map(|_| SealKey::derive(&libp2p::identity::Keypair::generate_ed25519()))
            .find(|k| k.hmac(&legacy).finalize().into_bytes()[0] == SEAL_BLAKE3)
            .expect("one key in 256 gives such an HMAC");
        let seal = ByteBuf::from(tagged.hmac(&legacy).finalize().into_bytes().to_vec());
        assert!(tagged.sealed(&Row { seal, ..legacy.clone() }), "an HMAC that starts with the tag");
        let hmac_on_version_2 =
            Row { seal: ByteBuf::from(key.hmac(&row).finalize().into_bytes().to_vec()), ..row.clone() };
        assert!(!key.sealed(&hmac_on_version_2), "no version ever wrote one");
        assert!(!key.sealed(&Row { seal: ByteBuf::from(row.seal[..32].to_vec()), ..row.clone() }));
        let mut unknown = row.seal.to_vec();
        unknown[0] = 3;
        assert!(!key.sealed(&Row { seal: ByteBuf::from(unknown), ..row.clone() }));
        // Moving bytes between adjacent fields changes the message too.
        let mut a = Row::new(&[1], "ab".into(), 1, 1, 0, b"c", &[]);
        let b = Row { agent_id: "a".into(), card: "bc".into(), ..a.clone() };
        key.seal(&mut a);
        assert!(!key.sealed(&Row { seal: a.seal.clone(), ..b }));
    }
}
