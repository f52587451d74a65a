//! Per-connection limits: a flood of streams beyond `streams_per_connection_max` waits for
//! credit instead of piling into the handler, and the server keeps serving others meanwhile.

mod support;

use std::sync::atomic::Ordering::SeqCst;

use mesh_transport::MessageKind;
use support::*;

#[tokio::test]
async fn streams_beyond_the_limit_wait_and_the_server_keeps_serving_others() {
    // Limits: streams_per_connection_max bounds what one peer has in flight.
    let pki = Pki::new();
    let streams = 4;
    let (server, recorder) =
        serving_with(pki.identity(&replica(1)), small_config(streams, 1 << 20));
    recorder.block();
    let alice = client(&pki, &operator("alice"));
    let mut flood = Vec::new();
    for i in 0..(streams * 2) {
        let alice = alice.clone();
        let addr = server.local_addr();
        flood.push(tokio::spawn(async move {
            alice
                .request(
                    addr,
                    MessageKind::Command,
                    format!("slow{i}").into_bytes(),
                    timeout,
                )
                .await
        }));
    }
    let limit = streams as usize;
    wait_for("the first streams in the handler", || {
        recorder.slow_in_handler.load(SeqCst) >= limit
    })
    .await;
    let bob = client(&pki, &operator("bob"));
    let ok = bob
        .request(
            server.local_addr(),
            MessageKind::Command,
            b"fast".to_vec(),
            timeout,
        )
        .await;
    assert_eq!(
        ok,
        Ok(b"echo:fast".to_vec()),
        "another peer is served during the flood"
    );
    assert_eq!(recorder.slow_in_handler_max.load(SeqCst), limit);
    recorder.release();
    for request in flood {
        let answer = request.await.expect("join").expect("request");
        assert!(answer.starts_with(b"echo:slow"));
    }
    assert_eq!(recorder.slow_in_handler_max.load(SeqCst), limit);
    assert_eq!(alice.counts().dials, 1);
}

#[tokio::test]
async fn a_dead_peer_does_not_block_calls_to_live_ones() {
    // A socket that never answers: dials to it hang until their deadline.
    let pki = Pki::new();
    let silent = std::net::UdpSocket::bind(any_port()).expect("silent socket");
    let dead = silent.local_addr().expect("addr");
    let (live, _) = serving(&pki, &replica(2));
    let leader = client(&pki, &replica(1));
    let stuck = {
        let leader = leader.clone();
        tokio::spawn(async move {
            let long = std::time::Duration::from_secs(60);
            leader
                .request(dead, MessageKind::Raft, b"x".to_vec(), long)
                .await
        })
    };
    let ok = leader
        .request(live.local_addr(), MessageKind::Raft, b"y".to_vec(), timeout)
        .await;
    assert_eq!(ok, Ok(b"echo:y".to_vec()));
    assert!(
        !stuck.is_finished(),
        "the dial to the dead peer should still be pending"
    );
    stuck.abort();
}

/// Floods `server` from `from` with `count` slow requests of `kind` while its handler is
/// blocked; returns the most that were in the handler at once, once every one was answered.
async fn most_in_handler(
    pki: &Pki,
    from: &mesh_transport::Principal,
    kind: MessageKind,
    count: usize,
    expect: usize,
) -> usize {
    let (server, recorder) = serving_with(pki.identity(&replica(1)), small_config(64, 1 << 20));
    recorder.block();
    let peer = client(pki, from);
    let mut flood = Vec::new();
    for i in 0..count {
        let (peer, kind) = (peer.clone(), kind.clone());
        let addr = server.local_addr();
        flood.push(tokio::spawn(async move {
            peer.request(addr, kind, format!("slow{i}").into_bytes(), timeout)
                .await
        }));
    }
    wait_for("the flood's first streams in the handler", || {
        recorder.slow_in_handler.load(SeqCst) >= expect
    })
    .await;
    recorder.release();
    for request in flood {
        let answer = request.await.expect("join").expect("request");
        assert!(answer.starts_with(b"echo:slow"));
    }
    assert_eq!(peer.counts().dials, 1, "one connection carried the flood");
    recorder.slow_in_handler_max.load(SeqCst)
}

#[tokio::test]
async fn limits_replicas_and_operators_get_the_full_stream_credit_a_host_only_a_few() {
    // An accepted connection starts at `streams_unproven` streams (quinn keeps a slot per stream
    // id the peer may open; decision 0282) and is raised once the peer's certificate says it is an
    // operator or a replica. A host sends one report at a time: its credit is lowered to
    // `host_streams_max` (issue 23), so one host certificate's frames in flight stay few.
    let pki = Pki::new();
    let host_streams = mesh_transport::tls::host_streams_max as usize;
    let operator_max =
        most_in_handler(&pki, &operator("alice"), MessageKind::Command, 64, 64).await;
    assert_eq!(
        operator_max, 64,
        "an operator's connection is raised to the config's 64 streams"
    );
    let replica_max = most_in_handler(&pki, &replica(2), MessageKind::Raft, 64, 64).await;
    assert_eq!(
        replica_max, 64,
        "a replica's connection is raised to the config's 64 streams"
    );
    let host = host("ace");
    let host_max = most_in_handler(&pki, &host, report("ace"), 32, host_streams).await;
    assert_eq!(
        host_max, host_streams,
        "a host has {host_streams} streams in flight at most"
    );
}
