//! Bed for a leader stopped on purpose (issue 12 part 2, decisions 0152 and 0225), with real
//! processes: SIGTERM of the leader hands its leadership to an up-to-date follower before the
//! process exits, the old leader says so in its log, and the new leader sends at once.

use mesh::host::state::StateFiles;
use mesh_beds::{Bed, binaries, wait_ms_default};

const pair: &str = include_str!("../beds/meshes/pair.toml");

/// How long a SIGTERMed leader may take to hand over and exit.
const exit_ms: u64 = 10_000;

#[test]
fn sigterm_of_the_leader_hands_over_before_it_exits_and_the_named_replica_leads_and_sends()
-> anyhow::Result<()> {
    let mut bed = Bed::start(binaries!(), 3, pair)?;
    let old = bed.leader_other_than(None)?;
    bed.apply(pair, "first model")?;
    bed.meshctl_ok(&["push", "--all", "--why", "first send"])?;
    let host = StateFiles::new(&bed.host_root("ace"));
    let old_epoch = host
        .load_applied()?
        .map(|a| a.position.epoch)
        .ok_or_else(|| anyhow::anyhow!("ace applied nothing"))?;
    let logged: Vec<usize> = (1..=3).map(|id| bed.replica_log(id).len()).collect();
    let after = |bed: &Bed, id: u64| -> String {
        let log = bed.replica_log(id);
        log.get(logged[(id - 1) as usize]..)
            .unwrap_or_default()
            .to_string()
    };

    bed.terminate_replica(old)?;
    let status = bed.reap_replica(old, exit_ms)?;
    assert!(status.success(), "replica {old} exited with {status}");

    // The old leader said, before it exited, whom it handed over to.
    let said = after(&bed, old);
    let taker = said
        .lines()
        .find(|l| l.contains("stopping: leadership handed over to "))
        .and_then(|l| l.split("handed over to ").nth(1))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|n| n.parse::<u64>().ok())
        .ok_or_else(|| {
            anyhow::anyhow!("replica {old} did not log a handover after SIGTERM:\n{said}")
        })?;
    assert_ne!(taker, old);
    let stopped = said.find("replica stopped");
    let handed = said.find("stopping: leadership handed over to");
    assert!(
        handed < stopped && stopped.is_some(),
        "the handover comes before the stop:\n{said}"
    );
    // The replica it named campaigned because it was told to, not after an election timeout.
    let taken = after(&bed, taker);
    assert!(
        taken.contains(&format!(
            "campaigning now: replica {old} hands its leadership over"
        )),
        "replica {taker} was not told to campaign:\n{taken}"
    );
    assert_eq!(bed.leader_other_than(Some(old))?, taker);

    // The new leader sends: a push through the bed's context (the survivors) is applied by the
    // host at an epoch above the old leader's.
    let run = bed.meshctl_ok(&["push", "ace", "--why", "after the handover"])?;
    assert!(run.stdout.contains("applied"), "{}", run.stdout);
    let epoch = bed.wait_for(
        "ace applies the new leader's epoch",
        wait_ms_default,
        || {
            Ok(host
                .load_applied()?
                .map(|a| a.position.epoch)
                .filter(|e| *e > old_epoch))
        },
    )?;
    assert!(
        epoch > old_epoch,
        "applied {epoch}, old leader's {old_epoch}"
    );
    Ok(())
}
