//! The leader's decisions as sans-I/O cores (issue 22 item 1, decision 0321), in the manner of the
//! push engine (`controller::engine`): what a leader knows goes in as plain data with the time it
//! is, what to do comes out as typed values; the async shell in `Service` reads the state, calls
//! the core and carries the answer out. [`intake`] decides on a host's report, [`membership`] on a
//! replica joining or leaving; the push engine
//! decides the push and the G9 floor hold (`engine::floor`).

pub(crate) mod intake;
pub(crate) mod membership;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use super::reports::{Handling, Liveness};

/// This replica's leadership of one term (issue 22 item 1, decision 0327): the memory a leader
/// keeps only for its term. It is made when the replica takes office in `term` and dropped when it
/// steps down; a new term gets a new value, so nothing of an old term (a host heard, a report
/// being handled, a G9 mark) can be read or written in a new one: a report, a push line or a mark
/// of term T reaches T's value only ([`Office::of`]).
pub(crate) struct Leadership {
    term: u64,
    /// What the leader heard from its hosts in its term, in memory only (decision 0216).
    pub(crate) live: Liveness,
    /// The reports each host has being handled now (`reports_handled_per_host_max`).
    pub(crate) handling: Handling,
    /// While the floor is unproven after a restore (G9, decision 0274): the highest epoch each
    /// machine of the model showed in this term (bounded by the model).
    marks: Mutex<BTreeMap<String, u64>>,
    /// The hosts this leadership found silent at its last look, with for how long (ms), for its
    /// host silent / back events (decision 0308); bounded by the model.
    silent: Mutex<BTreeMap<String, u64>>,
}

impl Leadership {
    fn new(term: u64) -> Leadership {
        Leadership {
            term,
            // Silence is counted from here for hosts it has not heard (decision 0301).
            live: Liveness::new(),
            handling: Handling::default(),
            marks: Mutex::new(BTreeMap::new()),
            silent: Mutex::new(BTreeMap::new()),
        }
    }

    /// Takes `now`, the hosts silent at this look, in place of those of the last look, and
    /// returns the last (this leadership's own: its first look starts from nothing).
    pub(crate) fn swap_silent(&self, now: BTreeMap<String, u64>) -> BTreeMap<String, u64> {
        let mut silent = self.silent.lock().unwrap_or_else(PoisonError::into_inner);
        std::mem::replace(&mut *silent, now)
    }

    /// The term this leadership is of.
    pub(crate) fn term(&self) -> u64 {
        self.term
    }

    fn lock_marks(&self) -> MutexGuard<'_, BTreeMap<String, u64>> {
        // A panic while holding it leaves at worst a mark not noted: the leader waits longer.
        self.marks.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Notes the epoch `machine` showed in this term while the floor is unproven.
    pub(crate) fn heard_mark(&self, machine: &str, epoch: u64) {
        let mut marks = self.lock_marks();
        let mark = marks.entry(machine.to_string()).or_default();
        *mark = (*mark).max(epoch);
    }

    /// The marks heard in this term.
    pub(crate) fn marks(&self) -> BTreeMap<String, u64> {
        self.lock_marks().clone()
    }

    /// Forgets the marks: the floor is proven.
    pub(crate) fn forget_marks(&self) {
        self.lock_marks().clear();
    }
}

/// Which leadership this replica holds now, if any. A term is taken once: once a later term was
/// taken, an earlier one is never made again, and a term's value is handed out only while it is
/// the one held.
pub(crate) struct Office(Mutex<Held>);

struct Held {
    /// The highest term a leadership was made for (0: never led).
    newest: u64,
    now: Option<Arc<Leadership>>,
}

impl Default for Office {
    fn default() -> Office {
        Office(Mutex::new(Held {
            newest: 0,
            now: None,
        }))
    }
}

impl Office {
    fn lock(&self) -> MutexGuard<'_, Held> {
        // Only plain assignments happen under it: a poisoned lock holds a whole value.
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The leadership of `term`: the one held when it is of `term`; a new one when `leads` (this
    /// replica leads in `term` now, as its Raft says) and `term` is newer than any taken before,
    /// replacing the one held; otherwise none (a term left, or not led).
    pub(crate) fn of(&self, term: u64, leads: bool) -> Option<Arc<Leadership>> {
        let mut held = self.lock();
        if let Some(now) = &held.now
            && now.term == term
        {
            return Some(now.clone());
        }
        if !leads || term <= held.newest {
            return None;
        }
        let leadership = Arc::new(Leadership::new(term));
        held.newest = term;
        held.now = Some(leadership.clone());
        Some(leadership)
    }

    /// This replica stopped leading `term`: its leadership is dropped (once the last request of
    /// the term holding it ends). A later term's leadership, already taken, stays.
    pub(crate) fn step_down(&self, term: u64) {
        let mut held = self.lock();
        if held.now.as_ref().is_some_and(|now| now.term == term) {
            held.now = None;
        }
    }

    /// The leadership held now, of whatever term.
    pub(crate) fn held(&self) -> Option<Arc<Leadership>> {
        self.lock().now.clone()
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use super::{Leadership, Office};
    use crate::controller::reports::{
        HandlingTurn, HeardView, Route, reports_handled_per_host_max,
        reports_in_flight_per_host_max,
    };
    use crate::core::report::{Account, Report};

    fn report(report_sequence: u64) -> Report {
        Report {
            machine: "ace".into(),
            epoch: 2,
            sequence: 3,
            report_sequence,
            applied: None,
            modules: Vec::new(),
            refused_older: 0,
            last_refusal: None,
            proof: None,
        }
    }

    /// Term `l`'s memory: `ace` heard, at its quota of reports in flight, refused for size,
    /// refused an envelope unproven, at its share of reports handled (the turns returned), and
    /// marked at epoch 3; `bee` found silent.
    fn remember(l: &Leadership, now: Instant) -> Vec<HandlingTurn<'_>> {
        let mut account = Account::default();
        account.file(report(10));
        let route = l.live.route(Some(&account), true, &report(11), now);
        assert_eq!(route, Route::Heard);
        // ace's reports in flight at its quota.
        for sequence in 20..20 + u64::from(reports_in_flight_per_host_max) {
            let route = l.live.route(None, true, &report(sequence), now);
            assert!(matches!(route, Route::File { .. }), "{route:?}");
        }
        assert_eq!(l.live.route(None, true, &report(30), now), Route::Busy);
        l.live.note_refused("ace", "too big", now);
        l.live.note_unproven("ace", Some("older".to_string()));
        l.heard_mark("ace", 3);
        l.swap_silent([("bee".to_string(), 30_000)].into());
        let turns: Vec<_> = (0..reports_handled_per_host_max)
            .filter_map(|_| l.handling.enter("ace"))
            .collect();
        assert!(l.handling.enter("ace").is_none(), "ace at its share");
        turns
    }

    #[test]
    fn a_new_term_starts_with_nothing_of_the_old_and_a_term_left_is_never_led_again() {
        // Decision 0327: a leadership exists for one term. Its successor starts empty (nothing
        // heard, no report of the old term counted as handled or in flight, no G9 mark, no refusal
        // shown, no host found silent), and
        // term T's value is not handed out once T+1 was taken, nor made again once left.
        let office = Office::default();
        assert!(
            office.of(4, false).is_none(),
            "a replica that does not lead has none"
        );
        let four = office.of(4, true).expect("took office in term 4");
        let now = Instant::now();
        let _turns = remember(&four, now);
        let again = office.of(4, true).expect("term 4 held");
        assert!(
            std::sync::Arc::ptr_eq(&four, &again),
            "one value for the term"
        );
        assert_eq!(four.marks().get("ace"), Some(&3));
        assert!(matches!(four.live.view("ace", now), HeardView::Ago(_)));

        let five = office.of(5, true).expect("took office in term 5");
        assert_eq!(five.term(), 5);
        let later = now + Duration::from_millis(1);
        assert!(
            matches!(five.live.view("ace", later), HeardView::NotSince(_)),
            "nothing heard"
        );
        assert!(five.marks().is_empty(), "no G9 mark of term 4");
        assert!(
            five.swap_silent(Default::default()).is_empty(),
            "term 5 finds silence anew: no host silent in term 4 comes back in it"
        );
        assert_eq!(
            five.live.refused_view("ace", later),
            None,
            "no refusal of term 4"
        );
        assert_eq!(
            five.live.unproven("ace"),
            None,
            "no unproven refusal of term 4"
        );
        assert!(
            five.handling.enter("ace").is_some(),
            "term 4's reports in hand do not count"
        );
        // A report of the new term is decided against the account alone, and ace's quota is
        // its own again.
        let mut account = Account::default();
        account.file(report(12));
        assert_eq!(
            five.live.route(Some(&account), true, &report(13), later),
            Route::Heard
        );
        assert!(
            matches!(
                five.live.route(None, true, &report(31), later),
                Route::File { .. }
            ),
            "term 4's reports in flight do not count"
        );

        // Term 4's state is refused now: its value is not handed out, not even to a leader.
        assert!(office.of(4, true).is_none(), "term 4 was left");
        office.step_down(4);
        assert_eq!(
            office.held().map(|l| l.term()),
            Some(5),
            "stepping down from 4 keeps 5"
        );
        office.step_down(5);
        assert!(office.held().is_none(), "stepped down");
        assert!(
            office.of(5, true).is_none(),
            "a term left is never led again"
        );
        assert!(office.of(6, true).is_some());
    }

    #[test]
    fn the_leadership_cores_read_no_clock_do_no_io_and_draw_no_randomness() {
        // Decision 0321: report intake and the G9 hold decide on what they are handed; a clock
        // read, an await, a socket, a file, a lock or a random draw in them would put a decision
        // back into the shell's world.
        let sources = [
            ("leadership/intake.rs", include_str!("intake.rs")),
            ("leadership/membership.rs", include_str!("membership.rs")),
            ("engine/floor.rs", include_str!("../engine/floor.rs")),
        ];
        // Nor a lock, nor the service: they decide on what they are handed.
        crate::controller::purity::assert_names_none(&sources, &["std::sync", "service::"]);
    }
}
