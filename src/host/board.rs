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
}

impl Default for Board {
    fn default() -> Self {
        Board::new()
    }
}

impl Board {
    pub fn new() -> Board {
        let (tx, _) = watch::channel(BTreeMap::new());
        Board { tx: Arc::new(tx) }
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
