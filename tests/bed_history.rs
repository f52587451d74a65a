//! Beds for "no answer an operator can ask for may hit a limit" (issue 13 part 3) through real
//! meshd processes: a settings history larger than one frame (16 MiB) is still read whole by
//! `history`, `settings show --history` and `snapshot save`, page by page and chunk by chunk, and
//! `history --limit/--machine/--since` narrow it.

use mesh_beds::{Bed, binaries};

const pair: &str = include_str!("../beds/meshes/pair.toml");

/// Settings writes of four 60 KB values each: every history row keeps its four keys before and
/// after (decision 0317: the keys a write changed), so 40 of them come to about 19 MB, past a
/// 16 MiB frame.
const big_writes: usize = 40;
const value_bytes: usize = 60 * 1024;

#[test]
fn a_history_larger_than_a_frame_is_read_whole_by_history_settings_show_and_snapshot_save()
-> anyhow::Result<()> {
    // Issue 13: "History and backups stop at 16 MiB" — they must not.
    let bed = Bed::start(binaries!(), 3, pair)?;
    bed.leader_other_than(None)?;
    bed.apply(pair, "first model")?;
    bed.meshctl_ok(&["push", "--all", "--why", "first send"])?;
    for n in 0..big_writes {
        let values: Vec<String> = (0..4)
            .map(|k| {
                format!(
                    "k{k}={}",
                    char::from(b'a' + (n % 26) as u8)
                        .to_string()
                        .repeat(value_bytes)
                )
            })
            .collect();
        let mut args = vec!["settings", "set", "machine/ace"];
        args.extend(values.iter().map(String::as_str));
        args.extend(["--why", "grow the history"]);
        bed.meshctl_ok(&args)?;
    }
    let history = bed.meshctl_ok(&["history", "--json"])?.json()?;
    let items = history["answer"]["items"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let settings = items.iter().filter(|i| i["kind"] == "settings").count();
    assert!(settings > big_writes, "{settings} settings entries");
    let shown = bed.meshctl_ok(&["settings", "show", "machine/ace", "--history"])?;
    let rows = shown
        .stdout
        .matches("machine/ace  by operator:bed: grow the history")
        .count();
    assert_eq!(
        rows,
        big_writes,
        "{}",
        &shown.stdout[..shown.stdout.len().min(400)]
    );
    let newest = bed.meshctl_ok(&["history", "--limit", "3"])?;
    let lines = newest
        .stdout
        .lines()
        .filter(|l| l.contains("  epoch "))
        .count();
    assert_eq!(lines, 3, "{}", newest.stdout);
    let sends = bed.meshctl_ok(&["history", "--machine", "g14", "--since", "1h"])?;
    let lines: Vec<&str> = sends
        .stdout
        .lines()
        .filter(|l| l.contains("  epoch "))
        .collect();
    assert_eq!(lines.len(), 1, "{}", sends.stdout);
    assert!(lines[0].contains("send g14 #1"), "{}", sends.stdout);
    let file = bed.dir.join("big.snapshot");
    let saved = bed.meshctl_ok(&["snapshot", "save", &file.display().to_string()])?;
    let size = std::fs::metadata(&file)?.len();
    assert!(size > 16 * 1024 * 1024, "{size} bytes: {}", saved.stdout);
    assert!(
        saved.stdout.contains(&format!("wrote {size} bytes")),
        "{}",
        saved.stdout
    );
    let bad = bed.meshctl(&["history", "--since", "yesterday-ish"])?;
    assert_eq!(bad.code, Some(2), "{}{}", bad.stdout, bad.stderr);
    Ok(())
}
