//! The ingest worker: verifies and applies what peers send, one message at a time, and tells the event
//! loop how each gossip message fared so gossipsub forwards the good and penalises the forged.

use std::sync::Arc;

use libp2p::gossipsub::{MessageAcceptance, MessageId};
use libp2p::identity::PeerId;
use serde_bytes::ByteBuf;
use tokio::sync::mpsc;

use super::Counters;
use crate::api::now_millis;
use crate::registry::{Applied, Origin, Registry, Update};
use crate::wire::{self, Message, WireError};

/// Work for the ingest worker.
pub enum Inbound {
    /// A gossip message awaiting its verdict.
    Gossip { message_id: MessageId, source: PeerId, author: Option<PeerId>, data: Vec<u8> },
    /// Card messages from a sync response (any publisher's; each carries its own signature).
    Cards { from: PeerId, cards: Vec<ByteBuf> },
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
}

pub async fn run(
    registry: Arc<Registry>,
    mut inbox: mpsc::Receiver<Inbound>,
    verdicts: mpsc::Sender<Verdict>,
    counters: Arc<Counters>,
    me: PeerId,
) {
    while let Some(item) = inbox.recv().await {
        match item {
            Inbound::Gossip { message_id, source, author, data } => {
                let acceptance = handle(&registry, &data, author, source, me, &counters, &verdicts).await;
                if verdicts.send(Verdict::Validate { message_id, source, acceptance }).await.is_err() {
                    return;
                }
            }
            Inbound::Cards { from, cards } => {
                for card in cards {
                    handle(&registry, &card, None, from, me, &counters, &verdicts).await;
                }
            }
        }
    }
}

fn reject(counters: &Counters, reason: &'static str) -> MessageAcceptance {
    counters.update(|c| *c.rejected.entry(reason).or_default() += 1);
    MessageAcceptance::Reject
}

/// Verifies one message and applies it. `author` is the gossip author (signed by gossipsub) for gossip,
/// `None` for sync, where third parties' cards are relayed on purpose.
async fn handle(
    registry: &Registry,
    data: &[u8],
    author: Option<PeerId>,
    from: PeerId,
    me: PeerId,
    counters: &Counters,
    verdicts: &mpsc::Sender<Verdict>,
) -> MessageAcceptance {
    let verified = match wire::open(data) {
        Ok(v) => v,
        Err(error) => {
            if error == WireError::BadSignature {
                counters.update(|c| c.signature_failures += 1);
            }
            tracing::debug!(%from, %error, "rejected message");
            return reject(counters, error.reason());
        }
    };
    let publisher = verified.publisher;
    if publisher == me {
        return MessageAcceptance::Ignore;
    }
    // Gossip carries first-party messages only: a node may not gossip another's records as its own.
    if author.is_some_and(|a| a != publisher) {
        return reject(counters, "not_first_party");
    }
    let now = now_millis();
    let outcome = match verified.message {
        Message::Card { body, card } => {
            let update = Update::Upsert {
                publisher,
                seq: body.seq,
                card: *card,
                origin: Origin::Remote,
                sig: verified.sig,
            };
            registry
                .apply(update, now)
                .await
                .map(|applied| matches!(applied, Applied::Created { .. } | Applied::Updated { .. }))
        }
        Message::Tombstone(t) => match t.agent_id {
            Some(agent_id) => registry
                .apply(Update::Remove { publisher, agent_id, seq: t.seq }, now)
                .await
                .map(|applied| matches!(applied, Applied::Removed { .. })),
            None => registry.remove_publisher(publisher, t.seq, now).await.map(|n| n > 0),
        },
        Message::Heartbeat(body) => {
            let outcome = registry.remote_heartbeat(publisher, &body, now);
            if !outcome.missing.is_empty() {
                let _ = verdicts.try_send(Verdict::Pull { from, publisher, agent_ids: outcome.missing });
            }
            Ok(!outcome.replayed)
        }
    };
    match outcome {
        Ok(true) => {
            counters.update(|c| c.accepted += 1);
            MessageAcceptance::Accept
        }
        Ok(false) => {
            counters.update(|c| c.ignored += 1);
            MessageAcceptance::Ignore
        }
        Err(error) => {
            tracing::warn!(%publisher, %error, "could not store a verified message");
            counters.update(|c| c.ignored += 1);
            MessageAcceptance::Ignore
        }
    }
}
