//! The HTTP/1.1 server under the router, with the limits that keep hostile clients from taking the
//! daemon down: a cap on open connections, a deadline for request headers (slow clients, idle
//! keep-alive), a cap on the header block (431) and on the request target (414). Bodies are capped
//! (413) and handlers timed out (408) by the router's layers.

use std::sync::Arc;
use std::time::Duration;

use axum::extract::ConnectInfo;
use axum::http::Request;
use axum::response::IntoResponse;
use axum::Router;
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tower::ServiceExt;

use crate::defaults::{HTTP_HEADER_TIMEOUT, MAX_HEADER_BYTES, MAX_HTTP_CONNECTIONS, MAX_URI_BYTES};

/// How long to wait before accepting again after an accept error (out of file descriptors, mostly).
const ACCEPT_BACKOFF: Duration = Duration::from_millis(50);

/// Serves `router` until `shutdown` fires, then lets open requests finish for up to `grace`.
pub async fn serve(
    listener: TcpListener,
    router: Router,
    shutdown: CancellationToken,
    grace: Duration,
) -> std::io::Result<()> {
    let permits = Arc::new(Semaphore::new(MAX_HTTP_CONNECTIONS));
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new()).header_read_timeout(HTTP_HEADER_TIMEOUT).max_buf_size(MAX_HEADER_BYTES);
    loop {
        let (stream, remote) = tokio::select! {
            _ = shutdown.cancelled() => break,
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(error) => {
                    tracing::warn!(%error, "accepting an HTTP connection failed");
                    tokio::time::sleep(ACCEPT_BACKOFF).await;
                    continue;
                }
            },
        };
        // At the cap the connection is closed at once: a fast refusal, and memory stays bounded.
        let Ok(permit) = permits.clone().try_acquire_owned() else {
            tracing::debug!(%remote, "HTTP connection refused: too many open");
            continue;
        };
        let _ = stream.set_nodelay(true);
        let router = router.clone();
        let service = hyper::service::service_fn(move |mut req: Request<Incoming>| {
            req.extensions_mut().insert(ConnectInfo(remote));
            let router = router.clone();
            async move {
                if req.uri().path_and_query().map_or(0, |p| p.as_str().len()) > MAX_URI_BYTES {
                    return Ok(uri_too_long());
                }
                router.oneshot(req.map(axum::body::Body::new)).await
            }
        });
        let connection = graceful.watch(http.serve_connection(TokioIo::new(stream), service));
        tokio::spawn(async move {
            if let Err(error) = connection.await {
                tracing::debug!(%remote, %error, "HTTP connection ended with an error");
            }
            drop(permit);
        });
    }
    drop(listener);
    if tokio::time::timeout(grace, graceful.shutdown()).await.is_err() {
        tracing::warn!("HTTP connections still open after the shutdown grace period");
    }
    Ok(())
}

fn uri_too_long() -> axum::response::Response {
    crate::api::error::ApiError::UriTooLong { limit: MAX_URI_BYTES }.into_response()
}

/// Raises this process's open-file limit to its hard limit, so that `MAX_HTTP_CONNECTIONS` fit.
pub fn raise_fd_limit() {
    // SAFETY: getrlimit/setrlimit with a valid pointer to a local struct.
    unsafe {
        let mut limit = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) == 0 && limit.rlim_cur < limit.rlim_max {
            let raised = libc::rlimit { rlim_cur: limit.rlim_max, rlim_max: limit.rlim_max };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &raised) == 0 {
                tracing::debug!(from = limit.rlim_cur, to = limit.rlim_max, "raised the open-file limit");
            }
        }
    }
}
