//! Modules left running by a mesh-host that died without stopping them (SIGKILL, a crash). Each
//! started module's process group is recorded under `<root>/run/<module>` with its leader's start
//! time and the boot id; the next start stops those groups before running anything, so a module
//! never runs twice. A record from another boot, or whose pid now belongs to another process, is
//! only removed: pids are reused, and killing a stranger's group would be worse than a duplicate.

use nix::sys::signal::Signal;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::durable;
use super::supervise::{kill_group, stop_grace_ms};

/// Pause between two checks that a leftover leader has gone.
const leftover_poll_ms: u64 = 20;
/// Most records read from the run directory; more would mean something else writes there.
const records_max: usize = 4096;

/// The run directory under the host's root.
pub fn run_dir(root: &Path) -> PathBuf {
    root.join("run")
}

/// Records that `pid` leads the module's process group. Failure is logged: it only weakens the
/// clean-up after a crash.
pub fn record(path: &Path, pid: u32) {
    let (Some(start), Some(boot)) = (start_time(pid), boot_id()) else {
        tracing::warn!(
            pid,
            "cannot read the module's start time or the boot id; not recorded"
        );
        return;
    };
    let text = format!("{pid} {start} {boot}\n");
    let written = path
        .parent()
        .map(|dir| durable::create_dir(dir, 0o700))
        .unwrap_or(Ok(()))
        .and_then(|()| durable::write_atomic(path, text.as_bytes(), 0o600));
    if let Err(e) = written {
        tracing::warn!(pid, error = %e, "cannot record the module's process group");
    }
}

/// Forgets the record once the group is gone.
pub fn clear(path: &Path) {
    if let Err(e) = durable::remove_if_present(path) {
        tracing::warn!(error = %e, "cannot remove a process group record");
    }
}

/// Stops every recorded group that is still this boot's and still ours, then removes the records.
pub async fn reap(dir: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten().take(records_max) {
        let path = entry.path();
        if let Some(pid) = still_ours(&path) {
            tracing::warn!(pid, record = %path.display(), "stopping a module left running by an earlier mesh-host");
            stop_leftover(pid).await;
        }
        clear(&path);
    }
}

/// The recorded pid, if the record is from this boot and its leader (when alive) is the process
/// that was recorded.
fn still_ours(path: &Path) -> Option<u32> {
    let text = std::fs::read_to_string(path).ok()?;
    let mut words = text.split_whitespace();
    let pid: u32 = words.next()?.parse().ok()?;
    let start: u64 = words.next()?.parse().ok()?;
    let boot = words.next()?;
    if Some(boot.to_string()) != boot_id() {
        return None;
    }
    match start_time(pid) {
        Some(now) if now == start => Some(pid),
        Some(_) => None,
        // The leader is gone; a group with its id can only be the one it led.
        None => group_exists(pid).then_some(pid),
    }
}

async fn stop_leftover(pid: u32) {
    kill_group(pid, Signal::SIGTERM);
    let deadline = Instant::now() + Duration::from_millis(stop_grace_ms);
    while group_exists(pid) && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(leftover_poll_ms)).await;
    }
    kill_group(pid, Signal::SIGKILL);
}

fn group_exists(pgid: u32) -> bool {
    let Ok(raw) = i32::try_from(pgid) else {
        return false;
    };
    raw > 1 && nix::sys::signal::killpg(nix::unistd::Pid::from_raw(raw), None).is_ok()
}

/// Field 22 of `/proc/<pid>/stat`: when the process started, in clock ticks since boot. A zombie
/// counts as gone.
fn start_time(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name may hold spaces and parentheses; the fields after the last `)` do not.
    let rest = stat.rsplit_once(')')?.1;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    if fields.first() == Some(&"Z") {
        return None;
    }
    fields.get(19)?.parse().ok()
}

fn boot_id() -> Option<String> {
    let id = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").ok()?;
    Some(id.trim().to_string())
}
