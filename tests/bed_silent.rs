//! The bed for silent hosts (issue 25 item 4, decision 0301): with real `meshd` and `mesh-host`
//! processes (hosts reporting every 2 s, replicas calling a host silent after 6 s, as `meshctl
//! init` writes them), a stopped host reads `SILENT` in `status --json`, the text status, the
//! leader's page and its `/metrics`, never "up to date"; started again, it clears by itself.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use mesh::cli::init::{host_reconcile_interval_ms, replica_silent_after_ms};
use mesh_beds::{Bed, binaries};
use serde_json::Value;

const pair: &str = include_str!("../beds/meshes/pair.toml");

/// Longest wait for any one state, in milliseconds: the threshold and a few report intervals.
const settle_ms: u64 = 20_000;

fn line<'a>(text: &'a str, start: &str) -> &'a str {
    text.lines()
        .find(|l| l.trim_start().starts_with(start))
        .unwrap_or_default()
}

fn silent_for_ms(status: &Value, machine: &str) -> Option<u64> {
    Bed::machine(status, machine).and_then(|m| m["silent_for_ms"].as_u64())
}

/// `GET path` on `addr`: the body of a 200 answer.
fn get(addr: SocketAddr, path: &str) -> anyhow::Result<String> {
    let (code, body) = mesh_beds::http_get(addr, path, Duration::from_millis(5_000))?;
    anyhow::ensure!(code == 200, "{path} answered {code}");
    Ok(body)
}

/// The leader's page and `/metrics` addresses, from a status answer.
fn leader_page(bed: &Bed, status: &Value) -> anyhow::Result<SocketAddr> {
    let leader = status["leader"]
        .as_u64()
        .ok_or_else(|| anyhow::anyhow!("no leader in {status}"))?;
    bed.page(leader)
        .ok_or_else(|| anyhow::anyhow!("replica {leader} serves no page"))
}

/// The `mesh_hosts_silent` sample on the leader's `/metrics`.
fn silent_gauge(bed: &Bed) -> anyhow::Result<Option<String>> {
    let page = leader_page(bed, &bed.status()?)?;
    let metrics = get(page, "/metrics")?;
    Ok(metrics
        .lines()
        .find(|l| l.starts_with("mesh_hosts_silent "))
        .map(str::to_string))
}

#[test]
fn a_stopped_host_reads_silent_everywhere_and_clears_when_it_reports_again() -> anyhow::Result<()> {
    // Issue 25 item 4: stop g14's mesh-host; within the threshold (6 s) and a report interval,
    // status, its text, the page and /metrics say SILENT, never "up to date"; start it again and
    // it reads up to date again without anyone doing anything.
    let mut bed = Bed::start_with_pages(binaries!(), 3, pair)?;
    bed.leader_other_than(None)?;
    bed.apply(pair, "first model")?;
    bed.meshctl_ok(&["push", "--all", "--why", "silent hosts", "--wait=20s"])?;
    bed.wait_for("g14 up to date and heard", settle_ms, || {
        let text = bed.meshctl_ok(&["status"])?.stdout;
        Ok(line(&text, "g14  sent")
            .contains("up to date")
            .then_some(()))
    })?;
    assert_eq!(silent_gauge(&bed)?.as_deref(), Some("mesh_hosts_silent 0"));

    bed.stop_host("g14")?;
    let stopped = Instant::now();
    let status = bed.wait_for("g14 silent in status --json", settle_ms, || {
        let status = bed.status()?;
        Ok(silent_for_ms(&status, "g14").map(|_| status))
    })?;
    // Its last report came at most one interval before it stopped.
    let least = Duration::from_millis(replica_silent_after_ms - host_reconcile_interval_ms);
    assert!(
        stopped.elapsed() >= least,
        "silent {:?} after the host stopped: {status}",
        stopped.elapsed()
    );
    assert!(
        silent_for_ms(&status, "g14").is_some_and(|ms| ms >= replica_silent_after_ms),
        "{status}"
    );
    assert_eq!(
        silent_for_ms(&status, "ace"),
        None,
        "ace still reports: {status}"
    );
    let text = bed.meshctl_ok(&["status"])?.stdout;
    let g14 = line(&text, "g14  sent");
    assert!(g14.contains("SILENT for "), "{text}");
    assert!(!g14.contains("up to date"), "{text}");
    assert!(line(&text, "ace  sent").contains("up to date"), "{text}");
    let page = leader_page(&bed, &status)?;
    // The page is drawn at most once a second: wait for a drawing after the silence.
    let row = bed.wait_for("SILENT in g14's row of the page", settle_ms, || {
        let html = get(page, "/")?;
        let row = line(&html, "<tr><td>g14</td>").to_string();
        Ok(row.contains("SILENT").then_some(row))
    })?;
    assert!(!row.contains("up to date"), "{row}");
    assert_eq!(silent_gauge(&bed)?.as_deref(), Some("mesh_hosts_silent 1"));

    // Started again, it reports and the silence clears by itself.
    bed.start_host("g14")?;
    bed.wait_for("g14 heard again", settle_ms, || {
        let status = bed.status()?;
        let heard = Bed::machine(&status, "g14").is_some_and(|m| m["heard_ago_ms"].is_u64());
        Ok((heard && silent_for_ms(&status, "g14").is_none()).then_some(()))
    })?;
    bed.wait_for("g14 up to date again", settle_ms, || {
        let text = bed.meshctl_ok(&["status"])?.stdout;
        Ok(line(&text, "g14  sent")
            .contains("up to date")
            .then_some(()))
    })?;
    assert_eq!(silent_gauge(&bed)?.as_deref(), Some("mesh_hosts_silent 0"));
    bed.no_replica_panicked()?;
    Ok(())
}
