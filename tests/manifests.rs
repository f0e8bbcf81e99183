//! Capability manifests on a real node: directories of CAPABILITY.yaml files served as agents, reloaded
//! when the files change, and broken files reported by path and field while the rest keeps serving.

mod common;

use std::path::Path;

use agentmesh::config::Config;
use common::{config, TestNode};
use serde_json::Value;

fn write(path: &Path, text: &str) {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, text).unwrap();
}

/// The capability ids of `agent` by kind (`reasoners` or `skills`) with their descriptions, as
/// discovery serves them; `None` while the agent is not there.
async fn served(n: &TestNode, agent: &str, kind: &str) -> Option<Vec<(String, String)>> {
    let (status, body) = n.get(&format!("/api/v1/discovery/capabilities?agent={agent}")).await;
    assert_eq!(status, 200, "{body}");
    let card = body["capabilities"].as_array()?.first()?.clone();
    let caps = card[kind].as_array()?;
    Some(
        caps.iter()
            .map(|c| {
                let id = c["id"].as_str().unwrap_or_default().to_owned();
                (id, c["description"].as_str().unwrap_or_default().to_owned())
            })
            .collect(),
    )
}

fn ids(caps: &[(String, String)]) -> Vec<&str> {
    caps.iter().map(|(id, _)| id.as_str()).collect()
}

/// The report of the directory `dir` from `GET /api/v1/manifests`.
async fn report(n: &TestNode, dir: &Path) -> Value {
    let (status, body) = n.get("/api/v1/manifests").await;
    assert_eq!(status, 200, "{body}");
    let shown = dir.display().to_string();
    body["dirs"]
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d["dir"] == shown.as_str())
        .unwrap_or_else(|| panic!("{shown} not reported: {body}"))
        .clone()
}

const FORECAST: &str = "name: get_forecast\nkind: skill\ndescription: Daily weather forecast for a city.\n";

#[tokio::test]
async fn manifests_are_served_reloaded_and_reported() {
    let tmp = tempfile::tempdir().unwrap();
    let caps = tmp.path().join("caps");
    let tools = tmp.path().join("more tools");
    write(&caps.join("AGENT.yaml"), "agent_id: weather-agent\ndescription: Weather for anywhere\n");
    write(&caps.join("weather/CAPABILITY.yaml"), FORECAST);
    write(&caps.join("weather/SKILL.md"), "# How\n\nAsk with a city name.\n");
    write(&tools.join("CAPABILITY.yaml"), "name: convert\nkind: skill\ndescription: Converts units.\n");
    let n = TestNode::start(Config {
        capabilities_dirs: vec![caps.clone(), tools.clone()],
        ..config(&tmp.path().join("data"))
    })
    .await;

    // Both directories are agents; the second one's id comes from its name.
    let skills = n.wait_for("the forecast skill", || served(&n, "weather-agent", "skills")).await;
    assert_eq!(
        skills,
        [(
            "get_forecast".to_owned(),
            "Daily weather forecast for a city.\n\n# How\n\nAsk with a city name.".to_owned()
        )]
    );
    let skills = n.wait_for("the second directory's agent", || served(&n, "more-tools", "skills")).await;
    assert_eq!(ids(&skills), ["convert"]);
    let r = report(&n, &caps).await;
    assert_eq!(r["agent_id"], "weather-agent");
    assert_eq!(r["capabilities"], serde_json::json!(["get_forecast"]));
    assert_eq!(r["errors"], serde_json::json!([]));

    // An edit is served after the reload.
    write(&caps.join("weather/CAPABILITY.yaml"), &FORECAST.replace("Daily", "Hourly and daily"));
    n.wait_for("the edited description", || async {
        let skills = served(&n, "weather-agent", "skills").await?;
        skills[0].1.starts_with("Hourly and daily").then_some(())
    })
    .await;

    // A new capability directory shows up.
    write(
        &caps.join("alerts/CAPABILITY.yaml"),
        "name: storm_alerts\nkind: reasoner\ndescription: Warns of storms.\n",
    );
    n.wait_for("the new reasoner", || async {
        let reasoners = served(&n, "weather-agent", "reasoners").await?;
        (ids(&reasoners) == ["storm_alerts"]).then_some(())
    })
    .await;

    // Broken manifests are reported by path and field; the others keep serving, and the broken one
    // that was good keeps its last good version.
    write(
        &caps.join("alerts/CAPABILITY.yaml"),
        "name: storm_alerts\nkind: tool\ndescription: Warns of storms.\n",
    );
    write(&caps.join("broken/CAPABILITY.yaml"), "name: x\nkind: skill\ndescription: [unclosed\n");
    let errors = n
        .wait_for("both errors reported", || async {
            let errors = report(&n, &caps).await["errors"].as_array().cloned().unwrap_or_default();
            (errors.len() == 2).then_some(errors)
        })
        .await;
    let alerts = caps.join("alerts/CAPABILITY.yaml").display().to_string();
    let kind_error = errors.iter().find(|e| e["path"] == alerts.as_str()).expect("the alerts error");
    assert_eq!(kind_error["field"], "kind");
    assert_eq!(kind_error["message"], r#"expected skill or reasoner, got "tool""#);
    let broken = caps.join("broken/CAPABILITY.yaml").display().to_string();
    let syntax = errors.iter().find(|e| e["path"] == broken.as_str()).expect("the syntax error");
    assert!(syntax["message"].as_str().unwrap().contains("line 3"), "{syntax}");
    assert_eq!(ids(&served(&n, "weather-agent", "skills").await.unwrap()), ["get_forecast"]);
    assert_eq!(ids(&served(&n, "weather-agent", "reasoners").await.unwrap()), ["storm_alerts"]);
    assert_eq!(ids(&served(&n, "more-tools", "skills").await.unwrap()), ["convert"]);

    // Fixed, the errors go; a deleted capability directory is dropped.
    std::fs::remove_dir_all(caps.join("broken")).unwrap();
    std::fs::remove_dir_all(caps.join("alerts")).unwrap();
    n.wait_for("errors cleared and alerts dropped", || async {
        let r = report(&n, &caps).await;
        (r["errors"] == serde_json::json!([]) && r["capabilities"] == serde_json::json!(["get_forecast"]))
            .then_some(())
    })
    .await;
    assert_eq!(served(&n, "weather-agent", "reasoners").await, Some(Vec::new()));
    n.node.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_missing_capabilities_dir_stops_the_start() {
    let tmp = tempfile::tempdir().unwrap();
    let missing = tmp.path().join("capabilites");
    let result = agentmesh::node::Node::start(Config {
        capabilities_dirs: vec![missing.clone()],
        ..config(&tmp.path().join("data"))
    })
    .await;
    let error = result.err().expect("the start fails").to_string();
    assert!(error.contains(&missing.display().to_string()), "{error}");

    // Without manifests the route answers an empty list.
    let n = TestNode::start(config(&tmp.path().join("data2"))).await;
    let (status, body) = n.get("/api/v1/manifests").await;
    assert_eq!((status, body), (200, serde_json::json!({"dirs": []})));
    n.node.shutdown().await.unwrap();
}
