//! A push as the leader runs it (G1, G3, G4, G7, G8): gate → plan at revision R → commit mints (CAS
//! on R) → holds → one committed record of every send → sealed envelopes to hosts, each only while
//! the lease is open and this replica still leads. Also `plan` (the same planning as a dry run).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use futures::StreamExt;
use mesh_raft::Lease;
use mesh_transport::{MessageKind, Peer, Principal, TransportError};

use super::api::{ApiError, Body, PlanView, PushLine, PushOutcome, PushTarget, PushView};
use super::planview::{Reveal, plan_view, what_moved};
use super::service::{Service, now_ms};
use crate::core::compose::MintRequest;
use crate::core::envelope::{Envelope, seal};
use crate::core::plan::{Known, PlanError, PlanInput, PlannedSend, PushPlan, Target, plan};
use crate::core::report::ModuleState;
use crate::core::summary::summarize;
use crate::core::wire::{EnvelopeReply, envelope_reply_what};
use crate::store::app::MeshApp;
use crate::store::command::{Applied, Command, HeldMount, SendRecord};
use crate::store::state::DomainState;

/// Envelopes in flight at once during one push.
pub const sends_in_flight_max: usize = 64;
/// Bytes of randomness in a minted secret (hex-encoded, so twice as many characters).
pub const secret_bytes: usize = 32;
/// What `plan` shows instead of a secret: nothing is minted by a dry run.
pub const placeholder_secret: &str = "<minted at push>";

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
                last_summary: Some(send.summary.clone()),
            },
        );
    }
    known
}

/// The planning target of a push or plan request; an unknown machine is bad input.
fn target_of(state: &DomainState, target: PushTarget) -> Result<Target, ApiError> {
    Ok(match target {
        PushTarget::Machine(m) if !state.mesh.machines.contains_key(&m) => {
            return Err(ApiError::Invalid(format!(
                "there is no machine {m} in the mesh; `meshctl status` lists them"
            )));
        }
        PushTarget::Machine(m) => Target::Machine(m),
        PushTarget::Behind => Target::Behind,
        PushTarget::All => Target::All,
    })
}

fn plan_error(e: PlanError) -> ApiError {
    match e {
        PlanError::Compose(c) => ApiError::Invalid(c.to_string()),
        PlanError::MoveNotApplicable { .. } => ApiError::Invalid(e.to_string()),
        other => ApiError::Failed(other.to_string()),
    }
}

/// 32 random bytes, hex. `None` only if the OS random source fails.
fn random_secret() -> Option<String> {
    let mut bytes = [0u8; secret_bytes];
    getrandom::getrandom(&mut bytes).ok()?;
    Some(crate::hex::encode_hex(&bytes))
}

fn held_view(h: &crate::core::plan::Hold) -> HeldMount {
    HeldMount {
        module: h.module.clone(),
        mount: h.mount.clone(),
        old_dir: h.old_dir.clone(),
        new_dir: h.new_dir.clone(),
    }
}

/// Holds grouped by machine.
fn holds_by_machine(plan: &PushPlan) -> BTreeMap<String, Vec<HeldMount>> {
    let mut out: BTreeMap<String, Vec<HeldMount>> = BTreeMap::new();
    for h in &plan.holds {
        out.entry(h.machine.clone()).or_default().push(held_view(h));
    }
    out
}

impl Service {
    /// `Request::Plan`: everything a push of `target` would do, each machine diffed against its
    /// last send (G7). Plans exactly as the push does, with placeholder secrets; writes nothing.
    pub(crate) async fn plan(
        &self,
        target: PushTarget,
        moves: Vec<String>,
    ) -> Result<Body, ApiError> {
        let state = self.state()?;
        let planned_target = target_of(&state, target.clone())?;
        let history = MeshApp::settings_history(self.replica.database())
            .map_err(|e| ApiError::Failed(format!("cannot read settings history: {e}")))?;
        let mut work = self.work.lock().await;
        work.refresh(&state)?;
        let known = known_of(&state);
        let moves_set: BTreeSet<String> = moves.iter().cloned().collect();
        let mut secret = |_: &MintRequest| placeholder_secret.to_string();
        let planned = plan(PlanInput {
            world: &work.world,
            cache: &work.cache,
            known: &known,
            target: &planned_target,
            moves: &moves_set,
            secret: &mut secret,
        })
        .map_err(plan_error)?;
        drop(work);
        let reveal = Reveal::new(&state, &history);
        Ok(Body::Plan(plan_view(
            &state, target, moves, &planned, &reveal,
        )))
    }

    /// `Request::Push`.
    pub(crate) async fn push(
        &self,
        actor: &str,
        target: PushTarget,
        why: String,
        moves: Vec<String>,
        saved: Option<Box<PlanView>>,
    ) -> Result<Body, ApiError> {
        let job = PushJob {
            target,
            why,
            moves,
            saved,
            keep: None,
        };
        Ok(self.run_push(actor, job).await?.0)
    }

    /// Runs one push: plan, mints, holds, send records, then every envelope delivered, except the
    /// one for `job.keep`, which is sealed and returned instead (a genesis).
    pub(crate) async fn run_push(
        &self,
        actor: &str,
        job: PushJob,
    ) -> Result<(Body, Option<Vec<u8>>), ApiError> {
        let PushJob {
            target,
            why,
            moves,
            saved,
            keep,
        } = job;
        if why.trim().is_empty() {
            return Err(ApiError::Invalid(
                "a push needs a reason: add `--why \"...\"`; it is kept with the send record"
                    .into(),
            ));
        }
        let mut work = self.work.lock().await;
        let lease = self.lease().await?;
        let epoch = lease.term();
        let state = self.state()?;
        let planned_target = target_of(&state, target.clone())?;
        work.refresh(&state)?;
        let known = known_of(&state);
        let moves_set: BTreeSet<String> = moves.iter().cloned().collect();
        let mut random_failed = false;
        let mut secret = |_: &MintRequest| {
            random_secret().unwrap_or_else(|| {
                random_failed = true;
                String::new()
            })
        };
        let planned = plan(PlanInput {
            world: &work.world,
            cache: &work.cache,
            known: &known,
            target: &planned_target,
            moves: &moves_set,
            secret: &mut secret,
        })
        .map_err(plan_error)?;
        if let Some(saved) = saved {
            // Revealed as `plan` revealed them, so what moved compares like with like; the token
            // itself never covers revealed values.
            let history = MeshApp::settings_history(self.replica.database())
                .map_err(|e| ApiError::Failed(format!("cannot read settings history: {e}")))?;
            let reveal = Reveal::new(&state, &history);
            let now = plan_view(&state, target, moves.clone(), &planned, &reveal);
            if now.token != saved.token {
                return Err(ApiError::Refused(format!(
                    "the saved plan {} no longer holds: {}; nothing was sent; review it again with `meshctl plan`",
                    saved.token,
                    what_moved(&saved, &now)
                )));
            }
        }
        if random_failed {
            return Err(ApiError::Failed(
                "the OS random source failed while minting secrets; nothing was written".into(),
            ));
        }
        let everyone = || {
            let mut all: Vec<String> = planned.sends.iter().map(|s| s.machine.clone()).collect();
            all.extend(holds_by_machine(&planned).into_keys());
            all
        };
        let stopped = |reason: String| {
            tracing::warn!(epoch, %reason, "leader stopped acting");
            stopped_view(epoch, &everyone(), &reason)
        };
        // Mints are committed before any send carries them (G4).
        if let Err(reason) = self.acting(&lease) {
            return Ok((stopped(reason), None));
        }
        let mut revision = state.revision;
        if !planned.mints.is_empty() {
            let provisions = planned.mints.clone();
            match self
                .propose(epoch, Some(revision), actor, Command::Mint { provisions })
                .await
            {
                Ok(Applied::Minted { revision: r, .. }) => revision = r,
                Ok(other) => {
                    return Err(ApiError::Failed(format!(
                        "the store answered the mints with {other:?}"
                    )));
                }
                Err(ApiError::Refused(r)) => {
                    return Err(ApiError::Refused(format!(
                        "the store refused this push's mints: {r}; nothing was sent"
                    )));
                }
                Err(e) => return Ok((stopped(e.to_string()), None)),
            }
            for p in &planned.mints {
                work.world.insert_provision(p.clone());
            }
        }
        work.cache.apply(&planned);
        work.revision = Some(revision);
        if let Err(reason) = self.record_holds(&lease, actor, &state, &planned).await {
            return Ok((stopped(reason), None));
        }
        let records = self.send_records(epoch, actor, &why, &moves, &state, &planned);
        if !records.is_empty() {
            if let Err(reason) = self.acting(&lease) {
                return Ok((stopped(reason), None));
            }
            let sends = records.clone();
            match self
                .propose(epoch, Some(revision), actor, Command::RecordSends { sends })
                .await
            {
                Ok(_) => {}
                Err(ApiError::Refused(r)) => {
                    return Err(ApiError::Refused(format!(
                        "the store refused this push's send records: {r}; nothing was sent"
                    )));
                }
                Err(e) => return Ok((stopped(e.to_string()), None)),
            }
        }
        let (kept, sends, records) = split_kept(&planned.sends, &records, keep.as_deref());
        let sealed = match kept {
            Some((send, record)) => match self.seal_kept(&lease, &send, &record) {
                Ok(bytes) => Some(bytes),
                Err(reason) => return Ok((stopped(reason), None)),
            },
            None => None,
        };
        let mut lines = self.deliver(&lease, &sends, &records).await;
        for (machine, holds) in holds_by_machine(&planned) {
            lines.push(PushLine {
                machine,
                outcome: PushOutcome::Held {
                    reason: "held".into(),
                    holds,
                },
            });
        }
        Ok((Body::Push(PushView { epoch, lines }), sealed))
    }

    /// Records the holds of held machines and releases the holds of machines now sent (G8).
    async fn record_holds(
        &self,
        lease: &Lease,
        actor: &str,
        state: &DomainState,
        planned: &PushPlan,
    ) -> Result<(), String> {
        let mut commands = Vec::new();
        for (machine, holds) in holds_by_machine(planned) {
            commands.push(Command::SetHolds { machine, holds });
        }
        for send in &planned.sends {
            if state.holds.contains_key(&send.machine) {
                commands.push(Command::ReleaseHolds {
                    machine: send.machine.clone(),
                });
            }
        }
        for command in commands {
            self.acting(lease)?;
            self.propose(lease.term(), None, actor, command)
                .await
                .map_err(|e| e.to_string())?;
        }
        Ok(())
    }

    fn send_records(
        &self,
        epoch: u64,
        actor: &str,
        why: &str,
        moves: &[String],
        state: &DomainState,
        planned: &PushPlan,
    ) -> Vec<SendRecord> {
        let time_ms = now_ms();
        planned
            .sends
            .iter()
            .map(|s| {
                let on_machine: Vec<String> = moves
                    .iter()
                    .filter(|m| s.declaration.modules.iter().any(|d| d.name == **m))
                    .cloned()
                    .collect();
                SendRecord {
                    machine: s.machine.clone(),
                    epoch,
                    sequence: state.next_sequence(&s.machine),
                    digest: s.digest,
                    summary: summarize(&s.declaration),
                    why: why.to_string(),
                    actor: actor.to_string(),
                    time_ms,
                    moves: on_machine,
                }
            })
            .collect()
    }

    /// Sends every recorded envelope, at most [`sends_in_flight_max`] at once, each only while this
    /// replica may still act (G3). A push longer than one lease renews it with a fresh quorum round
    /// in the same term; if that fails, or the term moved, every send not yet started stops.
    async fn deliver(
        &self,
        lease: &Lease,
        sends: &[PlannedSend],
        records: &[SendRecord],
    ) -> Vec<PushLine> {
        let stopped = AtomicBool::new(false);
        let stopped = &stopped;
        let keeper = &LeaseKeeper {
            epoch: lease.term(),
            current: tokio::sync::Mutex::new(*lease),
        };
        // Owned items: a stream of borrowed ones trips the compiler's higher-ranked lifetime check
        // inside the transport handler's boxed future.
        let jobs: Vec<(PlannedSend, SendRecord)> =
            sends.iter().cloned().zip(records.iter().cloned()).collect();
        futures::stream::iter(jobs)
            .map(move |(send, record)| async move {
                self.deliver_one(keeper, &send, &record, stopped).await
            })
            .buffer_unordered(sends_in_flight_max)
            .collect()
            .await
    }

    /// The lease a send acts under: the current one while more than half its window is left,
    /// otherwise one renewed by a fresh quorum round in the same term. A closed lease is never
    /// renewed: the push stops.
    async fn lease_to_act(&self, keeper: &LeaseKeeper) -> Result<Lease, String> {
        let mut current = keeper.current.lock().await;
        let window = self.replica.config().lease_window();
        // A lease that already closed stops the push (the replica may have been paused past it):
        // only a lease still open is renewed, before it runs out.
        let left = current
            .check(self.clock.now())
            .map_err(|e| format!("lease closed: {e}"))?;
        if left <= window / 2 {
            let renewed = self
                .lease()
                .await
                .map_err(|e| format!("lease could not be renewed: {e}"))?;
            if renewed.term() != keeper.epoch {
                return Err(format!(
                    "leadership moved from term {} to term {}",
                    keeper.epoch,
                    renewed.term()
                ));
            }
            *current = renewed;
        }
        self.acting(&current)?;
        Ok(*current)
    }

    async fn deliver_one(
        &self,
        keeper: &LeaseKeeper,
        send: &PlannedSend,
        record: &SendRecord,
        stopped: &AtomicBool,
    ) -> PushLine {
        let reason = send.reason.to_string();
        let line = |outcome| PushLine {
            machine: send.machine.clone(),
            outcome,
        };
        if stopped.load(Ordering::SeqCst) {
            return line(PushOutcome::Failed {
                reason,
                error: "stopped: an earlier send of this push found the lease closed".into(),
            });
        }
        let lease = match self.lease_to_act(keeper).await {
            Ok(lease) => lease,
            Err(why) => {
                if !stopped.swap(true, Ordering::SeqCst) {
                    tracing::warn!(epoch = keeper.epoch, reason = %why, "leader stopped acting");
                }
                return line(PushOutcome::Failed {
                    reason,
                    error: format!("stopped: {why}"),
                });
            }
        };
        let envelope = envelope_of(send, record, self.id);
        let sent = |error: String| PushOutcome::Sent {
            reason: reason.clone(),
            sequence: record.sequence,
            digest: record.digest,
            error,
        };
        // Recorded but never sent: nothing left, so the line says failed, not sent.
        let not_sent = |error: String| PushOutcome::Failed {
            reason: reason.clone(),
            error,
        };
        let Some(addr) = self.config.hosts().get(&send.machine).copied() else {
            return line(not_sent(format!(
                "not sent: no address for machine {} in [hosts] of {}; add it, restart meshd and push again",
                send.machine,
                self.config.file().display()
            )));
        };
        let bytes = match seal(&envelope, &self.key) {
            Ok(b) => b,
            Err(e) => {
                return line(not_sent(format!(
                    "not sent: could not seal the envelope: {e}"
                )));
            }
        };
        tracing::info!(machine = %send.machine, epoch = record.epoch, sequence = record.sequence, "sending envelope");
        let peer = Peer::expecting(addr, Principal::Host(send.machine.clone()));
        let timeout: Duration = self.endpoint.config().request_timeout();
        // The lease is checked again at the write (G3): dialling, backoff and the handshake are
        // behind us, and the transport writes no byte past what is left of the lease.
        let gate = || -> Result<Duration, String> {
            self.acting(&lease)?;
            lease
                .check(self.clock.now())
                .map_err(|e| format!("lease closed: {e}"))
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
        let answer = match answer {
            Ok(a) => a,
            Err(e @ TransportError::Gated { .. }) => {
                if !stopped.swap(true, Ordering::SeqCst) {
                    tracing::warn!(epoch = keeper.epoch, reason = %e, "leader stopped acting");
                }
                return line(not_sent(format!("stopped at the write: {e}")));
            }
            Err(e) => return line(sent(e.to_string())),
        };
        match mesh_codec::decode::<EnvelopeReply>(envelope_reply_what, &answer) {
            Ok(EnvelopeReply::Applied { .. }) => line(PushOutcome::Applied {
                reason,
                sequence: record.sequence,
                digest: record.digest,
            }),
            Ok(EnvelopeReply::Refused { refusal, .. }) => {
                line(PushOutcome::Refused { reason, refusal })
            }
            Err(e) => line(sent(format!("the host's answer is unreadable: {e}"))),
        }
    }
}

/// The envelope of a recorded send, signed by replica `signer`.
pub(crate) fn envelope_of(send: &PlannedSend, record: &SendRecord, signer: u64) -> Envelope {
    Envelope {
        machine: send.machine.clone(),
        epoch: record.epoch,
        sequence: record.sequence,
        signer,
        moves: record.moves.clone(),
        declaration: send.declaration.clone(),
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
}

type Kept = Option<(PlannedSend, SendRecord)>;

/// Takes `keep`'s send out of the ones to deliver.
fn split_kept(
    sends: &[PlannedSend],
    records: &[SendRecord],
    keep: Option<&str>,
) -> (Kept, Vec<PlannedSend>, Vec<SendRecord>) {
    let mut kept = None;
    let mut out_sends = Vec::new();
    let mut out_records = Vec::new();
    for (send, record) in sends.iter().zip(records) {
        if Some(send.machine.as_str()) == keep {
            kept = Some((send.clone(), record.clone()));
        } else {
            out_sends.push(send.clone());
            out_records.push(record.clone());
        }
    }
    (kept, out_sends, out_records)
}

/// A push that stopped before anything left: every machine failed with the reason.
fn stopped_view(epoch: u64, machines: &[String], reason: &str) -> Body {
    let lines = machines
        .iter()
        .map(|m| PushLine {
            machine: m.clone(),
            outcome: PushOutcome::Failed {
                reason: "stopped".into(),
                error: format!("stopped: {reason}"),
            },
        })
        .collect();
    Body::Push(PushView { epoch, lines })
}

/// The lease one push's sends act under, renewed in place (same term) when it runs low.
struct LeaseKeeper {
    epoch: u64,
    current: tokio::sync::Mutex<Lease>,
}
