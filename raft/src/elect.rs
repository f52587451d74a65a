//! mesh's own election timer (decision 0328). openraft 0.9.25's timer lets a follower campaign only
//! `leader_lease + election_timeout` after the last heartbeat, with the timeout drawn once at start;
//! it is off (`Config::enable_elect = false`) and this task campaigns instead: a voter that has not
//! heard a leader for a timeout drawn from its own slice of the campaign window
//! ([`RaftConfig::election_window`]), drawn afresh for every election, campaigns.
//!
//! When to campaign is read from the Raft core (`vote_last_modified`: the instant openraft last
//! accepted a heartbeat or changed the vote, the one its vote lease runs from), but the read and
//! the campaign are two messages to the core, and a heartbeat may be accepted between them. So a
//! campaign starts only through [`campaign_unless_heard`]: the replica first hands its own Raft a
//! vote for the next term that names no one, which openraft grants, inside the core and in one
//! step, only when its vote lease of the leader it follows has ended (`Engine::handle_vote_req`),
//! and only if the term did not move since the read (see there). Once granted, no heartbeat of
//! the old term is accepted any more, so no replica campaigns within the vote lease after
//! acknowledging a heartbeat: the lease (G3, decision 0030) rests on openraft's own check, not on
//! this timer. A sole voter campaigns at once, as openraft's own timer does: no one else can lead.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use openraft::error::{Fatal, RaftError};
use openraft::raft::VoteRequest;
use openraft::{AsyncRuntime, ServerState};
use tokio::time::Instant;

use crate::gate::{VoteFence, fenced_vote};
use crate::runtime::SeededRuntime;
use crate::{LogId, NodeId, Raft, RaftConfig, Vote};

/// What the timer reads from the Raft core in one message.
struct Seen {
    leads: bool,
    voters: BTreeSet<NodeId>,
    vote: Vote,
    /// When openraft last accepted a heartbeat or changed the vote (`None` before either).
    heard: Option<Instant>,
}

async fn read(raft: &Raft) -> Result<Seen, Fatal<NodeId>> {
    raft.with_raft_state(|s| Seen {
        leads: s.server_state == ServerState::Leader,
        voters: s.membership_state.effective().voter_ids().collect(),
        vote: *s.vote_ref(),
        heard: s.vote_last_modified(),
    })
    .await
}

/// Runs replica `id`'s election timer until its Raft stops. Campaigns while `on` holds (a replica
/// handing its leadership over turns it off, decision 0225), through `fence` once the replica's
/// service set one (its own no-one vote is then refused while a lease of this replica is open,
/// decision 0071). Every draw comes from the runtime's generator ([`SeededRuntime`]), on the
/// thread the replica started on, so the simulator replays it.
pub(crate) async fn run(
    raft: Raft,
    id: NodeId,
    config: RaftConfig,
    on: Arc<AtomicBool>,
    fence: Arc<OnceLock<Arc<VoteFence>>>,
) {
    let began = Instant::now();
    let heartbeat = config.heartbeat();
    // After a refused campaign the state is read again; this keeps a refusal that repeats from
    // spinning.
    let pause = heartbeat / 5;
    let mut timeout: Option<(BTreeSet<NodeId>, Duration)> = None;
    loop {
        let Ok(seen) = read(&raft).await else { return };
        if seen.leads || !seen.voters.contains(&id) || !on.load(Ordering::Acquire) {
            tokio::time::sleep(heartbeat).await;
            continue;
        }
        let drawn = match &timeout {
            Some((voters, drawn)) if *voters == seen.voters => *drawn,
            _ => {
                let mut rng = SeededRuntime::thread_rng();
                let drawn = config.draw_election_timeout(id, &seen.voters, &mut rng);
                timeout = Some((seen.voters.clone(), drawn));
                drawn
            }
        };
        let due = seen.heard.unwrap_or(began) + drawn;
        if Instant::now() < due {
            tokio::time::sleep_until(due).await;
            continue;
        }
        let campaign = if seen.voters.len() == 1 {
            raft.trigger()
                .elect()
                .await
                .map(|()| Some(seen.vote.leader_id().term + 1))
        } else {
            campaign_unless_heard(&raft, id, &seen.vote, fence.get().map(|f| f.as_ref())).await
        };
        match campaign {
            Err(_) => return,
            Ok(Some(term)) => {
                tracing::info!(
                    replica = id,
                    term,
                    "campaigning in term {term}: no leader heard for {} ms",
                    drawn.as_millis()
                );
                timeout = None;
            }
            Ok(None) => tokio::time::sleep(pause).await,
        }
    }
}

/// Makes replica `id` campaign, unless it heard a leader within its vote lease or its term moved
/// since it read `seen` (its vote then). Answers the term it campaigns in, or `None` when openraft
/// (or `fence`) refused.
///
/// The replica hands its own Raft a vote request for term `T + 1` (`T` = `seen`'s term) that votes
/// for no one (as [`crate::Replica::raise_term_above`] does), then `trigger().elect()` campaigns in
/// `T + 2`. openraft grants that vote, in one step of its core, only if
/// - its vote is not a committed one whose lease has not ended: a follower that accepted a
///   heartbeat within the vote lease refuses ([`RaftConfig::vote_lease`]), and so does a replica
///   elected within it;
/// - `T + 1` with no one named is at least its vote: a vote of a later term, or a leader elected
///   in `T + 1`, refuses.
///
/// The claimed log is any log of term `T + 1`: openraft compares it to protect a candidate's
/// voters, and there is no candidate here (the claim is not stored). With `fence` the vote goes
/// through [`fenced_vote`]: a replica elected in `T` after the read and holding a lease refuses.
///
/// Once granted, the vote is `T + 1`: no heartbeat of a term up to `T` is accepted after it. So a
/// replica campaigns only once its vote lease has ended since the last heartbeat it accepted.
pub async fn campaign_unless_heard(
    raft: &Raft,
    id: NodeId,
    seen: &Vote,
    fence: Option<&VoteFence>,
) -> Result<Option<u64>, Fatal<NodeId>> {
    let term = seen.leader_id().term;
    if term.saturating_add(2) >= crate::network::term_max {
        tracing::error!(
            replica = id,
            term,
            "no campaign: term {term} is at the highest term a replica takes ({})",
            crate::network::term_max
        );
        return Ok(None);
    }
    let claim = LogId::new(openraft::CommittedLeaderId::new(term + 1, id), u64::MAX);
    let no_one = Vote {
        leader_id: openraft::LeaderId {
            term: term + 1,
            voted_for: None,
        },
        committed: false,
    };
    let request = VoteRequest::new(no_one, Some(claim));
    let answer = match fence {
        Some(fence) => fenced_vote(raft, request, fence).await,
        None => raft.vote(request).await,
    };
    let answer = answer.map_err(|e| match e {
        RaftError::Fatal(f) => f,
        RaftError::APIError(never) => match never {},
    })?;
    if !answer.vote_granted {
        return Ok(None);
    }
    raft.trigger().elect().await?;
    Ok(Some(term + 2))
}
