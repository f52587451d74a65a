//! Migration 0010: `requests` rows keyed by the order they were remembered in, then the request id
//! ([`tables::request_key`]), instead of by the id alone. Ids are random, so every remembered and
//! every forgotten request dirtied a page anywhere in the table and the next commit wrote it; in
//! order, new rows land on the last page and forgotten ones leave the first (decision 0250).

use redb::{ReadableTable, WriteTransaction};

use crate::StepError;
use crate::tables;

pub(crate) const VERSION: u64 = 10;
pub(crate) const NAME: &str = "requests_in_order";

/// Rows the step reads at once: the domain keeps at most 10,000, so this holds a whole table.
const rows_max: usize = 100_000;

pub(crate) fn step(txn: &WriteTransaction) -> Result<(), StepError> {
    let mut t = txn.open_table(tables::REQUESTS)?;
    let mut old = Vec::new();
    for row in t.iter()? {
        let (k, v) = row?;
        if old.len() == rows_max {
            return Err(StepError::Refused(format!(
                "requests holds more than {rows_max} rows; the domain keeps at most 10,000, so this is not a mesh store's table"
            )));
        }
        old.push((k.value().to_vec(), v.value().to_vec()));
    }
    for (k, v) in old {
        let id: [u8; 16] = k.as_slice().try_into().map_err(|_| {
            StepError::Refused(format!(
                "a requests row has a {}-byte key where schema 0009 keeps 16-byte request ids",
                k.len()
            ))
        })?;
        // The value is the domain's record, whose first field is the order it was remembered in.
        let order: u64 = mesh_codec::decode_prefix("remembered request order", &v)?;
        t.remove(k.as_slice())?;
        t.insert(tables::request_key(order, &id).as_slice(), v.as_slice())?;
    }
    Ok(())
}
