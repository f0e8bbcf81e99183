//! agentmesh: a decentralized discovery layer for AI agents.
//!
//! # Layout
//!
//! - [`cli`], [`config`], [`defaults`]: the command line, layered settings and every default and limit.
//! - [`client`]: the command-line client of a running daemon (`discover`, `agents`, `peers`) and the
//!   offline card tools (`card validate`, `card sign`).
//! - [`identity`]: the node's Ed25519 keypair (PeerId), created once in the data directory.
//! - [`card`]: the agent card model and its validation; [`card::held`], the compact form the view keeps;
//!   [`card::a2a`], the A2A 1.0 view, its JWS signature, and A2A cards as input.
//! - [`registry`]: the single owner of the view: sled persistence ([`registry::store`]), pure health
//!   derivation ([`registry::health`]), the immutable snapshot that queries read, and what the mesh
//!   needs (tombstones, remote heartbeats, eviction, digests).
//! - [`query`]: discovery parameters, wildcard matching, filtering and pagination (pure).
//! - [`api`]: the axum router: discovery (json, xml, compact, with a response cache), native and
//!   AgentField registration, A2A cards, the watch stream, metrics, the OpenAPI document, errors as JSON.
//! - [`wire`]: the mesh wire format: signed, versioned CBOR envelopes for cards, heartbeats and
//!   tombstones; verification before decoding (pure).
//! - [`net`]: the mesh: one event-loop task owns the libp2p swarm (gossipsub, Kademlia, mDNS, identify,
//!   ping, request-response sync); an ingest worker verifies and applies what peers send.
//! - [`manifest`]: capability manifests: directories of YAML files, each one local agent, parsed
//!   purely ([`manifest::parse`]), polled and hot-reloaded by their task ([`manifest::reload`]).
//! - [`probe`]: optional liveness probes of local agents that do not heartbeat for themselves, and the
//!   polling of agents' own card URLs.
//! - [`watch`]: registry change events (added, updated, health changed, removed) for the watch stream.
//! - [`webhook`]: those events delivered as signed POSTs to configured URLs, with retries.
//! - [`node`]: the facade that starts all of the above and owns shutdown.
//! - [`heap`]: the live bytes of the heap, counted by a wrapper of the global allocator (the daemon
//!   installs it), for `/metrics`.
//! - [`tasks`]: the node's supervised task set (a task that stops fails the node, naming it) and the
//!   non-overlapping periodic timer its loops share.
//!
//! Tasks, all in one supervised set: the HTTP server, the mesh event loop, the ingest worker, the
//! watcher, eviction, and (when configured) probes, card-URL polling, capability manifests and one task per webhook. Writers are serialised by the
//! registry; readers never block.

pub mod api;
pub mod card;
pub mod cli;
pub mod client;
pub mod clock;
pub mod config;
pub mod defaults;
pub mod heap;
pub mod identity;
pub mod manifest;
pub mod net;
pub mod node;
pub mod probe;
pub mod proto;
pub mod query;
pub mod registry;
pub mod search;
pub mod tasks;
pub mod watch;
pub mod webhook;
pub mod wire;
