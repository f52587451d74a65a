//! Raft over real QUIC on loopback: three in-process replicas (the KV test app) elect a leader, commit,
//! and a replica whose log was purged catches up by a snapshot sent in pieces under the frame limit.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use mesh_raft::kv::{self, KvApp, Set};
use mesh_raft::{
    BasicNode, NodeId, QuicNetwork, Raft, RaftConfig, RaftSettings, Replica, ReplicaSpec,
};
use mesh_transport::{
    BoxFuture, Ca, Endpoint, Handler, Identity, MessageKind, Principal, TransportConfig, Validity,
};
use openraft::ServerState;
use redb::ReadableDatabase;

/// How long any condition may take before the test fails.
const wait_deadline: Duration = Duration::from_secs(20);
/// A small frame limit, so the snapshot below must travel in several pieces.
const frame_bytes_max: u32 = 256 * 1024;

struct RaftHandler {
    raft: Raft,
}

impl Handler for RaftHandler {
    fn request(
        &self,
        _from: Principal,
        kind: MessageKind,
        body: Vec<u8>,
    ) -> BoxFuture<'_, Result<Vec<u8>, String>> {
        Box::pin(async move {
            match kind {
                MessageKind::Raft => mesh_raft::answer_raft_rpc(&self.raft, &body).await,
                other => Err(format!("this test replica serves raft only, not {other}")),
            }
        })
    }

    fn one_way(&self, _from: Principal, _kind: MessageKind, _body: Vec<u8>) -> BoxFuture<'_, ()> {
        Box::pin(async {})
    }
}

struct Node {
    replica: Replica<KvApp>,
    endpoint: Endpoint,
}

struct Cluster {
    ca: Ca,
    root: tempfile::TempDir,
    config: RaftConfig,
    addrs: BTreeMap<NodeId, SocketAddr>,
    nodes: BTreeMap<NodeId, Node>,
}

fn transport() -> mesh_transport::CheckedConfig {
    TransportConfig {
        frame_bytes_max,
        request_timeout_ms: 2000,
        ..TransportConfig::default()
    }
    .check()
    .expect("transport config")
}

fn identity(ca: &Ca, id: NodeId) -> Identity {
    let cert = ca
        .issue(&Principal::Replica(id), Validity::days_from_now(1))
        .expect("issue");
    Identity::from_pem(ca.cert_pem(), cert.cert_pem(), cert.key_pem()).expect("identity")
}

impl Cluster {
    async fn start(settings: RaftSettings) -> Cluster {
        let ca = Ca::create(Validity::days_from_now(1)).expect("CA");
        let mut endpoints = BTreeMap::new();
        for id in 1..=3 {
            let any: SocketAddr = "127.0.0.1:0".parse().expect("addr");
            let endpoint = Endpoint::bind(any, &identity(&ca, id), transport()).expect("bind");
            endpoints.insert(id, endpoint);
        }
        let addrs = endpoints
            .iter()
            .map(|(id, e)| (*id, e.local_addr()))
            .collect();
        let mut cluster = Cluster {
            ca,
            root: tempfile::tempdir().expect("tempdir"),
            config: settings.validate().expect("settings"),
            addrs,
            nodes: BTreeMap::new(),
        };
        for (id, endpoint) in endpoints {
            cluster.start_node(id, endpoint).await;
        }
        cluster
    }

    fn members(&self) -> BTreeMap<NodeId, BasicNode> {
        self.addrs
            .iter()
            .map(|(id, a)| (*id, BasicNode::new(a.to_string())))
            .collect()
    }

    fn dir(&self, id: NodeId) -> std::path::PathBuf {
        self.root.path().join(format!("replica-{id}"))
    }

    async fn start_node(&mut self, id: NodeId, endpoint: Endpoint) {
        let spec = ReplicaSpec {
            id,
            dir: self.dir(id),
            config: self.config.clone(),
            term_floor: 0,
            bootstrap: Some(self.members()),
        };
        let network = QuicNetwork::new(endpoint.clone());
        let replica = Replica::start(spec, network, Arc::new(KvApp))
            .await
            .expect("replica starts");
        let handler = RaftHandler {
            raft: replica.raft().clone(),
        };
        assert!(endpoint.serve(Arc::new(handler)));
        self.nodes.insert(id, Node { replica, endpoint });
    }

    async fn stop(&mut self, id: NodeId) {
        let node = self.nodes.remove(&id).expect("running");
        node.endpoint.close().await;
        node.replica.shutdown().await.expect("clean shutdown");
    }

    async fn restart(&mut self, id: NodeId) {
        let endpoint = Endpoint::bind(self.addrs[&id], &identity(&self.ca, id), transport())
            .expect("rebind the same port");
        self.start_node(id, endpoint).await;
    }

    fn replica(&self, id: NodeId) -> &Replica<KvApp> {
        &self.nodes[&id].replica
    }

    async fn wait_leader(&self) -> NodeId {
        let deadline = tokio::time::Instant::now() + wait_deadline;
        loop {
            for (id, node) in &self.nodes {
                if node.replica.metrics().borrow().state == ServerState::Leader {
                    return *id;
                }
            }
            assert!(tokio::time::Instant::now() < deadline, "no leader elected");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    async fn set(&self, via: NodeId, key: &str, value: Vec<u8>) -> u64 {
        let command = Set {
            key: key.into(),
            value,
        }
        .encode()
        .expect("encode");
        let done = self.replica(via).propose(command).await.expect("commits");
        done.index()
    }

    async fn wait_applied(&self, id: NodeId, index: u64) {
        self.replica(id)
            .raft()
            .wait(Some(wait_deadline))
            .applied_index_at_least(Some(index), "replica catches up")
            .await
            .expect("replica applies the index");
    }

    fn read(&self, id: NodeId, key: &str) -> Option<Vec<u8>> {
        let txn = self.replica(id).database().begin_read().expect("read");
        kv::read(&txn, key).expect("read key")
    }
}

fn fast_settings() -> RaftSettings {
    RaftSettings {
        heartbeat_ms: 50,
        election_timeout_min_ms: 400,
        election_timeout_max_ms: 800,
        lease_margin_ms: 80,
        propose_timeout_ms: 10_000,
        ..RaftSettings::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_replicas_over_quic_elect_commit_and_replicate() {
    // Raft over QUIC: a leader is elected and a committed write is applied on every replica.
    let cluster = Cluster::start(fast_settings()).await;
    let leader = cluster.wait_leader().await;
    let index = cluster.set(leader, "k", b"v".to_vec()).await;
    for id in 1..=3 {
        cluster.wait_applied(id, index).await;
        assert_eq!(cluster.read(id, "k").as_deref(), Some(&b"v"[..]));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn follower_behind_a_purged_log_catches_up_by_snapshot_over_quic() {
    // Snapshots over QUIC: a follower that missed purged entries installs a snapshot larger than the
    // frame limit, sent in pieces.
    let settings = RaftSettings {
        snapshot_logs_since_last: 20,
        logs_kept_after_snapshot: 0,
        ..fast_settings()
    };
    let mut cluster = Cluster::start(settings).await;
    let leader = cluster.wait_leader().await;
    let follower = (1..=3).find(|id| *id != leader).expect("a follower");
    let seen = cluster.set(leader, "seen", b"yes".to_vec()).await;
    cluster.wait_applied(follower, seen).await;
    cluster.stop(follower).await;
    let mut last = seen;
    // 60 values of 8 KiB: the snapshot is about twice the frame limit.
    for i in 0..60u8 {
        last = cluster
            .set(leader, &format!("k{i}"), vec![i; 8 * 1024])
            .await;
    }
    cluster
        .replica(leader)
        .raft()
        .wait(Some(wait_deadline))
        .metrics(
            |m| m.purged.map(|p| p.index).unwrap_or(0) > seen + 1,
            "leader purges past what the follower has",
        )
        .await
        .expect("leader purges its log");
    cluster.restart(follower).await;
    cluster.wait_applied(follower, last).await;
    let m = cluster.replica(follower).metrics().borrow().clone();
    assert!(
        m.snapshot.map(|s| s.index).unwrap_or(0) > seen,
        "follower installed a snapshot: {:?}",
        m.snapshot
    );
    assert_eq!(cluster.read(follower, "k0"), Some(vec![0; 8 * 1024]));
    assert_eq!(cluster.read(follower, "k59"), Some(vec![59; 8 * 1024]));
}
