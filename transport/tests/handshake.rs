//! Mutual TLS at the handshake: a certificate from another CA, an expired one, or one naming no
//! principal is refused before any message, the reason is logged with the peer address, and the
//! server keeps serving good peers. The dialler checks the server the same way.

mod support;

use mesh_transport::{Ca, Endpoint, Identity, MessageKind, TransportError, Validity};
use support::*;
use time::{Duration, OffsetDateTime};

fn expired() -> Validity {
    let now = OffsetDateTime::now_utc();
    Validity {
        not_before: now - Duration::days(2),
        not_after: now - Duration::days(1),
    }
}

/// Dials `server` presenting `identity`, expects the handshake to be refused, and checks that
/// the server counted and logged it and still serves a good client.
async fn assert_refused_at_handshake(pki: &Pki, identity: Identity, log_needles: &[&str]) {
    // G10: a principal comes only from a certificate the mesh CA vouches for.
    let logs = Logs::default();
    let _guard = logs.install();
    let (server, recorder) = serving(pki, &replica(1));
    let rogue = Endpoint::bind(any_port(), &identity, config()).expect("bind");
    let err = rogue
        .request(
            server.local_addr(),
            MessageKind::Raft,
            b"x".to_vec(),
            timeout,
        )
        .await
        .expect_err("refused");
    assert!(
        matches!(err, TransportError::HandshakeRefused { .. }),
        "{err:?}"
    );
    wait_for("refusal counted", || {
        server.counts().handshakes_refused == 1
    })
    .await;
    assert!(recorder.seen().is_empty());
    let text = logs.text();
    assert!(text.contains("TLS handshake refused"), "{text}");
    assert!(text.contains(&rogue.local_addr().to_string()), "{text}");
    assert!(log_needles.iter().any(|n| text.contains(n)), "{text}");
    let good = client(pki, &replica(2));
    let ok = good
        .request(
            server.local_addr(),
            MessageKind::Raft,
            b"y".to_vec(),
            timeout,
        )
        .await;
    assert_eq!(ok, Ok(b"echo:y".to_vec()));
}

#[tokio::test]
async fn certificate_from_another_ca_is_refused_at_the_handshake() {
    // G10: only the mesh CA vouches for principals.
    let pki = Pki::new();
    let other = Ca::create(Validity::days_from_now(1)).expect("other CA");
    let issued = other
        .issue(&replica(2), Validity::days_from_now(1))
        .expect("issue");
    // It trusts the real CA (so it accepts the server) but presents the other CA's certificate.
    let identity = Identity::from_pem(pki.ca.cert_pem(), issued.cert_pem(), issued.key_pem())
        .expect("identity");
    // Same CA name, other key: webpki reports a bad signature (another name: unknown issuer).
    assert_refused_at_handshake(&pki, identity, &["BadSignature", "UnknownIssuer"]).await;
}

#[tokio::test]
async fn expired_certificate_is_refused_at_the_handshake() {
    // G10: an expired certificate names nobody any more.
    let pki = Pki::new();
    let issued = pki.ca.issue(&replica(2), expired()).expect("issue");
    let identity = Identity::from_pem(pki.ca.cert_pem(), issued.cert_pem(), issued.key_pem())
        .expect("identity");
    assert_refused_at_handshake(&pki, identity, &["certificate expired"]).await;
}

#[tokio::test]
async fn certificate_without_a_principal_is_refused_at_the_handshake() {
    // G10: a certificate that names no principal never gets a connection.
    let logs = Logs::default();
    let _guard = logs.install();
    let pki = Pki::new();
    let (server, recorder) = serving(&pki, &replica(1));
    let bare = pki
        .ca
        .issue_with_uris("nobody", &[], Validity::days_from_now(1))
        .expect("issue");
    let result = match raw_connection(
        pki.ca.cert_pem(),
        bare.cert_pem(),
        bare.key_pem(),
        server.local_addr(),
    )
    .await
    {
        Ok(conn) => raw_request(&conn, &request_frame(MessageKind::Raft, b"x"), true).await,
        Err(e) => Err(e),
    };
    // Refused by TLS itself (a crypto alert), not closed later by the application.
    let err = result.expect_err("refused");
    assert!(err.contains("cryptographic handshake failed"), "{err}");
    wait_for("refusal counted", || {
        server.counts().handshakes_refused == 1
    })
    .await;
    assert!(recorder.seen().is_empty());
    let text = logs.text();
    assert!(text.contains("no mesh:// URI SAN"), "{text}");
    let good = client(&pki, &replica(2));
    let ok = good
        .request(
            server.local_addr(),
            MessageKind::Raft,
            b"y".to_vec(),
            timeout,
        )
        .await;
    assert_eq!(ok, Ok(b"echo:y".to_vec()));
}

#[tokio::test]
async fn dialler_refuses_a_server_from_another_ca() {
    // G10: the dialler also checks who it reached; a host never takes envelopes from a stranger.
    let pki = Pki::new();
    let other = Pki::new();
    let (impostor, recorder) = serving(&other, &host("ace"));
    let leader = client(&pki, &replica(1));
    let err = leader
        .request(
            impostor.local_addr(),
            MessageKind::Envelope,
            b"d".to_vec(),
            timeout,
        )
        .await
        .expect_err("refused");
    let TransportError::HandshakeRefused { reason, .. } = &err else {
        panic!("expected HandshakeRefused, got {err:?}");
    };
    assert!(
        reason.contains("BadSignature") || reason.contains("UnknownIssuer"),
        "{reason}"
    );
    assert!(recorder.seen().is_empty());
}

#[tokio::test]
async fn refused_handshakes_from_one_address_are_logged_once_per_interval_and_all_counted() {
    // Issue 23 part 4: anyone can start a handshake, so a peer failing them in a loop gets one
    // warning line per interval (with the count held back), not one per attempt; each is counted.
    let logs = Logs::default();
    let _guard = logs.install();
    let pki = Pki::new();
    let (server, _recorder) = serving(&pki, &replica(1));
    let issued = pki.ca.issue(&replica(2), expired()).expect("issue");
    let identity =
        Identity::from_pem(pki.ca.cert_pem(), issued.cert_pem(), issued.key_pem()).expect("id");
    let rogue = Endpoint::bind(any_port(), &identity, config()).expect("bind");
    for _ in 0..5 {
        let err = rogue
            .request(
                server.local_addr(),
                MessageKind::Raft,
                b"x".to_vec(),
                timeout,
            )
            .await
            .expect_err("refused");
        assert!(
            matches!(err, TransportError::HandshakeRefused { .. }),
            "{err:?}"
        );
    }
    wait_for("every refusal counted", || {
        server.counts().handshakes_refused == 5
    })
    .await;
    let lines = logs.text().matches("TLS handshake refused").count();
    assert_eq!(lines, 1, "{}", logs.text());
}
