//! mesh-host's own `/metrics` (issue 13 part 4): a real agent with a supervised module and its
//! metrics server on loopback; a scrape counts envelopes received, accepted and refused by reason,
//! reports queued, delivered and failed, and modules by state.

mod host_common;

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::time::Duration;

use host_common::*;
use mesh::core::envelope::seal;
use mesh::host::metrics::MetricsServer;

/// How long one HTTP exchange may take.
const http_wait_ms: u64 = 5_000;

/// `GET path` on `addr`, in a blocking thread; the status code and the body.
async fn get(addr: SocketAddr, path: &'static str) -> (u16, String) {
    tokio::task::spawn_blocking(move || {
        let wait = Duration::from_millis(http_wait_ms);
        let mut stream = TcpStream::connect_timeout(&addr, wait).expect("connect");
        stream.set_read_timeout(Some(wait)).expect("timeout");
        write!(
            stream,
            "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
        )
        .expect("write");
        let mut raw = String::new();
        stream.read_to_string(&mut raw).expect("read");
        let (head, body) = raw.split_once("\r\n\r\n").expect("a header end");
        let code = head
            .split_whitespace()
            .nth(1)
            .and_then(|c| c.parse().ok())
            .expect("a status code");
        (code, body.to_string())
    })
    .await
    .expect("the GET thread")
}

/// Every sample of a text exposition: `name{labels}` → value.
fn samples(text: &str) -> BTreeMap<String, f64> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| l.rsplit_once(' '))
        .filter_map(|(k, v)| Some((k.to_string(), v.parse().ok()?)))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn host_metrics_count_envelopes_by_outcome_reports_and_modules_by_state() {
    let fx = Fixture::new();
    let agent = Arc::new(fx.agent());
    agent.start().await.expect("start");
    let server = MetricsServer::start("127.0.0.1:0".parse().expect("addr"), &agent, None)
        .await
        .expect("metrics server");
    let addr = server.local_addr();

    let wire = fx.seal(1, 1, vec![sleeper("db")]);
    agent.receive(&wire).await.expect("applied");
    // The same envelope again: not above the high-water mark.
    assert!(agent.receive(&wire).await.is_err());
    // Signed with a key this host does not hold for replica 1.
    let forged = seal(&envelope(1, 2, vec![], vec![]), &replica_key(9)).expect("seal");
    assert!(agent.receive(&forged).await.is_err());
    ready_pid(&agent, "db").await;
    agent.flush_reports().await.expect("flush");
    // With the replicas unreachable a report stays queued and the delivery counts as failed.
    fx.sink.set_down(true);
    agent.report_now().await.expect("report queued");

    let (code, text) = get(addr, "/metrics").await;
    assert_eq!(code, 200, "{text}");
    let s = samples(&text);
    let at = |key: &str| s.get(key).copied().unwrap_or(-1.0);
    assert_eq!(at("mesh_host_envelopes_received_total"), 3.0, "{text}");
    assert_eq!(at("mesh_host_envelopes_accepted_total"), 1.0, "{text}");
    assert_eq!(
        at("mesh_host_envelopes_refused_total{reason=\"older\"}"),
        1.0,
        "{text}"
    );
    assert_eq!(
        at("mesh_host_envelopes_refused_total{reason=\"bad_signature\"}"),
        1.0,
        "{text}"
    );
    assert_eq!(
        at("mesh_host_envelopes_refused_total{reason=\"unknown_signer\"}"),
        0.0,
        "{text}"
    );
    assert_eq!(at("mesh_host_modules{state=\"ready\"}"), 1.0, "{text}");
    assert_eq!(at("mesh_host_modules{state=\"failed\"}"), 0.0, "{text}");
    assert_eq!(at("mesh_host_module_restarts_total"), 0.0, "{text}");
    let queued = at("mesh_host_reports_queued_total");
    let delivered = at("mesh_host_reports_delivered_total");
    assert!(queued >= 2.0 && delivered >= 1.0, "{text}");
    assert!(delivered < queued, "{text}");
    assert!(at("mesh_host_reports_failed_total") >= 1.0, "{text}");
    assert!(at("mesh_host_report_queue") >= 1.0, "{text}");
    assert_eq!(
        delivered,
        fx.sink.reports().len() as f64,
        "every delivered report reached the sink: {text}"
    );

    let (code, _) = get(addr, "/elsewhere").await;
    assert_eq!(code, 404);
    server.stop().await;
    agent.shutdown().await;
}
