//! The checkers against hand-written histories: each passes a good history and names the broken
//! guarantee in a bad one (a checker that cannot fail is worse than none).

use mesh::core::declaration::Digest;
use mesh::core::report::ReportPosition;
use mesh::store::command::SendRecord;
use mesh_chaos::checkers::{
    Final, accounts_never_regress, acknowledged_writes_survive, applied_has_send_record, check_all,
    complete, converged, each_refusal_counted_once, no_apply_at_or_below_mark,
    no_epoch_reused_after_restore, no_push_runs_twice, no_stale_epoch_written,
    push_names_recorded_machines, replicas_agree,
};
use mesh_chaos::history::{Answered, Event, History, Op};

fn lease(replica: u64, term: u64) -> Event {
    Event::LeaseGranted { replica, term }
}

fn write(replica: u64, epoch: u64, sequence: u64) -> Event {
    Event::WriteAllowed {
        replica,
        machine: "ace".into(),
        epoch,
        sequence,
    }
}

fn digest(n: u8) -> Digest {
    Digest([n; 32])
}

fn applied(machine: &str, epoch: u64, sequence: u64, d: u8) -> Event {
    Event::HostApplied {
        machine: machine.into(),
        epoch,
        sequence,
        digest: digest(d).short(),
    }
}

fn record(machine: &str, epoch: u64, sequence: u64, d: u8, why: &str) -> SendRecord {
    SendRecord {
        machine: machine.into(),
        epoch,
        sequence,
        digest: digest(d),
        summary: Default::default(),
        why: why.into(),
        actor: "chaos".into(),
        time_ms: sequence,
        moves: vec![],
    }
}

fn pos(epoch: u64, sequence: u64, report_sequence: u64) -> ReportPosition {
    ReportPosition {
        epoch,
        sequence,
        report_sequence,
    }
}

fn delivered(position: ReportPosition, ok: bool) -> Event {
    Event::ReportDelivered {
        machine: "ace".into(),
        position,
        ok,
    }
}

fn set(op: u64, key: &str, value: &str) -> Event {
    Event::Invoked {
        op,
        via: 1,
        what: Op::Set {
            key: key.into(),
            value: value.into(),
        },
    }
}

fn done(op: u64, answer: Answered) -> Event {
    Event::Done { op, answer }
}

fn ok() -> Answered {
    Answered::Ok { lines: vec![] }
}

#[test]
fn g3_a_write_of_an_older_epoch_after_a_newer_lease_is_named() {
    let good = History::of(vec![
        lease(1, 2),
        write(1, 2, 1),
        lease(2, 3),
        write(2, 3, 2),
    ]);
    assert!(no_stale_epoch_written(&good).is_empty());
    let bad = History::of(vec![lease(1, 2), lease(2, 3), write(1, 2, 1)]);
    let found = no_stale_epoch_written(&bad);
    assert_eq!(found.len(), 1, "{found:?}");
    assert!(found[0].what.contains("term 3"), "{}", found[0]);
}

#[test]
fn g2_an_apply_at_or_below_the_mark_or_of_an_older_epoch_is_named() {
    let good = History::of(vec![
        applied("ace", 2, 1, 1),
        applied("ace", 2, 2, 2),
        applied("bex", 2, 1, 1),
        applied("ace", 3, 3, 3),
    ]);
    assert!(no_apply_at_or_below_mark(&good).is_empty());
    let replay = History::of(vec![applied("ace", 2, 2, 1), applied("ace", 2, 2, 1)]);
    assert!(
        no_apply_at_or_below_mark(&replay)[0]
            .what
            .contains("at or below its mark")
    );
    let older = History::of(vec![applied("ace", 3, 2, 1), applied("ace", 2, 5, 1)]);
    assert!(
        no_apply_at_or_below_mark(&older)[0]
            .what
            .contains("older epoch")
    );
}

#[test]
fn g4_an_applied_envelope_without_its_send_record_or_with_another_digest_is_named() {
    let history = History::of(vec![applied("ace", 2, 1, 7)]);
    let good = Final {
        sends: vec![record("ace", 2, 1, 7, "p")],
        ..Final::default()
    };
    assert!(applied_has_send_record(&history, &good).is_empty());
    let other_digest = Final {
        sends: vec![record("ace", 2, 1, 8, "p")],
        ..Final::default()
    };
    assert_eq!(applied_has_send_record(&history, &other_digest).len(), 1);
    assert_eq!(
        applied_has_send_record(&history, &Final::default()).len(),
        1
    );
}

#[test]
fn a_push_that_recorded_a_machine_twice_ran_twice() {
    let once = Final {
        sends: vec![
            record("ace", 2, 1, 1, "p1"),
            record("bex", 2, 1, 1, "p1"),
            record("ace", 2, 2, 1, "p2"),
        ],
        ..Final::default()
    };
    assert!(no_push_runs_twice(&once).is_empty());
    let twice = Final {
        sends: vec![record("ace", 2, 1, 1, "p1"), record("ace", 3, 2, 1, "p1")],
        ..Final::default()
    };
    assert_eq!(no_push_runs_twice(&twice).len(), 1);
}

#[test]
fn a_push_answer_that_leaves_out_or_invents_a_recorded_machine_is_named() {
    let push = Event::Invoked {
        op: 1,
        via: 1,
        what: Op::Push {
            why: "p1".into(),
            target: "--all".into(),
            moves: vec![],
        },
    };
    let last = Final {
        sends: vec![record("ace", 2, 4, 9, "p1")],
        ..Final::default()
    };
    let line = |m: &str, seq: u64| (m.to_string(), Some((seq, digest(9).short())));
    let good = History::of(vec![
        push.clone(),
        done(
            1,
            Answered::Ok {
                lines: vec![line("ace", 4), ("bex".into(), None)],
            },
        ),
    ]);
    assert!(push_names_recorded_machines(&good, &last).is_empty());
    let missing = History::of(vec![push.clone(), done(1, Answered::Ok { lines: vec![] })]);
    assert_eq!(push_names_recorded_machines(&missing, &last).len(), 1);
    let invented = History::of(vec![
        push.clone(),
        done(
            1,
            Answered::Ok {
                lines: vec![line("ace", 4), line("bex", 1)],
            },
        ),
    ]);
    assert_eq!(push_names_recorded_machines(&invented, &last).len(), 1);
    let wrong_sequence = History::of(vec![
        push.clone(),
        done(
            1,
            Answered::Ok {
                lines: vec![line("ace", 5)],
            },
        ),
    ]);
    assert_eq!(
        push_names_recorded_machines(&wrong_sequence, &last).len(),
        1
    );
    let refused = History::of(vec![push, done(1, Answered::Refused("no".into()))]);
    assert_eq!(push_names_recorded_machines(&refused, &last).len(), 1);
}

#[test]
fn g5_an_account_moving_back_on_a_replica_is_named() {
    let seen = |replica, last: Option<ReportPosition>, refused| Event::AccountSeen {
        replica,
        machine: "ace".into(),
        last,
        refused_older: refused,
    };
    let good = History::of(vec![
        seen(1, Some(pos(2, 1, 5)), 0),
        seen(2, None, 0),
        seen(1, Some(pos(2, 2, 6)), 1),
    ]);
    assert!(accounts_never_regress(&good).is_empty());
    let back = History::of(vec![
        seen(1, Some(pos(2, 2, 6)), 0),
        seen(1, Some(pos(2, 1, 7)), 0),
    ]);
    assert_eq!(accounts_never_regress(&back).len(), 1);
    let uncounted = History::of(vec![
        seen(1, Some(pos(2, 2, 6)), 2),
        seen(1, Some(pos(2, 2, 6)), 1),
    ]);
    assert_eq!(accounts_never_regress(&uncounted).len(), 1);
}

#[test]
fn g5_a_refusal_counted_twice_or_not_at_all_is_named() {
    // Delivered: 5, 6, then 5 again (overtaken: must be refused), then 7.
    let history = History::of(vec![
        delivered(pos(2, 1, 5), true),
        delivered(pos(2, 1, 6), true),
        delivered(pos(2, 1, 5), true),
        delivered(pos(2, 1, 7), true),
    ]);
    let with = |counted: u64| Final {
        accounts: [("ace".to_string(), (Some(pos(2, 1, 7)), counted))].into(),
        ..Final::default()
    };
    assert!(each_refusal_counted_once(&history, &with(1)).is_empty());
    assert_eq!(each_refusal_counted_once(&history, &with(0)).len(), 1);
    assert_eq!(each_refusal_counted_once(&history, &with(2)).len(), 1);
    // A failed delivery may have been filed: one more refusal is allowed, not two.
    let failed = History::of(vec![
        delivered(pos(2, 1, 5), false),
        delivered(pos(2, 1, 5), true),
    ]);
    assert!(each_refusal_counted_once(&failed, &with(1)).is_empty());
    assert!(each_refusal_counted_once(&failed, &with(0)).is_empty());
    assert_eq!(each_refusal_counted_once(&failed, &with(3)).len(), 1);
}

#[test]
fn an_acknowledged_write_lost_or_a_refused_write_shown_is_named() {
    let history = History::of(vec![
        set(1, "pool", "v1"),
        done(1, ok()),
        set(2, "pool", "v2"),
        done(2, Answered::Unknown("timeout".into())),
        set(3, "mode", "m1"),
        done(3, Answered::Refused("no".into())),
    ]);
    let with = |pool: Option<&str>, mode: Option<&str>| {
        let mut settings = std::collections::BTreeMap::new();
        if let Some(p) = pool {
            settings.insert("pool".to_string(), p.to_string());
        }
        if let Some(m) = mode {
            settings.insert("mode".to_string(), m.to_string());
        }
        Final {
            settings,
            ..Final::default()
        }
    };
    assert!(acknowledged_writes_survive(&history, &with(Some("v1"), None)).is_empty());
    assert!(acknowledged_writes_survive(&history, &with(Some("v2"), None)).is_empty());
    assert_eq!(
        acknowledged_writes_survive(&history, &with(None, None)).len(),
        1
    );
    assert_eq!(
        acknowledged_writes_survive(&history, &with(Some("v1"), Some("m1"))).len(),
        1
    );
}

#[test]
fn a_machine_left_behind_after_the_heal_replicas_apart_and_a_truncated_history_are_named() {
    let last = Final {
        not_converged: vec!["ace still behind".into()],
        ..Final::default()
    };
    assert_eq!(converged(&last).len(), 1);
    let apart = Final {
        disagree: vec![
            "replica 3 differs from the leader 1 at the same applied index in accounts".into(),
        ],
        ..Final::default()
    };
    assert_eq!(replicas_agree(&apart).len(), 1);
    assert!(replicas_agree(&Final::default()).is_empty());
    let mut truncated = History::of(vec![]);
    truncated.dropped = 3;
    assert_eq!(complete(&truncated).len(), 1);
    assert!(check_all(&History::of(vec![]), &Final::default()).is_empty());
}

fn restored() -> Event {
    Event::Restored {
        floors: vec![(1, 3), (2, 3), (3, 3)],
        floor_files_kept: true,
    }
}

#[test]
fn g9_a_write_after_a_restore_at_or_below_an_epoch_applied_before_it_is_named() {
    // Before the restore bex applied epoch 3; after it, epoch 4 is fine, 3 (reused) and 2 not.
    let good = History::of(vec![
        applied("bex", 3, 5, 1),
        restored(),
        lease(1, 4),
        write(1, 4, 2),
    ]);
    assert!(no_epoch_reused_after_restore(&good).is_empty());
    assert!(check_all(&good, &Final::default()).is_empty());
    let reused = History::of(vec![
        applied("bex", 3, 5, 1),
        restored(),
        write(1, 3, 6),
        write(1, 2, 1),
    ]);
    let found = no_epoch_reused_after_restore(&reused);
    assert_eq!(found.len(), 2, "{found:?}");
    assert!(
        found[0].what.contains("bex had applied epoch 3"),
        "{}",
        found[0]
    );
    // Without a restore the same writes are G3's business, not G9's.
    let plain = History::of(vec![applied("bex", 3, 5, 1), write(1, 3, 6)]);
    assert!(no_epoch_reused_after_restore(&plain).is_empty());
}

#[test]
fn g9_what_an_older_backup_lost_is_not_held_against_the_store() {
    // A write acknowledged before the restore may be gone (the backup is older): allowed. One
    // acknowledged after it must survive.
    let history = History::of(vec![
        set(1, "pool", "v1"),
        done(1, ok()),
        restored(),
        set(2, "mode", "m2"),
        done(2, ok()),
    ]);
    let with = |pool: Option<&str>, mode: Option<&str>| {
        let mut settings = std::collections::BTreeMap::new();
        if let Some(p) = pool {
            settings.insert("pool".to_string(), p.to_string());
        }
        if let Some(m) = mode {
            settings.insert("mode".to_string(), m.to_string());
        }
        Final {
            settings,
            ..Final::default()
        }
    };
    assert!(acknowledged_writes_survive(&history, &with(None, Some("m2"))).is_empty());
    assert_eq!(
        acknowledged_writes_survive(&history, &with(None, None)).len(),
        1
    );
    // An account starts again from the backup: not a regression; moving back after it is.
    let seen = |last: Option<ReportPosition>| Event::AccountSeen {
        replica: 1,
        machine: "ace".into(),
        last,
        refused_older: 0,
    };
    let again = History::of(vec![
        seen(Some(pos(3, 4, 9))),
        restored(),
        seen(Some(pos(1, 1, 2))),
    ]);
    assert!(accounts_never_regress(&again).is_empty());
    let back = History::of(vec![
        restored(),
        seen(Some(pos(3, 4, 9))),
        seen(Some(pos(1, 1, 2))),
    ]);
    assert_eq!(accounts_never_regress(&back).len(), 1);
    // An apply before the restore has no record in the restored store: not G4's business.
    let lost = History::of(vec![applied("ace", 2, 1, 7), restored()]);
    assert!(applied_has_send_record(&lost, &Final::default()).is_empty());
    let after = History::of(vec![restored(), applied("ace", 4, 1, 7)]);
    assert_eq!(applied_has_send_record(&after, &Final::default()).len(), 1);
}
