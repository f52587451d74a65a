//! `meshctl dev` never leaves a process behind and can run twice on one machine (issue 13 part 7):
//! the real binary is started in a session of its own, so every process it starts, however deep,
//! is found by its session id in /proc; a guard SIGKILLs whatever is left of that session when a
//! test ends, passed or failed. Each host of a run serves its `/metrics` on a port of that run
//! and dev prints where (issue 25 item 6).

use std::collections::BTreeSet;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

/// How long a dev run gets to bring its mesh up (3 replicas, 4 hosts, apply, push) on a busy
/// machine.
const up_wait_ms: u64 = 120_000;
/// How long the processes of a killed dev run get to be gone.
const gone_wait_ms: u64 = 15_000;
/// What `meshctl dev` prints once the mesh is up.
const up_line: &str = "Ctrl-C stops every process.";
/// What it prints once its children are started.
const started_line: &str = "started 7 processes";

/// The live (not zombie) processes of session `sid`, with their command lines.
fn session_members(sid: i32) -> Vec<(i32, String)> {
    let mut out = Vec::new();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return out;
    };
    for entry in entries.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<i32>().ok())
        else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        // Fields after the command name: state ppid pgrp session ...
        let Some((_, rest)) = stat.rsplit_once(')') else {
            continue;
        };
        let fields: Vec<&str> = rest.split_whitespace().collect();
        if fields.len() < 4 || fields[0] == "Z" {
            continue;
        }
        if fields[3].parse::<i32>().ok() == Some(sid) {
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
            out.push((pid, cmdline));
        }
    }
    out
}

/// One `meshctl dev` run, leader of its own session. Dropping it SIGKILLs every process left in
/// that session.
struct DevRun {
    child: Child,
    sid: i32,
    dir: PathBuf,
    out: PathBuf,
    _tmp: tempfile::TempDir,
}

impl DevRun {
    fn start() -> DevRun {
        let tmp = tempfile::tempdir().expect("tempdir");
        let dir = tmp.path().join("mesh");
        let out = tmp.path().join("dev.out");
        let file = std::fs::File::create(&out).expect("output file");
        let err = file.try_clone().expect("output file");
        let mut command = Command::new(env!("CARGO_BIN_EXE_meshctl"));
        command
            .arg("dev")
            .arg("--dir")
            .arg(&dir)
            // Under `cargo test` CARGO is set; dev would then run `cargo build` itself.
            .env_remove("CARGO")
            .env_remove("MESH_CONTEXT")
            .stdin(Stdio::null())
            .stdout(file)
            .stderr(err);
        // SAFETY: setsid is one system call, safe between fork and exec.
        unsafe {
            command.pre_exec(|| nix::unistd::setsid().map(|_| ()).map_err(Into::into));
        }
        let child = command.spawn().expect("start meshctl dev");
        let sid = i32::try_from(child.id()).expect("pid");
        DevRun {
            child,
            sid,
            dir,
            out,
            _tmp: tmp,
        }
    }

    fn output(&self) -> String {
        std::fs::read_to_string(&self.out).unwrap_or_default()
    }

    /// Waits until dev printed `line`, failing with what it printed and where its logs are.
    fn wait_for_line(&mut self, line: &str, wait_ms: u64) {
        let deadline = Instant::now() + Duration::from_millis(wait_ms);
        while !self.output().contains(line) {
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!(
                    "meshctl dev exited ({status}) before printing {line:?}:\n{}",
                    self.output()
                );
            }
            assert!(
                Instant::now() < deadline,
                "meshctl dev did not print {line:?} within {wait_ms} ms; it printed:\n{}\nlogs in {}",
                self.output(),
                self.dir.join("logs").display()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn signal(&self, signal: Signal) {
        kill(Pid::from_raw(self.sid), signal).expect("signal meshctl dev");
    }

    /// Waits for meshctl dev itself to exit (reaped, so its own pid leaves the session).
    fn reap(&mut self) {
        let deadline = Instant::now() + Duration::from_millis(gone_wait_ms);
        while self.child.try_wait().ok().flatten().is_none() {
            assert!(Instant::now() < deadline, "meshctl dev did not exit");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Waits until no process of the session is left; the error lists those still running.
    fn wait_until_none_left(&self) -> Result<(), String> {
        let deadline = Instant::now() + Duration::from_millis(gone_wait_ms);
        loop {
            let left = session_members(self.sid);
            if left.is_empty() {
                return Ok(());
            }
            if Instant::now() >= deadline {
                let list: Vec<String> = left.iter().map(|(p, c)| format!("{p}: {c}")).collect();
                return Err(list.join("\n"));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Where dev said each host serves `/metrics` (`host ace's metrics: http://…/metrics`).
    fn host_metrics(&self) -> Vec<(String, std::net::SocketAddr)> {
        let mut out = Vec::new();
        for line in self.output().lines() {
            let Some(rest) = line.strip_prefix("host ") else {
                continue;
            };
            let Some((name, url)) = rest.split_once("'s metrics: http://") else {
                continue;
            };
            let addr = url
                .trim_end_matches("/metrics")
                .parse()
                .expect("an address");
            out.push((name.to_string(), addr));
        }
        out
    }

    /// The module ports of the mesh this run applied (`<dir>/mesh.toml`).
    fn module_ports(&self) -> BTreeSet<u16> {
        let text = std::fs::read_to_string(self.dir.join("mesh.toml")).expect("dev's mesh.toml");
        let mesh = mesh::core::meshfile::parse_mesh("mesh.toml", &text).expect("parses");
        let mut ports = BTreeSet::new();
        for module in mesh.modules.values() {
            for p in &module.provides {
                ports.extend(p.port);
            }
        }
        ports
    }
}

impl Drop for DevRun {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        for (pid, _) in session_members(self.sid) {
            let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
        }
    }
}

fn kill_and_check(run: &mut DevRun, signal: Signal, what: &str) {
    let before = session_members(run.sid);
    run.signal(signal);
    run.reap();
    if let Err(left) = run.wait_until_none_left() {
        panic!(
            "{what}: meshctl dev got {signal} and these processes it started are still running:\n{left}\n(running before: {} processes; dev printed:\n{})",
            before.len(),
            run.output()
        );
    }
}

#[test]
fn dev_killed_one_second_after_it_starts_leaves_no_process() {
    // Issue 13 part 7: SIGKILL runs no handler and no drop; the parent-death signal still takes
    // every replica and host along. SIGTERM at the same moment is handled, not fatal, and stops
    // them too.
    for signal in [Signal::SIGKILL, Signal::SIGTERM] {
        let mut run = DevRun::start();
        let started = Instant::now();
        // Its children must exist when it dies, or the check would prove nothing.
        run.wait_for_line(started_line, 30_000);
        if let Some(rest) = Duration::from_secs(1).checked_sub(started.elapsed()) {
            std::thread::sleep(rest);
        }
        let running = session_members(run.sid).len();
        assert!(
            running > 7,
            "expected meshctl dev and its 7 children, found {running}"
        );
        kill_and_check(&mut run, signal, "one second after the start");
    }
}

#[test]
fn dev_notices_a_child_that_died_stops_the_rest_and_exits_non_zero_naming_it() {
    // Issue 25 item 7: a replica that dies (lost its port to another process, say) is not left
    // out silently while dev says "started 7 processes": dev names it and its log, stops every
    // other process it started and exits non-zero.
    let mut run = DevRun::start();
    run.wait_for_line(up_line, up_wait_ms);
    let replica = session_members(run.sid)
        .into_iter()
        .find(|(_, cmdline)| cmdline.contains("meshd") && cmdline.contains("replica-2"))
        .unwrap_or_else(|| panic!("no replica 2 among dev's processes:\n{}", run.output()));
    kill(Pid::from_raw(replica.0), Signal::SIGKILL).expect("kill replica 2");
    run.reap();
    let status = run.child.try_wait().expect("status").expect("exited");
    let out = run.output();
    assert!(
        !status.success(),
        "dev exited {status} after a child died:\n{out}"
    );
    assert!(
        out.contains("exited") && out.contains("every other process was stopped"),
        "{out}"
    );
    assert!(
        out.contains("replica-2.log"),
        "dev names the dead child's log:\n{out}"
    );
    if let Err(left) = run.wait_until_none_left() {
        panic!("processes left after dev stopped for a dead child:\n{left}\n{out}");
    }
}

#[test]
fn two_dev_runs_use_different_ports_and_a_killed_one_leaves_no_module() {
    // Issue 13 part 7: two dev runs on one machine each get ports of their own for the example's
    // modules (so neither's readiness probes pass against the other's listeners), both come up,
    // and a SIGKILLed dev with modules running leaves none of them.
    let mut first = DevRun::start();
    let mut second = DevRun::start();
    first.wait_for_line(up_line, up_wait_ms);
    second.wait_for_line(up_line, up_wait_ms);
    let (a, b) = (first.module_ports(), second.module_ports());
    assert_eq!(a.len(), 3, "the example provides three ports: {a:?}");
    let shared: Vec<&u16> = a.intersection(&b).collect();
    assert!(shared.is_empty(), "both runs use ports {shared:?}");
    for ports in [&a, &b] {
        assert!(
            ports.iter().all(|p| !(47100..=47199).contains(p)),
            "a run kept the example's fixed ports: {ports:?}"
        );
    }
    for run in [&first, &second] {
        let modules = session_members(run.sid)
            .iter()
            .filter(|(_, c)| c.starts_with("perl") || c.starts_with("sleep"))
            .count();
        assert!(
            modules >= 3,
            "expected the example's modules to run, found {modules}:\n{}",
            run.output()
        );
    }
    // Every host of both runs serves its own /metrics, where dev said.
    let mut served = BTreeSet::new();
    for run in [&first, &second] {
        let hosts = run.host_metrics();
        let names: Vec<&str> = hosts.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, ["ace", "g14", "novox", "shanks"], "{}", run.output());
        for (name, addr) in hosts {
            assert!(served.insert(addr), "{addr} given twice:\n{}", run.output());
            let (code, text) = mesh_beds::http_get(addr, "/metrics", Duration::from_secs(5))
                .unwrap_or_else(|e| panic!("host {name}'s /metrics at {addr}: {e:#}"));
            assert_eq!(code, 200, "{text}");
            assert!(text.contains("mesh_host_build_info"), "{name}: {text}");
        }
    }
    kill_and_check(&mut first, Signal::SIGKILL, "with every module running");
    kill_and_check(&mut second, Signal::SIGKILL, "with every module running");
}

#[test]
fn the_example_rewritten_for_a_run_keeps_everything_but_the_ports() {
    // Issue 13 part 7: every example port (in module args, files, probes and provides) moves,
    // nothing else in the text does.
    use mesh::cli::dev::{example_mesh, example_ports, rewrite_ports};
    let used = example_ports(example_mesh);
    assert_eq!(used, BTreeSet::from([47100, 47101, 47102]));
    let moves = used.iter().map(|p| (*p, p - 47100 + 20000)).collect();
    let text = rewrite_ports(example_mesh, &moves);
    assert!(example_ports(&text).is_empty(), "{text}");
    assert_eq!(
        text.replace("20000", "47100")
            .replace("20001", "47101")
            .replace("20002", "47102"),
        example_mesh
    );
    let mesh = mesh::core::meshfile::parse_mesh("x", &text).expect("still parses");
    let db = &mesh.modules["db"];
    assert_eq!(db.provides[0].port, Some(20001));
    assert!(db.args.iter().any(|a| a.contains("LocalPort => 20001")));
}
