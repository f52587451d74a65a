//! Beds for what an operator watches (issue 13 parts 4 and 5): log files without colour codes and
//! `--log-format json`, and meshd's status page and `/metrics` over HTTP (`http` in replica.toml),
//! with real meshd and mesh-host processes.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use mesh::cli::procs::{Guarded, free_tcp_ports};
use mesh_beds::{Bed, binaries, wait_ms_default};

/// Two machines, a provider and a consumer, with values the page must never show.
const mesh_text: &str = r#"
[machines.ace]
address = "127.0.0.1"

[machines.g14]
address = "127.0.0.1"

[modules.db]
machine = "ace"
command = "sleep"
args = ["600"]
env = { DB_PASSWORD = "env-value-never-shown" }
files = { "conf/db.conf" = "file-contents-never-shown" }
provides = [{ kind = "sql", port = 5432 }]

[modules.app]
machine = "g14"
command = "sleep"
args = ["600"]
consumes = [{ kind = "sql", from = "db" }]

[settings.mesh]
token = "setting-value-never-shown"
"#;

/// How long one HTTP exchange with meshd may take.
const http_wait_ms: u64 = 5_000;

/// `GET path` on `addr`; the status code and the body.
fn get(addr: SocketAddr, path: &str) -> anyhow::Result<(u16, String)> {
    mesh_beds::http_get(addr, path, Duration::from_millis(http_wait_ms))
}

fn sample(text: &str, key: &str) -> f64 {
    mesh_beds::metric_samples(text)
        .get(key)
        .copied()
        .unwrap_or(0.0)
}

/// Restarts every replica of `bed` with `http` set to a free loopback port; returns the ports.
fn with_http(bed: &mut Bed) -> anyhow::Result<BTreeMap<u64, SocketAddr>> {
    let ids: Vec<u64> = bed.layout.replicas.iter().map(|(id, _)| *id).collect();
    let ports = free_tcp_ports(ids.len())?;
    let mut out = BTreeMap::new();
    for (id, port) in ids.iter().copied().zip(ports) {
        // Killed only once its store exists: a replica killed while redb creates the file leaves
        // one no later start can open.
        bed.wait_for("the replica's store open", wait_ms_default, || {
            Ok(bed
                .replica_log(id)
                .contains("replica started")
                .then_some(()))
        })?;
        // Gone (and its store closed) before it starts again.
        bed.kill_replica(id)?;
        let config = bed.dir.join(format!("replica-{id}.toml"));
        let text = std::fs::read_to_string(&config)?;
        // A top-level key goes before the first table.
        std::fs::write(&config, format!("http = \"{port}\"\n{text}"))?;
        bed.start_replica(id)?;
        out.insert(id, SocketAddr::from(([127, 0, 0, 1], port)));
    }
    // SIGCONT is harmless here; it puts every live replica back into the bed's context.
    bed.resume_replica(ids[0])?;
    // A replica serves HTTP once its store and Raft are open.
    for (id, addr) in &out {
        bed.wait_for("every replica serving HTTP", wait_ms_default, || {
            Ok(get(*addr, "/healthz")
                .is_ok_and(|(code, _)| code == 200)
                .then_some(()))
        })
        .map_err(|e| anyhow::anyhow!("{e:#}; replica {id}'s log:\n{}", bed.replica_log(*id)))?;
    }
    Ok(out)
}

/// `key` summed over every replica's `/metrics`: a leadership change between two scrapes moves
/// counters from one replica to another, never out of the sum.
fn total(http: &BTreeMap<u64, SocketAddr>, key: &str) -> anyhow::Result<f64> {
    let mut sum = 0.0;
    for addr in http.values() {
        let (code, body) = get(*addr, "/metrics")?;
        anyhow::ensure!(code == 200, "/metrics on {addr} answered {code}: {body}");
        sum += sample(&body, key);
    }
    Ok(sum)
}

#[test]
fn metrics_count_a_push_and_the_status_page_shows_the_leader_and_the_machines() -> anyhow::Result<()>
{
    // Issue 13 part 4: /metrics moves with a push (pushes, sends by outcome, commits, lease
    // rounds, reports, latencies); the page names the leader, every machine and the graph's
    // provider -> consumer edge, and shows no env value, file or setting value.
    let mut bed = Bed::start(binaries!(), 3, mesh_text)?;
    let http = with_http(&mut bed)?;
    let leader = bed.leader_other_than(None)?;
    let (code, text) = get(http[&leader], "/metrics")?;
    assert_eq!(code, 200, "{text}");
    // The classic format, asked for by nobody in particular (decision 0311).
    assert!(text.contains("# TYPE mesh_pushes_total counter"), "{text}");
    let keys = [
        ("mesh_pushes_total{outcome=\"done\"}", 1.0),
        ("mesh_sends_total{outcome=\"applied\"}", 2.0),
        ("mesh_commits_total{outcome=\"applied\"}", 2.0),
        // The push's lease; the apply takes none (its commit is the check, decision 0180).
        ("mesh_lease_rounds_total{outcome=\"granted\"}", 1.0),
        ("mesh_request_seconds_count{kind=\"push\"}", 1.0),
        ("mesh_reports_total{outcome=\"accepted\"}", 2.0),
    ];
    let mut before = BTreeMap::new();
    for (key, _) in keys {
        before.insert(key, total(&http, key)?);
    }
    bed.apply(mesh_text, "first model")?;
    bed.meshctl_ok(&["push", "--all", "--why", "first send"])?;
    // Reports arrive after the push answers; everything else has moved by then already.
    bed.wait_for("every counter moved by the push", wait_ms_default, || {
        let mut short = Vec::new();
        for (key, by) in keys {
            let now = total(&http, key)?;
            if now < before[key] + by {
                short.push(format!("{key}: {} before, {now} now", before[key]));
            }
        }
        if short.is_empty() {
            Ok(Some(()))
        } else {
            anyhow::bail!("{}", short.join("; "))
        }
    })?;

    let page = bed.wait_for(
        "a page naming the leader, both machines reported",
        wait_ms_default,
        || {
            let leader = bed.leader_other_than(None)?;
            let other = http.keys().copied().find(|id| *id != leader);
            let other = other.ok_or_else(|| anyhow::anyhow!("no follower"))?;
            let (code, page) = get(http[&other], "/")?;
            let names = page.contains(&format!("id=\"leader\">replica {leader}</b>"));
            if code == 200 && names && !page.contains("no report yet") {
                return Ok(Some(page));
            }
            anyhow::bail!("replica {other}'s page ({code}) with leader {leader}:\n{page}")
        },
    )?;
    for machine in ["ace", "g14"] {
        assert!(page.contains(&format!("<tr><td>{machine}</td>")), "{page}");
    }
    assert!(page.contains("<svg id=\"graph\""), "{page}");
    assert!(page.contains("data-from=\"db\" data-to=\"app\""), "{page}");
    for secret in [
        "env-value-never-shown",
        "file-contents-never-shown",
        "setting-value-never-shown",
        "secret_blake3",
    ] {
        assert!(!page.contains(secret), "the page shows {secret}:\n{page}");
    }
    let (code, _) = get(http[&leader], "/nothing-here")?;
    assert_eq!(code, 404);
    Ok(())
}

#[test]
fn log_files_have_no_colour_codes_when_not_a_terminal() -> anyhow::Result<()> {
    // Issue 13 part 5: a log file is for reading; colours only on a terminal.
    let bed = Bed::start(binaries!(), 1, mesh_text)?;
    bed.leader_other_than(None)?;
    bed.apply(mesh_text, "first model")?;
    bed.meshctl_ok(&["push", "--all", "--why", "first send"])?;
    let replica = bed.replica_log(1);
    let host = bed.read(&bed.dir.join("logs").join("host-ace.log"));
    for (name, log) in [("replica-1", &replica), ("host-ace", &host)] {
        assert!(log.lines().count() > 2, "{name} logged little:\n{log}");
        assert!(
            !log.contains('\x1b'),
            "{name}'s log has escape codes:\n{log}"
        );
    }
    Ok(())
}

#[test]
fn log_format_json_writes_one_json_object_per_line() -> anyhow::Result<()> {
    // Issue 13 part 5: `--log-format json` for log collectors: every line an object with a level,
    // a target and the message among its fields.
    let mut bed = Bed::start(binaries!(), 1, mesh_text)?;
    bed.leader_other_than(None)?;
    bed.kill_replica(1)?;
    let log = bed.dir.join("logs").join("replica-1.json.log");
    let config = bed.dir.join("replica-1.toml").display().to_string();
    let _replica = Guarded::spawn(
        "replica-1",
        Path::new(env!("CARGO_BIN_EXE_meshd")),
        &["--log-format", "json", "--config", &config],
        &log,
        Duration::ZERO,
    )?;
    let text = bed
        .wait_for(
            "a json log line saying the replica started",
            wait_ms_default,
            || {
                let text = bed.read(&log);
                Ok(text.contains("replica started").then_some(text))
            },
        )
        .map_err(|e| anyhow::anyhow!("{e:#}; the log:\n{}", bed.read(&log)))?;
    for line in text.lines() {
        let v: serde_json::Value =
            serde_json::from_str(line).map_err(|e| anyhow::anyhow!("not JSON ({e}): {line}"))?;
        assert!(v["level"].is_string(), "{line}");
        assert!(v["target"].is_string(), "{line}");
        assert!(v["fields"]["message"].is_string(), "{line}");
    }
    Ok(())
}
