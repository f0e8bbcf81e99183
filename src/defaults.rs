//! Every built-in default and every hard limit, in one place.
//!
//! Settings (`config.rs`) start from these values. A limit is configurable only where an operator
//! would tune it for this node's memory (`max_remote_records`) or for a mesh as a whole
//! (`max_agents_per_publisher`, which every node of a mesh should share); the rest are protocol
//! constants every node must agree on. SECURITY.md lists each bound with what a hostile peer can
//! still make a node hold.

use std::time::Duration;

/// HTTP API address. Loopback, and the port the AgentField SDK uses by default, so its agents find the
/// daemon with no setting at all.
pub const HTTP_ADDR: &str = "127.0.0.1:8080";
/// libp2p listen address of the mesh.
pub const LISTEN_ADDR: &str = "/ip4/0.0.0.0/tcp/4001";
/// Data directory (identity key and sled store), relative to the working directory.
pub const DATA_DIR: &str = "agentmesh-data";
/// How often a node announces that its local agents are alive.
pub const HEARTBEAT_INTERVAL: Duration = Duration::from_secs(2);
/// Heartbeat age after which an agent counts as `degraded` (three missed intervals plus slack).
pub const DEGRADED_AFTER: Duration = Duration::from_secs(7);
/// Heartbeat age after which an agent counts as `inactive`.
pub const INACTIVE_AFTER: Duration = Duration::from_secs(20);
/// Heartbeat age after which a remote agent leaves the view.
pub const EVICT_AFTER: Duration = Duration::from_secs(600);
/// The eviction sweep runs at most this far apart (and at least a heartbeat interval apart, and about
/// twenty times per `evict_after`): a sweep reads every record of the view, and a record may leave it
/// this much later than `evict_after`.
pub const EVICT_SWEEP_MAX: Duration = Duration::from_secs(30);
/// Path probed under a local agent's base_url when probes are on.
pub const PROBE_PATH: &str = "/health";
/// How often a `card_url` is fetched again (the card and, by its answer, the agent's liveness).
pub const CARD_POLL_INTERVAL: Duration = Duration::from_secs(10);
/// `Cache-Control: max-age` of served A2A cards: a card changes only when its agent re-registers.
pub const A2A_CARD_MAX_AGE: Duration = Duration::from_secs(30);
/// Most watch streams (`/api/v1/discovery/events`) open at once; each holds a connection.
pub const MAX_WATCHERS: usize = 1024;
/// Whether mDNS discovery is on.
pub const MDNS: bool = true;

/// Largest accepted card, as canonical JSON.
pub const MAX_CARD_BYTES: usize = 64 * 1024;
/// Largest accepted HTTP request body. Above the card limit because registration payloads carry
/// fields (metadata, config) that the card does not keep.
pub const MAX_BODY_BYTES: usize = 256 * 1024;
/// Longest id (agent, reasoner, skill).
pub const MAX_ID_LEN: usize = 128;
/// Longest tag.
pub const MAX_TAG_LEN: usize = 64;
/// Most tags on an agent or on one capability.
pub const MAX_TAGS: usize = 32;
/// Most reasoners plus skills on one card.
pub const MAX_CAPABILITIES: usize = 256;
/// Most entries in one capability's `requires` or `required_secrets`.
pub const MAX_REQUIRES: usize = 32;
/// Longest entry of `requires`: a target `agent_id:kind:id` (two ids and a kind).
pub const MAX_TARGET_LEN: usize = 2 * MAX_ID_LEN + 16;
/// Longest short text field (name, version, deployment type).
pub const MAX_SHORT_TEXT: usize = 256;
/// Metadata entries per agent and per capability (`metadata`).
pub const MAX_METADATA: usize = 32;
/// Longest URL.
pub const MAX_URL_LEN: usize = 2048;
/// Most A2A interfaces on one card.
pub const MAX_INTERFACES: usize = 8;
/// Deepest nesting of an A2A extension's `params` (objects and arrays inside it). A card is re-read
/// by every node and by A2A verifiers, whose JSON readers stop at 128 levels; the card around the
/// params adds a few of its own.
pub const MAX_A2A_PARAMS_DEPTH: usize = 32;

/// Discovery page size when `limit` is not given.
pub const DISCOVERY_LIMIT: usize = 100;
/// Largest `limit` a discovery request may ask for.
pub const MAX_DISCOVERY_LIMIT: usize = 500;
/// Largest `offset` a discovery request may ask for.
pub const MAX_DISCOVERY_OFFSET: usize = 1_000_000;
/// Most ids in one discovery allow-list.
pub const MAX_QUERY_IDS: usize = 1000;
/// Most patterns in one `tags` filter.
pub const MAX_QUERY_TAGS: usize = 64;
/// Most `metadata.KEY=VALUE` filters in one query.
pub const MAX_QUERY_METADATA: usize = 8;
/// Targets `resolve` names as failover after the one it picks.
pub const RESOLVE_FAILOVER: usize = 3;

/// Records per chunk of the discovery filter index: a changed card rebuilds its chunk's columns,
/// and a filter tests this many records' capabilities in one sweep of flat arrays.
pub const INDEX_CHUNK: usize = 256;
/// Terms the filter index's dictionary may hold beyond twice the ids and tags in use (names that no
/// record uses any more, after churn) before the next refresh starts a fresh dictionary.
pub const INDEX_TERM_SLACK: usize = 65_536;

/// Bytes of records rendered in advance for discovery answers (each record once per format and set of
/// include flags asked): a random page over a view of 10,000 agents is then assembled from ready bytes.
pub const RENDER_CACHE_BYTES: usize = 16 * 1024 * 1024;

/// Discovery responses kept in the response cache.
pub const CACHE_ENTRIES: usize = 1024;
/// Bytes of rendered responses the cache may hold; a single response over an eighth of it is not cached.
/// 80 pages of 100 agents with their schemas: the cache is for the same query asked again (dashboards,
/// agents polling); a page it does not hold is assembled from prepared records anyway.
pub const CACHE_MAX_BYTES: usize = 8 * 1024 * 1024;
/// Bytes of empty response buffers kept to write the next answers into (`api::render::buffers`): a
/// buffer allocated afresh is written into pages the kernel must fault in one by one.
pub const RESPONSE_POOL_BYTES: usize = 1024 * 1024;
/// Buffers smaller than this are not kept: small bodies cost the allocator little.
pub const RESPONSE_POOL_MIN_BUFFER: usize = 16 * 1024;
/// Buffers larger than this are not kept: a rare large body should not stay.
pub const RESPONSE_POOL_MAX_BUFFER: usize = 1024 * 1024;
/// Discovery queries computed at once (cache misses); the rest wait their turn. Matches the cores a
/// sidecar can expect: more in parallel only adds memory.
pub const DISCOVERY_CONCURRENCY: usize = 2;
/// Queries whose canonical form is longer than this are answered but not cached.
pub const CACHE_MAX_KEY_BYTES: usize = 1024;
/// Longest a cached response is served, which bounds how stale its `last_heartbeat` values can be.
/// Registrations, removals and health changes invalidate the cache at once regardless.
pub const CACHE_MAX_AGE: Duration = Duration::from_secs(1);

/// A request that has not completed by then is answered 408.
pub const HTTP_REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// After a connection's last answer, what the client still sends is read and dropped (lingering
/// close) for at most this long, so a client writing a refused body whole reads its 413 rather than
/// a reset.
pub const LINGER_TIME: Duration = Duration::from_secs(5);
/// ... and at most this many bytes.
pub const LINGER_BYTES: usize = 64 * 1024 * 1024;
/// The longest `X-Request-Id` taken from a client (longer or non-printable ones are replaced by a new
/// id), so a client cannot make every log line of its requests arbitrarily long.
pub const MAX_REQUEST_ID_LEN: usize = 128;
/// Request headers must arrive within this, counted from when the connection waits for a request:
/// slow clients, and idle keep-alive connections, are closed after it.
pub const HTTP_HEADER_TIMEOUT: Duration = Duration::from_secs(10);
/// Open HTTP connections at most; beyond it new connections are closed at once.
pub const MAX_HTTP_CONNECTIONS: usize = 16_384;
/// Request line plus headers, at most (431 beyond it; also hyper's read buffer per connection).
pub const MAX_HEADER_BYTES: usize = 16 * 1024;
/// Request target (path and query string), at most (414 beyond it).
pub const MAX_URI_BYTES: usize = 8 * 1024;
/// sled page cache. Queries never read sled, so a small cache is enough.
pub const SLED_CACHE_BYTES: u64 = 1024 * 1024;
/// How often sled writes out what it buffered and cleans its segments, whatever was flushed in between
/// (sled's default: 500 ms). Local cards, removals and the witness are flushed as they are written;
/// what waits for this is remote rows, which the mesh sends again after a crash. Each periodic flush
/// writes out a partly filled buffer: at ten times sled's pace a node of a 50-node mesh catching up with
/// 10,000 agents writes 33 MB instead of 40 (its sockets included), and a node at rest fsyncs once in
/// 5 s instead of twice a second (BENCHMARKS.md, "The store's flush").
pub const STORE_FLUSH_EVERY: Duration = Duration::from_secs(5);
/// Rows written after which the store is reopened, once writing pauses, to give back the memory sled
/// keeps for every page written (about 2.3 KB a row: 23 MB after a node caught up with 10,000 agents).
pub const STORE_REOPEN_ROWS: usize = 1_000;
/// Rows written after which the store is reopened even while writes go on.
pub const STORE_REOPEN_ROWS_BUSY: usize = 20_000;
/// How often the node looks whether the store is due a reopen; writing has paused when a whole period
/// went by without a row written.
pub const STORE_REOPEN_CHECK: std::time::Duration = std::time::Duration::from_secs(5);
/// Name of the key file inside the data directory.
pub const IDENTITY_FILE: &str = "identity.key";
/// Name of the sled directory inside the data directory.
pub const STORE_DIR: &str = "store";

/// Most agents one publisher may have, by default: what this node admits locally and what it takes
/// from any other publisher. A gateway node fronting an organisation's agents is a real user, so this
/// is sized from memory (about 4.3 KB per held record once loaded, BENCHMARKS.md "Memory per record") rather than from a guess at
/// "a few agents per node". Every node of a mesh should use the same value (`max_agents_per_publisher`):
/// a node with a lower one ignores the excess of a bigger publisher (it is never blamed for it).
pub const MAX_AGENTS_PER_PUBLISHER: usize = 20_000;
/// Highest `max_agents_per_publisher` accepted: a full agent list of that many agents still fits one
/// sync response (`MAX_LIST_CHUNKS` chunks).
pub const MAX_AGENTS_PER_PUBLISHER_CEILING: usize = 250_000;
/// Remote records held in all, whoever published them, by default (`max_remote_records`): the bound
/// on the memory the rest of the mesh can make this node spend (about 430 MB at the limit, at the
/// measured 4.3 KB per record).
/// Five publishers at the per-publisher limit fit.
pub const MAX_REMOTE_RECORDS: usize = 100_000;
/// Highest `max_remote_records` accepted.
pub const MAX_REMOTE_RECORDS_CEILING: usize = 2_000_000;

/// Established libp2p connections at most, inbound and outbound together, by default (`max_connections`):
/// past it a new connection is closed as soon as its handshake ends, and this node does not dial. A
/// connection costs about 170-200 KB of buffers (BENCHMARKS.md, "What a mesh at rest costs"), so this
/// bounds them near 100 MB. A safety bound, not a target: a node settles between `PEER_LOW` and
/// `PEER_HIGH` connections whatever the mesh's size (docs/SCALE.md 4.1).
pub const MAX_CONNECTIONS: u32 = 512;
/// Highest `max_connections` accepted.
pub const MAX_CONNECTIONS_CEILING: u32 = 16_384;
/// Inbound connections still in their handshake at most: a flood of half-open connections is closed
/// before it costs a noise handshake each.
pub const MAX_PENDING_INCOMING: u32 = 64;
/// Established connections to one peer at most: two nodes that dial each other at the same moment keep
/// both for a while; a third is refused.
pub const MAX_CONNECTIONS_PER_PEER: u32 = 2;

/// Largest mesh message (gossip or one signed message in a sync answer): room for a maximal card and
/// for a list chunk of `LIST_CHUNK_AGENTS` agents with the longest ids. Every node must agree on it
/// (gossipsub drops whole RPCs over its own limit), so it is not configurable.
pub const MAX_MESSAGE_BYTES: usize = 256 * 1024;
/// Most agents a heartbeat lists inline, and most in one signed list chunk. At `MAX_ID_LEN` bytes per
/// id a chunk stays under 150 KB, well inside `MAX_MESSAGE_BYTES`. A longer list travels as chunks
/// fetched over sync, never in a heartbeat, so a heartbeat's size does not grow with the agent count.
pub const LIST_CHUNK_AGENTS: usize = 1024;
/// Most chunks one agent list may have (`MAX_AGENTS_PER_PUBLISHER_CEILING / LIST_CHUNK_AGENTS`,
/// rounded up).
pub const MAX_LIST_CHUNKS: usize = MAX_AGENTS_PER_PUBLISHER_CEILING.div_ceil(LIST_CHUNK_AGENTS);

/// Publishers whose mesh state (newest heartbeat, agent list, leave) is tracked at most. Beyond it
/// publishers that hold no record here go first, least recently heard first: a stream of fresh keys
/// costs a bounded amount of memory and evicts nobody who has agents in the view.
pub const MAX_TRACKED_PUBLISHERS: usize = 10_000;
/// Agent-list entries held in all, over every publisher, per remote record the view may hold (the
/// lists of heartbeats, kept to refresh agents from digest-only heartbeats): 200,000 entries at the
/// default `max_remote_records`. Lists of publishers with no record here go first beyond it.
pub const LIST_ENTRIES_PER_RECORD: usize = 2;
/// The list-entry bound at the default limits.
pub const MAX_LIST_ENTRIES: usize = LIST_ENTRIES_PER_RECORD * MAX_REMOTE_RECORDS;
/// Tombstones (recent removals that hide older copies of a card) held at most; the oldest go first.
pub const MAX_TOMBSTONES: usize = 100_000;
/// Publishers whose list is being fetched, waits for room in the request window, or was fetched within
/// the last heartbeat interval, at most (one entry each): as many as the publishers tracked, so that a
/// newcomer hearing every publisher's heartbeat at once asks for every list in one go (the window
/// still bounds the questions in flight).
pub const MAX_LIST_FETCHES: usize = MAX_TRACKED_PUBLISHERS;
/// Sync requests of this node awaiting an answer at most: a round beyond it waits for the next tick.
pub const MAX_SYNC_IN_FLIGHT: usize = 64;
/// A node connected to at most this many peers asks each new one for every publisher's newest
/// heartbeat (one question in flight at a time).
pub const HEARTBEATS_FROM_PEERS: usize = 2;
/// At most this many heartbeats in one answer to that question, and at most this many bytes of them.
pub const MAX_HEARTBEATS_ANSWER: usize = MAX_TRACKED_PUBLISHERS;
pub const MAX_HEARTBEATS_ANSWER_BYTES: usize = 8 * 1024 * 1024;
/// Local cards gossiped one by one per heartbeat interval at most, those announced again included (an
/// announcement that found no gossip peer is made again at the next heartbeat, as is one of a node
/// that started on a stored view). Past it, peers learn of the cards from this node's agent list and
/// fetch them over sync: a bulk of cards is reconciliation's job, not a burst of gossip
/// (`proto::announce`).
pub const ANNOUNCE_BUDGET: usize = 8;
/// Largest reconciliation frame: a newcomer learns the ids of a large view in frames of this size
/// (about 8,000 record ids each), one round trip apiece.
pub const RECONCILE_FRAME_BYTES: usize = 256 * 1024;
/// Reconciliations of this node under way at once at most; more peers met at once wait their turn,
/// as do all while this node is catching up (`proto::state`).
pub const MAX_RECONCILING: usize = 4;
/// Records asked for in one fetch request at most (and so cards in one answer: 256 maximal cards are
/// 16 MiB). Several requests are in flight at once, so a newcomer's fetches are pipelined.
pub const FETCH_BATCH: usize = 256;
/// Records being fetched at most (claims held until answered or lapsed); the rest waits for a later
/// round. As many as the default remote-record bound.
pub const MAX_PENDING_FETCHES: usize = MAX_REMOTE_RECORDS;
/// A fetch with no answer by then is given up, and its records may be asked of another peer.
pub const FETCH_TIMEOUT: Duration = Duration::from_secs(20);
/// After its answer, how long a fetched record stays claimed at most while the answer waits for the
/// ingest worker, which settles every record of the fetch as soon as it has applied the answer. A
/// busy node's queue can hold answers for seconds: were the claims to lapse first, the same records
/// would be asked of another peer and checked twice.
pub const FETCH_GRACE: Duration = Duration::from_secs(20);
/// Largest sync request: a reconciliation frame, or a fetch of `FETCH_BATCH` ids.
pub const MAX_SYNC_REQUEST_BYTES: u64 = 1024 * 1024;
/// Largest sync answer: `FETCH_BATCH` maximal cards, or every chunk of a maximal agent list.
pub const MAX_SYNC_RESPONSE_BYTES: u64 = 64 * 1024 * 1024;
/// Addresses remembered per connected peer (shown by `/api/v1/mesh/peers`).
pub const MAX_ADDRS_PER_PEER: usize = 8;

/// Rejected messages within `STRIKE_WINDOW` that get a peer banned. Honest peers never send a message
/// that fails verification (they verify before forwarding), so a handful is already a sign; the
/// margin covers a peer with a different allow-list in a misconfigured closed mesh.
pub const MAX_STRIKES: u32 = 20;
/// The window strikes are counted over.
pub const STRIKE_WINDOW: Duration = Duration::from_secs(60);
/// How long a banned peer is refused.
pub const BAN_FOR: Duration = Duration::from_secs(600);
/// Peers asked whether they still reach a peer whose connection closed (failure detection).
pub const PROBE_HELPERS: usize = 3;
/// A suspicion unsettled by then (no helper reached the peer, the redial has not connected) ends in
/// a declaration: a live peer's redial connects within round trips.
pub const SUSPECT_TIMEOUT: Duration = Duration::from_millis(1000);
/// How long a node remembers losing a peer, to answer other nodes' probes about it.
pub const LOST_MEMORY: Duration = Duration::from_secs(10);
/// Peers suspected at once at most (a mass disconnect beyond it is left to heartbeat age).
pub const MAX_SUSPECTS: usize = 256;

/// Connections a node keeps at least (the connection target's low bound, `peer_low`): below it, it
/// dials peers it knows, and lets Kademlia and mDNS dial.
pub const PEER_LOW: usize = 8;
/// Connections a node keeps at most once settled (`peer_high`): above it, it asks peers to part.
pub const PEER_HIGH: usize = 16;
/// How long two nodes that agreed to part do not dial each other.
pub const PART_MEMORY: Duration = Duration::from_secs(60);
/// How long a peer that declined to part (it held `peer_low` or fewer, or was syncing) is not asked
/// again.
pub const DECLINED_MEMORY: Duration = Duration::from_secs(5);
/// Requests to part awaiting their answers at most (the connection target asks as many as it holds
/// connections over `peer_high`, up to this).
pub const MAX_PART_ASKS: usize = 8;
/// A connection younger than this is never asked to part: it gets its first sync round.
pub const PART_MIN_AGE: Duration = Duration::from_secs(5);
/// How often a node trades a connection for a peer it knows and is not connected to (the shuffle
/// that bridges a healed partition).
pub const SHUFFLE_INTERVAL: Duration = Duration::from_secs(10);
/// A peer whose connection closed without a parting is preferred by the shuffle for this long.
pub const LOST_FIRST: Duration = Duration::from_secs(300);
/// Dials a node below `peer_low` makes at once for the connection target (as many as connections are
/// missing, up to this): a node back from an outage dials several peers, some at addresses that moved
/// (a dial there hangs), without waiting for each in turn.
pub const MAX_FILL_DIALS: usize = 4;
/// A dial for the connection target that reported nothing by then is given up.
pub const TARGET_DIAL_TIMEOUT: Duration = Duration::from_secs(10);
/// An agreed parting whose connection is still open this long after the agreement is forgotten: the
/// asker never had the answer (it closes at once when it does), so a later close is a loss again.
pub const PART_CLOSE_WAIT: Duration = Duration::from_secs(10);
/// Peers the connection target remembers at most (met before, parted with, declined); the oldest
/// entries go first beyond it.
pub const MAX_KNOWN_PEERS: usize = 4096;

/// Peers tracked at most for strikes and bans; the oldest entries go first beyond it.
pub const MAX_TRACKED_PEERS: usize = 4096;

/// How often capability-manifest directories are checked for changes: a listing and a few `stat`
/// calls per directory, no reads.
pub const MANIFEST_POLL_PERIOD: Duration = Duration::from_millis(250);
/// How long a manifest directory's files must stay unchanged before they are read: an editor's burst
/// of writes (temporary file, rename, attributes) becomes one reload.
pub const MANIFEST_DEBOUNCE: Duration = Duration::from_millis(500);
/// Most capability manifests one directory is read for (the first in path order): a card holds at
/// most `MAX_CAPABILITIES` reasoners and skills.
pub const MAX_MANIFESTS_PER_DIR: usize = MAX_CAPABILITIES;
/// Most entries of a manifest directory looked at per poll: a directory named by mistake (`/`, a
/// home directory) costs a bounded listing.
pub const MAX_MANIFEST_DIR_ENTRIES: usize = 4 * MAX_MANIFESTS_PER_DIR;
/// Largest manifest file read (`CAPABILITY.yaml`, `AGENT.yaml`, `SKILL.md`, `schema.json`).
pub const MAX_MANIFEST_FILE_BYTES: usize = 64 * 1024;
/// Longest capability description made from a manifest: `description`, a blank line, then as much of
/// `SKILL.md` as fits, cut at a line boundary. Cards have no description limit of their own, only
/// `MAX_CARD_BYTES` in all; this keeps a dozen documented capabilities well inside it.
pub const MAX_MANIFEST_DESCRIPTION_BYTES: usize = 4 * 1024;
