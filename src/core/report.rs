//! Reports from hosts, and the account the controller keeps per machine from them (G5).

use serde::{Deserialize, Serialize};

use super::declaration::Digest;

/// What a host says after an apply or on its reconcile interval.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Report {
    pub machine: String,
    /// The envelope last applied: its epoch and sequence (0, 0 before any).
    pub epoch: u64,
    pub sequence: u64,
    /// The host's own persisted counter, strictly increasing across restarts.
    pub report_sequence: u64,
    pub applied: Option<Digest>,
    pub modules: Vec<ModuleStatus>,
    pub refused_older: u64,
    pub last_refusal: Option<String>,
}

/// One module's state on its host.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ModuleStatus {
    pub name: String,
    pub state: ModuleState,
    pub restarts: u32,
    pub pid: Option<u32>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ModuleState {
    Starting,
    /// Waiting for a module in `after`, or a provider's endpoint; says which.
    Waiting {
        on: String,
    },
    Ready,
    Running,
    Failed {
        error: String,
    },
    Stopped,
}
