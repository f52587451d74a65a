//! The state-machine host: applies committed entries through an [`App`] the domain implements, keeps the
//! applied log id and membership in the same transaction as the effects, builds snapshots from a read
//! transaction (MVCC, so writes go on) and installs them atomically.

use std::io::Cursor;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use openraft::storage::{RaftStateMachine, Snapshot};
use openraft::{EntryPayload, OptionalSend, RaftSnapshotBuilder, SnapshotMeta, StorageIOError};
use redb::{Database, Durability, ReadTransaction, ReadableDatabase, WriteTransaction};
use serde::{Deserialize, Serialize};

use mesh_codec::CodecError;
use mesh_migrations::tables;

use crate::store::{StoreError, blocking, get, put};
use crate::{
    BasicNode, Entry, LogId, NodeId, Response, StorageError, StoredMembership, TypeConfig,
};

/// Where a command sits in the log: the entry's index and term, and its position in the entry's batch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EntryAt {
    pub index: u64,
    /// The term of the leader that wrote the entry: the epoch it was written under.
    pub term: u64,
    /// Position of the command in its entry's batch (0 for blank and membership entries).
    pub position: u32,
}

/// A storage failure inside the application. Any error stops the replica; a domain refusal is an
/// `Ok` response instead.
#[derive(Debug, thiserror::Error)]
pub enum AppError {
    #[error("redb: {0}")]
    Redb(#[from] redb::Error),
    #[error("{0}")]
    Codec(#[from] CodecError),
    #[error("{0}")]
    Other(String),
}

macro_rules! app_error_from_redb {
    ($($t:ty),*) => {$(
        impl From<$t> for AppError {
            fn from(e: $t) -> Self {
                AppError::Redb(e.into())
            }
        }
    )*};
}
app_error_from_redb!(
    redb::TableError,
    redb::StorageError,
    redb::CommitError,
    redb::TransactionError
);

/// The domain state machine. Its state lives in redb tables of the replica's database.
///
/// All methods take `&self`: applies and snapshot builds run at the same time on different threads
/// (a snapshot reads an MVCC view while applies go on), so an app that caches state in memory keeps it
/// behind its own lock.
pub trait App: Send + Sync + 'static {
    /// Applies one committed command inside `txn`. `command` is `None` for blank and membership
    /// entries, so the app sees every term. A domain refusal is a response (`Ok` bytes); `Err` is a
    /// storage failure and stops the replica.
    fn apply(
        &self,
        txn: &WriteTransaction,
        at: EntryAt,
        command: Option<&[u8]>,
    ) -> Result<Vec<u8>, AppError>;

    /// Applies every command of one batch of committed entries, in log order, inside `txn`: one
    /// answer per command, in the same order. An app that writes rows per command can open its
    /// tables once for the whole batch here instead of once per command (decision 0330); by
    /// default each command is one [`App::apply`].
    fn apply_all(
        &self,
        txn: &WriteTransaction,
        commands: &[(EntryAt, Option<&[u8]>)],
    ) -> Result<Vec<Vec<u8>>, AppError> {
        let mut answers = Vec::with_capacity(commands.len());
        for (at, command) in commands {
            answers.push(self.apply(txn, *at, *command)?);
        }
        Ok(answers)
    }

    /// Builds snapshot bytes of all domain state from a read transaction.
    fn snapshot(&self, txn: &ReadTransaction) -> Result<Vec<u8>, AppError>;

    /// Replaces all domain state with `snapshot`, inside one write transaction.
    fn install(&self, txn: &WriteTransaction, snapshot: &[u8]) -> Result<(), AppError>;
}

/// The bytes of a snapshot: Raft's applied position and membership, and the app's own snapshot.
/// This is also the file format `restore` reads.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SnapshotFile {
    /// Format version of this record, so a later binary can refuse or convert an old file.
    pub format: u32,
    pub last_applied: Option<LogId>,
    pub last_membership: StoredMembership,
    pub app: Vec<u8>,
}

impl SnapshotFile {
    /// The format this binary writes.
    pub const format_current: u32 = 1;

    /// Encodes the file.
    pub fn encode(&self) -> Result<Vec<u8>, CodecError> {
        mesh_codec::encode("snapshot file", self)
    }

    /// Decodes a file, refusing a format this binary does not know.
    pub fn decode(bytes: &[u8]) -> Result<Self, StoreError> {
        let file: SnapshotFile = mesh_codec::decode("snapshot file", bytes)?;
        if file.format != Self::format_current {
            return Err(StoreError::Invalid(format!(
                "snapshot file format {} is not the format {} this binary reads; use a matching mesh binary",
                file.format,
                Self::format_current
            )));
        }
        Ok(file)
    }
}

#[derive(Clone)]
struct CurrentSnapshot {
    meta: SnapshotMeta<NodeId, BasicNode>,
    data: Vec<u8>,
}

/// The openraft state machine of one replica, hosting the app `A`.
pub struct StateMachine<A: App> {
    db: Arc<Database>,
    app: Arc<A>,
    current: Arc<Mutex<Option<CurrentSnapshot>>>,
    builds: Arc<AtomicU64>,
    /// Counts snapshot installs that ended, written or not (a purge waiting for one reads it,
    /// decision 0280).
    install_ends: Arc<AtomicU64>,
}

/// Counts one ended install when dropped: returned, failed or unwound.
struct InstallEnds(Arc<AtomicU64>);

impl Drop for InstallEnds {
    fn drop(&mut self) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

impl<A: App> StateMachine<A> {
    /// A state machine over a database opened by [`mesh_migrations::open`].
    pub fn new(db: Arc<Database>, app: Arc<A>) -> Self {
        Self {
            db,
            app,
            current: Arc::new(Mutex::new(None)),
            builds: Arc::new(AtomicU64::new(0)),
            install_ends: Arc::new(AtomicU64::new(0)),
        }
    }

    /// The count of ended snapshot installs, for the log store's purges to wait on
    /// ([`crate::LogStore::purges_wait_for_the_state_machine`], decision 0280).
    pub fn install_ends(&self) -> Arc<AtomicU64> {
        self.install_ends.clone()
    }

    fn set_current(&self, snapshot: CurrentSnapshot) -> Result<(), StoreError> {
        let mut current = self
            .current
            .lock()
            .map_err(|_| StoreError::Invalid("snapshot slot poisoned by a panic".to_string()))?;
        *current = Some(snapshot);
        Ok(())
    }
}

/// Reads the applied log id and membership, from any transaction that sees `sm_state`.
pub(crate) fn read_applied(
    table: &impl redb::ReadableTable<&'static str, &'static [u8]>,
) -> Result<(Option<LogId>, StoredMembership), StoreError> {
    let applied: Option<Option<LogId>> =
        get(table, tables::SM_STATE_LAST_APPLIED, "last applied log id")?;
    let membership: Option<StoredMembership> =
        get(table, tables::SM_STATE_LAST_MEMBERSHIP, "last membership")?;
    // Absent keys mean nothing was applied yet: the empty position and membership.
    // allow(empty-on-error): absent key: nothing applied yet; `get` returns errors
    Ok((applied.flatten(), membership.unwrap_or_default()))
}

/// Writes the applied position and membership in `txn`, next to the effects they account for.
pub(crate) fn write_applied(
    txn: &WriteTransaction,
    applied: &Option<LogId>,
    membership: &StoredMembership,
) -> Result<(), StoreError> {
    put(
        txn,
        tables::SM_STATE,
        tables::SM_STATE_LAST_APPLIED,
        "last applied log id",
        applied,
    )?;
    put(
        txn,
        tables::SM_STATE,
        tables::SM_STATE_LAST_MEMBERSHIP,
        "last membership",
        membership,
    )
}

/// Applies a batch of entries in one non-durable transaction. A crash may lose it; the log, which is
/// durable, replays it at start (openraft re-applies from the saved committed id).
fn apply_batch<A: App>(
    db: &Database,
    app: &A,
    entries: &[Entry],
) -> Result<Vec<Response>, StoreError> {
    let mut txn = db.begin_write()?;
    txn.set_durability(Durability::None)?;
    let (mut applied, mut membership) = {
        let table = txn.open_table(tables::SM_STATE)?;
        read_applied(&table)?
    };
    // Every command of the batch in one call, so the app opens its tables once (decision 0330);
    // `counts` says how many answers belong to each entry.
    let mut commands = Vec::with_capacity(entries.len());
    let mut counts = Vec::with_capacity(entries.len());
    for entry in entries {
        let at = |position: u32| EntryAt {
            index: entry.log_id.index,
            term: entry.log_id.leader_id.term,
            position,
        };
        match &entry.payload {
            EntryPayload::Normal(command) => {
                for (position, bytes) in command.0.iter().enumerate() {
                    let position = u32::try_from(position).map_err(|_| {
                        StoreError::Invalid("a batch holds more than u32::MAX commands".to_string())
                    })?;
                    commands.push((at(position), Some(bytes.as_slice())));
                }
                counts.push(command.0.len());
            }
            EntryPayload::Blank => {
                commands.push((at(0), None));
                counts.push(1);
            }
            EntryPayload::Membership(m) => {
                commands.push((at(0), None));
                counts.push(1);
                membership = StoredMembership::new(Some(entry.log_id), m.clone());
            }
        }
        applied = Some(entry.log_id);
    }
    let answers = app.apply_all(&txn, &commands)?;
    if answers.len() != commands.len() {
        return Err(StoreError::Invalid(format!(
            "the state machine answered {} of {} commands",
            answers.len(),
            commands.len()
        )));
    }
    let mut answers = answers.into_iter();
    let mut responses = Vec::with_capacity(entries.len());
    for count in counts {
        responses.push(Response(answers.by_ref().take(count).collect()));
    }
    write_applied(&txn, &applied, &membership)?;
    txn.commit()?;
    Ok(responses)
}

/// Builds a snapshot from one MVCC read view: the applied position, membership and app state all come
/// from the same transaction, so they agree.
pub(crate) fn build_file<A: App>(db: &Database, app: &A) -> Result<SnapshotFile, StoreError> {
    let txn = db.begin_read()?;
    let (last_applied, last_membership) = {
        let table = txn.open_table(tables::SM_STATE)?;
        read_applied(&table)?
    };
    let app_bytes = app.snapshot(&txn)?;
    Ok(SnapshotFile {
        format: SnapshotFile::format_current,
        last_applied,
        last_membership,
        app: app_bytes,
    })
}

/// Replaces the app state and the applied position with a snapshot's, in one durable transaction.
pub(crate) fn install_file<A: App>(
    txn: &WriteTransaction,
    app: &A,
    file: &SnapshotFile,
) -> Result<(), StoreError> {
    app.install(txn, &file.app)?;
    write_applied(txn, &file.last_applied, &file.last_membership)
}

fn sm_err(e: StoreError) -> StorageError {
    StorageIOError::write_state_machine(&e).into()
}

/// Builds snapshots for openraft off the apply path.
pub struct SnapshotBuilder<A: App> {
    db: Arc<Database>,
    app: Arc<A>,
    current: Arc<Mutex<Option<CurrentSnapshot>>>,
    builds: Arc<AtomicU64>,
}

impl<A: App> RaftSnapshotBuilder<TypeConfig> for SnapshotBuilder<A> {
    async fn build_snapshot(&mut self) -> Result<Snapshot<TypeConfig>, StorageError> {
        let db = self.db.clone();
        let app = self.app.clone();
        let file = blocking(move || build_file(&db, app.as_ref()))
            .await
            .map_err(|e| StorageIOError::read_state_machine(&e))?;
        let data = file
            .encode()
            .map_err(|e| StorageIOError::read_state_machine(&e))?;
        let build = self.builds.fetch_add(1, Ordering::Relaxed);
        let id = match file.last_applied {
            Some(id) => format!("{}-{}-{build}", id.leader_id.term, id.index),
            None => format!("none-{build}"),
        };
        let meta = SnapshotMeta {
            last_log_id: file.last_applied,
            last_membership: file.last_membership,
            snapshot_id: id,
        };
        let mut current = self.current.lock().map_err(|_| {
            StorageIOError::write_snapshot(
                None,
                &StoreError::Invalid("snapshot slot poisoned by a panic".to_string()),
            )
        })?;
        *current = Some(CurrentSnapshot {
            meta: meta.clone(),
            data: data.clone(),
        });
        Ok(Snapshot {
            meta,
            snapshot: Box::new(Cursor::new(data)),
        })
    }
}

impl<A: App> RaftStateMachine<TypeConfig> for StateMachine<A> {
    type SnapshotBuilder = SnapshotBuilder<A>;

    async fn applied_state(&mut self) -> Result<(Option<LogId>, StoredMembership), StorageError> {
        let read = || -> Result<_, StoreError> {
            let txn = self.db.begin_read()?;
            let table = txn.open_table(tables::SM_STATE)?;
            read_applied(&table)
        };
        read().map_err(|e| StorageIOError::read_state_machine(&e).into())
    }

    async fn apply<I>(&mut self, entries: I) -> Result<Vec<Response>, StorageError>
    where
        I: IntoIterator<Item = Entry> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let entries: Vec<Entry> = entries.into_iter().collect();
        let db = self.db.clone();
        let app = self.app.clone();
        blocking(move || apply_batch(&db, app.as_ref(), &entries))
            .await
            .map_err(sm_err)
    }

    async fn get_snapshot_builder(&mut self) -> Self::SnapshotBuilder {
        SnapshotBuilder {
            db: self.db.clone(),
            app: self.app.clone(),
            current: self.current.clone(),
            builds: self.builds.clone(),
        }
    }

    async fn begin_receiving_snapshot(&mut self) -> Result<Box<Cursor<Vec<u8>>>, StorageError> {
        Ok(Box::new(Cursor::new(Vec::new())))
    }

    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMeta<NodeId, BasicNode>,
        snapshot: Box<Cursor<Vec<u8>>>,
    ) -> Result<(), StorageError> {
        // Counted as ended however the install ends: written, refused or unwound.
        let _ended = InstallEnds(self.install_ends.clone());
        let data = snapshot.into_inner();
        let signature = Some(meta.signature());
        // A refusal is logged here as well as returned: openraft may stop on another error of
        // the same moment first (a purge waiting for this install) and never show this one.
        let file = SnapshotFile::decode(&data).map_err(|e| {
            tracing::warn!(snapshot = %meta.snapshot_id, bytes = data.len(), error = %e, "a received snapshot is refused: its bytes do not decode");
            StorageIOError::read_snapshot(signature.clone(), &e)
        })?;
        if file.last_applied != meta.last_log_id || file.last_membership != meta.last_membership {
            let e = StoreError::Invalid(format!(
                "snapshot {} says it ends at {:?} but its bytes end at {:?}; the sender's snapshot is inconsistent",
                meta.snapshot_id, meta.last_log_id, file.last_applied
            ));
            tracing::warn!(error = %e, "a received snapshot is refused");
            return Err(StorageIOError::read_snapshot(signature, &e).into());
        }
        // The moment a received snapshot is about to replace the state (the chaos runs crash here).
        tracing::debug!(snapshot = %meta.snapshot_id, "installing snapshot");
        let db = self.db.clone();
        let app = self.app.clone();
        blocking(move || {
            // Durable at once: the log it replaces may be purged right after.
            let txn = db.begin_write()?;
            install_file(&txn, app.as_ref(), &file)?;
            txn.commit()?;
            Ok(())
        })
        .await
        .map_err(|e| StorageIOError::write_snapshot(signature, &e))?;
        self.set_current(CurrentSnapshot {
            meta: meta.clone(),
            data,
        })
        .map_err(sm_err)
    }

    async fn get_current_snapshot(&mut self) -> Result<Option<Snapshot<TypeConfig>>, StorageError> {
        let current = self
            .current
            .lock()
            .map_err(|_| {
                sm_err(StoreError::Invalid(
                    "snapshot slot poisoned by a panic".to_string(),
                ))
            })?
            .clone();
        Ok(current.map(|c| Snapshot {
            meta: c.meta,
            snapshot: Box::new(Cursor::new(c.data)),
        }))
    }
}
