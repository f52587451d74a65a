//! One supervised module: waits for its dependencies (G12), starts its command in its own process
//! group, captures its output, marks it ready when its probe passes, restarts it with bounded
//! exponential backoff, and stops the whole group with SIGTERM, then SIGKILL after a grace period.

use nix::sys::signal::Signal;
use std::collections::BTreeMap;
use std::os::unix::process::ExitStatusExt;
use std::path::PathBuf;
use std::process::{ExitStatus, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tracing::Instrument;

use super::board::{Board, is_ready};
use super::drift::{self, Fingerprint};
use super::leftovers;
use super::logs;
use super::probe::{self, Check};
use crate::core::report::{Exit, ModuleState};

/// First pause before a restart.
pub const restart_backoff_ms_min: u64 = 200;
/// Longest pause before a restart.
pub const restart_backoff_ms_max: u64 = 10_000;
/// A run at least this long resets the backoff to its minimum.
pub const stable_run_ms: u64 = 10_000;
/// Time a module's group has between SIGTERM and SIGKILL.
pub const stop_grace_ms: u64 = 5_000;
/// Time a killed process has to be reaped before the supervisor gives up waiting on it.
const reap_timeout_ms: u64 = 5_000;
/// How long a module without a readiness probe must stay up before it counts as ready: a command
/// that exits at once (a crash loop) never reads as ready.
pub const ready_without_probe_ms: u64 = 1_000;

/// Everything a supervisor needs to run one module, computed once per declaration.
#[derive(Clone, Debug)]
pub struct Spec {
    pub name: String,
    pub command: String,
    pub args: Vec<String>,
    /// The complete environment; nothing is inherited beyond it.
    pub env: BTreeMap<String, String>,
    pub dir: PathBuf,
    pub stdout_log: PathBuf,
    pub stderr_log: PathBuf,
    /// Where the module's process group is recorded while it runs (see `leftovers`).
    pub group_record: PathBuf,
    /// Modules that must be ready before each start.
    pub after: Vec<String>,
    /// `(provision id, endpoint)` a consumer waits on before each start.
    pub endpoints: Vec<(String, String)>,
    /// The readiness probe; `None` means ready once it stayed up [`ready_without_probe_ms`].
    pub ready: Option<Check>,
}

/// A running supervisor task; [`Supervisor::stop`] ends it and its process group.
#[derive(Debug)]
pub struct Supervisor {
    stop: watch::Sender<bool>,
    task: JoinHandle<()>,
    started: Arc<std::sync::Mutex<Started>>,
}

/// The program this supervisor started (decision 0305): the file its command resolved to, its
/// fingerprint at the first start under this declaration (the apply) and at the latest start.
#[derive(Clone, Debug, Default)]
pub struct Started {
    pub path: Option<PathBuf>,
    pub applied: Option<Fingerprint>,
    pub running: Option<Fingerprint>,
}

enum RunEnd {
    Exited(ExitStatus),
    Stopped,
}

impl Supervisor {
    /// Claims the board entry for `generation` and starts supervising `spec`.
    pub fn start(spec: Spec, board: Board, generation: u64) -> Supervisor {
        board.claim(&spec.name, generation);
        let (stop, stop_rx) = watch::channel(false);
        let span = tracing::info_span!("module", module = %spec.name, generation);
        let started = Arc::new(std::sync::Mutex::new(Started::default()));
        let task = supervise(
            Arc::new(spec),
            board,
            generation,
            stop_rx,
            Arc::clone(&started),
        );
        let task = tokio::spawn(task.instrument(span));
        Supervisor {
            stop,
            task,
            started,
        }
    }

    /// The program it started, as of its latest start.
    pub fn started(&self) -> Started {
        // A panic while holding this lock leaves facts at worst one start old.
        self.started
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// Stops the module (SIGTERM, then SIGKILL after [`stop_grace_ms`]) and waits for the task.
    pub async fn stop(mut self) {
        self.signal_stop();
        let limit = Duration::from_millis(stop_grace_ms + 2 * reap_timeout_ms);
        if tokio::time::timeout(limit, &mut self.task).await.is_err() {
            tracing::error!("a supervisor did not stop in time; aborting it");
            self.task.abort();
        }
    }

    /// Tells the supervisor to stop without waiting: it will not start the module again.
    pub fn signal_stop(&self) {
        let _ = self.stop.send(true);
    }
}

impl Drop for Supervisor {
    fn drop(&mut self) {
        self.signal_stop();
    }
}

async fn supervise(
    spec: Arc<Spec>,
    board: Board,
    generation: u64,
    mut stop: watch::Receiver<bool>,
    program: Arc<std::sync::Mutex<Started>>,
) {
    let name = spec.name.as_str();
    let mut backoff = restart_backoff_ms_min;
    loop {
        if !wait_to_start(&spec, &board, generation, &mut stop).await {
            break;
        }
        let print = fingerprint_program(&spec).await;
        let started = Instant::now();
        let spawned = spawn(&spec);
        if spawned.is_ok() {
            let mut facts = program
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            let (path, print) = print.unzip();
            facts.path = path.or(facts.path.take());
            if facts.applied.is_none() {
                facts.applied = print.clone();
            }
            facts.running = print;
        }
        match spawned {
            Err(error) => {
                tracing::warn!(module = name, %error, "module cannot start");
                board.update(name, generation, |s| {
                    s.state = ModuleState::Failed { error }
                });
            }
            Ok(child) => match run(&spec, &board, generation, child, &mut stop).await {
                RunEnd::Stopped => break,
                RunEnd::Exited(status) => {
                    let error = describe_exit(status);
                    tracing::warn!(module = name, %error, "module exited; restarting after backoff");
                    board.update(name, generation, |s| {
                        s.state = ModuleState::Failed { error };
                        s.pid = None;
                        s.last_exit = exit_of(status);
                    });
                    if started.elapsed() >= Duration::from_millis(stable_run_ms) {
                        backoff = restart_backoff_ms_min;
                    }
                }
            },
        }
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_millis(backoff)) => {}
            _ = stopped(&mut stop) => break,
        }
        backoff = (backoff * 2).min(restart_backoff_ms_max);
        board.restarted(name, generation);
    }
    board.update(name, generation, |s| {
        s.state = ModuleState::Stopped;
        s.pid = None;
    });
}

/// Waits until every `after` module is ready and every consumed endpoint answers; false if told
/// to stop first.
async fn wait_to_start(
    spec: &Spec,
    board: &Board,
    generation: u64,
    stop: &mut watch::Receiver<bool>,
) -> bool {
    let mut rx = board.subscribe();
    loop {
        let waiting = {
            let current = rx.borrow_and_update();
            spec.after
                .iter()
                .find(|dep| !is_ready(&current, dep))
                .cloned()
        };
        let Some(dep) = waiting else { break };
        board.update(&spec.name, generation, |s| {
            s.state = ModuleState::Waiting {
                on: format!("module {dep} to be ready"),
            }
        });
        tokio::select! {
            changed = rx.wait_for(|b| is_ready(b, &dep)) => if changed.is_err() { return false; },
            _ = stopped(stop) => return false,
        }
    }
    for (id, endpoint) in &spec.endpoints {
        board.update(&spec.name, generation, |s| {
            s.state = ModuleState::Waiting {
                on: format!("endpoint {endpoint} of provision {id}"),
            }
        });
        if !probe::wait_until(&Check::Endpoint(endpoint.clone()), stop).await {
            return false;
        }
    }
    !*stop.borrow()
}

/// The file the module's command resolves to and its fingerprint, taken off the async threads
/// (a large program is read whole once); `None` when it cannot be found or read (the start then
/// fails and says why).
async fn fingerprint_program(spec: &Spec) -> Option<(PathBuf, Fingerprint)> {
    let path = drift::resolve_command(
        &spec.command,
        &spec.dir,
        spec.env.get("PATH").map(String::as_str),
    )?;
    let hashed = path.clone();
    let print = tokio::task::spawn_blocking(move || drift::fingerprint(&hashed, None)).await;
    match print {
        Ok(Ok(print)) => Some((path, print)),
        Ok(Err(error)) => {
            tracing::warn!(module = %spec.name, %error, "cannot fingerprint the module's program");
            None
        }
        Err(error) => {
            tracing::warn!(module = %spec.name, %error, "cannot fingerprint the module's program");
            None
        }
    }
}

fn spawn(spec: &Spec) -> Result<tokio::process::Child, String> {
    tokio::process::Command::new(&spec.command)
        .args(&spec.args)
        .current_dir(&spec.dir)
        .env_clear()
        .envs(&spec.env)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| format!("cannot start `{}`: {e}", spec.command))
}

/// Runs one started child until it exits or the supervisor is told to stop.
async fn run(
    spec: &Spec,
    board: &Board,
    generation: u64,
    mut child: tokio::process::Child,
    stop: &mut watch::Receiver<bool>,
) -> RunEnd {
    let name = spec.name.as_str();
    let pid = child.id();
    if let Some(pid) = pid {
        leftovers::record(&spec.group_record, pid);
    }
    if let Some(out) = child.stdout.take() {
        tokio::spawn(logs::capture(name.into(), spec.stdout_log.clone(), out));
    }
    if let Some(err) = child.stderr.take() {
        tokio::spawn(logs::capture(name.into(), spec.stderr_log.clone(), err));
    }
    tracing::info!(module = name, pid, "module started");
    board.update(name, generation, |s| {
        s.state = ModuleState::Running;
        s.pid = pid;
    });
    let mut probe_stop = stop.clone();
    let probe = async {
        match &spec.ready {
            Some(check) => probe::wait_until(check, &mut probe_stop).await,
            None => {
                let up = Duration::from_millis(ready_without_probe_ms);
                tokio::select! {
                    _ = tokio::time::sleep(up) => true,
                    _ = stopped(&mut probe_stop) => false,
                }
            }
        }
    };
    tokio::pin!(probe);
    let mut probing = true;
    loop {
        tokio::select! {
            status = child.wait() => {
                if let Some(pid) = pid {
                    // Whatever the module left behind in its group goes with it.
                    kill_group(pid, Signal::SIGKILL);
                }
                leftovers::clear(&spec.group_record);
                return match status {
                    Ok(status) => RunEnd::Exited(status),
                    Err(e) => {
                        tracing::error!(module = name, error = %e, "cannot wait on module");
                        RunEnd::Exited(ExitStatus::from_raw(-1))
                    }
                };
            }
            _ = stopped(stop) => {
                terminate(name, &mut child, pid).await;
                leftovers::clear(&spec.group_record);
                return RunEnd::Stopped;
            }
            passed = &mut probe, if probing => {
                probing = false;
                if passed {
                    tracing::info!(module = name, "module ready");
                    board.update(name, generation, |s| s.state = ModuleState::Ready);
                }
            }
        }
    }
}

/// SIGTERM to the group, SIGKILL after the grace period, then SIGKILL to anything left in it.
async fn terminate(name: &str, child: &mut tokio::process::Child, pid: Option<u32>) {
    let Some(pid) = pid else {
        let _ = child.start_kill();
        return;
    };
    kill_group(pid, Signal::SIGTERM);
    let grace = Duration::from_millis(stop_grace_ms);
    if tokio::time::timeout(grace, child.wait()).await.is_err() {
        tracing::warn!(
            module = name,
            pid,
            "module ignored SIGTERM; killing its group"
        );
        kill_group(pid, Signal::SIGKILL);
        let reap = Duration::from_millis(reap_timeout_ms);
        if tokio::time::timeout(reap, child.wait()).await.is_err() {
            tracing::error!(module = name, pid, "module survived SIGKILL");
        }
    }
    kill_group(pid, Signal::SIGKILL);
    tracing::info!(module = name, pid, "module stopped");
}

/// Resolves once `stop` turns true, or its sender is gone (nobody can stop it any more).
pub async fn stopped(stop: &mut watch::Receiver<bool>) {
    // The guard `wait_for` returns is not Send; drop it here, not in the caller's select arm.
    let _ = stop.wait_for(|s| *s).await.map(|_| ());
}

/// Sends `signal` to process group `pgid`; a group that is already gone is not an error.
pub fn kill_group(pgid: u32, signal: Signal) {
    let Ok(raw) = i32::try_from(pgid) else {
        return;
    };
    if raw <= 1 {
        return;
    }
    match nix::sys::signal::killpg(nix::unistd::Pid::from_raw(raw), signal) {
        Ok(()) | Err(nix::errno::Errno::ESRCH) => {}
        Err(e) => tracing::warn!(pgid, %signal, error = %e, "cannot signal process group"),
    }
}

fn exit_of(status: ExitStatus) -> Option<Exit> {
    match (status.code(), status.signal()) {
        (Some(code), _) => Some(Exit::Code(code)),
        (None, Some(signal)) => Some(Exit::Signal(signal)),
        (None, None) => None,
    }
}

fn describe_exit(status: ExitStatus) -> String {
    match (status.code(), status.signal()) {
        (Some(code), _) => format!("exited with code {code}"),
        (None, Some(signal)) => format!("killed by signal {signal}"),
        (None, None) => format!("ended: {status}"),
    }
}
