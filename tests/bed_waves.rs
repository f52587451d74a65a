//! Bed for waves (issue 24 item 3, decision 0315): real meshd and mesh-host processes. A waved
//! `push --behind` sends one wave at a time, each target with its cascade (G1), waits for each
//! wave's modules, stops at the first wave with a failing module and says how to continue; the
//! machines of later waves are not sent, and after the model is fixed a plain `push --behind`
//! sends exactly them (and the fixed machine).

use std::time::Instant;

use mesh_beds::{Bed, binaries};
use serde_json::Value;

const waves: &str = include_str!("../beds/meshes/waves.toml");

fn last_sequence(status: &Value, machine: &str) -> Option<u64> {
    Bed::machine(status, machine)?["last_send"]["sequence"].as_u64()
}

#[test]
fn a_waved_push_stops_at_the_failed_wave_and_push_behind_continues_from_there() -> anyhow::Result<()>
{
    let started = Instant::now();
    let bed = Bed::start(binaries!(), 3, waves)?;
    bed.leader_other_than(None)?;
    bed.apply(waves, "first model")?;

    // plan --wave shows the waves without sending: novox goes with ace (ace consumes a token its db provides: the mint changes both),
    // so wave 3 has nothing left of its own.
    let plan = bed.meshctl_ok(&["plan", "--behind", "--wave", "1"])?.stdout;
    for want in [
        "wave 1/4: 1 machine: ace\n",
        "would send ace",
        "would send novox",
        "(cascaded from ace",
        "wave 2/4: 1 machine: g14\n",
        "wave 3/4: 1 machine: novox\n",
        "would skip novox   (already sent by an earlier wave's cascade)",
        "wave 4/4: 1 machine: shanks\n",
    ] {
        assert!(plan.contains(want), "{want:?} missing from:\n{plan}");
    }
    let status = bed.status()?;
    assert_eq!(last_sequence(&status, "ace"), None, "plan sent: {status}");

    // ace goes alone first (the canary, the first in plan order), then waves of one machine.
    // Wave 2 (g14) fails: its module exits 3 at once. The push stops there, exits 4, names the
    // wave and the machine, and says how to continue; shanks (wave 4) is never sent.
    let run = bed.meshctl(&[
        "push",
        "--behind",
        "--canary",
        "--wave",
        "1",
        "--why",
        "rollout",
        "--wait=20s",
    ])?;
    let out = format!("{}{}", run.stdout, run.stderr);
    assert_eq!(run.code, Some(4), "{out}");
    for want in [
        "wave 1/4 done: 2 applied, 2 ready, 1 of them by cascade\n",
        "wave 2/4 FAILED: 1 applied, 1 failing\n",
        "g14     FAILING",
        "stopped at wave 2/4: g14 failed; not sent: shanks\n",
        "then `meshctl push --behind --wave 1 --why ...` sends the machines not sent yet",
    ] {
        assert!(out.contains(want), "{want:?} missing from:\n{out}");
    }
    assert!(
        !out.contains("wave 3/4"),
        "a wave after the failed one began:\n{out}"
    );
    let status = bed.status()?;
    for sent in ["ace", "g14", "novox"] {
        assert!(
            last_sequence(&status, sent).is_some(),
            "{sent} not sent: {status}"
        );
    }
    assert_eq!(
        last_sequence(&status, "shanks"),
        None,
        "shanks sent: {status}"
    );
    let shanks = Bed::machine(&status, "shanks").cloned().unwrap_or_default();
    assert_eq!(shanks["behind"], true, "{status}");
    let history = bed.meshctl_ok(&["history", "--json"])?.json()?;
    let items = history["answer"]["items"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let sent_to = |m: &str| {
        items
            .iter()
            .any(|i| i["kind"] == "send" && i["machine"] == m)
    };
    assert!(sent_to("g14") && !sent_to("shanks"), "history: {history}");

    // Fix the model (crash now stays up), apply; a plain `push --behind` continues: g14 (behind
    // again, its declaration changed) and shanks (never sent); ace and novox are not sent again.
    let fixed = waves.replace(
        r#"args = ["-c", "exit 3"]"#,
        r#"args = ["-c", "sleep 600"]"#,
    );
    bed.apply(&fixed, "crash fixed")?;
    let before = bed.status()?;
    let run = bed.meshctl(&["push", "--behind", "--why", "continue", "--wait=20s"])?;
    assert_eq!(run.code, Some(0), "{}{}", run.stdout, run.stderr);
    assert!(
        run.stdout.contains("pushed 2 machines: 2 applied"),
        "{}",
        run.stdout
    );
    let after = bed.status()?;
    for same in ["ace", "novox"] {
        assert_eq!(
            last_sequence(&before, same),
            last_sequence(&after, same),
            "{same} sent again"
        );
    }
    assert!(last_sequence(&after, "shanks").is_some(), "{after}");
    bed.wait_none_behind(4)?;
    bed.no_replica_panicked()?;
    eprintln!("bed_waves took {} ms", started.elapsed().as_millis());
    Ok(())
}
