//! Cluster benchmark (plain `Instant`, prints figures): three replicas over real QUIC on loopback with
//! in-process hosts. Commit throughput (1, 64, 500 clients), failover, `push --behind` to N hosts;
//! the memory of a real `meshd` process with 10,000 machines applied, composed and sent to 10,000
//! simulated hosts; and failover of the real binaries (`kill`: SIGKILL, then
//! SIGTERM, of the leader → new leader → host applies its envelope, and → `meshctl push` through a
//! survivor succeeds). Run with `cargo bench --bench cluster [-- <section>...]` (sections: throughput,
//! failover, kill, push, memory); figures go to docs/benchmarks.md.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};

/// The allocator meshd runs with (decision 0184), so the in-process replicas allocate as meshd does.
#[global_allocator]
static allocator: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;
/// jemalloc's settings, read at its start: a background thread returns freed pages after a second
/// instead of at the next allocation (decision 0184). A thin pointer to a NUL-terminated string,
/// as jemalloc's `malloc_conf` is a `const char *`.
// SAFETY: jemalloc reads this symbol once, as a C string; it is NUL-terminated and immutable.
#[unsafe(export_name = "_rjem_malloc_conf")]
static malloc_conf: &[u8; 60] = b"background_thread:true,dirty_decay_ms:1000,muzzy_decay_ms:0\0";
use ed25519_dalek::SigningKey;
use mesh::controller::api::{Answer, Body, PushOutcome, PushTarget, Request};
use mesh::controller::config::{ReplicaConfig, ReplicaConfigFile, TlsFile, write_signing_key};
use mesh::controller::{Running, Service};
use mesh::core::model::{Machine, Mesh, Module};
use mesh::core::settings::Scope;
use mesh::host::config::encode_hex;
use mesh::host::{Agent, HostConfig, QuicSink, listener};
use mesh::store::app::decode_outcome;
use mesh::store::command::{Command, Outcome, Proposal};
use mesh_raft::{MonotonicClock, RaftSettings};
use mesh_transport::{
    Ca, Endpoint, Identity, MessageKind, Peer, Principal, TransportConfig, Validity,
};
use openraft::ServerState;
use tokio::sync::watch;

const throughput_clients: [usize; 3] = [1, 64, 500];
const throughput_warmup_ms: u64 = 1_000;
const throughput_measure_ms: u64 = 5_000;
/// One operator endpoint per this many clients: a connection allows 256 concurrent streams.
const clients_per_operator: usize = 200;
const failover_runs: usize = 5;
/// Runs of the real-binaries failover (`kill`), as docs/benchmarks.md reports them.
const kill_runs: usize = 20;
const push_hosts: [usize; 3] = [100, 300, 1_000];
const memory_machines: usize = 10_000;
const memory_modules_per_machine: usize = 10;
/// How long the memory section waits, idle, before its settled RSS figure.
const settle_s: u64 = 5;
/// How long any awaited condition (a leader, reports) may take before the bench gives up.
const wait_deadline_ms: u64 = 120_000;
const request_timeout_ms: u64 = 120_000;
/// Most `push --behind` requests the bench repeats until every machine was applied.
const push_rounds_max: usize = 20;
/// The most machines the memory bench pushes again one by one after its `push --all`.
const memory_repush_max: usize = 500;
/// How long every pushed machine's report may take to be filed (two host report ticks).
const confirm_deadline_ms: u64 = 25_000;
const poll_ms: u64 = 5;

fn main() -> Result<()> {
    let sections: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with('-'))
        .collect();
    let run = |name: &str| sections.is_empty() || sections.iter().any(|s| s == name);
    print_machine();
    bench_log();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("tokio runtime")?;
    runtime.block_on(async {
        if run("throughput") {
            throughput().await?;
        }
        if run("failover") {
            failover("default timeouts", RaftSettings::default()).await?;
            failover("test-bed timeouts", fast_raft()).await?;
        }
        if run("kill") {
            // Real processes, driven from a thread of their own (the bed blocks).
            tokio::task::spawn_blocking(kill_failover)
                .await
                .context("kill section")??;
        }
        if run("push") {
            push_behind().await?;
        }
        if run("memory") {
            memory().await?;
        }
        Ok(())
    })
}

/// With `MESH_BENCH_LOG=<filter>` (a `RUST_LOG` filter, e.g. `mesh=info,mesh_raft=debug`), the
/// in-process replicas' and hosts' log lines go to stderr with their thread's name, to see where
/// a lease round or an answer waited. Off unless set: no subscriber, no cost.
fn bench_log() {
    let Ok(filter) = std::env::var("MESH_BENCH_LOG") else {
        return;
    };
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
        .with_thread_names(true)
        .with_ansi(false)
        .init();
}

fn print_machine() {
    let nproc = std::thread::available_parallelism().map_or(0, |n| n.get());
    let model = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|t| {
            t.lines()
                .find(|l| l.starts_with("model name"))
                .map(|l| l.split(':').nth(1).unwrap_or("").trim().to_string())
        })
        .unwrap_or_default();
    let nofile = std::fs::read_to_string("/proc/self/limits")
        .ok()
        .and_then(|t| {
            t.lines()
                .find(|l| l.starts_with("Max open files"))
                .map(str::to_string)
        })
        .unwrap_or_default();
    println!("machine: nproc {nproc}, model \"{model}\", {nofile}");
    println!("load average at start: {}", load_average());
}

fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|t| t.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

fn loopback() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 0))
}

/// Replica `id`'s own loopback address in the push bed, `127.0.0.<id + 1>` (Linux answers the
/// whole of 127/8 on `lo`); the hosts, the operator and the bench stay on 127.0.0.1.
fn replica_loopback(id: u64) -> SocketAddr {
    let last = u8::try_from(id + 1).unwrap_or(u8::MAX);
    SocketAddr::from(([127, 0, 0, last], 0))
}

fn replica_key(id: u64) -> SigningKey {
    SigningKey::from_bytes(&[id as u8 + 40; 32])
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let i = ((sorted.len() - 1) as f64 * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// One in-process mesh-host: agent, listener and reconcile loop.
struct Host {
    agent: Arc<Agent>,
    endpoint: Endpoint,
    stop: watch::Sender<bool>,
}

/// Replicas, hosts and operator endpoints in one temp dir.
struct Bed {
    dir: tempfile::TempDir,
    ca: Ca,
    replicas: BTreeMap<u64, Running>,
    addrs: BTreeMap<u64, SocketAddr>,
    hosts: Vec<Host>,
    operators: Vec<Endpoint>,
    /// With hosts on a runtime of their own, each replica's service runs on one of these, as in a
    /// meshd process of its own; last, so they stop after the replicas.
    replica_runtimes: Vec<BenchRuntime>,
    /// Where the hosts keep their state when not under `dir`: the push bench's hosts write on
    /// `/dev/shm` (decision 0335), as each real host writes on a disk of its own; the replicas'
    /// stores stay on the disk.
    host_disk: Option<tempfile::TempDir>,
}

impl Bed {
    async fn start(
        replicas: u64,
        hosts: usize,
        raft: RaftSettings,
        operators: usize,
    ) -> Result<Bed> {
        Bed::start_with_hosts_on(replicas, hosts, raft, operators, None).await
    }

    /// [`Bed::start`]; with `hosts_on`, every host agent (its endpoint, listener, reporter and
    /// the fsync'd writes it makes on the tasks that receive envelopes) runs on that runtime, as
    /// if in a process of its own, instead of on the replicas' worker threads (decision 0271).
    async fn start_with_hosts_on(
        replicas: u64,
        hosts: usize,
        raft: RaftSettings,
        operators: usize,
        hosts_on: Option<&tokio::runtime::Handle>,
    ) -> Result<Bed> {
        let dir = tempfile::tempdir().context("tempdir")?;
        let ca = Ca::create(Validity::days_from_now(1))?;
        std::fs::create_dir_all(dir.path().join("pki"))?;
        std::fs::write(dir.path().join("pki/ca.pem"), ca.cert_pem())?;
        let mut bed = Bed {
            dir,
            ca,
            replicas: BTreeMap::new(),
            addrs: BTreeMap::new(),
            hosts: Vec::new(),
            operators: Vec::new(),
            replica_runtimes: Vec::new(),
            host_disk: match hosts_on {
                Some(_) if std::path::Path::new(host_disk_root).is_dir() => Some(
                    tempfile::tempdir_in(host_disk_root)
                        .with_context(|| format!("a temp dir in {host_disk_root}"))?,
                ),
                _ => None,
            },
        };
        let mut endpoints = BTreeMap::new();
        for id in 1..=replicas {
            // As meshd binds it: driven on the replica's Raft thread (decision 0320).
            let raft_runtime = mesh::controller::RaftRuntime::new(id)?;
            let identity = bed.identity(&Principal::Replica(id))?;
            let config = transport()?;
            // The push bed's replicas each on a loopback address of their own, as replicas are
            // machines apart from the hosts (decision 0338): on 127.0.0.1 with 10,000 hosts, a
            // replica's dial to another was refused by the per-IP handshake cap the hosts' own
            // handshakes filled (decision 0300).
            let listen = match hosts_on {
                Some(_) => replica_loopback(id),
                None => loopback(),
            };
            let e = raft_runtime.enter(|| Endpoint::bind(listen, &identity, config))?;
            bed.addrs.insert(id, e.local_addr());
            endpoints.insert(id, (e, raft_runtime));
        }
        let mut host_addrs = BTreeMap::new();
        for i in 0..hosts {
            let name = host_name(i);
            let host = match hosts_on {
                None => bed.start_host(&name).await?,
                Some(runtime) => {
                    let config = bed.host_config(&name)?;
                    runtime
                        .spawn(run_host(config))
                        .await
                        .context("the host's task")??
                }
            };
            host_addrs.insert(name, host.endpoint.local_addr().to_string());
            bed.hosts.push(host);
        }
        for _ in 0..operators.max(1) {
            let principal = Principal::Operator("bench".into());
            bed.operators.push(Endpoint::bind(
                loopback(),
                &bed.identity(&principal)?,
                transport()?,
            )?);
        }
        for (id, (endpoint, raft_runtime)) in endpoints {
            let config = bed.write_config(id, &host_addrs, &raft)?;
            let clock = Arc::new(MonotonicClock);
            let start = mesh::controller::start_in(config, endpoint, clock, raft_runtime);
            let running = if hosts_on.is_some() {
                // As meshd: every replica a process of its own, its operators, hosts and peers
                // served on its own workers. On the bench's shared workers a follower answered
                // the leader only once the push's fan-out left it a turn, and at 10,000 hosts
                // every lease round failed on the quorum (twelfth session).
                let runtime = BenchRuntime::new(&format!("replica-{id}"), replica_threads)?;
                let running = runtime
                    .spawn(start)
                    .await
                    .context("the replica's start task")?;
                bed.replica_runtimes.push(runtime);
                running
            } else {
                start.await
            };
            let running = running.with_context(|| format!("replica {id} starts"))?;
            bed.replicas.insert(id, running);
        }
        Ok(bed)
    }

    fn identity(&self, principal: &Principal) -> Result<Identity> {
        let cert = self.ca.issue(principal, Validity::days_from_now(1))?;
        Ok(Identity::from_pem(
            self.ca.cert_pem(),
            cert.cert_pem(),
            cert.key_pem(),
        )?)
    }

    fn write_cert(&self, sub: &str, principal: &Principal) -> Result<(PathBuf, PathBuf)> {
        let dir = self.dir.path().join("pki").join(sub);
        std::fs::create_dir_all(&dir)?;
        let cert = self.ca.issue(principal, Validity::days_from_now(1))?;
        let (c, k) = (dir.join("cert.pem"), dir.join("key.pem"));
        cert.write(&c, &k)?;
        Ok((c, k))
    }

    fn write_config(
        &self,
        id: u64,
        hosts: &BTreeMap<String, String>,
        raft: &RaftSettings,
    ) -> Result<ReplicaConfig> {
        let sub = format!("replica-{id}");
        let (cert, key) = self.write_cert(&sub, &Principal::Replica(id))?;
        let signing = self.dir.path().join(format!("{sub}.key"));
        write_signing_key(&signing, &replica_key(id))?;
        let file = ReplicaConfigFile {
            id,
            listen: self.addrs[&id].to_string(),
            data_dir: self.dir.path().join(&sub),
            signing_key: signing,
            tls: TlsFile {
                ca: self.dir.path().join("pki/ca.pem"),
                cert,
                key,
            },
            peers: self
                .addrs
                .iter()
                .map(|(i, a)| (i.to_string(), a.to_string()))
                .collect(),
            hosts: hosts.clone(),
            raft: Some(raft.clone()),
            transport: Some(TransportConfig::default()),
            http: None,
            silent_after_ms: None,
            trusted_keys: Default::default(),
            join: false,
        };
        let path = self.dir.path().join(format!("{sub}.toml"));
        std::fs::write(&path, file.to_toml()?)?;
        Ok(ReplicaConfig::load(&path)?)
    }

    async fn start_host(&self, name: &str) -> Result<Host> {
        run_host(self.host_config(name)?).await
    }

    /// Writes `name`'s certificate and host.toml and loads it.
    fn host_config(&self, name: &str) -> Result<HostConfig> {
        let dir = self.dir.path();
        let disk = self.host_disk.as_ref().map_or(dir, |d| d.path());
        let sub = format!("host-{name}");
        let (cert, key) = self.write_cert(&sub, &Principal::Host(name.into()))?;
        let trusted: Vec<String> = (1..=3u64)
            .map(|id| {
                format!(
                    "{id} = \"{}\"",
                    encode_hex(replica_key(id).verifying_key().as_bytes())
                )
            })
            .collect();
        let list: Vec<String> = self.addrs.values().map(|a| format!("\"{a}\"")).collect();
        // Default reconcile interval (10 s): the host reports on every apply and then every tick.
        let text = format!(
            "name = \"{name}\"\nroot = \"{}\"\nmounts_root = \"{}\"\nlisten = \"127.0.0.1:0\"\nreplicas = [{}]\n[tls]\nca = \"{}\"\ncert = \"{}\"\nkey = \"{}\"\n[trusted_keys]\n{}\n",
            disk.join(&sub).join("root").display(),
            disk.join(&sub).join("mounts").display(),
            list.join(", "),
            dir.join("pki/ca.pem").display(),
            cert.display(),
            key.display(),
            trusted.join("\n")
        );
        let path = dir.join(format!("{sub}.toml"));
        std::fs::write(&path, text)?;
        Ok(HostConfig::load(&path)?)
    }

    fn service(&self, id: u64) -> Result<&Arc<Service>> {
        self.replicas
            .get(&id)
            .map(Running::service)
            .ok_or_else(|| anyhow!("replica {id} is not running"))
    }

    /// Waits until one of `among` leads in a term above `above`; returns it and its term.
    async fn wait_leader(&self, among: &[u64], above: u64) -> Result<(u64, u64)> {
        let deadline = Instant::now() + Duration::from_millis(wait_deadline_ms);
        loop {
            for id in among {
                let m = self.service(*id)?.replica().metrics().borrow().clone();
                if m.state == ServerState::Leader && m.current_term > above {
                    return Ok((*id, m.current_term));
                }
            }
            if Instant::now() > deadline {
                bail!("no leader above term {above} among {among:?}");
            }
            tokio::time::sleep(Duration::from_millis(poll_ms)).await;
        }
    }

    async fn ask_via(&self, operator: usize, id: u64, request: &Request) -> Result<Answer> {
        let call = mesh::controller::api::Call::new(request.clone())
            .ok_or_else(|| anyhow::anyhow!("the OS random source failed"))?;
        let body = mesh_codec::encode("request", &call)?;
        let peer = Peer::expecting(self.addrs[&id], Principal::Replica(id));
        let endpoint = &self.operators[operator % self.operators.len()];
        // 10,000 hosts dialling in at once from this one address fill the replicas' handshake
        // slots for it (decision 0300): a refused handshake sent nothing, so the same call (one
        // request id) is asked again until the operator's handshake gets a slot. Not a push: one
        // that was written and lost its connection must count as the push it was.
        let retry = !matches!(request, Request::Push { .. });
        let deadline = Instant::now() + Duration::from_millis(wait_deadline_ms);
        let bytes = loop {
            let asked = endpoint
                .request(
                    peer.clone(),
                    MessageKind::Command,
                    body.clone(),
                    Duration::from_millis(request_timeout_ms),
                )
                .await;
            match asked {
                Err(mesh_transport::TransportError::Unreachable { .. })
                    if retry && Instant::now() < deadline =>
                {
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                other => break other?,
            }
        };
        Ok(mesh_codec::decode("answer", &bytes)?)
    }

    async fn ok(&self, id: u64, request: &Request) -> Result<Body> {
        self.ask_via(0, id, request)
            .await?
            .body
            .map_err(|e| anyhow!("{e}"))
    }

    /// Cuts replica `id` off from the other replicas, both directions (as if it had died).
    fn isolate(&self, id: u64, cut: bool) -> Result<()> {
        for (other, addr) in &self.addrs {
            if *other == id {
                continue;
            }
            let (mine, theirs) = (
                self.service(id)?.endpoint(),
                self.service(*other)?.endpoint(),
            );
            if cut {
                mine.faults().cut_off(*addr);
                theirs.faults().cut_off(self.addrs[&id]);
            } else {
                mine.faults().heal(*addr);
                theirs.faults().heal(self.addrs[&id]);
            }
        }
        Ok(())
    }

    async fn shutdown(mut self) -> Result<()> {
        for (_, running) in std::mem::take(&mut self.replicas) {
            running.shutdown().await?;
        }
        // All at once: each close may wait up to a second for its peers, 1,000 hosts in turn
        // took minutes.
        let hosts = std::mem::take(&mut self.hosts)
            .into_iter()
            .map(|host| async move {
                let _ = host.stop.send(true);
                host.endpoint.close().await;
                host.agent.shutdown().await;
            });
        futures::future::join_all(hosts).await;
        for op in &self.operators {
            op.close().await;
        }
        Ok(())
    }
}

/// Starts one host agent from its config on the current runtime: endpoint, listener, reporter.
async fn run_host(config: HostConfig) -> Result<Host> {
    let name = config.name().to_string();
    let endpoint = listener::bind(&config)?;
    let sink = QuicSink::new(endpoint.clone(), &name, config.replicas().to_vec());
    let agent = Arc::new(Agent::open(config, Arc::new(sink))?);
    agent.start().await?;
    let _fatal = listener::serve(&endpoint, agent.clone());
    let (stop, stop_rx) = watch::channel(false);
    {
        let agent = agent.clone();
        tokio::spawn(async move { agent.reconcile(stop_rx).await });
    }
    Ok(Host {
        agent,
        endpoint,
        stop,
    })
}

fn transport() -> Result<mesh_transport::CheckedConfig> {
    Ok(TransportConfig::default().check()?)
}

fn client_machine(client: usize) -> String {
    format!("c{client}")
}

fn host_name(i: usize) -> String {
    format!("h{i:04}")
}

fn machine(name: &str) -> Machine {
    Machine {
        name: name.into(),
        address: "127.0.0.1".into(),
    }
}

// ---------------------------------------------------------------------------------------------
// 1. Commit throughput

/// Latencies of the requests that finished inside the measured window.
struct Level {
    completed: usize,
    failed: usize,
    latencies: Vec<Duration>,
}

fn print_level(path: &str, clients: usize, level: &mut Level) {
    level.latencies.sort();
    let rate = level.completed as f64 / (throughput_measure_ms as f64 / 1e3);
    println!(
        "throughput {path}, {clients} clients: {rate:.0} commits/s, p50 {:.2} ms, p99 {:.2} ms ({} in {} s, {} failed, load {})",
        ms(percentile(&level.latencies, 0.50)),
        ms(percentile(&level.latencies, 0.99)),
        level.completed,
        throughput_measure_ms / 1000,
        level.failed,
        load_average()
    );
}

/// Runs `clients` loops of `one` (client index, request number) and keeps what finished inside the
/// measured window that follows the warm-up.
async fn drive<F, Fut>(clients: usize, one: F) -> Level
where
    F: Fn(usize, u64) -> Fut + Clone + Send + 'static,
    Fut: std::future::Future<Output = Result<()>> + Send,
{
    let start = Instant::now();
    let from = start + Duration::from_millis(throughput_warmup_ms);
    let until = from + Duration::from_millis(throughput_measure_ms);
    let mut tasks = Vec::new();
    for client in 0..clients {
        let one = one.clone();
        tasks.push(tokio::spawn(async move {
            let mut kept = Vec::new();
            let mut failed = 0;
            let mut n = 0u64;
            while Instant::now() < until {
                let started = Instant::now();
                let result = one(client, n).await;
                let done = Instant::now();
                n += 1;
                // Completions inside the window count, whenever they started: with seconds of
                // queueing, requiring the start inside the window too would drop the slow ones.
                if done >= from && done <= until {
                    match result {
                        Ok(()) => kept.push(done - started),
                        Err(_) => failed += 1,
                    }
                }
            }
            (kept, failed)
        }));
    }
    let mut level = Level {
        completed: 0,
        failed: 0,
        latencies: Vec::new(),
    };
    for task in tasks {
        if let Ok((kept, failed)) = task.await {
            level.completed += kept.len();
            level.failed += failed;
            level.latencies.extend(kept);
        }
    }
    level
}

async fn throughput() -> Result<()> {
    let operators = throughput_clients.iter().max().unwrap_or(&1) / clients_per_operator + 1;
    let bed = Arc::new(Bed::start(3, 0, RaftSettings::default(), operators).await?);
    let ids: Vec<u64> = bed.replicas.keys().copied().collect();
    let (leader, term) = bed.wait_leader(&ids, 0).await?;
    println!("throughput: leader {leader}, term {term}");
    // One machine per client, so each operator client edits its own settings layer (a shared
    // layer would grow with the clients and every write would copy it into the history).
    let mut mesh = Mesh::default();
    for client in 0..throughput_clients.iter().copied().max().unwrap_or(1) {
        let name = client_machine(client);
        mesh.machines.insert(name.clone(), machine(&name));
    }
    let apply = Request::Apply {
        mesh,
        why: "bench".into(),
        drain: false,
    };
    bed.ok(leader, &apply).await?;
    for clients in throughput_clients {
        // Store path: a proposal through the leader's Raft (QUIC replication, redb on every
        // replica, domain apply), as the controller proposes reports and send records.
        let service = bed.service(leader)?.clone();
        let mut level = drive(clients, move |client, _| {
            let service = service.clone();
            async move { propose_hold(&service, term, client).await }
        })
        .await;
        print_level("store path (propose SetHolds)", clients, &mut level);
        // Operator API: `settings set` over QUIC to the leader (lease round, CAS on the revision).
        let b = bed.clone();
        let mut level = drive(clients, move |client, n| {
            let b = b.clone();
            async move { settings_set(&b, leader, client, n).await }
        })
        .await;
        print_level("operator API (settings set)", clients, &mut level);
    }
    match Arc::try_unwrap(bed) {
        Ok(bed) => bed.shutdown().await,
        Err(_) => bail!("the throughput bed is still shared"),
    }
}

async fn propose_hold(service: &Service, term: u64, client: usize) -> Result<()> {
    let proposal = Proposal {
        epoch: term,
        expect_revision: None,
        actor: "bench".into(),
        time_ms: 0,
        command: Command::SetHolds {
            machine: format!("c{client}"),
            holds: vec![],
        },
    };
    let bytes = mesh_codec::encode("proposal", &proposal)?;
    let done = service.replica().propose(bytes).await?;
    match decode_outcome(&done.response)? {
        Outcome::Applied(_) => Ok(()),
        Outcome::Refused(r) => bail!("refused: {r}"),
    }
}

async fn settings_set(bed: &Bed, leader: u64, client: usize, n: u64) -> Result<()> {
    let request = Request::SettingsSet {
        scope: Scope::Machine(client_machine(client)),
        layer: BTreeMap::from([("k".to_string(), n.to_string())]),
        remove: BTreeSet::new(),
        replace: false,
        why: "bench".into(),
    };
    let answer = bed
        .ask_via(client / clients_per_operator, leader, &request)
        .await?;
    answer.body.map(|_| ()).map_err(|e| anyhow!("{e}"))
}

// ---------------------------------------------------------------------------------------------
// 2. Failover

/// The controller tests' settings (heartbeat 50 ms, election 500–1000 ms), for comparison only.
fn fast_raft() -> RaftSettings {
    RaftSettings {
        heartbeat_ms: 50,
        election_timeout_min_ms: 500,
        election_timeout_max_ms: 1000,
        lease_margin_ms: 100,
        ..RaftSettings::default()
    }
}

async fn failover(label: &str, raft: RaftSettings) -> Result<()> {
    println!(
        "failover with {label}: heartbeat {} ms, election {}-{} ms",
        raft.heartbeat_ms, raft.election_timeout_min_ms, raft.election_timeout_max_ms
    );
    let bed = Bed::start(3, 1, raft, 1).await?;
    let ids: Vec<u64> = bed.replicas.keys().copied().collect();
    let (leader, _) = bed.wait_leader(&ids, 0).await?;
    let name = host_name(0);
    let mut mesh = Mesh::default();
    mesh.machines.insert(name.clone(), machine(&name));
    bed.ok(
        leader,
        &Request::Apply {
            mesh,
            why: "bench".into(),
            drain: false,
        },
    )
    .await?;
    push_named(&bed, leader, &name, 0).await?;
    let mut totals = Vec::new();
    for run in 0..failover_runs {
        let (old, term) = bed.wait_leader(&ids, 0).await?;
        let rest: Vec<u64> = ids.iter().copied().filter(|i| *i != old).collect();
        let t0 = Instant::now();
        bed.isolate(old, true)?;
        let trace = std::env::var_os("MESH_BENCH_TRACE").is_some();
        let (new, new_term) = if trace {
            trace_until_leader(&bed, &rest, term, t0).await?
        } else {
            bed.wait_leader(&rest, term).await?
        };
        let elected = t0.elapsed();
        let epoch = push_until_applied(&bed, new, &name, term).await?;
        let total = t0.elapsed();
        println!(
            "failover run {run}: replica {old} (term {term}) cut off; replica {new} leads term {new_term} after {:.0} ms; host accepted its envelope (epoch {epoch}) after {:.0} ms (load {})",
            ms(elected),
            ms(total),
            load_average()
        );
        totals.push(total);
        bed.isolate(old, false)?;
        wait_rejoined(&bed, old, new).await?;
    }
    totals.sort();
    println!(
        "failover ({label}) over {failover_runs} runs: median {:.0} ms, min {:.0} ms, max {:.0} ms",
        ms(percentile(&totals, 0.5)),
        ms(totals[0]),
        ms(totals[totals.len() - 1])
    );
    bed.shutdown().await
}

/// Pushes `machine` through `via`; returns the epoch of the envelope its host applied, if above `above`.
async fn push_named(bed: &Bed, via: u64, machine: &str, above: u64) -> Result<u64> {
    let request = Request::Push {
        target: PushTarget::Machine(machine.into()),
        why: "bench failover".into(),
        moves: vec![],
        plan: None,
    };
    let Body::Push(view) = bed.ok(via, &request).await? else {
        bail!("not a push answer");
    };
    let applied = view
        .lines
        .iter()
        .any(|l| l.machine == machine && matches!(l.outcome, PushOutcome::Applied { .. }));
    if !applied || view.epoch <= above {
        bail!("not applied at an epoch above {above}: {:?}", view.lines);
    }
    Ok(view.epoch)
}

/// Asks the new leader to push until its host applies an envelope of the new epoch (the lease gate
/// may refuse the first tries right after the election).
async fn push_until_applied(bed: &Bed, leader: u64, machine: &str, above: u64) -> Result<u64> {
    let deadline = Instant::now() + Duration::from_millis(wait_deadline_ms);
    loop {
        match push_named(bed, leader, machine, above).await {
            Ok(epoch) => return Ok(epoch),
            Err(e) if Instant::now() > deadline => return Err(e),
            Err(_) => tokio::time::sleep(Duration::from_millis(poll_ms)).await,
        }
    }
}

/// Like [`Bed::wait_leader`], printing every change of the replicas' Raft state on the way.
async fn trace_until_leader(
    bed: &Bed,
    among: &[u64],
    above: u64,
    t0: Instant,
) -> Result<(u64, u64)> {
    let mut last = BTreeMap::new();
    let deadline = Instant::now() + Duration::from_millis(wait_deadline_ms);
    loop {
        for id in among {
            let m = bed.service(*id)?.replica().metrics().borrow().clone();
            let now = format!("{:?} term {} vote {}", m.state, m.current_term, m.vote);
            if last.get(id) != Some(&now) {
                println!("  {:>6.0} ms replica {id}: {now}", ms(t0.elapsed()));
                last.insert(*id, now);
            }
            if m.state == ServerState::Leader && m.current_term > above {
                return Ok((*id, m.current_term));
            }
        }
        if Instant::now() > deadline {
            bail!("no leader above term {above} among {among:?}");
        }
        tokio::time::sleep(Duration::from_millis(poll_ms)).await;
    }
}

/// Waits until the healed replica follows the new leader again.
async fn wait_rejoined(bed: &Bed, old: u64, new: u64) -> Result<()> {
    let deadline = Instant::now() + Duration::from_millis(wait_deadline_ms);
    loop {
        let m = bed.service(old)?.replica().metrics().borrow().clone();
        if m.state == ServerState::Follower && m.current_leader == Some(new) {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("replica {old} did not rejoin under {new}");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

// ---------------------------------------------------------------------------------------------
// 2b. Failover of the real binaries: SIGKILL and SIGTERM of the leader

const pair_mesh: &str = include_str!("../beds/meshes/pair.toml");

/// How long a SIGTERMed replica may take to hand over and exit before the bench gives up.
const term_exit_ms: u64 = 10_000;

/// How the leader is stopped in a run of [`kill_failover`].
#[derive(Clone, Copy, PartialEq, Eq)]
enum Stop {
    /// SIGKILL: the survivors elect after their election timeout (decision 0110).
    Kill,
    /// SIGTERM: the leader hands its leadership over before it exits (decisions 0152, 0225).
    Term,
}

impl Stop {
    fn signal(self) -> &'static str {
        match self {
            Stop::Kill => "SIGKILL",
            Stop::Term => "SIGTERM",
        }
    }

    fn label(self) -> &'static str {
        match self {
            Stop::Kill => "kill",
            Stop::Term => "term",
        }
    }
}

/// Three `meshd` and two `mesh-host` processes (the bed harness, default settings); per run the
/// leader is SIGKILLed (then SIGTERMed, `kill_runs` runs each) and the clock runs from the signal
/// to (a) the new leader's "leader of term" log line, (b) machine ace's host writing an applied
/// envelope of a newer epoch (its state file, polled every 2 ms), (c) the first `meshctl push ace`
/// through a survivor that exits 0, started right after the signal and repeated until one does.
/// Runs alternate the survivor meshctl asks. A SIGTERMed leader must log "handed over to N" with
/// the N that leads, before it exits; the run fails otherwise.
fn kill_failover() -> Result<()> {
    let mut bed = mesh_beds::Bed::start(mesh_beds::binaries!(), 3, pair_mesh)?;
    bed.leader_other_than(None)?;
    bed.apply(pair_mesh, "bench")?;
    bed.meshctl_ok(&["push", "--all", "--why", "bench"])?;
    for stop in [Stop::Kill, Stop::Term] {
        failover_runs_of(&mut bed, stop)?;
    }
    Ok(())
}

fn failover_runs_of(bed: &mut mesh_beds::Bed, stop: Stop) -> Result<()> {
    use mesh::host::state::StateFiles;
    println!(
        "failover of real processes on {} of the leader (meshd ×3, mesh-host ×2, default RaftSettings: heartbeat {} ms, election {}-{} ms), {kill_runs} runs",
        stop.signal(),
        RaftSettings::default().heartbeat_ms,
        RaftSettings::default().election_timeout_min_ms,
        RaftSettings::default().election_timeout_max_ms
    );
    let host = StateFiles::new(&bed.host_root("ace"));
    let (mut elected, mut applied, mut pushed) = (Vec::new(), Vec::new(), Vec::new());
    for run in 0..kill_runs {
        let old = bed.leader_other_than(None)?;
        let before = host
            .load_applied()?
            .map(|a| a.position.epoch)
            .ok_or_else(|| anyhow!("ace applied nothing yet"))?;
        let survivors: Vec<u64> = (1..=3).filter(|id| *id != old).collect();
        let via = survivors[run % survivors.len()];
        let context = bed.context_for(via)?;
        let log_len: BTreeMap<u64, usize> =
            (1..=3).map(|id| (id, bed.replica_log(id).len())).collect();
        let wall0 = std::time::SystemTime::now();
        let t0 = Instant::now();
        match stop {
            Stop::Kill => bed.kill_replica(old)?,
            Stop::Term => bed.terminate_replica(old)?,
        }
        let watcher = {
            let host = StateFiles::new(&bed.host_root("ace"));
            std::thread::spawn(move || -> Result<Duration> {
                let deadline = t0 + Duration::from_millis(wait_deadline_ms);
                loop {
                    let epoch = host.load_applied().ok().flatten().map(|a| a.position.epoch);
                    if epoch.is_some_and(|e| e > before) {
                        return Ok(t0.elapsed());
                    }
                    if Instant::now() > deadline {
                        bail!("ace applied nothing above epoch {before}");
                    }
                    std::thread::sleep(Duration::from_millis(2));
                }
            })
        };
        let mut attempts = 0;
        let push = loop {
            attempts += 1;
            let why = format!("after the {}", stop.signal());
            let out = bed.meshctl_in(&context, &["push", "ace", "--why", &why])?;
            if out.code == Some(0) {
                break t0.elapsed();
            }
            if t0.elapsed() > Duration::from_millis(wait_deadline_ms) {
                bail!("no push through replica {via} succeeded: {}", out.stderr);
            }
        };
        let apply = watcher
            .join()
            .map_err(|_| anyhow!("the host watcher panicked"))??;
        let survivors_len: BTreeMap<u64, usize> = log_len
            .iter()
            .filter(|(id, _)| **id != old)
            .map(|(id, len)| (*id, *len))
            .collect();
        let (new, elect) = leader_line_after(bed, &survivors_len, wall0)?;
        let handed = match stop {
            Stop::Kill => String::new(),
            Stop::Term => {
                let status = bed.reap_replica(old, term_exit_ms)?;
                let log = bed.replica_log(old);
                let tail = log.get(log_len[&old]..).unwrap_or_default();
                let said = format!("handed over to {new}");
                if !tail.lines().any(|l| l.contains(&said)) {
                    bail!(
                        "replica {old} exited ({status}) without logging {said:?}; its log after SIGTERM:\n{tail}"
                    );
                }
                format!("; replica {old} logged \"{said}\" and exited ({status})")
            }
        };
        println!(
            "{} run {run}: leader {old} got {}; replica {new} leads after {:.0} ms; ace applied its envelope after {:.0} ms; meshctl push via replica {via} succeeded after {:.0} ms ({attempts} attempt{}){handed} (load {})",
            stop.label(),
            stop.signal(),
            ms(elect),
            ms(apply),
            ms(push),
            if attempts == 1 { "" } else { "s" },
            load_average()
        );
        elected.push(elect);
        applied.push(apply);
        pushed.push(push);
        bed.restart_replica(old)?;
        wait_all_answer(bed)?;
    }
    let signal = stop.signal();
    for (what, list) in [
        (format!("{signal} → new leader"), &mut elected),
        (
            format!("{signal} → host applied the new leader's envelope"),
            &mut applied,
        ),
        (
            format!("{signal} → meshctl push through a survivor succeeded"),
            &mut pushed,
        ),
    ] {
        list.sort();
        println!(
            "{what} over {} runs: median {:.0} ms, min {:.0} ms, max {:.0} ms",
            list.len(),
            ms(percentile(list, 0.5)),
            ms(list[0]),
            ms(list[list.len() - 1])
        );
    }
    Ok(())
}

/// The first "leader of term" line a survivor logged after `wall0` (past `log_len` bytes of its
/// log): which replica and how long after `wall0`, by the log's own timestamp.
fn leader_line_after(
    bed: &mesh_beds::Bed,
    log_len: &BTreeMap<u64, usize>,
    wall0: std::time::SystemTime,
) -> Result<(u64, Duration)> {
    let mut first: Option<(u64, Duration)> = None;
    for (id, len) in log_len {
        let log = bed.replica_log(*id);
        let tail = log.get(*len..).unwrap_or_default();
        for line in tail.lines().filter(|l| l.contains("leader of term")) {
            let at = line
                .split_whitespace()
                .next()
                .and_then(parse_utc)
                .ok_or_else(|| anyhow!("no timestamp in {line:?}"))?;
            let after = at.duration_since(wall0).unwrap_or_default();
            if first.is_none_or(|(_, d)| after < d) {
                first = Some((*id, after));
            }
        }
    }
    first.ok_or_else(|| anyhow!("no survivor logged a leadership"))
}

/// `2026-11-30T09:42:57.120456Z` (the log's timestamps) as a system time.
fn parse_utc(s: &str) -> Option<std::time::SystemTime> {
    let (date, time) = s.strip_suffix('Z')?.split_once('T')?;
    let mut d = date.split('-').map(|p| p.parse::<i64>().ok());
    let (y, m, day) = (d.next()??, d.next()??, d.next()??);
    let (hms, frac) = time.split_once('.').unwrap_or((time, "0"));
    let mut t = hms.split(':').map(|p| p.parse::<u64>().ok());
    let (hh, mm, ss) = (t.next()??, t.next()??, t.next()??);
    let nanos = format!("{frac:0<9}").get(..9)?.parse::<u64>().ok()?;
    // Days from 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's days_from_civil).
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = u64::try_from(era * 146_097 + doe - 719_468).ok()?;
    let secs = days * 86_400 + hh * 3_600 + mm * 60 + ss;
    Some(std::time::UNIX_EPOCH + Duration::from_secs(secs) + Duration::from_nanos(nanos))
}

/// Waits until every replica answers status and none lags.
fn wait_all_answer(bed: &mesh_beds::Bed) -> Result<()> {
    bed.wait_for(
        "all three replicas answer, none lagging",
        wait_deadline_ms,
        || {
            let status = bed.status()?;
            let rows = status["replicas"].as_array().cloned().unwrap_or_default();
            let ok =
                rows.len() == 3 && rows.iter().all(|r| r["reachable"] == true && r["lag"] == 0);
            Ok(ok.then_some(()))
        },
    )
}

// ---------------------------------------------------------------------------------------------
// 3. push --behind to N hosts

/// The host counts of the push section: `MESH_BENCH_PUSH_HOSTS=1000` (a comma list), or
/// [`push_hosts`].
fn push_host_counts() -> Result<Vec<usize>> {
    match std::env::var("MESH_BENCH_PUSH_HOSTS") {
        Ok(list) => list
            .split(',')
            .map(|n| {
                n.trim().parse().with_context(|| {
                    format!("MESH_BENCH_PUSH_HOSTS: {n:?} is not a host count; give e.g. 100,1000")
                })
            })
            .collect(),
        Err(_) => Ok(push_hosts.to_vec()),
    }
}

/// Worker threads of the runtime the push section's hosts run on: each host's writes wait on
/// fsync, which real hosts do on disks of their own at once; on two threads 1,000 hosts took
/// turns at the one disk (4.1–7.8 s a push instead of 1–2 s, decision 0271).
const push_host_threads: usize = 16;

/// Where the push bench's hosts keep their state, when the machine has it (decision 0335): a
/// thousand hosts sharing the bench machine's one disk queue their fsyncs behind each other and
/// behind the replicas' log writes, which real hosts, each on a disk of its own, do not.
const host_disk_root: &str = "/dev/shm";

/// Worker threads of each replica's runtime in the push bench: meshd's own count on this
/// machine (tokio's default is one per core).
const replica_threads: usize = 2;

/// A runtime of the bench's own (the hosts', or one replica's), shut down without waiting when
/// dropped: a runtime dropped inside another runtime's task would panic.
struct BenchRuntime(Option<tokio::runtime::Runtime>);

impl BenchRuntime {
    fn new(name: &str, threads: usize) -> Result<BenchRuntime> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(threads)
            .thread_name(name)
            .enable_all()
            .build()
            .with_context(|| format!("the {name} runtime"))?;
        Ok(BenchRuntime(Some(runtime)))
    }

    /// The hosts' runtime.
    fn hosts() -> Result<BenchRuntime> {
        BenchRuntime::new("bench-hosts", push_host_threads)
    }

    fn handle(&self) -> Option<&tokio::runtime::Handle> {
        self.0.as_ref().map(|r| r.handle())
    }

    async fn spawn<F>(&self, work: F) -> Result<F::Output>
    where
        F: std::future::Future + Send + 'static,
        F::Output: Send + 'static,
    {
        let handle = self.handle().context("the runtime stopped")?;
        handle.spawn(work).await.context("a task on the runtime")
    }
}

impl Drop for BenchRuntime {
    fn drop(&mut self) {
        if let Some(runtime) = self.0.take() {
            runtime.shutdown_background();
        }
    }
}

/// Runs of each host count: `MESH_BENCH_PUSH_RUNS=5` (issue 24's verdict wants five), 1 when
/// left out. Each run is a bed of its own, so one run's leader change cannot carry into the next.
fn push_runs() -> Result<usize> {
    match std::env::var("MESH_BENCH_PUSH_RUNS") {
        Ok(n) => n.trim().parse().with_context(|| {
            format!("MESH_BENCH_PUSH_RUNS: {n:?} is not a number of runs; give e.g. 5")
        }),
        Err(_) => Ok(1),
    }
}

/// The time issue 24 allows a push to `n` hosts to be applied and reported, where it sets one.
fn push_target(n: usize) -> Option<Duration> {
    match n {
        1_000 => Some(Duration::from_secs(3)),
        10_000 => Some(Duration::from_secs(10)),
        _ => None,
    }
}

async fn push_behind() -> Result<()> {
    let runs = push_runs()?;
    let mut verdicts: Vec<(usize, &str, Verdict)> = Vec::new();
    for n in push_host_counts()? {
        for run in 1..=runs {
            println!("push --behind to {n} hosts: run {run} of {runs}");
            let [first, kept] = push_run(n).await?;
            verdicts.push((n, "first contact", first));
            verdicts.push((n, "connections kept", kept));
        }
    }
    println!(
        "push bench: every run (a miss is more than one push, any leader change, or over the target)"
    );
    for (n, what, v) in &verdicts {
        println!("  {n} hosts, {what}: {v}");
    }
    let missed = verdicts.iter().filter(|(_, _, v)| !v.met()).count();
    println!(
        "push bench: {} of {} runs met, {missed} missed",
        verdicts.len() - missed,
        verdicts.len()
    );
    Ok(())
}

/// One bed of `n` hosts: the first contact, then the same push over the connections it kept.
async fn push_run(n: usize) -> Result<[Verdict; 2]> {
    let setup = Instant::now();
    // The hosts on a runtime of their own (decision 0271): on the replicas' two worker
    // threads, the hosts' fsync'd writes (mark, declaration, report on every envelope) held
    // the threads the followers answer heartbeats on, and the lease rounds failed.
    let hosts = BenchRuntime::hosts()?;
    let bed = Bed::start_with_hosts_on(3, n, RaftSettings::default(), 1, hosts.handle()).await?;
    let ids: Vec<u64> = bed.replicas.keys().copied().collect();
    let (leader, _) = bed.wait_leader(&ids, 0).await?;
    // Every machine declared with zero modules: the host verifies, stores and reports the
    // declaration; no process starts.
    let mut mesh = Mesh::default();
    for i in 0..n {
        let name = host_name(i);
        mesh.machines.insert(name.clone(), machine(&name));
    }
    bed.ok(
        leader,
        &Request::Apply {
            mesh,
            why: "bench".into(),
            drain: false,
        },
    )
    .await?;
    // Every host reports once as it starts, and 10,000 of them started while the replicas did
    // not yet run: their queued reports reach the replicas all at once. A fleet that runs has
    // reported long before anyone pushes; the push is measured after that herd, not inside it
    // (decision 0338).
    let heard = wait_heard(&bed, leader, n).await?;
    let setup = setup.elapsed();
    println!(
        "push --behind to {n} hosts: {heard} hosts heard before the first push, setup {:.1} s",
        setup.as_secs_f64()
    );
    let dials0 = bed.service(leader)?.endpoint().counts().dials;
    let first = converge(&bed, leader, n, "first contact", setup).await?;
    let dials1 = bed.service(leader)?.endpoint().counts().dials;
    // Every declaration carries the deny list: revoking a principal nobody holds makes every
    // machine behind again, and the push goes over the connections the first one opened.
    bed.ok(
        leader,
        &Request::CertsRevoke {
            target: "operator:bench-nobody".into(),
            why: "bench: every machine behind again".into(),
        },
    )
    .await?;
    let kept = converge(&bed, leader, n, "connections kept", Duration::ZERO).await?;
    let dials2 = bed.service(leader)?.endpoint().counts().dials;
    println!(
        "push --behind to {n} hosts: the leader dialled {} connections for the first push, {} for the second",
        dials1 - dials0,
        dials2 - dials1
    );
    bed.shutdown().await?;
    drop(hosts);
    Ok([first, kept])
}

/// What one converge took, and whether issue 24 calls it met: one push, no leader change, every
/// machine applied and reported, within the target where one is set.
struct Verdict {
    pushes: usize,
    /// Elections seen while the pushes ran: the highest term any replica knew, after less before.
    /// Every election moves the term, won or not, so a lost lease that led to one counts here.
    terms_moved: u64,
    /// From the first push to every machine applied and confirmed by its report; `None` when
    /// that never happened.
    reported: Option<Duration>,
    target: Option<Duration>,
}

impl Verdict {
    fn met(&self) -> bool {
        self.pushes == 1
            && self.terms_moved == 0
            && match (self.reported, self.target) {
                (Some(took), Some(target)) => took < target,
                (Some(_), None) => true,
                (None, _) => false,
            }
    }
}

impl std::fmt::Display for Verdict {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let took = match self.reported {
            Some(d) => format!("applied and reported after {:.0} ms", ms(d)),
            None => "never every machine applied and reported".to_string(),
        };
        let target = match self.target {
            Some(t) => format!(" (target < {:.0} s)", t.as_secs_f64()),
            None => String::new(),
        };
        write!(
            f,
            "{} — {} push(es), {} leader change(s), {took}{target}",
            if self.met() { "MET" } else { "MISS" },
            self.pushes,
            self.terms_moved
        )
    }
}

/// The highest term any running replica knows.
fn highest_term(bed: &Bed) -> u64 {
    bed.replicas
        .values()
        .map(|r| r.service().replica().metrics().borrow().current_term)
        .max()
        .unwrap_or(0)
}

/// Pushes `--behind` until every line is applied, then waits for every machine's report; prints
/// when the pushes applied everything and when status confirmed it, and how many pushes and
/// elections that took.
async fn converge(
    bed: &Bed,
    leader: u64,
    n: usize,
    what: &str,
    setup: Duration,
) -> Result<Verdict> {
    let term0 = highest_term(bed);
    let t0 = Instant::now();
    let mut round = 0;
    let mut applied_total = 0;
    let confirmed = loop {
        round += 1;
        let view = match push_behind_once(bed, leader).await {
            Ok(view) => view,
            Err(e) if round < push_rounds_max => {
                println!("push --behind to {n} hosts, push {round}: {e}");
                tokio::time::sleep(Duration::from_millis(200)).await;
                continue;
            }
            Err(e) => return Err(e),
        };
        let applied = view
            .lines
            .iter()
            .filter(|l| matches!(l.outcome, PushOutcome::Applied { .. }))
            .count();
        applied_total += applied;
        println!(
            "push --behind to {n} hosts ({what}), push {round}: answer after {:.0} ms, {applied}/{} lines applied",
            ms(t0.elapsed()),
            view.lines.len()
        );
        print_outcomes(&view.lines);
        // A push that stopped part-way (its lease closed) leaves the rest behind: the operator
        // pushes --behind again, as meshctl's message says.
        if applied == view.lines.len() || round == push_rounds_max {
            if applied_total >= n {
                println!(
                    "push --behind to {n} hosts ({what}): every machine applied after {:.0} ms ({round} pushes)",
                    ms(t0.elapsed())
                );
            }
            break wait_confirmed(bed, leader, n).await;
        }
    };
    let reported = t0.elapsed();
    let terms_moved = highest_term(bed).saturating_sub(term0);
    let reported = match confirmed {
        Ok(c) => {
            println!(
                "push --behind to {n} hosts ({what}): every machine applied and reported after {:.0} ms ({c} confirmed, {round} pushes, {terms_moved} leader changes), setup {:.1} s, load {}",
                ms(reported),
                setup.as_secs_f64(),
                load_average()
            );
            Some(reported)
        }
        Err(e) => {
            println!("push --behind to {n} hosts ({what}): {e} after {round} pushes");
            diagnose(bed, leader).await?;
            None
        }
    };
    Ok(Verdict {
        pushes: round,
        terms_moved,
        reported,
        target: push_target(n),
    })
}

async fn push_behind_once(bed: &Bed, leader: u64) -> Result<mesh::controller::api::PushView> {
    let request = Request::Push {
        target: PushTarget::Behind,
        why: "bench push --behind".into(),
        moves: vec![],
        plan: None,
    };
    match bed.ok(leader, &request).await? {
        Body::Push(view) => Ok(view),
        _ => bail!("not a push answer"),
    }
}

/// Counts push lines by outcome and shows the first line of each kind that was not applied.
fn print_outcomes(lines: &[mesh::controller::api::PushLine]) {
    let mut kinds: BTreeMap<&str, (usize, String)> = BTreeMap::new();
    for line in lines {
        let kind = match &line.outcome {
            PushOutcome::Applied { .. } => "applied",
            PushOutcome::Sent { .. } => "sent, no answer",
            PushOutcome::Held { .. } => "held",
            PushOutcome::Refused { .. } => "refused",
            PushOutcome::Failed { .. } => "failed",
        };
        let entry = kinds
            .entry(kind)
            .or_insert_with(|| (0, format!("{:?}", line.outcome)));
        entry.0 += 1;
    }
    for (kind, (count, first)) in kinds {
        if kind == "applied" {
            println!("  {count} applied");
        } else {
            println!("  {count} {kind}, first: {first}");
        }
    }
}

/// Says what the hosts and the leader hold for machines that are still behind.
async fn diagnose(bed: &Bed, leader: u64) -> Result<()> {
    let Body::Status(status) = bed.ok(leader, &Request::Status).await? else {
        bail!("not a status answer");
    };
    let behind: Vec<_> = status.machines.iter().filter(|m| m.behind).collect();
    println!("  {} behind; first three:", behind.len());
    for m in behind.iter().take(3) {
        println!("    {m:?}");
    }
    let (mut applied, mut dropped) = (0, 0);
    for host in &bed.hosts {
        applied += usize::from(host.agent.applied().await.is_some());
        dropped += host.agent.reports_dropped();
    }
    println!("  hosts: {applied} applied a declaration, {dropped} reports dropped in total");
    Ok(())
}

/// Polls status until the leader has heard from `n` hosts (a report of theirs reached it).
async fn wait_heard(bed: &Bed, leader: u64, n: usize) -> Result<usize> {
    let deadline = Instant::now() + Duration::from_millis(wait_deadline_ms);
    loop {
        let Body::Status(status) = bed.ok(leader, &Request::Status).await? else {
            bail!("not a status answer");
        };
        let heard = status
            .machines
            .iter()
            .filter(|m| m.heard_ago_ms.is_some())
            .count();
        if heard >= n {
            return Ok(heard);
        }
        if Instant::now() > deadline {
            bail!("only {heard}/{n} hosts heard before the push");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Polls status until `n` machines are no longer behind (their last send confirmed by a report).
async fn wait_confirmed(bed: &Bed, leader: u64, n: usize) -> Result<usize> {
    let deadline = Instant::now() + Duration::from_millis(confirm_deadline_ms);
    loop {
        let Body::Status(status) = bed.ok(leader, &Request::Status).await? else {
            bail!("not a status answer");
        };
        let confirmed = status
            .machines
            .iter()
            .filter(|m| !m.behind && m.last_send.is_some())
            .count();
        if confirmed >= n {
            return Ok(confirmed);
        }
        if Instant::now() > deadline {
            bail!("only {confirmed}/{n} machines confirmed");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

// ---------------------------------------------------------------------------------------------
// 4. Controller memory

/// A module as small as a real one gets: a command, one argument, one env key.
fn lean_module(machine: usize, slot: usize) -> Module {
    Module {
        name: format!("m{machine}-{slot}"),
        machine: format!("n{machine}"),
        command: "/usr/bin/app".into(),
        args: vec![format!("--slot={slot}")],
        env: From::from([("LOG".into(), "info".into())]),
        files: Default::default(),
        mounts: vec![],
        ready: None,
        after: vec![],
        provides: vec![],
        consumes: vec![],
    }
}

fn big_mesh() -> Mesh {
    let mut mesh = Mesh::default();
    for m in 0..memory_machines {
        let name = format!("n{m}");
        mesh.machines.insert(name.clone(), machine(&name));
        for s in 0..memory_modules_per_machine {
            let module = lean_module(m, s);
            mesh.modules.insert(module.name.clone(), module);
        }
    }
    mesh
}

/// A simulated host of the memory section: its own endpoint and `host:<machine>` certificate,
/// opening every envelope with the host's own check (`core::envelope::open`: signer, signature,
/// machine, position above its mark) and answering as `host/listener.rs` does, without running
/// modules. The bench measures the controller; its hosts only need to answer like hosts.
struct EnvelopeAnswerer {
    machine: String,
    trusted: BTreeMap<u64, ed25519_dalek::VerifyingKey>,
    mark: std::sync::Mutex<Option<mesh::core::envelope::Position>>,
    applied: std::sync::Mutex<
        Option<(
            mesh::core::envelope::Position,
            mesh::core::declaration::Digest,
        )>,
    >,
}

impl EnvelopeAnswerer {
    /// The report a host files after applying: its mark, the digest it runs, every module ready.
    fn report(&self) -> Option<mesh::core::report::Report> {
        use mesh::core::report::{ModuleState, ModuleStatus, Report};
        let (position, digest) = (*self.applied.lock().unwrap_or_else(|p| p.into_inner()))?;
        let machine = self.machine.trim_start_matches('n');
        Some(Report {
            machine: self.machine.clone(),
            epoch: position.epoch,
            sequence: position.sequence,
            report_sequence: 1,
            applied: Some(digest),
            modules: (0..memory_modules_per_machine)
                .map(|slot| ModuleStatus {
                    name: format!("m{machine}-{slot}"),
                    state: ModuleState::Ready,
                    restarts: 0,
                    pid: Some(10_000 + slot as u32),
                    last_exit: None,
                    drift: Vec::new(),
                })
                .collect(),
            refused_older: 0,
            last_refusal: None,
            proof: None,
        })
    }
}

impl mesh_transport::Handler for EnvelopeAnswerer {
    fn request(
        &self,
        _from: Principal,
        kind: MessageKind,
        body: Vec<u8>,
    ) -> futures::future::BoxFuture<'_, Result<Vec<u8>, String>> {
        Box::pin(async move {
            use mesh::core::wire::{EnvelopeReply, envelope_reply_what};
            if kind != MessageKind::Envelope {
                return Err(format!(
                    "a simulated host answers envelopes only, not {kind:?}"
                ));
            }
            let mut mark = self.mark.lock().unwrap_or_else(|p| p.into_inner());
            let reply = match mesh::core::envelope::open(&body, &self.trusted, &self.machine, *mark)
            {
                Ok(envelope) => {
                    let (position, digest) = (
                        envelope.position(),
                        mesh::core::compose::digest(&envelope.declaration),
                    );
                    *mark = Some(position);
                    *self.applied.lock().unwrap_or_else(|p| p.into_inner()) =
                        Some((position, digest));
                    EnvelopeReply::Applied { position, digest }
                }
                Err(refusal) => EnvelopeReply::Refused {
                    older: matches!(refusal, mesh::core::envelope::Refusal::Older { .. }),
                    refusal: refusal.to_string(),
                },
            };
            drop(mark);
            mesh_codec::encode(envelope_reply_what, &reply).map_err(|e| e.to_string())
        })
    }

    /// A host takes no one-way messages from the controller.
    fn one_way(
        &self,
        _from: Principal,
        _kind: MessageKind,
        _body: Vec<u8>,
    ) -> futures::future::BoxFuture<'_, ()> {
        Box::pin(async {})
    }
}

/// A real `meshd` child, killed (and reaped) when dropped, whatever the bench did.
struct Meshd(std::process::Child);

impl Drop for Meshd {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `VmRSS` and `VmHWM` of process `pid`, in KiB. A status file that cannot be read, or that
/// lacks either field, stops the bench: a 0 would read as a figure.
fn rss_of(pid: u32) -> (u64, u64) {
    let path = format!("/proc/{pid}/status");
    status_fields(&path).unwrap_or_else(|e| panic!("memory bench: {path}: {e}"))
}

/// When `MESH_BENCH_MEMORY_PROBE` names a program, runs it with meshd's pid and the step's name
/// (`composed`, `sent`, `reported`) right after that step's idle reading, and waits for it: a
/// way to look inside the process at each step (jemalloc's statistics through a debugger,
/// `/proc/<pid>/smaps`, a heap profiler's snapshot) that costs the shipped binary nothing.
/// The figures the bench prints are read before it runs.
fn probe(pid: u32, step: &str) {
    let Some(program) = std::env::var_os("MESH_BENCH_MEMORY_PROBE") else {
        return;
    };
    match std::process::Command::new(&program)
        .arg(pid.to_string())
        .arg(step)
        .status()
    {
        Ok(status) if status.success() => {}
        Ok(status) => eprintln!("memory: probe {program:?} at {step}: {status}"),
        Err(e) => eprintln!("memory: probe {program:?} at {step} did not run: {e}"),
    }
}

fn status_fields(path: &str) -> Result<(u64, u64), String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("cannot read it: {e}"))?;
    let field = |name: &str| {
        text.lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse().ok())
            .ok_or_else(|| format!("no {name} line with a number of KiB"))
    };
    Ok((field("VmRSS:")?, field("VmHWM:")?))
}

/// Each simulated host files one report of what it applied with replica 1, 64 at a time, on the
/// hosts' runtime; returns how many were filed as accepted.
async fn file_reports(
    bed: &Bed,
    hosts: &[(Endpoint, Arc<EnvelopeAnswerer>)],
    hosts_on: &tokio::runtime::Handle,
) -> usize {
    use futures::StreamExt;
    use mesh::core::wire::{ReportReply, report_reply_what, report_what};
    let leader = Peer::expecting(bed.addrs[&1], Principal::Replica(1));
    let one = |endpoint: Endpoint, answerer: Arc<EnvelopeAnswerer>| {
        let leader = leader.clone();
        hosts_on.spawn(async move {
            let report = answerer.report()?;
            let body = mesh_codec::encode(report_what, &report).ok()?;
            let kind = MessageKind::Report {
                machine: report.machine.clone(),
            };
            let answer = endpoint
                .request(
                    leader,
                    kind,
                    body,
                    Duration::from_millis(request_timeout_ms),
                )
                .await
                .ok()?;
            match mesh_codec::decode(report_reply_what, &answer).ok()? {
                ReportReply::Filed { accepted: true } => Some(()),
                _ => None,
            }
        })
    };
    futures::stream::iter(hosts.iter().map(|(e, a)| one(e.clone(), a.clone())))
        .buffer_unordered(64)
        .filter(|r| std::future::ready(matches!(r, Ok(Some(())))))
        .count()
        .await
}

/// Controller memory, measured on a real `meshd` process (one replica: one controller's
/// memory) holding 10,000 machines x 10 modules: applied as meshctl sends it, composed
/// (`status`), and sent once (`push --all` to 10,000 simulated hosts over QUIC, each on a
/// connection the leader keeps), then with every host's report filed (each host reports over the
/// connection the leader opened to it, decision 0316, and keeps it open; before 0316 each host
/// dialled one of its own, so the leader held 10,000 accepted connections as well).
/// The figures are the process's `VmRSS` (and `VmHWM`, its peak) from `/proc`, with meshd's
/// own allocator settings: nothing trims it.
async fn memory() -> Result<()> {
    let hosts_runtime = BenchRuntime::hosts()?;
    let hosts_on = hosts_runtime
        .handle()
        .ok_or_else(|| anyhow!("the hosts' runtime is gone"))?
        .clone();
    let mut bed = Bed::start(0, 0, RaftSettings::default(), 1).await?;
    let trusted = BTreeMap::from([(1u64, replica_key(1).verifying_key())]);
    let t0 = Instant::now();
    let mut host_addrs = BTreeMap::new();
    let mut endpoints = Vec::with_capacity(memory_machines);
    for m in 0..memory_machines {
        let machine = format!("n{m}");
        let identity = bed.identity(&Principal::Host(machine.clone()))?;
        let answerer = Arc::new(EnvelopeAnswerer {
            machine: machine.clone(),
            trusted: trusted.clone(),
            mark: std::sync::Mutex::new(None),
            applied: std::sync::Mutex::new(None),
        });
        let answerer_of = answerer.clone();
        let endpoint = hosts_on
            .spawn(async move {
                let endpoint = Endpoint::bind(loopback(), &identity, transport()?)?;
                endpoint.serve(answerer);
                Ok::<_, anyhow::Error>(endpoint)
            })
            .await
            .context("a simulated host's task")??;
        host_addrs.insert(machine, endpoint.local_addr().to_string());
        endpoints.push((endpoint, answerer_of));
    }
    println!(
        "memory: {memory_machines} simulated hosts listening after {:.1} s",
        t0.elapsed().as_secs_f64()
    );
    // meshd's port, picked once the 10,000 hosts hold theirs (picked before, one of their
    // ephemeral ports could be it by the time meshd binds).
    let port = std::net::UdpSocket::bind(loopback())?.local_addr()?.port();
    bed.addrs
        .insert(1, SocketAddr::from(([127, 0, 0, 1], port)));
    // Proposal and frame caps raised to their limits, as before: the whole model in one entry.
    let raft = RaftSettings {
        batch_bytes_max: mesh_raft::config::batch_bytes_max_limit,
        ..RaftSettings::default()
    };
    let config = bed.write_config(1, &host_addrs, &raft)?;
    drop(config);
    let config_path = bed.dir.path().join("replica-1.toml");
    let log = std::fs::File::create(bed.dir.path().join("replica-1.log"))?;
    let meshd = Meshd(
        std::process::Command::new(mesh_beds::binaries!().meshd)
            .arg("--config")
            .arg(&config_path)
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .context("start meshd")?,
    );
    let pid = meshd.0.id();
    let deadline = Instant::now() + Duration::from_millis(wait_deadline_ms);
    loop {
        match bed.ok(1, &Request::Status).await {
            Ok(Body::Status(view)) if view.replicas.iter().any(|r| r.leader) => break,
            _ if Instant::now() > deadline => {
                let log = std::fs::read_to_string(bed.dir.path().join("replica-1.log"))
                    .unwrap_or_else(|e| format!("(its log cannot be read: {e})"));
                let tail: Vec<&str> = log.lines().rev().take(20).collect();
                let tail: Vec<&str> = tail.into_iter().rev().collect();
                bail!(
                    "meshd did not lead within {wait_deadline_ms} ms; the end of its log:\n{}",
                    tail.join("\n")
                )
            }
            _ => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    }
    let (started, _) = rss_of(pid);
    // As meshctl sends it: a model over one request's size goes as an upload (decision 0185).
    let sending = mesh::cli::apply::requests_for(big_mesh(), "bench memory".into(), false)
        .map_err(|e| anyhow!("{e}"))?;
    let requests = match sending {
        mesh::cli::apply::Sending::Inline(request) => vec![request],
        mesh::cli::apply::Sending::Upload { chunks, apply, .. } => {
            chunks.into_iter().chain([apply]).collect()
        }
    };
    let mut bytes = 0;
    for request in &requests {
        bytes += mesh_codec::encode("request", request)?.len();
    }
    println!(
        "memory: model {memory_machines} machines x {memory_modules_per_machine} modules, {:.1} MiB encoded in {} requests",
        bytes as f64 / (1 << 20) as f64,
        requests.len()
    );
    for request in requests {
        bed.ok(1, &request)
            .await
            .context("the model was not applied")?;
    }
    let (applied, _) = rss_of(pid);
    // Status composes every machine (the leader's compose cache), as the first push would.
    let status = bed.ok(1, &Request::Status).await?;
    drop(status);
    let (composed, _) = rss_of(pid);
    tokio::time::sleep(Duration::from_secs(settle_s)).await;
    let (composed_idle, _) = rss_of(pid);
    probe(pid, "composed");
    let t1 = Instant::now();
    // One `push --all`; a machine it could not reach is pushed again by name, so each machine
    // is sent to once more at most per round (`--behind` would send to all 10,000 again: none
    // has reported yet, so none is confirmed).
    let mut applied_to: BTreeSet<String> = BTreeSet::new();
    let mut left: Vec<PushTarget> = vec![PushTarget::All];
    for round in 1..=push_rounds_max {
        let mut lines = Vec::new();
        for target in std::mem::take(&mut left) {
            let request = Request::Push {
                target,
                why: "bench memory: sent once".into(),
                moves: vec![],
                plan: None,
            };
            match bed.ok(1, &request).await? {
                Body::Push(view) => lines.extend(view.lines),
                _ => bail!("not a push answer"),
            }
        }
        for line in &lines {
            if matches!(line.outcome, PushOutcome::Applied { .. }) {
                applied_to.insert(line.machine.clone());
            }
        }
        left = lines
            .iter()
            .filter(|l| !applied_to.contains(&l.machine))
            .map(|l| PushTarget::Machine(l.machine.clone()))
            .collect();
        println!(
            "memory: push round {round}: {}/{memory_machines} machines applied after {:.1} s",
            applied_to.len(),
            t1.elapsed().as_secs_f64()
        );
        if left.is_empty() {
            break;
        }
        print_outcomes(&lines);
        if left.len() > memory_repush_max {
            bail!(
                "{} machines not applied after round {round}; more than {memory_repush_max} to push one by one",
                left.len()
            );
        }
    }
    let sent = applied_to.len();
    let (pushed, _) = rss_of(pid);
    tokio::time::sleep(Duration::from_secs(settle_s)).await;
    let (pushed_idle, _) = rss_of(pid);
    probe(pid, "sent");
    // Every host reports what it applied, as a host does after an apply, through its endpoint's
    // own send path: over the connection the leader opened to it (decision 0316), which stays
    // open as every real host's does.
    let t2 = Instant::now();
    let dials_before: u64 = endpoints.iter().map(|(e, _)| e.counts().dials).sum();
    let filed = file_reports(&bed, &endpoints, &hosts_on).await;
    let dials: u64 = endpoints.iter().map(|(e, _)| e.counts().dials).sum::<u64>() - dials_before;
    // Decision 0316: a host reports over the connection the leader opened for its envelopes,
    // so this is 0 unless a host's connection was lost since the push.
    println!(
        "memory: {filed}/{memory_machines} reports filed after {:.1} s; the hosts dialled {dials} new connections for them",
        t2.elapsed().as_secs_f64()
    );
    let (reported, _) = rss_of(pid);
    tokio::time::sleep(Duration::from_secs(settle_s)).await;
    let (reported_idle, peak) = rss_of(pid);
    probe(pid, "reported");
    let mib = |kib: u64| kib / 1024;
    println!(
        "memory: meshd RSS (MiB; idle = {settle_s} s later, nothing sent meanwhile): started {}; model applied {}; status composed {}, idle {}; sent once to {sent} hosts {}, idle {}; with every host's report connection {}, idle {}; peak (VmHWM) {}; load {}",
        mib(started),
        mib(applied),
        mib(composed),
        mib(composed_idle),
        mib(pushed),
        mib(pushed_idle),
        mib(reported),
        mib(reported_idle),
        mib(peak),
        load_average()
    );
    drop(meshd);
    for (endpoint, _) in &endpoints {
        endpoint.close().await;
    }
    drop(endpoints);
    bed.shutdown().await?;
    drop(hosts_runtime);
    Ok(())
}
