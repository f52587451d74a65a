//! `meshctl snapshot save FILE`: a consistent backup of the store, written 0600 (it holds
//! provision secrets). `meshd restore` takes it.

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use super::{CliError, Output};
use super::{json, render};
use crate::controller::api::{Body, Request};

/// Mode of a snapshot file: it carries secrets.
pub const snapshot_file_mode: u32 = 0o600;

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
    let saved = save_chunks(ctx, file);
    if saved.is_err() {
        // Half a backup is no backup: nothing is left behind under the name.
        let _ = std::fs::remove_file(file);
    }
    let (via, total, epoch_floor) = saved?;
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

/// Reads the backup chunk by chunk into `file` (created 0600, never overwritten), so no answer
/// outgrows a frame however big the store is. Returns who answered, the size and the floor.
fn save_chunks(ctx: Option<&Path>, file: &Path) -> Result<(render::Via, u64, u64), CliError> {
    let err = |source| CliError::Write {
        path: file.display().to_string(),
        source,
    };
    let mut out = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(snapshot_file_mode)
        .open(file)
        .map_err(err)?;
    let mut request = Request::SnapshotChunk {
        snapshot: None,
        offset: 0,
    };
    for _ in 0..snapshot_chunks_max {
        let (via, body) = render::ask(ctx, &request)?;
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
        out.write_all(&bytes).map_err(err)?;
        let next = offset + bytes.len() as u64;
        if next >= total {
            out.sync_all().map_err(err)?;
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

/// Creates `file` (never overwriting) with mode 0600 and writes `bytes` to it.
pub fn write_private(file: &Path, bytes: &[u8]) -> Result<(), CliError> {
    let err = |source| CliError::Write {
        path: file.display().to_string(),
        source,
    };
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(snapshot_file_mode)
        .open(file)
        .map_err(err)?;
    f.write_all(bytes).map_err(err)?;
    f.sync_all().map_err(err)
}
