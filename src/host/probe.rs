//! Readiness checks (G12): a TCP connect, a file that exists in the module's directory, or a command
//! that exits 0; each attempt bounded by its timeout, attempts spaced by a bounded, growing interval.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;
use tokio::sync::watch;

use super::supervise::stopped;
use crate::core::model::Probe;

/// First pause between two attempts.
pub const probe_interval_ms_min: u64 = 50;
/// Longest pause between two attempts: a slow start is noticed within this.
pub const probe_interval_ms_max: u64 = 1_000;
/// Timeout of a connect to a provider's endpoint, per attempt.
pub const endpoint_timeout_ms: u64 = 1_000;

/// What a module waits for before it counts as ready or may start.
#[derive(Clone, Debug)]
pub enum Check {
    /// The module's own probe, run in its directory with its environment.
    Probe {
        probe: Probe,
        dir: PathBuf,
        env: BTreeMap<String, String>,
    },
    /// A provider's `address:port`, for a consumer of a provision.
    Endpoint(String),
}

impl Check {
    /// One attempt; true when it passes.
    pub async fn attempt(&self) -> bool {
        match self {
            Check::Endpoint(addr) => tcp(addr, endpoint_timeout_ms).await,
            Check::Probe { probe, dir, env } => match probe {
                Probe::Tcp { addr, timeout_ms } => tcp(addr, *timeout_ms).await,
                Probe::File { path, .. } => tokio::fs::metadata(dir.join(path)).await.is_ok(),
                Probe::Command {
                    command,
                    args,
                    timeout_ms,
                } => run(command, args, dir, env, *timeout_ms).await,
            },
        }
    }
}

/// Attempts `check` until it passes (true) or `stop` turns true (false).
pub async fn wait_until(check: &Check, stop: &mut watch::Receiver<bool>) -> bool {
    let mut pause = probe_interval_ms_min;
    loop {
        if *stop.borrow() {
            return false;
        }
        tokio::select! {
            passed = check.attempt() => if passed { return true; },
            _ = stopped(stop) => return false,
        }
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_millis(pause)) => {}
            _ = stopped(stop) => return false,
        }
        pause = (pause * 2).min(probe_interval_ms_max);
    }
}

async fn tcp(addr: &str, timeout_ms: u64) -> bool {
    let connect = tokio::net::TcpStream::connect(addr);
    matches!(
        tokio::time::timeout(Duration::from_millis(timeout_ms), connect).await,
        Ok(Ok(_))
    )
}

async fn run(
    command: &str,
    args: &[String],
    dir: &Path,
    env: &BTreeMap<String, String>,
    timeout_ms: u64,
) -> bool {
    let child = tokio::process::Command::new(command)
        .args(args)
        .current_dir(dir)
        .env_clear()
        .envs(env)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .process_group(0)
        .kill_on_drop(true)
        .spawn();
    let Ok(mut child) = child else {
        return false;
    };
    let waited = tokio::time::timeout(Duration::from_millis(timeout_ms), child.wait()).await;
    match waited {
        Ok(Ok(status)) => status.success(),
        _ => {
            if let Some(pid) = child.id() {
                super::supervise::kill_group(pid, nix::sys::signal::Signal::SIGKILL);
            }
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn command(script: &str, timeout_ms: u64) -> Check {
        Check::Probe {
            probe: Probe::Command {
                command: "sh".into(),
                args: vec!["-c".into(), script.into()],
                timeout_ms,
            },
            dir: std::env::temp_dir(),
            env: From::from([("PATH".to_string(), "/usr/bin:/bin".to_string())]),
        }
    }

    #[tokio::test]
    async fn g12_a_command_probe_passes_only_on_exit_zero_within_its_timeout() {
        // G12: readiness by command: exit 0 passes; a failure or an overrun does not.
        assert!(command("exit 0", 5_000).attempt().await);
        assert!(!command("exit 1", 5_000).attempt().await);
        assert!(!command("exec sleep 30", 100).attempt().await);
    }

    #[tokio::test]
    async fn g12_a_tcp_probe_passes_only_when_something_listens() {
        // G12: readiness by TCP connect.
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr").to_string();
        assert!(Check::Endpoint(addr.clone()).attempt().await);
        drop(listener);
        assert!(!Check::Endpoint(addr).attempt().await);
    }
}
