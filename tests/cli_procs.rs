//! The process guard `meshctl dev` and the beds use: dropping it stops the child's whole process
//! group (grandchildren too), so no process outlives its owner; free ports are distinct.

use std::path::Path;
use std::time::Duration;

use mesh::cli::procs::{Guarded, free_ports};
use mesh_testkit::alive;
use mesh_testkit::wait::{poll_blocking, poll_interval, wait_deadline};

/// The pid the child wrote to `file`, once it has.
fn written_pid(file: &Path) -> u32 {
    let read = || {
        Ok::<_, String>(
            std::fs::read_to_string(file)
                .ok()
                .and_then(|t| t.trim().parse().ok()),
        )
    };
    poll_blocking(wait_deadline, poll_interval, read).expect("the child never wrote its pid")
}

#[test]
fn dropping_a_guard_stops_the_child_and_its_grandchildren() {
    // No orphans: `meshctl dev` and the beds stop every process group they started.
    let tmp = tempfile::tempdir().expect("tempdir");
    let pid_file = tmp.path().join("grandchild");
    let script = format!("sleep 600 & echo $! > {}; wait", pid_file.display());
    for grace in [Duration::ZERO, Duration::from_millis(500)] {
        let _ = std::fs::remove_file(&pid_file);
        let guard = Guarded::spawn(
            "sh",
            Path::new("/bin/sh"),
            &["-c", &script],
            &tmp.path().join("log"),
            grace,
        )
        .expect("spawn");
        let child = guard.pid();
        let grandchild = written_pid(&pid_file);
        assert!(alive(child) && alive(grandchild));
        drop(guard);
        assert!(!alive(child), "child {child} outlived its guard");
        let gone = || Ok::<_, String>((!alive(grandchild)).then_some(()));
        let _ = poll_blocking(wait_deadline, poll_interval, gone);
        assert!(
            !alive(grandchild),
            "grandchild {grandchild} outlived the guard"
        );
    }
}

#[test]
fn free_ports_are_distinct_loopback_ports() {
    // Beds bind port 0 through the OS: every address handed out is distinct.
    let ports = free_ports(16).expect("ports");
    let mut seen: Vec<u16> = ports.iter().map(|a| a.port()).collect();
    seen.sort();
    seen.dedup();
    assert_eq!(seen.len(), 16);
    assert!(ports.iter().all(|a| a.ip().is_loopback()));
}
