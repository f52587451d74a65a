//! The pure domain. No I/O, no clock, no async, no randomness: every input is an argument and every
//! outcome is a returned value, so each guarantee can be tested without a socket.

pub mod compose;
pub mod declaration;
pub mod envelope;
pub mod flat;
pub mod layer_delta;
pub mod meshdiff;
pub mod meshfile;
pub mod meshwrite;
pub mod model;
pub mod plan;
pub mod report;
pub mod settings;
pub mod summary;
pub mod validate;
pub mod wire;
