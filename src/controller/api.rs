//! The operator API: what `meshctl` asks a replica and what it answers. Shared by `meshd` (which serves
//! it) and `meshctl` (which renders it); bytes go through `mesh_codec` in `MessageKind::Command` frames,
//! or `MessageKind::Forward` frames when a follower relays a request to the leader (G13).

use serde::{Deserialize, Serialize};
use std::collections::BTreeSet;

use crate::core::declaration::Digest;
use crate::core::model::Mesh;
use crate::core::report::{Health, ModuleStatus};
use crate::core::settings::{Layer, Scope};
pub use crate::core::wire::{LogsAnswer, LogsAsk};
pub use crate::store::command::RequestId;
use crate::store::command::{HeldMount, ModelChange, SendRecord, SettingsChange};
pub use crate::store::staging::{Chunk, UploadId, upload_chunk_bytes, upload_chunk_bytes_max};

/// What `meshctl` sends: a request with the id it keeps across retries, so a request asked again
/// (of another replica, after a lost answer) is answered with its first outcome, not run twice.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Call {
    pub id: RequestId,
    pub request: Request,
}

impl Call {
    /// `request` with a fresh random id. `None` only when the OS random source fails.
    pub fn new(request: Request) -> Option<Call> {
        let mut id = [0u8; 16];
        getrandom::getrandom(&mut id).ok()?;
        Some(Call {
            id: RequestId(id),
            request,
        })
    }
}

/// A request from an operator.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum Request {
    Status,
    /// Store a new model revision; sends nothing. A machine the model drops while it still runs
    /// modules is refused, unless `drain`: then it stays, with no modules, until a push empties it.
    Apply {
        mesh: Mesh,
        why: String,
        drain: bool,
    },
    /// What a push would send (named and cascaded), mint, revoke and hold, each machine diffed
    /// against its last send (G7). Writes nothing.
    Plan {
        target: PushTarget,
        moves: Vec<String>,
    },
    Push {
        target: PushTarget,
        why: String,
        moves: Vec<String>,
        /// `push --plan FILE`: send only if the leader would plan exactly this (same token).
        plan: Option<Box<PlanView>>,
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
    /// Model applies, sends and settings changes, oldest first, one page at a time.
    History {
        query: HistoryQuery,
    },
    /// A consistent backup of the store that `meshd restore` takes, one chunk at a time: without
    /// `snapshot` the replica takes a new backup and answers its first chunk; with it, the chunk of
    /// that backup at `offset`.
    SnapshotChunk {
        snapshot: Option<u64>,
        offset: u64,
    },
    /// The first envelope of a machine that never ran (G11): composed, minted and recorded as a
    /// push of it would be, its cascade sent, its own envelope sealed and returned.
    Genesis {
        machine: String,
        why: String,
    },
    /// Reload this replica's certificate, key and CA set from its files (decision 0170). Answered
    /// by the replica asked, never forwarded: meshctl asks each one.
    CertsReload,
    /// This replica's own certificate, its peers' (from their last handshakes), the CA count and
    /// the deny list. Answered by the replica asked.
    CertsList,
    /// Add a certificate serial or a principal to the deny list (decision 0172).
    CertsRevoke {
        target: String,
        why: String,
    },
    /// One chunk of a model too large for one `Apply` (over [`apply_inline_bytes_max`] encoded),
    /// kept in the staging record; the current model is untouched (decision 0185). `bytes` is
    /// chunk `index` (from 0) of `chunks_total`, slices of the encoded model of `bytes_total`.
    ApplyChunk {
        upload: UploadId,
        index: u32,
        chunks_total: u32,
        bytes_total: u64,
        bytes: Chunk,
    },
    /// `Apply` of the model staged as `upload`, whose encoded bytes have blake3 `digest`: checked
    /// and made current in one commit, its staging dropped.
    ApplyUpload {
        upload: UploadId,
        digest: [u8; 32],
        why: String,
        drain: bool,
    },
    /// `meshctl logs`: the replica asked relays `ask` to `machine`'s mesh-host and answers with
    /// what it read (`controller/logs.rs`). Answered by the replica asked.
    Logs {
        machine: String,
        ask: LogsAsk,
    },
    /// `meshctl replicas list`: the membership as the leader knows it (decision 0230).
    ReplicasList,
    /// `meshctl replicas add`: replica `id` at `addr` with envelope key `key` joins as a learner
    /// and becomes a voter through joint consensus once every host has its key.
    ReplicasAdd {
        id: u64,
        addr: String,
        key: [u8; 32],
    },
    /// `meshctl replicas remove`: replica `id` leaves through joint consensus.
    ReplicasRemove {
        id: u64,
    },
    /// `meshctl events`: a page of the leader's event log, waiting for the next event when
    /// asked (decision 0308).
    Events {
        query: super::events::EventsQuery,
    },
    // Issue 25 items 1 and 2 (decision 0302): read back and roll back. New variants go last.
    /// `meshctl model show` and `meshctl diff`: the model in force, or as kept at model revision
    /// `revision`, with the settings layers that name it. Writes nothing.
    ModelShow {
        revision: Option<u64>,
    },
    /// `meshctl rollback`: store a new model revision equal to model revision `to_revision`'s
    /// model, through every check an apply makes. Sends nothing.
    Rollback {
        to_revision: u64,
        why: String,
        drain: bool,
    },
    /// `meshctl settings rollback`: one settings write that makes `scope`'s layer what it was
    /// right after settings history entry `to` (decision 0303). Sends nothing.
    SettingsRollback {
        scope: Scope,
        to: u64,
        why: String,
    },
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
    pub id: RequestId,
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
    /// A new model revision and the machines behind their last send once it is stored.
    Applied {
        revision: u64,
        changes: Vec<String>,
        /// Settings scopes where the file differs from the store; not written (use `settings set`).
        settings_ignored: Vec<String>,
        /// Machines the file drops that still run modules, kept with none (`--drain`).
        draining: Vec<String>,
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
    History(HistoryPage),
    /// `total` bytes in all; this chunk starts at `offset`.
    SnapshotChunk {
        snapshot: u64,
        total: u64,
        offset: u64,
        bytes: Vec<u8>,
        epoch_floor: u64,
    },
    /// The sealed genesis envelope, and the push lines of the machines it cascaded to.
    Genesis {
        envelope: Vec<u8>,
        cascade: PushView,
    },
    CertsReloaded(super::certs::ReloadView),
    Certs(super::certs::CertsView),
    /// The deny list holds `target` now, among `entries`.
    CertsRevoked {
        target: String,
        entries: usize,
    },
    /// A chunk of `upload` is staged: `received` of its `chunks_total` are.
    ChunkStaged {
        upload: UploadId,
        received: u32,
        chunks_total: u32,
    },
    /// Module output read by a machine's host, bounded in lines and bytes.
    Logs(LogsAnswer),
    Replicas(super::members::ReplicasView),
    /// A page of the leader's event log (decision 0308).
    Events(super::events::EventsPage),
    // Issue 25 items 1 and 2 (decision 0302). New variants go last.
    /// An apply (or rollback) of the model already in force: nothing was stored.
    ApplyUnchanged {
        /// The model revision in force, which already has this model.
        revision: u64,
        /// Settings scopes where the file differs from the store (not written, as ever).
        settings_ignored: Vec<String>,
    },
    /// `Request::ModelShow`.
    Model(ModelView),
    /// A settings rollback that found the layer already as asked: nothing was written.
    SettingsUnchanged {
        scope: Scope,
        to: u64,
    },
}

/// `meshctl model show`: a stored model with what it includes (decision 0302).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ModelView {
    /// The model revision shown (the last model apply, or the one asked for); `None` for a
    /// store whose model came before model history was kept.
    pub model_revision: Option<u64>,
    /// The store's revision now (settings writes and mints move it too).
    pub store_revision: u64,
    /// Whether this is the model in force (no `--revision`, or the revision of the last apply).
    pub current: bool,
    /// Machines and modules as kept, and the settings layers in force now that name them.
    pub mesh: Mesh,
    /// Layers in force left out because they name a machine or module this model lacks.
    pub settings_left_out: Vec<Scope>,
    /// Who stored it, why and when, when the model history has the revision.
    pub change: Option<ModelChange>,
}

/// Why a request failed: one enum per operation beside the shared cases (decision 0210).
mod error;
pub use error::{
    ApiError, ApplyError, CertsError, ErrorClass, GenesisError, LogsError, ModelError, PushError,
    SettingsError, SettingsRule, SnapshotError,
};

/// `meshctl status`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct StatusView {
    pub replicas: Vec<ReplicaView>,
    pub machines: Vec<MachineView>,
    pub revision: u64,
    pub epoch_floor: u64,
    /// Set when this replica found its store reset below the floor it knew (G9).
    pub store_reset: Option<String>,
    /// Certificates this replica knows of (its own, its peers' from their handshakes) that
    /// expire within 30 days, soonest first.
    pub certs_expiring: Vec<super::certs::CertView>,
}

/// One replica as it answered a probe just now (`status_ping_ms`), or did not.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReplicaView {
    pub id: u64,
    pub addr: String,
    /// It said it leads.
    pub leader: bool,
    /// The term it reported; 0 when it did not answer.
    pub epoch: u64,
    /// It answered the probe of this status request.
    pub reachable: bool,
    /// What it said, when it answered.
    pub said: Option<ReplicaSaid>,
}

/// What a replica said of itself in answer to a status probe.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReplicaSaid {
    pub role: mesh_raft::Role,
    /// Index of the last entry in its log.
    pub log_index: Option<u64>,
    /// Entries it is behind the longest log among the replicas that answered.
    pub lag: u64,
    /// How long its answer took, in milliseconds (0 for the replica that answers the status).
    pub answered_in_ms: u64,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct MachineView {
    pub name: String,
    pub last_send: Option<(u64, u64, Digest)>,
    /// `(epoch, sequence, report_sequence, applied digest)` of the last accepted report.
    pub last_report: Option<(u64, u64, u64, Option<Digest>)>,
    pub behind: bool,
    /// Why it is behind, in words (`never sent`, `declaration changed`, `1 mint pending`...);
    /// empty when it is not.
    pub behind_why: Vec<String>,
    pub holds: Vec<HeldMount>,
    pub refused_reports: u64,
    /// Every module as the last accepted report shows it; empty before any report.
    pub modules: Vec<ModuleStatus>,
    /// Those modules summed up (failing, settling, ready); `None` before any report.
    pub health: Option<Health>,
    /// When the leader filed that report: its wall clock, ms since the Unix epoch.
    pub report_filed_ms: Option<u64>,
    /// How long before this answer that was, on the answering replica's clock.
    pub report_age_ms: Option<u64>,
    /// How long ago the leader that answers last heard the host (any report, changed or not;
    /// kept in its memory only, decision 0216). `None`: not since it took office, or the answer
    /// is not a leader's.
    pub heard_ago_ms: Option<u64>,
    /// The host refused this leader's envelope as older than one it holds, and nothing signed
    /// by a trusted replica shows that it does (a mark edited or corrupt on its disk, issue 27):
    /// the refusal, until a later send of this leader is applied. Kept in the leader's memory.
    pub unproven_refusal: Option<String>,
    /// The host's reports were refused by this leader for size or rate (over their bounds, or
    /// over its quota in the report queue; decision 0299) less than a minute ago: how many, the
    /// last's age and reason. Kept in the leader's memory; `None` when not, or not a leader's.
    pub report_refusal: Option<String>,
    /// The answering leader has not heard the host for this long, at least its `silent_after_ms`
    /// (decision 0301): the host is `SILENT`, and never "up to date". When the leader has not
    /// heard it since it took office, how long it has led (a lower bound). `None`: heard within
    /// the threshold, a leader that took office less than the threshold ago and has not heard it
    /// yet, or an answer that is not a leader's. Kept in the leader's memory; it clears at the
    /// host's next report.
    pub silent_for_ms: Option<u64>,
    /// What the last report says differs from the declaration the host runs, as `module: what`
    /// (`broker: conf/broker.conf changed`; decision 0305): the machine is `DRIFTED`, never "up to
    /// date", and behind until a push restores it. Empty when it runs as declared.
    pub drifted: Vec<String>,
}

/// `meshctl plan`: everything the push would do, machine by machine, like `terraform plan`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PlanView {
    pub target: PushTarget,
    pub moves: Vec<String>,
    /// The model revision planned from.
    pub revision: u64,
    /// Every machine the push would send or hold, in plan order (targets, then each cascade round).
    pub machines: Vec<PlannedMachine>,
    /// Provisions the push would mint, committed before any send carries them.
    pub mints: Vec<PlannedMint>,
    /// blake3 over what this plan would do (secrets of new mints left out); `push --plan` sends
    /// the plan only while the leader would still plan exactly this.
    pub token: String,
}

impl PlanView {
    /// Whether the push would change anything on any machine.
    pub fn changes_anything(&self) -> bool {
        self.machines
            .iter()
            .any(|m| !m.changes.is_empty() || !m.holds.is_empty())
            || !self.mints.is_empty()
    }
}

/// One machine of a plan.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PlannedMachine {
    pub machine: String,
    /// `named`, `behind`, `all`, `cascaded from ace`, `cascaded from ace: module db moved`.
    pub reason: String,
    /// The would-send against the last send, sorted by module then item.
    pub changes: Vec<PlannedChange>,
    /// Non-empty when the machine would be held instead of sent (G8).
    pub holds: Vec<HeldMount>,
}

/// One changed item. `was`/`now` hold the value in the clear for settings and env (the store has
/// them), digests for files and secrets; `None` on the side where the item is absent.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PlannedChange {
    pub module: String,
    /// `module` for the module as a whole, else e.g. `setting log_level`, `provision p-…`.
    pub item: String,
    pub was: Option<String>,
    pub now: Option<String>,
}

/// The item of a [`PlannedChange`] that restores drift the host reported (decision 0305): the
/// declaration is the same, the host is not; `was` says what differs, `now` is `as sent`.
pub const drift_item: &str = "drift";

/// A provision a push would mint.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PlannedMint {
    pub id: String,
    pub kind: String,
    pub consumer: String,
    pub provider: String,
}

/// `meshctl push`: one line per machine.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PushView {
    pub epoch: u64,
    pub lines: Vec<PushLine>,
}

/// Codec label of a [`PushEvent`].
pub const push_event_what: &str = "push event";

/// What a streamed push says before its answer (decision 0190), each event one chunk of the
/// answer's stream: `Begin` once the push planned, then a `Line` per machine as it settles. The
/// answer still carries every line (a chunk may have been skipped for a slow reader).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum PushEvent {
    Begin { epoch: u64, machines: Vec<String> },
    Line(PushLine),
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
    /// Recorded and perhaps sent, but not confirmed: the host was unreachable, did not answer in
    /// time, or its answer was unreadable. Its report will settle it; meshctl exits 1.
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
    /// Not sent: the push stopped (gate closed, leadership lost, store refused), the machine has
    /// no address in `[hosts]`, or the envelope could not be sealed.
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

/// Largest encoded model one `Request::Apply` carries (one proposal, under raft's default
/// `batch_bytes_max` of 4 MiB with 64 KiB left for the rest); meshctl sends a larger one in
/// chunks of at most [`upload_chunk_bytes_max`] (`ApplyChunk`, then `ApplyUpload`).
pub const apply_inline_bytes_max: usize = 4 * 1024 * 1024 - 64 * 1024;

/// Bytes of a backup in one `snapshot save` chunk, well under a frame.
pub const snapshot_chunk_bytes: usize = 4 * 1024 * 1024;

/// Most items in one history page.
pub const history_page_items_max: u32 = 1_000;
/// Most encoded bytes of items in one history page, well under a frame (`frame_bytes_max`).
pub const history_page_bytes_max: usize = 4 * 1024 * 1024;

/// Which history items to answer: those at or after `since_ms` (with `machine` only its sends,
/// with `settings_only` only settings changes, of `scope` if given), from the `offset`-th of them, at most `limit` (capped by [`history_page_items_max`] and
/// [`history_page_bytes_max`]). `limit` 0 asks only for the total.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct HistoryQuery {
    pub offset: u64,
    pub limit: u32,
    pub since_ms: Option<u64>,
    pub machine: Option<String>,
    /// Only settings changes (`settings show --history`), and with `scope` only that scope's.
    pub settings_only: bool,
    pub scope: Option<Scope>,
}

/// One page of history: the items from `offset`, and how many match the query in all. The next
/// page starts at `offset + items.len()`; the history ends when that reaches `total`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct HistoryPage {
    pub items: Vec<HistoryItem>,
    pub offset: u64,
    pub total: u64,
}

/// `meshctl history`: model applies, sends, settings changes and revocations, newest last.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum HistoryItem {
    Send(SendRecord),
    Settings(SettingsChange),
    Model(ModelChange),
    /// A row of the deny list in force: a certificate or principal revoked, a replica retired
    /// (`replica:N`, decision 0294), with who, why and when. A row a model apply lifted (its
    /// machine came back) is gone from here too.
    Revocation(crate::store::revoked::DenyEntry),
}
