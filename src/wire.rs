//! The mesh wire format: versioned CBOR envelopes signed by the publishing node's key.
//!
//! Every message is the CBOR array `[v, kind, publisher, body, sig]` (arrays, not maps: field names would
//! be a fifth of a heartbeat). Every version keeps this five-element shape so that a node can tell an
//! unknown version from garbage. The signature covers
//! `"agentmesh/v1/" kind "\0" body`, so a signature made for one kind can never be replayed as another.
//! [`open`] checks size, version, publisher key and signature before it decodes the body: nothing a peer
//! sends is interpreted until its signature verifies. Pure: no I/O, no clock.

pub mod batch;

use libp2p::identity::{Keypair, PeerId};
use serde::{Deserialize, Serialize};
use serde_bytes::ByteBuf;

use crate::card::a2a::{Claim, SignatureError};
use crate::card::reported::Reported;
use crate::card::AgentCard;
use crate::identity::{public_key, PerPublisher};

/// The only envelope version this node reads and writes.
pub const WIRE_VERSION: u8 = 1;
pub use crate::defaults::{LIST_CHUNK_AGENTS, MAX_LIST_CHUNKS, MAX_MESSAGE_BYTES};

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
    ListChunk = 4,
    Down = 5,
}

impl Kind {
    pub fn from_u8(v: u8) -> Result<Kind, WireError> {
        match v {
            1 => Ok(Kind::Card),
            2 => Ok(Kind::Heartbeat),
            3 => Ok(Kind::Tombstone),
            4 => Ok(Kind::ListChunk),
            5 => Ok(Kind::Down),
            other => Err(WireError::UnknownKind(other)),
        }
    }

    fn domain(self) -> &'static [u8] {
        match self {
            Kind::Card => b"agentmesh/v1/card\0",
            Kind::Heartbeat => b"agentmesh/v1/heartbeat\0",
            Kind::Tombstone => b"agentmesh/v1/tombstone\0",
            Kind::ListChunk => b"agentmesh/v1/list-chunk\0",
            Kind::Down => b"agentmesh/v1/down\0",
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
/// A list of at most `LIST_CHUNK_AGENTS` agents travels in the `LIST_REPEATS` beats after it changed;
/// otherwise, and always for a longer list, a heartbeat carries just its `digest`, so its size never
/// grows with the number of agents. A node that holds no list for a digest fetches it over sync: the
/// signed heartbeat that carried it, or the publisher's signed [`ListChunkBody`] chunks. On the wire
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
serde_as_array!(ListChunkBody { digest, index, total, agents });

/// One part of a publisher's agent list too long for a heartbeat: chunk `index` of `total`, each of at
/// most `LIST_CHUNK_AGENTS` agents, of the list whose [`agents_digest`] is `digest`. Signed by the
/// publisher, so any node holding the chunks can serve them. On the wire
/// `[digest, index, total, agents]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListChunkBody {
    pub digest: u64,
    pub index: u32,
    pub total: u32,
    pub agents: Vec<HeartbeatAgent>,
}

/// Beats that carry a changed agent list (the change and its repeats, so that one lost message does
/// not leave nodes without it).
pub const LIST_REPEATS: u32 = 3;

/// Identifies an agent list (first 8 bytes of the SHA-256 of its CBOR).
pub fn agents_digest(agents: &[HeartbeatAgent]) -> u64 {
    use sha2::Digest as _;
    let hash = sha2::Sha256::digest(cbor(&agents));
    u64::from_be_bytes(hash[..8].try_into().unwrap_or_default())
}

/// Splits an agent list into the publisher's signed chunks (one chunk for an empty list).
pub fn seal_list_chunks(key: &Keypair, agents: &[HeartbeatAgent], digest: u64) -> Vec<Vec<u8>> {
    let parts: Vec<&[HeartbeatAgent]> =
        if agents.is_empty() { vec![&[]] } else { agents.chunks(LIST_CHUNK_AGENTS).collect() };
    let total = parts.len() as u32;
    parts
        .into_iter()
        .enumerate()
        .map(|(index, part)| {
            let body = ListChunkBody { digest, index: index as u32, total, agents: part.to_vec() };
            seal(key, Kind::ListChunk, cbor(&body))
        })
        .collect()
}

/// Why a set of chunks is not a whole list.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AssemblyError {
    #[error("chunks of different lists")]
    Mixed,
    #[error("{have} of {total} chunks")]
    Incomplete { have: usize, total: usize },
    #[error("the chunks do not make the list of their digest")]
    DigestMismatch,
}

/// Puts a publisher's list back together from its chunks (any order, repeats allowed) and checks it
/// against the digest they name. Pure.
pub fn assemble_list(chunks: &[ListChunkBody]) -> Result<(u64, Vec<HeartbeatAgent>), AssemblyError> {
    let Some(first) = chunks.first() else { return Err(AssemblyError::Incomplete { have: 0, total: 1 }) };
    let (digest, total) = (first.digest, first.total as usize);
    let mut parts: Vec<Option<&ListChunkBody>> = vec![None; total];
    for chunk in chunks {
        if chunk.digest != digest || chunk.total as usize != total {
            return Err(AssemblyError::Mixed);
        }
        // `open` guarantees index < total.
        if let Some(slot) = parts.get_mut(chunk.index as usize) {
            *slot = Some(chunk);
        }
    }
    let have = parts.iter().filter(|p| p.is_some()).count();
    if have < total {
        return Err(AssemblyError::Incomplete { have, total });
    }
    let agents: Vec<HeartbeatAgent> = parts.into_iter().flatten().flat_map(|c| c.agents.clone()).collect();
    if agents_digest(&agents) != digest {
        return Err(AssemblyError::DigestMismatch);
    }
    Ok((digest, agents))
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
    ListChunk(ListChunkBody),
    Down(DownBody),
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

/// "`target` is down": the signer lost its connection to it, and the peers it asked could not reach it
/// either (see `proto::membership`). `last_seen`: the `sent_at` of the newest heartbeat of `target` the
/// signer had heard; a heartbeat sent later refutes the declaration.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DownBody {
    pub target: ByteBuf,
    pub last_seen: u64,
}

pub fn seal_down(key: &Keypair, target: &PeerId, last_seen: u64) -> Vec<u8> {
    let body = DownBody { target: ByteBuf::from(target.to_bytes()), last_seen };
    seal(key, Kind::Down, cbor(&body))
}

/// Checks and decodes a message: size, version, publisher key and signature first, then the body.
pub fn open(bytes: &[u8]) -> Result<Verified, WireError> {
    parse(bytes)?.verify()?.decode()
}

/// A message whose envelope is well formed and whose publisher is a usable Ed25519 key. Its signature
/// is not checked yet, and nothing of its body is read until it is: [`Sealed::verify`] or
/// [`verify_all`] are the only ways to a [`Checked`] message, and only a checked one decodes.
#[derive(Debug)]
pub struct Sealed {
    kind: Kind,
    publisher: PeerId,
    key: ed25519_dalek::VerifyingKey,
    body: Vec<u8>,
    sig: Vec<u8>,
}

/// A message whose signature verified; [`Checked::decode`] reads its body.
#[derive(Debug)]
pub struct Checked(Sealed);

/// Reads the envelope: size, version, kind and publisher key. No signature check, no body decoding.
pub fn parse(bytes: &[u8]) -> Result<Sealed, WireError> {
    if bytes.len() > MAX_MESSAGE_BYTES {
        return Err(WireError::TooLarge(bytes.len()));
    }
    let env: Envelope = ciborium::from_reader(bytes).map_err(|e| WireError::Malformed(e.to_string()))?;
    if env.v != WIRE_VERSION {
        return Err(WireError::UnknownVersion(env.v));
    }
    let kind = Kind::from_u8(env.kind)?;
    let publisher = PeerId::from_bytes(&env.publisher).map_err(|_| WireError::BadPublisher)?;
    let key = verifying_key(&publisher).ok_or(WireError::BadPublisher)?;
    Ok(Sealed { kind, publisher, key, body: env.body.into_vec(), sig: env.sig.into_vec() })
}

/// Publisher keys kept decompressed, per thread, at most (the cache is emptied when full). Reading a
/// key from a PeerId decompresses a curve point twice (libp2p's key, then dalek's), about a third of
/// what checking a signature costs, and a mesh has few publishers that each send many messages.
pub const KEY_CACHE: usize = 1024;

/// The Ed25519 key of an Ed25519 PeerId. Keys of small order are refused: anyone can make a signature
/// that such a key "verifies", and batch verification must never meet one.
fn verifying_key(publisher: &PeerId) -> Option<ed25519_dalek::VerifyingKey> {
    thread_local! {
        static KEYS: std::cell::RefCell<PerPublisher<ed25519_dalek::VerifyingKey>> =
            std::cell::RefCell::new(PerPublisher::new(KEY_CACHE));
    }
    if let Some(key) = KEYS.with(|keys| keys.borrow().get(publisher).copied()) {
        return Some(key);
    }
    let key = public_key(publisher)?.try_into_ed25519().ok()?;
    let key = ed25519_dalek::VerifyingKey::from_bytes(&key.to_bytes()).ok()?;
    if key.is_weak() {
        return None;
    }
    KEYS.with(|keys| keys.borrow_mut().insert(*publisher, key));
    Some(key)
}

impl Sealed {
    pub fn publisher(&self) -> PeerId {
        self.publisher
    }

    /// For a card, the agent id and seq its body names, read before the signature is checked: only to
    /// drop, unchecked, a card of a version this node already holds or an older one (it would be
    /// ignored as stale after the check anyway). Nothing read here is used for anything else.
    pub fn card_version(&self) -> Option<(String, u64)> {
        #[derive(Deserialize)]
        struct Head {
            agent_id: String,
            seq: u64,
        }
        if self.kind != Kind::Card {
            return None;
        }
        let head: Head = ciborium::from_reader(self.body.as_slice()).ok()?;
        Some((head.agent_id, head.seq))
    }

    fn signature(&self) -> Option<ed25519_dalek::Signature> {
        ed25519_dalek::Signature::from_slice(&self.sig).ok()
    }

    /// Checks the signature alone, as libp2p checks Ed25519 signatures.
    pub fn verify(self) -> Result<Checked, WireError> {
        use ed25519_dalek::Verifier as _;
        let sig = self.signature().ok_or(WireError::BadSignature)?;
        match self.key.verify(&signing_input(self.kind, &self.body), &sig) {
            Ok(()) => Ok(Checked(self)),
            Err(_) => Err(WireError::BadSignature),
        }
    }
}

/// Verifies many messages at once: one Ed25519 batch equation for all of them (about twice as fast
/// per signature as one by one), then, only if the batch fails, each alone to find the culprits.
/// The result is the same as verifying each with [`Sealed::verify`]; order is kept.
pub fn verify_all(sealed: Vec<Sealed>) -> Vec<Result<Checked, WireError>> {
    if sealed.len() < 2 {
        return sealed.into_iter().map(Sealed::verify).collect();
    }
    let inputs: Vec<Vec<u8>> = sealed.iter().map(|s| signing_input(s.kind, &s.body)).collect();
    let passed =
        batch_verifies(sealed.iter().zip(&inputs).map(|(s, input)| (input.as_slice(), s.signature(), s.key)));
    if passed {
        sealed.into_iter().map(|s| Ok(Checked(s))).collect()
    } else {
        sealed.into_iter().map(Sealed::verify).collect()
    }
}

/// Whether every signature verifies, by one batch equation ([`batch::verify`]). False when any
/// signature is malformed or there are fewer than two: the caller then checks one by one, which decides.
fn batch_verifies<'a>(
    items: impl Iterator<Item = (&'a [u8], Option<ed25519_dalek::Signature>, ed25519_dalek::VerifyingKey)>,
) -> bool {
    let mut batch = Vec::new();
    for (message, sig, key) in items {
        let Some(sig) = sig else { return false };
        batch.push((message, sig, key));
    }
    batch.len() >= 2 && batch::verify(&batch)
}

impl Checked {
    pub fn publisher(&self) -> PeerId {
        self.0.publisher
    }

    /// Decodes the verified body and checks what the kind requires of it (a card's A2A signature
    /// included).
    pub fn decode(self) -> Result<Verified, WireError> {
        let (verified, claim) = self.decode_deferred()?;
        match claim {
            Some(claim) if !claim.verify() => Err(WireError::BadA2aSignature(SignatureError::Invalid)),
            _ => Ok(verified),
        }
    }

    /// [`decode`](Self::decode), with a card's A2A signature returned unverified.
    fn decode_deferred(self) -> Result<(Verified, Option<KeyedClaim>), WireError> {
        let Sealed { kind, publisher, key, body, sig } = self.0;
        let (message, claim) = decode_body(kind, publisher, &body)?;
        Ok((Verified { publisher, message, sig }, claim.map(|claim| KeyedClaim { key, claim })))
    }
}

/// An A2A signature to verify, with the publisher's key.
struct KeyedClaim {
    key: ed25519_dalek::VerifyingKey,
    claim: Claim,
}

impl KeyedClaim {
    fn signature(&self) -> Option<ed25519_dalek::Signature> {
        ed25519_dalek::Signature::from_slice(&self.claim.signature).ok()
    }

    fn verify(&self) -> bool {
        use ed25519_dalek::Verifier as _;
        self.signature().is_some_and(|sig| self.key.verify(&self.claim.input, &sig).is_ok())
    }
}

/// Decodes checked messages, verifying the A2A signatures their cards carry in one batch (and, only
/// if the batch fails, one by one). The same results as [`Checked::decode`] on each, in order.
pub fn decode_all(checked: Vec<Checked>) -> Vec<Result<Verified, WireError>> {
    let decoded: Vec<Result<(Verified, Option<KeyedClaim>), WireError>> =
        checked.into_iter().map(Checked::decode_deferred).collect();
    let claims = decoded.iter().filter_map(|d| d.as_ref().ok()?.1.as_ref());
    let passed = batch_verifies(claims.map(|c| (c.claim.input.as_slice(), c.signature(), c.key)));
    decoded
        .into_iter()
        .map(|d| {
            let (verified, claim) = d?;
            match claim {
                Some(claim) if !passed && !claim.verify() => {
                    Err(WireError::BadA2aSignature(SignatureError::Invalid))
                }
                _ => Ok(verified),
            }
        })
        .collect()
}

/// Decodes a body; a card comes with the A2A signature it claims, still to be verified.
fn decode_body(kind: Kind, publisher: PeerId, body: &[u8]) -> Result<(Message, Option<Claim>), WireError> {
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
            // Every node serves the publisher's A2A signature: it must be the publisher's (checked by
            // the caller, alone or in a batch).
            let claim = card.a2a_claim(&publisher)?;
            return Ok((Message::Card { body, card: Box::new(card) }, claim));
        }
        Kind::Heartbeat => {
            let body: HeartbeatBody = ciborium::from_reader(body).map_err(bad)?;
            if let Some(agents) = &body.agents {
                if agents.len() > LIST_CHUNK_AGENTS {
                    return Err(WireError::BadBody(format!("{} agents in one heartbeat", agents.len())));
                }
                if agents_digest(agents) != body.digest {
                    return Err(WireError::BadBody("agent list does not match its digest".into()));
                }
            }
            Message::Heartbeat(body)
        }
        Kind::Tombstone => Message::Tombstone(ciborium::from_reader(body).map_err(bad)?),
        Kind::ListChunk => {
            let body: ListChunkBody = ciborium::from_reader(body).map_err(bad)?;
            let total = body.total as usize;
            if total == 0 || total > MAX_LIST_CHUNKS || body.index >= body.total {
                return Err(WireError::BadBody(format!("list chunk {} of {}", body.index, body.total)));
            }
            if body.agents.len() > LIST_CHUNK_AGENTS {
                return Err(WireError::BadBody(format!("{} agents in one list chunk", body.agents.len())));
            }
            Message::ListChunk(body)
        }
        Kind::Down => {
            let body: DownBody = ciborium::from_reader(body).map_err(bad)?;
            if PeerId::from_bytes(&body.target).is_err() {
                return Err(WireError::BadBody("down: target is not a PeerId".into()));
            }
            Message::Down(body)
        }
    };
    Ok((message, None))
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
    fn batch_verification_agrees_with_one_by_one() {
        let key = test_key();
        let other = Keypair::ed25519_from_bytes([9u8; 32]).unwrap();
        let mut messages: Vec<Vec<u8>> =
            (0..40).map(|i| seal_card(&key, &card_body(&format!("a{i}"), i))).collect();
        messages.push(seal_heartbeat(&other, &HeartbeatBody { sent_at: 1, digest: 0, agents: None }));
        let all_good = verify_all(messages.iter().map(|m| parse(m).unwrap()).collect());
        assert!(all_good.iter().all(Result::is_ok));
        let decoded = all_good.into_iter().next().unwrap().unwrap().decode().unwrap();
        assert!(matches!(decoded.message, Message::Card { ref body, .. } if body.agent_id == "a0"));

        // One forged signature among them: it alone fails, in its place.
        let mut forged = parse(&messages[7]).unwrap();
        forged.sig[0] ^= 1;
        let mut sealed: Vec<Sealed> = messages.iter().map(|m| parse(m).unwrap()).collect();
        sealed[7] = forged;
        // A signature of the wrong length, too.
        sealed[20].sig.truncate(10);
        let results = verify_all(sealed);
        for (i, r) in results.iter().enumerate() {
            assert_eq!(r.is_err(), i == 7 || i == 20, "message {i}");
        }
        assert!(matches!(results[7], Err(WireError::BadSignature)));
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

    #[test]
    fn a_long_list_travels_in_signed_chunks_that_reassemble_in_any_order() {
        let key = test_key();
        let agents: Vec<HeartbeatAgent> = (0..2 * LIST_CHUNK_AGENTS + 5)
            .map(|i| HeartbeatAgent {
                agent_id: format!("agent-{i}"),
                seq: i as u64,
                reported: Reported::Ready,
            })
            .collect();
        let digest = agents_digest(&agents);
        let sealed = seal_list_chunks(&key, &agents, digest);
        assert_eq!(sealed.len(), 3);
        let mut chunks: Vec<ListChunkBody> = sealed
            .iter()
            .map(|m| {
                assert!(m.len() <= MAX_MESSAGE_BYTES);
                match open(m).unwrap().message {
                    Message::ListChunk(c) => c,
                    other => panic!("{other:?}"),
                }
            })
            .collect();
        chunks.reverse();
        chunks.push(chunks[0].clone());
        assert_eq!(assemble_list(&chunks), Ok((digest, agents.clone())));
        assert_eq!(assemble_list(&chunks[1..3]), Err(AssemblyError::Incomplete { have: 2, total: 3 }));
        // A chunk of another list, or chunks that do not make their digest.
        let mut other = chunks[0].clone();
        other.digest ^= 1;
        assert_eq!(assemble_list(&[chunks[1].clone(), other]), Err(AssemblyError::Mixed));
        let mut lying = chunks[..3].to_vec();
        lying[0].agents.pop();
        assert_eq!(assemble_list(&lying), Err(AssemblyError::DigestMismatch));
        // An empty list is one empty chunk.
        let empty = seal_list_chunks(&key, &[], agents_digest(&[]));
        assert_eq!(empty.len(), 1);
    }

    #[test]
    fn chunks_and_heartbeats_are_bounded() {
        let key = test_key();
        let agent =
            |i: usize| HeartbeatAgent { agent_id: format!("a{i}"), seq: 1, reported: Reported::Ready };
        let too_many: Vec<_> = (0..=LIST_CHUNK_AGENTS).map(agent).collect();
        let hb =
            HeartbeatBody { sent_at: 1, digest: agents_digest(&too_many), agents: Some(too_many.clone()) };
        assert!(matches!(open(&seal_heartbeat(&key, &hb)), Err(WireError::BadBody(_))));
        let chunk = |index, total, agents: Vec<HeartbeatAgent>| {
            seal(&key, Kind::ListChunk, cbor(&ListChunkBody { digest: 1, index, total, agents }))
        };
        assert!(matches!(open(&chunk(0, 1, too_many)), Err(WireError::BadBody(_))));
        assert!(matches!(open(&chunk(2, 2, vec![])), Err(WireError::BadBody(_))));
        assert!(matches!(open(&chunk(0, 0, vec![])), Err(WireError::BadBody(_))));
        assert!(matches!(open(&chunk(0, MAX_LIST_CHUNKS as u32 + 1, vec![])), Err(WireError::BadBody(_))));
        assert!(open(&chunk(1, 2, vec![agent(1)])).is_ok());
        // The longest ids in a full chunk still fit a message.
        let longest: Vec<_> = (0..LIST_CHUNK_AGENTS)
            .map(|i| HeartbeatAgent {
                agent_id: format!("{i:0>width$}", width = crate::defaults::MAX_ID_LEN),
                seq: u64::MAX,
                reported: Reported::Degraded,
            })
            .collect();
        let sealed = seal_list_chunks(&key, &longest, agents_digest(&longest));
        assert_eq!(sealed.len(), 1);
        assert!(sealed[0].len() < MAX_MESSAGE_BYTES, "{} bytes", sealed[0].len());
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
