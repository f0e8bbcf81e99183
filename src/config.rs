//! Settings, layered: built-in defaults < TOML file < `AGENTMESH_*` environment < command-line flags.
//!
//! The file maps onto [`Config`] (missing keys keep their defaults, unknown keys are an error);
//! environment and flags arrive through [`crate::cli::RunArgs`], where clap reads each flag's variable.
//! [`Config::validate`] refuses bad values at start, naming the setting.

use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use libp2p::Multiaddr;
use serde::Deserialize;

use crate::defaults;
use crate::registry::health::Thresholds;

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config file {path}: {source}")]
    Read { path: PathBuf, source: std::io::Error },
    #[error("invalid config file {path}: {message}")]
    Parse { path: PathBuf, message: String },
    #[error("invalid setting `{setting}`: {reason}")]
    Invalid { setting: &'static str, reason: String },
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
    pub listen: Vec<String>,
    /// Peers to join at start (`/ip4/../tcp/../p2p/..`, `/dns4/..`). Default none.
    pub bootstrap: Vec<String>,
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
    /// How often `card_urls` are fetched. Default 10 s.
    #[serde(with = "humantime_serde")]
    pub card_poll_interval: Duration,
    /// Which local agent `/.well-known/agent-card.json` serves when the node hosts several. Default
    /// unset: the local agent with the smallest agent id.
    pub well_known_agent: Option<String>,
    /// `text` or `json`. Default `text`.
    pub log_format: LogFormat,
    /// Key that lets non-loopback clients write. Default unset: only loopback clients may write.
    pub api_key: Option<String>,
    /// A closed mesh's pre-shared key file (`/key/swarm/psk/1.0.0/` format, made by
    /// `agentmesh network-key`): only peers holding the same key can connect. Default unset: open mesh.
    pub network_key: Option<PathBuf>,
    /// PeerIds whose agents this node accepts from the mesh (its own always). Default empty: anyone
    /// whose signature verifies.
    pub allowed_publishers: Vec<String>,
    /// Start even if the store lost local agents it had acknowledged (truncated or corrupted files),
    /// continuing with what it holds. Default off: such a store is an error at start.
    pub accept_store_loss: bool,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            data_dir: PathBuf::from(defaults::DATA_DIR),
            http: defaults::HTTP_ADDR.parse().expect("default HTTP address is valid"),
            listen: vec![defaults::LISTEN_ADDR.to_owned()],
            bootstrap: Vec::new(),
            mdns: defaults::MDNS,
            heartbeat_interval: defaults::HEARTBEAT_INTERVAL,
            degraded_after: defaults::DEGRADED_AFTER,
            inactive_after: defaults::INACTIVE_AFTER,
            evict_after: defaults::EVICT_AFTER,
            cards: Vec::new(),
            probe_interval: None,
            probe_path: defaults::PROBE_PATH.to_owned(),
            card_urls: Vec::new(),
            card_poll_interval: defaults::CARD_POLL_INTERVAL,
            well_known_agent: None,
            log_format: LogFormat::Text,
            api_key: None,
            network_key: None,
            allowed_publishers: Vec::new(),
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
            .field("probe_interval", &self.probe_interval)
            .field("probe_path", &self.probe_path)
            .field("card_urls", &self.card_urls)
            .field("card_poll_interval", &self.card_poll_interval)
            .field("well_known_agent", &self.well_known_agent)
            .field("log_format", &self.log_format)
            .field("api_key", &self.api_key.as_ref().map(|_| "<redacted>"))
            .field("network_key", &self.network_key)
            .field("allowed_publishers", &self.allowed_publishers)
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

    pub fn thresholds(&self) -> Thresholds {
        Thresholds { degraded_after: self.degraded_after, inactive_after: self.inactive_after }
    }

    /// Checks every value; the first bad one is named.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let invalid = |setting, reason: String| Err(ConfigError::Invalid { setting, reason });
        if self.data_dir.as_os_str().is_empty() {
            return invalid("data_dir", "must not be empty".into());
        }
        for (setting, list) in [("listen", &self.listen), ("bootstrap", &self.bootstrap)] {
            for addr in list {
                if let Err(e) = addr.parse::<Multiaddr>() {
                    return invalid(setting, format!("`{addr}` is not a multiaddr: {e}"));
                }
            }
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
        if self.card_poll_interval.is_zero() {
            return invalid("card_poll_interval", "must be above zero".into());
        }
        if let Some(id) = &self.well_known_agent {
            if let Err(e) = crate::card::check_id("well_known_agent", id) {
                return invalid("well_known_agent", e.to_string());
            }
        }
        if self.api_key.as_deref().is_some_and(|k| k.len() < 16) {
            return invalid("api_key", "must be at least 16 characters".into());
        }
        for peer in &self.allowed_publishers {
            if let Err(e) = peer.parse::<libp2p::PeerId>() {
                return invalid("allowed_publishers", format!("`{peer}` is not a PeerId: {e}"));
            }
        }
        if self.network_key.is_some() && self.listen.iter().any(|a| a.contains("/quic")) {
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
        assert_eq!(bad(|c| c.bootstrap = vec!["not-an-addr".into()]), "bootstrap");
        assert_eq!(bad(|c| c.heartbeat_interval = Duration::ZERO), "heartbeat_interval");
        assert_eq!(bad(|c| c.degraded_after = Duration::from_secs(1)), "degraded_after");
        assert_eq!(bad(|c| c.inactive_after = Duration::from_secs(7)), "inactive_after");
        assert_eq!(bad(|c| c.evict_after = Duration::from_secs(1)), "evict_after");
        assert_eq!(bad(|c| c.api_key = Some("short".into())), "api_key");
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
