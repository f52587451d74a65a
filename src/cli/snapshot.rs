//! `meshctl snapshot save FILE`: a consistent backup of the store, written 0600 (it holds
//! provision secrets). `meshd restore` takes it.

use std::path::{Path, PathBuf};

use super::{CliError, Output};
use super::{json, render};
use crate::controller::api::{Body, Request};
use crate::durable::{Staged, StorageError, loose_dir};

/// Mode of a snapshot file: it carries secrets.
pub const snapshot_file_mode: u32 = crate::durable::secret_file_mode;

#[derive(Debug, clap::Subcommand)]
pub enum SnapshotCommand {
    /// Write a backup of the store to FILE (mode 0600; refuses to overwrite).
    Save {
        /// Where to write the backup; must not exist yet.
        file: PathBuf,
        /// Print the answer as JSON.
        #[arg(long)]
        json: bool,
    },
}

pub fn run(ctx: Option<&Path>, cmd: &SnapshotCommand) -> Result<Output, CliError> {
    let SnapshotCommand::Save {
        file,
        json: as_json,
    } = cmd;
    if file.exists() {
        return Err(CliError::Usage(format!(
            "{} already exists; snapshots never overwrite, pick a new file name",
            file.display()
        )));
    }
    // Half a backup is no backup: the chunks go to a temp file beside FILE, which appears under
    // its name only once whole and synced; on any error the temp file is removed.
    let (via, total, epoch_floor) = save_chunks(ctx, file)?;
    if *as_json {
        let answer = json::SnapshotJson {
            file: file.display().to_string(),
            bytes: total,
            epoch_floor,
        };
        return json::output(Some(via), answer, super::exit_done);
    }
    Ok(Output::done(format!(
        "wrote {} bytes to {} (epoch floor {epoch_floor})\n{}",
        total,
        file.display(),
        via.note()
    )))
}

/// Most chunks one backup is read in (a 4 TiB store at 4 MiB a chunk).
pub const snapshot_chunks_max: u64 = 1 << 20;

/// Reads the backup chunk by chunk into `file` (0600, written atomically, never overwritten), so
/// no answer outgrows a frame however big the store is. Returns who answered, the size and the
/// floor.
fn save_chunks(ctx: Option<&Path>, file: &Path) -> Result<(render::Via, u64, u64), CliError> {
    save_from(file, |request| render::ask(ctx, request))
}

/// [`save_chunks`] over any source of answers (a replica, or a test's).
fn save_from(
    file: &Path,
    mut ask: impl FnMut(&Request) -> Result<(render::Via, Body), CliError>,
) -> Result<(render::Via, u64, u64), CliError> {
    warn_if_loose(parent_of(file))?;
    let mut out = Staged::create(file, snapshot_file_mode).map_err(storage)?;
    let mut request = Request::SnapshotChunk {
        snapshot: None,
        offset: 0,
    };
    for _ in 0..snapshot_chunks_max {
        let (via, body) = ask(&request)?;
        let Body::SnapshotChunk {
            snapshot,
            total,
            offset,
            bytes,
            epoch_floor,
        } = body
        else {
            return Err(render::unexpected(via, "snapshot save", &body));
        };
        out.write_all(&bytes).map_err(storage)?;
        let next = offset + bytes.len() as u64;
        if next >= total {
            out.commit_new().map_err(storage)?;
            return Ok((via, total, epoch_floor));
        }
        if bytes.is_empty() {
            return Err(CliError::Render(format!(
                "replica {} answered an empty chunk at {offset} of {total} bytes; this is a bug, report it",
                via.replica
            )));
        }
        request = Request::SnapshotChunk {
            snapshot: Some(snapshot),
            offset: next,
        };
    }
    Err(CliError::Render(format!(
        "the backup took more than {snapshot_chunks_max} chunks; this is a bug, report it"
    )))
}

/// Warns (never chmods, decision 0296) when `dir`, where a file holding secrets is written, lets
/// others list it.
pub fn warn_if_loose(dir: &Path) -> Result<(), CliError> {
    if let Some(loose) = loose_dir(dir).map_err(storage)? {
        super::warn(&loose.to_string());
    }
    Ok(())
}

/// The directory `file` is written into (`.` for a bare name).
pub fn parent_of(file: &Path) -> &Path {
    match file.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir,
        _ => Path::new("."),
    }
}

fn storage(e: StorageError) -> CliError {
    CliError::Write {
        path: e.path.display().to_string(),
        source: e.source,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn chunk(total: u64, offset: u64, bytes: &[u8]) -> Result<(render::Via, Body), CliError> {
        let via = render::Via {
            replica: 1,
            forwarded_by: None,
        };
        let body = Body::SnapshotChunk {
            snapshot: 7,
            total,
            offset,
            bytes: bytes.to_vec(),
            epoch_floor: 3,
        };
        Ok((via, body))
    }

    #[test]
    fn a_saved_snapshot_is_0600_and_appears_only_whole() {
        // Issue 27 part 7: a backup carries every minted secret.
        let dir = tempfile::tempdir().expect("tempdir");
        let file = dir.path().join("backup");
        let mut asked = 0;
        save_from(&file, |_| {
            asked += 1;
            match asked {
                1 => chunk(6, 0, b"abc"),
                _ => chunk(6, 3, b"def"),
            }
        })
        .expect("saved");
        assert_eq!(std::fs::read(&file).expect("read"), b"abcdef");
        let mode = std::fs::metadata(&file).expect("stat").permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        // A failure after the first chunk leaves nothing under the name, nor a temp file.
        let torn = dir.path().join("torn");
        let mut asked = 0;
        let failed = save_from(&torn, |_| {
            asked += 1;
            match asked {
                1 => chunk(6, 0, b"abc"),
                _ => Err(CliError::Render("replica gone".into())),
            }
        });
        assert!(failed.is_err());
        let left: Vec<_> = std::fs::read_dir(dir.path())
            .expect("list")
            .map(|e| e.expect("entry").file_name())
            .collect();
        assert_eq!(left, [std::ffi::OsString::from("backup")]);
    }
}
