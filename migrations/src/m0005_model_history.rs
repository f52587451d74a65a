//! Migration 0005: adds `model_history`, where every model apply is kept with its revision, why,
//! who, and which machines' should-be it changed (issue 9: `history` shows model applies too).

use redb::WriteTransaction;

use crate::StepError;
use crate::tables;

pub(crate) const VERSION: u64 = 5;
pub(crate) const NAME: &str = "model_history";

pub(crate) fn step(txn: &WriteTransaction) -> Result<(), StepError> {
    txn.open_table(tables::MODEL_HISTORY)?;
    Ok(())
}
