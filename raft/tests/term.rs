//! The term floor at run time (G9, decision 0151): a leader told of an epoch above its term moves
//! the cluster to a term above it without any restart, and a follower cannot do so behind its
//! leader's back.

mod support;

use std::collections::BTreeSet;

use mesh_raft::{RaiseTermError, TermRaised};

use support::{Cluster, fast_settings};

fn all() -> BTreeSet<u64> {
    (1..=3).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn g9_a_leader_raised_above_an_epoch_leaves_the_cluster_leading_above_it() {
    // G9: after `raise_term_above(epoch)` the cluster has a leader in a term above the epoch that
    // commits, and every replica applies what it commits — nothing restarted.
    let cluster = Cluster::start(3, fast_settings(), 0).await;
    let (leader, term) = cluster.wait_leader(&all(), 0).await;
    let before = cluster.set(leader, "before", "1").await;
    let epoch = term + 5;
    let started = std::time::Instant::now();
    let raised = cluster
        .replica(leader)
        .raise_term_above(epoch)
        .await
        .expect("the leader leaves its term");
    assert!(
        matches!(raised, TermRaised::Campaigning { from, campaign } if from == term && campaign > epoch),
        "{raised:?}"
    );
    let (now, now_term) = cluster.wait_leader(&all(), epoch).await;
    println!(
        "leader {now} in term {now_term} (above epoch {epoch}) {} ms after the raise",
        started.elapsed().as_millis()
    );
    let after = cluster.set(now, "after", "2").await;
    assert!(after.term() > epoch, "committed in term {}", after.term());
    for id in all() {
        cluster.wait_applied(id, after.index()).await;
        assert_eq!(cluster.read(id, "before").as_deref(), Some("1"));
        assert_eq!(cluster.read(id, "after").as_deref(), Some("2"));
        assert!(cluster.metrics(id).current_term > epoch);
    }
    assert!(after.index() > before.index());
    // Raising again to an epoch already below the term changes nothing.
    let again = cluster.replica(now).raise_term_above(epoch).await;
    assert_eq!(again, Ok(TermRaised::Already { term: now_term }));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn g9_a_follower_cannot_raise_its_term_while_its_leader_lives() {
    // G3/G9: a follower keeps its leader's lease; raising its term would depose a live leader, so
    // openraft refuses and the follower says so.
    let cluster = Cluster::start(3, fast_settings(), 0).await;
    let (leader, term) = cluster.wait_leader(&all(), 0).await;
    let follower = all()
        .into_iter()
        .find(|id| *id != leader)
        .expect("follower");
    // Once a heartbeat carried the leader's committed vote, the follower keeps the leader's lease.
    cluster
        .replica(follower)
        .raft()
        .wait(Some(support::wait_deadline))
        .metrics(
            |m| m.vote.is_committed(),
            "the follower holds a committed vote",
        )
        .await
        .expect("the follower hears the leader");
    let refused = cluster.replica(follower).raise_term_above(term + 5).await;
    assert!(
        matches!(refused, Err(RaiseTermError::Refused { .. })),
        "{refused:?}"
    );
    let m = cluster.metrics(leader);
    assert_eq!((m.current_leader, m.current_term), (Some(leader), term));
}
