//! Tests of the migration runner: ordering, fixtures at every older version, refusal of newer stores,
//! and atomicity of a failed step.

use std::path::{Path, PathBuf};

use redb::{Database, ReadableDatabase, ReadableTableMetadata, TableDefinition};

use crate::m0012_settings_deltas as m12;
use crate::records::EpochRecord;
use crate::tables::{self, superseded};
use crate::{MIGRATIONS, Migration, MigrationError, StepError, open, open_with, schema_version};

const rows_per_table: u64 = 5;

fn store_path(dir: &tempfile::TempDir) -> PathBuf {
    dir.path().join("store.redb")
}

fn bytes(table: &str, i: u64) -> Vec<u8> {
    format!("{table}-value-{i}").into_bytes()
}

/// A `requests` value as the domain writes it: the order it was remembered in first (counting
/// down, so the order of rows by id and by order differ), then the rest of the record.
fn request_value(i: u64) -> Vec<u8> {
    mesh_codec::encode(
        "fixture request",
        &(rows_per_table - i, bytes("requests", i)),
    )
    .expect("encode fixture request")
}

fn fill_str_table(db: &Database, def: TableDefinition<&str, &[u8]>, name: &str) {
    let txn = db.begin_write().expect("begin write");
    {
        let mut t = txn.open_table(def).expect("open table");
        for i in 0..rows_per_table {
            t.insert(format!("{name}-{i}").as_str(), bytes(name, i).as_slice())
                .expect("insert");
        }
    }
    txn.commit().expect("commit");
}

fn fill_u64_table(db: &Database, def: TableDefinition<u64, &[u8]>, name: &str) {
    let txn = db.begin_write().expect("begin write");
    {
        let mut t = txn.open_table(def).expect("open table");
        for i in 0..rows_per_table {
            t.insert(i, bytes(name, i).as_slice()).expect("insert");
        }
    }
    txn.commit().expect("commit");
}

fn str_tables() -> Vec<(
    TableDefinition<'static, &'static str, &'static [u8]>,
    &'static str,
)> {
    vec![
        (tables::RAFT_STATE, "raft_state"),
        (tables::SM_STATE, "sm_state"),
        (tables::MODEL, "model"),
        (tables::PROVISIONS, "provisions"),
        (tables::ACCOUNTS, "accounts"),
        (tables::HOLDS, "holds"),
    ]
}

/// Writes rows into every table that exists at `version`.
fn write_fixture_rows(db: &Database, version: u64) {
    fill_u64_table(db, tables::RAFT_LOG, "raft_log");
    for (def, name) in str_tables() {
        fill_str_table(db, def, name);
    }
    let txn = db.begin_write().expect("begin write");
    {
        let mut sends = txn.open_table(tables::SENDS).expect("open sends");
        for i in 0..rows_per_table {
            sends
                .insert(("ace", i), bytes("sends", i).as_slice())
                .expect("insert send");
        }
    }
    txn.commit().expect("commit");
    if (2..4).contains(&version) {
        let txn = db.begin_write().expect("begin write");
        {
            let mut epochs = txn
                .open_table(superseded::CONTROLLER_EPOCH_V2)
                .expect("open controller_epoch v2");
            epochs
                .insert(tables::CONTROLLER_EPOCH_KEY, 41)
                .expect("insert epoch");
            epochs.insert("other", 7).expect("insert epoch");
        }
        txn.commit().expect("commit");
    }
    if version >= 4 {
        let txn = db.begin_write().expect("begin write");
        {
            let mut epochs = txn
                .open_table(tables::CONTROLLER_EPOCH)
                .expect("open controller_epoch");
            for (key, epoch) in [(tables::CONTROLLER_EPOCH_KEY, 41), ("other", 7)] {
                let record = EpochRecord {
                    epoch,
                    raised_at_index: None,
                };
                let bytes = record.encode().expect("encode record");
                epochs.insert(key, bytes.as_slice()).expect("insert epoch");
            }
        }
        txn.commit().expect("commit");
    }
    write_settings_fixture(db, version);
    if version >= 5 {
        fill_u64_table(db, tables::MODEL_HISTORY, "model_history");
    }
    if version >= 6 {
        let txn = db.begin_write().expect("begin write");
        {
            let mut t = txn.open_table(tables::REQUESTS).expect("open requests");
            for i in 0..rows_per_table {
                let id = [i as u8; 16];
                // A store at 0010 or later already keys each row by its order, then its id.
                let key = match version {
                    10.. => tables::request_key(rows_per_table - i, &id).to_vec(),
                    _ => id.to_vec(),
                };
                t.insert(key.as_slice(), request_value(i).as_slice())
                    .expect("insert request");
            }
        }
        txn.commit().expect("commit");
    }
}

fn check_str_table(db: &Database, def: TableDefinition<&str, &[u8]>, name: &str) {
    let txn = db.begin_read().expect("begin read");
    let t = txn.open_table(def).expect("open table");
    assert_eq!(t.len().expect("len"), rows_per_table, "{name} lost rows");
    for i in 0..rows_per_table {
        let got = t
            .get(format!("{name}-{i}").as_str())
            .expect("get")
            .expect("row present");
        assert_eq!(got.value(), bytes(name, i).as_slice(), "{name} row {i}");
    }
}

fn check_u64_table(db: &Database, def: TableDefinition<u64, &[u8]>, name: &str) {
    let txn = db.begin_read().expect("begin read");
    let t = txn.open_table(def).expect("open table");
    assert_eq!(t.len().expect("len"), rows_per_table, "{name} lost rows");
    for i in 0..rows_per_table {
        let got = t.get(i).expect("get").expect("row present");
        assert_eq!(got.value(), bytes(name, i).as_slice(), "{name} row {i}");
    }
}

fn check_fixture_rows(db: &Database, version: u64) {
    check_u64_table(db, tables::RAFT_LOG, "raft_log");
    for (def, name) in str_tables() {
        check_str_table(db, def, name);
    }
    let txn = db.begin_read().expect("begin read");
    let sends = txn.open_table(tables::SENDS).expect("open sends");
    assert_eq!(sends.len().expect("len"), rows_per_table);
    let epochs = txn
        .open_table(tables::CONTROLLER_EPOCH)
        .expect("controller_epoch has the new value type");
    if version >= 2 {
        let highest = epochs
            .get(tables::CONTROLLER_EPOCH_KEY)
            .expect("get")
            .expect("epoch row kept");
        let record = EpochRecord::decode(highest.value()).expect("decode record");
        assert_eq!(
            record,
            EpochRecord {
                epoch: 41,
                raised_at_index: None
            }
        );
        assert_eq!(epochs.len().expect("len"), 2, "every epoch row kept");
    } else {
        assert_eq!(epochs.len().expect("len"), 0);
    }
    drop(txn);
    check_settings_fixture(db, version);
    if version >= 5 {
        check_u64_table(db, tables::MODEL_HISTORY, "model_history");
    }
    if version >= 6 {
        let txn = db.begin_read().expect("begin read");
        let t = txn.open_table(tables::REQUESTS).expect("open requests");
        assert_eq!(t.len().expect("len"), rows_per_table, "requests lost rows");
        // Since 0010 every row is keyed by the order its record starts with, then its id.
        for i in 0..rows_per_table {
            let key = tables::request_key(rows_per_table - i, &[i as u8; 16]);
            let value = t.get(key.as_slice()).expect("get request");
            assert_eq!(
                value.map(|v| v.value().to_vec()),
                Some(request_value(i)),
                "requests row {i} not under its order and id after migration 0010"
            );
        }
    }
    // Since 0011: the kept models, empty after an upgrade (models applied before were never kept).
    let txn = db.begin_read().expect("begin read");
    let kept = txn
        .open_table(tables::MODEL_REVISIONS)
        .expect("model_revisions exists");
    assert_eq!(kept.len().expect("len"), 0, "from version {version}");
}

/// Layer `i` of the settings fixture: two keys of its own and one every layer shares.
fn fixture_layer(i: u64) -> m12::Layer {
    [
        (format!("k{i}"), format!("v{i}")),
        (format!("j{i}"), "j".to_string()),
        ("shared".to_string(), "s".to_string()),
    ]
    .into()
}

/// Settings history entry `i` of the fixture, as schema 0011 kept it: entry 0 created layer 0,
/// the others replaced layer `i - 1` with layer `i` (one key kept, two changed, two added).
fn fixture_whole(i: u64) -> m12::WholeLayers {
    m12::WholeLayers {
        id: i,
        scope: m12::Scope::Machine(format!("m{i}")),
        before: i.checked_sub(1).map(fixture_layer),
        after: Some(fixture_layer(i)),
        why: format!("why {i}"),
        actor: "operator:op".into(),
        epoch: 3,
        time_ms: 1000 + i,
    }
}

/// The same entry as schema 0012 keeps it: only the keys that changed.
fn fixture_entry(i: u64) -> m12::Entry {
    let change = |before: Option<String>, after: Option<String>| m12::KeyChange { before, after };
    let mut keys = std::collections::BTreeMap::new();
    keys.insert(format!("k{i}"), change(None, Some(format!("v{i}"))));
    keys.insert(format!("j{i}"), change(None, Some("j".into())));
    if let Some(p) = i.checked_sub(1) {
        keys.insert(format!("k{p}"), change(Some(format!("v{p}")), None));
        keys.insert(format!("j{p}"), change(Some("j".into()), None));
    } else {
        keys.insert("shared".into(), change(None, Some("s".into())));
    }
    m12::Entry {
        id: i,
        scope: m12::Scope::Machine(format!("m{i}")),
        delta: m12::LayerDelta {
            created: i == 0,
            cleared: false,
            keys,
        },
        why: format!("why {i}"),
        actor: "operator:op".into(),
        epoch: 3,
        time_ms: 1000 + i,
    }
}

/// Settings layers and history in the shape of `version`: whole encoded layers and whole-layer
/// history records before 0012, marker rows, value rows and deltas from it.
fn write_settings_fixture(db: &Database, version: u64) {
    let txn = db.begin_write().expect("begin write");
    {
        let mut layers = txn.open_table(tables::SETTINGS_LAYERS).expect("layers");
        for i in 0..rows_per_table {
            let scope = format!("machine/m{i}");
            if version >= 12 {
                layers
                    .insert(scope.as_str(), b"".as_slice())
                    .expect("insert");
                let mut values = txn.open_table(tables::SETTINGS_VALUES).expect("values");
                for (k, v) in fixture_layer(i) {
                    values
                        .insert((scope.as_str(), k.as_str()), v.as_bytes())
                        .expect("insert");
                }
            } else {
                let bytes = mesh_codec::encode("layer", &fixture_layer(i)).expect("encode");
                layers
                    .insert(scope.as_str(), bytes.as_slice())
                    .expect("insert");
            }
        }
        if version >= 3 {
            let mut history = txn.open_table(tables::SETTINGS_HISTORY).expect("history");
            for i in 0..rows_per_table {
                let bytes = match version {
                    12.. => mesh_codec::encode("entry", &fixture_entry(i)),
                    _ => mesh_codec::encode("change", &fixture_whole(i)),
                }
                .expect("encode");
                history.insert(i, bytes.as_slice()).expect("insert");
            }
        }
    }
    txn.commit().expect("commit");
}

/// Since 0012: every layer row an empty marker with its keys in `settings_values`, every
/// history record the keys its write changed.
fn check_settings_fixture(db: &Database, version: u64) {
    let txn = db.begin_read().expect("begin read");
    let layers = txn.open_table(tables::SETTINGS_LAYERS).expect("layers");
    let values = txn.open_table(tables::SETTINGS_VALUES).expect("values");
    assert_eq!(
        layers.len().expect("len"),
        rows_per_table,
        "from version {version}"
    );
    for i in 0..rows_per_table {
        let scope = format!("machine/m{i}");
        let marker = layers
            .get(scope.as_str())
            .expect("get")
            .expect("layer row kept");
        assert!(marker.value().is_empty(), "{scope} still holds its keys");
        for (k, v) in fixture_layer(i) {
            let got = values.get((scope.as_str(), k.as_str())).expect("get");
            assert_eq!(
                got.map(|g| g.value().to_vec()),
                Some(v.into_bytes()),
                "{scope} key {k} from version {version}"
            );
        }
    }
    assert_eq!(
        values.len().expect("len"),
        3 * rows_per_table,
        "from version {version}"
    );
    let history = txn.open_table(tables::SETTINGS_HISTORY).expect("history");
    let want = if version >= 3 { rows_per_table } else { 0 };
    assert_eq!(history.len().expect("len"), want, "from version {version}");
    for i in 0..want {
        let row = history.get(i).expect("get").expect("history row kept");
        let entry: m12::Entry = mesh_codec::decode("entry", row.value()).expect("decode entry");
        assert_eq!(
            entry,
            fixture_entry(i),
            "history #{i} from version {version}"
        );
    }
}

fn table_names(db: &Database) -> Vec<String> {
    let txn = db.begin_read().expect("begin read");
    let mut names: Vec<String> = txn
        .list_tables()
        .expect("list tables")
        .map(|t| redb::TableHandle::name(&t).to_string())
        .collect();
    names.sort();
    names
}

fn set_version(path: &Path, version: u64) {
    let db = Database::create(path).expect("open raw");
    let txn = db.begin_write().expect("begin write");
    {
        let mut meta = txn.open_table(tables::META).expect("open meta");
        meta.insert(tables::SCHEMA_VERSION_KEY, version)
            .expect("insert version");
    }
    txn.commit().expect("commit");
}

#[test]
fn migrations_are_numbered_one_by_one_up_to_the_latest() {
    // Schema bookkeeping: the runner relies on versions 1, 2, 3, … with no gap.
    for (i, m) in MIGRATIONS.iter().enumerate() {
        assert_eq!(m.version, i as u64 + 1, "migration {} out of order", m.name);
    }
    assert_eq!(
        MIGRATIONS.last().map(|m| m.version),
        Some(crate::schema_version_latest)
    );
}

#[test]
fn fresh_store_is_created_at_the_latest_version_with_every_table() {
    // Schema: a new store gets every table of the catalogue and nothing else.
    let dir = tempfile::tempdir().expect("tempdir");
    let path = store_path(&dir);
    let db = open(&path).expect("open");
    assert_eq!(
        schema_version(&db, &path).expect("version"),
        crate::schema_version_latest
    );
    let mut want: Vec<String> = tables::CATALOGUE
        .iter()
        .map(|(n, _)| n.to_string())
        .collect();
    want.sort();
    assert_eq!(table_names(&db), want);
}

#[test]
fn fixture_store_at_each_older_version_migrates_to_latest_without_losing_a_row() {
    // Schema upgrades: a store written by any older binary keeps every row through every later migration.
    for version in 1..crate::schema_version_latest {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = store_path(&dir);
        {
            let db = open_with(&path, &MIGRATIONS[..version as usize]).expect("open old");
            assert_eq!(schema_version(&db, &path).expect("version"), version);
            write_fixture_rows(&db, version);
        }
        let db = open(&path).expect("migrate to latest");
        assert_eq!(
            schema_version(&db, &path).expect("version"),
            crate::schema_version_latest,
            "from version {version}"
        );
        check_fixture_rows(&db, version);
    }
}

#[test]
fn reopening_a_latest_store_keeps_its_rows_and_version() {
    // Schema: running the runner again on an up-to-date store is a no-op.
    let dir = tempfile::tempdir().expect("tempdir");
    let path = store_path(&dir);
    {
        let db = open(&path).expect("open");
        write_fixture_rows(&db, crate::schema_version_latest);
    }
    let db = open(&path).expect("reopen");
    assert_eq!(
        schema_version(&db, &path).expect("version"),
        crate::schema_version_latest
    );
    check_fixture_rows(&db, crate::schema_version_latest);
}

#[test]
fn store_newer_than_the_binary_is_refused_naming_both_versions() {
    // Schema: a binary never writes into a store whose layout it does not know.
    let dir = tempfile::tempdir().expect("tempdir");
    let path = store_path(&dir);
    drop(open(&path).expect("open"));
    let newer = crate::schema_version_latest + 3;
    set_version(&path, newer);
    let err = open(&path).expect_err("newer store must be refused");
    match &err {
        MigrationError::StoreTooNew {
            store_version,
            binary_version,
            ..
        } => {
            assert_eq!(*store_version, newer);
            assert_eq!(*binary_version, crate::schema_version_latest);
        }
        other => panic!("wrong error: {other}"),
    }
    let text = err.to_string();
    assert!(text.contains(&newer.to_string()), "{text}");
    assert!(
        text.contains(&crate::schema_version_latest.to_string()),
        "{text}"
    );
}

fn failing_step(txn: &redb::WriteTransaction) -> Result<(), StepError> {
    // Does all the work of 0003, then fails as a real step might half-way.
    crate::m0003_settings_history::step(txn)?;
    {
        let mut history = txn.open_table(tables::SETTINGS_HISTORY)?;
        history.insert(1, b"half-written".as_slice())?;
        let mut model = txn.open_table(tables::MODEL)?;
        model.remove("model-0")?;
    }
    Err(StepError::Refused("injected failure".to_string()))
}

#[test]
fn failed_migration_leaves_the_store_as_it_was() {
    // Schema atomicity: a step and its version record commit together or not at all.
    let dir = tempfile::tempdir().expect("tempdir");
    let path = store_path(&dir);
    {
        let db = open_with(&path, &MIGRATIONS[..2]).expect("open at 2");
        write_fixture_rows(&db, 2);
    }
    let before = {
        let db = Database::create(&path).expect("raw open");
        table_names(&db)
    };
    let mut broken: Vec<Migration> = MIGRATIONS[..2].to_vec();
    broken.push(Migration {
        version: 3,
        name: "injected",
        step: failing_step,
    });
    let err = open_with(&path, &broken).expect_err("injected step fails");
    assert!(
        matches!(
            err,
            MigrationError::Step {
                version: 3,
                from_version: 2,
                ..
            }
        ),
        "{err}"
    );
    {
        let db = Database::create(&path).expect("raw open");
        assert_eq!(schema_version(&db, &path).expect("version"), 2);
        assert_eq!(table_names(&db), before, "no table added or removed");
        check_str_table(&db, tables::MODEL, "model");
    }
    let db = open(&path).expect("a good binary still migrates it");
    check_fixture_rows(&db, 2);
}

#[test]
fn redb_file_without_meta_is_refused_as_not_a_mesh_store() {
    // Schema: never migrate someone else's redb file.
    let dir = tempfile::tempdir().expect("tempdir");
    let path = store_path(&dir);
    {
        let db = Database::create(&path).expect("raw create");
        let txn = db.begin_write().expect("begin write");
        txn.open_table(TableDefinition::<u64, u64>::new("theirs"))
            .expect("open");
        txn.commit().expect("commit");
    }
    let err = open(&path).expect_err("foreign store refused");
    assert!(matches!(err, MigrationError::NotAMeshStore { .. }), "{err}");
}

#[test]
fn migration_0010_refuses_a_requests_key_that_is_not_a_request_id_and_leaves_the_store_at_0009() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = store_path(&dir);
    {
        let db = open_with(&path, &MIGRATIONS[..9]).expect("open at 0009");
        let txn = db.begin_write().expect("begin write");
        {
            let mut t = txn.open_table(tables::REQUESTS).expect("open requests");
            t.insert([7u8; 3].as_slice(), request_value(1).as_slice())
                .expect("insert");
        }
        txn.commit().expect("commit");
    }
    let err = open(&path)
        .expect_err("a 3-byte request key must be refused")
        .to_string();
    assert!(
        err.contains("requests_in_order") && err.contains("3-byte key"),
        "the refusal names the migration and the key: {err}"
    );
    let db = open_with(&path, &MIGRATIONS[..9]).expect("open at 0009 again");
    assert_eq!(schema_version(&db, &path).expect("version"), 9);
}

#[test]
fn a_store_is_created_0600_and_one_left_wider_is_tightened() {
    // Issue 27 part 7: the store holds every minted secret; redb alone would create it with the
    // umask (0644 outside systemd).
    use std::os::unix::fs::PermissionsExt;
    let mode = |p: &Path| std::fs::metadata(p).expect("stat").permissions().mode() & 0o777;
    let dir = tempfile::tempdir().expect("tempdir");
    let path = store_path(&dir);
    drop(open(&path).expect("created"));
    assert_eq!(mode(&path), 0o600);
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).expect("chmod");
    drop(open(&path).expect("reopened"));
    assert_eq!(mode(&path), 0o600);
}
