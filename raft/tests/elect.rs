//! mesh's own election timer (decision 0328) against a three-replica cluster over the router: a
//! campaign starts only through a vote openraft grants once its vote lease of the leader ended.

mod support;

use std::collections::BTreeSet;

use mesh_raft::Vote;
use mesh_raft::elect::{answer_vote, campaign_unless_heard};
use openraft::raft::VoteRequest;

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

/// Makes the two followers' logs unequal, then loses the leader. `short`, the follower whose slice
/// of the campaign window comes first (the lower id), stops hearing the leader; one write commits
/// on the leader and `long`. With `short_campaigns`, `short` campaigns (refused: the others keep
/// the leader's vote lease) until its term is well above the leader's, as a replica cut off for a
/// while. Then the leader is cut off from both. Answers `[short, long]` and the leader's term.
async fn unequal_logs_then_leader_lost(
    cluster: &Cluster,
    short_campaigns: bool,
) -> ([u64; 2], u64) {
    let all: BTreeSet<u64> = cluster.running();
    let (leader, term) = cluster.wait_leader(&all, 0).await;
    let followers: Vec<u64> = all.iter().copied().filter(|id| *id != leader).collect();
    let (short, long) = (followers[0], followers[1]);
    cluster.router.cut(leader, short);
    let written = cluster.set(leader, "k", "v").await;
    cluster.wait_applied(long, written.index()).await;
    if short_campaigns {
        let deadline = tokio::time::Instant::now() + wait_deadline;
        let mut metrics = cluster.replica(short).metrics();
        while metrics.borrow_and_update().current_term < term + 4 {
            assert!(
                tokio::time::Instant::now() < deadline,
                "replica {short} never campaigned without its leader"
            );
            let _ = tokio::time::timeout(cluster.config.heartbeat(), metrics.changed()).await;
        }
    }
    cluster.router.isolate(leader);
    let (s, l) = (cluster.metrics(short), cluster.metrics(long));
    assert!(
        s.last_log_index < l.last_log_index,
        "the logs are not unequal: {short} has {:?}, {long} {:?}",
        s.last_log_index,
        l.last_log_index
    );
    ([short, long], term)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn survivors_with_unequal_logs_elect_the_longer_one() {
    // Liveness (decisions 0328, 0336; bed_faults' cut-off leader test, 2026-12-06): the survivor
    // with the shorter log campaigns first and the longer one refuses it without taking its term;
    // the longer one must still win within the deadline, not campaign again and again in a term
    // the shorter one already voted in for itself.
    let mut cluster = Cluster::start(3, fast_settings(), 0).await;
    let ([short, long], term) = unequal_logs_then_leader_lost(&cluster, false).await;
    let (new, _) = cluster
        .wait_leader(&BTreeSet::from([short, long]), term)
        .await;
    assert_eq!(new, long, "only the longer log can win");
    cluster.stop_all().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn survivors_with_unequal_logs_elect_the_longer_one_after_the_shorter_campaigned_alone() {
    // Liveness (decisions 0328, 0336): as above, the shorter one having campaigned alone for a
    // while first, so its term is far above the longer one's when the leader goes.
    let mut cluster = Cluster::start(3, fast_settings(), 0).await;
    let ([short, long], term) = unequal_logs_then_leader_lost(&cluster, true).await;
    let (new, _) = cluster
        .wait_leader(&BTreeSet::from([short, long]), term)
        .await;
    assert_eq!(new, long, "only the longer log can win");
    cluster.stop_all().await;
}

/// Hands replica `to` a vote request from `candidate` for `term` with no log at all, shorter than
/// any, through the receive path ([`answer_vote`]); answers whether it was granted.
async fn ask_with_no_log(cluster: &Cluster, to: u64, candidate: u64, term: u64) -> bool {
    let request = VoteRequest::new(Vote::new(term, candidate), None);
    answer_vote(cluster.replica(to).raft(), request, None)
        .await
        .expect("raft runs")
        .vote_granted
}

/// Asks `to` for a vote of a shorter candidate in a term above the leader's, every heartbeat for
/// twice the vote lease; fails unless `to` keeps `leader` and `term` throughout.
async fn keeps_leader_while_shorter_candidates_ask(
    cluster: &Cluster,
    to: u64,
    candidate: u64,
    leader: u64,
    term: u64,
) {
    let until = tokio::time::Instant::now() + cluster.config.vote_lease() * 2;
    while tokio::time::Instant::now() < until {
        let granted = ask_with_no_log(cluster, to, candidate, term + 3).await;
        let m = cluster.metrics(to);
        assert!(!granted, "replica {to} voted for a candidate with no log");
        assert_eq!(
            (m.current_term, m.current_leader),
            (term, Some(leader)),
            "replica {to} left leader {leader}'s term {term} for a shorter candidate's"
        );
        tokio::time::sleep(cluster.config.heartbeat()).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn g3_a_follower_within_its_vote_lease_does_not_take_a_shorter_candidates_term() {
    // G3 (decisions 0030, 0328, 0336): a follower that refuses a shorter candidate takes its term
    // only through a vote openraft grants once the vote lease of its leader ended; a follower that
    // keeps hearing its leader keeps its term and its leader however often one asks.
    let mut cluster = Cluster::start(3, fast_settings(), 0).await;
    let all: BTreeSet<u64> = cluster.running();
    let (leader, term) = cluster.wait_leader(&all, 0).await;
    let written = cluster.set(leader, "k", "v").await;
    let followers: Vec<u64> = all.iter().copied().filter(|id| *id != leader).collect();
    cluster.wait_applied(followers[0], written.index()).await;
    keeps_leader_while_shorter_candidates_ask(&cluster, followers[0], followers[1], leader, term)
        .await;
    cluster.stop_all().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_does_not_take_a_shorter_candidates_term() {
    // No spurious election (issue 26 item 3, decision 0336): a leader's own vote is not touched
    // by its heartbeats, so openraft would grant it a vote naming no one once its vote lease from
    // the election ended and it would step down; a shorter candidate coming back from a partition
    // with a higher term must not depose a leader that way.
    let mut cluster = Cluster::start(3, fast_settings(), 0).await;
    let all: BTreeSet<u64> = cluster.running();
    let (leader, term) = cluster.wait_leader(&all, 0).await;
    let written = cluster.set(leader, "k", "v").await;
    let follower = *all.iter().find(|id| **id != leader).expect("a follower");
    keeps_leader_while_shorter_candidates_ask(&cluster, leader, follower, leader, term).await;
    cluster.wait_applied(follower, written.index()).await;
    cluster.stop_all().await;
}
