//! agentmesh: a decentralized discovery layer for AI agents.
//!
//! # Layout
//!
//! - [`cli`], [`config`], [`defaults`]: the command line, layered settings and every default and limit.
//! - [`identity`]: the node's Ed25519 keypair (PeerId), created once in the data directory.
//! - [`card`]: the agent card model and its validation; [`card::held`], the compact form the view keeps.
//! - [`registry`]: the single owner of the view: sled persistence ([`registry::store`]), pure health
//!   derivation ([`registry::health`]), the immutable snapshot that queries read, and what the mesh
//!   needs (tombstones, remote heartbeats, eviction, digests).
//! - [`query`]: discovery parameters, wildcard matching, filtering and pagination (pure).
//! - [`api`]: the axum router: discovery (json, xml, compact, with a response cache), native and
//!   AgentField registration, errors as JSON.
//! - [`wire`]: the mesh wire format: signed, versioned CBOR envelopes for cards, heartbeats and
//!   tombstones; verification before decoding (pure).
//! - [`net`]: the mesh: one event-loop task owns the libp2p swarm (gossipsub, Kademlia, mDNS, identify,
//!   ping, request-response sync); an ingest worker verifies and applies what peers send.
//! - [`probe`]: optional liveness probes of local agents that do not heartbeat for themselves.
//! - [`node`]: the facade that starts all of the above and owns shutdown.
//!
//! Tasks: the HTTP server, the mesh event loop, the ingest worker. Writers are serialised by the
//! registry; readers never block.

pub mod api;
pub mod card;
pub mod cli;
pub mod config;
pub mod defaults;
pub mod identity;
pub mod net;
pub mod node;
pub mod probe;
pub mod query;
pub mod registry;
pub mod watch;
pub mod wire;
