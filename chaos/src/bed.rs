//! The cluster a chaos run drives: three real replica services (`mesh::controller::start_on`:
//! the push engine, `MeshApp` on redb files in a temp dir, the lease gate and vote fence) over real
//! QUIC on loopback, each on its own jumpable [`JumpClock`]; three in-process `mesh-host` agents
//! (the real `Agent`, listener and reconcile loop, running real child processes) whose report sink
//! records every delivery and can hold or duplicate one; and an operator endpoint. Faults go
//! through each endpoint's hooks (`transport/src/faults.rs`).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ed25519_dalek::SigningKey;
use mesh::controller::Running;
use mesh::controller::api::{Answer, Call, Request};
use mesh::controller::config::{ReplicaConfig, ReplicaConfigFile, TlsFile, write_signing_key};
use mesh::core::report::Report;
use mesh::host::{Agent, HostConfig, QuicSink, ReportSink, SinkFuture, listener};
use mesh_raft::{Clock, RaftSettings};
use mesh_testkit::Pki;
use mesh_transport::{Endpoint, MessageKind, Peer, Principal, TransportConfig};
use tokio::sync::watch;

use crate::history::{Event, Recorder};

/// Replicas in a run's cluster.
pub const replicas_n: u64 = 3;
/// The machines of a run.
pub const machines: [&str; 3] = ["ace", "bex", "cor"];
/// How long an operator request may take before its outcome counts as unknown.
pub const request_timeout_ms: u64 = 4_000;
/// Interval of the hosts' periodic reconcile reports.
pub const reconcile_every_ms: u64 = 300;
/// Chunks of one backup at most (the store of a run is a few hundred KiB).
pub const snapshot_chunks_max: usize = 1_024;
/// How long a stopping replica or host may take.
pub const stop_wait_ms: u64 = 15_000;

/// Raft timings for a run: elections in about a second and snapshots every hundred entries, so
/// faults meet elections, closing leases and snapshot catch-up within seconds. The lease window
/// (election_timeout_min − margin = 500 ms) leaves room for a loaded 2-core machine's quorum
/// rounds; at 320 ms an overloaded box refused most pushes ("the quorum round took longer than
/// the lease"), which is right but stops a run from converging.
pub fn raft_settings() -> RaftSettings {
    RaftSettings {
        heartbeat_ms: 60,
        election_timeout_min_ms: 600,
        election_timeout_max_ms: 1_200,
        lease_margin_ms: 100,
        propose_timeout_ms: 2_000,
        snapshot_logs_since_last: 100,
        logs_kept_after_snapshot: 30,
        shutdown_timeout_ms: 5_000,
        ..RaftSettings::default()
    }
}

/// Long enough that an envelope held before the write gate (paused-leader) still waits for it
/// when released after another replica's lease, so the gate itself is what refuses it.
fn transport() -> TransportConfig {
    TransportConfig {
        request_timeout_ms: 6_000,
        ..TransportConfig::default()
    }
}

/// A replica's lease clock: real monotonic time plus a jump the nemesis adds, as `CLOCK_BOOTTIME`
/// jumps over a suspend while `CLOCK_MONOTONIC` (and so Raft's own timers) does not.
#[derive(Debug, Default)]
pub struct JumpClock {
    jumped_ns: AtomicU64,
}

impl JumpClock {
    /// Moves this clock forward by `by`, for good.
    pub fn jump(&self, by: Duration) {
        let ns = u64::try_from(by.as_nanos()).unwrap_or(u64::MAX);
        self.jumped_ns.fetch_add(ns, Ordering::SeqCst);
    }
}

impl Clock for JumpClock {
    fn now(&self) -> Instant {
        Instant::now() + Duration::from_nanos(self.jumped_ns.load(Ordering::SeqCst))
    }
}

/// The signing key of replica `id` (fixed: the hosts trust these).
pub fn replica_key(id: u64) -> SigningKey {
    SigningKey::from_bytes(&[id as u8 + 40; 32])
}

/// Report faults of one host, switched by the nemesis.
#[derive(Debug, Default)]
pub struct SinkFaults {
    /// Hold the next report and deliver it after the one after it (report overtaking).
    pub hold_next: AtomicBool,
    /// Deliver each report a second time, this often in a thousand (duplication).
    pub duplicate_per_mille: AtomicU32,
    held: Mutex<Option<Report>>,
    rolls: AtomicU64,
    /// The last report this host delivered (the hostile peer replays it as another machine's).
    pub last_report: Mutex<Option<Report>>,
}

impl SinkFaults {
    /// The last report this host delivered, if any.
    pub fn last_report(&self) -> Option<Report> {
        self.last_report
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
}

/// The real QUIC sink, recording every delivery and playing the report faults.
struct ChaosSink {
    inner: QuicSink,
    machine: String,
    faults: Arc<SinkFaults>,
    recorder: Recorder,
    /// Replica ids by the address the host's config names them with.
    replicas: BTreeMap<String, u64>,
}

impl ChaosSink {
    async fn deliver_recorded(&self, report: &Report) -> Result<(), mesh::host::SinkError> {
        let started = self.recorder.now();
        let began = Instant::now();
        let result = self.inner.deliver(report).await;
        let took_ms = u64::try_from(began.elapsed().as_millis()).unwrap_or(u64::MAX);
        let by = self
            .inner
            .last_filed_by()
            .and_then(|addr| self.replicas.get(&addr).copied());
        self.recorder.record(Event::ReportDelivered {
            machine: self.machine.clone(),
            position: report.position(),
            ok: result.is_ok(),
            by,
            started,
            took_ms,
        });
        result
    }
}

impl ReportSink for ChaosSink {
    fn deliver<'a>(&'a self, report: &'a Report) -> SinkFuture<'a> {
        Box::pin(async move {
            if self.faults.hold_next.swap(false, Ordering::SeqCst) {
                self.recorder.record(Event::Note {
                    what: format!(
                        "{} report {} held until the next one is delivered",
                        self.machine,
                        report.position()
                    ),
                });
                *self.faults.held.lock().unwrap_or_else(|p| p.into_inner()) = Some(report.clone());
                return Ok(());
            }
            let result = self.deliver_recorded(report).await;
            *self
                .faults
                .last_report
                .lock()
                .unwrap_or_else(|p| p.into_inner()) = Some(report.clone());
            if result.is_ok() {
                let held = self
                    .faults
                    .held
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .take();
                if let Some(held) = held {
                    // Overtaken: older than the report just filed; the account must refuse it.
                    let _ = self.deliver_recorded(&held).await;
                }
                let per_mille = self.faults.duplicate_per_mille.load(Ordering::SeqCst);
                let roll = self.faults.rolls.fetch_add(1, Ordering::SeqCst);
                if per_mille > 0
                    && (roll.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 54) % 1000
                        < u64::from(per_mille)
                {
                    let _ = self.deliver_recorded(report).await;
                }
            }
            result
        })
    }
}

/// One in-process mesh-host.
pub struct Host {
    pub name: String,
    pub addr: SocketAddr,
    config: PathBuf,
    pub faults: Arc<SinkFaults>,
    running: Option<HostRun>,
}

struct HostRun {
    agent: Arc<Agent>,
    endpoint: Endpoint,
    stop: watch::Sender<bool>,
}

impl Host {
    /// The host's agent, while it runs.
    pub fn agent(&self) -> Option<&Arc<Agent>> {
        self.running.as_ref().map(|r| &r.agent)
    }

    /// The host's endpoint, while it runs.
    pub fn endpoint(&self) -> Option<&Endpoint> {
        self.running.as_ref().map(|r| &r.endpoint)
    }
}

/// The cluster of one run.
pub struct Cluster {
    pub dir: tempfile::TempDir,
    pki: Pki,
    pub replicas: BTreeMap<u64, Running>,
    pub configs: BTreeMap<u64, ReplicaConfig>,
    pub addrs: BTreeMap<u64, SocketAddr>,
    pub clocks: BTreeMap<u64, Arc<JumpClock>>,
    pub hosts: BTreeMap<String, Host>,
    pub operator: Endpoint,
    pub recorder: Recorder,
    /// Backups taken during the run (`snapshot save`), oldest first.
    pub backups: Vec<PathBuf>,
    /// The hostile peer's endpoints (idle unless a hostile fault plays).
    pub hostile: Arc<crate::hostile::Hostile>,
}

/// Why the cluster could not be set up or changed.
#[derive(Debug, thiserror::Error)]
#[error("chaos bed: {0}")]
pub struct BedError(pub String);

fn bed<E: std::fmt::Display>(what: &str) -> impl FnOnce(E) -> BedError + '_ {
    move |e| BedError(format!("{what}: {e}"))
}

impl Cluster {
    /// Three replicas and one host per machine, in a fresh temp dir.
    pub async fn start(recorder: Recorder) -> Result<Cluster, BedError> {
        let dir = tempfile::tempdir().map_err(bed("temp dir"))?;
        let pki = Pki::in_dir(&dir.path().join("pki"));
        let transport = transport().check().map_err(bed("transport config"))?;
        let mut endpoints = BTreeMap::new();
        let mut addrs = BTreeMap::new();
        for id in 1..=replicas_n {
            let e = Endpoint::bind(
                mesh_testkit::loopback(),
                &pki.identity(&Principal::Replica(id)),
                transport.clone(),
            )
            .map_err(bed("bind a replica"))?;
            addrs.insert(id, e.local_addr());
            endpoints.insert(id, e);
        }
        let operator = Endpoint::bind(
            mesh_testkit::loopback(),
            &pki.identity(&Principal::Operator("chaos".into())),
            transport.clone(),
        )
        .map_err(bed("bind the operator"))?;
        let hostile = crate::hostile::Hostile::bind(&pki, &transport).map_err(BedError)?;
        let mut cluster = Cluster {
            dir,
            pki,
            replicas: BTreeMap::new(),
            configs: BTreeMap::new(),
            addrs,
            clocks: BTreeMap::new(),
            hosts: BTreeMap::new(),
            operator,
            recorder,
            backups: Vec::new(),
            hostile: Arc::new(hostile),
        };
        for m in machines {
            let host = cluster.first_host(m).await?;
            cluster.hosts.insert(m.to_string(), host);
        }
        for (id, endpoint) in endpoints {
            let config = cluster.write_config(id)?;
            cluster.configs.insert(id, config.clone());
            let clock = Arc::new(JumpClock::default());
            cluster.clocks.insert(id, clock.clone());
            let running = mesh::controller::start_on(config, endpoint, clock)
                .await
                .map_err(bed("start a replica"))?;
            cluster.replicas.insert(id, running);
        }
        // Replica 1 campaigns now instead of after its first election timeout (0.6–1.2 s): the
        // first leader is not what a run is about. Should the call fail, the timeout elects one.
        if let Some(first) = cluster.replicas.get(&1) {
            let _ = first.service().replica().raft().trigger().elect().await;
        }
        Ok(cluster)
    }

    fn write_config(&self, id: u64) -> Result<ReplicaConfig, BedError> {
        let sub = format!("replica-{id}");
        let (cert, key) = self.pki.write(&sub, &Principal::Replica(id));
        let signing = self.dir.path().join(format!("{sub}.key"));
        write_signing_key(&signing, &replica_key(id)).map_err(bed("signing key"))?;
        let file = ReplicaConfigFile {
            id,
            listen: self.addrs[&id].to_string(),
            data_dir: self.dir.path().join(&sub),
            signing_key: signing,
            tls: TlsFile {
                ca: self.pki.ca_path(),
                cert,
                key,
            },
            peers: self
                .addrs
                .iter()
                .map(|(i, a)| (i.to_string(), a.to_string()))
                .collect(),
            hosts: self
                .hosts
                .iter()
                .map(|(m, h)| (m.clone(), h.addr.to_string()))
                .collect(),
            raft: Some(raft_settings()),
            transport: Some(transport()),
            http: None,
            silent_after_ms: None,
            trusted_keys: self
                .addrs
                .keys()
                .map(|i| {
                    let public = replica_key(*i).verifying_key();
                    (i.to_string(), mesh::hex::encode_hex(public.as_bytes()))
                })
                .collect(),
            join: false,
        };
        let path = self.dir.path().join(format!("{sub}.toml"));
        let text = file.to_toml().map_err(bed("replica.toml"))?;
        std::fs::write(&path, text).map_err(bed("write replica.toml"))?;
        ReplicaConfig::load(&path).map_err(bed("load replica.toml"))
    }

    fn host_toml(
        &self,
        name: &str,
        listen: &str,
        (cert, key): &(PathBuf, PathBuf),
    ) -> Result<PathBuf, BedError> {
        let sub = format!("host-{name}");
        let root = self.dir.path().join(&sub).join("root");
        let trusted: Vec<String> = (1..=replicas_n)
            .map(|id| {
                format!(
                    "{id} = \"{}\"",
                    mesh::hex::encode_hex(replica_key(id).verifying_key().as_bytes())
                )
            })
            .collect();
        let list: Vec<String> = self.addrs.values().map(|a| format!("\"{a}\"")).collect();
        let text = format!(
            "name = \"{name}\"\nroot = \"{}\"\nmounts_root = \"{}\"\nlisten = \"{listen}\"\nreplicas = [{}]\nreconcile_interval_ms = {reconcile_every_ms}\n[tls]\nca = \"{}\"\ncert = \"{}\"\nkey = \"{}\"\n[trusted_keys]\n{}\n",
            root.display(),
            self.dir.path().join(&sub).join("mounts").display(),
            list.join(", "),
            self.pki.ca_path().display(),
            cert.display(),
            key.display(),
            trusted.join("\n")
        );
        let path = self.dir.path().join(format!("{sub}.toml"));
        std::fs::write(&path, text).map_err(bed("write host.toml"))?;
        Ok(path)
    }

    /// A host on a free port; its config is rewritten with that port so a restart binds it again.
    async fn first_host(&self, name: &str) -> Result<Host, BedError> {
        let tls = self
            .pki
            .write(&format!("host-{name}"), &Principal::Host(name.into()));
        let path = self.host_toml(name, "127.0.0.1:0", &tls)?;
        let faults = Arc::new(SinkFaults::default());
        let run = self.run_host(name, &path, &faults).await?;
        let addr = run.endpoint.local_addr();
        let path = self.host_toml(name, &addr.to_string(), &tls)?;
        Ok(Host {
            name: name.to_string(),
            addr,
            config: path,
            faults,
            running: Some(run),
        })
    }

    async fn run_host(
        &self,
        name: &str,
        path: &std::path::Path,
        faults: &Arc<SinkFaults>,
    ) -> Result<HostRun, BedError> {
        let config = HostConfig::load(path).map_err(bed("host config"))?;
        // A restarted host binds its old port, which its last endpoint may hold a moment longer.
        let deadline = tokio::time::Instant::now() + Duration::from_millis(stop_wait_ms);
        let endpoint = loop {
            match listener::bind(&config) {
                Ok(e) => break e,
                Err(e) if tokio::time::Instant::now() >= deadline => {
                    return Err(BedError(format!("host {name} binds: {e}")));
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
            }
        };
        let sink = ChaosSink {
            inner: QuicSink::new(endpoint.clone(), name, config.replicas().to_vec()),
            machine: name.to_string(),
            faults: faults.clone(),
            recorder: self.recorder.clone(),
            replicas: self
                .addrs
                .iter()
                .map(|(id, addr)| (addr.to_string(), *id))
                .collect(),
        };
        let agent = Arc::new(Agent::open(config, Arc::new(sink)).map_err(bed("agent opens"))?);
        agent.start().await.map_err(bed("agent starts"))?;
        let stop = serve_and_reconcile(&endpoint, &agent);
        Ok(HostRun {
            agent,
            endpoint,
            stop,
        })
    }

    /// Stops host `name` (its modules too); it keeps its files.
    pub async fn stop_host(&mut self, name: &str) {
        self.stop_hosts(&[name.to_string()]).await;
    }

    /// Stops the hosts `names` (their modules too) at once; they keep their files.
    pub async fn stop_hosts(&mut self, names: &[String]) {
        let mut stops = Vec::new();
        for name in names {
            let Some(run) = self.hosts.get_mut(name).and_then(|h| h.running.take()) else {
                continue;
            };
            stops.push((
                name.clone(),
                tokio::spawn(async move {
                    let _ = run.stop.send(true);
                    run.endpoint.close().await;
                    let _ = tokio::time::timeout(
                        Duration::from_millis(stop_wait_ms),
                        run.agent.shutdown(),
                    )
                    .await;
                }),
            ));
        }
        for (name, stop) in stops {
            let _ = stop.await;
            self.recorder.record(Event::Restart {
                who: format!("host {name}"),
                up: false,
            });
        }
    }

    /// Starts host `name` again from its files on its old address.
    pub async fn restart_host(&mut self, name: &str) -> Result<(), BedError> {
        let Some(host) = self.hosts.get(name) else {
            return Err(BedError(format!("no host {name}")));
        };
        if host.running.is_some() {
            return Ok(());
        }
        let (path, faults) = (host.config.clone(), host.faults.clone());
        let run = self.run_host(name, &path, &faults).await?;
        if let Some(host) = self.hosts.get_mut(name) {
            host.running = Some(run);
        }
        self.recorder.record(Event::Restart {
            who: format!("host {name}"),
            up: true,
        });
        Ok(())
    }

    /// Stops replica `id` as a crash looks to the others: cut off first (no handover reaches
    /// anyone, nothing more leaves), then stopped. Its files stay.
    pub async fn crash_replica(&mut self, id: u64) {
        self.isolate(id, true, true);
        self.cut_hosts(id);
        if let Some(running) = self.replicas.remove(&id) {
            let stopped =
                tokio::time::timeout(Duration::from_millis(stop_wait_ms), running.shutdown()).await;
            let what = match stopped {
                Ok(Ok(_)) => "stopped".to_string(),
                Ok(Err(e)) => format!("stopped with an error: {e}"),
                Err(_) => format!("did not stop within {stop_wait_ms} ms"),
            };
            self.recorder.record(Event::Note {
                what: format!("replica {id} {what}"),
            });
            self.recorder.record(Event::Restart {
                who: format!("replica {id}"),
                up: false,
            });
        }
    }

    /// [`Cluster::crash_replica`] of a replica whose state machine unwound mid-install: its Raft
    /// core is stopped first, as a process's death stops it. Otherwise the install's request
    /// waits on the core for good, holding the service, so the replica cannot stop and its port
    /// stays bound (a real process exits there, decision 0183).
    pub async fn crash_replica_raft_first(&mut self, id: u64) {
        self.isolate(id, true, true);
        self.cut_hosts(id);
        if let Some(running) = self.replicas.get(&id) {
            let raft = running.service().replica().raft().clone();
            let stopped =
                tokio::time::timeout(Duration::from_millis(stop_wait_ms), raft.shutdown()).await;
            if stopped.is_err() {
                self.recorder.record(Event::Note {
                    what: format!("replica {id}'s Raft did not stop within {stop_wait_ms} ms"),
                });
            }
        }
        self.crash_replica(id).await;
    }

    /// Starts replica `id` again from its config and files, on its old address and clock.
    pub async fn restart_replica(&mut self, id: u64) -> Result<(), BedError> {
        if self.replicas.contains_key(&id) {
            return Ok(());
        }
        let transport = transport().check().map_err(bed("transport config"))?;
        // The port was just released; binding it again may need a moment.
        let deadline = tokio::time::Instant::now() + Duration::from_millis(stop_wait_ms);
        let endpoint = loop {
            match Endpoint::bind(
                self.addrs[&id],
                &self.pki.identity(&Principal::Replica(id)),
                transport.clone(),
            ) {
                Ok(e) => break e,
                Err(e) if tokio::time::Instant::now() >= deadline => {
                    return Err(BedError(format!("rebind replica {id}: {e}")));
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
            }
        };
        for other in self.replicas.values() {
            other.service().endpoint().faults().heal(self.addrs[&id]);
        }
        for host in self.hosts.values() {
            if let Some(e) = host.endpoint() {
                e.faults().heal(self.addrs[&id]);
            }
        }
        let running = mesh::controller::start_on(
            self.configs[&id].clone(),
            endpoint,
            self.clocks[&id].clone(),
        )
        .await
        .map_err(bed("restart a replica"))?;
        self.replicas.insert(id, running);
        self.recorder.record(Event::Restart {
            who: format!("replica {id}"),
            up: true,
        });
        Ok(())
    }

    /// A lost disk: replica `id`'s store and epoch-floor file removed (its keys, certificate and
    /// config stay), as `tests/bed_restore.rs` wipes one. The replica must be stopped.
    pub fn wipe_store(&self, id: u64, floor_too: bool) -> Result<(), BedError> {
        let dir = self.configs[&id].data_dir();
        let mut files = vec![dir.join(mesh_raft::store_file_name)];
        if floor_too {
            files.push(dir.join(mesh::controller::floor::floor_file_name));
        }
        for path in files {
            match std::fs::remove_file(&path) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(BedError(format!("remove {}: {e}", path.display()))),
            }
        }
        Ok(())
    }

    /// A backup as `meshctl snapshot save` takes it: every chunk of one held snapshot, asked of
    /// replica `via`, written to `name` in the run's dir.
    pub async fn save_snapshot(&self, via: u64, name: &str) -> Result<PathBuf, BedError> {
        let mut bytes = Vec::new();
        let mut held = None;
        for _ in 0..snapshot_chunks_max {
            let call = Cluster::call(Request::SnapshotChunk {
                snapshot: held,
                offset: bytes.len() as u64,
            })
            .map_err(BedError)?;
            let answer = self.ask(via, &call).await.map_err(bed("snapshot save"))?;
            match answer.body {
                Ok(mesh::controller::api::Body::SnapshotChunk {
                    snapshot,
                    total,
                    bytes: chunk,
                    ..
                }) => {
                    held = Some(snapshot);
                    bytes.extend_from_slice(&chunk);
                    if bytes.len() as u64 >= total || chunk.is_empty() {
                        let path = self.dir.path().join(name);
                        std::fs::write(&path, &bytes).map_err(bed("write the snapshot"))?;
                        return Ok(path);
                    }
                }
                Ok(other) => return Err(BedError(format!("snapshot save: answered {other:?}"))),
                Err(e) => return Err(BedError(format!("snapshot save via replica {via}: {e}"))),
            }
        }
        Err(BedError(format!(
            "snapshot save took more than {snapshot_chunks_max} chunks"
        )))
    }

    /// Stops every replica, as an operator stops them all before a restore: the followers at
    /// once, then the leader (whose handover finds no one and gives up at once, instead of
    /// waiting out its 2 s for followers that are stopping); their files stay.
    pub async fn stop_replicas(&mut self) {
        let leader = self.leader().map(|(id, _)| id);
        let followers: Vec<u64> = self
            .replicas
            .keys()
            .copied()
            .filter(|id| Some(*id) != leader)
            .collect();
        self.stop_these(&followers).await;
        if let Some(leader) = leader {
            self.stop_these(&[leader]).await;
        }
    }

    async fn stop_these(&mut self, ids: &[u64]) {
        let running: Vec<Running> = ids
            .iter()
            .filter_map(|id| self.replicas.remove(id))
            .collect();
        stop_at_once(running).await;
        for id in ids {
            self.recorder.record(Event::Restart {
                who: format!("replica {id}"),
                up: false,
            });
        }
    }

    /// Replica `id` (stopped) restored from the backup `file` as `meshd restore` does
    /// (`mesh::controller::restore::restore`): its store removed first (restore refuses an
    /// existing one) and, with `floor_too`, its epoch-floor file (a new disk). Returns the term
    /// floor the restore set.
    pub async fn restore_replica(
        &self,
        id: u64,
        file: &std::path::Path,
        floor_too: bool,
    ) -> Result<u64, BedError> {
        self.wipe_store(id, floor_too)?;
        let restored = mesh::controller::restore::restore(&self.configs[&id], file)
            .await
            .map_err(bed("meshd restore"))?;
        Ok(restored.term_floor)
    }

    /// Cuts replica `id` off from the other replicas: `out` its messages to them, `inward`
    /// theirs to it.
    pub fn isolate(&self, id: u64, out: bool, inward: bool) {
        for (other, addr) in &self.addrs {
            if *other == id {
                continue;
            }
            if out && let Some(r) = self.replicas.get(&id) {
                r.service().endpoint().faults().cut_off(*addr);
            }
            if inward && let Some(r) = self.replicas.get(other) {
                r.service().endpoint().faults().cut_off(self.addrs[&id]);
            }
        }
    }

    /// Cuts replica `id` off from every host, both ways.
    pub fn cut_hosts(&self, id: u64) {
        for host in self.hosts.values() {
            if let Some(r) = self.replicas.get(&id) {
                r.service().endpoint().faults().cut_off(host.addr);
            }
            if let Some(e) = host.endpoint() {
                e.faults().cut_off(self.addrs[&id]);
            }
        }
    }

    /// The endpoint of replica `id`, while it runs.
    pub fn replica_endpoint(&self, id: u64) -> Option<&Endpoint> {
        self.replicas.get(&id).map(|r| r.service().endpoint())
    }

    /// Every endpoint of the run with every peer address it may fault.
    pub fn heal_all(&self) -> Vec<&Endpoint> {
        let mut all: Vec<&Endpoint> = self
            .replicas
            .values()
            .map(|r| r.service().endpoint())
            .collect();
        all.extend(self.hosts.values().filter_map(|h| h.endpoint()));
        for e in &all {
            e.faults().heal_all();
        }
        for h in self.hosts.values() {
            h.faults.hold_next.store(false, Ordering::SeqCst);
            h.faults.duplicate_per_mille.store(0, Ordering::SeqCst);
        }
        all
    }

    /// The replica that leads now by its own metrics, highest term first.
    pub fn leader(&self) -> Option<(u64, u64)> {
        self.replicas
            .iter()
            .filter_map(|(id, r)| {
                let m = r.service().replica().metrics().borrow().clone();
                (m.state == openraft::ServerState::Leader).then_some((*id, m.current_term))
            })
            .max_by_key(|(_, term)| *term)
    }

    /// Sends `call` to replica `via` as the operator; `None` when no answer came in time.
    pub async fn ask(&self, via: u64, call: &Call) -> Result<Answer, String> {
        let timeout = Duration::from_millis(request_timeout_ms);
        ask_over(&self.operator, self.addrs[&via], via, call, timeout).await
    }

    /// A new call of `request`.
    pub fn call(request: Request) -> Result<Call, String> {
        Call::new(request).ok_or_else(|| "the OS random source failed".to_string())
    }

    /// Stops everything once the run is checked: every replica at once (one after the other,
    /// each stop handed leadership to the next one to stop, about a second and a half each),
    /// then the hosts and their modules, at once.
    pub async fn shutdown(mut self) {
        stop_at_once(std::mem::take(&mut self.replicas).into_values()).await;
        let names: Vec<String> = self.hosts.keys().cloned().collect();
        self.stop_hosts(&names).await;
        self.operator.close().await;
        self.hostile.close().await;
    }
}

/// Shuts `replicas` down all at once, each within [`stop_wait_ms`] (one after the other, each
/// stop would hand leadership to the next one to stop).
async fn stop_at_once(replicas: impl IntoIterator<Item = Running>) {
    let stops: Vec<_> = replicas
        .into_iter()
        .map(|running| {
            tokio::spawn(tokio::time::timeout(
                Duration::from_millis(stop_wait_ms),
                running.shutdown(),
            ))
        })
        .collect();
    for stop in stops {
        let _ = stop.await;
    }
}

/// Sends `call` as the operator of `operator` to replica `via` at `addr` (checked against its
/// certificate), waiting at most `timeout`; the bed's and the simulator's one way to ask.
pub(crate) async fn ask_over(
    operator: &Endpoint,
    addr: SocketAddr,
    via: u64,
    call: &Call,
    timeout: Duration,
) -> Result<Answer, String> {
    let body = mesh_codec::encode("request", call).map_err(|e| e.to_string())?;
    let peer = Peer::expecting(addr, Principal::Replica(via));
    let bytes = operator
        .request(peer, MessageKind::Command, body, timeout)
        .await
        .map_err(|e| e.to_string())?;
    mesh_codec::decode("answer", &bytes).map_err(|e| e.to_string())
}

/// A started host agent put to work as mesh-host does: its listener on `endpoint` and its
/// reconcile loop, which stops when the returned sender says `true`. The listener's fatal
/// channel (the host's disk failed) is not watched: a run notices such a host as one that stops
/// applying (convergence fails).
pub(crate) fn serve_and_reconcile(endpoint: &Endpoint, agent: &Arc<Agent>) -> watch::Sender<bool> {
    let _fatal = listener::serve(endpoint, agent.clone());
    let (stop, stop_rx) = watch::channel(false);
    let agent = agent.clone();
    tokio::spawn(async move { agent.reconcile(stop_rx).await });
    stop
}
