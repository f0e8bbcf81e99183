//! The watch stream over real HTTP: Server-Sent Events of registry changes, filtered like discovery,
//! resumable with Last-Event-ID.

mod common;

use std::time::Duration;

use common::{config, fixture_cards, mesh_config, sdk_registration, TestNode, DEADLINE};
use serde_json::Value;

#[derive(Debug)]
struct Frame {
    event: String,
    id: Option<String>,
    data: Value,
}

struct Stream {
    response: reqwest::Response,
    buf: String,
}

impl Stream {
    async fn open(node: &TestNode, query: &str, last_event_id: Option<&str>) -> Stream {
        let mut req = node.http.get(node.url(&format!("/api/v1/discovery/events?{query}")));
        if let Some(id) = last_event_id {
            req = req.header("last-event-id", id);
        }
        let response = req.send().await.unwrap();
        assert_eq!(response.status(), 200);
        assert_eq!(response.headers()["content-type"], "text/event-stream");
        Stream { response, buf: String::new() }
    }

    /// The next event, within the deadline (keep-alive comments skipped).
    async fn next(&mut self) -> Frame {
        loop {
            if let Some(end) = self.buf.find("\n\n") {
                let block: String = self.buf.drain(..end + 2).collect();
                let (mut event, mut id, mut data) = (String::from("message"), None, String::new());
                for line in block.lines() {
                    if let Some(v) = line.strip_prefix("event:") {
                        event = v.trim().to_owned();
                    } else if let Some(v) = line.strip_prefix("id:") {
                        id = Some(v.trim().to_owned());
                    } else if let Some(v) = line.strip_prefix("data:") {
                        data.push_str(v.trim());
                    }
                }
                if data.is_empty() && id.is_none() {
                    continue; // a comment
                }
                return Frame { event, id, data: serde_json::from_str(&data).unwrap() };
            }
            let chunk = tokio::time::timeout(DEADLINE, self.response.chunk())
                .await
                .expect("an event before the deadline")
                .unwrap()
                .expect("the stream stays open");
            self.buf.push_str(std::str::from_utf8(&chunk).unwrap());
        }
    }

    /// Asserts that nothing arrives for a while (used after a change the filters exclude).
    async fn quiet_for(&mut self, d: Duration) {
        if let Ok(Some(chunk)) = tokio::time::timeout(d, self.response.chunk()).await.map(|c| c.unwrap()) {
            let text = String::from_utf8_lossy(&chunk);
            assert!(text.trim_start().starts_with(':'), "unexpected event {text}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn filtered_changes_stream_live_and_resume_after_the_last_event() {
    let dir = tempfile::tempdir().unwrap();
    let node = TestNode::start(config(dir.path())).await;
    let cards = fixture_cards();
    node.register(&cards[0]).await; // alpha-research: tag research

    let mut watch = Stream::open(&node, "tags=research", None).await;
    let first = watch.next().await;
    assert_eq!((first.event.as_str(), first.data["agent_id"].as_str()), ("added", Some("alpha-research")));
    assert!(first.id.is_none(), "the initial view carries no id");
    assert!(first.data["card"]["reasoners"].is_array());
    let synced = watch.next().await;
    assert_eq!(synced.event, "synced");
    let synced_id = synced.id.expect("synced carries the id to resume from");

    node.register(&cards[2]).await; // gamma-i18n: no research tag, filtered out
    node.register(&cards[1]).await; // beta-analytics: quick_research is tagged research
    let added = watch.next().await;
    assert_eq!((added.event.as_str(), added.data["agent_id"].as_str()), ("added", Some("beta-analytics")));
    assert_eq!(added.data["health_status"], "active");
    let added_id = added.id.clone().unwrap();
    assert!(added_id.parse::<u64>().unwrap() > synced_id.parse::<u64>().unwrap());

    let mut changed = cards[1].clone();
    changed["version"] = "2.0.0".into();
    node.register(&changed).await;
    let updated = watch.next().await;
    assert_eq!(
        (updated.event.as_str(), updated.data["card"]["version"].as_str()),
        ("updated", Some("2.0.0"))
    );

    let (status, _) = node.send(reqwest::Method::DELETE, "/api/v1/agents/beta-analytics", None).await;
    assert_eq!(status, 200);
    let removed = watch.next().await;
    assert_eq!(
        (removed.event.as_str(), removed.data["agent_id"].as_str()),
        ("removed", Some("beta-analytics"))
    );
    drop(watch);

    // Resuming after the `added` event replays what followed it, in order, then goes live.
    let mut resumed = Stream::open(&node, "tags=research", Some(&added_id)).await;
    assert_eq!(resumed.next().await.event, "updated");
    let again = resumed.next().await;
    assert_eq!((again.event.as_str(), again.id), ("removed", removed.id));
    node.register(&cards[1]).await;
    assert_eq!(resumed.next().await.event, "added");

    // An id this node cannot resume from: a reset, then the view.
    let mut reset = Stream::open(&node, "tags=research", Some("17")).await;
    assert_eq!(reset.next().await.event, "reset");
    let mut ids = Vec::new();
    loop {
        let f = reset.next().await;
        if f.event == "synced" {
            break;
        }
        ids.push(f.data["agent_id"].as_str().unwrap().to_owned());
    }
    assert_eq!(ids, ["alpha-research", "beta-analytics"]);
    reset.quiet_for(Duration::from_millis(600)).await;

    let (status, body) = node.get("/api/v1/discovery/events?health_status=sleepy").await;
    assert_eq!(status, 400);
    assert_eq!(body["details"]["parameter"], "health_status");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_that_stops_heartbeating_is_seen_leaving_the_active_set() {
    let dir = tempfile::tempdir().unwrap();
    let node = TestNode::start(mesh_config(dir.path(), Vec::new())).await;
    let (status, _) = node.post("/api/v1/nodes/register", &sdk_registration("sdk-agent")).await;
    assert!(status == 200 || status == 201);
    let mut watch = Stream::open(&node, "health_status=active&agent=sdk-agent", None).await;
    // The agent is active at first (in the initial view, then `synced`): the change comes within a
    // few frames, each awaited with a deadline.
    let mut frame = watch.next().await;
    for _ in 0..4 {
        if frame.event == "health_changed" {
            break;
        }
        frame = watch.next().await;
    }
    assert_eq!(frame.event, "health_changed");
    assert_eq!(frame.data["previous_health_status"], "active");
    assert_eq!(frame.data["health_status"], "degraded");
}
