//! The registry: the single owner of this node's view of the mesh.
//!
//! Writers (local registration today, the mesh tomorrow) go through [`Registry::apply`], which
//! persists a change before it becomes visible. Readers take an immutable [`Snapshot`] (an `Arc`
//! swapped on every change), so a query never waits for a writer and never touches disk.
//!
//! Heartbeat times live beside the snapshot in atomics shared by every snapshot generation: a
//! heartbeat is one atomic store, not a snapshot rebuild.

mod entries;
pub mod health;
pub mod remote;
pub mod store;
pub mod witness;

use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::sync::Arc;

use arc_swap::ArcSwap;
use libp2p::identity::{Keypair, PeerId};
use tokio::sync::broadcast;

use crate::card::{AgentCard, HeldCard};
use crate::proto::reconcile::{record_id, RecordId};
use crate::proto::records::Admission;
use entries::Entries;
use health::{Health, Millis, Reported, Thresholds};
use store::{release_free_memory, Reopening, Row, SealKey, Store, StoreError};

pub use crate::proto::records::{accepts, RecordKey};
pub use remote::{HeartbeatOutcome, Limits};

/// Capacity of the local-change channel. A subscriber that falls further behind is told it lagged and
/// re-announces everything instead.
pub const CHANGE_CHANNEL: usize = 1024;
/// Local cards written with one witness write and one store flush by
/// [`Registry::register_local_many`].
pub const LOCAL_BATCH: usize = 256;

/// Remote rows of one [`Registry::apply_many`] written as one store batch at most: one sled call and
/// one pass of its locks for the lot, instead of one per row.
pub const STORE_BATCH: usize = 256;

/// An upsert admitted and built, waiting for its store write.
struct Prepared {
    entry: Entry,
    created: bool,
    /// The seq held before, if any.
    before: Option<u64>,
}

/// A remote upsert in a [`Pending`] batch.
struct Waiting {
    prepared: Prepared,
    /// The heartbeat that named it, if one did: when, and what it reported.
    named: Option<(Millis, Reported)>,
    /// Its place in the results.
    slot: usize,
}

/// Remote upserts of one batch, before their store write: each with the heartbeat that named it (its
/// time and what it reported) and its place in the results.
#[derive(Default)]
struct Pending {
    rows: Vec<Row>,
    entries: Vec<Waiting>,
    /// The records waiting, so that a second version of one waits for the write.
    keys: std::collections::HashSet<RecordKey>,
}

impl Pending {
    fn add(&mut self, (row, prepared): (Row, Prepared), named: Option<(Millis, Reported)>, slot: usize) {
        self.keys.insert(prepared.entry.key.clone());
        self.rows.push(row);
        self.entries.push(Waiting { prepared, named, slot });
    }
}

/// A change to this node's own agents, for the mesh to announce.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LocalChange {
    /// A local card was created or updated: announce its current version.
    Card { agent_id: String },
    /// A local agent was removed at this seq.
    Removed { agent_id: String, seq: u64 },
}

#[derive(Debug, thiserror::Error)]
pub enum RegistryError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("no local agent with id `{0}`")]
    NotFound(String),
    #[error(transparent)]
    Witness(#[from] witness::WitnessError),
    /// A new local agent past the per-publisher limit: the mesh would refuse it, so this node does not
    /// publish it. Nothing was written.
    #[error(
        "this node already publishes {held} agents and may publish at most {limit} \
         (max_agents_per_publisher); deregister agents or raise the limit on every node of the mesh"
    )]
    LocalLimit { held: usize, limit: usize },
    /// The store holds more local agents than the per-publisher limit allows (it was lowered).
    #[error(
        "the store holds {held} local agents, over max_agents_per_publisher ({limit}): raise the \
         setting to at least {held}"
    )]
    StoreOverLimit { held: usize, limit: usize },
}

/// Who keeps a local agent's health fresh.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Liveness {
    /// The agent sends its own heartbeats (AgentField SDK agents); silence makes it degraded.
    Agent,
    /// This node vouches for the agent while the node runs (card files, native registration).
    Node,
}

/// Where a record came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    Local(Liveness),
    Remote,
}

impl Origin {
    fn to_u8(self) -> u8 {
        match self {
            Origin::Remote => 0,
            Origin::Local(Liveness::Agent) => 1,
            Origin::Local(Liveness::Node) => 2,
        }
    }

    fn from_u8(v: u8) -> Option<Origin> {
        match v {
            0 => Some(Origin::Remote),
            1 => Some(Origin::Local(Liveness::Agent)),
            2 => Some(Origin::Local(Liveness::Node)),
            _ => None,
        }
    }
}

/// The mutable liveness facts of one record, shared across snapshot generations.
#[derive(Debug)]
pub struct Live {
    /// Millis of the last heartbeat; 0 means never.
    last_heartbeat: AtomicU64,
    /// What the publisher's list last said of the agent.
    reported: AtomicU8,
    /// Its publisher was declared down, and no later heartbeat has been applied since: offline,
    /// whatever it last reported.
    declared_down: AtomicBool,
}

impl Default for Live {
    fn default() -> Self {
        Self {
            last_heartbeat: AtomicU64::new(0),
            reported: AtomicU8::new(Reported::default().to_u8()),
            declared_down: AtomicBool::new(false),
        }
    }
}

impl Live {
    /// Records a sign of life; true when that changed what discovery shows of the record at `now`: its
    /// derived health or its lifecycle (both are filters, so cached answers must go). `vouched`: the
    /// node itself is the record's sign of life ([`Entry::last_heartbeat`]).
    fn beat_changes_health(&self, now: Millis, reported: Reported, t: &Thresholds, vouched: bool) -> bool {
        let shown = |live: &Live| {
            let last = if vouched { Some(now) } else { live.last() };
            (t.health(now, last, live.reported()), live.last_reported().lifecycle())
        };
        let before = shown(self);
        self.beat(now, reported);
        shown(self) != before
    }

    fn beat(&self, now: Millis, reported: Reported) {
        // A beat never moves the time back (a fetched list is applied at an earlier arrival time).
        self.last_heartbeat.fetch_max(now.max(1), Ordering::AcqRel);
        self.reported.store(reported.to_u8(), Ordering::Release);
        self.declared_down.store(false, Ordering::Release);
    }

    fn last(&self) -> Option<Millis> {
        match self.last_heartbeat.load(Ordering::Acquire) {
            0 => None,
            t => Some(t),
        }
    }

    fn reported(&self) -> Reported {
        if self.declared_down.load(Ordering::Acquire) {
            return Reported::Offline;
        }
        self.last_reported()
    }

    fn last_reported(&self) -> Reported {
        Reported::from_u8(self.reported.load(Ordering::Acquire))
    }

    /// Its publisher was declared down: offline until a newer heartbeat says otherwise (which restores
    /// what the publisher last reported, when that heartbeat names a list this node does not hold).
    fn down(&self) {
        self.declared_down.store(true, Ordering::Release);
    }
}

/// A number unique to one [`Entry`] object in this process: what is made from an entry (its prepared
/// renderings) is kept under it, and a new version of a record is a new entry with a new number.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct EntryId(u64);

impl EntryId {
    fn next() -> EntryId {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        EntryId(NEXT.fetch_add(1, Ordering::Relaxed))
    }

    #[cfg(test)]
    pub(crate) fn of(n: u64) -> EntryId {
        EntryId(n)
    }
}

/// One agent in the view.
#[derive(Debug)]
pub struct Entry {
    pub id: EntryId,
    pub key: RecordKey,
    pub seq: u64,
    pub card: HeldCard,
    /// The publisher's PeerId as text, shared by every entry of that publisher.
    pub publisher_name: Arc<str>,
    /// The publisher's signature over this card version (`wire::sign_card`).
    pub sig: Box<[u8]>,
    pub origin: Origin,
    /// When this node accepted this version of the card.
    pub updated_at: Millis,
    /// The record's reconciliation id (`proto::reconcile::record_id` of its key and seq), made once:
    /// the reconciliation index is rebuilt from every record's id whenever the view changed.
    pub record_id: RecordId,
    live: Arc<Live>,
}

impl Entry {
    /// A fresh entry with no heartbeat yet (tests and tooling; the registry builds its own).
    pub fn new(key: RecordKey, seq: u64, card: &AgentCard, origin: Origin, updated_at: Millis) -> Self {
        let publisher_name = key.publisher.to_base58().into();
        let card = HeldCard::new(card);
        let sig = Box::default();
        let live = Arc::new(Live::default());
        let record_id = record_id(&key.publisher, &key.agent_id, seq);
        Self { id: EntryId::next(), key, seq, card, publisher_name, sig, origin, updated_at, record_id, live }
    }

    /// Marks the entry offline (its publisher was declared down), keeping its last heartbeat time.
    pub(crate) fn down(&self) {
        self.live.down();
    }

    /// Records a sign of life (tests and tooling; the registry goes through `heartbeat_local`).
    pub fn beat(&self, now: Millis, reported: Reported) {
        self.live.beat(now, reported);
    }

    pub fn is_local(&self) -> bool {
        matches!(self.origin, Origin::Local(_))
    }

    /// Time of the last sign of life: for agents this node vouches for, the node itself is the sign.
    pub fn last_heartbeat(&self, now: Millis) -> Option<Millis> {
        match self.origin {
            Origin::Local(Liveness::Node) => Some(now),
            _ => self.live.last(),
        }
    }

    pub fn reported(&self) -> Reported {
        self.live.reported()
    }

    /// What its publisher's list last said of it, a declaration of the publisher down aside.
    pub fn last_reported(&self) -> Reported {
        self.live.last_reported()
    }

    pub fn health(&self, now: Millis, thresholds: &Thresholds) -> Health {
        thresholds.health(now, self.last_heartbeat(now), self.reported())
    }

    /// Records a sign of life; true when that changed what discovery shows of the entry at `now`.
    fn beat_changes_health(&self, now: Millis, reported: Reported, thresholds: &Thresholds) -> bool {
        let vouched = self.origin == Origin::Local(Liveness::Node);
        self.live.beat_changes_health(now, reported, thresholds, vouched)
    }

    /// Whether the agent takes new work, as it last said.
    pub fn lifecycle(&self) -> crate::card::reported::Lifecycle {
        self.live.last_reported().lifecycle()
    }

    /// The signed card message of this record, exactly as its publisher made it (see `wire`).
    pub fn signed_message(&self) -> Vec<u8> {
        let body = crate::wire::CardBody {
            agent_id: self.key.agent_id.clone(),
            seq: self.seq,
            card: self.card.text().into_string(),
        };
        crate::wire::reseal_card(self.key.publisher, &body, self.sig.to_vec())
    }

    /// When this entry's health would next change without a heartbeat.
    pub fn next_health_change(&self, now: Millis, thresholds: &Thresholds) -> Option<Millis> {
        match self.origin {
            Origin::Local(Liveness::Node) => None,
            _ => thresholds.next_change(now, self.live.last()),
        }
    }
}

impl AsRef<Entry> for Entry {
    fn as_ref(&self) -> &Entry {
        self
    }
}

/// An immutable view, sorted by `(agent_id, publisher)`: the order discovery answers in.
#[derive(Debug, Default)]
pub struct Snapshot {
    pub generation: u64,
    pub entries: Vec<Arc<Entry>>,
    /// Each publisher's entries in agent id order: a heartbeat touches one publisher's records, which
    /// are scattered over the agent id order. Kept by the writer as the view changes ([`Entries`]).
    by_publisher: entries::Publishers,
}

impl Snapshot {
    /// A view of `entries`, which must be sorted by key, grouped by publisher here (O(view): for tests
    /// and tooling; the registry's own snapshots come from the writer's `Entries`, which keeps the
    /// grouping).
    pub fn new(generation: u64, entries: Vec<Arc<Entry>>) -> Self {
        let by_publisher = entries::group(&entries);
        Self { generation, entries, by_publisher }
    }

    /// The view `map` holds now.
    fn of(generation: u64, map: &mut Entries) -> Self {
        Self { generation, entries: map.values().cloned().collect(), by_publisher: map.publishers() }
    }

    /// Every entry with this agent id (one per publisher), local first.
    pub fn by_agent_id(&self, agent_id: &str) -> Vec<&Arc<Entry>> {
        let start = self.entries.partition_point(|e| e.key.agent_id.as_str() < agent_id);
        let mut found: Vec<_> =
            self.entries[start..].iter().take_while(|e| e.key.agent_id == agent_id).collect();
        found.sort_by_key(|e| !e.is_local());
        found
    }

    /// The record of `agent_id` published by `publisher`.
    pub fn get(&self, agent_id: &str, publisher: &PeerId) -> Option<&Arc<Entry>> {
        let at = self
            .entries
            .binary_search_by(|e| {
                e.key.agent_id.as_str().cmp(agent_id).then_with(|| e.key.publisher.cmp(publisher))
            })
            .ok()?;
        Some(&self.entries[at])
    }

    /// Every entry `publisher` published, in agent id order, as the view shares them: the same `Arc` in
    /// every snapshot until one of them changes.
    pub fn publisher_records(&self, publisher: &PeerId) -> Option<&Arc<[Arc<Entry>]>> {
        self.by_publisher.get(publisher)
    }

    /// Every entry `publisher` published, in agent id order.
    pub fn of_publisher(&self, publisher: &PeerId) -> impl Iterator<Item = &Arc<Entry>> + '_ {
        self.publisher_records(publisher).into_iter().flat_map(|list| list.iter())
    }
}

/// A change offered to the registry. Short-lived (built and applied at once), so the size difference
/// between the variants does not matter.
///
/// A remote `Upsert` must hold a card whose signatures the caller has verified (the mesh does, before
/// anything reaches the registry): the row it becomes is sealed, and a sealed row is not verified
/// again when the store is reopened.
#[derive(Debug)]
#[allow(clippy::large_enum_variant)]
pub enum Update {
    /// `text` is the card's canonical JSON (`card.to_json()`): a card from the mesh arrives as that
    /// text, so it is carried along instead of serialised again.
    Upsert {
        publisher: PeerId,
        seq: u64,
        card: AgentCard,
        text: String,
        origin: Origin,
        sig: Vec<u8>,
    },
    Remove {
        publisher: PeerId,
        agent_id: String,
        seq: u64,
    },
}

impl Update {
    /// An upsert of `card`, its canonical text written here.
    pub fn upsert(publisher: PeerId, seq: u64, card: AgentCard, origin: Origin, sig: Vec<u8>) -> Update {
        let text = String::from_utf8(card.to_json()).unwrap_or_default();
        Update::Upsert { publisher, seq, card, text, origin, sig }
    }
}

/// What [`Registry::apply`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Applied {
    Created {
        seq: u64,
    },
    Updated {
        seq: u64,
    },
    Removed {
        seq: u64,
    },
    /// Not newer than what is held (or nothing to remove): nothing changed.
    Stale {
        held: Option<u64>,
    },
    /// A local registration identical to what is held: nothing written, seq kept.
    Unchanged {
        seq: u64,
    },
    /// A new remote record refused: its publisher or the view is full.
    OverLimit(remote::Limit),
}

impl Applied {
    /// Whether the view changed.
    pub fn changed_view(&self) -> bool {
        matches!(self, Applied::Created { .. } | Applied::Updated { .. } | Applied::Removed { .. })
    }
}

/// The next seq for a local record: above the last one, and at least the wall clock in millis, so that
/// a record re-created after a removal still outranks the removal everywhere.
pub fn next_local_seq(held: Option<u64>, now: Millis) -> u64 {
    held.map_or(now, |h| h.saturating_add(1).max(now))
}

pub struct Registry {
    me: PeerId,
    /// Signs this node's own cards.
    signer: Keypair,
    /// Seals every row written (see [`store`]).
    seal: SealKey,
    store: Reopening,
    thresholds: Thresholds,
    /// The authoritative map. A tokio mutex because writers hold it across the store flush, which
    /// serialises writes so that the disk and the view change in the same order.
    writer: tokio::sync::Mutex<Entries>,
    snapshot: ArcSwap<Snapshot>,
    health_epoch: AtomicU64,
    names: PublisherNames,
    changes: broadcast::Sender<LocalChange>,
    remote: remote::RemoteState,
    /// The last walk of each publisher's agent list along its records ([`remote`]).
    walks: remote::Walks,
    /// The witness of the local records, written before each durable local change.
    witness: std::sync::Mutex<witness::Witness>,
    /// The error of the last local write, if it failed (a full disk, say); cleared by the next one that
    /// succeeds. The node reports itself degraded meanwhile.
    store_error: std::sync::Mutex<Option<String>>,
    /// Records loaded from rows not in the current form, and their seqs: written again by
    /// [`Registry::rewrite_rows`], so that the next start takes them on their seal, compressed.
    rewrite: std::sync::Mutex<ToRewrite>,
}

/// Records whose rows are to be written again, with the seq each was loaded at.
type ToRewrite = Vec<(RecordKey, u64)>;

/// PeerId text per publisher, computed once and shared by all of its entries.
#[derive(Default)]
struct PublisherNames(std::sync::Mutex<std::collections::HashMap<PeerId, Arc<str>>>);

impl PublisherNames {
    fn get(&self, publisher: PeerId) -> Arc<str> {
        let mut names = self.0.lock().unwrap_or_else(|p| p.into_inner());
        names.entry(publisher).or_insert_with(|| publisher.to_base58().into()).clone()
    }

    /// Drops a publisher's cached name (its entries keep their own copies).
    fn forget(&self, publisher: &PeerId) {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).remove(publisher);
    }
}

/// What opening found on disk.
#[derive(Debug, Default, Clone, Copy)]
pub struct OpenReport {
    pub local: usize,
    pub remote: usize,
    pub unreadable: usize,
    /// Records taken on their seal, without verifying their signatures again (the rest were).
    pub sealed: usize,
    /// Records whose rows are to be written again in the current form ([`Registry::rewrite_rows`]): rows
    /// of an older version, rows this node had not sealed, local cards signed again at load.
    pub rewrite: usize,
}

impl Registry {
    /// Opens the store under `dir`, re-validates every row and builds the first snapshot. Rows whose card
    /// no longer validates are skipped and counted, never served.
    pub fn open(
        dir: &Path,
        signer: Keypair,
        thresholds: Thresholds,
    ) -> Result<(Self, OpenReport), RegistryError> {
        Self::open_checked(dir, signer, thresholds, Limits::default(), false)
    }

    /// Opens the store and checks its local records against their witness ([`witness`]): a store that
    /// lost any is an error, unless `accept_loss` (then the witness is rebased on what is there).
    pub fn open_checked(
        dir: &Path,
        signer: Keypair,
        thresholds: Thresholds,
        limits: Limits,
        accept_loss: bool,
    ) -> Result<(Self, OpenReport), RegistryError> {
        let me = signer.public().to_peer_id();
        let seal = SealKey::derive(&signer);
        let store = Store::reopen(dir)?;
        let names = PublisherNames::default();
        let (mut map, report, rewrite) = load_view(&store, &names, &signer, &seal)?;
        // sled keeps every page it read during the full scan resident, whatever its cache capacity
        // (measured: about 2x the data). Reopening drops that; the view is already in memory.
        drop(store);
        release_free_memory();
        let store = Store::reopen(dir)?;
        let snapshot = Snapshot::of(1, &mut map);
        if report.local > limits.per_publisher {
            return Err(RegistryError::StoreOverLimit { held: report.local, limit: limits.per_publisher });
        }
        let remote = remote::RemoteState::new(me, limits);
        let mut local = witness::Sum::default();
        for entry in map.values() {
            if entry.is_local() {
                local.add(&entry.key.agent_id, entry.seq);
            } else {
                remote.lock().count_loaded(entry.key.publisher);
            }
        }
        let witness = std::sync::Mutex::new(witness::Witness::open(dir, local, accept_loss)?);
        let registry = Self {
            me,
            signer,
            seal,
            store: Reopening::new(dir, store),
            thresholds,
            writer: tokio::sync::Mutex::new(map),
            snapshot: ArcSwap::from_pointee(snapshot),
            health_epoch: AtomicU64::new(0),
            names,
            changes: broadcast::channel(CHANGE_CHANNEL).0,
            remote,
            walks: remote::Walks::default(),
            witness,
            store_error: std::sync::Mutex::new(None),
            rewrite: std::sync::Mutex::new(rewrite),
        };
        Ok((registry, report))
    }

    fn publisher_name(&self, publisher: PeerId) -> Arc<str> {
        self.names.get(publisher)
    }

    /// Uncounts a remote record; a publisher with none left here is forgotten by the name cache.
    fn release(&self, publisher: PeerId) {
        if self.remote.lock().release(publisher) {
            self.names.forget(&publisher);
        }
    }

    /// The limits this registry admits records by.
    pub fn limits(&self) -> Limits {
        self.remote.lock().limits()
    }

    /// Refuses `new` more local agents when they would take this node past the per-publisher limit
    /// (called under the writer lock, so the witness's count is the view's).
    fn admit_local(&self, new: usize) -> Result<(), RegistryError> {
        if new == 0 {
            return Ok(());
        }
        let limit = self.remote.lock().limits().per_publisher;
        let held = self.lock_witness().local_records();
        if held + new > limit {
            return Err(RegistryError::LocalLimit { held, limit });
        }
        Ok(())
    }

    pub fn local_peer_id(&self) -> PeerId {
        self.me
    }

    /// This node's detached JWS (EdDSA, `kid` its PeerId) over `payload`: what a document this node
    /// vouches for (its AI Catalog) carries.
    pub fn sign_detached(&self, payload: &[u8]) -> String {
        crate::card::a2a::detached_jws(&self.signer, payload)
    }

    pub fn thresholds(&self) -> &Thresholds {
        &self.thresholds
    }

    /// The current view. Cheap: one atomic load.
    pub fn snapshot(&self) -> Arc<Snapshot> {
        self.snapshot.load_full()
    }

    /// Bumped whenever a heartbeat changes some agent's derived health.
    pub fn health_epoch(&self) -> u64 {
        self.health_epoch.load(Ordering::Acquire)
    }

    /// Registers (or re-registers) a local agent under this node's key. Durable when it returns.
    /// Re-registering the same card (an agent restarting, card files at every start) writes nothing, so
    /// it neither wears the disk nor sends a new version around the mesh.
    pub async fn register_local(
        &self,
        card: AgentCard,
        liveness: Liveness,
        now: Millis,
    ) -> Result<Applied, RegistryError> {
        let mut map = self.writer.lock().await;
        let mut outcome = self.register_local_batch(&mut map, vec![(0, card)], liveness, now).await?;
        let (_, applied) = outcome.pop().expect("one outcome for one card");
        if applied.changed_view() {
            self.publish(&mut map);
        }
        Ok(applied)
    }

    /// Removes a local agent. Durable when it returns.
    pub async fn deregister_local(&self, agent_id: &str, now: Millis) -> Result<Applied, RegistryError> {
        let mut map = self.writer.lock().await;
        let key = RecordKey { agent_id: agent_id.to_owned(), publisher: self.me };
        let Some(held) = map.get(&key).map(|e| e.seq) else {
            return Err(RegistryError::NotFound(agent_id.to_owned()));
        };
        let seq = next_local_seq(Some(held), now);
        let update = Update::Remove { publisher: self.me, agent_id: agent_id.to_owned(), seq };
        let applied = self.apply_locked(&mut map, update, now).await?;
        self.publish(&mut map);
        let _ = self.changes.send(LocalChange::Removed { agent_id: agent_id.to_owned(), seq });
        Ok(applied)
    }

    /// Signs a local card at a seq.
    /// This node's signature over `card` at `seq`; `text` is the card's canonical JSON.
    fn sign(&self, card: &AgentCard, text: &str, seq: u64) -> Vec<u8> {
        crate::wire::sign_card(
            &self.signer,
            &crate::wire::CardBody { agent_id: card.agent_id.clone(), seq, card: text.to_owned() },
        )
    }

    /// Changes to this node's own agents, as they happen.
    pub fn subscribe(&self) -> broadcast::Receiver<LocalChange> {
        self.changes.subscribe()
    }

    /// The single door into the view, for local and remote changes alike.
    pub async fn apply(&self, update: Update, now: Millis) -> Result<Applied, RegistryError> {
        let mut map = self.writer.lock().await;
        let applied = self.apply_locked(&mut map, update, now).await;
        if applied.as_ref().is_ok_and(Applied::changed_view) {
            self.publish(&mut map);
        }
        applied
    }

    /// Applies many updates (a sync response) and publishes the view once: building a snapshot is
    /// O(records), so a node catching up on thousands of cards must not build one per card. Remote
    /// cards go to the store together, as one batch of up to [`STORE_BATCH`] rows, all of them or
    /// none; the rest one by one, in the order given.
    ///
    /// A record new here whose publisher's newest heartbeat already named it (at this seq or an older
    /// one) is alive as of that heartbeat: a newcomer's agents turn `active` as their cards land, not
    /// a heartbeat interval later.
    pub async fn apply_many(&self, updates: Vec<Update>, now: Millis) -> Vec<Result<Applied, RegistryError>> {
        let mut map = self.writer.lock().await;
        let mut results: Vec<Option<Result<Applied, RegistryError>>> = Vec::with_capacity(updates.len());
        let lists = self.remote_lists(&updates);
        let listed: HashMap<PeerId, (Millis, HashMap<&str, &crate::wire::HeartbeatAgent>)> = lists
            .iter()
            .map(|(p, (at, list))| (*p, (*at, list.iter().map(|a| (a.agent_id.as_str(), a)).collect())))
            .collect();
        let mut pending = Pending::default();
        for update in updates {
            let named = match &update {
                Update::Upsert { publisher, seq, card, origin: Origin::Remote, .. } => listed
                    .get(publisher)
                    .and_then(|(at, agents)| Some((*at, *agents.get(card.agent_id.as_str())?)))
                    .filter(|(_, agent)| agent.seq <= *seq)
                    .map(|(at, agent)| (at, agent.reported)),
                _ => None,
            };
            let batched = match &update {
                Update::Upsert { publisher, card, origin: Origin::Remote, .. } => {
                    let key = RecordKey { agent_id: card.agent_id.clone(), publisher: *publisher };
                    !pending.keys.contains(&key)
                }
                _ => false,
            };
            if !batched || pending.rows.len() >= STORE_BATCH {
                self.write_remote(&mut map, &mut pending, &mut results).await;
            }
            if !batched {
                results.push(Some(self.apply_locked(&mut map, update, now).await));
                continue;
            }
            let Update::Upsert { publisher, seq, card, text, origin, sig } = update else {
                unreachable!("only remote upserts are batched")
            };
            match self.prepare_upsert(&map, publisher, seq, &card, text, origin, sig, now) {
                Ok(prepared) => {
                    pending.add(prepared, named, results.len());
                    results.push(None);
                }
                Err(done) => results.push(Some(Ok(done))),
            }
        }
        self.write_remote(&mut map, &mut pending, &mut results).await;
        let results: Vec<_> = results.into_iter().map(|r| r.expect("every batched row is written")).collect();
        if results.iter().any(|r| r.as_ref().is_ok_and(Applied::changed_view)) {
            self.publish(&mut map);
        }
        results
    }

    /// Writes the remote rows `pending` holds as one store batch (without a flush of its own: the mesh
    /// sends a remote card again after a crash), then puts their entries in the view; if the batch
    /// fails, none is in the view and each gets the error.
    async fn write_remote(
        &self,
        map: &mut Entries,
        pending: &mut Pending,
        results: &mut [Option<Result<Applied, RegistryError>>],
    ) {
        if pending.rows.is_empty() {
            return;
        }
        let rows = std::mem::take(&mut pending.rows);
        let written = self.store.put_rows(&rows).await;
        drop(rows);
        pending.keys.clear();
        for Waiting { prepared, named, slot } in pending.entries.drain(..) {
            let result = match &written {
                Ok(()) => {
                    let created = prepared.created;
                    let seq = prepared.entry.seq;
                    let entry = Arc::new(prepared.entry);
                    if let (true, Some((at, reported))) = (created, named) {
                        entry.beat(at, reported);
                    }
                    map.insert(entry);
                    Ok(if created { Applied::Created { seq } } else { Applied::Updated { seq } })
                }
                Err(error) => {
                    if prepared.created {
                        self.release(prepared.entry.key.publisher);
                    }
                    Err(RegistryError::Store(StoreError::Batch(error.to_string())))
                }
            };
            results[slot] = Some(result);
        }
    }

    /// The store row of `entry` as this node writes it: the card as the view holds it, sealed.
    fn sealed_row(&self, entry: &Entry) -> Row {
        let publisher = entry.key.publisher.to_bytes();
        let (agent_id, origin) = (entry.key.agent_id.clone(), entry.origin.to_u8());
        let mut row = Row::new(
            &publisher,
            agent_id,
            entry.seq,
            origin,
            entry.updated_at,
            entry.card.packed(),
            &entry.sig,
        );
        self.seal.seal(&mut row);
        row
    }

    /// An upsert up to its store write: admitted against the limits and the version held, its row
    /// built and sealed, its entry made. `Err` is the outcome when there is nothing to write.
    #[allow(clippy::too_many_arguments)]
    fn prepare_upsert(
        &self,
        map: &Entries,
        publisher: PeerId,
        seq: u64,
        card: &AgentCard,
        text: String,
        origin: Origin,
        sig: Vec<u8>,
        now: Millis,
    ) -> Result<(Row, Prepared), Applied> {
        let key = RecordKey { agent_id: card.agent_id.clone(), publisher };
        let held = map.get(&key);
        let remote = origin == Origin::Remote;
        let created = match self.remote.lock().admit(&key, held.map(|e| e.seq), seq, remote) {
            Admission::Take { created } => created,
            Admission::Stale => return Err(Applied::Stale { held: held.map(|e| e.seq) }),
            Admission::Over(limit) => return Err(Applied::OverLimit(limit)),
        };
        let live = held.map(|e| e.live.clone()).unwrap_or_default();
        let before = held.map(|e| e.seq);
        let held_card = HeldCard::with_text(card, text.as_bytes());
        drop(text);
        let entry = Entry {
            id: EntryId::next(),
            record_id: record_id(&publisher, &key.agent_id, seq),
            key,
            seq,
            card: held_card,
            publisher_name: self.publisher_name(publisher),
            sig: sig.into_boxed_slice(),
            origin,
            updated_at: now,
            live,
        };
        Ok((self.sealed_row(&entry), Prepared { entry, created, before }))
    }

    /// Applies one update to the writer's map and the store; the caller publishes the view.
    async fn apply_locked(
        &self,
        map: &mut Entries,
        update: Update,
        now: Millis,
    ) -> Result<Applied, RegistryError> {
        let applied = match update {
            Update::Upsert { publisher, seq, card, text, origin, sig } => {
                let prepared = match self.prepare_upsert(map, publisher, seq, &card, text, origin, sig, now) {
                    Ok(prepared) => prepared,
                    Err(done) => return Ok(done),
                };
                let (row, Prepared { entry, created, before }) = prepared;
                let write = self.store.put(&row, origin != Origin::Remote);
                let stored = if origin == Origin::Remote {
                    write.await.map_err(RegistryError::from)
                } else {
                    let change =
                        witness::Change { agent_id: entry.key.agent_id.clone(), before, after: Some(seq) };
                    self.write_local(&[change], write).await
                };
                if let Err(e) = stored {
                    if created && origin == Origin::Remote {
                        self.release(publisher);
                    }
                    return Err(e);
                }
                map.insert(Arc::new(entry));
                if created {
                    Applied::Created { seq }
                } else {
                    Applied::Updated { seq }
                }
            }
            Update::Remove { publisher, agent_id, seq } => {
                let key = RecordKey { agent_id, publisher };
                let held = map.get(&key).map(|e| e.seq);
                if held.is_none() || !accepts(held, seq) {
                    return Ok(Applied::Stale { held });
                }
                let publisher_bytes = publisher.to_bytes();
                let write = self.store.remove(&key.agent_id, &publisher_bytes, publisher == self.me);
                if map.get(&key).is_some_and(|e| e.is_local()) {
                    let change =
                        witness::Change { agent_id: key.agent_id.clone(), before: held, after: None };
                    self.write_local(&[change], write).await?;
                } else {
                    write.await?;
                }
                if let Some(e) = map.remove(&key) {
                    if e.origin == Origin::Remote {
                        self.release(publisher);
                    }
                }
                self.remote.lock().removed(key, seq, now);
                Applied::Removed { seq }
            }
        };
        Ok(applied)
    }

    /// Why the store refused the last local write, if it did (a full disk; sled may then refuse every
    /// write until the process restarts).
    pub fn store_error(&self) -> Option<String> {
        self.store_error.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    fn set_store_error(&self, error: Option<String>) {
        *self.store_error.lock().unwrap_or_else(|p| p.into_inner()) = error;
    }

    fn lock_witness(&self) -> std::sync::MutexGuard<'_, witness::Witness> {
        self.witness.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A store write of local changes (under the writer lock): their witness first, then `write`. A
    /// failure undoes the witness and is what `store_error` reports until a local write succeeds.
    async fn write_local(
        &self,
        changes: &[witness::Change],
        write: impl std::future::Future<Output = Result<(), StoreError>>,
    ) -> Result<(), RegistryError> {
        let witnessed = self.lock_witness().before_all(changes);
        let result = match witnessed {
            Err(e) => Err(RegistryError::from(e)),
            Ok(()) => write.await.map_err(|e| {
                self.lock_witness().undo(changes);
                RegistryError::from(e)
            }),
        };
        self.set_store_error(result.as_ref().err().map(ToString::to_string));
        result
    }

    fn publish(&self, map: &mut Entries) {
        let generation = self.snapshot.load().generation + 1;
        self.snapshot.store(Arc::new(Snapshot::of(generation, map)));
    }

    /// Records a heartbeat from a local agent. Returns its health after the heartbeat.
    pub fn heartbeat_local(
        &self,
        agent_id: &str,
        reported: Option<Reported>,
        now: Millis,
    ) -> Result<Health, RegistryError> {
        let snapshot = self.snapshot();
        let entry =
            snapshot.get(agent_id, &self.me).ok_or_else(|| RegistryError::NotFound(agent_id.to_owned()))?;
        if entry.beat_changes_health(now, reported.unwrap_or_else(|| entry.reported()), &self.thresholds) {
            self.health_epoch.fetch_add(1, Ordering::AcqRel);
        }
        let after = entry.health(now, &self.thresholds);
        Ok(after)
    }

    /// Registers (or re-registers) many local agents as [`register_local`](Self::register_local) does
    /// each, but with one witness write and one store flush per [`LOCAL_BATCH`] cards and one new
    /// view: a node starting with thousands of card files takes them in a fraction of a second instead
    /// of a few milliseconds each. Returns what became of each card, in the order given; when several
    /// cards name the same agent, the last one is registered and every one of them gets its outcome.
    /// A card refused by the per-publisher limit refuses its whole batch; batches before it stay
    /// registered. Durable when it returns.
    pub async fn register_local_many(
        &self,
        cards: Vec<AgentCard>,
        liveness: Liveness,
        now: Millis,
    ) -> Result<Vec<Applied>, RegistryError> {
        // The last card of each agent id, and for every card the place of that last one.
        let mut last: HashMap<String, usize> = HashMap::with_capacity(cards.len());
        for (at, card) in cards.iter().enumerate() {
            last.insert(card.agent_id.clone(), at);
        }
        let winner: Vec<usize> = cards.iter().map(|c| last[&c.agent_id]).collect();
        let kept: Vec<(usize, AgentCard)> =
            cards.into_iter().enumerate().filter(|(at, c)| last[&c.agent_id] == *at).collect();
        let mut outcome: HashMap<usize, Applied> = HashMap::with_capacity(kept.len());
        let mut map = self.writer.lock().await;
        let mut changed = false;
        let mut kept = kept.into_iter().peekable();
        while kept.peek().is_some() {
            let batch: Vec<(usize, AgentCard)> = kept.by_ref().take(LOCAL_BATCH).collect();
            let result = self.register_local_batch(&mut map, batch, liveness, now).await;
            let applied = match result {
                Ok(applied) => applied,
                Err(e) => {
                    if changed {
                        self.publish(&mut map);
                    }
                    return Err(e);
                }
            };
            for (at, applied) in applied {
                changed |= applied.changed_view();
                outcome.insert(at, applied);
            }
        }
        if changed {
            self.publish(&mut map);
        }
        Ok(winner.into_iter().map(|at| outcome[&at]).collect())
    }

    /// One batch of [`register_local_many`](Self::register_local_many), with distinct agent ids, under
    /// the writer lock: the witness and the store written once for every card that changed.
    async fn register_local_batch(
        &self,
        map: &mut Entries,
        batch: Vec<(usize, AgentCard)>,
        liveness: Liveness,
        now: Millis,
    ) -> Result<Vec<(usize, Applied)>, RegistryError> {
        let origin = Origin::Local(liveness);
        let mut outcome = Vec::with_capacity(batch.len());
        // The cards that change, by their place in the call, their store rows and their entries.
        let (mut places, mut rows, mut staged) = (Vec::new(), Vec::new(), Vec::new());
        let mut keys = Vec::with_capacity(batch.len());
        for (at, card) in batch {
            let card = card.signed(&self.signer);
            let key = RecordKey { agent_id: card.agent_id.clone(), publisher: self.me };
            keys.push(key.clone());
            let held = map.get(&key);
            let text = String::from_utf8(card.to_json()).unwrap_or_default();
            if let Some(e) = held.filter(|e| e.origin == origin && *e.card.text() == *text) {
                outcome.push((at, Applied::Unchanged { seq: e.seq }));
                continue;
            }
            let seq = next_local_seq(held.map(|e| e.seq), now);
            let sig = self.sign(&card, &text, seq);
            match self.prepare_upsert(map, self.me, seq, &card, text, origin, sig, now) {
                Ok((row, prepared)) => {
                    places.push(at);
                    rows.push(row);
                    staged.push(prepared);
                }
                Err(done) => outcome.push((at, done)),
            }
        }
        self.admit_local(staged.iter().filter(|p| p.created).count())?;
        if !rows.is_empty() {
            let changes: Vec<witness::Change> = staged
                .iter()
                .map(|p| witness::Change {
                    agent_id: p.entry.key.agent_id.clone(),
                    before: p.before,
                    after: Some(p.entry.seq),
                })
                .collect();
            self.write_local(&changes, self.store.put_many(&rows)).await?;
        }
        for (at, Prepared { entry, created, .. }) in places.into_iter().zip(staged) {
            let seq = entry.seq;
            let _ = self.changes.send(LocalChange::Card { agent_id: entry.key.agent_id.clone() });
            map.insert(Arc::new(entry));
            outcome.push((at, if created { Applied::Created { seq } } else { Applied::Updated { seq } }));
        }
        if liveness == Liveness::Agent {
            // Registering is an agent's first sign of life.
            for key in &keys {
                if let Some(entry) = map.get(key) {
                    entry.live.beat(now, Reported::Ready);
                }
            }
        }
        Ok(outcome)
    }

    /// Flushes the store (shutdown).
    pub async fn flush(&self) -> Result<(), RegistryError> {
        Ok(self.store.flush().await?)
    }

    /// Rows written or removed since the store was last opened.
    pub fn rows_written(&self) -> usize {
        self.store.written()
    }

    /// Writes the rows of the records loaded from rows not in the current form again, as this node
    /// would write them now (sealed, in the current version), in store batches of [`STORE_BATCH`]; a record
    /// changed since is skipped, its row being current already. Returns the rows written; on a store
    /// error the records not written stay to do.
    pub async fn rewrite_rows(&self) -> Result<usize, RegistryError> {
        let mut written = 0;
        loop {
            let chunk: Vec<(RecordKey, u64)> = {
                let mut todo = self.rewrite.lock().unwrap_or_else(|p| p.into_inner());
                let take = todo.len().min(STORE_BATCH);
                if take == todo.len() {
                    // The last of them: the list's room goes too.
                    std::mem::take(&mut *todo)
                } else {
                    let at = todo.len() - take;
                    todo.split_off(at)
                }
            };
            if chunk.is_empty() {
                break;
            }
            let map = self.writer.lock().await;
            let rows: Vec<Row> = chunk
                .iter()
                .filter_map(|(key, seq)| map.get(key).filter(|e| e.seq == *seq))
                .map(|e| self.sealed_row(e))
                .collect();
            if let Err(error) = self.store.put_rows(&rows).await {
                self.rewrite.lock().unwrap_or_else(|p| p.into_inner()).extend(chunk);
                return Err(error.into());
            }
            drop(map);
            written += rows.len();
            tokio::task::yield_now().await;
        }
        if written > 0 {
            self.store.flush().await?;
        }
        Ok(written)
    }

    /// Records whose rows are still to be written again ([`Registry::rewrite_rows`]).
    pub fn rows_to_rewrite(&self) -> usize {
        self.rewrite.lock().unwrap_or_else(|p| p.into_inner()).len()
    }

    /// Closes and reopens the store to give back the memory sled keeps for every page written
    /// ([`store::Reopening`]); writes wait meanwhile.
    pub async fn reopen_store(&self) -> Result<(), RegistryError> {
        let result = self.store.reopen().await;
        if let Err(error) = &result {
            self.set_store_error(Some(error.to_string()));
        }
        Ok(result?)
    }
}

/// Rows handed to a loading thread at once.
const LOAD_BATCH: usize = 256;
/// Batches queued between the store's reader and the loading threads (bounds the memory of a load).
const LOAD_QUEUE: usize = 4;
/// Most threads turning rows into entries at start.
const LOAD_THREADS: usize = 8;

/// Reads every row of the store into the view: the store is read on this thread while up to one
/// thread per core turns rows into entries (seal checks, card parses, and for unsealed rows the
/// signature checks), through bounded queues.
fn load_view(
    store: &Store,
    names: &PublisherNames,
    signer: &Keypair,
    seal: &SealKey,
) -> Result<(Entries, OpenReport, ToRewrite), StoreError> {
    use std::sync::mpsc::sync_channel;
    type Loaded = Vec<(String, bool, bool, Option<Entry>)>;
    let threads = std::thread::available_parallelism().map_or(1, std::num::NonZero::get).min(LOAD_THREADS);
    let (rows_tx, rows_rx) = sync_channel::<Vec<Row>>(LOAD_QUEUE);
    let rows_rx = std::sync::Mutex::new(rows_rx);
    let (loaded_tx, loaded_rx) = sync_channel::<Loaded>(LOAD_QUEUE);
    std::thread::scope(|scope| {
        for _ in 0..threads {
            let (rows_rx, loaded_tx) = (&rows_rx, loaded_tx.clone());
            scope.spawn(move || loop {
                let batch = match rows_rx.lock().unwrap_or_else(|e| e.into_inner()).recv() {
                    Ok(batch) => batch,
                    Err(_) => return,
                };
                let loaded = batch
                    .into_iter()
                    .map(|row| {
                        let agent_id = row.agent_id.clone();
                        let sealed = seal.sealed(&row);
                        let current = sealed && !row.holds_text();
                        (agent_id, sealed, current, entry_from_row(row, sealed, names, signer))
                    })
                    .collect();
                if loaded_tx.send(loaded).is_err() {
                    return;
                }
            });
        }
        drop(loaded_tx);
        let collector = scope.spawn(move || {
            let mut map = Entries::default();
            let mut report = OpenReport::default();
            let mut rewrite = Vec::new();
            for (agent_id, sealed, current, entry) in loaded_rx.into_iter().flatten() {
                match entry {
                    Some(entry) => {
                        report.sealed += usize::from(sealed);
                        if !current {
                            rewrite.push((entry.key.clone(), entry.seq));
                        }
                        if entry.is_local() {
                            report.local += 1;
                        } else {
                            report.remote += 1;
                        }
                        map.insert(Arc::new(entry));
                    }
                    None => {
                        tracing::warn!(%agent_id, "skipping stored record that does not validate");
                        report.unreadable += 1;
                    }
                }
            }
            report.rewrite = rewrite.len();
            (map, report, rewrite)
        });
        let mut batch = Vec::with_capacity(LOAD_BATCH);
        let read = store.load(|row| {
            batch.push(row);
            if batch.len() == LOAD_BATCH {
                // The loading threads only stop early by panicking, which the scope re-raises.
                let _ = rows_tx.send(std::mem::replace(&mut batch, Vec::with_capacity(LOAD_BATCH)));
            }
        });
        if !batch.is_empty() {
            let _ = rows_tx.send(batch);
        }
        drop(rows_tx);
        let (map, mut report, rewrite) =
            collector.join().unwrap_or_else(|panic| std::panic::resume_unwind(panic));
        report.unreadable += read?;
        Ok((map, report, rewrite))
    })
}

/// Rebuilds an entry from its row. A row `sealed` by this node is taken as it is; any other has its card
/// re-validated and the publisher's signatures (the envelope's and the A2A one) re-verified. A local card whose signatures do not verify (a store written
/// before cards were signed) is signed again by `signer` at the same seq; a remote one is refused.
fn entry_from_row(row: Row, sealed: bool, names: &PublisherNames, signer: &Keypair) -> Option<Entry> {
    let publisher = PeerId::from_bytes(&row.publisher).ok()?;
    let origin = Origin::from_u8(row.origin)?;
    let entry = |card: HeldCard, sig: Vec<u8>| Entry {
        id: EntryId::next(),
        key: RecordKey { agent_id: row.agent_id.clone(), publisher },
        seq: row.seq,
        card,
        publisher_name: names.get(publisher),
        sig: sig.into_boxed_slice(),
        origin,
        updated_at: row.updated_at,
        record_id: record_id(&publisher, &row.agent_id, row.seq),
        live: Arc::new(Live::default()),
    };
    // Sealed by this node after everything in it was verified: taken as it is.
    if sealed {
        let card = if row.holds_text() {
            HeldCard::from_canonical(&row.card, &row.agent_id)?
        } else {
            HeldCard::from_packed(&row.packed, &row.agent_id)?
        };
        return Some(entry(card, row.sig.to_vec()));
    }
    let text = row.text()?;
    let mut card = AgentCard::from_json(text.as_bytes()).ok()?;
    if card.agent_id != row.agent_id {
        return None;
    }
    let body = crate::wire::CardBody { agent_id: row.agent_id.clone(), seq: row.seq, card: text };
    let mut sig = row.sig.to_vec();
    // A remote card's A2A signature was checked when the card arrived, and the envelope signature just
    // checked covers it, so a remote row only has to carry one (rows from before A2A signatures do
    // not). This node's own cards are checked in full, so that they are signed again if need be.
    let a2a_ok = match origin {
        Origin::Remote => card.a2a_signature.is_some() == card.has_a2a_view(),
        Origin::Local(_) => card.verify_a2a(&publisher).is_ok(),
    };
    let verified =
        card.to_json() == body.card.as_bytes() && crate::wire::verify_card(&publisher, &body, &sig) && a2a_ok;
    if !verified {
        if origin == Origin::Remote || publisher != signer.public().to_peer_id() {
            return None;
        }
        card = card.signed(signer);
        let canonical = crate::wire::CardBody { card: String::from_utf8(card.to_json()).ok()?, ..body };
        sig = crate::wire::sign_card(signer, &canonical);
    }
    Some(entry(HeldCard::new(&card), sig))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A minimal card of `id` at `version`: two versions differ in their text only.
    fn versioned(id: &str, version: &str) -> AgentCard {
        let json = format!(r#"{{"agent_id":"{id}","base_url":"http://h","version":"{version}"}}"#);
        AgentCard::from_json(json.as_bytes()).unwrap()
    }

    #[test]
    fn highest_seq_wins() {
        assert!(accepts(None, 1));
        assert!(accepts(Some(1), 2));
        assert!(!accepts(Some(2), 2));
        assert!(!accepts(Some(3), 2));
    }

    #[test]
    fn local_seq_is_monotonic_and_clock_based() {
        assert_eq!(next_local_seq(None, 1000), 1000);
        assert_eq!(next_local_seq(Some(1000), 1000), 1001);
        assert_eq!(next_local_seq(Some(5000), 1000), 5001);
        assert_eq!(next_local_seq(Some(10), 1000), 1000);
    }

    /// Many local cards at once: what changed is written once, what did not is left alone, the last card
    /// of an agent named twice wins, and a batch over the per-publisher limit is refused whole.
    #[tokio::test]
    async fn local_cards_registered_together_write_only_what_changed() {
        let dir = tempfile::tempdir().unwrap();
        let key = Keypair::generate_ed25519();
        let limits = Limits { per_publisher: 4, remote_records: 100 };
        {
            let (r, _) =
                Registry::open_checked(dir.path(), key.clone(), Thresholds::default(), limits, false)
                    .unwrap();
            let first = vec![versioned("a", "1"), versioned("b", "1"), versioned("c", "1")];
            let applied = r.register_local_many(first.clone(), Liveness::Node, 1_000).await.unwrap();
            assert_eq!(applied, vec![Applied::Created { seq: 1_000 }; 3]);
            let written = r.rows_written();
            assert_eq!(written, 3);
            assert_eq!(r.snapshot().entries.len(), 3);

            // The same cards again (a restart with the same card files): nothing written, seqs kept.
            let generation = r.snapshot().generation;
            let applied = r.register_local_many(first, Liveness::Node, 2_000).await.unwrap();
            assert_eq!(applied, vec![Applied::Unchanged { seq: 1_000 }; 3]);
            assert_eq!(r.rows_written(), written);
            assert_eq!(r.snapshot().generation, generation, "no new view for nothing");

            // b changed, and d named twice: the later d is the one held, both report it.
            let next =
                vec![versioned("a", "1"), versioned("b", "2"), versioned("d", "1"), versioned("d", "2")];
            let applied = r.register_local_many(next, Liveness::Node, 3_000).await.unwrap();
            assert_eq!(
                applied,
                vec![
                    Applied::Unchanged { seq: 1_000 },
                    Applied::Updated { seq: 3_000 },
                    Applied::Created { seq: 3_000 },
                    Applied::Created { seq: 3_000 },
                ]
            );
            assert_eq!(r.rows_written(), written + 2);
            let snapshot = r.snapshot();
            assert_eq!(snapshot.entries.len(), 4);
            let d = snapshot.get("d", &r.local_peer_id()).unwrap();
            assert!(d.card.text().contains(r#""version":"2""#), "{}", &*d.card.text());

            // An agent registering itself (not vouched for by the node): its registration is its first beat.
            let applied =
                r.register_local_many(vec![versioned("c", "1")], Liveness::Agent, 3_500).await.unwrap();
            assert_eq!(applied, vec![Applied::Updated { seq: 3_500 }]);
            let c = r.snapshot().get("c", &r.local_peer_id()).unwrap().clone();
            assert_eq!(c.last_heartbeat(9_000), Some(3_500));

            // Two new agents past the limit of four: neither is registered.
            let over = r
                .register_local_many(vec![versioned("e", "1"), versioned("a", "2")], Liveness::Node, 4_000)
                .await;
            assert!(matches!(over, Err(RegistryError::LocalLimit { held: 4, limit: 4 })), "{over:?}");
            let snapshot = r.snapshot();
            assert!(snapshot.get("e", &r.local_peer_id()).is_none());
            assert_eq!(snapshot.get("a", &r.local_peer_id()).unwrap().seq, 1_000);
        }
        // The witness followed: the store opens with the four agents at their versions.
        let (r, report) = Registry::open(dir.path(), key, Thresholds::default()).unwrap();
        assert_eq!(report.local, 4);
        assert_eq!(r.snapshot().get("b", &r.local_peer_id()).unwrap().seq, 3_000);
    }

    /// Past `LOCAL_BATCH` cards the store is written batch by batch: a batch refused by the limit leaves
    /// the batches before it registered, in the view and in the store.
    #[tokio::test]
    async fn local_cards_past_one_batch_are_written_batch_by_batch() {
        let dir = tempfile::tempdir().unwrap();
        let key = Keypair::generate_ed25519();
        let limit = LOCAL_BATCH + 10;
        let limits = Limits { per_publisher: limit, remote_records: 100 };
        let cards: Vec<AgentCard> =
            (0..LOCAL_BATCH + 20).map(|i| versioned(&format!("a{i:04}"), "1")).collect();
        {
            let (r, _) =
                Registry::open_checked(dir.path(), key.clone(), Thresholds::default(), limits, false)
                    .unwrap();
            let over = r.register_local_many(cards, Liveness::Node, 1_000).await;
            assert!(
                matches!(over, Err(RegistryError::LocalLimit { held, .. }) if held == LOCAL_BATCH),
                "{over:?}"
            );
            assert_eq!(r.snapshot().entries.len(), LOCAL_BATCH, "the first batch is in the view");
            assert_eq!(r.rows_written(), LOCAL_BATCH);
        }
        let (_, report) = Registry::open(dir.path(), key, Thresholds::default()).unwrap();
        assert_eq!(report.local, LOCAL_BATCH);
    }

    /// The witness of a batch of local cards follows each row from the seq before it, when the batch
    /// names an agent twice too.
    #[tokio::test]
    async fn a_bulk_load_with_repeated_ids_reopens_cleanly() {
        let dir = tempfile::tempdir().unwrap();
        let key = Keypair::generate_ed25519();
        {
            let (r, _) = Registry::open(dir.path(), key.clone(), Thresholds::default()).unwrap();
            r.register_local(versioned("a", "1"), Liveness::Node, 1_000).await.unwrap();
            let batch = vec![versioned("a", "2"), versioned("b", "1"), versioned("a", "3")];
            r.register_local_many(batch, Liveness::Node, 2_000).await.unwrap();
        }
        let (r, report) = Registry::open(dir.path(), key, Thresholds::default()).unwrap();
        assert_eq!(report.local, 2);
        let a = r.snapshot().get("a", &r.local_peer_id()).unwrap().clone();
        assert_eq!(a.seq, 2_000);
        assert!(a.card.text().contains(r#""version":"3""#), "{}", &*a.card.text());
    }

    /// A restart takes sealed rows without verifying them again; a row changed on disk under its seal
    /// is verified in full, and refused when its signature no longer holds.
    #[tokio::test]
    async fn sealed_rows_reopen_as_written_and_a_changed_row_is_verified_in_full() {
        let dir = tempfile::tempdir().unwrap();
        let key = Keypair::generate_ed25519();
        let other = Keypair::generate_ed25519();
        let card = |id: &str| {
            let json = format!(
                r#"{{"agent_id":"{id}","base_url":"http://h","reasoners":[{{"id":"r","tags":["t"]}}]}}"#
            );
            AgentCard::from_json(json.as_bytes()).unwrap()
        };
        let before = {
            let (r, _) = Registry::open(dir.path(), key.clone(), Thresholds::default()).unwrap();
            r.register_local(card("mine"), Liveness::Node, 1_000).await.unwrap();
            let remote = card("theirs").signed(&other);
            let body = crate::wire::CardBody {
                agent_id: "theirs".into(),
                seq: 5,
                card: String::from_utf8(remote.to_json()).unwrap(),
            };
            let sig = crate::wire::sign_card(&other, &body);
            let publisher = other.public().to_peer_id();
            let update = Update::upsert(publisher, 5, remote, Origin::Remote, sig);
            assert!(r.apply(update, 2_000).await.unwrap().changed_view());
            r.store.flush().await.unwrap();
            r.snapshot()
                .entries
                .iter()
                .map(|e| (e.key.clone(), e.seq, e.card.clone(), e.sig.clone()))
                .collect::<Vec<_>>()
        };
        let (r, report) = Registry::open(dir.path(), key.clone(), Thresholds::default()).unwrap();
        assert_eq!((report.local, report.remote, report.sealed, report.unreadable), (1, 1, 2, 0));
        let after: Vec<_> = r
            .snapshot()
            .entries
            .iter()
            .map(|e| (e.key.clone(), e.seq, e.card.clone(), e.sig.clone()))
            .collect();
        assert_eq!(after, before, "a sealed row comes back exactly as it was held");
        drop(r);
        // Change the remote card on disk, keeping the row's seal.
        {
            let store = Store::reopen(dir.path()).unwrap();
            let mut rows = Vec::new();
            store.load(|row| rows.push(row)).unwrap();
            let mut row = rows.into_iter().find(|row| row.agent_id == "theirs").unwrap();
            let text = row.text().unwrap().replace("http://h", "http://evil");
            row.packed = serde_bytes::ByteBuf::from(zstd::bulk::compress(text.as_bytes(), 1).unwrap());
            store.put(&row, true).await.unwrap();
        }
        let (r, report) = Registry::open(dir.path(), key, Thresholds::default()).unwrap();
        assert_eq!((report.local, report.remote, report.sealed, report.unreadable), (1, 0, 1, 1));
        assert!(r.snapshot().entries.iter().all(|e| !e.card.text().contains("evil")));
    }

    /// A sync answer's remote cards go to the store as one batch: a second version of a card in the
    /// same answer waits for the first's write and wins; a failed batch leaves none of its cards in the
    /// view and gives their places under the limits back.
    #[tokio::test]
    async fn remote_cards_of_an_answer_are_stored_together_or_not_at_all() {
        let dir = tempfile::tempdir().unwrap();
        let key = Keypair::generate_ed25519();
        let other = Keypair::generate_ed25519();
        let publisher = other.public().to_peer_id();
        let update = |id: &str, seq: u64| {
            let json = format!(r#"{{"agent_id":"{id}","base_url":"http://h","skills":[{{"id":"s"}}]}}"#);
            let card = AgentCard::from_json(json.as_bytes()).unwrap().signed(&other);
            let body = crate::wire::CardBody {
                agent_id: id.into(),
                seq,
                card: String::from_utf8(card.to_json()).unwrap(),
            };
            let sig = crate::wire::sign_card(&other, &body);
            Update::upsert(publisher, seq, card, Origin::Remote, sig)
        };
        let limits = Limits { per_publisher: 4, remote_records: 100 };
        let outcomes = |results: Vec<Result<Applied, RegistryError>>| {
            results
                .into_iter()
                .map(|r| match r {
                    Ok(Applied::Created { seq }) => format!("created {seq}"),
                    Ok(Applied::Updated { seq }) => format!("updated {seq}"),
                    Ok(Applied::Stale { held }) => format!("stale {held:?}"),
                    Ok(other) => format!("{other:?}"),
                    Err(RegistryError::Store(StoreError::Batch(_))) => "batch failed".to_owned(),
                    Err(e) => format!("error {e}"),
                })
                .collect::<Vec<_>>()
        };
        {
            let (r, _) =
                Registry::open_checked(dir.path(), key.clone(), Thresholds::default(), limits, false)
                    .unwrap();
            let answer = vec![update("x", 1), update("y", 1), update("x", 2), update("y", 1)];
            let results = outcomes(r.apply_many(answer, 1_000).await);
            assert_eq!(results, ["created 1", "created 1", "updated 2", "stale Some(1)"]);
            assert_eq!(r.rows_written(), 3);
            let mut view: Vec<_> =
                r.snapshot().entries.iter().map(|e| (e.key.agent_id.clone(), e.seq)).collect();
            view.sort();
            assert_eq!(view, [("x".to_owned(), 2), ("y".to_owned(), 1)]);

            r.store.fail_writes().await;
            let results = outcomes(r.apply_many(vec![update("z", 1), update("w", 1)], 2_000).await);
            assert_eq!(results, ["batch failed", "batch failed"]);
            assert_eq!(r.snapshot().entries.len(), 2, "nothing of a failed batch is in the view");
            r.reopen_store().await.unwrap();
            // Had the failed batch kept its places, the limit of 4 would refuse both of these.
            let results =
                outcomes(r.apply_many(vec![update("z", 1), update("w", 1), update("v", 1)], 3_000).await);
            assert_eq!(results, ["created 1", "created 1", "OverLimit(Publisher)"]);
            r.flush().await.unwrap();
        }
        let (r, report) =
            Registry::open_checked(dir.path(), key, Thresholds::default(), limits, false).unwrap();
        assert_eq!((report.remote, report.unreadable), (4, 0));
        let mut view: Vec<_> = r.snapshot().entries.iter().map(|e| (e.key.agent_id.clone(), e.seq)).collect();
        view.sort();
        let expected = [("w", 1), ("x", 2), ("y", 1), ("z", 1)].map(|(id, seq)| (id.to_owned(), seq));
        assert_eq!(view, expected);
    }

    /// A card at the size limit is longer than the limit once signed; its stored row still reads back.
    #[tokio::test]
    async fn a_signed_card_at_the_size_limit_reopens() {
        let dir = tempfile::tempdir().unwrap();
        let key = Keypair::generate_ed25519();
        let base = r#"{"agent_id":"a","base_url":"http://x","description":"","skills":[{"id":"s"}]}"#;
        let one = base.replace(r#""description":"""#, r#""description":"x""#);
        let fill = crate::defaults::MAX_CARD_BYTES
            - AgentCard::from_json(one.as_bytes()).unwrap().to_json().len()
            + 1;
        let text = "x".repeat(fill);
        let json = base.replace(r#""description":"""#, &format!(r#""description":"{text}""#));
        {
            let (r, _) = Registry::open(dir.path(), key.clone(), Thresholds::default()).unwrap();
            let card = AgentCard::from_json(json.as_bytes()).unwrap();
            r.register_local(card, Liveness::Node, 1_000).await.unwrap();
            let held = r.snapshot().entries[0].card.text().len();
            assert!(held > crate::defaults::MAX_CARD_BYTES, "signed, the card is over the limit: {held}");
        }
        let (r, report) = Registry::open(dir.path(), key, Thresholds::default()).unwrap();
        assert_eq!((report.local, report.sealed, report.unreadable), (1, 1, 0));
        assert_eq!(r.snapshot().entries[0].key.agent_id, "a");
    }

    /// Rows an older version wrote, or that this node had not sealed, are written again in the current
    /// form: the next start takes them on their seal, and they read back as they were. A record changed
    /// since the start is left alone (its row is current already).
    #[tokio::test]
    async fn rows_in_an_older_form_are_written_again() {
        let dir = tempfile::tempdir().unwrap();
        let key = Keypair::generate_ed25519();
        let card = |id: &str, version: &str| {
            let json = format!(
                r#"{{"agent_id":"{id}","base_url":"http://h","version":"{version}","skills":[{{"id":"s"}}]}}"#
            );
            AgentCard::from_json(json.as_bytes()).unwrap()
        };
        let held = |r: &Registry| {
            let mut held: Vec<_> = r
                .snapshot()
                .entries
                .iter()
                .map(|e| (e.key.agent_id.clone(), e.seq, e.card.clone()))
                .collect();
            held.sort_by(|a, b| a.0.cmp(&b.0));
            held
        };
        let before = {
            let (r, _) = Registry::open(dir.path(), key.clone(), Thresholds::default()).unwrap();
            for id in ["a", "b", "c"] {
                r.register_local(card(id, "1"), Liveness::Node, 1_000).await.unwrap();
            }
            held(&r)
        };
        {
            // "a" as version 1 wrote it, "b" not sealed, "c" as it is.
            let store = Store::reopen(dir.path()).unwrap();
            let mut rows = Vec::new();
            store.load(|row| rows.push(row)).unwrap();
            for mut row in rows {
                match row.agent_id.as_str() {
                    "a" => {
                        row.card = row.text().unwrap();
                        row.packed = Default::default();
                        row.version = 1;
                        row.seal = Default::default();
                        SealKey::derive(&key).seal(&mut row);
                    }
                    "b" => row.seal = Default::default(),
                    _ => continue,
                }
                store.put(&row, true).await.unwrap();
            }
        }
        let (r, report) = Registry::open(dir.path(), key.clone(), Thresholds::default()).unwrap();
        assert_eq!((report.local, report.sealed, report.rewrite), (3, 2, 2));
        assert_eq!(r.rows_to_rewrite(), 2);
        assert_eq!(r.rewrite_rows().await.unwrap(), 2);
        assert_eq!((r.rows_to_rewrite(), r.rewrite_rows().await.unwrap()), (0, 0));
        drop(r);
        let (r, report) = Registry::open(dir.path(), key.clone(), Thresholds::default()).unwrap();
        assert_eq!((report.local, report.sealed, report.rewrite), (3, 3, 0));
        assert_eq!(held(&r), before, "written again, read back as they were");
        let store_rows = {
            drop(r);
            let store = Store::reopen(dir.path()).unwrap();
            let mut versions = Vec::new();
            store.load(|row| versions.push(row.holds_text())).unwrap();
            versions
        };
        assert_eq!(store_rows, [false, false, false], "no row holds its text as it is any more");

        // A record updated after the start keeps the row its update wrote.
        {
            let store = Store::reopen(dir.path()).unwrap();
            let mut rows = Vec::new();
            store.load(|row| rows.push(row)).unwrap();
            let mut row = rows.into_iter().find(|row| row.agent_id == "a").unwrap();
            row.seal = Default::default();
            store.put(&row, true).await.unwrap();
        }
        let (r, report) = Registry::open(dir.path(), key.clone(), Thresholds::default()).unwrap();
        assert_eq!(report.rewrite, 1);
        r.register_local(card("a", "2"), Liveness::Node, 5_000).await.unwrap();
        assert_eq!(r.rewrite_rows().await.unwrap(), 0);
        drop(r);
        let (r, report) = Registry::open(dir.path(), key, Thresholds::default()).unwrap();
        assert_eq!((report.sealed, report.rewrite), (3, 0));
        assert!(r
            .snapshot()
            .entries
            .iter()
            .any(|e| e.key.agent_id == "a" && e.card.text().contains(r#""2""#)));
    }

    /// Rows of version 1 (the card's text as it is) are read as they were: sealed ones taken as they
    /// are, the others verified in full; a compressed text that does not decompress is unreadable.
    #[tokio::test]
    async fn rows_holding_their_text_are_still_read() {
        let dir = tempfile::tempdir().unwrap();
        let key = Keypair::generate_ed25519();
        let json = r#"{"agent_id":"mine","base_url":"http://h","reasoners":[{"id":"r","tags":["t"]}]}"#;
        let before = {
            let (r, _) = Registry::open(dir.path(), key.clone(), Thresholds::default()).unwrap();
            let card = AgentCard::from_json(json.as_bytes()).unwrap();
            r.register_local(card, Liveness::Node, 1_000).await.unwrap();
            r.snapshot().entries.iter().map(|e| (e.seq, e.card.clone(), e.sig.clone())).collect::<Vec<_>>()
        };
        let rewrite = |seal: bool, packed: Option<&'static [u8]>| {
            let (dir, key) = (dir.path().to_owned(), key.clone());
            async move {
                let store = Store::reopen(&dir).unwrap();
                let mut rows = Vec::new();
                store.load(|row| rows.push(row)).unwrap();
                let mut row = rows.pop().unwrap();
                match packed {
                    None => {
                        row.card = row.text().unwrap();
                        row.packed = Default::default();
                        row.version = 1;
                    }
                    Some(bytes) => {
                        row.card = String::new();
                        row.packed = serde_bytes::ByteBuf::from(bytes);
                        row.version = 2;
                    }
                }
                row.seal = Default::default();
                if seal {
                    SealKey::derive(&key).seal(&mut row);
                }
                store.put(&row, true).await.unwrap();
            }
        };
        for seal in [true, false] {
            rewrite(seal, None).await;
            let (r, report) = Registry::open(dir.path(), key.clone(), Thresholds::default()).unwrap();
            assert_eq!((report.local, report.sealed, report.unreadable), (1, usize::from(seal), 0), "{seal}");
            let after: Vec<_> =
                r.snapshot().entries.iter().map(|e| (e.seq, e.card.clone(), e.sig.clone())).collect();
            assert_eq!(after, before, "sealed: {seal}");
        }
        // A version 2 row whose frame is garbage, sealed or not, is skipped and reported (the local
        // agent it held is then lost, which the witness would refuse without `accept_loss`).
        for seal in [true, false] {
            let (r, _) = Registry::open(dir.path(), key.clone(), Thresholds::default()).unwrap();
            r.register_local(AgentCard::from_json(json.as_bytes()).unwrap(), Liveness::Node, 2_000)
                .await
                .unwrap();
            drop(r);
            rewrite(seal, Some(&b"\x28\xb5\x2f\xfd garbage"[..])).await;
            let report = Registry::open_checked(
                dir.path(),
                key.clone(),
                Thresholds::default(),
                Default::default(),
                true,
            )
            .map(|(_, report)| report);
            let report = report.map(|r| (r.unreadable, r.local)).map_err(|e| e.to_string());
            assert_eq!(report, Ok((1, 0)), "sealed: {seal}");
        }
    }
}
