//! `mesh-host --config host.toml`: one machine's agent. Loads its config and state, resumes the last
//! applied declaration, reports on its reconcile interval, and on SIGTERM or SIGINT stops every
//! module before exiting, so no module outlives it.

use anyhow::Context;
use clap::Parser;
use std::path::PathBuf;
use std::sync::Arc;
use tokio::signal::unix::{SignalKind, signal};

use mesh::core::report::Report;
use mesh::host::{Agent, HostConfig, ReportSink, SinkError, SinkFuture};

#[derive(Parser)]
#[command(
    name = "mesh-host",
    about = "The mesh agent that applies declarations on one machine"
)]
struct Args {
    /// Path to host.toml.
    #[arg(long)]
    config: PathBuf,
}

/// Until the QUIC transport is wired in, reports have nowhere to go: they wait in the on-disk queue.
struct NoTransport;

impl ReportSink for NoTransport {
    fn deliver<'a>(&'a self, _report: &'a Report) -> SinkFuture<'a> {
        Box::pin(async { Err(SinkError::Unavailable("no transport wired in yet".into())) })
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .init();
    let args = Args::parse();
    let config = HostConfig::load(&args.config)?;
    let agent = Arc::new(Agent::open(config, Arc::new(NoTransport)).context("opening host state")?);
    let mut terminate = signal(SignalKind::terminate()).context("installing SIGTERM handler")?;
    let mut interrupt = signal(SignalKind::interrupt()).context("installing SIGINT handler")?;
    let started = agent.start().await;
    tracing::warn!(listen = %agent.config().listen(), "no listener yet: the transport is not wired in, so no envelope can arrive");
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let reconcile = {
        let agent = Arc::clone(&agent);
        tokio::spawn(async move { agent.reconcile(stop_rx).await })
    };
    let outcome = match started {
        Err(e) => Err(e).context("resuming the last declaration"),
        Ok(_) => tokio::select! {
            _ = terminate.recv() => { tracing::info!("SIGTERM: stopping every module"); Ok(()) }
            _ = interrupt.recv() => { tracing::info!("SIGINT: stopping every module"); Ok(()) }
            r = reconcile => match r {
                Ok(Ok(())) => Ok(()),
                Ok(Err(e)) => Err(e).context("reporting"),
                Err(e) => Err(e).context("the reconcile task ended"),
            },
        },
    };
    let _ = stop_tx.send(true);
    agent.shutdown().await;
    tracing::info!("every module stopped; exiting");
    outcome
}
