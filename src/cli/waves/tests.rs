//! Tests of wave splitting and of the walk's stop rule, against a scripted leader (decision 0315).

use std::collections::BTreeMap;

use super::*;
use crate::controller::api::{PlannedMachine, PushLine};
use crate::core::declaration::Digest;
use crate::store::command::HeldMount;

fn names(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| s.to_string()).collect()
}

fn waves(list: &[&[&str]]) -> Vec<Vec<String>> {
    list.iter().map(|w| names(w)).collect()
}

fn applied(machine: &str, reason: &str) -> PushLine {
    PushLine {
        machine: machine.into(),
        outcome: PushOutcome::Applied {
            reason: reason.into(),
            sequence: 2,
            digest: Digest([4; 32]),
        },
    }
}

#[test]
fn wave_sizes_count_machines_or_round_a_percentage_down_to_at_least_one() {
    let ten: Vec<String> = (0..10).map(|i| format!("m{i}")).collect();
    let sizes = |size| -> Vec<usize> {
        split(&ten, Some(size), &Canary::None)
            .expect("split")
            .iter()
            .map(Vec::len)
            .collect()
    };
    assert_eq!(sizes(WaveSize::Machines(3)), vec![3, 3, 3, 1]);
    assert_eq!(sizes(WaveSize::Machines(10)), vec![10]);
    assert_eq!(sizes(WaveSize::Machines(50)), vec![10]);
    // 25% of 10 is 2.5: rounded down to 2.
    assert_eq!(sizes(WaveSize::Percent(25)), vec![2, 2, 2, 2, 2]);
    // 1% of 10 is 0.1: at least one machine per wave.
    assert_eq!(sizes(WaveSize::Percent(1)), vec![1; 10]);
    assert_eq!(sizes(WaveSize::Percent(100)), vec![10]);
    // Plan order is kept, every target exactly once.
    let flat: Vec<String> = split(&ten, Some(WaveSize::Machines(4)), &Canary::None)
        .expect("split")
        .concat();
    assert_eq!(flat, ten);
    assert!(
        split(&[], Some(WaveSize::Machines(2)), &Canary::None)
            .expect("split")
            .is_empty()
    );
    assert_eq!(parse_wave("3"), Ok(WaveSize::Machines(3)));
    assert_eq!(parse_wave("25%"), Ok(WaveSize::Percent(25)));
    for bad in ["0", "0%", "101%", "-1", "x", "2.5", "%"] {
        assert!(parse_wave(bad).is_err(), "{bad} accepted");
    }
}

#[test]
fn a_canary_goes_alone_in_the_first_wave_and_the_percentage_counts_every_target() {
    let five = names(&["a", "b", "c", "d", "e"]);
    let split_with = |size, canary| split(&five, size, &canary).expect("split");
    assert_eq!(
        split_with(Some(WaveSize::Machines(2)), Canary::First),
        waves(&[&["a"], &["b", "c"], &["d", "e"]])
    );
    assert_eq!(
        split_with(Some(WaveSize::Machines(2)), Canary::Named("c".into())),
        waves(&[&["c"], &["a", "b"], &["d", "e"]])
    );
    // 40% of the 5 targets (the canary counted) is 2.
    assert_eq!(
        split_with(Some(WaveSize::Percent(40)), Canary::First),
        waves(&[&["a"], &["b", "c"], &["d", "e"]])
    );
    // A canary without a wave size: the canary, then everything else at once.
    assert_eq!(
        split_with(None, Canary::First),
        waves(&[&["a"], &["b", "c", "d", "e"]])
    );
    let e = split(&five, None, &Canary::Named("zz".into())).expect_err("not a target");
    assert_eq!(e.exit_code(), 2);
    assert!(e.to_string().contains("zz is not one of"), "{e}");
}

#[test]
fn targets_leave_out_machines_the_plan_shows_only_as_cascaded() {
    let m = |machine: &str, reason: &str| PlannedMachine {
        machine: machine.into(),
        reason: reason.into(),
        changes: Vec::new(),
        holds: Vec::new(),
    };
    let plan = PlanView {
        target: PushTarget::Behind,
        moves: Vec::new(),
        revision: 3,
        machines: vec![
            m("ace", "behind"),
            m("g14", "behind"),
            m("novox", "cascaded from ace"),
            m("zed", "cascaded from g14: module db moved"),
        ],
        mints: Vec::new(),
        token: "t".into(),
    };
    assert_eq!(targets_of(&plan), names(&["ace", "g14"]));
}

/// A scripted leader: what each `push <machine>` answers (the machine and its cascade) and how
/// each machine settles in the wait (ready unless listed).
#[derive(Default)]
struct Scripted {
    cascades: BTreeMap<String, Vec<PushLine>>,
    settles: BTreeMap<String, WaitOutcome>,
    pushed: Vec<String>,
    said: String,
}

impl Fleet for Scripted {
    fn push(&mut self, machine: &str) -> Result<PushView, CliError> {
        self.pushed.push(machine.to_string());
        let mut lines = vec![applied(machine, "named")];
        lines.extend(self.cascades.get(machine).cloned().unwrap_or_default());
        // A line the leader gives a held or failed machine replaces the named one.
        if let Some(pos) = lines.iter().skip(1).position(|l| l.machine == machine) {
            lines.swap(0, pos + 1);
            lines.remove(pos + 1);
        }
        Ok(PushView { epoch: 2, lines })
    }

    fn wait(&mut self, view: &PushView) -> Vec<Waited> {
        view.lines
            .iter()
            .filter(|l| matches!(l.outcome, PushOutcome::Applied { .. }))
            .map(|l| Waited {
                machine: l.machine.clone(),
                sequence: 2,
                outcome: self
                    .settles
                    .get(&l.machine)
                    .cloned()
                    .unwrap_or(WaitOutcome::Ready),
                view: None,
            })
            .collect()
    }

    fn say(&mut self, line: &str) {
        self.said.push_str(line);
    }
}

#[test]
fn a_machine_a_wave_sent_by_cascade_is_not_sent_again_by_a_later_wave() {
    // G1 with waves: ace's push brings novox (its consumer, whose links moved) along in wave 1;
    // wave 3 names novox and sends nothing to it again.
    let mut fleet = Scripted::default();
    fleet
        .cascades
        .insert("ace".into(), vec![applied("novox", "cascaded from ace")]);
    let plan = waves(&[&["ace"], &["g14"], &["novox"]]);
    let runs = walk(&plan, &mut fleet);
    assert_eq!(fleet.pushed, names(&["ace", "g14"]));
    assert_eq!(runs.len(), 3);
    assert_eq!(runs[2].skipped, names(&["novox"]));
    assert!(runs[2].lines.is_empty());
    assert_eq!(exit_code(&runs), 0);
    assert!(
        fleet
            .said
            .contains("wave 1/3 done: 2 applied, 2 ready, 1 of them by cascade\n"),
        "{}",
        fleet.said
    );
    assert!(
        fleet
            .said
            .contains("wave 3/3 done: 1 already sent by an earlier wave\n"),
        "{}",
        fleet.said
    );
    assert_eq!(stop_text(&plan, &runs, &WaveArgs::default()), None);
}

#[test]
fn the_first_wave_with_a_failing_module_stops_the_push_and_says_how_to_continue() {
    // Issue 24 item 3: g14's module fails in wave 2; wave 3 (novox) is never pushed, the exit is
    // push --wait's 4, and the text names the wave, the machine, what was not sent and the way on.
    let mut fleet = Scripted::default();
    fleet.settles.insert(
        "g14".into(),
        WaitOutcome::Failing {
            modules: names(&["crash"]),
        },
    );
    let plan = waves(&[&["ace"], &["g14"], &["novox"]]);
    let runs = walk(&plan, &mut fleet);
    assert_eq!(fleet.pushed, names(&["ace", "g14"]));
    assert_eq!(runs.len(), 2);
    assert_eq!(runs[1].failed(), names(&["g14"]));
    assert_eq!(exit_code(&runs), exit_module_failed);
    let args = WaveArgs {
        wave: Some(WaveSize::Machines(1)),
        canary: None,
    };
    let text = stop_text(&plan, &runs, &args).expect("stopped");
    assert!(
        text.starts_with("stopped at wave 2/3: g14 failed; not sent: novox\n"),
        "{text}"
    );
    assert!(
        text.contains("`meshctl push --behind --wave 1 --why ...`"),
        "{text}"
    );
    assert!(
        fleet
            .said
            .contains("wave 2/3 FAILED: 1 applied, 1 failing\n"),
        "{}",
        fleet.said
    );
}

#[test]
fn a_failed_send_or_a_module_not_ready_in_time_stops_the_walk_and_a_hold_does_not() {
    let failed = PushLine {
        machine: "ace".into(),
        outcome: PushOutcome::Failed {
            reason: "named".into(),
            error: "no address".into(),
        },
    };
    let held = PushLine {
        machine: "ace".into(),
        outcome: PushOutcome::Held {
            reason: "named".into(),
            holds: vec![HeldMount {
                module: "db".into(),
                mount: "data".into(),
                old_dir: "/a".into(),
                new_dir: "/b".into(),
            }],
        },
    };
    let plan = waves(&[&["ace"], &["g14"]]);
    // A failed line: stop after wave 1, exit 1.
    let mut fleet = Scripted::default();
    fleet.cascades.insert("ace".into(), vec![failed]);
    let runs = walk(&plan, &mut fleet);
    assert_eq!((runs.len(), exit_code(&runs)), (1, exit_failed));
    // Not ready in time: stop after wave 1, exit 5.
    let mut fleet = Scripted::default();
    fleet.settles.insert(
        "ace".into(),
        WaitOutcome::TimedOut {
            last: "no report".into(),
        },
    );
    let runs = walk(&plan, &mut fleet);
    assert_eq!((runs.len(), exit_code(&runs)), (1, exit_wait_timeout));
    // A hold sends nothing to ace and breaks nothing: g14 follows, exit 3 names the hold.
    let mut fleet = Scripted::default();
    fleet.cascades.insert("ace".into(), vec![held]);
    let runs = walk(&plan, &mut fleet);
    assert_eq!(fleet.pushed, names(&["ace", "g14"]));
    assert_eq!((runs.len(), exit_code(&runs)), (2, super::super::exit_held));
}

#[test]
fn plan_waves_put_a_cascade_in_the_wave_of_the_target_it_comes_from() {
    // G1: plan <ace> brings novox; novox, a target of wave 2, shows as already sent.
    let plan = waves(&[&["ace"], &["novox", "g14"]]);
    let mut plan_one = |m: &str| -> Result<PlanView, CliError> {
        let pm = |machine: &str, reason: &str| PlannedMachine {
            machine: machine.into(),
            reason: reason.into(),
            changes: Vec::new(),
            holds: Vec::new(),
        };
        let mut machines = vec![pm(m, "named")];
        if m == "ace" {
            machines.push(pm("novox", "cascaded from ace"));
        }
        Ok(PlanView {
            target: PushTarget::Machine(m.into()),
            moves: Vec::new(),
            revision: 1,
            machines,
            mints: Vec::new(),
            token: "t".into(),
        })
    };
    let planned = plan_walk(&plan, &mut plan_one).expect("planned");
    let sent =
        |w: &PlannedWave| -> Vec<String> { w.machines.iter().map(|(m, _)| m.clone()).collect() };
    assert_eq!(sent(&planned[0]), names(&["ace", "novox"]));
    assert_eq!(sent(&planned[1]), names(&["g14"]));
    assert_eq!(planned[1].skipped, names(&["novox"]));
}

#[test]
fn waves_need_behind_or_all_and_refuse_one_named_machine() {
    // Bad input changes nothing: a machine named alone is refused before any request.
    let args = WaveArgs {
        wave: Some(WaveSize::Machines(1)),
        canary: None,
    };
    assert!(args.target(&PushTarget::Behind, "push").is_ok());
    assert!(args.target(&PushTarget::All, "push").is_ok());
    let e = args
        .target(&PushTarget::Machine("ace".into()), "push")
        .expect_err("one machine");
    assert_eq!(e.exit_code(), 2);
    assert!(e.to_string().contains("--behind or --all"), "{e}");
}
