//! `meshctl bench` against real meshd processes (issue 14): it runs at a tiny load, prints its
//! figures and leaves the settings as it found them; it refuses bad arguments with exit 2 before
//! anything is sent, and refuses to start over keys an interrupted run left until `--clean`.
//! No figure is asserted: these tests check what the bench does, never how fast the cluster is.

use mesh_beds::{Bed, binaries};

const pair: &str = include_str!("../beds/meshes/pair.toml");

fn applied() -> anyhow::Result<Bed> {
    let bed = Bed::start(binaries!(), 3, pair)?;
    bed.leader_other_than(None)?;
    bed.apply(pair, "first model")?;
    Ok(bed)
}

fn settings(bed: &Bed) -> anyhow::Result<serde_json::Value> {
    Ok(bed.meshctl_ok(&["settings", "show", "--json"])?.json()?["answer"].clone())
}

#[test]
fn bench_at_a_tiny_load_prints_its_figures_and_removes_its_keys() -> anyhow::Result<()> {
    // Issue 14: writes through the operator API, prints writes/s, p50, p99, slowest and stddev
    // with etcd's verdict lines, then removes every key it wrote (layers as they were).
    let bed = applied()?;
    let before = settings(&bed)?;
    let run = bed.meshctl(&["bench", "--clients", "2", "--rate", "20", "--duration", "1"])?;
    // 0 passes etcd's rules, 1 misses them: which one depends on the machine, not on the code.
    assert!(
        matches!(run.code, Some(0 | 1)),
        "{}{}",
        run.stdout,
        run.stderr
    );
    for word in ["writes/s", "p50", "p99", "slowest", "stddev", "Throughput"] {
        assert!(run.stdout.contains(word), "no {word} in: {}", run.stdout);
    }
    let ok: u64 = run
        .stdout
        .split_once(" ok, ")
        .and_then(|(head, _)| head.rsplit('(').next())
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or(0);
    assert!(ok > 0, "no write succeeded: {}{}", run.stdout, run.stderr);
    assert!(run.stdout.contains("cleaned up"), "{}", run.stdout);
    assert_eq!(settings(&bed)?, before, "{}", run.stdout);
    Ok(())
}

#[test]
fn bench_refuses_out_of_range_arguments_with_exit_2_before_sending() -> anyhow::Result<()> {
    // Issue 14: everything is bounded; a bound given out of range is bad usage (exit 2), said in
    // one line, and nothing reaches a replica (the settings history does not move).
    let bed = applied()?;
    let history = bed.meshctl_ok(&["history", "--json"])?.json()?["answer"].clone();
    for args in [
        ["bench", "--clients", "0"],
        ["bench", "--clients", "1001"],
        ["bench", "--rate", "0"],
        ["bench", "--rate", "20001"],
        ["bench", "--duration", "0"],
        ["bench", "--duration", "601"],
    ] {
        let run = bed.meshctl(&args)?;
        assert_eq!(run.code, Some(2), "{args:?}: {}{}", run.stdout, run.stderr);
        assert!(run.one_line_error(), "{args:?}: {}", run.stderr);
        assert!(
            run.stderr.contains("out of range"),
            "{args:?}: {}",
            run.stderr
        );
    }
    let unknown = bed.meshctl(&["bench", "--load", "xxl"])?;
    assert_eq!(unknown.code, Some(2), "{}", unknown.stderr);
    assert_eq!(
        bed.meshctl_ok(&["history", "--json"])?.json()?["answer"],
        history
    );
    Ok(())
}

#[test]
fn bench_refuses_to_start_over_keys_an_interrupted_run_left_until_clean() -> anyhow::Result<()> {
    // Issue 14, as etcd's check perf refuses a prefix that holds keys: a leftover bench key is
    // refused with exit 2 and the way out; `bench --clean` removes it and keeps the other keys.
    let bed = applied()?;
    bed.meshctl_ok(&[
        "settings",
        "set",
        "machine/ace",
        "meshctl-bench-7=left",
        "owner=ops",
        "--why",
        "an interrupted bench",
    ])?;
    let run = bed.meshctl(&["bench", "--clients", "1", "--duration", "1"])?;
    assert_eq!(run.code, Some(2), "{}{}", run.stdout, run.stderr);
    assert!(run.stderr.contains("--clean"), "{}", run.stderr);
    bed.meshctl_ok(&["bench", "--clean"])?;
    let layers = settings(&bed)?.to_string();
    assert!(!layers.contains("meshctl-bench-"), "{layers}");
    assert!(layers.contains("owner"), "{layers}");
    Ok(())
}
