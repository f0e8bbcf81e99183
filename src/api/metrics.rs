//! `GET /metrics`: Prometheus text exposition (format 0.0.4) of discovery and mesh metrics.
//!
//! Discovery metrics are counted on the request path with atomics (a histogram is a fixed array of
//! buckets); mesh metrics are read from the mesh task's status when scraped. Written by hand: a dozen
//! families do not need a metrics registry crate.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use axum::extract::State;
use axum::http::header::CONTENT_TYPE;
use axum::response::{IntoResponse, Response};

use super::AppState;
use crate::query::{Format, Query};

/// Upper bounds (seconds) of the discovery latency histogram buckets.
pub const LATENCY_BUCKETS: [f64; 12] =
    [0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0];

/// Filters whose use is counted, by query parameter name.
const FILTERS: [&str; 9] = [
    "agent_ids",
    "reasoner",
    "skill",
    "tags",
    "health_status",
    "include_input_schema",
    "include_output_schema",
    "include_examples",
    "offset",
];

/// Discovery counters, shared by every request.
#[derive(Default)]
pub struct DiscoveryMetrics {
    /// (format, HTTP status) -> requests. `format` is `invalid` when the query did not parse.
    requests: Mutex<BTreeMap<(&'static str, u16), u64>>,
    buckets: [AtomicU64; LATENCY_BUCKETS.len()],
    latency_count: AtomicU64,
    latency_sum_ns: AtomicU64,
    cache_hits: AtomicU64,
    cache_misses: AtomicU64,
    filters: [AtomicU64; FILTERS.len()],
}

/// Which of the counted filters (`FILTERS`) a query uses, in that order.
pub fn filters_used(q: &Query) -> [bool; FILTERS.len()] {
    [
        !q.ids.is_empty(),
        q.reasoner.is_some(),
        q.skill.is_some(),
        !q.tags.is_empty(),
        q.health.is_some(),
        q.include_input_schema,
        q.include_output_schema,
        q.include_examples,
        q.offset > 0,
    ]
}

/// The names of the filters a query uses, for logs.
pub fn filter_names(q: &Query) -> Vec<&'static str> {
    FILTERS.iter().zip(filters_used(q)).filter(|(_, used)| *used).map(|(name, _)| *name).collect()
}

pub fn format_name(format: Format) -> &'static str {
    match format {
        Format::Json => "json",
        Format::Xml => "xml",
        Format::Compact => "compact",
    }
}

impl DiscoveryMetrics {
    /// Records one finished request. `query` is `None` when it did not parse; `cache_hit` is `None`
    /// when no cache lookup happened.
    pub fn record(&self, query: Option<&Query>, status: u16, took: Duration, cache_hit: Option<bool>) {
        let format = query.map_or("invalid", |q| format_name(q.format));
        *self.requests.lock().unwrap_or_else(|p| p.into_inner()).entry((format, status)).or_default() += 1;
        let secs = took.as_secs_f64();
        for (bucket, bound) in self.buckets.iter().zip(LATENCY_BUCKETS) {
            if secs <= bound {
                bucket.fetch_add(1, Ordering::Relaxed);
            }
        }
        self.latency_count.fetch_add(1, Ordering::Relaxed);
        self.latency_sum_ns.fetch_add(took.as_nanos() as u64, Ordering::Relaxed);
        match cache_hit {
            Some(true) => self.cache_hits.fetch_add(1, Ordering::Relaxed),
            Some(false) => self.cache_misses.fetch_add(1, Ordering::Relaxed),
            None => 0,
        };
        if let Some(q) = query {
            for (counter, used) in self.filters.iter().zip(filters_used(q)) {
                if used {
                    counter.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
    }

    fn render(&self, out: &mut String) {
        family(
            out,
            "agentmesh_discovery_requests_total",
            "counter",
            "Discovery requests by format and HTTP status.",
        );
        for ((format, status), n) in self.requests.lock().unwrap_or_else(|p| p.into_inner()).iter() {
            let _ = writeln!(
                out,
                "agentmesh_discovery_requests_total{{format=\"{format}\",status=\"{status}\"}} {n}"
            );
        }
        let name = "agentmesh_discovery_request_duration_seconds";
        family(out, name, "histogram", "Discovery request latency, parsing to rendered body.");
        for (bucket, bound) in self.buckets.iter().zip(LATENCY_BUCKETS) {
            let _ = writeln!(out, "{name}_bucket{{le=\"{bound}\"}} {}", bucket.load(Ordering::Relaxed));
        }
        let count = self.latency_count.load(Ordering::Relaxed);
        let _ = writeln!(out, "{name}_bucket{{le=\"+Inf\"}} {count}");
        let sum = self.latency_sum_ns.load(Ordering::Relaxed) as f64 / 1e9;
        let _ = writeln!(out, "{name}_sum {sum}\n{name}_count {count}");
        for (metric, help, value) in [
            (
                "agentmesh_discovery_cache_hits_total",
                "Discovery answers served from the response cache.",
                &self.cache_hits,
            ),
            (
                "agentmesh_discovery_cache_misses_total",
                "Discovery answers computed from the view.",
                &self.cache_misses,
            ),
        ] {
            family(out, metric, "counter", help);
            let _ = writeln!(out, "{metric} {}", value.load(Ordering::Relaxed));
        }
        let metric = "agentmesh_discovery_filter_usage_total";
        family(out, metric, "counter", "Discovery requests using each filter or option.");
        for (name, n) in FILTERS.iter().zip(&self.filters) {
            let _ = writeln!(out, "{metric}{{filter=\"{name}\"}} {}", n.load(Ordering::Relaxed));
        }
    }
}

fn family(out: &mut String, name: &str, kind: &str, help: &str) {
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
}

fn sample(out: &mut String, name: &str, kind: &str, help: &str, value: impl std::fmt::Display) {
    family(out, name, kind, help);
    let _ = writeln!(out, "{name} {value}");
}

/// Renders every metric: discovery, the view, and the mesh when this node runs one.
pub async fn metrics(State(app): State<AppState>) -> Response {
    let mut out = String::with_capacity(4096);
    app.metrics.render(&mut out);
    let snapshot = app.registry.snapshot();
    sample(&mut out, "agentmesh_agents", "gauge", "Agents in this node's view.", snapshot.entries.len());
    let local = snapshot.entries.iter().filter(|e| e.is_local()).count();
    sample(&mut out, "agentmesh_local_agents", "gauge", "Agents this node publishes.", local);
    let metric = "agentmesh_records";
    family(&mut out, metric, "gauge", "Records in the view by derived health.");
    let counts = app.registry.health_counts(crate::clock::now_millis());
    for health in crate::registry::health::Health::ALL {
        let _ =
            writeln!(out, "{metric}{{health=\"{}\"}} {}", health.as_str(), counts.get(&health).unwrap_or(&0));
    }
    if let Some(net) = &app.net {
        if let Ok(status) = net.status().await {
            mesh(&mut out, &status);
        }
    }
    ([(CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")], out).into_response()
}

fn mesh(out: &mut String, s: &crate::net::Status) {
    let c = &s.counters;
    sample(out, "agentmesh_peers", "gauge", "Connected peers.", s.connected_peers);
    sample(
        out,
        "agentmesh_peers_banned",
        "gauge",
        "Peers refused right now for misbehaving.",
        s.banned_peers,
    );
    sample(
        out,
        "agentmesh_routing_table_size",
        "gauge",
        "Peers in the Kademlia routing table.",
        s.routing_table_size,
    );
    let metric = "agentmesh_gossip_messages_total";
    family(out, metric, "counter", "Gossip messages received (in) and published (out).");
    let _ = writeln!(
        out,
        "{metric}{{direction=\"in\"}} {}\n{metric}{{direction=\"out\"}} {}",
        c.messages_in, c.messages_out
    );
    let metric = "agentmesh_gossip_verdicts_total";
    family(out, metric, "counter", "Received messages by verdict (rejected ones also by reason below).");
    let rejected: u64 = c.rejected.values().sum();
    for (verdict, n) in [
        ("accepted", c.accepted),
        ("ignored", c.ignored),
        ("rejected", rejected),
        ("dropped_overload", c.dropped_overload),
    ] {
        let _ = writeln!(out, "{metric}{{verdict=\"{verdict}\"}} {n}");
    }
    let metric = "agentmesh_gossip_rejected_total";
    family(out, metric, "counter", "Rejected messages by reason.");
    for (reason, n) in &c.rejected {
        let _ = writeln!(out, "{metric}{{reason=\"{reason}\"}} {n}");
    }
    sample(
        out,
        "agentmesh_signature_failures_total",
        "counter",
        "Messages whose envelope or A2A signature failed.",
        c.signature_failures,
    );
    sample(out, "agentmesh_sync_rounds_total", "counter", "Anti-entropy rounds.", c.sync_rounds);
    sample(out, "agentmesh_peers_banned_total", "counter", "Peers banned since start.", c.peers_banned);
    sample(
        out,
        "agentmesh_connection_errors_total",
        "counter",
        "Connections that failed before being established.",
        c.connection_errors,
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_latency_cache_and_filters_are_counted() {
        let m = DiscoveryMetrics::default();
        let q = Query::parse("format=xml&tags=a&reasoner=r*").unwrap();
        m.record(Some(&q), 200, Duration::from_micros(300), Some(false));
        m.record(Some(&q), 200, Duration::from_millis(20), Some(true));
        m.record(None, 400, Duration::from_micros(50), None);
        let mut out = String::new();
        m.render(&mut out);
        for line in [
            "agentmesh_discovery_requests_total{format=\"xml\",status=\"200\"} 2",
            "agentmesh_discovery_requests_total{format=\"invalid\",status=\"400\"} 1",
            "agentmesh_discovery_request_duration_seconds_bucket{le=\"0.0001\"} 1",
            "agentmesh_discovery_request_duration_seconds_bucket{le=\"0.0005\"} 2",
            "agentmesh_discovery_request_duration_seconds_bucket{le=\"0.025\"} 3",
            "agentmesh_discovery_request_duration_seconds_bucket{le=\"+Inf\"} 3",
            "agentmesh_discovery_request_duration_seconds_count 3",
            "agentmesh_discovery_cache_hits_total 1",
            "agentmesh_discovery_cache_misses_total 1",
            "agentmesh_discovery_filter_usage_total{filter=\"tags\"} 2",
            "agentmesh_discovery_filter_usage_total{filter=\"reasoner\"} 2",
            "agentmesh_discovery_filter_usage_total{filter=\"skill\"} 0",
        ] {
            assert!(out.lines().any(|l| l == line), "missing `{line}` in\n{out}");
        }
    }
}
