//! The membership core's decisions (decision 0332), each test named after what it keeps.

use std::collections::BTreeSet;

use mesh_raft::MembershipError;

use super::*;

fn ask(id: u64) -> AddAsk {
    AddAsk {
        id,
        addr: format!("10.0.0.{id}:7000"),
        dialable: true,
        key_valid: true,
    }
}

fn cluster(voters: &[u64]) -> Cluster {
    Cluster {
        voters: voters.iter().copied().collect(),
        member_addr: None,
        retired_why: None,
        key_in_state: false,
    }
}

fn set(ids: &[u64]) -> BTreeSet<u64> {
    ids.iter().copied().collect()
}

fn answered(voters: &[u64], live: &[u64]) -> AddEvent {
    AddEvent::Answered {
        members: set(voters),
        voters: set(voters),
        live: set(live),
    }
}

/// The add begun on voters 1-3 with every one and the new replica 4 answering, its key committed.
fn begun() -> Vec<AddEvent> {
    vec![
        AddEvent::Start(cluster(&[1, 2, 3])),
        answered(&[1, 2, 3], &[1, 2, 3, 4]),
        AddEvent::KeyCommitted,
    ]
}

/// Feeds `events` in order and returns every action, stopping at an answer.
fn drive(add: &mut Add, events: Vec<AddEvent>) -> Vec<AddAction> {
    let mut actions = Vec::new();
    for event in events {
        let action = add.next(event);
        let over = matches!(
            action,
            AddAction::Done { .. } | AddAction::Refuse(_) | AddAction::Fail(_)
        );
        actions.push(action);
        if over {
            break;
        }
    }
    actions
}

fn not_caught_up() -> MembershipError {
    MembershipError::NotCaughtUp {
        id: 4,
        addr: "10.0.0.4:7000".into(),
        matched: None,
        last: Some(9),
        waited_ms: 60_000,
    }
}

#[test]
fn g2_g9_a_replica_becomes_a_voter_only_once_every_machine_confirmed_its_key() {
    // The whole way, every machine confirming the key: a voter at the end.
    let mut add = Add::new(ask(4));
    let actions = drive(
        &mut add,
        vec![
            AddEvent::Start(cluster(&[1, 2, 3])),
            answered(&[1, 2, 3], &[1, 2, 4]),
            AddEvent::KeyCommitted,
            AddEvent::Missing {
                machines: vec!["ace".into(), "bex".into()],
            },
            AddEvent::Pushed {
                applied: 2,
                lines: 2,
            },
            AddEvent::LearnerCaughtUp,
            AddEvent::Missing { machines: vec![] },
            answered(&[1, 2, 3], &[1, 2, 3, 4]),
            AddEvent::Promoted,
        ],
    );
    assert_eq!(
        actions[..8],
        [
            AddAction::Probe,
            AddAction::CommitKey,
            AddAction::ReadMissing,
            AddAction::PushKey,
            AddAction::AddLearner,
            AddAction::ReadMissing,
            AddAction::Probe,
            AddAction::Promote,
        ]
    );
    let AddAction::Done { done } = &actions[8] else {
        panic!("the add ends done: {actions:?}");
    };
    assert!(done.iter().any(|l| l.contains("is a voter")), "{done:?}");

    // A machine still without the key after the catch-up: it stays a learner, never promoted.
    let mut add = Add::new(ask(4));
    let actions = drive(
        &mut add,
        [
            begun(),
            vec![
                AddEvent::Missing {
                    machines: vec!["ace".into()],
                },
                AddEvent::PushUnfinished {
                    error: "no answer".into(),
                },
                AddEvent::LearnerCaughtUp,
                AddEvent::Missing {
                    machines: vec!["ace".into()],
                },
                answered(&[1, 2, 3], &[1, 2, 3, 4]),
                AddEvent::Promoted,
            ],
        ]
        .concat(),
    );
    assert!(
        !actions.contains(&AddAction::Promote),
        "promoted with a machine lacking its key: {actions:?}"
    );
    assert_eq!(
        actions.last(),
        Some(&AddAction::Refuse(MembersError::KeyNotOnHosts {
            id: 4,
            machines: vec!["ace".into()],
        }))
    );
}

#[test]
fn a_failed_catch_up_takes_back_only_a_key_this_add_committed() {
    // Issue 27: a failed add leaves nothing trusted that it made trusted.
    let mut add = Add::new(ask(4));
    let actions = drive(
        &mut add,
        [
            begun(),
            vec![
                AddEvent::Missing { machines: vec![] },
                AddEvent::LearnerFailed(not_caught_up()),
                AddEvent::KeyDropped { dropped: true },
            ],
        ]
        .concat(),
    );
    assert_eq!(
        actions[3..],
        [
            AddAction::AddLearner,
            AddAction::DropKey,
            AddAction::Fail(not_caught_up())
        ]
    );

    // A key the state had before this call (an earlier add's step) is not this call's to take.
    let mut add = Add::new(ask(4));
    let mut known = cluster(&[1, 2, 3]);
    known.key_in_state = true;
    let actions = drive(
        &mut add,
        vec![
            AddEvent::Start(known),
            answered(&[1, 2, 3], &[1, 2, 3, 4]),
            AddEvent::Missing { machines: vec![] },
            AddEvent::LearnerFailed(not_caught_up()),
        ],
    );
    assert_eq!(
        actions,
        [
            AddAction::Probe,
            AddAction::ReadMissing,
            AddAction::AddLearner,
            AddAction::Fail(not_caught_up())
        ],
        "no CommitKey for a key in the state, no DropKey after"
    );
}

#[test]
fn an_add_that_would_lose_quorum_or_whose_replica_is_silent_changes_nothing() {
    // Two of three voters down: the change could not commit. Refused before any key moves.
    let mut add = Add::new(ask(4));
    let actions = drive(
        &mut add,
        vec![
            AddEvent::Start(cluster(&[1, 2, 3])),
            answered(&[1, 2, 3], &[1, 4]),
        ],
    );
    assert!(
        matches!(
            actions.last(),
            Some(AddAction::Refuse(MembersError::WouldLoseQuorum { .. }))
        ),
        "{actions:?}"
    );
    assert!(!actions.contains(&AddAction::CommitKey));

    // The quorum checked again before the promotion: a voter died while the learner caught up.
    let mut add = Add::new(ask(4));
    let actions = drive(
        &mut add,
        [
            begun(),
            vec![
                AddEvent::Missing { machines: vec![] },
                AddEvent::LearnerCaughtUp,
                AddEvent::Missing { machines: vec![] },
                answered(&[1, 2, 3], &[1, 4]),
            ],
        ]
        .concat(),
    );
    assert!(!actions.contains(&AddAction::Promote), "{actions:?}");
    assert!(matches!(
        actions.last(),
        Some(AddAction::Refuse(MembersError::WouldLoseQuorum { .. }))
    ));

    // The new replica does not answer: why, then refused.
    let mut add = Add::new(ask(4));
    let actions = drive(
        &mut add,
        vec![
            AddEvent::Start(cluster(&[1, 2, 3])),
            answered(&[1, 2, 3], &[1, 2, 3]),
            AddEvent::Silent {
                reason: "connection refused".into(),
            },
        ],
    );
    assert_eq!(
        actions,
        [
            AddAction::Probe,
            AddAction::ExplainSilent,
            AddAction::Refuse(MembersError::NewReplicaSilent {
                id: 4,
                addr: "10.0.0.4:7000".into(),
                reason: "connection refused".into(),
            })
        ]
    );
}

#[test]
fn an_add_asked_wrong_is_refused_before_anything_is_probed() {
    let first = |ask: AddAsk, cluster: Cluster| Add::new(ask).next(AddEvent::Start(cluster));
    let mut wildcard = ask(4);
    wildcard.dialable = false;
    assert!(matches!(
        first(wildcard, cluster(&[1, 2, 3])),
        AddAction::Refuse(MembersError::BadAddress { .. })
    ));
    let mut bad_key = ask(4);
    bad_key.key_valid = false;
    assert_eq!(
        first(bad_key, cluster(&[1, 2, 3])),
        AddAction::Refuse(MembersError::BadKey { id: 4 })
    );
    // Decision 0294: a retired id is never trusted again.
    let mut retired = cluster(&[1, 2, 3]);
    retired.retired_why = Some("removed by alice".into());
    assert_eq!(
        first(ask(4), retired),
        AddAction::Refuse(MembersError::Retired {
            id: 4,
            why: "removed by alice".into()
        })
    );
    let mut elsewhere = cluster(&[1, 2, 3]);
    elsewhere.member_addr = Some("10.9.9.9:7000".into());
    assert!(matches!(
        first(ask(4), elsewhere),
        AddAction::Fail(MembershipError::OtherAddress { id: 4, .. })
    ));
    // Asking again once it is a voter changes nothing and says so.
    assert!(matches!(
        first(ask(3), cluster(&[1, 2, 3])),
        AddAction::Done { ref done } if done[0].contains("already a voter")
    ));
}

#[test]
fn an_event_out_of_order_ends_the_add_with_an_error_never_a_step() {
    let mut add = Add::new(ask(4));
    assert_eq!(
        add.next(AddEvent::Start(cluster(&[1, 2, 3]))),
        AddAction::Probe
    );
    // Promoted before anything: a shell bug; refused, not taken as done.
    assert!(matches!(
        add.next(AddEvent::Promoted),
        AddAction::Refuse(MembersError::Membership { .. })
    ));
    // And the add is over: nothing after it acts.
    assert!(matches!(
        add.next(answered(&[1, 2, 3], &[1, 2, 3, 4])),
        AddAction::Refuse(MembersError::Membership { .. })
    ));
}

#[test]
fn a_remove_keeps_the_leader_and_a_quorum() {
    let members = set(&[1, 2, 3, 4]);
    let voters = set(&[1, 2, 3]);
    assert!(matches!(
        remove_asked(5, 1, &members),
        Err(RemoveRefusal::Membership(MembershipError::NotMember {
            id: 5,
            ..
        }))
    ));
    assert_eq!(
        remove_asked(1, 1, &members),
        Err(RemoveRefusal::Members(MembersError::RemovingTheLeader {
            id: 1
        }))
    );
    assert_eq!(remove_asked(3, 1, &members), Ok(()));
    // 3 removed with 2 down: {1} of {1, 2} cannot elect.
    assert!(matches!(
        remove_keeps_quorum(3, &members, &voters, &set(&[1])),
        Err(MembersError::WouldLoseQuorum { .. })
    ));
    assert_eq!(
        remove_keeps_quorum(3, &members, &voters, &set(&[1, 2])),
        Ok(set(&[1, 2]))
    );
}
