//! Migration 0007: adds `revoked`, the deny list of certificates and principals (issue 15 part 5,
//! decision 0172): every replica refuses a revoked certificate at its next handshake, and the list
//! reaches hosts in their declarations.

use redb::WriteTransaction;

use crate::StepError;
use crate::tables;

pub(crate) const VERSION: u64 = 7;
pub(crate) const NAME: &str = "revoked";

pub(crate) fn step(txn: &WriteTransaction) -> Result<(), StepError> {
    txn.open_table(tables::REVOKED)?;
    Ok(())
}
