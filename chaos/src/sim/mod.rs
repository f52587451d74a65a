//! The deterministic simulator (issue 22 items 2–3, decisions 0322 and 0323): the real mesh in one
//! OS thread with simulated time. Three replicas started through the real `controller::start_in`
//! (real `Service`, `MeshApp` on redb, openraft) with Raft on the same runtime
//! ([`mesh::controller::RaftRuntime::current`]), two real host agents (`Agent`, its listener, its
//! reconcile loop) and an operator, all talking real QUIC and TLS over [`net::Net`], a simulated
//! network. tokio's clock is paused: it jumps to the next timer whenever every task waits, so a
//! run of simulated seconds takes what its computing takes. Every random choice a run makes
//! comes from its seed: the network's fate of each datagram, the faults, the operator's choices,
//! QUIC's own generator, request ids, openraft's election timeouts
//! (`mesh_raft::runtime::seed_thread_rng`).
//!
//! A run records a trace of typed events ([`Step`]): each replica's Raft state, term, leader
//! and applied index as they change, every report a host sends (the position it applied),
//! every operator answer and every fault, each stamped with the simulated time. The trace hash
//! (blake3 over the trace) is what a replay must reproduce. The checkers ([`check`]) read the
//! trace, not log lines.

pub mod net;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use mesh::controller::api::{Answer, Body, Call, PushOutcome, PushTarget, Request, RequestId};
use mesh::controller::config::{ReplicaConfig, ReplicaConfigFile, TlsFile, write_signing_key};
use mesh::controller::{RaftRuntime, Running};
use mesh::core::model::Mesh;
use mesh::core::report::Report;
use mesh::host::{Agent, HostConfig, QuicSink, ReportSink, SinkFuture};
use mesh_raft::{Clock, RaftSettings};
use mesh_testkit::Pki;
use mesh_transport::{Endpoint, Identity, MessageKind, Peer, Principal, TransportConfig};
use tokio::sync::watch;

use crate::bed::{ask_over, replica_key, serve_and_reconcile};
use crate::rng::Rng;
use net::{Net, NetCounts, Weather};

/// Replicas in a simulated cluster.
pub const sim_replicas_n: u64 = 3;
/// The machines of a simulated run, one host agent each.
pub const sim_machines: [&str; 2] = ["ace", "bex"];
/// Simulated time a run may take before it counts as stuck.
pub const sim_run_ms_max: u64 = 120_000;
/// Simulated time the fault phase of a run lasts.
pub const sim_faults_ms: u64 = 6_000;
/// How long a simulated operator request may take.
pub const sim_request_ms: u64 = 4_000;
/// Raft entries between two snapshots in a simulated run (a run commits dozens to hundreds).
pub const sim_snapshot_every: u64 = 8;
/// Raft entries kept after a snapshot in a simulated run.
pub const sim_logs_kept: u64 = 2;
/// Simulated time the replicas have at the end of a run to apply the same index: longer than
/// the transport's idle timeout (10 s), because a replica crashed and restarted at the same
/// address is not replicated to until the leader's QUIC connection to its former self times
/// out (seed 255: 11.5 s after the restart; decision 0329).
pub const sim_agree_ms: u64 = 15_000;
/// Trace steps one run keeps at most; a run that would trace more counts as failed (its trace is
/// incomplete, so neither its hash nor its checks can be trusted).
pub const sim_trace_steps_max: usize = 200_000;

/// What a run does.
#[derive(Clone, Copy, Debug)]
pub struct SimSpec {
    pub seed: u64,
    /// Seeded network faults and a replica crash and restart; `false`: a calm network.
    pub faults: bool,
}

/// One typed step of a run's trace, stamped with simulated milliseconds since the start.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Step {
    /// A replica's Raft state as its metrics changed it (state, term, leader, applied index).
    Raft {
        at_us: u64,
        replica: u64,
        leader_here: bool,
        state: String,
        term: u64,
        leader: Option<u64>,
        applied: Option<u64>,
    },
    /// A host delivered (or tried to deliver) a report: the position it applied.
    Report {
        at_us: u64,
        machine: String,
        epoch: u64,
        sequence: u64,
        report_sequence: u64,
        /// Envelopes the host refused as older than its mark so far (G2's refusals, its own
        /// count in the report).
        refused_older: u64,
        delivered: bool,
    },
    /// The operator's answer to one request.
    Answer {
        at_us: u64,
        request: String,
        via: u64,
        outcome: String,
    },
    /// A fault the nemesis injected or ended.
    Fault { at_us: u64, what: String },
    /// A hostile peer's act (issue 22 item 5) and what the replica made of it: `taken` when the
    /// replica filed or answered it instead of refusing it.
    Hostile {
        at_us: u64,
        what: String,
        outcome: String,
        taken: bool,
    },
    /// An apply the operator saw acknowledged, with the store revision its answer named.
    Acked { at_us: u64, via: u64, revision: u64 },
    /// A read of the model (`model show`) the operator saw answered: invoked at `invoked_us`,
    /// answered at `at_us`, showing the store at `store_revision`.
    Read {
        invoked_us: u64,
        at_us: u64,
        via: u64,
        store_revision: u64,
    },
    /// A host's report sent to the leader again on a new stream (what a host retrying after a
    /// lost answer, or a peer holding the host's certificate, sends): `caused` of them the
    /// leader answered as refused (`Filed { accepted: false }`: at or below the account), and
    /// the machine's refusal count in the leader's `status` was `before` just before them and
    /// `after` just after.
    Refusals {
        at_us: u64,
        machine: String,
        before: u64,
        caused: u64,
        after: u64,
    },
    /// The path between `replica` and `machine`'s host was cut both ways (every datagram dropped).
    PathCut {
        at_us: u64,
        replica: u64,
        machine: String,
    },
    /// The path cut by the matching [`Step::PathCut`] is back.
    PathHealed {
        at_us: u64,
        replica: u64,
        machine: String,
    },
    /// At the end of a run, once the replicas applied the same index (or the wait for it ended):
    /// what of replica `replica`'s state and sends differs from the leader's (the chaos runs'
    /// comparison, remembered request ids included), and the index each applied.
    Final {
        at_us: u64,
        replica: u64,
        leader: u64,
        applied: Option<u64>,
        leader_applied: Option<u64>,
        differs: Vec<String>,
    },
}

/// Why a run could not be made or did not finish.
#[derive(Debug, thiserror::Error)]
pub enum SimError {
    #[error("cannot build the simulator's runtime: {0}")]
    Runtime(std::io::Error),
    #[error("seed {seed}: {what}; replay with `mesh-chaos sim --seed {seed}`")]
    Setup { seed: u64, what: String },
    #[error(
        "seed {seed}: stuck at {at_ms} simulated ms: {what}; replay with `mesh-chaos sim --seed {seed}`"
    )]
    Stuck { seed: u64, at_ms: u64, what: String },
}

/// What a run did.
#[derive(Clone, Debug)]
pub struct SimOutcome {
    pub seed: u64,
    /// blake3 of the trace, hex: two runs of one seed print the same.
    pub trace_hash: String,
    pub steps: usize,
    pub simulated_ms: u64,
    pub net: NetCounts,
    pub faults: usize,
    pub pushes_applied: u64,
    pub violations: Vec<String>,
    /// The trace itself, to diff two runs of one seed.
    pub trace: Vec<Step>,
}

/// The trace of one run, shared by the tasks that record into it.
#[derive(Clone, Default)]
struct Trace {
    steps: Arc<Mutex<Vec<Step>>>,
    /// Steps not recorded past [`sim_trace_steps_max`].
    lost: Arc<std::sync::atomic::AtomicU64>,
}

impl Trace {
    fn record(&self, step: Step) {
        let mut steps = self.steps.lock().unwrap_or_else(|p| p.into_inner());
        if steps.len() < sim_trace_steps_max {
            steps.push(step);
        } else {
            self.lost.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
    }

    fn lost(&self) -> u64 {
        self.lost.load(std::sync::atomic::Ordering::Relaxed)
    }

    fn take(&self) -> Vec<Step> {
        std::mem::take(&mut *self.steps.lock().unwrap_or_else(|p| p.into_inner()))
    }
}

/// Simulated microseconds since `start`.
fn micros_since(start: tokio::time::Instant) -> u64 {
    u64::try_from(start.elapsed().as_micros()).unwrap_or(u64::MAX)
}

/// The lease clock on simulated time: tokio's paused clock.
struct SimClock;

impl Clock for SimClock {
    fn now(&self) -> std::time::Instant {
        tokio::time::Instant::now().into_std()
    }
}

/// Raft timings of a simulated run: as the chaos runs' (`bed::raft_settings`), with a snapshot
/// every [`sim_snapshot_every`] entries and [`sim_logs_kept`] kept after it, so a replica that
/// was down or cut off for a few writes catches up by installing the leader's snapshot
/// (`MeshApp::install`) instead of from the log.
fn raft_settings() -> RaftSettings {
    RaftSettings {
        snapshot_logs_since_last: sim_snapshot_every,
        logs_kept_after_snapshot: sim_logs_kept,
        ..crate::bed::raft_settings()
    }
}

fn transport() -> TransportConfig {
    TransportConfig {
        request_timeout_ms: 6_000,
        ..TransportConfig::default()
    }
}

fn replica_addr(id: u64) -> SocketAddr {
    SocketAddr::from(([10, 0, 0, id as u8], 7000))
}

fn host_addr(i: usize) -> SocketAddr {
    SocketAddr::from(([10, 0, 1, i as u8 + 1], 7100))
}

fn operator_addr() -> SocketAddr {
    SocketAddr::from(([10, 0, 2, 1], 7200))
}

/// A host's report sink: the real QUIC sink, each delivery recorded in the trace.
struct TracedSink {
    inner: QuicSink,
    trace: Trace,
    start: tokio::time::Instant,
    /// The last report each host delivered, for a peer that sends it again.
    delivered: Delivered,
}

/// The last report each host delivered.
type Delivered = Arc<Mutex<BTreeMap<String, Report>>>;

impl ReportSink for TracedSink {
    fn deliver<'a>(&'a self, report: &'a Report) -> SinkFuture<'a> {
        Box::pin(async move {
            let result = self.inner.deliver(report).await;
            if result.is_ok() {
                self.delivered
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .insert(report.machine.clone(), report.clone());
            }
            self.trace.record(Step::Report {
                at_us: micros_since(self.start),
                machine: report.machine.clone(),
                epoch: report.epoch,
                sequence: report.sequence,
                report_sequence: report.report_sequence,
                refused_older: report.refused_older,
                delivered: result.is_ok(),
            });
            result
        })
    }
}

/// One running host agent.
struct SimHost {
    agent: Arc<Agent>,
    endpoint: Endpoint,
    stop: watch::Sender<bool>,
}

/// The simulated cluster: replicas, hosts, the operator, over one [`Net`].
struct World {
    seed: u64,
    dir: tempfile::TempDir,
    pki: Pki,
    net: Net,
    rng: Rng,
    trace: Trace,
    start: tokio::time::Instant,
    delivered: Delivered,
    configs: BTreeMap<u64, ReplicaConfig>,
    /// Each replica's config as written, to move its store after a kill.
    config_files: BTreeMap<u64, ReplicaConfigFile>,
    replicas: BTreeMap<u64, Running>,
    hosts: BTreeMap<String, SimHost>,
    operator: Endpoint,
    /// Request ids drawn from the seed, not the OS.
    request_ids: u64,
    /// Second operators started (each reads through one replica for a while).
    readers: u64,
    /// Per replica, whether the replica started last is still the one alive: a killed one's
    /// metrics stop being traced.
    alive: BTreeMap<u64, Arc<AtomicBool>>,
    /// Killed replicas: never shut down, off the network, their tasks left to run until the
    /// run ends (a process that is gone; see [`World::kill_and_restart`]).
    killed: Vec<Running>,
}

/// A QUIC generator seed for the endpoint at `addr` in run `seed`.
fn quic_seed(seed: u64, addr: SocketAddr, generation: u64) -> [u8; 32] {
    let mut rng = Rng::new(
        seed,
        u64::from(u32::from_be_bytes(match addr.ip() {
            std::net::IpAddr::V4(v4) => v4.octets(),
            std::net::IpAddr::V6(_) => [0; 4],
        })) ^ (generation << 40),
    );
    let mut out = [0u8; 32];
    for chunk in out.chunks_mut(8) {
        chunk.copy_from_slice(&rng.next_u64().to_le_bytes());
    }
    out
}

impl World {
    fn setup_error(&self, what: impl std::fmt::Display) -> SimError {
        SimError::Setup {
            seed: self.seed,
            what: what.to_string(),
        }
    }

    fn endpoint(
        &self,
        addr: SocketAddr,
        identity: &Identity,
        generation: u64,
    ) -> Result<Endpoint, SimError> {
        let config = transport().check().map_err(|e| self.setup_error(e))?;
        Endpoint::over_socket(
            identity,
            config,
            self.net.bind(addr),
            Arc::new(quinn::TokioRuntime),
            Some(quic_seed(self.seed, addr, generation)),
        )
        .map_err(|e| self.setup_error(format!("endpoint at {addr}: {e}")))
    }

    /// Writes `file` as replica `file.id`'s config and loads it back, as meshd would.
    fn save_config(&mut self, file: ReplicaConfigFile) -> Result<ReplicaConfig, SimError> {
        let path = self.dir.path().join(format!("replica-{}.toml", file.id));
        let text = file.to_toml().map_err(|e| self.setup_error(e))?;
        std::fs::write(&path, text).map_err(|e| self.setup_error(e))?;
        let config = ReplicaConfig::load(&path).map_err(|e| self.setup_error(e))?;
        self.config_files.insert(file.id, file);
        Ok(config)
    }

    fn write_config(&mut self, id: u64) -> Result<ReplicaConfig, SimError> {
        let sub = format!("replica-{id}");
        let (cert, key) = self.pki.write(&sub, &Principal::Replica(id));
        let signing = self.dir.path().join(format!("{sub}.key"));
        write_signing_key(&signing, &replica_key(id)).map_err(|e| self.setup_error(e))?;
        let file = ReplicaConfigFile {
            id,
            listen: replica_addr(id).to_string(),
            data_dir: self.dir.path().join(&sub),
            signing_key: signing,
            tls: TlsFile {
                ca: self.pki.ca_path(),
                cert,
                key,
            },
            peers: (1..=sim_replicas_n)
                .map(|i| (i.to_string(), replica_addr(i).to_string()))
                .collect(),
            hosts: sim_machines
                .iter()
                .enumerate()
                .map(|(i, m)| (m.to_string(), host_addr(i).to_string()))
                .collect(),
            raft: Some(raft_settings()),
            transport: Some(transport()),
            http: None,
            silent_after_ms: None,
            trusted_keys: (1..=sim_replicas_n)
                .map(|i| {
                    let public = replica_key(i).verifying_key();
                    (i.to_string(), mesh::hex::encode_hex(public.as_bytes()))
                })
                .collect(),
            join: false,
        };
        self.save_config(file)
    }

    fn host_config(&self, i: usize, name: &str) -> Result<HostConfig, SimError> {
        let sub = format!("host-{name}");
        let (cert, key) = self.pki.write(&sub, &Principal::Host(name.into()));
        let root = self.dir.path().join(&sub).join("root");
        std::fs::create_dir_all(&root).map_err(|e| self.setup_error(e))?;
        let trusted: Vec<String> = (1..=sim_replicas_n)
            .map(|id| {
                format!(
                    "{id} = \"{}\"",
                    mesh::hex::encode_hex(replica_key(id).verifying_key().as_bytes())
                )
            })
            .collect();
        let list: Vec<String> = (1..=sim_replicas_n)
            .map(|id| format!("\"{}\"", replica_addr(id)))
            .collect();
        let text = format!(
            "name = \"{name}\"\nroot = \"{}\"\nmounts_root = \"{}\"\nlisten = \"{}\"\nreplicas = [{}]\nreconcile_interval_ms = {}\n[tls]\nca = \"{}\"\ncert = \"{}\"\nkey = \"{}\"\n[trusted_keys]\n{}\n",
            root.display(),
            self.dir.path().join(&sub).join("mounts").display(),
            host_addr(i),
            list.join(", "),
            crate::bed::reconcile_every_ms,
            self.pki.ca_path().display(),
            cert.display(),
            key.display(),
            trusted.join("\n")
        );
        let path = self.dir.path().join(format!("{sub}.toml"));
        std::fs::write(&path, text).map_err(|e| self.setup_error(e))?;
        HostConfig::load(&path).map_err(|e| self.setup_error(e))
    }

    async fn start_host(&self, i: usize, name: &str) -> Result<SimHost, SimError> {
        let config = self.host_config(i, name)?;
        let tls = config
            .tls()
            .ok_or_else(|| self.setup_error(format!("host {name} has no [tls]")))?;
        let identity =
            Identity::load(&tls.ca, &tls.cert, &tls.key).map_err(|e| self.setup_error(e))?;
        let endpoint = self.endpoint(host_addr(i), &identity, 0)?;
        let sink = TracedSink {
            inner: QuicSink::new(endpoint.clone(), name, config.replicas().to_vec()),
            trace: self.trace.clone(),
            start: self.start,
            delivered: self.delivered.clone(),
        };
        let agent = Arc::new(Agent::open(config, Arc::new(sink)).map_err(|e| self.setup_error(e))?);
        agent.start().await.map_err(|e| self.setup_error(e))?;
        let stop = serve_and_reconcile(&endpoint, &agent);
        Ok(SimHost {
            agent,
            endpoint,
            stop,
        })
    }

    /// Starts replica `id` from its files (generation: how many times it started before).
    async fn start_replica(&mut self, id: u64, generation: u64) -> Result<(), SimError> {
        let config = match self.configs.get(&id) {
            Some(c) => c.clone(),
            None => {
                let c = self.write_config(id)?;
                self.configs.insert(id, c.clone());
                c
            }
        };
        let identity = self.pki.identity(&Principal::Replica(id));
        let endpoint = self.endpoint(replica_addr(id), &identity, generation)?;
        let running = mesh::controller::start_in(
            config,
            endpoint,
            Arc::new(SimClock),
            RaftRuntime::current(),
        )
        .await
        .map_err(|e| self.setup_error(format!("replica {id} starts: {e}")))?;
        let alive = Arc::new(AtomicBool::new(true));
        watch_raft(
            id,
            running.service().replica().metrics(),
            self.trace.clone(),
            self.start,
            alive.clone(),
        );
        self.alive.insert(id, alive);
        self.replicas.insert(id, running);
        Ok(())
    }

    /// The replica leading in the highest term, if any.
    fn leader(&self) -> Option<(u64, u64)> {
        self.replicas
            .iter()
            .filter_map(|(id, r)| {
                let m = r.service().replica().metrics().borrow().clone();
                (m.state == openraft::ServerState::Leader).then_some((*id, m.current_term))
            })
            .max_by_key(|(_, term)| *term)
    }

    fn call(&mut self, request: Request) -> Call {
        self.request_ids += 1;
        let mut id = [0u8; 16];
        id[..8].copy_from_slice(&self.seed.to_le_bytes());
        id[8..].copy_from_slice(&self.request_ids.to_le_bytes());
        Call {
            id: RequestId(id),
            request,
        }
    }

    /// Asks replica `via` as the operator and records the answer in the trace.
    async fn ask(&mut self, via: u64, request: Request) -> Result<Body, String> {
        let what = request_name(&request);
        let call = self.call(request);
        let answered = self.ask_call(via, &call).await;
        let outcome = match &answered {
            Ok(Answer { body: Ok(body), .. }) => body_summary(body),
            Ok(Answer { body: Err(e), .. }) => format!("refused: {e}"),
            Err(e) => format!("no answer: {e}"),
        };
        self.trace.record(Step::Answer {
            at_us: micros_since(self.start),
            request: what,
            via,
            outcome,
        });
        match answered {
            Ok(Answer { body: Ok(body), .. }) => Ok(body),
            Ok(Answer { body: Err(e), .. }) => Err(e.to_string()),
            Err(e) => Err(e),
        }
    }

    async fn ask_call(&self, via: u64, call: &Call) -> Result<Answer, String> {
        ask_call(&self.operator, via, call).await
    }

    /// A second operator, concurrent with the first: reads the model through replica `via`
    /// every 50–200 ms (seeded) for `for_ms`, each answer traced as a [`Step::Read`]. While
    /// `via` is cut off and the first operator writes through a newer leader, a read it answers
    /// from its own store without confirming it leads is stale.
    fn spawn_reader(&mut self, via: u64, for_ms: u64) {
        self.readers += 1;
        let mut rng = Rng::new(self.seed, 0x5245_4144_0000 + self.readers);
        let (operator, trace, start, seed) = (
            self.operator.clone(),
            self.trace.clone(),
            self.start,
            self.seed,
        );
        let first_id = self.readers << 32;
        tokio::spawn(async move {
            let end = tokio::time::Instant::now() + Duration::from_millis(for_ms);
            let mut n = first_id;
            while tokio::time::Instant::now() < end {
                tokio::time::sleep(Duration::from_millis(rng.between(50, 200))).await;
                n += 1;
                let mut id = [0u8; 16];
                id[..8].copy_from_slice(&seed.to_le_bytes());
                // Ids of the second operator: the high bit set, apart from the first's.
                id[8..].copy_from_slice(&(n | 1 << 63).to_le_bytes());
                let call = Call {
                    id: RequestId(id),
                    request: Request::ModelShow { revision: None },
                };
                let invoked_us = micros_since(start);
                let answered = ask_call(&operator, via, &call).await;
                let at_us = micros_since(start);
                if let Ok(Answer {
                    body: Ok(Body::Model(view)),
                    ..
                }) = answered
                {
                    trace.record(Step::Read {
                        invoked_us,
                        at_us,
                        via,
                        store_revision: view.store_revision,
                    });
                }
            }
        });
    }

    fn fault(&self, what: String) {
        self.trace.record(Step::Fault {
            at_us: micros_since(self.start),
            what,
        });
    }

    fn stuck(&self, what: impl std::fmt::Display) -> SimError {
        SimError::Stuck {
            seed: self.seed,
            at_ms: micros_since(self.start) / 1_000,
            what: what.to_string(),
        }
    }

    /// Waits (in simulated time) until some replica leads.
    async fn wait_leader(&self, within_ms: u64) -> Result<(u64, u64), SimError> {
        let deadline = tokio::time::Instant::now() + Duration::from_millis(within_ms);
        loop {
            if let Some(leader) = self.leader() {
                return Ok(leader);
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(self.stuck(format!("no leader within {within_ms} ms")));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Applies model `tag` and pushes it to every machine through a replica the seed picks;
    /// returns whether every machine answered applied.
    async fn apply_and_push(&mut self, tag: u64) -> bool {
        let via = 1 + self.rng.below(sim_replicas_n);
        self.apply_and_push_via(tag, via).await
    }

    /// [`World::apply_and_push`] with the apply sent through replica `via`.
    async fn apply_and_push_via(&mut self, tag: u64, via: u64) -> bool {
        let applied = self
            .ask(
                via,
                Request::Apply {
                    mesh: model(tag),
                    why: format!("sim apply {tag}"),
                    drain: false,
                },
            )
            .await;
        match applied {
            Ok(Body::Applied { revision, .. }) => self.trace.record(Step::Acked {
                at_us: micros_since(self.start),
                via,
                revision,
            }),
            _ => return false,
        }
        let via = 1 + self.rng.below(sim_replicas_n);
        let pushed = match self
            .ask(
                via,
                Request::Push {
                    target: PushTarget::All,
                    why: format!("sim push {tag}"),
                    moves: vec![],
                    plan: None,
                },
            )
            .await
        {
            Ok(Body::Push(view)) => view
                .lines
                .iter()
                .all(|l| matches!(l.outcome, PushOutcome::Applied { .. })),
            _ => false,
        };
        let via = 1 + self.rng.below(sim_replicas_n);
        self.read_model(via).await;
        pushed
    }

    /// Reads the model in force through replica `via` (`model show`); an answer is traced as a
    /// [`Step::Read`] for the read checker, a refusal or silence constrains nothing.
    async fn read_model(&mut self, via: u64) {
        let invoked_us = micros_since(self.start);
        if let Ok(Body::Model(view)) = self.ask(via, Request::ModelShow { revision: None }).await {
            self.trace.record(Step::Read {
                invoked_us,
                at_us: micros_since(self.start),
                via,
                store_revision: view.store_revision,
            });
        }
    }

    /// Crashes replica `id` (cut off from everyone, stopped, its address off the network) and
    /// restarts it from its files after `down_ms`.
    async fn crash_and_restart(
        &mut self,
        id: u64,
        down_ms: u64,
        generation: u64,
    ) -> Result<(), SimError> {
        self.fault(format!("crash replica {id} for {down_ms} ms"));
        self.net.unbind(replica_addr(id));
        if let Some(running) = self.replicas.remove(&id) {
            let _ = tokio::time::timeout(Duration::from_millis(15_000), running.shutdown()).await;
        }
        tokio::time::sleep(Duration::from_millis(down_ms)).await;
        self.fault(format!("restart replica {id}"));
        self.start_replica(id, generation).await
    }

    /// Kills replica `id` as SIGKILL would, as far as one process allows: off the network at
    /// once (nothing it sends leaves, nothing reaches it), no handover, no drain, no clean close
    /// of its store. Its store files as they are at that moment (every commit redb made, nothing
    /// in flight: on this one thread no other task is mid-step) are copied, and after `down_ms`
    /// the replica starts again from the copy, so redb opens files that were never closed. The
    /// killed replica's own tasks cannot be stopped from outside the product without a seam
    /// (`Running` gives no abort); they run on, silenced, until the run ends, and redb does not
    /// open a file twice in one process, hence the copy (decision 0326).
    async fn kill_and_restart(
        &mut self,
        id: u64,
        down_ms: u64,
        generation: u64,
    ) -> Result<(), SimError> {
        self.fault(format!("kill replica {id} for {down_ms} ms"));
        self.net.unbind(replica_addr(id));
        if let Some(alive) = self.alive.get(&id) {
            alive.store(false, Ordering::Relaxed);
        }
        let from = match self.configs.get(&id) {
            Some(config) => config.data_dir().to_path_buf(),
            None => return Err(self.setup_error(format!("replica {id} has no config to kill"))),
        };
        let image = self
            .dir
            .path()
            .join(format!("replica-{id}-killed-{generation}"));
        copy_dir(&from, &image)
            .map_err(|e| self.setup_error(format!("copying killed replica {id}'s files: {e}")))?;
        if let Some(running) = self.replicas.remove(&id) {
            self.killed.push(running);
        }
        tokio::time::sleep(Duration::from_millis(down_ms)).await;
        self.fault(format!("restart replica {id} from its files as killed"));
        let file = match self.config_files.get(&id) {
            Some(file) => ReplicaConfigFile {
                data_dir: image,
                ..file.clone()
            },
            None => return Err(self.setup_error(format!("replica {id} has no config to move"))),
        };
        let config = self.save_config(file)?;
        self.configs.insert(id, config);
        self.start_replica(id, generation).await
    }

    /// Cuts replica `id` off from the other replicas for `ms` (healed on its own timer) while a
    /// second operator reads the model through it ([`World::spawn_reader`]) and the first waits
    /// for a newer leader and applies and pushes model `tag` through it; returns whether every
    /// machine applied that push.
    async fn isolate_and_write(&mut self, id: u64, ms: u64, tag: u64) -> bool {
        self.fault(format!("isolate replica {id} for {ms} ms"));
        cut_replica(&self.net, id, true);
        // A stale leader answering from its own store is what the reader can catch.
        self.spawn_reader(id, ms);
        let (net, trace, start) = (self.net.clone(), self.trace.clone(), self.start);
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(ms)).await;
            cut_replica(&net, id, false);
            trace.record(Step::Fault {
                at_us: micros_since(start),
                what: format!("heal replica {id}"),
            });
        });
        let cut_until = tokio::time::Instant::now() + Duration::from_millis(ms);
        let mut via = None;
        while via.is_none() && tokio::time::Instant::now() < cut_until {
            tokio::time::sleep(Duration::from_millis(20)).await;
            via = self.leader().map(|(l, _)| l).filter(|l| *l != id);
        }
        let via = match via {
            Some(leader) => leader,
            None => 1 + self.rng.below(sim_replicas_n),
        };
        self.apply_and_push_via(tag, via).await
    }

    /// Envelopes held on their way (the real-process beds' G3 fault, `tests/bed_faults.rs`, and
    /// the case G2's fence exists for): the leader's route to host `ace` fails behind a router
    /// queue ([`Net::hold`]) and its path to `bex` is cut (everything dropped), a push through
    /// it writes both envelopes under its lease, the leader is cut off from its peers, a newer
    /// leader applies and pushes model `tag + 1`, and both paths come back while the old leader
    /// is still cut off.
    /// - `ace`: the router's queue delivers what the old leader sent first, its envelope among
    ///   it, after the newer leader's envelope, whatever the gate did since: `ace`'s mark must
    ///   refuse it as older (G2). With the fence off `ace` applies the old epoch after the newer
    ///   one.
    /// - `bex`: nothing the old leader sent while the path was cut arrives. With the write gate
    ///   intact the old stream was reset at the lease's end, so nothing of the old term reaches
    ///   `bex` once the path is back (G3, checked on [`Step::PathCut`]/[`Step::PathHealed`]);
    ///   with the gate broken QUIC retransmits the envelope after the heal and `bex` refuses it.
    ///
    /// Returns whether every machine applied the newer leader's push.
    async fn hold_an_envelope(&mut self, tag: u64) -> bool {
        let Some((old, _)) = self.leader() else {
            return false;
        };
        let held = host_addr(0);
        // The route between them fails behind a router queue with room for a few datagrams:
        // what the old leader sends first (the envelope among it) waits there, and reaches
        // `ace` only once the route is back, after the newer leader's envelope.
        let room = self.rng.between(4, 16) as usize;
        self.fault(format!(
            "hold replica {old}'s path to ace (a router queue of {room} datagrams), cut its path to bex"
        ));
        self.net.hold(replica_addr(old), held, room);
        self.net.hold(held, replica_addr(old), room);
        let cut = host_addr(1);
        self.net.cut_both(replica_addr(old), cut, true);
        self.trace.record(Step::PathCut {
            at_us: micros_since(self.start),
            replica: old,
            machine: sim_machines[1].to_string(),
        });
        if let Ok(Body::Applied { revision, .. }) = self
            .ask(
                old,
                Request::Apply {
                    mesh: model(tag),
                    why: format!("sim apply {tag}"),
                    drain: false,
                },
            )
            .await
        {
            self.trace.record(Step::Acked {
                at_us: micros_since(self.start),
                via: old,
                revision,
            });
        }
        // The push through the old leader, as a second operator: it waits for ace's answer.
        let call = self.call(Request::Push {
            target: PushTarget::All,
            why: format!("sim held push {tag}"),
            moves: vec![],
            plan: None,
        });
        let (operator, trace, start) = (self.operator.clone(), self.trace.clone(), self.start);
        tokio::spawn(async move {
            let answered = ask_call(&operator, old, &call).await;
            trace.record(Step::Answer {
                at_us: micros_since(start),
                request: format!("push --all (sim held push {tag})"),
                via: old,
                outcome: match &answered {
                    Ok(Answer { body: Ok(body), .. }) => body_summary(body),
                    Ok(Answer { body: Err(e), .. }) => format!("refused: {e}"),
                    Err(e) => format!("no answer: {e}"),
                },
            });
        });
        let written = self.rng.between(200, 600);
        tokio::time::sleep(Duration::from_millis(written)).await;
        self.fault(format!("isolate replica {old} with ace's envelope held"));
        cut_replica(&self.net, old, true);
        let until = tokio::time::Instant::now() + Duration::from_millis(5_000);
        let mut via = None;
        while via.is_none() && tokio::time::Instant::now() < until {
            tokio::time::sleep(Duration::from_millis(20)).await;
            via = self.leader().map(|(l, _)| l).filter(|l| *l != old);
        }
        let applied = match via {
            Some(leader) => self.apply_and_push_via(tag + 1, leader).await,
            None => false,
        };
        let queued = self.net.release(replica_addr(old), held);
        self.net.release(held, replica_addr(old));
        self.net.cut_both(replica_addr(old), cut, false);
        self.trace.record(Step::PathHealed {
            at_us: micros_since(self.start),
            replica: old,
            machine: sim_machines[1].to_string(),
        });
        self.fault(format!(
            "heal replica {old}'s paths to ace ({queued} datagrams from its queue) and bex"
        ));
        tokio::time::sleep(Duration::from_millis(1_000)).await;
        self.fault(format!("heal replica {old}"));
        cut_replica(&self.net, old, false);
        applied
    }

    /// Hostile peers (issue 22 item 5), each through the real transport to the real leader, each
    /// traced as a [`Step::Hostile`]: host `ace`'s certificate sends a report for `bex`, once
    /// under its own name in the frame and once under `bex`'s; and `ace` sends a report frame of
    /// twice `report_frame_bytes_max`, over a host's frame limit but under the sender's own.
    async fn hostile(&mut self, leader: u64) {
        let Some(ace) = self.hosts.get(sim_machines[0]).map(|h| h.endpoint.clone()) else {
            return;
        };
        let claimed = Report {
            machine: sim_machines[1].to_string(),
            epoch: 0,
            sequence: 0,
            report_sequence: 1 << 40,
            applied: None,
            modules: Vec::new(),
            refused_older: 0,
            last_refusal: None,
            proof: None,
        };
        let Ok(body) = mesh_codec::encode(mesh::core::wire::report_what, &claimed) else {
            return;
        };
        let peer = Peer::expecting(replica_addr(leader), Principal::Replica(leader));
        let limit = Duration::from_millis(sim_request_ms);
        for (what, frame_machine, body) in [
            (
                "ace's certificate sends bex's report, the frame naming bex",
                sim_machines[1],
                body.clone(),
            ),
            (
                "ace's certificate sends bex's report, the frame naming ace",
                sim_machines[0],
                body,
            ),
            (
                "ace sends a report frame of twice report_frame_bytes_max",
                sim_machines[0],
                vec![0u8; 2 * mesh_transport::report_frame_bytes_max],
            ),
        ] {
            let kind = MessageKind::Report {
                machine: frame_machine.to_string(),
            };
            let answered = ace.request(peer.clone(), kind, body, limit).await;
            let (outcome, taken) = match answered {
                Ok(bytes) => match mesh_codec::decode::<mesh::core::wire::ReportReply>(
                    mesh::core::wire::report_reply_what,
                    &bytes,
                ) {
                    Ok(reply @ mesh::core::wire::ReportReply::Filed { .. }) => {
                        (format!("filed: {reply:?}"), true)
                    }
                    Ok(reply) => (format!("answered: {reply:?}"), false),
                    Err(e) => (format!("an answer that is no report reply: {e}"), true),
                },
                Err(e) => (format!("refused: {e}"), false),
            };
            self.trace.record(Step::Hostile {
                at_us: micros_since(self.start),
                what: what.to_string(),
                outcome,
                taken,
            });
        }
        self.report_again(&ace, leader).await;
    }

    /// `ace`'s last delivered report sent to the leader again, 1–3 times (seeded), each on a new
    /// stream through `ace`'s own endpoint: what a host sends when an answer was lost and it
    /// retries, or a peer holding its certificate replays. Each is at or below the account, so the
    /// leader must refuse it and count it once (G5); the refusal count in `status` is read just
    /// before and after and traced with the refusals answered ([`Step::Refusals`]).
    async fn report_again(&mut self, ace: &Endpoint, leader: u64) {
        let machine = sim_machines[0];
        let last = self
            .delivered
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(machine)
            .cloned();
        let Some(last) = last else {
            return;
        };
        let Ok(body) = mesh_codec::encode(mesh::core::wire::report_what, &last) else {
            return;
        };
        let Some(before) = self.refused_reports(leader, machine).await else {
            return;
        };
        let peer = Peer::expecting(replica_addr(leader), Principal::Replica(leader));
        let limit = Duration::from_millis(sim_request_ms);
        let mut caused = 0;
        for _ in 0..self.rng.between(1, 3) {
            let kind = MessageKind::Report {
                machine: machine.to_string(),
            };
            let answered = ace.request(peer.clone(), kind, body.clone(), limit).await;
            if let Ok(bytes) = answered
                && let Ok(mesh::core::wire::ReportReply::Filed { accepted: false }) =
                    mesh_codec::decode::<mesh::core::wire::ReportReply>(
                        mesh::core::wire::report_reply_what,
                        &bytes,
                    )
            {
                caused += 1;
            }
        }
        let Some(after) = self.refused_reports(leader, machine).await else {
            return;
        };
        self.trace.record(Step::Refusals {
            at_us: micros_since(self.start),
            machine: machine.to_string(),
            before,
            caused,
            after,
        });
    }

    /// `machine`'s count of refused reports in `status` through replica `via`.
    async fn refused_reports(&mut self, via: u64, machine: &str) -> Option<u64> {
        match self.ask(via, Request::Status).await {
            Ok(Body::Status(view)) => view
                .machines
                .iter()
                .find(|m| m.name == machine)
                .map(|m| m.refused_reports),
            _ => None,
        }
    }

    /// Waits (up to [`sim_agree_ms`]) until every replica applied the same index, then traces,
    /// for each follower, what of its state and sends differs from the leader's
    /// ([`Step::Final`]): a replica that installed a snapshot, restarted from its files or was
    /// killed must hold what the others hold.
    async fn agree_at_end(&mut self) {
        let applied = |r: &Running| {
            r.service()
                .replica()
                .metrics()
                .borrow()
                .last_applied
                .map(|l| l.index)
        };
        let deadline = tokio::time::Instant::now() + Duration::from_millis(sim_agree_ms);
        let leader = loop {
            let indexes: Vec<Option<u64>> = self.replicas.values().map(applied).collect();
            let leader = self.leader().map(|(l, _)| l);
            if let Some(leader) = leader
                && indexes.windows(2).all(|w| w[0] == w[1])
            {
                break Some(leader);
            }
            if tokio::time::Instant::now() >= deadline {
                break leader;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        let Some(leader) = leader.and_then(|l| self.replicas.get(&l).map(|r| (l, r))) else {
            return;
        };
        let (leader, running) = leader;
        let service = running.service();
        let state = service.app().state();
        let sends = mesh::store::app::MeshApp::sends(service.replica().database(), None);
        let (Ok(state), Ok(sends)) = (state, sends) else {
            return;
        };
        let leader_applied = applied(running);
        for (id, r) in &self.replicas {
            if *id == leader {
                continue;
            }
            let differs = match crate::run::replica_differs(&state, &sends, r.service()) {
                Ok(fields) => fields.into_iter().map(str::to_string).collect(),
                Err(e) => vec![e],
            };
            self.trace.record(Step::Final {
                at_us: micros_since(self.start),
                replica: *id,
                leader,
                applied: applied(r),
                leader_applied,
                differs,
            });
        }
    }

    async fn shutdown(mut self) {
        for (_, running) in std::mem::take(&mut self.replicas) {
            let _ = tokio::time::timeout(Duration::from_millis(15_000), running.shutdown()).await;
        }
        for (_, host) in std::mem::take(&mut self.hosts) {
            let _ = host.stop.send(true);
            host.endpoint.abandon();
            host.agent.shutdown().await;
        }
        self.operator.abandon();
    }
}

/// Asks replica `via` one call as the operator at `operator`.
async fn ask_call(operator: &Endpoint, via: u64, call: &Call) -> Result<Answer, String> {
    let timeout = Duration::from_millis(sim_request_ms);
    ask_over(operator, replica_addr(via), via, call, timeout).await
}

/// Records replica `id`'s Raft state in the trace whenever it changes.
fn watch_raft(
    id: u64,
    mut metrics: watch::Receiver<mesh_raft::Metrics>,
    trace: Trace,
    start: tokio::time::Instant,
    alive: Arc<AtomicBool>,
) {
    tokio::spawn(async move {
        let mut last = None;
        loop {
            if !alive.load(Ordering::Relaxed) {
                return;
            }
            let now = {
                let m = metrics.borrow_and_update();
                (
                    m.state == openraft::ServerState::Leader,
                    format!("{:?}", m.state),
                    m.current_term,
                    m.current_leader,
                    m.last_applied.map(|l| l.index),
                )
            };
            if last.as_ref() != Some(&now) {
                let (leader_here, state, term, leader, applied) = now.clone();
                trace.record(Step::Raft {
                    at_us: micros_since(start),
                    replica: id,
                    leader_here,
                    state,
                    term,
                    leader,
                    applied,
                });
                last = Some(now);
            }
            if metrics.changed().await.is_err() {
                return;
            }
        }
    });
}

/// The model of apply `tag`: the two machines, no modules (a module is a child process, which
/// the simulator does not run; decision 0322), so a push sends each host a declaration of its
/// settings and nothing else. The `tag` names the machines' address to make each apply differ.
fn model(tag: u64) -> Mesh {
    let mut mesh = Mesh::default();
    for m in sim_machines {
        let mut machine = mesh_testkit::model::machine(m);
        machine.address = format!("192.0.2.{}", tag % 250 + 1);
        mesh.machines.insert(m.into(), machine);
    }
    mesh
}

fn request_name(request: &Request) -> String {
    match request {
        Request::Apply { why, .. } => format!("apply ({why})"),
        Request::Push { why, .. } => format!("push --all ({why})"),
        Request::ModelShow { .. } => "model show".into(),
        _ => "other".into(),
    }
}

fn body_summary(body: &Body) -> String {
    match body {
        Body::Push(view) => {
            let lines: Vec<String> = view
                .lines
                .iter()
                .map(|l| match &l.outcome {
                    PushOutcome::Applied { sequence, .. } => {
                        format!("{} applied {}.{sequence}", l.machine, view.epoch)
                    }
                    PushOutcome::Sent { sequence, .. } => {
                        format!("{} sent {}.{sequence}", l.machine, view.epoch)
                    }
                    other => format!("{} {}", l.machine, outcome_kind(other)),
                })
                .collect();
            format!("push epoch {}: {}", view.epoch, lines.join(", "))
        }
        Body::Applied { revision, .. } => format!("applied at revision {revision}"),
        Body::Model(view) => format!("model at store revision {}", view.store_revision),
        _ => "answered".into(),
    }
}

fn outcome_kind(outcome: &PushOutcome) -> String {
    let text = format!("{outcome:?}");
    text.split([' ', '{', '(']).next().unwrap_or("").to_string()
}

/// Runs one seed on a fresh one-thread runtime with a paused clock.
pub fn simulate(spec: SimSpec) -> Result<SimOutcome, SimError> {
    mesh_raft::runtime::seed_thread_rng(spec.seed);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .map_err(SimError::Runtime)?;
    runtime.block_on(async move {
        tokio::time::timeout(Duration::from_millis(sim_run_ms_max), run(spec))
            .await
            .map_err(|_| SimError::Stuck {
                seed: spec.seed,
                at_ms: sim_run_ms_max,
                what: "the run did not end".into(),
            })?
    })
}

async fn run(spec: SimSpec) -> Result<SimOutcome, SimError> {
    let seed = spec.seed;
    let setup = |what: String| SimError::Setup { seed, what };
    let dir = sim_dir().map_err(|e| setup(format!("temp dir: {e}")))?;
    let pki = Pki::in_dir(&dir.path().join("pki"));
    let net = Net::new(Rng::new(seed, 0x004e_4554));
    let start = tokio::time::Instant::now();
    let trace = Trace::default();
    let operator_identity = pki.identity(&Principal::Operator("sim".into()));
    let config = transport()
        .check()
        .map_err(|e| setup(format!("transport config: {e}")))?;
    let operator = Endpoint::over_socket(
        &operator_identity,
        config,
        net.bind(operator_addr()),
        Arc::new(quinn::TokioRuntime),
        Some(quic_seed(seed, operator_addr(), 0)),
    )
    .map_err(|e| setup(format!("operator endpoint: {e}")))?;
    let mut world = World {
        seed,
        dir,
        pki,
        net,
        rng: Rng::new(seed, 0x4f50),
        trace,
        start,
        delivered: Delivered::default(),
        configs: BTreeMap::new(),
        config_files: BTreeMap::new(),
        replicas: BTreeMap::new(),
        hosts: BTreeMap::new(),
        operator,
        request_ids: 0,
        readers: 0,
        alive: BTreeMap::new(),
        killed: Vec::new(),
    };
    for (i, name) in sim_machines.iter().enumerate() {
        let host = world.start_host(i, name).await?;
        world.hosts.insert(name.to_string(), host);
    }
    for id in 1..=sim_replicas_n {
        world.start_replica(id, 0).await?;
    }
    let mut pushes_applied = 0;
    let mut faults = 0;
    world.wait_leader(20_000).await?;
    // (1) The first apply and push, on a calm network.
    let mut tag = 1;
    let deadline = tokio::time::Instant::now() + Duration::from_millis(30_000);
    loop {
        if world.apply_and_push(tag).await {
            pushes_applied += 1;
            break;
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(world.stuck("the first push was not applied by every host in 30 s"));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // Hostile peers against the leader: each act must be refused.
    if let Some((leader, _)) = world.leader() {
        world.hostile(leader).await;
    }
    // (2) Faults from the seed while the operator applies and pushes.
    if spec.faults {
        let weather = Weather {
            drop_per_mille: world.rng.between(0, 50) as u32,
            duplicate_per_mille: world.rng.between(0, 50) as u32,
            jitter_ms: world.rng.between(0, 30),
        };
        world.fault(format!("weather {weather:?}"));
        world.net.set_weather(weather);
        // Every run with faults cuts the leader off for longer than an election first (the
        // followers' first candidate comes about 1.8 s after the last heartbeat), so a newer
        // leader writes while the old one may still answer.
        if let Some((leader, _)) = world.leader() {
            tag += 1;
            let ms = world.rng.between(2_500, 4_000);
            faults += 1;
            let healed = tokio::time::Instant::now() + Duration::from_millis(ms + 500);
            if world.isolate_and_write(leader, ms, tag).await {
                pushes_applied += 1;
            }
            tokio::time::sleep_until(healed).await;
        }
        // Then an envelope held on its way while its leader is deposed.
        tag += 1;
        faults += 1;
        if world.hold_an_envelope(tag).await {
            pushes_applied += 1;
        }
        tag += 1;
        let faults_end = tokio::time::Instant::now() + Duration::from_millis(sim_faults_ms);
        let mut generation = [0u64; sim_replicas_n as usize + 1];
        while tokio::time::Instant::now() < faults_end {
            tag += 1;
            match world.rng.below(4) {
                0 => {
                    // The leader (or any replica) cut off from the others for a while.
                    let id = match world.leader() {
                        Some((leader, _)) if world.rng.chance(700) => leader,
                        _ => 1 + world.rng.below(sim_replicas_n),
                    };
                    let ms = world.rng.between(300, 4_000);
                    faults += 1;
                    if world.isolate_and_write(id, ms, tag).await {
                        pushes_applied += 1;
                    }
                }
                1 => {
                    let id = match world.leader() {
                        Some((leader, _)) if world.rng.chance(500) => leader,
                        _ => 1 + world.rng.below(sim_replicas_n),
                    };
                    let down = world.rng.between(100, 1_500);
                    faults += 1;
                    let g = &mut generation[id as usize];
                    *g += 1;
                    let g = *g;
                    if world.rng.chance(500) {
                        world.kill_and_restart(id, down, g).await?;
                    } else {
                        world.crash_and_restart(id, down, g).await?;
                    }
                }
                _ => {
                    if world.apply_and_push(tag).await {
                        pushes_applied += 1;
                    }
                }
            }
            let think = world.rng.between(10, 300);
            tokio::time::sleep(Duration::from_millis(think)).await;
        }
        world.net.heal();
        world.net.set_weather(Weather::default());
        world.fault("heal: calm network".into());
    }
    // (3) Converge: a push every machine applies.
    world.wait_leader(30_000).await?;
    let deadline = tokio::time::Instant::now() + Duration::from_millis(30_000);
    loop {
        tag += 1;
        if world.apply_and_push(tag).await {
            pushes_applied += 1;
            break;
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(world.stuck("no push applied by every host within 30 s of the heal"));
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    world.agree_at_end().await;
    let simulated_ms = micros_since(world.start) / 1_000;
    let net = world.net.counts();
    let trace = world.trace.clone();
    world.shutdown().await;
    let steps = trace.take();
    let mut violations = check(&steps);
    if trace.lost() > 0 {
        violations.push(format!(
            "the trace is incomplete: {} steps past sim_trace_steps_max ({sim_trace_steps_max}) were not recorded",
            trace.lost()
        ));
    }
    Ok(SimOutcome {
        seed,
        trace_hash: hash(&steps),
        steps: steps.len(),
        simulated_ms,
        net,
        faults,
        pushes_applied,
        violations,
        trace: steps,
    })
}

/// A run's files: in memory (`/dev/shm`) when the machine has it. The stores fsync every Raft
/// append, which on a disk took 5 of a seed's 6 seconds (2026-12-03); the simulated run is the
/// same either way (same trace hash), since no disk fault is simulated yet.
fn sim_dir() -> std::io::Result<tempfile::TempDir> {
    let shm = std::path::Path::new("/dev/shm");
    if shm.is_dir()
        && let Ok(dir) = tempfile::Builder::new().prefix("mesh-sim").tempdir_in(shm)
    {
        return Ok(dir);
    }
    tempfile::tempdir()
}

/// Copies directory `from` (files and directories under it) to `to`.
fn copy_dir(from: &std::path::Path, to: &std::path::Path) -> std::io::Result<()> {
    std::fs::create_dir_all(to)?;
    for entry in std::fs::read_dir(from)? {
        let entry = entry?;
        let target = to.join(entry.file_name());
        if entry.file_type()?.is_dir() {
            copy_dir(&entry.path(), &target)?;
        } else {
            std::fs::copy(entry.path(), &target)?;
        }
    }
    Ok(())
}

/// Cuts replica `id` off from the other replicas, both ways (hosts and the operator still reach it).
fn cut_replica(net: &Net, id: u64, cut: bool) {
    for other in 1..=sim_replicas_n {
        if other != id {
            net.cut_both(replica_addr(id), replica_addr(other), cut);
        }
    }
}

/// blake3 over the trace's steps, as hex.
pub fn hash(steps: &[Step]) -> String {
    let mut hasher = blake3::Hasher::new();
    for step in steps {
        hasher.update(format!("{step:?}\n").as_bytes());
    }
    hasher.finalize().to_hex().to_string()
}

/// The checkers over a trace: each violation named.
///
/// - One leader per term (Raft's election safety, which G3 rests on): no two replicas are ever
///   leader in the same term.
/// - G2/G3 at the hosts: a host never reports a position below one it reported before (its
///   applied `(epoch, sequence)` only moves forward), so no host ever applies an envelope from
///   an epoch older than one it already applied.
/// - Hostile peers are refused (G10, the bounds): every [`Step::Hostile`] act was refused.
/// - Reads see acknowledged writes (the real-time half of linearizability, G1's reads): a read
///   of the model invoked after an apply was acknowledged shows a store at or past that apply's
///   revision, whichever replica it went through.
/// - G3 at the host: a host whose path from a leader was cut (every datagram dropped) until
///   after a newer term's leader was elected refuses nothing as older after the path is back:
///   nothing of the old term reached it during the cut, and nothing may leave the old leader
///   after its lease, so an older envelope there was written or retransmitted after the lease.
/// - Replicas agree at the end (the chaos runs' checker): once they applied the same index,
///   every follower holds the leader's state and sends ([`Step::Final`]).
/// - Each refusal counted once (G5): a host's reports sent again and refused by the leader
///   move the machine's refusal count in `status` by exactly as many ([`Step::Refusals`]).
pub fn check(steps: &[Step]) -> Vec<String> {
    let mut violations = Vec::new();
    // Acknowledged applies in the order they were answered: (answered at, revision).
    let mut acked: Vec<(u64, u64)> = Vec::new();
    let mut leaders: BTreeMap<u64, u64> = BTreeMap::new();
    // Per replica, the last term it led in, and when each term's leader was first seen.
    let mut led: BTreeMap<u64, u64> = BTreeMap::new();
    let mut elected: BTreeMap<u64, u64> = BTreeMap::new();
    let mut applied: BTreeMap<&str, (u64, u64, u64)> = BTreeMap::new();
    // Per machine, the most envelopes its host said it refused as older in any report so far.
    let mut refused: BTreeMap<&str, u64> = BTreeMap::new();
    // Cut paths: (replica, machine) -> the term the replica led when it was cut.
    let mut cut: BTreeMap<(u64, &str), u64> = BTreeMap::new();
    // Hosts a deposed leader may send nothing to any more (G3): machine -> (replica, its term,
    // the heal, the newer term and when it was elected, the host's refusals before the heal).
    let mut fenced: BTreeMap<&str, (u64, u64, u64, u64, u64, u64)> = BTreeMap::new();
    for step in steps {
        match step {
            Step::Raft {
                at_us,
                replica,
                leader_here: true,
                term,
                ..
            } => {
                led.insert(*replica, *term);
                elected.entry(*term).or_insert(*at_us);
                match leaders.get(term) {
                    Some(first) if first != replica => violations.push(format!(
                        "two leaders in term {term}: replica {first}, and replica {replica} at {} ms",
                        at_us / 1_000
                    )),
                    _ => {
                        leaders.insert(*term, *replica);
                    }
                }
            }
            Step::PathCut {
                replica, machine, ..
            } => {
                if let Some(term) = led.get(replica) {
                    cut.insert((*replica, machine.as_str()), *term);
                }
            }
            Step::PathHealed {
                at_us,
                replica,
                machine,
            } => {
                let Some(term) = cut.remove(&(*replica, machine.as_str())) else {
                    continue;
                };
                // A leader of a newer term was elected while the path was cut: the cut
                // replica's lease of `term` had ended by then (a follower's election timeout
                // is longer than any lease), so no byte of an envelope of `term` may leave it
                // any more, and the host can receive none after the heal.
                if let Some((newer, since)) = elected.range(term + 1..).next() {
                    let before = refused.get(machine.as_str()).copied().unwrap_or(0);
                    fenced.insert(
                        machine.as_str(),
                        (*replica, term, *at_us, *newer, *since, before),
                    );
                }
            }
            Step::Report {
                at_us,
                machine,
                epoch,
                sequence,
                refused_older,
                ..
            } => {
                let most = refused.entry(machine.as_str()).or_insert(0);
                *most = (*most).max(*refused_older);
                if let Some(&(replica, term, healed, newer, since, before)) =
                    fenced.get(machine.as_str())
                    && *refused_older > before
                {
                    violations.push(format!(
                        "{machine} refused an envelope as older ({before} refused before, {refused_older} by {} ms) after replica {replica}'s path to it came back at {} ms: replica {replica} was cut off from it since before its term {term} ended (term {newer}'s leader elected at {} ms), so those bytes left it after its lease",
                        at_us / 1_000,
                        healed / 1_000,
                        since / 1_000
                    ));
                    fenced.remove(machine.as_str());
                }
                if let Some((e, s, at)) = applied.get(machine.as_str())
                    && (*epoch, *sequence) < (*e, *s)
                {
                    let older = if epoch < e {
                        "an older epoch after a newer one"
                    } else {
                        "a position below its mark"
                    };
                    violations.push(format!(
                        "{machine} applied {epoch}.{sequence} at {} ms, {older} ({e}.{s} applied by {} ms)",
                        at_us / 1_000,
                        at / 1_000
                    ));
                    continue;
                }
                applied.insert(machine, (*epoch, *sequence, *at_us));
            }
            Step::Acked {
                at_us, revision, ..
            } => acked.push((*at_us, *revision)),
            Step::Hostile {
                at_us,
                what,
                outcome,
                taken: true,
            } => violations.push(format!(
                "a hostile peer was not refused at {} ms: {what}: {outcome}",
                at_us / 1_000
            )),
            Step::Read {
                invoked_us,
                at_us,
                via,
                store_revision,
            } => {
                let newest = acked
                    .iter()
                    .filter(|(answered, _)| answered < invoked_us)
                    .max_by_key(|(_, revision)| *revision);
                if let Some((answered, revision)) = newest
                    && store_revision < revision
                {
                    violations.push(format!(
                        "a stale read: model show through replica {via} (invoked at {} ms, answered at {} ms) showed store revision {store_revision}, but an apply at revision {revision} was acknowledged at {} ms, before the read began",
                        invoked_us / 1_000,
                        at_us / 1_000,
                        answered / 1_000
                    ));
                }
            }
            Step::Final {
                replica,
                leader,
                applied,
                leader_applied,
                differs,
                ..
            } => {
                if applied != leader_applied {
                    violations.push(format!(
                        "replicas agree at the end: replica {replica} applied {applied:?} and the leader {leader} {leader_applied:?} after {sim_agree_ms} ms of calm"
                    ));
                } else if !differs.is_empty() {
                    violations.push(format!(
                        "replicas agree at the end: replica {replica} differs from the leader {leader} at the same applied index {applied:?} in {}",
                        differs.join(", ")
                    ));
                }
            }
            Step::Refusals {
                at_us,
                machine,
                before,
                caused,
                after,
            } if after.checked_sub(*before) != Some(*caused) => violations.push(format!(
                "refusals not counted once: the leader refused {caused} of {machine}'s reports sent again by {} ms, but its refusal count went from {before} to {after}",
                at_us / 1_000
            )),
            _ => {}
        }
    }
    violations
}

/// The trace of one run, for a replay that differs (written where `--trace` asks).
pub fn trace_text(steps: &[Step]) -> String {
    steps.iter().map(|s| format!("{s:?}\n")).collect()
}

/// Where a run's trace is written when asked.
pub fn trace_path(seed: u64) -> PathBuf {
    std::env::temp_dir().join(format!("mesh-sim-seed-{seed}.trace"))
}
