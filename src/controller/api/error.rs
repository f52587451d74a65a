//! Why an operator request failed, as a type (issue 10 item 8, decision 0210): one enum per
//! operation for what only that operation can get wrong, beside the cases every operation shares
//! (not the leader, no leader, the leader unreachable, no lease, the store refused, fatal).
//!
//! Each variant says with its fields *what* went wrong; its `Display` is the one line an operator
//! reads (the thing, what is wrong, what to do); [`ApiError::class`] decides meshctl's exit code
//! (decision 0062) and [`ApiError::cause`] is the stable name `--json` prints (`docs/json.md`).
//! A new variant gets a new cause and goes last in its enum (bincode tags variants by index; the
//! wire contract pins them); a cause is never renamed or reused.

use serde::{Deserialize, Serialize};

use super::UploadId;
use crate::core::settings::Scope;
use crate::store::command::Refusal;

/// What an operator does about an error; decides meshctl's exit code (decision 0062).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ErrorClass {
    /// Bad input: fix the request (exit 2).
    Invalid,
    /// No leader, lease or peer could be had right now: retry (exit 1).
    Unavailable,
    /// The store or the leader refused it; nothing was written (exit 1).
    Refused,
    /// Something failed on the replica (storage, a host, a bug), or the replica stops (exit 1).
    Failed,
}

impl ErrorClass {
    /// The class's name in `--json` (`error.kind`): `invalid`, `unavailable`, `refused`, `failed`.
    pub fn name(self) -> &'static str {
        match self {
            ErrorClass::Invalid => "invalid",
            ErrorClass::Unavailable => "unavailable",
            ErrorClass::Refused => "refused",
            ErrorClass::Failed => "failed",
        }
    }

    /// meshctl's exit code: 2 bad input, 1 anything else that failed.
    pub fn exit_code(self) -> i32 {
        match self {
            ErrorClass::Invalid => 2,
            _ => 1,
        }
    }
}

/// Why a request failed: its operation's own error, or a case any operation can meet.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error, Serialize, Deserialize)]
pub enum ApiError {
    /// The request's bytes are not a request this replica reads (or a forward lied about its path).
    #[error("{reason}")]
    BadRequest { reason: String },
    /// `replica` does not lead; `leader` is the one it knows of.
    #[error("replica {replica} is not the leader (leader: {}); ask again", leader_name(*leader))]
    NotLeader { replica: u64, leader: Option<u64> },
    /// No leader answered `replica` within `waited_ms`.
    #[error(
        "replica {replica} found no leader that answers within {waited_ms} ms: {reason}; retry in a few seconds"
    )]
    NoLeader {
        replica: u64,
        waited_ms: u64,
        reason: String,
    },
    /// `replica` knew the leader but could not hand it the request.
    #[error("replica {replica} could not reach the leader {leader}: {reason}")]
    LeaderUnreachable {
        replica: u64,
        leader: u64,
        reason: String,
    },
    /// The leader's answer to a forwarded request did not decode (another version?).
    #[error("the leader's answer is unreadable: {reason}")]
    LeaderAnswerUnreadable { reason: String },
    /// Leadership was not confirmed by a quorum round (G3); nothing was sent.
    #[error("{reason}")]
    NoLease { replica: u64, reason: String },
    /// Raft did not confirm the proposal (not leading, or stopping): it may never have been
    /// appended, or been appended before the leadership ended and be committed by the next
    /// leader. The outcome is unknown; the same request id asked again runs it at most once.
    #[error("{reason}")]
    NotCommitted { reason: String },
    /// The store refused the change; nothing was written.
    #[error("{refusal}")]
    StoreRefused { refusal: Refusal },
    /// A store table could not be read.
    #[error("cannot read {what}: {reason}")]
    Storage { what: String, reason: String },
    /// The OS random source failed; nothing was written.
    #[error(
        "the OS random source failed{}; nothing was written",
        while_doing(what)
    )]
    Random { what: String },
    /// The replica cannot go on: it stops (decision 0183).
    #[error("{reason}; the replica stops")]
    Fatal { reason: String },
    /// Something inside the replica that no request can cause: a bug, reported as one.
    #[error("{reason}")]
    Internal { reason: String },
    #[error(transparent)]
    Apply(#[from] ApplyError),
    #[error(transparent)]
    Settings(#[from] SettingsError),
    #[error(transparent)]
    Push(#[from] PushError),
    #[error(transparent)]
    Genesis(#[from] GenesisError),
    #[error(transparent)]
    Snapshot(#[from] SnapshotError),
    #[error(transparent)]
    Certs(#[from] CertsError),
    #[error(transparent)]
    Logs(#[from] LogsError),
    #[error(transparent)]
    Members(#[from] crate::controller::members::MembersError),
    // New variants go last (bincode tags by index; the wire contract pins these answers).
    /// No answer within `waited_ms` to `what`; it may still have happened: with the same request
    /// id a retry is answered with its first outcome, never run twice (decision 0180).
    #[error(
        "no answer to {what} within {waited_ms} ms; it may still commit: run the command again (a retry never runs it twice)"
    )]
    Timeout { what: String, waited_ms: u64 },
    /// One proposal over Raft's batch limit (`batch_bytes_max`).
    #[error(
        "the write is {bytes} bytes, over the limit of {limit} bytes one proposal carries (batch_bytes_max in replica.toml); nothing was written"
    )]
    ProposalTooLarge { bytes: u64, limit: u64 },
    /// Raft refused the proposal for a reason of its own.
    #[error("raft refused the proposal: {reason}")]
    RaftFailed { reason: String },
    /// The operator's certificate grants a role below the one `command` needs (G10, decision
    /// 0295); checked by the replica holding the operator's connection, before anything runs.
    #[error(
        "operator:{operator} holds role {held}, and `{command}` needs role {needed}; nothing was done. An admin with the CA key can issue a certificate with that role: `meshctl certs issue operator:{operator} --role {needed}`"
    )]
    Forbidden {
        operator: String,
        command: String,
        needed: mesh_transport::Role,
        held: mesh_transport::Role,
    },
    #[error(transparent)]
    Events(#[from] crate::controller::events::EventsError),
    /// `model show`, `rollback` and `settings rollback` (issue 25, decision 0302).
    #[error(transparent)]
    Model(#[from] ModelError),
}

fn leader_name(leader: Option<u64>) -> String {
    match leader {
        Some(l) => format!("replica {l}"),
        None => "none known".to_string(),
    }
}

fn while_doing(what: &str) -> String {
    if what.is_empty() {
        String::new()
    } else {
        format!(" while {what}")
    }
}

impl ApiError {
    /// What the operator does about it; decides the exit code.
    pub fn class(&self) -> ErrorClass {
        use ErrorClass::*;
        match self {
            ApiError::BadRequest { .. } => Invalid,
            ApiError::NotLeader { .. }
            | ApiError::NoLeader { .. }
            | ApiError::LeaderUnreachable { .. }
            | ApiError::NoLease { .. }
            | ApiError::NotCommitted { .. } => Unavailable,
            ApiError::StoreRefused { .. } | ApiError::Forbidden { .. } => Refused,
            ApiError::LeaderAnswerUnreadable { .. }
            | ApiError::Storage { .. }
            | ApiError::Random { .. }
            | ApiError::Fatal { .. }
            | ApiError::Internal { .. }
            | ApiError::Timeout { .. }
            | ApiError::ProposalTooLarge { .. }
            | ApiError::RaftFailed { .. } => Failed,
            ApiError::Apply(e) => e.class(),
            ApiError::Settings(e) => e.class(),
            ApiError::Push(e) => e.class(),
            ApiError::Genesis(e) => e.class(),
            ApiError::Snapshot(e) => e.class(),
            ApiError::Certs(e) => e.class(),
            ApiError::Logs(e) => e.class(),
            ApiError::Members(e) => e.class(),
            ApiError::Events(e) => e.class(),
            ApiError::Model(e) => e.class(),
        }
    }

    /// The stable name of this variant for programs (`--json`'s `error.cause`): a shared case
    /// bare (`not_leader`), an operation's own prefixed with it (`apply.revision_moved`).
    pub fn cause(&self) -> &'static str {
        match self {
            ApiError::BadRequest { .. } => "bad_request",
            ApiError::NotLeader { .. } => "not_leader",
            ApiError::NoLeader { .. } => "no_leader",
            ApiError::LeaderUnreachable { .. } => "leader_unreachable",
            ApiError::LeaderAnswerUnreadable { .. } => "leader_answer_unreadable",
            ApiError::NoLease { .. } => "no_lease",
            ApiError::NotCommitted { .. } => "not_committed",
            ApiError::StoreRefused { refusal } => match refusal {
                Refusal::StaleEpoch { .. } => "store.stale_epoch",
                Refusal::RevisionMoved { .. } => "store.revision_moved",
                Refusal::SequenceOutOfOrder { .. } => "store.sequence_out_of_order",
                Refusal::Invalid(_) => "store.refused",
            },
            ApiError::Storage { .. } => "storage",
            ApiError::Random { .. } => "random",
            ApiError::Fatal { .. } => "fatal",
            ApiError::Internal { .. } => "internal",
            ApiError::Timeout { .. } => "timeout",
            ApiError::ProposalTooLarge { .. } => "proposal_too_large",
            ApiError::RaftFailed { .. } => "raft_failed",
            ApiError::Forbidden { .. } => "forbidden",
            ApiError::Apply(e) => e.cause(),
            ApiError::Settings(e) => e.cause(),
            ApiError::Push(e) => e.cause(),
            ApiError::Genesis(e) => e.cause(),
            ApiError::Snapshot(e) => e.cause(),
            ApiError::Certs(e) => e.cause(),
            ApiError::Logs(e) => e.cause(),
            ApiError::Members(e) => e.cause(),
            ApiError::Events(e) => e.cause(),
            ApiError::Model(e) => e.cause(),
        }
    }

    /// meshctl's exit code: 2 bad usage or input, 1 anything else that failed.
    pub fn exit_code(&self) -> i32 {
        self.class().exit_code()
    }

    /// A refusal of the store as an error.
    pub fn refused(refusal: Refusal) -> ApiError {
        ApiError::StoreRefused { refusal }
    }

    /// A bug inside the replica, with what it found.
    pub fn internal(reason: impl Into<String>) -> ApiError {
        ApiError::Internal {
            reason: reason.into(),
        }
    }
}

/// `apply` (inline or uploaded in chunks).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error, Serialize, Deserialize)]
pub enum ApplyError {
    /// The model breaks rules `meshctl check` checks: every problem, one line each.
    #[error("{}\nnothing was stored", problems.join("\n"))]
    Invalid { problems: Vec<String> },
    /// A machine does not compose with the new model.
    #[error("machine {machine} does not compose with this mesh: {reason}; nothing was stored")]
    DoesNotCompose { machine: String, reason: String },
    /// The model drops machines that still run modules, without `--drain`: `(machine, why)`.
    #[error(
        "{}; nothing was stored",
        machines.iter().map(|(m, why)| crate::store::state::leave_refused(m, why)).collect::<Vec<_>>().join("; ")
    )]
    WouldDropRunning { machines: Vec<(String, String)> },
    /// Concurrent writes kept moving the revision while this apply was checked.
    #[error(
        "the model was checked against revision {expected} but other writes had moved the store to {found} each time it tried; nothing was stored: run `meshctl apply` again"
    )]
    RevisionMoved { expected: u64, found: u64 },
    /// An inline apply over what one request carries (meshctl sends larger ones in chunks).
    #[error(
        "the model encodes to {bytes} bytes, over the {limit} bytes one apply request carries (apply_inline_bytes_max); a larger model is sent in chunks, which this meshctl did not do: use a meshctl of this version; nothing was stored"
    )]
    TooLarge { bytes: u64, limit: u64 },
    /// The model does not encode.
    #[error("{reason}; nothing was stored")]
    Unencodable { reason: String },
    /// One chunk of an upload over the chunk limit.
    #[error(
        "upload {upload}: chunk {index} is {bytes} bytes, over the limit of {limit} (upload_chunk_bytes_max); nothing was staged"
    )]
    ChunkTooLarge {
        upload: UploadId,
        index: u32,
        bytes: u64,
        limit: u64,
    },
    /// Raft did not take a chunk (its proposal is too large for the batch, say).
    #[error(
        "upload {upload}: chunk {index} was not staged: {reason}; check batch_bytes_max in replica.toml is above {limit} bytes"
    )]
    ChunkNotStaged {
        upload: UploadId,
        index: u32,
        reason: String,
        limit: u64,
    },
    /// The staged upload is missing, incomplete, someone else's, or not the digest named.
    #[error("{reason}; nothing was stored")]
    UploadUnusable { upload: UploadId, reason: String },
}

impl ApplyError {
    pub fn class(&self) -> ErrorClass {
        match self {
            ApplyError::RevisionMoved { .. } => ErrorClass::Refused,
            ApplyError::ChunkNotStaged { .. } => ErrorClass::Failed,
            _ => ErrorClass::Invalid,
        }
    }

    pub fn cause(&self) -> &'static str {
        match self {
            ApplyError::Invalid { .. } => "apply.invalid",
            ApplyError::DoesNotCompose { .. } => "apply.does_not_compose",
            ApplyError::WouldDropRunning { .. } => "apply.would_drop_running",
            ApplyError::RevisionMoved { .. } => "apply.revision_moved",
            ApplyError::TooLarge { .. } => "apply.too_large",
            ApplyError::Unencodable { .. } => "apply.unencodable",
            ApplyError::ChunkTooLarge { .. } => "apply.chunk_too_large",
            ApplyError::ChunkNotStaged { .. } => "apply.chunk_not_staged",
            ApplyError::UploadUnusable { .. } => "apply.upload_unusable",
        }
    }
}

/// Which settings rule a write broke (`crate::core::settings::SettingsError`, by name).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum SettingsRule {
    NoLayer,
    RemovalWithoutReplace,
    BadAssignment,
    EmptyValue,
    SetAndRemoved,
    RepeatedKey,
    BadKey,
    ControlCharacter,
    ValueTooLarge,
}

impl SettingsRule {
    pub fn of(e: &crate::core::settings::SettingsError) -> SettingsRule {
        use crate::core::settings::SettingsError as E;
        match e {
            E::NoLayer => SettingsRule::NoLayer,
            E::RemovalWithoutReplace { .. } => SettingsRule::RemovalWithoutReplace,
            E::BadAssignment { .. } => SettingsRule::BadAssignment,
            E::EmptyValue { .. } => SettingsRule::EmptyValue,
            E::SetAndRemoved { .. } => SettingsRule::SetAndRemoved,
            E::RepeatedKey { .. } => SettingsRule::RepeatedKey,
            E::BadKey { .. } => SettingsRule::BadKey,
            E::ControlCharacter { .. } => SettingsRule::ControlCharacter,
            E::ValueTooLarge { .. } => SettingsRule::ValueTooLarge,
        }
    }

    fn cause(self) -> &'static str {
        match self {
            SettingsRule::NoLayer => "settings.no_layer",
            SettingsRule::RemovalWithoutReplace => "settings.removal_without_replace",
            SettingsRule::BadAssignment => "settings.bad_assignment",
            SettingsRule::EmptyValue => "settings.empty_value",
            SettingsRule::SetAndRemoved => "settings.set_and_removed",
            SettingsRule::RepeatedKey => "settings.repeated_key",
            SettingsRule::BadKey => "settings.bad_key",
            SettingsRule::ControlCharacter => "settings.control_character",
            SettingsRule::ValueTooLarge => "settings.value_too_large",
        }
    }
}

/// `settings show|set|clear`.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error, Serialize, Deserialize)]
pub enum SettingsError {
    /// The scope names no machine or module of the model.
    #[error("{reason}")]
    UnknownScope { scope: Scope, reason: String },
    /// The write breaks a settings rule (checked before proposing).
    #[error("settings {scope}: {reason}")]
    Rule {
        scope: Scope,
        rule: SettingsRule,
        reason: String,
    },
    /// The write was refused at apply, on the state it landed on (a layer already gone, a
    /// removal without `--replace` after a concurrent write); nothing was written.
    #[error("{reason}")]
    RefusedAtApply { scope: Scope, reason: String },
    /// `settings show --history` in one answer: history comes page by page.
    #[error(
        "settings history comes page by page: ask `Request::History` with settings_only (meshctl does)"
    )]
    HistoryPaged,
}

impl SettingsError {
    pub fn class(&self) -> ErrorClass {
        match self {
            SettingsError::RefusedAtApply { .. } => ErrorClass::Refused,
            _ => ErrorClass::Invalid,
        }
    }

    pub fn cause(&self) -> &'static str {
        match self {
            SettingsError::UnknownScope { .. } => "settings.unknown_scope",
            SettingsError::Rule { rule, .. } => rule.cause(),
            SettingsError::RefusedAtApply { .. } => "settings.refused_at_apply",
            SettingsError::HistoryPaged => "settings.history_paged",
        }
    }
}

/// `plan` and `push` (and the push a genesis runs).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error, Serialize, Deserialize)]
pub enum PushError {
    #[error("a push needs a reason: add `--why \"...\"`; it is kept with the send record")]
    NoReason,
    #[error("there is no machine {machine} in the mesh; `meshctl status` lists them")]
    UnknownMachine { machine: String },
    /// A machine the push reaches does not compose.
    #[error("{reason}")]
    DoesNotCompose { reason: String },
    #[error(
        "`--move {module}` cannot take effect: {reason}; drop the flag or name the right module"
    )]
    MoveNotApplicable { module: String, reason: String },
    /// Planning went wrong in a way no input should cause.
    #[error("{reason}")]
    PlanFailed { reason: String },
    /// `push --plan FILE` and the leader would now plan something else.
    #[error(
        "the saved plan {token} no longer holds: {moved}; nothing was sent; review it again with `meshctl plan`"
    )]
    PlanMoved { token: String, moved: String },
    /// Another push held the replica's push lock for longer than `waited_ms`.
    #[error(
        "another push has been running on replica {replica} for over {waited_ms} ms; retry when it has answered"
    )]
    Busy { replica: u64, waited_ms: u64 },
    /// This request id already ran and recorded sends to `machines`: nothing is sent again.
    #[error("{}", already_ran(request, machines))]
    AlreadyRan {
        request: String,
        machines: Vec<String>,
    },
    /// The store refused the push's mints or send records (`what`).
    #[error("the store refused this push's {what}: {reason}; nothing was sent")]
    StoreRefused { what: String, reason: String },
    /// A genesis whose envelope would be over the transport's frame limit: nothing recorded.
    #[error("the envelope of {machine} cannot be kept: {reason}")]
    EnvelopeTooLarge { machine: String, reason: String },
    /// The engine stopped with nothing in flight and no answer: a bug.
    #[error("the push engine of term {epoch} stopped without answering; this is a bug, report it")]
    EngineStopped { epoch: u64 },
}

fn already_ran(request: &str, machines: &[String]) -> String {
    if machines.is_empty() {
        format!("request {request} already ran; nothing was sent again")
    } else {
        format!(
            "request {request} already ran: it recorded sends to {}; nothing was sent again (`meshctl history` shows them)",
            machines.join(", ")
        )
    }
}

impl PushError {
    pub fn class(&self) -> ErrorClass {
        match self {
            PushError::NoReason
            | PushError::UnknownMachine { .. }
            | PushError::DoesNotCompose { .. }
            | PushError::MoveNotApplicable { .. }
            | PushError::EnvelopeTooLarge { .. } => ErrorClass::Invalid,
            PushError::Busy { .. } => ErrorClass::Unavailable,
            PushError::PlanMoved { .. }
            | PushError::AlreadyRan { .. }
            | PushError::StoreRefused { .. } => ErrorClass::Refused,
            PushError::PlanFailed { .. } | PushError::EngineStopped { .. } => ErrorClass::Failed,
        }
    }

    pub fn cause(&self) -> &'static str {
        match self {
            PushError::NoReason => "push.no_reason",
            PushError::UnknownMachine { .. } => "push.unknown_machine",
            PushError::DoesNotCompose { .. } => "push.does_not_compose",
            PushError::MoveNotApplicable { .. } => "push.move_not_applicable",
            PushError::PlanFailed { .. } => "push.plan_failed",
            PushError::PlanMoved { .. } => "push.plan_moved",
            PushError::Busy { .. } => "push.busy",
            PushError::AlreadyRan { .. } => "push.already_ran",
            PushError::StoreRefused { .. } => "push.store_refused",
            PushError::EngineStopped { .. } => "push.engine_stopped",
            PushError::EnvelopeTooLarge { .. } => "push.envelope_too_large",
        }
    }
}

/// `machines genesis`.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error, Serialize, Deserialize)]
pub enum GenesisError {
    #[error(
        "there is no machine {machine} in the model; add [machines.{machine}] to the mesh file and `meshctl apply` it first"
    )]
    UnknownMachine { machine: String },
    #[error(
        "machine {machine} already got send #{sequence} at epoch {epoch}; a genesis is only for a machine that never ran: use `meshctl push {machine}`"
    )]
    AlreadySent {
        machine: String,
        sequence: u64,
        epoch: u64,
    },
    /// The push ran but its envelope was not sealed (the lease ended, a cascade step failed).
    #[error("no genesis for {machine}: {lines}")]
    NotSealed { machine: String, lines: String },
}

impl GenesisError {
    pub fn class(&self) -> ErrorClass {
        match self {
            GenesisError::NotSealed { .. } => ErrorClass::Unavailable,
            _ => ErrorClass::Invalid,
        }
    }

    pub fn cause(&self) -> &'static str {
        match self {
            GenesisError::UnknownMachine { .. } => "genesis.unknown_machine",
            GenesisError::AlreadySent { .. } => "genesis.already_sent",
            GenesisError::NotSealed { .. } => "genesis.not_sealed",
        }
    }
}

/// `snapshot save` (one chunk at a time).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error, Serialize, Deserialize)]
pub enum SnapshotError {
    /// The backup being read is gone: another was taken, or it was held too long.
    #[error(
        "snapshot {snapshot} is no longer held by replica {replica} (another was taken, or {held_ms} ms passed); run `meshctl snapshot save` again"
    )]
    NotHeld {
        snapshot: u64,
        replica: u64,
        held_ms: u64,
    },
    #[error("cannot build the backup: {reason}")]
    BackupFailed { reason: String },
}

impl SnapshotError {
    pub fn class(&self) -> ErrorClass {
        match self {
            SnapshotError::NotHeld { .. } => ErrorClass::Invalid,
            SnapshotError::BackupFailed { .. } => ErrorClass::Failed,
        }
    }

    pub fn cause(&self) -> &'static str {
        match self {
            SnapshotError::NotHeld { .. } => "snapshot.not_held",
            SnapshotError::BackupFailed { .. } => "snapshot.backup_failed",
        }
    }
}

/// `certs reload|revoke`.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error, Serialize, Deserialize)]
pub enum CertsError {
    #[error(
        "replica {replica}: certificates not reloaded, still serving the ones it had: {reason}"
    )]
    NotReloaded { replica: u64, reason: String },
    /// What `certs revoke` was given is neither a serial nor a principal.
    #[error("{reason}")]
    BadTarget { target: String, reason: String },
    /// Revoking a member's principal would retire the key of a replica that may lead
    /// (decision 0294): it must leave the membership first.
    #[error(
        "replica {id} is a member of the cluster: revoking replica:{id} would retire its signing key while it may lead; run `meshctl replicas remove {id}` (which retires it) instead"
    )]
    RevokingAMember { id: u64 },
}

impl CertsError {
    pub fn class(&self) -> ErrorClass {
        ErrorClass::Invalid
    }

    pub fn cause(&self) -> &'static str {
        match self {
            CertsError::NotReloaded { .. } => "certs.not_reloaded",
            CertsError::BadTarget { .. } => "certs.bad_target",
            CertsError::RevokingAMember { .. } => "certs.revoking_a_member",
        }
    }
}

/// `logs`.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error, Serialize, Deserialize)]
pub enum LogsError {
    #[error("--lines {lines} is out of range; give 1 to {max}")]
    LinesOutOfRange { lines: u64, max: u64 },
    #[error("{count} cursors in one logs request, at most {max}")]
    TooManyCursors { count: u64, max: u64 },
    #[error(
        "no machine `{machine}` in [hosts] of replica {replica}'s config; known machines: {}",
        if known.is_empty() { "none".to_string() } else { known.join(", ") }
    )]
    UnknownMachine {
        machine: String,
        replica: u64,
        known: Vec<String>,
    },
    /// The host read the request and said, naming itself, what is wrong with it (no such module).
    #[error("{reason}")]
    HostRefused { machine: String, reason: String },
    #[error("cannot read machine {machine}'s logs: {reason}; is its mesh-host running?")]
    HostUnreachable { machine: String, reason: String },
    #[error("machine {machine}'s answer is unreadable: {reason}")]
    AnswerUnreadable { machine: String, reason: String },
    #[error(
        "asked machine {asked} for logs and {answered} answered; check [hosts] in the replica config"
    )]
    WrongMachine { asked: String, answered: String },
}

impl LogsError {
    pub fn class(&self) -> ErrorClass {
        match self {
            LogsError::LinesOutOfRange { .. }
            | LogsError::TooManyCursors { .. }
            | LogsError::UnknownMachine { .. }
            | LogsError::HostRefused { .. } => ErrorClass::Invalid,
            LogsError::HostUnreachable { .. } => ErrorClass::Unavailable,
            LogsError::AnswerUnreadable { .. } | LogsError::WrongMachine { .. } => {
                ErrorClass::Failed
            }
        }
    }

    pub fn cause(&self) -> &'static str {
        match self {
            LogsError::LinesOutOfRange { .. } => "logs.lines_out_of_range",
            LogsError::TooManyCursors { .. } => "logs.too_many_cursors",
            LogsError::UnknownMachine { .. } => "logs.unknown_machine",
            LogsError::HostRefused { .. } => "logs.host_refused",
            LogsError::HostUnreachable { .. } => "logs.host_unreachable",
            LogsError::AnswerUnreadable { .. } => "logs.answer_unreadable",
            LogsError::WrongMachine { .. } => "logs.wrong_machine",
        }
    }
}

#[cfg(test)]
#[path = "error_tests.rs"]
mod tests;

/// `model show`, `rollback` and `settings rollback` (issue 25 items 1 and 2, decision 0302).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error, Serialize, Deserialize)]
pub enum ModelError {
    /// The revision is past the store's.
    #[error(
        "revision {revision} does not exist: the store is at revision {newest}; `meshctl history` lists model revisions"
    )]
    NoSuchRevision { revision: u64, newest: u64 },
    /// The revision changed settings or minted, and stored no model.
    #[error(
        "revision {revision} stored no model (it was a settings write or a mint); `meshctl history` lists model revisions"
    )]
    NotAModelRevision { revision: u64 },
    /// A model revision whose model the store no longer keeps (pruned, or applied before
    /// models were kept).
    #[error(
        "revision {revision} is no longer kept: the store keeps the models of the newest {kept_max} model revisions within {bytes_max} bytes, and models applied before this release were never kept; {}",
        oldest_kept_words(*oldest_kept)
    )]
    NotKept {
        revision: u64,
        oldest_kept: Option<u64>,
        kept_max: u64,
        bytes_max: u64,
    },
    /// A rolled-back model too large for one proposal (the CLI's upload path takes it).
    #[error(
        "revision {revision}'s model encodes to {bytes} bytes, over the {limit} bytes one proposal carries; run `meshctl model show --revision {revision} > m.toml` and `meshctl apply -f m.toml` (apply sends large models in chunks); nothing was stored"
    )]
    TooLarge {
        revision: u64,
        bytes: u64,
        limit: u64,
    },
    /// No settings history entry with that id.
    #[error(
        "settings history has no entry {to} (ids run from 1 to {newest}); `meshctl settings show {scope} --history` lists them"
    )]
    NoSuchSettingsEntry { scope: Scope, to: u64, newest: u64 },
    /// The entry is another scope's.
    #[error(
        "settings history entry {to} changed [{entry_scope}], not [{scope}]; `meshctl settings show {scope} --history` lists its entries"
    )]
    OtherScope {
        scope: Scope,
        to: u64,
        entry_scope: Scope,
    },
}

fn oldest_kept_words(oldest: Option<u64>) -> String {
    match oldest {
        Some(r) => format!("the oldest kept is revision {r}"),
        None => "none is kept yet".to_string(),
    }
}

impl ModelError {
    pub fn class(&self) -> ErrorClass {
        match self {
            ModelError::TooLarge { .. } => ErrorClass::Refused,
            _ => ErrorClass::Invalid,
        }
    }

    pub fn cause(&self) -> &'static str {
        match self {
            ModelError::NoSuchRevision { .. } => "model.no_such_revision",
            ModelError::NotAModelRevision { .. } => "model.not_a_model_revision",
            ModelError::NotKept { .. } => "model.not_kept",
            ModelError::TooLarge { .. } => "model.too_large",
            ModelError::NoSuchSettingsEntry { .. } => "model.no_such_settings_entry",
            ModelError::OtherScope { .. } => "model.other_scope",
        }
    }
}
