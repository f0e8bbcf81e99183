//! The command-line client, the real binary, against a real node; and the offline card tools.

mod common;

use std::process::{Command, Output};

use agentmesh::card::{a2a, JwsSignature};
use common::fixture_node;
use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_agentmesh");

/// Runs the CLI off the async runtime's workers (the node under test keeps serving meanwhile).
async fn agentmesh(args: &[&str]) -> Output {
    let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
    tokio::task::spawn_blocking(move || {
        Command::new(BIN).args(&args).env_remove("AGENTMESH_API").output().unwrap()
    })
    .await
    .unwrap()
}

fn stdout(o: &Output) -> String {
    assert!(o.status.success(), "failed: {}", String::from_utf8_lossy(&o.stderr));
    String::from_utf8(o.stdout.clone()).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn discover_and_agents_show_the_view_in_every_format() {
    let dir = tempfile::tempdir().unwrap();
    let node = fixture_node(dir.path()).await;
    let api = node.base.as_str();

    let table = stdout(
        &agentmesh(&["discover", "--api", api, "--tag", "research", "--reasoner", "*research*"]).await,
    );
    let lines: Vec<&str> = table.lines().collect();
    assert!(lines[0].starts_with("AGENT"), "{table}");
    assert!(lines.iter().any(|l| l.split_whitespace().collect::<Vec<_>>()
        == [
            "alpha-research",
            "active",
            "reasoner",
            "deep_research",
            "research,ml",
            "alpha-research:deep_research"
        ]));
    assert!(lines.iter().any(|l| l.starts_with("beta-analytics") && l.contains("quick_research")));
    assert!(!table.contains("summarize"), "the reasoner filter applies: {table}");
    assert!(table.contains("2 agents"), "{table}");

    let json: Value = serde_json::from_str(&stdout(
        &agentmesh(&["discover", "--api", api, "--agent", "gamma-i18n", "--format", "json"]).await,
    ))
    .unwrap();
    assert_eq!(json["total_agents"], 1);
    assert_eq!(json["capabilities"][0]["skills"][0]["id"], "translate");

    let compact: Value =
        serde_json::from_str(&stdout(&agentmesh(&["discover", "--api", api, "--format", "compact"]).await))
            .unwrap();
    assert!(compact["reasoners"].as_array().unwrap().len() >= 4);

    let xml = stdout(
        &agentmesh(&[
            "discover",
            "--api",
            api,
            "--format",
            "xml",
            "--input-schema",
            "--agent",
            "alpha-research",
        ])
        .await,
    );
    let doc = roxmltree::Document::parse(&xml).unwrap();
    assert!(doc.descendants().any(|n| n.has_tag_name("field") && n.attribute("name") == Some("query")));

    // The daemon's 400 becomes a readable error and a failing exit.
    let bad = agentmesh(&["discover", "--api", api, "--limit", "501"]).await;
    assert!(!bad.status.success());
    assert!(String::from_utf8_lossy(&bad.stderr).contains("invalid limit parameter"));

    let agents = stdout(&agentmesh(&["agents", "--api", api]).await);
    assert!(agents.lines().next().unwrap().starts_with("AGENT"));
    assert!(agents.contains("delta-empty") && agents.contains("local"), "{agents}");
    assert!(agents.contains("4 agents in the view"), "{agents}");

    let down = agentmesh(&["agents", "--api", "http://127.0.0.1:9"]).await;
    assert!(String::from_utf8_lossy(&down.stderr).contains("cannot reach the daemon"));
}

#[tokio::test]
async fn cards_are_validated_and_signed_offline() {
    let dir = tempfile::tempdir().unwrap();
    let path = |name: &str| dir.path().join(name).to_str().unwrap().to_owned();
    let card = serde_json::to_string(&common::fixture_cards()[0]).unwrap();
    std::fs::write(path("card.json"), &card).unwrap();
    std::fs::write(path("bad.json"), r#"{"agent_id":"a b","base_url":"http://x"}"#).unwrap();

    let valid = stdout(&agentmesh(&["card", "validate", &path("card.json")]).await);
    assert!(valid.contains("valid agentmesh card: agent `alpha-research`, 2 reasoners, 1 skills"), "{valid}");
    assert!(valid.contains("not signed"));
    let invalid = agentmesh(&["card", "validate", &path("bad.json")]).await;
    assert!(!invalid.status.success());
    assert!(String::from_utf8_lossy(&invalid.stderr).contains("agent_id"), "the error names the field");

    // Signed with the node's key: an A2A card that verifies with the node's PeerId, and validates.
    let data = path("data");
    let signed = stdout(&agentmesh(&["card", "sign", &path("card.json"), "--data-dir", &data]).await);
    let peer: libp2p::PeerId = stdout(&agentmesh(&["id", "--data-dir", &data]).await).trim().parse().unwrap();
    let a2a_card: Value = serde_json::from_str(&signed).unwrap();
    let sig: JwsSignature = serde_json::from_value(a2a_card["signatures"][0].clone()).unwrap();
    a2a::verify(&peer, &a2a::signed_payload(&a2a_card).unwrap(), &sig).unwrap();
    std::fs::write(path("signed.json"), &signed).unwrap();
    let checked = stdout(&agentmesh(&["card", "validate", &path("signed.json")]).await);
    assert!(
        checked.contains("valid A2A card") && checked.contains(&format!("signature of {peer}: verifies")),
        "{checked}"
    );

    // A signed card changed afterwards fails validation.
    std::fs::write(path("tampered.json"), signed.replace("Researches a topic in depth", "Something else"))
        .unwrap();
    let tampered = agentmesh(&["card", "validate", &path("tampered.json")]).await;
    assert!(!tampered.status.success());
    assert!(String::from_utf8_lossy(&tampered.stderr).contains("does not verify"));

    let native = stdout(
        &agentmesh(&["card", "sign", &path("card.json"), "--data-dir", &data, "--format", "agentmesh"]).await,
    );
    let native: Value = serde_json::from_str(&native).unwrap();
    assert!(native["a2a_signature"]["signature"].is_string());
}
