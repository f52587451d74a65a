//! `meshctl machines add NAME --address HOST:PORT --why W`: a machine joins a running mesh at its
//! genesis (G11). Writes the machine's certificate and key (from the CA in the directory `meshctl
//! init` wrote), its `host-NAME.toml`, and the genesis envelope the leader composed, minted and
//! recorded for it exactly as a push would; mesh-host applies it at its first start. The machine
//! must already be in the model (`meshctl apply`).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use ed25519_dalek::SigningKey;
use mesh_transport::Ca;

use super::init::{InitError, Layout, create_dir, secret_file_mode, write_host, write_new};
use super::render::{self, Via};
use super::{CliError, Output, context};
use crate::controller::api::{Body, PushView, Request};
use crate::host::agent::genesis_file_name;
use crate::host::config::{decode_hex_32, encode_hex};

#[derive(Debug, clap::Subcommand)]
pub enum MachinesCommand {
    /// Add a machine of the model to the running mesh: its certificate, key, host.toml and its
    /// genesis (its first envelope, minted and recorded by the leader as a push would).
    Add(AddArgs),
}

#[derive(Debug, clap::Args)]
pub struct AddArgs {
    /// The machine's name, as in the model.
    pub name: String,
    /// Where its mesh-host listens for envelopes, `HOST:PORT`.
    #[arg(long)]
    pub address: SocketAddr,
    /// The directory `meshctl init` wrote (CA, replica signing keys); defaults to the context
    /// file's directory.
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// Why the machine joins; kept with its send record.
    #[arg(long)]
    pub why: Option<String>,
}

pub fn run(ctx: Option<&Path>, cmd: &MachinesCommand) -> Result<Output, CliError> {
    let MachinesCommand::Add(args) = cmd;
    let why = super::require_why("machines add", args.why.as_deref())?;
    let context = context::resolve(ctx)?;
    let dir = match &args.dir {
        Some(d) => d.clone(),
        None => context
            .path
            .parent()
            .map(Path::to_path_buf)
            .unwrap_or_else(|| PathBuf::from(".")),
    };
    let name = &args.name;
    let host_toml = dir.join(format!("host-{name}.toml"));
    if host_toml.exists() {
        return Err(CliError::Usage(format!(
            "{} already exists: machine {name} was added before; start its mesh-host, or remove the file to add it again",
            host_toml.display()
        )));
    }
    let ca = Ca::load(&dir.join("ca.pem"), &dir.join("ca.key")).map_err(|e| {
        CliError::Usage(format!(
            "cannot load the CA from {}: {e}; pass --dir with the directory `meshctl init` wrote",
            dir.display()
        ))
    })?;
    let trusted = trusted_keys(&dir, &context.replicas)?;
    // Ask first: a genesis the leader refuses writes nothing.
    let request = Request::Genesis {
        machine: name.clone(),
        why,
    };
    let (via, body) = render::ask(ctx, &request)?;
    let Body::Genesis { envelope, cascade } = body else {
        return Err(render::unexpected(via, "machines add", &body));
    };
    let layout = Layout {
        dir: dir.clone(),
        replicas: context.replicas.clone(),
        machines: vec![(name.clone(), args.address)],
        mesh: None,
        operator: String::new(),
    };
    let written = write_host(&layout, &ca, name, args.address, &trusted).map_err(init_error)?;
    let genesis = write_genesis(&dir.join(format!("host-{name}")), &envelope)?;
    Ok(Output::done(render_text(
        via, name, &written, &genesis, &cascade,
    )))
}

/// Writes the sealed genesis envelope into the host's state directory (`<host dir>/state`, its
/// root): it carries the secrets minted for the machine, so 0600 in a 0700 directory, written
/// whole, never over an existing one.
fn write_genesis(host_dir: &Path, envelope: &[u8]) -> Result<PathBuf, CliError> {
    let state = host_dir.join("state");
    create_dir(&state).map_err(init_error)?;
    let genesis = state.join(genesis_file_name);
    write_new(&genesis, envelope, secret_file_mode).map_err(init_error)?;
    Ok(genesis)
}

fn init_error(e: InitError) -> CliError {
    CliError::Init(e)
}

/// The replicas' envelope keys, from their signing keys in `dir`.
fn trusted_keys(
    dir: &Path,
    replicas: &[(u64, SocketAddr)],
) -> Result<std::collections::BTreeMap<String, String>, CliError> {
    let mut out = std::collections::BTreeMap::new();
    for (id, _) in replicas {
        let path = dir.join(format!("replica-{id}")).join("signing.key");
        let text = std::fs::read_to_string(&path).map_err(|source| CliError::Read {
            path: path.display().to_string(),
            source,
        })?;
        let bytes = decode_hex_32(text.trim()).ok_or_else(|| {
            CliError::Usage(format!(
                "{} is not a replica signing key (64 hex digits)",
                path.display()
            ))
        })?;
        let public = SigningKey::from_bytes(&bytes).verifying_key();
        out.insert(id.to_string(), encode_hex(public.as_bytes()));
    }
    Ok(out)
}

fn render_text(via: Via, name: &str, config: &Path, genesis: &Path, cascade: &PushView) -> String {
    let mut out = format!(
        "machine {name}: genesis at epoch {} written to {}\n",
        cascade.epoch,
        genesis.display()
    );
    out.push_str(&format!(
        "start it with `mesh-host --config {}`; it applies its genesis at first start\n",
        config.display()
    ));
    out.push_str(&format!(
        "the replicas reach it for later pushes once `{name} = \"<its address>\"` is in [hosts] of each replica config (restart them to read it)\n"
    ));
    if cascade.lines.is_empty() {
        out.push_str(&via.note());
    } else {
        out.push_str("its providers, cascaded in the same push:\n");
        out.push_str(&super::push::render_text(via, cascade));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn mode(path: &Path) -> u32 {
        std::fs::metadata(path).expect("stat").permissions().mode() & 0o777
    }

    #[test]
    fn a_genesis_envelope_is_0600_in_a_0700_state_directory() {
        // Issue 27 part 7: the genesis envelope carries the secrets minted for the machine.
        let dir = tempfile::tempdir().expect("tempdir");
        let host_dir = dir.path().join("host-ace");
        let genesis = write_genesis(&host_dir, b"sealed").expect("written");
        assert_eq!(std::fs::read(&genesis).expect("read"), b"sealed");
        assert_eq!(mode(&genesis), 0o600);
        assert_eq!(mode(&host_dir.join("state")), 0o700);
        assert_eq!(mode(&host_dir), 0o700);
        assert!(
            write_genesis(&host_dir, b"again").is_err(),
            "never overwritten"
        );
    }
}
