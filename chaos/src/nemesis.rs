//! The nemesis: a seeded schedule of named faults over the real endpoints' hooks (Raft links
//! between replicas, envelope links to hosts, report links back), the replicas' lease clocks, and
//! the processes (replica and host stop and restart from their files), played step by step and
//! each step recorded. A schedule is a pure function of `(seed, mix, time)`; which replica a step
//! hits is chosen when it is played (the leader then), from the step's own draw.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio::sync::RwLock;

use crate::bed::{Cluster, machines, replicas_n};
use crate::history::Event;
use crate::rng::Rng;

/// Steps in one schedule at most.
pub const steps_max: usize = 32;
/// Steps in one schedule at least, however short its time: the headline fault and two drawn.
pub const steps_min: usize = 3;
/// Shortest and longest time a fault stays on.
pub const fault_ms_min: u64 = 200;
pub const fault_ms_max: u64 = 700;
/// About how long a deposition takes (an election and a new lease), counted in a schedule's
/// time: a deposing fault stays on until another replica was granted a lease (at most
/// [`depose_wait_ms`]) and then its drawn time more.
pub const depose_ms: u64 = 1_500;
/// Calm between two steps, at most.
pub const calm_ms_max: u64 = 200;
/// Longest wait for the leader's next envelope write (crash-leader-mid-push).
pub const mid_push_wait_ms: u64 = 3_000;
/// Longest wait for a snapshot a replica was told to build.
pub const snapshot_wait_ms: u64 = 3_000;
/// Longest wait for another replica's lease while a leader is cut off.
pub const depose_wait_ms: u64 = 4_000;
/// Longest wait for a wiped replica's first snapshot install (crash-mid-snapshot): the leader
/// backs off from a replica it could not reach for up to a few seconds.
pub const install_wait_ms: u64 = 6_000;
/// Longest wait for every replica to be level before a disk is lost (decision 0279).
pub const level_wait_ms: u64 = 5_000;

/// One kind of fault, by the name the schedule and the table show.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Fault {
    /// Cut the leader off from the other replicas, both ways (hosts and operators still reach it).
    IsolateLeader,
    /// Drop the leader's messages to the other replicas only.
    IsolateLeaderOut,
    /// Drop the other replicas' messages to the leader only.
    IsolateLeaderIn,
    /// Cut one follower off from both others.
    IsolateFollower,
    /// Cut the link between the two followers: the leader still reaches both (a bridge).
    Bridge,
    /// Drop the next messages on random replica links, again and again.
    Drops,
    /// Delay every replica link by a jittered amount, redrawn every 50 ms.
    DelayJitter,
    /// Hold every message on one replica link, then release them newest first.
    Reorder,
    /// Hold every message on one replica link, then release them oldest first.
    HoldRelease,
    /// Hold the leader's envelopes before its write gate while it is cut off from the replicas,
    /// until another replica holds a lease; then release them (paused between commit and send).
    PausedLeader,
    /// Jump the leader's lease clock past its lease (lease lost by a clock jump).
    ClockJump,
    /// Hold everything the leader sends for the step, jump its clock by as long, release
    /// (suspended: boot time ran on while nothing of it did).
    Suspend,
    /// Hold one host's next report and deliver it after the one after it (report overtaking).
    OvertakeReport,
    /// Deliver the hosts' reports twice.
    DuplicateReports,
    /// Stop a replica (the leader half the time) as a crash looks, restart it from its files.
    CrashReplica,
    /// Stop a host and its modules, restart it from its files.
    CrashHost,
    /// Crash a host's agent at its next apply, after the mark and the declaration are on disk and
    /// before anything is applied; stop it and restart it from its files.
    CrashHostMidApply,
    /// Lose a follower's disk: stop it, remove its store and epoch-floor file, start it on an
    /// empty store (it catches up from the leader's snapshot, decision 0200).
    StoreLost,
    /// Stop every replica and restore each from the backup taken at setup, as `meshd restore`
    /// does (the store removed, the epoch-floor file beside it kept), then start them.
    RestoreOldBackup,
    /// The same on new disks: the epoch-floor files lost with the stores, so only the backup's
    /// floor and what hosts prove tell the cluster which epochs were used.
    RestoreOnNewDisks,
    /// Crash the leader at its next envelope write: the send record committed, the envelope not
    /// written (its push unwinds at the write gate's yes), then the replica cut off, stopped and
    /// restarted from its files.
    CrashLeaderMidPush,
    /// Deliver the next envelopes from every replica to the hosts twice.
    DuplicateEnvelopes,
    /// Lose a follower's disk as `store-lost` does, and crash it in the middle of installing the
    /// leader's snapshot (the install unwinds before it writes); restart it from its files.
    CrashMidSnapshot,
    /// The hostile host (`eve`'s valid certificate, not in the model) floods the leader with
    /// legal reports of a few hundred KiB, many at once, each sent again as soon as answered.
    HostileFlood,
    /// The hostile host sends frames over its frame limit and reports within it holding more
    /// module entries than any report may.
    HostileOversized,
    /// The hostile host replays its old reports, counts backwards, and sends another host's
    /// report as its own and framed as that host's.
    HostileReplay,
    /// The hostile host claims an epoch above the floor without a valid proof (none, forged,
    /// another host's) and an epoch and counter beyond any a host reaches.
    HostileContradict,
    /// A copy of a replica's certificate sends Raft calls claiming another replica's id and
    /// terms above `term_max`.
    HostileReplica,
}

impl Fault {
    pub const all: [Fault; 28] = [
        Fault::IsolateLeader,
        Fault::IsolateLeaderOut,
        Fault::IsolateLeaderIn,
        Fault::IsolateFollower,
        Fault::Bridge,
        Fault::Drops,
        Fault::DelayJitter,
        Fault::Reorder,
        Fault::HoldRelease,
        Fault::PausedLeader,
        Fault::ClockJump,
        Fault::Suspend,
        Fault::OvertakeReport,
        Fault::DuplicateReports,
        Fault::CrashReplica,
        Fault::CrashHost,
        Fault::CrashHostMidApply,
        Fault::StoreLost,
        Fault::RestoreOldBackup,
        Fault::RestoreOnNewDisks,
        Fault::CrashLeaderMidPush,
        Fault::DuplicateEnvelopes,
        Fault::CrashMidSnapshot,
        Fault::HostileFlood,
        Fault::HostileOversized,
        Fault::HostileReplay,
        Fault::HostileContradict,
        Fault::HostileReplica,
    ];

    /// The fault's name in schedules and tables.
    pub fn name(&self) -> &'static str {
        match self {
            Fault::IsolateLeader => "isolate-leader",
            Fault::IsolateLeaderOut => "isolate-leader-out",
            Fault::IsolateLeaderIn => "isolate-leader-in",
            Fault::IsolateFollower => "isolate-follower",
            Fault::Bridge => "bridge",
            Fault::Drops => "drops",
            Fault::DelayJitter => "delay-jitter",
            Fault::Reorder => "reorder",
            Fault::HoldRelease => "hold-release",
            Fault::PausedLeader => "paused-leader",
            Fault::ClockJump => "clock-jump",
            Fault::Suspend => "suspend",
            Fault::OvertakeReport => "overtake-report",
            Fault::DuplicateReports => "duplicate-reports",
            Fault::CrashReplica => "crash-replica",
            Fault::CrashHost => "crash-host",
            Fault::CrashHostMidApply => "crash-host-mid-apply",
            Fault::StoreLost => "store-lost",
            Fault::RestoreOldBackup => "restore-old-backup",
            Fault::RestoreOnNewDisks => "restore-on-new-disks",
            Fault::CrashLeaderMidPush => "crash-leader-mid-push",
            Fault::DuplicateEnvelopes => "duplicate-envelopes",
            Fault::CrashMidSnapshot => "crash-mid-snapshot",
            Fault::HostileFlood => "hostile-flood",
            Fault::HostileOversized => "hostile-oversized",
            Fault::HostileReplay => "hostile-replay",
            Fault::HostileContradict => "hostile-contradict",
            Fault::HostileReplica => "hostile-replica",
        }
    }

    /// Whether the fault is the hostile peer's: it touches no link, process or clock of the
    /// cluster, so the other hosts' reports must be filed as usual while it plays.
    pub fn hostile(&self) -> bool {
        matches!(
            self,
            Fault::HostileFlood
                | Fault::HostileOversized
                | Fault::HostileReplay
                | Fault::HostileContradict
                | Fault::HostileReplica
        )
    }

    /// Whether the fault deposes the leader (it stays on until another replica holds a lease).
    pub fn deposes(&self) -> bool {
        matches!(
            self,
            Fault::IsolateLeader
                | Fault::IsolateLeaderOut
                | Fault::PausedLeader
                | Fault::Suspend
                | Fault::CrashReplica
                | Fault::CrashLeaderMidPush
        )
    }
}

impl fmt::Display for Fault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Which faults a schedule draws from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Mix {
    /// The Raft links: isolation both ways and one way, partitions, drops, jitter, reorder, holds.
    Partitions,
    /// Deposed leaders: paused between commit and send, clock jumps, suspend, isolation.
    StaleLeaders,
    /// Processes and reports: replica and host crashes, overtaken and duplicated reports.
    Processes,
    /// Stores: a restore of the whole cluster from an older backup, a lost disk, a leader
    /// crashed mid-push, duplicated envelopes.
    Stores,
    /// A restore on new disks (the epoch-floor files lost too) with elections around it: the
    /// mix of the open G9 finding (docs/chaos.md).
    NewDisks,
    /// Everything but the hostile peer, evenly (the hostile faults came later; adding them would
    /// change what every `everything` seed draws, the pinned CI seed's included).
    Everything,
    /// The hostile peer (flood, oversized frames, replays, contradictions, a replica certificate
    /// claiming another id), beside a partition and crashes of replicas and hosts.
    Hostile,
}

impl Mix {
    pub const all: [Mix; 7] = [
        Mix::Partitions,
        Mix::StaleLeaders,
        Mix::Processes,
        Mix::Stores,
        Mix::NewDisks,
        Mix::Everything,
        Mix::Hostile,
    ];

    /// The mix's name on the command line.
    pub fn name(&self) -> &'static str {
        match self {
            Mix::Partitions => "partitions",
            Mix::StaleLeaders => "stale-leaders",
            Mix::Processes => "processes",
            Mix::Stores => "stores",
            Mix::NewDisks => "new-disks",
            Mix::Everything => "everything",
            Mix::Hostile => "hostile",
        }
    }

    /// The mix named `name`.
    pub fn named(name: &str) -> Option<Mix> {
        Mix::all.into_iter().find(|m| m.name() == name)
    }

    /// The faults it draws from; the first opens every schedule of the mix.
    pub fn faults(&self) -> Vec<Fault> {
        use Fault::*;
        match self {
            Mix::Partitions => vec![
                IsolateLeader,
                IsolateLeaderOut,
                IsolateLeaderIn,
                IsolateFollower,
                Bridge,
                Drops,
                DelayJitter,
                Reorder,
                HoldRelease,
            ],
            Mix::StaleLeaders => vec![
                PausedLeader,
                ClockJump,
                Suspend,
                IsolateLeader,
                IsolateLeaderOut,
                CrashLeaderMidPush,
            ],
            Mix::Processes => vec![
                CrashReplica,
                CrashHost,
                CrashHostMidApply,
                OvertakeReport,
                DuplicateReports,
                StoreLost,
                CrashLeaderMidPush,
                DuplicateEnvelopes,
                CrashMidSnapshot,
            ],
            // A deposition first: a restore means something once epochs moved past the backup's.
            Mix::NewDisks => vec![IsolateLeader, RestoreOnNewDisks, CrashReplica],
            Mix::Stores => vec![
                IsolateLeader,
                RestoreOldBackup,
                StoreLost,
                CrashLeaderMidPush,
                DuplicateEnvelopes,
                CrashReplica,
            ],
            Mix::Everything => Fault::all.into_iter().filter(|f| !f.hostile()).collect(),
            Mix::Hostile => vec![
                HostileFlood,
                HostileOversized,
                HostileReplay,
                HostileContradict,
                HostileReplica,
                IsolateLeader,
                CrashReplica,
                CrashHost,
            ],
        }
    }
}

impl fmt::Display for Mix {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// One step: a fault on for `for_ms`, then `calm_ms` without it; `pick` chooses what it hits.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Step {
    pub fault: Fault,
    pub for_ms: u64,
    pub calm_ms: u64,
    pub pick: u64,
}

impl Step {
    /// About how long the step takes: its time, its calm, and a deposition's when it deposes.
    pub fn planned_ms(&self) -> u64 {
        let depose = if self.fault.deposes() { depose_ms } else { 0 };
        self.for_ms + self.calm_ms + depose
    }
}

/// A seeded list of steps.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Schedule {
    pub seed: u64,
    pub mix: Mix,
    pub steps: Vec<Step>,
}

impl Schedule {
    /// Draws steps from `mix` until they fill `total_ms` and number at least [`steps_min`] (at
    /// most [`steps_max`]); the mix's first fault comes first.
    pub fn generate(seed: u64, mix: Mix, total_ms: u64) -> Self {
        let mut rng = Rng::new(seed, 0x4e_3e5);
        let faults = mix.faults();
        let mut steps = Vec::new();
        let mut planned = 0;
        while (planned < total_ms || steps.len() < steps_min) && steps.len() < steps_max {
            let fault = if steps.is_empty() {
                faults[0]
            } else {
                faults[rng.below(faults.len() as u64) as usize]
            };
            let step = Step {
                fault,
                for_ms: rng.between(fault_ms_min, fault_ms_max),
                calm_ms: rng.between(0, calm_ms_max),
                pick: rng.next_u64(),
            };
            planned += step.planned_ms();
            steps.push(step);
        }
        Self { seed, mix, steps }
    }
}

/// Plays `schedule` on `cluster`; returns how many steps of each fault ran.
pub async fn play(cluster: &Arc<RwLock<Cluster>>, schedule: &Schedule) -> Vec<Fault> {
    let mut played = Vec::new();
    for (i, step) in schedule.steps.iter().enumerate() {
        let started = tokio::time::Instant::now();
        let what = play_step(cluster, i, step).await;
        let what = format!("{what} ({} ms)", started.elapsed().as_millis());
        let c = cluster.read().await;
        c.recorder.record(Event::Nemesis {
            step: i,
            fault: step.fault.name().into(),
            what,
            on: false,
        });
        drop(c);
        played.push(step.fault);
        tokio::time::sleep(Duration::from_millis(step.calm_ms)).await;
    }
    played
}

fn note(c: &Cluster, step: usize, fault: Fault, what: String) {
    tracing::info!(step, fault = fault.name(), %what, "nemesis");
    c.recorder.record(Event::Nemesis {
        step,
        fault: fault.name().into(),
        what,
        on: true,
    });
}

/// The leader now, or the replica `pick` names when there is none.
fn target(c: &Cluster, pick: u64) -> u64 {
    c.leader()
        .map(|(id, _)| id)
        .unwrap_or(1 + pick % replicas_n)
}

fn others(id: u64) -> Vec<u64> {
    (1..=replicas_n).filter(|o| *o != id).collect()
}

/// After another replica leads, how long a deposition still waits for it to be granted a lease
/// (a lease round comes with a push or a renewal, so only when an operator pushes through it).
pub const lease_after_lead_ms: u64 = 500;

/// Waits until a replica other than `deposed` was granted a lease after `from`, or leads (by its
/// metrics, above `deposed`'s term) and [`lease_after_lead_ms`] passed without one; at most
/// [`depose_wait_ms`]. True when another replica leads or holds a lease.
async fn wait_deposed(c: &Cluster, deposed: u64, from: u64) -> bool {
    let deadline = tokio::time::Instant::now() + Duration::from_millis(depose_wait_ms);
    let old_term = c
        .replicas
        .get(&deposed)
        .map(|r| r.service().replica().metrics().borrow().current_term)
        .unwrap_or(0);
    let mut leads_since: Option<tokio::time::Instant> = None;
    loop {
        let leased = c.recorder.any_since(
            from,
            |e| matches!(e, Event::LeaseGranted { replica, .. } if *replica != deposed),
        );
        if leased {
            return true;
        }
        let now = tokio::time::Instant::now();
        if leads_since.is_none()
            && c.leader()
                .is_some_and(|(id, term)| id != deposed && term > old_term)
        {
            leads_since = Some(now);
        }
        if leads_since.is_some_and(|at| now - at >= Duration::from_millis(lease_after_lead_ms)) {
            return true;
        }
        if now >= deadline {
            return leads_since.is_some();
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Has replica `id` build a snapshot now and purge its log up to it; says what it did.
/// A follower's disk lost (`store-lost`, `crash-mid-snapshot`): once all three are level
/// (decision 0279), the leader's log purged up to a fresh snapshot, as on a cluster that ran long
/// enough, so the empty store can only come back through the snapshot; then the follower crashed
/// and its store and floor removed. `Ok`: what the purge did; `Err`: why nothing was wiped.
async fn lose_disk(c: &mut Cluster, leader: u64, id: u64) -> Result<String, String> {
    wait_level(c)
        .await
        .map_err(|behind| format!("not wiped within {level_wait_ms} ms: {behind}"))?;
    let purged = purge_to_snapshot(c, leader).await;
    c.crash_replica(id).await;
    c.wipe_store(id, true)
        .map_err(|e| format!("replica {id}'s store not removed: {e}"))?;
    c.recorder.record(Event::StoreWiped { replica: id });
    Ok(purged)
}

async fn purge_to_snapshot(c: &Cluster, id: u64) -> String {
    let Some(r) = c.replicas.get(&id) else {
        return format!("replica {id} is down; nothing purged");
    };
    let raft = r.service().replica().raft();
    let before = raft.metrics().borrow().snapshot;
    if raft.trigger().snapshot().await.is_err() {
        return format!("replica {id} did not take the snapshot order");
    }
    let deadline = tokio::time::Instant::now() + Duration::from_millis(snapshot_wait_ms);
    loop {
        let now = raft.metrics().borrow().snapshot;
        if let Some(at) = now
            && now != before
        {
            return match raft.trigger().purge_log(at.index).await {
                Ok(()) => format!(
                    "replica {id}'s log purged up to its snapshot at {}",
                    at.index
                ),
                Err(e) => format!("replica {id} snapshot at {}, not purged: {e}", at.index),
            };
        }
        if tokio::time::Instant::now() >= deadline {
            return format!("replica {id} built no snapshot within {snapshot_wait_ms} ms");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Waits until all three replicas run and have applied the same index, within
/// [`level_wait_ms`]; `Err` names who is behind or down. A disk is lost only then (decision 0279):
/// a replica back on an empty store votes at once (decision 0200), so a wipe while another replica
/// is behind is two failures for Raft. The empty store's vote can elect the one behind, which
/// lacks entries the wiped replica had helped commit (pass D's processes seed 1021: they were
/// lost and the up-to-date replica's openraft panicked).
async fn wait_level(c: &Cluster) -> Result<(), String> {
    let deadline = tokio::time::Instant::now() + Duration::from_millis(level_wait_ms);
    loop {
        let applied: Vec<(u64, Option<u64>)> = c
            .replicas
            .iter()
            .map(|(id, r)| {
                let m = r.service().replica().metrics().borrow().clone();
                (*id, m.last_applied.map(|l| l.index))
            })
            .collect();
        let top = applied.iter().filter_map(|(_, a)| *a).max();
        let behind: Vec<String> = (1..=replicas_n)
            .filter_map(|id| match applied.iter().find(|(r, _)| *r == id) {
                None => Some(format!("replica {id} is down")),
                Some((_, a)) if *a != top => Some(format!("replica {id} applied {a:?} of {top:?}")),
                Some(_) => None,
            })
            .collect();
        if behind.is_empty() {
            return Ok(());
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(behind.join(", "));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn play_step(cluster: &Arc<RwLock<Cluster>>, i: usize, step: &Step) -> String {
    let time = Duration::from_millis(step.for_ms);
    let mut rng = Rng::new(step.pick, 0x57e9);
    match step.fault {
        Fault::IsolateLeader | Fault::IsolateLeaderOut | Fault::IsolateLeaderIn => {
            let c = cluster.read().await;
            let leader = target(&c, step.pick);
            let (out, inward) = match step.fault {
                Fault::IsolateLeader => (true, true),
                Fault::IsolateLeaderOut => (true, false),
                _ => (false, true),
            };
            note(&c, i, step.fault, format!("replica {leader}"));
            let from = c.recorder.now();
            c.isolate(leader, out, inward);
            // Cut off outward, it is deposed: on until another replica holds a lease, then the
            // step's time more, while it still takes requests and may try to write.
            let deposed = out && wait_deposed(&c, leader, from).await;
            tokio::time::sleep(time).await;
            c.heal_all();
            format!("replica {leader} rejoined (deposed: {deposed})")
        }
        Fault::IsolateFollower => {
            let c = cluster.read().await;
            let leader = target(&c, step.pick);
            let follower = others(leader)[rng.below(2) as usize];
            note(&c, i, step.fault, format!("replica {follower}"));
            c.isolate(follower, true, true);
            tokio::time::sleep(time).await;
            c.heal_all();
            format!("replica {follower} rejoined")
        }
        Fault::Bridge => {
            let c = cluster.read().await;
            let leader = target(&c, step.pick);
            let f = others(leader);
            note(
                &c,
                i,
                step.fault,
                format!("{} and {} cut apart; {leader} reaches both", f[0], f[1]),
            );
            if let Some(e) = c.replica_endpoint(f[0]) {
                e.faults().cut_off(c.addrs[&f[1]]);
            }
            if let Some(e) = c.replica_endpoint(f[1]) {
                e.faults().cut_off(c.addrs[&f[0]]);
            }
            tokio::time::sleep(time).await;
            c.heal_all();
            "bridge healed".into()
        }
        Fault::Drops => {
            let c = cluster.read().await;
            note(
                &c,
                i,
                step.fault,
                "a few messages at a time on random replica links".into(),
            );
            let until = tokio::time::Instant::now() + time;
            let mut dropped = 0;
            while tokio::time::Instant::now() < until {
                let from = 1 + rng.below(replicas_n);
                let to = others(from)[rng.below(2) as usize];
                let count = rng.between(1, 4);
                if let Some(e) = c.replica_endpoint(from) {
                    e.faults().drop_next(c.addrs[&to], count);
                    dropped += count;
                }
                tokio::time::sleep(Duration::from_millis(rng.between(20, 80))).await;
            }
            c.heal_all();
            format!("{dropped} drops armed")
        }
        Fault::DelayJitter => {
            let c = cluster.read().await;
            let base = rng.between(5, 60);
            note(
                &c,
                i,
                step.fault,
                format!("{base} ms ± {base} ms on every replica link"),
            );
            let until = tokio::time::Instant::now() + time;
            while tokio::time::Instant::now() < until {
                for from in 1..=replicas_n {
                    for to in others(from) {
                        if let Some(e) = c.replica_endpoint(from) {
                            let ms = rng.between(0, 2 * base);
                            e.faults().delay(c.addrs[&to], Duration::from_millis(ms));
                        }
                    }
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            c.heal_all();
            "delays off".into()
        }
        Fault::Reorder | Fault::HoldRelease => {
            let c = cluster.read().await;
            let leader = target(&c, step.pick);
            let peer = others(leader)[rng.below(2) as usize];
            let (from, to) = if rng.chance(500) {
                (leader, peer)
            } else {
                (peer, leader)
            };
            note(&c, i, step.fault, format!("replica {from} to {to}"));
            let addr = c.addrs[&to];
            if let Some(e) = c.replica_endpoint(from) {
                e.faults().hold(addr);
            }
            tokio::time::sleep(time).await;
            let released = match c.replica_endpoint(from) {
                Some(e) if step.fault == Fault::Reorder => e.faults().release_reversed(addr).await,
                Some(e) => e.faults().release(addr).await,
                None => 0,
            };
            c.heal_all();
            format!("{released} messages released")
        }
        Fault::PausedLeader => {
            let c = cluster.read().await;
            let leader = target(&c, step.pick);
            note(
                &c,
                i,
                step.fault,
                format!("replica {leader}: envelopes held, cut off from replicas"),
            );
            let from = c.recorder.now();
            if let Some(e) = c.replica_endpoint(leader) {
                for h in c.hosts.values() {
                    e.faults().hold(h.addr);
                }
            }
            // Let it commit sends it cannot deliver, then depose it.
            tokio::time::sleep(time).await;
            c.isolate(leader, true, true);
            let deposed = wait_deposed(&c, leader, from).await;
            let mut released = 0;
            if let Some(e) = c.replica_endpoint(leader) {
                for h in c.hosts.values() {
                    released += e.faults().release(h.addr).await;
                }
            }
            c.heal_all();
            format!("deposed: {deposed}; {released} held envelopes released")
        }
        Fault::ClockJump => {
            let c = cluster.read().await;
            let leader = target(&c, step.pick);
            let by = Duration::from_millis(rng.between(1_000, 5_000));
            note(
                &c,
                i,
                step.fault,
                format!("replica {leader}'s lease clock +{} ms", by.as_millis()),
            );
            c.clocks[&leader].jump(by);
            tokio::time::sleep(time).await;
            "jumped".into()
        }
        Fault::Suspend => {
            let c = cluster.read().await;
            let leader = target(&c, step.pick);
            note(&c, i, step.fault, format!("replica {leader} suspended"));
            let mut peers: Vec<_> = others(leader).iter().map(|o| c.addrs[o]).collect();
            peers.extend(c.hosts.values().map(|h| h.addr));
            if let Some(e) = c.replica_endpoint(leader) {
                for p in &peers {
                    e.faults().hold(*p);
                }
            }
            for o in others(leader) {
                if let Some(e) = c.replica_endpoint(o) {
                    e.faults().cut_off(c.addrs[&leader]);
                }
            }
            // Suspended until the others elected a leader with a lease, and the step's time more.
            let suspended = tokio::time::Instant::now();
            let from = c.recorder.now();
            wait_deposed(&c, leader, from).await;
            tokio::time::sleep(time).await;
            // Resume: boot time ran on for the whole suspend; then what it held leaves.
            c.clocks[&leader].jump(suspended.elapsed());
            let mut released = 0;
            if let Some(e) = c.replica_endpoint(leader) {
                for p in &peers {
                    released += e.faults().release(*p).await;
                }
            }
            c.heal_all();
            format!("resumed; {released} held messages released")
        }
        Fault::OvertakeReport => {
            let c = cluster.read().await;
            let m = machines[rng.below(machines.len() as u64) as usize];
            note(&c, i, step.fault, format!("{m}'s next report"));
            if let Some(h) = c.hosts.get(m) {
                h.faults.hold_next.store(true, Ordering::SeqCst);
            }
            tokio::time::sleep(time).await;
            "armed".into()
        }
        Fault::DuplicateReports => {
            let c = cluster.read().await;
            let per_mille = rng.between(300, 1000) as u32;
            note(&c, i, step.fault, format!("{per_mille}‰ of reports twice"));
            for h in c.hosts.values() {
                h.faults
                    .duplicate_per_mille
                    .store(per_mille, Ordering::SeqCst);
            }
            tokio::time::sleep(time).await;
            for h in c.hosts.values() {
                h.faults.duplicate_per_mille.store(0, Ordering::SeqCst);
            }
            "off".into()
        }
        Fault::CrashReplica => {
            let mut c = cluster.write().await;
            let id = if rng.chance(500) {
                target(&c, step.pick)
            } else {
                1 + rng.below(replicas_n)
            };
            note(&c, i, step.fault, format!("replica {id}"));
            let from = c.recorder.now();
            let was_leader = c.leader().is_some_and(|(l, _)| l == id);
            c.crash_replica(id).await;
            // Down from the cut on (its stop took part of that): a crashed leader until another
            // replica holds a lease, then the step's time more.
            if was_leader {
                wait_deposed(&c, id, from).await;
            }
            tokio::time::sleep(time).await;
            match c.restart_replica(id).await {
                Ok(()) => format!("replica {id} restarted"),
                Err(e) => {
                    c.recorder.record(Event::Note {
                        what: format!("RESTART FAILED: {e}"),
                    });
                    format!("replica {id} did not restart: {e}")
                }
            }
        }
        Fault::CrashHostMidApply => {
            let m = machines[rng.below(machines.len() as u64) as usize];
            let from = {
                let c = cluster.read().await;
                note(&c, i, step.fault, format!("host {m} at its next apply"));
                c.recorder.now()
            };
            crate::observe::crash_at_next_apply(Some(m));
            let recorder = cluster.read().await.recorder.clone();
            let crashed = recorder
                .wait_for(
                    from,
                    time * 4,
                    |e| matches!(e, Event::HostApplied { machine, .. } if machine == m),
                )
                .await;
            crate::observe::crash_at_next_apply(None);
            let mut c = cluster.write().await;
            if !crashed {
                return format!(
                    "no envelope reached {m} within {} ms; not crashed",
                    (time * 4).as_millis()
                );
            }
            c.stop_host(m).await;
            match c.restart_host(m).await {
                Ok(()) => format!("host {m} restarted from its mark and applied record"),
                Err(e) => {
                    c.recorder.record(Event::Note {
                        what: format!("RESTART FAILED: {e}"),
                    });
                    format!("host {m} did not restart: {e}")
                }
            }
        }
        Fault::StoreLost => {
            let mut c = cluster.write().await;
            let leader = target(&c, step.pick);
            let id = others(leader)[rng.below(2) as usize];
            note(&c, i, step.fault, format!("replica {id}'s disk"));
            let purged = match lose_disk(&mut c, leader, id).await {
                Ok(purged) => purged,
                Err(why) => return why,
            };
            tokio::time::sleep(time).await;
            match c.restart_replica(id).await {
                Ok(()) => format!("replica {id} started on an empty store ({purged})"),
                Err(e) => {
                    c.recorder.record(Event::Note {
                        what: format!("RESTART FAILED: {e}"),
                    });
                    format!("replica {id} did not start on an empty store: {e}")
                }
            }
        }
        Fault::CrashMidSnapshot => {
            let mut c = cluster.write().await;
            let leader = target(&c, step.pick);
            let id = others(leader)[rng.below(2) as usize];
            note(
                &c,
                i,
                step.fault,
                format!("replica {id}'s disk, and its snapshot install"),
            );
            let purged = match lose_disk(&mut c, leader, id).await {
                Ok(purged) => purged,
                Err(why) => return why,
            };
            let from = c.recorder.now();
            crate::observe::crash_at_next_install(true);
            if let Err(e) = c.restart_replica(id).await {
                crate::observe::crash_at_next_install(false);
                c.recorder.record(Event::Note {
                    what: format!("RESTART FAILED: {e}"),
                });
                return format!("replica {id} did not start on an empty store: {e}");
            }
            let crashed = c
                .recorder
                .wait_for(from, Duration::from_millis(install_wait_ms), |e| {
                    matches!(e, Event::Note { what } if what.starts_with("the snapshot install crashes"))
                })
                .await;
            crate::observe::crash_at_next_install(false);
            if !crashed {
                return format!(
                    "no snapshot installed within {install_wait_ms} ms ({purged}); not crashed"
                );
            }
            // Every other replica was level, so the snapshot went to the wiped one.
            let stopped = id;
            // The process dies with its Raft: the core first (the install's request waits on it,
            // holding the service), then the rest, cut off as any crash.
            c.crash_replica_raft_first(stopped).await;
            tokio::time::sleep(time).await;
            match c.restart_replica(stopped).await {
                Ok(()) => format!("replica {stopped} crashed installing a snapshot and restarted"),
                Err(e) => {
                    c.recorder.record(Event::Note {
                        what: format!("RESTART FAILED: {e}"),
                    });
                    format!("replica {stopped} did not restart: {e}")
                }
            }
        }
        Fault::RestoreOldBackup | Fault::RestoreOnNewDisks => {
            let mut c = cluster.write().await;
            let Some(file) = c.backups.first().cloned() else {
                return "no backup was taken at setup; not restored".into();
            };
            let floor_files_kept = step.fault == Fault::RestoreOldBackup;
            note(
                &c,
                i,
                step.fault,
                format!(
                    "every replica from {} (floor files {})",
                    file.display(),
                    if floor_files_kept { "kept" } else { "lost too" }
                ),
            );
            c.stop_replicas().await;
            let mut floors = Vec::new();
            for id in 1..=replicas_n {
                match c.restore_replica(id, &file, !floor_files_kept).await {
                    Ok(floor) => floors.push((id, floor)),
                    Err(e) => {
                        c.recorder.record(Event::Note {
                            what: format!("RESTORE FAILED: replica {id}: {e}"),
                        });
                    }
                }
            }
            c.recorder.record(Event::Restored {
                floors: floors.clone(),
                floor_files_kept,
            });
            for id in 1..=replicas_n {
                if let Err(e) = c.restart_replica(id).await {
                    c.recorder.record(Event::Note {
                        what: format!("RESTART FAILED: {e}"),
                    });
                }
            }
            tokio::time::sleep(time).await;
            format!("restored, term floors {floors:?}")
        }
        Fault::CrashLeaderMidPush => {
            let (leader, from) = {
                let c = cluster.read().await;
                let leader = target(&c, step.pick);
                note(
                    &c,
                    i,
                    step.fault,
                    format!("replica {leader} at its next envelope write"),
                );
                (leader, c.recorder.now())
            };
            crate::observe::crash_at_next_write(Some(leader));
            let recorder = cluster.read().await.recorder.clone();
            let crashed = recorder
                .wait_for(
                    from,
                    Duration::from_millis(mid_push_wait_ms),
                    |e| matches!(e, Event::WriteAllowed { replica, .. } if *replica == leader),
                )
                .await;
            crate::observe::crash_at_next_write(None);
            if !crashed {
                return format!(
                    "no envelope write by replica {leader} within {mid_push_wait_ms} ms; not crashed"
                );
            }
            let mut c = cluster.write().await;
            c.crash_replica(leader).await;
            wait_deposed(&c, leader, from).await;
            tokio::time::sleep(time).await;
            match c.restart_replica(leader).await {
                Ok(()) => format!("replica {leader} crashed mid-push and restarted"),
                Err(e) => {
                    c.recorder.record(Event::Note {
                        what: format!("RESTART FAILED: {e}"),
                    });
                    format!("replica {leader} did not restart: {e}")
                }
            }
        }
        Fault::DuplicateEnvelopes => {
            let c = cluster.read().await;
            let count = rng.between(1, 4);
            note(
                &c,
                i,
                step.fault,
                format!("the next {count} envelopes from each replica to each host, twice"),
            );
            let arm = |count: u64| {
                for r in c.replicas.values() {
                    for h in c.hosts.values() {
                        r.service()
                            .endpoint()
                            .faults()
                            .duplicate_next(h.addr, count);
                    }
                }
            };
            let duplicated = |c: &Cluster| -> u64 {
                c.replicas
                    .values()
                    .map(|r| r.service().endpoint().faults().duplicated())
                    .sum()
            };
            let before = duplicated(&c);
            arm(count);
            tokio::time::sleep(time).await;
            arm(0);
            format!("{} envelopes delivered twice", duplicated(&c) - before)
        }
        Fault::HostileFlood
        | Fault::HostileOversized
        | Fault::HostileReplay
        | Fault::HostileContradict
        | Fault::HostileReplica => play_hostile(cluster, i, step, time, &mut rng).await,
        Fault::CrashHost => {
            let mut c = cluster.write().await;
            let m = machines[rng.below(machines.len() as u64) as usize];
            note(&c, i, step.fault, format!("host {m}"));
            c.stop_host(m).await;
            tokio::time::sleep(time).await;
            match c.restart_host(m).await {
                Ok(()) => format!("host {m} restarted"),
                Err(e) => {
                    c.recorder.record(Event::Note {
                        what: format!("RESTART FAILED: {e}"),
                    });
                    format!("host {m} did not restart: {e}")
                }
            }
        }
    }
}

/// One step of the hostile peer against the leader now (the Raft calls against the replicas whose
/// certificate it does not hold); records what it sent that must be refused and how much was taken.
async fn play_hostile(
    cluster: &Arc<RwLock<Cluster>>,
    i: usize,
    step: &Step,
    time: Duration,
    rng: &mut Rng,
) -> String {
    let c = cluster.read().await;
    let leader = target(&c, step.pick);
    let to = c.addrs[&leader];
    let term = c
        .replicas
        .get(&leader)
        .map(|r| r.service().replica().metrics().borrow().current_term)
        .unwrap_or(1);
    let hostile = c.hostile.clone();
    // Another host's last report, to replay as another machine's and to lend its proof.
    let stolen = machines
        .iter()
        .filter_map(|m| c.hosts.get(*m))
        .find_map(|h| h.faults.last_report());
    note(
        &c,
        i,
        step.fault,
        format!("against replica {leader} (term {term})"),
    );
    let sent = match step.fault {
        Fault::HostileFlood => hostile.flood(to, time, rng).await,
        Fault::HostileOversized => hostile.oversized(to, time, rng).await,
        Fault::HostileReplay => hostile.replay(to, time, stolen).await,
        Fault::HostileContradict => hostile.contradict(to, term, time, stolen).await,
        _ => {
            let targets: Vec<(u64, std::net::SocketAddr)> = c
                .addrs
                .iter()
                .filter(|(id, _)| **id != crate::hostile::hostile_replica_id)
                .map(|(id, a)| (*id, *a))
                .collect();
            let timings = match crate::bed::raft_settings().validate() {
                Ok(config) => config.timings(),
                Err(e) => return format!("the run's Raft settings are invalid: {e}"),
            };
            hostile.replica_calls(targets, term, timings, time).await
        }
    };
    let example = sent
        .example
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .clone();
    c.recorder.record(Event::HostileSent {
        fault: step.fault.name().into(),
        sent: sent.forged.load(Ordering::SeqCst),
        taken: sent.taken.load(Ordering::SeqCst),
        example,
    });
    sent.summary()
}
