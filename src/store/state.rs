//! The domain state every replica holds, and the one function that changes it: [`DomainState::apply`].
//!
//! `apply` is deterministic and does no I/O: it checks a proposal's conditions (G4), changes the state,
//! and names what changed so the redb layer can write exactly those rows in the same transaction.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

use super::command::{
    Applied, Command, HeldMount, ModelChange, Outcome, Proposal, Refusal, Remembered, RequestId,
    SendRecord, SettingsEntry, requests_remembered_max,
};
use crate::core::layer_delta::{LayerDelta, edit_delta};
use crate::core::model::{Mesh, Provision};
use crate::core::report::{Account, Filed};
use crate::core::settings::{self, Scope};
use crate::core::validate::{scope_problem, validate};

/// What one replica knows of the mesh. Everything here is replicated through the Raft log.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct DomainState {
    /// Bumps with every change that can alter a composed declaration: model, settings, mints.
    pub revision: u64,
    /// The model with its settings layers.
    pub mesh: Mesh,
    pub provisions: BTreeMap<String, Provision>,
    /// The last send per machine.
    pub last_sends: BTreeMap<String, SendRecord>,
    pub accounts: BTreeMap<String, Account>,
    pub holds: BTreeMap<String, Vec<HeldMount>>,
    /// The highest epoch ever used (G9).
    pub epoch_floor: u64,
    /// The next id for a settings history entry.
    pub next_history_id: u64,
    /// The first outcome of recent operator requests, by id (`Command::Once`).
    pub requests: BTreeMap<RequestId, Remembered>,
    /// The same requests by the order they were remembered in, to forget the oldest.
    pub request_order: BTreeMap<u64, RequestId>,
    /// The deny list: revoked certificates and principals (decision 0172).
    pub revoked: super::revoked::DenyMap,
    /// Models being uploaded in chunks, not yet applied (decision 0185).
    pub uploads: BTreeMap<super::staging::UploadId, super::staging::Upload>,
    /// The envelope keys of replicas added after init (decision 0230).
    pub signers: super::signers::Signers,
    /// The model revisions whose model is kept (table `model_revisions`, decision 0302), each
    /// with its encoded size: what pruning counts. Rebuilt from the table (or a snapshot's rows)
    /// on load and install, so it is not part of a snapshot's state.
    #[serde(skip)]
    pub model_revisions: BTreeMap<u64, u64>,
}

/// How many model revisions keep their model (decision 0302): the newest 50, enough to roll
/// back across weeks of daily applies.
pub const model_revisions_kept_max: usize = 50;
/// Most bytes of kept models together (decision 0302): 64 MiB, eight models of the largest size
/// (`model_bytes_max`, 8 MiB). The newest model is always kept, whatever its size.
pub const model_revisions_bytes_max: u64 = 64 * 1024 * 1024;

/// How many settings changes the history keeps: the newest 10,000. An older change leaves the
/// store as a newer one is written (decision 0341): the history stays readable in full by `plan`,
/// `history` and `settings show --history`, and the disk does not grow with every write for ever.
pub const settings_history_kept_max: u64 = 10_000;
/// Settings history rows beyond [`settings_history_kept_max`] leave in sweeps of at most this
/// many per write, so a store that kept more (written before the bound) sheds them gradually.
pub const settings_history_cut_together: u64 = 1_024;

/// Forgotten requests leave the store in sweeps of this many rows, one range removal each
/// (decision 0330); until then their rows stay, and [`DomainState::forget_beyond_the_limit`]
/// skips them at load. Memory keeps exactly [`requests_remembered_max`] all the same.
pub const requests_swept_together: u64 = 1_024;

/// A row the redb layer must write after an apply, in the same transaction.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Changed {
    Model,
    /// The layer exists or not (its row in `settings_layers`).
    SettingsLayer(Scope),
    /// Keys of a layer to write as they are now (or remove, when gone): the keys a write changed
    /// (decision 0317), or every key when a whole layer is written.
    SettingsLayerKeys {
        scope: Scope,
        keys: Vec<String>,
    },
    SettingsHistory(SettingsEntry),
    ModelHistory(ModelChange),
    Provision(String),
    Send {
        machine: String,
        sequence: u64,
    },
    Account(String),
    Holds(String),
    EpochFloor,
    Revision,
    /// A request remembered (in the state) or forgotten (gone from it), with the order it was
    /// remembered in: its row's key starts with it (migration 0010).
    Request {
        id: RequestId,
        order: u64,
    },
    /// The rows of every request remembered before order `below` removed, all forgotten already
    /// (decision 0330): a forgotten request's row stays until such a sweep, and a load skips it.
    RequestsForgotten {
        below: u64,
    },
    /// A deny-list row added or removed, by its key.
    Revoked(String),
    /// An upload's head row written, or (gone from the state) its head and chunk rows removed.
    Upload(super::staging::UploadId),
    /// One chunk row of an upload written.
    UploadChunk {
        upload: super::staging::UploadId,
        index: u32,
    },
    /// A replica's envelope key written or (gone from the state) removed.
    Signer(u64),
    /// The model of a model revision, encoded as the `model` table holds it, kept (decision 0302).
    ModelRevision {
        revision: u64,
        bytes: std::sync::Arc<Vec<u8>>,
    },
    /// A kept model revision's model pruned (over the count or byte limit).
    ModelRevisionPruned(u64),
}

impl DomainState {
    /// Applies one committed proposal whose Raft entry has term `term`. Returns the answer and the rows
    /// to write; a refusal changes nothing but the epoch floor, which every
    /// observed term raises.
    pub fn apply(&mut self, term: u64, proposal: &Proposal) -> (Outcome, Vec<Changed>) {
        let mut changed = Vec::new();
        // Every term seen raises the floor, whether or not the command goes through (G9).
        if term > self.epoch_floor {
            self.epoch_floor = term;
            changed.push(Changed::EpochFloor);
        }
        if let Err(refusal) = self.check(term, proposal) {
            return (Outcome::Refused(refusal), changed);
        }
        match self.apply_checked(proposal, &mut changed) {
            Ok(applied) => (Outcome::Applied(applied), changed),
            Err(refusal) => (Outcome::Refused(refusal), changed),
        }
    }

    /// Raises the floor for an entry that carries no command (a leader's blank entry, a membership change).
    pub fn observe_term(&mut self, term: u64) -> Option<Changed> {
        if term > self.epoch_floor {
            self.epoch_floor = term;
            return Some(Changed::EpochFloor);
        }
        None
    }

    fn check(&self, term: u64, proposal: &Proposal) -> Result<(), Refusal> {
        if proposal.epoch != term {
            return Err(Refusal::StaleEpoch {
                epoch: proposal.epoch,
                term,
            });
        }
        // A floor above the term means a host proved an epoch this term may not sign past (a
        // reused term after a restore without floor files, decision 0272, or a newer epoch,
        // decision 0151): nothing that leads to an envelope is recorded until the leader moved
        // above it. Other commands go on (operators, reports).
        let mut command = &proposal.command;
        while let Command::Once { command: inner, .. } = command {
            command = inner;
        }
        if term < self.epoch_floor
            && matches!(command, Command::RecordSends { .. } | Command::Mint { .. })
        {
            return Err(Refusal::StaleEpoch {
                epoch: proposal.epoch,
                term: self.epoch_floor,
            });
        }
        if let Some(expected) = proposal.expect_revision
            && expected != self.revision
        {
            return Err(Refusal::RevisionMoved {
                expected,
                actual: self.revision,
            });
        }
        Ok(())
    }

    /// The next sequence for `machine`: strictly increasing across epochs.
    pub fn next_sequence(&self, machine: &str) -> u64 {
        self.last_sends.get(machine).map_or(1, |s| s.sequence + 1)
    }

    fn apply_checked(
        &mut self,
        p: &Proposal,
        changed: &mut Vec<Changed>,
    ) -> Result<Applied, Refusal> {
        self.apply_command(p, &p.command, changed)
    }

    /// The first outcome of operator request `id`, if it ran recently.
    pub fn remembered(&self, id: &RequestId) -> Option<&Applied> {
        self.requests.get(id).map(|r| &r.applied)
    }

    /// Forgets the oldest requests beyond [`requests_remembered_max`]: a store holds the rows
    /// of up to [`requests_swept_together`] more, forgotten and not yet swept (decision 0330),
    /// and a state read from it remembers what the state that wrote it did.
    pub fn forget_beyond_the_limit(&mut self) {
        while self.requests.len() > requests_remembered_max {
            let Some((_, oldest)) = self.request_order.pop_first() else {
                break;
            };
            self.requests.remove(&oldest);
        }
    }

    /// Keeps `applied` as request `id`'s outcome, forgetting the oldest beyond the limit.
    fn remember_request(&mut self, id: RequestId, applied: &Applied, changed: &mut Vec<Changed>) {
        let order = self
            .request_order
            .last_key_value()
            .map_or(0, |(o, _)| o + 1);
        self.requests.insert(
            id,
            Remembered {
                order,
                applied: applied.clone(),
            },
        );
        self.request_order.insert(order, id);
        changed.push(Changed::Request { id, order });
        while self.requests.len() > requests_remembered_max {
            let Some((order, oldest)) = self.request_order.pop_first() else {
                break;
            };
            self.requests.remove(&oldest);
            // The forgotten rows leave the store together, not one per write (decision 0330).
            if (order + 1) % requests_swept_together == 0 {
                changed.push(Changed::RequestsForgotten { below: order + 1 });
            }
        }
    }

    fn apply_command(
        &mut self,
        p: &Proposal,
        command: &Command,
        changed: &mut Vec<Changed>,
    ) -> Result<Applied, Refusal> {
        match command {
            Command::Once { request, command } => {
                if let Some(first) = self.remembered(request) {
                    return Ok(first.clone());
                }
                if matches!(**command, Command::Once { .. }) {
                    return Err(Refusal::Invalid(format!(
                        "request {request} wraps another request; propose each once"
                    )));
                }
                let applied = self.apply_command(p, command, changed)?;
                self.remember_request(*request, &applied, changed);
                Ok(applied)
            }
            Command::ApplyModel { mesh, why, changes } => {
                self.apply_model_command(p, mesh, why, changes, changed)
            }
            Command::StageChunk {
                upload,
                index,
                chunks_total,
                bytes_total,
                bytes,
            } => {
                let at = super::staging::ChunkAt {
                    upload,
                    index: *index,
                    chunks_total: *chunks_total,
                    bytes_total: *bytes_total,
                    bytes,
                };
                super::staging::stage_chunk(self, p, at, changed)
            }
            Command::ApplyUpload {
                upload,
                digest,
                why,
                changes,
                keep,
            } => {
                let mesh = super::staging::apply_upload(self, p, upload, digest, keep)?;
                let applied = self.apply_model_command(p, &mesh, why, changes, changed)?;
                super::staging::drop_upload(self, upload, changed);
                Ok(applied)
            }
            Command::SetSettings {
                scope,
                set,
                remove,
                replace,
                why,
            } => {
                self.check_scope(scope)?;
                let edit = settings::Edit {
                    set: set.clone(),
                    remove: remove.clone(),
                };
                // The delta, not a new whole layer: a write to a large layer costs the keys it
                // writes (decision 0317).
                let delta = edit_delta(self.mesh.settings.layers.get(scope), &edit, *replace)
                    .map_err(|e| Refusal::Invalid(format!("settings {scope}: {e}")))?;
                delta.apply(&mut self.mesh.settings.layers, scope);
                let applied = Applied::Settings {
                    revision: self.revision + 1,
                    added: delta.added().map(String::from).collect(),
                    changed: delta.changed().map(String::from).collect(),
                    removed: delta.removed().map(String::from).collect(),
                };
                self.remember(p, scope, delta, why, changed);
                self.bump(changed);
                Ok(applied)
            }
            Command::ClearSettings { scope, why } => {
                let Some(before) = self.mesh.settings.layers.remove(scope) else {
                    return Err(Refusal::Invalid(format!(
                        "settings scope {scope} has no layer to clear"
                    )));
                };
                let removed = before.keys().cloned().collect();
                self.remember(p, scope, LayerDelta::clear(&before), why, changed);
                self.bump(changed);
                Ok(Applied::Settings {
                    revision: self.revision,
                    added: vec![],
                    changed: vec![],
                    removed,
                })
            }
            Command::Mint { provisions } => self.mint(provisions, changed),
            Command::RecordSends { sends } => self.record_sends(sends, changed),
            Command::RecordReport { report } => {
                let account = self.accounts.entry(report.machine.clone()).or_default();
                let filed = account.file_at(report.clone(), p.time_ms);
                let accepted = matches!(filed, Filed::Accepted);
                changed.push(Changed::Account(report.machine.clone()));
                Ok(Applied::Report {
                    machine: report.machine.clone(),
                    accepted,
                })
            }
            Command::RecordReports { reports } => {
                let mut accepted = Vec::with_capacity(reports.len());
                for filing in reports {
                    let machine = &filing.report.machine;
                    let account = self.accounts.entry(machine.clone()).or_default();
                    let filed = account.file_above(filing.report.clone(), filing.heard, p.time_ms);
                    accepted.push(matches!(filed, Filed::Accepted));
                    changed.push(Changed::Account(machine.clone()));
                }
                Ok(Applied::Reports { accepted })
            }
            Command::SetHolds { machine, holds } => {
                self.holds.insert(machine.clone(), holds.clone());
                changed.push(Changed::Holds(machine.clone()));
                Ok(Applied::Holds {
                    machine: machine.clone(),
                })
            }
            Command::ReleaseHolds { machine } => {
                self.holds.remove(machine);
                changed.push(Changed::Holds(machine.clone()));
                Ok(Applied::Holds {
                    machine: machine.clone(),
                })
            }
            Command::Revoke { target, why } => {
                super::revoked::revoke(self, p, target, why, changed)
            }
            Command::SetSigner { replica, key } => {
                super::signers::set_signer(self, p, *replica, *key, changed)
            }
            Command::RaiseEpochFloor { epoch } => {
                if *epoch > self.epoch_floor {
                    self.epoch_floor = *epoch;
                    changed.push(Changed::EpochFloor);
                }
                Ok(Applied::EpochFloor {
                    floor: self.epoch_floor,
                })
            }
        }
    }

    /// `ApplyModel` (inline, or staged through an upload): the model rules again (the controller
    /// checked them before proposing; this holds for any proposer), no machine leaves while it
    /// still runs modules, then the model and its history row.
    fn apply_model_command(
        &mut self,
        p: &Proposal,
        mesh: &Mesh,
        why: &str,
        changes: &[String],
        changed: &mut Vec<Changed>,
    ) -> Result<Applied, Refusal> {
        validate(mesh).map_err(|e| Refusal::Invalid(e.to_string()))?;
        for machine in self.mesh.machines.keys() {
            if mesh.machines.contains_key(machine) {
                continue;
            }
            if let Some(why) = self.still_runs(machine) {
                return Err(Refusal::Invalid(leave_refused(machine, &why)));
            }
        }
        super::revoked::revoke_dropped_machines(self, p, mesh, changed)?;
        // Encoded before anything changes, so a refusal leaves the state as it was. The kept
        // model is what the `model` table holds: machines and modules, settings apart.
        let stored = Mesh {
            settings: Default::default(),
            ..mesh.clone()
        };
        let bytes = mesh_codec::encode("model", &stored)
            .map_err(|e| Refusal::Invalid(format!("the model does not encode: {e}")))?;
        let applied = self.apply_model(p, mesh, why, changed);
        self.keep_model_revision(bytes, changed);
        changed.push(Changed::ModelHistory(ModelChange {
            revision: self.revision,
            why: why.to_string(),
            actor: p.actor.clone(),
            epoch: p.epoch,
            time_ms: p.time_ms,
            changes: changes.to_vec(),
        }));
        Ok(applied)
    }

    /// Stores machines and modules. Settings change only through settings commands, so their history
    /// is kept: a file's settings seed the layers on the very first apply (each recorded in history),
    /// and are otherwise compared and reported, never written.
    fn apply_model(
        &mut self,
        p: &Proposal,
        mesh: &Mesh,
        why: &str,
        changed: &mut Vec<Changed>,
    ) -> Applied {
        let first = self.first_apply();
        let mut settings_ignored = Vec::new();
        if first {
            for (scope, layer) in &mesh.settings.layers {
                self.remember(
                    p,
                    scope,
                    LayerDelta::between(None, Some(layer)),
                    why,
                    changed,
                );
            }
            self.mesh = mesh.clone();
        } else {
            settings_ignored = self.settings_ignored(mesh);
            let settings = std::mem::take(&mut self.mesh.settings);
            self.mesh = Mesh {
                settings,
                ..mesh.clone()
            };
        }
        self.bump(changed);
        changed.push(Changed::Model);
        Applied::Model {
            revision: self.revision,
            settings_ignored,
        }
    }

    /// Keeps the model just applied as its revision's, then prunes the oldest kept while more
    /// than [`model_revisions_kept_max`] are kept or they hold more than
    /// [`model_revisions_bytes_max`] together; the newest is never pruned.
    fn keep_model_revision(&mut self, bytes: Vec<u8>, changed: &mut Vec<Changed>) {
        self.model_revisions
            .insert(self.revision, bytes.len() as u64);
        changed.push(Changed::ModelRevision {
            revision: self.revision,
            bytes: std::sync::Arc::new(bytes),
        });
        loop {
            let total: u64 = self.model_revisions.values().sum();
            let over = self.model_revisions.len() > model_revisions_kept_max
                || total > model_revisions_bytes_max;
            if !over || self.model_revisions.len() <= 1 {
                break;
            }
            let Some((oldest, _)) = self.model_revisions.pop_first() else {
                break;
            };
            changed.push(Changed::ModelRevisionPruned(oldest));
        }
    }

    /// The first apply of a store: its file's settings seed the layers.
    fn first_apply(&self) -> bool {
        self.revision == 0 && self.mesh.machines.is_empty() && self.mesh.settings.layers.is_empty()
    }

    /// Whether an apply of `mesh` would store the model already in force (issue 25 item 1): the
    /// same machines and modules. Settings do not count: after the first apply an apply never
    /// writes them. Such an apply stores nothing: no revision, no history row.
    pub fn model_unchanged(&self, mesh: &Mesh) -> bool {
        !self.first_apply()
            && self.mesh.machines == mesh.machines
            && self.mesh.modules == mesh.modules
    }

    /// The settings scopes where `mesh`'s layers differ from the store's: an apply leaves them
    /// as the store has them (they change with settings commands, which keep history).
    pub fn settings_ignored(&self, mesh: &Mesh) -> Vec<String> {
        let mut ignored = Vec::new();
        for scope in mesh
            .settings
            .layers
            .keys()
            .chain(self.mesh.settings.layers.keys())
        {
            if mesh.settings.layers.get(scope) != self.mesh.settings.layers.get(scope) {
                ignored.push(scope.to_string());
            }
        }
        ignored.sort();
        ignored.dedup();
        ignored
    }

    fn mint(
        &mut self,
        provisions: &[Provision],
        changed: &mut Vec<Changed>,
    ) -> Result<Applied, Refusal> {
        for p in provisions {
            if self.provisions.contains_key(&p.id) {
                return Err(Refusal::Invalid(format!(
                    "provision {} is already minted",
                    p.id
                )));
            }
        }
        let mut ids = Vec::new();
        for p in provisions {
            self.provisions.insert(p.id.clone(), p.clone());
            changed.push(Changed::Provision(p.id.clone()));
            ids.push(p.id.clone());
        }
        self.bump(changed);
        Ok(Applied::Minted {
            revision: self.revision,
            ids,
        })
    }

    /// All or nothing: every record is checked before any is kept.
    fn record_sends(
        &mut self,
        sends: &[SendRecord],
        changed: &mut Vec<Changed>,
    ) -> Result<Applied, Refusal> {
        let mut seen = std::collections::BTreeSet::new();
        for send in sends {
            if !seen.insert(send.machine.as_str()) {
                return Err(Refusal::Invalid(format!(
                    "machine {} appears twice in one push",
                    send.machine
                )));
            }
            let expected = self.next_sequence(&send.machine);
            if send.sequence != expected {
                return Err(Refusal::SequenceOutOfOrder {
                    machine: send.machine.clone(),
                    got: send.sequence,
                    expected,
                });
            }
            if !self.mesh.machines.contains_key(&send.machine) {
                return Err(Refusal::Invalid(format!(
                    "machine {} is not in the model",
                    send.machine
                )));
            }
        }
        let mut sequences = Vec::new();
        for send in sends {
            self.last_sends.insert(send.machine.clone(), send.clone());
            changed.push(Changed::Send {
                machine: send.machine.clone(),
                sequence: send.sequence,
            });
            sequences.push((send.machine.clone(), send.sequence));
        }
        Ok(Applied::Sent { sequences })
    }

    /// Keeps a settings write in history as the keys it changed, and names the layer's rows to
    /// write: those keys and the layer's presence (decision 0317).
    fn remember(
        &mut self,
        p: &Proposal,
        scope: &Scope,
        delta: LayerDelta,
        why: &str,
        changed: &mut Vec<Changed>,
    ) {
        self.next_history_id += 1;
        // The layer's row says only that it exists: written when that changes (decision 0330).
        let presence = delta.created || delta.cleared;
        changed.push(Changed::SettingsLayerKeys {
            scope: scope.clone(),
            keys: delta.keys.keys().cloned().collect(),
        });
        changed.push(Changed::SettingsHistory(SettingsEntry {
            id: self.next_history_id,
            scope: scope.clone(),
            delta,
            why: why.to_string(),
            actor: p.actor.clone(),
            epoch: p.epoch,
            time_ms: p.time_ms,
        }));
        if presence {
            changed.push(Changed::SettingsLayer(scope.clone()));
        }
    }

    /// A scope must name machines, modules and placements of the model: a layer for something that
    /// does not exist would silently apply to nothing. The rule is [`scope_problem`], the one the mesh
    /// file follows too.
    pub fn check_scope(&self, scope: &Scope) -> Result<(), Refusal> {
        match scope_problem(&self.mesh, scope) {
            Some(problem) => Err(Refusal::Invalid(format!(
                "settings scope {scope}: {problem}; name a machine or module of the model (and the machine it runs on), see `meshctl status`"
            ))),
            None => Ok(()),
        }
    }

    /// Whether a report confirmed `machine`'s last send applied.
    pub fn confirmed(&self, machine: &str) -> bool {
        let Some(send) = self.last_sends.get(machine) else {
            return false;
        };
        let report = self.accounts.get(machine).and_then(|a| a.report.as_ref());
        report.is_some_and(|r| {
            r.epoch == send.epoch && r.sequence == send.sequence && r.applied == Some(send.digest)
        })
    }

    /// Why `machine` may still run modules, so it cannot leave the model yet: its last send has
    /// modules, or its last (empty) send is not confirmed applied. `None` when it runs nothing.
    pub fn still_runs(&self, machine: &str) -> Option<String> {
        let send = self.last_sends.get(machine)?;
        let modules: Vec<&str> = send.summary.modules.keys().map(String::as_str).collect();
        if !modules.is_empty() {
            return Some(format!(
                "it still runs {} (send #{})",
                modules.join(", "),
                send.sequence
            ));
        }
        if !self.confirmed(machine) {
            return Some(format!(
                "its send #{} without modules is not confirmed applied yet",
                send.sequence
            ));
        }
        None
    }

    pub(crate) fn bump(&mut self, changed: &mut Vec<Changed>) {
        self.revision += 1;
        changed.push(Changed::Revision);
    }
}

/// The refusal of a model that drops a machine still running modules (issue 9, part 8).
pub fn leave_refused(machine: &str, why: &str) -> String {
    format!(
        "machine {machine} cannot leave the model: {why}; apply with `--drain` to keep it with no modules, push it, then apply again"
    )
}

#[cfg(test)]
mod floor_tests {
    use super::*;

    fn proposal(epoch: u64, command: Command) -> Proposal {
        Proposal {
            epoch,
            expect_revision: None,
            actor: "replica:1".into(),
            time_ms: 1,
            command,
        }
    }

    #[test]
    fn g9_no_send_is_recorded_nor_provision_minted_in_a_term_below_the_floor() {
        // G9 (decision 0272): once the floor is above the leader's term (a host proved that
        // another leadership signed this term), the term records no send and mints nothing, so
        // no envelope of it can leave; a term at the floor records again.
        let mut state = DomainState::default();
        let (out, _) = state.apply(2, &proposal(2, Command::RaiseEpochFloor { epoch: 3 }));
        assert!(matches!(out, Outcome::Applied(_)), "{out:?}");
        let sends = Command::RecordSends { sends: vec![] };
        let mints = Command::Mint { provisions: vec![] };
        for command in [sends.clone(), mints] {
            let (out, _) = state.apply(2, &proposal(2, command));
            assert!(
                matches!(
                    out,
                    Outcome::Refused(Refusal::StaleEpoch { epoch: 2, term: 3 })
                ),
                "{out:?}"
            );
        }
        let (out, _) = state.apply(3, &proposal(3, sends));
        assert!(matches!(out, Outcome::Applied(_)), "{out:?}");
    }
}

#[cfg(test)]
mod kept_models {
    use super::*;
    use crate::core::meshfile::parse_mesh;

    fn apply(state: &mut DomainState, mesh: &Mesh) -> Vec<Changed> {
        let p = Proposal {
            epoch: 1,
            expect_revision: None,
            actor: "operator:op".into(),
            time_ms: 1,
            command: Command::ApplyModel {
                mesh: mesh.clone(),
                why: "test".into(),
                changes: vec![],
            },
        };
        let (out, changed) = state.apply(1, &p);
        assert!(matches!(out, Outcome::Applied(_)), "{out:?}");
        changed
    }

    fn model(file: &str, n: usize) -> Mesh {
        let text = format!(
            "[machines.m]\naddress = \"10.0.0.1\"\n[modules.a]\nmachine = \"m\"\ncommand = \"sh\"\nenv = {{ N = \"{n}\" }}\nfiles = {{ \"f\" = \"{file}\" }}\n[settings.mesh]\nk = \"v\"\n"
        );
        parse_mesh("mesh.toml", &text).expect("parses")
    }

    #[test]
    fn the_store_keeps_the_newest_models_within_the_count_and_byte_limits() {
        // Issue 25 item 1, decision 0302: each model apply keeps its model, and the oldest are
        // pruned past `model_revisions_kept_max` revisions, so kept models cannot fill a disk.
        let mut state = DomainState::default();
        let mut pruned = Vec::new();
        for n in 0..(model_revisions_kept_max + 7) {
            let changed = apply(&mut state, &model("x", n));
            for c in changed {
                if let Changed::ModelRevisionPruned(r) = c {
                    pruned.push(r);
                }
            }
        }
        assert_eq!(state.model_revisions.len(), model_revisions_kept_max);
        assert_eq!(pruned, (1..=7).collect::<Vec<u64>>(), "the oldest go first");
        assert_eq!(
            state.model_revisions.keys().next_back(),
            Some(&state.revision),
            "the newest is kept"
        );
        // The byte budget: models of 3 MiB each, far fewer than the count limit fit.
        let big = "x".repeat(3 * 1024 * 1024);
        let mut state = DomainState::default();
        for n in 0..25 {
            apply(&mut state, &model(&big, n));
        }
        let total: u64 = state.model_revisions.values().sum();
        assert!(total <= model_revisions_bytes_max, "{total}");
        let per = state
            .model_revisions
            .values()
            .next()
            .copied()
            .expect("kept");
        assert_eq!(
            state.model_revisions.len() as u64,
            model_revisions_bytes_max / per,
            "as many as fit in the budget"
        );
    }

    #[test]
    fn an_apply_of_the_model_in_force_is_unchanged_whatever_its_settings() {
        // Issue 25 item 1: applying the stored model again stores nothing; its settings do
        // not count (an apply never writes them after the first); any machine or module does.
        let mut state = DomainState::default();
        let first = model("x", 1);
        assert!(
            !state.model_unchanged(&first),
            "the first apply always stores"
        );
        apply(&mut state, &first);
        assert!(state.model_unchanged(&first));
        let mut other_settings = first.clone();
        other_settings.settings = Default::default();
        assert!(state.model_unchanged(&other_settings));
        assert!(!state.model_unchanged(&model("x", 2)), "an env value moved");
        let mut moved_machine = first.clone();
        if let Some(m) = moved_machine.machines.get_mut("m") {
            m.address = "10.0.0.2".into();
        }
        assert!(!state.model_unchanged(&moved_machine), "an address moved");
    }
}
