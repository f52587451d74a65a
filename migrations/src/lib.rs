//! Every redb table mesh keeps, the numbered migrations that create and change them, and the runner that applies them at open.
//!
//! [`open`] is the only way anyone opens a store: it creates the file if absent, refuses a store made by a
//! newer binary, and applies each pending migration in its own write transaction that also records the new
//! schema version, so a failed step leaves the store exactly as it was.

mod m0001_initial;
mod m0002_controller_epoch;
mod m0003_settings_history;
mod m0004_epoch_record;
mod m0005_model_history;
mod m0006_requests;
mod m0007_revoked;
mod m0008_uploads;
mod m0009_signers;
mod m0010_requests_in_order;
mod m0011_model_revisions;
mod m0012_settings_deltas;
pub mod records;
pub mod tables;

use std::path::{Path, PathBuf};

use redb::{Database, ReadableDatabase, TableError, WriteTransaction};

pub use mesh_codec::CodecError;

/// The schema version this binary writes: the version of its last migration.
pub const schema_version_latest: u64 = m0012_settings_deltas::VERSION;

/// The page cache of one open store (redb's default is 1 GiB). The domain state lives in memory,
/// so the store is written far more than read: the cache holds the pages a commit dirties and the
/// trees' upper levels. With the default, every replica's RSS grew past 1.3 GiB within a minute
/// of writes (decision 0251, which set 64 MiB); with 64 MiB the cache still held about 50 MiB of
/// pages a leader of 10,000 machines had written and would not read again, so it is 16 MiB
/// (decision 0337).
pub const store_cache_bytes: usize = 16 * 1024 * 1024;

/// Why a migration step failed: it names the storage or encoding fault underneath.
#[derive(Debug, thiserror::Error)]
pub enum StepError {
    #[error("redb: {0}")]
    Redb(#[from] redb::Error),
    #[error("{0}")]
    Codec(#[from] CodecError),
    #[error("{0}")]
    Refused(String),
}

macro_rules! step_error_from_redb {
    ($($t:ty),*) => {$(
        impl From<$t> for StepError {
            fn from(e: $t) -> Self {
                StepError::Redb(e.into())
            }
        }
    )*};
}
step_error_from_redb!(
    redb::TableError,
    redb::StorageError,
    redb::CommitError,
    redb::TransactionError
);

/// Why a store could not be opened at the schema version of this binary.
#[derive(Debug, thiserror::Error)]
pub enum MigrationError {
    #[error(
        "could not {action} store {path}: {source}; check that the file is a mesh store, that no other process has it open and that the disk is healthy"
    )]
    Storage {
        path: PathBuf,
        action: &'static str,
        source: Box<redb::Error>,
    },
    #[error(
        "store {path} is at schema version {store_version} but this binary only knows up to {binary_version}; run a newer mesh binary (or restore a backup made by this one)"
    )]
    StoreTooNew {
        path: PathBuf,
        store_version: u64,
        binary_version: u64,
    },
    #[error(
        "store {path} has tables but no `meta` table, so it is not a mesh store; point mesh at its own store file"
    )]
    NotAMeshStore { path: PathBuf },
    #[error(
        "migration {version:04} ({name}) failed on store {path}: {source}; the store is unchanged at version {from_version}, fix the cause and open it again"
    )]
    Step {
        path: PathBuf,
        version: u64,
        name: &'static str,
        from_version: u64,
        source: Box<StepError>,
    },
}

/// One numbered migration: its step runs inside the write transaction the runner commits.
#[derive(Clone, Copy)]
pub(crate) struct Migration {
    pub(crate) version: u64,
    pub(crate) name: &'static str,
    pub(crate) step: fn(&WriteTransaction) -> Result<(), StepError>,
}

/// All migrations, in order; versions are 1, 2, 3, … with no gap.
pub(crate) const MIGRATIONS: &[Migration] = &[
    Migration {
        version: m0001_initial::VERSION,
        name: m0001_initial::NAME,
        step: m0001_initial::step,
    },
    Migration {
        version: m0002_controller_epoch::VERSION,
        name: m0002_controller_epoch::NAME,
        step: m0002_controller_epoch::step,
    },
    Migration {
        version: m0003_settings_history::VERSION,
        name: m0003_settings_history::NAME,
        step: m0003_settings_history::step,
    },
    Migration {
        version: m0004_epoch_record::VERSION,
        name: m0004_epoch_record::NAME,
        step: m0004_epoch_record::step,
    },
    Migration {
        version: m0005_model_history::VERSION,
        name: m0005_model_history::NAME,
        step: m0005_model_history::step,
    },
    Migration {
        version: m0006_requests::VERSION,
        name: m0006_requests::NAME,
        step: m0006_requests::step,
    },
    Migration {
        version: m0007_revoked::VERSION,
        name: m0007_revoked::NAME,
        step: m0007_revoked::step,
    },
    Migration {
        version: m0008_uploads::VERSION,
        name: m0008_uploads::NAME,
        step: m0008_uploads::step,
    },
    Migration {
        version: m0009_signers::VERSION,
        name: m0009_signers::NAME,
        step: m0009_signers::step,
    },
    Migration {
        version: m0010_requests_in_order::VERSION,
        name: m0010_requests_in_order::NAME,
        step: m0010_requests_in_order::step,
    },
    Migration {
        version: m0011_model_revisions::VERSION,
        name: m0011_model_revisions::NAME,
        step: m0011_model_revisions::step,
    },
    Migration {
        version: m0012_settings_deltas::VERSION,
        name: m0012_settings_deltas::NAME,
        step: m0012_settings_deltas::step,
    },
];

/// Opens (creating if absent) the store at `path` and migrates it to [`schema_version_latest`].
pub fn open(path: &Path) -> Result<Database, MigrationError> {
    open_with(path, MIGRATIONS)
}

/// Opens the store and applies `migrations` (a prefix of [`MIGRATIONS`] in fixture tests, or a list with
/// an injected failing step).
pub(crate) fn open_with(path: &Path, migrations: &[Migration]) -> Result<Database, MigrationError> {
    create_private(path)?;
    let db = Database::builder()
        .set_cache_size(store_cache_bytes)
        .create(path)
        .map_err(|e| storage(path, "open", e))?;
    migrate(&db, path, migrations)?;
    Ok(db)
}

/// Reads the schema version recorded in an open store; 0 for a store no migration has touched yet.
pub fn schema_version(db: &Database, path: &Path) -> Result<u64, MigrationError> {
    let txn = db.begin_read().map_err(|e| storage(path, "read", e))?;
    let meta = match txn.open_table(tables::META) {
        Ok(meta) => meta,
        Err(TableError::TableDoesNotExist(_)) => {
            let mut others = txn.list_tables().map_err(|e| storage(path, "read", e))?;
            if others.next().is_some() {
                return Err(MigrationError::NotAMeshStore {
                    path: path.to_path_buf(),
                });
            }
            return Ok(0);
        }
        Err(e) => return Err(storage(path, "read", e)),
    };
    let version = meta
        .get(tables::SCHEMA_VERSION_KEY)
        .map_err(|e| storage(path, "read", e))?;
    Ok(version.map(|v| v.value()).unwrap_or(0))
}

fn migrate(db: &Database, path: &Path, migrations: &[Migration]) -> Result<(), MigrationError> {
    let binary_version = migrations.last().map(|m| m.version).unwrap_or(0);
    let stored = schema_version(db, path)?;
    if stored > binary_version {
        return Err(MigrationError::StoreTooNew {
            path: path.to_path_buf(),
            store_version: stored,
            binary_version,
        });
    }
    let mut version = stored;
    for migration in migrations.iter().filter(|m| m.version > stored) {
        apply_one(db, migration).map_err(|source| MigrationError::Step {
            path: path.to_path_buf(),
            version: migration.version,
            name: migration.name,
            from_version: version,
            source: Box::new(source),
        })?;
        tracing::info!(
            store = %path.display(),
            version = migration.version,
            name = migration.name,
            "store migrated"
        );
        version = migration.version;
    }
    Ok(())
}

/// Runs one step and records its version in the same transaction; an error drops the transaction
/// uncommitted, which redb rolls back.
fn apply_one(db: &Database, migration: &Migration) -> Result<(), StepError> {
    let txn = db.begin_write()?;
    (migration.step)(&txn)?;
    {
        let mut meta = txn.open_table(tables::META)?;
        meta.insert(tables::SCHEMA_VERSION_KEY, migration.version)?;
    }
    txn.commit()?;
    Ok(())
}

/// Mode of the store file: it holds every minted secret.
pub const store_file_mode: u32 = 0o600;

/// Creates the store file 0600 before redb opens it, so it is never wider, even for an instant
/// (redb creates a missing file with the process umask, 0644 outside systemd; an empty file it
/// initialises as a new store). A store an earlier build left wider is tightened: the file is
/// mesh's own (decision 0296).
fn create_private(path: &Path) -> Result<(), MigrationError> {
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    let io = |action, e: std::io::Error| storage(path, action, redb::Error::Io(e));
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .mode(store_file_mode)
        .open(path)
        .map_err(|e| io("create", e))?;
    let mode = file
        .metadata()
        .map_err(|e| io("read the mode of", e))?
        .permissions()
        .mode();
    if mode & 0o077 != 0 {
        tracing::warn!(path = %path.display(), mode = format!("{:o}", mode & 0o7777), "store file was readable by others; set to 0600");
        file.set_permissions(std::fs::Permissions::from_mode(store_file_mode))
            .map_err(|e| io("set the mode of", e))?;
    }
    Ok(())
}

fn storage(path: &Path, action: &'static str, e: impl Into<redb::Error>) -> MigrationError {
    MigrationError::Storage {
        path: path.to_path_buf(),
        action,
        source: Box::new(e.into()),
    }
}

#[cfg(test)]
mod tests;
