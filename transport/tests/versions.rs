//! Versions on the wire (decision 0240): a message at a body version the receiver does not speak
//! is refused before any handler runs, with one line naming both versions and who to upgrade,
//! and that line is what the sender reads; a peer of the older `mesh/1` framing is still served,
//! and dialled, in its own framing; a peer of a framing this build does not speak fails the
//! handshake with a reason naming the framings.

mod support;

use mesh_transport::frame::{self, Header};
use mesh_transport::version::{self, Framing};
use mesh_transport::{Endpoint, MessageKind, Principal, TransportError};
use serde::{Deserialize, Serialize};
use support::*;

/// A request frame of `version` (which the endpoint API never writes but its own).
fn frame_at(version: u16, kind: MessageKind, body: &[u8]) -> Vec<u8> {
    let header = Header {
        version,
        kind,
        body: body.to_vec(),
    };
    let encoded = frame::encode_header(&header).expect("encode");
    let mut bytes = (encoded.len() as u32).to_be_bytes().to_vec();
    bytes.extend_from_slice(&encoded);
    bytes
}

/// The header of an older release (the `mesh/1` framing): no version.
#[derive(Serialize, Deserialize)]
struct HeaderV1 {
    kind: MessageKind,
    body: Vec<u8>,
}

fn frame_v1(kind: MessageKind, body: &[u8]) -> Vec<u8> {
    let encoded = mesh_codec::encode(
        "old header",
        &HeaderV1 {
            kind,
            body: body.to_vec(),
        },
    )
    .expect("encode");
    let mut bytes = (encoded.len() as u32).to_be_bytes().to_vec();
    bytes.extend_from_slice(&encoded);
    bytes
}

/// A raw connection as `principal` offering exactly the ALPN protocols `alpn`.
async fn raw_offering(
    pki: &Pki,
    principal: &Principal,
    server: std::net::SocketAddr,
    alpn: &[&[u8]],
) -> Result<quinn::Connection, String> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let issued = pki.issue(principal);
    let ca = CertificateDer::from_pem_slice(pki.ca.cert_pem().as_bytes()).expect("ca pem");
    let chain = vec![CertificateDer::from_pem_slice(issued.cert_pem().as_bytes()).expect("pem")];
    let key = PrivateKeyDer::from_pem_slice(issued.key_pem().as_bytes()).expect("key pem");
    let client = mesh_transport::tls::client_config_offering(&ca, chain, key, &config(), alpn)
        .expect("client config");
    let mut endpoint = quinn::Endpoint::client(any_port()).expect("client endpoint");
    endpoint.set_default_client_config(client);
    let connecting = endpoint
        .connect(server, mesh_transport::pki::server_name)
        .expect("connect");
    connecting.await.map_err(|e| e.to_string())
}

#[tokio::test]
async fn g_version_a_newer_body_version_is_refused_naming_both_versions_before_the_handler() {
    // A replica meets a newer peer: raft v2 from replica:2 reaches replica:1, which speaks up to
    // v1. The answer (what the sender shows) and the receiver's log name both versions and say
    // to upgrade the receiver; the handler never sees it, and the connection keeps serving.
    let logs = Logs::default();
    let _guard = logs.install();
    let pki = Pki::new();
    let (server, recorder) = serving(&pki, &replica(1));
    let conn = raw_connection_as(&pki, &replica(2), server.local_addr()).await;
    assert_eq!(version::framing_of(&conn), Framing::V2, "both offer mesh/2");
    let answer = raw_request(&conn, &frame_at(2, MessageKind::Raft, b"new"), true).await;
    let want = "peer replica:2 speaks raft v2, this replica:1 speaks up to raft v1: upgrade replica:1 to a release that speaks raft v2";
    match answer {
        Ok(Err(refused)) => assert_eq!(refused.reason, want),
        other => panic!("expected the version refusal, got {other:?}"),
    }
    assert!(recorder.seen().is_empty(), "the handler saw a v2 body");
    assert!(logs.text().contains(want), "{}", logs.text());
    let again = raw_request(&conn, &frame_at(1, MessageKind::Raft, b"ok"), true).await;
    assert_eq!(again, Ok(Ok(b"echo:ok".to_vec())));
    assert_eq!(recorder.seen().len(), 1);
}

#[tokio::test]
async fn g_version_an_older_body_version_than_the_oldest_spoken_is_refused_naming_the_sender() {
    // The other way: a host still sending report v0 to a replica that reads only v1 is told to
    // upgrade itself.
    let pki = Pki::new();
    let (server, recorder) = serving(&pki, &replica(1));
    let conn = raw_connection_as(&pki, &host("ace"), server.local_addr()).await;
    let answer = raw_request(&conn, &frame_at(0, report("ace"), b"old"), true).await;
    match answer {
        Ok(Err(refused)) => assert_eq!(
            refused.reason,
            "peer host:ace speaks report v0, this replica:1 speaks report v1 to v1 only: upgrade host:ace to a release that speaks report v1 or later"
        ),
        other => panic!("expected the version refusal, got {other:?}"),
    }
    // A one-way message at v9 never reaches the handler either (its sender gets no answer:
    // it is counted and logged here).
    let mut send = conn.open_uni().await.expect("uni");
    send.write_all(&frame_at(9, report("ace"), b"one-way"))
        .await
        .expect("write");
    send.finish().expect("finish");
    wait_for("both refused", || server.counts().bad_frames == 2).await;
    assert!(recorder.seen().is_empty());
}

#[tokio::test]
async fn g_version_a_mesh1_peer_is_served_in_its_own_framing_as_version_1() {
    // An older release offers only mesh/1 and writes headers without a version: this build
    // picks mesh/1 for that connection and hands the body to the handler as v1 of its kind.
    let pki = Pki::new();
    let (server, recorder) = serving(&pki, &replica(1));
    let conn = raw_offering(&pki, &operator("alice"), server.local_addr(), &[b"mesh/1"])
        .await
        .expect("a mesh/1 peer is accepted");
    assert_eq!(version::framing_of(&conn), Framing::V1);
    let answer = raw_request(&conn, &frame_v1(MessageKind::Command, b"old"), true).await;
    assert_eq!(answer, Ok(Ok(b"echo:old".to_vec())));
    let seen = recorder.seen();
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].kind, MessageKind::Command);
    assert_eq!(seen[0].body, b"old");
    // A mesh/2 header on a mesh/1 connection is not what that peer speaks: a bad frame.
    let wrong = raw_request(&conn, &frame_at(1, MessageKind::Command, b"x"), true).await;
    assert!(matches!(wrong, Ok(Err(_))), "{wrong:?}");
}

#[tokio::test]
async fn g_version_this_build_dials_a_mesh1_peer_and_writes_the_old_header() {
    // The sending side: a peer that offers only mesh/1 gets headers without a version, which
    // it decodes in the old layout, and its plain answer reads as usual.
    let pki = Pki::new();
    let server_config = mesh_transport::tls::server_config_offering(
        &pki.identity(&replica(1)),
        &config(),
        &[b"mesh/1"],
    )
    .expect("server config");
    let old = quinn::Endpoint::server(server_config, any_port()).expect("old server");
    let addr = old.local_addr().expect("addr");
    let served = tokio::spawn(async move {
        let conn = old.accept().await.expect("incoming").await.expect("conn");
        let (mut send, mut recv) = conn.accept_bi().await.expect("stream");
        let bytes = frame::read_frame(&mut recv, 1 << 20, timeout)
            .await
            .expect("frame");
        let header: HeaderV1 = mesh_codec::decode("old header", &bytes).expect("old layout");
        let mut answer = b"old:".to_vec();
        answer.extend_from_slice(&header.body);
        let response = frame::encode_response(&Ok(answer)).expect("encode");
        frame::write_frame(&mut send, &response, 1 << 20, timeout)
            .await
            .expect("answer");
        // Kept until the client read the answer.
        conn.closed().await;
        header.kind
    });
    let client = client(&pki, &replica(2));
    let answer = client
        .request(addr, MessageKind::Raft, b"hi".to_vec(), timeout)
        .await;
    assert_eq!(answer, Ok(b"old:hi".to_vec()));
    drop(client);
    let kind = tokio::time::timeout(timeout, served)
        .await
        .expect("old server done")
        .expect("old server");
    assert_eq!(kind, MessageKind::Raft);
}

#[tokio::test]
async fn g_version_a_peer_of_an_unknown_framing_fails_the_handshake_naming_the_framings() {
    // A much newer release (mesh/3 only) meets this one: no common protocol, and both sides say
    // which framings this build speaks instead of a bare TLS alert.
    let logs = Logs::default();
    let _guard = logs.install();
    let pki = Pki::new();
    let (server, recorder) = serving(&pki, &replica(1));
    let refused = raw_offering(&pki, &replica(2), server.local_addr(), &[b"mesh/3"])
        .await
        .expect_err("no common framing");
    assert!(
        refused.contains("120") || refused.contains("protocol"),
        "{refused}"
    );
    mesh_testkit::wait_for("the refusal logged", || {
        logs.text().contains("mesh/2, mesh/1")
    })
    .await;
    assert!(
        logs.text().contains("speaks none of the framings"),
        "{}",
        logs.text()
    );
    assert!(recorder.seen().is_empty());
    // And dialling such a peer says the same from this side.
    let server_config = mesh_transport::tls::server_config_offering(
        &pki.identity(&replica(3)),
        &config(),
        &[b"mesh/3"],
    )
    .expect("server config");
    let newer = quinn::Endpoint::server(server_config, any_port()).expect("newer server");
    let addr = newer.local_addr().expect("addr");
    let accepting = tokio::spawn(async move {
        if let Some(incoming) = newer.accept().await {
            let _ = incoming.await;
        }
    });
    let dialler: Endpoint = client(&pki, &replica(2));
    match dialler
        .request(addr, MessageKind::Raft, b"x".to_vec(), timeout)
        .await
    {
        Err(TransportError::HandshakeRefused { reason, .. }) => {
            assert!(reason.contains("speaks none of the framings"), "{reason}");
            assert!(reason.contains("mesh/2, mesh/1"), "{reason}");
        }
        other => panic!("expected a refused handshake, got {other:?}"),
    }
    accepting.abort();
}
