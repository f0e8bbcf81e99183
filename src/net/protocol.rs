//! The shell around the protocol state ([`crate::proto::state`]): feeds it what happened and carries
//! out what it decides (questions over the sync protocol, redials, bans, declarations).

use std::collections::BTreeSet;

use libp2p::identity::PeerId;
use libp2p::swarm::dial_opts::{DialOpts, PeerCondition};
use libp2p::swarm::DialError;

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
        // Discovery dials only while the node wants peers.
        let open = self.state.target().wants_peers();
        self.swarm.behaviour_mut().gate.set_open(open);
    }

    /// At each of the protocol state's ticks (`State::next_tick`): suspicions, lapsed claims and bans,
    /// and the connection target, which never asks a bootstrap peer to part, and a gossip mesh peer
    /// only when no other is left.
    pub(super) fn on_detect_tick(&mut self) {
        let mesh: BTreeSet<PeerId> = self.swarm.behaviour().gossipsub.all_mesh_peers().copied().collect();
        let bootstrap = self.bootstrap.iter().filter_map(|b| b.peer.or(b.learned)).collect();
        self.state.keep(bootstrap, mesh);
        self.handle(Event::Tick);
    }

    /// Dials `peer` for the protocol (a suspect, the connection target): through the dial gate
    /// whatever the connection count.
    fn dial(&mut self, peer: PeerId) -> Result<(), DialError> {
        let opts = DialOpts::peer_id(peer).condition(PeerCondition::DisconnectedAndNotDialing).build();
        self.swarm.behaviour_mut().gate.own(opts.connection_id());
        self.swarm.dial(opts)
    }

    /// The last connection to `peer` closed; `silent`: this node closed it because its pings failed.
    pub(super) fn on_peer_lost(&mut self, peer: PeerId, silent: bool) {
        // Only a peer whose heartbeats this node follows is worth a suspicion.
        let watched = self.registry.heard_sent_at(&peer).is_some();
        self.handle(Event::Closed { peer, watched, silent });
    }

    fn carry_out(&mut self, actions: Vec<Action>) {
        for action in actions {
            match action {
                Action::Send { peer, id, request } => self.send_sync(peer, id, request),
                Action::Redial(peer) => {
                    tracing::debug!(%peer, "peer suspected: connection closed; redialling");
                    // No address known, or a dial already under way: no evidence either way.
                    if let Err(error) = self.dial(peer) {
                        tracing::debug!(%peer, %error, "suspect not redialled");
                    }
                }
                Action::Dial(peer) => {
                    tracing::debug!(%peer, connected = self.state.target().len(), "dialling for the connection target");
                    if let Err(error) = self.dial(peer) {
                        tracing::debug!(%peer, %error, "dial for the connection target not started");
                        self.state.dial_not_started(peer);
                    }
                }
                Action::Disconnect(peer) => {
                    tracing::debug!(%peer, connected = self.state.target().len(), "parting: over the connection target");
                    self.counters.update(|c| c.peers_parted += 1);
                    let _ = self.swarm.disconnect_peer_id(peer);
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
