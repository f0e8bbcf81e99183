//! Discovery families, counted on the request path: requests by format and status, latency, the
//! response cache, and which filters requests use.

use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::{Registry, Unit};

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

/// `format` is `invalid` when the query did not parse. Both labels come from fixed sets (three formats
/// and `invalid`; the handler's few status codes), so the family stays small whatever clients send.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RequestLabels {
    format: &'static str,
    status: u16,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct FilterLabels {
    filter: &'static str,
}

/// Discovery counters, shared by every request. Handles into the node's metric registry: updating
/// one is an atomic add (a family's map takes a read lock once its label set exists).
#[derive(Clone)]
pub struct DiscoveryMetrics {
    requests: Family<RequestLabels, Counter>,
    latency: Histogram,
    cache_hits: Counter,
    /// The response cache's bodies in bytes, set when scraped.
    cache_size: Gauge,
    cache_misses: Counter,
    filters: Family<FilterLabels, Counter>,
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
    /// Registers the discovery families in `registry` (which carries the `agentmesh` prefix).
    pub fn register(registry: &mut Registry) -> Self {
        let metrics = Self {
            requests: Family::default(),
            latency: Histogram::new(LATENCY_BUCKETS),
            cache_hits: Counter::default(),
            cache_size: Gauge::default(),
            cache_misses: Counter::default(),
            filters: Family::default(),
        };
        // Every filter is listed from the start, at zero: a dashboard shows an unused filter as 0
        // rather than as no data.
        for filter in FILTERS {
            let _ = metrics.filters.get_or_create(&FilterLabels { filter });
        }
        registry.register(
            "discovery_requests",
            "Discovery requests by format and HTTP status",
            metrics.requests.clone(),
        );
        registry.register_with_unit(
            "discovery_request_duration",
            "Discovery request latency, parsing to rendered body",
            Unit::Seconds,
            metrics.latency.clone(),
        );
        registry.register(
            "discovery_cache_hits",
            "Discovery answers served from the response cache",
            metrics.cache_hits.clone(),
        );
        registry.register_with_unit(
            "discovery_cache_size",
            "Bytes of rendered answers the discovery response cache holds",
            Unit::Bytes,
            metrics.cache_size.clone(),
        );
        registry.register(
            "discovery_cache_misses",
            "Discovery answers computed from the view",
            metrics.cache_misses.clone(),
        );
        registry.register(
            "discovery_filter_usage",
            "Discovery requests using each filter or option",
            metrics.filters.clone(),
        );
        metrics
    }

    /// The response cache's size now.
    pub fn set_cache_size(&self, bytes: usize) {
        self.cache_size.set(i64::try_from(bytes).unwrap_or(i64::MAX));
    }

    /// Records one finished request. `query` is `None` when it did not parse; `cache_hit` is `None`
    /// when no cache lookup happened.
    pub fn record(&self, query: Option<&Query>, status: u16, took: Duration, cache_hit: Option<bool>) {
        let format = query.map_or("invalid", |q| format_name(q.format));
        self.requests.get_or_create(&RequestLabels { format, status }).inc();
        self.latency.observe(took.as_secs_f64());
        match cache_hit {
            Some(true) => self.cache_hits.inc(),
            Some(false) => self.cache_misses.inc(),
            None => 0,
        };
        if let Some(q) = query {
            for (filter, used) in FILTERS.into_iter().zip(filters_used(q)) {
                if used {
                    self.filters.get_or_create(&FilterLabels { filter }).inc();
                }
            }
        }
    }
}
