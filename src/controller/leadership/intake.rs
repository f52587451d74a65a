//! Report intake as a pure core (issue 22 item 1, decision 0321): every decision the leader makes
//! on a host's report before it is filed — the frame's machine (G10), the bounds, an epoch claimed
//! above the floor (G9, decision 0101), a term another leadership signed (decision 0272), how far
//! the floor goes up (decision 0151), the mark an unproven floor counts (decision 0274) — and
//! whether it is filed or only heard (decision 0216). The report as decoded, the state and the
//! trusted keys come in as plain data; an [`Admission`] comes out. No I/O, no clock, no lock, no
//! await: `Service::report` reads the state once, calls [`admit`], then carries the admission out
//! (proposes the raise, notes the mark, files through `reports`).

use std::collections::BTreeMap;

use ed25519_dalek::VerifyingKey;

use crate::core::envelope::{EnvelopeHeader, EpochProof, Position, ProofError, epoch_max};
use crate::core::report::{Account, OverBound, Report, ReportPosition, report_modules_max};
use crate::core::wire::{MachineMismatch, check_report_machine};
use crate::store::command::SendRecord;
use crate::store::state::DomainState;

/// Everything the leader knows when it decides on one report.
pub(crate) struct Intake<'a> {
    /// The term this replica leads in.
    pub(crate) term: u64,
    /// The machine the frame names (the host's certificate, G10).
    pub(crate) frame_machine: &'a str,
    /// The report as decoded.
    pub(crate) report: &'a Report,
    /// The committed state as the leader reads it now.
    pub(crate) state: &'a DomainState,
    /// The replica keys an epoch proof may be signed with (`Service::proof_keys`).
    pub(crate) trusted: &'a BTreeMap<u64, VerifyingKey>,
    /// The restore's term floor while the floor is unproven (decision 0274), else `None`.
    pub(crate) unproven: Option<u64>,
}

/// What the leader does with one report.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Admission {
    /// Not filed; the host is told why (or, for an impostor, the request fails).
    Refused(Refusal),
    /// Filed or heard (`reports::route` decides which), after raising the floor to `raise` and
    /// noting `mark`, in that order: a push of an unproven floor reads the mark only once the
    /// raise committed.
    Admitted {
        raise: Option<Raise>,
        mark: Option<Mark>,
    },
}

/// Why a report is not filed. `Display` is what the host is told and the log says.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub(crate) enum Refusal {
    /// Its body names another machine than its frame (G10): the request fails, nothing is filed.
    #[error(transparent)]
    Impostor(MachineMismatch),
    /// A position no host reaches: corrupt or forged.
    #[error(
        "the report claims epoch {epoch} sequence {sequence} report {report_sequence}, beyond the highest a host reaches ({epoch_max}); it is corrupt or forged and is not filed"
    )]
    Beyond {
        epoch: u64,
        sequence: u64,
        report_sequence: u64,
    },
    /// Over its bounds (issue 23 part 2, decision 0299).
    #[error("report refused: {0}")]
    OverBound(OverBound),
    /// An epoch above the floor without a header signed by a trusted replica (G9): one host
    /// certificate must not raise the cluster's floor by saying so.
    #[error("the report claims epoch {epoch} above the floor {floor} but {why}; it is not filed")]
    EpochUnproven {
        epoch: u64,
        floor: u64,
        why: ProofError,
    },
}

impl Refusal {
    /// The `outcome` label it is counted under in `mesh_reports_total`.
    pub(crate) fn counted_as(&self) -> &'static str {
        match self {
            Refusal::Impostor(_) => "error",
            Refusal::Beyond { .. } => "beyond",
            Refusal::OverBound(_) => "over_bound",
            Refusal::EpochUnproven { .. } => "unproven",
        }
    }
}

/// The floor goes up to `floor` before the report is filed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Raise {
    pub(crate) floor: u64,
    pub(crate) why: RaiseWhy,
}

/// Why the floor goes up.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum RaiseWhy {
    /// Another leadership signed envelopes of this leader's own term (decision 0272): the floor
    /// goes above the term, so `keep_floor` moves the leader past it.
    Reused(Reused),
    /// The host proved an epoch above the floor: it has seen a leader this store does not
    /// remember (a store restored from an old backup, decision 0151).
    Above { epoch: u64 },
}

/// How a proven header shows that another leadership signed envelopes of `term` (decision 0272).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub(crate) enum Reused {
    #[error("no send of term {term} to {machine} is recorded")]
    NotRecorded { term: u64, machine: String },
    #[error("the last send of term {term} to {machine} recorded is {term}.{recorded}")]
    Past {
        term: u64,
        machine: String,
        recorded: u64,
    },
    #[error("{term}.{sequence} was recorded with another digest")]
    OtherDigest { term: u64, sequence: u64 },
}

/// What a report tells an unproven floor (decision 0274).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Mark {
    /// The host holds `epoch`: it counts towards the verdict.
    Counts { epoch: u64 },
    /// An epoch at or above the term without a header signed by a trusted replica: it does not
    /// count, the machine stays unheard (the report itself is filed as any other).
    DoesNotCount { epoch: u64, why: ProofError },
}

/// Decides on one report (pure).
pub(crate) fn admit(i: Intake<'_>) -> Admission {
    let report = i.report;
    if let Err(mismatch) = check_report_machine(i.frame_machine, report) {
        return Admission::Refused(Refusal::Impostor(mismatch));
    }
    if report.beyond_bound() {
        return Admission::Refused(Refusal::Beyond {
            epoch: report.epoch,
            sequence: report.sequence,
            report_sequence: report.report_sequence,
        });
    }
    let (modules_max, limit) = modules_bound(i.state, report);
    if let Err(over) = report.check_bounds(modules_max, limit) {
        return Admission::Refused(Refusal::OverBound(over));
    }
    // Verified once: the claim above the floor, the reused term and the mark all ask the same.
    let proof = proven(report, i.trusted);
    let floor = i.state.epoch_floor;
    if report.epoch > floor
        && let Err(why) = &proof
    {
        return Admission::Refused(Refusal::EpochUnproven {
            epoch: report.epoch,
            floor,
            why: why.clone(),
        });
    }
    let reused = proof.as_ref().ok().and_then(|proof| {
        let recorded = i.state.last_sends.get(&report.machine);
        reused_by_another(i.term, &proof.header, recorded)
    });
    let raise = raise_of(i.term, report.epoch, floor, reused);
    if let Some(raise) = &raise {
        // G9: the floor never goes down; a raise at or below it is a bug here.
        assert!(
            raise.floor > floor,
            "a raise to {} at floor {floor}",
            raise.floor
        );
    }
    let mark = i
        .unproven
        .filter(|_| i.state.mesh.machines.contains_key(&report.machine))
        .map(|_| mark_of(i.term, report.epoch, &proof));
    Admission::Admitted { raise, mark }
}

/// The report's proof, verified against `trusted` for the position it claims.
fn proven<'r>(
    report: &'r Report,
    trusted: &BTreeMap<u64, VerifyingKey>,
) -> Result<&'r EpochProof, ProofError> {
    let position = Position {
        epoch: report.epoch,
        sequence: report.sequence,
    };
    let proof = report.proof.as_ref().ok_or(ProofError::Missing)?;
    proof.verify(trusted, &report.machine, position)?;
    Ok(proof)
}

/// How far the floor goes: above the term when another leadership used it, to a proven epoch
/// above the floor; `None` when neither is above the floor. The floor never goes down.
fn raise_of(term: u64, epoch: u64, floor: u64, reused: Option<Reused>) -> Option<Raise> {
    let raise = match reused {
        Some(reused) => Raise {
            floor: term.saturating_add(1).max(epoch),
            why: RaiseWhy::Reused(reused),
        },
        None => Raise {
            floor: epoch,
            why: RaiseWhy::Above { epoch },
        },
    };
    (raise.floor > floor).then_some(raise)
}

/// The mark a report shows an unproven floor in `term`: an epoch at or above the term counts
/// only with its proof (G9: an unproven claim does not count); an older one cannot mislead anyone
/// but its host.
fn mark_of(term: u64, epoch: u64, proof: &Result<&EpochProof, ProofError>) -> Mark {
    match proof {
        Err(why) if epoch >= term && epoch > 0 => Mark::DoesNotCount {
            epoch,
            why: why.clone(),
        },
        _ => Mark::Counts { epoch },
    }
}

/// The most modules `report` may list, and the bound's name: as many as the declaration it says
/// it applied, when this store recorded that send (position and digest); else
/// `report_modules_max`, the most any declaration holds.
pub(crate) fn modules_bound(state: &DomainState, report: &Report) -> (usize, &'static str) {
    match state.last_sends.get(&report.machine) {
        Some(send)
            if send.epoch == report.epoch
                && send.sequence == report.sequence
                && Some(send.digest) == report.applied =>
        {
            (send.summary.modules.len(), "the declaration it applied")
        }
        _ => (report_modules_max, "report_modules_max"),
    }
}

/// How the signed `header` (already verified) proves that another leadership signed envelopes
/// of `term`, given the machine's last recorded send, or `None` (decision 0272). Every envelope
/// this leadership signs has its send record applied before it is written, so a signed position
/// of `term` past the last recorded send of `term`, or the same sequence with another digest, is
/// one this store never made. Positions below the last record are not looked up (that would read
/// the sends table on every report). Only what the signature covers counts: the digest the host
/// asserts beside the proof (`report.applied`) is its word alone.
pub(crate) fn reused_by_another(
    term: u64,
    header: &EnvelopeHeader,
    recorded: Option<&SendRecord>,
) -> Option<Reused> {
    if header.epoch != term || header.sequence == 0 {
        return None;
    }
    let machine = header.machine.clone();
    match recorded.filter(|s| s.epoch == term) {
        None => Some(Reused::NotRecorded { term, machine }),
        Some(s) if header.sequence > s.sequence => Some(Reused::Past {
            term,
            machine,
            recorded: s.sequence,
        }),
        Some(s) if header.sequence == s.sequence && header.digest != s.digest => {
            Some(Reused::OtherDigest {
                term,
                sequence: s.sequence,
            })
        }
        Some(_) => None,
    }
}

/// What to do with a report admitted (decision 0216).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Route {
    /// It says what the account says: answer filed, keep it in memory only.
    Heard,
    /// Propose it, with the position heard so far (a report at or below it is refused).
    File { heard: Option<ReportPosition> },
    /// Its host has `reports_in_flight_per_host_max` reports queued or committing already: it
    /// is told to try again.
    Busy,
}

/// The rule (pure): a report is only heard, not proposed, when it is newer than the account's
/// last and than anything heard, says the same as the account's last report, no report of its
/// machine is being filed (the account may be about to change), and the leader has applied its
/// own term's entries (the account it reads is the latest committed).
pub fn route(
    account: Option<&Account>,
    heard: Option<ReportPosition>,
    in_flight: bool,
    caught_up: bool,
    report: &Report,
) -> Route {
    let file = Route::File { heard };
    let Some(account) = account else { return file };
    let Some(last) = account.report.as_ref() else {
        return file;
    };
    let high = account.last.max(heard);
    let newer = high.is_none_or(|h| report.position() > h);
    if newer && !in_flight && caught_up && last.says_the_same(report) {
        Route::Heard
    } else {
        file
    }
}

#[cfg(test)]
mod tests;
