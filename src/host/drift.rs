//! Drift (issue 25 item 3, decision 0305): does a module run what the declaration the host applied
//! says? [`differs`] decides it, purely, from what was written and started (expected) and what is
//! on the machine now (seen); the functions below it only gather those facts, with bounded reads.
//!
//! What is checked, per module, on every reconcile: every file the host wrote (declared files,
//! provision secrets, `provisions.toml`, `grants.toml`: content by length and blake3, and no
//! permission wider than the host gave), every mount (the link in the module's directory and the
//! directory it points to), and the program its command names (blake3 of the file at apply,
//! at each start, and now). Command, args and env are not read back from `/proc`: the supervisor
//! passes exactly the declared ones at every start, and programs rewrite their own argv
//! (postgres, nginx) and wrapper scripts `exec` with other environments, which would read as
//! drift when nothing drifted.
//!
//! Cost per module and reconcile: one `lstat` per file and mount (at most `module_entries_max`),
//! the files whose length matches read once and hashed (together at most the declaration's size,
//! `declaration_bytes_max`), one `stat` of the program, hashed again only when its size, inode,
//! mtime or ctime moved (at most [`program_digest_bytes_max`]).

use std::fs;
use std::io::{ErrorKind, Read};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

/// Largest program file hashed; a larger one is compared by its identity (device, inode, size,
/// mtime, ctime) only.
pub const program_digest_bytes_max: u64 = 256 * 1024 * 1024;

/// A file the host wrote: where (relative to the module's directory), its bytes' length and
/// blake3, and the permission bits it was given.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExpectedFile {
    pub path: String,
    pub len: u64,
    pub digest: [u8; 32],
    pub mode: u32,
}

impl ExpectedFile {
    pub fn of(path: &str, bytes: &[u8], mode: u32) -> ExpectedFile {
        ExpectedFile {
            path: path.to_string(),
            len: bytes.len() as u64,
            digest: *blake3::hash(bytes).as_bytes(),
            mode,
        }
    }
}

/// What is at a written file's path now.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FileSeen {
    Missing,
    /// A directory, a link or anything but a regular file.
    NotAFile,
    Unreadable(String),
    /// Its length, its blake3 when the length is the expected one (else not read), its mode.
    File {
        len: u64,
        digest: Option<[u8; 32]>,
        mode: u32,
    },
}

/// A mount: its link in the module's directory and the host directory it must point to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExpectedMount {
    pub target: String,
    pub host: PathBuf,
}

/// What is at a mount now.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MountSeen {
    /// The link points to the host directory, which is a directory.
    Linked,
    /// The link is gone, or something else is in its place.
    LinkMissing,
    /// The link points elsewhere.
    LinkElsewhere,
    /// The host directory is gone or is not a directory.
    DirMissing,
}

/// A program file's identity and content: blake3 when within [`program_digest_bytes_max`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Fingerprint {
    pub identity: (u64, u64, u64, i64, i64, i64, i64),
    pub digest: Option<[u8; 32]>,
}

impl Fingerprint {
    /// The same program: equal digests when both have one, else the same file unchanged.
    pub fn same(&self, other: &Fingerprint) -> bool {
        match (self.digest, other.digest) {
            (Some(a), Some(b)) => a == b,
            _ => self.identity == other.identity,
        }
    }
}

/// The program of a module: what its command named when the declaration was applied (its first
/// start under it), when the running process started, and now.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ProgramSeen {
    pub command: String,
    pub applied: Option<Fingerprint>,
    pub running: Option<Fingerprint>,
    /// `Err` when the command's file cannot be found or read now.
    pub now: Option<Result<Fingerprint, String>>,
}

/// What differs between a module's expected and seen facts, one short text each, in a stable
/// order (files, mounts, program): empty when it runs as declared. Pure.
pub fn differs(
    files: &[(ExpectedFile, FileSeen)],
    mounts: &[(ExpectedMount, MountSeen)],
    program: &ProgramSeen,
) -> Vec<String> {
    let mut out = Vec::new();
    for (want, seen) in files {
        let path = &want.path;
        match seen {
            FileSeen::Missing => out.push(format!("{path} missing")),
            FileSeen::NotAFile => out.push(format!("{path} is not a file")),
            FileSeen::Unreadable(_) => out.push(format!("{path} unreadable")),
            FileSeen::File { len, digest, mode } => {
                if *len != want.len || *digest != Some(want.digest) {
                    out.push(format!("{path} changed"));
                } else if mode & 0o7777 & !want.mode != 0 {
                    // Narrower than written is the host's umask at work; wider is someone's chmod.
                    out.push(format!(
                        "{path} mode {:o}, wider than {:o}",
                        mode & 0o7777,
                        want.mode
                    ));
                }
            }
        }
    }
    for (want, seen) in mounts {
        let target = &want.target;
        match seen {
            MountSeen::Linked => {}
            MountSeen::LinkMissing => out.push(format!("mount {target} missing")),
            MountSeen::LinkElsewhere => out.push(format!("mount {target} points elsewhere")),
            MountSeen::DirMissing => out.push(format!("mount {target}'s directory missing")),
        }
    }
    let name = Path::new(&program.command)
        .file_name()
        .map_or(program.command.clone(), |n| {
            n.to_string_lossy().into_owned()
        });
    if let Some(applied) = &program.applied {
        match &program.now {
            Some(Ok(now)) if !now.same(applied) => out.push(format!("program {name} replaced")),
            Some(Err(_)) => out.push(format!("program {name} missing")),
            Some(Ok(_)) | None => {}
        }
        if program.running.as_ref().is_some_and(|r| !r.same(applied)) {
            out.push(format!("process runs another {name}"));
        }
    }
    out
}

/// What is at `dir/want.path` now: never follows a link, reads only a file of the expected length,
/// at most that many bytes and one more.
pub fn see_file(dir: &Path, want: &ExpectedFile) -> FileSeen {
    let path = dir.join(&want.path);
    let meta = match fs::symlink_metadata(&path) {
        Ok(meta) => meta,
        Err(e) if e.kind() == ErrorKind::NotFound => return FileSeen::Missing,
        Err(e) => return FileSeen::Unreadable(e.to_string()),
    };
    if !meta.file_type().is_file() {
        return FileSeen::NotAFile;
    }
    let (len, mode) = (meta.len(), meta.mode());
    if len != want.len {
        return FileSeen::File {
            len,
            digest: None,
            mode,
        };
    }
    let file = fs::OpenOptions::new()
        .read(true)
        .custom_flags(nix::libc::O_NOFOLLOW)
        .open(&path);
    match file.and_then(|f| hash_reader(f.take(want.len + 1))) {
        Ok(digest) => FileSeen::File {
            len,
            digest: Some(digest),
            mode,
        },
        Err(e) => FileSeen::Unreadable(e.to_string()),
    }
}

/// What is at a mount now.
pub fn see_mount(dir: &Path, want: &ExpectedMount) -> MountSeen {
    let link = dir.join(&want.target);
    match fs::symlink_metadata(&link) {
        Ok(m) if m.file_type().is_symlink() => {}
        Ok(_) | Err(_) => return MountSeen::LinkMissing,
    }
    if fs::read_link(&link).map_or(true, |to| to != want.host) {
        return MountSeen::LinkElsewhere;
    }
    match fs::metadata(&want.host) {
        Ok(m) if m.is_dir() => MountSeen::Linked,
        Ok(_) | Err(_) => MountSeen::DirMissing,
    }
}

/// The file a command runs: an absolute path as is, a path with a `/` from the module's
/// directory (the child starts there), a bare name from the module's `PATH` (as `execvp` does).
pub fn resolve_command(command: &str, dir: &Path, path_var: Option<&str>) -> Option<PathBuf> {
    if command.contains('/') {
        return Some(dir.join(command));
    }
    for entry in path_var?.split(':') {
        let candidate = Path::new(entry).join(command);
        if fs::metadata(&candidate).is_ok_and(|m| m.is_file()) {
            return Some(candidate);
        }
    }
    None
}

/// The fingerprint of the program at `path`, reusing `known`'s digest when the file's identity
/// has not moved (so an unchanged program is stat'ed, not read, on every reconcile).
pub fn fingerprint(path: &Path, known: Option<&Fingerprint>) -> Result<Fingerprint, String> {
    let meta = fs::metadata(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let identity = (
        meta.dev(),
        meta.ino(),
        meta.len(),
        meta.mtime(),
        meta.mtime_nsec(),
        meta.ctime(),
        meta.ctime_nsec(),
    );
    if let Some(known) = known
        && known.identity == identity
    {
        return Ok(known.clone());
    }
    let digest = match meta.len() <= program_digest_bytes_max {
        true => {
            let file = fs::File::open(path).map_err(|e| format!("{}: {e}", path.display()))?;
            let bounded = file.take(program_digest_bytes_max);
            Some(hash_reader(bounded).map_err(|e| format!("{}: {e}", path.display()))?)
        }
        false => None,
    };
    Ok(Fingerprint { identity, digest })
}

fn hash_reader(reader: impl Read) -> std::io::Result<[u8; 32]> {
    let mut hasher = blake3::Hasher::new();
    hasher.update_reader(reader)?;
    Ok(*hasher.finalize().as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seen_as_written(want: &ExpectedFile) -> FileSeen {
        FileSeen::File {
            len: want.len,
            digest: Some(want.digest),
            mode: 0o100_000 | want.mode,
        }
    }

    fn print(id: u64, digest: u8) -> Fingerprint {
        Fingerprint {
            identity: (1, id, 10, 0, 0, 0, 0),
            digest: Some([digest; 32]),
        }
    }

    #[test]
    fn a_module_as_written_and_started_has_no_drift_and_a_narrower_mode_is_not_drift() {
        // Decision 0305: only a difference is reported; the host's umask narrowing a mode is not.
        let conf = ExpectedFile::of("conf/broker.conf", b"port = 5672\n", 0o640);
        let narrower = FileSeen::File {
            len: conf.len,
            digest: Some(conf.digest),
            mode: 0o100_600,
        };
        let mount = ExpectedMount {
            target: "data".into(),
            host: "/srv/broker".into(),
        };
        let program = ProgramSeen {
            command: "/opt/broker/run.sh".into(),
            applied: Some(print(1, 1)),
            running: Some(print(1, 1)),
            now: Some(Ok(print(1, 1))),
        };
        let files = [(conf.clone(), seen_as_written(&conf)), (conf, narrower)];
        assert!(differs(&files, &[(mount, MountSeen::Linked)], &program).is_empty());
    }

    #[test]
    fn every_kind_of_drift_is_named_in_order() {
        // Issue 25 item 3: files, secrets, grants, mounts and the program, each named.
        let conf = ExpectedFile::of("conf/broker.conf", b"port = 5672\n", 0o640);
        let edited = FileSeen::File {
            len: conf.len,
            digest: Some([9; 32]),
            mode: 0o100_640,
        };
        let secret = ExpectedFile::of("secrets/p1", b"s3cret", 0o600);
        let wider = FileSeen::File {
            len: secret.len,
            digest: Some(secret.digest),
            mode: 0o100_644,
        };
        let grants = ExpectedFile::of("grants.toml", b"[[grant]]\n", 0o640);
        let longer = FileSeen::File {
            len: grants.len + 1,
            digest: None,
            mode: 0o100_640,
        };
        let gone = ExpectedFile::of("conf/extra.conf", b"x", 0o640);
        let mount = |t: &str| ExpectedMount {
            target: t.into(),
            host: "/srv/x".into(),
        };
        let program = ProgramSeen {
            command: "/opt/broker/run.sh".into(),
            applied: Some(print(1, 1)),
            running: Some(print(2, 2)),
            now: Some(Ok(print(2, 2))),
        };
        let got = differs(
            &[
                (conf, edited),
                (secret, wider),
                (grants, longer),
                (gone, FileSeen::Missing),
            ],
            &[
                (mount("data"), MountSeen::LinkMissing),
                (mount("logs"), MountSeen::LinkElsewhere),
                (mount("cache"), MountSeen::DirMissing),
            ],
            &program,
        );
        assert_eq!(
            got,
            [
                "conf/broker.conf changed",
                "secrets/p1 mode 644, wider than 600",
                "grants.toml changed",
                "conf/extra.conf missing",
                "mount data missing",
                "mount logs points elsewhere",
                "mount cache's directory missing",
                "program run.sh replaced",
                "process runs another run.sh",
            ]
        );
    }

    #[test]
    fn a_program_put_back_is_still_drift_while_the_process_runs_the_replacement() {
        // Killed and replaced (decision 0305): the supervisor restarted the module from another
        // file; putting the file back does not change what runs until a push restarts it.
        let program = ProgramSeen {
            command: "run.sh".into(),
            applied: Some(print(1, 1)),
            running: Some(print(2, 2)),
            now: Some(Ok(print(3, 1))),
        };
        assert_eq!(differs(&[], &[], &program), ["process runs another run.sh"]);
        let touched = ProgramSeen {
            running: Some(print(4, 1)),
            ..program.clone()
        };
        assert!(
            differs(&[], &[], &touched).is_empty(),
            "same content, new inode"
        );
        let missing = ProgramSeen {
            now: Some(Err("gone".into())),
            running: Some(print(1, 1)),
            ..program
        };
        assert_eq!(differs(&[], &[], &missing), ["program run.sh missing"]);
    }

    #[test]
    fn seeing_files_reads_back_content_mode_and_never_follows_a_link() {
        let dir = tempfile::tempdir().expect("tempdir");
        let want = ExpectedFile::of("a.conf", b"one", 0o640);
        assert_eq!(see_file(dir.path(), &want), FileSeen::Missing);
        fs::write(dir.path().join("a.conf"), b"one").expect("write");
        let FileSeen::File { digest, .. } = see_file(dir.path(), &want) else {
            panic!("a file")
        };
        assert_eq!(digest, Some(want.digest));
        fs::write(dir.path().join("a.conf"), b"two").expect("write");
        let FileSeen::File { digest, .. } = see_file(dir.path(), &want) else {
            panic!("a file")
        };
        assert_ne!(digest, Some(want.digest));
        fs::remove_file(dir.path().join("a.conf")).expect("rm");
        fs::write(dir.path().join("b"), b"one").expect("write");
        std::os::unix::fs::symlink(dir.path().join("b"), dir.path().join("a.conf")).expect("ln");
        assert_eq!(see_file(dir.path(), &want), FileSeen::NotAFile);
    }
}
