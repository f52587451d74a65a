//! Tests of the event log's pure parts: derivation from report transitions, the bound, cursors
//! across terms, pages and the machine filter (decision 0308).

use super::*;
use crate::core::report::Exit;

fn module(name: &str, state: ModuleState, restarts: u32, last_exit: Option<Exit>) -> ModuleStatus {
    ModuleStatus {
        name: name.into(),
        state,
        restarts,
        pid: Some(100),
        last_exit,
        drift: Vec::new(),
    }
}

fn failed() -> ModuleState {
    ModuleState::Failed {
        error: "exited with signal 9".into(),
    }
}

fn query(from: EventsFrom, machine: Option<&str>, limit: u32) -> EventsQuery {
    EventsQuery {
        from,
        machine: machine.map(str::to_string),
        limit,
        wait_ms: 0,
    }
}

fn event_on(machine: &str, text: &str) -> Draft {
    Draft::new(EventKind::Held, Some(machine), None, text.into())
}

fn texts(page: &EventsPage) -> Vec<&str> {
    page.events.iter().map(|e| e.text.as_str()).collect()
}

#[test]
fn a_module_crash_failure_and_recovery_are_each_one_event_and_an_unchanged_report_none() {
    // Issue 25 item 5: module failed / restarted / recovered, derived from what the leader files
    // (the account's last report against the new one).
    let ready = module("broker", ModuleState::Ready, 0, None);
    let db = module("db", ModuleState::Ready, 0, None);
    // Killed and started again before the report: restarted, with its exit.
    let restarted = module("broker", ModuleState::Starting, 1, Some(Exit::Signal(9)));
    let drafts = module_changes(
        "g14",
        Some(&[ready.clone(), db.clone()]),
        &[restarted.clone(), db.clone()],
    );
    assert_eq!(drafts.len(), 1, "{drafts:?}");
    assert_eq!(drafts[0].kind, EventKind::ModuleRestarted);
    assert_eq!(drafts[0].machine.as_deref(), Some("g14"));
    assert_eq!(drafts[0].module.as_deref(), Some("broker"));
    assert!(drafts[0].text.contains("signal 9"), "{drafts:?}");
    // Killed and reported while failed, waiting for its restart: failed.
    let down = module("broker", failed(), 0, Some(Exit::Signal(9)));
    let drafts = module_changes("g14", Some(&[ready.clone()]), &[down.clone()]);
    assert_eq!(drafts.len(), 1, "{drafts:?}");
    assert_eq!(drafts[0].kind, EventKind::ModuleFailed);
    // Still failed at the next report: nothing new.
    assert_eq!(
        module_changes("g14", Some(&[down.clone()]), &[down.clone()]),
        vec![]
    );
    // Ready again: recovered.
    let back = module("broker", ModuleState::Ready, 1, Some(Exit::Signal(9)));
    let drafts = module_changes("g14", Some(&[down]), &[back.clone()]);
    assert_eq!(drafts.len(), 1, "{drafts:?}");
    assert_eq!(drafts[0].kind, EventKind::ModuleRecovered);
    // The same report again, or a first report of ready modules: nothing.
    assert_eq!(
        module_changes("g14", Some(&[back.clone()]), &[back.clone()]),
        vec![]
    );
    assert_eq!(module_changes("g14", None, &[ready]), vec![]);
}

#[test]
fn the_log_keeps_at_most_its_bound_and_a_reader_behind_it_is_told_how_many_it_missed() {
    // Issue 25 item 5: bounded by events_kept_max; never silently truncated.
    let mut log = EventLog::new(5);
    log.took_office(7, 1_000, "replica 1 took office".into());
    for i in 0..9 {
        assert!(log.push(7, 1_000 + i, event_on("ace", &format!("e{i}"))));
    }
    // Ten events made (took office + 9), five kept: indexes 6..=10.
    let page = log
        .read(&query(EventsFrom::Oldest, None, 100))
        .expect("page");
    assert_eq!(texts(&page), vec!["e4", "e5", "e6", "e7", "e8"]);
    assert_eq!(page.events[0].index, 6);
    assert_eq!(page.gap, None);
    // A reader that saw up to event 2 missed 3..=5.
    let behind = EventsFrom::After(EventCursor { term: 7, index: 2 });
    let page = log.read(&query(behind, None, 100)).expect("page");
    assert_eq!(page.gap, Some(EventsGap::Dropped { count: 3 }));
    assert_eq!(page.events.len(), 5);
    assert_eq!(page.next, EventCursor { term: 7, index: 10 });
    // Caught up: nothing, no gap, the cursor stays.
    let page = log
        .read(&query(EventsFrom::After(page.next), None, 100))
        .expect("page");
    assert!(
        page.events.is_empty() && page.gap.is_none() && !page.more,
        "{page:?}"
    );
    assert_eq!(page.next, EventCursor { term: 7, index: 10 });
    // A cursor past the log is refused, not answered empty.
    let ahead = EventsFrom::After(EventCursor { term: 7, index: 11 });
    assert!(matches!(
        log.read(&query(ahead, None, 10)),
        Err(EventsError::CursorAhead { last: 10, .. })
    ));
}

#[test]
fn a_cursor_of_an_older_term_is_told_events_may_be_lost_and_reads_from_took_office() {
    // Decision 0308: the log lives in the leader's memory; a follow across a leader change must
    // not skip silently.
    let mut log = EventLog::new(100);
    log.took_office(3, 10, "replica 1 took office".into());
    assert!(log.push(3, 11, event_on("ace", "old")));
    log.stepped_down(3, 12, "replica 1 stepped down".into());
    // Closed: nothing more is taken in its term.
    assert!(!log.push(3, 13, event_on("ace", "late")));
    let page = log
        .read(&query(EventsFrom::Oldest, None, 10))
        .expect("page");
    assert_eq!(
        page.events.last().map(|e| e.kind),
        Some(EventKind::SteppedDown)
    );
    // Another term: the log starts again with took office.
    log.took_office(5, 20, "replica 1 took office".into());
    assert!(log.push(5, 21, event_on("ace", "new")));
    let old = EventsFrom::After(EventCursor { term: 3, index: 1 });
    let page = log.read(&query(old, None, 10)).expect("page");
    assert_eq!(page.gap, Some(EventsGap::OlderTerm { term: 3 }));
    assert_eq!(page.events[0].kind, EventKind::TookOffice);
    assert_eq!(texts(&page), vec!["replica 1 took office", "new"]);
    assert_eq!(page.next, EventCursor { term: 5, index: 2 });
    // A cursor of a newer term than this leader's: ask again elsewhere.
    let newer = EventsFrom::After(EventCursor { term: 6, index: 1 });
    assert!(matches!(
        log.read(&query(newer, None, 10)),
        Err(EventsError::CursorNewer {
            term: 6,
            leading: 5
        })
    ));
    // A term not above the log's changes nothing.
    log.took_office(4, 30, "stale".into());
    assert_eq!(log.term(), 5);
}

#[test]
fn pages_are_bounded_say_more_follow_and_a_machine_filter_shows_only_that_machine() {
    // Issue 25 item 5: paged, never silently truncated; `events --machine` filters.
    let mut log = EventLog::new(100);
    log.took_office(2, 0, "took office".into());
    for i in 0..5 {
        log.push(2, i, event_on("ace", &format!("ace{i}")));
        log.push(2, i, event_on("g14", &format!("g14{i}")));
    }
    let page = log
        .read(&query(EventsFrom::Oldest, Some("g14"), 2))
        .expect("page");
    assert_eq!(texts(&page), vec!["g140", "g141"]);
    assert!(page.more);
    let page = log
        .read(&query(EventsFrom::After(page.next), Some("g14"), 2))
        .expect("page");
    assert_eq!(texts(&page), vec!["g142", "g143"]);
    assert!(page.more);
    let page = log
        .read(&query(EventsFrom::After(page.next), Some("g14"), 2))
        .expect("page");
    assert_eq!(texts(&page), vec!["g144"]);
    assert!(!page.more);
    // Past every event looked at, matching or not.
    assert_eq!(page.next, EventCursor { term: 2, index: 11 });
    // The newest two of g14, and how many of its events come before them.
    let page = log
        .read(&query(EventsFrom::Newest(2), Some("g14"), 10))
        .expect("page");
    assert_eq!(texts(&page), vec!["g143", "g144"]);
    assert_eq!(page.earlier, 3);
    // Limits out of range are refused.
    for limit in [0, events_page_max + 1] {
        assert!(matches!(
            log.read(&query(EventsFrom::Oldest, None, limit)),
            Err(EventsError::LimitOutOfRange { .. })
        ));
    }
}

#[test]
fn silence_and_drift_transitions_are_each_one_event_when_they_change() {
    // Issue 25 item 5: host silent / back from decision 0301's rule, looked at on each tick;
    // drift appeared / cleared, one event per module that moved (decision 0305).
    let none = BTreeMap::new();
    let silent: BTreeMap<String, u64> = [("g14".to_string(), 6_200)].into();
    let went = silence_changes(&none, &silent);
    assert_eq!(went.len(), 1);
    assert_eq!(went[0].kind, EventKind::HostSilent);
    assert_eq!(went[0].machine.as_deref(), Some("g14"));
    assert_eq!(silence_changes(&silent, &silent), vec![]);
    let back = silence_changes(&silent, &none);
    assert_eq!(back.len(), 1);
    assert_eq!(back[0].kind, EventKind::HostBack);
    let moves = DriftMoves {
        appeared: vec![("broker".into(), vec!["conf/broker.conf changed".into()])],
        cleared: vec!["cache".into()],
    };
    let drift = drift_changes("g14", &moves);
    assert_eq!(drift.len(), 2);
    assert_eq!(drift[0].kind, EventKind::Drift);
    assert_eq!(drift[0].module.as_deref(), Some("broker"));
    assert!(
        drift[0].text.contains("conf/broker.conf changed"),
        "{}",
        drift[0].text
    );
    assert_eq!(drift[1].kind, EventKind::DriftCleared);
    assert_eq!(drift[1].module.as_deref(), Some("cache"));
    assert_eq!(drift_changes("g14", &DriftMoves::default()), vec![]);
}
