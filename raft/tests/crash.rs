//! Crash durability of non-durable applies: a process that dies after applying (with
//! `Durability::None`) and then purging (durable) keeps every apply the purge relied on.
//!
//! The crash is real: the test re-runs its own binary as a child that calls `abort()`.

use std::path::Path;
use std::process::{Child, Command};
use std::sync::Arc;
use std::time::{Duration, Instant};

use openraft::storage::{RaftLogStorage, RaftLogStorageExt, RaftStateMachine};
use openraft::{CommittedLeaderId, EntryPayload, LogId};

use mesh_raft::kv::{KvApp, Set};
use mesh_raft::{Command as Batch, Entry, LogStore, StateMachine};

const child_dir_var: &str = "MESH_RAFT_CRASH_DIR";
const child_mode_var: &str = "MESH_RAFT_CRASH_MODE";
const entries: u64 = 10;
const child_deadline: Duration = Duration::from_secs(60);

struct KillOnDrop(Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn log_id(index: u64) -> LogId<u64> {
    LogId::new(CommittedLeaderId::new(1, 1), index)
}

fn entry(index: u64) -> Entry {
    let set = Set {
        key: format!("k{index}"),
        value: vec![1],
    };
    Entry {
        log_id: log_id(index),
        payload: EntryPayload::Normal(Batch(vec![set.encode().expect("encode")])),
    }
}

/// The child: appends (durable), applies (non-durable), maybe purges (durable), then dies.
async fn child(dir: &Path, purge: bool) {
    let db = Arc::new(mesh_migrations::open(&dir.join("store.redb")).expect("open"));
    let mut log = LogStore::new(db.clone());
    let mut sm = StateMachine::new(db, Arc::new(KvApp));
    let all: Vec<Entry> = (0..entries).map(entry).collect();
    log.blocking_append(all.clone()).await.expect("append");
    sm.apply(all).await.expect("apply");
    if purge {
        log.purge(log_id(entries / 2)).await.expect("purge");
    }
    std::process::abort();
}

#[test]
fn crash_child() {
    // Not a test on its own: the body of the child process of the tests below.
    let (Ok(dir), Ok(mode)) = (std::env::var(child_dir_var), std::env::var(child_mode_var)) else {
        return;
    };
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    runtime.block_on(child(Path::new(&dir), mode == "purge"));
}

fn crash_with(dir: &Path, mode: &str) {
    let exe = std::env::current_exe().expect("test binary");
    let child = Command::new(exe)
        .args(["--exact", "crash_child", "--test-threads=1", "--quiet"])
        .env(child_dir_var, dir)
        .env(child_mode_var, mode)
        .stdout(std::process::Stdio::null())
        .spawn()
        .expect("spawn child");
    let mut child = KillOnDrop(child);
    let deadline = Instant::now() + child_deadline;
    loop {
        if let Some(status) = child.0.try_wait().expect("child status") {
            assert!(!status.success(), "the child must die by abort");
            return;
        }
        assert!(Instant::now() < deadline, "child did not finish");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn applied_after_crash(dir: &Path) -> Option<u64> {
    let db = Arc::new(mesh_migrations::open(&dir.join("store.redb")).expect("reopen"));
    let mut sm = StateMachine::new(db, Arc::new(KvApp));
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    let (applied, _) = runtime.block_on(sm.applied_state()).expect("applied state");
    applied.map(|id| id.index)
}

#[test]
fn purge_persists_the_non_durable_applies_it_follows_across_a_crash() {
    // Apply durability: purge never outruns durable applies, because its immediate commit persists
    // every earlier non-durable apply in the same file.
    let dir = tempfile::tempdir().expect("tempdir");
    crash_with(dir.path(), "purge");
    let applied = applied_after_crash(dir.path());
    assert_eq!(
        applied,
        Some(entries - 1),
        "applies before the purge survived"
    );
}

#[test]
fn non_durable_applies_alone_are_lost_in_a_crash_and_the_log_keeps_them() {
    // Control for the test above: without a later durable commit the applies are gone after a crash
    // (so the test above can tell), while the durable log still holds every entry to replay.
    let dir = tempfile::tempdir().expect("tempdir");
    crash_with(dir.path(), "none");
    assert_eq!(
        applied_after_crash(dir.path()),
        None,
        "applies were not durable"
    );
    let db = Arc::new(mesh_migrations::open(&dir.path().join("store.redb")).expect("reopen"));
    let mut log = LogStore::new(db);
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    let state = runtime.block_on(log.get_log_state()).expect("log state");
    assert_eq!(state.last_log_id.map(|id| id.index), Some(entries - 1));
}
