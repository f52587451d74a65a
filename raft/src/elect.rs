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
//!
//! The receive side of votes is here too ([`answer_vote`], decision 0336): a voter that refuses a
//! candidate for its shorter log takes the candidate's term, so its own next campaign is above it;
//! openraft 0.9.25 leaves the refuser's term where it was, and with this timer the longer log then
//! campaigned in a term the shorter one had already voted itself in, for ever.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use openraft::error::{Fatal, RaftError};
use openraft::raft::{VoteRequest, VoteResponse};
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
    // When the vote last named a replica (a leader heard, a candidate voted for, this replica's
    // own candidacy), as last read; `None` while leading and before the first such read.
    let mut named: Option<Instant> = None;
    loop {
        let Ok(seen) = read(&raft).await else { return };
        if seen.leads {
            named = None;
        } else if seen.vote.leader_id().voted_for.is_some() {
            named = seen.heard;
        }
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
        // A vote naming no one only moved the term (a term taken from a refused candidate,
        // [`answer_vote`]; a step-down): no leader was heard then, so it does not put the
        // campaign off (decision 0336). Without a named vote since leading or starting, it counts.
        let due = named.or(seen.heard).unwrap_or(began) + drawn;
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

/// Answers a peer's vote request on this replica; both receive paths (QUIC, `crate::network`, and
/// the router) call it. The vote goes through `fence` when given ([`fenced_vote`]). Then, when
/// openraft refused the candidate because this replica's log is longer, and the candidate's term
/// is above this replica's, this replica takes that term with a vote that names no one
/// ([`take_term`], decision 0336).
///
/// Why: openraft 0.9.25's `Engine::handle_vote_req` refuses a shorter log *before* it compares
/// votes, so the refuser keeps its lower term (Raft's rule, a higher term seen is taken, is not
/// applied there). With openraft's own timer the refused candidate waited `smaller_log_timeout`;
/// with ours ([`run`]) each campaign goes from this replica's own term `T` to `T + 2`, so the
/// longer log campaigned in the very term the shorter one had already voted itself in, and was
/// refused in turn, forever (bed_faults' cut-off leader, 2026-12-06). Having taken the term, the
/// longer log's next campaign is above every term a shorter candidate asked it for.
pub async fn answer_vote(
    raft: &Raft,
    rpc: VoteRequest<NodeId>,
    fence: Option<&VoteFence>,
) -> Result<VoteResponse<NodeId>, RaftError<NodeId>> {
    let asked = rpc.vote.leader_id().term;
    let claimed = rpc.last_log_id;
    let answer = match fence {
        Some(fence) => fenced_vote(raft, rpc, fence).await?,
        None => raft.vote(rpc).await?,
    };
    if refused_for_a_shorter_log(&answer, asked, claimed.as_ref()) {
        take_term(raft, asked, fence)
            .await
            .map_err(RaftError::Fatal)?;
    }
    Ok(answer)
}

/// Whether `answer` refused a candidate of term `asked` claiming `claimed` for its shorter log,
/// while this replica's term is below `asked`. openraft answers every refusal with its own vote and
/// last log id; only the log check refuses a claim shorter than that log (a refusal for the vote
/// lease or for the vote itself is taken as such only when the log is longer too, and then
/// [`take_term`] is refused by the same lease). A fence's refusal carries no log id: never.
fn refused_for_a_shorter_log(
    answer: &VoteResponse<NodeId>,
    asked: u64,
    claimed: Option<&LogId>,
) -> bool {
    !answer.vote_granted
        && answer.last_log_id.as_ref() > claimed
        && answer.vote.leader_id().term < asked
}

/// Takes term `term` on this replica with a vote that names no one, unless it leads or its term is
/// already there; answers whether the term was taken. openraft grants it, in one step of its core,
/// only if this replica's vote lease of the leader it follows has ended (`Engine::handle_vote_req`:
/// a committed vote touched within `leader_lease` refuses) — the very check the first step of a
/// campaign passes ([`campaign_unless_heard`]) — and through `fence` when given (a lease of this
/// replica open refuses). It votes for no one, so it elects no one; it only moves the term, as
/// Raft lets any node do, and after it no heartbeat of a lower term is accepted. The claimed log is
/// any log of `term` (compared only to protect a candidate's voters; there is none; not stored).
/// A leader keeps its term: a shorter candidate cannot win against it, and openraft's leader
/// steps down on its own when a higher term reaches it in an answer.
pub async fn take_term(
    raft: &Raft,
    term: u64,
    fence: Option<&VoteFence>,
) -> Result<bool, Fatal<NodeId>> {
    if term >= crate::network::term_max {
        return Ok(false);
    }
    let (leads, current) = raft
        .with_raft_state(|s| {
            (
                s.server_state == ServerState::Leader,
                s.vote_ref().leader_id().term,
            )
        })
        .await?;
    if leads || current >= term {
        return Ok(false);
    }
    let no_one = Vote {
        leader_id: openraft::LeaderId {
            term,
            voted_for: None,
        },
        committed: false,
    };
    let claim = LogId::new(openraft::CommittedLeaderId::new(term, 0), u64::MAX);
    let request = VoteRequest::new(no_one, Some(claim));
    let answer = match fence {
        Some(fence) => fenced_vote(raft, request, fence).await,
        None => raft.vote(request).await,
    };
    let answer = answer.map_err(|e| match e {
        RaftError::Fatal(f) => f,
        RaftError::APIError(never) => match never {},
    })?;
    if answer.vote_granted {
        tracing::info!(
            from_term = current,
            term,
            "took term {term}: refused a candidate of that term for its shorter log"
        );
    }
    Ok(answer.vote_granted)
}
