//! Migration 0003: adds `settings_history`, where a replaced or cleared settings layer is kept (G6).

use redb::WriteTransaction;

use crate::StepError;
use crate::tables;

pub(crate) const VERSION: u64 = 3;
pub(crate) const NAME: &str = "settings_history";

pub(crate) fn step(txn: &WriteTransaction) -> Result<(), StepError> {
    txn.open_table(tables::SETTINGS_HISTORY)?;
    Ok(())
}
