//! Every open connection of an endpoint, served or dialled, so a reload or a new deny list can
//! check each one's peer certificate again and close those no longer trusted (decision 0172).
//! Bounded by the serving limit and the peer limit: an entry leaves when its connection closes.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use quinn::Connection;

/// Whether this side dialled the connection (the peer serves) or accepted it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Side {
    Dialled,
    Accepted,
}

#[derive(Default)]
pub(crate) struct OpenConns {
    conns: Mutex<HashMap<usize, (Connection, Side)>>,
}

impl OpenConns {
    /// Keeps `conn` until it closes. Must run inside a tokio runtime.
    pub(crate) fn track(self: &Arc<Self>, conn: &Connection, side: Side) {
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
