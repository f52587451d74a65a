//! A replica: one store opened through migrations, one openraft node over a given network and app, a
//! proposal batcher (group commit), the term floor (G9) at start and at run time
//! ([`Replica::raise_term_above`], decision 0151), and restore from a snapshot file.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use openraft::error::{ClientWriteError, RaftError};
use openraft::raft::VoteRequest;
use openraft::{EntryPayload, RaftNetworkFactory};
use redb::{Database, ReadableTable};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc, oneshot, watch};
use tokio::task::JoinHandle;

use mesh_migrations::{MigrationError, tables};

use crate::state_machine::{SnapshotFile, build_file, install_file, read_applied};
use crate::store::{StoreError, blocking, get, put};
use crate::{
    App, BasicNode, Command, Entry, LogId, LogStore, Membership, Metrics, NodeId, Raft, RaftConfig,
    StateMachine, StoredMembership, Vote,
};

/// The store file inside a replica's directory.
pub const store_file_name: &str = "replica.redb";

/// What a replica needs to start.
#[derive(Clone, Debug)]
pub struct ReplicaSpec {
    pub id: NodeId,
    /// Directory holding the store file; created if absent.
    pub dir: PathBuf,
    pub config: RaftConfig,
    /// The next election must be above this term (G9): pass the highest epoch ever used.
    pub term_floor: u64,
    /// The first membership, written as log entry 0 if — and only if — the store is brand new.
    /// Give the same map to every founding replica; leave it `None` on a replica that joins later.
    pub bootstrap: Option<BTreeMap<NodeId, BasicNode>>,
}

/// A committed proposal: where it sits in the log and the app's answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Proposed {
    /// The entry holding the command; its term is the epoch it was committed under.
    pub log_id: LogId,
    /// The command's position in the entry's batch.
    pub position: u32,
    /// What [`App::apply`] answered.
    pub response: Vec<u8>,
}

impl Proposed {
    /// The term of the leader that wrote the entry.
    pub fn term(&self) -> u64 {
        self.log_id.leader_id.term
    }

    /// The log index of the entry.
    pub fn index(&self) -> u64 {
        self.log_id.index
    }
}

/// Why a proposal has no answer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProposeError {
    #[error(
        "this replica is not the leader (leader: {leader:?} at {leader_addr:?}); send the proposal to the leader"
    )]
    NotLeader {
        leader: Option<NodeId>,
        leader_addr: Option<String>,
    },
    #[error(
        "no answer within {timeout_ms} ms; the command may still commit — read the state before retrying"
    )]
    Timeout { timeout_ms: u64 },
    #[error("the command is {bytes} bytes, over the batch limit of {max}; split it")]
    TooLarge { bytes: usize, max: usize },
    #[error("the replica is stopping; propose to another replica")]
    Stopped,
    #[error("raft refused the proposal: {0}")]
    Raft(String),
}

/// Why a replica did not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("could not create the replica directory {path}: {source}")]
    Dir {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(transparent)]
    Migration(#[from] MigrationError),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("openraft did not start: {0}")]
    Raft(String),
}

/// Why a shutdown did not complete cleanly.
#[derive(Debug, thiserror::Error)]
pub enum ShutdownError {
    #[error("the raft core did not stop within {timeout_ms} ms")]
    Timeout { timeout_ms: u64 },
    #[error("the raft core failed while stopping: {0}")]
    Raft(String),
    #[error(
        "the store is still held by {holders} raft tasks after {timeout_ms} ms; it closes when they end"
    )]
    StoreStillOpen { holders: usize, timeout_ms: u64 },
}

/// Why a store could not be made from a snapshot.
#[derive(Debug, thiserror::Error)]
pub enum RestoreError {
    #[error(
        "{path} already exists; restore only into an empty directory (move the old store aside first)"
    )]
    AlreadyExists { path: PathBuf },
    #[error("the snapshot has no applied entry or no voters; it cannot start a cluster")]
    EmptySnapshot,
    #[error(
        "replica {id} is not a voter of the snapshot's membership {voters:?}; restore with one of those ids"
    )]
    NotAVoter { id: NodeId, voters: Vec<NodeId> },
    #[error(transparent)]
    Migration(#[from] MigrationError),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("could not create the replica directory {path}: {source}")]
    Dir {
        path: PathBuf,
        source: std::io::Error,
    },
}

/// What a restore wrote.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Restored {
    pub last_applied: Option<LogId>,
    pub membership: StoredMembership,
    /// The vote's term: the next election is above it.
    pub term_floor: u64,
}

/// What [`Replica::raise_term_above`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TermRaised {
    /// The replica's term was above the epoch already; nothing was done.
    Already { term: u64 },
    /// The replica left term `from` and campaigns in term `campaign`, above the epoch.
    Campaigning { from: u64, campaign: u64 },
}

/// Why [`Replica::raise_term_above`] did not move the term.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RaiseTermError {
    #[error("the replica is stopping; its term was not raised")]
    Stopped,
    #[error(
        "epoch {epoch} is above the highest term a replica moves to ({max}); the term was not raised: whatever claims it is corrupt or forged"
    )]
    Beyond { epoch: u64, max: u64 },
    #[error(
        "replica {id} could not leave term {term} for one above {epoch} within {waited_ms} ms: it follows a leader whose lease it keeps, or its log moved under every try; raise it on the leader"
    )]
    Refused {
        id: NodeId,
        term: u64,
        epoch: u64,
        waited_ms: u64,
    },
}

struct Proposal {
    command: Vec<u8>,
    reply: oneshot::Sender<Result<Proposed, ProposeError>>,
}

/// One running replica.
pub struct Replica<A: App> {
    id: NodeId,
    raft: Raft,
    db: Arc<Database>,
    app: Arc<A>,
    config: RaftConfig,
    proposals: mpsc::Sender<Proposal>,
    proposals_total: AtomicU64,
    batcher: JoinHandle<()>,
    /// One [`Replica::raise_term_above`] at a time.
    raising: tokio::sync::Mutex<()>,
}

impl<A: App> Replica<A> {
    /// Opens (or creates) the store in `spec.dir`, applies the bootstrap membership and the term
    /// floor, and starts openraft over `network`.
    pub async fn start<N>(spec: ReplicaSpec, network: N, app: Arc<A>) -> Result<Self, StartError>
    where
        N: RaftNetworkFactory<crate::TypeConfig>,
    {
        let db = open_store(&spec.dir).await?;
        let prepared = {
            let (db, id, floor, bootstrap) =
                (db.clone(), spec.id, spec.term_floor, spec.bootstrap.clone());
            blocking(move || prepare_store(&db, id, floor, bootstrap.as_ref())).await?
        };
        if let Some(raised_from) = prepared {
            tracing::warn!(
                replica = spec.id,
                from_term = raised_from,
                term_floor = spec.term_floor,
                "vote raised to the term floor: the next election is above every epoch used before"
            );
        }
        // Each voter campaigns in its own slice of the election window (decision 0110), drawn from
        // the voters the store last applied, else the founding ones (decision 0230).
        let stored = {
            let db = db.clone();
            blocking(move || crate::membership::stored_voters(&db)).await?
        };
        let openraft = match (stored, &spec.bootstrap) {
            (Some(voters), _) => spec.config.openraft_for(spec.id, &voters),
            (None, Some(members)) => {
                let voters = members.keys().copied().collect();
                spec.config.openraft_for(spec.id, &voters)
            }
            (None, None) => spec.config.openraft(),
        };
        // A purge past the state machine waits for the snapshot that covers it (decision 0280).
        let state_machine = StateMachine::new(db.clone(), app.clone());
        let log_store = LogStore::new(db.clone()).purges_wait_for_the_state_machine(
            Duration::from_millis(crate::log_store::purge_wait_for_install_ms),
            state_machine.install_ends(),
        );
        let raft = Raft::new(spec.id, openraft, network, log_store, state_machine)
            .await
            .map_err(|e| StartError::Raft(e.to_string()))?;
        let (proposals, queue) = mpsc::channel(spec.config.settings().proposals_queued_max);
        let batcher = tokio::spawn(run_batcher(raft.clone(), queue, spec.config.clone()));
        Ok(Self {
            id: spec.id,
            raft,
            db,
            app,
            config: spec.config,
            proposals,
            proposals_total: AtomicU64::new(0),
            batcher,
            raising: tokio::sync::Mutex::new(()),
        })
    }

    /// This replica's id.
    pub fn id(&self) -> NodeId {
        self.id
    }

    /// The openraft node, for membership changes, metrics and the gate.
    pub fn raft(&self) -> &Raft {
        &self.raft
    }

    /// The replica's database: domain reads open read transactions on it.
    pub fn database(&self) -> &Arc<Database> {
        &self.db
    }

    /// The hosted app.
    pub fn app(&self) -> &Arc<A> {
        &self.app
    }

    /// The validated configuration this replica runs with.
    pub fn config(&self) -> &RaftConfig {
        &self.config
    }

    /// A live view of this replica's metrics (state, term, leader, log positions).
    pub fn metrics(&self) -> watch::Receiver<Metrics> {
        self.raft.metrics()
    }

    /// Proposals waiting in the queue for a batch slot right now.
    pub fn proposals_queued(&self) -> usize {
        self.proposals.max_capacity() - self.proposals.capacity()
    }

    /// Proposals accepted into the queue since this replica started.
    pub fn proposals_total(&self) -> u64 {
        self.proposals_total.load(Ordering::Relaxed)
    }

    /// Proposes one command and waits until it is committed and applied here (as leader).
    pub async fn propose(&self, command: Vec<u8>) -> Result<Proposed, ProposeError> {
        let max = self.config.settings().batch_bytes_max;
        if command.len() > max {
            return Err(ProposeError::TooLarge {
                bytes: command.len(),
                max,
            });
        }
        let timeout = self.config.propose_timeout();
        let (reply, answer) = oneshot::channel();
        let work = async {
            self.proposals
                .send(Proposal { command, reply })
                .await
                .map_err(|_| ProposeError::Stopped)?;
            self.proposals_total.fetch_add(1, Ordering::Relaxed);
            answer.await.map_err(|_| ProposeError::Stopped)?
        };
        tokio::time::timeout(timeout, work)
            .await
            .map_err(|_| ProposeError::Timeout {
                timeout_ms: timeout.as_millis() as u64,
            })?
    }

    /// Makes this replica's Raft leave its term for one above `epoch` now, and campaign there (G9 at
    /// run time, decision 0151): a proven epoch above the cluster's term must not leave it stuck
    /// below the floor until every replica restarts.
    ///
    /// openraft 0.9 has no call to set the term. So the replica hands its own Raft a vote request
    /// for term `max(epoch, term + 1)` that votes for no one (`voted_for: None`, openraft's own
    /// "term moved, no candidate yet"): openraft grants it as it would a real candidate's higher
    /// term — it persists the vote and steps down — and `trigger().elect()` then campaigns at the
    /// next term, above `epoch`. The request claims a log no shorter than any (openraft compares it
    /// with its own to protect a real candidate's voters; here there is no candidate to protect, and
    /// the claim is not stored). Only the vote is changed, and a term is only ever raised, which
    /// Raft allows any node at any time. openraft refuses it while this replica keeps the lease of
    /// a leader it follows, and on a leader within its own vote lease just after its election:
    /// tried again every heartbeat until twice `election_timeout_max`. So a leader calls it; a
    /// follower is refused while its leader is alive.
    pub async fn raise_term_above(&self, epoch: u64) -> Result<TermRaised, RaiseTermError> {
        // The campaign goes to `epoch + 2` at most: both stay far from overflow below the bound.
        if epoch >= crate::network::term_max {
            return Err(RaiseTermError::Beyond {
                epoch,
                max: crate::network::term_max,
            });
        }
        let _one = self.raising.lock().await;
        let settings = self.config.settings();
        let wait = Duration::from_millis(settings.election_timeout_max_ms.saturating_mul(2));
        let pause = Duration::from_millis(settings.heartbeat_ms);
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            let vote = self
                .raft
                .with_raft_state(|s| *s.vote_ref())
                .await
                .map_err(|_| RaiseTermError::Stopped)?;
            let term = vote.leader_id().term;
            if term > epoch {
                return Ok(TermRaised::Already { term });
            }
            let step = epoch.max(term + 1);
            let no_one = Vote {
                leader_id: openraft::LeaderId {
                    term: step,
                    voted_for: None,
                },
                committed: false,
            };
            let any_log = LogId::new(openraft::CommittedLeaderId::new(step, self.id), u64::MAX);
            let request = VoteRequest::new(no_one, Some(any_log));
            let answer = self
                .raft
                .vote(request)
                .await
                .map_err(|_| RaiseTermError::Stopped)?;
            if answer.vote_granted {
                self.raft
                    .trigger()
                    .elect()
                    .await
                    .map_err(|_| RaiseTermError::Stopped)?;
                tracing::warn!(
                    replica = self.id,
                    from_term = term,
                    campaign = step + 1,
                    epoch,
                    "term raised above a proven epoch: left term {term} and campaigning in term {}",
                    step + 1
                );
                return Ok(TermRaised::Campaigning {
                    from: term,
                    campaign: step + 1,
                });
            }
            if tokio::time::Instant::now() + pause > deadline {
                return Err(RaiseTermError::Refused {
                    id: self.id,
                    term,
                    epoch,
                    waited_ms: wait.as_millis() as u64,
                });
            }
            tokio::time::sleep(pause).await;
        }
    }

    /// Snapshot-file bytes of the current applied state (state + membership), built from an MVCC read
    /// view without blocking writes: what [`restore`] takes back.
    pub async fn backup(&self) -> Result<Vec<u8>, StoreError> {
        let db = self.db.clone();
        let app = self.app.clone();
        blocking(move || Ok(build_file(&db, app.as_ref())?.encode()?)).await
    }

    /// Stops openraft and the batcher without giving the replica up: every proposal and read
    /// still waiting fails at once (openraft answers them "stopped"), so whoever holds the
    /// service for one lets it go. [`Replica::shutdown`] after it still closes the store (a second
    /// stop of openraft is a no-op).
    pub async fn stop_raft(&self) -> Result<(), ShutdownError> {
        let timeout = self.config.shutdown_timeout();
        self.batcher.abort();
        match tokio::time::timeout(timeout, self.raft.shutdown()).await {
            Err(_) => Err(ShutdownError::Timeout {
                timeout_ms: timeout.as_millis() as u64,
            }),
            Ok(Err(e)) => Err(ShutdownError::Raft(e.to_string())),
            Ok(Ok(())) => Ok(()),
        }
    }

    /// Stops openraft and the batcher and waits until the store file is released.
    pub async fn shutdown(self) -> Result<(), ShutdownError> {
        let timeout = self.config.shutdown_timeout();
        let timeout_ms = timeout.as_millis() as u64;
        self.batcher.abort();
        drop(self.proposals);
        match tokio::time::timeout(timeout, self.raft.shutdown()).await {
            Err(_) => return Err(ShutdownError::Timeout { timeout_ms }),
            Ok(Err(e)) => return Err(ShutdownError::Raft(e.to_string())),
            Ok(Ok(())) => {}
        }
        drop(self.raft);
        drop(self.app);
        wait_sole_holder(self.db, timeout).await
    }
}

/// Waits until the raft tasks that still hold the database have ended.
async fn wait_sole_holder(db: Arc<Database>, timeout: Duration) -> Result<(), ShutdownError> {
    let deadline = tokio::time::Instant::now() + timeout;
    let poll = Duration::from_millis(5);
    while Arc::strong_count(&db) > 1 {
        if tokio::time::Instant::now() >= deadline {
            return Err(ShutdownError::StoreStillOpen {
                holders: Arc::strong_count(&db) - 1,
                timeout_ms: timeout.as_millis() as u64,
            });
        }
        tokio::time::sleep(poll).await;
    }
    Ok(())
}

/// The store's directory, created 0700 with any missing parents (it holds the secrets the store
/// keeps); an existing one keeps its mode, which meshd warns about at start (decision 0296).
fn private_dir(dir: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
}

async fn open_store(dir: &Path) -> Result<Arc<Database>, StartError> {
    private_dir(dir).map_err(|source| StartError::Dir {
        path: dir.to_path_buf(),
        source,
    })?;
    let path = dir.join(store_file_name);
    let db = crate::store::off_the_thread(move || mesh_migrations::open(&path)).await??;
    Ok(Arc::new(db))
}

/// Writes the bootstrap membership into a brand-new store and raises the vote to the term floor.
/// Returns the vote's previous term when it was raised.
fn prepare_store(
    db: &Database,
    id: NodeId,
    term_floor: u64,
    bootstrap: Option<&BTreeMap<NodeId, BasicNode>>,
) -> Result<Option<u64>, StoreError> {
    let txn = db.begin_write()?;
    let (vote, fresh) = {
        let state = txn.open_table(tables::RAFT_STATE)?;
        let vote: Option<Vote> = get(&state, tables::RAFT_STATE_VOTE, "vote")?;
        let purged = state.get(tables::RAFT_STATE_LAST_PURGED)?.is_some();
        let log_empty = txn.open_table(tables::RAFT_LOG)?.first()?.is_none();
        let applied = read_applied(&txn.open_table(tables::SM_STATE)?)?.0;
        (
            vote,
            vote.is_none() && !purged && log_empty && applied.is_none(),
        )
    };
    if let (true, Some(members)) = (fresh, bootstrap) {
        let voters = members.keys().copied().collect();
        let entry = Entry {
            log_id: LogId::default(),
            payload: EntryPayload::Membership(Membership::new(vec![voters], members.clone())),
        };
        write_entry_in(&txn, &entry)?;
    }
    let term = vote.map(|v| v.leader_id().term).unwrap_or(0);
    let raised = term < term_floor;
    if raised {
        put(
            &txn,
            tables::RAFT_STATE,
            tables::RAFT_STATE_VOTE,
            "vote",
            &Vote::new(term_floor, id),
        )?;
    }
    txn.commit()?;
    Ok(raised.then_some(term))
}

fn write_entry_in(txn: &redb::WriteTransaction, entry: &Entry) -> Result<(), StoreError> {
    let bytes = mesh_codec::encode("raft log entry", entry)?;
    let mut log = txn.open_table(tables::RAFT_LOG)?;
    log.insert(entry.log_id.index, bytes.as_slice())?;
    Ok(())
}

/// Makes a fresh store in `dir` from a snapshot file's bytes: the app's state, the applied position
/// and membership, the log marked purged up to the snapshot, and the vote at `term_floor` so the next
/// election is above it (G9). Refuses a directory that already holds a store.
pub async fn restore<A: App>(
    id: NodeId,
    dir: &Path,
    app: Arc<A>,
    snapshot: &[u8],
    term_floor: u64,
) -> Result<Restored, RestoreError> {
    let path = dir.join(store_file_name);
    if path.exists() {
        return Err(RestoreError::AlreadyExists { path });
    }
    let file = SnapshotFile::decode(snapshot)?;
    let Some(last_applied) = file.last_applied else {
        return Err(RestoreError::EmptySnapshot);
    };
    let voters: Vec<NodeId> = file.last_membership.membership().voter_ids().collect();
    if voters.is_empty() {
        return Err(RestoreError::EmptySnapshot);
    }
    if !voters.contains(&id) {
        return Err(RestoreError::NotAVoter { id, voters });
    }
    private_dir(dir).map_err(|source| RestoreError::Dir {
        path: dir.to_path_buf(),
        source,
    })?;
    let db = crate::store::off_the_thread(move || mesh_migrations::open(&path)).await??;
    let membership = file.last_membership.clone();
    blocking(move || {
        let txn = db.begin_write()?;
        install_file(&txn, app.as_ref(), &file)?;
        put(
            &txn,
            tables::RAFT_STATE,
            tables::RAFT_STATE_LAST_PURGED,
            "last purged log id",
            &last_applied,
        )?;
        put(
            &txn,
            tables::RAFT_STATE,
            tables::RAFT_STATE_VOTE,
            "vote",
            &Vote::new(term_floor, id),
        )?;
        txn.commit()?;
        Ok(())
    })
    .await?;
    tracing::warn!(
        replica = id,
        last_index = last_applied.index,
        last_term = last_applied.leader_id.term,
        term_floor,
        "STORE RESET: replica restored from a snapshot; entries after the snapshot are gone and the next term will be above the floor"
    );
    Ok(Restored {
        last_applied: Some(last_applied),
        membership,
        term_floor,
    })
}

async fn run_batcher(raft: Raft, mut queue: mpsc::Receiver<Proposal>, config: RaftConfig) {
    let settings = config.settings();
    let in_flight = Arc::new(Semaphore::new(settings.batches_in_flight_max));
    let mut carried: Option<Proposal> = None;
    loop {
        let first = match carried.take() {
            Some(p) => p,
            None => match queue.recv().await {
                Some(p) => p,
                None => return,
            },
        };
        // Wait for a free slot before gathering, so proposals pile up while batches are in flight.
        let Ok(permit) = in_flight.clone().acquire_owned().await else {
            return;
        };
        let mut bytes = first.command.len();
        let mut batch = vec![first];
        while batch.len() < settings.batch_commands_max {
            let Ok(next) = queue.try_recv() else { break };
            if bytes + next.command.len() > settings.batch_bytes_max {
                carried = Some(next);
                break;
            }
            bytes += next.command.len();
            batch.push(next);
        }
        tokio::spawn(write_batch(
            raft.clone(),
            batch,
            permit,
            config.propose_timeout(),
        ));
    }
}

async fn write_batch(
    raft: Raft,
    mut batch: Vec<Proposal>,
    permit: OwnedSemaphorePermit,
    timeout: Duration,
) {
    let commands = batch
        .iter_mut()
        .map(|p| std::mem::take(&mut p.command))
        .collect();
    let result = tokio::time::timeout(timeout, raft.client_write(Command(commands))).await;
    drop(permit);
    let written = match result {
        Err(_) => Err(ProposeError::Timeout {
            timeout_ms: timeout.as_millis() as u64,
        }),
        Ok(Err(e)) => Err(propose_error(e)),
        Ok(Ok(written)) => Ok(written),
    };
    let written = match written {
        Ok(w) => w,
        Err(e) => {
            for p in batch {
                let _ = p.reply.send(Err(e.clone()));
            }
            return;
        }
    };
    let mut answers = written.data.0.into_iter();
    for (position, p) in batch.into_iter().enumerate() {
        let answer = match answers.next() {
            Some(response) => Ok(Proposed {
                log_id: written.log_id,
                position: position as u32,
                response,
            }),
            None => Err(ProposeError::Raft(format!(
                "entry {} has fewer answers than commands",
                written.log_id
            ))),
        };
        let _ = p.reply.send(answer);
    }
}

fn propose_error(e: RaftError<NodeId, ClientWriteError<NodeId, BasicNode>>) -> ProposeError {
    match e {
        RaftError::APIError(ClientWriteError::ForwardToLeader(f)) => ProposeError::NotLeader {
            leader: f.leader_id,
            leader_addr: f.leader_node.map(|n| n.addr),
        },
        RaftError::APIError(other) => ProposeError::Raft(other.to_string()),
        RaftError::Fatal(openraft::error::Fatal::Stopped) => ProposeError::Stopped,
        RaftError::Fatal(other) => ProposeError::Raft(other.to_string()),
    }
}
