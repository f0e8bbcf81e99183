//! The mesh protocol's decisions, free of I/O: no sled, no tokio, no swarm, no clock. Time is a
//! parameter ([`crate::clock::Millis`]); randomness comes from a seeded rng the caller owns. The mesh
//! shell (`net`) feeds these types what it hears and carries out what they decide; the simulator
//! (`simulations/sim`) runs the same code on a virtual network.
//!
//! - [`state`]: one node's protocol as a state machine, `State::handle(event, now) -> actions`,
//!   built on the parts below.
//! - [`announce`]: which of its own cards a node gossips one by one (the others are pulled).
//! - [`bans`]: strikes and bans for peers that keep sending what verification refuses.
//! - [`reconcile`]: record ids and range-based set reconciliation of two views (anti-entropy).
//! - [`fetch`]: which missing records to ask for, of one peer at a time.
//! - [`membership`]: failure detection by suspicion and indirect confirmation.
//! - [`target`]: the connection target: between `peer_low` and `peer_high` connections, partings
//!   agreed by both sides, a shuffle that bridges healed partitions.
//! - [`records`]: the rules of remote records: versions, tombstones, limits, leave and return,
//!   heartbeat lists, declarations, eviction.

pub mod announce;
pub mod bans;
pub mod fetch;
pub mod membership;
pub mod reconcile;
pub mod records;
pub mod state;
pub mod target;
