//! mesh-host over real QUIC on loopback, with certificates from the transport PKI: envelopes from
//! replicas are applied and answered (G2), envelopes from any other principal are refused by the
//! writers table (G10), and reports reach the replicas — following a `NotLeader` redirect, bounded,
//! and in order after an outage (G5). Fake replicas here are real transport endpoints with replica
//! certificates whose handler records what it is sent.

mod host_common;

use host_common::*;
use mesh::core::compose::digest as declaration_digest;
use mesh::core::report::Report;
use mesh::core::wire::{
    EnvelopeReply, ReportReply, check_report_machine, envelope_reply_what, report_reply_what,
    report_what,
};
use mesh::host::{Agent, QuicSink, ReportSink, SinkError, listener};
use mesh_transport::{
    BoxFuture, Endpoint, Handler, MessageKind, Principal, TransportConfig, TransportError,
};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

const request_timeout: Duration = Duration::from_secs(10);

fn any_port() -> SocketAddr {
    "127.0.0.1:0".parse().expect("loopback")
}

/// A replica address for a host whose reports go nowhere in the test (port 9, discard: a config
/// refuses port 0, which cannot be dialled).
fn no_replica() -> SocketAddr {
    "127.0.0.1:9".parse().expect("loopback")
}

fn endpoint(pki: &Pki, principal: &Principal) -> Endpoint {
    let config = TransportConfig::default()
        .check()
        .expect("transport config");
    Endpoint::bind(any_port(), &pki.identity(principal), config).expect("bind")
}

/// What a fake replica answers to a report.
enum Answer {
    File,
    Redirect(String),
}

/// A replica's report handler for tests: checks the body against the frame, records, answers.
struct ReplicaLog {
    answer: Mutex<Answer>,
    asked: AtomicUsize,
    reports: Mutex<Vec<(Principal, Report)>>,
}

impl ReplicaLog {
    fn new(answer: Answer) -> Arc<ReplicaLog> {
        Arc::new(ReplicaLog {
            answer: Mutex::new(answer),
            asked: AtomicUsize::new(0),
            reports: Mutex::new(Vec::new()),
        })
    }

    fn reports(&self) -> Vec<(Principal, Report)> {
        self.reports.lock().expect("lock").clone()
    }

    fn sequences(&self) -> Vec<u64> {
        self.reports()
            .iter()
            .map(|(_, r)| r.report_sequence)
            .collect()
    }

    fn report(&self, from: Principal, frame: &str, body: &[u8]) -> Result<Vec<u8>, String> {
        self.asked.fetch_add(1, Ordering::SeqCst);
        let report: Report = mesh_codec::decode(report_what, body).map_err(|e| e.to_string())?;
        check_report_machine(frame, &report).map_err(|e| e.to_string())?;
        let reply = match &*self.answer.lock().expect("lock") {
            Answer::File => {
                self.reports.lock().expect("lock").push((from, report));
                ReportReply::Filed { accepted: true }
            }
            Answer::Redirect(leader) => ReportReply::NotLeader {
                leader: Some(leader.clone()),
            },
        };
        mesh_codec::encode(report_reply_what, &reply).map_err(|e| e.to_string())
    }
}

impl Handler for ReplicaLog {
    fn request(
        &self,
        from: Principal,
        kind: MessageKind,
        body: Vec<u8>,
    ) -> BoxFuture<'_, Result<Vec<u8>, String>> {
        Box::pin(async move {
            match kind {
                MessageKind::Report { machine: frame } => self.report(from, &frame, &body),
                other => Err(format!("fake replica takes only reports, not {other}")),
            }
        })
    }

    fn one_way(&self, _from: Principal, _kind: MessageKind, _body: Vec<u8>) -> BoxFuture<'_, ()> {
        Box::pin(async {})
    }
}

/// A replica endpoint serving `log`.
fn fake_replica(pki: &Pki, id: u64, log: &Arc<ReplicaLog>) -> Endpoint {
    let replica = endpoint(pki, &Principal::Replica(id));
    assert!(replica.serve(log.clone()));
    replica
}

async fn send_envelope(
    from: &Endpoint,
    host: SocketAddr,
    wire: &[u8],
) -> Result<EnvelopeReply, TransportError> {
    let answer = from
        .request(host, MessageKind::Envelope, wire.to_vec(), request_timeout)
        .await?;
    Ok(mesh_codec::decode(envelope_reply_what, &answer).expect("an envelope reply"))
}

/// The same envelope from replica 1's certificate, which signed it, is applied.
async fn applies_from_replica_1(pki: &Pki, host: SocketAddr, wire: &[u8]) {
    let replica = endpoint(pki, &Principal::Replica(1));
    let reply = send_envelope(&replica, host, wire).await.expect("answered");
    assert!(matches!(reply, EnvelopeReply::Applied { .. }), "{reply:?}");
}

fn log_of(fx: &Fixture) -> std::path::PathBuf {
    fx.dir.path().join("mesh-host.log")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn g2_envelope_from_a_replica_certificate_is_applied_by_mesh_host_and_answered_applied() {
    // G2 over the wire: the mesh-host process takes a sealed envelope from a replica certificate,
    // applies it and answers Applied with its digest; a replay is answered Refused, older.
    let (fx, pki) = (Fixture::new(), Pki::new());
    let leader_log = ReplicaLog::new(Answer::File);
    let leader = fake_replica(&pki, 1, &leader_log);
    let config = fx.write_process_config(&pki, &[leader.local_addr()]);
    let mut host = HostProcess::spawn(&config, &log_of(&fx));
    let addr = host.listening(&fx.root()).await;

    let module = shell("web", "echo $$ > pid; exec sleep 600");
    let declared = envelope(1, 1, vec![module.clone()], vec![]).declaration;
    let wire = fx.seal(1, 1, vec![module]);
    let replica = endpoint(&pki, &Principal::Replica(1));
    let reply = send_envelope(&replica, addr, &wire)
        .await
        .expect("answered");
    let digest = declaration_digest(&declared);
    let position = mesh::core::envelope::Position {
        epoch: 1,
        sequence: 1,
    };
    assert_eq!(reply, EnvelopeReply::Applied { position, digest });
    let pid_file = fx.module_dir("web").join("pid");
    wait_until("the module to run", || async {
        read(&pid_file).trim().parse::<u32>().is_ok()
    })
    .await;
    let _group = GroupGuard(vec![read(&pid_file).trim().parse().expect("pid")]);

    let again = send_envelope(&replica, addr, &wire)
        .await
        .expect("answered");
    assert!(
        matches!(again, EnvelopeReply::Refused { older: true, .. }),
        "{again:?}"
    );
    wait_until("the apply report at the leader", || async {
        let reports = leader_log.reports();
        reports.iter().any(|(_, r)| r.applied == Some(digest))
    })
    .await;
    drop(host);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn g10_envelope_from_a_host_or_operator_certificate_is_refused_and_nothing_applied() {
    // G10: only replicas write envelopes. The same valid envelope from host:ace itself or from an
    // operator is refused by the writers table before the agent sees it: the sender gets an
    // error, the denial is counted, the high-water mark stays, and a replica can still send it.
    let (fx, pki) = (Fixture::new(), Pki::new());
    let config = fx.process_config(&pki, &[no_replica()]);
    let endpoint_host = listener::bind(&config).expect("bind");
    let agent = Arc::new(Agent::open(config, fx.sink.clone()).expect("open"));
    let _fatal = listener::serve(&endpoint_host, agent.clone()).expect("serve");
    let addr = endpoint_host.local_addr();
    let wire = fx.seal(1, 1, vec![shell("web", "exec sleep 600")]);

    let strangers = [host_principal(), Principal::Operator("alice".into())];
    for stranger in &strangers {
        let sender = endpoint(&pki, stranger);
        let err = send_envelope(&sender, addr, &wire)
            .await
            .expect_err("refused");
        let TransportError::Refused { reason, .. } = &err else {
            panic!("expected a refusal, got {err:?}");
        };
        assert!(reason.contains(&stranger.to_string()), "{reason}");
    }
    assert_eq!(endpoint_host.counts().denied, strangers.len() as u64);
    assert_eq!(
        agent.high_water().await,
        None,
        "a refused envelope moved the mark"
    );
    assert_eq!(
        agent.refusals().await.total,
        0,
        "the agent saw a denied envelope"
    );
    assert!(agent.status().await.is_empty(), "a module started");

    applies_from_replica_1(&pki, addr, &wire).await;
    agent.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn g2_an_envelope_signed_by_one_replica_and_sent_with_another_replicas_certificate_is_refused()
 {
    // Issue 27: a replica sends only what it signed itself. Replica 1's valid envelope, replayed
    // with replica 2's certificate, is refused by name before the mark moves; from replica 1 it
    // applies.
    let (fx, pki) = (Fixture::new(), Pki::new());
    let config = fx.process_config(&pki, &[no_replica()]);
    let endpoint_host = listener::bind(&config).expect("bind");
    let agent = Arc::new(Agent::open(config, fx.sink.clone()).expect("open"));
    let _fatal = listener::serve(&endpoint_host, agent.clone()).expect("serve");
    let addr = endpoint_host.local_addr();
    let wire = fx.seal(1, 1, vec![shell("web", "exec sleep 600")]);

    let other = endpoint(&pki, &Principal::Replica(2));
    let reply = send_envelope(&other, addr, &wire).await.expect("answered");
    let EnvelopeReply::Refused { refusal, older } = &reply else {
        panic!("applied from another replica's certificate: {reply:?}");
    };
    assert!(!older, "{refusal}");
    assert!(
        refusal.contains("signed by replica 1") && refusal.contains("replica 2's certificate"),
        "{refusal}"
    );
    assert_eq!(
        agent.high_water().await,
        None,
        "a refused envelope moved the mark"
    );
    assert!(agent.status().await.is_empty(), "a module started");

    applies_from_replica_1(&pki, addr, &wire).await;
    agent.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reports_from_mesh_host_follow_a_not_leader_redirect_and_then_go_to_the_leader() {
    // G10/G13 for reports: mesh-host knows only a follower; the follower names the leader, the
    // report is filed there under host:ace, and later reports go to the leader directly.
    let (fx, pki) = (Fixture::new(), Pki::new());
    let leader_log = ReplicaLog::new(Answer::File);
    let leader = fake_replica(&pki, 1, &leader_log);
    let follower_log = ReplicaLog::new(Answer::Redirect(leader.local_addr().to_string()));
    let follower = fake_replica(&pki, 2, &follower_log);
    let config = fx.write_process_config(&pki, &[follower.local_addr()]);
    let mut host = HostProcess::spawn(&config, &log_of(&fx));
    host.listening(&fx.root()).await;

    wait_until("three reports at the leader", || async {
        leader_log.reports().len() >= 3
    })
    .await;
    let reports = leader_log.reports();
    let (from, first) = &reports[0];
    assert_eq!(from, &host_principal());
    assert_eq!(first.machine, machine);
    assert_eq!(first.report_sequence, 1);
    assert_eq!(
        follower_log.asked.load(Ordering::SeqCst),
        1,
        "reports after the first should go straight to the leader"
    );
    assert!(follower_log.reports().is_empty());
    drop(host);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redirect_loop_between_replicas_ends_after_three_hops_as_unavailable() {
    // Bounded redirects: two replicas naming each other as leader cost at most 1 + 3 requests,
    // and the report stays queued (Unavailable) rather than lost.
    let pki = Pki::new();
    let a_log = ReplicaLog::new(Answer::File);
    let a = fake_replica(&pki, 1, &a_log);
    let b_log = ReplicaLog::new(Answer::Redirect(a.local_addr().to_string()));
    let b = fake_replica(&pki, 2, &b_log);
    *a_log.answer.lock().expect("lock") = Answer::Redirect(b.local_addr().to_string());
    let sink = QuicSink::new(
        endpoint(&pki, &host_principal()),
        machine,
        vec![a.local_addr().to_string()],
    );
    let report = Report {
        machine: machine.into(),
        epoch: 0,
        sequence: 0,
        report_sequence: 1,
        applied: None,
        modules: vec![],
        refused_older: 0,
        last_refusal: None,
        proof: None,
    };
    let result = sink.deliver(&report).await;
    assert!(
        matches!(result, Err(SinkError::Unavailable(_))),
        "{result:?}"
    );
    let asked = a_log.asked.load(Ordering::SeqCst) + b_log.asked.load(Ordering::SeqCst);
    assert_eq!(asked, 1 + mesh::host::sink::report_redirects_max);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn g5_reports_queued_while_no_replica_answers_are_delivered_in_order_when_one_comes_up() {
    // G5: with no replica answering, reports wait on disk; once the replica serves, every one of
    // them arrives, oldest first, none missing.
    let (fx, pki) = (Fixture::new(), Pki::new());
    let replica_log = ReplicaLog::new(Answer::File);
    // Bound but not serving: handshakes go unanswered, like a replica that is down.
    let replica = endpoint(&pki, &Principal::Replica(1));
    let config = fx.write_process_config(&pki, &[replica.local_addr()]);
    let mut host = HostProcess::spawn(&config, &log_of(&fx));
    host.listening(&fx.root()).await;

    let queue = fx.root().join("reports");
    let queued = || std::fs::read_dir(&queue).map(|d| d.count()).unwrap_or(0);
    wait_until("three reports queued", || async { queued() >= 3 }).await;
    let waiting = queued() as u64;
    assert!(replica_log.reports().is_empty());

    assert!(replica.serve(replica_log.clone()));
    wait_until("the queued reports at the replica", || async {
        replica_log.reports().len() as u64 >= waiting
    })
    .await;
    let sequences = replica_log.sequences();
    let expected: Vec<u64> = (1..=sequences.len() as u64).collect();
    assert_eq!(sequences, expected, "reports missing or out of order");
    drop(host);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn g2_mesh_host_that_cannot_store_its_mark_applies_nothing_answers_an_error_and_stops() {
    // G2: the mark is durable before anything is applied. When it cannot be written, the sender
    // gets an error (not Applied, not a refusal it could mistake for "older"), no module starts,
    // and the process exits non-zero instead of carrying on without its fence.
    let (fx, pki) = (Fixture::new(), Pki::new());
    let leader_log = ReplicaLog::new(Answer::File);
    let leader = fake_replica(&pki, 1, &leader_log);
    let config = fx.write_process_config(&pki, &[leader.local_addr()]);
    let mut host = HostProcess::spawn(&config, &log_of(&fx));
    let addr = host.listening(&fx.root()).await;
    // A directory where the mark's temp file goes: even root cannot unlink it as a file.
    let blocker = mesh::host::durable::temp_path(&fx.root().join("high_water"));
    std::fs::create_dir_all(blocker.join("x")).expect("blocker");

    let wire = fx.seal(1, 1, vec![shell("web", "echo $$ > pid; exec sleep 600")]);
    let replica = endpoint(&pki, &Principal::Replica(1));
    let err = send_envelope(&replica, addr, &wire)
        .await
        .expect_err("not applied");
    // The reason usually comes back; the connection may also close first, as the process stops.
    assert!(
        matches!(&err, TransportError::Refused { reason, .. } if reason.contains("high_water"))
            || matches!(&err, TransportError::Unreachable { .. }),
        "{err:?}"
    );
    let status = host.exited().await;
    assert!(!status.success(), "mesh-host exited with {status}");
    assert!(!fx.module_dir("web").exists(), "a module was prepared");
    let log = read(&log_of(&fx));
    assert!(
        log.contains("high_water"),
        "the log does not say why: {log}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mesh_host_refuses_by_name_any_replica_message_other_than_an_envelope() {
    // G10: a replica may send Raft and Forward to anyone; a host has no use for them and says so.
    let (fx, pki) = (Fixture::new(), Pki::new());
    let config = fx.process_config(&pki, &[no_replica()]);
    let endpoint_host = listener::bind(&config).expect("bind");
    let agent = Arc::new(Agent::open(config, fx.sink.clone()).expect("open"));
    let _fatal = listener::serve(&endpoint_host, agent.clone()).expect("serve");
    let replica = endpoint(&pki, &Principal::Replica(1));
    for kind in [MessageKind::Raft, MessageKind::Forward] {
        let err = replica
            .request(
                endpoint_host.local_addr(),
                kind.clone(),
                b"x".to_vec(),
                request_timeout,
            )
            .await
            .expect_err("refused");
        let TransportError::Refused { reason, .. } = &err else {
            panic!("expected a refusal, got {err:?}");
        };
        assert!(reason.contains("only envelopes"), "{kind}: {reason}");
    }
    assert_eq!(
        endpoint_host.counts().denied,
        0,
        "the writers table let these through"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_envelope_arriving_after_shutdown_starts_nothing() {
    // No orphans: once the agent stopped its modules for exit, a late envelope must not start
    // one that would outlive mesh-host; it is answered with an error and the mark stays.
    let (fx, pki) = (Fixture::new(), Pki::new());
    let config = fx.process_config(&pki, &[no_replica()]);
    let endpoint_host = listener::bind(&config).expect("bind");
    let agent = Arc::new(Agent::open(config, fx.sink.clone()).expect("open"));
    let _fatal = listener::serve(&endpoint_host, agent.clone()).expect("serve");
    agent.shutdown().await;
    let wire = fx.seal(1, 1, vec![shell("web", "exec sleep 600")]);
    let replica = endpoint(&pki, &Principal::Replica(1));
    let err = send_envelope(&replica, endpoint_host.local_addr(), &wire)
        .await
        .expect_err("not applied");
    assert!(err.to_string().contains("stopping"), "{err}");
    assert_eq!(agent.high_water().await, None);
    assert!(agent.status().await.is_empty(), "a module started");
}
