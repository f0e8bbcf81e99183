use super::*;
use crate::card::AgentCard;

fn key() -> Keypair {
    Keypair::ed25519_from_bytes([3u8; 32]).unwrap()
}

fn card() -> AgentCard {
    AgentCard::from_json(
        json!({
            "agent_id": "researcher", "name": "Research agent", "base_url": "http://127.0.0.1:9000",
            "version": "1.2.0", "tags": ["team-a"],
            "reasoners": [{"id": "summarize", "description": "Summarise a text", "tags": ["nlp"],
                "input_schema": {"type": "object", "properties": {"text": {"type": "string"}, "opts": {}},
                    "required": []},
                "output_schema": {"type": "object", "properties": {"summary": {"type": "string"}}}}],
            "skills": [{"id": "summarize"}, {"id": "fetch", "name": "Fetch a page", "examples": [{"url": "x"}, "plain"]}]
        })
        .to_string()
        .as_bytes(),
    )
    .unwrap()
}

#[test]
fn the_view_has_every_required_a2a_field_and_no_empty_value() {
    let view = view(&card()).unwrap();
    for field in [
        "name",
        "description",
        "version",
        "capabilities",
        "supportedInterfaces",
        "defaultInputModes",
        "defaultOutputModes",
        "skills",
    ] {
        assert!(view.get(field).is_some(), "{field} missing");
    }
    assert_eq!(view["supportedInterfaces"][0]["url"], "http://127.0.0.1:9000");
    assert_eq!(view["supportedInterfaces"][0]["protocolBinding"], DEFAULT_BINDING);
    let skills = view["skills"].as_array().unwrap();
    let ids: Vec<&str> = skills.iter().map(|s| s["id"].as_str().unwrap()).collect();
    assert_eq!(ids, ["summarize", "skill:summarize", "fetch"], "a skill sharing a reasoner's id is renamed");
    for s in skills {
        assert!(!s["name"].as_str().unwrap().is_empty());
        assert!(!s["description"].as_str().unwrap().is_empty());
        assert!(!s["tags"].as_array().unwrap().is_empty(), "A2A needs a tag on every skill");
    }
    assert_eq!(skills[1]["tags"], json!(["skill"]));
    assert_eq!(skills[2]["examples"], json!([r#"{"url":"x"}"#, "plain"]));
    let ext = &view["capabilities"]["extensions"][0];
    assert_eq!(ext["uri"], EXTENSION_URI);
    let schema = &ext["params"]["skills"]["summarize"]["input_schema"];
    assert_eq!(
        schema,
        &json!({"type": "object", "properties": {"text": {"type": "string"}}}),
        "empties cleaned"
    );
    assert_eq!(clean(view.clone()), Some(view), "the view is already clean");
}

#[test]
fn a_card_without_capabilities_has_no_view_and_no_signature() {
    let bare = AgentCard::from_json(br#"{"agent_id":"a","base_url":"http://x"}"#).unwrap();
    assert!(view(&bare).is_none());
    let signed = bare.signed(&key());
    assert!(signed.a2a_signature.is_none());
    let me = key().public().to_peer_id();
    assert_eq!(signed.verify_a2a(&me), Ok(()));
    let mut forged = signed;
    forged.a2a_signature = card().signed(&key()).a2a_signature;
    assert_eq!(forged.verify_a2a(&me), Err(SignatureError::Unexpected));
}

#[test]
fn signatures_verify_as_the_publisher_only_and_over_the_view_only() {
    let me = key().public().to_peer_id();
    let signed = card().signed(&key());
    assert_eq!(signed.verify_a2a(&me), Ok(()));
    assert_eq!(signed.clone().signed(&key()).to_json(), signed.to_json(), "signing is deterministic");

    let other = Keypair::ed25519_from_bytes([4u8; 32]).unwrap().public().to_peer_id();
    assert_eq!(signed.verify_a2a(&other), Err(SignatureError::KeyId));

    let mut tampered = signed.clone();
    tampered.reasoners[0].description = Some("Something else".into());
    assert_eq!(tampered.verify_a2a(&me), Err(SignatureError::Invalid));

    let mut unsigned = signed.clone();
    unsigned.a2a_signature = None;
    assert_eq!(unsigned.verify_a2a(&me), Err(SignatureError::Missing));

    // A header naming another algorithm is refused before any key is used.
    let mut none_alg = signed.clone();
    let header = json!({"alg": "none", "kid": me.to_base58()});
    none_alg.a2a_signature.as_mut().unwrap().protected = URL_SAFE_NO_PAD.encode(header.to_string());
    assert_eq!(none_alg.verify_a2a(&me), Err(SignatureError::Algorithm));

    // The protected header is the one A2A verifiers expect.
    let protected = &signed.a2a_signature.as_ref().unwrap().protected;
    let header: Value = serde_json::from_slice(&URL_SAFE_NO_PAD.decode(protected).unwrap()).unwrap();
    assert_eq!(header, json!({"alg": "EdDSA", "kid": me.to_base58(), "typ": "JOSE"}));
}

#[test]
fn a_header_accepted_once_is_accepted_for_its_publisher_only() {
    // The header check remembers the headers it accepted, per publisher: the answers must be the ones a
    // fresh check gives, whatever was checked before on this thread.
    let me = key().public().to_peer_id();
    let other = Keypair::ed25519_from_bytes([4u8; 32]).unwrap().public().to_peer_id();
    let signed = card().signed(&key());
    for _ in 0..2 {
        assert_eq!(signed.verify_a2a(&me), Ok(()));
        assert_eq!(signed.verify_a2a(&other), Err(SignatureError::KeyId));
        assert!(matches!(signed.a2a_claim(&other), Err(SignatureError::KeyId)));
        assert!(matches!(signed.a2a_claim(&me), Ok(Some(_))));
    }
    // Another header for a publisher whose header was accepted is checked again, not taken as known.
    for (header, error) in [
        (json!({"alg": "none", "kid": me.to_base58()}), SignatureError::Algorithm),
        (json!({"alg": "EdDSA", "kid": other.to_base58()}), SignatureError::KeyId),
    ] {
        let mut changed = signed.clone();
        changed.a2a_signature.as_mut().unwrap().protected = URL_SAFE_NO_PAD.encode(header.to_string());
        assert_eq!(changed.verify_a2a(&me), Err(error));
    }
    // A header that is not base64 is still an error after one was accepted, which still passes.
    let mut garbage = signed.clone();
    garbage.a2a_signature.as_mut().unwrap().protected = "!!".into();
    assert!(matches!(garbage.verify_a2a(&me), Err(SignatureError::Header(_))));
    assert_eq!(signed.verify_a2a(&me), Ok(()));
}

#[test]
fn canonical_form_follows_rfc_8785() {
    let value: Value =
        serde_json::from_str(r#"{"b":[1.0,1e21,0.000001,"é\u0001"],"a":{"z":null,"€":1,"a":true}}"#).unwrap();
    assert_eq!(
        String::from_utf8(canonical(&value)).unwrap(),
        r#"{"a":{"a":true,"z":null,"€":1},"b":[1,1e+21,0.000001,"é\u0001"]}"#
    );
}

#[test]
fn a_served_card_reads_back_as_the_same_card() {
    let original = card().signed(&key());
    let served = served(&original).unwrap();
    assert!(served["signatures"][0]["protected"].is_string());
    let back = from_a2a(served).unwrap().signed(&key());
    // Schemas lose their empty members in the A2A view; everything else comes back.
    let mut expected: Value = serde_json::from_slice(&original.to_json()).unwrap();
    expected["reasoners"][0]["input_schema"] =
        json!({"type": "object", "properties": {"text": {"type": "string"}}});
    let mut expected = AgentCard::from_json(expected.to_string().as_bytes()).unwrap().signed(&key());
    expected.a2a_signature = back.a2a_signature.clone();
    assert_eq!(String::from_utf8(back.to_json()).unwrap(), String::from_utf8(expected.to_json()).unwrap());
}

#[test]
fn metadata_group_and_confidence_travel_in_the_extension_and_read_back() {
    let mut value: Value = serde_json::from_slice(&card().to_json()).unwrap();
    value["group_id"] = json!("research");
    value["metadata"] = json!({"owner_team": "labs", "tier": "gold"});
    value["reasoners"][0]["confidence_hint"] = json!(0.75);
    value["reasoners"][0]["metadata"] = json!({"region": "eu"});
    let original = AgentCard::from_json(value.to_string().as_bytes()).unwrap().signed(&key());
    let served = served(&original).unwrap();
    assert!(verify(
        &key().public().to_peer_id(),
        &view(&original).unwrap(),
        original.a2a_signature.as_ref().unwrap()
    )
    .is_ok());
    let back = from_a2a(served).unwrap();
    assert_eq!(back.group_id.as_deref(), Some("research"));
    assert_eq!(back.metadata, original.metadata);
    assert_eq!(back.reasoners[0].confidence_hint, Some(0.75));
    assert_eq!(back.reasoners[0].metadata["region"], "eu");
    // A card without them has the same view as before they existed: its signature is unchanged.
    let plain = view(&card()).unwrap().to_string();
    assert!(!plain.contains("metadata") && !plain.contains("group_id") && !plain.contains("confidence_hint"));
}

#[test]
fn a_foreign_a2a_card_becomes_an_agentmesh_card() {
    let foreign = json!({
        "name": "Currency Agent!", "description": "Converts currencies", "version": "0.3.1",
        "supportedInterfaces": [{"url": "http://127.0.0.1:10000/a2a", "protocolBinding": "JSONRPC",
            "protocolVersion": "1.0"}],
        "capabilities": {"streaming": true},
        "defaultInputModes": ["text/plain"], "defaultOutputModes": ["text/plain"],
        "skills": [{"id": "convert", "name": "Convert", "description": "Convert an amount", "tags": ["fx"],
            "examples": ["100 USD to EUR"]}],
        "signatures": [{"protected": "e30", "signature": "AA"}]
    });
    let card = AgentCard::from_json_any(foreign.to_string().as_bytes()).unwrap();
    assert_eq!(card.agent_id, "currency-agent");
    assert_eq!(card.base_url, "http://127.0.0.1:10000/a2a");
    assert_eq!(card.interfaces[0].protocol_binding, "JSONRPC", "the agent's own binding is kept");
    assert_eq!(card.skills[0].tags, ["fx"]);
    assert!(card.reasoners.is_empty());
    assert!(card.a2a_signature.is_none(), "the input's signatures are not kept");
    assert_eq!(card.input_modes, ["text/plain"]);

    let legacy = json!({"name": "Old", "url": "http://127.0.0.1:1", "skills": [{"id": "s"}]});
    assert_eq!(
        AgentCard::from_json_any(legacy.to_string().as_bytes()).unwrap().base_url,
        "http://127.0.0.1:1"
    );

    let nowhere = json!({"name": "Lost", "skills": []});
    let err = AgentCard::from_json_any(nowhere.to_string().as_bytes()).unwrap_err();
    assert_eq!(err.field(), Some("supportedInterfaces"));
    let unnamed = json!({"name": "???", "url": "http://127.0.0.1:1"});
    assert_eq!(AgentCard::from_json_any(unnamed.to_string().as_bytes()).unwrap_err().field(), Some("name"));
    let typed = json!({"name": "x", "url": "http://127.0.0.1:1", "skills": [{"id": 5}]});
    assert_eq!(
        AgentCard::from_json_any(typed.to_string().as_bytes()).unwrap_err().field(),
        Some("skills[0].id")
    );
}

/// The card shapes of `tests/a2a-cards`: name, the card as registered, and the A2A fields it must be
/// served with (`NAME.expected.json`, else the card itself without `signatures`).
fn fixtures() -> Vec<(String, Value, Value)> {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/a2a-cards");
    let read = |path: &std::path::Path| -> Value {
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
    };
    let mut paths: Vec<_> = std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().path()).collect();
    paths.sort();
    let mut out = Vec::new();
    for path in paths {
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        let Some(stem) = name.strip_suffix(".json").filter(|s| !s.ends_with(".expected")) else { continue };
        let input = read(&path);
        let expected = dir.join(format!("{stem}.expected.json"));
        let mut expected = if expected.exists() { read(&expected) } else { input.clone() };
        expected.as_object_mut().unwrap().remove("signatures");
        out.push((stem.to_owned(), input, expected));
    }
    out
}

/// A served card's A2A fields: without `signatures` and without agentmesh's own extension.
fn a2a_fields(served: &Value) -> Value {
    let mut card = served.clone();
    let map = card.as_object_mut().unwrap();
    map.remove("signatures");
    let caps = map.get_mut("capabilities").unwrap().as_object_mut().unwrap();
    let list = caps.get_mut("extensions").unwrap().as_array_mut().unwrap();
    let before = list.len();
    list.retain(|e| e["uri"] != EXTENSION_URI);
    assert_eq!(list.len() + 1, before, "agentmesh's extension is there once");
    if list.is_empty() {
        caps.remove("extensions");
    }
    card
}

#[test]
fn every_fixture_card_is_served_back_with_every_a2a_field_and_verifies() {
    let fixtures = fixtures();
    assert!(fixtures.len() >= 12, "{} fixture cards", fixtures.len());
    let me = key().public().to_peer_id();
    for (name, input, expected) in fixtures {
        let card =
            AgentCard::from_json_any(input.to_string().as_bytes()).unwrap_or_else(|e| panic!("{name}: {e}"));
        let signed = card.signed(&key());
        let stored = signed.to_json();
        assert_eq!(
            AgentCard::from_json(&stored).unwrap().to_json(),
            stored,
            "{name}: the stored form is a fixed point"
        );
        let served = served(&signed).unwrap();
        assert_eq!(a2a_fields(&served), expected, "{name}: served {served:#}");
        assert_eq!(signed.verify_a2a(&me), Ok(()), "{name}");
        let sig: JwsSignature = serde_json::from_value(served["signatures"][0].clone()).unwrap();
        assert_eq!(
            verify(&me, &signed_payload(&served).unwrap(), &sig),
            Ok(()),
            "{name}: verifies as received"
        );
        let again = from_a2a(served.clone()).unwrap().signed(&key());
        assert_eq!(
            String::from_utf8(again.to_json()).unwrap(),
            String::from_utf8(stored).unwrap(),
            "{name}: the served card registers as the same card"
        );
    }
}

#[test]
fn empty_values_in_held_a2a_fields_are_served_but_not_signed() {
    let card = AgentCard::from_json_any(
        json!({"name": "Keyed", "url": "http://127.0.0.1:1", "skills": [{"id": "s", "tags": ["t"]}],
            "securitySchemes": {"k": {"type": "apiKey", "in": "header", "name": "K", "description": ""}},
            "security": [{"k": []}]})
        .to_string()
        .as_bytes(),
    )
    .unwrap()
    .signed(&key());
    let served = served(&card).unwrap();
    assert_eq!(served["securityRequirements"], json!([{"schemes": {"k": {"list": []}}}]), "a client sees it");
    let payload = signed_payload(&served).unwrap();
    assert!(payload.get("securityRequirements").is_none(), "A2A verifiers drop it before checking");
    assert_eq!(
        payload["securitySchemes"],
        json!({"k": {"apiKeySecurityScheme": {"location": "header", "name": "K"}}})
    );
    let sig: JwsSignature = serde_json::from_value(served["signatures"][0].clone()).unwrap();
    assert_eq!(verify(&key().public().to_peer_id(), &payload, &sig), Ok(()));
    let mut tampered = served.clone();
    tampered["securitySchemes"]["k"]["apiKeySecurityScheme"]["name"] = json!("Other");
    assert_eq!(
        verify(&key().public().to_peer_id(), &signed_payload(&tampered).unwrap(), &sig),
        Err(SignatureError::Invalid),
        "held fields are covered by the signature"
    );
}

#[test]
fn a_native_card_carries_a2a_fields_in_its_a2a_objects() {
    let card = AgentCard::from_json(
        json!({"agent_id": "a", "base_url": "http://h", "a2a": {"iconUrl": "http://h/i.png",
            "capabilities": {"streaming": true}},
            "interfaces": [{"url": "wss://h/ws", "protocol_binding": "https://example.com/b/ws", "protocol_version": "1.0",
                "tenant": "t1"}],
            "skills": [{"id": "s", "input_modes": ["audio/wav"],
                "a2a": {"securityRequirements": [{"schemes": {"k": {"list": ["x"]}}}]}}]})
        .to_string()
        .as_bytes(),
    )
    .unwrap();
    let view = view(&card).unwrap();
    assert_eq!(view["iconUrl"], "http://h/i.png");
    assert_eq!(view["capabilities"]["streaming"], true);
    assert_eq!(view["capabilities"]["extensions"][0]["uri"], EXTENSION_URI);
    assert_eq!(view["supportedInterfaces"][0]["tenant"], "t1");
    assert_eq!(view["skills"][0]["inputModes"], json!(["audio/wav"]));
    assert_eq!(view["skills"][0]["securityRequirements"][0]["schemes"]["k"]["list"], json!(["x"]));

    let bad = |a2a: Value| {
        AgentCard::from_json(
            json!({"agent_id": "a", "base_url": "http://h", "a2a": a2a}).to_string().as_bytes(),
        )
        .unwrap_err()
        .field()
        .map(str::to_owned)
    };
    assert_eq!(bad(json!({"iconURL": "x"})).as_deref(), Some("a2a.iconURL"), "a misspelt field is reported");
    assert_eq!(bad(json!({"provider": {"url": 1}})).as_deref(), Some("a2a.provider.url"));
    assert_eq!(bad(json!("text")).as_deref(), Some("a2a"));
}

/// What the fuzz target checks, over every fixture card with each field (at the top, and in the first
/// skill and the capabilities) removed or given another type: refused with a field path, or accepted
/// as a card whose stored form is a fixed point and whose signature verifies as served.
#[test]
fn fixture_cards_with_a_field_removed_or_retyped_are_refused_or_sound() {
    let me = key().public().to_peer_id();
    let mut variants = Vec::new();
    for (_, input, _) in fixtures() {
        for path in [&[][..], &["skills", "0"][..], &["capabilities"][..]] {
            let Some(Value::Object(at)) =
                path.iter().try_fold(&input, |v, k| v.get(k).or_else(|| v.get(k.parse::<usize>().ok()?)))
            else {
                continue;
            };
            for key in at.keys() {
                for replacement in [
                    None,
                    Some(json!(7)),
                    Some(json!("")),
                    Some(json!([])),
                    Some(json!({})),
                    Some(json!(null)),
                ] {
                    let mut variant = input.clone();
                    let mut target = &mut variant;
                    for k in path {
                        target = match k.parse::<usize>() {
                            Ok(i) => &mut target[i],
                            Err(_) => &mut target[*k],
                        };
                    }
                    let map = target.as_object_mut().unwrap();
                    match &replacement {
                        None => drop(map.remove(key)),
                        Some(v) => drop(map.insert(key.clone(), v.clone())),
                    }
                    variants.push(variant);
                }
            }
        }
    }
    assert!(variants.len() > 500, "{} variants", variants.len());
    let (mut accepted, mut refused) = (0, 0);
    for variant in variants {
        match AgentCard::from_json_any(variant.to_string().as_bytes()) {
            Err(e) => {
                refused += 1;
                assert!(e.field().is_some_and(|f| !f.is_empty()), "{e} names no field: {variant}");
            }
            Ok(card) => {
                accepted += 1;
                let stored = card.to_json();
                let again = AgentCard::from_json(&stored).unwrap_or_else(|e| panic!("{e}: {variant}"));
                assert_eq!(again.to_json(), stored, "{variant}");
                let signed = again.signed(&key());
                assert_eq!(signed.verify_a2a(&me), Ok(()), "{variant}");
                // Without skills there is no A2A card to serve.
                let Some(served) = served(&signed) else { continue };
                let sig: JwsSignature = serde_json::from_value(served["signatures"][0].clone()).unwrap();
                assert_eq!(verify(&me, &signed_payload(&served).unwrap(), &sig), Ok(()), "{variant}");
            }
        }
    }
    assert!(accepted > 0 && refused > 0, "{accepted} accepted, {refused} refused");
}

/// The JWS signing input is `protected.payload`, the payload in unpadded base64url, at every length
/// the encoding pads differently.
#[test]
fn the_signing_input_is_the_header_a_dot_and_the_payload_in_base64url() {
    for n in [0usize, 1, 2, 3, 4, 5, 1000, 3001] {
        let payload: Vec<u8> = (0..n).map(|i| (i * 37 % 256) as u8).collect();
        let expected = format!("eyJhbGciOiJFZERTQSJ9.{}", URL_SAFE_NO_PAD.encode(&payload));
        assert_eq!(signing_input("eyJhbGciOiJFZERTQSJ9", &payload), expected, "{n} bytes");
    }
}
