//! Kept connections follow trust changes (issue 27 part 6, decision 0297): a connection whose
//! handshake was verified just before a revocation and tracked just after it is checked again as
//! it is tracked; a peer certificate whose validity ends while its connection is kept is refused
//! at the next request on it, by either side, naming the certificate and `certs renew`.

mod support;

use mesh_testkit::wait_deadline;
use mesh_transport::{DenyList, Endpoint, Identity, Revoked, TransportError, Validity};
use support::*;
use time::OffsetDateTime;

/// A request of a kind `from` may send: hosts send their own reports, replicas raft.
async fn ask(from: &Endpoint, to: &Endpoint, body: &str) -> Result<Vec<u8>, TransportError> {
    let kind = match from.principal() {
        mesh_transport::Principal::Host(name) => report(name),
        _ => mesh_transport::MessageKind::Raft,
    };
    from.request(to.local_addr(), kind, body.as_bytes().to_vec(), timeout)
        .await
}

/// An identity for `principal` whose certificate ends `seconds` from now. Its end is compared
/// in whole seconds, as a handshake compares it.
fn ending_in(pki: &Pki, principal: &mesh_transport::Principal, seconds: i64) -> Identity {
    let now = OffsetDateTime::now_utc();
    let validity = Validity {
        not_before: now - time::Duration::hours(1),
        not_after: now + time::Duration::seconds(seconds),
    };
    let issued = pki.ca.issue(principal, validity).expect("issue");
    Identity::from_pem(pki.ca.cert_pem(), issued.cert_pem(), issued.key_pem()).expect("identity")
}

#[tokio::test]
async fn a_connection_tracked_after_a_racing_revocation_is_closed() {
    // Revocation: the deny list changes between the handshake's verification and the tracking
    // of its connection, so the change's sweep of open connections cannot see it; the tracking
    // sees the trust moved and checks it again.
    let pki = Pki::new();
    let (server, recorder) = serving(&pki, &replica(1));
    let ace_identity = pki.identity(&host("ace"));
    let serial = ace_identity.cert_info().expect("cert info").serial;
    let ace = Endpoint::bind(any_port(), &ace_identity, config()).expect("bind");
    let mut pause = server.faults().pause_next_track();
    let server_addr = server.local_addr();
    let asking = tokio::spawn(async move {
        ace.request(server_addr, report("ace"), b"a".to_vec(), timeout)
            .await
    });
    let reached = tokio::time::timeout(wait_deadline, pause.reached()).await;
    assert_eq!(reached, Ok(true), "ace's handshake before the deadline");
    let deny = DenyList::new([(Revoked::Serial(serial.clone()), "laptop stolen".into())])
        .expect("deny list");
    // The sweep runs while ace's connection is verified but not yet tracked: it closes nothing.
    assert_eq!(server.set_denied(deny), 0);
    pause.release();
    let answer = asking.await.expect("the request's task");
    let text = answer.expect_err("refused once tracked").to_string();
    assert!(text.contains("host:ace"), "{text}");
    assert!(text.contains(&serial), "{text}");
    assert!(text.contains("revoked (laptop stolen)"), "{text}");
    assert!(
        recorder.seen().is_empty(),
        "nothing served to a revoked peer"
    );
}

#[tokio::test]
async fn a_kept_connection_is_refused_once_the_dialling_peers_certificate_has_ended() {
    // Rotation: TLS checks a certificate at the handshake only; the serving side checks its
    // end again at each request on a kept connection.
    let pki = Pki::new();
    let (server, recorder) = serving(&pki, &replica(1));
    let identity = ending_in(&pki, &host("ace"), 2);
    let info = identity.cert_info().expect("cert info");
    let ace = Endpoint::bind(any_port(), &identity, config()).expect("bind");
    assert_eq!(ask(&ace, &server, "a").await, Ok(b"echo:a".to_vec()));
    wait_for("ace's certificate to end", || {
        OffsetDateTime::now_utc().unix_timestamp() > info.not_after.unix_timestamp()
    })
    .await;
    let text = ask(&ace, &server, "b")
        .await
        .expect_err("refused")
        .to_string();
    assert!(text.contains("host:ace"), "{text}");
    assert!(text.contains(&info.serial), "{text}");
    assert!(text.contains("expired at"), "{text}");
    assert!(text.contains("meshctl certs renew host:ace"), "{text}");
    let served: Vec<_> = recorder.seen().into_iter().map(|s| s.body).collect();
    assert_eq!(
        served,
        [b"a".to_vec()],
        "the request after the end was not served"
    );
}

#[tokio::test]
async fn a_kept_connection_is_dropped_once_the_served_peers_certificate_has_ended() {
    // Rotation: the dialling side checks the server's certificate at each reuse of the kept
    // connection; once ended it drops it, and the new handshake is refused naming it.
    let pki = Pki::new();
    let identity = ending_in(&pki, &replica(1), 2);
    let info = identity.cert_info().expect("cert info");
    let (server, _recorder) = serving_with(identity, config());
    let dialler = client(&pki, &host("ace"));
    assert_eq!(ask(&dialler, &server, "a").await, Ok(b"echo:a".to_vec()));
    wait_for("the server's certificate to end", || {
        OffsetDateTime::now_utc().unix_timestamp() > info.not_after.unix_timestamp()
    })
    .await;
    let err = ask(&dialler, &server, "b").await.expect_err("refused");
    assert!(
        matches!(err, TransportError::HandshakeRefused { .. }),
        "{err:?}"
    );
    let text = err.to_string();
    assert!(text.contains("replica:1"), "{text}");
    assert!(text.contains(&info.serial), "{text}");
    assert!(text.contains("expired at"), "{text}");
    assert!(text.contains("meshctl certs renew replica:1"), "{text}");
}
