//! Errors with a fatal class (issue 10 item 8, decision 0183): a replica that can no longer keep
//! its epoch floor (G9) stops instead of going on answering, and says why.

mod controller_common;

use std::time::Duration;

use controller_common::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn g9_a_replica_that_cannot_write_its_epoch_floor_file_stops_and_says_why() {
    // G9 rests on the floor file beside the store: a replica that cannot write it would let a
    // store restored from an old disk reuse an epoch. So a failed write is fatal, not a log line.
    let bed = Bed::start(&[], &[]).await;
    let leader = bed.wait_leader().await;
    let running = &bed.replicas[&leader];
    let dir = bed.configs[&leader].data_dir().to_path_buf();
    let floor = dir.join(mesh::controller::floor::floor_file_name);
    // A directory where the file goes: the atomic rename over it fails.
    std::fs::remove_file(&floor).ok();
    std::fs::create_dir_all(floor.join("blocker")).expect("a directory in the file's place");
    assert_eq!(running.service().fatal(), None, "healthy before");

    // A higher term raises the floor, which the replica must then write.
    let term = running.service().replica().metrics().borrow().current_term;
    running
        .service()
        .replica()
        .raise_term_above(term + 3)
        .await
        .expect("the leader moves to a higher term");
    let reason = tokio::time::timeout(Duration::from_secs(20), running.failed())
        .await
        .expect("the replica fails within 20 s");
    assert!(
        reason.contains("epoch floor file") && reason.contains(&dir.display().to_string()),
        "{reason}"
    );
    assert_eq!(running.service().fatal(), Some(reason));
}
