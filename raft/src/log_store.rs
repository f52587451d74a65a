//! The Raft log on redb (`raft_log`, `raft_state`): vote, append, truncate, purge and reads.
//!
//! Appends, votes, truncation and purges commit with `Durability::Immediate`, one transaction per
//! call (a whole batch of entries per append). Because the state machine shares the same database, an
//! immediate commit here also persists every earlier non-durable apply: a purge therefore never
//! outruns the applies it relies on (see `docs/decisions/0031-apply-durability-and-purge.md`).

use std::fmt::Debug;
use std::ops::{Bound, RangeBounds};
use std::sync::Arc;

use openraft::storage::{LogFlushed, LogState, RaftLogStorage};
use openraft::{OptionalSend, RaftLogId, RaftLogReader, StorageIOError};
use redb::{Database, Durability, ReadableDatabase, ReadableTable};

use mesh_migrations::tables;

use crate::store::{StoreError, blocking, get, put};
use crate::{Entry, LogId, StorageError, TypeConfig, Vote};

/// The log store of one replica; cheap to clone (it shares the database).
#[derive(Clone)]
pub struct LogStore {
    db: Arc<Database>,
}

impl LogStore {
    /// A log store over a database opened by [`mesh_migrations::open`].
    pub fn new(db: Arc<Database>) -> Self {
        Self { db }
    }

    fn read_entries(&self, start: Bound<u64>, end: Bound<u64>) -> Result<Vec<Entry>, StoreError> {
        let txn = self.db.begin_read()?;
        let table = txn.open_table(tables::RAFT_LOG)?;
        let mut entries = Vec::new();
        for row in table.range::<u64>((start, end))? {
            let (_, bytes) = row?;
            entries.push(mesh_codec::decode("raft log entry", bytes.value())?);
        }
        Ok(entries)
    }

    fn read_log_state(&self) -> Result<LogState<TypeConfig>, StoreError> {
        let txn = self.db.begin_read()?;
        let state = txn.open_table(tables::RAFT_STATE)?;
        let last_purged: Option<LogId> =
            get(&state, tables::RAFT_STATE_LAST_PURGED, "last purged log id")?;
        let log = txn.open_table(tables::RAFT_LOG)?;
        let last = match log.last()? {
            Some((_, bytes)) => {
                let entry: Entry = mesh_codec::decode("raft log entry", bytes.value())?;
                Some(*entry.get_log_id())
            }
            None => last_purged,
        };
        Ok(LogState {
            last_purged_log_id: last_purged,
            last_log_id: last,
        })
    }

    fn read_raft_state<T: serde::de::DeserializeOwned>(
        &self,
        key: &'static str,
        what: &'static str,
    ) -> Result<Option<T>, StoreError> {
        let txn = self.db.begin_read()?;
        let state = txn.open_table(tables::RAFT_STATE)?;
        get(&state, key, what)
    }
}

/// Writes `value` under `key` of `raft_state` in its own transaction.
pub(crate) fn write_raft_state<T: serde::Serialize>(
    db: &Database,
    key: &'static str,
    what: &'static str,
    value: &T,
    durability: Durability,
) -> Result<(), StoreError> {
    let mut txn = db.begin_write()?;
    txn.set_durability(durability)?;
    put(&txn, tables::RAFT_STATE, key, what, value)?;
    txn.commit()?;
    Ok(())
}

/// Writes a batch of entries in one immediate transaction: one fsync for the whole batch.
pub(crate) fn append_entries(db: &Database, entries: &[Entry]) -> Result<(), StoreError> {
    let txn = db.begin_write()?;
    {
        let mut log = txn.open_table(tables::RAFT_LOG)?;
        for entry in entries {
            let bytes = mesh_codec::encode("raft log entry", entry)?;
            log.insert(entry.get_log_id().index, bytes.as_slice())?;
        }
    }
    txn.commit()?;
    Ok(())
}

fn truncate_from(db: &Database, index: u64) -> Result<(), StoreError> {
    let txn = db.begin_write()?;
    {
        let mut log = txn.open_table(tables::RAFT_LOG)?;
        log.retain_in::<u64, _>(index.., |_, _| false)?;
    }
    txn.commit()?;
    Ok(())
}

fn purge_upto(db: &Database, log_id: LogId) -> Result<(), StoreError> {
    let txn = db.begin_write()?;
    put(
        &txn,
        tables::RAFT_STATE,
        tables::RAFT_STATE_LAST_PURGED,
        "last purged log id",
        &log_id,
    )?;
    {
        let mut log = txn.open_table(tables::RAFT_LOG)?;
        log.retain_in::<u64, _>(..=log_id.index, |_, _| false)?;
    }
    txn.commit()?;
    Ok(())
}

fn read_err(e: StoreError) -> StorageError {
    StorageIOError::read_logs(&e).into()
}

fn write_err(e: StoreError) -> StorageError {
    StorageIOError::write_logs(&e).into()
}

impl RaftLogReader<TypeConfig> for LogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> Result<Vec<Entry>, StorageError> {
        let start = range.start_bound().cloned();
        let end = range.end_bound().cloned();
        self.read_entries(start, end).map_err(read_err)
    }
}

impl RaftLogStorage<TypeConfig> for LogStore {
    type LogReader = LogStore;

    async fn get_log_state(&mut self) -> Result<LogState<TypeConfig>, StorageError> {
        self.read_log_state().map_err(read_err)
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote) -> Result<(), StorageError> {
        let db = self.db.clone();
        let vote = *vote;
        blocking(move || {
            write_raft_state(
                &db,
                tables::RAFT_STATE_VOTE,
                "vote",
                &vote,
                Durability::Immediate,
            )
        })
        .await
        .map_err(|e| StorageIOError::write_vote(&e).into())
    }

    async fn read_vote(&mut self) -> Result<Option<Vote>, StorageError> {
        self.read_raft_state(tables::RAFT_STATE_VOTE, "vote")
            .map_err(|e| StorageIOError::read_vote(&e).into())
    }

    /// Not durable on its own: a crash may lose it, and then openraft learns the commit index again
    /// from the leader. The next immediate commit (any append or vote) persists it.
    async fn save_committed(&mut self, committed: Option<LogId>) -> Result<(), StorageError> {
        let db = self.db.clone();
        blocking(move || {
            write_raft_state(
                &db,
                tables::RAFT_STATE_COMMITTED,
                "committed log id",
                &committed,
                Durability::None,
            )
        })
        .await
        .map_err(write_err)
    }

    async fn read_committed(&mut self) -> Result<Option<LogId>, StorageError> {
        let committed: Option<Option<LogId>> = self
            .read_raft_state(tables::RAFT_STATE_COMMITTED, "committed log id")
            .map_err(read_err)?;
        Ok(committed.flatten())
    }

    async fn append<I>(
        &mut self,
        entries: I,
        callback: LogFlushed<TypeConfig>,
    ) -> Result<(), StorageError>
    where
        I: IntoIterator<Item = Entry> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let entries: Vec<Entry> = entries.into_iter().collect();
        let db = self.db.clone();
        blocking(move || append_entries(&db, &entries))
            .await
            .map_err(write_err)?;
        callback.log_io_completed(Ok(()));
        Ok(())
    }

    async fn truncate(&mut self, log_id: LogId) -> Result<(), StorageError> {
        let db = self.db.clone();
        blocking(move || truncate_from(&db, log_id.index))
            .await
            .map_err(write_err)
    }

    async fn purge(&mut self, log_id: LogId) -> Result<(), StorageError> {
        let db = self.db.clone();
        blocking(move || purge_upto(&db, log_id))
            .await
            .map_err(write_err)
    }
}
