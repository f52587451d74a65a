//! Small record types owned by migrations (not by the domain), and their encoding through `mesh_codec`.

use serde::{Deserialize, Serialize};

use mesh_codec::CodecError;

/// The value of `controller_epoch` since schema 0004: the highest epoch (Raft term) ever used, and the
/// log index of the entry that raised it to this value.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct EpochRecord {
    /// The highest epoch ever used by a leader of this store.
    pub epoch: u64,
    /// Log index of the entry that recorded `epoch`; `None` for epochs recorded before schema 0004.
    pub raised_at_index: Option<u64>,
}

impl EpochRecord {
    /// Encodes the record as the bytes stored in `controller_epoch`.
    pub fn encode(&self) -> Result<Vec<u8>, CodecError> {
        mesh_codec::encode("controller_epoch record", self)
    }

    /// Decodes a record read from `controller_epoch`.
    pub fn decode(bytes: &[u8]) -> Result<Self, CodecError> {
        mesh_codec::decode("controller_epoch record", bytes)
    }
}
