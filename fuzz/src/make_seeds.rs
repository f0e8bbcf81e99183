//! Writes the seed corpus of every fuzz target: `cargo run --bin make_seeds` (from `fuzz/`).
//! Real messages and cards, so that fuzzing starts from inputs that get all the way through.

use std::fs;
use std::path::Path;

use agentmesh::card::AgentCard;
use agentmesh::registry::health::Reported;
use agentmesh::wire::{self, agents_digest, CardBody, HeartbeatAgent, HeartbeatBody, TombstoneBody};
use libp2p_identity::Keypair;

fn write(target: &str, name: &str, bytes: &[u8]) {
    let dir = Path::new("corpus").join(target);
    fs::create_dir_all(&dir).expect("corpus directory");
    fs::write(dir.join(name), bytes).expect("seed file");
}

fn main() {
    let mut cards = Vec::new();
    for dir in ["../config/cards", "../simulations/cards"] {
        let mut paths: Vec<_> = fs::read_dir(dir).expect(dir).flatten().map(|e| e.path()).collect();
        paths.sort();
        for path in paths.into_iter().filter(|p| p.extension().is_some_and(|e| e == "json")) {
            let text = fs::read_to_string(&path).expect("card file").replace("${HOSTNAME}", "seed");
            let name = path.file_stem().unwrap_or_default().to_string_lossy().into_owned();
            cards.push((name, text));
        }
    }
    let key = Keypair::ed25519_from_bytes([7u8; 32]).expect("fixed key");
    let mut agents = Vec::new();
    for (name, text) in &cards {
        write("card_validate", name, text.as_bytes());
        write("xml_render", name, text.as_bytes());
        let card = AgentCard::from_json(text.as_bytes()).expect("sample cards are valid").signed(&key);
        if let Some(a2a) = agentmesh::card::a2a::served(&card) {
            write("card_validate", &format!("a2a-{name}"), &serde_json::to_vec(&a2a).expect("JSON"));
        }
        let body = CardBody { agent_id: card.agent_id.clone(), seq: 3, card: String::from_utf8(card.to_json()).expect("utf-8") };
        let sealed = wire::seal_card(&key, &body);
        write("wire_open", &format!("card-{name}"), &[[0u8].as_slice(), &sealed].concat());
        agents.push(HeartbeatAgent { agent_id: card.agent_id, seq: 3, reported: Reported::Ready });
    }
    let heartbeat = HeartbeatBody { sent_at: 1_700_000_000_000, digest: agents_digest(&agents), agents: Some(agents) };
    write("wire_open", "heartbeat", &[[0u8].as_slice(), &wire::seal_heartbeat(&key, &heartbeat)].concat());
    let short = HeartbeatBody { agents: None, ..heartbeat };
    write("wire_open", "heartbeat-digest", &[[0u8].as_slice(), &wire::seal_heartbeat(&key, &short)].concat());
    let leave = TombstoneBody { agent_id: None, seq: 9 };
    write("wire_open", "leave", &[[0u8].as_slice(), &wire::seal_tombstone(&key, &leave)].concat());
    let one = TombstoneBody { agent_id: Some("research-seed".into()), seq: 4 };
    write("wire_open", "tombstone", &[[0u8].as_slice(), &wire::seal_tombstone(&key, &one)].concat());
    for (i, query) in [
        "reasoner=*research*&format=xml&include_input_schema=true",
        "skill=web_*&tags=ml,research&health_status=active&limit=10&offset=5",
        "agent_ids=a,b,c&format=compact&include_examples=yes\nagent=a&node_ids=b",
        "tags=*&include_descriptions=false&format=JSON\ntags=**&limit=0",
        "reasoner=a%7Cb&skill=%2A\nreasoner=a&skill=b",
    ]
    .iter()
    .enumerate()
    {
        write("query_parse", &format!("query-{i}"), query.as_bytes());
    }
    write("xml_render", "text-markup", "<a href=\"x\">&amp;]]>\u{1}\u{FFFE}'\"".as_bytes());
}
