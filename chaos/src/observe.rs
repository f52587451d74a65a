//! What the real code did, read from the tracing events it emits where it acts: a replica's lease
//! confirmed by a quorum round (`controller/service.rs`), an envelope write its lease gate allowed
//! (`controller/push.rs`), a host persisting its mark and applying (`host/agent.rs`). A tracing
//! layer turns each into a history event, recorded synchronously in the emitting task, so the
//! history's order is the order these happened in (decision 0245).
//!
//! One run at a time per process owns the layer's recorder ([`Observed`]); a second run waits.

use std::collections::BTreeMap;
use std::sync::{Mutex, OnceLock};

use tracing::field::{Field, Visit};
use tracing::level_filters::LevelFilter;
use tracing_subscriber::Layer;
use tracing_subscriber::filter::Targets;
use tracing_subscriber::layer::{Context, SubscriberExt};
use tracing_subscriber::util::SubscriberInitExt;

use crate::history::{Event, Recorder};

/// The recorder of the run in progress.
static current: Mutex<Option<Recorder>> = Mutex::new(None);
/// One run at a time: the layer is global, the recorder is the run's.
static run_lock: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
static installed: OnceLock<Result<(), String>> = OnceLock::new();
/// The machine whose next apply crashes its agent between the mark and the apply (the
/// `crash-host-mid-apply` fault), if armed.
static crash_next_apply: Mutex<Option<String>> = Mutex::new(None);
/// The replica whose next envelope write crashes its push (the `crash-leader-mid-push` fault),
/// if armed.
static crash_next_write: Mutex<Option<u64>> = Mutex::new(None);
/// Whether the next snapshot install crashes (the `crash-mid-snapshot` fault).
static crash_next_install: Mutex<bool> = Mutex::new(false);

/// Arms or disarms the crash of the next snapshot install, on whichever replica: when the state
/// machine says it is about to install a received snapshot, the install unwinds right there,
/// before it writes. The nemesis arms it only while the wiped replica is the one behind, then stops
/// that replica's Raft core and the rest, and restarts it from its files.
pub fn crash_at_next_install(armed: bool) {
    *crash_next_install.lock().unwrap_or_else(|p| p.into_inner()) = armed;
}

/// Arms (`Some`) or disarms the crash of replica `id`'s push at its next envelope write: when its
/// write gate says yes, the push unwinds right there, before a byte of the envelope leaves, so
/// the send record is committed and the envelope never written — what a crash between the two
/// leaves behind. The nemesis then crashes the replica.
pub fn crash_at_next_write(id: Option<u64>) {
    *crash_next_write.lock().unwrap_or_else(|p| p.into_inner()) = id;
}

/// Arms (`Some`) or disarms the crash of `machine`'s agent at its next apply: when the agent
/// says it persisted the mark and applies, the task applying unwinds right there, so the
/// declaration is on disk but not applied — what a crash between the two leaves behind.
pub fn crash_at_next_apply(machine: Option<&str>) {
    *crash_next_apply.lock().unwrap_or_else(|p| p.into_inner()) = machine.map(String::from);
}

/// The crash the observer injects: unwinds the applying task without the panic hook's message.
#[derive(Debug)]
pub struct InjectedCrash(pub String);

/// The environment variable that also prints the real code's logs (an `EnvFilter` directive).
pub const log_env: &str = "CHAOS_LOG";

const lease_message: &str = "lease confirmed by a quorum round";
const write_message: &str = "envelope write allowed";
const apply_message: &str = "applying declaration";
const install_message: &str = "installing snapshot";

/// Installs the global subscriber once: the observing layer on exactly the three targets it reads
/// (so other debug events stay disabled and cost nothing), plus a log printer when `CHAOS_LOG` is
/// set. Fails when another global subscriber was installed first.
pub fn install() -> Result<(), String> {
    installed
        .get_or_init(|| {
            let targets = Targets::new()
                .with_target("mesh::controller::service", LevelFilter::DEBUG)
                .with_target("mesh::controller::push", LevelFilter::DEBUG)
                .with_target("mesh::host::agent", LevelFilter::INFO)
                .with_target("mesh_raft::state_machine", LevelFilter::DEBUG);
            let printer = std::env::var(log_env).ok().map(|directive| {
                tracing_subscriber::fmt::layer()
                    .with_writer(std::io::stderr)
                    .with_filter(tracing_subscriber::EnvFilter::new(directive))
            });
            tracing_subscriber::registry()
                .with(Observer.with_filter(targets))
                .with(printer)
                .try_init()
                .map_err(|e| {
                    format!(
                        "cannot install the chaos observer (another tracing subscriber is set): {e}"
                    )
                })
        })
        .clone()
}

/// The observer belongs to one run while this lives.
pub struct Observed {
    _turn: tokio::sync::MutexGuard<'static, ()>,
}

impl Observed {
    /// Waits for the run before to finish, then sends the real code's events to `recorder`.
    pub async fn begin(recorder: &Recorder) -> Result<Observed, String> {
        install()?;
        let turn = run_lock.lock().await;
        *slot() = Some(recorder.clone());
        Ok(Observed { _turn: turn })
    }
}

impl Drop for Observed {
    fn drop(&mut self) {
        *slot() = None;
    }
}

fn slot() -> std::sync::MutexGuard<'static, Option<Recorder>> {
    current.lock().unwrap_or_else(|p| p.into_inner())
}

struct Observer;

#[derive(Default)]
struct Fields {
    message: String,
    values: BTreeMap<&'static str, String>,
}

impl Visit for Fields {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        let text = format!("{value:?}");
        if field.name() == "message" {
            self.message = text;
        } else {
            self.values.insert(field.name(), text);
        }
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "message" {
            self.message = value.to_string();
        } else {
            self.values.insert(field.name(), value.to_string());
        }
    }

    fn record_u64(&mut self, field: &Field, value: u64) {
        self.values.insert(field.name(), value.to_string());
    }
}

impl Fields {
    fn number(&self, name: &str) -> Option<u64> {
        self.values.get(name)?.parse().ok()
    }

    fn text(&self, name: &str) -> Option<String> {
        self.values.get(name).cloned()
    }

    fn event(&self) -> Option<Event> {
        match self.message.as_str() {
            install_message => Some(Event::Note {
                what: format!(
                    "a replica installs snapshot {}",
                    // allow(empty-on-error): a note for humans; the event without its id is still the install
                    self.text("snapshot").unwrap_or_default()
                ),
            }),
            lease_message => Some(Event::LeaseGranted {
                replica: self.number("replica")?,
                term: self.number("term")?,
            }),
            write_message => Some(Event::WriteAllowed {
                replica: self.number("replica")?,
                machine: self.text("machine")?,
                epoch: self.number("epoch")?,
                sequence: self.number("sequence")?,
            }),
            apply_message => Some(Event::HostApplied {
                machine: self.text("machine")?,
                epoch: self.number("epoch")?,
                sequence: self.number("sequence")?,
                digest: self.text("digest")?,
            }),
            _ => None,
        }
    }
}

impl<S: tracing::Subscriber> Layer<S> for Observer {
    fn on_event(&self, event: &tracing::Event<'_>, _ctx: Context<'_, S>) {
        let mut fields = Fields::default();
        event.record(&mut fields);
        let Some(seen) = fields.event() else { return };
        let crash = match &seen {
            Event::HostApplied { machine, .. } => {
                let mut armed = crash_next_apply.lock().unwrap_or_else(|p| p.into_inner());
                (armed.as_deref() == Some(machine.as_str())).then(|| {
                    *armed = None;
                    machine.clone()
                })
            }
            Event::Note { what } if what.starts_with("a replica installs snapshot") => {
                let mut armed = crash_next_install.lock().unwrap_or_else(|p| p.into_inner());
                std::mem::take(&mut *armed).then(|| "a replica".to_string())
            }
            Event::WriteAllowed { replica, .. } => {
                let mut armed = crash_next_write.lock().unwrap_or_else(|p| p.into_inner());
                (*armed == Some(*replica)).then(|| {
                    *armed = None;
                    format!("replica {replica}")
                })
            }
            _ => None,
        };
        let recorder = slot().clone();
        if let Some(recorder) = recorder {
            recorder.record(seen);
            if let Some(who) = &crash {
                let what = if who == "a replica" {
                    "the snapshot install crashes before it writes anything".to_string()
                } else if who.starts_with("replica ") {
                    format!(
                        "{who}'s push crashes between the send record's commit and the envelope's write"
                    )
                } else {
                    format!("{who}'s agent crashes between persisting its mark and applying")
                };
                recorder.record(Event::Note { what });
            }
        }
        if let Some(machine) = crash {
            std::panic::resume_unwind(Box::new(InjectedCrash(machine)));
        }
    }
}
