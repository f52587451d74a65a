//! A small key/value [`App`] for tests, benchmarks and chaos runs: commands set a key, state lives in the
//! `model` table (the raft crate knows no domain; this app only borrows a table to have one).

use redb::{ReadTransaction, ReadableTable, WriteTransaction};
use serde::{Deserialize, Serialize};

use mesh_migrations::tables;

use crate::state_machine::{App, AppError, EntryAt};

/// Sets `key` to `value`; the answer is the previous value.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Set {
    pub key: String,
    pub value: Vec<u8>,
}

impl Set {
    /// Encodes the command as proposal bytes.
    pub fn encode(&self) -> Result<Vec<u8>, mesh_codec::CodecError> {
        mesh_codec::encode("kv set", self)
    }
}

/// The answer to a [`Set`]: the value before it, if any.
pub type Previous = Option<Vec<u8>>;

/// Decodes an answer from [`KvApp`].
pub fn decode_previous(bytes: &[u8]) -> Result<Previous, mesh_codec::CodecError> {
    mesh_codec::decode("kv previous value", bytes)
}

/// The key/value app. Stateless: everything is in the table.
#[derive(Clone, Copy, Debug, Default)]
pub struct KvApp;

/// Reads one key through any read view of a replica's database.
pub fn read(txn: &ReadTransaction, key: &str) -> Result<Option<Vec<u8>>, AppError> {
    let table = txn.open_table(tables::MODEL)?;
    Ok(table.get(key)?.map(|v| v.value().to_vec()))
}

impl App for KvApp {
    fn apply(
        &self,
        txn: &WriteTransaction,
        _at: EntryAt,
        command: Option<&[u8]>,
    ) -> Result<Vec<u8>, AppError> {
        let Some(bytes) = command else {
            return Ok(Vec::new());
        };
        let set: Set = mesh_codec::decode("kv set", bytes)?;
        let mut table = txn.open_table(tables::MODEL)?;
        let previous: Previous = table
            .insert(set.key.as_str(), set.value.as_slice())?
            .map(|v| v.value().to_vec());
        Ok(mesh_codec::encode("kv previous value", &previous)?)
    }

    fn snapshot(&self, txn: &ReadTransaction) -> Result<Vec<u8>, AppError> {
        let table = txn.open_table(tables::MODEL)?;
        let mut rows: Vec<(String, Vec<u8>)> = Vec::new();
        for row in table.iter()? {
            let (k, v) = row?;
            rows.push((k.value().to_string(), v.value().to_vec()));
        }
        Ok(mesh_codec::encode("kv snapshot", &rows)?)
    }

    fn install(&self, txn: &WriteTransaction, snapshot: &[u8]) -> Result<(), AppError> {
        let rows: Vec<(String, Vec<u8>)> = mesh_codec::decode("kv snapshot", snapshot)?;
        let mut table = txn.open_table(tables::MODEL)?;
        table.retain(|_, _| false)?;
        for (k, v) in &rows {
            table.insert(k.as_str(), v.as_slice())?;
        }
        Ok(())
    }
}
