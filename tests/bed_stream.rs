//! Streamed push output through real meshd, mesh-host and meshctl processes (issue 13 part 1):
//! a fast machine's line is printed while a slow machine's send is still pending.

use std::time::Duration;

use mesh_beds::{Bed, binaries};
use nix::sys::signal::Signal;

const pair: &str = include_str!("../beds/meshes/pair.toml");

#[test]
fn a_fast_machines_push_line_is_printed_while_a_slow_machines_send_is_still_pending()
-> anyhow::Result<()> {
    // g14's mesh-host is stopped (SIGSTOP): the leader's envelope to it waits for an answer that
    // does not come. ace's line must reach meshctl's stdout while that send is still pending —
    // meshctl still running — not with everything at the end.
    let bed = Bed::start(binaries!(), 3, pair)?;
    bed.leader_other_than(None)?;
    bed.apply(pair, "first model")?;
    bed.signal_host("g14", Signal::SIGSTOP)?;
    let mut push = bed.meshctl_spawn(&["push", "--all", "--why", "streamed"])?;
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let mut seen = Vec::new();
    let ace = loop {
        let Some(line) = push.next_line(Duration::from_millis(200)) else {
            anyhow::ensure!(
                std::time::Instant::now() < deadline,
                "no line for ace within 30 s; printed so far: {seen:?}"
            );
            continue;
        };
        if line.starts_with("ace") {
            break line;
        }
        seen.push(line);
    };
    assert!(ace.contains("applied"), "{ace}");
    assert!(
        !seen.iter().any(|l| l.starts_with("g14")),
        "g14's line came before ace's: {seen:?}"
    );
    // Printed at the end, every line would come in one burst with meshctl exiting right after;
    // streamed, g14's send is still waiting on its stopped host (seconds, until the send's
    // timeout), so for a moment after ace's line nothing more comes and meshctl runs on.
    let next = push.next_line(Duration::from_millis(500));
    assert!(
        next.as_ref().is_none_or(|l| !l.starts_with("g14")),
        "g14's line came right behind ace's, as if both were printed at the end: {next:?}"
    );
    seen.extend(next);
    assert!(
        push.running()?,
        "meshctl finished right after ace's line: its lines were not streamed"
    );
    bed.signal_host("g14", Signal::SIGCONT)?;
    let (code, rest) = push.finish(Duration::from_secs(60))?;
    let all: Vec<String> = seen.into_iter().chain(rest).collect();
    assert!(
        all.iter().any(|l| l.starts_with("g14")),
        "the slow machine's line follows: {all:?}"
    );
    // Exit 0 (applied) or 1 (g14 sent, not confirmed before the host came back): either way
    // meshctl answered, after ace's line was out.
    assert!(matches!(code, Some(0) | Some(1)), "exit {code:?}: {all:?}");
    Ok(())
}
