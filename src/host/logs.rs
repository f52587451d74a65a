//! A module's stdout and stderr, appended to size-capped log files: when a file reaches
//! [`log_bytes_max`] it becomes `<file>.1` (replacing the older one) and a fresh file starts, so a
//! chatty module costs at most twice the cap per stream. [`answer`] reads them back for
//! `meshctl logs` (a replica asks over QUIC, `MessageKind::Logs`): the tail of each stream, or the
//! lines after a cursor, bounded in lines and bytes, only for modules of the declaration in force,
//! only from `<root>/logs/`, never through a symlink.

use std::io::{Read, Seek, SeekFrom};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};

use crate::core::wire::{
    LogChunk, LogCursor, LogStream, LogsAnswer, LogsAsk, log_answer_bytes_max, log_cursors_max,
    log_line_bytes_max, log_lines_max,
};

/// Size at which a module's log file is rotated, in bytes.
pub const log_bytes_max: u64 = 4 * 1024 * 1024;
/// Size of one read from a module's pipe, in bytes.
const chunk_bytes: usize = 8 * 1024;
/// Mode of log files: a module may print what only its owner should read.
const log_file_mode: u32 = 0o600;

/// Copies `stream` into the capped log at `path` until the stream closes. Log trouble is logged
/// and ends the copy; it never stops the module (the pipe then closes, and the module sees EPIPE
/// only if it writes again).
pub async fn capture<R: AsyncRead + Unpin>(module: String, path: PathBuf, mut stream: R) {
    let mut file = match open_append(&path).await {
        Ok(f) => f,
        Err(e) => {
            tracing::warn!(module, path = %path.display(), error = %e, "cannot open module log");
            return;
        }
    };
    let mut size = file.metadata().await.map(|m| m.len()).unwrap_or(0);
    let mut buf = vec![0u8; chunk_bytes];
    loop {
        let n = match stream.read(&mut buf).await {
            Ok(0) => return,
            Ok(n) => n,
            Err(e) => {
                tracing::warn!(module, error = %e, "reading module output failed");
                return;
            }
        };
        if size + n as u64 > log_bytes_max {
            match rotate(&path).await {
                Ok(f) => {
                    file = f;
                    size = 0;
                }
                Err(e) => {
                    tracing::warn!(module, path = %path.display(), error = %e, "cannot rotate module log");
                    return;
                }
            }
        }
        // tokio's File writes in the background; flush so a rotation or the end sees every byte.
        let written = match file.write_all(&buf[..n]).await {
            Ok(()) => file.flush().await,
            Err(e) => Err(e),
        };
        if let Err(e) = written {
            tracing::warn!(module, path = %path.display(), error = %e, "cannot write module log");
            return;
        }
        size += n as u64;
    }
}

async fn open_append(path: &Path) -> std::io::Result<tokio::fs::File> {
    tokio::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .mode(log_file_mode)
        .open(path)
        .await
}

async fn rotate(path: &Path) -> std::io::Result<tokio::fs::File> {
    let mut old = path.as_os_str().to_os_string();
    old.push(".1");
    tokio::fs::rename(path, &old).await?;
    open_append(path).await
}

/// The smallest byte budget one stream gets in an answer, however many streams are asked for.
pub const log_chunk_bytes_min: u64 = 4 * 1024;

/// Why a log request was not answered. Each says what to do.
#[derive(Debug, thiserror::Error)]
pub enum LogsError {
    #[error("machine {machine} runs no module `{module}`; its modules: {known}")]
    NoModule {
        machine: String,
        module: String,
        known: String,
    },
    #[error("asked for {lines} lines; ask for 1 to {log_lines_max}")]
    Lines { lines: u32 },
    #[error("{count} cursors in one ask, at most {log_cursors_max}; ask for one module")]
    Cursors { count: usize },
    #[error("cannot read the log {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
}

/// Answers `ask` from the logs under `root` (the host's state directory) for `machine`, whose
/// declaration in force runs `modules`. Blocking file reads: call it off the async threads.
pub fn answer(
    root: &Path,
    machine: &str,
    modules: &[String],
    ask: &LogsAsk,
) -> Result<LogsAnswer, LogsError> {
    if ask.lines == 0 || ask.lines > log_lines_max {
        return Err(LogsError::Lines { lines: ask.lines });
    }
    if ask.from.len() > log_cursors_max {
        return Err(LogsError::Cursors {
            count: ask.from.len(),
        });
    }
    let known = || {
        if modules.is_empty() {
            "none (nothing applied yet)".to_string()
        } else {
            modules.join(", ")
        }
    };
    let runs = |name: &str| modules.iter().any(|m| m == name) && plain_name(name);
    let missing = |name: &str| LogsError::NoModule {
        machine: machine.to_string(),
        module: name.to_string(),
        known: known(),
    };
    let mut asked: Vec<&str> = match &ask.module {
        Some(name) if !runs(name) => return Err(missing(name)),
        Some(name) => vec![name.as_str()],
        None => modules
            .iter()
            .map(String::as_str)
            .filter(|m| plain_name(m))
            .collect(),
    };
    asked.sort_unstable();
    asked.dedup();
    // Following every module, one that left the declaration is no longer read; following one
    // module, a cursor for another is a mistake.
    if ask.module.is_some()
        && let Some(stray) = ask
            .from
            .iter()
            .find(|c| !asked.contains(&c.module.as_str()))
    {
        return Err(missing(&stray.module));
    }
    let streams = (asked.len() as u64 * 2).max(1);
    let budget = (log_answer_bytes_max / streams).max(log_chunk_bytes_min);
    let dir = root.join("logs");
    let mut chunks = Vec::new();
    for module in asked {
        for stream in [LogStream::Stdout, LogStream::Stderr] {
            let path = dir.join(format!("{module}.{}.log", stream.word()));
            let cursor = ask
                .from
                .iter()
                .find(|c: &&LogCursor| c.module == module && c.stream == stream);
            let read = match cursor {
                None => tail(&path, ask.lines, budget),
                Some(c) => after(&path, c.offset, ask.lines, budget),
            }
            .map_err(|source| LogsError::Read {
                path: path.clone(),
                source,
            })?;
            chunks.push(LogChunk {
                module: module.to_string(),
                stream,
                start: read.start,
                end: read.end,
                lines: read.lines,
                more: read.more,
                rotated: read.rotated,
            });
        }
    }
    Ok(LogsAnswer {
        machine: machine.to_string(),
        chunks,
    })
}

/// A name that stays one path component inside the logs directory. Declared module names are
/// already checked by the model's rules; this holds even if one were not.
fn plain_name(name: &str) -> bool {
    !name.is_empty()
        && name != "."
        && name != ".."
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
}

/// What one read of a stream found.
#[derive(Debug, Default, PartialEq)]
struct Found {
    start: u64,
    end: u64,
    lines: Vec<String>,
    more: bool,
    rotated: bool,
}

/// Opens a log file for reading without following a symlink; `None` when there is none yet.
fn open(path: &Path) -> std::io::Result<Option<(std::fs::File, u64)>> {
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(nix::libc::O_NOFOLLOW)
        .open(path);
    let file = match file {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    let meta = file.metadata()?;
    if !meta.is_file() {
        return Err(std::io::Error::other("not a regular file"));
    }
    Ok(Some((file, meta.len())))
}

fn read_range(file: &mut std::fs::File, from: u64, len: u64) -> std::io::Result<Vec<u8>> {
    file.seek(SeekFrom::Start(from))?;
    let mut buf = Vec::with_capacity(usize::try_from(len).unwrap_or(0));
    file.take(len).read_to_end(&mut buf)?;
    Ok(buf)
}

/// One line as text: lossy UTF-8, cut at [`log_line_bytes_max`].
fn line_text(bytes: &[u8]) -> String {
    let bytes = bytes.strip_suffix(b"\r").unwrap_or(bytes);
    let text = String::from_utf8_lossy(bytes);
    if text.len() <= log_line_bytes_max {
        return text.into_owned();
    }
    let mut cut = log_line_bytes_max;
    while !text.is_char_boundary(cut) {
        cut -= 1;
    }
    format!("{}…", &text[..cut])
}

/// The last `lines` complete lines within the last `budget` bytes.
fn tail(path: &Path, lines: u32, budget: u64) -> std::io::Result<Found> {
    let Some((mut file, size)) = open(path)? else {
        return Ok(Found::default());
    };
    let from = size.saturating_sub(budget);
    let buf = read_range(&mut file, from, size - from)?;
    // Starting mid-file, the first line is probably cut: skip it.
    let mut begin = 0;
    if from > 0 {
        match buf.iter().position(|b| *b == b'\n') {
            Some(nl) => begin = nl + 1,
            None => begin = buf.len(),
        }
    }
    let complete = buf.iter().rposition(|b| *b == b'\n').map_or(0, |nl| nl + 1);
    let body = if complete > begin {
        &buf[begin..complete]
    } else {
        &[][..]
    };
    let mut offsets = Vec::new();
    let mut at = 0;
    for line in body.split_inclusive(|b| *b == b'\n') {
        offsets.push((at, line));
        at += line.len();
    }
    let keep = offsets.len().saturating_sub(lines as usize);
    let kept = &offsets[keep..];
    let start = kept
        .first()
        .map_or(from + complete.max(begin) as u64, |(at, _)| {
            from + (begin + at) as u64
        });
    Ok(Found {
        start,
        end: from + complete.max(begin) as u64,
        lines: kept
            .iter()
            .map(|(_, l)| line_text(l.strip_suffix(b"\n").unwrap_or(l)))
            .collect(),
        more: false,
        rotated: false,
    })
}

/// Up to `lines` complete lines after byte `offset`, within `budget` bytes. A file shorter than
/// the cursor was rotated or truncated: read it from its start.
fn after(path: &Path, offset: u64, lines: u32, budget: u64) -> std::io::Result<Found> {
    let Some((mut file, size)) = open(path)? else {
        return Ok(Found {
            rotated: offset > 0,
            ..Found::default()
        });
    };
    let (offset, rotated) = if size < offset {
        (0, true)
    } else {
        (offset, false)
    };
    let len = (size - offset).min(budget);
    let buf = read_range(&mut file, offset, len)?;
    let mut out = Vec::new();
    let mut used = 0usize;
    let mut full = false;
    for line in buf.split_inclusive(|b| *b == b'\n') {
        if !line.ends_with(b"\n") {
            break;
        }
        if out.len() >= lines as usize {
            full = true;
            break;
        }
        out.push(line_text(&line[..line.len() - 1]));
        used += line.len();
    }
    if out.is_empty() && !buf.is_empty() && len == budget && !buf.contains(&b'\n') {
        // One line longer than the whole budget: hand it over cut, so the reader moves on.
        out.push(line_text(&buf));
        used = buf.len();
        full = true;
    }
    let end = offset + used as u64;
    let more = end < size && (full || len == budget);
    Ok(Found {
        start: offset,
        end,
        lines: out,
        more,
        rotated,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ask(module: Option<&str>, lines: u32, from: Vec<LogCursor>) -> LogsAsk {
        LogsAsk {
            module: module.map(String::from),
            lines,
            from,
        }
    }

    fn lines_of(answer: &LogsAnswer, stream: LogStream) -> Vec<String> {
        answer
            .chunks
            .iter()
            .filter(|c| c.stream == stream)
            .flat_map(|c| c.lines.clone())
            .collect()
    }

    #[test]
    fn a_tail_then_a_cursor_reads_every_line_once() {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::create_dir_all(dir.path().join("logs")).expect("logs");
        let out = dir.path().join("logs").join("db.stdout.log");
        std::fs::write(&out, "one\ntwo\nthree\npart").expect("write");
        let modules = vec!["db".to_string()];
        let first = answer(dir.path(), "ace", &modules, &ask(Some("db"), 2, vec![])).expect("tail");
        assert_eq!(lines_of(&first, LogStream::Stdout), ["two", "three"]);
        let end = first.chunks[0].end;
        assert_eq!(end, "one\ntwo\nthree\n".len() as u64);
        std::fs::write(&out, "one\ntwo\nthree\npartial\nfour\n").expect("write");
        let cursor = LogCursor {
            module: "db".into(),
            stream: LogStream::Stdout,
            offset: end,
        };
        let next = answer(
            dir.path(),
            "ace",
            &modules,
            &ask(Some("db"), 1, vec![cursor.clone()]),
        )
        .expect("follow");
        assert_eq!(lines_of(&next, LogStream::Stdout), ["partial"]);
        assert!(next.chunks[0].more, "{next:?}");
        let cursor = LogCursor {
            offset: next.chunks[0].end,
            ..cursor
        };
        let last = answer(
            dir.path(),
            "ace",
            &modules,
            &ask(Some("db"), 10, vec![cursor.clone()]),
        )
        .expect("follow");
        assert_eq!(lines_of(&last, LogStream::Stdout), ["four"]);
        assert!(!last.chunks[0].more);
        // Rotated: the file is shorter than the cursor, so it is read from its start.
        std::fs::write(&out, "fresh\n").expect("write");
        let cursor = LogCursor {
            offset: last.chunks[0].end,
            ..cursor
        };
        let after = answer(
            dir.path(),
            "ace",
            &modules,
            &ask(Some("db"), 10, vec![cursor]),
        )
        .expect("follow");
        assert_eq!(lines_of(&after, LogStream::Stdout), ["fresh"]);
        assert!(after.chunks[0].rotated);
    }

    #[test]
    fn only_modules_of_the_declaration_are_read_and_never_through_a_symlink() {
        let dir = tempfile::tempdir().expect("tempdir");
        let logs = dir.path().join("logs");
        std::fs::create_dir_all(&logs).expect("logs");
        let secret = dir.path().join("secret");
        std::fs::write(&secret, "do not show\n").expect("write");
        std::os::unix::fs::symlink(&secret, logs.join("db.stdout.log")).expect("symlink");
        let modules = vec!["db".to_string()];
        for name in ["web", "../secret", "..", "db/../../secret"] {
            let e = answer(dir.path(), "ace", &modules, &ask(Some(name), 5, vec![]))
                .expect_err("refused");
            assert!(
                e.to_string().contains("runs no module") && e.to_string().contains("db"),
                "{e}"
            );
        }
        let e =
            answer(dir.path(), "ace", &modules, &ask(Some("db"), 5, vec![])).expect_err("symlink");
        assert!(e.to_string().contains("db.stdout.log"), "{e}");
        // A module gone from the declaration: following every module goes on without it.
        let gone = LogCursor {
            module: "web".into(),
            stream: LogStream::Stdout,
            offset: 3,
        };
        let e = answer(
            dir.path(),
            "ace",
            &modules,
            &ask(Some("db"), 5, vec![gone.clone()]),
        )
        .expect_err("a cursor for another module");
        assert!(e.to_string().contains("`web`"), "{e}");
        std::fs::remove_file(logs.join("db.stdout.log")).expect("unlink");
        let all =
            answer(dir.path(), "ace", &modules, &ask(None, 5, vec![gone])).expect("without web");
        assert!(all.chunks.iter().all(|c| c.module == "db"), "{all:?}");
        let e = answer(dir.path(), "ace", &modules, &ask(None, 0, vec![])).expect_err("zero lines");
        assert!(e.to_string().contains("1 to"), "{e}");
    }

    #[test]
    fn an_answer_stays_within_its_byte_budget() {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::create_dir_all(dir.path().join("logs")).expect("logs");
        let line = "x".repeat(999);
        let text: String = (0..3000).map(|_| format!("{line}\n")).collect();
        std::fs::write(dir.path().join("logs").join("db.stdout.log"), &text).expect("write");
        let modules = vec!["db".to_string()];
        let cursor = LogCursor {
            module: "db".into(),
            stream: LogStream::Stdout,
            offset: 0,
        };
        let a = answer(
            dir.path(),
            "ace",
            &modules,
            &ask(None, log_lines_max, vec![cursor]),
        )
        .expect("read");
        let bytes: usize = a
            .chunks
            .iter()
            .flat_map(|c| &c.lines)
            .map(|l| l.len() + 1)
            .sum();
        assert!(bytes as u64 <= log_answer_bytes_max, "{bytes}");
        assert!(a.chunks[0].more, "3 MB cannot come in one answer");
        let t = answer(
            dir.path(),
            "ace",
            &modules,
            &ask(None, log_lines_max, vec![]),
        )
        .expect("tail");
        let bytes: usize = t
            .chunks
            .iter()
            .flat_map(|c| &c.lines)
            .map(|l| l.len() + 1)
            .sum();
        assert!(bytes as u64 <= log_answer_bytes_max && bytes > 0, "{bytes}");
    }

    #[tokio::test]
    async fn a_log_over_the_cap_rotates_and_stays_bounded() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("m.stdout.log");
        let total = (log_bytes_max as usize) * 2 + 100;
        let input = vec![b'x'; total];
        capture("m".into(), path.clone(), input.as_slice()).await;
        let now = std::fs::metadata(&path).expect("log").len();
        let old = std::fs::metadata(dir.path().join("m.stdout.log.1"))
            .expect("rotated")
            .len();
        assert!(now <= log_bytes_max && old <= log_bytes_max);
        assert!(now > 0);
    }
}
