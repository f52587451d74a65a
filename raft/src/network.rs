//! openraft's network over `mesh-transport`: each RPC is one `MessageKind::Raft` request whose body is
//! an encoded [`RaftRequest`]; the serving replica hands the body to [`answer`], which dispatches it to
//! its Raft node and encodes the [`RaftReply`].
//!
//! Snapshots travel as openraft's chunked `InstallSnapshotRequest`s; a chunk larger than
//! [`snapshot_chunk_bytes_max`] (or half the transport's frame limit) is split into several requests
//! with consecutive offsets, so no frame ever nears `frame_bytes_max` whatever openraft's chunk size.
//!
//! A [`RaftRequest::Probe`] asks a replica what its Raft core says of itself right now ([`Probed`]):
//! a follower checks that the leader it forwards to is alive, and `status` shows each replica's own
//! role, term and log position ([`probe`]).

use std::net::SocketAddr;
use std::time::Duration;

use mesh_transport::{Endpoint, MessageKind, Peer, Principal, TransportError};
use openraft::error::{
    InstallSnapshotError, NetworkError, PayloadTooLarge, RPCError, RaftError, RemoteError,
    Unreachable,
};
use openraft::network::{RPCOption, RaftNetwork, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse,
    VoteRequest, VoteResponse,
};
use serde::{Deserialize, Serialize};

use crate::{BasicNode, NodeId, Raft, TypeConfig};

/// Largest snapshot bytes carried in one request; bigger chunks are split.
pub const snapshot_chunk_bytes_max: usize = 1024 * 1024;

/// One Raft RPC as it crosses the wire.
#[derive(Debug, Serialize, Deserialize)]
pub enum RaftRequest {
    AppendEntries(AppendEntriesRequest<TypeConfig>),
    Vote(VoteRequest<NodeId>),
    InstallSnapshot(InstallSnapshotRequest<TypeConfig>),
    /// What are you, in which term, and how far is your log? Answered from the metrics, no I/O.
    Probe,
}

/// A replica's role as its Raft core reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Role {
    Leader,
    Follower,
    Candidate,
    Learner,
    Stopping,
}

/// What a probed replica said of itself.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Probed {
    pub id: NodeId,
    pub role: Role,
    /// Its current term.
    pub term: u64,
    /// The leader it knows of.
    pub leader: Option<NodeId>,
    /// Index of the last entry in its log.
    pub last_log_index: Option<u64>,
    /// Index of the last entry its state machine applied.
    pub applied_index: Option<u64>,
}

impl Probed {
    /// What `raft`'s metrics say right now.
    pub fn of(raft: &Raft) -> Probed {
        let m = raft.metrics().borrow().clone();
        let role = match m.state {
            openraft::ServerState::Leader => Role::Leader,
            openraft::ServerState::Follower => Role::Follower,
            openraft::ServerState::Candidate => Role::Candidate,
            openraft::ServerState::Learner => Role::Learner,
            openraft::ServerState::Shutdown => Role::Stopping,
        };
        Probed {
            id: m.id,
            role,
            term: m.current_term,
            leader: m.current_leader,
            last_log_index: m.last_log_index,
            applied_index: m.last_applied.map(|l| l.index),
        }
    }

    /// Whether it leads, by its own account.
    pub fn leads(&self) -> bool {
        self.role == Role::Leader && self.leader == Some(self.id)
    }
}

/// The answer to a [`RaftRequest`], including the remote Raft node's own refusal.
#[derive(Debug, Serialize, Deserialize)]
pub enum RaftReply {
    AppendEntries(Result<AppendEntriesResponse<NodeId>, RaftError<NodeId>>),
    Vote(Result<VoteResponse<NodeId>, RaftError<NodeId>>),
    InstallSnapshot(
        Result<InstallSnapshotResponse<NodeId>, RaftError<NodeId, InstallSnapshotError>>,
    ),
    Probe(Probed),
}

/// Why an RPC did not reach the other Raft node or came back unreadable.
#[derive(Debug, Clone, thiserror::Error)]
pub enum NetworkFault {
    #[error("replica {target}: its address `{addr}` is not ip:port; fix [peers] in the config")]
    BadAddress { target: NodeId, addr: String },
    #[error("replica {target}: {source}")]
    Transport {
        target: NodeId,
        source: TransportError,
    },
    #[error("replica {target}: {what}")]
    BadReply { target: NodeId, what: String },
}

/// Answers one `MessageKind::Raft` body on the receiving replica: decodes the request, hands it to
/// `raft`, encodes the reply. `Err` is a refusal the caller sees (an undecodable body).
/// Votes go through `fence` when given: a replica whose lease is open grants none (decision 0071).
pub async fn answer(
    raft: &Raft,
    body: &[u8],
    fence: Option<&crate::gate::VoteFence>,
) -> Result<Vec<u8>, String> {
    let request: RaftRequest =
        mesh_codec::decode("raft request", body).map_err(|e| e.to_string())?;
    let reply = match request {
        RaftRequest::AppendEntries(rpc) => RaftReply::AppendEntries(raft.append_entries(rpc).await),
        RaftRequest::Vote(rpc) => RaftReply::Vote(match fence {
            Some(fence) => crate::gate::fenced_vote(raft, rpc, fence).await,
            None => raft.vote(rpc).await,
        }),
        RaftRequest::InstallSnapshot(rpc) => {
            RaftReply::InstallSnapshot(raft.install_snapshot(rpc).await)
        }
        RaftRequest::Probe => RaftReply::Probe(Probed::of(raft)),
    };
    mesh_codec::encode("raft reply", &reply).map_err(|e| e.to_string())
}

/// Asks replica `target` at `addr` what it is ([`RaftRequest::Probe`]), within `timeout` (dial and
/// handshake included). `endpoint` must carry a replica's identity: only replicas send Raft.
pub async fn probe(
    endpoint: &Endpoint,
    target: NodeId,
    addr: SocketAddr,
    timeout: Duration,
) -> Result<Probed, NetworkFault> {
    let fault = |what: String| NetworkFault::BadReply { target, what };
    let body = mesh_codec::encode("raft request", &RaftRequest::Probe)
        .map_err(|e| fault(format!("probe could not be encoded: {e}")))?;
    let peer = Peer::expecting(addr, Principal::Replica(target));
    let bytes = endpoint
        .request(peer, MessageKind::Raft, body, timeout)
        .await
        .map_err(|source| NetworkFault::Transport { target, source })?;
    match mesh_codec::decode("raft reply", &bytes) {
        Ok(RaftReply::Probe(probed)) if probed.id == target => Ok(probed),
        Ok(RaftReply::Probe(probed)) => {
            Err(fault(format!("answered a probe as replica {}", probed.id)))
        }
        Ok(_) => Err(fault("answered a probe with another kind of reply".into())),
        Err(e) => Err(fault(format!("reply could not be decoded: {e}"))),
    }
}

/// The network factory of one replica: dials peers through its transport endpoint.
#[derive(Clone, Debug)]
pub struct QuicNetwork {
    endpoint: Endpoint,
}

impl QuicNetwork {
    /// A network over `endpoint`, which must carry this replica's `replica:<id>` identity.
    pub fn new(endpoint: Endpoint) -> Self {
        Self { endpoint }
    }
}

impl RaftNetworkFactory<TypeConfig> for QuicNetwork {
    type Network = QuicConnection;

    async fn new_client(&mut self, target: NodeId, node: &BasicNode) -> Self::Network {
        QuicConnection {
            endpoint: self.endpoint.clone(),
            target,
            addr: node.addr.parse().map_err(|_| NetworkFault::BadAddress {
                target,
                addr: node.addr.clone(),
            }),
        }
    }
}

/// One replica's connection to another (the transport shares the QUIC connection underneath).
pub struct QuicConnection {
    endpoint: Endpoint,
    target: NodeId,
    addr: Result<SocketAddr, NetworkFault>,
}

type RpcResult<T, E> = Result<T, RPCError<NodeId, BasicNode, RaftError<NodeId, E>>>;

impl QuicConnection {
    /// Sends one request to the target replica (which must present `replica:<target>`).
    async fn call(&self, request: &RaftRequest, option: &RPCOption) -> Result<RaftReply, Failed> {
        let addr = self.addr.clone().map_err(Failed::Unreachable)?;
        let body = mesh_codec::encode("raft request", request).map_err(|e| {
            Failed::Network(NetworkFault::BadReply {
                target: self.target,
                what: format!("request could not be encoded: {e}"),
            })
        })?;
        let peer = Peer::expecting(addr, Principal::Replica(self.target));
        let transport = |source| NetworkFault::Transport {
            target: self.target,
            source,
        };
        let bytes = self
            .endpoint
            .request(peer, MessageKind::Raft, body, option.hard_ttl())
            .await
            .map_err(|e| match e {
                TransportError::Unreachable { .. }
                | TransportError::HandshakeRefused { .. }
                | TransportError::WrongPeer { .. } => Failed::Unreachable(transport(e)),
                TransportError::FrameTooLarge { .. } => Failed::TooLarge,
                other => Failed::Network(transport(other)),
            })?;
        mesh_codec::decode("raft reply", &bytes).map_err(|e| {
            Failed::Network(NetworkFault::BadReply {
                target: self.target,
                what: format!("reply could not be decoded: {e}"),
            })
        })
    }

    fn wrong_reply(&self, expected: &str) -> Failed {
        Failed::Network(NetworkFault::BadReply {
            target: self.target,
            what: format!("answered a {expected} request with another kind of reply"),
        })
    }

    /// Largest snapshot piece per request on this endpoint.
    fn chunk_cap(&self) -> usize {
        snapshot_chunk_bytes_max
            .min(self.endpoint.config().frame_bytes_max() / 2)
            .max(1)
    }

    async fn install_piece(
        &self,
        rpc: InstallSnapshotRequest<TypeConfig>,
        option: &RPCOption,
    ) -> RpcResult<InstallSnapshotResponse<NodeId>, InstallSnapshotError> {
        match self
            .call(&RaftRequest::InstallSnapshot(rpc), option)
            .await
            .map_err(Failed::into_rpc)?
        {
            RaftReply::InstallSnapshot(r) => r.map_err(|e| self.remote(e)),
            _ => Err(self.wrong_reply("install-snapshot").into_rpc()),
        }
    }

    fn remote<E: std::error::Error>(
        &self,
        e: RaftError<NodeId, E>,
    ) -> RPCError<NodeId, BasicNode, RaftError<NodeId, E>> {
        RPCError::RemoteError(RemoteError::new(self.target, e))
    }
}

/// How a call failed, before it is shaped into the error type of one RPC.
enum Failed {
    /// openraft backs off before retrying.
    Unreachable(NetworkFault),
    /// openraft retries at once.
    Network(NetworkFault),
    /// The frame was over the transport limit; openraft retries with fewer entries.
    TooLarge,
}

impl Failed {
    fn into_rpc<E: std::error::Error>(self) -> RPCError<NodeId, BasicNode, RaftError<NodeId, E>> {
        match self {
            Failed::Unreachable(f) => RPCError::Unreachable(Unreachable::new(&f)),
            Failed::Network(f) => RPCError::Network(NetworkError::new(&f)),
            Failed::TooLarge => RPCError::PayloadTooLarge(PayloadTooLarge::new_entries_hint(1)),
        }
    }
}

impl RaftNetwork<TypeConfig> for QuicConnection {
    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> RpcResult<AppendEntriesResponse<NodeId>, openraft::error::Infallible> {
        let entries = rpc.entries.len() as u64;
        let reply = self.call(&RaftRequest::AppendEntries(rpc), &option).await;
        match reply {
            Ok(RaftReply::AppendEntries(r)) => r.map_err(|e| self.remote(e)),
            Ok(_) => Err(self.wrong_reply("append-entries").into_rpc()),
            // Halve the batch; a single entry over the frame limit is a configuration error that
            // the transport names in its own error.
            Err(Failed::TooLarge) if entries > 1 => Err(RPCError::PayloadTooLarge(
                PayloadTooLarge::new_entries_hint(entries / 2),
            )),
            Err(Failed::TooLarge) => Err(RPCError::Network(NetworkError::new(
                &NetworkFault::BadReply {
                    target: self.target,
                    what: "one log entry is over the transport's frame_bytes_max; raise it on every replica".into(),
                },
            ))),
            Err(f) => Err(f.into_rpc()),
        }
    }

    async fn install_snapshot(
        &mut self,
        rpc: InstallSnapshotRequest<TypeConfig>,
        option: RPCOption,
    ) -> RpcResult<InstallSnapshotResponse<NodeId>, InstallSnapshotError> {
        let cap = self.chunk_cap();
        if rpc.data.len() <= cap {
            return self.install_piece(rpc, &option).await;
        }
        let InstallSnapshotRequest {
            vote,
            meta,
            offset,
            data,
            done,
        } = rpc;
        let pieces = data.len().div_ceil(cap);
        let mut last = None;
        for (i, piece) in data.chunks(cap).enumerate() {
            let piece_rpc = InstallSnapshotRequest {
                vote,
                meta: meta.clone(),
                offset: offset + (i * cap) as u64,
                data: piece.to_vec(),
                done: done && i + 1 == pieces,
            };
            let response = self.install_piece(piece_rpc, &option).await?;
            // A higher vote on the other side ends the transfer: this leader is stale.
            if response.vote > vote {
                return Ok(response);
            }
            last = Some(response);
        }
        last.ok_or_else(|| self.wrong_reply("install-snapshot").into_rpc())
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<NodeId>,
        option: RPCOption,
    ) -> RpcResult<VoteResponse<NodeId>, openraft::error::Infallible> {
        match self.call(&RaftRequest::Vote(rpc), &option).await {
            Ok(RaftReply::Vote(r)) => r.map_err(|e| self.remote(e)),
            Ok(_) => Err(self.wrong_reply("vote").into_rpc()),
            Err(f) => Err(f.into_rpc()),
        }
    }
}
