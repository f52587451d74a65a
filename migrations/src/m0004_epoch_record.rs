//! Migration 0004: `controller_epoch` values change from a bare `u64` to an [`EpochRecord`]
//! `{ epoch, raised_at_index }`.
//!
//! Why a real store needs it: G9 asks a restored cluster to start above every epoch used before. A bare
//! number cannot say *when* it was raised, so a restore from a backup cannot tell an operator whether the
//! backup already contains the entry that raised the floor or predates it (in which case hosts may hold
//! envelopes from epochs the backup never saw, and the operator must supply their reported epochs too).
//! Keeping the log index of the raising entry lets restore compare it with the snapshot's last index and
//! say so loudly. Epochs recorded before this migration get `raised_at_index: None` ("unknown").
//!
//! The redb way: redb checks a table's value type on open, so the values cannot be rewritten in place.
//! The step copies every row into a staging table of the new type, deletes the old table and renames the
//! staging table to `controller_epoch`, all in the one write transaction the runner commits.

use redb::{ReadableTable, TableDefinition, WriteTransaction};

use crate::StepError;
use crate::records::EpochRecord;
use crate::tables::{self, superseded};

pub(crate) const VERSION: u64 = 4;
pub(crate) const NAME: &str = "epoch_record";

const STAGING: TableDefinition<&str, &[u8]> = TableDefinition::new("controller_epoch_0004_staging");

pub(crate) fn step(txn: &WriteTransaction) -> Result<(), StepError> {
    let mut rows = Vec::new();
    {
        let old = txn.open_table(superseded::CONTROLLER_EPOCH_V2)?;
        for row in old.iter()? {
            let (key, epoch) = row?;
            rows.push((key.value().to_string(), epoch.value()));
        }
    }
    {
        let mut staging = txn.open_table(STAGING)?;
        for (key, epoch) in &rows {
            let record = EpochRecord {
                epoch: *epoch,
                raised_at_index: None,
            };
            staging.insert(key.as_str(), record.encode()?.as_slice())?;
        }
    }
    txn.delete_table(superseded::CONTROLLER_EPOCH_V2)?;
    txn.rename_table(STAGING, tables::CONTROLLER_EPOCH)?;
    Ok(())
}
