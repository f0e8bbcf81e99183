//! Registry change events for `GET /api/v1/discovery/events`: added, updated, health changed, removed.
//!
//! Events are found by comparing views rather than by hooking every writer: a task compares the
//! current snapshot and every agent's derived health with what it saw last ([`diff`], pure), every
//! [`WATCH_TICK`]. Health changes by age alone (a silent agent going degraded, then inactive), so it has
//! to be looked at over time anyway, and one comparison covers local registrations, gossip, sync,
//! eviction and tombstones alike. The cost is O(view) per tick: well under a millisecond at 10,000
//! agents.
//!
//! Nobody can be told of a change before anybody watches, so the comparing starts with the first
//! subscriber ([`Watch::wake`]: a watch stream or a webhook) and goes on from then, for clients that
//! resume. Until then the task does nothing and holds no view: a node catching up on 10,000 agents
//! compared the whole view four times a second, for nobody.
//!
//! The last [`WATCH_BUFFER`] events are kept, so that a client that reconnects with `Last-Event-ID`
//! resumes where it left off. Ids are integers that increase across restarts (they start at the start
//! time in microseconds): an id this node cannot resume from (older than the buffer, or from before a
//! restart) gets the client a `reset` and the current view instead.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::broadcast;
use tokio_util::sync::CancellationToken;

use crate::query::{select, Query};
use crate::registry::health::{Health, Millis, Thresholds};
use crate::registry::{Entry, Registry};
use crate::tasks::Ticks;

/// How often the view is compared with the last one seen.
pub const WATCH_TICK: Duration = Duration::from_millis(250);
/// Events kept for clients that resume with `Last-Event-ID`.
pub const WATCH_BUFFER: usize = 4096;
/// Live events a subscriber may fall behind by before its stream is closed (it then resumes).
pub const WATCH_CHANNEL: usize = 1024;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Added,
    Updated,
    HealthChanged,
    Removed,
}

impl Kind {
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Added => "added",
            Kind::Updated => "updated",
            Kind::HealthChanged => "health_changed",
            Kind::Removed => "removed",
        }
    }
}

/// One change to one record. `entry` is the record after the change (before it, for `Removed`).
#[derive(Debug, Clone)]
pub struct Event {
    pub id: u64,
    pub kind: Kind,
    pub entry: Arc<Entry>,
    pub health: Health,
    /// The health before the change, when the record was known before.
    pub previous: Option<Health>,
    pub at: Millis,
}

impl Event {
    /// The event as watch streams and webhooks carry it: `type`, `agent_id`, `publisher`, `seq`,
    /// `health_status`, `at`, `previous_health_status` when it changed, and the card when it was added
    /// or updated.
    pub fn to_json(&self) -> serde_json::Value {
        let e = &self.entry;
        let mut data = serde_json::json!({
            "type": self.kind.as_str(),
            "agent_id": e.key.agent_id,
            "publisher": e.publisher_name.as_ref(),
            "seq": e.seq,
            "health_status": self.health.as_str(),
            "at": crate::clock::rfc3339(self.at),
        });
        if let Some(previous) = self.previous.filter(|_| self.kind != Kind::Added) {
            data["previous_health_status"] = serde_json::json!(previous.as_str());
        }
        if matches!(self.kind, Kind::Added | Kind::Updated) {
            data["card"] = serde_json::json!(e.card.text().raw());
        }
        data
    }
}

/// What the watcher saw last: every record with its derived health, in snapshot order.
pub type View = Vec<(Arc<Entry>, Health)>;

/// The changes from `prev` to `next` (both in snapshot order, `(agent_id, publisher)`) at `now`, and
/// the new view. Pure.
pub fn diff(prev: &View, next: &[Arc<Entry>], now: Millis, t: &Thresholds) -> (Vec<Change>, View) {
    let mut changes = Vec::new();
    let mut view = Vec::with_capacity(next.len());
    let (mut i, mut j) = (0, 0);
    loop {
        let order = match (prev.get(i), next.get(j)) {
            (None, None) => break,
            (Some(_), None) => std::cmp::Ordering::Less,
            (None, Some(_)) => std::cmp::Ordering::Greater,
            // Most records are the very entry they were: no key comparison for those.
            (Some((p, _)), Some(n)) if Arc::ptr_eq(p, n) => std::cmp::Ordering::Equal,
            (Some((p, _)), Some(n)) => p.key.cmp(&n.key),
        };
        match order {
            std::cmp::Ordering::Less => {
                let (p, health) = &prev[i];
                changes.push(Change {
                    kind: Kind::Removed,
                    entry: p.clone(),
                    health: *health,
                    previous: Some(*health),
                });
                i += 1;
            }
            std::cmp::Ordering::Greater => {
                let n = &next[j];
                let health = n.health(now, t);
                changes.push(Change { kind: Kind::Added, entry: n.clone(), health, previous: None });
                view.push((n.clone(), health));
                j += 1;
            }
            std::cmp::Ordering::Equal => {
                let ((p, before), n) = (&prev[i], &next[j]);
                let health = n.health(now, t);
                let kind = if p.seq != n.seq {
                    Some(Kind::Updated)
                } else {
                    (health != *before).then_some(Kind::HealthChanged)
                };
                if let Some(kind) = kind {
                    changes.push(Change { kind, entry: n.clone(), health, previous: Some(*before) });
                }
                view.push((n.clone(), health));
                i += 1;
                j += 1;
            }
        }
    }
    (changes, view)
}

/// The earliest time a record of `view` changes health by age alone, after `now`.
fn next_due(view: &View, now: Millis, t: &Thresholds) -> Option<Millis> {
    view.iter().filter_map(|(e, _)| e.next_health_change(now, t)).min()
}

/// A change found by [`diff`], before it gets an id.
#[derive(Debug, Clone)]
pub struct Change {
    pub kind: Kind,
    pub entry: Arc<Entry>,
    pub health: Health,
    pub previous: Option<Health>,
}

struct Inner {
    /// Id of the last event (the first event gets `first_id + 1`).
    last_id: u64,
    ring: VecDeque<Arc<Event>>,
    /// What the last comparison saw; empty while nobody watches (`asleep`).
    view: View,
    /// Nobody has watched yet: [`Watch::refresh`] does not compare until [`Watch::wake`].
    asleep: bool,
    /// The registry's `(generation, health_epoch)` when `view` was last compared, if by [`Watch::refresh`].
    tag: Option<(u64, u64)>,
    /// The earliest time a record of `view` changes health by age alone.
    due: Option<Millis>,
}

/// The event log and its live feed.
pub struct Watch {
    inner: Mutex<Inner>,
    tx: broadcast::Sender<Arc<Event>>,
}

/// What a new subscriber gets: where to start, and the live feed from there on.
pub struct Subscription {
    pub start: Start,
    /// Id of the last event already covered by `start`.
    pub head: u64,
    pub live: broadcast::Receiver<Arc<Event>>,
}

pub enum Start {
    /// The events after the client's `Last-Event-ID`.
    Resume(Vec<Arc<Event>>),
    /// The current view: the client had no id, or one this node cannot resume from (`reset`).
    View { view: View, reset: bool },
}

impl Watch {
    /// Starts from `entries` as they are, without events, awake; ids start at `first_id`.
    pub fn new(entries: &[Arc<Entry>], now: Millis, t: &Thresholds, first_id: u64) -> Self {
        let view = entries.iter().map(|e| (e.clone(), e.health(now, t))).collect();
        let (tx, _) = broadcast::channel(WATCH_CHANNEL);
        let due = next_due(&view, now, t);
        let inner = Inner { last_id: first_id, ring: VecDeque::new(), view, asleep: false, tag: None, due };
        Self { inner: Mutex::new(inner), tx }
    }

    /// Starts asleep: nothing is compared until [`wake`](Self::wake); ids start at `first_id`.
    pub fn asleep(first_id: u64) -> Self {
        let (tx, _) = broadcast::channel(WATCH_CHANNEL);
        let inner = Inner {
            last_id: first_id,
            ring: VecDeque::new(),
            view: Vec::new(),
            asleep: true,
            tag: None,
            due: None,
        };
        Self { inner: Mutex::new(inner), tx }
    }

    /// Somebody watches (a new stream, a webhook): brings the watch up to `entries`, taking them as
    /// they are, without events, if it slept, comparing them as [`refresh`](Self::refresh) does if not.
    /// From then on every change is recorded. Call it before subscribing.
    pub fn wake(&self, entries: &[Arc<Entry>], tag: (u64, u64), now: Millis, t: &Thresholds) -> usize {
        {
            let mut inner = self.lock();
            if inner.asleep {
                inner.view = entries.iter().map(|e| (e.clone(), e.health(now, t))).collect();
                inner.due = next_due(&inner.view, now, t);
                inner.tag = Some(tag);
                inner.asleep = false;
                return 0;
            }
        }
        self.refresh(entries, tag, now, t)
    }

    /// [`wake`](Self::wake) with the registry's view as it is now.
    pub fn wake_on(&self, registry: &Registry) -> usize {
        let snapshot = registry.snapshot();
        let tag = (snapshot.generation, registry.health_epoch());
        self.wake(&snapshot.entries, tag, crate::clock::now_millis(), registry.thresholds())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Compares `entries` with the last view, records and sends what changed. Returns how many events.
    pub fn advance(&self, entries: &[Arc<Entry>], now: Millis, t: &Thresholds) -> usize {
        let mut inner = self.lock();
        inner.tag = None;
        Self::compare(&mut inner, &self.tx, entries, now, t)
    }

    /// [`advance`](Self::advance) for the registry's view, skipped when nothing can have changed since
    /// the last call: the same `tag` (the view's generation and the registry's health epoch, which every
    /// heartbeat that changes a health bumps) and no record due to change health by age yet. An idle
    /// mesh of 10,000 agents is then compared every few seconds instead of four times a second.
    ///
    /// Asleep ([`Watch::asleep`], until [`Watch::wake`]), it compares nothing.
    pub fn refresh(&self, entries: &[Arc<Entry>], tag: (u64, u64), now: Millis, t: &Thresholds) -> usize {
        let mut inner = self.lock();
        if inner.asleep {
            return 0;
        }
        if inner.tag == Some(tag) && inner.due.is_none_or(|due| now < due) {
            return 0;
        }
        inner.tag = Some(tag);
        Self::compare(&mut inner, &self.tx, entries, now, t)
    }

    fn compare(
        inner: &mut Inner,
        tx: &broadcast::Sender<Arc<Event>>,
        entries: &[Arc<Entry>],
        now: Millis,
        t: &Thresholds,
    ) -> usize {
        let (changes, view) = diff(&inner.view, entries, now, t);
        inner.due = next_due(&view, now, t);
        inner.view = view;
        let count = changes.len();
        for c in changes {
            inner.last_id += 1;
            let event = Arc::new(Event {
                id: inner.last_id,
                kind: c.kind,
                entry: c.entry,
                health: c.health,
                previous: c.previous,
                at: now,
            });
            if inner.ring.len() == WATCH_BUFFER {
                inner.ring.pop_front();
            }
            inner.ring.push_back(event.clone());
            // No subscriber is not an error.
            let _ = tx.send(event);
        }
        count
    }

    /// Subscribes, resuming after `last_event_id` when the buffer still holds what followed it. A
    /// watch still asleep (never [`wake`](Self::wake)d) starts the subscriber from an empty view.
    pub fn subscribe(&self, last_event_id: Option<u64>) -> Subscription {
        let inner = self.lock();
        let live = self.tx.subscribe();
        let head = inner.last_id;
        let oldest_resumable = inner.ring.front().map_or(head, |e| e.id - 1);
        let start = match last_event_id {
            Some(id) if id >= oldest_resumable && id <= head => {
                Start::Resume(inner.ring.iter().filter(|e| e.id > id).cloned().collect())
            }
            other => Start::View { view: inner.view.clone(), reset: other.is_some() },
        };
        Subscription { start, head, live }
    }
}

/// The discovery filters, applied to one record at a time (watch streams, webhooks).
#[derive(Debug, Clone)]
pub struct Filter {
    /// The query without its health filter and pagination.
    structural: Query,
    health: Option<Health>,
    thresholds: Thresholds,
}

impl Filter {
    pub fn new(mut query: Query, thresholds: Thresholds) -> Self {
        let health = query.health.take();
        query.limit = 1;
        query.offset = 0;
        Self { structural: query, health, thresholds }
    }

    /// Does the event's record pass the filters? The health filter passes a change into or out of that
    /// health, so a client watching `active` agents sees one leave.
    pub fn admits(&self, event: &Event) -> bool {
        let health_ok = self.health.is_none_or(|h| h == event.health || event.previous == Some(h));
        health_ok && self.structural_match(&event.entry)
    }

    fn structural_match(&self, entry: &Arc<Entry>) -> bool {
        let now = crate::clock::now_millis();
        select(std::slice::from_ref(entry), &self.structural, now, &self.thresholds).total_agents == 1
    }
}

/// Keeps `watch` up to date with the registry until `cancel`.
pub async fn run(registry: Arc<Registry>, watch: Arc<Watch>, cancel: CancellationToken) {
    let mut ticks = Ticks::new(WATCH_TICK, cancel);
    while ticks.next().await {
        let snapshot = registry.snapshot();
        let tag = (snapshot.generation, registry.health_epoch());
        let events = watch.refresh(&snapshot.entries, tag, crate::clock::now_millis(), registry.thresholds());
        if events > 0 {
            tracing::debug!(events, "registry changes");
        }
    }
}

#[cfg(test)]
mod tests;
