//! The lease gate (G3): the leader acts only inside a lease confirmed by a quorum round.
//!
//! [`Gate::acquire`] records `start = clock.now()`, checks this node leads in term T, confirms leadership
//! with a quorum round (`ensure_linearizable`), checks it still leads in T, and hands out a [`Lease`]
//! valid until `start + election_timeout_min − lease_margin`. Why that is safe is in
//! `docs/decisions/0030-lease-gate.md`.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use openraft::ServerState;
use openraft::error::{CheckIsLeaderError, RaftError};
use openraft::raft::{VoteRequest, VoteResponse};

use crate::{NodeId, Raft, RaftConfig};

/// A monotonic time source. The gate reads it; tests substitute one they advance by hand.
pub trait Clock: Send + Sync {
    fn now(&self) -> Instant;
}

/// The real monotonic clock.
#[derive(Clone, Copy, Debug, Default)]
pub struct MonotonicClock;

impl Clock for MonotonicClock {
    fn now(&self) -> Instant {
        Instant::now()
    }
}

/// The clock leases are read on: `CLOCK_BOOTTIME`, which keeps counting while the system is
/// suspended (CLOCK_MONOTONIC, behind `Instant`, stops). A leader suspended past its lease finds it
/// closed on resume, because its followers' election timers ran on (decision 0100). It hands out
/// `Instant`s: the instant it was made plus the boot time elapsed since.
#[derive(Clone, Copy, Debug)]
pub struct BootClock {
    origin: Instant,
    origin_boot: Duration,
    source: fn() -> Option<Duration>,
}

/// `CLOCK_BOOTTIME` now, as time since boot.
fn boot_time() -> Option<Duration> {
    let t = nix::time::clock_gettime(nix::time::ClockId::CLOCK_BOOTTIME).ok()?;
    let secs = u64::try_from(t.tv_sec()).ok()?;
    let nanos = u32::try_from(t.tv_nsec()).ok()?;
    Some(Duration::new(secs, nanos))
}

/// How far a clock that cannot be read is taken to have run: far past any lease, so a leader
/// that cannot tell the time acts under no lease (fail closed).
const unreadable_clock_jump: Duration = Duration::from_secs(365 * 24 * 3600);

impl BootClock {
    /// The system's boot-time clock; `None` if it cannot be read.
    pub fn new() -> Option<BootClock> {
        BootClock::with_source(boot_time)
    }

    /// A boot-time clock over `source` (a test passes one that jumps, as a suspend does).
    pub fn with_source(source: fn() -> Option<Duration>) -> Option<BootClock> {
        Some(BootClock {
            origin: Instant::now(),
            origin_boot: source()?,
            source,
        })
    }
}

impl Clock for BootClock {
    fn now(&self) -> Instant {
        let elapsed = match (self.source)() {
            Some(boot) => boot.saturating_sub(self.origin_boot),
            None => unreadable_clock_jump,
        };
        self.origin + elapsed
    }
}

/// A clock that moves only when a test advances it.
#[derive(Debug)]
pub struct TestClock {
    now: Mutex<Instant>,
}

impl Default for TestClock {
    fn default() -> Self {
        Self::new()
    }
}

impl TestClock {
    /// A test clock starting at the real current instant.
    pub fn new() -> Self {
        Self {
            now: Mutex::new(Instant::now()),
        }
    }

    /// Moves the clock forward by `by`.
    pub fn advance(&self, by: Duration) {
        let mut now = self
            .now
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        *now += by;
    }
}

impl Clock for TestClock {
    fn now(&self) -> Instant {
        *self
            .now
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// Leadership in one term, valid until an instant of the clock it was acquired with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Lease {
    term: u64,
    started: Instant,
    valid_until: Instant,
}

impl Lease {
    /// The term (epoch) this lease was confirmed in.
    pub fn term(&self) -> u64 {
        self.term
    }

    /// When the confirming round started.
    pub fn started(&self) -> Instant {
        self.started
    }

    /// The first instant at which the lease is closed.
    pub fn valid_until(&self) -> Instant {
        self.valid_until
    }

    /// Whether the lease is still open at `now`.
    pub fn is_open(&self, now: Instant) -> bool {
        now < self.valid_until
    }

    /// `Ok(time left)` while open; the error to fail an in-flight action with once closed.
    pub fn check(&self, now: Instant) -> Result<Duration, GateError> {
        if self.is_open(now) {
            return Ok(self.valid_until - now);
        }
        Err(GateError::LeaseClosed {
            term: self.term,
            closed_for_ms: now.duration_since(self.valid_until).as_millis() as u64,
        })
    }
}

/// Why no lease was handed out, or why a lease no longer holds.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GateError {
    #[error("this replica is not the leader (leader: {leader:?}); send the request to the leader")]
    NotLeader { leader: Option<NodeId> },
    #[error(
        "leadership in term {term} was not confirmed by a quorum: {reason}; nothing may be sent until it is"
    )]
    NotConfirmed { term: u64, reason: String },
    #[error(
        "the quorum round of term {term} took longer than the lease ({window_ms} ms); the lease would be closed already — retry when the cluster is healthy"
    )]
    RoundTooSlow { term: u64, window_ms: u64 },
    #[error(
        "the term moved from {before} to {after} during the quorum round; acquire the lease again"
    )]
    TermMoved { before: u64, after: u64 },
    #[error(
        "the lease of term {term} closed {closed_for_ms} ms ago; stop sending and acquire a new lease"
    )]
    LeaseClosed { term: u64, closed_for_ms: u64 },
    #[error("the replica is stopping; no lease can be acquired")]
    Stopped,
    #[error(
        "this replica stopped acting under its lease to hand its leadership over; nothing more is sent from it — the next leader sends"
    )]
    StoppedActing,
}

/// Makes a leader keep the promise its lease relies on (decision 0071): while a lease this replica
/// handed out is open, it grants no vote. Without it, a leader that has led longer than openraft's own
/// vote lease grants a higher-term vote to any candidate with an equal log, steps down, and the
/// candidate's quorum need not share a member that kept the promise — two leases at once.
///
/// A leader that hands over (decision 0225) ends its lease early instead of waiting it out:
/// [`VoteFence::stop_acting`] refuses every act that has not begun, and the fence counts as closed
/// as soon as no act that began ([`VoteFence::begin_act`]) is still in flight. Every write under a
/// lease begins an act before its last check, so once none is in flight and none can begin,
/// nothing more is written under the old lease and a second one may be granted.
pub struct VoteFence {
    clock: Arc<dyn Clock>,
    state: Mutex<FenceState>,
    /// Woken when the last act in flight ends.
    drained: tokio::sync::Notify,
}

#[derive(Debug, Default)]
struct FenceState {
    /// The end of the last lease handed out.
    until: Option<Instant>,
    /// Set once by [`VoteFence::stop_acting`]: no act begins from then on.
    stopped: bool,
    /// Acts begun and not yet ended.
    acting: usize,
    /// An act was dropped without [`Acting::end`] (its future cancelled mid-write): its bytes may
    /// still leave (quinn finishes a dropped stream), so the fence waits for the lease's end.
    abandoned: bool,
}

impl FenceState {
    /// Whether the lease may no longer be written under before its end: acting stopped, no
    /// act in flight, none abandoned.
    fn drained(&self) -> bool {
        self.stopped && self.acting == 0 && !self.abandoned
    }
}

impl std::fmt::Debug for VoteFence {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VoteFence")
            .field("open", &self.is_open())
            .finish()
    }
}

/// One act in flight under a lease (an envelope's write): counted by its [`VoteFence`] until it
/// ends. Begin it before the act's last check and [`Acting::end`] it once no byte of it can leave
/// any more; dropped without `end` (a cancelled future), it is taken to be still writing until
/// the lease's end.
#[derive(Debug)]
pub struct Acting<'a> {
    fence: &'a VoteFence,
    ended: bool,
}

impl Acting<'_> {
    /// The act can write no more (its request returned).
    pub fn end(mut self) {
        self.ended = true;
    }
}

impl Drop for Acting<'_> {
    fn drop(&mut self) {
        let mut state = self.fence.lock();
        state.acting = state.acting.saturating_sub(1);
        if !self.ended {
            state.abandoned = true;
        }
        if state.acting == 0 {
            self.fence.drained.notify_waiters();
        }
    }
}

/// A place for the act of one write that may be tried more than once (a resend through the same
/// gate): the first [`ActSlot::begin`] begins it, later ones check only that acting was not
/// stopped; [`ActSlot::end`] ends it. A slot dropped with its act not ended (the write's future
/// cancelled) leaves the fence to the lease's end.
#[derive(Debug)]
pub struct ActSlot<'a> {
    fence: &'a VoteFence,
    held: Mutex<Option<Acting<'a>>>,
}

impl ActSlot<'_> {
    /// Begins the act if it has not begun; `Err` once acting was stopped (nothing may be written).
    pub fn begin(&self) -> Result<(), GateError> {
        let mut held = self.held.lock().unwrap_or_else(|p| p.into_inner());
        if held.is_none() {
            *held = Some(self.fence.begin_act()?);
            return Ok(());
        }
        if self.fence.lock().stopped {
            return Err(GateError::StoppedActing);
        }
        Ok(())
    }

    /// The write returned: nothing of it can leave any more.
    pub fn end(&self) {
        let act = self.held.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(act) = act {
            act.end();
        }
    }
}

impl VoteFence {
    /// A fence measured with `clock` (the same clock the gate's leases are checked against).
    pub fn new(clock: Arc<dyn Clock>) -> Self {
        Self {
            clock,
            state: Mutex::new(FenceState::default()),
            drained: tokio::sync::Notify::new(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, FenceState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Keeps votes refused until at least `until`.
    pub fn hold(&self, until: Instant) {
        let mut state = self.lock();
        if state.until.is_none_or(|h| h < until) {
            state.until = Some(until);
        }
    }

    /// Whether a lease handed out here may still be written under: until its end, or, once acting
    /// stopped, until the last act in flight ended (unless one was abandoned).
    pub fn is_open(&self) -> bool {
        let state = self.lock();
        let leased = state.until.is_some_and(|until| self.clock.now() < until);
        leased && !state.drained()
    }

    /// Begins one act under the lease (call it before the act's last check, [`Acting::end`] it
    /// when the act can write no more); `Err` once [`VoteFence::stop_acting`] was called.
    pub fn begin_act(&self) -> Result<Acting<'_>, GateError> {
        let mut state = self.lock();
        if state.stopped {
            return Err(GateError::StoppedActing);
        }
        state.acting += 1;
        Ok(Acting {
            fence: self,
            ended: false,
        })
    }

    /// Runs `f`, a synchronous act (a seal), as one act under the lease; `Err` without running it
    /// once acting stopped.
    pub fn act<T>(&self, f: impl FnOnce() -> T) -> Result<T, GateError> {
        let acting = self.begin_act()?;
        let done = f();
        acting.end();
        Ok(done)
    }

    /// An [`ActSlot`] on this fence, for one write that may be sent twice.
    pub fn act_slot(&self) -> ActSlot<'_> {
        ActSlot {
            fence: self,
            held: Mutex::new(None),
        }
    }

    /// Refuses every act that has not begun, for good: a leader handing over ends its lease
    /// early (decision 0225). Answers how many acts are still in flight.
    pub fn stop_acting(&self) -> usize {
        let mut state = self.lock();
        state.stopped = true;
        state.acting
    }

    /// Acts begun and not ended, right now.
    pub fn acting(&self) -> usize {
        self.lock().acting
    }

    /// Waits until the fence is closed ([`VoteFence::is_open`] is false) or `deadline` passes;
    /// whether it closed. Once acting stopped, that is when the last act in flight ends, at the
    /// latest the lease's end.
    pub async fn closed_by(&self, deadline: tokio::time::Instant) -> bool {
        loop {
            let drained = self.drained.notified();
            let left = {
                let state = self.lock();
                let now = self.clock.now();
                match state.until {
                    Some(until) if now < until && !state.drained() => until.duration_since(now),
                    _ => return true,
                }
            };
            let now = tokio::time::Instant::now();
            if now >= deadline {
                return false;
            }
            // The lease's end on the fence's clock, re-read at least every 50 ms (a test clock
            // moves without waking anyone).
            let wake = (now + left.min(Duration::from_millis(50))).min(deadline);
            tokio::select! {
                () = drained => {}
                () = tokio::time::sleep_until(wake) => {}
            }
        }
    }
}

/// Handles a vote request, refusing it while `fence` holds a lease open: the answer carries this
/// replica's own vote, so the candidate counts it as not granted.
pub async fn fenced_vote(
    raft: &Raft,
    rpc: VoteRequest<NodeId>,
    fence: &VoteFence,
) -> Result<VoteResponse<NodeId>, RaftError<NodeId>> {
    if !fence.is_open() {
        return raft.vote(rpc).await;
    }
    let vote = raft
        .with_raft_state(|s| *s.vote_ref())
        .await
        .map_err(RaftError::Fatal)?;
    tracing::info!(
        candidate_term = rpc.vote.leader_id().term,
        "vote refused: this replica's lease is open"
    );
    // The candidate reads `last_log_id` only to notice a longer log and delay its next election;
    // openraft keeps this replica's last log id private, so say nothing about it.
    Ok(VoteResponse {
        vote,
        vote_granted: false,
        last_log_id: None,
    })
}

/// The lease gate. Stateless: every call to [`Gate::acquire`] runs a fresh quorum round.
pub struct Gate;

impl Gate {
    /// Confirms leadership with a quorum round and returns a lease measured from before the round.
    pub async fn acquire(
        raft: &Raft,
        clock: &dyn Clock,
        config: &RaftConfig,
    ) -> Result<Lease, GateError> {
        let start = clock.now();
        let window = config.lease_window();
        let before = leading_term(raft).await?;
        let round = tokio::time::timeout(window, raft.ensure_linearizable()).await;
        match round {
            Err(_elapsed) => {
                return Err(GateError::RoundTooSlow {
                    term: before,
                    window_ms: window.as_millis() as u64,
                });
            }
            Ok(Err(e)) => return Err(round_error(before, e)),
            Ok(Ok(_read_log_id)) => {}
        }
        let after = leading_term(raft).await?;
        if after != before {
            return Err(GateError::TermMoved { before, after });
        }
        Ok(Lease {
            term: before,
            started: start,
            valid_until: start + window,
        })
    }

    /// [`Gate::acquire`], and the replica refuses votes until the lease ends (see [`VoteFence`]). The
    /// fence is held from before the round, so no vote slips in between the round and the hold;
    /// a replica that does not lead holds nothing, so a leader that stepped down to hand over
    /// (decision 0152) is not kept fenced by requests that still reach it.
    pub async fn acquire_fenced(
        raft: &Raft,
        clock: &dyn Clock,
        config: &RaftConfig,
        fence: &VoteFence,
    ) -> Result<Lease, GateError> {
        if fence.lock().stopped {
            return Err(GateError::StoppedActing);
        }
        leading_term(raft).await?;
        fence.hold(clock.now() + config.lease_window());
        let lease = Gate::acquire(raft, clock, config).await?;
        fence.hold(lease.valid_until());
        Ok(lease)
    }
}

/// The term this node leads in, read from the Raft core itself (metrics may lag).
async fn leading_term(raft: &Raft) -> Result<u64, GateError> {
    let (state, vote) = raft
        .with_raft_state(|s| (s.server_state, *s.vote_ref()))
        .await
        .map_err(|_| GateError::Stopped)?;
    if state != ServerState::Leader || !vote.is_committed() {
        let leader = vote
            .is_committed()
            .then_some(vote.leader_id().voted_for)
            .flatten();
        return Err(GateError::NotLeader { leader });
    }
    Ok(vote.leader_id().term)
}

fn round_error(
    term: u64,
    e: RaftError<NodeId, CheckIsLeaderError<NodeId, crate::BasicNode>>,
) -> GateError {
    match e {
        RaftError::APIError(CheckIsLeaderError::ForwardToLeader(f)) => GateError::NotLeader {
            leader: f.leader_id,
        },
        RaftError::APIError(CheckIsLeaderError::QuorumNotEnough(q)) => GateError::NotConfirmed {
            term,
            reason: q.to_string(),
        },
        RaftError::Fatal(_) => GateError::Stopped,
    }
}
