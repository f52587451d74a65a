//! `meshctl bench --reports N --rate R`: N simulated hosts filing reports with the cluster of the
//! context at R reports/s in all (issue 14, item 1; decision 0215).
//!
//! Each simulated host is what a `mesh-host` is to the controller: its own QUIC endpoint with a
//! real host certificate (`host:<machine>`, issued in memory from the CA key in the directory
//! `meshctl init` wrote, as `meshctl certs renew` does), one connection kept open to the leader,
//! and real report frames (`MessageKind::Report` with an encoded `core::report::Report`, as
//! `host/sink.rs` sends them), following `NotLeader` redirects. Host `i` reports every `N / R`
//! seconds, offset by `i / R`, one report in flight at a time as a host's queue does. A report's
//! latency is from the send to the answer `Filed { accepted: true }`; anything else is a failure.
//!
//! By default every report after a host's first says what the one before said (same position,
//! same modules): the steady state of a fleet. `--changing P` makes P % of the reports differ
//! (a module's restart count moves), so they must be filed through Raft.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use mesh_transport::{
    Ca, Endpoint, Identity, MessageKind, Peer, Principal, TransportConfig, Validity,
};

use super::super::client::{self, ClientError};
use super::super::context::Context;
use super::super::{CliError, Output, exit_done, exit_failed};
use super::{Figures, error_chars_max, figures};
use crate::controller::api::{Body, MachineView, Request, StatusView};
use crate::core::declaration::Digest;
use crate::core::report::{ModuleState, ModuleStatus, Report};
use crate::core::wire::{ReportReply, report_reply_what, report_what};

/// Most simulated hosts in one run (the fleet of issue 14).
pub const hosts_max: u32 = 10_000;
/// The offered rate when `--rate` is not given: 10,000 hosts every 10 s.
pub const rate_default: u32 = 1000;
/// Most module states in each report.
pub const modules_max: u32 = 64;
/// The target: p99 filing latency below this (issue 14).
pub const p99_ms_max: f64 = 100.0;
/// Most redirects one report follows (as `host/sink.rs`).
pub const redirects_max: usize = crate::host::sink::report_redirects_max;
/// How long one attempt may take (as `host/sink.rs`); past it the report counts as failed.
pub const report_timeout_ms: u64 = crate::host::sink::report_request_timeout_ms;
/// How many hosts dial (and get their certificate issued) at once while the bench sets up.
pub const setup_in_flight_max: usize = 32;
/// How many times a host dials the leader at setup before the bench gives up (a loaded leader
/// may take longer than one dial timeout for a handshake, and a host dials again too).
pub const setup_dials_max: u32 = 3;
/// How long each simulated host's certificate is valid.
pub const cert_days: u32 = 1;
/// How long the reports still in flight when the run ends may take.
pub const drain_ms_max: u64 = report_timeout_ms * (redirects_max as u64 + 1) + 5_000;

/// What `--reports` asks for, checked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReportsSpec {
    pub hosts: u32,
    pub rate: u32,
    pub duration_s: u64,
    pub modules: u32,
    /// Percent of reports that differ from the one before (0..=100).
    pub changing: u32,
    /// Where `meshctl init` put `ca.pem` and `ca.key`; `None`: beside the context file.
    pub dir: Option<PathBuf>,
}

impl ReportsSpec {
    /// How often each host reports.
    pub fn period(&self) -> Duration {
        Duration::from_secs_f64(f64::from(self.hosts) / f64::from(self.rate))
    }
}

/// The spec of `--reports N` from the arguments, or why not (bad usage, exit 2).
pub fn spec(args: &super::BenchArgs, hosts: u32) -> Result<ReportsSpec, CliError> {
    let usage = |m: String| Err(CliError::Usage(format!("bench --reports: {m}")));
    if args.clients.is_some() || args.clean {
        return usage(
            "--clients and --clean are for the write bench; give --reports with --rate, --duration, --modules, --changing".into(),
        );
    }
    let spec = ReportsSpec {
        hosts,
        rate: args.rate.unwrap_or(rate_default),
        duration_s: args.duration_s.unwrap_or(60),
        modules: args.modules,
        changing: args.changing,
        dir: args.dir.clone(),
    };
    let bad = |what: &str, value: u64, min: u64, max: u64| {
        usage(format!(
            "{what} {value} is out of range {min}..={max}; give a value within it"
        ))
    };
    if spec.hosts == 0 || spec.hosts > hosts_max {
        return bad("--reports", spec.hosts.into(), 1, hosts_max.into());
    }
    if spec.rate == 0 || spec.rate > super::rate_max {
        return bad("--rate", spec.rate.into(), 1, super::rate_max.into());
    }
    if spec.duration_s == 0 || spec.duration_s > super::duration_s_max {
        return bad("--duration", spec.duration_s, 1, super::duration_s_max);
    }
    if spec.modules > modules_max {
        return bad("--modules", spec.modules.into(), 0, modules_max.into());
    }
    if spec.changing > 100 {
        return bad("--changing", spec.changing.into(), 0, 100);
    }
    Ok(spec)
}

/// The verdict lines and whether all passed: no failed report, reports filed above 90 % of the
/// offered rate, p99 below [`p99_ms_max`].
pub fn verdict(f: &Figures, spec: &ReportsSpec) -> (Vec<String>, bool) {
    let mut lines = Vec::new();
    let mut pass = true;
    if !f.errors.is_empty() {
        lines.push("FAIL: reports not filed".to_string());
        for (what, count) in &f.errors {
            lines.push(format!("FAIL: ERROR({what}) -> {count}"));
        }
        pass = false;
    }
    let floor = f64::from(spec.rate) * super::rate_share_min;
    if f.writes_per_s <= floor {
        lines.push(format!(
            "FAIL: Throughput too low: {:.0} reports/s filed (needs above {floor:.0}: 90% of the {} offered)",
            f.writes_per_s, spec.rate
        ));
        pass = false;
    } else {
        lines.push(format!(
            "PASS: Throughput is {:.0} reports/s filed",
            f.writes_per_s
        ));
    }
    if f.p99_ms >= p99_ms_max {
        lines.push(format!(
            "FAIL: p99 filing latency {:.1} ms (needs below {p99_ms_max:.0} ms)",
            f.p99_ms
        ));
        pass = false;
    } else {
        lines.push(format!("PASS: p99 filing latency {:.1} ms", f.p99_ms));
    }
    lines.push(if pass { "PASS" } else { "FAIL" }.to_string());
    (lines, pass)
}

/// The figures line.
pub fn render_figures(f: &Figures) -> String {
    super::render_figures_as(f, "reports/s", "filed")
}

/// A failure's text as a kind to count: the timeout's remaining milliseconds dropped (they
/// differ per report), cut at [`error_chars_max`].
pub fn error_kind(what: &str) -> String {
    let kind = match what.split_once(": no answer within ") {
        Some((head, _)) => format!("{head}: no answer within {report_timeout_ms} ms"),
        None => what.to_string(),
    };
    kind.chars().take(error_chars_max).collect()
}

/// Whether report `k` of host `i` differs from the one before, for `changing` percent of them
/// (a fixed spread, the same every run).
pub fn changes(i: u32, k: u64, changing: u32) -> bool {
    if changing == 0 {
        return false;
    }
    let mut x = (u64::from(i) << 32) ^ k ^ 0x9e37_79b9_7f4a_7c15;
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^= x >> 31;
    x % 100 < u64::from(changing)
}

/// Where a simulated host starts: the position its machine's account holds (so its reports are
/// newer), and the module states it reports.
#[derive(Clone, Debug)]
pub struct HostStart {
    pub machine: String,
    pub epoch: u64,
    pub sequence: u64,
    pub applied: Option<Digest>,
    /// The first report sequence: above the account's and above any earlier run's.
    pub report_sequence: u64,
}

impl HostStart {
    /// From the machine's status: its last report's position, and `floor` (the run's start, so a
    /// later run starts above an earlier one's reports).
    pub fn of(m: &MachineView, floor: u64) -> HostStart {
        let (epoch, sequence, report_sequence, applied) = m.last_report.unwrap_or((0, 0, 0, None));
        HostStart {
            machine: m.name.clone(),
            epoch,
            sequence,
            applied,
            report_sequence: floor.max(report_sequence.saturating_add(1)),
        }
    }

    /// Report `k` of this host, whose first module has restarted `restarts` times.
    pub fn report(&self, k: u64, modules: u32, restarts: u32) -> Report {
        Report {
            machine: self.machine.clone(),
            epoch: self.epoch,
            sequence: self.sequence,
            report_sequence: self.report_sequence + k,
            applied: self.applied,
            modules: (0..modules)
                .map(|j| ModuleStatus {
                    name: format!("m{j:02}"),
                    state: ModuleState::Ready,
                    restarts: if j == 0 { restarts } else { 0 },
                    pid: Some(10_000 + j),
                    last_exit: None,
                    drift: Vec::new(),
                })
                .collect(),
            refused_older: 0,
            last_refusal: None,
            proof: None,
        }
    }
}

/// The leader the hosts send to, shared: a redirect moves every host.
type Leader = Arc<RwLock<(u64, SocketAddr)>>;

/// One simulated host.
struct SimHost {
    index: u32,
    start: HostStart,
    endpoint: Endpoint,
}

pub async fn run(context: &Context, spec: &ReportsSpec) -> Result<Output, CliError> {
    let status = match super::ask(context, &Request::Status).await? {
        Body::Status(view) => view,
        other => {
            return Err(CliError::Render(format!(
                "status answered {:?}",
                format!("{other:?}").chars().take(40).collect::<String>()
            )));
        }
    };
    let (machines, leader) = plan(context, &status, spec)?;
    let ca = load_ca(context, spec)?;
    let mut text = format!(
        "meshctl bench --reports: {} hosts, {} reports/s offered (each host every {:.2} s), {} s, {} modules per report, {}% changing, leader replica {}\n",
        spec.hosts,
        spec.rate,
        spec.period().as_secs_f64(),
        spec.duration_s,
        spec.modules,
        spec.changing,
        leader.0,
    );
    eprintln!(
        "meshctl bench --reports: issuing {} host certificates and dialling the leader",
        spec.hosts
    );
    // The run's start in 1/64 ms since the Unix epoch: a later run starts above an earlier one's
    // reports (a host sends far fewer than 64 a millisecond), and it stays below the counter bound
    // controllers take (`epoch_max`, 2^48) until the year 2109.
    let floor = u64::try_from(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_err(|e| CliError::Render(format!("the clock is before 1970: {e}")))?
            .as_millis()
            .saturating_mul(64),
    )
    .unwrap_or(crate::core::envelope::epoch_max / 2)
    .min(crate::core::envelope::epoch_max / 2);
    let starts: Vec<HostStart> = machines.iter().map(|m| HostStart::of(m, floor)).collect();
    let hosts = connect(context, &ca, starts, leader.1).await?;
    eprintln!(
        "meshctl bench --reports: running for {} s; Ctrl-C stops it early",
        spec.duration_s
    );
    let leader: Leader = Arc::new(RwLock::new(leader));
    let run = drive(context, hosts, spec, leader).await;
    let figures = figures(run.lat_us, run.errors, run.elapsed);
    text.push_str(&render_figures(&figures));
    text.push_str(&format!(
        "{} of {} reports sent differed from the one before\n",
        run.changed, run.sent
    ));
    let (lines, pass) = verdict(&figures, spec);
    for l in lines {
        text.push_str(&l);
        text.push('\n');
    }
    if run.interrupted {
        text.push_str("interrupted: the run stopped early at Ctrl-C\n");
    }
    Ok(Output {
        text,
        code: if pass && !run.interrupted {
            exit_done
        } else {
            exit_failed
        },
    })
}

/// The machines the hosts report for (the model's first N, by name) and the leader, or why the
/// run cannot start.
fn plan(
    context: &Context,
    status: &StatusView,
    spec: &ReportsSpec,
) -> Result<(Vec<MachineView>, (u64, SocketAddr)), CliError> {
    if (status.machines.len() as u64) < u64::from(spec.hosts) {
        return Err(CliError::Usage(format!(
            "bench --reports {}: the model has {} machines; a simulated host reports for a machine of the model, so `meshctl apply` a mesh of at least {} machines first (benches/reports.sh makes one of bench-NNNNN machines)",
            spec.hosts,
            status.machines.len(),
            spec.hosts
        )));
    }
    let mut machines = status.machines.clone();
    machines.sort_by(|a, b| a.name.cmp(&b.name));
    machines.truncate(spec.hosts as usize);
    let leader = status
        .replicas
        .iter()
        .find(|r| r.leader)
        .and_then(|r| {
            context
                .replicas
                .iter()
                .find(|(id, _)| *id == r.id)
                .copied()
        })
        .ok_or_else(|| {
            CliError::Usage(
                "bench --reports: no replica of the context leads right now; wait for a leader (`meshctl status`) and run it again".into(),
            )
        })?;
    Ok((machines, leader))
}

fn load_ca(context: &Context, spec: &ReportsSpec) -> Result<Ca, CliError> {
    let dir = match &spec.dir {
        Some(d) => d.clone(),
        None => context
            .path
            .parent()
            .map(Path::to_path_buf)
            .unwrap_or_else(|| PathBuf::from(".")),
    };
    let (cert, key) = (dir.join("ca.pem"), dir.join("ca.key"));
    Ca::load(&cert, &key).map_err(|e| {
        CliError::Usage(format!(
            "bench --reports: cannot load the CA ({}, {}): {e}; the simulated hosts need real host certificates, issued from the CA key in the directory `meshctl init` wrote: pass it with --dir",
            cert.display(),
            key.display()
        ))
    })
}

/// Issues every host's certificate and dials the leader with it before the clock starts (a
/// handshake is not a report), at most [`setup_in_flight_max`] at once.
async fn connect(
    context: &Context,
    ca: &Ca,
    starts: Vec<HostStart>,
    leader: SocketAddr,
) -> Result<Vec<SimHost>, CliError> {
    let config = TransportConfig::default()
        .check()
        .map_err(|e| ClientError::Bind(e.to_string()))?;
    let bind_addr = client::any_addr(&context.replicas);
    let mut out: Vec<SimHost> = Vec::with_capacity(starts.len());
    let mut pending = starts.into_iter().enumerate().peekable();
    while pending.peek().is_some() {
        let mut dials = Vec::new();
        for (index, start) in pending.by_ref().take(setup_in_flight_max) {
            let principal = Principal::Host(start.machine.clone());
            let issued = ca
                .issue(&principal, Validity::days_from_now(cert_days))
                .map_err(|e| {
                    CliError::Usage(format!(
                        "bench --reports: cannot issue {principal}'s certificate: {e}"
                    ))
                })?;
            let identity = Identity::from_pem(ca.cert_pem(), issued.cert_pem(), issued.key_pem())
                .map_err(|e| {
                CliError::Usage(format!(
                    "bench --reports: {principal}'s certificate does not load: {e}"
                ))
            })?;
            let endpoint = Endpoint::bind(bind_addr, &identity, config.clone())
                .map_err(|e| ClientError::Bind(e.to_string()))?;
            dials.push(async move {
                let dial = Duration::from_millis(client::dial_timeout_ms);
                let mut tries = 0;
                loop {
                    tries += 1;
                    match endpoint.peer_principal(leader, dial).await {
                        Ok(Principal::Replica(_)) => {
                            return Ok(SimHost {
                                index: index as u32,
                                start,
                                endpoint,
                            });
                        }
                        Ok(other) => {
                            endpoint.close().await;
                            return Err(format!("{leader} is {other}, not a replica"));
                        }
                        Err(_) if tries < setup_dials_max => continue,
                        Err(e) => {
                            endpoint.close().await;
                            return Err(format!(
                                "host:{} dialling {leader} ({tries} tries): {e}",
                                start.machine
                            ));
                        }
                    }
                }
            });
        }
        for dialled in futures::future::join_all(dials).await {
            match dialled {
                Ok(h) => out.push(h),
                Err(why) => {
                    super::close_endpoints(out.iter().map(|h| &h.endpoint)).await;
                    return Err(ClientError::Unreachable {
                        context: context.path.display().to_string(),
                        tried: why,
                    }
                    .into());
                }
            }
        }
    }
    Ok(out)
}

/// What the hosts saw.
struct RunResult {
    lat_us: Vec<u32>,
    errors: BTreeMap<String, u64>,
    elapsed: Duration,
    sent: u64,
    changed: u64,
    interrupted: bool,
}

/// Runs every host's loop until the duration is over (or Ctrl-C) and its last report answered
/// (or [`drain_ms_max`] after the end).
async fn drive(
    context: &Context,
    hosts: Vec<SimHost>,
    spec: &ReportsSpec,
    leader: Leader,
) -> RunResult {
    let start = tokio::time::Instant::now();
    let started = Instant::now();
    let end = start + Duration::from_secs(spec.duration_s);
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let replicas: Arc<Vec<(u64, SocketAddr)>> = Arc::new(context.replicas.clone());
    let mut tasks = Vec::with_capacity(hosts.len());
    for h in hosts {
        let job = HostJob {
            spec: spec.clone(),
            leader: leader.clone(),
            replicas: replicas.clone(),
            stop: stop_rx.clone(),
            start,
            end,
        };
        tasks.push(tokio::spawn(job.run(h)));
    }
    let interrupted = tokio::select! {
        _ = tokio::signal::ctrl_c() => true,
        _ = tokio::time::sleep_until(end) => false,
    };
    let _ = stop_tx.send(true);
    let drain_until = end.max(tokio::time::Instant::now()) + Duration::from_millis(drain_ms_max);
    let mut result = RunResult {
        lat_us: Vec::new(),
        errors: BTreeMap::new(),
        elapsed: Duration::ZERO,
        sent: 0,
        changed: 0,
        interrupted,
    };
    let mut last = started;
    for t in tasks {
        let abort = t.abort_handle();
        match tokio::time::timeout_at(drain_until, t).await {
            Ok(Ok(done)) => {
                result.lat_us.extend(done.lat_us);
                for (k, v) in done.errors {
                    *result.errors.entry(k).or_default() += v;
                }
                result.sent += done.sent;
                result.changed += done.changed;
                last = last.max(done.last);
            }
            Ok(Err(e)) => *result.errors.entry(format!("host task: {e}")).or_default() += 1,
            Err(_) => {
                abort.abort();
                *result
                    .errors
                    .entry(format!("still in flight {drain_ms_max} ms after the run"))
                    .or_default() += 1;
                last = Instant::now();
            }
        }
    }
    result.elapsed = last.duration_since(started);
    result
}

/// One host's results.
struct HostDone {
    lat_us: Vec<u32>,
    errors: BTreeMap<String, u64>,
    last: Instant,
    sent: u64,
    changed: u64,
}

struct HostJob {
    spec: ReportsSpec,
    leader: Leader,
    replicas: Arc<Vec<(u64, SocketAddr)>>,
    stop: tokio::sync::watch::Receiver<bool>,
    start: tokio::time::Instant,
    end: tokio::time::Instant,
}

impl HostJob {
    /// Host `i` reports at `start + i / rate + k · period` for k = 0, 1, ...; a slot already past
    /// when the last report answered is skipped (a host does not burst to catch up), so a slow
    /// cluster shows as a lower rate.
    async fn run(mut self, h: SimHost) -> HostDone {
        let period = self.spec.period();
        let offset = Duration::from_secs_f64(f64::from(h.index) / f64::from(self.spec.rate));
        let mut done = HostDone {
            lat_us: Vec::new(),
            errors: BTreeMap::new(),
            last: Instant::now(),
            sent: 0,
            changed: 0,
        };
        let mut restarts = 0u32;
        let mut k = 0u64;
        loop {
            let at = self.start + offset + period.mul_f64(k as f64);
            if at >= self.end || *self.stop.borrow() {
                break;
            }
            tokio::select! {
                _ = tokio::time::sleep_until(at) => {}
                _ = self.stop.changed() => break,
            }
            if k > 0 && changes(h.index, k, self.spec.changing) {
                restarts = restarts.wrapping_add(1);
                done.changed += 1;
            }
            let report = h.start.report(k, self.spec.modules, restarts);
            let began = Instant::now();
            let outcome = self.file(&h, &report).await;
            done.last = Instant::now();
            done.sent += 1;
            match outcome {
                Ok(()) => {
                    let us = done.last.duration_since(began).as_micros();
                    done.lat_us.push(u32::try_from(us).unwrap_or(u32::MAX));
                }
                Err(what) => {
                    *done.errors.entry(error_kind(&what)).or_default() += 1;
                }
            }
            // The next slot not yet past.
            let now = tokio::time::Instant::now();
            k += 1;
            while self.start + offset + period.mul_f64(k as f64) < now {
                k += 1;
            }
        }
        h.endpoint.close().await;
        done
    }

    /// Sends one report to the leader, following `NotLeader` redirects, and says whether it was
    /// filed as accepted.
    async fn file(&self, h: &SimHost, report: &Report) -> Result<(), String> {
        let body = mesh_codec::encode(report_what, report).map_err(|e| e.to_string())?;
        let timeout = Duration::from_millis(report_timeout_ms);
        let mut redirects = 0;
        loop {
            let (id, addr) = *self
                .leader
                .read()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            let kind = MessageKind::Report {
                machine: report.machine.clone(),
            };
            let peer = Peer::expecting(addr, Principal::Replica(id));
            let answer = h
                .endpoint
                .request(peer, kind, body.clone(), timeout)
                .await
                .map_err(|e| format!("replica {id}: {e}"))?;
            let reply: ReportReply = mesh_codec::decode(report_reply_what, &answer)
                .map_err(|e| format!("replica {id} answered what is not a report reply: {e}"))?;
            match reply {
                ReportReply::Filed { accepted: true } => return Ok(()),
                ReportReply::Filed { accepted: false } => {
                    return Err("filed as not newer than the account's last report (G5)".into());
                }
                ReportReply::Refused { reason } => return Err(format!("refused: {reason}")),
                ReportReply::NotLeader { leader: None } => {
                    return Err("not the leader, and it knows no leader".into());
                }
                ReportReply::NotLeader {
                    leader: Some(named),
                } => {
                    if redirects >= redirects_max {
                        return Err(format!("more than {redirects_max} redirects"));
                    }
                    redirects += 1;
                    let to = self
                        .replicas
                        .iter()
                        .find(|(_, a)| a.to_string() == named)
                        .copied()
                        .ok_or_else(|| {
                            format!("redirected to {named}, which is not a replica of the context")
                        })?;
                    *self
                        .leader
                        .write()
                        .unwrap_or_else(std::sync::PoisonError::into_inner) = to;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timeouts_count_as_one_kind_whatever_time_was_left() {
        let a = error_kind("replica 1: 127.0.0.1:7001: no answer within 1999 ms");
        let b = error_kind("replica 1: 127.0.0.1:7001: no answer within 972 ms");
        assert_eq!(a, b);
        assert_eq!(a, "replica 1: 127.0.0.1:7001: no answer within 2000 ms");
        assert_eq!(error_kind("refused: why"), "refused: why");
    }

    #[test]
    fn changing_spreads_the_share_asked_for() {
        let n = (0..10_000u64).filter(|k| changes(7, *k, 30)).count();
        assert!((2_700..3_300).contains(&n), "{n}");
        assert!(!(0..1000u64).any(|k| changes(7, k, 0)));
        assert!((0..1000u64).all(|k| changes(7, k, 100)));
    }

    #[test]
    fn a_host_starts_above_its_accounts_last_report() {
        let view = MachineView {
            name: "bench-1".into(),
            last_report: Some((3, 9, 500, None)),
            ..MachineView::default()
        };
        let start = HostStart::of(&view, 100);
        assert_eq!(
            (start.epoch, start.sequence, start.report_sequence),
            (3, 9, 501)
        );
        assert_eq!(HostStart::of(&view, 1_000).report_sequence, 1_000);
        let r = start.report(2, 10, 4);
        assert_eq!(r.report_sequence, 503);
        assert_eq!(r.modules.len(), 10);
        assert_eq!(r.modules[0].restarts, 4);
    }

    #[test]
    fn the_verdict_fails_at_a_p99_of_100_ms_or_more() {
        let spec = ReportsSpec {
            hosts: 100,
            rate: 100,
            duration_s: 10,
            modules: 1,
            changing: 0,
            dir: None,
        };
        let fast = figures(vec![5_000; 1000], BTreeMap::new(), Duration::from_secs(10));
        assert!(verdict(&fast, &spec).1, "{fast:?}");
        let slow = figures(
            vec![100_000; 1000],
            BTreeMap::new(),
            Duration::from_secs(10),
        );
        assert!(!verdict(&slow, &spec).1, "{slow:?}");
    }
}
