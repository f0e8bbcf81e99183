//! The ingest worker: verifies and applies what peers send, one message at a time, and tells the event
//! loop how each gossip message fared so gossipsub forwards the good and penalises the forged.

use std::collections::HashSet;
use std::sync::Arc;

use libp2p::gossipsub::{MessageAcceptance, MessageId};
use libp2p::identity::PeerId;
use serde_bytes::ByteBuf;
use tokio::sync::mpsc;

use super::Counters;
use crate::api::now_millis;
use crate::registry::remote::Limit;
use crate::registry::{Applied, Origin, Registry, RegistryError, Update};
use crate::wire::{self, Message, WireError};

/// Work for the ingest worker.
pub enum Inbound {
    /// A gossip message awaiting its verdict.
    Gossip { message_id: MessageId, source: PeerId, data: Vec<u8> },
    /// Signed messages from a sync response (any publisher's cards, or a heartbeat with its agent list).
    Signed { from: PeerId, messages: Vec<ByteBuf> },
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
    /// Refused for this reason (counted): penalise whoever sent it.
    Refused(&'static str),
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
            Inbound::Signed { from, messages } => {
                apply_signed(&registry, messages, from, &policy, &counters, &verdicts).await;
            }
        }
    }
}

/// Applies a sync response: the cards in one batch (one view update for thousands of cards), anything
/// else one by one. Each message is opened once.
async fn apply_signed(
    registry: &Registry,
    messages: Vec<ByteBuf>,
    from: PeerId,
    policy: &Policy,
    counters: &Counters,
    verdicts: &mpsc::Sender<Verdict>,
) {
    let mut cards = Vec::with_capacity(messages.len());
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
    if rejected > 0 {
        let _ = verdicts.try_send(Verdict::Misbehaved { peer: from, rejected });
    }
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
            match limit {
                // Every node has the same per-publisher limit: whoever sends more is at fault.
                Limit::Publisher => Fate::Refused(limit.reason()),
                // A full view is this node's state, not the sender's doing.
                Limit::View => Fate::NotTaken(limit.reason()),
            }
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
        Ok(Fate::Refused(reason)) => reject(counters, reason),
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
            let dir = tempfile::tempdir().unwrap();
            let key = Keypair::generate_ed25519();
            let me = key.public().to_peer_id();
            let (registry, _) = Registry::open(dir.path(), key, Thresholds::default()).unwrap();
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
        let h = Harness::new();
        h.registry.limit_remote_records(2);
        let relay = Keypair::generate_ed25519();
        for (i, publisher) in (0..3).map(|_| Keypair::generate_ed25519()).enumerate() {
            let expected = if i < 2 { MessageAcceptance::Accept } else { MessageAcceptance::Ignore };
            assert_eq!(h.gossip(&card_msg(&publisher, &format!("a{i}"), 1), &relay).await, expected);
        }
        assert_eq!(h.rejected("view_full"), 1);
        assert_eq!(h.view().len(), 2);
    }

    #[tokio::test]
    async fn a_publisher_over_its_limit_is_rejected_not_ignored() {
        let h = Harness::new();
        let flooder = Keypair::generate_ed25519();
        for i in 0..wire::MAX_AGENTS_PER_PUBLISHER {
            assert_eq!(
                h.gossip(&card_msg(&flooder, &format!("a{i}"), 1), &flooder).await,
                MessageAcceptance::Accept
            );
        }
        let over = card_msg(&flooder, "one-too-many", 1);
        assert_eq!(h.gossip(&over, &flooder).await, MessageAcceptance::Reject);
        assert_eq!(h.rejected("publisher_over_limit"), 1);
        assert_eq!(h.view().len(), wire::MAX_AGENTS_PER_PUBLISHER);
    }
}
