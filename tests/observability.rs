//! What operators watch: the metrics in both formats a scraper may ask for (parsed as a scraper does),
//! libp2p's own families, the Grafana dashboard's queries, and the JSON request log.

mod common;

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use common::daemon::Daemon;
use common::{dial_addr, fixture_cards, mesh_config, TestNode, DEADLINE};
use openmetrics_parser::prometheus::parse_prometheus;
use openmetrics_parser::{MetricFamily, MetricsExposition, PrometheusType, PrometheusValue};

/// The `Accept` header Prometheus 2 sends when it scrapes.
const PROMETHEUS_ACCEPT: &str = "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1";

/// A scrape in the Prometheus text format (what `curl` and clients without an `Accept` get), parsed
/// whole by a parser of that format: a malformed line, a counter without `_total`, a histogram that is
/// not cumulative or a family declared twice fails the scrape.
struct Scrape {
    families: MetricsExposition<PrometheusType, PrometheusValue>,
    body: String,
}

async fn scrape(node: &TestNode) -> Scrape {
    let (status, headers, body) = node.get_raw("/metrics").await;
    assert_eq!(status, 200);
    let content_type = headers["content-type"].to_str().unwrap();
    assert_eq!(content_type, "text/plain; version=0.0.4; charset=utf-8");
    let families = parse_prometheus(&body).unwrap_or_else(|e| panic!("{e:?} in\n{body}"));
    Scrape { families, body }
}

type Family = MetricFamily<PrometheusType, PrometheusValue>;

impl Scrape {
    fn family(&self, name: &str) -> Option<&Family> {
        self.families.families.get(name)
    }

    fn kind(&self, name: &str) -> Option<PrometheusType> {
        self.family(name).map(|f| f.family_type.clone())
    }

    /// The value of the sample of `family` with exactly these labels.
    fn value(&self, family: &str, labels: &[(&str, &str)]) -> Option<f64> {
        let family = self.family(family)?;
        let sample = family.iter_samples().find(|s| {
            let set = s.get_labelset().unwrap();
            set.iter().count() == labels.len()
                && labels.iter().all(|(k, v)| set.get_label_value(k) == Some(*v))
        })?;
        match &sample.value {
            PrometheusValue::Counter(c) => Some(c.value.as_f64()),
            PrometheusValue::Gauge(n) | PrometheusValue::Unknown(n) => Some(n.as_f64()),
            PrometheusValue::Histogram(h) => h.count.map(|c| c as f64),
            PrometheusValue::Summary(_) => None,
        }
    }

    fn at(&self, family: &str, labels: &[(&str, &str)]) -> f64 {
        self.value(family, labels).unwrap_or_else(|| panic!("no sample {family}{labels:?} in\n{}", self.body))
    }

    /// The sum of a counter family over all its label sets (0 without any).
    fn total(&self, family: &str) -> f64 {
        let Some(family) = self.family(family) else { return 0.0 };
        family
            .iter_samples()
            .map(|s| match &s.value {
                PrometheusValue::Counter(c) => c.value.as_f64(),
                _ => 0.0,
            })
            .sum()
    }

    /// Every series name a Prometheus server stores from this scrape, empty families included.
    fn series_names(&self) -> BTreeSet<String> {
        let mut names = BTreeSet::new();
        for (name, family) in &self.families.families {
            match family.family_type {
                PrometheusType::Histogram => {
                    for suffix in ["_bucket", "_sum", "_count"] {
                        names.insert(format!("{name}{suffix}"));
                    }
                }
                PrometheusType::Summary => {
                    for suffix in ["", "_sum", "_count"] {
                        names.insert(format!("{name}{suffix}"));
                    }
                }
                _ => {
                    names.insert(name.clone());
                }
            }
        }
        names
    }
}

/// Two meshed nodes, `a` with the fixture cards, once `b` holds them and counts its peer.
async fn mesh() -> (tempfile::TempDir, tempfile::TempDir, TestNode, TestNode) {
    let (da, db) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let a = TestNode::start(mesh_config(da.path(), Vec::new())).await;
    let b = TestNode::start(mesh_config(db.path(), vec![dial_addr(&a).await])).await;
    for card in fixture_cards() {
        a.register(&card).await;
    }
    b.wait_for("b to hold the four cards and count its peer", || async {
        let m = scrape(&b).await;
        (m.value("agentmesh_agents", &[]) == Some(4.0)
            && m.value("agentmesh_peers", &[]) == Some(1.0)
            && m.value("agentmesh_records", &[("health", "active")]) == Some(4.0)
            && m.value("agentmesh_gossip_messages_total", &[("direction", "in")]).unwrap_or_default() > 0.0)
            .then_some(())
    })
    .await;
    (da, db, a, b)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_count_discovery_requests_and_the_mesh() {
    let (_da, _db, a, b) = mesh().await;
    for query in [
        "format=json&tags=ml",
        "format=json&tags=ml",
        "format=xml&reasoner=*research*",
        "format=compact",
        "limit=-1",
    ] {
        a.get_raw(&format!("/api/v1/discovery/capabilities?{query}")).await;
    }
    let m = scrape(&a).await;
    let requests = "agentmesh_discovery_requests_total";
    assert_eq!(m.at(requests, &[("format", "json"), ("status", "200")]), 2.0);
    assert_eq!(m.at(requests, &[("format", "xml"), ("status", "200")]), 1.0);
    assert_eq!(m.at(requests, &[("format", "compact"), ("status", "200")]), 1.0);
    assert_eq!(m.at(requests, &[("format", "invalid"), ("status", "400")]), 1.0);
    assert_eq!(m.at("agentmesh_discovery_cache_hits_total", &[]), 1.0, "the repeated query");
    assert_eq!(m.at("agentmesh_discovery_cache_misses_total", &[]), 3.0);
    // The three answers computed are cached (within CACHE_MAX_AGE): at least their bodies' bytes.
    let cached = m.at("agentmesh_discovery_cache_size_bytes", &[]);
    assert!(cached > 100.0, "cache size {cached}");
    let latency = "agentmesh_discovery_request_duration_seconds";
    assert_eq!(m.at(latency, &[]), 5.0, "every request is in the histogram");
    let Some(PrometheusValue::Histogram(h)) =
        m.family(latency).and_then(|f| f.iter_samples().next()).map(|s| &s.value)
    else {
        panic!("{latency} is not a histogram");
    };
    assert_eq!(h.buckets.len(), 13, "twelve bounds and +Inf: {h:?}");
    assert_eq!(h.buckets.last().map(|b| (b.upper_bound, b.count.as_f64())), Some((f64::INFINITY, 5.0)));
    let filters = "agentmesh_discovery_filter_usage_total";
    assert_eq!(m.at(filters, &[("filter", "tags")]), 2.0);
    assert_eq!(m.at(filters, &[("filter", "reasoner")]), 1.0);
    assert_eq!(m.at(filters, &[("filter", "skill")]), 0.0, "unused filters are listed at zero");
    assert_eq!(m.at("agentmesh_local_agents", &[]), 4.0);
    assert_eq!(m.at("agentmesh_records", &[("health", "active")]), 4.0);

    // The other node heard the cards over gossip or sync and counts its peer (`mesh`).
    let m = scrape(&b).await;
    assert!(m.value("agentmesh_sync_rounds_total", &[]).is_some());
    assert!(m.value("agentmesh_signature_failures_total", &[]).is_some());
    assert!(m.value("agentmesh_gossip_verdicts_total", &[("verdict", "accepted")]).unwrap_or_default() > 0.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_families_users_rely_on_have_their_types_and_libp2p_reports_the_peer() {
    let (_da, _db, _a, b) = mesh().await;
    use PrometheusType::{Counter, Gauge, Histogram};
    // Families with labels appear with their first sample: one discovery request, and for libp2p's,
    // the events they count (a ping, a routing update).
    b.get_raw("/api/v1/discovery/capabilities").await;
    let m = b
        .wait_for("libp2p's connection, gossipsub, Kademlia, identify and ping figures", || async {
            let m = scrape(&b).await;
            let seen = m.total("libp2p_swarm_connections_established_total") >= 1.0
                && m.total("libp2p_gossipsub_messages_total") >= 1.0
                && m.total("libp2p_kad_routing_updated_total") >= 1.0
                && m.total("libp2p_identify_received_total") >= 1.0
                && m.value("libp2p_ping_rtt_seconds", &[]).unwrap_or_default() >= 1.0;
            seen.then_some(m)
        })
        .await;
    for (family, kind) in [
        ("agentmesh_discovery_requests_total", Counter),
        ("agentmesh_discovery_request_duration_seconds", Histogram),
        ("agentmesh_discovery_cache_hits_total", Counter),
        ("agentmesh_discovery_cache_misses_total", Counter),
        ("agentmesh_discovery_cache_size_bytes", Gauge),
        ("agentmesh_discovery_filter_usage_total", Counter),
        ("agentmesh_agents", Gauge),
        ("agentmesh_local_agents", Gauge),
        ("agentmesh_records", Gauge),
        ("agentmesh_resident_memory_bytes", Gauge),
        ("agentmesh_peers", Gauge),
        ("agentmesh_peers_banned", Gauge),
        ("agentmesh_routing_table_size", Gauge),
        ("agentmesh_gossip_messages_total", Counter),
        ("agentmesh_gossip_verdicts_total", Counter),
        ("agentmesh_gossip_rejected_total", Counter),
        ("agentmesh_signature_failures_total", Counter),
        ("agentmesh_sync_rounds_total", Counter),
        ("agentmesh_peers_banned_total", Counter),
        ("agentmesh_connection_errors_total", Counter),
        ("libp2p_swarm_connections_established_total", Counter),
        ("libp2p_swarm_connections_establishment_duration", Histogram),
        ("libp2p_gossipsub_messages_total", Counter),
        ("libp2p_kad_routing_updated_total", Counter),
        ("libp2p_identify_received_total", Counter),
        ("libp2p_identify_remote_protocols", Gauge),
        ("libp2p_ping_rtt_seconds", Histogram),
    ] {
        assert_eq!(m.kind(family), Some(kind), "{family} in\n{}", m.body);
    }
    // A node in a process whose allocator does not count (this test's) gives no heap figure at all,
    // rather than a made-up one.
    assert_eq!(m.kind("agentmesh_heap_live_bytes"), None, "{}", m.body);
    // b dialled a: one outbound TCP connection, labelled by its role and address stack.
    let established = "libp2p_swarm_connections_established_total";
    assert_eq!(m.at(established, &[("role", "Dialer"), ("protocols", "/ip4/tcp/p2p")]), 1.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prometheus_gets_openmetrics_with_the_same_series() {
    let (_da, _db, _a, b) = mesh().await;
    let response = b.http.get(b.url("/metrics")).header("accept", PROMETHEUS_ACCEPT).send().await.unwrap();
    assert_eq!(response.status(), 200);
    let content_type = response.headers()["content-type"].to_str().unwrap().to_owned();
    assert_eq!(content_type, "application/openmetrics-text; version=1.0.0; charset=utf-8");
    let openmetrics = response.text().await.unwrap();
    assert!(openmetrics.ends_with("\n# EOF\n"), "an OpenMetrics exposition ends with # EOF");
    for line in [
        "# TYPE agentmesh_gossip_messages counter",
        "# TYPE agentmesh_discovery_request_duration_seconds histogram",
        "# UNIT agentmesh_discovery_request_duration_seconds seconds",
        // Its counter name would clash with the gauge `agentmesh_peers_banned`'s family.
        "# TYPE agentmesh_peers_banned_total unknown",
        "# TYPE libp2p_swarm_connections_established counter",
    ] {
        assert!(openmetrics.lines().any(|l| l == line), "missing `{line}` in\n{openmetrics}");
    }
    // Every series Prometheus stores from OpenMetrics is one a text scrape taken after it also has:
    // the two formats differ in their descriptors, never in what they measure.
    let text = scrape(&b).await;
    let series = |body: &str| -> BTreeSet<String> {
        body.lines()
            .filter(|l| !l.starts_with('#') && !l.is_empty())
            .map(|l| l.rsplit_once(' ').map_or(l, |(series, _)| series).to_owned())
            .collect()
    };
    let missing: Vec<String> = series(&openmetrics).difference(&series(&text.body)).cloned().collect();
    assert!(missing.is_empty(), "in OpenMetrics only: {missing:?}");
}

/// The metric names a PromQL expression reads: its identifiers that are not functions or aggregations
/// (followed by `(`, `by` or `without`), keywords, label names (in `{}` or a `by (...)` list), ranges (in `[]`),
/// strings or Grafana variables (`$name`).
fn promql_metric_names(expr: &str) -> Vec<String> {
    let chars: Vec<char> = expr.chars().collect();
    let mut names = Vec::new();
    let mut label_list_next = false;
    let mut i = 0;
    let skip_to = |i: usize, close: char| {
        let (mut j, mut quoted) = (i + 1, false);
        while j < chars.len() && (quoted || chars[j] != close) {
            match chars[j] {
                '\\' => j += 1,
                '"' => quoted = !quoted,
                _ => {}
            }
            j += 1;
        }
        j + 1
    };
    while i < chars.len() {
        let c = chars[i];
        if c == '"' || c == '\'' {
            i = skip_to(i, c);
        } else if c == '{' {
            i = skip_to(i, '}');
        } else if c == '[' {
            i = skip_to(i, ']');
        } else if c == '(' && label_list_next {
            label_list_next = false;
            i = skip_to(i, ')');
        } else if c == '$' || c.is_ascii_digit() {
            i += 1;
            while i < chars.len() && (chars[i].is_ascii_alphanumeric() || "_.".contains(chars[i])) {
                i += 1;
            }
        } else if c.is_ascii_alphabetic() || c == '_' || c == ':' {
            let start = i;
            while i < chars.len() && (chars[i].is_ascii_alphanumeric() || "_:".contains(chars[i])) {
                i += 1;
            }
            let word: String = chars[start..i].iter().collect();
            // A function or aggregation: `f(`, or `sum by (..) (` / `sum without (..) (`.
            let rest: String = chars[i..].iter().collect::<String>().trim_start().to_owned();
            let called = rest.starts_with('(')
                || rest.starts_with("by ")
                || rest.starts_with("by(")
                || rest.starts_with("without ")
                || rest.starts_with("without(");
            if ["by", "without", "on", "ignoring", "group_left", "group_right"].contains(&word.as_str()) {
                label_list_next = true;
            } else if !called
                && !["and", "or", "unless", "bool", "offset", "inf", "nan"].contains(&word.as_str())
            {
                names.push(word);
            }
        } else {
            i += 1;
        }
    }
    names
}

#[test]
fn promql_metric_names_skip_functions_labels_ranges_and_variables() {
    let expr = r#"histogram_quantile(0.99, sum by (le) (rate(a_bucket{instance=~"$instance",x="b{c}"}[$__rate_interval]))) / on (job) group_left(team) b_total offset 5m and sum(c) without (d)"#;
    assert_eq!(promql_metric_names(expr), ["a_bucket", "b_total", "c"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_grafana_dashboard_reads_only_metrics_the_daemon_exports() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/docs/grafana-dashboard.json");
    let dashboard: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    // What Grafana needs to import it: a schema version, unique panel ids, a Prometheus datasource
    // variable that every panel and query uses.
    assert!(dashboard["schemaVersion"].as_u64().unwrap() >= 36);
    let variables = dashboard["templating"]["list"].as_array().unwrap();
    assert!(variables
        .iter()
        .any(|v| v["type"] == "datasource" && v["query"] == "prometheus" && v["name"] == "datasource"));
    let datasource = serde_json::json!({"type": "prometheus", "uid": "${datasource}"});
    let panels = dashboard["panels"].as_array().unwrap();
    let ids: BTreeSet<u64> = panels.iter().map(|p| p["id"].as_u64().unwrap()).collect();
    assert_eq!(ids.len(), panels.len(), "panel ids are unique");
    let mut exprs = Vec::new();
    for panel in panels.iter().filter(|p| p["type"] != "row") {
        assert_eq!(panel["datasource"], datasource, "{}", panel["title"]);
        let targets = panel["targets"].as_array().unwrap();
        let refs: BTreeSet<&str> = targets.iter().map(|t| t["refId"].as_str().unwrap()).collect();
        assert_eq!(refs.len(), targets.len(), "query ids are unique in {}", panel["title"]);
        for target in targets {
            assert_eq!(target["datasource"], datasource, "{}", panel["title"]);
            exprs.push(target["expr"].as_str().unwrap().to_owned());
        }
    }
    for variable in variables.iter().filter(|v| v["type"] == "query") {
        // `label_values(SELECTOR, LABEL)`: the selector names the metric.
        let query = variable["query"]["query"].as_str().unwrap();
        let args = query.strip_prefix("label_values(").and_then(|q| q.strip_suffix(')')).unwrap();
        exprs.push(args.rsplit_once(',').unwrap().0.to_owned());
    }
    let used: BTreeSet<String> = exprs.iter().flat_map(|e| promql_metric_names(e)).collect();
    for family in [
        "agentmesh_discovery_requests_total",
        "agentmesh_gossip_rejected_total",
        "agentmesh_peers_banned_total",
    ] {
        assert!(used.contains(family), "the dashboard shows {family}");
    }

    // Both nodes of a mesh, once each has counted what the dashboard shows: discovery requests,
    // pings, inbound Kademlia requests (names appear with their first sample).
    let (_da, _db, a, b) = mesh().await;
    a.get_raw("/api/v1/discovery/capabilities?tags=ml").await;
    let start = Instant::now();
    loop {
        let exported: BTreeSet<String> =
            scrape(&a).await.series_names().union(&scrape(&b).await.series_names()).cloned().collect();
        let missing: Vec<&String> = used.difference(&exported).collect();
        if missing.is_empty() {
            break;
        }
        assert!(start.elapsed() < DEADLINE, "the dashboard reads what no node exports: {missing:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_logs_carry_each_discovery_request_with_filters_counts_duration_and_cache() {
    let daemon = Daemon::start(&[]);
    for card in fixture_cards() {
        assert!(daemon.register(&card).await.status().is_success());
    }
    let url = format!("{}/api/v1/discovery/capabilities?tags=research&format=xml&limit=1", daemon.http);
    let completed = |e: &serde_json::Value| e["message"] == "discovery request completed";
    for expect_hit in [false, true] {
        assert_eq!(reqwest::get(&url).await.unwrap().status(), 200);
        let event = daemon.wait_log("discovery request completed", completed);
        assert_eq!(event["level"], "INFO");
        assert_eq!(event["format"], "xml");
        assert_eq!(event["status"], 200);
        assert_eq!(event["filters"], r#"["tags"]"#);
        assert_eq!(event["total_agents"], 2, "{event}");
        assert_eq!(event["returned"], 1);
        assert!(event["duration_ms"].as_f64().unwrap() >= 0.0);
        assert_eq!(event["cache_hit"], expect_hit);
    }
    let bad = format!("{}/api/v1/discovery/capabilities?limit=abc", daemon.http);
    assert_eq!(reqwest::get(&bad).await.unwrap().status(), 400);
    let event = daemon.wait_log("refused", |e| e["message"] == "discovery request refused");
    assert_eq!(event["status"], 400);
}

/// The daemon's memory as `/metrics` gives it: what it has resident, as the system counts it, and what
/// its heap holds live, counted by its allocator; a view that grows by megabytes grows both.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_daemon_serves_its_resident_memory_and_the_live_bytes_of_its_heap() {
    let daemon = Daemon::start(&[]);
    let memory = || async {
        let body = reqwest::get(format!("{}/metrics", daemon.http)).await.unwrap().text().await.unwrap();
        let families = parse_prometheus(&body).unwrap_or_else(|e| panic!("{e:?} in\n{body}"));
        let m = Scrape { families, body };
        (m.at("agentmesh_resident_memory_bytes", &[]), m.at("agentmesh_heap_live_bytes", &[]))
    };
    let (resident, live) = memory().await;
    let system = daemon.rss_mb() as f64 * 1024.0 * 1024.0;
    assert!(
        (resident - system).abs() <= system / 4.0,
        "resident {resident} B against {system} B in /proc/PID/status"
    );
    // Not bounded by the resident memory (untouched reservations count in full, `heap`), but frees count:
    // an idle daemon's heap is tens of megabytes, not the sum of everything it ever allocated.
    assert!(
        live >= 64.0 * 1024.0 && live <= resident + 64.0 * 1024.0 * 1024.0,
        "heap live {live} B, resident {resident} B"
    );
    // 200 agents whose descriptions do not compress: their cards are on the heap as long as they are in
    // the view.
    for n in 0..200 {
        let description = common::incompressible_text(n, 4000);
        let card = serde_json::json!({
            "agent_id": format!("bulky-{n}"),
            "base_url": "http://127.0.0.1:9/",
            "description": description,
            "skills": [{"id": "echo"}],
        });
        let response = daemon.register(&card).await;
        assert!(response.status().is_success(), "{n}: {}", response.status());
    }
    let (_, grown) = memory().await;
    assert!(grown - live >= 200.0 * 2000.0, "heap live {live} B, then {grown} B with 800 KB more of cards");
}

/// The span (`span`, innermost) and the chain of spans (`spans`, outermost first) of a JSON log event.
fn span_names(event: &serde_json::Value) -> Vec<String> {
    event["spans"].as_array().map_or_else(Vec::new, |spans| {
        spans.iter().map(|s| s["name"].as_str().unwrap_or_default().to_owned()).collect()
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_request_is_a_span_named_by_its_request_id_and_answers_with_it() {
    let daemon = Daemon::start(&[]);
    let client = reqwest::Client::new();
    let url = format!("{}/api/v1/discovery/capabilities?tags=research", daemon.http);

    // The client's id is kept, answered and carried by the request's log lines.
    let answer = client.get(&url).header("x-request-id", "trace-me-42").send().await.unwrap();
    assert_eq!(answer.headers()["x-request-id"], "trace-me-42");
    let event = daemon.wait_log("discovery log", |e| e["message"] == "discovery request completed");
    assert_eq!(event["span"]["name"], "request", "{event}");
    assert_eq!(event["span"]["request_id"], "trace-me-42", "{event}");
    assert_eq!(event["span"]["method"], "GET");
    assert_eq!(event["span"]["path"], "/api/v1/discovery/capabilities");

    // Without one (or with one too long or not printable), the node makes one, different each time.
    let mut made = std::collections::HashSet::new();
    for sent in [None, Some("x".repeat(129)), Some("two words".to_owned())] {
        let mut request = client.get(format!("{}/api/v1/health", daemon.http));
        if let Some(sent) = &sent {
            request = request.header("x-request-id", sent.as_str());
        }
        let answer = request.send().await.unwrap();
        let id = answer.headers()["x-request-id"].to_str().unwrap().to_owned();
        assert_eq!(id.len(), 16, "{id}");
        assert!(id.bytes().all(|b| b.is_ascii_hexdigit()), "{id}");
        assert!(made.insert(id), "request ids repeat");
    }
    // Errors are answered with it too.
    let answer = client.get(format!("{}/no/such/route", daemon.http)).send().await.unwrap();
    assert_eq!(answer.status(), 404);
    assert!(answer.headers().contains_key("x-request-id"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_card_fetched_by_sync_is_logged_inside_its_sync_question_and_ingest_spans() {
    let a = Daemon::start(&[]);
    for card in fixture_cards() {
        assert!(a.register(&card).await.status().is_success());
    }
    let status = a.status().await;
    let addr = format!("{}/p2p/{}", status["listen_addrs"][0].as_str().unwrap(), a.peer_id);
    let b = Daemon::start_logging("info,agentmesh::apply=debug", &["--bootstrap", &addr]);
    let applied = b.wait_log("a card applied by sync", |e| {
        e["message"] == "card applied" && span_names(e).contains(&"sync".to_owned())
    });
    // The round shows as its chain: the reconciliation that found the card missing, the fetch asked
    // while handling its answer, and the ingest of what the fetch brought.
    let names = span_names(&applied);
    let spans = applied["spans"].as_array().unwrap();
    let n = spans.len();
    assert!(n >= 3 && names[n - 1] == "ingest" && names[..n - 1].iter().all(|s| s == "sync"), "{applied}");
    assert_eq!(spans[0]["kind"], "reconcile", "{applied}");
    assert_eq!(spans[n - 2]["kind"], "fetch", "{applied}");
    for question in &spans[..n - 1] {
        assert_eq!(question["peer"], a.peer_id.to_string(), "{applied}");
    }
    assert_eq!(spans[n - 1]["source"], "sync", "{applied}");
    assert_eq!(spans[n - 1]["from"], a.peer_id.to_string(), "{applied}");
}
