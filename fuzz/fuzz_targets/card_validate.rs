//! Card parsing and validation on any bytes, agentmesh or A2A form: never panics, and what passes is a
//! fixed point (its stored JSON parses back to the same card and passes again), as every node re-checks
//! what it hears. A card that passes can be signed, and its A2A signature then verifies.
#![no_main]

use agentmesh::card::{a2a, AgentCard};
use libfuzzer_sys::fuzz_target;
use libp2p_identity::Keypair;

fuzz_target!(|data: &[u8]| {
    let Ok(card) = AgentCard::from_json_any(data) else { return };
    let stored = card.to_json();
    let again = AgentCard::from_json(&stored).expect("a stored card parses again");
    assert_eq!(again.to_json(), stored, "stored form is canonical");
    again.validate().expect("a stored card validates again");
    let key = Keypair::ed25519_from_bytes([9u8; 32]).expect("fixed key");
    let signed = again.signed(&key);
    signed.validate().expect("signing a valid card keeps it valid");
    signed.verify_a2a(&key.public().to_peer_id()).expect("a signed card verifies");
    if let Some(served) = a2a::served(&signed) {
        serde_json::to_vec(&served).expect("an A2A card serialises");
    }
});
