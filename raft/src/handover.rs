//! A stopping leader hands its leadership to a follower that has its whole log (issue 12 part 2,
//! decisions 0152 and 0225). openraft 0.9 has no leader transfer; [`Replica::hand_over`] builds
//! one from a vote, the vote fence and [`crate::network::RaftCall::ElectNow`].

use std::time::{Duration, Instant};

use openraft::raft::VoteRequest;

use crate::{App, LogId, NodeId, Replica, Vote, VoteFence};

/// A leadership handed over by [`Replica::hand_over`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HandedOver {
    /// The follower that leads now.
    pub to: NodeId,
    /// The term it leads in.
    pub term: u64,
}

impl std::fmt::Display for HandedOver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "handed over to {} (term {})", self.to, self.term)
    }
}

/// Why [`Replica::hand_over`] did not hand leadership over; the cluster then elects as after a
/// crash.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HandoverError {
    #[error("replica {id} is not the leader; it has no leadership to hand over")]
    NotLeader { id: NodeId },
    #[error(
        "no follower of replica {id} had its whole log (last index {last:?}) and took over within {waited_ms} ms ({tried}); the others elect a leader after their election timeout"
    )]
    NoTaker {
        id: NodeId,
        last: Option<u64>,
        waited_ms: u64,
        tried: String,
    },
    #[error("the replica is stopping")]
    Stopped,
}

/// Milliseconds since `began`, for the step lines of a handover.
fn since(began: Instant) -> u64 {
    began.elapsed().as_millis() as u64
}

impl<A: App> Replica<A> {
    /// Hands this leader's leadership to a follower that has its whole log, before it stops
    /// (issue 12, decisions 0152 and 0225). openraft 0.9 has no leader transfer, so:
    ///
    /// 1. Stop acting: `fence` ([`VoteFence::stop_acting`]) refuses every act under this
    ///    replica's lease that has not begun.
    /// 2. Pick a voter whose replicated log matches this leader's last index (waiting for one,
    ///    within `within`).
    /// 3. Step down by handing the own Raft a vote in the next term that names no one, with the
    ///    taker's log: openraft grants it (higher term, log no shorter), persists it and stops
    ///    leading (see `vote_for` for why it names no one). openraft refuses
    ///    it within its own vote lease just after an election: tried again every heartbeat, with
    ///    the takers and their logs read again.
    /// 4. Wait until `fence` has closed: once acting stopped, that is as soon as no act that began
    ///    is still in flight (at the latest the lease's end). Then nothing more is written under
    ///    the old lease, and a second lease may be granted (G3).
    /// 5. `tell(to)` asks it to campaign now (`RaftCall::ElectNow`). Its vote request is above the
    ///    vote given in 3 (same term, names a candidate), so this replica grants it; with this replica's vote it has a quorum of
    ///    three without the third, whose lease of the old leader still runs.
    /// 6. Wait until the metrics name it leader.
    ///
    /// Each step is logged with the milliseconds since the handover began. From step 3 on this
    /// replica does not campaign (it is about to stop); a handover that fails gives its election
    /// timer back. If telling fails (the follower is gone) the next one is tried, a term higher
    /// each time (a vote in a term is never given twice). Proposals should have stopped before the
    /// call: an entry appended after step 2 makes the follower's log short and the handover fail.
    pub async fn hand_over<F, Fut>(
        &self,
        fence: Option<&VoteFence>,
        within: Duration,
        mut tell: F,
    ) -> Result<HandedOver, HandoverError>
    where
        F: FnMut(NodeId) -> Fut,
        Fut: std::future::Future<Output = Result<(), String>>,
    {
        let id = self.id();
        let began = Instant::now();
        let deadline = tokio::time::Instant::now() + within;
        let pause = Duration::from_millis(self.config().settings().heartbeat_ms);
        if let Some(fence) = fence {
            let in_flight = fence.stop_acting();
            tracing::info!(
                replica = id,
                in_flight,
                "handover: stopped acting under the lease ({in_flight} act(s) in flight)"
            );
        }
        let (takers, last) = self.takers(deadline, pause).await?;
        // From its step-down on, this replica's own election timer would run (its vote is
        // uncommitted) and could make it campaign against the taker while it waits for an act in
        // flight: it campaigns no more, unless the handover fails.
        self.raft().runtime_config().elect(false);
        let handed = self
            .hand_over_to(takers, last, fence, within, deadline, began, &mut tell)
            .await;
        if handed.is_err() {
            self.raft().runtime_config().elect(true);
        }
        handed
    }

    /// Steps 3 to 6 of [`Replica::hand_over`], trying `takers` in turn. While openraft refuses
    /// the step-down vote (its own vote lease just after an election) the takers are read again
    /// every heartbeat: entries appended meanwhile (reports still commit on a stopping leader)
    /// make the log a taker matched a moment ago too short, and a stale one would be refused until
    /// the deadline.
    #[allow(clippy::too_many_arguments)]
    async fn hand_over_to<F, Fut>(
        &self,
        mut takers: Vec<(NodeId, LogId)>,
        mut last: Option<u64>,
        fence: Option<&VoteFence>,
        within: Duration,
        deadline: tokio::time::Instant,
        began: Instant,
        tell: &mut F,
    ) -> Result<HandedOver, HandoverError>
    where
        F: FnMut(NodeId) -> Fut,
        Fut: std::future::Future<Output = Result<(), String>>,
    {
        let id = self.id();
        let pause = Duration::from_millis(self.config().settings().heartbeat_ms);
        let mut tried: Vec<String> = Vec::new();
        let no_taker = |tried: &[String], last: Option<u64>| HandoverError::NoTaker {
            id,
            last,
            waited_ms: within.as_millis() as u64,
            tried: if tried.is_empty() {
                "none caught up".to_string()
            } else {
                tried.join("; ")
            },
        };
        let mut stepped_down = false;
        loop {
            for (to, matched) in takers.iter().copied() {
                let Some(term) = self.vote_for(to, matched).await? else {
                    // openraft's own vote lease just after an election, or the log moved on.
                    continue;
                };
                stepped_down = true;
                tracing::info!(
                    replica = id,
                    to,
                    term,
                    after_ms = since(began),
                    "handover: stepped down for replica {to} in term {term}"
                );
                if let Some(fence) = fence {
                    if !fence.closed_by(deadline).await {
                        tried.push(format!(
                            "this replica's lease did not end in time ({} act(s) still in flight)",
                            fence.acting()
                        ));
                        return Err(no_taker(&tried, last));
                    }
                    tracing::info!(
                        replica = id,
                        after_ms = since(began),
                        "handover: the lease ended, no act in flight"
                    );
                }
                if let Err(why) = tell(to).await {
                    tried.push(format!("replica {to}: {why}"));
                    continue;
                }
                tracing::info!(
                    replica = id,
                    to,
                    after_ms = since(began),
                    "handover: replica {to} campaigns"
                );
                let left = deadline.saturating_duration_since(tokio::time::Instant::now());
                let elected = self
                    .raft()
                    .wait(Some(left))
                    .metrics(
                        |m| m.current_leader == Some(to) && m.current_term >= term,
                        "the follower takes over",
                    )
                    .await;
                return match elected {
                    Ok(m) => {
                        let done = HandedOver {
                            to,
                            term: m.current_term,
                        };
                        tracing::info!(
                            replica = id,
                            to,
                            term = done.term,
                            after_ms = since(began),
                            "leadership {done}"
                        );
                        Ok(done)
                    }
                    Err(e) => {
                        tried.push(format!(
                            "replica {to} was told to campaign but did not lead: {e}"
                        ));
                        Err(no_taker(&tried, last))
                    }
                };
            }
            if stepped_down {
                // Stepped down for a taker that could not be told: no longer the leader, so
                // there is nobody left to pick from.
                return Err(no_taker(&tried, last));
            }
            if tokio::time::Instant::now() + pause > deadline {
                tried.push(format!(
                    "this leader could not step down for {:?} (openraft's vote lease after an election, or a log that kept moving)",
                    takers.iter().map(|(to, _)| *to).collect::<Vec<_>>()
                ));
                return Err(no_taker(&tried, last));
            }
            tokio::time::sleep(pause).await;
            (takers, last) = self.takers(deadline, pause).await?;
        }
    }

    /// Steps down for `to` (with its log `matched`): hands the own Raft a vote for the next term
    /// that names no one, once; the term when granted, `None` when openraft refused it.
    ///
    /// It names no one (`voted_for: None`, openraft's "term moved, no candidate yet", as
    /// [`Replica::raise_term_above`] does) because this vote outlives a failed handover on disk.
    /// A vote naming `to` in a term `to` never campaigned in is one `to` would take for its own
    /// campaign: should `to` win an earlier term on its own and then hear of it (this replica
    /// restarted), openraft counts it as "still leading" — it keeps the earlier term's leadership,
    /// no election timer runs, and nothing commits again (chaos pass D, processes seed 1033:
    /// a follower one entry behind for good). A vote for no one makes that leader step down
    /// instead. `to`'s own campaign in this term is still granted (a vote naming a candidate is
    /// above one naming no one), and votes stay one per term: once granted, the term's vote names
    /// that candidate.
    async fn vote_for(&self, to: NodeId, matched: LogId) -> Result<Option<u64>, HandoverError> {
        let vote = self
            .raft()
            .with_raft_state(|s| *s.vote_ref())
            .await
            .map_err(|_| HandoverError::Stopped)?;
        let term = vote.leader_id().term + 1;
        let no_one = Vote {
            leader_id: openraft::LeaderId {
                term,
                voted_for: None,
            },
            committed: false,
        };
        tracing::debug!(replica = self.id(), to, term, "handover: stepping down");
        let request = VoteRequest::new(no_one, Some(matched));
        let answer = self
            .raft()
            .vote(request)
            .await
            .map_err(|_| HandoverError::Stopped)?;
        Ok(answer.vote_granted.then_some(term))
    }

    /// The voters whose replicated log matches this leader's last index, with that log id, and
    /// the last index; waits for at least one until `deadline`. `NotLeader` when this replica
    /// does not lead.
    async fn takers(
        &self,
        deadline: tokio::time::Instant,
        pause: Duration,
    ) -> Result<(Vec<(NodeId, LogId)>, Option<u64>), HandoverError> {
        let id = self.id();
        let mut metrics = self.raft().metrics();
        loop {
            let (takers, last) = {
                let m = metrics.borrow_and_update();
                if m.state != openraft::ServerState::Leader || m.current_leader != Some(id) {
                    return Err(HandoverError::NotLeader { id });
                }
                let voters: Vec<NodeId> = m.membership_config.membership().voter_ids().collect();
                let takers: Vec<(NodeId, LogId)> = m
                    .replication
                    .iter()
                    .flatten()
                    .filter(|(peer, _)| **peer != id && voters.contains(peer))
                    .filter_map(|(peer, matched)| matched.map(|l| (*peer, l)))
                    .filter(|(_, l)| Some(l.index) == m.last_log_index)
                    .collect();
                (takers, m.last_log_index)
            };
            let now = tokio::time::Instant::now();
            if !takers.is_empty() || now >= deadline {
                return Ok((takers, last));
            }
            crate::wait::changed_within(&mut metrics, (deadline - now).min(pause)).await;
        }
    }
}
