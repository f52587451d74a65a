//! The settings history as readers see it, rebuilt from what the store keeps (decision 0317): each
//! entry holds only the keys its write changed, so the whole layers before and after a write are
//! the layer in force with every newer write of its scope undone, newest first. Pure: the caller
//! reads the layers and the entries in one read transaction, so both are the same point in the log.

use std::collections::BTreeMap;

use super::command::{SettingsChange, SettingsEntry};
use crate::core::layer_delta::{LayerDelta, UndoError};
use crate::core::settings::{Layer, Scope};

/// Why the history could not be rebuilt: entry `id`'s write did not leave its layer as the newer
/// entries and the layer in force say. Nothing is shown rather than a guess.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "settings history entry #{id} ({scope}) does not match the layer its later writes and the layer in force give: {why}; the store's history is inconsistent, restore the replica from a snapshot of a healthy one"
)]
pub struct RebuildError {
    pub id: u64,
    pub scope: Scope,
    pub why: UndoError,
}

/// Undoes writes newest first, from the layers they leave behind. Feed it every entry newer than
/// the ones wanted (of their scopes at least), newest first.
#[derive(Debug)]
pub struct Rewinder {
    /// Each scope's layer as it is after the entries fed so far were undone.
    layers: BTreeMap<Scope, Layer>,
}

impl Rewinder {
    /// Starting from the layers in force.
    pub fn new(layers: BTreeMap<Scope, Layer>) -> Rewinder {
        Rewinder { layers }
    }

    /// Undoes `entry` (the newest not yet undone) and answers it with its whole layers.
    pub fn undo(&mut self, entry: &SettingsEntry) -> Result<SettingsChange, RebuildError> {
        let after = self.layers.remove(&entry.scope);
        let before = entry
            .delta
            .undo(after.as_ref())
            .map_err(|why| RebuildError {
                id: entry.id,
                scope: entry.scope.clone(),
                why,
            })?;
        if let Some(b) = &before {
            self.layers.insert(entry.scope.clone(), b.clone());
        }
        Ok(SettingsChange {
            id: entry.id,
            scope: entry.scope.clone(),
            before,
            after,
            why: entry.why.clone(),
            actor: entry.actor.clone(),
            epoch: entry.epoch,
            time_ms: entry.time_ms,
        })
    }

    /// Undoes `entry` without building the whole layers of its answer: for entries only walked
    /// past.
    pub fn skip(&mut self, entry: &SettingsEntry) -> Result<(), RebuildError> {
        self.undo(entry).map(drop)
    }
}

/// Every entry of `newest_first` with its whole layers, oldest first, from the layers in force.
pub fn rebuild(
    layers: BTreeMap<Scope, Layer>,
    newest_first: &[SettingsEntry],
) -> Result<Vec<SettingsChange>, RebuildError> {
    let mut rewinder = Rewinder::new(layers);
    let mut out = Vec::with_capacity(newest_first.len());
    for entry in newest_first {
        out.push(rewinder.undo(entry)?);
    }
    out.reverse();
    Ok(out)
}

/// The stored shape of a whole-layer change (schema before 0012, snapshots before decision 0317).
pub fn entry_of(change: &SettingsChange) -> SettingsEntry {
    SettingsEntry {
        id: change.id,
        scope: change.scope.clone(),
        delta: LayerDelta::between(change.before.as_ref(), change.after.as_ref()),
        why: change.why.clone(),
        actor: change.actor.clone(),
        epoch: change.epoch,
        time_ms: change.time_ms,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::layer_delta::edit_delta;
    use crate::core::settings::parse_assignments;

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
            why: format!("w{id}"),
            actor: "operator:op".into(),
            epoch: 2,
            time_ms: id,
        }
    }

    #[test]
    fn the_history_rebuilt_from_deltas_is_the_whole_layer_history_it_replaced() {
        // Issue 26 item 2, decision 0317: `settings show --history` reads as before. A history
        // of two interleaved scopes with a create, merges, a replace, a clear and a re-create,
        // kept as deltas, is rebuilt from the layers in force into exactly the whole layers.
        let m = Scope::Mesh;
        let ace = Scope::Machine("ace".into());
        let whole = vec![
            change(1, &m, None, Some(layer(&[("a", "1")]))),
            change(2, &ace, None, Some(layer(&[("x", "1")]))),
            change(
                3,
                &m,
                Some(layer(&[("a", "1")])),
                Some(layer(&[("a", "2"), ("b", "1")])),
            ),
            change(4, &ace, Some(layer(&[("x", "1")])), None),
            change(
                5,
                &m,
                Some(layer(&[("a", "2"), ("b", "1")])),
                Some(layer(&[("b", "1")])),
            ),
            change(6, &ace, None, Some(layer(&[("y", "2")]))),
            change(
                7,
                &m,
                Some(layer(&[("b", "1")])),
                Some(layer(&[("b", "1")])),
            ),
        ];
        let in_force = BTreeMap::from([
            (m.clone(), layer(&[("b", "1")])),
            (ace, layer(&[("y", "2")])),
        ]);
        let mut stored: Vec<SettingsEntry> = whole.iter().map(entry_of).collect();
        assert!(
            stored[6].delta.keys.is_empty(),
            "an unchanged write keeps no key"
        );
        assert_eq!(
            stored[2].delta.keys.len(),
            2,
            "a merge keeps the keys it wrote"
        );
        stored.reverse();
        assert_eq!(rebuild(in_force, &stored), Ok(whole));
    }

    #[test]
    fn a_history_that_disagrees_with_the_layer_in_force_is_refused_naming_the_entry() {
        // Decision 0317: no guess when the layer and the history disagree.
        let m = Scope::Mesh;
        let edit = parse_assignments(&["a=2"]).expect("parse");
        let delta = edit_delta(Some(&layer(&[("a", "1")])), &edit, false).expect("delta");
        let entry = SettingsEntry {
            id: 9,
            scope: m.clone(),
            delta,
            why: String::new(),
            actor: String::new(),
            epoch: 1,
            time_ms: 1,
        };
        let in_force = BTreeMap::from([(m, layer(&[("a", "7")]))]);
        let err = rebuild(in_force, &[entry]).expect_err("inconsistent");
        assert_eq!(err.id, 9);
        assert!(err.to_string().contains("entry #9 (mesh)"), "{err}");
    }
}
