//! One copy of the setup that mesh's tests share (decision 0140): a mesh PKI in a temp dir
//! ([`pki`]), waiting on a condition with a deadline, sync and async ([`wait`]), the fast Raft
//! settings of the controller tests ([`raft`]), model and declaration fixtures ([`model`],
//! [`declared`]), loopback addresses ([`net`]) and guards that stop processes on drop
//! ([`process`]).
//!
//! This crate is for tests and harnesses only: it panics with a message naming what failed (a
//! failed setup fails the test), except the waits that return an error for harnesses that report
//! one ([`wait::poll_within`], [`wait::poll_blocking`]).
//!
//! It depends on mesh-transport, mesh-raft and mesh-core, never on the root `mesh` crate, so the
//! transport's and raft's own integration tests can use it; setup that needs `mesh` (a bed of
//! real binaries) lives in `mesh-beds`, which depends on this crate.

pub mod declared;
pub mod model;
pub mod net;
pub mod pki;
pub mod process;
pub mod raft;
pub mod wait;

pub use net::loopback;
pub use pki::{Pki, TlsFiles, host, operator, replica};
pub use process::{ChildGuard, GroupGuard, alive};
pub use raft::fast_raft;
pub use wait::{wait_deadline, wait_for, wait_until, wait_value};
