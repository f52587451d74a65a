//! Request/response and one-way messages between principals over real QUIC on loopback:
//! delivery, principals taken from certificates, connection reuse, and re-dial after restart.

mod support;

use mesh_transport::{Endpoint, MessageKind, Peer, TransportError};
use support::*;

#[tokio::test]
async fn request_reaches_handler_with_principal_from_certificate() {
    // G10: the handler learns who sent a message from the peer's certificate, not the message.
    let pki = Pki::new();
    let (server, recorder) = serving(&pki, &replica(1));
    let alice = client(&pki, &operator("alice"));
    let answer = alice
        .request(
            server.local_addr(),
            MessageKind::Command,
            b"hi".to_vec(),
            timeout,
        )
        .await
        .expect("request");
    assert_eq!(answer, b"echo:hi");
    let seen = recorder.seen();
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].from, operator("alice"));
    assert_eq!(seen[0].kind, MessageKind::Command);
}

#[tokio::test]
async fn one_way_message_is_delivered_and_acknowledged() {
    let pki = Pki::new();
    let (server, recorder) = serving(&pki, &replica(1));
    let ace = client(&pki, &host("ace"));
    ace.send_one_way(server.local_addr(), report("ace"), b"up".to_vec(), timeout)
        .await
        .expect("one way");
    wait_for("one-way delivery", || recorder.seen().len() == 1).await;
    let seen = recorder.seen();
    assert!(seen[0].one_way);
    assert_eq!(seen[0].from, host("ace"));
    assert_eq!(seen[0].body, b"up");
}

#[tokio::test]
async fn replicas_both_serve_and_dial_on_one_endpoint() {
    let pki = Pki::new();
    let (one, seen_by_one) = serving(&pki, &replica(1));
    let (two, seen_by_two) = serving(&pki, &replica(2));
    let a = one.request(
        two.local_addr(),
        MessageKind::Raft,
        b"vote".to_vec(),
        timeout,
    );
    let b = two.request(
        one.local_addr(),
        MessageKind::Raft,
        b"append".to_vec(),
        timeout,
    );
    let (a, b) = tokio::join!(a, b);
    assert_eq!(a.expect("1 to 2"), b"echo:vote");
    assert_eq!(b.expect("2 to 1"), b"echo:append");
    assert_eq!(seen_by_one.seen()[0].from, replica(2));
    assert_eq!(seen_by_two.seen()[0].from, replica(1));
}

#[tokio::test]
async fn handler_refusal_comes_back_as_refused_with_its_reason() {
    let pki = Pki::new();
    let (server, _) = serving(&pki, &replica(1));
    let alice = client(&pki, &operator("alice"));
    let err = alice
        .request(
            server.local_addr(),
            MessageKind::Command,
            b"refuse".to_vec(),
            timeout,
        )
        .await
        .expect_err("refused");
    match err {
        TransportError::Refused { reason, .. } => assert_eq!(reason, "handler says no"),
        other => panic!("expected Refused, got {other:?}"),
    }
}

#[tokio::test]
async fn connection_is_reused_for_later_requests() {
    let pki = Pki::new();
    let (server, _) = serving(&pki, &replica(1));
    let alice = client(&pki, &operator("alice"));
    for i in 0..5u8 {
        alice
            .request(server.local_addr(), MessageKind::Command, vec![i], timeout)
            .await
            .expect("request");
    }
    assert_eq!(alice.counts().dials, 1);
}

#[tokio::test]
async fn dialler_can_require_the_server_principal() {
    // G10: a replica sending an envelope to `ace` refuses to talk to anyone else at that address.
    let pki = Pki::new();
    let (g14, recorder) = serving(&pki, &host("g14"));
    let leader = client(&pki, &replica(1));
    let err = leader
        .request(
            Peer::expecting(g14.local_addr(), host("ace")),
            MessageKind::Envelope,
            b"decl".to_vec(),
            timeout,
        )
        .await
        .expect_err("wrong peer");
    assert!(
        matches!(&err, TransportError::WrongPeer { found, .. } if *found == host("g14")),
        "{err:?}"
    );
    assert!(recorder.seen().is_empty());
    let ok = leader
        .request(
            Peer::expecting(g14.local_addr(), host("g14")),
            MessageKind::Envelope,
            b"decl".to_vec(),
            timeout,
        )
        .await;
    assert_eq!(ok.expect("right peer"), b"echo:decl");
}

#[tokio::test]
async fn request_redials_after_the_peer_restarts_on_the_same_address() {
    let pki = Pki::new();
    let identity = pki.identity(&replica(1));
    let (server, _) = serving_with(identity.clone(), config());
    let addr = server.local_addr();
    let alice = client(&pki, &operator("alice"));
    alice
        .request(addr, MessageKind::Command, b"1".to_vec(), timeout)
        .await
        .expect("before restart");
    server.close().await;
    drop(server);
    let restarted = rebind(addr, identity).await;
    let recorder = std::sync::Arc::new(Recorder::default());
    assert!(restarted.serve(recorder.clone()));
    let answer = alice
        .request(addr, MessageKind::Command, b"2".to_vec(), timeout)
        .await
        .expect("after restart");
    assert_eq!(answer, b"echo:2");
    assert_eq!(alice.counts().dials, 2);
}

/// Binds `addr` again once the old socket is gone.
async fn rebind(addr: std::net::SocketAddr, identity: mesh_transport::Identity) -> Endpoint {
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_millis(wait_ms_max);
    loop {
        match Endpoint::bind(addr, &identity, config()) {
            Ok(endpoint) => return endpoint,
            Err(e) => assert!(tokio::time::Instant::now() < deadline, "rebind: {e}"),
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
}

#[tokio::test]
async fn request_redials_at_once_after_the_peer_crashes_and_restarts() {
    // A crash sends no goodbye; the restarted process answers the stale connection with a
    // stateless reset (its key comes from the same certificate key), so the dialler re-dials at
    // once instead of waiting out the idle timeout.
    let pki = Pki::new();
    let identity = pki.identity(&replica(1));
    let crashing = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("runtime");
    let server = {
        let _inside = crashing.enter();
        serving_with(identity.clone(), config()).0
    };
    let addr = server.local_addr();
    let alice = client(&pki, &operator("alice"));
    alice
        .request(addr, MessageKind::Command, b"1".to_vec(), timeout)
        .await
        .expect("before crash");
    crashing.shutdown_background();
    drop(server);
    let restarted = rebind(addr, identity).await;
    assert!(restarted.serve(std::sync::Arc::new(Recorder::default())));
    // Well inside the idle timeout: only a reset (or a fresh dial) can make this succeed.
    let quick = std::time::Duration::from_millis(3000);
    let answer = alice
        .request(addr, MessageKind::Command, b"2".to_vec(), quick)
        .await
        .expect("after restart");
    assert_eq!(answer, b"echo:2");
    assert_eq!(alice.counts().dials, 2);
}
