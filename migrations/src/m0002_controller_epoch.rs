//! Migration 0002: adds `controller_epoch`, the highest term ever used (G9), as a bare `u64` per key.

use redb::WriteTransaction;

use crate::StepError;
use crate::tables::superseded;

pub(crate) const VERSION: u64 = 2;
pub(crate) const NAME: &str = "controller_epoch";

pub(crate) fn step(txn: &WriteTransaction) -> Result<(), StepError> {
    txn.open_table(superseded::CONTROLLER_EPOCH_V2)?;
    Ok(())
}
