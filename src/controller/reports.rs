//! The leader's side of host reports at fleet rate (issue 14 item 3, decision 0216).
//!
//! - **Liveness in memory.** The leader keeps, per machine of the model, when it last heard the
//!   host and the highest report position it heard ([`Liveness`]), for its own term only: a new
//!   leader starts with nothing and says "not heard since this leader took office" until the
//!   host reports again. Nothing of it is replicated.
//! - **Unchanged reports are not proposed.** A report that says what the account's last filed
//!   report says (`Report::says_the_same`: everything but the report sequence), newer than
//!   anything filed or heard, while none of that machine's reports is being filed and the
//!   leader has applied its own term's entries, is answered `Filed { accepted: true }` and only
//!   moves the heard position and time. Every other report is filed through Raft.
//! - **Reports are filed in shared proposals.** They wait in one bounded queue
//!   ([`queue_max`]); one task takes whatever is queued, up to [`batch_reports_max`] reports or
//!   [`batch_bytes_max`] bytes, as one `Command::RecordReports`, with at most
//!   [`batches_in_flight_max`] batches committing at once. Each report carries the heard
//!   position, so one at or below it is refused and counted (G5) like one at or below the
//!   account's last.
//! - **Each host has its own quota in the queue** (issue 23 part 3, decision 0299): at most
//!   [`reports_in_flight_per_host_max`] of one machine's reports are queued or committing at
//!   once (machines outside the model share one such quota); past it the host is told to try
//!   again, so one host flooding cannot delay another's filing. A host whose reports were refused
//!   for size or rate is named in `status` for [`report_refusal_shown_ms`].
//! - **A host not heard lately is silent** (issue 25 item 4, decision 0301): not heard for the
//!   replica's `silent_after_ms` ([`silent_after_intervals`] report intervals), it is `SILENT` in
//!   status, page, JSON and metrics ([`silent_for`], pure), until its next report.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use tokio::sync::{Semaphore, mpsc, oneshot};

use super::leadership::Leadership;
pub(crate) use super::leadership::intake::{Route, route};
use super::service::Service;
use crate::core::report::{Account, Report, ReportPosition};
use crate::core::wire::ReportReply;
use crate::store::command::{Applied, Command, ReportFiling};

/// Most reports waiting for a batch; past it a host is told to try again (its report stays
/// queued on its disk).
pub const queue_max: usize = 8192;
/// Most reports in one proposal.
pub const batch_reports_max: usize = 1024;
/// Most bytes of encoded reports in one proposal (the Raft batch limit is 4 MiB by default).
pub const batch_bytes_max: usize = 1024 * 1024;
/// Most report batches committing at once.
pub const batches_in_flight_max: usize = 2;
/// Most reports of one host queued or committing at once; past it the host is told to try again
/// (its report stays queued on its disk). A host sends one report at a time, so only a broken or
/// flooding host reaches it, and it cannot take the queue other hosts share.
pub const reports_in_flight_per_host_max: u32 = 4;
/// Most reports of one host the leader handles at once, from the first byte decoded to the
/// answer; past it the report is answered "try again" without being decoded (counted as
/// `over_quota`). Decoding and checking a report costs CPU before any quota on filing applies, and
/// a host certificate may hold `connections_per_host_max` connections of `host_streams_max`
/// streams each: this keeps that CPU to a few reports per host.
pub const reports_handled_per_host_max: u32 = reports_in_flight_per_host_max;
/// How long a host stays named in `status` (and counted in `mesh_hosts_reports_refused`) after a
/// report of it was refused for size or rate, in milliseconds.
pub const report_refusal_shown_ms: u64 = 60_000;

/// How many of a host's report intervals (`reconcile_interval_ms` in its host.toml) may pass
/// unheard before the leader calls it `SILENT` (decision 0301). A host reports at least once an
/// interval; three missed in a row is a host stopped, cut off or wedged, not one slow report.
pub const silent_after_intervals: u64 = 3;
/// `silent_after_ms` of a replica config that sets none: [`silent_after_intervals`] of mesh-host's
/// default `reconcile_interval_ms` (10 s), 30 s. The leader does not know each host's interval
/// (it is in the host's config only), so the threshold is the replica's (decision 0301).
pub const silent_after_ms_default: u64 = silent_after_intervals * 10_000;
/// Smallest `silent_after_ms` accepted: [`silent_after_intervals`] of the shortest interval a
/// host accepts (100 ms).
pub const silent_after_ms_min: u64 = silent_after_intervals * 100;
/// Largest `silent_after_ms` accepted: [`silent_after_intervals`] of the longest interval a host
/// accepts (1 hour).
pub const silent_after_ms_max: u64 = silent_after_intervals * 3_600_000;

/// What the leader heard from one host during its term.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Heard {
    /// When (this replica's monotonic clock).
    pub at: Instant,
    /// The highest position heard: filed, or unchanged and not proposed.
    pub position: ReportPosition,
}

#[derive(Default)]
struct Live {
    heard: Option<Heard>,
    /// The last envelope of this leader the host refused as older with nothing signed to show
    /// for it (issue 27 part 4): the refusal, until a later send of this leader is applied.
    unproven: Option<String>,
    /// This machine's reports queued or committing now.
    in_flight: u32,
    /// Its reports refused for size or rate in this term, if any.
    refused: Option<Refused>,
}

/// A host's reports refused for size or rate: how many since the first of a run (refusals less
/// than [`report_refusal_shown_ms`] apart), when the last was, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Refused {
    count: u64,
    at: Instant,
    reason: String,
}

struct TermMap {
    /// When this leadership took office: a host not heard since counts as not heard since then
    /// (decision 0301: a leader that never hears a host must still find it silent once it has led
    /// for the threshold).
    since: Instant,
    machines: HashMap<String, Live>,
    /// Reports of machines outside the model queued or committing now: they share one quota.
    outsiders_in_flight: u32,
}

/// The leader's memory of its hosts for its term (one `Leadership`'s, decision 0327); bounded by
/// the model's machines.
pub(crate) struct Liveness {
    inner: Mutex<TermMap>,
}

/// What a status answer says of a host's liveness.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HeardView {
    /// This leader heard the host this long ago.
    Ago(Duration),
    /// This leader, leading for this long, has not heard the host since it took office.
    NotSince(Duration),
}

/// The silence rule (pure, decision 0301): how long `machine`'s host has been silent, when that is
/// at least `silent_after`; `None` when it is not silent. A host this leader heard is silent once
/// it was last heard `silent_after` ago or longer. A host it has not heard since it took office is
/// silent only once it has led for `silent_after` (before that it may simply not have reported to
/// this leader yet), and then for at least as long as it has led: the returned duration is a
/// lower bound.
pub fn silent_for(heard: HeardView, silent_after: Duration) -> Option<Duration> {
    let quiet = match heard {
        HeardView::Ago(ago) => ago,
        HeardView::NotSince(leading) => leading,
    };
    (quiet >= silent_after).then_some(quiet)
}

impl Liveness {
    /// The memory of a leadership that takes office now.
    pub(crate) fn new() -> Liveness {
        Liveness {
            inner: Mutex::new(TermMap {
                since: Instant::now(),
                machines: HashMap::new(),
                outsiders_in_flight: 0,
            }),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, TermMap> {
        // A panic while holding it leaves at worst a stale heard time: recoverable.
        self.inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// What this leadership heard from `machine`.
    pub(crate) fn view(&self, machine: &str, now: Instant) -> HeardView {
        let map = self.lock();
        match map.machines.get(machine).and_then(|l| l.heard) {
            Some(h) => HeardView::Ago(now.saturating_duration_since(h.at)),
            None => HeardView::NotSince(now.saturating_duration_since(map.since)),
        }
    }

    /// Notes (`Some`) or clears (`None`) an unproven older refusal by `machine`'s host of an
    /// envelope this leadership sent.
    pub(crate) fn note_unproven(&self, machine: &str, refusal: Option<String>) {
        let mut map = self.lock();
        match refusal {
            Some(refusal) => {
                map.machines
                    .entry(machine.to_string())
                    .or_default()
                    .unproven = Some(refusal);
            }
            None => {
                if let Some(live) = map.machines.get_mut(machine) {
                    live.unproven = None;
                }
            }
        }
    }

    /// The unproven older refusal noted for `machine`, if any.
    pub(crate) fn unproven(&self, machine: &str) -> Option<String> {
        let map = self.lock();
        map.machines.get(machine).and_then(|l| l.unproven.clone())
    }

    /// Decides what to do with `report`, given the machine's durable account, and notes it:
    /// heard (not proposed), or counted as in flight until [`Liveness::filed`].
    pub(crate) fn route(
        &self,
        account: Option<&Account>,
        caught_up: bool,
        report: &Report,
        now: Instant,
    ) -> Route {
        let mut map = self.lock();
        let live = map.machines.entry(report.machine.clone()).or_default();
        let heard = live.heard.map(|h| h.position);
        let route = route(account, heard, live.in_flight > 0, caught_up, report);
        match route {
            Route::Heard => {
                live.heard = Some(Heard {
                    at: now,
                    position: report.position(),
                });
            }
            Route::File { .. } if live.in_flight >= reports_in_flight_per_host_max => {
                return Route::Busy;
            }
            Route::File { .. } => live.in_flight += 1,
            Route::Busy => {}
        }
        route
    }

    /// Routes a report of a machine outside the model: filed (nothing heard is kept for it),
    /// within the one quota such machines share.
    fn route_outsider(&self) -> Route {
        let mut map = self.lock();
        if map.outsiders_in_flight >= reports_in_flight_per_host_max {
            return Route::Busy;
        }
        map.outsiders_in_flight += 1;
        Route::File { heard: None }
    }

    /// Notes a report of `machine` (a machine of the model) refused for size or rate.
    pub(crate) fn note_refused(&self, machine: &str, reason: &str, now: Instant) {
        let mut map = self.lock();
        let live = map.machines.entry(machine.to_string()).or_default();
        let run = live
            .refused
            .as_ref()
            .filter(|r| shown(r, now))
            .map_or(0, |r| r.count);
        live.refused = Some(Refused {
            count: run + 1,
            at: now,
            reason: reason.to_string(),
        });
    }

    /// What `status` says of `machine`'s reports refused for size or rate, while the last is
    /// less than [`report_refusal_shown_ms`] old.
    pub(crate) fn refused_view(&self, machine: &str, now: Instant) -> Option<String> {
        let map = self.lock();
        let refused = map.machines.get(machine)?.refused.as_ref()?;
        if !shown(refused, now) {
            return None;
        }
        let ago = now.saturating_duration_since(refused.at).as_millis();
        let reports = if refused.count == 1 {
            "report"
        } else {
            "reports"
        };
        Some(format!(
            "{} {reports} refused, the last {ago} ms ago: {}",
            refused.count, refused.reason
        ))
    }

    /// How many machines had a report refused for size or rate less than
    /// [`report_refusal_shown_ms`] ago.
    pub(crate) fn refused_now(&self, now: Instant) -> usize {
        let map = self.lock();
        let mut count = 0;
        for live in map.machines.values() {
            if live.refused.as_ref().is_some_and(|r| shown(r, now)) {
                count += 1;
            }
        }
        count
    }

    /// A report of `machine` at `position`, routed to be filed at `arrived` (as an outsider when
    /// `known` is false), was filed (`Some(accepted)`) or not (`None`).
    fn filed(&self, done: &Done, accepted: Option<bool>) {
        let mut map = self.lock();
        if !done.known {
            map.outsiders_in_flight = map.outsiders_in_flight.saturating_sub(1);
            return;
        }
        let Some(live) = map.machines.get_mut(&done.machine) else {
            return;
        };
        live.in_flight = live.in_flight.saturating_sub(1);
        let (arrived, position) = (done.arrived, done.position);
        if accepted == Some(true) {
            let newer = live.heard.is_none_or(|h| h.position < position);
            if newer {
                live.heard = Some(Heard {
                    at: arrived,
                    position,
                });
            }
        }
    }
}

/// A duration in whole milliseconds, saturating.
fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// Whether a refusal is recent enough to be shown.
fn shown(refused: &Refused, now: Instant) -> bool {
    now.saturating_duration_since(refused.at) < Duration::from_millis(report_refusal_shown_ms)
}

/// One report waiting for a batch.
struct Queued {
    term: u64,
    filing: ReportFiling,
    bytes: usize,
    done: Done,
    reply: oneshot::Sender<Option<bool>>,
}

/// What the leader's memory needs of a report once it is filed or not (the report itself goes
/// into the proposal, not copied).
struct Done {
    machine: String,
    position: ReportPosition,
    arrived: Instant,
    /// A machine of the model (else it counts in the outsiders' quota).
    known: bool,
    /// The events it makes once filed (decision 0308).
    changes: Vec<super::events::Draft>,
}

/// The queue into the batching task.
pub(crate) struct Filer {
    queue: mpsc::Sender<Queued>,
}

/// The receiving end, until the service exists to run it.
pub(crate) struct FilerQueue(mpsc::Receiver<Queued>);

impl Filer {
    pub(crate) fn new() -> (Filer, FilerQueue) {
        let (tx, rx) = mpsc::channel(queue_max);
        (Filer { queue: tx }, FilerQueue(rx))
    }
}

/// Starts the task that empties the queue; it ends when the service (and its sender) is gone.
pub(crate) fn spawn_filer(service: Weak<Service>, queue: FilerQueue) {
    tokio::spawn(run_batches(service, queue.0));
}

async fn run_batches(service: Weak<Service>, mut queue: mpsc::Receiver<Queued>) {
    let slots = Arc::new(Semaphore::new(batches_in_flight_max));
    let mut carried: Option<Queued> = None;
    loop {
        let first = match carried.take() {
            Some(q) => q,
            None => match queue.recv().await {
                Some(q) => q,
                None => return,
            },
        };
        // Wait for a slot before gathering, so reports pile up while batches commit.
        let Ok(permit) = slots.clone().acquire_owned().await else {
            return;
        };
        let term = first.term;
        let mut bytes = first.bytes;
        let mut batch = vec![first];
        while batch.len() < batch_reports_max {
            let Ok(next) = queue.try_recv() else { break };
            if next.term != term || bytes + next.bytes > batch_bytes_max {
                carried = Some(next);
                break;
            }
            bytes += next.bytes;
            batch.push(next);
        }
        let Some(s) = service.upgrade() else { return };
        tokio::spawn(async move {
            s.file_batch(term, batch).await;
            drop(permit);
        });
    }
}

impl Service {
    /// Fills in when this replica, as leader, last heard each machine's host; on a replica that
    /// does not lead, nothing is heard (it never hears reports).
    pub(crate) fn fill_heard(&self, machines: &mut [crate::controller::api::MachineView]) {
        let Some(leadership) = self.leadership_now() else {
            return;
        };
        let live = &leadership.live;
        let now = Instant::now();
        let silent_after = self.config.silent_after();
        for m in machines {
            let heard = live.view(&m.name, now);
            m.heard_ago_ms = match heard {
                HeardView::Ago(d) => Some(millis(d)),
                HeardView::NotSince(_) => None,
            };
            m.silent_for_ms = silent_for(heard, silent_after).map(millis);
            m.unproven_refusal = live.unproven(&m.name);
            m.report_refusal = live.refused_view(&m.name, now);
        }
    }

    /// Every machine of the model and whether `leadership` finds it silent now (`Some(for how
    /// long, ms)`, decision 0301); `None` when the state cannot be read (logged; the caller looks
    /// again at its next tick). For the event log's host silent / back (decision 0308).
    pub(crate) fn silent_hosts(
        &self,
        leadership: &Leadership,
    ) -> Option<std::collections::BTreeMap<String, Option<u64>>> {
        let state = match self.app.state() {
            Ok(state) => state,
            Err(e) => {
                tracing::warn!(error = %e, "cannot read the state to look for silent hosts");
                return None;
            }
        };
        let now = Instant::now();
        let silent_after = self.config.silent_after();
        let mut silent = std::collections::BTreeMap::new();
        for machine in state.mesh.machines.keys() {
            let quiet = silent_for(leadership.live.view(machine, now), silent_after);
            silent.insert(machine.clone(), quiet.map(millis));
        }
        Some(silent)
    }

    /// How many machines had a report refused for size or rate by this replica, as leader, in the
    /// last [`report_refusal_shown_ms`]; 0 on a replica that does not lead.
    pub(crate) fn hosts_refused_now(&self) -> usize {
        let Some(leadership) = self.leadership_now() else {
            return 0;
        };
        leadership.live.refused_now(Instant::now())
    }

    /// Files (or only hears) a report that passed the checks, as `leadership`; `bytes` is its
    /// encoded size.
    pub(crate) async fn take_report(
        &self,
        leadership: &Leadership,
        report: Report,
        bytes: usize,
    ) -> ReportReply {
        let (term, live) = (leadership.term(), &leadership.live);
        let arrived = Instant::now();
        let (route, known, changes) = {
            // The snapshot is dropped before any wait: one held across an apply makes it copy.
            // The account is read in place, not copied: it holds a whole report.
            let state = match self.app.state() {
                Ok(state) => state,
                Err(e) => return self.undecided(&report.machine, &e),
            };
            let known = state.mesh.machines.contains_key(&report.machine);
            // Only machines of the model are remembered: the memory stays bounded by the model.
            let route = if known {
                let account = state.accounts.get(&report.machine);
                let caught_up = self.caught_up(term);
                live.route(account, caught_up, &report, arrived)
            } else {
                live.route_outsider()
            };
            // The events this report makes once filed (decision 0308): its modules against the
            // account's last report. A report only heard says the same: it makes none.
            let changes = match route {
                Route::File { .. } if known => {
                    let last = state
                        .accounts
                        .get(&report.machine)
                        .and_then(|a| a.report.as_ref());
                    let before = last.map(|r| r.modules.as_slice());
                    let mut changes =
                        super::events::module_changes(&report.machine, before, &report.modules);
                    let drift = crate::core::report::DriftMoves::between(last, &report);
                    changes.extend(super::events::drift_changes(&report.machine, &drift));
                    changes
                }
                _ => Vec::new(),
            };
            (route, known, changes)
        };
        let heard = match route {
            Route::Heard => {
                self.metrics.report("heard");
                return ReportReply::Filed { accepted: true };
            }
            Route::Busy => return self.over_quota(leadership, &report.machine, known, arrived),
            Route::File { heard } => heard,
        };
        let machine = report.machine.clone();
        let done = Done {
            machine: machine.clone(),
            position: report.position(),
            arrived,
            known,
            changes,
        };
        let (reply, answer) = oneshot::channel();
        let queued = Queued {
            term,
            filing: ReportFiling { report, heard },
            bytes,
            done,
            reply,
        };
        if let Err(full) = self.filer.queue.try_send(queued) {
            let queued = match full {
                mpsc::error::TrySendError::Full(q) | mpsc::error::TrySendError::Closed(q) => q,
            };
            live.filed(&queued.done, None);
            self.metrics.report("busy");
            if let Some(held_back) = self.warn_due(&machine, "queue full", arrived) {
                tracing::warn!(%machine, max = queue_max, held_back, "report queue full; the host keeps the report and sends it again");
            }
            return self.not_leader();
        }
        match answer.await {
            Ok(Some(accepted)) => {
                self.metrics
                    .report(if accepted { "accepted" } else { "refused" });
                ReportReply::Filed { accepted }
            }
            _ => {
                self.metrics.report("not_leader");
                self.not_leader()
            }
        }
    }

    /// The answer to a report over its host's quota: try again (the host keeps it on its disk
    /// and sends it again), the same answer as a full queue, so no host needs a new reply.
    fn over_quota(
        &self,
        leadership: &Leadership,
        machine: &str,
        known: bool,
        now: Instant,
    ) -> ReportReply {
        let reason = format!(
            "over its quota of {reports_in_flight_per_host_max} reports queued or committing at once (reports_in_flight_per_host_max); the host keeps the report and sends it again"
        );
        self.try_again(leadership, machine, known, now, &reason)
    }

    /// The answer to a report whose host already has [`reports_handled_per_host_max`] reports
    /// being handled: try again, before a byte of it is decoded.
    pub(crate) fn over_handling(&self, leadership: &Leadership, machine: &str) -> ReportReply {
        let known = match self.app.state() {
            Ok(state) => state.mesh.machines.contains_key(machine),
            Err(e) => {
                tracing::error!(error = %e, "cannot read the state to name a host refused for rate");
                false
            }
        };
        let reason = format!(
            "over its share of {reports_handled_per_host_max} reports handled at once (reports_handled_per_host_max); the host keeps the report and sends it again"
        );
        self.try_again(leadership, machine, known, Instant::now(), &reason)
    }

    /// Tells a host to send its report again later: counted as `over_quota`, the host named in
    /// `status` (a machine of the model), logged at most once per interval.
    fn try_again(
        &self,
        leadership: &Leadership,
        machine: &str,
        known: bool,
        now: Instant,
        reason: &str,
    ) -> ReportReply {
        self.metrics.report("over_quota");
        if known {
            leadership.live.note_refused(machine, reason, now);
        }
        if let Some(held_back) = self.warn_due(machine, "over quota", now) {
            tracing::warn!(%machine, held_back, "report refused for now: {reason}");
        }
        self.not_leader()
    }

    /// Whether this leader has applied an entry of its own `term` (its blank entry at least), so
    /// the accounts it reads hold everything earlier leaders committed.
    fn caught_up(&self, term: u64) -> bool {
        let m = self.replica.metrics();
        let m = m.borrow();
        m.last_applied.is_some_and(|l| l.leader_id.term == term)
    }

    /// Proposes one batch and answers each report in it. The reports move into the proposal:
    /// only what the leader's memory needs of each is kept aside.
    async fn file_batch(&self, term: u64, batch: Vec<Queued>) {
        let mut reports = Vec::with_capacity(batch.len());
        let mut waiting = Vec::with_capacity(batch.len());
        for q in batch {
            reports.push(q.filing);
            waiting.push((q.done, q.reply));
        }
        let actor = format!("replica:{}", self.id);
        let count = reports.len();
        let command = Command::RecordReports { reports };
        let answers: Vec<Option<bool>> = match self.propose(term, None, &actor, command).await {
            Ok(Applied::Reports { accepted }) if accepted.len() == count => {
                accepted.into_iter().map(Some).collect()
            }
            Ok(other) => {
                tracing::error!(answer = ?other, reports = count, "the store answered a batch of reports with something else");
                vec![None; count]
            }
            Err(e) => {
                tracing::warn!(error = %e, reports = count, "reports not filed; their hosts send them again");
                vec![None; count]
            }
        };
        // The batch's leadership, if it is still the one held: a term left keeps nothing.
        let leadership = self.leadership_in(term);
        for ((mut done, reply), accepted) in waiting.into_iter().zip(answers) {
            if let Some(leadership) = &leadership {
                leadership.live.filed(&done, accepted);
            }
            if accepted == Some(true) {
                self.events.push(term, std::mem::take(&mut done.changes));
            }
            let _ = reply.send(accepted);
        }
    }
}

/// The reports each host has being handled now ([`reports_handled_per_host_max`]): a host's
/// entry lives only while one of its reports is handled, so it holds at most as many entries as
/// reports are in flight.
#[derive(Default)]
pub(crate) struct Handling(Mutex<HashMap<String, u32>>);

/// One report being handled; its place goes back when this is dropped.
pub(crate) struct HandlingTurn<'a> {
    handling: &'a Handling,
    machine: String,
}

impl Handling {
    /// A turn for a report of `machine`, or `None` when it already has
    /// [`reports_handled_per_host_max`] reports being handled.
    pub(crate) fn enter(&self, machine: &str) -> Option<HandlingTurn<'_>> {
        let mut map = self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let count = map.entry(machine.to_string()).or_default();
        if *count >= reports_handled_per_host_max {
            return None;
        }
        *count += 1;
        Some(HandlingTurn {
            handling: self,
            machine: machine.to_string(),
        })
    }
}

impl Drop for HandlingTurn<'_> {
    fn drop(&mut self) {
        let mut map = self
            .handling
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(count) = map.get_mut(&self.machine) {
            *count = count.saturating_sub(1);
            if *count == 0 {
                map.remove(&self.machine);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_host_is_silent_once_unheard_for_the_threshold_and_a_new_leader_waits_as_long() {
        // Decision 0301: silent once not heard for silent_after; a leader that has not heard the
        // host since it took office waits the same threshold from taking office, then counts
        // its time in office (a lower bound).
        let after = Duration::from_millis(silent_after_ms_default);
        let ms = Duration::from_millis;
        // Heard recently: not silent, up to the last millisecond before the threshold.
        assert_eq!(silent_for(HeardView::Ago(ms(2_000)), after), None);
        assert_eq!(silent_for(HeardView::Ago(after - ms(1)), after), None);
        // Heard long ago: silent for as long as it was not heard.
        assert_eq!(silent_for(HeardView::Ago(after), after), Some(after));
        assert_eq!(
            silent_for(HeardView::Ago(ms(50_000)), after),
            Some(ms(50_000))
        );
        // Never heard, the leader new: it may simply not have reported to this leader yet.
        assert_eq!(silent_for(HeardView::NotSince(Duration::ZERO), after), None);
        assert_eq!(silent_for(HeardView::NotSince(after - ms(1)), after), None);
        // Never heard, the leader in office for the threshold or longer: silent at least as long.
        assert_eq!(silent_for(HeardView::NotSince(after), after), Some(after));
        assert_eq!(
            silent_for(HeardView::NotSince(ms(90_000)), after),
            Some(ms(90_000))
        );
    }

    #[test]
    fn a_leader_that_never_hears_a_host_finds_it_silent_once_it_has_led_the_threshold() {
        // Decision 0301: a host dead before the failover is never heard by the new leader; it
        // must still read silent, counted from when that leader took office.
        let after = Duration::from_millis(silent_after_ms_default);
        // A leadership's memory is made when it takes office (`leadership::Office`).
        let live = Liveness::new();
        let now = Instant::now();
        assert_eq!(silent_for(live.view("ace", now), after), None);
        assert!(silent_for(live.view("ace", now + after), after).is_some());
    }

    #[test]
    fn a_silent_host_clears_when_it_reports_again() {
        // Decision 0301: it comes back by itself, at the next report the leader hears.
        let live = Liveness::new();
        let a = account(report(10, 0));
        let after = Duration::from_millis(silent_after_ms_default);
        let t0 = Instant::now();
        assert_eq!(live.route(Some(&a), true, &report(11, 0), t0), Route::Heard);
        let later = t0 + after + Duration::from_millis(1);
        assert!(silent_for(live.view("ace", later), after).is_some());
        assert_eq!(
            live.route(Some(&a), true, &report(12, 0), later),
            Route::Heard
        );
        assert_eq!(silent_for(live.view("ace", later), after), None);
    }

    fn report(report_sequence: u64, restarts: u32) -> Report {
        Report {
            machine: "ace".into(),
            epoch: 2,
            sequence: 3,
            report_sequence,
            applied: None,
            modules: vec![crate::core::report::ModuleStatus {
                name: "web".into(),
                state: crate::core::report::ModuleState::Ready,
                restarts,
                pid: Some(7),
                last_exit: None,
                drift: Vec::new(),
            }],
            refused_older: 0,
            last_refusal: None,
            proof: None,
        }
    }

    fn account(last: Report) -> Account {
        let mut a = Account::default();
        a.file(last);
        a
    }

    #[test]
    fn only_a_newer_unchanged_report_is_heard_without_a_proposal() {
        let a = account(report(10, 0));
        assert_eq!(
            route(Some(&a), None, false, true, &report(11, 0)),
            Route::Heard
        );
        // Changed: filed.
        assert_eq!(
            route(Some(&a), None, false, true, &report(11, 1)),
            Route::File { heard: None }
        );
        // Not newer than the account: filed, to be refused and counted.
        assert!(matches!(
            route(Some(&a), None, false, true, &report(10, 0)),
            Route::File { .. }
        ));
        // Not newer than what was heard: filed with the heard position, refused and counted.
        let heard = Some(report(15, 0).position());
        assert_eq!(
            route(Some(&a), heard, false, true, &report(14, 0)),
            Route::File { heard }
        );
        assert_eq!(
            route(Some(&a), heard, false, true, &report(16, 0)),
            Route::Heard
        );
        // A report of the machine is being filed, or the leader has not applied its term yet.
        assert!(matches!(
            route(Some(&a), None, true, true, &report(11, 0)),
            Route::File { .. }
        ));
        assert!(matches!(
            route(Some(&a), None, false, false, &report(11, 0)),
            Route::File { .. }
        ));
        // Never filed: filed.
        assert!(matches!(
            route(None, None, false, true, &report(1, 0)),
            Route::File { .. }
        ));
    }

    fn done(report: &Report, known: bool) -> Done {
        Done {
            machine: report.machine.clone(),
            position: report.position(),
            arrived: Instant::now(),
            known,
            changes: Vec::new(),
        }
    }

    #[test]
    fn a_host_over_its_quota_is_told_to_try_again_and_another_host_is_not() {
        // Issue 23 part 3: one host's reports in flight are bounded, so it cannot take the queue
        // every host shares; another host's report is routed to be filed meanwhile.
        let live = Liveness::new();
        let now = Instant::now();
        let quota = u64::from(reports_in_flight_per_host_max);
        for i in 1..=quota {
            let route = live.route(None, true, &report(i, 0), now);
            assert!(matches!(route, Route::File { .. }), "{i}: {route:?}");
        }
        assert_eq!(
            live.route(None, true, &report(quota + 1, 0), now),
            Route::Busy
        );
        let mut g14 = report(1, 0);
        g14.machine = "g14".into();
        assert!(matches!(
            live.route(None, true, &g14, now),
            Route::File { .. }
        ));
        // One of ace's is filed (or not): ace has room for one more.
        live.filed(&done(&report(1, 0), true), Some(true));
        let route = live.route(None, true, &report(quota + 2, 0), now);
        assert!(matches!(route, Route::File { .. }), "{route:?}");
        assert_eq!(
            live.route(None, true, &report(quota + 3, 0), now),
            Route::Busy
        );
        // Machines outside the model share one quota of their own.
        for _ in 0..quota {
            assert!(matches!(live.route_outsider(), Route::File { .. }));
        }
        assert_eq!(live.route_outsider(), Route::Busy);
        live.filed(&done(&report(1, 0), false), None);
        assert!(matches!(live.route_outsider(), Route::File { .. }));
        // A new term starts every quota afresh: its leadership's memory is new
        // (`leadership::tests`).
    }

    #[test]
    fn a_host_refused_for_size_or_rate_is_named_for_a_minute_with_a_count() {
        // Issue 23 part 4: status names the host while it keeps being refused, then forgets it.
        // The warnings are the service's (`Service::warn_due`), the same limiter as here.
        let live = Liveness::new();
        let warned = mesh_transport::ratelog::LogEvery::default();
        let t0 = Instant::now();
        assert_eq!(live.refused_view("ace", t0), None);
        live.note_refused("ace", "too big", t0);
        assert_eq!(warned.due(("ace".to_string(), "over bound"), t0), Some(0));
        let t1 = t0 + Duration::from_secs(1);
        live.note_refused("ace", "still too big", t1);
        assert_eq!(
            warned.due(("ace".to_string(), "over bound"), t1),
            None,
            "logged once an interval"
        );
        let view = live.refused_view("ace", t1).expect("named");
        assert!(view.starts_with("2 reports refused"), "{view}");
        assert!(view.ends_with("still too big"), "{view}");
        assert_eq!(live.refused_now(t1), 1);
        // Another term's leader did not refuse it: its memory is new (`leadership::tests`).
        let later = t1 + Duration::from_millis(report_refusal_shown_ms);
        assert_eq!(live.refused_view("ace", later), None);
        assert_eq!(live.refused_now(later), 0);
        // A refusal after the minute starts a new count.
        live.note_refused("ace", "again", later);
        let view = live.refused_view("ace", later).expect("named");
        assert!(view.starts_with("1 report refused"), "{view}");
    }
}

#[cfg(test)]
mod handling {
    use super::*;

    #[test]
    fn one_host_has_at_most_its_share_of_reports_handled_and_others_are_not_held_by_it() {
        // Issue 23: a flooding host's reports past reports_handled_per_host_max are refused before
        // they are decoded, another host still gets its turn, and the places come back.
        let handling = Handling::default();
        let turns: Vec<_> = (0..reports_handled_per_host_max)
            .map(|_| handling.enter("ace").expect("a turn"))
            .collect();
        assert!(handling.enter("ace").is_none(), "one more than the share");
        let other = handling
            .enter("g14")
            .expect("another host is not held by ace");
        drop(turns);
        assert!(handling.enter("ace").is_some(), "places come back");
        drop(other);
        let map = handling.0.lock().expect("lock");
        assert!(
            map.is_empty(),
            "no entry outlives its reports: {:?}",
            map.keys()
        );
    }
}
