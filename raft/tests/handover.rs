//! A leader that stops hands its leadership to a follower with its whole log (issue 12, decision
//! 0152): a new leader exists at once, in the next term, and has every committed entry.

mod support;

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use mesh_raft::HandoverError;

use support::{Cluster, fast_settings};

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
