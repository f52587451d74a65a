//! `meshctl init`: writes everything a mesh needs to start: the PKI (CA, one certificate per
//! replica, machine and the operator; keys 0600), one ed25519 signing key per replica, a config per
//! replica (`replica-<id>.toml`) and machine (`host-<m>.toml`), a context file, and with `-f` each
//! machine's genesis declaration: the core's compose of that machine from the file (G11).
//!
//! Addresses (decision 0094): with `--replica ID=ADDR` each replica is advertised at ADDR and each
//! machine at its mesh-file `address` on `--host-port`, every process listening on the wildcard of
//! that port; without, everything is on loopback ports from `--base-port` (one machine: `meshctl
//! dev`, the beds). A layout is checked whole before anything is written.

use ed25519_dalek::SigningKey;
use mesh_transport::{Ca, PkiError, Principal, Role, Validity, addr};
use serde::Serialize;
use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};

use super::context::{ContextFile, ContextTls};
use crate::controller::config::{ReplicaConfig, ReplicaConfigFile, TlsFile};
use crate::controller::silent_after_intervals;
use crate::core::compose::{World, compose, declaration_bytes, digest};
use crate::core::declaration::Digest;
use crate::core::model::Mesh;
use crate::core::settings::is_valid_name;
use crate::host::config::encode_hex;

/// Most replicas `init` writes (three in production, one allowed for dev).
pub const replicas_max: u64 = 9;
/// Most machines `init` writes configs for.
pub const machines_max: usize = 1_000;
/// How long the certificates `init` issues are valid, in days.
pub const cert_validity_days: u32 = 825;
/// Mode of private key files and the signing keys.
pub const secret_file_mode: u32 = crate::durable::secret_file_mode;
/// Mode of configs and genesis declarations.
pub const public_file_mode: u32 = 0o644;
/// How often a host reports when nothing happens, in the configs `init` writes.
pub const host_reconcile_interval_ms: u64 = 2_000;
/// `silent_after_ms` in the replica configs init writes: as many of its hosts' report intervals
/// as a replica's default counts (decision 0301), so a stopped host reads `SILENT` after 6 s.
pub const replica_silent_after_ms: u64 = silent_after_intervals * host_reconcile_interval_ms;
/// Replica `i` listens on `base + i`; machine `j` (from 1) on `base + 100 + j`.
pub const host_port_offset: u16 = 100;
/// The port of a `--replica ID=IP` given without one.
pub const replica_port_default: u16 = 7100;
/// The port every mesh-host listens on with `--replica` (each machine has its own address).
pub const host_port_default: u16 = 7200;
/// The operator name in the certificate `init` issues.
pub const operator_default: &str = "admin";

#[derive(Debug, clap::Args)]
pub struct InitArgs {
    /// Directory to write into (created if missing; refused if it already holds a context).
    #[arg(long)]
    pub dir: PathBuf,
    /// How many replicas (on loopback; with --replica, one per --replica).
    #[arg(long, default_value_t = 3, conflicts_with = "replica")]
    pub replicas: u64,
    /// A replica and the address the others dial: `1=10.0.0.1:7100`, `2=[fd00::2]:7100`, or
    /// `3=10.0.0.3` (port 7100). Repeat per replica; needs -f, whose machines' `address`es are
    /// where the replicas reach each mesh-host (on --host-port).
    #[arg(long = "replica", value_name = "ID=ADDR", requires = "file")]
    pub replica: Vec<String>,
    /// With --replica: the port each machine's mesh-host listens on, at its mesh-file address.
    #[arg(long, default_value_t = host_port_default, requires = "replica")]
    pub host_port: u16,
    /// Machine names, comma-separated; with `-f`, defaults to the file's machines.
    #[arg(long, value_delimiter = ',')]
    pub machines: Vec<String>,
    /// A mesh file: write each machine's genesis declaration from it.
    #[arg(short = 'f', long = "file")]
    pub file: Option<PathBuf>,
    /// Without --replica: replica i listens on 127.0.0.1:P+i, machine j on 127.0.0.1:P+100+j.
    #[arg(long, default_value_t = 7100, conflicts_with = "replica")]
    pub base_port: u16,
    /// The operator name in the operator certificate.
    #[arg(long, default_value = operator_default)]
    pub operator: String,
    /// Write one more replica into --dir, which `meshctl init` wrote: `4=10.0.0.4:7100`. Its
    /// certificate comes from that CA; its config joins the running cluster, which
    /// `meshctl replicas add` then makes it a member of (decision 0230).
    #[arg(long = "add-replica", value_name = "ID=ADDR", conflicts_with_all = ["replica", "file", "machines"])]
    pub add_replica: Option<String>,
}

/// Why `init` wrote nothing (or stopped part way: it never overwrites, so run it into a new dir).
#[derive(Debug, thiserror::Error)]
pub enum InitError {
    #[error("init: {0}")]
    Usage(String),
    #[error(
        "{dir} already holds a mesh (context.toml exists); init never overwrites keys, pick a new --dir"
    )]
    Exists { dir: String },
    #[error("init: {0}")]
    Pki(#[from] PkiError),
    #[error("cannot write {path}: {source}; check the directory is writable")]
    Write {
        path: String,
        source: std::io::Error,
    },
    #[error("cannot generate a signing key: {0}; the OS random source failed")]
    Random(String),
    #[error("cannot render {what}: {reason}")]
    Render { what: String, reason: String },
    #[error(
        "init: machine {machine} does not compose: {reason}; fix the mesh file (`meshctl check -f`)"
    )]
    Compose { machine: String, reason: String },
}

impl InitError {
    pub fn exit_code(&self) -> u8 {
        match self {
            InitError::Usage(_) | InitError::Exists { .. } | InitError::Compose { .. } => {
                super::exit_bad_input
            }
            _ => super::exit_failed,
        }
    }
}

/// Everything `init` writes, decided before anything is written.
#[derive(Clone, Debug)]
pub struct Layout {
    pub dir: PathBuf,
    pub replicas: Vec<(u64, SocketAddr)>,
    pub machines: Vec<(String, SocketAddr)>,
    pub mesh: Option<Mesh>,
    pub operator: String,
}

/// What `init` wrote.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Written {
    pub context: PathBuf,
    pub replica_configs: Vec<PathBuf>,
    pub host_configs: Vec<PathBuf>,
    /// Machine → digest of its genesis declaration.
    pub genesis: BTreeMap<String, Digest>,
}

pub fn run(args: &InitArgs) -> Result<String, super::CliError> {
    if let Some(spec) = &args.add_replica {
        return super::replicas::init_add(&args.dir, spec);
    }
    let mesh = match &args.file {
        Some(f) => Some(super::apply::read_mesh(f)?),
        None => None,
    };
    let layout = layout(args, mesh)?;
    let written = write(&layout)?;
    Ok(render(&layout, &written))
}

/// The layout the arguments ask for, checked.
pub fn layout(args: &InitArgs, mesh: Option<Mesh>) -> Result<Layout, InitError> {
    if !is_valid_name(&args.operator) {
        return Err(InitError::Usage(format!(
            "operator name `{}` is not valid; use 1 to 63 of [a-z0-9-]",
            args.operator
        )));
    }
    let machines = machine_names(&args.machines, mesh.as_ref())?;
    let (replicas, machines) = if args.replica.is_empty() {
        loopback_addresses(args, machines)?
    } else {
        let Some(mesh) = mesh.as_ref() else {
            return Err(InitError::Usage(
                "--replica needs a mesh file (-f): machines' addresses come from it".into(),
            ));
        };
        let replicas = replica_addresses(&args.replica)?;
        (replicas, machine_addresses(machines, mesh, args.host_port)?)
    };
    Ok(Layout {
        dir: args.dir.clone(),
        replicas,
        machines,
        mesh,
        operator: args.operator.clone(),
    })
}

type Addresses = (Vec<(u64, SocketAddr)>, Vec<(String, SocketAddr)>);

/// Without `--replica`: replica `i` on `127.0.0.1:base+i`, machine `j` on `127.0.0.1:base+100+j`.
fn loopback_addresses(args: &InitArgs, machines: Vec<String>) -> Result<Addresses, InitError> {
    let usage = |s: String| InitError::Usage(s);
    if !(1..=replicas_max).contains(&args.replicas) {
        return Err(usage(format!(
            "--replicas {} is outside 1..={replicas_max}; use 3 (or 1 for a dev mesh)",
            args.replicas
        )));
    }
    let port = |offset: u64| -> Result<SocketAddr, InitError> {
        let p = u64::from(args.base_port) + offset;
        let p = u16::try_from(p).map_err(|_| {
            usage(format!(
                "--base-port {} leaves no room for every port (needs {p}); pick a lower base",
                args.base_port
            ))
        })?;
        Ok(SocketAddr::from(([127, 0, 0, 1], p)))
    };
    let mut replicas = Vec::new();
    for id in 1..=args.replicas {
        replicas.push((id, port(id)?));
    }
    let mut hosts = Vec::new();
    for (j, m) in machines.into_iter().enumerate() {
        hosts.push((m, port(u64::from(host_port_offset) + j as u64 + 1)?));
    }
    Ok((replicas, hosts))
}

/// `--replica ID=ADDR` values: ids from 1, each once, at most [`replicas_max`]; ADDR is `ip:port`,
/// `[ipv6]:port`, or an IP alone on [`replica_port_default`].
fn replica_addresses(specs: &[String]) -> Result<Vec<(u64, SocketAddr)>, InitError> {
    let usage = |s: String| InitError::Usage(s);
    if specs.len() > replicas_max as usize {
        return Err(usage(format!(
            "{} --replica given, at most {replicas_max}; a cluster has 3 (or 1 for a dev mesh)",
            specs.len()
        )));
    }
    let mut out: Vec<(u64, SocketAddr)> = Vec::new();
    for spec in specs {
        let bad = || {
            usage(format!(
                "--replica `{spec}` is not ID=ADDR; write it like `1=10.0.0.1:7100` or `2=[fd00::2]:7100`"
            ))
        };
        let (id, address) = spec.split_once('=').ok_or_else(bad)?;
        let id: u64 = id.trim().parse().map_err(|_| bad())?;
        let address = parse_address(address.trim(), replica_port_default).ok_or_else(bad)?;
        if id == 0 {
            return Err(usage(format!("--replica `{spec}`: replica ids start at 1")));
        }
        if out.iter().any(|(seen, _)| *seen == id) {
            return Err(usage(format!("--replica {id} is given twice")));
        }
        out.push((id, address));
    }
    out.sort_by_key(|(id, _)| *id);
    Ok(out)
}

/// `ip:port`, `[ipv6]:port`, or an IP (IPv6 with or without brackets) on `default_port`.
fn parse_address(text: &str, default_port: u16) -> Option<SocketAddr> {
    if let Ok(addr) = text.parse::<SocketAddr>() {
        return Some(addr);
    }
    let bare = text
        .strip_prefix('[')
        .and_then(|t| t.strip_suffix(']'))
        .unwrap_or(text);
    let ip = bare.parse::<IpAddr>().ok()?;
    Some(SocketAddr::new(ip, default_port))
}

/// Each machine at its mesh-file `address` (an IP), on `port`.
fn machine_addresses(
    names: Vec<String>,
    mesh: &Mesh,
    port: u16,
) -> Result<Vec<(String, SocketAddr)>, InitError> {
    let mut out = Vec::new();
    for name in names {
        let written = mesh
            .machines
            .get(&name)
            .map(|m| m.address.as_str())
            // allow(empty-on-error): not a machine: no address, refused below
            .unwrap_or_default();
        let Some(address) = parse_address(written, port).filter(|a| a.port() == port) else {
            return Err(InitError::Usage(format!(
                "machine {name}: address `{written}` in the mesh file is not an IP address alone; replicas dial each mesh-host at its machine's address on --host-port, so write `[machines.{name}] address = \"10.0.0.5\"` (or an IPv6 address)"
            )));
        };
        out.push((name, address));
    }
    Ok(out)
}

/// Every address in `layout` can be dialled from another machine, no two processes share one,
/// and loopback is all or nothing (a one-machine mesh, or none on loopback).
fn check_addresses(layout: &Layout) -> Result<(), InitError> {
    let mut all: Vec<(String, SocketAddr)> = Vec::new();
    for (id, address) in &layout.replicas {
        all.push((format!("replica {id}"), *address));
    }
    for (name, address) in &layout.machines {
        all.push((format!("machine {name}"), *address));
    }
    for (i, (who, address)) in all.iter().enumerate() {
        if let Some(problem) = addr::advertise_problem(*address) {
            return Err(InitError::Usage(format!("{who}: {problem}")));
        }
        if let Some((other, _)) = all[..i].iter().find(|(_, a)| a == address) {
            return Err(InitError::Usage(format!(
                "{other} and {who} would both listen at {address}; give each machine its own address in the mesh file, or pick another --host-port"
            )));
        }
    }
    let routable = all.iter().find(|(_, a)| !addr::is_loopback(*a));
    let looped = all.iter().find(|(_, a)| addr::is_loopback(*a));
    if let (Some((far, far_addr)), Some((near, near_addr))) = (routable, looped) {
        return Err(InitError::Usage(format!(
            "{near} is on loopback ({near_addr}) but {far} is at {far_addr}: other machines cannot reach a loopback address; write its machine's routable address"
        )));
    }
    Ok(())
}

/// Whether any process of `layout` is on IPv6: then every process listens on `[::]`, so its one
/// socket can dial both families.
fn dual_stack(layout: &Layout) -> bool {
    let replicas = layout.replicas.iter().map(|(_, a)| a);
    let machines = layout.machines.iter().map(|(_, a)| a);
    replicas.chain(machines).any(|a| a.is_ipv6())
}

/// `--machines`, or the file's machines; each a valid name, no duplicates, each in the file.
fn machine_names(given: &[String], mesh: Option<&Mesh>) -> Result<Vec<String>, InitError> {
    let names: Vec<String> = match (given.is_empty(), mesh) {
        (true, Some(mesh)) => mesh.machines.keys().cloned().collect(),
        (true, None) => {
            return Err(InitError::Usage(
                "name the machines with --machines a,b,... or give a mesh file with -f".into(),
            ));
        }
        (false, _) => given.iter().map(|m| m.trim().to_string()).collect(),
    };
    if names.len() > machines_max {
        return Err(InitError::Usage(format!(
            "{} machines, at most {machines_max}",
            names.len()
        )));
    }
    let mut seen = BTreeSet::new();
    for name in &names {
        if !is_valid_name(name) {
            return Err(InitError::Usage(format!(
                "machine name `{name}` is not valid; use 1 to 63 of [a-z0-9-]"
            )));
        }
        if !seen.insert(name) {
            return Err(InitError::Usage(format!("machine {name} is listed twice")));
        }
        if let Some(mesh) = mesh
            && !mesh.machines.contains_key(name)
        {
            return Err(InitError::Usage(format!(
                "machine {name} is not in the mesh file; add [machines.{name}] or drop it from --machines"
            )));
        }
    }
    Ok(names)
}

/// Writes the whole layout. Never overwrites: a directory that already holds a context is refused.
pub fn write(layout: &Layout) -> Result<Written, InitError> {
    let dir = &layout.dir;
    create_dir(dir)?;
    let context_path = dir.join("context.toml");
    if context_path.exists() {
        return Err(InitError::Exists {
            dir: dir.display().to_string(),
        });
    }
    check_addresses(layout)?;
    for &(id, addr) in &layout.replicas {
        // meshd's own checks before anything is written, so init never writes a config meshd
        // refuses, nor half a mesh.
        let path = layout.dir.join(format!("replica-{id}.toml"));
        let file = replica_file(layout, id, addr, &BTreeMap::new());
        ReplicaConfig::from_file(file, &path, &layout.dir).map_err(|e| InitError::Render {
            what: path.display().to_string(),
            reason: e.to_string(),
        })?;
    }
    let genesis = genesis_all(layout)?;
    let ca = Ca::create(Validity::days_from_now(cert_validity_days))?;
    ca.write(&dir.join("ca.pem"), &dir.join("ca.key"))?;
    // Every replica's key first: each replica trusts the others' to check the epoch a host
    // proves (G9), as every host does.
    let mut keys = Vec::new();
    let mut trusted = BTreeMap::new();
    for &(id, _) in &layout.replicas {
        let key = signing_key()?;
        trusted.insert(id.to_string(), encode_hex(key.verifying_key().as_bytes()));
        keys.push(key);
    }
    let mut replica_configs = Vec::new();
    for (&(id, addr), key) in layout.replicas.iter().zip(keys) {
        replica_configs.push(write_replica(layout, &ca, (id, addr), &key, &trusted)?);
    }
    let mut host_configs = Vec::new();
    for (name, addr) in &layout.machines {
        host_configs.push(write_host(layout, &ca, name, *addr, &trusted)?);
        if let Some((bytes, _)) = genesis.get(name) {
            let path = dir.join(format!("host-{name}")).join("genesis.declaration");
            write_new(&path, bytes, public_file_mode)?;
        }
    }
    write_operator(layout, &ca, &context_path)?;
    Ok(Written {
        context: context_path,
        replica_configs,
        host_configs,
        genesis: genesis.into_iter().map(|(m, (_, d))| (m, d)).collect(),
    })
}

/// Each machine's genesis declaration (canonical bytes and digest): the core's compose of the
/// machine from the file, with no provision minted yet (the controller mints on the first push).
pub fn genesis_all(layout: &Layout) -> Result<BTreeMap<String, (Vec<u8>, Digest)>, InitError> {
    let mut out = BTreeMap::new();
    let Some(mesh) = &layout.mesh else {
        return Ok(out);
    };
    let world = World::new(mesh.clone(), []);
    for (name, _) in &layout.machines {
        let composed = compose(&world, name).map_err(|e| InitError::Compose {
            machine: name.clone(),
            reason: e.to_string(),
        })?;
        let bytes = declaration_bytes(&composed.declaration);
        out.insert(name.clone(), (bytes, digest(&composed.declaration)));
    }
    Ok(out)
}

#[derive(Serialize)]
struct TlsToml {
    ca: String,
    cert: String,
    key: String,
}

/// `host.toml` as mesh-host reads it (`src/host/config.rs`).
#[derive(Serialize)]
struct HostToml {
    name: String,
    root: String,
    mounts_root: String,
    listen: String,
    advertise: String,
    replicas: Vec<String>,
    reconcile_interval_ms: u64,
    tls: TlsToml,
    trusted_keys: BTreeMap<String, String>,
}

fn tls_for(sub: &str) -> TlsToml {
    TlsToml {
        ca: "ca.pem".into(),
        cert: format!("{sub}/cert.pem"),
        key: format!("{sub}/key.pem"),
    }
}

/// Writes replica `id`'s certificate, signing key and config; returns the config path and the
/// signing key's public half (hex) for the hosts to trust.
fn write_replica(
    layout: &Layout,
    ca: &Ca,
    (id, addr): (u64, SocketAddr),
    key: &SigningKey,
    trusted: &BTreeMap<String, String>,
) -> Result<PathBuf, InitError> {
    let sub = format!("replica-{id}");
    let sub_dir = layout.dir.join(&sub);
    create_dir(&sub_dir)?;
    let cert = ca.issue(
        &Principal::Replica(id),
        Validity::days_from_now(cert_validity_days),
    )?;
    cert.write(&sub_dir.join("cert.pem"), &sub_dir.join("key.pem"))?;
    let secret_hex = format!("{}\n", encode_hex(key.as_bytes()));
    write_new(
        &sub_dir.join("signing.key"),
        secret_hex.as_bytes(),
        secret_file_mode,
    )?;
    // `write` checked this config with meshd's own checks before anything was written.
    let others = trusted
        .iter()
        .filter(|(other, _)| **other != id.to_string())
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    let config = replica_file(layout, id, addr, &others);
    let path = layout.dir.join(format!("{sub}.toml"));
    write_toml(&path, &config)?;
    Ok(path)
}

/// Replica `id`'s config: listening on the wildcard of its port (on `addr` itself when that is
/// loopback), advertised to the others at `addr` through `[peers]`.
fn replica_file(
    layout: &Layout,
    id: u64,
    addr: SocketAddr,
    trusted_keys: &BTreeMap<String, String>,
) -> ReplicaConfigFile {
    let sub = format!("replica-{id}");
    ReplicaConfigFile {
        id,
        listen: addr::listen_for(addr, dual_stack(layout)).to_string(),
        data_dir: PathBuf::from(&sub),
        signing_key: PathBuf::from(format!("{sub}/signing.key")),
        tls: TlsFile {
            ca: "ca.pem".into(),
            cert: format!("{sub}/cert.pem").into(),
            key: format!("{sub}/key.pem").into(),
        },
        peers: layout
            .replicas
            .iter()
            .map(|(i, a)| (i.to_string(), a.to_string()))
            .collect(),
        hosts: layout
            .machines
            .iter()
            .map(|(m, a)| (m.clone(), a.to_string()))
            .collect(),
        raft: None,
        transport: None,
        http: None,
        silent_after_ms: Some(replica_silent_after_ms),
        trusted_keys: trusted_keys.clone(),
        join: false,
    }
}

pub(crate) fn write_host(
    layout: &Layout,
    ca: &Ca,
    name: &str,
    addr: SocketAddr,
    trusted: &BTreeMap<String, String>,
) -> Result<PathBuf, InitError> {
    let sub = format!("host-{name}");
    let sub_dir = layout.dir.join(&sub);
    create_dir(&sub_dir)?;
    let cert = ca.issue(
        &Principal::Host(name.to_string()),
        Validity::days_from_now(cert_validity_days),
    )?;
    cert.write(&sub_dir.join("cert.pem"), &sub_dir.join("key.pem"))?;
    let config = HostToml {
        name: name.to_string(),
        root: format!("{sub}/state"),
        mounts_root: format!("{sub}/mounts"),
        listen: addr::listen_for(addr, dual_stack(layout)).to_string(),
        advertise: addr.to_string(),
        replicas: layout.replicas.iter().map(|(_, a)| a.to_string()).collect(),
        reconcile_interval_ms: host_reconcile_interval_ms,
        tls: tls_for(&sub),
        trusted_keys: trusted.clone(),
    };
    let path = layout.dir.join(format!("{sub}.toml"));
    write_toml(&path, &config)?;
    Ok(path)
}

fn write_operator(layout: &Layout, ca: &Ca, context_path: &Path) -> Result<(), InitError> {
    let sub_dir = layout.dir.join("operator");
    create_dir(&sub_dir)?;
    let name = &layout.operator;
    // The first operator holds every role: it revokes, renews and adds replicas (decision 0295).
    let cert = ca.issue_with_role(
        &Principal::Operator(name.clone()),
        Some(Role::Admin),
        Validity::days_from_now(cert_validity_days),
    )?;
    cert.write(&sub_dir.join("cert.pem"), &sub_dir.join("key.pem"))?;
    let context = ContextFile {
        replicas: layout
            .replicas
            .iter()
            .map(|(i, a)| (i.to_string(), a.to_string()))
            .collect(),
        tls: ContextTls {
            ca: "ca.pem".into(),
            cert: "operator/cert.pem".into(),
            key: "operator/key.pem".into(),
        },
    };
    write_toml(context_path, &context)
}

/// A fresh ed25519 key from the OS random source.
fn signing_key() -> Result<SigningKey, InitError> {
    let mut seed = [0u8; 32];
    getrandom::getrandom(&mut seed).map_err(|e| InitError::Random(e.to_string()))?;
    Ok(SigningKey::from_bytes(&seed))
}

pub(crate) fn write_toml<T: Serialize>(path: &Path, value: &T) -> Result<(), InitError> {
    let text = toml::to_string(value).map_err(|e| InitError::Render {
        what: path.display().to_string(),
        reason: e.to_string(),
    })?;
    write_new(path, text.as_bytes(), public_file_mode)
}

/// Creates `dir` 0700 for keys and secrets; an existing one is left as it is, with a warning when
/// others may list it (decision 0296).
pub(crate) fn create_dir(dir: &Path) -> Result<(), InitError> {
    let loose = crate::durable::private_dir(dir).map_err(storage)?;
    if let Some(loose) = loose {
        super::warn(&loose.to_string());
    }
    Ok(())
}

/// Creates `path` with `mode` (never overwriting), atomically: whole or not at all.
pub(crate) fn write_new(path: &Path, bytes: &[u8], mode: u32) -> Result<(), InitError> {
    crate::durable::write_new(path, bytes, mode).map_err(storage)
}

fn storage(e: crate::durable::StorageError) -> InitError {
    InitError::Write {
        path: e.path.display().to_string(),
        source: e.source,
    }
}

/// The lines `init` prints.
pub fn render(layout: &Layout, w: &Written) -> String {
    let mut out = format!("wrote a mesh into {}\n", layout.dir.display());
    for ((id, addr), path) in layout.replicas.iter().zip(&w.replica_configs) {
        out.push_str(&format!(
            "  replica {id}  {addr}  meshd --config {}\n",
            path.display()
        ));
    }
    for ((name, addr), path) in layout.machines.iter().zip(&w.host_configs) {
        let genesis = match w.genesis.get(name) {
            Some(d) => format!("  genesis {}", d.short()),
            None => String::new(),
        };
        out.push_str(&format!(
            "  machine {name}  {addr}  mesh-host --config {}{genesis}\n",
            path.display()
        ));
    }
    out.push_str(&format!(
        "  operator {}  export MESH_CONTEXT={}\n",
        layout.operator,
        w.context.display()
    ));
    out
}
