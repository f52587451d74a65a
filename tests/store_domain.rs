//! The domain state machine on real redb files through a one-replica Raft: G4 (stale epoch and moved
//! revision refused, nothing written), G6 (settings history in the same transaction, removals refused
//! without replace), G9 (the epoch floor follows every term) and restart recovery.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use mesh::core::meshfile::parse_mesh;
use mesh::core::model::Provide;
use mesh::core::settings::{Scope, setting_value_bytes_max};
use mesh::store::app::{MeshApp, decode_outcome};
use mesh::store::command::{Applied, Command, Outcome, Proposal, Refusal, RequestId};
use mesh_raft::router::Router;
use mesh_raft::{BasicNode, RaftSettings, Replica, ReplicaSpec};

struct One {
    replica: Replica<MeshApp>,
    app: Arc<MeshApp>,
    term: u64,
}

async fn start(dir: &std::path::Path) -> One {
    let settings = RaftSettings {
        heartbeat_ms: 50,
        election_timeout_min_ms: 300,
        election_timeout_max_ms: 600,
        lease_margin_ms: 60,
        ..RaftSettings::default()
    };
    let config = settings.validate().expect("settings");
    let app = MeshApp::open(dir).expect("app opens");
    let router = Router::new(7);
    let spec = ReplicaSpec {
        id: 1,
        dir: dir.to_path_buf(),
        config,
        term_floor: 0,
        bootstrap: Some(BTreeMap::from([(1, BasicNode::new("one"))])),
    };
    let replica = Replica::start(spec, router.network(1), app.clone())
        .await
        .expect("replica starts");
    router.add(1, replica.raft().clone());
    let mut metrics = replica.metrics();
    let term = tokio::time::timeout(Duration::from_secs(20), async {
        loop {
            let m = metrics.borrow().clone();
            if m.current_leader == Some(1) {
                return m.current_term;
            }
            metrics.changed().await.expect("metrics");
        }
    })
    .await
    .expect("a leader within 20 s");
    One { replica, app, term }
}

impl One {
    async fn propose(&self, epoch: u64, expect_revision: Option<u64>, command: Command) -> Outcome {
        let proposal = Proposal {
            epoch,
            expect_revision,
            actor: "operator:test".into(),
            time_ms: 1,
            command,
        };
        let bytes = mesh_codec::encode("proposal", &proposal).expect("encode");
        let done = self.replica.propose(bytes).await.expect("committed");
        decode_outcome(&done.response).expect("outcome")
    }
}

fn example() -> mesh::core::model::Mesh {
    let text = include_str!("../examples/mesh.toml");
    parse_mesh("examples/mesh.toml", text).expect("example parses")
}

#[tokio::test]
async fn g4_stale_epoch_and_moved_revision_are_refused_and_change_nothing() {
    // G4: a command decided under an older epoch, or against a revision that moved, is refused.
    let dir = tempfile::tempdir().expect("tempdir");
    let one = start(dir.path()).await;
    let applied = one
        .propose(
            one.term,
            Some(0),
            Command::ApplyModel {
                mesh: example(),
                why: "first".into(),
                changes: vec![],
            },
        )
        .await;
    assert_eq!(
        applied,
        Outcome::Applied(Applied::Model {
            revision: 1,
            settings_ignored: vec![]
        })
    );
    let before = one.app.state().expect("state").as_ref().clone();

    let stale = one
        .propose(
            one.term - 1,
            None,
            Command::ApplyModel {
                mesh: Default::default(),
                why: "x".into(),
                changes: vec![],
            },
        )
        .await;
    assert_eq!(
        stale,
        Outcome::Refused(Refusal::StaleEpoch {
            epoch: one.term - 1,
            term: one.term
        })
    );
    let moved = one
        .propose(
            one.term,
            Some(0),
            Command::ApplyModel {
                mesh: Default::default(),
                why: "x".into(),
                changes: vec![],
            },
        )
        .await;
    assert_eq!(
        moved,
        Outcome::Refused(Refusal::RevisionMoved {
            expected: 0,
            actual: 1
        })
    );
    assert_eq!(
        *one.app.state().expect("state"),
        before,
        "a refused command changed the state"
    );
    one.replica.shutdown().await.expect("shutdown");
}

#[tokio::test]
async fn g6_settings_history_is_kept_and_removal_needs_replace() {
    // G6: a replaced layer is kept in settings_history; a removal without replace is refused.
    let dir = tempfile::tempdir().expect("tempdir");
    let one = start(dir.path()).await;
    one.propose(
        one.term,
        None,
        Command::ApplyModel {
            mesh: example(),
            why: "first".into(),
            changes: vec![],
        },
    )
    .await;
    let scope = Scope::Mesh;
    let before = one
        .app
        .state()
        .expect("state")
        .mesh
        .settings
        .layers
        .get(&scope)
        .cloned();
    let set = BTreeMap::from([("color".to_string(), "blue".to_string())]);
    let refused = one
        .propose(
            one.term,
            None,
            Command::SetSettings {
                scope: scope.clone(),
                set: set.clone(),
                remove: BTreeSet::from(["log_level".to_string()]),
                replace: false,
                why: "try".into(),
            },
        )
        .await;
    assert!(
        matches!(refused, Outcome::Refused(Refusal::Invalid(ref m)) if m.contains("--replace")),
        "{refused:?}"
    );
    let history = MeshApp::settings_history(one.replica.database()).expect("history");
    let seeded = history.len();
    assert!(
        seeded > 0,
        "the first apply seeds the file's settings and records each layer"
    );
    assert!(
        MeshApp::settings_history(one.replica.database())
            .expect("history")
            .len()
            == seeded,
        "a refused write left history"
    );

    let replaced = one
        .propose(
            one.term,
            None,
            Command::SetSettings {
                scope: scope.clone(),
                set,
                remove: BTreeSet::new(),
                replace: true,
                why: "only color".into(),
            },
        )
        .await;
    let Outcome::Applied(Applied::Settings { added, removed, .. }) = replaced else {
        panic!("replace was not applied: {replaced:?}");
    };
    assert_eq!(added, vec!["color".to_string()]);
    assert!(
        !removed.is_empty(),
        "the example's mesh layer had keys that replace removed"
    );
    let history = MeshApp::settings_history(one.replica.database()).expect("history");
    assert_eq!(history.len(), seeded + 1);
    let last = history.last().expect("an entry");
    assert_eq!(last.before, before, "history keeps the layer as it was");
    assert_eq!(last.why, "only color");
    one.replica.shutdown().await.expect("shutdown");
}

#[tokio::test]
async fn g9_epoch_floor_follows_terms_and_state_survives_restart() {
    // G9: the highest term ever applied is kept in the store, and the state reloads from the files.
    let dir = tempfile::tempdir().expect("tempdir");
    let one = start(dir.path()).await;
    one.propose(
        one.term,
        None,
        Command::ApplyModel {
            mesh: example(),
            why: "first".into(),
            changes: vec![],
        },
    )
    .await;
    assert_eq!(one.app.state().expect("state").epoch_floor, one.term);
    let before = one.app.state().expect("state").as_ref().clone();
    let term = one.term;
    one.replica.shutdown().await.expect("shutdown");

    let again = start(dir.path()).await;
    assert!(
        again.term >= term,
        "a restarted replica never goes back to an older term"
    );
    let state = again.app.state().expect("state").as_ref().clone();
    assert_eq!(state.mesh, before.mesh);
    assert_eq!(state.revision, before.revision);
    assert_eq!(
        state.epoch_floor, again.term,
        "the floor is the highest term applied"
    );
    // A later model apply with different settings leaves the stored layers alone and says so.
    let mut changed_file = example();
    changed_file
        .settings
        .layers
        .insert(Scope::Mesh, BTreeMap::from([("x".into(), "y".into())]));
    let out = again
        .propose(
            again.term,
            None,
            Command::ApplyModel {
                mesh: changed_file,
                why: "again".into(),
                changes: vec![],
            },
        )
        .await;
    let Outcome::Applied(Applied::Model {
        settings_ignored, ..
    }) = out
    else {
        panic!("{out:?}")
    };
    assert_eq!(settings_ignored, vec!["mesh".to_string()]);
    assert_eq!(
        again.app.state().expect("state").mesh.settings,
        before.mesh.settings
    );
    again.replica.shutdown().await.expect("shutdown");
}

#[tokio::test]
async fn models_and_settings_that_break_the_rules_are_refused_at_apply_and_change_nothing() {
    // Issue 9: a proposal that skipped the controller's checks (two modules on one port, a
    // placement scope off the module's machine, a control character, an oversized value) is
    // refused by the state machine with the same rules; nothing is written.
    let dir = tempfile::tempdir().expect("tempdir");
    let one = start(dir.path()).await;
    one.propose(
        one.term,
        None,
        Command::ApplyModel {
            mesh: example(),
            why: "first".into(),
            changes: vec![],
        },
    )
    .await;
    let before = one.app.state().expect("state").as_ref().clone();
    let history = MeshApp::settings_history(one.replica.database())
        .expect("history")
        .len();

    let mut two_on_one_port = example();
    let mut rogue = two_on_one_port.modules["backup"].clone();
    rogue.name = "rogue".into();
    rogue.after.clear();
    rogue.provides.push(Provide {
        kind: "pg".into(),
        port: Some(47101),
    });
    two_on_one_port.modules.insert("rogue".into(), rogue);
    let set = |scope: &str, key: &str, value: &str| Command::SetSettings {
        scope: scope.parse().expect("scope"),
        set: BTreeMap::from([(key.to_string(), value.to_string())]),
        remove: BTreeSet::new(),
        replace: false,
        why: "skip meshctl".into(),
    };
    let big = "x".repeat(setting_value_bytes_max + 1);
    let cases = [
        (
            Command::ApplyModel {
                mesh: two_on_one_port,
                why: "w".into(),
                changes: vec![],
            },
            "where module `db` listens too",
        ),
        (
            set("module/broker@ace", "k", "v"),
            "runs on g14, not on ace",
        ),
        (set("mesh", "k", "a\nb"), "control character (U+000A)"),
        (set("mesh", "k\u{1b}", "v"), "control character (U+001B)"),
        (set("mesh", "k", &big), "setting_value_bytes_max"),
    ];
    for (command, says) in cases {
        let out = one.propose(one.term, None, command).await;
        assert!(
            matches!(&out, Outcome::Refused(Refusal::Invalid(m)) if m.contains(says)),
            "{says}: {out:?}"
        );
    }
    let mut after = one.app.state().expect("state").as_ref().clone();
    after.epoch_floor = before.epoch_floor;
    assert_eq!(after, before, "a refused command changed the state");
    assert_eq!(
        MeshApp::settings_history(one.replica.database())
            .expect("history")
            .len(),
        history
    );
    one.replica.shutdown().await.expect("shutdown");
}

#[tokio::test]
async fn a_request_id_runs_once_and_a_retry_gets_its_first_outcome_even_after_a_restart() {
    // Nothing runs twice (issue 10 item 4): the same operator request proposed again (its answer
    // was lost, meshctl asked another replica) is answered with its first outcome, writes nothing,
    // and this still holds after the replica restarts (the ids live in the store).
    let dir = tempfile::tempdir().expect("tempdir");
    let one = start(dir.path()).await;
    let model = Command::ApplyModel {
        mesh: example(),
        why: "first".into(),
        changes: vec![],
    };
    one.propose(one.term, None, model).await;
    let id = RequestId([7; 16]);
    let set = |value: &str| Command::Once {
        request: id,
        command: Box::new(Command::SetSettings {
            scope: Scope::Mesh,
            set: BTreeMap::from([("region".to_string(), value.to_string())]),
            remove: BTreeSet::new(),
            replace: false,
            why: "retried".into(),
        }),
    };
    let first = one.propose(one.term, None, set("eu")).await;
    assert!(
        matches!(first, Outcome::Applied(Applied::Settings { .. })),
        "{first:?}"
    );
    let after_first = one.app.state().expect("state").as_ref().clone();
    let history = MeshApp::settings_history(one.replica.database()).expect("history");

    // Even a retry that differs (it cannot, but a bug could) does not run: the id decides.
    let again = one.propose(one.term, None, set("us")).await;
    assert_eq!(
        again, first,
        "a retried request is answered with its first outcome"
    );
    assert_eq!(
        *one.app.state().expect("state"),
        after_first,
        "a retried request changed the state"
    );
    assert_eq!(
        MeshApp::settings_history(one.replica.database())
            .expect("history")
            .len(),
        history.len(),
        "a retried request left a second history row"
    );

    let term = one.term;
    one.replica.shutdown().await.expect("shutdown");
    let restarted = start(dir.path()).await;
    assert!(restarted.term >= term);
    let later = restarted.propose(restarted.term, None, set("ap")).await;
    assert_eq!(later, first, "the request's outcome survives a restart");
    let state = restarted.app.state().expect("state");
    assert_eq!(
        state
            .mesh
            .settings
            .layers
            .get(&Scope::Mesh)
            .and_then(|l| l.get("region")),
        Some(&"eu".to_string())
    );
}

#[test]
fn remembered_requests_are_bounded_and_the_oldest_is_forgotten_first() {
    // Limits on everything: the state keeps at most `requests_remembered_max` request outcomes.
    use mesh::store::command::requests_remembered_max;
    use mesh::store::state::DomainState;
    let mut state = DomainState::default();
    let proposal = |i: usize| Proposal {
        epoch: 1,
        expect_revision: None,
        actor: "operator:test".into(),
        time_ms: 1,
        command: Command::Once {
            request: RequestId(id_of(i)),
            command: Box::new(Command::RaiseEpochFloor { epoch: 1 }),
        },
    };
    fn id_of(i: usize) -> [u8; 16] {
        let mut id = [0u8; 16];
        id[..8].copy_from_slice(&(i as u64).to_be_bytes());
        id
    }
    for i in 0..requests_remembered_max + 5 {
        let (outcome, _) = state.apply(1, &proposal(i));
        assert!(matches!(outcome, Outcome::Applied(_)), "{outcome:?}");
    }
    assert_eq!(state.requests.len(), requests_remembered_max);
    assert_eq!(state.request_order.len(), requests_remembered_max);
    assert!(
        state.remembered(&RequestId(id_of(0))).is_none(),
        "the oldest is forgotten"
    );
    assert!(state.remembered(&RequestId(id_of(4))).is_none());
    assert!(
        state.remembered(&RequestId(id_of(5))).is_some(),
        "the newest are kept"
    );
    assert!(
        state
            .remembered(&RequestId(id_of(requests_remembered_max + 4)))
            .is_some()
    );
}

#[tokio::test]
async fn requests_forgotten_in_memory_leave_the_store_so_a_restart_remembers_only_the_newest() {
    // A request id runs at most once, and the store keeps only the last `requests_remembered_max`
    // (decision 0180): the rows of forgotten requests must leave the table too (their key is the
    // order they were remembered in, migration 0010), or a restart would bring them back.
    use mesh::store::command::requests_remembered_max;
    let dir = tempfile::tempdir().expect("tempdir");
    let one = start(dir.path()).await;
    fn id_of(i: usize) -> RequestId {
        let mut id = [0u8; 16];
        id[8..].copy_from_slice(&(i as u64).to_le_bytes());
        RequestId(id)
    }
    let total = requests_remembered_max + 7;
    let one = Arc::new(one);
    let mut start_at = 0;
    while start_at < total {
        let end = (start_at + 500).min(total);
        let mut tasks = tokio::task::JoinSet::new();
        for i in start_at..end {
            let one = one.clone();
            tasks.spawn(async move {
                let command = Command::Once {
                    request: id_of(i),
                    command: Box::new(Command::RaiseEpochFloor { epoch: 1 }),
                };
                (i, one.propose(one.term, None, command).await)
            });
        }
        // Each batch is remembered before the next is proposed, so ids 0..7 are the oldest.
        while let Some(done) = tasks.join_next().await {
            let (i, outcome) = done.expect("task");
            assert!(
                matches!(outcome, Outcome::Applied(_)),
                "request {i}: {outcome:?}"
            );
        }
        start_at = end;
    }
    let Ok(one) = Arc::try_unwrap(one) else {
        panic!("the replica is still shared")
    };
    one.replica.shutdown().await.expect("shutdown");
    let restarted = start(dir.path()).await;
    let state = restarted.app.state().expect("state");
    assert_eq!(
        state.requests.len(),
        requests_remembered_max,
        "the store kept rows of forgotten requests"
    );
    assert!(
        (0..7).all(|i| state.remembered(&id_of(i)).is_none()),
        "a forgotten request came back after the restart"
    );
    assert!(
        state.remembered(&id_of(total - 1)).is_some(),
        "the newest is kept"
    );
}
