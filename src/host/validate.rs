//! Checks a verified declaration before anything of it touches the machine: no path can escape the
//! module's directory, every name is safe to use as a file or variable name, `after` names modules
//! that exist and form no cycle, and no running module's mount moves unless the envelope says so (G8).
//! Pure: no I/O. A refusal here means nothing of the declaration is applied.

use std::collections::{BTreeMap, BTreeSet};

use crate::core::declaration::{Declaration, DeclaredModule};
use crate::core::model::Probe;

/// Most modules one declaration may hold.
pub const modules_max: usize = 1024;
/// Most files (declared files, mounts and provisions together) one module may hold.
pub const module_entries_max: usize = 4096;
/// Longest relative path or host directory accepted, in bytes.
pub const path_bytes_max: usize = 1024;
/// Longest module, mount or provision name accepted, in bytes.
pub const name_bytes_max: usize = 128;
/// Longest probe timeout accepted.
pub const probe_timeout_ms_max: u64 = 600_000;

/// Names the host writes itself in a module's directory; a declared file or mount target may not
/// take them.
pub const reserved_names: [&str; 3] = ["secrets", "grants.toml", "provisions.toml"];

/// Why a verified declaration was refused. Nothing of it was applied.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum DeclarationRefusal {
    #[error("declaration is for machine {got}, this host is {expected}")]
    WrongMachine { expected: String, got: String },
    #[error("declaration has {count} modules, over the limit of {modules_max}")]
    TooManyModules { count: usize },
    #[error("module {module} is declared twice")]
    DuplicateModule { module: String },
    #[error("module {module}: {what} `{value}` {problem}")]
    Bad {
        module: String,
        what: &'static str,
        value: String,
        problem: String,
    },
    #[error("module {module} starts after `{after}`, which this declaration does not have")]
    UnknownAfter { module: String, after: String },
    #[error("modules wait on each other in a cycle ({cycle}), so none of them could start")]
    AfterCycle { cycle: String },
    #[error("{}", describe_moves(.0))]
    MountMoves(Vec<MountMove>),
}

/// A running module's mount that a declaration would give another host directory.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MountMove {
    pub module: String,
    pub mount: String,
    pub from: String,
    pub to: String,
}

fn describe_moves(moves: &[MountMove]) -> String {
    let mut parts = Vec::new();
    for m in moves {
        parts.push(format!(
            "module {} mount {} would move from {} to {}; only an envelope sent with `--move {}` may move it",
            m.module, m.mount, m.from, m.to, m.module
        ));
    }
    parts.join("; ")
}

/// Checks everything about `next` that does not depend on what runs now.
pub fn check_declaration(next: &Declaration, machine: &str) -> Result<(), DeclarationRefusal> {
    if next.machine != machine {
        return Err(DeclarationRefusal::WrongMachine {
            expected: machine.to_string(),
            got: next.machine.clone(),
        });
    }
    if next.modules.len() > modules_max {
        return Err(DeclarationRefusal::TooManyModules {
            count: next.modules.len(),
        });
    }
    let mut names = BTreeSet::new();
    for module in &next.modules {
        check_name(&module.name, &module.name, "module name")?;
        if !names.insert(module.name.as_str()) {
            return Err(DeclarationRefusal::DuplicateModule {
                module: module.name.clone(),
            });
        }
    }
    for module in &next.modules {
        check_module(module)?;
        for after in &module.after {
            if !names.contains(after.as_str()) || after == &module.name {
                return Err(DeclarationRefusal::UnknownAfter {
                    module: module.name.clone(),
                    after: after.clone(),
                });
            }
        }
    }
    check_no_cycle(next)
}

/// Refuses a declaration that gives a module the host runs now another host directory for one of
/// its mounts, unless `moves` names that module (G8, behind the controller's hold).
pub fn check_mount_moves(
    current: &Declaration,
    next: &Declaration,
    moves: &[String],
) -> Result<(), DeclarationRefusal> {
    let mut found = Vec::new();
    for module in &next.modules {
        if moves.contains(&module.name) {
            continue;
        }
        let Some(running) = current.modules.iter().find(|m| m.name == module.name) else {
            continue;
        };
        for mount in &module.mounts {
            let Some(old) = running.mounts.iter().find(|m| m.name == mount.name) else {
                continue;
            };
            if old.host_dir != mount.host_dir {
                found.push(MountMove {
                    module: module.name.clone(),
                    mount: mount.name.clone(),
                    from: old.host_dir.clone(),
                    to: mount.host_dir.clone(),
                });
            }
        }
    }
    if found.is_empty() {
        Ok(())
    } else {
        Err(DeclarationRefusal::MountMoves(found))
    }
}

fn check_module(module: &DeclaredModule) -> Result<(), DeclarationRefusal> {
    let name = module.name.as_str();
    let entries = module.files.len() + module.mounts.len() + module.provisions.len();
    if entries > module_entries_max {
        return Err(bad(
            name,
            "file count",
            &entries.to_string(),
            format!("is over the limit of {module_entries_max}"),
        ));
    }
    check_text(name, "command", &module.command, &module.command)?;
    if module.command.is_empty() {
        return Err(bad(name, "command", "", "is empty".into()));
    }
    for (i, arg) in module.args.iter().enumerate() {
        check_text(name, "argument", &format!("#{i}"), arg)?;
    }
    check_env(module)?;
    check_paths(module)?;
    if let Some(probe) = &module.ready {
        check_probe(name, probe)?;
    }
    let mut ids = BTreeSet::new();
    for provision in &module.provisions {
        check_name(name, &provision.id, "provision id")?;
        if !ids.insert(provision.id.as_str()) {
            return Err(bad(
                name,
                "provision id",
                &provision.id,
                "appears twice".into(),
            ));
        }
    }
    Ok(())
}

/// Environment names a module gets: its own `env`, and `MESH_SETTING_*` from settings. They must be
/// valid variable names and no two may land on the same name.
fn check_env(module: &DeclaredModule) -> Result<(), DeclarationRefusal> {
    let name = module.name.as_str();
    let mut seen = BTreeMap::new();
    for (key, value) in &module.env {
        check_env_key(name, key)?;
        check_text(name, "env value of", key, value)?;
        seen.insert(key.clone(), key.clone());
    }
    for (key, value) in &module.settings {
        check_text(name, "setting value of", key, value)?;
        let var = setting_var(key);
        check_env_key(name, &var)?;
        if let Some(first) = seen.insert(var.clone(), key.clone()) {
            return Err(bad(
                name,
                "setting",
                key,
                format!("becomes {var}, which `{first}` already sets; rename one of them"),
            ));
        }
    }
    let mut mounts = BTreeSet::new();
    for mount in &module.mounts {
        check_name(name, &mount.name, "mount name")?;
        if !mounts.insert(mount_var(&mount.name)) {
            return Err(bad(
                name,
                "mount name",
                &mount.name,
                "lands on the same MESH_MOUNT_ variable as another mount".into(),
            ));
        }
    }
    Ok(())
}

/// `MESH_SETTING_<KEY>`: upper-cased, with `-` and `.` turned into `_`.
pub fn setting_var(key: &str) -> String {
    format!("MESH_SETTING_{}", env_suffix(key))
}

/// `MESH_MOUNT_<NAME>`, formed like [`setting_var`].
pub fn mount_var(name: &str) -> String {
    format!("MESH_MOUNT_{}", env_suffix(name))
}

fn env_suffix(key: &str) -> String {
    let mut out = String::with_capacity(key.len());
    for c in key.chars() {
        match c {
            '-' | '.' => out.push('_'),
            c => out.extend(c.to_uppercase()),
        }
    }
    out
}

fn check_env_key(module: &str, key: &str) -> Result<(), DeclarationRefusal> {
    if key.is_empty() || key.contains('=') || key.contains('\0') {
        return Err(bad(
            module,
            "env name",
            key,
            "is not a variable name (empty, or has `=` or NUL)".into(),
        ));
    }
    Ok(())
}

/// Files, mount targets and host directories: relative paths stay inside the module's directory,
/// never on the host's own names, never on or under a mount target (a link the module could follow).
fn check_paths(module: &DeclaredModule) -> Result<(), DeclarationRefusal> {
    let name = module.name.as_str();
    let mut targets: Vec<Vec<&str>> = Vec::new();
    for mount in &module.mounts {
        let parts = check_relative(name, "mount target", &mount.target)?;
        check_absolute(name, &mount.host_dir)?;
        for other in &targets {
            if overlaps(other, &parts) {
                return Err(bad(
                    name,
                    "mount target",
                    &mount.target,
                    "overlaps another mount target".into(),
                ));
            }
        }
        targets.push(parts);
    }
    let mut files: Vec<Vec<&str>> = Vec::new();
    for path in module.files.keys() {
        let parts = check_relative(name, "file", path)?;
        if targets.iter().any(|t| overlaps(t, &parts)) {
            return Err(bad(
                name,
                "file",
                path,
                "is on or under a mount target".into(),
            ));
        }
        if files.iter().any(|f| overlaps(f, &parts)) {
            return Err(bad(
                name,
                "file",
                path,
                "is also a directory of another declared file".into(),
            ));
        }
        files.push(parts);
    }
    Ok(())
}

/// True when one path is the other or lies under it.
fn overlaps(a: &[&str], b: &[&str]) -> bool {
    let n = a.len().min(b.len());
    a[..n] == b[..n]
}

/// A relative path of plain components, not on a name the host writes itself.
fn check_relative<'a>(
    module: &str,
    what: &'static str,
    path: &'a str,
) -> Result<Vec<&'a str>, DeclarationRefusal> {
    let parts = relative_parts(path).map_err(|p| bad(module, what, path, p))?;
    if parts
        .first()
        .is_some_and(|first| reserved_names.contains(first))
    {
        return Err(bad(
            module,
            what,
            path,
            format!(
                "uses a name the host writes itself ({})",
                reserved_names.join(", ")
            ),
        ));
    }
    Ok(parts)
}

/// Splits a relative path into plain components; refuses absolute paths, `.`, `..`, empty parts.
pub fn relative_parts(path: &str) -> Result<Vec<&str>, String> {
    if path.is_empty() || path.len() > path_bytes_max || path.contains('\0') {
        return Err(format!("must be 1 to {path_bytes_max} bytes without NUL"));
    }
    if path.starts_with('/') {
        return Err("is absolute; paths are relative to the module's directory".into());
    }
    let parts: Vec<&str> = path.split('/').collect();
    if parts
        .iter()
        .any(|p| p.is_empty() || *p == "." || *p == "..")
    {
        return Err("has an empty, `.` or `..` component and could escape".into());
    }
    Ok(parts)
}

fn check_absolute(module: &str, host_dir: &str) -> Result<(), DeclarationRefusal> {
    let problem = if !host_dir.starts_with('/') {
        Some("is not absolute")
    } else if host_dir.len() > path_bytes_max || host_dir.contains('\0') {
        Some("is too long or has a NUL byte")
    } else {
        let parts: Vec<&str> = host_dir[1..].split('/').collect();
        if parts
            .iter()
            .any(|p| p.is_empty() || *p == "." || *p == "..")
        {
            Some("has an empty, `.` or `..` component (or is `/`)")
        } else {
            None
        }
    };
    match problem {
        Some(p) => Err(bad(module, "mount host_dir", host_dir, p.into())),
        None => Ok(()),
    }
}

fn check_probe(module: &str, probe: &Probe) -> Result<(), DeclarationRefusal> {
    let timeout_ms = match probe {
        Probe::Tcp { addr, timeout_ms } => {
            check_text(module, "probe address", addr, addr)?;
            *timeout_ms
        }
        Probe::File { path, timeout_ms } => {
            relative_parts(path).map_err(|p| bad(module, "probe file", path, p))?;
            *timeout_ms
        }
        Probe::Command {
            command,
            args,
            timeout_ms,
        } => {
            check_text(module, "probe command", command, command)?;
            for (i, arg) in args.iter().enumerate() {
                check_text(module, "probe argument", &format!("#{i}"), arg)?;
            }
            *timeout_ms
        }
    };
    if timeout_ms == 0 || timeout_ms > probe_timeout_ms_max {
        return Err(bad(
            module,
            "probe timeout_ms",
            &timeout_ms.to_string(),
            format!("must be 1..={probe_timeout_ms_max}"),
        ));
    }
    Ok(())
}

/// A name used as one path component and in a variable name.
fn check_name(module: &str, value: &str, what: &'static str) -> Result<(), DeclarationRefusal> {
    let ok_char = |c: char| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.');
    if value.is_empty()
        || value.len() > name_bytes_max
        || value == "."
        || value == ".."
        || !value.chars().all(ok_char)
    {
        return Err(bad(
            module,
            what,
            value,
            format!(
                "must be 1 to {name_bytes_max} letters, digits, `-`, `_` or `.` (and not `.` or `..`)"
            ),
        ));
    }
    Ok(())
}

/// Refuses a NUL byte in `value`. Only `label` is named in the refusal: values may be secret, and
/// refusals are logged and reported.
fn check_text(
    module: &str,
    what: &'static str,
    label: &str,
    value: &str,
) -> Result<(), DeclarationRefusal> {
    if value.contains('\0') {
        return Err(bad(module, what, label, "has a NUL byte".into()));
    }
    Ok(())
}

fn check_no_cycle(decl: &Declaration) -> Result<(), DeclarationRefusal> {
    let after: BTreeMap<&str, &[String]> = decl
        .modules
        .iter()
        .map(|m| (m.name.as_str(), m.after.as_slice()))
        .collect();
    // Kahn's algorithm: whatever cannot be ordered is on or behind a cycle.
    let mut waiting: BTreeMap<&str, usize> = after.iter().map(|(n, a)| (*n, a.len())).collect();
    let mut ready: Vec<&str> = waiting
        .iter()
        .filter(|(_, n)| **n == 0)
        .map(|(m, _)| *m)
        .collect();
    while let Some(done) = ready.pop() {
        waiting.remove(done);
        for (module, deps) in &after {
            let Some(count) = waiting.get_mut(module) else {
                continue;
            };
            for dep in deps.iter() {
                if dep == done {
                    *count -= 1;
                    if *count == 0 {
                        ready.push(module);
                    }
                }
            }
        }
    }
    if waiting.is_empty() {
        Ok(())
    } else {
        let cycle: Vec<&str> = waiting.keys().copied().collect();
        Err(DeclarationRefusal::AfterCycle {
            cycle: cycle.join(", "),
        })
    }
}

fn bad(module: &str, what: &'static str, value: &str, problem: String) -> DeclarationRefusal {
    DeclarationRefusal::Bad {
        module: module.to_string(),
        what,
        value: value.to_string(),
        problem,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::model::Mount;

    fn module(name: &str) -> DeclaredModule {
        DeclaredModule {
            name: name.into(),
            command: "sleep".into(),
            args: vec!["100".into()],
            env: Default::default(),
            settings: BTreeMap::new(),
            files: Default::default(),
            mounts: vec![],
            ready: None,
            after: vec![],
            provisions: vec![],
            grants: vec![],
        }
    }

    fn decl(modules: Vec<DeclaredModule>) -> Declaration {
        Declaration {
            machine: "ace".into(),
            modules,
            revoked: Default::default(),
            signers: Default::default(),
        }
    }

    fn with_file(path: &str) -> Declaration {
        let mut m = module("web");
        m.files.insert(path.into(), "x".into());
        decl(vec![m])
    }

    #[test]
    fn path_escapes_are_refused() {
        for path in [
            "../x",
            "a/../../x",
            "/etc/passwd",
            "",
            "a//b",
            "./a",
            "secrets/p1",
            "grants.toml",
        ] {
            assert!(
                check_declaration(&with_file(path), "ace").is_err(),
                "{path:?} accepted"
            );
        }
        assert_eq!(check_declaration(&with_file("conf/a.toml"), "ace"), Ok(()));
    }

    #[test]
    fn a_file_under_a_mount_target_is_refused() {
        let mut m = module("db");
        m.mounts.push(Mount {
            name: "data".into(),
            host_dir: "/srv/db".into(),
            target: "data".into(),
        });
        m.files.insert("data/evil".into(), "x".into());
        assert!(check_declaration(&decl(vec![m]), "ace").is_err());
    }

    #[test]
    fn after_must_name_a_module_and_form_no_cycle() {
        let mut a = module("a");
        a.after = vec!["b".into()];
        let mut b = module("b");
        b.after = vec!["a".into()];
        assert!(matches!(
            check_declaration(&decl(vec![a.clone(), b]), "ace"),
            Err(DeclarationRefusal::AfterCycle { .. })
        ));
        assert!(matches!(
            check_declaration(&decl(vec![a]), "ace"),
            Err(DeclarationRefusal::UnknownAfter { .. })
        ));
    }

    #[test]
    fn g8_mount_move_needs_the_module_named_in_moves() {
        let mut old = module("db");
        old.mounts.push(Mount {
            name: "data".into(),
            host_dir: "/srv/a".into(),
            target: "data".into(),
        });
        let mut new = old.clone();
        new.mounts[0].host_dir = "/srv/b".into();
        let (old, new) = (decl(vec![old]), decl(vec![new]));
        assert!(matches!(
            check_mount_moves(&old, &new, &[]),
            Err(DeclarationRefusal::MountMoves(_))
        ));
        assert_eq!(check_mount_moves(&old, &new, &["db".into()]), Ok(()));
    }

    #[test]
    fn setting_names_become_upper_case_variables() {
        assert_eq!(setting_var("log.level-x"), "MESH_SETTING_LOG_LEVEL_X");
        let mut m = module("web");
        m.settings.insert("a.b".into(), "1".into());
        m.settings.insert("a_b".into(), "2".into());
        assert!(check_declaration(&decl(vec![m]), "ace").is_err());
    }
}
