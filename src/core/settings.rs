//! Settings layers: one key/value map per scope; the effective value is the latest scope that sets it.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Where a settings layer applies. Order of precedence (later wins): mesh, machine, module, placement.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum Scope {
    /// `mesh`
    Mesh,
    /// `machine/<m>`
    Machine(String),
    /// `module/<mod>`
    Module(String),
    /// `module/<mod>@<m>`
    Placement { module: String, machine: String },
}

/// One layer's keys and values.
pub type Layer = BTreeMap<String, String>;

/// Every settings layer of the mesh.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Settings {
    pub layers: BTreeMap<Scope, Layer>,
}
