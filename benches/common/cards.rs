//! Synthetic agent cards shared by the benchmarks: realistic sizes (two reasoners and two skills, each
//! with input and output schemas), varied ids, descriptions and tags.

use agentmesh::card::AgentCard;
use serde_json::json;

const VERBS: [&str; 8] = ["deep", "quick", "plan", "summarize", "translate", "classify", "extract", "rank"];
const NOUNS: [&str; 13] = [
    "research", "text", "code", "image", "audio", "table", "graph", "email", "ticket", "invoice", "query",
    "log", "doc",
];
const TAGS: [&str; 20] = [
    "ml", "nlp", "vision", "speech", "search", "web", "db", "finance", "legal", "health", "ops", "security",
    "math", "code", "i18n", "support", "sales", "hr", "science", "research",
];

/// A card with two reasoners and two skills (four capabilities), each with input and output schemas.
pub fn card(i: usize) -> AgentCard {
    let cap = |k: usize, kind: &str| {
        let verb = VERBS[(i + k) % VERBS.len()];
        let noun = NOUNS[(i * 7 + k) % NOUNS.len()];
        json!({
            "id": format!("{verb}_{noun}_{kind}{k}"),
            "description": format!("{verb} a {noun} and return a structured result"),
            "tags": [TAGS[(i + k) % TAGS.len()], TAGS[(i * 3 + k) % TAGS.len()]],
            "input_schema": {"type": "object", "properties": {
                "input": {"type": "string", "description": format!("the {noun} to work on"), "minLength": 1},
                "max_items": {"type": "integer", "default": 10, "maximum": 100},
                "language": {"type": "string", "default": "en"}
            }, "required": ["input"]},
            "output_schema": {"type": "object", "properties": {
                "result": {"type": "string"}, "score": {"type": "number"}
            }},
        })
    };
    let value = json!({
        "agent_id": format!("agent-{i:05}"),
        "base_url": format!("http://10.0.{}.{}:8000", i / 250, i % 250),
        "version": "1.0.0",
        "description": "synthetic benchmark agent",
        "tags": [TAGS[i % TAGS.len()]],
        "reasoners": [cap(0, "r"), cap(1, "r")],
        "skills": [cap(2, "s"), cap(3, "s")],
    });
    AgentCard::from_json(value.to_string().as_bytes()).expect("synthetic card is valid")
}
