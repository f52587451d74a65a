//! Reports filed in batches (decision 0216): one `RecordReports` proposal files every report in
//! its order, each machine's account keeps the order `(epoch, sequence, report_sequence)` (G5),
//! and every report refused as not newer (than the account's last, than an earlier report of the
//! same batch, or than what the leader heard without filing) is counted exactly once.

use mesh::core::report::{Report, ReportPosition};
use mesh::store::command::{Applied, Command, Outcome, Proposal, ReportFiling};
use mesh::store::state::DomainState;

fn report(machine: &str, epoch: u64, sequence: u64, report_sequence: u64) -> Report {
    Report {
        machine: machine.into(),
        epoch,
        sequence,
        report_sequence,
        applied: None,
        modules: vec![],
        refused_older: 0,
        last_refusal: None,
        proof: None,
    }
}

fn filing(r: Report, heard: Option<ReportPosition>) -> ReportFiling {
    ReportFiling { report: r, heard }
}

fn apply(state: &mut DomainState, reports: Vec<ReportFiling>, time_ms: u64) -> Vec<bool> {
    let proposal = Proposal {
        epoch: 1,
        expect_revision: None,
        actor: "replica:1".into(),
        time_ms,
        command: Command::RecordReports { reports },
    };
    match state.apply(1, &proposal).0 {
        Outcome::Applied(Applied::Reports { accepted }) => accepted,
        other => panic!("a batch of reports answered {other:?}"),
    }
}

#[test]
fn g5_a_batch_files_every_report_in_order_and_counts_each_refusal_once() {
    let mut state = DomainState::default();
    let first = apply(
        &mut state,
        vec![
            filing(report("ace", 1, 1, 10), None),
            filing(report("bay", 1, 2, 5), None),
            // Later in the same batch and newer: it wins.
            filing(report("ace", 1, 2, 11), None),
            // Later in the batch but older than the one before it: refused, counted.
            filing(report("ace", 1, 1, 12), None),
            // A replay of an earlier report of the batch: refused, counted.
            filing(report("bay", 1, 2, 5), None),
        ],
        1_000,
    );
    assert_eq!(first, [true, true, true, false, false]);
    let ace = &state.accounts["ace"];
    assert_eq!(ace.last, Some(report("ace", 1, 2, 11).position()));
    assert_eq!(ace.report.as_ref().map(|r| r.report_sequence), Some(11));
    assert_eq!(ace.refused_older, 1);
    assert_eq!(ace.last_refused, Some(report("ace", 1, 1, 12).position()));
    assert_eq!(ace.filed_ms, Some(1_000));
    assert_eq!(state.accounts["bay"].refused_older, 1);

    // The leader heard ace at report 20 without filing it: 15 is older than that, 21 is not.
    let heard = Some(report("ace", 1, 2, 20).position());
    let second = apply(
        &mut state,
        vec![
            filing(report("ace", 1, 2, 15), heard),
            filing(report("ace", 1, 2, 21), heard),
            filing(report("bay", 1, 3, 1), None),
        ],
        2_000,
    );
    assert_eq!(second, [false, true, true]);
    let ace = &state.accounts["ace"];
    assert_eq!(ace.last, Some(report("ace", 1, 2, 21).position()));
    assert_eq!(
        ace.refused_older, 2,
        "each refusal counted once, none twice"
    );
    assert_eq!(ace.filed_ms, Some(2_000));
    let bay = &state.accounts["bay"];
    assert_eq!(bay.last, Some(report("bay", 1, 3, 1).position()));
    assert_eq!(bay.refused_older, 1);
}

#[test]
fn g4_a_batch_of_reports_decided_under_another_term_files_nothing() {
    let mut state = DomainState::default();
    let proposal = Proposal {
        epoch: 1,
        expect_revision: None,
        actor: "replica:1".into(),
        time_ms: 1,
        command: Command::RecordReports {
            reports: vec![filing(report("ace", 1, 1, 1), None)],
        },
    };
    let (outcome, _) = state.apply(2, &proposal);
    assert!(matches!(outcome, Outcome::Refused(_)), "{outcome:?}");
    assert!(state.accounts.is_empty());
}
