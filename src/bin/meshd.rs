//! `meshd --config replica.toml`: one controller replica (Raft over QUIC, operator API, host reports);
//! `meshd restore --config replica.toml --from FILE`: a fresh store from a snapshot file (G9);
//! `meshd recover --config replica.toml [--force-new-cluster]`: a survivor of quorum loss made a
//! one-member cluster (decision 0235). Logs
//! go to stderr (`--log-format text|json`, colours only on a terminal); SIGTERM or SIGINT hand a
//! leader's leadership to an up-to-date follower (decision 0152), stop serving, shut Raft down and
//! exit 0.
//!
//! Before it starts, meshd asks every peer's Raft timings and refuses to start when one that
//! answers runs other ones (decision 0150); a peer that does not answer within
//! [`peer_timings_probe_ms`] does not hold the start.

use anyhow::Context;

/// meshd's allocator (decision 0184): jemalloc gives freed memory back to the kernel, where glibc
/// kept most of a large apply's garbage as RSS.
#[global_allocator]
static allocator: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;
/// jemalloc's settings, read at its start: a background thread returns freed pages after a second
/// instead of at the next allocation (decision 0184). A thin pointer to a NUL-terminated string,
/// as jemalloc's `malloc_conf` is a `const char *`.
// SAFETY: jemalloc reads this symbol once, as a C string; it is NUL-terminated and immutable.
#[unsafe(export_name = "_rjem_malloc_conf")]
static malloc_conf: &[u8; 60] = b"background_thread:true,dirty_decay_ms:1000,muzzy_decay_ms:0\0";
use clap::{Parser, Subcommand};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use tokio::signal::unix::{SignalKind, signal};

use mesh::controller::config::ReplicaConfig;
use mesh::controller::restore::restore_with;
use mesh::logging::LogFormat;

/// How long meshd waits for each peer's answer about its Raft timings before starting.
const peer_timings_probe_ms: u64 = 1_000;

#[derive(Parser)]
#[command(name = "meshd", version, about = "A mesh controller replica")]
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
        /// The highest epoch any host holds (what the hosts report), when the epoch-floor files
        /// are lost; without it and without a floor file the first leader waits for every
        /// machine's report before sending (decision 0274).
        #[arg(long)]
        epoch_floor: Option<u64>,
    },
    /// After losing a quorum of replicas: make this stopped, surviving replica a one-member
    /// cluster with its data, its first term above every epoch floor it knows (decision 0235).
    /// Without --force-new-cluster it only says what it would do and changes nothing.
    Recover {
        /// Path to replica.toml.
        #[arg(long)]
        config: PathBuf,
        /// Rewrite the store: the other replicas are no longer members.
        #[arg(long)]
        force_new_cluster: bool,
    },
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    mesh::logging::init(args.log_format);
    match (args.command, args.config) {
        (
            Some(Cmd::Restore {
                config,
                from,
                epoch_floor,
            }),
            _,
        ) => run_restore(config, from, epoch_floor).await,
        (
            Some(Cmd::Recover {
                config,
                force_new_cluster,
            }),
            _,
        ) => run_recover(config, force_new_cluster).await,
        (None, Some(config)) => run(config).await,
        (None, None) => anyhow::bail!("give --config replica.toml (or `meshd restore --help`)"),
    }
}

async fn run_restore(
    config: PathBuf,
    from: PathBuf,
    epoch_floor: Option<u64>,
) -> anyhow::Result<()> {
    let config = ReplicaConfig::load(&config)?;
    let done = restore_with(&config, &from, epoch_floor)
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
    if done.unproven {
        eprintln!(
            "FLOOR UNPROVEN: no epoch-floor file and no --epoch-floor, so the epochs used after the backup are unknown. The first leader sends nothing until every machine of the model reported the epoch it holds; `push` shows the others as held. To start sending at once, restore again with --epoch-floor N (N = the highest epoch any host holds)."
        );
    }
    Ok(())
}

async fn run_recover(config: PathBuf, force: bool) -> anyhow::Result<()> {
    let config = ReplicaConfig::load(&config)?;
    let done = mesh::controller::recover::recover(&config, force)
        .await
        .with_context(|| {
            format!(
                "recovering replica {} (its store was not changed)",
                config.id()
            )
        })?;
    println!("{}", done.line());
    if done.done {
        println!(
            "Start meshd on it now; it leads alone in term {}. Never start the other replicas on their old stores: move them aside, then add the replicas back (docs/operator-guide.md, \"Recovering from quorum loss\").",
            done.first_term()
        );
    } else {
        println!(
            "Nothing was changed. Run it on every survivor and keep the one with the highest last index; give --force-new-cluster (with meshd stopped) to recover it."
        );
    }
    Ok(())
}

async fn run(config: PathBuf) -> anyhow::Result<()> {
    let config = ReplicaConfig::load(&config)?;
    let mut terminate = signal(SignalKind::terminate()).context("installing SIGTERM handler")?;
    let mut interrupt = signal(SignalKind::interrupt()).context("installing SIGINT handler")?;
    let mut hangup = signal(SignalKind::hangup()).context("installing SIGHUP handler")?;
    let endpoint = mesh::controller::bind(&config).context("starting the replica")?;
    let timings = config.raft().timings();
    let wait = Duration::from_millis(peer_timings_probe_ms);
    match mesh_raft::check_peer_timings(&endpoint, &timings, config.peers(), wait).await {
        Ok(checked) => tracing::info!(
            replica = config.id(),
            same = ?checked.same,
            silent = ?checked.silent.iter().map(|(id, _)| id).collect::<Vec<_>>(),
            "raft timings agree with every peer that answered"
        ),
        Err(differ) => {
            endpoint.close().await;
            anyhow::bail!(
                "replica {} refuses to start (nothing was changed): {differ}",
                config.id()
            );
        }
    }
    let clock = mesh_raft::BootClock::new().ok_or(mesh::controller::ServiceError::Clock)?;
    let running = mesh::controller::start_on(config, endpoint, Arc::new(clock))
        .await
        .context("starting the replica")?;
    let mut fatal = None;
    loop {
        tokio::select! {
            reason = running.failed() => { fatal = Some(reason); break }
            _ = terminate.recv() => { tracing::info!("SIGTERM: stopping"); break }
            _ = interrupt.recv() => { tracing::info!("SIGINT: stopping"); break }
            // Reload the certificate, key and CA set (decision 0170); a failure is logged and
            // the replica keeps what it had.
            _ = hangup.recv() => {
                tracing::info!("SIGHUP: reloading certificates");
                let _ = running.service().reload_certs();
            }
        }
    }
    let stopped = running.shutdown().await;
    if let Some(reason) = fatal {
        // Stopped after a fatal error: exit non-zero whatever the shutdown said, so a service
        // manager sees the failure and an operator finds the reason in the last lines.
        if let Err(e) = &stopped {
            tracing::error!(error = %e, "stopping after the fatal error also failed");
        }
        anyhow::bail!("replica stopped on a fatal error: {reason}");
    }
    match stopped.context("stopping the replica")? {
        Some(done) => tracing::info!("stopped: leadership {done}"),
        None => tracing::info!("stopped"),
    }
    Ok(())
}
