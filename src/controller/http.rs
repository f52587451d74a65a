//! `meshd`'s read-only HTTP face, on the `http` address of replica.toml: `/` the status page
//! (`page.rs`), `/metrics` in the Prometheus text format (`metrics.rs`), `/healthz`. HTTP/1.1 on
//! hyper, one request per connection, every wait bounded: headers within `http_header_read_ms`,
//! a whole connection within `http_connection_ms_max`, at most `http_connections_max` at once.
//! It reads what `status` and `history` answer; it changes nothing.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Weak};
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

use super::api::{Body, HistoryItem, StatusView};
use super::metrics::RaftNow;
use super::page::{Page, render};
use super::service::Service;

/// Most HTTP connections served at once; more are closed at accept.
pub const http_connections_max: usize = 32;
/// How long a client gets to send its request headers.
pub const http_header_read_ms: u64 = 5_000;
/// How long one connection may last, request and answer together.
pub const http_connection_ms_max: u64 = 15_000;
/// Pause after a failed accept (out of file descriptors, say) before the next.
pub const http_accept_retry_ms: u64 = 100;

/// The content type of `/metrics`: the text format, OpenMetrics flavour, which Prometheus scrapes.
pub const metrics_content_type: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Why the HTTP server could not start.
#[derive(Debug, thiserror::Error)]
pub enum HttpError {
    #[error(
        "cannot listen for HTTP on {addr} (`http` in the replica config): {source}; pick a free port or remove `http`"
    )]
    Bind {
        addr: SocketAddr,
        source: std::io::Error,
    },
}

/// The running server. [`HttpServer::stop`] ends it and every connection it has open.
pub struct HttpServer {
    addr: SocketAddr,
    task: JoinHandle<()>,
}

impl HttpServer {
    /// Listens on `addr` and serves `service` (held weakly: the page never keeps a stopping
    /// replica alive).
    pub async fn start(addr: SocketAddr, service: Weak<Service>) -> Result<HttpServer, HttpError> {
        let listener = TcpListener::bind(addr)
            .await
            .map_err(|source| HttpError::Bind { addr, source })?;
        let addr = listener
            .local_addr()
            .map_err(|source| HttpError::Bind { addr, source })?;
        tracing::info!(%addr, "serving the status page and /metrics over HTTP");
        let task = tokio::spawn(accept(listener, service));
        Ok(HttpServer { addr, task })
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

async fn accept(listener: TcpListener, service: Weak<Service>) {
    let limit = Arc::new(Semaphore::new(http_connections_max));
    // Owned here, so aborting this task ends every connection too.
    let mut connections = JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => match Arc::clone(&limit).try_acquire_owned() {
                    Ok(permit) => {
                        connections.spawn(connection(stream, service.clone(), permit));
                    }
                    Err(_) => tracing::warn!(
                        limit = http_connections_max,
                        "HTTP connection refused: too many open"
                    ),
                },
                Err(e) => {
                    tracing::warn!(error = %e, "HTTP accept failed");
                    tokio::time::sleep(Duration::from_millis(http_accept_retry_ms)).await;
                }
            },
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
        }
    }
}

async fn connection(stream: TcpStream, service: Weak<Service>, _permit: OwnedSemaphorePermit) {
    let serve = hyper::service::service_fn(move |request| {
        let service = service.clone();
        async move { Ok::<_, Infallible>(respond(&service, request).await) }
    });
    let conn = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(Duration::from_millis(http_header_read_ms))
        .keep_alive(false)
        .serve_connection(TokioIo::new(stream), serve);
    let limit = Duration::from_millis(http_connection_ms_max);
    match tokio::time::timeout(limit, conn).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => tracing::debug!(error = %e, "HTTP connection ended with an error"),
        Err(_) => tracing::debug!(ms = http_connection_ms_max, "HTTP connection timed out"),
    }
}

async fn respond(service: &Weak<Service>, request: Request<Incoming>) -> Response<Full<Bytes>> {
    if request.method() != Method::GET && request.method() != Method::HEAD {
        return text(StatusCode::METHOD_NOT_ALLOWED, "read-only: GET only\n");
    }
    let Some(service) = service.upgrade() else {
        return text(StatusCode::SERVICE_UNAVAILABLE, "the replica is stopping\n");
    };
    match request.uri().path() {
        "/" => match status_page(&service).await {
            Ok(html) => with_type(StatusCode::OK, html, "text/html; charset=utf-8"),
            Err(e) => text(StatusCode::INTERNAL_SERVER_ERROR, &format!("{e}\n")),
        },
        "/metrics" => {
            let (expiring, seconds_left) = service.cert_gauges();
            service.metrics.certs(expiring, seconds_left);
            match service.metrics.encode(&raft_now(&service)) {
                Ok(body) => with_type(StatusCode::OK, body, metrics_content_type),
                Err(e) => text(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    &format!("cannot encode the metrics: {e}\n"),
                ),
            }
        }
        "/healthz" => text(StatusCode::OK, "ok\n"),
        _ => text(
            StatusCode::NOT_FOUND,
            "not found; this server has /, /metrics and /healthz\n",
        ),
    }
}

async fn status_page(service: &Service) -> Result<String, String> {
    let status: StatusView = match service.status().await {
        Ok(Body::Status(view)) => view,
        Ok(_) => return Err("status answered something else; this is a bug".into()),
        Err(e) => return Err(format!("cannot read the status: {e}")),
    };
    let history: Vec<HistoryItem> = match service.history_items() {
        Ok(items) => items,
        Err(e) => return Err(format!("cannot read the history: {e}")),
    };
    let state = service.state().map_err(|e| e.to_string())?;
    let raft = raft_now(service);
    Ok(render(&Page {
        replica: service.id(),
        term: raft.term,
        leader: service.leader(),
        status: &status,
        mesh: &state.mesh,
        history: &history,
    }))
}

fn raft_now(service: &Service) -> RaftNow {
    let m = service.replica().metrics();
    let m = m.borrow();
    RaftNow {
        term: m.current_term,
        leader: m.state == openraft::ServerState::Leader && m.current_leader == Some(service.id()),
        last_log_index: m.last_log_index.unwrap_or(0),
        last_applied_index: m.last_applied.map(|l| l.index).unwrap_or(0),
    }
}

fn text(status: StatusCode, body: &str) -> Response<Full<Bytes>> {
    with_type(status, body.to_string(), "text/plain; charset=utf-8")
}

fn with_type(
    status: StatusCode,
    body: String,
    content_type: &'static str,
) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = status;
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    response
}
