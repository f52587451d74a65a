//! `meshctl certs`: rotation and revocation (issue 15 parts 4–5, decisions 0170–0172).
//!
//! - `certs renew <principal>` issues a fresh certificate and key from the CA key in the directory
//!   `meshctl init` wrote and replaces the principal's files there; the process takes it at its
//!   next reload.
//! - `certs reload` asks every replica of the context, one by one, to reload its files.
//! - `certs list` shows what one replica knows: its own certificate, its peers' from their last
//!   handshakes, the trusted CA count, the deny list, and what expires within 30 days.
//! - `certs revoke <principal or serial> --why W` adds to the deny list through Raft.
//! - `certs issue operator:<name> --role R` issues a new operator's certificate stating its role
//!   (decision 0295) and a context file that uses it.

use std::path::{Path, PathBuf};

use mesh_transport::{Ca, Principal, Role, Validity};

use super::context::{self, Context};
use super::render::{self, time_ms};
use super::{CliError, Output, client, exit_failed};
use crate::controller::api::{Body, Request};
use crate::controller::certs::{CertView, CertsView, ReloadView, expiry_warning_days};

#[derive(Debug, clap::Subcommand)]
pub enum CertsCommand {
    /// Issue a fresh certificate and key for a principal from the CA key in the init directory
    /// and replace its files there; then reload the process (`certs reload`, or SIGHUP).
    Renew(RenewArgs),
    /// Ask every replica of the context to reload its certificate, key and CA set from its files.
    Reload,
    /// Show what a replica knows of the cluster's certificates, the CA count and the deny list.
    List(super::JsonArgs),
    /// Revoke a certificate (by serial, as `certs list` shows it) or every certificate of a
    /// principal; every replica refuses it at its next handshake and closes its connections.
    Revoke(RevokeArgs),
    /// Issue a certificate for a new operator, stating what it may ask (`--role`), from the CA
    /// key in the init directory, with a context file that uses it.
    Issue(IssueArgs),
}

#[derive(Debug, clap::Args)]
pub struct IssueArgs {
    /// `operator:<name>`, a name not issued in the directory yet.
    pub principal: String,
    /// What it may ask: `viewer` (status, plan, history, logs, settings show, lists),
    /// `operator` (also apply, settings set/clear, push, machines add) or `admin` (everything:
    /// also certificates, replicas and backups). No default: say what it may do.
    #[arg(long)]
    pub role: Role,
    #[command(flatten)]
    pub issuer: IssuerArgs,
}

/// Where a certificate is issued from, for `certs issue` and `certs renew` alike.
#[derive(Debug, clap::Args)]
pub struct IssuerArgs {
    /// The directory `meshctl init` wrote; defaults to the context file's directory.
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// The CA certificate to issue from (default: DIR/ca.pem). During a CA switch, the new CA's.
    #[arg(long)]
    pub ca_cert: Option<PathBuf>,
    /// The CA key to issue from (default: DIR/ca.key).
    #[arg(long)]
    pub ca_key: Option<PathBuf>,
    /// How long the certificate is valid, in days.
    #[arg(long, default_value_t = super::init::cert_validity_days)]
    pub days: u32,
}

#[derive(Debug, clap::Args)]
pub struct RenewArgs {
    /// `replica:<id>`, `host:<machine>` or `operator:<name>`.
    pub principal: String,
    #[command(flatten)]
    pub issuer: IssuerArgs,
    /// An operator's new role (`viewer`, `operator`, `admin`); without it the renewed certificate
    /// states the role the current one states.
    #[arg(long)]
    pub role: Option<Role>,
}

#[derive(Debug, clap::Args)]
pub struct RevokeArgs {
    /// A principal (`host:ace`) or a certificate serial (hex).
    pub target: String,
    /// Why it is revoked; kept with the entry.
    #[arg(long)]
    pub why: Option<String>,
}

/// Longest validity `renew` issues, in days (as `init`).
pub const renew_days_max: u32 = super::init::cert_validity_days;

pub fn run(ctx: Option<&Path>, cmd: &CertsCommand) -> Result<Output, CliError> {
    match cmd {
        CertsCommand::Renew(args) => renew(ctx, args).map(Output::done),
        CertsCommand::Issue(args) => issue(ctx, args).map(Output::done),
        CertsCommand::Reload => reload(ctx),
        CertsCommand::List(args) => {
            let (via, body) = render::ask(ctx, &Request::CertsList)?;
            match body {
                Body::Certs(view) if args.json => super::json::output(
                    Some(via),
                    super::json::CertsJson::new(&view, now_ms()),
                    super::exit_done,
                ),
                Body::Certs(view) => Ok(Output::done(render_list(&view, now_ms()))),
                other => Err(render::unexpected(
                    render::Via {
                        replica: 0,
                        forwarded_by: None,
                    },
                    "certs list",
                    &other,
                )),
            }
        }
        CertsCommand::Revoke(args) => {
            let why = super::require_why("certs revoke", args.why.as_deref())?;
            let request = Request::CertsRevoke {
                target: args.target.clone(),
                why,
            };
            let (via, body) = render::ask(ctx, &request)?;
            let Body::CertsRevoked { target, entries } = body else {
                return Err(render::unexpected(via, "certs revoke", &body));
            };
            Ok(Output::done(format!(
                "revoked {target} (the deny list holds {entries}); every replica refuses it at its next handshake and closes its open connections, and hosts refuse it once a push carries the list\n{}",
                via.note()
            )))
        }
    }
}

fn now_ms() -> i64 {
    (time::OffsetDateTime::now_utc().unix_timestamp_nanos() / 1_000_000) as i64
}

/// Where `init` put a principal's certificate and key, under `dir`.
pub fn files_of(dir: &Path, principal: &Principal) -> (PathBuf, PathBuf) {
    let sub = match principal {
        Principal::Replica(id) => format!("replica-{id}"),
        Principal::Host(name) => format!("host-{name}"),
        Principal::Operator(_) => "operator".to_string(),
    };
    (
        dir.join(&sub).join("cert.pem"),
        dir.join(&sub).join("key.pem"),
    )
}

fn renew(ctx: Option<&Path>, args: &RenewArgs) -> Result<String, CliError> {
    let principal: Principal = args.principal.parse().map_err(|e| {
        CliError::Usage(format!(
            "certs renew: {e}; name it as replica:<id>, host:<machine> or operator:<name>"
        ))
    })?;
    if args.role.is_some() && !matches!(principal, Principal::Operator(_)) {
        return Err(CliError::Usage(format!(
            "certs renew: --role is for operator certificates; {principal}'s states none"
        )));
    }
    let issuer = Issuer::load(ctx, "certs renew", &args.issuer)?;
    let (dir, ca_cert, ca) = (issuer.dir, issuer.ca_cert, issuer.ca);
    // An operator `certs issue` made is in operator-<name>/, init's own in operator/.
    let issued_dir = dir.join(operator_sub(&principal));
    let (cert, key) = match principal {
        Principal::Operator(_) if issued_dir.join("cert.pem").exists() => {
            (issued_dir.join("cert.pem"), issued_dir.join("key.pem"))
        }
        _ => files_of(&dir, &principal),
    };
    if !cert.exists() {
        return Err(CliError::Usage(format!(
            "certs renew: {} does not exist, so {principal} was never issued a certificate in {}; check the principal and --dir",
            cert.display(),
            dir.display()
        )));
    }
    let mut role = None;
    if let Principal::Operator(name) = &principal {
        let current = mesh_transport::Identity::load(&ca_cert, &cert, &key).ok();
        let Some(current) = current.filter(|i| i.principal() == &principal) else {
            return Err(CliError::Usage(format!(
                "certs renew: {} is not operator:{name}'s certificate; renew the operator that `meshctl init --operator` named",
                cert.display()
            )));
        };
        // A renewal changes the key and the dates; the role only when asked (decision 0295).
        role = args.role.or(current.role());
    }
    let issued = ca
        .issue_with_role(&principal, role, Validity::days_from_now(args.issuer.days))
        .map_err(|e| CliError::Usage(format!("certs renew: {e}")))?;
    let info =
        mesh_transport::Identity::from_pem(ca.cert_pem(), issued.cert_pem(), issued.key_pem())
            .ok()
            .and_then(|i| i.cert_info());
    issued.replace(&cert, &key).map_err(|e| CliError::Write {
        path: cert.display().to_string(),
        source: std::io::Error::other(e.to_string()),
    })?;
    let (serial, until) = match &info {
        Some(i) => (
            i.serial.clone(),
            time_ms((i.not_after.unix_timestamp_nanos() / 1_000_000) as u64),
        ),
        None => ("?".into(), "?".into()),
    };
    let how = match principal {
        Principal::Replica(_) => "`meshctl certs reload` (or SIGHUP to its meshd)",
        Principal::Host(_) => "SIGHUP to its mesh-host (`systemctl reload mesh-host`)",
        Principal::Operator(_) => "nothing: meshctl reads it at every command",
    };
    let stated = match role {
        Some(role) => format!(", role {role}"),
        None => String::new(),
    };
    Ok(format!(
        "renewed {principal}{stated}: serial {serial}, valid until {until}\nwrote {} and {}\nto take it: {how}\n",
        cert.display(),
        key.display()
    ))
}

/// The directory `certs issue` writes operator `name`'s files to, under the init directory;
/// `init`'s own operator is in `operator/` (`files_of`).
fn operator_sub(principal: &Principal) -> String {
    match principal {
        Principal::Operator(name) => format!("operator-{name}"),
        other => other.to_string(),
    }
}

/// The CA a command issues from, and the init directory it writes into.
struct Issuer {
    dir: PathBuf,
    ca_cert: PathBuf,
    ca: Ca,
}

impl Issuer {
    /// The CA in `dir` (default: the context file's directory), or at `ca_cert` and `ca_key`.
    fn load(ctx: Option<&Path>, what: &str, args: &IssuerArgs) -> Result<Issuer, CliError> {
        let (dir, ca_cert, ca_key, days) = (&args.dir, &args.ca_cert, &args.ca_key, args.days);
        if days == 0 || days > renew_days_max {
            return Err(CliError::Usage(format!(
                "{what}: --days must be 1..={renew_days_max}"
            )));
        }
        let dir = match dir {
            Some(d) => d.clone(),
            None => context_dir(&context::resolve(ctx)?),
        };
        let ca_cert = ca_cert.clone().unwrap_or_else(|| dir.join("ca.pem"));
        let ca_key = ca_key.clone().unwrap_or_else(|| dir.join("ca.key"));
        let ca = Ca::load(&ca_cert, &ca_key).map_err(|e| {
            CliError::Usage(format!(
                "{what}: cannot load the CA ({}, {}): {e}; pass --dir with the directory `meshctl init` wrote, or --ca-cert/--ca-key",
                ca_cert.display(),
                ca_key.display()
            ))
        })?;
        Ok(Issuer { dir, ca_cert, ca })
    }
}

fn context_dir(context: &Context) -> PathBuf {
    context
        .path
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from("."))
}

/// `certs issue`: a new operator's certificate stating `--role`, in DIR/operator-<name>/, and
/// DIR/context-<name>.toml naming the context's replicas and that certificate.
fn issue(ctx: Option<&Path>, args: &IssueArgs) -> Result<String, CliError> {
    let principal: Principal = args.principal.parse().map_err(|e| {
        CliError::Usage(format!(
            "certs issue: {e}; name the new operator as operator:<name>"
        ))
    })?;
    let Principal::Operator(name) = &principal else {
        return Err(CliError::Usage(format!(
            "certs issue: {principal} is not an operator; a replica's certificate comes from `meshctl init --add-replica`, a machine's from `meshctl machines add`, a new key for either from `meshctl certs renew`"
        )));
    };
    let context = context::resolve(ctx)?;
    let issuer = Issuer::load(ctx, "certs issue", &args.issuer)?;
    let sub = operator_sub(&principal);
    let sub_dir = issuer.dir.join(&sub);
    let (cert, key) = (sub_dir.join("cert.pem"), sub_dir.join("key.pem"));
    let context_path = issuer.dir.join(format!("context-{name}.toml"));
    for path in [&cert, &key, &context_path] {
        if path.exists() {
            return Err(CliError::Usage(format!(
                "certs issue: {} exists, so {principal} was issued already; pick another name, or change its role with `meshctl certs renew {principal} --role {}`",
                path.display(),
                args.role
            )));
        }
    }
    let issued = issuer
        .ca
        .issue_with_role(
            &principal,
            Some(args.role),
            Validity::days_from_now(args.issuer.days),
        )
        .map_err(|e| CliError::Usage(format!("certs issue: {e}")))?;
    // 0700, as every directory holding a key (decision 0296).
    super::init::create_dir(&sub_dir)?;
    issued.write(&cert, &key).map_err(|e| CliError::Write {
        path: cert.display().to_string(),
        source: std::io::Error::other(e.to_string()),
    })?;
    let file = context::ContextFile {
        replicas: context
            .replicas
            .iter()
            .map(|(id, addr)| (id.to_string(), addr.to_string()))
            .collect(),
        tls: context::ContextTls {
            ca: issuer
                .ca_cert
                .strip_prefix(&issuer.dir)
                .map(Path::to_path_buf)
                .unwrap_or_else(|_| issuer.ca_cert.clone()),
            cert: PathBuf::from(&sub).join("cert.pem"),
            key: PathBuf::from(&sub).join("key.pem"),
        },
    };
    super::init::write_toml(&context_path, &file)?;
    Ok(format!(
        "issued {principal} with role {}: wrote {} and {}\nits context: {} (hand the three files and ca.pem over; `MESH_CONTEXT={} meshctl status`)\n",
        args.role,
        cert.display(),
        key.display(),
        context_path.display(),
        context_path.display()
    ))
}

fn reload(ctx: Option<&Path>) -> Result<Output, CliError> {
    let context = context::resolve(ctx)?;
    let mut text = String::new();
    let mut failed = 0;
    for &(id, addr) in &context.replicas {
        let one = Context {
            replicas: vec![(id, addr)],
            ..context.clone()
        };
        let line = match client::ask(&one, &Request::CertsReload) {
            Ok(answer) => match answer.body {
                Ok(Body::CertsReloaded(view)) => render_reload(&view),
                Ok(other) => {
                    failed += 1;
                    format!(
                        "replica {id}: answered {other:?}, not a reload; are meshctl and meshd the same version?"
                    )
                }
                Err(e) => {
                    failed += 1;
                    format!("replica {id}: {e}")
                }
            },
            Err(e) => {
                failed += 1;
                format!("replica {id} ({addr}): not reloaded: {e}")
            }
        };
        text.push_str(&line);
        text.push('\n');
    }
    let code = if failed == 0 {
        super::exit_done
    } else {
        text.push_str(&format!(
            "{failed} of {} replicas did not reload; they serve the certificates they had\n",
            context.replicas.len()
        ));
        exit_failed
    };
    Ok(Output { text, code })
}

fn render_reload(view: &ReloadView) -> String {
    let own = match &view.own {
        Some(c) => format!(
            "serial {} until {}",
            c.serial,
            time_ms(c.not_after_ms.max(0) as u64)
        ),
        None => "no certificate".into(),
    };
    format!(
        "replica {}: reloaded, {own}, {} CA{} trusted, {} connection{} closed",
        view.replica,
        view.cas,
        if view.cas == 1 { "" } else { "s" },
        view.closed,
        if view.closed == 1 { "" } else { "s" }
    )
}

/// The ROLE column of `certs list`: an operator's role, `admin (unstated)` for an operator
/// certificate from before roles (decision 0295), `-` for replicas and hosts.
fn role_shown(c: &CertView) -> String {
    match c.role {
        Some(role) => role.to_string(),
        None if c.principal.starts_with("operator:") => {
            format!("{} (unstated)", crate::controller::roles::role_unstated)
        }
        None => "-".to_string(),
    }
}

/// The warning line for a certificate expiring soon (or expired), as `status` prints it.
pub fn expiry_line(c: &CertView, now_ms: i64) -> String {
    let days = (c.not_after_ms - now_ms).div_euclid(86_400_000);
    let when = time_ms(c.not_after_ms.max(0) as u64);
    let principal = if c.principal.is_empty() {
        "<no principal>"
    } else {
        &c.principal
    };
    if days < 0 {
        format!(
            "WARNING: certificate {principal} serial {} EXPIRED at {when}; renew it with `meshctl certs renew {principal}` and reload",
            c.serial
        )
    } else {
        format!(
            "WARNING: certificate {principal} serial {} expires at {when} (in {days} days); renew it with `meshctl certs renew {principal}` and reload",
            c.serial
        )
    }
}

fn render_list(view: &CertsView, now: i64) -> String {
    let mut out = format!(
        "replica {} trusts {} CA{}\n",
        view.replica,
        view.cas,
        if view.cas == 1 {
            ""
        } else {
            "s (a CA switch is open)"
        }
    );
    out.push_str(&format!(
        "{:<20} {:<18} {:<42} EXPIRES\n",
        "PRINCIPAL", "ROLE", "SERIAL"
    ));
    let line = |c: &CertView, note: &str| {
        format!(
            "{:<20} {:<18} {:<42} {}{note}\n",
            c.principal,
            role_shown(c),
            c.serial,
            time_ms(c.not_after_ms.max(0) as u64)
        )
    };
    if let Some(own) = &view.own {
        out.push_str(&line(own, "  (this replica)"));
    }
    for c in &view.peers {
        out.push_str(&line(c, ""));
    }
    let window = expiry_warning_days * 86_400_000;
    for c in view.own.iter().chain(&view.peers) {
        if c.not_after_ms - now <= window {
            out.push_str(&expiry_line(c, now));
            out.push('\n');
        }
    }
    if view.denied.is_empty() {
        out.push_str("deny list: empty\n");
    } else {
        out.push_str(&format!("deny list ({}):\n", view.denied.len()));
        for d in &view.denied {
            out.push_str(&format!(
                "  {} — {} ({}, {})\n",
                d.target,
                d.why,
                d.actor,
                time_ms(d.time_ms)
            ));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expiry_warning_names_the_certificate_and_the_way_out() {
        // Rotation: a warning is one line naming the certificate and `certs renew`.
        let c = CertView {
            principal: "host:ace".into(),
            serial: "3fa1".into(),
            not_after_ms: 10 * 86_400_000 + 1,
            role: None,
        };
        let line = expiry_line(&c, 0);
        assert!(line.contains("host:ace serial 3fa1"), "{line}");
        assert!(line.contains("in 10 days"), "{line}");
        assert!(line.contains("meshctl certs renew host:ace"), "{line}");
        let gone = expiry_line(&c, 11 * 86_400_000);
        assert!(gone.contains("EXPIRED"), "{gone}");
    }
}
