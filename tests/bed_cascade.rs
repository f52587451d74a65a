//! Beds for G1 "one push is enough" through real meshd and mesh-host processes (issue 9): a
//! provider's port change, a consumer removed, a new consume after apply and a module moved
//! between machines each settle with one push, checked on the hosts' disks. No second push.

use mesh_beds::{Bed, binaries, wait_ms_default};

const pair: &str = include_str!("../beds/meshes/pair.toml");
const consumer: &str = include_str!("../beds/meshes/consumer.toml");

/// A bed on `mesh`, applied and pushed to every machine, every machine applied.
fn settled(mesh: &str) -> anyhow::Result<Bed> {
    let bed = Bed::start(binaries!(), 3, mesh)?;
    bed.leader_other_than(None)?;
    bed.apply(mesh, "first model")?;
    bed.meshctl_ok(&["push", "--all", "--why", "first send"])?;
    wait_behind(&bed, &[])?;
    Ok(bed)
}

/// Waits until `status` shows exactly `machines` behind (reports settle a send asynchronously).
fn wait_behind(bed: &Bed, machines: &[&str]) -> anyhow::Result<()> {
    bed.wait_for(&format!("behind = {machines:?}"), wait_ms_default, || {
        let now = behind(bed)?;
        Ok((now == machines).then_some(()))
    })
}

/// The push output's line for `machine`.
fn line<'a>(stdout: &'a str, machine: &str) -> &'a str {
    let prefix = format!("{machine} ");
    stdout
        .lines()
        .find(|l| l.starts_with(&prefix))
        .unwrap_or_default()
}

/// Machines `status` shows behind.
fn behind(bed: &Bed) -> anyhow::Result<Vec<String>> {
    let status = bed.status()?;
    let machines = status["machines"].as_array().cloned().unwrap_or_default();
    Ok(machines
        .iter()
        .filter(|m| m["behind"] == true)
        .filter_map(|m| m["name"].as_str().map(str::to_string))
        .collect())
}

#[test]
fn g1_a_provider_port_change_reaches_the_consumer_in_one_push_of_the_provider() -> anyhow::Result<()>
{
    // G1: db's port moves 5432 → 5433; one `push ace` applies on ace and on g14, whose
    // provisions.toml then names the new endpoint.
    let bed = settled(consumer)?;
    let moved = consumer.replace("port = 5432", "port = 5433");
    bed.apply(&moved, "db listens on 5433")?;
    wait_behind(&bed, &["g14"])?;
    let plan = bed.meshctl_ok(&["plan", "ace", "--diff"])?;
    assert!(
        plan.stdout.contains("would send g14 (cascaded from ace)"),
        "{}",
        plan.stdout
    );
    assert!(plan.stdout.contains("127.0.0.1:5433"), "{}", plan.stdout);
    let run = bed.meshctl(&["push", "ace", "--why", "db port"])?;
    assert_eq!(run.code, Some(0), "{}{}", run.stdout, run.stderr);
    assert!(
        line(&run.stdout, "ace").contains("applied"),
        "{}",
        run.stdout
    );
    let g14 = line(&run.stdout, "g14");
    assert!(
        g14.contains("applied") && g14.contains("cascaded from ace"),
        "{}",
        run.stdout
    );
    let file = bed.host_root("g14").join("modules/app/provisions.toml");
    bed.wait_for(
        "g14's provisions.toml with the new port",
        wait_ms_default,
        || Ok(bed.read(&file).contains("127.0.0.1:5433").then_some(())),
    )?;
    Ok(())
}

#[test]
fn g1_a_removed_consumer_has_its_grant_revoked_on_the_provider_in_one_push() -> anyhow::Result<()> {
    // G1: app on g14 stops consuming sql; one `push g14` takes its grant off db's grants file on
    // ace (a revoked credential must stop working).
    let bed = settled(consumer)?;
    let grants = bed.grants_file("ace", "db");
    bed.wait_for("app's grant on ace", wait_ms_default, || {
        Ok(bed.read(&grants).contains("app@g14").then_some(()))
    })?;
    bed.apply(pair, "app no longer needs sql")?;
    let run = bed.meshctl(&["push", "g14", "--why", "drop app's sql"])?;
    assert_eq!(run.code, Some(0), "{}{}", run.stdout, run.stderr);
    assert!(
        line(&run.stdout, "ace").contains("cascaded from g14"),
        "{}",
        run.stdout
    );
    bed.wait_for("app's grant gone from ace", wait_ms_default, || {
        let text = bed.read(&grants);
        Ok((!text.contains("app@g14")).then_some(()))
    })?;
    wait_behind(&bed, &[])?;
    Ok(())
}

#[test]
fn g1_a_new_consume_after_apply_shows_both_machines_behind_and_push_behind_sends_them()
-> anyhow::Result<()> {
    // G1: app starts consuming sql from db; apply and status name both machines (a mint pending
    // on g14, a grant on ace) and `push --behind` sends both.
    let bed = settled(pair)?;
    let applied = bed.apply(consumer, "app needs sql")?;
    assert!(
        applied.stdout.contains("behind their last send: ace, g14"),
        "{}",
        applied.stdout
    );
    wait_behind(&bed, &["ace", "g14"])?;
    let history = bed.meshctl_ok(&["history"])?;
    let model = history
        .stdout
        .lines()
        .rfind(|l| l.contains("model revision 2 applied"));
    let model = model.unwrap_or_default();
    assert!(
        model.contains("should-be changed on ace, g14"),
        "{}",
        history.stdout
    );
    assert!(model.ends_with("app needs sql"), "{}", history.stdout);
    let run = bed.meshctl(&["push", "--behind", "--why", "app needs sql"])?;
    assert_eq!(run.code, Some(0), "{}{}", run.stdout, run.stderr);
    let grants = bed.grants_file("ace", "db");
    bed.wait_for("app's grant on ace", wait_ms_default, || {
        Ok(bed.read(&grants).contains("app@g14").then_some(()))
    })?;
    let file = bed.host_root("g14").join("modules/app/provisions.toml");
    assert!(
        bed.read(&file).contains("127.0.0.1:5432"),
        "{}",
        bed.read(&file)
    );
    Ok(())
}

#[test]
fn g1_a_module_moved_between_machines_leaves_one_and_starts_on_the_other_in_one_push()
-> anyhow::Result<()> {
    // G1: app moves g14 → ace; one `push ace` starts it on ace and stops it on g14.
    let bed = settled(pair)?;
    let moved = pair.replace(
        "[modules.app]\nmachine = \"g14\"",
        "[modules.app]\nmachine = \"ace\"",
    );
    assert_ne!(moved, pair, "the bed mesh places app on g14");
    bed.apply(&moved, "app moves to ace")?;
    let run = bed.meshctl(&["push", "ace", "--why", "app to ace"])?;
    assert_eq!(run.code, Some(0), "{}{}", run.stdout, run.stderr);
    let g14 = line(&run.stdout, "g14");
    assert!(g14.contains("module app moved"), "{}", run.stdout);
    assert!(g14.contains("applied"), "{}", run.stdout);
    let on = |machine: &str| bed.host_root(machine).join("modules/app");
    bed.wait_for("app on ace and not on g14", wait_ms_default, || {
        Ok((on("ace").exists() && !on("g14").exists()).then_some(()))
    })?;
    wait_behind(&bed, &[])?;
    Ok(())
}

/// pair.toml without g14 and its module.
const ace_only: &str = r#"
[machines.ace]
address = "127.0.0.1"

[modules.db]
machine = "ace"
command = "sleep"
args = ["600"]
mounts = [{ name = "data", host_dir = "/srv/db/a", target = "data" }]
provides = [{ kind = "sql", port = 5432 }]

[settings.mesh]
region = "lab"
"#;

#[test]
fn a_machine_that_runs_modules_leaves_the_model_only_through_a_drain_that_stops_them_first()
-> anyhow::Result<()> {
    // Issue 9 part 8: dropping g14 while it runs app is refused (exit 2, nothing stored); with
    // `--drain` g14 stays empty, the push stops app, and the next apply removes g14; its settings
    // layer can still be shown and cleared.
    let bed = settled(pair)?;
    bed.meshctl_ok(&[
        "settings",
        "set",
        "machine/g14",
        "tier=edge",
        "--why",
        "tag",
    ])?;
    let revision = |bed: &Bed| -> anyhow::Result<u64> {
        bed.status()?["revision"]
            .as_u64()
            .ok_or_else(|| anyhow::anyhow!("no revision"))
    };
    let before = revision(&bed)?;
    let file = bed.dir.join("ace-only.toml");
    std::fs::write(&file, ace_only)?;
    let file = file.display().to_string();
    let refused = bed.meshctl(&["apply", "-f", &file, "--why", "retire g14"])?;
    assert_eq!(
        refused.code,
        Some(2),
        "{}{}",
        refused.stdout,
        refused.stderr
    );
    assert!(
        refused
            .stderr
            .contains("machine g14 cannot leave the model: it still runs app"),
        "{}",
        refused.stderr
    );
    assert_eq!(revision(&bed)?, before, "nothing was stored");
    let drained = bed.meshctl_ok(&["apply", "-f", &file, "--drain", "--why", "retire g14"])?;
    assert!(
        drained.stdout.contains("draining g14"),
        "{}",
        drained.stdout
    );
    bed.meshctl_ok(&["push", "g14", "--why", "stop app before g14 goes"])?;
    let app = bed.host_root("g14").join("modules/app");
    bed.wait_for("app stopped on g14", wait_ms_default, || {
        Ok((!app.exists()).then_some(()))
    })?;
    bed.wait_for("g14's empty send confirmed", wait_ms_default, || {
        let run = bed.meshctl(&["apply", "-f", &file, "--why", "g14 is empty now"])?;
        Ok((run.code == Some(0)).then_some(()))
    })?;
    let status = bed.status()?;
    assert!(Bed::machine(&status, "g14").is_none(), "{status}");
    let shown = bed.meshctl_ok(&["settings", "show", "machine/g14"])?;
    assert!(shown.stdout.contains("tier"), "{}", shown.stdout);
    bed.meshctl_ok(&["settings", "clear", "machine/g14", "--why", "g14 is gone"])?;
    Ok(())
}
