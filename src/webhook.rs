//! Webhooks: the watch stream's events delivered as signed POSTs to operator-configured URLs.
//!
//! Each webhook is one supervised task. It follows the watch log ([`crate::watch`]) with its discovery
//! filters, queues what passes (at most [`WEBHOOK_QUEUE`] events; past that the oldest are dropped and
//! counted, so a dead receiver costs bounded memory and never slows the node), and delivers one event
//! at a time, in order, retrying with exponential backoff until the receiver answers 2xx: at least
//! once, as long as the node runs and the queue holds the event. A subscriber that falls behind the
//! live feed resumes from the log (the last `WATCH_BUFFER` events), so a burst loses nothing the log
//! still holds.
//!
//! Every POST carries the event as JSON ([`crate::watch::Event::to_json`]) and:
//! - `X-Agentmesh-Event`: the event type; `X-Agentmesh-Delivery`: the event id (the same on every retry,
//!   so a receiver can drop duplicates);
//! - `X-Agentmesh-Signature`: a detached JWS (`protected..signature`, EdDSA, `kid` this node's PeerId) over
//!   the exact body bytes: verify with the PeerId's Ed25519 key.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use libp2p::identity::Keypair;
use tokio::sync::broadcast::error::RecvError;
use tokio_util::sync::CancellationToken;

use crate::query::Query;
use crate::registry::health::Thresholds;
use crate::watch::{Event, Filter, Start, Watch};

/// Events queued per webhook before the oldest are dropped.
pub const WEBHOOK_QUEUE: usize = 1024;
/// First wait before a failed delivery is tried again; it doubles up to [`WEBHOOK_MAX_BACKOFF`].
pub const WEBHOOK_BACKOFF: Duration = Duration::from_millis(500);
/// Longest wait between two tries of one delivery.
pub const WEBHOOK_MAX_BACKOFF: Duration = Duration::from_secs(60);
/// One POST must be answered within this.
pub const WEBHOOK_TIMEOUT: Duration = Duration::from_secs(10);

/// Why a webhook setting is refused.
#[derive(Debug, thiserror::Error)]
pub enum WebhookError {
    #[error("webhook `{0}`: must be an http:// or https:// URL")]
    Url(String),
    #[error("webhook `{url}`: its filters (after #): {source}")]
    Filter { url: String, source: crate::query::ParamError },
}

/// One configured webhook: where to POST, and which events (`URL#FILTERS`, the filters in discovery's
/// query syntax; the fragment is never sent).
#[derive(Debug, Clone)]
pub struct Webhook {
    pub url: String,
    pub query: Query,
}

impl Webhook {
    pub fn parse(spec: &str) -> Result<Self, WebhookError> {
        let (url, filters) = spec.split_once('#').unwrap_or((spec, ""));
        let host = url.strip_prefix("http://").or_else(|| url.strip_prefix("https://"));
        if !host.is_some_and(|h| !h.is_empty() && !h.contains(char::is_whitespace)) {
            return Err(WebhookError::Url(redacted(url)));
        }
        let query =
            Query::parse(filters).map_err(|source| WebhookError::Filter { url: redacted(url), source })?;
        Ok(Self { url: url.to_owned(), query })
    }

    /// The URL for logs: without its query, which may hold a token.
    pub fn name(&self) -> String {
        redacted(&self.url)
    }
}

fn redacted(url: &str) -> String {
    match url.split_once('?') {
        Some((base, _)) => format!("{base}?…"),
        None => url.to_owned(),
    }
}

/// The queue between the watch log and the deliveries: bounded, oldest dropped first.
#[derive(Debug, Default)]
struct Queue {
    events: VecDeque<Arc<Event>>,
}

impl Queue {
    /// Queues `event`; true when that dropped the oldest.
    fn push(&mut self, event: Arc<Event>) -> bool {
        let full = self.events.len() >= WEBHOOK_QUEUE;
        if full {
            self.events.pop_front();
        }
        self.events.push_back(event);
        full
    }
}

/// The wait before try `attempt` (1 = the first retry). Pure.
pub fn backoff(attempt: u32) -> Duration {
    WEBHOOK_BACKOFF.saturating_mul(1u32 << attempt.saturating_sub(1).min(16)).min(WEBHOOK_MAX_BACKOFF)
}

/// Delivers `hook`'s events until `cancel`.
pub async fn run(
    hook: Webhook,
    watch: Arc<Watch>,
    thresholds: Thresholds,
    key: Keypair,
    cancel: CancellationToken,
) {
    let name = hook.name();
    let filter = Filter::new(hook.query.clone(), thresholds);
    let client = match reqwest::Client::builder().timeout(WEBHOOK_TIMEOUT).build() {
        Ok(client) => client,
        Err(error) => {
            tracing::error!(webhook = %name, %error, "webhook client could not be built");
            return;
        }
    };
    let queue = tokio::sync::Mutex::new(Queue::default());
    let ready = tokio::sync::Notify::new();
    let follow = follow(&watch, &filter, &queue, &ready, &name, &cancel);
    let deliver = async {
        loop {
            let next = queue.lock().await.events.pop_front();
            let Some(event) = next else {
                tokio::select! {
                    _ = ready.notified() => continue,
                    _ = cancel.cancelled() => return,
                }
            };
            if !deliver(&client, &hook.url, &event, &key, &name, &cancel).await {
                return;
            }
        }
    };
    tokio::join!(follow, deliver);
}

/// Follows the watch log into `queue` until `cancel`, resuming from the log when it falls behind.
async fn follow(
    watch: &Watch,
    filter: &Filter,
    queue: &tokio::sync::Mutex<Queue>,
    ready: &tokio::sync::Notify,
    name: &str,
    cancel: &CancellationToken,
) {
    // Events from now on: a webhook added to a running mesh is not sent the whole view.
    let mut last = None;
    loop {
        let sub = watch.subscribe(last);
        let mut pending = match sub.start {
            Start::Resume(events) => events,
            Start::View { reset, .. } => {
                if reset {
                    tracing::warn!(webhook = %name, "webhook fell behind the event log; events were lost");
                }
                Vec::new()
            }
        };
        let mut live = sub.live;
        last = Some(sub.head);
        loop {
            for event in pending.drain(..) {
                last = Some(event.id);
                if filter.admits(&event) && queue.lock().await.push(event) {
                    tracing::warn!(webhook = %name, "webhook queue full; the oldest event was dropped");
                }
                ready.notify_one();
            }
            let received = tokio::select! {
                r = live.recv() => r,
                _ = cancel.cancelled() => return,
            };
            match received {
                Ok(event) if last.is_none_or(|l| event.id > l) => pending.push(event),
                Ok(_) => {}
                Err(RecvError::Lagged(_)) => break,
                Err(RecvError::Closed) => return,
            }
        }
    }
}

/// Delivers one event, retrying until a 2xx answer; false when cancelled first.
async fn deliver(
    client: &reqwest::Client,
    url: &str,
    event: &Event,
    key: &Keypair,
    name: &str,
    cancel: &CancellationToken,
) -> bool {
    let body = event.to_json().to_string().into_bytes();
    let signature = crate::card::a2a::detached_jws(key, &body);
    let mut attempt = 0u32;
    loop {
        let sent = client
            .post(url)
            .header("content-type", "application/json")
            .header("x-agentmesh-event", event.kind.as_str())
            .header("x-agentmesh-delivery", event.id.to_string())
            .header("x-agentmesh-signature", &signature)
            .body(body.clone())
            .send();
        let outcome = tokio::select! {
            r = sent => r,
            _ = cancel.cancelled() => return false,
        };
        match outcome {
            Ok(response) if response.status().is_success() => {
                tracing::debug!(webhook = %name, event = event.id, attempt, "webhook delivered");
                return true;
            }
            Ok(response) => {
                tracing::debug!(webhook = %name, event = event.id, status = response.status().as_u16(), "webhook refused")
            }
            Err(error) => tracing::debug!(webhook = %name, event = event.id, %error, "webhook unreachable"),
        }
        attempt += 1;
        if attempt == 1 || attempt.is_power_of_two() {
            tracing::warn!(webhook = %name, event = event.id, attempt, "webhook delivery failed; retrying");
        }
        tokio::select! {
            _ = tokio::time::sleep(backoff(attempt)) => {}
            _ = cancel.cancelled() => return false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_webhook_is_a_url_with_its_filters_in_the_fragment() {
        let hook =
            Webhook::parse("http://127.0.0.1:9000/hook?token=s3cret#tags=payments&health_status=active")
                .unwrap();
        assert_eq!(hook.url, "http://127.0.0.1:9000/hook?token=s3cret");
        assert_eq!(hook.query.tags.len(), 1);
        assert_eq!(hook.name(), "http://127.0.0.1:9000/hook?…", "no token in logs");
        assert!(Webhook::parse("ftp://x").is_err());
        assert!(Webhook::parse("http://").is_err());
        let err = Webhook::parse("http://x/h#limit=nope").unwrap_err();
        assert!(err.to_string().contains("limit"), "{err}");
        assert!(!Webhook::parse("http://x/h?token=s3cret#health_status=sick")
            .unwrap_err()
            .to_string()
            .contains("s3cret"));
    }

    #[test]
    fn backoff_doubles_to_a_ceiling() {
        assert_eq!(backoff(1), Duration::from_millis(500));
        assert_eq!(backoff(2), Duration::from_secs(1));
        assert_eq!(backoff(4), Duration::from_secs(4));
        assert_eq!(backoff(20), WEBHOOK_MAX_BACKOFF);
        assert_eq!(backoff(u32::MAX), WEBHOOK_MAX_BACKOFF);
    }

    #[test]
    fn a_full_queue_drops_its_oldest() {
        let entry = Arc::new(crate::registry::Entry::new(
            crate::registry::RecordKey { agent_id: "a".into(), publisher: libp2p::PeerId::random() },
            1,
            &crate::card::AgentCard::from_json(br#"{"agent_id":"a","base_url":"http://x"}"#).unwrap(),
            crate::registry::Origin::Remote,
            0,
        ));
        let event = |id| {
            Arc::new(Event {
                id,
                kind: crate::watch::Kind::Added,
                entry: entry.clone(),
                health: crate::registry::health::Health::Active,
                previous: None,
                at: 0,
            })
        };
        let mut q = Queue::default();
        for id in 0..WEBHOOK_QUEUE as u64 {
            assert!(!q.push(event(id)));
        }
        assert!(q.push(event(WEBHOOK_QUEUE as u64)));
        assert_eq!(q.events.len(), WEBHOOK_QUEUE);
        assert_eq!(q.events.front().unwrap().id, 1);
    }

    #[test]
    fn the_signature_verifies_over_the_exact_body() {
        use base64::engine::general_purpose::URL_SAFE_NO_PAD;
        use base64::Engine as _;
        let key = Keypair::generate_ed25519();
        let body = br#"{"type":"added"}"#;
        let jws = crate::card::a2a::detached_jws(&key, body);
        let (protected, signature) = jws.split_once("..").unwrap();
        let input = format!("{protected}.{}", URL_SAFE_NO_PAD.encode(body));
        let sig = URL_SAFE_NO_PAD.decode(signature).unwrap();
        assert!(key.public().verify(input.as_bytes(), &sig));
        let other = format!("{protected}.{}", URL_SAFE_NO_PAD.encode(br#"{"type":"removed"}"#));
        assert!(!key.public().verify(other.as_bytes(), &sig));
    }
}
