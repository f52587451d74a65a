//! The domain as a Raft state machine: applies proposals to [`DomainState`] and writes the rows they
//! changed into the replica's redb tables, inside the transaction that also records Raft's applied
//! index. Snapshots are read from the tables (an MVCC view consistent with that index), never from
//! memory, which may be ahead of the view.

use std::sync::{Arc, RwLock};

use mesh_migrations::records::EpochRecord;
use mesh_migrations::tables;
use mesh_raft::{App, AppError, EntryAt};
use redb::{ReadTransaction, ReadableDatabase, ReadableTable, WriteTransaction};
use serde::{Deserialize, Serialize};

use super::command::{
    ModelChange, Outcome, Proposal, Refusal, Remembered, RequestId, SendRecord, SettingsChange,
    SettingsEntry,
};
use super::settings_history::{Rewinder, entry_of, rebuild};
use super::staging::{Chunk, Upload, UploadHead, UploadId};
use super::state::{Changed, DomainState};
use crate::core::model::Mesh;
use crate::core::settings::{Layer, Scope};

const model_key_mesh: &str = "mesh";
const model_key_revision: &str = "revision";
const model_key_next_history: &str = "next_history_id";

/// Everything the domain keeps, as a snapshot carries it.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct DomainSnapshot {
    pub state: DomainState,
    pub sends: Vec<SendRecord>,
    /// The settings history in the whole-layer shape of snapshots before decision 0317: always
    /// empty in a snapshot this release takes; an older snapshot's history, turned into
    /// [`Self::settings`] at install.
    pub history_whole_layers: Vec<SettingsChange>,
    pub models: Vec<ModelChange>,
    /// The kept models of model revisions (table `model_revisions`, decision 0302): revision and
    /// the encoded model as stored, oldest first.
    pub revisions: Vec<(u64, Vec<u8>)>,
    /// The settings history as the store keeps it, oldest first (decision 0317). Last, so a
    /// snapshot of an older release (which ends before it) fails to decode as this shape and is
    /// read as [`OldSnapshot`] instead.
    pub settings: Vec<SettingsEntry>,
}

/// A snapshot as releases before decision 0317 took it (whole-layer settings history).
#[derive(Deserialize)]
struct OldSnapshot {
    state: DomainState,
    sends: Vec<SendRecord>,
    history: Vec<SettingsChange>,
    models: Vec<ModelChange>,
    revisions: Vec<(u64, Vec<u8>)>,
}

/// A snapshot's bytes, of this release or an older one (decision 0317). An older snapshot's
/// whole-layer history becomes the entries this release keeps; bytes of neither shape are refused
/// with both reasons.
pub fn decode_snapshot(bytes: &[u8]) -> Result<DomainSnapshot, AppError> {
    let new = match mesh_codec::decode::<DomainSnapshot>("domain snapshot", bytes) {
        Ok(mut snap) => {
            let old = std::mem::take(&mut snap.history_whole_layers);
            let mut settings: Vec<SettingsEntry> = old.iter().map(entry_of).collect();
            settings.append(&mut snap.settings);
            snap.settings = settings;
            return Ok(snap);
        }
        Err(e) => e,
    };
    match mesh_codec::decode::<OldSnapshot>("domain snapshot (before decision 0317)", bytes) {
        Ok(old) => Ok(DomainSnapshot {
            state: old.state,
            sends: old.sends,
            history_whole_layers: Vec::new(),
            models: old.models,
            revisions: old.revisions,
            settings: old.history.iter().map(entry_of).collect(),
        }),
        Err(old) => Err(AppError::Other(format!(
            "the snapshot is of no shape this release reads: {new}; nor as a snapshot of an older release: {old}; take it again with a replica of this release"
        ))),
    }
}

/// The domain state machine of one replica. It is the one owner of the state: readers take an
/// immutable snapshot (`Arc`) and never block an apply for longer than cloning a pointer; an apply
/// changes the state in place (cloning it only while a reader still holds the previous snapshot).
#[derive(Debug, Default)]
pub struct MeshApp {
    state: RwLock<Arc<DomainState>>,
}

impl MeshApp {
    /// An app over the state already in the store (read once at start).
    pub fn load(db: &redb::Database) -> Result<Arc<MeshApp>, AppError> {
        let txn = db.begin_read()?;
        let state = read_snapshot(&txn)?.state;
        Ok(Arc::new(MeshApp {
            state: RwLock::new(Arc::new(state)),
        }))
    }

    /// Opens the replica's store file in `dir` (migrating it), reads the domain state, and closes the
    /// file again so the Raft replica can open it. A new directory gives an empty state.
    pub fn open(dir: &std::path::Path) -> Result<Arc<MeshApp>, AppError> {
        let loose = crate::durable::private_dir(dir).map_err(|e| {
            AppError::Other(format!(
                "cannot create store directory {}: {e}",
                dir.display()
            ))
        })?;
        if let Some(loose) = loose {
            tracing::warn!(dir = %loose.dir.display(), mode = format!("{:o}", loose.mode), "{loose}");
        }
        let path = dir.join(mesh_raft::store_file_name);
        let db = mesh_migrations::open(&path)
            .map_err(|e| AppError::Other(format!("cannot open store {}: {e}", path.display())))?;
        MeshApp::load(&db)
    }

    /// The current state as an immutable snapshot: it stays as it is however long it is held,
    /// and holding it does not block applies.
    pub fn state(&self) -> Result<Arc<DomainState>, AppError> {
        self.state
            .read()
            .map(|s| Arc::clone(&s))
            .map_err(|_| AppError::Other("domain state lock poisoned".into()))
    }

    /// Every send ever recorded for `machine` (or all machines), oldest first, from a read view.
    pub fn sends(db: &redb::Database, machine: Option<&str>) -> Result<Vec<SendRecord>, AppError> {
        let txn = db.begin_read()?;
        let table = txn.open_table(tables::SENDS)?;
        let mut out = Vec::new();
        for row in table.iter()? {
            let (key, value) = row?;
            if machine.is_some_and(|m| m != key.value().0) {
                continue;
            }
            out.push(mesh_codec::decode("send record", value.value())?);
        }
        out.sort_by_key(|s: &SendRecord| s.time_ms);
        Ok(out)
    }

    /// The newest `n` of each kind of history, for a view that shows only the latest rows (the
    /// status page): model applies and settings changes read backwards from their ends, and at
    /// most `n` sends found by reading each machine's newest sends until they are older than the
    /// `n` newest kept. It decodes about one send per machine plus `n`, however long the history.
    pub fn recent_history(db: &redb::Database, n: usize) -> Result<RecentHistory, AppError> {
        let txn = db.begin_read()?;
        let mut recent = RecentHistory::default();
        for row in txn.open_table(tables::MODEL_HISTORY)?.iter()?.rev().take(n) {
            let (_, v) = row?;
            recent
                .models
                .push(mesh_codec::decode("model change", v.value())?);
        }
        let mut newest_first: Vec<SettingsEntry> = Vec::new();
        for row in txn
            .open_table(tables::SETTINGS_HISTORY)?
            .iter()?
            .rev()
            .take(n)
        {
            let (_, v) = row?;
            newest_first.push(mesh_codec::decode("settings entry", v.value())?);
        }
        // The newest writes are undone from the layers in force (decision 0317), oldest first.
        recent.settings = rebuild(read_layers(&txn)?, &newest_first).map_err(rebuild_error)?;
        recent.sends = newest_sends(&txn, n)?;
        recent.models.reverse();
        Ok(recent)
    }

    /// Every model apply, oldest first.
    pub fn model_history(db: &redb::Database) -> Result<Vec<ModelChange>, AppError> {
        let txn = db.begin_read()?;
        read_models(&txn)
    }

    /// The kept model of model revision `revision` (machines and modules, settings apart), or
    /// `None` when it is not kept (decision 0302).
    pub fn model_revision(db: &redb::Database, revision: u64) -> Result<Option<Mesh>, AppError> {
        let txn = db.begin_read()?;
        let table = txn.open_table(tables::MODEL_REVISIONS)?;
        match table.get(revision)? {
            Some(v) => Ok(Some(mesh_codec::decode("kept model", v.value())?)),
            None => Ok(None),
        }
    }

    /// The model history row of `revision`, if that revision was a model apply.
    pub fn model_change(
        db: &redb::Database,
        revision: u64,
    ) -> Result<Option<ModelChange>, AppError> {
        let txn = db.begin_read()?;
        let table = txn.open_table(tables::MODEL_HISTORY)?;
        match table.get(revision)? {
            Some(v) => Ok(Some(mesh_codec::decode("model change", v.value())?)),
            None => Ok(None),
        }
    }

    /// The revision of the last model apply, read from the model history's end.
    pub fn last_model_revision(db: &redb::Database) -> Result<Option<u64>, AppError> {
        let txn = db.begin_read()?;
        let table = txn.open_table(tables::MODEL_HISTORY)?;
        Ok(table.last()?.map(|(k, _)| k.value()))
    }

    /// Settings history entry `id` with the whole layer before and after it, if there is one:
    /// the layer in force with every newer write of its scope undone (decision 0317), an error
    /// naming the entry when the history does not lead to the layer in force.
    pub fn settings_change(
        db: &redb::Database,
        id: u64,
    ) -> Result<Option<SettingsChange>, AppError> {
        let txn = db.begin_read()?;
        let table = txn.open_table(tables::SETTINGS_HISTORY)?;
        let Some(v) = table.get(id)? else {
            return Ok(None);
        };
        let wanted: SettingsEntry = mesh_codec::decode("settings entry", v.value())?;
        let mut layers = std::collections::BTreeMap::new();
        if let Some(layer) = read_layer(&txn, &wanted.scope)? {
            layers.insert(wanted.scope.clone(), layer);
        }
        let mut rewinder = Rewinder::new(layers);
        let newer = (std::ops::Bound::Excluded(id), std::ops::Bound::Unbounded);
        for row in table.range::<u64>(newer)?.rev() {
            let (_, v) = row?;
            let entry: SettingsEntry = mesh_codec::decode("settings entry", v.value())?;
            if entry.scope == wanted.scope {
                rewinder.skip(&entry).map_err(rebuild_error)?;
            }
        }
        Ok(Some(rewinder.undo(&wanted).map_err(rebuild_error)?))
    }

    /// Every settings write with its whole layers, oldest first.
    pub fn settings_history(db: &redb::Database) -> Result<Vec<SettingsChange>, AppError> {
        let txn = db.begin_read()?;
        let mut entries = read_history(&txn)?;
        entries.reverse();
        rebuild(read_layers(&txn)?, &entries).map_err(rebuild_error)
    }

    /// Every settings write as the store keeps it (the keys it changed), oldest first.
    pub fn settings_entries(db: &redb::Database) -> Result<Vec<SettingsEntry>, AppError> {
        let txn = db.begin_read()?;
        read_history(&txn)
    }
}

impl App for MeshApp {
    fn apply(
        &self,
        txn: &WriteTransaction,
        at: EntryAt,
        command: Option<&[u8]>,
    ) -> Result<Vec<u8>, AppError> {
        let mut answers = self.apply_all(txn, &[(at, command)])?;
        answers
            .pop()
            .ok_or_else(|| AppError::Other("an apply of one command gave no answer".into()))
    }

    /// The whole batch under one lock, its rows written through tables opened once (decision
    /// 0330). Each command's rows are written right after it, from the state as it left it.
    fn apply_all(
        &self,
        txn: &WriteTransaction,
        commands: &[(EntryAt, Option<&[u8]>)],
    ) -> Result<Vec<Vec<u8>>, AppError> {
        // Decoded before the lock: a bad proposal costs no writer time.
        let proposals: Vec<_> = commands
            .iter()
            .map(|(at, command)| {
                let proposal =
                    command.map(|bytes| mesh_codec::decode::<Proposal>("proposal", bytes));
                (*at, proposal)
            })
            .collect();
        let mut shared = self
            .state
            .write()
            .map_err(|_| AppError::Other("domain state lock poisoned".into()))?;
        // In place; a copy is made only while a reader still holds the previous snapshot. A
        // storage error below leaves memory ahead of the store, and is fatal: openraft stops the
        // replica on it, and a restart reads the state back from the store (decision 0180).
        let state = Arc::make_mut(&mut shared);
        let mut rows = Rows::new(txn);
        let mut answers = Vec::with_capacity(proposals.len());
        for (at, proposal) in proposals {
            let Some(proposal) = proposal else {
                if let Some(change) = state.observe_term(at.term) {
                    write_changes(&mut rows, state, &[change], at)?;
                }
                answers.push(Vec::new());
                continue;
            };
            let outcome = match proposal {
                Ok(proposal) => {
                    let (outcome, changed) = state.apply(at.term, &proposal);
                    write_changes(&mut rows, state, &changed, at)?;
                    outcome
                }
                Err(e) => Outcome::Refused(Refusal::Invalid(format!(
                    "proposal could not be decoded: {e}"
                ))),
            };
            answers.push(mesh_codec::encode("outcome", &outcome)?);
        }
        rows.finish(state)?;
        Ok(answers)
    }

    fn snapshot(&self, txn: &ReadTransaction) -> Result<Vec<u8>, AppError> {
        Ok(mesh_codec::encode("domain snapshot", &read_snapshot(txn)?)?)
    }

    fn install(&self, txn: &WriteTransaction, snapshot: &[u8]) -> Result<(), AppError> {
        let snap = decode_snapshot(snapshot)?;
        let mut state = self
            .state
            .write()
            .map_err(|_| AppError::Other("domain state lock poisoned".into()))?;
        clear_domain_tables(txn)?;
        write_all(txn, &snap)?;
        let mut installed = snap.state;
        installed.model_revisions = snap
            .revisions
            .iter()
            .map(|(revision, bytes)| (*revision, bytes.len() as u64))
            .collect();
        *state = Arc::new(installed);
        Ok(())
    }
}

/// One table of [`Rows`], open or not yet.
type Slot<'t, K> = Option<redb::Table<'t, K, &'static [u8]>>;

/// The domain tables of one write transaction, each opened the first time a row of it is
/// written and kept open until the batch is written (decision 0330): opening a table looks it up
/// in the transaction's table tree and closing it writes its root back, which once per change
/// cost 1.8 % of the replicas' CPU at load `l`.
struct Rows<'t> {
    txn: &'t WriteTransaction,
    model: Slot<'t, &'static str>,
    settings_layers: Slot<'t, &'static str>,
    settings_values: Slot<'t, (&'static str, &'static str)>,
    settings_history: Slot<'t, u64>,
    model_history: Slot<'t, u64>,
    provisions: Slot<'t, &'static str>,
    sends: Slot<'t, (&'static str, u64)>,
    accounts: Slot<'t, &'static str>,
    holds: Slot<'t, &'static str>,
    requests: Slot<'t, &'static [u8]>,
    revoked: Slot<'t, &'static str>,
    signers: Slot<'t, u64>,
    model_revisions: Slot<'t, u64>,
    uploads: Slot<'t, &'static [u8]>,
    upload_chunks: Slot<'t, (&'static [u8], u32)>,
    controller_epoch: Slot<'t, &'static str>,
    /// The revision and the next history id moved: their rows are written by [`Rows::finish`].
    revision: bool,
}

impl Rows<'_> {
    /// Writes the rows kept for the end of the batch, from the state the batch left.
    fn finish(mut self, state: &DomainState) -> Result<(), AppError> {
        if self.revision {
            let t = self.model()?;
            t.insert(
                model_key_revision,
                mesh_codec::encode("revision", &state.revision)?.as_slice(),
            )?;
            let next = mesh_codec::encode("history id", &state.next_history_id)?;
            t.insert(model_key_next_history, next.as_slice())?;
        }
        Ok(())
    }
}

/// `slot`'s table, opened in `txn` if it is not open yet.
fn opened<'s, 't, K: redb::Key + 'static, V: redb::Value + 'static>(
    slot: &'s mut Option<redb::Table<'t, K, V>>,
    txn: &'t WriteTransaction,
    table: redb::TableDefinition<K, V>,
) -> Result<&'s mut redb::Table<'t, K, V>, AppError> {
    let open = match slot.take() {
        Some(open) => open,
        None => txn.open_table(table)?,
    };
    Ok(slot.insert(open))
}

macro_rules! rows_tables {
    ($($field:ident: $key:ty => $def:ident),* $(,)?) => {
        impl<'t> Rows<'t> {
            fn new(txn: &'t WriteTransaction) -> Self {
                Rows { txn, $($field: None,)* revision: false }
            }
            $(
                fn $field(&mut self) -> Result<&mut redb::Table<'t, $key, &'static [u8]>, AppError> {
                    opened(&mut self.$field, self.txn, tables::$def)
                }
            )*
        }
    };
}

rows_tables! {
    model: &'static str => MODEL,
    settings_layers: &'static str => SETTINGS_LAYERS,
    settings_values: (&'static str, &'static str) => SETTINGS_VALUES,
    settings_history: u64 => SETTINGS_HISTORY,
    model_history: u64 => MODEL_HISTORY,
    provisions: &'static str => PROVISIONS,
    sends: (&'static str, u64) => SENDS,
    accounts: &'static str => ACCOUNTS,
    holds: &'static str => HOLDS,
    requests: &'static [u8] => REQUESTS,
    revoked: &'static str => REVOKED,
    signers: u64 => SIGNERS,
    model_revisions: u64 => MODEL_REVISIONS,
    uploads: &'static [u8] => UPLOADS,
    upload_chunks: (&'static [u8], u32) => UPLOAD_CHUNKS,
    controller_epoch: &'static str => CONTROLLER_EPOCH,
}

fn write_changes(
    rows: &mut Rows<'_>,
    state: &DomainState,
    changed: &[Changed],
    at: EntryAt,
) -> Result<(), AppError> {
    for change in changed {
        match change {
            Changed::Model => {
                let t = rows.model()?;
                let mesh = Mesh {
                    settings: Default::default(),
                    ..state.mesh.clone()
                };
                t.insert(
                    model_key_mesh,
                    mesh_codec::encode("model", &mesh)?.as_slice(),
                )?;
            }
            // Counters: written once, as the batch leaves them ([`Rows::finish`]).
            Changed::Revision => rows.revision = true,
            Changed::SettingsLayer(scope) => {
                // The row says the layer exists (it may have no keys); its keys are rows of
                // `settings_values`, written by `SettingsLayerKeys` (schema 0012).
                let t = rows.settings_layers()?;
                let key = scope.to_string();
                match state.mesh.settings.layers.get(scope) {
                    Some(_) => {
                        t.insert(key.as_str(), b"".as_slice())?;
                    }
                    None => {
                        t.remove(key.as_str())?;
                    }
                }
            }
            Changed::SettingsLayerKeys { scope, keys } => {
                let t = rows.settings_values()?;
                let name = scope.to_string();
                let layer = state.mesh.settings.layers.get(scope);
                for k in keys {
                    match layer.and_then(|l| l.get(k)) {
                        Some(v) => {
                            t.insert((name.as_str(), k.as_str()), v.as_bytes())?;
                        }
                        None => {
                            t.remove((name.as_str(), k.as_str()))?;
                        }
                    }
                }
            }
            Changed::SettingsHistory(entry) => {
                let t = rows.settings_history()?;
                t.insert(
                    entry.id,
                    mesh_codec::encode("settings entry", entry)?.as_slice(),
                )?;
                cut_settings_history(t, entry.id)?;
            }
            Changed::ModelHistory(entry) => {
                let t = rows.model_history()?;
                t.insert(
                    entry.revision,
                    mesh_codec::encode("model change", entry)?.as_slice(),
                )?;
            }
            Changed::Provision(id) => {
                let t = rows.provisions()?;
                if let Some(p) = state.provisions.get(id) {
                    t.insert(id.as_str(), mesh_codec::encode("provision", p)?.as_slice())?;
                }
            }
            Changed::Send { machine, sequence } => {
                let t = rows.sends()?;
                if let Some(s) = state.last_sends.get(machine) {
                    t.insert(
                        (machine.as_str(), *sequence),
                        mesh_codec::encode("send record", s)?.as_slice(),
                    )?;
                }
            }
            Changed::Account(machine) => {
                let t = rows.accounts()?;
                if let Some(a) = state.accounts.get(machine) {
                    t.insert(
                        machine.as_str(),
                        mesh_codec::encode("account", a)?.as_slice(),
                    )?;
                }
            }
            Changed::Holds(machine) => {
                let t = rows.holds()?;
                match state.holds.get(machine) {
                    Some(h) => {
                        t.insert(machine.as_str(), mesh_codec::encode("holds", h)?.as_slice())?;
                    }
                    None => {
                        t.remove(machine.as_str())?;
                    }
                }
            }
            Changed::Request { id, order } => {
                let t = rows.requests()?;
                let key = tables::request_key(*order, &id.0);
                match state.requests.get(id) {
                    Some(r) => {
                        t.insert(
                            key.as_slice(),
                            mesh_codec::encode("remembered request", r)?.as_slice(),
                        )?;
                    }
                    None => {
                        t.remove(key.as_slice())?;
                    }
                }
            }
            Changed::RequestsForgotten { below } => {
                let end = tables::request_key(*below, &[0; 16]);
                rows.requests()?.retain_in(..end.as_slice(), |_, _| false)?;
            }
            Changed::Revoked(key) => {
                let t = rows.revoked()?;
                match state.revoked.get(key) {
                    Some(e) => {
                        t.insert(
                            key.as_str(),
                            mesh_codec::encode("deny entry", e)?.as_slice(),
                        )?;
                    }
                    None => {
                        t.remove(key.as_str())?;
                    }
                }
            }
            Changed::Signer(replica) => {
                let t = rows.signers()?;
                match state.signers.get(replica) {
                    Some(key) => {
                        t.insert(*replica, key.as_slice())?;
                    }
                    None => {
                        t.remove(*replica)?;
                    }
                }
            }
            Changed::ModelRevision { revision, bytes } => {
                let t = rows.model_revisions()?;
                t.insert(*revision, bytes.as_slice())?;
            }
            Changed::ModelRevisionPruned(revision) => {
                let t = rows.model_revisions()?;
                t.remove(*revision)?;
            }
            Changed::Upload(id) => write_upload(rows, state, id)?,
            Changed::UploadChunk { upload, index } => {
                let t = rows.upload_chunks()?;
                if let Some(c) = state.uploads.get(upload).and_then(|u| u.chunks.get(index)) {
                    t.insert((upload.0.as_slice(), *index), c.bytes())?;
                }
            }
            Changed::EpochFloor => {
                let t = rows.controller_epoch()?;
                let record = EpochRecord {
                    epoch: state.epoch_floor,
                    raised_at_index: Some(at.index),
                };
                t.insert(tables::CONTROLLER_EPOCH_KEY, record.encode()?.as_slice())?;
            }
        }
    }
    Ok(())
}

fn read_snapshot(txn: &ReadTransaction) -> Result<DomainSnapshot, AppError> {
    let mut state = DomainState::default();
    let model = txn.open_table(tables::MODEL)?;
    if let Some(v) = model.get(model_key_mesh)? {
        state.mesh = mesh_codec::decode("model", v.value())?;
    }
    if let Some(v) = model.get(model_key_revision)? {
        state.revision = mesh_codec::decode("revision", v.value())?;
    }
    if let Some(v) = model.get(model_key_next_history)? {
        state.next_history_id = mesh_codec::decode("history id", v.value())?;
    }
    state.mesh.settings.layers = read_layers(txn)?;
    for row in txn.open_table(tables::PROVISIONS)?.iter()? {
        let (k, v) = row?;
        state.provisions.insert(
            k.value().to_string(),
            mesh_codec::decode("provision", v.value())?,
        );
    }
    let mut sends = Vec::new();
    for row in txn.open_table(tables::SENDS)?.iter()? {
        let (_, v) = row?;
        let send: SendRecord = mesh_codec::decode("send record", v.value())?;
        // Keys sort by (machine, sequence), so the last row per machine is its last send.
        state.last_sends.insert(send.machine.clone(), send.clone());
        sends.push(send);
    }
    for row in txn.open_table(tables::ACCOUNTS)?.iter()? {
        let (k, v) = row?;
        state.accounts.insert(
            k.value().to_string(),
            mesh_codec::decode("account", v.value())?,
        );
    }
    for row in txn.open_table(tables::HOLDS)?.iter()? {
        let (k, v) = row?;
        state.holds.insert(
            k.value().to_string(),
            mesh_codec::decode("holds", v.value())?,
        );
    }
    if let Some(v) = txn
        .open_table(tables::CONTROLLER_EPOCH)?
        .get(tables::CONTROLLER_EPOCH_KEY)?
    {
        state.epoch_floor = EpochRecord::decode(v.value())?.epoch;
    }
    for row in txn.open_table(tables::REQUESTS)?.iter()? {
        let (k, v) = row?;
        let id = tables::request_id_of(k.value()).ok_or_else(|| {
            AppError::Other(format!(
                "a stored request key is {} bytes, not 24 (order and id, migration 0010)",
                k.value().len()
            ))
        })?;
        let remembered: Remembered = mesh_codec::decode("remembered request", v.value())?;
        state.request_order.insert(remembered.order, RequestId(id));
        state.requests.insert(RequestId(id), remembered);
    }
    // Rows of requests forgotten and not yet swept (decision 0330).
    state.forget_beyond_the_limit();
    for row in txn.open_table(tables::REVOKED)?.iter()? {
        let (k, v) = row?;
        state.revoked.insert(
            k.value().to_string(),
            mesh_codec::decode("deny entry", v.value())?,
        );
    }
    for row in txn.open_table(tables::SIGNERS)?.iter()? {
        let (k, v) = row?;
        let key: [u8; 32] = v.value().try_into().map_err(|_| {
            AppError::Other(format!(
                "replica {}'s stored signing key is {} bytes, not 32",
                k.value(),
                v.value().len()
            ))
        })?;
        state.signers.insert(k.value(), key);
    }
    read_uploads(txn, &mut state)?;
    let settings = read_history(txn)?;
    let models = read_models(txn)?;
    let mut revisions = Vec::new();
    for row in txn.open_table(tables::MODEL_REVISIONS)?.iter()? {
        let (k, v) = row?;
        let bytes = v.value().to_vec();
        state.model_revisions.insert(k.value(), bytes.len() as u64);
        revisions.push((k.value(), bytes));
    }
    Ok(DomainSnapshot {
        state,
        sends,
        history_whole_layers: Vec::new(),
        models,
        revisions,
        settings,
    })
}

/// An upload's head row, or (the upload gone from the state) its head and every chunk row.
fn write_upload(rows: &mut Rows<'_>, state: &DomainState, id: &UploadId) -> Result<(), AppError> {
    match state.uploads.get(id) {
        Some(u) => {
            rows.uploads()?.insert(
                id.0.as_slice(),
                mesh_codec::encode("upload head", &u.head)?.as_slice(),
            )?;
        }
        None => {
            rows.uploads()?.remove(id.0.as_slice())?;
            let range = (id.0.as_slice(), 0u32)..=(id.0.as_slice(), u32::MAX);
            rows.upload_chunks()?.retain_in(range, |_, _| false)?;
        }
    }
    Ok(())
}

/// The staged uploads, heads and chunks.
fn read_uploads(txn: &ReadTransaction, state: &mut DomainState) -> Result<(), AppError> {
    let id_of = |bytes: &[u8]| -> Result<UploadId, AppError> {
        let id: [u8; 16] = bytes.try_into().map_err(|_| {
            AppError::Other(format!(
                "a stored upload id is {} bytes, not 16",
                bytes.len()
            ))
        })?;
        Ok(UploadId(id))
    };
    for row in txn.open_table(tables::UPLOADS)?.iter()? {
        let (k, v) = row?;
        let head: UploadHead = mesh_codec::decode("upload head", v.value())?;
        let upload = Upload {
            head,
            chunks: Default::default(),
        };
        state.uploads.insert(id_of(k.value())?, upload);
    }
    for row in txn.open_table(tables::UPLOAD_CHUNKS)?.iter()? {
        let (k, v) = row?;
        let (id, index) = k.value();
        let id = id_of(id)?;
        let Some(upload) = state.uploads.get_mut(&id) else {
            return Err(AppError::Other(format!(
                "chunk {index} of upload {id} is stored without its upload"
            )));
        };
        upload.chunks.insert(index, Chunk::new(v.value().to_vec()));
    }
    Ok(())
}

/// What [`MeshApp::recent_history`] reads: at most `n` of each kind, oldest first.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RecentHistory {
    pub models: Vec<ModelChange>,
    pub settings: Vec<SettingsChange>,
    pub sends: Vec<SendRecord>,
}

/// The `n` newest sends of every machine together, oldest first. Sends are keyed by machine and
/// sequence, so each machine's newest come last in its key range; a machine is read backwards only
/// while its sends could still be among the `n` newest. Machines are found by jumping past each
/// one's range, not by reading every row.
fn newest_sends(txn: &ReadTransaction, n: usize) -> Result<Vec<SendRecord>, AppError> {
    use std::cmp::Reverse;
    use std::collections::BinaryHeap;
    use std::ops::Bound;
    if n == 0 {
        return Ok(Vec::new());
    }
    let table = txn.open_table(tables::SENDS)?;
    // The newest kept so far, the oldest of them on top: (time, machine, sequence) keys them.
    let mut kept: BinaryHeap<Reverse<(u64, String, u64)>> = BinaryHeap::new();
    let mut records: std::collections::HashMap<(String, u64), SendRecord> = Default::default();
    let mut next = table.first()?.map(|(k, _)| k.value().0.to_string());
    while let Some(machine) = next.take() {
        let range = (machine.as_str(), 0)..=(machine.as_str(), u64::MAX);
        for row in table.range::<(&str, u64)>(range)?.rev() {
            let (key, value) = row?;
            let record: SendRecord = mesh_codec::decode("send record", value.value())?;
            let full = kept.len() >= n;
            if full && kept.peek().is_some_and(|Reverse(k)| record.time_ms <= k.0) {
                break;
            }
            let id = (machine.clone(), key.value().1);
            kept.push(Reverse((record.time_ms, id.0.clone(), id.1)));
            records.insert(id, record);
            if kept.len() > n
                && let Some(Reverse((_, m, seq))) = kept.pop()
            {
                records.remove(&(m, seq));
            }
        }
        let past = (
            Bound::Excluded((machine.as_str(), u64::MAX)),
            Bound::Unbounded,
        );
        next = table
            .range::<(&str, u64)>(past)?
            .next()
            .transpose()?
            .map(|(k, _)| k.value().0.to_string());
    }
    let mut sends: Vec<SendRecord> = records.into_values().collect();
    sends.sort_by_key(|s| s.time_ms);
    Ok(sends)
}

fn read_models(txn: &ReadTransaction) -> Result<Vec<ModelChange>, AppError> {
    let mut out = Vec::new();
    for row in txn.open_table(tables::MODEL_HISTORY)?.iter()? {
        let (_, v) = row?;
        out.push(mesh_codec::decode("model change", v.value())?);
    }
    Ok(out)
}

fn read_history(txn: &ReadTransaction) -> Result<Vec<SettingsEntry>, AppError> {
    let mut out = Vec::new();
    for row in txn.open_table(tables::SETTINGS_HISTORY)?.iter()? {
        let (_, v) = row?;
        out.push(mesh_codec::decode("settings entry", v.value())?);
    }
    Ok(out)
}

/// Removes the settings history rows that fell out of the newest
/// [`settings_history_kept_max`](super::state::settings_history_kept_max) once entry `newest` is
/// written: at most [`settings_history_cut_together`](super::state::settings_history_cut_together)
/// of them, oldest first, in one range removal (decision 0341). Every replica applies the same
/// entries, so every replica keeps the same rows.
fn cut_settings_history(
    table: &mut redb::Table<'_, u64, &'static [u8]>,
    newest: u64,
) -> Result<(), AppError> {
    use super::state::{settings_history_cut_together, settings_history_kept_max};
    let Some(keep_from) = newest.checked_sub(settings_history_kept_max - 1) else {
        return Ok(());
    };
    let Some(oldest) = table.first()?.map(|(k, _)| k.value()) else {
        return Ok(());
    };
    if oldest >= keep_from {
        return Ok(());
    }
    let end = keep_from.min(oldest.saturating_add(settings_history_cut_together));
    table.retain_in(oldest..end, |_, _| false)?;
    Ok(())
}

fn rebuild_error(e: super::settings_history::RebuildError) -> AppError {
    AppError::Other(e.to_string())
}

fn parse_scope(text: &str) -> Result<Scope, AppError> {
    text.parse()
        .map_err(|e| AppError::Other(format!("stored settings scope {text:?} is unreadable: {e}")))
}

fn value_of(scope: &str, key: &str, bytes: &[u8]) -> Result<String, AppError> {
    String::from_utf8(bytes.to_vec()).map_err(|_| {
        AppError::Other(format!(
            "stored setting {key} of {scope} is not UTF-8; restore the replica from a snapshot of a healthy one"
        ))
    })
}

/// Every settings layer: a row of `settings_layers` per layer, its keys from `settings_values`.
fn read_layers(
    txn: &ReadTransaction,
) -> Result<std::collections::BTreeMap<Scope, Layer>, AppError> {
    let mut by_name: std::collections::BTreeMap<String, Layer> = Default::default();
    for row in txn.open_table(tables::SETTINGS_LAYERS)?.iter()? {
        let (k, _) = row?;
        by_name.insert(k.value().to_string(), Layer::new());
    }
    for row in txn.open_table(tables::SETTINGS_VALUES)?.iter()? {
        let (k, v) = row?;
        let (scope, key) = k.value();
        let Some(layer) = by_name.get_mut(scope) else {
            return Err(AppError::Other(format!(
                "stored setting {key} belongs to {scope}, which has no layer row; restore the replica from a snapshot of a healthy one"
            )));
        };
        layer.insert(key.to_string(), value_of(scope, key, v.value())?);
    }
    let mut layers = std::collections::BTreeMap::new();
    for (name, layer) in by_name {
        layers.insert(parse_scope(&name)?, layer);
    }
    Ok(layers)
}

/// One scope's layer, `None` when it has none.
fn read_layer(txn: &ReadTransaction, scope: &Scope) -> Result<Option<Layer>, AppError> {
    let name = scope.to_string();
    if txn
        .open_table(tables::SETTINGS_LAYERS)?
        .get(name.as_str())?
        .is_none()
    {
        return Ok(None);
    }
    let mut layer = Layer::new();
    let values = txn.open_table(tables::SETTINGS_VALUES)?;
    for row in values.range((name.as_str(), "")..)? {
        let (k, v) = row?;
        let (scope, key) = k.value();
        if scope != name {
            break;
        }
        layer.insert(key.to_string(), value_of(scope, key, v.value())?);
    }
    Ok(Some(layer))
}

fn clear_domain_tables(txn: &WriteTransaction) -> Result<(), AppError> {
    fn clear<K: redb::Key + 'static>(
        txn: &WriteTransaction,
        def: redb::TableDefinition<K, &[u8]>,
    ) -> Result<(), AppError> {
        let mut t = txn.open_table(def)?;
        t.retain(|_, _| false)?;
        Ok(())
    }
    clear(txn, tables::MODEL)?;
    clear(txn, tables::SETTINGS_LAYERS)?;
    clear(txn, tables::PROVISIONS)?;
    clear(txn, tables::SENDS)?;
    clear(txn, tables::ACCOUNTS)?;
    clear(txn, tables::HOLDS)?;
    clear(txn, tables::SETTINGS_HISTORY)?;
    clear(txn, tables::MODEL_HISTORY)?;
    clear(txn, tables::REQUESTS)?;
    clear(txn, tables::REVOKED)?;
    clear(txn, tables::SIGNERS)?;
    clear(txn, tables::MODEL_REVISIONS)?;
    clear(txn, tables::UPLOADS)?;
    txn.open_table(tables::UPLOAD_CHUNKS)?
        .retain(|_, _| false)?;
    txn.open_table(tables::SETTINGS_VALUES)?
        .retain(|_, _| false)?;
    Ok(())
}

fn write_all(txn: &WriteTransaction, snap: &DomainSnapshot) -> Result<(), AppError> {
    let state = &snap.state;
    let at = EntryAt {
        index: 0,
        term: state.epoch_floor,
        position: 0,
    };
    let mut changed = vec![Changed::Model, Changed::Revision, Changed::EpochFloor];
    for (scope, layer) in &state.mesh.settings.layers {
        changed.push(Changed::SettingsLayer(scope.clone()));
        changed.push(Changed::SettingsLayerKeys {
            scope: scope.clone(),
            keys: layer.keys().cloned().collect(),
        });
    }
    changed.extend(state.provisions.keys().cloned().map(Changed::Provision));
    changed.extend(state.accounts.keys().cloned().map(Changed::Account));
    changed.extend(state.holds.keys().cloned().map(Changed::Holds));
    changed.extend(state.requests.iter().map(|(id, r)| Changed::Request {
        id: *id,
        order: r.order,
    }));
    changed.extend(state.revoked.keys().cloned().map(Changed::Revoked));
    changed.extend(state.signers.keys().copied().map(Changed::Signer));
    for (id, upload) in &state.uploads {
        changed.push(Changed::Upload(*id));
        changed.extend(
            upload
                .chunks
                .keys()
                .map(|&index| Changed::UploadChunk { upload: *id, index }),
        );
    }
    // The tables are closed again before the rows below are written through them.
    let mut rows = Rows::new(txn);
    write_changes(&mut rows, state, &changed, at)?;
    rows.finish(state)?;
    let mut sends = txn.open_table(tables::SENDS)?;
    for s in &snap.sends {
        sends.insert(
            (s.machine.as_str(), s.sequence),
            mesh_codec::encode("send record", s)?.as_slice(),
        )?;
    }
    let mut history = txn.open_table(tables::SETTINGS_HISTORY)?;
    for h in &snap.settings {
        history.insert(h.id, mesh_codec::encode("settings entry", h)?.as_slice())?;
    }
    let mut models = txn.open_table(tables::MODEL_HISTORY)?;
    for m in &snap.models {
        models.insert(
            m.revision,
            mesh_codec::encode("model change", m)?.as_slice(),
        )?;
    }
    let mut revisions = txn.open_table(tables::MODEL_REVISIONS)?;
    for (revision, bytes) in &snap.revisions {
        revisions.insert(*revision, bytes.as_slice())?;
    }
    Ok(())
}

/// Decodes the state machine's answer to a proposal.
pub fn decode_outcome(bytes: &[u8]) -> Result<Outcome, mesh_codec::CodecError> {
    mesh_codec::decode("outcome", bytes)
}

#[cfg(test)]
mod private_files {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn a_replica_store_is_0600_in_a_0700_directory() {
        // Issue 27 part 7: the store directory is created 0700 (with any missing parent) and the
        // store in it 0600, whatever the umask.
        let tmp = tempfile::tempdir().expect("tempdir");
        let dir = tmp.path().join("var").join("replica-1");
        MeshApp::open(&dir).expect("opened");
        let mode =
            |p: &std::path::Path| std::fs::metadata(p).expect("stat").permissions().mode() & 0o777;
        assert_eq!(mode(&dir), 0o700);
        assert_eq!(mode(&tmp.path().join("var")), 0o700);
        assert_eq!(mode(&dir.join(mesh_raft::store_file_name)), 0o600);
    }
}

#[cfg(test)]
mod recent {
    use super::*;

    fn send(machine: &str, sequence: u64, time_ms: u64) -> SendRecord {
        SendRecord {
            machine: machine.into(),
            epoch: 2,
            sequence,
            digest: crate::core::declaration::Digest([0; 32]),
            summary: Default::default(),
            why: String::new(),
            actor: "op".into(),
            time_ms,
            moves: Vec::new(),
        }
    }

    #[test]
    fn the_page_history_is_the_newest_of_the_whole_history_read_from_the_ends() {
        // Issue 23 part 4: the status page reads only the newest rows, yet they are exactly the
        // newest of everything: machines whose sends interleave in time, one machine far behind,
        // one with every recent send, model and settings rows past the count.
        let tmp = tempfile::tempdir().expect("tempdir");
        let db = mesh_migrations::open(&tmp.path().join("store")).expect("store");
        let txn = db.begin_write().expect("txn");
        {
            let mut sends = txn.open_table(tables::SENDS).expect("sends");
            let mut put = |s: SendRecord| {
                let bytes = mesh_codec::encode("send record", &s).expect("encode");
                sends
                    .insert((s.machine.as_str(), s.sequence), bytes.as_slice())
                    .expect("insert");
            };
            for seq in 1..=30 {
                put(send("ace", seq, seq * 10)); // 10..300
                put(send("g14", seq, seq * 10 + 5)); // 15..305
            }
            for seq in 1..=5 {
                put(send("old", seq, seq)); // older than everything
            }
            for seq in 1..=12 {
                put(send("zz", seq, 1000 + seq)); // the newest of all
            }
            let mut models = txn.open_table(tables::MODEL_HISTORY).expect("models");
            let mut settings = txn.open_table(tables::SETTINGS_HISTORY).expect("settings");
            for i in 0..40u64 {
                let m = ModelChange {
                    revision: i,
                    why: String::new(),
                    actor: "op".into(),
                    epoch: 2,
                    time_ms: i,
                    changes: Vec::new(),
                };
                let bytes = mesh_codec::encode("model change", &m).expect("encode");
                models.insert(i, bytes.as_slice()).expect("insert");
                // Each write sets `k` to its id; the first creates the layer.
                let layer = |v: u64| Layer::from([("k".to_string(), v.to_string())]);
                let c = SettingsChange {
                    id: i,
                    scope: Scope::Mesh,
                    before: i.checked_sub(1).map(layer),
                    after: Some(layer(i)),
                    why: String::new(),
                    actor: "op".into(),
                    epoch: 2,
                    time_ms: i,
                };
                let bytes = mesh_codec::encode("settings entry", &entry_of(&c)).expect("encode");
                settings.insert(i, bytes.as_slice()).expect("insert");
            }
            let mut layers = txn.open_table(tables::SETTINGS_LAYERS).expect("layers");
            layers.insert("mesh", b"".as_slice()).expect("insert");
            let mut values = txn.open_table(tables::SETTINGS_VALUES).expect("values");
            values
                .insert(("mesh", "k"), b"39".as_slice())
                .expect("insert");
        }
        txn.commit().expect("commit");
        fn tail<T>(mut v: Vec<T>, n: usize) -> Vec<T> {
            v.split_off(v.len().saturating_sub(n))
        }
        for n in [0, 1, 12, 20, 500] {
            let recent = MeshApp::recent_history(&db, n).expect("recent");
            let all_sends = MeshApp::sends(&db, None).expect("sends");
            assert_eq!(recent.sends, tail(all_sends, n), "sends, n = {n}");
            let all_models = MeshApp::model_history(&db).expect("models");
            assert_eq!(recent.models, tail(all_models, n), "models, n = {n}");
            let all_settings = MeshApp::settings_history(&db).expect("settings");
            assert_eq!(recent.settings, tail(all_settings, n), "settings, n = {n}");
        }
    }
}

#[cfg(test)]
mod kept_models {
    use super::*;
    use crate::store::command::Command;

    fn apply_model(app: &MeshApp, db: &redb::Database, index: u64, env: &str) {
        let text = format!(
            "[machines.m]\naddress = \"10.0.0.1\"\n[modules.a]\nmachine = \"m\"\ncommand = \"sh\"\nenv = {{ N = \"{env}\" }}\n"
        );
        let mesh = crate::core::meshfile::parse_mesh("mesh.toml", &text).expect("parses");
        let p = Proposal {
            epoch: 1,
            expect_revision: None,
            actor: "operator:op".into(),
            time_ms: index,
            command: Command::ApplyModel {
                mesh,
                why: format!("apply {env}"),
                changes: vec![],
            },
        };
        let bytes = mesh_codec::encode("proposal", &p).expect("encode");
        let txn = db.begin_write().expect("txn");
        let at = EntryAt {
            index,
            term: 1,
            position: 0,
        };
        app.apply(&txn, at, Some(&bytes)).expect("applied");
        txn.commit().expect("commit");
    }

    #[test]
    fn kept_models_are_written_with_the_apply_and_carried_by_snapshot_and_install() {
        // Issue 25 item 1, decision 0302: the model of each model revision is in the replicated
        // store, so a replica that installed a snapshot (a new or lagging one) reads old
        // revisions back as the others do.
        let tmp = tempfile::tempdir().expect("tempdir");
        let db = mesh_migrations::open(&tmp.path().join("a")).expect("store");
        let app = MeshApp::default();
        apply_model(&app, &db, 1, "one");
        apply_model(&app, &db, 2, "two");
        let one = MeshApp::model_revision(&db, 1)
            .expect("read")
            .expect("kept");
        assert_eq!(
            one.modules["a"].env.get("N").map(String::as_str),
            Some("one")
        );
        let snapshot = app
            .snapshot(&db.begin_read().expect("read"))
            .expect("snapshot");
        let other = mesh_migrations::open(&tmp.path().join("b")).expect("store");
        let installed = MeshApp::default();
        let txn = other.begin_write().expect("txn");
        installed.install(&txn, &snapshot).expect("installed");
        txn.commit().expect("commit");
        for revision in [1, 2] {
            assert_eq!(
                MeshApp::model_revision(&other, revision).expect("read"),
                MeshApp::model_revision(&db, revision).expect("read"),
                "revision {revision}"
            );
        }
        let (a, b) = (
            app.state().expect("state"),
            installed.state().expect("state"),
        );
        assert_eq!(
            a.model_revisions, b.model_revisions,
            "the pruning index too"
        );
        assert_eq!(b.model_revisions.len(), 2);
        // And a restart (load from the tables) rebuilds the same index.
        let loaded = MeshApp::load(&other).expect("load");
        assert_eq!(
            loaded.state().expect("state").model_revisions,
            a.model_revisions
        );
    }
}

#[cfg(test)]
mod settings_deltas {
    // Issue 26 item 2, decision 0317: the store keeps the keys a settings write changed; readers,
    // rollback, an upgraded store and an older snapshot see the same whole-layer history.
    use super::*;
    use std::collections::BTreeMap;

    fn layer(kv: &[(&str, &str)]) -> Layer {
        kv.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn change(
        id: u64,
        scope: &Scope,
        before: Option<Layer>,
        after: Option<Layer>,
    ) -> SettingsChange {
        SettingsChange {
            id,
            scope: scope.clone(),
            before,
            after,
            why: format!("write {id}"),
            actor: "operator:op".into(),
            epoch: 2,
            time_ms: 100 + id,
        }
    }

    /// Two scopes: created, merged, replaced, cleared and created again, interleaved; and the
    /// layers they leave.
    fn whole_history() -> (BTreeMap<Scope, Layer>, Vec<SettingsChange>) {
        let m = Scope::Mesh;
        let ace = Scope::Machine("ace".into());
        let history = vec![
            change(1, &m, None, Some(layer(&[("a", "1"), ("b", "1")]))),
            change(2, &ace, None, Some(layer(&[("x", "1")]))),
            change(
                3,
                &m,
                Some(layer(&[("a", "1"), ("b", "1")])),
                Some(layer(&[("a", "2"), ("b", "1"), ("c", "1")])),
            ),
            change(4, &ace, Some(layer(&[("x", "1")])), None),
            change(
                5,
                &m,
                Some(layer(&[("a", "2"), ("b", "1"), ("c", "1")])),
                Some(layer(&[("c", "1")])),
            ),
            change(6, &ace, None, Some(layer(&[("y", "2")]))),
        ];
        let layers = BTreeMap::from([(m, layer(&[("c", "1")])), (ace, layer(&[("y", "2")]))]);
        (layers, history)
    }

    /// A store as schema 0011 left it: `settings_values` absent, whole layers in
    /// `settings_layers` and whole-layer records in `settings_history`.
    fn store_of_schema_0011(path: &std::path::Path) {
        let db = mesh_migrations::open(path).expect("store");
        let (layers, history) = whole_history();
        let txn = db.begin_write().expect("txn");
        txn.delete_table(tables::SETTINGS_VALUES).expect("delete");
        {
            let mut meta = txn.open_table(tables::META).expect("meta");
            meta.insert(tables::SCHEMA_VERSION_KEY, 11)
                .expect("version");
            let mut t = txn.open_table(tables::SETTINGS_LAYERS).expect("layers");
            for (scope, l) in &layers {
                let bytes = mesh_codec::encode("settings layer", l).expect("encode");
                t.insert(scope.to_string().as_str(), bytes.as_slice())
                    .expect("insert");
            }
            let mut t = txn.open_table(tables::SETTINGS_HISTORY).expect("history");
            for c in &history {
                let bytes = mesh_codec::encode("settings change", c).expect("encode");
                t.insert(c.id, bytes.as_slice()).expect("insert");
            }
        }
        txn.commit().expect("commit");
    }

    #[test]
    fn a_store_written_with_whole_layers_reads_the_same_history_and_layers_after_migration_0012() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let path = tmp.path().join("store");
        store_of_schema_0011(&path);
        let db = mesh_migrations::open(&path).expect("migrated");
        let (layers, history) = whole_history();
        assert_eq!(MeshApp::settings_history(&db).expect("history"), history);
        let entries = MeshApp::settings_entries(&db).expect("entries");
        let stored: Vec<SettingsEntry> = history.iter().map(entry_of).collect();
        assert_eq!(
            entries, stored,
            "the migration's records are the domain's entries"
        );
        assert_eq!(
            entries[2].delta.keys.len(),
            2,
            "a merge keeps only the keys it wrote"
        );
        let txn = db.begin_read().expect("read");
        assert_eq!(read_layers(&txn).expect("layers"), layers);
    }

    #[test]
    fn rollback_reads_each_entry_with_the_layers_it_found_and_left() {
        // Decision 0303 with 0317: `settings rollback --to N` takes the `after` of entry N,
        // rebuilt from the layer in force; a cleared and re-created layer included.
        let tmp = tempfile::tempdir().expect("tempdir");
        let path = tmp.path().join("store");
        store_of_schema_0011(&path);
        let db = mesh_migrations::open(&path).expect("migrated");
        for want in whole_history().1 {
            let got = MeshApp::settings_change(&db, want.id).expect("read");
            assert_eq!(got, Some(want));
        }
        assert_eq!(MeshApp::settings_change(&db, 7).expect("read"), None);
        let recent = MeshApp::recent_history(&db, 2).expect("recent");
        assert_eq!(recent.settings, whole_history().1[4..].to_vec());
    }

    #[test]
    fn a_snapshot_of_an_older_release_installs_with_its_history_as_deltas() {
        // Decision 0317: an older replica's (or backup's) snapshot carries whole layers; it
        // installs, and reads back as it was.
        #[derive(Serialize)]
        struct Old {
            state: DomainState,
            sends: Vec<SendRecord>,
            history: Vec<SettingsChange>,
            models: Vec<ModelChange>,
            revisions: Vec<(u64, Vec<u8>)>,
        }
        let (layers, history) = whole_history();
        let mut state = DomainState::default();
        state.mesh.settings.layers = layers.clone();
        state.next_history_id = 6;
        let old = Old {
            state,
            sends: vec![],
            history: history.clone(),
            models: vec![],
            revisions: vec![],
        };
        let bytes = mesh_codec::encode("old snapshot", &old).expect("encode");
        let tmp = tempfile::tempdir().expect("tempdir");
        let db = mesh_migrations::open(&tmp.path().join("store")).expect("store");
        let app = MeshApp::default();
        let txn = db.begin_write().expect("txn");
        app.install(&txn, &bytes).expect("installed");
        txn.commit().expect("commit");
        assert_eq!(MeshApp::settings_history(&db).expect("history"), history);
        let snap = decode_snapshot(
            &app.snapshot(&db.begin_read().expect("read"))
                .expect("snapshot"),
        )
        .expect("decode");
        assert_eq!(snap.state.mesh.settings.layers, layers);
        assert!(snap.history_whole_layers.is_empty());
        assert_eq!(
            snap.settings,
            history.iter().map(entry_of).collect::<Vec<_>>()
        );
        let garbage = decode_snapshot(b"\x05not a snapshot").expect_err("refused");
        assert!(
            garbage
                .to_string()
                .contains("nor as a snapshot of an older release"),
            "{garbage}"
        );
    }
}

#[cfg(test)]
mod settings_writes {
    // Issue 26 item 2, decision 0317: a settings write through the state machine stores what it
    // changed, in its history row and in the layer's rows.
    use super::*;
    use crate::store::command::{Applied, Command};
    use redb::ReadableTableMetadata;

    fn apply(app: &MeshApp, db: &redb::Database, index: u64, command: Command) -> Outcome {
        let p = Proposal {
            epoch: 1,
            expect_revision: None,
            actor: "operator:op".into(),
            time_ms: index,
            command,
        };
        let bytes = mesh_codec::encode("proposal", &p).expect("encode");
        let txn = db.begin_write().expect("txn");
        let at = EntryAt {
            index,
            term: 1,
            position: 0,
        };
        let answer = app.apply(&txn, at, Some(&bytes)).expect("applied");
        txn.commit().expect("commit");
        decode_outcome(&answer).expect("outcome")
    }

    fn set(kv: &[(String, String)], replace: bool) -> Command {
        Command::SetSettings {
            scope: Scope::Mesh,
            set: kv.iter().cloned().collect(),
            remove: Default::default(),
            replace,
            why: "w".into(),
        }
    }

    fn history_row_bytes(db: &redb::Database, id: u64) -> usize {
        let txn = db.begin_read().expect("read");
        let t = txn.open_table(tables::SETTINGS_HISTORY).expect("history");
        t.get(id).expect("get").expect("row").value().len()
    }

    #[test]
    fn a_write_to_a_large_layer_stores_the_key_it_changed_and_a_cleared_layer_comes_back() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let db = mesh_migrations::open(&tmp.path().join("store")).expect("store");
        let app = MeshApp::default();
        let value = "v".repeat(1024);
        let big: Vec<(String, String)> =
            (0..200).map(|i| (format!("k{i}"), value.clone())).collect();
        assert!(matches!(
            apply(&app, &db, 1, set(&big, false)),
            Outcome::Applied(_)
        ));
        let one = [("k7".to_string(), "w".repeat(1024))];
        let Outcome::Applied(Applied::Settings { changed, added, .. }) =
            apply(&app, &db, 2, set(&one, false))
        else {
            panic!("the write applied");
        };
        assert_eq!((changed, added), (vec!["k7".to_string()], vec![]));
        // One key before and after, not two layers of 200 KiB.
        let row = history_row_bytes(&db, 2);
        assert!(
            row < 3 * 1024,
            "history row of a one-key write is {row} bytes"
        );
        assert!(
            history_row_bytes(&db, 1) > 200 * 1024,
            "the creation keeps every key"
        );
        assert!(matches!(
            apply(
                &app,
                &db,
                3,
                Command::ClearSettings {
                    scope: Scope::Mesh,
                    why: "c".into()
                }
            ),
            Outcome::Applied(_)
        ));
        let again = [("n".to_string(), "1".to_string())];
        assert!(matches!(
            apply(&app, &db, 4, set(&again, false)),
            Outcome::Applied(_)
        ));
        {
            let txn = db.begin_read().expect("read");
            let values = txn.open_table(tables::SETTINGS_VALUES).expect("values");
            assert_eq!(
                values.len().expect("len"),
                1,
                "the cleared layer's keys are gone"
            );
        }
        let history = MeshApp::settings_history(&db).expect("history");
        let mut after_two: Layer = big.iter().cloned().collect();
        after_two.insert("k7".into(), "w".repeat(1024));
        let sides: Vec<(Option<&Layer>, Option<&Layer>)> = history
            .iter()
            .map(|c| (c.before.as_ref(), c.after.as_ref()))
            .collect();
        let created: Layer = big.iter().cloned().collect();
        let recreated: Layer = again.iter().cloned().collect();
        assert_eq!(
            sides,
            vec![
                (None, Some(&created)),
                (Some(&created), Some(&after_two)),
                (Some(&after_two), None),
                (None, Some(&recreated)),
            ]
        );
        let rolled = MeshApp::settings_change(&db, 2)
            .expect("read")
            .expect("entry");
        assert_eq!(rolled.after, Some(after_two));
        // What is in memory is what a replica reads back at start.
        let loaded = MeshApp::load(&db).expect("load");
        assert_eq!(
            loaded.state().expect("state").mesh.settings,
            app.state().expect("state").mesh.settings
        );
    }
}

#[cfg(test)]
mod batches {
    // Decision 0330: a batch of commands is applied through tables opened once, and forgotten
    // requests leave the store in sweeps. Neither may change what a replica keeps or answers.
    use super::*;
    use crate::core::declaration::Digest;
    use crate::core::meshfile::parse_mesh;
    use crate::store::command::{Command, requests_remembered_max};
    use crate::store::state::requests_swept_together;
    use redb::ReadableTableMetadata;

    fn proposal(time_ms: u64, command: Command) -> Vec<u8> {
        let p = Proposal {
            epoch: 1,
            expect_revision: None,
            actor: "operator:op".into(),
            time_ms,
            command,
        };
        mesh_codec::encode("proposal", &p).expect("encode")
    }

    fn send(sequence: u64) -> Command {
        Command::RecordSends {
            sends: vec![SendRecord {
                machine: "ace".into(),
                epoch: 1,
                sequence,
                digest: Digest([sequence as u8; 32]),
                summary: Default::default(),
                why: format!("send {sequence}"),
                actor: "op".into(),
                time_ms: sequence,
                moves: Vec::new(),
            }],
        }
    }

    fn set(scope: Scope, key: &str, value: &str) -> Command {
        Command::SetSettings {
            scope,
            set: [(key.to_string(), value.to_string())].into_iter().collect(),
            remove: Default::default(),
            replace: false,
            why: "w".into(),
        }
    }

    fn at(index: u64, position: u32) -> EntryAt {
        EntryAt {
            index,
            term: 1,
            position,
        }
    }

    #[test]
    fn g4_a_batch_applied_at_once_keeps_every_row_each_command_kept_alone() {
        // G4 and G6: every send record and settings write is in the store after its apply. A
        // batch written through tables opened once must store the rows of each command as it
        // left the state, not the batch's last state: two sends to one machine in one batch are
        // two records.
        let text = "[machines.ace]\naddress = \"10.0.0.1\"\n[settings.mesh]\nk = \"v\"\n";
        let mesh = parse_mesh("mesh.toml", text).expect("parses");
        let model = Command::ApplyModel {
            mesh,
            why: "m".into(),
            changes: vec![],
        };
        let machine = Scope::Machine("ace".into());
        let once = |i: u8, command: Command| Command::Once {
            request: RequestId([i; 16]),
            command: Box::new(command),
        };
        let commands: Vec<Vec<u8>> = vec![
            proposal(1, model),
            proposal(2, send(1)),
            proposal(3, once(1, set(Scope::Mesh, "k", "w"))),
            proposal(4, send(2)),
            proposal(5, once(2, set(machine.clone(), "a", "1"))),
            proposal(6, once(1, set(Scope::Mesh, "k", "again"))),
            proposal(7, set(machine, "a", "2")),
            proposal(8, send(3)),
        ];
        let at_once_dir = tempfile::tempdir().expect("tempdir");
        let at_once_db = mesh_migrations::open(&at_once_dir.path().join("store")).expect("store");
        let at_once = MeshApp::default();
        let batch: Vec<(EntryAt, Option<&[u8]>)> = commands
            .iter()
            .enumerate()
            .map(|(i, c)| (at(1, i as u32), Some(c.as_slice())))
            .collect();
        let txn = at_once_db.begin_write().expect("txn");
        let answers_at_once = at_once.apply_all(&txn, &batch).expect("applied");
        txn.commit().expect("commit");

        let alone_dir = tempfile::tempdir().expect("tempdir");
        let alone_db = mesh_migrations::open(&alone_dir.path().join("store")).expect("store");
        let alone = MeshApp::default();
        let mut answers_alone = Vec::new();
        for (i, c) in commands.iter().enumerate() {
            let txn = alone_db.begin_write().expect("txn");
            answers_alone.push(
                alone
                    .apply(&txn, at(i as u64 + 1, 0), Some(c))
                    .expect("applied"),
            );
            txn.commit().expect("commit");
        }
        assert_eq!(answers_at_once, answers_alone);
        for answer in &answers_at_once {
            let outcome = decode_outcome(answer).expect("outcome");
            assert!(matches!(outcome, Outcome::Applied(_)), "{outcome:?}");
        }
        let sends = MeshApp::sends(&at_once_db, None).expect("sends");
        assert_eq!(
            sends.iter().map(|s| s.why.as_str()).collect::<Vec<_>>(),
            vec!["send 1", "send 2", "send 3"],
            "each send's own record"
        );
        assert_eq!(sends, MeshApp::sends(&alone_db, None).expect("sends"));
        assert_eq!(
            MeshApp::settings_history(&at_once_db).expect("history"),
            MeshApp::settings_history(&alone_db).expect("history")
        );
        assert_eq!(
            MeshApp::model_history(&at_once_db).expect("models"),
            MeshApp::model_history(&alone_db).expect("models")
        );
        let loaded = MeshApp::load(&at_once_db).expect("load");
        let in_memory = at_once.state().expect("state");
        assert_eq!(*loaded.state().expect("state"), *in_memory);
        assert_eq!(*in_memory, *alone.state().expect("state"));
        assert_eq!(
            *MeshApp::load(&alone_db)
                .expect("load")
                .state()
                .expect("state"),
            *alone.state().expect("state")
        );
    }

    /// Applies `commands` as the batch of log entry `index`, committed.
    fn apply_batch(db: &redb::Database, app: &MeshApp, index: u64, commands: &[Vec<u8>]) {
        let batch: Vec<(EntryAt, Option<&[u8]>)> = commands
            .iter()
            .enumerate()
            .map(|(p, c)| (at(index, p as u32), Some(c.as_slice())))
            .collect();
        let txn = db.begin_write().expect("txn");
        app.apply_all(&txn, &batch).expect("applied");
        txn.commit().expect("commit");
    }

    #[test]
    fn the_settings_history_keeps_its_newest_changes_and_reads_back_whole_after_a_cut() {
        // Decision 0341: the history keeps the newest `settings_history_kept_max` changes; older
        // rows leave as newer ones are written, so the disk does not grow with every write, and
        // what is kept still rebuilds (each kept change with its whole layers) and reloads.
        use crate::store::state::{settings_history_cut_together, settings_history_kept_max};
        let tmp = tempfile::tempdir().expect("tempdir");
        let db = mesh_migrations::open(&tmp.path().join("store")).expect("store");
        let app = MeshApp::default();
        let total = settings_history_kept_max + settings_history_cut_together + 7;
        let mut most_rows = 0;
        for (index, chunk) in (0..total).collect::<Vec<u64>>().chunks(1_000).enumerate() {
            let commands: Vec<Vec<u8>> = chunk
                .iter()
                .map(|&i| {
                    proposal(
                        i,
                        Command::SetSettings {
                            scope: crate::core::settings::Scope::Mesh,
                            set: [(format!("k{}", i % 3), format!("v{i}"))]
                                .into_iter()
                                .collect(),
                            remove: Default::default(),
                            replace: false,
                            why: format!("write {i}"),
                        },
                    )
                })
                .collect();
            apply_batch(&db, &app, index as u64 + 1, &commands);
            let txn = db.begin_read().expect("read");
            let rows = txn.open_table(tables::SETTINGS_HISTORY).expect("history");
            most_rows = most_rows.max(rows.len().expect("len"));
        }
        assert_eq!(
            most_rows, settings_history_kept_max,
            "the store never kept more than the newest changes"
        );
        let history = MeshApp::settings_history(&db).expect("the kept history rebuilds");
        assert_eq!(history.len() as u64, settings_history_kept_max);
        let newest = history.last().expect("newest");
        assert_eq!(newest.id, total, "the newest change is kept");
        assert_eq!(newest.why, format!("write {}", total - 1));
        assert_eq!(
            history.first().expect("oldest").id,
            total - settings_history_kept_max + 1,
            "the oldest kept is the one just inside the bound"
        );
        let loaded = MeshApp::load(&db).expect("load");
        assert_eq!(
            loaded.state().expect("state").next_history_id,
            total,
            "ids go on after a restart, never reused"
        );
    }

    #[test]
    fn exactly_once_a_store_remembers_what_memory_remembers_though_forgotten_rows_leave_in_sweeps()
    {
        // Exactly-once retries (`Command::Once`, decision 0180): a replica started from its store,
        // or from a snapshot of it, remembers exactly the requests the running replica does, and
        // the rows of forgotten requests do leave the store (decision 0330: in sweeps of
        // `requests_swept_together`, so it holds at most that many more).
        let tmp = tempfile::tempdir().expect("tempdir");
        let db = mesh_migrations::open(&tmp.path().join("store")).expect("store");
        let app = MeshApp::default();
        let total = requests_remembered_max as u64 + 2 * requests_swept_together + 5;
        let id_of = |i: u64| {
            let mut id = [0u8; 16];
            id[..8].copy_from_slice(&i.to_le_bytes());
            RequestId(id)
        };
        let mut most_rows = 0;
        for (index, chunk) in (0..total).collect::<Vec<u64>>().chunks(1_000).enumerate() {
            let commands: Vec<Vec<u8>> = chunk
                .iter()
                .map(|&i| {
                    proposal(
                        i,
                        Command::Once {
                            request: id_of(i),
                            command: Box::new(Command::RaiseEpochFloor { epoch: 1 }),
                        },
                    )
                })
                .collect();
            apply_batch(&db, &app, index as u64 + 1, &commands);
            let txn = db.begin_read().expect("read");
            let rows = txn.open_table(tables::REQUESTS).expect("requests");
            most_rows = most_rows.max(rows.len().expect("len"));
        }
        let live = app.state().expect("state");
        assert_eq!(live.requests.len(), requests_remembered_max);
        assert!(
            most_rows < requests_remembered_max as u64 + requests_swept_together,
            "the store kept {most_rows} request rows"
        );
        let loaded = MeshApp::load(&db).expect("load");
        let loaded = loaded.state().expect("state");
        assert_eq!(
            loaded.requests.len(),
            live.requests.len(),
            "a restart remembers as many"
        );
        assert_eq!(
            loaded.requests, live.requests,
            "a restart remembers the same"
        );
        assert_eq!(loaded.request_order, live.request_order);
        assert!(loaded.remembered(&id_of(total - 1)).is_some());
        assert!(
            loaded
                .remembered(&id_of(total - 1 - requests_remembered_max as u64))
                .is_none()
        );
        let txn = db.begin_read().expect("read");
        let snap = decode_snapshot(&app.snapshot(&txn).expect("snapshot")).expect("decode");
        assert_eq!(
            snap.state.requests, live.requests,
            "a snapshot carries the same"
        );
        let installed_dir = tempfile::tempdir().expect("tempdir");
        let installed_db =
            mesh_migrations::open(&installed_dir.path().join("store")).expect("store");
        let installed = MeshApp::default();
        let bytes = app.snapshot(&txn).expect("snapshot");
        let w = installed_db.begin_write().expect("txn");
        installed.install(&w, &bytes).expect("install");
        w.commit().expect("commit");
        assert_eq!(installed.state().expect("state").requests, live.requests);
    }
}
