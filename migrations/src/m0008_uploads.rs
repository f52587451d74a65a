//! Migration 0008: adds `uploads` and `upload_chunks`, the staging record of models uploaded in
//! chunks before one small commit makes them current (issue 10 item 2, decision 0185).

use redb::WriteTransaction;

use crate::StepError;
use crate::tables;

pub(crate) const VERSION: u64 = 8;
pub(crate) const NAME: &str = "uploads";

pub(crate) fn step(txn: &WriteTransaction) -> Result<(), StepError> {
    txn.open_table(tables::UPLOADS)?;
    txn.open_table(tables::UPLOAD_CHUNKS)?;
    Ok(())
}
