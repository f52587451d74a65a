//! openraft's storage conformance suite run against the redb log store and state-machine host.

use std::sync::Arc;

use openraft::StorageError;
use openraft::testing::{StoreBuilder, Suite};
use tempfile::TempDir;

use mesh_raft::kv::KvApp;
use mesh_raft::{LogStore, NodeId, StateMachine, TypeConfig};

struct RedbBuilder;

impl StoreBuilder<TypeConfig, LogStore, StateMachine<KvApp>, TempDir> for RedbBuilder {
    async fn build(
        &self,
    ) -> Result<(TempDir, LogStore, StateMachine<KvApp>), StorageError<NodeId>> {
        let dir = tempfile::tempdir().expect("tempdir");
        let db = mesh_migrations::open(&dir.path().join("store.redb")).expect("open store");
        let db = Arc::new(db);
        Ok((
            dir,
            LogStore::new(db.clone()),
            StateMachine::new(db, Arc::new(KvApp)),
        ))
    }
}

#[test]
fn redb_store_passes_the_openraft_storage_conformance_suite() {
    // Storage correctness: vote, append, truncate, purge, applied state and snapshot transfer behave
    // as openraft requires (openraft::testing::Suite::test_all).
    Suite::test_all(RedbBuilder).expect("conformance suite");
}
