//! Fault hooks for the chaos suite: per peer address, drop, delay, hold, reorder or cut off
//! outgoing messages, switchable at run time. Off by default; when no fault is set the hot path
//! pays one relaxed atomic load.

use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use tokio::sync::oneshot;

/// Most messages held for one peer; later ones are dropped (and counted) rather than queued
/// without bound.
pub const held_messages_max: usize = 4096;

/// Longest a release waits for one held message to finish before releasing the next, in
/// milliseconds; a message whose caller gave up does not stall the rest.
pub const release_step_ms_max: u64 = 10_000;

#[derive(Default)]
struct PeerFaults {
    cut_off: bool,
    drop_all: bool,
    drop_next: u64,
    duplicate_next: u64,
    delay: Option<Duration>,
    hold: bool,
    held: VecDeque<Held>,
}

impl PeerFaults {
    fn is_clear(&self) -> bool {
        !self.cut_off
            && !self.drop_all
            && self.drop_next == 0
            && self.duplicate_next == 0
            && self.delay.is_none()
            && !self.hold
            && self.held.is_empty()
    }
}

/// A held message: `go` lets it leave; `done` closes when it has finished (or given up).
struct Held {
    go: oneshot::Sender<()>,
    done: oneshot::Receiver<()>,
}

/// What the fault hooks decided for one outgoing message.
pub(crate) enum Verdict {
    Pass,
    Drop,
    /// The link is cut (`cut_off`, `drop_all`): a one-way message is lost; a request waits until
    /// the link is healed ([`Faults::request_verdict`]).
    Cut,
    Delay(Duration),
    /// Wait for `go`; keep `done` alive until the message has been delivered or failed.
    Hold {
        go: oneshot::Receiver<()>,
        done: oneshot::Sender<()>,
    },
}

/// The fault switchboard of one endpoint. Get it with `Endpoint::faults()`.
#[derive(Default)]
pub struct Faults {
    active: AtomicBool,
    peers: Mutex<HashMap<SocketAddr, PeerFaults>>,
    dropped: AtomicU64,
    duplicated: AtomicU64,
    /// Woken on every change of the faults, for requests waiting out a cut link.
    changed: tokio::sync::Notify,
    /// Set by [`Faults::pause_next_track`]: the next connection to finish its handshake waits
    /// before it is tracked, so a test can change the trust in that gap (decision 0297).
    track_paused: AtomicBool,
    track_pause: Mutex<Option<(oneshot::Sender<()>, oneshot::Receiver<()>)>>,
}

/// The gap between one connection's handshake and its tracking, held open by a test: wait for
/// [`TrackPause::reached`], change the trust, then [`TrackPause::release`] (or drop it).
pub struct TrackPause {
    reached: oneshot::Receiver<()>,
    go: oneshot::Sender<()>,
}

impl TrackPause {
    /// Waits until a connection has finished its handshake and waits to be tracked; false if
    /// the endpoint went away first.
    pub async fn reached(&mut self) -> bool {
        (&mut self.reached).await.is_ok()
    }

    /// Lets the connection be tracked.
    pub fn release(self) {
        // allow(empty-on-error): the connection may have gone; nothing waits any more then
        let _ = self.go.send(());
    }
}

impl std::fmt::Debug for Faults {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Faults")
            .field("active", &self.active.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

impl Faults {
    /// Holds the next connection (served or dialled) between its handshake and its tracking.
    pub fn pause_next_track(&self) -> TrackPause {
        let (reached_tx, reached) = oneshot::channel();
        let (go, go_rx) = oneshot::channel();
        *self
            .track_pause
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner()) = Some((reached_tx, go_rx));
        self.track_paused.store(true, Ordering::SeqCst);
        TrackPause { reached, go }
    }

    /// Where a connection waits when [`Faults::pause_next_track`] is set; one relaxed load
    /// otherwise. The wait ends when the test releases it or drops its [`TrackPause`].
    pub(crate) async fn before_track(&self) {
        if !self.track_paused.load(Ordering::Relaxed) {
            return;
        }
        let taken = self
            .track_pause
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .take();
        self.track_paused.store(false, Ordering::SeqCst);
        let Some((reached, go)) = taken else { return };
        // allow(empty-on-error): a test that dropped its pause waits for nothing
        let _ = reached.send(());
        // allow(empty-on-error): a dropped pause releases the connection
        let _ = go.await;
    }

    fn with_peer<T>(&self, peer: SocketAddr, change: impl FnOnce(&mut PeerFaults) -> T) -> T {
        let mut peers = self
            .peers
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let faults = peers.entry(peer).or_default();
        let out = change(faults);
        if faults.is_clear() {
            peers.remove(&peer);
        }
        self.active.store(!peers.is_empty(), Ordering::Relaxed);
        drop(peers);
        self.changed.notify_waiters();
        out
    }

    /// Drops every outgoing message to `peer` until healed.
    pub fn drop_all(&self, peer: SocketAddr) {
        self.with_peer(peer, |f| f.drop_all = true);
    }

    /// Drops the next `count` outgoing messages to `peer`.
    pub fn drop_next(&self, peer: SocketAddr, count: u64) {
        self.with_peer(peer, |f| f.drop_next = count);
    }

    /// Delivers each of the next `count` requests to `peer` that got an answer a second time
    /// right after (the same bytes, not gated again: a duplicate on the wire); the caller gets
    /// the first answer.
    pub fn duplicate_next(&self, peer: SocketAddr, count: u64) {
        self.with_peer(peer, |f| f.duplicate_next = count);
    }

    /// Whether the request to `peer` just answered is to be delivered again (and counts it).
    pub(crate) fn duplicate(&self, peer: SocketAddr) -> bool {
        if !self.active.load(Ordering::Relaxed) {
            return false;
        }
        let mut peers = self
            .peers
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let Some(f) = peers.get_mut(&peer) else {
            return false;
        };
        let again = f.duplicate_next > 0;
        if again {
            f.duplicate_next -= 1;
            self.duplicated.fetch_add(1, Ordering::Relaxed);
        }
        if f.is_clear() {
            peers.remove(&peer);
            self.active.store(!peers.is_empty(), Ordering::Relaxed);
        }
        again
    }

    /// Delays every outgoing message to `peer` by `delay` before it leaves.
    pub fn delay(&self, peer: SocketAddr, delay: Duration) {
        self.with_peer(peer, |f| f.delay = Some(delay));
    }

    /// Holds outgoing messages to `peer` (before they open a stream) until released.
    pub fn hold(&self, peer: SocketAddr) {
        self.with_peer(peer, |f| f.hold = true);
    }

    /// Cuts `peer` off entirely: outgoing messages are dropped and its incoming connections and
    /// streams get no answer.
    pub fn cut_off(&self, peer: SocketAddr) {
        self.with_peer(peer, |f| f.cut_off = true);
    }

    /// Removes every fault for `peer`; held messages leave at once, in no promised order.
    pub fn heal(&self, peer: SocketAddr) {
        let held = self.with_peer(peer, |f| {
            let held = std::mem::take(&mut f.held);
            *f = PeerFaults::default();
            held
        });
        for h in held {
            let _ = h.go.send(());
        }
    }

    /// Removes every fault for every peer.
    pub fn heal_all(&self) {
        let peers: Vec<SocketAddr> = {
            let map = self
                .peers
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner());
            map.keys().copied().collect()
        };
        for peer in peers {
            self.heal(peer);
        }
    }

    /// Messages currently held for `peer`.
    pub fn held(&self, peer: SocketAddr) -> usize {
        let peers = self
            .peers
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        peers.get(&peer).map_or(0, |f| f.held.len())
    }

    /// Messages held for `peer` whose sender still waits for them (has not given up).
    pub fn held_waiting(&self, peer: SocketAddr) -> usize {
        let peers = self
            .peers
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        peers
            .get(&peer)
            .map_or(0, |f| f.held.iter().filter(|h| !h.go.is_closed()).count())
    }

    /// Requests delivered twice by the hooks since the endpoint started.
    pub fn duplicated(&self) -> u64 {
        self.duplicated.load(Ordering::Relaxed)
    }

    /// Messages dropped by the hooks since the endpoint started.
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }

    /// Stops holding and lets the held messages leave one at a time, oldest first, each
    /// finishing before the next leaves. Returns how many were released.
    pub async fn release(&self, peer: SocketAddr) -> usize {
        self.release_in_order(peer, false).await
    }

    /// Like [`Faults::release`] but newest first: the reorder fault.
    pub async fn release_reversed(&self, peer: SocketAddr) -> usize {
        self.release_in_order(peer, true).await
    }

    async fn release_in_order(&self, peer: SocketAddr, reversed: bool) -> usize {
        let mut held = self.with_peer(peer, |f| {
            f.hold = false;
            std::mem::take(&mut f.held)
        });
        if reversed {
            held.make_contiguous().reverse();
        }
        let count = held.len();
        for h in held {
            if h.go.send(()).is_ok() {
                let step = Duration::from_millis(release_step_ms_max);
                // `done` resolves (with an error, as its sender is dropped) once the message has
                // finished; a timeout only means its caller is slow, and the rest go on.
                let _ = tokio::time::timeout(step, h.done).await;
            }
        }
        count
    }

    /// The decision for one outgoing message to `peer`.
    pub(crate) fn outgoing(&self, peer: SocketAddr) -> Verdict {
        if !self.active.load(Ordering::Relaxed) {
            return Verdict::Pass;
        }
        let mut peers = self
            .peers
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let Some(f) = peers.get_mut(&peer) else {
            return Verdict::Pass;
        };
        let verdict = if f.cut_off || f.drop_all {
            Verdict::Cut
        } else if f.drop_next > 0 {
            f.drop_next -= 1;
            Verdict::Drop
        } else if f.hold && f.held.len() >= held_messages_max {
            Verdict::Drop
        } else if f.hold {
            let (go_tx, go_rx) = oneshot::channel();
            let (done_tx, done_rx) = oneshot::channel();
            f.held.push_back(Held {
                go: go_tx,
                done: done_rx,
            });
            Verdict::Hold {
                go: go_rx,
                done: done_tx,
            }
        } else if let Some(delay) = f.delay {
            Verdict::Delay(delay)
        } else {
            Verdict::Pass
        };
        if f.is_clear() {
            peers.remove(&peer);
            self.active.store(!peers.is_empty(), Ordering::Relaxed);
        }
        if matches!(verdict, Verdict::Drop) {
            self.dropped.fetch_add(1, Ordering::Relaxed);
        }
        verdict
    }

    /// The decision for one outgoing request to `peer`: never [`Verdict::Cut`]. A request across
    /// a cut link waits until the link is healed and then goes, as QUIC retransmits a request
    /// whose path comes back; its caller's deadline bounds the wait. (Before, it was lost for
    /// good, so a link cut for 50 ms cost a whole request timeout: a snapshot sent to a replica
    /// while it restarted held that replica's replication for 10 s, chaos everything seed 1019.)
    pub(crate) async fn request_verdict(&self, peer: SocketAddr) -> Verdict {
        loop {
            let changed = self.changed.notified();
            tokio::pin!(changed);
            // Registered before the check, so a heal between the two is not missed.
            changed.as_mut().enable();
            match self.outgoing(peer) {
                Verdict::Cut => changed.await,
                verdict => return verdict,
            }
        }
    }

    /// Counts one message lost to a cut link.
    pub(crate) fn count_cut_loss(&self) {
        self.dropped.fetch_add(1, Ordering::Relaxed);
    }

    /// Whether traffic from `peer` is to be ignored.
    pub(crate) fn is_cut_off(&self, peer: SocketAddr) -> bool {
        if !self.active.load(Ordering::Relaxed) {
            return false;
        }
        let peers = self
            .peers
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        peers.get(&peer).is_some_and(|f| f.cut_off)
    }
}
