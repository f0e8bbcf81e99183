//! `format=xml` must always be well-formed, whatever the cards hold. The input is a card (JSON), or
//! else text that is put into every free-text place of a card: descriptions, tags, version, schema
//! property names, descriptions and defaults.
#![no_main]

use agentmesh::card::AgentCard;
use agentmesh::query::{select, Query};
use agentmesh::registry::health::Thresholds;
use agentmesh::registry::{Entry, Origin, RecordKey};
use libfuzzer_sys::fuzz_target;
use libp2p_identity::PeerId;
use serde_json::json;

fn card_with_text(text: &str) -> Option<AgentCard> {
    let schema = json!({
        "type": "object",
        "required": [text],
        "properties": {
            text: {"type": text, "description": text, "default": text, "minimum": text,
                   "properties": {text: {"type": "string", "description": text}}},
            "nested": {"type": "array", "items": {"properties": {text: {"default": text}}}}
        }
    });
    let card = json!({
        "agent_id": "fuzz-agent",
        "base_url": "http://127.0.0.1:9",
        "version": text.chars().take(64).collect::<String>(),
        "description": text,
        "reasoners": [{"id": "r", "description": text, "tags": [text.chars().take(32).collect::<String>()],
                       "input_schema": schema, "output_schema": schema, "examples": [text]}],
        "skills": [{"id": "s", "description": text, "input_schema": schema}]
    });
    AgentCard::from_json(&serde_json::to_vec(&card).ok()?).ok()
}

fuzz_target!(|data: &[u8]| {
    let card = match AgentCard::from_json(data) {
        Ok(card) => card,
        Err(_) => match card_with_text(&String::from_utf8_lossy(data)) {
            Some(card) => card,
            None => return,
        },
    };
    let publisher = PeerId::random();
    let key = RecordKey { agent_id: card.agent_id.clone(), publisher };
    let entries = vec![Entry::new(key, 1, &card, Origin::Remote, 1_000)];
    let query = Query::parse(
        "format=xml&include_input_schema=true&include_output_schema=true&include_examples=true",
    )
    .expect("a fixed, valid query");
    let sel = select(&entries, &query, 2_000, &Thresholds::default());
    let xml = agentmesh::api::render::xml::render(&sel, &query, 2_000);
    let text = std::str::from_utf8(&xml).expect("XML output is UTF-8");
    if let Err(e) = roxmltree::Document::parse(text) {
        panic!("XML output does not parse: {e}\n{text}");
    }
});
