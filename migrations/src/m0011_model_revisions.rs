//! Migration 0011: adds `model_revisions`, the model of each recent model revision (issue 25 item 1,
//! decision 0302), so `meshctl model show --revision N` and `meshctl rollback` can read an older
//! model back. Revisions applied before this migration were never kept: the table starts empty.

use redb::WriteTransaction;

use crate::StepError;
use crate::tables;

pub(crate) const VERSION: u64 = 11;
pub(crate) const NAME: &str = "model_revisions";

pub(crate) fn step(txn: &WriteTransaction) -> Result<(), StepError> {
    txn.open_table(tables::MODEL_REVISIONS)?;
    Ok(())
}
