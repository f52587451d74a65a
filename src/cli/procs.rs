//! Child processes that cannot outlive their owner: each runs in its own process group, and the
//! guard stops the whole group on drop (SIGTERM, a bounded wait, then SIGKILL), even on a panic.
//! [`Guarded::spawn_tied`] also asks Linux to signal the child when its parent dies (the
//! parent-death signal), so a SIGKILLed owner, which runs no drop, still takes its children along.
//! Used by `meshctl dev` and by the beds.

use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use std::fs::File;
use std::net::{SocketAddr, TcpListener, UdpSocket};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// How long a stopped child gets to exit after SIGTERM before its group is killed.
pub const stop_grace_ms: u64 = 5_000;
/// How often a stopping guard checks whether the child has exited.
pub const stop_poll_ms: u64 = 20;
/// Most loopback ports handed out by one [`free_ports`] call.
pub const free_ports_max: usize = 256;

/// Why a child could not be started.
#[derive(Debug, thiserror::Error)]
pub enum SpawnError {
    #[error("cannot create log file {path}: {source}")]
    Log {
        path: String,
        source: std::io::Error,
    },
    #[error("cannot start {program}: {source}; is it built (`cargo build --bins`)?")]
    Start {
        program: String,
        source: std::io::Error,
    },
    #[error("cannot find a free loopback port: {0}")]
    Ports(std::io::Error),
}

/// A child in its own process group, stopped with its group when dropped.
#[derive(Debug)]
pub struct Guarded {
    pub name: String,
    pub log: PathBuf,
    child: Child,
    /// How long to wait after SIGTERM; zero kills at once.
    grace: Duration,
}

impl Guarded {
    /// Starts `program args`, stdout and stderr appended to `log`, in a new process group.
    pub fn spawn(
        name: &str,
        program: &Path,
        args: &[&str],
        log: &Path,
        grace: Duration,
    ) -> Result<Guarded, SpawnError> {
        Guarded::start(name, program, args, log, grace, None)
    }

    /// Like [`Guarded::spawn`], and the child gets `death` the moment its parent dies, however it
    /// dies (SIGKILL included). Linux sends it when the *thread* that spawned the child ends, so
    /// call this only from a thread that lives as long as the guard (`meshctl dev` spawns from
    /// its main thread).
    pub fn spawn_tied(
        name: &str,
        program: &Path,
        args: &[&str],
        log: &Path,
        grace: Duration,
        death: Signal,
    ) -> Result<Guarded, SpawnError> {
        Guarded::start(name, program, args, log, grace, Some(death))
    }

    fn start(
        name: &str,
        program: &Path,
        args: &[&str],
        log: &Path,
        grace: Duration,
        death: Option<Signal>,
    ) -> Result<Guarded, SpawnError> {
        let file = File::create(log).map_err(|source| SpawnError::Log {
            path: log.display().to_string(),
            source,
        })?;
        let err_file = file.try_clone().map_err(|source| SpawnError::Log {
            path: log.display().to_string(),
            source,
        })?;
        let mut command = Command::new(program);
        command
            .args(args)
            .stdin(Stdio::null())
            .stdout(file)
            .stderr(err_file)
            .process_group(0);
        if let Some(death) = death {
            tie_to_parent(&mut command, death);
        }
        let child = command.spawn().map_err(|source| SpawnError::Start {
            program: program.display().to_string(),
            source,
        })?;
        Ok(Guarded {
            name: name.to_string(),
            log: log.to_path_buf(),
            child,
            grace,
        })
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Sends `signal` to the child's whole process group.
    pub fn signal(&self, signal: Signal) -> Result<(), nix::Error> {
        killpg(self.group(), signal)
    }

    /// The exit status if the child has exited.
    pub fn exited(&mut self) -> Option<ExitStatus> {
        self.child.try_wait().ok().flatten()
    }

    fn group(&self) -> Pid {
        // A pid always fits in i32 on Linux (pid_max is at most 2^22).
        Pid::from_raw(i32::try_from(self.child.id()).unwrap_or(i32::MAX))
    }

    /// SIGTERM (so mesh-host stops its modules), wait up to the grace, then SIGKILL the group.
    pub fn stop(&mut self) {
        if self.exited().is_none() && !self.grace.is_zero() {
            let _ = self.signal(Signal::SIGCONT);
            let _ = self.signal(Signal::SIGTERM);
            let deadline = Instant::now() + self.grace;
            while Instant::now() < deadline && self.exited().is_none() {
                std::thread::sleep(Duration::from_millis(stop_poll_ms));
            }
        }
        // The group may hold children of the child even after it exited.
        let _ = self.signal(Signal::SIGKILL);
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Sets the child's parent-death signal between fork and exec. If the parent died before the
/// child got there, the signal would never come: the child then refuses to start.
fn tie_to_parent(command: &mut Command, death: Signal) {
    let parent = nix::unistd::getpid();
    let tie = move || -> std::io::Result<()> {
        nix::sys::prctl::set_pdeathsig(death)?;
        if nix::unistd::getppid() != parent {
            return Err(std::io::Error::from_raw_os_error(nix::libc::ESRCH));
        }
        Ok(())
    };
    // SAFETY: the closure runs in the forked child before exec and makes only two system calls
    // (prctl, getppid); it allocates nothing and takes no lock, as `pre_exec` requires.
    unsafe {
        command.pre_exec(tie);
    }
}

/// Stops every child at once: SIGTERM to each group, one shared grace period, then SIGKILL for
/// whatever is left. Stopping one by one would add their grace periods up.
pub fn stop_all(children: &mut [Guarded]) {
    let grace = children
        .iter()
        .map(|c| c.grace)
        .max()
        .unwrap_or(Duration::ZERO);
    for child in children.iter_mut() {
        if child.exited().is_none() {
            let _ = child.signal(Signal::SIGCONT);
            let _ = child.signal(Signal::SIGTERM);
        }
    }
    let deadline = Instant::now() + grace;
    while Instant::now() < deadline && children.iter_mut().any(|c| c.exited().is_none()) {
        std::thread::sleep(Duration::from_millis(stop_poll_ms));
    }
    for child in children.iter_mut() {
        child.stop();
    }
}

impl Drop for Guarded {
    fn drop(&mut self) {
        self.stop();
    }
}

/// `n` distinct loopback addresses with ports the OS had free just now (bound on UDP port 0,
/// noted, released together so no two are the same).
pub fn free_ports(n: usize) -> Result<Vec<SocketAddr>, SpawnError> {
    let n = n.min(free_ports_max);
    let mut sockets = Vec::with_capacity(n);
    for _ in 0..n {
        let s = UdpSocket::bind(("127.0.0.1", 0)).map_err(SpawnError::Ports)?;
        sockets.push(s);
    }
    let mut out = Vec::with_capacity(n);
    for s in &sockets {
        out.push(s.local_addr().map_err(SpawnError::Ports)?);
    }
    Ok(out)
}

/// `n` distinct loopback TCP ports the OS had free just now (listened on port 0, noted, released
/// together), for services that listen on TCP, as the example mesh's modules do.
pub fn free_tcp_ports(n: usize) -> Result<Vec<u16>, SpawnError> {
    let n = n.min(free_ports_max);
    let mut listeners = Vec::with_capacity(n);
    for _ in 0..n {
        listeners.push(TcpListener::bind(("127.0.0.1", 0)).map_err(SpawnError::Ports)?);
    }
    let mut out = Vec::with_capacity(n);
    for l in &listeners {
        out.push(l.local_addr().map_err(SpawnError::Ports)?.port());
    }
    Ok(out)
}

/// A sibling binary of the running executable (`meshd`, `mesh-host`).
pub fn sibling_binary(name: &str) -> Result<PathBuf, SpawnError> {
    let exe = std::env::current_exe().map_err(|source| SpawnError::Start {
        program: name.to_string(),
        source,
    })?;
    let dir = exe.parent().unwrap_or(Path::new("."));
    Ok(dir.join(name))
}
