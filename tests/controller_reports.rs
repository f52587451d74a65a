//! Reports at fleet rate (decision 0216), over real QUIC against three replica services: a report
//! that says what the account's last report says is answered filed but not proposed, and only
//! moves the leader's in-memory "last heard"; a changed one is filed through Raft; one at or
//! below what the leader heard is refused and counted once (G5); a new leader has heard nothing.

mod controller_common;

use controller_common::{Bed, machine};
use mesh::controller::api::{Body, MachineView, Request};
use mesh::core::model::Mesh;
use mesh::core::report::{ModuleState, ModuleStatus, Report};
use mesh::core::wire::ReportReply;
use mesh_transport::Principal;

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
