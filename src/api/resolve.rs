//! `GET /api/v1/discovery/resolve?capability=ID`: one target for a capability, picked by a documented
//! policy, with the next best as failover.
//!
//! The policy ([`rank`]), over every capability with that id that passes the discovery filters:
//! 1. never an `inactive` agent, nor one `draining` (it takes no new work);
//! 2. health: `active`, then `unknown` (no heartbeat yet), then `degraded`;
//! 3. lifecycle: `ready`, then `busy`;
//! 4. the capability's `confidence_hint`, highest first (none counts as 0.5);
//! 5. freshness: the newest heartbeat first;
//! 6. a stable tie-break: agent id, then publisher, then reasoner before skill, so every node holding
//!    the same view and clock picks the same target.

use std::cmp::Ordering;

use axum::extract::{RawQuery, State};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Serialize;

use super::error::ApiError;
use super::render::{reasoner_target, skill_target};
use super::AppState;
use crate::card::reported::Lifecycle;
use crate::clock::now_millis;
use crate::defaults::RESOLVE_FAILOVER;
use crate::query::{first_params, Latest, ParamError, Pattern, Query, VersionFilter};
use crate::registry::health::{Health, Millis, Thresholds};
use crate::registry::Entry;

/// The confidence of a capability that gives none.
const DEFAULT_CONFIDENCE: f64 = 0.5;

/// One capability that could answer, with what the policy orders by.
#[derive(Debug, Clone)]
pub struct Candidate<'a> {
    pub entry: &'a Entry,
    pub reasoner: bool,
    pub id: String,
    pub health: Health,
    pub lifecycle: Lifecycle,
    pub confidence: Option<f64>,
    pub last_heartbeat: Option<Millis>,
}

impl Candidate<'_> {
    fn eligible(&self) -> bool {
        self.health != Health::Inactive && self.lifecycle != Lifecycle::Draining
    }

    fn target(&self) -> String {
        if self.reasoner {
            reasoner_target(&self.entry.key.agent_id, &self.id)
        } else {
            skill_target(&self.entry.key.agent_id, &self.id)
        }
    }
}

fn health_rank(h: Health) -> u8 {
    match h {
        Health::Active => 0,
        Health::Unknown => 1,
        Health::Degraded => 2,
        Health::Inactive => 3,
    }
}

/// The policy's order: best first. Pure.
pub fn compare(a: &Candidate<'_>, b: &Candidate<'_>) -> Ordering {
    let confidence = |c: &Candidate<'_>| c.confidence.unwrap_or(DEFAULT_CONFIDENCE);
    health_rank(a.health)
        .cmp(&health_rank(b.health))
        .then(a.lifecycle.cmp(&b.lifecycle))
        .then(confidence(b).partial_cmp(&confidence(a)).unwrap_or(Ordering::Equal))
        .then(b.last_heartbeat.cmp(&a.last_heartbeat))
        .then_with(|| a.entry.key.agent_id.cmp(&b.entry.key.agent_id))
        .then_with(|| a.entry.key.publisher.to_bytes().cmp(&b.entry.key.publisher.to_bytes()))
        .then(b.reasoner.cmp(&a.reasoner))
        .then_with(|| a.id.cmp(&b.id))
}

/// The eligible candidates, best first. Pure.
pub fn rank(mut candidates: Vec<Candidate<'_>>) -> Vec<Candidate<'_>> {
    candidates.retain(Candidate::eligible);
    candidates.sort_by(compare);
    candidates
}

/// Every capability of the view whose id matches `capability` and that passes `query` at `now`.
pub fn candidates<'a>(
    entries: &'a [std::sync::Arc<Entry>],
    capability: &Pattern,
    query: &Query,
    now: Millis,
    thresholds: &Thresholds,
) -> Vec<Candidate<'a>> {
    let latest = matches!(query.version, Some(VersionFilter::Latest))
        .then(|| Latest::of(entries.iter().map(AsRef::as_ref)));
    let mut found = Vec::new();
    for entry in entries.iter().map(AsRef::as_ref) {
        // Parsed once per agent, and only when one of its capabilities qualifies.
        let text = std::cell::OnceCell::new();
        let view = std::cell::OnceCell::new();
        for reasoner in [true, false] {
            let caps = if reasoner { entry.card.reasoners() } else { entry.card.skills() };
            for (position, cap) in caps.enumerate() {
                if !capability.matches(cap.id)
                    || !query.admits_capability(entry, reasoner, position, latest.as_ref())
                {
                    continue;
                }
                let health = entry.health(now, thresholds);
                if query.health.is_some_and(|wanted| wanted != health) {
                    continue;
                }
                let view = view.get_or_init(|| text.get_or_init(|| entry.card.text()).view());
                let list = if reasoner { &view.reasoners } else { &view.skills };
                found.push(Candidate {
                    entry,
                    reasoner,
                    id: cap.id.to_owned(),
                    health,
                    lifecycle: entry.lifecycle(),
                    confidence: list.get(position).and_then(|c| c.confidence_hint),
                    last_heartbeat: entry.last_heartbeat(now),
                });
            }
        }
    }
    found
}

#[derive(Serialize)]
struct Resolved {
    target: String,
    agent_id: String,
    kind: &'static str,
    id: String,
    version: String,
    base_url: String,
    health_status: &'static str,
    lifecycle: &'static str,
    publisher: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    confidence_hint: Option<f64>,
    /// Why this one: what set it apart from the next.
    reason: String,
    failover: Vec<String>,
}

const CAPABILITY_ALLOWED: &[&str] = &["a reasoner or skill id (the * wildcard allowed)"];

pub async fn resolve(State(app): State<AppState>, RawQuery(raw): RawQuery) -> Result<Response, ApiError> {
    let params = first_params(raw.as_deref().unwrap_or_default());
    let capability = params
        .iter()
        .find(|(k, _)| k == "capability")
        .map(|(_, v)| v.trim())
        .filter(|v| !v.is_empty())
        .ok_or_else(|| ParamError {
            parameter: "capability",
            provided: String::new(),
            allowed: CAPABILITY_ALLOWED,
        })?;
    let capability = Pattern::new(capability);
    let query = Query::from_params(&params)?;
    let now = now_millis();
    let snapshot = app.registry.snapshot();
    let thresholds = app.registry.thresholds();
    let ranked = rank(candidates(&snapshot.entries, &capability, &query, now, thresholds));
    let Some(best) = ranked.first() else {
        return Err(ApiError::NoMatch(
            "no active, non-draining agent offers that capability with these filters".to_owned(),
        ));
    };
    let card_text = best.entry.card.text();
    let card = card_text.view();
    let body = Resolved {
        target: best.target(),
        agent_id: best.entry.key.agent_id.clone(),
        kind: if best.reasoner { "reasoner" } else { "skill" },
        id: best.id.clone(),
        version: card.version.to_string(),
        base_url: card.base_url.to_string(),
        health_status: best.health.as_str(),
        lifecycle: best.lifecycle.as_str(),
        publisher: best.entry.publisher_name.to_string(),
        confidence_hint: best.confidence,
        reason: reason(best, ranked.get(1)),
        failover: ranked.iter().skip(1).take(RESOLVE_FAILOVER).map(Candidate::target).collect(),
    };
    Ok(Json(body).into_response())
}

/// What set `best` apart from `next`, in the policy's words.
fn reason(best: &Candidate<'_>, next: Option<&Candidate<'_>>) -> String {
    let mut said = vec![best.health.as_str().to_owned(), best.lifecycle.as_str().to_owned()];
    let Some(next) = next else {
        said.push("the only one".to_owned());
        return said.join(", ");
    };
    let decided = if health_rank(best.health) != health_rank(next.health) {
        "healthier"
    } else if best.lifecycle != next.lifecycle {
        "less busy"
    } else if best.confidence.unwrap_or(DEFAULT_CONFIDENCE) != next.confidence.unwrap_or(DEFAULT_CONFIDENCE) {
        "highest confidence_hint"
    } else if best.last_heartbeat != next.last_heartbeat {
        "freshest heartbeat"
    } else {
        "first by agent id and publisher"
    };
    said.push(decided.to_owned());
    said.join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::card::reported::Reported;
    use crate::card::AgentCard;
    use crate::registry::{Origin, RecordKey};

    const T: Thresholds = Thresholds {
        degraded_after: std::time::Duration::from_secs(7),
        inactive_after: std::time::Duration::from_secs(20),
    };

    fn entry(agent: &str, confidence: Option<f64>) -> Entry {
        let hint = confidence.map_or(String::new(), |c| format!(r#","confidence_hint":{c}"#));
        let json = format!(
            r#"{{"agent_id":"{agent}","base_url":"http://x","reasoners":[{{"id":"refund"{hint}}}]}}"#
        );
        let card = AgentCard::from_json(json.as_bytes()).unwrap();
        let key = RecordKey { agent_id: agent.to_owned(), publisher: libp2p::PeerId::random() };
        Entry::new(key, 1, &card, Origin::Remote, 0)
    }

    fn pick(entries: &[std::sync::Arc<Entry>], now: Millis) -> Vec<String> {
        let query = Query::default();
        rank(candidates(entries, &Pattern::new("refund"), &query, now, &T))
            .iter()
            .map(Candidate::target)
            .collect()
    }

    #[test]
    fn healthy_before_busy_before_confident_before_fresh() {
        let now = 100_000;
        let [stale, busy, sure, unsure, fresh, dead, draining] =
            ["stale", "busy", "sure", "unsure", "fresh", "dead", "draining"].map(|a| {
                let confidence = match a {
                    "sure" => Some(0.9),
                    "unsure" => Some(0.2),
                    _ => None,
                };
                std::sync::Arc::new(entry(a, confidence))
            });
        stale.beat(now - 10_000, Reported::Ready); // degraded
        busy.beat(now - 500, Reported::Busy);
        sure.beat(now - 3_000, Reported::Ready);
        unsure.beat(now - 100, Reported::Ready);
        fresh.beat(now - 100, Reported::Ready);
        dead.beat(now - 30_000, Reported::Ready); // inactive
        draining.beat(now, Reported::Draining);
        let all = [stale, busy, sure, unsure, fresh, dead, draining];
        assert_eq!(
            pick(&all, now),
            ["sure:refund", "fresh:refund", "unsure:refund", "busy:refund", "stale:refund"],
            "active+ready by confidence (none counts 0.5), then busy, then degraded; never inactive or draining"
        );
    }

    #[test]
    fn equal_candidates_tie_break_the_same_way_whatever_their_order() {
        let now = 50_000;
        let a: Vec<_> = ["b", "a", "c"].map(|id| std::sync::Arc::new(entry(id, None))).into();
        for e in &a {
            e.beat(now, Reported::Ready);
        }
        let mut reversed = a.clone();
        reversed.reverse();
        assert_eq!(pick(&a, now), ["a:refund", "b:refund", "c:refund"]);
        assert_eq!(pick(&a, now), pick(&reversed, now));
    }

    #[test]
    fn nothing_eligible_is_an_empty_ranking() {
        let now = 100_000;
        let e = std::sync::Arc::new(entry("gone", None));
        e.beat(now - 60_000, Reported::Ready);
        assert!(pick(&[e], now).is_empty());
    }
}
