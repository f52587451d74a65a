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
/// Largest settings value, in bytes: settings are small knobs; large content belongs in a module's
/// files.
pub const setting_value_bytes_max: usize = 64 * 1024;

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

/// `text` with every control character escaped (`\n`, `\t`, `\u{1b}`), so an error that quotes
/// what an operator wrote stays one line.
pub fn printable(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if c.is_control() {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    out
}

/// Whether a settings key can be stored, whoever wrote it (the mesh file, `settings set`, a
/// committed proposal): no control character, and [`is_valid_key`].
pub fn check_key(key: &str) -> Result<(), SettingsError> {
    if let Some(c) = key.chars().find(|c| c.is_control()) {
        return Err(SettingsError::ControlCharacter {
            key: printable(key),
            part: "key",
            code: u32::from(c),
        });
    }
    if !is_valid_key(key) {
        return Err(SettingsError::BadKey {
            key: printable(key),
        });
    }
    Ok(())
}

/// Whether a settings value can be stored under `key`, whoever wrote it: not empty, at most
/// [`setting_value_bytes_max`] bytes, and one line of printable text (no `char::is_control`).
pub fn check_value(key: &str, value: &str) -> Result<(), SettingsError> {
    if value.is_empty() {
        return Err(SettingsError::EmptyValue {
            key: printable(key),
        });
    }
    if value.len() > setting_value_bytes_max {
        return Err(SettingsError::ValueTooLarge {
            key: printable(key),
            bytes: value.len(),
            max: setting_value_bytes_max,
        });
    }
    if let Some(c) = value.chars().find(|c| c.is_control()) {
        return Err(SettingsError::ControlCharacter {
            key: printable(key),
            part: "value",
            code: u32::from(c),
        });
    }
    Ok(())
}

/// Every key and value of an edit against [`check_key`] and [`check_value`].
pub fn check_edit(edit: &Edit) -> Result<(), SettingsError> {
    for (key, value) in &edit.set {
        check_key(key)?;
        check_value(key, value)?;
    }
    for key in &edit.remove {
        check_key(key)?;
    }
    Ok(())
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
            given: printable(s),
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
        "setting `{key}` has an empty value; a setting cannot be empty: give it a value, or remove the key (`-{key}` with `--replace`)"
    )]
    EmptyValue { key: String },
    #[error("setting `{key}` is both set and removed in one write; say one or the other")]
    SetAndRemoved { key: String },
    #[error(
        "setting `{key}` is given twice in one write; give each key once (the last would silently win)"
    )]
    RepeatedKey { key: String },
    #[error(
        "setting key `{key}` is not valid; start with a letter or digit, then use [A-Za-z0-9_.-], at most {setting_key_bytes_max} bytes"
    )]
    BadKey { key: String },
    #[error(
        "setting `{key}` has a control character (U+{code:04X}) in its {part}; settings are one line of printable text: remove it (multi-line content belongs in a module file)"
    )]
    ControlCharacter {
        key: String,
        part: &'static str,
        code: u32,
    },
    #[error(
        "setting `{key}` has a value of {bytes} bytes, over the limit of {max} bytes (setting_value_bytes_max); put large content in a module file (`files`) and keep the setting small"
    )]
    ValueTooLarge {
        key: String,
        bytes: usize,
        max: usize,
    },
}

/// What an operator asked to write to one layer: keys to set and keys to remove (`-key`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Edit {
    pub set: Layer,
    pub remove: BTreeSet<String>,
}

/// Parses `key=value` (set) and `-key` (remove) words. An empty value is refused rather than read
/// as a removal, so a removal is always explicit (docs/decisions/0010-settings-removal.md); a key
/// given twice is refused rather than letting the last word win.
pub fn parse_assignments<S: AsRef<str>>(words: &[S]) -> Result<Edit, SettingsError> {
    let mut edit = Edit::default();
    for word in words {
        let word = word.as_ref();
        let bad = || SettingsError::BadAssignment {
            given: printable(word),
        };
        let (key, value) = match word.strip_prefix('-') {
            Some(key) => (key, None),
            None => {
                let (key, value) = word.split_once('=').ok_or_else(bad)?;
                (key, Some(value))
            }
        };
        check_key(key).map_err(|e| match e {
            SettingsError::BadKey { .. } => bad(),
            other => other,
        })?;
        let (seen_set, seen_removed) = (edit.set.contains_key(key), edit.remove.contains(key));
        let repeated = match value {
            Some(_) => seen_set,
            None => seen_removed,
        };
        if repeated {
            return Err(SettingsError::RepeatedKey {
                key: key.to_string(),
            });
        }
        if seen_set || seen_removed {
            return Err(SettingsError::SetAndRemoved {
                key: key.to_string(),
            });
        }
        match value {
            Some(value) => {
                check_value(key, value)?;
                edit.set.insert(key.to_string(), value.to_string());
            }
            None => {
                edit.remove.insert(key.to_string());
            }
        }
    }
    Ok(edit)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layer_delta::{LayerDelta, clear_delta, edit_delta};

    fn layer(kv: &[(&str, &str)]) -> Layer {
        kv.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    /// The layer `delta` leaves at a scope that held `current`.
    fn applied(current: Option<&Layer>, delta: &LayerDelta) -> Option<Layer> {
        let mut layers = BTreeMap::new();
        if let Some(l) = current {
            layers.insert(Scope::Mesh, l.clone());
        }
        delta.apply(&mut layers, &Scope::Mesh);
        layers.remove(&Scope::Mesh)
    }

    fn set_only(set: Layer) -> Edit {
        Edit {
            set,
            remove: BTreeSet::new(),
        }
    }

    #[test]
    fn g6_set_without_replace_merges_and_names_every_added_and_changed_key() {
        // G6: settings answer for themselves: each key added and changed is listed.
        let current = layer(&[("a", "1"), ("b", "2")]);
        let edit = set_only(layer(&[("b", "3"), ("c", "4")]));
        let out = edit_delta(Some(&current), &edit, false).expect("set");
        assert_eq!(out.added().collect::<Vec<_>>(), ["c"]);
        assert_eq!(out.changed().collect::<Vec<_>>(), ["b"]);
        assert_eq!(
            out.keys
                .get("b")
                .map(|c| (c.before.as_deref(), c.after.as_deref())),
            Some((Some("2"), Some("3")))
        );
        assert_eq!(out.removed().count(), 0);
        assert_eq!(
            applied(Some(&current), &out),
            Some(layer(&[("a", "1"), ("b", "3"), ("c", "4")]))
        );
    }

    #[test]
    fn g6_a_removal_is_refused_unless_replace() {
        // G6: a removal is refused unless `--replace`; with it the removed keys are listed and
        // the replaced layer comes back from the history entry.
        let current = layer(&[("a", "1"), ("b", "2")]);
        let edit = parse_assignments(&["-a", "b=5"]).expect("parse");
        assert_eq!(
            edit_delta(Some(&current), &edit, false),
            Err(SettingsError::RemovalWithoutReplace {
                keys: vec!["a".into()]
            })
        );
        let out = edit_delta(Some(&current), &edit, true).expect("replace");
        assert_eq!(out.removed().collect::<Vec<_>>(), ["a"]);
        let after = applied(Some(&current), &out);
        assert_eq!(after, Some(layer(&[("b", "5")])));
        assert_eq!(out.undo(after.as_ref()), Ok(Some(current)));
    }

    #[test]
    fn g6_replace_or_clear_without_a_layer_is_an_error_and_clear_keeps_the_old_layer() {
        // G6: `--replace`/`clear` on a scope with no layer is refused; a clear keeps every old
        // key, so the old layer comes back whole.
        assert_eq!(
            edit_delta(None, &set_only(layer(&[("a", "1")])), true),
            Err(SettingsError::NoLayer)
        );
        assert_eq!(clear_delta(None), Err(SettingsError::NoLayer));
        let current = layer(&[("a", "1")]);
        let out = clear_delta(Some(&current)).expect("clear");
        assert_eq!(out.removed().collect::<Vec<_>>(), ["a"]);
        assert_eq!(applied(Some(&current), &out), None);
        assert_eq!(out.undo(None), Ok(Some(current)));
        let created = edit_delta(None, &set_only(layer(&[("a", "1")])), false).expect("create");
        assert_eq!(created.added().collect::<Vec<_>>(), ["a"]);
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

    #[test]
    fn g6_settings_set_with_a_repeated_key_is_refused() {
        // Issue 9: `settings set mesh a=1 a=2` is refused rather than letting the last word win.
        for words in [&["a=1", "a=2"][..], &["a=1", "a=1"], &["-a", "-a"]] {
            assert_eq!(
                parse_assignments(words),
                Err(SettingsError::RepeatedKey { key: "a".into() }),
                "{words:?}"
            );
        }
        assert_eq!(
            parse_assignments(&["a=1", "-a"]),
            Err(SettingsError::SetAndRemoved { key: "a".into() })
        );
    }

    #[test]
    fn control_characters_and_oversized_values_are_refused_by_the_one_setting_rule() {
        // Issue 9: the rule `settings set` parses with is the rule the controller and the state
        // machine apply (edit_delta), so a request that skips meshctl is refused too.
        for (word, code) in [
            ("a=x\ty", 0x09),
            ("a=x\ny", 0x0a),
            ("a=\0", 0),
            ("a=\u{1b}[0m", 0x1b),
        ] {
            let e = parse_assignments(&[word]).expect_err("control character");
            assert_eq!(
                e,
                SettingsError::ControlCharacter {
                    key: "a".into(),
                    part: "value",
                    code
                }
            );
            assert!(!e.to_string().chars().any(char::is_control), "{e}");
        }
        let e = parse_assignments(&["a\tb=1"]).expect_err("control character in a key");
        assert!(
            matches!(e, SettingsError::ControlCharacter { part: "key", .. }),
            "{e:?}"
        );
        assert!(e.to_string().contains("a\\tb"), "{e}");
        let big = format!("a={}", "x".repeat(setting_value_bytes_max + 1));
        let e = parse_assignments(&[big]).expect_err("too large");
        assert!(
            e.to_string().contains(&format!(
                "over the limit of {setting_value_bytes_max} bytes"
            )),
            "{e}"
        );
        let at_limit = format!("a={}", "x".repeat(setting_value_bytes_max));
        assert!(parse_assignments(&[at_limit]).is_ok());
        let edit = Edit {
            set: layer(&[("a", "x\ny")]),
            remove: BTreeSet::new(),
        };
        assert!(matches!(
            edit_delta(None, &edit, false),
            Err(SettingsError::ControlCharacter { part: "value", .. })
        ));
        let edit = Edit {
            set: layer(&[("", "v")]),
            remove: BTreeSet::new(),
        };
        assert!(matches!(
            edit_delta(None, &edit, false),
            Err(SettingsError::BadKey { .. })
        ));
    }
}
