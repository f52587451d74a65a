//! The mesh file (`mesh.toml`) becomes a [`Mesh`] that cannot be invalid: every error in the file is
//! reported at once, each as `file:line:col: field: what is wrong; what to do`. Never panics.
//!
//! Format (see `examples/mesh.toml`):
//!
//! ```toml
//! [machines.ace]
//! address = "127.0.0.1"                 # where other machines reach ace's provided ports
//!
//! [modules.broker]
//! machine = "ace"                       # a machine declared above
//! command = "perl"
//! args = ["-e", "..."]                  # optional
//! env = { LOG = "1" }                   # optional; keys [A-Za-z_][A-Za-z0-9_]*
//! files = { "conf/broker.conf" = "listen 47100\n" }  # relative paths, no `..`
//! mounts = [{ name = "data", host_dir = "/srv/broker/data", target = "data" }]
//! ready = { tcp = "127.0.0.1:47100", timeout_ms = 2000 }  # or { file = "ready" }
//!                                       # or { command = "true", args = [] }; timeout optional
//! after = ["db"]                        # modules on the same machine, no cycles
//! provides = [{ kind = "amqp", port = 47100 }]          # port optional
//! consumes = [{ kind = "amqp", from = "broker" }]       # `from` names a module providing `kind`
//!
//! [settings.mesh]                       # also "machine/<m>", "module/<mod>", "module/<mod>@<m>"
//! log_level = "info"                    # strings, integers, floats or booleans
//! ```
//!
//! Machine, module, mount and kind names are `[a-z0-9-]`, 1 to 63 bytes. The rules that hold for a
//! model wherever it comes from (no two modules of a machine on one listen address, scopes that name
//! what the file declares, one-line settings within `setting_value_bytes_max`, the encoded model
//! within `model_bytes_max`) are [`validate`]'s, reported here at the line and column they were
//! written.

use std::collections::{BTreeMap, BTreeSet};
use std::ops::Range;

use toml::Spanned;
use toml::de::{DeTable, DeValue};

use super::flat::FlatMap;
use super::model::{Machine, Mesh, Module, Mount, Need, Probe, Provide};
use super::settings::{Layer, Scope, is_valid_name, printable};
use super::validate::{Subject, validate};

/// Largest mesh file read, in bytes: room for a model of `model_bytes_max` and its TOML.
pub const mesh_file_bytes_max: usize = 160 * 1024 * 1024;
/// Most errors reported for one file; the rest are counted.
pub const file_errors_max: usize = 200;
/// Longest list in a module (args, mounts, after, provides, consumes), in items.
pub const list_items_max: usize = 1024;
/// A readiness probe's timeout when the file gives none, and the largest it may give.
pub const probe_timeout_ms_default: u64 = 5_000;
pub const probe_timeout_ms_max: u64 = 600_000;

/// One problem in a mesh file, at a 1-based line and column (in characters).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FileError {
    pub file: String,
    pub line: usize,
    pub col: usize,
    pub field: String,
    pub problem: String,
    pub fix: String,
}

/// One line whatever the file held: control characters in a quoted name are shown escaped. An
/// empty `fix` means `problem` already says what to do.
impl std::fmt::Display for FileError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}:{}:{}: {}: {}",
            self.file,
            self.line,
            self.col,
            printable(&self.field),
            printable(&self.problem)
        )?;
        if !self.fix.is_empty() {
            write!(f, "; {}", printable(&self.fix))?;
        }
        Ok(())
    }
}

/// Every problem found in a mesh file, in file order; `more` counts those past [`file_errors_max`].
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub struct MeshFileError {
    pub errors: Vec<FileError>,
    pub more: usize,
}

impl std::fmt::Display for MeshFileError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for (i, e) in self.errors.iter().enumerate() {
            if i > 0 {
                writeln!(f)?;
            }
            write!(f, "{e}")?;
        }
        if self.more > 0 {
            write!(f, "\n... and {} more errors", self.more)?;
        }
        Ok(())
    }
}

/// Parses and validates a mesh file. `file` names it in errors.
pub fn parse_mesh(file: &str, text: &str) -> Result<Mesh, MeshFileError> {
    let mut r = Reader::new(file, text);
    if text.len() > mesh_file_bytes_max {
        r.err(
            0..0,
            "file",
            format!(
                "{} bytes is over the limit of {mesh_file_bytes_max}",
                text.len()
            ),
            "split the mesh or raise mesh_file_bytes_max",
        );
        return Err(r.finish());
    }
    let (root, syntax) = DeTable::parse_recoverable(text);
    if !syntax.is_empty() {
        for e in syntax {
            let span = e.span().unwrap_or(0..0);
            r.err(
                span,
                "toml",
                e.message().trim().to_string(),
                "fix the TOML syntax",
            );
        }
        return Err(r.finish());
    }
    let mesh = r.root(&root);
    if r.errors.is_empty() {
        Ok(mesh)
    } else {
        Err(r.finish())
    }
}

type Val<'i> = Spanned<DeValue<'i>>;

/// Where cross-referencing fields sit, so the checks after parsing can point at them.
#[derive(Default)]
struct Spans {
    module_machine: BTreeMap<String, Range<usize>>,
    /// (module, index in `consumes`) → the entry.
    needs: BTreeMap<(String, usize), Range<usize>>,
    /// (module, index in `after`) → the name.
    after: BTreeMap<(String, usize), Range<usize>>,
    /// What [`validate`] names → the field as written and where.
    subjects: BTreeMap<Subject, (String, Range<usize>)>,
}

struct Reader<'t> {
    file: &'t str,
    text: &'t str,
    line_starts: Vec<usize>,
    errors: Vec<FileError>,
    more: usize,
    spans: Spans,
}

impl<'t> Reader<'t> {
    fn new(file: &'t str, text: &'t str) -> Reader<'t> {
        let mut line_starts = vec![0];
        for (i, b) in text.bytes().enumerate() {
            if b == b'\n' {
                line_starts.push(i + 1);
            }
        }
        Reader {
            file,
            text,
            line_starts,
            errors: Vec::new(),
            more: 0,
            spans: Spans::default(),
        }
    }

    fn finish(mut self) -> MeshFileError {
        self.errors.sort_by_key(|e| (e.line, e.col));
        MeshFileError {
            errors: self.errors,
            more: self.more,
        }
    }

    /// 1-based line and column (in characters) of a byte offset.
    fn position(&self, offset: usize) -> (usize, usize) {
        let offset = offset.min(self.text.len());
        let line = self.line_starts.partition_point(|s| *s <= offset).max(1);
        let start = self.line_starts.get(line - 1).copied().unwrap_or(0);
        let col = match self.text.get(start..offset) {
            Some(s) => s.chars().count(),
            None => offset - start,
        };
        (line, col + 1)
    }

    fn err(
        &mut self,
        span: Range<usize>,
        field: impl Into<String>,
        problem: impl Into<String>,
        fix: impl Into<String>,
    ) {
        if self.errors.len() >= file_errors_max {
            self.more += 1;
            return;
        }
        let (line, col) = self.position(span.start);
        self.errors.push(FileError {
            file: self.file.to_string(),
            line,
            col,
            field: field.into(),
            problem: problem.into(),
            fix: fix.into(),
        });
    }

    // ------------------------------------------------------------ typed reads

    fn table<'a, 'i>(&mut self, v: &'a Val<'i>, field: &str) -> Option<&'a DeTable<'i>> {
        if let DeValue::Table(t) = v.get_ref() {
            return Some(t);
        }
        let got = v.get_ref().type_str();
        self.err(
            v.span(),
            field,
            format!("expected a table, found {got}"),
            "write it as a table",
        );
        None
    }

    fn string(&mut self, v: &Val<'_>, field: &str) -> Option<String> {
        if let DeValue::String(s) = v.get_ref() {
            if s.contains('\0') {
                self.err(v.span(), field, "contains a NUL character", "remove it");
                return None;
            }
            return Some(s.to_string());
        }
        let got = v.get_ref().type_str();
        self.err(
            v.span(),
            field,
            format!("expected a string, found {got}"),
            "quote it",
        );
        None
    }

    fn integer(&mut self, v: &Val<'_>, field: &str, min: u64, max: u64) -> Option<u64> {
        let parsed = match v.get_ref() {
            DeValue::Integer(i) => u64::from_str_radix(i.as_str(), i.radix()).ok(),
            other => {
                let got = other.type_str();
                self.err(
                    v.span(),
                    field,
                    format!("expected an integer, found {got}"),
                    "write a number",
                );
                return None;
            }
        };
        match parsed {
            Some(n) if n >= min && n <= max => Some(n),
            _ => {
                self.err(
                    v.span(),
                    field,
                    "is out of range",
                    format!("use {min} to {max}"),
                );
                None
            }
        }
    }

    fn array<'a, 'i>(&mut self, v: &'a Val<'i>, field: &str) -> &'a [Val<'i>] {
        let DeValue::Array(items) = v.get_ref() else {
            let got = v.get_ref().type_str();
            self.err(
                v.span(),
                field,
                format!("expected an array, found {got}"),
                "write it as [ ... ]",
            );
            return &[];
        };
        if items.len() > list_items_max {
            self.err(
                v.span(),
                field,
                format!(
                    "has {} items, over the limit of {list_items_max}",
                    items.len()
                ),
                "shorten it",
            );
            return &[];
        }
        items
    }

    /// An array of strings, each with its span.
    fn strings(&mut self, v: &Val<'_>, field: &str) -> Vec<(String, Range<usize>)> {
        let mut out = Vec::new();
        for (i, item) in self.array(v, field).iter().enumerate() {
            if let Some(s) = self.string(item, &format!("{field}[{i}]")) {
                out.push((s, item.span()));
            }
        }
        out
    }

    /// A table of strings: the keys are checked by `key_ok` (with `what` naming the rule).
    fn string_map(
        &mut self,
        v: &Val<'_>,
        field: &str,
        key_ok: fn(&str) -> bool,
        rule: &str,
    ) -> BTreeMap<String, String> {
        let mut out = BTreeMap::new();
        let Some(t) = self.table(v, field) else {
            return out;
        };
        for (k, item) in t.iter() {
            let sub = format!("{field}.{}", k.get_ref());
            if !key_ok(k.get_ref()) {
                self.err(k.span(), &sub, "is not a valid key", rule.to_string());
                continue;
            }
            if let Some(s) = self.string(item, &sub) {
                out.insert(k.get_ref().to_string(), s);
            }
        }
        out
    }

    /// Reports every key of `t` not in `allowed`.
    fn known_keys(&mut self, t: &DeTable<'_>, field: &str, allowed: &[&str]) {
        for k in t.keys() {
            if !allowed.contains(&k.get_ref().as_ref()) {
                self.err(
                    k.span(),
                    format!("{field}.{}", k.get_ref()),
                    "is not a known key",
                    format!("use one of: {}", allowed.join(", ")),
                );
            }
        }
    }

    fn name(&mut self, name: &str, span: Range<usize>, field: &str) -> bool {
        if is_valid_name(name) {
            return true;
        }
        self.err(
            span,
            field,
            format!("`{name}` is not a valid name"),
            "use 1 to 63 characters of [a-z0-9-]",
        );
        false
    }

    fn required<'a, 'i>(
        &mut self,
        t: &'a DeTable<'i>,
        key: &str,
        at: Range<usize>,
        field: &str,
    ) -> Option<&'a Val<'i>> {
        let v = t.get(key);
        if v.is_none() {
            self.err(
                at,
                format!("{field}.{key}"),
                "is missing",
                format!("add `{key} = ...`"),
            );
        }
        v
    }
}

// ---------------------------------------------------------------- the document

impl Reader<'_> {
    fn root(&mut self, root: &Spanned<DeTable<'_>>) -> Mesh {
        let mut mesh = Mesh::default();
        let t = root.get_ref();
        self.known_keys(t, "file", &["machines", "modules", "settings"]);
        if let Some(v) = t.get("machines") {
            mesh.machines = self.machines(v);
        }
        if let Some(v) = t.get("modules") {
            mesh.modules = self.modules(v).into_iter().collect();
        }
        if let Some(v) = t.get("settings") {
            mesh.settings.layers = self.settings(v);
        }
        self.cross_check(&mesh);
        mesh
    }

    fn machines(&mut self, v: &Val<'_>) -> BTreeMap<String, Machine> {
        let mut out = BTreeMap::new();
        let Some(t) = self.table(v, "machines") else {
            return out;
        };
        for (k, item) in t.iter() {
            let name = k.get_ref().to_string();
            let field = format!("machines.{name}");
            let valid = self.name(&name, k.span(), &field);
            let Some(body) = self.table(item, &field) else {
                continue;
            };
            self.known_keys(body, &field, &["address"]);
            let address = self
                .required(body, "address", k.span(), &field)
                .and_then(|a| self.string(a, &format!("{field}.address")));
            if let (true, Some(address)) = (valid, address) {
                out.insert(name.clone(), Machine { name, address });
            }
        }
        out
    }

    fn modules(&mut self, v: &Val<'_>) -> BTreeMap<String, Module> {
        let mut out = BTreeMap::new();
        let Some(t) = self.table(v, "modules") else {
            return out;
        };
        for (k, item) in t.iter() {
            let name = k.get_ref().to_string();
            let field = format!("modules.{name}");
            let valid = self.name(&name, k.span(), &field);
            let Some(body) = self.table(item, &field) else {
                continue;
            };
            if let (true, Some(module)) = (valid, self.module(&name, k.span(), body)) {
                out.insert(name, module);
            }
        }
        out
    }

    fn module(&mut self, name: &str, at: Range<usize>, t: &DeTable<'_>) -> Option<Module> {
        let field = format!("modules.{name}");
        let subject = Subject::Module {
            module: name.to_string(),
        };
        self.spans
            .subjects
            .insert(subject, (field.clone(), at.clone()));
        self.known_keys(
            t,
            &field,
            &[
                "machine", "command", "args", "env", "files", "mounts", "ready", "after",
                "provides", "consumes",
            ],
        );
        let machine = self.required(t, "machine", at.clone(), &field);
        let machine = machine.and_then(|v| {
            self.spans.module_machine.insert(name.to_string(), v.span());
            self.string(v, &format!("{field}.machine"))
        });
        let command = self.required(t, "command", at.clone(), &field);
        let command = command.and_then(|v| self.command(v, &format!("{field}.command")));
        let mut module = Module {
            name: name.to_string(),
            // allow(empty-on-error): reported above; the parse fails
            machine: machine.unwrap_or_default(),
            // allow(empty-on-error): reported above; the parse fails
            command: command.unwrap_or_default(),
            args: Vec::new(),
            env: FlatMap::new(),
            files: FlatMap::new(),
            mounts: Vec::new(),
            ready: None,
            after: Vec::new(),
            provides: Vec::new(),
            consumes: Vec::new(),
        };
        self.module_optional(&mut module, t, &field);
        Some(module)
    }

    fn module_optional(&mut self, m: &mut Module, t: &DeTable<'_>, field: &str) {
        let f = |key: &str| format!("{field}.{key}");
        if let Some(v) = t.get("args") {
            m.args = self
                .strings(v, &f("args"))
                .into_iter()
                .map(|(s, _)| s)
                .collect();
        }
        if let Some(v) = t.get("env") {
            m.env = self
                .string_map(v, &f("env"), is_env_name, "use [A-Za-z_][A-Za-z0-9_]*")
                .into_iter()
                .collect();
        }
        if let Some(v) = t.get("files") {
            m.files = self.files(v, &f("files")).into_iter().collect();
        }
        if let Some(v) = t.get("mounts") {
            m.mounts = self.mounts(v, &f("mounts"));
        }
        if let Some(v) = t.get("ready") {
            m.ready = self.probe(&m.name, v, &f("ready")).map(Box::new);
        }
        if let Some(v) = t.get("after") {
            for (i, (name, span)) in self.strings(v, &f("after")).into_iter().enumerate() {
                self.spans.after.insert((m.name.clone(), i), span);
                m.after.push(name);
            }
        }
        if let Some(v) = t.get("provides") {
            m.provides = self.provides(&m.name, v, &f("provides"));
        }
        if let Some(v) = t.get("consumes") {
            m.consumes = self.consumes(&m.name, v, &f("consumes"));
        }
    }

    fn command(&mut self, v: &Val<'_>, field: &str) -> Option<String> {
        let s = self.string(v, field)?;
        if s.trim().is_empty() {
            self.err(v.span(), field, "is empty", "name the program to run");
            return None;
        }
        Some(s)
    }

    fn files(&mut self, v: &Val<'_>, field: &str) -> BTreeMap<String, String> {
        let files = self.string_map(v, field, |_| true, "");
        let Some(t) = self.table(v, field) else {
            return files;
        };
        for k in t.keys() {
            if !is_safe_relative(k.get_ref()) {
                self.err(
                    k.span(),
                    format!("{field}.\"{}\"", k.get_ref()),
                    "is not a relative path inside the module directory",
                    "use a relative path without `..`, `.` or empty parts",
                );
            }
        }
        files
            .into_iter()
            .filter(|(k, _)| is_safe_relative(k))
            .collect()
    }

    fn mounts(&mut self, v: &Val<'_>, field: &str) -> Vec<Mount> {
        let mut out: Vec<Mount> = Vec::new();
        let mut targets = BTreeSet::new();
        for (i, item) in self.array(v, field).iter().enumerate() {
            let f = format!("{field}[{i}]");
            let Some(t) = self.table(item, &f) else {
                continue;
            };
            self.known_keys(t, &f, &["name", "host_dir", "target"]);
            let mut get = |key: &str| {
                let v = self.required(t, key, item.span(), &f)?;
                Some((self.string(v, &format!("{f}.{key}"))?, v.span()))
            };
            let (Some(name), Some(dir), Some(target)) =
                (get("name"), get("host_dir"), get("target"))
            else {
                continue;
            };
            let mut ok = self.name(&name.0, name.1.clone(), &format!("{f}.name"));
            if !is_safe_absolute(&dir.0) {
                self.err(
                    dir.1,
                    format!("{f}.host_dir"),
                    format!("`{}` is not an absolute path without `..`", dir.0),
                    "give a full path like /srv/<module>/<mount>",
                );
                ok = false;
            }
            if !is_safe_relative(&target.0) {
                self.err(
                    target.1.clone(),
                    format!("{f}.target"),
                    format!(
                        "`{}` is not a relative path inside the module directory",
                        target.0
                    ),
                    "use a relative path without `..`",
                );
                ok = false;
            }
            if out.iter().any(|m| m.name == name.0) {
                self.err(
                    name.1,
                    format!("{f}.name"),
                    format!("mount `{}` is declared twice", name.0),
                    "give each mount its own name",
                );
                ok = false;
            }
            if !targets.insert(target.0.clone()) {
                self.err(
                    target.1,
                    format!("{f}.target"),
                    format!("target `{}` is used by two mounts", target.0),
                    "give each mount its own target",
                );
                ok = false;
            }
            if ok {
                out.push(Mount {
                    name: name.0,
                    host_dir: dir.0,
                    target: target.0,
                });
            }
        }
        out
    }

    fn probe(&mut self, module: &str, v: &Val<'_>, field: &str) -> Option<Probe> {
        let t = self.table(v, field)?;
        self.known_keys(t, field, &["tcp", "file", "command", "args", "timeout_ms"]);
        let timeout_ms = match t.get("timeout_ms") {
            Some(n) => self.integer(n, &format!("{field}.timeout_ms"), 1, probe_timeout_ms_max)?,
            None => probe_timeout_ms_default,
        };
        let kinds: Vec<&str> = ["tcp", "file", "command"]
            .into_iter()
            .filter(|k| t.contains_key(*k))
            .collect();
        if kinds.len() != 1 {
            self.err(
                v.span(),
                field,
                "needs exactly one of `tcp`, `file` or `command`",
                "keep one probe",
            );
            return None;
        }
        if t.contains_key("args") && kinds != ["command"] {
            self.err(
                v.span(),
                format!("{field}.args"),
                "only a `command` probe takes args",
                "remove `args`",
            );
        }
        let at = t.get(kinds[0])?;
        let f = format!("{field}.{}", kinds[0]);
        let value = self.string(at, &f)?;
        match kinds[0] {
            "tcp" => {
                if !is_host_port(&value) {
                    self.err(
                        at.span(),
                        &f,
                        format!("`{value}` is not host:port"),
                        "write it like 127.0.0.1:47100",
                    );
                    return None;
                }
                let subject = Subject::Probe {
                    module: module.to_string(),
                };
                self.spans.subjects.insert(subject, (f.clone(), at.span()));
                Some(Probe::Tcp {
                    addr: value,
                    timeout_ms,
                })
            }
            "file" => {
                if !is_safe_relative(&value) {
                    self.err(
                        at.span(),
                        &f,
                        format!("`{value}` is not a relative path inside the module directory"),
                        "use a relative path without `..`",
                    );
                    return None;
                }
                Some(Probe::File {
                    path: value,
                    timeout_ms,
                })
            }
            _ => {
                let args = match t.get("args") {
                    Some(a) => self
                        .strings(a, &format!("{field}.args"))
                        .into_iter()
                        .map(|(s, _)| s)
                        .collect(),
                    None => Vec::new(),
                };
                Some(Probe::Command {
                    command: value,
                    args,
                    timeout_ms,
                })
            }
        }
    }

    fn provides(&mut self, module: &str, v: &Val<'_>, field: &str) -> Vec<Provide> {
        let mut out: Vec<Provide> = Vec::new();
        for (i, item) in self.array(v, field).iter().enumerate() {
            let f = format!("{field}[{i}]");
            let Some(t) = self.table(item, &f) else {
                continue;
            };
            self.known_keys(t, &f, &["kind", "port"]);
            let kind = self.required(t, "kind", item.span(), &f);
            let Some(kind_v) = kind else { continue };
            let Some(kind) = self.string(kind_v, &format!("{f}.kind")) else {
                continue;
            };
            let port = match t.get("port") {
                Some(p) => match self.integer(p, &format!("{f}.port"), 1, u64::from(u16::MAX)) {
                    Some(n) => Some((u16::try_from(n).ok(), p.span())),
                    None => continue,
                },
                None => None,
            };
            if !self.name(&kind, kind_v.span(), &format!("{f}.kind")) {
                continue;
            }
            if out.iter().any(|p| p.kind == kind) {
                self.err(
                    kind_v.span(),
                    format!("{f}.kind"),
                    format!("kind `{kind}` is provided twice"),
                    "provide each kind once",
                );
                continue;
            }
            if let Some((_, span)) = &port {
                let subject = Subject::Port {
                    module: module.to_string(),
                    index: out.len(),
                };
                self.spans
                    .subjects
                    .insert(subject, (format!("{f}.port"), span.clone()));
            }
            let port = port.and_then(|(p, _)| p);
            out.push(Provide { kind, port });
        }
        out
    }

    fn consumes(&mut self, module: &str, v: &Val<'_>, field: &str) -> Vec<Need> {
        let mut out: Vec<Need> = Vec::new();
        for (i, item) in self.array(v, field).iter().enumerate() {
            let f = format!("{field}[{i}]");
            let Some(t) = self.table(item, &f) else {
                continue;
            };
            self.known_keys(t, &f, &["kind", "from"]);
            let mut get = |key: &str| {
                let v = self.required(t, key, item.span(), &f)?;
                Some((self.string(v, &format!("{f}.{key}"))?, v.span()))
            };
            let (Some(kind), Some(from)) = (get("kind"), get("from")) else {
                continue;
            };
            let ok_kind = self.name(&kind.0, kind.1, &format!("{f}.kind"));
            let ok_from = self.name(&from.0, from.1, &format!("{f}.from"));
            if !(ok_kind && ok_from) {
                continue;
            }
            let need = Need {
                kind: kind.0,
                from: from.0,
            };
            if out.contains(&need) {
                self.err(
                    item.span(),
                    &f,
                    format!("{} from {} is consumed twice", need.kind, need.from),
                    "keep one entry",
                );
                continue;
            }
            self.spans
                .needs
                .insert((module.to_string(), out.len()), item.span());
            out.push(need);
        }
        out
    }

    fn settings(&mut self, v: &Val<'_>) -> BTreeMap<Scope, Layer> {
        let mut out = BTreeMap::new();
        let Some(t) = self.table(v, "settings") else {
            return out;
        };
        for (k, item) in t.iter() {
            let field = format!("settings.\"{}\"", k.get_ref());
            let scope = match k.get_ref().parse::<Scope>() {
                Ok(s) => s,
                Err(e) => {
                    self.err(
                        k.span(),
                        &field,
                        format!("scope `{}` does not parse: {}", e.given, e.reason),
                        "write mesh, machine/<m>, module/<mod> or module/<mod>@<m>",
                    );
                    continue;
                }
            };
            let Some(body) = self.table(item, &field) else {
                continue;
            };
            // Keys and values are checked by `validate`, the rule `settings set` follows too.
            let mut layer = Layer::new();
            for (key, value) in body.iter() {
                let f = format!("{field}.{}", key.get_ref());
                if let Some(text) = self.setting_value(value, &f) {
                    let name = key.get_ref().to_string();
                    let key_at = Subject::SettingKey {
                        scope: scope.clone(),
                        key: name.clone(),
                    };
                    let value_at = Subject::SettingValue {
                        scope: scope.clone(),
                        key: name.clone(),
                    };
                    let subjects = &mut self.spans.subjects;
                    subjects.insert(key_at, (f.clone(), key.span()));
                    subjects.insert(value_at, (f, value.span()));
                    layer.insert(name, text);
                }
            }
            let subject = Subject::Scope(scope.clone());
            self.spans.subjects.insert(subject, (field, k.span()));
            out.insert(scope, layer);
        }
        out
    }

    fn setting_value(&mut self, v: &Val<'_>, field: &str) -> Option<String> {
        match v.get_ref() {
            DeValue::String(s) => Some(s.to_string()),
            DeValue::Integer(i) => match i128::from_str_radix(i.as_str(), i.radix()) {
                Ok(n) => Some(n.to_string()),
                Err(_) => {
                    self.err(
                        v.span(),
                        field,
                        "is not a number that fits",
                        "quote it as a string",
                    );
                    None
                }
            },
            DeValue::Float(x) => Some(x.as_str().to_string()),
            DeValue::Boolean(b) => Some(b.to_string()),
            other => {
                let got = other.type_str();
                self.err(
                    v.span(),
                    field,
                    format!("a setting cannot be {got}"),
                    "give a non-empty string, number or boolean",
                );
                None
            }
        }
    }
}

// ---------------------------------------------------------------- references between entries

impl Reader<'_> {
    fn cross_check(&mut self, mesh: &Mesh) {
        for m in mesh.modules.values() {
            self.check_placement(mesh, m);
            self.check_needs(mesh, m);
            self.check_after(mesh, m);
        }
        self.check_cycles(mesh);
        self.check_rules(mesh);
    }

    /// [`validate`]'s problems, each at the place its subject was written.
    fn check_rules(&mut self, mesh: &Mesh) {
        let Err(invalid) = validate(mesh) else {
            return;
        };
        for p in invalid.problems {
            let (field, span) = match self.spans.subjects.get(&p.subject) {
                Some((field, span)) => (field.clone(), span.clone()),
                None => (p.subject.to_string(), 0..0),
            };
            self.err(span, field, p.message, "");
        }
    }

    fn check_placement(&mut self, mesh: &Mesh, m: &Module) {
        if m.machine.is_empty() || mesh.machines.contains_key(&m.machine) {
            return;
        }
        let span = self
            .spans
            .module_machine
            .get(&m.name)
            .cloned()
            .unwrap_or(0..0);
        self.err(
            span,
            format!("modules.{}.machine", m.name),
            format!("machine `{}` is not declared", m.machine),
            format!(
                "add [machines.{}] or place the module on a declared machine",
                m.machine
            ),
        );
    }

    fn check_needs(&mut self, mesh: &Mesh, m: &Module) {
        for (i, need) in m.consumes.iter().enumerate() {
            let span = self
                .spans
                .needs
                .get(&(m.name.clone(), i))
                .cloned()
                .unwrap_or(0..0);
            let field = format!("modules.{}.consumes[{i}].from", m.name);
            let provider = mesh.modules.get(&need.from);
            let problem = match provider {
                _ if need.from == m.name => Some((
                    "a module cannot consume from itself".to_string(),
                    "name another module".to_string(),
                )),
                None => Some((
                    format!("no module `{}` provides {}", need.from, need.kind),
                    format!(
                        "name a module that has {{ kind = \"{}\" }} in `provides`",
                        need.kind
                    ),
                )),
                Some(p) if !p.provides.iter().any(|o| o.kind == need.kind) => Some((
                    format!("module `{}` does not provide {}", need.from, need.kind),
                    format!(
                        "add {{ kind = \"{}\" }} to {}'s `provides` or name another module",
                        need.kind, need.from
                    ),
                )),
                Some(_) => None,
            };
            if let Some((problem, fix)) = problem {
                self.err(span, field, problem, fix);
            }
        }
    }

    fn check_after(&mut self, mesh: &Mesh, m: &Module) {
        let mut seen = BTreeSet::new();
        for (i, name) in m.after.iter().enumerate() {
            let span = self
                .spans
                .after
                .get(&(m.name.clone(), i))
                .cloned()
                .unwrap_or(0..0);
            let field = format!("modules.{}.after[{i}]", m.name);
            let problem = match mesh.modules.get(name) {
                _ if *name == m.name => Some("a module cannot wait for itself".to_string()),
                _ if !seen.insert(name.as_str()) => Some(format!("`{name}` is listed twice")),
                None => Some(format!("no module `{name}` is declared")),
                Some(other) if other.machine != m.machine => Some(format!(
                    "module `{name}` runs on {}, not on {}; `after` only orders modules of one machine",
                    other.machine, m.machine
                )),
                Some(_) => None,
            };
            if let Some(problem) = problem {
                self.err(
                    span,
                    field,
                    problem,
                    "list modules of the same machine, each once",
                );
            }
        }
    }

    /// Reports each cycle of `after` once, at the module where the search entered it.
    fn check_cycles(&mut self, mesh: &Mesh) {
        let mut done: BTreeSet<&str> = BTreeSet::new();
        for start in mesh.modules.keys() {
            if done.contains(start.as_str()) {
                continue;
            }
            if let Some(cycle) = find_cycle(mesh, start, &mut done) {
                // allow(empty-on-error): find_cycle returns no empty cycle
                let first = cycle.first().cloned().unwrap_or_default();
                let span = self
                    .spans
                    .after
                    .get(&(first.clone(), 0))
                    .cloned()
                    .unwrap_or(0..0);
                self.err(
                    span,
                    format!("modules.{first}.after"),
                    format!(
                        "modules wait for each other in a cycle: {}",
                        cycle.join(" -> ")
                    ),
                    "remove one of these `after` entries",
                );
            }
        }
    }
}

/// Depth-first search along `after` from `start`; returns the first cycle found (closed, so
/// `a -> b -> a`). Every module fully explored goes into `done`, so the whole check is linear.
fn find_cycle<'m>(
    mesh: &'m Mesh,
    start: &'m str,
    done: &mut BTreeSet<&'m str>,
) -> Option<Vec<String>> {
    let mut path: Vec<(&'m str, usize)> = vec![(start, 0)];
    let mut on_path: BTreeSet<&'m str> = BTreeSet::from([start]);
    while let Some((name, next)) = path.last().copied() {
        let after = mesh
            .modules
            .get(name)
            .map(|m| m.after.as_slice())
            .unwrap_or(&[]);
        let Some(dep) = after.get(next) else {
            path.pop();
            on_path.remove(name);
            done.insert(name);
            continue;
        };
        if let Some(top) = path.last_mut() {
            top.1 += 1;
        }
        let dep = dep.as_str();
        // A module waiting for itself is reported by `check_after`.
        if dep == name {
            continue;
        }
        if on_path.contains(dep) {
            let from = path.iter().position(|(n, _)| *n == dep).unwrap_or(0);
            let mut cycle: Vec<String> = path[from..].iter().map(|(n, _)| n.to_string()).collect();
            cycle.push(dep.to_string());
            for (n, _) in &path {
                done.insert(n);
            }
            return Some(cycle);
        }
        if !done.contains(dep) && mesh.modules.contains_key(dep) {
            path.push((dep, 0));
            on_path.insert(dep);
        }
    }
    None
}

fn is_env_name(key: &str) -> bool {
    let mut bytes = key.bytes();
    matches!(bytes.next(), Some(b) if b.is_ascii_alphabetic() || b == b'_')
        && bytes.all(|b| b.is_ascii_alphanumeric() || b == b'_')
}

/// A path relative to the module's directory that cannot leave it.
pub fn is_safe_relative(path: &str) -> bool {
    !path.is_empty()
        && !path.starts_with('/')
        && !path.contains('\0')
        && path
            .split('/')
            .all(|c| !c.is_empty() && c != "." && c != "..")
}

/// An absolute host path, not `/` itself, without `..`, `.` or empty parts.
pub fn is_safe_absolute(path: &str) -> bool {
    match path.strip_prefix('/') {
        Some(rest) => is_safe_relative(rest),
        None => false,
    }
}

fn is_host_port(addr: &str) -> bool {
    match addr.rsplit_once(':') {
        Some((host, port)) => !host.is_empty() && port.parse::<u16>().is_ok_and(|p| p > 0),
        None => false,
    }
}

#[cfg(test)]
#[path = "meshfile_tests.rs"]
mod tests;
