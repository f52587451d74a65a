//! The checkers against hand-written histories: each passes a good history and complains about a
//! bad one (a checker that cannot fail is worse than none).

use mesh::core::envelope::Position;
use mesh::core::report::ReportPosition;
use mesh_chaos::checkers::{
    accounts_never_regress, check_all, complete, no_acknowledged_write_lost,
    no_stale_epoch_applied, no_stale_epoch_sent,
};
use mesh_chaos::history::{Event, History, LogPosition, Recorder};

fn invoke(op: u64, key: &str, value: &str) -> Event {
    Event::WriteInvoked {
        op,
        client: 0,
        via: 1,
        key: key.into(),
        value: value.into(),
    }
}

fn ack(op: u64, index: u64, previous: Option<&str>) -> Event {
    Event::WriteAcked {
        op,
        at: LogPosition {
            term: 1,
            index,
            position: 0,
        },
        previous: previous.map(String::from),
    }
}

fn unknown(op: u64) -> Event {
    Event::WriteUnknown {
        op,
        error: "no answer".into(),
    }
}

fn read(replica: u64, key: &str, value: Option<&str>) -> Event {
    Event::FinalRead {
        replica,
        key: key.into(),
        value: value.map(String::from),
    }
}

fn reads(value: Option<&str>) -> Vec<Event> {
    (1..=3).map(|r| read(r, "k", value)).collect()
}

/// Two acknowledged writes to `k`: a (log 5) then b (log 7, replacing a).
fn two_writes() -> Vec<Event> {
    vec![
        invoke(1, "k", "a"),
        ack(1, 5, None),
        invoke(2, "k", "b"),
        ack(2, 7, Some("a")),
    ]
}

fn with(mut events: Vec<Event>, more: Vec<Event>) -> History {
    events.extend(more);
    History::of(events)
}

fn assert_complains(found: &[mesh_chaos::Violation], needle: &str) {
    assert!(
        found.iter().any(|v| v.what.contains(needle)),
        "expected a violation mentioning {needle:?}, got {found:#?}"
    );
}

#[test]
fn write_checker_passes_when_every_replica_holds_the_last_acknowledged_write() {
    // No acknowledged write lost: the good case, so the bad cases below fail for their reason.
    let found = no_acknowledged_write_lost(&with(two_writes(), reads(Some("b"))));
    assert!(found.is_empty(), "{found:#?}");
}

#[test]
fn write_checker_complains_when_an_acknowledged_write_is_gone_at_the_end() {
    // No acknowledged write lost: a replica with nothing for a key that had acknowledged writes.
    let mut events = two_writes();
    events.extend([read(1, "k", Some("b")), read(2, "k", None)]);
    let found = no_acknowledged_write_lost(&History::of(events));
    assert_complains(&found, "replica 2, key k: is empty");
}

#[test]
fn write_checker_complains_when_a_replica_holds_an_older_acknowledged_value() {
    // No acknowledged write lost, in log order: the later acknowledged write b is lost on replica 3.
    let mut events = two_writes();
    events.extend([
        read(1, "k", Some("b")),
        read(2, "k", Some("b")),
        read(3, "k", Some("a")),
    ]);
    let found = no_acknowledged_write_lost(&History::of(events));
    assert_eq!(found.len(), 1, "{found:#?}");
    assert_complains(&found, "replica 3, key k: holds a");
}

#[test]
fn write_checker_complains_when_a_write_replaced_something_out_of_log_order() {
    // In log order: c (log 9) says it replaced a, but b sits between them in the log.
    let mut events = two_writes();
    events.extend([invoke(3, "k", "c"), ack(3, 9, Some("a"))]);
    events.extend(reads(Some("c")));
    let found = no_acknowledged_write_lost(&History::of(events));
    assert_complains(&found, "k=c at log 1-9.0 replaced Some(\"a\")");
}

#[test]
fn write_checker_accepts_a_write_of_unknown_outcome_landing_in_between() {
    // In log order: a write whose answer was lost may have committed between two acknowledged ones.
    let events = vec![
        invoke(1, "k", "a"),
        ack(1, 5, None),
        invoke(2, "k", "u"),
        unknown(2),
        invoke(3, "k", "b"),
        ack(3, 9, Some("u")),
    ];
    let found = no_acknowledged_write_lost(&with(events, reads(Some("b"))));
    assert!(found.is_empty(), "{found:#?}");
}

#[test]
fn write_checker_accepts_a_final_unknown_write_but_not_one_an_acknowledged_write_replaced() {
    // No acknowledged write lost: an unknown write may be last — unless an acknowledged write is
    // known to have replaced it.
    let mut events = two_writes();
    events.extend([invoke(3, "k", "u"), unknown(3)]);
    let found = no_acknowledged_write_lost(&with(events.clone(), reads(Some("u"))));
    assert!(found.is_empty(), "{found:#?}");

    let events = vec![
        invoke(1, "k", "u"),
        unknown(1),
        invoke(2, "k", "b"),
        ack(2, 7, Some("u")),
    ];
    let found = no_acknowledged_write_lost(&with(events, reads(Some("u"))));
    assert_complains(&found, "holds u, which k=b");
}

#[test]
fn write_checker_complains_about_values_nobody_wrote_and_shared_log_positions() {
    // No acknowledged write lost: a value from nowhere, and two acks at one log position (one of
    // them was overwritten when a deposed leader's log was truncated).
    let found = no_acknowledged_write_lost(&with(two_writes(), reads(Some("zzz"))));
    assert_complains(&found, "which no client wrote");

    let events = vec![
        invoke(1, "k", "a"),
        ack(1, 5, None),
        invoke(2, "j", "b"),
        ack(2, 5, None),
        read(1, "k", Some("a")),
        read(1, "j", Some("b")),
    ];
    let found = no_acknowledged_write_lost(&History::of(events));
    assert_complains(&found, "were both acknowledged at log 1-5.0");
}

#[test]
fn write_checker_complains_when_nothing_was_read_at_the_end() {
    // No acknowledged write lost: a run that forgot its final reads proves nothing.
    let found = no_acknowledged_write_lost(&History::of(two_writes()));
    assert_complains(&found, "no replica was read at the end");
}

fn at(epoch: u64, sequence: u64) -> Position {
    Position { epoch, sequence }
}

fn applied(machine: &str, epoch: u64, sequence: u64) -> Event {
    Event::EnvelopeApplied {
        machine: machine.into(),
        signer: 1,
        position: at(epoch, sequence),
    }
}

#[test]
fn stale_epoch_checker_passes_positions_rising_across_epochs_per_machine() {
    // G2: each machine on its own; a new epoch may restart nothing, sequences keep rising.
    let history = History::of(vec![
        applied("ace", 1, 1),
        applied("g14", 1, 1),
        applied("ace", 1, 2),
        applied("ace", 2, 3),
        applied("g14", 2, 2),
    ]);
    let found = no_stale_epoch_applied(&history);
    assert!(found.is_empty(), "{found:#?}");
}

#[test]
fn stale_epoch_checker_complains_when_a_host_applies_a_position_again() {
    // G2: an envelope at or below the accepted position (a replay) must not be applied.
    let history = History::of(vec![applied("ace", 1, 1), applied("ace", 1, 1)]);
    let found = no_stale_epoch_applied(&history);
    assert_complains(&found, "host ace applied epoch 1 sequence 1, not above");
}

#[test]
fn stale_epoch_checker_complains_when_an_older_epoch_is_applied_after_a_newer_one() {
    // G2: once epoch 3 was accepted, nothing of epoch 2 is applied — even with a higher sequence.
    let history = History::of(vec![applied("ace", 3, 4), applied("ace", 2, 9)]);
    let found = no_stale_epoch_applied(&history);
    assert_eq!(found.len(), 1, "{found:#?}");
    assert_complains(&found, "of an epoch older than epoch 3 sequence 4");
}

fn lease(replica: u64, term: u64) -> Event {
    Event::LeaseAcquired { replica, term }
}

fn sent(replica: u64, epoch: u64, sequence: u64) -> Event {
    Event::EnvelopeSent {
        replica,
        machine: "ace".into(),
        position: at(epoch, sequence),
    }
}

#[test]
fn sent_checker_passes_a_handover_where_the_old_leader_stopped_before_the_new_lease() {
    // G3: the old leader's last send comes before the new leader's lease; the new one continues.
    let history = History::of(vec![
        lease(1, 1),
        sent(1, 1, 1),
        sent(1, 1, 2),
        lease(2, 2),
        sent(2, 2, 3),
    ]);
    let found = no_stale_epoch_sent(&history);
    assert!(found.is_empty(), "{found:#?}");
}

#[test]
fn sent_checker_complains_when_a_deposed_leader_sends_after_a_newer_lease() {
    // G3: a send of epoch 1 after replica 2 acquired a lease of term 2 — two leaders acted at once.
    let history = History::of(vec![lease(1, 1), sent(1, 1, 1), lease(2, 2), sent(1, 1, 2)]);
    let found = no_stale_epoch_sent(&history);
    assert_complains(&found, "after replica 2 acquired a lease of term 2");
}

#[test]
fn sent_checker_complains_when_a_machine_sequence_goes_back() {
    // G4: sequences come from the log, so a new leader never reuses or goes below one sent.
    let history = History::of(vec![lease(1, 1), sent(1, 1, 5), lease(2, 2), sent(2, 2, 5)]);
    assert!(no_stale_epoch_sent(&history).is_empty(), "epoch 2 is above");
    let history = History::of(vec![lease(1, 1), sent(1, 1, 5), sent(1, 1, 4)]);
    let found = no_stale_epoch_sent(&history);
    assert_complains(&found, "not above epoch 1 sequence 5");
}

fn report(got: (u64, u64, u64), accepted: bool, account: (u64, u64, u64)) -> Event {
    let position = |(epoch, sequence, report_sequence)| ReportPosition {
        epoch,
        sequence,
        report_sequence,
    };
    Event::ReportFiled {
        machine: "ace".into(),
        got: position(got),
        accepted,
        account: Some(position(account)),
    }
}

#[test]
fn accounts_checker_passes_an_overtaken_reconcile_report_that_was_refused() {
    // G5: the apply report (2, 5, 11) overtakes the reconcile report (2, 4, 10), which is refused.
    let history = History::of(vec![
        report((2, 5, 11), true, (2, 5, 11)),
        report((2, 4, 10), false, (2, 5, 11)),
        report((3, 1, 12), true, (3, 1, 12)),
    ]);
    let found = accounts_never_regress(&history);
    assert!(found.is_empty(), "{found:#?}");
}

#[test]
fn accounts_checker_complains_when_an_overtaken_report_is_filed() {
    // G5: filing the older report moves the account back and disagrees with filing in order.
    let history = History::of(vec![
        report((2, 5, 11), true, (2, 5, 11)),
        report((2, 4, 10), true, (2, 4, 10)),
    ]);
    let found = accounts_never_regress(&history);
    assert_complains(&found, "was filed but filing in arrival order refuses it");
    assert_complains(&found, "went back from epoch 2 sequence 5 report 11");
}

#[test]
fn accounts_checker_complains_when_a_newer_report_is_refused() {
    // G5: refusing a newer report leaves the account behind what the host said.
    let history = History::of(vec![
        report((2, 5, 11), true, (2, 5, 11)),
        report((2, 6, 12), false, (2, 5, 11)),
    ]);
    let found = accounts_never_regress(&history);
    assert_complains(&found, "was refused but filing in arrival order files it");
}

#[test]
fn a_history_with_dropped_events_is_refused() {
    // Every checker: a history that lost events cannot show that nothing went wrong.
    let mut history = History::of(two_writes());
    history.dropped = 3;
    assert_complains(&complete(&history), "3 events were dropped");
    assert_complains(&check_all(&history), "3 events were dropped");
}

#[test]
fn recorder_records_only_when_the_check_holds_at_that_tick() {
    // G3 support: a send is recorded only if the lease check passes under the history's lock.
    let recorder = Recorder::new();
    let closed: Result<u64, &str> = recorder.record_if(|| Err("closed"), sent(1, 1, 1));
    assert_eq!(closed, Err("closed"));
    let open = recorder.record_if(|| Ok::<(), &str>(()), sent(1, 1, 2));
    assert_eq!(open, Ok(0));
    assert_eq!(recorder.snapshot().events, vec![sent(1, 1, 2)]);
}

#[tokio::test]
async fn recorder_wakes_a_waiter_when_the_event_it_waits_for_is_recorded() {
    // Run support: waits end on the event, not on a sleep.
    let recorder = Recorder::new();
    let writer = recorder.clone();
    let from = recorder.now();
    let waiter = tokio::spawn(async move {
        recorder
            .wait_for(from, std::time::Duration::from_secs(20), |e| {
                matches!(e, Event::LeaseAcquired { term: 7, .. })
            })
            .await
    });
    writer.record(lease(1, 6));
    writer.record(lease(2, 7));
    assert!(waiter.await.expect("waiter"), "the waiter saw term 7");
}
