//! Migration 0001: creates the Raft tables (`raft_log`, `raft_state`, `sm_state`) and the domain tables.

use redb::WriteTransaction;

use crate::StepError;
use crate::tables;

pub(crate) const VERSION: u64 = 1;
pub(crate) const NAME: &str = "initial";

/// Opening a table in a write transaction creates it; nothing else is written.
pub(crate) fn step(txn: &WriteTransaction) -> Result<(), StepError> {
    txn.open_table(tables::RAFT_LOG)?;
    txn.open_table(tables::RAFT_STATE)?;
    txn.open_table(tables::SM_STATE)?;
    txn.open_table(tables::MODEL)?;
    txn.open_table(tables::SETTINGS_LAYERS)?;
    txn.open_table(tables::PROVISIONS)?;
    txn.open_table(tables::SENDS)?;
    txn.open_table(tables::ACCOUNTS)?;
    txn.open_table(tables::HOLDS)?;
    Ok(())
}
