//! The error types' own rules: one cause per variant, the class decision 0062 gives it, the wire
//! keeping the variant, and the mappings the operations use.

use std::collections::BTreeSet;

use super::*;
use crate::controller::api::Answer;
use crate::controller::service::answer_what;

/// One of every variant (and every settings rule), with the class it must have.
fn samples() -> Vec<(ApiError, ErrorClass)> {
    use ErrorClass::*;
    let s = |s: &str| s.to_string();
    let upload = UploadId([3; 16]);
    let mut all = vec![
        (ApiError::BadRequest { reason: s("r") }, Invalid),
        (
            ApiError::NotLeader {
                replica: 2,
                leader: Some(1),
            },
            Unavailable,
        ),
        (
            ApiError::NoLeader {
                replica: 2,
                waited_ms: 1,
                reason: s("r"),
            },
            Unavailable,
        ),
        (
            ApiError::LeaderUnreachable {
                replica: 2,
                leader: 1,
                reason: s("r"),
            },
            Unavailable,
        ),
        (ApiError::LeaderAnswerUnreadable { reason: s("r") }, Failed),
        (
            ApiError::NoLease {
                replica: 1,
                reason: s("r"),
            },
            Unavailable,
        ),
        (ApiError::NotCommitted { reason: s("r") }, Unavailable),
        (
            ApiError::refused(Refusal::StaleEpoch { epoch: 1, term: 2 }),
            Refused,
        ),
        (
            ApiError::refused(Refusal::RevisionMoved {
                expected: 1,
                actual: 2,
            }),
            Refused,
        ),
        (
            ApiError::refused(Refusal::SequenceOutOfOrder {
                machine: s("m"),
                got: 1,
                expected: 2,
            }),
            Refused,
        ),
        (ApiError::refused(Refusal::Invalid(s("r"))), Refused),
        (
            ApiError::Storage {
                what: s("w"),
                reason: s("r"),
            },
            Failed,
        ),
        (ApiError::Random { what: s("w") }, Failed),
        (ApiError::Fatal { reason: s("r") }, Failed),
        (ApiError::internal("r"), Failed),
        (
            ApiError::Timeout {
                what: s("w"),
                waited_ms: 1,
            },
            Failed,
        ),
        (ApiError::ProposalTooLarge { bytes: 2, limit: 1 }, Failed),
        (ApiError::RaftFailed { reason: s("r") }, Failed),
        (
            ApiError::Forbidden {
                operator: s("o"),
                command: s("c"),
                needed: mesh_transport::Role::Admin,
                held: mesh_transport::Role::Viewer,
            },
            Refused,
        ),
        (
            ApplyError::Invalid {
                problems: vec![s("p")],
            }
            .into(),
            Invalid,
        ),
        (
            ApplyError::DoesNotCompose {
                machine: s("m"),
                reason: s("r"),
            }
            .into(),
            Invalid,
        ),
        (
            ApplyError::WouldDropRunning {
                machines: vec![(s("m"), s("w"))],
            }
            .into(),
            Invalid,
        ),
        (
            ApplyError::RevisionMoved {
                expected: 1,
                found: 2,
            }
            .into(),
            Refused,
        ),
        (ApplyError::TooLarge { bytes: 2, limit: 1 }.into(), Invalid),
        (ApplyError::Unencodable { reason: s("r") }.into(), Invalid),
        (
            ApplyError::ChunkTooLarge {
                upload,
                index: 0,
                bytes: 2,
                limit: 1,
            }
            .into(),
            Invalid,
        ),
        (
            ApplyError::ChunkNotStaged {
                upload,
                index: 0,
                reason: s("r"),
                limit: 1,
            }
            .into(),
            Failed,
        ),
        (
            ApplyError::UploadUnusable {
                upload,
                reason: s("r"),
            }
            .into(),
            Invalid,
        ),
        (
            SettingsError::UnknownScope {
                scope: Scope::Mesh,
                reason: s("r"),
            }
            .into(),
            Invalid,
        ),
        (
            SettingsError::RefusedAtApply {
                scope: Scope::Mesh,
                reason: s("r"),
            }
            .into(),
            Refused,
        ),
        (SettingsError::HistoryPaged.into(), Invalid),
        (PushError::NoReason.into(), Invalid),
        (
            PushError::UnknownMachine { machine: s("m") }.into(),
            Invalid,
        ),
        (PushError::DoesNotCompose { reason: s("r") }.into(), Invalid),
        (
            PushError::MoveNotApplicable {
                module: s("m"),
                reason: s("r"),
            }
            .into(),
            Invalid,
        ),
        (PushError::PlanFailed { reason: s("r") }.into(), Failed),
        (
            PushError::PlanMoved {
                token: s("t"),
                moved: s("m"),
            }
            .into(),
            Refused,
        ),
        (
            PushError::Busy {
                replica: 1,
                waited_ms: 1,
            }
            .into(),
            Unavailable,
        ),
        (
            PushError::AlreadyRan {
                request: s("q"),
                machines: vec![],
            }
            .into(),
            Refused,
        ),
        (
            PushError::StoreRefused {
                what: s("mints"),
                reason: s("r"),
            }
            .into(),
            Refused,
        ),
        (PushError::EngineStopped { epoch: 1 }.into(), Failed),
        (
            GenesisError::UnknownMachine { machine: s("m") }.into(),
            Invalid,
        ),
        (
            GenesisError::AlreadySent {
                machine: s("m"),
                sequence: 1,
                epoch: 1,
            }
            .into(),
            Invalid,
        ),
        (
            GenesisError::NotSealed {
                machine: s("m"),
                lines: s("l"),
            }
            .into(),
            Unavailable,
        ),
        (
            SnapshotError::NotHeld {
                snapshot: 1,
                replica: 1,
                held_ms: 1,
            }
            .into(),
            Invalid,
        ),
        (
            SnapshotError::BackupFailed { reason: s("r") }.into(),
            Failed,
        ),
        (
            CertsError::NotReloaded {
                replica: 1,
                reason: s("r"),
            }
            .into(),
            Invalid,
        ),
        (
            CertsError::BadTarget {
                target: s("t"),
                reason: s("r"),
            }
            .into(),
            Invalid,
        ),
        (
            LogsError::LinesOutOfRange { lines: 0, max: 1 }.into(),
            Invalid,
        ),
        (
            LogsError::TooManyCursors { count: 2, max: 1 }.into(),
            Invalid,
        ),
        (
            LogsError::UnknownMachine {
                machine: s("m"),
                replica: 1,
                known: vec![],
            }
            .into(),
            Invalid,
        ),
        (
            LogsError::HostRefused {
                machine: s("m"),
                reason: s("r"),
            }
            .into(),
            Invalid,
        ),
        (
            LogsError::HostUnreachable {
                machine: s("m"),
                reason: s("r"),
            }
            .into(),
            Unavailable,
        ),
        (
            LogsError::AnswerUnreadable {
                machine: s("m"),
                reason: s("r"),
            }
            .into(),
            Failed,
        ),
        (
            LogsError::WrongMachine {
                asked: s("a"),
                answered: s("b"),
            }
            .into(),
            Failed,
        ),
    ];
    let rules = [
        SettingsRule::NoLayer,
        SettingsRule::RemovalWithoutReplace,
        SettingsRule::BadAssignment,
        SettingsRule::EmptyValue,
        SettingsRule::SetAndRemoved,
        SettingsRule::RepeatedKey,
        SettingsRule::BadKey,
        SettingsRule::ControlCharacter,
        SettingsRule::ValueTooLarge,
    ];
    for rule in rules {
        let e = SettingsError::Rule {
            scope: Scope::Mesh,
            rule,
            reason: s("r"),
        };
        all.push((e.into(), Invalid));
    }
    all
}

#[test]
fn every_error_variant_has_its_own_stable_cause_and_the_class_of_decision_0062() {
    let mut causes = BTreeSet::new();
    for (e, class) in samples() {
        assert_eq!(e.class(), class, "{e:?}");
        let code = if class == ErrorClass::Invalid { 2 } else { 1 };
        assert_eq!(e.exit_code(), code, "{e:?}");
        let cause = e.cause();
        assert!(
            cause
                .chars()
                .all(|c| c.is_ascii_lowercase() || c == '_' || c == '.'),
            "{cause}"
        );
        assert!(causes.insert(cause), "cause {cause} names two variants");
        assert!(!e.to_string().is_empty(), "{e:?} says nothing");
    }
}

#[test]
fn an_answer_carries_each_error_variant_across_the_wire_unchanged() {
    for (e, _) in samples() {
        let answer = Answer {
            replica: 1,
            forwarded_by: Some(2),
            body: Err(e),
        };
        let bytes = mesh_codec::encode(answer_what, &answer).expect("encodes");
        let back: Answer = mesh_codec::decode(answer_what, &bytes).expect("decodes");
        assert_eq!(back, answer);
    }
}

#[test]
fn apply_with_a_moved_revision_is_revision_moved_and_meshctl_exits_1() {
    let e = crate::controller::ops::apply_refused(Refusal::RevisionMoved {
        expected: 4,
        actual: 5,
    });
    assert_eq!(
        e,
        ApiError::Apply(ApplyError::RevisionMoved {
            expected: 4,
            found: 5
        })
    );
    assert_eq!(e.cause(), "apply.revision_moved");
    let text = e.to_string();
    assert!(text.contains('4') && text.contains('5'), "{text}");
    let cli = crate::cli::CliError::Api(e);
    assert_eq!(cli.exit_code(), 1);
    let doc: serde_json::Value =
        serde_json::from_str(&crate::cli::json::error_document(&cli)).expect("JSON");
    assert_eq!(doc["error"]["cause"], "apply.revision_moved");
    assert_eq!(doc["error"]["kind"], "refused");
    // Any other refusal stays the store's.
    let stale = crate::controller::ops::apply_refused(Refusal::StaleEpoch { epoch: 1, term: 2 });
    assert_eq!(stale.cause(), "store.stale_epoch");
}

#[test]
fn a_settings_write_refused_at_apply_is_the_settings_refusal_naming_its_scope() {
    let scope = Scope::Machine("ace".into());
    let e = crate::controller::ops::settings_refused(
        &scope,
        ApiError::refused(Refusal::Invalid("no layer".into())),
    );
    assert_eq!(
        e,
        ApiError::Settings(SettingsError::RefusedAtApply {
            scope,
            reason: "no layer".into()
        })
    );
    assert_eq!(e.exit_code(), 1);
    let other = ApiError::NotLeader {
        replica: 1,
        leader: None,
    };
    assert_eq!(
        crate::controller::ops::settings_refused(&Scope::Mesh, other.clone()),
        other
    );
}

#[test]
fn a_settings_rule_is_named_by_the_core_error_it_comes_from() {
    use crate::core::settings::SettingsError as Core;
    let cases = [
        (Core::NoLayer, "settings.no_layer"),
        (
            Core::ValueTooLarge {
                key: "k".into(),
                bytes: 2,
                max: 1,
            },
            "settings.value_too_large",
        ),
        (
            Core::RemovalWithoutReplace {
                keys: vec!["k".into()],
            },
            "settings.removal_without_replace",
        ),
    ];
    for (core, cause) in cases {
        let e = ApiError::from(SettingsError::Rule {
            scope: Scope::Mesh,
            rule: SettingsRule::of(&core),
            reason: core.to_string(),
        });
        assert_eq!(e.cause(), cause);
    }
}

#[test]
fn a_chunk_over_raft_s_batch_limit_is_chunk_not_staged_naming_the_chunk() {
    let upload = UploadId([9; 16]);
    let too_large = ApiError::ProposalTooLarge { bytes: 9, limit: 8 };
    let e = crate::controller::upload::chunk_refused(upload, 3, too_large);
    assert!(
        matches!(
            &e,
            ApiError::Apply(ApplyError::ChunkNotStaged { upload: u, index: 3, .. }) if *u == upload
        ),
        "{e:?}"
    );
    assert!(e.to_string().contains("batch_bytes_max"), "{e}");
    let gone = ApiError::NotCommitted {
        reason: "stopping".into(),
    };
    assert_eq!(
        crate::controller::upload::chunk_refused(upload, 3, gone.clone()),
        gone
    );
}
