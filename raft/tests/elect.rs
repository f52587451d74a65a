//! mesh's own election timer (decision 0328) against a three-replica cluster over the router: a
//! campaign starts only through a vote openraft grants once its vote lease of the leader ended.

mod support;

use std::collections::BTreeSet;

use mesh_raft::elect::campaign_unless_heard;

use support::{Cluster, fast_settings, wait_deadline};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn g3_a_follower_that_heard_its_leader_within_the_vote_lease_does_not_campaign() {
    // G3 (decisions 0030, 0328): the timer reads when the follower last heard its leader, then
    // campaigns; a heartbeat accepted between the two (here: every heartbeat since a stale read)
    // must stop the campaign, or a follower that acknowledged the leader's lease round would
    // campaign at once and, with a third replica whose vote lease ended, elect a second leader
    // while the lease is open.
    let mut cluster = Cluster::start(3, fast_settings(), 0).await;
    let all: BTreeSet<u64> = cluster.running();
    let (leader, term) = cluster.wait_leader(&all, 0).await;
    let follower = *all.iter().find(|id| **id != leader).expect("a follower");
    let raft = cluster.replica(follower).raft().clone();
    let stale = raft
        .with_raft_state(|s| *s.vote_ref())
        .await
        .expect("raft runs");
    // A write the follower applies: it accepted the leader's entries just now, well within its
    // vote lease, and heartbeats keep coming.
    let written = cluster.set(leader, "k", "v").await;
    cluster.wait_applied(follower, written.index()).await;
    let campaign = campaign_unless_heard(&raft, follower, &stale, None)
        .await
        .expect("raft runs");
    assert_eq!(
        campaign, None,
        "replica {follower} campaigned while it kept leader {leader}'s vote lease"
    );
    let after = cluster.metrics(follower);
    assert_eq!(after.current_term, term, "the follower's term moved");
    assert_eq!(after.current_leader, Some(leader));

    // Cut off from its leader, the same follower campaigns once the vote lease has ended, in the
    // term two above (the no-one vote takes one), and a leader is elected among the two others.
    cluster.router.isolate(leader);
    let deadline = tokio::time::Instant::now() + wait_deadline;
    let campaigned = loop {
        let seen = raft
            .with_raft_state(|s| *s.vote_ref())
            .await
            .expect("raft runs");
        if let Some(campaigned) = campaign_unless_heard(&raft, follower, &seen, None)
            .await
            .expect("raft runs")
        {
            break campaigned;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "replica {follower} never campaigned without its leader"
        );
        tokio::time::sleep(cluster.config.heartbeat()).await;
    };
    assert!(
        campaigned >= term + 2,
        "campaign in {campaigned}, term was {term}"
    );
    let others: BTreeSet<u64> = all.iter().copied().filter(|id| *id != leader).collect();
    cluster.wait_leader(&others, term).await;
    cluster.stop_all().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_killed_is_followed_by_one_elected_among_the_survivors() {
    // Liveness (decision 0328): with openraft's own timer off, mesh's timer alone elects the next
    // leader, and again after that one goes too (each election draws a fresh timeout).
    let mut cluster = Cluster::start(3, fast_settings(), 0).await;
    let all: BTreeSet<u64> = cluster.running();
    let (first, term) = cluster.wait_leader(&all, 0).await;
    cluster.stop(first).await;
    let survivors = cluster.running();
    let (second, term2) = cluster.wait_leader(&survivors, term).await;
    cluster.start_replica(first, true, 0).await;
    let written = cluster.set(second, "k", "v").await;
    cluster.wait_applied(first, written.index()).await;
    cluster.stop(second).await;
    let survivors = cluster.running();
    let (third, _) = cluster.wait_leader(&survivors, term2).await;
    assert_ne!(third, second);
    cluster.stop_all().await;
}
