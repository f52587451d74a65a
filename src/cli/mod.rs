//! meshctl: argument parsing and rendering only; every decision is made in `core` or by a replica.
//! `Cli` is the whole command line; each subcommand lives in its own file with its logic (which
//! calls `core`) kept apart from its rendering.

pub mod check;

use clap::{Parser, Subcommand};

use crate::core::meshfile::MeshFileError;
use crate::core::plan::PlanError;

/// The operator command line of mesh.
#[derive(Debug, Parser)]
#[command(
    name = "meshctl",
    version,
    about = "Operate a mesh: check, plan and push declarations"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Validate a mesh file and compose every machine (the merge gate); with `--against`, show
    /// which machines' declarations a change would alter.
    Check(check::CheckArgs),
}

/// Why a meshctl command failed. Exit code 2 means the input was wrong (a file, an argument);
/// 1 means the command itself failed.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    #[error("cannot read {path}: {source}; check the path and its permissions")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("{0}")]
    BadFile(MeshFileError),
    #[error("{file}: {source}")]
    Plan { file: String, source: PlanError },
}

impl CliError {
    pub fn exit_code(&self) -> u8 {
        match self {
            CliError::Read { .. } | CliError::BadFile(_) => 2,
            CliError::Plan { .. } => 1,
        }
    }
}

/// Runs one command and returns what to print on stdout.
pub fn run(cli: Cli) -> Result<String, CliError> {
    match cli.command {
        Command::Check(args) => check::run(&args),
    }
}
