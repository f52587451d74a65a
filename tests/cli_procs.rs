//! The process guard `meshctl dev` and the beds use: dropping it stops the child's whole process
//! group (grandchildren too), so no process outlives its owner; free ports are distinct.

use std::path::Path;
use std::time::{Duration, Instant};

use mesh::cli::procs::{Guarded, free_ports};

/// Whether a process with this pid is still running (a zombie counts as gone).
fn alive(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => !stat
            .rsplit_once(')')
            .is_some_and(|(_, rest)| rest.trim_start().starts_with('Z')),
        Err(_) => false,
    }
}

fn wait_for_pid(file: &Path) -> i32 {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Some(pid) = std::fs::read_to_string(file)
            .ok()
            .and_then(|t| t.trim().parse().ok())
        {
            return pid;
        }
        assert!(Instant::now() < deadline, "the child never wrote its pid");
        std::thread::sleep(Duration::from_millis(20));
    }
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
        let child = i32::try_from(guard.pid()).expect("pid");
        let grandchild = wait_for_pid(&pid_file);
        assert!(alive(child) && alive(grandchild));
        drop(guard);
        assert!(!alive(child), "child {child} outlived its guard");
        let deadline = Instant::now() + Duration::from_secs(5);
        while alive(grandchild) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
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
