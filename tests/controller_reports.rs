//! Reports at fleet rate (decision 0216), over real QUIC against three replica services: a report
//! that says what the account's last report says is answered filed but not proposed, and only
//! moves the leader's in-memory "last heard"; a changed one is filed through Raft; one at or
//! below what the leader heard is refused and counted once (G5); a new leader has heard nothing.
//! Issue 23 (decision 0299): a host's frames and reports are bounded, a follower answers without
//! decoding, and one host over its quota in the report queue does not hold up another's filing.

mod controller_common;

use std::time::Duration;

use controller_common::{Bed, machine};
use mesh::controller::api::{Body, MachineView, Request};
use mesh::core::declaration::Digest;
use mesh::core::envelope::{EnvelopeHeader, EpochProof, epoch_max};
use mesh::core::model::Mesh;
use mesh::core::report::{
    Exit, ModuleState, ModuleStatus, Report, report_drift_items_max, report_drift_text_bytes_max,
    report_modules_max, report_name_bytes_max, report_refusal_bytes_max,
    report_signature_bytes_max, report_text_bytes_max,
};
use mesh::core::wire::{ReportReply, report_reply_what, report_what};
use mesh_transport::{Header, MessageKind, Principal, TransportError, report_frame_bytes_max};

fn report(report_sequence: u64, restarts: u32) -> Report {
    Report {
        machine: "ace".into(),
        epoch: 0,
        sequence: 0,
        report_sequence,
        applied: None,
        modules: vec![ModuleStatus {
            name: "web".into(),
            state: ModuleState::Ready,
            restarts,
            pid: Some(42),
            last_exit: None,
            drift: Vec::new(),
        }],
        refused_older: 0,
        last_refusal: None,
        proof: None,
    }
}

async fn ace(bed: &Bed, id: u64) -> MachineView {
    let Body::Status(status) = bed.ok(id, &Request::Status).await else {
        panic!("status")
    };
    status
        .machines
        .into_iter()
        .find(|m| m.name == "ace")
        .expect("ace in status")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn g5_an_unchanged_report_is_heard_not_proposed_and_a_new_leader_has_heard_nothing() {
    let fake = "127.0.0.1:9".parse().expect("addr");
    let mut bed = Bed::start(&[], &[("ace", fake)]).await;
    let leader = bed.wait_leader().await;
    let mut mesh = Mesh::default();
    mesh.machines.insert("ace".into(), machine("ace"));
    bed.apply(leader, &mesh).await;
    let host = bed.endpoint_as(&Principal::Host("ace".into()));
    let proposals = || bed.service(leader).replica().proposals_total();
    let filed = ReportReply::Filed { accepted: true };

    // The first report is new: filed through Raft.
    let before = proposals();
    assert_eq!(bed.file_report(&host, leader, &report(10, 0)).await, filed);
    assert_eq!(proposals(), before + 1, "a new report is one proposal");
    let first = ace(&bed, leader).await;
    assert_eq!(first.last_report.map(|r| r.2), Some(10));
    assert_eq!(first.refused_reports, 0, "{first:?}");
    assert!(first.heard_ago_ms.is_some(), "{first:?}");

    // The same again, later: answered filed, not proposed; only "heard" moves.
    let before = proposals();
    assert_eq!(bed.file_report(&host, leader, &report(12, 0)).await, filed);
    assert_eq!(proposals(), before, "an unchanged report is not proposed");
    let heard = ace(&bed, leader).await;
    assert_eq!(
        heard.last_report.map(|r| r.2),
        Some(10),
        "durable unchanged"
    );
    assert_eq!(heard.refused_reports, 0, "{heard:?}");
    assert_eq!(heard.report_filed_ms, first.report_filed_ms);
    assert!(heard.heard_ago_ms.is_some(), "{heard:?}");

    // Report 11 comes late: below what the leader heard (12), so refused and counted once,
    // though it is newer than the account's last (10).
    let before = proposals();
    let late = bed.file_report(&host, leader, &report(11, 1)).await;
    assert_eq!(late, ReportReply::Filed { accepted: false });
    assert_eq!(proposals(), before + 1, "a refusal is counted through Raft");
    let refused = ace(&bed, leader).await;
    assert_eq!(refused.refused_reports, 1);
    assert_eq!(refused.last_report.map(|r| r.2), Some(10));

    // A changed report (a restart): filed.
    assert_eq!(bed.file_report(&host, leader, &report(13, 1)).await, filed);
    let changed = ace(&bed, leader).await;
    assert_eq!(changed.last_report.map(|r| r.2), Some(13));
    assert_eq!(changed.modules[0].restarts, 1);

    // A new leader knows the accounts, not liveness: nothing heard until the host reports.
    let term = bed
        .service(leader)
        .replica()
        .metrics()
        .borrow()
        .current_term;
    bed.stop_replica(leader).await;
    let rest: Vec<u64> = bed.replicas.keys().copied().collect();
    let (next, _) = bed.wait_leader_among(&rest, term).await;
    let after = ace(&bed, next).await;
    assert_eq!(after.last_report.map(|r| r.2), Some(13));
    assert_eq!(after.heard_ago_ms, None, "{after:?}");
    assert_eq!(bed.file_report(&host, next, &report(14, 1)).await, filed);
    assert!(ace(&bed, next).await.heard_ago_ms.is_some());
    host.close().await;
    bed.shutdown().await;
}

async fn machine_view(bed: &Bed, id: u64, name: &str) -> MachineView {
    let Body::Status(status) = bed.ok(id, &Request::Status).await else {
        panic!("status")
    };
    status
        .machines
        .into_iter()
        .find(|m| m.name == name)
        .expect("machine in status")
}

/// A bed of three replicas whose model holds `machines` (hosts at an unreachable address), and
/// its leader.
async fn bed_with(machines: &[&str]) -> (Bed, u64) {
    let fake = "127.0.0.1:9".parse().expect("addr");
    let fakes: Vec<(&str, std::net::SocketAddr)> = machines.iter().map(|m| (*m, fake)).collect();
    let bed = Bed::start(&[], &fakes).await;
    let leader = bed.wait_leader().await;
    let mut mesh = Mesh::default();
    for m in machines {
        mesh.machines.insert((*m).into(), machine(m));
    }
    bed.apply(leader, &mesh).await;
    (bed, leader)
}

async fn ask_report(
    host: &mesh_transport::Endpoint,
    bed: &Bed,
    to: u64,
    machine: &str,
    body: Vec<u8>,
) -> Result<ReportReply, TransportError> {
    let kind = MessageKind::Report {
        machine: machine.into(),
    };
    let answer = host
        .request(bed.addrs[&to], kind, body, Duration::from_secs(5))
        .await?;
    Ok(mesh_codec::decode(report_reply_what, &answer).expect("reply"))
}

#[test]
fn the_largest_legal_report_fits_a_hosts_frame_limit() {
    // Issue 23 part 2: report_frame_bytes_max is sized from the report's bounds; a report at
    // every bound (each module failed with the longest text, every number at its widest) must
    // fit in one host frame, and the host's own limits must be within the report's.
    assert_eq!(mesh::host::validate::modules_max, report_modules_max);
    const { assert!(mesh::host::validate::name_bytes_max <= report_name_bytes_max) };
    let name = |i: usize| format!("{i:0>width$}", width = report_name_bytes_max);
    let modules = (0..report_modules_max)
        .map(|i| ModuleStatus {
            name: name(i),
            state: ModuleState::Failed {
                error: "e".repeat(report_text_bytes_max),
            },
            restarts: u32::MAX,
            pid: Some(u32::MAX),
            last_exit: Some(Exit::Signal(i32::MIN)),
            // Every module drifted at its bounds too (decision 0305).
            drift: vec!["d".repeat(report_drift_text_bytes_max); report_drift_items_max],
        })
        .collect();
    let machine = name(0);
    let report = Report {
        machine: machine.clone(),
        epoch: epoch_max,
        sequence: epoch_max,
        report_sequence: epoch_max,
        applied: Some(Digest([0xff; 32])),
        modules,
        refused_older: u64::MAX,
        last_refusal: Some("r".repeat(report_refusal_bytes_max)),
        proof: Some(EpochProof {
            header: EnvelopeHeader {
                machine: machine.clone(),
                epoch: epoch_max,
                sequence: epoch_max,
                signer: u64::MAX,
                digest: Digest([0xff; 32]),
            },
            signature: vec![0xff; report_signature_bytes_max],
        }),
    };
    assert_eq!(
        report.check_bounds(report_modules_max, "report_modules_max"),
        Ok(())
    );
    let body = mesh_codec::encode(report_what, &report).expect("encode");
    let frame =
        mesh_transport::frame::encode_header(&Header::new(MessageKind::Report { machine }, body))
            .expect("frame");
    assert!(
        frame.len() <= report_frame_bytes_max,
        "the largest legal report is a frame of {} bytes, over report_frame_bytes_max ({report_frame_bytes_max})",
        frame.len()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hosts_report_frame_over_the_limit_is_refused_naming_it_and_the_host_is_named() {
    // Issue 23 part 2: the replica reads at most report_frame_bytes_max of a host's frame and
    // says so; the leader counts it as a report over its bounds and names the host in status,
    // though no handler ever saw the frame; the host's next report is served.
    let (bed, leader) = bed_with(&["ace"]).await;
    let host = bed.endpoint_as(&Principal::Host("ace".into()));
    let body = vec![0; report_frame_bytes_max + 1];
    let err = ask_report(&host, &bed, leader, "ace", body)
        .await
        .expect_err("refused");
    let TransportError::Refused { reason, .. } = err else {
        panic!("expected a refusal, got {err:?}");
    };
    assert!(
        reason.contains("report_frame_bytes_max (1024 KiB)"),
        "{reason}"
    );
    let named = machine_view(&bed, leader, "ace")
        .await
        .report_refusal
        .expect("ace named in status for its oversized frame");
    assert!(
        named.starts_with("1 report refused") && named.contains("report_frame_bytes_max"),
        "{named}"
    );
    let metrics = bed.service(leader).metrics_text().expect("metrics");
    assert!(
        metrics.contains("mesh_reports_total{outcome=\"over_bound\"} 1"),
        "{metrics}"
    );
    assert_eq!(
        bed.file_report(&host, leader, &report(10, 0)).await,
        ReportReply::Filed { accepted: true }
    );
    host.close().await;
    bed.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_answers_a_report_not_leader_without_decoding_it() {
    // Issue 23 part 2: only the leader decodes a report; a follower names the leader from the
    // frame alone, whatever the body is. The leader refuses the same garbage.
    let (bed, leader) = bed_with(&["ace"]).await;
    let follower = bed.follower(leader);
    let host = bed.endpoint_as(&Principal::Host("ace".into()));
    let garbage = vec![0xff; 64];
    let answer = ask_report(&host, &bed, follower, "ace", garbage.clone()).await;
    assert_eq!(
        answer,
        Ok(ReportReply::NotLeader {
            leader: Some(bed.addrs[&leader].to_string())
        })
    );
    let err = ask_report(&host, &bed, leader, "ace", garbage)
        .await
        .expect_err("undecodable");
    assert!(matches!(err, TransportError::Refused { .. }), "{err:?}");
    host.close().await;
    bed.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_report_over_its_bounds_is_refused_counted_and_its_host_named() {
    // Issue 23 parts 2 and 4: more modules than a report may list is refused for good (the
    // host drops it), counted in /metrics, and the host named in status; the account is as
    // before.
    let (bed, leader) = bed_with(&["ace"]).await;
    let host = bed.endpoint_as(&Principal::Host("ace".into()));
    assert_eq!(
        bed.file_report(&host, leader, &report(10, 0)).await,
        ReportReply::Filed { accepted: true }
    );
    let mut over = report(11, 0);
    over.modules = (0..=report_modules_max)
        .map(|i| ModuleStatus {
            name: format!("m{i}"),
            ..report(0, 0).modules[0].clone()
        })
        .collect();
    let ReportReply::Refused { reason } = bed.file_report(&host, leader, &over).await else {
        panic!("expected a refusal")
    };
    assert!(reason.contains("report_modules_max"), "{reason}");
    let mut long = report(12, 0);
    long.last_refusal = Some("r".repeat(report_refusal_bytes_max + 1));
    let ReportReply::Refused { reason } = bed.file_report(&host, leader, &long).await else {
        panic!("expected a refusal")
    };
    assert!(reason.contains("report_refusal_bytes_max"), "{reason}");
    let ace = machine_view(&bed, leader, "ace").await;
    assert_eq!(
        ace.last_report.map(|r| r.2),
        Some(10),
        "nothing of it filed"
    );
    let named = ace.report_refusal.expect("ace named in status");
    assert!(named.starts_with("2 reports refused"), "{named}");
    let metrics = bed.service(leader).metrics_text().expect("metrics");
    assert!(
        metrics.contains("mesh_reports_total{outcome=\"over_bound\"} 2"),
        "{metrics}"
    );
    assert!(
        metrics.contains("mesh_hosts_reports_refused 1"),
        "{metrics}"
    );
    host.close().await;
    bed.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_host_over_its_quota_is_told_to_try_again_and_another_hosts_report_is_filed() {
    // Issue 23 part 3: while one host's reports fill its share of the leader's work (their
    // commit slowed by delaying the leader's Raft messages, below the election timeout), its
    // further reports are answered "try again" at once, before they are decoded, and another
    // host's report is queued and filed beside them. A host connection carries at most
    // host_streams_max reports at once, so ace floods over three connections, as a hostile
    // host holding several would.
    let (bed, leader) = bed_with(&["ace", "g14"]).await;
    let ace = bed.endpoint_as(&Principal::Host("ace".into()));
    let g14 = bed.endpoint_as(&Principal::Host("g14".into()));
    let filed = ReportReply::Filed { accepted: true };
    assert_eq!(bed.file_report(&ace, leader, &report(1, 0)).await, filed);
    let mut g14_report = report(1, 0);
    g14_report.machine = "g14".into();
    assert_eq!(bed.file_report(&g14, leader, &g14_report).await, filed);

    let faults = bed.service(leader).endpoint().faults();
    for (id, addr) in &bed.addrs {
        if *id != leader {
            faults.delay(*addr, Duration::from_millis(30));
        }
    }
    let flood = 12u32;
    let conns: Vec<_> = (0..3)
        .map(|_| bed.endpoint_as(&Principal::Host("ace".into())))
        .collect();
    let mut asks = Vec::new();
    for i in 0..flood {
        let body =
            mesh_codec::encode(report_what, &report(10 + u64::from(i), i + 1)).expect("encode");
        let ace = conns[i as usize % conns.len()].clone();
        let to = bed.addrs[&leader];
        asks.push(tokio::spawn(async move {
            let kind = MessageKind::Report {
                machine: "ace".into(),
            };
            let answer = ace
                .request(to, kind, body, Duration::from_secs(10))
                .await
                .expect("answer");
            mesh_codec::decode::<ReportReply>(report_reply_what, &answer).expect("reply")
        }));
    }
    g14_report.report_sequence = 2;
    g14_report.modules[0].restarts = 1;
    let g14_answer = bed.file_report(&g14, leader, &g14_report).await;
    let mut answers = Vec::new();
    for ask in asks {
        answers.push(ask.await.expect("join"));
    }
    faults.heal_all();
    assert_eq!(g14_answer, filed, "g14's report is filed while ace floods");
    let busy = answers
        .iter()
        .filter(|a| **a == ReportReply::NotLeader { leader: None })
        .count();
    let taken = answers
        .iter()
        .filter(|a| matches!(a, ReportReply::Filed { .. }))
        .count();
    assert_eq!(busy + taken, answers.len(), "{answers:?}");
    let quota = mesh::controller::reports_handled_per_host_max as usize;
    assert!(
        busy >= 1 && taken >= 1,
        "ace over its share of {quota}: {answers:?}"
    );
    let ace_view = machine_view(&bed, leader, "ace").await;
    let named = ace_view.report_refusal.expect("ace named in status");
    assert!(named.contains("reports_handled_per_host_max"), "{named}");
    assert_eq!(machine_view(&bed, leader, "g14").await.report_refusal, None);
    ace.close().await;
    for conn in conns {
        conn.close().await;
    }
    g14.close().await;
    bed.shutdown().await;
}

/// The machine's view once `silent_for_ms` says it is silent, and that many milliseconds.
async fn wait_silent(bed: &Bed, id: u64, name: &str) -> (u64, MachineView) {
    mesh_testkit::wait_value(&format!("{name} silent on replica {id}"), || async {
        let m = machine_view(bed, id, name).await;
        m.silent_for_ms.map(|ms| (ms, m))
    })
    .await
}

fn silent_gauge(bed: &Bed, id: u64) -> String {
    let metrics = bed.service(id).metrics_text().expect("metrics");
    metrics
        .lines()
        .find(|l| l.starts_with("mesh_hosts_silent "))
        .unwrap_or_else(|| panic!("no mesh_hosts_silent in\n{metrics}"))
        .to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_not_heard_for_silent_after_ms_is_silent_until_it_reports_and_a_new_leader_waits_as_long()
 {
    // Issue 25 item 4, decision 0301: a host not heard for silent_after_ms (1.5 s in this bed's
    // config) is SILENT in status, its text and the mesh_hosts_silent gauge, and clears at its
    // next report; a new leader that never heard it waits the same threshold from taking office.
    let threshold = controller_common::silent_after_ms_bed;
    let (mut bed, leader) = bed_with(&["ace"]).await;
    let host = bed.endpoint_as(&Principal::Host("ace".into()));
    let filed = ReportReply::Filed { accepted: true };

    // Heard just now: not silent.
    let reported = std::time::Instant::now();
    assert_eq!(bed.file_report(&host, leader, &report(10, 0)).await, filed);
    let heard = machine_view(&bed, leader, "ace").await;
    assert_eq!(heard.silent_for_ms, None, "{heard:?}");
    assert!(!mesh::cli::status::machine_state(&heard).contains("SILENT"));
    assert_eq!(silent_gauge(&bed, leader), "mesh_hosts_silent 0");

    // Not heard for the threshold: silent, in every place, never before the threshold.
    let (ms, silent) = wait_silent(&bed, leader, "ace").await;
    assert!(
        reported.elapsed() >= Duration::from_millis(threshold),
        "silent after {:?}, under {threshold} ms",
        reported.elapsed()
    );
    assert!(ms >= threshold, "{silent:?}");
    assert!(
        silent.heard_ago_ms.is_some_and(|h| h >= threshold),
        "{silent:?}"
    );
    let state = mesh::cli::status::machine_state(&silent);
    assert!(state.starts_with("SILENT for "), "{state}");
    assert!(!state.contains("up to date"), "{state}");
    assert_eq!(silent_gauge(&bed, leader), "mesh_hosts_silent 1");

    // It reports again (unchanged: only heard, not proposed): it clears by itself.
    assert_eq!(bed.file_report(&host, leader, &report(12, 0)).await, filed);
    let back = machine_view(&bed, leader, "ace").await;
    assert_eq!(back.silent_for_ms, None, "{back:?}");
    assert_eq!(silent_gauge(&bed, leader), "mesh_hosts_silent 0");

    // A new leader has not heard ace: not silent while it has led less than the threshold, and
    // not heard (so never "up to date"); silent once it has led that long.
    let term = bed.term(leader);
    bed.stop_replica(leader).await;
    let rest: Vec<u64> = bed.replicas.keys().copied().collect();
    let (next, _) = bed.wait_leader_among(&rest, term).await;
    let elected = std::time::Instant::now();
    let fresh = machine_view(&bed, next, "ace").await;
    assert_eq!(fresh.heard_ago_ms, None, "{fresh:?}");
    if elected.elapsed() < Duration::from_millis(threshold) {
        assert_eq!(
            fresh.silent_for_ms, None,
            "a leader new to office: {fresh:?}"
        );
    }
    let (ms, never) = wait_silent(&bed, next, "ace").await;
    assert!(ms >= threshold, "led at least the threshold: {never:?}");
    assert_eq!(never.heard_ago_ms, None, "{never:?}");
    assert_eq!(silent_gauge(&bed, next), "mesh_hosts_silent 1");
    assert_eq!(bed.file_report(&host, next, &report(14, 0)).await, filed);
    assert_eq!(machine_view(&bed, next, "ace").await.silent_for_ms, None);
    assert_eq!(silent_gauge(&bed, next), "mesh_hosts_silent 0");
    host.close().await;
    bed.shutdown().await;
}
