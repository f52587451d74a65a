//! Migration 0012: a settings write costs what it changes (issue 26 item 2, decision 0317). Each
//! `settings_history` record is rewritten from the whole layer before and after the write to the
//! keys it changed, before and after each, and the keys of each `settings_layers` row move to the
//! new table `settings_values`, one row per key, leaving the layer row as an empty marker that the
//! layer exists (a layer may exist with no keys).
//!
//! The record shapes are frozen here, as the domain encoded them at schema 0011 and encodes them
//! from 0012 (`mesh::store::command::SettingsChange`, `SettingsEntry`); a test on the domain side
//! reads what this step writes.

use std::collections::BTreeMap;

use redb::{ReadableTable, WriteTransaction};
use serde::{Deserialize, Serialize};

use crate::StepError;
use crate::tables;

pub(crate) const VERSION: u64 = 12;
pub(crate) const NAME: &str = "settings_deltas";

/// History records rewritten per pass: bounds what the step holds in memory, whatever the
/// history's length (each old record may hold two whole layers).
const history_rows_per_pass_max: usize = 1024;

pub(crate) type Layer = BTreeMap<String, String>;

/// `core::settings::Scope`, variants in its order (the variant index is the encoding).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) enum Scope {
    Mesh,
    Machine(String),
    Module(String),
    Placement { module: String, machine: String },
}

/// A history record as schema 0011 kept it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct WholeLayers {
    pub(crate) id: u64,
    pub(crate) scope: Scope,
    pub(crate) before: Option<Layer>,
    pub(crate) after: Option<Layer>,
    pub(crate) why: String,
    pub(crate) actor: String,
    pub(crate) epoch: u64,
    pub(crate) time_ms: u64,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct KeyChange {
    pub(crate) before: Option<String>,
    pub(crate) after: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct LayerDelta {
    pub(crate) created: bool,
    pub(crate) cleared: bool,
    pub(crate) keys: BTreeMap<String, KeyChange>,
}

/// A history record as schema 0012 keeps it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Entry {
    pub(crate) id: u64,
    pub(crate) scope: Scope,
    pub(crate) delta: LayerDelta,
    pub(crate) why: String,
    pub(crate) actor: String,
    pub(crate) epoch: u64,
    pub(crate) time_ms: u64,
}

fn delta(before: Option<Layer>, after: Option<Layer>) -> LayerDelta {
    let (created, cleared) = (before.is_none(), after.is_none());
    // allow(empty-on-error): no layer before or after is a layer of no keys, not an error
    let (old, mut new) = (before.unwrap_or_default(), after.unwrap_or_default());
    let mut keys = BTreeMap::new();
    for (k, v) in old {
        match new.remove(&k) {
            Some(n) if n == v => {}
            n => {
                keys.insert(
                    k,
                    KeyChange {
                        before: Some(v),
                        after: n,
                    },
                );
            }
        }
    }
    for (k, v) in new {
        keys.insert(
            k,
            KeyChange {
                before: None,
                after: Some(v),
            },
        );
    }
    LayerDelta {
        created: created && !cleared,
        cleared: cleared && !created,
        keys,
    }
}

pub(crate) fn step(txn: &WriteTransaction) -> Result<(), StepError> {
    history(txn)?;
    layers(txn)
}

fn history(txn: &WriteTransaction) -> Result<(), StepError> {
    let mut t = txn.open_table(tables::SETTINGS_HISTORY)?;
    let mut next = 0u64;
    loop {
        let mut pass = Vec::new();
        for row in t.range(next..)?.take(history_rows_per_pass_max) {
            let (k, v) = row?;
            pass.push((k.value(), v.value().to_vec()));
        }
        let Some(&(last, _)) = pass.last() else {
            return Ok(());
        };
        for (id, bytes) in pass {
            let old: WholeLayers = mesh_codec::decode("settings change (schema 0011)", &bytes)?;
            if old.id != id {
                return Err(StepError::Refused(format!(
                    "settings_history row {id} holds entry #{}; the store is not consistent, restore it from a snapshot",
                    old.id
                )));
            }
            let entry = Entry {
                id: old.id,
                scope: old.scope,
                delta: delta(old.before, old.after),
                why: old.why,
                actor: old.actor,
                epoch: old.epoch,
                time_ms: old.time_ms,
            };
            let bytes = mesh_codec::encode("settings entry", &entry)?;
            t.insert(id, bytes.as_slice())?;
        }
        let Some(after) = last.checked_add(1) else {
            return Ok(());
        };
        next = after;
    }
}

fn layers(txn: &WriteTransaction) -> Result<(), StepError> {
    let mut layers = txn.open_table(tables::SETTINGS_LAYERS)?;
    let mut values = txn.open_table(tables::SETTINGS_VALUES)?;
    // Layers are bounded by the model (one per scope it names), so they are read at once.
    let mut rows = Vec::new();
    for row in layers.iter()? {
        let (k, v) = row?;
        let layer: Layer = mesh_codec::decode("settings layer (schema 0011)", v.value())?;
        rows.push((k.value().to_string(), layer));
    }
    for (scope, layer) in rows {
        for (key, value) in &layer {
            values.insert((scope.as_str(), key.as_str()), value.as_bytes())?;
        }
        layers.insert(scope.as_str(), b"".as_slice())?;
    }
    Ok(())
}
