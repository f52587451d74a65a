//! Beds for "applied means running" (issue 9): `status` shows each module's state from the last
//! report and never calls a machine with failing modules "up to date"; `push --wait` waits for
//! the report of its own send and exits 4 on a failing module, 5 when modules never get ready;
//! a push whose send is not confirmed applied (its host is down) exits 1. The crash loop is also
//! what `/metrics` shows an SRE (issue 25 item 6): the leader's fleet gauges and the host's restart
//! counter, in an exposition `promtool check metrics` accepts, and the sample alert rules pass
//! `promtool check rules`.

use std::net::SocketAddr;
use std::time::Duration;

use mesh_beds::{Bed, HttpAnswer, binaries, http_get_accepting, promtool_run, wait_ms_default};
use serde_json::Value;

const crash: &str = include_str!("../beds/meshes/crash.toml");
const consumer: &str = include_str!("../beds/meshes/consumer.toml");
const pair: &str = include_str!("../beds/meshes/pair.toml");

fn applied(mesh: &str) -> anyhow::Result<Bed> {
    let bed = Bed::start(binaries!(), 3, mesh)?;
    bed.leader_other_than(None)?;
    bed.apply(mesh, "first model")?;
    Ok(bed)
}

/// Like [`applied`], every replica and host serving `/metrics`.
fn applied_with_pages(mesh: &str) -> anyhow::Result<Bed> {
    let bed = Bed::start_with_pages(binaries!(), 3, mesh)?;
    bed.leader_other_than(None)?;
    bed.apply(mesh, "first model")?;
    Ok(bed)
}

fn line<'a>(text: &'a str, start: &str) -> &'a str {
    text.lines()
        .find(|l| l.trim_start().starts_with(start))
        .unwrap_or_default()
}

fn module<'a>(status: &'a Value, machine: &str, name: &str) -> Option<&'a Value> {
    Bed::machine(status, machine)?["modules"]
        .as_array()?
        .iter()
        .find(|m| m["name"] == name)
}

#[test]
fn applied_means_running_crash_looping_module_is_shown_failing() -> anyhow::Result<()> {
    // Scenario: g14 runs `sh -c 'exit 3'`, which its host restarts forever. The push is applied,
    // but `push --wait` exits 4 naming exit 3, and `status` says "applied, 1 module failing",
    // never "up to date", for g14 while ace (healthy) is up to date. Then what /metrics says of
    // it (the same bed, see `crash_loop_on_metrics`).
    let bed = applied_with_pages(crash)?;
    let run = bed.meshctl(&["push", "--all", "--why", "crash loop", "--wait=30s"])?;
    assert_eq!(run.code, Some(4), "{}{}", run.stdout, run.stderr);
    let g14 = line(&run.stdout, "g14  FAILING");
    assert!(
        g14.contains("module crash") && g14.contains("exit 3"),
        "{}",
        run.stdout
    );
    assert!(
        line(&run.stdout, "ace  ready").contains("every module ready"),
        "{}",
        run.stdout
    );
    let text = bed.meshctl_ok(&["status"])?.stdout;
    let g14 = line(&text, "g14  sent");
    assert!(g14.contains("applied, 1 module failing"), "{text}");
    assert!(!g14.contains("up to date"), "{text}");
    assert!(g14.contains(" ago"), "the report's age: {text}");
    assert!(line(&text, "crash").contains("last exit 3"), "{text}");
    assert!(line(&text, "ace  sent").contains("up to date"), "{text}");
    let status = bed.status()?;
    let crash_module = module(&status, "g14", "crash").cloned().unwrap_or_default();
    assert_eq!(
        crash_module["last_exit"],
        serde_json::json!({"kind": "code", "code": 3}),
        "{status}"
    );
    let g14 = Bed::machine(&status, "g14").cloned().unwrap_or_default();
    assert_eq!(g14["health"]["kind"], "failing", "{status}");
    assert!(g14["report_age_ms"].is_u64(), "{status}");
    let filed = g14["report_filed"].as_str().unwrap_or_default();
    assert!(
        filed.len() == 24 && filed.ends_with('Z'),
        "RFC 3339: {status}"
    );
    crash_loop_on_metrics(&bed)
}

#[test]
fn push_wait_times_out_on_a_module_waiting_for_an_endpoint_nobody_serves() -> anyhow::Result<()> {
    // Scenario: app on g14 consumes db's sql endpoint on ace, but db (`sleep`) never listens. The
    // push is applied; `push --wait` gives up after its timeout with exit 5 and says what app
    // waits for, and `status` shows g14 "not ready", not "up to date".
    let bed = applied(consumer)?;
    let run = bed.meshctl(&["push", "g14", "--why", "app needs sql", "--wait=4s"])?;
    assert_eq!(run.code, Some(5), "{}{}", run.stdout, run.stderr);
    let g14 = line(&run.stdout, "g14  TIMEOUT");
    assert!(g14.contains("app waiting for endpoint"), "{}", run.stdout);
    let text = bed.meshctl_ok(&["status"])?.stdout;
    assert!(
        line(&text, "g14  sent").contains("applied, 1 module not ready"),
        "{text}"
    );
    assert!(
        line(&text, "app").contains("waiting for endpoint"),
        "{text}"
    );
    Ok(())
}

#[test]
fn push_to_a_machine_whose_host_is_down_exits_non_zero() -> anyhow::Result<()> {
    // Scenario: g14's mesh-host is stopped. A push to every machine applies on ace, but g14's send
    // is not confirmed: its line says so and the push exits 1, not 0.
    let mut bed = applied(pair)?;
    bed.stop_host("g14")?;
    let run = bed.meshctl(&["push", "--all", "--why", "g14 is down"])?;
    assert_eq!(run.code, Some(1), "{}{}", run.stdout, run.stderr);
    assert!(
        line(&run.stdout, "g14").contains("not confirmed"),
        "{}",
        run.stdout
    );
    assert!(
        line(&run.stdout, "ace").contains("applied"),
        "{}",
        run.stdout
    );
    Ok(())
}

// ---- /metrics (issue 25 item 6, decision 0311) -------------------------------------------------

/// How long one HTTP exchange or one promtool run may take.
const http_wait_ms: u64 = 5_000;
/// The `Accept` header Prometheus 2.42 scrapes with: OpenMetrics first, the classic text after.
const prometheus_accept: &str = "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1";
/// The sample alert rules shipped for operators.
const alert_rules: &str = include_str!("../deploy/prometheus/mesh-alerts.yml");

/// `/metrics` at `addr`, sending `Accept: accept` when given; must answer 200.
fn scrape(addr: SocketAddr, accept: Option<&str>) -> anyhow::Result<HttpAnswer> {
    let answer = http_get_accepting(
        addr,
        "/metrics",
        accept,
        Duration::from_millis(http_wait_ms),
    )?;
    anyhow::ensure!(
        answer.code == 200,
        "/metrics on {addr} answered {}: {}",
        answer.code,
        answer.body
    );
    Ok(answer)
}

/// `key`'s value in `text`; an error naming it when the exposition has no such series.
fn sample(text: &str, key: &str) -> anyhow::Result<f64> {
    mesh_beds::metric_samples(text)
        .get(key)
        .copied()
        .ok_or_else(|| anyhow::anyhow!("no {key} in\n{text}"))
}

/// `promtool check metrics` on `text`: exits 0 with nothing to say.
fn promtool_accepts(what: &str, text: &str) -> anyhow::Result<()> {
    let said = promtool_run(
        &["check", "metrics"],
        text,
        Duration::from_millis(http_wait_ms),
    )
    .map_err(|e| anyhow::anyhow!("{what}: {e:#}\n{text}"))?;
    anyhow::ensure!(said.trim().is_empty(), "{what}: promtool said {said}");
    Ok(())
}

/// The crash loop as /metrics shows it: the leader counts 2 machines, 1 failing, 1 up to date
/// (followers 0, so a sum over the replicas is the leader's word); the host counts restarts in a
/// counter that keeps growing across a declaration that restarts the module; every endpoint
/// passes `promtool check metrics` in the classic format, and gives OpenMetrics only when asked.
fn crash_loop_on_metrics(bed: &Bed) -> anyhow::Result<()> {
    let leader = bed.leader_other_than(None)?;
    let follower = (1..=3).find(|id| *id != leader).unwrap_or(1);
    let page = |id: u64| {
        bed.page(id)
            .ok_or_else(|| anyhow::anyhow!("replica {id} serves no /metrics"))
    };
    let g14 = bed
        .host_page("g14")
        .ok_or_else(|| anyhow::anyhow!("g14's host serves no /metrics"))?;
    let ace = bed
        .host_page("ace")
        .ok_or_else(|| anyhow::anyhow!("ace's host serves no /metrics"))?;

    // The fleet: g14 failing, ace up to date, nobody behind, held or silent.
    let text = bed.wait_for("the leader's fleet gauges", wait_ms_default, || {
        let text = scrape(page(leader)?, None)?.body;
        let want = [
            ("mesh_hosts", 2.0),
            ("mesh_hosts_failing", 1.0),
            ("mesh_hosts_up_to_date", 1.0),
            ("mesh_hosts_behind", 0.0),
            ("mesh_hosts_held", 0.0),
            ("mesh_hosts_silent", 0.0),
        ];
        for (key, value) in want {
            if sample(&text, key)? != value {
                anyhow::bail!("{key} is not {value} on leader {leader}:\n{text}");
            }
        }
        Ok(Some(text))
    })?;
    // Both hosts report every 2 s: none is unheard for as long as the 6 s silence threshold.
    let oldest = sample(&text, "mesh_hosts_oldest_report_age_seconds")?;
    assert!((0.0..6.0).contains(&oldest), "{text}");
    let followers = scrape(page(follower)?, None)?.body;
    for key in ["mesh_hosts", "mesh_hosts_failing", "mesh_hosts_up_to_date"] {
        assert_eq!(
            sample(&followers, key)?,
            0.0,
            "follower {follower}: {followers}"
        );
    }

    // Every endpoint in the classic format passes promtool; OpenMetrics only when asked for.
    for (what, addr) in [
        ("the leader", page(leader)?),
        ("a follower", page(follower)?),
        ("g14's host", g14),
        ("ace's host", ace),
    ] {
        let classic = scrape(addr, None)?;
        assert!(
            classic
                .content_type
                .starts_with("text/plain; version=0.0.4"),
            "{what}: {}",
            classic.content_type
        );
        assert!(!classic.body.contains("# EOF"), "{what}: {}", classic.body);
        promtool_accepts(what, &classic.body)?;
        promtool_accepts(what, &scrape(addr, Some("text/plain;version=0.0.4"))?.body)?;
        let open = scrape(addr, Some(prometheus_accept))?;
        assert!(
            open.content_type
                .starts_with("application/openmetrics-text"),
            "{what}: {}",
            open.content_type
        );
        assert!(open.body.ends_with("# EOF\n"), "{what}: {}", open.body);
        for key in [
            "process_resident_memory_bytes",
            "process_virtual_memory_bytes",
            "process_start_time_seconds",
            "process_open_fds",
            "process_max_fds",
        ] {
            assert!(sample(&classic.body, key)? > 0.0, "{what}: {key}");
        }
        assert!(sample(&classic.body, "process_cpu_seconds_total")? >= 0.0);
    }

    // A request that fails is counted by its kind and its error's class.
    let run = bed.meshctl(&["push", "nosuch", "--why", "no such machine"])?;
    assert_eq!(run.code, Some(2), "{}{}", run.stdout, run.stderr);
    let mut failed = 0.0;
    for id in 1..=3 {
        let text = scrape(page(id)?, None)?.body;
        failed += sample(
            &text,
            "mesh_requests_total{kind=\"push\",outcome=\"invalid\"}",
        )?;
    }
    assert_eq!(
        failed, 1.0,
        "one push refused as invalid, counted once over the replicas"
    );

    // The host's restarts only grow, also when a new declaration gives the module a new
    // supervisor (whose own count starts again at 0).
    let key = "mesh_host_module_restarts_total";
    let before = bed.wait_for("g14's module restarted twice", wait_ms_default, || {
        let n = sample(&scrape(g14, None)?.body, key)?;
        Ok((n >= 2.0).then_some(n))
    })?;
    let healed = crash.replace("args = [\"-c\", \"exit 3\"]", "args = [\"600\"]");
    let healed = healed.replace("command = \"sh\"", "command = \"sleep\"");
    bed.apply(&healed, "crash sleeps now")?;
    bed.meshctl_ok(&["push", "g14", "--why", "stop the crash loop", "--wait=30s"])?;
    let status = bed.status()?;
    let module = module(&status, "g14", "crash").cloned().unwrap_or_default();
    assert_eq!(module["state"], "ready", "{status}");
    assert_eq!(
        module["restarts"], 0,
        "the new supervisor's own count: {status}"
    );
    let after = sample(&scrape(g14, None)?.body, key)?;
    assert!(
        after >= before,
        "{key} went back from {before} to {after} when the module got a new supervisor"
    );
    bed.wait_for("the leader counting g14 healed", wait_ms_default, || {
        let text = scrape(page(bed.leader_other_than(None)?)?, None)?.body;
        let healed = sample(&text, "mesh_hosts_failing")? == 0.0
            && sample(&text, "mesh_hosts_up_to_date")? == 2.0;
        Ok(healed.then_some(()))
    })?;
    Ok(())
}

#[test]
fn the_sample_alert_rules_pass_promtool_check_rules() -> anyhow::Result<()> {
    // Issue 25 item 6: deploy/prometheus/mesh-alerts.yml loads into Prometheus as it is.
    let dir = tempfile::tempdir()?;
    let file = dir.path().join("mesh-alerts.yml");
    std::fs::write(&file, alert_rules)?;
    let path = file.display().to_string();
    let said = promtool_run(
        &["check", "rules", &path],
        "",
        Duration::from_millis(http_wait_ms),
    )?;
    assert!(said.contains("SUCCESS"), "{said}");
    Ok(())
}
