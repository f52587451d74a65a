//! Beds for "applied means running" (issue 9): `status` shows each module's state from the last
//! report and never calls a machine with failing modules "up to date"; `push --wait` waits for
//! the report of its own send and exits 4 on a failing module, 5 when modules never get ready;
//! a push whose send is not confirmed applied (its host is down) exits 1.

use mesh_beds::{Bed, binaries};
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
    // never "up to date", for g14 while ace (healthy) is up to date.
    let bed = applied(crash)?;
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
    Ok(())
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
