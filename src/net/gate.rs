//! The dial gate of the connection target: dials this node's event loop makes (bootstrap, suspects,
//! the target's own) always go out; dials other behaviours make on their own (Kademlia's lookups) go
//! out only while the node wants peers (fewer than `peer_low` connections). Without it, every lookup
//! would connect to the peers it asks, and gossipsub's long-lived streams would keep each of those
//! connections open for good: a node would end up connected to every node it ever asked.

use std::collections::HashSet;
use std::convert::Infallible;
use std::task::{Context, Poll};

use libp2p::core::transport::PortUse;
use libp2p::core::Endpoint;
use libp2p::identity::PeerId;
use libp2p::swarm::{
    dummy, ConnectionDenied, ConnectionId, FromSwarm, NetworkBehaviour, THandler, THandlerInEvent,
    THandlerOutEvent, ToSwarm,
};
use libp2p::Multiaddr;

/// Dials of the event loop's own awaiting their outcome, at most (each leaves the set when it
/// connects or fails; beyond the bound the oldest are forgotten, which only closes the gate to them).
const MAX_OWN_DIALS: usize = 1024;

/// Why a dial was not made: the node holds the connections it wants.
#[derive(Debug)]
pub(super) struct Settled;

impl std::fmt::Display for Settled {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("the node holds the connections it wants (peer_low)")
    }
}

impl std::error::Error for Settled {}

pub(super) struct Gate {
    /// Dials by others are let through (fewer than `peer_low` connections).
    open: bool,
    /// Dials the event loop made, let through whatever the count.
    own: HashSet<ConnectionId>,
}

impl Gate {
    pub(super) fn new() -> Self {
        Self { open: true, own: HashSet::new() }
    }

    pub(super) fn set_open(&mut self, open: bool) {
        self.open = open;
    }

    /// The event loop dials: this dial goes out whatever the count.
    pub(super) fn own(&mut self, connection: ConnectionId) {
        if self.own.len() >= MAX_OWN_DIALS {
            self.own.clear();
        }
        self.own.insert(connection);
    }
}

impl NetworkBehaviour for Gate {
    type ConnectionHandler = dummy::ConnectionHandler;
    type ToSwarm = Infallible;

    fn handle_established_inbound_connection(
        &mut self,
        _: ConnectionId,
        _: PeerId,
        _: &Multiaddr,
        _: &Multiaddr,
    ) -> Result<THandler<Self>, ConnectionDenied> {
        Ok(dummy::ConnectionHandler)
    }

    fn handle_pending_outbound_connection(
        &mut self,
        connection: ConnectionId,
        _: Option<PeerId>,
        _: &[Multiaddr],
        _: Endpoint,
    ) -> Result<Vec<Multiaddr>, ConnectionDenied> {
        if self.open || self.own.contains(&connection) {
            Ok(Vec::new())
        } else {
            Err(ConnectionDenied::new(Settled))
        }
    }

    fn handle_established_outbound_connection(
        &mut self,
        connection: ConnectionId,
        _: PeerId,
        _: &Multiaddr,
        _: Endpoint,
        _: PortUse,
    ) -> Result<THandler<Self>, ConnectionDenied> {
        self.own.remove(&connection);
        Ok(dummy::ConnectionHandler)
    }

    fn on_swarm_event(&mut self, event: FromSwarm) {
        if let FromSwarm::DialFailure(failure) = event {
            self.own.remove(&failure.connection_id);
        }
    }

    fn on_connection_handler_event(&mut self, _: PeerId, _: ConnectionId, event: THandlerOutEvent<Self>) {
        match event {}
    }

    fn poll(&mut self, _: &mut Context<'_>) -> Poll<ToSwarm<Self::ToSwarm, THandlerInEvent<Self>>> {
        Poll::Pending
    }
}
