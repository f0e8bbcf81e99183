//! The ingest worker: verifies and applies what peers send, one message at a time, and tells the event
//! loop how each gossip message fared so gossipsub forwards the good and penalises the forged.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use libp2p::gossipsub::{MessageAcceptance, MessageId};
use libp2p::identity::PeerId;
use serde_bytes::ByteBuf;
use tokio::sync::mpsc;

use super::Counters;
use crate::clock::now_millis;
use crate::registry::{Applied, Origin, Registry, RegistryError, Update};
use crate::wire::{self, Message, WireError};

/// Work for the ingest worker.
pub enum Inbound {
    /// A gossip message awaiting its verdict.
    Gossip { message_id: MessageId, source: PeerId, data: Vec<u8> },
    /// Signed messages from a sync response (any publisher's cards, or a heartbeat or the chunks that
    /// carry an agent list); `more`: the answer was cut, ask again once these are applied.
    Signed { from: PeerId, messages: Vec<ByteBuf>, more: bool },
}

/// What the worker asks of the event loop.
pub enum Verdict {
    Validate {
        message_id: MessageId,
        source: PeerId,
        acceptance: MessageAcceptance,
    },
    /// A heartbeat named cards this node lacks: pull them.
    Pull {
        from: PeerId,
        publisher: PeerId,
        agent_ids: Vec<String>,
    },
    /// A heartbeat carried the digest of an agent list this node does not hold: fetch the list.
    FetchList {
        from: PeerId,
        publisher: PeerId,
    },
    /// A cut sync answer from this peer is applied: ask for the rest.
    SyncAgain {
        peer: PeerId,
    },
    /// A sync response from this peer held messages that were refused (gossip is judged by its verdicts).
    Misbehaved {
        peer: PeerId,
        rejected: u32,
    },
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
    mut inbox: mpsc::Receiver<Inbound>,
    verdicts: mpsc::Sender<Verdict>,
    counters: Arc<Counters>,
    policy: Policy,
) {
    while let Some(item) = inbox.recv().await {
        match item {
            Inbound::Gossip { message_id, source, data } => {
                let acceptance = handle(&registry, &data, source, &policy, &counters, &verdicts).await;
                if verdicts.send(Verdict::Validate { message_id, source, acceptance }).await.is_err() {
                    return;
                }
            }
            Inbound::Signed { from, messages, more } => {
                apply_signed(&registry, messages, from, &policy, &counters, &verdicts).await;
                if more && verdicts.send(Verdict::SyncAgain { peer: from }).await.is_err() {
                    return;
                }
            }
        }
    }
}

/// Applies a sync response: the cards in one batch (one view update for thousands of cards), the
/// chunks of a long agent list together once all are there, anything else one by one. Each message is
/// opened once.
async fn apply_signed(
    registry: &Registry,
    messages: Vec<ByteBuf>,
    from: PeerId,
    policy: &Policy,
    counters: &Counters,
    verdicts: &mpsc::Sender<Verdict>,
) {
    let mut cards = Vec::with_capacity(messages.len());
    let mut chunks: HashMap<PeerId, Vec<(wire::ListChunkBody, ByteBuf)>> = HashMap::new();
    let mut rejected = 0u32;
    for message in messages {
        let Ok(verified) = open(&message, from, policy, counters) else {
            rejected += 1;
            continue;
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
                let acceptance =
                    apply_verified(registry, verified, &message, from, policy, counters, verdicts).await;
                rejected += u32::from(acceptance == MessageAcceptance::Reject);
            }
        }
    }
    if !cards.is_empty() {
        let (keys, updates): (Vec<_>, Vec<_>) = cards.into_iter().unzip();
        let results = registry.apply_many(updates, now_millis()).await;
        for ((agent_id, publisher), result) in keys.into_iter().zip(results) {
            let acceptance = tally(counters, publisher, card_applied(&agent_id, publisher, result));
            rejected += u32::from(acceptance == MessageAcceptance::Reject);
        }
    }
    for (publisher, chunks) in chunks {
        let acceptance = apply_list(registry, publisher, chunks, from, counters, verdicts);
        rejected += u32::from(acceptance == MessageAcceptance::Reject);
    }
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
    if !outcome.missing.is_empty() {
        let _ = verdicts.try_send(Verdict::Pull { from, publisher, agent_ids: outcome.missing });
    }
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

/// Opens (verifies, then decodes) a message and checks its publisher against the policy; a failure is
/// counted by reason and answered `Reject`.
fn open(
    data: &[u8],
    from: PeerId,
    policy: &Policy,
    counters: &Counters,
) -> Result<wire::Verified, MessageAcceptance> {
    let verified = wire::open(data).map_err(|error| {
        if matches!(error, WireError::BadSignature | WireError::BadA2aSignature(_)) {
            counters.update(|c| c.signature_failures += 1);
        }
        tracing::debug!(%from, %error, "rejected message");
        reject(counters, error.reason())
    })?;
    if !policy.admits(&verified.publisher) {
        tracing::debug!(%from, publisher = %verified.publisher, "rejected message of a publisher outside the allow-list");
        return Err(reject(counters, "publisher_not_allowed"));
    }
    Ok(verified)
}

/// The update a verified card makes, with the record it names.
fn card_update(
    publisher: PeerId,
    body: wire::CardBody,
    card: crate::card::AgentCard,
    sig: Vec<u8>,
) -> ((String, PeerId), Update) {
    let update = Update::Upsert { publisher, seq: body.seq, card, origin: Origin::Remote, sig };
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

/// Verifies one message and applies it. Whoever relayed it, only its own signature says who published
/// it: gossip carries no second signature (see `net`), so a relay is trusted for nothing.
async fn handle(
    registry: &Registry,
    data: &[u8],
    from: PeerId,
    policy: &Policy,
    counters: &Counters,
    verdicts: &mpsc::Sender<Verdict>,
) -> MessageAcceptance {
    match open(data, from, policy, counters) {
        Ok(verified) => apply_verified(registry, verified, data, from, policy, counters, verdicts).await,
        Err(acceptance) => acceptance,
    }
}

/// Applies a verified message (`data`: the message as received, kept when a heartbeat carries a list).
async fn apply_verified(
    registry: &Registry,
    verified: wire::Verified,
    data: &[u8],
    from: PeerId,
    policy: &Policy,
    counters: &Counters,
    verdicts: &mpsc::Sender<Verdict>,
) -> MessageAcceptance {
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
            if !outcome.missing.is_empty() {
                let _ = verdicts.try_send(Verdict::Pull { from, publisher, agent_ids: outcome.missing });
            }
            if outcome.unknown_list {
                let _ = verdicts.try_send(Verdict::FetchList { from, publisher });
            }
            // A fetched list is applied but not forwarded: it is old news to everyone else.
            Ok(changed(!outcome.replayed && !outcome.list_installed))
        }
        // Chunks answer list fetches; gossiped, they are nobody's news.
        Message::ListChunk(_) => Ok(Fate::Unchanged),
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
        _rx: mpsc::Receiver<Verdict>,
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
            let (verdicts, _rx) = mpsc::channel(16);
            Self {
                registry,
                counters: Counters::default(),
                verdicts,
                _rx,
                policy: Policy::open_mesh(me),
                _dir: dir,
            }
        }

        async fn gossip(&self, data: &[u8], relay: &Keypair) -> MessageAcceptance {
            let relay = relay.public().to_peer_id();
            handle(&self.registry, data, relay, &self.policy, &self.counters, &self.verdicts).await
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
        let messages = |c: &[Vec<u8>]| c.iter().map(|m| ByteBuf::from(m.clone())).collect::<Vec<_>>();
        apply_signed(&h.registry, messages(&chunks[..1]), relay, &h.policy, &h.counters, &h.verdicts).await;
        assert!(rx.try_recv().is_err());
        assert_eq!(h.registry.signed_list(&p), None);
        // The whole list: installed, the held agent refreshed, the others pulled.
        apply_signed(&h.registry, messages(&chunks), relay, &h.policy, &h.counters, &h.verdicts).await;
        match rx.try_recv() {
            Ok(Verdict::Pull { agent_ids, .. }) => assert_eq!(agent_ids.len(), wire::LIST_CHUNK_AGENTS),
            _ => panic!("the missing agents are pulled"),
        }
        assert_eq!(h.registry.signed_list(&p).map(|l| l.len()), Some(2), "served on to others");
        let entry = h.registry.snapshot().entries[0].clone();
        assert!(entry.last_heartbeat(0).is_some());
        // Chunks whose agents do not make their digest: rejected, the relay struck.
        let lying = wire::seal_list_chunks(&publisher, &agents[1..], digest);
        apply_signed(&h.registry, messages(&lying), relay, &h.policy, &h.counters, &h.verdicts).await;
        assert!(matches!(rx.try_recv(), Ok(Verdict::Misbehaved { rejected: 1, .. })));
        assert_eq!(h.rejected("bad_list"), 1);
    }
}
