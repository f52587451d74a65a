//! Migration 0006: adds `requests`, the outcomes of recent operator requests by their id, so a
//! request retried after a lost answer is answered with its first outcome instead of running again
//! (issue 10 item 4, decision 0180).

use redb::WriteTransaction;

use crate::StepError;
use crate::tables;

pub(crate) const VERSION: u64 = 6;
pub(crate) const NAME: &str = "requests";

pub(crate) fn step(txn: &WriteTransaction) -> Result<(), StepError> {
    txn.open_table(tables::REQUESTS)?;
    Ok(())
}
