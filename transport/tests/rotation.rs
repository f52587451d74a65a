//! Rotation and revocation at the transport (issue 15 parts 4–5, decisions 0170–0172): an endpoint
//! reloads its certificate without dropping open connections; during a CA switch both CAs are
//! trusted, and after it a peer still on the old CA is refused and its open connection closed; a
//! revoked peer is refused at its next handshake and its open connection is closed at once. Every
//! refusal names the certificate (principal, serial) and the way out.

mod support;

use mesh_transport::{
    Ca, CertInfo, DenyList, Endpoint, Identity, MessageKind, Revoked, TransportError, Validity,
};
use support::*;

fn serial_of(identity: &Identity) -> String {
    identity.cert_info().expect("cert info").serial
}

/// A request of a kind `from` may send: hosts send their own reports, replicas raft.
async fn ask(from: &Endpoint, to: &Endpoint, body: &str) -> Result<Vec<u8>, TransportError> {
    let kind = match from.principal() {
        mesh_transport::Principal::Host(name) => report(name),
        _ => MessageKind::Raft,
    };
    from.request(to.local_addr(), kind, body.as_bytes().to_vec(), timeout)
        .await
}

/// Both CAs in one PEM, as ca.pem holds them during a switch.
fn both(old: &Ca, new: &Ca) -> String {
    format!("{}{}", old.cert_pem(), new.cert_pem())
}

fn identity_from(ca_pem: &str, issuer: &Ca, principal: &mesh_transport::Principal) -> Identity {
    let issued = issuer
        .issue(principal, Validity::days_from_now(1))
        .expect("issue");
    Identity::from_pem(ca_pem, issued.cert_pem(), issued.key_pem()).expect("identity")
}

#[tokio::test]
async fn g15_reload_serves_the_new_certificate_without_dropping_open_connections() {
    // Rotation: a reload changes what the next handshake presents, not what is connected.
    let pki = Pki::new();
    let first = pki.identity(&replica(1));
    let (server, _recorder) = serving_with(first.clone(), config());
    let old_client = client(&pki, &replica(2));
    assert_eq!(ask(&old_client, &server, "a").await, Ok(b"echo:a".to_vec()));
    assert_eq!(old_client.counts().dials, 1);
    let renewed = pki.identity(&replica(1));
    assert_ne!(serial_of(&first), serial_of(&renewed));
    assert_eq!(server.reload_identity(&renewed).expect("reload"), 0);
    // The open connection carries on: no new dial, the request answered.
    assert_eq!(ask(&old_client, &server, "b").await, Ok(b"echo:b".to_vec()));
    assert_eq!(old_client.counts().dials, 1);
    // A new peer gets the renewed certificate.
    let new_client = client(&pki, &replica(3));
    assert_eq!(ask(&new_client, &server, "c").await, Ok(b"echo:c".to_vec()));
    let (_, seen) = new_client.certificates();
    let serials: Vec<&str> = seen.iter().map(|c| c.serial.as_str()).collect();
    assert_eq!(serials, [serial_of(&renewed).as_str()]);
    assert_eq!(
        server.certificates().0.map(|c| c.serial),
        Some(serial_of(&renewed))
    );
}

#[tokio::test]
async fn g15_reload_refuses_another_principal_and_changes_nothing() {
    // Rotation: a process keeps its principal; a wrong file is refused whole.
    let pki = Pki::new();
    let first = pki.identity(&replica(1));
    let (server, _recorder) = serving_with(first.clone(), config());
    let err = server
        .reload_identity(&pki.identity(&replica(9)))
        .expect_err("refused");
    assert!(err.to_string().contains("replica:9"), "{err}");
    assert_eq!(
        server.certificates().0.map(|c| c.serial),
        Some(serial_of(&first))
    );
}

#[tokio::test]
async fn g15_both_cas_are_trusted_during_a_switch_and_the_old_one_is_refused_after() {
    // Rotation: the switch window trusts both CAs; ending it closes what only the old CA vouched for.
    let old = Ca::create(Validity::days_from_now(1)).expect("old CA");
    let new = Ca::create(Validity::days_from_now(1)).expect("new CA");
    let window = both(&old, &new);
    let (server, _recorder) = serving_with(identity_from(&window, &old, &replica(1)), config());
    let stale = identity_from(&window, &old, &replica(2));
    let on_old = Endpoint::bind(any_port(), &stale, config()).expect("bind");
    let on_new = Endpoint::bind(
        any_port(),
        &identity_from(&window, &new, &replica(3)),
        config(),
    )
    .expect("bind");
    assert_eq!(ask(&on_old, &server, "a").await, Ok(b"echo:a".to_vec()));
    assert_eq!(ask(&on_new, &server, "b").await, Ok(b"echo:b".to_vec()));
    // The server moves to the new CA only: its own certificate from the new CA, trust new only.
    let closed = server
        .reload_identity(&identity_from(new.cert_pem(), &new, &replica(1)))
        .expect("reload");
    assert_eq!(closed, 1, "the old-CA peer's connection is closed");
    assert_eq!(ask(&on_new, &server, "c").await, Ok(b"echo:c".to_vec()));
    let err = ask(&on_old, &server, "d").await.expect_err("refused");
    let text = err.to_string();
    assert!(
        matches!(err, TransportError::HandshakeRefused { .. }),
        "{err:?}"
    );
    assert!(text.contains("replica:2"), "{text}");
    assert!(text.contains(&serial_of(&stale)), "{text}");
    assert!(
        text.contains("not signed by a CA this process trusts"),
        "{text}"
    );
    assert!(text.contains("meshctl certs renew replica:2"), "{text}");
}

#[tokio::test]
async fn g15_a_revoked_peer_is_closed_now_and_refused_at_its_next_handshake() {
    // Revocation: within seconds, not at the certificate's expiry.
    let pki = Pki::new();
    let (server, _recorder) = serving(&pki, &replica(1));
    let revoked_identity = pki.identity(&host("ace"));
    let revoked = Endpoint::bind(any_port(), &revoked_identity, config()).expect("bind");
    let other = client(&pki, &host("bee"));
    assert_eq!(ask(&revoked, &server, "a").await, Ok(b"echo:a".to_vec()));
    assert_eq!(ask(&other, &server, "b").await, Ok(b"echo:b".to_vec()));
    let serial = serial_of(&revoked_identity);
    let deny = DenyList::new([(Revoked::Serial(serial.clone()), "laptop stolen".into())])
        .expect("deny list");
    assert_eq!(server.set_denied(deny.clone()), 1);
    // Setting the same list again closes nothing more.
    assert_eq!(server.set_denied(deny), 0);
    // A request racing the close frame sees the close and its reason; the one after it dials
    // and is refused at the handshake. Either way one line names the certificate and the fix.
    let mut err = ask(&revoked, &server, "c").await.expect_err("refused");
    if !matches!(err, TransportError::HandshakeRefused { .. }) {
        let text = err.to_string();
        assert!(text.contains("revoked (laptop stolen)"), "{text}");
        err = ask(&revoked, &server, "c").await.expect_err("refused");
    }
    let text = err.to_string();
    assert!(
        matches!(err, TransportError::HandshakeRefused { .. }),
        "{err:?}"
    );
    assert!(text.contains("host:ace"), "{text}");
    assert!(text.contains(&serial), "{text}");
    assert!(text.contains("revoked (laptop stolen)"), "{text}");
    assert!(text.contains("meshctl certs renew host:ace"), "{text}");
    // The other peer's open connection was kept.
    assert_eq!(ask(&other, &server, "d").await, Ok(b"echo:d".to_vec()));
    assert_eq!(other.counts().dials, 1);
    // A renewed certificate for the same principal gets in.
    let renewed = Endpoint::bind(any_port(), &pki.identity(&host("ace")), config()).expect("bind");
    assert_eq!(ask(&renewed, &server, "e").await, Ok(b"echo:e".to_vec()));
}

#[tokio::test]
async fn g15_a_dialler_refuses_a_revoked_server_and_closes_its_connection() {
    // Revocation: the dialling side checks the deny list too (a host refusing a revoked replica).
    let pki = Pki::new();
    let server_identity = pki.identity(&replica(1));
    let (server, _recorder) = serving_with(server_identity.clone(), config());
    let dialler = client(&pki, &host("ace"));
    assert_eq!(ask(&dialler, &server, "a").await, Ok(b"echo:a".to_vec()));
    let deny = DenyList::new([(Revoked::Principal(replica(1)), "retired".into())]).expect("deny");
    assert_eq!(dialler.set_denied(deny), 1);
    let err = ask(&dialler, &server, "b").await.expect_err("refused");
    let text = err.to_string();
    assert!(text.contains("replica:1"), "{text}");
    assert!(text.contains("principal is revoked (retired)"), "{text}");
}

#[tokio::test]
async fn g15_an_expired_certificate_is_refused_with_its_name_and_the_way_out() {
    // Rotation: expiry is a refusal naming the certificate and `certs renew`.
    let pki = Pki::new();
    let (server, _recorder) = serving(&pki, &replica(1));
    let now = time::OffsetDateTime::now_utc();
    let issued = pki
        .ca
        .issue(
            &host("old"),
            Validity {
                not_before: now - time::Duration::days(2),
                not_after: now - time::Duration::days(1),
            },
        )
        .expect("issue");
    let identity =
        Identity::from_pem(pki.ca.cert_pem(), issued.cert_pem(), issued.key_pem()).expect("id");
    let info: CertInfo = identity.cert_info().expect("info");
    let expired = Endpoint::bind(any_port(), &identity, config()).expect("bind");
    let text = ask(&expired, &server, "a")
        .await
        .expect_err("refused")
        .to_string();
    assert!(text.contains("host:old"), "{text}");
    assert!(text.contains(&info.serial), "{text}");
    assert!(text.contains("expired at"), "{text}");
    assert!(text.contains("meshctl certs renew host:old"), "{text}");
}
