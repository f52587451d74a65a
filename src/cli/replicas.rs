//! `meshctl replicas list|add|remove` and `meshctl init --add-replica` (issue 12 part 4, decision
//! 0230). `init --add-replica ID=ADDR` writes a new replica's certificate and key (from the CA in
//! the directory `meshctl init` wrote), its signing key and `replica-<ID>.toml` (with `join = true`,
//! the cluster's `[peers]`, `[hosts]`, `[raft]` and `[transport]` taken from an existing replica's
//! config); `replicas add --id ID --addr ADDR` then asks the leader to make it a member, reading
//! its public signing key from that directory (or `--key`). meshctl decides nothing: the leader
//! checks the quorum, carries the key to the hosts and changes the membership.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use ed25519_dalek::SigningKey;
use mesh_transport::{Ca, Principal, Validity, addr};

use super::init::{InitError, cert_validity_days, public_file_mode, secret_file_mode, write_new};
use super::render::{self, Via};
use super::{CliError, Output, client, context};
use crate::controller::api::{Body, Request};
use crate::controller::config::{ReplicaConfig, ReplicaConfigFile, TlsFile};
use crate::controller::members::ReplicasView;
use crate::host::config::{decode_hex_32, encode_hex};

#[derive(Debug, clap::Subcommand)]
pub enum ReplicasCommand {
    /// Every member of the cluster as the leader knows it: voter or learner, address, whether it
    /// answers now.
    List(super::JsonArgs),
    /// Make a running replica (written by `meshctl init --add-replica`) a member: learner first,
    /// then a voter through joint consensus once every host has its signing key.
    Add(AddArgs),
    /// Remove a replica from the cluster through joint consensus; refused when the replicas that
    /// answer could not keep a quorum.
    Remove(RemoveArgs),
}

#[derive(Debug, clap::Args)]
pub struct AddArgs {
    /// The new replica's id (the one in its replica.toml).
    #[arg(long)]
    pub id: u64,
    /// The address the other replicas dial it at, `ip:port`.
    #[arg(long)]
    pub addr: SocketAddr,
    /// Its public signing key (64 hex); default: read from `<dir>/replica-<id>/signing.key`.
    #[arg(long)]
    pub key: Option<String>,
    /// The directory `meshctl init` wrote; defaults to the context file's directory.
    #[arg(long)]
    pub dir: Option<PathBuf>,
}

#[derive(Debug, clap::Args)]
pub struct RemoveArgs {
    /// The replica's id.
    pub id: u64,
}

pub fn run(ctx: Option<&Path>, cmd: &ReplicasCommand) -> Result<Output, CliError> {
    let request = match cmd {
        ReplicasCommand::List(_) => Request::ReplicasList,
        ReplicasCommand::Add(args) => {
            let key = match &args.key {
                Some(hex) => decode_hex_32(hex.trim()).ok_or_else(|| {
                    CliError::Usage(format!(
                        "--key `{hex}` is not 64 hex digits of an ed25519 public key; copy it from `meshctl init --add-replica`"
                    ))
                })?,
                None => {
                    let dir = init_dir(ctx, args.dir.as_deref())?;
                    public_key_of(&dir, args.id)?
                }
            };
            Request::ReplicasAdd {
                id: args.id,
                addr: args.addr.to_string(),
                key,
            }
        }
        ReplicasCommand::Remove(args) => Request::ReplicasRemove { id: args.id },
    };
    let asked = match cmd {
        ReplicasCommand::List(_) => "replicas list",
        ReplicasCommand::Add(_) => "replicas add",
        ReplicasCommand::Remove(_) => "replicas remove",
    };
    // The replica a removal takes out is asked last, only when no other answers (the client's
    // `taken_out`): its connections close as the removal commits.
    let context = context::resolve(ctx)?;
    let (via, body) = render::split(client::ask(&context, &request)?)?;
    let Body::Replicas(view) = body else {
        return Err(render::unexpected(via, asked, &body));
    };
    if let ReplicasCommand::List(super::JsonArgs { json: true }) = cmd {
        return super::json::output(
            Some(via),
            super::json::ReplicasJson::from(&view),
            super::exit_done,
        );
    }
    Ok(Output::done(render_text(&via, &view)))
}

/// The directory `meshctl init` wrote: `--dir`, else the context file's directory.
fn init_dir(ctx: Option<&Path>, dir: Option<&Path>) -> Result<PathBuf, CliError> {
    if let Some(d) = dir {
        return Ok(d.to_path_buf());
    }
    let context = context::resolve(ctx)?;
    Ok(context
        .path
        .parent()
        .map(Path::to_path_buf)
        // allow(empty-on-error): a context file named without a directory is in the current one
        .unwrap_or_else(|| PathBuf::from(".")))
}

/// Replica `id`'s public signing key, from its secret key file in `dir`.
fn public_key_of(dir: &Path, id: u64) -> Result<[u8; 32], CliError> {
    let path = dir.join(format!("replica-{id}")).join("signing.key");
    let text = std::fs::read_to_string(&path).map_err(|source| CliError::Read {
        path: path.display().to_string(),
        source,
    })?;
    let bytes = decode_hex_32(text.trim()).ok_or_else(|| {
        CliError::Usage(format!(
            "{} is not a replica signing key (64 hex digits); give the public key with --key",
            path.display()
        ))
    })?;
    Ok(SigningKey::from_bytes(&bytes).verifying_key().to_bytes())
}

/// What `replicas list|add|remove` prints: what was done, then one row per member.
pub fn render_text(via: &Via, view: &ReplicasView) -> String {
    let mut out = String::new();
    for line in &view.done {
        out.push_str(line);
        out.push('\n');
    }
    out.push_str("ID  ROLE     ADDRESS                 REACHABLE  SIGNING KEY\n");
    for m in &view.members {
        let role = match (m.leader, m.voter) {
            (true, _) => "leader",
            (false, true) => "voter",
            (false, false) => "learner",
        };
        out.push_str(&format!(
            "{:<3} {:<8} {:<23} {:<10} {}\n",
            m.id,
            role,
            m.addr,
            if m.reachable { "yes" } else { "no" },
            if m.key_known {
                "known to hosts"
            } else {
                "not in the state"
            },
        ));
    }
    for r in &view.retired {
        out.push_str(&format!(
            "retired replica {}  by {} at {}: {}\n",
            r.id,
            r.actor,
            crate::timefmt::utc_seconds(r.time_ms),
            r.why
        ));
    }
    out.push_str(&via.note());
    out
}

/// `meshctl init --dir D --add-replica ID=ADDR`: writes replica `ID`'s certificate, key, signing key
/// and `replica-<ID>.toml` into `D` (which `meshctl init` wrote), never overwriting anything.
pub fn init_add(dir: &Path, spec: &str) -> Result<String, CliError> {
    let usage = |s: String| CliError::Init(InitError::Usage(s));
    let bad = || {
        usage(format!(
            "--add-replica `{spec}` is not ID=ADDR; write it like `4=10.0.0.4:7100`"
        ))
    };
    let (id, address) = spec.split_once('=').ok_or_else(bad)?;
    let id: u64 = id.trim().parse().map_err(|_| bad())?;
    let address: SocketAddr = address.trim().parse().map_err(|_| bad())?;
    if id == 0 {
        return Err(usage(format!(
            "--add-replica `{spec}`: replica ids start at 1"
        )));
    }
    if let Some(problem) = addr::advertise_problem(address) {
        return Err(usage(format!("replica {id}: {problem}")));
    }
    let sub = format!("replica-{id}");
    let config_path = dir.join(format!("{sub}.toml"));
    if config_path.exists() || dir.join(&sub).exists() {
        return Err(usage(format!(
            "{} already exists: replica {id} was written before; start it, or pick a new id",
            config_path.display()
        )));
    }
    let template = template_config(dir)?;
    if template.peers.contains_key(&id.to_string()) {
        return Err(usage(format!(
            "replica {id} is already in [peers] of the replicas in {}; pick a new id",
            dir.display()
        )));
    }
    // Every replica's public key, so the new one checks the epochs hosts prove (G9).
    let mut trusted = BTreeMap::new();
    for other in template.peers.keys() {
        let other_id: u64 = other.parse().map_err(|_| {
            usage(format!(
                "[peers] key `{other}` in a replica config of {} is not an id",
                dir.display()
            ))
        })?;
        let public = public_key_of(dir, other_id)?;
        trusted.insert(other.clone(), encode_hex(&public));
    }
    let mut peers = template.peers.clone();
    peers.insert(id.to_string(), address.to_string());
    let dual = peers
        .values()
        // allow(empty-on-error): an address that does not parse is refused by meshd's check below
        .filter_map(|a| a.parse::<SocketAddr>().ok())
        .any(|a| a.is_ipv6());
    let file = ReplicaConfigFile {
        id,
        listen: addr::listen_for(address, dual).to_string(),
        data_dir: PathBuf::from(&sub),
        signing_key: PathBuf::from(format!("{sub}/signing.key")),
        tls: TlsFile {
            ca: "ca.pem".into(),
            cert: format!("{sub}/cert.pem").into(),
            key: format!("{sub}/key.pem").into(),
        },
        peers,
        hosts: template.hosts.clone(),
        raft: template.raft.clone(),
        transport: template.transport.clone(),
        http: None,
        silent_after_ms: Some(crate::cli::init::replica_silent_after_ms),
        trusted_keys: trusted,
        join: true,
    };
    // meshd's own checks before anything is written.
    ReplicaConfig::from_file(file.clone(), &config_path, dir).map_err(|e| {
        CliError::Init(InitError::Render {
            what: config_path.display().to_string(),
            reason: e.to_string(),
        })
    })?;
    let ca = Ca::load(&dir.join("ca.pem"), &dir.join("ca.key")).map_err(|e| {
        usage(format!(
            "cannot load the CA from {}: {e}; pass --dir with the directory `meshctl init` wrote",
            dir.display()
        ))
    })?;
    let sub_dir = dir.join(&sub);
    super::init::create_dir(&sub_dir).map_err(CliError::Init)?;
    let cert = ca
        .issue(
            &Principal::Replica(id),
            Validity::days_from_now(cert_validity_days),
        )
        .map_err(|e| CliError::Init(InitError::Pki(e)))?;
    cert.write(&sub_dir.join("cert.pem"), &sub_dir.join("key.pem"))
        .map_err(|e| CliError::Init(InitError::Pki(e)))?;
    let mut seed = [0u8; 32];
    getrandom::getrandom(&mut seed)
        .map_err(|e| CliError::Init(InitError::Random(e.to_string())))?;
    let key = SigningKey::from_bytes(&seed);
    let secret_hex = format!("{}\n", encode_hex(key.as_bytes()));
    write_new(
        &sub_dir.join("signing.key"),
        secret_hex.as_bytes(),
        secret_file_mode,
    )
    .map_err(CliError::Init)?;
    let text = file.to_toml().map_err(|e| {
        CliError::Init(InitError::Render {
            what: config_path.display().to_string(),
            reason: e.to_string(),
        })
    })?;
    write_new(&config_path, text.as_bytes(), public_file_mode).map_err(CliError::Init)?;
    let public = encode_hex(key.verifying_key().as_bytes());
    Ok(format!(
        "wrote replica {id} into {}\n  replica {id}  {address}  meshd --config {}\n  signing key (public) {public}\nstart it, then make it a member: meshctl replicas add --id {id} --addr {address}\nadd `{id} = \"{address}\"` under [replicas] of {} to ask it directly\n",
        dir.display(),
        config_path.display(),
        dir.join("context.toml").display(),
    ))
}

/// The config of the lowest-numbered replica in `dir` (its `[hosts]`, `[raft]` and `[transport]`
/// for the new one), with `[peers]` of every replica config in `dir`.
fn template_config(dir: &Path) -> Result<ReplicaConfigFile, CliError> {
    let entries = std::fs::read_dir(dir).map_err(|source| CliError::Read {
        path: dir.display().to_string(),
        source,
    })?;
    let mut found: Vec<(u64, PathBuf)> = Vec::new();
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().to_string();
        if let Some(id) = name
            .strip_prefix("replica-")
            .and_then(|n| n.strip_suffix(".toml"))
            .and_then(|n| n.parse::<u64>().ok())
        {
            found.push((id, entry.path()));
        }
    }
    found.sort();
    let mut template: Option<ReplicaConfigFile> = None;
    for (_, path) in &found {
        let text = std::fs::read_to_string(path).map_err(|source| CliError::Read {
            path: path.display().to_string(),
            source,
        })?;
        let file: ReplicaConfigFile = toml::from_str(&text).map_err(|e| {
            CliError::Init(InitError::Usage(format!(
                "{} is not a replica config: {e}",
                path.display()
            )))
        })?;
        // Every replica written so far, founding or added, is in the new one's [peers].
        match &mut template {
            None => template = Some(file),
            Some(t) => {
                for (id, a) in file.peers {
                    t.peers.entry(id).or_insert(a);
                }
            }
        }
    }
    template.ok_or_else(|| {
        CliError::Init(InitError::Usage(format!(
            "{} holds no replica-<id>.toml; pass --dir with the directory `meshctl init` wrote",
            dir.display()
        )))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::init::{Layout, write};

    fn mesh_dir() -> (tempfile::TempDir, PathBuf) {
        let tmp = tempfile::tempdir().expect("tempdir");
        let dir = tmp.path().join("mesh");
        let at = |p: u16| SocketAddr::from(([127, 0, 0, 1], p));
        let layout = Layout {
            dir: dir.clone(),
            replicas: vec![(1, at(7101)), (2, at(7102)), (3, at(7103))],
            machines: vec![("ace".into(), at(7201))],
            mesh: None,
            operator: "admin".into(),
        };
        write(&layout).expect("init writes the mesh");
        (tmp, dir)
    }

    #[test]
    fn g11_add_replica_writes_a_joining_config_meshd_accepts_with_every_peer_and_key() {
        let (_tmp, dir) = mesh_dir();
        let out = init_add(&dir, "4=127.0.0.1:7104").expect("add-replica");
        assert!(
            out.contains("meshctl replicas add --id 4 --addr 127.0.0.1:7104"),
            "{out}"
        );
        let config = ReplicaConfig::load(&dir.join("replica-4.toml")).expect("meshd accepts it");
        assert!(
            config.join(),
            "the new replica would found a cluster of its own"
        );
        assert_eq!(
            config.peers().keys().copied().collect::<Vec<u64>>(),
            vec![1, 2, 3, 4]
        );
        assert_eq!(
            config.trusted_keys().keys().copied().collect::<Vec<u64>>(),
            vec![1, 2, 3],
            "the others' envelope keys"
        );
        config.read_signing_key().expect("a 0600 signing key");
        // A fifth sees the fourth among its peers.
        init_add(&dir, "5=127.0.0.1:7105").expect("a fifth");
        let fifth = ReplicaConfig::load(&dir.join("replica-5.toml")).expect("fifth");
        assert!(fifth.peers().contains_key(&4), "{:?}", fifth.peers());
    }

    #[test]
    fn g11_add_replica_never_overwrites_and_refuses_an_id_in_use_or_a_bad_address() {
        let (_tmp, dir) = mesh_dir();
        let taken = init_add(&dir, "2=127.0.0.1:7109").expect_err("id 2 is a founding replica");
        assert!(
            taken.to_string().contains("replica 2 was written before"),
            "{taken}"
        );
        let bad = init_add(&dir, "4=somewhere").expect_err("not ip:port");
        assert!(bad.to_string().contains("ID=ADDR"), "{bad}");
        let wildcard = init_add(&dir, "4=0.0.0.0:7104").expect_err("a wildcard");
        assert_eq!(
            wildcard.exit_code(),
            crate::cli::exit_bad_input,
            "{wildcard}"
        );
        init_add(&dir, "4=127.0.0.1:7104").expect("first add");
        let before = std::fs::read(dir.join("replica-4/signing.key")).expect("key");
        let again = init_add(&dir, "4=127.0.0.1:7104").expect_err("written before");
        assert!(again.to_string().contains("already exists"), "{again}");
        assert_eq!(
            std::fs::read(dir.join("replica-4/signing.key")).expect("key"),
            before,
            "the signing key was overwritten"
        );
    }
}
