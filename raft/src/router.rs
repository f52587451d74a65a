//! An in-memory Raft network for tests and chaos runs: replicas in one process talk through a [`Router`]
//! whose faults can be switched at run time — isolate a node, cut one direction (a→b only), drop a share
//! of messages, delay them, hold them and release them later (stale delivery).
//!
//! A message is a request from `from` to `to` and its reply back. A fault on `from→to` stops the request;
//! a fault on `to→from` loses the reply after the request took effect, as a real one-way cut would.

use std::collections::{BTreeMap, BTreeSet};
use std::error::Error;
use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use openraft::error::{
    InstallSnapshotError, NetworkError, RPCError, RaftError, RemoteError, Unreachable,
};
use openraft::network::{RPCOption, RaftNetwork, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse,
    VoteRequest, VoteResponse,
};
use tokio::sync::{oneshot, watch};

use crate::gate::{VoteFence, fenced_vote};
use crate::{BasicNode, NodeId, Raft, TypeConfig};

/// Messages held at once across the router at most; beyond that, held messages are dropped.
pub const held_messages_max: usize = 10_000;

/// The fault that stopped a message, as the sender sees it.
#[derive(Debug, Clone, thiserror::Error)]
#[error("router: message {from}→{to} {what}")]
pub struct RouterFault {
    pub from: NodeId,
    pub to: NodeId,
    pub what: &'static str,
}

type Link = (NodeId, NodeId);

#[derive(Default)]
struct Faults {
    isolated: BTreeSet<NodeId>,
    cut: BTreeSet<Link>,
    drop_per_mille: BTreeMap<Link, u32>,
    delay: BTreeMap<Link, Duration>,
    held: BTreeSet<Link>,
    rng: u64,
}

impl Faults {
    fn reachable(&self, from: NodeId, to: NodeId) -> bool {
        !self.isolated.contains(&from)
            && !self.isolated.contains(&to)
            && !self.cut.contains(&(from, to))
    }

    /// xorshift64*: deterministic from the router's seed, so a failing run replays.
    fn next_per_mille(&mut self) -> u32 {
        let mut x = self.rng;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.rng = x;
        (x.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 32) as u32 % 1000
    }
}

enum Fate {
    Unreachable(&'static str),
    Dropped,
    Deliver { delay: Duration, held: bool },
}

struct Inner {
    nodes: Mutex<BTreeMap<NodeId, Raft>>,
    /// Vote fences of nodes added with [`Router::add_fenced`].
    fences: Mutex<BTreeMap<NodeId, Arc<VoteFence>>>,
    faults: Mutex<Faults>,
    releases: watch::Sender<u64>,
    held_now: AtomicUsize,
}

/// The in-memory network; clone it freely (clones share nodes and faults).
#[derive(Clone)]
pub struct Router {
    inner: Arc<Inner>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic while holding a router lock leaves plain data behind; keep going with it.
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl Router {
    /// A router with no faults. `seed` drives which messages a drop rate loses; print it on failure.
    pub fn new(seed: u64) -> Self {
        let (releases, _) = watch::channel(0);
        let faults = Faults {
            rng: seed | 1,
            ..Faults::default()
        };
        Self {
            inner: Arc::new(Inner {
                nodes: Mutex::new(BTreeMap::new()),
                fences: Mutex::new(BTreeMap::new()),
                faults: Mutex::new(faults),
                releases,
                held_now: AtomicUsize::new(0),
            }),
        }
    }

    /// The network factory for the replica `from`.
    pub fn network(&self, from: NodeId) -> RouterNetwork {
        RouterNetwork {
            router: self.clone(),
            from,
        }
    }

    /// Makes `raft` reachable as `id` (replacing an earlier node with that id).
    pub fn add(&self, id: NodeId, raft: Raft) {
        lock(&self.inner.nodes).insert(id, raft);
    }

    /// Like [`Router::add`], with votes to `id` answered through `fence` (decision 0071).
    pub fn add_fenced(&self, id: NodeId, raft: Raft, fence: Arc<VoteFence>) {
        lock(&self.inner.fences).insert(id, fence);
        self.add(id, raft);
    }

    /// Makes `id` unreachable, as if its process were gone.
    pub fn remove(&self, id: NodeId) {
        lock(&self.inner.nodes).remove(&id);
    }

    /// Cuts `id` off from everyone, both directions.
    pub fn isolate(&self, id: NodeId) {
        lock(&self.inner.faults).isolated.insert(id);
    }

    /// Ends the isolation of `id`.
    pub fn rejoin(&self, id: NodeId) {
        lock(&self.inner.faults).isolated.remove(&id);
    }

    /// Cuts the direction `from → to` only: requests from `from` and replies to `from` are lost.
    pub fn cut(&self, from: NodeId, to: NodeId) {
        lock(&self.inner.faults).cut.insert((from, to));
    }

    /// Mends the direction `from → to`.
    pub fn mend(&self, from: NodeId, to: NodeId) {
        lock(&self.inner.faults).cut.remove(&(from, to));
    }

    /// Loses `per_mille` of 1000 requests `from → to` (0 stops dropping).
    pub fn drop_messages(&self, from: NodeId, to: NodeId, per_mille: u32) {
        let mut faults = lock(&self.inner.faults);
        if per_mille == 0 {
            faults.drop_per_mille.remove(&(from, to));
        } else {
            faults
                .drop_per_mille
                .insert((from, to), per_mille.min(1000));
        }
    }

    /// Delays every request `from → to` by `by` (zero stops delaying).
    pub fn delay(&self, from: NodeId, to: NodeId, by: Duration) {
        let mut faults = lock(&self.inner.faults);
        if by.is_zero() {
            faults.delay.remove(&(from, to));
        } else {
            faults.delay.insert((from, to), by);
        }
    }

    /// Holds requests `from → to`: they wait, and are delivered when released even if their sender
    /// gave up long before (a stale message arriving late).
    pub fn hold(&self, from: NodeId, to: NodeId) {
        lock(&self.inner.faults).held.insert((from, to));
    }

    /// Releases the held requests `from → to`, which are then delivered.
    pub fn release(&self, from: NodeId, to: NodeId) {
        lock(&self.inner.faults).held.remove(&(from, to));
        self.inner.releases.send_modify(|n| *n += 1);
    }

    /// Clears every fault and releases every held request.
    pub fn heal(&self) {
        {
            let mut faults = lock(&self.inner.faults);
            let rng = faults.rng;
            *faults = Faults {
                rng,
                ..Faults::default()
            };
        }
        self.inner.releases.send_modify(|n| *n += 1);
    }

    /// Requests waiting on a hold right now.
    pub fn held_now(&self) -> usize {
        self.inner.held_now.load(Ordering::Relaxed)
    }

    fn fate(&self, from: NodeId, to: NodeId) -> Fate {
        let mut faults = lock(&self.inner.faults);
        if !faults.reachable(from, to) {
            return Fate::Unreachable("cannot reach its target (isolated or cut)");
        }
        if let Some(&rate) = faults.drop_per_mille.get(&(from, to))
            && faults.next_per_mille() < rate
        {
            return Fate::Dropped;
        }
        // allow(empty-on-error): a link with no delay fault set delivers at once
        let delay = faults.delay.get(&(from, to)).copied().unwrap_or_default();
        let held = faults.held.contains(&(from, to));
        Fate::Deliver { delay, held }
    }

    fn reply_reaches(&self, from: NodeId, to: NodeId) -> bool {
        lock(&self.inner.faults).reachable(to, from)
    }

    fn target(&self, to: NodeId) -> Option<Raft> {
        lock(&self.inner.nodes).get(&to).cloned()
    }

    async fn wait_released(&self, link: Link) {
        let mut releases = self.inner.releases.subscribe();
        loop {
            if !lock(&self.inner.faults).held.contains(&link) {
                return;
            }
            if releases.changed().await.is_err() {
                return;
            }
        }
    }

    /// Carries one request and its reply through the faults in force.
    async fn call<R, E, F, Fut>(
        &self,
        from: NodeId,
        to: NodeId,
        ttl: Duration,
        deliver: F,
    ) -> Result<R, RPCError<NodeId, BasicNode, RaftError<NodeId, E>>>
    where
        R: Send + 'static,
        E: Error + Send + 'static,
        F: FnOnce(Raft) -> Fut + Send + 'static,
        Fut: Future<Output = Result<R, RaftError<NodeId, E>>> + Send + 'static,
    {
        let fault = |what| RouterFault { from, to, what };
        let (delay, held) = match self.fate(from, to) {
            Fate::Unreachable(what) => {
                return Err(RPCError::Unreachable(Unreachable::new(&fault(what))));
            }
            Fate::Dropped => {
                // A lost request looks like silence to its sender.
                tokio::time::sleep(ttl).await;
                return Err(RPCError::Network(NetworkError::new(&fault("was lost"))));
            }
            Fate::Deliver { delay, held } => (delay, held),
        };
        let Some(raft) = self.target(to) else {
            return Err(RPCError::Unreachable(Unreachable::new(&fault(
                "has no such target",
            ))));
        };
        let result = if held {
            self.call_held(from, to, ttl, delay, raft, deliver).await?
        } else {
            let work = async {
                tokio::time::sleep(delay).await;
                deliver(raft).await
            };
            tokio::time::timeout(ttl, work)
                .await
                .map_err(|_| RPCError::Network(NetworkError::new(&fault("timed out"))))?
        };
        if !self.reply_reaches(from, to) {
            return Err(RPCError::Unreachable(Unreachable::new(&fault(
                "lost its reply (cut back)",
            ))));
        }
        result.map_err(|e| RPCError::RemoteError(RemoteError::new(to, e)))
    }

    /// Parks a request until its link is released, in a task of its own so that it is delivered even
    /// after the sender stopped waiting.
    async fn call_held<R, E, F, Fut>(
        &self,
        from: NodeId,
        to: NodeId,
        ttl: Duration,
        delay: Duration,
        raft: Raft,
        deliver: F,
    ) -> Result<Result<R, RaftError<NodeId, E>>, RPCError<NodeId, BasicNode, RaftError<NodeId, E>>>
    where
        R: Send + 'static,
        E: Error + Send + 'static,
        F: FnOnce(Raft) -> Fut + Send + 'static,
        Fut: Future<Output = Result<R, RaftError<NodeId, E>>> + Send + 'static,
    {
        let fault = |what| RouterFault { from, to, what };
        if self.inner.held_now.fetch_add(1, Ordering::Relaxed) >= held_messages_max {
            self.inner.held_now.fetch_sub(1, Ordering::Relaxed);
            return Err(RPCError::Network(NetworkError::new(&fault(
                "was dropped: hold is full",
            ))));
        }
        let (tx, rx) = oneshot::channel();
        let router = self.clone();
        tokio::spawn(async move {
            router.wait_released((from, to)).await;
            router.inner.held_now.fetch_sub(1, Ordering::Relaxed);
            tokio::time::sleep(delay).await;
            let _ = tx.send(deliver(raft).await);
        });
        match tokio::time::timeout(ttl, rx).await {
            Ok(Ok(result)) => Ok(result),
            Ok(Err(_)) => Err(RPCError::Network(NetworkError::new(&fault(
                "was abandoned",
            )))),
            Err(_) => Err(RPCError::Network(NetworkError::new(&fault("is held")))),
        }
    }
}

/// The network factory of one replica on a [`Router`].
#[derive(Clone)]
pub struct RouterNetwork {
    router: Router,
    from: NodeId,
}

impl RaftNetworkFactory<TypeConfig> for RouterNetwork {
    type Network = RouterConnection;

    async fn new_client(&mut self, target: NodeId, _node: &BasicNode) -> Self::Network {
        RouterConnection {
            router: self.router.clone(),
            from: self.from,
            to: target,
        }
    }
}

/// One replica's connection to another over the router.
pub struct RouterConnection {
    router: Router,
    from: NodeId,
    to: NodeId,
}

impl RaftNetwork<TypeConfig> for RouterConnection {
    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<AppendEntriesResponse<NodeId>, RPCError<NodeId, BasicNode, RaftError<NodeId>>> {
        self.router
            .call(
                self.from,
                self.to,
                option.hard_ttl(),
                move |raft| async move { raft.append_entries(rpc).await },
            )
            .await
    }

    async fn install_snapshot(
        &mut self,
        rpc: InstallSnapshotRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<
        InstallSnapshotResponse<NodeId>,
        RPCError<NodeId, BasicNode, RaftError<NodeId, InstallSnapshotError>>,
    > {
        self.router
            .call(
                self.from,
                self.to,
                option.hard_ttl(),
                move |raft| async move { raft.install_snapshot(rpc).await },
            )
            .await
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<NodeId>,
        option: RPCOption,
    ) -> Result<VoteResponse<NodeId>, RPCError<NodeId, BasicNode, RaftError<NodeId>>> {
        let fence = lock(&self.router.inner.fences).get(&self.to).cloned();
        self.router
            .call(
                self.from,
                self.to,
                option.hard_ttl(),
                move |raft| async move {
                    match fence {
                        Some(fence) => fenced_vote(&raft, rpc, &fence).await,
                        None => raft.vote(rpc).await,
                    }
                },
            )
            .await
    }
}
