use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use super::figures::{PEERS_BANNED_TOTAL, UNKNOWN_COUNTERS};
use super::*;
use crate::net::{CounterState, MeshState, Status};
use crate::registry::health::Thresholds;

fn metrics() -> (tempfile::TempDir, Metrics) {
    let dir = tempfile::tempdir().unwrap();
    let me = crate::identity::Identity::ephemeral().keypair().clone();
    let (registry, _) = crate::registry::Registry::open(dir.path(), me, Thresholds::default()).unwrap();
    (dir, Metrics::new(Arc::new(registry), Registry::default()))
}

fn status(counters: CounterState) -> Status {
    Status {
        peer_id: String::new(),
        listen_addrs: Vec::new(),
        connected_peers: 2,
        peer_low: 8,
        peer_high: 16,
        mesh_peers: BTreeMap::new(),
        routing_table_size: 3,
        banned_peers: 1,
        closed_mesh: false,
        records: BTreeMap::new(),
        mesh_state: MeshState {
            publishers: 0,
            list_entries: 0,
            tombstones: 0,
            max_agents_per_publisher: 0,
            max_remote_records: 0,
        },
        last_sync: None,
        counters,
    }
}

fn text(m: &Metrics, mesh: Option<Status>) -> String {
    text::to_prometheus_text(&m.encode(mesh).unwrap(), &UNKNOWN_COUNTERS)
}

fn has_line(out: &str, line: &str) {
    assert!(out.lines().any(|l| l == line), "missing `{line}` in\n{out}");
}

#[test]
fn requests_latency_cache_and_filters_are_counted() {
    let (_dir, m) = metrics();
    let q = Query::parse("format=xml&tags=a&reasoner=r*").unwrap();
    m.record(Some(&q), 200, Duration::from_micros(300), Some(false));
    m.record(Some(&q), 200, Duration::from_millis(20), Some(true));
    m.record(None, 400, Duration::from_micros(50), None);
    let out = text(&m, None);
    for line in [
        "agentmesh_discovery_requests_total{format=\"xml\",status=\"200\"} 2",
        "agentmesh_discovery_requests_total{format=\"invalid\",status=\"400\"} 1",
        "agentmesh_discovery_request_duration_seconds_bucket{le=\"0.0001\"} 1",
        "agentmesh_discovery_request_duration_seconds_bucket{le=\"0.0005\"} 2",
        "agentmesh_discovery_request_duration_seconds_bucket{le=\"0.025\"} 3",
        "agentmesh_discovery_request_duration_seconds_bucket{le=\"1.0\"} 3",
        "agentmesh_discovery_request_duration_seconds_bucket{le=\"+Inf\"} 3",
        "agentmesh_discovery_request_duration_seconds_count 3",
        "agentmesh_discovery_cache_hits_total 1",
        "agentmesh_discovery_cache_misses_total 1",
        "agentmesh_discovery_filter_usage_total{filter=\"tags\"} 2",
        "agentmesh_discovery_filter_usage_total{filter=\"reasoner\"} 2",
        "agentmesh_discovery_filter_usage_total{filter=\"skill\"} 0",
        "# TYPE agentmesh_discovery_requests_total counter",
        "# TYPE agentmesh_discovery_request_duration_seconds histogram",
    ] {
        has_line(&out, line);
    }
}

#[test]
fn the_view_is_read_at_scrape_time_and_every_health_is_listed() {
    let (_dir, m) = metrics();
    let out = text(&m, None);
    for line in [
        "# TYPE agentmesh_agents gauge",
        "agentmesh_agents 0",
        "agentmesh_local_agents 0",
        "agentmesh_records{health=\"active\"} 0",
        "agentmesh_records{health=\"degraded\"} 0",
        "agentmesh_records{health=\"inactive\"} 0",
        "agentmesh_records{health=\"unknown\"} 0",
    ] {
        has_line(&out, line);
    }
    assert!(!out.contains("agentmesh_peers"), "no mesh, no mesh figures:\n{out}");
}

#[test]
fn mesh_figures_keep_their_names_in_both_formats() {
    let (_dir, m) = metrics();
    let mut counters =
        CounterState { messages_in: 5, messages_out: 6, peers_banned: 4, ..Default::default() };
    counters.rejected.insert("bad_signature", 2);
    counters.rejected.insert("too_large", 1);
    let openmetrics = m.encode(Some(status(counters.clone()))).unwrap();
    // OpenMetrics: the counter of bans since start cannot share the gauge's family name.
    has_line(&openmetrics, "# TYPE agentmesh_peers_banned gauge");
    has_line(&openmetrics, "# TYPE agentmesh_peers_banned_total unknown");
    has_line(&openmetrics, "agentmesh_peers_banned_total 4");
    has_line(&openmetrics, "# TYPE agentmesh_gossip_messages counter");
    assert!(openmetrics.ends_with("# EOF\n"));
    let out = text(&m, Some(status(counters)));
    for line in [
        "agentmesh_peers 2",
        "# TYPE agentmesh_peers_banned gauge",
        "agentmesh_peers_banned 1",
        "# TYPE agentmesh_peers_banned_total counter",
        "agentmesh_peers_banned_total 4",
        "agentmesh_routing_table_size 3",
        "# TYPE agentmesh_gossip_messages_total counter",
        "agentmesh_gossip_messages_total{direction=\"in\"} 5",
        "agentmesh_gossip_messages_total{direction=\"out\"} 6",
        "agentmesh_gossip_verdicts_total{verdict=\"rejected\"} 3",
        "agentmesh_gossip_rejected_total{reason=\"bad_signature\"} 2",
        "agentmesh_gossip_rejected_total{reason=\"too_large\"} 1",
        "agentmesh_signature_failures_total 0",
        "agentmesh_sync_rounds_total 0",
        "agentmesh_connection_errors_total 0",
        "agentmesh_connections_denied_total 0",
        "agentmesh_peers_parted_total 0",
    ] {
        has_line(&out, line);
    }
    assert!(!out.contains("# EOF") && !out.contains("# UNIT"), "{out}");
    assert_eq!(UNKNOWN_COUNTERS, [format!("{PREFIX}_{PEERS_BANNED_TOTAL}").as_str()]);
}

#[test]
fn openmetrics_only_when_the_client_prefers_it() {
    use Exposition::{OpenMetrics, Text};
    // What Prometheus 2 and 3 send.
    let prometheus2 = "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1";
    let prometheus3 = "application/openmetrics-text;version=1.0.0;escaping=allow-utf-8;q=0.6,application/openmetrics-text;version=0.0.1;q=0.5,text/plain;version=1.0.0;escaping=allow-utf-8;q=0.4,text/plain;version=0.0.4;q=0.3,*/*;q=0.2";
    for (accept, expected) in [
        (None, Text),
        (Some("*/*"), Text),
        (Some("text/plain"), Text),
        (Some("application/json"), Text),
        (Some(prometheus2), OpenMetrics),
        (Some(prometheus3), OpenMetrics),
        (Some("Application/OpenMetrics-Text"), OpenMetrics),
        (Some("application/openmetrics-text; q=0"), Text),
        (Some("application/openmetrics-text;q=0.2, text/plain;q=0.9"), Text),
        (Some("text/plain;version=0.0.4;q=0.5, application/openmetrics-text;q=0.5"), OpenMetrics),
    ] {
        assert_eq!(Exposition::negotiate(accept), expected, "{accept:?}");
    }
}
