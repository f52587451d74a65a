//! Issue 27: a certificate is not trust. Every id a peer's message carries is checked against the
//! certificate it came with, before openraft or any handler sees it: a second valid replica
//! certificate that claims another member's id moves no term (G2, G3), and a host that replays
//! its genuine proof with another digest moves no term either (G9, decision 0272).

mod controller_common;

use std::time::Duration;

use controller_common::*;
use mesh::controller::api::{Body, PushOutcome, Request};
use mesh::core::declaration::{Digest, retired_replicas};
use mesh::core::envelope::{Envelope, seal};
use mesh::core::model::Mesh;
use mesh::core::wire::{EnvelopeReply, envelope_reply_what};
use mesh_raft::network::{RaftCall, RaftRequest};
use mesh_raft::{NodeId, TypeConfig};
use mesh_transport::{MessageKind, Peer, Principal, TransportError};
use openraft::raft::{AppendEntriesRequest, InstallSnapshotRequest, VoteRequest};
use openraft::{CommittedLeaderId, LogId, SnapshotMeta, StoredMembership, Vote};

fn append(term: u64, leader: NodeId) -> RaftCall {
    RaftCall::AppendEntries(AppendEntriesRequest::<TypeConfig> {
        vote: Vote::new_committed(term, leader),
        prev_log_id: None,
        entries: vec![],
        leader_commit: None,
    })
}

fn vote(term: u64, candidate: NodeId) -> RaftCall {
    RaftCall::Vote(VoteRequest::new(Vote::new(term, candidate), None))
}

fn snapshot(term: u64, leader: NodeId) -> RaftCall {
    RaftCall::InstallSnapshot(InstallSnapshotRequest::<TypeConfig> {
        vote: Vote::new_committed(term, leader),
        meta: SnapshotMeta {
            last_log_id: Some(LogId::new(CommittedLeaderId::new(term, leader), 1)),
            last_membership: StoredMembership::default(),
            snapshot_id: "forged".into(),
        },
        offset: 0,
        data: vec![],
        done: false,
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn g2_g3_a_second_replica_certificate_claiming_another_members_id_is_refused_for_every_raft_call()
 {
    // Seen before issue 27: with replica 3's certificate, one empty AppendEntries claiming leader 1
    // at term 2001 was answered Success and every replica moved to term 2001. Each forged call
    // below would be answered by openraft (and move the term, or start a campaign) if it got
    // there; it must be refused by name before, and counted.
    let bed = Bed::start(&[], &[]).await;
    let leader = bed.wait_leader().await;
    let poser = bed.follower(leader);
    let victim = [1, 2, 3]
        .into_iter()
        .find(|id| *id != leader && *id != poser)
        .expect("a third replica");
    let term = bed.term(leader);
    // Every replica follows the leader's term before anything is forged (a follower that has not
    // heard the first heartbeat yet is still at term 0).
    wait_until("every replica in the leader's term", || {
        std::future::ready([1, 2, 3].iter().all(|id| bed.term(*id) == term))
    })
    .await;
    let forged = term + 2000;
    let timings = bed.service(victim).replica().config().timings();
    let endpoint = bed.endpoint_as(&Principal::Replica(poser));
    let calls = [
        (
            "append entries claiming to come from the leader",
            leader,
            append(forged, leader),
        ),
        (
            "append entries as the leader",
            poser,
            append(forged, leader),
        ),
        (
            "a vote claiming to come from the leader",
            leader,
            vote(forged, leader),
        ),
        ("a vote for the leader", poser, vote(forged, leader)),
        ("a snapshot as the leader", poser, snapshot(forged, leader)),
        (
            "elect-now claiming to come from the leader",
            leader,
            RaftCall::ElectNow,
        ),
    ];
    let count = calls.len();
    for (what, from, call) in calls {
        let body = mesh_codec::encode(
            "raft request",
            &RaftRequest {
                from,
                timings,
                call,
            },
        )
        .expect("encode");
        let to = Peer::expecting(bed.addrs[&victim], Principal::Replica(victim));
        let answered = endpoint
            .request(to, MessageKind::Raft, body, Duration::from_secs(5))
            .await;
        let Err(TransportError::Refused { reason, .. }) = &answered else {
            panic!("{what}: answered instead of refused: {answered:?}");
        };
        assert!(
            reason.contains(&format!("replica {poser}'s certificate"))
                && reason.contains(&format!("replica {leader}")),
            "{what}: the refusal names both the certificate and the id it claimed: {reason}"
        );
        assert_eq!(
            bed.term(victim),
            term,
            "{what} moved replica {victim}'s term"
        );
    }
    let metrics = bed.service(victim).metrics_text().expect("metrics");
    let counted = format!("mesh_impostor_messages_total{{kind=\"raft\"}} {count}");
    assert!(metrics.contains(&counted), "{counted} in:\n{metrics}");
    for id in [1, 2, 3] {
        assert!(
            bed.term(id) < forged,
            "replica {id} reached the forged term"
        );
    }
    assert_eq!(
        bed.wait_leader().await,
        leader,
        "the leadership did not change"
    );
    assert_eq!(bed.term(leader), term);
    bed.shutdown().await;
}

fn one_module() -> Mesh {
    let mut mesh = Mesh::default();
    mesh.machines.insert("ace".into(), machine("ace"));
    mesh.modules.insert("w".into(), sleeper("w", "ace"));
    mesh
}

fn applied_on_ace(body: &Body) -> bool {
    let Body::Push(view) = body else {
        return false;
    };
    view.lines
        .iter()
        .any(|l| l.machine == "ace" && matches!(l.outcome, PushOutcome::Applied { .. }))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn g9_a_host_replaying_its_genuine_proof_with_another_digest_moves_no_term() {
    // Issue 27 part 4: the reused-term check (decision 0272) compared the digest a host *claims*
    // beside its proof with the send record, so one host certificate replaying its genuine proof
    // with another digest made the leader leave its term at every push that reached the host.
    // Only what the proof's signature covers may count.
    let bed = Bed::start(&["ace"], &[]).await;
    let leader = bed.wait_leader().await;
    bed.apply(leader, &one_module()).await;
    let pushed = bed.push(leader, "ace", &[]).await.expect("push");
    assert!(applied_on_ace(&pushed), "{pushed:?}");
    let term = bed.term(leader);
    let floor = bed.epoch_floor(leader).await;

    let genuine = bed.hosts["ace"].agent.report_now().await.expect("a report");
    let proof = genuine
        .proof
        .clone()
        .expect("ace keeps the proof of what it applied");
    assert_eq!(
        proof.header.epoch, term,
        "ace applied this leadership's envelope"
    );
    let mut replayed = genuine.clone();
    replayed.applied = Some(Digest([0xab; 32]));
    replayed.report_sequence += 1_000;
    assert_ne!(replayed.applied, Some(proof.header.digest));
    let ace = bed.endpoint_as(&Principal::Host("ace".into()));
    bed.file_report(&ace, leader, &replayed).await;

    // A raise, had there been one, committed before the reply.
    assert_eq!(bed.epoch_floor(leader).await, floor, "the floor moved");
    assert_eq!(bed.term(leader), term, "the leader left its term");
    let again = bed.push(leader, "ace", &[]).await.expect("push again");
    assert!(applied_on_ace(&again), "{again:?}");
    assert_eq!(bed.term(leader), term);
    bed.shutdown().await;
}

#[test]
fn g9_the_replicas_term_bound_is_the_hosts_epoch_bound() {
    // A term a replica may reach must be an epoch every host applies and every controller files,
    // or a leader could lead where its own sends are refused.
    assert_eq!(mesh_raft::term_max, mesh::core::envelope::epoch_max);
}

/// Sends `envelope`, sealed with replica `signer`'s key, to ace from an endpoint with `from`'s
/// certificate: what ace answered, or the transport's refusal.
async fn send_to_ace(
    bed: &Bed,
    from: &Principal,
    envelope: &Envelope,
) -> Result<EnvelopeReply, TransportError> {
    let sealed = seal(envelope, &replica_key(envelope.signer)).expect("seal");
    let host = Peer::expecting(
        bed.hosts["ace"].endpoint.local_addr(),
        Principal::Host("ace".into()),
    );
    let bytes = bed
        .endpoint_as(from)
        .request(host, MessageKind::Envelope, sealed, Duration::from_secs(5))
        .await?;
    Ok(mesh_codec::decode(envelope_reply_what, &bytes).expect("an envelope reply"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn g2_a_removed_replicas_key_and_certificate_make_no_host_apply_anything() {
    // Issue 27 part 2, decision 0294: `replicas remove` retires the replica's signing key and
    // revokes its certificate in one commit and pushes that to every host. Its key then signs
    // nothing a host applies, at any epoch, over any connection; its certificate is refused.
    let bed = Bed::start(&["ace"], &[]).await;
    let leader = bed.wait_leader().await;
    bed.apply(leader, &one_module()).await;
    let pushed = bed.push(leader, "ace", &[]).await.expect("push");
    assert!(applied_on_ace(&pushed), "{pushed:?}");
    let gone = bed.follower(leader);
    let term = bed.term(leader);
    bed.ok(leader, &Request::ReplicasRemove { id: gone }).await;
    let agent = &bed.hosts["ace"].agent;
    wait_until(
        "ace applied a declaration retiring the removed replica",
        || async {
            agent
                .applied()
                .await
                .is_some_and(|(_, d)| retired_replicas(&d.revoked).contains(&gone))
        },
    )
    .await;
    let mark = agent.high_water().await;

    let forged = bare_envelope("ace", term + 100, 1, gone);
    // Over a connection ace trusts (the leader's certificate), the retired key is not trusted.
    let through_leader = send_to_ace(&bed, &Principal::Replica(leader), &forged).await;
    assert!(
        matches!(&through_leader, Ok(EnvelopeReply::Refused { refusal, .. })
            if refusal.contains(&format!("replica {gone}, which this host does not trust"))),
        "{through_leader:?}"
    );
    // With its own certificate, ace does not even take the connection.
    let own = send_to_ace(&bed, &Principal::Replica(gone), &forged).await;
    assert!(
        matches!(&own, Err(e) if e.to_string().contains("revoked")),
        "{own:?}"
    );
    assert_eq!(agent.high_water().await, mark, "ace's mark moved");
    let again = bed.push(leader, "ace", &[]).await.expect("push");
    assert!(applied_on_ace(&again), "{again:?}");
    bed.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn promise_1_a_removal_pushes_no_change_an_operator_has_not_pushed() {
    // Decision 0294: the retirement is pushed at once only when it is all a push would send. With
    // an applied model not pushed yet, `replicas remove` pushes nothing (that change would take
    // effect unseen) and says how to carry the retirement; the operator's push then does.
    let bed = Bed::start(&["ace"], &[]).await;
    let leader = bed.wait_leader().await;
    bed.apply(leader, &one_module()).await;
    let pushed = bed.push(leader, "ace", &[]).await.expect("push");
    assert!(applied_on_ace(&pushed), "{pushed:?}");
    let mut changed = one_module();
    changed.modules.insert("w2".into(), sleeper("w2", "ace"));
    bed.apply(leader, &changed).await;
    let agent = &bed.hosts["ace"].agent;
    let mark = agent.high_water().await;

    let gone = bed.follower(leader);
    let Body::Replicas(view) = bed.ok(leader, &Request::ReplicasRemove { id: gone }).await else {
        panic!("not a replicas answer")
    };
    assert!(
        view.done
            .iter()
            .any(|l| l.starts_with("not pushed:") && l.contains("ace")),
        "{:?}",
        view.done
    );
    assert!(
        view.retired.iter().any(|r| r.id == gone),
        "{:?}",
        view.retired
    );
    assert_eq!(agent.high_water().await, mark, "the removal pushed ace");

    let pushed = bed.push(leader, "ace", &[]).await.expect("push");
    assert!(applied_on_ace(&pushed), "{pushed:?}");
    let (_, declaration) = agent.applied().await.expect("applied");
    assert!(retired_replicas(&declaration.revoked).contains(&gone));
    assert_eq!(
        declaration.modules.len(),
        2,
        "the operator's change went with it"
    );
    bed.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn g10_a_forward_or_a_report_claiming_another_id_than_its_certificate_is_refused_and_counted()
{
    // Issue 27 part 1 for the other kinds: a replica certificate forwarding as another replica,
    // a host certificate reporting as another machine (in the frame or in the body).
    use mesh::controller::api::{Answer, ApiError, Forwarded, RequestId};
    use mesh::core::report::Report;
    use mesh::core::wire::report_what;
    let bed = Bed::start(&["ace"], &[]).await;
    let leader = bed.wait_leader().await;
    let poser = bed.follower(leader);
    let other = [1, 2, 3]
        .into_iter()
        .find(|id| *id != leader && *id != poser)
        .expect("a third replica");
    let revision_before = bed.term(leader);

    let forwarded = Forwarded {
        actor: "operator:alice".into(),
        via: other,
        id: RequestId([7; 16]),
        request: Request::Status,
    };
    let body = mesh_codec::encode("forwarded request", &forwarded).expect("encode");
    let bytes = bed
        .endpoint_as(&Principal::Replica(poser))
        .request(
            bed.addrs[&leader],
            MessageKind::Forward,
            body,
            Duration::from_secs(5),
        )
        .await
        .expect("an answer");
    let answer: Answer = mesh_codec::decode("answer", &bytes).expect("decode");
    assert!(
        matches!(&answer.body, Err(ApiError::BadRequest { reason })
            if reason.contains(&format!("replica {poser} forwarded a request claiming to come via {other}"))),
        "{answer:?}"
    );

    let g14 = bed.endpoint_as(&Principal::Host("g14".into()));
    let report = |machine: &str| Report {
        machine: machine.into(),
        epoch: 0,
        sequence: 0,
        report_sequence: 1,
        applied: None,
        modules: vec![],
        refused_older: 0,
        last_refusal: None,
        proof: None,
    };
    for (frame, body) in [("ace", "ace"), ("g14", "ace")] {
        let encoded = mesh_codec::encode(report_what, &report(body)).expect("encode");
        let kind = MessageKind::Report {
            machine: frame.into(),
        };
        let sent = g14
            .request(bed.addrs[&leader], kind, encoded, Duration::from_secs(5))
            .await;
        assert!(
            matches!(&sent, Err(TransportError::Refused { .. })),
            "host:g14 reporting frame {frame} body {body}: {sent:?}"
        );
    }
    let metrics = bed.service(leader).metrics_text().expect("metrics");
    for counted in [
        "mesh_impostor_messages_total{kind=\"forward\"} 1",
        "mesh_impostor_messages_total{kind=\"report\"} 1",
    ] {
        assert!(metrics.contains(counted), "{counted} in:\n{metrics}");
    }
    assert!(
        bed.hosts["ace"].agent.high_water().await.is_none(),
        "nothing was sent"
    );
    assert_eq!(bed.term(leader), revision_before);
    bed.shutdown().await;
}
