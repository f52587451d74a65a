//! Raft never waits behind the fleet (issue 24 item 1, decisions 0320, 0338): a replica's Raft
//! core, the connections it dials to its peers and the ones its peers open to it run on a thread
//! of its own, so a leader whose service runtime is busy — fanning a push out to thousands of
//! hosts, composing, serving reports — keeps its heartbeats going, its followers quiet and its
//! term, and followers whose service runtimes are busy with the fleet's handshakes still answer
//! it. Three replicas, each with a service
//! runtime of its own as separate meshd processes have, endpoints bound on their Raft threads as
//! meshd binds them.

mod controller_common;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use controller_common::{Bed, Pki, transport};
use mesh::controller::RaftRuntime;
use mesh_raft::MonotonicClock;
use mesh_transport::{Endpoint, Principal};
use openraft::ServerState;

/// How long the leader's service runtime is kept busy: several times the bed's election window
/// (`fast_raft`: a follower campaigns 0.5–1 s after its last heartbeat, more with decision 0110's
/// slices).
const busy_ms: u64 = 3_000;

fn runtime(name: &str) -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .thread_name(name)
        .enable_all()
        .build()
        .expect("runtime")
}

/// A bed whose replica `id` serves on `services[id]`, its endpoint driven on its Raft thread.
async fn start_apart(services: &BTreeMap<u64, tokio::runtime::Handle>) -> Bed {
    let dir = tempfile::tempdir().expect("tempdir");
    let pki = Pki::in_dir(&dir.path().join("pki"));
    let mut bound = BTreeMap::new();
    let mut addrs = BTreeMap::new();
    for id in services.keys().copied() {
        let raft_runtime = RaftRuntime::new(id).expect("raft thread");
        let identity = pki.identity(&Principal::Replica(id));
        let config = transport().check().expect("transport");
        let endpoint = raft_runtime
            .enter(|| Endpoint::bind(mesh_testkit::loopback(), &identity, config))
            .expect("bind replica");
        addrs.insert(id, endpoint.local_addr());
        bound.insert(id, (endpoint, raft_runtime));
    }
    let operator = Endpoint::bind(
        mesh_testkit::loopback(),
        &pki.identity(&Principal::Operator("alice".into())),
        transport().check().expect("transport"),
    )
    .expect("bind operator");
    let mut bed = Bed {
        dir,
        pki,
        replicas: BTreeMap::new(),
        configs: BTreeMap::new(),
        addrs,
        hosts: BTreeMap::new(),
        operator,
    };
    for (id, (endpoint, raft_runtime)) in bound {
        let config = bed.write_config(id, &BTreeMap::new());
        bed.configs.insert(id, config.clone());
        let clock = Arc::new(MonotonicClock);
        let running = services[&id]
            .spawn(mesh::controller::start_in(
                config,
                endpoint,
                clock,
                raft_runtime,
            ))
            .await
            .expect("the start task")
            .expect("replica starts");
        bed.replicas.insert(id, running);
    }
    bed
}

#[test]
fn g3_a_leader_whose_service_threads_are_busy_keeps_its_heartbeats_and_its_term() {
    let services: BTreeMap<u64, tokio::runtime::Runtime> = (1..=3)
        .map(|id| (id, runtime(&format!("service-{id}"))))
        .collect();
    let handles: BTreeMap<u64, tokio::runtime::Handle> = services
        .iter()
        .map(|(id, r)| (*id, r.handle().clone()))
        .collect();
    let control = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    control.block_on(async {
        let mut bed = start_apart(&handles).await;
        let leader = bed.wait_leader().await;
        let term = bed.term(leader);
        // Settle: every follower heard the leader of this term.
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert_eq!(bed.term(leader), term, "the bed settled in one term");
        // The leader's service runtime does nothing else for a while: its one worker thread
        // computes (here: sleeps) without yielding, as a long compose or a flood of handshakes
        // would keep it.
        handles[&leader].spawn(async {
            std::thread::sleep(Duration::from_millis(busy_ms));
        });
        tokio::time::sleep(Duration::from_millis(busy_ms + 500)).await;
        for id in bed.replicas.keys() {
            assert_eq!(
                bed.term(*id),
                term,
                "replica {id} moved to another term while the leader's service threads were busy: Raft waited behind them"
            );
        }
        let state = bed.service(leader).replica().metrics().borrow().state;
        assert_eq!(state, ServerState::Leader, "replica {leader} still leads");
        for (_, running) in std::mem::take(&mut bed.replicas) {
            running.shutdown().await.expect("shutdown");
        }
    });
    drop(services);
}

#[test]
fn g3_followers_whose_service_threads_are_busy_still_answer_the_leader() {
    let services: BTreeMap<u64, tokio::runtime::Runtime> = (1..=3)
        .map(|id| (id, runtime(&format!("service-{id}"))))
        .collect();
    let handles: BTreeMap<u64, tokio::runtime::Handle> = services
        .iter()
        .map(|(id, r)| (*id, r.handle().clone()))
        .collect();
    let control = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    control.block_on(async {
        let mut bed = start_apart(&handles).await;
        let leader = bed.wait_leader().await;
        let term = bed.term(leader);
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert_eq!(bed.term(leader), term, "the bed settled in one term");
        // Both followers' service runtimes do nothing else for a while, as 10,000 hosts'
        // handshakes and reports would keep them: the leader's heartbeats and lease rounds are
        // answered only if its connections to them are served elsewhere.
        let followers: Vec<u64> = bed.replicas.keys().copied().filter(|id| *id != leader).collect();
        for id in &followers {
            handles[id].spawn(async {
                std::thread::sleep(Duration::from_millis(busy_ms));
            });
        }
        tokio::time::sleep(Duration::from_millis(busy_ms + 500)).await;
        for id in bed.replicas.keys() {
            assert_eq!(
                bed.term(*id),
                term,
                "replica {id} moved to another term while the followers' service threads were busy: the leader's connections waited behind them"
            );
        }
        let state = bed.service(leader).replica().metrics().borrow().state;
        assert_eq!(state, ServerState::Leader, "replica {leader} still leads");
        for (_, running) in std::mem::take(&mut bed.replicas) {
            running.shutdown().await.expect("shutdown");
        }
    });
    drop(services);
}
