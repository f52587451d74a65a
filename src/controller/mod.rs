//! The replica service: leader loop, lease gate use, push orchestration, forwarding and API handlers.
pub mod api;
pub mod certs;
pub mod config;
mod engine;
pub mod events;
pub mod fleet;
pub mod floor;
mod genesis;
pub mod http;
mod leadership;
mod logs;
pub mod members;
mod metrics;
mod ops;
mod page;
mod planview;
mod push;
mod readback;
pub mod recover;
pub mod relay;
mod reports;
pub mod restore;
pub mod roles;
pub mod service;
mod unproven;
mod upload;

pub use reports::{
    HeardView, report_refusal_shown_ms, reports_handled_per_host_max,
    reports_in_flight_per_host_max, silent_after_intervals, silent_after_ms_default,
    silent_after_ms_max, silent_after_ms_min, silent_for,
};
pub use service::{RaftRuntime, Running, Service, ServiceError, bind, start, start_in, start_on};
