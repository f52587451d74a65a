//! `meshctl dev`: the embedded default. Writes a mesh into a directory (new temp dir unless
//! `--dir`) with free loopback ports, starts 3 `meshd` and 4 `mesh-host` (the binaries beside this
//! one), applies the embedded `examples/mesh.toml` with its module ports moved to ports free for
//! this run, pushes `--all`, prints the status, where each replica's page and each host's
//! `/metrics` are served, and what to try, and runs until Ctrl-C, SIGTERM or
//! SIGHUP; then it stops every child. No process outlives it: the signal handlers are installed
//! before anything is written or started, and every child carries a parent-death signal, so even
//! a SIGKILLed `dev` takes them along.

use std::collections::{BTreeMap, BTreeSet};
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;
use tokio::signal::unix::{SignalKind, signal};

use super::context::{Context, load};
use super::init::{Layout, write};
use super::procs::{
    Guarded, SpawnError, free_ports, free_tcp_ports, sibling_binary, stop_all, stop_grace_ms,
};
use super::{client, push, status};
use crate::controller::api::{Body, PushTarget, Request};
use crate::core::meshfile::parse_mesh;

/// The example mesh `dev` applies.
pub const example_mesh: &str = include_str!("../../examples/mesh.toml");
/// The machines of the example mesh.
pub const dev_machines: [&str; 4] = ["ace", "g14", "novox", "shanks"];
/// Replicas `dev` starts.
pub const dev_replicas: u64 = 3;
/// How often `dev` checks that every process it started still runs, in milliseconds.
pub const child_check_ms: u64 = 500;
/// How long `dev` waits for the cluster to elect a leader and answer.
pub const leader_wait_ms: u64 = 30_000;
/// Pause between two status polls while waiting.
pub const poll_interval_ms: u64 = 200;
/// Lowest port the example mesh's modules use; each one found in the text gets a free port.
pub const example_port_min: u16 = 47100;
/// Highest port the example mesh's modules use.
pub const example_port_max: u16 = 47199;

#[derive(Debug, clap::Args)]
pub struct DevArgs {
    /// Where to write the mesh (default: a new directory under the system temp dir).
    #[arg(long)]
    pub dir: Option<PathBuf>,
}

/// Why `dev` stopped early.
#[derive(Debug, thiserror::Error)]
pub enum DevError {
    #[error("dev: {0}")]
    Spawn(#[from] SpawnError),
    #[error("dev: the embedded example mesh does not parse: {0}; this is a bug, report it")]
    Example(String),
    #[error("dev: cannot create {path}: {source}")]
    Dir {
        path: String,
        source: std::io::Error,
    },
    #[error("dev: cannot start the async runtime: {0}")]
    Runtime(std::io::Error),
    #[error("dev: cannot install the {which} handler: {source}")]
    Signals {
        which: &'static str,
        source: std::io::Error,
    },
    #[error("dev: {what} did not succeed within {waited_ms} ms: {last}; the logs are in {logs}")]
    Timeout {
        what: &'static str,
        waited_ms: u64,
        last: String,
        logs: String,
    },
    #[error("dev: {0}")]
    Step(String),
    #[error(
        "dev: {name} exited ({status}) while the mesh ran; every other process was stopped. Its log, {log}, says why (a port taken by another process, say); run `meshctl dev` again"
    )]
    ChildDied {
        name: String,
        status: String,
        log: String,
    },
}

pub fn run(args: &DevArgs) -> Result<String, super::CliError> {
    // The runtime exists only so the signal handlers can: from the next line on, SIGTERM, SIGINT
    // and SIGHUP ask `dev` to stop instead of killing it, so it always stops what it started.
    // It is single-threaded, so every child is spawned by this (the main) thread, which lives as
    // long as the process: the parent-death signal fires when the spawning thread ends.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(DevError::Runtime)?;
    runtime.block_on(run_until_stopped(args))
}

async fn run_until_stopped(args: &DevArgs) -> Result<String, super::CliError> {
    let mut stop = Stop::install()?;
    let dir = match &args.dir {
        Some(d) => d.clone(),
        None => fresh_temp_dir()?,
    };
    println!("meshctl dev: writing a mesh into {}", dir.display());
    let (text, moved) = example_for_run()?;
    let mesh =
        parse_mesh("examples/mesh.toml", &text).map_err(|e| DevError::Example(e.to_string()))?;
    let ports = free_ports(dev_replicas as usize + dev_machines.len()).map_err(DevError::from)?;
    let layout = Layout {
        dir: dir.clone(),
        replicas: (1..=dev_replicas).zip(ports.iter().copied()).collect(),
        machines: dev_machines
            .iter()
            .map(|m| m.to_string())
            .zip(ports[dev_replicas as usize..].iter().copied())
            .collect(),
        mesh: Some(mesh.clone()),
        operator: super::init::operator_default.into(),
    };
    let written = write(&layout)?;
    // The replicas' pages and the hosts' /metrics, on TCP ports picked together and none of the
    // example's: those were released when picked and nothing listens on them until the modules
    // start, so a later pick could hand one out again.
    let example_ports: BTreeSet<u16> = moved.values().copied().collect();
    let http = free_tcp_ports_besides(
        layout.replicas.len() + layout.machines.len(),
        &example_ports,
    )?;
    let (page_ports, host_ports) = http.split_at(layout.replicas.len());
    let pages = serve_status_pages(&layout, page_ports)?;
    let host_metrics = serve_host_metrics(&layout, host_ports)?;
    let mesh_file = dir.join("mesh.toml");
    std::fs::write(&mesh_file, &text).map_err(|source| DevError::Dir {
        path: mesh_file.display().to_string(),
        source,
    })?;
    println!(
        "the example's ports for this run: {} (the mesh applied is {})",
        describe_moves(&moved),
        mesh_file.display()
    );
    if let Some(signal) = build_siblings(&mut stop).await? {
        return Ok(format!(
            "{signal} while building; nothing was started; the mesh stays in {}\n",
            dir.display()
        ));
    }
    let mut children = start(&layout)?;
    println!(
        "started {} processes; logs in {}",
        children.len(),
        dir.join("logs").display()
    );
    for (id, addr) in &pages {
        println!("replica {id}'s status page: http://{addr}/ (metrics: http://{addr}/metrics)");
    }
    for (name, addr) in &host_metrics {
        println!("host {name}'s metrics: http://{addr}/metrics");
    }
    let outcome = serve(&mut stop, &mut children, &written.context, &dir, mesh).await;
    println!("stopping {} processes", children.len());
    // Hosts first, while the replicas still take their last reports; then the replicas.
    let split = dev_replicas as usize;
    stop_all(&mut children[split..]);
    stop_all(&mut children[..split]);
    drop(children);
    outcome?;
    Ok(format!("stopped; the mesh stays in {}\n", dir.display()))
}

/// Brings the mesh up, says what to try, and waits for a signal; a signal while it is still
/// coming up ends it at once.
async fn serve(
    stop: &mut Stop,
    children: &mut [Guarded],
    context_file: &Path,
    dir: &Path,
    mesh: crate::core::model::Mesh,
) -> Result<(), super::CliError> {
    let context = load(context_file, "--context")?;
    tokio::select! {
        done = drive(&context, dir, mesh) => done?,
        signal = stop.recv() => {
            println!("{signal} while starting");
            return Ok(());
        }
        died = first_death(children) => return Err(died.into()),
    }
    println!(
        "\ntry, in another shell:\n  export MESH_CONTEXT={}\n  alias meshctl={}\n  meshctl status\n  meshctl plan g14 --diff\n  meshctl settings set module/broker@g14 max_connections=256 --why \"more clients\"\n  meshctl push g14 --why \"raise broker limit\"\n  meshctl history\n  meshctl events --follow    # in a third shell: crashes, silent hosts, pushes as they happen\n\nCtrl-C stops every process.",
        context_file.display(),
        std::env::current_exe()
            .map(|p| p.display().to_string())
            .unwrap_or_else(|_| "meshctl".into())
    );
    tokio::select! {
        signal = stop.recv() => {
            println!("{signal}");
            Ok(())
        }
        died = first_death(children) => Err(died.into()),
    }
}

/// Waits until one of `children` exits, checking every [`child_check_ms`]: a replica that lost
/// its port to another process, say. `dev` then stops the others and says which one and where
/// its log is, instead of serving a mesh that is not all there.
async fn first_death(children: &mut [Guarded]) -> DevError {
    loop {
        for child in children.iter_mut() {
            if let Some(status) = child.exited() {
                return DevError::ChildDied {
                    name: child.name.clone(),
                    status: status.to_string(),
                    log: child.log.display().to_string(),
                };
            }
        }
        tokio::time::sleep(Duration::from_millis(child_check_ms)).await;
    }
}

/// Gives every replica of the layout a status page on one of `ports`: `http` is written at the
/// top of its replica.toml (a top-level key, so before the first table).
fn serve_status_pages(
    layout: &Layout,
    ports: &[u16],
) -> Result<Vec<(u64, std::net::SocketAddr)>, DevError> {
    let mut pages = Vec::new();
    for ((id, _), port) in layout.replicas.iter().zip(ports.iter().copied()) {
        let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
        let file = layout.dir.join(format!("replica-{id}.toml"));
        let failed = |source| DevError::Dir {
            path: file.display().to_string(),
            source,
        };
        let text = std::fs::read_to_string(&file).map_err(failed)?;
        std::fs::write(&file, format!("http = \"{addr}\"\n{text}")).map_err(failed)?;
        pages.push((*id, addr));
    }
    Ok(pages)
}

/// `n` distinct loopback TCP ports free now, none of them in `taken` (ports this run gave out
/// that nothing listens on yet).
fn free_tcp_ports_besides(n: usize, taken: &BTreeSet<u16>) -> Result<Vec<u16>, DevError> {
    // Picked together, so distinct; at most `taken.len()` of them are left out.
    let picked = free_tcp_ports(n + taken.len())?;
    let ports: Vec<u16> = picked
        .into_iter()
        .filter(|p| !taken.contains(p))
        .take(n)
        .collect();
    if ports.len() < n {
        return Err(DevError::Step(format!(
            "only {} free loopback TCP ports for the pages and metrics, {n} needed",
            ports.len()
        )));
    }
    Ok(ports)
}

/// Gives every host of the layout its `/metrics` on one of `ports` (issue 25 item 6): `http` is
/// written at the top of its host.toml, as for the replicas' pages.
fn serve_host_metrics(
    layout: &Layout,
    ports: &[u16],
) -> Result<Vec<(String, std::net::SocketAddr)>, DevError> {
    let mut served = Vec::new();
    for ((name, _), port) in layout.machines.iter().zip(ports.iter().copied()) {
        let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
        let file = layout.dir.join(format!("host-{name}.toml"));
        let failed = |source| DevError::Dir {
            path: file.display().to_string(),
            source,
        };
        let text = std::fs::read_to_string(&file).map_err(failed)?;
        std::fs::write(&file, format!("http = \"{addr}\"\n{text}")).map_err(failed)?;
        served.push((name.clone(), addr));
    }
    Ok(served)
}

/// The signals that stop `dev`, installed before it writes or starts anything. Once installed,
/// a signal is kept until it is received, so one that arrives while `dev` is busy starting
/// children is seen at the next wait.
struct Stop {
    terminate: tokio::signal::unix::Signal,
    interrupt: tokio::signal::unix::Signal,
    hangup: tokio::signal::unix::Signal,
}

impl Stop {
    fn install() -> Result<Stop, DevError> {
        let install = |kind: SignalKind, which: &'static str| {
            signal(kind).map_err(|source| DevError::Signals { which, source })
        };
        Ok(Stop {
            terminate: install(SignalKind::terminate(), "SIGTERM")?,
            interrupt: install(SignalKind::interrupt(), "SIGINT")?,
            hangup: install(SignalKind::hangup(), "SIGHUP")?,
        })
    }

    /// Waits for the next stop signal and names it.
    async fn recv(&mut self) -> &'static str {
        tokio::select! {
            _ = self.terminate.recv() => "SIGTERM",
            _ = self.interrupt.recv() => "SIGINT",
            _ = self.hangup.recv() => "SIGHUP",
        }
    }
}

/// The example mesh with every port in `example_port_min..=example_port_max` moved to a loopback
/// TCP port free right now, and the moves made; two `dev` runs on one machine then neither
/// collide nor pass each other's readiness probes.
pub fn example_for_run() -> Result<(String, BTreeMap<u16, u16>), DevError> {
    let used = example_ports(example_mesh);
    let free = free_tcp_ports(used.len())?;
    if free.len() != used.len() {
        return Err(DevError::Step(format!(
            "the example uses {} ports, more than one run can take; this is a bug, report it",
            used.len()
        )));
    }
    let moves: BTreeMap<u16, u16> = used.into_iter().zip(free).collect();
    Ok((rewrite_ports(example_mesh, &moves), moves))
}

/// Every whole number in `text` that is an example port.
pub fn example_ports(text: &str) -> BTreeSet<u16> {
    let mut out = BTreeSet::new();
    for (_, digits) in numbers(text) {
        if let Ok(port) = digits.parse::<u16>()
            && (example_port_min..=example_port_max).contains(&port)
        {
            out.insert(port);
        }
    }
    out
}

/// `text` with every whole number that is a key of `moves` replaced by its value; nothing else
/// changes (comments, layout, other numbers).
pub fn rewrite_ports(text: &str, moves: &BTreeMap<u16, u16>) -> String {
    let mut out = String::with_capacity(text.len());
    let mut copied = 0;
    for (at, digits) in numbers(text) {
        let Some(to) = digits.parse::<u16>().ok().and_then(|p| moves.get(&p)) else {
            continue;
        };
        out.push_str(&text[copied..at]);
        out.push_str(&to.to_string());
        copied = at + digits.len();
    }
    out.push_str(&text[copied..]);
    out
}

/// Each maximal run of ASCII digits in `text`, with its byte offset.
fn numbers(text: &str) -> Vec<(usize, &str)> {
    let bytes = text.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        if !bytes[i].is_ascii_digit() {
            i += 1;
            continue;
        }
        let start = i;
        while i < bytes.len() && bytes[i].is_ascii_digit() {
            i += 1;
        }
        out.push((start, &text[start..i]));
    }
    out
}

fn describe_moves(moves: &BTreeMap<u16, u16>) -> String {
    let parts: Vec<String> = moves
        .iter()
        .map(|(from, to)| format!("{from} -> {to}"))
        .collect();
    parts.join(", ")
}

/// A new, empty directory under the system temp dir.
fn fresh_temp_dir() -> Result<PathBuf, DevError> {
    let mut seed = [0u8; 6];
    getrandom::getrandom(&mut seed).map_err(|e| DevError::Step(e.to_string()))?;
    let tag = crate::host::config::encode_hex(&seed);
    let dir = std::env::temp_dir().join(format!("mesh-dev-{tag}"));
    // 0700: init writes the mesh's keys into it (decision 0296).
    std::fs::DirBuilder::new()
        .mode(crate::durable::secret_dir_mode)
        .create(&dir)
        .map_err(|source| DevError::Dir {
            path: dir.display().to_string(),
            source,
        })?;
    Ok(dir)
}

/// Under `cargo run`, `cargo build` only built meshctl: build `meshd` and `mesh-host` into the same
/// profile directory too, so the binaries beside this one are current. Outside cargo, use what is
/// installed beside meshctl as it is. A stop signal during the build ends it and is returned.
async fn build_siblings(stop: &mut Stop) -> Result<Option<&'static str>, DevError> {
    let Some(cargo) = std::env::var_os("CARGO") else {
        return Ok(None);
    };
    let exe = std::env::current_exe().map_err(|e| DevError::Step(e.to_string()))?;
    let release = exe
        .parent()
        .and_then(|d| d.file_name())
        .is_some_and(|n| n == "release");
    let manifest = concat!(env!("CARGO_MANIFEST_DIR"), "/Cargo.toml");
    let mut cmd = std::process::Command::new(cargo);
    cmd.args([
        "build",
        "--bin",
        "meshd",
        "--bin",
        "mesh-host",
        "--manifest-path",
        manifest,
    ]);
    // `cargo run` gave this process the variables cargo sets for a crate; build scripts (ring's)
    // watch some of them, so passing them on would rebuild those crates on every run.
    for (key, _) in std::env::vars_os() {
        let Some(key) = key.to_str() else { continue };
        let set_by_cargo_run = key.starts_with("CARGO_PKG_")
            || key.starts_with("CARGO_MANIFEST_")
            || key.starts_with("CARGO_CFG_")
            || matches!(
                key,
                "CARGO_CRATE_NAME" | "CARGO_BIN_NAME" | "CARGO_PRIMARY_PACKAGE" | "OUT_DIR"
            );
        if set_by_cargo_run {
            cmd.env_remove(key);
        }
    }
    if release {
        cmd.arg("--release");
    }
    println!(
        "building meshd and mesh-host beside meshctl (cargo build{})",
        if release { " --release" } else { "" }
    );
    let mut child = cmd
        .spawn()
        .map_err(|e| DevError::Step(format!("cannot run cargo: {e}")))?;
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) => {}
            Err(e) => return Err(DevError::Step(format!("cannot wait for cargo: {e}"))),
        }
        let pause = tokio::time::sleep(Duration::from_millis(poll_interval_ms));
        tokio::select! {
            _ = pause => {}
            signal = stop.recv() => {
                let _ = child.kill();
                let _ = child.wait();
                return Ok(Some(signal));
            }
        }
    };
    if !status.success() {
        return Err(DevError::Step(format!(
            "`cargo build --bin meshd --bin mesh-host` failed ({status}); fix the build and run meshctl dev again"
        )));
    }
    Ok(None)
}

/// Starts every replica and machine of the layout, logs under `<dir>/logs`, replicas first. Each
/// child is tied to this thread: a replica gets SIGKILL when it ends, a host SIGTERM, so it stops
/// its modules on the way out (its SIGTERM handler is installed before it starts any module).
/// Call it from a thread that lives as long as the children (see [`Guarded::spawn_tied`]).
pub fn start(layout: &Layout) -> Result<Vec<Guarded>, DevError> {
    let logs = layout.dir.join("logs");
    std::fs::create_dir_all(&logs).map_err(|source| DevError::Dir {
        path: logs.display().to_string(),
        source,
    })?;
    let grace = Duration::from_millis(stop_grace_ms);
    let meshd = sibling_binary("meshd")?;
    let host = sibling_binary("mesh-host")?;
    let mut children = Vec::new();
    for (id, _) in &layout.replicas {
        let name = format!("replica-{id}");
        let config = layout.dir.join(format!("{name}.toml"));
        let config = config.display().to_string();
        let log = logs.join(format!("{name}.log"));
        children.push(Guarded::spawn_tied(
            &name,
            &meshd,
            &["--config", &config],
            &log,
            grace,
            Signal::SIGKILL,
        )?);
    }
    for (m, _) in &layout.machines {
        let name = format!("host-{m}");
        let config = layout.dir.join(format!("{name}.toml"));
        let config = config.display().to_string();
        let log = logs.join(format!("{name}.log"));
        children.push(Guarded::spawn_tied(
            &name,
            &host,
            &["--config", &config],
            &log,
            grace,
            Signal::SIGTERM,
        )?);
    }
    Ok(children)
}

/// Waits for a leader, applies the example, pushes `--all`, prints status.
async fn drive(
    context: &Context,
    dir: &Path,
    mesh: crate::core::model::Mesh,
) -> Result<(), DevError> {
    let logs = dir.join("logs").display().to_string();
    let deadline = Instant::now() + Duration::from_millis(leader_wait_ms);
    let why = "meshctl dev: the example mesh".to_string();
    let apply = Request::Apply {
        mesh,
        why: why.clone(),
        drain: false,
    };
    let answer = retry(context, &apply, deadline, "apply", &logs).await?;
    println!(
        "applied the example mesh (answered by replica {})",
        answer.0
    );
    let push_all = Request::Push {
        target: PushTarget::All,
        why,
        moves: Vec::new(),
        plan: None,
    };
    let (replica, body) = retry(context, &push_all, deadline, "push --all", &logs).await?;
    if let Body::Push(view) = &body {
        let via = super::render::Via {
            replica,
            forwarded_by: None,
        };
        print!("{}", push::render_text(via, view));
    }
    let (replica, body) = retry(context, &Request::Status, deadline, "status", &logs).await?;
    if let Body::Status(view) = &body {
        print!("{}", status::render_text(view));
        println!("(status from replica {replica})");
    }
    Ok(())
}

/// Asks until the cluster answers with a body (it may still be electing), or the deadline passes.
async fn retry(
    context: &Context,
    request: &Request,
    deadline: Instant,
    what: &'static str,
    logs: &str,
) -> Result<(u64, Body), DevError> {
    let started = Instant::now();
    loop {
        let last = match client::ask_async(context, request).await {
            Ok(answer) => match answer.body {
                Ok(body) => return Ok((answer.replica, body)),
                Err(e) => e.to_string(),
            },
            Err(e) => e.to_string(),
        };
        if Instant::now() >= deadline {
            return Err(DevError::Timeout {
                what,
                waited_ms: started.elapsed().as_millis() as u64,
                last,
                logs: logs.to_string(),
            });
        }
        tokio::time::sleep(Duration::from_millis(poll_interval_ms)).await;
    }
}
