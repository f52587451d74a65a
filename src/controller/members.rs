//! `meshctl replicas list|add|remove` on the leader (issue 12 part 4, decision 0230).
//!
//! The Raft membership is the truth of who the replicas are and where they are dialled
//! ([`Service::members`]); `replica.toml`'s `[peers]` only seeds a brand-new cluster. An add goes:
//! the new replica must answer a probe at its address; the change must keep a quorum
//! ([`mesh_raft::check_quorum`]); its signing key is committed into the state
//! (`Command::SetSigner`), which makes every machine behind, and a push of the machines behind
//! carries it; it joins as a learner and catches up; only when every machine that was ever sent a
//! declaration has confirmed one carrying the key is it made a voter through joint consensus. A
//! learner never campaigns, so the key is on every host before the replica can lead. A remove is
//! checked against the quorum of the live voters, goes through joint consensus, then drops the key.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::time::Duration;

use ed25519_dalek::VerifyingKey;
use mesh_raft::{Member, MembershipError, Probed, probe_replica};
use mesh_transport::Sink;
use serde::{Deserialize, Serialize};

use super::api::{ApiError, Body, ErrorClass, PushOutcome, PushTarget, RequestId};
use super::leadership::membership::{self, AddAction, AddEvent, RemoveRefusal};
use super::service::Service;
use crate::store::command::{Applied, Command};
use crate::store::revoked::RevokedTarget;
use crate::store::state::DomainState;

/// How long a joining replica may take to catch up with the leader's log.
pub const member_catch_up_ms: u64 = 60_000;
/// How long one joint-consensus change may take to commit both its steps.
pub const member_change_ms: u64 = 10_000;

/// `meshctl replicas list|add|remove`: every member of the membership as the leader knows it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReplicasView {
    /// The replica that answered (the leader).
    pub answered_by: u64,
    pub members: Vec<MemberView>,
    /// What the change did, one line each, in order (empty for `list`).
    pub done: Vec<String>,
    /// The retired replicas (decision 0294), by id: trusted by nothing, their ids never again.
    pub retired: Vec<RetiredView>,
}

/// One retired replica, from its row of the deny list.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RetiredView {
    pub id: u64,
    pub why: String,
    /// Who retired it (`operator:alice`, or the leader that found it outside the membership).
    pub actor: String,
    /// When, on the proposer's wall clock (ms since the Unix epoch).
    pub time_ms: u64,
}

/// One member of the cluster.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemberView {
    pub id: u64,
    /// The address the others dial, from the membership.
    pub addr: String,
    /// Voter (counts for quorum, may lead) or learner (replicated to, never leads).
    pub voter: bool,
    /// It answered a probe just now.
    pub reachable: bool,
    pub leader: bool,
    /// Hosts learn its signing key from `host.toml` (a founding replica) or from their
    /// declarations (an added one); `false` only for a learner whose key is not in the state.
    pub key_known: bool,
}

/// Why `replicas add` or `replicas remove` did not do (all of) what was asked.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error, Serialize, Deserialize)]
pub enum MembersError {
    #[error("`{addr}` is not a replica address: {problem}")]
    BadAddress { addr: String, problem: String },
    #[error(
        "the signing key given for replica {id} is not an ed25519 public key; copy the line `meshctl init --add-replica` printed"
    )]
    BadKey { id: u64 },
    #[error(
        "replica {id} at {addr} does not answer ({reason}); start its meshd with the replica.toml `meshctl init --add-replica` wrote, then ask again. Nothing was changed"
    )]
    NewReplicaSilent {
        id: u64,
        addr: String,
        reason: String,
    },
    #[error("{reason}; nothing was changed (members: {members:?}, answering now: {answering:?})")]
    WouldLoseQuorum {
        reason: String,
        members: Vec<u64>,
        answering: Vec<u64>,
    },
    #[error(
        "replica {id} leads and cannot remove itself: stop its meshd with SIGTERM (it hands leadership to an up-to-date follower), then ask again. Nothing was changed"
    )]
    RemovingTheLeader { id: u64 },
    #[error("{reason}")]
    Membership { reason: String },
    #[error(
        "replica {id} is a learner but not a voter yet: {} not confirmed a declaration carrying its signing key ({}), so it may not lead. Bring them up (or push them), then run the same `meshctl replicas add` again",
        if machines.len() == 1 { "machine has" } else { "machines have" },
        machines.join(", ")
    )]
    KeyNotOnHosts { id: u64, machines: Vec<String> },
    /// Decision 0294: a retired id is never trusted again.
    #[error(
        "replica {id} was retired ({why}): its id is never trusted again; make a new replica with `meshctl init --add-replica <new id>=<ip:port>` and add that. Nothing was changed"
    )]
    Retired { id: u64, why: String },
}

impl MembersError {
    pub fn class(&self) -> ErrorClass {
        match self {
            MembersError::BadAddress { .. } | MembersError::BadKey { .. } => ErrorClass::Invalid,
            MembersError::NewReplicaSilent { .. } | MembersError::KeyNotOnHosts { .. } => {
                ErrorClass::Unavailable
            }
            MembersError::WouldLoseQuorum { .. }
            | MembersError::RemovingTheLeader { .. }
            | MembersError::Retired { .. } => ErrorClass::Refused,
            MembersError::Membership { .. } => ErrorClass::Failed,
        }
    }

    pub fn cause(&self) -> &'static str {
        match self {
            MembersError::BadAddress { .. } => "replicas.bad_address",
            MembersError::BadKey { .. } => "replicas.bad_key",
            MembersError::NewReplicaSilent { .. } => "replicas.new_replica_silent",
            MembersError::WouldLoseQuorum { .. } => "replicas.would_lose_quorum",
            MembersError::RemovingTheLeader { .. } => "replicas.removing_the_leader",
            MembersError::Membership { .. } => "replicas.membership",
            MembersError::KeyNotOnHosts { .. } => "replicas.key_not_on_hosts",
            MembersError::Retired { .. } => "replicas.retired",
        }
    }
}

fn membership(e: MembershipError) -> ApiError {
    let reason = e.to_string();
    match e {
        MembershipError::NotLeader { .. } | MembershipError::Stopped => {
            ApiError::NotCommitted { reason }
        }
        MembershipError::Quorum(_) => MembersError::WouldLoseQuorum {
            reason,
            members: vec![],
            answering: vec![],
        }
        .into(),
        _ => MembersError::Membership { reason }.into(),
    }
}

/// The added replicas' keys as the state keeps them, as verifying keys (one that does not parse
/// was refused by the state machine and cannot be here; it is skipped).
pub(crate) fn signers_trusted(state: &DomainState) -> BTreeMap<u64, VerifyingKey> {
    state
        .signers
        .iter()
        // allow(empty-on-error): a key that is not a point was refused by the state machine
        .filter_map(|(id, bytes)| VerifyingKey::from_bytes(bytes).ok().map(|k| (*id, k)))
        .collect()
}

/// The replicas the committed deny list retires (decision 0294).
pub(crate) fn retired(state: &DomainState) -> BTreeSet<u64> {
    state
        .revoked
        .values()
        .filter_map(|e| crate::store::revoked::retired_replica(&e.target))
        .collect()
}

/// The replicas a leader taking office retires (decision 0294): every replica whose signing key
/// it trusts (`trusted`: `host.toml`-style founding keys and the added keys in the state) that is
/// not a member of the membership in force and not retired yet. A member is never one; an add
/// that failed under an earlier leader leaves a key without a member, and so does a recovery
/// (`meshd recover --force-new-cluster`) for every replica left out.
pub(crate) fn outsiders(
    trusted: impl IntoIterator<Item = u64>,
    members: &BTreeSet<u64>,
    retired: &BTreeSet<u64>,
) -> BTreeSet<u64> {
    trusted
        .into_iter()
        .filter(|id| !members.contains(id) && !retired.contains(id))
        .collect()
}

/// The machines of the model that were sent a declaration but have not confirmed one carrying
/// replica `id`'s `key` (by their last send and its report, or by this push's answer), sorted.
fn key_missing_on(
    state: &DomainState,
    id: u64,
    key: &[u8; 32],
    applied_now: &BTreeSet<String>,
) -> Vec<String> {
    let hex = crate::hex::encode_hex(key);
    state
        .last_sends
        .iter()
        // A machine the model dropped is never pushed again: it cannot hold the key up.
        .filter(|(machine, _)| state.mesh.machines.contains_key(*machine))
        .filter(|(machine, send)| {
            let carries = send.summary.signers.get(&id) == Some(&hex);
            let confirmed = state.confirmed(machine) || applied_now.contains(*machine);
            !(carries && confirmed)
        })
        .map(|(machine, _)| machine.clone())
        .collect()
}

impl Service {
    /// Every member's address from the Raft membership; `[peers]` of the config only when the
    /// membership is still empty (a replica that has not heard from its cluster yet).
    pub(crate) fn members(&self) -> BTreeMap<u64, SocketAddr> {
        let from_raft: BTreeMap<u64, SocketAddr> = self
            .replica
            .members()
            .into_values()
            // allow(empty-on-error): addresses are checked as ip:port before a member is added
            .filter_map(|m| m.addr.parse().ok().map(|a| (m.id, a)))
            .collect();
        if from_raft.is_empty() {
            return self.config.peers().clone();
        }
        from_raft
    }

    /// Replica `id`'s address: the membership's, else `[peers]`.
    pub(crate) fn member_addr(&self, id: u64) -> Option<SocketAddr> {
        self.members()
            .get(&id)
            .copied()
            .or_else(|| self.config.peers().get(&id).copied())
    }

    /// Probes every address of `asks` at once (this replica answers for itself): who answered.
    async fn answering(&self, asks: &BTreeMap<u64, SocketAddr>) -> BTreeMap<u64, Probed> {
        let timings = self.replica.config().timings();
        let wait =
            Duration::from_millis(self.replica.config().settings().election_timeout_min_ms / 2);
        let own = Probed::of(self.replica.raft());
        let probes = asks.iter().map(|(id, addr)| {
            let own = own.clone();
            async move {
                if *id == self.id {
                    return (*id, Ok(own));
                }
                (
                    *id,
                    probe_replica(&self.endpoint, &timings, *id, *addr, wait).await,
                )
            }
        });
        futures::future::join_all(probes)
            .await
            .into_iter()
            // allow(empty-on-error): a replica that does not answer is not live; that is the answer
            .filter_map(|(id, p)| p.ok().map(|p| (id, p)))
            .collect()
    }

    fn voters(members: &BTreeMap<u64, Member>) -> BTreeSet<u64> {
        members.values().filter(|m| m.voter).map(|m| m.id).collect()
    }

    async fn replicas_view(&self, done: Vec<String>) -> Result<Body, ApiError> {
        let state = self.state()?;
        let members = self.replica.members();
        let addrs: BTreeMap<u64, SocketAddr> = members
            .values()
            // allow(empty-on-error): addresses are checked as ip:port before a member is added
            .filter_map(|m| m.addr.parse().ok().map(|a| (m.id, a)))
            .collect();
        let answered = self.answering(&addrs).await;
        let founding = self.config.peers();
        let view = ReplicasView {
            answered_by: self.id,
            members: members
                .values()
                .map(|m| MemberView {
                    id: m.id,
                    addr: m.addr.clone(),
                    voter: m.voter,
                    reachable: answered.contains_key(&m.id),
                    leader: answered.get(&m.id).is_some_and(|p| p.leads()),
                    key_known: state.signers.contains_key(&m.id) || founding.contains_key(&m.id),
                })
                .collect(),
            done,
            retired: state
                .revoked
                .values()
                .filter_map(|e| {
                    let id = crate::store::revoked::retired_replica(&e.target)?;
                    Some(RetiredView {
                        id,
                        why: e.why.clone(),
                        actor: e.actor.clone(),
                        time_ms: e.time_ms,
                    })
                })
                .collect(),
        };
        Ok(Body::Replicas(view))
    }

    /// `Request::ReplicasList`.
    pub(crate) async fn replicas_list(&self) -> Result<Body, ApiError> {
        self.leading_term()?;
        self.replicas_view(vec![]).await
    }

    /// `Request::ReplicasAdd`: see the module's doc for the steps. Asking again after any step
    /// goes on from where the cluster is (every step is idempotent). Every decision is
    /// [`membership::Add`]'s (decision 0332); this carries its actions out.
    pub(crate) async fn replicas_add(
        &self,
        actor: &str,
        id: u64,
        addr: String,
        key: [u8; 32],
        lines: &Sink,
    ) -> Result<Body, ApiError> {
        let term = self.leading_term()?;
        let dial: SocketAddr = addr.parse().map_err(|e| MembersError::BadAddress {
            addr: addr.clone(),
            problem: format!("{e}; write it as ip:port, the address the other replicas dial"),
        })?;
        let state = self.state()?;
        let members = self.replica.members();
        let cluster = membership::Cluster {
            voters: Self::voters(&members),
            member_addr: members.get(&id).map(|m| m.addr.clone()),
            retired_why: state
                .revoked
                .get(&RevokedTarget::retiring(id).key())
                .map(|entry| entry.why.clone()),
            key_in_state: state.signers.get(&id) == Some(&key),
        };
        let mut add = membership::Add::new(membership::AddAsk {
            id,
            addr: addr.clone(),
            dialable: !dial.ip().is_unspecified() && dial.port() != 0,
            key_valid: VerifyingKey::from_bytes(&key).is_ok(),
        });
        // The machines this call's push saw apply the key (its answer comes before their reports).
        let mut applied_now = BTreeSet::new();
        let mut event = AddEvent::Start(cluster);
        loop {
            event = match add.next(event) {
                AddAction::Probe => {
                    let members = self.replica.members();
                    let voters = Self::voters(&members);
                    let mut asks: BTreeMap<u64, SocketAddr> = voters
                        .iter()
                        .filter_map(|v| self.member_addr(*v).map(|a| (*v, a)))
                        .collect();
                    asks.insert(id, dial);
                    AddEvent::Answered {
                        members: members.keys().copied().collect(),
                        voters,
                        live: self.answering(&asks).await.keys().copied().collect(),
                    }
                }
                AddAction::ExplainSilent => {
                    let timings = self.replica.config().timings();
                    let wait = Duration::from_millis(
                        self.replica.config().settings().election_timeout_min_ms / 2,
                    );
                    let reason = match probe_replica(&self.endpoint, &timings, id, dial, wait).await
                    {
                        Ok(_) => "it answered only late".to_string(),
                        Err(e) => e.to_string(),
                    };
                    AddEvent::Silent { reason }
                }
                AddAction::CommitKey => {
                    let command = Command::SetSigner {
                        replica: id,
                        key: Some(key),
                    };
                    match self.propose(term, None, actor, command).await? {
                        Applied::Signer { known: true, .. } => AddEvent::KeyCommitted,
                        other => {
                            return Err(ApiError::internal(format!(
                                "the store answered a signing key with {other:?}"
                            )));
                        }
                    }
                }
                AddAction::ReadMissing => AddEvent::Missing {
                    machines: key_missing_on(self.state()?.as_ref(), id, &key, &applied_now),
                },
                AddAction::PushKey => {
                    let push_id = RequestId(random_id()?);
                    let why = format!("replica {id} joins: its signing key");
                    match self
                        .push(actor, push_id, PushTarget::Behind, why, vec![], None, lines)
                        .await
                    {
                        Ok(Body::Push(view)) => {
                            for line in &view.lines {
                                if matches!(line.outcome, PushOutcome::Applied { .. }) {
                                    applied_now.insert(line.machine.clone());
                                }
                            }
                            AddEvent::Pushed {
                                applied: applied_now.len(),
                                lines: view.lines.len(),
                            }
                        }
                        Ok(_) => AddEvent::PushUnfinished {
                            error: "the push answered without its lines".into(),
                        },
                        Err(e) => {
                            tracing::warn!(replica = self.id, new = id, error = %e, "the push of the new replica's key did not finish");
                            AddEvent::PushUnfinished {
                                error: e.to_string(),
                            }
                        }
                    }
                }
                AddAction::AddLearner => match self
                    .replica
                    .add_learner_caught_up(id, &addr, Duration::from_millis(member_catch_up_ms))
                    .await
                {
                    Ok(()) => AddEvent::LearnerCaughtUp,
                    Err(e) => AddEvent::LearnerFailed(e),
                },
                AddAction::DropKey => {
                    let drop = Command::SetSigner {
                        replica: id,
                        key: None,
                    };
                    let dropped = match self.propose(term, None, actor, drop).await {
                        Ok(_) => true,
                        Err(undone) => {
                            tracing::warn!(replica = self.id, new = id, error = %undone, "the failed add's key stays in the state; the next leader retires it");
                            false
                        }
                    };
                    AddEvent::KeyDropped { dropped }
                }
                AddAction::Promote => {
                    self.replica
                        .promote(id, Duration::from_millis(member_change_ms))
                        .await
                        .map_err(membership)?;
                    tracing::info!(replica = self.id, new = id, %addr, "replica {id} is a voter (joint consensus committed)");
                    AddEvent::Promoted
                }
                AddAction::Done { done } => return self.replicas_view(done).await,
                AddAction::Refuse(e) => {
                    if let MembersError::KeyNotOnHosts { machines, .. } = &e {
                        tracing::warn!(replica = self.id, new = id, machines = ?machines, "the new replica stays a learner: machines have not confirmed its key");
                    }
                    return Err(e.into());
                }
                AddAction::Fail(e) => return Err(membership(e)),
            };
        }
    }

    /// `Request::ReplicasRemove`: refused, changing nothing, when it is this leader or when the
    /// voters that answer now could not commit the change or elect a leader afterwards
    /// ([`membership::remove_asked`], [`membership::remove_keeps_quorum`]).
    pub(crate) async fn replicas_remove(
        &self,
        actor: &str,
        id: u64,
        lines: &Sink,
    ) -> Result<Body, ApiError> {
        let term = self.leading_term()?;
        let members = self.replica.members();
        let ids: BTreeSet<u64> = members.keys().copied().collect();
        membership::remove_asked(id, self.id, &ids).map_err(|refusal| match refusal {
            RemoveRefusal::Members(e) => e.into(),
            RemoveRefusal::Membership(e) => membership(e),
        })?;
        let voters = Self::voters(&members);
        let asks: BTreeMap<u64, SocketAddr> = voters
            .iter()
            .filter_map(|v| self.member_addr(*v).map(|a| (*v, a)))
            .collect();
        let live: BTreeSet<u64> = self.answering(&asks).await.keys().copied().collect();
        let after = membership::remove_keeps_quorum(id, &ids, &voters, &live)?;
        let mut done = Vec::new();
        self.replica
            .remove_member(id, Duration::from_millis(member_change_ms))
            .await
            .map_err(membership)?;
        tracing::info!(
            replica = self.id,
            removed = id,
            "replica {id} removed (joint consensus committed)"
        );
        done.push(format!(
            "replica {id} removed (joint consensus {voters:?} -> {after:?}); stop its meshd"
        ));
        // Its key retired and its certificate revoked in one commit (decision 0294), then
        // carried to every host at once.
        let why = format!("replica {id} removed from the cluster by {actor}");
        done.extend(self.retire(term, actor, &[id], &why, lines).await?);
        self.replicas_view(done).await
    }

    /// Retires `ids` (decision 0294): for each, one `Command::Revoke` of `replica:<id>`, which
    /// revokes its certificate and drops its added key in the same commit; then, when no machine
    /// had a change pending before (so the retirement is all a push would send), a push of the machines
    /// behind carries it to every host at once. A machine with other changes pending is not
    /// pushed behind the operator's back (promise 1): the answer says to push. Says what it did.
    pub(crate) async fn retire(
        &self,
        term: u64,
        actor: &str,
        ids: &[u64],
        why: &str,
        lines: &Sink,
    ) -> Result<Vec<String>, ApiError> {
        let mut done = Vec::new();
        let pending = self.changed_now()?;
        for id in ids {
            let target = RevokedTarget::retiring(*id);
            self.propose(
                term,
                None,
                actor,
                Command::Revoke {
                    target,
                    why: why.to_string(),
                },
            )
            .await?;
            done.push(format!(
                "replica {id} retired: its signing key is trusted by no host and its certificate is revoked"
            ));
        }
        if ids.is_empty() {
            return Ok(done);
        }
        if !pending.is_empty() {
            done.push(format!(
                "not pushed: {} already had changes pending ({}); `meshctl plan --behind`, then `meshctl push --behind` carries the retirement with them",
                if pending.len() == 1 { "1 machine" } else { "machines" },
                pending.iter().take(5).cloned().collect::<Vec<_>>().join(", ")
            ));
            return Ok(done);
        }
        let push_id = RequestId(random_id()?);
        let push_why = format!("retired replicas {ids:?}: {why}");
        match self
            .push(actor, push_id, PushTarget::Behind, push_why, vec![], None, lines)
            .await
        {
            Ok(Body::Push(view)) => {
                let applied = view
                    .lines
                    .iter()
                    .filter(|l| matches!(l.outcome, PushOutcome::Applied { .. }))
                    .count();
                done.push(format!(
                    "pushed the retirement: {applied} of {} machines applied it",
                    view.lines.len()
                ));
            }
            Ok(_) => {}
            Err(e) => done.push(format!(
                "the push of the retirement did not finish ({e}); `meshctl push --behind` carries it"
            )),
        }
        Ok(done)
    }

    /// What a leader does on taking office in `term` (decision 0294): retires every replica whose
    /// key it trusts that is not a member ([`outsiders`]), and carries that to every host.
    pub(crate) async fn retire_outsiders(&self, term: u64) {
        let state = match self.state() {
            Ok(state) => state,
            Err(e) => {
                tracing::error!(replica = self.id, error = %e, "cannot read the state to retire replicas outside the membership");
                return;
            }
        };
        let members: BTreeSet<u64> = self.replica.members().keys().copied().collect();
        let trusted = self
            .config
            .trusted_keys()
            .keys()
            .chain(state.signers.keys())
            .copied();
        let ids: Vec<u64> = outsiders(trusted, &members, &retired(&state))
            .into_iter()
            .collect();
        if ids.is_empty() {
            return;
        }
        let why = format!(
            "replica(s) {ids:?} are not members of this cluster (members {members:?}): left out by a recovery, removed, or a failed add"
        );
        let actor = format!("replica:{}", self.id);
        match self.retire(term, &actor, &ids, &why, &Sink::closed()).await {
            Ok(done) => {
                tracing::warn!(replica = self.id, term, retired = ?ids, "RETIRED: {}", done.join("; "));
            }
            Err(e) => {
                tracing::warn!(replica = self.id, term, retired = ?ids, error = %e, "could not retire the replicas outside the membership; the next leader tries again");
            }
        }
    }
}

fn random_id() -> Result<[u8; 16], ApiError> {
    let mut id = [0u8; 16];
    getrandom::getrandom(&mut id).map_err(|_| ApiError::Random {
        what: "making the key push's request id".into(),
    })?;
    Ok(id)
}

#[cfg(test)]
mod retire_tests {
    use super::*;

    #[test]
    fn g2_g9_a_leader_retires_every_trusted_replica_outside_the_membership_and_never_a_member() {
        // Decision 0294: after `meshd recover --force-new-cluster` on replica 1, replicas 2 and 3
        // (founding keys) are outside; a failed add left key 5 without a member; 4 is a learner
        // being added (a member) and 6 is retired already.
        let members = BTreeSet::from([1, 4]);
        let retired = BTreeSet::from([6]);
        let trusted = [1, 2, 3, 5, 6, 4];
        assert_eq!(
            outsiders(trusted, &members, &retired),
            BTreeSet::from([2, 3, 5])
        );
        assert!(outsiders([1, 2, 3], &BTreeSet::from([1, 2, 3]), &retired).is_empty());
    }
}
