//! A leader that stops hands its leadership to a follower with its whole log (issue 12, decision
//! 0152): a new leader exists at once, in the next term, and has every committed entry.

mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use mesh_raft::{Clock, Gate, HandoverError, TestClock, VoteFence};
use openraft::ServerState;

use support::{Cluster, fast_settings, wait_deadline};

fn all() -> BTreeSet<u64> {
    (1..=3).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopping_leader_hands_over_to_an_up_to_date_follower() {
    // Availability (issue 12): no election timeout is waited out when a leader stops on purpose;
    // G4: the taker has every committed entry, so nothing acknowledged is lost.
    let mut cluster = Cluster::start(3, fast_settings(), 0).await;
    let (leader, term) = cluster.wait_leader(&all(), 0).await;
    let written = cluster.set(leader, "k", "v").await;
    let router = cluster.router.clone();
    let started = Instant::now();
    let handed = {
        let cluster = &cluster;
        cluster
            .replica(leader)
            .hand_over(None, Duration::from_secs(5), |to| {
                let raft = cluster.replica(to).raft().clone();
                async move { raft.trigger().elect().await.map_err(|e| e.to_string()) }
            })
            .await
            .expect("handed over")
    };
    println!(
        "{handed} {} ms after the leader began to hand over",
        started.elapsed().as_millis()
    );
    assert_ne!(handed.to, leader);
    assert!(handed.term > term);
    let m = cluster.metrics(handed.to);
    assert_eq!(m.current_leader, Some(handed.to));
    router.remove(leader);
    cluster.stop(leader).await;
    let after = cluster.set(handed.to, "after", "w").await;
    assert!(after.term() > term);
    assert_eq!(cluster.read(handed.to, "k").as_deref(), Some("v"));
    assert!(after.index() > written.index());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_has_no_leadership_to_hand_over() {
    // A follower's stop changes nothing for the cluster.
    let cluster = Cluster::start(3, fast_settings(), 0).await;
    let (leader, term) = cluster.wait_leader(&all(), 0).await;
    let follower = all()
        .into_iter()
        .find(|id| *id != leader)
        .expect("follower");
    let refused = cluster
        .replica(follower)
        .hand_over(None, Duration::from_secs(1), |_| async { Ok(()) })
        .await;
    assert_eq!(refused, Err(HandoverError::NotLeader { id: follower }));
    let m = cluster.metrics(leader);
    assert_eq!((m.current_leader, m.current_term), (Some(leader), term));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn g3_a_leader_handing_over_waits_for_its_act_in_flight_and_not_for_its_lease() {
    // Decision 0225. G3: while an act of the old lease may still write (an envelope past its
    // gate), no other replica may be told to campaign or be granted the old leader's vote. And
    // once no act is in flight, the handover goes on without waiting out the lease: the fences
    // run on a clock that never moves, so the lease never ends by itself here.
    let cluster = Cluster::start(3, fast_settings(), 0).await;
    let (leader, term) = cluster.wait_leader(&all(), 0).await;
    let clock: Arc<dyn Clock> = Arc::new(TestClock::new());
    let mut fences = BTreeMap::new();
    for id in all() {
        let fence = Arc::new(VoteFence::new(clock.clone()));
        cluster
            .router
            .add_fenced(id, cluster.replica(id).raft().clone(), fence.clone());
        fences.insert(id, fence);
    }
    cluster.set(leader, "k", "v").await;
    let fence = fences[&leader].clone();
    let deadline = tokio::time::Instant::now() + wait_deadline;
    while Gate::acquire_fenced(
        cluster.replica(leader).raft(),
        clock.as_ref(),
        &cluster.config,
        &fence,
    )
    .await
    .is_err()
    {
        assert!(
            tokio::time::Instant::now() < deadline,
            "no lease on {leader}"
        );
    }
    let act = fence.begin_act().expect("an act begins under the lease");
    let released = AtomicBool::new(false);
    let told_while_acting = AtomicBool::new(false);
    let heartbeat = Duration::from_millis(fast_settings().heartbeat_ms);
    let handing = cluster
        .replica(leader)
        .hand_over(Some(&fence), wait_deadline, |to| {
            if !released.load(Ordering::SeqCst) {
                told_while_acting.store(true, Ordering::SeqCst);
            }
            let raft = cluster.replica(to).raft().clone();
            async move { raft.trigger().elect().await.map_err(|e| e.to_string()) }
        });
    let holding = async {
        let mut metrics = cluster.replica(leader).metrics();
        // The watch's borrow is dropped at once: held, it would block openraft's metrics.
        let stepped = tokio::time::timeout(
            wait_deadline,
            metrics.wait_for(|m| m.state != ServerState::Leader),
        )
        .await
        .is_ok_and(|r| r.is_ok());
        assert!(stepped, "the leader steps down while its act is in flight");
        // Ten heartbeats with the act in flight: nobody is told, nobody else leads.
        for _ in 0..10 {
            tokio::time::sleep(heartbeat).await;
            assert!(!told_while_acting.load(Ordering::SeqCst));
            assert!(
                fence.is_open(),
                "the fence holds while the act is in flight"
            );
            for id in all().into_iter().filter(|id| *id != leader) {
                let m = cluster.metrics(id);
                assert!(
                    !(m.state == ServerState::Leader && m.current_term > term),
                    "replica {id} leads in term {} while the old lease's act is in flight",
                    m.current_term
                );
            }
        }
        released.store(true, Ordering::SeqCst);
        act.end();
    };
    let (handed, ()) = tokio::join!(handing, holding);
    let handed = handed.expect("handed over once the act ended");
    assert!(
        !told_while_acting.load(Ordering::SeqCst),
        "the taker was told to campaign while an act of the old lease was in flight"
    );
    assert!(handed.to != leader && handed.term > term);
    assert_eq!(cluster.metrics(handed.to).current_leader, Some(handed.to));
    assert_eq!(cluster.read(handed.to, "k").as_deref(), Some("v"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_stopped_right_after_its_election_hands_over_while_entries_still_commit() {
    // Decision 0225: a leader stopped right after its election waits out openraft's own vote
    // lease before it can step down, and entries still commit meanwhile (a stopping leader files
    // reports). It must vote with the taker's log as it is then, not as it was when it began: a
    // stale one is refused until the deadline and the handover fails.
    let cluster = Cluster::start(3, fast_settings(), 0).await;
    let (leader, term) = cluster.wait_leader(&all(), 0).await;
    let done = AtomicBool::new(false);
    let writing = async {
        let mut written = 0u64;
        while !done.load(Ordering::SeqCst) {
            let command = mesh_raft::kv::Set {
                key: format!("w{written}"),
                value: b"v".to_vec(),
            }
            .encode()
            .expect("encode");
            if cluster.replica(leader).propose(command).await.is_err() {
                break;
            }
            written += 1;
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        written
    };
    let handing = async {
        let handed = cluster
            .replica(leader)
            .hand_over(None, wait_deadline, |to| {
                let raft = cluster.replica(to).raft().clone();
                async move { raft.trigger().elect().await.map_err(|e| e.to_string()) }
            })
            .await;
        done.store(true, Ordering::SeqCst);
        handed
    };
    let (handed, written) = tokio::join!(handing, writing);
    let handed = handed.expect("handed over although entries committed while it waited");
    assert!(
        written > 0,
        "entries committed while the leader handed over"
    );
    assert!(handed.to != leader && handed.term > term);
    assert_eq!(cluster.metrics(handed.to).current_leader, Some(handed.to));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_whose_handover_failed_leaves_no_vote_that_stalls_the_next_leader_when_it_restarts()
 {
    // Availability (chaos pass D, processes seed 1033): a leader stopping while cut off steps
    // down for each taker in turn and cannot tell any (terms T+1 and T+2), then stops with its
    // last step-down vote on disk. The last taker wins T+1 on its own. When the old leader comes
    // back, the new leader learns its vote of T+2. Had that vote named the new leader, openraft
    // would count it as "still leading" (its vote, uncommitted) and keep the old term's
    // leadership: no election timer, nothing committed, for good. A step-down vote names no one,
    // so the new leader steps down and the cluster elects and commits again.
    let mut cluster = Cluster::start(3, fast_settings(), 0).await;
    let (old, term) = cluster.wait_leader(&all(), 0).await;
    let written = cluster.set(old, "k", "v").await;
    let followers: Vec<u64> = all().into_iter().filter(|id| *id != old).collect();
    // Both followers are takers (their replicated log matches): the handover tries them in id
    // order, one term higher each.
    let deadline = tokio::time::Instant::now() + wait_deadline;
    loop {
        let m = cluster.metrics(old);
        let matched = m
            .replication
            .iter()
            .flatten()
            .filter(|(id, l)| **id != old && l.is_some_and(|l| l.index >= written.index()))
            .count();
        if matched == followers.len() {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the followers did not match index {}",
            written.index()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    for f in &followers {
        cluster.replica(*f).raft().runtime_config().elect(false);
    }
    cluster.router.isolate(old);
    let failed = cluster
        .replica(old)
        .hand_over(None, wait_deadline, |to| async move {
            Err(format!("replica {to} cannot be told: cut off"))
        })
        .await;
    assert!(
        matches!(failed, Err(HandoverError::NoTaker { .. })),
        "the handover fails: {failed:?}"
    );
    cluster.stop(old).await;
    // Only the last taker's election timer runs: it campaigns once its timeout passed since the
    // old leader's last heartbeat, when the other follower's lease of the old leader has ended
    // too, and wins the next term.
    let taker = *followers.last().expect("two followers");
    cluster.replica(taker).raft().runtime_config().elect(true);
    let others: BTreeSet<u64> = followers.iter().copied().collect();
    let (_, new_term) = cluster.wait_leader(&others, term).await;
    for f in &followers {
        cluster.replica(*f).raft().runtime_config().elect(true);
    }
    // The old leader hears from the new one before its own election timeout (as on a live
    // network; here openraft's back-off towards a replica that was gone could lose that race).
    cluster.start_replica(old, true, 0).await;
    cluster.replica(old).raft().runtime_config().elect(false);
    cluster.router.rejoin(old);
    // A write commits within the deadline, through whichever replica leads then, and the old
    // leader applies it too (a write may commit on the other two before the new leader hears of
    // the old one's vote: it is the next ones that stall).
    let command = mesh_raft::kv::Set {
        key: "after".into(),
        value: b"w".to_vec(),
    }
    .encode()
    .expect("encode");
    let deadline = tokio::time::Instant::now() + wait_deadline;
    let committed = loop {
        let leaders: Vec<u64> = all()
            .into_iter()
            .filter(|id| cluster.metrics(*id).state == ServerState::Leader)
            .collect();
        let mut done = None;
        for id in leaders {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            if let Ok(Ok(p)) =
                tokio::time::timeout(left, cluster.replica(id).propose(command.clone())).await
            {
                done = Some(p);
                break;
            }
        }
        if let Some(p) = done {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            let applied = cluster
                .replica(old)
                .raft()
                .wait(Some(left.min(Duration::from_secs(2))))
                .applied_index_at_least(Some(p.index()), "the old leader applies the write")
                .await;
            if applied.is_ok() {
                break p;
            }
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no write committed and reached the rejoined old leader within {wait_deadline:?} (new leader's term {new_term}): {:?}",
            all()
                .into_iter()
                .map(|id| {
                    let m = cluster.metrics(id);
                    (id, m.state, m.current_term, m.vote, m.last_applied)
                })
                .collect::<Vec<_>>()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert!(committed.index() > written.index());
}
