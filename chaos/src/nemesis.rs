//! The nemesis: a seeded schedule of faults over the Raft router and the host links (isolate the
//! leader, cut one direction, drop a share of messages, delay, hold and release, pause a leader
//! between commit and send, hold or replay envelopes), played step by step, each step logged with
//! the seed that chose it.

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use openraft::ServerState;

use mesh_raft::NodeId;
use mesh_raft::router::Router;

use crate::actors::{Pause, SharedReplica};
use crate::history::{Event, Recorder, Tick};
use crate::rng::Rng;
use crate::sim::Machines;

/// Steps in one schedule at most.
pub const steps_max: usize = 64;
/// Shortest and longest time a fault stays on.
pub const fault_ms_min: u64 = 200;
pub const fault_ms_max: u64 = 900;
/// How long an isolated leader stays cut off: long enough for the others to elect a new leader.
pub const isolation_ms: u64 = 1_500;
/// Longest wait for a leader actor to stop at its pause point before isolating anyway.
pub const park_wait_ms: u64 = 1_000;
/// Calm between two steps, at most.
pub const calm_ms_max: u64 = 150;

/// One kind of fault. Which replicas it hits is decided when the step is played (the leader changes).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Fault {
    /// Cut the current leader off from everyone; optionally freeze its actor between commit and send
    /// and hold its envelopes, so a deposed leader's work arrives late.
    IsolateLeader { pause_actor: bool },
    /// Cut one direction between the leader and a follower.
    CutOneWay,
    /// Lose a share of the messages between two replicas, both directions.
    DropMessages { per_mille: u32 },
    /// Delay the messages between two replicas, both directions.
    Delay { ms: u64 },
    /// Hold the messages of one direction and deliver them late, when the step ends.
    HoldAndRelease,
    /// Hold the leader's envelopes to the hosts and deliver them when the step ends.
    HoldEnvelopes,
    /// Delay the leader's envelopes, so later ones overtake them.
    DelayEnvelopes { ms: u64 },
    /// Deliver a share of every replica's envelopes twice.
    ReplayEnvelopes { per_mille: u32 },
    /// Freeze the leader's actor between commit and send, without isolating it.
    PauseLeader,
}

impl fmt::Display for Fault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Fault::IsolateLeader { pause_actor: true } => write!(f, "isolate the paused leader"),
            Fault::IsolateLeader { pause_actor: false } => write!(f, "isolate the leader"),
            Fault::CutOneWay => write!(f, "cut one direction"),
            Fault::DropMessages { per_mille } => write!(f, "drop {per_mille}‰ of messages"),
            Fault::Delay { ms } => write!(f, "delay messages {ms} ms"),
            Fault::HoldAndRelease => write!(f, "hold messages, release late"),
            Fault::HoldEnvelopes => write!(f, "hold the leader's envelopes"),
            Fault::DelayEnvelopes { ms } => write!(f, "delay the leader's envelopes {ms} ms"),
            Fault::ReplayEnvelopes { per_mille } => write!(f, "replay {per_mille}‰ of envelopes"),
            Fault::PauseLeader => write!(f, "pause the leader between commit and send"),
        }
    }
}

/// Which faults a schedule draws from, with weights.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mix {
    /// Partitions of the Raft network: isolation, one-way cuts, drops, delays, holds.
    Partitions,
    /// Deposed leaders: isolation with the actor paused, held and delayed envelopes, replays.
    StaleLeaders,
    /// Everything, evenly.
    Everything,
}

impl Mix {
    /// The fault every schedule of this mix starts with, right after the first lease, so that a
    /// test named after it meets it whatever else the seed draws.
    fn headline(&self) -> Option<Fault> {
        match self {
            Mix::Partitions => Some(Fault::IsolateLeader { pause_actor: false }),
            Mix::StaleLeaders => Some(Fault::IsolateLeader { pause_actor: true }),
            Mix::Everything => None,
        }
    }

    fn weighted(&self) -> Vec<(u64, FaultKind)> {
        use FaultKind::*;
        match self {
            Mix::Partitions => vec![
                (3, Isolate),
                (3, Cut),
                (2, Drop),
                (2, Delay),
                (2, Hold),
                (1, Replay),
            ],
            Mix::StaleLeaders => vec![
                (4, IsolatePaused),
                (1, Isolate),
                (2, HoldEnvelopes),
                (2, DelayEnvelopes),
                (2, Replay),
                (2, PauseLeader),
                (1, Cut),
            ],
            Mix::Everything => [
                Isolate,
                IsolatePaused,
                Cut,
                Drop,
                Delay,
                Hold,
                HoldEnvelopes,
                DelayEnvelopes,
                Replay,
                PauseLeader,
            ]
            .into_iter()
            .map(|k| (1, k))
            .collect(),
        }
    }
}

#[derive(Clone, Copy, Debug)]
enum FaultKind {
    Isolate,
    IsolatePaused,
    Cut,
    Drop,
    Delay,
    Hold,
    HoldEnvelopes,
    DelayEnvelopes,
    Replay,
    PauseLeader,
}

impl FaultKind {
    fn draw(self, rng: &mut Rng) -> Fault {
        match self {
            FaultKind::Isolate => Fault::IsolateLeader { pause_actor: false },
            FaultKind::IsolatePaused => Fault::IsolateLeader { pause_actor: true },
            FaultKind::Cut => Fault::CutOneWay,
            FaultKind::Drop => Fault::DropMessages {
                per_mille: rng.between(200, 800) as u32,
            },
            FaultKind::Delay => Fault::Delay {
                ms: rng.between(20, 150),
            },
            FaultKind::Hold => Fault::HoldAndRelease,
            FaultKind::HoldEnvelopes => Fault::HoldEnvelopes,
            FaultKind::DelayEnvelopes => Fault::DelayEnvelopes {
                ms: rng.between(20, 200),
            },
            FaultKind::Replay => Fault::ReplayEnvelopes {
                per_mille: rng.between(200, 1000) as u32,
            },
            FaultKind::PauseLeader => Fault::PauseLeader,
        }
    }
}

/// One step: a fault on for `for_ms`, then `calm_ms` without it. `pick` chooses replicas at play time.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Step {
    pub fault: Fault,
    pub for_ms: u64,
    pub calm_ms: u64,
    pub pick: u64,
}

/// A seeded list of steps.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Schedule {
    pub seed: u64,
    pub steps: Vec<Step>,
}

impl Schedule {
    /// Draws steps from `mix` until they fill `total_ms` (or [`steps_max`] is reached).
    pub fn generate(seed: u64, mix: Mix, total_ms: u64) -> Self {
        let mut rng = Rng::new(seed, 0x4e_3e5);
        let weighted = mix.weighted();
        let total_weight: u64 = weighted.iter().map(|(w, _)| w).sum();
        let mut steps = Vec::new();
        let mut planned = 0;
        if let Some(fault) = mix.headline() {
            let calm_ms = rng.between(0, calm_ms_max);
            planned += isolation_ms + calm_ms;
            steps.push(Step {
                fault,
                for_ms: isolation_ms,
                calm_ms,
                pick: rng.next_u64(),
            });
        }
        while planned < total_ms && steps.len() < steps_max {
            let mut roll = rng.below(total_weight);
            let mut kind = weighted[0].1;
            for (w, k) in &weighted {
                if roll < *w {
                    kind = *k;
                    break;
                }
                roll -= w;
            }
            let fault = kind.draw(&mut rng);
            let for_ms = match fault {
                Fault::IsolateLeader { .. } => isolation_ms,
                _ => rng.between(fault_ms_min, fault_ms_max),
            };
            let calm_ms = rng.between(0, calm_ms_max);
            planned += for_ms + calm_ms;
            steps.push(Step {
                fault,
                for_ms,
                calm_ms,
                pick: rng.next_u64(),
            });
        }
        Self { seed, steps }
    }
}

/// What the nemesis acts on.
pub struct Target<'a> {
    pub router: &'a Router,
    pub machines: &'a Machines,
    pub replicas: &'a BTreeMap<NodeId, SharedReplica>,
    pub pauses: &'a BTreeMap<NodeId, Pause>,
    pub history: &'a Recorder,
}

/// What a played step changed, so that exactly that is undone.
enum Undo {
    Rejoin { id: NodeId, paused: bool },
    Mend { from: NodeId, to: NodeId },
    StopDropping { a: NodeId, b: NodeId },
    StopDelaying { a: NodeId, b: NodeId },
    Release { from: NodeId, to: NodeId },
    ReleaseEnvelopes { from: NodeId },
    StopDelayingEnvelopes { from: NodeId },
    StopReplaying,
    Resume { id: NodeId },
}

impl Target<'_> {
    /// Plays every step of `schedule` in order.
    pub async fn play(&self, schedule: &Schedule) {
        for (i, step) in schedule.steps.iter().enumerate() {
            let started = self.history.now();
            let (undo, what) = self.start(step).await;
            self.log(
                schedule.seed,
                i,
                format!("{} for {} ms: {what}", step.fault, step.for_ms),
            );
            self.hold_fault(step, &undo, started).await;
            self.stop(undo);
            self.log(schedule.seed, i, format!("{} ended", step.fault));
            tokio::time::sleep(Duration::from_millis(step.calm_ms)).await;
        }
    }

    fn log(&self, seed: u64, step: usize, what: String) {
        tracing::info!(seed, step, %what, "nemesis");
        self.history.record(Event::Nemesis { seed, step, what });
    }

    /// Keeps the fault on for its time. An isolation lasts until another replica leads in a higher
    /// term (or the step's time is up twice over), so a deposed leader really was deposed.
    async fn hold_fault(&self, step: &Step, undo: &Undo, started: Tick) {
        let time = Duration::from_millis(step.for_ms);
        let until = tokio::time::Instant::now() + time;
        if let Undo::Rejoin { id, .. } = undo {
            let isolated = *id;
            let deposed = self
                .history
                .wait_for(
                    started,
                    time * 2,
                    |e| matches!(e, Event::LeaseAcquired { replica, .. } if *replica != isolated),
                )
                .await;
            if !deposed {
                self.history.record(Event::Note {
                    what: format!("no other replica got a lease while {isolated} was isolated"),
                });
            }
        }
        tokio::time::sleep_until(until).await;
    }

    /// Turns the step's fault on, aimed at the current leader (or a replica the step picks when
    /// none leads) and a partner the step picks.
    async fn start(&self, step: &Step) -> (Undo, String) {
        let ids: Vec<NodeId> = self.replicas.keys().copied().collect();
        let mut rng = Rng::new(step.pick, 0);
        let leader = self
            .leader()
            .unwrap_or(ids[rng.below(ids.len() as u64) as usize]);
        let rest: Vec<NodeId> = ids.iter().copied().filter(|i| *i != leader).collect();
        let partner = rest[rng.below(rest.len() as u64) as usize];
        match step.fault {
            Fault::IsolateLeader { pause_actor } => self.isolate(leader, pause_actor).await,
            Fault::HoldEnvelopes
            | Fault::DelayEnvelopes { .. }
            | Fault::ReplayEnvelopes { .. }
            | Fault::PauseLeader => self.start_at_hosts(step.fault, leader, &ids),
            fault => self.start_in_router(fault, leader, partner, rng.chance(500)),
        }
    }

    /// Faults between two replicas; `flip` turns a one-way cut around.
    fn start_in_router(&self, fault: Fault, a: NodeId, b: NodeId, flip: bool) -> (Undo, String) {
        match fault {
            Fault::CutOneWay => {
                let (from, to) = if flip { (b, a) } else { (a, b) };
                self.router.cut(from, to);
                (Undo::Mend { from, to }, format!("cut {from}→{to}"))
            }
            Fault::DropMessages { per_mille } => {
                self.router.drop_messages(a, b, per_mille);
                self.router.drop_messages(b, a, per_mille);
                (Undo::StopDropping { a, b }, format!("between {a} and {b}"))
            }
            Fault::Delay { ms } => {
                let by = Duration::from_millis(ms);
                self.router.delay(a, b, by);
                self.router.delay(b, a, by);
                (Undo::StopDelaying { a, b }, format!("between {a} and {b}"))
            }
            _ => {
                self.router.hold(a, b);
                (Undo::Release { from: a, to: b }, format!("hold {a}→{b}"))
            }
        }
    }

    /// Faults on the way from the leader to the hosts, or in the leader's actor.
    fn start_at_hosts(&self, fault: Fault, leader: NodeId, ids: &[NodeId]) -> (Undo, String) {
        match fault {
            Fault::HoldEnvelopes => {
                self.machines.hold(leader);
                let undo = Undo::ReleaseEnvelopes { from: leader };
                (undo, format!("hold envelopes from {leader}"))
            }
            Fault::DelayEnvelopes { ms } => {
                self.machines.delay(leader, Duration::from_millis(ms));
                let undo = Undo::StopDelayingEnvelopes { from: leader };
                (undo, format!("delay envelopes from {leader}"))
            }
            Fault::ReplayEnvelopes { per_mille } => {
                for id in ids {
                    self.machines.replay(*id, per_mille);
                }
                (Undo::StopReplaying, "every replica's envelopes".to_string())
            }
            _ => {
                self.pause_of(leader).pause();
                (Undo::Resume { id: leader }, format!("pause {leader}"))
            }
        }
    }

    /// Isolates `leader`. With `pause_actor`, first holds its envelopes until it sent one more, then
    /// waits (briefly) for its actor to stop between commit and send: what it sent before arrives
    /// late, after the new leader's, and what it committed waits for a lease that has closed.
    async fn isolate(&self, leader: NodeId, pause_actor: bool) -> (Undo, String) {
        let mut what = format!("isolate {leader}");
        if pause_actor {
            let from = self.history.now();
            self.machines.hold(leader);
            let within = Duration::from_millis(park_wait_ms);
            let held = self
                .history
                .wait_for(
                    from,
                    within,
                    |e| matches!(e, Event::EnvelopeSent { replica, .. } if *replica == leader),
                )
                .await;
            let pause = self.pause_of(leader);
            pause.pause();
            let parked = pause.wait_parked(within).await;
            what.push_str(&format!(
                "; its envelopes held ({}), its actor paused ({})",
                if held {
                    "one sent since"
                } else {
                    "none sent since"
                },
                if parked {
                    "parked after a commit"
                } else {
                    "did not park"
                },
            ));
        }
        self.router.isolate(leader);
        let undo = Undo::Rejoin {
            id: leader,
            paused: pause_actor,
        };
        (undo, what)
    }

    fn stop(&self, undo: Undo) {
        match undo {
            Undo::Rejoin { id, paused } => {
                // Resume before rejoining, so the actor may act before its replica hears of the new term.
                if paused {
                    self.pause_of(id).resume();
                }
                self.router.rejoin(id);
                if paused {
                    self.machines.release(id);
                }
            }
            Undo::Mend { from, to } => self.router.mend(from, to),
            Undo::StopDropping { a, b } => {
                self.router.drop_messages(a, b, 0);
                self.router.drop_messages(b, a, 0);
            }
            Undo::StopDelaying { a, b } => {
                self.router.delay(a, b, Duration::ZERO);
                self.router.delay(b, a, Duration::ZERO);
            }
            Undo::Release { from, to } => self.router.release(from, to),
            Undo::ReleaseEnvelopes { from } => self.machines.release(from),
            Undo::StopDelayingEnvelopes { from } => self.machines.delay(from, Duration::ZERO),
            Undo::StopReplaying => {
                for id in self.replicas.keys() {
                    self.machines.replay(*id, 0);
                }
            }
            Undo::Resume { id } => self.pause_of(id).resume(),
        }
    }

    fn pause_of(&self, id: NodeId) -> Pause {
        self.pauses.get(&id).cloned().unwrap_or_default()
    }

    /// The replica that leads in the highest term, by its own metrics.
    fn leader(&self) -> Option<NodeId> {
        let mut best: Option<(u64, NodeId)> = None;
        for (id, replica) in self.replicas {
            let m = replica.metrics().borrow().clone();
            if m.state == ServerState::Leader && best.is_none_or(|(t, _)| m.current_term > t) {
                best = Some((m.current_term, *id));
            }
        }
        best.map(|(_, id)| id)
    }
}
