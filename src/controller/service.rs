//! One replica as a service: the store and Raft node over QUIC, the transport handler (Raft RPCs,
//! operator commands with follower forwarding (G13), host reports), the epoch-floor file (G9), and
//! the shared helpers every operation uses: the lease gate (G3), proposals (G4) and the compose cache.

use std::collections::BTreeMap;
use std::sync::{Arc, Weak};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use ed25519_dalek::SigningKey;
use mesh_raft::{
    BasicNode, BootClock, Clock, Gate, GateError, Lease, ProposeError, QuicNetwork, Replica,
    ReplicaSpec, VoteFence,
};
use mesh_transport::{
    BoxFuture, Endpoint, Handler, Identity, MessageKind, Peer, Principal, Role, Sink,
    TransportError,
};
use openraft::ServerState;
use tokio::task::JoinHandle;

use super::api::{Answer, ApiError, Body, Call, Forwarded, Request, RequestId};
use super::config::{ConfigError, ReplicaConfig};
use super::floor::{FloorError, read_floor, write_floor};
use super::forwarding;
use super::leadership::intake::{Admission, Intake, Raise, RaiseWhy, Refusal, admit};
use super::metrics::{Metrics, request_kind, unreadable_kind};
use crate::core::report::{OverBound, Report, decode_bounded};
use crate::core::wire::{MachineMismatch, ReportReply, report_reply_what};
use crate::store::app::{MeshApp, decode_outcome};
use crate::store::command::{Applied, Command, Outcome, Proposal};
use crate::store::state::DomainState;

/// Codec label of an operator request body.
pub const request_what: &str = "request";
/// Codec label of an answer body.
pub const answer_what: &str = "answer";
/// Codec label of a forwarded request body.
pub const forwarded_what: &str = "forwarded request";
/// How long a follower waits for the leader's answer to a forwarded request (a push to many hosts).
/// It is only asked once the leader answered a probe just before (decision 0110).
pub const forward_timeout_ms: u64 = 120_000;
/// How long a follower keeps looking for a leader that answers before it refuses an operator's
/// request: a failover takes under 2 s (decision 0110), an election with a split vote longer.
pub const forward_find_ms: u64 = 8_000;
/// How long a stopping leader tries to hand its leadership over (decision 0152).
pub const handover_ms: u64 = 2_000;
/// How long shutdown waits for in-flight requests to finish.
pub const shutdown_drain_ms: u64 = 5_000;

/// Why a replica could not start or stop.
#[derive(Debug, thiserror::Error)]
pub enum ServiceError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error("TLS identity of replica {id}: {source}")]
    Identity {
        id: u64,
        source: mesh_transport::PkiError,
    },
    #[error(
        "the certificate {cert} names {found}, not replica:{id}; point [tls] at this replica's certificate"
    )]
    WrongPrincipal {
        id: u64,
        cert: std::path::PathBuf,
        found: Principal,
    },
    #[error(transparent)]
    Bind(#[from] mesh_transport::BindError),
    #[error("cannot open the store in {dir}: {reason}")]
    Store {
        dir: std::path::PathBuf,
        reason: String,
    },
    #[error(transparent)]
    Floor(#[from] FloorError),
    #[error(transparent)]
    Start(#[from] mesh_raft::StartError),
    #[error(transparent)]
    Shutdown(#[from] mesh_raft::ShutdownError),
    #[error("requests still running after {ms} ms; the store closes when they end")]
    Busy { ms: u64 },
    #[error(
        "cannot read CLOCK_BOOTTIME, the clock leases are measured on (it counts suspend); meshd needs Linux 2.6.39 or later"
    )]
    Clock,
    #[error(transparent)]
    Http(#[from] super::http::HttpError),
    #[error("cannot start the thread replica {id}'s Raft runs on: {reason}")]
    RaftThread { id: u64, reason: String },
}

/// Why a host's report request fails: no reply is sent, the transport answers the error and
/// the host drops the report. Typed at the seam (decision 0321); its text is the transport's.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ReportError {
    /// The body is not a report of this version.
    #[error(transparent)]
    Undecodable(mesh_codec::CodecError),
    /// The body names another machine than the frame (G10).
    #[error(transparent)]
    Impostor(MachineMismatch),
}

/// A running replica service.
pub struct Service {
    pub(crate) id: u64,
    pub(crate) config: ReplicaConfig,
    pub(crate) replica: Replica<MeshApp>,
    pub(crate) app: Arc<MeshApp>,
    pub(crate) endpoint: Endpoint,
    pub(crate) key: SigningKey,
    pub(crate) clock: Arc<dyn Clock>,
    /// Refuses votes while a lease of this replica is open (decision 0071).
    pub(crate) fence: VoteFence,
    pub(crate) store_reset: Option<String>,
    /// The compose cache (G1), locked only while computing.
    pub(crate) work: super::engine::Cache,
    /// One push at a time on this leader; taken by pushes and genesis alone.
    pub(crate) pushing: tokio::sync::Mutex<()>,
    /// Counters for `/metrics`.
    pub(crate) metrics: Metrics,
    /// The backup `snapshot save` is reading chunk by chunk (one at a time).
    pub(crate) backup: std::sync::Mutex<Option<super::ops::Backup>>,
    /// Set once when the replica can no longer keep its promises (a storage or floor-file
    /// failure, openraft stopped): meshd stops on it (decision 0183).
    pub(crate) fatal: tokio::sync::watch::Sender<Option<String>>,
    /// This replica's leadership of its term, while it leads: the memory kept for one term only
    /// (liveness, reports being handled, G9 marks; decision 0327).
    pub(crate) office: super::leadership::Office,
    /// Which warnings about which host are due: one a host and kind per interval.
    pub(crate) warned: mesh_transport::ratelog::LogEvery<(String, &'static str)>,
    /// The queue of reports to file in shared proposals (decision 0216).
    pub(crate) filer: super::reports::Filer,
    /// The floor after a restore without its floor file, until proven (G9, decision 0274).
    pub(crate) unproven: super::unproven::Unproven,
    /// The leader's event log, in memory for its term (decision 0308).
    pub(crate) events: super::events::Events,
}

/// The runtime a replica's Raft core runs on: a thread of its own (issue 24 item 1, decision
/// 0320). openraft's core, its replication streams and timers, the proposal batcher, and the QUIC
/// connections they dial to the other replicas (quinn drives a dialled connection where it was
/// dialled) never wait in the queue of the runtime that serves operators and hosts and fans a
/// push out to thousands of them. Dropped, it stops without waiting (a runtime may not block in
/// an async context); [`Running::shutdown`] stops Raft in order before. [`RaftRuntime::current`]
/// is the other place: the runtime the replica is started on (the simulator's one thread,
/// decision 0322).
pub struct RaftRuntime(Place);

enum Place {
    /// A thread of its own; `None` once shut down.
    Own(Option<tokio::runtime::Runtime>),
    /// The runtime `start_in` is called on.
    Current,
}

impl RaftRuntime {
    pub fn new(id: u64) -> Result<RaftRuntime, ServiceError> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name(format!("raft-{id}"))
            .enable_all()
            .build()
            .map_err(|e| ServiceError::RaftThread {
                id,
                reason: e.to_string(),
            })?;
        Ok(RaftRuntime(Place::Own(Some(runtime))))
    }

    /// Raft on the runtime the replica is started on, no thread of its own: every task of the
    /// replica on one runtime (the simulator runs three replicas on one thread this way).
    pub fn current() -> RaftRuntime {
        RaftRuntime(Place::Current)
    }

    /// Runs `f` with this runtime as the current one: an endpoint bound in it is driven on its
    /// thread.
    pub fn enter<R>(&self, f: impl FnOnce() -> R) -> R {
        match &self.0 {
            Place::Own(Some(runtime)) => {
                let _in = runtime.enter();
                f()
            }
            Place::Own(None) | Place::Current => f(),
        }
    }

    /// The Raft thread's runtime, when it has a thread of its own.
    fn handle(&self) -> Option<tokio::runtime::Handle> {
        match &self.0 {
            Place::Own(Some(runtime)) => Some(runtime.handle().clone()),
            Place::Own(None) | Place::Current => None,
        }
    }

    /// Runs `future` to its end on this runtime.
    async fn run<F>(&self, id: u64, future: F) -> Result<F::Output, ServiceError>
    where
        F: std::future::Future + Send + 'static,
        F::Output: Send + 'static,
    {
        let spawned = match &self.0 {
            Place::Own(Some(runtime)) => runtime.spawn(future),
            Place::Current => tokio::spawn(future),
            Place::Own(None) => {
                return Err(ServiceError::RaftThread {
                    id,
                    reason: "the runtime was shut down".into(),
                });
            }
        };
        spawned.await.map_err(|e| ServiceError::RaftThread {
            id,
            reason: e.to_string(),
        })
    }
}

impl Drop for RaftRuntime {
    fn drop(&mut self) {
        if let Place::Own(own) = &mut self.0
            && let Some(runtime) = own.take()
        {
            runtime.shutdown_background();
        }
    }
}

/// Runs `f`, which may compute for a long while (composing 10,000 machines takes half a second;
/// the compose cache's refresh and everything planned on it) or wait for the cache's lock, with
/// the worker thread handed over to the runtime's other tasks first, so the serve loops and
/// report intake never wait behind it (issue 24 item 1, decision 0320). On a runtime with one
/// thread (tests) there is no other worker: `f` just runs. The engine itself names no runtime.
pub(crate) fn off_the_workers<R>(f: impl FnOnce() -> R) -> R {
    match tokio::runtime::Handle::try_current().map(|h| h.runtime_flavor()) {
        Ok(tokio::runtime::RuntimeFlavor::MultiThread) => tokio::task::block_in_place(f),
        _ => f(),
    }
}

/// A started replica: the service and the tasks around it. Call [`Running::shutdown`] to stop it.
pub struct Running {
    service: Arc<Service>,
    /// Declared after `service`: dropped after it.
    raft_runtime: RaftRuntime,
    floor_task: JoinHandle<()>,
    leadership_task: JoinHandle<()>,
    /// Hands the committed deny list to the endpoint (decision 0172).
    denied_task: JoinHandle<()>,
    /// The status page and `/metrics`, when `http` is set in the config.
    http: Option<super::http::HttpServer>,
}

/// Loads this replica's TLS identity and binds its endpoint on `listen`.
pub fn bind(config: &ReplicaConfig) -> Result<Endpoint, ServiceError> {
    let tls = config.tls();
    let identity =
        Identity::load(&tls.ca, &tls.cert, &tls.key).map_err(|source| ServiceError::Identity {
            id: config.id(),
            source,
        })?;
    if identity.principal() != &Principal::Replica(config.id()) {
        return Err(ServiceError::WrongPrincipal {
            id: config.id(),
            cert: tls.cert.clone(),
            found: identity.principal().clone(),
        });
    }
    Ok(Endpoint::bind(
        config.listen(),
        &identity,
        config.transport().clone(),
    )?)
}

/// Starts the replica of `config` on its own endpoint, driven on the Raft thread (decision 0320):
/// its UDP socket and the connections peers and hosts open to it are read there, not behind a
/// push's work.
pub async fn start(config: ReplicaConfig) -> Result<Running, ServiceError> {
    let raft_runtime = RaftRuntime::new(config.id())?;
    let endpoint = raft_runtime.enter(|| bind(&config))?;
    // Leases are read on CLOCK_BOOTTIME, which counts suspend (G3, decision 0100).
    let clock = BootClock::new().ok_or(ServiceError::Clock)?;
    start_in(config, endpoint, Arc::new(clock), raft_runtime).await
}

/// Starts the replica of `config` on an endpoint already bound (tests bind first to learn ports),
/// reading time from `clock`. Its Raft runs on a thread of its own, as in [`start`].
pub async fn start_on(
    config: ReplicaConfig,
    endpoint: Endpoint,
    clock: Arc<dyn Clock>,
) -> Result<Running, ServiceError> {
    let raft_runtime = RaftRuntime::new(config.id())?;
    start_in(config, endpoint, clock, raft_runtime).await
}

/// [`start_on`] with the Raft thread given: bind the endpoint in [`RaftRuntime::enter`] to have
/// it driven there, as meshd does.
pub async fn start_in(
    config: ReplicaConfig,
    endpoint: Endpoint,
    clock: Arc<dyn Clock>,
    raft_runtime: RaftRuntime,
) -> Result<Running, ServiceError> {
    let key = config.read_signing_key()?;
    let dir = config.data_dir().to_path_buf();
    let app = {
        let dir = dir.clone();
        mesh_raft::off_the_thread(move || MeshApp::open(&dir))
            .await
            .map_err(|e| ServiceError::Store {
                dir: config.data_dir().to_path_buf(),
                reason: e.to_string(),
            })?
            .map_err(|e| ServiceError::Store {
                dir: config.data_dir().to_path_buf(),
                reason: e.to_string(),
            })?
    };
    let store_floor = app
        .state()
        .map_err(|e| ServiceError::Store {
            dir: dir.clone(),
            reason: e.to_string(),
        })?
        .epoch_floor;
    let file_floor = read_floor(&dir)?;
    let unproven = super::floor::read_unproven(&dir)?;
    if let Some(restored) = unproven {
        tracing::warn!(
            replica = config.id(),
            restored,
            "FLOOR UNPROVEN: this store was restored without its epoch-floor file; as leader it sends nothing until every machine of the model reported the epoch it holds (decision 0274)"
        );
    }
    let store_reset = check_reset(config.id(), store_floor, file_floor);
    let term_floor = store_floor.max(file_floor);
    let bootstrap: BTreeMap<u64, BasicNode> = config
        .peers()
        .iter()
        .map(|(id, addr)| (*id, BasicNode::new(addr.to_string())))
        .collect();
    let spec = ReplicaSpec {
        id: config.id(),
        dir: dir.clone(),
        config: config.raft().clone(),
        term_floor,
        // A joining replica founds nothing: the leader adds it (decision 0230).
        bootstrap: (!config.join()).then_some(bootstrap),
    };
    let network = QuicNetwork::new(endpoint.clone(), config.raft().timings());
    // openraft's tasks are spawned where it starts: on the Raft thread.
    let replica = raft_runtime
        .run(config.id(), Replica::start(spec, network, app.clone()))
        .await??;
    if term_floor > file_floor {
        write_floor(&dir, term_floor)?;
    }
    tracing::info!(replica = config.id(), listen = %endpoint.local_addr(), term_floor, "replica started");
    let (filer, filer_queue) = super::reports::Filer::new();
    let service = Arc::new(Service {
        id: config.id(),
        config,
        replica,
        app,
        endpoint: endpoint.clone(),
        key,
        fence: VoteFence::new(clock.clone()),
        clock,
        store_reset,
        work: super::engine::Cache::default(),
        pushing: tokio::sync::Mutex::new(()),
        metrics: Metrics::new(),
        backup: std::sync::Mutex::new(None),
        fatal: tokio::sync::watch::Sender::new(None),
        office: super::leadership::Office::default(),
        warned: mesh_transport::ratelog::LogEvery::default(),
        filer,
        unproven: super::unproven::Unproven::new(unproven),
        events: super::events::Events::new(),
    });
    super::reports::spawn_filer(Arc::downgrade(&service), filer_queue);
    // Host silent / back events while this replica leads (decision 0308); ends with the service.
    tokio::spawn(super::events::watch_silence(Arc::downgrade(&service)));
    let http = match service.config.http() {
        Some(addr) => Some(super::http::HttpServer::start(addr, Arc::downgrade(&service)).await?),
        None => None,
    };
    // Named before serving, so the accept loop runs on the Raft thread too (decision 0338).
    if let Some(raft_thread) = raft_runtime.handle() {
        let peers = service
            .config
            .peers()
            .iter()
            .filter(|(id, _)| **id != service.id);
        endpoint.prefer(raft_thread, peers.map(|(_, addr)| *addr));
    }
    endpoint.serve(Arc::new(Serving {
        service: Arc::downgrade(&service),
        runtime: tokio::runtime::Handle::current(),
    }));
    // The connections the other replicas open to this one run on the Raft thread (decision
    // 0338): a follower answers its leader however busy the fleet keeps this runtime.
    if let Some(raft_thread) = raft_runtime.handle() {
        tokio::spawn(keep_preferred(Arc::downgrade(&service), raft_thread));
    }
    let floor_task = tokio::spawn(keep_floor(Arc::downgrade(&service), dir, term_floor));
    let leadership_task = tokio::spawn(announce_leadership(Arc::downgrade(&service)));
    let denied_task = tokio::spawn(super::certs::keep_denied(Arc::downgrade(&service)));
    Ok(Running {
        service,
        raft_runtime,
        floor_task,
        leadership_task,
        denied_task,
        http,
    })
}

/// Keeps the endpoint running the connections of every other member of the membership (by the
/// address each is known at, which is the one it dials from) on `raft_thread`, as members come
/// and go (decision 0338). Ends with the service or openraft's metrics.
async fn keep_preferred(service: Weak<Service>, raft_thread: tokio::runtime::Handle) {
    let Some(mut metrics) = service.upgrade().map(|s| s.replica.metrics()) else {
        return;
    };
    let mut named: Option<std::collections::BTreeSet<std::net::SocketAddr>> = None;
    loop {
        let Some(s) = service.upgrade() else { return };
        let peers: std::collections::BTreeSet<std::net::SocketAddr> =
            mesh_raft::members_of(&metrics.borrow_and_update())
                .into_values()
                .filter(|m| m.id != s.id)
                // allow(empty-on-error): a member known by a name, not an address, is served on the service runtime as before
                .filter_map(|m| m.addr.parse().ok())
                .collect();
        if named.as_ref() != Some(&peers) {
            s.endpoint
                .prefer(raft_thread.clone(), peers.iter().copied());
            named = Some(peers);
        }
        drop(s);
        if metrics.changed().await.is_err() {
            return;
        }
    }
}

/// Says loudly when the store's floor is below the one kept beside it (G9).
fn check_reset(id: u64, store_floor: u64, file_floor: u64) -> Option<String> {
    if store_floor >= file_floor {
        return None;
    }
    let message = format!(
        "STORE RESET: replica {id}'s store has epoch floor {store_floor} but {file_floor} was used before (epoch-floor file); the store was reset or restored from an old disk, so the next term starts above {file_floor}"
    );
    tracing::error!(replica = id, store_floor, file_floor, "{message}");
    Some(message)
}

/// Rewrites the floor file whenever the store's floor rises (checked on every metrics change).
async fn keep_floor(service: Weak<Service>, dir: std::path::PathBuf, mut written: u64) {
    let Some(mut metrics) = service.upgrade().map(|s| s.replica.metrics()) else {
        return;
    };
    while metrics.changed().await.is_ok() {
        let Some(s) = service.upgrade() else { return };
        let fatal = metrics
            .borrow()
            .running_state
            .as_ref()
            .err()
            .map(|f| f.to_string());
        if let Some(fatal) = fatal {
            s.fail(format!("openraft stopped: {fatal}"));
            return;
        }
        let floor = match s.app.state() {
            Ok(state) => state.epoch_floor,
            Err(e) => {
                s.fail(format!("cannot read the epoch floor from the store: {e}"));
                return;
            }
        };
        if let Ok(state) = s.app.state() {
            s.clear_if_proven(&state);
        }
        if floor > written {
            match write_floor(&dir, floor) {
                Ok(()) => written = floor,
                // Without the file, a store restored from an old disk could reuse an epoch (G9).
                Err(e) => {
                    s.fail(format!(
                        "cannot write the epoch floor file in {} (floor {floor}): {e}",
                        dir.display()
                    ));
                    return;
                }
            }
        }
        // A leader below the floor cannot push: move above it now (G9, decision 0151).
        let below = {
            let m = metrics.borrow();
            m.state == ServerState::Leader && m.current_term < floor
        };
        if below && let Err(e) = s.replica.raise_term_above(floor).await {
            tracing::warn!(replica = s.id, floor, error = %e, "leader below the epoch floor");
        }
    }
    // The metrics end only when openraft's core stopped; shutdown aborts this task before.
    if let Some(s) = service.upgrade() {
        let why = match &metrics.borrow().running_state {
            Err(fatal) => format!("openraft stopped: {fatal}"),
            Ok(()) => "openraft stopped without saying why".to_string(),
        };
        s.fail(why);
    }
}

/// Logs every change of leadership, so an operator reading one replica's log sees when it began and
/// stopped acting for an epoch (G3). Acting itself is gated by the lease on every step; this only
/// says so.
async fn announce_leadership(service: Weak<Service>) {
    let Some((id, mut metrics)) = service.upgrade().map(|s| (s.id, s.replica.metrics())) else {
        return;
    };
    let mut leading: Option<u64> = None;
    let mut office = super::metrics::Office::default();
    loop {
        let (state, term, acknowledged) = {
            let m = metrics.borrow_and_update();
            (m.state, m.current_term, m.millis_since_quorum_ack.is_some())
        };
        let now = (state == openraft::ServerState::Leader).then_some(term);
        // Counted apart from the log lines below: a leadership only counts once a quorum
        // acknowledged it (decision 0312), and the event log follows the same rule (decision
        // 0308), so a restarted ex-leader's leadership of its old term, never acknowledged, is
        // neither counted nor logged as an event.
        let held = office.held();
        let change = office.look(now, acknowledged);
        if let Some(s) = service.upgrade() {
            s.metrics.leadership(change);
            if let (true, Some(epoch)) = (change.lost, held) {
                s.events.stepped_down(id, epoch, term);
            }
            if let (true, Some(epoch)) = (change.won, office.held()) {
                s.events.took_office(id, epoch);
            }
        }
        if now != leading {
            if let Some(s) = service.upgrade() {
                // The leadership of the term left is dropped; the new term's is made here, unless
                // a report or a push of it came first (decision 0327).
                if let Some(epoch) = leading {
                    s.office.step_down(epoch);
                }
                if let Some(epoch) = now {
                    let _ = s.leadership_in(epoch);
                }
            }
            if let Some(epoch) = leading {
                tracing::warn!(
                    replica = id,
                    epoch,
                    now_term = term,
                    state = ?state,
                    "leader stopped acting: leadership of epoch {epoch} lost; nothing more is minted, recorded or sent under it"
                );
            }
            if let Some(epoch) = now {
                tracing::info!(
                    replica = id,
                    epoch,
                    "leader of term {epoch}: it acts (mints, records, sends) only inside a lease a quorum round confirms"
                );
                // Trust follows the membership (decision 0294): a replica left out of it, by a
                // recovery or a failed add, is retired by the first leader that sees it.
                let weak = service.clone();
                tokio::spawn(async move {
                    if let Some(s) = weak.upgrade() {
                        s.retire_outsiders(epoch).await;
                    }
                });
            }
            leading = now;
        }
        if metrics.changed().await.is_err() {
            return;
        }
    }
}

impl Running {
    /// The service, for tests and the binary.
    pub fn service(&self) -> &Arc<Service> {
        &self.service
    }

    /// Waits until the replica fails fatally (decision 0183) and says why; pending forever
    /// otherwise.
    pub async fn failed(&self) -> String {
        let mut fatal = self.service.fatal.subscribe();
        loop {
            if let Some(reason) = fatal.borrow_and_update().clone() {
                return reason;
            }
            if fatal.changed().await.is_err() {
                std::future::pending::<()>().await;
            }
        }
    }

    /// Hands leadership to an up-to-date follower when leading (decision 0152), stops serving,
    /// waits for in-flight requests, shuts Raft down and closes the store. `Some` names the taker.
    pub async fn shutdown(self) -> Result<Option<mesh_raft::HandedOver>, ServiceError> {
        let s = &self.service;
        let within = Duration::from_millis(handover_ms);
        let peers = s.members();
        let handed =
            mesh_raft::hand_over_over_quic(&s.replica, Some(&s.fence), &s.endpoint, &peers, within)
                .await;
        match &handed {
            Ok(done) => tracing::info!(replica = s.id, "stopping: leadership {done}"),
            Err(e) => tracing::info!(replica = s.id, "stopping without a handover: {e}"),
        }
        if let Some(http) = self.http {
            http.stop().await;
        }
        self.service.endpoint.close().await;
        self.floor_task.abort();
        self.leadership_task.abort();
        self.denied_task.abort();
        let mut deadline = tokio::time::Instant::now() + Duration::from_millis(shutdown_drain_ms);
        let mut service = self.service;
        let raft_runtime = self.raft_runtime;
        let mut raft_stopped = false;
        loop {
            match Arc::try_unwrap(service) {
                Ok(s) => {
                    s.replica.shutdown().await?;
                    // Raft stopped in order: nothing is left on its thread.
                    drop(raft_runtime);
                    tracing::info!(replica = s.id, "replica stopped");
                    return Ok(handed.ok());
                }
                Err(shared) => service = shared,
            }
            if tokio::time::Instant::now() >= deadline {
                if raft_stopped {
                    return Err(ServiceError::Busy {
                        ms: 2 * shutdown_drain_ms,
                    });
                }
                // A request still waiting holds the service, most likely on a write or read
                // that cannot finish (a leader cut off from its peers waits for a quorum that
                // does not come). Stopping Raft fails every such wait at once, so the store
                // can close instead of the stop failing (and meshd exiting non-zero).
                tracing::info!(
                    replica = service.id,
                    ms = shutdown_drain_ms,
                    "requests still in flight after the drain: stopping Raft under them"
                );
                if let Err(e) = service.replica.stop_raft().await {
                    tracing::warn!(replica = service.id, error = %e, "stopping Raft under the requests left");
                }
                raft_stopped = true;
                deadline = tokio::time::Instant::now() + Duration::from_millis(shutdown_drain_ms);
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

impl Service {
    pub fn id(&self) -> u64 {
        self.id
    }

    /// Runs `f` on the compose cache made current for `state`, off the async workers
    /// ([`off_the_workers`]).
    pub(crate) fn with_work<R>(
        &self,
        state: &Arc<crate::store::state::DomainState>,
        f: impl FnOnce(&super::engine::cache::Work) -> R,
    ) -> Result<R, super::api::ApiError> {
        off_the_workers(|| self.work.with(state, f))
    }

    pub fn endpoint(&self) -> &Endpoint {
        &self.endpoint
    }

    pub fn replica(&self) -> &Replica<MeshApp> {
        &self.replica
    }

    pub fn app(&self) -> &Arc<MeshApp> {
        &self.app
    }

    pub fn config(&self) -> &ReplicaConfig {
        &self.config
    }

    /// Stops the replica for good: logs `reason` as fatal once and tells whoever waits on
    /// [`Running::failed`] (meshd stops with a non-zero exit). A replica that cannot read its store
    /// or keep its epoch floor must not go on answering as if it could.
    pub(crate) fn fail(&self, reason: String) {
        let first = self.fatal.send_if_modified(|slot| {
            if slot.is_some() {
                return false;
            }
            *slot = Some(reason.clone());
            true
        });
        if first {
            tracing::error!(replica = self.id, %reason, "FATAL: the replica stops");
        }
    }

    /// Why the replica failed fatally, if it did.
    pub fn fatal(&self) -> Option<String> {
        self.fatal.borrow().clone()
    }

    /// The store-reset message found at start (G9), if any.
    pub fn store_reset(&self) -> Option<&str> {
        self.store_reset.as_deref()
    }

    /// Whether this replica leads right now (by its metrics).
    pub fn is_leader(&self) -> bool {
        let m = self.replica.metrics();
        let m = m.borrow();
        m.state == ServerState::Leader && m.current_leader == Some(self.id)
    }

    /// The leader this replica knows of, if any.
    pub fn leader(&self) -> Option<u64> {
        self.replica.metrics().borrow().current_leader
    }

    /// The domain state as an immutable snapshot (shared, not copied).
    pub(crate) fn state(&self) -> Result<Arc<DomainState>, ApiError> {
        self.app.state().map_err(|e| {
            let reason = format!("cannot read the domain state: {e}");
            self.fail(reason.clone());
            ApiError::Fatal { reason }
        })
    }

    /// The term this replica leads in, for a write that only changes the replicated state: its
    /// commit in that term is the proof it was decided by the leader of that term (G4), so it
    /// needs no lease round. Effects outside the cluster (sends) take a [`Service::lease`].
    pub(crate) fn leading_term(&self) -> Result<u64, ApiError> {
        let m = self.replica.metrics();
        let m = m.borrow();
        if m.state == ServerState::Leader && m.current_leader == Some(self.id) {
            return Ok(m.current_term);
        }
        Err(ApiError::NotLeader {
            replica: self.id,
            leader: m.current_leader,
        })
    }

    /// Before a read of the store is answered here: this replica still leads, confirmed by a
    /// quorum round, and its state machine has applied every entry committed before the read
    /// was asked (a read index: openraft's `ensure_linearizable`). A leader cut off from the
    /// others, which a newer leader may already have outwritten, answers no read from its stale
    /// store: it cannot confirm and says so (decision 0288). Takes no vote fence: a read acts on
    /// nothing outside the cluster.
    pub(crate) async fn read_index(&self) -> Result<(), ApiError> {
        let window = self.replica.config().lease_window();
        let round = tokio::time::timeout(window, self.replica.raft().ensure_linearizable()).await;
        match round {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(openraft::error::RaftError::APIError(
                openraft::error::CheckIsLeaderError::ForwardToLeader(to),
            ))) => Err(ApiError::NotLeader {
                replica: self.id,
                leader: to.leader_id,
            }),
            Ok(Err(e)) => Err(ApiError::NoLease {
                replica: self.id,
                reason: format!(
                    "replica {} could not confirm it still leads before answering a read ({e}); nothing stale is answered, ask again",
                    self.id
                ),
            }),
            Err(_) => Err(ApiError::NoLease {
                replica: self.id,
                reason: format!(
                    "replica {} could not confirm it still leads within {} ms before answering a read; nothing stale is answered, ask again",
                    self.id,
                    window.as_millis()
                ),
            }),
        }
    }

    /// A lease from the gate (G3): leadership confirmed by a quorum round.
    pub(crate) async fn lease(&self) -> Result<Lease, ApiError> {
        self.lease_round().await.map_err(|e| match e {
            GateError::NotLeader { leader } => ApiError::NotLeader {
                replica: self.id,
                leader,
            },
            other => ApiError::NoLease {
                replica: self.id,
                reason: other.to_string(),
            },
        })
    }

    /// [`Service::lease`] with the gate's own error, for a push that tells a round that did not
    /// confirm the term from one that lost it (decision 0270).
    pub(crate) async fn lease_round(&self) -> Result<Lease, GateError> {
        let round = Gate::acquire_fenced(
            self.replica.raft(),
            self.clock.as_ref(),
            self.replica.config(),
            &self.fence,
        )
        .await;
        self.metrics.lease_round(round.is_ok());
        match &round {
            Ok(lease) => tracing::debug!(
                replica = self.id,
                term = lease.term(),
                window_ms = self.replica.config().lease_window().as_millis() as u64,
                "lease confirmed by a quorum round"
            ),
            Err(e) => {
                tracing::info!(replica = self.id, error = %e, "no lease: the quorum round failed")
            }
        }
        round
    }

    /// Proposes `command` decided under `epoch` (and revision `expect`) and waits for its outcome;
    /// a refusal is an error.
    pub(crate) async fn propose(
        &self,
        epoch: u64,
        expect: Option<u64>,
        actor: &str,
        command: Command,
    ) -> Result<Applied, ApiError> {
        match self.propose_outcome(epoch, expect, actor, command).await? {
            Outcome::Applied(applied) => Ok(applied),
            Outcome::Refused(refusal) => Err(ApiError::refused(refusal)),
        }
    }

    /// Proposes `command` and answers the state machine's outcome, applied or refused.
    pub(crate) async fn propose_outcome(
        &self,
        epoch: u64,
        expect: Option<u64>,
        actor: &str,
        command: Command,
    ) -> Result<Outcome, ApiError> {
        let proposal = Proposal {
            epoch,
            expect_revision: expect,
            actor: actor.to_string(),
            time_ms: now_ms(),
            command,
        };
        let bytes = mesh_codec::encode("proposal", &proposal)
            .map_err(|e| ApiError::internal(format!("cannot encode the proposal: {e}")))?;
        let done = self.replica.propose(bytes).await.map_err(|e| {
            self.metrics.commit(Err(()));
            match e {
                ProposeError::NotLeader { .. } | ProposeError::Stopped => ApiError::NotCommitted {
                    reason: e.to_string(),
                },
                ProposeError::Timeout { timeout_ms } => ApiError::Timeout {
                    what: "the write's commit".into(),
                    waited_ms: timeout_ms,
                },
                ProposeError::TooLarge { bytes, max } => ApiError::ProposalTooLarge {
                    bytes: bytes as u64,
                    limit: max as u64,
                },
                ProposeError::Raft(reason) => ApiError::RaftFailed { reason },
            }
        })?;
        let outcome = decode_outcome(&done.response)
            .map_err(|e| ApiError::internal(format!("cannot decode the store's answer: {e}")))?;
        self.metrics
            .commit(Ok(matches!(outcome, Outcome::Applied(_))));
        Ok(outcome)
    }

    /// Answers an operator's request on this replica (which must lead) for `actor`, counted in
    /// the metrics by kind and latency.
    pub async fn handle(
        &self,
        actor: &str,
        id: RequestId,
        request: Request,
    ) -> Result<Body, ApiError> {
        self.handle_streamed(actor, id, request, &Sink::closed())
            .await
    }

    /// [`Service::handle`]; a push offers its lines to `lines` as they happen (decision 0190).
    pub(crate) async fn handle_streamed(
        &self,
        actor: &str,
        id: RequestId,
        request: Request,
        lines: &Sink,
    ) -> Result<Body, ApiError> {
        let kind = request_kind(&request);
        // A trust change is an event once done (decision 0308): described before the request moves.
        let trust = super::events::trust_change(actor, &request);
        let started = std::time::Instant::now();
        let answer = self.handle_uncounted(actor, id, request, lines).await;
        self.metrics.request(kind, started.elapsed(), &answer);
        if let (Some(draft), Ok(_)) = (trust, &answer) {
            self.note_events(vec![draft]);
        }
        answer
    }

    async fn handle_uncounted(
        &self,
        actor: &str,
        id: RequestId,
        request: Request,
        lines: &Sink,
    ) -> Result<Body, ApiError> {
        // Asked again (its answer was lost): the first outcome, and nothing runs twice.
        let first = self.state()?.remembered(&id).cloned();
        if let Some(first) = first {
            return self.answer_remembered(id, request, first).await;
        }
        match request {
            Request::Status => self.status().await,
            Request::Apply { mesh, why, drain } => self.apply(actor, id, mesh, why, drain).await,
            Request::Plan { target, moves } => {
                // A plan is a read of the model, settings and sends: a deposed leader must not
                // show what it would send from a model a newer leader replaced (decision 0288).
                self.read_index().await?;
                self.plan(target, moves).await
            }
            Request::Push {
                target,
                why,
                moves,
                plan,
            } => self.push(actor, id, target, why, moves, plan, lines).await,
            Request::SettingsShow { scope, history } => {
                self.read_index().await?;
                self.settings_show(scope, history)
            }
            Request::SettingsSet {
                scope,
                layer,
                remove,
                replace,
                why,
            } => {
                self.settings_set(actor, id, scope, layer, remove, replace, why)
                    .await
            }
            Request::SettingsClear { scope, why } => {
                self.settings_clear(actor, id, scope, why).await
            }
            Request::History { query } => {
                self.read_index().await?;
                self.history(&query)
            }
            Request::SnapshotChunk { snapshot, offset } => self.snapshot(snapshot, offset).await,
            Request::Genesis { machine, why } => self.genesis(actor, id, machine, why).await,
            Request::CertsReload => self.reload_certs().map(Body::CertsReloaded),
            Request::CertsList => self.certs_view().map(Body::Certs),
            Request::Logs { machine, ask } => self.logs(machine, ask).await,
            Request::ReplicasList => self.replicas_list().await,
            Request::ReplicasAdd { id, addr, key } => {
                self.replicas_add(actor, id, addr, key, lines).await
            }
            Request::ReplicasRemove { id } => self.replicas_remove(actor, id, lines).await,
            Request::CertsRevoke { target, why } => self.revoke(actor, id, target, why).await,
            Request::Events { query } => self.events_page(query).await,
            Request::ApplyChunk {
                upload,
                index,
                chunks_total,
                bytes_total,
                bytes,
            } => {
                let chunk = super::upload::ChunkRequest {
                    upload,
                    index,
                    chunks_total,
                    bytes_total,
                    bytes,
                };
                self.apply_chunk(actor, chunk).await
            }
            Request::ApplyUpload {
                upload,
                digest,
                why,
                drain,
            } => {
                self.apply_upload(actor, id, upload, digest, why, drain)
                    .await
            }
            Request::ModelShow { revision } => {
                // A read of the model: answered only by a leader that confirmed it leads.
                self.read_index().await?;
                self.model_show(revision)
            }
            Request::Rollback {
                to_revision,
                why,
                drain,
            } => self.rollback(actor, id, to_revision, why, drain).await,
            Request::SettingsRollback { scope, to, why } => {
                self.settings_rollback(actor, id, scope, to, why).await
            }
        }
    }

    /// An operator's command: handled here when leading, else forwarded to a leader that answers
    /// (G13, decision 0110); counted by kind and outcome as answered (`mesh_requests_total`).
    async fn command(
        &self,
        operator: &str,
        role: Option<Role>,
        body: &[u8],
        lines: &Sink,
    ) -> Answer {
        let call: Call = match mesh_codec::decode(request_what, body) {
            Ok(r) => r,
            Err(e) => {
                let reason = format!("bad request: {e}");
                let answer = self.answer(Err(ApiError::BadRequest { reason }));
                self.metrics.answered(unreadable_kind, &answer.body);
                return answer;
            }
        };
        let kind = request_kind(&call.request);
        let answer = self.command_call(operator, role, call, lines).await;
        self.metrics.answered(kind, &answer.body);
        answer
    }

    /// [`Service::command`] once its request decoded.
    async fn command_call(
        &self,
        operator: &str,
        role: Option<Role>,
        call: Call,
        lines: &Sink,
    ) -> Answer {
        let Call { id, request } = call;
        // G10: decided here, where the certificate was read; a forward carries only what passed.
        if let Err(forbidden) = super::roles::check(operator, role, &request) {
            tracing::warn!(%operator, error = %forbidden, "operator request refused by its role");
            return self.answer(Err(forbidden));
        }
        let actor = format!("operator:{operator}");
        // About this replica itself: answered here, leader or not (decision 0170).
        if matches!(
            request,
            Request::CertsReload | Request::CertsList | Request::Logs { .. }
        ) {
            return self.answer(self.handle(&actor, id, request).await);
        }
        if self.is_leader() {
            return self.answer(self.handle_streamed(&actor, id, request, lines).await);
        }
        // Status is a read every replica can answer: it does not wait out an election.
        let find = if request == Request::Status {
            Duration::ZERO
        } else {
            Duration::from_millis(forward_find_ms)
        };
        let forwarded = Forwarded {
            actor,
            via: self.id,
            id,
            request,
        };
        match self.forward_to_leader(&forwarded, find, lines).await {
            Ok(Some(mut answer)) => {
                answer.forwarded_by = Some(self.id);
                // The certificates this replica saw (the operator's own, say) warn too, not only
                // those the leader handshook with.
                if let Ok(Body::Status(view)) = &mut answer.body {
                    for cert in self.certs_expiring() {
                        if !view.certs_expiring.contains(&cert) {
                            view.certs_expiring.push(cert);
                        }
                    }
                }
                answer
            }
            // This replica was elected while looking.
            Ok(None) => {
                let Forwarded {
                    actor, id, request, ..
                } = forwarded;
                self.answer(self.handle_streamed(&actor, id, request, lines).await)
            }
            Err(_) if forwarded.request == Request::Status => self.answer(self.status().await),
            Err(e) => self.answer(Err(e)),
        }
    }

    /// Forwards to the leader this replica knows once that leader answered a probe; a leader that
    /// does not answer within the probe timeout, or cannot be dialled, counts as gone and the
    /// replica forwards to the next leader its Raft metrics name, until `find` has passed. `None`:
    /// this replica leads now. A request is written to a leader at most once, and only to one
    /// that answered just before, so nothing runs twice.
    async fn forward_to_leader(
        &self,
        forwarded: &Forwarded,
        find: Duration,
        lines: &Sink,
    ) -> Result<Option<Answer>, ApiError> {
        let started = tokio::time::Instant::now();
        let pause = Duration::from_millis(self.replica.config().settings().heartbeat_ms);
        let mut search = forwarding::Search::new(find, pause);
        let mut metrics = self.replica.metrics();
        let mut step = search.seen(self.seen(&mut metrics), started.elapsed());
        loop {
            step = match step {
                forwarding::Step::HandleHere => return Ok(None),
                forwarding::Step::Probe { leader } => {
                    let probed = self.probe_leader(leader, &mut metrics).await;
                    search.probed(leader, probed, started.elapsed())
                }
                // Once written, never again elsewhere: it may have run there.
                forwarding::Step::Forward { leader, addr } => {
                    return self.forward(leader, addr, forwarded, lines).await.map(Some);
                }
                forwarding::Step::Wait { at_most } => {
                    // Raft stopped under the request (the replica is shutting down): no leader
                    // will be named here any more.
                    if metrics.has_changed().is_err() {
                        return Err(ApiError::NoLeader {
                            replica: self.id,
                            waited_ms: started.elapsed().as_millis() as u64,
                            reason: "this replica is stopping (its Raft has stopped); ask another replica".to_string(),
                        });
                    }
                    // Until the metrics name another leader (or a heartbeat later, to ask again).
                    mesh_raft::changed_within(&mut metrics, at_most).await;
                    search.seen(self.seen(&mut metrics), started.elapsed())
                }
                forwarding::Step::GiveUp { find, why } => {
                    return Err(ApiError::NoLeader {
                        replica: self.id,
                        waited_ms: find.as_millis() as u64,
                        reason: why.to_string(),
                    });
                }
            };
        }
    }

    /// What the metrics say of the leader now (and marks them seen).
    fn seen(
        &self,
        metrics: &mut tokio::sync::watch::Receiver<mesh_raft::Metrics>,
    ) -> forwarding::Seen {
        let m = metrics.borrow_and_update();
        if m.state == ServerState::Leader && m.current_leader == Some(self.id) {
            return forwarding::Seen::LeadsHere;
        }
        match m.current_leader.filter(|l| *l != self.id) {
            Some(leader) => forwarding::Seen::Leader(leader),
            None => forwarding::Seen::NoLeader,
        }
    }

    /// Probes `leader`; the probe is dropped as soon as the metrics name another leader. Its
    /// timeout is half of `election_timeout_min`, so a dead leader costs less than an election
    /// does.
    async fn probe_leader(
        &self,
        leader: u64,
        metrics: &mut tokio::sync::watch::Receiver<mesh_raft::Metrics>,
    ) -> forwarding::Probed<std::net::SocketAddr> {
        // The membership's address first: a replica added later is in no `[peers]` (decision 0230).
        let Some(addr) = self.member_addr(leader) else {
            return forwarding::Probed::NoAddress {
                config: self.config.file().display().to_string(),
            };
        };
        let timeout =
            Duration::from_millis(self.replica.config().settings().election_timeout_min_ms / 2);
        let timings = self.replica.config().timings();
        let probe = mesh_raft::probe_replica(&self.endpoint, &timings, leader, addr, timeout);
        let moved = async {
            loop {
                if metrics.changed().await.is_err() {
                    std::future::pending::<()>().await;
                }
                if metrics.borrow().current_leader != Some(leader) {
                    return;
                }
            }
        };
        tokio::select! {
            probed = probe => match probed {
                Ok(p) if p.leads() => forwarding::Probed::Leads(addr),
                Ok(p) => forwarding::Probed::Follows { role: format!("{:?}", p.role), term: p.term },
                Err(e) => forwarding::Probed::Silent { waited_ms: timeout.as_millis() as u64, error: e.to_string() },
            },
            () = moved => forwarding::Probed::Moved,
        }
    }

    async fn forward(
        &self,
        leader: u64,
        addr: std::net::SocketAddr,
        forwarded: &Forwarded,
        lines: &Sink,
    ) -> Result<Answer, ApiError> {
        let body = mesh_codec::encode(forwarded_what, forwarded)
            .map_err(|e| ApiError::internal(format!("cannot encode the forwarded request: {e}")))?;
        let peer = Peer::expecting(addr, Principal::Replica(leader));
        let timeout = Duration::from_millis(forward_timeout_ms);
        let sent = if matches!(forwarded.request, Request::Push { .. }) {
            super::relay::relay(&self.endpoint, peer, body, timeout, lines).await
        } else {
            self.endpoint
                .request(peer, MessageKind::Forward, body, timeout)
                .await
        };
        let bytes = sent.map_err(|e: TransportError| ApiError::LeaderUnreachable {
            replica: self.id,
            leader,
            reason: e.to_string(),
        })?;
        mesh_codec::decode(answer_what, &bytes).map_err(|e| ApiError::LeaderAnswerUnreadable {
            reason: e.to_string(),
        })
    }

    /// A request another replica forwarded: handled only when this replica leads (no second hop).
    async fn forwarded(&self, from: u64, body: &[u8], lines: &Sink) -> Answer {
        let forwarded: Forwarded = match mesh_codec::decode(forwarded_what, body) {
            Ok(f) => f,
            Err(e) => {
                let reason = format!("bad forward: {e}");
                return self.answer(Err(ApiError::BadRequest { reason }));
            }
        };
        if forwarded.via != from {
            self.metrics.impostor("forward");
            return self.answer(Err(ApiError::BadRequest {
                reason: format!(
                    "replica {from} forwarded a request claiming to come via {}",
                    forwarded.via
                ),
            }));
        }
        if !self.is_leader() {
            return self.answer(Err(ApiError::NotLeader {
                replica: self.id,
                leader: self.leader().filter(|l| *l != self.id),
            }));
        }
        let Forwarded {
            actor, id, request, ..
        } = forwarded;
        self.answer(self.handle_streamed(&actor, id, request, lines).await)
    }

    fn answer(&self, body: Result<Body, ApiError>) -> Answer {
        Answer {
            replica: self.id,
            forwarded_by: None,
            body,
        }
    }

    /// A host's report (G5, G10): the leader files it; a follower names the leader without
    /// decoding it (the machine is in the frame's kind), so only the leader spends memory on a
    /// report, and never more than its bounds allow (issue 23 part 2, decision 0299). Every
    /// decision is the intake core's (`leadership::intake`, decision 0321): this reads the state
    /// once, asks it, and carries its admission out.
    async fn report(&self, frame_machine: &str, body: &[u8]) -> Result<ReportReply, ReportError> {
        if !self.is_leader() {
            self.metrics.report("not_leader");
            return Ok(self.not_leader());
        }
        // The report is this term's leadership's alone: one taken in term T never touches T+1's.
        let Some(leadership) = self.leadership_now() else {
            self.metrics.report("not_leader");
            return Ok(self.not_leader());
        };
        let term = leadership.term();
        // Before anything is decoded: one host's flood costs a few reports' work at a time.
        let Some(_turn) = leadership.handling.enter(frame_machine) else {
            return Ok(self.over_handling(&leadership, frame_machine));
        };
        let report = match decode_bounded(body) {
            Ok(Ok(report)) => report,
            Ok(Err(over)) => return Ok(self.over_bound(frame_machine, &over)),
            Err(e) => {
                self.metrics.report("error");
                return Err(ReportError::Undecodable(e));
            }
        };
        let admission = {
            // The snapshot is dropped before any wait: one held across an apply makes it copy.
            let state = match self.app.state() {
                Ok(state) => state,
                Err(e) => return Ok(self.undecided(frame_machine, &e)),
            };
            let trusted = self.proof_keys(&state);
            admit(Intake {
                term,
                frame_machine,
                report: &report,
                state: &state,
                trusted: &trusted,
                unproven: self.unproven.restored(),
            })
        };
        let (raise, mark) = match admission {
            Admission::Refused(refusal) => return self.refuse(&report, refusal),
            Admission::Admitted { raise, mark } => (raise, mark),
        };
        if let Some(raise) = raise {
            self.raise_floor(term, &report, raise).await;
        }
        // After the raise: a push of an unproven floor reads the mark only once it committed.
        if let Some(mark) = mark {
            self.note_mark(&leadership, &report, mark);
        }
        // Heard in memory, or filed in a shared proposal (decision 0216).
        Ok(self.take_report(&leadership, report, body.len()).await)
    }

    /// The answer when the state cannot be read to decide on a report of `machine`: try again
    /// (decision 0321). The report is not refused for good (the host keeps it on its disk and
    /// sends it again), and no check is skipped: nothing is decided without the state.
    pub(crate) fn undecided(&self, machine: &str, error: &mesh_raft::AppError) -> ReportReply {
        self.metrics.report("error");
        tracing::error!(%machine, error = %error, "cannot read the state to decide on a report; the host is told to try again");
        self.not_leader()
    }

    /// Carries out a refusal of the intake core: counted, logged at most once an interval per
    /// host, and the host told why (an impostor's request fails instead, G10).
    fn refuse(&self, report: &Report, refusal: Refusal) -> Result<ReportReply, ReportError> {
        let machine = report.machine.as_str();
        match refusal {
            Refusal::Impostor(mismatch) => {
                self.metrics.report("error");
                self.metrics.impostor("report");
                return Err(ReportError::Impostor(mismatch));
            }
            Refusal::OverBound(_) => {
                let reason = refusal.to_string();
                self.refused_for_size(machine, &reason);
                return Ok(ReportReply::Refused { reason });
            }
            Refusal::EpochUnproven { .. } => {
                let due = self.warn_due(machine, "unproven", std::time::Instant::now());
                if let Some(held_back) = due {
                    tracing::warn!(machine, epoch = report.epoch, reason = %refusal, held_back, "report refused: epoch above the floor without a proof");
                }
            }
            Refusal::Beyond { .. } => {}
        }
        self.metrics.report(refusal.counted_as());
        Ok(ReportReply::Refused {
            reason: refusal.to_string(),
        })
    }

    /// Raises the floor as the intake core decided (G9): once it is applied, `keep_floor` finds
    /// this leader's term below the floor and moves it above (decision 0151). A failed raise is
    /// logged; the next report that shows the epoch asks again.
    async fn raise_floor(&self, term: u64, report: &Report, raise: Raise) {
        let machine = report.machine.as_str();
        match &raise.why {
            RaiseWhy::Reused(why) => {
                tracing::warn!(machine, epoch = report.epoch, sequence = report.sequence, %why, floor = raise.floor, "a host holds an envelope of this leader's term that this store never recorded; raising the floor above the term");
            }
            RaiseWhy::Above { epoch } => {
                tracing::warn!(
                    machine,
                    epoch,
                    floor = raise.floor,
                    "a host reports an epoch above the floor; raising the floor"
                );
            }
        }
        let actor = format!("host:{machine}");
        let command = Command::RaiseEpochFloor { epoch: raise.floor };
        if let Err(e) = self.propose(term, None, &actor, command).await {
            tracing::warn!(epoch = raise.floor, error = %e, "could not raise the epoch floor");
        }
    }

    /// Counts a report of `machine` refused for its size (its frame or its contents) as
    /// `over_bound`, names the host in `status` while it keeps sending them (a machine of the
    /// model: the memory stays bounded by it), and warns at most once an interval per host.
    fn refused_for_size(&self, machine: &str, reason: &str) {
        self.metrics.report("over_bound");
        let now = std::time::Instant::now();
        // Only machines of the model are remembered (bounded memory); others are only logged.
        let known = match self.app.state() {
            Ok(state) => state.mesh.machines.contains_key(machine),
            Err(e) => {
                tracing::error!(error = %e, "cannot read the state to name a host refused for size");
                false
            }
        };
        // Named in `status` by this term's leadership; a replica that does not lead only logs.
        if known && let Some(leadership) = self.leadership_now() {
            leadership.live.note_refused(machine, reason, now);
        }
        if let Some(held_back) = self.warn_due(machine, "over bound", now) {
            tracing::warn!(machine, held_back, "{reason}");
        }
    }

    /// Refuses a report over its bounds for good (the host drops it): counted, logged at most
    /// once an interval per host, and its host named in `status` while it keeps sending them.
    fn over_bound(&self, machine: &str, over: &OverBound) -> ReportReply {
        let reason = Refusal::OverBound(over.clone()).to_string();
        self.refused_for_size(machine, &reason);
        ReportReply::Refused { reason }
    }

    /// The replica keys an epoch proof may be signed with: the added replicas' keys in the state,
    /// `trusted_keys` from replica.toml, and this replica's own.
    pub(crate) fn proof_keys(
        &self,
        state: &DomainState,
    ) -> std::collections::BTreeMap<u64, ed25519_dalek::VerifyingKey> {
        let mut trusted = super::members::signers_trusted(state);
        trusted.extend(self.config.trusted_keys().clone());
        trusted.insert(self.id, self.key.verifying_key());
        // A retired replica's key proves nothing (decision 0294), even to itself.
        for retired in super::members::retired(state) {
            trusted.remove(&retired);
        }
        trusted
    }

    /// Whether a warning of `kind` about `machine` is due: at most one a host and kind per
    /// interval (`Some(held back since the last)`).
    pub(crate) fn warn_due(
        &self,
        machine: &str,
        kind: &'static str,
        now: std::time::Instant,
    ) -> Option<u64> {
        self.warned.due((machine.to_string(), kind), now)
    }

    /// This replica's leadership of `term`: the one held, or made now when this replica leads in
    /// `term` as its Raft says and never held a later term; `None` for a term left or not led
    /// (decision 0327).
    pub(crate) fn leadership_in(&self, term: u64) -> Option<Arc<super::leadership::Leadership>> {
        let leads = {
            let m = self.replica.metrics();
            let m = m.borrow();
            m.state == ServerState::Leader
                && m.current_leader == Some(self.id)
                && m.current_term == term
        };
        self.office.of(term, leads)
    }

    /// The leadership of the term this replica leads in now, if it leads.
    pub(crate) fn leadership_now(&self) -> Option<Arc<super::leadership::Leadership>> {
        let (leads, term) = {
            let m = self.replica.metrics();
            let m = m.borrow();
            (
                m.state == ServerState::Leader && m.current_leader == Some(self.id),
                m.current_term,
            )
        };
        self.office.of(term, leads).filter(|_| leads)
    }

    pub(crate) fn not_leader(&self) -> ReportReply {
        let leader = self
            .leader()
            .filter(|l| *l != self.id)
            .and_then(|l| self.member_addr(l))
            .map(|a| a.to_string());
        ReportReply::NotLeader { leader }
    }
}

/// Wall-clock milliseconds since the Unix epoch (history only; never used to decide anything).
pub(crate) fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// The transport handler; holds the service weakly so shutdown can take it back.
struct Serving {
    service: Weak<Service>,
    /// The runtime the service serves on. A request that arrives on another (a fellow
    /// replica's connection runs on the Raft thread, decision 0338) and is more than a Raft
    /// message is handled here, so a forwarded push never runs on the Raft thread.
    runtime: tokio::runtime::Handle,
}

impl Handler for Serving {
    fn request(
        &self,
        from: Principal,
        kind: MessageKind,
        body: Vec<u8>,
    ) -> BoxFuture<'_, Result<Vec<u8>, String>> {
        self.request_streamed(from, kind, body, Sink::closed())
    }

    /// Only a push streams (its lines, decision 0190); every other answer is one frame.
    fn request_streamed(
        &self,
        from: Principal,
        kind: MessageKind,
        body: Vec<u8>,
        lines: Sink,
    ) -> BoxFuture<'_, Result<Vec<u8>, String>> {
        Box::pin(async move {
            let Some(service) = self.service.upgrade() else {
                return Err("the replica is stopping".to_string());
            };
            match (kind, from) {
                (MessageKind::Raft, Principal::Replica(cert)) => {
                    let timings = service.replica.config().timings();
                    let raft = service.replica.raft();
                    let answered = mesh_raft::answer_raft_rpc(
                        raft,
                        &timings,
                        cert,
                        &body,
                        Some(&service.fence),
                    )
                    .await;
                    if let Err(mesh_raft::Unanswered::Impostor(_)) = &answered {
                        service.metrics.impostor("raft");
                    }
                    answered.map_err(|e| e.to_string())
                }
                // Served by `request_with_role`, which the transport calls: never without the
                // role the operator's certificate states.
                (MessageKind::Command, Principal::Operator(name)) => Err(format!(
                    "replica does not serve operator:{name}'s command without its certificate's role"
                )),
                (MessageKind::Forward, Principal::Replica(id)) => {
                    let forwarded =
                        async move { encode_answer(&service.forwarded(id, &body, &lines).await) };
                    self.runtime
                        .spawn(forwarded)
                        .await
                        .map_err(|e| format!("the forwarded request's task ended: {e}"))?
                }
                (MessageKind::Report { machine }, Principal::Host(_)) => {
                    let reply = service
                        .report(&machine, &body)
                        .await
                        .map_err(|e| e.to_string())?;
                    mesh_codec::encode(report_reply_what, &reply).map_err(|e| e.to_string())
                }
                (kind, from) => Err(format!("replica does not serve {kind} from {from}")),
            }
        })
    }

    /// An operator's command, with the role its certificate states (decision 0295): checked here,
    /// on the replica holding the operator's connection, before it is answered or forwarded.
    fn request_with_role(
        &self,
        from: Principal,
        role: Option<Role>,
        kind: MessageKind,
        body: Vec<u8>,
        sink: Option<Sink>,
    ) -> BoxFuture<'_, Result<Vec<u8>, String>> {
        let lines = sink.unwrap_or_else(Sink::closed);
        let (MessageKind::Command, Principal::Operator(name)) = (&kind, &from) else {
            return self.request_streamed(from, kind, body, lines);
        };
        let name = name.clone();
        Box::pin(async move {
            let Some(service) = self.service.upgrade() else {
                return Err("the replica is stopping".to_string());
            };
            encode_answer(&service.command(&name, role, &body, &lines).await)
        })
    }

    /// A host's frame over `report_frame_bytes_max`: counted and named as a report over its
    /// bounds (decision 0299), as the report handler would have, had the frame been readable.
    fn frame_refused(&self, from: &Principal, reason: &str) {
        let (Principal::Host(machine), Some(service)) = (from, self.service.upgrade()) else {
            return;
        };
        if !service.is_leader() {
            return;
        }
        service.refused_for_size(machine, reason);
    }

    fn one_way(&self, from: Principal, kind: MessageKind, _body: Vec<u8>) -> BoxFuture<'_, ()> {
        Box::pin(async move {
            tracing::warn!(%from, %kind, "one-way message ignored: replicas answer requests only");
        })
    }
}

fn encode_answer(answer: &Answer) -> Result<Vec<u8>, String> {
    mesh_codec::encode(answer_what, answer).map_err(|e| e.to_string())
}
