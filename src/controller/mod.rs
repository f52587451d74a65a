//! The replica service: leader loop, lease gate use, push orchestration, forwarding and API handlers.
pub mod api;
pub mod certs;
pub mod config;
mod engine;
pub mod events;
pub mod fleet;
pub mod floor;
mod forwarding;
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

/// What a sans-I/O core may not name (decisions 0160, 0321): a clock read, an await, a socket, a
/// file, a thread, a process, a random draw or a log line would put a decision back into the
/// shell's world. One list for every core's purity test.
#[cfg(test)]
pub(crate) mod purity {
    pub(crate) const outside_a_core: [&str; 12] = [
        "tokio::",
        "Instant::now",
        "SystemTime",
        "std::fs",
        "std::net",
        "std::thread",
        "std::process",
        "getrandom",
        "rand::",
        ".await",
        "async fn",
        "tracing::",
    ];

    /// Fails naming the file and the word when a source names any of `outside_a_core` or `more`.
    pub(crate) fn assert_names_none(sources: &[(&str, &str)], more: &[&str]) {
        for (file, source) in sources {
            for word in outside_a_core.iter().chain(more) {
                assert!(!source.contains(word), "{file} names {word}");
            }
        }
    }
}
