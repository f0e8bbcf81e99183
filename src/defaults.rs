//! Every built-in default and every hard limit, in one place.
//!
//! Settings (`config.rs`) start from these values; limits are not configurable because every node of a
//! mesh must agree on them.

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
/// Longest short text field (name, version, deployment type).
pub const MAX_SHORT_TEXT: usize = 256;
/// Longest URL.
pub const MAX_URL_LEN: usize = 2048;
/// Most A2A interfaces on one card.
pub const MAX_INTERFACES: usize = 8;

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

/// Discovery responses kept in the response cache.
pub const CACHE_ENTRIES: usize = 1024;
/// Bytes of rendered responses the cache may hold; a single response over an eighth of it is not cached.
pub const CACHE_MAX_BYTES: usize = 16 * 1024 * 1024;
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
/// Name of the key file inside the data directory.
pub const IDENTITY_FILE: &str = "identity.key";
/// Name of the sled directory inside the data directory.
pub const STORE_DIR: &str = "store";
