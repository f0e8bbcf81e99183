//! The node: wires identity, registry, card files, capability manifests and the HTTP API together and
//! owns their shutdown.

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use libp2p::identity::PeerId;
use libp2p::pnet::PreSharedKey;
use tokio_util::sync::CancellationToken;

use crate::api::{self, AppState};
use crate::card::{AgentCard, CardError};
use crate::clock::now_millis;
use crate::config::Config;
use crate::defaults::{
    EVICT_SWEEP_MAX, STORE_DIR, STORE_REOPEN_CHECK, STORE_REOPEN_ROWS, STORE_REOPEN_ROWS_BUSY,
};
use crate::identity::{Identity, IdentityError};
use crate::manifest::reload::Reloader;
use crate::net::{self, NetConfig, NetError, NetHandle};
use crate::registry::{Liveness, Registry, RegistryError, LOCAL_BATCH};
use crate::search::context::Counter;
use crate::search::semantic::Semantic;
use crate::tasks::{TaskError, Tasks, Ticks};

/// How long shutdown waits for open HTTP requests.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(3);

#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    #[error(transparent)]
    Identity(#[from] IdentityError),
    #[error(transparent)]
    Registry(#[from] RegistryError),
    #[error("cannot read card file {path}: {source}")]
    CardRead { path: PathBuf, source: std::io::Error },
    #[error("invalid card file {path}: {source}")]
    CardInvalid { path: PathBuf, source: CardError },
    #[error(transparent)]
    Manifests(#[from] crate::manifest::reload::ReloadError),
    #[error("cannot listen for HTTP on {addr}: {source}")]
    Bind { addr: SocketAddr, source: std::io::Error },
    #[error(transparent)]
    Task(#[from] TaskError),
    #[error(transparent)]
    Net(#[from] NetError),
    #[error("cannot load the embedding model: {0}")]
    Semantic(#[from] crate::search::semantic::SemanticError),
    #[error(transparent)]
    Webhook(#[from] crate::webhook::WebhookError),
    #[error("cannot read network key file {path}: {reason}")]
    NetworkKey { path: PathBuf, reason: String },
}

/// Reads a pre-shared network key file; the error names the file, never the key.
pub fn read_network_key(path: &std::path::Path) -> Result<PreSharedKey, NodeError> {
    let err = |reason: String| NodeError::NetworkKey { path: path.to_owned(), reason };
    let text = std::fs::read_to_string(path).map_err(|e| err(e.to_string()))?;
    text.parse::<PreSharedKey>().map_err(|e| err(format!("not a `/key/swarm/psk/1.0.0/` key: {e:?}")))
}

/// The embedding cache, under the data dir.
const EMBEDDINGS_DIR: &str = "embeddings";
/// How often the embedding task looks for a changed view.
const EMBED_POLL: Duration = Duration::from_millis(500);

/// Keeps capability embeddings in step with the view, off the request path: on each view change it
/// embeds what is new (a blocking thread, batch by batch), starting over when the view moves on.
async fn embed_view(
    engine: Arc<crate::search::Engine>,
    registry: Arc<Registry>,
    cancel: CancellationToken,
) -> Result<(), crate::search::semantic::SemanticError> {
    let mut done = None;
    let mut ticks = Ticks::new(EMBED_POLL, cancel.clone());
    while ticks.next().await {
        let snapshot = registry.snapshot();
        if done == Some(snapshot.generation) {
            continue;
        }
        let (engine, registry, cancel) = (engine.clone(), registry.clone(), cancel.clone());
        let generation = snapshot.generation;
        let started = std::time::Instant::now();
        let computed = tokio::task::spawn_blocking(move || {
            engine
                .catch_up(&snapshot, || cancel.is_cancelled() || registry.snapshot().generation != generation)
        })
        .await
        .map_err(|e| crate::search::semantic::SemanticError::Background(e.to_string()))??;
        if computed > 0 {
            tracing::info!(target: "agentmesh::search", computed, took_ms = started.elapsed().as_millis() as u64, "capabilities embedded");
        }
        done = Some(generation);
    }
    Ok(())
}

/// How long shutdown waits for the goodbye to leave.
const LEAVE_GRACE: Duration = Duration::from_secs(2);

/// A running node. Drop does not stop it; call [`Node::shutdown`].
pub struct Node {
    peer_id: PeerId,
    http_addr: SocketAddr,
    registry: Arc<Registry>,
    tasks: Tasks,
    net: NetHandle,
}

impl Node {
    /// Opens the data dir, registers the configured card files and starts serving.
    pub async fn start(config: Config) -> Result<Self, NodeError> {
        let psk = config.network_key.as_deref().map(read_network_key).transpose()?;
        // Before anything is opened: a misspelt directory should stop the start, not serve nothing.
        crate::manifest::reload::check_dirs(&config.capabilities_dirs)?;
        let identity = Identity::load_or_create(&config.data_dir)?;
        let peer_id = identity.peer_id();
        let store_dir = config.data_dir.join(STORE_DIR);
        let thresholds = config.thresholds();
        let signer = identity.keypair().clone();
        let accept_loss = config.accept_store_loss;
        let limits = config.limits();
        let (registry, report) = tokio::task::spawn_blocking(move || {
            Registry::open_checked(&store_dir, signer, thresholds, limits, accept_loss)
        })
        .await
        .map_err(|e| TaskError::Failed { task: "store open", reason: e.to_string() })??;
        tracing::info!(
            %peer_id,
            local = report.local,
            remote = report.remote,
            unreadable = report.unreadable,
            rewrite = report.rewrite,
            "store opened"
        );
        let registry = Arc::new(registry);
        let allowed_publishers: Option<Arc<HashSet<PeerId>>> = (!config.allowed_publishers.is_empty())
            .then(|| Arc::new(config.allowed_publishers.iter().copied().collect()));
        if let Some(allowed) = &allowed_publishers {
            // What an earlier run stored from publishers now outside the list goes.
            let forgotten = registry.forget_publishers(|p| allowed.contains(p)).await?;
            tracing::info!(allowed = allowed.len(), forgotten, "closed mesh: publisher allow-list");
        }
        if let Some(psk) = &psk {
            tracing::info!(fingerprint = %psk.fingerprint(), "closed mesh: network key");
        }

        register_card_files(&registry, &config.cards).await?;

        let net_config = NetConfig {
            listen: config.listen.clone(),
            bootstrap: config.bootstrap.clone(),
            mdns: config.mdns,
            heartbeat_interval: config.heartbeat_interval,
            max_connections: config.max_connections,
            peers: crate::proto::target::Bounds { low: config.peer_low, high: config.peer_high },
            psk,
            allowed_publishers,
        };
        let mut tasks = Tasks::new(CancellationToken::new());
        let mut libp2p_metrics = prometheus_client::registry::Registry::default();
        let keypair = identity.keypair().clone();
        let net = net::spawn(net_config, keypair, registry.clone(), &mut libp2p_metrics, &mut tasks).await?;

        let tokenizer = Counter::parse(&config.tokenizer).unwrap_or_default();
        // Exact tokenizers load their tables once, here, not in the first request.
        tokio::task::spawn_blocking(move || tokenizer.warm())
            .await
            .map_err(|e| TaskError::Failed { task: "tokenizer load", reason: e.to_string() })?;
        let listener = tokio::net::TcpListener::bind(config.http)
            .await
            .map_err(|source| NodeError::Bind { addr: config.http, source })?;
        let http_addr =
            listener.local_addr().map_err(|source| NodeError::Bind { addr: config.http, source })?;
        if !http_addr.ip().is_loopback() && config.api_key.is_none() {
            tracing::warn!(%http_addr, "HTTP API is reachable beyond loopback; without an api_key only loopback clients can write");
        }
        let mut state = AppState::new(registry.clone(), config.api_key.clone())
            .with_net(net.clone())
            .with_libp2p_metrics(libp2p_metrics)
            .with_well_known_agent(config.well_known_agent.clone())
            .with_duplicates(config.duplicate_capabilities)
            .with_tokenizer(tokenizer);
        if let Some(model) = config.embedding_model.clone() {
            let cache = config.data_dir.join(EMBEDDINGS_DIR);
            let semantic =
                tokio::task::spawn_blocking(move || Semantic::load(&model, Some(&cache))).await.map_err(
                    |e| TaskError::Failed { task: "embedding model load", reason: e.to_string() },
                )??;
            tracing::info!(model = %semantic.model_id(), "embedding model loaded: search ranks by meaning too");
            let engine = Arc::new(crate::search::Engine::with_semantic(Arc::new(semantic)));
            state = state.with_search(engine.clone());
            tasks.spawn("capability embedding", embed_view(engine, registry.clone(), tasks.token()));
        }
        if !config.capabilities_dirs.is_empty() {
            // Registered before the API serves, like card files; reloads follow in the task.
            let reloader = Reloader::start(
                registry.clone(),
                config.capabilities_dirs.clone(),
                crate::manifest::reload::node_base_url(http_addr),
            )
            .await?;
            state = state.with_manifests(reloader.manifests());
            tasks.spawn("capability manifests", reloader.run(tasks.token()));
        }
        if !config.webhooks.is_empty() {
            // Webhooks are told of every change from now on: the watch takes the view as it is now.
            state.watch.wake_on(&registry);
        }
        tasks.spawn_loop("watcher", crate::watch::run(registry.clone(), state.watch.clone(), tasks.token()));
        for spec in &config.webhooks {
            // Validated with the config: a refusal here is the same refusal.
            let hook = crate::webhook::Webhook::parse(spec)?;
            tracing::info!(webhook = %hook.name(), "webhook configured");
            let deliveries = crate::webhook::run(
                hook,
                state.watch.clone(),
                *registry.thresholds(),
                identity.keypair().clone(),
                tasks.token(),
            );
            tasks.spawn_loop("webhook", deliveries);
        }
        tasks.spawn_loop("store reopening", reopen_store(registry.clone(), tasks.token()));
        tasks.spawn_loop(
            "eviction",
            evict(
                registry.clone(),
                evict_sweep_every(config.heartbeat_interval, config.evict_after),
                config.evict_after,
                tasks.token(),
            ),
        );
        let app = api::router(state);
        if !config.card_urls.is_empty() {
            let poll = crate::probe::poll_cards(
                registry.clone(),
                config.card_urls.clone(),
                config.card_poll_interval,
                config.data_dir.clone(),
                tasks.token(),
            );
            tasks.spawn("card url polling", poll);
        }
        if let Some(interval) = config.probe_interval {
            let probes =
                crate::probe::run(registry.clone(), interval, config.probe_path.clone(), tasks.token());
            tasks.spawn("probes", probes);
        }
        tasks.spawn("http server", api::server::serve(listener, app, tasks.token(), SHUTDOWN_GRACE));
        tracing::info!(%http_addr, %peer_id, "node started");
        Ok(Self { peer_id, http_addr, registry, tasks, net })
    }

    pub fn peer_id(&self) -> PeerId {
        self.peer_id
    }

    /// The bound HTTP address (useful with port 0).
    pub fn http_addr(&self) -> SocketAddr {
        self.http_addr
    }

    pub fn registry(&self) -> &Arc<Registry> {
        &self.registry
    }

    pub fn net(&self) -> &NetHandle {
        &self.net
    }

    /// Resolves when a task of the node stops, fails or panics (never for a healthy node), naming it.
    pub async fn failed(&mut self) -> NodeError {
        NodeError::Task(self.tasks.failed().await)
    }

    /// Stops the node abruptly, as a crash would: no goodbye to the mesh, no flush (tests).
    pub fn kill(self) {
        self.tasks.abort();
    }

    /// Says goodbye to the mesh, stops serving (open requests get a grace period) and flushes the store.
    pub async fn shutdown(self) -> Result<(), NodeError> {
        if tokio::time::timeout(LEAVE_GRACE, self.net.leave()).await.is_err() {
            tracing::warn!("mesh goodbye timed out");
        }
        // The HTTP server gives open requests `SHUTDOWN_GRACE` itself; the rest stop at once.
        self.tasks.shutdown(SHUTDOWN_GRACE + Duration::from_secs(1)).await;
        self.registry.flush().await?;
        tracing::info!(peer_id = %self.peer_id, "node stopped");
        Ok(())
    }
}

/// How often the eviction sweep runs: about twenty times per `evict_after`, within
/// `[heartbeat_interval, EVICT_SWEEP_MAX]`. A sweep reads every record of the view; at every heartbeat
/// interval (2 s) with the default `evict_after` (10 min), it read the whole view 300 times per
/// eviction window.
fn evict_sweep_every(heartbeat_interval: Duration, evict_after: Duration) -> Duration {
    (evict_after / 20).min(EVICT_SWEEP_MAX).max(heartbeat_interval)
}

/// Drops remote records not heard of for `evict_after`, every `every`. One sweep at a time: the next
/// tick waits for the sweep before it.
async fn evict(registry: Arc<Registry>, every: Duration, evict_after: Duration, cancel: CancellationToken) {
    let mut ticks = Ticks::new(every, cancel);
    while ticks.next().await {
        match registry.evict(now_millis(), evict_after).await {
            Ok(0) => {}
            Ok(evicted) => tracing::info!(evicted, "evicted silent remote agents"),
            Err(error) => tracing::warn!(%error, "eviction failed"),
        }
    }
}

/// Reopens the store when [`store_reopen_due`] says so, to give back the memory sled holds for the rows
/// written (a joiner's catch-up, a bulk registration); first, at its first tick, writes again the rows
/// the store opened with in an older form ([`Registry::rewrite_rows`]).
async fn reopen_store(registry: Arc<Registry>, cancel: CancellationToken) {
    let mut ticks = Ticks::new(STORE_REOPEN_CHECK, cancel);
    let mut before = 0;
    while ticks.next().await {
        if registry.rows_to_rewrite() > 0 {
            // Rows an older version wrote (or this node had not sealed): written once in the current
            // form, so the next start takes them on their seal without compressing them again.
            let started = std::time::Instant::now();
            match registry.rewrite_rows().await {
                Ok(rows) => tracing::info!(
                    rows,
                    took_ms = started.elapsed().as_millis() as u64,
                    "store rows written again in the current form"
                ),
                Err(error) => tracing::warn!(%error, "writing store rows again failed; tried again later"),
            }
        }
        let written = registry.rows_written();
        if store_reopen_due(written, before) {
            let started = std::time::Instant::now();
            match registry.reopen_store().await {
                Ok(()) => tracing::info!(
                    rows = written,
                    took_ms = started.elapsed().as_millis() as u64,
                    "store reopened to release memory"
                ),
                Err(error) => {
                    tracing::error!(%error, "store reopen failed; writes fail until a retry succeeds")
                }
            }
        }
        before = registry.rows_written();
    }
}

/// Whether the store is due a reopen, given the rows written since it was opened now and one check
/// before: enough of them, and writing has paused (or has gone on long enough).
fn store_reopen_due(written: usize, before: usize) -> bool {
    written >= STORE_REOPEN_ROWS && (written == before || written >= STORE_REOPEN_ROWS_BUSY)
}

/// Registers the card files `paths` name, [`LOCAL_BATCH`] at a time: one witness write and one store
/// flush per batch, where one at a time cost a few milliseconds of fsyncs each, and never more than a
/// batch of parsed cards held at once. Two files naming the same agent: the later one is registered.
async fn register_card_files(registry: &Registry, paths: &[PathBuf]) -> Result<(), NodeError> {
    let files = card_files(paths).await?;
    let mut first_file: HashMap<String, &PathBuf> = HashMap::new();
    for chunk in files.chunks(LOCAL_BATCH) {
        let mut cards = Vec::with_capacity(chunk.len());
        for path in chunk {
            let card = read_card_file(path).await?;
            if let Some(earlier) = first_file.insert(card.agent_id.clone(), path) {
                tracing::warn!(
                    path = %path.display(),
                    earlier = %earlier.display(),
                    agent_id = %card.agent_id,
                    "two card files name the same agent: the later one is registered"
                );
            }
            cards.push(card);
        }
        let agent_ids: Vec<String> = cards.iter().map(|c| c.agent_id.clone()).collect();
        let outcomes = registry.register_local_many(cards, Liveness::Node, now_millis()).await?;
        for ((path, agent_id), applied) in chunk.iter().zip(&agent_ids).zip(&outcomes) {
            tracing::info!(path = %path.display(), %agent_id, ?applied, "card file registered");
        }
    }
    Ok(())
}

/// One card file, its `${VAR}` placeholders filled from the environment.
async fn read_card_file(path: &PathBuf) -> Result<AgentCard, NodeError> {
    let bytes =
        tokio::fs::read(path).await.map_err(|source| NodeError::CardRead { path: path.clone(), source })?;
    let invalid = |source| NodeError::CardInvalid { path: path.clone(), source };
    let text = std::str::from_utf8(&bytes)
        .map_err(|e| invalid(CardError::Malformed { field: ".".into(), reason: e.to_string() }))?;
    let text = crate::card::expand_placeholders(text, |name| std::env::var(name).ok()).map_err(invalid)?;
    AgentCard::from_json_any(text.as_bytes()).map_err(invalid)
}

/// The card files to register at start: each path as given, or for a directory every `*.json` file
/// in it, in name order.
async fn card_files(paths: &[PathBuf]) -> Result<Vec<PathBuf>, NodeError> {
    let mut files = Vec::new();
    for path in paths {
        let read_err = |source| NodeError::CardRead { path: path.clone(), source };
        if !tokio::fs::metadata(path).await.map_err(read_err)?.is_dir() {
            files.push(path.clone());
            continue;
        }
        let mut found = Vec::new();
        let mut dir = tokio::fs::read_dir(path).await.map_err(read_err)?;
        while let Some(entry) = dir.next_entry().await.map_err(read_err)? {
            let file = entry.path();
            if file.extension().is_some_and(|e| e == "json") {
                found.push(file);
            }
        }
        found.sort();
        files.extend(found);
    }
    Ok(files)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_store_is_reopened_after_a_burst_once_writing_pauses_or_after_a_long_one() {
        let n = STORE_REOPEN_ROWS;
        assert!(!store_reopen_due(0, 0), "nothing written");
        assert!(!store_reopen_due(n - 1, n - 1), "too few rows to matter");
        assert!(!store_reopen_due(n + 10, n), "still writing");
        assert!(store_reopen_due(n, n), "a burst that has paused");
        assert!(store_reopen_due(STORE_REOPEN_ROWS_BUSY, STORE_REOPEN_ROWS_BUSY - 1), "writing for long");
    }

    #[test]
    fn eviction_sweeps_about_twenty_times_per_window_within_its_bounds() {
        let s = Duration::from_secs;
        let ms = Duration::from_millis;
        assert_eq!(
            evict_sweep_every(s(2), crate::defaults::EVICT_AFTER),
            EVICT_SWEEP_MAX,
            "10 min: every 30 s"
        );
        assert_eq!(evict_sweep_every(s(2), s(120)), s(6));
        assert_eq!(evict_sweep_every(s(2), s(20)), s(2), "never more often than a heartbeat interval");
        assert_eq!(evict_sweep_every(ms(100), ms(2500)), ms(125));
        assert_eq!(evict_sweep_every(s(2), s(86_400)), EVICT_SWEEP_MAX, "a day: still every 30 s");
    }
}
