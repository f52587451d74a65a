//! The lease gate (G3) against a real three-replica cluster over the router.

mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use mesh_raft::{
    BootClock, Clock, Gate, GateError, Lease, MonotonicClock, RaftConfig, TestClock, VoteFence,
};

use support::{Cluster, fast_settings, wait_deadline};

/// Acquires a lease on `leader`, retrying while a noisy machine makes a round fail.
async fn acquire(cluster: &Cluster, leader: u64, clock: &dyn Clock) -> Lease {
    let deadline = tokio::time::Instant::now() + wait_deadline;
    loop {
        match Gate::acquire(cluster.replica(leader).raft(), clock, &cluster.config).await {
            Ok(lease) => return lease,
            Err(e) => assert!(
                tokio::time::Instant::now() < deadline,
                "no lease on {leader}: {e}"
            ),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gate_closes_on_an_isolated_leader_before_a_new_leader_is_elected() {
    // G3: once the leader is cut off, its lease is closed by the time any other replica leads.
    let cluster = Cluster::start(3, fast_settings(), 0).await;
    let (leader, _) = cluster.wait_leader(&(1..=3).collect(), 0).await;
    cluster.set(leader, "k", "v").await;
    let clock = MonotonicClock;
    let lease = acquire(&cluster, leader, &clock).await;
    cluster.router.isolate(leader);
    let others: BTreeSet<u64> = (1..=3).filter(|id| *id != leader).collect();
    let (_new, new_term) = cluster.wait_leader(&others, lease.term()).await;
    let observed = clock.now();
    assert!(
        !lease.is_open(observed),
        "lease of term {} still open when term {new_term} has a leader",
        lease.term()
    );
    assert!(matches!(
        lease.check(observed),
        Err(GateError::LeaseClosed { .. })
    ));
    let again = Gate::acquire(cluster.replica(leader).raft(), &clock, &cluster.config).await;
    assert!(again.is_err(), "an isolated leader gets no new lease");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gate_refuses_a_follower_naming_the_leader() {
    // G3: only the leader of the current term can hold a lease.
    let cluster = Cluster::start(3, fast_settings(), 0).await;
    let (leader, _) = cluster.wait_leader(&(1..=3).collect(), 0).await;
    cluster.set(leader, "k", "v").await;
    let follower = (1..=3).find(|id| *id != leader).expect("a follower");
    cluster
        .replica(follower)
        .raft()
        .wait(Some(wait_deadline))
        .current_leader(leader, "follower knows the leader")
        .await
        .expect("follower learns the leader");
    let err = Gate::acquire(
        cluster.replica(follower).raft(),
        &MonotonicClock,
        &cluster.config,
    )
    .await
    .expect_err("a follower gets no lease");
    assert_eq!(
        err,
        GateError::NotLeader {
            leader: Some(leader)
        }
    );
}

/// A clock that moves forward a step every time it is read.
struct SteppingClock {
    now: Mutex<Instant>,
    step: Duration,
}

impl Clock for SteppingClock {
    fn now(&self) -> Instant {
        let mut now = self.now.lock().expect("clock lock");
        let read = *now;
        *now += self.step;
        read
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lease_is_measured_from_before_the_quorum_round() {
    // G3: the lease runs from the instant before the confirming round, never from a later reading.
    let cluster = Cluster::start(3, fast_settings(), 0).await;
    let (leader, _) = cluster.wait_leader(&(1..=3).collect(), 0).await;
    cluster.set(leader, "k", "v").await;
    let t0 = Instant::now();
    let clock = SteppingClock {
        now: Mutex::new(t0),
        step: Duration::from_millis(100),
    };
    let lease = Gate::acquire(cluster.replica(leader).raft(), &clock, &cluster.config)
        .await
        .expect("leader gets a lease");
    assert_eq!(lease.started(), t0, "start is the first clock reading");
    assert_eq!(lease.valid_until(), t0 + cluster.config.lease_window());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lease_closes_when_the_clock_reaches_its_window() {
    // G3: `now − start < election_timeout_min − margin` is the whole of the lease.
    let cluster = Cluster::start(1, fast_settings(), 0).await;
    let (leader, term) = cluster.wait_leader(&[1].into_iter().collect(), 0).await;
    let clock = TestClock::new();
    let lease = Gate::acquire(cluster.replica(leader).raft(), &clock, &cluster.config)
        .await
        .expect("single replica leads");
    assert_eq!(lease.term(), term);
    let window = cluster.config.lease_window();
    assert_eq!(
        window,
        Duration::from_millis(
            fast_settings().election_timeout_min_ms - fast_settings().lease_margin_ms
        )
    );
    assert_eq!(lease.check(clock.now()), Ok(window));
    clock.advance(window - Duration::from_millis(1));
    assert!(lease.is_open(clock.now()));
    clock.advance(Duration::from_millis(1));
    assert!(!lease.is_open(clock.now()));
    assert_eq!(
        lease.check(clock.now()),
        Err(GateError::LeaseClosed {
            term,
            closed_for_ms: 0
        })
    );
}

#[test]
fn default_lease_window_is_election_timeout_min_minus_margin() {
    // G3: with the defaults, the lease lasts 400 − 100 = 300 ms (decision 0110).
    assert_eq!(
        RaftConfig::default().lease_window(),
        Duration::from_millis(300)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leader_with_an_open_lease_grants_no_vote_to_a_follower_it_cannot_reach() {
    // G3, decision 0071: a leader that has led longer than openraft's own vote lease, and whose
    // messages to one follower are lost, must not hand that follower its vote while its lease is
    // open — the follower's quorum {follower, old leader} would hold a lease beside the old one.
    let cluster = Cluster::start(3, fast_settings(), 0).await;
    let all: BTreeSet<u64> = (1..=3).collect();
    let (leader, term) = cluster.wait_leader(&all, 0).await;
    let clock: Arc<dyn Clock> = Arc::new(MonotonicClock);
    let mut fences = BTreeMap::new();
    for id in 1..=3 {
        let fence = Arc::new(VoteFence::new(clock.clone()));
        cluster
            .router
            .add_fenced(id, cluster.replica(id).raft().clone(), fence.clone());
        fences.insert(id, fence);
    }
    cluster.set(leader, "k", "v").await;
    // The scenario needs the leader's own vote lease (election_timeout_max) to have run out.
    tokio::time::sleep(Duration::from_millis(
        fast_settings().election_timeout_max_ms * 2,
    ))
    .await;
    let follower = (1..=3).find(|id| *id != leader).expect("a follower");
    cluster.router.drop_messages(leader, follower, 1000);

    let mut leases: Vec<Lease> = Vec::new();
    let watch_until = Instant::now() + Duration::from_secs(3);
    while Instant::now() < watch_until {
        if let Ok(lease) = Gate::acquire_fenced(
            cluster.replica(leader).raft(),
            clock.as_ref(),
            &cluster.config,
            &fences[&leader],
        )
        .await
        {
            leases.push(lease);
        }
        for other in all.iter().filter(|id| **id != leader) {
            let Ok(new) = Gate::acquire(
                cluster.replica(*other).raft(),
                clock.as_ref(),
                &cluster.config,
            )
            .await
            else {
                continue;
            };
            let overlapping: Vec<&Lease> =
                leases.iter().filter(|l| l.is_open(new.started())).collect();
            assert!(
                overlapping.is_empty(),
                "replica {other} got a lease in term {} while {} lease(s) of term {term} were open",
                new.term(),
                overlapping.len()
            );
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert!(
        !leases.is_empty(),
        "the leader kept its quorum through the third replica"
    );
    let follower_term = cluster.metrics(follower).current_term;
    assert!(
        follower_term > term,
        "the cut-off follower campaigned (term {follower_term}), so the fence was exercised"
    );
    cluster.router.heal();
}

/// Boot time for [`g3_a_suspend_closes_the_lease_though_the_monotonic_clock_stood_still`]: the
/// real boot time plus a jump the test sets, as a suspend adds to CLOCK_BOOTTIME alone.
static suspended_ms: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

fn boot_time_with_suspend() -> Option<Duration> {
    let t = nix::time::clock_gettime(nix::time::ClockId::CLOCK_BOOTTIME).ok()?;
    let real = Duration::new(t.tv_sec() as u64, t.tv_nsec() as u32);
    let jump = suspended_ms.load(std::sync::atomic::Ordering::SeqCst);
    Some(real + Duration::from_millis(jump))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn g3_a_suspend_closes_the_lease_though_the_monotonic_clock_stood_still() {
    // G3, "on a clock that counts suspend": the system sleeps for 10 s right after the lease is
    // confirmed. CLOCK_MONOTONIC (behind `Instant`) does not see it; the lease's clock does, and
    // the lease is closed on resume.
    let cluster = Cluster::start(1, fast_settings(), 0).await;
    let (leader, _) = cluster.wait_leader(&[1].into_iter().collect(), 0).await;
    let clock = BootClock::with_source(boot_time_with_suspend).expect("boot clock");
    let lease = Gate::acquire(cluster.replica(leader).raft(), &clock, &cluster.config)
        .await
        .expect("single replica leads");
    assert!(lease.is_open(clock.now()));
    let monotonic_before = std::time::Instant::now();
    suspended_ms.store(10_000, std::sync::atomic::Ordering::SeqCst);
    assert!(monotonic_before.elapsed() < cluster.config.lease_window());
    assert!(!lease.is_open(clock.now()), "the lease counts the suspend");
}

#[test]
fn the_boot_clock_reads_the_system_and_moves_forward() {
    // G3: the real boot-time clock is readable here and never goes back.
    let clock = BootClock::new().expect("CLOCK_BOOTTIME readable");
    let a = clock.now();
    std::thread::sleep(Duration::from_millis(5));
    let b = clock.now();
    assert!(b >= a + Duration::from_millis(5), "{a:?} {b:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn g3_once_acting_stopped_no_act_begins_and_the_fence_closes_when_the_last_act_ends() {
    // Decision 0225: a leader handing over ends its lease early. The fence may close before the
    // lease's end only when no act can write under it any more: none in flight, none to come.
    // The test clock never moves, so the lease itself never ends here.
    let cluster = Cluster::start(3, fast_settings(), 0).await;
    let all: BTreeSet<u64> = (1..=3).collect();
    let (leader, _term) = cluster.wait_leader(&all, 0).await;
    let clock: Arc<dyn Clock> = Arc::new(TestClock::new());
    let fence = VoteFence::new(clock.clone());
    let deadline = tokio::time::Instant::now() + wait_deadline;
    loop {
        let lease = Gate::acquire_fenced(
            cluster.replica(leader).raft(),
            clock.as_ref(),
            &cluster.config,
            &fence,
        )
        .await;
        if lease.is_ok() {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no lease: {lease:?}"
        );
    }
    let first = fence
        .begin_act()
        .expect("an act begins under an open lease");
    let resent = fence.act_slot();
    resent.begin().expect("a second act begins");
    assert_eq!(
        fence.stop_acting(),
        2,
        "two acts in flight when acting stops"
    );
    assert_eq!(fence.begin_act().err(), Some(GateError::StoppedActing));
    assert_eq!(
        Gate::acquire_fenced(
            cluster.replica(leader).raft(),
            clock.as_ref(),
            &cluster.config,
            &fence,
        )
        .await
        .err(),
        Some(GateError::StoppedActing),
        "no new lease once acting stopped"
    );
    // An act that began before the stop may still write: the fence holds until it ends.
    assert!(
        resent.begin().is_err(),
        "a slot that began refuses a resend"
    );
    assert!(fence.is_open(), "an act in flight keeps the fence");
    first.end();
    assert!(fence.is_open(), "one act still in flight keeps the fence");
    resent.end();
    assert!(
        !fence.is_open(),
        "no act in flight and none to come: closed"
    );
    assert!(
        fence
            .closed_by(tokio::time::Instant::now() + Duration::from_millis(1))
            .await
    );
}

#[test]
fn g3_an_act_dropped_mid_write_keeps_the_fence_until_the_lease_ends() {
    // Decision 0225: an act whose future was dropped before it ended may still have bytes on
    // their way (quinn finishes a dropped stream), so it does not let the fence lift early.
    let clock = Arc::new(TestClock::new());
    let fence = VoteFence::new(clock.clone());
    fence.hold(clock.now() + Duration::from_millis(300));
    let dropped = fence.act_slot();
    dropped.begin().expect("an act begins");
    let ended = fence.begin_act().expect("another act begins");
    assert_eq!(fence.act(|| 7), Ok(7), "a synchronous act runs and ends");
    fence.stop_acting();
    ended.end();
    drop(dropped);
    assert_eq!(fence.acting(), 0);
    assert!(
        fence.is_open(),
        "an abandoned act holds the fence to the lease's end"
    );
    clock.advance(Duration::from_millis(300));
    assert!(!fence.is_open(), "closed at the lease's end");
    assert_eq!(fence.act(|| 7), Err(GateError::StoppedActing));
}
