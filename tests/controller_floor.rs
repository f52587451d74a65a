//! G9 after a restore on new disks (decisions 0272, 0274), end to end in one process: one replica
//! over real QUIC with two in-process host agents. The lost leadership's term is one the restored
//! store can be elected in again; the hosts report only when the test says so, so which report
//! the leader heard before a push is known, not raced.

mod controller_common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use controller_common::*;
use mesh::controller::api::{Body, PushOutcome, PushTarget, Request};
use mesh::core::settings::Scope;
use mesh_transport::{Endpoint, Principal};

const hosts: [&str; 2] = ["ace", "g14"];

fn push_all(why: &str) -> Request {
    Request::Push {
        target: PushTarget::All,
        why: why.into(),
        moves: vec![],
        plan: None,
    }
}

/// The push's term when any of its lines left for a host (applied, sent or refused there).
fn sent_in(body: &Body) -> Option<u64> {
    let Body::Push(view) = body else {
        panic!("not a push answer: {body:?}")
    };
    view.lines
        .iter()
        .any(|l| {
            matches!(
                l.outcome,
                PushOutcome::Applied { .. }
                    | PushOutcome::Sent { .. }
                    | PushOutcome::Refused { .. }
            )
        })
        .then_some(view.epoch)
}

fn held_reasons(body: &Body) -> Vec<String> {
    let Body::Push(view) = body else {
        panic!("not a push answer: {body:?}")
    };
    view.lines
        .iter()
        .filter_map(|l| match &l.outcome {
            PushOutcome::Held { reason, .. } => Some(reason.clone()),
            _ => None,
        })
        .collect()
}

async fn applied_epoch(bed: &Bed, machine: &str) -> u64 {
    bed.hosts[machine]
        .agent
        .applied()
        .await
        .map_or(0, |(position, _)| position.epoch)
}

/// Every host reports now (their reconcile loops are stopped).
async fn report_all(bed: &Bed) {
    for m in hosts {
        bed.hosts[m].agent.report_now().await.expect("report");
    }
}

/// The model sent to both hosts and a backup saved. Then a later term whose envelope reaches ace
/// only (g14 lags one term behind). The hosts' reconcile loops are stopped. Returns
/// the backup, the backup's term and the lost term.
async fn lost_term_after_a_backup(bed: &mut Bed) -> (PathBuf, u64, u64) {
    let (_, backup_term) = bed.wait_leader_among(&[1], 0).await;
    bed.apply(1, &provider_consumer_mesh()).await;
    let first = bed.ok(1, &push_all("first send")).await;
    assert_eq!(sent_in(&first), Some(backup_term), "{first:?}");
    let file = save_backup(bed).await;
    for m in hosts {
        let _ = bed.hosts[m].stop.send(true);
    }
    // The lost leadership: the store restored from the backup with its floor file kept (a
    // single replica started again keeps leading in its term), elected in the next term.
    bed.stop_replica(1).await;
    let config = bed.configs[&1].clone();
    std::fs::remove_file(config.data_dir().join(mesh_raft::store_file_name))
        .expect("lose the store");
    let restored = mesh::controller::restore::restore(&config, &file)
        .await
        .expect("restore");
    assert!(!restored.unproven, "the floor file was kept");
    restart(bed).await;
    let (_, lost) = bed.wait_leader_among(&[1], backup_term).await;
    let set = Request::SettingsSet {
        scope: Scope::Placement {
            module: "db".into(),
            machine: "ace".into(),
        },
        layer: BTreeMap::from([("k".to_string(), "after the backup".to_string())]),
        remove: BTreeSet::new(),
        replace: false,
        why: "a change the backup does not have".into(),
    };
    bed.ok(1, &set).await;
    let body = bed.push(1, "ace", &[]).await.expect("push");
    assert_eq!(sent_in(&body), Some(lost), "{body:?}");
    assert_eq!(applied_epoch(bed, "ace").await, lost);
    assert_eq!(applied_epoch(bed, "g14").await, backup_term, "g14 lags");
    (file, backup_term, lost)
}

/// A backup of replica 1's store, as `meshctl snapshot save` writes it.
async fn save_backup(bed: &Bed) -> PathBuf {
    let first = Request::SnapshotChunk {
        snapshot: None,
        offset: 0,
    };
    let Body::SnapshotChunk { bytes, total, .. } = bed.ok(1, &first).await else {
        panic!("snapshot")
    };
    assert_eq!(total, bytes.len() as u64, "a small store is one chunk");
    let file = bed.dir.path().join("backup.snapshot");
    std::fs::write(&file, &bytes).expect("write snapshot");
    file
}

/// Starts replica 1 again on its old address (the port may take a moment to be free).
async fn restart(bed: &mut Bed) {
    let endpoint = wait_value("the replica's port is free again", || async {
        Endpoint::bind(
            bed.addrs[&1],
            &bed.pki.identity(&Principal::Replica(1)),
            transport().check().expect("transport"),
        )
        .ok()
    })
    .await;
    let running = mesh::controller::start_on(
        bed.configs[&1].clone(),
        endpoint,
        std::sync::Arc::new(mesh_raft::MonotonicClock),
    )
    .await
    .expect("replica restarts");
    bed.replicas.insert(1, running);
}

/// The replica's disk lost (store and epoch-floor file), restored from `file` with `floor`.
async fn restore_on_a_new_disk(bed: &mut Bed, file: &Path, floor: Option<u64>) -> u64 {
    bed.stop_replica(1).await;
    let config = bed.configs[&1].clone();
    std::fs::remove_dir_all(config.data_dir()).expect("lose the disk");
    let restored = mesh::controller::restore::restore_with(&config, file, floor)
        .await
        .expect("restore");
    assert_eq!(restored.unproven, floor.is_none());
    restart(bed).await;
    let (_, term) = bed.wait_leader_among(&[1], 0).await;
    term
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn g9_a_store_restored_without_its_floor_sends_no_envelope_of_an_epoch_a_host_holds() {
    // G9, decision 0274: the restored store is elected again in the lost term (ace holds an
    // envelope of it, g14 lags below it). It must send nothing of that term, not even to g14
    // whose mark is below it, and the hosts must still get the model after.
    let mut bed = Bed::start_n(1, &hosts, &[]).await;
    let (file, _, lost) = lost_term_after_a_backup(&mut bed).await;
    let term = restore_on_a_new_disk(&mut bed, &file, None).await;
    assert!(
        term <= lost,
        "the case needs the restored store in a term a host holds: {term} above {lost}"
    );

    // Before any host reported: every machine held, nothing sent.
    let body = bed.ok(1, &push_all("right after the restore")).await;
    assert_eq!(sent_in(&body), None, "{body:?}");
    let held = held_reasons(&body);
    assert_eq!(held.len(), hosts.len(), "{body:?}");
    assert!(
        held.iter().all(|r| r.contains("floor unproven")),
        "{held:?}"
    );
    assert!(applied_epoch(&bed, "g14").await < lost, "g14 took the term");

    // Once the hosts' epochs are known the term is left and the model sent above it.
    let sends = std::sync::atomic::AtomicU32::new(0);
    wait_until("both hosts get the model above the lost term", || async {
        report_all(&bed).await;
        // While the leader moves to a term above the floor a push is refused: not the leader.
        let Ok(body) = bed.ask(1, &push_all("after the reports")).await.body else {
            return false;
        };
        if let Some(epoch) = sent_in(&body) {
            assert!(
                epoch > lost,
                "sent in epoch {epoch} after the restore, but ace held {lost}: {body:?}"
            );
            sends.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }
        for m in hosts {
            let applied = applied_epoch(&bed, m).await;
            assert!(
                applied != lost || m == "ace",
                "{m} applied an envelope of the lost epoch {lost}"
            );
        }
        applied_epoch(&bed, "ace").await > lost && applied_epoch(&bed, "g14").await > lost
    })
    .await;
    assert!(sends.into_inner() > 0);
    bed.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn g9_a_proven_report_of_the_leaders_own_term_it_never_recorded_moves_it_above_the_term() {
    // G9, decision 0272: with an operator's floor too low (no marker, so decision 0274 does
    // not hold the pushes), ace's report of lost.1, signed in the lost term but never recorded
    // by this store, raises the floor above the term and the leader moves past it.
    let mut bed = Bed::start_n(1, &hosts, &[]).await;
    let (file, backup_term, lost) = lost_term_after_a_backup(&mut bed).await;
    let term = restore_on_a_new_disk(&mut bed, &file, Some(backup_term)).await;
    assert_eq!(
        term, lost,
        "the case needs the restored store in the lost term"
    );
    bed.hosts["ace"].agent.report_now().await.expect("report");
    wait_until("the floor goes above the reused term", || async {
        let state = bed.service(1).app().state().expect("state");
        state.epoch_floor > lost
    })
    .await;
    let (_, above) = bed.wait_leader_among(&[1], lost).await;
    assert!(above > lost);
    bed.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn g9_meshd_restore_without_a_floor_says_so_and_with_epoch_floor_starts_above_it() {
    // G9, decision 0274: `meshd restore` on a new disk marks the floor unproven and says so
    // loudly; `--epoch-floor N` marks nothing and the next term is above N.
    let mut bed = Bed::start_n(1, &[], &[]).await;
    bed.wait_leader_among(&[1], 0).await;
    bed.apply(1, &mount_mesh("/srv/a")).await;
    let file = save_backup(&bed).await;
    bed.stop_replica(1).await;
    let config = bed.dir.path().join("replica-1.toml");
    let data = bed.configs[&1].data_dir().to_path_buf();
    let marker = data.join(mesh::controller::floor::unproven_file_name);
    let run_restore = |extra: &[&str]| {
        std::process::Command::new(env!("CARGO_BIN_EXE_meshd"))
            .arg("restore")
            .arg("--config")
            .arg(&config)
            .arg("--from")
            .arg(&file)
            .args(extra)
            .output()
            .expect("meshd restore runs")
    };
    let restore = |extra: &[&str]| {
        std::fs::remove_dir_all(&data).expect("lose the disk");
        let out = run_restore(extra);
        let stderr = String::from_utf8_lossy(&out.stderr).to_string();
        assert!(out.status.success(), "{stderr}");
        assert!(stderr.contains("STORE RESTORED"), "{stderr}");
        stderr
    };
    let stderr = restore(&[]);
    assert!(stderr.contains("FLOOR UNPROVEN"), "{stderr}");
    assert!(stderr.contains("--epoch-floor"), "{stderr}");
    assert!(marker.exists(), "no floor-unproven marker beside the store");

    // A floor terms would overflow above is refused, naming it, and changes nothing.
    let out = run_restore(&["--epoch-floor", &u64::MAX.to_string()]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(
        stderr.contains("--epoch-floor 18446744073709551615 is above"),
        "{stderr}"
    );
    assert!(
        marker.exists(),
        "a refused restore changed the data directory"
    );

    let stderr = restore(&["--epoch-floor", "7"]);
    assert!(!stderr.contains("FLOOR UNPROVEN"), "{stderr}");
    assert!(!marker.exists(), "a restore given a floor left the marker");
    assert_eq!(
        mesh::controller::floor::read_floor(&data).expect("floor"),
        7
    );
    restart(&mut bed).await;
    let (_, term) = bed.wait_leader_among(&[1], 7).await;
    assert!(term > 7, "term {term}");
    bed.shutdown().await;
}
