//! A push no longer holds anything other requests need (issue 10 item 2): while one envelope of a
//! push is held on its way to a host, the push's other envelopes are applied, and `plan`,
//! `status`, `settings set` and `apply` all answer. Three replicas over real QUIC, in-process
//! hosts.

mod controller_common;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};

use controller_common::*;
use mesh::controller::api::{Body, PushOutcome, PushTarget, Request};
use mesh::core::settings::Scope;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_push_waiting_on_one_host_blocks_neither_its_other_sends_nor_plan_status_or_writes() {
    // Item 2: no lock is held across a network wait to a host. `push g14` sends g14 and (its new
    // grant) ace; ace's envelope is held in the leader's transport, so the push cannot answer
    // while it is held. Meanwhile g14 is applied, plan and status answer before the push does,
    // and a settings write and an apply answer too.
    let bed = Bed::start(&["ace", "g14"], &[]).await;
    let leader = bed.wait_leader().await;
    bed.apply(leader, &provider_consumer_mesh()).await;
    let ace = bed.hosts["ace"].endpoint.local_addr();
    let faults = bed.service(leader).endpoint().faults();
    faults.hold(ace);
    let done = AtomicBool::new(false);
    let push = async {
        let answer = bed.push(leader, "g14", &[]).await;
        done.store(true, Ordering::SeqCst);
        answer
    };
    let others = async {
        wait_until("ace's envelope held in the leader's transport", || {
            std::future::ready(faults.held(ace) == 1)
        })
        .await;
        wait_until("g14 applied while ace's envelope is held", || async {
            bed.hosts["g14"].agent.applied().await.is_some()
        })
        .await;
        let plan = bed
            .ok(
                leader,
                &Request::Plan {
                    target: PushTarget::Machine("ace".into()),
                    moves: vec![],
                },
            )
            .await;
        assert!(matches!(plan, Body::Plan(_)), "{plan:?}");
        let status = bed.ok(leader, &Request::Status).await;
        assert!(matches!(status, Body::Status(_)), "{status:?}");
        // The held envelope gives up at the transport's request timeout (3 s in this bed): the
        // reads above answered well inside it, while the push still waited.
        assert!(
            !done.load(Ordering::SeqCst),
            "plan and status answered only once the push had answered"
        );
        let set = Request::SettingsSet {
            scope: Scope::Machine("g14".into()),
            layer: BTreeMap::from([("k".to_string(), "v".to_string())]),
            remove: Default::default(),
            replace: false,
            why: "during a push".into(),
        };
        let set = bed.ok(leader, &set).await;
        assert!(matches!(set, Body::SettingsSet { .. }), "{set:?}");
        let mut mesh = provider_consumer_mesh();
        if let Some(app) = mesh.modules.get_mut("app") {
            app.env.insert("MODE".into(), "during-a-push".into());
        }
        let applied = bed.apply(leader, &mesh).await;
        assert!(matches!(applied, Body::Applied { .. }), "{applied:?}");
        faults.heal(ace);
    };
    let (pushed, ()) = tokio::join!(push, others);
    let Body::Push(view) = pushed.expect("the push answers") else {
        panic!("not a push answer");
    };
    let lines: BTreeMap<String, PushOutcome> = view
        .lines
        .into_iter()
        .map(|l| (l.machine, l.outcome))
        .collect();
    assert!(
        matches!(lines.get("g14"), Some(PushOutcome::Applied { .. })),
        "{lines:?}"
    );
    // Released after the lease it went out under closed (stopped by the gate at the write), or
    // given up at the request timeout (recorded, perhaps sent), or released in time (applied).
    match lines.get("ace") {
        Some(PushOutcome::Applied { .. } | PushOutcome::Sent { .. }) => {}
        Some(PushOutcome::Failed { error, .. }) if error.contains("stopped at the write") => {}
        other => panic!("ace: {other:?} in {lines:?}"),
    }
    bed.shutdown().await;
}
