//! `meshctl replicas add|remove` as a sans-I/O core (issue 22 item 1, decision 0332): every decision of a membership change — whether the ask is valid, whether the change
//! keeps a quorum of the voters that answer, whether this call commits the new key, pushes it,
//! takes it back after a failed catch-up, and whether the learner may become a voter — is made
//! here on what the shell hands in; the shell (`Service::replicas_add`, `replicas_remove`) probes,
//! proposes, pushes and changes the Raft membership as told, and feeds back what happened.
//!
//! The one rule the order serves (G2, G9): a replica becomes a voter, and so may lead, only once
//! every machine that was ever sent a declaration confirmed one carrying its signing key; before
//! that a host would refuse its envelopes as unsigned by a replica it knows.
//!
//! ```text
//!  add:    Probe(voters + new) → [new silent → ExplainSilent → Refuse]
//!          → quorum? → CommitKey (unless the state has it) → ReadMissing → PushKey (if any)
//!          → AddLearner → [failed → DropKey (only a key this call committed) → Fail]
//!          → ReadMissing → [any → Refuse(KeyNotOnHosts)] → Probe again → quorum? → Promote → Done
//!  remove: a member, not the leader → probe the voters → quorum without it? → Remove → Retire
//! ```

use std::collections::BTreeSet;

use mesh_raft::{MembershipError, check_quorum};

use crate::controller::members::MembersError;

/// A `replicas add` as asked, its address already parsed by the shell.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct AddAsk {
    pub(crate) id: u64,
    /// The address as the operator wrote it (the membership keeps it as text).
    pub(crate) addr: String,
    /// Whether the address is one another replica can dial (not a wildcard, not port 0).
    pub(crate) dialable: bool,
    /// Whether the key is an ed25519 public key.
    pub(crate) key_valid: bool,
}

/// The cluster as the shell read it when the add began.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Cluster {
    /// The voters of the membership in force.
    pub(crate) voters: BTreeSet<u64>,
    /// The address the membership has for the asked id, when it is a member already.
    pub(crate) member_addr: Option<String>,
    /// Why the asked id was retired, when it was (decision 0294).
    pub(crate) retired_why: Option<String>,
    /// The state holds exactly the asked key for the asked id already.
    pub(crate) key_in_state: bool,
}

/// What happened, fed back to [`Add::next`] after each action.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum AddEvent {
    /// The add begins.
    Start(Cluster),
    /// The membership as read at the probe, and who of the voters and the new replica answered
    /// just now (the leader answers for itself).
    Answered {
        members: BTreeSet<u64>,
        voters: BTreeSet<u64>,
        live: BTreeSet<u64>,
    },
    /// Why the new replica did not answer, from a probe of it alone.
    Silent { reason: String },
    /// The key's `SetSigner` committed.
    KeyCommitted,
    /// The machines sent a declaration that have not confirmed one carrying the key (the shell's
    /// read of the state, with the machines this call's push saw apply it).
    Missing { machines: Vec<String> },
    /// The key's push ended: how many machines applied it out of how many lines.
    Pushed { applied: usize, lines: usize },
    /// The key's push did not finish; the add goes on (the catch-up and the second read decide).
    PushUnfinished { error: String },
    /// The new replica is a learner and caught up with the log.
    LearnerCaughtUp,
    /// It did not become a caught-up learner.
    LearnerFailed(MembershipError),
    /// The key this call committed left the state again (or could not: `dropped` false).
    KeyDropped { dropped: bool },
    /// The joint-consensus change to voter committed.
    Promoted,
}

/// What the shell does next.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum AddAction {
    /// Read the membership, probe its voters and the new replica (at the asked address) at once,
    /// answer `Answered`.
    Probe,
    /// Probe the new replica alone and answer `Silent` with why it did not answer.
    ExplainSilent,
    /// Propose `SetSigner { replica, key }`; answer `KeyCommitted`.
    CommitKey,
    /// Read which machines lack the key; answer `Missing`.
    ReadMissing,
    /// Push the machines behind (they carry the key); answer `Pushed` or `PushUnfinished`.
    PushKey,
    /// Add the replica as a learner and wait for it to catch up; answer `LearnerCaughtUp` or
    /// `LearnerFailed`.
    AddLearner,
    /// Propose `SetSigner { replica, key: None }` (this call committed it); answer `KeyDropped`.
    DropKey,
    /// Make the learner a voter through joint consensus; answer `Promoted`.
    Promote,
    /// The add is done (or there was nothing to do): answer the membership with these lines.
    Done { done: Vec<String> },
    /// Refused or stopped with nothing more changed by this step: answer the error.
    Refuse(MembersError),
    /// The Raft membership change failed: answer it as such.
    Fail(MembershipError),
}

/// Where an add is.
#[derive(Clone, Debug, PartialEq, Eq)]
enum AddAt {
    Begin,
    FirstProbe,
    Explaining,
    Committing,
    FirstRead,
    Pushing,
    Learning,
    Dropping(MembershipError),
    SecondRead,
    SecondProbe,
    Promoting,
    Over,
}

/// One `replicas add`, step by step (see the module's doc).
pub(crate) struct Add {
    ask: AddAsk,
    at: AddAt,
    voters: BTreeSet<u64>,
    /// This call committed the key (so a failed catch-up takes it back; a key that was in the
    /// state before is someone else's step and stays).
    committed_here: bool,
    done: Vec<String>,
}

impl Add {
    pub(crate) fn new(ask: AddAsk) -> Add {
        Add {
            ask,
            at: AddAt::Begin,
            voters: BTreeSet::new(),
            committed_here: false,
            done: Vec::new(),
        }
    }

    /// The next action after `event`. An event the add does not wait for now ends it with a
    /// refusal that names it (a shell bug, never a peer's input: peers' answers arrive as
    /// `Answered`, `Silent` or the Raft errors).
    pub(crate) fn next(&mut self, event: AddEvent) -> AddAction {
        let id = self.ask.id;
        let at = std::mem::replace(&mut self.at, AddAt::Over);
        match (at, event) {
            (AddAt::Begin, AddEvent::Start(cluster)) => self.start(cluster),
            (
                AddAt::FirstProbe,
                AddEvent::Answered {
                    members,
                    voters,
                    live,
                },
            ) => {
                if !live.contains(&id) {
                    self.at = AddAt::Explaining;
                    return AddAction::ExplainSilent;
                }
                self.voters = voters;
                if let Some(refusal) = self.keeps_quorum(&members, &live) {
                    return refusal;
                }
                if self.committed_here {
                    self.at = AddAt::Committing;
                    return AddAction::CommitKey;
                }
                self.at = AddAt::FirstRead;
                AddAction::ReadMissing
            }
            (AddAt::Explaining, AddEvent::Silent { reason }) => {
                AddAction::Refuse(MembersError::NewReplicaSilent {
                    id,
                    addr: self.ask.addr.clone(),
                    reason,
                })
            }
            (AddAt::Committing, AddEvent::KeyCommitted) => {
                self.done
                    .push(format!("replica {id}'s signing key committed"));
                self.at = AddAt::FirstRead;
                AddAction::ReadMissing
            }
            (AddAt::FirstRead, AddEvent::Missing { machines }) => {
                if machines.is_empty() {
                    self.at = AddAt::Learning;
                    return AddAction::AddLearner;
                }
                self.at = AddAt::Pushing;
                AddAction::PushKey
            }
            (AddAt::Pushing, AddEvent::Pushed { applied, lines }) => {
                self.done.push(format!(
                    "pushed the key: {applied} of {lines} machines applied it"
                ));
                self.at = AddAt::Learning;
                AddAction::AddLearner
            }
            (AddAt::Pushing, AddEvent::PushUnfinished { error }) => {
                self.done
                    .push(format!("the push of the key did not finish: {error}"));
                self.at = AddAt::Learning;
                AddAction::AddLearner
            }
            (AddAt::Learning, AddEvent::LearnerCaughtUp) => {
                self.done.push(format!(
                    "replica {id} added as a learner at {} and caught up",
                    self.ask.addr
                ));
                self.at = AddAt::SecondRead;
                AddAction::ReadMissing
            }
            (AddAt::Learning, AddEvent::LearnerFailed(e)) => {
                // An add that fails here leaves nothing trusted (issue 27): a key this call
                // committed leaves the state again; one a leader change cuts off is retired by
                // the next leader (`retire_outsiders`).
                if self.committed_here {
                    self.at = AddAt::Dropping(e);
                    return AddAction::DropKey;
                }
                AddAction::Fail(e)
            }
            (AddAt::Dropping(e), AddEvent::KeyDropped { .. }) => AddAction::Fail(e),
            (AddAt::SecondRead, AddEvent::Missing { machines }) => {
                if !machines.is_empty() {
                    // G2, G9: it stays a learner; a voter could lead and be refused by these.
                    return AddAction::Refuse(MembersError::KeyNotOnHosts { id, machines });
                }
                self.at = AddAt::SecondProbe;
                AddAction::Probe
            }
            (
                AddAt::SecondProbe,
                AddEvent::Answered {
                    members,
                    voters,
                    live,
                },
            ) => {
                // A voter may have died while the learner caught up.
                self.voters = voters;
                if let Some(refusal) = self.keeps_quorum(&members, &live) {
                    return refusal;
                }
                self.at = AddAt::Promoting;
                AddAction::Promote
            }
            (AddAt::Promoting, AddEvent::Promoted) => {
                let mut after = self.voters.clone();
                after.insert(id);
                self.done.push(format!(
                    "replica {id} is a voter (joint consensus {:?} -> {:?})",
                    self.voters, after
                ));
                AddAction::Done {
                    done: std::mem::take(&mut self.done),
                }
            }
            (at, event) => AddAction::Refuse(MembersError::Membership {
                reason: format!(
                    "internal: adding replica {id} at step {at:?} was told {event:?}; nothing more was changed by this call"
                ),
            }),
        }
    }

    fn start(&mut self, cluster: Cluster) -> AddAction {
        let AddAsk {
            id,
            addr,
            dialable,
            key_valid,
        } = &self.ask;
        let (id, addr) = (*id, addr.clone());
        if !dialable {
            return AddAction::Refuse(MembersError::BadAddress {
                addr,
                problem:
                    "a wildcard address or port 0 cannot be dialled; give the replica's own address"
                        .into(),
            });
        }
        if !key_valid {
            return AddAction::Refuse(MembersError::BadKey { id });
        }
        if let Some(why) = cluster.retired_why {
            return AddAction::Refuse(MembersError::Retired { id, why });
        }
        if let Some(known) = cluster.member_addr
            && known != addr
        {
            return AddAction::Fail(MembershipError::OtherAddress {
                id,
                known,
                asked: addr,
            });
        }
        if cluster.voters.contains(&id) {
            return AddAction::Done {
                done: vec![format!("replica {id} is already a voter at {addr}")],
            };
        }
        // The key: committed by this call unless the state has it already.
        self.committed_here = !cluster.key_in_state;
        self.at = AddAt::FirstProbe;
        AddAction::Probe
    }

    /// `None` when the voters that answer can commit the change and elect a leader after it;
    /// otherwise the refusal that ends the add.
    fn keeps_quorum(&self, members: &BTreeSet<u64>, live: &BTreeSet<u64>) -> Option<AddAction> {
        let mut after = self.voters.clone();
        after.insert(self.ask.id);
        let lost = check_quorum(&self.voters, &after, live).err()?;
        Some(AddAction::Refuse(MembersError::WouldLoseQuorum {
            reason: lost.to_string(),
            members: members.iter().copied().collect(),
            answering: live.iter().copied().collect(),
        }))
    }
}

/// Whether `replicas remove` of `id`, asked of `leader`, may go on to the quorum check: it must
/// be a member and not the leader itself.
pub(crate) fn remove_asked(
    id: u64,
    leader: u64,
    members: &BTreeSet<u64>,
) -> Result<(), RemoveRefusal> {
    if !members.contains(&id) {
        return Err(RemoveRefusal::Membership(MembershipError::NotMember {
            id,
            members: members.iter().copied().collect(),
        }));
    }
    if id == leader {
        return Err(RemoveRefusal::Members(MembersError::RemovingTheLeader {
            id,
        }));
    }
    Ok(())
}

/// The voters after removing `id`, when the voters that answer now (`live`) can commit the change
/// and elect a leader afterwards; otherwise the refusal (nothing is changed).
pub(crate) fn remove_keeps_quorum(
    id: u64,
    members: &BTreeSet<u64>,
    voters: &BTreeSet<u64>,
    live: &BTreeSet<u64>,
) -> Result<BTreeSet<u64>, MembersError> {
    let mut after = voters.clone();
    after.remove(&id);
    check_quorum(voters, &after, live).map_err(|lost| MembersError::WouldLoseQuorum {
        reason: lost.to_string(),
        members: members.iter().copied().collect(),
        answering: live.iter().copied().collect(),
    })?;
    Ok(after)
}

/// Why a remove changes nothing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum RemoveRefusal {
    Members(MembersError),
    Membership(MembershipError),
}

#[cfg(test)]
mod tests;
