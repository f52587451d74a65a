//! Beds for issue 25 items 1 and 2 (decisions 0302, 0303) with real meshd, mesh-host and meshctl:
//! the stored model read back as a file that applies to the same digest, `diff`'s exit codes, and
//! rollbacks of a settings change and of a module move, each planned, then pushed and applied.
//! One bed per test, every case of a test on it, to keep the whole run near a minute.

use mesh::core::meshfile::parse_mesh;
use mesh_beds::{Bed, binaries};

const example: &str = include_str!("../examples/mesh.toml");
const consumer: &str = include_str!("../beds/meshes/consumer.toml");

/// The digest `apply` names for a model: blake3 over its encoded bytes.
fn digest(text: &str) -> anyhow::Result<String> {
    let mesh = parse_mesh("mesh.toml", text).map_err(|e| anyhow::anyhow!("{e}"))?;
    let bytes = mesh_codec::encode("model", &mesh)?;
    Ok(blake3::hash(&bytes).to_hex().to_string())
}

/// The store's revision and the model revision in force, from `model show --json`.
fn revisions(bed: &Bed) -> anyhow::Result<(u64, u64)> {
    let doc = bed.meshctl_ok(&["model", "show", "--json"])?.json()?;
    let answer = &doc["answer"];
    match (
        answer["store_revision"].as_u64(),
        answer["model_revision"].as_u64(),
    ) {
        (Some(store), Some(model)) => Ok((store, model)),
        _ => anyhow::bail!("no revisions in {doc}"),
    }
}

#[test]
fn model_show_prints_the_example_mesh_back_as_a_file_that_applies_unchanged_to_the_same_digest()
-> anyhow::Result<()> {
    // Issue 25 item 1: lose mesh.toml and the cluster gives it back: `model show` prints the
    // stored model, whose digest is the applied file's, and applying it stores nothing.
    let bed = Bed::start(binaries!(), 1, example)?;
    bed.leader_other_than(None)?;
    bed.apply(example, "first model")?;
    let shown = bed.meshctl_ok(&["model", "show"])?.stdout;
    assert_eq!(digest(&shown)?, digest(example)?, "{shown}");
    assert!(
        shown.contains(&format!(
            "# digest (blake3 of the encoded model, as apply names it): {}",
            digest(example)?
        )),
        "{shown}"
    );
    let json = bed.meshctl_ok(&["model", "show", "--json"])?.json()?;
    assert_eq!(json["answer"]["digest"], digest(example)?.as_str());
    assert_eq!(json["answer"]["current"], true);
    let before = revisions(&bed)?;
    let file = bed.dir.join("shown.toml");
    std::fs::write(&file, &shown)?;
    let again = bed.meshctl_ok(&["apply", "-f", &file.display().to_string(), "--why", "same"])?;
    assert!(
        again.stdout.starts_with(&format!(
            "unchanged: model revision {} already has this model",
            before.1
        )),
        "{}",
        again.stdout
    );
    assert_eq!(revisions(&bed)?, before, "no new revision");
    let history = bed.meshctl_ok(&["history"])?.stdout;
    assert!(!history.contains("same"), "no history row: {history}");
    // The upload path (a model over `apply_inline_bytes_max` goes in chunks) stores nothing
    // either when the model is in force, and reads back to its digest too.
    let large = mesh_beds::sized_model(example, 5 * 1024 * 1024);
    bed.apply(&large, "large")?;
    let at = revisions(&bed)?;
    let again = bed.apply(&large, "large again")?;
    assert!(
        again.stdout.starts_with(&format!(
            "unchanged: model revision {} already has this model",
            at.1
        )),
        "{}",
        again.stdout
    );
    assert_eq!(revisions(&bed)?, at, "no new revision");
    let shown = bed.meshctl_ok(&["model", "show"])?.stdout;
    assert_eq!(digest(&shown)?, digest(&large)?);
    // The example's revision is still kept and reads back as it was.
    let old = bed
        .meshctl_ok(&["model", "show", "--revision", &before.1.to_string()])?
        .stdout;
    assert_eq!(digest(&old)?, digest(example)?, "{old}");
    assert!(old.contains("not in force"), "{old}");
    // A revision that stored no model is refused by name, exit 2.
    let none = bed.meshctl(&["model", "show", "--revision", "999"])?;
    assert_eq!(none.code, Some(2), "{}{}", none.stdout, none.stderr);
    assert!(
        none.stderr.contains("revision 999 does not exist"),
        "{}",
        none.stderr
    );
    Ok(())
}

#[test]
fn diff_exits_0_1_or_2_and_rollbacks_of_settings_and_a_move_are_planned_then_pushed()
-> anyhow::Result<()> {
    // Issue 25 items 1 and 2: `diff` as `kubectl diff`; `settings rollback` and `rollback`
    // store a new revision equal to the old one, send nothing themselves, `plan` shows the
    // push, and the push applies it on the hosts.
    let bed = Bed::start(binaries!(), 3, consumer)?;
    bed.leader_other_than(None)?;
    let first = bed.meshctl_ok(&[
        "apply",
        "-f",
        &write(&bed, "consumer.toml", consumer)?,
        "--why",
        "first",
        "--json",
    ])?;
    let first_revision = first.json()?["answer"]["revision"]
        .as_u64()
        .ok_or_else(|| anyhow::anyhow!("no revision"))?;
    bed.meshctl_ok(&["push", "--all", "--why", "first send"])?;

    // diff: 0 for the stored model, 1 for a move (named per module), 2 for a bad file.
    let same = bed.meshctl(&["diff", "-f", &write(&bed, "same.toml", consumer)?])?;
    assert_eq!(same.code, Some(0), "{}{}", same.stdout, same.stderr);
    assert!(same.stdout.starts_with("no differences"), "{}", same.stdout);
    // app moves to ace, and db's data mount to another directory (held until `--move`, G8).
    let moved_text = consumer
        .replace(
            "[modules.app]\nmachine = \"g14\"",
            "[modules.app]\nmachine = \"ace\"",
        )
        .replace("/srv/db/a", "/srv/db/b");
    let moved = write(&bed, "moved.toml", &moved_text)?;
    let differs = bed.meshctl(&["diff", "-f", &moved])?;
    assert_eq!(
        differs.code,
        Some(1),
        "{}{}",
        differs.stdout,
        differs.stderr
    );
    assert!(
        differs
            .stdout
            .contains("~ module app\n    machine: \"g14\" => \"ace\""),
        "{}",
        differs.stdout
    );
    assert!(
        differs
            .stdout
            .contains("~ module db\n    mount data: /srv/db/a -> data => /srv/db/b -> data"),
        "{}",
        differs.stdout
    );
    let bad = bed.meshctl(&["diff", "-f", &write(&bed, "bad.toml", "[machines.x")?])?;
    assert_eq!(bad.code, Some(2), "{}{}", bad.stdout, bad.stderr);
    let gone = bed.meshctl(&["diff", "-f", "/nonexistent/mesh.toml"])?;
    assert_eq!(gone.code, Some(2), "{}{}", gone.stdout, gone.stderr);

    // settings rollback: #1 is the layer the first apply seeded (region=lab).
    bed.meshctl_ok(&["settings", "set", "mesh", "region=eu", "--why", "move"])?;
    bed.meshctl_ok(&["push", "--behind", "--why", "eu"])?;
    bed.meshctl_ok(&["settings", "rollback", "mesh", "--to", "1", "--why", "back"])?;
    let plan = bed.meshctl(&["plan", "--behind", "--detailed-exitcode"])?;
    assert_eq!(plan.code, Some(6), "{}{}", plan.stdout, plan.stderr);
    assert!(
        plan.stdout.contains("setting region: \"eu\" => \"lab\""),
        "{}",
        plan.stdout
    );
    let pushed = bed.meshctl_ok(&["push", "--behind", "--why", "settings back"])?;
    assert!(pushed.stdout.contains("applied"), "{}", pushed.stdout);
    let again = bed.meshctl_ok(&[
        "settings", "rollback", "mesh", "--to", "1", "--why", "twice",
    ])?;
    assert!(again.stdout.contains("unchanged"), "{}", again.stdout);
    bed.wait_none_behind(2)?;

    // rollback of a module move: app moved to ace (db's mount with it, held until `--move`)
    // and pushed, then both back.
    bed.meshctl_ok(&["apply", "-f", &moved, "--why", "move app"])?;
    let held = bed.meshctl(&["push", "--all", "--why", "app to ace"])?;
    assert_eq!(held.code, Some(3), "{}{}", held.stdout, held.stderr);
    bed.meshctl_ok(&["push", "ace", "--move", "db", "--why", "accept the move"])?;
    runs_on(&bed, "ace", "app")?;
    let to = first_revision.to_string();
    let back = bed.meshctl_ok(&["rollback", "--to-revision", &to, "--why", "app home"])?;
    assert!(
        back.stdout.starts_with("stored model revision"),
        "{}",
        back.stdout
    );
    let plan = bed.meshctl(&["plan", "--behind", "--detailed-exitcode"])?;
    assert_eq!(plan.code, Some(6), "{}{}", plan.stdout, plan.stderr);
    assert!(plan.stdout.contains("would send g14"), "{}", plan.stdout);
    assert!(plan.stdout.contains("would hold ace"), "{}", plan.stdout);
    let shown = bed.meshctl_ok(&["model", "show"])?.stdout;
    assert_eq!(digest(&shown)?, digest(consumer)?, "the first model again");
    assert!(
        plan.stdout.contains("/srv/db/b") && plan.stdout.contains("/srv/db/a"),
        "the plan names the held mount: {}",
        plan.stdout
    );
    // Holds included: the rollback's push holds ace (db's mount would move back) until
    // `--move`, as any change's push does (G8).
    let held = bed.meshctl(&["push", "--behind", "--why", "rollback"])?;
    assert_eq!(held.code, Some(3), "{}{}", held.stdout, held.stderr);
    runs_on(&bed, "g14", "app")?;
    let released = bed.meshctl(&["push", "ace", "--move", "db", "--why", "rollback db"])?;
    assert_eq!(
        released.code,
        Some(0),
        "{}{}",
        released.stdout,
        released.stderr
    );
    bed.wait_none_behind(2)?;
    let status = bed.status()?;
    let on_ace = Bed::machine(&status, "ace")
        .and_then(|m| m["modules"].as_array())
        .cloned();
    assert!(
        on_ace.is_some_and(|ms| ms.iter().all(|m| m["name"] != "app")),
        "app left ace: {status}"
    );
    Ok(())
}

fn write(bed: &Bed, name: &str, text: &str) -> anyhow::Result<String> {
    let path = bed.dir.join(name);
    std::fs::write(&path, text)?;
    Ok(path.display().to_string())
}

/// Waits until `machine`'s host reports `module` among its modules.
fn runs_on(bed: &Bed, machine: &str, module: &str) -> anyhow::Result<()> {
    bed.wait_for(&format!("{module} on {machine}"), 15_000, || {
        let status = bed.status()?;
        let runs = Bed::machine(&status, machine)
            .and_then(|m| m["modules"].as_array())
            .is_some_and(|ms| ms.iter().any(|m| m["name"] == module));
        Ok(runs.then_some(()))
    })
}
