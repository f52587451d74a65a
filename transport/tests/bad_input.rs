//! Bad input on a stream (garbage, an oversized length prefix, a frame cut short): each gets a
//! clear error, nothing reaches the handler, and the server keeps serving this connection and
//! others.

mod support;

use mesh_transport::{MessageKind, TransportError};
use support::*;

/// Asserts the answer is a refusal mentioning `needle`, and that the same connection and a
/// fresh client are still served.
async fn assert_refused_then_still_serving(
    pki: &Pki,
    server: &mesh_transport::Endpoint,
    recorder: &Recorder,
    conn: &quinn::Connection,
    answer: Result<mesh_transport::Response, String>,
    needle: &str,
) {
    match answer {
        Ok(Err(refused)) => assert!(refused.reason.contains(needle), "{}", refused.reason),
        other => panic!("expected a refusal mentioning {needle:?}, got {other:?}"),
    }
    assert!(recorder.seen().is_empty(), "handler saw a bad frame");
    let again = raw_request(conn, &request_frame(MessageKind::Command, b"ok"), true).await;
    assert_eq!(again, Ok(Ok(b"echo:ok".to_vec())));
    let other = client(pki, &operator("bob"));
    let ok = other
        .request(
            server.local_addr(),
            MessageKind::Command,
            b"b".to_vec(),
            timeout,
        )
        .await;
    assert_eq!(ok, Ok(b"echo:b".to_vec()));
}

#[tokio::test]
async fn garbage_bytes_get_a_decode_error_and_nothing_reaches_the_handler() {
    // No panics on any input: a frame that does not decode is refused, not handed on.
    let pki = Pki::new();
    let (server, recorder) = serving(&pki, &replica(1));
    let conn = raw_connection_as(&pki, &operator("alice"), server.local_addr()).await;
    let mut garbage = 16u32.to_be_bytes().to_vec();
    garbage.extend_from_slice(&[0xff; 16]);
    let answer = raw_request(&conn, &garbage, true).await;
    assert_refused_then_still_serving(&pki, &server, &recorder, &conn, answer, "could not decode")
        .await;
    assert_eq!(server.counts().bad_frames, 1);
}

#[tokio::test]
async fn length_prefix_over_the_limit_is_refused_before_the_body_arrives() {
    // The prefix alone is refused: the stream stays open and no body is ever sent, so an answer
    // proves the server did not wait for (or make room for) 4 GiB.
    let pki = Pki::new();
    let (server, recorder) = serving(&pki, &replica(1));
    let conn = raw_connection_as(&pki, &operator("alice"), server.local_addr()).await;
    let answer = raw_request(&conn, &u32::MAX.to_be_bytes(), false).await;
    assert_refused_then_still_serving(&pki, &server, &recorder, &conn, answer, "over the limit")
        .await;
    assert_eq!(server.counts().bad_frames, 1);
}

#[tokio::test]
async fn frame_cut_short_by_a_finished_stream_is_refused() {
    // No panics on any input: a stream that ends mid-frame is refused with what arrived.
    let pki = Pki::new();
    let (server, recorder) = serving(&pki, &replica(1));
    let conn = raw_connection_as(&pki, &operator("alice"), server.local_addr()).await;
    let mut short = 100u32.to_be_bytes().to_vec();
    short.extend_from_slice(&[0; 10]);
    let answer = raw_request(&conn, &short, true).await;
    assert_refused_then_still_serving(&pki, &server, &recorder, &conn, answer, "after 10 of 100")
        .await;
    let answer = raw_request(&conn, &[0, 0], true).await;
    match answer {
        Ok(Err(refused)) => assert!(
            refused.reason.contains("after 2 of 4"),
            "{}",
            refused.reason
        ),
        other => panic!("expected a refusal, got {other:?}"),
    }
}

#[tokio::test]
async fn valid_frame_of_a_kind_the_principal_may_not_send_is_refused() {
    // G10: well-formed is not enough; the writers table decides.
    let pki = Pki::new();
    let (server, recorder) = serving(&pki, &replica(1));
    let conn = raw_connection_as(&pki, &host("ace"), server.local_addr()).await;
    let answer = raw_request(&conn, &request_frame(MessageKind::Envelope, b"x"), true).await;
    match answer {
        Ok(Err(refused)) => assert!(
            refused.reason.contains("host:ace may not send envelope"),
            "{}",
            refused.reason
        ),
        other => panic!("expected a refusal, got {other:?}"),
    }
    assert!(recorder.seen().is_empty());
    assert_eq!(server.counts().denied, 1);
}

#[tokio::test]
async fn body_over_the_frame_limit_is_refused_locally_before_sending() {
    // Limits: frame_bytes_max holds for what we send, checked before dialling.
    let pki = Pki::new();
    let (server, recorder) = serving(&pki, &replica(1));
    let identity = pki.identity(&operator("alice"));
    let small = mesh_transport::Endpoint::bind(any_port(), &identity, small_config(16, 1024))
        .expect("bind");
    let err = small
        .request(
            server.local_addr(),
            MessageKind::Command,
            vec![0; 2000],
            timeout,
        )
        .await
        .expect_err("too large");
    assert!(
        matches!(err, TransportError::FrameTooLarge { max: 1024, .. }),
        "{err:?}"
    );
    assert_eq!(small.counts().dials, 0, "nothing was sent");
    assert!(recorder.seen().is_empty());
}

#[tokio::test]
async fn frame_over_the_servers_limit_gets_a_refusal_naming_the_limit() {
    // Limits: the server's frame_bytes_max is enforced and named in the refusal.
    let pki = Pki::new();
    let (server, recorder) = serving_with(pki.identity(&replica(1)), small_config(16, 1024));
    let alice = client(&pki, &operator("alice"));
    let err = alice
        .request(
            server.local_addr(),
            MessageKind::Command,
            vec![0; 4000],
            timeout,
        )
        .await
        .expect_err("refused");
    let TransportError::Refused { reason, .. } = err else {
        panic!("expected Refused, got {err:?}");
    };
    assert!(reason.contains("over the limit of 1024"), "{reason}");
    assert!(recorder.seen().is_empty());
    let ok = alice
        .request(
            server.local_addr(),
            MessageKind::Command,
            b"small".to_vec(),
            timeout,
        )
        .await;
    assert_eq!(ok, Ok(b"echo:small".to_vec()));
}

#[tokio::test]
async fn a_hosts_frame_over_the_report_limit_is_refused_naming_it_and_a_replicas_is_served() {
    // Issue 23 part 2: a host may send only reports, so its frames are bounded by
    // report_frame_bytes_max, decided from its certificate before the body is read; a replica's
    // frame of the same size is under its frame_bytes_max and is served.
    let pki = Pki::new();
    let (server, recorder) = serving(&pki, &replica(1));
    let ace = client(&pki, &host("ace"));
    let body = vec![7; mesh_transport::report_frame_bytes_max + 1];
    let err = ace
        .request(server.local_addr(), report("ace"), body.clone(), timeout)
        .await
        .expect_err("refused");
    let TransportError::Refused { reason, .. } = err else {
        panic!("expected Refused, got {err:?}");
    };
    assert!(
        reason.contains("report_frame_bytes_max (1024 KiB)"),
        "{reason}"
    );
    assert!(reason.contains("host:ace"), "{reason}");
    assert!(
        recorder.seen().is_empty(),
        "the handler saw an oversized report"
    );
    assert_eq!(server.counts().bad_frames, 1);
    // A report under the limit from the same host is still served.
    let ok = ace
        .request(
            server.local_addr(),
            report("ace"),
            b"small".to_vec(),
            timeout,
        )
        .await;
    assert_eq!(ok, Ok(b"echo:small".to_vec()));
    let peer = client(&pki, &replica(2));
    let ok = peer
        .request(server.local_addr(), MessageKind::Raft, body, timeout)
        .await
        .expect("a replica's frame of that size is served");
    assert!(ok.starts_with(b"echo:"), "the echo of the body");
}

#[tokio::test]
async fn warnings_about_one_peers_bad_frames_are_logged_once_per_interval() {
    // Issue 23 part 5: a peer sending garbage on every stream gets one warning line per
    // interval, not one per stream; every bad frame is still counted.
    let logs = Logs::default();
    let _guard = logs.install();
    let pki = Pki::new();
    let (server, _recorder) = serving(&pki, &replica(1));
    let conn = raw_connection_as(&pki, &operator("alice"), server.local_addr()).await;
    let mut garbage = 16u32.to_be_bytes().to_vec();
    garbage.extend_from_slice(&[0xff; 16]);
    for _ in 0..5 {
        let answer = raw_request(&conn, &garbage, true).await;
        assert!(matches!(answer, Ok(Err(_))), "{answer:?}");
    }
    assert_eq!(server.counts().bad_frames, 5);
    let lines = logs.text().matches("bad frame refused").count();
    assert_eq!(lines, 1, "{}", logs.text());
}
