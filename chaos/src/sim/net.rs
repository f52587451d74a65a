//! The simulator's network: a UDP socket for quinn ([`SimSocket`], quinn's `AsyncUdpSocket`) whose
//! datagrams go through one [`Net`] instead of the OS. Every datagram's fate comes from the run's
//! seed: delivered after a delay (1 ms plus jitter, so datagrams overtake each other), dropped,
//! or delivered twice; a cut link drops everything; a held link (down behind a router queue)
//! keeps its first datagrams and delivers them when it comes back; a socket that is down (its replica crashed,
//! or a newer socket took its address) neither receives nor sends. Deliveries are tokio timers, so the paused clock jumps from one to the next.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::fmt;
use std::io::{self, IoSliceMut};
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use quinn::udp::{RecvMeta, Transmit};
use quinn::{AsyncUdpSocket, UdpPoller};

use crate::rng::Rng;

/// Datagrams waiting in one socket's inbox at most; more are dropped, as a full socket buffer does.
pub const inbox_datagrams_max: usize = 4_096;

/// The seeded network faults, per thousand datagrams (all zero: a perfect network with jitter).
#[derive(Clone, Copy, Debug, Default)]
pub struct Weather {
    pub drop_per_mille: u32,
    pub duplicate_per_mille: u32,
    /// Extra delay drawn in `0..=jitter_ms` for every datagram (reordering comes from it).
    pub jitter_ms: u64,
}

/// What the network did, for the run's summary.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NetCounts {
    pub sent: u64,
    pub delivered: u64,
    pub dropped: u64,
    pub duplicated: u64,
    pub cut: u64,
    /// Datagrams a socket tried to send after it was taken off the network (a killed replica's).
    pub silenced: u64,
    /// Datagrams a held link queued ([`Net::hold`]), delivered when it came back.
    pub held: u64,
}

struct Inbox {
    queue: VecDeque<(SocketAddr, Vec<u8>)>,
    waker: Option<Waker>,
}

struct State {
    rng: Rng,
    weather: Weather,
    /// The newest inbox bound at each address (a restarted replica binds its address again).
    inboxes: BTreeMap<SocketAddr, Arc<Mutex<Inbox>>>,
    /// Directed links that drop everything: (from, to).
    cut: BTreeSet<(SocketAddr, SocketAddr)>,
    /// Directed links that are down behind a router queue: the first datagrams sent on one wait
    /// in its queue (up to its room), the rest are dropped, and the queue drains when the link
    /// comes back ([`Net::hold`], [`Net::release`]).
    held: BTreeMap<(SocketAddr, SocketAddr), Held>,
    counts: NetCounts,
}

/// A link down behind a router queue.
struct Held {
    room: usize,
    queue: Vec<Vec<u8>>,
}

/// The network every simulated socket sends through.
#[derive(Clone)]
pub struct Net {
    state: Arc<Mutex<State>>,
}

impl fmt::Debug for Net {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Net").finish_non_exhaustive()
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Net {
    /// A network drawing every datagram's fate from `rng`.
    pub fn new(rng: Rng) -> Net {
        Net {
            state: Arc::new(Mutex::new(State {
                rng,
                weather: Weather::default(),
                inboxes: BTreeMap::new(),
                cut: BTreeSet::new(),
                held: BTreeMap::new(),
                counts: NetCounts::default(),
            })),
        }
    }

    /// A socket at `addr`; it replaces one bound there before (which then receives nothing).
    pub fn bind(&self, addr: SocketAddr) -> Arc<SimSocket> {
        let inbox = Arc::new(Mutex::new(Inbox {
            queue: VecDeque::new(),
            waker: None,
        }));
        lock(&self.state).inboxes.insert(addr, inbox.clone());
        Arc::new(SimSocket {
            net: self.clone(),
            addr,
            inbox,
        })
    }

    /// Takes `addr` off the network: nothing reaches it until it binds again.
    pub fn unbind(&self, addr: SocketAddr) {
        lock(&self.state).inboxes.remove(&addr);
    }

    pub fn set_weather(&self, weather: Weather) {
        lock(&self.state).weather = weather;
    }

    /// Cuts (or heals) both directions between `a` and `b`.
    pub fn cut_both(&self, a: SocketAddr, b: SocketAddr, cut: bool) {
        let mut s = lock(&self.state);
        for link in [(a, b), (b, a)] {
            if cut {
                s.cut.insert(link);
            } else {
                s.cut.remove(&link);
            }
        }
    }

    /// Takes the link from `from` to `to` down behind a router queue with room for `room`
    /// datagrams: the first `room` datagrams sent on it wait in the queue, later ones are
    /// dropped (counted as cut), until [`Net::release`]. What a route that fails under a router
    /// does: the router's buffer keeps what it had queued for the dead next hop and sends it on,
    /// in order, once the route is back, whatever the sender did meanwhile.
    pub fn hold(&self, from: SocketAddr, to: SocketAddr, room: usize) {
        lock(&self.state).held.insert(
            (from, to),
            Held {
                room,
                queue: Vec::new(),
            },
        );
    }

    /// Brings a held link back: its queue drains first (each datagram 1 ms apart, in the order
    /// sent), then the link carries datagrams as any other. Returns how many were queued.
    pub fn release(&self, from: SocketAddr, to: SocketAddr) -> usize {
        let Some(held) = lock(&self.state).held.remove(&(from, to)) else {
            return 0;
        };
        let n = held.queue.len();
        for (i, bytes) in held.queue.into_iter().enumerate() {
            let net = self.clone();
            let delay = Duration::from_millis(1 + i as u64);
            tokio::spawn(async move {
                tokio::time::sleep(delay).await;
                net.deliver(from, to, bytes);
            });
        }
        n
    }

    /// Heals every cut link and releases every held one.
    pub fn heal(&self) {
        let held: Vec<(SocketAddr, SocketAddr)> = {
            let mut s = lock(&self.state);
            s.cut.clear();
            s.held.keys().copied().collect()
        };
        for (from, to) in held {
            self.release(from, to);
        }
    }

    pub fn counts(&self) -> NetCounts {
        lock(&self.state).counts
    }

    fn send(&self, socket: &SimSocket, to: SocketAddr, bytes: &[u8]) {
        let from = socket.addr;
        let mut s = lock(&self.state);
        // A socket taken off the network (or replaced at its address) is a process that is gone:
        // nothing it writes leaves.
        if !s
            .inboxes
            .get(&from)
            .is_some_and(|bound| Arc::ptr_eq(bound, &socket.inbox))
        {
            s.counts.silenced += 1;
            return;
        }
        s.counts.sent += 1;
        if s.cut.contains(&(from, to)) {
            s.counts.cut += 1;
            return;
        }
        if let Some(held) = s.held.get_mut(&(from, to)) {
            if held.queue.len() < held.room {
                held.queue.push(bytes.to_vec());
                s.counts.held += 1;
            } else {
                s.counts.cut += 1;
            }
            return;
        }
        let weather = s.weather;
        if s.rng.chance(weather.drop_per_mille) {
            s.counts.dropped += 1;
            return;
        }
        let copies = if s.rng.chance(weather.duplicate_per_mille) {
            s.counts.duplicated += 1;
            2
        } else {
            1
        };
        for _ in 0..copies {
            let delay = Duration::from_millis(1 + s.rng.below(weather.jitter_ms + 1));
            let net = self.clone();
            let bytes = bytes.to_vec();
            tokio::spawn(async move {
                tokio::time::sleep(delay).await;
                net.deliver(from, to, bytes);
            });
        }
    }

    fn deliver(&self, from: SocketAddr, to: SocketAddr, bytes: Vec<u8>) {
        let inbox = {
            let mut s = lock(&self.state);
            // A link cut while the datagram flew drops it too.
            if s.cut.contains(&(from, to)) {
                s.counts.cut += 1;
                return;
            }
            let Some(inbox) = s.inboxes.get(&to).cloned() else {
                s.counts.dropped += 1;
                return;
            };
            s.counts.delivered += 1;
            inbox
        };
        let mut inbox = lock(&inbox);
        if inbox.queue.len() >= inbox_datagrams_max {
            return;
        }
        inbox.queue.push_back((from, bytes));
        if let Some(waker) = inbox.waker.take() {
            waker.wake();
        }
    }
}

/// One endpoint's socket on the simulated network.
pub struct SimSocket {
    net: Net,
    addr: SocketAddr,
    inbox: Arc<Mutex<Inbox>>,
}

impl fmt::Debug for SimSocket {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SimSocket")
            .field("addr", &self.addr)
            .finish_non_exhaustive()
    }
}

/// Always writable: the simulated network never pushes back.
#[derive(Debug)]
struct Writable;

impl UdpPoller for Writable {
    fn poll_writable(self: Pin<&mut Self>, _cx: &mut Context) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

impl AsyncUdpSocket for SimSocket {
    fn create_io_poller(self: Arc<Self>) -> Pin<Box<dyn UdpPoller>> {
        Box::pin(Writable)
    }

    fn try_send(&self, transmit: &Transmit) -> io::Result<()> {
        match transmit.segment_size {
            Some(size) if size > 0 => {
                for datagram in transmit.contents.chunks(size) {
                    self.net.send(self, transmit.destination, datagram);
                }
            }
            _ => self.net.send(self, transmit.destination, transmit.contents),
        }
        Ok(())
    }

    fn poll_recv(
        &self,
        cx: &mut Context,
        bufs: &mut [IoSliceMut<'_>],
        meta: &mut [RecvMeta],
    ) -> Poll<io::Result<usize>> {
        let mut inbox = lock(&self.inbox);
        let mut n = 0;
        while n < bufs.len().min(meta.len()) {
            let Some((from, bytes)) = inbox.queue.pop_front() else {
                break;
            };
            let len = bytes.len().min(bufs[n].len());
            bufs[n][..len].copy_from_slice(&bytes[..len]);
            meta[n] = RecvMeta {
                addr: from,
                len,
                stride: len,
                ecn: None,
                dst_ip: Some(self.addr.ip()),
            };
            n += 1;
        }
        if n > 0 {
            return Poll::Ready(Ok(n));
        }
        inbox.waker = Some(cx.waker().clone());
        Poll::Pending
    }

    fn local_addr(&self) -> io::Result<SocketAddr> {
        Ok(self.addr)
    }
}
