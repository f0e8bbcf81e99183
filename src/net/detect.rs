//! The failure detector's shell: feeds connection events and probe answers to
//! [`proto::membership`](crate::proto::membership) and carries out what it decides (probes, redials,
//! declarations).

use libp2p::identity::PeerId;
use libp2p::swarm::dial_opts::{DialOpts, PeerCondition};
use serde_bytes::ByteBuf;

use super::sync::{Asked, SyncRequest};
use super::EventLoop;
use crate::clock::now_millis;
use crate::proto::membership::{Action, Reach};
use crate::wire;

impl EventLoop {
    /// The last connection to `peer` closed.
    pub(super) fn on_peer_lost(&mut self, peer: PeerId) {
        let now = now_millis();
        if self.bans.is_banned(&peer, now) {
            return;
        }
        // Only a peer whose heartbeats this node follows is worth a suspicion.
        let watched = self.registry.heard_sent_at(&peer).is_some();
        let actions = self.membership.closed(peer, watched, now, &mut self.rng);
        if !actions.is_empty() {
            tracing::debug!(%peer, "peer suspected: connection closed");
        }
        self.carry_out(actions);
    }

    pub(super) fn on_detect_tick(&mut self) {
        let actions = self.membership.tick(now_millis());
        self.carry_out(actions);
    }

    pub(super) fn on_dial_failed(&mut self, peer: PeerId) {
        let actions = self.membership.dial_failed(peer);
        self.carry_out(actions);
    }

    pub(super) fn on_reach_answer(&mut self, target: PeerId, reach: Option<Reach>) {
        let actions = match reach {
            Some(reach) => self.membership.answer(target, reach),
            None => self.membership.probe_failed(target),
        };
        self.carry_out(actions);
    }

    /// This node's answer to "do you reach `target`?".
    pub(super) fn reach(&self, target: &[u8]) -> Reach {
        match PeerId::from_bytes(target) {
            Ok(target) => self.membership.reach(&target, now_millis()),
            Err(_) => Reach::Unknown,
        }
    }

    fn carry_out(&mut self, actions: Vec<Action>) {
        for action in actions {
            match action {
                Action::Probe { helper, target } => {
                    let request = SyncRequest::Reach { target: ByteBuf::from(target.to_bytes()) };
                    if !self.send_sync(helper, request, Asked::Reach(target)) {
                        let more = self.membership.probe_failed(target);
                        self.carry_out(more);
                    }
                }
                Action::Redial(peer) => {
                    let opts =
                        DialOpts::peer_id(peer).condition(PeerCondition::DisconnectedAndNotDialing).build();
                    // No address known, or a dial already under way: no evidence either way.
                    if let Err(error) = self.swarm.dial(opts) {
                        tracing::debug!(%peer, %error, "suspect not redialled");
                    }
                }
                Action::Declare(target) => self.declare(target),
            }
        }
    }

    /// Announces that `target` is down, and applies it here first.
    fn declare(&mut self, target: PeerId) {
        let last_seen = self.registry.heard_sent_at(&target).unwrap_or(0);
        tracing::info!(%target, last_seen, "peer declared down: connection closed, confirmed by peers");
        self.counters.update(|c| c.peers_declared_down += 1);
        self.registry.remote_down(target, last_seen);
        let msg = wire::seal_down(&self.keypair, &target, last_seen);
        self.publish(&self.heartbeats.clone(), msg);
    }
}
