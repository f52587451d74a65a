//! A push streams its lines (issue 13 part 1, decision 0190): the line of a machine that applied
//! reaches the operator while another machine's envelope is still held in the leader's
//! transport, asked of the leader and through a forwarding follower; the answer comes once the
//! held envelope is let go, and carries every line. Three replicas over real QUIC, in-process
//! hosts.

mod controller_common;

use std::collections::BTreeMap;
use std::time::Duration;

use controller_common::*;
use mesh::controller::api::{
    Answer, Body, Call, PushEvent, PushOutcome, PushTarget, Request, push_event_what,
};
use mesh_transport::{MessageKind, Part, Peer, Principal, Streaming};

/// Asks replica `id` to push `machine` (its cascade follows), asking for a streamed answer.
async fn push_streamed(bed: &Bed, id: u64, machine: &str) -> Streaming {
    let call = Call::new(Request::Push {
        target: PushTarget::Machine(machine.into()),
        why: "streamed".into(),
        moves: vec![],
        plan: None,
    })
    .expect("a request id");
    let body = mesh_codec::encode("request", &call).expect("encode");
    let peer = Peer::expecting(bed.addrs[&id], Principal::Replica(id));
    let timeout = Duration::from_secs(30);
    bed.operator
        .request_stream(peer, MessageKind::Command, body, timeout, timeout)
        .await
        .expect("the replica takes the push")
}

/// The next event of the stream; panics on the answer.
async fn next_event(stream: &mut Streaming) -> PushEvent {
    match stream.next().await.expect("a part") {
        Part::Chunk(chunk) => mesh_codec::decode(push_event_what, &chunk).expect("an event"),
        Part::Answer(bytes) => {
            let answer: Answer = mesh_codec::decode("answer", &bytes).expect("answer");
            panic!("the push answered before the line came: {answer:?}")
        }
    }
}

/// `push g14` sends g14 and (its new grant) ace; ace's envelope is held in the leader's
/// transport. g14's line must be read while ace's send still waits there; then ace is let go
/// and the answer comes with both lines.
async fn fast_line_before_slow_send(via_follower: bool) {
    let bed = Bed::start(&["ace", "g14"], &[]).await;
    let leader = bed.wait_leader().await;
    bed.apply(leader, &provider_consumer_mesh()).await;
    let asked = if via_follower {
        bed.follower(leader)
    } else {
        leader
    };
    let ace = bed.hosts["ace"].endpoint.local_addr();
    let faults = bed.service(leader).endpoint().faults();
    faults.hold(ace);
    let mut stream = push_streamed(&bed, asked, "g14").await;
    let PushEvent::Begin { machines, .. } = next_event(&mut stream).await else {
        panic!("the first event is not the push's plan");
    };
    assert_eq!(
        machines.iter().map(String::as_str).collect::<Vec<_>>(),
        ["g14", "ace"],
        "plan order: the target, then its cascade"
    );
    let PushEvent::Line(line) = next_event(&mut stream).await else {
        panic!("a second plan");
    };
    assert_eq!(line.machine, "g14", "{line:?}");
    assert!(
        matches!(line.outcome, PushOutcome::Applied { .. }),
        "{line:?}"
    );
    // The guarantee: g14's line came while ace's send still waits in the leader's transport (a
    // driver that kept its lines for the answer sends them only once ace's send gave up).
    assert_eq!(
        faults.held_waiting(ace),
        1,
        "ace's send was no longer waiting when g14's line came: the line was not streamed"
    );
    faults.heal(ace);
    let mut lines = BTreeMap::new();
    let answer = loop {
        match stream.next().await.expect("a part") {
            Part::Chunk(chunk) => {
                let event: PushEvent =
                    mesh_codec::decode(push_event_what, &chunk).expect("an event");
                let PushEvent::Line(line) = event else {
                    panic!("a plan after the lines: {event:?}");
                };
                lines.insert(line.machine, line.outcome);
            }
            Part::Answer(bytes) => {
                break mesh_codec::decode::<Answer>("answer", &bytes).expect("answer");
            }
        }
    };
    assert!(lines.contains_key("ace"), "ace's line streamed: {lines:?}");
    assert_eq!(answer.replica, leader);
    assert_eq!(answer.forwarded_by, via_follower.then_some(asked));
    let Ok(Body::Push(view)) = answer.body else {
        panic!("not a push answer: {:?}", answer.body);
    };
    let summary: BTreeMap<String, PushOutcome> = view
        .lines
        .into_iter()
        .map(|l| (l.machine, l.outcome))
        .collect();
    assert!(
        matches!(summary.get("g14"), Some(PushOutcome::Applied { .. })),
        "{summary:?}"
    );
    assert_eq!(
        summary.get("ace"),
        lines.get("ace"),
        "the summary says what streamed"
    );
    bed.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn i13_a_fast_machines_line_streams_while_a_slow_machines_send_is_held() {
    fast_line_before_slow_send(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn i13_a_forwarding_follower_relays_the_lines_as_they_come() {
    fast_line_before_slow_send(true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn i13_a_push_asked_for_one_answer_still_answers_once_and_other_requests_are_unchanged() {
    // Old peers: a caller that does not ask for a stream gets the one answer it always got,
    // with every line; status through a follower is unchanged.
    let bed = Bed::start(&["ace", "g14"], &[]).await;
    let leader = bed.wait_leader().await;
    bed.apply(leader, &provider_consumer_mesh()).await;
    let follower = bed.follower(leader);
    let pushed = bed.push(follower, "g14", &[]).await.expect("push answers");
    let Body::Push(view) = pushed else {
        panic!("not a push answer: {pushed:?}");
    };
    let machines: Vec<&str> = view.lines.iter().map(|l| l.machine.as_str()).collect();
    assert_eq!(machines, ["g14", "ace"]);
    let status = bed.ok(follower, &Request::Status).await;
    assert!(matches!(status, Body::Status(_)), "{status:?}");
    bed.shutdown().await;
}
