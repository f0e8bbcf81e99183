//! The bytes written from the card against their definition, `canonical(&payload(&view(card)))`, over
//! random cards: cards the daemon holds (made by `AgentCard::from_json` and `from_a2a`), and the same
//! cards with raw JSON put in by hand that no parser of ours would have let in (spaces, repeated
//! names, escapes of plain characters, held fields named like derived ones).

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::value::RawValue;
use serde_json::{json, Map, Value};

use super::payload_bytes;
use crate::card::a2a::jcs::random::{text, PIECES};
use crate::card::a2a::{canonical, from_a2a, payload, served, view, EXTENSION_URI};
use crate::card::AgentCard;

/// What the bytes must be: the view, cleaned, canonicalised.
fn defined(card: &AgentCard) -> Option<Vec<u8>> {
    view(card).map(|v| canonical(&payload(&v)))
}

fn assert_same(card: &AgentCard) {
    let (got, want) = (payload_bytes(card), defined(card));
    if got != want {
        let text = |b: Option<Vec<u8>>| b.map(|b| String::from_utf8_lossy(&b).into_owned());
        panic!(
            "payload differs for card {}\n got: {:?}\nwant: {:?}",
            String::from_utf8_lossy(&card.to_json()),
            text(got),
            text(want)
        );
    }
}

/// Text without control characters or `,` (tags, media types, metadata values): never empty.
fn word(rng: &mut StdRng) -> String {
    let plain = |p: &&str| !p.chars().any(|c| c.is_control() || c == ',');
    let pieces: Vec<&str> = PIECES.iter().copied().filter(plain).collect();
    (0..rng.random_range(1..5)).map(|_| pieces[rng.random_range(0..pieces.len())]).collect()
}

fn id(rng: &mut StdRng) -> String {
    const IDS: &[&str] = &["a", "b", "summarize", "fetch", "x-1", "y.2", "Z_3", "skill", "reasoner"];
    IDS[rng.random_range(0..IDS.len())].to_owned()
}

fn some<T>(rng: &mut StdRng, make: impl FnOnce(&mut StdRng) -> T) -> Option<T> {
    rng.random_bool(0.5).then(|| make(rng))
}

fn list(rng: &mut StdRng, max: usize, mut make: impl FnMut(&mut StdRng) -> String) -> Vec<String> {
    (0..rng.random_range(0..=max)).map(|_| make(rng)).collect()
}

/// A number as JSON text: integers small and past 2^53 and 2^64, fractions, exponents, `-0`.
fn number(rng: &mut StdRng) -> String {
    const FIXED: &[&str] = &[
        "0",
        "-0",
        "1.0",
        "-1.5",
        "1e2",
        "1E+2",
        "2.5e-7",
        "0.000001",
        "1e21",
        "1e-7",
        "9007199254740992",
        "9007199254740993",
        "-9007199254740993",
        "18446744073709551615",
        "18446744073709551616",
        "123456789012345678901234567890",
        "0.1",
        "5e-324",
        "1.7976931348623157e308",
    ];
    match rng.random_range(0..4) {
        0 => FIXED[rng.random_range(0..FIXED.len())].to_owned(),
        1 => rng.random::<i64>().to_string(),
        2 => format!("{:e}", rng.random::<f64>() * 10f64.powi(rng.random_range(-30..30))),
        _ => rng.random_range(-1000..1000).to_string(),
    }
}

/// A JSON string as text, each piece written plainly or escaped as JSON allows (`\u00e9`, `\/`, a
/// surrogate pair): the same string however it is spelt.
fn string_text(rng: &mut StdRng, s: &str) -> String {
    let mut out = String::from("\"");
    for c in s.chars() {
        let escaped = match c {
            '"' => "\\\"".to_owned(),
            '\\' => "\\\\".to_owned(),
            '/' if rng.random_bool(0.5) => "\\/".to_owned(),
            c if (c as u32) < 0x20 || rng.random_bool(0.2) => {
                let mut units = [0u16; 2];
                c.encode_utf16(&mut units).iter().map(|u| format!("\\u{u:04X}")).collect()
            }
            c => c.to_string(),
        };
        out.push_str(&escaped);
    }
    out.push('"');
    out
}

fn space(rng: &mut StdRng) -> &'static str {
    [" ", "", "", "\n  ", "\t"][rng.random_range(0..5)]
}

/// Raw JSON text of any kind, often with spaces, repeated member names and empty values.
fn raw_text(rng: &mut StdRng, depth: u32) -> String {
    match rng.random_range(0..if depth > 3 { 6 } else { 9 }) {
        0 => "null".to_owned(),
        1 => if rng.random() { "true" } else { "false" }.to_owned(),
        2 | 3 => number(rng),
        4 | 5 => {
            let s = text(rng);
            string_text(rng, &s)
        }
        6 => {
            let items = list(rng, 4, |rng| raw_text(rng, depth + 1));
            format!("[{}{}]", items.join(","), space(rng))
        }
        _ => raw_object(rng, depth),
    }
}

/// Names that collide with the view's own, and names whose UTF-16 order is not their byte order.
const NAMES: &[&str] = &[
    "type",
    "properties",
    "id",
    "name",
    "tags",
    "description",
    "extensions",
    "capabilities",
    "streaming",
    "securityRequirements",
    "provider",
    "iconUrl",
    "skills",
    "params",
    "",
    "é",
    "😀",
    "\u{fb01}",
    "a",
    "A",
];

fn raw_object(rng: &mut StdRng, depth: u32) -> String {
    let members = list(rng, 6, |rng| {
        let name =
            if rng.random_bool(0.7) { NAMES[rng.random_range(0..NAMES.len())].to_owned() } else { text(rng) };
        let name = string_text(rng, &name);
        format!("{}{name}{}:{}", space(rng), space(rng), raw_text(rng, depth + 1))
    });
    format!("{{{}{}}}", members.join(","), space(rng))
}

/// A JSON value as the card's JSON gives it (its numbers are whatever `raw_text` spelt).
fn value(rng: &mut StdRng, depth: u32) -> Value {
    serde_json::from_str(&raw_text(rng, depth)).unwrap()
}

fn object(rng: &mut StdRng) -> Value {
    serde_json::from_str(&raw_object(rng, 1)).unwrap()
}

fn metadata(rng: &mut StdRng) -> Value {
    let mut map = Map::new();
    for _ in 0..rng.random_range(0..4) {
        map.insert(id(rng), json!(if rng.random_bool(0.2) { String::new() } else { word(rng) }));
    }
    Value::Object(map)
}

fn security_requirements(rng: &mut StdRng) -> Value {
    let requirement = |rng: &mut StdRng| json!({"schemes": {id(rng): {"list": list(rng, 2, word)}}});
    Value::Array((0..rng.random_range(0..3)).map(|_| requirement(rng)).collect())
}

/// A2A fields a card may hold, each often empty or with empty parts.
fn held_card_fields(rng: &mut StdRng) -> Value {
    let mut held = Map::new();
    if rng.random() {
        held.insert("provider".into(), json!({"url": "http://p", "organization": text(rng)}));
    }
    if rng.random() {
        held.insert("iconUrl".into(), json!(if rng.random() { "http://i" } else { "" }));
    }
    if rng.random() {
        held.insert("documentationUrl".into(), json!("http://d"));
    }
    if rng.random() {
        let extension = |rng: &mut StdRng| {
            json!({"uri": format!("urn:x:{}", id(rng)), "description": text(rng), "required": rng.random::<bool>(),
                "params": object(rng)})
        };
        let extensions: Vec<Value> = (0..rng.random_range(0..3)).map(|_| extension(rng)).collect();
        held.insert(
            "capabilities".into(),
            json!({"streaming": rng.random::<bool>(), "extendedAgentCard": rng.random::<bool>(),
                "extensions": extensions}),
        );
    }
    if rng.random() {
        let scheme = json!({"httpAuthSecurityScheme": {"scheme": "bearer", "description": text(rng)}});
        held.insert("securitySchemes".into(), json!({ id(rng): scheme }));
    }
    if rng.random() {
        held.insert("securityRequirements".into(), security_requirements(rng));
    }
    Value::Object(held)
}

/// A capability in agentmesh's JSON: every field the view reads, often left out or empty.
fn capability(rng: &mut StdRng, cap_id: String) -> Value {
    let mut cap = Map::new();
    cap.insert("id".into(), json!(cap_id));
    let mut put = |rng: &mut StdRng, name: &str, make: &dyn Fn(&mut StdRng) -> Value| {
        if rng.random() {
            cap.insert(name.into(), make(rng));
        }
    };
    put(rng, "name", &|rng| json!(text(rng)));
    put(rng, "description", &|rng| json!(text(rng)));
    put(rng, "tags", &|rng| json!(list(rng, 3, word)));
    put(rng, "input_schema", &object);
    put(rng, "output_schema", &object);
    put(rng, "examples", &|rng| Value::Array((0..rng.random_range(0..4)).map(|_| value(rng, 1)).collect()));
    put(rng, "category", &|rng| json!(["weather", "nlp", "x-1"][rng.random_range(0..3)]));
    put(rng, "requires", &|rng| json!(list(rng, 3, |rng| format!("agent:reasoner:{}", id(rng)))));
    put(rng, "required_secrets", &|rng| json!(list(rng, 2, id)));
    put(rng, "has_side_effects", &|rng| json!(rng.random::<bool>()));
    put(rng, "confidence_hint", &|rng| {
        json!([0.0, 1.0, 0.75, 0.1, 1.0 / 3.0, rng.random::<f64>()][rng.random_range(0..6)])
    });
    put(rng, "metadata", &metadata);
    put(rng, "input_modes", &|rng| json!(list(rng, 2, word)));
    put(rng, "output_modes", &|rng| json!(list(rng, 2, word)));
    put(rng, "a2a", &|rng| json!({"securityRequirements": security_requirements(rng)}));
    Value::Object(cap)
}

fn capabilities(rng: &mut StdRng, taken: &[String]) -> Vec<Value> {
    let mut ids: Vec<String> = Vec::new();
    for _ in 0..rng.random_range(0..4) {
        // Skills often share an id with a reasoner.
        let chosen = match taken.get(rng.random_range(0..taken.len() + 2)) {
            Some(t) => t.clone(),
            None => id(rng),
        };
        if !ids.contains(&chosen) {
            ids.push(chosen);
        }
    }
    ids.into_iter().map(|id| capability(rng, id)).collect()
}

/// An agentmesh card as a client registers it.
fn card_json(rng: &mut StdRng) -> Value {
    let mut card = Map::new();
    card.insert("agent_id".into(), json!(id(rng)));
    card.insert("base_url".into(), json!(format!("http://h/{}", id(rng))));
    let mut put = |rng: &mut StdRng, name: &str, make: &dyn Fn(&mut StdRng) -> Value| {
        if rng.random() {
            card.insert(name.into(), make(rng));
        }
    };
    put(rng, "name", &|rng| json!(text(rng)));
    put(rng, "description", &|rng| json!(text(rng)));
    put(rng, "version", &|rng| json!(if rng.random() { String::new() } else { text(rng) }));
    put(rng, "group_id", &|rng| json!(id(rng)));
    put(rng, "deployment_type", &|rng| json!(text(rng)));
    put(rng, "tags", &|rng| json!(list(rng, 3, word)));
    put(rng, "category", &|rng| json!(["weather", "nlp", "x-1"][rng.random_range(0..3)]));
    put(rng, "metadata", &metadata);
    put(rng, "input_modes", &|rng| json!([word(rng)]));
    put(rng, "output_modes", &|rng| json!([word(rng), word(rng)]));
    put(rng, "interfaces", &|rng| {
        let interface = |rng: &mut StdRng| {
            json!({"url": format!("wss://h/{}", id(rng)), "protocol_binding": word(rng),
                "protocol_version": "1.0", "tenant": if rng.random() { text(rng) } else { String::new() }})
        };
        Value::Array((0..rng.random_range(0..3)).map(|_| interface(rng)).collect())
    });
    put(rng, "a2a", &held_card_fields);
    let reasoners = capabilities(rng, &[]);
    let reasoner_ids: Vec<String> = reasoners.iter().map(|r| r["id"].as_str().unwrap().to_owned()).collect();
    card.insert("reasoners".into(), Value::Array(reasoners));
    card.insert("skills".into(), Value::Array(capabilities(rng, &reasoner_ids)));
    Value::Object(card)
}

fn raw(text: String) -> Box<RawValue> {
    RawValue::from_string(text).unwrap()
}

/// `card` with raw JSON no parser of ours lets in: as written (spaces, repeated names, escaped plain
/// characters, schemas of any kind), held fields of any name and kind.
fn with_raw_json_by_hand(rng: &mut StdRng, mut card: AgentCard) -> AgentCard {
    if rng.random() {
        card.a2a = Some(raw(raw_object(rng, 0)));
    }
    if rng.random_bool(0.2) {
        card.a2a = Some(raw(raw_text(rng, 0)));
    }
    if rng.random_bool(0.3) {
        card.version = String::new();
        card.name = String::new();
    }
    for cap in card.reasoners.iter_mut().chain(card.skills.iter_mut()) {
        cap.input_schema = some(rng, |rng| raw(raw_text(rng, 0)));
        cap.output_schema = some(rng, |rng| raw(raw_object(rng, 0)));
        cap.examples = (0..rng.random_range(0..3)).map(|_| raw(raw_text(rng, 1))).collect();
        cap.a2a = some(rng, |rng| raw(raw_object(rng, 0)));
        if rng.random_bool(0.2) {
            cap.tags = vec![String::new()];
            cap.name = Some(String::new());
        }
    }
    card
}

#[test]
fn the_bytes_written_from_the_card_are_the_canonical_clean_view() {
    let mut rng = StdRng::seed_from_u64(8785);
    let (mut held, mut refused, mut with_view, mut read_back) = (0, 0, 0, 0);
    for _ in 0..4000 {
        let json = card_json(&mut rng);
        let card = match AgentCard::from_json(json.to_string().as_bytes()) {
            Ok(card) => card,
            Err(_) => {
                refused += 1;
                continue;
            }
        };
        held += 1;
        assert_same(&card);
        if let Some(served) = served(&card) {
            with_view += 1;
            // The A2A card served, read back as a card (as `from_json_any` reads an A2A card).
            if let Ok(back) = from_a2a(served) {
                read_back += 1;
                assert_same(&back);
            }
        }
        assert_same(&with_raw_json_by_hand(&mut rng, card));
    }
    assert!(held > 3 * refused, "{held} cards held, {refused} refused: the generator makes bad cards");
    assert!(with_view > held / 2, "{with_view} of {held} cards have a view");
    assert!(read_back > with_view * 9 / 10, "{read_back} of {with_view} served cards read back");
}

#[test]
fn fixture_cards_are_written_as_their_views() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/a2a-cards");
    let mut count = 0;
    for entry in std::fs::read_dir(dir).unwrap() {
        let text = std::fs::read_to_string(entry.unwrap().path()).unwrap();
        if let Ok(card) = AgentCard::from_json_any(text.as_bytes()) {
            assert_same(&card);
            count += 1;
        }
    }
    assert!(count >= 12, "{count} fixture cards");
}

#[test]
fn held_fields_that_do_not_read_as_values_are_left_out_as_the_view_leaves_them() {
    let mut card =
        AgentCard::from_json(br#"{"agent_id":"a","base_url":"http://h","skills":[{"id":"s"}]}"#).unwrap();
    // A lone surrogate: raw JSON accepts it, a `Value` does not.
    card.a2a = Some(raw(r#"{"iconUrl":"http://i","other":"\ud800"}"#.to_owned()));
    card.skills[0].a2a = Some(raw(r#"{"x":"\udc00","securityRequirements":[{}]}"#.to_owned()));
    card.skills[0].examples = vec![raw(r#""\ud800""#.to_owned()), raw(r#""plain\/""#.to_owned())];
    assert_same(&card);
    let text = String::from_utf8(payload_bytes(&card).unwrap()).unwrap();
    assert!(!text.contains("iconUrl") && text.contains(r#""\"\\ud800\"","plain/""#), "{text}");
}

#[test]
fn a_card_signed_from_its_bytes_verifies_over_its_view() {
    let key = libp2p::identity::Keypair::ed25519_from_bytes([5u8; 32]).unwrap();
    let mut rng = StdRng::seed_from_u64(7515);
    let card = std::iter::repeat_with(|| AgentCard::from_json(card_json(&mut rng).to_string().as_bytes()))
        .filter_map(Result::ok)
        .find(|c| c.has_a2a_view() && c.a2a.is_some())
        .unwrap()
        .signed(&key);
    let me = key.public().to_peer_id();
    let sig = card.a2a_signature.as_ref().unwrap();
    assert_eq!(crate::card::a2a::verify(&me, &view(&card).unwrap(), sig), Ok(()));
    assert_eq!(card.verify_a2a(&me), Ok(()));
    assert!(String::from_utf8(payload_bytes(&card).unwrap()).unwrap().contains(EXTENSION_URI));
}
