//! Raft over real QUIC on loopback: three in-process replicas (the KV test app) elect a leader, commit,
//! and a replica whose log was purged catches up by a snapshot sent in pieces under the frame limit.

mod support;

use mesh_raft::RaftSettings;

use support::quic::QuicCluster;
use support::{fast_settings, wait_deadline};

/// A small frame limit, so the snapshot below must travel in several pieces.
const frame_bytes_max: u32 = 256 * 1024;

async fn start(settings: RaftSettings) -> QuicCluster {
    QuicCluster::start(vec![settings; 3], frame_bytes_max).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_replicas_over_quic_elect_commit_and_replicate() {
    // Raft over QUIC: a leader is elected and a committed write is applied on every replica.
    let cluster = start(fast_settings()).await;
    let leader = cluster.wait_leader().await;
    let index = cluster.set(leader, "k", b"v".to_vec()).await;
    for id in 1..=3 {
        cluster.wait_applied(id, index).await;
        assert_eq!(cluster.read(id, "k").as_deref(), Some(&b"v"[..]));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn follower_behind_a_purged_log_catches_up_by_snapshot_over_quic() {
    // Snapshots over QUIC: a follower that missed purged entries installs a snapshot larger than the
    // frame limit, sent in pieces.
    let settings = RaftSettings {
        snapshot_logs_since_last: 20,
        logs_kept_after_snapshot: 0,
        ..fast_settings()
    };
    let mut cluster = start(settings).await;
    let leader = cluster.wait_leader().await;
    let follower = (1..=3).find(|id| *id != leader).expect("a follower");
    let seen = cluster.set(leader, "seen", b"yes".to_vec()).await;
    cluster.wait_applied(follower, seen).await;
    cluster.stop(follower).await;
    let mut last = seen;
    // 60 values of 8 KiB: the snapshot is about twice the frame limit.
    for i in 0..60u8 {
        last = cluster
            .set(leader, &format!("k{i}"), vec![i; 8 * 1024])
            .await;
    }
    cluster
        .replica(leader)
        .raft()
        .wait(Some(wait_deadline))
        .metrics(
            |m| m.purged.map(|p| p.index).unwrap_or(0) > seen + 1,
            "leader purges past what the follower has",
        )
        .await
        .expect("leader purges its log");
    cluster.restart(follower).await;
    cluster.wait_applied(follower, last).await;
    let m = cluster.replica(follower).metrics().borrow().clone();
    assert!(
        m.snapshot.map(|s| s.index).unwrap_or(0) > seen,
        "follower installed a snapshot: {:?}",
        m.snapshot
    );
    assert_eq!(cluster.read(follower, "k0"), Some(vec![0; 8 * 1024]));
    assert_eq!(cluster.read(follower, "k59"), Some(vec![59; 8 * 1024]));
}
