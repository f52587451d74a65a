//! The checkers against hand-written histories: each passes a good history and names the broken
//! guarantee in a bad one (a checker that cannot fail is worse than none).

use mesh::core::declaration::Digest;
use mesh::core::report::ReportPosition;
use mesh::store::command::SendRecord;
use mesh_chaos::checkers::{
    Final, accounts_never_regress, acknowledged_writes_survive, applied_has_send_record, check_all,
    check_run, complete, converged, each_refusal_counted_once, no_apply_at_or_below_mark,
    no_epoch_reused_after_restore, no_push_runs_twice, no_stale_epoch_written,
    operator_writes_linearizable, push_names_recorded_machines, replicas_agree,
};
use mesh_chaos::history::{Answered, Event, History, Op};
use mesh_chaos::linear::{self, Kind, RegisterOp, Verdict};

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
    taken_by(position, ok, 1)
}

/// A delivery of `ace`'s report that replica `by` took.
fn taken_by(position: ReportPosition, ok: bool, by: u64) -> Event {
    Event::ReportDelivered {
        machine: "ace".into(),
        position,
        ok,
        by: Some(by),
        started: 0,
        took_ms: 1,
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
fn g5_a_refusal_is_owed_by_the_replica_that_heard_the_newer_report_in_its_leadership() {
    let with = |counted: u64| Final {
        accounts: [("ace".to_string(), (Some(pos(2, 1, 7)), counted))].into(),
        ..Final::default()
    };
    let lease = |replica, term| Event::LeaseGranted { replica, term };
    // 6 taken by replica 2 (heard, not filed: decision 0216), a newer leader's lease, then the
    // overtaken 5 taken by replica 1, which never heard 6: it may accept 5 or refuse it.
    let handed_over = History::of(vec![
        lease(2, 2),
        taken_by(pos(2, 1, 6), true, 2),
        lease(1, 3),
        taken_by(pos(2, 1, 5), true, 1),
    ]);
    assert!(each_refusal_counted_once(&handed_over, &with(0)).is_empty());
    assert!(each_refusal_counted_once(&handed_over, &with(1)).is_empty());
    assert_eq!(each_refusal_counted_once(&handed_over, &with(2)).len(), 1);
    // The same replica in the same leadership owes the refusal, with leases of its own renewed.
    let kept = History::of(vec![
        lease(2, 2),
        taken_by(pos(2, 1, 6), true, 2),
        lease(2, 2),
        taken_by(pos(2, 1, 5), true, 2),
    ]);
    assert_eq!(each_refusal_counted_once(&kept, &with(0)).len(), 1);
    assert!(each_refusal_counted_once(&kept, &with(1)).is_empty());
    // So does a replica whose store had filed 6 by then, whoever took 6.
    let filed = History::of(vec![
        lease(2, 2),
        taken_by(pos(2, 1, 6), true, 2),
        Event::AccountSeen {
            replica: 1,
            machine: "ace".into(),
            last: Some(pos(2, 1, 6)),
            refused_older: 0,
        },
        lease(1, 3),
        taken_by(pos(2, 1, 5), true, 1),
    ]);
    assert_eq!(each_refusal_counted_once(&filed, &with(0)).len(), 1);
    assert!(each_refusal_counted_once(&filed, &with(1)).is_empty()); // A delivery's own filing, seen before its answer came, owes nothing.
    let own = History::of(vec![
        lease(1, 3),
        Event::AccountSeen {
            replica: 1,
            machine: "ace".into(),
            last: Some(pos(2, 1, 7)),
            refused_older: 0,
        },
        taken_by(pos(2, 1, 7), true, 1),
    ]);
    assert!(each_refusal_counted_once(&own, &with(0)).is_empty());
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

fn read(op: u64) -> Event {
    Event::Invoked {
        op,
        via: 2,
        what: Op::Read,
    }
}

/// A read's answer: `pairs` are the keys it found set.
fn read_done(op: u64, pairs: &[(&str, &str)]) -> Event {
    Event::Done {
        op,
        answer: Answered::Read {
            replica: 1,
            values: pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        },
    }
}

fn unknown() -> Answered {
    Answered::Unknown("no answer within 3998 ms".into())
}

fn ending(pairs: &[(&str, &str)]) -> Final {
    Final {
        settings: pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        ..Final::default()
    }
}

fn linearizable(history: &History, last: &Final) -> Vec<String> {
    let found = operator_writes_linearizable(history, last);
    assert!(found.undecided.is_empty(), "{:?}", found.undecided);
    found.violations.iter().map(|v| v.to_string()).collect()
}

#[test]
fn linearizable_concurrent_writes_and_reads_of_one_key_pass() {
    // Two writers of `shared` overlap; reads during the overlap may see either, and once a read
    // saw the second one to take effect, later reads see it too.
    let history = History::of(vec![
        set(1, "shared", "a"),
        set(2, "shared", "b"),
        read(3),
        read_done(3, &[("shared", "b")]),
        done(1, ok()),
        read(4),
        read_done(4, &[("shared", "a")]),
        done(2, ok()),
        read(5),
        read_done(5, &[("shared", "a")]),
    ]);
    assert_eq!(
        linearizable(&history, &ending(&[("shared", "a")])),
        Vec::<String>::new()
    );
    assert!(check_all(&history, &ending(&[("shared", "a")])).is_empty());
}

#[test]
fn a_stale_read_after_an_acknowledged_write_is_named_with_key_op_and_values() {
    // v2 was acknowledged before read 3 was invoked: reading v1 then is stale.
    let history = History::of(vec![
        set(1, "mode", "v1"),
        done(1, ok()),
        set(2, "mode", "v2"),
        done(2, ok()),
        read(3),
        read_done(3, &[("mode", "v1")]),
    ]);
    let found = linearizable(&history, &ending(&[("mode", "v2")]));
    assert_eq!(found.len(), 1, "{found:?}");
    assert!(
        found[0].contains("setting mode")
            && found[0].contains("op 3 (read via replica 2, answered by replica 1")
            && found[0].contains("read Some(\"v1\")")
            && found[0].contains("leaving Some(\"v2\") (written by op 2)"),
        "{}",
        found[0]
    );
    // The same read overlapping the write may see either value.
    let overlapping = History::of(vec![
        set(1, "mode", "v1"),
        done(1, ok()),
        set(2, "mode", "v2"),
        read(3),
        read_done(3, &[("mode", "v1")]),
        done(2, ok()),
    ]);
    assert!(linearizable(&overlapping, &ending(&[("mode", "v2")])).is_empty());
    // Two reads that disagree with each other in order: v2 seen, then v1 again.
    let flip = History::of(vec![
        set(1, "mode", "v1"),
        done(1, ok()),
        set(2, "mode", "v2"),
        read(3),
        read_done(3, &[("mode", "v2")]),
        read(4),
        read_done(4, &[("mode", "v1")]),
        done(2, ok()),
    ]);
    let found = linearizable(&flip, &ending(&[("mode", "v2")]));
    assert_eq!(found.len(), 1, "{found:?}");
    assert!(found[0].contains("op 4"), "{}", found[0]);
}

#[test]
fn a_read_of_a_value_never_written_or_only_refused_is_named() {
    let history = History::of(vec![
        set(1, "pool", "v1"),
        done(
            1,
            Answered::Refused("settings module/db: refused at apply".into()),
        ),
        read(2),
        read_done(2, &[("pool", "v1"), ("level", "v9")]),
    ]);
    let found = linearizable(&history, &ending(&[]));
    assert_eq!(found.len(), 2, "{found:?}");
    assert!(
        found[0].contains("setting level") && found[0].contains("no operator wrote it"),
        "{}",
        found[0]
    );
    assert!(
        found[1].contains("setting pool")
            && found[1].contains("read \"v1\"")
            && found[1].contains("only op 1 wrote it, and it was refused"),
        "{}",
        found[1]
    );
}

#[test]
fn an_acknowledged_write_lost_at_the_end_is_named() {
    let history = History::of(vec![
        set(1, "shared", "a"),
        done(1, ok()),
        set(2, "shared", "b"),
        done(2, ok()),
    ]);
    assert!(linearizable(&history, &ending(&[("shared", "b")])).is_empty());
    for lost in [ending(&[("shared", "a")]), ending(&[])] {
        let found = linearizable(&history, &lost);
        assert_eq!(found.len(), 1, "{found:?}");
        assert!(
            found[0].contains("setting shared")
                && found[0].contains("the store's value at the end"),
            "{}",
            found[0]
        );
    }
}

#[test]
fn a_write_of_unknown_outcome_may_show_late_or_never_but_not_come_and_go() {
    // Write 1 got no answer: reads may miss it and later see it, or never see it.
    let late = History::of(vec![
        set(1, "owner", "a"),
        done(1, unknown()),
        read(2),
        read_done(2, &[]),
        read(3),
        read_done(3, &[("owner", "a")]),
    ]);
    assert!(linearizable(&late, &ending(&[("owner", "a")])).is_empty());
    assert!(linearizable(&late, &ending(&[("owner", "a")])).is_empty());
    let never = History::of(vec![
        set(1, "owner", "a"),
        done(1, unknown()),
        read(2),
        read_done(2, &[]),
    ]);
    assert!(linearizable(&never, &ending(&[])).is_empty());
    // Seen, then gone with no other write: no order allows it.
    let gone = History::of(vec![
        set(1, "owner", "a"),
        done(1, unknown()),
        read(2),
        read_done(2, &[("owner", "a")]),
        read(3),
        read_done(3, &[]),
    ]);
    let found = linearizable(&gone, &ending(&[("owner", "a")]));
    assert_eq!(found.len(), 1, "{found:?}");
    assert!(
        found[0].contains("op 3") && found[0].contains("read None"),
        "{}",
        found[0]
    );
    // Nor before it was invoked.
    let early = History::of(vec![
        read(2),
        read_done(2, &[("owner", "a")]),
        set(1, "owner", "a"),
        done(1, unknown()),
    ]);
    assert_eq!(linearizable(&early, &ending(&[("owner", "a")])).len(), 1);
}

#[test]
fn only_what_follows_the_last_restore_is_checked_from_any_value_before_it() {
    // Before the restore: v1 acknowledged, then a read of it. The backup may hold any value
    // written before the restore, or none; after it, the usual rules.
    let history = History::of(vec![
        set(1, "pool", "v1"),
        done(1, ok()),
        set(2, "pool", "v2"),
        done(2, ok()),
        restored(),
        read(3),
        read_done(3, &[("pool", "v1")]),
        read(4),
        read_done(4, &[("pool", "v1")]),
    ]);
    assert!(linearizable(&history, &ending(&[("pool", "v1")])).is_empty());
    let flip = History::of(vec![
        set(1, "pool", "v1"),
        done(1, ok()),
        set(2, "pool", "v2"),
        done(2, ok()),
        restored(),
        read(3),
        read_done(3, &[("pool", "v1")]),
        read(4),
        read_done(4, &[("pool", "v2")]),
    ]);
    let found = linearizable(&flip, &ending(&[("pool", "v2")]));
    assert_eq!(found.len(), 1, "{found:?}");
    assert!(found[0].contains("since the restore"), "{}", found[0]);
}

#[test]
fn a_search_that_reaches_its_state_limit_is_undecided_not_passed() {
    // Ten overlapping writes and a read: more orders than a limit of 5 states can try.
    let mut ops: Vec<RegisterOp> = (0..10)
        .map(|i| RegisterOp {
            op: i + 1,
            invoked: i,
            done: Some(100 + i),
            kind: Kind::Write(format!("v{i}")),
            about: format!("write {i}"),
        })
        .collect();
    ops.push(RegisterOp {
        op: 11,
        invoked: 200,
        done: Some(201),
        kind: Kind::Read(Some("v0".into())),
        about: "read".into(),
    });
    assert!(matches!(
        linear::check(&ops, &[None], 5),
        Verdict::Undecided { .. }
    ));
    assert_eq!(
        linear::check(&ops, &[None], 1_000_000),
        Verdict::Linearizable
    );
    // And the run counts it apart from its violations.
    let checked = check_run(&History::of(vec![]), &Final::default());
    assert!(checked.undecided.is_empty() && checked.violations.is_empty());
}

#[test]
fn a_write_of_unknown_outcome_may_end_last_even_after_a_later_acknowledged_one() {
    // Pass E's new-disks 0x5eed_000d: write 7 got no answer, write 8 was then acknowledged, the
    // model ended as 7. A write with no answer may take effect at any time after it was invoked.
    let history = History::of(vec![
        set(7, "pool", "v7"),
        done(7, unknown()),
        set(8, "pool", "v8"),
        done(8, ok()),
    ]);
    assert!(acknowledged_writes_survive(&history, &ending(&[("pool", "v7")])).is_empty());
    assert!(linearizable(&history, &ending(&[("pool", "v7")])).is_empty());
    // Two writers: either acknowledged write may end last when they overlap, not when one
    // strictly followed the other.
    let overlapping = History::of(vec![
        set(1, "shared", "a"),
        set(2, "shared", "b"),
        done(1, ok()),
        done(2, ok()),
    ]);
    for end in ["a", "b"] {
        assert!(acknowledged_writes_survive(&overlapping, &ending(&[("shared", end)])).is_empty());
    }
    let followed = History::of(vec![
        set(1, "shared", "a"),
        done(1, ok()),
        set(2, "shared", "b"),
        done(2, ok()),
    ]);
    let found = acknowledged_writes_survive(&followed, &ending(&[("shared", "a")]));
    assert_eq!(found.len(), 1, "{found:?}");
}

fn apply(op: u64, tag: u64) -> Event {
    Event::Invoked {
        op,
        via: 1,
        what: Op::Apply { tag },
    }
}

fn plan(op: u64) -> Event {
    Event::Invoked {
        op,
        via: 3,
        what: Op::ReadModel,
    }
}

fn planned(op: u64, revision: u64) -> Event {
    Event::Done {
        op,
        answer: Answered::Model {
            replica: 1,
            revision,
        },
    }
}

/// The store at the end: applies "chaos apply 1" at revision 1 and "chaos apply 2" at 3 (a
/// settings change took revision 2), model tag 2.
fn two_applies() -> Final {
    Final {
        model_whys: std::collections::BTreeMap::from([
            (1, "chaos apply 1".to_string()),
            (3, "chaos apply 2".to_string()),
        ]),
        revision: 3,
        apply_tag: Some(2),
        ..Final::default()
    }
}

#[test]
fn model_reads_through_plan_are_linearizable_a_stale_or_lost_revision_is_named() {
    // A plan names the revision it planned from; the model there is the last apply at or below
    // it. Revision 2 (a settings change after apply 1) still holds apply 1's model.
    let good = History::of(vec![
        apply(1, 1),
        done(1, ok()),
        plan(2),
        planned(2, 2),
        apply(3, 2),
        done(3, ok()),
        plan(4),
        planned(4, 3),
    ]);
    assert!(linearizable(&good, &two_applies()).is_empty());
    // A plan asked after apply 2 was acknowledged, answered from the model before it.
    let stale = History::of(vec![
        apply(1, 1),
        done(1, ok()),
        apply(3, 2),
        done(3, ok()),
        plan(4),
        planned(4, 2),
    ]);
    let found = linearizable(&stale, &two_applies());
    assert_eq!(found.len(), 1, "{found:?}");
    assert!(
        found[0].contains("model: no order") && found[0].contains("plan of revision 2"),
        "{}",
        found[0]
    );
    // A plan of a revision the store does not have: a model it lost.
    let lost = History::of(vec![apply(1, 1), done(1, ok()), plan(2), planned(2, 9)]);
    let found = linearizable(&lost, &two_applies());
    assert_eq!(found.len(), 1, "{found:?}");
    assert!(
        found[0].contains("above the store's last revision 3"),
        "{}",
        found[0]
    );
}

fn step(fault: &str, step: usize, on: bool) -> Event {
    Event::Nemesis {
        step,
        fault: fault.into(),
        what: String::new(),
        on,
    }
}

fn took(started: u64, ok: bool, took_ms: u64) -> Event {
    Event::ReportDelivered {
        machine: "ace".into(),
        position: pos(1, 1, started),
        ok,
        by: Some(1),
        started,
        took_ms,
    }
}

#[test]
fn a_report_slowed_or_lost_while_only_the_hostile_peer_plays_is_named() {
    // Issue 23 part 5: the hostile peer must not hold another host's reports back.
    use mesh_chaos::checkers::{report_filed_ms_max, reports_filed_within_bound};
    let run = |delivery: Event, other_fault: bool| {
        let mut events = vec![lease(1, 1), step("hostile-flood", 0, true)];
        if other_fault {
            events.push(step("isolate-leader", 1, true));
        }
        events.push(delivery);
        reports_filed_within_bound(&History::of(events))
    };
    assert!(run(took(2, true, report_filed_ms_max), false).is_empty());
    let slow = run(took(2, true, report_filed_ms_max + 1), false);
    assert_eq!(slow.len(), 1, "{slow:?}");
    assert!(slow[0].what.contains("report_filed_ms_max"), "{}", slow[0]);
    assert_eq!(run(took(2, false, 10), false).len(), 1, "a failed delivery");
    // Another fault on: not the hostile peer's doing, not judged.
    assert!(run(took(2, false, 9_000), true).is_empty());
    // Without a hostile step, nothing is judged.
    assert!(
        reports_filed_within_bound(&History::of(vec![lease(1, 1), took(1, false, 9_000)]))
            .is_empty()
    );
}

#[test]
fn resident_memory_over_its_bound_and_a_hostile_message_taken_are_named() {
    use mesh_chaos::checkers::{memory_within_bound, no_hostile_message_taken, rss_bytes_max};
    let memory = |rss_bytes| memory_within_bound(&History::of(vec![Event::Memory { rss_bytes }]));
    assert!(memory(rss_bytes_max).is_empty());
    assert_eq!(memory(rss_bytes_max + 1).len(), 1);
    let sent = |taken| {
        no_hostile_message_taken(&History::of(vec![Event::HostileSent {
            fault: "hostile-contradict".into(),
            sent: 10,
            taken,
            example: Some("an epoch above the floor without a proof".into()),
        }]))
    };
    assert!(sent(0).is_empty());
    let taken = sent(1);
    assert_eq!(taken.len(), 1);
    assert!(taken[0].what.contains("without a proof"), "{}", taken[0]);
}
