//! The simulated machines of a chaos run: hosts that fence envelopes with the core's `open` and a
//! high-water mark (G2), the faulty links from replicas to hosts (hold, delay, replay), and the
//! controller's accounts that file the hosts' reports as they arrive, reordered (G5).

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use ed25519_dalek::VerifyingKey;
use tokio::sync::Semaphore;

use mesh::core::envelope::{Envelope, Position, Refusal, open};
use mesh::core::report::{Account, Filed, Report};
use mesh_raft::NodeId;

use crate::history::{Event, Recorder};
use crate::rng::Rng;

/// Envelopes held on one link at most; beyond that a held envelope is lost.
pub const held_envelopes_max: usize = 1024;
/// Deliveries (delayed envelopes and reports) in flight at once at most; beyond that one is lost.
pub const deliveries_in_flight_max: usize = 4096;
/// Longest a report may take to reach the controller, so reports overtake each other.
pub const report_delay_max_ms: u64 = 40;

/// One simulated `mesh-host`: the fencing half of the real one, with no modules to run.
struct Host {
    machine: String,
    trusted: BTreeMap<u64, VerifyingKey>,
    /// The high-water mark: the last `(epoch, sequence)` accepted.
    accepted: Option<Position>,
    report_sequence: u64,
    refused_older: u64,
    last_refusal: Option<String>,
}

impl Host {
    /// G2: verify, fence on the high-water mark, then persist the new mark before applying.
    fn receive(&mut self, wire: &[u8]) -> Result<Envelope, Refusal> {
        let envelope = match open(wire, &self.trusted, &self.machine, self.accepted) {
            Ok(envelope) => envelope,
            Err(refusal) => {
                if matches!(refusal, Refusal::Older { .. }) {
                    self.refused_older += 1;
                }
                self.last_refusal = Some(refusal.to_string());
                return Err(refusal);
            }
        };
        self.accepted = Some(envelope.position());
        Ok(envelope)
    }

    /// A report of what this host has applied, with the next report sequence.
    fn report(&mut self) -> Report {
        self.report_sequence += 1;
        let at = self.accepted.unwrap_or_default();
        Report {
            machine: self.machine.clone(),
            epoch: at.epoch,
            sequence: at.sequence,
            report_sequence: self.report_sequence,
            applied: None,
            modules: Vec::new(),
            refused_older: self.refused_older,
            last_refusal: self.last_refusal.clone(),
            proof: None,
        }
    }
}

/// Faults on the links from replicas to hosts, per sending replica.
#[derive(Default)]
struct LinkFaults {
    held: BTreeMap<NodeId, VecDeque<(String, Vec<u8>)>>,
    delay: BTreeMap<NodeId, Duration>,
    replay_per_mille: BTreeMap<NodeId, u32>,
}

struct Inner {
    hosts: BTreeMap<String, Mutex<Host>>,
    accounts: Mutex<BTreeMap<String, Account>>,
    faults: Mutex<LinkFaults>,
    rng: Mutex<Rng>,
    in_flight: Arc<Semaphore>,
    history: Recorder,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panicked task leaves plain data behind; keep going with it.
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// The hosts, the links to them and the controller's accounts; clone it freely.
#[derive(Clone)]
pub struct Machines {
    inner: Arc<Inner>,
}

impl Machines {
    /// One host per name, each trusting `trusted`; link randomness comes from `seed`.
    pub fn new(
        names: &[String],
        trusted: &BTreeMap<u64, VerifyingKey>,
        seed: u64,
        history: Recorder,
    ) -> Self {
        let hosts = names
            .iter()
            .map(|name| {
                let host = Host {
                    machine: name.clone(),
                    trusted: trusted.clone(),
                    accepted: None,
                    report_sequence: 0,
                    refused_older: 0,
                    last_refusal: None,
                };
                (name.clone(), Mutex::new(host))
            })
            .collect();
        Self {
            inner: Arc::new(Inner {
                hosts,
                accounts: Mutex::new(BTreeMap::new()),
                faults: Mutex::new(LinkFaults::default()),
                rng: Mutex::new(Rng::new(seed, 0x11_4b5)),
                in_flight: Arc::new(Semaphore::new(deliveries_in_flight_max)),
                history,
            }),
        }
    }

    /// Carries `wire` from replica `from` to the host of `machine` through the link's faults.
    pub fn send(&self, from: NodeId, machine: &str, wire: Vec<u8>) {
        let (delay, replay) = {
            let mut faults = lock(&self.inner.faults);
            if let Some(queue) = faults.held.get_mut(&from) {
                if queue.len() < held_envelopes_max {
                    queue.push_back((machine.to_string(), wire));
                }
                return;
            }
            let delay = faults.delay.get(&from).copied().unwrap_or_default();
            let replay = faults.replay_per_mille.get(&from).copied().unwrap_or(0);
            (delay, replay)
        };
        let delay = if delay.is_zero() {
            delay
        } else {
            // Jitter, so that a later envelope may overtake an earlier one.
            let ms = lock(&self.inner.rng).between(0, delay.as_millis() as u64);
            Duration::from_millis(ms)
        };
        if replay > 0 && lock(&self.inner.rng).chance(replay) {
            // A replayed envelope arrives again a little later, as a retransmission would.
            self.deliver_later(
                from,
                machine,
                wire.clone(),
                delay + Duration::from_millis(5),
            );
        }
        if delay.is_zero() {
            self.deliver(from, machine, &wire);
        } else {
            self.deliver_later(from, machine, wire, delay);
        }
    }

    fn deliver_later(&self, from: NodeId, machine: &str, wire: Vec<u8>, after: Duration) {
        let Ok(permit) = self.inner.in_flight.clone().try_acquire_owned() else {
            self.note(format!(
                "envelope {from}→{machine} lost: too many in flight"
            ));
            return;
        };
        let this = self.clone();
        let machine = machine.to_string();
        tokio::spawn(async move {
            tokio::time::sleep(after).await;
            this.deliver(from, &machine, &wire);
            drop(permit);
        });
    }

    /// The host of `machine` receives `wire`, records what it did, and reports an apply.
    fn deliver(&self, link: NodeId, machine: &str, wire: &[u8]) {
        let Some(host) = self.inner.hosts.get(machine) else {
            self.note(format!("envelope {link}→{machine} lost: no such host"));
            return;
        };
        let mut host = lock(host);
        let report = match host.receive(wire) {
            Ok(envelope) => {
                self.inner.history.record(Event::EnvelopeApplied {
                    machine: machine.to_string(),
                    signer: envelope.signer,
                    position: envelope.position(),
                });
                host.report()
            }
            Err(refusal) => {
                let got = match &refusal {
                    Refusal::Older { got, .. } => Some(*got),
                    _ => None,
                };
                self.inner.history.record(Event::EnvelopeRefused {
                    machine: machine.to_string(),
                    link,
                    got,
                    reason: refusal.to_string(),
                });
                return;
            }
        };
        drop(host);
        self.send_report(report);
    }

    /// Every host sends a periodic reconcile report.
    pub fn reconcile(&self) {
        for host in self.inner.hosts.values() {
            let report = lock(host).report();
            self.send_report(report);
        }
    }

    /// Sends a report to the controller after a random delay, so reports may overtake each other.
    fn send_report(&self, report: Report) {
        let after = Duration::from_millis(lock(&self.inner.rng).below(report_delay_max_ms + 1));
        let Ok(permit) = self.inner.in_flight.clone().try_acquire_owned() else {
            self.note(format!(
                "report {} lost: too many in flight",
                report.position()
            ));
            return;
        };
        let this = self.clone();
        tokio::spawn(async move {
            tokio::time::sleep(after).await;
            this.file(report);
            drop(permit);
        });
    }

    /// The controller files a report in arrival order (G5) and records the verdict.
    fn file(&self, report: Report) {
        let machine = report.machine.clone();
        let got = report.position();
        let mut accounts = lock(&self.inner.accounts);
        let account = accounts.entry(machine.clone()).or_default();
        let filed = account.file(report);
        self.inner.history.record(Event::ReportFiled {
            machine,
            got,
            accepted: filed == Filed::Accepted,
            account: account.last,
        });
    }

    /// Holds envelopes from `from` until [`Machines::release`].
    pub fn hold(&self, from: NodeId) {
        lock(&self.inner.faults).held.entry(from).or_default();
    }

    /// Delivers the envelopes held from `from`, in the order they were sent, and stops holding.
    pub fn release(&self, from: NodeId) {
        let held = lock(&self.inner.faults).held.remove(&from);
        for (machine, wire) in held.unwrap_or_default() {
            self.deliver(from, &machine, &wire);
        }
    }

    /// Delays every envelope from `from` by up to `by` (zero stops delaying); later ones may overtake.
    pub fn delay(&self, from: NodeId, by: Duration) {
        let mut faults = lock(&self.inner.faults);
        if by.is_zero() {
            faults.delay.remove(&from);
        } else {
            faults.delay.insert(from, by);
        }
    }

    /// Delivers `per_mille` of the envelopes from `from` twice (0 stops replaying).
    pub fn replay(&self, from: NodeId, per_mille: u32) {
        let mut faults = lock(&self.inner.faults);
        if per_mille == 0 {
            faults.replay_per_mille.remove(&from);
        } else {
            faults.replay_per_mille.insert(from, per_mille.min(1000));
        }
    }

    /// Clears every link fault and delivers everything held.
    pub fn heal(&self) {
        let held: Vec<NodeId> = lock(&self.inner.faults).held.keys().copied().collect();
        for from in held {
            self.release(from);
        }
        let mut faults = lock(&self.inner.faults);
        faults.delay.clear();
        faults.replay_per_mille.clear();
    }

    /// Waits until every delayed envelope and report has arrived; false if `within` passed first.
    pub async fn settle(&self, within: Duration) -> bool {
        let all = deliveries_in_flight_max as u32;
        let wait = self.inner.in_flight.acquire_many(all);
        matches!(tokio::time::timeout(within, wait).await, Ok(Ok(_)))
    }

    fn note(&self, what: String) {
        self.inner.history.record(Event::Note { what });
    }
}
