//! The write gate (G3, "the lease is checked at the write"): a gated request asks its gate only
//! once the connection is up — after any dial, backoff, handshake or injected delay — and writes no
//! byte when the gate is closed by then.

mod support;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use mesh_transport::{MessageKind, TransportError};
use support::*;
use tokio::time::Instant;

const lease: Duration = Duration::from_millis(150);

#[tokio::test]
async fn g3_a_request_delayed_past_its_gate_writes_no_byte_to_the_peer() {
    // G3: the gate closes (the lease runs out) while the send waits on the way out; the gate is
    // asked after the wait, refuses, and the host sees nothing, then or later.
    let pki = Pki::new();
    let (host_end, recorder) = serving(&pki, &host("ace"));
    let leader = client(&pki, &replica(1));
    let addr = host_end.local_addr();
    leader.faults().delay(addr, Duration::from_millis(400));
    let valid_until = Instant::now() + lease;
    let asked = AtomicUsize::new(0);
    let gate = || -> Result<Duration, String> {
        asked.fetch_add(1, Ordering::SeqCst);
        valid_until
            .checked_duration_since(Instant::now())
            .filter(|left| !left.is_zero())
            .ok_or_else(|| "lease closed".to_string())
    };
    let err = leader
        .request_gated(
            addr,
            MessageKind::Envelope,
            b"decl".to_vec(),
            timeout,
            &gate,
        )
        .await
        .expect_err("the lease ran out before the write");
    assert!(matches!(err, TransportError::Gated { .. }), "{err:?}");
    assert_eq!(
        asked.load(Ordering::SeqCst),
        1,
        "asked once, after the delay"
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(recorder.seen().is_empty(), "{:?}", recorder.seen());
}

#[tokio::test]
async fn g3_the_gate_is_asked_only_once_the_connection_is_up() {
    // G3: dialling a dead address, and then waiting out its backoff, happen before the gate:
    // a gate never asked is a gate that cannot be passed before a slow dial.
    let pki = Pki::new();
    let leader = client(&pki, &replica(1));
    let dead = any_port();
    let asked = AtomicUsize::new(0);
    let gate = || -> Result<Duration, String> {
        asked.fetch_add(1, Ordering::SeqCst);
        Ok(lease)
    };
    let short = Duration::from_millis(300);
    for _ in 0..2 {
        let err = leader
            .request_gated(dead, MessageKind::Envelope, b"decl".to_vec(), short, &gate)
            .await
            .expect_err("nobody listens there");
        assert!(!matches!(err, TransportError::Gated { .. }), "{err:?}");
    }
    assert_eq!(asked.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn g3_an_open_gate_sends_and_answers_as_an_ungated_request() {
    // G3: inside the lease, a gated request is an ordinary request.
    let pki = Pki::new();
    let (host_end, recorder) = serving(&pki, &host("ace"));
    let leader = client(&pki, &replica(1));
    let gate = || -> Result<Duration, String> { Ok(Duration::from_secs(2)) };
    let answer = leader
        .request_gated(
            host_end.local_addr(),
            MessageKind::Envelope,
            b"decl".to_vec(),
            timeout,
            &gate,
        )
        .await
        .expect("inside the lease");
    assert_eq!(answer, b"echo:decl");
    assert_eq!(recorder.seen().len(), 1);
}

#[tokio::test]
async fn g3_a_gate_whose_time_runs_out_before_the_answer_is_asked_again() {
    // G3 (decision 0221): a request written inside its gate whose answer comes later than the
    // time the gate allowed asks the gate again instead of resetting its stream at once; while
    // the gate stays open (a lease renewed meanwhile) the answer comes back.
    let pki = Pki::new();
    let (host_end, recorder) = serving(&pki, &host("ace"));
    let leader = client(&pki, &replica(1));
    recorder.block();
    let asked = AtomicUsize::new(0);
    let gate = || -> Result<Duration, String> {
        asked.fetch_add(1, Ordering::SeqCst);
        Ok(Duration::from_millis(20))
    };
    let request = leader.request_gated(
        host_end.local_addr(),
        MessageKind::Envelope,
        b"slow".to_vec(),
        timeout,
        &gate,
    );
    let release = async {
        wait_for("the gate asked again twice", || {
            asked.load(Ordering::SeqCst) >= 3
        })
        .await;
        recorder.release();
    };
    let (answer, ()) = tokio::join!(request, release);
    assert_eq!(answer.expect("the gate stayed open"), b"echo:slow");
}

/// A UDP forwarder on loopback between one client and `server`, whose client-to-server direction
/// can be switched into a black hole: QUIC then sees loss and retransmits once it heals.
struct LossyPath {
    addr: std::net::SocketAddr,
    lose: std::sync::Arc<std::sync::atomic::AtomicBool>,
    task: tokio::task::JoinHandle<()>,
}

impl LossyPath {
    async fn to(server: std::net::SocketAddr) -> LossyPath {
        let front = tokio::net::UdpSocket::bind(any_port()).await.expect("bind");
        let back = tokio::net::UdpSocket::bind(any_port()).await.expect("bind");
        back.connect(server).await.expect("connect");
        let addr = front.local_addr().expect("addr");
        let lose = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let losing = lose.clone();
        let task = tokio::spawn(async move {
            let mut client = None;
            let (mut up, mut down) = (vec![0u8; 65_536], vec![0u8; 65_536]);
            loop {
                tokio::select! {
                    got = front.recv_from(&mut up) => {
                        let Ok((n, from)) = got else { return };
                        client = Some(from);
                        if !losing.load(Ordering::SeqCst) {
                            let _ = back.send(&up[..n]).await;
                        }
                    }
                    got = back.recv(&mut down) => {
                        let Ok(n) = got else { return };
                        if let Some(to) = client {
                            let _ = front.send_to(&down[..n], to).await;
                        }
                    }
                }
            }
        });
        LossyPath { addr, lose, task }
    }

    fn lose(&self, on: bool) {
        self.lose.store(on, Ordering::SeqCst);
    }
}

impl Drop for LossyPath {
    fn drop(&mut self) {
        self.task.abort();
    }
}

#[tokio::test]
async fn g3_a_gated_request_given_up_before_its_answer_is_reset_not_retransmitted_later() {
    // G3: a gated request written whole while its packets are being lost, and given up at its
    // timeout, must not reach the peer later through QUIC's retransmissions: its stream is reset
    // when the request ends, as at the gate's end. Otherwise bytes written under one lease could
    // arrive at a host after a newer leader was heard from.
    let pki = Pki::new();
    let (host_end, recorder) = serving(&pki, &host("ace"));
    let leader = client(&pki, &replica(1));
    let path = LossyPath::to(host_end.local_addr()).await;
    let gate = || -> Result<Duration, String> { Ok(Duration::from_secs(30)) };
    leader
        .request_gated(
            path.addr,
            MessageKind::Envelope,
            b"before".to_vec(),
            timeout,
            &gate,
        )
        .await
        .expect("the path works");
    path.lose(true);
    let err = leader
        .request_gated(
            path.addr,
            MessageKind::Envelope,
            b"given-up".to_vec(),
            Duration::from_millis(400),
            &gate,
        )
        .await
        .expect_err("every packet to the host is lost");
    assert!(matches!(err, TransportError::Timeout { .. }), "{err:?}");
    path.lose(false);
    leader
        .request_gated(
            path.addr,
            MessageKind::Envelope,
            b"after".to_vec(),
            timeout,
            &gate,
        )
        .await
        .expect("the path healed");
    // Lost data is retransmitted on the first acknowledgement after the heal or at the next
    // probe timeout: well inside a second on loopback.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let bodies: Vec<String> = recorder
        .seen()
        .iter()
        .map(|s| String::from_utf8_lossy(&s.body).into_owned())
        .collect();
    assert!(
        !bodies.iter().any(|b| b == "given-up"),
        "the given-up request reached the host: {bodies:?}"
    );
    assert_eq!(bodies.first().map(String::as_str), Some("before"));
    assert_eq!(bodies.last().map(String::as_str), Some("after"));
}

#[tokio::test]
async fn a_request_the_peer_never_had_whole_when_its_gate_closed_comes_back_gated_so_it_may_go_again()
 {
    // Issue 24 item 2 (decision 0319): a request written inside its gate, whose packets were lost
    // until the gate closed, is reset; the peer, which had not the whole frame, answers with the
    // "unread" reset instead of a refusal, so the sender knows no handler ran and gets `Gated`
    // (a push sends it again under its renewed lease) rather than "sent, no answer".
    let pki = Pki::new();
    let (host_end, recorder) = serving(&pki, &host("ace"));
    let leader = client(&pki, &replica(1));
    let path = LossyPath::to(host_end.local_addr()).await;
    let open = || -> Result<Duration, String> { Ok(Duration::from_secs(30)) };
    leader
        .request_gated(
            path.addr,
            MessageKind::Envelope,
            b"before".to_vec(),
            timeout,
            &open,
        )
        .await
        .expect("the path works");
    path.lose(true);
    let asked = AtomicUsize::new(0);
    let gate = || -> Result<Duration, String> {
        if asked.fetch_add(1, Ordering::SeqCst) == 0 {
            return Ok(Duration::from_millis(100));
        }
        // The lease ended with the request still on its way: the path heals as it is reset,
        // so the reset reaches the peer and its answer comes back.
        path.lose(false);
        Err("lease closed".into())
    };
    let err = leader
        .request_gated(
            path.addr,
            MessageKind::Envelope,
            b"withdrawn".to_vec(),
            timeout,
            &gate,
        )
        .await
        .expect_err("the gate closed before the peer had the request");
    assert!(
        matches!(err, TransportError::Gated { .. }),
        "a request the peer handled none of must come back as stopped at the gate: {err:?}"
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    let bodies: Vec<String> = recorder
        .seen()
        .iter()
        .map(|s| String::from_utf8_lossy(&s.body).into_owned())
        .collect();
    assert_eq!(
        bodies,
        vec!["before".to_string()],
        "no handler saw the withdrawn request"
    );
}
