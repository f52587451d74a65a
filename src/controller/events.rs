//! The leader's event log (issue 25 item 5, decision 0308): what happened to the fleet, newest
//! last, for `meshctl events [--follow]` — module failed, restarted or recovered (derived from the
//! reports the leader files), a host silent or back, this leader taking office or stepping down, a
//! push begun and ended, a machine held, trust changed, and drift (kind kept for the drift report).
//!
//! - **Kept by the leader, in memory, for its term.** The log starts again with a "took office"
//!   event when a replica becomes leader; nothing of it is replicated or written to disk. What a
//!   failover loses is said, never hidden: a cursor is `(term, index)`, and a reader whose cursor is
//!   of an older term is told that events between may have been lost ([`EventsGap::OlderTerm`]).
//! - **Bounded.** At most [`events_kept_max`] events; the oldest go first, and a reader whose cursor
//!   fell behind them is told how many it missed ([`EventsGap::Dropped`]).
//! - **Paged, and a reader can wait.** A page holds at most [`events_page_max`] events and says
//!   whether more follow; an empty page may wait up to [`events_wait_ms_max`] for the next event
//!   (the long poll `events --follow` rides on).
//!
//! [`EventLog`] and the derivations ([`module_changes`], [`drift_changes`], [`silence_changes`]) are
//! pure: time and term are passed in. The service (`Service::events_*`) only locks, wakes and
//! feeds them.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::{Mutex, Weak};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::sync::watch;

use super::api::{ApiError, Body, PushOutcome, Request};
use super::service::{Service, now_ms};
use crate::core::report::{DriftMoves, ModuleState, ModuleStatus};

/// Most events the leader keeps; the oldest are dropped first (readers behind are told how many).
pub const events_kept_max: usize = 10_000;
/// Most events in one page of `events`.
pub const events_page_max: u32 = 256;
/// Longest an `events` request waits for an event before it answers an empty page: under the
/// replicas' shutdown drain (5 s), so a waiting reader never holds a stopping replica.
pub const events_wait_ms_max: u64 = 3_000;
/// How often the leader looks for hosts that went silent or came back (decision 0301's rule): a
/// look reads every machine of the model, so not more often than a second (a silence is counted in
/// seconds anyway: 6 s as `meshctl init` writes it, 30 s by default).
pub const events_silence_tick_ms: u64 = 1_000;

/// Where a reader is: the leader's term and the index of the last event it has seen in it (0:
/// none yet).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct EventCursor {
    pub term: u64,
    pub index: u64,
}

/// Where a page starts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum EventsFrom {
    /// The oldest event kept.
    Oldest,
    /// The newest N events (of the machine asked for, if any).
    Newest(u32),
    /// The first event after this cursor.
    After(EventCursor),
}

/// `Request::Events`: a page of the log.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct EventsQuery {
    pub from: EventsFrom,
    /// Only events of this machine.
    pub machine: Option<String>,
    /// Most events in the page (1 to [`events_page_max`]).
    pub limit: u32,
    /// When no event follows the cursor yet, wait this long for one (capped at
    /// [`events_wait_ms_max`]); 0 answers at once.
    pub wait_ms: u64,
}

/// What happened. New kinds go last (bincode encodes the index).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum EventKind {
    ModuleFailed,
    ModuleRestarted,
    ModuleRecovered,
    HostSilent,
    HostBack,
    TookOffice,
    SteppedDown,
    Held,
    PushBegun,
    PushEnded,
    Trust,
    /// A host reported that what a module runs differs from its declaration ([`drift_changes`]).
    Drift,
    DriftCleared,
}

impl EventKind {
    /// The kind as `events` prints it and `--json` names it.
    pub fn word(self) -> &'static str {
        match self {
            EventKind::ModuleFailed => "module-failed",
            EventKind::ModuleRestarted => "module-restarted",
            EventKind::ModuleRecovered => "module-recovered",
            EventKind::HostSilent => "host-silent",
            EventKind::HostBack => "host-back",
            EventKind::TookOffice => "took-office",
            EventKind::SteppedDown => "stepped-down",
            EventKind::Held => "held",
            EventKind::PushBegun => "push-begun",
            EventKind::PushEnded => "push-ended",
            EventKind::Trust => "trust",
            EventKind::Drift => "drift",
            EventKind::DriftCleared => "drift-cleared",
        }
    }
}

/// One event: its index in the leader's term, when (the leader's wall clock, ms since the Unix
/// epoch), what, where, and one line of text.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Event {
    pub index: u64,
    pub at_ms: u64,
    pub kind: EventKind,
    pub machine: Option<String>,
    pub module: Option<String>,
    pub text: String,
}

/// An event before the log numbers and times it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Draft {
    pub kind: EventKind,
    pub machine: Option<String>,
    pub module: Option<String>,
    pub text: String,
}

impl Draft {
    pub fn new(
        kind: EventKind,
        machine: Option<&str>,
        module: Option<&str>,
        text: String,
    ) -> Draft {
        Draft {
            kind,
            machine: machine.map(str::to_string),
            module: module.map(str::to_string),
            text,
        }
    }
}

/// Events a reader cannot be shown, and why.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum EventsGap {
    /// The cursor is of an older leader's term: what happened between its last event and this
    /// leader taking office is not kept (the log lives in the leader's memory, decision 0308).
    OlderTerm { term: u64 },
    /// The cursor fell behind the oldest event kept: `count` events were dropped unread.
    Dropped { count: u64 },
}

/// One page of events.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct EventsPage {
    /// The answering leader's term.
    pub term: u64,
    pub events: Vec<Event>,
    /// Ask after this for the next page (it is past every event this page looked at).
    pub next: EventCursor,
    /// More events (of the machine asked for) follow `next` already.
    pub more: bool,
    /// With [`EventsFrom::Newest`]: events (of the machine) kept before this page, not shown.
    pub earlier: u64,
    pub gap: Option<EventsGap>,
}

/// Why an `events` request was refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error, Serialize, Deserialize)]
pub enum EventsError {
    #[error("--limit {limit} is out of range; give 1 to {max} per page")]
    LimitOutOfRange { limit: u32, max: u32 },
    #[error(
        "the cursor (term {term}, event {index}) is past this leader's last event {last}; start again without a cursor"
    )]
    CursorAhead { term: u64, index: u64, last: u64 },
    #[error(
        "the cursor is of term {term}, newer than this leader's term {leading}: a newer leader exists; ask again"
    )]
    CursorNewer { term: u64, leading: u64 },
    #[error("there is no machine {machine} in the model; its machines are {known}")]
    UnknownMachine { machine: String, known: String },
}

impl EventsError {
    pub fn class(&self) -> super::api::ErrorClass {
        match self {
            EventsError::CursorNewer { .. } => super::api::ErrorClass::Unavailable,
            _ => super::api::ErrorClass::Invalid,
        }
    }

    pub fn cause(&self) -> &'static str {
        match self {
            EventsError::LimitOutOfRange { .. } => "events.limit_out_of_range",
            EventsError::CursorAhead { .. } => "events.cursor_ahead",
            EventsError::CursorNewer { .. } => "events.cursor_newer",
            EventsError::UnknownMachine { .. } => "events.unknown_machine",
        }
    }
}

/// The log of one leader's term (pure: term and time are passed in).
#[derive(Debug)]
pub struct EventLog {
    /// The term this log is of; 0 before this replica first led.
    term: u64,
    /// This replica leads in `term`: events are taken.
    open: bool,
    /// The index the next event gets (indexes start at 1 in each term).
    next: u64,
    events: VecDeque<Event>,
    kept_max: usize,
}

impl EventLog {
    pub fn new(kept_max: usize) -> EventLog {
        EventLog {
            term: 0,
            open: false,
            next: 1,
            events: VecDeque::new(),
            kept_max: kept_max.max(1),
        }
    }

    /// The term of the log.
    pub fn term(&self) -> u64 {
        self.term
    }

    /// This replica took office in `term`: the log starts again with that event. A term not
    /// above the log's changes nothing (noted already).
    pub fn took_office(&mut self, term: u64, at_ms: u64, text: String) {
        if term <= self.term && self.open {
            return;
        }
        if term < self.term {
            return;
        }
        self.term = term;
        self.open = true;
        self.next = 1;
        self.events.clear();
        self.append(at_ms, Draft::new(EventKind::TookOffice, None, None, text));
    }

    /// This replica stopped leading `term`: the last event of the log, which takes no more. A
    /// reader waiting on it sees it before it asks the next leader.
    pub fn stepped_down(&mut self, term: u64, at_ms: u64, text: String) {
        if term != self.term || !self.open {
            return;
        }
        self.append(at_ms, Draft::new(EventKind::SteppedDown, None, None, text));
        self.open = false;
    }

    /// Takes `draft` when this log is open for `term`; says whether it did.
    pub fn push(&mut self, term: u64, at_ms: u64, draft: Draft) -> bool {
        if !self.open || term != self.term {
            return false;
        }
        self.append(at_ms, draft);
        true
    }

    fn append(&mut self, at_ms: u64, draft: Draft) {
        let Draft {
            kind,
            machine,
            module,
            text,
        } = draft;
        self.events.push_back(Event {
            index: self.next,
            at_ms,
            kind,
            machine,
            module,
            text,
        });
        self.next += 1;
        while self.events.len() > self.kept_max {
            self.events.pop_front();
        }
        debug_assert!(self.events.len() <= self.kept_max);
    }

    /// The index of the oldest event kept (`next` when none is).
    fn first(&self) -> u64 {
        self.events.front().map_or(self.next, |e| e.index)
    }

    /// A page for `query` (its machine already checked against the model by the caller).
    pub fn read(&self, query: &EventsQuery) -> Result<EventsPage, EventsError> {
        if query.limit == 0 || query.limit > events_page_max {
            return Err(EventsError::LimitOutOfRange {
                limit: query.limit,
                max: events_page_max,
            });
        }
        let wanted = |e: &Event| match &query.machine {
            Some(m) => e.machine.as_deref() == Some(m.as_str()),
            None => true,
        };
        let first = self.first();
        let last = self.next - 1;
        let mut gap = None;
        let mut earlier = 0;
        let start = match query.from {
            EventsFrom::Oldest => first,
            EventsFrom::Newest(n) => {
                let mut start = self.next;
                let mut taken = 0;
                for e in self.events.iter().rev().filter(|e| wanted(e)) {
                    if taken == n {
                        earlier += 1;
                        continue;
                    }
                    taken += 1;
                    start = e.index;
                }
                start
            }
            EventsFrom::After(c) if c.term == self.term => {
                if c.index > last {
                    return Err(EventsError::CursorAhead {
                        term: c.term,
                        index: c.index,
                        last,
                    });
                }
                if c.index + 1 < first {
                    gap = Some(EventsGap::Dropped {
                        count: first - (c.index + 1),
                    });
                    first
                } else {
                    c.index + 1
                }
            }
            EventsFrom::After(c) if c.term < self.term => {
                gap = Some(EventsGap::OlderTerm { term: c.term });
                first
            }
            EventsFrom::After(c) => {
                return Err(EventsError::CursorNewer {
                    term: c.term,
                    leading: self.term,
                });
            }
        };
        let mut events = Vec::new();
        // Past every event looked at, so the next ask does not look again.
        let mut seen = start.saturating_sub(1).max(first.saturating_sub(1));
        let mut more = false;
        for e in self.events.iter().filter(|e| e.index >= start) {
            if !wanted(e) {
                if events.len() < query.limit as usize {
                    seen = e.index;
                }
                continue;
            }
            if events.len() == query.limit as usize {
                more = true;
                break;
            }
            seen = e.index;
            events.push(e.clone());
        }
        if !more {
            seen = last.max(seen);
        }
        Ok(EventsPage {
            term: self.term,
            events,
            next: EventCursor {
                term: self.term,
                index: seen,
            },
            more,
            earlier,
            gap,
        })
    }
}

/// The events one filed report makes of `machine`'s modules: `before` as the account's last
/// report shows them (`None`: no report yet), `after` as this one does. At most one event a module:
/// failed (it is failed now and was not), recovered (it was failed and is ready or running now),
/// restarted (its process ended and was started again: more restarts, or a new last exit).
pub fn module_changes(
    machine: &str,
    before: Option<&[ModuleStatus]>,
    after: &[ModuleStatus],
) -> Vec<Draft> {
    let mut drafts = Vec::new();
    for now in after {
        let was = before.and_then(|b| b.iter().find(|m| m.name == now.name));
        let failed_now = matches!(now.state, ModuleState::Failed { .. });
        let failed_before = was.is_some_and(|w| matches!(w.state, ModuleState::Failed { .. }));
        let exit = match now.last_exit {
            Some(e) => format!(" ({e})"),
            None => String::new(),
        };
        let event = if failed_now && !failed_before {
            let ModuleState::Failed { error } = &now.state else {
                continue;
            };
            Some((
                EventKind::ModuleFailed,
                format!("{} failed{exit}: {error}", now.name),
            ))
        } else if failed_before && matches!(now.state, ModuleState::Ready | ModuleState::Running) {
            Some((
                EventKind::ModuleRecovered,
                format!("{} recovered: {}", now.name, now.state.word()),
            ))
        } else if let Some(was) = was
            && (now.restarts > was.restarts
                || (now.last_exit.is_some() && now.last_exit != was.last_exit))
        {
            Some((
                EventKind::ModuleRestarted,
                format!(
                    "{} ended{exit} and was started again ({} restarts); now {}",
                    now.name,
                    now.restarts,
                    now.state.word()
                ),
            ))
        } else {
            None
        };
        if let Some((kind, text)) = event {
            drafts.push(Draft::new(kind, Some(machine), Some(&now.name), text));
        }
    }
    drafts
}

/// The drift events of a filed report (issue 25 item 3, decision 0305): each module whose drift
/// appeared or changed is a `Drift` event naming what differs now, each whose drift went away a
/// `DriftCleared`; the same drift again is none (`DriftMoves::between` decides, in the core).
pub fn drift_changes(machine: &str, moves: &DriftMoves) -> Vec<Draft> {
    let mut drafts = Vec::new();
    for (module, drift) in &moves.appeared {
        drafts.push(Draft::new(
            EventKind::Drift,
            Some(machine),
            Some(module),
            format!("{module} on {machine} drifted: {}", drift.join(", ")),
        ));
    }
    for module in &moves.cleared {
        drafts.push(Draft::new(
            EventKind::DriftCleared,
            Some(machine),
            Some(module),
            format!("{module} on {machine} runs as declared again"),
        ));
    }
    drafts
}

/// The silence events between two looks (decision 0301's rule applied by the caller): `before`
/// the machines silent at the last look, `now` those silent now, each with how long it had been
/// silent then (ms). A machine silent now and not before went silent; one silent before and not
/// now is back.
pub fn silence_changes(before: &BTreeMap<String, u64>, now: &BTreeMap<String, u64>) -> Vec<Draft> {
    let mut drafts = Vec::new();
    for (machine, for_ms) in now {
        if !before.contains_key(machine) {
            drafts.push(Draft::new(
                EventKind::HostSilent,
                Some(machine),
                None,
                format!(
                    "{machine}'s host not heard for {:.1} s: SILENT",
                    *for_ms as f64 / 1000.0
                ),
            ));
        }
    }
    let back: BTreeSet<&String> = before.keys().filter(|m| !now.contains_key(*m)).collect();
    for machine in back {
        let was = before.get(machine).copied().unwrap_or(0);
        drafts.push(Draft::new(
            EventKind::HostBack,
            Some(machine),
            None,
            format!(
                "{machine}'s host reported again (silent for {:.1} s or more)",
                was as f64 / 1000.0
            ),
        ));
    }
    drafts
}

/// The event of a push that began: who, how many machines (the first few named) and why.
pub fn push_begun(actor: &str, machines: &[String], why: &str) -> Draft {
    // The first few named: the line stays one line at any fleet size.
    let mut shown = machines
        .iter()
        .take(5)
        .cloned()
        .collect::<Vec<_>>()
        .join(", ");
    if machines.len() > 5 {
        shown.push_str(&format!(" and {} more", machines.len() - 5));
    }
    Draft::new(
        EventKind::PushBegun,
        None,
        None,
        format!(
            "{actor} began a push to {} ({shown}): {why}",
            match machines.len() {
                1 => "1 machine".to_string(),
                n => format!("{n} machines"),
            }
        ),
    )
}

/// The events of a push's answer: one `Held` per machine held (with its mounts), then the push's
/// end with its counts, or why it stopped.
pub fn push_ended(actor: &str, answer: &Result<(Body, Option<Vec<u8>>), ApiError>) -> Vec<Draft> {
    let view = match answer {
        Ok((Body::Push(view), _)) => view,
        Ok((other, _)) => {
            let text = format!("{actor}'s push answered {other:?}; this is a bug in meshd");
            return vec![Draft::new(EventKind::PushEnded, None, None, text)];
        }
        Err(e) => {
            let text = format!("{actor}'s push stopped: {e}");
            return vec![Draft::new(EventKind::PushEnded, None, None, text)];
        }
    };
    let mut drafts = Vec::new();
    let (mut applied, mut held, mut sent, mut refused, mut failed) = (0, 0, 0, 0, 0);
    for line in &view.lines {
        match &line.outcome {
            PushOutcome::Applied { .. } => applied += 1,
            PushOutcome::Sent { .. } => sent += 1,
            PushOutcome::Refused { .. } => refused += 1,
            PushOutcome::Failed { .. } => failed += 1,
            PushOutcome::Held { holds, .. } => {
                held += 1;
                let mounts: Vec<String> = holds
                    .iter()
                    .map(|h| format!("{} mount {}", h.module, h.mount))
                    .collect();
                drafts.push(Draft::new(
                    EventKind::Held,
                    Some(&line.machine),
                    None,
                    format!(
                        "{} held by {actor}'s push: {} would move; `meshctl push {} --move <module>` accepts",
                        line.machine,
                        mounts.join(", "),
                        line.machine
                    ),
                ));
            }
        }
    }
    drafts.push(Draft::new(
        EventKind::PushEnded,
        None,
        None,
        format!(
            "{actor}'s push in epoch {} ended: {applied} applied, {held} held, {sent} sent unconfirmed, {refused} refused, {failed} failed",
            view.epoch
        ),
    ));
    drafts
}

/// The event of a request that changes who is trusted (a revocation, a replica added or removed),
/// once it succeeded; `None` for any other request.
pub fn trust_change(actor: &str, request: &Request) -> Option<Draft> {
    let text = match request {
        Request::CertsRevoke { target, why } => format!("{actor} revoked {target}: {why}"),
        Request::ReplicasAdd { id, addr, .. } => format!("{actor} added replica {id} at {addr}"),
        Request::ReplicasRemove { id } => format!("{actor} removed replica {id}"),
        _ => return None,
    };
    Some(Draft::new(EventKind::Trust, None, None, text))
}

/// The log behind a lock, and a counter that moves at every event: a reader waiting for the next
/// event waits on it.
pub(crate) struct Events {
    log: Mutex<EventLog>,
    moved: watch::Sender<u64>,
}

impl Events {
    pub(crate) fn new() -> Events {
        Events {
            log: Mutex::new(EventLog::new(events_kept_max)),
            moved: watch::Sender::new(0),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, EventLog> {
        // A panic while holding it leaves at worst a log missing an event: recoverable.
        self.log
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn moved(&self) {
        self.moved.send_modify(|n| *n = n.wrapping_add(1));
    }

    /// Replica `replica` took office in `term`: its log starts again.
    pub(crate) fn took_office(&self, replica: u64, term: u64) {
        let text = format!(
            "replica {replica} took office as leader of term {term}; events of earlier terms are not kept here"
        );
        self.lock().took_office(term, now_ms(), text);
        self.moved();
    }

    /// Replica `replica` stopped leading `term` (`now_term` is the term it sees now).
    pub(crate) fn stepped_down(&self, replica: u64, term: u64, now_term: u64) {
        let text = format!(
            "replica {replica} stepped down as leader of term {term} (term {now_term} now); ask another replica for what follows"
        );
        self.lock().stepped_down(term, now_ms(), text);
        self.moved();
    }

    /// Takes `drafts` as events of `term`, when this replica's log is open for it.
    pub(crate) fn push(&self, term: u64, drafts: Vec<Draft>) {
        if drafts.is_empty() {
            return;
        }
        let at = now_ms();
        let mut log = self.lock();
        for draft in drafts {
            log.push(term, at, draft);
        }
        drop(log);
        self.moved();
    }
}

impl Service {
    /// Notes `drafts` as events of the term this replica leads in; nothing when it does not lead.
    pub(crate) fn note_events(&self, drafts: Vec<Draft>) {
        if let Ok(term) = self.leading_term() {
            self.events.push(term, drafts);
        }
    }

    /// `Request::Events` on the leader: a page, waiting up to `wait_ms` (at most
    /// [`events_wait_ms_max`]) for an event when none follows the cursor yet.
    pub(crate) async fn events_page(&self, query: EventsQuery) -> Result<Body, ApiError> {
        let term = self.leading_term()?;
        if let Some(machine) = &query.machine {
            let state = self.state()?;
            if !state.mesh.machines.contains_key(machine) {
                let known: Vec<&str> = state.mesh.machines.keys().map(String::as_str).collect();
                return Err(ApiError::Events(EventsError::UnknownMachine {
                    machine: machine.clone(),
                    known: if known.is_empty() {
                        "none".to_string()
                    } else {
                        known.join(", ")
                    },
                }));
            }
        }
        // Led before the leadership watcher noted it: noted now.
        if self.events.lock().term() < term {
            self.events.took_office(self.id, term);
        }
        let wait = Duration::from_millis(query.wait_ms.min(events_wait_ms_max));
        let deadline = tokio::time::Instant::now() + wait;
        let mut moved = self.events.moved.subscribe();
        loop {
            moved.borrow_and_update();
            let page = self.events.lock().read(&query).map_err(ApiError::Events)?;
            let now = tokio::time::Instant::now();
            let still = self.leading_term().ok() == Some(term);
            if !page.events.is_empty() || page.gap.is_some() || now >= deadline || !still {
                return Ok(Body::Events(page));
            }
            mesh_raft::changed_within(&mut moved, deadline - now).await;
        }
    }
}

/// Looks every [`events_silence_tick_ms`] for hosts that went silent or came back while this
/// replica leads (decision 0301's rule, `silent_for`), and notes each change as an event. Ends when
/// the service is gone.
pub(crate) async fn watch_silence(service: Weak<Service>) {
    let mut tick = tokio::time::interval(Duration::from_millis(events_silence_tick_ms));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let Some(s) = service.upgrade() else { return };
        // A new term is a new leadership: its own look, from nothing (it finds silence anew).
        let Some(leadership) = s.leadership_now() else {
            continue;
        };
        let Some(machines) = s.silent_hosts(&leadership) else {
            continue;
        };
        let now: BTreeMap<String, u64> = machines
            .iter()
            .filter_map(|(m, quiet)| quiet.map(|ms| (m.clone(), ms)))
            .collect();
        let mut silent = leadership.swap_silent(now.clone());
        // A machine the model dropped is neither silent nor back: it is gone.
        silent.retain(|m, _| machines.contains_key(m));
        let drafts = silence_changes(&silent, &now);
        s.events.push(leadership.term(), drafts);
    }
}

#[cfg(test)]
mod tests;
