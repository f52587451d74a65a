//! The driver of a push (G3, G4): it runs the pure [`PushEngine`](super::engine::PushEngine) by
//! carrying out its actions — quorum rounds, proposals, envelopes through the gated transport,
//! at most `engine::sends_in_flight_max` at once, each writing until the lease's end as the engine
//! last extended it — and feeding back what came of them with the lease clock's time. It decides
//! nothing itself. Also `plan` (the same planning as a dry run).
//!
//! Locks: one push at a time per leader (`Service::pushing`, taken by pushes alone); the compose
//! cache is locked only while planning, never across a wait, so `plan`, `status`, settings and
//! apply never wait for a running push.

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::time::{Duration, Instant};

use futures::StreamExt;
use futures::stream::FuturesUnordered;
use mesh_raft::GateError;
use mesh_transport::{MessageKind, Peer, Principal, Sink, TransportError};
use openraft::ServerState;
use tokio::sync::watch;

use super::api::{
    ApiError, Body, ErrorClass, PlanView, PushError, PushEvent, PushOutcome, PushTarget, RequestId,
    push_event_what,
};
use super::engine::floor::UnprovenFloor;
use super::engine::{
    Action, Begin, Event, HostAnswer, Lease, NoLease, PushEngine, PushJob, check_why, plan_dry,
};
use super::planview::Reveal;
use super::service::{Service, now_ms};
use crate::core::compose::MintRequest;
use crate::core::envelope::{Envelope, Position, seal};
use crate::core::wire::{EnvelopeReply, envelope_reply_what};
use crate::store::app::MeshApp;
use crate::store::command::{Applied, Command};
use crate::store::state::DomainState;

pub(crate) use super::engine::known_of;

/// Bytes of randomness in a minted secret (hex-encoded, so twice as many characters: the
/// `minted_secret_chars` validate counts when it sizes a declaration).
pub const secret_bytes: usize = crate::core::compose::minted_secret_chars / 2;
/// How long a push waits for the push before it on the same leader to finish.
pub const push_queue_wait_ms: u64 = 60_000;

/// 32 random bytes, hex. `None` only if the OS random source fails.
fn random_secret() -> Option<String> {
    let mut bytes = [0u8; secret_bytes];
    getrandom::getrandom(&mut bytes).ok()?;
    Some(crate::hex::encode_hex(&bytes))
}

fn engine_lease(lease: &mesh_raft::Lease) -> Lease {
    Lease {
        epoch: lease.term(),
        started: lease.started(),
        until: lease.valid_until(),
    }
}

/// A round that did not confirm the term in time may be followed by another in the same term;
/// any other refusal means this replica does not lead in it, or may not act (decision 0270).
fn no_lease(e: GateError) -> NoLease {
    match e {
        GateError::NotConfirmed { .. } | GateError::RoundTooSlow { .. } => {
            NoLease::Unconfirmed(e.to_string())
        }
        GateError::NotLeader { .. }
        | GateError::TermMoved { .. }
        | GateError::LeaseClosed { .. }
        | GateError::Stopped
        | GateError::StoppedActing => NoLease::Lost(e.to_string()),
    }
}

type Task<'a> = Pin<Box<dyn Future<Output = Event> + Send + 'a>>;

/// Until when one send may write: the end of the lease it was handed out under, or a later end
/// the engine extended the push's lease to since, in the same term (decision 0221).
struct LeaseEnd {
    first: Instant,
    extended: watch::Receiver<Option<Instant>>,
}

impl LeaseEnd {
    fn now(&self) -> Instant {
        match *self.extended.borrow() {
            Some(until) => until.max(self.first),
            None => self.first,
        }
    }
}

/// Offers one event to a streamed push's reader, if it reads one.
fn offer(lines: &Sink, event: &PushEvent) {
    if !lines.is_open() {
        return;
    }
    match mesh_codec::encode(push_event_what, event) {
        Ok(bytes) => {
            lines.offer(bytes);
        }
        Err(e) => {
            tracing::warn!(error = %e, "a push event could not be encoded; the answer has it")
        }
    }
}

/// Most bytes of earlier kept models a plan reads to show replaced env values in the clear
/// (decision 0302 keeps up to 64 MiB of them): newest first, at least one.
pub const reveal_models_bytes_max: u64 = 8 * 1024 * 1024;

impl Service {
    /// What a plan may show in the clear: settings and their history, env of the model in force
    /// and of the kept models of earlier revisions, newest first, within
    /// [`reveal_models_bytes_max`] (a value older than those shows as its digest).
    fn reveal(&self, state: &DomainState) -> Result<Reveal, ApiError> {
        let db = self.replica.database();
        let history = MeshApp::settings_entries(db)
            .map_err(|e| super::ops::storage("settings history", &e))?;
        let current = MeshApp::last_model_revision(db)
            .map_err(|e| super::ops::storage("model history", &e))?;
        let mut earlier = Vec::new();
        let mut read = 0u64;
        for (&revision, &bytes) in state.model_revisions.iter().rev() {
            if Some(revision) == current {
                continue;
            }
            if !earlier.is_empty() && read.saturating_add(bytes) > reveal_models_bytes_max {
                break;
            }
            let kept = MeshApp::model_revision(db, revision)
                .map_err(|e| super::ops::storage("kept model", &e))?;
            if let Some(mesh) = kept {
                read = read.saturating_add(bytes);
                earlier.push(mesh);
            }
        }
        Ok(Reveal::new(state, &history, &earlier))
    }

    /// `Request::Plan`: everything a push of `target` would do, each machine diffed against its
    /// last send (G7). Plans exactly as the push does, with placeholder secrets; writes nothing.
    pub(crate) async fn plan(
        &self,
        target: PushTarget,
        moves: Vec<String>,
    ) -> Result<Body, ApiError> {
        let state = self.state()?;
        let reveal = self.reveal(&state)?;
        let view = self.with_work(&state, |work| {
            plan_dry(&state, work, target, moves, &reveal)
        })??;
        Ok(Body::Plan(view))
    }

    /// `Request::Push`; each machine's line goes to `lines` as it settles (decision 0190).
    #[allow(clippy::too_many_arguments)]
    pub(crate) async fn push(
        &self,
        actor: &str,
        id: RequestId,
        target: PushTarget,
        why: String,
        moves: Vec<String>,
        saved: Option<Box<PlanView>>,
        lines: &Sink,
    ) -> Result<Body, ApiError> {
        let job = PushJob {
            target,
            why,
            moves,
            saved,
            keep: None,
            request: Some(id),
        };
        Ok(self.run_push_streamed(actor, job, lines).await?.0)
    }

    /// Runs one push to its answer; for a genesis (`job.keep`) also the sealed kept envelope.
    pub(crate) async fn run_push(
        &self,
        actor: &str,
        job: PushJob,
    ) -> Result<(Body, Option<Vec<u8>>), ApiError> {
        self.run_push_streamed(actor, job, &Sink::closed()).await
    }

    /// [`Service::run_push`], offering its events to `lines` as they happen.
    async fn run_push_streamed(
        &self,
        actor: &str,
        job: PushJob,
        lines: &Sink,
    ) -> Result<(Body, Option<Vec<u8>>), ApiError> {
        check_why(&job.why)?;
        let wait = Duration::from_millis(push_queue_wait_ms);
        let _one_push = tokio::time::timeout(wait, self.pushing.lock())
            .await
            .map_err(|_| PushError::Busy {
                replica: self.id,
                waited_ms: push_queue_wait_ms,
            })?;
        let lease = engine_lease(&self.lease().await?);
        let state = self.state()?;
        // The same request may have run while this one waited for the push lock.
        if let Some(id) = job.request
            && let Some(first) = state.remembered(&id)
        {
            let machines = match first {
                Applied::Sent { sequences } => sequences.iter().map(|(m, _)| m.clone()).collect(),
                _ => Vec::new(),
            };
            return Err(PushError::AlreadyRan {
                request: id.to_string(),
                machines,
            }
            .into());
        }
        let reveal = match job.saved {
            Some(_) => self.reveal(&state)?,
            None => Reveal::none(),
        };
        let mut secret = |_: &MintRequest| random_secret();
        // For the push's events (decision 0308).
        let push_why = job.why.clone();
        // G9 after a restore without the floor file: the engine holds the push until the hosts'
        // marks are known (decision 0274).
        // The push is of the lease's term: it reads and notes only that term's leadership
        // (decision 0327); with none (the term was left), it marks nothing and its lease stops it.
        let leadership = self.leadership_in(lease.epoch);
        let restored = self.unproven.restored();
        // No leadership of this term is not an error but a term left: no marks holds every
        // machine under an unproven floor, and the lease round stops the push.
        // allow(empty-on-error): a term left has no marks (above)
        let marks = leadership.as_ref().map(|l| l.marks()).unwrap_or_default();
        let unproven = restored.map(|restored| UnprovenFloor {
            restored,
            marks: &marks,
        });
        let now = self.clock.now();
        let (engine, actions) = self.with_work(&state, |work| {
            let begin = Begin {
                job,
                actor,
                signer: self.id,
                lease,
                wall_ms: now_ms(),
                state: &state,
                work,
                reveal: &reveal,
                secret: &mut secret,
                frame_bytes_max: self.endpoint.config().frame_bytes_max(),
            };
            PushEngine::begin_under(now, begin, unproven)
        })?;
        let began =
            !engine.held_by_floor() && !actions.iter().any(|a| matches!(a, Action::Answer(_)));
        if began {
            let machines = engine.machines();
            self.events.push(
                lease.epoch,
                vec![super::events::push_begun(actor, &machines, &push_why)],
            );
            offer(
                lines,
                &PushEvent::Begin {
                    epoch: lease.epoch,
                    machines,
                },
            );
        }
        let answer = self.drive(actor, lease.epoch, engine, actions, lines).await;
        if began {
            self.events
                .push(lease.epoch, super::events::push_ended(actor, &answer));
        }
        answer
    }

    /// Carries out the engine's actions until it answers.
    async fn drive(
        &self,
        actor: &str,
        epoch: u64,
        mut engine: PushEngine,
        mut actions: Vec<Action>,
        lines: &Sink,
    ) -> Result<(Body, Option<Vec<u8>>), ApiError> {
        let mut tasks: FuturesUnordered<Task<'_>> = FuturesUnordered::new();
        let mut now_events: VecDeque<Event> = VecDeque::new();
        let mut kept: Option<Vec<u8>> = None;
        // The lease's end as the engine last extended it: every send on its way reads it at its
        // write (decision 0221).
        let (extend, extended) = watch::channel(None::<Instant>);
        let mut metrics = self.replica.metrics();
        let mut deposed = false;
        // What the push's lines say of its hosts is noted by its term's leadership only.
        let leadership = self.leadership_in(epoch);
        loop {
            for action in std::mem::take(&mut actions) {
                match action {
                    Action::Answer(answer) => {
                        return answer.map(|view| (Body::Push(view), kept.take()));
                    }
                    Action::ConfirmLease => tasks.push(Box::pin(self.renew())),
                    Action::Propose {
                        epoch,
                        expect,
                        command,
                    } => tasks.push(Box::pin(self.propose_step(epoch, expect, actor, command))),
                    Action::Send { envelope, deadline } => {
                        let until = LeaseEnd {
                            first: deadline,
                            extended: extended.clone(),
                        };
                        tasks.push(Box::pin(self.deliver(envelope, until)));
                    }
                    Action::Extend { until } => {
                        extend.send_replace(Some(until));
                    }
                    Action::Keep { envelope, deadline } => {
                        let sealed = self.seal_kept(&envelope, deadline);
                        now_events.push_back(Event::Kept(sealed.map(|bytes| {
                            kept = Some(bytes);
                        })));
                    }
                    Action::Line(line) => {
                        tracing::debug!(machine = %line.machine, outcome = ?line.outcome, "push line");
                        if matches!(line.outcome, PushOutcome::Applied { .. })
                            && let Some(l) = &leadership
                        {
                            l.live.note_unproven(&line.machine, None);
                        }
                        // Never waits: a slow reader gets the line from the answer instead.
                        offer(lines, &PushEvent::Line(line));
                    }
                    Action::Stopped { epoch, reason } => {
                        self.metrics.lease_lost();
                        tracing::warn!(epoch, %reason, "leader stopped acting");
                    }
                    Action::FloorProven(proof) => self.floor_proven(&proof),
                    Action::LeaveTerm {
                        machine,
                        epoch: held,
                        floor,
                    } => {
                        tracing::warn!(%machine, epoch = held, term = epoch, floor, "floor unproven after a restore: a host holds an epoch at or above this leader's term; leaving the term");
                    }
                    Action::RaiseFloor {
                        epoch,
                        floor,
                        machine,
                    } => tasks.push(Box::pin(self.raise_step(epoch, floor, machine))),
                    Action::Unproven { machine, refusal } => {
                        self.metrics.unproven_refusal();
                        tracing::warn!(%machine, epoch, %refusal, "UNPROVEN REFUSAL: the host refused this leader's envelope as older, but nothing signed by a trusted replica shows it holding a newer one; its line failed and the push goes on after a quorum round");
                        if let Some(l) = &leadership {
                            l.live.note_unproven(&machine, Some(refusal));
                        }
                    }
                }
            }
            if let Some(event) = now_events.pop_front() {
                actions = engine.handle(self.clock.now(), event);
                continue;
            }
            if !deposed && let Err(reason) = self.leads_in(epoch) {
                deposed = true;
                actions = engine.handle(self.clock.now(), Event::Deposed(reason));
                continue;
            }
            let wake = engine.wake_at();
            if tasks.is_empty() && wake.is_none() {
                // Nothing in flight and nothing to wait for, yet no answer: never leave the
                // operator waiting on it.
                return Err(PushError::EngineStopped { epoch }.into());
            }
            let sleep = self.sleep_until(wake);
            tokio::select! {
                Some(event) = tasks.next() => actions = engine.handle(self.clock.now(), event),
                () = sleep => actions = engine.handle(self.clock.now(), Event::Tick),
                changed = metrics.changed(), if !deposed => {
                    if changed.is_err() {
                        deposed = true;
                        let reason = "the Raft core stopped".to_string();
                        actions = engine.handle(self.clock.now(), Event::Deposed(reason));
                    }
                }
            }
        }
    }

    /// Sleeps until `at` on the lease clock (forever for `None`).
    async fn sleep_until(&self, at: Option<Instant>) {
        match at {
            Some(at) => {
                let left = at.saturating_duration_since(self.clock.now());
                tokio::time::sleep(left.max(Duration::from_millis(1))).await;
            }
            None => std::future::pending().await,
        }
    }

    /// `Ok` while the metrics show this replica leading in `epoch`.
    pub(crate) fn leads_in(&self, epoch: u64) -> Result<(), String> {
        let m = self.replica.metrics();
        let m = m.borrow();
        if m.current_term != epoch || m.state != ServerState::Leader {
            return Err(format!(
                "leadership lost: term {epoch} is now {} and this replica is {:?}",
                m.current_term, m.state
            ));
        }
        Ok(())
    }

    /// One lease round for the engine: a lease, or whether the term may still be confirmed by
    /// another round (decision 0270).
    async fn renew(&self) -> Event {
        let round = self.lease_round().await;
        Event::Lease(round.map(|l| engine_lease(&l)).map_err(no_lease))
    }

    async fn propose_step(
        &self,
        epoch: u64,
        expect: Option<u64>,
        actor: &str,
        command: Command,
    ) -> Event {
        match self.propose(epoch, expect, actor, command).await {
            Ok(applied) => Event::Committed(applied),
            Err(e) if e.class() == ErrorClass::Refused => Event::Refused(e.to_string()),
            Err(e) => Event::Failed(e.to_string()),
        }
    }

    /// Raises the floor for an unproven floor's hold, as the host whose mark proved the term
    /// used (decision 0274).
    async fn raise_step(&self, epoch: u64, floor: u64, machine: String) -> Event {
        let actor = format!("host:{machine}");
        let command = Command::RaiseEpochFloor { epoch: floor };
        self.propose_step(epoch, None, &actor, command).await
    }

    /// The highest position `machine`'s host has shown with a header signed by a trusted
    /// replica: its last filed report's proof, verified. A fact for the engine, which decides
    /// whether an older refusal stops the push (issue 27 part 4).
    fn proven_position(&self, machine: &str) -> Option<Position> {
        let state = match self.app.state() {
            Ok(state) => state,
            Err(e) => {
                // Unproven is the safe reading here: the push stops only on what is proven,
                // and an unproven refusal still waits for a fresh quorum round.
                tracing::error!(%machine, error = %e, "cannot read the state to check a refusal's proof; taking it as unproven");
                return None;
            }
        };
        let proof = state
            .accounts
            .get(machine)?
            .report
            .as_ref()?
            .proof
            .as_ref()?;
        let signed = Position {
            epoch: proof.header.epoch,
            sequence: proof.header.sequence,
        };
        proof
            .verify(&self.proof_keys(&state), machine, signed)
            .ok()
            .map(|()| signed)
    }

    async fn deliver(&self, envelope: Envelope, deadline: LeaseEnd) -> Event {
        let machine = envelope.machine.clone();
        let answer = self.deliver_answer(envelope, deadline).await;
        Event::Answered { machine, answer }
    }

    /// Seals and sends one envelope. The gate at the write (decision 0100) lets bytes out only
    /// while this replica leads in the envelope's epoch and before `deadline`, the lease's end:
    /// dialling, backoff and the handshake are behind it, and the transport writes no byte past
    /// what it answers.
    async fn deliver_answer(&self, envelope: Envelope, deadline: LeaseEnd) -> HostAnswer {
        let machine = envelope.machine.clone();
        let epoch = envelope.epoch;
        let Some(addr) = self.config.hosts().get(&machine).copied() else {
            return HostAnswer::NotSent(format!(
                "not sent: no address for machine {machine} in [hosts] of {}; add it, restart meshd and push again",
                self.config.file().display()
            ));
        };
        let bytes = match seal(&envelope, &self.key) {
            Ok(b) => b,
            Err(e) => {
                return HostAnswer::NotSent(format!("not sent: could not seal the envelope: {e}"));
            }
        };
        tracing::info!(machine = %machine, epoch, sequence = envelope.sequence, "sending envelope");
        let peer = Peer::expecting(addr, Principal::Host(machine.clone()));
        let timeout: Duration = self.endpoint.config().request_timeout();
        // The write is an act under the lease until it returns (decision 0225): a leader handing
        // over waits for it, and begins no other.
        let acting = self.fence.act_slot();
        let gate = || -> Result<Duration, String> {
            acting.begin().map_err(|e| e.to_string())?;
            self.leads_in(epoch)?;
            let now = self.clock.now();
            let deadline = deadline.now();
            match deadline.checked_duration_since(now) {
                Some(left) if !left.is_zero() => {
                    // The moment bytes may leave under this epoch: the chaos checkers' "sent".
                    tracing::debug!(replica = self.id, machine = %machine, epoch, sequence = envelope.sequence, "envelope write allowed");
                    Ok(left)
                }
                _ => Err(format!(
                    "lease closed: the lease of term {epoch} ended {} ms before the write",
                    now.saturating_duration_since(deadline).as_millis()
                )),
            }
        };
        let mut answer = self
            .endpoint
            .request_gated(
                peer.clone(),
                MessageKind::Envelope,
                bytes.clone(),
                timeout,
                &gate,
            )
            .await;
        if let Err(TransportError::ResetAfterWrite { .. }) = answer {
            // The host restarted under a connection it no longer knows. An envelope may go
            // again (the host's mark refuses a second copy, G2), through the gate again.
            answer = self
                .endpoint
                .request_gated(peer, MessageKind::Envelope, bytes, timeout, &gate)
                .await;
        }
        // Returned: nothing of this write leaves any more.
        acting.end();
        let answer = match answer {
            Ok(a) => a,
            Err(e @ TransportError::Gated { .. }) => return HostAnswer::Gated(e.to_string()),
            // The host refused the handshake (a revoked or retired certificate, decision 0294):
            // no stream was opened, so no byte of the envelope left.
            Err(e @ TransportError::HandshakeRefused { .. }) => {
                return HostAnswer::NotSent(format!("not sent: {e}"));
            }
            Err(e) => return HostAnswer::Unconfirmed(e.to_string()),
        };
        match mesh_codec::decode::<EnvelopeReply>(envelope_reply_what, &answer) {
            Ok(EnvelopeReply::Applied { .. }) => HostAnswer::Applied,
            Ok(EnvelopeReply::Refused { refusal, older }) => HostAnswer::Refused {
                refusal,
                proven: older.then(|| self.proven_position(&machine)).flatten(),
                older,
            },
            Err(e) => HostAnswer::Unconfirmed(format!("the host's answer is unreadable: {e}")),
        }
    }
}
