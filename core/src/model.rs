//! The model an operator declares: machines, modules placed on them, and what they provide and need.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

use super::flat::FlatMap;
use super::settings::Settings;

/// Everything an operator declared, at one model revision.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Mesh {
    pub machines: BTreeMap<String, Machine>,
    /// Module names are unique across the mesh; each module is placed on exactly one machine.
    pub modules: BTreeMap<String, Module>,
    pub settings: Settings,
}

/// A host in the mesh, running `mesh-host`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Machine {
    pub name: String,
    /// Where other machines reach this one's provided endpoints (`127.0.0.1` in `meshctl dev`).
    pub address: String,
}

/// A unit that runs on one machine as a supervised process.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Module {
    pub name: String,
    pub machine: String,
    pub command: String,
    pub args: Vec<String>,
    pub env: FlatMap<String, String>,
    /// Relative path under the module's directory → content.
    pub files: FlatMap<String, String>,
    pub mounts: Vec<Mount>,
    pub ready: Option<Probe>,
    /// Modules on the same machine that must be ready before this one starts (G12).
    pub after: Vec<String>,
    pub provides: Vec<Provide>,
    pub consumes: Vec<Need>,
}

/// A host directory handed to a module: `host_dir` is absolute, `target` is relative to the module's
/// directory (a link there points at `host_dir`).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Mount {
    pub name: String,
    pub host_dir: String,
    pub target: String,
}

/// How a host decides a module is ready. Every probe has a timeout.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Probe {
    /// A TCP connect to `addr` (`host:port`) succeeds.
    Tcp { addr: String, timeout_ms: u64 },
    /// A file exists at `path`, relative to the module's directory.
    File { path: String, timeout_ms: u64 },
    /// A command exits 0.
    Command {
        command: String,
        args: Vec<String>,
        timeout_ms: u64,
    },
}

/// A kind of service a module offers, and the port it listens on (on its machine's address).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Provide {
    pub kind: String,
    pub port: Option<u16>,
}

/// A need for a kind of service from a named provider module (possibly on another machine).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Need {
    pub kind: String,
    pub from: String,
}

/// `module@machine`: one placement of a module.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Placement {
    pub module: String,
    pub machine: String,
}

impl std::fmt::Display for Placement {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}@{}", self.module, self.machine)
    }
}

/// A secret handed to a consumer, minted by the controller while composing the consumer's machine and
/// committed to the store before any send carries it. The core never generates the secret.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Provision {
    pub id: String,
    pub kind: String,
    pub consumer: Placement,
    pub provider: Placement,
    /// A name the provider can route by, e.g. a vhost.
    pub name: String,
    pub secret: String,
}
