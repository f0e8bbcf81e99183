//! Liveness probes of local agents that do not heartbeat for themselves (card files, native
//! registration): when `probe_interval` is set, this node asks each one's `base_url` + `probe_path`
//! and reports what it finds through the mesh, as AgentField agents do with their own heartbeats.
//!
//! Card URLs ([`poll_cards`]) are the same idea for agents that publish their own card: the node
//! fetches it, republishes it when it changes, and reports the agent by whether the fetch worked.
//!
//! Any HTTP answer below 500 means the agent's server is up (`ready`); a 5xx or no answer within the
//! timeout counts as a failure: `degraded` at once, `offline` after `FAILURES_TO_OFFLINE` in a row.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::card::AgentCard;
use crate::clock::now_millis;
use crate::defaults::MAX_BODY_BYTES;
use crate::registry::health::Reported;
use crate::registry::{Applied, Liveness, Origin, Registry};
use crate::tasks::Ticks;

/// Consecutive failed probes after which an agent is reported offline.
pub const FAILURES_TO_OFFLINE: u32 = 3;

/// Probes every vouched-for local agent each `interval`, until `cancel`.
pub async fn run(
    registry: Arc<Registry>,
    interval: Duration,
    path: String,
    cancel: CancellationToken,
) -> Result<(), reqwest::Error> {
    let timeout = interval.min(Duration::from_secs(5));
    let client = reqwest::Client::builder().timeout(timeout).build()?;
    let mut failures: HashMap<String, u32> = HashMap::new();
    let mut ticks = Ticks::new(interval, cancel);
    while ticks.next().await {
        let snapshot = registry.snapshot();
        let targets: Vec<(String, String)> = snapshot
            .entries
            .iter()
            .filter(|e| e.origin == Origin::Local(Liveness::Node))
            .map(|e| (e.key.agent_id.clone(), e.card.text().view().base_url.trim_end_matches('/').to_owned()))
            // Only HTTP agents can be probed; one reached by a message-bus subject reports for itself.
            .filter(|(_, base_url)| base_url.starts_with("http"))
            .collect();
        failures.retain(|id, _| targets.iter().any(|(t, _)| t == id));
        for (agent_id, base_url) in targets {
            let alive = match client.get(format!("{base_url}{path}")).send().await {
                Ok(response) => !response.status().is_server_error(),
                Err(_) => false,
            };
            let count = failures.entry(agent_id.clone()).or_default();
            *count = if alive { 0 } else { *count + 1 };
            // The agent may have been removed meanwhile: nothing to report then.
            let _ = registry.heartbeat_local(&agent_id, Some(reported_after(*count)), now_millis());
        }
    }
    Ok(())
}

/// What an agent is reported as after `failures` failed checks in a row. Pure.
pub fn reported_after(failures: u32) -> Reported {
    match failures {
        0 => Reported::Ready,
        n if n >= FAILURES_TO_OFFLINE => Reported::Offline,
        _ => Reported::Degraded,
    }
}

/// Why fetching a card URL failed.
#[derive(Debug, thiserror::Error)]
pub enum CardUrlError {
    #[error("fetch failed: {0}")]
    Fetch(#[from] reqwest::Error),
    #[error("answered HTTP {0}")]
    Status(u16),
    #[error("card is over {MAX_BODY_BYTES} bytes")]
    TooLarge,
    #[error(transparent)]
    Card(#[from] crate::card::CardError),
}

/// One polled card URL and the agent it last registered.
struct Polled {
    url: String,
    agent_id: Option<String>,
    failures: u32,
}

/// Which agent each card URL registered, kept in the data directory: after a restart, an agent whose
/// URL no longer answers is reported as failing, not vouched for as alive by its stored card.
pub const CARD_URLS_FILE: &str = "card-urls.json";

fn load_url_agents(data_dir: &Path) -> HashMap<String, String> {
    let path = data_dir.join(CARD_URLS_FILE);
    match std::fs::read(&path) {
        Ok(bytes) => serde_json::from_slice(&bytes).unwrap_or_else(|error| {
            tracing::warn!(path = %path.display(), %error, "unreadable card url file ignored");
            HashMap::new()
        }),
        Err(_) => HashMap::new(),
    }
}

fn save_url_agents(data_dir: &Path, map: &HashMap<String, String>) {
    let path = data_dir.join(CARD_URLS_FILE);
    let tmp = path.with_extension("json.tmp");
    let written = serde_json::to_vec(map)
        .map_err(std::io::Error::other)
        .and_then(|bytes| std::fs::write(&tmp, bytes))
        .and_then(|()| std::fs::rename(&tmp, &path));
    if let Err(error) = written {
        tracing::warn!(path = %path.display(), %error, "card url file not written");
    }
}

/// Fetches every card URL each `interval`, until `cancel`. A card (A2A or agentmesh) is registered as a
/// local agent, so a changed card is republished and an unchanged one writes nothing; the answer is
/// also the agent's liveness: a failed fetch reports it `degraded`, `offline` after
/// [`FAILURES_TO_OFFLINE`] in a row. A URL that starts serving another agent id replaces its old agent.
pub async fn poll_cards(
    registry: Arc<Registry>,
    urls: Vec<String>,
    interval: Duration,
    data_dir: PathBuf,
    cancel: CancellationToken,
) -> Result<(), reqwest::Error> {
    let client = reqwest::Client::builder().timeout(interval.min(Duration::from_secs(5))).build()?;
    let mut known = load_url_agents(&data_dir);
    let mut polled: Vec<Polled> =
        urls.into_iter().map(|url| Polled { agent_id: known.get(&url).cloned(), url, failures: 0 }).collect();
    let mut ticks = Ticks::new(interval, cancel);
    while ticks.next().await {
        for p in &mut polled {
            match fetch_card(&client, &p.url).await {
                Ok(card) => {
                    let agent_id = card.agent_id.clone();
                    match registry.register_local(card, Liveness::Node, now_millis()).await {
                        Ok(applied) => {
                            if !matches!(applied, Applied::Unchanged { .. }) {
                                tracing::info!(url = %p.url, %agent_id, ?applied, "card from url registered");
                            }
                        }
                        Err(error) => {
                            tracing::warn!(url = %p.url, %agent_id, %error, "card from url not stored");
                            continue;
                        }
                    }
                    if let Some(old) = p.agent_id.replace(agent_id.clone()).filter(|old| *old != agent_id) {
                        let _ = registry.deregister_local(&old, now_millis()).await;
                    }
                    if known.get(&p.url) != Some(&agent_id) {
                        known.insert(p.url.clone(), agent_id.clone());
                        save_url_agents(&data_dir, &known);
                    }
                    p.failures = 0;
                }
                Err(error) => {
                    p.failures += 1;
                    tracing::warn!(url = %p.url, failures = p.failures, %error, "card url fetch failed");
                }
            }
            if let Some(agent_id) = &p.agent_id {
                let _ = registry.heartbeat_local(agent_id, Some(reported_after(p.failures)), now_millis());
            }
        }
    }
    Ok(())
}

async fn fetch_card(client: &reqwest::Client, url: &str) -> Result<AgentCard, CardUrlError> {
    let mut response = client.get(url).header("accept", "application/json").send().await?;
    if !response.status().is_success() {
        return Err(CardUrlError::Status(response.status().as_u16()));
    }
    let mut body = Vec::new();
    while let Some(chunk) = response.chunk().await? {
        if body.len() + chunk.len() > MAX_BODY_BYTES {
            return Err(CardUrlError::TooLarge);
        }
        body.extend_from_slice(&chunk);
    }
    Ok(AgentCard::from_json_any(&body)?)
}
