//! The G9 floor hold, decided by the push engine (decision 0274, moved here by decision 0321).
//!
//! After a restore without its floor file the store does not know which epochs the leaderships
//! after its backup used, so its first leader may be elected in a term the hosts already hold. While
//! the floor is unproven the leader sends nothing until every machine of the model reported to it,
//! in its term, the epoch it holds (the marks, counted by report intake: an epoch at or above the
//! term only with its signed header). Then either some host holds an epoch at or above the term,
//! and the floor goes above that epoch (the leader moves past it through decision 0151's path), or
//! every host holds an older epoch: the term is new to all of them, the floor is proven and the
//! push goes on. A store that records a send of a term above the restore's is proven too: only a
//! proven leadership records one. Pure: the marks and the state come in, a [`FloorCheck`] comes
//! out; the driver removes the marker file and proposes the raise.

use std::collections::BTreeMap;

use crate::store::state::DomainState;

/// Most machines a hold reason names; the rest are counted.
pub const unheard_named_max: usize = 10;

/// What a leader of an unproven store knows of its hosts' marks, for the engine.
#[derive(Clone, Copy, Debug)]
pub(crate) struct UnprovenFloor<'a> {
    /// The restore's term floor.
    pub(crate) restored: u64,
    /// The highest epoch each machine of the model showed this leader in its term.
    pub(crate) marks: &'a BTreeMap<String, u64>,
}

/// What a leader in `term` may do while the floor is unproven.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// Every machine holds an epoch below the term: it is new to all of them.
    Send,
    /// These machines have not shown their epoch in this term yet.
    Wait { unheard: Vec<String> },
    /// `machine` holds `epoch`, at or above the term: the floor must go above it.
    Leave { machine: String, epoch: u64 },
}

/// The rule itself: `required` are the machines whose marks must be known.
pub(crate) fn verdict<'a>(
    term: u64,
    required: impl IntoIterator<Item = &'a String>,
    marks: &BTreeMap<String, u64>,
) -> Verdict {
    let mut unheard = Vec::new();
    let mut highest: Option<(&str, u64)> = None;
    for machine in required {
        match marks.get(machine) {
            None => unheard.push(machine.clone()),
            Some(epoch) if highest.is_none_or(|(_, h)| *epoch > h) => {
                highest = Some((machine, *epoch));
            }
            Some(_) => {}
        }
    }
    // A host already known to hold the term or above settles it, whoever else is unheard.
    if let Some((machine, epoch)) = highest
        && epoch >= term
    {
        return Verdict::Leave {
            machine: machine.to_string(),
            epoch,
        };
    }
    if unheard.is_empty() {
        Verdict::Send
    } else {
        Verdict::Wait { unheard }
    }
}

/// Why the floor is proven now. `Display` is what the log says.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub(crate) enum FloorProof {
    #[error(
        "the store recorded send {epoch}.{sequence} to {machine}, of a term above the restore's {restored}"
    )]
    Recorded {
        machine: String,
        epoch: u64,
        sequence: u64,
        restored: u64,
    },
    #[error("every machine of the model reported an epoch below term {term}")]
    EveryMachineBelow { term: u64 },
}

/// Why a push holds every machine while the floor is unproven. `Display` is each machine's
/// `held` reason, naming the way out.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub(crate) enum FloorHold {
    #[error(
        "floor unproven: this store was restored (term floor {restored}) without its epoch-floor file, so nothing is sent until every machine of the model reported to this leader the epoch it holds; not heard yet in term {term}: {names}. Start their hosts (each reports within its reconcile interval), or remove from the model those that run nothing, then push again. For a host gone for good, restore every replica again with `meshd restore --epoch-floor N`, N at or above the highest epoch any host holds (a higher N only makes the terms jump)",
        names = named(unheard)
    )]
    Unheard {
        restored: u64,
        term: u64,
        unheard: Vec<String>,
    },
    #[error(
        "floor unproven: {machine} holds an envelope of epoch {epoch}, not below this leader's term {term} (the store was restored without its epoch-floor file and the term was used before); {raised} and the leader moves to a term above it. Push again"
    )]
    Leave {
        machine: String,
        epoch: u64,
        term: u64,
        raised: Raised,
    },
}

/// What became of the floor when a host holds the term or above.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub(crate) enum Raised {
    /// The store's floor was above the host's epoch already.
    #[error("the floor is {floor}")]
    Already { floor: u64 },
    #[error("the floor is raised to {floor}")]
    To { floor: u64 },
    #[error("raising the floor to {floor} failed ({error})")]
    Failed { floor: u64, error: String },
}

/// The first [`unheard_named_max`] machines, and how many more.
fn named(unheard: &[String]) -> String {
    let mut names = unheard
        .iter()
        .take(unheard_named_max)
        .map(String::as_str)
        .collect::<Vec<_>>()
        .join(", ");
    if unheard.len() > unheard_named_max {
        names.push_str(&format!(" and {} more", unheard.len() - unheard_named_max));
    }
    names
}

/// What an unproven floor lets a push of `term` do.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum FloorCheck {
    /// The floor is proven: the marker goes, the push goes on.
    Proven(FloorProof),
    /// Every machine of the push is held; nothing is recorded, nothing is sent.
    Hold(FloorHold),
    /// `machine` holds `epoch`, at or above the term, and the store's floor is below it: the
    /// floor goes to `floor`, then every machine is held.
    Raise {
        machine: String,
        epoch: u64,
        floor: u64,
    },
}

/// The send record of `state` that proves a floor restored at `restored`: one of a term above
/// the restore's, which only a proven leadership (or a later one) records.
pub(crate) fn recorded_proof(state: &DomainState, restored: u64) -> Option<FloorProof> {
    let send = state.last_sends.values().find(|s| s.epoch > restored)?;
    Some(FloorProof::Recorded {
        machine: send.machine.clone(),
        epoch: send.epoch,
        sequence: send.sequence,
        restored,
    })
}

/// What a push of the leader in `term` may do under an unproven `floor`. `keep` (a genesis'
/// machine) cannot report before it, so it is not waited for.
pub(crate) fn check(
    term: u64,
    state: &DomainState,
    keep: Option<&str>,
    floor: UnprovenFloor<'_>,
) -> FloorCheck {
    if let Some(proof) = recorded_proof(state, floor.restored) {
        return FloorCheck::Proven(proof);
    }
    let required = state
        .mesh
        .machines
        .keys()
        .filter(|m| Some(m.as_str()) != keep);
    match verdict(term, required, floor.marks) {
        Verdict::Send => FloorCheck::Proven(FloorProof::EveryMachineBelow { term }),
        Verdict::Wait { unheard } => FloorCheck::Hold(FloorHold::Unheard {
            restored: floor.restored,
            term,
            unheard,
        }),
        Verdict::Leave { machine, epoch } => {
            let above = epoch.saturating_add(1);
            if state.epoch_floor >= above {
                FloorCheck::Hold(FloorHold::Leave {
                    machine,
                    epoch,
                    term,
                    raised: Raised::Already {
                        floor: state.epoch_floor,
                    },
                })
            } else {
                // G9: the floor never goes down.
                assert!(
                    above > state.epoch_floor,
                    "a raise to {above} at floor {}",
                    state.epoch_floor
                );
                FloorCheck::Raise {
                    machine,
                    epoch,
                    floor: above,
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn marks(pairs: &[(&str, u64)]) -> BTreeMap<String, u64> {
        pairs.iter().map(|(m, e)| (m.to_string(), *e)).collect()
    }

    fn machines(names: &[&str]) -> Vec<String> {
        names.iter().map(|m| m.to_string()).collect()
    }

    #[test]
    fn g9_an_unproven_floor_sends_only_once_every_machine_showed_an_epoch_below_the_term() {
        // Decision 0274: a lagging host (mark 2.1) beside one not heard yet must not make term 2
        // look new; only every machine's mark below the term does.
        let all = machines(&["ace", "bee", "cat"]);
        assert_eq!(
            verdict(3, &all, &marks(&[("ace", 1), ("bee", 2)])),
            Verdict::Wait {
                unheard: machines(&["cat"])
            }
        );
        assert_eq!(
            verdict(3, &all, &marks(&[("ace", 1), ("bee", 2), ("cat", 0)])),
            Verdict::Send
        );
        // The term itself held by a host (2.1 under a leader of term 2) is a term used before.
        assert_eq!(
            verdict(2, &all, &marks(&[("ace", 1), ("bee", 2)])),
            Verdict::Leave {
                machine: "bee".into(),
                epoch: 2
            }
        );
        assert_eq!(
            verdict(2, &all, &marks(&[("ace", 5), ("bee", 2), ("cat", 1)])),
            Verdict::Leave {
                machine: "ace".into(),
                epoch: 5
            }
        );
        // A model without machines has nothing to wait for.
        assert_eq!(verdict(2, &machines(&[]), &marks(&[])), Verdict::Send);
    }

    #[test]
    fn g9_a_hold_names_at_most_unheard_named_max_machines_and_counts_the_rest() {
        // Decision 0274: the reason names the machines to start, bounded for a fleet.
        let unheard: Vec<String> = (0..unheard_named_max + 2)
            .map(|i| format!("m{i:02}"))
            .collect();
        let hold = FloorHold::Unheard {
            restored: 1,
            term: 2,
            unheard,
        };
        let text = hold.to_string();
        assert!(text.contains("not heard yet in term 2: m00, m01"), "{text}");
        assert!(text.contains("m09 and 2 more."), "{text}");
        assert!(!text.contains("m10"), "{text}");
    }
}
