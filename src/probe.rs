//! Liveness probes of local agents that do not heartbeat for themselves (card files, native
//! registration): when `probe_interval` is set, this node asks each one's `base_url` + `probe_path`
//! and reports what it finds through the mesh, as AgentField agents do with their own heartbeats.
//!
//! Any HTTP answer below 500 means the agent's server is up (`ready`); a 5xx or no answer within the
//! timeout counts as a failure: `degraded` at once, `offline` after `FAILURES_TO_OFFLINE` in a row.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::api::now_millis;
use crate::registry::health::Reported;
use crate::registry::{Liveness, Origin, Registry};

/// Consecutive failed probes after which an agent is reported offline.
pub const FAILURES_TO_OFFLINE: u32 = 3;

/// Probes every vouched-for local agent each `interval`, until `cancel`.
pub async fn run(registry: Arc<Registry>, interval: Duration, path: String, cancel: CancellationToken) {
    let timeout = interval.min(Duration::from_secs(5));
    let client = match reqwest::Client::builder().timeout(timeout).build() {
        Ok(c) => c,
        Err(error) => {
            tracing::warn!(%error, "probes disabled: no HTTP client");
            return;
        }
    };
    let mut failures: HashMap<String, u32> = HashMap::new();
    let mut ticker = tokio::time::interval(interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = ticker.tick() => {}
        }
        let snapshot = registry.snapshot();
        let targets: Vec<(String, String)> = snapshot
            .entries
            .iter()
            .filter(|e| e.origin == Origin::Local(Liveness::Node))
            .map(|e| (e.key.agent_id.clone(), e.card.view().base_url.trim_end_matches('/').to_owned()))
            .collect();
        failures.retain(|id, _| targets.iter().any(|(t, _)| t == id));
        for (agent_id, base_url) in targets {
            let alive = match client.get(format!("{base_url}{path}")).send().await {
                Ok(response) => !response.status().is_server_error(),
                Err(_) => false,
            };
            let count = failures.entry(agent_id.clone()).or_default();
            *count = if alive { 0 } else { *count + 1 };
            let reported = match *count {
                0 => Reported::Ready,
                n if n >= FAILURES_TO_OFFLINE => Reported::Offline,
                _ => Reported::Degraded,
            };
            // The agent may have been removed meanwhile: nothing to report then.
            let _ = registry.heartbeat_local(&agent_id, Some(reported), now_millis());
        }
    }
}
