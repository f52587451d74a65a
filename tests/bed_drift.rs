//! The bed for drift (issue 25 item 3, decision 0305): with real `meshd` and `mesh-host`
//! processes (g14 reconciling every 300 ms), a module file edited by hand on the host and a
//! module's program replaced and its process killed each read `DRIFTED` naming what differs in
//! `status` (text and `--json`), the leader's page and `mesh_hosts_drifted`; the host repairs
//! nothing on its own; `push --behind` takes the drifted machine and restores it, and so does
//! a push naming it.

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use mesh_beds::{Bed, binaries};
use serde_json::Value;

/// g14's reconcile interval in this bed: drift is seen within a couple of them.
const reconcile_ms: u64 = 300;
/// Longest wait for any one state, in milliseconds.
const settle_ms: u64 = 15_000;

const conf: &str = "port = 5672\n";

/// Two machines; g14's broker runs `program` (a script the bed keeps outside the host's state)
/// with a declared file.
fn mesh(program: &Path) -> String {
    format!(
        r#"[machines.ace]
address = "127.0.0.1"

[machines.g14]
address = "127.0.0.1"

[modules.db]
machine = "ace"
command = "sleep"
args = ["600"]

[modules.broker]
machine = "g14"
command = "{}"
files = {{ "conf/broker.conf" = "port = 5672\n" }}
"#,
        program.display()
    )
}

/// A broker program that writes which version started into `marker`, then sleeps.
fn script(version: &str, marker: &Path) -> String {
    format!(
        "#!/bin/sh\necho {version} > '{}'\nexec sleep 600\n",
        marker.display()
    )
}

/// Puts `text` at `path` as a new file (write aside, rename over), as a deploy would.
fn replace(path: &Path, text: &str) -> anyhow::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let aside = path.with_extension("new");
    std::fs::write(&aside, text)?;
    std::fs::set_permissions(&aside, std::fs::Permissions::from_mode(0o755))?;
    std::fs::rename(&aside, path)?;
    Ok(())
}

fn line<'a>(text: &'a str, start: &str) -> &'a str {
    text.lines()
        .find(|l| l.trim_start().starts_with(start))
        .unwrap_or_default()
}

fn drifted(status: &Value, machine: &str) -> Vec<String> {
    Bed::machine(status, machine)
        .and_then(|m| m["drifted"].as_array())
        .map(|a| {
            a.iter()
                .filter_map(|d| d.as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

/// The leader's `mesh_hosts_drifted` sample.
fn drifted_gauge(bed: &Bed) -> anyhow::Result<Option<String>> {
    let status = bed.status()?;
    let leader = status["leader"]
        .as_u64()
        .ok_or_else(|| anyhow::anyhow!("no leader in {status}"))?;
    let page: SocketAddr = bed
        .page(leader)
        .ok_or_else(|| anyhow::anyhow!("replica {leader} serves no page"))?;
    let (code, metrics) = mesh_beds::http_get(page, "/metrics", Duration::from_millis(5_000))?;
    anyhow::ensure!(code == 200, "/metrics answered {code}");
    Ok(metrics
        .lines()
        .find(|l| l.starts_with("mesh_hosts_drifted "))
        .map(str::to_string))
}

/// Waits until g14's status line reads `want` (`DRIFTED …` or `up to date`), and returns it.
fn wait_line(bed: &Bed, what: &str, want: &str) -> anyhow::Result<String> {
    bed.wait_for(what, settle_ms, || {
        let text = bed.meshctl_ok(&["status"])?.stdout;
        let g14 = line(&text, "g14  sent").to_string();
        Ok(g14.contains(want).then_some(text))
    })
}

#[test]
fn drift_on_a_file_and_on_a_replaced_program_is_reported_and_repaired_by_push_behind()
-> anyhow::Result<()> {
    // G16 (issue 25 item 3): drift reported and repaired by the next push; both cases on one
    // bed (it takes a while to start).
    let outside = tempfile::tempdir()?;
    let program = outside.path().join("broker.sh");
    let marker = outside.path().join("started");
    replace(&program, &script("v1", &marker))?;
    let mesh = mesh(&program);
    let mut bed = Bed::start_with_pages(binaries!(), 3, &mesh)?;
    // g14 reconciles every 300 ms (init writes 2 s).
    bed.stop_host("g14")?;
    let host_toml = bed.dir.join("host-g14.toml");
    let text = std::fs::read_to_string(&host_toml)?;
    let text = text.replace(
        "reconcile_interval_ms = 2000",
        &format!("reconcile_interval_ms = {reconcile_ms}"),
    );
    std::fs::write(&host_toml, text)?;
    bed.start_host("g14")?;
    bed.leader_other_than(None)?;
    bed.apply(&mesh, "first model")?;
    bed.meshctl_ok(&["push", "--all", "--why", "drift bed", "--wait=20s"])?;
    wait_line(&bed, "g14 up to date", "up to date")?;
    assert_eq!(bed.read(&marker).trim(), "v1");

    // (a) A module file edited by hand on the host.
    let file = bed.host_root("g14").join("modules/broker/conf/broker.conf");
    std::fs::write(&file, "port = 1\n")?;
    let text = wait_line(&bed, "g14 drifted", "DRIFTED")?;
    let g14 = line(&text, "g14  sent");
    assert!(
        g14.contains("DRIFTED broker: conf/broker.conf changed") && !g14.contains("up to date"),
        "{text}"
    );
    assert!(
        line(&text, "broker").contains("DRIFTED: conf/broker.conf changed"),
        "{text}"
    );
    let status = bed.status()?;
    assert_eq!(
        drifted(&status, "g14"),
        ["broker: conf/broker.conf changed"]
    );
    assert!(drifted(&status, "ace").is_empty(), "{status}");
    let g14 = Bed::machine(&status, "g14").cloned().unwrap_or_default();
    assert_eq!(g14["behind"], true, "{status}");
    assert_eq!(
        g14["behind_why"],
        serde_json::json!(["drifted: broker: conf/broker.conf changed"]),
        "{status}"
    );
    assert_eq!(
        drifted_gauge(&bed)?.as_deref(),
        Some("mesh_hosts_drifted 1")
    );
    let page = bed
        .page(status["leader"].as_u64().unwrap_or_default())
        .ok_or_else(|| anyhow::anyhow!("no page"))?;
    let row = bed.wait_for("DRIFTED in g14's row of the page", settle_ms, || {
        let (_, html) = mesh_beds::http_get(page, "/", Duration::from_millis(5_000))?;
        let row = line(&html, "<tr><td>g14</td>").to_string();
        Ok(row.contains("DRIFTED").then_some(row))
    })?;
    assert!(row.contains("conf/broker.conf changed"), "{row}");
    // The host repairs nothing on its own (decision 0305): several reconciles later the edit is
    // still there and still reported.
    std::thread::sleep(Duration::from_millis(5 * reconcile_ms));
    assert_eq!(bed.read(&file), "port = 1\n");
    assert!(
        line(&bed.meshctl_ok(&["status"])?.stdout, "g14  sent").contains("DRIFTED"),
        "repaired without a push"
    );
    // The plan says what the push restores, though the declaration did not change.
    let plan = bed.meshctl_ok(&["plan", "--behind"])?.stdout;
    assert!(
        line(&plan, "would send g14 (behind)")
            .contains("0 changes from the last send, and restores 1 difference on the host")
            && plan.contains("~ broker: drift: conf/broker.conf changed => as sent"),
        "{plan}"
    );
    assert!(!plan.contains("would send ace"), "{plan}");
    let run = bed.meshctl_ok(&["push", "--behind", "--why", "repair drift", "--wait=20s"])?;
    assert!(
        line(&run.stdout, "g14").contains("applied"),
        "{}",
        run.stdout
    );
    assert!(
        line(&run.stdout, "ace").is_empty(),
        "only the drifted machine: {}",
        run.stdout
    );
    wait_line(&bed, "g14 repaired", "up to date")?;
    assert_eq!(bed.read(&file), conf);
    assert!(drifted(&bed.status()?, "g14").is_empty());
    assert_eq!(
        drifted_gauge(&bed)?.as_deref(),
        Some("mesh_hosts_drifted 0")
    );

    // (b) The program replaced and its process killed: the supervisor starts the new one.
    replace(&program, &script("v2", &marker))?;
    let status = bed.status()?;
    let pid = Bed::machine(&status, "g14")
        .and_then(|m| m["modules"].as_array())
        .and_then(|ms| ms.iter().find(|m| m["name"] == "broker"))
        .and_then(|m| m["pid"].as_i64())
        .ok_or_else(|| anyhow::anyhow!("broker's pid in {status}"))?;
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(i32::try_from(pid)?),
        nix::sys::signal::Signal::SIGKILL,
    )?;
    bed.wait_for("the replaced program started", settle_ms, || {
        Ok((bed.read(&marker).trim() == "v2").then_some(()))
    })?;
    let text = wait_line(&bed, "g14 drifted again", "process runs another")?;
    assert!(
        line(&text, "g14  sent").contains(
            "DRIFTED broker: program broker.sh replaced, broker: process runs another broker.sh"
        ),
        "{text}"
    );
    // Putting the program back does not change what runs: still drifted.
    replace(&program, &script("v1", &marker))?;
    let text = bed.wait_for("only the process drifted", settle_ms, || {
        let text = bed.meshctl_ok(&["status"])?.stdout;
        let g14 = line(&text, "g14  sent").to_string();
        Ok((!g14.contains("replaced") && g14.contains("DRIFTED")).then_some(text))
    })?;
    assert!(
        line(&text, "g14  sent").contains("DRIFTED broker: process runs another broker.sh"),
        "{text}"
    );
    // A push naming the machine repairs it too (it always sends, behind or not).
    bed.meshctl_ok(&["push", "g14", "--why", "restart broker", "--wait=20s"])?;
    wait_line(&bed, "g14 repaired again", "up to date")?;
    assert_eq!(
        bed.read(&marker).trim(),
        "v1",
        "the push restarted the broker"
    );
    assert!(drifted(&bed.status()?, "g14").is_empty());
    bed.no_replica_panicked()?;
    Ok(())
}
