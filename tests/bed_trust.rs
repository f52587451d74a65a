//! Bed for issue 27 with real `meshd`, `mesh-host` and `meshctl` processes (decisions 0294, 0295),
//! one bed for three stories to keep CI short: (c) a viewer certificate reads everything and
//! changes nothing; (a) `replicas remove` retires the replica: through it,
//! a push exits non-zero, no host applies anything and no module's logs can be read; (e) a host
//! whose mark on disk claims an epoch nothing signed fails its own line while `push --all` applies
//! every other machine, and `status` names it, with no term moved; (d) a host replaying its
//! genuine proof with another digest moves no term.

use mesh::core::envelope::Position;
use mesh::host::state::StateFiles;
use mesh_beds::{Bed, binaries, wait_ms_default};

const pair: &str = include_str!("../beds/meshes/pair.toml");
const machines: [&str; 2] = ["ace", "g14"];

/// What each host holds as applied, from its own state files.
fn applied(bed: &Bed) -> anyhow::Result<Vec<(String, Position)>> {
    let mut out = Vec::new();
    for machine in machines {
        let record = StateFiles::new(&bed.host_root(machine))
            .load_applied()?
            .ok_or_else(|| anyhow::anyhow!("{machine} applied nothing"))?;
        out.push((machine.to_string(), record.position));
    }
    Ok(out)
}

/// The term the leader's row of `status` shows.
fn leader_term(bed: &Bed) -> anyhow::Result<u64> {
    let status = bed.status()?;
    status["replicas"]
        .as_array()
        .and_then(|rows| rows.iter().find(|r| r["leader"] == true))
        .and_then(|r| r["epoch"].as_u64())
        .ok_or_else(|| anyhow::anyhow!("no leader in {status}"))
}

/// The line of `machine` in a push's or status's text.
fn line_of<'a>(text: &'a str, machine: &str) -> &'a str {
    text.lines()
        .find(|l| l.trim_start().starts_with(machine))
        .unwrap_or_default()
}

#[test]
fn g2_g9_a_removed_replica_acts_on_no_host_and_one_hosts_unproven_mark_fails_only_its_line()
-> anyhow::Result<()> {
    let mut bed = Bed::start(binaries!(), 3, pair)?;
    let run = trust_story(&mut bed);
    run.map_err(|e| e.context(bed.log_tails(3)))
}

/// How many history items the store holds, and its model revision.
fn written(bed: &Bed) -> anyhow::Result<(u64, u64)> {
    let history = bed.meshctl_ok(&["history", "--json"])?.json()?;
    let items = history["answer"]["items"]
        .as_array()
        .map_or(0, |i| i.len() as u64);
    let revision = bed.status()?["revision"].as_u64().unwrap_or(0);
    Ok((items, revision))
}

fn viewer_reads_and_changes_nothing(bed: &Bed, leader: u64) -> anyhow::Result<()> {
    let dir = bed.dir.display().to_string();
    bed.meshctl_ok(&[
        "certs",
        "issue",
        "operator:watcher",
        "--role",
        "viewer",
        "--dir",
        &dir,
    ])?;
    let watcher = bed.dir.join("context-watcher.toml");
    let reads: [&[&str]; 7] = [
        &["status"],
        &["history"],
        &["plan", "ace"],
        &["settings", "show", "mesh"],
        &["logs", "ace", "--lines", "1"],
        &["certs", "list"],
        &["replicas", "list"],
    ];
    for args in reads {
        let run = bed.meshctl_in(&watcher, args)?;
        anyhow::ensure!(
            run.code == Some(0),
            "a viewer could not {args:?}: {}{}",
            run.stdout,
            run.stderr
        );
    }
    let before = written(bed)?;
    let model = bed.dir.join("apply.toml").display().to_string();
    let follower = (1..=3).find(|id| *id != leader).unwrap_or(1).to_string();
    let backup = bed.dir.join("viewer.snap").display().to_string();
    let writes: [&[&str]; 6] = [
        &[
            "settings",
            "set",
            "mesh",
            "region=viewer",
            "--why",
            "a viewer's write",
        ],
        &["apply", "-f", &model, "--why", "a viewer's apply"],
        &["push", "--all", "--why", "a viewer's push"],
        &[
            "certs",
            "revoke",
            "host:g14",
            "--why",
            "a viewer's revocation",
        ],
        &["replicas", "remove", &follower],
        &["snapshot", "save", &backup],
    ];
    for args in writes {
        let run = bed.meshctl_in(&watcher, args)?;
        anyhow::ensure!(
            run.code == Some(1) && run.stderr.contains("viewer"),
            "a viewer's {args:?} was not refused by its role (exit {:?}): {}{}",
            run.code,
            run.stdout,
            run.stderr
        );
    }
    anyhow::ensure!(
        written(bed)? == before,
        "a viewer's refused request changed the store"
    );
    Ok(())
}

/// Sends ace's own report, its genuine proof beside another digest, with ace's certificate to
/// every replica, as a host replaying its proof would; the leader's term and floor stay.
fn host_replays_its_proof_with_another_digest(bed: &Bed) -> anyhow::Result<()> {
    use mesh::core::declaration::Digest;
    use mesh::core::report::Report;
    use mesh::core::wire::{ReportReply, report_reply_what, report_what};
    use mesh_transport::{Endpoint, Identity, MessageKind, TransportConfig};
    let record = StateFiles::new(&bed.host_root("ace"))
        .load_applied()?
        .ok_or_else(|| anyhow::anyhow!("ace applied nothing"))?;
    let proof = record
        .proof
        .ok_or_else(|| anyhow::anyhow!("ace keeps no proof"))?;
    let term = leader_term(bed)?;
    let floor = bed.status()?["epoch_floor"].as_u64().unwrap_or(0);
    anyhow::ensure!(
        proof.header.epoch == term,
        "ace holds {:?}, the term is {term}",
        proof.header
    );
    let replayed = Report {
        machine: "ace".into(),
        epoch: proof.header.epoch,
        sequence: proof.header.sequence,
        report_sequence: 1 << 40,
        applied: Some(Digest([0xab; 32])),
        modules: vec![],
        refused_older: 0,
        last_refusal: None,
        proof: Some(proof),
    };
    let identity = Identity::load(
        &bed.dir.join("ca.pem"),
        &bed.dir.join("host-ace").join("cert.pem"),
        &bed.dir.join("host-ace").join("key.pem"),
    )?;
    let config = TransportConfig::default()
        .check()
        .map_err(|e| anyhow::anyhow!("transport config: {e}"))?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let mut filed = 0;
    runtime.block_on(async {
        let endpoint = Endpoint::bind("127.0.0.1:0".parse()?, &identity, config)?;
        for (_, addr) in &bed.layout.replicas {
            let body = mesh_codec::encode(report_what, &replayed)?;
            let kind = MessageKind::Report {
                machine: "ace".into(),
            };
            let answer = endpoint
                .request(*addr, kind, body, std::time::Duration::from_secs(5))
                .await;
            if let Ok(bytes) = answer
                && let Ok(ReportReply::Filed { .. }) =
                    mesh_codec::decode::<ReportReply>(report_reply_what, &bytes)
            {
                filed += 1;
            }
        }
        anyhow::Ok(())
    })?;
    anyhow::ensure!(
        filed == 1,
        "the leader did not take the replayed report ({filed} filed)"
    );
    anyhow::ensure!(
        leader_term(bed)? == term,
        "the leader left its term on a replayed proof"
    );
    let floor_after = bed.status()?["epoch_floor"].as_u64().unwrap_or(0);
    anyhow::ensure!(
        floor_after == floor,
        "the floor moved from {floor} to {floor_after}"
    );
    Ok(())
}

fn trust_story(bed: &mut Bed) -> anyhow::Result<()> {
    let leader = bed.leader_other_than(None)?;
    bed.apply(pair, "first model")?;
    bed.meshctl_ok(&["push", "--all", "--why", "first send"])?;
    bed.wait_for("both hosts applied", wait_ms_default, || {
        Ok((applied(bed).map(|a| a.len()).unwrap_or(0) == machines.len()).then_some(()))
    })?;

    // (c) A viewer certificate, issued by `certs issue`, reads everything and changes nothing.
    viewer_reads_and_changes_nothing(bed, leader)?;

    // (a) A follower removed: retired in the same commit, the retirement pushed to both hosts.
    let gone = (1..=3).find(|id| *id != leader).unwrap_or(1);
    let removed = bed.meshctl_ok(&["replicas", "remove", &gone.to_string()])?;
    println!("replicas remove {gone}:\n{}", removed.stdout);
    anyhow::ensure!(
        removed.stdout.contains(&format!("replica {gone} retired"))
            && removed.stdout.contains("2 of 2 machines applied it"),
        "replicas remove: {}",
        removed.stdout
    );
    // The trust record shows it, and history says who retired it and why (asked of the leader:
    // the removed replica still runs, first in the bed's context, and knows no leader now).
    let through_leader = bed.context_for(leader)?;
    let list = bed
        .meshctl_in(&through_leader, &["replicas", "list"])?
        .stdout;
    anyhow::ensure!(
        list.contains(&format!("retired replica {gone}  by operator:bed")),
        "replicas list does not show the retirement: {list}"
    );
    let history = bed.meshctl_in(&through_leader, &["history"])?.stdout;
    anyhow::ensure!(
        history.contains(&format!(
            "replica {gone} retired (its key and certificate)  by operator:bed"
        )),
        "history does not show the retirement: {history}"
    );
    let before = applied(bed)?;
    let through_gone = bed.context_for(gone)?;
    let push = bed.meshctl_in(&through_gone, &["push", "--all", "--why", "removed"])?;
    anyhow::ensure!(
        push.code != Some(0),
        "a push through the removed replica exited 0: {}{}",
        push.stdout,
        push.stderr
    );
    let logs = bed.meshctl_in(&through_gone, &["logs", "ace", "--lines", "1"])?;
    anyhow::ensure!(
        logs.code != Some(0),
        "the removed replica read ace's logs: {}{}",
        logs.stdout,
        logs.stderr
    );
    anyhow::ensure!(
        applied(bed)? == before,
        "a host applied something after the removal"
    );
    // Stopped, and out of the bed's context.
    bed.kill_replica(gone)?;

    // (d) ace replays its genuine proof beside another digest: no term moves.
    host_replays_its_proof_with_another_digest(bed)?;

    // (e) g14's mark claims an epoch nothing signed (edited on its disk).
    let term_before = leader_term(bed)?;
    bed.stop_host("g14")?;
    StateFiles::new(&bed.host_root("g14")).store_high_water(Position {
        epoch: 1_000_000,
        sequence: 1,
    })?;
    bed.start_host("g14")?;
    bed.meshctl_ok(&[
        "settings",
        "set",
        "mesh",
        "region=after-the-edit",
        "--why",
        "a change for both machines",
    ])?;
    let push = bed.meshctl(&["push", "--all", "--why", "with one bad mark"])?;
    println!(
        "push --all with g14's mark edited:\n{}{}",
        push.stdout, push.stderr
    );
    anyhow::ensure!(
        push.code == Some(1),
        "push --all with one failed line exited {:?}: {}{}",
        push.code,
        push.stdout,
        push.stderr
    );
    anyhow::ensure!(
        line_of(&push.stdout, "ace").contains("applied"),
        "ace was not applied: {}",
        push.stdout
    );
    anyhow::ensure!(
        line_of(&push.stdout, "g14").contains("nothing signed"),
        "g14's line does not say its refusal is unproven: {}",
        push.stdout
    );
    let status = bed.meshctl_ok(&["status"])?;
    anyhow::ensure!(
        status.stdout.contains("UNPROVEN REFUSAL"),
        "status does not name the unproven refusal: {}",
        status.stdout
    );
    let term_after = leader_term(bed)?;
    anyhow::ensure!(
        term_after == term_before,
        "the term moved from {term_before} to {term_after} on one host's word"
    );
    bed.no_replica_panicked()
}
