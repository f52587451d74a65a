//! The `--json` schema `mesh/v1` (docs/json.md) pinned by fixtures: each command's view is
//! rendered from hand-built API values and compared with `tests/fixtures/json/<name>.json`.
//! A difference is a schema change: if it is meant, update docs/json.md (and bump the schema
//! when a reader could trip on it), then rewrite the fixtures with `MESH_WRITE_FIXTURES=1`
//! and review them by eye.

use std::collections::BTreeMap;
use std::path::PathBuf;

use clap::Parser;
use mesh::cli::check::{CheckOutcome, MachineChange, MachineCheck};
use mesh::cli::json::{self, Time};
use mesh::cli::push::{WaitOutcome, Waited};
use mesh::cli::render::Via;
use mesh::cli::{Cli, CliError};
use mesh::controller::api::{
    ApiError, ApplyError, HistoryItem, MachineView, PlanView, PlannedChange, PlannedMachine,
    PlannedMint, PushError, PushLine, PushOutcome, PushTarget, PushView, ReplicaSaid, ReplicaView,
    SettingsError, SettingsRule, SettingsView, StatusView,
};
use mesh::core::declaration::Digest;
use mesh::core::model::{Placement, Provision};
use mesh::core::report::{Exit, Health, ModuleState, ModuleStatus};
use mesh::core::settings::Scope;
use mesh::core::summary::{Change, ItemChange, Summary, SummaryDiff};
use mesh::store::command::{HeldMount, ModelChange, SendRecord, SettingsChange};
use serde::Serialize;

/// 2026-11-30T09:42:57.120Z
const t0: u64 = 1_796_031_777_120;

fn via() -> Option<Via> {
    Some(Via {
        replica: 1,
        forwarded_by: Some(2),
    })
}

fn digest(b: u8) -> Digest {
    Digest([b; 32])
}

fn fixture_path(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/json")
        .join(format!("{name}.json"))
}

/// Renders the document meshctl prints and compares it, pretty-printed, with the fixture.
fn assert_fixture<T: Serialize>(name: &str, via: Option<Via>, answer: T) {
    let line = json::document(via, answer).expect("renders");
    assert!(line.ends_with('\n') && line.lines().count() == 1, "{line}");
    assert_matches_fixture(name, &line);
}

fn assert_matches_fixture(name: &str, line: &str) {
    let value: serde_json::Value = serde_json::from_str(line).expect("valid JSON");
    assert_eq!(value["schema"], "mesh/v1", "{line}");
    let pretty = serde_json::to_string_pretty(&value).expect("pretty") + "\n";
    let path = fixture_path(name);
    if std::env::var_os("MESH_WRITE_FIXTURES").is_some() {
        std::fs::create_dir_all(path.parent().expect("parent")).expect("mkdir");
        std::fs::write(&path, &pretty).expect("write fixture");
        return;
    }
    let want = std::fs::read_to_string(&path).unwrap_or_else(|e| {
        panic!(
            "{}: {e}; write it with MESH_WRITE_FIXTURES=1",
            path.display()
        )
    });
    assert_eq!(
        pretty,
        want,
        "{name}: the JSON differs from {}; a schema change needs docs/json.md",
        path.display()
    );
}

fn module(name: &str, state: ModuleState, restarts: u32, last_exit: Option<Exit>) -> ModuleStatus {
    ModuleStatus {
        name: name.into(),
        state,
        restarts,
        pid: Some(4242),
        last_exit,
        drift: Vec::new(),
    }
}

fn hold() -> HeldMount {
    HeldMount {
        module: "db".into(),
        mount: "data".into(),
        old_dir: "/srv/a".into(),
        new_dir: "/srv/b".into(),
    }
}

fn status_view() -> StatusView {
    let ace = MachineView {
        name: "ace".into(),
        last_send: Some((3, 7, digest(0xab))),
        last_report: Some((3, 7, 12, Some(digest(0xab)))),
        behind: true,
        behind_why: vec!["drifted: db: conf/db.conf changed".into()],
        holds: vec![],
        refused_reports: 1,
        modules: vec![
            ModuleStatus {
                // Its config edited by hand on the host (decision 0305).
                drift: vec!["conf/db.conf changed".into()],
                ..module("db", ModuleState::Ready, 0, None)
            },
            module(
                "app",
                ModuleState::Failed {
                    error: "exited with code 3".into(),
                },
                4,
                Some(Exit::Code(3)),
            ),
            module(
                "web",
                ModuleState::Waiting {
                    on: "endpoint 127.0.0.1:8080 of provision p-1".into(),
                },
                1,
                Some(Exit::Signal(9)),
            ),
        ],
        health: Some(Health::Failing {
            modules: vec!["app".into()],
        }),
        report_filed_ms: Some(t0),
        report_age_ms: Some(1500),
        heard_ago_ms: Some(800),
        unproven_refusal: None,
        report_refusal: Some("3 reports refused, the last 2000 ms ago: report refused: the last refusal is 4000 bytes, over report_refusal_bytes_max (2048 bytes)".into()),
        silent_for_ms: None,
        drifted: vec!["db: conf/db.conf changed".into()],
    };
    let g14 = MachineView {
        name: "g14".into(),
        last_send: None,
        last_report: None,
        behind: true,
        behind_why: vec!["never sent".into()],
        holds: vec![hold()],
        refused_reports: 0,
        modules: vec![],
        health: None,
        report_filed_ms: None,
        report_age_ms: None,
        heard_ago_ms: None,
        unproven_refusal: None,
        report_refusal: None,
        // Its host stopped: the leader has not heard it for 50 s (decision 0301).
        silent_for_ms: Some(50_000),
        drifted: vec![],
    };
    StatusView {
        replicas: vec![
            ReplicaView {
                id: 1,
                addr: "127.0.0.1:7101".into(),
                leader: true,
                epoch: 3,
                reachable: true,
                said: Some(ReplicaSaid {
                    role: mesh_raft::Role::Leader,
                    log_index: Some(41),
                    lag: 0,
                    answered_in_ms: 0,
                }),
            },
            ReplicaView {
                id: 2,
                addr: "127.0.0.1:7102".into(),
                leader: false,
                epoch: 0,
                reachable: false,
                said: None,
            },
        ],
        machines: vec![ace, g14],
        revision: 5,
        epoch_floor: 2,
        store_reset: None,
        certs_expiring: vec![],
    }
}

#[test]
fn status_json_has_hex_digests_rfc3339_times_and_tagged_exits() {
    // Issue 13 part 2: digests as hex, times as RFC 3339, kinds as lower-case tags.
    assert_fixture("status", via(), json::StatusJson::from(&status_view()));
}

#[test]
fn times_are_rfc3339_utc_with_milliseconds() {
    assert_eq!(
        Time(0).rfc3339().as_deref(),
        Some("1970-01-01T00:00:00.000Z")
    );
    assert_eq!(
        Time(t0).rfc3339().as_deref(),
        Some("2026-11-30T09:42:57.120Z")
    );
    // Past the year 9999 the document is refused instead of printing a time that is not one.
    let too_late = json::document(None, Time(u64::MAX));
    assert!(matches!(too_late, Err(CliError::Render(_))), "{too_late:?}");
}

#[test]
fn apply_json_names_the_machines_behind() {
    let answer = json::ApplyJson {
        revision: 6,
        unchanged: false,
        behind: vec!["ace".into(), "g14".into()],
        settings_ignored: vec!["machine/ace".into()],
        draining: vec!["novox".into()],
    };
    assert_fixture("apply", via(), answer);
}

// ---- issue 25 items 1 and 2: model show, diff, unchanged apply (decision 0302) ----

fn model_view() -> mesh::controller::api::ModelView {
    let text = "[machines.ace]\naddress = \"10.0.0.1\"\n[modules.db]\nmachine = \"ace\"\ncommand = \"sleep\"\n[settings.mesh]\nregion = \"lab\"\n";
    mesh::controller::api::ModelView {
        model_revision: Some(7),
        store_revision: 9,
        current: true,
        mesh: mesh::core::meshfile::parse_mesh("mesh.toml", text).expect("parses"),
        settings_left_out: vec![Scope::Machine("zz".into())],
        change: Some(ModelChange {
            revision: 7,
            why: "move db".into(),
            actor: "operator:alice".into(),
            epoch: 2,
            time_ms: t0,
            changes: vec!["ace".into()],
        }),
    }
}

#[test]
fn model_show_json_has_the_file_text_its_digest_and_what_was_left_out() {
    let view = model_view();
    let digest = mesh::cli::model::model_digest(&view.mesh).expect("digest");
    let text = format!(
        "{}{}",
        mesh::cli::model::header(&view, &digest),
        mesh::core::meshwrite::write_mesh(&view.mesh)
    );
    assert_fixture(
        "model_show",
        via(),
        json::ModelShowJson::new(&view, digest, text),
    );
}

#[test]
fn diff_json_lists_each_change_with_both_sides_and_the_settings_apart() {
    let view = model_view();
    let mut file = view.mesh.clone();
    if let Some(db) = file.modules.get_mut("db") {
        db.machine = "g14".into();
        db.env.insert("DB_NAME".into(), "mesh".into());
    }
    file.machines.insert(
        "g14".into(),
        mesh::core::model::Machine {
            name: "g14".into(),
            address: "10.0.0.2".into(),
        },
    );
    file.settings.layers.clear();
    let d = mesh::core::meshdiff::diff_models(&view.mesh, &file);
    assert_fixture("diff", via(), json::DiffJson::new(&view, &d));
}

#[test]
fn an_unchanged_apply_says_so_in_json() {
    let answer = json::ApplyJson {
        revision: 9,
        unchanged: true,
        behind: vec![],
        settings_ignored: vec![],
        draining: vec![],
    };
    assert_fixture("apply_unchanged", via(), answer);
}

fn plan_view() -> PlanView {
    let change = |item: &str, was: Option<&str>, now: Option<&str>| PlannedChange {
        module: "db".into(),
        item: item.into(),
        was: was.map(String::from),
        now: now.map(String::from),
    };
    PlanView {
        target: PushTarget::Machine("ace".into()),
        moves: vec![],
        revision: 5,
        machines: vec![
            PlannedMachine {
                machine: "ace".into(),
                reason: "named".into(),
                changes: vec![
                    change(
                        "setting log_level",
                        Some("\"info\""),
                        Some("\"debug \\\"x\\\"\""),
                    ),
                    change("env SECRET", Some("0123456789abcdef"), Some("\"b\"")),
                    change("file conf/app.toml", None, Some(&digest(0x11).to_string())),
                    change("grant p-9", Some("sql to app@g14 as db, secret 1f2e"), None),
                    change("module", None, Some("postgres")),
                    // Drift the host reported, which the push restores (decision 0305).
                    change(
                        mesh::controller::api::drift_item,
                        Some("conf/db.conf changed"),
                        Some("as sent"),
                    ),
                ],
                holds: vec![],
            },
            PlannedMachine {
                machine: "g14".into(),
                reason: "cascaded from ace: module db moved".into(),
                changes: vec![],
                holds: vec![hold()],
            },
        ],
        mints: vec![PlannedMint {
            id: "p-10".into(),
            kind: "sql".into(),
            consumer: "app@g14".into(),
            provider: "db@ace".into(),
        }],
        token: "0f1e2d3c4b5a69788796a5b4c3d2e1f0".into(),
    }
}

#[test]
fn plan_json_diffs_are_structured_entries_with_values_in_the_clear() {
    // Issue 13 part 2: {"op", "module", "path", "old", "new"}; settings in the clear, a value the
    // store no longer has marked as a digest.
    assert_fixture("plan", via(), json::PlanJson::from(&plan_view()));
}

#[test]
fn plan_json_targets_are_strings() {
    for (target, text) in [
        (PushTarget::Machine("ace".into()), "machine/ace"),
        (PushTarget::Behind, "behind"),
        (PushTarget::All, "all"),
    ] {
        assert_eq!(json::target_text(&target), text);
    }
}

#[test]
fn diff_values_in_rust_quotes_come_out_in_the_clear() {
    assert_eq!(
        json::unquote(r#""a \"b\" \\ \n\t\u{1b}é""#).as_deref(),
        Some("a \"b\" \\ \n\t\u{1b}é")
    );
    assert_eq!(json::unquote("0123456789abcdef"), None);
    assert_eq!(json::unquote(r#""a"b""#), None);
    assert_eq!(json::unquote(r#""\q""#), None);
    assert_eq!(
        json::change_value("setting x", "0123456789abcdef"),
        "digest:0123456789abcdef"
    );
    assert_eq!(json::change_value("command", "\"perl\""), "\"perl\"");
}

fn push_view() -> PushView {
    let line = |machine: &str, outcome| PushLine {
        machine: machine.into(),
        outcome,
    };
    PushView {
        epoch: 3,
        lines: vec![
            line(
                "ace",
                PushOutcome::Applied {
                    reason: "named".into(),
                    sequence: 8,
                    digest: digest(0xab),
                },
            ),
            line(
                "g14",
                PushOutcome::Held {
                    reason: "cascaded from ace".into(),
                    holds: vec![hold()],
                },
            ),
            line(
                "novox",
                PushOutcome::Sent {
                    reason: "behind".into(),
                    sequence: 2,
                    digest: digest(0xcd),
                    error: "no answer in 5000 ms".into(),
                },
            ),
            line(
                "shanks",
                PushOutcome::Refused {
                    reason: "behind".into(),
                    refusal: "epoch 3 is below the mark 4".into(),
                },
            ),
            line(
                "zed",
                PushOutcome::Failed {
                    reason: "named".into(),
                    error: "no address in [hosts]".into(),
                },
            ),
        ],
    }
}

#[test]
fn push_json_tags_every_outcome_with_its_kind() {
    // Issue 13 part 2: no Rust enum shapes ({"Applied": {...}}): {"machine", "kind", ...}.
    assert_fixture("push", via(), json::PushJson::new(&push_view(), None));
}

#[test]
fn push_json_streams_one_event_document_per_line_before_the_answer() {
    // Decision 0190: `push --json` prints `begin`, then a `line` per machine as it settles, each
    // one document on its own line; the answer document (pinned by `push`) comes last.
    use mesh::cli::push::Live;
    use mesh::controller::api::PushEvent;
    let view = push_view();
    let mut live = Live::new(true, false);
    let mut out = Vec::new();
    let machines = view.lines.iter().map(|l| l.machine.clone()).collect();
    live.event(PushEvent::Begin { epoch: 3, machines }, &mut out);
    live.event(PushEvent::Line(view.lines[0].clone()), &mut out);
    let text = String::from_utf8(out).expect("utf-8");
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 2, "{text}");
    assert_matches_fixture("push_event_begin", lines[0]);
    assert_matches_fixture("push_event_line", lines[1]);
    assert_eq!(
        live.rest(via().expect("via"), &view),
        "",
        "the answer document is printed apart"
    );
}

#[test]
fn push_wait_json_adds_how_each_machine_settled() {
    let status = status_view();
    let waited = vec![
        Waited {
            machine: "ace".into(),
            sequence: 8,
            outcome: WaitOutcome::Failing {
                modules: vec!["app".into()],
            },
            view: Some(status.machines[0].clone()),
        },
        Waited {
            machine: "novox".into(),
            sequence: 2,
            outcome: WaitOutcome::TimedOut {
                last: "no report from it yet".into(),
            },
            view: None,
        },
    ];
    assert_fixture(
        "push_wait",
        via(),
        json::PushJson::new(&push_view(), Some(&waited)),
    );
}

#[test]
fn push_waves_json_lists_every_wave_where_it_stopped_and_what_was_not_sent() {
    // Decision 0315: each wave's lines and waits, `failed` naming who stopped it, the waves never
    // walked as `not_sent`, and the how-to-continue text.
    use mesh::cli::waves::{WaveArgs, WaveRun, WaveSize, stop_text};
    let lines = push_view().lines;
    let waves = vec![
        vec!["ace".to_string()],
        vec!["g14".to_string()],
        vec!["shanks".to_string()],
    ];
    let waited = |machine: &str, outcome| Waited {
        machine: machine.into(),
        sequence: 8,
        outcome,
        view: None,
    };
    let runs = vec![
        WaveRun {
            number: 1,
            targets: waves[0].clone(),
            skipped: Vec::new(),
            lines: vec![lines[0].clone()],
            waited: vec![waited("ace", WaitOutcome::Ready)],
            error: None,
        },
        WaveRun {
            number: 2,
            targets: waves[1].clone(),
            skipped: Vec::new(),
            lines: vec![PushLine {
                machine: "g14".into(),
                outcome: PushOutcome::Applied {
                    reason: "named".into(),
                    sequence: 3,
                    digest: digest(7),
                },
            }],
            waited: vec![waited(
                "g14",
                WaitOutcome::Failing {
                    modules: vec!["crash".into()],
                },
            )],
            error: None,
        },
    ];
    let args = WaveArgs {
        wave: Some(WaveSize::Percent(30)),
        canary: None,
    };
    let next = stop_text(&waves, &runs, &args);
    assert_fixture(
        "push_waves",
        via(),
        json::PushWavesJson::new(&waves, &runs, next),
    );
}

#[test]
fn plan_waves_json_names_each_waves_machines_with_why() {
    use mesh::cli::waves::PlannedWave;
    let waves = vec![
        vec!["ace".to_string()],
        vec!["novox".to_string(), "g14".to_string()],
    ];
    let planned = vec![
        PlannedWave {
            machines: vec![
                ("ace".into(), "named".into()),
                ("novox".into(), "cascaded from ace".into()),
            ],
            skipped: Vec::new(),
        },
        PlannedWave {
            machines: vec![("g14".into(), "named".into())],
            skipped: vec!["novox".into()],
        },
    ];
    assert_fixture(
        "plan_waves",
        via(),
        json::PlanWavesJson::new(&waves, &planned),
    );
}

fn settings_change(
    id: u64,
    before: Option<&[(&str, &str)]>,
    after: Option<&[(&str, &str)]>,
) -> SettingsChange {
    let layer = |pairs: &[(&str, &str)]| -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    };
    SettingsChange {
        id,
        scope: Scope::Placement {
            module: "db".into(),
            machine: "ace".into(),
        },
        before: before.map(layer),
        after: after.map(layer),
        why: "tune".into(),
        actor: "operator:admin".into(),
        epoch: 3,
        time_ms: t0 + id,
    }
}

#[test]
fn settings_show_json_has_scopes_as_strings_and_every_write() {
    let view = SettingsView {
        layers: vec![
            (
                Scope::Mesh,
                [("tier".to_string(), "edge".to_string())].into(),
            ),
            (
                Scope::Machine("ace".into()),
                [("zone".to_string(), "b".to_string())].into(),
            ),
        ],
        effective: Some([("tier".to_string(), "edge".to_string())].into()),
        history: vec![
            settings_change(1, None, Some(&[("a", "1")])),
            settings_change(2, Some(&[("a", "1")]), Some(&[("a", "2")])),
            settings_change(3, Some(&[("a", "2")]), None),
        ],
    };
    assert_fixture("settings_show", via(), json::SettingsShowJson::from(&view));
}

#[test]
fn settings_set_json_lists_every_key_added_changed_and_removed() {
    let answer = json::SettingsSetJson::new(
        &Scope::Module("db".into()),
        &["b".into()],
        &["a".into()],
        &["c".into()],
    );
    assert_fixture("settings_set", via(), answer);
}

#[test]
fn history_json_items_are_tagged_model_send_settings_and_revocation() {
    // Issue 13 part 2: {"kind": "send", ...} instead of {"Send": {...}}; digests as hex.
    let mut summary = Summary {
        machine: "ace".into(),
        ..Summary::default()
    };
    summary.modules.insert("db".into(), Default::default());
    let items = vec![
        HistoryItem::Model(ModelChange {
            revision: 5,
            why: "first model".into(),
            actor: "operator:admin".into(),
            epoch: 2,
            time_ms: t0,
            changes: vec!["ace".into()],
        }),
        HistoryItem::Send(SendRecord {
            machine: "ace".into(),
            epoch: 3,
            sequence: 7,
            digest: digest(0xab),
            summary: std::sync::Arc::new(summary),
            why: "first send".into(),
            actor: "operator:admin".into(),
            time_ms: t0 + 1000,
            moves: vec!["db".into()],
        }),
        HistoryItem::Settings(settings_change(1, None, Some(&[("a", "1")]))),
        // Issue 27 part 5: revocations and retirements, with who and why.
        HistoryItem::Revocation(mesh::store::revoked::DenyEntry {
            target: mesh::store::revoked::RevokedTarget::Principal("replica:3".into()),
            why: "replica 3 removed from the cluster by operator:admin".into(),
            actor: "operator:admin".into(),
            epoch: 3,
            time_ms: t0 + 2000,
            by_model: false,
        }),
        HistoryItem::Revocation(mesh::store::revoked::DenyEntry {
            target: mesh::store::revoked::RevokedTarget::Serial("0a1b".into()),
            why: "disk stolen".into(),
            actor: "operator:admin".into(),
            epoch: 3,
            time_ms: t0 + 3000,
            by_model: false,
        }),
    ];
    assert_fixture("history", via(), json::HistoryJson::new(&items));
}

#[test]
fn snapshot_json_names_the_file_and_its_size() {
    let answer = json::SnapshotJson {
        file: "/backups/mesh-1.snap".into(),
        bytes: 40960,
        epoch_floor: 3,
    };
    assert_fixture("snapshot", via(), answer);
}

fn placement(module: &str, machine: &str) -> Placement {
    Placement {
        module: module.into(),
        machine: machine.into(),
    }
}

#[test]
fn check_json_composed_and_against_are_tagged() {
    let composed = CheckOutcome::Composed(vec![MachineCheck {
        machine: "ace".into(),
        digest: digest(0x42),
        modules: vec!["db".into()],
        mints: vec![Provision {
            id: "p-1".into(),
            kind: "sql".into(),
            consumer: placement("app", "ace"),
            provider: placement("db", "ace"),
            name: "db".into(),
            secret: "meshctl-check-placeholder".into(),
        }],
        grants: vec!["p-1".into()],
        summary: Summary::default(),
    }]);
    assert_fixture("check", None, json::CheckJson::from(&composed));
    let against = CheckOutcome::Against {
        changed: vec![
            MachineChange::Changed(SummaryDiff {
                machine: "ace".into(),
                changes: vec![ItemChange {
                    module: "db".into(),
                    item: "setting port".into(),
                    change: Change::Changed {
                        was: "00112233aabbccdd".into(),
                        now: "44556677eeff0011".into(),
                    },
                }],
            }),
            MachineChange::Removed("g14".into()),
        ],
        unchanged: 2,
    };
    assert_fixture("check_against", None, json::CheckJson::from(&against));
}

#[test]
fn api_errors_keep_their_kind_and_exit_code_in_json_and_name_their_cause() {
    // Issue 13 part 2: errors as JSON on stdout with --json, the same exit codes as without.
    // Issue 10 item 8 (decision 0210): the class (`kind`) and the exit code come from the
    // variant, and `cause` names the variant for programs.
    let cases = [
        (
            ApiError::Push(PushError::UnknownMachine {
                machine: "zz".into(),
            }),
            "invalid",
            "push.unknown_machine",
            2,
        ),
        (
            ApiError::NotLeader {
                replica: 2,
                leader: Some(1),
            },
            "unavailable",
            "not_leader",
            1,
        ),
        (
            ApiError::NoLeader {
                replica: 2,
                waited_ms: 3000,
                reason: "an election may be running".into(),
            },
            "unavailable",
            "no_leader",
            1,
        ),
        (
            ApiError::Apply(ApplyError::RevisionMoved {
                expected: 4,
                found: 5,
            }),
            "refused",
            "apply.revision_moved",
            1,
        ),
        (
            ApiError::Apply(ApplyError::TooLarge { bytes: 9, limit: 8 }),
            "invalid",
            "apply.too_large",
            2,
        ),
        (
            ApiError::Settings(SettingsError::Rule {
                scope: Scope::Mesh,
                rule: SettingsRule::ValueTooLarge,
                reason: "too long".into(),
            }),
            "invalid",
            "settings.value_too_large",
            2,
        ),
        (
            ApiError::Storage {
                what: "send records".into(),
                reason: "disk".into(),
            },
            "failed",
            "storage",
            1,
        ),
        (
            ApiError::Fatal {
                reason: "cannot write the floor file".into(),
            },
            "failed",
            "fatal",
            1,
        ),
    ];
    for (e, kind, cause, code) in cases {
        let e = CliError::Api(e);
        assert_eq!(e.exit_code(), code, "{e}");
        let line = json::error_document(&e);
        let doc: serde_json::Value = serde_json::from_str(&line).expect("JSON");
        assert_eq!(doc["error"]["kind"], kind, "{line}");
        assert_eq!(doc["error"]["cause"], cause, "{line}");
        assert_eq!(doc["error"]["exit_code"], code, "{line}");
        assert_eq!(doc["error"]["message"], e.to_string(), "{line}");
    }
    let usage = CliError::Usage("push needs a machine, --behind or --all".into());
    assert_matches_fixture("error_usage", &json::error_document(&usage));
    let moved = CliError::Api(ApiError::Apply(ApplyError::RevisionMoved {
        expected: 4,
        found: 5,
    }));
    assert_matches_fixture("error_apply_revision_moved", &json::error_document(&moved));
}

#[test]
fn a_command_with_json_that_fails_prints_the_error_as_json_on_stdout_with_its_exit_code() {
    // Issue 13 part 2: a script reading stdout gets a document, never an empty stdout.
    let dir = tempfile::tempdir().expect("tempdir");
    let missing = dir.path().join("none.toml").display().to_string();
    let runs: [(&[&str], &str, u8); 4] = [
        (&["status", "--json"], "usage", 1),
        (&["push", "ace", "--json"], "usage", 2),
        (
            &["settings", "set", "mesh", "-a", "--json", "--why", "w"],
            "usage",
            2,
        ),
        (&["snapshot", "save", "/", "--json"], "usage", 2),
    ];
    for (args, kind, code) in runs {
        let argv = ["meshctl", "--context", &missing]
            .into_iter()
            .chain(args.iter().copied());
        let out = mesh::cli::run(Cli::parse_from(argv)).expect("an error is an output with --json");
        assert_eq!(out.code, code, "{args:?}: {}", out.text);
        let doc: serde_json::Value = serde_json::from_str(&out.text).expect("JSON");
        assert_eq!(doc["schema"], "mesh/v1");
        assert_eq!(doc["error"]["kind"], kind, "{args:?}: {}", out.text);
        assert_eq!(doc["error"]["exit_code"], code, "{args:?}");
    }
    // Without --json the error stays an error (one line on stderr, printed by the binary).
    let argv = ["meshctl", "--context", &missing, "status"];
    assert!(mesh::cli::run(Cli::parse_from(argv)).is_err());
}

#[test]
fn replicas_list_json_names_each_member_role_and_the_retired() {
    // Issue 25 item 7: `replicas list --json`, roles as words, times RFC 3339.
    use mesh::controller::members::{MemberView, ReplicasView, RetiredView};
    let member = |id: u64, leader: bool, voter: bool, reachable: bool| MemberView {
        id,
        addr: format!("10.0.0.{id}:7101"),
        voter,
        reachable,
        leader,
        key_known: true,
    };
    let view = ReplicasView {
        answered_by: 1,
        members: vec![
            member(1, true, true, true),
            member(2, false, true, false),
            member(4, false, false, true),
        ],
        done: vec![],
        retired: vec![RetiredView {
            id: 3,
            why: "disk died".into(),
            actor: "operator:alice".into(),
            time_ms: t0,
        }],
    };
    assert_fixture("replicas_list", via(), json::ReplicasJson::from(&view));
}

#[test]
fn certs_list_json_has_rfc3339_expiry_roles_and_what_expires_soon() {
    // Issue 25 item 7: `certs list --json`; `expiring` as the text's warnings (30 days).
    use mesh::controller::certs::{CertView, CertsView, DenyView};
    let day_ms: i64 = 86_400_000;
    let now = t0 as i64;
    let cert = |principal: &str, days: i64, role| CertView {
        principal: principal.into(),
        serial: format!("{:040x}", days),
        not_after_ms: now + days * day_ms,
        role,
    };
    let view = CertsView {
        replica: 1,
        own: Some(cert("replica:1", 365, None)),
        peers: vec![
            cert("replica:2", 10, None),
            cert("operator:alice", 200, Some(mesh_transport::Role::Viewer)),
        ],
        cas: 1,
        denied: vec![DenyView {
            target: "host:old".into(),
            why: "stolen".into(),
            actor: "operator:alice".into(),
            time_ms: t0,
        }],
    };
    assert_fixture("certs_list", via(), json::CertsJson::new(&view, now));
}

#[test]
fn logs_json_is_one_document_per_line_with_a_rotation_when_following() {
    // Issue 25 item 7: `logs --json` prints JSON lines, one document per line a module wrote.
    use mesh::core::wire::{LogChunk, LogStream};
    let chunk = LogChunk {
        module: "db".into(),
        stream: LogStream::Stderr,
        start: 0,
        end: 40,
        lines: vec!["starting".into(), "ready on :5432".into()],
        more: false,
        rotated: true,
    };
    let via = via().expect("via");
    let text = json::log_documents(via, &chunk, false).expect("renders");
    assert_eq!(text.lines().count(), 2, "{text}");
    let following = json::log_documents(via, &chunk, true).expect("renders");
    let lines: Vec<&str> = following.lines().collect();
    assert_eq!(lines.len(), 3, "{following}");
    assert_matches_fixture("logs_rotated", lines[0]);
    assert_matches_fixture("logs_line", lines[1]);
    let second: serde_json::Value = serde_json::from_str(lines[2]).expect("json");
    assert_eq!(second["answer"]["line"], "ready on :5432", "{second}");
}

// --- `events --json` (issue 25 item 5, decision 0308) ---

fn crash_event() -> mesh::controller::events::Event {
    use mesh::controller::events::{Event, EventKind};
    Event {
        index: 4,
        at_ms: 1_796_304_039_200,
        kind: EventKind::ModuleRestarted,
        machine: Some("g14".into()),
        module: Some("broker".into()),
        text: "broker ended (signal 9) and was started again (1 restarts); now waiting".into(),
    }
}

#[test]
fn events_json_names_each_event_with_its_cursor_kind_and_place() {
    // Issue 25 item 5: `events --json` is one document of the events kept, each with the cursor
    // it is at (term, index), an RFC 3339 time, a kebab-case kind and machine/module or null.
    let answer = json::EventsJson {
        term: 2,
        earlier: 3,
        events: vec![json::EventJson::new(2, &crash_event())],
    };
    assert_fixture("events", via(), answer);
}

#[test]
fn events_follow_json_is_one_document_per_event_or_gap() {
    // Issue 25 item 5: `events --follow --json` prints a document a line: a gap when the leader
    // changed (events may be lost), then each event.
    use mesh::controller::events::EventsGap;
    let gap = json::EventFollowJson::Gap {
        gap: json::GapJson::new(3, &EventsGap::OlderTerm { term: 2 }),
    };
    let line = json::document(via(), gap).expect("renders");
    assert_matches_fixture("events_follow_gap", &line);
    let event = json::EventFollowJson::Event {
        event: json::EventJson::new(3, &crash_event()),
    };
    let line = json::document(via(), event).expect("renders");
    assert_matches_fixture("events_follow_event", &line);
}
