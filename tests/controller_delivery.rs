//! Delivery outcomes of a push, in one process over real QUIC (issue 9 part 6): a line says
//! "applied" only when the host confirmed it; what never left is "failed", never "sent".

mod controller_common;

use controller_common::*;
use mesh::controller::api::{Body, PushOutcome};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_machine_without_a_hosts_address_is_a_failed_line_not_sent() {
    // Scenario: g14 is in the model but not in the replicas' `[hosts]`. Pushing it records the
    // send, but nothing can leave: its line is failed and names `[hosts]`; the cascaded provider
    // on ace, which has an address, is applied.
    let bed = Bed::start(&["ace"], &[]).await;
    let leader = bed.wait_leader().await;
    bed.apply(leader, &provider_consumer_mesh()).await;
    let Ok(Body::Push(view)) = bed.push(leader, "g14", &[]).await else {
        panic!("push did not answer with its lines")
    };
    let outcome = |m: &str| {
        view.lines
            .iter()
            .find(|l| l.machine == m)
            .map(|l| l.outcome.clone())
    };
    match outcome("g14") {
        Some(PushOutcome::Failed { error, .. }) => {
            assert!(
                error.contains("no address") && error.contains("[hosts]"),
                "{error}"
            )
        }
        other => panic!("g14 without an address: {other:?}"),
    }
    assert!(
        matches!(outcome("ace"), Some(PushOutcome::Applied { .. })),
        "{view:?}"
    );
    bed.shutdown().await;
}
