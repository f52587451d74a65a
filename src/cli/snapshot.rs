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
    let (via, body) = render::ask(ctx, &Request::SnapshotSave)?;
    let Body::Snapshot { bytes, epoch_floor } = body else {
        return Err(render::unexpected(via, "snapshot save", &body));
    };
    write_private(file, &bytes)?;
    if *as_json {
        let answer = json::SnapshotJson {
            file: file.display().to_string(),
            bytes: bytes.len() as u64,
            epoch_floor,
        };
        return json::output(Some(via), answer, super::exit_done);
    }
    Ok(Output::done(format!(
        "wrote {} bytes to {} (epoch floor {epoch_floor})\n{}",
        bytes.len(),
        file.display(),
        via.note()
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
