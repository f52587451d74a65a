//! Domain tables over redb and the Raft state machine's apply of domain commands.
//!
//! `state` holds the pure apply ([`state::DomainState::apply`]); `app` writes what it changed into the
//! replica's redb tables in the same transaction as Raft's applied index, and builds and installs
//! snapshots.

pub mod app;
pub mod command;
pub mod revoked;
pub mod settings_history;
pub mod signers;
pub mod staging;
pub mod state;
