//! Fault injection (pause, partition, drop/delay/hold/replay), history recording and the checkers that read it.
//!
//! A chaos run ([`run::run`]) starts three in-process replicas over the fault router, drives clients,
//! leader actors and simulated hosts while the [`nemesis`] plays a seeded schedule of faults, records
//! everything in a [`history::History`], and checks it with the [`checkers`]. A failing run panics
//! with its seed; `CHAOS_SEED=<n>` replays it.

pub mod actors;
pub mod checkers;
pub mod fuzz;
pub mod history;
pub mod nemesis;
pub mod rng;
pub mod run;
pub mod sim;

pub use checkers::{Violation, check_all};
pub use history::{Event, History, Recorder};
pub use nemesis::{Mix, Schedule};
pub use run::{Outcome, RunSpec, run, try_run};
