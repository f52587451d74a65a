//! Beds for what an operator sees with real processes: G8 held mount moves, G6 settings history
//! and refused removals, G11 genesis equal to the controller's compose, and bad input refused in
//! one line with the store unchanged.

use mesh_beds::{Bed, binaries};

const pair: &str = include_str!("../beds/meshes/pair.toml");
const moved: &str = include_str!("../beds/meshes/moved.toml");

fn ready(mesh: &str) -> anyhow::Result<Bed> {
    let bed = Bed::start(binaries!(), 3, mesh)?;
    bed.leader_other_than(None)?;
    bed.apply(mesh, "first model")?;
    bed.meshctl_ok(&["push", "--all", "--why", "first send"])?;
    Ok(bed)
}

#[test]
fn g8_mount_move_is_held_named_and_released_with_move() -> anyhow::Result<()> {
    // G8: a push that would move a running module's mount holds the machine (exit 3) naming
    // module, mount and both directories; `--move` releases it; a wrong `--move` is refused.
    let bed = ready(pair)?;
    bed.apply(moved, "move db data")?;
    let held = bed.meshctl(&["push", "ace", "--why", "move db data"])?;
    assert_eq!(held.code, Some(3), "{}{}", held.stdout, held.stderr);
    assert!(
        held.stdout.contains("/srv/db/a") && held.stdout.contains("/srv/db/b"),
        "{}",
        held.stdout
    );
    assert!(held.stdout.contains("--move db"), "{}", held.stdout);
    let wrong = bed.meshctl(&["push", "ace", "--move", "app", "--why", "wrong module"])?;
    assert_ne!(wrong.code, Some(0));
    assert!(wrong.one_line_error(), "{}", wrong.stderr);
    let released = bed.meshctl(&["push", "ace", "--move", "db", "--why", "accept the move"])?;
    assert_eq!(
        released.code,
        Some(0),
        "{}{}",
        released.stdout,
        released.stderr
    );
    Ok(())
}

#[test]
fn g6_settings_set_names_each_key_keeps_history_and_refuses_removal() -> anyhow::Result<()> {
    // G6: set answers every key added and changed; a removal without --replace is refused; the
    // replaced layer is kept in the history; --replace on a scope with no layer is refused.
    let bed = ready(pair)?;
    let set = bed.meshctl_ok(&[
        "settings",
        "set",
        "mesh",
        "region=sea",
        "tier=gold",
        "--why",
        "w",
    ])?;
    assert!(
        set.stdout.contains("changed region") && set.stdout.contains("added tier"),
        "{}",
        set.stdout
    );
    let removal = bed.meshctl(&["settings", "set", "mesh", "-tier", "--why", "w"])?;
    assert_eq!(removal.code, Some(2));
    let replaced = bed.meshctl_ok(&[
        "settings",
        "set",
        "mesh",
        "region=sea",
        "--replace",
        "--why",
        "drop tier",
    ])?;
    assert!(
        replaced.stdout.contains("removed tier"),
        "{}",
        replaced.stdout
    );
    let shown = bed
        .meshctl_ok(&["settings", "show", "mesh", "--history", "--json"])?
        .json()?;
    let history = shown["answer"]["history"]
        .as_array()
        .map(Vec::len)
        .unwrap_or(0);
    assert!(history >= 2, "{shown}");
    // Decision 0317: the store keeps only the keys a write changed, yet the reader sees the
    // whole layer before and after each write, as before.
    let last = &shown["answer"]["history"][history - 1];
    assert_eq!(last["change"], "changed", "{last}");
    assert_eq!(
        last["before"],
        serde_json::json!({"region": "sea", "tier": "gold"}),
        "{last}"
    );
    assert_eq!(
        last["after"],
        serde_json::json!({"region": "sea"}),
        "{last}"
    );
    let text = bed.meshctl_ok(&["settings", "show", "mesh", "--history"])?;
    assert!(
        text.stdout
            .contains("    before: region=sea, tier=gold\n    after:  region=sea\n"),
        "{}",
        text.stdout
    );
    let no_layer = bed.meshctl(&[
        "settings",
        "set",
        "machine/g14",
        "a=1",
        "--replace",
        "--why",
        "w",
    ])?;
    assert_ne!(no_layer.code, Some(0));
    assert!(no_layer.one_line_error(), "{}", no_layer.stderr);
    Ok(())
}

#[test]
fn g11_genesis_digest_equals_what_the_controller_sends() -> anyhow::Result<()> {
    // G11: `meshctl init -f` writes each machine's first declaration; the controller's first send
    // to that machine has the same digest.
    let bed = ready(pair)?;
    let status = bed.status()?;
    for machine in ["ace", "g14"] {
        let bytes = std::fs::read(bed.dir.join(format!("host-{machine}/genesis.declaration")))?;
        let genesis = blake3_hex(&bytes);
        let sent = Bed::machine(&status, machine)
            .and_then(|m| m["last_send"]["digest"].as_str().map(String::from))
            .ok_or_else(|| anyhow::anyhow!("{machine} never sent: {status}"))?;
        assert_eq!(sent, genesis, "{machine}");
    }
    Ok(())
}

fn blake3_hex(bytes: &[u8]) -> String {
    let d: mesh::core::declaration::Declaration =
        mesh_codec::decode("declaration", bytes).expect("genesis decodes");
    mesh::core::compose::digest(&d).to_string()
}

#[test]
fn bad_input_is_one_line_nonzero_and_leaves_the_store_unchanged() -> anyhow::Result<()> {
    // Bad input: unknown machine, module or scope; missing --why; a mesh file with errors; a host
    // certificate used as operator. Each is one line, non-zero, and history/status do not change.
    let bed = ready(pair)?;
    let before = bed.meshctl_ok(&["history", "--json"])?.json()?["answer"].clone();
    let revision = bed.status()?["revision"].clone();
    let bad_file = bed.dir.join("bad.toml");
    std::fs::write(&bad_file, "[machines.ace]\naddress = 7\n")?;
    let bad_file = bad_file.display().to_string();
    let cases: Vec<Vec<&str>> = vec![
        vec!["push", "zz", "--why", "w"],
        vec!["plan", "zz", "--diff"],
        vec!["push", "ace", "--move", "nosuch", "--why", "w"],
        vec![
            "push",
            "ace",
            "--move",
            "db",
            "--why",
            "db's mounts are not moving",
        ],
        vec!["push", "ace", "--move", "app", "--why", "app is not on ace"],
        vec!["settings", "set", "module/nosuch", "a=1", "--why", "w"],
        vec!["settings", "set", "machine/zz", "a=1", "--why", "w"],
        vec!["push", "ace"],
        vec!["apply", "-f", &bad_file, "--why", "w"],
    ];
    for args in cases {
        let run = bed.meshctl(&args)?;
        assert_ne!(run.code, Some(0), "{args:?}: {}", run.stdout);
        assert!(run.one_line_error(), "{args:?}: {}", run.stderr);
    }
    let host_ctx = bed.dir.join("host-as-operator.toml");
    std::fs::write(
        &host_ctx,
        std::fs::read_to_string(&bed.context)?.replace("operator/", "host-ace/"),
    )?;
    let run = bed.meshctl_in(&host_ctx, &["push", "ace", "--why", "w"])?;
    assert_eq!(run.code, Some(1));
    assert!(run.one_line_error(), "{}", run.stderr);
    assert_eq!(
        bed.meshctl_ok(&["history", "--json"])?.json()?["answer"],
        before
    );
    assert_eq!(bed.status()?["revision"], revision);
    Ok(())
}

#[test]
fn validation_holes_are_refused_at_apply_and_settings_set_with_exit_2_and_the_store_unchanged()
-> anyhow::Result<()> {
    // Issue 9: two modules on one port, a placement scope off the module's machine, a repeated
    // key, control characters and an oversized value: each refused in one line naming it, exit 2,
    // and neither history nor the model revision moves.
    let bed = ready(pair)?;
    let before = bed.meshctl_ok(&["history", "--json"])?.json()?["answer"].clone();
    let revision = bed.status()?["revision"].clone();
    let clash = bed.dir.join("clash.toml");
    std::fs::write(
        &clash,
        format!(
            "{pair}\n[modules.rogue]\nmachine = \"ace\"\ncommand = \"sleep\"\nargs = [\"600\"]\nprovides = [{{ kind = \"pg\", port = 5432 }}]\n"
        ),
    )?;
    let clash = clash.display().to_string();
    let control = bed.dir.join("control.toml");
    std::fs::write(
        &control,
        pair.replace("region = \"lab\"", "region = \"lab\\u001b[2J\""),
    )?;
    let control = control.display().to_string();
    let big = format!(
        "blob={}",
        "x".repeat(mesh::core::settings::setting_value_bytes_max + 1)
    );
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (
            vec!["apply", "-f", &clash, "--why", "w"],
            "module `rogue` would listen on 127.0.0.1:5432 on machine ace, where module `db` listens too",
        ),
        (
            vec!["apply", "-f", &control, "--why", "w"],
            "setting `region` has a control character (U+001B)",
        ),
        (
            vec!["settings", "set", "module/db@g14", "a=1", "--why", "w"],
            "module `db` runs on ace, not on g14",
        ),
        (
            vec!["settings", "set", "mesh", "a=1", "a=2", "--why", "w"],
            "setting `a` is given twice",
        ),
        (
            vec!["settings", "set", "mesh", "motd=two\nlines", "--why", "w"],
            "control character (U+000A)",
        ),
        (
            vec!["settings", "set", "mesh", "k\tey=1", "--why", "w"],
            "control character (U+0009)",
        ),
        (
            vec!["settings", "set", "mesh", &big, "--why", "w"],
            "over the limit of 65536 bytes (setting_value_bytes_max)",
        ),
    ];
    for (args, says) in cases {
        let run = bed.meshctl(&args)?;
        let shown: Vec<&str> = args.iter().map(|a| &a[..a.len().min(40)]).collect();
        assert_eq!(run.code, Some(2), "{shown:?}: {}{}", run.stdout, run.stderr);
        assert!(run.one_line_error(), "{shown:?}: {}", run.stderr);
        assert!(run.stderr.contains(says), "{shown:?}: {}", run.stderr);
    }
    assert_eq!(
        bed.meshctl_ok(&["history", "--json"])?.json()?["answer"],
        before
    );
    assert_eq!(bed.status()?["revision"], revision);
    Ok(())
}
