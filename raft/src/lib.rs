//! openraft glue: the redb log store, the state-machine host, the network over `mesh-transport`, the lease gate and a fault-injecting in-memory router. Commands are bytes here; the domain lives elsewhere.
//!
//! One replica keeps ONE redb [`redb::Database`] (opened through [`mesh_migrations::open`]) shared by the
//! log store and the state machine, so a durable log commit also persists earlier non-durable applies.
//! Proposals are grouped into batches ([`Command`] holds several commands) so that one fsync commits many.

pub mod config;
pub mod gate;
mod handover;
pub mod kv;
mod log_store;
mod membership;
pub mod network;
mod recover;
mod replica;
pub mod router;
pub mod runtime;
mod state_machine;
mod store;
mod wait;

use std::io::Cursor;

use serde::{Deserialize, Serialize};

pub use config::{ConfigError, RaftConfig, RaftSettings, Timings};
pub use gate::{
    ActSlot, Acting, BootClock, Clock, Gate, GateError, Lease, MonotonicClock, TestClock,
    VoteFence, fenced_vote,
};
pub use handover::{HandedOver, HandoverError};
pub use log_store::LogStore;
pub use membership::{Member, MembershipError, QuorumLost, check_quorum, majority, members_of};
pub use network::{
    Impostor, PeerTimings, Probed, QuicNetwork, Role, TimingsDiffer, Unanswered,
    answer as answer_raft_rpc, bind_to_sender, check_peer_timings, elect_now, hand_over_over_quic,
    probe as probe_replica, term_max,
};
pub use recover::{
    Inspected, RecoverError, Recovered, force_new_cluster, inspect, outside_membership,
};
pub use replica::{
    ProposeError, Proposed, RaiseTermError, Replica, ReplicaSpec, RestoreError, Restored,
    ShutdownError, StartError, TermRaised, restore, store_file_name,
};
pub use state_machine::{App, AppError, EntryAt, SnapshotBuilder, SnapshotFile, StateMachine};
pub use store::{StoreError, off_the_thread};
pub use wait::changed_within;

/// A replica's id in the cluster.
pub type NodeId = u64;
/// A replica's address as openraft carries it in the membership.
pub use openraft::BasicNode;

/// One log entry's payload: a batch of opaque commands proposed together, applied in order.
///
/// Batching is how one fsync commits many proposals: openraft 0.9 flushes the log once per entry on
/// the leader, so [`Replica::propose`] groups concurrent proposals into one entry.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Command(#[serde(with = "byte_strings")] pub Vec<Vec<u8>>);

/// The answers to one entry's commands, in the same order (one answer for a blank or membership entry).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Response(#[serde(with = "byte_strings")] pub Vec<Vec<u8>>);

/// A list of byte strings with each read in one copy (`serde_bytes`), not byte by byte; the
/// encoding is the same as a `Vec<Vec<u8>>`'s, so stored logs read as before.
mod byte_strings {
    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    pub fn serialize<S: Serializer>(v: &[Vec<u8>], s: S) -> Result<S::Ok, S::Error> {
        let wire: Vec<&serde_bytes::Bytes> = v.iter().map(|b| serde_bytes::Bytes::new(b)).collect();
        wire.serialize(s)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<Vec<u8>>, D::Error> {
        let wire: Vec<serde_bytes::ByteBuf> = Vec::deserialize(d)?;
        Ok(wire
            .into_iter()
            .map(serde_bytes::ByteBuf::into_vec)
            .collect())
    }
}

openraft::declare_raft_types!(
    /// openraft's type configuration for mesh: byte commands, u64 ids, snapshots as bytes in memory.
    pub TypeConfig:
        D = Command,
        R = Response,
        NodeId = NodeId,
        Node = BasicNode,
        SnapshotData = Cursor<Vec<u8>>,
        AsyncRuntime = runtime::SeededRuntime,
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

#[cfg(test)]
mod byte_strings_tests {
    use super::{Command, Response};

    #[test]
    fn entries_are_encoded_exactly_as_a_plain_list_of_byte_vectors() {
        // Stored logs and peers of the previous version wrote `Vec<Vec<u8>>`: the one-copy
        // encoding must give the same bytes and read them back.
        let commands: Vec<Vec<u8>> = vec![vec![], vec![1, 2, 3], (0..=255u8).collect()];
        let ours = mesh_codec::encode("command", &Command(commands.clone())).expect("encode");
        assert_eq!(
            ours,
            mesh_codec::encode("plain", &commands).expect("encode")
        );
        let back: Command = mesh_codec::decode("command", &ours).expect("decode");
        assert_eq!(back.0, commands);
        let answer = mesh_codec::encode("response", &Response(commands.clone())).expect("encode");
        assert_eq!(answer, ours);
    }
}
