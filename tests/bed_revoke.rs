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
                .and_then(|l| l.split_whitespace().nth(1))
                .map(str::to_string))
        },
    )
}

#[test]
fn g15_a_revoked_host_has_its_next_report_refused_and_nothing_else_changes() -> anyhow::Result<()>
{
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
    assert!(run.stdout.contains(&format!("revoked serial {serial}")), "{}", run.stdout);
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
    assert!(line.contains(&format!("host:ace serial {serial}")), "{line}");
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

    // The other host goes on reporting; ace's account does not move again.
    let ace_then = report_sequence(&revoked_at, "ace");
    let g14_then = report_sequence(&revoked_at, "g14");
    let later = bed.wait_for("g14 reporting after the revocation", wait_ms_default, || {
        let s = bed.status()?;
        Ok((report_sequence(&s, "g14") > g14_then + 1).then_some(s))
    })?;
    assert!(
        report_sequence(&later, "ace") <= ace_then + 1,
        "ace reported after its certificate was revoked: {later}"
    );
    // The store moved by the deny list only: same revision, floor, sends, holds and history.
    assert_eq!(store_of(&later), store_of(&revoked_at));
    assert_eq!(
        bed.meshctl_ok(&["history", "--json"])?.json()?["answer"],
        history
    );
    let list = bed.meshctl_ok(&["certs", "list"])?.stdout;
    assert!(list.contains("deny list (1):"), "{list}");
    assert!(list.contains(&format!("serial {serial} — disk stolen")), "{list}");
    Ok(())
}
