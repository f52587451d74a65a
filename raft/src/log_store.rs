//! The Raft log on redb (`raft_log`, `raft_state`): vote, append, truncate, purge and reads.
//!
//! Appends, votes, truncation and purges commit with `Durability::Immediate`. Because the state
//! machine shares the same database, an immediate commit here also persists every earlier
//! non-durable apply: a purge therefore never outruns the applies it relies on (see
//! `docs/decisions/0031-apply-durability-and-purge.md`).
//!
//! Appends do not wait for the disk (decision 0182): `append` puts the entries in an in-memory
//! tail, where reads find them at once, and queues them to one writer thread, which writes every
//! append queued behind the first in one transaction (one fsync for all of them) and then tells
//! openraft they are flushed. So openraft replicates while the leader's fsync runs, and concurrent
//! batches share fsyncs. Votes, truncations and purges go through the same queue, in order, and
//! are awaited.

use std::collections::BTreeMap;
use std::fmt::Debug;
use std::ops::{Bound, RangeBounds};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use openraft::storage::{LogFlushed, LogState, RaftLogStorage};
use openraft::{OptionalSend, RaftLogId, RaftLogReader, StorageIOError};
use redb::{Database, Durability, ReadableDatabase, ReadableTable};
use tokio::sync::{mpsc, oneshot};

use mesh_migrations::tables;

use crate::store::{StoreError, blocking, get, put};
use crate::{Entry, LogId, StorageError, TypeConfig, Vote};

/// Writes queued for the writer thread at most; `append` waits (back-pressure) beyond it.
pub const log_writes_queued_max: usize = 1024;
/// Appends written in one transaction at most.
pub const log_appends_per_commit_max: usize = 256;
/// How often a waiting purge reads the state machine's applied index again.
const purge_poll_ms: u64 = 5;

/// How long a purge past the state machine waits for the snapshot that covers it, by default
/// ([`LogStore::purges_wait_for_the_state_machine`]).
pub const purge_wait_for_install_ms: u64 = 30_000;

/// The log store of one replica; cheap to clone (it shares the database, the tail and the writer).
#[derive(Clone)]
pub struct LogStore {
    db: Arc<Database>,
    /// Entries appended and not yet known to be on disk, by index.
    tail: Arc<Mutex<BTreeMap<u64, Entry>>>,
    writes: mpsc::Sender<Write>,
    /// No writer thread: every write is done when queued ([`LogStore::new`]).
    in_place: bool,
    /// Set: a purge past the state machine's applied index waits (at most this long) until it
    /// holds the purged entries (decision 0280), or until a snapshot install ended without them
    /// (the count of ended installs the state machine keeps, [`StateMachine::counting_install_ends`]).
    ///
    /// [`StateMachine::counting_install_ends`]: crate::StateMachine::counting_install_ends
    purge_wait: Option<(Duration, Arc<AtomicU64>)>,
}

/// One write for the writer thread, done in queue order.
enum Write {
    Append {
        entries: Vec<Entry>,
        flushed: LogFlushed<TypeConfig>,
    },
    Vote {
        vote: Vote,
        done: oneshot::Sender<Result<(), StoreError>>,
    },
    Truncate {
        index: u64,
        done: oneshot::Sender<Result<(), StoreError>>,
    },
    Purge {
        log_id: LogId,
        done: oneshot::Sender<Result<(), StoreError>>,
    },
}

impl LogStore {
    /// A log store over a database opened by [`mesh_migrations::open`], with its writer thread
    /// (it holds the database only while writing, and ends when the last clone is dropped).
    ///
    /// On a tokio runtime of one thread there is no writer thread: each write is done in place,
    /// when it is queued (the simulator, decision 0322: a write finishing on another thread at a
    /// moment real time decides would change the order of a run's events from one replay to the
    /// next).
    pub fn new(db: Arc<Database>) -> Self {
        let (writes, queue) = mpsc::channel(log_writes_queued_max);
        let tail = Arc::new(Mutex::new(BTreeMap::new()));
        let (weak_db, weak_tail) = (Arc::downgrade(&db), Arc::downgrade(&tail));
        let in_place = matches!(
            tokio::runtime::Handle::try_current().map(|h| h.runtime_flavor()),
            Ok(tokio::runtime::RuntimeFlavor::CurrentThread)
        );
        if !in_place {
            std::thread::Builder::new()
                .name("raft-log-writer".into())
                .spawn(move || write_loop(weak_db, weak_tail, queue))
                .map_or_else(
                    |e| tracing::error!(error = %e, "cannot start the Raft log writer thread; every log write will fail"),
                    |_| (),
                );
        }
        Self {
            db,
            tail,
            writes,
            in_place,
            purge_wait: None,
        }
    }

    /// Purges wait, at most `wait`, until the state machine in the same database has applied
    /// what they remove; a purge it does not reach in time fails and removes nothing (decision
    /// 0280). openraft 0.9 purges the log up to a snapshot a follower installs *as soon as* it
    /// hands the install to the state machine, without waiting for it: a crash in between left
    /// the log purged and the snapshot not installed, a store no restart could use ("try to get
    /// log at index 0 but got None" on every snapshot the leader sent again). A replica's store
    /// has it on; openraft's conformance suite, which purges a log store with no state machine
    /// behind it, does not.
    /// `install_ends` is the state machine's count of ended installs: a purge that sees one end
    /// without its entries applied fails at once instead of waiting out `wait`.
    pub fn purges_wait_for_the_state_machine(
        mut self,
        wait: Duration,
        install_ends: Arc<AtomicU64>,
    ) -> Self {
        self.purge_wait = Some((wait, install_ends));
        self
    }

    /// Waits until the state machine's applied index (durable, in this database) is at least
    /// `index`, within the purge wait; `Err` names both when it is not.
    async fn wait_applied(
        &self,
        index: u64,
        wait: Duration,
        install_ends: &AtomicU64,
    ) -> Result<(), StoreError> {
        let deadline = tokio::time::Instant::now() + wait;
        let ends_before = install_ends.load(Ordering::SeqCst);
        loop {
            let ended = install_ends.load(Ordering::SeqCst) != ends_before;
            let db = self.db.clone();
            let applied = blocking(move || {
                let txn = db.begin_read()?;
                let table = txn.open_table(tables::SM_STATE)?;
                Ok(crate::state_machine::read_applied(&table)?.0)
            })
            .await?;
            if applied.is_some_and(|a| a.index >= index) {
                return Ok(());
            }
            if ended || tokio::time::Instant::now() >= deadline {
                return Err(StoreError::Invalid(format!(
                    "the log would be purged up to index {index} but the state machine holds only {applied:?} ({}): nothing purged; restart the replica and it takes the leader's snapshot again",
                    if ended {
                        "a snapshot install ended without it".to_string()
                    } else {
                        format!("waited {} ms for a snapshot install", wait.as_millis())
                    }
                )));
            }
            tokio::time::sleep(Duration::from_millis(purge_poll_ms)).await;
        }
    }

    fn tail(&self) -> std::sync::MutexGuard<'_, BTreeMap<u64, Entry>> {
        // A poisoned tail only means a panic elsewhere while it was held; its map is intact.
        self.tail.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn read_entries(&self, start: Bound<u64>, end: Bound<u64>) -> Result<Vec<Entry>, StoreError> {
        // The tail first: an entry the writer flushes meanwhile is then still found on disk.
        let tail: BTreeMap<u64, Entry> = self
            .tail()
            .range((start, end))
            .map(|(i, e)| (*i, e.clone()))
            .collect();
        let txn = self.db.begin_read()?;
        let table = txn.open_table(tables::RAFT_LOG)?;
        let mut entries = BTreeMap::new();
        for row in table.range::<u64>((start, end))? {
            let (index, bytes) = row?;
            entries.insert(
                index.value(),
                mesh_codec::decode("raft log entry", bytes.value())?,
            );
        }
        // A tail entry is newer than a disk entry at its index (re-appended after a truncation).
        entries.extend(tail);
        no_hole(&entries)?;
        Ok(entries.into_values().collect())
    }

    /// Queues `write` for the writer thread.
    async fn queue(&self, write: Write) -> Result<(), StoreError> {
        if self.in_place {
            write_one(&self.db, &Arc::downgrade(&self.tail), write);
            return Ok(());
        }
        self.writes
            .send(write)
            .await
            .map_err(|_| StoreError::Invalid("the Raft log writer thread has stopped".into()))
    }

    /// Queues a write that answers on `done` and waits for its answer.
    async fn queue_and_wait(
        &self,
        make: impl FnOnce(oneshot::Sender<Result<(), StoreError>>) -> Write,
    ) -> Result<(), StoreError> {
        let (done, answer) = oneshot::channel();
        self.queue(make(done)).await?;
        answer.await.map_err(|_| {
            StoreError::Invalid("the Raft log writer thread stopped mid-write".into())
        })?
    }

    fn read_log_state(&self) -> Result<LogState<TypeConfig>, StoreError> {
        let txn = self.db.begin_read()?;
        let state = txn.open_table(tables::RAFT_STATE)?;
        let last_purged: Option<LogId> =
            get(&state, tables::RAFT_STATE_LAST_PURGED, "last purged log id")?;
        let log = txn.open_table(tables::RAFT_LOG)?;
        let on_disk = match log.last()? {
            Some((_, bytes)) => {
                let entry: Entry = mesh_codec::decode("raft log entry", bytes.value())?;
                Some(*entry.get_log_id())
            }
            None => last_purged,
        };
        let in_tail = self.tail().last_key_value().map(|(_, e)| *e.get_log_id());
        let last = in_tail.max(on_disk);
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

/// Refuses entries read with a hole between two of them. openraft checks only the first and last
/// entry of a range it applies, so a hole would be applied as if it were not there and panic its
/// core (issue 11 part 6, decision 0200); the store says what is wrong instead.
fn no_hole(entries: &BTreeMap<u64, Entry>) -> Result<(), StoreError> {
    let mut indexes = entries.keys().copied();
    let Some(mut before) = indexes.next() else {
        return Ok(());
    };
    for index in indexes {
        if before.checked_add(1) != Some(index) {
            return Err(StoreError::Invalid(format!(
                "the raft log holds entries {before} and {index} with nothing between; the store is damaged: move it aside and start the replica on an empty store, or restore it from a snapshot"
            )));
        }
        before = index;
    }
    Ok(())
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
pub(crate) fn append_entries(db: &Database, entries: &[&Entry]) -> Result<(), StoreError> {
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

/// The writer thread: every write in queue order; consecutive appends in one transaction.
fn write_loop(
    db: Weak<Database>,
    tail: Weak<Mutex<BTreeMap<u64, Entry>>>,
    mut queue: mpsc::Receiver<Write>,
) {
    let mut next = queue.blocking_recv();
    while let Some(write) = next.take() {
        let Some(database) = db.upgrade() else { return };
        match write {
            Write::Append { entries, flushed } => {
                let mut batch = vec![(entries, flushed)];
                while batch.len() < log_appends_per_commit_max {
                    match queue.try_recv() {
                        Ok(Write::Append { entries, flushed }) => batch.push((entries, flushed)),
                        Ok(other) => {
                            next = Some(other);
                            break;
                        }
                        Err(_) => break,
                    }
                }
                append_batch(&database, &tail, batch);
            }
            other => write_one(&database, &tail, other),
        }
        drop(database);
        if next.is_none() {
            next = queue.blocking_recv();
        }
    }
}

/// Writes a batch of appends in one transaction, takes them out of the tail and tells openraft.
fn append_batch(
    database: &Database,
    tail: &Weak<Mutex<BTreeMap<u64, Entry>>>,
    batch: Vec<(Vec<Entry>, LogFlushed<TypeConfig>)>,
) {
    let all: Vec<&Entry> = batch.iter().flat_map(|(e, _)| e.iter()).collect();
    let written = append_entries(database, &all);
    if written.is_ok()
        && let Some(tail) = tail.upgrade()
    {
        let mut tail = tail.lock().unwrap_or_else(|p| p.into_inner());
        for entry in &all {
            let id = entry.get_log_id();
            // Only if still the same entry: a truncation may have replaced it.
            if tail.get(&id.index).map(|e| e.get_log_id()) == Some(id) {
                tail.remove(&id.index);
            }
        }
    }
    for (_, flushed) in batch {
        let result = match &written {
            Ok(()) => Ok(()),
            Err(e) => Err(std::io::Error::other(e.to_string())),
        };
        flushed.log_io_completed(result);
    }
}

/// Does one write (an append as a batch of one).
fn write_one(database: &Database, tail: &Weak<Mutex<BTreeMap<u64, Entry>>>, write: Write) {
    match write {
        Write::Append { entries, flushed } => {
            append_batch(database, tail, vec![(entries, flushed)]);
        }
        Write::Vote { vote, done } => {
            let result = write_raft_state(
                database,
                tables::RAFT_STATE_VOTE,
                "vote",
                &vote,
                Durability::Immediate,
            );
            let _ = done.send(result);
        }
        Write::Truncate { index, done } => {
            let _ = done.send(truncate_from(database, index));
        }
        Write::Purge { log_id, done } => {
            let _ = done.send(purge_upto(database, log_id));
        }
    }
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
        let vote = *vote;
        self.queue_and_wait(|done| Write::Vote { vote, done })
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
        {
            // Readable from here on (openraft's contract), before they are on disk.
            let mut tail = self.tail();
            for entry in &entries {
                tail.insert(entry.get_log_id().index, entry.clone());
            }
        }
        self.queue(Write::Append {
            entries,
            flushed: callback,
        })
        .await
        .map_err(write_err)
    }

    async fn truncate(&mut self, log_id: LogId) -> Result<(), StorageError> {
        self.tail().split_off(&log_id.index);
        let index = log_id.index;
        self.queue_and_wait(|done| Write::Truncate { index, done })
            .await
            .map_err(write_err)
    }

    async fn purge(&mut self, log_id: LogId) -> Result<(), StorageError> {
        if let Some((wait, ends)) = &self.purge_wait {
            self.wait_applied(log_id.index, *wait, ends)
                .await
                .map_err(write_err)?;
        }
        self.queue_and_wait(|done| Write::Purge { log_id, done })
            .await
            .map_err(write_err)?;
        let mut tail = self.tail();
        let kept = tail.split_off(&(log_id.index + 1));
        *tail = kept;
        Ok(())
    }
}
