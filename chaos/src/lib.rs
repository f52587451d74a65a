//! Chaos runs over the real controller, and the decoders' fuzzer.
//!
//! A run ([`run::run`]) starts three real replica services and three real host agents in one
//! process ([`bed`]), drives real operator requests ([`workload`]) while the [`nemesis`] plays a
//! seeded schedule of named faults, records what the real code did ([`observe`], [`history`]) and
//! checks it ([`checkers`]; [`linear`] is the register linearizability search). `cargo run --release -p mesh-chaos -- --runs N` runs many
//! (`main.rs`); `cargo run -p mesh-chaos -- fuzz` fuzzes the decoders ([`fuzz`]).

pub mod bed;
pub mod checkers;
pub mod fuzz;
pub mod history;
pub mod hostile;
pub mod linear;
pub mod nemesis;
pub mod observe;
pub mod rng;
pub mod run;
pub mod sim;
pub mod workload;

pub use checkers::{Final, Violation, check_all};
pub use history::{Event, History, Recorder};
pub use nemesis::{Fault, Mix, Schedule};
pub use run::{Outcome, RunSpec, run};
