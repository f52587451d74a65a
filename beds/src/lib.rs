//! End-to-end beds: real `meshd` and `mesh-host` processes on loopback, one bed per guarantee.
//! A [`Bed`] writes a mesh with `meshctl init`'s library (free loopback ports, a temp dir per bed),
//! starts every process with a guard that stops its process group on drop (even when the test
//! panics), runs the real `meshctl` with the bed's context, and waits on conditions with deadlines
//! (polling `meshctl status --json`), never on fixed sleeps. [`Bed::start_netns`] runs the same
//! processes each in its own network namespace ([`netns`]), at the addresses `meshctl init
//! --replica` and the mesh file give them.

use anyhow::{Context as _, anyhow, bail};
use nix::sys::signal::Signal;
use serde_json::Value;
use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use mesh::cli::context::{ContextFile, ContextTls};
use mesh::cli::init::{InitArgs, Layout, host_port_default, layout, write};
use mesh::cli::procs::{Guarded, free_ports, free_tcp_ports};
use mesh::core::meshfile::parse_mesh;

pub mod netns;
pub mod trail;

/// How long a bed waits for a condition by default.
pub const wait_ms_default: u64 = 30_000;
/// Pause between two polls of a condition.
pub const poll_ms: u64 = 100;
/// How long a stopped mesh-host gets to stop its modules before its group is killed.
pub const host_grace_ms: u64 = 3_000;

/// The binaries a bed runs; bed tests in the root package fill it with `env!("CARGO_BIN_EXE_…")`.
#[derive(Clone, Debug)]
pub struct Binaries {
    pub meshd: PathBuf,
    pub host: PathBuf,
    pub meshctl: PathBuf,
}

/// The binaries of the root package, from a bed test's `env!` values, each replaced by the
/// file [`binary_env`] names for it when set.
#[macro_export]
macro_rules! binaries {
    () => {
        $crate::Binaries {
            meshd: env!("CARGO_BIN_EXE_meshd").into(),
            host: env!("CARGO_BIN_EXE_mesh-host").into(),
            meshctl: env!("CARGO_BIN_EXE_meshctl").into(),
        }
        .overridden()
    };
}

/// The environment variables that make a bed run another build of a binary (e.g. one built with
/// a guarantee broken by hand and copied out of `target/`, to see a bed fail without leaving the
/// broken source in a shared tree): `(variable, binary)`.
pub const binary_env: [(&str, &str); 3] = [
    ("MESH_BED_MESHD", "meshd"),
    ("MESH_BED_HOST", "mesh-host"),
    ("MESH_BED_MESHCTL", "meshctl"),
];

impl Binaries {
    /// Each binary replaced by the file its [`binary_env`] variable names, when set.
    pub fn overridden(self) -> Binaries {
        let pick = |var: &str, built: PathBuf| {
            std::env::var_os(var).map_or(built, |other| {
                eprintln!(
                    "bed: {var} set, running {}",
                    PathBuf::from(&other).display()
                );
                PathBuf::from(other)
            })
        };
        Binaries {
            meshd: pick(binary_env[0].0, self.meshd),
            host: pick(binary_env[1].0, self.host),
            meshctl: pick(binary_env[2].0, self.meshctl),
        }
    }
}

/// What one `meshctl` run printed and how it ended.
#[derive(Clone, Debug)]
pub struct Run {
    pub stdout: String,
    pub stderr: String,
    pub code: Option<i32>,
}

impl Run {
    /// The stdout as JSON (for `--json` runs).
    pub fn json(&self) -> anyhow::Result<Value> {
        serde_json::from_str(&self.stdout)
            .with_context(|| format!("not JSON: {}; stderr: {}", self.stdout, self.stderr))
    }

    /// Whether the error output is exactly one line.
    pub fn one_line_error(&self) -> bool {
        self.stderr.trim_end().lines().count() == 1
    }
}

/// `ip` and its twin of the other family on the namespace bed's subnets: `10.77.0.K` ↔ `fd77::K`.
fn dual(ip: IpAddr) -> anyhow::Result<Vec<IpAddr>> {
    let k = match ip {
        IpAddr::V4(v4) if v4.octets()[..3] == [10, 77, 0] => u16::from(v4.octets()[3]),
        IpAddr::V6(v6) if v6.segments()[..7] == [0xfd77, 0, 0, 0, 0, 0, 0] => v6.segments()[7],
        _ => bail!("namespace bed address {ip} is outside 10.77.0.0/24 and fd77::/64"),
    };
    let k4 =
        u8::try_from(k).map_err(|_| anyhow!("fd77::{k:x} has no IPv4 twin in 10.77.0.0/24"))?;
    Ok(vec![
        IpAddr::from([10, 77, 0, k4]),
        IpAddr::from([0xfd77, 0, 0, 0, 0, 0, 0, k]),
    ])
}

/// A meshctl started by [`Bed::meshctl_spawn`]: its stdout line by line as it prints them.
pub struct Streaming {
    child: std::process::Child,
    lines: std::sync::mpsc::Receiver<String>,
    /// What meshctl wrote to stderr, read to its end by a thread of its own.
    stderr: Option<std::thread::JoinHandle<String>>,
}

impl Streaming {
    /// The next line meshctl prints, within `wait`; `None` when it printed none in that time (or
    /// closed its stdout).
    pub fn next_line(&self, wait: Duration) -> Option<String> {
        self.lines.recv_timeout(wait).ok()
    }

    /// meshctl's process id (to send it a signal: `status --watch` and `events --follow` end on
    /// SIGINT).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Whether meshctl is still running (it has not answered yet).
    pub fn running(&mut self) -> anyhow::Result<bool> {
        Ok(self.child.try_wait().context("meshctl's status")?.is_none())
    }

    /// Waits (up to `wait`) for meshctl to exit; its exit code and the lines it printed after
    /// those already read.
    pub fn finish(self, wait: Duration) -> anyhow::Result<(Option<i32>, Vec<String>)> {
        let (code, rest, _) = self.finish_with_stderr(wait)?;
        Ok((code, rest))
    }

    /// Like [`Streaming::finish`], also what meshctl wrote to stderr.
    pub fn finish_with_stderr(
        mut self,
        wait: Duration,
    ) -> anyhow::Result<(Option<i32>, Vec<String>, String)> {
        let deadline = std::time::Instant::now() + wait;
        loop {
            if let Some(status) = self.child.try_wait().context("meshctl's status")? {
                // The reader ends at the end of meshctl's output: take everything up to it.
                let mut rest = Vec::new();
                while let Ok(line) = self.lines.recv_timeout(Duration::from_secs(2)) {
                    rest.push(line);
                }
                let stderr = match self.stderr.take() {
                    Some(reader) => reader
                        .join()
                        .map_err(|_| anyhow!("meshctl's stderr reader panicked"))?,
                    None => String::new(),
                };
                return Ok((status.code(), rest, stderr));
            }
            if std::time::Instant::now() >= deadline {
                bail!("meshctl did not exit within {} ms", wait.as_millis());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Streaming {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A running mesh: replicas, machines, their logs, and the context to reach them.
pub struct Bed {
    pub dir: PathBuf,
    pub context: PathBuf,
    pub layout: Layout,
    bins: Binaries,
    replicas: BTreeMap<u64, Guarded>,
    hosts: BTreeMap<String, Guarded>,
    /// Replica id → its status page (`http` in its replica.toml), for a [`Bed::start_with_pages`] bed.
    pages: BTreeMap<u64, SocketAddr>,
    /// Machine → its mesh-host's `/metrics` (`http` in its host.toml), for a
    /// [`Bed::start_with_pages`] bed.
    host_pages: BTreeMap<String, SocketAddr>,
    /// Process (`replica-<id>`, `host-<m>`, `meshctl`) → the command put before it
    /// (`ip netns exec <ns>`); empty on loopback.
    prefix: BTreeMap<String, Vec<String>>,
    // Dropped after the processes and before the directory: namespaces go once nothing runs there.
    fabric: Option<netns::Fabric>,
    // Dropped last: processes stop before their directory goes.
    _tmp: tempfile::TempDir,
}

impl Bed {
    /// Writes a mesh for `machines` with genesis from `mesh_text`, then starts `replicas` meshd
    /// and one mesh-host per machine.
    pub fn start(bins: Binaries, replicas: u64, mesh_text: &str) -> anyhow::Result<Bed> {
        Bed::start_loopback(bins, replicas, mesh_text, false)
    }

    /// Like [`Bed::start`], every replica also serving its status page and `/metrics` on a free
    /// loopback TCP port (`http` in its replica.toml, as `meshctl dev` does), and every mesh-host
    /// its `/metrics` (`http` in its host.toml); see [`Bed::page`] and [`Bed::host_page`].
    pub fn start_with_pages(bins: Binaries, replicas: u64, mesh_text: &str) -> anyhow::Result<Bed> {
        Bed::start_loopback(bins, replicas, mesh_text, true)
    }

    fn start_loopback(
        bins: Binaries,
        replicas: u64,
        mesh_text: &str,
        pages: bool,
    ) -> anyhow::Result<Bed> {
        let mesh = parse_mesh("bed.toml", mesh_text).map_err(|e| anyhow!("bed mesh: {e}"))?;
        let machines: Vec<String> = mesh.machines.keys().cloned().collect();
        let tmp = tempfile::tempdir().context("bed temp dir")?;
        let dir = tmp.path().join("mesh");
        let ports = free_ports(replicas as usize + machines.len())?;
        let layout = Layout {
            dir: dir.clone(),
            replicas: (1..=replicas).zip(ports.iter().copied()).collect(),
            machines: machines
                .into_iter()
                .zip(ports[replicas as usize..].iter().copied())
                .collect(),
            mesh: Some(mesh),
            operator: "bed".into(),
        };
        Bed::launch(bins, layout, mesh_text, tmp, None, pages)
    }

    /// Like [`Bed::start`], every process in its own network namespace on one bridge (see
    /// [`netns`]): replica `id` at `replicas`' address on port 7100, each machine at its mesh-file
    /// `address` on port 7200, meshctl at `operator`. The mesh is written by init's own
    /// `--replica` path. Every namespace is dual-stack: a node at `10.77.0.K` also has
    /// `fd77::K` and the other way round, so IPv4 and IPv6 processes reach each other.
    pub fn start_netns(
        bins: Binaries,
        replicas: &[(u64, IpAddr)],
        operator: IpAddr,
        mesh_text: &str,
    ) -> anyhow::Result<Bed> {
        let mesh = parse_mesh("bed.toml", mesh_text).map_err(|e| anyhow!("bed mesh: {e}"))?;
        let tmp = tempfile::tempdir().context("bed temp dir")?;
        let args = InitArgs {
            dir: tmp.path().join("mesh"),
            replicas: replicas.len() as u64,
            replica: replicas
                .iter()
                .map(|(id, ip)| format!("{id}={ip}"))
                .collect(),
            host_port: host_port_default,
            machines: Vec::new(),
            file: None,
            base_port: 7100,
            operator: "bed".into(),
            add_replica: None,
        };
        let layout = layout(&args, Some(mesh))?;
        let mut nodes: Vec<(String, Vec<IpAddr>)> = Vec::new();
        for (id, addr) in &layout.replicas {
            nodes.push((format!("replica-{id}"), dual(addr.ip())?));
        }
        for (name, addr) in &layout.machines {
            nodes.push((format!("host-{name}"), dual(addr.ip())?));
        }
        nodes.push(("meshctl".into(), dual(operator)?));
        let specs: Vec<(&str, Vec<IpAddr>)> =
            nodes.iter().map(|(n, a)| (n.as_str(), a.clone())).collect();
        let fabric = netns::Fabric::create(&specs)?;
        Bed::launch(bins, layout, mesh_text, tmp, Some(fabric), false)
    }

    /// Writes `layout` and starts every process (in the fabric's namespaces when there is one).
    fn launch(
        bins: Binaries,
        layout: Layout,
        mesh_text: &str,
        tmp: tempfile::TempDir,
        fabric: Option<netns::Fabric>,
        pages: bool,
    ) -> anyhow::Result<Bed> {
        let written = write(&layout)?;
        let dir = layout.dir.clone();
        let mut page_addrs = BTreeMap::new();
        let mut host_pages = BTreeMap::new();
        // Picked together, and none a port the mesh's modules provide (a run's example ports were
        // free when picked and nothing listens on them until the modules start).
        let http_ports = if pages {
            let taken: std::collections::BTreeSet<u16> = layout
                .mesh
                .iter()
                .flat_map(|m| m.modules.values())
                .flat_map(|m| m.provides.iter().filter_map(|p| p.port))
                .collect();
            let n = layout.replicas.len() + layout.machines.len();
            let ports: Vec<u16> = free_tcp_ports(n + taken.len())?
                .into_iter()
                .filter(|p| !taken.contains(p))
                .take(n)
                .collect();
            anyhow::ensure!(ports.len() == n, "only {} free TCP ports", ports.len());
            ports
        } else {
            Vec::new()
        };
        if pages {
            let ports = http_ports[..layout.replicas.len()].iter().copied();
            for ((id, _), port) in layout.replicas.iter().zip(ports) {
                let addr = SocketAddr::from(([127, 0, 0, 1], port));
                let file = dir.join(format!("replica-{id}.toml"));
                let text = std::fs::read_to_string(&file).context("read replica config")?;
                // A top-level key goes before the first table.
                std::fs::write(&file, format!("http = \"{addr}\"\n{text}"))
                    .context("write replica config")?;
                page_addrs.insert(*id, addr);
            }
        }
        if pages {
            let ports = http_ports[layout.replicas.len()..].iter().copied();
            for ((name, _), port) in layout.machines.iter().zip(ports) {
                let addr = SocketAddr::from(([127, 0, 0, 1], port));
                let file = dir.join(format!("host-{name}.toml"));
                let text = std::fs::read_to_string(&file).context("read host config")?;
                std::fs::write(&file, format!("http = \"{addr}\"\n{text}"))
                    .context("write host config")?;
                host_pages.insert(name.clone(), addr);
            }
        }
        std::fs::write(dir.join("mesh.toml"), mesh_text).context("write bed mesh")?;
        std::fs::create_dir_all(dir.join("logs")).context("logs dir")?;
        let mut prefix = BTreeMap::new();
        if let Some(fabric) = &fabric {
            let mut names: Vec<String> = vec!["meshctl".into()];
            names.extend(
                layout
                    .replicas
                    .iter()
                    .map(|(id, _)| format!("replica-{id}")),
            );
            names.extend(layout.machines.iter().map(|(m, _)| format!("host-{m}")));
            for name in names {
                prefix.insert(name.clone(), fabric.exec_prefix(&name)?);
            }
        }
        let mut bed = Bed {
            dir,
            context: written.context,
            layout,
            bins,
            replicas: BTreeMap::new(),
            hosts: BTreeMap::new(),
            pages: page_addrs,
            host_pages,
            prefix,
            fabric,
            _tmp: tmp,
        };
        let ids: Vec<u64> = bed.layout.replicas.iter().map(|(id, _)| *id).collect();
        for id in ids {
            bed.start_replica(id)?;
        }
        let names: Vec<String> = bed.layout.machines.iter().map(|(m, _)| m.clone()).collect();
        for m in names {
            bed.start_host(&m)?;
        }
        Ok(bed)
    }

    /// Starts (or restarts) replica `id`.
    pub fn start_replica(&mut self, id: u64) -> anyhow::Result<()> {
        let config = self.dir.join(format!("replica-{id}.toml"));
        let log = self.dir.join("logs").join(format!("replica-{id}.log"));
        let config = config.display().to_string();
        let meshd = self.bins.meshd.clone();
        let child = self.spawn(
            &format!("replica-{id}"),
            &meshd,
            &["--config", &config],
            &log,
            Duration::ZERO,
        )?;
        self.replicas.insert(id, child);
        Ok(())
    }

    /// Starts (or restarts) machine `name`'s mesh-host.
    pub fn start_host(&mut self, name: &str) -> anyhow::Result<()> {
        let config = self.dir.join(format!("host-{name}.toml"));
        let log = self.dir.join("logs").join(format!("host-{name}.log"));
        let config = config.display().to_string();
        let host = self.bins.host.clone();
        let child = self.spawn(
            &format!("host-{name}"),
            &host,
            &["--config", &config],
            &log,
            Duration::from_millis(host_grace_ms),
        )?;
        self.hosts.insert(name.to_string(), child);
        Ok(())
    }

    /// Starts `program args` as process `name`, behind its prefix (its namespace) if it has one.
    fn spawn(
        &self,
        name: &str,
        program: &Path,
        args: &[&str],
        log: &Path,
        grace: Duration,
    ) -> anyhow::Result<Guarded> {
        let child = match self.prefix.get(name).and_then(|p| p.split_first()) {
            None => Guarded::spawn(name, program, args, log, grace)?,
            Some((first, rest)) => {
                let program = program.display().to_string();
                let mut all: Vec<&str> = rest.iter().map(String::as_str).collect();
                all.push(&program);
                all.extend_from_slice(args);
                Guarded::spawn(name, Path::new(first), &all, log, grace)?
            }
        };
        Ok(child)
    }

    /// Replica `id`'s process id while the bed runs it (to read its memory from `/proc`).
    pub fn replica_pid(&self, id: u64) -> Option<u32> {
        self.replicas.get(&id).map(Guarded::pid)
    }

    /// Where replica `id` serves its status page, on a [`Bed::start_with_pages`] bed.
    pub fn page(&self, id: u64) -> Option<SocketAddr> {
        self.pages.get(&id).copied()
    }

    /// Where machine `name`'s mesh-host serves `/metrics`, on a [`Bed::start_with_pages`] bed.
    pub fn host_page(&self, name: &str) -> Option<SocketAddr> {
        self.host_pages.get(name).copied()
    }

    /// The namespaces of a [`Bed::start_netns`] bed (to cut and heal links), `None` on loopback.
    pub fn fabric(&self) -> Option<&netns::Fabric> {
        self.fabric.as_ref()
    }

    /// Stops machine `name`'s mesh-host (SIGTERM, so it stops its modules) and forgets it; a
    /// later [`Bed::start_host`] starts it again on the same state.
    pub fn stop_host(&mut self, name: &str) -> anyhow::Result<()> {
        let mut child = self
            .hosts
            .remove(name)
            .ok_or_else(|| anyhow!("no running host {name} in this bed"))?;
        child.stop();
        Ok(())
    }

    /// Runs meshctl with the bed's context.
    pub fn meshctl(&self, args: &[&str]) -> anyhow::Result<Run> {
        self.meshctl_in(&self.context, args)
    }

    /// Runs meshctl with another context file (one replica only, another certificate).
    pub fn meshctl_in(&self, context: &Path, args: &[&str]) -> anyhow::Result<Run> {
        let mut command = match self.prefix.get("meshctl").and_then(|p| p.split_first()) {
            None => Command::new(&self.bins.meshctl),
            Some((first, rest)) => {
                let mut c = Command::new(first);
                c.args(rest).arg(&self.bins.meshctl);
                c
            }
        };
        let out = command
            .arg("--context")
            .arg(context)
            .args(args)
            .env_remove("MESH_CONTEXT")
            .output()
            .context("run meshctl")?;
        Ok(Run {
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
            code: out.status.code(),
        })
    }

    /// Runs meshctl and fails unless it exits 0.
    pub fn meshctl_ok(&self, args: &[&str]) -> anyhow::Result<Run> {
        let run = self.meshctl(args)?;
        if run.code != Some(0) {
            bail!(
                "meshctl {args:?} exited {:?}: {}{}",
                run.code,
                run.stdout,
                run.stderr
            );
        }
        Ok(run)
    }

    /// `status --json`'s answer, or the error of the attempt.
    pub fn status(&self) -> anyhow::Result<Value> {
        let run = self.meshctl_ok(&["status", "--json"])?;
        let doc = run.json()?;
        if doc["schema"] != "mesh/v1" {
            bail!("status --json is not schema mesh/v1: {doc}");
        }
        Ok(doc["answer"].clone())
    }

    /// Polls `probe` until it gives a value or `wait_ms` passes; the error names `what` and the
    /// last thing the probe said, and points at the logs.
    pub fn wait_for<T>(
        &self,
        what: &str,
        wait_ms: u64,
        probe: impl FnMut() -> anyhow::Result<Option<T>>,
    ) -> anyhow::Result<T> {
        let within = Duration::from_millis(wait_ms);
        mesh_testkit::wait::poll_blocking(within, Duration::from_millis(poll_ms), probe).map_err(
            |last| {
                anyhow!(
                    "{what}: not within {wait_ms} ms (last: {last}); logs in {}",
                    self.dir.join("logs").display()
                )
            },
        )
    }

    /// Waits until a replica other than `not` says it leads, and returns its id.
    pub fn leader_other_than(&self, not: Option<u64>) -> anyhow::Result<u64> {
        self.wait_for("a leader", wait_ms_default, || {
            let status = self.status()?;
            Ok(status["leader"].as_u64().filter(|l| Some(*l) != not))
        })
    }

    /// Applies the mesh file text (written into the bed dir) with `why`.
    pub fn apply(&self, mesh_text: &str, why: &str) -> anyhow::Result<Run> {
        let file = self.dir.join("apply.toml");
        std::fs::write(&file, mesh_text).context("write mesh to apply")?;
        let file = file.display().to_string();
        self.meshctl_ok(&["apply", "-f", &file, "--why", why])
    }

    /// Sends `signal` to replica `id`'s process group.
    pub fn signal_replica(&self, id: u64, signal: Signal) -> anyhow::Result<()> {
        let child = self
            .replicas
            .get(&id)
            .ok_or_else(|| anyhow!("no replica {id} in this bed"))?;
        child.signal(signal).context("signal replica")?;
        Ok(())
    }

    /// Sends `signal` to machine `name`'s mesh-host (SIGSTOP makes a host that takes an envelope
    /// and never answers; SIGCONT lets it go on).
    pub fn signal_host(&self, name: &str, signal: Signal) -> anyhow::Result<()> {
        let child = self
            .hosts
            .get(name)
            .ok_or_else(|| anyhow!("no running host {name} in this bed"))?;
        child.signal(signal).context("signal host")?;
        Ok(())
    }

    /// Starts meshctl with the bed's context and its stdout piped, for a test that reads its
    /// output while it runs (streamed push lines). The caller waits for it or it is killed on drop.
    pub fn meshctl_spawn(&self, args: &[&str]) -> anyhow::Result<Streaming> {
        self.meshctl_spawn_in(&self.context, args)
    }

    /// [`Bed::meshctl_spawn`] with another context file (one replica only, [`Bed::context_for`]),
    /// in meshctl's namespace on the namespace bed.
    pub fn meshctl_spawn_in(&self, context: &Path, args: &[&str]) -> anyhow::Result<Streaming> {
        let mut command = match self.prefix.get("meshctl").and_then(|p| p.split_first()) {
            None => Command::new(&self.bins.meshctl),
            Some((first, rest)) => {
                let mut c = Command::new(first);
                c.args(rest).arg(&self.bins.meshctl);
                c
            }
        };
        let mut child = command
            .arg("--context")
            .arg(context)
            .args(args)
            .env_remove("MESH_CONTEXT")
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .context("start meshctl")?;
        let stdout = child
            .stdout
            .take()
            .ok_or_else(|| anyhow!("meshctl's stdout was not piped"))?;
        let stderr = child
            .stderr
            .take()
            .ok_or_else(|| anyhow!("meshctl's stderr was not piped"))?;
        let (tx, lines) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            use std::io::BufRead;
            for line in std::io::BufReader::new(stdout).lines() {
                let Ok(line) = line else { return };
                if tx.send(line).is_err() {
                    return;
                }
            }
        });
        let stderr = std::thread::spawn(move || {
            use std::io::Read;
            let mut text = String::new();
            // Bounded by meshctl's own output: it exits or is killed on drop.
            let _ = std::io::BufReader::new(stderr)
                .take(1 << 20)
                .read_to_string(&mut text);
            text
        });
        Ok(Streaming {
            child,
            lines,
            stderr: Some(stderr),
        })
    }

    /// SIGKILLs replica `id` and forgets it, in the bed and in its context (a dead replica first in
    /// the context would cost every later poll a dial timeout).
    pub fn kill_replica(&mut self, id: u64) -> anyhow::Result<()> {
        self.signal_replica(id, Signal::SIGKILL)?;
        self.replicas.remove(&id);
        self.write_context_without(Some(id))
    }

    /// Sends replica `id` SIGTERM (a leader hands its leadership over first, decision 0152) and
    /// leaves it out of the bed's context; [`Bed::reap_replica`] waits for it to exit.
    pub fn terminate_replica(&self, id: u64) -> anyhow::Result<()> {
        self.signal_replica(id, Signal::SIGTERM)?;
        self.write_context_without(Some(id))
    }

    /// Waits up to `wait_ms` until replica `id`, sent SIGTERM by [`Bed::terminate_replica`], has
    /// exited, and forgets it as [`Bed::kill_replica`] does; its exit status.
    pub fn reap_replica(
        &mut self,
        id: u64,
        wait_ms: u64,
    ) -> anyhow::Result<std::process::ExitStatus> {
        let child = self
            .replicas
            .get_mut(&id)
            .ok_or_else(|| anyhow!("no replica {id} in this bed"))?;
        let status = mesh_testkit::wait::poll_blocking(
            Duration::from_millis(wait_ms),
            Duration::from_millis(poll_ms),
            || Ok::<_, String>(child.exited()),
        )
        .map_err(|e| anyhow!("replica {id} did not exit within {wait_ms} ms of SIGTERM: {e}"))?;
        self.replicas.remove(&id);
        self.write_context_without(Some(id))?;
        Ok(status)
    }

    /// Starts replica `id` again after [`Bed::kill_replica`] (on the same store) and puts it back
    /// in the bed's context.
    pub fn restart_replica(&mut self, id: u64) -> anyhow::Result<()> {
        self.start_replica(id)?;
        self.write_context_without(None)
    }

    /// SIGSTOPs replica `id` and leaves it out of the bed's context until [`Bed::resume_replica`].
    pub fn pause_replica(&self, id: u64) -> anyhow::Result<()> {
        self.signal_replica(id, Signal::SIGSTOP)?;
        self.write_context_without(Some(id))
    }

    /// SIGCONTs replica `id` and puts every live replica back in the bed's context.
    pub fn resume_replica(&self, id: u64) -> anyhow::Result<()> {
        self.signal_replica(id, Signal::SIGCONT)?;
        self.write_context_without(None)
    }

    /// Takes replica `id`'s link down (a partition on the namespace bed) and leaves it out of
    /// the bed's context until [`Bed::heal_replica`].
    pub fn partition_replica(&self, id: u64) -> anyhow::Result<()> {
        let fabric = self
            .fabric
            .as_ref()
            .ok_or_else(|| anyhow!("not a namespace bed"))?;
        fabric.cut(&format!("replica-{id}"))?;
        self.write_context_without(Some(id))
    }

    /// Brings replica `id`'s link back and every live replica back into the bed's context.
    pub fn heal_replica(&self, id: u64) -> anyhow::Result<()> {
        let fabric = self
            .fabric
            .as_ref()
            .ok_or_else(|| anyhow!("not a namespace bed"))?;
        fabric.heal(&format!("replica-{id}"))?;
        self.write_context_without(None)
    }

    /// Cuts replica `id` off from every other replica, both ways, on the namespace bed; it still
    /// reaches every host and meshctl ([`netns::Fabric::cut_between`]). It is left out of the
    /// bed's context (it would answer `status` with its own stale view) until
    /// [`Bed::heal_replica_from_peers`]; [`Bed::context_for`] still reaches it.
    pub fn cut_replica_from_peers(&self, id: u64) -> anyhow::Result<()> {
        let fabric = self
            .fabric
            .as_ref()
            .ok_or_else(|| anyhow!("not a namespace bed"))?;
        for (other, _) in self.layout.replicas.iter().filter(|(r, _)| *r != id) {
            fabric.cut_between(&format!("replica-{id}"), &format!("replica-{other}"))?;
        }
        self.write_context_without(Some(id))
    }

    /// Removes the cuts of [`Bed::cut_replica_from_peers`] and puts every live replica back in
    /// the bed's context.
    pub fn heal_replica_from_peers(&self, id: u64) -> anyhow::Result<()> {
        let fabric = self
            .fabric
            .as_ref()
            .ok_or_else(|| anyhow!("not a namespace bed"))?;
        for (other, _) in self.layout.replicas.iter().filter(|(r, _)| *r != id) {
            fabric.heal_between(&format!("replica-{id}"), &format!("replica-{other}"))?;
        }
        self.write_context_without(None)
    }

    /// Machine `name`'s mesh-host log so far.
    pub fn host_log(&self, name: &str) -> String {
        std::fs::read_to_string(self.dir.join("logs").join(format!("host-{name}.log")))
            .unwrap_or_default()
    }

    /// A context file with one replica only.
    pub fn context_for(&self, id: u64) -> anyhow::Result<PathBuf> {
        let path = self.dir.join(format!("context-{id}.toml"));
        self.write_context(&path, |r| r == id)?;
        Ok(path)
    }

    fn write_context_without(&self, gone: Option<u64>) -> anyhow::Result<()> {
        let live: Vec<u64> = self.replicas.keys().copied().collect();
        self.write_context(&self.context, |r| Some(r) != gone && live.contains(&r))
    }

    fn write_context(&self, path: &Path, keep: impl Fn(u64) -> bool) -> anyhow::Result<()> {
        let file = ContextFile {
            replicas: self
                .layout
                .replicas
                .iter()
                .filter(|(id, _)| keep(*id))
                .map(|(id, addr)| (id.to_string(), addr.to_string()))
                .collect(),
            tls: ContextTls {
                ca: "ca.pem".into(),
                cert: "operator/cert.pem".into(),
                key: "operator/key.pem".into(),
            },
        };
        let text = toml::to_string(&file).context("render bed context")?;
        std::fs::write(path, text).context("write bed context")
    }

    /// Replica `id`'s log so far.
    pub fn replica_log(&self, id: u64) -> String {
        std::fs::read_to_string(self.dir.join("logs").join(format!("replica-{id}.log")))
            .unwrap_or_default()
    }

    /// The last 15 lines of each of replicas 1..=`replicas`' logs, to carry in a failure: the
    /// logs go with the bed's temp dir.
    pub fn log_tails(&self, replicas: u64) -> String {
        let tails: Vec<String> = (1..=replicas)
            .map(|id| {
                let log = self.replica_log(id);
                let lines: Vec<&str> = log.lines().collect();
                let from = lines.len().saturating_sub(15);
                format!("--- replica {id}:\n{}", lines[from..].join("\n"))
            })
            .collect();
        tails.join("\n")
    }

    /// Machine `name`'s state directory (high-water mark, modules, reports).
    pub fn host_root(&self, name: &str) -> PathBuf {
        self.dir.join(format!("host-{name}")).join("state")
    }

    /// The grants file of `module` on machine `name`.
    pub fn grants_file(&self, name: &str, module: &str) -> PathBuf {
        self.host_root(name)
            .join("modules")
            .join(module)
            .join("grants.toml")
    }

    /// Waits until `status` lists `count` machines and none of them is behind its last send.
    pub fn wait_none_behind(&self, count: usize) -> anyhow::Result<()> {
        self.wait_for("no machine behind", wait_ms_default, || {
            let status = self.status()?;
            let all = status["machines"].as_array().cloned().unwrap_or_default();
            let none_behind = all.len() == count && all.iter().all(|m| m["behind"] == false);
            Ok(none_behind.then_some(()))
        })
    }

    /// Replica `id`'s `log_index` in `status` when it answered and is level with the longest log.
    pub fn level(status: &Value, id: u64) -> Option<u64> {
        let replica = status["replicas"]
            .as_array()?
            .iter()
            .find(|r| r["id"].as_u64() == Some(id))?;
        if replica["reachable"] != true || replica["lag"].as_u64() != Some(0) {
            return None;
        }
        replica["log_index"].as_u64()
    }

    /// Fails when any replica's log shows a panic (openraft's core, say), a hole in its Raft
    /// log or openraft stopping.
    pub fn no_replica_panicked(&self) -> anyhow::Result<()> {
        for id in self.layout.replicas.iter().map(|(id, _)| *id) {
            let log = self.replica_log(id);
            for bad in [
                "panicked",
                "try to get log at index",
                "with nothing between",
                "openraft stopped",
            ] {
                if let Some(at) = log.find(bad) {
                    let from = log[..at].rfind('\n').map_or(0, |n| n + 1);
                    let line = log[from..].lines().next().unwrap_or_default();
                    anyhow::bail!("replica {id} logged {bad:?}: {line}");
                }
            }
        }
        Ok(())
    }

    /// The machine's entry in a `status --json` answer.
    pub fn machine<'a>(status: &'a Value, name: &str) -> Option<&'a Value> {
        status["machines"]
            .as_array()?
            .iter()
            .find(|m| m["name"] == name)
    }

    /// Reads a file under the bed dir, empty when missing.
    pub fn read(&self, path: &Path) -> String {
        std::fs::read_to_string(path).unwrap_or_default()
    }
}

/// `base` (a mesh file) with machines `size-0`, `size-1`… added, each running one module with a
/// file of at most half of `declaration_bytes_max`, until the file's contents add up to `bytes`:
/// a model of about that size whose every declaration is deliverable (issue 23).
pub fn sized_model(base: &str, bytes: usize) -> String {
    let part = mesh::core::validate::declaration_bytes_max / 2;
    let mut text = base.to_string();
    let mut left = bytes;
    let mut i = 0;
    while left > 0 {
        let here = left.min(part);
        text.push_str(&format!(
            "\n[machines.size-{i}]\naddress = \"127.0.0.1\"\n\n[modules.sized-{i}]\nmachine = \"size-{i}\"\ncommand = \"sleep\"\nargs = [\"600\"]\nfiles = {{ \"blob\" = \"{}\" }}\n",
            "x".repeat(here)
        ));
        left -= here;
        i += 1;
    }
    text
}

/// Every sample of a text exposition: `name{labels}` → value.
pub fn metric_samples(text: &str) -> BTreeMap<String, f64> {
    let mut out = BTreeMap::new();
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        if let Some((key, value)) = line.rsplit_once(' ')
            && let Ok(v) = value.parse()
        {
            out.insert(key.to_string(), v);
        }
    }
    out
}

/// `GET path` from the HTTP server at `addr` (a status page or `/metrics`), every step within
/// `wait`: the status code and the body.
pub fn http_get(addr: SocketAddr, path: &str, wait: Duration) -> anyhow::Result<(u16, String)> {
    let answer = http_get_accepting(addr, path, None, wait)?;
    Ok((answer.code, answer.body))
}

/// One HTTP answer: status code, `Content-Type` (empty when none) and body.
#[derive(Clone, Debug)]
pub struct HttpAnswer {
    pub code: u16,
    pub content_type: String,
    pub body: String,
}

/// Like [`http_get`], sending `Accept: accept` when given, and keeping the answer's content type.
pub fn http_get_accepting(
    addr: SocketAddr,
    path: &str,
    accept: Option<&str>,
    wait: Duration,
) -> anyhow::Result<HttpAnswer> {
    use std::io::{Read as _, Write as _};
    let mut stream = std::net::TcpStream::connect_timeout(&addr, wait)?;
    stream.set_read_timeout(Some(wait))?;
    stream.set_write_timeout(Some(wait))?;
    let accept = accept.map_or(String::new(), |a| format!("Accept: {a}\r\n"));
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\n{accept}Connection: close\r\n\r\n"
    )?;
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw)?;
    let raw = String::from_utf8(raw)?;
    let (head, body) = raw
        .split_once("\r\n\r\n")
        .ok_or_else(|| anyhow!("no header end in {raw:?}"))?;
    let code = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| anyhow!("no status in {head:?}"))?;
    let content_type = head
        .lines()
        .find_map(|l| {
            let (name, value) = l.split_once(':')?;
            name.eq_ignore_ascii_case("content-type")
                .then(|| value.trim().to_string())
        })
        .unwrap_or_default();
    Ok(HttpAnswer {
        code,
        content_type,
        body: body.to_string(),
    })
}

/// Prometheus' `promtool` (`MESH_PROMTOOL` if set, else the one on the PATH). Required, not
/// optional: without it the exposition format cannot be checked, so a test that needs it fails
/// naming the package; `.ci/run` installs Debian's `prometheus`, which ships it.
pub fn promtool() -> anyhow::Result<PathBuf> {
    if let Some(path) = std::env::var_os("MESH_PROMTOOL") {
        return Ok(PathBuf::from(path));
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    for dir in std::env::split_paths(&path) {
        let candidate = dir.join("promtool");
        if candidate.is_file() {
            return Ok(candidate);
        }
    }
    bail!(
        "promtool is needed to check /metrics and the alert rules and none is on the PATH; install it with `apt-get install --no-install-recommends prometheus` (.ci/run does this in CI) or set MESH_PROMTOOL to its path"
    )
}

/// Runs `promtool args…` with `stdin` on its standard input, within `wait` (killed past it and
/// on a panic); `Ok` with what it printed when it exits 0, `Err` with that when it does not.
pub fn promtool_run(args: &[&str], stdin: &str, wait: Duration) -> anyhow::Result<String> {
    /// Kills the child when dropped before it was reaped.
    struct Reaped(std::process::Child);
    impl Drop for Reaped {
        fn drop(&mut self) {
            if self.0.try_wait().ok().flatten().is_none() {
                let _ = self.0.kill();
                let _ = self.0.wait();
            }
        }
    }
    let dir = tempfile::tempdir().context("promtool temp dir")?;
    let input = dir.path().join("stdin");
    let out = dir.path().join("out");
    std::fs::write(&input, stdin)?;
    let printed = std::fs::File::create(&out)?;
    let child = Command::new(promtool()?)
        .args(args)
        .stdin(std::fs::File::open(&input)?)
        .stdout(printed.try_clone()?)
        .stderr(printed)
        .spawn()
        .context("start promtool")?;
    let mut child = Reaped(child);
    let deadline = std::time::Instant::now() + wait;
    let status = loop {
        if let Some(status) = child.0.try_wait()? {
            break status;
        }
        anyhow::ensure!(
            std::time::Instant::now() < deadline,
            "promtool {args:?} did not finish within {} ms",
            wait.as_millis()
        );
        std::thread::sleep(Duration::from_millis(poll_ms / 10));
    };
    let printed = std::fs::read_to_string(&out)?;
    anyhow::ensure!(
        status.success(),
        "promtool {args:?} exited {status}:\n{printed}"
    );
    Ok(printed)
}
