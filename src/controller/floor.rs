//! The epoch floor beside the store (G9): `<data_dir>/epoch-floor`, a decimal number rewritten
//! atomically (fsync'd) each time the store's floor rises, so a store that was reset or restored from
//! an old disk is noticed at start and the next term still goes above every epoch ever used.
//!
//! Also `<data_dir>/floor-unproven`: written by a restore that found no floor file and was given
//! no `--epoch-floor`, removed once the cluster proved its term above every epoch a host holds
//! (decision 0274, `controller::unproven`).

use std::path::{Path, PathBuf};

use crate::durable::{StorageError, write_atomic};

/// The file name inside the data directory.
pub const floor_file_name: &str = "epoch-floor";
/// Largest epoch-floor file read, in bytes.
pub const floor_file_bytes_max: u64 = 64;
/// Largest floor-unproven marker read, in bytes.
pub const unproven_file_bytes_max: u64 = 4096;

/// The name of the marker a restore without a floor leaves inside the data directory.
pub const unproven_file_name: &str = "floor-unproven";

/// Why the floor file could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum FloorError {
    #[error("cannot read the epoch floor {file}: {source}")]
    Read {
        file: PathBuf,
        source: std::io::Error,
    },
    #[error(
        "the epoch floor {file} holds `{text}`, not a number; restore it from a backup or write the highest epoch this cluster used"
    )]
    Malformed { file: PathBuf, text: String },
    #[error(transparent)]
    Write(#[from] StorageError),
}

/// The floor file's path in `data_dir`.
pub fn floor_path(data_dir: &Path) -> PathBuf {
    data_dir.join(floor_file_name)
}

/// The floor kept beside the store; 0 when the file does not exist yet.
pub fn read_floor(data_dir: &Path) -> Result<u64, FloorError> {
    use std::io::Read;
    let file = floor_path(data_dir);
    let read_err = |source| FloorError::Read {
        file: file.clone(),
        source,
    };
    let f = match std::fs::File::open(&file) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(0),
        Err(e) => return Err(read_err(e)),
    };
    let mut text = String::new();
    f.take(floor_file_bytes_max)
        .read_to_string(&mut text)
        .map_err(read_err)?;
    text.trim().parse().map_err(|_| FloorError::Malformed {
        file: file.clone(),
        text: text.trim().to_string(),
    })
}

/// The marker's path in `data_dir`.
pub fn unproven_path(data_dir: &Path) -> PathBuf {
    data_dir.join(unproven_file_name)
}

/// The term floor a restore without a floor file set (the marker's first line), or `None` when
/// the floor is not marked unproven.
pub fn read_unproven(data_dir: &Path) -> Result<Option<u64>, FloorError> {
    use std::io::Read;
    let file = unproven_path(data_dir);
    let read_err = |source| FloorError::Read {
        file: file.clone(),
        source,
    };
    let f = match std::fs::File::open(&file) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(read_err(e)),
    };
    let mut text = String::new();
    f.take(unproven_file_bytes_max)
        .read_to_string(&mut text)
        .map_err(read_err)?;
    let first = text.lines().next().map_or("", str::trim);
    first.parse().map(Some).map_err(|_| FloorError::Malformed {
        file: file.clone(),
        text: first.to_string(),
    })
}

/// Marks the floor of the store in `data_dir` unproven: `term_floor` (the restore's) on the first
/// line, then what it means, for whoever finds the file.
pub fn write_unproven(data_dir: &Path, term_floor: u64) -> Result<(), FloorError> {
    let text = format!(
        "{term_floor}\nThis store was restored without its epoch-floor file: its leader sends nothing until every machine of the model reported the epoch it holds (decision 0274). meshd removes this file itself.\n"
    );
    write_atomic(&unproven_path(data_dir), text.as_bytes(), 0o600)?;
    Ok(())
}

/// Removes the marker (durably: the directory is synced after).
pub fn clear_unproven(data_dir: &Path) -> Result<(), FloorError> {
    let path = unproven_path(data_dir);
    crate::durable::remove_if_present(&path)?;
    crate::durable::sync_parent(&path)?;
    Ok(())
}

/// Writes `floor` durably (temp file, fsync, rename, directory fsync).
pub fn write_floor(data_dir: &Path, floor: u64) -> Result<(), FloorError> {
    write_atomic(
        &floor_path(data_dir),
        format!("{floor}\n").as_bytes(),
        0o600,
    )?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn g9_floor_file_round_trips_and_a_missing_one_reads_zero() {
        // G9: the floor beside the store survives restarts; a new directory starts at 0.
        let dir = tempfile::tempdir().expect("tempdir");
        assert_eq!(read_floor(dir.path()).expect("read"), 0);
        write_floor(dir.path(), 42).expect("write");
        assert_eq!(read_floor(dir.path()).expect("read"), 42);
        // Issue 27 part 7: the floor file is 0600 like the store beside it.
        use std::os::unix::fs::PermissionsExt;
        let meta = std::fs::metadata(floor_path(dir.path())).expect("stat");
        assert_eq!(meta.permissions().mode() & 0o777, 0o600);
        std::fs::write(floor_path(dir.path()), "x").expect("garble");
        assert!(matches!(
            read_floor(dir.path()),
            Err(FloorError::Malformed { .. })
        ));
    }

    #[test]
    fn g9_the_unproven_marker_round_trips_and_is_removed_for_good() {
        // G9 (decision 0274): a restore without a floor marks the store, a restart reads the
        // restore's term floor back, and once cleared it stays cleared.
        let dir = tempfile::tempdir().expect("tempdir");
        assert_eq!(read_unproven(dir.path()).expect("read"), None);
        write_unproven(dir.path(), 7).expect("write");
        assert_eq!(read_unproven(dir.path()).expect("read"), Some(7));
        clear_unproven(dir.path()).expect("clear");
        clear_unproven(dir.path()).expect("clear twice");
        assert_eq!(read_unproven(dir.path()).expect("read"), None);
        std::fs::write(unproven_path(dir.path()), "seven\n").expect("garble");
        assert!(matches!(
            read_unproven(dir.path()),
            Err(FloorError::Malformed { .. })
        ));
    }
}
