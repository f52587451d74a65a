//! Migration 0009: adds `signers`, the envelope keys of replicas added to a running cluster with
//! `meshctl replicas add` (issue 12 part 4, decision 0230): every declaration carries them, so a
//! host trusts a new replica's key before that replica can lead.

use redb::WriteTransaction;

use crate::StepError;
use crate::tables;

pub(crate) const VERSION: u64 = 9;
pub(crate) const NAME: &str = "signers";

pub(crate) fn step(txn: &WriteTransaction) -> Result<(), StepError> {
    txn.open_table(tables::SIGNERS)?;
    Ok(())
}
