//! The domain commands the leader proposes through Raft, and the answers the state machine gives.
//!
//! Every proposal carries the epoch it was decided under and, where it depends on what was composed,
//! the compose revision it expects (G4). The state machine refuses one whose epoch is not the entry's
//! term, or whose revision moved; a refusal is an answer, never a panic, and changes nothing.

use serde::{Deserialize, Serialize};
use std::collections::BTreeSet;

use crate::core::declaration::Digest;
use crate::core::layer_delta::LayerDelta;
use crate::core::model::{Mesh, Provision};
use crate::core::report::{Report, ReportPosition};
use crate::core::settings::{Layer, Scope};
use crate::core::summary::Summary;

/// One command with the conditions it was decided under.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Proposal {
    /// The Raft term of the leader that decided this command.
    pub epoch: u64,
    /// The compose revision this command was decided against, when it matters.
    pub expect_revision: Option<u64>,
    /// Who asked: `operator:alice`, or `replica:1` for the controller's own work.
    pub actor: String,
    /// Wall-clock milliseconds since the Unix epoch, taken by the proposer (for history only).
    pub time_ms: u64,
    pub command: Command,
}

/// What the store can be asked to do.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum Command {
    /// Replace the model (machines and modules; settings are kept as they are) with a new revision.
    /// `changes` names the machines whose should-be the proposer found this revision changes; it is
    /// kept in the model history.
    ApplyModel {
        mesh: Mesh,
        why: String,
        changes: Vec<String>,
    },
    /// Set keys in a layer (merged, or the whole layer with `replace`) and remove keys (only with
    /// `replace`), keeping the old layer in history.
    SetSettings {
        scope: Scope,
        set: Layer,
        remove: BTreeSet<String>,
        replace: bool,
        why: String,
    },
    /// Remove a layer, keeping it in history.
    ClearSettings { scope: Scope, why: String },
    /// Commit provisions minted while composing a consumer's machine, before any send carries them.
    Mint { provisions: Vec<Provision> },
    /// Record sends before their envelopes leave; each sequence must be its machine's next one. One
    /// entry for a whole push, so a push to a thousand machines is one commit, not a thousand.
    RecordSends { sends: Vec<SendRecord> },
    /// File a host's report into its machine's account (order from the core, G5).
    RecordReport { report: Report },
    /// Remember why a machine was held, so `status` can show it until a push releases it.
    SetHolds {
        machine: String,
        holds: Vec<HeldMount>,
    },
    /// Forget a machine's holds (after a push with `--move` went through).
    ReleaseHolds { machine: String },
    /// Raise the epoch floor (G9); never lowers it.
    RaiseEpochFloor { epoch: u64 },
    /// Add a certificate (serial) or a principal to the deny list (decision 0172).
    Revoke {
        target: super::revoked::RevokedTarget,
        why: String,
    },
    /// `command` on behalf of the operator request `request`: applied once; the same request again
    /// (retried after a lost answer, through any replica, under any leader) is answered with the
    /// first outcome and changes nothing. Kept for the last [`requests_remembered_max`] requests.
    Once {
        request: RequestId,
        command: Box<Command>,
    },
    // New variants go last: a log entry's variant is its index (old entries still decode).
    /// Keep one chunk of a model upload in the staging record (decision 0185); the current model
    /// is untouched. The same chunk again changes nothing.
    StageChunk {
        upload: super::staging::UploadId,
        index: u32,
        chunks_total: u32,
        bytes_total: u64,
        bytes: super::staging::Chunk,
    },
    /// Apply the model staged as `upload` (its blake3 `digest` checked) as `ApplyModel` would, with
    /// the machines of `keep` put back (drained: kept with no modules), and drop its staging rows,
    /// in one commit.
    ApplyUpload {
        upload: super::staging::UploadId,
        digest: [u8; 32],
        why: String,
        changes: Vec<String>,
        keep: Vec<crate::core::model::Machine>,
    },
    /// Replica `replica`'s envelope key into the state (`Some`) or out of it (`None`): every
    /// declaration carries the added replicas' keys (decision 0230).
    SetSigner { replica: u64, key: Option<[u8; 32]> },
    /// File hosts' reports, in order, each into its machine's account (G5), as one proposal: the
    /// leader gathers the reports that arrive while the last batch commits (decision 0216).
    RecordReports { reports: Vec<ReportFiling> },
}

/// One report of a [`Command::RecordReports`], with the highest position the leader heard from
/// that host without filing it (reports that only said "still here"): one at or below it is
/// refused and counted like one at or below the account's last (G5).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ReportFiling {
    pub report: Report,
    pub heard: Option<ReportPosition>,
}

/// How many operator requests' outcomes the state keeps (oldest forgotten first): far more than
/// can be in flight or retried at once.
pub const requests_remembered_max: usize = 10_000;

/// An operator request's id: 16 random bytes `meshctl` picks once per command and keeps across
/// retries to other replicas.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct RequestId(pub [u8; 16]);

impl std::fmt::Display for RequestId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&crate::hex::encode_hex(&self.0))
    }
}

/// The first outcome of a remembered request, and when (in apply order) it was remembered.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Remembered {
    pub order: u64,
    pub applied: Applied,
}

/// What was sent to a machine, committed before it left.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SendRecord {
    pub machine: String,
    pub epoch: u64,
    pub sequence: u64,
    pub digest: Digest,
    /// Shared, not copied, with every plan that reads it (decision 0287); serialized as the
    /// summary itself, so logs, snapshots and JSON are as before.
    pub summary: std::sync::Arc<Summary>,
    pub why: String,
    pub actor: String,
    pub time_ms: u64,
    /// Modules whose mounts this send may move.
    pub moves: Vec<String>,
}

/// A model apply, kept in the model history (`meshctl history`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ModelChange {
    pub revision: u64,
    pub why: String,
    pub actor: String,
    pub epoch: u64,
    pub time_ms: u64,
    /// Machines whose should-be declaration this revision changed.
    pub changes: Vec<String>,
}

/// A held mount, as `status` shows it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct HeldMount {
    pub module: String,
    pub mount: String,
    pub old_dir: String,
    pub new_dir: String,
}

/// A write to a settings layer as the store keeps it (G6): only the keys it changed, each before
/// and after, with why, who and when (decision 0317). Table `settings_history` and snapshots hold
/// these; readers see [`SettingsChange`], rebuilt from them.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SettingsEntry {
    pub id: u64,
    pub scope: Scope,
    pub delta: LayerDelta,
    pub why: String,
    pub actor: String,
    pub epoch: u64,
    pub time_ms: u64,
}

/// A write to a settings layer as a reader sees it: the whole layer before and after, with why,
/// who and when (G6). Rebuilt from [`SettingsEntry`] rows and the layer in force (decision 0317);
/// until schema 0012 the store kept this shape itself, so migration 0012 and an old snapshot's
/// install read it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SettingsChange {
    pub id: u64,
    pub scope: Scope,
    /// The layer as it was before the write; `None` when the write created it.
    pub before: Option<Layer>,
    /// The layer after the write; `None` when it was cleared.
    pub after: Option<Layer>,
    pub why: String,
    pub actor: String,
    pub epoch: u64,
    pub time_ms: u64,
}

/// The state machine's answer to one proposal.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum Outcome {
    Applied(Applied),
    Refused(Refusal),
}

/// What an applied command did.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum Applied {
    /// `settings_ignored`: scopes where the file's settings differ from the store's; they were not
    /// written (settings change through `meshctl settings set`, which keeps history).
    Model {
        revision: u64,
        settings_ignored: Vec<String>,
    },
    Settings {
        revision: u64,
        added: Vec<String>,
        changed: Vec<String>,
        removed: Vec<String>,
    },
    Minted {
        revision: u64,
        ids: Vec<String>,
    },
    Sent {
        sequences: Vec<(String, u64)>,
    },
    Report {
        machine: String,
        accepted: bool,
    },
    Holds {
        machine: String,
    },
    EpochFloor {
        floor: u64,
    },
    /// The deny list holds `target` (newly, or already: revoking twice changes nothing).
    Revoked {
        target: super::revoked::RevokedTarget,
        entries: usize,
    },
    /// A chunk of `upload` is staged: `received` of its `chunks_total`.
    Staged {
        upload: super::staging::UploadId,
        received: u32,
        chunks_total: u32,
    },
    /// Replica `replica`'s key is in the state (`known`) or not, after a `SetSigner`.
    Signer {
        replica: u64,
        known: bool,
    },
    /// Each report of a `RecordReports`, in its order: whether it was accepted (false: refused as
    /// not newer, and counted).
    Reports {
        accepted: Vec<bool>,
    },
}

/// Why the state machine refused a proposal. Nothing changed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error, Serialize, Deserialize)]
pub enum Refusal {
    #[error(
        "decided under epoch {epoch} but committed in term {term}: a newer leader exists; nothing was written"
    )]
    StaleEpoch { epoch: u64, term: u64 },
    #[error(
        "decided against revision {expected} but the store is at {actual}: recompose and try again"
    )]
    RevisionMoved { expected: u64, actual: u64 },
    #[error("send to {machine} has sequence {got}, the next is {expected}")]
    SequenceOutOfOrder {
        machine: String,
        got: u64,
        expected: u64,
    },
    #[error("{0}")]
    Invalid(String),
}
