//! The mesh: one task owns the libp2p swarm (TCP + noise + yamux, DNS; gossipsub, Kademlia, mDNS,
//! identify, ping, and a request-response sync protocol). Everyone else talks to it through a
//! [`NetHandle`] over bounded channels.
//!
//! Tasks (both in the node's supervised set):
//! - the event loop (this module): swarm events, local changes to announce, timers (heartbeat, sync,
//!   redial, Kademlia refresh), commands;
//! - the ingest worker ([`ingest`]): verifies and applies what peers send, one message at a time, and
//!   reports a gossip verdict (Accept / Reject / Ignore) for every message back to the loop.

mod detect;
pub mod ingest;
pub mod sync;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use libp2p::core::transport::Transport as _;
use libp2p::core::upgrade;
use libp2p::futures::StreamExt;
use libp2p::gossipsub::{self, IdentTopic, MessageAuthenticity, ValidationMode};
use libp2p::identity::{Keypair, PeerId};
use libp2p::multiaddr::Protocol;
use libp2p::pnet::{PnetConfig, PreSharedKey};
use libp2p::request_response::{self, ProtocolSupport};
use libp2p::swarm::behaviour::toggle::Toggle;
use libp2p::swarm::dial_opts::{DialOpts, PeerCondition};
use libp2p::swarm::{ConnectionId, NetworkBehaviour, SwarmEvent};
use libp2p::{identify, kad, mdns, noise, ping, tcp, yamux, Multiaddr, StreamProtocol, Swarm};
use serde::Serialize;
use serde_bytes::ByteBuf;
use sha2::Digest as _;
use tokio::sync::{broadcast, mpsc, oneshot};
use tokio::time::{interval, Instant, MissedTickBehavior};

use crate::clock::now_millis;
use crate::clock::rfc3339;
use crate::defaults::{
    MAX_ADDRS_PER_PEER, MAX_LIST_FETCHES, MAX_SYNC_REQUEST_BYTES, MAX_SYNC_RESPONSE_BYTES,
};
use crate::proto::bans::{self, BanList};
use crate::proto::fetch::Fetches;
use crate::proto::membership::Membership;
use crate::proto::reconcile::Index;
use crate::registry::remote::SignedList;
use crate::registry::{LocalChange, RecordKey, Registry};
use crate::tasks::Tasks;
use crate::wire::{self, HeartbeatBody, TombstoneBody, MAX_MESSAGE_BYTES};
use ingest::{Inbound, Policy, Verdict};
use sync::{SyncRequest, SyncResponse};

/// Topic of cards and tombstones.
pub const CARDS_TOPIC: &str = "agentmesh/cards/1";
/// Topic of heartbeats.
pub const HEARTBEATS_TOPIC: &str = "agentmesh/hb/1";
/// Kademlia protocol name: our own, never the IPFS DHT's.
pub const KAD_PROTOCOL: &str = "/agentmesh/kad/1.0.0";
const IDENTIFY_PROTOCOL: &str = "/agentmesh/id/1.0.0";
/// Commands queued for the event loop.
pub const COMMAND_QUEUE: usize = 64;
/// Messages queued for verification; when full, further gossip is ignored (not forwarded).
pub const INGEST_QUEUE: usize = 1024;
/// How often anti-entropy runs with one random peer (besides on every new connection).
pub const SYNC_INTERVAL: Duration = Duration::from_secs(10);
/// How often the Kademlia routing table is refreshed.
pub const KAD_REFRESH_INTERVAL: Duration = Duration::from_secs(300);
/// Backoff bounds for redialling bootstrap peers that are not connected.
pub const REDIAL_MIN: Duration = Duration::from_secs(1);
pub const REDIAL_MAX: Duration = Duration::from_secs(60);
/// How long a leaving node keeps polling the swarm so that its goodbye goes out.
pub const LEAVE_FLUSH: Duration = Duration::from_millis(300);
/// How often suspicions are checked for their timeout (failure detection).
pub const DETECT_TICK: Duration = Duration::from_millis(100);
/// How often mDNS asks the LAN who is there (libp2p's default: 5 min). Only the lower PeerId of a pair
/// dials, so a node whose first query went out before its neighbour was up must ask again soon, or the
/// pair stays apart until the next query.
pub const MDNS_QUERY_INTERVAL: Duration = Duration::from_secs(5);
/// Gossipsub mesh degree (target, low and high water marks). Lower than gossipsub's 6 / 5 / 12: every
/// message reaches each node about `MESH_N` times, and heartbeats are most of the traffic.
pub const MESH_N: usize = 4;
pub const MESH_N_LOW: usize = 3;
pub const MESH_N_HIGH: usize = 5;
/// Non-mesh peers told (IHAVE) about recent messages at each gossipsub heartbeat (gossipsub: 6)...
pub const GOSSIP_LAZY: usize = 3;
/// ...or this share of all non-mesh peers if more (gossipsub: 0.25, which on a node connected to a
/// whole 50-node mesh would tell 11 peers every second about every recent message).
pub const GOSSIP_FACTOR: f64 = 0.05;
/// Gossipsub heartbeats whose messages an IHAVE names (gossipsub: 3). Heartbeats are periodic, so
/// recovering one older than two seconds is worth less than the ids it costs on every IHAVE.
pub const GOSSIP_HISTORY: usize = 2;
/// Ping period and patience: a connection whose ping fails is closed, so a dead one (the peer's network
/// vanished without a FIN) is noticed within `PING_INTERVAL + PING_TIMEOUT` and redialled.
pub const PING_INTERVAL: Duration = Duration::from_secs(10);
pub const PING_TIMEOUT: Duration = Duration::from_secs(10);
/// Gossipsub heartbeat (mesh maintenance, gossip emission): its default; a faster one multiplies the
/// IHAVE control traffic.
pub const GOSSIP_HEARTBEAT: Duration = Duration::from_secs(1);

/// How long a connection may take to be set up (network key, noise, yamux) before it is dropped.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Debug, thiserror::Error)]
pub enum NetError {
    #[error("cannot build the libp2p transport: {0}")]
    Transport(String),
    #[error("cannot listen on {addr}: {reason}")]
    Listen { addr: Multiaddr, reason: String },
    #[error("the mesh task has stopped")]
    Stopped,
}

/// Settings of the mesh.
#[derive(Debug, Clone)]
pub struct NetConfig {
    pub listen: Vec<Multiaddr>,
    pub bootstrap: Vec<Multiaddr>,
    pub mdns: bool,
    pub heartbeat_interval: Duration,
    /// A closed mesh's pre-shared key: every connection is encrypted with it before anything else,
    /// so peers without it cannot connect at all. (Its `Debug` shows only a fingerprint.)
    pub psk: Option<PreSharedKey>,
    /// A closed mesh's publishers: messages signed by anyone else are refused. `None`: anyone.
    pub allowed_publishers: Option<Arc<HashSet<PeerId>>>,
}

#[derive(NetworkBehaviour)]
struct Behaviour {
    gossipsub: gossipsub::Behaviour,
    kad: kad::Behaviour<kad::store::MemoryStore>,
    mdns: Toggle<mdns::tokio::Behaviour>,
    identify: identify::Behaviour,
    ping: ping::Behaviour,
    sync: request_response::cbor::Behaviour<SyncRequest, SyncResponse>,
}

/// Counters shared by the loop, the ingest worker and status.
#[derive(Default)]
pub struct Counters {
    inner: std::sync::Mutex<CounterState>,
}

#[derive(Debug, Default, Clone, Serialize)]
pub struct CounterState {
    pub messages_in: u64,
    pub messages_out: u64,
    pub accepted: u64,
    pub ignored: u64,
    /// Gossip dropped unread because the verification queue (`INGEST_QUEUE`) was full: not
    /// forwarded, and recovered by anti-entropy if it mattered.
    pub dropped_overload: u64,
    /// Rejections by reason (`bad_signature`, `too_large`, `malformed`, `publisher_over_limit`,
    /// `publisher_not_allowed`, `view_full`, …).
    pub rejected: BTreeMap<&'static str, u64>,
    pub signature_failures: u64,
    /// Peers disconnected and refused for sending too many rejected messages (`proto::bans`).
    pub peers_banned: u64,
    /// Connections that failed before being established (wrong network key, unreachable, refused).
    pub connection_errors: u64,
    /// Peers this node declared down (connection closed, confirmed by peers it asked).
    pub peers_declared_down: u64,
    pub sync_rounds: u64,
    pub last_sync_ms: Option<u64>,
}

impl Counters {
    pub fn update(&self, f: impl FnOnce(&mut CounterState)) {
        f(&mut self.inner.lock().unwrap_or_else(|p| p.into_inner()));
    }

    pub fn get(&self) -> CounterState {
        self.inner.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

/// `GET /api/v1/mesh/status`.
#[derive(Debug, Clone, Serialize)]
pub struct Status {
    pub peer_id: String,
    pub listen_addrs: Vec<String>,
    pub connected_peers: usize,
    /// Gossip mesh peers per topic.
    pub mesh_peers: BTreeMap<String, usize>,
    pub routing_table_size: usize,
    /// Peers refused right now for misbehaving.
    pub banned_peers: usize,
    /// Whether this node only talks to peers holding the network key.
    pub closed_mesh: bool,
    pub records: BTreeMap<&'static str, usize>,
    /// The bounded mesh state besides the records (see SECURITY.md).
    pub mesh_state: MeshState,
    pub last_sync: Option<String>,
    #[serde(flatten)]
    pub counters: CounterState,
}

/// Publishers tracked (`MAX_TRACKED_PUBLISHERS`), agent-list entries held (`LIST_ENTRIES_PER_RECORD` per remote record) and
/// tombstones held (`MAX_TOMBSTONES`), plus the limits records are admitted by.
#[derive(Debug, Clone, Serialize)]
pub struct MeshState {
    pub publishers: usize,
    pub list_entries: usize,
    pub tombstones: usize,
    pub max_agents_per_publisher: usize,
    pub max_remote_records: usize,
}

/// One connected peer, for `GET /api/v1/mesh/peers`.
#[derive(Debug, Clone, Serialize)]
pub struct PeerInfo {
    pub peer_id: String,
    pub addresses: Vec<String>,
    pub rtt_ms: Option<f64>,
}

enum Command {
    Status(oneshot::Sender<Status>),
    Peers(oneshot::Sender<Vec<PeerInfo>>),
    Leave(oneshot::Sender<()>),
}

/// Talks to the mesh task. Cheap to clone.
#[derive(Clone)]
pub struct NetHandle {
    tx: mpsc::Sender<Command>,
    peer_id: PeerId,
}

impl NetHandle {
    pub fn peer_id(&self) -> PeerId {
        self.peer_id
    }

    async fn ask<T>(&self, make: impl FnOnce(oneshot::Sender<T>) -> Command) -> Result<T, NetError> {
        let (tx, rx) = oneshot::channel();
        self.tx.send(make(tx)).await.map_err(|_| NetError::Stopped)?;
        rx.await.map_err(|_| NetError::Stopped)
    }

    pub async fn status(&self) -> Result<Status, NetError> {
        self.ask(Command::Status).await
    }

    pub async fn peers(&self) -> Result<Vec<PeerInfo>, NetError> {
        self.ask(Command::Peers).await
    }

    /// Announces that this node leaves (a tombstone for all its agents) and stops the mesh task.
    pub async fn leave(&self) -> Result<(), NetError> {
        self.ask(Command::Leave).await
    }
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

type BoxError = Box<dyn std::error::Error + Send + Sync>;

fn build_swarm(keypair: &Keypair, config: &NetConfig) -> Result<Swarm<Behaviour>, NetError> {
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
    Ok(Behaviour {
        gossipsub,
        kad,
        mdns: mdns.into(),
        identify,
        ping: ping::Behaviour::new(ping_config),
        sync,
    })
}

/// Starts the mesh: listens, subscribes, dials the bootstrap peers and spawns its two tasks into the
/// node's supervised set.
pub async fn spawn(
    config: NetConfig,
    keypair: Keypair,
    registry: Arc<Registry>,
    tasks: &mut Tasks,
) -> Result<NetHandle, NetError> {
    let mut swarm = build_swarm(&keypair, &config)?;
    for addr in &config.listen {
        swarm
            .listen_on(addr.clone())
            .map_err(|e| NetError::Listen { addr: addr.clone(), reason: e.to_string() })?;
    }
    let cards = IdentTopic::new(CARDS_TOPIC);
    let heartbeats = IdentTopic::new(HEARTBEATS_TOPIC);
    for topic in [&cards, &heartbeats] {
        swarm.behaviour_mut().gossipsub.subscribe(topic).map_err(|e| NetError::Transport(e.to_string()))?;
    }
    let peer_id = *swarm.local_peer_id();
    let (tx, commands) = mpsc::channel(COMMAND_QUEUE);
    let (ingest_tx, ingest_rx) = mpsc::channel(INGEST_QUEUE);
    let (verdict_tx, verdicts) = mpsc::channel(INGEST_QUEUE);
    let counters = Arc::new(Counters::default());
    let policy = Policy { me: peer_id, allowed: config.allowed_publishers.clone() };
    tasks.spawn_loop(
        "mesh ingest",
        ingest::run(registry.clone(), ingest_rx, verdict_tx, counters.clone(), policy),
    );
    let bootstrap = config
        .bootstrap
        .iter()
        .map(|addr| Bootstrap {
            addr: addr.clone(),
            peer: peer_of(addr),
            learned: None,
            pending: None,
            next: Instant::now(),
            backoff: REDIAL_MIN,
        })
        .collect();
    let changes = registry.subscribe();
    let event_loop = EventLoop {
        swarm,
        keypair,
        registry,
        config,
        commands,
        ingest: ingest_tx,
        verdicts,
        changes,
        counters,
        bootstrap,
        cards,
        heartbeats,
        rtts: HashMap::new(),
        addrs: HashMap::new(),
        listen_addrs: Vec::new(),
        last_list: None,
        list_beats: 0,
        own_list: None,
        last_heartbeat: None,
        list_fetches: HashMap::new(),
        sync_in_flight: HashMap::new(),
        fetches: Fetches::default(),
        index: None,
        bans: BanList::default(),
        membership: Membership::default(),
        rng: rand::SeedableRng::from_os_rng(),
    };
    tasks.spawn_loop("mesh event loop", event_loop.run());
    Ok(NetHandle { tx, peer_id })
}

fn peer_of(addr: &Multiaddr) -> Option<PeerId> {
    addr.iter().find_map(|p| match p {
        Protocol::P2p(peer) => Some(peer),
        _ => None,
    })
}

struct Bootstrap {
    addr: Multiaddr,
    /// The PeerId the address names (`/p2p/..`), if it does.
    peer: Option<PeerId>,
    /// For an address without one: the PeerId found there on the last connection.
    learned: Option<PeerId>,
    /// The dial under way to an address without a PeerId.
    pending: Option<ConnectionId>,
    next: Instant,
    backoff: Duration,
}

struct EventLoop {
    swarm: Swarm<Behaviour>,
    keypair: Keypair,
    registry: Arc<Registry>,
    config: NetConfig,
    commands: mpsc::Receiver<Command>,
    ingest: mpsc::Sender<Inbound>,
    verdicts: mpsc::Receiver<Verdict>,
    changes: broadcast::Receiver<LocalChange>,
    counters: Arc<Counters>,
    bootstrap: Vec<Bootstrap>,
    cards: IdentTopic,
    heartbeats: IdentTopic,
    rtts: HashMap<PeerId, Duration>,
    addrs: HashMap<PeerId, HashSet<Multiaddr>>,
    listen_addrs: Vec<Multiaddr>,
    /// Digest of this node's agent list, and the beats that carried it so far.
    last_list: Option<u64>,
    list_beats: u32,
    /// The signed messages that carry this node's current list (the heartbeat that last carried it,
    /// or every chunk of a long one), for nodes that fetch it.
    own_list: Option<SignedList>,
    /// This node's newest heartbeat, sent first in answer to a fetch of its list.
    last_heartbeat: Option<Arc<[u8]>>,
    /// When each publisher's list may be fetched again (at most `MAX_LIST_FETCHES`).
    list_fetches: HashMap<PeerId, Instant>,
    /// Sync requests awaiting their answer, and what each asked (at most `MAX_SYNC_IN_FLIGHT`).
    sync_in_flight: HashMap<request_response::OutboundRequestId, sync::Asked>,
    /// Records being fetched, each of one peer at a time.
    fetches: Fetches,
    /// The reconciliation index and the view generation it was built from.
    index: Option<(u64, Arc<Index>)>,
    /// Strikes and bans of peers that send what verification refuses.
    bans: BanList,
    /// The failure detector, and the rng it draws helpers with.
    membership: Membership,
    rng: rand::rngs::StdRng,
}

impl EventLoop {
    async fn run(mut self) {
        let mut heartbeat = interval(self.config.heartbeat_interval);
        let mut sync = interval(SYNC_INTERVAL);
        let mut redial = interval(REDIAL_MIN);
        let mut lan_redial = interval(MDNS_QUERY_INTERVAL);
        let mut detect = interval(DETECT_TICK);
        for timer in [&mut heartbeat, &mut sync, &mut redial, &mut lan_redial, &mut detect] {
            timer.set_missed_tick_behavior(MissedTickBehavior::Delay);
        }
        loop {
            tokio::select! {
                event = self.swarm.select_next_some() => self.on_swarm_event(event),
                Some(verdict) = self.verdicts.recv() => self.on_verdict(verdict),
                change = self.changes.recv() => self.on_local_change(change),
                command = self.commands.recv() => match command {
                    Some(Command::Leave(done)) => {
                        self.leave().await;
                        let _ = done.send(());
                        return;
                    }
                    Some(command) => self.on_command(command),
                    None => return,
                },
                _ = heartbeat.tick() => self.on_heartbeat_tick(),
                _ = sync.tick() => self.sync_with_random_peer(),
                _ = redial.tick() => self.redial(),
                _ = lan_redial.tick() => self.dial_lan_peers(),
                _ = detect.tick() => self.on_detect_tick(),
            }
        }
    }

    fn publish(&mut self, topic: &IdentTopic, data: Vec<u8>) {
        match self.swarm.behaviour_mut().gossipsub.publish(topic.clone(), data) {
            Ok(_) => self.counters.update(|c| c.messages_out += 1),
            // No peer yet, or none subscribed: anti-entropy delivers it on the next connection.
            Err(error) => tracing::debug!(topic = %topic, %error, "not published"),
        }
    }

    fn on_local_change(&mut self, change: Result<LocalChange, broadcast::error::RecvError>) {
        let me = *self.swarm.local_peer_id();
        match change {
            Ok(LocalChange::Card { agent_id }) => {
                if let Some(msg) = self.registry.signed_card(&RecordKey { agent_id, publisher: me }) {
                    self.publish(&self.cards.clone(), msg);
                }
            }
            Ok(LocalChange::Removed { agent_id, seq }) => {
                let msg =
                    wire::seal_tombstone(&self.keypair, &TombstoneBody { agent_id: Some(agent_id), seq });
                self.publish(&self.cards.clone(), msg);
            }
            Err(broadcast::error::RecvError::Lagged(missed)) => {
                tracing::warn!(missed, "local change feed lagged; re-announcing every local card");
                for entry in self.registry.snapshot().entries.iter().filter(|e| e.is_local()) {
                    if let Some(msg) = self.registry.signed_card(&entry.key) {
                        self.publish(&self.cards.clone(), msg);
                    }
                }
            }
            Err(broadcast::error::RecvError::Closed) => {}
        }
    }

    fn on_heartbeat_tick(&mut self) {
        let now = now_millis();
        let agents = self.registry.local_agents(now);
        let digest = wire::agents_digest(&agents);
        if self.last_list != Some(digest) {
            self.last_list = Some(digest);
            self.list_beats = 0;
        }
        // A list longer than a chunk never rides in a heartbeat: it is signed once per change, in
        // chunks that peers fetch over sync, so a heartbeat stays small whatever the agent count.
        let inline = agents.len() <= wire::LIST_CHUNK_AGENTS;
        if !inline && self.list_beats == 0 {
            let chunks = wire::seal_list_chunks(&self.keypair, &agents, digest);
            self.own_list = Some(chunks.into_iter().map(Arc::from).collect());
        }
        let with_list = inline && self.list_beats < wire::LIST_REPEATS;
        self.list_beats = self.list_beats.saturating_add(1);
        let body = HeartbeatBody { sent_at: now, digest, agents: with_list.then_some(agents) };
        let msg = wire::seal_heartbeat(&self.keypair, &body);
        let signed = Arc::<[u8]>::from(msg.as_slice());
        if with_list {
            self.own_list = Some(Arc::from([signed.clone()]));
        }
        self.last_heartbeat = Some(signed);
        self.publish(&self.heartbeats.clone(), msg);
        for peer in self.bans.expire(now) {
            tracing::info!(%peer, "ban ended");
            self.swarm.behaviour_mut().gossipsub.remove_blacklisted_peer(&peer);
        }
        let stale = Instant::now();
        self.list_fetches.retain(|_, &mut at| at > stale);
    }

    fn sync_with_random_peer(&mut self) {
        let peers: Vec<PeerId> = self.swarm.connected_peers().copied().collect();
        if peers.is_empty() {
            return;
        }
        let pick = peers[rand::random_range(0..peers.len())];
        self.request_sync(pick);
    }

    fn redial(&mut self) {
        let now = Instant::now();
        for i in 0..self.bootstrap.len() {
            let b = &self.bootstrap[i];
            let connected = b.peer.or(b.learned).is_some_and(|p| self.swarm.is_connected(&p));
            if b.next > now || connected || b.pending.is_some() {
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
    fn dial_lan_peers(&mut self) {
        let me = *self.swarm.local_peer_id();
        let Some(mdns) = self.swarm.behaviour().mdns.as_ref() else { return };
        let now = now_millis();
        let due: Vec<PeerId> = mdns
            .discovered_nodes()
            .filter(|p| me < **p && !self.swarm.is_connected(p) && !self.bans.is_banned(p, now))
            .copied()
            .collect();
        for peer in due {
            // No addresses given: mDNS (and Kademlia) supply the ones they know for the peer.
            let opts = DialOpts::peer_id(peer).condition(PeerCondition::DisconnectedAndNotDialing).build();
            let _ = self.swarm.dial(opts);
        }
    }

    /// Whom to ask for a publisher's records: the publisher itself when connected (it surely holds its
    /// newest), else the peer that relayed what named them.
    fn ask_for(&self, publisher: PeerId, relay: PeerId) -> PeerId {
        if self.swarm.is_connected(&publisher) {
            publisher
        } else {
            relay
        }
    }

    fn on_verdict(&mut self, verdict: Verdict) {
        match verdict {
            Verdict::Validate { message_id, source, acceptance } => {
                let rejected = acceptance == gossipsub::MessageAcceptance::Reject;
                self.swarm.behaviour_mut().gossipsub.report_message_validation_result(
                    &message_id,
                    &source,
                    acceptance,
                );
                if rejected {
                    self.strike(source, 1);
                }
            }
            Verdict::Misbehaved { peer, rejected } => self.strike(peer, rejected),
            Verdict::Settled(ids) => self.fetches.failed(&ids),
            Verdict::Refute => {
                tracing::info!("declared down by a peer; refuting with a heartbeat");
                self.on_heartbeat_tick();
            }
            Verdict::FetchList { from, publisher } => {
                let now = Instant::now();
                let due = self.list_fetches.get(&publisher).is_none_or(|&at| now >= at);
                if !due || self.list_fetches.len() >= MAX_LIST_FETCHES {
                    return;
                }
                // At most one fetch per publisher per heartbeat interval; the sender accepted the
                // heartbeat, so it most likely holds the list.
                self.list_fetches.insert(publisher, now + self.config.heartbeat_interval);
                let peer = self.ask_for(publisher, from);
                let request = SyncRequest::List { publisher: ByteBuf::from(publisher.to_bytes()) };
                self.send_sync(peer, request, sync::Asked::List);
            }
            Verdict::Fetch { from, publisher, ids } => {
                let peer = self.ask_for(publisher, from);
                self.fetch(peer, ids);
            }
        }
    }

    /// Counts rejected messages against the peer that sent them; past the limit it is disconnected and
    /// refused for `bans::BAN_FOR`.
    fn strike(&mut self, peer: PeerId, rejected: u32) {
        if !self.bans.strike(peer, rejected, now_millis()) {
            return;
        }
        tracing::warn!(%peer, ban_secs = bans::BAN_FOR.as_secs(), "peer banned: too many rejected messages");
        self.counters.update(|c| c.peers_banned += 1);
        let behaviour = self.swarm.behaviour_mut();
        behaviour.gossipsub.blacklist_peer(&peer);
        behaviour.kad.remove_peer(&peer);
        let _ = self.swarm.disconnect_peer_id(peer);
    }

    fn on_command(&mut self, command: Command) {
        match command {
            Command::Status(reply) => {
                let _ = reply.send(self.status());
            }
            Command::Peers(reply) => {
                let peers = self
                    .swarm
                    .connected_peers()
                    .map(|p| PeerInfo {
                        peer_id: p.to_base58(),
                        addresses: self
                            .addrs
                            .get(p)
                            .map(|a| a.iter().map(ToString::to_string).collect())
                            .unwrap_or_default(),
                        rtt_ms: self.rtts.get(p).map(|d| d.as_secs_f64() * 1e3),
                    })
                    .collect();
                let _ = reply.send(peers);
            }
            Command::Leave(_) => {}
        }
    }

    fn status(&mut self) -> Status {
        let counters = self.counters.get();
        let gossip = &self.swarm.behaviour().gossipsub;
        let mesh_peers = [&self.cards, &self.heartbeats]
            .into_iter()
            .map(|t| (t.to_string(), gossip.mesh_peers(&t.hash()).count()))
            .collect();
        let routing_table_size =
            self.swarm.behaviour_mut().kad.kbuckets().map(|bucket| bucket.num_entries()).sum();
        let records = self
            .registry
            .health_counts(now_millis())
            .into_iter()
            .map(|(health, n)| (health.as_str(), n))
            .collect();
        Status {
            peer_id: self.swarm.local_peer_id().to_base58(),
            listen_addrs: self.listen_addrs.iter().map(ToString::to_string).collect(),
            connected_peers: self.swarm.connected_peers().count(),
            mesh_peers,
            routing_table_size,
            banned_peers: self.bans.banned(now_millis()),
            closed_mesh: self.config.psk.is_some(),
            records,
            mesh_state: {
                let (publishers, list_entries, tombstones) = self.registry.mesh_state_size();
                let limits = self.registry.limits();
                MeshState {
                    publishers,
                    list_entries,
                    tombstones,
                    max_agents_per_publisher: limits.per_publisher,
                    max_remote_records: limits.remote_records,
                }
            },
            last_sync: counters.last_sync_ms.map(rfc3339),
            counters,
        }
    }

    /// Publishes a goodbye for every local agent, then keeps the swarm running briefly so it leaves.
    async fn leave(&mut self) {
        let body = TombstoneBody { agent_id: None, seq: now_millis() };
        let msg = wire::seal_tombstone(&self.keypair, &body);
        self.publish(&self.cards.clone(), msg);
        let deadline = tokio::time::sleep(LEAVE_FLUSH);
        tokio::pin!(deadline);
        loop {
            tokio::select! {
                _ = &mut deadline => break,
                event = self.swarm.select_next_some() => self.on_swarm_event(event),
            }
        }
        tracing::info!("left the mesh");
    }

    fn on_swarm_event(&mut self, event: SwarmEvent<BehaviourEvent>) {
        match event {
            SwarmEvent::NewListenAddr { address, .. } => {
                tracing::info!(%address, "mesh listening");
                self.listen_addrs.push(address);
            }
            SwarmEvent::ExpiredListenAddr { address, .. } => self.listen_addrs.retain(|a| a != &address),
            SwarmEvent::ConnectionEstablished {
                peer_id, connection_id, endpoint, num_established, ..
            } => {
                if self.bans.is_banned(&peer_id, now_millis()) {
                    tracing::debug!(%peer_id, "refused a connection of a banned peer");
                    let _ = self.swarm.close_connection(connection_id);
                    return;
                }
                let addr = endpoint.get_remote_address().clone();
                let addrs = self.addrs.entry(peer_id).or_default();
                if addrs.len() < MAX_ADDRS_PER_PEER {
                    addrs.insert(addr.clone());
                }
                if endpoint.is_dialer() {
                    self.swarm.behaviour_mut().kad.add_address(&peer_id, addr);
                }
                for b in &mut self.bootstrap {
                    if b.pending == Some(connection_id) {
                        b.pending = None;
                        b.learned = Some(peer_id);
                    }
                    if b.peer.or(b.learned) == Some(peer_id) {
                        b.backoff = REDIAL_MIN;
                    }
                }
                if num_established.get() == 1 {
                    tracing::debug!(%peer_id, "peer connected");
                    self.membership.connected(peer_id);
                    self.request_sync(peer_id);
                    // Its newest heartbeat and list at once: its agents are alive as their cards
                    // land, without waiting for its next heartbeat to reach this node by gossip.
                    let request = SyncRequest::List { publisher: ByteBuf::from(peer_id.to_bytes()) };
                    self.send_sync(peer_id, request, sync::Asked::List);
                }
            }
            SwarmEvent::OutgoingConnectionError { connection_id, peer_id, error } => {
                tracing::debug!(peer = ?peer_id, %error, "could not connect");
                if let Some(peer) = peer_id {
                    self.on_dial_failed(peer);
                }
                self.counters.update(|c| c.connection_errors += 1);
                for b in self.bootstrap.iter_mut().filter(|b| b.pending == Some(connection_id)) {
                    b.pending = None;
                }
            }
            SwarmEvent::IncomingConnectionError { send_back_addr, error, .. } => {
                // A peer without this mesh's network key ends here, at the handshake.
                tracing::debug!(from = %send_back_addr, %error, "incoming connection failed");
                self.counters.update(|c| c.connection_errors += 1);
            }
            SwarmEvent::ConnectionClosed { peer_id, num_established: 0, .. } => {
                tracing::debug!(%peer_id, "peer disconnected");
                self.rtts.remove(&peer_id);
                self.addrs.remove(&peer_id);
                self.on_peer_lost(peer_id);
            }
            SwarmEvent::Behaviour(event) => self.on_behaviour_event(event),
            _ => {}
        }
    }

    fn on_behaviour_event(&mut self, event: BehaviourEvent) {
        match event {
            BehaviourEvent::Gossipsub(gossipsub::Event::Message {
                propagation_source,
                message_id,
                message,
            }) => {
                self.counters.update(|c| c.messages_in += 1);
                let inbound = Inbound::Gossip {
                    message_id: message_id.clone(),
                    source: propagation_source,
                    data: message.data,
                };
                if self.ingest.try_send(inbound).is_err() {
                    self.counters.update(|c| c.dropped_overload += 1);
                    self.swarm.behaviour_mut().gossipsub.report_message_validation_result(
                        &message_id,
                        &propagation_source,
                        gossipsub::MessageAcceptance::Ignore,
                    );
                }
            }
            BehaviourEvent::Identify(identify::Event::Received { peer_id, info, .. }) => {
                for addr in info.listen_addrs {
                    self.swarm.behaviour_mut().kad.add_address(&peer_id, addr);
                }
            }
            BehaviourEvent::Ping(ping::Event { peer, result: Ok(rtt), .. }) => {
                self.rtts.insert(peer, rtt);
            }
            // A connection that cannot carry a ping is dead (a peer whose network went away sends no
            // FIN): close it, or both sides keep believing they are connected and never redial.
            BehaviourEvent::Ping(ping::Event { peer, connection, result: Err(error) }) => {
                tracing::debug!(%peer, %error, "ping failed; closing the connection");
                self.swarm.close_connection(connection);
            }
            BehaviourEvent::Mdns(mdns::Event::Discovered(found)) => {
                for (peer, addr) in found {
                    self.swarm.behaviour_mut().kad.add_address(&peer, addr);
                }
                self.dial_lan_peers();
            }
            BehaviourEvent::Sync(request_response::Event::Message { peer, message, .. }) => match message {
                request_response::Message::Request { request, channel, .. } => {
                    let response = self.answer(request);
                    let _ = self.swarm.behaviour_mut().sync.send_response(channel, response);
                }
                request_response::Message::Response { request_id, response } => {
                    self.on_sync_response(peer, request_id, response);
                }
            },
            BehaviourEvent::Sync(request_response::Event::OutboundFailure {
                peer,
                request_id,
                error,
                ..
            }) => {
                self.on_sync_failure(peer, request_id, &error);
            }
            _ => {}
        }
    }
}
