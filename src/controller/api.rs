//! The operator API: what `meshctl` asks a replica and what it answers. Shared by `meshd` (which serves
//! it) and `meshctl` (which renders it); bytes go through `mesh_codec` in `MessageKind::Command` frames,
//! or `MessageKind::Forward` frames when a follower relays a request to the leader (G13).

use serde::{Deserialize, Serialize};
use std::collections::BTreeSet;

use crate::core::declaration::Digest;
use crate::core::model::Mesh;
use crate::core::settings::{Layer, Scope};
use crate::store::command::{HeldMount, SendRecord, SettingsChange};

/// A request from an operator.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum Request {
    Status,
    /// Store a new model revision; sends nothing.
    Apply {
        mesh: Mesh,
        why: String,
    },
    /// What a push of `machine` would send, cascade to and hold, diffed against the last send (G7).
    Plan {
        machine: String,
    },
    Push {
        target: PushTarget,
        why: String,
        moves: Vec<String>,
    },
    SettingsShow {
        scope: Option<Scope>,
        history: bool,
    },
    /// Set the keys of `layer` and remove the keys of `remove` (a removal needs `replace`, G6).
    SettingsSet {
        scope: Scope,
        layer: Layer,
        remove: BTreeSet<String>,
        replace: bool,
        why: String,
    },
    SettingsClear {
        scope: Scope,
        why: String,
    },
    History,
    /// A consistent backup of the store that `meshd restore` takes.
    SnapshotSave,
}

/// What a push is aimed at. A bare push (no machine, no flag) never reaches the wire: meshctl refuses it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum PushTarget {
    Machine(String),
    Behind,
    All,
}

/// A request relayed by a follower to the leader, with the operator who asked.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Forwarded {
    pub actor: String,
    pub via: u64,
    pub request: Request,
}

/// Every answer says which replica answered and whether it came through another one.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Answer {
    /// The replica that did the work.
    pub replica: u64,
    /// Set when the replica the operator called forwarded the request to the leader.
    pub forwarded_by: Option<u64>,
    pub body: Result<Body, ApiError>,
}

/// The successful answers.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum Body {
    Status(StatusView),
    /// A new model revision and the machines whose declarations it changes.
    Applied {
        revision: u64,
        changes: Vec<String>,
        /// Settings scopes where the file differs from the store; not written (use `settings set`).
        settings_ignored: Vec<String>,
    },
    Plan(PlanView),
    Push(PushView),
    Settings(SettingsView),
    SettingsSet {
        scope: Scope,
        added: Vec<String>,
        changed: Vec<String>,
        removed: Vec<String>,
    },
    History(Vec<HistoryItem>),
    Snapshot {
        bytes: Vec<u8>,
        epoch_floor: u64,
    },
}

/// Why a request failed. Each maps to an exit code in meshctl (see `exit_code`).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error, Serialize, Deserialize)]
pub enum ApiError {
    /// Bad input: unknown machine, module or scope; a flag that cannot take effect; a bad mesh file.
    #[error("{0}")]
    Invalid(String),
    /// No leader could be reached, or leadership/lease was lost mid-request.
    #[error("{0}")]
    Unavailable(String),
    /// The store refused the change (stale epoch, moved revision); nothing was written.
    #[error("{0}")]
    Refused(String),
    /// Something failed on the replica (storage, a host).
    #[error("{0}")]
    Failed(String),
}

impl ApiError {
    /// meshctl's exit code: 2 bad usage or input, 1 anything else that failed.
    pub fn exit_code(&self) -> i32 {
        match self {
            ApiError::Invalid(_) => 2,
            _ => 1,
        }
    }
}

/// `meshctl status`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct StatusView {
    pub replicas: Vec<ReplicaView>,
    pub machines: Vec<MachineView>,
    pub revision: u64,
    pub epoch_floor: u64,
    /// Set when this replica found its store reset below the floor it knew (G9).
    pub store_reset: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReplicaView {
    pub id: u64,
    pub addr: String,
    pub leader: bool,
    pub epoch: u64,
    pub reachable: bool,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct MachineView {
    pub name: String,
    pub last_send: Option<(u64, u64, Digest)>,
    /// `(epoch, sequence, report_sequence, applied digest)` of the last accepted report.
    pub last_report: Option<(u64, u64, u64, Option<Digest>)>,
    pub behind: bool,
    pub holds: Vec<HeldMount>,
    pub refused_reports: u64,
}

/// `meshctl plan <machine> --diff`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PlanView {
    pub machine: String,
    /// Rendered diff of the would-send against the last send summary; empty when nothing would change.
    pub diff: Vec<String>,
    /// Machines a push would send to, with the reason rendered (`named`, `cascaded because of g14`).
    pub sends: Vec<(String, String)>,
    pub holds: Vec<(String, HeldMount)>,
    pub mints: Vec<String>,
}

/// `meshctl push`: one line per machine.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PushView {
    pub epoch: u64,
    pub lines: Vec<PushLine>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PushLine {
    pub machine: String,
    pub outcome: PushOutcome,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum PushOutcome {
    /// Recorded and sent; the host verified and applied it.
    Applied {
        reason: String,
        sequence: u64,
        digest: Digest,
    },
    /// Recorded and sent, but the host did not answer in time; its report will settle it.
    Sent {
        reason: String,
        sequence: u64,
        digest: Digest,
        error: String,
    },
    /// Not sent: a running module's mount would move.
    Held {
        reason: String,
        holds: Vec<HeldMount>,
    },
    /// The host refused the envelope.
    Refused { reason: String, refusal: String },
    /// Not sent: the push stopped (gate closed, leadership lost, store refused).
    Failed { reason: String, error: String },
}

/// `meshctl settings show`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SettingsView {
    pub layers: Vec<(Scope, Layer)>,
    /// The effective settings of the placement the scope names (a module, or module@machine):
    /// every layer merged, later scope wins. `None` for the mesh and machine scopes.
    pub effective: Option<Layer>,
    pub history: Vec<SettingsChange>,
}

/// `meshctl history`: sends and settings changes, newest last.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum HistoryItem {
    Send(SendRecord),
    Settings(SettingsChange),
}
