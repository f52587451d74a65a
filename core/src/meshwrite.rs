//! A [`Mesh`] back to `mesh.toml` text (issue 25 item 1): what `meshctl model show` prints, so a
//! stored model can be read back, kept in a repository and applied again. The one promise is the
//! round trip: [`parse_mesh`](super::meshfile::parse_mesh) of the text gives the same `Mesh`, so the
//! same encoded bytes and the same blake3 digest `apply` names for a model (decision 0302).
//!
//! Pure: a `Mesh` in, a `String` out. Layout follows `examples/mesh.toml`: machines, then one table
//! per module with inline values, then one table per settings layer. Settings values are written
//! as strings (the store keeps every value as the string the file's number or boolean became).

use std::fmt::Write as _;

use super::model::{Mesh, Module, Probe};

/// The mesh as `mesh.toml` text that parses back to exactly `mesh`.
pub fn write_mesh(mesh: &Mesh) -> String {
    // `write!` into a `String` cannot fail (its `fmt::Write` always answers `Ok`), so the
    // results below are dropped with `let _`.
    let mut out = String::new();
    for (name, machine) in &mesh.machines {
        let _ = writeln!(out, "[machines.{}]", key(name));
        let _ = writeln!(out, "address = {}", inline_string(&machine.address));
        out.push('\n');
    }
    for (name, module) in mesh.modules.iter() {
        write_module(&mut out, name, module);
        out.push('\n');
    }
    for (scope, layer) in &mesh.settings.layers {
        let _ = writeln!(out, "[settings.{}]", key(&scope.to_string()));
        for (k, v) in layer {
            let _ = writeln!(out, "{} = {}", key(k), inline_string(v));
        }
        out.push('\n');
    }
    // One trailing newline, not a blank line, at the end of a non-empty file.
    while out.ends_with("\n\n") {
        out.pop();
    }
    out
}

fn write_module(out: &mut String, name: &str, m: &Module) {
    let _ = writeln!(out, "[modules.{}]", key(name));
    let _ = writeln!(out, "machine = {}", inline_string(&m.machine));
    let _ = writeln!(out, "command = {}", inline_string(&m.command));
    if !m.args.is_empty() {
        let _ = writeln!(out, "args = {}", array(&m.args, true));
    }
    if !m.env.is_empty() {
        let pairs: Vec<String> = m
            .env
            .iter()
            .map(|(k, v)| format!("{} = {}", key(k), inline_string(v)))
            .collect();
        let _ = writeln!(out, "env = {{ {} }}", pairs.join(", "));
    }
    if !m.files.is_empty() {
        let pairs: Vec<String> = m
            .files
            .iter()
            .map(|(k, v)| format!("{} = {}", key(k), inline_string(v)))
            .collect();
        let _ = writeln!(out, "files = {{ {} }}", pairs.join(", "));
    }
    if !m.mounts.is_empty() {
        let mounts: Vec<String> = m
            .mounts
            .iter()
            .map(|mount| {
                format!(
                    "{{ name = {}, host_dir = {}, target = {} }}",
                    inline_string(&mount.name),
                    inline_string(&mount.host_dir),
                    inline_string(&mount.target)
                )
            })
            .collect();
        let _ = writeln!(out, "mounts = [{}]", mounts.join(", "));
    }
    if let Some(probe) = &m.ready {
        let _ = writeln!(out, "ready = {}", probe_table(probe));
    }
    if !m.after.is_empty() {
        let _ = writeln!(out, "after = {}", array(&m.after, false));
    }
    if !m.provides.is_empty() {
        let provides: Vec<String> = m
            .provides
            .iter()
            .map(|p| match p.port {
                Some(port) => format!("{{ kind = {}, port = {port} }}", inline_string(&p.kind)),
                None => format!("{{ kind = {} }}", inline_string(&p.kind)),
            })
            .collect();
        let _ = writeln!(out, "provides = [{}]", provides.join(", "));
    }
    if !m.consumes.is_empty() {
        let needs: Vec<String> = m
            .consumes
            .iter()
            .map(|n| {
                format!(
                    "{{ kind = {}, from = {} }}",
                    inline_string(&n.kind),
                    inline_string(&n.from)
                )
            })
            .collect();
        let _ = writeln!(out, "consumes = [{}]", needs.join(", "));
    }
}

/// A probe as an inline table, its timeout always written (the parser's default is not assumed).
fn probe_table(probe: &Probe) -> String {
    match probe {
        Probe::Tcp { addr, timeout_ms } => {
            format!(
                "{{ tcp = {}, timeout_ms = {timeout_ms} }}",
                inline_string(addr)
            )
        }
        Probe::File { path, timeout_ms } => {
            format!(
                "{{ file = {}, timeout_ms = {timeout_ms} }}",
                inline_string(path)
            )
        }
        Probe::Command {
            command,
            args,
            timeout_ms,
        } => {
            let args = if args.is_empty() {
                String::new()
            } else {
                format!(", args = {}", array(args, false))
            };
            format!(
                "{{ command = {}{args}, timeout_ms = {timeout_ms} }}",
                inline_string(command)
            )
        }
    }
}

/// An array of strings; with `multiline`, a string with line breaks is written as a `'''`
/// literal when it can be one (as the example writes its perl scripts), else escaped.
fn array(items: &[String], multiline: bool) -> String {
    let items: Vec<String> = items
        .iter()
        .map(|s| match multiline {
            true => string(s),
            false => inline_string(s),
        })
        .collect();
    format!("[{}]", items.join(", "))
}

/// A bare key when TOML allows one, else a quoted one.
fn key(k: &str) -> String {
    let bare = !k.is_empty()
        && k.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
    if bare {
        k.to_string()
    } else {
        inline_string(k)
    }
}

/// A string value where a multi-line literal reads best: one with a line break and nothing a
/// literal cannot hold (`'''`, a carriage return or other control character, a trailing `'`).
fn string(s: &str) -> String {
    let literal_ok = s.contains('\n')
        && !s.contains("'''")
        && !s.ends_with('\'')
        && s.chars().all(|c| c == '\n' || c == '\t' || !c.is_control());
    if literal_ok {
        // The line break right after the opening quotes is not part of the value.
        format!("'''\n{s}'''")
    } else {
        inline_string(s)
    }
}

/// A one-line basic string: quotes, backslashes and every control character escaped.
fn inline_string(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            '\r' => out.push_str("\\r"),
            c if c.is_control() => {
                let _ = write!(out, "\\u{:04X}", u32::from(c));
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

#[cfg(test)]
#[path = "meshwrite_tests.rs"]
mod tests;
