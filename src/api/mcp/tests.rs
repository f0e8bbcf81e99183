use std::sync::Arc;

use axum::body::Body;
use axum::http::Request as HttpRequest;
use serde_json::json;
use tower::ServiceExt;

use super::*;
use crate::card::AgentCard;
use crate::registry::health::Thresholds;
use crate::registry::{Liveness, Registry};

async fn app_with_weather() -> (tempfile::TempDir, AppState) {
    let dir = tempfile::tempdir().unwrap();
    let me = crate::identity::Identity::ephemeral().keypair().clone();
    let (registry, _) = Registry::open(dir.path(), me, Thresholds::default()).unwrap();
    let card = json!({"agent_id": "weather", "base_url": "http://weather:8001", "category": "weather",
    "skills": [
      {"id": "get_forecast", "description": "Daily weather forecast for a city: temperature, rain, wind.",
       "tags": ["weather", "forecast"],
       "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
       "required_secrets": ["OPENWEATHER_API_KEY"]},
      {"id": "send_alert", "description": "Sends a severe-weather alert by SMS.", "tags": ["alerts"],
       "has_side_effects": true}
    ]});
    let card = AgentCard::from_json(card.to_string().as_bytes()).unwrap();
    registry.register_local(card, Liveness::Node, now_millis()).await.unwrap();
    (dir, AppState::new(Arc::new(registry), None))
}

async fn ask(app: &AppState, method: &str, params: Value) -> Value {
    let message = json!({"jsonrpc": "2.0", "id": 7, "method": method, "params": params});
    handle(app, message).await.expect("a request is answered")
}

#[test]
fn malformed_messages_are_refused_with_the_right_code() {
    let code = |m: Value| classify(m).unwrap_err()["error"]["code"].as_i64().unwrap();
    assert_eq!(code(json!([{"jsonrpc": "2.0", "id": 1, "method": "ping"}])), INVALID_REQUEST);
    assert_eq!(code(json!("ping")), INVALID_REQUEST);
    assert_eq!(code(json!({"jsonrpc": "1.0", "id": 1, "method": "ping"})), INVALID_REQUEST);
    assert_eq!(code(json!({"jsonrpc": "2.0", "id": null, "method": "ping"})), INVALID_REQUEST);
    assert_eq!(code(json!({"jsonrpc": "2.0", "id": 1.5, "method": "ping"})), INVALID_REQUEST);
    assert_eq!(code(json!({"jsonrpc": "2.0", "id": 1, "method": 3})), INVALID_REQUEST);
    assert_eq!(code(json!({"jsonrpc": "2.0", "id": 1, "method": "ping", "params": [1]})), INVALID_PARAMS);
    // The id of a malformed request is echoed when it is a valid id.
    let e = classify(json!({"jsonrpc": "2.0", "id": "a", "method": 3})).unwrap_err();
    assert_eq!(e["id"], "a");
    assert_eq!(
        classify(json!({"jsonrpc": "2.0", "method": "notifications/initialized"})),
        Ok(Message::NoAnswer)
    );
    assert_eq!(classify(json!({"jsonrpc": "2.0", "id": 3, "result": {}})), Ok(Message::NoAnswer));
}

#[tokio::test]
async fn initialize_negotiates_the_revision() {
    let (_dir, app) = app_with_weather().await;
    let r = ask(
        &app,
        "initialize",
        json!({"protocolVersion": "2025-11-25", "capabilities": {},
        "clientInfo": {"name": "t", "version": "1"}}),
    )
    .await;
    assert_eq!(r["id"], 7);
    assert_eq!(r["result"]["protocolVersion"], "2025-11-25");
    assert_eq!(r["result"]["capabilities"]["tools"]["listChanged"], false);
    assert_eq!(r["result"]["serverInfo"]["name"], "agentmesh");
    let r = ask(&app, "initialize", json!({"protocolVersion": "2025-06-18"})).await;
    assert_eq!(r["result"]["protocolVersion"], "2025-06-18", "an older revision it speaks is kept");
    let r = ask(&app, "initialize", json!({"protocolVersion": "2099-01-01"})).await;
    assert_eq!(r["result"]["protocolVersion"], LATEST_VERSION, "an unknown one gets the latest");
    let r = ask(&app, "initialize", json!({})).await;
    assert_eq!(r["error"]["code"], INVALID_PARAMS);
    let r = ask(&app, "server/discover", json!({})).await;
    assert_eq!(r["error"]["code"], METHOD_NOT_FOUND);
    assert_eq!(ask(&app, "ping", Value::Null).await["result"], json!({}));
}

#[tokio::test]
async fn tools_list_describes_both_tools() {
    let (_dir, app) = app_with_weather().await;
    let r = ask(&app, "tools/list", json!({})).await;
    let names: Vec<&str> =
        r["result"]["tools"].as_array().unwrap().iter().map(|t| t["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["discover_capabilities", "get_capability"]);
    for tool in r["result"]["tools"].as_array().unwrap() {
        assert_eq!(tool["inputSchema"]["type"], "object");
        assert_eq!(tool["annotations"]["readOnlyHint"], true);
    }
}

#[tokio::test]
async fn discover_then_get_capability() {
    let (_dir, app) = app_with_weather().await;
    let r = ask(
        &app,
        "tools/call",
        json!({"name": "discover_capabilities",
        "arguments": {"query": "weather forecast for tomorrow in a city"}}),
    )
    .await;
    let result = &r["result"];
    assert_eq!(result["isError"], false, "{r}");
    let first = &result["structuredContent"]["results"][0];
    assert_eq!(first["target"], "weather:skill:get_forecast");
    assert_eq!(first["summary"], "Daily weather forecast for a city: temperature, rain, wind.");
    assert_eq!(first["category"], "weather");
    let text = result["content"][0]["text"].as_str().unwrap();
    assert!(text.contains("- weather:skill:get_forecast ("), "{text}");

    let r = ask(
        &app,
        "tools/call",
        json!({"name": "get_capability",
        "arguments": {"target": "weather:skill:get_forecast"}}),
    )
    .await;
    let s = &r["result"]["structuredContent"];
    assert_eq!(s["input_schema"]["required"], json!(["city"]), "the exact input schema");
    assert_eq!(s["required_secrets"], json!(["OPENWEATHER_API_KEY"]));
    assert_eq!(s["base_url"], "http://weather:8001");
    assert!(r["result"]["content"][0]["text"].as_str().unwrap().contains("- city (string, required)"));

    let r = ask(
        &app,
        "tools/call",
        json!({"name": "get_capability",
        "arguments": {"target": "weather:skill:send_alert"}}),
    )
    .await;
    assert_eq!(r["result"]["structuredContent"]["has_side_effects"], true);
}

#[tokio::test]
async fn bad_arguments_are_tool_errors_the_model_can_read() {
    let (_dir, app) = app_with_weather().await;
    let call = |name: &str, arguments: Value| {
        let app = app.clone();
        let params = json!({"name": name, "arguments": arguments});
        async move { ask(&app, "tools/call", params).await }
    };
    for (name, arguments, says) in [
        ("discover_capabilities", json!({}), "query is required"),
        ("discover_capabilities", json!({"query": " "}), "1 to 1024"),
        ("discover_capabilities", json!({"query": "x", "limit": 0}), "limit"),
        ("discover_capabilities", json!({"query": "x", "limit": 51}), "limit"),
        ("discover_capabilities", json!({"query": "x", "kind": "tool"}), "kind"),
        ("discover_capabilities", json!({"query": "x", "tags": "weather"}), "tags"),
        ("discover_capabilities", json!({"query": "x", "querry": "y"}), "unknown argument \"querry\""),
        ("get_capability", json!({"target": "weather:get_forecast"}), "not agent_id:kind:id"),
        ("get_capability", json!({"target": "weather:tool:get_forecast"}), "not agent_id:kind:id"),
        ("get_capability", json!({"target": "weather:skill:nope"}), "no capability weather:skill:nope"),
    ] {
        let r = call(name, arguments.clone()).await;
        assert_eq!(r["result"]["isError"], true, "{arguments}: {r}");
        let text = r["result"]["content"][0]["text"].as_str().unwrap();
        assert!(text.contains(says), "{arguments}: {text}");
    }
    let r = ask(&app, "tools/call", json!({"name": "launch_rockets", "arguments": {}})).await;
    assert_eq!(r["error"]["code"], INVALID_PARAMS, "an unknown tool is a protocol error");
    let r =
        call("discover_capabilities", json!({"query": "x", "tags": ["alerts"], "kind": "reasoner"})).await;
    assert_eq!(r["result"]["structuredContent"]["results"], json!([]), "filters apply");
}

#[test]
fn only_pages_from_loopback_may_call() {
    for ok in ["http://localhost:3000", "http://127.0.0.1", "https://[::1]:8443", "http://LOCALHOST"] {
        assert!(origin_allowed(ok), "{ok}");
    }
    for bad in ["http://evil.example", "http://127.0.0.1.evil.example", "null", "http://10.0.0.1:80", ""] {
        assert!(!origin_allowed(bad), "{bad}");
    }
}

async fn post_raw(app: &AppState, headers: &[(&str, &str)], body: &str) -> (StatusCode, Value) {
    let mut req = HttpRequest::post("/mcp");
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let response = super::super::router(app.clone())
        .oneshot(req.body(Body::from(body.to_owned())).unwrap())
        .await
        .unwrap();
    let status = response.status();
    let bytes = axum::body::to_bytes(response.into_body(), 1 << 20).await.unwrap();
    (status, serde_json::from_slice(&bytes).unwrap_or(Value::Null))
}

#[tokio::test]
async fn the_http_transport_checks_origin_media_type_and_revision() {
    let (_dir, app) = app_with_weather().await;
    let json = ("content-type", "application/json");
    let ping = r#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#;
    assert_eq!(post_raw(&app, &[json], ping).await.0, StatusCode::OK);
    assert_eq!(post_raw(&app, &[json, (VERSION_HEADER, "2025-11-25")], ping).await.0, StatusCode::OK);
    let (status, body) = post_raw(&app, &[json, (VERSION_HEADER, "1999-01-01")], ping).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(body["error"]["code"], INVALID_REQUEST);
    assert_eq!(
        post_raw(&app, &[json, ("origin", "http://evil.example")], ping).await.0,
        StatusCode::FORBIDDEN
    );
    assert_eq!(
        post_raw(&app, &[("content-type", "text/plain")], ping).await.0,
        StatusCode::UNSUPPORTED_MEDIA_TYPE
    );
    let (status, body) = post_raw(&app, &[json], "{not json").await;
    assert_eq!((status, body["error"]["code"].as_i64()), (StatusCode::BAD_REQUEST, Some(PARSE_ERROR)));
    let notification = r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#;
    assert_eq!(post_raw(&app, &[json], notification).await.0, StatusCode::ACCEPTED);
    let response = super::super::router(app.clone())
        .oneshot(HttpRequest::get("/mcp").body(Body::empty()).unwrap())
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::METHOD_NOT_ALLOWED, "no server-initiated stream");
}
