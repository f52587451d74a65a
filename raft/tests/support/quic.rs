//! Test support: replicas in one process over real QUIC on loopback (the KV test app), each with
//! its own Raft settings, serving Raft the way meshd does (timings checked, votes fenced).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use mesh_raft::kv::{self, KvApp, Set};
use mesh_raft::{
    BasicNode, MonotonicClock, NodeId, QuicNetwork, Raft, RaftConfig, RaftSettings, Replica,
    ReplicaSpec, Timings, VoteFence,
};
use mesh_transport::{
    BoxFuture, Ca, Endpoint, Handler, Identity, MessageKind, Principal, TransportConfig, Validity,
};
use openraft::ServerState;
use redb::ReadableDatabase;

use super::wait_deadline;

/// Serves Raft for one replica: the timings check and the vote fence, as meshd's handler does.
pub struct RaftHandler {
    pub raft: Raft,
    pub timings: Timings,
    pub fence: Arc<VoteFence>,
}

impl Handler for RaftHandler {
    fn request(
        &self,
        from: Principal,
        kind: MessageKind,
        body: Vec<u8>,
    ) -> BoxFuture<'_, Result<Vec<u8>, String>> {
        Box::pin(async move {
            match (kind, from) {
                (MessageKind::Raft, Principal::Replica(cert)) => mesh_raft::answer_raft_rpc(
                    &self.raft,
                    &self.timings,
                    cert,
                    &body,
                    Some(&self.fence),
                )
                .await
                .map_err(|e| e.to_string()),
                (other, _) => Err(format!(
                    "this test replica serves raft from replicas only, not {other}"
                )),
            }
        })
    }

    fn one_way(&self, _from: Principal, _kind: MessageKind, _body: Vec<u8>) -> BoxFuture<'_, ()> {
        Box::pin(async {})
    }
}

pub struct Node {
    pub replica: Replica<KvApp>,
    pub endpoint: Endpoint,
    pub fence: Arc<VoteFence>,
}

pub struct QuicCluster {
    pub ca: Ca,
    pub root: tempfile::TempDir,
    pub configs: BTreeMap<NodeId, RaftConfig>,
    pub addrs: BTreeMap<NodeId, SocketAddr>,
    pub nodes: BTreeMap<NodeId, Node>,
    pub frame_bytes_max: u32,
}

pub fn identity(ca: &Ca, id: NodeId) -> Identity {
    let cert = ca
        .issue(&Principal::Replica(id), Validity::days_from_now(1))
        .expect("issue");
    Identity::from_pem(ca.cert_pem(), cert.cert_pem(), cert.key_pem()).expect("identity")
}

impl QuicCluster {
    /// Starts replicas `1..=settings.len()`, replica `k` with `settings[k-1]`, all bootstrapped with
    /// the same membership, frames limited to `frame_bytes_max`.
    pub async fn start(settings: Vec<RaftSettings>, frame_bytes_max: u32) -> QuicCluster {
        let ca = Ca::create(Validity::days_from_now(1)).expect("CA");
        let mut cluster = QuicCluster {
            ca,
            root: tempfile::tempdir().expect("tempdir"),
            configs: BTreeMap::new(),
            addrs: BTreeMap::new(),
            nodes: BTreeMap::new(),
            frame_bytes_max,
        };
        let mut endpoints = BTreeMap::new();
        for (k, s) in settings.into_iter().enumerate() {
            let id = k as NodeId + 1;
            let any: SocketAddr = "127.0.0.1:0".parse().expect("addr");
            let endpoint =
                Endpoint::bind(any, &identity(&cluster.ca, id), cluster.transport()).expect("bind");
            cluster.addrs.insert(id, endpoint.local_addr());
            cluster
                .configs
                .insert(id, s.validate().expect("test settings are valid"));
            endpoints.insert(id, endpoint);
        }
        for (id, endpoint) in endpoints {
            cluster.start_node(id, endpoint).await;
        }
        cluster
    }

    pub fn transport(&self) -> mesh_transport::CheckedConfig {
        TransportConfig {
            frame_bytes_max: self.frame_bytes_max,
            request_timeout_ms: 2000,
            ..TransportConfig::default()
        }
        .check()
        .expect("transport config")
    }

    pub fn members(&self) -> BTreeMap<NodeId, BasicNode> {
        self.addrs
            .iter()
            .map(|(id, a)| (*id, BasicNode::new(a.to_string())))
            .collect()
    }

    pub fn dir(&self, id: NodeId) -> std::path::PathBuf {
        self.root.path().join(format!("replica-{id}"))
    }

    async fn start_node(&mut self, id: NodeId, endpoint: Endpoint) {
        let config = self.configs[&id].clone();
        let spec = ReplicaSpec {
            id,
            dir: self.dir(id),
            config: config.clone(),
            term_floor: 0,
            bootstrap: Some(self.members()),
        };
        let network = QuicNetwork::new(endpoint.clone(), config.timings());
        let replica = Replica::start(spec, network, Arc::new(KvApp))
            .await
            .expect("replica starts");
        let fence = Arc::new(VoteFence::new(Arc::new(MonotonicClock)));
        let handler = RaftHandler {
            raft: replica.raft().clone(),
            timings: config.timings(),
            fence: fence.clone(),
        };
        assert!(endpoint.serve(Arc::new(handler)));
        self.nodes.insert(
            id,
            Node {
                replica,
                endpoint,
                fence,
            },
        );
    }

    /// Closes `id`'s endpoint and shuts its replica down; its files stay.
    pub async fn stop(&mut self, id: NodeId) {
        let node = self.nodes.remove(&id).expect("running");
        node.endpoint.close().await;
        node.replica.shutdown().await.expect("clean shutdown");
    }

    pub async fn restart(&mut self, id: NodeId) {
        let endpoint = Endpoint::bind(self.addrs[&id], &identity(&self.ca, id), self.transport())
            .expect("rebind the same port");
        self.start_node(id, endpoint).await;
    }

    pub fn replica(&self, id: NodeId) -> &Replica<KvApp> {
        &self.nodes[&id].replica
    }

    /// Waits until one of `among` leads; returns it.
    pub async fn wait_leader_among(&self, among: &[NodeId]) -> NodeId {
        let deadline = tokio::time::Instant::now() + wait_deadline;
        loop {
            for id in among {
                if self.replica(*id).metrics().borrow().state == ServerState::Leader {
                    return *id;
                }
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "no leader elected among {among:?}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    pub async fn wait_leader(&self) -> NodeId {
        let all: Vec<NodeId> = self.nodes.keys().copied().collect();
        self.wait_leader_among(&all).await
    }

    pub async fn set(&self, via: NodeId, key: &str, value: Vec<u8>) -> u64 {
        let command = Set {
            key: key.into(),
            value,
        }
        .encode()
        .expect("encode");
        let done = self.replica(via).propose(command).await.expect("commits");
        done.index()
    }

    pub async fn wait_applied(&self, id: NodeId, index: u64) {
        self.replica(id)
            .raft()
            .wait(Some(wait_deadline))
            .applied_index_at_least(Some(index), "replica catches up")
            .await
            .expect("replica applies the index");
    }

    pub fn read(&self, id: NodeId, key: &str) -> Option<Vec<u8>> {
        let txn = self.replica(id).database().begin_read().expect("read");
        kv::read(&txn, key).expect("read key")
    }
}
