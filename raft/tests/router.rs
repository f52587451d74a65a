//! The in-memory router's faults, observed through real replicas: one-direction cuts, isolation,
//! drops, and held messages delivered late.

mod support;

use std::time::Duration;

use openraft::network::{RPCOption, RaftNetwork, RaftNetworkFactory};
use openraft::raft::VoteRequest;

use mesh_raft::Vote;

use support::{Cluster, addr, fast_settings, wait_deadline};

/// Two replicas that were never bootstrapped: they grant any higher vote, which shows delivery.
async fn two_idle_replicas() -> Cluster {
    let mut cluster = Cluster::start(0, fast_settings(), 0).await;
    for id in 1..=2 {
        cluster.nodes.insert(id, addr(id));
        cluster.start_replica(id, false, 0).await;
    }
    cluster
}

async fn ask_vote(cluster: &Cluster, from: u64, to: u64, term: u64, ttl: Duration) -> bool {
    let mut client = cluster.router.network(from).new_client(to, &addr(to)).await;
    let request = VoteRequest::new(Vote::new(term, from), None);
    client.vote(request, RPCOption::new(ttl)).await.is_ok()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_direction_cut_loses_requests_that_way_and_replies_back() {
    // Fault injection: cut(a, b) stops a→b requests and the replies of b→a requests, nothing else.
    let cluster = two_idle_replicas().await;
    let ttl = Duration::from_secs(5);
    assert!(ask_vote(&cluster, 1, 2, 1, ttl).await);
    cluster.router.cut(1, 2);
    assert!(!ask_vote(&cluster, 1, 2, 2, ttl).await, "1→2 is cut");
    assert!(
        !ask_vote(&cluster, 2, 1, 2, ttl).await,
        "the reply 1→2 is cut"
    );
    cluster.router.mend(1, 2);
    assert!(ask_vote(&cluster, 1, 2, 3, ttl).await);
    assert!(ask_vote(&cluster, 2, 1, 3, ttl).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn isolated_node_neither_sends_nor_receives_until_it_rejoins() {
    // Fault injection: isolation cuts both directions.
    let cluster = two_idle_replicas().await;
    let ttl = Duration::from_secs(5);
    cluster.router.isolate(2);
    assert!(!ask_vote(&cluster, 1, 2, 1, ttl).await);
    assert!(!ask_vote(&cluster, 2, 1, 1, ttl).await);
    cluster.router.rejoin(2);
    assert!(ask_vote(&cluster, 1, 2, 2, ttl).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropped_messages_are_lost_at_the_configured_rate() {
    // Fault injection: a drop rate of 1000‰ loses every request; 0 stops dropping.
    let cluster = two_idle_replicas().await;
    let ttl = Duration::from_millis(50);
    cluster.router.drop_messages(1, 2, 1000);
    for term in 1..=3 {
        assert!(!ask_vote(&cluster, 1, 2, term, ttl).await);
    }
    assert_eq!(cluster.metrics(2).current_term, 0, "nothing was delivered");
    cluster.router.drop_messages(1, 2, 0);
    assert!(ask_vote(&cluster, 1, 2, 4, Duration::from_secs(5)).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn held_message_is_delivered_after_release_even_when_its_sender_gave_up() {
    // Fault injection: a held request arrives late (stale delivery), after its sender timed out.
    let cluster = two_idle_replicas().await;
    cluster.router.hold(1, 2);
    let sent = ask_vote(&cluster, 1, 2, 7, Duration::from_millis(50)).await;
    assert!(!sent, "the sender gave up while the message was held");
    assert_eq!(cluster.router.held_now(), 1);
    assert_eq!(
        cluster.metrics(2).current_term,
        0,
        "not delivered while held"
    );
    cluster.router.release(1, 2);
    cluster
        .replica(2)
        .raft()
        .wait(Some(wait_deadline))
        .metrics(|m| m.current_term == 7, "the held vote request arrives")
        .await
        .expect("held request delivered after release");
    assert_eq!(cluster.router.held_now(), 0);
}

#[test]
fn router_fault_names_the_link() {
    // Fault injection: errors say which message was stopped and why.
    let fault = mesh_raft::router::RouterFault {
        from: 1,
        to: 2,
        what: "is held",
    };
    assert_eq!(fault.to_string(), "router: message 1→2 is held");
}
