//! A Raft log with a hole inside a read range is refused by the log store, naming both sides of
//! the hole (issue 11 part 6, decision 0200): openraft checks only the ends of a range it applies,
//! and a hole it applied as if absent panicked its core (`raft_core.rs:779`).

use std::sync::Arc;

use openraft::{CommittedLeaderId, EntryPayload, RaftLogReader};

use mesh_migrations::tables;
use mesh_raft::{Entry, LogId, LogStore};

fn entry(term: u64, index: u64) -> Entry {
    Entry {
        log_id: LogId::new(CommittedLeaderId::new(term, 1), index),
        payload: EntryPayload::Blank,
    }
}

#[tokio::test]
async fn g9_a_read_across_a_hole_in_the_log_is_refused_and_names_the_hole() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let db = Arc::new(mesh_migrations::open(&dir.path().join("store.redb"))?);
    {
        // The log a follower was left with: the bootstrap entry, then entries after a purged
        // stretch it never had.
        let txn = db.begin_write()?;
        {
            let mut log = txn.open_table(tables::RAFT_LOG)?;
            for e in [entry(0, 0), entry(2, 6), entry(2, 7)] {
                let bytes = mesh_codec::encode("raft log entry", &e)?;
                log.insert(e.log_id.index, bytes.as_slice())?;
            }
        }
        txn.commit()?;
    }
    let mut store = LogStore::new(db);
    let across = store.try_get_log_entries(0..8).await;
    let error = match across {
        Ok(entries) => anyhow::bail!("read across the hole gave {} entries", entries.len()),
        Err(e) => e.to_string(),
    };
    assert!(error.contains("entries 0 and 6"), "{error}");
    // Reads on either side of the hole still answer.
    assert_eq!(store.try_get_log_entries(6..8).await?.len(), 2);
    assert_eq!(store.try_get_log_entries(0..1).await?.len(), 1);
    Ok(())
}
