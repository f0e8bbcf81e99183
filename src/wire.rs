//! The mesh wire format: versioned CBOR envelopes signed by the publishing node's key.
//!
//! Every message is the CBOR array `[v, kind, publisher, body, sig]` (arrays, not maps: field names would
//! be a fifth of a heartbeat). Every version keeps this five-element shape so that a node can tell an
//! unknown version from garbage. The signature covers
//! `"agentmesh/v1/" kind "\0" body`, so a signature made for one kind can never be replayed as another.
//! [`open`] checks size, version, publisher key and signature before it decodes the body: nothing a peer
//! sends is interpreted until its signature verifies. Pure: no I/O, no clock.

use libp2p::identity::{Keypair, PeerId, PublicKey};
use serde::{Deserialize, Serialize};
use serde_bytes::ByteBuf;

use crate::card::AgentCard;
use crate::registry::health::Reported;

/// The only envelope version this node reads and writes.
pub const WIRE_VERSION: u8 = 1;
/// Largest message accepted: room for a maximal card and for a heartbeat listing `MAX_AGENTS_PER_PUBLISHER`
/// agents. Every node must agree on it (gossipsub drops whole RPCs over its own limit).
pub const MAX_MESSAGE_BYTES: usize = 256 * 1024;
/// Most agents one heartbeat may list (and so one publisher may have).
pub const MAX_AGENTS_PER_PUBLISHER: usize = 4096;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    #[error("message of {0} bytes is over the limit")]
    TooLarge(usize),
    #[error("malformed envelope: {0}")]
    Malformed(String),
    #[error("unknown envelope version {0}")]
    UnknownVersion(u8),
    #[error("unknown message kind {0}")]
    UnknownKind(u8),
    #[error("publisher is not an Ed25519 PeerId")]
    BadPublisher,
    #[error("signature does not verify")]
    BadSignature,
    #[error("malformed body: {0}")]
    BadBody(String),
    #[error("card is invalid: {0}")]
    BadCard(String),
    #[error("card's A2A signature: {0}")]
    BadA2aSignature(#[from] crate::card::a2a::SignatureError),
}

impl WireError {
    /// A short, stable label for metrics and logs.
    pub fn reason(&self) -> &'static str {
        match self {
            WireError::TooLarge(_) => "too_large",
            WireError::Malformed(_) => "malformed",
            WireError::UnknownVersion(_) => "unknown_version",
            WireError::UnknownKind(_) => "unknown_kind",
            WireError::BadPublisher => "bad_publisher",
            WireError::BadSignature => "bad_signature",
            WireError::BadBody(_) => "bad_body",
            WireError::BadCard(_) => "bad_card",
            WireError::BadA2aSignature(_) => "bad_a2a_signature",
        }
    }
}

/// Message kinds, each with its own signing domain.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Card = 1,
    Heartbeat = 2,
    Tombstone = 3,
}

impl Kind {
    pub fn from_u8(v: u8) -> Result<Kind, WireError> {
        match v {
            1 => Ok(Kind::Card),
            2 => Ok(Kind::Heartbeat),
            3 => Ok(Kind::Tombstone),
            other => Err(WireError::UnknownKind(other)),
        }
    }

    fn domain(self) -> &'static [u8] {
        match self {
            Kind::Card => b"agentmesh/v1/card\0",
            Kind::Heartbeat => b"agentmesh/v1/heartbeat\0",
            Kind::Tombstone => b"agentmesh/v1/tombstone\0",
        }
    }
}

#[derive(Debug)]
struct Envelope {
    v: u8,
    kind: u8,
    publisher: ByteBuf,
    body: ByteBuf,
    sig: ByteBuf,
}

/// A card at a seq. `card` is the canonical JSON of the card (what [`AgentCard::to_json`] writes).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CardBody {
    pub agent_id: String,
    pub seq: u64,
    pub card: String,
}

/// One agent in a heartbeat: the card seq the publisher holds, and the agent's own status. On the wire
/// `[agent_id, seq, reported]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeartbeatAgent {
    pub agent_id: String,
    pub seq: u64,
    pub reported: Reported,
}

/// One per node per interval. `sent_at` (publisher's clock, ms) orders heartbeats and makes every one
/// distinct, so gossip never drops one as a duplicate.
///
/// The agent list travels only in the `LIST_REPEATS` beats after it changed; otherwise a heartbeat
/// carries just its `digest`, so its size does not grow with the number of agents. A node that holds no
/// list for a digest fetches the signed heartbeat that carried it over sync. On the wire
/// `[sent_at, digest, agents or null]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeartbeatBody {
    pub sent_at: u64,
    /// [`agents_digest`] of the publisher's current list.
    pub digest: u64,
    pub agents: Option<Vec<HeartbeatAgent>>,
}

/// Serialises a struct as a CBOR array of the listed fields, in order: no field names on the wire.
macro_rules! serde_as_array {
    ($ty:ident { $($field:ident),+ }) => {
        impl Serialize for $ty {
            fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                ($(&self.$field,)+).serialize(s)
            }
        }

        impl<'de> Deserialize<'de> for $ty {
            fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                let ($($field,)+) = Deserialize::deserialize(d)?;
                Ok($ty { $($field),+ })
            }
        }
    };
}

serde_as_array!(Envelope { v, kind, publisher, body, sig });
serde_as_array!(HeartbeatAgent { agent_id, seq, reported });
serde_as_array!(HeartbeatBody { sent_at, digest, agents });

/// Beats that carry a changed agent list (the change and its repeats, so that one lost message does
/// not leave nodes without it).
pub const LIST_REPEATS: u32 = 3;

/// Identifies an agent list (first 8 bytes of the SHA-256 of its CBOR).
pub fn agents_digest(agents: &[HeartbeatAgent]) -> u64 {
    use sha2::Digest as _;
    let hash = sha2::Sha256::digest(cbor(&agents));
    u64::from_be_bytes(hash[..8].try_into().unwrap_or_default())
}

/// Removal of one agent (`agent_id` set), or of every agent of the publisher (node leaving).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TombstoneBody {
    pub agent_id: Option<String>,
    pub seq: u64,
}

/// A verified, decoded message.
#[derive(Debug, Clone)]
pub enum Message {
    Card { body: CardBody, card: Box<AgentCard> },
    Heartbeat(HeartbeatBody),
    Tombstone(TombstoneBody),
}

/// A message that passed [`open`], with its publisher.
#[derive(Debug, Clone)]
pub struct Verified {
    pub publisher: PeerId,
    pub message: Message,
    /// The signature, kept so that the message can be re-sent exactly (anti-entropy).
    pub sig: Vec<u8>,
}

fn cbor<T: Serialize>(value: &T) -> Vec<u8> {
    let mut out = Vec::new();
    // Plain structs of strings, integers and byte strings: encoding into a Vec cannot fail.
    let _ = ciborium::into_writer(value, &mut out);
    out
}

fn signing_input(kind: Kind, body: &[u8]) -> Vec<u8> {
    let mut input = Vec::with_capacity(kind.domain().len() + body.len());
    input.extend_from_slice(kind.domain());
    input.extend_from_slice(body);
    input
}

/// Signs and encodes a body as it is, whatever it holds: [`open`] then judges it like any peer's
/// message (tooling, fuzzing and hostile-peer tests; the daemon seals through the typed `seal_*`).
pub fn seal(key: &Keypair, kind: Kind, body: Vec<u8>) -> Vec<u8> {
    let sig = key.sign(&signing_input(kind, &body)).unwrap_or_default();
    envelope(key.public().to_peer_id(), kind, body, sig)
}

fn envelope(publisher: PeerId, kind: Kind, body: Vec<u8>, sig: Vec<u8>) -> Vec<u8> {
    cbor(&Envelope {
        v: WIRE_VERSION,
        kind: kind as u8,
        publisher: ByteBuf::from(publisher.to_bytes()),
        body: ByteBuf::from(body),
        sig: ByteBuf::from(sig),
    })
}

pub fn seal_card(key: &Keypair, body: &CardBody) -> Vec<u8> {
    seal(key, Kind::Card, cbor(body))
}

/// Re-creates the exact signed card message from what the registry keeps (anti-entropy).
pub fn reseal_card(publisher: PeerId, body: &CardBody, sig: Vec<u8>) -> Vec<u8> {
    envelope(publisher, Kind::Card, cbor(body), sig)
}

/// The signature a card body gets (what the registry stores for local cards).
pub fn sign_card(key: &Keypair, body: &CardBody) -> Vec<u8> {
    key.sign(&signing_input(Kind::Card, &cbor(body))).unwrap_or_default()
}

/// Does `sig` verify as `publisher`'s signature over this card body?
pub fn verify_card(publisher: &PeerId, body: &CardBody, sig: &[u8]) -> bool {
    public_key(publisher).is_some_and(|key| key.verify(&signing_input(Kind::Card, &cbor(body)), sig))
}

pub fn seal_heartbeat(key: &Keypair, body: &HeartbeatBody) -> Vec<u8> {
    seal(key, Kind::Heartbeat, cbor(body))
}

pub fn seal_tombstone(key: &Keypair, body: &TombstoneBody) -> Vec<u8> {
    seal(key, Kind::Tombstone, cbor(body))
}

/// The Ed25519 public key an Ed25519 PeerId embeds (identity multihash of the protobuf key).
pub fn public_key(peer: &PeerId) -> Option<PublicKey> {
    let mh: &libp2p::multihash::Multihash<64> = peer.as_ref();
    if mh.code() != 0 {
        return None;
    }
    let key = PublicKey::try_decode_protobuf(mh.digest()).ok()?;
    key.clone().try_into_ed25519().ok()?;
    Some(key)
}

/// Checks and decodes a message: size, version, publisher key and signature first, then the body.
pub fn open(bytes: &[u8]) -> Result<Verified, WireError> {
    if bytes.len() > MAX_MESSAGE_BYTES {
        return Err(WireError::TooLarge(bytes.len()));
    }
    let env: Envelope = ciborium::from_reader(bytes).map_err(|e| WireError::Malformed(e.to_string()))?;
    if env.v != WIRE_VERSION {
        return Err(WireError::UnknownVersion(env.v));
    }
    let kind = Kind::from_u8(env.kind)?;
    let publisher = PeerId::from_bytes(&env.publisher).map_err(|_| WireError::BadPublisher)?;
    let key = public_key(&publisher).ok_or(WireError::BadPublisher)?;
    if !key.verify(&signing_input(kind, &env.body), &env.sig) {
        return Err(WireError::BadSignature);
    }
    let body = env.body.as_slice();
    let bad = |e: ciborium::de::Error<std::io::Error>| WireError::BadBody(e.to_string());
    let message = match kind {
        Kind::Card => {
            let body: CardBody = ciborium::from_reader(body).map_err(bad)?;
            let card =
                AgentCard::from_json(body.card.as_bytes()).map_err(|e| WireError::BadCard(e.to_string()))?;
            if card.agent_id != body.agent_id {
                return Err(WireError::BadCard("agent_id differs from the envelope's".into()));
            }
            // Cards travel in canonical form, so what every node stores and serves is the signed text.
            if card.to_json() != body.card.as_bytes() {
                return Err(WireError::BadCard("card JSON is not in canonical form".into()));
            }
            // Every node serves the publisher's A2A signature: it must be the publisher's.
            card.verify_a2a(&publisher)?;
            Message::Card { body, card: Box::new(card) }
        }
        Kind::Heartbeat => {
            let body: HeartbeatBody = ciborium::from_reader(body).map_err(bad)?;
            if let Some(agents) = &body.agents {
                if agents.len() > MAX_AGENTS_PER_PUBLISHER {
                    return Err(WireError::BadBody(format!("{} agents in one heartbeat", agents.len())));
                }
                if agents_digest(agents) != body.digest {
                    return Err(WireError::BadBody("agent list does not match its digest".into()));
                }
            }
            Message::Heartbeat(body)
        }
        Kind::Tombstone => Message::Tombstone(ciborium::from_reader(body).map_err(bad)?),
    };
    Ok(Verified { publisher, message, sig: env.sig.into_vec() })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn card_body(agent_id: &str, seq: u64) -> CardBody {
        let json =
            format!(r#"{{"agent_id":"{agent_id}","base_url":"http://127.0.0.1:1","skills":[{{"id":"s"}}]}}"#);
        let card = AgentCard::from_json(json.as_bytes()).unwrap().signed(&test_key());
        CardBody { agent_id: agent_id.into(), seq, card: String::from_utf8(card.to_json()).unwrap() }
    }

    /// One key for every card body of these tests, so the A2A signature matches the envelope's key.
    fn test_key() -> Keypair {
        Keypair::ed25519_from_bytes([7u8; 32]).unwrap()
    }

    #[test]
    fn sealed_messages_open_with_their_publisher() {
        let key = test_key();
        let body = card_body("a", 7);
        let v = open(&seal_card(&key, &body)).unwrap();
        assert_eq!(v.publisher, key.public().to_peer_id());
        assert!(matches!(v.message, Message::Card { body: ref b, .. } if *b == body));
        assert_eq!(reseal_card(v.publisher, &body, v.sig.clone()), seal_card(&key, &body), "re-sent exactly");

        let agents = vec![HeartbeatAgent { agent_id: "a".into(), seq: 7, reported: Reported::Degraded }];
        let hb = HeartbeatBody { sent_at: 5, digest: agents_digest(&agents), agents: Some(agents) };
        let mut lying = hb.clone();
        lying.digest ^= 1;
        assert!(matches!(open(&seal_heartbeat(&key, &lying)).unwrap_err(), WireError::BadBody(_)));
        assert!(
            matches!(open(&seal_heartbeat(&key, &hb)).unwrap().message, Message::Heartbeat(h) if h == hb)
        );
        let t = TombstoneBody { agent_id: None, seq: 9 };
        assert!(matches!(open(&seal_tombstone(&key, &t)).unwrap().message, Message::Tombstone(x) if x == t));
    }

    fn tamper(bytes: &[u8], f: impl FnOnce(&mut Envelope)) -> Vec<u8> {
        let mut env: Envelope = ciborium::from_reader(bytes).unwrap();
        f(&mut env);
        cbor(&env)
    }

    #[test]
    fn forgeries_are_rejected_before_decoding() {
        let key = test_key();
        let other = Keypair::generate_ed25519();
        let sealed = seal_card(&key, &card_body("a", 1));
        // Another publisher's name on this signature.
        let swapped =
            tamper(&sealed, |e| e.publisher = ByteBuf::from(other.public().to_peer_id().to_bytes()));
        assert_eq!(open(&swapped).unwrap_err(), WireError::BadSignature);
        // A changed body.
        let changed = tamper(&sealed, |e| e.body = ByteBuf::from(cbor(&card_body("a", 2))));
        assert_eq!(open(&changed).unwrap_err(), WireError::BadSignature);
        // A card signature replayed as a tombstone.
        let rekinded = tamper(&sealed, |e| e.kind = Kind::Tombstone as u8);
        assert_eq!(open(&rekinded).unwrap_err(), WireError::BadSignature);
        // Garbage body under a valid signature is still refused, after verification.
        let garbage = seal(&key, Kind::Card, b"not cbor".to_vec());
        assert!(matches!(open(&garbage), Err(WireError::BadBody(_))));
    }

    #[test]
    fn versions_kinds_sizes_and_publishers_are_checked() {
        let key = test_key();
        let sealed = seal_card(&key, &card_body("a", 1));
        assert_eq!(open(&tamper(&sealed, |e| e.v = 2)).unwrap_err(), WireError::UnknownVersion(2));
        assert_eq!(open(&tamper(&sealed, |e| e.kind = 9)).unwrap_err(), WireError::UnknownKind(9));
        assert_eq!(
            open(&tamper(&sealed, |e| e.publisher = ByteBuf::from(vec![1, 2]))).unwrap_err(),
            WireError::BadPublisher
        );
        assert_eq!(
            open(&vec![0u8; MAX_MESSAGE_BYTES + 1]).unwrap_err(),
            WireError::TooLarge(MAX_MESSAGE_BYTES + 1)
        );
        assert!(matches!(open(b"\xff\x00"), Err(WireError::Malformed(_))));
    }

    #[test]
    fn cards_must_be_valid_canonical_and_match_their_envelope() {
        let key = test_key();
        let mut body = card_body("a", 1);
        body.agent_id = "b".into();
        assert!(matches!(open(&seal_card(&key, &body)), Err(WireError::BadCard(_))));
        let mut body = card_body("a", 1);
        body.card = body.card.replace(",", ", ");
        assert!(matches!(open(&seal_card(&key, &body)), Err(WireError::BadCard(_))));
        let body = CardBody { agent_id: "a".into(), seq: 1, card: r#"{"agent_id":"a"}"#.into() };
        assert!(matches!(open(&seal_card(&key, &body)), Err(WireError::BadCard(_))));
    }

    #[test]
    fn a_card_must_carry_its_publishers_own_a2a_signature() {
        let key = test_key();
        let other = Keypair::generate_ed25519();
        let unsigned =
            AgentCard::from_json(br#"{"agent_id":"a","base_url":"http://h","skills":[{"id":"s"}]}"#).unwrap();
        let body = |card: &AgentCard| CardBody {
            agent_id: "a".into(),
            seq: 1,
            card: String::from_utf8(card.to_json()).unwrap(),
        };
        // Signed by another node, then wrapped in a valid envelope of this publisher's.
        let theirs = seal_card(&key, &body(&unsigned.clone().signed(&other)));
        let err = open(&theirs).unwrap_err();
        assert_eq!(err.reason(), "bad_a2a_signature");
        let none = seal_card(&key, &body(&unsigned));
        assert_eq!(open(&none).unwrap_err().reason(), "bad_a2a_signature");
        assert!(open(&seal_card(&key, &body(&unsigned.signed(&key)))).is_ok());
    }
}
