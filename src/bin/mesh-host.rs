//! `mesh-host --config host.toml`: one machine's agent. Loads its config and state, resumes the last
//! applied declaration, takes envelopes from replicas over QUIC (mTLS with the `[tls]` identity),
//! files reports with the replicas, and on SIGTERM or SIGINT stops listening and then every module
//! before exiting, so no module outlives it. Logs go to stderr (`--log-format text|json`, colours
//! only on a terminal).

use anyhow::Context;
use clap::Parser;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::mpsc;

use mesh::host::metrics::MetricsServer;
use mesh::host::{Agent, HostConfig, HostError, QuicSink, listener};
use mesh::logging::LogFormat;

/// After a fatal error, how long answers already on their way get before the endpoint closes.
const fatal_answer_grace_ms: u64 = 200;

#[derive(Parser)]
#[command(
    name = "mesh-host",
    version,
    about = "The mesh agent that applies declarations on one machine"
)]
struct Args {
    /// Path to host.toml.
    #[arg(long)]
    config: PathBuf,
    /// How log lines are written to stderr: `text` for a person (colours only on a terminal) or
    /// `json`, one object per line, for a log collector.
    #[arg(long, value_enum, default_value_t = LogFormat::Text)]
    log_format: LogFormat,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    mesh::logging::init(args.log_format);
    let config = HostConfig::load(&args.config)?;
    if config.replicas().is_empty() {
        anyhow::bail!(
            "{}: `replicas` is empty, so reports could never leave this host; list the controller replicas as host:port",
            args.config.display()
        );
    }
    let endpoint = listener::bind(&config)?;
    let sink = QuicSink::new(endpoint.clone(), config.name(), config.replicas().to_vec());
    let agent = Arc::new(Agent::open(config, Arc::new(sink)).context("opening host state")?);
    let mut terminate = signal(SignalKind::terminate()).context("installing SIGTERM handler")?;
    let mut interrupt = signal(SignalKind::interrupt()).context("installing SIGINT handler")?;
    let mut hangup = signal(SignalKind::hangup()).context("installing SIGHUP handler")?;
    let started = agent.start().await;
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let started = match started {
        Ok(_) => agent.genesis().await.map(|_| ()).or_else(|e| {
            if e.is_fatal() {
                return Err(e);
            }
            // A refused genesis is counted and reported; the host carries on and waits for pushes.
            tracing::warn!(error = %e, "genesis not applied");
            Ok(())
        }),
        Err(e) => Err(e),
    };
    let outcome = match started {
        Err(e) => Err(e).context("resuming the last declaration or applying the genesis"),
        Ok(_) => {
            // What the last declaration revoked is refused before any connection is served.
            listener::enforce_deny_list(&endpoint, &agent).await;
            let fatal = listener::serve(&endpoint, Arc::clone(&agent))
                .context("the endpoint was already serving")?;
            tracing::info!(machine = %agent.config().name(), listen = %endpoint.local_addr(),
                "listening for envelopes");
            let metrics = match agent.config().http() {
                Some(addr) => {
                    Some(MetricsServer::start(addr, &agent, Some(endpoint.clone())).await?)
                }
                None => None,
            };
            let reconcile = {
                let agent = Arc::clone(&agent);
                tokio::spawn(async move { agent.reconcile(stop_rx).await })
            };
            let signals = Signals {
                terminate: &mut terminate,
                interrupt: &mut interrupt,
                hangup: &mut hangup,
            };
            let ran = run(signals, &endpoint, agent.config(), reconcile, fatal).await;
            if let Some(metrics) = metrics {
                metrics.stop().await;
            }
            ran
        }
    };
    let _ = stop_tx.send(true);
    if outcome.is_err() {
        // The agent already refuses every envelope; let the answer that says why reach the
        // replica before the connections close under it.
        tokio::time::sleep(Duration::from_millis(fatal_answer_grace_ms)).await;
    }
    // Stop taking envelopes first, so nothing starts a module after the shutdown stopped them.
    endpoint.close().await;
    agent.shutdown().await;
    let listening = listener::listen_path(agent.config().root());
    if let Err(e) = mesh::host::durable::remove_if_present(&listening) {
        tracing::warn!(error = %e, "cannot remove the listen address file; it names a closed port");
    }
    tracing::info!("every module stopped; exiting");
    outcome
}

struct Signals<'a> {
    terminate: &'a mut tokio::signal::unix::Signal,
    interrupt: &'a mut tokio::signal::unix::Signal,
    hangup: &'a mut tokio::signal::unix::Signal,
}

/// Waits for a stopping signal, the end of the reconcile loop, or a fatal error from the
/// listener; SIGHUP reloads the certificate, key and CA set in between (decision 0170).
async fn run(
    signals: Signals<'_>,
    endpoint: &mesh_transport::Endpoint,
    config: &HostConfig,
    mut reconcile: tokio::task::JoinHandle<Result<(), HostError>>,
    mut fatal: mpsc::Receiver<HostError>,
) -> anyhow::Result<()> {
    loop {
        tokio::select! {
            _ = signals.terminate.recv() => { tracing::info!("SIGTERM: stopping every module"); return Ok(()) }
            _ = signals.interrupt.recv() => { tracing::info!("SIGINT: stopping every module"); return Ok(()) }
            _ = signals.hangup.recv() => reload(endpoint, config),
            r = &mut reconcile => return match r {
                Ok(Ok(())) => Ok(()),
                Ok(Err(e)) => Err(e).context("reporting"),
                Err(e) => Err(e).context("the reconcile task ended"),
            },
            Some(e) = fatal.recv() => return Err(e).context("applying an envelope"),
        }
    }
}

/// Reloads this host's certificate, key and CA set; on error it keeps what it had.
fn reload(endpoint: &mesh_transport::Endpoint, config: &HostConfig) {
    let Some(tls) = config.tls() else {
        tracing::error!("SIGHUP: host.toml has no [tls], so there is nothing to reload");
        return;
    };
    match endpoint.reload_from_files(&tls.ca, &tls.cert, &tls.key) {
        Ok(closed) => {
            let serial = endpoint
                .certificates()
                .0
                .map(|c| c.serial)
                // allow(empty-on-error): a loaded certificate always has a serial; the log only
                .unwrap_or_default();
            tracing::info!(%serial, cas = endpoint.trusted_cas(), closed, "SIGHUP: certificates reloaded");
        }
        Err(e) => {
            tracing::error!(error = %e, "SIGHUP: certificates not reloaded, still using the ones it had")
        }
    }
}
