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
//!
//! Every request carries the sender's [`Timings`]; a replica whose own differ answers
//! [`RaftReply::TimingsDiffer`] instead of handing the request to Raft (decision 0150), and
//! [`check_peer_timings`] lets a replica ask its peers before it starts.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Mutex;
use std::time::{Duration, Instant};

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

use crate::{BasicNode, NodeId, Raft, Timings, TypeConfig};

/// Largest snapshot bytes carried in one request; bigger chunks are split.
pub const snapshot_chunk_bytes_max: usize = 1024 * 1024;

/// Most bytes of log entries in one append-entries message (issue 23 part 1): a follower catching up
/// gets them a bounded piece at a time and answers each within the heartbeat, instead of storing
/// hundreds of full entries (512 × a 64 KiB upload chunk is 32 MiB) while the election timer runs.
/// One entry is always sent, whatever its size (`batch_bytes_max` bounds it). The rest of the batch
/// follows at once: the answer is a partial success up to the last entry sent.
pub const append_bytes_max: usize = 1024 * 1024;

/// One Raft RPC as it crosses the wire, with who sent it and the timings it runs.
#[derive(Debug, Serialize, Deserialize)]
pub struct RaftRequest {
    /// The sending replica (from its endpoint's identity; named in refusals and logs).
    pub from: NodeId,
    /// The sender's cluster-wide timings; the receiver refuses the call when its own differ.
    pub timings: Timings,
    pub call: RaftCall,
}

/// The call a [`RaftRequest`] makes.
#[derive(Debug, Serialize, Deserialize)]
pub enum RaftCall {
    AppendEntries(AppendEntriesRequest<TypeConfig>),
    Vote(VoteRequest<NodeId>),
    InstallSnapshot(InstallSnapshotRequest<TypeConfig>),
    /// What are you, in which term, and how far is your log? Answered from the metrics, no I/O.
    Probe,
    /// Campaign now: the leader hands its leadership over before it stops (decision 0152).
    /// Obeyed only when the sender is the leader the receiver knows or has voted for.
    ElectNow,
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
    /// `Err` says why the receiver did not campaign.
    ElectNow(Result<(), String>),
    /// The call was not handed to Raft: the receiver `replica` runs other `timings`.
    TimingsDiffer {
        replica: NodeId,
        timings: Timings,
    },
}

/// Two replicas run different Raft timings (decision 0150). `own` is the replica that reports it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "replica {peer} runs the raft timings {{{theirs}}} but replica {own} runs {{{ours}}}: the lease is only safe when every follower's election timeout is at least the leader's lease, so Raft timings are one cluster-wide setting and the two refuse each other's Raft messages; set the same [raft] section in every replica.toml"
)]
pub struct TimingsDiffer {
    pub own: NodeId,
    pub ours: Timings,
    pub peer: NodeId,
    pub theirs: Timings,
}

/// How often one pair of replicas logs the same timings refusal at most (the first always).
const loud_every: Duration = Duration::from_secs(10);

/// When each (reporting replica, peer, refusing side?) last logged a timings refusal. One entry
/// per pair of replicas, so it stays as small as the cluster.
static loud_last: Mutex<BTreeMap<(NodeId, NodeId, bool), Instant>> = Mutex::new(BTreeMap::new());

/// Logs a timings refusal as an error, once per `loud_every` per pair and side: heartbeats would
/// repeat it ten times a second.
fn log_loudly(differ: &TimingsDiffer, refusing: bool) {
    let now = Instant::now();
    {
        let mut last = loud_last.lock().unwrap_or_else(|p| p.into_inner());
        let key = (differ.own, differ.peer, refusing);
        if last
            .get(&key)
            .is_some_and(|at| now.duration_since(*at) < loud_every)
        {
            return;
        }
        last.insert(key, now);
    }
    if refusing {
        tracing::error!(
            replica = differ.own,
            peer = differ.peer,
            "RAFT TIMINGS DIFFER: refused a Raft message: {differ}"
        );
    } else {
        tracing::error!(
            replica = differ.own,
            peer = differ.peer,
            "RAFT TIMINGS DIFFER: the peer refused this replica's Raft message: {differ}"
        );
    }
}

/// The id of the replica `raft` runs.
fn own_id_of(raft: &Raft) -> NodeId {
    raft.metrics().borrow().id
}

/// This endpoint's replica id (0 when it carries another identity, which only tests do).
fn own_id(endpoint: &Endpoint) -> NodeId {
    match endpoint.principal() {
        Principal::Replica(id) => *id,
        _ => 0,
    }
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
    #[error(transparent)]
    TimingsDiffer(TimingsDiffer),
}

/// The highest Raft term a replica takes from a peer or moves to (2^48: an election a second for
/// eight million years). A term above it in a request is refused before Raft sees it, so no
/// certificate can push the cluster's term, and with it every host's epoch, to where `+ 1`
/// overflows. The domain's `epoch_max` is the same number (a test in the root crate checks it).
pub const term_max: u64 = 1 << 48;

/// Why a Raft request was refused before Raft saw it: the ids it carries are not those of the
/// certificate it came with, or its term is beyond [`term_max`]. A pure verdict on (certificate,
/// request); [`bind_to_sender`] decides it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Impostor {
    #[error(
        "replica {cert}'s certificate sent a Raft request claiming to come from replica {claimed}"
    )]
    From { cert: NodeId, claimed: NodeId },
    #[error("replica {cert}'s certificate asked for a vote for replica {candidate}")]
    Candidate { cert: NodeId, candidate: NodeId },
    #[error(
        "replica {cert}'s certificate sent {what} as the leader {}",
        leader.map_or("no one".to_string(), |l| format!("replica {l}"))
    )]
    Leader {
        cert: NodeId,
        what: &'static str,
        leader: Option<NodeId>,
    },
    #[error(
        "replica {cert}'s certificate sent {what} at term {term}, above the highest term a replica takes ({term_max})"
    )]
    TermBeyond {
        cert: NodeId,
        what: &'static str,
        term: u64,
    },
}

/// Binds a Raft request to the certificate it came with (issue 27): its `from`, a vote's
/// candidate, an append's or a snapshot's leader must be the replica `cert` names, and no term it
/// carries may be above [`term_max`]. A vote that names no one (a leader stepping down in a
/// handover, decision 0278) is allowed from its sender.
pub fn bind_to_sender(cert: NodeId, request: &RaftRequest) -> Result<(), Impostor> {
    if request.from != cert {
        return Err(Impostor::From {
            cert,
            claimed: request.from,
        });
    }
    let beyond = |what: &'static str, term: u64| {
        (term > term_max).then_some(Impostor::TermBeyond { cert, what, term })
    };
    let leads = |what: &'static str, leader: Option<NodeId>| {
        (leader != Some(cert)).then_some(Impostor::Leader { cert, what, leader })
    };
    let refusal = match &request.call {
        RaftCall::Vote(rpc) => {
            let id = rpc.vote.leader_id();
            beyond("a vote request", id.term)
                .or_else(|| {
                    rpc.last_log_id
                        .and_then(|l| beyond("a vote request's last log id", l.leader_id.term))
                })
                .or(match id.voted_for {
                    Some(candidate) if candidate != cert => {
                        Some(Impostor::Candidate { cert, candidate })
                    }
                    _ => None,
                })
        }
        RaftCall::AppendEntries(rpc) => {
            let id = rpc.vote.leader_id();
            let log_ids = rpc
                .prev_log_id
                .iter()
                .chain(rpc.leader_commit.iter())
                .copied()
                .chain(rpc.entries.iter().map(|e| e.log_id));
            beyond("append entries", id.term)
                .or_else(|| {
                    log_ids
                        .map(|l| l.leader_id.term)
                        .find(|t| *t > term_max)
                        .and_then(|t| beyond("an appended log id", t))
                })
                .or_else(|| leads("append entries", id.voted_for))
        }
        RaftCall::InstallSnapshot(rpc) => {
            let id = rpc.vote.leader_id();
            beyond("a snapshot", id.term)
                .or_else(|| {
                    rpc.meta
                        .last_log_id
                        .and_then(|l| beyond("a snapshot's last log id", l.leader_id.term))
                })
                .or_else(|| leads("a snapshot", id.voted_for))
        }
        RaftCall::Probe | RaftCall::ElectNow => None,
    };
    match refusal {
        Some(impostor) => Err(impostor),
        None => Ok(()),
    }
}

/// Why [`answer`] handed a request to no Raft node.
#[derive(Debug, Clone, thiserror::Error)]
pub enum Unanswered {
    #[error("raft request could not be decoded: {0}")]
    Undecodable(String),
    /// Its ids are not its certificate's (or its term is beyond the bound).
    #[error("refused: {0}")]
    Impostor(#[from] Impostor),
    /// The sender is not a member of this replica's cluster (decision 0235).
    #[error("{0}")]
    Outside(String),
    #[error("raft reply could not be encoded: {0}")]
    Encode(String),
}

/// Answers one `MessageKind::Raft` body on the receiving replica: decodes the request, binds it to
/// `cert` (the replica id of the certificate it came with, [`bind_to_sender`]), hands it to
/// `raft`, encodes the reply. `Err` is a refusal the caller sees.
/// A request whose timings differ from `timings` (this replica's) is not handed to Raft: the
/// answer is [`RaftReply::TimingsDiffer`] and the refusal is logged (decision 0150).
/// Votes go through `fence` when given: a replica whose lease is open grants none (decision 0071).
pub async fn answer(
    raft: &Raft,
    timings: &Timings,
    cert: NodeId,
    body: &[u8],
    fence: Option<&crate::gate::VoteFence>,
) -> Result<Vec<u8>, Unanswered> {
    let request: RaftRequest = mesh_codec::decode("raft request", body)
        .map_err(|e| Unanswered::Undecodable(e.to_string()))?;
    if let Err(impostor) = bind_to_sender(cert, &request) {
        static logged: Mutex<BTreeMap<(NodeId, NodeId), Instant>> = Mutex::new(BTreeMap::new());
        let own = own_id_of(raft);
        if crate::recover::refusal_due(&logged, (own, cert)) {
            tracing::warn!(
                replica = own,
                cert,
                claimed = request.from,
                "IMPOSTOR: {impostor}"
            );
        }
        return Err(impostor.into());
    }
    let reply = if request.timings != *timings {
        let own = raft.metrics().borrow().id;
        log_loudly(
            &TimingsDiffer {
                own,
                ours: *timings,
                peer: request.from,
                theirs: request.timings,
            },
            true,
        );
        RaftReply::TimingsDiffer {
            replica: own,
            timings: *timings,
        }
    } else {
        // A probe changes nothing and carries no vote: it is answered to anyone, so a replica
        // about to start learns that its timings differ (decision 0150) before it is a member.
        if !matches!(request.call, RaftCall::Probe)
            && let Some(refusal) = crate::recover::outside_membership(raft, request.from)
        {
            return Err(Unanswered::Outside(refusal));
        }
        match request.call {
            RaftCall::AppendEntries(rpc) => {
                RaftReply::AppendEntries(raft.append_entries(rpc).await)
            }
            RaftCall::Vote(rpc) => RaftReply::Vote(match fence {
                Some(fence) => crate::gate::fenced_vote(raft, rpc, fence).await,
                None => raft.vote(rpc).await,
            }),
            RaftCall::InstallSnapshot(rpc) => {
                RaftReply::InstallSnapshot(raft.install_snapshot(rpc).await)
            }
            RaftCall::Probe => RaftReply::Probe(Probed::of(raft)),
            RaftCall::ElectNow => RaftReply::ElectNow(elect_now_for(raft, request.from).await),
        }
    };
    mesh_codec::encode("raft reply", &reply).map_err(|e| Unanswered::Encode(e.to_string()))
}

/// Asks replica `target` at `addr` what it is ([`RaftCall::Probe`]), within `timeout` (dial and
/// handshake included), saying this replica runs `timings`: a target whose timings differ answers
/// [`NetworkFault::TimingsDiffer`]. `endpoint` must carry a replica's identity: only replicas send Raft.
pub async fn probe(
    endpoint: &Endpoint,
    timings: &Timings,
    target: NodeId,
    addr: SocketAddr,
    timeout: Duration,
) -> Result<Probed, NetworkFault> {
    let fault = |what: String| NetworkFault::BadReply { target, what };
    let call = Direct {
        endpoint,
        timings,
        target,
        addr,
        timeout,
    };
    match call.ask(RaftCall::Probe, "probe").await? {
        RaftReply::Probe(probed) if probed.id == target => Ok(probed),
        RaftReply::Probe(probed) => {
            Err(fault(format!("answered a probe as replica {}", probed.id)))
        }
        _ => Err(fault("answered a probe with another kind of reply".into())),
    }
}

/// One Raft-kind request straight to replica `target` at `addr` (not through openraft): a probe
/// or an elect-now. A peer running other timings is answered as [`NetworkFault::TimingsDiffer`]
/// and logged loudly.
struct Direct<'a> {
    endpoint: &'a Endpoint,
    timings: &'a Timings,
    target: NodeId,
    addr: SocketAddr,
    timeout: Duration,
}

impl Direct<'_> {
    async fn ask(&self, call: RaftCall, what: &str) -> Result<RaftReply, NetworkFault> {
        let target = self.target;
        let fault = |what: String| NetworkFault::BadReply { target, what };
        let request = RaftRequest {
            from: own_id(self.endpoint),
            timings: *self.timings,
            call,
        };
        let body = mesh_codec::encode("raft request", &request)
            .map_err(|e| fault(format!("{what} could not be encoded: {e}")))?;
        let peer = Peer::expecting(self.addr, Principal::Replica(target));
        let bytes = self
            .endpoint
            .request(peer, MessageKind::Raft, body, self.timeout)
            .await
            .map_err(|source| NetworkFault::Transport { target, source })?;
        match mesh_codec::decode("raft reply", &bytes) {
            Ok(RaftReply::TimingsDiffer {
                replica,
                timings: theirs,
            }) => {
                let differ = TimingsDiffer {
                    own: request.from,
                    ours: *self.timings,
                    peer: replica,
                    theirs,
                };
                log_loudly(&differ, false);
                Err(NetworkFault::TimingsDiffer(differ))
            }
            Ok(reply) => Ok(reply),
            Err(e) => Err(fault(format!("reply could not be decoded: {e}"))),
        }
    }
}

/// Campaigns now if `from` is the leader this replica knows, or the one whose vote it holds (the
/// leader handing over has just voted for this replica, so it is no longer named leader here
/// only after this replica's next heartbeat): nobody else may start an election here.
async fn elect_now_for(raft: &Raft, from: NodeId) -> Result<(), String> {
    let m = raft.metrics().borrow().clone();
    let vote = raft
        .with_raft_state(|s| *s.vote_ref())
        .await
        .map_err(|e| format!("replica {} is stopping: {e}", m.id))?;
    let knows = m.current_leader == Some(from) || vote.leader_id().voted_for() == Some(from);
    if !knows {
        return Err(format!(
            "replica {} does not follow replica {from} (its leader: {:?}); only the leader may hand over",
            m.id, m.current_leader
        ));
    }
    raft.trigger()
        .elect()
        .await
        .map_err(|e| format!("replica {} could not campaign: {e}", m.id))?;
    tracing::info!(
        replica = m.id,
        from,
        "campaigning now: replica {from} hands its leadership over"
    );
    Ok(())
}

/// Asks replica `target` at `addr` to campaign now ([`RaftCall::ElectNow`]), within `timeout`:
/// the last step of a leader's handover ([`crate::Replica::hand_over`]).
pub async fn elect_now(
    endpoint: &Endpoint,
    timings: &Timings,
    target: NodeId,
    addr: SocketAddr,
    timeout: Duration,
) -> Result<(), NetworkFault> {
    let fault = |what: String| NetworkFault::BadReply { target, what };
    let call = Direct {
        endpoint,
        timings,
        target,
        addr,
        timeout,
    };
    match call.ask(RaftCall::ElectNow, "elect-now").await? {
        RaftReply::ElectNow(Ok(())) => Ok(()),
        RaftReply::ElectNow(Err(why)) => Err(fault(why)),
        _ => Err(fault(
            "answered elect-now with another kind of reply".into(),
        )),
    }
}

/// [`crate::Replica::hand_over`] over QUIC: the follower chosen is told to campaign with
/// [`elect_now`] at its address in `peers`, each try within half of `election_timeout_min`.
pub async fn hand_over_over_quic<A: crate::App>(
    replica: &crate::Replica<A>,
    fence: Option<&crate::VoteFence>,
    endpoint: &Endpoint,
    peers: &BTreeMap<NodeId, SocketAddr>,
    within: Duration,
) -> Result<crate::HandedOver, crate::HandoverError> {
    let timings = replica.config().timings();
    let ask = Duration::from_millis(timings.election_timeout_min_ms / 2);
    replica
        .hand_over(fence, within, |to| async move {
            let addr = peers
                .get(&to)
                .copied()
                .ok_or_else(|| format!("replica {to} has no address in [peers]"))?;
            elect_now(endpoint, &timings, to, addr, ask)
                .await
                .map_err(|e| e.to_string())
        })
        .await
}

/// What a replica learnt asking its peers' timings before it starts ([`check_peer_timings`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PeerTimings {
    /// Peers that answered with the same timings.
    pub same: Vec<NodeId>,
    /// Peers that did not answer, and why (they do not block a start).
    pub silent: Vec<(NodeId, String)>,
}

/// Probes every peer in `peers` but this replica, all at once, each within `timeout`: `Err` names
/// the first peer that answers with other timings (the replica must not start); peers that do
/// not answer are listed, not held against it (decision 0150).
pub async fn check_peer_timings(
    endpoint: &Endpoint,
    timings: &Timings,
    peers: &BTreeMap<NodeId, SocketAddr>,
    timeout: Duration,
) -> Result<PeerTimings, TimingsDiffer> {
    let own = own_id(endpoint);
    let asks = peers
        .iter()
        .filter(|(id, _)| **id != own)
        .map(
            |(id, addr)| async move { (*id, probe(endpoint, timings, *id, *addr, timeout).await) },
        );
    let mut checked = PeerTimings::default();
    for (id, answer) in futures::future::join_all(asks).await {
        match answer {
            Ok(_) => checked.same.push(id),
            Err(NetworkFault::TimingsDiffer(differ)) => return Err(differ),
            Err(other) => checked.silent.push((id, other.to_string())),
        }
    }
    Ok(checked)
}

/// The network factory of one replica: dials peers through its transport endpoint.
#[derive(Clone, Debug)]
pub struct QuicNetwork {
    endpoint: Endpoint,
    timings: Timings,
}

impl QuicNetwork {
    /// A network over `endpoint`, which must carry this replica's `replica:<id>` identity; every
    /// request says this replica runs `timings` (its [`crate::RaftConfig::timings`]).
    pub fn new(endpoint: Endpoint, timings: Timings) -> Self {
        Self { endpoint, timings }
    }
}

impl RaftNetworkFactory<TypeConfig> for QuicNetwork {
    type Network = QuicConnection;

    async fn new_client(&mut self, target: NodeId, node: &BasicNode) -> Self::Network {
        QuicConnection {
            endpoint: self.endpoint.clone(),
            from: own_id(&self.endpoint),
            timings: self.timings,
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
    from: NodeId,
    timings: Timings,
    target: NodeId,
    addr: Result<SocketAddr, NetworkFault>,
}

type RpcResult<T, E> = Result<T, RPCError<NodeId, BasicNode, RaftError<NodeId, E>>>;

impl QuicConnection {
    /// Sends one request to the target replica (which must present `replica:<target>`).
    async fn call(&self, call: RaftCall, option: &RPCOption) -> Result<RaftReply, Failed> {
        let addr = self.addr.clone().map_err(Failed::Unreachable)?;
        let request = RaftRequest {
            from: self.from,
            timings: self.timings,
            call,
        };
        let body = mesh_codec::encode("raft request", &request).map_err(|e| {
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
        let reply = mesh_codec::decode("raft reply", &bytes).map_err(|e| {
            Failed::Network(NetworkFault::BadReply {
                target: self.target,
                what: format!("reply could not be decoded: {e}"),
            })
        })?;
        if let RaftReply::TimingsDiffer { replica, timings } = reply {
            let differ = TimingsDiffer {
                own: self.from,
                ours: self.timings,
                peer: replica,
                theirs: timings,
            };
            log_loudly(&differ, false);
            // Unreachable: openraft backs off, as from a peer that is not there.
            return Err(Failed::Unreachable(NetworkFault::TimingsDiffer(differ)));
        }
        Ok(reply)
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
            .call(RaftCall::InstallSnapshot(rpc), option)
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

/// How many of `entries`, from the first, fit in `bytes_max` encoded bytes: at least one (a single
/// entry is bounded by the batch limit), and all of them when they fit or cannot be sized.
pub fn entries_within(entries: &[openraft::Entry<TypeConfig>], bytes_max: usize) -> usize {
    let mut bytes = 0usize;
    for (i, entry) in entries.iter().enumerate() {
        let Ok(len) = mesh_codec::encoded_len("log entry", entry) else {
            return entries.len();
        };
        bytes = bytes.saturating_add(len);
        if bytes > bytes_max {
            return i.max(1);
        }
    }
    entries.len()
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
        let mut rpc = rpc;
        let sent = entries_within(&rpc.entries, append_bytes_max);
        let cut = sent < rpc.entries.len();
        rpc.entries.truncate(sent);
        let last_sent = rpc.entries.last().map(|e| e.log_id);
        let entries = rpc.entries.len() as u64;
        let reply = self.call(RaftCall::AppendEntries(rpc), &option).await;
        match reply {
            // The follower has everything sent: openraft sends the rest from there.
            Ok(RaftReply::AppendEntries(Ok(AppendEntriesResponse::Success))) if cut => {
                Ok(AppendEntriesResponse::PartialSuccess(last_sent))
            }
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
        match self.call(RaftCall::Vote(rpc), &option).await {
            Ok(RaftReply::Vote(r)) => r.map_err(|e| self.remote(e)),
            Ok(_) => Err(self.wrong_reply("vote").into_rpc()),
            Err(f) => Err(f.into_rpc()),
        }
    }
}

#[cfg(test)]
mod binding_tests {
    //! G2/G3 (issue 27): a Raft request is bound to the certificate it came with, and no term
    //! beyond the bound reaches Raft. Pure verdicts on (certificate, request), no socket.

    use openraft::{CommittedLeaderId, LogId, SnapshotMeta, StoredMembership, Vote};

    use super::*;
    use crate::RaftConfig;

    fn request(from: NodeId, call: RaftCall) -> RaftRequest {
        RaftRequest {
            from,
            timings: RaftConfig::default().timings(),
            call,
        }
    }

    fn append(term: u64, leader: NodeId) -> RaftCall {
        RaftCall::AppendEntries(AppendEntriesRequest {
            vote: Vote::new_committed(term, leader),
            prev_log_id: None,
            entries: vec![],
            leader_commit: None,
        })
    }

    fn vote(term: u64, candidate: Option<NodeId>) -> RaftCall {
        let vote = Vote {
            leader_id: openraft::LeaderId {
                term,
                voted_for: candidate,
            },
            committed: false,
        };
        RaftCall::Vote(VoteRequest::new(vote, None))
    }

    fn snapshot(term: u64, leader: NodeId) -> RaftCall {
        RaftCall::InstallSnapshot(InstallSnapshotRequest {
            vote: Vote::new_committed(term, leader),
            meta: SnapshotMeta {
                last_log_id: Some(LogId::new(CommittedLeaderId::new(term, leader), 9)),
                last_membership: StoredMembership::default(),
                snapshot_id: "s".into(),
            },
            offset: 0,
            data: vec![],
            done: true,
        })
    }

    #[test]
    fn g2_a_raft_request_that_carries_its_own_certificates_ids_is_bound() {
        for call in [
            append(5, 3),
            vote(5, Some(3)),
            vote(5, None),
            snapshot(5, 3),
            RaftCall::Probe,
            RaftCall::ElectNow,
        ] {
            assert_eq!(bind_to_sender(3, &request(3, call)), Ok(()));
        }
        assert_eq!(
            bind_to_sender(3, &request(3, append(term_max, 3))),
            Ok(()),
            "the bound itself is a term a replica takes"
        );
    }

    #[test]
    fn g2_a_second_replica_certificate_claiming_another_id_is_refused_for_every_call() {
        // Replica 3's certificate poses as replica 1: as the sender of any call, as the
        // candidate of a vote, as the leader of an append or a snapshot.
        for call in [
            append(2001, 1),
            vote(2001, Some(1)),
            RaftCall::ElectNow,
            RaftCall::Probe,
        ] {
            assert_eq!(
                bind_to_sender(3, &request(1, call)),
                Err(Impostor::From {
                    cert: 3,
                    claimed: 1
                })
            );
        }
        assert_eq!(
            bind_to_sender(3, &request(3, vote(2001, Some(1)))),
            Err(Impostor::Candidate {
                cert: 3,
                candidate: 1
            })
        );
        assert_eq!(
            bind_to_sender(3, &request(3, append(2001, 1))),
            Err(Impostor::Leader {
                cert: 3,
                what: "append entries",
                leader: Some(1)
            })
        );
        assert_eq!(
            bind_to_sender(3, &request(3, snapshot(2001, 1))),
            Err(Impostor::Leader {
                cert: 3,
                what: "a snapshot",
                leader: Some(1)
            })
        );
        let refusal = bind_to_sender(3, &request(3, append(2001, 1)))
            .expect_err("refused")
            .to_string();
        assert!(
            refusal.contains("replica 3's certificate") && refusal.contains("replica 1"),
            "the refusal names both: {refusal}"
        );
    }

    #[test]
    fn g9_a_term_beyond_the_bound_is_refused_before_raft_sees_it() {
        // Issue 27 part 3: no certificate moves the cluster's term to where `+ 1` overflows.
        for (what, call) in [
            ("append entries", append(term_max + 1, 3)),
            ("a vote request", vote(u64::MAX, Some(3))),
            ("a snapshot", snapshot(term_max + 1, 3)),
        ] {
            let refused = bind_to_sender(3, &request(3, call));
            assert!(
                matches!(refused, Err(Impostor::TermBeyond { cert: 3, what: w, .. }) if w == what),
                "{what}: {refused:?}"
            );
        }
        let RaftCall::AppendEntries(mut rpc) = append(5, 3) else {
            unreachable!("append builds an append")
        };
        rpc.leader_commit = Some(LogId::new(CommittedLeaderId::new(u64::MAX, 3), 1));
        assert!(matches!(
            bind_to_sender(3, &request(3, RaftCall::AppendEntries(rpc))),
            Err(Impostor::TermBeyond { .. })
        ));
    }
}

#[cfg(test)]
mod append_bound {
    use super::*;
    use openraft::{CommittedLeaderId, EntryPayload};

    fn entry(index: u64, bytes: usize) -> openraft::Entry<TypeConfig> {
        openraft::Entry {
            log_id: openraft::LogId::new(CommittedLeaderId::new(2, 1), index),
            payload: EntryPayload::Normal(crate::Command(vec![vec![7; bytes]])),
        }
    }

    #[test]
    fn an_append_carries_at_most_append_bytes_max_of_entries_and_always_one() {
        // Issue 23 part 1: a follower catching up is sent a bounded piece, answered within the
        // heartbeat, not 512 upload chunks at once; a single entry larger than the bound still goes.
        let chunk = 64 * 1024;
        let many: Vec<_> = (1..=512).map(|i| entry(i, chunk)).collect();
        let sent = entries_within(&many, append_bytes_max);
        assert!(sent >= 1 && sent < many.len(), "{sent} of 512 chunks");
        let bytes: usize = many[..sent]
            .iter()
            .map(|e| mesh_codec::encoded_len("entry", e).expect("sized"))
            .sum();
        assert!(bytes <= append_bytes_max, "{bytes} bytes sent");
        let one_more = mesh_codec::encoded_len("entry", &many[sent]).expect("sized");
        assert!(
            bytes + one_more > append_bytes_max,
            "the piece is as large as it may be"
        );
        let huge = vec![entry(1, 4 * append_bytes_max), entry(2, 10)];
        assert_eq!(entries_within(&huge, append_bytes_max), 1);
        let small: Vec<_> = (1..=100).map(|i| entry(i, 100)).collect();
        assert_eq!(entries_within(&small, append_bytes_max), 100);
        assert_eq!(entries_within(&[], append_bytes_max), 0);
    }
}
