//! Admission of connections (issue 23 part 3, decision 0300): one host certificate past its cap
//! is refused while replicas and admins still connect; one socket past its cap is refused; the
//! last slots stay for replicas and admins when hosts and other operators fill the rest;
//! handshakes that never finish take no established slot, end at their own deadline, and past
//! a threshold an unvalidated address is answered with a Retry and holds nothing. The limits are
//! narrowed with `Endpoint::serve_limited` so a handful of connections reach each cap.

mod support;

use std::collections::HashSet;
use std::net::SocketAddr;
use std::sync::Arc;

use mesh_testkit::wait_deadline;
use mesh_transport::admit::close_over_cap;
use mesh_transport::{
    ConnLimits, Endpoint, MessageKind, Principal, Role, TransportConfig, Validity,
};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use support::*;

/// Caps far from the test's way unless it narrows one.
fn wide() -> ConnLimits {
    ConnLimits {
        connections_max: 64,
        connections_reserved_min: 8,
        connections_per_replica_max: 16,
        connections_per_host_max: 16,
        connections_per_operator_max: 16,
        connections_per_address_max: 16,
        handshakes_max: 64,
        handshakes_per_ip_max: 64,
        handshakes_without_retry_max: 64,
        handshake_ms_max: 60_000,
        // One warning per cap for the whole test.
        refusal_log_interval_ms: 3_600_000,
    }
}

/// A config whose idle timeout outlasts the test, so a stalled handshake ends only at the
/// admission deadline.
fn patient() -> mesh_transport::CheckedConfig {
    TransportConfig {
        idle_timeout_ms: 120_000,
        ..TransportConfig::default()
    }
    .check()
    .expect("config")
}

/// A replica:1 endpoint serving a recorder with `limits`.
fn serving_limited(pki: &Pki, limits: ConnLimits) -> Endpoint {
    let endpoint = Endpoint::bind(any_port(), &pki.identity(&replica(1)), patient()).expect("bind");
    let limits = limits.check().expect("limits");
    assert!(endpoint.serve_limited(Arc::new(Recorder::default()), limits));
    endpoint
}

/// A client config presenting a fresh certificate for `principal` stating `role`.
fn client_config(pki: &Pki, principal: &Principal, role: Option<Role>) -> quinn::ClientConfig {
    client_config_with(pki, principal, role, &config())
}

fn client_config_with(
    pki: &Pki,
    principal: &Principal,
    role: Option<Role>,
    config: &mesh_transport::CheckedConfig,
) -> quinn::ClientConfig {
    let issued = pki
        .ca
        .issue_with_role(principal, role, Validity::days_from_now(1))
        .expect("issue");
    let ca = CertificateDer::from_pem_slice(pki.ca.cert_pem().as_bytes()).expect("ca pem");
    let chain = vec![CertificateDer::from_pem_slice(issued.cert_pem().as_bytes()).expect("cert")];
    let key = PrivateKeyDer::from_pem_slice(issued.key_pem().as_bytes()).expect("key pem");
    mesh_transport::tls::client_config_from_parts(&ca, chain, key, config).expect("client")
}

/// A QUIC client socket of its own, to dial from one source address.
fn socket() -> quinn::Endpoint {
    quinn::Endpoint::client(any_port()).expect("client endpoint")
}

/// Dials `server` from `from` as `principal` (with `role`); the handshake's outcome.
async fn dial(
    from: &quinn::Endpoint,
    pki: &Pki,
    principal: &Principal,
    role: Option<Role>,
    server: SocketAddr,
) -> Result<quinn::Connection, String> {
    let connecting = from
        .connect_with(
            client_config(pki, principal, role),
            server,
            mesh_transport::pki::server_name,
        )
        .expect("connect");
    match tokio::time::timeout(wait_deadline, connecting).await {
        Ok(done) => done.map_err(|e| e.to_string()),
        Err(_) => panic!("{principal}'s handshake did not end before the deadline"),
    }
}

/// A connection and the socket it was dialled from; dropped, the connection closes.
struct Kept {
    _socket: quinn::Endpoint,
    conn: quinn::Connection,
}

/// Dials from a socket of its own and checks the connection is served: a request of a kind
/// `principal` may send is answered. Keep it to hold its slot.
async fn served(pki: &Pki, principal: &Principal, role: Option<Role>, server: SocketAddr) -> Kept {
    let from = socket();
    let conn = dial(&from, pki, principal, role, server).await;
    let conn = conn.unwrap_or_else(|e| panic!("{principal} ({role:?}) refused: {e}"));
    assert_served(&conn, principal).await;
    Kept {
        _socket: from,
        conn,
    }
}

async fn assert_served(conn: &quinn::Connection, principal: &Principal) {
    let kind = match principal {
        Principal::Host(name) => report(name),
        Principal::Replica(_) => MessageKind::Raft,
        Principal::Operator(_) => MessageKind::Command,
    };
    let answer = raw_request(conn, &request_frame(kind, b"x"), true).await;
    assert_eq!(answer, Ok(Ok(b"echo:x".to_vec())), "{principal} is served");
}

/// The close reason of a connection the server closes by a cap, from the dialler's side.
async fn refusal(handshake: Result<quinn::Connection, String>) -> String {
    let conn = match handshake {
        Ok(conn) => conn,
        // Closed before the dialler saw its handshake end: the same reason, as text.
        Err(text) => return text,
    };
    match tokio::time::timeout(wait_deadline, conn.closed()).await {
        Ok(quinn::ConnectionError::ApplicationClosed(close)) => {
            assert_eq!(close.error_code.into_inner(), u64::from(close_over_cap));
            String::from_utf8_lossy(&close.reason).into_owned()
        }
        Ok(other) => panic!("closed otherwise than by a cap: {other}"),
        Err(_) => panic!("the connection was not closed before the deadline"),
    }
}

/// Dials from a socket of its own and returns the reason the server closed the connection with.
async fn refused(
    pki: &Pki,
    principal: &Principal,
    role: Option<Role>,
    server: SocketAddr,
) -> String {
    let from = socket();
    refusal(dial(&from, pki, principal, role, server).await).await
}

#[tokio::test]
async fn one_host_past_its_cap_is_refused_while_a_replica_and_an_admin_still_connect() {
    // Decision 0300: one host certificate holding connections locks nobody else out; past
    // connections_per_host_max it is closed naming the cap, counted, and warned of once.
    let logs = Logs::default();
    let _guard = logs.install();
    let pki = Pki::new();
    let limits = ConnLimits {
        connections_per_host_max: 2,
        ..wide()
    };
    let server = serving_limited(&pki, limits);
    let at = server.local_addr();
    let ace = host("ace");
    let first = served(&pki, &ace, None, at).await;
    let _second = served(&pki, &ace, None, at).await;
    let reason = refused(&pki, &ace, None, at).await;
    assert!(reason.contains("host:ace already holds 2"), "{reason}");
    assert!(reason.contains("connections_per_host_max"), "{reason}");
    assert!(reason.contains("meshctl certs revoke"), "{reason}");
    let again = refused(&pki, &ace, None, at).await;
    assert!(again.contains("connections_per_host_max"), "{again}");
    let _raft = served(&pki, &replica(2), None, at).await;
    let _admin = served(&pki, &operator("root"), Some(Role::Admin), at).await;
    let _bee = served(&pki, &host("bee"), None, at).await;
    assert_eq!(server.counts().conns.refused_per_principal, 2);
    let text = logs.text();
    let warnings = text.matches("connections refused by a cap").count();
    assert_eq!(warnings, 1, "one warning for two refusals: {text}");
    // A slot ace gives back is ace's again.
    let open = server.counts().conns.connections_open;
    first.conn.close(quinn::VarInt::from_u32(0), b"done");
    wait_for("ace's first connection to give its slot back", || {
        server.counts().conns.connections_open < open
    })
    .await;
    served(&pki, &ace, None, at).await;
}

#[tokio::test]
async fn one_socket_past_its_cap_is_refused_whoever_its_certificates_name() {
    // Decision 0300: connections_per_address_max counts per source socket, across principals.
    let pki = Pki::new();
    let limits = ConnLimits {
        connections_per_address_max: 2,
        ..wide()
    };
    let server = serving_limited(&pki, limits);
    let at = server.local_addr();
    let from = socket();
    let mut kept = Vec::new();
    for name in ["ace", "bee"] {
        let conn = dial(&from, &pki, &host(name), None, at)
            .await
            .expect("under the cap");
        assert_served(&conn, &host(name)).await;
        kept.push(conn);
    }
    let reason = refusal(dial(&from, &pki, &host("cat"), None, at).await).await;
    assert!(reason.contains("host:cat at"), "{reason}");
    assert!(reason.contains("connections_per_address_max"), "{reason}");
    let _cat = served(&pki, &host("cat"), None, at).await;
    assert_eq!(server.counts().conns.refused_per_address, 1);
}

#[tokio::test]
async fn the_reserve_lets_replicas_and_admins_in_when_the_other_slots_are_full() {
    // Decision 0300: hosts and non-admin operators hold at most connections_max minus the
    // reserve, so Raft and an admin's `certs revoke` always find a slot.
    let pki = Pki::new();
    let limits = ConnLimits {
        connections_max: 4,
        connections_reserved_min: 2,
        ..wide()
    };
    let server = serving_limited(&pki, limits);
    let at = server.local_addr();
    let _a = served(&pki, &host("a"), None, at).await;
    let _b = served(&pki, &host("b"), None, at).await;
    let reason = refused(&pki, &host("c"), None, at).await;
    assert!(reason.contains("connections_reserved_min"), "{reason}");
    for role in [Role::Viewer, Role::Operator] {
        let reason = refused(&pki, &operator("ops"), Some(role), at).await;
        assert!(
            reason.contains("connections_reserved_min"),
            "{role}: {reason}"
        );
    }
    let _raft = served(&pki, &replica(2), None, at).await;
    let _admin = served(&pki, &operator("root"), Some(Role::Admin), at).await;
    let full = refused(&pki, &operator("old"), None, at).await;
    assert!(full.contains("all 4 connection slots"), "{full}");
    let counts = server.counts().conns;
    assert_eq!((counts.refused_reserve, counts.refused_full), (3, 1));
    assert_eq!(counts.connections_open, 4);
}

/// Initial packets of `n` QUIC handshakes that never go on: a client dials a socket that only
/// captures its first datagrams, and each is sent to `server` from the socket returned, whose
/// answers are never read. Keep the socket until the test ends.
async fn stalled_handshakes(pki: &Pki, server: SocketAddr, n: usize) -> tokio::net::UdpSocket {
    let capture = tokio::net::UdpSocket::bind(any_port())
        .await
        .expect("capture");
    let mut client = socket();
    // Its idle timeout, which the server reads in the first flight, outlasts the test too.
    let config = patient();
    client.set_default_client_config(client_config_with(pki, &host("ghost"), None, &config));
    let target = capture.local_addr().expect("capture addr");
    let dials: Vec<_> = (0..n)
        .map(|_| {
            client
                .connect(target, mesh_transport::pki::server_name)
                .expect("connect")
        })
        .collect();
    let mut initials = Vec::new();
    let mut seen = HashSet::new();
    let mut buf = vec![0u8; 65_536];
    while initials.len() < n {
        let got = tokio::time::timeout(wait_deadline, capture.recv(&mut buf)).await;
        let len = got.expect("an Initial before the deadline").expect("recv");
        // A long header: flags, version (4), DCID length, DCID. A probe sent again has a DCID
        // already seen.
        let dcid_len = usize::from(buf[5]);
        if seen.insert(buf[6..6 + dcid_len].to_vec()) {
            initials.push(buf[..len].to_vec());
        }
    }
    drop(dials);
    let from = tokio::net::UdpSocket::bind(any_port()).await.expect("from");
    for initial in initials {
        from.send_to(&initial, server).await.expect("send");
    }
    from
}

#[tokio::test]
async fn handshakes_that_never_finish_do_not_take_an_established_connection_slot() {
    // Decision 0300: handshakes are counted apart; six stalled ones leave both established
    // slots to peers that finish theirs.
    let pki = Pki::new();
    let limits = ConnLimits {
        connections_max: 2,
        connections_reserved_min: 0,
        handshakes_max: 8,
        handshakes_per_ip_max: 8,
        handshakes_without_retry_max: 8,
        ..wide()
    };
    let server = serving_limited(&pki, limits);
    let at = server.local_addr();
    let _stalled = stalled_handshakes(&pki, at, 6).await;
    wait_for("six handshakes in progress", || {
        server.counts().conns.handshakes_in_progress == 6
    })
    .await;
    let _a = served(&pki, &host("a"), None, at).await;
    let _b = served(&pki, &host("b"), None, at).await;
    let counts = server.counts().conns;
    assert_eq!(counts.handshakes_in_progress, 6, "still stalled meanwhile");
    assert_eq!(counts.connections_open, 2);
}

#[tokio::test]
async fn a_handshake_that_never_finishes_gives_its_slot_back_at_its_own_deadline() {
    // Decision 0300: handshake_ms_max ends a handshake however long the idle timeout is.
    let logs = Logs::default();
    let _guard = logs.install();
    let pki = Pki::new();
    let limits = ConnLimits {
        handshake_ms_max: 200,
        ..wide()
    };
    let server = serving_limited(&pki, limits);
    let _stalled = stalled_handshakes(&pki, server.local_addr(), 3).await;
    wait_for("three handshakes ended at their deadline", || {
        let counts = server.counts();
        counts.handshakes_refused == 3 && counts.conns.handshakes_in_progress == 0
    })
    .await;
    let text = logs.text();
    assert!(text.contains("no handshake before the deadline"), "{text}");
}

#[tokio::test]
async fn past_the_threshold_an_unvalidated_address_gets_a_retry_and_holds_no_handshake_slot() {
    // Decision 0300: a spoofed source never answers a Retry, so it costs one stateless packet;
    // a real peer answers it and connects.
    let pki = Pki::new();
    let limits = ConnLimits {
        handshakes_max: 8,
        handshakes_per_ip_max: 8,
        handshakes_without_retry_max: 2,
        ..wide()
    };
    let server = serving_limited(&pki, limits);
    let at = server.local_addr();
    let _first = stalled_handshakes(&pki, at, 2).await;
    wait_for("two handshakes in progress", || {
        server.counts().conns.handshakes_in_progress == 2
    })
    .await;
    let _more = stalled_handshakes(&pki, at, 3).await;
    wait_for("three Retries sent", || {
        server.counts().conns.retries_sent == 3
    })
    .await;
    assert_eq!(server.counts().conns.handshakes_in_progress, 2);
    let raft = client(&pki, &replica(2));
    let answer = raft
        .request(at, MessageKind::Raft, b"y".to_vec(), timeout)
        .await;
    assert_eq!(answer, Ok(b"echo:y".to_vec()));
    let counts = server.counts().conns;
    assert_eq!(counts.retries_sent, 4, "the replica answered a Retry too");
    assert_eq!(counts.connections_open, 1);
}
