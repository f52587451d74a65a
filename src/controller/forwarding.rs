//! A follower's search for the leader to forward an operator's request to (G13, decisions 0110,
//! 0333), as a sans-I/O core: the shell (`Service::forward_to_leader`) reads Raft's metrics, probes
//! and forwards as told and feeds back what it saw with the time it is.
//!
//! The rules: a request is written to a leader at most once, and only to one that answered a probe
//! just before saying it leads (once written it may have run there, so whatever the transport
//! answers afterwards it is never sent anywhere else); a leader that does not answer counts as gone
//! and the next leader the metrics name is tried, until the search's time is up; when this replica
//! becomes leader meanwhile it handles the request itself.
//!
//! ```text
//!  Seen{leads here}            → HandleHere
//!  Seen{leader L}              → Probe(L)
//!  Probed(L, leads at A)       → Forward(L, A)            (once; then over)
//!  Probed(L, no) | Seen{none}  → Wait(until ≤ a heartbeat) → Seen … | GiveUp(why) at the deadline
//! ```

use std::time::Duration;

/// What Raft's metrics say now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Seen {
    /// This replica leads.
    LeadsHere,
    /// Another replica leads, as far as this one knows.
    Leader(u64),
    /// No leader is known (an election may be running).
    NoLeader,
}

/// How a probe of the leader ended; `A` is how the shell dials a replica (its address).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Probed<A> {
    /// It answered that it leads; it is dialled at this address.
    Leads(A),
    /// It answered, but no longer leads.
    Follows { role: String, term: u64 },
    /// It did not answer within the probe's time (`waited_ms`), or could not be dialled.
    Silent { waited_ms: u64, error: String },
    /// The metrics named another leader while the probe was on its way.
    Moved,
    /// Its address is in neither the membership nor `[peers]`.
    NoAddress { config: String },
}

/// Why the search has not found a leader yet (the last reason is the one answered).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum NotFound {
    NoneKnown,
    Probe { leader: u64, probed: Probed<()> },
}

impl std::fmt::Display for NotFound {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            NotFound::NoneKnown => write!(f, "no leader is known (an election may be running)"),
            NotFound::Probe { leader, probed } => match probed {
                Probed::Leads(_) => write!(f, "replica {leader} leads"),
                Probed::Follows { role, term } => write!(
                    f,
                    "replica {leader} no longer leads (it is {role} in term {term})"
                ),
                Probed::Silent { waited_ms, error } => write!(
                    f,
                    "the leader did not answer a probe within {waited_ms} ms: {error}"
                ),
                Probed::Moved => write!(f, "replica {leader} stopped being the leader"),
                Probed::NoAddress { config } => write!(
                    f,
                    "leader {leader} is neither in the membership nor in [peers] of {config}; fix the config"
                ),
            },
        }
    }
}

/// What the shell does next.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Step<A> {
    /// This replica leads now: handle the request here.
    HandleHere,
    /// Probe `leader`, dropping the probe if the metrics name another; answer `probed`.
    Probe { leader: u64 },
    /// Write the request to `leader` at `addr`, once, and answer whatever comes back.
    Forward { leader: u64, addr: A },
    /// Wait until the metrics change or `at_most` passed, then answer `seen`.
    Wait { at_most: Duration },
    /// The search's time (`find`) is up: answer "no leader", with the last reason.
    GiveUp { find: Duration, why: NotFound },
}

/// One request's search for a leader. Time goes in as the time since the search began.
pub(crate) struct Search<A> {
    find: Duration,
    /// How long one wait lasts at most before the metrics are read again (a heartbeat).
    pause: Duration,
    why: NotFound,
    /// The leader being probed, if any.
    probing: Option<u64>,
    /// Forwarded or handed over: nothing more may happen.
    over: bool,
    addr: std::marker::PhantomData<A>,
}

impl<A> Search<A> {
    /// A search that may last `find` (zero: one look, as `status` does).
    pub(crate) fn new(find: Duration, pause: Duration) -> Search<A> {
        Search {
            find,
            pause,
            why: NotFound::NoneKnown,
            probing: None,
            over: false,
            addr: std::marker::PhantomData,
        }
    }

    /// The metrics as they are, `now` after the search began.
    pub(crate) fn seen(&mut self, seen: Seen, now: Duration) -> Step<A> {
        if self.over {
            return self.give_up();
        }
        match seen {
            Seen::LeadsHere => {
                self.over = true;
                Step::HandleHere
            }
            Seen::Leader(leader) => {
                self.probing = Some(leader);
                Step::Probe { leader }
            }
            Seen::NoLeader => self.wait_or_give_up(now),
        }
    }

    /// The probe of `leader` ended, `now` after the search began.
    pub(crate) fn probed(&mut self, leader: u64, probed: Probed<A>, now: Duration) -> Step<A> {
        if self.over || self.probing != Some(leader) {
            // Not the probe this search asked for: nothing is written on it.
            self.over = true;
            return self.give_up();
        }
        self.probing = None;
        let probed = match probed {
            Probed::Leads(addr) => {
                // G13: written once, to a leader that answered just now.
                self.over = true;
                return Step::Forward { leader, addr };
            }
            Probed::Follows { role, term } => Probed::Follows { role, term },
            Probed::Silent { waited_ms, error } => Probed::Silent { waited_ms, error },
            Probed::Moved => Probed::Moved,
            Probed::NoAddress { config } => Probed::NoAddress { config },
        };
        self.why = NotFound::Probe { leader, probed };
        self.wait_or_give_up(now)
    }

    fn wait_or_give_up(&mut self, now: Duration) -> Step<A> {
        match self.find.checked_sub(now) {
            Some(left) if !left.is_zero() => Step::Wait {
                at_most: left.min(self.pause),
            },
            _ => self.give_up(),
        }
    }

    fn give_up(&mut self) -> Step<A> {
        self.over = true;
        Step::GiveUp {
            find: self.find,
            why: self.why.clone(),
        }
    }
}

#[cfg(test)]
mod tests;
