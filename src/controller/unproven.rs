//! The epoch floor after a restore without its floor file (G9, decision 0274).
//!
//! Such a store does not know which epochs the leaderships after its backup used, so its first
//! leader may be elected in a term the hosts already hold (decision 0272 found it). While the
//! floor is unproven (the `floor-unproven` marker beside the store, `floor.rs`) the leader sends
//! nothing until every machine of the model reported to it, in its term, the epoch it holds; an
//! epoch at or above the term counts only with its signed header. Then either some host holds an
//! epoch at or above the term, and the floor goes above that epoch (the leader moves past it
//! through decision 0151's path, and the next leadership asks again), or every host holds an older
//! epoch: the term is new to all of them, the marker goes and the push goes on. Each replica drops
//! its marker once its store records a send of a term above the restore's: only a proven
//! leadership records one.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use super::api::{ApiError, PushLine, PushOutcome, PushTarget, PushView};
use super::engine::plan_dry;
use super::floor::clear_unproven;
use super::planview::Reveal;
use super::service::Service;
use crate::core::envelope::Position;
use crate::core::report::Report;
use crate::store::command::Command;
use crate::store::state::DomainState;

/// Most machines a hold reason names; the rest are counted.
pub const unheard_named_max: usize = 10;

/// What a leader of an unproven store knows of its hosts' marks.
pub(crate) struct Unproven {
    inner: Mutex<Inner>,
}

struct Inner {
    /// The restore's term floor while the floor is unproven; `None` once proven (or never
    /// restored without a floor).
    restored: Option<u64>,
    /// The term `marks` were heard in.
    term: u64,
    /// The highest epoch each machine of the model showed in `term` (bounded by the model).
    marks: BTreeMap<String, u64>,
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

/// The rule itself, pure: `required` are the machines whose marks must be known.
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

impl Unproven {
    /// `restored`: the marker's term floor, read at start.
    pub(crate) fn new(restored: Option<u64>) -> Unproven {
        Unproven {
            inner: Mutex::new(Inner {
                restored,
                term: 0,
                marks: BTreeMap::new(),
            }),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        // A panic while holding it leaves at worst a mark not noted: the leader waits longer.
        self.inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The restore's term floor while the floor is unproven.
    pub(crate) fn restored(&self) -> Option<u64> {
        self.lock().restored
    }

    fn heard(&self, term: u64, machine: &str, epoch: u64) {
        let mut inner = self.lock();
        if inner.restored.is_none() || term < inner.term {
            return;
        }
        if term > inner.term {
            inner.term = term;
            inner.marks.clear();
        }
        let mark = inner.marks.entry(machine.to_string()).or_default();
        *mark = (*mark).max(epoch);
    }

    fn marks(&self, term: u64) -> BTreeMap<String, u64> {
        let inner = self.lock();
        if inner.term == term {
            inner.marks.clone()
        } else {
            BTreeMap::new()
        }
    }

    /// Forgets the restore; true when the floor was unproven until now.
    fn prove(&self) -> bool {
        let mut inner = self.lock();
        inner.marks.clear();
        inner.restored.take().is_some()
    }
}

impl Service {
    /// Notes the epoch a report shows, as leader in `term`, while the floor is unproven. An
    /// epoch at or above the term counts only with a proof signed by a trusted replica (G9: an
    /// unproven claim does not count); an older one cannot mislead anyone but its host.
    pub(crate) fn note_mark(&self, term: u64, report: &Report) {
        if self.unproven.restored().is_none() {
            return;
        }
        let Ok(state) = self.app.state() else {
            return;
        };
        if !state.mesh.machines.contains_key(&report.machine) {
            return;
        }
        if report.epoch >= term && report.epoch > 0 {
            let position = Position {
                epoch: report.epoch,
                sequence: report.sequence,
            };
            let proven = match &report.proof {
                None => Err("it carries no proof".to_string()),
                Some(proof) => proof
                    .verify(&self.proof_keys(&state), &report.machine, position)
                    .map_err(|e| e.to_string()),
            };
            if let Err(why) = proven {
                // The report itself is filed as any other (its epoch is not above the floor);
                // only its claim does not count here.
                tracing::warn!(machine = %report.machine, epoch = report.epoch, term, %why,
                    "a report claims an epoch at or above this leader's term while the floor is unproven, but {why}; it does not count, the machine stays unheard");
                return;
            }
        }
        self.unproven.heard(term, &report.machine, report.epoch);
    }

    /// Why a push of the leader in `term` must hold every machine while the floor is unproven,
    /// or `None` when it may send. `keep` (a genesis' machine) cannot report before it.
    pub(crate) async fn floor_wait(
        &self,
        term: u64,
        state: &DomainState,
        keep: Option<&str>,
    ) -> Option<String> {
        let restored = self.unproven.restored()?;
        if self.clear_if_proven(state) {
            return None;
        }
        let marks = self.unproven.marks(term);
        let required = state
            .mesh
            .machines
            .keys()
            .filter(|m| Some(m.as_str()) != keep);
        match verdict(term, required, &marks) {
            Verdict::Send => {
                self.floor_proven(&format!(
                    "every machine of the model reported an epoch below term {term}"
                ));
                None
            }
            Verdict::Wait { unheard } => {
                let mut names = unheard
                    .iter()
                    .take(unheard_named_max)
                    .map(String::as_str)
                    .collect::<Vec<_>>()
                    .join(", ");
                if unheard.len() > unheard_named_max {
                    names.push_str(&format!(" and {} more", unheard.len() - unheard_named_max));
                }
                Some(format!(
                    "floor unproven: this store was restored (term floor {restored}) without its epoch-floor file, so nothing is sent until every machine of the model reported to this leader the epoch it holds; not heard yet in term {term}: {names}. Start their hosts (each reports within its reconcile interval), or remove from the model those that run nothing, then push again. For a host gone for good, restore every replica again with `meshd restore --epoch-floor N`, N at or above the highest epoch any host holds (a higher N only makes the terms jump)"
                ))
            }
            Verdict::Leave { machine, epoch } => {
                let floor = epoch.saturating_add(1);
                let actor = format!("host:{machine}");
                let raise = Command::RaiseEpochFloor { epoch: floor };
                let raised = if state.epoch_floor >= floor {
                    format!("the floor is {}", state.epoch_floor)
                } else {
                    match self.propose(term, None, &actor, raise).await {
                        Ok(_) => format!("the floor is raised to {floor}"),
                        Err(e) => format!("raising the floor to {floor} failed ({e})"),
                    }
                };
                tracing::warn!(machine = %machine, epoch, term, floor, "floor unproven after a restore: a host holds an epoch at or above this leader's term; leaving the term");
                Some(format!(
                    "floor unproven: {machine} holds an envelope of epoch {epoch}, not below this leader's term {term} (the store was restored without its epoch-floor file and the term was used before); {raised} and the leader moves to a term above it. Push again"
                ))
            }
        }
    }

    /// Drops the marker once the store records a send of a term above the restore's: only a
    /// leadership that proved its term records one (or one of a later term). True when dropped.
    pub(crate) fn clear_if_proven(&self, state: &DomainState) -> bool {
        let Some(restored) = self.unproven.restored() else {
            return false;
        };
        let Some(send) = state.last_sends.values().find(|s| s.epoch > restored) else {
            return false;
        };
        self.floor_proven(&format!(
            "the store recorded send {}.{} to {}, of a term above the restore's {restored}",
            send.epoch, send.sequence, send.machine
        ));
        true
    }

    fn floor_proven(&self, why: &str) {
        if !self.unproven.prove() {
            return;
        }
        if let Err(e) = clear_unproven(self.config.data_dir()) {
            // The marker back at the next start only makes that leader ask its hosts again.
            tracing::warn!(error = %e, "the floor-unproven marker could not be removed");
        }
        tracing::warn!(
            replica = self.id,
            "EPOCH FLOOR PROVEN after the restore: {why}; sends go on"
        );
    }

    /// The answer of a push held while the floor is unproven: every machine it would send to,
    /// held with `reason`; nothing recorded, nothing sent.
    pub(crate) fn floor_held(
        &self,
        state: &Arc<DomainState>,
        epoch: u64,
        target: PushTarget,
        moves: Vec<String>,
        reason: &str,
    ) -> Result<PushView, ApiError> {
        let planned = self.with_work(state, |work| {
            plan_dry(state, work, target, moves, &Reveal::none())
        })??;
        let lines = planned
            .machines
            .into_iter()
            .map(|m| PushLine {
                machine: m.machine,
                outcome: PushOutcome::Held {
                    reason: reason.to_string(),
                    holds: vec![],
                },
            })
            .collect();
        Ok(PushView { epoch, lines })
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
    fn g9_marks_are_kept_for_one_term_and_only_while_unproven() {
        let u = Unproven::new(Some(1));
        u.heard(2, "ace", 1);
        u.heard(2, "ace", 0);
        assert_eq!(u.marks(2), marks(&[("ace", 1)]));
        // A new term asks again: another leader may have sent between.
        u.heard(3, "bee", 2);
        assert_eq!(u.marks(3), marks(&[("bee", 2)]));
        assert_eq!(u.marks(2), marks(&[]));
        u.heard(2, "cat", 1);
        assert_eq!(u.marks(3), marks(&[("bee", 2)]));
        assert!(u.prove());
        assert!(!u.prove());
        u.heard(3, "ace", 1);
        assert_eq!(u.marks(3), marks(&[]));
        assert_eq!(u.restored(), None);
    }
}
