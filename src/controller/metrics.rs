//! The replica's counters for `/metrics`: atomics the service bumps as it works (commits, pushes
//! and sends by outcome, reports, lease rounds and losses, leadership changes, request latencies),
//! plus Raft's own numbers read at scrape time. Encoded in the Prometheus text exposition format
//! (OpenMetrics flavour) by prometheus-client.

use std::time::Duration;

use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use super::api::{ApiError, Body, PushOutcome, Request};
use crate::conn_metrics::ConnMetrics;

/// One label, fixed at compile time: counters never take a label value from input.
type Label = [(&'static str, &'static str); 1];
type Latencies = Family<Label, Histogram, fn() -> Histogram>;

/// Smallest request-latency bucket, in seconds.
pub const latency_bucket_s_min: f64 = 0.001;
/// How many latency buckets (doubling from the smallest: 1 ms up to about 33 s).
pub const latency_buckets: u16 = 16;

fn latency_histogram() -> Histogram {
    Histogram::new(exponential_buckets(
        latency_bucket_s_min,
        2.0,
        latency_buckets,
    ))
}

/// Every metric of one replica.
pub struct Metrics {
    registry: Registry,
    commits: Family<Label, Counter>,
    pushes: Family<Label, Counter>,
    sends: Family<Label, Counter>,
    reports: Family<Label, Counter>,
    impostors: Family<Label, Counter>,
    lease_rounds: Family<Label, Counter>,
    lease_losses: Counter,
    unproven_refusals: Counter,
    leadership: Family<Label, Counter>,
    requests: Latencies,
    term: Gauge,
    leader: Gauge,
    last_log_index: Gauge,
    last_applied_index: Gauge,
    certs_expiring: Gauge,
    cert_seconds_left: Gauge,
    conns: ConnMetrics,
    hosts_refused: Gauge,
    hosts_silent: Gauge,
    /// Drift (issue 25 item 3, decision 0305).
    hosts_drifted: Gauge,
}

impl Default for Metrics {
    fn default() -> Metrics {
        Metrics::new()
    }
}

impl Metrics {
    pub fn new() -> Metrics {
        let mut registry = Registry::default();
        // The endpoint's admission counts (decision 0300), set at each scrape.
        let conns = ConnMetrics::register(&mut registry, "mesh");
        crate::build_info::register(&mut registry, "mesh");
        let mut m = Metrics {
            registry,
            commits: Family::default(),
            pushes: Family::default(),
            sends: Family::default(),
            reports: Family::default(),
            impostors: Family::default(),
            lease_rounds: Family::default(),
            lease_losses: Counter::default(),
            unproven_refusals: Counter::default(),
            leadership: Family::default(),
            requests: Family::new_with_constructor(latency_histogram),
            term: Gauge::default(),
            leader: Gauge::default(),
            last_log_index: Gauge::default(),
            last_applied_index: Gauge::default(),
            certs_expiring: Gauge::default(),
            cert_seconds_left: Gauge::default(),
            conns,
            hosts_refused: Gauge::default(),
            hosts_silent: Gauge::default(),
            hosts_drifted: Gauge::default(),
        };
        // Every known series exists from the start at 0, so a rate over the first event is right.
        for word in ["applied", "refused", "failed"] {
            let _ = m.commits.get_or_create(&[("outcome", word)]);
        }
        for word in ["done", "failed"] {
            let _ = m.pushes.get_or_create(&[("outcome", word)]);
        }
        for word in ["applied", "sent", "held", "refused", "failed"] {
            let _ = m.sends.get_or_create(&[("outcome", word)]);
        }
        for word in [
            "accepted",
            "heard",
            "refused",
            "unproven",
            "beyond",
            "busy",
            "over_bound",
            "over_quota",
            "not_leader",
            "error",
        ] {
            let _ = m.reports.get_or_create(&[("outcome", word)]);
        }
        for word in ["raft", "forward", "report"] {
            let _ = m.impostors.get_or_create(&[("kind", word)]);
        }
        for word in ["granted", "refused"] {
            let _ = m.lease_rounds.get_or_create(&[("outcome", word)]);
        }
        for word in ["won", "lost"] {
            let _ = m.leadership.get_or_create(&[("change", word)]);
        }
        let r = &mut m.registry;
        r.register(
            "mesh_commits",
            "Proposals this replica made, by outcome: applied, refused (by the state machine), failed (not committed)",
            m.commits.clone(),
        );
        r.register(
            "mesh_pushes",
            "Push requests this replica answered as leader, by outcome: done or failed",
            m.pushes.clone(),
        );
        r.register(
            "mesh_sends",
            "Machines in the answers of those pushes, by outcome: applied, sent, held, refused, failed",
            m.sends.clone(),
        );
        r.register(
            "mesh_reports",
            "Host reports received, by outcome: accepted (filed into the account), heard (said what the account says: not proposed, decision 0216), refused (not newer than the account or than what was heard), unproven, beyond (an epoch, sequence or counter above the bound), busy (report queue full), over_bound (more modules or longer texts than a report may hold, decision 0299), over_quota (its host already had reports_in_flight_per_host_max queued or committing), not_leader, error",
            m.reports.clone(),
        );
        r.register(
            "mesh_impostor_messages",
            "Messages refused because an id they carry is not the one their certificate names (a Raft sender, candidate or leader, a forward's replica, a report's machine) or their term is beyond the bound, by kind",
            m.impostors.clone(),
        );
        r.register(
            "mesh_lease_rounds",
            "Lease rounds (a quorum round before acting), by outcome: granted or refused",
            m.lease_rounds.clone(),
        );
        r.register(
            "mesh_lease_losses",
            "Times an action found its lease closed or its leadership gone and stopped",
            m.lease_losses.clone(),
        );
        r.register(
            "mesh_unproven_refusals",
            "Envelopes a host refused as older than one it holds with nothing signed by a trusted replica to show for it (a mark edited or corrupt on its disk): its line failed, the push went on",
            m.unproven_refusals.clone(),
        );
        r.register(
            "mesh_leadership_changes",
            "Leadership changes of this replica, by change: won or lost",
            m.leadership.clone(),
        );
        r.register(
            "mesh_request_seconds",
            "Operator requests this replica answered as leader, by kind, in seconds",
            m.requests.clone(),
        );
        r.register(
            "mesh_raft_term",
            "The current Raft term (the epoch)",
            m.term.clone(),
        );
        r.register(
            "mesh_raft_leader",
            "1 while this replica is the leader, else 0",
            m.leader.clone(),
        );
        r.register(
            "mesh_raft_last_log_index",
            "Index of the last entry in this replica's log",
            m.last_log_index.clone(),
        );
        r.register(
            "mesh_certificates_expiring",
            "Certificates this replica knows of (its own, its peers' from their last handshakes) that expire within 30 days or have expired",
            m.certs_expiring.clone(),
        );
        r.register(
            "mesh_certificate_seconds_left",
            "Seconds until the soonest expiry among the certificates this replica knows of (negative: expired)",
            m.cert_seconds_left.clone(),
        );
        r.register(
            "mesh_hosts_reports_refused",
            "Machines of the model whose reports this replica, as leader, refused for size or rate (over_bound, over_quota) in the last minute; each is named in status",
            m.hosts_refused.clone(),
        );
        r.register(
            "mesh_hosts_silent",
            "Machines of the model this replica, as leader, has not heard for silent_after_ms or longer (decision 0301; a host not heard since it took office counts once it has led that long); each reads SILENT in status",
            m.hosts_silent.clone(),
        );
        r.register(
            "mesh_hosts_drifted",
            "Machines of the model whose last report, on this replica as leader, says what they run differs from their declaration (decision 0305); each reads DRIFTED in status until a push restores it",
            m.hosts_drifted.clone(),
        );
        r.register(
            "mesh_raft_last_applied_index",
            "Index of the last entry applied to this replica's state machine",
            m.last_applied_index.clone(),
        );
        m
    }

    /// One proposal's end: `Ok(true)` applied, `Ok(false)` refused by the state machine, `Err`
    /// not committed.
    pub(crate) fn commit(&self, outcome: Result<bool, ()>) {
        let word = match outcome {
            Ok(true) => "applied",
            Ok(false) => "refused",
            Err(()) => "failed",
        };
        self.commits.get_or_create(&[("outcome", word)]).inc();
    }

    /// One host report, by outcome (a label of `mesh_reports`, fixed at compile time).
    pub(crate) fn report(&self, outcome: &'static str) {
        self.reports.get_or_create(&[("outcome", outcome)]).inc();
    }

    /// One message refused because the ids it carries are not its certificate's: `raft`,
    /// `forward` or `report`.
    pub(crate) fn impostor(&self, kind: &'static str) {
        self.impostors.get_or_create(&[("kind", kind)]).inc();
    }

    pub(crate) fn lease_round(&self, granted: bool) {
        let word = if granted { "granted" } else { "refused" };
        self.lease_rounds.get_or_create(&[("outcome", word)]).inc();
    }

    /// One unproven older refusal by a host (issue 27 part 4).
    pub(crate) fn unproven_refusal(&self) {
        self.unproven_refusals.inc();
    }

    pub(crate) fn lease_lost(&self) {
        self.lease_losses.inc();
    }

    pub(crate) fn leadership(&self, won: bool) {
        let word = if won { "won" } else { "lost" };
        self.leadership.get_or_create(&[("change", word)]).inc();
    }

    /// One operator request handled here, with how long it took and what it answered; a push's
    /// answer also counts its machines by outcome.
    pub(crate) fn request(
        &self,
        kind: &'static str,
        took: Duration,
        answer: &Result<Body, ApiError>,
    ) {
        self.requests
            .get_or_create(&[("kind", kind)])
            .observe(took.as_secs_f64());
        if kind != "push" {
            return;
        }
        let word = if answer.is_ok() { "done" } else { "failed" };
        self.pushes.get_or_create(&[("outcome", word)]).inc();
        if let Ok(Body::Push(view)) = answer {
            for line in &view.lines {
                let word = match line.outcome {
                    PushOutcome::Applied { .. } => "applied",
                    PushOutcome::Sent { .. } => "sent",
                    PushOutcome::Held { .. } => "held",
                    PushOutcome::Refused { .. } => "refused",
                    PushOutcome::Failed { .. } => "failed",
                };
                self.sends.get_or_create(&[("outcome", word)]).inc();
            }
        }
    }

    /// The certificate gauges: how many expire within 30 days, and the soonest expiry.
    pub(crate) fn certs(&self, expiring: usize, seconds_left: Option<i64>) {
        self.certs_expiring
            .set(i64::try_from(expiring).unwrap_or(i64::MAX));
        self.cert_seconds_left.set(seconds_left.unwrap_or(i64::MAX));
    }

    /// How many machines' reports were refused for size or rate in the last minute.
    pub(crate) fn hosts_refused(&self, machines: usize) {
        self.hosts_refused
            .set(i64::try_from(machines).unwrap_or(i64::MAX));
    }

    /// How many machines are silent now.
    pub(crate) fn hosts_silent(&self, machines: usize) {
        self.hosts_silent
            .set(i64::try_from(machines).unwrap_or(i64::MAX));
    }

    /// How many machines are drifted now (decision 0305).
    pub(crate) fn hosts_drifted(&self, machines: usize) {
        self.hosts_drifted
            .set(i64::try_from(machines).unwrap_or(i64::MAX));
    }

    /// The text exposition, with Raft's numbers and the endpoint's connection counts as of now.
    pub(crate) fn encode(
        &self,
        raft: &RaftNow,
        conns: &mesh_transport::ConnCounts,
    ) -> Result<String, std::fmt::Error> {
        self.conns.set(conns);
        self.term.set(gauge_value(raft.term));
        self.leader.set(i64::from(raft.leader));
        self.last_log_index.set(gauge_value(raft.last_log_index));
        self.last_applied_index
            .set(gauge_value(raft.last_applied_index));
        let mut out = String::new();
        encode(&mut out, &self.registry)?;
        Ok(out)
    }
}

/// Raft's numbers at one instant, read from the replica's metrics.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct RaftNow {
    pub(crate) term: u64,
    pub(crate) leader: bool,
    pub(crate) last_log_index: u64,
    pub(crate) last_applied_index: u64,
}

fn gauge_value(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

/// The label of a request in `mesh_request_seconds`.
pub(crate) fn request_kind(request: &Request) -> &'static str {
    match request {
        Request::Status => "status",
        Request::Apply { .. } => "apply",
        Request::Plan { .. } => "plan",
        Request::Push { .. } => "push",
        Request::SettingsShow { .. } => "settings_show",
        Request::SettingsSet { .. } => "settings_set",
        Request::SettingsClear { .. } => "settings_clear",
        Request::History { .. } => "history",
        Request::SnapshotChunk { .. } => "snapshot_save",
        Request::Genesis { .. } => "genesis",
        Request::CertsReload => "certs_reload",
        Request::CertsList => "certs_list",
        Request::CertsRevoke { .. } => "certs_revoke",
        Request::ApplyChunk { .. } => "apply_chunk",
        Request::ApplyUpload { .. } => "apply",
        Request::Logs { .. } => "logs",
        Request::ReplicasList => "replicas_list",
        Request::ReplicasAdd { .. } => "replicas_add",
        Request::ReplicasRemove { .. } => "replicas_remove",
        Request::Events { .. } => "events",
        Request::ModelShow { .. } => "model_show",
        Request::Rollback { .. } => "rollback",
        Request::SettingsRollback { .. } => "settings_rollback",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connection_counts_show_handshakes_open_connections_and_refusals_by_cap() {
        // Decision 0300: /metrics shows the endpoint's admission counts.
        let m = Metrics::new();
        let conns = mesh_transport::ConnCounts {
            handshakes_in_progress: 3,
            connections_open: 7,
            retries_sent: 4,
            refused_per_principal: 2,
            refused_reserve: 1,
            ..Default::default()
        };
        let text = m.encode(&RaftNow::default(), &conns).expect("encode");
        for line in [
            "\nmesh_handshakes_in_progress 3\n",
            "\nmesh_connections_open 7\n",
            "\nmesh_handshake_retries_total 4\n",
            "\nmesh_connections_refused_total{cap=\"per_principal\"} 2\n",
            "\nmesh_connections_refused_total{cap=\"reserve\"} 1\n",
            "\nmesh_connections_refused_total{cap=\"full\"} 0\n",
        ] {
            assert!(text.contains(line), "{line} in {text}");
        }
        // Set again from a later snapshot, a counter follows the endpoint's, not doubles it.
        let later = mesh_transport::ConnCounts {
            refused_per_principal: 5,
            ..conns
        };
        let text = m.encode(&RaftNow::default(), &later).expect("encode");
        assert!(
            text.contains("\nmesh_connections_refused_total{cap=\"per_principal\"} 5\n"),
            "{text}"
        );
    }

    #[test]
    fn build_info_names_the_release_this_replica_runs() {
        // Issue 25 item 6: which release answers, as a series a dashboard can group by.
        let text = Metrics::new()
            .encode(&RaftNow::default(), &Default::default())
            .expect("encode");
        let series = format!(
            "mesh_build_info{{version=\"{}\"}} 1",
            env!("CARGO_PKG_VERSION")
        );
        assert!(text.contains(&series), "{text}");
    }

    #[test]
    fn certificate_gauges_say_how_many_expire_soon_and_when_the_first_does() {
        // Rotation: /metrics warns before a certificate in the cluster expires.
        let m = Metrics::new();
        m.certs(2, Some(86_400));
        let text = m
            .encode(&RaftNow::default(), &Default::default())
            .expect("encode");
        assert!(text.contains("\nmesh_certificates_expiring 2\n"), "{text}");
        assert!(
            text.contains("\nmesh_certificate_seconds_left 86400\n"),
            "{text}"
        );
    }
}
