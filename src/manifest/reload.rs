//! The manifest task: polls the configured directories and registers each one's card when its files
//! have settled, and keeps what `GET /api/v1/manifests` reports.
//!
//! Polling rather than inotify (or another change-notification API): it works the same on every file
//! system and in every container, bind mounts and network file systems included, where notifications
//! are missing or unreliable. A poll is a listing and a few `stat` calls per directory every
//! [`MANIFEST_POLL_PERIOD`]; files are read only once a change has been quiet for
//! [`MANIFEST_DEBOUNCE`].

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use arc_swap::ArcSwap;
use tokio_util::sync::CancellationToken;

use super::dir::{Debounce, DirState, Serve};
use super::load::{self, Fingerprint};
use super::{DirReport, ManifestError};
use crate::card::AgentCard;
use crate::clock::now_millis;
use crate::defaults::{MANIFEST_DEBOUNCE, MANIFEST_POLL_PERIOD};
use crate::registry::{Applied, Liveness, Registry};
use crate::tasks::Ticks;

/// Why the manifest task could not start or stopped.
#[derive(Debug, thiserror::Error)]
pub enum ReloadError {
    #[error("capabilities dir {path}: {reason}")]
    Dir { path: PathBuf, reason: String },
    #[error("reading manifests failed: {0}")]
    Blocking(String),
}

/// What every manifest directory serves and what is wrong with it, for the API. Readers never wait
/// for a reload.
#[derive(Debug, Default)]
pub struct Manifests {
    reports: ArcSwap<Vec<DirReport>>,
}

impl Manifests {
    pub fn reports(&self) -> Arc<Vec<DirReport>> {
        self.reports.load_full()
    }
}

/// One configured directory.
struct Watched {
    dir: PathBuf,
    default_agent_id: String,
    state: DirState,
    debounce: Debounce<Fingerprint>,
    /// The agent registered for it and its capability ids.
    served: Option<(String, Vec<String>)>,
    errors: Vec<ManifestError>,
}

/// The task's state: every directory, the registry it registers into.
pub struct Reloader {
    registry: Arc<Registry>,
    default_base_url: String,
    dirs: Vec<Watched>,
    shared: Arc<Manifests>,
}

/// Checks that every directory exists: a misspelt path is an error at start, not an agent with nothing.
pub fn check_dirs(dirs: &[PathBuf]) -> Result<(), ReloadError> {
    for dir in dirs {
        let reason = match std::fs::metadata(dir) {
            Ok(meta) if meta.is_dir() => continue,
            Ok(_) => "not a directory".to_owned(),
            Err(e) => e.to_string(),
        };
        return Err(ReloadError::Dir { path: dir.clone(), reason });
    }
    Ok(())
}

impl Reloader {
    /// Loads and registers every directory once (a broken manifest is reported, not fatal). Agents
    /// get `default_base_url` unless their `AGENT.yaml` names one.
    pub async fn start(
        registry: Arc<Registry>,
        dirs: Vec<PathBuf>,
        default_base_url: String,
    ) -> Result<Self, ReloadError> {
        check_dirs(&dirs)?;
        let mut reloader = Self { registry, default_base_url, dirs: Vec::new(), shared: Arc::default() };
        for dir in dirs {
            let seen = blocking({
                let dir = dir.clone();
                move || load::fingerprint(&dir)
            })
            .await?;
            let default_agent_id = load::default_agent_id(&dir);
            let debounce = Debounce::new(seen, MANIFEST_DEBOUNCE);
            let state = DirState::default();
            reloader.dirs.push(Watched {
                dir,
                default_agent_id,
                state,
                debounce,
                served: None,
                errors: Vec::new(),
            });
            reloader.reload(reloader.dirs.len() - 1).await?;
        }
        Ok(reloader)
    }

    /// The reports the API serves, kept current by [`run`](Self::run).
    pub fn manifests(&self) -> Arc<Manifests> {
        self.shared.clone()
    }

    /// Polls every [`MANIFEST_POLL_PERIOD`] until `cancel`, reloading a directory once its changes
    /// have been quiet for [`MANIFEST_DEBOUNCE`].
    pub async fn run(mut self, cancel: CancellationToken) -> Result<(), ReloadError> {
        let mut ticks = Ticks::new(MANIFEST_POLL_PERIOD, cancel);
        while ticks.next().await {
            let dirs: Vec<PathBuf> = self.dirs.iter().map(|w| w.dir.clone()).collect();
            let seen =
                blocking(move || dirs.iter().map(|d| load::fingerprint(d)).collect::<Vec<_>>()).await?;
            let now = Instant::now();
            for (i, seen) in seen.into_iter().enumerate() {
                if self.dirs[i].debounce.observe(seen, now) {
                    self.reload(i).await?;
                }
            }
        }
        Ok(())
    }

    /// Reads directory `i`, registers what it serves, and publishes the reports.
    async fn reload(&mut self, i: usize) -> Result<(), ReloadError> {
        let (dir, default_id, base_url) =
            (self.dirs[i].dir.clone(), self.dirs[i].default_agent_id.clone(), self.default_base_url.clone());
        let loaded = blocking(move || load::load(&dir, &default_id, &base_url)).await?;
        let outcome = self.dirs[i].state.apply(loaded);
        let mut errors = outcome.errors;
        match outcome.serve {
            Serve::Card(card) => {
                if let Some(error) = self.register(i, *card).await {
                    errors.push(error);
                }
            }
            Serve::Keep => {}
            Serve::Gone => {
                if let Some((agent_id, _)) = self.dirs[i].served.take() {
                    self.deregister(&agent_id).await;
                }
            }
        }
        let watched = &mut self.dirs[i];
        for e in &errors {
            tracing::warn!(dir = %watched.dir.display(), path = %e.path, field = e.field.as_deref().unwrap_or(""), message = %e.message, "capability manifest refused");
        }
        watched.errors = errors;
        self.publish();
        Ok(())
    }

    /// Registers directory `i`'s card, replacing an agent of another id it registered before. The
    /// error to report when it could not.
    async fn register(&mut self, i: usize, card: AgentCard) -> Option<ManifestError> {
        let dir = self.dirs[i].dir.display().to_string();
        let agent_id = card.agent_id.clone();
        let taken = self
            .dirs
            .iter()
            .enumerate()
            .find(|(j, w)| *j != i && w.served.as_ref().is_some_and(|(id, _)| *id == agent_id));
        if let Some((_, other)) = taken {
            let message = format!("agent {agent_id:?} is already the agent of {}", other.dir.display());
            return Some(ManifestError::new(dir, Some("agent_id"), message));
        }
        let capabilities: Vec<String> =
            card.reasoners.iter().chain(&card.skills).map(|c| c.id.clone()).collect();
        match self.registry.register_local(card, Liveness::Node, now_millis()).await {
            Ok(applied) => {
                if !matches!(applied, Applied::Unchanged { .. }) {
                    tracing::info!(%dir, %agent_id, capabilities = capabilities.len(), ?applied, "capability manifests registered");
                }
            }
            Err(e) => {
                self.dirs[i].debounce.retry();
                return Some(ManifestError::new(
                    dir,
                    None,
                    format!("agent {agent_id:?} not registered: {e}"),
                ));
            }
        }
        let before = self.dirs[i].served.replace((agent_id.clone(), capabilities));
        if let Some((old, _)) = before.filter(|(old, _)| *old != agent_id) {
            self.deregister(&old).await;
        }
        None
    }

    async fn deregister(&self, agent_id: &str) {
        match self.registry.deregister_local(agent_id, now_millis()).await {
            Ok(applied) => tracing::info!(%agent_id, ?applied, "manifest agent deregistered"),
            Err(error) => tracing::warn!(%agent_id, %error, "manifest agent not deregistered"),
        }
    }

    fn publish(&self) {
        let reports = self
            .dirs
            .iter()
            .map(|w| DirReport {
                dir: w.dir.display().to_string(),
                agent_id: w.served.as_ref().map(|(id, _)| id.clone()),
                capabilities: w.served.as_ref().map(|(_, caps)| caps.clone()).unwrap_or_default(),
                errors: w.errors.clone(),
            })
            .collect();
        self.shared.reports.store(Arc::new(reports));
    }
}

/// Runs file-system work on the blocking pool.
async fn blocking<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> Result<T, ReloadError> {
    tokio::task::spawn_blocking(f).await.map_err(|e| ReloadError::Blocking(e.to_string()))
}

/// The base URL an agent described only by files gets: this node's HTTP address (loopback when it
/// listens on every address).
pub fn node_base_url(http: std::net::SocketAddr) -> String {
    let ip = match http.ip() {
        ip if !ip.is_unspecified() => ip,
        std::net::IpAddr::V4(_) => std::net::Ipv4Addr::LOCALHOST.into(),
        std::net::IpAddr::V6(_) => std::net::Ipv6Addr::LOCALHOST.into(),
    };
    format!("http://{}", std::net::SocketAddr::new(ip, http.port()))
}
