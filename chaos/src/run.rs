//! One seeded chaos run over the real controller: start the cluster (`bed.rs`), apply a model and
//! push it everywhere, then let the operators (`workload.rs`) work while the nemesis plays its
//! schedule; heal, restart whatever is down, push until every machine applied its should-be,
//! stop the hosts, read the store, and check the history (`checkers.rs`).

use std::collections::BTreeMap;
use std::fmt;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use mesh::controller::api::{Answer, Body, PushTarget, Request};
use mesh::core::envelope::Position;
use mesh::core::settings::Scope;
use mesh::store::app::MeshApp;
use tokio::sync::{RwLock, watch};

use crate::bed::{BedError, Cluster, machines, replicas_n};
use crate::checkers::{Final, Violation, check_run, checker_names};
use crate::history::{Event, History, Op, Recorder};
use crate::nemesis::{Fault, Mix, Schedule, play};
use crate::observe::Observed;
use crate::workload::{Tally, ask_recorded, model, operate};

/// How long the cluster may take to elect its first leader and take the first push.
pub const setup_wait_ms: u64 = 60_000;
/// How long the healed cluster may take to bring every machine to its should-be.
pub const converge_wait_ms: u64 = 60_000;
/// How long the reports of a converging push may take before the next push.
pub const settle_ms: u64 = 2_000;
/// How long the operators may take to notice the stop.
pub const operators_stop_wait_ms: u64 = 15_000;
/// How long every replica may take to apply what the leader committed, at the end.
pub const catch_up_wait_ms: u64 = 10_000;
/// How often the account sampler reads every replica's accounts.
pub const sample_every_ms: u64 = 40;
/// Set, every run writes its history to `$TMPDIR/mesh-chaos-<mix>-seed-<n>.history`, not only a failed one.
pub const keep_history_env: &str = "CHAOS_KEEP_HISTORY";
/// Violations shown in full (with the events around them) in a failure message.
pub const violations_shown_max: usize = 8;
/// How often the memory sampler reads the process's resident memory.
pub const memory_every_ms: u64 = 25;
/// A new high of resident memory is recorded once it is this much above the last one recorded.
pub const memory_step_bytes: u64 = 4 * 1024 * 1024;

/// What to run.
#[derive(Clone, Debug)]
pub struct RunSpec {
    pub seed: u64,
    pub mix: Mix,
    /// How long the nemesis plays, about.
    pub chaos_ms: u64,
}

impl RunSpec {
    /// A run of `mix` with about 2.5 s of faults.
    pub fn new(seed: u64, mix: Mix) -> Self {
        Self {
            seed,
            mix,
            chaos_ms: 2_500,
        }
    }

    /// The command that replays this run.
    pub fn replay(&self) -> String {
        format!(
            "cargo run --release -p mesh-chaos -- --runs 1 --mix {} --seed {} --chaos-ms {}",
            self.mix, self.seed, self.chaos_ms
        )
    }
}

/// Why a run could not be carried out (distinct from a violation).
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error(transparent)]
    Bed(#[from] BedError),
    #[error("chaos run: {0}")]
    Stuck(String),
}

/// What a run did.
#[derive(Clone, Debug, Default)]
pub struct Stats {
    pub faults: BTreeMap<Fault, u64>,
    pub ops: Tally,
    pub leases: u64,
    pub writes: u64,
    pub applies: u64,
    pub reports: u64,
    pub restarts: u64,
    pub events: usize,
    /// The most resident memory the process held during the run, in bytes.
    pub rss_peak: u64,
    /// Wall time of each phase of the run, in order: (phase, ms).
    pub phases: Vec<(&'static str, u64)>,
}

/// Times the phases of a run, one after the other.
struct Phases {
    at: std::time::Instant,
    done: Vec<(&'static str, u64)>,
}

impl Phases {
    fn new() -> Self {
        Self {
            at: std::time::Instant::now(),
            done: Vec::new(),
        }
    }

    /// Ends the phase that ran since the last call, as `name`.
    fn end(&mut self, name: &'static str) {
        let now = std::time::Instant::now();
        let ms = u64::try_from(now.duration_since(self.at).as_millis()).unwrap_or(u64::MAX);
        self.done.push((name, ms));
        self.at = now;
    }
}

impl fmt::Display for Stats {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let faults: Vec<String> = self
            .faults
            .iter()
            .map(|(k, n)| format!("{k}×{n}"))
            .collect();
        let phases: Vec<String> = self
            .phases
            .iter()
            .map(|(p, ms)| format!("{p} {ms}"))
            .collect();
        write!(
            f,
            "phases ms [{}]; faults [{}]; requests {} (acked {}, refused {}, unknown {}; reads {}, answered {}); leases {}, envelope writes {}, host applies {}, reports {}, restarts {}; {} events; resident memory at most {} MiB",
            phases.join(", "),
            faults.join(" "),
            self.ops.requests,
            self.ops.acked,
            self.ops.refused,
            self.ops.unknown,
            self.ops.reads,
            self.ops.reads_answered,
            self.leases,
            self.writes,
            self.applies,
            self.reports,
            self.restarts,
            self.events,
            self.rss_peak / (1024 * 1024)
        )
    }
}

/// A finished run: its stats and what the checkers found.
#[derive(Debug)]
pub struct Outcome {
    pub spec: RunSpec,
    pub stats: Stats,
    pub checks: usize,
    pub violations: Vec<Violation>,
    /// Keys whose linearizability search hit its limit: neither passed nor failed.
    pub undecided: Vec<String>,
    /// Where the full history was written, when there were violations.
    pub history_file: Option<PathBuf>,
    /// The violations with the events around them, for a failure message.
    pub report: String,
}

/// Carries out one run.
pub async fn run(spec: RunSpec) -> Result<Outcome, RunError> {
    let recorder = Recorder::new();
    let observed = Observed::begin(&recorder).await.map_err(RunError::Stuck)?;
    let mut phases = Phases::new();
    let cluster = Cluster::start(recorder.clone()).await?;
    phases.end("start");
    let cluster = Arc::new(RwLock::new(cluster));
    let result = drive(&spec, &cluster, &recorder, &mut phases).await;
    if let Ok(lock) = Arc::try_unwrap(cluster) {
        lock.into_inner().shutdown().await;
    }
    phases.end("teardown");
    drop(observed);
    let (mut stats, last) = match result {
        Ok(done) => done,
        // A stuck run's history is the only way to see why: written, and named in the error.
        Err(RunError::Stuck(why)) => {
            let path = std::env::temp_dir().join(format!(
                "mesh-chaos-{}-seed-{}.history",
                spec.mix, spec.seed
            ));
            let written = std::fs::write(&path, recorder.snapshot().to_string()).is_ok();
            return Err(RunError::Stuck(if written {
                format!("{why}; history: {}", path.display())
            } else {
                why
            }));
        }
        Err(e) => return Err(e),
    };
    stats.phases = phases.done;
    let history = recorder.snapshot_until(last.1);
    let checked = check_run(&history, &last.0);
    let (violations, undecided) = (checked.violations, checked.undecided);
    count(&history, &mut stats);
    let keep = std::env::var_os(keep_history_env).is_some();
    let (history_file, report) = if violations.is_empty() && undecided.is_empty() && !keep {
        (None, String::new())
    } else {
        explain(&spec, &history, &violations)
    };
    Ok(Outcome {
        spec,
        stats,
        checks: checker_names.len(),
        violations,
        undecided,
        history_file,
        report,
    })
}

fn count(history: &History, stats: &mut Stats) {
    for (_, e) in history.ticked() {
        match e {
            Event::LeaseGranted { .. } => stats.leases += 1,
            Event::WriteAllowed { .. } => stats.writes += 1,
            Event::HostApplied { .. } => stats.applies += 1,
            Event::ReportDelivered { .. } => stats.reports += 1,
            Event::Restart { up: true, .. } => stats.restarts += 1,
            Event::Memory { rss_bytes } => stats.rss_peak = stats.rss_peak.max(*rss_bytes),
            _ => {}
        }
    }
    stats.events = history.events.len();
}

fn explain(
    spec: &RunSpec,
    history: &History,
    violations: &[Violation],
) -> (Option<PathBuf>, String) {
    let path = std::env::temp_dir().join(format!(
        "mesh-chaos-{}-seed-{}.history",
        spec.mix, spec.seed
    ));
    let written = std::fs::write(&path, history.to_string()).is_ok();
    let mut report = format!(
        "{} violations in run {} seed {}; replay: {}\n",
        violations.len(),
        spec.mix,
        spec.seed,
        spec.replay()
    );
    for v in violations.iter().take(violations_shown_max) {
        report.push_str(&format!("- {v}\n"));
        if let Some(t) = v.tick {
            report.push_str(&history.around(t, 6));
        }
    }
    if written {
        report.push_str(&format!("full history: {}\n", path.display()));
    }
    (written.then_some(path), report)
}

type Last = (Final, u64);

async fn drive(
    spec: &RunSpec,
    cluster: &Arc<RwLock<Cluster>>,
    recorder: &Recorder,
    phases: &mut Phases,
) -> Result<(Stats, Last), RunError> {
    let memory = tokio::spawn(sample_memory(recorder.clone()));
    let result = drive_sampled(spec, cluster, recorder, phases).await;
    memory.abort();
    result
}

async fn drive_sampled(
    spec: &RunSpec,
    cluster: &Arc<RwLock<Cluster>>,
    recorder: &Recorder,
    phases: &mut Phases,
) -> Result<(Stats, Last), RunError> {
    setup(cluster).await?;
    phases.end("first push");
    let (stop_tx, stop_rx) = watch::channel(false);
    let sampler = tokio::spawn(sample_accounts(cluster.clone(), stop_rx.clone()));
    let operators = tokio::spawn(operate(cluster.clone(), spec.seed, stop_rx.clone()));
    let schedule = Schedule::generate(spec.seed, spec.mix, spec.chaos_ms);
    let played = play(cluster, &schedule).await;
    phases.end("faults");
    let _ = stop_tx.send(true);
    let ops = tokio::time::timeout(Duration::from_millis(operators_stop_wait_ms), operators)
        .await
        .map_err(|_| RunError::Stuck("the operators did not stop".into()))?
        .unwrap_or_default();
    phases.end("operators stop");
    heal(cluster).await;
    phases.end("heal");
    let not_converged = converge(cluster).await;
    phases.end("converge");
    {
        let names: Vec<String> = machines.iter().map(|m| m.to_string()).collect();
        cluster.write().await.stop_hosts(&names).await;
    }
    phases.end("hosts stop");
    // Every report that will ever be filed was delivered: the history ends here.
    let end = recorder.now();
    let last = read_final(cluster, not_converged).await?;
    let _ = sampler.await;
    phases.end("final read");
    let mut stats = Stats {
        ops,
        ..Stats::default()
    };
    for f in played {
        *stats.faults.entry(f).or_default() += 1;
    }
    Ok((stats, (last, end)))
}

/// A leader, the first model and a push of it everywhere.
async fn setup(cluster: &Arc<RwLock<Cluster>>) -> Result<(), RunError> {
    let deadline = tokio::time::Instant::now() + Duration::from_millis(setup_wait_ms);
    let mut applied = false;
    loop {
        if tokio::time::Instant::now() >= deadline {
            return Err(RunError::Stuck(format!(
                "no leader applied and pushed the first model within {setup_wait_ms} ms"
            )));
        }
        let leader = cluster.read().await.leader();
        let Some((leader, _)) = leader else {
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        };
        if !applied {
            let request = Request::Apply {
                mesh: model(0, &mut crate::rng::Rng::new(0, 0)),
                why: "chaos apply 0".into(),
                drain: false,
            };
            let answer = ask_recorded(cluster, leader, Op::Apply { tag: 0 }, request).await;
            applied = matches!(answer, crate::history::Answered::Ok { .. });
            continue;
        }
        if push_all(cluster, leader, "chaos push setup").await {
            // The older backup `restore-old-backup` restores (a few ms: the store is small).
            let mut c = cluster.write().await;
            let file = c.save_snapshot(leader, "setup.snapshot").await?;
            c.backups.push(file);
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// `push --all` (with `--move cache` when a hold stops it); true when every line applied.
async fn push_all(cluster: &Arc<RwLock<Cluster>>, via: u64, why: &str) -> bool {
    for moves in [vec![], vec!["cache".to_string()]] {
        let why = format!("{why} {}", cluster.read().await.recorder.next_op());
        let op = Op::Push {
            why: why.clone(),
            target: "--all".into(),
            moves: moves.clone(),
        };
        let request = Request::Push {
            target: PushTarget::All,
            why,
            moves,
            plan: None,
        };
        let recorder = cluster.read().await.recorder.clone();
        let before = recorder.now();
        ask_recorded(cluster, via, op, request).await;
        // The answer as recorded: look at the lines again through the history.
        let history = recorder.snapshot();
        let lines = history.events[before as usize..]
            .iter()
            .rev()
            .find_map(|e| match e {
                Event::Done {
                    answer: crate::history::Answered::Ok { lines },
                    ..
                } => Some(lines.clone()),
                _ => None,
            });
        match lines {
            Some(lines) if lines.iter().all(|(_, sent)| sent.is_some()) => return true,
            Some(_) => continue,
            None => return false,
        }
    }
    false
}

/// Heals every link and restarts whatever is down.
async fn heal(cluster: &Arc<RwLock<Cluster>>) {
    let mut c = cluster.write().await;
    c.heal_all();
    for id in 1..=replicas_n {
        if let Err(e) = c.restart_replica(id).await {
            c.recorder.record(Event::Note {
                what: format!("RESTART FAILED after heal: {e}"),
            });
        }
    }
    for m in machines {
        if let Err(e) = c.restart_host(m).await {
            c.recorder.record(Event::Note {
                what: format!("RESTART FAILED after heal: {e}"),
            });
        }
    }
    c.recorder.record(Event::Note {
        what: "healed: every link mended, every replica and host up".into(),
    });
}

/// Pushes until every machine applied its should-be (status: not behind, and the host's mark at
/// the last send); returns the machines that did not, with why. After a push it lets the hosts'
/// reports come in ([`settle_ms`]) before pushing again: a push while the last one's reports are
/// on their way would make the machines unconfirmed again.
async fn converge(cluster: &Arc<RwLock<Cluster>>) -> Vec<String> {
    let deadline = tokio::time::Instant::now() + Duration::from_millis(converge_wait_ms);
    let mut why_not = vec!["no leader after the heal".to_string()];
    let mut pushed: Option<tokio::time::Instant> = None;
    while tokio::time::Instant::now() < deadline {
        let leader = cluster.read().await.leader();
        let Some((leader, _)) = leader else {
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        };
        why_not = behind(cluster, leader).await;
        if why_not.is_empty() {
            return why_not;
        }
        if pushed.is_none_or(|at| at.elapsed() >= Duration::from_millis(settle_ms)) {
            push_all(cluster, leader, "chaos push converge").await;
            pushed = Some(tokio::time::Instant::now());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    why_not
}

async fn behind(cluster: &Arc<RwLock<Cluster>>, leader: u64) -> Vec<String> {
    let c = cluster.read().await;
    let status = match Cluster::call(Request::Status) {
        Ok(call) => c.ask(leader, &call).await,
        Err(e) => Err(e),
    };
    let view = match status {
        Ok(Answer {
            body: Ok(Body::Status(view)),
            ..
        }) => view,
        other => return vec![format!("status from replica {leader} failed: {other:?}")],
    };
    let mut out = Vec::new();
    for m in &view.machines {
        if m.behind {
            out.push(format!(
                "{} still behind: {}",
                m.name,
                m.behind_why.join(", ")
            ));
            continue;
        }
        let mark = match c.hosts.get(&m.name).and_then(|h| h.agent()) {
            Some(agent) => agent.high_water().await,
            None => None,
        };
        let sent = m.last_send.as_ref().map(|(e, s, _)| Position {
            epoch: *e,
            sequence: *s,
        });
        if mark != sent {
            out.push(format!(
                "{}'s host is at {mark:?} but its last send is {sent:?}",
                m.name
            ));
        }
    }
    out
}

/// Reads the store at the end from the leader, once every replica applied what it committed.
async fn read_final(
    cluster: &Arc<RwLock<Cluster>>,
    not_converged: Vec<String>,
) -> Result<Final, RunError> {
    let c = cluster.read().await;
    let deadline = tokio::time::Instant::now() + Duration::from_millis(catch_up_wait_ms);
    let leader = loop {
        let applied: Vec<_> = c
            .replicas
            .values()
            .map(|r| r.service().replica().metrics().borrow().last_applied)
            .collect();
        if let Some((leader, _)) = c.leader()
            && applied.windows(2).all(|w| w[0] == w[1])
            && applied.len() == replicas_n as usize
        {
            break leader;
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(RunError::Stuck(format!(
                "the replicas did not agree on what they applied within {catch_up_wait_ms} ms: {applied:?}"
            )));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let service = c.replicas[&leader].service();
    let state = service
        .app()
        .state()
        .map_err(|e| RunError::Stuck(format!("cannot read the state: {e}")))?;
    let sends = MeshApp::sends(service.replica().database(), None)
        .map_err(|e| RunError::Stuck(format!("cannot read the sends table: {e}")))?;
    // Every replica applied the same index: each must hold the same state and sends (a store
    // rebuilt from a snapshot, restored or restarted included).
    let mut disagree = Vec::new();
    for (id, r) in &c.replicas {
        if *id == leader {
            continue;
        }
        match replica_differs(&state, &sends, r.service()) {
            Ok(fields) if fields.is_empty() => {}
            Ok(fields) => disagree.push(format!(
                "replica {id} differs from the leader {leader} at the same applied index in {}",
                fields.join(", ")
            )),
            Err(e) => disagree.push(format!("replica {id}'s {e}")),
        }
    }
    let settings = state
        .mesh
        .settings
        .layers
        .get(&Scope::Module("db".into()))
        .cloned()
        .unwrap_or_default();
    let apply_tag = state
        .mesh
        .modules
        .get("worker")
        .and_then(|w| w.env.get("CHAOS_APPLY"))
        .and_then(|t| t.parse().ok());
    let model_whys = MeshApp::model_history(service.replica().database())
        .map_err(|e| RunError::Stuck(format!("cannot read the model history: {e}")))?
        .into_iter()
        .map(|m| (m.revision, m.why))
        .collect();
    let accounts = state
        .accounts
        .iter()
        .map(|(m, a)| (m.clone(), (a.last, a.refused_older)))
        .collect();
    Ok(Final {
        sends,
        settings,
        apply_tag,
        model_whys,
        revision: state.revision,
        accounts,
        not_converged,
        disagree,
    })
}

/// The fields in which two replicas' domain states differ, by name.
/// What of `theirs`' state and sends differs from the leader's `state` and `sends` (the
/// comparison of "replicas agree at the end", shared with the simulator's); `Err` names what
/// of theirs could not be read.
pub(crate) fn replica_differs(
    state: &mesh::store::state::DomainState,
    sends: &[mesh::store::command::SendRecord],
    theirs: &mesh::controller::Service,
) -> Result<Vec<&'static str>, String> {
    let their_state = theirs
        .app()
        .state()
        .map_err(|e| format!("state cannot be read: {e}"))?;
    let their_sends = MeshApp::sends(theirs.replica().database(), None)
        .map_err(|e| format!("sends cannot be read: {e}"))?;
    let mut fields = state_differs(state, &their_state);
    if their_sends != sends {
        fields.push("the sends table");
    }
    Ok(fields)
}

fn state_differs(
    a: &mesh::store::state::DomainState,
    b: &mesh::store::state::DomainState,
) -> Vec<&'static str> {
    let mut out = Vec::new();
    let mut field = |name, same: bool| {
        if !same {
            out.push(name);
        }
    };
    field("revision", a.revision == b.revision);
    field("the model", a.mesh == b.mesh);
    field("provisions", a.provisions == b.provisions);
    field("last sends", a.last_sends == b.last_sends);
    field("accounts", a.accounts == b.accounts);
    field("holds", a.holds == b.holds);
    field("the epoch floor", a.epoch_floor == b.epoch_floor);
    field("the history id", a.next_history_id == b.next_history_id);
    field(
        "remembered requests",
        a.requests == b.requests && a.request_order == b.request_order,
    );
    field("the deny list", a.revoked == b.revoked);
    field("uploads", a.uploads == b.uploads);
    field("signers", a.signers == b.signers);
    if out.is_empty() && a != b {
        out.push("the state");
    }
    out
}

/// Records every replica's accounts whenever they change, until `stop`.
async fn sample_accounts(cluster: Arc<RwLock<Cluster>>, stop: watch::Receiver<bool>) {
    let mut last: BTreeMap<(u64, String), (Option<mesh::core::report::ReportPosition>, u64)> =
        BTreeMap::new();
    loop {
        {
            let c = cluster.read().await;
            for (id, r) in &c.replicas {
                let Ok(state) = r.service().app().state() else {
                    continue;
                };
                for (m, a) in &state.accounts {
                    let now = (a.last, a.refused_older);
                    let key = (*id, m.clone());
                    if last.get(&key) != Some(&now) {
                        c.recorder.record(Event::AccountSeen {
                            replica: *id,
                            machine: m.clone(),
                            last: a.last,
                            refused_older: a.refused_older,
                        });
                        last.insert(key, now);
                    }
                }
            }
        }
        // The sampler runs until the final read: it stops with the run's stop *and* the hosts'.
        if *stop.borrow()
            && cluster
                .read()
                .await
                .hosts
                .values()
                .all(|h| h.agent().is_none())
        {
            return;
        }
        tokio::time::sleep(Duration::from_millis(sample_every_ms)).await;
    }
}

/// `true` when `outcome` found nothing; the failure message otherwise.
pub fn verdict(outcome: &Outcome) -> Result<(), String> {
    if outcome.violations.is_empty() {
        Ok(())
    } else {
        Err(outcome.report.clone())
    }
}

/// Runs seeds `first..first + runs` of `mix`, in order.
pub async fn runs(
    mix: Mix,
    first: u64,
    runs: u64,
    chaos_ms: u64,
) -> Vec<Result<Outcome, (RunSpec, RunError)>> {
    let mut out = Vec::new();
    for seed in first..first.saturating_add(runs) {
        let spec = RunSpec {
            seed,
            mix,
            chaos_ms,
        };
        out.push(run(spec.clone()).await.map_err(|e| (spec, e)));
    }
    out
}

/// The process's resident memory (`VmRSS` in `/proc/self/status`), in bytes; `None` where there is
/// no such file (not Linux).
pub fn resident_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kib: u64 = line
        .trim_start_matches("VmRSS:")
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()?;
    Some(kib * 1024)
}

/// Records the process's resident memory at every new high (by [`memory_step_bytes`] or more),
/// read every [`memory_every_ms`], until aborted.
async fn sample_memory(recorder: Recorder) {
    let mut recorded = 0;
    loop {
        if let Some(rss) = resident_bytes()
            && rss >= recorded + memory_step_bytes
        {
            recorder.record(Event::Memory { rss_bytes: rss });
            recorded = rss;
        }
        tokio::time::sleep(Duration::from_millis(memory_every_ms)).await;
    }
}
