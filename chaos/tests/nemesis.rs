//! The nemesis schedule: a function of its seed (so a printed seed replays the same faults), bounded,
//! and opening with the fault its mix is named after.

use mesh_chaos::nemesis::{Fault, Mix, Schedule, steps_max};

#[test]
fn the_same_seed_draws_the_same_schedule_and_another_seed_another() {
    // Replay: `CHAOS_SEED=<n>` must bring back the faults of the failed run.
    let a = Schedule::generate(42, Mix::Everything, 3_000);
    assert_eq!(a, Schedule::generate(42, Mix::Everything, 3_000));
    assert_ne!(
        a.steps,
        Schedule::generate(43, Mix::Everything, 3_000).steps
    );
}

#[test]
fn a_schedule_fills_its_time_within_the_step_limit() {
    // Limits: a long run still has at most `steps_max` steps; a short one has at least one.
    for seed in 0..20 {
        let long = Schedule::generate(seed, Mix::Partitions, 10_000_000);
        assert_eq!(long.steps.len(), steps_max);
        let short = Schedule::generate(seed, Mix::Partitions, 1);
        assert_eq!(short.steps.len(), 1);
        let planned: u64 = Schedule::generate(seed, Mix::Everything, 3_000)
            .steps
            .iter()
            .map(|s| s.for_ms + s.calm_ms)
            .sum();
        assert!(planned >= 3_000, "seed {seed}: {planned} ms planned");
    }
}

#[test]
fn stale_leader_schedules_open_by_isolating_a_paused_leader() {
    // G3 scenario: every StaleLeaders run meets a deposed leader frozen between commit and send.
    for seed in 0..20 {
        let stale = Schedule::generate(seed, Mix::StaleLeaders, 3_000);
        assert_eq!(
            stale.steps[0].fault,
            Fault::IsolateLeader { pause_actor: true }
        );
        let partitions = Schedule::generate(seed, Mix::Partitions, 3_000);
        assert_eq!(
            partitions.steps[0].fault,
            Fault::IsolateLeader { pause_actor: false }
        );
    }
}
