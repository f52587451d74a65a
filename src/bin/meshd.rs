//! `meshd --config replica.toml`: one controller replica (Raft over QUIC, operator API, host reports);
//! `meshd restore --config replica.toml --from FILE`: a fresh store from a snapshot file (G9). Logs
//! go to stderr (`--log-format text|json`, colours only on a terminal); SIGTERM or SIGINT stop
//! serving, shut Raft down and exit 0.

use anyhow::Context;
use clap::{Parser, Subcommand};
use std::path::PathBuf;
use tokio::signal::unix::{SignalKind, signal};

use mesh::controller::config::ReplicaConfig;
use mesh::controller::restore::restore;
use mesh::logging::LogFormat;

#[derive(Parser)]
#[command(name = "meshd", about = "A mesh controller replica")]
struct Args {
    /// Path to replica.toml.
    #[arg(long)]
    config: Option<PathBuf>,
    /// How log lines are written to stderr: `text` for a person (colours only on a terminal) or
    /// `json`, one object per line, for a log collector.
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Text)]
    log_format: LogFormat,
    #[command(subcommand)]
    command: Option<Cmd>,
}

#[derive(Subcommand)]
enum Cmd {
    /// Make a fresh store from a snapshot file (`meshctl snapshot save`); refuses an existing store.
    Restore {
        /// Path to replica.toml.
        #[arg(long)]
        config: PathBuf,
        /// The snapshot file.
        #[arg(long)]
        from: PathBuf,
    },
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    mesh::logging::init(args.log_format);
    match (args.command, args.config) {
        (Some(Cmd::Restore { config, from }), _) => run_restore(config, from).await,
        (None, Some(config)) => run(config).await,
        (None, None) => anyhow::bail!("give --config replica.toml (or `meshd restore --help`)"),
    }
}

async fn run_restore(config: PathBuf, from: PathBuf) -> anyhow::Result<()> {
    let config = ReplicaConfig::load(&config)?;
    let done = restore(&config, &from)
        .await
        .with_context(|| format!("restoring replica {} from {}", config.id(), from.display()))?;
    eprintln!(
        "STORE RESTORED: replica {} in {} from {} (last index {:?}, snapshot epoch floor {}); the next term will be above {}. Restore every replica from the same file before starting them.",
        done.replica,
        done.data_dir.display(),
        from.display(),
        done.last_index,
        done.snapshot_floor,
        done.term_floor
    );
    Ok(())
}

async fn run(config: PathBuf) -> anyhow::Result<()> {
    let config = ReplicaConfig::load(&config)?;
    let mut terminate = signal(SignalKind::terminate()).context("installing SIGTERM handler")?;
    let mut interrupt = signal(SignalKind::interrupt()).context("installing SIGINT handler")?;
    let running = mesh::controller::start(config)
        .await
        .context("starting the replica")?;
    tokio::select! {
        _ = terminate.recv() => tracing::info!("SIGTERM: stopping"),
        _ = interrupt.recv() => tracing::info!("SIGINT: stopping"),
    }
    running.shutdown().await.context("stopping the replica")?;
    Ok(())
}
