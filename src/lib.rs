//! mesh: a declarative controller for a fleet of machines. `core` is the pure domain; `store`,
//! `controller`, `host` and `cli` are the shells that move bytes and call it.

pub mod build_info;
pub mod cli;
pub mod conn_metrics;
pub mod controller;
// The pure domain is its own crate (core/, decision 0130); `crate::core::…` paths name it.
pub use mesh_core as core;
pub mod durable;
pub mod exposition;
pub mod hex;
pub mod host;
pub mod limits;
pub mod logging;
pub mod process_metrics;
pub mod readonly_http;
pub mod store;
pub mod timefmt;
