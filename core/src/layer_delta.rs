//! What one settings write changed in its layer, key by key (decision 0317): the settings history
//! keeps this instead of the whole layer before and after, so a write costs what it changes. The
//! whole layers a reader sees are rebuilt from the layer in force by undoing the newer writes.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

use crate::settings::{Edit, Layer, SettingsError, check_edit};

/// One key's value before and after a write; `None` where the layer did not hold the key.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeyChange {
    pub before: Option<String>,
    pub after: Option<String>,
}

/// What a write did to one layer: the keys it added, replaced or removed (a key written with the
/// value it had is not listed), and whether the layer came into being or went away.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LayerDelta {
    /// The scope had no layer before the write.
    pub created: bool,
    /// The scope has no layer after the write (`settings clear`).
    pub cleared: bool,
    pub keys: BTreeMap<String, KeyChange>,
}

/// Why a delta cannot be undone from a layer: the layer is not what the write left it, so the
/// history and the layer disagree and no earlier layer can be rebuilt from them.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum UndoError {
    #[error("the write left the layer in place but it is gone")]
    LayerMissing,
    #[error("the write cleared the layer but a layer is there")]
    LayerPresent,
    #[error("key `{key}` is {found:?} but the write left it {expected:?}")]
    KeyDiffers {
        key: String,
        expected: Option<String>,
        found: Option<String>,
    },
}

impl LayerDelta {
    /// The delta between two whole layers (`None`: no layer). What a write stored before decision
    /// 0317 is turned into this.
    pub fn between(before: Option<&Layer>, after: Option<&Layer>) -> LayerDelta {
        let empty = Layer::new();
        let (old, new) = (before.unwrap_or(&empty), after.unwrap_or(&empty));
        let mut keys = BTreeMap::new();
        for (k, v) in old {
            if new.get(k) != Some(v) {
                let after = new.get(k).cloned();
                keys.insert(k.clone(), change(Some(v.clone()), after));
            }
        }
        for (k, v) in new {
            if !old.contains_key(k) {
                keys.insert(k.clone(), change(None, Some(v.clone())));
            }
        }
        LayerDelta {
            created: before.is_none() && after.is_some(),
            cleared: before.is_some() && after.is_none(),
            keys,
        }
    }

    /// The delta of clearing `current`: every key removed.
    pub fn clear(current: &Layer) -> LayerDelta {
        LayerDelta {
            created: false,
            cleared: true,
            keys: current
                .iter()
                .map(|(k, v)| (k.clone(), change(Some(v.clone()), None)))
                .collect(),
        }
    }

    /// Makes `layer` (the scope's layer, `None` for none) what the write left it. Costs the keys
    /// changed, never a copy of the layer.
    pub fn apply(
        &self,
        layers: &mut BTreeMap<crate::settings::Scope, Layer>,
        scope: &crate::settings::Scope,
    ) {
        if self.cleared {
            layers.remove(scope);
            return;
        }
        let layer = layers.entry(scope.clone()).or_default();
        for (k, c) in &self.keys {
            match &c.after {
                Some(v) => layer.insert(k.clone(), v.clone()),
                None => layer.remove(k),
            };
        }
    }

    /// The layer before the write, from the layer `after` it (`None`: no layer), checking that
    /// `after` is what the write left: a key or the layer's presence that differs is an error,
    /// never a guess.
    pub fn undo(&self, after: Option<&Layer>) -> Result<Option<Layer>, UndoError> {
        let mut layer = match (after, self.cleared) {
            (Some(_), true) => return Err(UndoError::LayerPresent),
            (None, false) => return Err(UndoError::LayerMissing),
            (Some(l), false) => l.clone(),
            (None, true) => Layer::new(),
        };
        for (k, c) in &self.keys {
            let found = layer.get(k);
            if found != c.after.as_ref() {
                return Err(UndoError::KeyDiffers {
                    key: k.clone(),
                    expected: c.after.clone(),
                    found: found.cloned(),
                });
            }
            match &c.before {
                Some(v) => layer.insert(k.clone(), v.clone()),
                None => layer.remove(k),
            };
        }
        Ok((!self.created).then_some(layer))
    }

    /// Keys the write added (with their values), in key order.
    pub fn added(&self) -> impl Iterator<Item = &str> {
        self.keys
            .iter()
            .filter(|(_, c)| c.before.is_none() && c.after.is_some())
            .map(|(k, _)| k.as_str())
    }

    /// Keys the write gave another value.
    pub fn changed(&self) -> impl Iterator<Item = &str> {
        self.keys
            .iter()
            .filter(|(_, c)| c.before.is_some() && c.after.is_some())
            .map(|(k, _)| k.as_str())
    }

    /// Keys the write removed.
    pub fn removed(&self) -> impl Iterator<Item = &str> {
        self.keys
            .iter()
            .filter(|(_, c)| c.after.is_none())
            .map(|(k, _)| k.as_str())
    }
}

fn change(before: Option<String>, after: Option<String>) -> KeyChange {
    KeyChange { before, after }
}

/// The delta of an operator's [`Edit`] on `current`, the one rule of G6 that the controller checks
/// before it proposes and the state machine applies (removals need `replace`; `replace` needs a
/// layer and makes the set keys the whole layer), without building the new layer: a merge costs the keys written,
/// a replace the keys of the layer.
pub fn edit_delta(
    current: Option<&Layer>,
    edit: &Edit,
    replace: bool,
) -> Result<LayerDelta, SettingsError> {
    check_edit(edit)?;
    if !replace && !edit.remove.is_empty() {
        return Err(SettingsError::RemovalWithoutReplace {
            keys: edit.remove.iter().cloned().collect(),
        });
    }
    let empty = Layer::new();
    let old = match (current, replace) {
        (None, true) => return Err(SettingsError::NoLayer),
        (None, false) => &empty,
        (Some(old), _) => old,
    };
    let mut keys = BTreeMap::new();
    for (k, v) in &edit.set {
        let was = old.get(k);
        if was != Some(v) {
            keys.insert(k.clone(), change(was.cloned(), Some(v.clone())));
        }
    }
    if replace {
        for (k, v) in old {
            if !edit.set.contains_key(k) {
                keys.insert(k.clone(), change(Some(v.clone()), None));
            }
        }
    }
    Ok(LayerDelta {
        created: current.is_none(),
        cleared: false,
        keys,
    })
}

/// The delta of `settings clear` on `current`: every key goes; a scope with no layer is refused.
pub fn clear_delta(current: Option<&Layer>) -> Result<LayerDelta, SettingsError> {
    current.map(LayerDelta::clear).ok_or(SettingsError::NoLayer)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::settings::{Scope, parse_assignments};

    fn layer(kv: &[(&str, &str)]) -> Layer {
        kv.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn kc(before: Option<&str>, after: Option<&str>) -> KeyChange {
        change(before.map(String::from), after.map(String::from))
    }

    #[test]
    fn a_delta_holds_only_the_keys_a_write_set_replaced_or_removed() {
        // Issue 26 item 2, decision 0317: a write to a large layer keeps the keys it changed,
        // each with its value before and after; a key written with the value it had is not one.
        let current = layer(&[("a", "1"), ("b", "2"), ("c", "3"), ("keep", "k")]);
        let edit = parse_assignments(&["a=1", "b=20", "n=new"]).expect("parse");
        let d = edit_delta(Some(&current), &edit, false).expect("merge");
        assert_eq!(
            d.keys,
            BTreeMap::from([
                ("b".to_string(), kc(Some("2"), Some("20"))),
                ("n".to_string(), kc(None, Some("new"))),
            ])
        );
        assert!(!d.created && !d.cleared);
        let edit = parse_assignments(&["-b", "-c", "a=1", "keep=k"]).expect("parse");
        let d = edit_delta(Some(&current), &edit, true).expect("replace");
        assert_eq!(
            d.keys,
            BTreeMap::from([
                ("b".to_string(), kc(Some("2"), None)),
                ("c".to_string(), kc(Some("3"), None)),
            ])
        );
        assert_eq!(d.removed().collect::<Vec<_>>(), ["b", "c"]);
        let created =
            edit_delta(None, &parse_assignments(&["x=1"]).expect("parse"), false).expect("create");
        assert!(created.created);
        assert_eq!(created.added().collect::<Vec<_>>(), ["x"]);
    }

    #[test]
    fn a_delta_makes_the_layer_the_write_asks_for_and_undoes_back_to_the_old_one() {
        // Decision 0317: the state machine applies the delta instead of the whole new layer, and
        // history views undo it; the layer it leaves is the one G6's rule asks for.
        let scope = Scope::Mesh;
        let cases: &[(Option<Layer>, &[&str], bool, Layer)] = &[
            (
                None,
                &["a=1", "b=2"],
                false,
                layer(&[("a", "1"), ("b", "2")]),
            ),
            (
                Some(layer(&[("a", "1")])),
                &["a=2", "b=3"],
                false,
                layer(&[("a", "2"), ("b", "3")]),
            ),
            (
                Some(layer(&[("a", "1"), ("b", "2")])),
                &["-a", "b=5"],
                true,
                layer(&[("b", "5")]),
            ),
            (Some(layer(&[("a", "1")])), &["-a"], true, layer(&[])),
            (
                Some(layer(&[("a", "1")])),
                &["a=1"],
                false,
                layer(&[("a", "1")]),
            ),
        ];
        for (current, words, replace, whole) in cases {
            let edit = parse_assignments(words).expect("parse");
            let delta = edit_delta(current.as_ref(), &edit, *replace).expect("delta");
            let mut layers = BTreeMap::new();
            if let Some(l) = current {
                layers.insert(scope.clone(), l.clone());
            }
            delta.apply(&mut layers, &scope);
            assert_eq!(layers.get(&scope), Some(whole), "{words:?}");
            assert_eq!(delta, LayerDelta::between(current.as_ref(), Some(whole)));
            assert_eq!(delta.undo(Some(whole)), Ok(current.clone()), "{words:?}");
        }
    }

    #[test]
    fn a_cleared_and_recreated_layer_undoes_to_nothing_then_to_the_cleared_layer() {
        // Decision 0317: clearing keeps every key with its old value, so the layer before a
        // clear comes back whole; the write that created the layer again undoes to no layer.
        let scope = Scope::Machine("ace".into());
        let old = layer(&[("a", "1"), ("b", "2")]);
        let clear = LayerDelta::clear(&old);
        let recreate =
            edit_delta(None, &parse_assignments(&["c=3"]).expect("parse"), false).expect("create");
        let mut layers = BTreeMap::from([(scope.clone(), old.clone())]);
        clear.apply(&mut layers, &scope);
        assert_eq!(layers.get(&scope), None);
        recreate.apply(&mut layers, &scope);
        let now = layers.get(&scope).cloned();
        assert_eq!(now, Some(layer(&[("c", "3")])));
        let before_recreate = recreate.undo(now.as_ref()).expect("undo create");
        assert_eq!(before_recreate, None);
        assert_eq!(clear.undo(before_recreate.as_ref()), Ok(Some(old)));
    }

    #[test]
    fn a_layer_that_is_not_what_the_write_left_cannot_be_undone() {
        // Decision 0317: a history that disagrees with the layer is refused, never guessed over.
        let d = LayerDelta::between(Some(&layer(&[("a", "1")])), Some(&layer(&[("a", "2")])));
        assert_eq!(
            d.undo(Some(&layer(&[("a", "3")]))),
            Err(UndoError::KeyDiffers {
                key: "a".into(),
                expected: Some("2".into()),
                found: Some("3".into()),
            })
        );
        assert_eq!(d.undo(None), Err(UndoError::LayerMissing));
        let cleared = LayerDelta::clear(&layer(&[("a", "1")]));
        assert_eq!(
            cleared.undo(Some(&Layer::new())),
            Err(UndoError::LayerPresent)
        );
    }
}
