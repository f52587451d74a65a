//! Every open connection of an endpoint, served or dialled, so a reload or a new deny list can
//! check each one's peer certificate again and close those no longer trusted (decision 0172).
//! A connection whose handshake ran while the trust changed is checked again as it is tracked
//! (decision 0297). Bounded by the serving limit and the peer limit: an entry leaves when its
//! connection closes.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use quinn::Connection;
use rustls::pki_types::CertificateDer;

use crate::trust::Live;

/// Whether this side dialled the connection (the peer serves) or accepted it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Side {
    Dialled,
    Accepted,
}

pub(crate) struct OpenConns {
    conns: Mutex<HashMap<usize, (Connection, Side)>>,
    live: Arc<Live>,
}

impl OpenConns {
    pub(crate) fn new(live: Arc<Live>) -> OpenConns {
        OpenConns {
            conns: Mutex::new(HashMap::new()),
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
