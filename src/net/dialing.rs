//! Dialing: bootstrap addresses redialled with backoff, LAN peers found by mDNS.

use super::*;

pub(super) fn peer_of(addr: &Multiaddr) -> Option<PeerId> {
    addr.iter().find_map(|p| match p {
        Protocol::P2p(peer) => Some(peer),
        _ => None,
    })
}

pub(super) struct Bootstrap {
    pub(super) addr: Multiaddr,
    /// The PeerId the address names (`/p2p/..`), if it does.
    pub(super) peer: Option<PeerId>,
    /// For an address without one: the PeerId found there on the last connection.
    pub(super) learned: Option<PeerId>,
    /// The dial under way to an address without a PeerId.
    pub(super) pending: Option<ConnectionId>,
    pub(super) next: Instant,
    pub(super) backoff: Duration,
}

impl EventLoop {
    /// Redials every bootstrap address not connected whose backoff has passed (doubling from
    /// `REDIAL_MIN` to `REDIAL_MAX`, reset by a connection).
    pub(super) fn redial(&mut self) {
        let now = Instant::now();
        for i in 0..self.bootstrap.len() {
            let b = &self.bootstrap[i];
            let known = b.peer.or(b.learned);
            let connected = known.is_some_and(|p| self.swarm.is_connected(&p));
            // A bootstrap address is the way in: dialled while the node wants peers, never a peer it
            // agreed to part with meanwhile.
            let settled = !self.state.target().wants_peers();
            let parted = known.is_some_and(|p| self.state.target().is_parted(&p, now_millis()));
            if b.next > now || connected || settled || parted || b.pending.is_some() {
                continue;
            }
            let addr = b.addr.clone();
            let opts = match b.peer {
                Some(peer) => DialOpts::peer_id(peer)
                    .addresses(vec![addr.clone()])
                    .condition(PeerCondition::DisconnectedAndNotDialing)
                    .build(),
                // Whoever answers there now (a restarted container may have a new key).
                None => DialOpts::unknown_peer_id().address(addr.clone()).build(),
            };
            let connection = opts.connection_id();
            self.swarm.behaviour_mut().gate.own(connection);
            if let Err(error) = self.swarm.dial(opts) {
                tracing::debug!(%addr, %error, "bootstrap dial not started");
            }
            let b = &mut self.bootstrap[i];
            if b.peer.is_none() {
                b.pending = Some(connection);
            }
            b.next = now + b.backoff;
            b.backoff = (b.backoff * 2).min(REDIAL_MAX);
        }
    }

    /// Dials the LAN peers mDNS knows of that this node should dial and is not connected to: one
    /// connection per pair, so only the lower PeerId dials. Runs when mDNS finds peers and every
    /// `MDNS_QUERY_INTERVAL`, since mDNS reports a peer only once: a connection lost later (a dead one
    /// closed after failed pings) would otherwise not be made again until the record expires.
    pub(super) fn dial_lan_peers(&mut self) {
        let me = *self.swarm.local_peer_id();
        if !self.state.target().wants_peers() {
            return;
        }
        let Some(mdns) = self.swarm.behaviour().mdns.as_ref() else { return };
        let now = now_millis();
        let missing = self.state.target().bounds().low.saturating_sub(self.state.target().len());
        let due: Vec<PeerId> = mdns
            .discovered_nodes()
            .filter(|p| me < **p && !self.swarm.is_connected(p) && !self.state.is_banned(p, now))
            .filter(|p| !self.state.target().is_parted(p, now))
            .copied()
            .take(missing)
            .collect();
        for peer in due {
            // No addresses given: mDNS (and Kademlia) supply the ones they know for the peer.
            let opts = DialOpts::peer_id(peer).condition(PeerCondition::DisconnectedAndNotDialing).build();
            let _ = self.swarm.dial(opts);
        }
    }
}
