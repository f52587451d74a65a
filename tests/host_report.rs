//! G5 from the host's side: every report carries a report_sequence that is on disk before the
//! report leaves and strictly increases across restarts; reports the sink could not take wait on
//! disk and go out in order later; a report names what was applied.

mod host_common;

use host_common::*;
use mesh::core::compose::digest as declaration_digest;
use mesh::core::declaration::Declaration;
use mesh::core::report::{Exit, ModuleState, Report};
use mesh::host::{ReportSink, SinkFuture};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

/// Records each report with the counter found on disk at the moment it was delivered.
struct CounterSink {
    counter: PathBuf,
    seen: Mutex<Vec<(u64, u64)>>,
}

impl ReportSink for CounterSink {
    fn deliver<'a>(&'a self, report: &'a Report) -> SinkFuture<'a> {
        Box::pin(async move {
            let on_disk: u64 = read(&self.counter).trim().parse().expect("counter on disk");
            self.seen
                .lock()
                .expect("lock")
                .push((report.report_sequence, on_disk));
            Ok(())
        })
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn g5_report_sequence_is_persisted_first_and_strictly_increases_across_restarts() {
    // G5: report_sequence is the host's own counter, on disk before the report leaves, and a
    // restarted host never reuses or goes below it.
    let fx = Fixture::new();
    let sink = Arc::new(CounterSink {
        counter: fx.root().join("report_sequence"),
        seen: Mutex::new(Vec::new()),
    });
    for _ in 0..3 {
        let agent = mesh::host::Agent::open(fx.config(), sink.clone()).expect("open");
        agent.start().await.expect("start");
        agent.report_now().await.expect("report");
        agent.report_now().await.expect("report");
        agent.shutdown().await;
    }
    let seen = sink.seen.lock().expect("lock").clone();
    assert_eq!(seen.len(), 9, "{seen:?}");
    for pair in seen.windows(2) {
        assert!(pair[1].0 > pair[0].0, "report_sequence went {:?}", pair);
    }
    for (sequence, on_disk) in seen {
        assert!(
            on_disk >= sequence,
            "report {sequence} left before the counter reached it"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn g5_reports_queued_while_the_sink_fails_are_delivered_in_order_later() {
    // G5: a failing sink loses nothing: reports wait on disk (even across a restart) and go out
    // oldest first once it answers.
    let fx = Fixture::new();
    fx.sink.set_down(true);
    let mut numbered = Vec::new();
    {
        let agent = fx.agent();
        agent
            .receive(&fx.seal(1, 1, vec![]))
            .await
            .expect("applied");
        numbered.push(agent.report_now().await.expect("report").report_sequence);
        agent
            .receive(&fx.seal(1, 2, vec![]))
            .await
            .expect("applied");
        numbered.push(agent.report_now().await.expect("report").report_sequence);
    }
    assert!(fx.sink.reports().is_empty());
    let agent = fx.agent();
    fx.sink.set_down(false);
    let delivered = agent.flush_reports().await.expect("flush");
    assert!(delivered >= 4, "only {delivered} delivered");
    let sequences: Vec<u64> = fx
        .sink
        .reports()
        .iter()
        .map(|r| r.report_sequence)
        .collect();
    for pair in sequences.windows(2) {
        assert!(pair[1] > pair[0], "out of order: {sequences:?}");
    }
    for n in &numbered {
        assert!(sequences.contains(n), "report {n} lost: {sequences:?}");
    }
    let last = fx.sink.reports().pop().expect("a report");
    assert_eq!((last.epoch, last.sequence), (1, 2));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn g5_the_report_after_an_apply_names_the_envelope_and_its_digest() {
    // G5: after an apply, a report carries the applied epoch, sequence and declaration digest.
    let fx = Fixture::new();
    let agent = fx.agent();
    agent
        .receive(&fx.seal(4, 2, vec![sleeper("web")]))
        .await
        .expect("applied");
    wait_until("the apply report", || async {
        !fx.sink.reports().is_empty()
    })
    .await;
    let report = fx.sink.reports().remove(0);
    let declaration = Declaration {
        machine: machine.into(),
        modules: vec![sleeper("web")],
        revoked: Default::default(),
        signers: Default::default(),
    };
    assert_eq!(report.machine, machine);
    assert_eq!((report.epoch, report.sequence), (4, 2));
    let digest = declaration_digest(&declaration);
    assert_eq!(report.applied, Some(digest));
    assert!(report.modules.iter().any(|m| m.name == "web"));
    agent.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn g5_the_reconcile_loop_reports_on_its_interval() {
    // G5: without any envelope, the host reports every reconcile_interval_ms (100 ms here).
    let fx = Fixture::new();
    let agent = Arc::new(fx.agent());
    let (stop, stop_rx) = tokio::sync::watch::channel(false);
    let looping = {
        let agent = Arc::clone(&agent);
        tokio::spawn(async move { agent.reconcile(stop_rx).await })
    };
    wait_until("three periodic reports", || async {
        fx.sink.reports().len() >= 3
    })
    .await;
    stop.send(true).expect("stop");
    looping
        .await
        .expect("join")
        .expect("reconcile ends cleanly");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_module_that_fails_is_reported_with_its_exit_before_the_next_reconcile() {
    // Issue 9 part 5 (health is part of the account): a module that exits 3 is reported failed,
    // with exit 3, soon after it fails, not only on the reconcile interval (an hour here), and a
    // module that exits at once is never reported ready.
    let fx = Fixture::new();
    let text = fx.config_text().replace(
        "reconcile_interval_ms = 100",
        "reconcile_interval_ms = 3600000",
    );
    let file = fx.dir.path().join("host.toml");
    let config = mesh::host::HostConfig::parse(&text, &file, fx.dir.path()).expect("config");
    let agent = Arc::new(mesh::host::Agent::open(config, fx.sink.clone()).expect("open"));
    let (stop, stop_rx) = tokio::sync::watch::channel(false);
    let looping = {
        let agent = Arc::clone(&agent);
        tokio::spawn(async move { agent.reconcile(stop_rx).await })
    };
    agent
        .receive(&fx.seal(1, 1, vec![shell("crash", "exit 3")]))
        .await
        .expect("applied");
    let crash = |r: &Report| r.modules.iter().find(|m| m.name == "crash").cloned();
    wait_until("a report of crash failed with exit 3", || async {
        fx.sink.reports().iter().filter_map(crash).any(|m| {
            matches!(m.state, ModuleState::Failed { .. }) && m.last_exit == Some(Exit::Code(3))
        })
    })
    .await;
    let reports = fx.sink.reports();
    assert!(
        !reports
            .iter()
            .filter_map(crash)
            .any(|m| m.state == ModuleState::Ready),
        "{reports:?}"
    );
    stop.send(true).expect("stop");
    looping
        .await
        .expect("join")
        .expect("reconcile ends cleanly");
    agent.shutdown().await;
}
