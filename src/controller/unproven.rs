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
//!
//! What this holds is whether the floor is unproven (the marker's term floor); the marks a leader
//! heard are its leadership's, for its term only (`leadership::Leadership`, decision 0327). The
//! decisions are pure elsewhere
//! (decision 0321): which mark counts in report intake (`leadership::intake`), whether a push
//! holds in the push engine (`engine::floor`).

use std::sync::Mutex;

use super::engine::floor::{FloorProof, recorded_proof};
use super::floor::clear_unproven;
use super::leadership::Leadership;
use super::leadership::intake::Mark;
use super::service::Service;
use crate::core::report::Report;
use crate::store::state::DomainState;

/// Whether this replica's store is unproven after a restore.
pub(crate) struct Unproven {
    /// The restore's term floor while the floor is unproven; `None` once proven (or never
    /// restored without a floor).
    restored: Mutex<Option<u64>>,
}

impl Unproven {
    /// `restored`: the marker's term floor, read at start.
    pub(crate) fn new(restored: Option<u64>) -> Unproven {
        Unproven {
            restored: Mutex::new(restored),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<u64>> {
        // Only a plain value is kept under it.
        self.restored
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The restore's term floor while the floor is unproven.
    pub(crate) fn restored(&self) -> Option<u64> {
        *self.lock()
    }

    /// Forgets the restore; true when the floor was unproven until now.
    fn prove(&self) -> bool {
        self.lock().take().is_some()
    }
}

impl Service {
    /// Notes the mark the intake core found in a report, as `leadership`, while the floor is
    /// unproven (decision 0274); one that does not count is only logged.
    pub(crate) fn note_mark(&self, leadership: &Leadership, report: &Report, mark: Mark) {
        let term = leadership.term();
        match mark {
            Mark::Counts { epoch } => {
                if self.unproven.restored().is_some() {
                    leadership.heard_mark(&report.machine, epoch);
                }
            }
            Mark::DoesNotCount { epoch, why } => {
                // The report itself is filed as any other (its epoch is not above the floor);
                // only its claim does not count here.
                tracing::warn!(machine = %report.machine, epoch, term, %why,
                    "a report claims an epoch at or above this leader's term while the floor is unproven, but {why}; it does not count, the machine stays unheard");
            }
        }
    }

    /// Drops the marker once the store records a send of a term above the restore's: only a
    /// leadership that proved its term records one (or one of a later term). True when dropped.
    pub(crate) fn clear_if_proven(&self, state: &DomainState) -> bool {
        let Some(restored) = self.unproven.restored() else {
            return false;
        };
        let Some(proof) = recorded_proof(state, restored) else {
            return false;
        };
        self.floor_proven(&proof);
        true
    }

    /// Forgets the restore and removes the marker, as the engine or the store proved the floor.
    pub(crate) fn floor_proven(&self, why: &FloorProof) {
        if let Some(leadership) = self.office.held() {
            leadership.forget_marks();
        }
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
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn g9_the_restore_is_unproven_until_proven_once() {
        // The marks are the leadership's, for its term (`leadership::tests`).
        let u = Unproven::new(Some(1));
        assert_eq!(u.restored(), Some(1));
        assert!(u.prove());
        assert!(!u.prove());
        assert_eq!(u.restored(), None);
    }
}
