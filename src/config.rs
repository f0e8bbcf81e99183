//! Settings, layered: built-in defaults < TOML file < `AGENTMESH_*` environment < command-line flags.
//!
//! The file maps onto [`Config`] (missing keys keep their defaults, unknown keys are an error);
//! environment and flags arrive through `cli::RunArgs`, where clap reads each flag's variable.
//! [`Config::validate`] refuses bad values at start, naming the setting.

use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use libp2p::{Multiaddr, PeerId};
use serde::Deserialize;

use crate::defaults;
use crate::registry::health::Thresholds;
use crate::registry::Limits;

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config file {path}: {source}")]
    Read { path: PathBuf, source: std::io::Error },
    #[error("invalid config file {path}: {message}")]
    Parse { path: PathBuf, message: String },
    #[error("invalid setting `{setting}`: {reason}")]
    Invalid { setting: &'static str, reason: String },
}

/// What a registration offering a capability another agent already offers gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum DuplicatePolicy {
    /// Accepted: several agents serve the capability, and `resolve` picks one.
    Route,
    /// Refused (409) while another agent offers it.
    Reject,
}

/// Log output format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    #[default]
    Text,
    Json,
}

/// Every setting of `agentmesh run`. Each default is a constant in [`crate::defaults`].
#[derive(Clone, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// Identity key and store live here. Default `agentmesh-data` (relative to the working directory).
    pub data_dir: PathBuf,
    /// HTTP API address. Default `127.0.0.1:8080` (loopback only).
    pub http: SocketAddr,
    /// libp2p listen multiaddrs. Default `/ip4/0.0.0.0/tcp/4001`.
    pub listen: Vec<Multiaddr>,
    /// Peers to join at start (`/ip4/../tcp/../p2p/..`, `/dns4/..`). Default none.
    pub bootstrap: Vec<Multiaddr>,
    /// mDNS discovery on the LAN. Default on.
    pub mdns: bool,
    /// How often this node announces its agents. Default 2 s.
    #[serde(with = "humantime_serde")]
    pub heartbeat_interval: Duration,
    /// Heartbeat age that makes an agent `degraded`. Default 7 s.
    #[serde(with = "humantime_serde")]
    pub degraded_after: Duration,
    /// Heartbeat age that makes an agent `inactive`. Default 20 s.
    #[serde(with = "humantime_serde")]
    pub inactive_after: Duration,
    /// Heartbeat age after which a remote agent leaves the view. Default 10 min.
    #[serde(with = "humantime_serde")]
    pub evict_after: Duration,
    /// Card files (JSON) registered as local agents at start. Default none.
    pub cards: Vec<PathBuf>,
    /// Capability-manifest directories (`CAPABILITY.yaml` files, see [`crate::manifest`]): each one a
    /// local agent, rebuilt when its files change. A directory that does not exist is an error at
    /// start. Default none.
    pub capabilities_dirs: Vec<PathBuf>,
    /// How often to probe local agents registered by card file or the native API (GET base_url +
    /// probe_path). Default unset: no probes; the node vouches for them while it runs.
    #[serde(with = "humantime_serde")]
    pub probe_interval: Option<Duration>,
    /// Path probed under each agent's base_url. Default `/health`.
    pub probe_path: String,
    /// URLs of local agents' cards (A2A `/.well-known/agent-card.json`, or agentmesh cards), fetched
    /// every `card_poll_interval`: a changed card is republished, a failed fetch reports the agent
    /// `degraded` (`offline` after three in a row). Default none.
    pub card_urls: Vec<String>,
    /// What an HTTP registration whose capability id another agent of the view already offers gets
    /// (AgentSpec's duplicate-capability policy): `route` (accepted: both serve it, `resolve` picks one)
    /// or `reject` (409 naming the capability and the agent that has it). Default `route`.
    pub duplicate_capabilities: DuplicatePolicy,
    /// Webhooks: URLs that receive the watch stream's events as signed POSTs, each with its discovery
    /// filters after `#` (`http://127.0.0.1:9000/hook#tags=payments&health_status=active`; the fragment is
    /// never sent). See [`crate::webhook`]. Default none.
    pub webhooks: Vec<String>,
    /// How often `card_urls` are fetched. Default 10 s.
    #[serde(with = "humantime_serde")]
    pub card_poll_interval: Duration,
    /// Which local agent `/.well-known/agent-card.json` serves when the node hosts several. Default
    /// unset: the local agent with the smallest agent id.
    pub well_known_agent: Option<String>,
    /// `text` or `json`. Default `text`.
    pub log_format: LogFormat,
    /// A local sentence-transformers model directory (`config.json`, `model.safetensors`,
    /// `tokenizer.json`; BERT family) that search also ranks by meaning with. Default unset: words only.
    pub embedding_model: Option<PathBuf>,
    /// How `/api/v1/discovery/context` counts tokens unless a request names a tokenizer: `chars4`
    /// (four characters a token), or exactly with `cl100k_base` or `o200k_base`. Default `chars4`.
    pub tokenizer: String,
    /// Key that lets non-loopback clients write. Default unset: only loopback clients may write.
    pub api_key: Option<String>,
    /// A closed mesh's pre-shared key file (`/key/swarm/psk/1.0.0/` format, made by
    /// `agentmesh network-key`): only peers holding the same key can connect. Default unset: open mesh.
    pub network_key: Option<PathBuf>,
    /// PeerIds whose agents this node accepts from the mesh (its own always). Default empty: anyone
    /// whose signature verifies.
    pub allowed_publishers: Vec<PeerId>,
    /// Most agents one publisher may have: this node refuses a local registration past it (409, nothing
    /// written) and ignores a remote publisher's agents past it. Every node of a mesh should use the
    /// same value. Default 20,000; at most 250,000.
    pub max_agents_per_publisher: usize,
    /// Remote records held in all (memory: about 4.3 KB each); new remote agents beyond it are not
    /// taken until some leave the view. At least `max_agents_per_publisher`. Default 100,000.
    pub max_remote_records: usize,
    /// Established libp2p connections at most, inbound and outbound together; past it new ones are
    /// refused (`connections_denied` in `/api/v1/mesh/status`). A safety bound: a node settles between
    /// `peer_low` and `peer_high` connections. Default 512; 1 to 16,384.
    pub max_connections: u32,
    /// Connections the node keeps at least: below it, it dials peers it knows and lets Kademlia and
    /// mDNS dial. Default 8; 1 to `peer_high`.
    pub peer_low: usize,
    /// Connections the node keeps at most once settled: above it, it asks peers to part (its gossip
    /// mesh peers, then its bootstrap peers, only when nobody else will). Default 16; `peer_low` to
    /// `max_connections`.
    pub peer_high: usize,
    /// Start even if the store lost local agents it had acknowledged (truncated or corrupted files),
    /// continuing with what it holds. Default off: such a store is an error at start.
    pub accept_store_loss: bool,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            data_dir: PathBuf::from(defaults::DATA_DIR),
            http: defaults::HTTP_ADDR.parse().expect("default HTTP address is valid"),
            listen: vec![defaults::LISTEN_ADDR.parse().expect("default listen address is valid")],
            bootstrap: Vec::new(),
            mdns: defaults::MDNS,
            heartbeat_interval: defaults::HEARTBEAT_INTERVAL,
            degraded_after: defaults::DEGRADED_AFTER,
            inactive_after: defaults::INACTIVE_AFTER,
            evict_after: defaults::EVICT_AFTER,
            cards: Vec::new(),
            capabilities_dirs: Vec::new(),
            probe_interval: None,
            probe_path: defaults::PROBE_PATH.to_owned(),
            card_urls: Vec::new(),
            webhooks: Vec::new(),
            duplicate_capabilities: DuplicatePolicy::Route,
            card_poll_interval: defaults::CARD_POLL_INTERVAL,
            well_known_agent: None,
            log_format: LogFormat::Text,
            tokenizer: "chars4".to_owned(),
            embedding_model: None,
            api_key: None,
            network_key: None,
            allowed_publishers: Vec::new(),
            max_agents_per_publisher: defaults::MAX_AGENTS_PER_PUBLISHER,
            max_remote_records: defaults::MAX_REMOTE_RECORDS,
            max_connections: defaults::MAX_CONNECTIONS,
            peer_low: defaults::PEER_LOW,
            peer_high: defaults::PEER_HIGH,
            accept_store_loss: false,
        }
    }
}

impl fmt::Debug for Config {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Config")
            .field("data_dir", &self.data_dir)
            .field("http", &self.http)
            .field("listen", &self.listen)
            .field("bootstrap", &self.bootstrap)
            .field("mdns", &self.mdns)
            .field("heartbeat_interval", &self.heartbeat_interval)
            .field("degraded_after", &self.degraded_after)
            .field("inactive_after", &self.inactive_after)
            .field("evict_after", &self.evict_after)
            .field("cards", &self.cards)
            .field("capabilities_dirs", &self.capabilities_dirs)
            .field("probe_interval", &self.probe_interval)
            .field("probe_path", &self.probe_path)
            .field("card_urls", &self.card_urls)
            .field("webhooks", &self.webhooks.len())
            .field("duplicate_capabilities", &self.duplicate_capabilities)
            .field("card_poll_interval", &self.card_poll_interval)
            .field("well_known_agent", &self.well_known_agent)
            .field("log_format", &self.log_format)
            .field("tokenizer", &self.tokenizer)
            .field("embedding_model", &self.embedding_model)
            .field("api_key", &self.api_key.as_ref().map(|_| "<redacted>"))
            .field("network_key", &self.network_key)
            .field("allowed_publishers", &self.allowed_publishers)
            .field("max_agents_per_publisher", &self.max_agents_per_publisher)
            .field("max_remote_records", &self.max_remote_records)
            .field("max_connections", &self.max_connections)
            .field("peer_low", &self.peer_low)
            .field("peer_high", &self.peer_high)
            .field("accept_store_loss", &self.accept_store_loss)
            .finish()
    }
}

impl Config {
    /// Reads a TOML file over the defaults.
    pub fn from_file(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path)
            .map_err(|source| ConfigError::Read { path: path.to_owned(), source })?;
        Self::from_toml(&text).map_err(|message| ConfigError::Parse { path: path.to_owned(), message })
    }

    pub fn from_toml(text: &str) -> Result<Self, String> {
        toml::from_str(text).map_err(|e| e.to_string())
    }

    pub fn limits(&self) -> Limits {
        Limits { per_publisher: self.max_agents_per_publisher, remote_records: self.max_remote_records }
    }

    pub fn thresholds(&self) -> Thresholds {
        Thresholds { degraded_after: self.degraded_after, inactive_after: self.inactive_after }
    }

    /// Checks every value; the first bad one is named.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let invalid = |setting, reason: String| Err(ConfigError::Invalid { setting, reason });
        if self.data_dir.as_os_str().is_empty() {
            return invalid("data_dir", "must not be empty".into());
        }
        for addr in &self.bootstrap {
            let dialable = addr.iter().any(|p| {
                use libp2p::multiaddr::Protocol::*;
                matches!(p, Tcp(_) | Udp(_) | Dns(_) | Dns4(_) | Dns6(_) | Dnsaddr(_))
            });
            if !dialable {
                return invalid("bootstrap", format!("`{addr}` names no TCP/UDP port or DNS name to dial"));
            }
        }
        let per_publisher = self.max_agents_per_publisher;
        if !(1..=defaults::MAX_AGENTS_PER_PUBLISHER_CEILING).contains(&per_publisher) {
            let reason =
                format!("{per_publisher} must be 1 to {}", defaults::MAX_AGENTS_PER_PUBLISHER_CEILING);
            return invalid("max_agents_per_publisher", reason);
        }
        if !(per_publisher..=defaults::MAX_REMOTE_RECORDS_CEILING).contains(&self.max_remote_records) {
            let reason = format!(
                "{} must be at least max_agents_per_publisher ({per_publisher}) and at most {}",
                self.max_remote_records,
                defaults::MAX_REMOTE_RECORDS_CEILING
            );
            return invalid("max_remote_records", reason);
        }
        if !(1..=defaults::MAX_CONNECTIONS_CEILING).contains(&self.max_connections) {
            let reason =
                format!("{} must be 1 to {}", self.max_connections, defaults::MAX_CONNECTIONS_CEILING);
            return invalid("max_connections", reason);
        }
        if !(1..=self.peer_high).contains(&self.peer_low) {
            return invalid(
                "peer_low",
                format!("{} must be 1 to peer_high ({})", self.peer_low, self.peer_high),
            );
        }
        if self.peer_high > self.max_connections as usize {
            let reason =
                format!("{} must be at most max_connections ({})", self.peer_high, self.max_connections);
            return invalid("peer_high", reason);
        }
        if self.heartbeat_interval.is_zero() {
            return invalid("heartbeat_interval", "must be above zero".into());
        }
        // Each threshold must be longer than the one before it.
        let ladder = [
            ("heartbeat_interval", self.heartbeat_interval, "degraded_after", self.degraded_after),
            ("degraded_after", self.degraded_after, "inactive_after", self.inactive_after),
            ("inactive_after", self.inactive_after, "evict_after", self.evict_after),
        ];
        for (shorter_name, shorter, setting, longer) in ladder {
            if longer <= shorter {
                let reason =
                    format!("{} must be longer than {shorter_name} ({})", fmt_d(longer), fmt_d(shorter));
                return invalid(setting, reason);
            }
        }
        for (i, dir) in self.capabilities_dirs.iter().enumerate() {
            if dir.as_os_str().is_empty() {
                return invalid("capabilities_dirs", "an empty path".into());
            }
            if self.capabilities_dirs[..i].contains(dir) {
                return invalid("capabilities_dirs", format!("`{}` is listed twice", dir.display()));
            }
        }
        if self.probe_interval.is_some_and(|p| p.is_zero()) {
            return invalid("probe_interval", "must be above zero".into());
        }
        if !self.probe_path.starts_with('/') {
            return invalid("probe_path", format!("`{}` must start with /", self.probe_path));
        }
        for url in &self.card_urls {
            if !(url.starts_with("http://") || url.starts_with("https://")) {
                return invalid("card_urls", format!("`{url}` must be an http:// or https:// URL"));
            }
        }
        for hook in &self.webhooks {
            if let Err(e) = crate::webhook::Webhook::parse(hook) {
                return invalid("webhooks", e.to_string());
            }
        }
        if self.card_poll_interval.is_zero() {
            return invalid("card_poll_interval", "must be above zero".into());
        }
        if let Some(id) = &self.well_known_agent {
            if let Err(e) = crate::card::check_id("well_known_agent", id) {
                return invalid("well_known_agent", e.to_string());
            }
        }
        if crate::search::context::Counter::parse(&self.tokenizer).is_none() {
            return invalid(
                "tokenizer",
                format!("`{}`: use chars4, cl100k_base or o200k_base", self.tokenizer),
            );
        }
        if self.api_key.as_deref().is_some_and(|k| k.len() < 16) {
            return invalid("api_key", "must be at least 16 characters".into());
        }
        let quic = |a: &Multiaddr| a.iter().any(|p| matches!(p, libp2p::multiaddr::Protocol::QuicV1));
        if self.network_key.is_some() && self.listen.iter().any(quic) {
            return invalid("listen", "a closed mesh (network_key) listens on TCP only, not QUIC".into());
        }
        Ok(())
    }
}

fn fmt_d(d: Duration) -> String {
    humantime::format_duration(d).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_example_config_file_is_valid() {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/config");
        let mut checked = 0;
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.extension().is_some_and(|e| e == "toml") {
                let c = Config::from_file(&path).unwrap_or_else(|e| panic!("{e}"));
                c.validate().unwrap_or_else(|e| panic!("{}: {e}", path.display()));
                checked += 1;
            }
        }
        assert!(checked >= 4, "{checked} files");
    }

    #[test]
    fn defaults_are_valid_and_loopback() {
        let c = Config::default();
        c.validate().unwrap();
        assert!(c.http.ip().is_loopback());
        assert_eq!(c.http.port(), 8080);
    }

    #[test]
    fn file_overrides_some_keys_and_keeps_the_rest() {
        let c = Config::from_toml("http = \"127.0.0.1:9999\"\nheartbeat_interval = \"1s\"\n").unwrap();
        assert_eq!(c.http.port(), 9999);
        assert_eq!(c.heartbeat_interval, Duration::from_secs(1));
        assert_eq!(c.degraded_after, defaults::DEGRADED_AFTER);
    }

    #[test]
    fn search_settings_are_read_and_an_unknown_tokenizer_is_refused() {
        let c =
            Config::from_toml("embedding_model = \"models/minilm\"\ntokenizer = \"o200k_base\"\n").unwrap();
        assert_eq!(c.embedding_model, Some(PathBuf::from("models/minilm")));
        c.validate().unwrap();
        assert_eq!(Config::default().tokenizer, "chars4");
        let c = Config::from_toml("tokenizer = \"gpt2\"\n").unwrap();
        let e = c.validate().unwrap_err().to_string();
        assert!(e.contains("tokenizer") && e.contains("o200k_base"), "{e}");
    }

    #[test]
    fn capabilities_dirs_are_read_and_a_repeated_one_is_refused() {
        let c = Config::from_toml("capabilities_dirs = [\"caps/weather\", \"caps/mail\"]\n").unwrap();
        assert_eq!(c.capabilities_dirs, [PathBuf::from("caps/weather"), PathBuf::from("caps/mail")]);
        c.validate().unwrap();
        let c = Config::from_toml("capabilities_dirs = [\"caps\", \"caps\"]\n").unwrap();
        let e = c.validate().unwrap_err().to_string();
        assert!(e.contains("capabilities_dirs") && e.contains("twice"), "{e}");
    }

    #[test]
    fn unknown_or_mistyped_keys_are_named() {
        let e = Config::from_toml("htp = \"x\"").unwrap_err();
        assert!(e.contains("htp"), "{e}");
        let e = Config::from_toml("heartbeat_interval = \"soon\"").unwrap_err();
        assert!(e.contains("heartbeat_interval"), "{e}");
    }

    #[test]
    fn validation_names_the_setting() {
        let bad = |f: fn(&mut Config)| {
            let mut c = Config::default();
            f(&mut c);
            match c.validate().unwrap_err() {
                ConfigError::Invalid { setting, .. } => setting,
                other => panic!("{other}"),
            }
        };
        assert_eq!(bad(|c| c.bootstrap = vec!["/ip4/127.0.0.1".parse().unwrap()]), "bootstrap");
        assert_eq!(bad(|c| c.max_agents_per_publisher = 0), "max_agents_per_publisher");
        assert_eq!(bad(|c| c.max_remote_records = 10), "max_remote_records");
        assert_eq!(bad(|c| c.max_connections = 0), "max_connections");
        assert_eq!(bad(|c| c.peer_low = 0), "peer_low");
        assert_eq!(bad(|c| c.peer_low = c.peer_high + 1), "peer_low");
        assert_eq!(bad(|c| c.max_connections = c.peer_high as u32 - 1), "peer_high");
        assert_eq!(bad(|c| c.heartbeat_interval = Duration::ZERO), "heartbeat_interval");
        assert_eq!(bad(|c| c.degraded_after = Duration::from_secs(1)), "degraded_after");
        assert_eq!(bad(|c| c.inactive_after = Duration::from_secs(7)), "inactive_after");
        assert_eq!(bad(|c| c.evict_after = Duration::from_secs(1)), "evict_after");
        assert_eq!(bad(|c| c.api_key = Some("short".into())), "api_key");
    }

    #[test]
    fn addresses_and_peer_ids_are_parsed_once_and_named_when_bad() {
        let c = Config::from_toml(
            "listen = [\"/ip4/127.0.0.1/tcp/7\"]\nbootstrap = [\"/dns4/seed/tcp/4001\"]\n\
             allowed_publishers = [\"12D3KooWD3eckifWpRn9wQpMG9R9hX3sD158z7EqHWmweQAJU5SA\"]\n",
        )
        .unwrap();
        assert_eq!(c.listen[0].to_string(), "/ip4/127.0.0.1/tcp/7");
        assert_eq!(c.allowed_publishers.len(), 1);
        for (key, text) in
            [("listen", "not-an-addr"), ("bootstrap", "/ip4/1.2.3"), ("allowed_publishers", "QmNope")]
        {
            let e = Config::from_toml(&format!("{key} = [\"{text}\"]")).unwrap_err();
            assert!(e.contains(key), "{key}: {e}");
        }
    }

    #[test]
    fn debug_hides_the_api_key() {
        let c = Config { api_key: Some("super-secret-key-123".into()), ..Config::default() };
        assert!(!format!("{c:?}").contains("super-secret"));
    }

    #[test]
    fn example_configs_parse_and_validate() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("config");
        let mut seen = 0;
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.extension().is_some_and(|e| e == "toml") {
                Config::from_file(&path).unwrap().validate().unwrap();
                seen += 1;
            }
        }
        assert!(seen >= 2);
    }
}
