//! Bed for revocation through real meshd and mesh-host processes (issue 15 part 5, decision
//! 0172): `meshctl certs revoke` of one host's certificate makes its next report refused at the
//! handshake by every replica, in one line naming the certificate and the way out, and changes
//! nothing else: the other host goes on reporting, the store moves only by the deny list.

use mesh_beds::{Bed, binaries, wait_ms_default};
use serde_json::Value;

const pair: &str = include_str!("../beds/meshes/pair.toml");

fn report_sequence(status: &Value, machine: &str) -> u64 {
    Bed::machine(status, machine)
        .and_then(|m| m["last_report"]["report_sequence"].as_u64())
        .unwrap_or(0)
}

/// How long ago the answering leader last heard `machine`; `None` when it has not since it
/// took office.
fn heard_ago_ms(status: &Value, machine: &str) -> Option<u64> {
    Bed::machine(status, machine).and_then(|m| m["heard_ago_ms"].as_u64())
}

/// Everything of the store `status` shows but the reports: revision, floor and each machine's
/// last send and holds.
fn store_of(status: &Value) -> Value {
    let machines: Vec<Value> = status["machines"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .into_iter()
        .map(|m| serde_json::json!([m["name"], m["last_send"], m["holds"]]))
        .collect();
    serde_json::json!([status["revision"], status["epoch_floor"], machines])
}

/// The serial in one row of `certs list`: its first word of hex digits (the ROLE column before it
/// is `-`, a role, or `admin (unstated)`).
fn serial_in(line: &str) -> Option<String> {
    line.split_whitespace()
        .skip(1)
        .find(|w| w.len() >= 8 && w.chars().all(|c| c.is_ascii_hexdigit()))
        .map(str::to_string)
}

/// The serial `certs list` shows for `principal`, once a replica has seen its handshake.
fn serial_of(bed: &Bed, principal: &str) -> anyhow::Result<String> {
    bed.wait_for(
        &format!("{principal}'s certificate in certs list"),
        wait_ms_default,
        || {
            let run = bed.meshctl_ok(&["certs", "list"])?;
            Ok(run
                .stdout
                .lines()
                .find(|l| l.split_whitespace().next() == Some(principal))
                .and_then(serial_in))
        },
    )
}

#[test]
fn g15_a_revoked_host_has_its_next_report_refused_and_nothing_else_changes() -> anyhow::Result<()> {
    let bed = Bed::start(binaries!(), 3, pair)?;
    bed.leader_other_than(None)?;
    bed.apply(pair, "first model")?;
    bed.meshctl_ok(&["push", "--all", "--why", "first send"])?;
    // Both hosts report (every reconcile interval) before anything is revoked.
    bed.wait_for("both hosts reporting", wait_ms_default, || {
        let s = bed.status()?;
        Ok((report_sequence(&s, "ace") > 0 && report_sequence(&s, "g14") > 0).then_some(()))
    })?;
    let serial = serial_of(&bed, "host:ace")?;
    let history = bed.meshctl_ok(&["history", "--json"])?.json()?["answer"].clone();

    let run = bed.meshctl_ok(&["certs", "revoke", &serial, "--why", "disk stolen"])?;
    assert!(
        run.stdout.contains(&format!("revoked serial {serial}")),
        "{}",
        run.stdout
    );
    let revoked_at = bed.status()?;

    // Its next report is refused at the handshake: one line naming the certificate and the fix.
    let log = bed.dir.join("logs").join("host-ace.log");
    let line = bed.wait_for("ace's report refused", wait_ms_default, || {
        let text = bed.read(&log);
        Ok(text
            .lines()
            .find(|l| l.contains("is revoked (disk stolen)"))
            .map(str::to_string))
    })?;
    assert!(
        line.contains(&format!("host:ace serial {serial}")),
        "{line}"
    );
    assert!(line.contains("meshctl certs renew host:ace"), "{line}");
    // Every replica refused it, each naming the certificate in its log.
    bed.wait_for("every replica refusing ace", wait_ms_default, || {
        Ok(bed
            .layout
            .replicas
            .iter()
            .all(|(id, _)| bed.replica_log(*id).contains("is revoked (disk stolen)"))
            .then_some(()))
    })?;

    // The other host goes on reporting; ace is not heard again and its account does not move.
    // A report that says what the last one said is heard by the leader, not filed (decision
    // 0216), so "reporting" is the leader's last-heard time, not the account's sequence.
    let ace_then = report_sequence(&revoked_at, "ace");
    let refused_at = std::time::Instant::now();
    let (later, asked_after) =
        bed.wait_for("g14 heard after the revocation", wait_ms_default, || {
            let asked_after = refused_at.elapsed().as_millis() as u64;
            let s = bed.status()?;
            let heard_since = heard_ago_ms(&s, "g14").is_some_and(|ago| ago < asked_after);
            Ok(heard_since.then_some((s, asked_after)))
        })?;
    assert!(
        heard_ago_ms(&later, "ace").is_none_or(|ago| ago >= asked_after),
        "ace was heard after its certificate was revoked: {later}"
    );
    assert!(
        report_sequence(&later, "ace") <= ace_then + 1,
        "ace reported after its certificate was revoked: {later}"
    );
    // The store moved by the deny list only: same revision, floor, sends, holds and history,
    // which now also shows the revocation with who and why (issue 27 part 5).
    assert_eq!(store_of(&later), store_of(&revoked_at));
    let after = bed.meshctl_ok(&["history", "--json"])?.json()?["answer"].clone();
    let items = after["items"].as_array().cloned().unwrap_or_default();
    let (revocations, rest): (Vec<Value>, Vec<Value>) =
        items.into_iter().partition(|i| i["kind"] == "revocation");
    assert_eq!(serde_json::json!({ "items": rest }), history);
    assert!(
        revocations.len() == 1
            && revocations[0]["why"] == "disk stolen"
            && revocations[0]["actor"] == "operator:bed",
        "{revocations:?}"
    );
    let list = bed.meshctl_ok(&["certs", "list"])?.stdout;
    assert!(list.contains("deny list (1):"), "{list}");
    assert!(
        list.contains(&format!("serial {serial} — disk stolen")),
        "{list}"
    );

    // Hosts learn the list in their declarations: every machine is behind, the next push carries
    // it to g14 (ace is refused by the replica dialling it), which enforces it from then on.
    let plan = bed.meshctl_ok(&["plan", "g14", "--diff"])?.stdout;
    assert!(plan.contains(&format!("revoked serial:{serial}")), "{plan}");
    let push = bed.meshctl(&["push", "--all", "--why", "carry the deny list"])?;
    let ace_line = push
        .stdout
        .lines()
        .find(|l| l.starts_with("ace"))
        .unwrap_or_default();
    assert!(
        ace_line.contains("is revoked (disk stolen)"),
        "{}{}",
        push.stdout,
        push.stderr
    );
    let g14_log = bed.dir.join("logs").join("host-g14.log");
    bed.wait_for("g14 enforcing the deny list", wait_ms_default, || {
        let text = bed.read(&g14_log);
        Ok(text
            .lines()
            .any(|l| {
                l.contains("deny list from the declaration in force") && l.contains("entries=1")
            })
            .then_some(()))
    })?;
    Ok(())
}

/// The serial `certs list` through replica `id` shows for its own certificate.
fn own_serial(bed: &Bed, id: u64) -> anyhow::Result<String> {
    let run = bed.meshctl_in(&bed.context_for(id)?, &["certs", "list"])?;
    anyhow::ensure!(run.code == Some(0), "certs list: {}", run.stderr);
    run.stdout
        .lines()
        .find(|l| l.contains("(this replica)"))
        .and_then(serial_in)
        .ok_or_else(|| anyhow::anyhow!("no own certificate in {}", run.stdout))
}

#[test]
fn g15_renewed_certificates_are_taken_by_reload_and_sighup_without_dropping_the_cluster()
-> anyhow::Result<()> {
    let bed = Bed::start(binaries!(), 3, pair)?;
    bed.leader_other_than(None)?;
    bed.apply(pair, "first model")?;
    let before = own_serial(&bed, 2)?;

    // Renew replica 2 from the CA key init wrote, then reload every replica.
    let renew = bed.meshctl_ok(&["certs", "renew", "replica:2"])?;
    assert!(
        renew.stdout.starts_with("renewed replica:2: serial "),
        "{}",
        renew.stdout
    );
    let reload = bed.meshctl_ok(&["certs", "reload"])?;
    for id in 1..=3 {
        assert!(
            reload.stdout.contains(&format!("replica {id}: reloaded")),
            "{}",
            reload.stdout
        );
    }
    let after = own_serial(&bed, 2)?;
    assert_ne!(after, before);
    assert!(renew.stdout.contains(&after), "{}", renew.stdout);
    // The cluster carried on: a write commits and is sent.
    bed.meshctl_ok(&["push", "--all", "--why", "after the reload"])?;

    // SIGHUP does the same for replica 3.
    let third = own_serial(&bed, 3)?;
    bed.meshctl_ok(&["certs", "renew", "replica:3"])?;
    bed.signal_replica(3, nix::sys::signal::Signal::SIGHUP)?;
    bed.wait_for(
        "replica 3 serving its renewed certificate",
        wait_ms_default,
        || Ok((own_serial(&bed, 3)? != third).then_some(())),
    )?;
    assert!(bed.replica_log(3).contains("certificates reloaded"));

    // A certificate inside the warning window is named by status, with the way out.
    bed.meshctl_ok(&["certs", "renew", "operator:bed", "--days", "10"])?;
    let status = bed.meshctl_ok(&["status"])?.stdout;
    let warning = status
        .lines()
        .find(|l| l.starts_with("WARNING: certificate operator:bed"))
        .unwrap_or_default();
    assert!(warning.contains("expires at"), "{status}");
    assert!(
        warning.contains("meshctl certs renew operator:bed"),
        "{status}"
    );
    Ok(())
}
