//! A seeded chaos run: three replicas (KvApp) over the fault router, clients proposing writes, one
//! leader actor per replica sending signed envelopes to simulated hosts only inside its lease, and
//! the nemesis. At the end: heal, wait for progress and convergence, read every replica, check the
//! history. A failing run says its seed; `CHAOS_SEED=<n>` replays that seed's schedule and workload.

use std::collections::BTreeMap;
use std::fmt;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use ed25519_dalek::{SigningKey, VerifyingKey};
use openraft::ServerState;
use redb::ReadableDatabase;
use tokio::sync::watch;
use tokio::task::JoinSet;

use mesh_raft::kv::{self, KvApp};
use mesh_raft::router::Router;
use mesh_raft::{NodeId, RaftConfig, RaftSettings, Replica, ReplicaSpec};

use crate::actors::{Client, LeaderActor, Pause, SharedReplica};
use crate::checkers::{Violation, check_all};
use crate::history::{Event, History, Recorder};
use crate::nemesis::{Mix, Schedule, Target};
use crate::rng::Rng;
use crate::sim::Machines;

/// The environment variable that replaces a run's seed.
pub const seed_env: &str = "CHAOS_SEED";
/// Replicas in a run's cluster.
pub const replicas_n: u64 = 3;
/// How long the cluster may take to get its first lease, and the healed cluster to ack a write and
/// apply an envelope on every machine.
pub const progress_wait_ms: u64 = 20_000;
/// How long the healed cluster may take to apply everything on every replica.
pub const converge_wait_ms: u64 = 20_000;
/// How long delayed envelopes and reports may take to arrive after the run stopped.
pub const settle_wait_ms: u64 = 5_000;
/// How long clients and actors may take to notice the stop.
pub const tasks_stop_wait_ms: u64 = 10_000;
/// Interval of the hosts' reconcile reports.
pub const reconcile_every_ms: u64 = 50;
/// Violations shown in full (with the events around them) in a failure message.
pub const violations_shown_max: usize = 12;
/// Events printed from the end of the history in a failure message.
pub const tail_events_max: usize = 120;

/// What to run.
#[derive(Clone, Debug)]
pub struct RunSpec {
    pub seed: u64,
    pub mix: Mix,
    pub clients: u32,
    /// Keys the clients share; few, so writes to one key interleave.
    pub keys: u32,
    pub machines: Vec<String>,
    /// How long the nemesis plays.
    pub chaos_ms: u64,
}

impl RunSpec {
    /// A short run: 3 clients on 4 keys, 2 machines, 3 s of faults. The seed is replaced by
    /// `CHAOS_SEED` when that is set.
    pub fn new(seed: u64, mix: Mix) -> Self {
        Self {
            seed,
            mix,
            clients: 3,
            keys: 4,
            machines: vec!["ace".to_string(), "g14".to_string()],
            chaos_ms: 3_000,
        }
    }
}

/// Raft timings for a run: elections in a few hundred milliseconds, snapshots often, so faults
/// meet elections, leases closing and snapshot catch-up within seconds.
pub fn settings() -> RaftSettings {
    RaftSettings {
        heartbeat_ms: 40,
        election_timeout_min_ms: 300,
        election_timeout_max_ms: 600,
        lease_margin_ms: 60,
        propose_timeout_ms: 1_500,
        snapshot_logs_since_last: 300,
        logs_kept_after_snapshot: 50,
        shutdown_timeout_ms: 5_000,
        ..RaftSettings::default()
    }
}

/// Why a run failed: it could not be set up, it got stuck, or the checkers found violations.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error("{seed_env} is {value:?}, not a number; set it to the seed a failed run printed")]
    BadSeed { value: String },
    #[error("setting up the run failed: {0}")]
    Setup(String),
    #[error("the healed cluster made no progress: {0}")]
    Stuck(String),
    #[error("{} guarantee violations", .0.len())]
    Violations(Vec<Violation>),
}

/// A failed run: its seed, what went wrong and the history, printed for a human.
#[derive(Debug)]
pub struct RunFailure {
    pub seed: u64,
    pub error: RunError,
    pub history: History,
    /// Where the full history was written, if it could be.
    pub history_file: Option<PathBuf>,
}

impl fmt::Display for RunFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "chaos run with seed {} FAILED: {}",
            self.seed, self.error
        )?;
        writeln!(
            f,
            "replay: {seed_env}={} cargo test -p mesh-chaos",
            self.seed
        )?;
        if let RunError::Violations(found) = &self.error {
            for v in found.iter().take(violations_shown_max) {
                writeln!(f, "\n{v}")?;
                if let Some(at) = v.at {
                    write!(f, "{}", self.history.around(at, 8))?;
                }
            }
            if found.len() > violations_shown_max {
                writeln!(f, "\n... and {} more", found.len() - violations_shown_max)?;
            }
        }
        let events = &self.history.events;
        let from = events.len().saturating_sub(tail_events_max);
        writeln!(
            f,
            "\nlast {} of {} events:",
            events.len() - from,
            events.len()
        )?;
        for (i, e) in events.iter().enumerate().skip(from) {
            writeln!(f, "#{i:06} {e}")?;
        }
        match &self.history_file {
            Some(path) => writeln!(f, "full history: {}", path.display()),
            None => writeln!(f, "full history could not be written"),
        }
    }
}

/// What a run did, counted from its history.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    pub writes_acked: u64,
    pub writes_unknown: u64,
    pub leases: u64,
    pub envelopes_sent: u64,
    pub sends_abandoned: u64,
    pub envelopes_applied: u64,
    pub envelopes_refused: u64,
    pub reports_filed: u64,
    pub reports_refused: u64,
    pub nemesis_steps: u64,
}

impl Stats {
    fn of(history: &History) -> Self {
        let mut s = Self::default();
        for e in &history.events {
            match e {
                Event::WriteAcked { .. } => s.writes_acked += 1,
                Event::WriteUnknown { .. } => s.writes_unknown += 1,
                Event::LeaseAcquired { .. } => s.leases += 1,
                Event::EnvelopeSent { .. } => s.envelopes_sent += 1,
                Event::SendAbandoned { .. } => s.sends_abandoned += 1,
                Event::EnvelopeApplied { .. } => s.envelopes_applied += 1,
                Event::EnvelopeRefused { .. } => s.envelopes_refused += 1,
                Event::ReportFiled { accepted: true, .. } => s.reports_filed += 1,
                Event::ReportFiled {
                    accepted: false, ..
                } => s.reports_refused += 1,
                Event::Nemesis { .. } => s.nemesis_steps += 1,
                _ => {}
            }
        }
        s.nemesis_steps /= 2;
        s
    }
}

impl fmt::Display for Stats {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "writes acked {} unknown {}; leases {}; envelopes sent {} abandoned {} applied {} refused {}; reports filed {} refused {}; nemesis steps {}",
            self.writes_acked,
            self.writes_unknown,
            self.leases,
            self.envelopes_sent,
            self.sends_abandoned,
            self.envelopes_applied,
            self.envelopes_refused,
            self.reports_filed,
            self.reports_refused,
            self.nemesis_steps
        )
    }
}

/// A run that passed.
#[derive(Debug)]
pub struct Outcome {
    pub seed: u64,
    pub schedule: Schedule,
    pub history: History,
    pub stats: Stats,
}

/// The seed to run: `CHAOS_SEED` if set, else `default`.
pub fn seed_or(default: u64) -> Result<u64, RunError> {
    match std::env::var(seed_env) {
        Err(_) => Ok(default),
        Ok(value) => value
            .trim()
            .parse()
            .map_err(|_| RunError::BadSeed { value }),
    }
}

/// Runs `spec`; panics with the seed, the violations and the history if the run fails.
pub async fn run(spec: RunSpec) -> Outcome {
    match try_run(spec).await {
        Ok(outcome) => outcome,
        Err(failure) => panic!("{failure}"),
    }
}

/// Runs `spec` and checks its history.
pub async fn try_run(mut spec: RunSpec) -> Result<Outcome, Box<RunFailure>> {
    let history = Recorder::new();
    let failed = |seed, error, history: &Recorder| {
        let history = history.snapshot();
        let history_file = write_history(seed, &history);
        Box::new(RunFailure {
            seed,
            error,
            history,
            history_file,
        })
    };
    spec.seed = seed_or(spec.seed).map_err(|e| failed(spec.seed, e, &history))?;
    let seed = spec.seed;
    tracing::info!(seed, mix = ?spec.mix, "chaos run");
    let schedule = Schedule::generate(seed, spec.mix, spec.chaos_ms);
    let result = drive(&spec, &schedule, &history).await;
    let snapshot = history.snapshot();
    let error = match result {
        Err(e) => e,
        Ok(()) => {
            let found = check_all(&snapshot);
            if found.is_empty() {
                let stats = Stats::of(&snapshot);
                return Ok(Outcome {
                    seed,
                    schedule,
                    history: snapshot,
                    stats,
                });
            }
            RunError::Violations(found)
        }
    };
    Err(failed(seed, error, &history))
}

/// Everything a run keeps running.
struct Cluster {
    _root: tempfile::TempDir,
    router: Router,
    replicas: BTreeMap<NodeId, SharedReplica>,
    keys: BTreeMap<NodeId, SigningKey>,
}

async fn start_cluster(seed: u64) -> Result<Cluster, RunError> {
    let root = tempfile::tempdir().map_err(|e| RunError::Setup(format!("temp dir: {e}")))?;
    let config: RaftConfig = settings()
        .validate()
        .map_err(|e| RunError::Setup(e.to_string()))?;
    let router = Router::new(seed);
    let nodes: BTreeMap<NodeId, mesh_raft::BasicNode> = (1..=replicas_n)
        .map(|id| (id, mesh_raft::BasicNode::new(format!("replica-{id}"))))
        .collect();
    let mut replicas = BTreeMap::new();
    let mut keys = BTreeMap::new();
    for id in 1..=replicas_n {
        let spec = ReplicaSpec {
            id,
            dir: root.path().join(format!("replica-{id}")),
            config: config.clone(),
            term_floor: 0,
            bootstrap: Some(nodes.clone()),
        };
        let replica = Replica::start(spec, router.network(id), Arc::new(KvApp))
            .await
            .map_err(|e| RunError::Setup(format!("replica {id}: {e}")))?;
        router.add(id, replica.raft().clone());
        replicas.insert(id, Arc::new(replica));
        keys.insert(id, signing_key(seed, id));
    }
    Ok(Cluster {
        _root: root,
        router,
        replicas,
        keys,
    })
}

/// One ed25519 key per replica, derived from the seed so a replay signs the same bytes.
fn signing_key(seed: u64, id: NodeId) -> SigningKey {
    let mut rng = Rng::new(seed, 0x5167_0000 + id);
    let mut bytes = [0u8; 32];
    for chunk in bytes.chunks_mut(8) {
        chunk.copy_from_slice(&rng.next_u64().to_le_bytes());
    }
    SigningKey::from_bytes(&bytes)
}

async fn drive(spec: &RunSpec, schedule: &Schedule, history: &Recorder) -> Result<(), RunError> {
    let cluster = start_cluster(spec.seed).await?;
    let trusted: BTreeMap<u64, VerifyingKey> = cluster
        .keys
        .iter()
        .map(|(id, k)| (*id, k.verifying_key()))
        .collect();
    let machines = Machines::new(&spec.machines, &trusted, spec.seed, history.clone());
    let pauses: BTreeMap<NodeId, Pause> = cluster
        .replicas
        .keys()
        .map(|id| (*id, Pause::default()))
        .collect();
    let (stop, stopped) = watch::channel(false);
    let mut tasks = spawn_tasks(spec, &cluster, &machines, &pauses, history, &stopped);
    let first = history
        .wait_for(0, Duration::from_millis(progress_wait_ms), |e| {
            matches!(e, Event::LeaseAcquired { .. })
        })
        .await;
    if !first {
        return Err(RunError::Stuck(format!(
            "no replica got a lease within {progress_wait_ms} ms of the start"
        )));
    }
    let target = Target {
        router: &cluster.router,
        machines: &machines,
        replicas: &cluster.replicas,
        pauses: &pauses,
        history,
    };
    target.play(schedule).await;
    heal(&cluster, &machines, &pauses, history);
    let progress = wait_progress(spec, history).await;
    stop.send_replace(true);
    stop_tasks(&mut tasks, history).await;
    progress?;
    machines.reconcile();
    if !machines.settle(Duration::from_millis(settle_wait_ms)).await {
        return Err(RunError::Stuck(format!(
            "envelopes or reports still in flight after {settle_wait_ms} ms"
        )));
    }
    converge(&cluster.replicas).await?;
    read_finals(spec, &cluster.replicas, history)?;
    shutdown(cluster, history).await;
    Ok(())
}

fn spawn_tasks(
    spec: &RunSpec,
    cluster: &Cluster,
    machines: &Machines,
    pauses: &BTreeMap<NodeId, Pause>,
    history: &Recorder,
    stopped: &watch::Receiver<bool>,
) -> JoinSet<()> {
    let mut tasks = JoinSet::new();
    let keys: Vec<String> = (0..spec.keys).map(|k| format!("key-{k}")).collect();
    for id in 0..spec.clients {
        let client = Client {
            id,
            replicas: cluster.replicas.clone(),
            keys: keys.clone(),
            rng: Rng::new(spec.seed, 0xc11e_0000 + u64::from(id)),
            history: history.clone(),
            stop: stopped.clone(),
        };
        tasks.spawn(client.run());
    }
    for (id, replica) in &cluster.replicas {
        let actor = LeaderActor {
            replica: replica.clone(),
            key: cluster.keys[id].clone(),
            machines: spec.machines.clone(),
            net: machines.clone(),
            history: history.clone(),
            pause: pauses[id].clone(),
            stop: stopped.clone(),
        };
        tasks.spawn(actor.run());
    }
    tasks.spawn(reconcile_until_stopped(machines.clone(), stopped.clone()));
    tasks
}

async fn reconcile_until_stopped(machines: Machines, mut stop: watch::Receiver<bool>) {
    let every = Duration::from_millis(reconcile_every_ms);
    loop {
        if tokio::time::timeout(every, stop.wait_for(|s| *s))
            .await
            .is_ok()
        {
            return;
        }
        machines.reconcile();
    }
}

fn heal(cluster: &Cluster, machines: &Machines, pauses: &BTreeMap<NodeId, Pause>, h: &Recorder) {
    cluster.router.heal();
    for pause in pauses.values() {
        pause.resume();
    }
    machines.heal();
    h.record(Event::Note {
        what: "healed: every fault cleared, held messages and envelopes released".to_string(),
    });
}

/// After the heal, the cluster must ack a write and get an envelope applied on every machine.
async fn wait_progress(spec: &RunSpec, history: &Recorder) -> Result<(), RunError> {
    let healed = history.now();
    let within = Duration::from_millis(progress_wait_ms);
    if !history
        .wait_for(healed, within, |e| matches!(e, Event::WriteAcked { .. }))
        .await
    {
        return Err(RunError::Stuck(format!(
            "no write acknowledged within {progress_wait_ms} ms of the heal"
        )));
    }
    for name in &spec.machines {
        let applied = history
            .wait_for(
                healed,
                within,
                |e| matches!(e, Event::EnvelopeApplied { machine, .. } if machine == name),
            )
            .await;
        if !applied {
            return Err(RunError::Stuck(format!(
                "no envelope applied on {name} within {progress_wait_ms} ms of the heal"
            )));
        }
    }
    Ok(())
}

async fn stop_tasks(tasks: &mut JoinSet<()>, history: &Recorder) {
    let all = async { while tasks.join_next().await.is_some() {} };
    let within = Duration::from_millis(tasks_stop_wait_ms);
    if tokio::time::timeout(within, all).await.is_err() {
        history.record(Event::Note {
            what: format!("tasks still running {tasks_stop_wait_ms} ms after the stop; aborted"),
        });
        tasks.abort_all();
    }
}

/// Waits until a leader confirms its commit point and every replica applied up to it.
async fn converge(replicas: &BTreeMap<NodeId, SharedReplica>) -> Result<(), RunError> {
    let within = Duration::from_millis(converge_wait_ms);
    let deadline = tokio::time::Instant::now() + within;
    let found = mesh_testkit::wait::poll_within(within, || commit_point(replicas, deadline)).await;
    let Some(index) = found else {
        return Err(RunError::Stuck(format!(
            "no leader confirmed its commit point within {converge_wait_ms} ms"
        )));
    };
    for (id, replica) in replicas {
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        replica
            .raft()
            .wait(Some(left))
            .applied_index_at_least(Some(index), "replica converges")
            .await
            .map_err(|e| {
                RunError::Stuck(format!("replica {id} did not apply up to {index}: {e}"))
            })?;
    }
    Ok(())
}

async fn commit_point(
    replicas: &BTreeMap<NodeId, SharedReplica>,
    deadline: tokio::time::Instant,
) -> Option<u64> {
    for replica in replicas.values() {
        if replica.metrics().borrow().state != ServerState::Leader {
            continue;
        }
        let round = tokio::time::timeout_at(deadline, replica.raft().ensure_linearizable()).await;
        if let Ok(Ok(read)) = round {
            return Some(read.map(|id| id.index).unwrap_or(0));
        }
    }
    None
}

/// Records what every replica holds for every client key.
fn read_finals(
    spec: &RunSpec,
    replicas: &BTreeMap<NodeId, SharedReplica>,
    history: &Recorder,
) -> Result<(), RunError> {
    for (id, replica) in replicas {
        let txn = replica
            .database()
            .begin_read()
            .map_err(|e| RunError::Setup(format!("read replica {id}: {e}")))?;
        for k in 0..spec.keys {
            let key = format!("key-{k}");
            let value = kv::read(&txn, &key)
                .map_err(|e| RunError::Setup(format!("read {key} on replica {id}: {e}")))?
                .map(|v| String::from_utf8_lossy(&v).into_owned());
            history.record(Event::FinalRead {
                replica: *id,
                key,
                value,
            });
        }
    }
    Ok(())
}

async fn shutdown(cluster: Cluster, history: &Recorder) {
    for (id, replica) in cluster.replicas {
        cluster.router.remove(id);
        let Some(replica) = Arc::into_inner(replica) else {
            history.record(Event::Note {
                what: format!("replica {id} still shared at shutdown; left to drop"),
            });
            continue;
        };
        if let Err(e) = replica.shutdown().await {
            history.record(Event::Note {
                what: format!("replica {id} did not shut down cleanly: {e}"),
            });
        }
    }
}

fn write_history(seed: u64, history: &History) -> Option<PathBuf> {
    let path = std::env::temp_dir().join(format!("mesh-chaos-seed-{seed}.history"));
    std::fs::write(&path, history.to_string()).ok()?;
    Some(path)
}
