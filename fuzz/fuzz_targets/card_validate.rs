//! Card parsing and validation on any bytes: never panics, and what passes is a fixed point (its
//! stored JSON parses back to the same card and passes again), as every node re-checks what it hears.
#![no_main]

use agentmesh::card::AgentCard;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(card) = AgentCard::from_json(data) else { return };
    let stored = card.to_json();
    let again = AgentCard::from_json(&stored).expect("a stored card parses again");
    assert_eq!(again.to_json(), stored, "stored form is canonical");
    again.validate().expect("a stored card validates again");
});
