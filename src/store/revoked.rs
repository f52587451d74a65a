//! The deny list as the store keeps it (issue 15 part 5, decision 0172): revoked certificates (by
//! serial) and principals, each with why, who and when. Changed only by `Command::Revoke` and by a
//! model apply that drops or brings back a machine; bounded by [`deny_entries_max`].

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

use super::command::{Applied, Proposal, Refusal};
use super::state::{Changed, DomainState};
use crate::core::model::Mesh;

/// Most entries the deny list holds; a revocation past it is refused and changes nothing.
pub const deny_entries_max: usize = mesh_transport::trust::deny_entries_max;

/// Longest `why` of a revocation, in bytes.
pub const why_bytes_max: usize = mesh_transport::trust::why_bytes_max;

/// Longest serial, in hex digits (RFC 5280: at most 20 bytes).
pub const serial_hex_max: usize = 40;

/// What a deny entry refuses.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum RevokedTarget {
    /// One certificate: lowercase hex, no leading zero bytes, as `meshctl certs` shows it.
    Serial(String),
    /// Every certificate naming this principal, in its display form (`host:ace`).
    Principal(String),
}

impl RevokedTarget {
    /// The key of its row: `serial:<hex>` or `principal:<kind>:<name>`.
    pub fn key(&self) -> String {
        match self {
            RevokedTarget::Serial(s) => format!("serial:{s}"),
            RevokedTarget::Principal(p) => format!("principal:{p}"),
        }
    }

    /// Parses what `meshctl certs revoke` was given: a principal (`host:ace`) or a serial (hex,
    /// colons allowed). Checked the same on every replica, so any proposer gets the same answer.
    pub fn parse(text: &str) -> Result<RevokedTarget, String> {
        if text.contains(':')
            && let Ok(p) = text.parse::<mesh_transport::Principal>()
        {
            return Ok(RevokedTarget::Principal(p.to_string()));
        }
        let hex: String = text
            .chars()
            .filter(|c| *c != ':')
            .map(|c| c.to_ascii_lowercase())
            .collect();
        let trimmed = hex.trim_start_matches('0');
        let good = !trimmed.is_empty()
            && hex.len() <= serial_hex_max
            && hex.chars().all(|c| c.is_ascii_hexdigit());
        if !good {
            return Err(format!(
                "`{text}` is neither a principal (replica:<id>, host:<name>, operator:<name>) nor a certificate serial (up to {serial_hex_max} hex digits, as `meshctl certs list` shows it)"
            ));
        }
        // Whole bytes, as certificates carry them: an odd count gets its leading zero back.
        let serial = if trimmed.len() % 2 == 1 {
            format!("0{trimmed}")
        } else {
            trimmed.to_string()
        };
        Ok(RevokedTarget::Serial(serial))
    }
}

impl std::fmt::Display for RevokedTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RevokedTarget::Serial(s) => write!(f, "serial {s}"),
            RevokedTarget::Principal(p) => write!(f, "{p}"),
        }
    }
}

/// One revocation.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DenyEntry {
    pub target: RevokedTarget,
    pub why: String,
    pub actor: String,
    pub epoch: u64,
    pub time_ms: u64,
    /// Made by a model apply that dropped the machine; a later apply that brings the machine back
    /// lifts it (an operator's revocation stays).
    pub by_model: bool,
}

/// The deny list, by row key.
pub type DenyMap = BTreeMap<String, DenyEntry>;

/// The list as every declaration carries it: row key → why.
pub fn declared(list: &DenyMap) -> BTreeMap<String, String> {
    list.iter()
        .map(|(k, e)| (k.clone(), e.why.clone()))
        .collect()
}

/// The list as the transport enforces it.
pub fn to_transport(list: &DenyMap) -> Result<mesh_transport::DenyList, String> {
    let entries = list.values().filter_map(|e| {
        let what = match &e.target {
            RevokedTarget::Serial(s) => mesh_transport::Revoked::Serial(s.clone()),
            // Checked when it was revoked; a row that does not parse is skipped, not fatal.
            RevokedTarget::Principal(p) => mesh_transport::Revoked::Principal(p.parse().ok()?),
        };
        Some((what, e.why.clone()))
    });
    mesh_transport::DenyList::new(entries)
}

fn check_why(why: &str) -> Result<(), Refusal> {
    if why.trim().is_empty() || why.len() > why_bytes_max || why.contains('\n') {
        return Err(Refusal::Invalid(format!(
            "--why must be one line of 1..={why_bytes_max} bytes; say why the certificate is revoked"
        )));
    }
    Ok(())
}

fn check_room(state: &DomainState, adding: usize) -> Result<(), Refusal> {
    if state.revoked.len() + adding > deny_entries_max {
        return Err(Refusal::Invalid(format!(
            "the deny list holds {} entries, the most it may hold is {deny_entries_max}; nothing was changed",
            state.revoked.len()
        )));
    }
    Ok(())
}

/// `Command::Revoke`: adds `target` (checked again here, for any proposer). Revoking what is
/// already revoked keeps the first entry and changes nothing.
pub(crate) fn revoke(
    state: &mut DomainState,
    p: &Proposal,
    target: &RevokedTarget,
    why: &str,
    changed: &mut Vec<Changed>,
) -> Result<Applied, Refusal> {
    let shown = match target {
        RevokedTarget::Serial(s) | RevokedTarget::Principal(s) => s,
    };
    if RevokedTarget::parse(shown).as_ref() != Ok(target) {
        return Err(Refusal::Invalid(format!(
            "{target} is not in the form the deny list keeps; revoke it through meshctl"
        )));
    }
    check_why(why)?;
    let key = target.key();
    if !state.revoked.contains_key(&key) {
        check_room(state, 1)?;
        state.revoked.insert(
            key.clone(),
            DenyEntry {
                target: target.clone(),
                why: why.to_string(),
                actor: p.actor.clone(),
                epoch: p.epoch,
                time_ms: p.time_ms,
                by_model: false,
            },
        );
        changed.push(Changed::Revoked(key));
        // A replica's principal retires its signing key too (decision 0294): its added key,
        // if it has one, leaves the state in the same commit.
        if let Some(replica) = retired_replica(target)
            && state.signers.remove(&replica).is_some()
        {
            changed.push(Changed::Signer(replica));
        }
        // Every declaration carries the list: a revocation makes every machine behind.
        state.bump(changed);
    }
    Ok(Applied::Revoked {
        target: target.clone(),
        entries: state.revoked.len(),
    })
}

impl RevokedTarget {
    /// The revocation that retires replica `id` (decision 0294): its principal `replica:<id>`.
    pub fn retiring(id: u64) -> RevokedTarget {
        RevokedTarget::Principal(format!("replica:{id}"))
    }
}

/// The replica a revocation retires: `Some(id)` for the principal `replica:<id>`.
pub fn retired_replica(target: &RevokedTarget) -> Option<u64> {
    match target {
        RevokedTarget::Principal(p) => p.strip_prefix("replica:")?.parse().ok(),
        RevokedTarget::Serial(_) => None,
    }
}

/// Part of a model apply: a machine the new model drops has its host principal revoked; one it
/// brings back has a revocation the model made lifted. Runs before anything else of the apply
/// changes, so a full list refuses the whole apply.
pub(crate) fn revoke_dropped_machines(
    state: &mut DomainState,
    p: &Proposal,
    mesh: &Mesh,
    changed: &mut Vec<Changed>,
) -> Result<(), Refusal> {
    let dropped: Vec<String> = state
        .mesh
        .machines
        .keys()
        .filter(|m| !mesh.machines.contains_key(*m))
        .cloned()
        .collect();
    let new_rows: Vec<RevokedTarget> = dropped
        .iter()
        .map(|m| RevokedTarget::Principal(format!("host:{m}")))
        .filter(|t| !state.revoked.contains_key(&t.key()))
        .collect();
    check_room(state, new_rows.len())?;
    for target in new_rows {
        let key = target.key();
        let why = format!("{target} removed from the model");
        state.revoked.insert(
            key.clone(),
            DenyEntry {
                target,
                why,
                actor: p.actor.clone(),
                epoch: p.epoch,
                time_ms: p.time_ms,
                by_model: true,
            },
        );
        changed.push(Changed::Revoked(key));
    }
    for machine in mesh.machines.keys() {
        if state.mesh.machines.contains_key(machine) {
            continue;
        }
        let key = RevokedTarget::Principal(format!("host:{machine}")).key();
        if state.revoked.get(&key).is_some_and(|e| e.by_model) {
            state.revoked.remove(&key);
            changed.push(Changed::Revoked(key));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::command::{Command, Outcome};

    fn proposal(command: Command) -> Proposal {
        Proposal {
            epoch: 1,
            expect_revision: None,
            actor: "operator:alice".into(),
            time_ms: 0,
            command,
        }
    }

    fn mesh(machines: &[&str]) -> Mesh {
        let text: String = machines
            .iter()
            .map(|m| format!("[machines.{m}]\naddress = \"127.0.0.1\"\n"))
            .collect();
        crate::core::meshfile::parse_mesh("t.toml", &text).expect("mesh")
    }

    fn apply(state: &mut DomainState, command: Command) -> Outcome {
        state.apply(1, &proposal(command)).0
    }

    fn model(machines: &[&str]) -> Command {
        Command::ApplyModel {
            mesh: mesh(machines),
            why: "t".into(),
            changes: vec![],
        }
    }

    #[test]
    fn removing_a_machine_revokes_its_host_and_adding_it_back_lifts_only_that() {
        // Revocation: a machine out of the model is out of the mesh; back in, it is let in again,
        // but an operator's revocation stays.
        let mut state = DomainState::default();
        assert!(matches!(
            apply(&mut state, model(&["ace", "g14"])),
            Outcome::Applied(_)
        ));
        assert!(state.revoked.is_empty());
        assert!(matches!(
            apply(&mut state, model(&["ace"])),
            Outcome::Applied(_)
        ));
        let entry = state
            .revoked
            .get("principal:host:g14")
            .expect("g14 revoked");
        assert!(entry.by_model);
        assert!(
            entry.why.contains("removed from the model"),
            "{}",
            entry.why
        );
        let by_operator = Command::Revoke {
            target: RevokedTarget::Principal("host:ace".into()),
            why: "lost".into(),
        };
        let revision = state.revision;
        assert!(matches!(
            apply(&mut state, by_operator),
            Outcome::Applied(_)
        ));
        assert_eq!(
            state.revision,
            revision + 1,
            "a revocation makes every machine behind"
        );
        assert!(matches!(
            apply(&mut state, model(&["ace", "g14"])),
            Outcome::Applied(_)
        ));
        assert!(!state.revoked.contains_key("principal:host:g14"));
        assert!(state.revoked.contains_key("principal:host:ace"));
    }

    #[test]
    fn a_full_deny_list_refuses_the_next_revocation_and_changes_nothing() {
        // Revocation: the list is bounded; over it, one clear refusal and nothing written.
        // The floor is at the term already: a refusal changes nothing at all.
        let mut state = DomainState {
            epoch_floor: 1,
            ..DomainState::default()
        };
        for i in 0..deny_entries_max {
            let target = RevokedTarget::Serial(format!("{:04x}", i + 1));
            state.revoked.insert(
                target.key(),
                DenyEntry {
                    target,
                    why: "t".into(),
                    actor: "t".into(),
                    epoch: 1,
                    time_ms: 0,
                    by_model: false,
                },
            );
        }
        let before = state.clone();
        let one_more = Command::Revoke {
            target: RevokedTarget::Serial("ffff".into()),
            why: "t".into(),
        };
        match state.apply(1, &proposal(one_more)) {
            (Outcome::Refused(r), changed) => {
                assert!(r.to_string().contains("nothing was changed"), "{r}");
                assert!(changed.is_empty(), "{changed:?}");
            }
            other => panic!("not refused: {other:?}"),
        }
        assert_eq!(state, before);
        let bad_why = Command::Revoke {
            target: RevokedTarget::Serial("ab".into()),
            why: " ".into(),
        };
        assert!(matches!(apply(&mut state, bad_why), Outcome::Refused(_)));
    }

    #[test]
    fn revoke_targets_parse_as_principals_or_serials_and_nothing_else() {
        // Revocation: one spelling per certificate, so a serial revoked matches the one refused.
        assert_eq!(
            RevokedTarget::parse("host:ace"),
            Ok(RevokedTarget::Principal("host:ace".into()))
        );
        assert_eq!(
            RevokedTarget::parse("00:3F:a1"),
            Ok(RevokedTarget::Serial("3fa1".into()))
        );
        assert_eq!(
            RevokedTarget::parse("fa1"),
            Ok(RevokedTarget::Serial("0fa1".into()))
        );
        for bad in ["", "0000", "host:Ace", "xyz", &"a".repeat(41)] {
            assert!(RevokedTarget::parse(bad).is_err(), "{bad:?} accepted");
        }
    }
}
