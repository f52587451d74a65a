//! Every open connection of an endpoint, served or dialled, so a reload or a new deny list can
//! check each one's peer certificate again and close those no longer trusted (decision 0172).
//! A connection whose handshake ran while the trust changed is checked again as it is tracked
//! (decision 0297). Bounded by the serving limit and the peer limit: an entry leaves when its
//! connection closes.
//!
//! It also holds the accepted connections another side may send back over (decision 0316): a
//! host's connection to a replica carries the replica's envelopes as well as the host's reports,
//! whichever of the two dialled it, so a leader keeps one connection per host, not two.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use quinn::Connection;
use rustls::pki_types::CertificateDer;

use crate::principal::Principal;
use crate::trust::{CertInfo, Live};

/// Whether this side dialled the connection (the peer serves) or accepted it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Side {
    Dialled,
    Accepted,
}

pub(crate) struct OpenConns {
    conns: Mutex<HashMap<usize, (Connection, Side)>>,
    shared: Mutex<Shared>,
    live: Arc<Live>,
}

/// An accepted connection this side may also send over (see [`shares_connections`]), with the
/// principal and certificate its handshake verified.
#[derive(Clone)]
pub(crate) struct SharedConn {
    pub(crate) conn: Connection,
    pub(crate) principal: Principal,
    pub(crate) cert: Option<CertInfo>,
}

/// The shared accepted connections by the peer's address and by its principal; each entry
/// leaves when its connection closes (or a newer connection of the same peer replaces it).
#[derive(Default)]
struct Shared {
    by_addr: HashMap<SocketAddr, SharedConn>,
    by_principal: HashMap<Principal, SocketAddr>,
    /// Where each shared connection is filed, by its `stable_id`, for its removal at close.
    by_id: HashMap<usize, SocketAddr>,
}

impl Shared {
    /// Drops the entry at `addr` and what points to it.
    fn remove(&mut self, addr: SocketAddr) {
        let Some(entry) = self.by_addr.remove(&addr) else {
            return;
        };
        self.by_id.remove(&entry.conn.stable_id());
        if self.by_principal.get(&entry.principal) == Some(&addr) {
            self.by_principal.remove(&entry.principal);
        }
    }
}

/// Whether a connection between `own` and `peer` carries messages both ways, whichever side
/// dialled it: one is a host and the other a replica (decision 0316). They exchange reports one
/// way and envelopes (or log requests) the other, so one connection serves both. Replicas among
/// themselves keep a connection per direction, as before, and nothing is sent back to an
/// operator (nor does a host talk to one).
pub(crate) fn shares_connections(own: &Principal, peer: &Principal) -> bool {
    matches!(
        (own, peer),
        (Principal::Host(_), Principal::Replica(_)) | (Principal::Replica(_), Principal::Host(_))
    )
}

impl OpenConns {
    pub(crate) fn new(live: Arc<Live>) -> OpenConns {
        OpenConns {
            conns: Mutex::new(HashMap::new()),
            shared: Mutex::new(Shared::default()),
            live,
        }
    }

    /// The trust's generation; read it before a handshake starts and pass it to [`Self::track`].
    pub(crate) fn since(&self) -> u64 {
        self.live.generation()
    }

    /// Keeps `conn` until it closes. When the trust changed since `since` (read before the
    /// handshake), a change that ran while the handshake was verified may have looked for this
    /// connection before it was kept: it is checked again now, and closed if no longer trusted.
    /// Tracking comes first, so a change after this read finds it among the kept. Must run
    /// inside a tokio runtime.
    pub(crate) fn track(
        self: &Arc<Self>,
        conn: &Connection,
        side: Side,
        since: u64,
    ) -> Result<(), String> {
        let id = conn.stable_id();
        self.lock().insert(id, (conn.clone(), side));
        let me = Arc::downgrade(self);
        let watched = conn.clone();
        tokio::spawn(async move {
            watched.closed().await;
            if let Some(me) = me.upgrade() {
                me.lock().remove(&id);
                me.unshare(id);
            }
        });
        if self.live.generation() == since {
            return Ok(());
        }
        self.recheck(conn, side)
    }

    /// Checks `conn`'s peer certificate against the trust in force; closes it when refused,
    /// with one line naming the certificate as the reason.
    pub(crate) fn recheck(&self, conn: &Connection, side: Side) -> Result<(), String> {
        let Some(chain) = conn
            .peer_identity()
            .and_then(|id| id.downcast::<Vec<CertificateDer<'static>>>().ok())
        else {
            return Ok(());
        };
        let checked = crate::tls::recheck(&self.live, &chain, side == Side::Dialled);
        if let Err(reason) = &checked {
            close_untrusted(conn, reason);
        }
        checked
    }

    /// Offers `conn`, accepted from `principal` at `addr` (already tracked), for sends back to
    /// that peer. A newer connection of the same peer replaces an older one.
    pub(crate) fn share(&self, conn: &Connection, principal: &Principal, addr: SocketAddr) {
        let entry = SharedConn {
            conn: conn.clone(),
            principal: principal.clone(),
            cert: crate::serve::peer_cert(conn),
        };
        let mut shared = self.lock_shared();
        if let Some(&old) = shared.by_principal.get(principal) {
            shared.remove(old);
        }
        shared.remove(addr);
        shared.by_principal.insert(principal.clone(), addr);
        shared.by_id.insert(conn.stable_id(), addr);
        shared.by_addr.insert(addr, entry);
    }

    /// A live shared connection at `addr`, else one from `expect` (a host that dialled from
    /// another address than the one configured for it), once the peer granted stream credit on
    /// it. A closed one found is dropped.
    pub(crate) fn shared(
        &self,
        addr: SocketAddr,
        expect: Option<&Principal>,
    ) -> Option<SharedConn> {
        let mut shared = self.lock_shared();
        let at = match shared.by_addr.contains_key(&addr) {
            true => addr,
            false => *shared.by_principal.get(expect?)?,
        };
        let found = shared.by_addr.get(&at)?.clone();
        if found.conn.close_reason().is_some() {
            shared.remove(at);
            return None;
        }
        // A peer that dialled gives no stream credit at its handshake (decision 0282) and raises
        // it with MAX_STREAMS frames once it serves the connection; a release before 0316 never
        // does, and a send over its connection would wait for credit until its deadline. So
        // until both frames came, the send dials as before.
        let frames = found.conn.stats().frame_rx;
        let credited = frames.max_streams_bidi > 0 && frames.max_streams_uni > 0;
        credited.then_some(found)
    }

    /// Drops the shared entry of the connection `id`, if it still is the one shared.
    fn unshare(&self, id: usize) {
        let mut shared = self.lock_shared();
        if let Some(addr) = shared.by_id.get(&id).copied() {
            shared.remove(addr);
        }
    }

    fn lock_shared(&self) -> std::sync::MutexGuard<'_, Shared> {
        self.shared
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    pub(crate) fn all(&self) -> Vec<(Connection, Side)> {
        self.lock().values().cloned().collect()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<usize, (Connection, Side)>> {
        self.conns
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// Closes `conn` with `reason` (a refusal line) in the close frame, so both ends log it.
pub(crate) fn close_untrusted(conn: &Connection, reason: &str) {
    tracing::warn!(peer = %conn.remote_address(), %reason, "closed an open connection");
    conn.close(
        quinn::VarInt::from_u32(crate::serve::close_untrusted),
        reason.as_bytes(),
    );
}
