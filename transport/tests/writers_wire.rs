//! The writers table enforced on the wire (G10): a message a principal may not send is refused
//! with an answer naming principal and kind, counted, never handed to the handler, and the
//! connection keeps serving.

mod support;

use mesh_transport::{MessageKind, TransportError};
use support::*;

#[tokio::test]
async fn host_report_for_another_machine_is_refused_counted_and_connection_keeps_serving() {
    // G10: a host writes only its own reports.
    let pki = Pki::new();
    let (leader, recorder) = serving(&pki, &replica(1));
    let ace = client(&pki, &host("ace"));
    let err = ace
        .request(
            leader.local_addr(),
            report("g14"),
            b"forged".to_vec(),
            timeout,
        )
        .await
        .expect_err("refused");
    let TransportError::Refused { reason, .. } = err else {
        panic!("expected Refused, got {err:?}");
    };
    assert!(reason.contains("host:ace"), "{reason}");
    assert!(reason.contains("report for machine g14"), "{reason}");
    assert_eq!(leader.counts().denied, 1);
    assert!(recorder.seen().is_empty(), "handler saw a denied message");
    let ok = ace
        .request(
            leader.local_addr(),
            report("ace"),
            b"mine".to_vec(),
            timeout,
        )
        .await
        .expect("own report");
    assert_eq!(ok, b"echo:mine");
    assert_eq!(ace.counts().dials, 1, "the same connection served both");
    assert_eq!(recorder.seen().len(), 1);
}

#[tokio::test]
async fn every_principal_kind_is_refused_every_kind_it_may_not_send_over_the_wire() {
    // G10: the server checks each frame on receipt, for requests and one-way messages alike.
    let pki = Pki::new();
    let (server, recorder) = serving(&pki, &replica(9));
    let cases = [
        (
            replica(1),
            vec![
                MessageKind::Raft,
                MessageKind::Envelope,
                MessageKind::Forward,
            ],
        ),
        (host("ace"), vec![report("ace")]),
        (operator("alice"), vec![MessageKind::Command]),
    ];
    let all = [
        MessageKind::Raft,
        MessageKind::Envelope,
        report("ace"),
        MessageKind::Command,
        MessageKind::Forward,
    ];
    let mut refused = 0;
    for (principal, allowed) in &cases {
        let sender = client(&pki, principal);
        for kind in &all {
            let result = sender
                .request(server.local_addr(), kind.clone(), b"x".to_vec(), timeout)
                .await;
            if allowed.contains(kind) {
                result.expect("allowed kind");
            } else {
                refused += 1;
                assert!(
                    matches!(result, Err(TransportError::Refused { .. })),
                    "{principal} sending {kind}: {result:?}"
                );
            }
        }
    }
    assert_eq!(server.counts().denied, refused);
    assert_eq!(recorder.seen().len(), 5);
}

#[tokio::test]
async fn denied_one_way_message_never_reaches_the_handler() {
    // G10: one-way messages go through the same check.
    let pki = Pki::new();
    let (server, recorder) = serving(&pki, &replica(1));
    let alice = client(&pki, &operator("alice"));
    let _ = alice
        .send_one_way(
            server.local_addr(),
            MessageKind::Raft,
            b"forged".to_vec(),
            timeout,
        )
        .await;
    wait_for("denial counted", || server.counts().denied == 1).await;
    alice
        .send_one_way(
            server.local_addr(),
            MessageKind::Command,
            b"ok".to_vec(),
            timeout,
        )
        .await
        .expect("allowed one-way");
    wait_for("allowed one-way delivered", || recorder.seen().len() == 1).await;
    assert_eq!(recorder.seen()[0].kind, MessageKind::Command);
}
