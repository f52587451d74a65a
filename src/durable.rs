//! Durable small files: written to a temp file, fsync'd, renamed over the old one and the directory
//! fsync'd, so a crash leaves either the old content or the new, never a torn mix.

use std::fs::{self, File, OpenOptions};
use std::io::{ErrorKind, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

/// A storage operation that failed. The host cannot keep its promises without its disk, so callers
/// treat this as fatal.
#[derive(Debug, thiserror::Error)]
#[error("{op} {path}: {source}; check the disk and the permissions of the host's root directory")]
pub struct StorageError {
    pub op: &'static str,
    pub path: PathBuf,
    #[source]
    pub source: std::io::Error,
}

impl StorageError {
    pub fn new(op: &'static str, path: &Path, source: std::io::Error) -> StorageError {
        StorageError {
            op,
            path: path.to_path_buf(),
            source,
        }
    }
}

/// Mode of every file holding a secret or a private key: the owner alone reads it.
pub const secret_file_mode: u32 = 0o600;

/// Mode of every directory mesh creates to hold such files.
pub const secret_dir_mode: u32 = 0o700;

/// A file being written beside its final path (`.<name>.mesh-tmp`, created with its final mode, so
/// it is never wider, even briefly); [`Staged::commit`] or [`Staged::commit_new`] makes it appear
/// whole. Dropped uncommitted, the temp file is removed.
pub struct Staged {
    tmp: PathBuf,
    path: PathBuf,
    file: Option<File>,
}

impl Staged {
    pub fn create(path: &Path, mode: u32) -> Result<Staged, StorageError> {
        let tmp = temp_path(path);
        // A leftover temp file from a crash may carry an older mode; start from nothing.
        remove_if_present(&tmp)?;
        let file = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(mode)
            .custom_flags(nix::libc::O_NOFOLLOW)
            .open(&tmp)
            .map_err(|e| StorageError::new("create", &tmp, e))?;
        Ok(Staged {
            tmp,
            path: path.to_path_buf(),
            file: Some(file),
        })
    }

    pub fn write_all(&mut self, bytes: &[u8]) -> Result<(), StorageError> {
        let Some(file) = self.file.as_mut() else {
            return Err(StorageError::new("write", &self.tmp, closed()));
        };
        file.write_all(bytes)
            .map_err(|e| StorageError::new("write", &self.tmp, e))
    }

    /// fsyncs the temp file and renames it over `path`, then fsyncs the directory.
    pub fn commit(mut self) -> Result<(), StorageError> {
        self.sync()?;
        fs::rename(&self.tmp, &self.path)
            .map_err(|e| StorageError::new("rename over", &self.path, e))?;
        sync_parent(&self.path)
    }

    /// As [`Staged::commit`], but never replaces an existing `path`: the content appears under
    /// `path` by a hard link, which fails with `AlreadyExists` when something is there.
    pub fn commit_new(mut self) -> Result<(), StorageError> {
        self.sync()?;
        let linked = fs::hard_link(&self.tmp, &self.path);
        remove_if_present(&self.tmp)?;
        linked.map_err(|e| StorageError::new("create", &self.path, e))?;
        sync_parent(&self.path)
    }

    fn sync(&mut self) -> Result<(), StorageError> {
        let Some(file) = self.file.take() else {
            return Err(StorageError::new("fsync", &self.tmp, closed()));
        };
        file.sync_all()
            .map_err(|e| StorageError::new("fsync", &self.tmp, e))
    }
}

impl Drop for Staged {
    fn drop(&mut self) {
        if self.file.is_some() {
            // allow(empty-on-error): an abandoned temp file is removed at the next write anyway
            let _ = fs::remove_file(&self.tmp);
        }
    }
}

fn closed() -> std::io::Error {
    std::io::Error::other("the staged file was already committed; this is a bug, report it")
}

/// Replaces `path` with `bytes` atomically and durably; the file is created with `mode`.
pub fn write_atomic(path: &Path, bytes: &[u8], mode: u32) -> Result<(), StorageError> {
    let mut staged = Staged::create(path, mode)?;
    staged.write_all(bytes)?;
    staged.commit()
}

/// Creates `path` with `bytes` atomically and durably, with `mode`; refuses (`AlreadyExists`) to
/// replace an existing file.
pub fn write_new(path: &Path, bytes: &[u8], mode: u32) -> Result<(), StorageError> {
    let mut staged = Staged::create(path, mode)?;
    staged.write_all(bytes)?;
    staged.commit_new()
}

/// Reads `path`, or `None` when it does not exist. Any other failure is an error, never "empty".
pub fn read_optional(path: &Path) -> Result<Option<Vec<u8>>, StorageError> {
    match fs::read(path) {
        Ok(bytes) => Ok(Some(bytes)),
        Err(e) if e.kind() == ErrorKind::NotFound => Ok(None),
        Err(e) => Err(StorageError::new("read", path, e)),
    }
}

/// Creates `dir` and its missing parents with `mode` (existing ones keep theirs).
pub fn create_dir(dir: &Path, mode: u32) -> Result<(), StorageError> {
    fs::DirBuilder::new()
        .recursive(true)
        .mode(mode)
        .create(dir)
        .map_err(|e| StorageError::new("create directory", dir, e))
}

/// A directory that holds secrets but lets group or others in: mesh does not chmod a directory it
/// did not create (decision 0296), it says so.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LooseDir {
    pub dir: PathBuf,
    pub mode: u32,
}

impl std::fmt::Display for LooseDir {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} holds secrets but is mode {:o}: others can list the names in it (the files themselves are 0600); run `chmod 700 {}` to close it",
            self.dir.display(),
            self.mode,
            self.dir.display()
        )
    }
}

/// Makes `dir` a home for secrets: created 0700 (with any missing parents) when absent; when it
/// already exists it is left as it is, and a mode wider than 0700 comes back as a [`LooseDir`]
/// for the caller to warn about.
pub fn private_dir(dir: &Path) -> Result<Option<LooseDir>, StorageError> {
    match fs::metadata(dir) {
        Ok(meta) => Ok(loose(dir, &meta)),
        Err(e) if e.kind() == ErrorKind::NotFound => {
            create_dir(dir, secret_dir_mode)?;
            Ok(None)
        }
        Err(e) => Err(StorageError::new("read the mode of", dir, e)),
    }
}

/// The warning for `dir` when its mode lets group or others in.
pub fn loose_dir(dir: &Path) -> Result<Option<LooseDir>, StorageError> {
    let meta = fs::metadata(dir).map_err(|e| StorageError::new("read the mode of", dir, e))?;
    Ok(loose(dir, &meta))
}

fn loose(dir: &Path, meta: &fs::Metadata) -> Option<LooseDir> {
    use std::os::unix::fs::PermissionsExt;
    let mode = meta.permissions().mode() & 0o7777;
    (mode & 0o077 != 0).then(|| LooseDir {
        dir: dir.to_path_buf(),
        mode,
    })
}

/// Removes a file if it exists.
pub fn remove_if_present(path: &Path) -> Result<(), StorageError> {
    match fs::remove_file(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == ErrorKind::NotFound => Ok(()),
        Err(e) => Err(StorageError::new("remove", path, e)),
    }
}

/// fsyncs the directory holding `path`, so a rename into it survives a crash.
pub fn sync_parent(path: &Path) -> Result<(), StorageError> {
    let dir = path.parent().unwrap_or(Path::new("."));
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| StorageError::new("fsync directory", dir, e))
}

/// `.<name>.mesh-tmp` beside `path`: hidden, and unlikely to be a name anyone declares.
pub fn temp_path(path: &Path) -> PathBuf {
    let mut name = std::ffi::OsString::from(".");
    // allow(empty-on-error): no file name (`/`, `..`): still a hidden name
    name.push(path.file_name().unwrap_or_default());
    name.push(".mesh-tmp");
    path.with_file_name(name)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn atomic_write_replaces_content_with_the_given_mode_despite_a_leftover_temp() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("mark");
        fs::write(temp_path(&path), b"torn").expect("leftover");
        write_atomic(&path, b"one", 0o600).expect("write");
        write_atomic(&path, b"two", 0o600).expect("write");
        assert_eq!(fs::read(&path).expect("read"), b"two");
        let mode = fs::metadata(&path).expect("meta").permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        assert_eq!(read_optional(&dir.path().join("none")).expect("read"), None);
    }

    #[test]
    fn write_new_never_replaces_and_leaves_no_temp_file() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("key");
        write_new(&path, b"one", secret_file_mode).expect("write");
        let again = write_new(&path, b"two", secret_file_mode).expect_err("exists");
        assert_eq!(again.source.kind(), ErrorKind::AlreadyExists);
        assert_eq!(fs::read(&path).expect("read"), b"one");
        assert!(!temp_path(&path).exists());
        let mode = fs::metadata(&path).expect("meta").permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
    }

    #[test]
    fn private_dir_creates_0700_and_reports_an_existing_wider_one_untouched() {
        let dir = tempfile::tempdir().expect("tempdir");
        let made = dir.path().join("a").join("b");
        assert_eq!(private_dir(&made).expect("create"), None);
        for d in [dir.path().join("a"), made] {
            let mode = fs::metadata(&d).expect("meta").permissions().mode() & 0o777;
            assert_eq!(mode, 0o700, "{}", d.display());
        }
        let wide = dir.path().join("wide");
        fs::create_dir(&wide).expect("mkdir");
        fs::set_permissions(&wide, fs::Permissions::from_mode(0o755)).expect("chmod");
        let warned = private_dir(&wide).expect("check").expect("loose");
        assert_eq!(warned.mode, 0o755);
        assert!(warned.to_string().contains("chmod 700"), "{warned}");
        let mode = fs::metadata(&wide).expect("meta").permissions().mode() & 0o777;
        assert_eq!(mode, 0o755, "an existing directory is not chmodded");
    }
}
