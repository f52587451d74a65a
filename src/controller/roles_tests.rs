//! The roles table (G10, decision 0295): every request against every role.

use std::sync::Arc;

use super::*;
use crate::controller::api::{Chunk, HistoryQuery, LogsAsk, PushTarget, UploadId};
use crate::core::settings::Scope;

fn reads() -> Vec<Request> {
    vec![
        Request::Status,
        Request::Plan {
            target: PushTarget::Behind,
            moves: vec![],
        },
        Request::History {
            query: HistoryQuery::default(),
        },
        Request::SettingsShow {
            scope: None,
            history: true,
        },
        Request::Logs {
            machine: "ace".into(),
            ask: LogsAsk {
                module: None,
                lines: 10,
                from: vec![],
            },
        },
        Request::CertsList,
        Request::ReplicasList,
        // `meshctl events` (issue 25 item 5): a read of the leader's event log.
        Request::Events {
            query: crate::controller::events::EventsQuery {
                from: crate::controller::events::EventsFrom::Oldest,
                machine: None,
                limit: 10,
                wait_ms: 0,
            },
        },
        Request::ModelShow { revision: Some(3) },
    ]
}

fn changes() -> Vec<Request> {
    let why = || "test".to_string();
    vec![
        Request::Rollback {
            to_revision: 3,
            why: why(),
            drain: false,
        },
        Request::SettingsRollback {
            scope: Scope::Mesh,
            to: 2,
            why: why(),
        },
        Request::Apply {
            mesh: Default::default(),
            why: why(),
            drain: false,
        },
        Request::ApplyChunk {
            upload: UploadId([1; 16]),
            index: 0,
            chunks_total: 1,
            bytes_total: 1,
            bytes: Chunk(Arc::new(vec![1])),
        },
        Request::ApplyUpload {
            upload: UploadId([1; 16]),
            digest: [2; 32],
            why: why(),
            drain: false,
        },
        Request::SettingsSet {
            scope: Scope::Mesh,
            layer: Default::default(),
            remove: Default::default(),
            replace: false,
            why: why(),
        },
        Request::SettingsClear {
            scope: Scope::Mesh,
            why: why(),
        },
        Request::Push {
            target: PushTarget::All,
            why: why(),
            moves: vec![],
            plan: None,
        },
        Request::Genesis {
            machine: "g14".into(),
            why: why(),
        },
    ]
}

fn admin_only() -> Vec<Request> {
    vec![
        Request::CertsReload,
        Request::CertsRevoke {
            target: "operator:old".into(),
            why: "left".into(),
        },
        Request::ReplicasAdd {
            id: 4,
            addr: "127.0.0.1:7000".into(),
            key: [3; 32],
        },
        Request::ReplicasRemove { id: 3 },
        Request::SnapshotChunk {
            snapshot: None,
            offset: 0,
        },
    ]
}

#[test]
fn g10_a_viewer_may_read_and_nothing_else_an_operator_may_change_the_model_an_admin_everything() {
    // G10 (who may send what), decision 0295: the roles table, request by request.
    let table = [
        (reads(), [true, true, true]),
        (changes(), [false, true, true]),
        (admin_only(), [false, false, true]),
    ];
    let mut seen = 0;
    for (requests, allowed) in &table {
        for request in requests {
            seen += 1;
            for (role, want) in Role::all.iter().zip(allowed) {
                let got = check("alice", Some(*role), request);
                assert_eq!(got.is_ok(), *want, "{role} asking {request:?}: {got:?}");
            }
            // A certificate from before roles states none and may ask everything it could.
            assert!(check("alice", None, request).is_ok(), "{request:?}");
        }
    }
    // Every variant of Request (23) is in one of the lists.
    assert_eq!(seen, 23, "a request is missing from the table test");
}

#[test]
fn g10_a_refusal_names_the_operator_both_roles_and_the_way_to_the_role_needed() {
    // G10, decision 0295: the refusal says who, what it holds, what is needed and how to get it.
    let push = Request::Push {
        target: PushTarget::All,
        why: "x".into(),
        moves: vec![],
        plan: None,
    };
    let refused = check("monitor", Some(Role::Viewer), &push);
    let Err(error) = refused else {
        panic!("a viewer's push was allowed");
    };
    assert_eq!(error.cause(), "forbidden");
    assert_eq!(error.class(), crate::controller::api::ErrorClass::Refused);
    let text = error.to_string();
    for part in [
        "operator:monitor",
        "role viewer",
        "`push` needs role operator",
        "meshctl certs issue operator:monitor --role operator",
        "nothing was done",
    ] {
        assert!(text.contains(part), "{part:?} missing from: {text}");
    }
}
