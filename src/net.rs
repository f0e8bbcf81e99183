//! The mesh: one task owns the libp2p swarm (TCP + noise + yamux, DNS; gossipsub, Kademlia, mDNS,
//! identify, ping, and a request-response sync protocol). Everyone else talks to it through a
//! [`NetHandle`] over bounded channels.
//!
//! Tasks (both in the node's supervised set):
//! - the event loop (this module): swarm events, local changes to announce, timers (heartbeat, sync,
//!   redial, Kademlia refresh), commands;
//! - the ingest worker ([`ingest`]): verifies and applies what peers send, one message at a time, and
//!   reports a gossip verdict (Accept / Reject / Ignore) for every message back to the loop.

mod behaviour;
mod dialing;
mod gate;
pub mod ingest;
mod protocol;
mod status;
pub mod sync;

use behaviour::{build_swarm, Behaviour, BehaviourEvent};
use dialing::{peer_of, Bootstrap};
pub use status::{CounterState, Counters, MeshState, PeerInfo, Status};

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use libp2p::core::transport::Transport as _;
use libp2p::core::upgrade;
use libp2p::futures::StreamExt;
use libp2p::gossipsub::{self, IdentTopic, MessageAuthenticity, ValidationMode};
use libp2p::identity::{Keypair, PeerId};
use libp2p::metrics::Recorder as _;
use libp2p::multiaddr::Protocol;
use libp2p::pnet::{PnetConfig, PreSharedKey};
use libp2p::request_response::{self, ProtocolSupport};
use libp2p::swarm::behaviour::toggle::Toggle;
use libp2p::swarm::dial_opts::{DialOpts, PeerCondition};
use libp2p::swarm::{ConnectionId, NetworkBehaviour, SwarmEvent};
use libp2p::swarm::{DialError, ListenError};
use libp2p::{
    connection_limits, identify, kad, mdns, noise, ping, tcp, yamux, Multiaddr, StreamProtocol, Swarm,
};
use serde::Serialize;
use sha2::Digest as _;
use tokio::sync::{broadcast, mpsc, oneshot};
use tokio::time::{interval, Instant, MissedTickBehavior};

use crate::clock::now_millis;
use crate::clock::rfc3339;
use crate::defaults::{
    MAX_ADDRS_PER_PEER, MAX_CONNECTIONS_PER_PEER, MAX_PENDING_INCOMING, MAX_SYNC_REQUEST_BYTES,
    MAX_SYNC_RESPONSE_BYTES,
};
use crate::proto::announce::{self, Announcements};
use crate::proto::records::SignedList;
use crate::proto::state::{self, Event, State};
use crate::registry::{LocalChange, RecordKey, Registry};
use crate::tasks::Tasks;
use crate::wire::{self, HeartbeatBody, TombstoneBody, MAX_MESSAGE_BYTES};
use ingest::{GossipMessage, Ingest, Policy, Verdict};
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
/// Work queued for verification, in each of its two queues (gossip messages; sync answers). When the
/// gossip queue is full, further gossip is ignored (not forwarded); an answer that finds its queue full
/// is dropped and its records asked for again.
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
/// How often the accepted heartbeats that came in since the last tick are forwarded by gossipsub (one
/// that waited a tick or more in this node already goes on at once). The forwards of a tick go out
/// together, so each mesh peer is woken once a tick for every heartbeat this node relays instead of
/// once per copy: on a quiet mesh the per-message cost of a copy (a wake-up, yamux, noise, a system
/// call on each side) is most of what a node spends. Heartbeats are judged by age in seconds; cards,
/// removals and declarations are never held. The tick's timer runs only while forwards are held.
pub const FORWARD_TICK: Duration = Duration::from_millis(250);
/// Heartbeat forwards held at most; past it they go out at once.
pub const MAX_HELD_FORWARDS: usize = 4_096;

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
    /// Established connections at most (`Config::max_connections`).
    pub max_connections: u32,
    /// Connections kept, at least and at most once settled (`Config::peer_low`, `peer_high`).
    pub peers: crate::proto::target::Bounds,
    /// A closed mesh's pre-shared key: every connection is encrypted with it before anything else,
    /// so peers without it cannot connect at all. (Its `Debug` shows only a fingerprint.)
    pub psk: Option<PreSharedKey>,
    /// A closed mesh's publishers: messages signed by anyone else are refused. `None`: anyone.
    pub allowed_publishers: Option<Arc<HashSet<PeerId>>>,
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

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Starts the mesh: listens, subscribes, dials the bootstrap peers and spawns its two tasks into the
/// node's supervised set. libp2p's own metrics (`libp2p_*`) are registered in `metrics`.
pub async fn spawn(
    config: NetConfig,
    keypair: Keypair,
    registry: Arc<Registry>,
    metrics: &mut prometheus_client::registry::Registry,
    tasks: &mut Tasks,
) -> Result<NetHandle, NetError> {
    let mut swarm = build_swarm(&keypair, &config)?;
    let recorder = libp2p::metrics::Metrics::new(metrics);
    for addr in &config.listen {
        behaviour::ensure_port_free(addr)?;
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
    let (ingest_tx, inbox) = ingest::queues(INGEST_QUEUE);
    let (verdict_tx, verdicts) = mpsc::channel(INGEST_QUEUE);
    let counters = Arc::new(Counters::default());
    let policy = Policy { me: peer_id, allowed: config.allowed_publishers.clone() };
    tasks.spawn_loop(
        "mesh ingest",
        ingest::run(registry.clone(), inbox, verdict_tx, counters.clone(), policy),
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
    let snapshot = registry.snapshot();
    let own = snapshot.of_publisher(&peer_id).map(|e| e.key.agent_id.clone());
    let unannounced: BTreeSet<String> = announce::again_at_start(own).into_iter().collect();
    let config_heartbeat = config.heartbeat_interval;
    let config_peers = config.peers;
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
        recorder,
        bootstrap,
        cards,
        heartbeats,
        rtts: HashMap::new(),
        quiet: HashSet::new(),
        quiet_peers: HashSet::new(),
        addrs: HashMap::new(),
        listen_addrs: Vec::new(),
        last_list: None,
        list_beats: 0,
        own_list: None,
        // A node that starts on a stored view of a few cards announces them again at its first
        // heartbeat: peers that removed them when it left take them back by gossip, not one fetch per
        // hop. More than a budget's worth are left to its list and reconciliation (`proto::announce`).
        unannounced,
        announcements: Announcements::default(),
        last_heartbeat: None,
        requests: HashMap::new(),
        indexed: None,
        held: Vec::new(),
        state: State::new(
            state::Config { list_refetch: config_heartbeat.as_millis() as u64, peers: config_peers },
            rand::random(),
        ),
    };
    tasks.spawn_loop("mesh event loop", event_loop.run());
    Ok(NetHandle { tx, peer_id })
}

struct EventLoop {
    swarm: Swarm<Behaviour>,
    keypair: Keypair,
    registry: Arc<Registry>,
    config: NetConfig,
    commands: mpsc::Receiver<Command>,
    ingest: Ingest,
    verdicts: mpsc::Receiver<Verdict>,
    changes: broadcast::Receiver<LocalChange>,
    counters: Arc<Counters>,
    /// libp2p's own metrics: swarm events (connections), gossipsub, Kademlia, identify and ping.
    recorder: libp2p::metrics::Metrics,
    bootstrap: Vec<Bootstrap>,
    cards: IdentTopic,
    heartbeats: IdentTopic,
    rtts: HashMap<PeerId, Duration>,
    /// Connections this node is closing because their pings failed, until their close is reported:
    /// at most one per open connection.
    quiet: HashSet<ConnectionId>,
    /// Peers this node is disconnecting because its last address off loopback went away, until
    /// their last connection's close is reported or a new connection to them is made: at most one
    /// per connected peer.
    quiet_peers: HashSet<PeerId>,
    addrs: HashMap<PeerId, HashSet<Multiaddr>>,
    listen_addrs: Vec<Multiaddr>,
    /// Digest of this node's agent list, and the beats that carried it so far.
    last_list: Option<u64>,
    list_beats: u32,
    /// The signed messages that carry this node's current list (the heartbeat that last carried it,
    /// or every chunk of a long one), for nodes that fetch it.
    own_list: Option<SignedList>,
    /// Local cards whose announcement found no peer, announced again at each heartbeat until one
    /// does, unless they came in a bulk (at most `ANNOUNCE_BUDGET`).
    unannounced: BTreeSet<String>,
    /// This heartbeat interval's budget of cards gossiped one by one.
    announcements: Announcements,
    /// This node's newest heartbeat, sent first in answer to a fetch of its list.
    last_heartbeat: Option<Arc<[u8]>>,
    /// The protocol's decisions: sync questions, fetch claims, failure detection, bans.
    state: State,
    /// The protocol state's number of each sync request in flight (as many as it has in flight, at
    /// most `MAX_SYNC_IN_FLIGHT`), and the span its answer is handled in (the ingest of the records
    /// it brings included).
    requests: HashMap<request_response::OutboundRequestId, (state::RequestId, tracing::Span)>,
    /// The snapshot the protocol state's reconciliation index was built from (see `index`).
    indexed: Option<Arc<crate::registry::Snapshot>>,
    /// Accepted heartbeats whose forwards wait for the next `FORWARD_TICK` (at most
    /// `MAX_HELD_FORWARDS`).
    held: Vec<(gossipsub::MessageId, PeerId)>,
}

impl EventLoop {
    async fn run(mut self) {
        let mut heartbeat = interval(self.config.heartbeat_interval);
        // The times of the forward tick are the heartbeat's and every `FORWARD_TICK` between, so that
        // this node's own heartbeat goes out with a tick's forwards.
        let grid = Instant::now();
        let mut sync = interval(SYNC_INTERVAL);
        let mut redial = interval(REDIAL_MIN);
        let mut lan_redial = interval(MDNS_QUERY_INTERVAL);
        for timer in [&mut heartbeat, &mut sync, &mut redial, &mut lan_redial] {
            timer.set_missed_tick_behavior(MissedTickBehavior::Delay);
        }
        // Two timers that wake the loop only when they have work (a wake-up polls the whole swarm): the
        // forward tick, armed while forwards are held, and the protocol state's tick (at once, then at
        // `State::next_tick`).
        let forward = tokio::time::sleep_until(grid);
        let mut forwarding = false;
        let mut detect_at = Instant::now();
        let detect = tokio::time::sleep_until(detect_at);
        tokio::pin!(forward, detect);
        loop {
            if !forwarding && !self.held.is_empty() {
                forward.as_mut().reset(next_tick(grid, FORWARD_TICK, Instant::now()));
                forwarding = true;
            }
            let due = self.next_detect_tick();
            if due < detect_at {
                detect_at = due;
                detect.as_mut().reset(due);
            }
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
                () = &mut forward, if forwarding => {
                    forwarding = false;
                    self.forward_held();
                }
                _ = sync.tick() => self.handle(Event::SyncTimer),
                // A node with no bootstrap address has nothing to redial: its timer never wakes it.
                _ = redial.tick(), if !self.bootstrap.is_empty() => self.redial(),
                _ = lan_redial.tick() => self.dial_lan_peers(),
                () = &mut detect => {
                    self.on_detect_tick();
                    detect_at = self.next_detect_tick();
                    detect.as_mut().reset(detect_at);
                }
            }
        }
    }

    /// When the protocol state wants its next tick ([`State::next_tick`]), on the runtime's clock.
    fn next_detect_tick(&self) -> Instant {
        let now = now_millis();
        Instant::now() + Duration::from_millis(self.state.next_tick(now).saturating_sub(now))
    }

    /// Publishes on `topic`; false when gossipsub had no peer to send it to.
    fn publish(&mut self, topic: &IdentTopic, data: Vec<u8>) -> bool {
        match self.swarm.behaviour_mut().gossipsub.publish(topic.clone(), data) {
            Ok(_) => {
                self.counters.update(|c| c.messages_out += 1);
                true
            }
            // No peer yet, or none subscribed: anti-entropy reaches the peers it connects to.
            Err(error) => {
                tracing::debug!(topic = %topic, %error, "not published");
                false
            }
        }
    }

    /// Announces a local card by gossip, within this heartbeat interval's budget (`proto::announce`:
    /// past it, peers fetch the card once its list names it); one that found no peer is announced
    /// again at the next heartbeat unless it came in a bulk, so a card registered before the mesh formed
    /// reaches every node by gossip, not only the peers that reconcile with this one.
    fn announce(&mut self, agent_id: String) {
        self.unannounced.remove(&agent_id);
        if !self.announcements.take() {
            return;
        }
        let me = *self.swarm.local_peer_id();
        let key = RecordKey { agent_id, publisher: me };
        let Some(msg) = self.registry.signed_card(&key) else { return };
        if !self.publish(&self.cards.clone(), msg) {
            self.unannounced.insert(key.agent_id);
        }
    }

    fn on_local_change(&mut self, change: Result<LocalChange, broadcast::error::RecvError>) {
        match change {
            Ok(LocalChange::Card { agent_id }) => self.announce(agent_id),
            Ok(LocalChange::Removed { agent_id, seq }) => {
                self.unannounced.remove(&agent_id);
                let msg =
                    wire::seal_tombstone(&self.keypair, &TombstoneBody { agent_id: Some(agent_id), seq });
                self.publish(&self.cards.clone(), msg);
            }
            Err(broadcast::error::RecvError::Lagged(missed)) => {
                tracing::warn!(missed, "local change feed lagged; re-announcing every local card");
                let snapshot = self.registry.snapshot();
                for entry in snapshot.entries.iter().filter(|e| e.is_local()) {
                    self.announce(entry.key.agent_id.clone());
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
        let pending: Vec<String> = std::mem::take(&mut self.unannounced).into_iter().collect();
        if self.announcements.refill() {
            // Part of a bulk: left to the list and reconciliation like the rest of it.
            return;
        }
        for agent_id in pending {
            self.announce(agent_id);
        }
    }

    fn on_verdict(&mut self, verdict: Verdict) {
        match verdict {
            Verdict::Validate { message_id, source, acceptance, heartbeat } => {
                if holds_forward(heartbeat.map(|taken| taken.elapsed()), &acceptance) {
                    self.held.push((message_id, source));
                    if self.held.len() >= MAX_HELD_FORWARDS {
                        self.forward_held();
                    }
                    return;
                }
                let rejected = acceptance == gossipsub::MessageAcceptance::Reject;
                self.swarm.behaviour_mut().gossipsub.report_message_validation_result(
                    &message_id,
                    &source,
                    acceptance,
                );
                if rejected {
                    self.handle(Event::Refused { peer: source, count: 1 });
                }
            }
            Verdict::Misbehaved { peer, rejected } => self.handle(Event::Refused { peer, count: rejected }),
            Verdict::Settled(ids) => self.handle(Event::Settled(ids)),
            Verdict::Refute => {
                tracing::info!("declared down by a peer; refuting with a heartbeat");
                self.on_heartbeat_tick();
            }
            Verdict::FetchList { from, publisher } => self.handle(Event::ListUnknown { from, publisher }),
            Verdict::Fetch { from, publisher, ids } => self.handle(Event::Missing { from, publisher, ids }),
        }
    }

    /// Has gossipsub forward the heartbeats accepted since the last tick.
    fn forward_held(&mut self) {
        let gossipsub = &mut self.swarm.behaviour_mut().gossipsub;
        for (message_id, source) in self.held.drain(..) {
            gossipsub.report_message_validation_result(
                &message_id,
                &source,
                gossipsub::MessageAcceptance::Accept,
            );
        }
    }

    fn on_command(&mut self, command: Command) {
        match command {
            Command::Status(reply) => {
                let _ = reply.send(self.status());
            }
            Command::Peers(reply) => {
                let _ = reply.send(self.peers());
            }
            Command::Leave(_) => {}
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

    /// This node's last address off loopback went away (its interface is down, its container was
    /// disconnected): its connections to other hosts are dead, but their pings would take 10-20 s
    /// to tell, and meanwhile the node counts them toward its connection target (so it dials nobody
    /// when the network is back) and gossips into them. They are closed now, as quiet: no suspicion
    /// (`Event::Closed { silent }`). Connections to peers on loopback stay.
    fn close_off_loopback(&mut self) {
        let peers: Vec<PeerId> = self
            .swarm
            .connected_peers()
            .filter(|p| !self.addrs.get(*p).is_some_and(|addrs| addrs.iter().any(is_loopback)))
            .copied()
            .collect();
        tracing::info!(
            peers = peers.len(),
            "no address off loopback left; closing the connections to other hosts"
        );
        for peer in peers {
            if self.swarm.disconnect_peer_id(peer).is_ok() {
                self.quiet_peers.insert(peer);
            }
        }
    }

    fn on_swarm_event(&mut self, event: SwarmEvent<BehaviourEvent>) {
        self.recorder.record(&event);
        match event {
            SwarmEvent::NewListenAddr { address, .. } => {
                tracing::info!(%address, "mesh listening");
                self.listen_addrs.push(address);
                // An address came up (at start, or an interface back after a cut, a laptop resumed):
                // the peers and bootstrap addresses that failed meanwhile are worth a dial at once,
                // not after the backoff the outage grew.
                self.state.network_changed();
                for b in &mut self.bootstrap {
                    b.next = Instant::now();
                    b.backoff = REDIAL_MIN;
                }
            }
            SwarmEvent::ExpiredListenAddr { address, .. } => {
                tracing::info!(%address, "mesh address gone");
                self.listen_addrs.retain(|a| a != &address);
                if !self.listen_addrs.iter().any(|a| !is_loopback(a)) {
                    self.close_off_loopback();
                }
            }
            SwarmEvent::ConnectionEstablished {
                peer_id, connection_id, endpoint, num_established, ..
            } => {
                if self.state.is_banned(&peer_id, now_millis()) {
                    tracing::debug!(%peer_id, "refused a connection of a banned peer");
                    let _ = self.swarm.close_connection(connection_id);
                    return;
                }
                // A new connection to a peer being disconnected as quiet: the old ones' closes are no
                // longer its last, and a later close of this one is judged on its own.
                self.quiet_peers.remove(&peer_id);
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
                    self.handle(Event::Connected(peer_id));
                }
            }
            SwarmEvent::OutgoingConnectionError { connection_id, peer_id, error } => {
                match &error {
                    // A lookup's dial while the node holds the connections it wants: by design.
                    DialError::Denied { cause } if cause.downcast_ref::<gate::Settled>().is_some() => {
                        tracing::trace!(peer = ?peer_id, "discovery dial not made: connection target reached");
                    }
                    // This node's own bound, not the peer's failure: no evidence against it.
                    DialError::Denied { cause } => {
                        tracing::debug!(peer = ?peer_id, %cause, "dial refused: connection limit");
                        self.counters.update(|c| c.connections_denied += 1);
                    }
                    _ => {
                        tracing::debug!(peer = ?peer_id, %error, "could not connect");
                        if let Some(peer) = peer_id {
                            self.handle(Event::DialFailed(peer));
                        }
                        self.counters.update(|c| c.connection_errors += 1);
                    }
                }
                for b in self.bootstrap.iter_mut().filter(|b| b.pending == Some(connection_id)) {
                    b.pending = None;
                }
            }
            SwarmEvent::IncomingConnectionError {
                send_back_addr,
                error: ListenError::Denied { cause },
                ..
            } => {
                tracing::debug!(from = %send_back_addr, %cause, "incoming connection refused: connection limit");
                self.counters.update(|c| c.connections_denied += 1);
            }
            SwarmEvent::IncomingConnectionError { send_back_addr, error, .. } => {
                // A peer without this mesh's network key ends here, at the handshake.
                tracing::debug!(from = %send_back_addr, %error, "incoming connection failed");
                self.counters.update(|c| c.connection_errors += 1);
            }
            SwarmEvent::ConnectionClosed { peer_id, connection_id, num_established, .. } => {
                let mut silent = self.quiet.remove(&connection_id);
                if num_established == 0 {
                    silent |= self.quiet_peers.remove(&peer_id);
                    tracing::debug!(%peer_id, silent, "peer disconnected");
                    self.rtts.remove(&peer_id);
                    self.addrs.remove(&peer_id);
                    self.on_peer_lost(peer_id, silent);
                }
            }
            SwarmEvent::Behaviour(event) => self.on_behaviour_event(event),
            _ => {}
        }
    }

    fn on_behaviour_event(&mut self, event: BehaviourEvent) {
        match &event {
            BehaviourEvent::Gossipsub(e) => self.recorder.record(e),
            BehaviourEvent::Kad(e) => self.recorder.record(e),
            BehaviourEvent::Identify(e) => self.recorder.record(e),
            BehaviourEvent::Ping(e) => self.recorder.record(e),
            BehaviourEvent::Mdns(_) | BehaviourEvent::Sync(_) => {}
            BehaviourEvent::Limits(never) | BehaviourEvent::Gate(never) => match *never {},
        }
        match event {
            BehaviourEvent::Gossipsub(gossipsub::Event::Message {
                propagation_source,
                message_id,
                message,
            }) => {
                self.counters.update(|c| c.messages_in += 1);
                let gossip = GossipMessage {
                    message_id: message_id.clone(),
                    source: propagation_source,
                    data: message.data,
                    // An `IdentTopic`'s hash is its name, compared without building one per message.
                    heartbeat: (message.topic.as_str() == HEARTBEATS_TOPIC).then(std::time::Instant::now),
                };
                if !self.ingest.gossip(gossip) {
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
                if self.swarm.close_connection(connection) {
                    self.quiet.insert(connection);
                }
            }
            BehaviourEvent::Mdns(mdns::Event::Discovered(found)) => {
                let now = now_millis();
                for (peer, addr) in found {
                    self.swarm.behaviour_mut().kad.add_address(&peer, addr);
                    self.state.heard_of(peer, now);
                }
                self.dial_lan_peers();
            }
            BehaviourEvent::Sync(request_response::Event::Message { peer, message, .. }) => match message {
                request_response::Message::Request { request, channel, .. } => {
                    let (kind, started) = (request.kind(), std::time::Instant::now());
                    let response = self.answer(peer, request);
                    tracing::debug!(
                        %peer,
                        kind,
                        records = response.cards.len(),
                        took_us = started.elapsed().as_micros() as u64,
                        "sync question answered"
                    );
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

/// Whether `addr` is on loopback (its IP part, if it has one).
fn is_loopback(addr: &Multiaddr) -> bool {
    behaviour::ip_of(addr).is_some_and(|ip| ip.is_loopback())
}

/// The first time after `now` on the grid of `period`s that starts at `start`.
fn next_tick(start: Instant, period: Duration, now: Instant) -> Instant {
    let period_ns = period.as_nanos().max(1);
    let ticks = now.saturating_duration_since(start).as_nanos() / period_ns + 1;
    start + Duration::from_nanos(u64::try_from(ticks * period_ns).unwrap_or(u64::MAX))
}

/// Whether a verdict's forward waits for the next `FORWARD_TICK`: only an accepted heartbeat's
/// (`waited`: how long it has been in this node; `None` for any other message), and only if it came in
/// less than a tick ago. One that waited longer (a busy ingest worker) goes on at once, so holding never
/// adds to a delay. The simulator applies the same rule.
pub fn holds_forward(waited: Option<Duration>, acceptance: &gossipsub::MessageAcceptance) -> bool {
    *acceptance == gossipsub::MessageAcceptance::Accept && waited.is_some_and(|waited| waited < FORWARD_TICK)
}

#[cfg(test)]
mod tests {
    use libp2p::gossipsub::MessageAcceptance::{Accept, Ignore, Reject};

    use super::*;

    #[test]
    fn loopback_addresses_are_told_apart() {
        for (addr, loopback) in [
            ("/ip4/127.0.0.1/tcp/4001", true),
            ("/ip6/::1/tcp/4001", true),
            ("/ip4/10.0.0.5/tcp/4001", false),
            ("/ip6/fe80::1/tcp/4001", false),
            ("/dns4/localhost/tcp/4001", false),
        ] {
            assert_eq!(is_loopback(&addr.parse().unwrap()), loopback, "{addr}");
        }
    }

    /// The event loop tells a heartbeat by its topic's name, without building the topic's hash per
    /// message: that holds while the topic is an `IdentTopic`.
    #[test]
    fn the_heartbeat_topics_hash_is_its_name() {
        assert_eq!(IdentTopic::new(HEARTBEATS_TOPIC).hash().as_str(), HEARTBEATS_TOPIC);
    }

    #[test]
    fn held_forwards_go_out_at_the_next_time_of_the_heartbeats_grid() {
        let start = Instant::now();
        let tick = FORWARD_TICK;
        assert_eq!(next_tick(start, tick, start), start + tick, "never at once");
        assert_eq!(next_tick(start, tick, start + tick / 3), start + tick);
        assert_eq!(next_tick(start, tick, start + tick), start + tick * 2, "a time just passed is not next");
        assert_eq!(
            next_tick(start, tick, start + tick * 7 + tick / 2),
            start + tick * 8,
            "after a quiet spell"
        );
    }

    #[test]
    fn only_an_accepted_heartbeat_that_came_in_within_a_tick_waits_for_its_forward() {
        let soon = Some(FORWARD_TICK / 2);
        assert!(holds_forward(soon, &Accept), "a fresh heartbeat waits for the tick");
        assert!(!holds_forward(None, &Accept), "a card, a removal or a declaration goes at once");
        assert!(
            !holds_forward(Some(FORWARD_TICK), &Accept),
            "a heartbeat that waited a tick in ingest goes at once"
        );
        for verdict in [Reject, Ignore] {
            assert!(!holds_forward(soon, &verdict), "{verdict:?} is reported at once");
        }
    }
}
