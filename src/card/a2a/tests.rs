use super::*;

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
