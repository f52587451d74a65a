//! `meshd`'s read-only HTTP face, on the `http` address of replica.toml: `/` the status page
//! (`page.rs`), `/metrics` in the classic Prometheus text format or OpenMetrics as the scraper
//! asks (`metrics.rs`, decision 0311), `/healthz`. HTTP/1.1 on
//! the read-only server of `crate::readonly_http` (every wait bounded), a whole connection within
//! `http_connection_ms_max`, at most `http_connections_max` at once.
//! It reads what `status` and `history` answer; it changes nothing. The page is drawn at most
//! once per `page_fresh_ms_max` however many ask (anyone who can reach the port may), from the
//! newest `history_rows_max` history items only, so a flood of requests costs one render a second.

use std::net::SocketAddr;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use hyper::body::Incoming;
use hyper::header::ACCEPT;
use hyper::{Request, StatusCode};
use tokio::net::TcpListener;

use super::api::{Body, HistoryItem, StatusView};
use super::metrics::RaftNow;
use super::page::{Page, history_rows_max, render};
use super::service::Service;
use crate::exposition::Format;
use crate::readonly_http::{Answer, Limits, Server, text, with_type};

/// Most HTTP connections served at once; more are closed at accept.
pub const http_connections_max: usize = 32;
/// How long one connection may last, request and answer together.
pub const http_connection_ms_max: u64 = 15_000;
/// How long a drawn status page is served again before it is drawn anew: requests within it get
/// the same page, and requests while it is being drawn wait for that one drawing.
pub const page_fresh_ms_max: u64 = 1_000;

/// The last page drawn and when. Locked while drawing, so concurrent requests share one drawing.
#[derive(Default)]
struct PageCache(tokio::sync::Mutex<Option<(Instant, Arc<str>)>>);

impl PageCache {
    /// The page drawn at or after `now - page_fresh_ms_max`, or the one `draw` draws now. A failed
    /// drawing is not kept: the next request tries again.
    async fn get<F>(&self, now: Instant, draw: F) -> Result<Arc<str>, String>
    where
        F: Future<Output = Result<String, String>>,
    {
        let mut last = self.0.lock().await;
        if let Some((at, page)) = last.as_ref()
            && now.saturating_duration_since(*at) < Duration::from_millis(page_fresh_ms_max)
        {
            return Ok(page.clone());
        }
        let page: Arc<str> = draw.await?.into();
        *last = Some((now, page.clone()));
        Ok(page)
    }
}

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
pub struct HttpServer(Server);

impl HttpServer {
    /// Listens on `addr` and serves `service` (held weakly: the page never keeps a stopping
    /// replica alive).
    pub async fn start(addr: SocketAddr, service: Weak<Service>) -> Result<HttpServer, HttpError> {
        let bind = |source| HttpError::Bind { addr, source };
        let listener = TcpListener::bind(addr).await.map_err(bind)?;
        let limits = Limits {
            connections_max: http_connections_max,
            connection_ms_max: http_connection_ms_max,
        };
        let cache = Arc::new(PageCache::default());
        let server = Server::start(listener, limits, move |request| {
            let service = service.clone();
            let cache = cache.clone();
            async move { respond(&service, &cache, request).await }
        })
        .map_err(bind)?;
        tracing::info!(addr = %server.local_addr(), "serving the status page and /metrics over HTTP");
        Ok(HttpServer(server))
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.0.local_addr()
    }

    /// Stops accepting and drops every open connection.
    pub async fn stop(self) {
        self.0.stop().await;
    }
}

async fn respond(service: &Weak<Service>, cache: &PageCache, request: Request<Incoming>) -> Answer {
    let Some(service) = service.upgrade() else {
        return text(StatusCode::SERVICE_UNAVAILABLE, "the replica is stopping\n");
    };
    match request.uri().path() {
        "/" => match cache.get(Instant::now(), status_page(&service)).await {
            Ok(html) => with_type(StatusCode::OK, html.to_string(), "text/html; charset=utf-8"),
            Err(e) => text(StatusCode::INTERNAL_SERVER_ERROR, &format!("{e}\n")),
        },
        "/metrics" => {
            let accept = request.headers().get(ACCEPT).and_then(|v| v.to_str().ok());
            let format = Format::negotiate(accept);
            match service.metrics_in(format) {
                Ok(body) => with_type(StatusCode::OK, body, format.content_type()),
                Err(e) => text(StatusCode::INTERNAL_SERVER_ERROR, &format!("{e}\n")),
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
    let history: Vec<HistoryItem> = match service.recent_history_items(history_rows_max) {
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
        made_ms: super::service::now_ms(),
    }))
}

/// Why `/metrics` could not be answered (it answers 500 saying so, rather than numbers that
/// would be wrong).
#[derive(Debug, thiserror::Error)]
pub enum ScrapeError {
    #[error("cannot count the fleet for the mesh_hosts gauges: {0}")]
    Fleet(super::api::ApiError),
    #[error("cannot encode the metrics: {0}")]
    Encode(std::fmt::Error),
}

impl Service {
    /// What `/metrics` serves right now to a scraper that asks for no particular format (the
    /// classic text format).
    pub fn metrics_text(&self) -> Result<String, ScrapeError> {
        self.metrics_in(Format::Classic)
    }

    /// What `/metrics` serves right now, in `format`.
    pub fn metrics_in(&self, format: Format) -> Result<String, ScrapeError> {
        let (expiring, seconds_left) = self.cert_gauges();
        self.metrics.certs(expiring, seconds_left);
        self.metrics.hosts_refused(self.hosts_refused_now());
        self.metrics
            .fleet(&self.fleet_now().map_err(ScrapeError::Fleet)?);
        self.metrics
            .encode(&raft_now(self), &self.endpoint.counts().conns, format)
            .map_err(ScrapeError::Encode)
    }
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[tokio::test]
    async fn the_status_page_is_drawn_at_most_once_per_freshness_window_however_many_ask() {
        // Issue 23 part 4: anyone who reaches the HTTP port may ask for `/`, and drawing it asks
        // every replica and reads the store: requests within `page_fresh_ms_max` share one
        // drawing, concurrent ones included, and a failed drawing is not served again.
        let cache = Arc::new(PageCache::default());
        let drawn = Arc::new(AtomicUsize::new(0));
        let draw = |drawn: Arc<AtomicUsize>| async move {
            let n = drawn.fetch_add(1, Ordering::SeqCst) + 1;
            tokio::task::yield_now().await;
            Ok::<_, String>(format!("page {n}"))
        };
        let t0 = Instant::now();
        let asks: Vec<_> = (0..50)
            .map(|_| {
                let (cache, drawn) = (cache.clone(), drawn.clone());
                tokio::spawn(async move { cache.get(t0, draw(drawn)).await })
            })
            .collect();
        for ask in asks {
            assert_eq!(&*ask.await.expect("joined").expect("page"), "page 1");
        }
        assert_eq!(drawn.load(Ordering::SeqCst), 1, "50 requests, one drawing");
        let within = t0 + Duration::from_millis(page_fresh_ms_max - 1);
        assert_eq!(
            &*cache.get(within, draw(drawn.clone())).await.expect("page"),
            "page 1"
        );
        let after = t0 + Duration::from_millis(page_fresh_ms_max);
        assert_eq!(
            &*cache.get(after, draw(drawn.clone())).await.expect("page"),
            "page 2"
        );
        let failed = after + Duration::from_millis(page_fresh_ms_max);
        let refused = cache
            .get(failed, async { Err("store unreadable".to_string()) })
            .await;
        assert_eq!(refused.expect_err("failed drawing"), "store unreadable");
        assert_eq!(
            &*cache.get(failed, draw(drawn.clone())).await.expect("page"),
            "page 3"
        );
    }
}
