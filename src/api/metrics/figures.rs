//! Figures read when scraped rather than counted as they happen: the view (agents, records by health)
//! and the mesh (the mesh task's [`Status`]). Each is a [`Collector`], so its families are written by
//! the same encoder as every other.

use std::sync::Arc;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Unit;

use crate::clock::now_millis;
use crate::net::Status;
use crate::registry::health::Health;
use crate::registry::Registry;

/// The view's figures, computed from the current snapshot at each scrape.
pub struct ViewFigures(pub Arc<Registry>);

impl std::fmt::Debug for ViewFigures {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ViewFigures")
    }
}

impl Collector for ViewFigures {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let snapshot = self.0.snapshot();
        let local = snapshot.of_publisher(&self.0.local_peer_id()).filter(|e| e.is_local()).count();
        gauge(&mut encoder, "agents", "Agents in this node's view.", snapshot.entries.len())?;
        gauge(&mut encoder, "local_agents", "Agents this node publishes.", local)?;
        let counts = self.0.health_counts(now_millis());
        let mut family = encoder.encode_descriptor(
            "records",
            "Records in the view by derived health.",
            None,
            MetricType::Gauge,
        )?;
        // Every health is listed, at zero too, so a dashboard's stack keeps its series.
        for health in Health::ALL {
            let n = counts.get(&health).copied().unwrap_or(0);
            ConstGauge::new(n).encode(family.encode_family(&[("health", health.as_str())])?)?;
        }
        Ok(())
    }
}

/// This process's memory at each scrape: what it has resident (`VmRSS` of `/proc/self/status`, on
/// Linux) and, when the global allocator counts ([`crate::heap`]), the heap's live bytes (see there for
/// how the two compare).
#[derive(Debug)]
pub struct ProcessFigures;

/// This process's resident memory, when the system says.
fn resident_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find_map(|l| l.strip_prefix("VmRSS:"))?;
    let kib: u64 = line.split_whitespace().next()?.parse().ok()?;
    Some(kib * 1024)
}

impl Collector for ProcessFigures {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        if let Some(bytes) = resident_bytes() {
            bytes_gauge(&mut encoder, "resident_memory", "Memory this process has resident.", bytes)?;
        }
        if let Some(bytes) = crate::heap::live_bytes() {
            let help =
                "Bytes the program holds allocated on the heap (what it asked for, freed blocks excluded).";
            bytes_gauge(&mut encoder, "heap_live", help, bytes)?;
        }
        Ok(())
    }
}

fn bytes_gauge(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    bytes: u64,
) -> Result<(), std::fmt::Error> {
    let family = encoder.encode_descriptor(name, help, Some(&Unit::Bytes), MetricType::Gauge)?;
    ConstGauge::new(bytes as i64).encode(family)
}

/// The mesh task's figures at one moment, fetched (with a bounded wait) just before the scrape is
/// encoded: the task owns the swarm, so they cannot be read from here.
#[derive(Debug)]
pub struct MeshFigures(pub Status);

impl Collector for MeshFigures {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let s = &self.0;
        let c = &s.counters;
        gauge(&mut encoder, "peers", "Connected peers.", s.connected_peers)?;
        gauge(&mut encoder, "peers_banned", "Peers refused right now for misbehaving.", s.banned_peers)?;
        gauge(
            &mut encoder,
            "routing_table_size",
            "Peers in the Kademlia routing table.",
            s.routing_table_size,
        )?;
        let help = "Gossip messages received (in) and published (out).";
        counters(
            &mut encoder,
            "gossip_messages",
            help,
            "direction",
            [("in", c.messages_in), ("out", c.messages_out)],
        )?;
        let help = "Received messages by verdict (rejected ones also by reason below).";
        counters(
            &mut encoder,
            "gossip_verdicts",
            help,
            "verdict",
            [
                ("accepted", c.accepted),
                ("ignored", c.ignored),
                ("rejected", c.rejected.values().sum()),
                ("dropped_overload", c.dropped_overload),
            ],
        )?;
        let reasons = c.rejected.iter().map(|(reason, n)| (*reason, *n));
        counters(&mut encoder, "gossip_rejected", "Rejected messages by reason.", "reason", reasons)?;
        let help = "Messages whose envelope or A2A signature failed.";
        counter(&mut encoder, "signature_failures", help, c.signature_failures)?;
        counter(&mut encoder, "sync_rounds", "Anti-entropy rounds.", c.sync_rounds)?;
        // A counter named `peers_banned` would be the family of the gauge above: in OpenMetrics two
        // families may not share a name, so this one keeps its sample name as a family of type
        // `unknown` (the Prometheus text format types it `counter` again: `text.rs`).
        let help = "Peers banned since start.";
        let family = encoder.encode_descriptor(PEERS_BANNED_TOTAL, help, None, MetricType::Unknown)?;
        ConstGauge::new(c.peers_banned).encode(family)?;
        let help = "Connections that failed before being established.";
        counter(&mut encoder, "connection_errors", help, c.connection_errors)?;
        let help = "Connections refused by this node's connection limits.";
        counter(&mut encoder, "connections_denied", help, c.connections_denied)?;
        let help = "Connections closed over the connection target (peer_high), each agreed to by the peer.";
        counter(&mut encoder, "peers_parted", help, c.peers_parted)
    }
}

/// The one family served as `unknown` in OpenMetrics that is a counter (see [`MeshFigures`]), without
/// the registry's `agentmesh_` prefix...
pub const PEERS_BANNED_TOTAL: &str = "peers_banned_total";
/// ...and with it: the families the Prometheus text format types `counter` again.
pub const UNKNOWN_COUNTERS: [&str; 1] = ["agentmesh_peers_banned_total"];

fn gauge(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    value: usize,
) -> Result<(), std::fmt::Error> {
    ConstGauge::new(value).encode(encoder.encode_descriptor(name, help, None, MetricType::Gauge)?)
}

fn counter(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    value: u64,
) -> Result<(), std::fmt::Error> {
    ConstCounter::new(value).encode(encoder.encode_descriptor(name, help, None, MetricType::Counter)?)
}

/// A counter family with one label.
fn counters<'a>(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    label: &'static str,
    values: impl IntoIterator<Item = (&'a str, u64)>,
) -> Result<(), std::fmt::Error> {
    let mut family = encoder.encode_descriptor(name, help, None, MetricType::Counter)?;
    for (value, n) in values {
        ConstCounter::new(n).encode(family.encode_family(&[(label, value)])?)?;
    }
    Ok(())
}
