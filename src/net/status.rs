//! What the mesh reports: counters shared by the loop and the ingest worker, `GET /api/v1/mesh/status`
//! and `GET /api/v1/mesh/peers`.

use super::*;

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
    /// Connections refused by this node's bounds (`max_connections`, pending handshakes, connections
    /// per peer), inbound or its own dials.
    pub connections_denied: u64,
    /// Peers this node declared down (connection closed, confirmed by peers it asked).
    pub peers_declared_down: u64,
    /// Connections this node closed over its connection target (`peer_high`), each agreed to by the
    /// peer.
    pub peers_parted: u64,
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
    /// The connection target: `connected_peers` settles between these two.
    pub peer_low: usize,
    pub peer_high: usize,
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
    /// The gossip topics for which the peer is in this node's gossipsub mesh (the keys of
    /// `Status::mesh_peers`); empty when it is connected but only gossiped to (IHAVE) or not subscribed.
    pub mesh_topics: Vec<String>,
}

impl EventLoop {
    pub(super) fn peers(&self) -> Vec<PeerInfo> {
        let gossip = &self.swarm.behaviour().gossipsub;
        let meshes: Vec<(String, HashSet<&PeerId>)> = [&self.cards, &self.heartbeats]
            .into_iter()
            .map(|t| (t.to_string(), gossip.mesh_peers(&t.hash()).collect()))
            .collect();
        self.swarm
            .connected_peers()
            .map(|p| PeerInfo {
                peer_id: p.to_base58(),
                addresses: self
                    .addrs
                    .get(p)
                    .map(|a| a.iter().map(ToString::to_string).collect())
                    .unwrap_or_default(),
                rtt_ms: self.rtts.get(p).map(|d| d.as_secs_f64() * 1e3),
                mesh_topics: meshes
                    .iter()
                    .filter(|(_, peers)| peers.contains(p))
                    .map(|(topic, _)| topic.clone())
                    .collect(),
            })
            .collect()
    }

    pub(super) fn status(&mut self) -> Status {
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
            peer_low: self.config.peers.low,
            peer_high: self.config.peers.high,
            mesh_peers,
            routing_table_size,
            banned_peers: self.state.banned(now_millis()),
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
}
