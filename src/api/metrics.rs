//! `GET /metrics`: the node's metrics and libp2p's, in OpenMetrics or the Prometheus text format.
//!
//! Everything is a [prometheus-client](prometheus_client) family, encoded by its OpenMetrics encoder
//! into one exposition, from three registries in turn:
//! - the node's (`agentmesh_*`), built at start: discovery, counted on the request path
//!   ([`discovery`]), and the view, read at scrape time ([`figures::ViewFigures`]);
//! - the process's memory, read at scrape time ([`figures::ProcessFigures`]): resident, and the heap's
//!   live bytes when the allocator counts them ([`crate::heap`]);
//! - the mesh figures (`agentmesh_*`), from the mesh task's status, fetched at each scrape with a
//!   bounded wait ([`figures::MeshFigures`]);
//! - libp2p's own (`libp2p_*`): connections, gossipsub, Kademlia, identify and ping, recorded by the
//!   mesh event loop through libp2p-metrics. Gossipsub's internal figures (`Behaviour::with_metrics`)
//!   are left out: their peer-score histogram has negative buckets and a sum, which OpenMetrics
//!   forbids, and a strict parser refuses the whole scrape for it.
//!
//! The format is negotiated: OpenMetrics 1.0.0 when the client prefers it (Prometheus says so in its
//! `Accept` header), otherwise the Prometheus text format 0.0.4 ([`text`]), which this route has always
//! served and which `curl`, older agents and the OpenAPI document expect.

pub mod discovery;
pub mod figures;
pub mod text;

use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::http::header::{ACCEPT, CONTENT_TYPE, VARY};
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use prometheus_client::encoding::text::{encode_eof, encode_registry};
use prometheus_client::registry::Registry;

pub use discovery::{filter_names, format_name, DiscoveryMetrics};
use figures::{MeshFigures, ProcessFigures, ViewFigures, UNKNOWN_COUNTERS};

use super::error::ApiError;
use super::AppState;
use crate::query::Query;

/// The prefix of the node's own families.
pub const PREFIX: &str = "agentmesh";
/// How long a scrape waits for the mesh task's figures. A busy or stuck mesh task leaves them out of
/// that scrape (logged) rather than making the whole scrape time out.
pub const MESH_STATUS_WAIT: Duration = Duration::from_secs(2);
pub const OPENMETRICS_CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";
pub const TEXT_CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Every family the node serves: the registries and the handles the request path counts with.
pub struct Metrics {
    node: Registry,
    libp2p: Registry,
    discovery: DiscoveryMetrics,
}

impl Metrics {
    /// The node's families over `view`, and `libp2p`: the registry the mesh recorded into (empty for a
    /// node without a mesh).
    pub fn new(view: Arc<crate::registry::Registry>, libp2p: Registry) -> Self {
        let mut node = Registry::with_prefix(PREFIX);
        let discovery = DiscoveryMetrics::register(&mut node);
        node.register_collector(Box::new(ViewFigures(view)));
        node.register_collector(Box::new(ProcessFigures));
        Self { node, libp2p, discovery }
    }

    /// The discovery response cache's size, for the next scrape.
    pub fn set_cache_size(&self, bytes: usize) {
        self.discovery.set_cache_size(bytes);
    }

    /// Counts one finished discovery request (see [`DiscoveryMetrics::record`]).
    pub fn record(&self, query: Option<&Query>, status: u16, took: Duration, cache_hit: Option<bool>) {
        self.discovery.record(query, status, took, cache_hit);
    }

    /// The whole exposition, in OpenMetrics text, with the mesh's figures when given.
    pub fn encode(&self, mesh: Option<crate::net::Status>) -> Result<String, std::fmt::Error> {
        let mut out = String::with_capacity(32 * 1024);
        encode_registry(&mut out, &self.node)?;
        if let Some(status) = mesh {
            let mut scrape = Registry::with_prefix(PREFIX);
            scrape.register_collector(Box::new(MeshFigures(status)));
            encode_registry(&mut out, &scrape)?;
        }
        encode_registry(&mut out, &self.libp2p)?;
        encode_eof(&mut out)?;
        Ok(out)
    }
}

/// The two formats `/metrics` speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exposition {
    OpenMetrics,
    /// The Prometheus text format 0.0.4.
    Text,
}

impl Exposition {
    /// OpenMetrics when `Accept` ranks it at least as high as plain text, otherwise text (also for a
    /// missing, wildcard or unrelated `Accept`: a scrape is never refused for its header).
    pub fn negotiate(accept: Option<&str>) -> Self {
        let (mut openmetrics, mut text) = (0.0_f32, 0.0_f32);
        for range in accept.unwrap_or_default().split(',') {
            let mut parts = range.split(';').map(str::trim);
            let media = parts.next().unwrap_or_default().to_ascii_lowercase();
            let q = parts
                .filter_map(|p| p.split_once('='))
                .find(|(name, _)| name.trim().eq_ignore_ascii_case("q"))
                .map_or(1.0, |(_, q)| q.trim().parse::<f32>().unwrap_or(0.0));
            match media.as_str() {
                "application/openmetrics-text" => openmetrics = openmetrics.max(q),
                "text/plain" | "text/*" | "*/*" => text = text.max(q),
                _ => {}
            }
        }
        if openmetrics > 0.0 && openmetrics >= text {
            Self::OpenMetrics
        } else {
            Self::Text
        }
    }
}

/// Serves every family in the format the client asked for.
pub async fn metrics(State(app): State<AppState>, headers: HeaderMap) -> Response {
    let mesh = match &app.net {
        Some(net) => match tokio::time::timeout(MESH_STATUS_WAIT, net.status()).await {
            Ok(Ok(status)) => Some(status),
            Ok(Err(error)) => {
                tracing::debug!(%error, "mesh figures left out of a scrape");
                None
            }
            Err(_) => {
                let waited_ms = MESH_STATUS_WAIT.as_millis() as u64;
                tracing::warn!(waited_ms, "the mesh task did not answer; mesh figures left out of a scrape");
                None
            }
        },
        None => None,
    };
    app.metrics.set_cache_size(app.cache.bytes());
    let openmetrics = match app.metrics.encode(mesh) {
        Ok(body) => body,
        Err(error) => return ApiError::internal(&error).into_response(),
    };
    let accept = headers.get(ACCEPT).and_then(|v| v.to_str().ok());
    let (content_type, body) = match Exposition::negotiate(accept) {
        Exposition::OpenMetrics => (OPENMETRICS_CONTENT_TYPE, openmetrics),
        Exposition::Text => (TEXT_CONTENT_TYPE, text::to_prometheus_text(&openmetrics, &UNKNOWN_COUNTERS)),
    };
    ([(CONTENT_TYPE, content_type), (VARY, "accept")], body).into_response()
}

#[cfg(test)]
mod tests;
