//! Test support: a cluster of in-process replicas with real redb files in a temp dir, over the router.

#![allow(dead_code)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use openraft::ServerState;
use redb::ReadableDatabase;
use tempfile::TempDir;

use mesh_raft::kv::{self, KvApp, Set};
use mesh_raft::router::Router;
use mesh_raft::{
    BasicNode, Metrics, NodeId, Proposed, RaftConfig, RaftSettings, Replica, ReplicaSpec,
};

pub mod quic;

/// How long any condition in these tests may take before the test fails.
pub const wait_deadline: Duration = Duration::from_secs(20);

/// Fast timings for tests: elections in a few hundred milliseconds.
pub fn fast_settings() -> RaftSettings {
    RaftSettings {
        heartbeat_ms: 50,
        election_timeout_min_ms: 400,
        election_timeout_max_ms: 800,
        lease_margin_ms: 80,
        propose_timeout_ms: 10_000,
        ..RaftSettings::default()
    }
}

pub struct Cluster {
    pub router: Router,
    pub root: TempDir,
    pub config: RaftConfig,
    pub nodes: BTreeMap<NodeId, BasicNode>,
    pub replicas: BTreeMap<NodeId, Replica<KvApp>>,
}

pub fn addr(id: NodeId) -> BasicNode {
    BasicNode::new(format!("replica-{id}"))
}

impl Cluster {
    /// Starts replicas `1..=n`, all bootstrapped with the same membership.
    pub async fn start(n: u64, settings: RaftSettings, term_floor: u64) -> Self {
        let config = settings.validate().expect("test settings are valid");
        let nodes: BTreeMap<NodeId, BasicNode> = (1..=n).map(|id| (id, addr(id))).collect();
        let mut cluster = Self {
            router: Router::new(0x5eed),
            root: tempfile::tempdir().expect("tempdir"),
            config,
            nodes,
            replicas: BTreeMap::new(),
        };
        for id in 1..=n {
            cluster.start_replica(id, true, term_floor).await;
        }
        cluster
    }

    pub fn dir(&self, id: NodeId) -> PathBuf {
        self.root.path().join(format!("replica-{id}"))
    }

    /// Starts (or restarts, from its files) replica `id`.
    pub async fn start_replica(&mut self, id: NodeId, bootstrap: bool, term_floor: u64) {
        let spec = ReplicaSpec {
            id,
            dir: self.dir(id),
            config: self.config.clone(),
            term_floor,
            bootstrap: bootstrap.then(|| self.nodes.clone()),
        };
        let replica = Replica::start(spec, self.router.network(id), Arc::new(KvApp))
            .await
            .expect("replica starts");
        self.router.add(id, replica.raft().clone());
        self.replicas.insert(id, replica);
    }

    /// Shuts replica `id` down and makes it unreachable; its files stay.
    pub async fn stop(&mut self, id: NodeId) {
        self.router.remove(id);
        let replica = self.replicas.remove(&id).expect("replica is running");
        replica.shutdown().await.expect("clean shutdown");
    }

    pub async fn stop_all(&mut self) {
        let ids: Vec<NodeId> = self.replicas.keys().copied().collect();
        for id in ids {
            self.stop(id).await;
        }
    }

    pub fn replica(&self, id: NodeId) -> &Replica<KvApp> {
        self.replicas.get(&id).expect("replica is running")
    }

    pub fn metrics(&self, id: NodeId) -> Metrics {
        self.replica(id).metrics().borrow().clone()
    }

    /// Waits until one of `among` leads in a term above `term_above`; returns it and its term.
    pub async fn wait_leader(&self, among: &BTreeSet<NodeId>, term_above: u64) -> (NodeId, u64) {
        let deadline = tokio::time::Instant::now() + wait_deadline;
        loop {
            for id in among {
                let m = self.metrics(*id);
                if m.state == ServerState::Leader && m.current_term > term_above {
                    return (*id, m.current_term);
                }
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "no leader above term {term_above} among {among:?}"
            );
            self.wait_any_change(among).await;
        }
    }

    /// Waits (briefly) until the metrics of any of `among` change.
    async fn wait_any_change(&self, among: &BTreeSet<NodeId>) {
        let mut watches: Vec<_> = among.iter().map(|id| self.replica(*id).metrics()).collect();
        let changes = watches.iter_mut().map(|w| Box::pin(w.changed()));
        let _ = tokio::time::timeout(
            Duration::from_millis(200),
            futures::future::select_all(changes),
        )
        .await;
    }

    pub fn running(&self) -> BTreeSet<NodeId> {
        self.replicas.keys().copied().collect()
    }

    /// Sets `key` through replica `via` (which must lead).
    pub async fn set(&self, via: NodeId, key: &str, value: &str) -> Proposed {
        let command = Set {
            key: key.to_string(),
            value: value.as_bytes().to_vec(),
        }
        .encode()
        .expect("encode");
        self.replica(via)
            .propose(command)
            .await
            .expect("proposal commits")
    }

    /// Reads `key` from replica `id`'s own store.
    pub fn read(&self, id: NodeId, key: &str) -> Option<String> {
        let txn = self.replica(id).database().begin_read().expect("read txn");
        kv::read(&txn, key)
            .expect("read")
            .map(|v| String::from_utf8(v).expect("utf8"))
    }

    /// Waits until replica `id` applied at least `index`.
    pub async fn wait_applied(&self, id: NodeId, index: u64) {
        self.replica(id)
            .raft()
            .wait(Some(wait_deadline))
            .applied_index_at_least(Some(index), "replica catches up")
            .await
            .unwrap_or_else(|e| panic!("replica {id} did not apply index {index}: {e}"));
    }
}
