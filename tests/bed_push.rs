//! Beds for pushing through real meshd and mesh-host processes: G1 one push is enough, G13 any
//! replica will do, G7 a bare push is refused and a leader change alone shows no diff.

use mesh_beds::{Bed, binaries, wait_ms_default};

const pair: &str = include_str!("../beds/meshes/pair.toml");
const consumer: &str = include_str!("../beds/meshes/consumer.toml");

fn started(mesh: &str) -> anyhow::Result<(Bed, u64)> {
    let bed = Bed::start(binaries!(), 3, mesh)?;
    let leader = bed.leader_other_than(None)?;
    Ok((bed, leader))
}

#[test]
fn g1_one_push_of_the_consumer_sends_the_providers_grant_too() -> anyhow::Result<()> {
    // G1: push only the consumer's machine; the provider's machine is cascaded in the same push,
    // named in the output, and its host applies the grant. No second push anywhere.
    let (bed, _) = started(consumer)?;
    bed.apply(consumer, "register app as a consumer of db")?;
    let run = bed.meshctl(&["push", "g14", "--why", "app needs sql"])?;
    assert_eq!(run.code, Some(0), "{}{}", run.stdout, run.stderr);
    let ace_line = run
        .stdout
        .lines()
        .find(|l| l.starts_with("ace"))
        .unwrap_or_default();
    assert!(ace_line.contains("cascaded from g14"), "{}", run.stdout);
    let grants = bed.grants_file("ace", "db");
    let text = bed.wait_for("db's grants file on ace", wait_ms_default, || {
        let text = bed.read(&grants);
        Ok(text.contains("app@g14").then_some(text))
    })?;
    assert!(text.contains("secret_blake3"), "{text}");
    Ok(())
}

#[test]
fn g13_push_to_a_follower_is_forwarded_and_says_so() -> anyhow::Result<()> {
    // G13: meshctl may talk to any replica; a follower forwards to the leader and says so.
    let (bed, leader) = started(pair)?;
    bed.apply(pair, "first model")?;
    let follower = bed
        .layout
        .replicas
        .iter()
        .find(|(id, _)| *id != leader)
        .map(|(id, addr)| (*id, *addr))
        .ok_or_else(|| anyhow::anyhow!("no follower"))?;
    let ctx = bed.context_for(follower.0)?;
    let run = bed.meshctl_in(&ctx, &["push", "ace", "--why", "through a follower"])?;
    assert_eq!(run.code, Some(0), "{}{}", run.stdout, run.stderr);
    assert!(
        run.stdout
            .contains(&format!("(forwarded by replica {})", follower.0)),
        "{}",
        run.stdout
    );
    Ok(())
}

#[test]
fn g7_bare_push_is_refused_and_a_leader_change_alone_shows_no_diff() -> anyhow::Result<()> {
    // G7: a bare push is refused (exit 2, nothing sent); plan --diff composes with the epoch last
    // sent, so after a leader change alone it is empty.
    let (mut bed, leader) = started(pair)?;
    bed.apply(pair, "first model")?;
    let before = bed.meshctl_ok(&["history", "--json"])?.json()?;
    let bare = bed.meshctl(&["push", "--why", "everything"])?;
    assert_eq!(bare.code, Some(2));
    assert!(bare.one_line_error(), "{}", bare.stderr);
    assert_eq!(
        bed.meshctl_ok(&["history", "--json"])?.json()?["answer"],
        before["answer"]
    );
    bed.meshctl_ok(&["push", "--all", "--why", "first send"])?;
    bed.kill_replica(leader)?;
    let new_leader = bed.leader_other_than(Some(leader))?;
    assert_ne!(new_leader, leader);
    for machine in ["ace", "g14"] {
        let plan = bed
            .meshctl_ok(&["plan", machine, "--diff", "--json"])?
            .json()?;
        let machines = plan["answer"]["machines"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        assert_eq!(
            machines.len(),
            1,
            "{machine}: only the named machine: {plan}"
        );
        assert_eq!(
            machines[0]["changes"],
            serde_json::json!([]),
            "{machine}: {plan}"
        );
    }
    Ok(())
}
