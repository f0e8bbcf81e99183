//! `agentmesh mcp`, the stdio transport, as a client starts it: the real binary, one JSON-RPC message
//! per line on stdin, one answer per line on stdout, carried to a real node's `POST /mcp`. (The
//! published MCP SDK drives it end to end in `tests/sdk/mcp_client.py`.)

mod common;

use std::process::Stdio;

use common::{TestNode, DEADLINE};
use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::Command;

/// Writes `lines` to `agentmesh mcp --api API`, closes stdin, and returns what it printed, line by line.
async fn converse(api: &str, lines: &[&str]) -> Vec<Value> {
    let mut child = Command::new(env!("CARGO_BIN_EXE_agentmesh"))
        .args(["mcp", "--api", api])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("agentmesh mcp starts");
    let mut stdin = child.stdin.take().unwrap();
    for line in lines {
        stdin.write_all(line.as_bytes()).await.unwrap();
        stdin.write_all(b"\n").await.unwrap();
    }
    drop(stdin);
    let mut out = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut answers = Vec::new();
    tokio::time::timeout(DEADLINE, async {
        while let Some(line) = out.next_line().await.unwrap() {
            answers.push(serde_json::from_str(&line).expect("every stdout line is one JSON message"));
        }
    })
    .await
    .expect("agentmesh mcp answers and ends at the end of stdin");
    let status = tokio::time::timeout(DEADLINE, child.wait()).await.expect("exits").unwrap();
    assert!(status.success(), "{status}");
    answers
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stdio_carries_each_message_to_the_daemon_and_answers_on_one_line() {
    let dir = tempfile::tempdir().unwrap();
    let n = TestNode::start(common::config(dir.path())).await;
    n.register(&json!({"agent_id": "fx", "base_url": "http://127.0.0.1:9300",
        "skills": [{"id": "convert_currency", "description": "Converts an amount between two currencies."}]}))
        .await;
    let answers = converse(
        &n.base,
        &[
            r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}"#,
            r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#,
            "",
            r#"{"jsonrpc":"2.0","id":"two","method":"tools/call","params":{"name":"discover_capabilities","arguments":{"query":"convert currency"}}}"#,
            "{not json",
        ],
    )
    .await;
    assert_eq!(answers.len(), 3, "no answer to a notification or a blank line: {answers:?}");
    assert_eq!(answers[0]["id"], 1);
    assert_eq!(answers[0]["result"]["protocolVersion"], "2025-11-25");
    assert_eq!(answers[1]["id"], "two");
    assert_eq!(
        answers[1]["result"]["structuredContent"]["results"][0]["target"],
        "fx:skill:convert_currency"
    );
    assert_eq!(answers[2]["error"]["code"], -32700, "a line that is not JSON: {answers:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_daemon_is_an_error_answer_not_a_hang() {
    // A port nothing listens on.
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let api = format!("http://127.0.0.1:{port}");
    let answers = converse(
        &api,
        &[
            r#"{"jsonrpc":"2.0","id":5,"method":"tools/list"}"#,
            r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#,
        ],
    )
    .await;
    assert_eq!(answers.len(), 1, "{answers:?}");
    assert_eq!(answers[0]["id"], 5);
    assert_eq!(answers[0]["error"]["code"], -32603);
    let message = answers[0]["error"]["message"].as_str().unwrap();
    assert!(message.contains("cannot reach the agentmesh daemon") && message.contains(&api), "{message}");
}
