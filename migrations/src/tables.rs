//! Every redb table mesh keeps: name, key type and value type, with the schema version that introduced it.
//!
//! Domain values are opaque bytes encoded by their owner through `mesh_codec`; this file fixes only the
//! table names and the key/value types redb checks. Record types owned by migrations live in [`crate::records`].

use redb::TableDefinition;

/// Schema bookkeeping (since 0001). Holds [`SCHEMA_VERSION_KEY`].
pub const META: TableDefinition<&str, u64> = TableDefinition::new("meta");
/// Key in [`META`] holding the version of the last migration applied.
pub const SCHEMA_VERSION_KEY: &str = "schema_version";

/// The Raft log (since 0001): log index → encoded openraft entry.
pub const RAFT_LOG: TableDefinition<u64, &[u8]> = TableDefinition::new("raft_log");

/// Raft log-store state (since 0001): one of the `RAFT_STATE_*` keys → encoded value.
pub const RAFT_STATE: TableDefinition<&str, &[u8]> = TableDefinition::new("raft_state");
/// Key in [`RAFT_STATE`]: the vote (term, voted-for, committed flag).
pub const RAFT_STATE_VOTE: &str = "vote";
/// Key in [`RAFT_STATE`]: the id of the last log entry purged.
pub const RAFT_STATE_LAST_PURGED: &str = "last_purged";
/// Key in [`RAFT_STATE`]: the id of the last entry known committed.
pub const RAFT_STATE_COMMITTED: &str = "committed";

/// State-machine bookkeeping (since 0001), written in the same transaction as the applied effects.
pub const SM_STATE: TableDefinition<&str, &[u8]> = TableDefinition::new("sm_state");
/// Key in [`SM_STATE`]: the id of the last entry applied.
pub const SM_STATE_LAST_APPLIED: &str = "last_applied";
/// Key in [`SM_STATE`]: the last membership applied, with its log id.
pub const SM_STATE_LAST_MEMBERSHIP: &str = "last_membership";

/// Domain (since 0001): the model, by key.
pub const MODEL: TableDefinition<&str, &[u8]> = TableDefinition::new("model");
/// Domain (since 0001): settings layers, by scope (`mesh`, `machine/<m>`, `module/<mod>`, `module/<mod>@<m>`).
/// Since 0012 a row only says the layer exists (an empty value); its keys are in [`SETTINGS_VALUES`].
/// Before, the value was the whole encoded layer.
pub const SETTINGS_LAYERS: TableDefinition<&str, &[u8]> = TableDefinition::new("settings_layers");
/// Domain (since 0001): provisions, by id.
pub const PROVISIONS: TableDefinition<&str, &[u8]> = TableDefinition::new("provisions");
/// Domain (since 0001): send records, by (machine, sequence).
pub const SENDS: TableDefinition<(&str, u64), &[u8]> = TableDefinition::new("sends");
/// Domain (since 0001): accounts, by machine.
pub const ACCOUNTS: TableDefinition<&str, &[u8]> = TableDefinition::new("accounts");
/// Domain (since 0001): holds, by machine.
pub const HOLDS: TableDefinition<&str, &[u8]> = TableDefinition::new("holds");

/// The highest epoch ever used (since 0002, values reshaped by 0004): key → encoded
/// [`crate::records::EpochRecord`]. Use [`CONTROLLER_EPOCH_KEY`].
pub const CONTROLLER_EPOCH: TableDefinition<&str, &[u8]> = TableDefinition::new("controller_epoch");
/// The one key in [`CONTROLLER_EPOCH`].
pub const CONTROLLER_EPOCH_KEY: &str = "highest";

/// Settings writes (since 0003): history id → encoded domain record. Since 0012 the record holds
/// only the keys the write changed, before and after each (decision 0317); before, the whole
/// layer before and after.
pub const SETTINGS_HISTORY: TableDefinition<u64, &[u8]> = TableDefinition::new("settings_history");

/// Model applies (since 0005): revision → encoded domain record (why, who, when, machines changed).
pub const MODEL_HISTORY: TableDefinition<u64, &[u8]> = TableDefinition::new("model_history");

/// Recent operator requests (since 0006): [`request_key`] (since 0010; the request id alone
/// before) → encoded domain record (the order it was remembered in and its first outcome), bounded
/// by the domain's limit.
pub const REQUESTS: TableDefinition<&[u8], &[u8]> = TableDefinition::new("requests");

/// The key of a `requests` row: the order the request was remembered in (big-endian, so rows sort
/// by it) and its 16-byte id.
pub fn request_key(order: u64, id: &[u8; 16]) -> [u8; 24] {
    let mut key = [0u8; 24];
    key[..8].copy_from_slice(&order.to_be_bytes());
    key[8..].copy_from_slice(id);
    key
}

/// The request id in a `requests` key, or `None` when the key is not [`request_key`]'s shape.
pub fn request_id_of(key: &[u8]) -> Option<[u8; 16]> {
    if key.len() != 24 {
        return None;
    }
    key[8..].try_into().ok()
}

/// The deny list (since 0007): entry key (`serial:<hex>` or `principal:<kind>:<name>`) → encoded
/// domain record (what, why, who, when), bounded by the domain's limit.
pub const REVOKED: TableDefinition<&str, &[u8]> = TableDefinition::new("revoked");

/// Models being uploaded in chunks (since 0008): upload id (16 bytes) → encoded domain record (who
/// started it, chunks and bytes announced, when a chunk last arrived), bounded by the domain's limits.
pub const UPLOADS: TableDefinition<&[u8], &[u8]> = TableDefinition::new("uploads");

/// The chunks of those uploads (since 0008): (upload id, chunk index) → the chunk's bytes as sent
/// (a slice of the encoded model, not encoded again).
pub const UPLOAD_CHUNKS: TableDefinition<(&[u8], u32), &[u8]> =
    TableDefinition::new("upload_chunks");

/// Envelope keys of replicas added to a running cluster (since 0009): replica id → its 32-byte
/// ed25519 verifying key, at most one per replica the cluster may have.
pub const SIGNERS: TableDefinition<u64, &[u8]> = TableDefinition::new("signers");

/// The model of each kept model revision (since 0011): revision → the encoded model as the
/// `model` table holds it (machines and modules; settings live in their layers), the newest kept
/// within the domain's count and byte limits (decision 0302).
pub const MODEL_REVISIONS: TableDefinition<u64, &[u8]> = TableDefinition::new("model_revisions");

/// The keys of settings layers (since 0012): (scope as in [`SETTINGS_LAYERS`], key) → the value's
/// UTF-8 bytes, so a write rewrites the keys it changes, not its whole layer (decision 0317).
pub const SETTINGS_VALUES: TableDefinition<(&str, &str), &[u8]> =
    TableDefinition::new("settings_values");

/// Table shapes that a later migration replaced. Only migrations and fixture tests use them.
pub mod superseded {
    use redb::TableDefinition;

    /// `controller_epoch` as 0002 made it: key → bare epoch. Replaced by 0004.
    pub const CONTROLLER_EPOCH_V2: TableDefinition<&str, u64> =
        TableDefinition::new("controller_epoch");
}

/// Every current table with the schema version that introduced it, for checks and tooling.
pub const CATALOGUE: &[(&str, u64)] = &[
    ("meta", 1),
    ("raft_log", 1),
    ("raft_state", 1),
    ("sm_state", 1),
    ("model", 1),
    ("settings_layers", 1),
    ("provisions", 1),
    ("sends", 1),
    ("accounts", 1),
    ("holds", 1),
    ("controller_epoch", 2),
    ("settings_history", 3),
    ("model_history", 5),
    ("requests", 6),
    ("revoked", 7),
    ("uploads", 8),
    ("upload_chunks", 8),
    ("signers", 9),
    ("model_revisions", 11),
    ("settings_values", 12),
];
