//! The envelope keys of replicas added to a running cluster (issue 12 part 4, decision 0230):
//! `Command::SetSigner` puts a replica's ed25519 verifying key into the replicated state or takes
//! it out; every declaration carries the set (`Declaration::signers`), so a host trusts the key
//! before the replica it belongs to can lead. The founding replicas' keys are in every host's
//! `host.toml` and need not be here.

use std::collections::BTreeMap;

use super::command::{Applied, Proposal, Refusal};
use super::state::{Changed, DomainState};

/// Most added replicas' keys the state keeps (a cluster has at most nine replicas).
pub const signers_max: usize = 9;

/// Replica id → 32-byte ed25519 verifying key.
pub type Signers = BTreeMap<u64, [u8; 32]>;

/// `Command::SetSigner`: `key` as replica `replica`'s envelope key, or (`None`) its key dropped.
/// Setting the key it already has, or dropping an absent one, changes nothing; a change makes every
/// machine behind (the next push carries it). Refused when the key is not an ed25519 point, when
/// the replica already has another key (remove it first), or over [`signers_max`].
pub(crate) fn set_signer(
    state: &mut DomainState,
    _p: &Proposal,
    replica: u64,
    key: Option<[u8; 32]>,
    changed: &mut Vec<Changed>,
) -> Result<Applied, Refusal> {
    match key {
        None => {
            if state.signers.remove(&replica).is_some() {
                changed.push(Changed::Signer(replica));
                state.bump(changed);
            }
        }
        Some(key) => {
            if state
                .revoked
                .contains_key(&super::revoked::RevokedTarget::retiring(replica).key())
            {
                return Err(Refusal::Invalid(format!(
                    "replica {replica} was retired (removed, or left out of a recovered cluster): its id is never trusted again; add the replica under a new id (`meshctl init --add-replica <new id> ...`)"
                )));
            }
            if ed25519_dalek::VerifyingKey::from_bytes(&key).is_err() {
                return Err(Refusal::Invalid(format!(
                    "the signing key given for replica {replica} is not an ed25519 public key; copy it from `meshctl init --add-replica`"
                )));
            }
            match state.signers.get(&replica) {
                Some(known) if *known == key => {}
                Some(_) => {
                    return Err(Refusal::Invalid(format!(
                        "replica {replica} already has another signing key; remove the replica first (`meshctl replicas remove {replica}`)"
                    )));
                }
                None => {
                    if state.signers.len() >= signers_max {
                        return Err(Refusal::Invalid(format!(
                            "the cluster already knows {signers_max} added replicas' keys, the most it keeps; remove one first"
                        )));
                    }
                    state.signers.insert(replica, key);
                    changed.push(Changed::Signer(replica));
                    state.bump(changed);
                }
            }
        }
    }
    Ok(Applied::Signer {
        replica,
        known: state.signers.contains_key(&replica),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::command::{Command, Outcome};

    fn proposal(command: Command) -> Proposal {
        Proposal {
            epoch: 1,
            expect_revision: None,
            actor: "operator:test".into(),
            time_ms: 0,
            command,
        }
    }

    fn key() -> [u8; 32] {
        ed25519_dalek::SigningKey::from_bytes(&[7; 32])
            .verifying_key()
            .to_bytes()
    }

    #[test]
    fn g_signer_set_bumps_the_revision_once_and_removal_drops_it() {
        // Hosts learn a new replica's key: adding it makes every machine behind, once.
        let mut state = DomainState::default();
        let set = proposal(Command::SetSigner {
            replica: 4,
            key: Some(key()),
        });
        let (outcome, changed) = state.apply(1, &set);
        assert!(matches!(outcome, Outcome::Applied(_)), "{outcome:?}");
        assert_eq!(state.signers.get(&4), Some(&key()));
        assert!(changed.contains(&Changed::Signer(4)));
        let revision = state.revision;
        let (again, changed) = state.apply(1, &set);
        assert!(matches!(again, Outcome::Applied(_)));
        assert_eq!(
            state.revision, revision,
            "the same key again changed the state"
        );
        assert!(!changed.contains(&Changed::Signer(4)));
        let drop = proposal(Command::SetSigner {
            replica: 4,
            key: None,
        });
        let (gone, _) = state.apply(1, &drop);
        assert!(matches!(gone, Outcome::Applied(_)));
        assert!(state.signers.is_empty());
        assert!(state.revision > revision);
    }

    #[test]
    fn g_signer_another_key_or_not_a_key_is_refused_and_changes_nothing() {
        let mut state = DomainState::default();
        let (first, _) = state.apply(
            1,
            &proposal(Command::SetSigner {
                replica: 4,
                key: Some(key()),
            }),
        );
        assert!(matches!(first, Outcome::Applied(_)));
        let before = state.clone();
        let other = ed25519_dalek::SigningKey::from_bytes(&[9; 32])
            .verifying_key()
            .to_bytes();
        let (refused, changed) = state.apply(
            1,
            &proposal(Command::SetSigner {
                replica: 4,
                key: Some(other),
            }),
        );
        assert!(matches!(refused, Outcome::Refused(_)), "{refused:?}");
        assert!(changed.is_empty(), "{changed:?}");
        assert_eq!(state, before);
    }

    #[test]
    fn g2_retiring_a_replica_drops_its_key_in_the_same_commit_and_its_id_takes_no_key_again() {
        // Decision 0294: `replicas remove 4` is one revocation of replica:4, which also takes its
        // added key out of every declaration; the retired id is never given a key again.
        let mut state = DomainState::default();
        let (set, _) = state.apply(
            1,
            &proposal(Command::SetSigner {
                replica: 4,
                key: Some(key()),
            }),
        );
        assert!(matches!(set, Outcome::Applied(_)), "{set:?}");
        let retire = proposal(Command::Revoke {
            target: crate::store::revoked::RevokedTarget::Principal("replica:4".into()),
            why: "removed".into(),
        });
        let (retired, changed) = state.apply(1, &retire);
        assert!(matches!(retired, Outcome::Applied(_)), "{retired:?}");
        assert!(state.signers.is_empty(), "the retired key stayed");
        assert!(changed.contains(&Changed::Signer(4)), "{changed:?}");
        assert!(state.revoked.contains_key("principal:replica:4"));
        let before = state.clone();
        let (again, changed) = state.apply(
            1,
            &proposal(Command::SetSigner {
                replica: 4,
                key: Some(key()),
            }),
        );
        assert!(
            matches!(&again, Outcome::Refused(r) if r.to_string().contains("retired")),
            "{again:?}"
        );
        assert!(changed.is_empty());
        assert_eq!(state, before);
    }
}
