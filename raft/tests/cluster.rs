//! Three-replica clusters in one process over the router, with real redb files: commit, failover,
//! restart, snapshot catch-up, membership changes, the term floor (G9) and restore.

mod support;

use std::collections::BTreeSet;

use openraft::ServerState;

use mesh_raft::kv::KvApp;
use mesh_raft::{ProposeError, RaftSettings, restore};

use support::{Cluster, addr, fast_settings, wait_deadline};

fn all(n: u64) -> BTreeSet<u64> {
    (1..=n).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn committed_command_is_read_back_on_every_replica() {
    // Replication: an acknowledged write is applied on every replica with the same answer.
    let cluster = Cluster::start(3, fast_settings(), 0).await;
    let (leader, term) = cluster.wait_leader(&all(3), 0).await;
    let first = cluster.set(leader, "k", "v1").await;
    assert_eq!(first.term(), term, "entry carries the leader's term");
    let second = cluster.set(leader, "k", "v2").await;
    let previous = mesh_raft::kv::decode_previous(&second.response).expect("answer");
    assert_eq!(
        previous,
        Some(b"v1".to_vec()),
        "the app's answer comes back"
    );
    for id in 1..=3 {
        cluster.wait_applied(id, second.index()).await;
        assert_eq!(cluster.read(id, "k").as_deref(), Some("v2"), "replica {id}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proposal_to_a_follower_is_refused_naming_the_leader() {
    // G13 support: a follower refuses with the leader's id so the caller can forward.
    let cluster = Cluster::start(3, fast_settings(), 0).await;
    let (leader, _) = cluster.wait_leader(&all(3), 0).await;
    cluster.set(leader, "k", "v").await;
    let follower = (1..=3).find(|id| *id != leader).expect("a follower");
    cluster
        .replica(follower)
        .raft()
        .wait(Some(wait_deadline))
        .current_leader(leader, "follower knows the leader")
        .await
        .expect("follower learns the leader");
    let err = cluster
        .replica(follower)
        .propose(b"ignored".to_vec())
        .await
        .expect_err("followers do not propose");
    assert!(
        matches!(err, ProposeError::NotLeader { leader: Some(l), .. } if l == leader),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leader_shutdown_elects_a_higher_term_and_loses_no_acknowledged_write() {
    // Failover: after the leader dies a new leader is elected in a higher term, and every write
    // acknowledged before is still there.
    let mut cluster = Cluster::start(3, fast_settings(), 0).await;
    let (old, old_term) = cluster.wait_leader(&all(3), 0).await;
    for i in 0..20 {
        cluster.set(old, &format!("k{i}"), &format!("v{i}")).await;
    }
    cluster.stop(old).await;
    let rest = cluster.running();
    let (new, new_term) = cluster.wait_leader(&rest, old_term).await;
    assert!(new_term > old_term);
    cluster
        .replica(new)
        .raft()
        .ensure_linearizable()
        .await
        .expect("new leader confirms and catches up");
    for i in 0..20 {
        assert_eq!(
            cluster.read(new, &format!("k{i}")).as_deref(),
            Some(format!("v{i}").as_str()),
            "acknowledged write k{i} lost"
        );
    }
    let after = cluster.set(new, "after", "failover").await;
    assert_eq!(after.term(), new_term);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restarted_follower_catches_up_from_its_files() {
    // Durability: a follower restarted from its own store keeps what it had and gets the rest.
    let mut cluster = Cluster::start(3, fast_settings(), 0).await;
    let (leader, _) = cluster.wait_leader(&all(3), 0).await;
    let before = cluster.set(leader, "before", "stop").await;
    let follower = (1..=3).find(|id| *id != leader).expect("a follower");
    cluster.wait_applied(follower, before.index()).await;
    cluster.stop(follower).await;
    let mut last = before;
    for i in 0..10 {
        last = cluster.set(leader, &format!("while-down-{i}"), "x").await;
    }
    cluster.start_replica(follower, true, 0).await;
    cluster.wait_applied(follower, last.index()).await;
    assert_eq!(cluster.read(follower, "before").as_deref(), Some("stop"));
    assert_eq!(cluster.read(follower, "while-down-9").as_deref(), Some("x"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn follower_behind_a_purged_log_catches_up_by_snapshot() {
    // Snapshots: once the leader purged the entries a follower lacks, the follower is brought up to
    // date by installing a snapshot.
    let settings = RaftSettings {
        snapshot_logs_since_last: 20,
        logs_kept_after_snapshot: 0,
        ..fast_settings()
    };
    let mut cluster = Cluster::start(3, settings, 0).await;
    let (leader, _) = cluster.wait_leader(&all(3), 0).await;
    let follower = (1..=3).find(|id| *id != leader).expect("a follower");
    let seen = cluster.set(leader, "seen", "yes").await;
    cluster.wait_applied(follower, seen.index()).await;
    cluster.stop(follower).await;
    let mut last = seen.clone();
    for i in 0..60 {
        last = cluster
            .set(leader, &format!("k{i}"), &format!("v{i}"))
            .await;
    }
    let purged = cluster
        .replica(leader)
        .raft()
        .wait(Some(wait_deadline))
        .metrics(
            |m| m.purged.map(|p| p.index).unwrap_or(0) > seen.index() + 1,
            "leader purges past what the follower has",
        )
        .await
        .expect("leader purges its log");
    assert!(purged.snapshot.is_some());
    cluster.start_replica(follower, true, 0).await;
    cluster.wait_applied(follower, last.index()).await;
    let m = cluster.metrics(follower);
    assert!(
        m.snapshot.map(|s| s.index).unwrap_or(0) > seen.index(),
        "follower installed a snapshot: {:?}",
        m.snapshot
    );
    assert_eq!(cluster.read(follower, "k0").as_deref(), Some("v0"));
    assert_eq!(cluster.read(follower, "k59").as_deref(), Some("v59"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn learner_is_added_and_promoted_and_a_voter_removed() {
    // Membership: a fourth replica joins as a learner, becomes a voter, and a voter leaves.
    let mut cluster = Cluster::start(3, fast_settings(), 0).await;
    let (leader, _) = cluster.wait_leader(&all(3), 0).await;
    cluster.set(leader, "k", "v").await;
    cluster.nodes.insert(4, addr(4));
    cluster.start_replica(4, false, 0).await;
    let raft = cluster.replica(leader).raft().clone();
    raft.add_learner(4, addr(4), true)
        .await
        .expect("learner added");
    raft.change_membership(all(4), false)
        .await
        .expect("learner promoted");
    let removed = (1..=3).find(|id| *id != leader).expect("a follower");
    let voters: BTreeSet<u64> = all(4).into_iter().filter(|id| *id != removed).collect();
    raft.change_membership(voters.clone(), false)
        .await
        .expect("voter removed");
    let m = cluster.metrics(leader);
    let now: BTreeSet<u64> = m.membership_config.membership().voter_ids().collect();
    assert_eq!(now, voters);
    let last = cluster.set(leader, "after", "change").await;
    cluster.wait_applied(4, last.index()).await;
    assert_eq!(cluster.read(4, "k").as_deref(), Some("v"));
    assert_eq!(cluster.read(4, "after").as_deref(), Some("change"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fresh_cluster_with_a_term_floor_elects_above_it() {
    // G9: a cluster created with a floor never uses a term at or below it.
    let cluster = Cluster::start(3, fast_settings(), 50).await;
    let (leader, term) = cluster.wait_leader(&all(3), 0).await;
    assert!(term > 50, "first term {term} must be above the floor 50");
    let written = cluster.set(leader, "k", "v").await;
    assert!(written.term() > 50);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restart_with_a_floor_above_the_current_term_elects_above_the_floor() {
    // G9: restarting a cluster with a floor above its current term moves every later term above it.
    let mut cluster = Cluster::start(3, fast_settings(), 0).await;
    let (leader, term) = cluster.wait_leader(&all(3), 0).await;
    cluster.set(leader, "k", "v").await;
    cluster.stop_all().await;
    let floor = term + 100;
    for id in 1..=3 {
        cluster.start_replica(id, true, floor).await;
    }
    let (leader, new_term) = cluster.wait_leader(&all(3), 0).await;
    assert!(
        new_term > floor,
        "term {new_term} must be above the floor {floor}"
    );
    let written = cluster.set(leader, "k2", "v2").await;
    assert!(written.term() > floor);
    assert_eq!(cluster.read(leader, "k").as_deref(), Some("v"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restore_from_a_snapshot_brings_the_state_back_with_the_term_above_the_floor() {
    // G9: a cluster rebuilt from a backup has the backup's state and starts above the floor.
    let mut cluster = Cluster::start(3, fast_settings(), 0).await;
    let (leader, term) = cluster.wait_leader(&all(3), 0).await;
    for i in 0..10 {
        cluster
            .set(leader, &format!("k{i}"), &format!("v{i}"))
            .await;
    }
    let backup = cluster.replica(leader).backup().await.expect("backup");
    cluster.set(leader, "after-backup", "gone").await;
    cluster.stop_all().await;
    let floor = term + 7;
    let old_root = std::mem::replace(&mut cluster.root, tempfile::tempdir().expect("tempdir"));
    drop(old_root);
    for id in 1..=3 {
        let restored = restore(
            id,
            &cluster.dir(id),
            std::sync::Arc::new(KvApp),
            &backup,
            floor,
        )
        .await
        .expect("restore");
        assert_eq!(restored.term_floor, floor);
    }
    // No floor at start: the restore itself must have put the vote at the floor.
    for id in 1..=3 {
        cluster.start_replica(id, false, 0).await;
    }
    let (leader, new_term) = cluster.wait_leader(&all(3), 0).await;
    assert!(
        new_term > floor,
        "term {new_term} must be above the floor {floor}"
    );
    for i in 0..10 {
        assert_eq!(
            cluster.read(leader, &format!("k{i}")).as_deref(),
            Some(format!("v{i}").as_str())
        );
    }
    assert_eq!(cluster.read(leader, "after-backup"), None);
    let written = cluster.set(leader, "new", "write").await;
    assert!(written.term() > floor);
    let err = restore(
        1,
        &cluster.dir(1),
        std::sync::Arc::new(KvApp),
        &backup,
        floor,
    )
    .await
    .expect_err("restore refuses an existing store");
    assert!(err.to_string().contains("already exists"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_proposals_share_one_entry() {
    // Group commit: proposals waiting while a batch is in flight go out together in one entry.
    let settings = RaftSettings {
        batches_in_flight_max: 1,
        ..fast_settings()
    };
    let cluster = Cluster::start(3, settings, 0).await;
    let (leader, _) = cluster.wait_leader(&all(3), 0).await;
    let before = cluster.set(leader, "warm", "up").await;
    for id in 1..=3 {
        if id != leader {
            cluster.router.hold(leader, id);
        }
    }
    let proposals = 50;
    let replica = cluster.replica(leader);
    let total = replica.proposals_total() + proposals as u64;
    let mut pending = Vec::new();
    for i in 0..proposals {
        let command = mesh_raft::kv::Set {
            key: format!("c{i}"),
            value: vec![1],
        }
        .encode()
        .expect("encode");
        pending.push(replica.propose(command));
    }
    let all_answers = futures::future::join_all(pending);
    let release = async {
        let deadline = tokio::time::Instant::now() + wait_deadline;
        // Once every proposal is queued, the next batch takes all that the stuck first one did not.
        while replica.proposals_total() < total {
            assert!(
                tokio::time::Instant::now() < deadline,
                "proposals never queued"
            );
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
        cluster.router.heal();
    };
    let (answers, ()) = tokio::join!(all_answers, release);
    let indexes: BTreeSet<u64> = answers
        .into_iter()
        .map(|a| a.expect("committed").index())
        .collect();
    assert!(indexes.iter().all(|i| *i > before.index()));
    assert!(
        indexes.len() <= 2,
        "{proposals} proposals used {} entries",
        indexes.len()
    );
    assert_eq!(
        cluster.metrics(leader).state,
        ServerState::Leader,
        "still leading"
    );
}
