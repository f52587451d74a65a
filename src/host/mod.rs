//! The mesh-host agent: envelope validator, supervised process runtime and reporter.
//!
//! Two seams face the transport: [`Agent::receive`] takes the exact envelope bytes a replica sent,
//! and [`ReportSink`] carries reports back to the controllers.

pub mod agent;
pub mod board;
pub mod config;
pub mod durable;
pub mod layout;
pub mod leftovers;
pub mod logs;
pub mod probe;
pub mod reporter;
pub mod runtime;
pub mod state;
pub mod supervise;
pub mod validate;

pub use agent::{Agent, Applied, HostError};
pub use config::{ConfigError, HostConfig};
pub use reporter::{ReportSink, SinkError, SinkFuture, declaration_digest};
pub use runtime::ApplyOutcome;
