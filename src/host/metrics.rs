//! mesh-host's own `/metrics` (issue 13 part 4), on the optional `http` address of host.toml:
//! envelopes received, accepted and refused by reason; reports queued, delivered, failed (a
//! delivery that did not get through and stays queued) and dropped; the report queue's length;
//! modules by state and their restarts since the host started; the `process_*` metrics.
//! Counters are bumped where the work happens ([`EnvelopeCounters`] by the agent,
//! [`ReportCounters`] by the reporter, restarts by the supervisors on the board); module states
//! and the queue are read at scrape time. Encoded by prometheus-client in the classic text format
//! or OpenMetrics, as the scraper asks (decision 0311, `crate::exposition`), as meshd's
//! (`src/controller/metrics.rs`), and served by a small read-only HTTP/1.1 server with every wait
//! bounded (`/metrics`, `/healthz`; nothing else, nothing that changes state).

use std::net::SocketAddr;
use std::sync::{Arc, Weak};

use hyper::body::Incoming;
use hyper::header::ACCEPT;
use hyper::{Request, StatusCode};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use tokio::net::TcpListener;

use super::agent::{Agent, Applied, HostError};
use crate::core::envelope::Refusal;
use crate::core::report::ModuleStatus;
use crate::exposition::Format;
use crate::readonly_http::{Answer, Limits, Server, text, with_type};

/// One label, fixed at compile time: no label value ever comes from input.
type Label = [(&'static str, &'static str); 1];

/// Most HTTP connections served at once; more are closed at accept.
pub const http_connections_max: usize = 8;
/// How long one connection may last, request and answer together.
pub const http_connection_ms_max: u64 = 10_000;

/// Why an envelope was refused, as the `reason` label: one word per kind of refusal.
pub const refusal_reasons: [&str; 10] = [
    "malformed",
    "unknown_signer",
    "bad_signature",
    "wrong_machine",
    "older",
    "beyond_bound",
    "not_sender",
    "declaration",
    "stopping",
    "error",
];

/// Every module state's word, as the `state` label (`ModuleState::word`).
pub const module_states: [&str; 6] = [
    "starting", "waiting", "ready", "running", "failed", "stopped",
];

/// What happened to envelopes; shared (cheap clones of the same atomics) by the agent, which
/// counts, and [`HostMetrics`], which reports.
#[derive(Clone, Debug, Default)]
pub struct EnvelopeCounters {
    received: Counter,
    accepted: Counter,
    refused: Family<Label, Counter>,
}

impl EnvelopeCounters {
    pub fn new() -> EnvelopeCounters {
        let c = EnvelopeCounters::default();
        for reason in refusal_reasons {
            let _ = c.refused.get_or_create(&[("reason", reason)]);
        }
        c
    }

    /// Counts one envelope by how [`Agent::receive`] ended.
    pub fn count(&self, result: &Result<Applied, HostError>) {
        self.received.inc();
        match result {
            Ok(_) => {
                self.accepted.inc();
            }
            Err(e) => {
                self.refused
                    .get_or_create(&[("reason", refusal_reason(e))])
                    .inc();
            }
        }
    }
}

/// The `reason` label of a refused envelope.
pub fn refusal_reason(error: &HostError) -> &'static str {
    match error {
        HostError::Refused(Refusal::Malformed(_)) => "malformed",
        HostError::Refused(Refusal::UnknownSigner(_)) => "unknown_signer",
        HostError::Refused(Refusal::BadSignature(_)) => "bad_signature",
        HostError::Refused(Refusal::WrongMachine { .. }) => "wrong_machine",
        HostError::Refused(Refusal::Older { .. }) => "older",
        HostError::Refused(Refusal::Beyond { .. }) => "beyond_bound",
        HostError::Refused(Refusal::NotSender { .. }) => "not_sender",
        HostError::Declaration { .. } => "declaration",
        HostError::ShuttingDown => "stopping",
        HostError::State(_) | HostError::Report(_) | HostError::Genesis { .. } => "error",
    }
}

/// What happened to reports, counted by the reporter.
#[derive(Clone, Debug, Default)]
pub struct ReportCounters {
    queued: Counter,
    delivered: Counter,
    failed: Counter,
    dropped: Counter,
}

impl ReportCounters {
    /// A report numbered and written to the queue.
    pub fn queued(&self) {
        self.queued.inc();
    }

    /// A report a replica took.
    pub fn delivered(&self) {
        self.delivered.inc();
    }

    /// A delivery that did not get through (no replica answered, or too late); it stays queued.
    pub fn failed(&self) {
        self.failed.inc();
    }

    /// A report gone without delivery: the queue was full, a controller refused it, or it was
    /// unreadable.
    pub fn dropped(&self) {
        self.dropped.inc();
    }
}

/// Every metric of one host.
pub struct HostMetrics {
    registry: Registry,
    conns: crate::conn_metrics::ConnMetrics,
    modules: Family<Label, Gauge>,
    queue: Gauge,
}

impl HostMetrics {
    /// The registry over `envelopes` and `reports` (the agent's counters), `restarts` (the
    /// board's) and the gauges filled at scrape time.
    pub fn new(
        envelopes: &EnvelopeCounters,
        reports: &ReportCounters,
        restarts: &Counter,
    ) -> HostMetrics {
        let mut registry = Registry::default();
        // The host endpoint's admission counts (decision 0300), set at each scrape.
        let conns = crate::conn_metrics::ConnMetrics::register(&mut registry, "mesh_host");
        crate::build_info::register(&mut registry, "mesh_host");
        crate::process_metrics::ProcessMetrics::register(&mut registry, "mesh_host");
        let mut m = HostMetrics {
            registry,
            conns,
            modules: Family::default(),
            queue: Gauge::default(),
        };
        let r = &mut m.registry;
        r.register(
            "mesh_host_envelopes_received",
            "Envelopes this host was given (from replicas, and a genesis), whatever became of them",
            envelopes.received.clone(),
        );
        r.register(
            "mesh_host_envelopes_accepted",
            "Envelopes verified, newer than the high-water mark and applied",
            envelopes.accepted.clone(),
        );
        r.register(
            "mesh_host_envelopes_refused",
            "Envelopes refused, by reason: malformed, unknown_signer, bad_signature, wrong_machine, older (not above the high-water mark), declaration (a declaration this host cannot apply), stopping, error (state trouble)",
            envelopes.refused.clone(),
        );
        r.register(
            "mesh_host_reports_queued",
            "Reports numbered and written to the on-disk queue",
            reports.queued.clone(),
        );
        r.register(
            "mesh_host_reports_delivered",
            "Reports a controller replica took",
            reports.delivered.clone(),
        );
        r.register(
            "mesh_host_reports_failed",
            "Deliveries that did not get through (no replica answered in time); the report stays queued",
            reports.failed.clone(),
        );
        r.register(
            "mesh_host_reports_dropped",
            "Reports gone without delivery: the queue was full, a controller refused one, or one was unreadable",
            reports.dropped.clone(),
        );
        r.register(
            "mesh_host_report_queue",
            "Reports in the on-disk queue waiting for a replica",
            m.queue.clone(),
        );
        r.register(
            "mesh_host_modules",
            "Modules of the declaration in force, by state: starting, waiting, ready, running, failed, stopped",
            m.modules.clone(),
        );
        // A counter over the host's life, not the sum of the modules' own counts, which start
        // again at 0 whenever a declaration restarts a module (decision 0313).
        r.register(
            "mesh_host_module_restarts",
            "Restarts of modules by their supervisors (after an exit or a failed start) since this mesh-host started, all modules together; never goes back when a declaration replaces a module",
            restarts.clone(),
        );
        for state in module_states {
            let _ = m.modules.get_or_create(&[("state", state)]);
        }
        m
    }

    /// The exposition in `format`, with `modules`, the queue length and the endpoint's
    /// connection counts as of now.
    pub fn encode(
        &self,
        modules: &[ModuleStatus],
        queued: usize,
        conns: &mesh_transport::ConnCounts,
        format: Format,
    ) -> Result<String, std::fmt::Error> {
        self.conns.set(conns);
        for state in module_states {
            let count = modules.iter().filter(|m| m.state.word() == state).count();
            self.modules
                .get_or_create(&[("state", state)])
                .set(gauge_value(count as u64));
        }
        self.queue.set(gauge_value(queued as u64));
        format.encode(&self.registry)
    }
}

fn gauge_value(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

/// Why the metrics server could not start.
#[derive(Debug, thiserror::Error)]
pub enum MetricsError {
    #[error(
        "cannot listen for HTTP on {addr} (`http` in host.toml): {source}; pick a free port or remove `http`"
    )]
    Bind {
        addr: SocketAddr,
        source: std::io::Error,
    },
}

/// The running server; [`MetricsServer::stop`] ends it and every connection it has open.
pub struct MetricsServer(Server);

struct Scrape {
    agent: Weak<Agent>,
    metrics: HostMetrics,
    /// The endpoint whose connection counts are shown; none, they stay at 0.
    endpoint: Option<mesh_transport::Endpoint>,
}

impl MetricsServer {
    /// Listens on `addr` and serves `agent`'s metrics (held weakly: a scrape never keeps a
    /// stopping host alive) and `endpoint`'s connection counts.
    pub async fn start(
        addr: SocketAddr,
        agent: &Arc<Agent>,
        endpoint: Option<mesh_transport::Endpoint>,
    ) -> Result<MetricsServer, MetricsError> {
        let bind = |source| MetricsError::Bind { addr, source };
        let listener = TcpListener::bind(addr).await.map_err(bind)?;
        let metrics = HostMetrics::new(
            agent.envelope_counters(),
            agent.report_counters(),
            &agent.module_restarts_total(),
        );
        let scrape = Arc::new(Scrape {
            agent: Arc::downgrade(agent),
            metrics,
            endpoint,
        });
        let limits = Limits {
            connections_max: http_connections_max,
            connection_ms_max: http_connection_ms_max,
        };
        let server = Server::start(listener, limits, move |request| {
            let scrape = Arc::clone(&scrape);
            async move { respond(&scrape, request) }
        })
        .map_err(bind)?;
        tracing::info!(addr = %server.local_addr(), "serving /metrics over HTTP");
        Ok(MetricsServer(server))
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.0.local_addr()
    }

    /// Stops accepting and drops every open connection.
    pub async fn stop(self) {
        self.0.stop().await;
    }
}

fn respond(scrape: &Scrape, request: Request<Incoming>) -> Answer {
    let Some(agent) = scrape.agent.upgrade() else {
        return text(StatusCode::SERVICE_UNAVAILABLE, "mesh-host is stopping\n");
    };
    match request.uri().path() {
        "/metrics" => {
            let queued = match agent.reports_queued() {
                Ok(n) => n,
                Err(e) => {
                    return text(
                        StatusCode::INTERNAL_SERVER_ERROR,
                        &format!("cannot count the report queue: {e}\n"),
                    );
                }
            };
            let conns = match &scrape.endpoint {
                Some(endpoint) => endpoint.counts().conns,
                None => mesh_transport::ConnCounts::default(),
            };
            let accept = request.headers().get(ACCEPT).and_then(|v| v.to_str().ok());
            let format = Format::negotiate(accept);
            match scrape
                .metrics
                .encode(&agent.modules_now(), queued, &conns, format)
            {
                Ok(body) => with_type(StatusCode::OK, body, format.content_type()),
                Err(e) => text(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    &format!("cannot encode the metrics: {e}\n"),
                ),
            }
        }
        "/healthz" => text(StatusCode::OK, "ok\n"),
        _ => text(
            StatusCode::NOT_FOUND,
            "not found; mesh-host serves /metrics and /healthz\n",
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::report::ModuleState;

    fn module(name: &str, state: ModuleState, restarts: u32) -> ModuleStatus {
        ModuleStatus {
            name: name.into(),
            state,
            restarts,
            pid: None,
            last_exit: None,
            drift: Vec::new(),
        }
    }

    #[test]
    fn build_info_names_the_release_this_host_runs() {
        // Issue 25 item 6: which release each host runs, for a dashboard over the fleet.
        let m = HostMetrics::new(
            &EnvelopeCounters::new(),
            &ReportCounters::default(),
            &Counter::default(),
        );
        let text = Format::Classic.encode(&m.registry).expect("encode");
        let series = format!(
            "mesh_host_build_info{{version=\"{}\"}} 1",
            env!("CARGO_PKG_VERSION")
        );
        assert!(text.contains(&series), "{text}");
    }

    #[test]
    fn every_series_exists_from_the_start_and_modules_are_counted_by_state() {
        let envelopes = EnvelopeCounters::new();
        let reports = ReportCounters::default();
        let restarts = Counter::default();
        let m = HostMetrics::new(&envelopes, &reports, &restarts);
        envelopes.count(&Err(HostError::ShuttingDown));
        reports.queued();
        restarts.inc_by(9);
        let modules = [
            module("a", ModuleState::Ready, 2),
            module("b", ModuleState::Ready, 0),
            module(
                "c",
                ModuleState::Failed {
                    error: "exit 3".into(),
                },
                5,
            ),
        ];
        let conns = mesh_transport::ConnCounts {
            connections_open: 2,
            ..Default::default()
        };
        let text = m
            .encode(&modules, 4, &conns, Format::OpenMetrics)
            .expect("encode");
        for line in [
            "mesh_host_connections_open 2",
            "mesh_host_handshakes_in_progress 0",
            "mesh_host_connections_refused_total{cap=\"per_principal\"} 0",
            "mesh_host_envelopes_received_total 1",
            "mesh_host_envelopes_accepted_total 0",
            "mesh_host_envelopes_refused_total{reason=\"stopping\"} 1",
            "mesh_host_envelopes_refused_total{reason=\"older\"} 0",
            "mesh_host_reports_queued_total 1",
            "mesh_host_reports_delivered_total 0",
            "mesh_host_report_queue 4",
            "mesh_host_modules{state=\"ready\"} 2",
            "mesh_host_modules{state=\"failed\"} 1",
            "mesh_host_modules{state=\"waiting\"} 0",
            // The host's own count, not the modules' (2 + 5) that a new supervisor resets.
            "mesh_host_module_restarts_total 9",
        ] {
            assert!(text.lines().any(|l| l == line), "no `{line}` in:\n{text}");
        }
    }
}
