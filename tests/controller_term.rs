//! G9 at run time (decision 0151): a host that proves an epoch above the cluster's term (it
//! applied an envelope from a leader this cluster's store does not remember) makes the cluster
//! move its term above that epoch at once, so the next push reaches the host — no restart. A
//! proven position in the leader's own term that its store never recorded makes it leave the term
//! (decision 0272). And a leader that stops hands its leadership to an up-to-date follower first
//! (decision 0152).

mod controller_common;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use controller_common::*;
use mesh::controller::api::{Body, PushOutcome, Request};
use mesh::core::declaration::Declaration;
use mesh::core::envelope::{Envelope, seal};
use mesh::core::model::Mesh;
use mesh::core::wire::{EnvelopeReply, envelope_reply_what};
use mesh_transport::{Endpoint, MessageKind, Peer, Principal};

fn outcome(body: &Body, machine: &str) -> Option<PushOutcome> {
    let Body::Push(view) = body else {
        panic!("not a push answer: {body:?}")
    };
    view.lines
        .iter()
        .find(|l| l.machine == machine)
        .map(|l| l.outcome.clone())
}

fn one_module() -> Mesh {
    let mut mesh = Mesh::default();
    mesh.machines.insert("ace".into(), machine("ace"));
    mesh.modules.insert("w".into(), sleeper("w", "ace"));
    mesh
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn g9_a_proven_epoch_above_the_term_moves_the_cluster_above_it_and_pushes_reach_the_host() {
    // G9: hosts fence on (epoch, sequence); a host that applied epoch E refuses anything below.
    // Once its report proves E, the cluster's leader must lead in a term above E, and a push from
    // it must be applied by the host, with every replica still running.
    let bed = Bed::start(&["ace"], &[]).await;
    let leader = bed.wait_leader().await;
    bed.apply(leader, &one_module()).await;
    let first = bed.push(leader, "ace", &[]).await.expect("first push");
    assert!(
        matches!(outcome(&first, "ace"), Some(PushOutcome::Applied { .. })),
        "{first:?}"
    );
    let term = bed
        .service(leader)
        .replica()
        .metrics()
        .borrow()
        .current_term;

    // A leader this cluster forgot (replica 2's key, epoch well above the term) sent ace an
    // envelope; ace applies it and reports the epoch with its signed header as proof.
    let epoch = term + 5;
    let envelope = Envelope {
        machine: "ace".into(),
        epoch,
        sequence: 1_000,
        signer: 2,
        moves: vec![],
        declaration: Declaration {
            machine: "ace".into(),
            modules: vec![],
            revoked: Default::default(),
            signers: Default::default(),
        },
    };
    let sealed = seal(&envelope, &replica_key(2)).expect("seal");
    let forgotten = Endpoint::bind(
        "127.0.0.1:0".parse().expect("addr"),
        &bed.pki.identity(&Principal::Replica(2)),
        transport().check().expect("transport"),
    )
    .expect("bind");
    let host = Peer::expecting(
        bed.hosts["ace"].endpoint.local_addr(),
        Principal::Host("ace".into()),
    );
    let sent = Instant::now();
    let reply = forgotten
        .request(host, MessageKind::Envelope, sealed, Duration::from_secs(5))
        .await
        .expect("ace answers");
    let reply: EnvelopeReply = mesh_codec::decode(envelope_reply_what, &reply).expect("reply");
    assert!(matches!(reply, EnvelopeReply::Applied { .. }), "{reply:?}");

    // The cluster leads above the proven epoch without a restart, with the floor raised to it.
    let (now, now_term) = bed.wait_leader_among(&[1, 2, 3], epoch).await;
    println!(
        "leader {now} in term {now_term} above the proven epoch {epoch} (was term {term}) {} ms after the envelope",
        sent.elapsed().as_millis()
    );
    let Body::Status(status) = bed.ok(now, &Request::Status).await else {
        panic!("status")
    };
    assert!(status.epoch_floor >= epoch, "floor {}", status.epoch_floor);
    // And its push reaches the host, which accepts it over the forgotten leader's envelope.
    wait_until("a push applied on ace above the proven epoch", || async {
        let (via, _) = bed.wait_leader_among(&[1, 2, 3], epoch).await;
        let pushed = bed.push(via, "ace", &[]).await;
        matches!(
            pushed.as_ref().map(|b| outcome(b, "ace")),
            Ok(Some(PushOutcome::Applied { .. }))
        )
    })
    .await;
    // Every replica follows into the new term (none is left below the floor).
    wait_until("every replica in a term above the proven epoch", || {
        let terms: BTreeMap<u64, u64> = bed
            .replicas
            .keys()
            .map(|id| {
                (
                    *id,
                    bed.service(*id).replica().metrics().borrow().current_term,
                )
            })
            .collect();
        std::future::ready(terms.values().all(|t| *t > epoch))
    })
    .await;
    bed.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopping_leader_hands_over_and_says_to_whom() {
    // Availability (issue 12): shutting the leader down leaves a leader behind at once — the one
    // the old leader names — instead of an election timeout later.
    let mut bed = Bed::start(&[], &[]).await;
    let leader = bed.wait_leader().await;
    let term = bed
        .service(leader)
        .replica()
        .metrics()
        .borrow()
        .current_term;
    let running = bed.replicas.remove(&leader).expect("leader runs");
    let started = Instant::now();
    let handed = running
        .shutdown()
        .await
        .expect("clean shutdown")
        .expect("the leader handed over");
    let others: Vec<u64> = bed.replicas.keys().copied().collect();
    let (now, now_term) = bed.wait_leader_among(&others, term).await;
    println!(
        "{handed}; leader {now} in term {now_term} {} ms after the shutdown began",
        started.elapsed().as_millis()
    );
    assert_eq!(now, handed.to);
    assert!(handed.to != leader && now_term > term);
    assert!(
        handed
            .to_string()
            .contains(&format!("handed over to {now}")),
        "{handed}"
    );
    bed.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn g9_a_term_another_leadership_signed_is_left_at_the_first_report_that_proves_it() {
    // G9, decision 0272: a cluster restored without its floor files can be elected again in a
    // term the hosts already saw. Two leaderships then sign the same epoch and the hosts cannot
    // tell them apart. The leader of term T that hears a proven position (T, s) its store never
    // recorded must leave T; a claim without a proof must move nothing.
    use mesh::core::report::Report;
    use mesh::core::wire::{ReportReply, report_reply_what, report_what};
    let bed = Bed::start(&["ace"], &[]).await;
    let leader = bed.wait_leader().await;
    bed.apply(leader, &one_module()).await;
    let first = bed.push(leader, "ace", &[]).await.expect("first push");
    assert!(
        matches!(outcome(&first, "ace"), Some(PushOutcome::Applied { .. })),
        "{first:?}"
    );
    let term = bed
        .service(leader)
        .replica()
        .metrics()
        .borrow()
        .current_term;
    let floor = || async {
        let Body::Status(status) = bed.ok(leader, &Request::Status).await else {
            panic!("status")
        };
        status.epoch_floor
    };
    let before = floor().await;

    // A host certificate alone claims T.5000: filed, and the term stays.
    let claimant = Endpoint::bind(
        "127.0.0.1:0".parse().expect("addr"),
        &bed.pki.identity(&Principal::Host("ace".into())),
        transport().check().expect("transport"),
    )
    .expect("bind");
    let claim = Report {
        machine: "ace".into(),
        epoch: term,
        sequence: 5_000,
        report_sequence: 1_000_000,
        applied: None,
        modules: vec![],
        refused_older: 0,
        last_refusal: None,
        proof: None,
    };
    let body = mesh_codec::encode(report_what, &claim).expect("encode");
    let kind = MessageKind::Report {
        machine: "ace".into(),
    };
    let answer = claimant
        .request(bed.addrs[&leader], kind, body, Duration::from_secs(5))
        .await
        .expect("answer");
    let reply: ReportReply = mesh_codec::decode(report_reply_what, &answer).expect("reply");
    assert!(matches!(reply, ReportReply::Filed { .. }), "{reply:?}");
    // The raise, had there been one, is committed before the reply.
    assert_eq!(floor().await, before, "an unproven position moves nothing");
    let now_term = bed
        .service(leader)
        .replica()
        .metrics()
        .borrow()
        .current_term;
    assert_eq!(now_term, term, "an unproven position moves nothing");

    // Another leadership (replica 2's key) signed T.1000 and ace applied it; ace's own report
    // carries the signed header as its proof.
    let envelope = Envelope {
        machine: "ace".into(),
        epoch: term,
        sequence: 1_000,
        signer: 2,
        moves: vec![],
        declaration: Declaration {
            machine: "ace".into(),
            modules: vec![],
            revoked: Default::default(),
            signers: Default::default(),
        },
    };
    let sealed = seal(&envelope, &replica_key(2)).expect("seal");
    let other = Endpoint::bind(
        "127.0.0.1:0".parse().expect("addr"),
        &bed.pki.identity(&Principal::Replica(2)),
        transport().check().expect("transport"),
    )
    .expect("bind");
    let host = Peer::expecting(
        bed.hosts["ace"].endpoint.local_addr(),
        Principal::Host("ace".into()),
    );
    let reply = other
        .request(host, MessageKind::Envelope, sealed, Duration::from_secs(5))
        .await
        .expect("ace answers");
    let reply: EnvelopeReply = mesh_codec::decode(envelope_reply_what, &reply).expect("reply");
    assert!(matches!(reply, EnvelopeReply::Applied { .. }), "{reply:?}");

    // The cluster leaves T: a leader above it, the floor above it, every replica following.
    let (now, _) = bed.wait_leader_among(&[1, 2, 3], term).await;
    let Body::Status(status) = bed.ok(now, &Request::Status).await else {
        panic!("status")
    };
    assert!(status.epoch_floor > term, "floor {}", status.epoch_floor);
    wait_until(
        "a push applied on ace in a term above the reused one",
        || async {
            let (via, _) = bed.wait_leader_among(&[1, 2, 3], term).await;
            let pushed = bed.push(via, "ace", &[]).await;
            matches!(
                pushed.as_ref().map(|b| outcome(b, "ace")),
                Ok(Some(PushOutcome::Applied { .. }))
            )
        },
    )
    .await;
    bed.shutdown().await;
}
