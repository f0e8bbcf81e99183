//! Webhooks on a real node: signed POSTs of the watch stream's events to a real receiver on loopback,
//! filtered, retried until the receiver takes them, in order.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use common::{config, TestNode};
use serde_json::{json, Value};
use tokio::sync::mpsc;

/// One POST as the receiver saw it.
struct Delivery {
    event: String,
    id: String,
    signature: String,
    body: Bytes,
    answered: StatusCode,
}

/// A receiver that refuses the first `fail_first` POSTs with 503, then takes every one.
async fn receiver(fail_first: usize) -> (String, mpsc::Receiver<Delivery>) {
    let (tx, rx) = mpsc::channel(64);
    let seen = Arc::new(AtomicUsize::new(0));
    let app = axum::Router::new()
        .route(
            "/hook",
            axum::routing::post(
                move |State((tx, seen)): State<(mpsc::Sender<Delivery>, Arc<AtomicUsize>)>,
                      headers: HeaderMap,
                      body: Bytes| async move {
                    let answered = if seen.fetch_add(1, Ordering::SeqCst) < fail_first {
                        StatusCode::SERVICE_UNAVAILABLE
                    } else {
                        StatusCode::OK
                    };
                    let header = |name: &str| headers[name].to_str().unwrap().to_owned();
                    let delivery = Delivery {
                        event: header("x-agentmesh-event"),
                        id: header("x-agentmesh-delivery"),
                        signature: header("x-agentmesh-signature"),
                        body,
                        answered,
                    };
                    let _ = tx.send(delivery).await;
                    answered
                },
            ),
        )
        .with_state((tx, seen));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (format!("http://{addr}/hook"), rx)
}

async fn next(rx: &mut mpsc::Receiver<Delivery>) -> Delivery {
    tokio::time::timeout(Duration::from_secs(10), rx.recv()).await.expect("a delivery in time").unwrap()
}

fn verifies(d: &Delivery, signer: &libp2p::PeerId) -> bool {
    let (protected, signature) = d.signature.split_once("..").unwrap();
    let header: Value = serde_json::from_slice(&URL_SAFE_NO_PAD.decode(protected).unwrap()).unwrap();
    assert_eq!(header["kid"], signer.to_base58());
    let input = format!("{protected}.{}", URL_SAFE_NO_PAD.encode(&d.body));
    let key = libp2p::identity::PublicKey::try_decode_protobuf(&signer.to_bytes()[2..]).unwrap();
    key.verify(input.as_bytes(), &URL_SAFE_NO_PAD.decode(signature).unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn matching_events_arrive_signed_retried_and_in_order() {
    let (url, mut rx) = receiver(2).await;
    let dir = tempfile::tempdir().unwrap();
    let node = TestNode::start(agentmesh::config::Config {
        webhooks: vec![format!("{url}?token=s3cret#tags=payments")],
        ..config(dir.path())
    })
    .await;
    let card = |id: &str, tag: &str| json!({"agent_id": id, "base_url": "http://127.0.0.1:9", "skills": [{"id": "s", "tags": [tag]}]});
    node.register(&card("billing", "search")).await;
    node.register(&card("refunds", "payments")).await;

    // The receiver refuses twice: the same delivery comes back until it is taken.
    let tries = [next(&mut rx).await, next(&mut rx).await, next(&mut rx).await];
    let answered: Vec<u16> = tries.iter().map(|d| d.answered.as_u16()).collect();
    assert_eq!(answered, [503, 503, 200]);
    for d in &tries {
        assert_eq!(
            (d.event.as_str(), d.id.as_str()),
            ("added", tries[0].id.as_str()),
            "the same event each time"
        );
        assert!(verifies(d, &node.node.peer_id()), "signed by the node");
    }
    let added: Value = serde_json::from_slice(&tries[2].body).unwrap();
    assert_eq!(added["agent_id"], "refunds", "only the matching agent: {added}");
    assert_eq!(added["card"]["agent_id"], "refunds");

    // Then the next change, after it.
    let (status, _) = node.send(reqwest::Method::DELETE, "/api/v1/agents/refunds", None).await;
    assert_eq!(status, 200);
    let removed = next(&mut rx).await;
    assert_eq!(removed.event, "removed");
    assert!(removed.id.parse::<u64>().unwrap() > tries[0].id.parse::<u64>().unwrap());
    let body: Value = serde_json::from_slice(&removed.body).unwrap();
    assert_eq!(body["agent_id"], "refunds");
    // Nothing about the agent the filter leaves out.
    assert!(
        tokio::time::timeout(Duration::from_millis(600), rx.recv()).await.is_err(),
        "no event for an agent that does not match"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_webhook_stops_the_node_at_start_naming_it_without_its_token() {
    let dir = tempfile::tempdir().unwrap();
    for (spec, says) in [
        ("ftp://x/hook?token=s3cret", "http"),
        ("http://x/hook?token=s3cret#health_status=sick", "health_status"),
    ] {
        let config = agentmesh::config::Config { webhooks: vec![spec.to_owned()], ..config(dir.path()) };
        let error = match agentmesh::node::Node::start(config).await {
            Ok(_) => panic!("{spec}: started"),
            Err(e) => e.to_string(),
        };
        assert!(error.contains(says), "{error}");
        assert!(!error.contains("s3cret"), "{error}");
    }
}
