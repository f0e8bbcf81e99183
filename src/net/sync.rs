//! Anti-entropy over a request-response protocol: compare digests, pull what is missing or newer.

use serde::{Deserialize, Serialize};
use serde_bytes::ByteBuf;

/// Protocol name of the sync exchange.
pub const PROTOCOL: &str = "/agentmesh/sync/1.0.0";

/// One record as a digest lists it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct DigestItem {
    pub publisher: ByteBuf,
    pub agent_id: String,
    pub seq: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum SyncRequest {
    /// "This is the fingerprint of what I hold": answer whether yours differs. Sent first, so that
    /// nodes already in sync exchange a few bytes instead of a digest of every record.
    Summary { fingerprint: u64, count: u64 },
    /// "This is everything I hold": answer with what I lack or hold older.
    Digest(Vec<DigestItem>),
    /// "Send me these records" (named by a heartbeat I could not match).
    Pull { publisher: ByteBuf, agent_ids: Vec<String> },
    /// "Send me this publisher's current agent list" (a heartbeat named a digest I hold no list for):
    /// answered with the publisher's signed heartbeat that carried it, or every signed chunk of a long
    /// list, or nothing.
    List { publisher: ByteBuf },
}

/// Signed messages (cards, or the heartbeat or chunks that carry a list), exactly as their publishers
/// made them; for a summary, whether the two views differ (then the requester sends its full digest).
#[derive(Debug, Clone, Serialize, Deserialize, Default)]
pub struct SyncResponse {
    pub cards: Vec<ByteBuf>,
    #[serde(default)]
    pub differs: bool,
    /// The answer was cut at `MAX_CARDS_PER_RESPONSE`: ask again once these are applied.
    #[serde(default)]
    pub more: bool,
}
