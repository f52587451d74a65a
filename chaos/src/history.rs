//! The history of a chaos run over the real controller: leases granted, envelope writes the lease
//! allowed, declarations hosts applied, reports delivered, accounts seen on every replica, operator
//! requests invoked and answered, nemesis steps, in one total order.
//!
//! Time is a logical counter: an event's tick is its index in the history. Every event is recorded
//! under one lock, and the replicas' and hosts' events are recorded synchronously where the real
//! code emits them (a tracing event, `observe.rs`), so the order of ticks is consistent with real
//! time across tasks: "after a lease of term 5 was granted, nothing of epoch 4 was written".

use std::collections::BTreeMap;
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::watch;

use mesh::core::report::ReportPosition;

/// Events kept at most; beyond that, events are counted as dropped and the checkers refuse the run.
pub const events_max: usize = 400_000;

/// A logical timestamp: the index of the event in its history.
pub type Tick = u64;

/// Ties an operator request's answer to its invocation.
pub type OpId = u64;

/// An operator request, as the checkers need it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Op {
    /// A model apply; `tag` is the value of the `CHAOS_APPLY` env of module `worker` in it.
    Apply { tag: u64 },
    /// `settings set module/db key=value`.
    Set { key: String, value: String },
    /// `settings show module/db`: a read of every key of the layer.
    Read,
    /// `plan cor`: a read of the model (the revision the leader plans from).
    ReadModel,
    /// A push whose `why` is `why` (unique in the run).
    Push {
        why: String,
        target: String,
        moves: Vec<String>,
    },
}

/// What an operator request came back with.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Answered {
    /// Acknowledged. For a push, the machines of its answer's lines: `(machine, sent)` where `sent`
    /// is `Some((sequence, digest short))` for an applied, sent or refused line.
    Ok {
        lines: Vec<(String, Option<(u64, String)>)>,
    },
    /// A read answered by replica `replica` (the leader the request reached): the layer's keys
    /// and values as it held them (a key not in it was not set).
    Read {
        replica: u64,
        values: BTreeMap<String, String>,
    },
    /// A plan answered by replica `replica`: the model revision it planned from.
    Model { replica: u64, revision: u64 },
    /// Refused or invalid: nothing was written (the API's promise).
    Refused(String),
    /// Unavailable, failed, or no answer: it may or may not have happened.
    Unknown(String),
}

/// One thing that happened in a run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Event {
    /// A nemesis step began (`on`) or ended.
    Nemesis {
        step: usize,
        fault: String,
        what: String,
        on: bool,
    },
    /// A quorum round confirmed replica `replica`'s lease in `term` (its gate, G3).
    LeaseGranted { replica: u64, term: u64 },
    /// The write gate of `replica` let an envelope of `epoch` leave for `machine`.
    WriteAllowed {
        replica: u64,
        machine: String,
        epoch: u64,
        sequence: u64,
    },
    /// `machine`'s agent persisted its mark at the position and applies the declaration.
    HostApplied {
        machine: String,
        epoch: u64,
        sequence: u64,
        digest: String,
    },
    /// `machine`'s sink handed a report to a controller (`ok`) or failed to; `by` is the replica
    /// that took it (the address the sink says filed it), when known. The delivery began at tick
    /// `started` and took `took_ms` of wall time (redirects and retries of the sink included).
    ReportDelivered {
        machine: String,
        position: ReportPosition,
        ok: bool,
        by: Option<u64>,
        started: Tick,
        took_ms: u64,
    },
    /// The process's resident memory (`VmRSS` of `/proc/self/status`) reached a new high.
    Memory { rss_bytes: u64 },
    /// The hostile peer's step `fault` sent `sent` messages that must all be refused; `taken` of
    /// them were answered as taken (a report filed, a Raft call answered), with one example.
    HostileSent {
        fault: String,
        sent: u64,
        taken: u64,
        example: Option<String>,
    },
    /// Replica `replica`'s applied state held this account for `machine`.
    AccountSeen {
        replica: u64,
        machine: String,
        last: Option<ReportPosition>,
        refused_older: u64,
    },
    /// An operator request was sent to replica `via`.
    Invoked { op: OpId, via: u64, what: Op },
    /// Its answer.
    Done { op: OpId, answer: Answered },
    /// A replica or host stopped (`up: false`) or came back from its files.
    Restart { who: String, up: bool },
    /// Replica `replica`'s store was lost (removed with the replica stopped); it restarts empty.
    StoreWiped { replica: u64 },
    /// Every replica was stopped and restored from an older backup (`meshd restore`); recorded
    /// before any of them restarts. `floors`: each replica's term floor after the restore.
    Restored {
        floors: Vec<(u64, u64)>,
        floor_files_kept: bool,
    },
    /// Anything else worth reading in a failure.
    Note { what: String },
}

impl fmt::Display for Event {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Event::Nemesis {
                step,
                fault,
                what,
                on,
            } => {
                let state = if *on { "on" } else { "off" };
                write!(f, "nemesis step {step} {fault} {state}: {what}")
            }
            Event::LeaseGranted { replica, term } => {
                write!(f, "replica {replica} lease granted in term {term}")
            }
            Event::WriteAllowed {
                replica,
                machine,
                epoch,
                sequence,
            } => {
                write!(
                    f,
                    "replica {replica} writes envelope {epoch}.{sequence} to {machine}"
                )
            }
            Event::HostApplied {
                machine,
                epoch,
                sequence,
                digest,
            } => {
                write!(f, "{machine} applies {epoch}.{sequence} (digest {digest})")
            }
            Event::ReportDelivered {
                machine,
                position,
                ok,
                by,
                started,
                took_ms,
            } => {
                write!(f, "{machine} report {position} delivered: {ok}")?;
                match by {
                    Some(r) if *ok => write!(f, " (taken by replica {r})"),
                    _ => Ok(()),
                }?;
                write!(f, " in {took_ms} ms (begun #{started:06})")
            }
            Event::Memory { rss_bytes } => {
                write!(f, "resident memory {} MiB", rss_bytes / (1024 * 1024))
            }
            Event::HostileSent {
                fault,
                sent,
                taken,
                example,
            } => {
                write!(
                    f,
                    "hostile {fault}: {sent} sent that must be refused, {taken} taken"
                )?;
                match example {
                    Some(e) => write!(f, " (e.g. {e})"),
                    None => Ok(()),
                }
            }
            Event::AccountSeen {
                replica,
                machine,
                last,
                refused_older,
            } => write!(
                f,
                "replica {replica} account {machine}: last {}, refused {refused_older}",
                shown(last)
            ),
            Event::Invoked { op, via, what } => write!(f, "op {op} via replica {via}: {what:?}"),
            Event::Done { op, answer } => write!(f, "op {op} answered {answer:?}"),
            Event::Restart { who, up } => {
                write!(
                    f,
                    "{who} {}",
                    if *up {
                        "restarted from its files"
                    } else {
                        "stopped"
                    }
                )
            }
            Event::StoreWiped { replica } => write!(f, "replica {replica}'s store lost"),
            Event::Restored {
                floors,
                floor_files_kept,
            } => write!(
                f,
                "every replica restored from an older backup (term floors {floors:?}, floor files {})",
                if *floor_files_kept {
                    "kept"
                } else {
                    "lost too"
                }
            ),
            Event::Note { what } => write!(f, "note: {what}"),
        }
    }
}

/// An optional position for humans: the position, or "none".
pub fn shown<T: fmt::Display>(value: &Option<T>) -> String {
    match value {
        Some(v) => v.to_string(),
        None => "none".to_string(),
    }
}

/// A finished (or in-progress) history: the events in order and how many were dropped.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct History {
    pub events: Vec<Event>,
    /// Events not kept because the history was full; a history with drops cannot be checked.
    pub dropped: u64,
}

impl History {
    /// A history of exactly these events (for checker tests and replays).
    pub fn of(events: Vec<Event>) -> Self {
        Self { events, dropped: 0 }
    }

    /// Events with their ticks.
    pub fn ticked(&self) -> impl Iterator<Item = (Tick, &Event)> {
        self.events.iter().enumerate().map(|(i, e)| (i as Tick, e))
    }

    /// The events within `radius` ticks of `tick`, one per line, for a failure message.
    pub fn around(&self, tick: Tick, radius: u64) -> String {
        let from = tick.saturating_sub(radius);
        let to = tick.saturating_add(radius);
        let mut out = String::new();
        for (t, e) in self.ticked() {
            if t >= from && t <= to {
                let mark = if t == tick { ">>" } else { "  " };
                out.push_str(&format!("{mark} #{t:06} {e}\n"));
            }
        }
        out
    }
}

impl fmt::Display for History {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (t, e) in self.ticked() {
            writeln!(f, "#{t:06} {e}")?;
        }
        if self.dropped > 0 {
            writeln!(f, "... {} events dropped (history full)", self.dropped)?;
        }
        Ok(())
    }
}

struct Inner {
    history: History,
    next_op: OpId,
}

/// Records events from every task of a run; clone it freely (clones share one history).
#[derive(Clone)]
pub struct Recorder {
    inner: Arc<Mutex<Inner>>,
    /// The number of events recorded so far, for tasks that wait for something to happen.
    recorded: watch::Sender<u64>,
}

impl Default for Recorder {
    fn default() -> Self {
        Self::new()
    }
}

impl Recorder {
    /// An empty history.
    pub fn new() -> Self {
        Self {
            inner: Arc::new(Mutex::new(Inner {
                history: History::default(),
                next_op: 0,
            })),
            recorded: watch::Sender::new(0),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // A task that panicked while recording left plain data behind; keep recording.
        self.inner
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// A fresh operation id.
    pub fn next_op(&self) -> OpId {
        let mut inner = self.lock();
        inner.next_op += 1;
        inner.next_op
    }

    /// Appends `event`; returns its tick.
    pub fn record(&self, event: Event) -> Tick {
        let mut inner = self.lock();
        let tick = push(&mut inner.history, event);
        drop(inner);
        self.recorded.send_replace(tick + 1);
        tick
    }

    /// Appends `event` only if `check` passes, with the check and the append under the same lock:
    /// nothing else can be recorded between them, so the event's tick is when the check held.
    pub fn record_if<E>(
        &self,
        check: impl FnOnce() -> Result<(), E>,
        event: Event,
    ) -> Result<Tick, E> {
        let mut inner = self.lock();
        check()?;
        let tick = push(&mut inner.history, event);
        drop(inner);
        self.recorded.send_replace(tick + 1);
        Ok(tick)
    }

    /// The next tick to be handed out.
    pub fn now(&self) -> Tick {
        self.lock().history.events.len() as Tick
    }

    /// A copy of the history so far.
    pub fn snapshot(&self) -> History {
        self.lock().history.clone()
    }

    /// Whether any event at or after `from` satisfies `wanted`.
    pub fn any_since(&self, from: Tick, wanted: impl Fn(&Event) -> bool) -> bool {
        let inner = self.lock();
        let from = (from as usize).min(inner.history.events.len());
        inner.history.events[from..].iter().any(wanted)
    }

    /// Waits until an event at or after `from` satisfies `wanted`, or `within` passed; says which.
    pub async fn wait_for(
        &self,
        from: Tick,
        within: Duration,
        wanted: impl Fn(&Event) -> bool,
    ) -> bool {
        let mut recorded = self.recorded.subscribe();
        let deadline = tokio::time::Instant::now() + within;
        loop {
            if self.any_since(from, &wanted) {
                return true;
            }
            let changed = tokio::time::timeout_at(deadline, recorded.changed()).await;
            if !matches!(changed, Ok(Ok(()))) {
                return self.any_since(from, &wanted);
            }
        }
    }
}

fn push(history: &mut History, event: Event) -> Tick {
    let tick = history.events.len() as Tick;
    if history.events.len() >= events_max {
        history.dropped += 1;
        return tick;
    }
    history.events.push(event);
    tick
}

impl Recorder {
    /// A copy of the history's first `end` events (events recorded after the run's end are left
    /// out: nothing the checkers read happens after it).
    pub fn snapshot_until(&self, end: Tick) -> History {
        let inner = self.lock();
        let end = (end as usize).min(inner.history.events.len());
        History {
            events: inner.history.events[..end].to_vec(),
            dropped: inner.history.dropped,
        }
    }
}
