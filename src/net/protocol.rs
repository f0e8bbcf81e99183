//! The shell around the protocol state ([`crate::proto::state`]): feeds it what happened and carries
//! out what it decides (questions over the sync protocol, redials, bans, declarations).

use libp2p::identity::PeerId;
use libp2p::swarm::dial_opts::{DialOpts, PeerCondition};

use super::EventLoop;
use crate::clock::now_millis;
use crate::proto::bans;
use crate::proto::state::{Action, Event};
use crate::wire;

impl EventLoop {
    /// Hands `event` to the protocol state and carries out its actions.
    pub(super) fn handle(&mut self, event: Event) {
        // Reconciliation works on the view as it is now.
        let needs_index =
            matches!(event, Event::Connected(_) | Event::SyncTimer | Event::Answered { frame: Some(_), .. });
        if needs_index {
            self.index();
        }
        let actions = self.state.handle(event, now_millis());
        self.carry_out(actions);
    }

    /// The last connection to `peer` closed.
    pub(super) fn on_peer_lost(&mut self, peer: PeerId) {
        // Only a peer whose heartbeats this node follows is worth a suspicion.
        let watched = self.registry.heard_sent_at(&peer).is_some();
        self.handle(Event::Closed { peer, watched });
    }

    fn carry_out(&mut self, actions: Vec<Action>) {
        for action in actions {
            match action {
                Action::Send { peer, id, request } => self.send_sync(peer, id, request),
                Action::Redial(peer) => {
                    tracing::debug!(%peer, "peer suspected: connection closed; redialling");
                    let opts =
                        DialOpts::peer_id(peer).condition(PeerCondition::DisconnectedAndNotDialing).build();
                    // No address known, or a dial already under way: no evidence either way.
                    if let Err(error) = self.swarm.dial(opts) {
                        tracing::debug!(%peer, %error, "suspect not redialled");
                    }
                }
                Action::Declare(target) => self.declare(target),
                Action::Ban(peer) => {
                    tracing::warn!(%peer, ban_secs = bans::BAN_FOR.as_secs(), "peer banned: too many rejected messages");
                    self.counters.update(|c| c.peers_banned += 1);
                    let behaviour = self.swarm.behaviour_mut();
                    behaviour.gossipsub.blacklist_peer(&peer);
                    behaviour.kad.remove_peer(&peer);
                    let _ = self.swarm.disconnect_peer_id(peer);
                }
                Action::Unban(peer) => {
                    tracing::info!(%peer, "ban ended");
                    self.swarm.behaviour_mut().gossipsub.remove_blacklisted_peer(&peer);
                }
                Action::Refuse(peer) => {
                    tracing::debug!(%peer, "refused a connection of a banned peer");
                    let _ = self.swarm.disconnect_peer_id(peer);
                }
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
