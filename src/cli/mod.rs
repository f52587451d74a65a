//! meshctl: argument parsing and rendering only; every decision is made in `core` or by a replica.
//! `Cli` is the whole command line; each subcommand lives in its own file with its logic (which
//! calls `core` or asks a replica) kept apart from its rendering.

pub mod apply;
pub mod bench;
pub mod certs;
pub mod check;
pub mod client;
pub mod context;
pub mod dev;
pub mod events;
pub mod help;
pub mod history;
pub mod init;
pub mod json;
pub mod logs;
pub mod machines;
pub mod model;
pub mod plan;
pub mod procs;
pub mod push;
pub mod render;
pub mod replicas;
pub mod settings;
pub mod snapshot;
pub mod status;
pub mod waves;

use clap::{Parser, Subcommand};
use std::path::PathBuf;

use crate::controller::api::ApiError;
use crate::core::meshfile::MeshFileError;
use crate::core::plan::PlanError;

/// Exit code: the command did what it was asked.
pub const exit_done: u8 = 0;
/// Exit code: the command failed (a replica, a host, the network).
pub const exit_failed: u8 = 1;
/// Exit code: bad usage or input (arguments, a file, a context); nothing was changed.
pub const exit_bad_input: u8 = 2;
/// Exit code: something was held (a mount move waits for `--move`).
pub const exit_held: u8 = 3;
/// Exit code of `diff` on any error (as `kubectl diff`: 0 none, 1 differences, above 1 error).
pub const exit_diff_failed: u8 = 2;
/// Exit code of `push --wait`: a module failed on a machine the push sent to.
pub const exit_module_failed: u8 = 4;
/// Exit code of `push --wait`: a machine did not report its modules ready before the timeout.
pub const exit_wait_timeout: u8 = 5;

/// The operator command line of mesh.
#[derive(Debug, Parser)]
#[command(
    name = "meshctl",
    version,
    about = "Operate a mesh: declare, plan and push, from any controller replica",
    disable_help_subcommand = true,
    after_help = "Exit codes: 0 done; 1 failed (for push: a send not confirmed applied); \
2 bad usage or input (nothing was changed); \
3 something was held (a mount move waits for `push <machine> --move <module>`); \
4 push --wait: a module failed; 5 push --wait: not settled before the timeout; \
6 plan --detailed-exitcode: the push would change something; \
diff: 0 no differences, 1 differences, 2 an error. `meshctl help exit-codes` says more.\n\
The context (replica addresses, operator certificate) comes from --context, else MESH_CONTEXT, \
else ./.mesh/context.toml; `meshctl help context` says more."
)]
pub struct Cli {
    /// The context file to use (replica addresses and the operator's TLS identity).
    #[arg(long, global = true, value_name = "FILE")]
    pub context: Option<PathBuf>,
    /// The longest any one request to the cluster may take, the handshakes with its replicas
    /// included: `30s`, `500ms`, `2m` (default 60s, at most 60m). Replicas are dialled at once,
    /// so a dead one costs nothing while another answers.
    #[arg(long, global = true, value_name = "DURATION", value_parser = push::parse_wait)]
    pub timeout: Option<std::time::Duration>,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Validate a mesh file and compose every machine (the merge gate); with `--against`, show
    /// which machines' declarations a change would alter.
    Check(check::CheckArgs),
    /// Write the PKI, signing keys, a config per replica and machine, and a context file.
    Init(init::InitArgs),
    /// Run a whole mesh on loopback (3 replicas, 4 machines) until Ctrl-C.
    Dev(dev::DevArgs),
    /// Replicas (leader, epoch, reachable) and per machine: last send, last report, behind, holds.
    Status(status::StatusArgs),
    /// Store a new model revision from a mesh file; sends nothing.
    Apply(apply::ApplyArgs),
    /// What a push of one machine would send, cascade to and hold.
    Plan(plan::PlanArgs),
    /// Send declarations: to one machine (and its cascade), `--behind` or `--all`.
    Push(push::PushArgs),
    /// Show, set or clear settings layers (mesh, machine, module, module on a machine).
    #[command(subcommand)]
    Settings(settings::SettingsCommand),
    /// Model applies, sends and settings changes, oldest first, with why, who, when and epoch.
    History(history::HistoryArgs),
    /// Backups of the store.
    #[command(subcommand)]
    Snapshot(snapshot::SnapshotCommand),
    /// Machines joining the running mesh.
    #[command(subcommand)]
    Machines(machines::MachinesCommand),
    /// Certificates: renew, reload, list, revoke.
    #[command(subcommand)]
    Certs(certs::CertsCommand),
    /// The cluster's replicas: list, add (after `init --add-replica`), remove.
    #[command(subcommand)]
    Replicas(replicas::ReplicasCommand),
    /// Module output from a machine, read by its mesh-host through a replica: the last
    /// `--lines` of each stream, then new lines with `--follow`.
    Logs(logs::LogsArgs),
    /// What happened to the fleet (modules failed, restarted, recovered; hosts silent and back;
    /// leader changes; pushes, holds, trust changes), from the leader's event log; `--follow`
    /// prints new events as they happen, until Ctrl-C.
    Events(events::EventsArgs),
    /// The stored model as a mesh.toml: `model show [--revision N]`.
    #[command(subcommand)]
    Model(model::ModelCommand),
    /// Compare a mesh file with the stored model before anything is stored: exit 0 no
    /// differences, 1 differences, 2 an error (as `kubectl diff`).
    Diff(model::DiffArgs),
    /// Store a new model revision equal to an earlier one's model; sends nothing (`plan` shows
    /// what a push would send, `push` sends it).
    Rollback(model::RollbackArgs),
    /// Write load through the operator API, shaped like `etcdctl check perf`: `--load s|m|l|xl`;
    /// prints writes/s, p50, p99, slowest and stddev, exits 1 below the load's target.
    Bench(bench::BenchArgs),
    /// Write a shell completion script to stdout, e.g.
    /// `meshctl completions bash > /etc/bash_completion.d/meshctl`.
    Completions(help::CompletionsArgs),
    /// Help on a command or a topic: `meshctl help push`, `meshctl help exit-codes`,
    /// `meshctl help context`.
    Help(help::HelpArgs),
}

impl Command {
    /// Whether the command was asked for `--json` (then its errors are JSON on stdout too).
    pub fn wants_json(&self) -> bool {
        match self {
            Command::Check(a) => a.json,
            Command::Status(a) => a.json,
            Command::History(a) => a.json,
            Command::Apply(a) => a.json,
            Command::Plan(a) => a.json,
            Command::Push(a) => a.json,
            Command::Settings(c) => c.wants_json(),
            Command::Snapshot(snapshot::SnapshotCommand::Save { json, .. }) => *json,
            Command::Replicas(replicas::ReplicasCommand::List(a)) => a.json,
            Command::Certs(certs::CertsCommand::List(a)) => a.json,
            Command::Logs(a) => a.json,
            Command::Events(a) => a.json,
            Command::Model(model::ModelCommand::Show(a)) => a.json,
            Command::Diff(a) => a.json,
            Command::Rollback(a) => a.json,
            Command::Init(_)
            | Command::Dev(_)
            | Command::Machines(_)
            | Command::Certs(_)
            | Command::Replicas(_)
            | Command::Bench(_)
            | Command::Completions(_)
            | Command::Help(_) => false,
        }
    }
}

/// `--json` for read commands.
#[derive(Debug, Clone, clap::Args)]
pub struct JsonArgs {
    /// Print the answer as JSON instead of lines.
    #[arg(long)]
    pub json: bool,
}

/// Why a meshctl command failed. Each renders as one line naming the thing, what is wrong and
/// what to do (a bad mesh file renders one line per problem).
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    #[error("cannot read {path}: {source}; check the path and its permissions")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("cannot write {path}: {source}; check the directory exists and is writable")]
    Write {
        path: String,
        source: std::io::Error,
    },
    #[error("{0}")]
    BadFile(MeshFileError),
    #[error("{file}: {source}")]
    Plan { file: String, source: PlanError },
    /// Arguments that cannot work together or miss something; refused before anything is sent.
    #[error("{0}")]
    Usage(String),
    #[error(transparent)]
    Context(#[from] context::ContextError),
    #[error(transparent)]
    Client(#[from] client::ClientError),
    #[error("{0}")]
    Api(ApiError),
    /// A model upload that stopped part way (`message` says where); its exit code and `--json`
    /// kind are those of `cause`.
    #[error("{message}")]
    UploadStopped {
        message: String,
        cause: Box<CliError>,
    },
    #[error(transparent)]
    Init(#[from] init::InitError),
    #[error(transparent)]
    Dev(#[from] dev::DevError),
    #[error("cannot render the answer: {0}; this is a bug in meshctl, report it")]
    Render(String),
    /// `diff` failed: exit 2 whatever the cause, as `kubectl diff` (1 means differences).
    #[error(transparent)]
    DiffFailed(Box<CliError>),
}

impl CliError {
    pub fn exit_code(&self) -> u8 {
        match self {
            CliError::Read { .. } | CliError::BadFile(_) | CliError::Usage(_) => exit_bad_input,
            CliError::Context(e) => e.exit_code(),
            CliError::Client(e) => e.exit_code(),
            CliError::Api(e) => match e.exit_code() {
                2 => exit_bad_input,
                _ => exit_failed,
            },
            CliError::Init(e) => e.exit_code(),
            CliError::UploadStopped { cause, .. } => cause.exit_code(),
            CliError::DiffFailed(_) => exit_diff_failed,
            CliError::Write { .. }
            | CliError::Plan { .. }
            | CliError::Dev(_)
            | CliError::Render(_) => exit_failed,
        }
    }
}

/// What a command prints on stdout and the exit code it ends with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Output {
    pub text: String,
    pub code: u8,
}

impl Output {
    pub fn done(text: String) -> Output {
        Output {
            text,
            code: exit_done,
        }
    }
}

/// Runs one command and returns what to print on stdout and the exit code. With `--json`, an
/// error is a JSON document on stdout (schema `mesh/v1`) with the exit code it has without.
pub fn run(cli: Cli) -> Result<Output, CliError> {
    let as_json = cli.command.wants_json();
    match run_command(cli) {
        Err(e) if as_json => Ok(Output {
            text: json::error_document(&e),
            code: e.exit_code(),
        }),
        other => other,
    }
}

fn run_command(cli: Cli) -> Result<Output, CliError> {
    if let Some(limit) = cli.timeout {
        client::limit_requests(limit);
    }
    let ctx = cli.context;
    match cli.command {
        Command::Check(args) => check::run(&args).map(Output::done),
        Command::Init(args) => init::run(&args).map(Output::done),
        Command::Dev(args) => dev::run(&args).map(Output::done),
        Command::Status(args) => status::run(ctx.as_deref(), &args),
        Command::Apply(args) => apply::run(ctx.as_deref(), &args),
        Command::Plan(args) => plan::run(ctx.as_deref(), &args),
        Command::Push(args) => push::run(ctx.as_deref(), &args),
        Command::Settings(cmd) => settings::run(ctx.as_deref(), &cmd),
        Command::History(args) => history::run(ctx.as_deref(), &args),
        Command::Snapshot(cmd) => snapshot::run(ctx.as_deref(), &cmd),
        Command::Machines(cmd) => machines::run(ctx.as_deref(), &cmd),
        Command::Certs(cmd) => certs::run(ctx.as_deref(), &cmd),
        Command::Replicas(cmd) => replicas::run(ctx.as_deref(), &cmd),
        Command::Logs(args) => logs::run(ctx.as_deref(), &args),
        Command::Events(args) => events::run(ctx.as_deref(), &args),
        Command::Bench(args) => bench::run(ctx.as_deref(), &args),
        Command::Model(cmd) => model::run(ctx.as_deref(), &cmd),
        Command::Diff(args) => {
            model::diff(ctx.as_deref(), &args).map_err(|e| CliError::DiffFailed(Box::new(e)))
        }
        Command::Rollback(args) => model::rollback(ctx.as_deref(), &args),
        Command::Completions(args) => help::completions(args.shell).map(Output::done),
        Command::Help(args) => help::help(&args).map(Output::done),
    }
}

/// `--why` is required by every command that changes something; refused locally when missing or
/// blank, so nothing reaches a replica without a reason.
/// A warning that does not stop the command: on stderr, so `--json` output stays one document.
pub fn warn(line: &str) {
    eprintln!("meshctl: warning: {line}");
}

pub fn require_why(command: &str, why: Option<&str>) -> Result<String, CliError> {
    match why.map(str::trim) {
        Some(w) if !w.is_empty() => Ok(w.to_string()),
        _ => Err(CliError::Usage(format!(
            "{command} needs --why \"<reason>\": every change keeps its reason with the record; add --why and run it again"
        ))),
    }
}
