//! The leader search's rules (G13, decision 0333), each test named after what it keeps.

use std::net::SocketAddr;
use std::time::Duration;

use super::*;

const ms: fn(u64) -> Duration = Duration::from_millis;

fn addr(id: u64) -> SocketAddr {
    SocketAddr::from(([10, 0, 0, id as u8], 7000))
}

fn silent() -> Probed<SocketAddr> {
    Probed::Silent {
        waited_ms: 200,
        error: "timed out".into(),
    }
}

#[test]
fn g13_a_request_is_forwarded_once_and_only_to_a_leader_that_answered_a_probe() {
    let mut search = Search::<SocketAddr>::new(ms(8_000), ms(100));
    assert_eq!(
        search.seen(Seen::Leader(1), ms(0)),
        Step::Probe { leader: 1 }
    );
    // Leader 1 is gone: the search waits for the metrics, then tries the next leader they name.
    assert_eq!(
        search.probed(1, silent(), ms(200)),
        Step::Wait { at_most: ms(100) }
    );
    assert_eq!(
        search.seen(Seen::Leader(2), ms(300)),
        Step::Probe { leader: 2 }
    );
    assert_eq!(
        search.probed(2, Probed::Leads(addr(2)), ms(310)),
        Step::Forward {
            leader: 2,
            addr: addr(2)
        }
    );
    // Written once: whatever happens after, it is never written anywhere again.
    for step in [
        search.seen(Seen::Leader(3), ms(320)),
        search.probed(3, Probed::Leads(addr(3)), ms(330)),
        search.probed(2, Probed::Leads(addr(2)), ms(340)),
    ] {
        assert!(
            matches!(step, Step::GiveUp { .. }),
            "a second write or probe after the forward: {step:?}"
        );
    }
}

#[test]
fn g13_a_leader_that_does_not_say_it_leads_is_never_written_to() {
    for probed in [
        silent(),
        Probed::Follows {
            role: "Follower".into(),
            term: 7,
        },
        Probed::Moved,
        Probed::NoAddress {
            config: "replica.toml".into(),
        },
    ] {
        let mut search = Search::<SocketAddr>::new(ms(8_000), ms(100));
        assert_eq!(
            search.seen(Seen::Leader(1), ms(0)),
            Step::Probe { leader: 1 }
        );
        let step = search.probed(1, probed.clone(), ms(50));
        assert!(
            matches!(step, Step::Wait { .. }),
            "{probed:?} answered {step:?}"
        );
    }
    // A probe's answer about another replica than the one asked: nothing is written on it.
    let mut search = Search::<SocketAddr>::new(ms(8_000), ms(100));
    assert_eq!(
        search.seen(Seen::Leader(1), ms(0)),
        Step::Probe { leader: 1 }
    );
    assert!(matches!(
        search.probed(2, Probed::Leads(addr(2)), ms(10)),
        Step::GiveUp { .. }
    ));
}

#[test]
fn a_replica_elected_while_looking_handles_the_request_itself() {
    let mut search = Search::<SocketAddr>::new(ms(8_000), ms(100));
    assert_eq!(
        search.seen(Seen::NoLeader, ms(0)),
        Step::Wait { at_most: ms(100) }
    );
    assert_eq!(search.seen(Seen::LeadsHere, ms(90)), Step::HandleHere);
}

#[test]
fn the_search_ends_at_its_time_with_the_last_reason_and_status_looks_once() {
    let mut search = Search::<SocketAddr>::new(ms(250), ms(100));
    assert_eq!(
        search.seen(Seen::Leader(1), ms(0)),
        Step::Probe { leader: 1 }
    );
    // The last wait is cut to what is left of the search.
    assert_eq!(
        search.probed(1, silent(), ms(200)),
        Step::Wait { at_most: ms(50) }
    );
    let Step::GiveUp { find, why } = search.seen(Seen::NoLeader, ms(250)) else {
        panic!("the search outlived its time");
    };
    assert_eq!(find, ms(250));
    assert_eq!(
        why.to_string(),
        "the leader did not answer a probe within 200 ms: timed out"
    );
    // `status` does not wait out an election: one look.
    let mut status = Search::<SocketAddr>::new(Duration::ZERO, ms(100));
    assert!(matches!(
        status.seen(Seen::NoLeader, ms(0)),
        Step::GiveUp {
            why: NotFound::NoneKnown,
            ..
        }
    ));
    let mut status = Search::<SocketAddr>::new(Duration::ZERO, ms(100));
    assert_eq!(
        status.seen(Seen::Leader(1), ms(0)),
        Step::Probe { leader: 1 }
    );
    assert!(matches!(
        status.probed(1, silent(), ms(1)),
        Step::GiveUp { .. }
    ));
}

#[test]
fn the_leader_search_reads_no_clock_does_no_io_and_draws_no_randomness() {
    crate::controller::purity::assert_names_none(
        &[("forwarding.rs", include_str!("../forwarding.rs"))],
        &["std::sync", "service::", "Instant"],
    );
}
