//! `meshctl logs` end to end (issue 13 part 5) and mesh-host's own `/metrics` from the real
//! binary (part 4): real meshd and mesh-host processes, a module printing numbered lines on
//! stdout and stderr. The operator asks a replica, the replica asks the host (`MessageKind::Logs`,
//! replicas only), the host reads the module's log files.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::time::Duration;

use mesh::cli::procs::{Guarded, free_tcp_ports};
use mesh_beds::{Bed, binaries, wait_ms_default};

/// One machine whose module counts: `line N` on stdout and `err N` on stderr, five a second.
const mesh_text: &str = r#"
[machines.ace]
address = "127.0.0.1"

[modules.talker]
machine = "ace"
command = "sh"
args = ["-c", "i=0; while :; do i=$((i+1)); echo \"line $i\"; echo \"err $i\" >&2; sleep 0.2; done"]
"#;

/// The numbers of the lines that start with `prefix` (`[talker] line `), in order.
fn numbers(text: &str, prefix: &str) -> Vec<u64> {
    text.lines()
        .filter_map(|l| l.strip_prefix(prefix))
        .filter_map(|n| n.trim().parse().ok())
        .collect()
}

fn consecutive(ns: &[u64]) -> bool {
    ns.windows(2).all(|w| w[1] == w[0] + 1)
}

fn pushed() -> anyhow::Result<Bed> {
    let bed = Bed::start(binaries!(), 3, mesh_text)?;
    bed.leader_other_than(None)?;
    bed.apply(mesh_text, "a talking module")?;
    bed.meshctl_ok(&["push", "--all", "--why", "first send", "--wait=60s"])?;
    Ok(bed)
}

#[test]
fn logs_reads_a_modules_last_lines_and_follows_without_gaps_or_repeats() -> anyhow::Result<()> {
    let bed = pushed()?;
    // The last 3 lines of each stream, consecutive, once the module has printed more than 3.
    let out = bed.wait_for("3 lines of each stream", wait_ms_default, || {
        let run = bed.meshctl_ok(&["logs", "ace", "talker", "--lines", "3"])?;
        let out = numbers(&run.stdout, "[talker] line ");
        let err = numbers(&run.stdout, "[talker stderr] err ");
        if out.len() == 3 && err.len() == 3 && out[0] > 1 {
            return Ok(Some(run.stdout));
        }
        anyhow::bail!("logs printed:\n{}{}", run.stdout, run.stderr)
    })?;
    assert!(consecutive(&numbers(&out, "[talker] line ")), "{out}");
    assert_eq!(out.lines().count(), 6, "{out}");
    // Without a module: every module of the machine.
    let all = bed.meshctl_ok(&["logs", "ace", "--lines", "1"])?;
    assert_eq!(
        numbers(&all.stdout, "[talker] line ").len(),
        1,
        "{}",
        all.stdout
    );

    // --follow: every line after the first, each once, in order.
    let log = bed.dir.join("logs").join("meshctl-follow.log");
    let context = bed.context.display().to_string();
    let args = [
        "--context",
        &context,
        "logs",
        "ace",
        "talker",
        "--follow",
        "--lines",
        "1",
    ];
    let meshctl = binaries!().meshctl;
    let _follow = Guarded::spawn("follow", &meshctl, &args, &log, Duration::ZERO)?;
    let followed = bed.wait_for("--follow to print 12 stdout lines", wait_ms_default, || {
        let text = bed.read(&log);
        let ns = numbers(&text, "[talker] line ");
        Ok((ns.len() >= 12).then_some(text))
    })?;
    let ns = numbers(&followed, "[talker] line ");
    assert!(
        consecutive(&ns),
        "gaps or repeats in --follow: {ns:?}\n{followed}"
    );
    let es = numbers(&followed, "[talker stderr] err ");
    assert!(!es.is_empty() && consecutive(&es), "{es:?}\n{followed}");
    Ok(())
}

#[test]
fn logs_of_an_unknown_module_or_machine_is_one_line_naming_what_exists() -> anyhow::Result<()> {
    let bed = pushed()?;
    let run = bed.meshctl(&["logs", "ace", "nosuch"])?;
    assert_eq!(run.code, Some(2), "{}{}", run.stdout, run.stderr);
    assert!(run.one_line_error(), "{}", run.stderr);
    assert!(
        run.stderr.contains("no module `nosuch`") && run.stderr.contains("talker"),
        "{}",
        run.stderr
    );
    let run = bed.meshctl(&["logs", "zed"])?;
    assert_eq!(run.code, Some(2), "{}{}", run.stdout, run.stderr);
    assert!(
        run.one_line_error()
            && run.stderr.contains("no machine `zed`")
            && run.stderr.contains("ace"),
        "{}",
        run.stderr
    );
    let run = bed.meshctl(&["logs", "ace", "--lines", "0"])?;
    assert_eq!(run.code, Some(2), "{}{}", run.stdout, run.stderr);
    assert!(run.stderr.contains("--lines"), "{}", run.stderr);
    Ok(())
}

/// `GET /metrics` on `addr`: the status code and the body.
fn get_metrics(addr: SocketAddr) -> anyhow::Result<(u16, String)> {
    let wait = Duration::from_millis(5_000);
    let mut stream = TcpStream::connect_timeout(&addr, wait)?;
    stream.set_read_timeout(Some(wait))?;
    write!(
        stream,
        "GET /metrics HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )?;
    let mut raw = String::new();
    stream.read_to_string(&mut raw)?;
    let (head, body) = raw
        .split_once("\r\n\r\n")
        .ok_or_else(|| anyhow::anyhow!("no header end in {raw:?}"))?;
    let code = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| anyhow::anyhow!("no status in {head:?}"))?;
    Ok((code, body.to_string()))
}

fn sample(text: &str, key: &str) -> Option<f64> {
    text.lines()
        .filter_map(|l| l.rsplit_once(' '))
        .find(|(k, _)| *k == key)
        .and_then(|(_, v)| v.parse().ok())
}

#[test]
fn mesh_host_serves_metrics_on_its_http_address() -> anyhow::Result<()> {
    // Issue 13 part 4: `http` in host.toml turns on mesh-host's /metrics; a push shows as an
    // accepted envelope, a delivered report and a ready module.
    let mut bed = Bed::start(binaries!(), 1, mesh_text)?;
    bed.leader_other_than(None)?;
    bed.stop_host("ace")?;
    let port = free_tcp_ports(1)?[0];
    let config = bed.dir.join("host-ace.toml");
    let text = std::fs::read_to_string(&config)?;
    std::fs::write(&config, format!("http = \"{port}\"\n{text}"))?;
    bed.start_host("ace")?;
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    bed.apply(mesh_text, "a talking module")?;
    bed.meshctl_ok(&["push", "--all", "--why", "first send", "--wait=60s"])?;
    let log = bed.dir.join("logs").join("host-ace.log");
    bed.wait_for(
        "mesh-host's /metrics after the push",
        wait_ms_default,
        || {
            let (code, text) = get_metrics(addr)
                .map_err(|e| anyhow::anyhow!("{e}; host log:\n{}", bed.read(Path::new(&log))))?;
            anyhow::ensure!(code == 200, "/metrics answered {code}: {text}");
            let done = sample(&text, "mesh_host_envelopes_accepted_total") == Some(1.0)
                && sample(&text, "mesh_host_modules{state=\"ready\"}") == Some(1.0)
                && sample(&text, "mesh_host_reports_delivered_total").is_some_and(|n| n >= 1.0);
            if done {
                return Ok(Some(()));
            }
            anyhow::bail!("{text}")
        },
    )?;
    Ok(())
}
