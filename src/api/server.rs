//! The HTTP/1.1 server under the router, with the limits that keep hostile clients from taking the
//! daemon down: a cap on open connections, a deadline for request headers (slow clients, idle
//! keep-alive), a cap on the header block (431) and on the request target (414). Bodies are capped
//! (413) and handlers timed out (408) by the router's layers; a connection closes with a bounded
//! lingering read (`linger`), so a client still sending a refused body reads its 413.

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

use crate::defaults::{
    HTTP_HEADER_TIMEOUT, LINGER_BYTES, LINGER_TIME, MAX_HEADER_BYTES, MAX_HTTP_CONNECTIONS, MAX_URI_BYTES,
};

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
            // Boxed, so the connection is `Unpin` and can hand its socket back when done.
            Box::pin(async move {
                if req.uri().path_and_query().map_or(0, |p| p.as_str().len()) > MAX_URI_BYTES {
                    return Ok(uri_too_long());
                }
                router.oneshot(req.map(axum::body::Body::new)).await
            })
        });
        let mut connection = http.serve_connection(TokioIo::new(stream), service);
        let stopping = shutdown.clone();
        tokio::spawn(async move {
            let mut asked_to_stop = false;
            let done = loop {
                tokio::select! {
                    done = std::future::poll_fn(|cx| connection.poll_without_shutdown(cx)) => break done,
                    // Stopping: finish the request in flight, keep no connection alive after it.
                    _ = stopping.cancelled(), if !asked_to_stop => {
                        std::pin::Pin::new(&mut connection).graceful_shutdown();
                        asked_to_stop = true;
                    }
                }
            };
            match done {
                Ok(()) => linger(connection.into_parts().io.into_inner()).await,
                Err(error) => tracing::debug!(%remote, %error, "HTTP connection ended with an error"),
            }
            drop(permit);
        });
    }
    drop(listener);
    // Every connection holds a permit until it is done: all of them back means all done.
    let all = u32::try_from(MAX_HTTP_CONNECTIONS).unwrap_or(u32::MAX);
    if tokio::time::timeout(grace, permits.acquire_many(all)).await.is_err() {
        tracing::warn!("HTTP connections still open after the shutdown grace period");
    }
    Ok(())
}

/// Closes a finished connection the way a client that is still sending can read: the answer is out
/// and the write side shut (FIN), then what the client still sends is read and dropped until it
/// closes, for at most `LINGER_TIME` and `LINGER_BYTES`. Closing at once with unread bytes would make
/// the kernel reset the connection, and a client still writing a refused body (413) would get a broken
/// pipe instead of the answer.
async fn linger(mut stream: tokio::net::TcpStream) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    if stream.shutdown().await.is_err() {
        return;
    }
    let drain = async {
        let mut buf = vec![0u8; 64 * 1024];
        let mut left = LINGER_BYTES;
        while left > 0 {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => left = left.saturating_sub(n),
            }
        }
    };
    let _ = tokio::time::timeout(LINGER_TIME, drain).await;
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
