//! Reports from hosts, and the account the controller keeps per machine from them (G5).

use serde::{Deserialize, Serialize};

use super::declaration::Digest;
use super::envelope::{EpochProof, epoch_max};

mod bounds;
pub use bounds::{
    OverBound, decode_bounded, report_drift_items_max, report_drift_text_bytes_max,
    report_modules_max, report_name_bytes_max, report_refusal_bytes_max,
    report_signature_bytes_max, report_text_bytes_max,
};

mod drift_wire;

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
    /// The signed header of the envelope applied: proves its epoch to a controller whose floor is
    /// below it (G9). `None` before any apply.
    pub proof: Option<EpochProof>,
}

/// One module's state on its host.
///
/// Its bytes are those of `drift_wire::StatusWire` (decision 0305): a module that has not drifted
/// encodes exactly as before drift was reported; a drifted one wraps its state in a variant added
/// last, so stores, logs and fixtures of earlier reports decode unchanged.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(from = "drift_wire::StatusWire", into = "drift_wire::StatusWire")]
pub struct ModuleStatus {
    pub name: String,
    pub state: ModuleState,
    /// Restarts since its supervisor started (an apply that changes the module starts a new one).
    pub restarts: u32,
    pub pid: Option<u32>,
    /// How its last run ended, kept while it is restarted: a crash loop shows its exit code.
    pub last_exit: Option<Exit>,
    /// What differs between what the host runs and the declaration it applied (a file edited, a
    /// secret or grants file changed, a mount gone, the program the command names replaced),
    /// one short text each (`conf/broker.conf changed`); empty when it runs as declared
    /// (issue 25 item 3, decision 0305). At most `report_drift_items_max` texts.
    pub drift: Vec<String>,
}

/// How a module's process ended. (The lowercase names are for JSON; bincode encodes the index.)
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Exit {
    Code(i32),
    Signal(i32),
}

impl std::fmt::Display for Exit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Exit::Code(code) => write!(f, "exit {code}"),
            Exit::Signal(signal) => write!(f, "signal {signal}"),
        }
    }
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

impl ModuleState {
    /// One word for the operator: `starting`, `waiting`, `ready`, `running`, `failed`, `stopped`.
    pub fn word(&self) -> &'static str {
        match self {
            ModuleState::Starting => "starting",
            ModuleState::Waiting { .. } => "waiting",
            ModuleState::Ready => "ready",
            ModuleState::Running => "running",
            ModuleState::Failed { .. } => "failed",
            ModuleState::Stopped => "stopped",
        }
    }
}

/// A machine's modules, as its last report shows them, summed up: what `status` says instead of
/// a plain "up to date", and what `push --wait` waits on.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Health {
    /// Every module is ready (its probe passed, or it has none and stayed up).
    Ready,
    /// None failed, but these are still starting, waiting, or running before their probe passed.
    Settling { modules: Vec<String> },
    /// These modules failed (or were stopped); a restart may be pending.
    Failing { modules: Vec<String> },
}

impl Health {
    /// The health of `modules`: failing outranks settling, which outranks ready.
    pub fn of(modules: &[ModuleStatus]) -> Health {
        let mut failing = Vec::new();
        let mut settling = Vec::new();
        for m in modules {
            match m.state {
                ModuleState::Ready => {}
                ModuleState::Failed { .. } | ModuleState::Stopped => failing.push(m.name.clone()),
                ModuleState::Starting | ModuleState::Waiting { .. } | ModuleState::Running => {
                    settling.push(m.name.clone())
                }
            }
        }
        if !failing.is_empty() {
            Health::Failing { modules: failing }
        } else if !settling.is_empty() {
            Health::Settling { modules: settling }
        } else {
            Health::Ready
        }
    }
}

/// Where a machine stands after a send, for `push --wait`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Settled {
    /// No report of this send (or a later one) yet, or its modules are still settling.
    Pending,
    /// Its report for this send (or a later one) shows every module ready.
    Ready,
    /// Its report for this send (or a later one) shows these modules failing.
    Failing(Vec<String>),
}

/// Whether the send of `sent_sequence` has settled, from the machine's last report: its sequence
/// and its modules' health. A later send's report settles it too: that is what the machine runs.
pub fn settled(sent_sequence: u64, reported_sequence: Option<u64>, health: &Health) -> Settled {
    if reported_sequence.is_none_or(|s| s < sent_sequence) {
        return Settled::Pending;
    }
    match health {
        Health::Ready => Settled::Ready,
        Health::Settling { .. } => Settled::Pending,
        Health::Failing { modules } => Settled::Failing(modules.clone()),
    }
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
    /// Whether its epoch, sequence or report counter is above [`epoch_max`]: no real host gets
    /// there, so the report is corrupt or forged and is refused before it touches the floor.
    pub fn beyond_bound(&self) -> bool {
        self.epoch > epoch_max || self.sequence > epoch_max || self.report_sequence > epoch_max
    }

    pub fn position(&self) -> ReportPosition {
        ReportPosition {
            epoch: self.epoch,
            sequence: self.sequence,
            report_sequence: self.report_sequence,
        }
    }

    /// Whether `other` says what this report says, its report sequence aside: same machine,
    /// envelope, applied digest, module states (restarts, pids and last exits too), refusals and
    /// proof. Such a report only says "still here"; the leader keeps that in memory and files
    /// nothing (decision 0216). Every field is named, so a new one must be decided here.
    pub fn says_the_same(&self, other: &Report) -> bool {
        let Report {
            machine,
            epoch,
            sequence,
            report_sequence: _,
            applied,
            modules,
            refused_older,
            last_refusal,
            proof,
        } = self;
        *machine == other.machine
            && *epoch == other.epoch
            && *sequence == other.sequence
            && *applied == other.applied
            && *modules == other.modules
            && *refused_older == other.refused_older
            && *last_refusal == other.last_refusal
            && *proof == other.proof
    }
}

/// How drift moved from one report of a machine to the next (decision 0305): the modules whose
/// drift appeared or changed (with what differs now) and those whose drift cleared. For whoever
/// turns filed reports into events; both empty when drift did not move. Pure.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DriftMoves {
    pub appeared: Vec<(String, Vec<String>)>,
    pub cleared: Vec<String>,
}

impl DriftMoves {
    /// From `before` (the account's last report, if any) to `after`. A module that left the
    /// report (removed by a push) clears nothing: it is gone, not repaired.
    pub fn between(before: Option<&Report>, after: &Report) -> DriftMoves {
        let drift_before = |name: &str| {
            before
                .and_then(|b| b.modules.iter().find(|m| m.name == name))
                .map(|m| m.drift.as_slice())
        };
        let mut moves = DriftMoves::default();
        for m in &after.modules {
            let was = drift_before(&m.name).unwrap_or(&[]);
            if m.drift.is_empty() && !was.is_empty() {
                moves.cleared.push(m.name.clone());
            } else if !m.drift.is_empty() && m.drift != was {
                moves.appeared.push((m.name.clone(), m.drift.clone()));
            }
        }
        moves
    }

    pub fn is_empty(&self) -> bool {
        self.appeared.is_empty() && self.cleared.is_empty()
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
    /// When the leader filed `report`: its wall clock (ms since the Unix epoch) in the proposal
    /// that filed it, so every replica stores the same value. Shown as the report's age.
    pub filed_ms: Option<u64>,
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
    /// Files `report` if it is strictly newer than the last one filed (G5), stamped `filed_ms`.
    pub fn file_at(&mut self, report: Report, filed_ms: u64) -> Filed {
        let filed = self.file(report);
        if filed == Filed::Accepted {
            self.filed_ms = Some(filed_ms);
        }
        filed
    }

    /// Files `report` if it is strictly newer than the last one filed and than `heard`, the
    /// highest position the leader heard from the host without filing it (decision 0216): a
    /// report at or below either is refused and counted once, and changes nothing else (G5).
    pub fn file_above(
        &mut self,
        report: Report,
        heard: Option<ReportPosition>,
        filed_ms: u64,
    ) -> Filed {
        let got = report.position();
        let high = self.last.max(heard);
        if let Some(high) = high
            && got <= high
        {
            self.refused_older += 1;
            self.last_refused = Some(got);
            return Filed::RefusedOlder { got, last: high };
        }
        self.file_at(report, filed_ms)
    }

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
            proof: None,
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

    fn module(name: &str, state: ModuleState) -> ModuleStatus {
        ModuleStatus {
            name: name.into(),
            state,
            restarts: 0,
            pid: None,
            last_exit: None,
            drift: Vec::new(),
        }
    }

    #[test]
    fn a_failing_module_outranks_a_settling_one_and_ready_needs_every_module_ready() {
        // Issue 9 part 5: health is part of the account; "applied" alone is not "up to date".
        let ready = module("db", ModuleState::Ready);
        let waiting = module(
            "app",
            ModuleState::Waiting {
                on: "endpoint 127.0.0.1:5432 of provision p1".into(),
            },
        );
        let failed = module(
            "crash",
            ModuleState::Failed {
                error: "exited with code 3".into(),
            },
        );
        assert_eq!(Health::of(&[ready.clone()]), Health::Ready);
        assert_eq!(
            Health::of(&[ready.clone(), waiting.clone()]),
            Health::Settling {
                modules: vec!["app".into()]
            }
        );
        let failing = Health::of(&[ready, waiting, failed]);
        assert_eq!(
            failing,
            Health::Failing {
                modules: vec!["crash".into()]
            }
        );
        let running = Health::of(&[module("web", ModuleState::Running)]);
        assert!(matches!(running, Health::Settling { .. }), "{running:?}");
    }

    #[test]
    fn a_send_settles_only_on_a_report_of_it_or_a_later_send() {
        // Issue 9 part 5: `push --wait` waits for the report of its own send.
        assert_eq!(settled(4, None, &Health::Ready), Settled::Pending);
        assert_eq!(settled(4, Some(3), &Health::Ready), Settled::Pending);
        assert_eq!(settled(4, Some(4), &Health::Ready), Settled::Ready);
        assert_eq!(settled(4, Some(5), &Health::Ready), Settled::Ready);
        let settling = Health::Settling {
            modules: vec!["app".into()],
        };
        assert_eq!(settled(4, Some(4), &settling), Settled::Pending);
        let failing = Health::Failing {
            modules: vec!["crash".into()],
        };
        assert_eq!(
            settled(4, Some(4), &failing),
            Settled::Failing(vec!["crash".into()])
        );
    }

    #[test]
    fn filing_stamps_the_time_only_of_an_accepted_report() {
        // G5: a refused report changes nothing, not even the filing time.
        let mut account = Account::default();
        assert_eq!(account.file_at(report(1, 2, 3), 1_000), Filed::Accepted);
        assert_eq!(account.filed_ms, Some(1_000));
        assert!(matches!(
            account.file_at(report(1, 2, 2), 2_000),
            Filed::RefusedOlder { .. }
        ));
        assert_eq!(account.filed_ms, Some(1_000));
    }

    #[test]
    fn g5_a_report_at_or_below_the_heard_position_is_refused_and_counted_once() {
        // Decision 0216: a report the leader heard but did not file still orders the account.
        let mut account = Account::default();
        assert_eq!(
            account.file_above(report(1, 1, 5), None, 10),
            Filed::Accepted
        );
        let heard = Some(report(1, 1, 9).position());
        let late = account.file_above(report(1, 1, 7), heard, 20);
        assert_eq!(
            late,
            Filed::RefusedOlder {
                got: report(1, 1, 7).position(),
                last: report(1, 1, 9).position()
            }
        );
        assert_eq!(account.refused_older, 1);
        assert_eq!(account.last, Some(report(1, 1, 5).position()));
        assert_eq!(account.filed_ms, Some(10));
        assert_eq!(account.file_above(report(1, 1, 9), heard, 30), late_at(9));
        assert_eq!(account.refused_older, 2);
        assert_eq!(
            account.file_above(report(1, 1, 10), heard, 40),
            Filed::Accepted
        );
        assert_eq!(account.last, Some(report(1, 1, 10).position()));
    }

    fn late_at(r: u64) -> Filed {
        Filed::RefusedOlder {
            got: report(1, 1, r).position(),
            last: report(1, 1, 9).position(),
        }
    }

    #[test]
    fn a_report_says_the_same_whatever_its_report_sequence_but_not_with_another_restart() {
        let a = report(1, 2, 3);
        let mut b = report(1, 2, 4);
        assert!(a.says_the_same(&b));
        b.modules.push(module("web", ModuleState::Ready));
        assert!(!a.says_the_same(&b));
        let mut c = a.clone();
        c.modules.push(module("web", ModuleState::Ready));
        c.modules[0].restarts = 1;
        assert!(!c.says_the_same(&b));
        assert!(!report(1, 3, 3).says_the_same(&a));
    }

    #[test]
    fn drift_moves_name_the_modules_whose_drift_appeared_changed_or_cleared() {
        // Decision 0305: the transition an event hook reads off two filed reports.
        let with = |drifts: &[(&str, &[&str])]| {
            let mut r = report(1, 2, 3);
            for (name, drift) in drifts {
                let mut m = module(name, ModuleState::Ready);
                m.drift = drift.iter().map(|d| d.to_string()).collect();
                r.modules.push(m);
            }
            r
        };
        let clean = with(&[("broker", &[]), ("web", &[])]);
        let edited = with(&[("broker", &["conf/broker.conf changed"]), ("web", &[])]);
        assert!(DriftMoves::between(Some(&clean), &clean).is_empty());
        assert!(DriftMoves::between(None, &clean).is_empty());
        let appeared = DriftMoves::between(Some(&clean), &edited);
        assert_eq!(
            appeared.appeared,
            [(
                "broker".to_string(),
                vec!["conf/broker.conf changed".to_string()]
            )]
        );
        assert!(appeared.cleared.is_empty());
        assert!(DriftMoves::between(Some(&edited), &edited).is_empty());
        let more = with(&[(
            "broker",
            &["conf/broker.conf changed", "mount data missing"],
        )]);
        assert_eq!(DriftMoves::between(Some(&edited), &more).appeared.len(), 1);
        let cleared = DriftMoves::between(Some(&edited), &clean);
        assert_eq!(cleared.cleared, ["broker"]);
        assert!(cleared.appeared.is_empty());
        let gone = with(&[("web", &[])]);
        assert!(
            DriftMoves::between(Some(&edited), &gone).is_empty(),
            "removed, not repaired"
        );
    }

    #[test]
    fn drift_appearing_or_clearing_is_a_change_the_leader_files() {
        // Decision 0216 with 0305: a report that only differs in drift is not "still here".
        let mut clean = report(1, 2, 3);
        clean.modules.push(module("broker", ModuleState::Ready));
        let mut drifted = report(1, 2, 4);
        drifted.modules.push(module("broker", ModuleState::Ready));
        drifted.modules[0].drift = vec!["conf/broker.conf changed".into()];
        assert!(!clean.says_the_same(&drifted), "drift appearing");
        assert!(!drifted.says_the_same(&clean), "drift clearing");
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
