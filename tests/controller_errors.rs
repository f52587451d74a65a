//! Issue 10 item 8 (decision 0210): every operation fails with its own error variant, whose fields
//! say what went wrong, whose class decides meshctl's exit code, and which reaches the operator
//! unchanged through a follower's forward. Three replicas over real QUIC and one in-process host.

mod controller_common;

use std::collections::{BTreeMap, BTreeSet};

use controller_common::*;
use mesh::controller::api::{
    ApiError, ApplyError, Body, CertsError, ErrorClass, GenesisError, LogsAsk, LogsError,
    PushError, PushOutcome, PushTarget, Request, SettingsError, SettingsRule, SnapshotError,
};
use mesh::core::model::{Mesh, Provide};
use mesh::core::settings::Scope;

fn error_of(answer: mesh::controller::api::Answer) -> ApiError {
    match answer.body {
        Err(e) => e,
        Ok(body) => panic!("expected an error, got {body:?}"),
    }
}

fn revision(body: Body) -> u64 {
    match body {
        Body::Status(view) => view.revision,
        other => panic!("not a status: {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_operation_fails_with_its_own_variant_and_class_through_leader_and_follower() {
    let bed = Bed::start(&["ace"], &[]).await;
    let leader = bed.wait_leader().await;
    let follower = bed.follower(leader);
    bed.apply(leader, &mount_mesh("/srv/a")).await;
    let pushed = bed.push(leader, "ace", &[]).await.expect("push");
    let Body::Push(view) = &pushed else {
        panic!("{pushed:?}")
    };
    assert!(
        view.lines
            .iter()
            .all(|l| matches!(l.outcome, PushOutcome::Applied { .. })),
        "{pushed:?}"
    );
    let before = revision(bed.ok(leader, &Request::Status).await);

    // apply: a file that breaks the rules names every problem; a file that drops a machine
    // still running names it; both are bad input (exit 2) and store nothing.
    // Two modules of ace listening on one port: a rule `meshctl check` checks.
    let mut broken = mount_mesh("/srv/a");
    for name in ["one", "two"] {
        let mut module = sleeper(name, "ace");
        module.provides.push(Provide {
            kind: name.into(),
            port: Some(5999),
        });
        broken.modules.insert(name.into(), module);
    }
    let apply = |mesh: Mesh| Request::Apply {
        mesh,
        why: "errors test".into(),
        drain: false,
    };
    for via in [leader, follower] {
        match error_of(bed.ask(via, &apply(broken.clone())).await) {
            ApiError::Apply(ApplyError::Invalid { problems }) => {
                assert!(
                    problems.len() == 1 && problems[0].contains("5999"),
                    "{problems:?}"
                )
            }
            other => panic!("via {via}: {other:?}"),
        }
        let e = error_of(bed.ask(via, &apply(Mesh::default())).await);
        assert!(
            matches!(&e, ApiError::Apply(ApplyError::WouldDropRunning { machines })
                if machines.len() == 1 && machines[0].0 == "ace"),
            "via {via}: {e:?}"
        );
        assert_eq!((e.class(), e.exit_code()), (ErrorClass::Invalid, 2));
        assert_eq!(e.cause(), "apply.would_drop_running");
        assert!(e.to_string().contains("--drain"), "{e}");
    }

    // settings: an unknown scope, a rule broken (by name), a layer that is not there, and a
    // history asked in one answer.
    let set = |scope: Scope, value: &str| Request::SettingsSet {
        scope,
        layer: BTreeMap::from([("k".to_string(), value.to_string())]),
        remove: BTreeSet::new(),
        replace: false,
        why: "errors test".into(),
    };
    let e = error_of(
        bed.ask(follower, &set(Scope::Machine("nowhere".into()), "v"))
            .await,
    );
    assert!(
        matches!(&e, ApiError::Settings(SettingsError::UnknownScope { scope, .. })
            if *scope == Scope::Machine("nowhere".into())),
        "{e:?}"
    );
    let e = error_of(bed.ask(leader, &set(Scope::Mesh, "a\u{1b}b")).await);
    assert!(
        matches!(
            &e,
            ApiError::Settings(SettingsError::Rule {
                rule: SettingsRule::ControlCharacter,
                ..
            })
        ),
        "{e:?}"
    );
    assert_eq!(
        (e.cause(), e.exit_code()),
        ("settings.control_character", 2)
    );
    let clear = Request::SettingsClear {
        scope: Scope::Module("broker".into()),
        why: "errors test".into(),
    };
    let e = error_of(bed.ask(leader, &clear).await);
    assert!(
        matches!(
            &e,
            ApiError::Settings(SettingsError::Rule {
                rule: SettingsRule::NoLayer,
                ..
            })
        ),
        "{e:?}"
    );
    let show = Request::SettingsShow {
        scope: None,
        history: true,
    };
    let e = error_of(bed.ask(leader, &show).await);
    assert_eq!(e, ApiError::Settings(SettingsError::HistoryPaged));

    // plan and push: no reason, an unknown machine.
    let push = |target: PushTarget, why: &str| Request::Push {
        target,
        why: why.into(),
        moves: vec![],
        plan: None,
    };
    let e = error_of(bed.ask(follower, &push(PushTarget::All, " ")).await);
    assert_eq!(e, ApiError::Push(PushError::NoReason));
    let nowhere = PushTarget::Machine("nowhere".into());
    let e = error_of(bed.ask(leader, &push(nowhere.clone(), "w")).await);
    let unknown = ApiError::Push(PushError::UnknownMachine {
        machine: "nowhere".into(),
    });
    assert_eq!(e, unknown);
    let plan = Request::Plan {
        target: nowhere,
        moves: vec![],
    };
    assert_eq!(error_of(bed.ask(follower, &plan).await), unknown);
    assert_eq!(unknown.exit_code(), 2);

    // genesis: a machine not in the model, and one that already ran.
    let genesis = |machine: &str| Request::Genesis {
        machine: machine.into(),
        why: "errors test".into(),
    };
    let e = error_of(bed.ask(leader, &genesis("nowhere")).await);
    assert!(
        matches!(&e, ApiError::Genesis(GenesisError::UnknownMachine { machine }) if machine == "nowhere"),
        "{e:?}"
    );
    let e = error_of(bed.ask(follower, &genesis("ace")).await);
    assert!(
        matches!(&e, ApiError::Genesis(GenesisError::AlreadySent { machine, sequence: 1, .. }) if machine == "ace"),
        "{e:?}"
    );

    // snapshot: a backup this replica does not hold.
    let chunk = Request::SnapshotChunk {
        snapshot: Some(7),
        offset: 0,
    };
    let e = error_of(bed.ask(leader, &chunk).await);
    assert!(
        matches!(e, ApiError::Snapshot(SnapshotError::NotHeld { snapshot: 7, replica, .. }) if replica == leader),
        "{e:?}"
    );

    // logs (answered by the replica asked): a line count out of range, an unknown machine.
    let logs = |machine: &str, lines: u32| Request::Logs {
        machine: machine.into(),
        ask: LogsAsk {
            module: None,
            lines,
            from: vec![],
        },
    };
    let e = error_of(bed.ask(follower, &logs("ace", 0)).await);
    assert!(
        matches!(
            e,
            ApiError::Logs(LogsError::LinesOutOfRange { lines: 0, .. })
        ),
        "{e:?}"
    );
    let e = error_of(bed.ask(follower, &logs("nowhere", 10)).await);
    assert!(
        matches!(&e, ApiError::Logs(LogsError::UnknownMachine { machine, replica, known })
            if machine == "nowhere" && *replica == follower && known == &["ace".to_string()]),
        "{e:?}"
    );

    // certs: a target that is neither a serial nor a principal.
    let revoke = Request::CertsRevoke {
        target: "not a serial".into(),
        why: "errors test".into(),
    };
    let e = error_of(bed.ask(follower, &revoke).await);
    assert!(
        matches!(&e, ApiError::Certs(CertsError::BadTarget { target, .. }) if target == "not a serial"),
        "{e:?}"
    );

    // Nothing of it was written.
    assert_eq!(revision(bed.ok(follower, &Request::Status).await), before);
    bed.shutdown().await;
}
