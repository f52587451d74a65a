//! The differences between two models, machine by machine and module by module, for
//! `meshctl diff -f mesh.toml` (issue 25 item 1): what an apply of the file would store, shown
//! before anything is stored. Settings are compared apart: an apply never writes them (they change
//! with `meshctl settings`, which keeps history), so they are notes, not differences.

use super::model::{Mesh, Module, Probe};
use super::settings::Scope;

/// One changed item: `subject` is `machine ace` or `module web`; `item` is `machine` (the whole
/// entry, added or removed), a field (`address`, `command`, `args`), or a keyed part
/// (`env DB_NAME`, `files conf/a.conf`, `mount data`). `None` on the side where it is absent.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DiffLine {
    pub subject: String,
    pub item: String,
    pub was: Option<String>,
    pub now: Option<String>,
}

/// What differs between the stored model and a file.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ModelDiff {
    /// Machines and modules: what an apply would change. Empty: the apply stores nothing.
    pub lines: Vec<DiffLine>,
    /// Settings scopes whose layer in the file differs from the store's; an apply leaves them.
    pub settings_differ: Vec<Scope>,
}

impl ModelDiff {
    pub fn is_empty(&self) -> bool {
        self.lines.is_empty()
    }
}

/// `stored` against `file`: every machine and module added, removed or changed, in name order.
pub fn diff_models(stored: &Mesh, file: &Mesh) -> ModelDiff {
    let mut lines = Vec::new();
    let names = union(stored.machines.keys(), file.machines.keys());
    for name in names {
        let subject = format!("machine {name}");
        match (stored.machines.get(&name), file.machines.get(&name)) {
            (Some(a), Some(b)) => {
                field(&mut lines, &subject, "address", &a.address, &b.address);
            }
            (was, now) => lines.push(DiffLine {
                subject,
                item: "machine".into(),
                was: was.map(|m| format!("address {:?}", m.address)),
                now: now.map(|m| format!("address {:?}", m.address)),
            }),
        }
    }
    let names = union(stored.modules.keys(), file.modules.keys());
    for name in names {
        let subject = format!("module {name}");
        match (stored.modules.get(&name), file.modules.get(&name)) {
            (Some(a), Some(b)) => module_lines(&mut lines, &subject, a, b),
            (was, now) => lines.push(DiffLine {
                subject,
                item: "module".into(),
                was: was.map(|m| format!("on {}", m.machine)),
                now: now.map(|m| format!("on {}", m.machine)),
            }),
        }
    }
    let scopes = union(stored.settings.layers.keys(), file.settings.layers.keys());
    let settings_differ = scopes
        .into_iter()
        .filter(|s| stored.settings.layers.get(s) != file.settings.layers.get(s))
        .collect();
    ModelDiff {
        lines,
        settings_differ,
    }
}

fn union<'a, T: Ord + Clone + 'a>(
    a: impl Iterator<Item = &'a T>,
    b: impl Iterator<Item = &'a T>,
) -> Vec<T> {
    let mut all: Vec<T> = a.chain(b).cloned().collect();
    all.sort();
    all.dedup();
    all
}

fn field(lines: &mut Vec<DiffLine>, subject: &str, item: &str, was: &str, now: &str) {
    shown(lines, subject, item, &was, &now);
}

fn shown<T: std::fmt::Debug + PartialEq>(
    lines: &mut Vec<DiffLine>,
    subject: &str,
    item: &str,
    was: &T,
    now: &T,
) {
    if was != now {
        lines.push(DiffLine {
            subject: subject.to_string(),
            item: item.to_string(),
            was: Some(format!("{was:?}")),
            now: Some(format!("{now:?}")),
        });
    }
}

/// A list rendered in words (`amqp on port 5672, http`), `none` when empty.
fn listed(lines: &mut Vec<DiffLine>, subject: &str, item: &str, was: String, now: String) {
    if was != now {
        let words = |s: String| if s.is_empty() { "none".to_string() } else { s };
        lines.push(DiffLine {
            subject: subject.to_string(),
            item: item.to_string(),
            was: Some(words(was)),
            now: Some(words(now)),
        });
    }
}

/// A keyed map's entries added, removed or changed; `value` renders one side.
fn keyed(
    lines: &mut Vec<DiffLine>,
    subject: &str,
    item: &str,
    was: &super::flat::FlatMap<String, String>,
    now: &super::flat::FlatMap<String, String>,
    value: fn(&str) -> String,
) {
    let keys = union(was.keys(), now.keys());
    for k in keys {
        let (a, b) = (was.get(&k), now.get(&k));
        if a != b {
            lines.push(DiffLine {
                subject: subject.to_string(),
                item: format!("{item} {k}"),
                was: a.map(|v| value(v)),
                now: b.map(|v| value(v)),
            });
        }
    }
}

fn module_lines(lines: &mut Vec<DiffLine>, subject: &str, a: &Module, b: &Module) {
    field(lines, subject, "machine", &a.machine, &b.machine);
    field(lines, subject, "command", &a.command, &b.command);
    shown(lines, subject, "args", &a.args, &b.args);
    keyed(lines, subject, "env", &a.env, &b.env, |v| format!("{v:?}"));
    // File contents can be long: their size and a short digest say whether they changed.
    keyed(lines, subject, "files", &a.files, &b.files, |v| {
        let hash = blake3::hash(v.as_bytes()).to_hex();
        format!("{} bytes, blake3 {}", v.len(), &hash.as_str()[..16])
    });
    let mounts = union(
        a.mounts.iter().map(|m| &m.name),
        b.mounts.iter().map(|m| &m.name),
    );
    for name in mounts {
        let of = |m: &Module| {
            m.mounts
                .iter()
                .find(|x| x.name == name)
                .map(|x| format!("{} -> {}", x.host_dir, x.target))
        };
        let (was, now) = (of(a), of(b));
        if was != now {
            lines.push(DiffLine {
                subject: subject.to_string(),
                item: format!("mount {name}"),
                was,
                now,
            });
        }
    }
    if a.ready != b.ready {
        lines.push(DiffLine {
            subject: subject.to_string(),
            item: "ready".into(),
            was: a.ready.as_deref().map(probe),
            now: b.ready.as_deref().map(probe),
        });
    }
    shown(lines, subject, "after", &a.after, &b.after);
    let provides = |m: &Module| {
        let each = m.provides.iter().map(|p| match p.port {
            Some(port) => format!("{} on port {port}", p.kind),
            None => p.kind.clone(),
        });
        each.collect::<Vec<_>>().join(", ")
    };
    let consumes = |m: &Module| {
        let each = m
            .consumes
            .iter()
            .map(|n| format!("{} from {}", n.kind, n.from));
        each.collect::<Vec<_>>().join(", ")
    };
    listed(lines, subject, "provides", provides(a), provides(b));
    listed(lines, subject, "consumes", consumes(a), consumes(b));
    // Anything else (the order of mounts) still counts: the apply would store it.
    let seen = lines.iter().any(|l| l.subject == subject);
    if !seen && a != b {
        lines.push(DiffLine {
            subject: subject.to_string(),
            item: "mounts".into(),
            was: Some(format!("{:?}", a.mounts)),
            now: Some(format!("{:?}", b.mounts)),
        });
    }
}

fn probe(p: &Probe) -> String {
    match p {
        Probe::Tcp { addr, timeout_ms } => format!("tcp {addr:?} within {timeout_ms} ms"),
        Probe::File { path, timeout_ms } => format!("file {path:?} within {timeout_ms} ms"),
        Probe::Command {
            command,
            args,
            timeout_ms,
        } => format!("command {command:?} {args:?} within {timeout_ms} ms"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::meshfile::parse_mesh;

    const example: &str = include_str!("../../examples/mesh.toml");

    #[test]
    fn a_model_against_itself_has_no_differences_and_a_move_is_one_line() {
        // Issue 25 item 1: `diff` exits 0 on no differences and 1 on any; a module moved to
        // another machine shows as its `machine` field changing.
        let stored = parse_mesh("mesh.toml", example).expect("parses");
        assert!(diff_models(&stored, &stored).is_empty());
        let moved = example.replace(
            "[modules.worker]\nmachine = \"shanks\"",
            "[modules.worker]\nmachine = \"g14\"",
        );
        let file = parse_mesh("mesh.toml", &moved).expect("parses");
        let d = diff_models(&stored, &file);
        assert_eq!(
            d.lines,
            vec![DiffLine {
                subject: "module worker".into(),
                item: "machine".into(),
                was: Some("\"shanks\"".into()),
                now: Some("\"g14\"".into()),
            }]
        );
        assert!(d.settings_differ.is_empty());
    }

    #[test]
    fn provides_and_consumes_read_as_words_not_as_code() {
        // Issue 25 item 1: `diff` is read by operators; a provided port that moved reads
        // `amqp on port 47100 => amqp on port 5672`, not a Rust value.
        let stored = parse_mesh("mesh.toml", example).expect("parses");
        let moved = example.replace(
            "provides = [{ kind = \"amqp\", port = 47100 }]",
            "provides = [{ kind = \"amqp\", port = 5672 }]",
        );
        assert_ne!(moved, example, "the example provides amqp on 47100");
        let file = parse_mesh("mesh.toml", &moved).expect("parses");
        let line = diff_models(&stored, &file)
            .lines
            .into_iter()
            .find(|l| l.item == "provides")
            .expect("a provides line");
        assert_eq!(line.was.as_deref(), Some("amqp on port 47100"));
        assert_eq!(line.now.as_deref(), Some("amqp on port 5672"));
    }
}
