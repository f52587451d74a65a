//! G2 at the host: only a verified envelope for this machine, newer than the high-water mark, is
//! applied; the mark is on disk before anything runs and survives a restart; refusals are counted
//! and reported.

mod host_common;

use host_common::*;
use mesh::core::envelope::{Position, Refusal};
use mesh::host::HostError;

fn refusal(result: Result<mesh::host::Applied, HostError>) -> Refusal {
    match result {
        Err(HostError::Refused(r)) => r,
        other => panic!("expected a refusal, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn g2_tampered_bytes_are_refused_and_nothing_runs() {
    // G2: the signature covers the exact bytes; one flipped byte is refused before decoding.
    let fx = Fixture::new();
    let agent = fx.agent();
    let mut wire = fx.seal(1, 1, vec![sleeper("web")]);
    let last = wire.len() - 70;
    wire[last] ^= 0x01;
    let r = refusal(agent.receive(&wire).await);
    assert!(
        matches!(r, Refusal::BadSignature(1) | Refusal::Malformed(_)),
        "{r:?}"
    );
    assert_eq!(agent.high_water().await, None);
    assert!(agent.status().await.is_empty());
    assert!(!fx.module_dir("web").exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn g2_unknown_signer_and_another_machines_envelope_are_refused() {
    // G2: a key the host does not trust, or an envelope for another machine, is refused.
    let fx = Fixture::new();
    let agent = fx.agent();
    let stranger = mesh::core::envelope::seal(
        &envelope(1, 1, vec![sleeper("web")], vec![]),
        &replica_key(9),
    )
    .expect("seal");
    assert_eq!(
        refusal(agent.receive(&stranger).await),
        Refusal::BadSignature(1)
    );
    let mut unknown = envelope(1, 1, vec![sleeper("web")], vec![]);
    unknown.signer = 7;
    let unknown = mesh::core::envelope::seal(&unknown, &fx.key).expect("seal");
    assert_eq!(
        refusal(agent.receive(&unknown).await),
        Refusal::UnknownSigner(7)
    );
    let mut other = envelope(1, 1, vec![sleeper("web")], vec![]);
    other.machine = "g14".into();
    other.declaration.machine = "g14".into();
    let other = mesh::core::envelope::seal(&other, &fx.key).expect("seal");
    assert!(matches!(
        refusal(agent.receive(&other).await),
        Refusal::WrongMachine { .. }
    ));
    assert_eq!(agent.high_water().await, None);
    assert!(agent.status().await.is_empty());
    assert_eq!(agent.refusals().await.total, 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn g2_older_epoch_and_older_sequence_are_refused_counted_and_reported() {
    // G2: (epoch, sequence) must be above the mark; refusals are counted and reported.
    let fx = Fixture::new();
    let agent = fx.agent();
    agent
        .receive(&fx.seal(5, 10, vec![sleeper("web")]))
        .await
        .expect("applied");
    let older_epoch = fx.seal(4, 99, vec![sleeper("evil")]);
    assert!(matches!(
        refusal(agent.receive(&older_epoch).await),
        Refusal::Older { .. }
    ));
    let older_sequence = fx.seal(5, 9, vec![sleeper("evil")]);
    assert!(matches!(
        refusal(agent.receive(&older_sequence).await),
        Refusal::Older { .. }
    ));
    let same = fx.seal(5, 10, vec![sleeper("evil")]);
    assert!(matches!(
        refusal(agent.receive(&same).await),
        Refusal::Older { .. }
    ));
    let mark = Position {
        epoch: 5,
        sequence: 10,
    };
    assert_eq!(agent.high_water().await, Some(mark));
    assert!(find(&agent.status().await, "evil").is_none());
    let report = agent.report_now().await.expect("report");
    assert_eq!(report.refused_older, 3);
    assert!(
        report
            .last_refusal
            .as_deref()
            .is_some_and(|r| r.contains("not newer")),
        "{report:?}"
    );
    assert_eq!((report.epoch, report.sequence), (5, 10));
    agent.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn g2_mark_is_on_disk_before_the_module_starts() {
    // G2: the high-water mark is persisted before anything of the declaration is applied: the
    // module itself reads it when it starts.
    let fx = Fixture::new();
    let agent = fx.agent();
    let seen = shell("web", "cat ../../high_water > seen; exec sleep 600");
    agent
        .receive(&fx.seal(3, 4, vec![seen]))
        .await
        .expect("applied");
    let seen = fx.module_dir("web").join("seen");
    wait_until("the module to record the mark", || async {
        read(&seen).contains("sequence")
    })
    .await;
    assert_eq!(read(&seen).trim(), "epoch 3 sequence 4");
    agent.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn g2_mark_survives_a_restart_and_a_replay_is_refused() {
    // G2: a new agent over the same root reloads the mark and the declaration; replaying the old
    // envelope, or an older one, is refused.
    let fx = Fixture::new();
    let first = fx.seal(2, 1, vec![sleeper("web")]);
    let second = fx.seal(2, 2, vec![sleeper("web"), sleeper("api")]);
    {
        let agent = fx.agent();
        agent.receive(&first).await.expect("applied");
        agent.receive(&second).await.expect("applied");
        agent.shutdown().await;
    }
    let agent = fx.agent();
    let mark = Position {
        epoch: 2,
        sequence: 2,
    };
    assert_eq!(agent.high_water().await, Some(mark));
    agent.start().await.expect("resumes");
    ready_pid(&agent, "api").await;
    assert!(matches!(
        refusal(agent.receive(&second).await),
        Refusal::Older { .. }
    ));
    assert!(matches!(
        refusal(agent.receive(&first).await),
        Refusal::Older { .. }
    ));
    assert_eq!(agent.refusals().await.older, 2);
    agent.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn g2_a_torn_mark_write_leaves_the_old_mark_and_a_corrupt_one_stops_the_host() {
    // G2: a crash mid-write leaves only a temp file beside the old mark; a mark that cannot be
    // read is an error, never a fresh start that would accept replays.
    let fx = Fixture::new();
    {
        let agent = fx.agent();
        agent
            .receive(&fx.seal(7, 1, vec![]))
            .await
            .expect("applied");
    }
    let mark = fx.root().join("high_water");
    std::fs::write(fx.root().join(".high_water.mesh-tmp"), b"epoch 1 seq").expect("torn");
    let agent = fx.agent();
    assert_eq!(
        agent.high_water().await,
        Some(Position {
            epoch: 7,
            sequence: 1
        })
    );
    drop(agent);
    std::fs::write(&mark, b"epoch 7 sequ").expect("corrupt");
    let opened = mesh::host::Agent::open(fx.config(), fx.sink.clone());
    let err = opened.err().expect("refuses to open");
    assert!(err.is_fatal());
    assert!(err.to_string().contains("high_water"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn g2_after_the_mark_cannot_be_stored_the_agent_applies_nothing_more() {
    // G2: a host whose disk failed part-way must not carry on applying on a state it could not
    // keep; the error is fatal and every later envelope is refused until a restart.
    let fx = Fixture::new();
    let agent = fx.agent();
    let blocker = mesh::host::durable::temp_path(&fx.root().join("high_water"));
    std::fs::create_dir_all(blocker.join("x")).expect("blocker");
    let first = agent.receive(&fx.seal(1, 1, vec![sleeper("web")])).await;
    let err = first.expect_err("mark not stored");
    assert!(err.is_fatal(), "{err}");
    std::fs::remove_dir_all(&blocker).expect("unblock");
    let second = agent.receive(&fx.seal(1, 2, vec![sleeper("web")])).await;
    assert!(matches!(second, Err(HostError::ShuttingDown)), "{second:?}");
    assert_eq!(agent.high_water().await, None);
    assert!(agent.status().await.is_empty(), "a module started");
}
