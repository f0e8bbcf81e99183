//! `GET /api/v1/discovery/events`: Server-Sent Events of registry changes (`added`, `updated`,
//! `health_changed`, `removed`) with the discovery filters, resumable with `Last-Event-ID`.
//!
//! A new stream starts with the current view as `added` events (without ids) and a `synced` event that
//! carries the id to resume from; a stream resumed from a known id replays the events after it; an id
//! this node cannot resume from gets a `reset` event first, then the view. A stream that falls more
//! than `WATCH_CHANNEL` events behind is closed: its client reconnects and resumes.

use std::convert::Infallible;
use std::time::Duration;

use axum::extract::{RawQuery, State};
use axum::http::HeaderMap;
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures_util::stream::{self, Stream, StreamExt as _};
use tokio::sync::broadcast::error::RecvError;

use super::error::ApiError;
use super::AppState;
use crate::clock::now_millis;
use crate::query::Query;
use crate::watch::{Event, Filter, Kind, Start};

/// Comment lines sent on a quiet stream, so proxies and clients see it alive.
pub const KEEP_ALIVE: Duration = Duration::from_secs(15);

pub async fn events(
    State(app): State<AppState>,
    RawQuery(raw): RawQuery,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let query = Query::parse(raw.as_deref().unwrap_or_default())?;
    // An id that is not ours (not a number) cannot be resumed from: a reset, like an old one.
    let last = headers
        .get("last-event-id")
        .and_then(|v| v.to_str().ok())
        .map(|v| v.trim().parse::<u64>().unwrap_or(0));
    let permit = app.watchers.clone().try_acquire_owned().map_err(|_| {
        ApiError::Unavailable(format!("at most {} watch streams at once", crate::defaults::MAX_WATCHERS))
    })?;
    // Bring the log up to the current view first, so that a new stream starts from it (the first
    // stream wakes the watch, which then takes the view as it is).
    app.watch.wake_on(&app.registry);
    let sub = app.watch.subscribe(last);
    let filter = Filter::new(query, *app.registry.thresholds());
    let first: Vec<SseEvent> = match sub.start {
        Start::Resume(events) => events.iter().filter(|e| filter.admits(e)).map(|e| frame(e, true)).collect(),
        Start::View { view, reset } => {
            let now = now_millis();
            let reset = reset.then(|| SseEvent::default().event("reset").data("{}"));
            let added = view.into_iter().filter_map(|(entry, health)| {
                let event = Event { id: sub.head, kind: Kind::Added, entry, health, previous: None, at: now };
                filter.admits(&event).then(|| frame(&event, false))
            });
            let synced = SseEvent::default().event("synced").id(sub.head.to_string()).data("{}");
            reset.into_iter().chain(added).chain([synced]).collect()
        }
    };
    let head = sub.head;
    let live = stream::unfold((sub.live, filter, permit), move |(mut rx, filter, permit)| async move {
        loop {
            match rx.recv().await {
                Ok(event) if event.id > head && filter.admits(&event) => {
                    return Some((frame(&event, true), (rx, filter, permit)));
                }
                Ok(_) => continue,
                // Fell behind, or the node is stopping: end the stream; the client resumes.
                Err(RecvError::Lagged(_) | RecvError::Closed) => return None,
            }
        }
    });
    let stream = stream::iter(first).chain(live).map(Ok::<_, Infallible>);
    Ok(sse(stream).into_response())
}

fn sse(stream: impl Stream<Item = Result<SseEvent, Infallible>> + Send + 'static) -> impl IntoResponse {
    Sse::new(stream).keep_alive(KeepAlive::new().interval(KEEP_ALIVE))
}

/// One event as SSE: `event:` its kind, `data:` JSON, `id:` when it can be resumed from.
fn frame(event: &Event, with_id: bool) -> SseEvent {
    let frame = SseEvent::default().event(event.kind.as_str()).data(event.to_json().to_string());
    if with_id {
        frame.id(event.id.to_string())
    } else {
        frame
    }
}
