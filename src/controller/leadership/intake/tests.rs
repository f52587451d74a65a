//! Report intake's guarantees as unit tests on the admission it decides (G9, G10, decisions 0151,
//! 0272, 0274): no socket, no store, no clock; the state and the trusted keys are handed in.

use std::collections::BTreeMap;

use ed25519_dalek::{Signer, SigningKey, VerifyingKey};
use mesh_testkit::model::machine;

use super::*;
use crate::core::declaration::Digest;
use crate::core::envelope::header_bytes;
use crate::core::model::Mesh;

fn key(seed: u8) -> SigningKey {
    SigningKey::from_bytes(&[seed; 32])
}

/// Replica 1's key is trusted; replica 9's is not.
fn trusted() -> BTreeMap<u64, VerifyingKey> {
    BTreeMap::from([(1, key(1).verifying_key())])
}

/// A header of `machine` at `epoch.sequence` signed by replica `signer` with its key.
fn proof(machine: &str, epoch: u64, sequence: u64, signer: u64) -> EpochProof {
    let header = EnvelopeHeader {
        machine: machine.into(),
        epoch,
        sequence,
        signer,
        digest: Digest([5; 32]),
    };
    let bytes = header_bytes(&header).expect("a header encodes");
    let signature = key(signer as u8).sign(&bytes).to_bytes().to_vec();
    EpochProof { header, signature }
}

fn report(epoch: u64, sequence: u64, proof: Option<EpochProof>) -> Report {
    Report {
        machine: "ace".into(),
        epoch,
        sequence,
        report_sequence: 9,
        applied: None,
        modules: vec![],
        refused_older: 0,
        last_refusal: None,
        proof,
    }
}

/// A store at `floor` whose model holds `ace`.
fn state(floor: u64) -> DomainState {
    let mut mesh = Mesh::default();
    mesh.machines.insert("ace".into(), machine("ace"));
    DomainState {
        epoch_floor: floor,
        mesh,
        ..DomainState::default()
    }
}

fn sent(epoch: u64, sequence: u64, digest: Digest) -> SendRecord {
    SendRecord {
        machine: "ace".into(),
        epoch,
        sequence,
        digest,
        summary: std::sync::Arc::default(),
        why: "test".into(),
        actor: "operator:test".into(),
        time_ms: 0,
        moves: vec![],
    }
}

fn admit_in(term: u64, state: &DomainState, report: &Report, unproven: Option<u64>) -> Admission {
    admit(Intake {
        term,
        frame_machine: "ace",
        report,
        state,
        trusted: &trusted(),
        unproven,
    })
}

fn admitted(raise: Option<Raise>, mark: Option<Mark>) -> Admission {
    Admission::Admitted { raise, mark }
}

#[test]
fn g9_an_epoch_above_the_floor_is_refused_without_a_trusted_proof_and_raises_the_floor_with_one() {
    // G9 (decisions 0101, 0151): one host certificate must not raise the floor by saying so; a
    // header signed by a trusted replica does, to exactly the epoch it proves.
    let s = state(3);
    let unsigned = report(7, 2, None);
    assert_eq!(
        admit_in(3, &s, &unsigned, None),
        Admission::Refused(Refusal::EpochUnproven {
            epoch: 7,
            floor: 3,
            why: ProofError::Missing
        })
    );
    let untrusted = report(7, 2, Some(proof("ace", 7, 2, 9)));
    assert_eq!(
        admit_in(3, &s, &untrusted, None),
        Admission::Refused(Refusal::EpochUnproven {
            epoch: 7,
            floor: 3,
            why: ProofError::UnknownSigner(9)
        })
    );
    let signed = report(7, 2, Some(proof("ace", 7, 2, 1)));
    assert_eq!(
        admit_in(3, &s, &signed, None),
        admitted(
            Some(Raise {
                floor: 7,
                why: RaiseWhy::Above { epoch: 7 }
            }),
            None
        )
    );
    // At or below the floor nothing is claimed: no proof asked, the floor never goes down.
    assert_eq!(
        admit_in(3, &s, &report(2, 2, None), None),
        admitted(None, None)
    );
    let refused = Refusal::EpochUnproven {
        epoch: 7,
        floor: 3,
        why: ProofError::Missing,
    };
    assert_eq!(refused.counted_as(), "unproven");
    assert!(
        refused.to_string().contains("above the floor 3"),
        "{refused}"
    );
}

#[test]
fn g9_a_proven_position_of_the_leaders_own_term_it_never_recorded_raises_the_floor_above_the_term()
{
    // G9 (decision 0272): a header of this leader's term signed past its last recorded send to
    // the machine was signed by another leadership of the same term; the floor goes above it.
    let s = state(5);
    let reused = report(5, 3, Some(proof("ace", 5, 3, 1)));
    let above = |why| {
        admitted(
            Some(Raise {
                floor: 6,
                why: RaiseWhy::Reused(why),
            }),
            None,
        )
    };
    assert_eq!(
        admit_in(5, &s, &reused, None),
        above(Reused::NotRecorded {
            term: 5,
            machine: "ace".into()
        })
    );
    let mut recorded = s.clone();
    recorded
        .last_sends
        .insert("ace".into(), sent(5, 2, Digest([5; 32])));
    assert_eq!(
        admit_in(5, &recorded, &reused, None),
        above(Reused::Past {
            term: 5,
            machine: "ace".into(),
            recorded: 2
        })
    );
    recorded
        .last_sends
        .insert("ace".into(), sent(5, 3, Digest([6; 32])));
    assert_eq!(
        admit_in(5, &recorded, &reused, None),
        above(Reused::OtherDigest {
            term: 5,
            sequence: 3
        })
    );
    // Its own send, as recorded: nothing moves.
    recorded
        .last_sends
        .insert("ace".into(), sent(5, 3, Digest([5; 32])));
    assert_eq!(admit_in(5, &recorded, &reused, None), admitted(None, None));
    // The host's word alone (no proof, or one of an untrusted key) moves nothing.
    for unproven in [None, Some(proof("ace", 5, 3, 9))] {
        assert_eq!(
            admit_in(5, &s, &report(5, 3, unproven), None),
            admitted(None, None)
        );
    }
}

#[test]
fn g9_an_unproven_floor_counts_a_mark_at_or_above_the_term_only_with_its_proof() {
    // G9 (decision 0274): while the floor is unproven, a host's epoch at or above the leader's
    // term counts only with its signed header; an older epoch counts as it is.
    let s = state(5);
    let restored = Some(1);
    assert_eq!(
        admit_in(5, &s, &report(5, 3, None), restored),
        admitted(
            None,
            Some(Mark::DoesNotCount {
                epoch: 5,
                why: ProofError::Missing
            })
        )
    );
    let (raise, mark) = match admit_in(5, &s, &report(5, 3, Some(proof("ace", 5, 3, 1))), restored)
    {
        Admission::Admitted { raise, mark } => (raise, mark),
        other => panic!("{other:?}"),
    };
    assert_eq!(mark, Some(Mark::Counts { epoch: 5 }));
    assert!(raise.is_some(), "a term never recorded is left as well");
    assert_eq!(
        admit_in(5, &s, &report(4, 3, None), restored),
        admitted(None, Some(Mark::Counts { epoch: 4 }))
    );
    // A proven floor marks nothing; neither does a machine outside the model.
    assert_eq!(
        admit_in(5, &s, &report(4, 3, None), None),
        admitted(None, None)
    );
    let mut outside = s.clone();
    outside.mesh.machines.clear();
    assert_eq!(
        admit_in(5, &outside, &report(4, 3, None), restored),
        admitted(None, None)
    );
}

#[test]
fn g10_a_report_whose_body_names_another_machine_is_refused_as_an_impostor() {
    // G10: the frame's machine is the host's certificate; a body for another machine is not
    // filed under either.
    let s = state(0);
    let mut other = report(0, 0, None);
    other.machine = "bee".into();
    let admission = admit_in(1, &s, &other, None);
    let Admission::Refused(refusal) = admission else {
        panic!("{admission:?}");
    };
    assert_eq!(
        refusal,
        Refusal::Impostor(MachineMismatch {
            frame: "ace".into(),
            body: "bee".into()
        })
    );
    assert_eq!(refusal.counted_as(), "error");
}

#[test]
fn g5_a_report_beyond_what_a_host_reaches_or_over_its_bounds_is_refused() {
    // G5: a report no host can send is refused before it touches an account; a report with more
    // modules than the declaration it applied is over its bounds (decision 0299).
    let s = state(1);
    let beyond = report(epoch_max + 1, 0, None);
    assert_eq!(
        admit_in(1, &s, &beyond, None),
        Admission::Refused(Refusal::Beyond {
            epoch: epoch_max + 1,
            sequence: 0,
            report_sequence: 9
        })
    );
    let mut recorded = s.clone();
    recorded
        .last_sends
        .insert("ace".into(), sent(1, 1, Digest([5; 32])));
    let mut wide = report(1, 1, None);
    wide.applied = Some(Digest([5; 32]));
    wide.modules = vec![crate::core::report::ModuleStatus {
        name: "web".into(),
        state: crate::core::report::ModuleState::Ready,
        restarts: 0,
        pid: None,
        last_exit: None,
        drift: vec![],
    }];
    let admission = admit_in(1, &recorded, &wide, None);
    assert!(
        matches!(&admission, Admission::Refused(Refusal::OverBound(_))),
        "{admission:?}"
    );
    // The same report against a send it did not apply has the bound every report has.
    wide.applied = Some(Digest([4; 32]));
    assert_eq!(admit_in(1, &recorded, &wide, None), admitted(None, None));
}
