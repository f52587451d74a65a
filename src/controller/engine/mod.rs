//! The leader's push as a pure state machine (G1, G3, G4, G8), in the manner of openraft's `Engine`
//! and quinn-proto: events go in with the time they happened (`now`), actions come out, and the
//! driver in `push.rs` only carries actions out (proposals, lease rounds, envelopes on the wire)
//! and feeds back what came of them. No tokio, no clock, no randomness, no I/O here: secrets are
//! handed in, time is an argument. The engine owns the steps of a push (plan → `Mint` → holds →
//! `RecordSends` → envelopes, each with the lease's end as its deadline), when it stops (lease
//! lost to another term or not confirmed in several rounds in a row, leadership lost, a refused
//! compare-and-set, a host holding a newer envelope, a send stopped at the write), when it asks
//! for the lease again (renewed from its half, taken again once closed: decision 0270), the
//! sequence of every send, and the compose cache it plans from ([`cache`]).

pub(crate) mod cache;
pub(crate) mod floor;
#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::time::Instant;

pub(crate) use cache::{Cache, Work};
use floor::{FloorCheck, FloorHold, FloorProof, Raised, UnprovenFloor};

use super::api::{ApiError, PlanView, PushError, PushLine, PushOutcome, PushTarget, PushView};
use super::planview::{Reveal, plan_view, what_moved};
use crate::core::compose::MintRequest;
use crate::core::envelope::{Envelope, Position};
use crate::core::plan::{Hold, Known, PlanError, PlanInput, PlannedSend, PushPlan, Target, plan};
use crate::core::report::ModuleState;
use crate::core::summary::summarize;
use crate::limits::envelope_frame_bytes;
use crate::store::command::{Applied, Command, HeldMount, RequestId, SendRecord};
use crate::store::state::DomainState;

/// Envelopes in flight at once during one push.
pub const sends_in_flight_max: usize = 64;
/// Lease rounds in a row that may fail to confirm the push's term (a quorum answering too late)
/// before the push stops with the last one's error (decision 0270).
pub const lease_rounds_failed_max: u32 = 3;
/// How many times one envelope stopped at the write after its lease ended goes back to the
/// queue, to leave again under a later lease of the push's term (decisions 0221, 0270).
pub const gated_resends_max: u8 = 3;
/// What `plan` shows instead of a secret: nothing is minted by a dry run.
pub const placeholder_secret: &str = "<minted at push>";

/// A lease as the engine sees it: the term it was confirmed in, when its quorum round started and
/// the first instant it is closed, all on the driver's lease clock.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Lease {
    pub(crate) epoch: u64,
    pub(crate) started: Instant,
    pub(crate) until: Instant,
}

impl Lease {
    /// From half its window on, the engine acts only once a fresh round renewed it, so no step
    /// starts on a lease about to close (where its write would be stopped at the gate).
    fn renew_at(&self) -> Instant {
        let window = self.until.saturating_duration_since(self.started);
        self.until - window / 2
    }

    fn is_open(&self, now: Instant) -> bool {
        now < self.until
    }
}

/// Why a lease round gave no lease, as the engine needs to know it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum NoLease {
    /// The round did not confirm the term in time (a quorum answered too late, the round took
    /// longer than the lease): this replica may still lead in it, and another round may
    /// confirm it (decision 0270).
    Unconfirmed(String),
    /// This replica does not lead in the term any more, or may not act in it: not the leader,
    /// the term moved, acting stopped for a handover, the Raft core stopped.
    Lost(String),
}

/// Why a push stopped acting (decision 0334): one variant per stop rule, so the engine's tests
/// and the driver match on the rule, not on text. `Display` is what the operator reads on each
/// line the stop fails ("stopped: …") and in the log.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum StopReason {
    /// The proposal in flight did not commit (leadership lost, no answer in time).
    NotCommitted(String),
    /// The kept envelope (a genesis) could not be sealed.
    NotKept(String),
    /// The replica no longer leads in the push's term (its metrics said so).
    Deposed(String),
    /// A lease round confirmed another term than the push's (G3: the push's term is over).
    LeadershipMoved { from: u64, to: u64 },
    /// A lease round found the term lost.
    LeaseLost(String),
    /// Lease rounds gave no lease to act under `rounds` times in a row (decision 0270).
    LeaseUnconfirmed { last: RoundFailure, rounds: u32 },
    /// The store refused a hold's proposal.
    HoldRefused(String),
    /// A host holds a newer envelope, proven by a header a trusted replica signed (G2): another
    /// leader sent after this one.
    NewerEnvelope {
        machine: String,
        refusal: String,
        held: Position,
    },
    /// A send was stopped at the write (G3's gate).
    Gated(String),
}

/// Why one lease round gave no lease to act under, though the term was not lost.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum RoundFailure {
    /// The round did not confirm the term in time.
    Unconfirmed(String),
    /// The round confirmed the term, but its lease closed `late_ms` before the answer came back.
    ClosedBeforeAnswer { term: u64, late_ms: u128 },
}

impl std::fmt::Display for RoundFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RoundFailure::Unconfirmed(e) => write!(f, "lease could not be renewed: {e}"),
            RoundFailure::ClosedBeforeAnswer { term, late_ms } => write!(
                f,
                "lease closed: the lease of term {term} the round confirmed closed {late_ms} ms before it answered"
            ),
        }
    }
}

impl std::fmt::Display for StopReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StopReason::NotCommitted(e) | StopReason::NotKept(e) | StopReason::Deposed(e) => {
                write!(f, "{e}")
            }
            StopReason::LeadershipMoved { from, to } => {
                write!(f, "leadership moved from term {from} to term {to}")
            }
            StopReason::LeaseLost(e) => write!(f, "lease could not be renewed: {e}"),
            StopReason::LeaseUnconfirmed { last, rounds } => {
                write!(f, "{last} ({rounds} rounds in a row failed)")
            }
            StopReason::HoldRefused(e) => write!(f, "the store refused a hold: {e}"),
            StopReason::NewerEnvelope {
                machine,
                refusal,
                held,
            } => write!(
                f,
                "{machine} already holds a newer envelope ({refusal}), proven by a header signed at {held}: another leader sent after this one"
            ),
            StopReason::Gated(e) => write!(f, "{e}"),
        }
    }
}

/// What one push is asked to do.
pub(crate) struct PushJob {
    pub(crate) target: PushTarget,
    pub(crate) why: String,
    pub(crate) moves: Vec<String>,
    pub(crate) saved: Option<Box<PlanView>>,
    /// A machine whose envelope is sealed and handed back instead of sent (a genesis).
    pub(crate) keep: Option<String>,
    /// The operator request this push runs for: its records are proposed as that request
    /// (`Command::Once`), so the request cannot record sends twice.
    pub(crate) request: Option<RequestId>,
}

/// Everything a push starts from: the job, the lease it was planned under, and the state and
/// cache of that moment.
pub(crate) struct Begin<'a> {
    pub(crate) job: PushJob,
    pub(crate) actor: &'a str,
    /// The replica that signs the envelopes.
    pub(crate) signer: u64,
    pub(crate) lease: Lease,
    /// Wall-clock milliseconds, kept in the send records (history only).
    pub(crate) wall_ms: u64,
    pub(crate) state: &'a DomainState,
    /// Current for `state`.
    pub(crate) work: &'a Work,
    /// Values revealed as `plan` reveals them, to compare a saved plan like with like.
    pub(crate) reveal: &'a Reveal,
    /// A fresh secret per mint; `None` when the random source failed.
    pub(crate) secret: &'a mut dyn FnMut(&MintRequest) -> Option<String>,
    /// The transport's frame limit: an envelope over it is never recorded (issue 23).
    pub(crate) frame_bytes_max: usize,
}

/// What happened, fed to [`PushEngine::handle`] with the time it happened.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Event {
    /// The lease round the engine asked for: a lease, or why there is none.
    Lease(Result<Lease, NoLease>),
    /// The proposal in flight committed.
    Committed(Applied),
    /// The store refused the proposal in flight (a moved revision, a stale epoch).
    Refused(String),
    /// The proposal in flight did not commit (leadership lost, no answer in time).
    Failed(String),
    /// The kept envelope was sealed, or why not.
    Kept(Result<(), String>),
    /// What came of one envelope.
    Answered { machine: String, answer: HostAnswer },
    /// The replica no longer leads in the push's term.
    Deposed(String),
    /// Time passed (the driver wakes the engine at [`PushEngine::wake_at`]).
    Tick,
}

/// What came of one envelope, as the driver saw it.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum HostAnswer {
    Applied,
    /// The host refused it; `older` when it says it already holds a newer envelope (G2).
    /// `proven`: the highest position the host has shown with a header signed by a trusted
    /// replica (its last filed report's proof), as the driver found it; only a refusal at or
    /// below that stops the push (issue 27 part 4).
    Refused {
        refusal: String,
        older: bool,
        proven: Option<Position>,
    },
    /// Perhaps written, never confirmed (no answer in time, unreadable answer).
    Unconfirmed(String),
    /// Never written: no address, the envelope could not be sealed.
    NotSent(String),
    /// Never written: the gate at the write was closed (G3).
    Gated(String),
}

/// What the driver must do.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Action {
    /// Run a quorum round and feed [`Event::Lease`].
    ConfirmLease,
    /// Propose `command` and feed [`Event::Committed`], [`Event::Refused`] or [`Event::Failed`].
    Propose {
        epoch: u64,
        expect: Option<u64>,
        command: Command,
    },
    /// Seal `envelope` and send it to its machine; no byte may be written at or after
    /// `deadline`, or after the latest [`Action::Extend`] of this push if that is later. Feed
    /// [`Event::Answered`].
    Send {
        envelope: Envelope,
        deadline: Instant,
    },
    /// A renewal in the push's own term moved the lease's end to `until`: every send of this
    /// push still on its way may write until then (decision 0221). Never emitted once the push
    /// stopped, nor for a lease of another term.
    Extend { until: Instant },
    /// Seal `envelope` and keep it for the answer (a genesis), only before `deadline`. Feed
    /// [`Event::Kept`].
    Keep {
        envelope: Envelope,
        deadline: Instant,
    },
    /// One machine's line is final (for a push that streams them).
    Line(PushLine),
    /// The push stopped acting; log it.
    Stopped { epoch: u64, reason: StopReason },
    /// A host refused an envelope as older than one it holds, and nothing signed by a trusted
    /// replica proves that it does (a mark edited or corrupt on its disk): log it, count it in
    /// `/metrics` and show it in `status`. The machine's line failed; the push goes on once a
    /// quorum round that began after the refusal confirmed the push's term.
    Unproven { machine: String, refusal: String },
    /// The floor unproven after a restore is proven (G9, decision 0274): remove the marker and
    /// log why. The push goes on.
    FloorProven(FloorProof),
    /// The floor is unproven and `machine` holds `epoch`, at or above the push's term: the term
    /// was used before, the floor goes to `floor` (log it; decision 0274).
    LeaveTerm {
        machine: String,
        epoch: u64,
        floor: u64,
    },
    /// Propose `RaiseEpochFloor { epoch: floor }` in `epoch` as `host:{machine}` (the host whose
    /// mark proved the term used) and feed [`Event::Committed`], [`Event::Refused`] or
    /// [`Event::Failed`]. The push then holds every machine.
    RaiseFloor {
        epoch: u64,
        floor: u64,
        machine: String,
    },
    /// The push's answer. Nothing is in flight any more; the engine is done.
    Answer(Result<PushView, ApiError>),
}

/// The step a push is at.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Step {
    /// The floor is unproven and goes up before every machine is held (decision 0274).
    FloorRaise,
    Mints,
    Holds,
    Records,
    Keep,
    Sending,
    Done,
}

/// One push, from its plan to its answer.
pub(crate) struct PushEngine {
    lease: Lease,
    renewing: bool,
    /// An unproven older refusal came at this instant: nothing more is sent until a lease
    /// whose quorum round started at or after it confirms the push's term.
    reconfirm_from: Option<Instant>,
    /// Lease rounds in a row that did not confirm the push's term.
    failed_rounds: u32,
    /// Per send, how often it went back to the queue after being stopped at the write.
    resent: Vec<u8>,
    /// The revision the send records are compared with: the plan's, then the mints'.
    revision: u64,
    step: Step,
    /// A proposal or a seal is in flight.
    pending_reply: bool,
    plan: PushPlan,
    /// One per send of the plan, in plan order.
    records: Vec<SendRecord>,
    holds: VecDeque<Command>,
    signer: u64,
    keep: Option<usize>,
    request: Option<RequestId>,
    /// Indexes of sends not yet handed out, in plan order.
    queue: VecDeque<usize>,
    /// Sends handed out and not answered: their index and the lease end they went out under.
    in_flight: BTreeMap<String, (usize, Instant)>,
    lines: Vec<Option<PushLine>>,
    /// Machines whose envelope the transport would refuse: not recorded, their line failed.
    undeliverable: Vec<PushLine>,
    stopped: Option<StopReason>,
    /// Held by an unproven floor (decision 0274): such a push never began.
    held_by_floor: bool,
    /// While the floor's raise is in flight: the machines to answer `held` once it came back, or
    /// why they cannot be planned.
    floor_held: Option<FloorHeld>,
}

/// A push held by an unproven floor whose raise is in flight.
struct FloorHeld {
    machine: String,
    epoch: u64,
    floor: u64,
    machines: Result<Vec<String>, ApiError>,
}

impl PushEngine {
    /// Plans the push and returns the engine with its first actions (a push under a proven
    /// floor; the driver calls [`PushEngine::begin_under`]).
    #[cfg(test)]
    pub(crate) fn begin(now: Instant, b: Begin<'_>) -> (PushEngine, Vec<Action>) {
        PushEngine::begin_under(now, b, None)
    }

    /// [`PushEngine::begin`] under a floor unproven since a restore (`Some`, decision 0274): the
    /// engine decides the G9 hold first — the floor proven (the push goes on), every machine held,
    /// or the floor raised then every machine held.
    pub(crate) fn begin_under(
        now: Instant,
        b: Begin<'_>,
        unproven: Option<UnprovenFloor<'_>>,
    ) -> (PushEngine, Vec<Action>) {
        let lease = b.lease;
        let mut out = Vec::new();
        if let Some(floor) = unproven {
            match floor::check(lease.epoch, b.state, b.job.keep.as_deref(), floor) {
                FloorCheck::Proven(proof) => out.push(Action::FloorProven(proof)),
                FloorCheck::Hold(hold) => {
                    let mut engine = PushEngine::failed(lease);
                    engine.held_by_floor = true;
                    out.push(Action::Answer(held_all(&b, lease.epoch, &hold)));
                    return (engine, out);
                }
                FloorCheck::Raise {
                    machine,
                    epoch,
                    floor,
                } => {
                    let mut engine = PushEngine::failed(lease);
                    engine.step = Step::FloorRaise;
                    engine.pending_reply = true;
                    engine.held_by_floor = true;
                    out.push(Action::LeaveTerm {
                        machine: machine.clone(),
                        epoch,
                        floor,
                    });
                    out.push(Action::RaiseFloor {
                        epoch: lease.epoch,
                        floor,
                        machine: machine.clone(),
                    });
                    engine.floor_held = Some(FloorHeld {
                        machine,
                        epoch,
                        floor,
                        machines: held_machines(&b),
                    });
                    return (engine, out);
                }
            }
        }
        match prepare(b) {
            Ok(mut engine) => {
                out.extend(engine.pump(now));
                (engine, out)
            }
            Err(e) => {
                out.push(Action::Answer(Err(e)));
                (PushEngine::failed(lease), out)
            }
        }
    }

    /// Whether an unproven floor held this push (it never began: nothing was planned to send).
    pub(crate) fn held_by_floor(&self) -> bool {
        self.held_by_floor
    }

    /// The floor's raise came back: every machine is held, the reason saying what became of it.
    fn on_floor_raised(&mut self, event: Event) -> Vec<Action> {
        let Some(held) = self.floor_held.as_ref() else {
            return Vec::new();
        };
        let floor = held.floor;
        let raised = match event {
            Event::Committed(_) => Raised::To { floor },
            Event::Refused(error) | Event::Failed(error) => Raised::Failed { floor, error },
            // Only the raise is in flight; nothing else is waited for.
            _ => return Vec::new(),
        };
        let hold = FloorHold::Leave {
            machine: held.machine.clone(),
            epoch: held.epoch,
            term: self.lease.epoch,
            raised,
        };
        let answer = match &held.machines {
            Ok(machines) => Ok(held_view(self.lease.epoch, machines, &hold)),
            Err(e) => Err(e.clone()),
        };
        self.pending_reply = false;
        self.step = Step::Done;
        vec![Action::Answer(answer)]
    }

    /// An engine that answered at once (bad input, a plan that does not hold).
    fn failed(lease: Lease) -> PushEngine {
        PushEngine {
            lease,
            renewing: false,
            reconfirm_from: None,
            failed_rounds: 0,
            resent: vec![],
            revision: 0,
            step: Step::Done,
            pending_reply: false,
            plan: PushPlan {
                sends: vec![],
                held: vec![],
                mints: vec![],
                holds: vec![],
                rounds: 0,
                digests: BTreeMap::new(),
            },
            records: vec![],
            holds: VecDeque::new(),
            signer: 0,
            keep: None,
            request: None,
            queue: VecDeque::new(),
            in_flight: BTreeMap::new(),
            lines: vec![],
            undeliverable: vec![],
            stopped: None,
            held_by_floor: false,
            floor_held: None,
        }
    }

    /// Whether the push answered.
    #[cfg(test)]
    pub(crate) fn is_done(&self) -> bool {
        self.step == Step::Done
    }

    /// Every machine the push will give a line, sends in plan order then holds (what a
    /// streamed push announces before its lines).
    pub(crate) fn machines(&self) -> Vec<String> {
        let mut machines: Vec<String> = self.plan.sends.iter().map(|s| s.machine.clone()).collect();
        machines.extend(holds_by_machine(&self.plan.holds).into_keys());
        machines.extend(self.undeliverable.iter().map(|l| l.machine.clone()));
        machines
    }

    /// When the engine wants a [`Event::Tick`]: the instant it will ask for the lease again.
    pub(crate) fn wake_at(&self) -> Option<Instant> {
        (self.work_remains() && !self.renewing && self.stopped.is_none())
            .then(|| self.lease.renew_at())
    }

    /// Feeds one event that happened at `now`; returns what to do next.
    pub(crate) fn handle(&mut self, now: Instant, event: Event) -> Vec<Action> {
        if self.step == Step::Done {
            return Vec::new();
        }
        if self.step == Step::FloorRaise {
            return self.on_floor_raised(event);
        }
        let mut out = Vec::new();
        match event {
            Event::Lease(result) => self.on_lease(now, result, &mut out),
            Event::Committed(applied) => self.on_committed(applied, &mut out),
            Event::Refused(reason) => self.on_refused(reason, &mut out),
            Event::Failed(error) => {
                self.pending_reply = false;
                self.stop(StopReason::NotCommitted(error), &mut out);
            }
            Event::Kept(result) => {
                self.pending_reply = false;
                match result {
                    Ok(()) => self.step = Step::Sending,
                    Err(e) => self.stop(StopReason::NotKept(e), &mut out),
                }
            }
            Event::Answered { machine, answer } => self.on_answered(now, machine, answer, &mut out),
            Event::Deposed(reason) => self.stop(StopReason::Deposed(reason), &mut out),
            Event::Tick => {}
        }
        if self.step != Step::Done {
            out.extend(self.pump(now));
        }
        out
    }

    fn on_lease(&mut self, now: Instant, result: Result<Lease, NoLease>, out: &mut Vec<Action>) {
        self.renewing = false;
        match result {
            Ok(lease) if lease.epoch != self.lease.epoch => {
                let reason = StopReason::LeadershipMoved {
                    from: self.lease.epoch,
                    to: lease.epoch,
                };
                self.stop(reason, out);
            }
            Ok(lease) => {
                if self
                    .reconfirm_from
                    .is_some_and(|from| lease.started >= from)
                {
                    self.reconfirm_from = None;
                }
                // A lease of the push's own term, whether the last one was still open (a
                // renewal) or had closed (taken again, decision 0270): the round was a quorum's
                // confirmation of this term after the last, so writes before its end are
                // written under a lease of this term.
                if lease.until > self.lease.until {
                    self.lease = lease;
                    if self.stopped.is_none() {
                        out.push(Action::Extend { until: lease.until });
                    }
                }
                if lease.is_open(now) {
                    self.failed_rounds = 0;
                } else {
                    // Confirmed, but closed before it came back (the replica is paused again
                    // and again, or the round's answer waited): no lease to act under.
                    let reason = RoundFailure::ClosedBeforeAnswer {
                        term: lease.epoch,
                        late_ms: now.duration_since(lease.until).as_millis(),
                    };
                    self.round_failed(reason, out);
                }
            }
            Err(NoLease::Lost(e)) => self.stop(StopReason::LeaseLost(e), out),
            Err(NoLease::Unconfirmed(e)) => {
                self.round_failed(RoundFailure::Unconfirmed(e), out);
            }
        }
    }

    /// A round gave no lease to act under, though the term was not lost: `pump` asks again at
    /// once, up to [`lease_rounds_failed_max`] rounds in a row (decision 0270).
    fn round_failed(&mut self, last: RoundFailure, out: &mut Vec<Action>) {
        self.failed_rounds += 1;
        if self.failed_rounds >= lease_rounds_failed_max {
            let reason = StopReason::LeaseUnconfirmed {
                last,
                rounds: self.failed_rounds,
            };
            self.stop(reason, out);
        }
    }

    fn on_committed(&mut self, applied: Applied, out: &mut Vec<Action>) {
        self.pending_reply = false;
        match (self.step, applied) {
            (Step::Mints, Applied::Minted { revision, .. }) => {
                self.revision = revision;
                self.step = Step::Holds;
            }
            (Step::Mints, other) => self.fail(
                ApiError::internal(format!("the store answered the mints with {other:?}")),
                out,
            ),
            (Step::Holds, _) => {}
            // A record committed for this push names exactly its machines and sequences; anything
            // else (the first outcome of a request id that already ran) is not a licence to send.
            (Step::Records, Applied::Sent { sequences })
                if self.request.is_some()
                    && sequences
                        != self
                        .records
                        .iter()
                        .map(|r| (r.machine.clone(), r.sequence))
                        .collect::<Vec<_>>() =>
            {
                let request = self.request.map_or_else(String::new, |r| r.to_string());
                let machines = sequences.into_iter().map(|(m, _)| m).collect();
                self.fail(PushError::AlreadyRan { request, machines }.into(), out)
            }
            (Step::Records, _) => {
                self.step = if self.keep.is_some() {
                    Step::Keep
                } else {
                    Step::Sending
                };
            }
            (step, other) => self.fail(
                ApiError::internal(format!(
                    "the store answered {other:?} while the push was at {step:?}, with no proposal in flight"
                )),
                out,
            ),
        }
    }

    fn on_refused(&mut self, reason: String, out: &mut Vec<Action>) {
        self.pending_reply = false;
        let what = match self.step {
            Step::Mints => "mints",
            Step::Records => "send records",
            _ => return self.stop(StopReason::HoldRefused(reason), out),
        };
        let what = what.to_string();
        self.fail(PushError::StoreRefused { what, reason }.into(), out);
    }

    fn on_answered(
        &mut self,
        now: Instant,
        machine: String,
        answer: HostAnswer,
        out: &mut Vec<Action>,
    ) {
        let Some((index, under)) = self.in_flight.remove(&machine) else {
            return;
        };
        if matches!(answer, HostAnswer::Gated(_))
            && self.stopped.is_none()
            && (now >= under || self.lease.until > under)
            && self.resent[index] < gated_resends_max
        {
            // Stopped at the write after the lease it left under ended (renewed or taken again
            // in the same term, or the push stops), or with the lease renewed since: it goes
            // back to the head of the queue and leaves again under a later lease of the push's
            // term (decisions 0221, 0270). Refused under a lease still open, or a fourth time, it
            // stops the push as any send stopped at the write.
            self.resent[index] += 1;
            self.queue.push_front(index);
            return;
        }
        let (send, record) = (&self.plan.sends[index], &self.records[index]);
        let reason = send.reason.to_string();
        let mut stop = None;
        let outcome = match answer {
            HostAnswer::Applied => PushOutcome::Applied {
                reason,
                sequence: record.sequence,
                digest: record.digest,
            },
            HostAnswer::Refused {
                refusal,
                older,
                proven,
            } => {
                let ours = Position {
                    epoch: record.epoch,
                    sequence: record.sequence,
                };
                match proven.filter(|held| older && *held >= ours) {
                    Some(held) => {
                        stop = Some(StopReason::NewerEnvelope {
                            machine: machine.clone(),
                            refusal: refusal.clone(),
                            held,
                        });
                        PushOutcome::Refused { reason, refusal }
                    }
                    None if older => {
                        // One host's word alone must not stop every push (issue 27 part 4):
                        // its line fails, and the rest goes on once a fresh quorum round has
                        // confirmed that no other leader of this cluster took over meanwhile.
                        out.push(Action::Unproven {
                            machine: machine.clone(),
                            refusal: refusal.clone(),
                        });
                        self.reconfirm_from = Some(now);
                        PushOutcome::Failed {
                            reason,
                            error: format!(
                                "refused as older ({refusal}), but nothing signed by a trusted replica shows {machine} holding a newer envelope: its mark on disk may be corrupt or edited; check the host, the push went on to the other machines"
                            ),
                        }
                    }
                    None => PushOutcome::Refused { reason, refusal },
                }
            }
            HostAnswer::Unconfirmed(error) => PushOutcome::Sent {
                reason,
                sequence: record.sequence,
                digest: record.digest,
                error,
            },
            HostAnswer::NotSent(error) => PushOutcome::Failed { reason, error },
            HostAnswer::Gated(error) => {
                stop = Some(StopReason::Gated(error.clone()));
                PushOutcome::Failed {
                    reason,
                    error: format!("stopped at the write: {error}"),
                }
            }
        };
        self.settle(index, outcome, out);
        if let Some(reason) = stop {
            self.stop(reason, out);
        }
    }

    fn settle(&mut self, index: usize, outcome: PushOutcome, out: &mut Vec<Action>) {
        let line = PushLine {
            machine: self.plan.sends[index].machine.clone(),
            outcome,
        };
        out.push(Action::Line(line.clone()));
        self.lines[index] = Some(line);
    }

    /// Stops acting: nothing more is proposed, kept or sent. Sends already handed out finish
    /// (their deadline and the gate bound them); the answer waits for them.
    fn stop(&mut self, reason: StopReason, out: &mut Vec<Action>) {
        if self.stopped.is_some() {
            return;
        }
        out.push(Action::Stopped {
            epoch: self.lease.epoch,
            reason: reason.clone(),
        });
        self.stopped = Some(reason);
    }

    fn fail(&mut self, error: ApiError, out: &mut Vec<Action>) {
        self.step = Step::Done;
        out.push(Action::Answer(Err(error)));
    }

    fn work_remains(&self) -> bool {
        match self.step {
            Step::Mints | Step::Holds | Step::Records | Step::Keep => true,
            // Only the floor's raise is in flight; no lease is needed for it.
            Step::FloorRaise => false,
            // Sends on their way count: their writes run under the lease, so it is renewed
            // until every one answered (decision 0221).
            Step::Sending => !self.queue.is_empty() || !self.in_flight.is_empty(),
            Step::Done => false,
        }
    }

    /// Takes every step that can be taken at `now`.
    fn pump(&mut self, now: Instant) -> Vec<Action> {
        let mut out = Vec::new();
        if self.stopped.is_none() && self.work_remains() && !self.renewing {
            // From its half on the lease is renewed; one already closed is taken again by a
            // fresh quorum round of the same term (the replica may have been paused past it
            // and another leader elected: then that round fails or answers another term, and
            // the push stops). Nothing is proposed or sent until a lease is confirmed
            // (decision 0270).
            // After an unproven older refusal, a round that begins now, whatever the lease's age.
            if now >= self.lease.renew_at() || self.reconfirm_from.is_some() {
                self.renewing = true;
                out.push(Action::ConfirmLease);
            }
        }
        loop {
            if self.pending_reply {
                return out;
            }
            if let Some(reason) = self.stopped.clone() {
                self.finish_stopped(&reason, &mut out);
                return out;
            }
            // While a renewal is out no proposal starts, even on a lease still open. Sends do, on
            // a lease still open: each writes only under the lease as the renewal extends it, and
            // is stopped at the write if it does not (decision 0221).
            let may_act = !self.renewing && self.lease.is_open(now);
            let may_send = self.lease.is_open(now) && self.reconfirm_from.is_none();
            match self.step {
                Step::Mints if self.plan.mints.is_empty() => self.step = Step::Holds,
                Step::Holds if self.holds.is_empty() => self.step = Step::Records,
                Step::Records if self.records.is_empty() => self.step = Step::Sending,
                Step::Mints | Step::Holds | Step::Records if !may_act => return out,
                Step::Mints => {
                    out.push(self.propose(
                        Some(self.revision),
                        Command::Mint {
                            provisions: self.plan.mints.clone(),
                        },
                    ));
                }
                Step::Holds => {
                    if let Some(command) = self.holds.pop_front() {
                        out.push(self.propose(None, command));
                    }
                }
                Step::Records => {
                    let records = Command::RecordSends {
                        sends: self.records.clone(),
                    };
                    let command = match self.request {
                        Some(request) => Command::Once {
                            request,
                            command: Box::new(records),
                        },
                        None => records,
                    };
                    out.push(self.propose(Some(self.revision), command));
                }
                Step::Keep => {
                    if !may_act {
                        return out;
                    }
                    let Some(index) = self.keep else {
                        self.step = Step::Sending;
                        continue;
                    };
                    self.pending_reply = true;
                    out.push(Action::Keep {
                        envelope: self.envelope(index),
                        deadline: self.lease.until,
                    });
                }
                Step::Sending => {
                    self.send_more(now, may_send, &mut out);
                    if self.queue.is_empty() && self.in_flight.is_empty() {
                        self.finish(&mut out);
                    }
                    return out;
                }
                Step::FloorRaise | Step::Done => return out,
            }
        }
    }

    fn propose(&mut self, expect: Option<u64>, command: Command) -> Action {
        self.pending_reply = true;
        Action::Propose {
            epoch: self.lease.epoch,
            expect,
            command,
        }
    }

    fn send_more(&mut self, now: Instant, may_act: bool, out: &mut Vec<Action>) {
        while may_act && self.in_flight.len() < sends_in_flight_max {
            let Some(index) = self.queue.pop_front() else {
                return;
            };
            let envelope = self.envelope(index);
            // G3: an envelope leaves only under an open lease of the push's own term, and only
            // with the stopped push sending nothing more. Broken, the engine has a bug.
            assert!(
                self.stopped.is_none() && self.lease.is_open(now),
                "send of {}.{} to {} handed out without an open lease",
                envelope.epoch,
                envelope.sequence,
                envelope.machine
            );
            assert_eq!(
                envelope.epoch, self.lease.epoch,
                "an envelope of another epoch than the push's lease"
            );
            let machine = self.plan.sends[index].machine.clone();
            self.in_flight.insert(machine, (index, self.lease.until));
            out.push(Action::Send {
                envelope,
                deadline: self.lease.until,
            });
        }
    }

    fn envelope(&self, index: usize) -> Envelope {
        envelope_of(&self.plan.sends[index], &self.records[index], self.signer)
    }

    /// A stopped push answers once nothing is in flight: before its records were committed (or
    /// its genesis kept) every machine fails with the reason; after, every line stands.
    fn finish_stopped(&mut self, reason: &StopReason, out: &mut Vec<Action>) {
        if self.step == Step::Sending {
            // Named now, not when the sends in flight come back: nothing more leaves.
            while let Some(index) = self.queue.pop_front() {
                let outcome = PushOutcome::Failed {
                    reason: self.plan.sends[index].reason.to_string(),
                    error: format!("stopped: {reason}"),
                };
                self.settle(index, outcome, out);
            }
        }
        if !self.in_flight.is_empty() {
            return;
        }
        if self.step == Step::Sending {
            return self.finish(out);
        }
        let mut machines: Vec<String> = self.plan.sends.iter().map(|s| s.machine.clone()).collect();
        machines.extend(holds_by_machine(&self.plan.holds).into_keys());
        let mut lines = Vec::new();
        for machine in machines {
            let line = PushLine {
                machine,
                outcome: PushOutcome::Failed {
                    reason: "stopped".into(),
                    error: format!("stopped: {reason}"),
                },
            };
            out.push(Action::Line(line.clone()));
            lines.push(line);
        }
        self.settle_undeliverable(&mut lines, out);
        self.step = Step::Done;
        out.push(Action::Answer(Ok(PushView {
            epoch: self.lease.epoch,
            lines,
        })));
    }

    /// The lines of the machines never recorded because their envelope is over the frame limit.
    fn settle_undeliverable(&mut self, lines: &mut Vec<PushLine>, out: &mut Vec<Action>) {
        for line in std::mem::take(&mut self.undeliverable) {
            out.push(Action::Line(line.clone()));
            lines.push(line);
        }
    }

    fn finish(&mut self, out: &mut Vec<Action>) {
        let mut lines: Vec<PushLine> = self.lines.iter_mut().filter_map(Option::take).collect();
        for (machine, holds) in holds_by_machine(&self.plan.holds) {
            let line = PushLine {
                machine,
                outcome: PushOutcome::Held {
                    reason: "held".into(),
                    holds,
                },
            };
            out.push(Action::Line(line.clone()));
            lines.push(line);
        }
        self.settle_undeliverable(&mut lines, out);
        self.step = Step::Done;
        out.push(Action::Answer(Ok(PushView {
            epoch: self.lease.epoch,
            lines,
        })));
    }
}

/// Refuses a push without a reason before anything else happens.
pub(crate) fn check_why(why: &str) -> Result<(), ApiError> {
    if why.trim().is_empty() {
        return Err(PushError::NoReason.into());
    }
    Ok(())
}

/// Plans the push, checks a saved plan still holds, and lays out its records and holds.
fn prepare(b: Begin<'_>) -> Result<PushEngine, ApiError> {
    let Begin {
        job,
        actor,
        signer,
        lease,
        wall_ms,
        state,
        work,
        reveal,
        secret,
        frame_bytes_max,
    } = b;
    check_why(&job.why)?;
    let target = target_of(state, job.target.clone())?;
    let known = known_of(state);
    let moves: BTreeSet<String> = job.moves.iter().cloned().collect();
    let mut random_failed = false;
    let mut draw = |r: &MintRequest| {
        secret(r).unwrap_or_else(|| {
            random_failed = true;
            String::new()
        })
    };
    let planned = plan(PlanInput {
        world: work.world(),
        cache: work.cache(),
        known: &known,
        target: &target,
        moves: &moves,
        secret: &mut draw,
    })
    .map_err(plan_error)?;
    if let Some(saved) = &job.saved {
        // Revealed as `plan` revealed them, so what moved compares like with like; the token
        // itself never covers revealed values.
        let now = plan_view(state, job.target, job.moves.clone(), &planned, reveal);
        if now.token != saved.token {
            return Err(PushError::PlanMoved {
                token: saved.token.clone(),
                moved: what_moved(saved, &now),
            }
            .into());
        }
    }
    if random_failed {
        return Err(ApiError::Random {
            what: "minting secrets".into(),
        });
    }
    let mut planned = planned;
    let mut records = send_records(
        lease.epoch,
        actor,
        &job.why,
        &job.moves,
        wall_ms,
        state,
        &planned,
    );
    assert_sequences_rise(state, &records);
    let undeliverable = drop_undeliverable(&mut planned, &mut records, signer, frame_bytes_max);
    if let Some(kept) = job.keep.as_deref()
        && let Some(line) = undeliverable.iter().find(|l| l.machine == kept)
        && let PushOutcome::Failed { error, .. } = &line.outcome
    {
        return Err(PushError::EnvelopeTooLarge {
            machine: kept.to_string(),
            reason: error.clone(),
        }
        .into());
    }
    let mut holds = VecDeque::new();
    for (machine, held) in holds_by_machine(&planned.holds) {
        holds.push_back(Command::SetHolds {
            machine,
            holds: held,
        });
    }
    for send in &planned.sends {
        if state.holds.contains_key(&send.machine) {
            holds.push_back(Command::ReleaseHolds {
                machine: send.machine.clone(),
            });
        }
    }
    let keep = job
        .keep
        .as_deref()
        .and_then(|k| planned.sends.iter().position(|s| s.machine == k));
    let queue = (0..planned.sends.len())
        .filter(|i| Some(*i) != keep)
        .collect();
    let lines = vec![None; planned.sends.len()];
    let resent = vec![0; planned.sends.len()];
    Ok(PushEngine {
        lease,
        renewing: false,
        reconfirm_from: None,
        failed_rounds: 0,
        resent,
        revision: state.revision,
        step: Step::Mints,
        pending_reply: false,
        plan: planned,
        records,
        holds,
        signer,
        keep,
        request: job.request,
        queue,
        in_flight: BTreeMap::new(),
        lines,
        undeliverable,
        stopped: None,
        held_by_floor: false,
        floor_held: None,
    })
}

/// Every machine a push of `b` would send to or hold, as `plan` plans it (placeholder secrets,
/// nothing revealed): what an unproven floor holds.
fn held_machines(b: &Begin<'_>) -> Result<Vec<String>, ApiError> {
    let planned = plan_dry(
        b.state,
        b.work,
        b.job.target.clone(),
        b.job.moves.clone(),
        &Reveal::none(),
    )?;
    Ok(planned.machines.into_iter().map(|m| m.machine).collect())
}

/// The answer of a push held by an unproven floor: every machine it would send to, held with
/// `hold`'s reason; nothing recorded, nothing sent.
fn held_all(b: &Begin<'_>, epoch: u64, hold: &FloorHold) -> Result<PushView, ApiError> {
    held_machines(b).map(|machines| held_view(epoch, &machines, hold))
}

fn held_view(epoch: u64, machines: &[String], hold: &FloorHold) -> PushView {
    let reason = hold.to_string();
    let lines = machines
        .iter()
        .map(|machine| PushLine {
            machine: machine.clone(),
            outcome: PushOutcome::Held {
                reason: reason.clone(),
                holds: vec![],
            },
        })
        .collect();
    PushView { epoch, lines }
}

/// G4: every record of a push is one machine's next sequence, strictly above the last send the
/// store recorded to it, and names each machine once. The records are made from the state here:
/// broken, this code has a bug (the store would refuse them anyway).
fn assert_sequences_rise(state: &DomainState, records: &[SendRecord]) {
    let mut machines = BTreeSet::new();
    for record in records {
        let last = state
            .last_sends
            .get(&record.machine)
            .map_or(0, |s| s.sequence);
        assert!(
            record.sequence > last,
            "send record {}.{} to {} is not above the last recorded sequence {last}",
            record.epoch,
            record.sequence,
            record.machine
        );
        assert!(
            machines.insert(record.machine.as_str()),
            "two send records to {} in one push",
            record.machine
        );
    }
}

/// The envelope of one planned send under its record.
fn envelope_of(send: &PlannedSend, record: &SendRecord, signer: u64) -> Envelope {
    Envelope {
        machine: send.machine.clone(),
        epoch: record.epoch,
        sequence: record.sequence,
        signer,
        moves: record.moves.clone(),
        declaration: send.declaration.clone(),
    }
}

/// Takes out of the plan every send whose envelope, sealed and framed, would be over the
/// transport's `frame_bytes_max` (issue 23): the transport would refuse it at every try, so it is
/// never recorded (a recorded send that can never arrive leaves the machine behind for good).
/// Each gets a failed line saying why. `validate` refuses models that could give one; this is
/// the check at the send itself.
fn drop_undeliverable(
    planned: &mut PushPlan,
    records: &mut Vec<SendRecord>,
    signer: u64,
    frame_bytes_max: usize,
) -> Vec<PushLine> {
    let mut lines = Vec::new();
    let mut index = 0;
    while index < planned.sends.len() {
        let envelope = envelope_of(&planned.sends[index], &records[index], signer);
        let Some(error) = too_large(&envelope, frame_bytes_max) else {
            index += 1;
            continue;
        };
        let send = planned.sends.remove(index);
        records.remove(index);
        lines.push(PushLine {
            machine: send.machine,
            outcome: PushOutcome::Failed {
                reason: send.reason.to_string(),
                error,
            },
        });
    }
    lines
}

/// Why `envelope` cannot be sent under `frame_bytes_max`, naming its largest module; `None` when
/// it fits.
fn too_large(envelope: &Envelope, frame_bytes_max: usize) -> Option<String> {
    let bytes = match envelope_frame_bytes(envelope) {
        Ok(bytes) if bytes <= frame_bytes_max => return None,
        Ok(bytes) => bytes,
        Err(e) => return Some(format!("not recorded: the envelope cannot be encoded: {e}")),
    };
    let mut largest: Option<(&str, usize)> = None;
    for module in &envelope.declaration.modules {
        // allow(empty-on-error): a module that cannot be counted is not named as the largest
        let size = mesh_codec::encoded_len("declared module", module).unwrap_or(0);
        if largest.is_none_or(|(_, most)| size > most) {
            largest = Some((&module.name, size));
        }
    }
    let part = match largest {
        Some((module, size)) => format!("module `{module}` is its largest part ({size} bytes); "),
        None => String::new(),
    };
    Some(format!(
        "not recorded: its envelope would be a frame of {bytes} bytes, over the limit of {frame_bytes_max} bytes (frame_bytes_max), so the transport would refuse it; {part}make the machine's declaration smaller (move large `files` contents onto a mount the module reads), apply and push again"
    ))
}

/// One record per send, each at the machine's next sequence (G4: the store refuses any other).
fn send_records(
    epoch: u64,
    actor: &str,
    why: &str,
    moves: &[String],
    time_ms: u64,
    state: &DomainState,
    planned: &PushPlan,
) -> Vec<SendRecord> {
    let mut out = Vec::new();
    for s in &planned.sends {
        let on_machine: Vec<String> = moves
            .iter()
            .filter(|m| s.declaration.modules.iter().any(|d| d.name == **m))
            .cloned()
            .collect();
        out.push(SendRecord {
            machine: s.machine.clone(),
            epoch,
            sequence: state.next_sequence(&s.machine),
            digest: s.digest,
            summary: std::sync::Arc::new(summarize(&s.declaration)),
            why: why.to_string(),
            actor: actor.to_string(),
            time_ms,
            moves: on_machine,
        });
    }
    out
}

/// `plan`: everything a push of `target` would do, planned exactly as the push plans, with
/// placeholder secrets; writes nothing (G7).
pub(crate) fn plan_dry(
    state: &DomainState,
    work: &Work,
    target: PushTarget,
    moves: Vec<String>,
    reveal: &Reveal,
) -> Result<PlanView, ApiError> {
    let planned_target = target_of(state, target.clone())?;
    let known = known_of(state);
    let moves_set: BTreeSet<String> = moves.iter().cloned().collect();
    let mut secret = |_: &MintRequest| placeholder_secret.to_string();
    let planned = plan(PlanInput {
        world: work.world(),
        cache: work.cache(),
        known: &known,
        target: &planned_target,
        moves: &moves_set,
        secret: &mut secret,
    })
    .map_err(plan_error)?;
    Ok(plan_view(state, target, moves, &planned, reveal))
}

/// What the controller knows of each machine, for planning (G1, G8).
pub(crate) fn known_of(state: &DomainState) -> BTreeMap<String, Known> {
    let mut known = BTreeMap::new();
    for (machine, send) in &state.last_sends {
        let report = state.accounts.get(machine).and_then(|a| a.report.as_ref());
        let confirmed = state.confirmed(machine);
        let mut running_mounts = BTreeMap::new();
        for (module, summary) in &send.summary.modules {
            let stopped = report.is_some_and(|r| {
                r.modules.iter().any(|m| {
                    m.name == *module
                        && matches!(m.state, ModuleState::Failed { .. } | ModuleState::Stopped)
                })
            });
            if stopped {
                continue;
            }
            let mounts: BTreeMap<String, String> = summary
                .mounts
                .iter()
                .map(|(name, (host_dir, _))| (name.clone(), host_dir.clone()))
                .collect();
            running_mounts.insert(module.clone(), mounts);
        }
        known.insert(
            machine.clone(),
            Known {
                last_sent: Some(send.digest),
                confirmed,
                running_mounts,
                last_summary: Some(std::sync::Arc::clone(&send.summary)),
                // allow(empty-on-error): a machine that never reported has shown no drift
                drifted: report.map(drifted_of).unwrap_or_default(),
            },
        );
    }
    known
}

/// What a report says differs on its machine, as `module: what` (decision 0305).
pub(crate) fn drifted_of(report: &crate::core::report::Report) -> Vec<String> {
    let mut out = Vec::new();
    for m in &report.modules {
        for what in &m.drift {
            out.push(format!("{}: {what}", m.name));
        }
    }
    out
}

/// The planning target of a push or plan request; an unknown machine is bad input.
fn target_of(state: &DomainState, target: PushTarget) -> Result<Target, ApiError> {
    Ok(match target {
        PushTarget::Machine(m) if !state.mesh.machines.contains_key(&m) => {
            return Err(PushError::UnknownMachine { machine: m }.into());
        }
        PushTarget::Machine(m) => Target::Machine(m),
        PushTarget::Behind => Target::Behind,
        PushTarget::All => Target::All,
    })
}

fn plan_error(e: PlanError) -> ApiError {
    ApiError::Push(match e {
        PlanError::Compose(c) => PushError::DoesNotCompose {
            reason: c.to_string(),
        },
        PlanError::MoveNotApplicable { module, reason } => {
            PushError::MoveNotApplicable { module, reason }
        }
        other => PushError::PlanFailed {
            reason: other.to_string(),
        },
    })
}

/// Holds grouped by machine.
fn holds_by_machine(holds: &[Hold]) -> BTreeMap<String, Vec<HeldMount>> {
    let mut out: BTreeMap<String, Vec<HeldMount>> = BTreeMap::new();
    for h in holds {
        out.entry(h.machine.clone()).or_default().push(HeldMount {
            module: h.module.clone(),
            mount: h.mount.clone(),
            old_dir: h.old_dir.clone(),
            new_dir: h.new_dir.clone(),
        });
    }
    out
}
