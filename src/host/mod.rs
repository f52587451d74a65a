//! The mesh-host agent: envelope validator, supervised process runtime and reporter.
//!
//! Two seams face the transport: [`Agent::receive`] takes the exact envelope bytes a replica sent
//! (served over QUIC by [`listener`]), and [`ReportSink`] carries reports back to the controllers
//! ([`QuicSink`] over QUIC).

pub mod agent;
pub mod board;
pub mod config;
pub mod drift;
/// Durable small files; shared with the controller's floor file, so it lives at the crate root.
pub use crate::durable;
pub mod layout;
pub mod leftovers;
pub mod listener;
pub mod logs;
pub mod metrics;
pub mod probe;
pub mod reporter;
pub mod runtime;
pub mod sink;
pub mod state;
pub mod supervise;
pub mod validate;

pub use agent::{Agent, Applied, HostError};
pub use config::{ConfigError, HostConfig};
pub use reporter::{ReportSink, SinkError, SinkFuture};
pub use runtime::ApplyOutcome;
pub use sink::QuicSink;
