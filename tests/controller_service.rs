//! The replica service end to end in one process: three replicas over real QUIC, in-process mesh-host
//! agents, and an operator endpoint. Each test names the guarantee it checks.

mod controller_common;

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, OnceLock, Weak};

use controller_common::*;
use mesh::controller::Service;
use mesh::controller::api::{
    ApiError, Body, ErrorClass, PushError, PushOutcome, PushTarget, Request, SettingsError,
    SettingsRule,
};
use mesh::core::envelope::{Envelope, Position, Sealed};
use mesh::core::settings::Scope;
use mesh::core::wire::{EnvelopeReply, envelope_reply_what};
use mesh_transport::{BoxFuture, Endpoint, Handler, MessageKind, Principal, TransportConfig};

fn lines(body: &Body) -> BTreeMap<String, PushOutcome> {
    let Body::Push(view) = body else {
        panic!("not a push answer: {body:?}")
    };
    view.lines
        .iter()
        .map(|l| (l.machine.clone(), l.outcome.clone()))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn g1_push_of_the_consumer_alone_sends_the_provider_its_new_grant() {
    // G1: pushing only the consumer's machine mints the provision and sends the provider's machine
    // in the same push, named in the answer; no second push is needed.
    let bed = Bed::start(&["ace", "g14"], &[]).await;
    let leader = bed.wait_leader().await;
    bed.apply(leader, &provider_consumer_mesh()).await;
    let body = bed.push(leader, "g14", &[]).await.expect("push");
    let outcome = lines(&body);
    assert!(
        matches!(outcome.get("g14"), Some(PushOutcome::Applied { .. })),
        "{outcome:?}"
    );
    match outcome.get("ace") {
        Some(PushOutcome::Applied { reason, .. }) => assert!(reason.contains("g14"), "{reason}"),
        other => panic!("ace was not sent in the same push: {other:?}"),
    }
    let (_, declaration) = bed.hosts["ace"].agent.applied().await.expect("ace applied");
    let db = declaration
        .modules
        .iter()
        .find(|m| m.name == "db")
        .expect("db");
    assert_eq!(db.grants.len(), 1, "the provider got its grant");
    bed.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn g13_push_through_a_follower_is_forwarded_and_says_so() {
    // G13: any replica will do; a follower forwards to the leader and the answer names both.
    let bed = Bed::start(&["ace"], &[]).await;
    let leader = bed.wait_leader().await;
    let follower = bed.follower(leader);
    bed.apply(leader, &mount_mesh("/srv/a")).await;
    let request = Request::Push {
        target: PushTarget::Machine("ace".into()),
        why: "via a follower".into(),
        moves: vec![],
        plan: None,
    };
    let answer = bed.ask(follower, &request).await;
    assert_eq!(answer.forwarded_by, Some(follower));
    assert_eq!(answer.replica, leader);
    let body = answer.body.expect("push succeeds");
    assert!(matches!(
        lines(&body).get("ace"),
        Some(PushOutcome::Applied { .. })
    ));
    bed.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_stopped_while_a_request_searches_for_a_leader_stops_cleanly_and_frees_its_store()
{
    // A follower cut off from the other replicas searches for a leader for up to
    // `forward_find_ms`, longer than the stop's drain: the stop must not fail "busy" (meshd
    // would exit non-zero on SIGTERM and the store would stay open in its process). It stops Raft
    // under the search, which gives up, and the store opens again.
    let mut bed = Bed::start(&[], &[]).await;
    let leader = bed.wait_leader().await;
    let follower = bed.follower(leader);
    bed.isolate(follower);
    let running = bed.replicas.remove(&follower).expect("the follower runs");
    let idle_holders = Arc::strong_count(running.service());
    let service = running.service().clone();
    let request = Request::SettingsSet {
        scope: Scope::Mesh,
        layer: BTreeMap::from([("k".to_string(), "v".to_string())]),
        remove: BTreeSet::new(),
        replace: false,
        why: "asked of a replica that is stopping".into(),
    };
    let stop = async {
        // The request's handler holds the service while it searches.
        wait_until("the request in flight on the follower", || {
            std::future::ready(Arc::strong_count(&service) > idle_holders + 1)
        })
        .await;
        drop(service);
        running.shutdown().await
    };
    let ask = async {
        let call = mesh::controller::api::Call::new(request.clone()).expect("a request id");
        let body = mesh_codec::encode("request", &call).expect("encode");
        let peer =
            mesh_transport::Peer::expecting(bed.addrs[&follower], Principal::Replica(follower));
        bed.operator
            .request(
                peer,
                MessageKind::Command,
                body,
                std::time::Duration::from_secs(30),
            )
            .await
    };
    let (answer, stopped) = tokio::join!(ask, stop);
    assert!(
        stopped.is_ok(),
        "the stop failed instead of stopping Raft under the search: {stopped:?}"
    );
    // The operator hears no answer from a replica that stopped (its endpoint closed first), or
    // an error; never a write done.
    if let Ok(bytes) = answer {
        let answer: mesh::controller::api::Answer =
            mesh_codec::decode("answer", &bytes).expect("decode answer");
        assert!(
            answer.body.is_err(),
            "the write had no leader to go to: {:?}",
            answer.body
        );
    }
    bed.restart_replica(follower).await;
    bed.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn push_without_a_reason_or_to_an_unknown_machine_is_invalid_and_sends_nothing() {
    // G7: every push needs a why; a bare push has no wire form (PushTarget has no bare variant), so
    // the replica sees only named, --behind or --all pushes.
    let bed = Bed::start(&["ace"], &[]).await;
    let leader = bed.wait_leader().await;
    bed.apply(leader, &mount_mesh("/srv/a")).await;
    let no_why = Request::Push {
        target: PushTarget::Machine("ace".into()),
        why: "  ".into(),
        moves: vec![],
        plan: None,
    };
    let answer = bed.ask(leader, &no_why).await;
    assert!(
        matches!(answer.body, Err(ApiError::Push(PushError::NoReason))),
        "{answer:?}"
    );
    let unknown = bed.push(leader, "nowhere", &[]).await;
    assert!(
        matches!(&unknown, Err(ApiError::Push(PushError::UnknownMachine { machine })) if machine == "nowhere"),
        "{unknown:?}"
    );
    assert!(bed.hosts["ace"].agent.applied().await.is_none());
    bed.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn g8_mount_move_is_held_named_and_released_with_move() {
    // G8: a push that would move a running module's mount is held, naming module, mount and both
    // directories; `--move <module>` releases it.
    let bed = Bed::start(&["ace"], &[]).await;
    let leader = bed.wait_leader().await;
    bed.apply(leader, &mount_mesh("/srv/a")).await;
    bed.push(leader, "ace", &[]).await.expect("first push");
    bed.apply(leader, &mount_mesh("/srv/b")).await;
    let held = bed.push(leader, "ace", &[]).await.expect("push answers");
    match lines(&held).get("ace") {
        Some(PushOutcome::Held { holds, .. }) => {
            assert_eq!(holds.len(), 1);
            assert_eq!(holds[0].module, "broker");
            assert_eq!(holds[0].mount, "data");
            assert_eq!(holds[0].old_dir, "/srv/a");
            assert_eq!(holds[0].new_dir, "/srv/b");
        }
        other => panic!("ace not held: {other:?}"),
    }
    let Body::Status(status) = bed.ok(leader, &Request::Status).await else {
        panic!("status")
    };
    let ace = status
        .machines
        .iter()
        .find(|m| m.name == "ace")
        .expect("ace");
    assert_eq!(ace.holds.len(), 1, "status shows the hold");
    let moved = bed.push(leader, "ace", &["broker"]).await.expect("push");
    assert!(
        matches!(lines(&moved).get("ace"), Some(PushOutcome::Applied { .. })),
        "{moved:?}"
    );
    let Body::Status(status) = bed.ok(leader, &Request::Status).await else {
        panic!("status")
    };
    let ace = status
        .machines
        .iter()
        .find(|m| m.name == "ace")
        .expect("ace");
    assert!(ace.holds.is_empty(), "the hold is released");
    bed.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn g6_settings_removal_is_refused_without_replace_and_history_is_kept() {
    // G6: removing a key needs --replace (refused before anything is written); a replace lists what
    // it removes and keeps the old layer in the history.
    let bed = Bed::start(&[], &[]).await;
    let leader = bed.wait_leader().await;
    bed.apply(leader, &mount_mesh("/srv/a")).await;
    let set = |layer: &[(&str, &str)], remove: &[&str], replace: bool| Request::SettingsSet {
        scope: Scope::Mesh,
        layer: layer
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        remove: remove
            .iter()
            .map(|k| k.to_string())
            .collect::<BTreeSet<_>>(),
        replace,
        why: "test".into(),
    };
    bed.ok(leader, &set(&[("a", "1"), ("b", "2")], &[], false))
        .await;
    let settings_changes = |body: Body| match body {
        Body::History(page) => page
            .items
            .into_iter()
            .filter_map(|i| match i {
                mesh::controller::api::HistoryItem::Settings(c) => Some(c),
                _ => None,
            })
            .collect::<Vec<_>>(),
        other => panic!("{other:?}"),
    };
    let history = |body: Body| settings_changes(body).len();
    let show = Request::History {
        query: mesh::controller::api::HistoryQuery {
            limit: 1_000,
            settings_only: true,
            ..Default::default()
        },
    };
    let before = history(bed.ok(leader, &show).await);
    let refused = bed.ask(leader, &set(&[], &["b"], false)).await;
    assert!(
        matches!(
            refused.body,
            Err(ApiError::Settings(SettingsError::Rule {
                rule: SettingsRule::RemovalWithoutReplace,
                ..
            }))
        ),
        "{refused:?}"
    );
    assert_eq!(
        history(bed.ok(leader, &show).await),
        before,
        "nothing written"
    );
    let replaced = bed.ok(leader, &set(&[("a", "1")], &["b"], true)).await;
    match replaced {
        Body::SettingsSet { removed, .. } => assert_eq!(removed, vec!["b".to_string()]),
        other => panic!("{other:?}"),
    }
    let changes = settings_changes(bed.ok(leader, &show).await);
    assert_eq!(changes.len(), before + 1);
    let last = changes.last().expect("history");
    assert_eq!(
        last.before
            .as_ref()
            .and_then(|l| l.get("b"))
            .map(String::as_str),
        Some("2")
    );
    let module = Request::SettingsShow {
        scope: Some(Scope::Module("broker".into())),
        history: false,
    };
    let Body::Settings(view) = bed.ok(leader, &module).await else {
        panic!("settings")
    };
    let effective = view
        .effective
        .expect("a module scope shows its effective settings");
    assert_eq!(effective.get("a").map(String::as_str), Some("1"));
    assert!(!effective.contains_key("b"), "the removed key is gone");
    bed.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn g7_plan_diff_is_empty_after_a_leader_change_alone() {
    // G7: declarations carry no epoch, so a new leader plans the same declaration: empty diff.
    let mut bed = Bed::start(&["ace"], &[]).await;
    let leader = bed.wait_leader().await;
    bed.apply(leader, &mount_mesh("/srv/a")).await;
    let plan = Request::Plan {
        target: PushTarget::Machine("ace".into()),
        moves: vec![],
    };
    let Body::Plan(before) = bed.ok(leader, &plan).await else {
        panic!("plan")
    };
    assert!(
        !before.machines[0].changes.is_empty(),
        "never sent: the diff shows it all"
    );
    bed.push(leader, "ace", &[]).await.expect("push");
    let term = bed
        .service(leader)
        .replica()
        .metrics()
        .borrow()
        .current_term;
    bed.stop_replica(leader).await;
    let rest: Vec<u64> = bed.replicas.keys().copied().collect();
    let (new_leader, _) = bed.wait_leader_among(&rest, term).await;
    let Body::Plan(after) = bed.ok(new_leader, &plan).await else {
        panic!("plan")
    };
    let changes: Vec<_> = after.machines.iter().flat_map(|m| &m.changes).collect();
    assert!(changes.is_empty(), "{changes:?}");
    bed.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn g3_a_send_held_up_past_the_lease_on_its_way_out_leaves_no_byte_for_the_host() {
    // G3, the lease at the write: the envelope waits in the leader's transport (a held send
    // standing in for a dial backoff or a slow handshake) while the leader, cut off from the
    // other replicas, cannot renew its lease, until every lease it had has ended. The lease is
    // checked after that wait, so the send stops naming the lease and the host applies nothing.
    // (With the lease checked before the transport, the bytes left after the lease. A renewal
    // confirmed meanwhile would let the write go, decision 0221: hence the cut.)
    let bed = Bed::start(&["ace"], &[]).await;
    let leader = bed.wait_leader().await;
    bed.apply(leader, &mount_mesh("/srv/a")).await;
    let host = bed.hosts["ace"].endpoint.local_addr();
    let window = bed.service(leader).replica().config().lease_window();
    let faults = bed.service(leader).endpoint().faults();
    faults.hold(host);
    let push = bed.push(leader, "ace", &[]);
    let cut = async {
        mesh_testkit::wait_for("ace's envelope waiting in the leader's transport", || {
            faults.held_waiting(host) == 1
        })
        .await;
        bed.isolate(leader);
        // Every lease confirmed before the cut ends within one window of it.
        tokio::time::sleep(window * 2).await;
        faults.heal(host);
    };
    let (body, ()) = tokio::join!(push, cut);
    let body = body.expect("push answers");
    match lines(&body).get("ace") {
        Some(PushOutcome::Failed { error, .. }) => {
            assert!(error.starts_with("stopped"), "{error}");
            assert!(error.contains("lease"), "{error}");
        }
        other => panic!("expected a failed line naming the lease, got {other:?}"),
    }
    tokio::time::sleep(window * 2).await;
    assert!(bed.hosts["ace"].agent.applied().await.is_none());
    bed.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn g3_isolated_leader_sends_nothing_and_hosts_keep_the_newer_epoch() {
    // G3/G2: a leader cut off from the other replicas cannot confirm its lease: its push sends
    // nothing (refused or stopped), while the new leader's push is applied at a newer epoch.
    let bed = Bed::start(&["ace"], &[]).await;
    let old = bed.wait_leader().await;
    bed.apply(old, &mount_mesh("/srv/a")).await;
    let (new, new_term) = bed.isolate_and_elect(old).await;
    let pushed = bed.push(new, "ace", &[]).await.expect("new leader pushes");
    assert!(matches!(
        lines(&pushed).get("ace"),
        Some(PushOutcome::Applied { .. })
    ));
    let stale = bed.push(old, "ace", &[]).await;
    match &stale {
        Err(e) if e.class() == ErrorClass::Unavailable => {}
        Ok(body) => {
            for (m, o) in lines(body) {
                match o {
                    PushOutcome::Failed { error, .. } => assert!(error.contains("stopped"), "{m}"),
                    other => panic!("the old leader acted on {m}: {other:?}"),
                }
            }
        }
        other => panic!("{other:?}"),
    }
    let (position, _) = bed.hosts["ace"].agent.applied().await.expect("applied");
    assert_eq!(position.epoch, new_term, "the host keeps the newer epoch");
    bed.shutdown().await;
}

/// A stand-in for a host that, on each envelope, checks the signing replica's store already holds
/// the send record of that sequence (G4), then answers applied.
struct RecordChecker {
    services: OnceLock<BTreeMap<u64, Weak<Service>>>,
    seen: Mutex<Vec<(u64, u64, bool)>>,
}

impl Handler for RecordChecker {
    fn request(
        &self,
        _from: Principal,
        _kind: MessageKind,
        body: Vec<u8>,
    ) -> BoxFuture<'_, Result<Vec<u8>, String>> {
        Box::pin(async move {
            let sealed: Sealed = mesh_codec::decode("sealed", &body).map_err(|e| e.to_string())?;
            let envelope: Envelope =
                mesh_codec::decode("envelope", &sealed.body).map_err(|e| e.to_string())?;
            let services = self.services.get().ok_or("not ready")?;
            let signer = services
                .get(&envelope.signer)
                .and_then(Weak::upgrade)
                .ok_or("unknown signer")?;
            let recorded = signer
                .app()
                .state()
                .map_err(|e| e.to_string())?
                .last_sends
                .get(&envelope.machine)
                .is_some_and(|s| s.sequence >= envelope.sequence && s.epoch == envelope.epoch);
            self.seen
                .lock()
                .expect("lock")
                .push((envelope.epoch, envelope.sequence, recorded));
            let reply = EnvelopeReply::Applied {
                position: Position {
                    epoch: envelope.epoch,
                    sequence: envelope.sequence,
                },
                digest: mesh::core::compose::digest(&envelope.declaration),
            };
            mesh_codec::encode(envelope_reply_what, &reply).map_err(|e| e.to_string())
        })
    }

    fn one_way(&self, _: Principal, _: MessageKind, _: Vec<u8>) -> BoxFuture<'_, ()> {
        Box::pin(async {})
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn g4_send_record_is_committed_before_the_envelope_reaches_the_host() {
    // G4: when a host sees sequence N, the sending replica's store already has send record N.
    let any: SocketAddr = "127.0.0.1:0".parse().expect("addr");
    // The fake host needs a certificate from the bed's CA, so its port is picked first and the
    // checker is served on it once the bed exists.
    let probe = std::net::UdpSocket::bind(any).expect("reserve a port");
    let fake_addr = probe.local_addr().expect("addr");
    drop(probe);
    let bed = Bed::start(&[], &[("ace", fake_addr)]).await;
    let checker = Arc::new(RecordChecker {
        services: OnceLock::new(),
        seen: Mutex::new(Vec::new()),
    });
    let fake = Endpoint::bind(
        fake_addr,
        &bed.pki.identity(&Principal::Host("ace".into())),
        TransportConfig::default().check().expect("transport"),
    )
    .expect("fake host binds");
    let services = bed
        .replicas
        .iter()
        .map(|(id, r)| (*id, Arc::downgrade(r.service())))
        .collect();
    let _ = checker.services.set(services);
    fake.serve(checker.clone());
    let leader = bed.wait_leader().await;
    bed.apply(leader, &mount_mesh("/srv/a")).await;
    for _ in 0..3 {
        bed.push(leader, "ace", &[]).await.expect("push");
    }
    let seen = checker.seen.lock().expect("lock").clone();
    assert_eq!(seen.len(), 3, "{seen:?}");
    assert!(seen.iter().all(|(_, _, recorded)| *recorded), "{seen:?}");
    let sequences: Vec<u64> = seen.iter().map(|(_, s, _)| *s).collect();
    assert_eq!(sequences, vec![1, 2, 3]);
    fake.close().await;
    drop(checker);
    bed.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn g9_store_reset_below_the_floor_file_is_reported_and_the_term_starts_above_it() {
    // G9: a store found below the epoch floor kept beside it is said loudly (status) and the next
    // term is above every epoch used before.
    let mut bed = Bed::start_n(1, &[], &[]).await;
    let (_, term) = bed.wait_leader_among(&[1], 0).await;
    let dir = bed.configs[&1].data_dir().to_path_buf();
    wait_until("the floor file reaches the term", || {
        let dir = dir.clone();
        async move { mesh::controller::floor::read_floor(&dir).unwrap_or(0) >= term }
    })
    .await;
    bed.stop_replica(1).await;
    std::fs::remove_file(dir.join(mesh_raft::store_file_name)).expect("reset the store");
    bed.restart_replica(1).await;
    let (_, new_term) = bed.wait_leader_among(&[1], term).await;
    assert!(new_term > term);
    let Body::Status(status) = bed.ok(1, &Request::Status).await else {
        panic!("status")
    };
    let reset = status.store_reset.expect("store reset is reported");
    assert!(reset.contains("STORE RESET"), "{reset}");
    bed.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn g9_restore_from_a_snapshot_keeps_the_model_and_elects_above_its_floor() {
    // G9: a store restored from `snapshot save` bytes has the model back and starts its term above
    // the snapshot's epoch floor.
    let mut bed = Bed::start_n(1, &[], &[]).await;
    bed.wait_leader_among(&[1], 0).await;
    let Body::Applied { revision, .. } = bed.apply(1, &mount_mesh("/srv/a")).await else {
        panic!("apply")
    };
    let first = Request::SnapshotChunk {
        snapshot: None,
        offset: 0,
    };
    let Body::SnapshotChunk {
        bytes,
        total,
        epoch_floor,
        ..
    } = bed.ok(1, &first).await
    else {
        panic!("snapshot")
    };
    assert_eq!(total, bytes.len() as u64, "a small store is one chunk");
    let file = bed.dir.path().join("backup.snapshot");
    std::fs::write(&file, &bytes).expect("write snapshot");
    bed.stop_replica(1).await;
    let config = bed.configs[&1].clone();
    std::fs::remove_dir_all(config.data_dir()).expect("lose the disk");
    let restored = mesh::controller::restore::restore(&config, &file)
        .await
        .expect("restore");
    assert!(restored.term_floor >= epoch_floor);
    bed.restart_replica(1).await;
    let (_, term) = bed.wait_leader_among(&[1], 0).await;
    assert!(
        term > epoch_floor,
        "term {term} must be above the floor {epoch_floor}"
    );
    let Body::Status(status) = bed.ok(1, &Request::Status).await else {
        panic!("status")
    };
    assert_eq!(status.revision, revision, "the model came back");
    assert!(
        status.store_reset.is_none(),
        "a restore is not a silent reset"
    );
    bed.shutdown().await;
}

/// A clock that jumps forward a whole lease window on every reading, as if the process were paused
/// (SIGSTOP) between any two steps.
struct LeapingClock {
    readings: std::sync::atomic::AtomicU32,
    start: std::time::Instant,
}

impl mesh_raft::Clock for LeapingClock {
    fn now(&self) -> std::time::Instant {
        let n = self
            .readings
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        self.start + std::time::Duration::from_secs(10) * n
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn g3_leader_paused_past_its_lease_stops_the_push_and_nothing_leaves() {
    // G3: a leader that resumes after a pause finds its lease closed: the push stops with
    // "stopped", the log says so, and no mint, send record or envelope leaves.
    let clock = Arc::new(LeapingClock {
        readings: std::sync::atomic::AtomicU32::new(0),
        start: std::time::Instant::now(),
    });
    let bed = Bed::start_with_clock(1, &["ace"], &[], clock).await;
    bed.wait_leader_among(&[1], 0).await;
    bed.apply(1, &provider_consumer_mesh()).await;
    let body = bed.push(1, "g14", &[]).await.expect("push answers");
    let outcome = lines(&body);
    assert!(!outcome.is_empty());
    for (machine, o) in &outcome {
        match o {
            PushOutcome::Failed { error, .. } => {
                assert!(
                    error.starts_with("stopped: lease closed"),
                    "{machine}: {error}"
                )
            }
            other => panic!("{machine} was acted on: {other:?}"),
        }
    }
    let state = bed
        .service(1)
        .app()
        .state()
        .expect("state")
        .as_ref()
        .clone();
    assert!(state.provisions.is_empty(), "no mint was committed");
    assert!(state.last_sends.is_empty(), "no send was recorded");
    assert!(
        bed.hosts["ace"].agent.applied().await.is_none(),
        "nothing left"
    );
    bed.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn g5_host_reports_reach_the_leader_and_confirm_the_send() {
    // G5/G10: the host's reports (sent to any replica, redirected by followers) are filed by the
    // leader; once one confirms the last send, status no longer shows the machine behind.
    let bed = Bed::start(&["ace"], &[]).await;
    let leader = bed.wait_leader().await;
    bed.apply(leader, &mount_mesh("/srv/a")).await;
    let body = bed.push(leader, "ace", &[]).await.expect("push");
    let Some(PushOutcome::Applied { sequence, .. }) = lines(&body).get("ace").cloned() else {
        panic!("{body:?}")
    };
    let ace_confirmed = || async {
        let Body::Status(status) = bed.ok(leader, &Request::Status).await else {
            return false;
        };
        status.machines.iter().any(|m| {
            m.name == "ace" && !m.behind && m.last_report.is_some_and(|(_, s, _, _)| s == sequence)
        })
    };
    wait_until("a report confirms the send", ace_confirmed).await;
    bed.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn apply_and_settings_set_refuse_the_validation_holes_before_proposing() {
    // Issue 9: a request that skipped meshctl's local checks is refused by the controller itself
    // (Invalid, exit 2 — a state-machine refusal would be Refused): two modules on one port at
    // apply, a placement scope off the module's machine and a control character at settings set.
    let bed = Bed::start(&["ace", "g14"], &[]).await;
    let leader = bed.wait_leader().await;
    bed.apply(leader, &provider_consumer_mesh()).await;
    let revision = |body: Body| match body {
        Body::Status(s) => s.revision,
        other => panic!("{other:?}"),
    };
    let before = revision(bed.ok(leader, &Request::Status).await);
    let mut mesh = provider_consumer_mesh();
    let mut rogue = sleeper("rogue", "ace");
    rogue.provides.push(mesh::core::model::Provide {
        kind: "pg2".into(),
        port: Some(5999),
    });
    mesh.modules.insert("rogue".into(), rogue);
    let apply = Request::Apply {
        mesh,
        why: "skip meshctl".into(),
        drain: false,
    };
    let set = |scope: Scope, value: &str| Request::SettingsSet {
        scope,
        layer: BTreeMap::from([("k".to_string(), value.to_string())]),
        remove: BTreeSet::new(),
        replace: false,
        why: "skip meshctl".into(),
    };
    let off_machine = Scope::Placement {
        module: "db".into(),
        machine: "g14".into(),
    };
    for (request, says) in [
        (apply, "where module `db` listens too"),
        (set(off_machine, "v"), "module `db` runs on ace, not on g14"),
        (set(Scope::Mesh, "a\u{1b}b"), "control character (U+001B)"),
    ] {
        let answer = bed.ask(leader, &request).await;
        assert!(
            matches!(&answer.body, Err(e) if e.class() == ErrorClass::Invalid && e.to_string().contains(says)),
            "{says}: {answer:?}"
        );
    }
    assert_eq!(revision(bed.ok(leader, &Request::Status).await), before);
    bed.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn g9_an_epoch_a_host_cannot_prove_is_refused_and_a_proven_one_raises_the_floor() {
    // G9: one host certificate claiming epoch u64::MAX must not raise the floor (every later
    // election would overflow); the claim is refused and the cluster goes on. A claim carrying
    // the signed header of an envelope from a trusted replica does raise it.
    use mesh::core::envelope::{open_with_proof, seal};
    use mesh::core::report::Report;
    use mesh::core::wire::ReportReply;
    let bed = Bed::start(&["ace"], &[]).await;
    let leader = bed.wait_leader().await;
    bed.apply(leader, &mount_mesh("/srv/a")).await;
    let before = bed.epoch_floor(leader).await;
    let host = bed.endpoint_as(&Principal::Host("ace".into()));
    let send = |report: Report| {
        let (bed, host) = (&bed, &host);
        async move { bed.file_report(host, leader, &report).await }
    };
    let claim = |epoch: u64, report_sequence: u64| Report {
        machine: "ace".into(),
        epoch,
        sequence: 1,
        report_sequence,
        applied: None,
        modules: vec![],
        refused_older: 0,
        last_refusal: None,
        proof: None,
    };
    let refused = send(claim(u64::MAX, 1_000_000)).await;
    assert!(
        matches!(refused, ReportReply::Refused { .. }),
        "{refused:?}"
    );
    assert_eq!(
        bed.epoch_floor(leader).await,
        before,
        "an unproven claim moves nothing"
    );
    let pushed = bed
        .push(leader, "ace", &[])
        .await
        .expect("push after the claim");
    assert!(matches!(
        lines(&pushed).get("ace"),
        Some(PushOutcome::Applied { .. })
    ));
    let proven_epoch = before + 5;
    let envelope = bare_envelope("ace", proven_epoch, 1, 2);
    let wire = seal(&envelope, &replica_key(2)).expect("seal");
    let trusted = BTreeMap::from([(2, replica_key(2).verifying_key())]);
    let (_, proof) = open_with_proof(&wire, &trusted, "ace", None).expect("open");
    let mut proven = claim(proven_epoch, 1_000_001);
    proven.proof = Some(proof);
    let filed = send(proven).await;
    assert!(matches!(filed, ReportReply::Filed { .. }), "{filed:?}");
    assert_eq!(bed.epoch_floor(leader).await, proven_epoch);
    bed.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_are_linearizable_a_leader_cut_off_answers_no_read_a_newer_leader_outwrote() {
    // Decision 0288 (chaos's linearizability checker): a leader cut off from the others still
    // believes it leads for a while. A newer leader commits a setting; the old one must not
    // answer `settings show` (nor `history`, nor a `plan` of a model it no longer holds) from its
    // stale store: it cannot confirm it leads.
    let bed = Bed::start(&[], &[]).await;
    let old = bed.wait_leader().await;
    bed.apply(old, &mount_mesh("/srv/a")).await;
    let set = |value: &str| Request::SettingsSet {
        scope: Scope::Mesh,
        layer: BTreeMap::from([("k".to_string(), value.to_string())]),
        remove: BTreeSet::new(),
        replace: false,
        why: "test".into(),
    };
    let show = Request::SettingsShow {
        scope: Some(Scope::Mesh),
        history: false,
    };
    let value_of = |body: &Body| match body {
        Body::Settings(view) => view
            .layers
            .iter()
            .find(|(scope, _)| *scope == Scope::Mesh)
            .and_then(|(_, layer)| layer.get("k"))
            .cloned(),
        other => panic!("{other:?}"),
    };
    bed.ok(old, &set("old")).await;
    assert_eq!(value_of(&bed.ok(old, &show).await).as_deref(), Some("old"));
    let (new, _) = bed.isolate_and_elect(old).await;
    bed.ok(new, &set("new")).await;
    assert_eq!(value_of(&bed.ok(new, &show).await).as_deref(), Some("new"));
    bed.apply(new, &mount_mesh("/srv/b")).await;
    let plan = Request::Plan {
        target: PushTarget::All,
        moves: vec![],
    };
    let history = Request::History {
        query: mesh::controller::api::HistoryQuery {
            limit: 1_000,
            settings_only: true,
            ..Default::default()
        },
    };
    for request in [&show, &history, &plan] {
        let stale = bed.ask(old, request).await;
        match &stale.body {
            Err(e) => assert!(
                e.class() == ErrorClass::Unavailable,
                "the cut-off leader refuses the read as unavailable: {e:?}"
            ),
            Ok(body) => panic!("the cut-off leader answered a read from its stale store: {body:?}"),
        }
    }
    bed.shutdown().await;
}

/// What a viewer can see of the store: the revision, and the whole history.
async fn seen_by(bed: &Bed, viewer: &Endpoint, via: u64) -> (u64, Vec<String>) {
    let status = bed.ask_from(viewer, via, &Request::Status).await;
    let Ok(Body::Status(status)) = status.body else {
        panic!("a viewer's status via {via}: {:?}", status.body)
    };
    let history = Request::History {
        query: mesh::controller::api::HistoryQuery {
            limit: 1_000,
            ..Default::default()
        },
    };
    let history = bed.ask_from(viewer, via, &history).await;
    let Ok(Body::History(page)) = history.body else {
        panic!("a viewer's history via {via}: {:?}", history.body)
    };
    let items = page.items.iter().map(|i| format!("{i:?}")).collect();
    (status.revision, items)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn g10_a_viewer_reads_status_and_history_and_is_refused_every_write_leaving_the_store_as_it_was()
 {
    // G10 (who may send what), decision 0295: a viewer certificate reads, on the leader and
    // through a follower, and every write it sends is refused by name before anything runs; an
    // operator certificate is let through the same door.
    let bed = Bed::start(&["ace"], &[]).await;
    let leader = bed.wait_leader().await;
    let follower = bed.follower(leader);
    bed.apply(leader, &mount_mesh("/srv/a")).await;
    let viewer = bed.operator_as("monitor", mesh_transport::Role::Viewer);
    let before = seen_by(&bed, &viewer, leader).await;
    assert!(!before.1.is_empty(), "the apply is in the history");
    let set = Request::SettingsSet {
        scope: Scope::Mesh,
        layer: [("level".to_string(), "debug".to_string())].into(),
        remove: BTreeSet::new(),
        replace: false,
        why: "viewer".into(),
    };
    let writes = [
        (
            Request::Apply {
                mesh: mount_mesh("/srv/b"),
                why: "viewer".into(),
                drain: false,
            },
            "apply",
            mesh_transport::Role::Operator,
        ),
        (set.clone(), "settings set", mesh_transport::Role::Operator),
        (
            Request::Rollback {
                to_revision: 1,
                why: "viewer".into(),
                drain: false,
            },
            "rollback",
            mesh_transport::Role::Operator,
        ),
        (
            Request::SettingsRollback {
                scope: Scope::Mesh,
                to: 1,
                why: "viewer".into(),
            },
            "settings rollback",
            mesh_transport::Role::Operator,
        ),
        (
            Request::Push {
                target: PushTarget::Machine("ace".into()),
                why: "viewer".into(),
                moves: vec![],
                plan: None,
            },
            "push",
            mesh_transport::Role::Operator,
        ),
        (
            Request::CertsRevoke {
                target: "operator:alice".into(),
                why: "viewer".into(),
            },
            "certs revoke",
            mesh_transport::Role::Admin,
        ),
    ];
    for via in [leader, follower] {
        for (request, command, needed) in &writes {
            let answer = bed.ask_from(&viewer, via, request).await;
            // Refused where the certificate was read: a follower does not forward it.
            assert_eq!(answer.replica, via, "{command} via {via}");
            assert_eq!(answer.forwarded_by, None, "{command} via {via}");
            let Err(error) = answer.body else {
                panic!("a viewer's {command} via {via} was allowed");
            };
            assert_eq!(
                error,
                ApiError::Forbidden {
                    operator: "monitor".into(),
                    command: command.to_string(),
                    needed: *needed,
                    held: mesh_transport::Role::Viewer,
                }
            );
            assert_eq!(error.class(), ErrorClass::Refused);
            let text = error.to_string();
            assert!(
                text.contains(&format!(
                    "meshctl certs issue operator:monitor --role {needed}"
                )),
                "{text}"
            );
        }
        assert_eq!(seen_by(&bed, &viewer, via).await, before, "via {via}");
    }
    assert!(
        bed.hosts["ace"].agent.applied().await.is_none(),
        "nothing was pushed"
    );
    // The same door lets an operator certificate's settings set through.
    let operator = bed.operator_as("deploy", mesh_transport::Role::Operator);
    let answer = bed.ask_from(&operator, follower, &set).await;
    assert!(
        matches!(answer.body, Ok(Body::SettingsSet { .. })),
        "{:?}",
        answer.body
    );
    bed.shutdown().await;
}
