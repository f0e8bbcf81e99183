//! The ingest worker: verifies and applies what peers send, one message at a time, and tells the event
//! loop how each gossip message fared so gossipsub forwards the good and penalises the forged.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use libp2p::gossipsub::{MessageAcceptance, MessageId};
use libp2p::identity::PeerId;
use serde_bytes::ByteBuf;
use tokio::sync::mpsc;
use tracing::Instrument;

use super::Counters;
use crate::clock::now_millis;
use crate::proto::reconcile::{record_id, RecordId};
use crate::registry::{Applied, Origin, Registry, RegistryError, Snapshot, Update};
use crate::wire::{self, Message, WireError};

/// The ingest worker's two queues, as the event loop holds them: gossip, and sync answers. They are
/// apart so that gossip never waits behind answers (see [`run`]); each holds `capacity` items.
pub struct Ingest {
    gossip: mpsc::Sender<GossipMessage>,
    answers: mpsc::Sender<(Answer, tracing::Span)>,
}

/// The receiving ends of an [`Ingest`], for [`run`].
pub struct Inbox {
    gossip: mpsc::Receiver<GossipMessage>,
    answers: mpsc::Receiver<(Answer, tracing::Span)>,
}

/// Two queues of `capacity` items each.
pub fn queues(capacity: usize) -> (Ingest, Inbox) {
    let (gossip, gossip_rx) = mpsc::channel(capacity);
    let (answers, answers_rx) = mpsc::channel(capacity);
    (Ingest { gossip, answers }, Inbox { gossip: gossip_rx, answers: answers_rx })
}

impl Ingest {
    /// Queues a gossip message without waiting: false when its queue is full (or the worker is gone),
    /// and it is dropped.
    pub fn gossip(&self, message: GossipMessage) -> bool {
        self.gossip.try_send(message).is_ok()
    }

    /// Queues a sync answer, with the span of the exchange that brought it, as [`Ingest::gossip`] does.
    pub fn answer(&self, answer: Answer, span: tracing::Span) -> bool {
        self.answers.try_send((answer, span)).is_ok()
    }
}

/// Whether `sealed` is a card of a version this node holds already, or of an older one: dropped before
/// its signatures are checked, since after them it would be ignored as stale anyway. The same card
/// arriving again (by gossip after a fetch, or from a second peer) costs a lookup instead of two
/// signature checks and a decoding; a card whose record has gone since (left, evicted) is checked and
/// taken again.
fn held_already(sealed: &wire::Sealed, snapshot: &Snapshot) -> bool {
    sealed.card_version().is_some_and(|(agent_id, seq)| {
        snapshot.get(&agent_id, &sealed.publisher()).is_some_and(|e| e.seq >= seq)
    })
}

/// Gossip batches at least this long are opened on every core (below it, starting threads costs more).
const OPEN_IN_PARALLEL_FROM: usize = 32;

/// A sync answer of at least this many messages marks a burst of allocation (`heap::burst`): a
/// catch-up's answers allocate and free much the same pages one after another.
const BURST_MESSAGES: usize = 64;

/// Queued work taken at once at most. Gossip messages taken together are opened together (their
/// signatures in one batch) and their cards applied as one registry batch: one view update for the lot
/// instead of one per card. An idle node takes each message as it comes, so batches form only under
/// load, when they pay.
pub const INGEST_BATCH: usize = 256;

/// A gossip message awaiting its verdict.
pub struct GossipMessage {
    pub message_id: MessageId,
    pub source: PeerId,
    pub data: Vec<u8>,
    /// When the event loop took it, if it came on the heartbeats topic: once accepted, its forward may
    /// wait for the loop's next `net::FORWARD_TICK`.
    pub heartbeat: Option<std::time::Instant>,
}

/// What the worker asks of the event loop.
pub enum Verdict {
    Validate {
        message_id: MessageId,
        source: PeerId,
        acceptance: MessageAcceptance,
        heartbeat: Option<std::time::Instant>,
    },
    /// A heartbeat named cards this node lacks: fetch them (by record id).
    Fetch { from: PeerId, publisher: PeerId, ids: Vec<RecordId> },
    /// A heartbeat carried the digest of an agent list this node does not hold: fetch the list.
    FetchList { from: PeerId, publisher: PeerId },
    /// These fetched records were applied (or refused): their fetches are over.
    Settled(Vec<RecordId>),
    /// This node was declared down by someone: send a heartbeat now.
    Refute,
    /// A sync response from this peer held messages that were refused (gossip is judged by its verdicts).
    Misbehaved { peer: PeerId, rejected: u32 },
}

/// Whose messages this node takes.
#[derive(Debug, Clone)]
pub struct Policy {
    pub me: PeerId,
    /// Publishers accepted in a closed mesh; `None`: every publisher whose signature verifies.
    pub allowed: Option<Arc<HashSet<PeerId>>>,
}

impl Policy {
    pub fn open_mesh(me: PeerId) -> Self {
        Self { me, allowed: None }
    }

    /// Whether messages signed by `publisher` are taken (this node's own always are).
    pub fn admits(&self, publisher: &PeerId) -> bool {
        *publisher == self.me || self.allowed.as_ref().is_none_or(|a| a.contains(publisher))
    }
}

/// What applying a verified message did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fate {
    /// The view changed: forward it.
    Changed,
    /// Nothing new (a replay, an older version, this node's own): drop it quietly.
    Unchanged,
    /// Not taken for this reason (counted), through no fault of the sender: drop it quietly.
    NotTaken(&'static str),
}

pub async fn run(
    registry: Arc<Registry>,
    mut inbox: Inbox,
    verdicts: mpsc::Sender<Verdict>,
    counters: Arc<Counters>,
    policy: Policy,
) {
    let policy = Arc::new(policy);
    let mut gossip: Vec<GossipMessage> = Vec::with_capacity(INGEST_BATCH);
    // The next sync answer, opened (parsed, its signatures checked, its cards decoded) on blocking
    // threads while the worker judges gossip or applies the answer before it: a node catching up spends
    // about as long opening an answer as applying one, so the two overlap instead of taking turns.
    let mut opening: Option<Opening> = None;
    let mut share = Share::default();
    loop {
        if opening.is_none() {
            if let Ok(answer) = inbox.answers.try_recv() {
                opening = Some(Opening::start(answer, &registry, &policy, &counters, &share));
            }
        }
        // Gossip first: whatever gossip is queued is judged before the next sync answer is applied, so a
        // heartbeat waits at most for the one answer being applied and the rest of the next one's opening
        // (taken before the gossip is judged, so that it is applied next). Behind a catch-up's queue of
        // answers (seconds of work on a busy node), the heartbeats that keep records alive arrived late
        // enough for those records to turn `degraded` until they were read. Then the answer being opened, if
        // any, before more gossip: a steady stream of gossip never holds the answers back. Gossip that came
        // before an answer is still applied before it; cards and removals that meet out of order are settled
        // by their seqs.
        let next = tokio::select! {
            biased;
            n = inbox.gossip.recv_many(&mut gossip, INGEST_BATCH) => {
                if n == 0 {
                    return;
                }
                Next::Gossip
            }
            opened = Opening::finished(&mut opening) => Next::Opened(opened),
            answer = inbox.answers.recv(), if opening.is_none() => match answer {
                Some(answer) => Next::Answer(answer),
                None => return,
            },
        };
        let opened = match next {
            Next::Answer(answer) => {
                opening = Some(Opening::start(answer, &registry, &policy, &counters, &share));
                continue;
            }
            Next::Gossip => match opening.take() {
                Some(mut waiting) => Some(waiting.finish().await),
                None => None,
            },
            Next::Opened(opened) => {
                opening = None;
                // The gossip queued while the answer was opened goes first.
                while gossip.len() < INGEST_BATCH {
                    let Ok(message) = inbox.gossip.try_recv() else { break };
                    gossip.push(message);
                }
                Some(opened)
            }
        };
        if !judge_gossip(&registry, &mut gossip, &policy, &counters, &verdicts).await {
            return;
        }
        if let Some(opened) = opened {
            // The answer after it is opened while this one is applied.
            if let Ok(answer) = inbox.answers.try_recv() {
                opening = Some(Opening::start(answer, &registry, &policy, &counters, &share));
            }
            let (span, messages, took) = (opened.span.clone(), opened.messages.count(), opened.messages.took);
            let applying = std::time::Instant::now();
            apply_opened(&registry, opened, &policy, &counters, &verdicts).instrument(span).await;
            share.learn(messages, took, applying.elapsed());
        }
    }
}

/// What woke the worker.
enum Next {
    Gossip,
    Answer((Answer, tracing::Span)),
    Opened(Opened),
}

/// A sync answer being opened on a blocking thread ([`open_answer`]), with what its application needs
/// whatever the opening's fate.
struct Opening {
    from: PeerId,
    fetched: Vec<RecordId>,
    span: tracing::Span,
    started: std::time::Instant,
    task: tokio::task::JoinHandle<OpenedMessages>,
    /// The answer's last messages, which the worker opens itself once it is free ([`Share`]).
    tail: Tail,
}

/// The part of an answer the worker opens itself, with what opening it needs.
#[derive(Default)]
enum Tail {
    #[default]
    None,
    Waiting {
        messages: Vec<ByteBuf>,
        snapshot: Arc<Snapshot>,
        policy: Arc<Policy>,
        counters: Arc<Counters>,
    },
    Opened(OpenedMessages),
}

/// Answers shorter than this are opened whole on the blocking thread.
const SHARE_FROM: usize = 64;

/// How much of the next sync answer the worker opens itself. The blocking thread opens the answer while
/// the worker applies the one before, and opening costs about twice what applying does, so the worker
/// waited half the time: it now opens the answer's tail, sized so that both finish together. With `o`
/// and `a` the cost of opening and of applying a message, the worker's share `s` of the opening makes
/// `(1 - s) o = a + s o`, so `s = (o - a) / 2o` (none when applying costs more). Two threads per node
/// still, as before: a machine whose cores are all busy does the same work, an idle one uses both cores.
#[derive(Debug, Default, Clone, Copy, PartialEq)]
struct Share {
    /// Nanoseconds to open and to apply one message, averaged over the answers so far; none yet: 0.
    open_ns: f64,
    apply_ns: f64,
}

impl Share {
    /// The messages of an answer of `len` the worker opens itself (its last ones).
    fn tail(&self, len: usize) -> usize {
        if len < SHARE_FROM || self.open_ns <= self.apply_ns {
            return 0;
        }
        let share = (self.open_ns - self.apply_ns) / (2.0 * self.open_ns);
        (len as f64 * share.min(0.5)) as usize
    }

    /// Learns from an answer of `messages` that took `opened` to open and `applied` to apply.
    fn learn(&mut self, messages: usize, opened: std::time::Duration, applied: std::time::Duration) {
        if messages < SHARE_FROM {
            return;
        }
        let per = |d: std::time::Duration| d.as_nanos() as f64 / messages as f64;
        let blend = |old: f64, new: f64| if old == 0.0 { new } else { (old + new) / 2.0 };
        self.open_ns = blend(self.open_ns, per(opened));
        self.apply_ns = blend(self.apply_ns, per(applied));
    }
}

impl Opening {
    fn start(
        (answer, exchange): (Answer, tracing::Span),
        registry: &Registry,
        policy: &Arc<Policy>,
        counters: &Arc<Counters>,
        share: &Share,
    ) -> Self {
        let Answer { from, mut messages, fetched } = answer;
        if messages.len() >= BURST_MESSAGES {
            crate::heap::burst();
        }
        // A child of the sync exchange that brought the messages, so a log follows both.
        let span = tracing::info_span!(parent: &exchange, "ingest", %from, source = "sync", messages = messages.len());
        let snapshot = registry.snapshot();
        let tail = match share.tail(messages.len()) {
            0 => Tail::None,
            n => Tail::Waiting {
                messages: messages.split_off(messages.len() - n),
                snapshot: snapshot.clone(),
                policy: policy.clone(),
                counters: counters.clone(),
            },
        };
        let (policy, counters) = (policy.clone(), counters.clone());
        let in_span = span.clone();
        let task = tokio::task::spawn_blocking(move || {
            in_span.in_scope(|| open_answer(from, messages, &snapshot, &policy, &counters))
        });
        Self { from, fetched, span, started: std::time::Instant::now(), task, tail }
    }

    /// The answer once opened: the worker opens the tail first, then waits for the rest. Polled by
    /// reference, so a select that takes another branch leaves the opening whole (an opened tail is
    /// kept); nothing is awaited after the task ends. A panic while opening (ruled out by the fuzz
    /// targets) drops the answer's messages: the records it was asked for are settled all the same, so
    /// they are asked for again.
    async fn finish(&mut self) -> Opened {
        let from = self.from;
        self.tail = match std::mem::take(&mut self.tail) {
            Tail::Waiting { messages, snapshot, policy, counters } => Tail::Opened(
                self.span.in_scope(|| open_answer(from, messages, &snapshot, &policy, &counters)),
            ),
            // Opened by a call that was dropped while it waited for the task, or none.
            kept => kept,
        };
        let mut messages = (&mut self.task).await.unwrap_or_else(|error| {
            tracing::error!(%from, %error, "opening a sync answer failed; its records are asked for again");
            OpenedMessages::default()
        });
        if let Tail::Opened(tail) = std::mem::take(&mut self.tail) {
            messages.append(tail);
        }
        let (fetched, span) = (std::mem::take(&mut self.fetched), self.span.clone());
        Opened { from, fetched, span, started: self.started, messages }
    }

    /// Waits for the answer being opened, if any (never ready otherwise).
    async fn finished(opening: &mut Option<Opening>) -> Opened {
        match opening {
            Some(waiting) => waiting.finish().await,
            None => std::future::pending().await,
        }
    }
}

/// Applies the gossip messages taken so far and hands each one's verdict to the event loop. False when
/// the event loop is gone.
async fn judge_gossip(
    registry: &Registry,
    gossip: &mut Vec<GossipMessage>,
    policy: &Policy,
    counters: &Counters,
    verdicts: &mpsc::Sender<Verdict>,
) -> bool {
    if gossip.is_empty() {
        return true;
    }
    let span = tracing::info_span!("ingest", source = "gossip", messages = gossip.len());
    let acceptances = apply_gossip(registry, gossip, policy, counters, verdicts).instrument(span).await;
    for (message, acceptance) in gossip.drain(..).zip(acceptances) {
        let verdict = Verdict::Validate {
            message_id: message.message_id,
            source: message.source,
            acceptance,
            heartbeat: message.heartbeat,
        };
        if verdicts.send(verdict).await.is_err() {
            return false;
        }
    }
    true
}

/// Applies gossip messages in order, each judged on its own: their signatures are checked in one
/// batch, and runs of cards are applied as one registry batch. Whoever relayed a message, only its own
/// signature says who published it: gossip carries no second signature (see `net`), so a relay is
/// trusted for nothing.
async fn apply_gossip(
    registry: &Registry,
    messages: &[GossipMessage],
    policy: &Policy,
    counters: &Counters,
    verdicts: &mpsc::Sender<Verdict>,
) -> Vec<MessageAcceptance> {
    let mut acceptances = vec![MessageAcceptance::Ignore; messages.len()];
    let snapshot = registry.snapshot();
    let mut parsed = Vec::with_capacity(messages.len());
    let mut at = Vec::with_capacity(messages.len());
    for (i, message) in messages.iter().enumerate() {
        match wire::parse(&message.data) {
            // Held already (fetched, most likely): nothing new, and not forwarded.
            Ok(sealed) if held_already(&sealed, &snapshot) => counters.update(|c| c.ignored += 1),
            Ok(sealed) => {
                parsed.push(sealed);
                at.push(i);
            }
            Err(error) => acceptances[i] = fail(error, message.source, counters),
        }
    }
    // Cards wait in `run` until a message of another kind, so that order is kept.
    let mut run: Vec<(usize, (String, PeerId), Update)> = Vec::new();
    for (i, opened) in at.into_iter().zip(open_all(parsed, policy)) {
        let message = &messages[i];
        match opened {
            Err(refusal) => acceptances[i] = refusal.count(message.source, counters),
            Ok(wire::Verified { publisher, message: Message::Card { body, card }, sig })
                if publisher != policy.me =>
            {
                let (key, update) = card_update(publisher, body, *card, sig);
                run.push((i, key, update));
            }
            Ok(verified) => {
                apply_cards(registry, &mut run, &mut acceptances, counters).await;
                let follow_up = FollowUp { from: message.source, verdicts, lists_later: None };
                acceptances[i] =
                    apply_verified(registry, verified, &message.data, policy, counters, follow_up).await;
            }
        }
    }
    apply_cards(registry, &mut run, &mut acceptances, counters).await;
    acceptances
}

/// Applies a run of gossiped cards as one registry batch, each with its own verdict.
async fn apply_cards(
    registry: &Registry,
    run: &mut Vec<(usize, (String, PeerId), Update)>,
    acceptances: &mut [MessageAcceptance],
    counters: &Counters,
) {
    if run.is_empty() {
        return;
    }
    let (slots, updates): (Vec<_>, Vec<_>) = run.drain(..).map(|(i, key, update)| ((i, key), update)).unzip();
    let results = registry.apply_many(updates, now_millis()).await;
    for ((i, (agent_id, publisher)), result) in slots.into_iter().zip(results) {
        acceptances[i] = tally(counters, publisher, card_applied(&agent_id, publisher, result));
    }
}

/// A sync answer for the ingest worker: signed messages (any publisher's cards, or a heartbeat or the
/// chunks that carry an agent list), with the records it was asked for when it answers a fetch (all
/// settled once it is applied).
pub struct Answer {
    pub from: PeerId,
    pub messages: Vec<ByteBuf>,
    /// The records asked for, when it answers a fetch.
    pub fetched: Vec<RecordId>,
}

/// A sync answer's messages, opened: each with its raw bytes (a list chunk is kept signed), or refused
/// before it was applied; with those refused at parse and those held already counted.
#[derive(Default)]
struct OpenedMessages {
    opened: Vec<(Result<wire::Verified, Refusal>, ByteBuf)>,
    rejected: u32,
    repeated: usize,
    /// How long opening them took.
    took: std::time::Duration,
}

impl OpenedMessages {
    /// The messages it held, refused and repeated ones included.
    fn count(&self) -> usize {
        self.opened.len() + self.rejected as usize + self.repeated
    }

    /// Adds the messages that came after these in the same answer.
    fn append(&mut self, after: OpenedMessages) {
        self.opened.extend(after.opened);
        self.rejected += after.rejected;
        self.repeated += after.repeated;
        self.took += after.took;
    }
}

/// A sync answer ready to be applied.
struct Opened {
    from: PeerId,
    fetched: Vec<RecordId>,
    span: tracing::Span,
    /// When its opening started.
    started: std::time::Instant,
    messages: OpenedMessages,
}

/// Opens a sync answer's messages, the part of its work that needs no lock: every signature checked in
/// one batch, the cards decoded. A card of a version `snapshot` holds already is dropped unchecked; so
/// is a message that does not parse (counted against `from`). On the one thread it runs on: the
/// blocking thread, beside the worker applying the answer before it, and the worker for the answer's
/// tail ([`Share`]). Splitting it over every core as well put three threads of each node on two cores;
/// a 50-node mesh catching up at once reached the full view later that way (BENCHMARKS.md, "The full
/// view, commit by commit").
fn open_answer(
    from: PeerId,
    messages: Vec<ByteBuf>,
    snapshot: &Snapshot,
    policy: &Policy,
    counters: &Counters,
) -> OpenedMessages {
    let started = std::time::Instant::now();
    let (mut rejected, mut repeated) = (0u32, 0usize);
    let mut parsed = Vec::with_capacity(messages.len());
    let mut raw = Vec::with_capacity(messages.len());
    for message in messages {
        match wire::parse(&message) {
            Ok(sealed) if held_already(&sealed, snapshot) => repeated += 1,
            Ok(sealed) => {
                parsed.push(sealed);
                raw.push(message);
            }
            Err(error) => {
                fail(error, from, counters);
                rejected += 1;
            }
        }
    }
    let opened = open_batch(parsed, policy).into_iter().zip(raw).collect();
    OpenedMessages { opened, rejected, repeated, took: started.elapsed() }
}

/// Applies an opened sync response: the cards in one batch (one view update and one store batch for
/// hundreds of cards), the chunks of a long agent list together once all are there, anything else one
/// by one. Every record the answer was asked for is settled.
async fn apply_opened(
    registry: &Registry,
    answer: Opened,
    policy: &Policy,
    counters: &Counters,
    verdicts: &mpsc::Sender<Verdict>,
) {
    let Opened { from, fetched, span: _, started, messages } = answer;
    let applying = std::time::Instant::now();
    let OpenedMessages { opened, mut rejected, repeated, took } = messages;
    let (count, asked) = (opened.len() + rejected as usize + repeated, fetched.len());
    let mut cards = Vec::with_capacity(opened.len());
    let mut chunks: HashMap<PeerId, Vec<(wire::ListChunkBody, ByteBuf)>> = HashMap::new();
    // Publishers whose heartbeat named a list not held: asked for once the whole answer is in, since
    // the answer may carry that list after the heartbeat (the answer to `Heartbeats` does).
    let mut unknown_lists: Vec<PeerId> = Vec::new();
    for (opened, message) in opened {
        let verified = match opened {
            Ok(verified) => verified,
            Err(refusal) => {
                refusal.count(from, counters);
                rejected += 1;
                continue;
            }
        };
        match verified {
            wire::Verified { publisher, message: Message::Card { body, card }, sig }
                if publisher != policy.me =>
            {
                cards.push(card_update(publisher, body, *card, sig));
            }
            wire::Verified { publisher, message: Message::ListChunk(chunk), .. }
                if publisher != policy.me =>
            {
                chunks.entry(publisher).or_default().push((chunk, message));
            }
            verified => {
                let follow_up = FollowUp { from, verdicts, lists_later: Some(&mut unknown_lists) };
                let acceptance =
                    apply_verified(registry, verified, &message, policy, counters, follow_up).await;
                rejected += u32::from(acceptance == MessageAcceptance::Reject);
            }
        }
    }
    // Applied or not, the records fetched and those that came are no longer being fetched: what is
    // still missing (a card a tombstone hid until the publisher came back, or one the peer no longer
    // held) may be asked for again at once.
    let mut settled = fetched;
    if !cards.is_empty() {
        let (keys, updates): (Vec<_>, Vec<_>) = cards.into_iter().unzip();
        settled.extend(keys.iter().zip(&updates).filter_map(
            |((agent_id, publisher), update)| match update {
                Update::Upsert { seq, .. } => Some(record_id(publisher, agent_id, *seq)),
                _ => None,
            },
        ));
        let results = registry.apply_many(updates, now_millis()).await;
        for ((agent_id, publisher), result) in keys.into_iter().zip(results) {
            let acceptance = tally(counters, publisher, card_applied(&agent_id, publisher, result));
            rejected += u32::from(acceptance == MessageAcceptance::Reject);
        }
    }
    if !settled.is_empty() {
        let _ = verdicts.try_send(Verdict::Settled(settled));
    }
    if repeated > 0 {
        counters.update(|c| c.ignored += repeated as u64);
    }
    for (publisher, chunks) in chunks {
        let acceptance = apply_list(registry, publisher, chunks, from, counters, verdicts);
        rejected += u32::from(acceptance == MessageAcceptance::Reject);
    }
    unknown_lists.sort_unstable();
    unknown_lists.dedup();
    for publisher in unknown_lists {
        if registry.signed_list(&publisher).is_none() {
            let _ = verdicts.try_send(Verdict::FetchList { from, publisher });
        }
    }
    tracing::debug!(
        %from,
        messages = count,
        // Records it was asked for by id: a fetch's answer (none for lists, heartbeats, reconciling).
        fetched = asked,
        repeated,
        rejected,
        open_us = took.as_micros() as u64,
        // From the opening's start to the application's, less the opening: the worker was busy.
        waited_us = (applying - started).saturating_sub(took).as_micros() as u64,
        apply_us = applying.elapsed().as_micros() as u64,
        "sync answer applied"
    );
    if rejected > 0 {
        let _ = verdicts.try_send(Verdict::Misbehaved { peer: from, rejected });
    }
}

/// Installs a publisher's long agent list from the signed chunks of one answer. Chunks that do not
/// make a whole list are dropped (the next heartbeat fetches again); chunks that contradict their own
/// digest, or a list longer than the publisher may have, are the publisher's fault.
fn apply_list(
    registry: &Registry,
    publisher: PeerId,
    chunks: Vec<(wire::ListChunkBody, ByteBuf)>,
    from: PeerId,
    counters: &Counters,
    verdicts: &mpsc::Sender<Verdict>,
) -> MessageAcceptance {
    let (bodies, signed): (Vec<_>, Vec<_>) = chunks.into_iter().unzip();
    let (digest, agents) = match wire::assemble_list(&bodies) {
        Ok(list) => list,
        Err(wire::AssemblyError::DigestMismatch) => return reject(counters, "bad_list"),
        Err(error) => {
            tracing::debug!(%publisher, %from, %error, "agent list chunks dropped");
            return refuse(counters, "incomplete_list", false);
        }
    };
    if agents.len() > registry.limits().per_publisher {
        tracing::debug!(%publisher, agents = agents.len(), "agent list over the per-publisher limit");
        return refuse(counters, "publisher_over_limit", false);
    }
    let signed = signed.into_iter().map(|m| Arc::<[u8]>::from(m.into_vec())).collect();
    let outcome = registry.remote_list(publisher, digest, agents, signed, now_millis());
    fetch_missing(verdicts, from, publisher, &outcome.missing);
    tally(counters, publisher, Ok(changed(outcome.list_installed)))
}

/// Counts a refusal by reason: `Reject` when the sender is to blame (it earns a strike), else `Ignore`.
fn refuse(counters: &Counters, reason: &'static str, blame: bool) -> MessageAcceptance {
    counters.update(|c| *c.rejected.entry(reason).or_default() += 1);
    if blame {
        MessageAcceptance::Reject
    } else {
        MessageAcceptance::Ignore
    }
}

fn reject(counters: &Counters, reason: &'static str) -> MessageAcceptance {
    refuse(counters, reason, true)
}

/// Why a message of a sync answer was refused before it was applied.
enum Refusal {
    Wire(WireError),
    NotAllowed(PeerId),
}

impl Refusal {
    fn count(self, from: PeerId, counters: &Counters) -> MessageAcceptance {
        match self {
            Refusal::Wire(error) => fail(error, from, counters),
            Refusal::NotAllowed(publisher) => {
                tracing::debug!(%from, %publisher, "rejected message of a publisher outside the allow-list");
                reject(counters, "publisher_not_allowed")
            }
        }
    }
}

/// Verifies a batch, checks it against the policy and decodes what passed (cards' A2A signatures in
/// a batch too). Order is kept.
fn open_batch(share: Vec<wire::Sealed>, policy: &Policy) -> Vec<Result<wire::Verified, Refusal>> {
    // Refused messages keep their place; the rest are decoded together.
    let mut out: Vec<Option<Result<wire::Verified, Refusal>>> = Vec::with_capacity(share.len());
    let mut admitted = Vec::with_capacity(share.len());
    for checked in wire::verify_all(share) {
        match checked {
            Ok(c) if policy.admits(&c.publisher()) => {
                admitted.push(c);
                out.push(None);
            }
            Ok(c) => out.push(Some(Err(Refusal::NotAllowed(c.publisher())))),
            Err(error) => out.push(Some(Err(Refusal::Wire(error)))),
        }
    }
    let mut decoded = wire::decode_all(admitted).into_iter();
    out.into_iter()
        .map(|slot| {
            slot.unwrap_or_else(|| {
                decoded.next().map_or_else(
                    || Err(Refusal::Wire(WireError::Malformed("lost in decoding".into()))),
                    |d| d.map_err(Refusal::Wire),
                )
            })
        })
        .collect()
}

/// Verifies, checks against the policy and decodes messages, on every core: each core takes a share,
/// checks its signatures in one batch, then decodes the bodies of those that passed (decoding a card
/// costs more than its signature). Order is kept.
fn open_all(parsed: Vec<wire::Sealed>, policy: &Policy) -> Vec<Result<wire::Verified, Refusal>> {
    let open_share = |share| open_batch(share, policy);
    // Asked once: the answer reads the cgroup's files, a few system calls per batch otherwise.
    static CORES: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    let cores = *CORES.get_or_init(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    if cores < 2 || parsed.len() < OPEN_IN_PARALLEL_FROM {
        return open_share(parsed);
    }
    let per_share = parsed.len().div_ceil(cores);
    let mut shares = Vec::with_capacity(cores);
    let mut rest = parsed;
    while rest.len() > per_share {
        let tail = rest.split_off(per_share);
        shares.push(rest);
        rest = tail;
    }
    shares.push(rest);
    std::thread::scope(|scope| {
        let mut shares = shares.into_iter();
        let first = shares.next().unwrap_or_default();
        let others: Vec<_> =
            shares.map(|share| (share.len(), scope.spawn(move || open_share(share)))).collect();
        let mut opened = open_share(first);
        for (len, other) in others {
            // A share's thread panics only if decoding panics, which the fuzz targets rule out; were it
            // to, its messages count as malformed rather than bringing the worker down.
            match other.join() {
                Ok(share) => opened.extend(share),
                Err(_) => opened.extend(
                    (0..len).map(|_| Err(Refusal::Wire(WireError::Malformed("decoder panicked".into())))),
                ),
            }
        }
        opened
    })
}

/// Asks the loop to fetch the cards a heartbeat or list named at seqs this node lacks.
fn fetch_missing(
    verdicts: &mpsc::Sender<Verdict>,
    from: PeerId,
    publisher: PeerId,
    missing: &[(String, u64)],
) {
    if !missing.is_empty() {
        let ids = missing.iter().map(|(agent_id, seq)| record_id(&publisher, agent_id, *seq)).collect();
        let _ = verdicts.try_send(Verdict::Fetch { from, publisher, ids });
    }
}

/// Counts a message that failed verification by reason; it is answered `Reject`.
fn fail(error: WireError, from: PeerId, counters: &Counters) -> MessageAcceptance {
    if matches!(error, WireError::BadSignature | WireError::BadA2aSignature(_)) {
        counters.update(|c| c.signature_failures += 1);
    }
    tracing::debug!(%from, %error, "rejected message");
    reject(counters, error.reason())
}

/// The update a verified card makes, with the record it names.
fn card_update(
    publisher: PeerId,
    body: wire::CardBody,
    card: crate::card::AgentCard,
    sig: Vec<u8>,
) -> ((String, PeerId), Update) {
    // The body's text is the card's canonical JSON: decoding checked that it is.
    let update =
        Update::Upsert { publisher, seq: body.seq, card, text: body.card, origin: Origin::Remote, sig };
    ((body.agent_id, publisher), update)
}

/// What applying a card did; logs a change, which the mesh measurements time.
fn card_applied(
    agent_id: &str,
    publisher: PeerId,
    applied: Result<Applied, RegistryError>,
) -> Result<Fate, RegistryError> {
    Ok(match applied? {
        Applied::Created { seq } | Applied::Updated { seq } => {
            tracing::debug!(target: "agentmesh::apply", %agent_id, %publisher, seq, "card applied");
            Fate::Changed
        }
        Applied::OverLimit(limit) => {
            tracing::debug!(%agent_id, %publisher, reason = limit.reason(), "card refused: over a limit");
            // Neither is proof against the sender: a removal that frees the publisher's slot may still be
            // on its way, the publisher's node may run with a higher limit, and a full view is this
            // node's state. Not forwarded, counted, and nobody is struck for it.
            Fate::NotTaken(limit.reason())
        }
        _ => Fate::Unchanged,
    })
}

fn changed(changed: bool) -> Fate {
    if changed {
        Fate::Changed
    } else {
        Fate::Unchanged
    }
}

/// Counts what a verified message did and turns it into the gossip verdict.
fn tally(counters: &Counters, publisher: PeerId, outcome: Result<Fate, RegistryError>) -> MessageAcceptance {
    match outcome {
        Ok(Fate::Changed) => {
            counters.update(|c| c.accepted += 1);
            MessageAcceptance::Accept
        }
        Ok(Fate::Unchanged) => {
            counters.update(|c| c.ignored += 1);
            MessageAcceptance::Ignore
        }
        Ok(Fate::NotTaken(reason)) => refuse(counters, reason, false),
        Err(error) => {
            tracing::warn!(%publisher, %error, "could not store a verified message");
            counters.update(|c| c.ignored += 1);
            MessageAcceptance::Ignore
        }
    }
}

/// Where the questions a verified message raises go: to `from`, through `verdicts`; with `lists_later`,
/// a heartbeat's unknown list is left there for the caller to ask for once the rest of the same answer
/// is applied (it may carry that list).
struct FollowUp<'a> {
    from: PeerId,
    verdicts: &'a mpsc::Sender<Verdict>,
    lists_later: Option<&'a mut Vec<PeerId>>,
}

/// Applies a verified message (`data`: the message as received, kept when a heartbeat carries a list).
async fn apply_verified(
    registry: &Registry,
    verified: wire::Verified,
    data: &[u8],
    policy: &Policy,
    counters: &Counters,
    follow_up: FollowUp<'_>,
) -> MessageAcceptance {
    let FollowUp { from, verdicts, lists_later } = follow_up;
    let publisher = verified.publisher;
    if publisher == policy.me {
        return MessageAcceptance::Ignore;
    }
    let now = now_millis();
    let outcome = match verified.message {
        Message::Card { body, card } => {
            let ((agent_id, _), update) = card_update(publisher, body, *card, verified.sig);
            card_applied(&agent_id, publisher, registry.apply(update, now).await)
        }
        Message::Tombstone(t) => match t.agent_id {
            Some(agent_id) => registry
                .apply(Update::Remove { publisher, agent_id, seq: t.seq }, now)
                .await
                .map(|applied| changed(matches!(applied, Applied::Removed { .. }))),
            None => registry.remove_publisher(publisher, t.seq, now).await.map(|n| changed(n > 0)),
        },
        Message::Heartbeat(body) => {
            let outcome = registry.remote_heartbeat(publisher, &body, data, now);
            fetch_missing(verdicts, from, publisher, &outcome.missing);
            match lists_later {
                _ if !outcome.unknown_list => {}
                Some(later) => later.push(publisher),
                None => {
                    let _ = verdicts.try_send(Verdict::FetchList { from, publisher });
                }
            }
            // A fetched list is applied but not forwarded: it is old news to everyone else.
            Ok(changed(!outcome.replayed && !outcome.list_installed))
        }
        // Chunks answer list fetches; gossiped, they are nobody's news.
        Message::ListChunk(_) => Ok(Fate::Unchanged),
        Message::Down(down) => match PeerId::from_bytes(&down.target) {
            // Someone believes this node is down: a fresh heartbeat tells everyone otherwise.
            Ok(target) if target == policy.me => {
                let _ = verdicts.try_send(Verdict::Refute);
                Ok(Fate::Unchanged)
            }
            Ok(target) => Ok(changed(registry.remote_down(target, down.last_seen))),
            Err(_) => Ok(Fate::Unchanged),
        },
    };
    tally(counters, publisher, outcome)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::card::AgentCard;
    use crate::registry::health::Thresholds;
    use crate::wire::{CardBody, HeartbeatAgent, HeartbeatBody};
    use libp2p::identity::Keypair;

    struct Harness {
        registry: Registry,
        counters: Counters,
        verdicts: mpsc::Sender<Verdict>,
        rx: mpsc::Receiver<Verdict>,
        policy: Policy,
        _dir: tempfile::TempDir,
    }

    impl Harness {
        fn new() -> Self {
            Self::with_limits(crate::registry::Limits::default())
        }

        fn with_limits(limits: crate::registry::Limits) -> Self {
            let dir = tempfile::tempdir().unwrap();
            let key = Keypair::generate_ed25519();
            let me = key.public().to_peer_id();
            let (registry, _) =
                Registry::open_checked(dir.path(), key, Thresholds::default(), limits, false).unwrap();
            let (verdicts, rx) = mpsc::channel(16);
            Self {
                registry,
                counters: Counters::default(),
                verdicts,
                rx,
                policy: Policy::open_mesh(me),
                _dir: dir,
            }
        }

        async fn gossip(&self, data: &[u8], relay: &Keypair) -> MessageAcceptance {
            let message = GossipMessage {
                message_id: MessageId::new(&[0]),
                source: relay.public().to_peer_id(),
                data: data.to_vec(),
                heartbeat: None,
            };
            let accepted =
                apply_gossip(&self.registry, &[message], &self.policy, &self.counters, &self.verdicts).await;
            accepted[0]
        }

        /// A sync answer from `from` holding `messages`, answering a fetch of `fetched`.
        async fn sync(&self, from: PeerId, messages: &[Vec<u8>], fetched: Vec<RecordId>) {
            let messages = messages.iter().map(|m| ByteBuf::from(m.clone())).collect();
            let opened = open_answer(from, messages, &self.registry.snapshot(), &self.policy, &self.counters);
            let (span, started) = (tracing::Span::none(), std::time::Instant::now());
            let answer = Opened { from, fetched, span, started, messages: opened };
            apply_opened(&self.registry, answer, &self.policy, &self.counters, &self.verdicts).await;
        }

        fn view(&self) -> Vec<(String, u64)> {
            self.registry.snapshot().entries.iter().map(|e| (e.key.agent_id.clone(), e.seq)).collect()
        }

        fn rejected(&self, reason: &str) -> u64 {
            self.counters.get().rejected.get(reason).copied().unwrap_or(0)
        }
    }

    fn card_msg(key: &Keypair, id: &str, seq: u64) -> Vec<u8> {
        let json =
            format!(r#"{{"agent_id":"{id}","base_url":"http://127.0.0.1:1","skills":[{{"id":"s"}}]}}"#);
        let card = AgentCard::from_json(json.as_bytes()).unwrap().signed(key);
        wire::seal_card(
            key,
            &CardBody { agent_id: id.into(), seq, card: String::from_utf8(card.to_json()).unwrap() },
        )
    }

    /// How long a test waits for an opening.
    const DEADLINE: std::time::Duration = std::time::Duration::from_secs(10);

    /// The worker's share of an opening makes both threads finish together, and is none for short
    /// answers, before anything is known, or when applying costs more than opening.
    #[test]
    fn the_worker_opens_the_share_that_balances_the_two_threads() {
        let ms = std::time::Duration::from_millis;
        assert_eq!(Share::default().tail(256), 0, "nothing measured yet");
        let mut share = Share::default();
        share.learn(SHARE_FROM - 1, ms(30), ms(15));
        assert_eq!(share, Share::default(), "a short answer teaches nothing");
        share.learn(256, ms(30), ms(15));
        assert_eq!(share.tail(256), 64, "opening twice applying: a quarter");
        assert_eq!(share.tail(SHARE_FROM - 1), 0);
        share.learn(256, ms(10), ms(35));
        assert_eq!(share.tail(256), 0, "applying costs more (averaged: 20 against 25 ms)");
        let opening_alone = Share { open_ns: 1000.0, apply_ns: 0.0 };
        assert_eq!(opening_alone.tail(256), 128, "at most half");
    }

    /// An answer opened in two parts (the tail by the worker) is applied whole and in order, its
    /// refusals and repeats counted as when opened in one.
    #[tokio::test]
    async fn an_answer_opened_in_two_parts_is_applied_whole() {
        let h = Harness::new();
        let (carrier, publisher) = (Keypair::generate_ed25519(), Keypair::generate_ed25519());
        let from = carrier.public().to_peer_id();
        h.sync(from, &[card_msg(&publisher, "agent-0", 1)], Vec::new()).await;
        let mut messages: Vec<ByteBuf> =
            (0..100).map(|n| ByteBuf::from(card_msg(&publisher, &format!("agent-{n}"), 1))).collect();
        messages[90] = ByteBuf::from(b"not a message".to_vec());
        let answer = Answer { from, messages, fetched: Vec::new() };
        let share = Share { open_ns: 2.0, apply_ns: 1.0 };
        let (policy, counters) = (Arc::new(h.policy.clone()), Arc::new(Counters::default()));
        let mut opening =
            Opening::start((answer, tracing::Span::none()), &h.registry, &policy, &counters, &share);
        assert!(matches!(&opening.tail, Tail::Waiting { messages, .. } if messages.len() == 25));
        let opened = tokio::time::timeout(DEADLINE, opening.finish()).await.expect("opened in time");
        assert_eq!(
            (opened.messages.count(), opened.messages.rejected, opened.messages.repeated),
            (100, 1, 1)
        );
        let order: Vec<String> = opened
            .messages
            .opened
            .iter()
            .map(|(verified, _)| match verified {
                Ok(wire::Verified { message: Message::Card { body, .. }, .. }) => body.agent_id.clone(),
                _ => "refused".to_owned(),
            })
            .collect();
        let expected: Vec<String> = (1..100).filter(|&n| n != 90).map(|n| format!("agent-{n}")).collect();
        assert_eq!(order, expected);
        apply_opened(&h.registry, opened, &h.policy, &h.counters, &h.verdicts).await;
        assert_eq!(h.view().len(), 99);
    }

    /// A wait for an opening that is dropped after the worker opened the tail (the select took gossip)
    /// keeps the tail for the next wait.
    #[tokio::test]
    async fn a_tail_opened_before_an_interrupted_wait_is_kept() {
        let h = Harness::new();
        let publisher = Keypair::generate_ed25519();
        let from = Keypair::generate_ed25519().public().to_peer_id();
        let tail: Vec<ByteBuf> =
            (0..3).map(|n| ByteBuf::from(card_msg(&publisher, &format!("agent-{n}"), 1))).collect();
        let (gate, gated) = tokio::sync::oneshot::channel::<()>();
        let mut opening = Opening {
            from,
            fetched: Vec::new(),
            span: tracing::Span::none(),
            started: std::time::Instant::now(),
            task: tokio::task::spawn_blocking(move || {
                let _ = gated.blocking_recv();
                OpenedMessages::default()
            }),
            tail: Tail::Waiting {
                messages: tail,
                snapshot: h.registry.snapshot(),
                policy: Arc::new(h.policy.clone()),
                counters: Arc::new(Counters::default()),
            },
        };
        let interrupted = tokio::time::timeout(std::time::Duration::from_millis(20), opening.finish()).await;
        assert!(interrupted.is_err(), "the head is still being opened");
        assert!(matches!(&opening.tail, Tail::Opened(t) if t.count() == 3));
        gate.send(()).unwrap();
        let opened = tokio::time::timeout(DEADLINE, opening.finish()).await.expect("opened in time");
        assert_eq!(opened.messages.count(), 3, "the tail opened before is in the answer");
    }

    /// Gossip taken from the queue together: every message gets its own verdict, in order, a forgery
    /// among them is rejected alone, a tombstone between two cards of one agent applies between them,
    /// and a run of cards is one view update.
    #[tokio::test]
    async fn gossip_taken_together_is_judged_message_by_message_and_applied_in_order() {
        let h = Harness::new();
        let honest = Keypair::generate_ed25519();
        let mallory = Keypair::generate_ed25519();
        let mut forged = card_msg(&mallory, "f", 1);
        let honest_id = honest.public().to_peer_id().to_bytes();
        let mallory_id = mallory.public().to_peer_id().to_bytes();
        let at = forged.windows(mallory_id.len()).position(|w| w == mallory_id.as_slice()).unwrap();
        forged[at..at + honest_id.len()].copy_from_slice(&honest_id);
        let tombstone =
            wire::seal_tombstone(&honest, &wire::TombstoneBody { agent_id: Some("t".into()), seq: 2 });
        let mut data: Vec<Vec<u8>> = (0..100).map(|i| card_msg(&honest, &format!("a{i:03}"), 1)).collect();
        data.insert(10, forged);
        data.insert(20, b"\x00garbage".to_vec());
        data.insert(30, card_msg(&honest, "t", 1));
        data.insert(31, tombstone);
        data.insert(32, card_msg(&honest, "t", 3));
        data.push(card_msg(&honest, "a000", 1));
        let messages: Vec<GossipMessage> = data
            .into_iter()
            .enumerate()
            .map(|(i, data)| GossipMessage {
                message_id: MessageId::new(&(i as u32).to_be_bytes()),
                source: mallory.public().to_peer_id(),
                data,
                heartbeat: None,
            })
            .collect();
        let before = h.registry.snapshot().generation;
        let verdicts = apply_gossip(&h.registry, &messages, &h.policy, &h.counters, &h.verdicts).await;
        assert_eq!(verdicts.len(), messages.len());
        for (i, verdict) in verdicts.iter().enumerate() {
            let expected = match i {
                10 | 20 => MessageAcceptance::Reject,
                // The same card again at the end of the batch: nothing new.
                i if i == messages.len() - 1 => MessageAcceptance::Ignore,
                _ => MessageAcceptance::Accept,
            };
            assert_eq!(*verdict, expected, "message {i}");
        }
        let view = h.view();
        assert_eq!(view.len(), 101, "100 cards and t");
        assert!(view.contains(&("t".to_owned(), 3)), "card, tombstone, newer card: applied in order");
        // The cards before the tombstone, the tombstone, the cards after it: three view updates for
        // 103 cards and a tombstone.
        assert_eq!(h.registry.snapshot().generation - before, 3);
        assert_eq!((h.rejected("bad_signature"), h.counters.get().signature_failures), (1, 1));
    }

    /// A card of a version held already is dropped before any check (by gossip after a fetch, or from a
    /// second peer), and counted as nothing new; once its record is gone (its publisher left), the same
    /// card is checked and taken again. A fetch's records are all settled once its answer is applied,
    /// those the peer no longer held included, so they may be asked of another peer at once.
    #[tokio::test]
    async fn a_card_held_already_is_dropped_unchecked_and_a_fetch_settles_every_record_it_asked_for() {
        let mut h = Harness::new();
        let publisher = Keypair::generate_ed25519();
        let relay = Keypair::generate_ed25519().public().to_peer_id();
        let a = card_msg(&publisher, "a", 1);
        let p = publisher.public().to_peer_id();
        let asked = vec![record_id(&p, "a", 1), record_id(&p, "gone", 7)];
        h.sync(relay, std::slice::from_ref(&a), asked.clone()).await;
        assert_eq!(h.view(), vec![("a".to_owned(), 1)]);
        let counts = h.counters.get();
        assert_eq!((counts.accepted, counts.ignored), (1, 0));
        match h.rx.try_recv() {
            Ok(Verdict::Settled(ids)) => {
                let ids: HashSet<RecordId> = ids.into_iter().collect();
                assert_eq!(
                    ids,
                    asked.iter().copied().collect::<HashSet<_>>(),
                    "the record that did not come too"
                );
            }
            _ => panic!("a fetch's records are settled"),
        }

        // The same card again, by sync and by gossip, and an older one: nothing new. A newer one is.
        h.sync(relay, &[a.clone(), card_msg(&publisher, "a", 0)], Vec::new()).await;
        let gossip = |data: Vec<u8>, n: u8| GossipMessage {
            message_id: MessageId::new(&[n]),
            source: relay,
            data,
            heartbeat: None,
        };
        let verdicts =
            apply_gossip(&h.registry, &[gossip(a.clone(), 1)], &h.policy, &h.counters, &h.verdicts).await;
        assert_eq!(verdicts, vec![MessageAcceptance::Ignore]);
        let counts = h.counters.get();
        assert_eq!((counts.accepted, counts.ignored), (1, 3));
        let newer = card_msg(&publisher, "a", 2);
        let verdicts =
            apply_gossip(&h.registry, &[gossip(newer.clone(), 2)], &h.policy, &h.counters, &h.verdicts).await;
        assert_eq!(verdicts, vec![MessageAcceptance::Accept]);
        assert_eq!(h.view(), vec![("a".to_owned(), 2)]);

        // The publisher leaves: its record goes. Back at the same seq, the same card is taken again.
        let leave = wire::seal_tombstone(&publisher, &wire::TombstoneBody { agent_id: None, seq: 3 });
        let verdicts =
            apply_gossip(&h.registry, &[gossip(leave, 3)], &h.policy, &h.counters, &h.verdicts).await;
        assert_eq!(verdicts, vec![MessageAcceptance::Accept]);
        assert!(h.view().is_empty());
        let back = wire::seal_heartbeat(&publisher, &HeartbeatBody { sent_at: 4, digest: 0, agents: None });
        apply_gossip(&h.registry, &[gossip(back, 4)], &h.policy, &h.counters, &h.verdicts).await;
        let verdicts =
            apply_gossip(&h.registry, &[gossip(newer, 5)], &h.policy, &h.counters, &h.verdicts).await;
        assert_eq!(verdicts, vec![MessageAcceptance::Accept], "checked and taken again");
        assert_eq!(h.view(), vec![("a".to_owned(), 2)]);
    }

    #[tokio::test]
    async fn hostile_messages_are_rejected_counted_and_change_nothing() {
        let h = Harness::new();
        let honest = Keypair::generate_ed25519();
        let mallory = Keypair::generate_ed25519();
        assert_eq!(h.gossip(&card_msg(&honest, "a", 5), &honest).await, MessageAcceptance::Accept);
        let view = h.view();

        // A forged signature: the honest publisher's name on mallory's signature.
        let mut forged = card_msg(&mallory, "a", 6);
        let honest_id = honest.public().to_peer_id().to_bytes();
        let mallory_id = mallory.public().to_peer_id().to_bytes();
        let at = forged.windows(mallory_id.len()).position(|w| w == mallory_id.as_slice()).unwrap();
        forged[at..at + honest_id.len()].copy_from_slice(&honest_id);
        assert_eq!(h.gossip(&forged, &honest).await, MessageAcceptance::Reject);
        assert_eq!((h.rejected("bad_signature"), h.counters.get().signature_failures), (1, 1));

        // Mallory's own valid envelope around the honest publisher's A2A signature (copied from its
        // card): the A2A signature must be the envelope signer's.
        let honest_card = AgentCard::from_json(
            br#"{"agent_id":"m","base_url":"http://127.0.0.1:1","skills":[{"id":"s"}]}"#,
        )
        .unwrap()
        .signed(&honest);
        let body = CardBody {
            agent_id: "m".into(),
            seq: 1,
            card: String::from_utf8(honest_card.to_json()).unwrap(),
        };
        assert_eq!(h.gossip(&wire::seal_card(&mallory, &body), &mallory).await, MessageAcceptance::Reject);
        assert_eq!((h.rejected("bad_a2a_signature"), h.counters.get().signature_failures), (1, 2));

        // A replayed older version, and the same version again, whoever relays them.
        assert_eq!(h.gossip(&card_msg(&honest, "a", 4), &mallory).await, MessageAcceptance::Ignore);
        assert_eq!(h.gossip(&card_msg(&honest, "a", 5), &honest).await, MessageAcceptance::Ignore);

        // Oversized and malformed.
        assert_eq!(
            h.gossip(&vec![0; wire::MAX_MESSAGE_BYTES + 1], &mallory).await,
            MessageAcceptance::Reject
        );
        assert_eq!(h.rejected("too_large"), 1);
        assert_eq!(h.gossip(b"\x00garbage", &mallory).await, MessageAcceptance::Reject);

        // Mallory's tombstone cannot retract the honest agent: it names mallory's own record.
        let t = wire::seal_tombstone(&mallory, &wire::TombstoneBody { agent_id: Some("a".into()), seq: 99 });
        assert_eq!(h.gossip(&t, &mallory).await, MessageAcceptance::Ignore);
        let leave = wire::seal_tombstone(&mallory, &wire::TombstoneBody { agent_id: None, seq: 99 });
        assert_eq!(h.gossip(&leave, &mallory).await, MessageAcceptance::Ignore);

        // Heartbeats for agents mallory does not own refresh nothing of the honest publisher's.
        let agents = vec![HeartbeatAgent {
            agent_id: "a".into(),
            seq: 5,
            reported: crate::registry::health::Reported::Offline,
        }];
        let hb = HeartbeatBody { sent_at: 1, digest: wire::agents_digest(&agents), agents: Some(agents) };
        h.gossip(&wire::seal_heartbeat(&mallory, &hb), &mallory).await;
        let entry = h.registry.snapshot().entries[0].clone();
        assert_eq!(
            entry.reported(),
            crate::registry::health::Reported::Ready,
            "mallory's heartbeat did not touch it"
        );
        assert_eq!(entry.last_heartbeat(0), None);

        assert_eq!(h.view(), view, "the view is unchanged");
    }

    #[tokio::test]
    async fn own_messages_reflected_back_are_ignored() {
        let me_key = Keypair::generate_ed25519();
        let h = Harness { policy: Policy::open_mesh(me_key.public().to_peer_id()), ..Harness::new() };
        assert_eq!(h.gossip(&card_msg(&me_key, "mine", 1), &me_key).await, MessageAcceptance::Ignore);
        assert!(h.view().is_empty());
    }

    #[tokio::test]
    async fn a_closed_mesh_takes_only_listed_publishers_whoever_relays_them() {
        let listed = Keypair::generate_ed25519();
        let outsider = Keypair::generate_ed25519();
        let mut h = Harness::new();
        let allowed = [listed.public().to_peer_id()].into_iter().collect();
        h.policy.allowed = Some(Arc::new(allowed));
        assert_eq!(h.gossip(&card_msg(&outsider, "x", 1), &listed).await, MessageAcceptance::Reject);
        let agents = vec![];
        let hb = HeartbeatBody { sent_at: 1, digest: wire::agents_digest(&agents), agents: Some(agents) };
        assert_eq!(h.gossip(&wire::seal_heartbeat(&outsider, &hb), &listed).await, MessageAcceptance::Reject);
        assert_eq!(h.rejected("publisher_not_allowed"), 2);
        assert_eq!(h.gossip(&card_msg(&listed, "a", 1), &outsider).await, MessageAcceptance::Accept);
        assert_eq!(h.view(), vec![("a".to_owned(), 1)]);
    }

    #[tokio::test]
    async fn a_full_view_is_counted_but_does_not_blame_the_sender() {
        let h = Harness::with_limits(crate::registry::Limits { per_publisher: 2, remote_records: 2 });
        let relay = Keypair::generate_ed25519();
        for (i, publisher) in (0..3).map(|_| Keypair::generate_ed25519()).enumerate() {
            let expected = if i < 2 { MessageAcceptance::Accept } else { MessageAcceptance::Ignore };
            assert_eq!(h.gossip(&card_msg(&publisher, &format!("a{i}"), 1), &relay).await, expected);
        }
        assert_eq!(h.rejected("view_full"), 1);
        assert_eq!(h.view().len(), 2);
    }

    #[tokio::test]
    async fn a_publisher_over_its_limit_is_ignored_and_counted_but_nobody_is_blamed() {
        let h = Harness::with_limits(crate::registry::Limits { per_publisher: 3, remote_records: 100 });
        let big = Keypair::generate_ed25519();
        for i in 0..3 {
            let msg = card_msg(&big, &format!("a{i}"), 1);
            assert_eq!(h.gossip(&msg, &big).await, MessageAcceptance::Accept);
        }
        let over = card_msg(&big, "one-too-many", 1);
        assert_eq!(h.gossip(&over, &big).await, MessageAcceptance::Ignore);
        assert_eq!(h.rejected("publisher_over_limit"), 1);
        assert_eq!(h.view().len(), 3);
    }

    /// The answer to `Heartbeats` (a newer digest-only heartbeat, then the older one that carried its
    /// list; a long list's chunks after another's): every list is installed from the answer itself and
    /// nothing is asked again. A heartbeat whose list the answer lacks is asked for, once it is all in.
    #[tokio::test]
    async fn who_is_alive_comes_with_the_lists_and_only_missing_lists_are_asked_for() {
        let (verdicts, mut rx) = mpsc::channel(16);
        let h = Harness { verdicts, ..Harness::new() };
        let relay = Keypair::generate_ed25519().public().to_peer_id();
        let agents = |n: usize| -> Vec<HeartbeatAgent> {
            (0..n)
                .map(|i| HeartbeatAgent {
                    agent_id: format!("agent-{i}"),
                    seq: 1,
                    reported: crate::registry::health::Reported::Ready,
                })
                .collect()
        };
        let (short, long, bare) =
            (Keypair::generate_ed25519(), Keypair::generate_ed25519(), Keypair::generate_ed25519());
        let short_list = agents(3);
        let short_digest = wire::agents_digest(&short_list);
        let carrier = HeartbeatBody { sent_at: 10, digest: short_digest, agents: Some(short_list) };
        let newest = HeartbeatBody { sent_at: 12, digest: short_digest, agents: None };
        let long_list = agents(wire::LIST_CHUNK_AGENTS + 1);
        let long_digest = wire::agents_digest(&long_list);
        let long_beat = HeartbeatBody { sent_at: 20, digest: long_digest, agents: None };
        let bare_beat = HeartbeatBody { sent_at: 30, digest: 99, agents: None };
        let mut answer = vec![
            wire::seal_heartbeat(&short, &newest),
            wire::seal_heartbeat(&short, &carrier),
            wire::seal_heartbeat(&long, &long_beat),
            wire::seal_heartbeat(&bare, &bare_beat),
        ];
        answer.extend(wire::seal_list_chunks(&long, &long_list, long_digest));
        h.sync(relay, &answer, Vec::new()).await;
        let mut lists_asked = Vec::new();
        while let Ok(verdict) = rx.try_recv() {
            if let Verdict::FetchList { publisher, from } = verdict {
                assert_eq!(from, relay);
                lists_asked.push(publisher);
            }
        }
        assert_eq!(lists_asked, vec![bare.public().to_peer_id()], "only the list the answer lacked");
        let held = |k: &Keypair| h.registry.signed_list(&k.public().to_peer_id()).map(|l| l.len());
        assert_eq!(held(&short), Some(1), "the older heartbeat that carried it");
        assert_eq!(held(&long), Some(2), "both chunks");
        assert_eq!(held(&bare), None);
        assert_eq!(h.rejected("bad_list") + h.rejected("incomplete_list"), 0);
    }

    /// Chunks of a long list, fetched over sync: installed once all are there, refreshing what is held
    /// and naming what is missing; chunks that contradict their digest are the publisher's fault.
    #[tokio::test]
    async fn a_long_list_is_installed_from_its_chunks() {
        let (verdicts, mut rx) = mpsc::channel(16);
        let h = Harness { verdicts, ..Harness::new() };
        let publisher = Keypair::generate_ed25519();
        let p = publisher.public().to_peer_id();
        let relay = Keypair::generate_ed25519().public().to_peer_id();
        assert_eq!(
            h.gossip(&card_msg(&publisher, "agent-0", 1), &publisher).await,
            MessageAcceptance::Accept
        );
        let agents: Vec<HeartbeatAgent> = (0..wire::LIST_CHUNK_AGENTS + 1)
            .map(|i| HeartbeatAgent {
                agent_id: format!("agent-{i}"),
                seq: 1,
                reported: crate::registry::health::Reported::Ready,
            })
            .collect();
        let digest = wire::agents_digest(&agents);
        // The digest-only heartbeat of a list this node does not hold: fetch it.
        let hb = HeartbeatBody { sent_at: 10, digest, agents: None };
        h.gossip(&wire::seal_heartbeat(&publisher, &hb), &publisher).await;
        assert!(matches!(rx.try_recv(), Ok(Verdict::FetchList { publisher: q, .. }) if q == p));
        let chunks = wire::seal_list_chunks(&publisher, &agents, digest);
        assert_eq!(chunks.len(), 2);
        // Half a list changes nothing and blames nobody.
        h.sync(relay, &chunks[..1], Vec::new()).await;
        assert!(rx.try_recv().is_err());
        assert_eq!(h.registry.signed_list(&p), None);
        // The whole list: installed, the held agent refreshed, the others pulled.
        h.sync(relay, &chunks, Vec::new()).await;
        match rx.try_recv() {
            Ok(Verdict::Fetch { ids, .. }) => assert_eq!(ids.len(), wire::LIST_CHUNK_AGENTS),
            _ => panic!("the missing agents are pulled"),
        }
        assert_eq!(h.registry.signed_list(&p).map(|l| l.len()), Some(2), "served on to others");
        let entry = h.registry.snapshot().entries[0].clone();
        assert!(entry.last_heartbeat(0).is_some());
        // Chunks whose agents do not make their digest: rejected, the relay struck.
        let lying = wire::seal_list_chunks(&publisher, &agents[1..], digest);
        h.sync(relay, &lying, Vec::new()).await;
        assert!(matches!(rx.try_recv(), Ok(Verdict::Misbehaved { rejected: 1, .. })));
        assert_eq!(h.rejected("bad_list"), 1);
    }

    /// A node catching up: a sync answer queued before a heartbeat still waits for it. Gossip is judged
    /// before the next answer is applied, so a heartbeat never waits behind a queue of answers (on a busy
    /// node that is seconds, enough for the records it keeps alive to turn `degraded`).
    #[tokio::test]
    async fn queued_gossip_is_judged_before_a_sync_answer_that_came_first() {
        let (ingest, inbox) = queues(4);
        let (carrier, publisher) = (Keypair::generate_ed25519(), Keypair::generate_ed25519());
        let card = card_msg(&publisher, "a", 1);
        let asked = record_id(&publisher.public().to_peer_id(), "a", 1);
        let fetched = vec![asked];
        let from = carrier.public().to_peer_id();
        let answer = Answer { from, messages: vec![ByteBuf::from(card)], fetched };
        assert!(ingest.answer(answer, tracing::Span::none()), "the answer is queued");
        let beat = wire::seal_heartbeat(&publisher, &HeartbeatBody { sent_at: 1, digest: 0, agents: None });
        let gossip = GossipMessage {
            message_id: MessageId::new(&[1]),
            source: from,
            data: beat,
            heartbeat: Some(std::time::Instant::now()),
        };
        assert!(ingest.gossip(gossip), "the heartbeat is queued");
        let (_dir, worker, mut rx) = start_worker(inbox, 16);
        let mut order = Vec::new();
        while order.len() < 2 {
            match next_verdict(&mut rx).await {
                Verdict::Validate { .. } => order.push("heartbeat judged"),
                Verdict::Settled(ids) => {
                    assert!(ids.contains(&asked), "the answer settles the record it was asked for");
                    order.push("answer applied");
                }
                _ => {}
            }
        }
        assert_eq!(order, ["heartbeat judged", "answer applied"]);
        drop(ingest);
        stops(worker).await;
    }
    /// A node under a steady stream of gossip still applies its sync answers: after each batch of gossip
    /// the worker takes one waiting answer, so an answer waits behind at most one batch, however much
    /// gossip keeps queueing (a catch-up would otherwise stall for as long as the mesh is busy).
    #[tokio::test]
    async fn a_queue_full_of_gossip_holds_a_sync_answer_back_for_one_batch_at_most() {
        let queued = 3 * INGEST_BATCH;
        let (ingest, inbox) = queues(queued);
        let (carrier, publisher) = (Keypair::generate_ed25519(), Keypair::generate_ed25519());
        let from = carrier.public().to_peer_id();
        for n in 0..queued {
            let body = HeartbeatBody { sent_at: n as u64 + 1, digest: 0, agents: None };
            let data = wire::seal_heartbeat(&publisher, &body);
            let message = GossipMessage {
                message_id: MessageId::new(&n.to_be_bytes()),
                source: from,
                data,
                heartbeat: Some(std::time::Instant::now()),
            };
            assert!(ingest.gossip(message), "gossip {n} is queued");
        }
        let asked = record_id(&publisher.public().to_peer_id(), "a", 1);
        let card = card_msg(&publisher, "a", 1);
        let answer = Answer { from, messages: vec![ByteBuf::from(card)], fetched: vec![asked] };
        assert!(ingest.answer(answer, tracing::Span::none()), "the answer is queued");
        let (_dir, worker, mut rx) = start_worker(inbox, queued + 16);
        let mut judged_before = 0;
        loop {
            match next_verdict(&mut rx).await {
                Verdict::Validate { .. } => judged_before += 1,
                Verdict::Settled(ids) => {
                    assert!(ids.contains(&asked), "the answer settles the record it was asked for");
                    break;
                }
                _ => {}
            }
        }
        assert!(
            judged_before <= INGEST_BATCH,
            "the answer waited for {judged_before} gossip messages of {queued} queued, more than one batch"
        );
        drop((ingest, rx));
        stops(worker).await;
    }

    /// Answers queued together are applied in the order they came, each settling what it was asked for,
    /// although the next is opened while the one before is applied (each also brings a card an answer
    /// before it brought already).
    #[tokio::test]
    async fn answers_are_applied_in_the_order_they_came() {
        let (ingest, inbox) = queues(16);
        let (carrier, publisher) = (Keypair::generate_ed25519(), Keypair::generate_ed25519());
        let from = carrier.public().to_peer_id();
        let author = publisher.public().to_peer_id();
        let ids: Vec<String> = (0..6).map(|n| format!("agent-{n}")).collect();
        for id in &ids {
            let card = card_msg(&publisher, id, 1);
            let twice = card_msg(&publisher, &ids[0], 1);
            let answer = Answer {
                from,
                messages: vec![ByteBuf::from(twice), ByteBuf::from(card)],
                fetched: vec![record_id(&author, id, 1)],
            };
            assert!(ingest.answer(answer, tracing::Span::none()), "answer for {id} is queued");
        }
        let (_dir, worker, mut rx) = start_worker(inbox, 64);
        let mut settled = Vec::new();
        while settled.len() < ids.len() {
            if let Verdict::Settled(records) = next_verdict(&mut rx).await {
                settled.push(records[0]);
            }
        }
        let expected: Vec<RecordId> = ids.iter().map(|id| record_id(&author, id, 1)).collect();
        assert_eq!(settled, expected, "settled in the order the answers came");
        drop(ingest);
        stops(worker).await;
    }

    /// The ingest worker on a fresh registry of an open mesh, taking what `inbox` holds; its verdicts
    /// come back on the receiver (room for `verdicts` of them).
    fn start_worker(
        inbox: Inbox,
        verdicts: usize,
    ) -> (tempfile::TempDir, tokio::task::JoinHandle<()>, mpsc::Receiver<Verdict>) {
        let dir = tempfile::tempdir().unwrap();
        let key = Keypair::generate_ed25519();
        let policy = Policy::open_mesh(key.public().to_peer_id());
        let limits = crate::registry::Limits::default();
        let (registry, _) =
            Registry::open_checked(dir.path(), key, Thresholds::default(), limits, false).unwrap();
        let (tx, rx) = mpsc::channel(verdicts);
        let worker = tokio::spawn(run(Arc::new(registry), inbox, tx, Arc::new(Counters::default()), policy));
        (dir, worker, rx)
    }

    async fn next_verdict(rx: &mut mpsc::Receiver<Verdict>) -> Verdict {
        tokio::time::timeout(std::time::Duration::from_secs(10), rx.recv())
            .await
            .expect("verdicts within 10 s")
            .expect("the worker runs")
    }

    /// The worker ends within 10 s once its queues are closed.
    async fn stops(worker: tokio::task::JoinHandle<()>) {
        tokio::time::timeout(std::time::Duration::from_secs(10), worker)
            .await
            .expect("the worker ends when its queues close")
            .unwrap();
    }
}
