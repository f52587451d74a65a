//! The one small read-only HTTP/1.1 server meshd's status page and `/metrics` and mesh-host's
//! `/metrics` both run on (hyper): one request per connection, GET and HEAD only, every wait
//! bounded — headers within `header_read_ms`, a whole connection within `connection_ms_max`, at
//! most `connections_max` open at once (more are closed at accept). What a path answers is the
//! caller's `respond`; it must change nothing.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::header::{CONTENT_TYPE, HeaderValue};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::task::{JoinHandle, JoinSet};

/// How long a client gets to send its request headers.
pub const header_read_ms: u64 = 5_000;
/// Pause after a failed accept (out of file descriptors, say) before the next.
pub const accept_retry_ms: u64 = 100;
/// The content type of `/metrics` in OpenMetrics, served to a scraper whose `Accept` prefers it.
pub const openmetrics_content_type: &str =
    "application/openmetrics-text; version=1.0.0; charset=utf-8";
/// The content type of `/metrics` in the classic Prometheus text format (0.0.4), served unless
/// the scraper's `Accept` prefers OpenMetrics (decision 0311).
pub const classic_content_type: &str = "text/plain; version=0.0.4; charset=utf-8";

/// An answer of the server.
pub type Answer = Response<Full<Bytes>>;

/// The bounds of one server.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// Most connections served at once.
    pub connections_max: usize,
    /// How long one connection may last, request and answer together.
    pub connection_ms_max: u64,
}

/// The running server. [`Server::stop`] ends it and every connection it has open.
pub struct Server {
    addr: SocketAddr,
    task: JoinHandle<()>,
}

impl Server {
    /// Serves `respond` on `listener` (already bound, so the caller names its own bind error)
    /// until [`Server::stop`]. Anything but GET or HEAD is answered 405 before `respond` runs.
    pub fn start<F, Fut>(
        listener: TcpListener,
        limits: Limits,
        respond: F,
    ) -> std::io::Result<Server>
    where
        F: Fn(Request<Incoming>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Answer> + Send + 'static,
    {
        let addr = listener.local_addr()?;
        let task = tokio::spawn(accept(listener, limits, Arc::new(respond)));
        Ok(Server { addr, task })
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Stops accepting and drops every open connection.
    pub async fn stop(self) {
        self.task.abort();
        let _ = self.task.await;
    }
}

async fn accept<F, Fut>(listener: TcpListener, limits: Limits, respond: Arc<F>)
where
    F: Fn(Request<Incoming>) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Answer> + Send + 'static,
{
    let limit = Arc::new(Semaphore::new(limits.connections_max));
    // Owned here, so aborting this task ends every connection too.
    let mut connections = JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => match Arc::clone(&limit).try_acquire_owned() {
                    Ok(permit) => {
                        let respond = Arc::clone(&respond);
                        connections.spawn(connection(stream, limits, respond, permit));
                    }
                    Err(_) => tracing::warn!(
                        limit = limits.connections_max,
                        "HTTP connection refused: too many open"
                    ),
                },
                Err(e) => {
                    tracing::warn!(error = %e, "HTTP accept failed");
                    tokio::time::sleep(Duration::from_millis(accept_retry_ms)).await;
                }
            },
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
        }
    }
}

async fn connection<F, Fut>(
    stream: TcpStream,
    limits: Limits,
    respond: Arc<F>,
    _permit: OwnedSemaphorePermit,
) where
    F: Fn(Request<Incoming>) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Answer> + Send + 'static,
{
    let serve = hyper::service::service_fn(move |request: Request<Incoming>| {
        let respond = Arc::clone(&respond);
        async move {
            if request.method() != Method::GET && request.method() != Method::HEAD {
                return Ok::<_, Infallible>(text(
                    StatusCode::METHOD_NOT_ALLOWED,
                    "read-only: GET only\n",
                ));
            }
            Ok::<_, Infallible>(respond(request).await)
        }
    });
    let conn = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(Duration::from_millis(header_read_ms))
        .keep_alive(false)
        .serve_connection(TokioIo::new(stream), serve);
    let limit = Duration::from_millis(limits.connection_ms_max);
    match tokio::time::timeout(limit, conn).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => tracing::debug!(error = %e, "HTTP connection ended with an error"),
        Err(_) => tracing::debug!(ms = limits.connection_ms_max, "HTTP connection timed out"),
    }
}

/// A plain-text answer.
pub fn text(status: StatusCode, body: &str) -> Answer {
    with_type(status, body.to_string(), "text/plain; charset=utf-8")
}

/// An answer of `content_type`.
pub fn with_type(status: StatusCode, body: String, content_type: &'static str) -> Answer {
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = status;
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    response
}
