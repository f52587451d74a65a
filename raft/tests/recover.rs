//! Recovery from quorum loss (decision 0235) on the Raft layer: a survivor's store rewritten by
//! `force_new_cluster` starts as a one-member cluster with every entry it held, leads in the term
//! after the floor it was given, commits alone, and refuses Raft from the old members; the
//! refusals that change nothing (no store, not a voter, already alone).

mod support;

use std::collections::BTreeSet;

use mesh_raft::{RecoverError, force_new_cluster, inspect, outside_membership};

use support::{Cluster, addr, fast_settings};

fn all() -> BTreeSet<u64> {
    (1..=3).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn g9_a_survivor_recovered_alone_keeps_its_log_and_leads_above_the_floor() {
    let mut cluster = Cluster::start(3, fast_settings(), 0).await;
    let (leader, _) = cluster.wait_leader(&all(), 0).await;
    let written = cluster.set(leader, "kept", "1").await;
    let survivor = all().into_iter().find(|id| *id != leader).unwrap_or(1);
    cluster.wait_applied(survivor, written.index()).await;
    cluster.stop_all().await;

    let before = inspect(&cluster.dir(survivor)).await.expect("inspect");
    assert_eq!(before.voters(), vec![1, 2, 3]);
    assert!(before.raft_term() >= written.term(), "{before:?}");
    // A floor above every term the store holds: the vote goes there, the first term one above.
    let floor = before.raft_term() + 7;
    let recovered = force_new_cluster(survivor, &cluster.dir(survivor), addr(survivor), floor)
        .await
        .expect("recover");
    assert_eq!(recovered.term, floor);
    assert_eq!(
        recovered.membership_entry.index,
        before.last_log.map_or(0, |l| l.index + 1)
    );
    let after = inspect(&cluster.dir(survivor)).await.expect("inspect");
    assert_eq!(after.voters(), vec![survivor]);
    assert_eq!(after.vote_term, floor);

    // Started as the configs say (bootstrap of all three, ignored on a store that has one).
    cluster.start_replica(survivor, true, 0).await;
    let alone = BTreeSet::from([survivor]);
    let (now, now_term) = cluster.wait_leader(&alone, floor).await;
    assert_eq!((now, now_term), (survivor, floor + 1));
    let next = cluster.set(survivor, "after", "2").await;
    assert_eq!(next.term(), floor + 1);
    assert_eq!(cluster.read(survivor, "kept").as_deref(), Some("1"));
    assert_eq!(cluster.read(survivor, "after").as_deref(), Some("2"));
    let m = cluster.metrics(survivor);
    let voters: Vec<u64> = m.membership_config.membership().voter_ids().collect();
    assert_eq!(voters, vec![survivor]);

    // The old members are outside its membership: their Raft is refused, its own is not.
    let raft = cluster.replica(survivor).raft();
    for old in all().into_iter().filter(|id| *id != survivor) {
        let refusal = outside_membership(raft, old).expect("an old member is refused");
        assert!(refusal.contains("not a member"), "{refusal}");
    }
    assert_eq!(outside_membership(raft, survivor), None);

    // Recovering again is refused and changes nothing.
    cluster.stop(survivor).await;
    let again = force_new_cluster(survivor, &cluster.dir(survivor), addr(survivor), 0).await;
    assert!(
        matches!(again, Err(RecoverError::AlreadyAlone { .. })),
        "{again:?}"
    );
    let unchanged = inspect(&cluster.dir(survivor)).await.expect("inspect");
    assert_eq!(unchanged.voters(), vec![survivor]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recover_refuses_a_missing_store_and_a_replica_that_is_no_voter() {
    let mut cluster = Cluster::start(3, fast_settings(), 0).await;
    cluster.wait_leader(&all(), 0).await;
    cluster.stop_all().await;
    let nowhere = cluster.root.path().join("no-such-replica");
    let missing = force_new_cluster(1, &nowhere, addr(1), 0).await;
    assert!(
        matches!(missing, Err(RecoverError::NoStore { .. })),
        "{missing:?}"
    );
    assert!(!nowhere.exists(), "recover created a directory");
    let stranger = force_new_cluster(9, &cluster.dir(1), addr(9), 0).await;
    assert!(
        matches!(stranger, Err(RecoverError::NotAVoter { id: 9, .. })),
        "{stranger:?}"
    );
    let unchanged = inspect(&cluster.dir(1)).await.expect("inspect");
    assert_eq!(unchanged.voters(), vec![1, 2, 3]);
}
