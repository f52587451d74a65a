//! What the host keeps on disk between restarts: the high-water mark (G2), the last applied
//! declaration, and the refusal counts it reports. A file that exists but cannot be read back is an
//! error that stops the host, never a fresh start: that would reopen the door to replays.

use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

use super::durable::{self, StorageError};
use crate::core::declaration::Declaration;
use crate::core::envelope::{EpochProof, Position};

/// Mode of state files: the applied declaration carries provision secrets.
const state_file_mode: u32 = 0o600;

/// Why the host's state could not be loaded or saved.
#[derive(Debug, thiserror::Error)]
pub enum StateError {
    #[error(transparent)]
    Storage(#[from] StorageError),
    #[error(
        "state file {path} is corrupt ({reason}); restore it from a backup, or remove it only if this host may accept any envelope again"
    )]
    Corrupt { path: PathBuf, reason: String },
    #[error(
        "high-water mark {path} reads back as {read:?} right after writing {wrote}; the disk is not keeping what it is given"
    )]
    MarkReadBack {
        path: PathBuf,
        wrote: Position,
        read: Option<Position>,
    },
}

/// The envelope this host last applied, kept so a restart runs the same thing.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AppliedRecord {
    pub position: Position,
    pub declaration: Declaration,
    /// The envelope's signed header, reported so a controller can check the epoch (G9).
    pub proof: Option<EpochProof>,
}

/// Refusals so far, reported to the controller.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RefusalCounts {
    /// Envelopes refused for not being newer than the high-water mark.
    pub older: u64,
    /// Every refusal, of any kind.
    pub total: u64,
    /// The reason of the latest refusal.
    pub last: Option<String>,
}

/// The host's state files under its root directory.
#[derive(Clone, Debug)]
pub struct StateFiles {
    root: PathBuf,
}

impl StateFiles {
    pub fn new(root: &Path) -> StateFiles {
        StateFiles {
            root: root.to_path_buf(),
        }
    }

    pub fn high_water_path(&self) -> PathBuf {
        self.root.join("high_water")
    }

    fn applied_path(&self) -> PathBuf {
        self.root.join("applied")
    }

    fn refusals_path(&self) -> PathBuf {
        self.root.join("refusals")
    }

    /// The mark, or `None` on a host that never accepted an envelope.
    pub fn load_high_water(&self) -> Result<Option<Position>, StateError> {
        let path = self.high_water_path();
        let Some(bytes) = durable::read_optional(&path)? else {
            return Ok(None);
        };
        parse_mark(&bytes)
            .map(Some)
            .map_err(|reason| StateError::Corrupt { path, reason })
    }

    /// Persists `mark` durably, then reads it back and checks it is what was written.
    pub fn store_high_water(&self, mark: Position) -> Result<(), StateError> {
        let path = self.high_water_path();
        let text = format!("epoch {} sequence {}\n", mark.epoch, mark.sequence);
        durable::write_atomic(&path, text.as_bytes(), state_file_mode)?;
        let read = self.load_high_water()?;
        if read != Some(mark) {
            return Err(StateError::MarkReadBack {
                path,
                wrote: mark,
                read,
            });
        }
        Ok(())
    }

    pub fn load_applied(&self) -> Result<Option<AppliedRecord>, StateError> {
        self.load_encoded(&self.applied_path(), "applied record")
    }

    pub fn store_applied(&self, record: &AppliedRecord) -> Result<(), StateError> {
        self.store_encoded(&self.applied_path(), "applied record", record)
    }

    pub fn load_refusals(&self) -> Result<RefusalCounts, StateError> {
        Ok(self
            .load_encoded(&self.refusals_path(), "refusal counts")?
            // allow(empty-on-error): no file yet is no refusals; errors go up by `?`
            .unwrap_or_default())
    }

    pub fn store_refusals(&self, counts: &RefusalCounts) -> Result<(), StateError> {
        self.store_encoded(&self.refusals_path(), "refusal counts", counts)
    }

    fn load_encoded<T: serde::de::DeserializeOwned>(
        &self,
        path: &Path,
        what: &'static str,
    ) -> Result<Option<T>, StateError> {
        let Some(bytes) = durable::read_optional(path)? else {
            return Ok(None);
        };
        mesh_codec::decode(what, &bytes)
            .map(Some)
            .map_err(|e| StateError::Corrupt {
                path: path.to_path_buf(),
                reason: e.to_string(),
            })
    }

    fn store_encoded<T: Serialize>(
        &self,
        path: &Path,
        what: &'static str,
        value: &T,
    ) -> Result<(), StateError> {
        let bytes = mesh_codec::encode(what, value).map_err(|e| StateError::Corrupt {
            path: path.to_path_buf(),
            reason: e.to_string(),
        })?;
        Ok(durable::write_atomic(path, &bytes, state_file_mode)?)
    }
}

/// Parses `epoch <n> sequence <n>`; anything else is corrupt.
fn parse_mark(bytes: &[u8]) -> Result<Position, String> {
    let text = std::str::from_utf8(bytes).map_err(|_| "not UTF-8".to_string())?;
    let words: Vec<&str> = text.split_whitespace().collect();
    let [epoch_word, epoch, sequence_word, sequence] = words.as_slice() else {
        return Err(format!("expected `epoch <n> sequence <n>`, found {text:?}"));
    };
    if *epoch_word != "epoch" || *sequence_word != "sequence" {
        return Err(format!("expected `epoch <n> sequence <n>`, found {text:?}"));
    }
    let number = |s: &str| {
        s.parse::<u64>()
            .map_err(|_| format!("`{s}` is not a number"))
    };
    Ok(Position {
        epoch: number(epoch)?,
        sequence: number(sequence)?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn g2_mark_round_trips_and_a_corrupt_mark_is_an_error_not_zero() {
        let dir = tempfile::tempdir().expect("tempdir");
        let files = StateFiles::new(dir.path());
        assert_eq!(files.load_high_water().expect("load"), None);
        let mark = Position {
            epoch: 4,
            sequence: 9,
        };
        files.store_high_water(mark).expect("store");
        assert_eq!(files.load_high_water().expect("load"), Some(mark));
        // Issue 27 part 7: the host's state files are 0600.
        use std::os::unix::fs::PermissionsExt;
        let meta = std::fs::metadata(files.high_water_path()).expect("stat");
        assert_eq!(meta.permissions().mode() & 0o777, 0o600);
        std::fs::write(files.high_water_path(), b"epoch 4 seq").expect("corrupt");
        assert!(matches!(
            files.load_high_water(),
            Err(StateError::Corrupt { .. })
        ));
    }
}
