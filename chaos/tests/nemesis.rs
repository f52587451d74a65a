//! The nemesis schedule: a function of its seed (so a printed seed replays the same faults),
//! bounded, and opening with the fault its mix is named after.

use mesh_chaos::nemesis::{Fault, Mix, Schedule, steps_max, steps_min};

#[test]
fn the_same_seed_draws_the_same_schedule_and_another_seed_another() {
    // Replay: `--seed <n>` must bring back the faults of the failed run.
    for mix in Mix::all {
        let a = Schedule::generate(42, mix, 3_000);
        assert_eq!(a, Schedule::generate(42, mix, 3_000));
        assert_ne!(a.steps, Schedule::generate(43, mix, 3_000).steps, "{mix}");
    }
}

#[test]
fn a_schedule_fills_its_time_within_the_step_limit() {
    // Limits: a long run still has at most `steps_max` steps; a short one has `steps_min`, so
    // every run meets its headline fault and two drawn ones.
    for seed in 0..20 {
        let long = Schedule::generate(seed, Mix::Partitions, 10_000_000);
        assert_eq!(long.steps.len(), steps_max);
        let short = Schedule::generate(seed, Mix::Partitions, 1);
        assert_eq!(short.steps.len(), steps_min);
        let planned: u64 = Schedule::generate(seed, Mix::Everything, 3_000)
            .steps
            .iter()
            .map(|s| s.planned_ms())
            .sum();
        assert!(planned >= 3_000, "seed {seed}: {planned} ms planned");
    }
}

#[test]
fn every_schedule_opens_with_its_mixs_headline_fault() {
    // A mix named after a fault meets it in every run, whatever else the seed draws.
    for seed in 0..20 {
        assert_eq!(
            Schedule::generate(seed, Mix::Partitions, 3_000).steps[0].fault,
            Fault::IsolateLeader
        );
        assert_eq!(
            Schedule::generate(seed, Mix::StaleLeaders, 3_000).steps[0].fault,
            Fault::PausedLeader
        );
        assert_eq!(
            Schedule::generate(seed, Mix::Processes, 3_000).steps[0].fault,
            Fault::CrashReplica
        );
        assert_eq!(
            Schedule::generate(seed, Mix::Hostile, 3_000).steps[0].fault,
            Fault::HostileFlood
        );
    }
}

#[test]
fn every_fault_is_in_some_mix_and_named_once() {
    // The table's rows: each fault reachable, each name distinct.
    let mut names: Vec<&str> = Fault::all.iter().map(|f| f.name()).collect();
    names.sort_unstable();
    names.dedup();
    assert_eq!(names.len(), Fault::all.len());
    // `everything` is every fault but the hostile peer's (kept as it was, so its seeds draw
    // what they drew); every fault is in some mix.
    let not_hostile: Vec<Fault> = Fault::all.into_iter().filter(|f| !f.hostile()).collect();
    assert_eq!(Mix::Everything.faults(), not_hostile);
    for fault in Fault::all {
        assert!(
            Mix::all.iter().any(|m| m.faults().contains(&fault)),
            "{fault} is in no mix"
        );
    }
    assert_eq!(Mix::named("hostile"), Some(Mix::Hostile));
    assert_eq!(Mix::named("stale-leaders"), Some(Mix::StaleLeaders));
    assert_eq!(Mix::named("nope"), None);
}
