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

/// Replaces `path` with `bytes` atomically and durably; the file is created with `mode`.
pub fn write_atomic(path: &Path, bytes: &[u8], mode: u32) -> Result<(), StorageError> {
    let tmp = temp_path(path);
    // A leftover temp file from a crash may carry an older mode; start from nothing.
    remove_if_present(&tmp)?;
    let mut file = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .custom_flags(nix::libc::O_NOFOLLOW)
        .open(&tmp)
        .map_err(|e| StorageError::new("create", &tmp, e))?;
    file.write_all(bytes)
        .map_err(|e| StorageError::new("write", &tmp, e))?;
    file.sync_all()
        .map_err(|e| StorageError::new("fsync", &tmp, e))?;
    drop(file);
    fs::rename(&tmp, path).map_err(|e| StorageError::new("rename over", path, e))?;
    sync_parent(path)
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
}
