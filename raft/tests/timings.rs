//! Raft timings are one cluster-wide setting (decision 0150): over real QUIC, a replica whose
//! election timeout differs from its peers' is refused by them — it never joins — while the other
//! two keep electing and committing; a replica about to start learns of the difference from any
//! peer that answers, and a peer that does not answer blocks nothing.

mod support;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::Duration;

use mesh_raft::{NodeId, RaftSettings, check_peer_timings, probe_replica};

use support::fast_settings;
use support::quic::QuicCluster;

const frame_bytes_max: u32 = 1024 * 1024;
const probe_timeout: Duration = Duration::from_millis(1000);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn g3_a_replica_with_another_election_timeout_is_refused_and_the_others_keep_working() {
    // G3: the lease (election_timeout_min − margin on the leader) is only safe when every
    // follower waits at least that long; a replica with other timings must not take part.
    let odd = RaftSettings {
        election_timeout_max_ms: 900,
        ..fast_settings()
    };
    let cluster =
        QuicCluster::start(vec![fast_settings(), fast_settings(), odd], frame_bytes_max).await;
    let leader = cluster.wait_leader_among(&[1, 2]).await;
    let term = cluster.replica(leader).metrics().borrow().current_term;
    // Several commits, each applied by both agreeing replicas: heartbeats and appends to 3 were
    // sent all along, and 3 campaigned meanwhile (its own timer runs).
    let mut first = None;
    for i in 0..5 {
        let index = cluster.set(leader, &format!("k{i}"), vec![i]).await;
        first.get_or_insert(index);
        for id in [1, 2] {
            cluster.wait_applied(id, index).await;
        }
    }
    let first = first.expect("wrote");
    let three = cluster.replica(3).metrics().borrow().clone();
    assert!(
        three.last_log_index.unwrap_or(0) < first,
        "replica 3 received entries despite its other timings: {three:?}"
    );
    assert_eq!(cluster.read(3, "k0"), None);
    // 3's campaigns (at ever higher terms) were refused: the two kept their leader and term.
    let now = cluster.replica(leader).metrics().borrow().clone();
    assert_eq!(
        (now.current_leader, now.current_term),
        (Some(leader), term),
        "replica 3 disturbed the leader"
    );

    // Its messages are refused with one error naming both sides' timings and the fix.
    let from_three = &cluster.nodes[&3].endpoint;
    let refused = probe_replica(
        from_three,
        &cluster.configs[&3].timings(),
        leader,
        cluster.addrs[&leader],
        probe_timeout,
    )
    .await
    .expect_err("the leader refuses replica 3");
    let said = refused.to_string();
    for part in [
        "election_timeout_max_ms = 800",
        "election_timeout_max_ms = 900",
        &format!("replica {leader} runs"),
        "replica 3 runs",
        "set the same [raft] section in every replica.toml",
    ] {
        assert!(said.contains(part), "`{part}` missing from: {said}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn g3_a_replica_refuses_to_start_when_an_answering_peer_runs_other_timings() {
    // G3: meshd asks its peers before it starts; one answering with other timings stops it, one
    // that does not answer does not.
    let cluster = QuicCluster::start(vec![fast_settings(); 2], frame_bytes_max).await;
    cluster.wait_leader().await;
    let silent: SocketAddr = {
        let socket = std::net::UdpSocket::bind("127.0.0.1:0").expect("bind");
        socket.local_addr().expect("addr")
    };
    let mut peers: BTreeMap<NodeId, SocketAddr> = cluster.addrs.clone();
    peers.insert(9, silent);
    // Replica 1 asks: 2 answers the same, 9 is silent.
    let checked = check_peer_timings(
        &cluster.nodes[&1].endpoint,
        &cluster.configs[&1].timings(),
        &peers,
        probe_timeout,
    )
    .await
    .expect("same timings and a silent peer do not block a start");
    assert_eq!(checked.same, vec![2]);
    assert_eq!(
        checked.silent.iter().map(|(id, _)| *id).collect::<Vec<_>>(),
        vec![9]
    );
    // A replica 3 with another election timeout, about to start: refused by whoever answers.
    let three = mesh_transport::Endpoint::bind(
        "127.0.0.1:0".parse().expect("addr"),
        &support::quic::identity(&cluster.ca, 3),
        cluster.transport(),
    )
    .expect("bind");
    let odd = RaftSettings {
        election_timeout_min_ms: 500,
        ..fast_settings()
    }
    .validate()
    .expect("valid");
    peers.insert(3, three.local_addr());
    let differ = check_peer_timings(&three, &odd.timings(), &peers, probe_timeout)
        .await
        .expect_err("replica 3 must not start");
    assert_eq!(differ.own, 3);
    assert!([1, 2].contains(&differ.peer), "{differ:?}");
    assert_eq!(differ.theirs, cluster.configs[&1].timings());
    assert!(
        differ.to_string().contains("election_timeout_min_ms = 500"),
        "{differ}"
    );
}
