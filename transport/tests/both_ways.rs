//! One connection between a host and a replica carries messages both ways, whichever of the two
//! dialled it (decision 0316): a leader sends envelopes over the connection a host opened for its
//! reports, a host reports over the connection a leader opened for its envelopes, each side is
//! held to what the certificate the other presented at the handshake allows, and a side whose
//! shared connection closed dials again. A host that closes and starts again on its own address
//! (in the same process) binds it again and gets the leader's next send (decision 0325).

mod support;

use std::net::SocketAddr;
use std::sync::{Arc, OnceLock};

use mesh_transport::{BoxFuture, Endpoint, Handler, MessageKind, Peer, Principal, TransportError};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use support::*;

#[tokio::test]
async fn a_replica_sends_to_a_host_over_the_connection_the_host_opened() {
    // Decision 0316: a leader keeps one connection per reporting host, not one each way.
    let pki = Pki::new();
    let (leader, at_leader) = serving(&pki, &replica(1));
    let (ace, at_ace) = serving(&pki, &host("ace"));
    let filed = ace
        .request(leader.local_addr(), report("ace"), b"r1".to_vec(), timeout)
        .await;
    assert_eq!(filed, Ok(b"echo:r1".to_vec()));
    let to_ace = Peer::expecting(ace.local_addr(), host("ace"));
    let applied = leader
        .request(to_ace, MessageKind::Envelope, b"e1".to_vec(), timeout)
        .await;
    assert_eq!(applied, Ok(b"echo:e1".to_vec()));
    assert_eq!(
        at_ace.seen()[0].from,
        replica(1),
        "the host served the leader's envelope"
    );
    assert_eq!(at_leader.seen()[0].from, host("ace"));
    assert_eq!(
        (leader.counts().dials, ace.counts().dials),
        (0, 1),
        "the leader sent over the host's connection instead of dialling a second one"
    );
}

#[tokio::test]
async fn a_host_reports_over_the_connection_the_replica_opened() {
    // Decision 0316, the other order (a push reaches the host before its first report).
    let pki = Pki::new();
    let (leader, at_leader) = serving(&pki, &replica(1));
    let (ace, at_ace) = serving(&pki, &host("ace"));
    let to_ace = Peer::expecting(ace.local_addr(), host("ace"));
    let applied = leader
        .request(to_ace, MessageKind::Envelope, b"e1".to_vec(), timeout)
        .await;
    assert_eq!(applied, Ok(b"echo:e1".to_vec()));
    let principal = ace.peer_principal(leader.local_addr(), timeout).await;
    assert_eq!(
        principal,
        Ok(replica(1)),
        "the host reads who the leader is off the shared connection"
    );
    let filed = ace
        .request(leader.local_addr(), report("ace"), b"r1".to_vec(), timeout)
        .await;
    assert_eq!(filed, Ok(b"echo:r1".to_vec()));
    assert_eq!(
        at_leader.seen()[0].from,
        host("ace"),
        "the leader served the host's report"
    );
    assert_eq!(at_ace.seen()[0].from, replica(1));
    assert_eq!((leader.counts().dials, ace.counts().dials), (1, 0));
}

#[tokio::test]
async fn on_a_shared_connection_each_side_may_send_only_what_its_certificate_allows() {
    // G10 on a shared connection: the writers table reads the certificate the sender presented
    // at the handshake, whichever side dialled. A host's reports over a replica's connection are
    // still only its own reports; and a host shares its connection with replicas only: an
    // operator's certificate on the server side of a host's connection gets nothing sent back
    // over it (it must dial, and is refused as an operator there).
    let pki = Pki::new();
    let (leader, at_leader) = serving(&pki, &replica(1));
    let (ace, at_ace) = serving(&pki, &host("ace"));
    let to_ace = Peer::expecting(ace.local_addr(), host("ace"));
    let applied = leader
        .request(to_ace, MessageKind::Envelope, b"e1".to_vec(), timeout)
        .await;
    assert_eq!(applied, Ok(b"echo:e1".to_vec()));
    let raft = ace
        .request(
            leader.local_addr(),
            MessageKind::Raft,
            b"vote".to_vec(),
            timeout,
        )
        .await;
    assert!(
        matches!(&raft, Err(TransportError::Refused { reason, .. }) if reason.contains("host:ace may not send raft")),
        "a host's Raft message over the leader's connection is refused: {raft:?}"
    );
    let other = ace
        .request(leader.local_addr(), report("bob"), b"r1".to_vec(), timeout)
        .await;
    assert!(other.is_err(), "a host reports only for itself: {other:?}");
    assert_eq!(
        ace.counts().dials,
        0,
        "both went over the leader's connection"
    );
    assert_eq!(
        at_leader.seen().len(),
        0,
        "the leader's handler saw neither"
    );
    assert_eq!(leader.counts().denied, 2);

    let (rogue, _) = serving(&pki, &operator("mallory"));
    let filed = ace
        .request(rogue.local_addr(), report("ace"), b"r1".to_vec(), timeout)
        .await;
    assert_eq!(
        filed,
        Ok(b"echo:r1".to_vec()),
        "the rogue's own handler answers"
    );
    let envelope = rogue
        .request(
            Peer::expecting(ace.local_addr(), host("ace")),
            MessageKind::Envelope,
            b"forged".to_vec(),
            timeout,
        )
        .await;
    assert!(
        matches!(&envelope, Err(TransportError::Refused { reason, .. }) if reason.contains("operator:mallory may not send envelope")),
        "an operator's envelope is refused: {envelope:?}"
    );
    assert_eq!(
        rogue.counts().dials,
        1,
        "the host's connection was not shared with an operator"
    );
    assert_eq!(
        at_ace.seen().len(),
        1,
        "the host's handler saw only the leader's envelope"
    );
    assert_eq!(ace.counts().denied, 1);
}

#[tokio::test]
async fn a_replica_dials_a_host_whose_own_connection_closed() {
    // Decision 0316's fallback: a host that went away (here: started again on another address)
    // is dialled; its closed connection, still filed under its principal, is not used.
    let pki = Pki::new();
    let (leader, _) = serving(&pki, &replica(1));
    let (ace, _) = serving(&pki, &host("ace"));
    let filed = ace
        .request(leader.local_addr(), report("ace"), b"r1".to_vec(), timeout)
        .await;
    assert_eq!(filed, Ok(b"echo:r1".to_vec()));
    ace.close().await;
    drop(ace);
    wait_for("the leader to see the host's connection closed", || {
        leader.counts().conns.connections_open == 0
    })
    .await;
    let (again, at_again) = serving(&pki, &host("ace"));
    let applied = leader
        .request(
            Peer::expecting(again.local_addr(), host("ace")),
            MessageKind::Envelope,
            b"e1".to_vec(),
            timeout,
        )
        .await;
    assert_eq!(applied, Ok(b"echo:e1".to_vec()));
    assert_eq!(at_again.seen()[0].from, replica(1));
    assert_eq!(
        leader.counts().dials,
        1,
        "the leader dialled the host again"
    );
}

#[tokio::test]
async fn a_replica_sends_nothing_over_a_connection_an_older_host_gives_no_stream_credit_on() {
    // Mixed releases during an upgrade: a host from before decision 0316 grants no stream
    // credit on the connection it dialled (decision 0282) and never raises it. A send over it
    // would wait for credit until its deadline; the leader dials instead (here the old host's
    // socket serves nothing, so the dial gets no handshake).
    let pki = Pki::new();
    let (leader, at_leader) = serving(&pki, &replica(1));
    // An older release's dialling side, as its client config was: no credit for the peer.
    let issued = pki.issue(&host("ace"));
    let chain = vec![CertificateDer::from_pem_slice(issued.cert_pem().as_bytes()).expect("cert")];
    let key = PrivateKeyDer::from_pem_slice(issued.key_pem().as_bytes()).expect("key");
    let ca = CertificateDer::from_pem_slice(pki.ca.cert_pem().as_bytes()).expect("ca");
    let client = mesh_transport::tls::client_config_from_parts(&ca, chain, key, &config())
        .expect("client config");
    let mut socket = quinn::Endpoint::client(any_port()).expect("old host's endpoint");
    socket.set_default_client_config(client);
    let old_addr = socket.local_addr().expect("addr");
    let old_host = socket
        .connect(leader.local_addr(), mesh_transport::pki::server_name)
        .expect("connect")
        .await
        .expect("handshake");
    let answer = raw_request(&old_host, &request_frame(report("ace"), b"r1"), true).await;
    assert!(
        matches!(answer, Ok(Ok(_))),
        "the old host's report is served: {answer:?}"
    );
    assert_eq!(at_leader.seen().len(), 1);
    let sent = leader
        .request(
            Peer::expecting(old_addr, host("ace")),
            MessageKind::Envelope,
            b"e1".to_vec(),
            std::time::Duration::from_secs(1),
        )
        .await;
    // Waiting for credit on the old host's connection would end as `Timeout`; the dial ends
    // as `Unreachable` (the old host's socket answers no handshake).
    assert!(
        matches!(&sent, Err(TransportError::Unreachable { reason, .. }) if reason.contains("handshake")),
        "the leader dialled instead of waiting for credit: {sent:?}"
    );
    let opened =
        tokio::time::timeout(std::time::Duration::from_millis(100), old_host.accept_bi()).await;
    assert!(
        opened.is_err(),
        "nothing was opened on the old host's connection"
    );
}

/// A handler that holds its own endpoint, as a host's envelope handler does (it sets the deny
/// list of the declaration it applied on it), and otherwise records and echoes.
struct HoldsItsEndpoint {
    endpoint: OnceLock<Endpoint>,
    recorder: Recorder,
}

impl Handler for HoldsItsEndpoint {
    fn request(
        &self,
        from: Principal,
        kind: MessageKind,
        body: Vec<u8>,
    ) -> BoxFuture<'_, Result<Vec<u8>, String>> {
        self.recorder.request(from, kind, body)
    }

    fn one_way(&self, from: Principal, kind: MessageKind, body: Vec<u8>) -> BoxFuture<'_, ()> {
        self.recorder.one_way(from, kind, body)
    }
}

/// Host `ace` bound on `addr` and serving a [`HoldsItsEndpoint`]; `None` while `addr` is taken.
fn host_holding_its_endpoint(
    pki: &Pki,
    addr: SocketAddr,
) -> Option<(Endpoint, Arc<HoldsItsEndpoint>)> {
    let endpoint = Endpoint::bind(addr, &pki.identity(&host("ace")), config()).ok()?;
    let handler = Arc::new(HoldsItsEndpoint {
        endpoint: OnceLock::new(),
        recorder: Recorder::default(),
    });
    assert!(handler.endpoint.set(endpoint.clone()).is_ok());
    assert!(endpoint.serve(handler.clone()));
    Some((endpoint, handler))
}

#[tokio::test]
async fn a_host_restarted_on_its_own_address_gets_the_leaders_next_send() {
    // Decision 0325, the fault that had 0316 reverted (chaos processes seed 1592590339): a closed
    // endpoint whose handler holds it must still let its UDP port go, so a host restarted in
    // the same process binds its address again; the leader's next send reaches the new one.
    let pki = Pki::new();
    let (leader, _) = serving(&pki, &replica(1));
    let (ace, _) = host_holding_its_endpoint(&pki, any_port()).expect("bind ace");
    let addr = ace.local_addr();
    let filed = ace
        .request(leader.local_addr(), report("ace"), b"r1".to_vec(), timeout)
        .await;
    assert_eq!(filed, Ok(b"echo:r1".to_vec()));
    let to_ace = Peer::expecting(addr, host("ace"));
    let applied = leader
        .request(
            to_ace.clone(),
            MessageKind::Envelope,
            b"e1".to_vec(),
            timeout,
        )
        .await;
    assert_eq!(applied, Ok(b"echo:e1".to_vec()));
    assert_eq!(
        leader.counts().dials,
        0,
        "the envelope went over the host's own connection"
    );
    ace.close().await;
    drop(ace);
    let (again, at_again) = mesh_testkit::wait_value("the host's address to be free again", || {
        std::future::ready(host_holding_its_endpoint(&pki, addr))
    })
    .await;
    assert_eq!(again.local_addr(), addr);
    let applied = leader
        .request(to_ace, MessageKind::Envelope, b"e2".to_vec(), timeout)
        .await;
    assert_eq!(applied, Ok(b"echo:e2".to_vec()));
    let seen = at_again.recorder.seen();
    assert_eq!(
        (seen.len(), &seen[0].from, &seen[0].body),
        (1, &replica(1), &b"e2".to_vec()),
        "the restarted host served the leader's next envelope"
    );
}
