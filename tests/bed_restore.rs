//! Bed for "a restored cluster keeps working as a cluster" (issue 11 part 6, G9 after `meshd
//! restore`): every replica restored from one `snapshot save` file, then one of them stopped and
//! started on an empty store catches up (no openraft panic, its status says it is level), and
//! started again on the store it caught up into it comes up and stays level.

use mesh_beds::{Bed, binaries, wait_ms_default};

const pair: &str = include_str!("../beds/meshes/pair.toml");

/// Removes replica `id`'s store and epoch-floor file (its keys and certificate stay): an empty
/// store, as on a new disk.
fn wipe_store(bed: &Bed, id: u64) -> anyhow::Result<()> {
    let dir = bed.dir.join(format!("replica-{id}"));
    for file in ["replica.redb", "epoch-floor"] {
        let path = dir.join(file);
        if path.exists() {
            std::fs::remove_file(&path)?;
        }
    }
    Ok(())
}

fn settings_set(bed: &Bed, n: usize) -> anyhow::Result<()> {
    let value = format!("n={n}");
    bed.meshctl_ok(&[
        "settings",
        "set",
        "machine/ace",
        &value,
        "--why",
        "move the log",
    ])?;
    Ok(())
}

#[test]
fn g9_a_restored_cluster_takes_back_a_replica_started_on_an_empty_store_and_again_on_its_own()
-> anyhow::Result<()> {
    let mut bed = Bed::start(binaries!(), 3, pair)?;
    let run = restore_and_wipe(&mut bed);
    // The logs go with the bed's temp dir: a failure carries their ends.
    run.map_err(|e| {
        let tails = bed.log_tails(3);
        let status = bed
            .status()
            .map_or_else(|e| e.to_string(), |s| s["replicas"].to_string());
        e.context(format!("{tails}\n--- status replicas: {status}"))
    })
}

fn restore_and_wipe(bed: &mut Bed) -> anyhow::Result<()> {
    bed.leader_other_than(None)?;
    bed.apply(pair, "first model")?;
    bed.meshctl_ok(&["push", "--all", "--why", "first send"])?;
    for n in 0..5 {
        settings_set(bed, n)?;
    }
    let file = bed.dir.join("all.snapshot");
    bed.meshctl_ok(&["snapshot", "save", &file.display().to_string()])?;

    // Every replica restored from the same file, as the operator guide says.
    for id in 1..=3 {
        bed.kill_replica(id)?;
    }
    for id in 1..=3 {
        wipe_store(bed, id)?;
        let config = bed.dir.join(format!("replica-{id}.toml"));
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_meshd"))
            .arg("restore")
            .arg("--config")
            .arg(&config)
            .arg("--from")
            .arg(&file)
            .output()?;
        anyhow::ensure!(
            out.status.success(),
            "meshd restore of replica {id}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    for id in 1..=3 {
        bed.restart_replica(id)?;
    }
    let leader = bed.leader_other_than(None)?;
    for n in 5..10 {
        settings_set(bed, n)?;
    }

    // One follower stopped and started on an empty store: it must catch up from the leader.
    let wiped = (1..=3).find(|id| *id != leader).unwrap_or(1);
    bed.kill_replica(wiped)?;
    wipe_store(bed, wiped)?;
    bed.restart_replica(wiped)?;
    settings_set(bed, 10)?;
    let caught_up = bed.wait_for("the wiped replica level", wait_ms_default, || {
        bed.no_replica_panicked()?;
        Ok(Bed::level(&bed.status()?, wiped))
    })?;
    bed.no_replica_panicked()?;

    // Started again on the store it caught up into.
    bed.kill_replica(wiped)?;
    bed.restart_replica(wiped)?;
    settings_set(bed, 11)?;
    let again = bed.wait_for(
        "the replica level on its own store",
        wait_ms_default,
        || {
            bed.no_replica_panicked()?;
            Ok(Bed::level(&bed.status()?, wiped).filter(|i| *i > caught_up))
        },
    )?;
    bed.no_replica_panicked()?;
    assert!(again > caught_up, "{again} after {caught_up}");
    let shown = bed.meshctl_in(
        &bed.context_for(wiped)?,
        &["settings", "show", "machine/ace"],
    )?;
    assert!(
        shown.stdout.contains("n = 11") || shown.stdout.contains("n=11"),
        "{}{}",
        shown.stdout,
        shown.stderr
    );
    Ok(())
}
