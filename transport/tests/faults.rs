//! Fault hooks as the chaos suite drives them: drop, duplicate, delay, hold/release, reorder and cut-off,
//! each observable from outside, and all free until switched on.

mod support;

use std::time::{Duration, Instant};

use mesh_transport::{MessageKind, TransportError};
use support::*;

const short: Duration = Duration::from_millis(300);

fn command(body: &str) -> (MessageKind, Vec<u8>) {
    (MessageKind::Command, body.as_bytes().to_vec())
}

fn bodies(recorder: &Recorder) -> Vec<String> {
    recorder
        .seen()
        .iter()
        .map(|s| String::from_utf8_lossy(&s.body).into_owned())
        .collect()
}

#[tokio::test]
async fn drop_next_loses_exactly_that_many_requests() {
    // Chaos hook: drop the next N outgoing messages to one peer.
    let pki = Pki::new();
    let (server, recorder) = serving(&pki, &replica(1));
    let alice = client(&pki, &operator("alice"));
    let addr = server.local_addr();
    alice.faults().drop_next(addr, 2);
    for body in ["a", "b"] {
        let (kind, body) = command(body);
        let err = alice
            .request(addr, kind, body, short)
            .await
            .expect_err("dropped");
        assert!(matches!(err, TransportError::Timeout { .. }), "{err:?}");
    }
    let (kind, body) = command("c");
    alice
        .request(addr, kind, body, timeout)
        .await
        .expect("third passes");
    assert_eq!(bodies(&recorder), ["c"]);
    assert_eq!(alice.faults().dropped(), 2);
}

#[tokio::test]
async fn duplicate_next_delivers_each_answered_request_twice_and_answers_once() {
    // Chaos hook: the next N requests to one peer reach it twice (a duplicate on the wire).
    let pki = Pki::new();
    let (server, recorder) = serving(&pki, &replica(1));
    let alice = client(&pki, &operator("alice"));
    let addr = server.local_addr();
    alice.faults().duplicate_next(addr, 1);
    for body in ["twice", "once"] {
        let (kind, body) = command(body);
        alice
            .request(addr, kind, body, timeout)
            .await
            .expect("answered");
    }
    wait_for("three deliveries", || recorder.seen().len() == 3).await;
    assert_eq!(bodies(&recorder), ["twice", "twice", "once"]);
    assert_eq!(alice.faults().duplicated(), 1);
}

#[tokio::test]
async fn drop_all_loses_one_way_messages_until_healed() {
    // Chaos hook: drop everything to one peer until healed.
    let pki = Pki::new();
    let (server, recorder) = serving(&pki, &replica(1));
    let alice = client(&pki, &operator("alice"));
    let addr = server.local_addr();
    alice.faults().drop_all(addr);
    for body in ["lost1", "lost2"] {
        let (kind, body) = command(body);
        alice
            .send_one_way(addr, kind, body, timeout)
            .await
            .expect("sent into the void");
    }
    alice.faults().heal(addr);
    let (kind, body) = command("kept");
    alice
        .send_one_way(addr, kind, body, timeout)
        .await
        .expect("sent");
    wait_for("kept message", || recorder.seen().len() == 1).await;
    assert_eq!(bodies(&recorder), ["kept"]);
    assert_eq!(alice.faults().dropped(), 2);
}

#[tokio::test]
async fn delay_holds_each_message_back_at_least_that_long() {
    // Chaos hook: delay outgoing messages to one peer.
    let pki = Pki::new();
    let (server, _) = serving(&pki, &replica(1));
    let alice = client(&pki, &operator("alice"));
    let addr = server.local_addr();
    alice.faults().delay(addr, Duration::from_millis(200));
    let started = Instant::now();
    let (kind, body) = command("late");
    alice
        .request(addr, kind, body, timeout)
        .await
        .expect("delayed");
    // A lower bound only: a slow machine makes this longer, never shorter.
    assert!(started.elapsed() >= Duration::from_millis(200));
    alice.faults().delay(addr, Duration::from_secs(60));
    let (kind, body) = command("too late");
    let err = alice
        .request(addr, kind, body, short)
        .await
        .expect_err("past deadline");
    assert!(matches!(err, TransportError::Timeout { .. }), "{err:?}");
}

/// Starts requests "1", "2", "3" in that order, each held before the next starts.
async fn three_held_requests(
    alice: &mesh_transport::Endpoint,
    addr: std::net::SocketAddr,
) -> Vec<tokio::task::JoinHandle<Result<Vec<u8>, TransportError>>> {
    let mut pending = Vec::new();
    for (i, body) in ["1", "2", "3"].into_iter().enumerate() {
        let alice_clone = alice.clone();
        let (kind, body) = command(body);
        pending.push(tokio::spawn(async move {
            alice_clone.request(addr, kind, body, timeout).await
        }));
        wait_for("message held", || alice.faults().held(addr) == i + 1).await;
    }
    pending
}

#[tokio::test]
async fn hold_queues_messages_until_release_then_delivers_them_in_order() {
    // Chaos hook: hold messages, then release them oldest first.
    let pki = Pki::new();
    let (server, recorder) = serving(&pki, &replica(1));
    let alice = client(&pki, &operator("alice"));
    let addr = server.local_addr();
    alice.faults().hold(addr);
    let pending = three_held_requests(&alice, addr).await;
    assert!(recorder.seen().is_empty(), "held messages left early");
    assert_eq!(alice.faults().release(addr).await, 3);
    for request in pending {
        request
            .await
            .expect("join")
            .expect("delivered after release");
    }
    assert_eq!(bodies(&recorder), ["1", "2", "3"]);
}

#[tokio::test]
async fn reorder_releases_held_messages_newest_first() {
    // Chaos hook: reorder = hold, then release newest first.
    let pki = Pki::new();
    let (server, recorder) = serving(&pki, &replica(1));
    let alice = client(&pki, &operator("alice"));
    let addr = server.local_addr();
    alice.faults().hold(addr);
    let pending = three_held_requests(&alice, addr).await;
    assert_eq!(alice.faults().release_reversed(addr).await, 3);
    for request in pending {
        request
            .await
            .expect("join")
            .expect("delivered after release");
    }
    assert_eq!(bodies(&recorder), ["3", "2", "1"]);
}

#[tokio::test]
async fn cut_off_peer_gets_nothing_through_either_way_until_healed() {
    // Chaos hook: a partition from one peer, both directions, on live connections too.
    let pki = Pki::new();
    let (one, seen_by_one) = serving(&pki, &replica(1));
    let (two, seen_by_two) = serving(&pki, &replica(2));
    // Connect both ways first, so the cut must also silence live connections.
    one.request(
        two.local_addr(),
        MessageKind::Raft,
        b"hello".to_vec(),
        timeout,
    )
    .await
    .expect("before the cut");
    two.request(one.local_addr(), MessageKind::Raft, b"hi".to_vec(), timeout)
        .await
        .expect("before the cut");
    let before = (seen_by_one.seen().len(), seen_by_two.seen().len());
    one.faults().cut_off(two.local_addr());
    let out = one
        .request(two.local_addr(), MessageKind::Raft, b"out".to_vec(), short)
        .await;
    assert!(
        matches!(out, Err(TransportError::Timeout { .. })),
        "{out:?}"
    );
    // The request reaches one, which stays silent rather than answering or closing.
    let inward = two
        .request(one.local_addr(), MessageKind::Raft, b"in".to_vec(), short)
        .await;
    assert!(
        matches!(inward, Err(TransportError::Timeout { .. })),
        "{inward:?}"
    );
    assert_eq!((seen_by_one.seen().len(), seen_by_two.seen().len()), before);
    one.faults().heal(two.local_addr());
    let back = one
        .request(
            two.local_addr(),
            MessageKind::Raft,
            b"back".to_vec(),
            timeout,
        )
        .await;
    assert_eq!(back, Ok(b"echo:back".to_vec()));
    let inward = two
        .request(
            one.local_addr(),
            MessageKind::Raft,
            b"in2".to_vec(),
            timeout,
        )
        .await;
    assert_eq!(inward, Ok(b"echo:in2".to_vec()));
}

#[tokio::test]
async fn a_request_sent_across_a_cut_link_goes_once_the_link_heals() {
    // As QUIC retransmits a request whose path comes back: the cut delays it, it is delivered
    // once, and its caller gets the answer within its own deadline (chaos everything 1019: a
    // snapshot sent while its replica restarted stalled that replica's replication for 10 s).
    let pki = Pki::new();
    let (one, _) = serving(&pki, &replica(1));
    let (two, seen_by_two) = serving(&pki, &replica(2));
    let one = std::sync::Arc::new(one);
    let to = two.local_addr();
    one.faults().cut_off(to);
    let sender = one.clone();
    let asked = tokio::spawn(async move {
        sender
            .request(to, MessageKind::Raft, b"late".to_vec(), timeout)
            .await
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(seen_by_two.seen().is_empty(), "nothing crosses the cut");
    assert!(!asked.is_finished(), "the request waits for the link");
    one.faults().heal(to);
    let answer = asked.await.expect("join");
    assert_eq!(answer, Ok(b"echo:late".to_vec()));
    assert_eq!(bodies(&seen_by_two), ["late"]);
    assert_eq!(one.faults().dropped(), 0, "a request waits; it is not lost");
}
