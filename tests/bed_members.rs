//! Bed for membership changes (issue 12 part 4, decision 0230) with real `meshd`, `mesh-host` and
//! `meshctl` processes: three replicas and two hosts under a write load (a loop of `settings set`);
//! `meshctl init --add-replica` writes replica 4, which starts and `meshctl replicas add` makes a
//! voter through joint consensus, every host holding its signing key in the declaration it applied
//! first; then a follower is removed the same way. Every acknowledged write is in the store after
//! both changes. Last, with one of the three voters left dead, removing another is refused with one
//! clear line and the membership does not change. A second bed stops one host first: the new
//! replica stays a learner, named as waiting for that machine, until the host is back and the same
//! `replicas add` finishes.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use mesh::cli::procs::free_ports;
use mesh::host::state::StateFiles;
use mesh_beds::{Bed, binaries, wait_ms_default};
use serde_json::Value;

const pair: &str = include_str!("../beds/meshes/pair.toml");
const machines: [&str; 2] = ["ace", "g14"];

/// `meshctl` with `args` (a `replicas add` of a replica just started), asked again while it is
/// refused because the new replica does not answer yet: that refusal changed nothing, and a meshd
/// still opening its store on a busy machine answers a moment later. With `until_voter`, also
/// while the new replica stays a learner because the push of its key did not reach every host
/// yet (a lease round lost under load): the answer says to run the same add again, which goes on
/// from where it stopped. Up to `wait_ms_default`.
fn when_answering(bed: &Bed, args: &[&str], until_voter: bool) -> anyhow::Result<mesh_beds::Run> {
    let deadline = std::time::Instant::now() + std::time::Duration::from_millis(wait_ms_default);
    loop {
        let run = bed.meshctl(args)?;
        let silent = run.code == Some(1)
            && (run.stderr.contains("does not answer")
                || (until_voter
                    && run
                        .stderr
                        .contains("run the same `meshctl replicas add` again")));
        if !silent || std::time::Instant::now() >= deadline {
            return Ok(run);
        }
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
}

/// The members `replicas list` prints: (id, role) per row.
fn members(bed: &Bed) -> anyhow::Result<Vec<(u64, String)>> {
    let run = bed.meshctl_ok(&["replicas", "list"])?;
    Ok(rows(&run.stdout))
}

fn rows(text: &str) -> Vec<(u64, String)> {
    text.lines()
        .filter_map(|l| {
            let mut words = l.split_whitespace();
            let id = words.next()?.parse().ok()?;
            Some((id, words.next()?.to_string()))
        })
        .collect()
}

/// Replica `id`'s public signing key as the added replicas' keys carry it.
fn public_key(bed: &Bed, id: u64) -> anyhow::Result<[u8; 32]> {
    let text = std::fs::read_to_string(bed.dir.join(format!("replica-{id}/signing.key")))?;
    let secret = mesh::host::config::decode_hex_32(text.trim())
        .ok_or_else(|| anyhow::anyhow!("replica {id}'s signing key is not hex"))?;
    Ok(ed25519_dalek::SigningKey::from_bytes(&secret)
        .verifying_key()
        .to_bytes())
}

/// The mesh-scope settings layer the store holds now.
fn mesh_settings(bed: &Bed) -> anyhow::Result<Value> {
    let doc = bed
        .meshctl_ok(&["settings", "show", "mesh", "--json"])?
        .json()?;
    Ok(doc["answer"].clone())
}

/// A loop of `settings set mesh load-<writer>-<n>=<n>` until `stop`; the keys whose write was
/// acknowledged.
fn load(bed: Arc<Bed>, stop: Arc<AtomicBool>, writer: u32) -> std::thread::JoinHandle<Vec<String>> {
    std::thread::spawn(move || {
        let mut acked = Vec::new();
        let mut n = 0u64;
        while !stop.load(Ordering::Relaxed) {
            n += 1;
            let assignment = format!("load-{writer}-{n}={n}");
            let run = bed.meshctl(&["settings", "set", "mesh", &assignment, "--why", "load"]);
            if run.is_ok_and(|r| r.code == Some(0)) {
                acked.push(format!("load-{writer}-{n}"));
            }
        }
        acked
    })
}

#[test]
fn g13_a_replica_added_then_another_removed_under_load_loses_no_acknowledged_write()
-> anyhow::Result<()> {
    let bed = Bed::start(binaries!(), 3, pair)?;
    let mut bed = Some(bed);
    let run = add_then_remove(&mut bed);
    run.map_err(|e| {
        let Some(bed) = bed.as_ref() else { return e };
        let tails: Vec<String> = (1..=4)
            .map(|id| {
                let log = bed.replica_log(id);
                let lines: Vec<&str> = log.lines().collect();
                let from = lines.len().saturating_sub(25);
                format!("--- replica {id}:\n{}", lines[from..].join("\n"))
            })
            .collect();
        e.context(tails.join("\n"))
    })
}

fn add_then_remove(slot: &mut Option<Bed>) -> anyhow::Result<()> {
    let mut bed = slot.take().ok_or_else(|| anyhow::anyhow!("no bed"))?;
    bed.leader_other_than(None)?;
    bed.apply(pair, "first model")?;
    bed.meshctl_ok(&["push", "--all", "--why", "first send"])?;

    // Replica 4's files from the existing CA; it starts and waits to be added.
    let port = free_ports(1)?[0];
    let spec = format!("4={port}");
    let dir = bed.dir.display().to_string();
    let written = bed.meshctl_ok(&["init", "--dir", &dir, "--add-replica", &spec])?;
    assert!(
        written.stdout.contains("meshctl replicas add --id 4"),
        "{}",
        written.stdout
    );
    bed.start_replica(4)?;
    bed.layout.replicas.push((4, port));

    // The load runs through both membership changes.
    let bed = Arc::new(bed);
    let stop = Arc::new(AtomicBool::new(false));
    let writers: Vec<_> = (0..3).map(|w| load(bed.clone(), stop.clone(), w)).collect();
    let addr = port.to_string();
    let added = when_answering(
        &bed,
        &["replicas", "add", "--id", "4", "--addr", &addr],
        true,
    );
    let added = added.and_then(|run| {
        if run.code == Some(0) {
            Ok(run)
        } else {
            Err(anyhow::anyhow!(
                "replicas add exited {:?}: {}{}",
                run.code,
                run.stdout,
                run.stderr
            ))
        }
    });
    let added = match added {
        Ok(run) => run,
        Err(e) => {
            stop.store(true, Ordering::Relaxed);
            for w in writers {
                let _ = w.join();
            }
            *slot = Arc::try_unwrap(bed).ok();
            return Err(e);
        }
    };
    assert!(
        added.stdout.contains("replica 4 is a voter"),
        "{}",
        added.stdout
    );
    assert!(
        rows(&added.stdout).contains(&(4, "voter".to_string())),
        "{}",
        added.stdout
    );
    // Every host applied a declaration carrying replica 4's key: it may lead now.
    let key = public_key(&bed, 4)?;
    for machine in machines {
        let applied = StateFiles::new(&bed.host_root(machine))
            .load_applied()?
            .ok_or_else(|| anyhow::anyhow!("{machine} applied nothing"))?;
        assert_eq!(
            applied.declaration.signers.get(&4),
            Some(&key),
            "{machine} was not given replica 4's key before replica 4 became a voter"
        );
    }

    // Remove a founding follower, still under load.
    let listed = members(&bed)?;
    let leader = listed
        .iter()
        .find(|(_, role)| role == "leader")
        .map(|(id, _)| *id)
        .ok_or_else(|| anyhow::anyhow!("no leader listed: {listed:?}"))?;
    let gone = (1..=3)
        .find(|id| *id != leader)
        .ok_or_else(|| anyhow::anyhow!("no follower"))?;
    let removed = bed.meshctl(&["replicas", "remove", &gone.to_string()])?;
    stop.store(true, Ordering::Relaxed);
    let mut acked = Vec::new();
    for w in writers {
        acked.extend(
            w.join()
                .map_err(|_| anyhow::anyhow!("a load thread panicked"))?,
        );
    }
    let mut bed = Arc::try_unwrap(bed).map_err(|_| anyhow::anyhow!("bed still shared"))?;
    anyhow::ensure!(
        removed.code == Some(0),
        "replicas remove {gone} exited {:?}: {}{}",
        removed.code,
        removed.stdout,
        removed.stderr
    );
    let after = rows(&removed.stdout);
    assert!(
        !after.iter().any(|(id, _)| *id == gone),
        "replica {gone} still listed: {}",
        removed.stdout
    );
    bed.kill_replica(gone)?;

    // No acknowledged write lost.
    assert!(!acked.is_empty(), "the load acknowledged no write");
    let settings = mesh_settings(&bed)?.to_string();
    let lost: Vec<&String> = acked
        .iter()
        .filter(|k| !settings.contains(&format!("\"{k}\"")))
        .collect();
    assert!(lost.is_empty(), "acknowledged writes lost: {lost:?}");

    // Voters now: the leader, the other founding one and 4. With that other one dead, removing 4
    // would leave {leader, other} with one live voter: refused, nothing changed.
    let other = (1..=3)
        .find(|id| *id != leader && *id != gone)
        .ok_or_else(|| anyhow::anyhow!("no third replica"))?;
    bed.kill_replica(other)?;
    let before = members(&bed)?;
    let refused = bed.wait_for("remove 4 refused for quorum", wait_ms_default, || {
        let run = bed.meshctl(&["replicas", "remove", "4"])?;
        Ok((run.code == Some(1) && run.stderr.contains("quorum")).then_some(run))
    })?;
    assert!(refused.one_line_error(), "{}", refused.stderr);
    assert!(
        refused.stderr.contains("nothing was changed"),
        "{}",
        refused.stderr
    );
    let still = members(&bed)?;
    let ids = |m: &[(u64, String)]| m.iter().map(|(id, _)| *id).collect::<Vec<u64>>();
    assert_eq!(
        ids(&still),
        ids(&before),
        "a refused remove changed the membership"
    );
    assert!(
        still.contains(&(4, "voter".to_string())) || still.contains(&(4, "leader".to_string()))
    );
    *slot = Some(bed);
    Ok(())
}

#[test]
fn g2_a_replica_stays_a_learner_while_a_machine_has_not_applied_its_key() -> anyhow::Result<()> {
    let mut bed = Bed::start(binaries!(), 3, pair)?;
    bed.leader_other_than(None)?;
    bed.apply(pair, "first model")?;
    bed.meshctl_ok(&["push", "--all", "--why", "first send"])?;
    bed.stop_host("g14")?;
    let port = free_ports(1)?[0];
    let spec = format!("4={port}");
    let dir = bed.dir.display().to_string();
    bed.meshctl_ok(&["init", "--dir", &dir, "--add-replica", &spec])?;
    bed.start_replica(4)?;
    bed.layout.replicas.push((4, port));
    let addr = port.to_string();
    let add = ["replicas", "add", "--id", "4", "--addr", addr.as_str()];

    // g14 cannot be given the key: replica 4 may not become a voter.
    let held = when_answering(&bed, &add, false)?;
    assert_eq!(held.code, Some(1), "{}{}", held.stdout, held.stderr);
    assert!(held.one_line_error(), "{}", held.stderr);
    assert!(
        held.stderr.contains("learner") && held.stderr.contains("g14"),
        "{}",
        held.stderr
    );
    assert!(
        members(&bed)?.contains(&(4, "learner".to_string())),
        "replica 4 is more than a learner while g14 lacks its key"
    );

    // g14 back: the same command finishes the add, and g14 holds the key.
    bed.start_host("g14")?;
    let done = bed.wait_for(
        "replica 4 a voter once g14 is back",
        wait_ms_default,
        || {
            let run = bed.meshctl(&add)?;
            Ok((run.code == Some(0)).then_some(run))
        },
    )?;
    assert!(
        rows(&done.stdout).contains(&(4, "voter".to_string())),
        "{}",
        done.stdout
    );
    let key = public_key(&bed, 4)?;
    let applied = StateFiles::new(&bed.host_root("g14"))
        .load_applied()?
        .ok_or_else(|| anyhow::anyhow!("g14 applied nothing"))?;
    assert_eq!(applied.declaration.signers.get(&4), Some(&key));
    Ok(())
}
