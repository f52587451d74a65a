//! The history of a chaos run: every operation's invoke and complete events (client writes, leases,
//! envelopes sent and received, reports filed, nemesis steps, final reads) in one total order.
//!
//! Time is a logical counter: an event's tick is its index in the history. Every event is recorded
//! under one lock, so the order of ticks is consistent with real time across tasks — which is what the
//! checkers rely on ("after a newer lease was acquired, nothing older was sent").

use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::watch;

use mesh::core::envelope::Position;
use mesh::core::report::ReportPosition;
use mesh_raft::NodeId;

/// Events kept at most; beyond that, events are counted as dropped and the checkers refuse the run.
pub const events_max: usize = 400_000;

/// A logical timestamp: the index of the event in its history.
pub type Tick = u64;

/// Ties a client write's completion to its invocation.
pub type OpId = u64;

/// Where a command sits in the Raft log: ordered by `(index, position)`; `term` is the entry's term.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct LogPosition {
    pub term: u64,
    pub index: u64,
    /// The command's place in the entry's batch.
    pub position: u32,
}

impl LogPosition {
    /// The log order key.
    pub fn key(&self) -> (u64, u32) {
        (self.index, self.position)
    }
}

impl fmt::Display for LogPosition {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "log {}-{}.{}", self.term, self.index, self.position)
    }
}

/// One thing that happened in a run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Event {
    /// A client proposed `key = value` to replica `via`. Values are unique within a run.
    WriteInvoked {
        op: OpId,
        client: u32,
        via: NodeId,
        key: String,
        value: String,
    },
    /// The write committed at `at`; `previous` is the value it replaced when applied.
    WriteAcked {
        op: OpId,
        at: LogPosition,
        previous: Option<String>,
    },
    /// The write got no answer: it may or may not have been applied.
    WriteUnknown { op: OpId, error: String },
    /// `replica` holds a lease of `term` (G3).
    LeaseAcquired { replica: NodeId, term: u64 },
    /// `replica` committed `position.sequence` for `machine` through the log, under `position.epoch`.
    SequenceCommitted {
        replica: NodeId,
        machine: String,
        position: Position,
        at: LogPosition,
    },
    /// `replica` sealed an envelope and let it leave, its lease checked open at this very tick.
    EnvelopeSent {
        replica: NodeId,
        machine: String,
        position: Position,
    },
    /// `replica` did not send a committed envelope because its lease had closed.
    SendAbandoned {
        replica: NodeId,
        machine: String,
        position: Position,
        reason: String,
    },
    /// The host of `machine` verified, fenced and applied an envelope.
    EnvelopeApplied {
        machine: String,
        signer: NodeId,
        position: Position,
    },
    /// The host of `machine` refused an envelope that came over `link`'s connection.
    EnvelopeRefused {
        machine: String,
        link: NodeId,
        got: Option<Position>,
        reason: String,
    },
    /// The controller filed (or refused) a report; `account` is the account's position afterwards.
    ReportFiled {
        machine: String,
        got: ReportPosition,
        accepted: bool,
        account: Option<ReportPosition>,
    },
    /// A nemesis step, with the seed that chose it.
    Nemesis {
        seed: u64,
        step: usize,
        what: String,
    },
    /// What `replica` holds for `key` once the run healed and converged.
    FinalRead {
        replica: NodeId,
        key: String,
        value: Option<String>,
    },
    /// Anything else worth seeing when reading a failed run.
    Note { what: String },
}

impl fmt::Display for Event {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Event::WriteInvoked {
                op,
                client,
                via,
                key,
                value,
            } => write!(f, "op {op}: client {client} writes {key}={value} via {via}"),
            Event::WriteAcked { op, at, previous } => {
                write!(f, "op {op}: acked at {at}, previous {previous:?}")
            }
            Event::WriteUnknown { op, error } => write!(f, "op {op}: unknown: {error}"),
            Event::LeaseAcquired { replica, term } => {
                write!(f, "replica {replica} holds a lease of term {term}")
            }
            Event::SequenceCommitted {
                replica,
                machine,
                position,
                at,
            } => write!(
                f,
                "replica {replica} committed {machine} {position} at {at}"
            ),
            Event::EnvelopeSent {
                replica,
                machine,
                position,
            } => write!(f, "replica {replica} sent {machine} {position}"),
            Event::SendAbandoned {
                replica,
                machine,
                position,
                reason,
            } => write!(
                f,
                "replica {replica} abandoned {machine} {position}: {reason}"
            ),
            Event::EnvelopeApplied {
                machine,
                signer,
                position,
            } => write!(f, "host {machine} applied {position} from {signer}"),
            Event::EnvelopeRefused {
                machine,
                link,
                got,
                reason,
            } => write!(
                f,
                "host {machine} refused {} from link {link}: {reason}",
                shown(got)
            ),
            Event::ReportFiled {
                machine,
                got,
                accepted,
                account,
            } => {
                let verdict = if *accepted { "filed" } else { "refused" };
                write!(
                    f,
                    "report {machine} {got} {verdict}; account at {}",
                    shown(account)
                )
            }
            Event::Nemesis { seed, step, what } => {
                write!(f, "nemesis seed {seed} step {step}: {what}")
            }
            Event::FinalRead {
                replica,
                key,
                value,
            } => write!(f, "final replica {replica}: {key}={value:?}"),
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
