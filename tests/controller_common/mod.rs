//! A bed for controller tests: three replica services from the library over real QUIC on loopback,
//! certificates from mesh-testkit's PKI in a temp dir, in-process mesh-host agents (listener, QUIC
//! report sink, reconcile loop) stopped on drop, and an operator endpoint that issues `Request`s.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use ed25519_dalek::SigningKey;
use mesh::controller::api::{Answer, ApiError, Body, PushTarget, Request};
use mesh::controller::config::{ReplicaConfig, ReplicaConfigFile, TlsFile, write_signing_key};
use mesh::controller::{Running, Service};
use mesh::core::model::Mesh;
use mesh::core::report::Report;
use mesh::core::wire::{ReportReply, report_reply_what, report_what};
use mesh::host::config::encode_hex;
use mesh::host::{Agent, HostConfig, QuicSink, listener};
use mesh_raft::{Clock, MonotonicClock};
#[allow(unused_imports)] // each test binary uses some of them
pub use mesh_testkit::model::{machine, mount_mesh, provider_consumer_mesh, sleeper};
#[allow(unused_imports)]
pub use mesh_testkit::{Pki, fast_raft, wait_deadline, wait_until, wait_value};
use mesh_transport::{Endpoint, MessageKind, Peer, Principal, TransportConfig};
use openraft::ServerState;
use tokio::sync::watch;

/// `silent_after_ms` of this bed's replicas: three of its hosts' 500 ms report intervals.
pub const silent_after_ms_bed: u64 = 1_500;

pub fn transport() -> TransportConfig {
    TransportConfig {
        request_timeout_ms: 3_000,
        ..TransportConfig::default()
    }
}

/// One in-process mesh-host.
pub struct Host {
    pub name: String,
    pub agent: Arc<Agent>,
    pub endpoint: Endpoint,
    pub stop: watch::Sender<bool>,
    pub root: PathBuf,
}

pub struct Bed {
    pub dir: tempfile::TempDir,
    pub pki: Pki,
    pub replicas: BTreeMap<u64, Running>,
    pub configs: BTreeMap<u64, ReplicaConfig>,
    pub addrs: BTreeMap<u64, SocketAddr>,
    pub hosts: BTreeMap<String, Host>,
    pub operator: Endpoint,
}

/// An envelope for `machine` at `epoch.sequence` signed as replica `signer`, declaring nothing:
/// what a test forges or replays by hand.
pub fn bare_envelope(
    machine: &str,
    epoch: u64,
    sequence: u64,
    signer: u64,
) -> mesh::core::envelope::Envelope {
    mesh::core::envelope::Envelope {
        machine: machine.into(),
        epoch,
        sequence,
        signer,
        moves: vec![],
        declaration: mesh::core::declaration::Declaration {
            machine: machine.into(),
            modules: vec![],
            revoked: Default::default(),
            signers: Default::default(),
        },
    }
}

pub fn replica_key(id: u64) -> SigningKey {
    SigningKey::from_bytes(&[id as u8 + 40; 32])
}

impl Bed {
    /// Three replicas and one in-process host per name in `machines`; `fake` names addresses that
    /// stand in for a host (a test's own endpoint).
    pub async fn start(machines: &[&str], fake: &[(&str, SocketAddr)]) -> Bed {
        Bed::start_n(3, machines, fake).await
    }

    /// Like [`Bed::start`] with `n` replicas.
    pub async fn start_n(n: u64, machines: &[&str], fake: &[(&str, SocketAddr)]) -> Bed {
        Bed::start_with_clock(n, machines, fake, Arc::new(MonotonicClock)).await
    }

    /// Like [`Bed::start_n`], every replica reading time from `clock`.
    pub async fn start_with_clock(
        n: u64,
        machines: &[&str],
        fake: &[(&str, SocketAddr)],
        clock: Arc<dyn Clock>,
    ) -> Bed {
        let dir = tempfile::tempdir().expect("tempdir");
        let pki = Pki::in_dir(&dir.path().join("pki"));
        let mut endpoints = BTreeMap::new();
        let mut addrs = BTreeMap::new();
        for id in 1..=n {
            let e = Endpoint::bind(
                mesh_testkit::loopback(),
                &pki.identity(&Principal::Replica(id)),
                transport().check().expect("transport"),
            )
            .expect("bind replica");
            addrs.insert(id, e.local_addr());
            endpoints.insert(id, e);
        }
        let mut hosts = BTreeMap::new();
        for m in machines {
            let host = start_host(dir.path(), &pki, m, &addrs).await;
            hosts.insert(m.to_string(), host);
        }
        let mut host_addrs: BTreeMap<String, String> = hosts
            .iter()
            .map(|(m, h)| (m.clone(), h.endpoint.local_addr().to_string()))
            .collect();
        for (m, a) in fake {
            host_addrs.insert(m.to_string(), a.to_string());
        }
        let mut bed = Bed {
            operator: Endpoint::bind(
                mesh_testkit::loopback(),
                &pki.identity(&Principal::Operator("alice".into())),
                transport().check().expect("transport"),
            )
            .expect("bind operator"),
            dir,
            pki,
            replicas: BTreeMap::new(),
            configs: BTreeMap::new(),
            addrs,
            hosts,
        };
        for (id, endpoint) in endpoints {
            let config = bed.write_config(id, &host_addrs);
            bed.configs.insert(id, config.clone());
            let running = mesh::controller::start_on(config, endpoint, clock.clone())
                .await
                .expect("replica starts");
            bed.replicas.insert(id, running);
        }
        bed
    }

    pub fn write_config(&self, id: u64, hosts: &BTreeMap<String, String>) -> ReplicaConfig {
        let sub = format!("replica-{id}");
        let (cert, key) = self.pki.write(&sub, &Principal::Replica(id));
        let signing = self.dir.path().join(format!("{sub}.key"));
        write_signing_key(&signing, &replica_key(id)).expect("signing key");
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
            hosts: hosts.clone(),
            raft: Some(fast_raft()),
            transport: Some(transport()),
            http: None,
            // Three of this bed's host report intervals (500 ms), as `meshctl init` writes.
            silent_after_ms: Some(silent_after_ms_bed),
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
        std::fs::write(&path, file.to_toml().expect("toml")).expect("write config");
        ReplicaConfig::load(&path).expect("config valid")
    }

    pub fn service(&self, id: u64) -> &Arc<Service> {
        self.replicas[&id].service()
    }

    pub async fn wait_leader(&self) -> u64 {
        self.wait_leader_among(&self.replicas.keys().copied().collect::<Vec<_>>(), 0)
            .await
            .0
    }

    /// Cuts the leader `old` off from the other replicas (both ways) and waits until one of them
    /// leads in a term above `old`'s; returns that leader and its term.
    pub async fn isolate_and_elect(&self, old: u64) -> (u64, u64) {
        let old_term = self.service(old).replica().metrics().borrow().current_term;
        self.isolate(old);
        let rest: Vec<u64> = self
            .replicas
            .keys()
            .copied()
            .filter(|id| *id != old)
            .collect();
        self.wait_leader_among(&rest, old_term).await
    }

    /// Waits until one of `among` leads in a term above `above`; returns it and its term.
    pub async fn wait_leader_among(&self, among: &[u64], above: u64) -> (u64, u64) {
        let what = format!("a leader above term {above} among {among:?}");
        wait_value(&what, || {
            let led = among.iter().find_map(|id| {
                let m = self.service(*id).replica().metrics().borrow().clone();
                (m.state == ServerState::Leader && m.current_term > above)
                    .then_some((*id, m.current_term))
            });
            std::future::ready(led)
        })
        .await
    }

    /// Replica `id`'s current Raft term.
    pub fn term(&self, id: u64) -> u64 {
        self.service(id).replica().metrics().borrow().current_term
    }

    /// The epoch floor replica `id`'s status shows.
    pub async fn epoch_floor(&self, id: u64) -> u64 {
        let Body::Status(status) = self.ok(id, &Request::Status).await else {
            panic!("status")
        };
        status.epoch_floor
    }

    /// An endpoint on a free loopback port presenting `principal`'s certificate (a host, or a
    /// replica's key, sending by hand).
    pub fn endpoint_as(&self, principal: &Principal) -> Endpoint {
        Endpoint::bind(
            "127.0.0.1:0".parse().expect("addr"),
            &self.pki.identity(principal),
            transport().check().expect("transport"),
        )
        .expect("bind")
    }

    /// Sends `report` from `from` (an endpoint presenting its machine's certificate) to replica
    /// `to`, as a host's sink does, and decodes the reply.
    pub async fn file_report(&self, from: &Endpoint, to: u64, report: &Report) -> ReportReply {
        let body = mesh_codec::encode(report_what, report).expect("encode");
        let kind = MessageKind::Report {
            machine: report.machine.clone(),
        };
        let answer = from
            .request(self.addrs[&to], kind, body, Duration::from_secs(5))
            .await
            .expect("answer");
        mesh_codec::decode(report_reply_what, &answer).expect("reply")
    }

    pub fn follower(&self, leader: u64) -> u64 {
        *self
            .replicas
            .keys()
            .find(|id| **id != leader)
            .expect("a follower")
    }

    /// An endpoint on a free loopback port presenting operator `name`'s certificate stating
    /// `role` (decision 0295); ask with [`Bed::ask_from`].
    pub fn operator_as(&self, name: &str, role: mesh_transport::Role) -> Endpoint {
        Endpoint::bind(
            "127.0.0.1:0".parse().expect("addr"),
            &self.pki.operator_identity(name, role),
            transport().check().expect("transport"),
        )
        .expect("bind")
    }

    /// Sends `request` to replica `id` as operator alice (whose certificate states no role).
    pub async fn ask(&self, id: u64, request: &Request) -> Answer {
        self.ask_from(&self.operator, id, request).await
    }

    /// Sends `request` to replica `id` from `operator`, an operator's endpoint.
    pub async fn ask_from(&self, operator: &Endpoint, id: u64, request: &Request) -> Answer {
        let call = mesh::controller::api::Call::new(request.clone()).expect("a request id");
        let body = mesh_codec::encode("request", &call).expect("encode");
        let peer = Peer::expecting(self.addrs[&id], Principal::Replica(id));
        let bytes = operator
            .request(peer, MessageKind::Command, body, Duration::from_secs(30))
            .await
            .expect("replica answers");
        mesh_codec::decode("answer", &bytes).expect("decode answer")
    }

    /// Asks the leader and expects success.
    pub async fn ok(&self, id: u64, request: &Request) -> Body {
        let answer = self.ask(id, request).await;
        answer
            .body
            .unwrap_or_else(|e| panic!("{request:?} failed: {e:?}"))
    }

    pub async fn apply(&self, leader: u64, mesh: &Mesh) -> Body {
        self.ok(
            leader,
            &Request::Apply {
                mesh: mesh.clone(),
                why: "test".into(),
                drain: false,
            },
        )
        .await
    }

    pub async fn push(&self, via: u64, machine: &str, moves: &[&str]) -> Result<Body, ApiError> {
        let request = Request::Push {
            target: PushTarget::Machine(machine.into()),
            why: "test push".into(),
            moves: moves.iter().map(|m| m.to_string()).collect(),
            plan: None,
        };
        self.ask(via, &request).await.body
    }

    /// Cuts replica `id` off from the other replicas, both directions.
    pub fn isolate(&self, id: u64) {
        for (other, addr) in &self.addrs {
            if *other == id {
                continue;
            }
            self.service(id).endpoint().faults().cut_off(*addr);
            self.service(*other)
                .endpoint()
                .faults()
                .cut_off(self.addrs[&id]);
        }
    }

    /// Starts replica `id` again from its config and files, on its old address.
    /// The old endpoint's port is let go once its tasks end, which for the connections served on
    /// the stopped replica's Raft thread (decision 0338) is as that thread's runtime winds down:
    /// the bind is tried again until a deadline.
    pub async fn restart_replica(&mut self, id: u64) {
        let identity = self.pki.identity(&Principal::Replica(id));
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        let endpoint = loop {
            match Endpoint::bind(
                self.addrs[&id],
                &identity,
                transport().check().expect("transport"),
            ) {
                Ok(endpoint) => break endpoint,
                Err(e) => assert!(
                    tokio::time::Instant::now() < deadline,
                    "rebind the replica's port: {e}"
                ),
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        let running = mesh::controller::start_on(
            self.configs[&id].clone(),
            endpoint,
            Arc::new(MonotonicClock),
        )
        .await
        .expect("replica restarts");
        self.replicas.insert(id, running);
    }

    pub async fn stop_replica(&mut self, id: u64) {
        let running = self.replicas.remove(&id).expect("running");
        running.shutdown().await.expect("clean shutdown");
    }

    pub async fn shutdown(mut self) {
        let ids: Vec<u64> = self.replicas.keys().copied().collect();
        for id in ids {
            self.stop_replica(id).await;
        }
        for host in self.hosts.values() {
            let _ = host.stop.send(true);
            host.endpoint.close().await;
            host.agent.shutdown().await;
        }
        self.hosts.clear();
    }
}

impl Drop for Host {
    fn drop(&mut self) {
        // Stop every module the agent started, even when a test panicked.
        let _ = self.stop.send(true);
        let agent = self.agent.clone();
        if let Ok(handle) = tokio::runtime::Handle::try_current() {
            tokio::task::block_in_place(|| handle.block_on(agent.shutdown()));
        }
    }
}

async fn start_host(
    dir: &Path,
    pki: &Pki,
    name: &str,
    replicas: &BTreeMap<u64, SocketAddr>,
) -> Host {
    let sub = format!("host-{name}");
    let (cert, key) = pki.write(&sub, &Principal::Host(name.into()));
    let root = dir.join(&sub).join("root");
    let trusted: Vec<String> = (1..=3u64)
        .map(|id| {
            format!(
                "{id} = \"{}\"",
                encode_hex(replica_key(id).verifying_key().as_bytes())
            )
        })
        .collect();
    let list: Vec<String> = replicas.values().map(|a| format!("\"{a}\"")).collect();
    let text = format!(
        "name = \"{name}\"\nroot = \"{}\"\nmounts_root = \"{}\"\nlisten = \"127.0.0.1:0\"\nreplicas = [{}]\nreconcile_interval_ms = 500\n[tls]\nca = \"{}\"\ncert = \"{}\"\nkey = \"{}\"\n[trusted_keys]\n{}\n",
        root.display(),
        dir.join(&sub).join("mounts").display(),
        list.join(", "),
        pki.ca_path().display(),
        cert.display(),
        key.display(),
        trusted.join("\n")
    );
    let path = dir.join(format!("{sub}.toml"));
    std::fs::write(&path, text).expect("host.toml");
    let config = HostConfig::load(&path).expect("host config");
    let endpoint = listener::bind(&config).expect("host binds");
    let sink = QuicSink::new(endpoint.clone(), name, config.replicas().to_vec());
    let agent = Arc::new(Agent::open(config, Arc::new(sink)).expect("agent opens"));
    agent.start().await.expect("agent starts");
    let _fatal = listener::serve(&endpoint, agent.clone()).expect("serve");
    let (stop, stop_rx) = watch::channel(false);
    {
        let agent = agent.clone();
        tokio::spawn(async move { agent.reconcile(stop_rx).await });
    }
    Host {
        name: name.into(),
        agent,
        endpoint,
        stop,
        root,
    }
}
