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
};
use super::staging::{Chunk, Upload, UploadHead, UploadId};
use super::state::{Changed, DomainState};
use crate::core::model::Mesh;
use crate::core::settings::Scope;

const model_key_mesh: &str = "mesh";
const model_key_revision: &str = "revision";
const model_key_next_history: &str = "next_history_id";

/// Everything the domain keeps, as a snapshot carries it.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct DomainSnapshot {
    pub state: DomainState,
    pub sends: Vec<SendRecord>,
    pub history: Vec<SettingsChange>,
    pub models: Vec<ModelChange>,
    /// The kept models of model revisions (table `model_revisions`, decision 0302): revision and
    /// the encoded model as stored, oldest first.
    pub revisions: Vec<(u64, Vec<u8>)>,
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
        for row in txn
            .open_table(tables::SETTINGS_HISTORY)?
            .iter()?
            .rev()
            .take(n)
        {
            let (_, v) = row?;
            recent
                .settings
                .push(mesh_codec::decode("settings change", v.value())?);
        }
        recent.sends = newest_sends(&txn, n)?;
        recent.models.reverse();
        recent.settings.reverse();
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

    /// Settings history entry `id`, if there is one.
    pub fn settings_change(
        db: &redb::Database,
        id: u64,
    ) -> Result<Option<SettingsChange>, AppError> {
        let txn = db.begin_read()?;
        let table = txn.open_table(tables::SETTINGS_HISTORY)?;
        match table.get(id)? {
            Some(v) => Ok(Some(mesh_codec::decode("settings change", v.value())?)),
            None => Ok(None),
        }
    }

    /// Every replaced or cleared settings layer, oldest first.
    pub fn settings_history(db: &redb::Database) -> Result<Vec<SettingsChange>, AppError> {
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
        // Decoded before the lock: a bad proposal costs no writer time.
        let proposal = command.map(|bytes| mesh_codec::decode::<Proposal>("proposal", bytes));
        let mut shared = self
            .state
            .write()
            .map_err(|_| AppError::Other("domain state lock poisoned".into()))?;
        // In place; a copy is made only while a reader still holds the previous snapshot. A
        // storage error below leaves memory ahead of the store, and is fatal: openraft stops the
        // replica on it, and a restart reads the state back from the store (decision 0180).
        let state = Arc::make_mut(&mut shared);
        let Some(proposal) = proposal else {
            if let Some(change) = state.observe_term(at.term) {
                write_changes(txn, state, &[change], at)?;
            }
            return Ok(Vec::new());
        };
        let outcome = match proposal {
            Ok(proposal) => {
                let (outcome, changed) = state.apply(at.term, &proposal);
                write_changes(txn, state, &changed, at)?;
                outcome
            }
            Err(e) => Outcome::Refused(Refusal::Invalid(format!(
                "proposal could not be decoded: {e}"
            ))),
        };
        Ok(mesh_codec::encode("outcome", &outcome)?)
    }

    fn snapshot(&self, txn: &ReadTransaction) -> Result<Vec<u8>, AppError> {
        Ok(mesh_codec::encode("domain snapshot", &read_snapshot(txn)?)?)
    }

    fn install(&self, txn: &WriteTransaction, snapshot: &[u8]) -> Result<(), AppError> {
        let snap: DomainSnapshot = mesh_codec::decode("domain snapshot", snapshot)?;
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

fn write_changes(
    txn: &WriteTransaction,
    state: &DomainState,
    changed: &[Changed],
    at: EntryAt,
) -> Result<(), AppError> {
    for change in changed {
        match change {
            Changed::Model => {
                let mut t = txn.open_table(tables::MODEL)?;
                let mesh = Mesh {
                    settings: Default::default(),
                    ..state.mesh.clone()
                };
                t.insert(
                    model_key_mesh,
                    mesh_codec::encode("model", &mesh)?.as_slice(),
                )?;
            }
            Changed::Revision => {
                let mut t = txn.open_table(tables::MODEL)?;
                t.insert(
                    model_key_revision,
                    mesh_codec::encode("revision", &state.revision)?.as_slice(),
                )?;
                let next = mesh_codec::encode("history id", &state.next_history_id)?;
                t.insert(model_key_next_history, next.as_slice())?;
            }
            Changed::SettingsLayer(scope) => {
                let mut t = txn.open_table(tables::SETTINGS_LAYERS)?;
                let key = scope.to_string();
                match state.mesh.settings.layers.get(scope) {
                    Some(layer) => {
                        t.insert(
                            key.as_str(),
                            mesh_codec::encode("settings layer", layer)?.as_slice(),
                        )?;
                    }
                    None => {
                        t.remove(key.as_str())?;
                    }
                }
            }
            Changed::SettingsHistory(entry) => {
                let mut t = txn.open_table(tables::SETTINGS_HISTORY)?;
                t.insert(
                    entry.id,
                    mesh_codec::encode("settings change", entry)?.as_slice(),
                )?;
            }
            Changed::ModelHistory(entry) => {
                let mut t = txn.open_table(tables::MODEL_HISTORY)?;
                t.insert(
                    entry.revision,
                    mesh_codec::encode("model change", entry)?.as_slice(),
                )?;
            }
            Changed::Provision(id) => {
                let mut t = txn.open_table(tables::PROVISIONS)?;
                if let Some(p) = state.provisions.get(id) {
                    t.insert(id.as_str(), mesh_codec::encode("provision", p)?.as_slice())?;
                }
            }
            Changed::Send { machine, sequence } => {
                let mut t = txn.open_table(tables::SENDS)?;
                if let Some(s) = state.last_sends.get(machine) {
                    t.insert(
                        (machine.as_str(), *sequence),
                        mesh_codec::encode("send record", s)?.as_slice(),
                    )?;
                }
            }
            Changed::Account(machine) => {
                let mut t = txn.open_table(tables::ACCOUNTS)?;
                if let Some(a) = state.accounts.get(machine) {
                    t.insert(
                        machine.as_str(),
                        mesh_codec::encode("account", a)?.as_slice(),
                    )?;
                }
            }
            Changed::Holds(machine) => {
                let mut t = txn.open_table(tables::HOLDS)?;
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
                let mut t = txn.open_table(tables::REQUESTS)?;
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
            Changed::Revoked(key) => {
                let mut t = txn.open_table(tables::REVOKED)?;
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
                let mut t = txn.open_table(tables::SIGNERS)?;
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
                let mut t = txn.open_table(tables::MODEL_REVISIONS)?;
                t.insert(*revision, bytes.as_slice())?;
            }
            Changed::ModelRevisionPruned(revision) => {
                let mut t = txn.open_table(tables::MODEL_REVISIONS)?;
                t.remove(*revision)?;
            }
            Changed::Upload(id) => write_upload(txn, state, id)?,
            Changed::UploadChunk { upload, index } => {
                let mut t = txn.open_table(tables::UPLOAD_CHUNKS)?;
                if let Some(c) = state.uploads.get(upload).and_then(|u| u.chunks.get(index)) {
                    t.insert((upload.0.as_slice(), *index), c.bytes())?;
                }
            }
            Changed::EpochFloor => {
                let mut t = txn.open_table(tables::CONTROLLER_EPOCH)?;
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
    for row in txn.open_table(tables::SETTINGS_LAYERS)?.iter()? {
        let (k, v) = row?;
        let scope: Scope = k.value().parse().map_err(|e| {
            AppError::Other(format!(
                "stored settings scope {:?} is unreadable: {e}",
                k.value()
            ))
        })?;
        state
            .mesh
            .settings
            .layers
            .insert(scope, mesh_codec::decode("settings layer", v.value())?);
    }
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
    let history = read_history(txn)?;
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
        history,
        models,
        revisions,
    })
}

/// An upload's head row, or (the upload gone from the state) its head and every chunk row.
fn write_upload(
    txn: &WriteTransaction,
    state: &DomainState,
    id: &UploadId,
) -> Result<(), AppError> {
    let mut heads = txn.open_table(tables::UPLOADS)?;
    match state.uploads.get(id) {
        Some(u) => {
            heads.insert(
                id.0.as_slice(),
                mesh_codec::encode("upload head", &u.head)?.as_slice(),
            )?;
        }
        None => {
            heads.remove(id.0.as_slice())?;
            let mut chunks = txn.open_table(tables::UPLOAD_CHUNKS)?;
            let range = (id.0.as_slice(), 0u32)..=(id.0.as_slice(), u32::MAX);
            chunks.retain_in(range, |_, _| false)?;
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

fn read_history(txn: &ReadTransaction) -> Result<Vec<SettingsChange>, AppError> {
    let mut out = Vec::new();
    for row in txn.open_table(tables::SETTINGS_HISTORY)?.iter()? {
        let (_, v) = row?;
        out.push(mesh_codec::decode("settings change", v.value())?);
    }
    Ok(out)
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
    changed.extend(
        state
            .mesh
            .settings
            .layers
            .keys()
            .cloned()
            .map(Changed::SettingsLayer),
    );
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
    write_changes(txn, state, &changed, at)?;
    let mut sends = txn.open_table(tables::SENDS)?;
    for s in &snap.sends {
        sends.insert(
            (s.machine.as_str(), s.sequence),
            mesh_codec::encode("send record", s)?.as_slice(),
        )?;
    }
    let mut history = txn.open_table(tables::SETTINGS_HISTORY)?;
    for h in &snap.history {
        history.insert(h.id, mesh_codec::encode("settings change", h)?.as_slice())?;
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
                let c = SettingsChange {
                    id: i,
                    scope: Scope::Mesh,
                    before: None,
                    after: None,
                    why: String::new(),
                    actor: "op".into(),
                    epoch: 2,
                    time_ms: i,
                };
                let bytes = mesh_codec::encode("settings change", &c).expect("encode");
                settings.insert(i, bytes.as_slice()).expect("insert");
            }
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
