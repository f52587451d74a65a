//! The status board: every module's current state, in one watch channel. Supervisors write their
//! own entry; dependents wait on it for readiness (G12); reports read it. Each supervisor writes
//! under a generation, so a stopped supervisor can never overwrite its successor's entry.

use std::collections::BTreeMap;
use std::sync::Arc;
use tokio::sync::watch;

use crate::core::report::{ModuleState, ModuleStatus};

/// One module's entry, stamped with the generation of the supervisor that owns it.
#[derive(Clone, Debug)]
pub struct Entry {
    pub generation: u64,
    pub status: ModuleStatus,
}

/// Shared, cheaply cloned handle on the board.
#[derive(Clone, Debug)]
pub struct Board {
    tx: Arc<watch::Sender<BTreeMap<String, Entry>>>,
    /// Restarts of every module since this host started: unlike a module's own `restarts`, which
    /// starts again at 0 with each supervisor, it only grows (`/metrics`,
    /// `mesh_host_module_restarts_total`, decision 0313).
    restarts: prometheus_client::metrics::counter::Counter,
}

impl Default for Board {
    fn default() -> Self {
        Board::new()
    }
}

impl Board {
    pub fn new() -> Board {
        let (tx, _) = watch::channel(BTreeMap::new());
        Board {
            tx: Arc::new(tx),
            restarts: Default::default(),
        }
    }

    /// Counts a restart of `name` by the supervisor of `generation`, if it still owns the entry:
    /// in the module's own count and in the host's, which never goes back.
    pub fn restarted(&self, name: &str, generation: u64) {
        let mut counted = false;
        self.tx.send_if_modified(|board| match board.get_mut(name) {
            Some(entry) if entry.generation == generation => {
                entry.status.restarts = entry.status.restarts.saturating_add(1);
                counted = true;
                true
            }
            _ => false,
        });
        if counted {
            self.restarts.inc();
        }
    }

    /// Restarts of every module since this host started (a clone of the counter, for `/metrics`).
    pub fn restarts_total(&self) -> prometheus_client::metrics::counter::Counter {
        self.restarts.clone()
    }

    /// Claims `name` for a new supervisor generation, in state `Starting`.
    pub fn claim(&self, name: &str, generation: u64) {
        self.tx.send_modify(|board| {
            board.insert(
                name.to_string(),
                Entry {
                    generation,
                    status: ModuleStatus {
                        name: name.to_string(),
                        state: ModuleState::Starting,
                        restarts: 0,
                        pid: None,
                        last_exit: None,
                        drift: Vec::new(),
                    },
                },
            );
        });
    }

    /// Changes `name`'s entry if `generation` still owns it.
    pub fn update(&self, name: &str, generation: u64, change: impl FnOnce(&mut ModuleStatus)) {
        self.tx.send_if_modified(|board| match board.get_mut(name) {
            Some(entry) if entry.generation == generation => {
                let before = entry.status.clone();
                change(&mut entry.status);
                entry.status != before
            }
            _ => false,
        });
    }

    /// Drops `name`'s entry whoever owns it: for a module that is gone and whose supervisor ended.
    pub fn release_any(&self, name: &str) {
        self.tx
            .send_if_modified(|board| board.remove(name).is_some());
    }

    /// Every module's status, sorted by name.
    pub fn snapshot(&self) -> Vec<ModuleStatus> {
        self.tx
            .borrow()
            .values()
            .map(|e| e.status.clone())
            .collect()
    }

    /// Process groups of every module with a live process, for a last-resort kill.
    pub fn pids(&self) -> Vec<u32> {
        self.tx
            .borrow()
            .values()
            .filter_map(|e| e.status.pid)
            .collect()
    }

    pub fn subscribe(&self) -> watch::Receiver<BTreeMap<String, Entry>> {
        self.tx.subscribe()
    }
}

/// True when `name` is on the board and ready.
pub fn is_ready(board: &BTreeMap<String, Entry>, name: &str) -> bool {
    board
        .get(name)
        .is_some_and(|e| e.status.state == ModuleState::Ready)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_hosts_restart_count_only_grows_when_a_new_supervisor_claims_a_module() {
        // Issue 25 item 6, decision 0313: a module's own count starts again with each supervisor
        // (a declaration that changes it), the host's restarts total never goes back; a
        // supervisor that lost its entry counts nothing.
        let board = Board::new();
        board.claim("web", 1);
        board.restarted("web", 1);
        board.restarted("web", 1);
        assert_eq!(board.snapshot()[0].restarts, 2);
        board.claim("web", 2);
        assert_eq!(
            board.snapshot()[0].restarts,
            0,
            "the new supervisor's own count"
        );
        board.restarted("web", 1);
        assert_eq!(
            board.restarts_total().get(),
            2,
            "the old supervisor counts nothing"
        );
        board.restarted("web", 2);
        assert_eq!(board.snapshot()[0].restarts, 1);
        assert_eq!(board.restarts_total().get(), 3);
    }
}
