//! Processes a test starts never outlive it: guards that stop them on drop, even when the test
//! panics, and a check of whether a pid still runs.

use std::process::{Child, ExitStatus};
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill, killpg};
use nix::unistd::Pid;

use crate::wait::{poll_interval, wait_value};

/// How long a guarded child gets to exit after SIGTERM before it is killed.
pub const stop_grace: Duration = Duration::from_secs(20);

/// True while a process with `pid` exists (a zombie counts as gone).
pub fn alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(text) => !text
            .rsplit(')')
            .next()
            .is_some_and(|rest| rest.trim_start().starts_with('Z')),
        Err(_) => false,
    }
}

/// SIGKILLs the listed process groups on drop, whatever the test did.
pub struct GroupGuard(pub Vec<u32>);

impl Drop for GroupGuard {
    fn drop(&mut self) {
        for pid in &self.0 {
            let _ = killpg(Pid::from_raw(*pid as i32), Signal::SIGKILL);
        }
    }
}

/// A child process (a `meshd` or `mesh-host` under test). On drop it gets SIGTERM (so it stops
/// what it started) and, if it has not exited within [`stop_grace`], SIGKILL.
pub struct ChildGuard(pub Child);

impl ChildGuard {
    /// The child's pid.
    pub fn pid(&self) -> Pid {
        Pid::from_raw(self.0.id() as i32)
    }

    /// The exit status if the child has exited; panics if it cannot be asked.
    pub fn try_exited(&mut self) -> Option<ExitStatus> {
        self.0.try_wait().expect("ask whether the child exited")
    }

    /// Waits for the child to exit on its own; panics after [`crate::wait_deadline`].
    pub async fn exited(&mut self) -> ExitStatus {
        wait_value("the child process to exit", || {
            std::future::ready(self.try_exited())
        })
        .await
    }
}

impl Drop for ChildGuard {
    fn drop(&mut self) {
        if let Ok(Some(_)) = self.0.try_wait() {
            return;
        }
        let _ = kill(self.pid(), Signal::SIGTERM);
        let deadline = Instant::now() + stop_grace;
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.0.try_wait() {
                return;
            }
            std::thread::sleep(poll_interval);
        }
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}
