//! Operator requests on three replicas over real QUIC: a request asked again with its id (its
//! answer was lost, meshctl asked another replica) is answered with its first outcome and runs
//! once (issue 10 item 4); concurrent settings writes go through without a lease round each.

mod controller_common;

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use controller_common::*;
use mesh::controller::api::{Answer, Body, Call, HistoryItem, HistoryQuery, Request, RequestId};
use mesh::core::settings::Scope;
use mesh_transport::{MessageKind, Peer, Principal};

async fn ask_call(bed: &Bed, replica: u64, call: &Call) -> Answer {
    let body = mesh_codec::encode("request", call).expect("encode");
    let peer = Peer::expecting(bed.addrs[&replica], Principal::Replica(replica));
    let bytes = bed
        .operator
        .request(peer, MessageKind::Command, body, Duration::from_secs(30))
        .await
        .expect("replica answers");
    mesh_codec::decode("answer", &bytes).expect("decode answer")
}

fn set(key: &str, value: &str) -> Request {
    Request::SettingsSet {
        scope: Scope::Mesh,
        layer: BTreeMap::from([(key.to_string(), value.to_string())]),
        remove: BTreeSet::new(),
        replace: false,
        why: "test".into(),
    }
}

async fn settings_rows(bed: &Bed, replica: u64) -> usize {
    let show = Request::History {
        query: HistoryQuery {
            limit: 1_000,
            settings_only: true,
            ..Default::default()
        },
    };
    match bed.ok(replica, &show).await {
        Body::History(page) => page
            .items
            .iter()
            .filter(|i| matches!(i, HistoryItem::Settings(_)))
            .count(),
        other => panic!("{other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_asked_again_through_another_replica_runs_once_with_its_first_answer() {
    let bed = Bed::start(&[], &[]).await;
    let leader = bed.wait_leader().await;
    bed.apply(leader, &mount_mesh("/srv/a")).await;
    let follower = bed.follower(leader);
    let before = settings_rows(&bed, leader).await;

    let call = Call {
        id: RequestId([42; 16]),
        request: set("region", "eu"),
    };
    let first = ask_call(&bed, leader, &call).await;
    assert!(
        matches!(first.body, Ok(Body::SettingsSet { .. })),
        "{first:?}"
    );
    // The same id again, through a follower (it forwards), as meshctl does after a lost answer.
    let again = ask_call(&bed, follower, &call).await;
    assert_eq!(
        again.body, first.body,
        "the retry is answered with the first outcome"
    );
    assert_eq!(again.forwarded_by, Some(follower));
    assert_eq!(
        settings_rows(&bed, leader).await,
        before + 1,
        "the request ran once: one history row"
    );

    // A new id is a new request.
    let other = Call::new(set("region", "us")).expect("an id");
    let third = ask_call(&bed, leader, &other).await;
    assert!(
        matches!(third.body, Ok(Body::SettingsSet { .. })),
        "{third:?}"
    );
    assert_eq!(settings_rows(&bed, leader).await, before + 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_settings_writes_each_get_their_own_answer_and_history_row() {
    // G6 under load: writes from many clients at once go into shared proposals, and each still
    // answers for its own key and leaves its own history row.
    let bed = Bed::start(&[], &[]).await;
    let leader = bed.wait_leader().await;
    bed.apply(leader, &mount_mesh("/srv/a")).await;
    let before = settings_rows(&bed, leader).await;
    let writers = 64;
    let asks = (0..writers).map(|i| {
        let bed = &bed;
        async move {
            let replica = [1, 2, 3][i % 3];
            let call = Call::new(set(&format!("k{i}"), "v")).expect("an id");
            (i, ask_call(bed, replica, &call).await)
        }
    });
    for (i, answer) in futures::future::join_all(asks).await {
        match answer.body {
            Ok(Body::SettingsSet { added, .. }) => assert_eq!(added, vec![format!("k{i}")]),
            other => panic!("writer {i}: {other:?}"),
        }
    }
    assert_eq!(settings_rows(&bed, leader).await, before + writers);
}
