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
}

use std::sync::Arc;

use libp2p::identity::PeerId;
use libp2p::request_response::OutboundRequestId;

use super::ingest::Inbound;
use super::EventLoop;
use crate::clock::now_millis;
use crate::defaults::{FETCH_BATCH, MAX_SYNC_IN_FLIGHT};
use crate::proto::membership::Reach;
use crate::proto::reconcile::{Index, RecordId};

/// What a sync request in flight was for.
pub(super) enum Asked {
    Reconcile,
    Fetch(Vec<RecordId>),
    List,
    Reach(PeerId),
}

impl EventLoop {
    /// The reconciliation index of the view as it is now, rebuilt only when the view changed.
    fn index(&mut self) -> Arc<Index> {
        let snapshot = self.registry.snapshot();
        match &self.index {
            Some((generation, index)) if *generation == snapshot.generation => index.clone(),
            _ => {
                let records =
                    snapshot.entries.iter().map(|e| (e.key.publisher, e.key.agent_id.clone(), e.seq));
                let index = Arc::new(Index::build(records));
                self.index = Some((snapshot.generation, index.clone()));
                index
            }
        }
    }

    /// Sends a sync request unless `MAX_SYNC_IN_FLIGHT` are already awaiting answers (the work is
    /// then picked up again by the next heartbeat or sync round); false if not sent.
    pub(super) fn send_sync(&mut self, peer: PeerId, request: SyncRequest, asked: Asked) -> bool {
        if self.sync_in_flight.len() >= MAX_SYNC_IN_FLIGHT {
            tracing::debug!(%peer, "sync request not sent: too many in flight");
            return false;
        }
        let id = self.swarm.behaviour_mut().sync.send_request(&peer, request);
        self.sync_in_flight.insert(id, asked);
        true
    }

    /// Starts an anti-entropy round with `peer`: reconciliation first, then fetches of what it showed.
    pub(super) fn request_sync(&mut self, peer: PeerId) {
        match self.index().initiate() {
            Ok(frame) => {
                self.send_sync(peer, SyncRequest::Reconcile(frame.into()), Asked::Reconcile);
            }
            Err(error) => tracing::warn!(%error, "cannot start a reconciliation"),
        }
    }

    /// Asks `peer` for the records `ids` names that nobody is fetching yet, in pipelined requests.
    pub(super) fn fetch(&mut self, peer: PeerId, ids: Vec<RecordId>) {
        let now = now_millis();
        for batch in self.fetches.claim(ids, now) {
            let request = SyncRequest::Fetch(batch.iter().map(|id| id.to_vec().into()).collect());
            if !self.send_sync(peer, request, Asked::Fetch(batch.clone())) {
                // Not sent: free the claims for the next round.
                self.fetches.failed(&batch);
            }
        }
    }

    pub(super) fn on_sync_response(
        &mut self,
        peer: PeerId,
        request_id: OutboundRequestId,
        response: SyncResponse,
    ) {
        let asked = self.sync_in_flight.remove(&request_id);
        self.counters.update(|c| {
            c.sync_rounds += 1;
            c.last_sync_ms = Some(now_millis());
        });
        if let Some(Asked::Fetch(ids)) = &asked {
            self.fetches.answered(ids, now_millis());
        }
        if let Some(Asked::Reach(target)) = asked {
            self.on_reach_answer(target, Some(Reach::from_u8(response.reach.unwrap_or(0))));
            return;
        }
        if let (Some(Asked::Reconcile), Some(frame)) = (&asked, response.frame) {
            match self.index().step(&frame) {
                Ok(step) => {
                    if let Some(next) = step.next {
                        self.send_sync(peer, SyncRequest::Reconcile(next.into()), Asked::Reconcile);
                    }
                    if !step.need.is_empty() {
                        tracing::debug!(%peer, need = step.need.len(), have = step.have, "reconciled");
                        self.fetch(peer, step.need);
                    }
                }
                Err(error) => tracing::debug!(%peer, %error, "reconciliation frame refused"),
            }
        }
        if !response.cards.is_empty() {
            let inbound = Inbound::Signed { from: peer, messages: response.cards };
            if self.ingest.try_send(inbound).is_err() {
                tracing::debug!(%peer, "ingest queue full; sync response dropped, next round retries");
            }
        }
    }

    pub(super) fn on_sync_failure(
        &mut self,
        peer: PeerId,
        request_id: OutboundRequestId,
        error: &dyn std::fmt::Display,
    ) {
        match self.sync_in_flight.remove(&request_id) {
            Some(Asked::Fetch(ids)) => self.fetches.failed(&ids),
            Some(Asked::Reach(target)) => self.on_reach_answer(target, None),
            _ => {}
        }
        tracing::debug!(%peer, %error, "sync request failed");
    }

    /// Answers a peer's sync request from the view as it is now.
    pub(super) fn answer(&mut self, request: SyncRequest) -> SyncResponse {
        match request {
            SyncRequest::Reconcile(frame) => {
                let frame = match self.index().respond(&frame) {
                    Ok(reply) => Some(reply.into()),
                    Err(error) => {
                        tracing::debug!(%error, "reconciliation frame refused");
                        None
                    }
                };
                SyncResponse { cards: Vec::new(), frame, reach: None }
            }
            SyncRequest::Fetch(ids) => {
                let index = self.index();
                let snapshot = self.registry.snapshot();
                let cards = ids
                    .iter()
                    .take(FETCH_BATCH)
                    .filter_map(|id| index.key(&RecordId::try_from(id.as_slice()).ok()?))
                    .filter_map(|(publisher, agent_id)| snapshot.get(agent_id, publisher))
                    .map(|entry| entry.signed_message().into())
                    .collect();
                SyncResponse { cards, frame: None, reach: None }
            }
            SyncRequest::List { publisher } => {
                let Ok(publisher) = PeerId::from_bytes(&publisher) else { return SyncResponse::default() };
                let mut cards: Vec<ByteBuf> = Vec::new();
                let list = if publisher == *self.swarm.local_peer_id() {
                    // This node's own newest heartbeat first: it says the node is alive now, and makes
                    // the list that follows the one of the newest digest.
                    cards.extend(self.last_heartbeat.as_ref().map(|h| h.to_vec().into()));
                    self.own_list.clone()
                } else {
                    self.registry.signed_list(&publisher)
                };
                // Every chunk of a list goes in one answer (a list is bounded: `MAX_LIST_CHUNKS`).
                for message in list.iter().flat_map(|l| l.iter()) {
                    if cards.first().is_none_or(|first| first.as_slice() != &message[..]) {
                        cards.push(message.to_vec().into());
                    }
                }
                SyncResponse { cards, frame: None, reach: None }
            }
            SyncRequest::Reach { target } => {
                SyncResponse { cards: Vec::new(), frame: None, reach: Some(self.reach(&target).to_u8()) }
            }
        }
    }
}
