//! Recovery from quorum loss (decision 0235): one surviving replica's store rewritten offline into a
//! one-member cluster with all of its data ([`force_new_cluster`]), what a store holds before that
//! ([`inspect`]), and the fence that keeps replicas outside a store's membership from talking to
//! it ([`outside_membership`]).
//!
//! openraft 0.9 has no call for this, so the store is changed while no replica runs on it: a
//! membership entry `{self}` is appended after the last log entry, written in term `T`, and the
//! vote is set to `T` (for itself, not committed). `T` is at least every term the store holds and
//! every floor the caller knows. At start the replica is the only voter of its effective membership
//! (openraft reads the last membership entry of the log), campaigns after its election timeout in
//! `T + 1`, wins with its own vote, and its blank entry commits the whole log, the new membership
//! with it.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use openraft::{EntryPayload, RaftLogId};
use redb::{Database, ReadableDatabase, ReadableTable};

use mesh_migrations::{MigrationError, tables};

use crate::replica::store_file_name;
use crate::state_machine::read_applied;
use crate::store::{StoreError, blocking, get, put};
use crate::{BasicNode, Entry, LogId, Membership, NodeId, Raft, Vote};

/// Why a store could not be inspected or recovered; nothing was changed.
#[derive(Debug, thiserror::Error)]
pub enum RecoverError {
    #[error(
        "there is no store at {path}; recover runs on a surviving replica's own data directory (check data_dir in its replica.toml)"
    )]
    NoStore { path: PathBuf },
    #[error(
        "replica {id} is not a voter of its store's membership (voters {voters:?}); recover a replica that was a voter, its log holds what the cluster committed"
    )]
    NotAVoter { id: NodeId, voters: Vec<NodeId> },
    #[error(
        "replica {id}'s store is a one-member cluster already (term {term}); start meshd on it and add the others back"
    )]
    AlreadyAlone { id: NodeId, term: u64 },
    #[error(transparent)]
    Migration(#[from] MigrationError),
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// What a store holds, as far as recovery cares.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Inspected {
    /// The stored vote's term.
    pub vote_term: u64,
    /// The last log entry (or the last purged one when the log is empty).
    pub last_log: Option<LogId>,
    /// The last entry known committed.
    pub committed: Option<LogId>,
    /// The last entry applied to the state machine.
    pub applied: Option<LogId>,
    /// The membership in force: the last membership entry of the log, else the applied one.
    pub membership: Membership,
}

impl Inspected {
    /// The highest term the Raft part of the store holds: the vote's and the last entry's.
    pub fn raft_term(&self) -> u64 {
        let last = self.last_log.map_or(0, |l| l.leader_id.term);
        self.vote_term.max(last)
    }

    /// The voters of the membership in force.
    pub fn voters(&self) -> Vec<NodeId> {
        self.membership.voter_ids().collect()
    }
}

/// What [`force_new_cluster`] wrote.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Recovered {
    /// The store as it was before.
    pub before: Inspected,
    /// The membership entry appended: `{id}` in term `term`.
    pub membership_entry: LogId,
    /// The vote written; the replica's first election is in `term + 1`.
    pub term: u64,
}

/// Reads what the store in `dir` holds without changing it. Refuses a directory with no store.
pub async fn inspect(dir: &Path) -> Result<Inspected, RecoverError> {
    let db = open_existing(dir).await?;
    Ok(blocking(move || read_position(&db)).await?)
}

/// Rewrites the store in `dir` into a one-member cluster of `id` at `node` (decision 0235): a
/// membership entry `{id}` appended in term `T = max(term_floor, the store's vote and last log
/// term)` and the vote set to `T`, in one transaction. The replica's first term is `T + 1`. The
/// store must not be open elsewhere (meshd stopped); every entry it holds is kept, and entries the
/// old cluster had not committed become committed with the new membership.
pub async fn force_new_cluster(
    id: NodeId,
    dir: &Path,
    node: BasicNode,
    term_floor: u64,
) -> Result<Recovered, RecoverError> {
    let db = open_existing(dir).await?;
    blocking(move || rewrite(&db, id, node, term_floor))
        .await
        .map_err(RecoverError::Store)?
}

fn rewrite(
    db: &Database,
    id: NodeId,
    node: BasicNode,
    term_floor: u64,
) -> Result<Result<Recovered, RecoverError>, StoreError> {
    let before = read_position(db)?;
    let voters = before.voters();
    if !voters.contains(&id) {
        return Ok(Err(RecoverError::NotAVoter { id, voters }));
    }
    if voters == [id] && before.membership.learner_ids().next().is_none() {
        return Ok(Err(RecoverError::AlreadyAlone {
            id,
            term: before.raft_term(),
        }));
    }
    let term = term_floor.max(before.raft_term());
    let index = before.last_log.map_or(0, |l| l.index + 1);
    let membership_entry = LogId::new(openraft::CommittedLeaderId::new(term, id), index);
    let entry = Entry {
        log_id: membership_entry,
        payload: EntryPayload::Membership(Membership::new(
            vec![BTreeSet::from([id])],
            BTreeMap::from([(id, node)]),
        )),
    };
    let txn = db.begin_write()?;
    {
        let bytes = mesh_codec::encode("raft log entry", &entry)?;
        let mut log = txn.open_table(tables::RAFT_LOG)?;
        log.insert(index, bytes.as_slice())?;
    }
    put(
        &txn,
        tables::RAFT_STATE,
        tables::RAFT_STATE_VOTE,
        "vote",
        &Vote::new(term, id),
    )?;
    txn.commit()?;
    Ok(Ok(Recovered {
        before,
        membership_entry,
        term,
    }))
}

async fn open_existing(dir: &Path) -> Result<Database, RecoverError> {
    let path = dir.join(store_file_name);
    if !path.is_file() {
        return Err(RecoverError::NoStore { path });
    }
    Ok(
        tokio::task::spawn_blocking(move || mesh_migrations::open(&path))
            .await
            .map_err(|e| StoreError::Join(e.to_string()))??,
    )
}

fn read_position(db: &Database) -> Result<Inspected, StoreError> {
    let txn = db.begin_read()?;
    let state = txn.open_table(tables::RAFT_STATE)?;
    let vote: Option<Vote> = get(&state, tables::RAFT_STATE_VOTE, "vote")?;
    // Stored as openraft hands it over: an optional log id (absent: never saved).
    let committed: Option<Option<LogId>> =
        get(&state, tables::RAFT_STATE_COMMITTED, "committed log id")?;
    let committed = committed.flatten();
    let last_purged: Option<LogId> =
        get(&state, tables::RAFT_STATE_LAST_PURGED, "last purged log id")?;
    let (applied, applied_membership) = read_applied(&txn.open_table(tables::SM_STATE)?)?;
    let log = txn.open_table(tables::RAFT_LOG)?;
    let mut last_log = last_purged;
    let mut membership = applied_membership.membership().clone();
    // The membership in force is the last one in the log after the applied entry, as openraft
    // reads it at start; the entries after the applied one are few (not yet applied).
    let after = applied.map_or(0, |l| l.index + 1);
    for row in log.range(after..)? {
        let (_, bytes) = row?;
        let entry: Entry = mesh_codec::decode("raft log entry", bytes.value())?;
        if let EntryPayload::Membership(m) = &entry.payload {
            membership = m.clone();
        }
    }
    if let Some((_, bytes)) = log.last()? {
        let entry: Entry = mesh_codec::decode("raft log entry", bytes.value())?;
        last_log = last_log.max(Some(*entry.get_log_id()));
    }
    Ok(Inspected {
        vote_term: vote.map_or(0, |v| v.leader_id().term),
        last_log,
        committed,
        applied,
        membership,
    })
}

/// How often a refusal of one sender is logged at most.
const refusal_logged_every: Duration = Duration::from_secs(10);
/// Senders whose last logged refusal is remembered at most; beyond, the memory starts again.
const refusals_remembered_max: usize = 1024;

/// Whether a refusal of `key` (this replica, the sender) is due to be logged: the first always,
/// then at most every [`refusal_logged_every`]. A poisoned memory logs every time.
pub(crate) fn refusal_due(
    logged: &Mutex<BTreeMap<(NodeId, NodeId), Instant>>,
    key: (NodeId, NodeId),
) -> bool {
    let now = Instant::now();
    match logged.lock() {
        Ok(mut last) => {
            let due = last
                .get(&key)
                .is_none_or(|at| now.duration_since(*at) >= refusal_logged_every);
            if due {
                if last.len() >= refusals_remembered_max {
                    last.clear();
                }
                last.insert(key, now);
            }
            due
        }
        Err(_) => true,
    }
}

/// When replica `from` is outside the membership this replica's Raft has in force, the refusal to
/// answer instead of handling its Raft message (decision 0235): a replica of the cluster a
/// recovered replica left, or one removed, gets no vote, no log and no term from it — a higher
/// term in an answer would let the old members elect each other above the new cluster's epoch.
/// `None` while the membership is empty (a replica on a new store waiting to be added) or holds
/// `from`. Logged at most every 10 s per sender.
pub fn outside_membership(raft: &Raft, from: NodeId) -> Option<String> {
    let (own, members) = {
        let m = raft.metrics();
        let m = m.borrow();
        let members: Vec<NodeId> = m
            .membership_config
            .membership()
            .nodes()
            .map(|(id, _)| *id)
            .collect();
        (m.id, members)
    };
    if members.is_empty() || members.contains(&from) {
        return None;
    }
    let refusal = format!(
        "replica {own} refuses Raft from replica {from}: {from} is not a member of its cluster (members {members:?}); its store is from before a recovery or a removal — move it aside and add the replica back"
    );
    static logged: Mutex<BTreeMap<(NodeId, NodeId), Instant>> = Mutex::new(BTreeMap::new());
    let due = refusal_due(&logged, (own, from));
    if due {
        tracing::warn!(replica = own, from, ?members, "{refusal}");
    }
    Some(refusal)
}
