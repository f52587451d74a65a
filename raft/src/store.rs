//! Shared plumbing of the log store and the state machine: the store error, running blocking redb work
//! off the async threads, and reading/writing encoded values in the `&str → &[u8]` state tables.

use redb::{ReadableTable, TableDefinition, WriteTransaction};
use serde::Serialize;
use serde::de::DeserializeOwned;

use mesh_codec::CodecError;

use crate::state_machine::AppError;

/// A storage fault of a replica's store. openraft treats any of these as fatal: the replica stops.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error(
        "replica store: redb failed: {0}; the replica stops — check the disk and the store file, then restart it"
    )]
    Redb(#[from] redb::Error),
    #[error(
        "replica store: {0}; the stored bytes are damaged or were written by another format — restore the replica from a snapshot"
    )]
    Codec(#[from] CodecError),
    #[error("replica store: the application failed: {0}; the replica stops")]
    App(#[from] AppError),
    #[error("replica store: a storage thread stopped before finishing: {0}")]
    Join(String),
    #[error("replica store: {0}")]
    Invalid(String),
}

macro_rules! store_error_from_redb {
    ($($t:ty),*) => {$(
        impl From<$t> for StoreError {
            fn from(e: $t) -> Self {
                StoreError::Redb(e.into())
            }
        }
    )*};
}
store_error_from_redb!(
    redb::TableError,
    redb::StorageError,
    redb::CommitError,
    redb::TransactionError,
    redb::SetDurabilityError
);

/// Runs blocking redb work (a write transaction waits for the single writer and may fsync) on the
/// blocking pool, so the async threads keep serving Raft messages.
pub(crate) async fn blocking<T, F>(work: F) -> Result<T, StoreError>
where
    T: Send + 'static,
    F: FnOnce() -> Result<T, StoreError> + Send + 'static,
{
    off_the_thread(work).await?
}

/// Runs `work` on the blocking pool, except on a runtime of one thread: there it runs in place.
/// The simulator (decision 0322) runs every replica on one thread with simulated time; work
/// finishing on another thread at a moment real time decides would make a run's order of events
/// differ from one replay to the next. meshd runs Raft on a multi-thread runtime: the pool.
pub async fn off_the_thread<T, F>(work: F) -> Result<T, StoreError>
where
    T: Send + 'static,
    F: FnOnce() -> T + Send + 'static,
{
    match tokio::runtime::Handle::try_current().map(|h| h.runtime_flavor()) {
        Ok(tokio::runtime::RuntimeFlavor::CurrentThread) => Ok(work()),
        _ => tokio::task::spawn_blocking(work)
            .await
            .map_err(|e| StoreError::Join(e.to_string())),
    }
}

/// Reads and decodes the value under `key`; `None` when the key was never written.
pub(crate) fn get<T: DeserializeOwned>(
    table: &impl ReadableTable<&'static str, &'static [u8]>,
    key: &str,
    what: &'static str,
) -> Result<Option<T>, StoreError> {
    match table.get(key)? {
        Some(bytes) => Ok(Some(mesh_codec::decode(what, bytes.value())?)),
        None => Ok(None),
    }
}

/// Encodes `value` and writes it under `key` in `def`, inside `txn`.
pub(crate) fn put<T: Serialize>(
    txn: &WriteTransaction,
    def: TableDefinition<&str, &[u8]>,
    key: &str,
    what: &'static str,
    value: &T,
) -> Result<(), StoreError> {
    let bytes = mesh_codec::encode(what, value)?;
    let mut table = txn.open_table(def)?;
    table.insert(key, bytes.as_slice())?;
    Ok(())
}
