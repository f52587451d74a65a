//! Models larger than one proposal (issue 10 item 2, decision 0185): meshctl's requests for a
//! model with ~7 MiB of module files (under `model_bytes_max`, each machine's declaration under
//! `declaration_bytes_max`, decision 0298) go as numbered chunks into the staging record and one apply
//! that names the upload and its digest, through three in-process replicas over real QUIC; the
//! model lands whole in one commit, a read between chunks shows the old model, a wrong digest or
//! an upload over the limits is refused and changes nothing. The state machine's own checks are
//! tested on `DomainState` directly (every replica runs them, whoever proposed).

mod controller_common;

use std::sync::Arc;

use controller_common::*;
use mesh::cli::apply::{Sending, requests_for};
use mesh::controller::api::{ApiError, ApplyError, Body, Chunk, Request, UploadId};
use mesh::core::model::Mesh;
use mesh::core::validate::model_bytes_max;
use mesh::store::app::MeshApp;
use mesh::store::command::{Command, Outcome, Proposal, Refusal};
use mesh::store::staging::{staging_bytes_max, upload_digest, upload_idle_ms};
use mesh::store::state::DomainState;

/// Built before the bed starts: the test's own CPU work runs on the runtime the replicas share.
/// `mount_mesh` with `modules` more sleepers, each on a machine of its own (so each declaration
/// stays under `declaration_bytes_max`) with files of `mib` MiB in all (different bytes in each
/// file, so nothing compresses or repeats by accident).
fn big_mesh(modules: usize, mib: usize) -> Mesh {
    let mut mesh = mount_mesh("/srv/a");
    for m in 0..modules {
        let on = format!("big-machine-{m}");
        mesh.machines.insert(on.clone(), machine(&on));
        let mut module = sleeper(&format!("big{m}"), &on);
        for f in 0..mib {
            let fill = (b'a' + ((m * 7 + f) % 26) as u8) as char;
            let text = fill.to_string().repeat(1024 * 1024 - 1);
            module
                .files
                .insert(format!("data/{f}.txt"), format!("{text}\n"));
        }
        mesh.modules.insert(module.name.clone(), module);
    }
    mesh
}

fn upload_of(mesh: &Mesh) -> (UploadId, Vec<Request>, Request) {
    match requests_for(mesh.clone(), "big model".into(), false).expect("requests") {
        Sending::Upload {
            upload,
            chunks,
            apply,
        } => (upload, chunks, apply),
        Sending::Inline(_) => panic!("a model this large must go as an upload"),
    }
}

/// Every replica's model and revision, once all three agree on `want`.
async fn wait_model_everywhere(bed: &Bed, want: &Mesh, revision: u64) {
    wait_until("every replica holds the uploaded model", || {
        let all = bed.replicas.keys().all(|id| {
            let state = bed.service(*id).app().state().expect("state");
            state.revision == revision && state.mesh == *want && state.uploads.is_empty()
        });
        std::future::ready(all)
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_7_mib_model_goes_in_chunks_and_lands_whole_in_one_commit_while_reads_between_chunks_show_the_old_model()
 {
    let big = big_mesh(7, 1);
    let (upload, chunks, apply) = upload_of(&big);
    let bed = Bed::start(&[], &[]).await;
    let leader = bed.wait_leader().await;
    let old = mount_mesh("/srv/a");
    let Body::Applied {
        revision: before, ..
    } = bed.apply(leader, &old).await
    else {
        panic!("apply answers Applied");
    };
    assert!(chunks.len() >= 100, "{} chunks", chunks.len());
    let follower = bed.follower(leader);
    for (i, chunk) in chunks.iter().enumerate() {
        // Half through a follower, which forwards each chunk to the leader.
        let via = if i % 2 == 0 { leader } else { follower };
        match bed.ok(via, chunk).await {
            Body::ChunkStaged {
                upload: u,
                received,
                chunks_total,
            } => {
                assert_eq!(
                    (u, received, chunks_total as usize),
                    (upload, i as u32 + 1, chunks.len())
                );
            }
            other => panic!("chunk {i}: {other:?}"),
        }
        // Between chunks: the current model is the old one, on the leader's state and in status.
        let state = bed.service(leader).app().state().expect("state");
        assert_eq!(
            (state.revision, &state.mesh),
            (before, &old),
            "after chunk {i}"
        );
        let Body::Status(status) = bed.ok(leader, &Request::Status).await else {
            panic!("status");
        };
        assert_eq!(status.revision, before, "status after chunk {i}");
    }
    let Body::Applied { revision, .. } = bed.ok(follower, &apply).await else {
        panic!("the apply answers Applied");
    };
    assert_eq!(revision, before + 1, "one commit, one revision");
    wait_model_everywhere(&bed, &big, revision).await;
    let Body::Status(status) = bed.ok(follower, &Request::Status).await else {
        panic!("status");
    };
    assert_eq!(status.revision, revision);
    bed.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upload_is_kept_in_every_replica_s_store_and_a_digest_mismatch_is_refused_changing_nothing()
 {
    let big = big_mesh(2, 3);
    let (upload, chunks, apply) = upload_of(&big);
    let bed = Bed::start(&[], &[]).await;
    let leader = bed.wait_leader().await;
    let old = mount_mesh("/srv/a");
    let Body::Applied {
        revision: before, ..
    } = bed.apply(leader, &old).await
    else {
        panic!("apply answers Applied");
    };
    for chunk in &chunks {
        bed.ok(leader, chunk).await;
    }
    // The staging record is in every replica's store, as a restart or a snapshot reads it back.
    wait_until("every replica's store holds the staged upload", || {
        let whole = bed.replicas.keys().all(|id| {
            let db = bed.service(*id).replica().database();
            let stored = MeshApp::load(db)
                .expect("read the store")
                .state()
                .expect("state");
            stored
                .uploads
                .get(&upload)
                .is_some_and(|u| u.chunks.len() == chunks.len())
        });
        std::future::ready(whole)
    })
    .await;
    let Request::ApplyUpload { why, drain, .. } = apply.clone() else {
        panic!("apply request");
    };
    let wrong = Request::ApplyUpload {
        upload,
        digest: [7; 32],
        why,
        drain,
    };
    match bed.ask(leader, &wrong).await.body {
        Err(e @ ApiError::Apply(ApplyError::UploadUnusable { .. })) => {
            let e = e.to_string();
            assert!(
                e.contains("blake3") && e.contains("nothing was stored"),
                "{e}"
            );
        }
        other => panic!("a wrong digest must be refused, got {other:?}"),
    }
    for id in bed.replicas.keys() {
        let state = bed.service(*id).app().state().expect("state");
        assert_eq!(
            (state.revision, &state.mesh),
            (before, &old),
            "replica {id}"
        );
    }
    // The right digest still applies it.
    let Body::Applied { revision, .. } = bed.ok(leader, &apply).await else {
        panic!("the apply answers Applied");
    };
    wait_model_everywhere(&bed, &big, revision).await;
    bed.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upload_over_the_model_limit_is_refused_with_the_limit_named_and_nothing_staged() {
    let bed = Bed::start(&[], &[]).await;
    let leader = bed.wait_leader().await;
    let over = Request::ApplyChunk {
        upload: UploadId([1; 16]),
        index: 0,
        chunks_total: 70,
        bytes_total: model_bytes_max as u64 + 1,
        bytes: Chunk::new(vec![0; 1024]),
    };
    match bed.ask(leader, &over).await.body {
        Err(e @ ApiError::StoreRefused { .. }) => {
            let e = e.to_string();
            assert!(
                e.contains("model_bytes_max") && e.contains("nothing was staged"),
                "{e}"
            )
        }
        other => panic!("an upload over the limit must be refused, got {other:?}"),
    }
    for id in bed.replicas.keys() {
        let state = bed.service(*id).app().state().expect("state");
        assert!(
            state.uploads.is_empty(),
            "replica {id}: {:?}",
            state.uploads.keys()
        );
    }
    bed.shutdown().await;
}

// The state machine's checks, which every replica runs on every proposal.

fn proposal(actor: &str, time_ms: u64, command: Command) -> Proposal {
    Proposal {
        epoch: 1,
        expect_revision: None,
        actor: actor.into(),
        time_ms,
        command,
    }
}

fn stage(id: u8, index: u32, chunks_total: u32, bytes_total: u64, bytes: &[u8]) -> Command {
    Command::StageChunk {
        upload: UploadId([id; 16]),
        index,
        chunks_total,
        bytes_total,
        bytes: Chunk(Arc::new(bytes.to_vec())),
    }
}

fn refusal(outcome: Outcome) -> String {
    match outcome {
        Outcome::Refused(Refusal::Invalid(e)) => e,
        other => panic!("expected a refusal, got {other:?}"),
    }
}

#[test]
fn the_state_machine_refuses_a_staged_model_whose_digest_differs_and_changes_nothing() {
    let mut state = DomainState::default();
    let bytes = mesh_codec::encode("model", &mount_mesh("/srv/a")).expect("encode");
    let (a, b) = bytes.split_at(bytes.len() / 2);
    let total = bytes.len() as u64;
    for (i, part) in [a, b].into_iter().enumerate() {
        let p = proposal("operator:alice", 1_000, stage(1, i as u32, 2, total, part));
        assert!(matches!(state.apply(1, &p).0, Outcome::Applied(_)));
    }
    let apply = |digest: [u8; 32]| {
        proposal(
            "operator:alice",
            2_000,
            Command::ApplyUpload {
                upload: UploadId([1; 16]),
                digest,
                why: "big".into(),
                changes: vec![],
                keep: vec![],
            },
        )
    };
    let before = state.clone();
    let mut wrong = upload_digest(&bytes);
    wrong[0] ^= 1;
    let e = refusal(state.apply(1, &apply(wrong)).0);
    assert!(
        e.contains("blake3") && e.contains("nothing was stored"),
        "{e}"
    );
    assert_eq!(state, before, "a refused apply changes nothing");
    assert!(matches!(
        state.apply(1, &apply(upload_digest(&bytes))).0,
        Outcome::Applied(_)
    ));
    assert_eq!(state.mesh, mount_mesh("/srv/a"));
    assert!(
        state.uploads.is_empty(),
        "the staging rows go in the same commit"
    );
}

#[test]
fn staging_is_bounded_in_bytes_superseded_by_the_same_operator_and_dropped_when_idle() {
    let mut state = DomainState::default();
    let half = staging_bytes_max / 2;
    for (id, actor) in [(1, "operator:alice"), (2, "operator:bob")] {
        let p = proposal(actor, 1_000, stage(id, 0, 100, half, b"x"));
        assert!(
            matches!(state.apply(1, &p).0, Outcome::Applied(_)),
            "{actor}"
        );
    }
    let before = state.clone();
    let p = proposal("operator:carol", 1_000, stage(3, 0, 1, 1, b"x"));
    let e = refusal(state.apply(1, &p).0);
    assert!(
        e.contains("staging_bytes_max") && e.contains("nothing was staged"),
        "{e}"
    );
    assert_eq!(state, before, "a refused chunk changes nothing");
    // Alice starts again: her unfinished upload is dropped, Bob's stays.
    let p = proposal("operator:alice", 2_000, stage(4, 0, 1, 1, b"x"));
    assert!(matches!(state.apply(1, &p).0, Outcome::Applied(_)));
    let ids: Vec<u8> = state.uploads.keys().map(|u| u.0[0]).collect();
    assert_eq!(ids, [2, 4]);
    // Long after Bob's last chunk, any staging command drops his upload.
    let later = 2_000 + upload_idle_ms + 1;
    let p = proposal("operator:carol", later, stage(5, 0, 1, 1, b"x"));
    assert!(matches!(state.apply(1, &p).0, Outcome::Applied(_)));
    let ids: Vec<u8> = state.uploads.keys().map(|u| u.0[0]).collect();
    assert_eq!(ids, [5], "alice's was idle too, bob's expired");
}
