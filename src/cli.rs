//! The command line. `run` flags also read `AGENTMESH_*` variables (flags win); both beat the file.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};

use crate::config::{Config, ConfigError, LogFormat};
use crate::defaults;

#[derive(Debug, Parser)]
#[command(name = "agentmesh", version, about = "Decentralized discovery for AI agents")]
pub struct Cli {
    #[command(subcommand)]
    pub command: Option<Command>,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the daemon (the default when no command is given).
    Run(Box<RunArgs>),
    /// Print this node's PeerId (creating the identity if needed).
    Id {
        #[arg(long, env = "AGENTMESH_DATA_DIR", default_value = defaults::DATA_DIR)]
        data_dir: PathBuf,
    },
    /// Print a new pre-shared network key for a closed mesh (save it as a file readable only by the
    /// daemon's user, give every node of the mesh the same file with `--network-key`).
    NetworkKey,
    /// Show a running daemon's mesh: status and connected peers.
    Peers {
        /// Base URL of the daemon's HTTP API.
        #[arg(long, env = "AGENTMESH_API", default_value = DEFAULT_API)]
        api: String,
    },
    /// Find reasoners and skills in a running daemon's view (the discovery filters as flags).
    Discover(DiscoverArgs),
    /// List every agent in a running daemon's view with its health and publisher.
    Agents(AgentsArgs),
    /// Serve MCP on stdin/stdout for an MCP client (desktop assistants, IDEs, agent frameworks): the
    /// tools discover_capabilities and get_capability over a running daemon's view, each message
    /// carried to the daemon's `POST /mcp`.
    Mcp {
        /// Base URL of the daemon's HTTP API.
        #[arg(long, env = "AGENTMESH_API", default_value = DEFAULT_API)]
        api: String,
    },
    /// Offline card tools.
    #[command(subcommand)]
    Card(CardCommand),
}

#[derive(Debug, Subcommand)]
pub enum CardCommand {
    /// Check a card file (agentmesh or A2A) against every rule the daemon applies, and the signature
    /// it carries when its key id is a PeerId. Exits non-zero when it is not valid.
    Validate { file: PathBuf },
    /// Sign a card file with this node's key and print it (an A2A card by default).
    Sign {
        file: PathBuf,
        /// Data directory holding the node's identity key (created if missing).
        #[arg(long, env = "AGENTMESH_DATA_DIR", default_value = defaults::DATA_DIR)]
        data_dir: PathBuf,
        /// Output form.
        #[arg(long, value_enum, default_value_t = CardFormat::A2a)]
        format: CardFormat,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum CardFormat {
    /// The A2A 1.0 card with its `signatures`, as the daemon serves it.
    A2a,
    /// The agentmesh card with its `a2a_signature`.
    Agentmesh,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum OutputFormat {
    /// One row per reasoner and skill.
    Table,
    Json,
    Xml,
    Compact,
}

#[derive(Debug, Args)]
pub struct DiscoverArgs {
    /// Base URL of the daemon's HTTP API.
    #[arg(long, env = "AGENTMESH_API", default_value = DEFAULT_API)]
    pub api: String,
    /// Only this agent id (repeatable).
    #[arg(long = "agent", value_name = "ID")]
    pub agents: Vec<String>,
    /// Reasoner id pattern (`*` matches any run of characters).
    #[arg(long, value_name = "PATTERN")]
    pub reasoner: Option<String>,
    /// Skill id pattern.
    #[arg(long, value_name = "PATTERN")]
    pub skill: Option<String>,
    /// Tag pattern (repeatable: any of them).
    #[arg(long = "tag", value_name = "PATTERN")]
    pub tags: Vec<String>,
    /// active, degraded, inactive or unknown.
    #[arg(long, value_name = "HEALTH")]
    pub health: Option<String>,
    /// Include input schemas.
    #[arg(long)]
    pub input_schema: bool,
    /// Include output schemas.
    #[arg(long)]
    pub output_schema: bool,
    /// Include examples.
    #[arg(long)]
    pub examples: bool,
    /// Leave descriptions out.
    #[arg(long)]
    pub no_descriptions: bool,
    /// Agents per page (0-500; the daemon's default is 100).
    #[arg(long)]
    pub limit: Option<u32>,
    /// Agents to skip.
    #[arg(long)]
    pub offset: Option<u32>,
    /// Output: a readable table, or the daemon's json, xml or compact answer.
    #[arg(long, value_enum, default_value_t = OutputFormat::Table)]
    pub format: OutputFormat,
}

#[derive(Debug, Args)]
pub struct AgentsArgs {
    /// Base URL of the daemon's HTTP API.
    #[arg(long, env = "AGENTMESH_API", default_value = DEFAULT_API)]
    pub api: String,
    /// Agents per page (0-1000).
    #[arg(long, default_value_t = 100)]
    pub limit: u32,
    /// Agents to skip.
    #[arg(long, default_value_t = 0)]
    pub offset: u32,
    /// Print the daemon's JSON instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// Where the CLI client finds the daemon by default.
pub const DEFAULT_API: &str = "http://127.0.0.1:8080";

fn duration(s: &str) -> Result<Duration, String> {
    humantime::parse_duration(s).map_err(|e| e.to_string())
}

#[derive(Debug, Default, Args)]
pub struct RunArgs {
    /// TOML config file (see config/).
    #[arg(long, env = "AGENTMESH_CONFIG", value_name = "PATH")]
    pub config: Option<PathBuf>,
    /// Data directory: identity key and store.
    #[arg(long, env = "AGENTMESH_DATA_DIR", value_name = "DIR")]
    pub data_dir: Option<PathBuf>,
    /// HTTP API address.
    #[arg(long, env = "AGENTMESH_HTTP", value_name = "ADDR")]
    pub http: Option<SocketAddr>,
    /// libp2p listen multiaddr (repeatable; comma-separated in the variable).
    #[arg(long, env = "AGENTMESH_LISTEN", value_name = "MULTIADDR", value_delimiter = ',')]
    pub listen: Vec<libp2p::Multiaddr>,
    /// Bootstrap peer multiaddr (repeatable; comma-separated in the variable).
    #[arg(long, env = "AGENTMESH_BOOTSTRAP", value_name = "MULTIADDR", value_delimiter = ',')]
    pub bootstrap: Vec<libp2p::Multiaddr>,
    /// Turn mDNS discovery off.
    #[arg(long, env = "AGENTMESH_NO_MDNS")]
    pub no_mdns: bool,
    /// How often this node announces its agents (e.g. 2s).
    #[arg(long, env = "AGENTMESH_HEARTBEAT_INTERVAL", value_name = "DURATION", value_parser = duration)]
    pub heartbeat_interval: Option<Duration>,
    /// Heartbeat age that makes an agent degraded.
    #[arg(long, env = "AGENTMESH_DEGRADED_AFTER", value_name = "DURATION", value_parser = duration)]
    pub degraded_after: Option<Duration>,
    /// Heartbeat age that makes an agent inactive.
    #[arg(long, env = "AGENTMESH_INACTIVE_AFTER", value_name = "DURATION", value_parser = duration)]
    pub inactive_after: Option<Duration>,
    /// Heartbeat age after which a remote agent is evicted.
    #[arg(long, env = "AGENTMESH_EVICT_AFTER", value_name = "DURATION", value_parser = duration)]
    pub evict_after: Option<Duration>,
    /// Card file (JSON) to register at start (repeatable; comma-separated in the variable).
    #[arg(long = "card", env = "AGENTMESH_CARDS", value_name = "PATH", value_delimiter = ',')]
    pub cards: Vec<PathBuf>,
    /// Capability-manifest directory: one local agent from its CAPABILITY.yaml files, reloaded when
    /// they change (repeatable; comma-separated in the variable).
    #[arg(
        long = "capabilities-dir",
        env = "AGENTMESH_CAPABILITIES_DIRS",
        value_name = "DIR",
        value_delimiter = ','
    )]
    pub capabilities_dirs: Vec<PathBuf>,
    /// Probe local card/native agents this often (GET base_url + probe path); unset: no probes.
    #[arg(long, env = "AGENTMESH_PROBE_INTERVAL", value_name = "DURATION", value_parser = duration)]
    pub probe_interval: Option<Duration>,
    /// Path probed under each agent's base_url.
    #[arg(long, env = "AGENTMESH_PROBE_PATH", value_name = "PATH")]
    pub probe_path: Option<String>,
    /// URL of a local agent's card to poll and republish on change (repeatable; comma-separated in
    /// the variable), e.g. http://127.0.0.1:9000/.well-known/agent-card.json.
    #[arg(long = "card-url", env = "AGENTMESH_CARD_URLS", value_name = "URL", value_delimiter = ',')]
    pub card_urls: Vec<String>,
    /// What an HTTP registration offering a capability id another agent already offers gets: route
    /// (accepted; resolve picks one) or reject (409).
    #[arg(long, env = "AGENTMESH_DUPLICATE_CAPABILITIES", value_name = "POLICY")]
    pub duplicate_capabilities: Option<crate::config::DuplicatePolicy>,
    /// A URL that receives the watch stream's events as signed POSTs (repeatable; space-separated in the
    /// variable), with discovery filters after #: http://127.0.0.1:9000/hook#tags=payments
    #[arg(long = "webhook", env = "AGENTMESH_WEBHOOKS", value_name = "URL[#FILTERS]", value_delimiter = ' ')]
    pub webhooks: Vec<String>,
    /// How often card URLs are fetched.
    #[arg(long, env = "AGENTMESH_CARD_POLL_INTERVAL", value_name = "DURATION", value_parser = duration)]
    pub card_poll_interval: Option<Duration>,
    /// The local agent served at /.well-known/agent-card.json when the node hosts several.
    #[arg(long, env = "AGENTMESH_WELL_KNOWN_AGENT", value_name = "AGENT_ID")]
    pub well_known_agent: Option<String>,
    /// Log format.
    #[arg(long, env = "AGENTMESH_LOG_FORMAT", value_enum)]
    pub log_format: Option<LogFormat>,
    /// How the context tiers count tokens by default: chars4, cl100k_base or o200k_base.
    #[arg(long, env = "AGENTMESH_TOKENIZER", value_name = "NAME")]
    pub tokenizer: Option<String>,
    /// A local sentence-transformers model directory (config.json, model.safetensors,
    /// tokenizer.json) that search also ranks by meaning with.
    #[arg(long, env = "AGENTMESH_EMBEDDING_MODEL", value_name = "DIR")]
    pub embedding_model: Option<PathBuf>,
    /// Key that lets non-loopback clients write (prefer the variable: flags show in `ps`).
    #[arg(long, env = "AGENTMESH_API_KEY", value_name = "KEY", hide_env_values = true)]
    pub api_key: Option<String>,
    /// Closed mesh: pre-shared network key file (from `agentmesh network-key`).
    #[arg(long, env = "AGENTMESH_NETWORK_KEY", value_name = "PATH")]
    pub network_key: Option<PathBuf>,
    /// Closed mesh: a PeerId whose agents are accepted (repeatable; comma-separated in the variable).
    #[arg(
        long = "allow-publisher",
        env = "AGENTMESH_ALLOWED_PUBLISHERS",
        value_name = "PEER_ID",
        value_delimiter = ','
    )]
    pub allowed_publishers: Vec<libp2p::PeerId>,
    /// Most agents one publisher may have (this node's local registrations included); every node of
    /// a mesh should use the same value.
    #[arg(long, env = "AGENTMESH_MAX_AGENTS_PER_PUBLISHER", value_name = "N")]
    pub max_agents_per_publisher: Option<usize>,
    /// Remote records held in all (memory: about 4.3 KB each).
    #[arg(long, env = "AGENTMESH_MAX_REMOTE_RECORDS", value_name = "N")]
    pub max_remote_records: Option<usize>,
    /// Established libp2p connections at most (default 512).
    #[arg(long, env = "AGENTMESH_MAX_CONNECTIONS", value_name = "N")]
    pub max_connections: Option<u32>,
    /// Connections kept at least (default 8): below it, the node dials peers it knows.
    #[arg(long, env = "AGENTMESH_PEER_LOW", value_name = "N")]
    pub peer_low: Option<usize>,
    /// Connections kept at most once settled (default 16): above it, the node asks peers to part.
    #[arg(long, env = "AGENTMESH_PEER_HIGH", value_name = "N")]
    pub peer_high: Option<usize>,
    /// Start even if the store lost local agents it had acknowledged (see SECURITY.md).
    #[arg(long, env = "AGENTMESH_ACCEPT_STORE_LOSS")]
    pub accept_store_loss: bool,
}

impl RunArgs {
    /// Defaults, then the file, then these values (flags or their variables); validated.
    pub fn resolve(&self) -> Result<Config, ConfigError> {
        let mut c = match &self.config {
            Some(path) => Config::from_file(path)?,
            None => Config::default(),
        };
        if let Some(v) = &self.data_dir {
            c.data_dir = v.clone();
        }
        if let Some(v) = self.http {
            c.http = v;
        }
        if !self.listen.is_empty() {
            c.listen = self.listen.clone();
        }
        if !self.bootstrap.is_empty() {
            c.bootstrap = self.bootstrap.clone();
        }
        if self.no_mdns {
            c.mdns = false;
        }
        for (slot, value) in [
            (&mut c.heartbeat_interval, self.heartbeat_interval),
            (&mut c.degraded_after, self.degraded_after),
            (&mut c.inactive_after, self.inactive_after),
            (&mut c.evict_after, self.evict_after),
        ] {
            if let Some(v) = value {
                *slot = v;
            }
        }
        if !self.cards.is_empty() {
            c.cards = self.cards.clone();
        }
        if !self.capabilities_dirs.is_empty() {
            c.capabilities_dirs = self.capabilities_dirs.clone();
        }
        if let Some(v) = self.probe_interval {
            c.probe_interval = Some(v);
        }
        if let Some(v) = &self.probe_path {
            c.probe_path = v.clone();
        }
        if !self.card_urls.is_empty() {
            c.card_urls = self.card_urls.clone();
        }
        if !self.webhooks.is_empty() {
            c.webhooks = self.webhooks.clone();
        }
        if let Some(v) = self.duplicate_capabilities {
            c.duplicate_capabilities = v;
        }
        if let Some(v) = self.card_poll_interval {
            c.card_poll_interval = v;
        }
        if let Some(v) = &self.well_known_agent {
            c.well_known_agent = Some(v.clone());
        }
        if let Some(v) = self.log_format {
            c.log_format = v;
        }
        if let Some(v) = &self.tokenizer {
            c.tokenizer = v.clone();
        }
        if let Some(v) = &self.embedding_model {
            c.embedding_model = Some(v.clone());
        }
        if let Some(v) = &self.api_key {
            c.api_key = Some(v.clone());
        }
        if let Some(v) = &self.network_key {
            c.network_key = Some(v.clone());
        }
        if !self.allowed_publishers.is_empty() {
            c.allowed_publishers = self.allowed_publishers.clone();
        }
        if let Some(v) = self.max_agents_per_publisher {
            c.max_agents_per_publisher = v;
        }
        if let Some(v) = self.max_remote_records {
            c.max_remote_records = v;
        }
        if let Some(v) = self.max_connections {
            c.max_connections = v;
        }
        if let Some(v) = self.peer_low {
            c.peer_low = v;
        }
        if let Some(v) = self.peer_high {
            c.peer_high = v;
        }
        if self.accept_store_loss {
            c.accept_store_loss = true;
        }
        c.validate()?;
        Ok(c)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run_args(args: &[&str]) -> Result<RunArgs, clap::Error> {
        let cli = Cli::try_parse_from(std::iter::once("agentmesh").chain(args.iter().copied()))?;
        match cli.command {
            Some(Command::Run(r)) => Ok(*r),
            other => panic!("{other:?}"),
        }
    }

    /// One test, because the environment is process-wide.
    #[test]
    fn precedence_is_defaults_file_env_flags() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("c.toml");
        std::fs::write(
            &file,
            "http = \"127.0.0.1:1111\"\ndegraded_after = \"9s\"\ninactive_after = \"30s\"\n",
        )
        .unwrap();
        let file = file.to_str().unwrap();

        let c = run_args(&["run", "--config", file]).unwrap().resolve().unwrap();
        assert_eq!(c.http.port(), 1111, "file beats default");
        assert_eq!(c.degraded_after, Duration::from_secs(9));
        assert_eq!(c.heartbeat_interval, defaults::HEARTBEAT_INTERVAL, "default kept");

        std::env::set_var("AGENTMESH_HTTP", "127.0.0.1:2222");
        std::env::set_var("AGENTMESH_BOOTSTRAP", "/ip4/127.0.0.1/tcp/1,/ip4/127.0.0.1/tcp/2");
        let c = run_args(&["run", "--config", file]).unwrap().resolve().unwrap();
        assert_eq!(c.http.port(), 2222, "env beats file");
        assert_eq!(c.bootstrap.len(), 2);
        let c = run_args(&["run", "--config", file, "--http", "127.0.0.1:3333", "--no-mdns"])
            .unwrap()
            .resolve()
            .unwrap();
        assert_eq!(c.http.port(), 3333, "flag beats env");
        assert!(!c.mdns);

        std::env::set_var("AGENTMESH_HTTP", "nonsense");
        let e = run_args(&["run"]).unwrap_err().to_string();
        assert!(e.contains("--http"), "{e}");
        std::env::remove_var("AGENTMESH_HTTP");
        std::env::remove_var("AGENTMESH_BOOTSTRAP");

        let c = run_args(&["run", "--capabilities-dir", "a", "--capabilities-dir", "b"])
            .unwrap()
            .resolve()
            .unwrap();
        assert_eq!(c.capabilities_dirs, [PathBuf::from("a"), PathBuf::from("b")]);
        std::env::set_var("AGENTMESH_CAPABILITIES_DIRS", "x,y");
        let c = run_args(&["run"]).unwrap().resolve().unwrap();
        assert_eq!(
            c.capabilities_dirs,
            [PathBuf::from("x"), PathBuf::from("y")],
            "the variable, comma-separated"
        );
        std::env::remove_var("AGENTMESH_CAPABILITIES_DIRS");

        let e = run_args(&["run", "--heartbeat-interval", "fast"]).unwrap_err().to_string();
        assert!(e.contains("--heartbeat-interval"), "{e}");
        let e = run_args(&["run", "--bootstrap", "not-an-addr"]).unwrap_err().to_string();
        assert!(e.contains("--bootstrap"), "{e}");
        let e = run_args(&["run", "--allow-publisher", "nobody"]).unwrap_err().to_string();
        assert!(e.contains("--allow-publisher"), "{e}");
        let e = run_args(&["run", "--max-remote-records", "5"]).unwrap().resolve().unwrap_err();
        assert!(e.to_string().contains("max_remote_records"), "{e}");
        let e = run_args(&["run", "--degraded-after", "1s"]).unwrap().resolve().unwrap_err();
        assert!(e.to_string().contains("degraded_after"), "{e}");
    }
}
