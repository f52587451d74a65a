//! Beds for G7 "diff before effect" through real meshd and mesh-host processes (issue 9): a plan
//! shows every machine the push would send with its own diff and settings values in the clear,
//! `--detailed-exitcode` tells change from no change, and a saved plan is sent only while it holds.

use mesh_beds::{Bed, binaries};

const consumer: &str = include_str!("../beds/meshes/consumer.toml");

fn settled() -> anyhow::Result<Bed> {
    let bed = Bed::start(binaries!(), 3, consumer)?;
    bed.leader_other_than(None)?;
    bed.apply(consumer, "first model")?;
    bed.meshctl_ok(&["push", "--all", "--why", "first send"])?;
    Ok(bed)
}

fn sends_in_history(bed: &Bed) -> anyhow::Result<usize> {
    let history = bed.meshctl_ok(&["history"])?;
    Ok(history
        .stdout
        .lines()
        .filter(|l| l.contains("  send "))
        .count())
}

#[test]
fn g7_plan_shows_every_machine_it_would_send_with_its_own_diff_and_values_in_the_clear()
-> anyhow::Result<()> {
    // G7: after a mesh-wide setting changes, `plan --behind` lists both machines, each with its
    // own diff line showing the old and new value (the store holds them in the clear). An env
    // value a model change replaced shows in the clear too, from the kept model of the earlier
    // revision (issue 25: it showed as a digest).
    let bed = settled()?;
    let quiet = bed.meshctl(&["plan", "--behind", "--detailed-exitcode"])?;
    assert_eq!(quiet.code, Some(0), "{}{}", quiet.stdout, quiet.stderr);
    assert!(
        quiet.stdout.starts_with("nothing to send"),
        "{}",
        quiet.stdout
    );
    bed.meshctl_ok(&[
        "settings",
        "set",
        "mesh",
        "region=eu",
        "--why",
        "move region",
    ])?;
    let plan = bed.meshctl(&["plan", "--behind", "--detailed-exitcode"])?;
    assert_eq!(plan.code, Some(6), "{}{}", plan.stdout, plan.stderr);
    for (machine, module) in [("ace", "db"), ("g14", "app")] {
        assert!(
            plan.stdout.contains(&format!(
                "would send {machine} (behind): 1 change from the last send"
            )),
            "{}",
            plan.stdout
        );
        let line = format!("  ~ {module}: setting region: \"lab\" => \"eu\"");
        assert!(plan.stdout.contains(&line), "{line} in {}", plan.stdout);
    }
    let with_env = |value: &str| {
        consumer.replace(
            "[modules.db]\n",
            &format!("[modules.db]\nenv = {{ DB_NAME = \"{value}\" }}\n"),
        )
    };
    bed.apply(&with_env("mesh"), "name the database")?;
    bed.meshctl_ok(&["push", "--all", "--why", "name the database"])?;
    bed.apply(&with_env("mesh2"), "rename the database")?;
    let plan = bed.meshctl(&["plan", "ace", "--diff"])?;
    let line = "  ~ db: env DB_NAME: \"mesh\" => \"mesh2\"";
    assert!(
        plan.stdout.contains(line),
        "{line} in {}{}",
        plan.stdout,
        plan.stderr
    );
    Ok(())
}

#[test]
fn g7_a_saved_plan_is_sent_exactly_and_refused_once_the_store_moved() -> anyhow::Result<()> {
    // G7: `push --plan FILE` sends the reviewed plan; after another change it is refused, naming
    // what moved, and nothing is sent.
    let bed = settled()?;
    bed.meshctl_ok(&[
        "settings",
        "set",
        "mesh",
        "region=eu",
        "--why",
        "move region",
    ])?;
    let file = bed.dir.join("reviewed.plan");
    let file = file.display().to_string();
    bed.meshctl_ok(&["plan", "ace", "--out", &file])?;
    let sent = bed.meshctl(&["push", "--plan", &file, "--why", "as reviewed"])?;
    assert_eq!(sent.code, Some(0), "{}{}", sent.stdout, sent.stderr);
    assert!(sent.stdout.contains("applied"), "{}", sent.stdout);
    bed.meshctl_ok(&["plan", "g14", "--out", &file])?;
    bed.meshctl_ok(&[
        "settings",
        "set",
        "module/app",
        "mode=fast",
        "--why",
        "tune app",
    ])?;
    let before = sends_in_history(&bed)?;
    let refused = bed.meshctl(&["push", "--plan", &file, "--why", "stale review"])?;
    assert_eq!(
        refused.code,
        Some(1),
        "{}{}",
        refused.stdout,
        refused.stderr
    );
    assert!(refused.one_line_error(), "{}", refused.stderr);
    assert!(
        refused.stderr.contains("no longer holds"),
        "{}",
        refused.stderr
    );
    assert!(
        refused.stderr.contains("g14's changes differ"),
        "{}",
        refused.stderr
    );
    assert_eq!(sends_in_history(&bed)?, before, "nothing was sent");
    let junk = bed.dir.join("junk.plan");
    std::fs::write(&junk, "not a plan")?;
    let bad = bed.meshctl(&["push", "--plan", &junk.display().to_string(), "--why", "x"])?;
    assert_eq!(bad.code, Some(2), "{}{}", bad.stdout, bad.stderr);
    assert!(bad.one_line_error(), "{}", bad.stderr);
    Ok(())
}
