//! The swarm: transport (TCP, a closed mesh's pre-shared key, noise, yamux, DNS) and the behaviours
//! (gossipsub with peer scoring, Kademlia, mDNS, identify, ping, the sync protocol) with their settings.

use super::*;

#[derive(NetworkBehaviour)]
pub(super) struct Behaviour {
    /// Lets discovery's own dials out only while the node wants peers (the connection target).
    pub(super) gate: super::gate::Gate,
    /// Refuses connections past the node's bounds before the others see them.
    pub(super) limits: connection_limits::Behaviour,
    pub(super) gossipsub: gossipsub::Behaviour,
    pub(super) kad: kad::Behaviour<kad::store::MemoryStore>,
    pub(super) mdns: Toggle<mdns::tokio::Behaviour>,
    pub(super) identify: identify::Behaviour,
    pub(super) ping: ping::Behaviour,
    pub(super) sync: request_response::cbor::Behaviour<SyncRequest, SyncResponse>,
}

/// SHA-256 of the data, truncated: the same on every node and every Rust version.
fn message_id(message: &gossipsub::Message) -> gossipsub::MessageId {
    let digest = sha2::Sha256::digest(&message.data);
    gossipsub::MessageId::from(digest[..20].to_vec())
}

/// Peer scoring that punishes what matters here: every message reported `Reject` (forged, oversized,
/// not first-party) costs its forwarder, quadratically, until it is graylisted. Delivery-rate penalties
/// are off, since cards are rare and a quiet topic is normal; so is the IP colocation penalty, since
/// many nodes share an address on one host or behind one NAT.
fn score_params() -> gossipsub::PeerScoreParams {
    let mut params = gossipsub::PeerScoreParams { ip_colocation_factor_weight: 0.0, ..Default::default() };
    for topic in [CARDS_TOPIC, HEARTBEATS_TOPIC] {
        let topic_params = gossipsub::TopicScoreParams {
            mesh_message_deliveries_weight: 0.0,
            mesh_failure_penalty_weight: 0.0,
            ..Default::default()
        };
        params.topics.insert(IdentTopic::new(topic).hash(), topic_params);
    }
    params
}

pub(super) fn build_swarm(keypair: &Keypair, config: &NetConfig) -> Result<Swarm<Behaviour>, NetError> {
    let err = |e: &dyn std::fmt::Display| NetError::Transport(e.to_string());
    let builder = libp2p::SwarmBuilder::with_existing_identity(keypair.clone()).with_tokio();
    let tcp_config = tcp::Config::default().nodelay(true);
    let swarm_config = |c: libp2p::swarm::Config| c.with_idle_connection_timeout(Duration::from_secs(60));
    let swarm = match config.psk {
        None => {
            let builder = builder
                .with_tcp(tcp_config, noise::Config::new, yamux::Config::default)
                .map_err(|e| err(&e))?;
            // QUIC (listen on `/ip4/../udp/../quic-v1`) is an optional feature: it builds a TLS stack
            // in C. A closed mesh has none: the network key protects TCP streams only.
            #[cfg(feature = "quic")]
            let builder = builder.with_quic();
            builder
                .with_dns()
                .map_err(|e| err(&e))?
                .with_behaviour(|key| behaviour(key, config))
                .map_err(|e| err(&e))?
                .with_swarm_config(swarm_config)
                .build()
        }
        // TCP, then the pre-shared key's encryption, then noise and yamux as usual.
        Some(psk) => builder
            .with_other_transport(|key| {
                let noise = noise::Config::new(key).map_err(|e| Box::new(e) as BoxError)?;
                Ok::<_, BoxError>(
                    tcp::tokio::Transport::new(tcp_config)
                        .and_then(move |socket, _| PnetConfig::new(psk).handshake(socket))
                        .upgrade(upgrade::Version::V1)
                        .authenticate(noise)
                        .multiplex(yamux::Config::default())
                        // A peer without the key may stall the handshake rather than fail it.
                        .timeout(HANDSHAKE_TIMEOUT),
                )
            })
            .map_err(|e| err(&e))?
            .with_dns()
            .map_err(|e| err(&e))?
            .with_behaviour(|key| behaviour(key, config))
            .map_err(|e| err(&e))?
            .with_swarm_config(swarm_config)
            .build(),
    };
    Ok(swarm)
}

fn behaviour(
    key: &Keypair,
    config: &NetConfig,
) -> Result<Behaviour, Box<dyn std::error::Error + Send + Sync>> {
    let peer_id = key.public().to_peer_id();
    let gossip_config = gossipsub::ConfigBuilder::default()
        .heartbeat_interval(GOSSIP_HEARTBEAT)
        .mesh_n(MESH_N)
        .mesh_n_low(MESH_N_LOW)
        .mesh_n_high(MESH_N_HIGH)
        // Our own messages go to the mesh like any other, not to every connected peer: a
        // bootstrap node connected to the whole mesh would otherwise send each of its heartbeats
        // to everyone.
        .flood_publish(false)
        .gossip_lazy(GOSSIP_LAZY)
        .gossip_factor(GOSSIP_FACTOR)
        .history_gossip(GOSSIP_HISTORY)
        // Every message carries its publisher's own signature (`wire`), verified by the application
        // before anything is used, so gossipsub's second signature, author and seqno (about 120 bytes
        // of every copy of every heartbeat) buy nothing: messages are anonymous and content-addressed.
        .validation_mode(ValidationMode::Anonymous)
        .validate_messages()
        .message_id_fn(message_id)
        .max_transmit_size(MAX_MESSAGE_BYTES + 4096)
        .build()
        .map_err(|e| e.to_string())?;
    let mut gossipsub = gossipsub::Behaviour::new(MessageAuthenticity::Anonymous, gossip_config)?;
    gossipsub.with_peer_score(score_params(), gossipsub::PeerScoreThresholds::default())?;
    let mut kad_config = kad::Config::new(StreamProtocol::new(KAD_PROTOCOL));
    kad_config.set_periodic_bootstrap_interval(Some(KAD_REFRESH_INTERVAL));
    let mut kad = kad::Behaviour::with_config(peer_id, kad::store::MemoryStore::new(peer_id), kad_config);
    // On a LAN or a docker network nothing confirms an external address: stay a server.
    kad.set_mode(Some(kad::Mode::Server));
    let mdns = if config.mdns {
        let mdns_config = mdns::Config { query_interval: MDNS_QUERY_INTERVAL, ..Default::default() };
        Some(mdns::tokio::Behaviour::new(mdns_config, peer_id)?)
    } else {
        None
    };
    let identify =
        identify::Behaviour::new(identify::Config::new(IDENTIFY_PROTOCOL.to_owned(), key.public()));
    let ping_config = ping::Config::new().with_interval(PING_INTERVAL).with_timeout(PING_TIMEOUT);
    let codec = request_response::cbor::codec::Codec::default()
        .set_request_size_maximum(MAX_SYNC_REQUEST_BYTES)
        .set_response_size_maximum(MAX_SYNC_RESPONSE_BYTES);
    let sync = request_response::Behaviour::with_codec(
        codec,
        [(StreamProtocol::new(sync::PROTOCOL), ProtocolSupport::Full)],
        request_response::Config::default().with_request_timeout(Duration::from_secs(30)),
    );
    let limits = connection_limits::ConnectionLimits::default()
        .with_max_established(Some(config.max_connections))
        .with_max_pending_incoming(Some(MAX_PENDING_INCOMING))
        .with_max_established_per_peer(Some(MAX_CONNECTIONS_PER_PEER));
    Ok(Behaviour {
        gate: super::gate::Gate::new(),
        limits: connection_limits::Behaviour::new(limits),
        gossipsub,
        kad,
        mdns: mdns.into(),
        identify,
        ping: ping::Behaviour::new(ping_config),
        sync,
    })
}

/// The IP a multiaddr starts with (`/ip4/..` or `/ip6/..`), if it starts with one.
pub(super) fn ip_of(addr: &Multiaddr) -> Option<std::net::IpAddr> {
    match addr.iter().next()? {
        Protocol::Ip4(ip) => Some(ip.into()),
        Protocol::Ip6(ip) => Some(ip.into()),
        _ => None,
    }
}

/// The TCP socket address a listen multiaddr binds (`/ip4|ip6/<ip>/tcp/<port>`, port not 0), if any.
pub(super) fn fixed_tcp_port(addr: &Multiaddr) -> Option<std::net::SocketAddr> {
    let ip = ip_of(addr)?;
    let mut parts = addr.iter().skip(1);
    match (parts.next()?, parts.next()) {
        (Protocol::Tcp(port), None) if port != 0 => Some((ip, port).into()),
        _ => None,
    }
}

/// libp2p's TCP transport marks its listening sockets `SO_REUSEPORT`, so a second node of the same
/// user binds a port a running node already listens on without an error, and the kernel then hands
/// each incoming connection to one of the two at random: bootstrap dials reach the wrong PeerId half
/// the time. A plain bind (no `SO_REUSEPORT`) first turns that into an error at start. The probe is
/// closed before libp2p binds; a node starting in that same instant is not caught.
pub(super) fn ensure_port_free(addr: &Multiaddr) -> Result<(), NetError> {
    let Some(socket) = fixed_tcp_port(addr) else { return Ok(()) };
    std::net::TcpListener::bind(socket)
        .map(drop)
        .map_err(|e| NetError::Listen { addr: addr.clone(), reason: e.to_string() })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addr(s: &str) -> Multiaddr {
        s.parse().unwrap()
    }

    #[test]
    fn only_fixed_tcp_ports_are_probed() {
        assert_eq!(fixed_tcp_port(&addr("/ip4/127.0.0.1/tcp/4001")), Some(([127, 0, 0, 1], 4001).into()));
        assert_eq!(fixed_tcp_port(&addr("/ip6/::1/tcp/4001")).map(|s| s.port()), Some(4001));
        assert_eq!(fixed_tcp_port(&addr("/ip4/127.0.0.1/tcp/0")), None);
        assert_eq!(fixed_tcp_port(&addr("/ip4/127.0.0.1/udp/4001/quic-v1")), None);
        assert_eq!(fixed_tcp_port(&addr("/ip4/127.0.0.1/tcp/4001/ws")), None);
        assert_eq!(fixed_tcp_port(&addr("/dns4/localhost/tcp/4001")), None);
    }

    #[test]
    fn a_port_someone_listens_on_is_refused_naming_the_address() {
        let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = taken.local_addr().unwrap().port();
        let e = ensure_port_free(&addr(&format!("/ip4/127.0.0.1/tcp/{port}"))).unwrap_err();
        assert!(e.to_string().starts_with(&format!("cannot listen on /ip4/127.0.0.1/tcp/{port}: ")), "{e}");
        drop(taken);
        ensure_port_free(&addr(&format!("/ip4/127.0.0.1/tcp/{port}"))).unwrap();
    }
}
