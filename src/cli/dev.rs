//! `meshctl dev`: the embedded default. Writes a mesh into a directory (new temp dir unless
//! `--dir`) with free loopback ports, starts 3 `meshd` and 4 `mesh-host` (the binaries beside this
//! one), applies the embedded `examples/mesh.toml`, pushes `--all`, prints the status and what to
//! try, and runs until Ctrl-C or SIGTERM; then it stops every child (no orphans).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::context::{Context, load};
use super::init::{Layout, write};
use super::procs::{Guarded, SpawnError, free_ports, sibling_binary, stop_grace_ms};
use super::{client, push, status};
use crate::controller::api::{Body, PushTarget, Request};
use crate::core::meshfile::parse_mesh;

/// The example mesh `dev` applies.
pub const example_mesh: &str = include_str!("../../examples/mesh.toml");
/// The machines of the example mesh.
pub const dev_machines: [&str; 4] = ["ace", "g14", "novox", "shanks"];
/// Replicas `dev` starts.
pub const dev_replicas: u64 = 3;
/// How long `dev` waits for the cluster to elect a leader and answer.
pub const leader_wait_ms: u64 = 30_000;
/// Pause between two status polls while waiting.
pub const poll_interval_ms: u64 = 200;

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
    #[error("dev: {what} did not succeed within {waited_ms} ms: {last}; the logs are in {logs}")]
    Timeout {
        what: &'static str,
        waited_ms: u64,
        last: String,
        logs: String,
    },
    #[error("dev: {0}")]
    Step(String),
}

pub fn run(args: &DevArgs) -> Result<String, super::CliError> {
    let dir = match &args.dir {
        Some(d) => d.clone(),
        None => fresh_temp_dir()?,
    };
    println!("meshctl dev: writing a mesh into {}", dir.display());
    let mesh = parse_mesh("examples/mesh.toml", example_mesh)
        .map_err(|e| DevError::Example(e.to_string()))?;
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
    build_siblings()?;
    let children = start(&layout)?;
    println!(
        "started {} processes; logs in {}",
        children.len(),
        dir.join("logs").display()
    );
    let context = load(&written.context, "--context")?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(DevError::Runtime)?;
    runtime.block_on(drive(&context, &dir, mesh))?;
    println!(
        "\ntry, in another shell:\n  export MESH_CONTEXT={}\n  alias meshctl={}\n  meshctl status\n  meshctl plan g14 --diff\n  meshctl settings set module/broker@g14 max_connections=256 --why \"more clients\"\n  meshctl push g14 --why \"raise broker limit\"\n  meshctl history\n\nCtrl-C stops every process.",
        written.context.display(),
        std::env::current_exe()
            .map(|p| p.display().to_string())
            .unwrap_or_else(|_| "meshctl".into())
    );
    runtime.block_on(wait_for_signal())?;
    println!("stopping {} processes", children.len());
    let mut children = children;
    // Hosts first, while the replicas still take their last reports; then the replicas.
    let split = dev_replicas as usize;
    super::procs::stop_all(&mut children[split..]);
    super::procs::stop_all(&mut children[..split]);
    drop(children);
    Ok(format!("stopped; the mesh stays in {}\n", dir.display()))
}

/// A new, empty directory under the system temp dir.
fn fresh_temp_dir() -> Result<PathBuf, DevError> {
    let mut seed = [0u8; 6];
    getrandom::getrandom(&mut seed).map_err(|e| DevError::Step(e.to_string()))?;
    let tag = crate::host::config::encode_hex(&seed);
    let dir = std::env::temp_dir().join(format!("mesh-dev-{tag}"));
    std::fs::create_dir(&dir).map_err(|source| DevError::Dir {
        path: dir.display().to_string(),
        source,
    })?;
    Ok(dir)
}

/// Under `cargo run`, `cargo build` only built meshctl: build `meshd` and `mesh-host` into the same
/// profile directory too, so the binaries beside this one are current. Outside cargo, use what is
/// installed beside meshctl as it is.
fn build_siblings() -> Result<(), DevError> {
    let Some(cargo) = std::env::var_os("CARGO") else {
        return Ok(());
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
    let status = cmd
        .status()
        .map_err(|e| DevError::Step(format!("cannot run cargo: {e}")))?;
    if !status.success() {
        return Err(DevError::Step(format!(
            "`cargo build --bin meshd --bin mesh-host` failed ({status}); fix the build and run meshctl dev again"
        )));
    }
    Ok(())
}

/// Starts every replica and machine of the layout, logs under `<dir>/logs`.
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
        children.push(Guarded::spawn(
            &name,
            &meshd,
            &["--config", &config],
            &log,
            grace,
        )?);
    }
    for (m, _) in &layout.machines {
        let name = format!("host-{m}");
        let config = layout.dir.join(format!("{name}.toml"));
        let config = config.display().to_string();
        let log = logs.join(format!("{name}.log"));
        children.push(Guarded::spawn(
            &name,
            &host,
            &["--config", &config],
            &log,
            grace,
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

async fn wait_for_signal() -> Result<(), DevError> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).map_err(|e| DevError::Step(e.to_string()))?;
    let mut int = signal(SignalKind::interrupt()).map_err(|e| DevError::Step(e.to_string()))?;
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
    Ok(())
}
