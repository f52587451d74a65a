//! A module's directory on disk: declared files, provision secrets (0600), the provisions and grants
//! files, and the links to its mounts. Every write goes through [`write_inside`], which refuses to
//! follow a symlink or leave the module's directory.
//!
//! Modules run as the host's own user, so these checks defend against declarations and leftovers,
//! not against a hostile module racing the host (see docs/decisions/0042).

use serde::Serialize;
use std::fs;
use std::io::ErrorKind;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};

use super::drift::{ExpectedFile, ExpectedMount};
use super::durable;
use super::validate::relative_parts;
use crate::core::declaration::DeclaredModule;

/// Mode of a module's directory and of the `secrets/` directory in it.
const dir_mode: u32 = 0o700;
/// Mode of declared files and of the provisions and grants files.
const file_mode: u32 = 0o640;
/// Mode of a provision secret: readable by the host's user only, set at creation.
const secret_mode: u32 = 0o600;
/// Mode of parent directories created on the way to a mount directory.
const mount_parent_mode: u32 = 0o755;
/// Mode of a mount directory the host creates (an existing one keeps its own).
const mount_dir_mode: u32 = 0o700;

/// Why a module's directory could not be prepared. The module is reported failed; others go on.
#[derive(Debug, thiserror::Error)]
#[error("module {module}: {problem} ({path})")]
pub struct LayoutError {
    pub module: String,
    pub path: PathBuf,
    pub problem: String,
}

/// Where the host keeps modules' directories and logs, and where mounts go.
#[derive(Clone, Debug)]
pub struct Layout {
    root: PathBuf,
    mounts_root: PathBuf,
}

#[derive(Serialize)]
struct GrantsFile<'a> {
    grant: Vec<GrantEntry<'a>>,
}

#[derive(Serialize)]
struct GrantEntry<'a> {
    id: &'a str,
    kind: &'a str,
    consumer: String,
    name: &'a str,
    secret_blake3: &'a str,
}

#[derive(Serialize)]
struct ProvisionsFile<'a> {
    provision: Vec<ProvisionEntry<'a>>,
}

#[derive(Serialize)]
struct ProvisionEntry<'a> {
    id: &'a str,
    kind: &'a str,
    provider: String,
    name: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    endpoint: Option<&'a str>,
    secret_file: String,
}

impl Layout {
    pub fn new(root: &Path, mounts_root: &Path) -> Layout {
        Layout {
            root: root.to_path_buf(),
            mounts_root: mounts_root.to_path_buf(),
        }
    }

    /// `<root>/modules/<name>`: the module's working directory.
    pub fn module_dir(&self, name: &str) -> PathBuf {
        self.root.join("modules").join(name)
    }

    /// `<root>/logs/<name>.<stream>.log`: outside the module's directory so no declared file can
    /// overwrite it.
    pub fn log_path(&self, name: &str, stream: &str) -> PathBuf {
        self.root.join("logs").join(format!("{name}.{stream}.log"))
    }

    /// `<root>/run/<name>`: the module's process group while it runs.
    pub fn group_record(&self, name: &str) -> PathBuf {
        super::leftovers::run_dir(&self.root).join(name)
    }

    /// Where a mount's `host_dir` lives on this machine: under `mounts_root`.
    pub fn mount_dir(&self, host_dir: &str) -> PathBuf {
        self.mounts_root.join(host_dir.trim_start_matches('/'))
    }

    /// Writes everything `module` declares into its directory, and removes what `previous` declared
    /// and `module` no longer does.
    pub fn prepare(
        &self,
        module: &DeclaredModule,
        previous: Option<&DeclaredModule>,
    ) -> Result<(), LayoutError> {
        let dir = self.module_dir(&module.name);
        self.ensure_module_dir(&module.name, &dir)?;
        durable::create_dir(&self.root.join("logs"), dir_mode)
            .map_err(|e| fail(&module.name, &e.path, e.source.to_string()))?;
        if let Some(previous) = previous {
            self.remove_stale(module, previous, &dir)?;
        }
        for (path, content) in &module.files {
            write_inside(&module.name, &dir, path, content.as_bytes(), file_mode)?;
        }
        self.write_secrets(module, &dir)?;
        self.write_provisions(module, &dir)?;
        self.write_grants(module)?;
        for mount in &module.mounts {
            let host = self.mount_dir(&mount.host_dir);
            create_mount_dir(&module.name, &host)?;
            link_inside(&module.name, &dir, &mount.target, &host)?;
        }
        Ok(())
    }

    /// Rewrites `grants.toml` atomically, so a provider can reload it without a restart. Written
    /// when the module has grants, or had them (an emptied file says "none now").
    pub fn write_grants(&self, module: &DeclaredModule) -> Result<(), LayoutError> {
        let dir = self.module_dir(&module.name);
        let path = dir.join("grants.toml");
        let exists = fs::symlink_metadata(&path).is_ok();
        if module.grants.is_empty() && !exists {
            return Ok(());
        }
        let text = grants_text(module, &path)?;
        write_inside(
            &module.name,
            &dir,
            "grants.toml",
            text.as_bytes(),
            file_mode,
        )
    }

    /// What [`Layout::prepare`] writes for `module`, as the drift check expects to find it
    /// (decision 0305): every file with its length, blake3 and mode, and every mount's link.
    pub fn expected(
        &self,
        module: &DeclaredModule,
    ) -> Result<(Vec<ExpectedFile>, Vec<ExpectedMount>), LayoutError> {
        let dir = self.module_dir(&module.name);
        let mut files = Vec::new();
        for (path, content) in &module.files {
            files.push(ExpectedFile::of(path, content.as_bytes(), file_mode));
        }
        for p in &module.provisions {
            let path = format!("secrets/{}", p.id);
            files.push(ExpectedFile::of(&path, p.secret.as_bytes(), secret_mode));
        }
        if !module.provisions.is_empty() {
            let text = provisions_text(module, &dir.join("provisions.toml"))?;
            files.push(ExpectedFile::of(
                "provisions.toml",
                text.as_bytes(),
                file_mode,
            ));
        }
        if !module.grants.is_empty() {
            let text = grants_text(module, &dir.join("grants.toml"))?;
            files.push(ExpectedFile::of("grants.toml", text.as_bytes(), file_mode));
        }
        let mounts = module
            .mounts
            .iter()
            .map(|m| ExpectedMount {
                target: m.target.clone(),
                host: self.mount_dir(&m.host_dir),
            })
            .collect();
        Ok((files, mounts))
    }

    /// Removes a module's directory (its mounts, elsewhere, are kept: they hold data).
    pub fn remove(&self, name: &str) -> Result<(), LayoutError> {
        let dir = self.module_dir(name);
        match fs::remove_dir_all(&dir) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == ErrorKind::NotFound => Ok(()),
            Err(e) => Err(fail(name, &dir, format!("cannot remove: {e}"))),
        }
    }

    fn ensure_module_dir(&self, name: &str, dir: &Path) -> Result<(), LayoutError> {
        let modules = self.root.join("modules");
        durable::create_dir(&modules, dir_mode)
            .map_err(|e| fail(name, &e.path, e.source.to_string()))?;
        ensure_real_dir(name, dir)
    }

    fn write_secrets(&self, module: &DeclaredModule, dir: &Path) -> Result<(), LayoutError> {
        let secrets = dir.join("secrets");
        if module.provisions.is_empty() && fs::symlink_metadata(&secrets).is_err() {
            return Ok(());
        }
        ensure_real_dir(&module.name, &secrets)?;
        let entries = fs::read_dir(&secrets)
            .map_err(|e| fail(&module.name, &secrets, format!("cannot list: {e}")))?;
        for entry in entries {
            let entry = entry.map_err(|e| fail(&module.name, &secrets, e.to_string()))?;
            let name = entry.file_name();
            let keep = module
                .provisions
                .iter()
                .any(|p| std::ffi::OsStr::new(&p.id) == name);
            if !keep {
                durable::remove_if_present(&entry.path())
                    .map_err(|e| fail(&module.name, &e.path, e.source.to_string()))?;
            }
        }
        for p in &module.provisions {
            let path = format!("secrets/{}", p.id);
            write_inside(&module.name, dir, &path, p.secret.as_bytes(), secret_mode)?;
        }
        Ok(())
    }

    fn write_provisions(&self, module: &DeclaredModule, dir: &Path) -> Result<(), LayoutError> {
        let path = dir.join("provisions.toml");
        if module.provisions.is_empty() && fs::symlink_metadata(&path).is_err() {
            return Ok(());
        }
        let text = provisions_text(module, &path)?;
        write_inside(
            &module.name,
            dir,
            "provisions.toml",
            text.as_bytes(),
            file_mode,
        )
    }

    fn remove_stale(
        &self,
        module: &DeclaredModule,
        previous: &DeclaredModule,
        dir: &Path,
    ) -> Result<(), LayoutError> {
        let mut stale: Vec<&str> = Vec::new();
        for path in previous.files.keys() {
            if !module.files.contains_key(path) {
                stale.push(path);
            }
        }
        for mount in &previous.mounts {
            if !module.mounts.iter().any(|m| m.target == mount.target) {
                stale.push(&mount.target);
            }
        }
        for path in stale {
            // Only a path that passed validation is ever removed, and never through a link.
            if checked_parent(&module.name, dir, path)?.is_some() {
                let full = dir.join(path);
                let meta = fs::symlink_metadata(&full);
                if meta.is_ok_and(|m| !m.is_dir()) {
                    durable::remove_if_present(&full)
                        .map_err(|e| fail(&module.name, &e.path, e.source.to_string()))?;
                }
            }
        }
        Ok(())
    }
}

/// Writes `bytes` at relative `path` inside `dir`, creating parent directories; refuses to pass
/// through a symlink or anything that is not a directory. The final rename replaces a link
/// rather than following it.
pub fn write_inside(
    module: &str,
    dir: &Path,
    path: &str,
    bytes: &[u8],
    mode: u32,
) -> Result<(), LayoutError> {
    let parts = relative_parts(path).map_err(|p| fail(module, &dir.join(path), p))?;
    let mut current = dir.to_path_buf();
    for part in &parts[..parts.len() - 1] {
        current.push(part);
        ensure_real_dir(module, &current)?;
    }
    let target = dir.join(path);
    if fs::symlink_metadata(&target).is_ok_and(|m| m.is_dir()) {
        return Err(fail(
            module,
            &target,
            "a directory is where a declared file goes; move it away".into(),
        ));
    }
    durable::write_atomic(&target, bytes, mode).map_err(|e| fail(module, &e.path, e.to_string()))
}

/// Returns the parent of relative `path` inside `dir` if every component on the way exists and is
/// a real directory; `None` if one is missing; an error if one is a link or a file.
fn checked_parent(module: &str, dir: &Path, path: &str) -> Result<Option<PathBuf>, LayoutError> {
    let parts = relative_parts(path).map_err(|p| fail(module, &dir.join(path), p))?;
    let mut current = dir.to_path_buf();
    for part in &parts[..parts.len() - 1] {
        current.push(part);
        match fs::symlink_metadata(&current) {
            Ok(m) if m.is_dir() => {}
            Ok(_) => {
                return Err(fail(
                    module,
                    &current,
                    "is a link or a file where a directory was expected; refusing to follow it"
                        .into(),
                ));
            }
            Err(e) if e.kind() == ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(fail(module, &current, e.to_string())),
        }
    }
    Ok(Some(current))
}

/// Makes `link` (relative to `dir`) a symlink to `host`, replacing an older link but never a file
/// or directory the module made.
fn link_inside(module: &str, dir: &Path, link: &str, host: &Path) -> Result<(), LayoutError> {
    let parts = relative_parts(link).map_err(|p| fail(module, &dir.join(link), p))?;
    let mut current = dir.to_path_buf();
    for part in &parts[..parts.len() - 1] {
        current.push(part);
        ensure_real_dir(module, &current)?;
    }
    let path = dir.join(link);
    match fs::symlink_metadata(&path) {
        Ok(m) if m.file_type().is_symlink() => {
            if fs::read_link(&path).is_ok_and(|to| to == host) {
                return Ok(());
            }
        }
        Ok(_) => {
            return Err(fail(
                module,
                &path,
                "a mount target is taken by a file or directory; move it away so the mount can be linked"
                    .into(),
            ));
        }
        Err(e) if e.kind() == ErrorKind::NotFound => {}
        Err(e) => return Err(fail(module, &path, e.to_string())),
    }
    let tmp = durable::temp_path(&path);
    durable::remove_if_present(&tmp).map_err(|e| fail(module, &e.path, e.to_string()))?;
    std::os::unix::fs::symlink(host, &tmp)
        .map_err(|e| fail(module, &tmp, format!("cannot link mount: {e}")))?;
    fs::rename(&tmp, &path).map_err(|e| fail(module, &path, format!("cannot link mount: {e}")))
}

/// Creates `dir` (mode 0700) if missing; refuses a link or a file in its place.
fn ensure_real_dir(module: &str, dir: &Path) -> Result<(), LayoutError> {
    match fs::symlink_metadata(dir) {
        Ok(m) if m.is_dir() => Ok(()),
        Ok(_) => Err(fail(
            module,
            dir,
            "is a link or a file where a directory was expected; refusing to follow it".into(),
        )),
        Err(e) if e.kind() == ErrorKind::NotFound => fs::DirBuilder::new()
            .mode(dir_mode)
            .create(dir)
            .map_err(|e| fail(module, dir, format!("cannot create directory: {e}"))),
        Err(e) => Err(fail(module, dir, e.to_string())),
    }
}

fn create_mount_dir(module: &str, host: &Path) -> Result<(), LayoutError> {
    if let Some(parent) = host.parent() {
        fs::DirBuilder::new()
            .recursive(true)
            .mode(mount_parent_mode)
            .create(parent)
            .map_err(|e| fail(module, parent, format!("cannot create mount parent: {e}")))?;
    }
    match fs::DirBuilder::new().mode(mount_dir_mode).create(host) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == ErrorKind::AlreadyExists && host.is_dir() => Ok(()),
        Err(e) => Err(fail(module, host, format!("cannot create mount: {e}"))),
    }
}

/// `grants.toml` as the host writes it for `module`.
fn grants_text(module: &DeclaredModule, path: &Path) -> Result<String, LayoutError> {
    let mut file = GrantsFile { grant: Vec::new() };
    for g in &module.grants {
        file.grant.push(GrantEntry {
            id: &g.id,
            kind: &g.kind,
            consumer: g.consumer.to_string(),
            name: &g.name,
            secret_blake3: &g.secret_blake3,
        });
    }
    toml::to_string(&file)
        .map_err(|e| fail(&module.name, path, format!("cannot encode grants: {e}")))
}

/// `provisions.toml` as the host writes it for `module`.
fn provisions_text(module: &DeclaredModule, path: &Path) -> Result<String, LayoutError> {
    let mut file = ProvisionsFile {
        provision: Vec::new(),
    };
    for p in &module.provisions {
        file.provision.push(ProvisionEntry {
            id: &p.id,
            kind: &p.kind,
            provider: p.provider.to_string(),
            name: &p.name,
            endpoint: p.endpoint.as_deref(),
            secret_file: format!("secrets/{}", p.id),
        });
    }
    toml::to_string(&file)
        .map_err(|e| fail(&module.name, path, format!("cannot encode provisions: {e}")))
}

fn fail(module: &str, path: &Path, problem: String) -> LayoutError {
    LayoutError {
        module: module.to_string(),
        path: path.to_path_buf(),
        problem,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn write_inside_refuses_to_pass_through_a_symlink() {
        let dir = tempfile::tempdir().expect("tempdir");
        let outside = tempfile::tempdir().expect("tempdir");
        std::os::unix::fs::symlink(outside.path(), dir.path().join("conf")).expect("link");
        let got = write_inside("web", dir.path(), "conf/app.toml", b"x", file_mode);
        assert!(got.is_err());
        assert!(!outside.path().join("app.toml").exists());
    }

    #[test]
    fn write_inside_replaces_a_final_symlink_instead_of_following_it() {
        let dir = tempfile::tempdir().expect("tempdir");
        let outside = tempfile::tempdir().expect("tempdir");
        let victim = outside.path().join("victim");
        fs::write(&victim, b"keep").expect("victim");
        std::os::unix::fs::symlink(&victim, dir.path().join("app.toml")).expect("link");
        write_inside("web", dir.path(), "app.toml", b"new", file_mode).expect("write");
        assert_eq!(fs::read(&victim).expect("read"), b"keep");
        assert_eq!(fs::read(dir.path().join("app.toml")).expect("read"), b"new");
    }
}
