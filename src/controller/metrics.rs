//! The replica's counters for `/metrics`: atomics the service bumps as it works (commits, pushes
//! and sends by outcome, reports, lease rounds and losses, leadership changes, operator requests
//! by kind and outcome, request latencies), plus Raft's own numbers, the leader's fleet gauges
//! and the `process_*` metrics read at scrape time. Encoded by prometheus-client in the classic
//! Prometheus text format or OpenMetrics, as the scraper asks (decision 0311).

use std::time::Duration;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use super::api::{ApiError, Body, PushOutcome, Request};
use super::fleet::{FleetCounts, FleetGauges};
use crate::conn_metrics::ConnMetrics;
use crate::exposition::Format;

/// One label, fixed at compile time: counters never take a label value from input.
type Label = [(&'static str, &'static str); 1];
/// Two labels, fixed at compile time.
type Labels2 = [(&'static str, &'static str); 2];
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
    request_outcomes: Family<Labels2, Counter>,
    fleet: FleetGauges,
    term: Gauge,
    leader: Gauge,
    last_log_index: Gauge,
    last_applied_index: Gauge,
    certs_expiring: Gauge,
    cert_seconds_left: Gauge,
    conns: ConnMetrics,
    hosts_refused: Gauge,
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
        crate::process_metrics::ProcessMetrics::register(&mut registry, "mesh");
        let fleet = FleetGauges::register(&mut registry);
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
            request_outcomes: Family::default(),
            fleet,
            term: Gauge::default(),
            leader: Gauge::default(),
            last_log_index: Gauge::default(),
            last_applied_index: Gauge::default(),
            certs_expiring: Gauge::default(),
            cert_seconds_left: Gauge::default(),
            conns,
            hosts_refused: Gauge::default(),
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
        for kind in request_kinds.iter().copied() {
            for outcome in request_outcomes {
                let _ = m
                    .request_outcomes
                    .get_or_create(&[("kind", kind), ("outcome", outcome)]);
            }
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
            "Terms this replica led since it started, by change: won (a quorum confirmed it as the term's leader) or lost (it stopped leading a term it won); a leadership restored from its disk at start and never confirmed counts neither (decision 0312)",
            m.leadership.clone(),
        );
        r.register(
            "mesh_request_seconds",
            "Operator requests this replica answered as leader, by kind, in seconds",
            m.requests.clone(),
        );
        r.register(
            "mesh_requests",
            "Operator requests that reached this replica (answered here or forwarded to the leader), by kind and outcome: ok, or the error's class (invalid, unavailable, refused, failed; meshctl --json's error.kind); kind unreadable for a request that did not decode",
            m.request_outcomes.clone(),
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

    /// Counts what one look at the office changed.
    pub(crate) fn leadership(&self, change: OfficeChange) {
        if change.lost {
            self.leadership.get_or_create(&[("change", "lost")]).inc();
        }
        if change.won {
            self.leadership.get_or_create(&[("change", "won")]).inc();
        }
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

    /// The leader's fleet gauges as of now; all 0 on a replica that does not lead.
    pub(crate) fn fleet(&self, counts: &FleetCounts) {
        self.fleet.set(counts);
    }

    /// One operator request as this replica answered it (itself or through the leader), by kind
    /// and outcome: `ok` or the error's class.
    pub(crate) fn answered(&self, kind: &'static str, answer: &Result<Body, ApiError>) {
        let outcome = match answer {
            Ok(_) => "ok",
            Err(e) => e.class().name(),
        };
        self.request_outcomes
            .get_or_create(&[("kind", kind), ("outcome", outcome)])
            .inc();
    }

    /// The exposition in `format`, with Raft's numbers and the endpoint's connection counts as
    /// of now.
    pub(crate) fn encode(
        &self,
        raft: &RaftNow,
        conns: &mesh_transport::ConnCounts,
        format: Format,
    ) -> Result<String, std::fmt::Error> {
        self.conns.set(conns);
        self.term.set(gauge_value(raft.term));
        self.leader.set(i64::from(raft.leader));
        self.last_log_index.set(gauge_value(raft.last_log_index));
        self.last_applied_index
            .set(gauge_value(raft.last_applied_index));
        format.encode(&self.registry)
    }
}

/// Which term's leadership this replica holds, for `mesh_leadership_changes_total` (decision
/// 0312): a leadership counts as won once a quorum acknowledged it, and as lost when a won one
/// ends. A replica restarted from a disk that says it led comes up as that term's leader
/// (openraft restores it), but the others moved on and never acknowledge it: it neither won
/// nor lost anything, where counting every `Leader` state it passed through made a phantom pair.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Office {
    /// The term of the leadership this replica won and still holds.
    held: Option<u64>,
}

/// What one look at Raft's metrics changed in the office: a term won, lost, or both (a term
/// lost and the next won between two looks).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct OfficeChange {
    pub(crate) won: bool,
    pub(crate) lost: bool,
}

impl Office {
    /// The term this replica won and still holds, if any.
    pub(crate) fn held(&self) -> Option<u64> {
        self.held
    }

    /// Takes one look: `leading` is the term this replica is the leader of (`None` when it is
    /// not), `acknowledged` whether a quorum has acknowledged that leadership.
    pub(crate) fn look(&mut self, leading: Option<u64>, acknowledged: bool) -> OfficeChange {
        let mut change = OfficeChange::default();
        if self.held.is_some() && self.held != leading {
            self.held = None;
            change.lost = true;
        }
        if self.held.is_none()
            && let Some(term) = leading
            && acknowledged
        {
            self.held = Some(term);
            change.won = true;
        }
        change
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

/// Every request kind [`request_kind`] names, and [`unreadable_kind`]: the `kind` label of
/// `mesh_requests_total`, whose series exist from the start. A new request kind is added here
/// too (a kind missing here is still counted, from its first request on).
pub const request_kinds: &[&str] = &[
    "status",
    "apply",
    "plan",
    "push",
    "settings_show",
    "settings_set",
    "settings_clear",
    "history",
    "snapshot_save",
    "genesis",
    "certs_reload",
    "certs_list",
    "certs_revoke",
    "apply_chunk",
    "logs",
    "replicas_list",
    "replicas_add",
    "replicas_remove",
    "events",
    "model_show",
    "rollback",
    "settings_rollback",
    unreadable_kind,
];

/// The `kind` of a request whose bytes did not decode into any request.
pub const unreadable_kind: &str = "unreadable";

/// The `outcome` label of `mesh_requests_total`: `ok`, or the class of the error answered
/// (`ErrorClass::name`, what `meshctl --json` prints as `error.kind`).
pub const request_outcomes: [&str; 5] = ["ok", "invalid", "unavailable", "refused", "failed"];

/// The label of a request in `mesh_request_seconds` and `mesh_requests_total`.
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
        let text = m
            .encode(&RaftNow::default(), &conns, Format::Classic)
            .expect("encode");
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
        let text = m
            .encode(&RaftNow::default(), &later, Format::Classic)
            .expect("encode");
        assert!(
            text.contains("\nmesh_connections_refused_total{cap=\"per_principal\"} 5\n"),
            "{text}"
        );
    }

    #[test]
    fn build_info_names_the_release_this_replica_runs() {
        // Issue 25 item 6: which release answers, as a series a dashboard can group by.
        let text = Metrics::new()
            .encode(&RaftNow::default(), &Default::default(), Format::Classic)
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
            .encode(&RaftNow::default(), &Default::default(), Format::Classic)
            .expect("encode");
        assert!(text.contains("\nmesh_certificates_expiring 2\n"), "{text}");
        assert!(
            text.contains("\nmesh_certificate_seconds_left 86400\n"),
            "{text}"
        );
    }

    #[test]
    fn a_leadership_counts_once_a_quorum_acknowledged_it_and_a_restored_one_never() {
        // Issue 25 item 6, decision 0312: a replica that loses office counts one loss; one
        // restarted from a disk that says it led (openraft restores it as leader of its old term,
        // never acknowledged) counts nothing when it finds the newer term.
        let mut office = Office::default();
        let none = OfficeChange::default();
        let won = OfficeChange {
            won: true,
            lost: false,
        };
        let lost = OfficeChange {
            won: false,
            lost: true,
        };
        // Elected in term 3: a candidate, then leader, then acknowledged.
        assert_eq!(office.look(None, false), none);
        assert_eq!(office.look(Some(3), false), none);
        assert_eq!(office.look(Some(3), true), won);
        assert_eq!(office.look(Some(3), true), none);
        // Deposed by term 4.
        assert_eq!(office.look(None, false), lost);
        assert_eq!(office.look(None, false), none);
        // Restarted: leader of its old term 4 from its disk, never acknowledged, then a follower.
        let mut restarted = Office::default();
        assert_eq!(restarted.look(Some(4), false), none);
        assert_eq!(restarted.look(None, false), none);
        // Between two looks it lost term 5 and won term 7.
        assert_eq!(office.look(Some(5), true), won);
        assert_eq!(
            office.look(Some(7), true),
            OfficeChange {
                won: true,
                lost: true
            }
        );
    }

    #[test]
    fn every_request_kind_and_outcome_is_counted_from_zero() {
        // Issue 25 item 6: an alert on the rate of failed requests needs the series before the
        // first failure, and an error's class as its outcome.
        let m = Metrics::new();
        let applied = Body::Applied {
            revision: 2,
            changes: Vec::new(),
            settings_ignored: Vec::new(),
            draining: Vec::new(),
        };
        m.answered("apply", &Ok(applied));
        m.answered(
            "apply",
            &Err(ApiError::NoLeader {
                replica: 1,
                waited_ms: 10,
                reason: "election".into(),
            }),
        );
        m.answered(
            unreadable_kind,
            &Err(ApiError::BadRequest {
                reason: "bytes".into(),
            }),
        );
        let text = m
            .encode(&RaftNow::default(), &Default::default(), Format::Classic)
            .expect("encode");
        for line in [
            "mesh_requests_total{kind=\"apply\",outcome=\"ok\"} 1",
            "mesh_requests_total{kind=\"apply\",outcome=\"unavailable\"} 1",
            "mesh_requests_total{kind=\"unreadable\",outcome=\"invalid\"} 1",
            "mesh_requests_total{kind=\"replicas_remove\",outcome=\"failed\"} 0",
            "mesh_requests_total{kind=\"status\",outcome=\"refused\"} 0",
        ] {
            assert!(text.lines().any(|l| l == line), "no `{line}` in\n{text}");
        }
    }
}
