//! Settings layers: one key/value map per scope; the effective value is the latest scope that sets it.
//! Also the outcome of `settings set` (G6): what a write adds, changes and removes, computed before
//! anything is written, so the operator sees every key and a removal needs `--replace`.

use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};

/// Where a settings layer applies. Order of precedence (later wins): mesh, machine, module, placement.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum Scope {
    /// `mesh`
    Mesh,
    /// `machine/<m>`
    Machine(String),
    /// `module/<mod>`
    Module(String),
    /// `module/<mod>@<m>`
    Placement { module: String, machine: String },
}

/// One layer's keys and values.
pub type Layer = BTreeMap<String, String>;

/// Every settings layer of the mesh.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Settings {
    pub layers: BTreeMap<Scope, Layer>,
}

/// Longest machine, module, mount or kind name, in bytes.
pub const name_bytes_max: usize = 63;
/// Longest settings key, in bytes.
pub const setting_key_bytes_max: usize = 128;

/// Whether `name` is a valid machine, module, mount or kind name: `[a-z0-9-]`, 1 to 63 bytes.
pub fn is_valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= name_bytes_max
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
}

/// Whether `key` is a valid settings key: starts with a letter or digit (so `-key` can mean
/// removal), then letters, digits, `_`, `.` or `-`.
pub fn is_valid_key(key: &str) -> bool {
    let mut bytes = key.bytes();
    let Some(first) = bytes.next() else {
        return false;
    };
    key.len() <= setting_key_bytes_max
        && first.is_ascii_alphanumeric()
        && bytes.all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'))
}

/// Why a scope string does not parse.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "settings scope `{given}` is not valid: {reason}; write `mesh`, `machine/<m>`, `module/<mod>` or `module/<mod>@<m>` with names in [a-z0-9-]"
)]
pub struct ScopeError {
    pub given: String,
    pub reason: &'static str,
}

impl std::str::FromStr for Scope {
    type Err = ScopeError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let fail = |reason| ScopeError {
            given: s.to_string(),
            reason,
        };
        if s == "mesh" {
            return Ok(Scope::Mesh);
        }
        if let Some(m) = s.strip_prefix("machine/") {
            if !is_valid_name(m) {
                return Err(fail("the machine name is not a valid name"));
            }
            return Ok(Scope::Machine(m.to_string()));
        }
        let Some(rest) = s.strip_prefix("module/") else {
            return Err(fail(
                "it does not start with `mesh`, `machine/` or `module/`",
            ));
        };
        match rest.split_once('@') {
            None if is_valid_name(rest) => Ok(Scope::Module(rest.to_string())),
            None => Err(fail("the module name is not a valid name")),
            Some((module, machine)) if is_valid_name(module) && is_valid_name(machine) => {
                Ok(Scope::Placement {
                    module: module.to_string(),
                    machine: machine.to_string(),
                })
            }
            Some(_) => Err(fail("the module or machine name is not a valid name")),
        }
    }
}

impl std::fmt::Display for Scope {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Scope::Mesh => write!(f, "mesh"),
            Scope::Machine(m) => write!(f, "machine/{m}"),
            Scope::Module(m) => write!(f, "module/{m}"),
            Scope::Placement { module, machine } => write!(f, "module/{module}@{machine}"),
        }
    }
}

/// The settings `module` sees on `machine`: mesh < machine/<m> < module/<mod> < module/<mod>@<m>.
pub fn effective(settings: &Settings, module: &str, machine: &str) -> BTreeMap<String, String> {
    let scopes = [
        Scope::Mesh,
        Scope::Machine(machine.to_string()),
        Scope::Module(module.to_string()),
        Scope::Placement {
            module: module.to_string(),
            machine: machine.to_string(),
        },
    ];
    let mut out = BTreeMap::new();
    for scope in &scopes {
        if let Some(layer) = settings.layers.get(scope) {
            for (k, v) in layer {
                out.insert(k.clone(), v.clone());
            }
        }
    }
    out
}

/// Why a settings write is refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SettingsError {
    #[error(
        "this settings scope has no layer; `--replace` and `clear` need one: set keys without `--replace` to create it"
    )]
    NoLayer,
    #[error("removing {keys:?} needs `--replace`: without it a write only adds and changes keys")]
    RemovalWithoutReplace { keys: Vec<String> },
    #[error(
        "setting `{given}` is not `key=value` or `-key`; keys start with a letter or digit and use [A-Za-z0-9_.-]"
    )]
    BadAssignment { given: String },
    #[error(
        "setting `{key}` has an empty value; a setting cannot be empty: to remove it write `-{key}` with `--replace`"
    )]
    EmptyValue { key: String },
    #[error("setting `{key}` is both set and removed in one write; say one or the other")]
    SetAndRemoved { key: String },
}

/// What an operator asked to write to one layer: keys to set and keys to remove (`-key`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Edit {
    pub set: Layer,
    pub remove: BTreeSet<String>,
}

/// Parses `key=value` (set) and `-key` (remove) words. An empty value is refused rather than read
/// as a removal, so a removal is always explicit (docs/decisions/0010-settings-removal.md).
pub fn parse_assignments<S: AsRef<str>>(words: &[S]) -> Result<Edit, SettingsError> {
    let mut edit = Edit::default();
    for word in words {
        let word = word.as_ref();
        let bad = || SettingsError::BadAssignment {
            given: word.to_string(),
        };
        if let Some(key) = word.strip_prefix('-') {
            if !is_valid_key(key) {
                return Err(bad());
            }
            edit.remove.insert(key.to_string());
            continue;
        }
        let (key, value) = word.split_once('=').ok_or_else(bad)?;
        if !is_valid_key(key) {
            return Err(bad());
        }
        if value.is_empty() {
            return Err(SettingsError::EmptyValue {
                key: key.to_string(),
            });
        }
        edit.set.insert(key.to_string(), value.to_string());
    }
    if let Some(key) = edit.set.keys().find(|k| edit.remove.contains(*k)) {
        return Err(SettingsError::SetAndRemoved { key: key.clone() });
    }
    Ok(edit)
}

/// What a write does to one layer, computed before it is written: every key added, changed and
/// removed, the layer to write, and the layer it replaced (kept in `settings_history`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SetOutcome {
    /// key → new value.
    pub added: BTreeMap<String, String>,
    /// key → (old value, new value).
    pub changed: BTreeMap<String, (String, String)>,
    /// key → old value.
    pub removed: BTreeMap<String, String>,
    /// The old layer, when the write replaced or cleared it.
    pub replaced: Option<Layer>,
    /// The layer after the write (empty after `clear`: the scope then has no layer).
    pub layer: Layer,
}

impl SetOutcome {
    /// Whether the write changes nothing.
    pub fn is_noop(&self) -> bool {
        self.added.is_empty() && self.changed.is_empty() && self.removed.is_empty()
    }
}

/// Merges `new` onto `current` (no key can be removed), or with `replace` puts `new` in its place
/// and lists the keys that go. `--replace` needs an existing layer.
pub fn set_layer(
    current: Option<&Layer>,
    new: Layer,
    replace: bool,
) -> Result<SetOutcome, SettingsError> {
    let empty = Layer::new();
    let old = match (current, replace) {
        (None, true) => return Err(SettingsError::NoLayer),
        (None, false) => &empty,
        (Some(old), _) => old,
    };
    let mut out = SetOutcome::default();
    let mut layer = if replace { Layer::new() } else { old.clone() };
    for (k, v) in new {
        match old.get(&k) {
            None => {
                out.added.insert(k.clone(), v.clone());
            }
            Some(was) if *was != v => {
                out.changed.insert(k.clone(), (was.clone(), v.clone()));
            }
            Some(_) => {}
        }
        layer.insert(k, v);
    }
    if replace {
        for (k, v) in old {
            if !layer.contains_key(k) {
                out.removed.insert(k.clone(), v.clone());
            }
        }
        out.replaced = Some(old.clone());
    }
    out.layer = layer;
    Ok(out)
}

/// Applies an operator's [`Edit`]: removals are refused unless `replace`; with `replace` the set
/// keys become the whole layer (a `-key` then only confirms what goes).
pub fn edit_layer(
    current: Option<&Layer>,
    edit: Edit,
    replace: bool,
) -> Result<SetOutcome, SettingsError> {
    if !replace && !edit.remove.is_empty() {
        return Err(SettingsError::RemovalWithoutReplace {
            keys: edit.remove.into_iter().collect(),
        });
    }
    set_layer(current, edit.set, replace)
}

/// Removes every key of the layer at `scope`; the old layer is returned for history.
pub fn clear_layer(current: Option<&Layer>) -> Result<SetOutcome, SettingsError> {
    let old = current.ok_or(SettingsError::NoLayer)?;
    Ok(SetOutcome {
        removed: old.clone(),
        replaced: Some(old.clone()),
        ..SetOutcome::default()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layer(kv: &[(&str, &str)]) -> Layer {
        kv.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn g6_set_without_replace_merges_and_names_every_added_and_changed_key() {
        // G6: settings answer for themselves: each key added and changed is listed.
        let current = layer(&[("a", "1"), ("b", "2")]);
        let out = set_layer(Some(&current), layer(&[("b", "3"), ("c", "4")]), false).expect("set");
        assert_eq!(out.added, layer(&[("c", "4")]));
        assert_eq!(
            out.changed,
            BTreeMap::from([("b".into(), ("2".into(), "3".into()))])
        );
        assert!(out.removed.is_empty() && out.replaced.is_none());
        assert_eq!(out.layer, layer(&[("a", "1"), ("b", "3"), ("c", "4")]));
    }

    #[test]
    fn g6_a_removal_is_refused_unless_replace() {
        // G6: a removal is refused unless `--replace`; with it the removed keys are listed and
        // the replaced layer is returned for history.
        let current = layer(&[("a", "1"), ("b", "2")]);
        let edit = parse_assignments(&["-a", "b=5"]).expect("parse");
        assert_eq!(
            edit_layer(Some(&current), edit.clone(), false),
            Err(SettingsError::RemovalWithoutReplace {
                keys: vec!["a".into()]
            })
        );
        let out = edit_layer(Some(&current), edit, true).expect("replace");
        assert_eq!(out.removed, layer(&[("a", "1")]));
        assert_eq!(out.replaced, Some(current));
        assert_eq!(out.layer, layer(&[("b", "5")]));
    }

    #[test]
    fn g6_replace_or_clear_without_a_layer_is_an_error_and_clear_returns_the_old_layer() {
        // G6: `--replace`/`clear` on a scope with no layer is refused; clear keeps the old layer.
        assert_eq!(
            set_layer(None, layer(&[("a", "1")]), true),
            Err(SettingsError::NoLayer)
        );
        assert_eq!(clear_layer(None), Err(SettingsError::NoLayer));
        let current = layer(&[("a", "1")]);
        let out = clear_layer(Some(&current)).expect("clear");
        assert_eq!(out.removed, current);
        assert_eq!(out.replaced, Some(current));
        assert!(out.layer.is_empty());
        let created = set_layer(None, layer(&[("a", "1")]), false).expect("create");
        assert_eq!(created.added, layer(&[("a", "1")]));
    }

    #[test]
    fn an_empty_value_is_refused_rather_than_read_as_a_removal() {
        // docs/decisions/0010: removal is always explicit (`-key`).
        assert_eq!(
            parse_assignments(&["a="]),
            Err(SettingsError::EmptyValue { key: "a".into() })
        );
        assert!(parse_assignments(&["novalue"]).is_err());
        assert!(parse_assignments(&["-"]).is_err());
        assert!(parse_assignments(&["a=1", "-a"]).is_err());
        let edit = parse_assignments(&["a=x=y"]).expect("parse");
        assert_eq!(edit.set, layer(&[("a", "x=y")]));
    }
}
