//! openraft glue: the redb log store, the state-machine host, the network over `mesh-transport`, the lease gate and a fault-injecting in-memory router. Commands are bytes here; the domain lives elsewhere.
//!
//! One replica keeps ONE redb [`redb::Database`] (opened through [`mesh_migrations::open`]) shared by the
//! log store and the state machine, so a durable log commit also persists earlier non-durable applies.
//! Proposals are grouped into batches ([`Command`] holds several commands) so that one fsync commits many.

pub mod config;
pub mod gate;
pub mod kv;
mod log_store;
pub mod network;
mod replica;
pub mod router;
mod state_machine;
mod store;

use std::io::Cursor;

use serde::{Deserialize, Serialize};

pub use config::{ConfigError, RaftConfig, RaftSettings, Timings};
pub use gate::{
    BootClock, Clock, Gate, GateError, Lease, MonotonicClock, TestClock, VoteFence, fenced_vote,
};
pub use log_store::LogStore;
pub use network::{
    PeerTimings, Probed, QuicNetwork, Role, TimingsDiffer, answer as answer_raft_rpc,
    check_peer_timings, elect_now, hand_over_over_quic, probe as probe_replica,
};
pub use replica::{
    HandedOver, HandoverError, ProposeError, Proposed, RaiseTermError, Replica, ReplicaSpec,
    RestoreError, Restored, ShutdownError, StartError, TermRaised, restore, store_file_name,
};
pub use state_machine::{App, AppError, EntryAt, SnapshotBuilder, SnapshotFile, StateMachine};
pub use store::StoreError;

/// A replica's id in the cluster.
pub type NodeId = u64;
/// A replica's address as openraft carries it in the membership.
pub use openraft::BasicNode;

/// One log entry's payload: a batch of opaque commands proposed together, applied in order.
///
/// Batching is how one fsync commits many proposals: openraft 0.9 flushes the log once per entry on
/// the leader, so [`Replica::propose`] groups concurrent proposals into one entry.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Command(pub Vec<Vec<u8>>);

/// The answers to one entry's commands, in the same order (one answer for a blank or membership entry).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Response(pub Vec<Vec<u8>>);

openraft::declare_raft_types!(
    /// openraft's type configuration for mesh: byte commands, u64 ids, snapshots as bytes in memory.
    pub TypeConfig:
        D = Command,
        R = Response,
        NodeId = NodeId,
        Node = BasicNode,
        SnapshotData = Cursor<Vec<u8>>,
);

/// The Raft node type every replica runs.
pub type Raft = openraft::Raft<TypeConfig>;
/// A log entry's id: the term of the leader that wrote it and its index.
pub type LogId = openraft::LogId<NodeId>;
/// A stored vote.
pub type Vote = openraft::Vote<NodeId>;
/// A log entry.
pub type Entry = openraft::Entry<TypeConfig>;
/// What a replica reports about itself (state, term, leader, log and apply positions).
pub type Metrics = openraft::RaftMetrics<NodeId, BasicNode>;
/// A cluster membership (voters and learners with their addresses).
pub type Membership = openraft::Membership<NodeId, BasicNode>;
/// A membership with the log id that introduced it.
pub type StoredMembership = openraft::StoredMembership<NodeId, BasicNode>;
/// The storage error openraft expects from a store; it stops the replica.
pub type StorageError = openraft::StorageError<NodeId>;
