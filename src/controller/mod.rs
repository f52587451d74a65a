//! The replica service: leader loop, lease gate use, push orchestration, forwarding and API handlers.
pub mod api;
pub mod config;
