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
use mesh::controller::api::{Body, PushOutcome};
use mesh::core::envelope::seal;
use mesh::core::model::Mesh;
use mesh::core::wire::{EnvelopeReply, envelope_reply_what};
use mesh_transport::{MessageKind, Peer, Principal};

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

/// A bed whose leader applied one module on ace and pushed it; the leader and its term.
async fn pushed_once() -> (Bed, u64, u64) {
    let bed = Bed::start(&["ace"], &[]).await;
    let leader = bed.wait_leader().await;
    bed.apply(leader, &one_module()).await;
    let first = bed.push(leader, "ace", &[]).await.expect("first push");
    assert!(
        matches!(outcome(&first, "ace"), Some(PushOutcome::Applied { .. })),
        "{first:?}"
    );
    let term = bed.term(leader);
    (bed, leader, term)
}

/// A leadership this cluster does not remember (replica 2's key) sends ace an envelope of
/// `epoch.sequence` straight to the host; ace applies it and will report the epoch with the
/// signed header as its proof.
async fn ace_applies_another_leaderships(bed: &Bed, epoch: u64, sequence: u64) {
    let envelope = bare_envelope("ace", epoch, sequence, 2);
    let sealed = seal(&envelope, &replica_key(2)).expect("seal");
    let other = bed.endpoint_as(&Principal::Replica(2));
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
}

/// Waits until a leader above term `above` pushes ace and ace applies it.
async fn a_push_reaches_ace_above(bed: &Bed, above: u64, what: &str) {
    wait_until(what, || async {
        let (via, _) = bed.wait_leader_among(&[1, 2, 3], above).await;
        let pushed = bed.push(via, "ace", &[]).await;
        matches!(
            pushed.as_ref().map(|b| outcome(b, "ace")),
            Ok(Some(PushOutcome::Applied { .. }))
        )
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn g9_a_proven_epoch_above_the_term_moves_the_cluster_above_it_and_pushes_reach_the_host() {
    // G9: hosts fence on (epoch, sequence); a host that applied epoch E refuses anything below.
    // Once its report proves E, the cluster's leader must lead in a term above E, and a push from
    // it must be applied by the host, with every replica still running.
    let (bed, _, term) = pushed_once().await;

    // A leader this cluster forgot (replica 2's key, epoch well above the term) sent ace an
    // envelope; ace applies it and reports the epoch with its signed header as proof.
    let epoch = term + 5;
    let sent = Instant::now();
    ace_applies_another_leaderships(&bed, epoch, 1_000).await;

    // The cluster leads above the proven epoch without a restart, with the floor raised to it.
    let (now, now_term) = bed.wait_leader_among(&[1, 2, 3], epoch).await;
    println!(
        "leader {now} in term {now_term} above the proven epoch {epoch} (was term {term}) {} ms after the envelope",
        sent.elapsed().as_millis()
    );
    let floor = bed.epoch_floor(now).await;
    assert!(floor >= epoch, "floor {floor}");
    // And its push reaches the host, which accepts it over the forgotten leader's envelope.
    a_push_reaches_ace_above(&bed, epoch, "a push applied on ace above the proven epoch").await;
    // Every replica follows into the new term (none is left below the floor).
    wait_until("every replica in a term above the proven epoch", || {
        let terms: BTreeMap<u64, u64> =
            bed.replicas.keys().map(|id| (*id, bed.term(*id))).collect();
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
    let term = bed.term(leader);
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
    use mesh::core::wire::ReportReply;
    let (bed, leader, term) = pushed_once().await;
    let before = bed.epoch_floor(leader).await;

    // A host certificate alone claims T.5000: filed, and the term stays.
    let claimant = bed.endpoint_as(&Principal::Host("ace".into()));
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
    let reply = bed.file_report(&claimant, leader, &claim).await;
    assert!(matches!(reply, ReportReply::Filed { .. }), "{reply:?}");
    // The raise, had there been one, is committed before the reply.
    assert_eq!(
        bed.epoch_floor(leader).await,
        before,
        "an unproven position moves nothing"
    );
    assert_eq!(bed.term(leader), term, "an unproven position moves nothing");

    // Another leadership (replica 2's key) signed T.1000 and ace applied it; ace's own report
    // carries the signed header as its proof.
    ace_applies_another_leaderships(&bed, term, 1_000).await;

    // The cluster leaves T: a leader above it, the floor above it, every replica following.
    let (now, _) = bed.wait_leader_among(&[1, 2, 3], term).await;
    let floor = bed.epoch_floor(now).await;
    assert!(floor > term, "floor {floor}");
    a_push_reaches_ace_above(
        &bed,
        term,
        "a push applied on ace in a term above the reused one",
    )
    .await;
    bed.shutdown().await;
}

/// `key`'s value in replica `id`'s `/metrics` as it would answer now.
fn metric(bed: &Bed, id: u64, key: &str) -> f64 {
    let text = bed.service(id).metrics_text().expect("metrics");
    text.lines()
        .find_map(|l| l.strip_prefix(key)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or_else(|| panic!("no {key} on replica {id}:\n{text}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_cut_off_from_the_others_stops_counting_the_fleet_and_the_new_leader_counts_it() {
    // Issue 25 item 6, decision 0311: only a leader a quorum confirmed within an election
    // timeout reports the fleet gauges. A leader cut off from the others still thinks it leads
    // (openraft 0.9 does not step down by itself) but must say 0, so an alert summing the
    // replicas never counts the fleet twice, nor every host silent from a deposed leader.
    let (bed, old, _) = pushed_once().await;
    wait_until("the leader counting ace", || async {
        metric(&bed, old, "mesh_hosts") == 1.0
    })
    .await;
    for id in [1, 2, 3].into_iter().filter(|id| *id != old) {
        assert_eq!(metric(&bed, id, "mesh_hosts"), 0.0, "follower {id}");
    }
    let (new, _) = bed.isolate_and_elect(old).await;
    wait_until("the cut-off leader saying 0", || async {
        metric(&bed, old, "mesh_hosts") == 0.0
    })
    .await;
    assert_eq!(
        bed.service(old).replica().metrics().borrow().state,
        openraft::ServerState::Leader,
        "the cut-off replica still believes it leads"
    );
    wait_until("the new leader counting ace", || async {
        metric(&bed, new, "mesh_hosts") == 1.0
    })
    .await;
    bed.shutdown().await;
}
