//! The operator requests other than push and plan: apply a model, settings (G6), status, history and
//! snapshots. Each validates before it proposes, so a refused request writes nothing.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use mesh_raft::{Probed, probe_replica};

use super::api::{
    ApiError, ApplyError, Body, HistoryItem, HistoryPage, HistoryQuery, MachineView, ReplicaSaid,
    ReplicaView, Request, RequestId, SettingsView, StatusView, history_page_bytes_max,
    history_page_items_max, snapshot_chunk_bytes,
};
use super::api::{PushError, SettingsError, SettingsRule, SnapshotError};
use super::push::known_of;
use super::service::{Service, now_ms};
use crate::core::compose::{World, compose, digest};
use crate::core::layer_delta::{clear_delta, edit_delta};
use crate::core::model::Mesh;
use crate::core::plan::{DigestCache, Lag, ShouldBe, lags};
use crate::core::report::Health;
use crate::core::settings::{Edit, Layer, Scope, effective};
use crate::core::validate::validate;
use crate::store::app::MeshApp;
use crate::store::command::{Applied, Command, Outcome, Refusal};
use crate::store::state::DomainState;

/// How long `status` waits for each replica's answer to its probe; a replica that takes longer is
/// shown unreachable.
pub const status_ping_ms: u64 = 300;
/// How often `apply` checks a model again when concurrent writes moved the revision under it.
pub const apply_attempts_max: u32 = 5;

impl Service {
    /// `Request::Apply`: the model keeps the rules `meshctl check` checks and every machine must
    /// compose with it; a machine it drops must run nothing (or is kept empty with `drain`); then
    /// one write, compare-and-set on the revision it was checked at (the machines it changes were
    /// decided on that read). No lease round: the write only changes the replicated state. When a
    /// concurrent write moved the revision first, it is checked again on the new state, up to
    /// [`apply_attempts_max`] times.
    pub(crate) async fn apply(
        &self,
        actor: &str,
        id: RequestId,
        mesh: Mesh,
        why: String,
        drain: bool,
    ) -> Result<Body, ApiError> {
        super::upload::check_inline(&mesh)?;
        self.apply_model(actor, id, mesh, why, drain, None).await
    }

    /// [`Service::apply`] of `mesh`, inline (`staged` is `None`: the model goes in the proposal)
    /// or staged as an upload (decision 0185: the proposal names the upload and its digest).
    pub(crate) async fn apply_model(
        &self,
        actor: &str,
        id: RequestId,
        mesh: Mesh,
        why: String,
        drain: bool,
        staged: Option<super::upload::Staged>,
    ) -> Result<Body, ApiError> {
        validate(&mesh).map_err(|e| ApplyError::Invalid {
            problems: e.problems.iter().map(ToString::to_string).collect(),
        })?;
        let mut attempt = 0;
        let (revision, settings_ignored, draining) = loop {
            attempt += 1;
            let term = self.leading_term()?;
            let state = self.state()?;
            let mut mesh = mesh.clone();
            let draining = keep_draining(&state, &mut mesh, drain)?;
            // The model in force already: nothing stored, no revision, no history row (issue
            // 25 item 1). Decided on this read; a concurrent write moves the revision, and the
            // write below would be refused and checked again.
            if state.model_unchanged(&mesh) {
                // The model revision in force: the last model apply (a store from before
                // model history has none: its revision then).
                let last = MeshApp::last_model_revision(self.replica.database())
                    .map_err(|e| storage("model history", &e))?;
                return Ok(Body::ApplyUnchanged {
                    revision: last.unwrap_or(state.revision),
                    settings_ignored: state.settings_ignored(&mesh),
                });
            }
            let changes = self.with_work(&state, |work| {
                should_be_changes(&state, work.cache(), &mesh)
            })??;
            let command = Command::Once {
                request: id,
                command: Box::new(super::upload::apply_command(
                    staged,
                    mesh,
                    &draining,
                    why.clone(),
                    changes,
                )),
            };
            match self
                .propose_outcome(term, Some(state.revision), actor, command)
                .await?
            {
                Outcome::Applied(Applied::Model {
                    revision,
                    settings_ignored,
                }) => break (revision, settings_ignored, draining),
                Outcome::Applied(other) => {
                    return Err(ApiError::internal(format!(
                        "the store answered apply with {other:?}"
                    )));
                }
                Outcome::Refused(Refusal::RevisionMoved { .. }) if attempt < apply_attempts_max => {
                    continue;
                }
                Outcome::Refused(refusal) => return Err(apply_refused(refusal)),
            }
        };
        let new_state = self.state()?;
        // Compared with what was last sent, not with the previous revision: a machine already
        // behind stays named, and a machine this revision brings back to its last send is not.
        let changes: BTreeSet<String> = self
            .work
            .with(&new_state, |work| behind_of(&new_state, work.cache()))?;
        Ok(Body::Applied {
            revision,
            changes: changes.into_iter().collect(),
            settings_ignored,
            draining,
        })
    }

    /// The answer to a request asked again after its first outcome was committed: built from that
    /// outcome, with nothing run again.
    pub(crate) async fn answer_remembered(
        &self,
        id: RequestId,
        request: Request,
        first: Applied,
    ) -> Result<Body, ApiError> {
        match (request, first) {
            (
                Request::SettingsSet { scope, .. }
                | Request::SettingsClear { scope, .. }
                | Request::SettingsRollback { scope, .. },
                first,
            ) => settings_answer(scope, first),
            (
                Request::Apply { .. } | Request::ApplyUpload { .. } | Request::Rollback { .. },
                Applied::Model {
                    revision,
                    settings_ignored,
                },
            ) => {
                let state = self.state()?;
                let changes = self
                    .work
                    .with(&state, |work| behind_of(&state, work.cache()))?;
                Ok(Body::Applied {
                    revision,
                    changes: changes.into_iter().collect(),
                    settings_ignored,
                    draining: Vec::new(),
                })
            }
            (Request::Push { .. } | Request::Genesis { .. }, Applied::Sent { sequences }) => {
                let machines: Vec<String> = sequences.into_iter().map(|(m, _)| m).collect();
                Err(PushError::AlreadyRan {
                    request: id.to_string(),
                    machines,
                }
                .into())
            }
            (Request::CertsRevoke { .. }, first) => super::certs::revoked_answer(first),
            (request, first) => Err(ApiError::internal(format!(
                "request {id} was remembered with {first:?}, which does not answer a {} request",
                super::metrics::request_kind(&request)
            ))),
        }
    }

    pub(crate) fn settings_show(
        &self,
        scope: Option<Scope>,
        history: bool,
    ) -> Result<Body, ApiError> {
        let state = self.state()?;
        if let Some(s) = &scope
            && !state.mesh.settings.layers.contains_key(s)
        {
            check_scope(&state, s)?;
        }
        let layers = state
            .mesh
            .settings
            .layers
            .iter()
            .filter(|(s, _)| scope.as_ref().is_none_or(|want| want == *s))
            .map(|(s, l)| (s.clone(), l.clone()))
            .collect();
        if history {
            // An unbounded answer: meshctl pages it with `Request::History` instead.
            return Err(SettingsError::HistoryPaged.into());
        }
        let history = Vec::new();
        let effective = scope
            .as_ref()
            .and_then(|s| placement_of(&state, s))
            .map(|(module, machine)| effective(&state.mesh.settings, &module, &machine));
        Ok(Body::Settings(SettingsView {
            layers,
            effective,
            history,
        }))
    }

    /// `Request::SettingsSet` (G6): checked against the current snapshot for a quick refusal,
    /// then decided again at apply, where the answer per key (added, changed, removed) and a
    /// removal refused without `replace` come from the state the write lands on. No lease round
    /// and no revision check: the write only changes the replicated state, so its commit in this
    /// leader's term is the check, and concurrent writes go into one proposal batch.
    #[allow(clippy::too_many_arguments)]
    pub(crate) async fn settings_set(
        &self,
        actor: &str,
        id: RequestId,
        scope: Scope,
        layer: Layer,
        remove: BTreeSet<String>,
        replace: bool,
        why: String,
    ) -> Result<Body, ApiError> {
        let term = self.leading_term()?;
        let state = self.state()?;
        check_scope(&state, &scope)?;
        let edit = Edit { set: layer, remove };
        // The delta, not the new layer: the check costs the keys written, not a copy of the
        // layer (decision 0317).
        edit_delta(state.mesh.settings.layers.get(&scope), &edit, replace)
            .map_err(|e| rule_broken(&scope, &e))?;
        let Edit { set: layer, remove } = edit;
        drop(state);
        let command = Command::Once {
            request: id,
            command: Box::new(Command::SetSettings {
                scope: scope.clone(),
                set: layer,
                remove,
                replace,
                why,
            }),
        };
        let applied = self
            .propose(term, None, actor, command)
            .await
            .map_err(|e| settings_refused(&scope, e))?;
        settings_answer(scope, applied)
    }

    /// `Request::SettingsClear`: like a set, decided at apply (a layer already gone is refused
    /// there).
    pub(crate) async fn settings_clear(
        &self,
        actor: &str,
        id: RequestId,
        scope: Scope,
        why: String,
    ) -> Result<Body, ApiError> {
        let term = self.leading_term()?;
        let state = self.state()?;
        // A layer left behind by a machine or module the model dropped can still be cleared.
        if !state.mesh.settings.layers.contains_key(&scope) {
            check_scope(&state, &scope)?;
        }
        clear_delta(state.mesh.settings.layers.get(&scope)).map_err(|e| rule_broken(&scope, &e))?;
        drop(state);
        let command = Command::Once {
            request: id,
            command: Box::new(Command::ClearSettings {
                scope: scope.clone(),
                why,
            }),
        };
        let applied = self
            .propose(term, None, actor, command)
            .await
            .map_err(|e| settings_refused(&scope, e))?;
        settings_answer(scope, applied)
    }

    /// `Request::Status`: replicas, machines, revision, floor and any store reset.
    pub(crate) async fn status(&self) -> Result<Body, ApiError> {
        let state = self.state()?;
        let machines = self.machine_views(&state)?;
        Ok(Body::Status(StatusView {
            replicas: self.replica_views().await,
            machines,
            revision: state.revision,
            epoch_floor: state.epoch_floor,
            store_reset: self.store_reset.clone(),
            certs_expiring: self.certs_expiring(),
        }))
    }

    /// Every machine of `state`'s model as `status` shows it, with what this replica, as
    /// leader, heard of its host (also what the fleet gauges of `/metrics` count).
    pub(crate) fn machine_views(
        &self,
        state: &std::sync::Arc<DomainState>,
    ) -> Result<Vec<MachineView>, ApiError> {
        // The cache is locked only while computing: status never waits for a push.
        let lags = self
            .work
            .with(state, |work| lags(work.cache(), &known_of(state)))?;
        let now = now_ms();
        let mut machines: Vec<MachineView> = state
            .mesh
            .machines
            .keys()
            .map(|m| machine_view(state, m, lags.get(m), now))
            .collect();
        self.fill_heard(&mut machines);
        Ok(machines)
    }

    /// Every replica as it answers a probe now (all asked at once, each within `status_ping_ms`):
    /// its own role, term and log. One that does not answer is shown unreachable, nothing guessed.
    async fn replica_views(&self) -> Vec<ReplicaView> {
        let own = Probed::of(self.replica.raft());
        let wait = Duration::from_millis(status_ping_ms);
        // The membership, not `[peers]`: a replica added or removed shows as it is (decision 0230).
        let members = self.members();
        let asks = members.iter().map(|(id, addr)| {
            let own = own.clone();
            async move {
                if *id == self.id {
                    return (*id, Some((own, Duration::ZERO)));
                }
                let asked = std::time::Instant::now();
                let timings = self.replica.config().timings();
                let answer = probe_replica(&self.endpoint, &timings, *id, *addr, wait).await;
                (*id, answer.ok().map(|p| (p, asked.elapsed())))
            }
        });
        let answers: BTreeMap<u64, Option<(Probed, Duration)>> =
            futures::future::join_all(asks).await.into_iter().collect();
        let longest = answers
            .values()
            .flatten()
            .filter_map(|(p, _)| p.last_log_index)
            .max()
            .unwrap_or(0);
        let mut out = Vec::new();
        for (id, addr) in &members {
            let answer = answers.get(id).cloned().flatten();
            out.push(ReplicaView {
                id: *id,
                addr: addr.to_string(),
                leader: answer.as_ref().is_some_and(|(p, _)| p.leads()),
                epoch: answer.as_ref().map_or(0, |(p, _)| p.term),
                reachable: answer.is_some(),
                said: answer.map(|(p, took)| ReplicaSaid {
                    role: p.role,
                    log_index: p.last_log_index,
                    lag: longest.saturating_sub(p.last_log_index.unwrap_or(0)),
                    answered_in_ms: took.as_millis() as u64,
                }),
            });
        }
        out
    }

    /// `Request::History`: one page of the model applies, sends and settings changes the query
    /// names, oldest first; bounded by count and bytes, so no answer outgrows a frame.
    pub(crate) fn history(&self, query: &HistoryQuery) -> Result<Body, ApiError> {
        let mut items = self.history_items()?;
        if let Some(since) = query.since_ms {
            items.retain(|i| item_time(i) >= since);
        }
        if let Some(machine) = &query.machine {
            items.retain(|i| matches!(i, HistoryItem::Send(s) if s.machine == *machine));
        }
        if query.settings_only {
            items.retain(|i| match i {
                HistoryItem::Settings(c) => query.scope.as_ref().is_none_or(|s| *s == c.scope),
                _ => false,
            });
        }
        let total = items.len() as u64;
        let limit = query.limit.min(history_page_items_max) as usize;
        let mut page = Vec::new();
        let mut bytes = 0usize;
        for item in items.into_iter().skip(query.offset as usize).take(limit) {
            let size = mesh_codec::encode("history item", &item)
                .map_err(|e| ApiError::internal(format!("cannot encode a history item: {e}")))?
                .len();
            // Always at least one item, so a page never stalls on one large entry.
            if !page.is_empty() && bytes + size > history_page_bytes_max {
                break;
            }
            bytes += size;
            page.push(item);
        }
        Ok(Body::History(HistoryPage {
            items: page,
            offset: query.offset,
            total,
        }))
    }

    /// Every model apply, send, settings change and revocation in force, oldest first.
    pub(crate) fn history_items(&self) -> Result<Vec<HistoryItem>, ApiError> {
        let db = self.replica.database();
        let sends = MeshApp::sends(db, None).map_err(|e| storage("send records", &e))?;
        let changes = MeshApp::settings_history(db).map_err(|e| storage("settings history", &e))?;
        let models = MeshApp::model_history(db).map_err(|e| storage("model history", &e))?;
        let mut items: Vec<(u64, HistoryItem)> = Vec::new();
        for m in models {
            items.push((m.time_ms, HistoryItem::Model(m)));
        }
        for s in sends {
            items.push((s.time_ms, HistoryItem::Send(s)));
        }
        for c in changes {
            items.push((c.time_ms, HistoryItem::Settings(c)));
        }
        for entry in self.state()?.revoked.values() {
            items.push((entry.time_ms, HistoryItem::Revocation(entry.clone())));
        }
        items.sort_by_key(|(t, _)| *t);
        Ok(items.into_iter().map(|(_, i)| i).collect())
    }

    /// The `n` newest history items, oldest first, as [`Service::history_items`] orders them,
    /// read without going through the whole history (what the status page shows).
    pub(crate) fn recent_history_items(&self, n: usize) -> Result<Vec<HistoryItem>, ApiError> {
        let db = self.replica.database();
        let recent = MeshApp::recent_history(db, n).map_err(|e| storage("history", &e))?;
        let mut items: Vec<(u64, HistoryItem)> = Vec::new();
        items.extend(
            recent
                .models
                .into_iter()
                .map(|m| (m.time_ms, HistoryItem::Model(m))),
        );
        items.extend(
            recent
                .sends
                .into_iter()
                .map(|s| (s.time_ms, HistoryItem::Send(s))),
        );
        items.extend(
            recent
                .settings
                .into_iter()
                .map(|c| (c.time_ms, HistoryItem::Settings(c))),
        );
        for entry in self.state()?.revoked.values() {
            items.push((entry.time_ms, HistoryItem::Revocation(entry.clone())));
        }
        items.sort_by_key(|(t, _)| *t);
        let skip = items.len().saturating_sub(n);
        Ok(items.into_iter().skip(skip).map(|(_, i)| i).collect())
    }

    /// `Request::SnapshotChunk`: a consistent backup `meshd restore` takes, a chunk at a time.
    /// The backup is taken once, at the first chunk, and held until the next one is taken or
    /// [`backup_held_ms`] pass, so every chunk comes from the same view of the store.
    pub(crate) async fn snapshot(
        &self,
        snapshot: Option<u64>,
        offset: u64,
    ) -> Result<Body, ApiError> {
        let backup = match snapshot {
            None => {
                let bytes =
                    self.replica
                        .backup()
                        .await
                        .map_err(|e| SnapshotError::BackupFailed {
                            reason: e.to_string(),
                        })?;
                let backup = Backup {
                    id: backup_id()?,
                    bytes: std::sync::Arc::new(bytes),
                    epoch_floor: self.state()?.epoch_floor,
                    taken: std::time::Instant::now(),
                };
                *self.held_backup() = Some(backup.clone());
                backup
            }
            Some(id) => {
                let held = self.held_backup().clone();
                let fresh = |b: &Backup| {
                    b.id == id && b.taken.elapsed() < Duration::from_millis(backup_held_ms)
                };
                match held {
                    Some(b) if fresh(&b) => b,
                    _ => {
                        return Err(SnapshotError::NotHeld {
                            snapshot: id,
                            replica: self.id,
                            held_ms: backup_held_ms,
                        }
                        .into());
                    }
                }
            }
        };
        let total = backup.bytes.len() as u64;
        let start = offset.min(total) as usize;
        let end = (start + snapshot_chunk_bytes).min(total as usize);
        Ok(Body::SnapshotChunk {
            snapshot: backup.id,
            total,
            offset: start as u64,
            bytes: backup.bytes[start..end].to_vec(),
            epoch_floor: backup.epoch_floor,
        })
    }

    fn held_backup(&self) -> std::sync::MutexGuard<'_, Option<Backup>> {
        self.backup
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

pub(crate) fn settings_answer(scope: Scope, applied: Applied) -> Result<Body, ApiError> {
    match applied {
        Applied::Settings {
            added,
            changed,
            removed,
            ..
        } => Ok(Body::SettingsSet {
            scope,
            added,
            changed,
            removed,
        }),
        other => Err(ApiError::internal(format!(
            "the store answered a settings write with {other:?}"
        ))),
    }
}

/// Every machine composes with `mesh` (the store keeps its own settings after the first apply).
/// Machines `mesh` drops that may still run modules: refused, or with `drain` put back into
/// `mesh` with no modules (their modules are already gone from the file), so the next push stops
/// them and a later apply can drop the machine.
fn keep_draining(
    state: &DomainState,
    mesh: &mut Mesh,
    drain: bool,
) -> Result<Vec<String>, ApiError> {
    let mut draining = Vec::new();
    let mut refused = Vec::new();
    for (name, machine) in &state.mesh.machines {
        if mesh.machines.contains_key(name) {
            continue;
        }
        let Some(why) = state.still_runs(name) else {
            continue;
        };
        if !drain {
            refused.push((name.clone(), why));
            continue;
        }
        mesh.machines.insert(name.clone(), machine.clone());
        draining.push(name.clone());
    }
    if !refused.is_empty() {
        return Err(ApplyError::WouldDropRunning { machines: refused }.into());
    }
    Ok(draining)
}

/// Composes every machine with the new model (refusing one that does not compose) and names the
/// machines whose should-be it changes against `cache`, the should-be at the current revision.
fn should_be_changes(
    state: &DomainState,
    cache: &DigestCache,
    mesh: &Mesh,
) -> Result<Vec<String>, ApiError> {
    let first = state.revision == 0 && state.mesh.machines.is_empty();
    let settings = if first {
        mesh.settings.clone()
    } else {
        state.mesh.settings.clone()
    };
    let checked = Mesh {
        settings,
        ..mesh.clone()
    };
    let world = World::new(checked, state.provisions.values().cloned())
        .with_revoked(crate::store::revoked::declared(&state.revoked))
        .with_signers(state.signers.clone());
    let mut changes = Vec::new();
    for machine in mesh.machines.keys() {
        let composed = compose(&world, machine).map_err(|e| ApplyError::DoesNotCompose {
            machine: machine.clone(),
            reason: e.to_string(),
        })?;
        let now = ShouldBe {
            digest: digest(&composed.declaration),
            wanted: composed.wanted,
        };
        let before = cache.should_be(machine);
        if before != Some(&now) {
            changes.push(machine.clone());
        }
        // A mint now wanted (or no longer) changes its provider's should-be too: a grant.
        // allow(empty-on-error): a machine with no should-be before wanted no mints
        let was = before.map(|b| b.wanted.as_slice()).unwrap_or_default();
        for w in now.wanted.iter().filter(|w| !was.contains(w)) {
            changes.push(w.provider.machine.clone());
        }
        for w in was.iter().filter(|w| !now.wanted.contains(w)) {
            changes.push(w.provider.machine.clone());
        }
    }
    for (machine, _) in cache.iter() {
        if !mesh.machines.contains_key(machine) {
            changes.push(machine.clone());
        }
    }
    changes.sort();
    changes.dedup();
    Ok(changes)
}

/// A scope must name a machine or module of the model: the state machine's own rule, checked
/// before proposing so a bad scope writes nothing.
fn check_scope(state: &DomainState, scope: &Scope) -> Result<(), ApiError> {
    state.check_scope(scope).map_err(|e| {
        SettingsError::UnknownScope {
            scope: scope.clone(),
            reason: e.to_string(),
        }
        .into()
    })
}

/// A settings write that breaks a rule of `crate::core::settings`, named by the rule.
fn rule_broken(scope: &Scope, e: &crate::core::settings::SettingsError) -> ApiError {
    SettingsError::Rule {
        scope: scope.clone(),
        rule: SettingsRule::of(e),
        reason: e.to_string(),
    }
    .into()
}

/// A store table that could not be read.
pub(crate) fn storage(what: &str, e: &dyn std::fmt::Display) -> ApiError {
    ApiError::Storage {
        what: what.to_string(),
        reason: e.to_string(),
    }
}

/// An apply the store refused: a revision that kept moving is the apply's own error (its
/// fields say from where to where); other refusals stay the store's.
pub(crate) fn apply_refused(refusal: Refusal) -> ApiError {
    match refusal {
        Refusal::RevisionMoved { expected, actual } => ApplyError::RevisionMoved {
            expected,
            found: actual,
        }
        .into(),
        other => ApiError::refused(other),
    }
}

/// A settings write refused by the state machine, on the state it landed on, is the settings'
/// own refusal (nothing written); other refusals stay the store's.
pub(crate) fn settings_refused(scope: &Scope, e: ApiError) -> ApiError {
    match e {
        ApiError::StoreRefused {
            refusal: Refusal::Invalid(reason),
        } => SettingsError::RefusedAtApply {
            scope: scope.clone(),
            reason,
        }
        .into(),
        other => other,
    }
}

impl Service {
    /// The machines a push would now send something other than their last send (a change,
    /// a first send, mints or grants pending; by [`lags`]); one whose last send is only not
    /// confirmed yet is not among them.
    pub(crate) fn changed_now(&self) -> Result<BTreeSet<String>, ApiError> {
        let state = self.state()?;
        let lags = self
            .work
            .with(&state, |work| lags(work.cache(), &known_of(&state)))?;
        Ok(lags
            .into_iter()
            .filter(|(_, l)| l.changed || !l.mints.is_empty() || !l.grants.is_empty())
            .map(|(m, _)| m)
            .collect())
    }
}

/// Machines a push would still change, by the one definition of behind ([`lags`]).
fn behind_of(state: &DomainState, cache: &DigestCache) -> BTreeSet<String> {
    lags(cache, &known_of(state))
        .into_iter()
        .filter(|(_, lag)| lag.is_behind())
        .map(|(m, _)| m)
        .collect()
}

/// The (module, machine) placement a module or placement scope names.
fn placement_of(state: &DomainState, scope: &Scope) -> Option<(String, String)> {
    match scope {
        Scope::Module(m) => state
            .mesh
            .modules
            .get(m)
            .map(|module| (m.clone(), module.machine.clone())),
        Scope::Placement { module, machine } => Some((module.clone(), machine.clone())),
        Scope::Mesh | Scope::Machine(_) => None,
    }
}

fn machine_view(state: &DomainState, machine: &str, lag: Option<&Lag>, now_ms: u64) -> MachineView {
    let behind = lag.is_some_and(Lag::is_behind);
    // allow(empty-on-error): a machine with no lag entry is not behind, so has no reasons
    let behind_why = lag.map(Lag::reasons).unwrap_or_default();
    let account = state.accounts.get(machine);
    let report = account.and_then(|a| a.report.as_ref());
    let filed_ms = account.and_then(|a| a.filed_ms);
    MachineView {
        name: machine.to_string(),
        last_send: state
            .last_sends
            .get(machine)
            .map(|s| (s.epoch, s.sequence, s.digest)),
        last_report: report.map(|r| (r.epoch, r.sequence, r.report_sequence, r.applied)),
        behind,
        behind_why,
        // allow(empty-on-error): no hold recorded for the machine is no holds
        holds: state.holds.get(machine).cloned().unwrap_or_default(),
        refused_reports: account.map_or(0, |a| a.refused_older),
        // allow(empty-on-error): never reported: no modules (last_report says so)
        modules: report.map(|r| r.modules.clone()).unwrap_or_default(),
        health: report.map(|r| Health::of(&r.modules)),
        report_filed_ms: filed_ms,
        // A leader's clock ahead of this replica's reads as age 0, not as a report from the future.
        report_age_ms: filed_ms.map(|f| now_ms.saturating_sub(f)),
        heard_ago_ms: None,
        unproven_refusal: None,
        report_refusal: None,
        silent_for_ms: None,
        // allow(empty-on-error): never reported: nothing drifted that anyone saw
        drifted: report.map(super::engine::drifted_of).unwrap_or_default(),
    }
}

/// When a history item happened (the proposer's wall clock).
fn item_time(item: &HistoryItem) -> u64 {
    match item {
        HistoryItem::Send(s) => s.time_ms,
        HistoryItem::Settings(c) => c.time_ms,
        HistoryItem::Model(m) => m.time_ms,
        HistoryItem::Revocation(r) => r.time_ms,
    }
}

/// How long a backup stays held for its chunks after it was taken.
pub const backup_held_ms: u64 = 600_000;

/// A backup being read chunk by chunk.
#[derive(Clone, Debug)]
pub(crate) struct Backup {
    id: u64,
    bytes: std::sync::Arc<Vec<u8>>,
    epoch_floor: u64,
    taken: std::time::Instant,
}

/// A random id for a backup, so a chunk request names the one it started reading.
fn backup_id() -> Result<u64, ApiError> {
    let mut bytes = [0u8; 8];
    getrandom::getrandom(&mut bytes).map_err(|e| ApiError::Random {
        what: format!("naming a backup ({e})"),
    })?;
    Ok(u64::from_le_bytes(bytes))
}
