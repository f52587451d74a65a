//! Membership changes on a running cluster (issue 12 part 4, decision 0230): a replica joins as a
//! learner and is made a voter through openraft's joint consensus (`change_membership`), or is
//! removed the same way; [`check_quorum`] refuses a change that could not commit or would leave
//! the live voters short of a quorum. The membership (voter ids and each node's `BasicNode::addr`)
//! is the truth of who the replicas are and where they are dialled; `replica.toml`'s `[peers]`
//! only seeds a brand-new cluster.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use openraft::ChangeMembers;
use openraft::error::{ClientWriteError, RaftError};
use redb::ReadableDatabase;

use crate::{App, BasicNode, Metrics, NodeId, Replica};

/// One member as the membership names it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Member {
    pub id: NodeId,
    /// The address the others dial (its `BasicNode::addr`).
    pub addr: String,
    /// A voter (counts for quorum, may lead); otherwise a learner (replicated to, never leads).
    pub voter: bool,
}

/// Every member of the membership `metrics` name, voters and learners, by id. In a joint
/// configuration a node that votes in either half is a voter.
pub fn members_of(metrics: &Metrics) -> BTreeMap<NodeId, Member> {
    let membership = metrics.membership_config.membership();
    let voters: BTreeSet<NodeId> = membership.voter_ids().collect();
    membership
        .nodes()
        .map(|(id, node)| {
            (
                *id,
                Member {
                    id: *id,
                    addr: node.addr.clone(),
                    voter: voters.contains(id),
                },
            )
        })
        .collect()
}

/// Why a change would lose quorum; nothing was changed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum QuorumLost {
    #[error(
        "replica {id} is the last voter; a cluster needs at least one (add another replica first)"
    )]
    LastVoter { id: NodeId },
    #[error(
        "no quorum to commit the change: only {live} of the voters {voters:?} answer now ({answering:?}) and joint consensus needs {need} of them. Bring the others back first"
    )]
    CannotCommit {
        voters: Vec<NodeId>,
        answering: Vec<NodeId>,
        live: usize,
        need: usize,
    },
    #[error(
        "the cluster would lose its quorum: the voters would be {voters:?}, of which only {live} answer now ({answering:?}), and they need {need} to elect a leader and commit. Bring a replica back, or add one, first"
    )]
    LosesQuorum {
        voters: Vec<NodeId>,
        answering: Vec<NodeId>,
        live: usize,
        need: usize,
    },
}

/// The voters a majority of `voters` must hold.
pub fn majority(voters: usize) -> usize {
    voters / 2 + 1
}

/// Whether changing the voter set from `now` to `after` is safe with `live` answering: joint
/// consensus commits only when a majority of **both** sets agree, and the cluster afterwards
/// must still have a live majority. `live` are the replicas that answered just now (a learner
/// joining counts once it has caught up).
pub fn check_quorum(
    now: &BTreeSet<NodeId>,
    after: &BTreeSet<NodeId>,
    live: &BTreeSet<NodeId>,
) -> Result<(), QuorumLost> {
    if let (true, Some(id)) = (after.is_empty(), now.iter().next()) {
        return Err(QuorumLost::LastVoter { id: *id });
    }
    let answering =
        |set: &BTreeSet<NodeId>| -> Vec<NodeId> { set.intersection(live).copied().collect() };
    let in_now = answering(now);
    if in_now.len() < majority(now.len()) {
        return Err(QuorumLost::CannotCommit {
            voters: now.iter().copied().collect(),
            live: in_now.len(),
            answering: in_now,
            need: majority(now.len()),
        });
    }
    let in_after = answering(after);
    if in_after.len() < majority(after.len()) {
        return Err(QuorumLost::LosesQuorum {
            voters: after.iter().copied().collect(),
            live: in_after.len(),
            answering: in_after,
            need: majority(after.len()),
        });
    }
    Ok(())
}

/// Why a membership change did not happen (or did not finish).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum MembershipError {
    #[error("replica {id} is not the leader; membership changes go through the leader")]
    NotLeader { id: NodeId },
    #[error(
        "replica {id} is already a member at {known}, not {asked}; remove it first (`meshctl replicas remove {id}`)"
    )]
    OtherAddress {
        id: NodeId,
        known: String,
        asked: String,
    },
    #[error("replica {id} is not a member of the cluster (members: {members:?})")]
    NotMember { id: NodeId, members: Vec<NodeId> },
    #[error(
        "replica {id} did not catch up with the leader's log within {waited_ms} ms (it has {matched:?} of {last:?}); check that it runs and that the others can dial it at {addr}. It stays a learner"
    )]
    NotCaughtUp {
        id: NodeId,
        addr: String,
        matched: Option<u64>,
        last: Option<u64>,
        waited_ms: u64,
    },
    #[error(
        "the membership change did not commit within {waited_ms} ms; it may still: read `meshctl replicas list` before asking again"
    )]
    Timeout { waited_ms: u64 },
    #[error(
        "a membership change is still in progress (joint configuration {voters:?}); wait for it to finish, then ask again"
    )]
    InProgress { voters: Vec<Vec<NodeId>> },
    #[error(transparent)]
    Quorum(#[from] QuorumLost),
    #[error("raft refused the membership change: {0}")]
    Raft(String),
    #[error("the replica is stopping")]
    Stopped,
}

fn change_error(
    own: NodeId,
    e: RaftError<NodeId, ClientWriteError<NodeId, BasicNode>>,
) -> MembershipError {
    match e {
        RaftError::APIError(ClientWriteError::ForwardToLeader(_)) => {
            MembershipError::NotLeader { id: own }
        }
        RaftError::APIError(other) => MembershipError::Raft(other.to_string()),
        RaftError::Fatal(openraft::error::Fatal::Stopped) => MembershipError::Stopped,
        RaftError::Fatal(other) => MembershipError::Raft(other.to_string()),
    }
}

impl<A: App> Replica<A> {
    /// The members of the membership this replica knows now.
    pub fn members(&self) -> BTreeMap<NodeId, Member> {
        members_of(&self.raft().metrics().borrow())
    }

    /// Checks this replica leads and no joint configuration is pending.
    fn check_can_change(&self) -> Result<Metrics, MembershipError> {
        let m = self.raft().metrics().borrow().clone();
        if m.state != openraft::ServerState::Leader || m.current_leader != Some(self.id()) {
            return Err(MembershipError::NotLeader { id: self.id() });
        }
        let joint = m.membership_config.membership().get_joint_config().clone();
        if joint.len() > 1 {
            return Err(MembershipError::InProgress {
                voters: joint.iter().map(|c| c.iter().copied().collect()).collect(),
            });
        }
        Ok(m)
    }

    /// Adds replica `id` at `addr` as a learner (or finds it one already at that address) and
    /// waits until its log matches this leader's last index as of the add, within `within`. A
    /// learner is replicated to but never campaigns: it cannot lead until [`Replica::promote`].
    pub async fn add_learner_caught_up(
        &self,
        id: NodeId,
        addr: &str,
        within: Duration,
    ) -> Result<(), MembershipError> {
        let deadline = tokio::time::Instant::now() + within;
        let waited_ms = within.as_millis() as u64;
        let m = self.check_can_change()?;
        let known = members_of(&m);
        match known.get(&id) {
            Some(member) if member.addr != addr => {
                return Err(MembershipError::OtherAddress {
                    id,
                    known: member.addr.clone(),
                    asked: addr.to_string(),
                });
            }
            Some(_) => {}
            None => {
                let add = self.raft().add_learner(id, BasicNode::new(addr), false);
                tokio::time::timeout_at(deadline, add)
                    .await
                    .map_err(|_| MembershipError::Timeout { waited_ms })?
                    .map_err(|e| change_error(self.id(), e))?;
            }
        }
        let target = self.raft().metrics().borrow().last_log_index;
        let mut metrics = self.raft().metrics();
        loop {
            let matched = {
                let m = metrics.borrow_and_update();
                m.replication
                    .as_ref()
                    .and_then(|r| r.get(&id).copied().flatten())
                    .map(|l| l.index)
            };
            if matched >= target {
                return Ok(());
            }
            let now = tokio::time::Instant::now();
            if now >= deadline {
                return Err(MembershipError::NotCaughtUp {
                    id,
                    addr: addr.to_string(),
                    matched,
                    last: target,
                    waited_ms,
                });
            }
            crate::wait::changed_within(&mut metrics, deadline - now).await;
        }
    }

    /// Makes learner `id` a voter through joint consensus (`{old}` → `{old, new}` → `{new}`),
    /// within `within`.
    pub async fn promote(&self, id: NodeId, within: Duration) -> Result<(), MembershipError> {
        let m = self.check_can_change()?;
        let members = members_of(&m);
        match members.get(&id) {
            None => {
                return Err(MembershipError::NotMember {
                    id,
                    members: members.keys().copied().collect(),
                });
            }
            Some(member) if member.voter => return Ok(()),
            Some(_) => {}
        }
        self.change(ChangeMembers::AddVoterIds(BTreeSet::from([id])), within)
            .await
    }

    /// Removes member `id` (a voter through joint consensus, or a learner) from the membership
    /// within `within`; it is no longer replicated to.
    pub async fn remove_member(&self, id: NodeId, within: Duration) -> Result<(), MembershipError> {
        let m = self.check_can_change()?;
        let members = members_of(&m);
        let Some(member) = members.get(&id) else {
            return Err(MembershipError::NotMember {
                id,
                members: members.keys().copied().collect(),
            });
        };
        let change = if member.voter {
            ChangeMembers::RemoveVoters(BTreeSet::from([id]))
        } else {
            ChangeMembers::RemoveNodes(BTreeSet::from([id]))
        };
        self.change(change, within).await
    }

    async fn change(
        &self,
        change: ChangeMembers<NodeId, BasicNode>,
        within: Duration,
    ) -> Result<(), MembershipError> {
        let waited_ms = within.as_millis() as u64;
        tokio::time::timeout(within, self.raft().change_membership(change, false))
            .await
            .map_err(|_| MembershipError::Timeout { waited_ms })?
            .map_err(|e| change_error(self.id(), e))?;
        Ok(())
    }
}

/// The voters of the membership the store's state machine last applied, if it applied one: what a
/// restarted replica draws its election window from ([`crate::RaftConfig::election_window`]), so
/// after `replicas add` or `remove` the slices follow the voters as they are, not `[peers]`.
pub(crate) fn stored_voters(
    db: &redb::Database,
) -> Result<Option<BTreeSet<NodeId>>, crate::StoreError> {
    let txn = db.begin_read()?;
    let table = txn.open_table(mesh_migrations::tables::SM_STATE)?;
    let (_, membership) = crate::state_machine::read_applied(&table)?;
    let voters: BTreeSet<NodeId> = membership.membership().voter_ids().collect();
    Ok((!voters.is_empty()).then_some(voters))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(ids: &[NodeId]) -> BTreeSet<NodeId> {
        ids.iter().copied().collect()
    }

    #[test]
    fn g_quorum_removing_a_replica_while_another_is_down_is_refused() {
        // Three voters, replica 3 down: removing 2 would leave {1, 3} with one live voter.
        let refused = check_quorum(&set(&[1, 2, 3]), &set(&[1, 3]), &set(&[1, 2]));
        assert!(
            matches!(
                refused,
                Err(QuorumLost::LosesQuorum {
                    need: 2,
                    live: 1,
                    ..
                })
            ),
            "{refused:?}"
        );
        // Removing the dead one is fine: {1, 2} both answer.
        assert_eq!(
            check_quorum(&set(&[1, 2, 3]), &set(&[1, 2]), &set(&[1, 2])),
            Ok(())
        );
    }

    #[test]
    fn g_quorum_a_change_the_current_voters_cannot_commit_is_refused() {
        let refused = check_quorum(&set(&[1, 2, 3]), &set(&[1, 2, 3, 4]), &set(&[1, 4]));
        assert!(
            matches!(
                refused,
                Err(QuorumLost::CannotCommit {
                    need: 2,
                    live: 1,
                    ..
                })
            ),
            "{refused:?}"
        );
        // Adding a caught-up fourth with one of three down: 3 of 4 answer.
        assert_eq!(
            check_quorum(&set(&[1, 2, 3]), &set(&[1, 2, 3, 4]), &set(&[1, 2, 4])),
            Ok(())
        );
    }

    #[test]
    fn g_quorum_the_last_voter_is_never_removed() {
        let refused = check_quorum(&set(&[1]), &set(&[]), &set(&[1]));
        assert_eq!(refused, Err(QuorumLost::LastVoter { id: 1 }));
    }

    #[test]
    fn majority_of_even_and_odd_sets() {
        assert_eq!(
            [1, 2, 3, 4, 5].map(majority),
            [1, 2, 2, 3, 3],
            "a majority is more than half"
        );
    }
}
