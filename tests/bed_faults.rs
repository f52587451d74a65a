//! Fault beds with real processes (issue 11 part 5): real `meshd` and `mesh-host` processes, real
//! QUIC, and the faults a process shows best. Each bed pushes through the old leader while the
//! fault holds it and shows every such push refused and no host applying its epoch afterwards:
//! - the leader cut off from the other replicas only (blackhole routes between the replicas'
//!   namespaces), still reaching hosts and meshctl;
//! - the leader SIGKILLed in the middle of `push --all`;
//! - the leader SIGSTOPped in the middle of a push and resumed after a new leader pushed;
//! - a follower's store wiped and rebuilt under a write load.
//!
//! The cut and SIGSTOP beds hold one envelope "on its way": the leader's path to one host is cut
//! before the push, so that envelope, written under the lease, is being retransmitted when the
//! fault comes; once a new leader's envelope was applied there the path comes back, and only the
//! gate (which resets the stream when the lease ends) keeps the old one from arriving (decision
//! 0260). The kill bed keeps its push going with one host stopped (SIGSTOP). What hosts took is
//! read from their logs (every `applying declaration`, in order) and refusal files; what the
//! store recorded from `history --json` ([`mesh_beds::trail`]). Tests run in parallel, each bed in
//! its own temp dir, ports and namespaces.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::time::Duration;

use mesh_beds::netns::Fabric;
use mesh_beds::trail::{self, Applied};
use mesh_beds::{Bed, Streaming, binaries, wait_ms_default};
use nix::sys::signal::Signal;
use serde_json::Value;

const netns_mesh: &str = include_str!("../beds/meshes/netns.toml");
const four: &str = include_str!("../beds/meshes/four.toml");
const pair: &str = include_str!("../beds/meshes/pair.toml");
const machines: [&str; 4] = ["ace", "g14", "novox", "shanks"];

/// How long a push's client may take to end once its fate is decided.
const finish_ms: u64 = 30_000;

/// The bed started in namespaces (three IPv4 replicas, meshctl at 10.77.0.254), or `None` (said
/// on stderr) where namespaces cannot be made and [`require_env`] is not `1`.
fn netns_bed() -> anyhow::Result<Option<Bed>> {
    if !Fabric::runs_here("bed_faults (namespace bed)")? {
        return Ok(None);
    }
    let replicas: Vec<(u64, IpAddr)> = vec![
        (1, "10.77.0.1".parse()?),
        (2, "10.77.0.2".parse()?),
        (3, "10.77.0.3".parse()?),
    ];
    let bed = Bed::start_netns(binaries!(), &replicas, "10.77.0.254".parse()?, netns_mesh)?;
    Ok(Some(bed))
}

/// Applies `mesh`, pushes every machine and waits until none is behind; the leader's id then
/// (not before the apply: an election right after start may still move it).
fn settle(bed: &Bed, mesh: &str) -> anyhow::Result<u64> {
    bed.leader_other_than(None)?;
    bed.apply(mesh, "first model")?;
    bed.meshctl_ok(&["push", "--all", "--why", "first send"])?;
    wait_none_behind(bed)?;
    bed.leader_other_than(None)
}

fn wait_none_behind(bed: &Bed) -> anyhow::Result<()> {
    bed.wait_none_behind(machines.len())
}

/// The term replica `id` says it is in, from a `status` answer.
fn epoch_of(status: &Value, id: u64) -> anyhow::Result<u64> {
    status["replicas"]
        .as_array()
        .and_then(|rs| rs.iter().find(|r| r["id"] == id))
        .and_then(|r| r["epoch"].as_u64())
        .ok_or_else(|| anyhow::anyhow!("no epoch for replica {id}: {status}"))
}

/// The lines a streamed push prints up to and including the first machine's `applied` line
/// (after the `push at epoch N` header), within 30 s: from then on the push has recorded its
/// sends and is writing envelopes.
fn first_applied(push: &Streaming) -> anyhow::Result<Vec<String>> {
    let deadline = std::time::Instant::now() + Duration::from_millis(wait_ms_default);
    let mut seen = Vec::new();
    loop {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        let Some(line) = push.next_line(left).filter(|_| !left.is_zero()) else {
            anyhow::bail!("no machine's applied line within {wait_ms_default} ms: {seen:?}");
        };
        let applied = machines
            .iter()
            .any(|m| line.starts_with(&format!("{m} ")) && line.contains("applied"));
        seen.push(line);
        if applied {
            return Ok(seen);
        }
    }
}

/// How many envelopes each machine has applied so far.
fn applied_counts(bed: &Bed) -> BTreeMap<&'static str, usize> {
    machines
        .iter()
        .map(|m| (*m, trail::applied(bed, m).len()))
        .collect()
}

/// What `machine` applied after the first `from` applies.
fn applied_since(bed: &Bed, machine: &str, from: usize) -> Vec<Applied> {
    trail::applied(bed, machine)
        .into_iter()
        .skip(from)
        .collect()
}

/// The checks the cut and SIGSTOP beds end with, once the cluster healed and a new push settled
/// it: every host applied in strictly increasing `(epoch, sequence)` (G2); `held`, the host whose
/// envelope from the old leader was on its way at the fault, took nothing of `old_epoch` or below
/// after its first `since` applies and refused nothing as older since (it had `older_before`):
/// the gate kept that envelope from it (G3); and every apply is a send record of the store (G4).
/// The other hosts' envelopes of the old push were written before the fault, under the lease,
/// and may land just after it: those are allowed.
fn no_host_took_the_old_epoch(
    bed: &Bed,
    old_epoch: u64,
    held: &str,
    since: usize,
    older_before: u64,
) -> anyhow::Result<()> {
    for machine in machines {
        trail::strictly_increasing(machine, &trail::applied(bed, machine))?;
    }
    if let Some(stale) = applied_since(bed, held, since)
        .into_iter()
        .find(|a| a.epoch <= old_epoch)
    {
        anyhow::bail!(
            "{held} applied {stale} after the old leader (term {old_epoch}) lost its lease"
        );
    }
    let older_now = trail::refusals(bed, held)?.older;
    anyhow::ensure!(
        older_now == older_before,
        "an envelope older than {held}'s mark reached it after the old leader lost its lease \
         ({older_before} refused as older before, {older_now} now)"
    );
    let sent = trail::sends(bed, &bed.context)?;
    trail::every_apply_recorded(bed, &machines, &sent)
}

/// `result`, a failure carrying the ends of every process's log (they go with the bed's dir).
fn with_logs(bed: &Bed, result: anyhow::Result<()>) -> anyhow::Result<()> {
    result.map_err(|e| {
        let mut tails = Vec::new();
        for id in 1..=3 {
            tails.push((format!("replica {id}"), bed.replica_log(id)));
        }
        for m in machines {
            tails.push((format!("host {m}"), bed.host_log(m)));
        }
        let tails: Vec<String> = tails
            .into_iter()
            .filter(|(_, log)| !log.is_empty())
            .map(|(who, log)| {
                let lines: Vec<&str> = log.lines().collect();
                let from = lines.len().saturating_sub(12);
                format!("--- {who}:\n{}", lines[from..].join("\n"))
            })
            .collect();
        e.context(tails.join("\n"))
    })
}

/// Polls `status` through `context` (one replica) until it names a leader other than `old`.
fn follows_another(bed: &Bed, context: &std::path::Path, old: u64) -> anyhow::Result<()> {
    bed.wait_for("the old leader follows a new one", wait_ms_default, || {
        let run = bed.meshctl_in(context, &["status", "--json"])?;
        let leader = run.json().ok().and_then(|v| v["answer"]["leader"].as_u64());
        Ok((leader.is_some() && leader != Some(old)).then_some(()))
    })
}

/// Replica `id`'s node name on the namespace bed (a host's is `host-<machine>`).
fn replica_node(id: u64) -> String {
    format!("replica-{id}")
}

fn fabric(bed: &Bed) -> anyhow::Result<&Fabric> {
    bed.fabric()
        .ok_or_else(|| anyhow::anyhow!("not a namespace bed"))
}

#[test]
fn g3_a_leader_cut_off_from_its_peers_but_not_from_hosts_has_every_push_refused_and_no_host_takes_its_epoch_after_the_new_one()
-> anyhow::Result<()> {
    // The headline fault: on the namespace bed the leader loses only the paths to the other
    // replicas (blackhole routes both ways); hosts and meshctl still reach it. A push through it
    // is in progress at the cut: g14's envelope was written under its lease but the path to g14
    // drops it, so QUIC would retransmit it. The other two elect a leader whose push g14 applies;
    // then the path to g14 comes back while the old leader is still cut off: its lease ended, so
    // the gate reset that stream and g14 never takes (nor refuses) the old envelope. The push in
    // progress and a push through the cut-off leader afterwards both end refused.
    let Some(bed) = netns_bed()? else {
        return Ok(());
    };
    let result = cut_off(&bed);
    with_logs(&bed, result)
}

fn cut_off(bed: &Bed) -> anyhow::Result<()> {
    let old = settle(bed, netns_mesh)?;
    let old_epoch = epoch_of(&bed.status()?, old)?;
    let only_old = bed.context_for(old)?;
    bed.meshctl_ok(&["settings", "set", "mesh", "region=cut", "--why", "to send"])?;

    fabric(bed)?.cut_between(&replica_node(old), "host-g14")?;
    let in_flight = bed.meshctl_spawn_in(
        &only_old,
        &["push", "--all", "--why", "in flight at the cut"],
    )?;
    let first = first_applied(&in_flight)?;
    bed.cut_replica_from_peers(old)?;
    let at_cut = applied_counts(bed);
    let older_before = trail::refusals(bed, "g14")?.older;

    let new = bed.leader_other_than(Some(old))?;
    let new_epoch = epoch_of(&bed.status()?, new)?;
    anyhow::ensure!(
        new_epoch > old_epoch,
        "new term {new_epoch}, old {old_epoch}"
    );
    bed.meshctl_ok(&["push", "--all", "--why", "new leader"])?;
    bed.wait_for("g14 applied the new term", wait_ms_default, || {
        let took = applied_since(bed, "g14", at_cut["g14"]);
        Ok(took.iter().any(|a| a.epoch >= new_epoch).then_some(()))
    })?;
    // The old leader's path to g14 back, the old leader still cut off from its peers.
    fabric(bed)?.heal_between(&replica_node(old), "host-g14")?;
    let (code, lines, stderr) = in_flight.finish_with_stderr(Duration::from_millis(finish_ms))?;
    eprintln!(
        "push in flight at the cut: exit {code:?}, printed {first:?} {lines:?}, error {stderr:?}"
    );
    anyhow::ensure!(
        code.is_some_and(|c| c != 0),
        "the push in flight through the cut-off leader exited {code:?} (before: {first:?}): {lines:?} {stderr}"
    );

    // A push through the cut-off leader now: refused in one line, no host changed.
    let before = applied_counts(bed);
    let run = bed.meshctl_in(
        &only_old,
        &["push", "--all", "--why", "through the cut-off leader"],
    )?;
    eprintln!(
        "push through the cut-off leader: exit {:?}: {}{}",
        run.code, run.stdout, run.stderr
    );
    anyhow::ensure!(
        run.code.is_some_and(|c| c != 0),
        "a push through the cut-off leader exited {:?}: {}{}",
        run.code,
        run.stdout,
        run.stderr
    );
    anyhow::ensure!(
        run.one_line_error(),
        "refused in more or less than one line: {:?}",
        run.stderr
    );
    let after = applied_counts(bed);
    anyhow::ensure!(
        after == before,
        "a host applied something of the refused push: {before:?} → {after:?}"
    );

    bed.heal_replica_from_peers(old)?;
    follows_another(bed, &only_old, old)?;
    bed.meshctl_ok(&["push", "--all", "--why", "after the heal"])?;
    wait_none_behind(bed)?;
    no_host_took_the_old_epoch(bed, old_epoch, "g14", at_cut["g14"], older_before)
}

#[test]
fn g2_g4_the_leader_sigkilled_in_the_middle_of_push_all_leaves_a_failed_client_and_hosts_that_applied_only_what_the_store_recorded()
-> anyhow::Result<()> {
    // `push --all` through the leader, shanks stopped so the push is still going after the first
    // line; then SIGKILL of the leader. meshctl ends non-zero with one line (no hang, not 0); a
    // new leader's `push --all` brings every machine to not behind; no host's applied position
    // moves back; every envelope a host applied is a send record of the store, and the records of
    // the interrupted push for the machines that printed `applied` are what those hosts applied.
    let mut bed = Bed::start(binaries!(), 3, four)?;
    let result = killed(&mut bed);
    with_logs(&bed, result)
}

fn killed(bed: &mut Bed) -> anyhow::Result<()> {
    let old = settle(bed, four)?;
    let only_old = bed.context_for(old)?;
    bed.meshctl_ok(&["settings", "set", "mesh", "region=kill", "--why", "to send"])?;
    bed.signal_host("shanks", Signal::SIGSTOP)?;
    let before = applied_counts(bed);
    let push = bed.meshctl_spawn_in(&only_old, &["push", "--all", "--why", "interrupted"])?;
    let first = first_applied(&push)?;
    bed.kill_replica(old)?;
    let (code, lines, stderr) = push.finish_with_stderr(Duration::from_millis(finish_ms))?;
    bed.signal_host("shanks", Signal::SIGCONT)?;
    eprintln!("interrupted push: exit {code:?}, printed {first:?} {lines:?}, error {stderr:?}");
    anyhow::ensure!(
        code.is_some_and(|c| c != 0),
        "the interrupted push exited {code:?}: {first:?} {lines:?} {stderr}"
    );
    anyhow::ensure!(
        stderr.trim_end().lines().count() == 1,
        "the interrupted push did not end with one error line: {stderr:?}"
    );

    bed.leader_other_than(Some(old))?;
    bed.meshctl_ok(&["push", "--all", "--why", "after the kill"])?;
    for machine in machines {
        trail::strictly_increasing(machine, &trail::applied(bed, machine))?;
    }
    let sent = trail::sends(bed, &bed.context)?;
    trail::every_apply_recorded(bed, &machines, &sent)?;
    wait_none_behind(bed)?;
    let printed: Vec<&String> = first.iter().chain(lines.iter()).collect();
    for machine in machines {
        let recorded: Vec<&trail::Sent> = sent
            .iter()
            .filter(|s| s.machine == machine && s.why == "interrupted")
            .collect();
        let took = applied_since(bed, machine, before[machine]);
        let said_applied = printed
            .iter()
            .any(|l| l.starts_with(&format!("{machine} ")) && l.contains("applied"));
        if said_applied {
            anyhow::ensure!(
                recorded.len() == 1 && took.iter().any(|a| recorded[0].is(a)),
                "{machine} printed applied; records of the interrupted push {recorded:?}, applies since {took:?}"
            );
        }
        anyhow::ensure!(
            recorded.len() <= 1,
            "the interrupted push recorded {machine} more than once: {recorded:?}"
        );
    }
    Ok(())
}

#[test]
fn g2_g3_a_leader_sigstopped_in_the_middle_of_a_push_and_resumed_after_a_new_leader_pushed_gets_no_host_to_take_its_epoch()
-> anyhow::Result<()> {
    // On the namespace bed: the leader's path to shanks drops everything, a `push --all` through
    // the leader prints its first applied line (shanks' envelope written under the lease and
    // being retransmitted), and the leader is stopped with SIGSTOP. A new leader is elected and
    // pushes, shanks applies the new term, the path comes back, and the old leader is resumed
    // with its stream to shanks still open: the gate, asked again, finds the lease ended and
    // resets it; the resumed push ends refused and no host takes the old epoch.
    let Some(bed) = netns_bed()? else {
        return Ok(());
    };
    let result = paused(&bed);
    with_logs(&bed, result)
}

fn paused(bed: &Bed) -> anyhow::Result<()> {
    let old = settle(bed, netns_mesh)?;
    let old_epoch = epoch_of(&bed.status()?, old)?;
    let only_old = bed.context_for(old)?;
    bed.meshctl_ok(&["settings", "set", "mesh", "region=stop", "--why", "to send"])?;
    fabric(bed)?.cut_between(&replica_node(old), "host-shanks")?;
    let push = bed.meshctl_spawn_in(&only_old, &["push", "--all", "--why", "paused"])?;
    let first = first_applied(&push)?;
    bed.pause_replica(old)?;
    let at_pause = applied_counts(bed);
    let older_before = trail::refusals(bed, "shanks")?.older;

    let new = bed.leader_other_than(Some(old))?;
    let new_epoch = epoch_of(&bed.status()?, new)?;
    bed.meshctl_ok(&["push", "--all", "--why", "new leader"])?;
    bed.wait_for("shanks applied the new term", wait_ms_default, || {
        let took = applied_since(bed, "shanks", at_pause["shanks"]);
        Ok(took.iter().any(|a| a.epoch >= new_epoch).then_some(()))
    })?;
    fabric(bed)?.heal_between(&replica_node(old), "host-shanks")?;

    bed.resume_replica(old)?;
    let (code, lines, stderr) = push.finish_with_stderr(Duration::from_millis(finish_ms))?;
    eprintln!("resumed push: exit {code:?}, printed {first:?} {lines:?}, error {stderr:?}");
    anyhow::ensure!(
        code.is_some_and(|c| c != 0),
        "the resumed push exited {code:?} (before: {first:?}): {lines:?} {stderr}"
    );
    follows_another(bed, &only_old, old)?;
    bed.meshctl_ok(&["push", "--all", "--why", "after the resume"])?;
    wait_none_behind(bed)?;
    no_host_took_the_old_epoch(bed, old_epoch, "shanks", at_pause["shanks"], older_before)
}

/// A loop of `settings set machine/ace k<n>=v<n>` straight to one replica until `stop`; the `n`
/// of every write meshctl acknowledged (exit 0). Anything else is of unknown outcome.
struct Writer {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    acknowledged: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    thread: Option<std::thread::JoinHandle<anyhow::Result<Vec<usize>>>>,
}

/// Most writes the loop makes (each is one meshctl process: a few per second).
const writes_max: usize = 2_000;

impl Writer {
    fn start(meshctl: std::path::PathBuf, context: std::path::PathBuf) -> Writer {
        use std::sync::atomic::Ordering;
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let acknowledged = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let (stop_w, ack_w) = (stop.clone(), acknowledged.clone());
        let thread = std::thread::spawn(move || -> anyhow::Result<Vec<usize>> {
            let mut done = Vec::new();
            for n in 0..writes_max {
                if stop_w.load(Ordering::Relaxed) {
                    break;
                }
                let value = format!("k{n}=v{n}");
                let out = std::process::Command::new(&meshctl)
                    .arg("--context")
                    .arg(&context)
                    .args(["settings", "set", "machine/ace", &value, "--why", "load"])
                    .env_remove("MESH_CONTEXT")
                    .output()?;
                if out.status.code() == Some(0) {
                    done.push(n);
                    ack_w.store(n + 1, Ordering::Relaxed);
                }
            }
            Ok(done)
        });
        Writer {
            stop,
            acknowledged,
            thread: Some(thread),
        }
    }

    /// One past the `n` of the newest acknowledged write (0 before any).
    fn acknowledged(&self) -> usize {
        self.acknowledged.load(std::sync::atomic::Ordering::Relaxed)
    }

    fn finish(mut self) -> anyhow::Result<Vec<usize>> {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        match self.thread.take() {
            Some(t) => t
                .join()
                .map_err(|_| anyhow::anyhow!("the writer thread panicked"))?,
            None => Ok(Vec::new()),
        }
    }
}

impl Drop for Writer {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

#[test]
fn g9_a_followers_store_wiped_under_a_write_load_catches_up_and_every_acknowledged_write_is_read_through_it()
-> anyhow::Result<()> {
    // A loop of `settings set` (one new key per write, straight to the leader) runs while a
    // follower is stopped, its store and floor deleted, and started again on an empty store
    // (decision 0200). It catches up (level in status) while the writes go on. Then it is made
    // the leader — the other follower paused, one more write, SIGTERM of the leader hands over to
    // the only replica with the whole log — and every acknowledged write is read through it.
    let mut bed = Bed::start(binaries!(), 3, pair)?;
    let result = wiped_under_load(&mut bed);
    with_logs(&bed, result)
}

fn wiped_under_load(bed: &mut Bed) -> anyhow::Result<()> {
    let leader = bed.leader_other_than(None)?;
    bed.apply(pair, "first model")?;
    let wiped = (1..=3).find(|id| *id != leader).unwrap_or(1);
    let other = (1..=3)
        .find(|id| *id != leader && *id != wiped)
        .unwrap_or(1);
    let writer = Writer::start(binaries!().meshctl, bed.context_for(leader)?);
    let wait_acks = |bed: &Bed, writer: &Writer, at_least: usize| {
        bed.wait_for("acknowledged writes", wait_ms_default, || {
            Ok((writer.acknowledged() >= at_least).then_some(()))
        })
    };
    wait_acks(bed, &writer, 10)?;
    bed.kill_replica(wiped)?;
    let dir = bed.dir.join(format!("replica-{wiped}"));
    for file in ["replica.redb", "epoch-floor"] {
        let path = dir.join(file);
        if path.exists() {
            std::fs::remove_file(&path)?;
        }
    }
    bed.restart_replica(wiped)?;
    let at_restart = writer.acknowledged();
    wait_acks(bed, &writer, at_restart + 15)?;
    bed.wait_for("the wiped replica level", wait_ms_default, || {
        bed.no_replica_panicked()?;
        Ok(Bed::level(&bed.status()?, wiped))
    })?;
    let acknowledged = writer.finish()?;
    anyhow::ensure!(
        acknowledged.iter().any(|n| *n >= at_restart),
        "no write acknowledged after the wiped replica restarted: {acknowledged:?}"
    );

    // Only the wiped replica can take over: the other follower misses the last write.
    bed.pause_replica(other)?;
    bed.meshctl_in(
        &bed.context_for(leader)?,
        &[
            "settings",
            "set",
            "machine/ace",
            "last=1",
            "--why",
            "only two",
        ],
    )
    .and_then(|run| {
        anyhow::ensure!(run.code == Some(0), "{}{}", run.stdout, run.stderr);
        Ok(())
    })?;
    bed.terminate_replica(leader)?;
    bed.reap_replica(leader, 15_000)?;
    let only_wiped = bed.context_for(wiped)?;
    bed.wait_for("the wiped replica leads", wait_ms_default, || {
        let run = bed.meshctl_in(&only_wiped, &["status", "--json"])?;
        let leader = run.json().ok().and_then(|v| v["answer"]["leader"].as_u64());
        Ok((leader == Some(wiped)).then_some(()))
    })?;
    // A read is answered only by a leader a quorum confirms (decision 0288): with the old leader
    // gone and the other follower paused, the wiped replica leads alone and refuses it. The
    // paused follower, let go again, makes the quorum; it still misses the last write, so what
    // is read is what the wiped replica holds.
    bed.resume_replica(other)?;
    let shown = bed.wait_for(
        "a settings read the wiped leader answers",
        wait_ms_default,
        || {
            let run = bed.meshctl_in(&only_wiped, &["settings", "show", "machine/ace"])?;
            Ok((run.code == Some(0)).then_some(run))
        },
    )?;
    anyhow::ensure!(shown.code == Some(0), "{}{}", shown.stdout, shown.stderr);
    let has = |key: &str, value: &str| {
        shown.stdout.lines().any(|l| {
            let words: Vec<&str> = l
                .split(|c: char| !c.is_ascii_alphanumeric())
                .filter(|w| !w.is_empty())
                .collect();
            words.first() == Some(&key) && words.contains(&value)
        })
    };
    for n in &acknowledged {
        let (key, value) = (format!("k{n}"), format!("v{n}"));
        anyhow::ensure!(
            has(&key, &value),
            "acknowledged write {key}={value} is not read through replica {wiped}:\n{}",
            shown.stdout
        );
    }
    anyhow::ensure!(has("last", "1"), "{}", shown.stdout);
    eprintln!(
        "read {} acknowledged writes ({} after the restart on an empty store) through replica {wiped}, leading",
        acknowledged.len(),
        acknowledged.iter().filter(|n| **n >= at_restart).count()
    );
    bed.no_replica_panicked()?;
    bed.resume_replica(other)?;
    Ok(())
}

/// The blackhole routes in `netns` (`ip route show type blackhole`, both families), one per line.
fn blackholes(netns: &str) -> anyhow::Result<Vec<String>> {
    let mut routes = Vec::new();
    for family in ["-4", "-6"] {
        let out = std::process::Command::new("ip")
            .args([family, "-n", netns, "route", "show", "type", "blackhole"])
            .output()?;
        anyhow::ensure!(
            out.status.success(),
            "ip route show in {netns}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        routes.extend(
            String::from_utf8_lossy(&out.stdout)
                .lines()
                .map(|l| l.trim().to_string())
                .filter(|l| !l.is_empty()),
        );
    }
    Ok(routes)
}

#[test]
fn netns_cut_between_routes_away_only_that_pair_both_ways_and_heal_removes_exactly_that()
-> anyhow::Result<()> {
    // The fault the headline bed rests on: a cut between a and b is a blackhole route to each
    // other's addresses (both families) in both namespaces and nothing in c's; cutting twice or
    // healing twice changes nothing; healing leaves no route; a node cut from itself is refused.
    if !Fabric::runs_here("bed_faults cut check")? {
        return Ok(());
    }
    let ip = |s: &str| s.parse::<IpAddr>();
    let fabric = Fabric::create(&[
        ("a", vec![ip("10.77.0.1")?, ip("fd77::1")?]),
        ("b", vec![ip("10.77.0.2")?, ip("fd77::2")?]),
        ("c", vec![ip("10.77.0.3")?]),
    ])?;
    let ns = |n: &str| fabric.node(n).map(|node| node.netns.clone());
    let (a, b, c) = (ns("a")?, ns("b")?, ns("c")?);
    fabric.cut_between("a", "b")?;
    fabric.cut_between("b", "a")?;
    let expect = |routes: Vec<String>, want: &[&str]| -> anyhow::Result<()> {
        let got: Vec<String> = routes
            .iter()
            .filter_map(|r| r.split_whitespace().nth(1).map(str::to_string))
            .collect();
        let mut want: Vec<String> = want.iter().map(|w| w.to_string()).collect();
        let mut sorted = got.clone();
        sorted.sort();
        want.sort();
        anyhow::ensure!(sorted == want, "blackholes {routes:?}, want {want:?}");
        Ok(())
    };
    expect(blackholes(&a)?, &["10.77.0.2", "fd77::2"])?;
    expect(blackholes(&b)?, &["10.77.0.1", "fd77::1"])?;
    expect(blackholes(&c)?, &[])?;
    assert_eq!(fabric.cut_pairs(), vec![("a".to_string(), "b".to_string())]);
    fabric.heal_between("b", "a")?;
    fabric.heal_between("a", "b")?;
    for netns in [&a, &b, &c] {
        expect(blackholes(netns)?, &[])?;
    }
    assert!(fabric.cut_pairs().is_empty());
    let refused = fabric.cut_between("a", "a").err().map(|e| e.to_string());
    assert!(
        refused
            .as_deref()
            .is_some_and(|e| e.contains("from itself")),
        "{refused:?}"
    );
    let unknown = fabric.cut_between("a", "zed").err().map(|e| e.to_string());
    assert!(
        unknown
            .as_deref()
            .is_some_and(|e| e.contains("no node zed")),
        "{unknown:?}"
    );
    Ok(())
}
