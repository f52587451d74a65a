//! Reports over QUIC: a [`ReportSink`] that files each report with the controller replicas,
//! trying the one that took the last report first, following `NotLeader` redirects a bounded
//! number of hops, and saying `Unavailable` (so the report stays queued on disk) when none took it.

use std::net::SocketAddr;
use std::sync::Mutex;
use std::time::Duration;

use mesh_transport::{Endpoint, MessageKind, Principal, TransportError};
use tracing::Instrument;

use super::reporter::{ReportSink, SinkError, SinkFuture};
use crate::core::report::Report;
use crate::core::wire::{ReportReply, check_report_machine, report_reply_what, report_what};

/// Longest one attempt at one replica may take (resolve, dial, send, answer), in milliseconds.
pub const report_request_timeout_ms: u64 = 2000;
/// Most `NotLeader` redirects followed from one starting replica.
pub const report_redirects_max: usize = 3;

/// Files reports with the controller replicas over a shared endpoint.
pub struct QuicSink {
    endpoint: Endpoint,
    machine: String,
    replicas: Vec<String>,
    /// The address that filed the last report: the leader, most likely.
    last: Mutex<Option<String>>,
}

/// How one attempt at one address ended.
enum Attempt {
    Filed {
        accepted: bool,
    },
    Redirect(String),
    /// The replica answered and refused this report for good.
    Rejected(String),
    Failed(String),
}

impl QuicSink {
    /// `replicas` are `host:port` addresses, as in host.toml.
    pub fn new(endpoint: Endpoint, machine: &str, replicas: Vec<String>) -> QuicSink {
        QuicSink {
            endpoint,
            machine: machine.to_string(),
            replicas,
            last: Mutex::new(None),
        }
    }

    /// The replica that filed the last report, if any has.
    pub fn last_filed_by(&self) -> Option<String> {
        self.last
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .clone()
    }

    fn remember(&self, filed_by: Option<String>) {
        *self
            .last
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner()) = filed_by;
    }

    /// The last replica that took a report first, then the configured ones in order.
    fn candidates(&self) -> Vec<String> {
        let mut order: Vec<String> = self.last_filed_by().into_iter().collect();
        for replica in &self.replicas {
            if !order.contains(replica) {
                order.push(replica.clone());
            }
        }
        order
    }

    async fn deliver_report(&self, report: &Report) -> Result<(), SinkError> {
        check_report_machine(&self.machine, report)
            .map_err(|e| SinkError::Rejected(e.to_string()))?;
        let body = mesh_codec::encode(report_what, report)
            .map_err(|e| SinkError::Rejected(format!("cannot encode the report: {e}")))?;
        let mut failures = Vec::new();
        for start in self.candidates() {
            match self.follow(start, &body, &mut failures).await {
                Ok(Some(filed_by)) => {
                    self.remember(Some(filed_by));
                    return Ok(());
                }
                Ok(None) => continue,
                Err(rejected) => return Err(rejected),
            }
        }
        // Whoever took the last report did not take this one: start from the config next time.
        self.remember(None);
        let why = match failures.is_empty() {
            true => "host.toml lists no replicas".to_string(),
            false => failures.join("; "),
        };
        tracing::warn!(machine = %self.machine, report_sequence = report.report_sequence,
            %why, "no controller replica took the report; it stays queued");
        Err(SinkError::Unavailable(why))
    }

    /// Asks `start`, then whoever it names as leader, at most [`report_redirects_max`] hops.
    /// `Ok(Some(address))` names who filed it; `Ok(None)` means try the next replica.
    async fn follow(
        &self,
        start: String,
        body: &[u8],
        failures: &mut Vec<String>,
    ) -> Result<Option<String>, SinkError> {
        let mut address = start;
        let mut redirects = 0;
        loop {
            match self.attempt(&address, body).await {
                Attempt::Filed { accepted } => {
                    if !accepted {
                        // The account already holds this or newer (G5): sending again would not help.
                        tracing::debug!(machine = %self.machine, replica = %address, "report filed as not newer");
                    }
                    return Ok(Some(address));
                }
                Attempt::Redirect(leader) if redirects < report_redirects_max => {
                    redirects += 1;
                    address = leader;
                }
                Attempt::Redirect(leader) => {
                    failures.push(format!(
                        "{address} redirected to {leader} after {report_redirects_max} redirects already; is the leader changing?"
                    ));
                    return Ok(None);
                }
                Attempt::Rejected(reason) => return Err(SinkError::Rejected(reason)),
                Attempt::Failed(reason) => {
                    failures.push(reason);
                    return Ok(None);
                }
            }
        }
    }

    async fn attempt(&self, address: &str, body: &[u8]) -> Attempt {
        let limit = Duration::from_millis(report_request_timeout_ms);
        match tokio::time::timeout(limit, self.ask(address, body)).await {
            Ok(attempt) => attempt,
            Err(_) => Attempt::Failed(format!(
                "{address}: no answer within {report_request_timeout_ms} ms"
            )),
        }
    }

    async fn ask(&self, address: &str, body: &[u8]) -> Attempt {
        let limit = Duration::from_millis(report_request_timeout_ms);
        let addr = match resolve(address).await {
            Ok(addr) => addr,
            Err(reason) => return Attempt::Failed(reason),
        };
        // Reports go only to replicas, whatever address a redirect or the config names (G10).
        match self.endpoint.peer_principal(addr, limit).await {
            Ok(Principal::Replica(_)) => {}
            Ok(other) => {
                return Attempt::Failed(format!(
                    "{address} is {other}, not a controller replica; fix replicas in host.toml"
                ));
            }
            Err(e) => return Attempt::Failed(e.to_string()),
        }
        let kind = MessageKind::Report {
            machine: self.machine.clone(),
        };
        match self
            .endpoint
            .request(addr, kind, body.to_vec(), limit)
            .await
        {
            Ok(answer) => read_reply(address, &answer),
            Err(e @ (TransportError::Refused { .. } | TransportError::FrameTooLarge { .. })) => {
                Attempt::Rejected(e.to_string())
            }
            Err(e) => Attempt::Failed(e.to_string()),
        }
    }
}

fn read_reply(address: &str, answer: &[u8]) -> Attempt {
    match mesh_codec::decode::<ReportReply>(report_reply_what, answer) {
        Ok(ReportReply::Filed { accepted }) => Attempt::Filed { accepted },
        Ok(ReportReply::Refused { reason }) => {
            // Never filed, and the same report would be refused again: drop it.
            tracing::warn!(replica = address, %reason, "report refused by the leader");
            Attempt::Filed { accepted: false }
        }
        Ok(ReportReply::NotLeader {
            leader: Some(leader),
        }) => Attempt::Redirect(leader),
        Ok(ReportReply::NotLeader { leader: None }) => {
            Attempt::Failed(format!("{address} is not the leader and knows none yet"))
        }
        Err(e) => Attempt::Failed(format!(
            "{address} answered what is not a report reply: {e}"
        )),
    }
}

/// `ip:port` directly, or the first address a `name:port` resolves to.
async fn resolve(address: &str) -> Result<SocketAddr, String> {
    if let Ok(addr) = address.parse::<SocketAddr>() {
        return Ok(addr);
    }
    let found = tokio::net::lookup_host(address)
        .await
        .map_err(|e| format!("{address}: cannot resolve: {e}"))?;
    let mut found = found;
    found
        .next()
        .ok_or_else(|| format!("{address}: resolves to no address"))
}

impl ReportSink for QuicSink {
    fn deliver<'a>(&'a self, report: &'a Report) -> SinkFuture<'a> {
        let span = tracing::debug_span!("deliver", machine = %self.machine,
            report_sequence = report.report_sequence);
        Box::pin(self.deliver_report(report).instrument(span))
    }
}
