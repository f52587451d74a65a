//! `--json`: meshctl's output for programs, schema `mesh/v1` (described in `docs/json.md`).
//! These view types are made for the reader and are the only thing `--json` prints: the API's
//! own types never reach stdout, so the wire can change without breaking a script. Digests are
//! lower-case hex, times RFC 3339 in UTC, every union carries a lower-case `kind` tag, scopes
//! and push targets are strings (`machine/ace`), and diffs are structured entries.

use serde::Serialize;

use super::check::{CheckOutcome, MachineChange, MachineCheck};
use super::push::{WaitOutcome, Waited};
use super::render::Via;
use super::waves::{PlannedWave, WaveRun};
use super::{CliError, Output};
use crate::controller::api::{
    HistoryItem, MachineView, PlanView, PlannedChange, PushEvent, PushLine, PushOutcome,
    PushTarget, PushView, ReplicaView, SettingsView, StatusView,
};
use crate::controller::certs::{CertView, CertsView, expiry_warning_days};
use crate::controller::members::{MemberView, ReplicasView};
use crate::core::report::{Exit, Health, ModuleState, ModuleStatus};
use crate::core::settings::{Layer, Scope};
use crate::core::summary::{Change, ItemChange};
use crate::core::wire::LogChunk;
use crate::store::command::{HeldMount, ModelChange, SendRecord, SettingsChange};

/// The schema every document names in its `schema` field. A change a reader could trip on
/// (a field removed, renamed or retyped, a meaning changed) needs `mesh/v2`.
pub const schema: &str = "mesh/v1";

/// Prefix of a setting or env value in a diff that the store no longer holds in the clear.
pub const digest_prefix: &str = "digest:";

/// Every successful `--json` answer: `{"schema", "replica", "forwarded_by", "answer"}`.
#[derive(Debug, Serialize)]
pub struct Document<T: Serialize> {
    pub schema: &'static str,
    /// The replica that did the work; `null` for commands that ask none (`check`).
    pub replica: Option<u64>,
    /// The replica that forwarded the request to the leader, if any.
    pub forwarded_by: Option<u64>,
    pub answer: T,
}

/// A failed command with `--json`: `{"schema", "error": {"kind", "cause", "exit_code", "message"}}`.
#[derive(Debug, Serialize)]
pub struct ErrorDocument {
    pub schema: &'static str,
    pub error: ErrorJson,
}

#[derive(Debug, Serialize)]
pub struct ErrorJson {
    /// `usage`, `invalid`, `unavailable`, `refused` or `failed`.
    pub kind: &'static str,
    /// What went wrong, by a stable name (`apply.revision_moved`, `not_leader`, `usage.bad_file`):
    /// one per error variant, never renamed or reused (decision 0210).
    pub cause: &'static str,
    /// The exit code meshctl ends with (the same as without `--json`).
    pub exit_code: u8,
    /// The one line meshctl prints on stderr without `--json` (a bad mesh file: one line per
    /// problem).
    pub message: String,
}

/// The document of one answer, on one line.
pub fn document<T: Serialize>(via: Option<Via>, answer: T) -> Result<String, CliError> {
    let doc = Document {
        schema,
        replica: via.map(|v| v.replica),
        forwarded_by: via.and_then(|v| v.forwarded_by),
        answer,
    };
    let text =
        serde_json::to_string(&doc).map_err(|e| CliError::Render(format!("as JSON: {e}")))?;
    Ok(format!("{text}\n"))
}

/// What a command with `--json` prints and exits with.
pub fn output<T: Serialize>(via: Option<Via>, answer: T, code: u8) -> Result<Output, CliError> {
    Ok(Output {
        text: document(via, answer)?,
        code,
    })
}

/// The error document for `e`, on one line.
pub fn error_document(e: &CliError) -> String {
    let doc = ErrorDocument {
        schema,
        error: ErrorJson {
            kind: error_kind(e),
            cause: error_cause(e),
            exit_code: e.exit_code(),
            message: e.to_string(),
        },
    };
    match serde_json::to_string(&doc) {
        Ok(text) => format!("{text}\n"),
        // Only strings and numbers: serde_json cannot fail on them, but never print nothing.
        Err(_) => format!(
            "{{\"schema\":\"{schema}\",\"error\":{{\"kind\":\"failed\",\"cause\":\"render\",\"exit_code\":{},\"message\":\"meshctl could not render its error as JSON\"}}}}\n",
            e.exit_code()
        ),
    }
}

/// `usage`: refused by meshctl before anything was asked (arguments, files, the context);
/// `invalid`: a replica found the request bad; `unavailable`: no replica or leader could take it;
/// `refused`: a replica or the store refused it, nothing was written; `failed`: anything else.
pub fn error_kind(e: &CliError) -> &'static str {
    use super::client::ClientError;
    match e {
        CliError::Read { .. }
        | CliError::BadFile(_)
        | CliError::Usage(_)
        | CliError::Context(_)
        | CliError::Plan { .. } => "usage",
        CliError::Client(ClientError::Identity { .. }) => "usage",
        CliError::Client(ClientError::Unreachable { .. }) => "unavailable",
        CliError::Client(ClientError::Refused { .. }) => "refused",
        CliError::Client(_) => "failed",
        CliError::Api(e) => e.class().name(),
        CliError::UploadStopped { cause, .. } | CliError::DiffFailed(cause) => error_kind(cause),
        CliError::Init(e) if e.exit_code() == super::exit_bad_input => "usage",
        CliError::Write { .. } | CliError::Init(_) | CliError::Dev(_) | CliError::Render(_) => {
            "failed"
        }
    }
}

/// The stable name of what went wrong (`error.cause`): the API error's own for a replica's answer
/// ([`crate::controller::api::ApiError::cause`]), else meshctl's: `usage.*` refused before asking, `client.*` asking
/// failed, and `init`, `dev`, `write`, `render`.
pub fn error_cause(e: &CliError) -> &'static str {
    use super::client::ClientError;
    match e {
        CliError::Read { .. } => "usage.read",
        CliError::BadFile(_) => "usage.bad_file",
        CliError::Usage(_) => "usage.arguments",
        CliError::Context(_) => "usage.context",
        CliError::Plan { .. } => "usage.plan_file",
        CliError::Client(ClientError::Identity { .. }) => "client.identity",
        CliError::Client(ClientError::Unreachable { .. }) => "client.unreachable",
        CliError::Client(ClientError::Refused { .. }) => "client.refused",
        CliError::Client(_) => "client.failed",
        CliError::Api(e) => e.cause(),
        CliError::UploadStopped { cause, .. } | CliError::DiffFailed(cause) => error_cause(cause),
        CliError::Init(_) => "init",
        CliError::Dev(_) => "dev",
        CliError::Write { .. } => "write",
        CliError::Render(_) => "render",
    }
}

/// A time in ms since the Unix epoch, written as RFC 3339 in UTC with milliseconds:
/// `2026-11-30T09:42:57.120Z`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Time(pub u64);

impl Time {
    pub fn rfc3339(self) -> Option<String> {
        let nanos = i128::from(self.0) * 1_000_000;
        let t = time::OffsetDateTime::from_unix_timestamp_nanos(nanos).ok()?;
        Some(format!(
            "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}.{:03}Z",
            t.year(),
            u8::from(t.month()),
            t.day(),
            t.hour(),
            t.minute(),
            t.second(),
            t.millisecond()
        ))
    }
}

impl Serialize for Time {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self.rfc3339() {
            Some(text) => s.serialize_str(&text),
            None => Err(serde::ser::Error::custom(format!(
                "time {} ms since the Unix epoch is past the year 9999",
                self.0
            ))),
        }
    }
}

// ---- status ----

/// `status --json`.
#[derive(Debug, Serialize)]
pub struct StatusJson {
    pub revision: u64,
    pub epoch_floor: u64,
    /// Set when the answering replica found its store reset below the floor it knew.
    pub store_reset: Option<String>,
    /// The id of the replica that leads, if any.
    pub leader: Option<u64>,
    pub replicas: Vec<ReplicaJson>,
    pub machines: Vec<MachineJson>,
}

/// One replica as it answered a probe of this status request (`reachable`), or did not.
#[derive(Debug, Serialize)]
pub struct ReplicaJson {
    pub id: u64,
    pub addr: String,
    /// It said it leads.
    pub leader: bool,
    /// The term it reported; 0 when it did not answer.
    pub epoch: u64,
    pub reachable: bool,
    /// `leader`, `follower`, `candidate`, `learner` or `stopping`, as it said; `null` when it did
    /// not answer.
    pub role: Option<&'static str>,
    pub log_index: Option<u64>,
    /// Entries behind the longest log among the replicas that answered.
    pub lag: Option<u64>,
    pub answered_in_ms: Option<u64>,
}

#[derive(Debug, Serialize)]
pub struct MachineJson {
    pub name: String,
    pub behind: bool,
    /// Why it is behind, in words (`never sent`, `declaration changed`, `1 mint pending`);
    /// empty when it is not.
    pub behind_why: Vec<String>,
    pub last_send: Option<SendRefJson>,
    pub last_report: Option<ReportJson>,
    pub holds: Vec<HoldJson>,
    pub refused_reports: u64,
    pub health: Option<HealthJson>,
    /// When the leader filed the last report.
    pub report_filed: Option<Time>,
    /// How long before this answer that was, on the answering replica's clock.
    pub report_age_ms: Option<u64>,
    /// How long ago the answering leader last heard the host; `null`: not since it took office.
    pub heard_ago_ms: Option<u64>,
    /// The host refused the answering leader's envelope as older than one it holds, with nothing
    /// signed to show for it (its mark may be edited or corrupt); `null` when not.
    pub unproven_refusal: Option<String>,
    /// The answering leader refused the host's reports for size or rate in the last minute: how
    /// many, the last's age and reason; `null` when not.
    pub report_refusal: Option<String>,
    /// The answering leader has not heard the host for this long, at least its
    /// `silent_after_ms`: the host is silent; `null` when not (decision 0301).
    pub silent_for_ms: Option<u64>,
    /// What the last report says differs from the declaration the host runs, as `module: what`:
    /// the machine is drifted (decision 0305); `[]` when it runs as declared.
    pub drifted: Vec<String>,
    pub modules: Vec<ModuleJson>,
}

#[derive(Debug, Serialize)]
pub struct SendRefJson {
    pub epoch: u64,
    pub sequence: u64,
    pub digest: String,
}

#[derive(Debug, Serialize)]
pub struct ReportJson {
    pub epoch: u64,
    pub sequence: u64,
    pub report_sequence: u64,
    /// The digest the host applied; `null` when it applied nothing.
    pub applied: Option<String>,
}

#[derive(Debug, Serialize)]
pub struct HoldJson {
    pub module: String,
    pub mount: String,
    pub old_dir: String,
    pub new_dir: String,
}

/// `{"kind": "ready" | "settling" | "failing", "modules": [names not ready]}`.
#[derive(Debug, Serialize)]
pub struct HealthJson {
    pub kind: &'static str,
    pub modules: Vec<String>,
}

#[derive(Debug, Serialize)]
pub struct ModuleJson {
    pub name: String,
    /// `starting`, `waiting`, `ready`, `running`, `failed` or `stopped`.
    pub state: &'static str,
    pub waiting_for: Option<String>,
    pub error: Option<String>,
    pub restarts: u32,
    pub last_exit: Option<ExitJson>,
    pub pid: Option<u32>,
    /// What differs from its declaration on the host (`conf/broker.conf changed`); `[]` when
    /// nothing does (decision 0305).
    pub drift: Vec<String>,
}

/// `{"kind": "code", "code": 3}` or `{"kind": "signal", "signal": 9}`.
#[derive(Debug, Serialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum ExitJson {
    Code { code: i32 },
    Signal { signal: i32 },
}

impl From<&StatusView> for StatusJson {
    fn from(v: &StatusView) -> StatusJson {
        StatusJson {
            revision: v.revision,
            epoch_floor: v.epoch_floor,
            store_reset: v.store_reset.clone(),
            leader: v.replicas.iter().find(|r| r.leader).map(|r| r.id),
            replicas: v.replicas.iter().map(ReplicaJson::from).collect(),
            machines: v.machines.iter().map(MachineJson::from).collect(),
        }
    }
}

impl From<&ReplicaView> for ReplicaJson {
    fn from(r: &ReplicaView) -> ReplicaJson {
        ReplicaJson {
            id: r.id,
            addr: r.addr.clone(),
            leader: r.leader,
            epoch: r.epoch,
            reachable: r.reachable,
            role: r.said.as_ref().map(|s| role_name(s.role)),
            log_index: r.said.as_ref().and_then(|s| s.log_index),
            lag: r.said.as_ref().map(|s| s.lag),
            answered_in_ms: r.said.as_ref().map(|s| s.answered_in_ms),
        }
    }
}

/// A replica's role as `status --json` writes it.
pub fn role_name(role: mesh_raft::Role) -> &'static str {
    match role {
        mesh_raft::Role::Leader => "leader",
        mesh_raft::Role::Follower => "follower",
        mesh_raft::Role::Candidate => "candidate",
        mesh_raft::Role::Learner => "learner",
        mesh_raft::Role::Stopping => "stopping",
    }
}

impl From<&MachineView> for MachineJson {
    fn from(m: &MachineView) -> MachineJson {
        MachineJson {
            name: m.name.clone(),
            behind: m.behind,
            behind_why: m.behind_why.clone(),
            last_send: m.last_send.map(|(epoch, sequence, digest)| SendRefJson {
                epoch,
                sequence,
                digest: digest.to_string(),
            }),
            last_report: m
                .last_report
                .map(|(epoch, sequence, report_sequence, applied)| ReportJson {
                    epoch,
                    sequence,
                    report_sequence,
                    applied: applied.map(|d| d.to_string()),
                }),
            holds: m.holds.iter().map(HoldJson::from).collect(),
            refused_reports: m.refused_reports,
            health: m.health.as_ref().map(HealthJson::from),
            report_filed: m.report_filed_ms.map(Time),
            report_age_ms: m.report_age_ms,
            heard_ago_ms: m.heard_ago_ms,
            unproven_refusal: m.unproven_refusal.clone(),
            report_refusal: m.report_refusal.clone(),
            silent_for_ms: m.silent_for_ms,
            drifted: m.drifted.clone(),
            modules: m.modules.iter().map(ModuleJson::from).collect(),
        }
    }
}

impl From<&HeldMount> for HoldJson {
    fn from(h: &HeldMount) -> HoldJson {
        HoldJson {
            module: h.module.clone(),
            mount: h.mount.clone(),
            old_dir: h.old_dir.clone(),
            new_dir: h.new_dir.clone(),
        }
    }
}

impl From<&Health> for HealthJson {
    fn from(h: &Health) -> HealthJson {
        let (kind, modules) = match h {
            Health::Ready => ("ready", Vec::new()),
            Health::Settling { modules } => ("settling", modules.clone()),
            Health::Failing { modules } => ("failing", modules.clone()),
        };
        HealthJson { kind, modules }
    }
}

impl From<&ModuleStatus> for ModuleJson {
    fn from(m: &ModuleStatus) -> ModuleJson {
        let (waiting_for, error) = match &m.state {
            ModuleState::Waiting { on } => (Some(on.clone()), None),
            ModuleState::Failed { error } => (None, Some(error.clone())),
            _ => (None, None),
        };
        ModuleJson {
            name: m.name.clone(),
            state: m.state.word(),
            waiting_for,
            error,
            restarts: m.restarts,
            last_exit: m.last_exit.map(|e| match e {
                Exit::Code(code) => ExitJson::Code { code },
                Exit::Signal(signal) => ExitJson::Signal { signal },
            }),
            pid: m.pid,
            drift: m.drift.clone(),
        }
    }
}

// ---- apply ----

/// `apply --json`.
#[derive(Debug, Serialize)]
pub struct ApplyJson {
    pub revision: u64,
    /// The store already had this model: nothing was stored, and `revision` is the model revision
    /// in force (issue 25).
    pub unchanged: bool,
    /// Machines behind their last send now that the revision is stored.
    pub behind: Vec<String>,
    /// Settings scopes where the file differs from the store; not written.
    pub settings_ignored: Vec<String>,
    /// Machines the file drops that still run modules, kept with none (`--drain`).
    pub draining: Vec<String>,
}

// ---- plan and check diffs ----

/// One changed item: `{"op": "add" | "remove" | "change", "module", "path", "old", "new"}`.
#[derive(Debug, Serialize)]
pub struct ChangeJson {
    pub op: &'static str,
    pub module: String,
    /// `module` for the module as a whole; `command`, `args`, `ready`, `after`; else
    /// `<kind>/<key>`: `setting/log_level`, `env/LOG`, `file/conf/app.toml`, `mount/data`,
    /// `provision/<id>`, `grant/<id>`.
    pub path: String,
    pub old: Option<String>,
    pub new: Option<String>,
}

/// `setting log_level` → `setting/log_level`; `module`, `command`… stay as they are.
pub fn change_path(item: &str) -> String {
    match item.split_once(' ') {
        Some((kind, key)) => format!("{kind}/{key}"),
        None => item.to_string(),
    }
}

/// A setting or env value as the reader wants it: in the clear when the plan has it (the API
/// quotes it), else its digest, marked with [`digest_prefix`]. Other items pass as they are.
pub fn change_value(item: &str, value: &str) -> String {
    let clear = item.starts_with("setting ") || item.starts_with("env ");
    if !clear {
        return value.to_string();
    }
    match unquote(value) {
        Some(v) => v,
        None => format!("{digest_prefix}{value}"),
    }
}

/// Undoes Rust's `{:?}` of a string (how the plan view quotes values in the clear); `None` for
/// anything that is not such a quoted string.
pub fn unquote(text: &str) -> Option<String> {
    let inner = text.strip_prefix('"')?.strip_suffix('"')?;
    let mut out = String::new();
    let mut chars = inner.chars();
    while let Some(c) = chars.next() {
        match c {
            '"' => return None,
            '\\' => {}
            c => {
                out.push(c);
                continue;
            }
        }
        match chars.next()? {
            'n' => out.push('\n'),
            'r' => out.push('\r'),
            't' => out.push('\t'),
            '0' => out.push('\0'),
            c @ ('\\' | '"' | '\'') => out.push(c),
            'u' => {
                if chars.next()? != '{' {
                    return None;
                }
                let mut hex = String::new();
                loop {
                    match chars.next()? {
                        '}' => break,
                        h => hex.push(h),
                    }
                }
                out.push(char::from_u32(u32::from_str_radix(&hex, 16).ok()?)?);
            }
            _ => return None,
        }
    }
    Some(out)
}

impl From<&PlannedChange> for ChangeJson {
    fn from(c: &PlannedChange) -> ChangeJson {
        let op = match (&c.was, &c.now) {
            (None, _) => "add",
            (Some(_), None) => "remove",
            (Some(_), Some(_)) => "change",
        };
        ChangeJson {
            op,
            module: c.module.clone(),
            path: change_path(&c.item),
            old: c.was.as_deref().map(|v| change_value(&c.item, v)),
            new: c.now.as_deref().map(|v| change_value(&c.item, v)),
        }
    }
}

impl From<&ItemChange> for ChangeJson {
    fn from(c: &ItemChange) -> ChangeJson {
        let (op, old, new) = match &c.change {
            Change::Added { now } => ("add", None, Some(now)),
            Change::Removed { was } => ("remove", Some(was), None),
            Change::Changed { was, now } => ("change", Some(was), Some(now)),
        };
        ChangeJson {
            op,
            module: c.module.clone(),
            path: change_path(&c.item),
            old: old.map(|v| change_value(&c.item, v)),
            new: new.map(|v| change_value(&c.item, v)),
        }
    }
}

// ---- plan ----

/// `plan --json`.
#[derive(Debug, Serialize)]
pub struct PlanJson {
    /// `machine/<name>`, `behind` or `all`.
    pub target: String,
    pub moves: Vec<String>,
    pub revision: u64,
    /// What `push --plan` checks the leader would still plan.
    pub token: String,
    /// Every machine the push would send or hold, in plan order.
    pub machines: Vec<PlanMachineJson>,
    pub mints: Vec<MintJson>,
    /// Whether the push would change anything (what `--detailed-exitcode` exits 6 for).
    pub changes_anything: bool,
}

#[derive(Debug, Serialize)]
pub struct PlanMachineJson {
    pub machine: String,
    /// `send` or `hold`.
    pub action: &'static str,
    pub reason: String,
    pub changes: Vec<ChangeJson>,
    pub holds: Vec<HoldJson>,
}

#[derive(Debug, Serialize)]
pub struct MintJson {
    pub id: String,
    pub kind: String,
    /// `module@machine`.
    pub consumer: String,
    pub provider: String,
}

/// `machine/ace`, `behind`, `all`.
pub fn target_text(t: &PushTarget) -> String {
    match t {
        PushTarget::Machine(m) => format!("machine/{m}"),
        PushTarget::Behind => "behind".into(),
        PushTarget::All => "all".into(),
    }
}

impl From<&PlanView> for PlanJson {
    fn from(v: &PlanView) -> PlanJson {
        PlanJson {
            target: target_text(&v.target),
            moves: v.moves.clone(),
            revision: v.revision,
            token: v.token.clone(),
            machines: v
                .machines
                .iter()
                .map(|m| PlanMachineJson {
                    machine: m.machine.clone(),
                    action: if m.holds.is_empty() { "send" } else { "hold" },
                    reason: m.reason.clone(),
                    changes: m.changes.iter().map(ChangeJson::from).collect(),
                    holds: m.holds.iter().map(HoldJson::from).collect(),
                })
                .collect(),
            mints: v
                .mints
                .iter()
                .map(|p| MintJson {
                    id: p.id.clone(),
                    kind: p.kind.clone(),
                    consumer: p.consumer.clone(),
                    provider: p.provider.clone(),
                })
                .collect(),
            changes_anything: v.changes_anything(),
        }
    }
}

// ---- push ----

/// `push --json`: one entry per machine; `wait` only with `--wait`.
#[derive(Debug, Serialize)]
pub struct PushJson {
    pub epoch: u64,
    pub machines: Vec<PushMachineJson>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub wait: Option<Vec<WaitJson>>,
}

#[derive(Debug, Serialize)]
pub struct PushMachineJson {
    pub machine: String,
    #[serde(flatten)]
    pub outcome: PushOutcomeJson,
}

/// What happened to one machine, tagged `kind`.
#[derive(Debug, Serialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum PushOutcomeJson {
    /// Sent; the host verified and applied it.
    Applied {
        reason: String,
        sequence: u64,
        digest: String,
    },
    /// Recorded and perhaps sent, not confirmed applied.
    Sent {
        reason: String,
        sequence: u64,
        digest: String,
        error: String,
    },
    /// Not sent: a running module's mount would move.
    Held {
        reason: String,
        holds: Vec<HoldJson>,
    },
    /// The host refused the envelope.
    Refused { reason: String, refusal: String },
    /// Not sent.
    Failed { reason: String, error: String },
}

/// How one machine sent by `push --wait` settled: `kind` is `ready`, `failing` or `timeout`.
#[derive(Debug, Serialize)]
pub struct WaitJson {
    pub machine: String,
    pub sequence: u64,
    pub kind: &'static str,
    /// For a timeout, what was seen last.
    pub detail: Option<String>,
    pub modules: Vec<ModuleJson>,
}

/// `push --json` prints one of these per event as it happens, before the answer document:
/// `{"schema", "event": {"kind": "begin" | "line", …}}` (decision 0190).
#[derive(Debug, Serialize)]
pub struct EventDocument<T: Serialize> {
    pub schema: &'static str,
    pub event: T,
}

/// A streamed push's event, tagged `kind`.
#[derive(Debug, Serialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum PushEventJson {
    /// The push planned: every machine it will print a line for, sends then holds.
    Begin { epoch: u64, machines: Vec<String> },
    /// One machine settled; the same entry the answer's `machines` holds for it.
    Line { line: PushMachineJson },
}

impl From<&PushEvent> for PushEventJson {
    fn from(e: &PushEvent) -> PushEventJson {
        match e {
            PushEvent::Begin { epoch, machines } => PushEventJson::Begin {
                epoch: *epoch,
                machines: machines.clone(),
            },
            PushEvent::Line(line) => PushEventJson::Line {
                line: PushMachineJson::from(line),
            },
        }
    }
}

/// The event document of `event`, on one line.
pub fn push_event_document(event: &PushEvent) -> Result<String, CliError> {
    let doc = EventDocument {
        schema,
        event: PushEventJson::from(event),
    };
    let text =
        serde_json::to_string(&doc).map_err(|e| CliError::Render(format!("as JSON: {e}")))?;
    Ok(format!("{text}\n"))
}

impl PushJson {
    pub fn new(v: &PushView, waited: Option<&[Waited]>) -> PushJson {
        PushJson {
            epoch: v.epoch,
            machines: v.lines.iter().map(PushMachineJson::from).collect(),
            wait: waited.map(|w| w.iter().map(WaitJson::from).collect()),
        }
    }
}

impl From<&PushLine> for PushMachineJson {
    fn from(l: &PushLine) -> PushMachineJson {
        let outcome = match &l.outcome {
            PushOutcome::Applied {
                reason,
                sequence,
                digest,
            } => PushOutcomeJson::Applied {
                reason: reason.clone(),
                sequence: *sequence,
                digest: digest.to_string(),
            },
            PushOutcome::Sent {
                reason,
                sequence,
                digest,
                error,
            } => PushOutcomeJson::Sent {
                reason: reason.clone(),
                sequence: *sequence,
                digest: digest.to_string(),
                error: error.clone(),
            },
            PushOutcome::Held { reason, holds } => PushOutcomeJson::Held {
                reason: reason.clone(),
                holds: holds.iter().map(HoldJson::from).collect(),
            },
            PushOutcome::Refused { reason, refusal } => PushOutcomeJson::Refused {
                reason: reason.clone(),
                refusal: refusal.clone(),
            },
            PushOutcome::Failed { reason, error } => PushOutcomeJson::Failed {
                reason: reason.clone(),
                error: error.clone(),
            },
        };
        PushMachineJson {
            machine: l.machine.clone(),
            outcome,
        }
    }
}

impl From<&Waited> for WaitJson {
    fn from(w: &Waited) -> WaitJson {
        let (kind, detail) = match &w.outcome {
            WaitOutcome::Ready => ("ready", None),
            WaitOutcome::Failing { .. } => ("failing", None),
            WaitOutcome::TimedOut { last } => ("timeout", Some(last.clone())),
        };
        WaitJson {
            machine: w.machine.clone(),
            sequence: w.sequence,
            kind,
            detail,
            modules: w
                .view
                .iter()
                .flat_map(|v| v.modules.iter())
                .map(ModuleJson::from)
                .collect(),
        }
    }
}

// ---- waves (decision 0315) ----

/// `push --behind|--all --wave N --json`: every wave walked, in order, and where it stopped.
#[derive(Debug, Serialize)]
pub struct PushWavesJson {
    /// Every wave as split, walked or not.
    pub waves: Vec<WaveJson>,
    /// The wave (1-based) the push stopped at; `null` when every wave went.
    pub stopped_at: Option<usize>,
    /// Targets no wave sent because the push stopped first (they are still behind).
    pub not_sent: Vec<String>,
    /// What to do next when it stopped, as `push` prints it.
    pub next: Option<String>,
}

/// One wave: `state` is `done`, `failed` or `not_sent`.
#[derive(Debug, Serialize)]
pub struct WaveJson {
    pub wave: usize,
    pub state: &'static str,
    /// The wave's targets, as split.
    pub targets: Vec<String>,
    /// Targets an earlier wave's cascade already sent.
    pub skipped: Vec<String>,
    /// Every line of the wave's pushes: its targets and their cascade.
    pub machines: Vec<PushMachineJson>,
    /// How each machine sent settled.
    pub wait: Vec<WaitJson>,
    /// The machines that failed the wave.
    pub failed: Vec<String>,
    /// A push request of the wave that failed.
    pub error: Option<String>,
}

impl PushWavesJson {
    pub fn new(waves: &[Vec<String>], runs: &[WaveRun], next: Option<String>) -> PushWavesJson {
        let mut out = Vec::new();
        let mut sent: Vec<&str> = Vec::new();
        for (i, targets) in waves.iter().enumerate() {
            let Some(run) = runs.get(i) else {
                out.push(WaveJson {
                    wave: i + 1,
                    state: "not_sent",
                    targets: targets.clone(),
                    skipped: Vec::new(),
                    machines: Vec::new(),
                    wait: Vec::new(),
                    failed: Vec::new(),
                    error: None,
                });
                continue;
            };
            sent.extend(run.lines.iter().map(|l| l.machine.as_str()));
            out.push(WaveJson {
                wave: run.number,
                state: if run.stops() { "failed" } else { "done" },
                targets: run.targets.clone(),
                skipped: run.skipped.clone(),
                machines: run.lines.iter().map(PushMachineJson::from).collect(),
                wait: run.waited.iter().map(WaitJson::from).collect(),
                failed: run.failed(),
                error: run.error.clone(),
            });
        }
        let stopped_at = runs.last().filter(|r| r.stops()).map(|r| r.number);
        let not_sent = waves[runs.len().min(waves.len())..]
            .iter()
            .flatten()
            .filter(|m| !sent.contains(&m.as_str()))
            .cloned()
            .collect();
        PushWavesJson {
            waves: out,
            stopped_at,
            not_sent: if stopped_at.is_some() {
                not_sent
            } else {
                Vec::new()
            },
            next,
        }
    }
}

/// `plan --behind|--all --wave N --json`: which machines each wave would send.
#[derive(Debug, Serialize)]
pub struct PlanWavesJson {
    pub waves: Vec<PlannedWaveJson>,
}

#[derive(Debug, Serialize)]
pub struct PlannedWaveJson {
    pub wave: usize,
    pub targets: Vec<String>,
    /// Every machine the wave would send (its targets and their cascade), with why.
    pub machines: Vec<PlannedWaveMachineJson>,
    /// Targets an earlier wave's cascade would already send.
    pub skipped: Vec<String>,
}

#[derive(Debug, Serialize)]
pub struct PlannedWaveMachineJson {
    pub machine: String,
    pub reason: String,
}

impl PlanWavesJson {
    pub fn new(waves: &[Vec<String>], planned: &[PlannedWave]) -> PlanWavesJson {
        PlanWavesJson {
            waves: waves
                .iter()
                .zip(planned)
                .enumerate()
                .map(|(i, (targets, w))| PlannedWaveJson {
                    wave: i + 1,
                    targets: targets.clone(),
                    machines: w
                        .machines
                        .iter()
                        .map(|(machine, reason)| PlannedWaveMachineJson {
                            machine: machine.clone(),
                            reason: reason.clone(),
                        })
                        .collect(),
                    skipped: w.skipped.clone(),
                })
                .collect(),
        }
    }
}

// ---- settings ----

/// `settings show --json`.
#[derive(Debug, Serialize)]
pub struct SettingsShowJson {
    pub layers: Vec<LayerJson>,
    /// The merged settings of the placement the scope names; `null` for mesh and machine scopes
    /// and without a scope.
    pub effective: Option<Layer>,
    /// With `--history`: every write to the scope shown (or to every scope), oldest first.
    pub history: Vec<SettingsChangeJson>,
}

#[derive(Debug, Serialize)]
pub struct LayerJson {
    pub scope: String,
    pub settings: Layer,
}

/// `settings set --json` and `settings clear --json`: every key added, changed and removed.
#[derive(Debug, Serialize)]
pub struct SettingsSetJson {
    pub scope: String,
    pub added: Vec<String>,
    pub changed: Vec<String>,
    pub removed: Vec<String>,
}

/// One write to a settings layer.
#[derive(Debug, Serialize)]
pub struct SettingsChangeJson {
    pub id: u64,
    pub time: Time,
    pub epoch: u64,
    pub scope: String,
    /// `created`, `changed` or `cleared`.
    pub change: &'static str,
    pub before: Option<Layer>,
    pub after: Option<Layer>,
    pub actor: String,
    pub why: String,
}

impl From<&SettingsView> for SettingsShowJson {
    fn from(v: &SettingsView) -> SettingsShowJson {
        SettingsShowJson {
            layers: v
                .layers
                .iter()
                .map(|(scope, layer)| LayerJson {
                    scope: scope.to_string(),
                    settings: layer.clone(),
                })
                .collect(),
            effective: v.effective.clone(),
            history: v.history.iter().map(SettingsChangeJson::from).collect(),
        }
    }
}

impl SettingsSetJson {
    pub fn new(scope: &Scope, added: &[String], changed: &[String], removed: &[String]) -> Self {
        SettingsSetJson {
            scope: scope.to_string(),
            added: added.to_vec(),
            changed: changed.to_vec(),
            removed: removed.to_vec(),
        }
    }
}

impl From<&SettingsChange> for SettingsChangeJson {
    fn from(c: &SettingsChange) -> SettingsChangeJson {
        let change = match (&c.before, &c.after) {
            (None, _) => "created",
            (Some(_), None) => "cleared",
            (Some(_), Some(_)) => "changed",
        };
        SettingsChangeJson {
            id: c.id,
            time: Time(c.time_ms),
            epoch: c.epoch,
            scope: c.scope.to_string(),
            change,
            before: c.before.clone(),
            after: c.after.clone(),
            actor: c.actor.clone(),
            why: c.why.clone(),
        }
    }
}

// ---- history ----

/// `history --json`: `{"items": [...]}`, oldest first.
#[derive(Debug, Serialize)]
pub struct HistoryJson {
    pub items: Vec<HistoryItemJson>,
}

/// One history entry, tagged `kind`: `model`, `send`, `settings` or `revocation`.
#[derive(Debug, Serialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum HistoryItemJson {
    Model(ModelJson),
    Send(SendJson),
    Settings(SettingsChangeJson),
    Revocation(RevocationJson),
}

/// A revocation in force: `target` is `serial <hex>` or a principal (`replica:3`, `host:ace`);
/// `retired_replica` names the replica it retired (decision 0294), else `null`.
#[derive(Debug, Serialize)]
pub struct RevocationJson {
    pub target: String,
    pub retired_replica: Option<u64>,
    pub time: Time,
    pub epoch: u64,
    pub actor: String,
    pub why: String,
}

#[derive(Debug, Serialize)]
pub struct ModelJson {
    pub revision: u64,
    pub time: Time,
    pub epoch: u64,
    /// Machines whose should-be declaration this revision changed.
    pub machines_changed: Vec<String>,
    pub actor: String,
    pub why: String,
}

#[derive(Debug, Serialize)]
pub struct SendJson {
    pub machine: String,
    pub sequence: u64,
    pub time: Time,
    pub epoch: u64,
    pub digest: String,
    /// Modules whose mounts this send was allowed to move.
    pub moves: Vec<String>,
    /// The modules the send declared.
    pub modules: Vec<String>,
    pub actor: String,
    pub why: String,
}

impl HistoryJson {
    pub fn new(items: &[HistoryItem]) -> HistoryJson {
        HistoryJson {
            items: items.iter().map(HistoryItemJson::from).collect(),
        }
    }
}

impl From<&HistoryItem> for HistoryItemJson {
    fn from(item: &HistoryItem) -> HistoryItemJson {
        match item {
            HistoryItem::Model(m) => HistoryItemJson::Model(ModelJson::from(m)),
            HistoryItem::Send(s) => HistoryItemJson::Send(SendJson::from(s)),
            HistoryItem::Settings(c) => HistoryItemJson::Settings(SettingsChangeJson::from(c)),
            HistoryItem::Revocation(r) => HistoryItemJson::Revocation(RevocationJson {
                target: r.target.to_string(),
                retired_replica: crate::store::revoked::retired_replica(&r.target),
                time: Time(r.time_ms),
                epoch: r.epoch,
                actor: r.actor.clone(),
                why: r.why.clone(),
            }),
        }
    }
}

impl From<&ModelChange> for ModelJson {
    fn from(m: &ModelChange) -> ModelJson {
        ModelJson {
            revision: m.revision,
            time: Time(m.time_ms),
            epoch: m.epoch,
            machines_changed: m.changes.clone(),
            actor: m.actor.clone(),
            why: m.why.clone(),
        }
    }
}

impl From<&SendRecord> for SendJson {
    fn from(s: &SendRecord) -> SendJson {
        SendJson {
            machine: s.machine.clone(),
            sequence: s.sequence,
            time: Time(s.time_ms),
            epoch: s.epoch,
            digest: s.digest.to_string(),
            moves: s.moves.clone(),
            modules: s.summary.modules.keys().cloned().collect(),
            actor: s.actor.clone(),
            why: s.why.clone(),
        }
    }
}

// ---- snapshot ----

/// `snapshot save --json`.
#[derive(Debug, Serialize)]
pub struct SnapshotJson {
    pub file: String,
    pub bytes: u64,
    pub epoch_floor: u64,
}

// ---- check ----

/// `check --json`: `{"kind": "composed", "machines"}` or, with `--against`,
/// `{"kind": "against", "changed", "unchanged"}`.
#[derive(Debug, Serialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum CheckJson {
    Composed {
        machines: Vec<CheckMachineJson>,
    },
    Against {
        changed: Vec<CheckChangeJson>,
        unchanged: usize,
    },
}

#[derive(Debug, Serialize)]
pub struct CheckMachineJson {
    pub machine: String,
    /// Composed with placeholder secrets: comparable between two files, not with what a
    /// controller sends.
    pub digest: String,
    pub modules: Vec<String>,
    pub mints: Vec<MintJson>,
    pub grants: Vec<String>,
}

/// A machine whose declaration changes: `kind` `changed` (with its diff) or `removed`.
#[derive(Debug, Serialize)]
pub struct CheckChangeJson {
    pub machine: String,
    pub kind: &'static str,
    pub changes: Vec<ChangeJson>,
}

impl From<&CheckOutcome> for CheckJson {
    fn from(o: &CheckOutcome) -> CheckJson {
        match o {
            CheckOutcome::Composed(machines) => CheckJson::Composed {
                machines: machines.iter().map(CheckMachineJson::from).collect(),
            },
            CheckOutcome::Against { changed, unchanged } => CheckJson::Against {
                changed: changed.iter().map(CheckChangeJson::from).collect(),
                unchanged: *unchanged,
            },
        }
    }
}

impl From<&MachineCheck> for CheckMachineJson {
    fn from(m: &MachineCheck) -> CheckMachineJson {
        CheckMachineJson {
            machine: m.machine.clone(),
            digest: m.digest.to_string(),
            modules: m.modules.clone(),
            mints: m
                .mints
                .iter()
                .map(|p| MintJson {
                    id: p.id.clone(),
                    kind: p.kind.clone(),
                    consumer: p.consumer.to_string(),
                    provider: p.provider.to_string(),
                })
                .collect(),
            grants: m.grants.clone(),
        }
    }
}

impl From<&MachineChange> for CheckChangeJson {
    fn from(c: &MachineChange) -> CheckChangeJson {
        match c {
            MachineChange::Changed(d) => CheckChangeJson {
                machine: d.machine.clone(),
                kind: "changed",
                changes: d.changes.iter().map(ChangeJson::from).collect(),
            },
            MachineChange::Removed(machine) => CheckChangeJson {
                machine: machine.clone(),
                kind: "removed",
                changes: Vec::new(),
            },
        }
    }
}

// ---- replicas list ----

/// `replicas list --json`: the membership as the leader has it.
#[derive(Debug, Serialize)]
pub struct ReplicasJson {
    /// The replica that answered (the leader).
    pub answered_by: u64,
    pub members: Vec<MemberJson>,
    pub retired: Vec<RetiredJson>,
}

/// One member of the cluster.
#[derive(Debug, Serialize)]
pub struct MemberJson {
    pub id: u64,
    pub addr: String,
    /// `leader`, `voter` or `learner`.
    pub role: &'static str,
    /// It answered a probe just now.
    pub reachable: bool,
    /// Hosts know its signing key (`false` only for a learner whose key is not in the state).
    pub key_known: bool,
}

/// A retired replica: trusted by nothing, its id never used again.
#[derive(Debug, Serialize)]
pub struct RetiredJson {
    pub id: u64,
    pub why: String,
    pub actor: String,
    pub time: Time,
}

impl From<&ReplicasView> for ReplicasJson {
    fn from(v: &ReplicasView) -> ReplicasJson {
        ReplicasJson {
            answered_by: v.answered_by,
            members: v.members.iter().map(MemberJson::from).collect(),
            retired: v
                .retired
                .iter()
                .map(|r| RetiredJson {
                    id: r.id,
                    why: r.why.clone(),
                    actor: r.actor.clone(),
                    time: Time(r.time_ms),
                })
                .collect(),
        }
    }
}

impl From<&MemberView> for MemberJson {
    fn from(m: &MemberView) -> MemberJson {
        let role = match (m.leader, m.voter) {
            (true, _) => "leader",
            (false, true) => "voter",
            (false, false) => "learner",
        };
        MemberJson {
            id: m.id,
            addr: m.addr.clone(),
            role,
            reachable: m.reachable,
            key_known: m.key_known,
        }
    }
}

// ---- certs list ----

/// `certs list --json`: what one replica knows of the cluster's certificates.
#[derive(Debug, Serialize)]
pub struct CertsJson {
    /// The replica whose knowledge this is.
    pub replica: u64,
    /// CA certificates it trusts: 1, or 2 during a CA switch.
    pub cas: usize,
    /// Its own certificate; `null` if it has none loaded.
    pub own: Option<CertJson>,
    /// Each peer's certificate from its last handshake with this replica.
    pub peers: Vec<CertJson>,
    pub denied: Vec<DenyJson>,
}

/// One certificate.
#[derive(Debug, Serialize)]
pub struct CertJson {
    /// `replica:1`, `host:ace`, `operator:admin`; `""` when it names no principal.
    pub principal: String,
    pub serial: String,
    pub not_after: Time,
    /// `viewer`, `operator` or `admin` for an operator certificate that states one; `null`
    /// otherwise (an operator certificate from before roles holds admin).
    pub role: Option<String>,
    /// It expires within the warning window (30 days) or has expired, as of this answer.
    pub expiring: bool,
}

/// One deny-list entry: `serial <hex>` or a principal.
#[derive(Debug, Serialize)]
pub struct DenyJson {
    pub target: String,
    pub why: String,
    pub actor: String,
    pub time: Time,
}

impl CertsJson {
    /// The document for `view`, `expiring` judged at `now_ms`.
    pub fn new(view: &CertsView, now_ms: i64) -> CertsJson {
        let cert = |c: &CertView| CertJson {
            principal: c.principal.clone(),
            serial: c.serial.clone(),
            not_after: Time(c.not_after_ms.max(0) as u64),
            role: c.role.map(|r| r.to_string()),
            expiring: c.not_after_ms - now_ms <= expiry_warning_days * 86_400_000,
        };
        CertsJson {
            replica: view.replica,
            cas: view.cas,
            own: view.own.as_ref().map(cert),
            peers: view.peers.iter().map(cert).collect(),
            denied: view
                .denied
                .iter()
                .map(|d| DenyJson {
                    target: d.target.clone(),
                    why: d.why.clone(),
                    actor: d.actor.clone(),
                    time: Time(d.time_ms),
                })
                .collect(),
        }
    }
}

// ---- logs ----

/// `logs --json`: one document per line of output (its `answer`), as they are read.
#[derive(Debug, Serialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum LogJson {
    /// One line a module wrote, without its newline.
    Line {
        module: String,
        /// `stdout` or `stderr`.
        stream: &'static str,
        line: String,
    },
    /// With `--follow`: the file was rotated, and lines written before the rotation since the
    /// last read are not shown.
    Rotated {
        module: String,
        stream: &'static str,
    },
}

/// The documents for one chunk of logs, one a line: a `rotated` first if it was.
pub fn log_documents(via: Via, chunk: &LogChunk, with_rotation: bool) -> Result<String, CliError> {
    let mut out = String::new();
    if with_rotation && chunk.rotated {
        let rotated = LogJson::Rotated {
            module: chunk.module.clone(),
            stream: chunk.stream.word(),
        };
        out.push_str(&document(Some(via), rotated)?);
    }
    for line in &chunk.lines {
        let answer = LogJson::Line {
            module: chunk.module.clone(),
            stream: chunk.stream.word(),
            line: line.clone(),
        };
        out.push_str(&document(Some(via), answer)?);
    }
    Ok(out)
}

// --- `events --json` (issue 25 item 5, decision 0308) ---

/// One event: when (RFC 3339), its place in the leader's log (`term`, `index`: the cursor),
/// what (`kind`), where (`machine`, `module`, `null` when the event is not of one) and its line.
#[derive(Debug, Serialize)]
pub struct EventJson {
    pub time: Time,
    pub term: u64,
    pub index: u64,
    pub kind: &'static str,
    pub machine: Option<String>,
    pub module: Option<String>,
    pub text: String,
}

impl EventJson {
    pub fn new(term: u64, e: &crate::controller::events::Event) -> EventJson {
        EventJson {
            time: Time(e.at_ms),
            term,
            index: e.index,
            kind: e.kind.word(),
            machine: e.machine.clone(),
            module: e.module.clone(),
            text: e.text.clone(),
        }
    }
}

/// Events a reader could not be shown: `older_term` (the cursor was of an earlier leader's term,
/// whose events are not kept: some may be lost) or `dropped` (`count` events fell out of the
/// bounded log unread).
#[derive(Debug, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum GapJson {
    OlderTerm { term: u64, now_term: u64 },
    Dropped { count: u64 },
}

impl GapJson {
    pub fn new(now_term: u64, gap: &crate::controller::events::EventsGap) -> GapJson {
        match gap {
            crate::controller::events::EventsGap::OlderTerm { term } => GapJson::OlderTerm {
                term: *term,
                now_term,
            },
            crate::controller::events::EventsGap::Dropped { count } => {
                GapJson::Dropped { count: *count }
            }
        }
    }
}

/// `events --json`: the events the leader keeps (of the machine asked for), oldest first;
/// `earlier` of them before these not shown (`--limit`).
#[derive(Debug, Serialize)]
pub struct EventsJson {
    pub term: u64,
    pub earlier: u64,
    pub events: Vec<EventJson>,
}

/// `events --follow --json`: one document a line, an event or a gap, as they come.
#[derive(Debug, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum EventFollowJson {
    Event { event: EventJson },
    Gap { gap: GapJson },
}

// ---- model show, diff (issue 25 item 1, decision 0302) ----

/// `model show --json`: the file's text and what it is.
#[derive(Debug, Serialize)]
pub struct ModelShowJson {
    /// The model revision shown; `null` for a model applied before model history was kept.
    pub model_revision: Option<u64>,
    pub store_revision: u64,
    /// It is the model in force.
    pub current: bool,
    /// blake3 of the encoded model (with the settings shown), as `apply` names it; hex.
    pub digest: String,
    /// Settings scopes in force left out: they name a machine or module this model lacks.
    pub settings_left_out: Vec<String>,
    pub applied: Option<ModelAppliedJson>,
    /// The mesh.toml text, header comments included.
    pub text: String,
}

/// Who applied a model revision, when and why.
#[derive(Debug, Serialize)]
pub struct ModelAppliedJson {
    pub time: Time,
    pub actor: String,
    pub why: String,
}

impl ModelShowJson {
    pub fn new(
        view: &crate::controller::api::ModelView,
        digest: String,
        text: String,
    ) -> ModelShowJson {
        ModelShowJson {
            model_revision: view.model_revision,
            store_revision: view.store_revision,
            current: view.current,
            digest,
            settings_left_out: view
                .settings_left_out
                .iter()
                .map(ToString::to_string)
                .collect(),
            applied: view.change.as_ref().map(|c| ModelAppliedJson {
                time: Time(c.time_ms),
                actor: c.actor.clone(),
                why: c.why.clone(),
            }),
            text,
        }
    }
}

/// `diff --json`: `differences` decides the exit code (1 when true).
#[derive(Debug, Serialize)]
pub struct DiffJson {
    pub model_revision: Option<u64>,
    pub differences: bool,
    pub changes: Vec<DiffChangeJson>,
    /// Settings scopes whose layer in the file differs from the store's; apply leaves them.
    pub settings_differ: Vec<String>,
}

/// One changed item: `subject` (`machine ace`, `module web`), `item`, and each side (`null`
/// where absent): a string field's value in the clear, anything else as `diff` prints it (a list,
/// a file's size and digest, a mount, a probe).
#[derive(Debug, Serialize)]
pub struct DiffChangeJson {
    pub subject: String,
    pub item: String,
    pub stored: Option<String>,
    pub file: Option<String>,
}

/// A quoted string value in the clear; any other value as it is.
fn clear(value: &str) -> String {
    unquote(value).unwrap_or_else(|| value.to_string())
}

impl DiffJson {
    pub fn new(
        view: &crate::controller::api::ModelView,
        d: &crate::core::meshdiff::ModelDiff,
    ) -> DiffJson {
        DiffJson {
            model_revision: view.model_revision,
            differences: !d.is_empty(),
            changes: d
                .lines
                .iter()
                .map(|l| DiffChangeJson {
                    subject: l.subject.clone(),
                    item: l.item.clone(),
                    stored: l.was.as_deref().map(clear),
                    file: l.now.as_deref().map(clear),
                })
                .collect(),
            settings_differ: d.settings_differ.iter().map(ToString::to_string).collect(),
        }
    }
}
