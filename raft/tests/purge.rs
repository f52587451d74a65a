//! A follower's log is purged up to a snapshot only once the snapshot is in its state machine
//! (decision 0280). openraft 0.9 purges as soon as it hands the install over, so a crash in
//! between left a store whose log was gone and whose snapshot was not there, which no restart
//! could use (chaos crash-mid-snapshot: "try to get log at index 0 but got None" for good).

use std::sync::Arc;
use std::time::Duration;

use openraft::storage::{RaftLogStorage, RaftStateMachine};
use openraft::{CommittedLeaderId, EntryPayload};

use mesh_raft::kv::KvApp;
use mesh_raft::{Entry, LogId, LogStore, StateMachine};

fn log_id(term: u64, index: u64) -> LogId {
    LogId::new(CommittedLeaderId::new(term, 0), index)
}

fn stores(wait: Duration) -> (tempfile::TempDir, LogStore, StateMachine<KvApp>) {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = Arc::new(mesh_migrations::open(&dir.path().join("store.redb")).expect("open store"));
    let sm = StateMachine::new(db.clone(), Arc::new(KvApp));
    let log = LogStore::new(db).purges_wait_for_the_state_machine(wait, sm.install_ends());
    (dir, log, sm)
}

#[tokio::test]
async fn g4_a_purge_past_what_the_state_machine_holds_fails_and_removes_nothing() {
    // The state a crash mid-install leaves must not reach the disk: no snapshot arrives in the
    // state machine, so the purge up to it fails and the log store records no purge.
    let (_dir, mut log, _sm) = stores(Duration::from_millis(200));
    let purged = log.purge(log_id(2, 9)).await;
    assert!(
        purged.is_err(),
        "a purge the state machine does not hold went ahead"
    );
    let state = log.get_log_state().await.expect("log state");
    assert_eq!(
        state.last_purged_log_id, None,
        "the failed purge recorded a purge"
    );
}

#[tokio::test]
async fn g4_a_purge_past_the_state_machine_fails_at_once_when_an_install_ends_without_it() {
    // An install that ends without the snapshot (refused here; unwound in the chaos runs) ends a
    // waiting purge at once, instead of after its whole wait: the Raft core is not held.
    let (_dir, mut log, mut sm) = stores(Duration::from_secs(600));
    let waiting = tokio::spawn(async move {
        let r = log.purge(log_id(2, 9)).await;
        (r, log)
    });
    // Installs that end without the snapshot, until the purge has noticed one.
    let meta = openraft::SnapshotMeta {
        last_log_id: Some(log_id(2, 9)),
        last_membership: Default::default(),
        snapshot_id: "2-9-0".into(),
    };
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while !waiting.is_finished() {
        let bad = Box::new(std::io::Cursor::new(b"not a snapshot".to_vec()));
        assert!(sm.install_snapshot(&meta, bad).await.is_err());
        assert!(
            tokio::time::Instant::now() < deadline,
            "the purge still waits after installs ended without its snapshot"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let (purged, mut log) = waiting.await.expect("purge task");
    assert!(purged.is_err(), "the purge went ahead without the snapshot");
    let state = log.get_log_state().await.expect("log state");
    assert_eq!(state.last_purged_log_id, None);
}

#[tokio::test]
async fn a_purge_the_state_machine_covers_goes_ahead() {
    let (_dir, mut log, mut sm) = stores(Duration::from_millis(200));
    let entry = Entry {
        log_id: log_id(2, 9),
        payload: EntryPayload::Blank,
    };
    sm.apply(vec![entry]).await.expect("applied");
    log.purge(log_id(2, 9)).await.expect("purged");
    let state = log.get_log_state().await.expect("log state");
    assert_eq!(state.last_purged_log_id, Some(log_id(2, 9)));
}
