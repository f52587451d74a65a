//! Bed for recovery from quorum loss (issue 12 part 5, decision 0235) with real processes: three
//! replicas and two hosts, a push; two replicas SIGKILLed and the third stopped; `meshd recover`
//! (a dry run that changes nothing, then `--force-new-cluster`) on the survivor; started again it
//! leads alone in a term above every epoch used, keeps its data, and a push reaches every host,
//! none refusing the new epoch. The survivor, taking office, retired the two left out (decision
//! 0294): both then start on their old stores, a quorum of the old membership, and pushes through
//! them change no host (issue 27 (b)). Last, a new replica (id 4, `meshctl init --add-replica`)
//! joins the recovered cluster, the retired id being refused, and a push goes through the
//! two-member cluster.

use mesh::host::state::StateFiles;
use mesh_beds::{Bed, binaries, wait_ms_default};
use serde_json::Value;

const pair: &str = include_str!("../beds/meshes/pair.toml");
const machines: [&str; 2] = ["ace", "g14"];

/// `(epoch, sequence)` the machine last reported applying.
fn last_report(status: &Value, machine: &str) -> Option<(u64, u64)> {
    let report = &Bed::machine(status, machine)?["last_report"];
    Some((report["epoch"].as_u64()?, report["sequence"].as_u64()?))
}

/// The epoch of the envelope each host holds as applied, from its own state files.
fn applied_epochs(bed: &Bed) -> anyhow::Result<Vec<(String, u64)>> {
    let mut out = Vec::new();
    for machine in machines {
        let files = StateFiles::new(&bed.host_root(machine));
        let applied = files
            .load_applied()?
            .ok_or_else(|| anyhow::anyhow!("{machine} applied nothing"))?;
        out.push((machine.to_string(), applied.position.epoch));
    }
    Ok(out)
}

/// Runs meshctl with `context` and fails unless it exits 0.
fn ok(bed: &Bed, context: &std::path::Path, args: &[&str]) -> anyhow::Result<()> {
    let run = bed.meshctl_in(context, args)?;
    anyhow::ensure!(
        run.code == Some(0),
        "meshctl {args:?}: {}{}",
        run.stdout,
        run.stderr
    );
    Ok(())
}

fn meshd(bed: &Bed, args: &[&str]) -> anyhow::Result<std::process::Output> {
    Ok(std::process::Command::new(env!("CARGO_BIN_EXE_meshd"))
        .args(args)
        .current_dir(&bed.dir)
        .output()?)
}

/// The first term `meshd recover` printed (`first term N`).
fn first_term(out: &str) -> Option<u64> {
    let at = out.find("first term ")? + "first term ".len();
    out[at..]
        .split(|c: char| !c.is_ascii_digit())
        .next()?
        .parse()
        .ok()
}

#[test]
fn g9_a_survivor_of_quorum_loss_recovers_alone_above_every_epoch_and_the_old_members_stay_out()
-> anyhow::Result<()> {
    let mut bed = Bed::start(binaries!(), 3, pair)?;
    let run = recover_after_losing_two(&mut bed);
    run.map_err(|e| {
        let tails: Vec<String> = (1..=3)
            .map(|id| {
                let log = bed.replica_log(id);
                let lines: Vec<&str> = log.lines().collect();
                let from = lines.len().saturating_sub(20);
                format!("--- replica {id}:\n{}", lines[from..].join("\n"))
            })
            .collect();
        e.context(tails.join("\n"))
    })
}

fn recover_after_losing_two(bed: &mut Bed) -> anyhow::Result<()> {
    let leader = bed.leader_other_than(None)?;
    bed.apply(pair, "first model")?;
    bed.meshctl_ok(&["push", "--all", "--why", "first send"])?;
    let old_epoch = bed.wait_for("both hosts report the first send", wait_ms_default, || {
        let status = bed.status()?;
        let epochs: Vec<u64> = machines
            .iter()
            .filter_map(|m| last_report(&status, m).map(|(e, _)| e))
            .collect();
        Ok((epochs.len() == machines.len()).then(|| epochs.into_iter().max().unwrap_or(0)))
    })?;

    // A follower survives: its vote is for the dead leader, its term the hosts' epoch.
    let survivor = (1..=3).find(|id| *id != leader).unwrap_or(1);
    let lost: Vec<u64> = (1..=3).filter(|id| *id != survivor).collect();
    for id in &lost {
        bed.kill_replica(*id)?;
    }
    // Alone, the survivor campaigns and loses: its vote climbs above every epoch hosts saw, and
    // that is the floor recover must go above.
    let alone = bed.context_for(survivor)?;
    let campaigned = bed.wait_for("the survivor campaigns alone", wait_ms_default, || {
        let doc = bed.meshctl_in(&alone, &["status", "--json"])?.json()?;
        Ok(doc["answer"]["replicas"].as_array().and_then(|rows| {
            rows.iter()
                .find(|r| r["id"].as_u64() == Some(survivor))
                .and_then(|r| r["epoch"].as_u64())
                .filter(|e| *e > old_epoch + 1)
        }))
    })?;
    bed.kill_replica(survivor)?;
    let config = bed.dir.join(format!("replica-{survivor}.toml"));
    let config = config.display().to_string();
    // Without --force-new-cluster: says what it would do and changes nothing (run twice, the
    // store still has its three voters and its log).
    let dry_run = || -> anyhow::Result<String> {
        let dry = meshd(bed, &["recover", "--config", &config])?;
        let out = String::from_utf8_lossy(&dry.stdout).into_owned();
        anyhow::ensure!(
            dry.status.success() && out.contains("nothing changed"),
            "dry run: {out}{}",
            String::from_utf8_lossy(&dry.stderr)
        );
        Ok(out)
    };
    let dry = dry_run()?;
    anyhow::ensure!(dry.contains("voters before [1, 2, 3]"), "dry run: {dry}");
    anyhow::ensure!(dry_run()? == dry, "a dry run changed the store");
    anyhow::ensure!(
        first_term(&dry).is_some_and(|t| t > campaigned),
        "the dry run's first term is not above the survivor's vote {campaigned}: {dry}"
    );

    let done = meshd(
        bed,
        &["recover", "--config", &config, "--force-new-cluster"],
    )?;
    let out = String::from_utf8_lossy(&done.stdout).into_owned();
    let err = String::from_utf8_lossy(&done.stderr).into_owned();
    anyhow::ensure!(done.status.success(), "meshd recover: {out}{err}");
    anyhow::ensure!(err.contains("CLUSTER RECOVERED"), "no loud log line: {err}");
    println!("meshd recover --force-new-cluster:\n{out}{err}");
    let term = first_term(&out).ok_or_else(|| anyhow::anyhow!("no first term in {out}"))?;
    anyhow::ensure!(
        term > old_epoch,
        "first term {term} not above the hosts' epoch {old_epoch}: {out}"
    );
    // A second run is refused and changes nothing.
    let again = meshd(
        bed,
        &["recover", "--config", &config, "--force-new-cluster"],
    )?;
    anyhow::ensure!(
        !again.status.success(),
        "a second recover went through: {}",
        String::from_utf8_lossy(&again.stdout)
    );

    bed.restart_replica(survivor)?;
    let status = bed.wait_for("the survivor leads", wait_ms_default, || {
        let status = bed.status()?;
        Ok((status["leader"].as_u64() == Some(survivor)).then_some(status))
    })?;
    // Its store was not reset: recover keeps the floor file the store reached.
    anyhow::ensure!(
        status["store_reset"].is_null(),
        "the recovered replica says its store was reset: {}",
        status["store_reset"]
    );
    let row = status["replicas"]
        .as_array()
        .and_then(|r| r.iter().find(|r| r["id"].as_u64() == Some(survivor)))
        .cloned()
        .unwrap_or_default();
    anyhow::ensure!(
        row["epoch"].as_u64() == Some(term),
        "the survivor leads in {} and recover said {term}: {row}",
        row["epoch"]
    );

    // Its data is all there, and a push reaches every host: none refuses the new epoch.
    bed.meshctl_ok(&[
        "settings",
        "set",
        "mesh",
        "region=after-recovery",
        "--why",
        "first write of the recovered cluster",
    ])?;
    bed.meshctl_ok(&["push", "--all", "--why", "recovered"])?;
    let status = bed.wait_for("both hosts report the new epoch", wait_ms_default, || {
        let status = bed.status()?;
        let all = machines
            .iter()
            .all(|m| last_report(&status, m).is_some_and(|(e, _)| e == term));
        Ok(all.then_some(status))
    })?;
    anyhow::ensure!(
        machines
            .iter()
            .all(|m| last_report(&status, m).is_some_and(|(e, _)| e == term)),
        "a host reports another epoch than {term}"
    );
    for machine in machines {
        let log = bed.read(&bed.dir.join("logs").join(format!("host-{machine}.log")));
        anyhow::ensure!(
            !log.contains("envelope refused"),
            "{machine} refused an envelope: {log}"
        );
    }
    for (machine, epoch) in applied_epochs(bed)? {
        anyhow::ensure!(
            epoch == term && epoch > old_epoch,
            "{machine} applied epoch {epoch}: not the recovered {term} above the old {old_epoch}"
        );
    }

    // Both lost replicas start on their old stores (issue 27 (b)): together they are a quorum of
    // the old membership and can elect one of themselves. The survivor, on taking office,
    // retired them (decision 0294) and its push carried that to every host: the survivor refuses
    // their certificates at the handshake, and no host applies anything from them.
    let log_before = bed.replica_log(survivor).len();
    let new_context = bed.context_for(survivor)?;
    for old in &lost {
        bed.restart_replica(*old)?;
    }
    let old = lost[0];
    bed.wait_for(
        "the survivor refuses the old members' certificates",
        wait_ms_default,
        || {
            let log = bed.replica_log(survivor);
            let tail = log.get(log_before..).unwrap_or_default();
            Ok((tail.contains(&format!("certificate replica:{old}"))
                && tail.contains("its principal is revoked"))
            .then_some(()))
        },
    )?;
    let old_context = bed.context_for(old)?;
    for attempt in 0..3 {
        let old_push = bed.meshctl_in(
            &old_context,
            &[
                "push",
                "--all",
                "--why",
                &format!("old cluster, try {attempt}"),
            ],
        )?;
        println!(
            "push through the old members, try {attempt}:\n{}{}",
            old_push.stdout, old_push.stderr
        );
        anyhow::ensure!(
            old_push.code != Some(0),
            "a push through the old members went through: {}{}",
            old_push.stdout,
            old_push.stderr
        );
        // What meshctl says through them: the hosts refuse them as left out by a recovery.
        anyhow::ensure!(
            old_push.stdout.contains("left out by a recovery")
                || old_push.stderr.contains("left out by a recovery"),
            "a push through the old members does not say their cluster was replaced: {}{}",
            old_push.stdout,
            old_push.stderr
        );
        for (machine, epoch) in applied_epochs(bed)? {
            anyhow::ensure!(
                epoch == term,
                "{machine} applied epoch {epoch} after the old members started, not the recovered {term}"
            );
        }
    }
    // The survivor still leads in its term, and its push still goes through.
    let status = bed
        .meshctl_in(&new_context, &["status", "--json"])?
        .json()?;
    let status = &status["answer"];
    anyhow::ensure!(
        status["leader"].as_u64() == Some(survivor),
        "the survivor lost its leadership: {}",
        status["replicas"]
    );
    ok(
        bed,
        &new_context,
        &[
            "settings",
            "set",
            "mesh",
            "region=still-recovered",
            "--why",
            "after the old member came back",
        ],
    )?;
    ok(
        bed,
        &new_context,
        &["push", "--all", "--why", "recovered again"],
    )?;
    for (machine, epoch) in applied_epochs(bed)? {
        anyhow::ensure!(epoch == term, "{machine} applied epoch {epoch}, not {term}");
    }

    // The way back: the retired ids stay retired; a lost machine comes back as a new replica
    // (`meshctl init --add-replica` from the same CA, decision 0230's `replicas add`).
    for old in &lost {
        bed.kill_replica(*old)?;
    }
    let back = 4;
    let port = mesh::cli::procs::free_ports(1)?[0];
    let dir = bed.dir.display().to_string();
    bed.meshctl_ok(&[
        "init",
        "--dir",
        &dir,
        "--add-replica",
        &format!("{back}={port}"),
    ])?;
    bed.start_replica(back)?;
    bed.layout.replicas.push((back, port));
    let addr = port.to_string();
    let id = back.to_string();
    let retired = bed.meshctl_in(
        &new_context,
        &[
            "replicas",
            "add",
            "--id",
            &lost[0].to_string(),
            "--addr",
            &addr,
            "--dir",
            &dir,
        ],
    )?;
    anyhow::ensure!(
        retired.code != Some(0) && retired.stderr.contains("retired"),
        "a retired id was added back: {}{}",
        retired.stdout,
        retired.stderr
    );
    bed.wait_for("the new replica is added", wait_ms_default, || {
        let run = bed.meshctl_in(
            &new_context,
            &[
                "replicas", "add", "--id", &id, "--addr", &addr, "--dir", &dir,
            ],
        )?;
        Ok((run.code == Some(0)).then_some(run.stdout))
    })?;
    ok(
        bed,
        &new_context,
        &[
            "settings",
            "set",
            "mesh",
            "region=two-again",
            "--why",
            "with a replica added back",
        ],
    )?;
    ok(
        bed,
        &new_context,
        &["push", "--all", "--why", "two members"],
    )?;
    let status = bed
        .meshctl_in(&new_context, &["status", "--json"])?
        .json()?;
    let rows = status["answer"]["replicas"].clone();
    let level = rows.as_array().is_some_and(|rows| {
        [survivor, back].iter().all(|id| {
            rows.iter().any(|r| {
                r["id"].as_u64() == Some(*id)
                    && r["reachable"] == true
                    && r["epoch"].as_u64() >= Some(term)
            })
        })
    });
    anyhow::ensure!(
        level,
        "not both members at the recovered term or above: {rows}"
    );
    for (machine, epoch) in applied_epochs(bed)? {
        anyhow::ensure!(
            epoch >= term,
            "{machine} applied epoch {epoch}, below {term}"
        );
    }
    Ok(())
}
