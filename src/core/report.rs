//! Reports from hosts, and the account the controller keeps per machine from them (G5).

use serde::{Deserialize, Serialize};

use super::declaration::Digest;

/// What a host says after an apply or on its reconcile interval.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Report {
    pub machine: String,
    /// The envelope last applied: its epoch and sequence (0, 0 before any).
    pub epoch: u64,
    pub sequence: u64,
    /// The host's own persisted counter, strictly increasing across restarts.
    pub report_sequence: u64,
    pub applied: Option<Digest>,
    pub modules: Vec<ModuleStatus>,
    pub refused_older: u64,
    pub last_refusal: Option<String>,
}

/// One module's state on its host.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ModuleStatus {
    pub name: String,
    pub state: ModuleState,
    pub restarts: u32,
    pub pid: Option<u32>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ModuleState {
    Starting,
    /// Waiting for a module in `after`, or a provider's endpoint; says which.
    Waiting {
        on: String,
    },
    Ready,
    Running,
    Failed {
        error: String,
    },
    Stopped,
}

/// Where a report sits in a machine's order: `(epoch, sequence, report_sequence)`, compared in
/// that order (G5).
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
pub struct ReportPosition {
    pub epoch: u64,
    pub sequence: u64,
    pub report_sequence: u64,
}

impl std::fmt::Display for ReportPosition {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "epoch {} sequence {} report {}",
            self.epoch, self.sequence, self.report_sequence
        )
    }
}

impl Report {
    pub fn position(&self) -> ReportPosition {
        ReportPosition {
            epoch: self.epoch,
            sequence: self.sequence,
            report_sequence: self.report_sequence,
        }
    }
}

/// What the controller keeps per machine from its reports. Only a report strictly newer than
/// `last` is filed; any other is refused and counted, and changes nothing else.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Account {
    pub last: Option<ReportPosition>,
    pub report: Option<Report>,
    pub refused_older: u64,
    pub last_refused: Option<ReportPosition>,
}

/// What filing one report did.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Filed {
    Accepted,
    /// Not newer than `last`: a reconcile report overtaken by a later apply, or a replay.
    RefusedOlder {
        got: ReportPosition,
        last: ReportPosition,
    },
}

impl Account {
    /// Files `report` if it is strictly newer than the last one filed (G5).
    pub fn file(&mut self, report: Report) -> Filed {
        let got = report.position();
        if let Some(last) = self.last
            && got <= last
        {
            self.refused_older += 1;
            self.last_refused = Some(got);
            return Filed::RefusedOlder { got, last };
        }
        self.last = Some(got);
        self.report = Some(report);
        Filed::Accepted
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn report(epoch: u64, sequence: u64, report_sequence: u64) -> Report {
        Report {
            machine: "ace".into(),
            epoch,
            sequence,
            report_sequence,
            applied: None,
            modules: vec![],
            refused_older: 0,
            last_refusal: None,
        }
    }

    #[test]
    fn g5_reconcile_report_overtaken_by_a_later_apply_report_is_refused() {
        // G5: a periodic reconcile report arriving after a later apply report must not regress.
        let mut account = Account::default();
        assert_eq!(account.file(report(2, 5, 11)), Filed::Accepted);
        let late = account.file(report(2, 4, 10));
        assert!(matches!(late, Filed::RefusedOlder { .. }));
        assert_eq!(account.last, Some(report(2, 5, 11).position()));
        assert_eq!(account.refused_older, 1);
        assert_eq!(account.last_refused, Some(report(2, 4, 10).position()));
        assert!(matches!(
            account.file(report(2, 5, 11)),
            Filed::RefusedOlder { .. }
        ));
        assert_eq!(account.file(report(3, 1, 12)), Filed::Accepted);
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        #[test]
        fn g5_any_permutation_of_reports_never_regresses_and_counts_the_out_of_order(
            // A small domain, so replays (equal positions) occur too.
            positions in proptest::collection::vec((0u64..3, 0u64..3, 0u64..8), 1..40),
            order in any::<u64>(),
        ) {
            // G5: ordered by (epoch, sequence, report_sequence); older ones refused and counted.
            let mut stream = positions;
            let mut state = order;
            for i in (1..stream.len()).rev() {
                state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                stream.swap(i, (state >> 33) as usize % (i + 1));
            }
            let mut account = Account::default();
            let mut high: Option<ReportPosition> = None;
            let mut out_of_order = 0u64;
            for (e, s, r) in stream {
                let before = account.last;
                let filed = account.file(report(e, s, r));
                let p = report(e, s, r).position();
                if high.is_some_and(|h| p <= h) {
                    out_of_order += 1;
                    prop_assert!(matches!(filed, Filed::RefusedOlder { .. }), "refused");
                    prop_assert_eq!(account.last, before);
                } else {
                    prop_assert_eq!(filed, Filed::Accepted);
                    high = Some(p);
                }
                prop_assert!(account.last >= before);
                prop_assert_eq!(account.report.as_ref().map(|r| r.position()), account.last);
            }
            prop_assert_eq!(account.refused_older, out_of_order);
            prop_assert_eq!(account.last, high);
        }
    }
}
