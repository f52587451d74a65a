//! A module's stdout and stderr, appended to size-capped log files: when a file reaches
//! [`log_bytes_max`] it becomes `<file>.1` (replacing the older one) and a fresh file starts, so a
//! chatty module costs at most twice the cap per stream.

use std::path::{Path, PathBuf};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};

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

#[cfg(test)]
mod tests {
    use super::*;

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
