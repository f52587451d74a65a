//! `meshd restore`: a fresh store from a snapshot file (`meshctl snapshot save`), with the term floor
//! above every epoch the snapshot, the floor file and the snapshot's log have seen (G9). With no
//! floor file and no `--epoch-floor`, nobody knows which epochs were used after the backup: the
//! store is marked floor-unproven and its leader asks the hosts first (decision 0274).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use mesh_raft::SnapshotFile;

use super::config::ReplicaConfig;
use super::floor::{FloorError, clear_unproven, read_floor, write_floor, write_unproven};
use crate::store::app::{DomainSnapshot, MeshApp, decode_snapshot};

/// Largest snapshot file read, in bytes.
pub const snapshot_file_bytes_max: u64 = 1 << 30;
/// Largest `--epoch-floor` taken: far above any real term, far below where terms would overflow.
pub const epoch_floor_max: u64 = 1 << 48;

/// Why a restore did not happen.
#[derive(Debug, thiserror::Error)]
pub enum RestoreError {
    #[error("cannot read the snapshot {file}: {source}")]
    Read {
        file: PathBuf,
        source: std::io::Error,
    },
    #[error(
        "the snapshot {file} is {bytes} bytes, over the limit of {snapshot_file_bytes_max}; is it a snapshot?"
    )]
    TooLarge { file: PathBuf, bytes: u64 },
    #[error("{file} is not a mesh snapshot: {reason}")]
    Malformed { file: PathBuf, reason: String },
    #[error(
        "--epoch-floor {given} is above {epoch_floor_max}; give the highest epoch any host holds, or a number a little above it"
    )]
    FloorTooHigh { given: u64 },
    #[error(transparent)]
    Floor(#[from] FloorError),
    #[error(transparent)]
    Raft(#[from] mesh_raft::RestoreError),
}

/// What a restore did, to be said loudly.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Restored {
    pub replica: u64,
    pub data_dir: PathBuf,
    /// The snapshot's last applied log index.
    pub last_index: Option<u64>,
    /// The epoch floor inside the snapshot.
    pub snapshot_floor: u64,
    /// The next election is above this term.
    pub term_floor: u64,
    /// Neither a floor file nor `--epoch-floor` said which epochs were used after the backup: the
    /// first leader sends nothing until every machine reported the epoch it holds.
    pub unproven: bool,
}

/// Makes a fresh store for `config`'s replica from the snapshot file `from`, with no floor given.
pub async fn restore(config: &ReplicaConfig, from: &Path) -> Result<Restored, RestoreError> {
    restore_with(config, from, None).await
}

/// [`restore`] with the operator's `--epoch-floor`: the highest epoch any host holds (what
/// `status` showed, or the hosts' reports), so the next term goes above it.
pub async fn restore_with(
    config: &ReplicaConfig,
    from: &Path,
    epoch_floor: Option<u64>,
) -> Result<Restored, RestoreError> {
    if let Some(given) = epoch_floor
        && given > epoch_floor_max
    {
        return Err(RestoreError::FloorTooHigh { given });
    }
    let bytes = read_snapshot(from)?;
    let malformed = |reason: String| RestoreError::Malformed {
        file: from.to_path_buf(),
        reason,
    };
    let file = SnapshotFile::decode(&bytes).map_err(|e| malformed(e.to_string()))?;
    let domain: DomainSnapshot =
        decode_snapshot(&file.app).map_err(|e| malformed(e.to_string()))?;
    let snapshot_floor = domain.state.epoch_floor;
    let log_term = file.last_applied.map_or(0, |l| l.leader_id.term);
    let dir = config.data_dir();
    let file_floor = read_floor(dir)?;
    let given = epoch_floor.unwrap_or(0);
    let term_floor = snapshot_floor.max(log_term).max(file_floor).max(given);
    let unproven = file_floor == 0 && epoch_floor.is_none();
    let app = Arc::new(MeshApp::default());
    if dir.join(mesh_raft::store_file_name).exists() {
        // Refused there, before anything beside the store is touched.
        mesh_raft::restore(config.id(), dir, app, &bytes, term_floor).await?;
        return Err(RestoreError::Malformed {
            file: from.to_path_buf(),
            reason: "the store exists".into(),
        });
    }
    // The marker is written before the store, so no crash leaves a restored store without it.
    if let Some(loose) = crate::durable::private_dir(dir).map_err(FloorError::from)? {
        tracing::warn!(dir = %loose.dir.display(), "{loose}");
    }
    if unproven {
        write_unproven(dir, term_floor)?;
    } else {
        clear_unproven(dir)?;
    }
    let restored = match mesh_raft::restore(config.id(), dir, app, &bytes, term_floor).await {
        Ok(restored) => restored,
        Err(e) => {
            if unproven && let Err(c) = clear_unproven(dir) {
                tracing::warn!(error = %c, "the floor-unproven marker of a restore that failed could not be removed");
            }
            return Err(e.into());
        }
    };
    write_floor(dir, term_floor)?;
    let last_index = restored.last_applied.map(|l| l.index);
    tracing::warn!(
        replica = config.id(),
        data_dir = %dir.display(),
        last_index,
        snapshot_floor,
        term_floor,
        "STORE RESTORED from {}: state as of the snapshot, everything after it is gone; the next term will be above {term_floor}",
        from.display()
    );
    if unproven {
        tracing::warn!(
            replica = config.id(),
            term_floor,
            "FLOOR UNPROVEN: no epoch-floor file in {} and no --epoch-floor, so the epochs used after the backup are unknown; the first leader sends nothing until every machine of the model reported the epoch it holds (a machine that never reports holds every push: start its host or remove it from the model). Give --epoch-floor N (the highest epoch any host holds) to start without waiting",
            dir.display()
        );
    }
    Ok(Restored {
        replica: config.id(),
        data_dir: dir.to_path_buf(),
        last_index,
        snapshot_floor,
        term_floor,
        unproven,
    })
}

fn read_snapshot(from: &Path) -> Result<Vec<u8>, RestoreError> {
    let read = |source| RestoreError::Read {
        file: from.to_path_buf(),
        source,
    };
    let len = std::fs::metadata(from).map_err(read)?.len();
    if len > snapshot_file_bytes_max {
        return Err(RestoreError::TooLarge {
            file: from.to_path_buf(),
            bytes: len,
        });
    }
    std::fs::read(from).map_err(read)
}
