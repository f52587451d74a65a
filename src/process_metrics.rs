//! The standard `process_*` metrics on both `/metrics` (meshd's and mesh-host's; issue 25 item 6,
//! decision 0311), named as every Prometheus client library names them so the usual dashboards
//! and alerts work: memory, CPU time, file descriptors, start time. Read from `/proc/self` at each
//! scrape (Linux only, as mesh is). A read that fails leaves its metric out of that scrape — a
//! missing series, never a 0 that looks like a measurement — and is counted in
//! `<prefix>_process_read_errors_total` and logged (at most once per 10 s).

use std::sync::Mutex;
use std::time::{Duration, Instant};

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::{ConstCounter, Counter};
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::registry::Registry;

/// Clock ticks per second in `/proc/<pid>/stat`: Linux's USER_HZ, fixed at 100 for user space
/// whatever the kernel's own HZ (as Prometheus' procfs assumes too).
const user_hz: f64 = 100.0;
/// How often a failed read is logged at most.
const warn_every_ms: u64 = 10_000;

/// One process metric: its name (without `_total`), help, and whether it is a counter.
struct Spec {
    name: &'static str,
    help: &'static str,
    counter: bool,
}

const cpu: Spec = Spec {
    name: "process_cpu_seconds",
    help: "Total user and system CPU time spent in seconds",
    counter: true,
};
const start: Spec = Spec {
    name: "process_start_time_seconds",
    help: "Start time of the process since unix epoch in seconds",
    counter: false,
};
const virtual_memory: Spec = Spec {
    name: "process_virtual_memory_bytes",
    help: "Virtual memory size in bytes",
    counter: false,
};
const resident_memory: Spec = Spec {
    name: "process_resident_memory_bytes",
    help: "Resident memory size in bytes",
    counter: false,
};
const open_fds: Spec = Spec {
    name: "process_open_fds",
    help: "Number of open file descriptors",
    counter: false,
};
const max_fds: Spec = Spec {
    name: "process_max_fds",
    help: "Maximum number of open file descriptors (the soft limit)",
    counter: false,
};

/// What `/proc/self` says now; each field is its own read, so one failing leaves the others.
pub struct Sample {
    pub cpu_seconds: Result<f64, String>,
    pub start_time_seconds: Result<f64, String>,
    pub virtual_memory_bytes: Result<f64, String>,
    pub resident_memory_bytes: Result<f64, String>,
    pub open_fds: Result<f64, String>,
    pub max_fds: Result<f64, String>,
}

impl Sample {
    /// Reads this process's numbers from `/proc`.
    pub fn read() -> Sample {
        let stat = read("/proc/self/stat").and_then(|text| stat_fields(&text));
        let status = read("/proc/self/status");
        let boot = read("/proc/stat").and_then(|text| boot_time(&text));
        Sample {
            cpu_seconds: stat.as_ref().map_err(Clone::clone).map(|s| s.cpu_seconds),
            start_time_seconds: match (&stat, boot) {
                (Ok(s), Ok(boot)) => Ok(boot + s.start_after_boot_seconds),
                (Err(e), _) => Err(e.clone()),
                (_, Err(e)) => Err(e),
            },
            virtual_memory_bytes: stat.as_ref().map_err(Clone::clone).map(|s| s.vsize_bytes),
            resident_memory_bytes: status
                .and_then(|text| status_kb(&text, "VmRSS:"))
                .map(|kb| kb * 1024.0),
            open_fds: count_fds(),
            max_fds: read("/proc/self/limits").and_then(|text| max_open_files(&text)),
        }
    }
}

fn read(path: &str) -> Result<String, String> {
    std::fs::read_to_string(path).map_err(|e| format!("cannot read {path}: {e}"))
}

fn count_fds() -> Result<f64, String> {
    let dir = "/proc/self/fd";
    let entries = std::fs::read_dir(dir).map_err(|e| format!("cannot list {dir}: {e}"))?;
    let mut count = 0u64;
    for entry in entries {
        entry.map_err(|e| format!("cannot list {dir}: {e}"))?;
        count += 1;
    }
    // The directory listing itself holds one descriptor while it is read.
    Ok(count.saturating_sub(1) as f64)
}

/// The fields of `/proc/self/stat` the metrics use.
#[derive(Debug, PartialEq)]
pub struct StatFields {
    pub cpu_seconds: f64,
    pub start_after_boot_seconds: f64,
    pub vsize_bytes: f64,
}

/// Parses `/proc/<pid>/stat`: the fields after the command (which may hold spaces and
/// parentheses, so the last `)` ends it) are utime (14), stime (15), starttime (22) in ticks
/// and vsize (23) in bytes.
pub fn stat_fields(text: &str) -> Result<StatFields, String> {
    let bad = |what: &str| format!("/proc/self/stat: {what} in {:?}", text.trim_end());
    let (_, rest) = text.rsplit_once(')').ok_or_else(|| bad("no command"))?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // `rest` starts at field 3 (the state).
    let field = |n: usize| -> Result<f64, String> {
        let text = fields
            .get(n - 3)
            .ok_or_else(|| bad(&format!("no field {n}")))?;
        text.parse::<u64>()
            .map(|v| v as f64)
            .map_err(|_| bad(&format!("field {n} is not a number")))
    };
    Ok(StatFields {
        cpu_seconds: (field(14)? + field(15)?) / user_hz,
        start_after_boot_seconds: field(22)? / user_hz,
        vsize_bytes: field(23)?,
    })
}

/// `btime` of `/proc/stat`: when the machine booted, in seconds since the Unix epoch.
pub fn boot_time(text: &str) -> Result<f64, String> {
    text.lines()
        .find_map(|l| l.strip_prefix("btime "))
        .and_then(|v| v.trim().parse::<u64>().ok())
        .map(|v| v as f64)
        .ok_or_else(|| "/proc/stat has no btime line".to_string())
}

/// The value of `key` (`VmRSS:`) in `/proc/self/status`, in kB.
pub fn status_kb(text: &str, key: &str) -> Result<f64, String> {
    text.lines()
        .find_map(|l| l.strip_prefix(key))
        .and_then(|v| v.trim().strip_suffix("kB"))
        .and_then(|v| v.trim().parse::<u64>().ok())
        .map(|v| v as f64)
        .ok_or_else(|| format!("/proc/self/status has no {key} line in kB"))
}

/// The soft limit on open files in `/proc/self/limits`; `unlimited` is the largest number.
pub fn max_open_files(text: &str) -> Result<f64, String> {
    let line = text
        .lines()
        .find_map(|l| l.strip_prefix("Max open files"))
        .ok_or_else(|| "/proc/self/limits has no `Max open files` line".to_string())?;
    match line.split_whitespace().next() {
        Some("unlimited") => Ok(f64::MAX),
        Some(v) => v.parse::<u64>().map(|v| v as f64).map_err(|_| {
            format!("/proc/self/limits: soft limit {v:?} on open files is not a number")
        }),
        None => Err("/proc/self/limits: no soft limit on open files".to_string()),
    }
}

/// The process metrics of one registry, read at each scrape.
pub struct ProcessMetrics {
    /// Reads that failed (each left its metric out of its scrape).
    errors: Counter,
    errors_name: String,
    /// When a failed read was last logged.
    logged: Mutex<Option<Instant>>,
    /// Stands in for `/proc` in tests.
    sample: fn() -> Sample,
}

impl std::fmt::Debug for ProcessMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProcessMetrics")
            .field("errors", &self.errors.get())
            .finish()
    }
}

impl ProcessMetrics {
    /// Registers the `process_*` metrics and `<prefix>_process_read_errors_total` in `registry`.
    pub fn register(registry: &mut Registry, prefix: &str) {
        registry.register_collector(Box::new(ProcessMetrics::with(prefix, Sample::read)));
    }

    fn with(prefix: &str, sample: fn() -> Sample) -> ProcessMetrics {
        ProcessMetrics {
            errors: Counter::default(),
            errors_name: format!("{prefix}_process_read_errors"),
            logged: Mutex::new(None),
            sample,
        }
    }

    fn failed(&self, metric: &str, error: &str) {
        self.errors.inc();
        let now = Instant::now();
        // A panic while holding it leaves at worst a stale time: recoverable.
        let mut logged = self
            .logged
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let due = logged.is_none_or(|at| {
            now.saturating_duration_since(at) >= Duration::from_millis(warn_every_ms)
        });
        if due {
            *logged = Some(now);
            tracing::warn!(
                metric,
                error,
                "left out of /metrics: cannot read it from /proc"
            );
        }
    }
}

impl Collector for ProcessMetrics {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let sample = (self.sample)();
        let metrics = [
            (&cpu, sample.cpu_seconds),
            (&start, sample.start_time_seconds),
            (&virtual_memory, sample.virtual_memory_bytes),
            (&resident_memory, sample.resident_memory_bytes),
            (&open_fds, sample.open_fds),
            (&max_fds, sample.max_fds),
        ];
        for (spec, value) in metrics {
            let value = match value {
                Ok(v) => v,
                Err(e) => {
                    self.failed(spec.name, &e);
                    continue;
                }
            };
            if spec.counter {
                let metric = ConstCounter::new(value);
                let m =
                    encoder.encode_descriptor(spec.name, spec.help, None, metric.metric_type())?;
                metric.encode(m)?;
            } else {
                let metric = ConstGauge::new(value);
                let m =
                    encoder.encode_descriptor(spec.name, spec.help, None, metric.metric_type())?;
                metric.encode(m)?;
            }
        }
        // After the reads, so a failure shows in the same scrape that lacks its metric.
        let errors = ConstCounter::new(self.errors.get());
        let m = encoder.encode_descriptor(
            &self.errors_name,
            "Reads of /proc for the process_* metrics that failed; each left its metric out of that scrape",
            None,
            errors.metric_type(),
        )?;
        errors.encode(m)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::exposition::Format;

    #[test]
    fn proc_files_are_parsed_into_seconds_bytes_and_counts() {
        let stat = "4242 (mesh host (x)) S 1 4242 4242 0 -1 4194304 100 0 0 0 250 50 0 0 20 0 1 0 122263 3133440 389 18446744073709551615 0\n";
        assert_eq!(
            stat_fields(stat).expect("stat"),
            StatFields {
                cpu_seconds: 3.0,
                start_after_boot_seconds: 1222.63,
                vsize_bytes: 3_133_440.0
            }
        );
        assert!(stat_fields("4242 (cut").is_err());
        assert!(stat_fields("4242 (x) S 1 2").is_err());
        assert_eq!(
            boot_time("cpu 1 2\nbtime 1796302653\n"),
            Ok(1_796_302_653.0)
        );
        assert!(boot_time("cpu 1 2\n").is_err());
        assert_eq!(
            status_kb("Name:\tx\nVmRSS:\t    2200 kB\n", "VmRSS:"),
            Ok(2200.0)
        );
        assert!(status_kb("Name:\tx\n", "VmRSS:").is_err());
        let limits = "Limit Soft Hard Units\nMax open files            20000                20000                files     \n";
        assert_eq!(max_open_files(limits), Ok(20_000.0));
        assert!(max_open_files("Max open files  lots").is_err());
    }

    #[test]
    fn every_process_metric_is_read_from_this_process() {
        // Issue 25 item 6: the process_* series every exporter has, with real values.
        let mut registry = Registry::default();
        ProcessMetrics::register(&mut registry, "mesh");
        let text = Format::Classic.encode(&registry).expect("encode");
        for name in [
            "process_cpu_seconds_total",
            "process_start_time_seconds",
            "process_virtual_memory_bytes",
            "process_resident_memory_bytes",
            "process_open_fds",
            "process_max_fds",
        ] {
            let value: f64 = text
                .lines()
                .find_map(|l| l.strip_prefix(&format!("{name} ")))
                .unwrap_or_else(|| panic!("no {name} in\n{text}"))
                .parse()
                .expect("a number");
            // The CPU time of a test process may still read 0 at 10 ms resolution.
            if name != "process_cpu_seconds_total" {
                assert!(value > 0.0, "{name} {value}");
            }
        }
        assert!(
            text.contains("\nmesh_process_read_errors_total 0\n"),
            "{text}"
        );
    }

    #[test]
    fn a_failed_read_leaves_its_metric_out_and_is_counted_never_a_zero() {
        // A /proc read that fails must not read as a measured 0 (issue 25 item 6).
        fn broken() -> Sample {
            let gone = || Err("cannot read /proc/self/status: gone".to_string());
            Sample {
                cpu_seconds: Ok(1.5),
                start_time_seconds: Ok(1_796_302_653.0),
                virtual_memory_bytes: Ok(1024.0),
                resident_memory_bytes: gone(),
                open_fds: Ok(7.0),
                max_fds: gone(),
            }
        }
        let mut registry = Registry::default();
        registry.register_collector(Box::new(ProcessMetrics::with("mesh_host", broken)));
        let first = Format::Classic.encode(&registry).expect("encode");
        assert!(!first.contains("process_resident_memory_bytes"), "{first}");
        assert!(!first.contains("process_max_fds"), "{first}");
        assert!(first.contains("\nprocess_open_fds 7.0\n"), "{first}");
        assert!(
            first.contains("\nprocess_cpu_seconds_total 1.5\n"),
            "{first}"
        );
        assert!(
            first.contains("\nmesh_host_process_read_errors_total 2\n"),
            "{first}"
        );
        let second = Format::OpenMetrics.encode(&registry).expect("encode");
        assert!(
            second.contains("\nmesh_host_process_read_errors_total 4\n"),
            "{second}"
        );
    }
}
