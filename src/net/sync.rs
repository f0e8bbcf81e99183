//! Anti-entropy over a request-response protocol: reconcile the two record sets (range-based, see
//! [`crate::proto::reconcile`]), then fetch the missing records by id, several requests in flight.

use serde::{Deserialize, Serialize};
use serde_bytes::ByteBuf;

/// Protocol name of the sync exchange. Version 2: reconciliation frames and fetches by record id
/// (version 1 compared full digests).
pub const PROTOCOL: &str = "/agentmesh/sync/2.0.0";

#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum SyncRequest {
    /// A reconciliation frame of the requester's: answered with the next frame.
    Reconcile(ByteBuf),
    /// "Send me these records", by record id (32 bytes each, at most `FETCH_BATCH`): answered with
    /// the signed cards of those held at exactly that seq.
    Fetch(Vec<ByteBuf>),
    /// "Send me this publisher's current agent list" (a heartbeat named a digest I hold no list for):
    /// answered with the publisher's signed heartbeat that carried it, or every signed chunk of a long
    /// list, or nothing.
    List { publisher: ByteBuf },
    /// "Do you reach this peer?" (failure detection): answered with `reach`.
    Reach { target: ByteBuf },
    /// "Who is alive?": answered with the newest signed heartbeat of every remote publisher this node
    /// heard within `degraded_after` (its own comes with the `List` every connection asks for), each
    /// followed by the signed messages that carried its current agent list (bounded:
    /// `MAX_HEARTBEATS_ANSWER`, `MAX_HEARTBEATS_ANSWER_BYTES`). Only a list the answer had no room for
    /// is fetched with `List` afterwards.
    Heartbeats,
    /// "May we part?" (the connection target: the asker holds more than `peer_high` connections):
    /// answered with `parted`, true when this node agrees and will not count the close as a failure.
    Part,
}

/// Signed messages (cards, or the heartbeat or chunks that carry a list), exactly as their publishers
/// made them; or the next reconciliation frame.
#[derive(Debug, Clone, Serialize, Deserialize, Default)]
pub struct SyncResponse {
    pub cards: Vec<ByteBuf>,
    #[serde(default)]
    pub frame: Option<ByteBuf>,
    /// The answer to `Reach` (`proto::membership::Reach` as a number).
    #[serde(default)]
    pub reach: Option<u8>,
    /// The answer to `Part`.
    #[serde(default)]
    pub parted: Option<bool>,
}

use std::sync::Arc;

use libp2p::identity::PeerId;
use libp2p::request_response::OutboundRequestId;

use super::ingest::Answer;
use super::EventLoop;
use crate::clock::now_millis;
use crate::defaults::FETCH_BATCH;
use crate::proto::membership::Reach;
use crate::proto::reconcile::{Index, RecordId};
use crate::proto::records;
use crate::proto::state::{Event, Request};
use crate::registry::Snapshot;

impl SyncRequest {
    /// What is asked, for logs.
    pub fn kind(&self) -> &'static str {
        match self {
            SyncRequest::Reconcile(_) => "reconcile",
            SyncRequest::Fetch(_) => "fetch",
            SyncRequest::List { .. } => "list",
            SyncRequest::Reach { .. } => "reach",
            SyncRequest::Heartbeats => "heartbeats",
            SyncRequest::Part => "part",
        }
    }

    fn from_request(request: Request) -> Self {
        match request {
            Request::Reconcile(frame) => SyncRequest::Reconcile(frame.into()),
            Request::Fetch(ids) => SyncRequest::Fetch(ids.iter().map(|id| id.to_vec().into()).collect()),
            Request::List(publisher) => SyncRequest::List { publisher: publisher.to_bytes().into() },
            Request::Reach(target) => SyncRequest::Reach { target: target.to_bytes().into() },
            Request::Heartbeats => SyncRequest::Heartbeats,
            Request::Part => SyncRequest::Part,
        }
    }
}

impl EventLoop {
    /// The reconciliation index of the view as it is now, rebuilt (and given to the protocol state)
    /// only when the view changed, with the snapshot it was built from: the index names its records by
    /// their position in that snapshot.
    pub(super) fn index(&mut self) -> (Arc<Index>, Arc<Snapshot>) {
        let snapshot = self.registry.snapshot();
        let indexed = match &self.indexed {
            Some(indexed) if indexed.generation == snapshot.generation => indexed.clone(),
            _ => {
                let index = Arc::new(Index::of_ids(snapshot.entries.iter().map(|e| (e.seq, e.record_id))));
                self.state.handle(Event::View(index), now_millis());
                self.indexed = Some(snapshot.clone());
                snapshot
            }
        };
        (self.state.index().clone(), indexed)
    }

    /// Sends a question the protocol state decided on, remembering its number for the answer.
    pub(super) fn send_sync(&mut self, peer: PeerId, id: u64, request: Request) {
        // Asked while an answer is handled, the question is a child of that answer's span: a round
        // logs as its chain, reconcile (→ reconcile …) → fetch → the ingest of what the fetch brought.
        let span = tracing::info_span!("sync", %peer, question = id, kind = request.kind());
        let request = SyncRequest::from_request(request);
        let outbound = self.swarm.behaviour_mut().sync.send_request(&peer, request);
        self.requests.insert(outbound, (id, span));
    }

    pub(super) fn on_sync_response(
        &mut self,
        peer: PeerId,
        request_id: OutboundRequestId,
        response: SyncResponse,
    ) {
        self.counters.update(|c| {
            c.sync_rounds += 1;
            c.last_sync_ms = Some(now_millis());
        });
        let (id, span) = match self.requests.remove(&request_id) {
            Some((id, span)) => (Some(id), span),
            None => (None, tracing::info_span!("sync", %peer)),
        };
        let _entered = span.enter();
        tracing::debug!(
            records = response.cards.len(),
            frame_bytes = response.frame.as_ref().map_or(0, |f| f.len()),
            "sync answer"
        );
        // The records a fetch asked for: the ingest worker settles them all once it has applied the
        // answer (those the peer no longer held too, so that they may be asked of another at once).
        let fetched = id.and_then(|id| self.state.fetching(id)).map(<[RecordId]>::to_vec).unwrap_or_default();
        if !response.cards.is_empty() || !fetched.is_empty() {
            let answer = Answer { from: peer, messages: response.cards, fetched };
            if !self.ingest.answer(answer, span.clone()) {
                tracing::debug!(%peer, "ingest queue full; sync response dropped, next round retries");
                // As if never answered: its records are free to be asked again.
                if let Some(id) = id {
                    self.handle(Event::Failed { id });
                }
                return;
            }
        }
        if let (Some(id), Some(agreed)) = (id, response.parted) {
            self.handle(Event::PartAnswered { id, agreed });
        } else if let Some(id) = id {
            let frame = response.frame.map(|f| f.into_vec());
            let reach = response.reach.map(Reach::from_u8);
            self.handle(Event::Answered { id, frame, reach });
        }
    }

    pub(super) fn on_sync_failure(
        &mut self,
        peer: PeerId,
        request_id: OutboundRequestId,
        error: &dyn std::fmt::Display,
    ) {
        match self.requests.remove(&request_id) {
            Some((id, span)) => {
                span.in_scope(|| tracing::debug!(%error, "sync request failed"));
                self.handle(Event::Failed { id });
            }
            None => tracing::debug!(%peer, %error, "sync request failed"),
        }
    }

    /// Answers a peer's sync request from the view as it is now.
    pub(super) fn answer(&mut self, peer: PeerId, request: SyncRequest) -> SyncResponse {
        match request {
            SyncRequest::Reconcile(frame) => {
                self.index();
                let frame = self.state.respond(&frame).map(Into::into);
                SyncResponse { frame, ..SyncResponse::default() }
            }
            SyncRequest::Fetch(ids) => {
                let (index, snapshot) = self.index();
                let cards = ids
                    .iter()
                    .take(FETCH_BATCH)
                    .filter_map(|id| index.position(&RecordId::try_from(id.as_slice()).ok()?))
                    .filter_map(|at| snapshot.entries.get(at))
                    .map(|entry| entry.signed_message().into())
                    .collect();
                SyncResponse { cards, ..SyncResponse::default() }
            }
            SyncRequest::List { publisher } => {
                let Ok(publisher) = PeerId::from_bytes(&publisher) else { return SyncResponse::default() };
                // This node's own newest heartbeat first: it says the node is alive now, and makes the
                // list that follows the one of the newest digest.
                let (heartbeat, list) = if publisher == *self.swarm.local_peer_id() {
                    (self.last_heartbeat.clone(), self.own_list.clone())
                } else {
                    (None, self.registry.signed_list(&publisher))
                };
                let first = heartbeat.as_deref().unwrap_or_default();
                // Every chunk of a list goes in one answer (a list is bounded: `MAX_LIST_CHUNKS`).
                let cards: Vec<ByteBuf> = heartbeat
                    .iter()
                    .chain(list.iter().flat_map(|l| records::after(first, l)))
                    .map(|m| m.to_vec().into())
                    .collect();
                SyncResponse { cards, ..SyncResponse::default() }
            }
            SyncRequest::Heartbeats => {
                // This node's own heartbeat is not among them: the asker has its `List` already. Each
                // heartbeat is followed by what carried its list, as a `List` answer would be.
                let heartbeats = self.registry.newest_heartbeats(now_millis());
                let cards = heartbeats.iter().map(|m| m.to_vec().into()).collect();
                SyncResponse { cards, ..SyncResponse::default() }
            }
            SyncRequest::Reach { target } => {
                let reach = match PeerId::from_bytes(&target) {
                    Ok(target) => self.state.reach(&target, now_millis()),
                    Err(_) => Reach::Unknown,
                };
                SyncResponse { reach: Some(reach.to_u8()), ..SyncResponse::default() }
            }
            SyncRequest::Part => {
                let parted = self.state.part_asked(peer, now_millis());
                tracing::debug!(%peer, parted, "asked to part");
                SyncResponse { parted: Some(parted), ..SyncResponse::default() }
            }
        }
    }
}
