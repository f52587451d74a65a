//! Reports to the controllers (G5). Each report takes the next `report_sequence`, persisted with
//! fsync before the report can leave, so the counter strictly increases across restarts. Reports
//! wait in an on-disk queue (bounded; the oldest dropped and counted) and go out in order through a
//! [`ReportSink`] whenever it answers.

use std::future::Future;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;
use tokio::sync::Mutex;

use super::durable::{self, StorageError};
use super::metrics::ReportCounters;
use crate::core::report::Report;

/// Most reports kept waiting for the sink; beyond it the oldest is dropped.
pub const report_queue_max: usize = 1000;
/// Longest a single delivery may take before the sink counts as unavailable.
pub const deliver_timeout_ms: u64 = 10_000;
/// Mode of the counter and queued reports.
const report_file_mode: u32 = 0o600;

/// Why a sink did not take a report.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SinkError {
    /// No controller could be reached; the report stays queued and is retried.
    #[error("no controller took the report: {0}")]
    Unavailable(String),
    /// A controller answered and refused this report; retrying it would not help, so it is dropped.
    #[error("a controller refused the report: {0}")]
    Rejected(String),
}

/// The future a sink returns: boxed, so the trait stays object safe without extra crates.
pub type SinkFuture<'a> = Pin<Box<dyn Future<Output = Result<(), SinkError>> + Send + 'a>>;

/// Where reports go: the controllers, once the transport is wired; a test double before that.
pub trait ReportSink: Send + Sync {
    /// Delivers one report; `Ok` means a controller has it.
    fn deliver<'a>(&'a self, report: &'a Report) -> SinkFuture<'a>;
}

/// Why a report could not be numbered or queued. Storage failures stop the host.
#[derive(Debug, thiserror::Error)]
pub enum ReportError {
    #[error(transparent)]
    Storage(#[from] StorageError),
    #[error(
        "report counter {path} is corrupt ({reason}); restore it, or set it above the controller's last report_sequence for this machine"
    )]
    CorruptCounter { path: PathBuf, reason: String },
    #[error("cannot encode a report: {0}")]
    Encode(String),
}

/// Numbers, queues and delivers reports.
pub struct Reporter {
    sink: Arc<dyn ReportSink>,
    counter_path: PathBuf,
    queue_dir: PathBuf,
    /// The last report_sequence persisted; held while numbering and queueing.
    last: Mutex<u64>,
    /// Held while delivering, so reports leave in order.
    delivering: Mutex<()>,
    dropped: AtomicU64,
    queue_max: usize,
    /// The same events for `/metrics`.
    counters: ReportCounters,
}

impl Reporter {
    /// Opens the counter and queue under `root`.
    pub fn open(root: &Path, sink: Arc<dyn ReportSink>) -> Result<Reporter, ReportError> {
        Reporter::open_bounded(root, sink, report_queue_max)
    }

    fn open_bounded(
        root: &Path,
        sink: Arc<dyn ReportSink>,
        queue_max: usize,
    ) -> Result<Reporter, ReportError> {
        let counter_path = root.join("report_sequence");
        let queue_dir = root.join("reports");
        durable::create_dir(&queue_dir, 0o700)?;
        let last = match durable::read_optional(&counter_path)? {
            None => 0,
            Some(bytes) => parse_counter(&bytes).map_err(|reason| ReportError::CorruptCounter {
                path: counter_path.clone(),
                reason,
            })?,
        };
        Ok(Reporter {
            sink,
            counter_path,
            queue_dir,
            last: Mutex::new(last),
            delivering: Mutex::new(()),
            dropped: AtomicU64::new(0),
            queue_max,
            counters: ReportCounters::default(),
        })
    }

    /// Reports dropped from a full queue (or refused by a controller) since this host started.
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }

    /// What became of reports, for `/metrics`.
    pub fn counters(&self) -> &ReportCounters {
        &self.counters
    }

    /// Reports waiting for the sink.
    pub fn queued(&self) -> Result<usize, ReportError> {
        Ok(self.queue_files()?.len())
    }

    /// Gives `report` the next report_sequence, persists the counter, and queues it. Returns the
    /// numbered report; [`Reporter::flush`] sends it.
    pub async fn enqueue(&self, mut report: Report) -> Result<Report, ReportError> {
        let mut last = self.last.lock().await;
        let next = *last + 1;
        durable::write_atomic(
            &self.counter_path,
            format!("{next}\n").as_bytes(),
            report_file_mode,
        )?;
        *last = next;
        report.report_sequence = next;
        let bytes = mesh_codec::encode("report", &report)
            .map_err(|e| ReportError::Encode(e.to_string()))?;
        durable::write_atomic(&self.queue_path(next), &bytes, report_file_mode)?;
        self.counters.queued();
        self.trim()?;
        Ok(report)
    }

    /// Delivers queued reports oldest first, stopping at the first the sink cannot take. Returns
    /// how many were delivered.
    pub async fn flush(&self) -> Result<usize, ReportError> {
        let _order = self.delivering.lock().await;
        let mut delivered = 0;
        for path in self.queue_files()? {
            let Some(bytes) = durable::read_optional(&path)? else {
                continue;
            };
            let report: Report = match mesh_codec::decode("report", &bytes) {
                Ok(r) => r,
                Err(e) => {
                    self.drop_one(&path, &format!("queued report is unreadable: {e}"))?;
                    continue;
                }
            };
            let limit = Duration::from_millis(deliver_timeout_ms);
            let result = tokio::time::timeout(limit, self.sink.deliver(&report)).await;
            match result {
                Ok(Ok(())) => {
                    durable::remove_if_present(&path)?;
                    delivered += 1;
                    self.counters.delivered();
                }
                Ok(Err(SinkError::Rejected(reason))) => {
                    self.drop_one(&path, &format!("controller refused it: {reason}"))?;
                }
                Ok(Err(SinkError::Unavailable(reason))) => {
                    self.counters.failed();
                    tracing::debug!(report_sequence = report.report_sequence, %reason, "report stays queued");
                    break;
                }
                Err(_) => {
                    self.counters.failed();
                    tracing::debug!(
                        report_sequence = report.report_sequence,
                        "report delivery timed out; stays queued"
                    );
                    break;
                }
            }
        }
        Ok(delivered)
    }

    /// Drops the oldest queued reports beyond the queue's bound ([`report_queue_max`]).
    fn trim(&self) -> Result<(), ReportError> {
        let files = self.queue_files()?;
        if files.len() <= self.queue_max {
            return Ok(());
        }
        let excess = files.len() - self.queue_max;
        for path in &files[..excess] {
            self.drop_one(path, "the report queue is full")?;
        }
        Ok(())
    }

    fn drop_one(&self, path: &Path, why: &str) -> Result<(), ReportError> {
        durable::remove_if_present(path)?;
        let dropped = self.dropped.fetch_add(1, Ordering::Relaxed) + 1;
        self.counters.dropped();
        tracing::warn!(path = %path.display(), why, dropped, "report dropped");
        Ok(())
    }

    fn queue_path(&self, sequence: u64) -> PathBuf {
        self.queue_dir.join(format!("{sequence:020}.report"))
    }

    /// Queued report files, oldest first (zero-padded names sort by sequence).
    fn queue_files(&self) -> Result<Vec<PathBuf>, ReportError> {
        let entries = std::fs::read_dir(&self.queue_dir)
            .map_err(|e| StorageError::new("list", &self.queue_dir, e))?;
        let mut files = Vec::new();
        for entry in entries {
            let entry = entry.map_err(|e| StorageError::new("list", &self.queue_dir, e))?;
            let path = entry.path();
            if path.extension().is_some_and(|x| x == "report") {
                files.push(path);
            }
        }
        files.sort();
        Ok(files)
    }
}

fn parse_counter(bytes: &[u8]) -> Result<u64, String> {
    let text = std::str::from_utf8(bytes).map_err(|_| "not UTF-8".to_string())?;
    text.trim()
        .parse::<u64>()
        .map_err(|_| format!("`{}` is not a number", text.trim()))
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Down;

    impl ReportSink for Down {
        fn deliver<'a>(&'a self, _report: &'a Report) -> SinkFuture<'a> {
            Box::pin(async { Err(SinkError::Unavailable("down".into())) })
        }
    }

    struct Up(std::sync::Mutex<Vec<u64>>);

    impl ReportSink for Up {
        fn deliver<'a>(&'a self, report: &'a Report) -> SinkFuture<'a> {
            let sequence = report.report_sequence;
            Box::pin(async move {
                self.0.lock().expect("lock").push(sequence);
                Ok(())
            })
        }
    }

    fn report() -> Report {
        Report {
            machine: "ace".into(),
            epoch: 0,
            sequence: 0,
            report_sequence: 0,
            applied: None,
            modules: vec![],
            refused_older: 0,
            last_refusal: None,
            proof: None,
        }
    }

    #[tokio::test]
    async fn g5_a_full_queue_drops_the_oldest_and_counts_it() {
        // G5 / bounded queue: beyond the bound the oldest reports go, newest kept, drops counted.
        let dir = tempfile::tempdir().expect("tempdir");
        let down = Reporter::open_bounded(dir.path(), Arc::new(Down), 3).expect("open");
        for _ in 0..5 {
            down.enqueue(report()).await.expect("enqueue");
            assert_eq!(down.flush().await.expect("flush"), 0);
        }
        assert_eq!(down.queued().expect("queued"), 3);
        assert_eq!(down.dropped(), 2);
        let sink = Arc::new(Up(std::sync::Mutex::new(Vec::new())));
        let up = Reporter::open_bounded(dir.path(), sink.clone(), 3).expect("open");
        assert_eq!(up.flush().await.expect("flush"), 3);
        assert_eq!(*sink.0.lock().expect("lock"), vec![3, 4, 5]);
        assert_eq!(up.queued().expect("queued"), 0);
    }
}
