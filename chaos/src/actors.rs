//! The tasks of a chaos run: clients that propose KV writes, and one leader actor per replica that
//! sends envelopes only inside a lease (G3), with sequences committed through the log first (G4).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use ed25519_dalek::SigningKey;
use redb::ReadableDatabase;
use tokio::sync::watch;

use mesh::core::declaration::Declaration;
use mesh::core::envelope::{Envelope, Position, seal};
use mesh_raft::kv::{self, KvApp, Set};
use mesh_raft::{Clock, Gate, MonotonicClock, NodeId, ProposeError, Proposed, Replica};

use crate::history::{Event, LogPosition, Recorder};
use crate::rng::Rng;
use crate::sim::Machines;

/// Writes one client proposes at most in a run.
pub const writes_per_client_max: u64 = 5_000;
/// Pause between two writes of one client, so a run does not drown the disk in fsyncs.
pub const client_pause_ms: u64 = 15;
/// Pause after a failed write before the client tries again (possibly elsewhere).
pub const client_retry_ms: u64 = 40;
/// How long a client waits for one write before it gives up on it (the write may still commit).
pub const client_write_timeout_ms: u64 = 500;
/// Pause before the leader actor asks the gate again after it refused.
pub const acquire_retry_ms: u64 = 30;
/// Pause between two rounds of envelopes (one per machine) inside one lease.
pub const envelope_round_ms: u64 = 20;
/// Rounds of envelopes sent inside one lease at most before it is acquired afresh.
pub const rounds_per_lease_max: u32 = 8;

/// A replica of the run, shared by its tasks.
pub type SharedReplica = Arc<Replica<KvApp>>;

/// Freezes a leader actor between committing a sequence and sending its envelope, like a process
/// paused by the scheduler or a VM freeze at the worst moment.
#[derive(Clone)]
pub struct Pause {
    paused: watch::Sender<bool>,
    parked: watch::Sender<bool>,
}

impl Default for Pause {
    fn default() -> Self {
        Self {
            paused: watch::Sender::new(false),
            parked: watch::Sender::new(false),
        }
    }
}

impl Pause {
    /// The actor stops at its next commit-to-send point.
    pub fn pause(&self) {
        self.paused.send_replace(true);
    }

    /// The actor goes on.
    pub fn resume(&self) {
        self.paused.send_replace(false);
    }

    /// Waits until the actor is stopped at the pause point; false if `within` passed first.
    pub async fn wait_parked(&self, within: Duration) -> bool {
        let mut parked = self.parked.subscribe();
        let wait = parked.wait_for(|p| *p);
        matches!(tokio::time::timeout(within, wait).await, Ok(Ok(_)))
    }

    async fn pass(&self) {
        let mut paused = self.paused.subscribe();
        if !*paused.borrow_and_update() {
            return;
        }
        self.parked.send_replace(true);
        // The sender lives in `self`, so this ends only on resume.
        let _ = paused.wait_for(|p| !*p).await;
        self.parked.send_replace(false);
    }
}

/// Sleeps `ms`, or less if the run is told to stop; true when it should stop.
async fn pause_or_stop(stop: &mut watch::Receiver<bool>, ms: u64) -> bool {
    let _ = tokio::time::timeout(Duration::from_millis(ms), stop.wait_for(|s| *s)).await;
    *stop.borrow()
}

/// A client: writes unique values to a few shared keys, following the leader, until told to stop.
pub struct Client {
    pub id: u32,
    pub replicas: BTreeMap<NodeId, SharedReplica>,
    pub keys: Vec<String>,
    pub rng: Rng,
    pub history: Recorder,
    pub stop: watch::Receiver<bool>,
}

impl Client {
    pub async fn run(mut self) {
        let ids: Vec<NodeId> = self.replicas.keys().copied().collect();
        let mut target = ids[self.id as usize % ids.len()];
        for n in 0..writes_per_client_max {
            if *self.stop.borrow() {
                return;
            }
            let key = self.keys[self.rng.below(self.keys.len() as u64) as usize].clone();
            let value = format!("c{}-{n}", self.id);
            let pause = match self.write(target, key, value).await {
                Ok(()) => client_pause_ms,
                Err(ProposeError::NotLeader {
                    leader: Some(leader),
                    ..
                }) if self.replicas.contains_key(&leader) => {
                    target = leader;
                    client_retry_ms
                }
                Err(_) => {
                    target = ids[self.rng.below(ids.len() as u64) as usize];
                    client_retry_ms
                }
            };
            if pause_or_stop(&mut self.stop, pause).await {
                return;
            }
        }
    }

    async fn write(&self, via: NodeId, key: String, value: String) -> Result<(), ProposeError> {
        let op = self.history.next_op();
        let set = Set {
            key: key.clone(),
            value: value.clone().into_bytes(),
        };
        self.history.record(Event::WriteInvoked {
            op,
            client: self.id,
            via,
            key,
            value,
        });
        let answer = match set.encode() {
            Ok(command) => self.propose(via, command).await,
            Err(e) => Err(ProposeError::Raft(e.to_string())),
        };
        match answer {
            Ok(proposed) => {
                let previous = kv::decode_previous(&proposed.response)
                    .map(|p| p.map(|v| String::from_utf8_lossy(&v).into_owned()));
                match previous {
                    Ok(previous) => self.history.record(Event::WriteAcked {
                        op,
                        at: log_position(&proposed),
                        previous,
                    }),
                    Err(e) => self.history.record(Event::WriteUnknown {
                        op,
                        error: format!("committed, but the answer did not decode: {e}"),
                    }),
                };
                Ok(())
            }
            Err(e) => {
                // Even "not the leader" may come after the entry was appended: the outcome is unknown.
                self.history.record(Event::WriteUnknown {
                    op,
                    error: e.to_string(),
                });
                Err(e)
            }
        }
    }
}

impl Client {
    /// Proposes through `via`, giving up after [`client_write_timeout_ms`] as an impatient client
    /// would, so that a partitioned leader does not hold every client for the whole propose timeout.
    async fn propose(&self, via: NodeId, command: Vec<u8>) -> Result<Proposed, ProposeError> {
        let within = Duration::from_millis(client_write_timeout_ms);
        let answer = tokio::time::timeout(within, self.replicas[&via].propose(command)).await;
        answer.unwrap_or(Err(ProposeError::Timeout {
            timeout_ms: client_write_timeout_ms,
        }))
    }
}

fn log_position(p: &Proposed) -> LogPosition {
    LogPosition {
        term: p.term(),
        index: p.index(),
        position: p.position,
    }
}

/// Why a leader actor stopped using a lease.
#[derive(Debug, thiserror::Error)]
enum Stop {
    #[error("proposing the sequence failed: {0}")]
    Propose(#[from] ProposeError),
    #[error("reading the sequence counter {key} failed: {reason}")]
    Read { key: String, reason: String },
    #[error("counter {key} moved under us: expected {expected}, the log had {found:?}")]
    Raced {
        key: String,
        expected: u64,
        found: Option<String>,
    },
    #[error("the sequence committed in term {committed}, not the lease's term {lease}")]
    TermMoved { committed: u64, lease: u64 },
    #[error("sealing failed: {0}")]
    Seal(String),
    #[error("lease closed: {0}")]
    LeaseClosed(String),
}

/// The leader loop of one replica, cut down to what fencing needs: acquire a lease, then per machine
/// commit the next sequence and send a signed envelope at epoch = lease term, while the lease holds.
pub struct LeaderActor {
    pub replica: SharedReplica,
    pub key: SigningKey,
    pub machines: Vec<String>,
    pub net: Machines,
    pub history: Recorder,
    pub pause: Pause,
    pub stop: watch::Receiver<bool>,
}

impl LeaderActor {
    pub async fn run(mut self) {
        let clock = MonotonicClock;
        while !*self.stop.borrow() {
            let raft = self.replica.raft();
            let lease = match Gate::acquire(raft, &clock, self.replica.config()).await {
                Ok(lease) => lease,
                Err(_) => {
                    if pause_or_stop(&mut self.stop, acquire_retry_ms).await {
                        return;
                    }
                    continue;
                }
            };
            self.history.record(Event::LeaseAcquired {
                replica: self.replica.id(),
                term: lease.term(),
            });
            if let Err(stop) = self.send_while_open(&lease, &clock).await {
                tracing::debug!(replica = self.replica.id(), term = lease.term(), %stop, "lease left");
            }
        }
    }

    async fn send_while_open(
        &mut self,
        lease: &mesh_raft::Lease,
        clock: &dyn Clock,
    ) -> Result<(), Stop> {
        for _ in 0..rounds_per_lease_max {
            for i in 0..self.machines.len() {
                if *self.stop.borrow() {
                    return Ok(());
                }
                lease
                    .check(clock.now())
                    .map_err(|e| Stop::LeaseClosed(e.to_string()))?;
                let machine = self.machines[i].clone();
                let sequence = self.commit_sequence(&machine, lease.term()).await?;
                self.pause.pass().await;
                self.send(&machine, lease, clock, sequence)?;
            }
            if pause_or_stop(&mut self.stop, envelope_round_ms).await {
                return Ok(());
            }
        }
        Ok(())
    }

    /// G4: the next sequence of `machine` goes through the log before any envelope carries it. The
    /// KV app has no compare-and-set, so the check comes after: the value the write replaced must be
    /// the one this sequence was computed from, in the lease's term.
    async fn commit_sequence(&self, machine: &str, term: u64) -> Result<u64, Stop> {
        let key = counter_key(machine);
        let current = self.read_counter(&key)?;
        let next = current + 1;
        let set = Set {
            key: key.clone(),
            value: next.to_string().into_bytes(),
        };
        let command = set.encode().map_err(|e| Stop::Seal(e.to_string()))?;
        let proposed = self.replica.propose(command).await?;
        if proposed.term() != term {
            return Err(Stop::TermMoved {
                committed: proposed.term(),
                lease: term,
            });
        }
        let previous = kv::decode_previous(&proposed.response)
            .map_err(|e| Stop::Seal(e.to_string()))?
            .map(|v| String::from_utf8_lossy(&v).into_owned());
        let expected = (current > 0).then(|| current.to_string());
        if previous != expected {
            return Err(Stop::Raced {
                key,
                expected: current,
                found: previous,
            });
        }
        self.history.record(Event::SequenceCommitted {
            replica: self.replica.id(),
            machine: machine.to_string(),
            position: Position {
                epoch: term,
                sequence: next,
            },
            at: log_position(&proposed),
        });
        Ok(next)
    }

    fn read_counter(&self, key: &str) -> Result<u64, Stop> {
        let read_error = |reason: String| Stop::Read {
            key: key.to_string(),
            reason,
        };
        let txn = self
            .replica
            .database()
            .begin_read()
            .map_err(|e| read_error(e.to_string()))?;
        let Some(bytes) = kv::read(&txn, key).map_err(|e| read_error(e.to_string()))? else {
            return Ok(0);
        };
        String::from_utf8_lossy(&bytes)
            .parse()
            .map_err(|e: std::num::ParseIntError| read_error(e.to_string()))
    }

    /// Seals the envelope and lets it leave only if the lease is open at the very tick it is
    /// recorded as sent (G3).
    fn send(
        &self,
        machine: &str,
        lease: &mesh_raft::Lease,
        clock: &dyn Clock,
        sequence: u64,
    ) -> Result<(), Stop> {
        let replica = self.replica.id();
        let envelope = Envelope {
            machine: machine.to_string(),
            epoch: lease.term(),
            sequence,
            signer: replica,
            moves: Vec::new(),
            declaration: Declaration {
                machine: machine.to_string(),
                modules: Vec::new(),
                revoked: Default::default(),
            },
        };
        let position = envelope.position();
        let wire = seal(&envelope, &self.key).map_err(|e| Stop::Seal(e.to_string()))?;
        let sent = Event::EnvelopeSent {
            replica,
            machine: machine.to_string(),
            position,
        };
        match self
            .history
            .record_if(|| lease.check(clock.now()).map(|_| ()), sent)
        {
            Ok(_) => {
                self.net.send(replica, machine, wire);
                Ok(())
            }
            Err(closed) => {
                self.history.record(Event::SendAbandoned {
                    replica,
                    machine: machine.to_string(),
                    position,
                    reason: closed.to_string(),
                });
                Err(Stop::LeaseClosed(closed.to_string()))
            }
        }
    }
}

/// The KV key holding the last sequence committed for `machine`.
pub fn counter_key(machine: &str) -> String {
    format!("sequence/{machine}")
}
