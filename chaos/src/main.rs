//! `cargo run --release -p mesh-chaos -- --runs N [--mix NAME] [--seed S] [--chaos-ms MS] [--minutes M] [--jobs J]`:
//! seeded chaos runs over the real controller, a table per mix (runs, faults by kind, checks,
//! violations, undecided runs); exits 1 on any violation, undecided or stuck run, printing its seed and replay command.
//! `--jobs J` splits the seeds into J ranges run at once by child processes of this binary (the
//! tracing layer a run reads is global per process) and adds their tables up.
//!
//! `cargo run -p mesh-chaos -- fuzz --seconds N [--seed S]`: fuzzes every decoder a peer can
//! reach for about N seconds in all (split evenly between the targets), counting each input's
//! allocations, and prints executions and findings per decoder. Exits 1 on any finding.

use std::collections::BTreeMap;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use mesh_chaos::fuzz::{Budget, CountingAlloc, fuzz, targets};
use mesh_chaos::nemesis::Mix;
use mesh_chaos::run::{RunSpec, run};

#[global_allocator]
static allocator: CountingAlloc = CountingAlloc;

/// Child processes at once at most (`--jobs`).
const jobs_max: u64 = 8;

const usage: &str = "usage: mesh-chaos --runs N [--mix partitions|stale-leaders|processes|stores|new-disks|everything|hostile] [--seed S] [--chaos-ms MS] [--minutes M] [--jobs J]\n       mesh-chaos fuzz --seconds N [--seed S]\n       mesh-chaos sim [--seed S] [--seeds N] [--calm] [--trace] [--jobs J]";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("fuzz") {
        return fuzz_main(&args[1..]);
    }
    if args.first().map(String::as_str) == Some("sim") {
        // `MESH_SIM_LOG=info` (a tracing filter): the product's own log lines of a replayed seed,
        // on stderr, to see what a failing seed's replicas did.
        if let Ok(filter) = std::env::var("MESH_SIM_LOG") {
            tracing_subscriber::fmt()
                .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
                .with_writer(std::io::stderr)
                .init();
        }
        return sim_main(&args[1..]);
    }
    runs_main(&args)
}

struct RunArgs {
    runs: u64,
    mixes: Vec<Mix>,
    seed: u64,
    chaos_ms: u64,
    /// Stop starting runs of a mix after this long (the table says how many ran).
    minutes: Option<u64>,
    /// Child processes running disjoint seed ranges at once (1: the runs here).
    jobs: u64,
    /// Print only the tally line and failures (a `--jobs` child).
    tally_only: bool,
}

fn parse_runs(args: &[String]) -> Result<RunArgs, String> {
    let mut out = RunArgs {
        runs: 0,
        mixes: Mix::all.to_vec(),
        seed: 1,
        chaos_ms: RunSpec::new(0, Mix::Everything).chaos_ms,
        minutes: None,
        jobs: 1,
        tally_only: false,
    };
    let mut runs = None;
    let mut rest = args.iter();
    while let Some(flag) = rest.next() {
        let value = rest.next().ok_or_else(|| format!("{flag} needs a value"))?;
        let number = || {
            value
                .parse::<u64>()
                .map_err(|_| format!("{flag} needs a number, not {value:?}"))
        };
        match flag.as_str() {
            "--runs" => runs = Some(number()?),
            "--seed" => out.seed = number()?,
            "--chaos-ms" => out.chaos_ms = number()?,
            "--minutes" => out.minutes = Some(number()?),
            "--jobs" => {
                out.jobs = number()?;
                if out.jobs == 0 || out.jobs > jobs_max {
                    return Err(format!(
                        "--jobs {} is out of range: give 1 to {jobs_max} (each job is a process with three replicas and three hosts)",
                        out.jobs
                    ));
                }
            }
            "--tally" => out.tally_only = number()? == 1,
            "--mix" => {
                let mix = Mix::named(value).ok_or_else(|| {
                    format!("no mix {value:?}; the mixes are partitions, stale-leaders, processes, stores, new-disks, everything, hostile")
                })?;
                out.mixes = vec![mix];
            }
            other => return Err(format!("unknown flag {other}")),
        }
    }
    out.runs = runs.ok_or("give --runs N")?;
    Ok(out)
}

fn runs_main(args: &[String]) -> ExitCode {
    let parsed = match parse_runs(args) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("mesh-chaos: {e}\n{usage}");
            return ExitCode::from(2);
        }
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("mesh-chaos: cannot start the runtime: {e}");
            return ExitCode::from(1);
        }
    };
    let mut failed = false;
    for mix in &parsed.mixes {
        failed |= runtime.block_on(one_mix(*mix, &parsed));
    }
    if failed {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    }
}

/// What the runs of one mix did, summed; one table. A child of `--jobs` prints its tally as one
/// line ([`Tally::line`]) and the parent adds the lines up.
#[derive(Debug, Default)]
struct Tally {
    faults: BTreeMap<String, u64>,
    done: u64,
    checks: u64,
    violations: u64,
    /// Runs with a key the linearizability search could not decide (hit its state limit).
    undecided: u64,
    stuck: u64,
    requests: u64,
    acked: u64,
    reads: u64,
    writes: u64,
    applies: u64,
    failures: Vec<String>,
}

/// Starts the machine-readable tally line of a `--jobs` child.
const tally_tag: &str = "TALLY";
/// Starts a failure line of a `--jobs` child (and of the table).
const failed_tag: &str = "FAILED";

impl Tally {
    fn add(&mut self, other: Tally) {
        for (f, n) in other.faults {
            *self.faults.entry(f).or_default() += n;
        }
        self.done += other.done;
        self.checks += other.checks;
        self.violations += other.violations;
        self.undecided += other.undecided;
        self.stuck += other.stuck;
        self.requests += other.requests;
        self.acked += other.acked;
        self.reads += other.reads;
        self.writes += other.writes;
        self.applies += other.applies;
        self.failures.extend(other.failures);
    }

    /// The counts as `TALLY key=n ...` (fault kinds as `fault:<name>=n`).
    fn line(&self) -> String {
        let mut out = format!(
            "{tally_tag} done={} checks={} violations={} undecided={} stuck={} requests={} acked={} reads={} writes={} applies={}",
            self.done,
            self.checks,
            self.violations,
            self.undecided,
            self.stuck,
            self.requests,
            self.acked,
            self.reads,
            self.writes,
            self.applies
        );
        for (f, n) in &self.faults {
            out.push_str(&format!(" fault:{f}={n}"));
        }
        out
    }

    /// Reads a [`Tally::line`] back; `Err` names the word it could not read.
    fn parse(line: &str) -> Result<Tally, String> {
        let mut t = Tally::default();
        for word in line.split_whitespace().skip(1) {
            let (key, n) = word
                .split_once('=')
                .and_then(|(k, v)| v.parse::<u64>().ok().map(|n| (k, n)))
                .ok_or_else(|| format!("a tally word {word:?} is not key=number"))?;
            match key {
                "done" => t.done = n,
                "checks" => t.checks = n,
                "violations" => t.violations = n,
                "undecided" => t.undecided = n,
                "reads" => t.reads = n,
                "stuck" => t.stuck = n,
                "requests" => t.requests = n,
                "acked" => t.acked = n,
                "writes" => t.writes = n,
                "applies" => t.applies = n,
                other => match other.strip_prefix("fault:") {
                    Some(f) => {
                        t.faults.insert(f.to_string(), n);
                    }
                    None => return Err(format!("unknown tally key {other:?}")),
                },
            }
        }
        Ok(t)
    }

    fn print(&self, mix: Mix, seconds: f64, jobs: u64) {
        println!();
        println!(
            "mix {mix}: {} runs checked, {} stuck, in {seconds:.0} s{}",
            self.done,
            self.stuck,
            if jobs > 1 {
                format!(" ({jobs} processes at once)")
            } else {
                String::new()
            }
        );
        println!("{:<22} {:>8}", "fault", "injected");
        for (f, n) in &self.faults {
            println!("{f:<22} {n:>8}");
        }
        println!("{:<22} {:>8}", "operator requests", self.requests);
        println!("{:<22} {:>8}", "  acknowledged", self.acked);
        println!("{:<22} {:>8}", "  reads (settings, plan)", self.reads);
        println!("{:<22} {:>8}", "envelope writes", self.writes);
        println!("{:<22} {:>8}", "host applies", self.applies);
        println!("{:<22} {:>8}", "checks", self.checks);
        println!("{:<22} {:>8}", "violations", self.violations);
        println!("{:<22} {:>8}", "undecided runs", self.undecided);
        for f in &self.failures {
            println!("{failed_tag} {mix} {f}");
        }
    }
}

/// Runs one mix (here, or in `--jobs` child processes) and prints its table; true when a run
/// failed.
async fn one_mix(mix: Mix, parsed: &RunArgs) -> bool {
    let started = Instant::now();
    let tally = if parsed.jobs > 1 {
        match jobs(mix, parsed).await {
            Ok(t) => t,
            Err(e) => {
                eprintln!("mesh-chaos: {mix}: {e}");
                return true;
            }
        }
    } else {
        runs_here(mix, parsed).await
    };
    if parsed.tally_only {
        println!("{}", tally.line());
        for f in &tally.failures {
            println!("{failed_tag} {mix} {f}");
        }
    } else {
        tally.print(mix, started.elapsed().as_secs_f64(), parsed.jobs);
    }
    !tally.failures.is_empty()
}

/// The runs of `mix` in this process, one after the other (the tracing layer is global).
async fn runs_here(mix: Mix, parsed: &RunArgs) -> Tally {
    let started = Instant::now();
    let mut t = Tally::default();
    for seed in parsed.seed..parsed.seed.saturating_add(parsed.runs) {
        if let Some(m) = parsed.minutes
            && started.elapsed() >= Duration::from_secs(m * 60)
        {
            eprintln!(
                "{mix}: the {m}-minute budget is spent; stopping after {} runs",
                seed - parsed.seed
            );
            break;
        }
        let spec = RunSpec {
            seed,
            mix,
            chaos_ms: parsed.chaos_ms,
        };
        let run_started = Instant::now();
        match run(spec.clone()).await {
            Ok(outcome) => {
                t.done += 1;
                t.checks += outcome.checks as u64;
                t.violations += outcome.violations.len() as u64;
                t.requests += outcome.stats.ops.requests;
                t.acked += outcome.stats.ops.acked;
                t.reads += outcome.stats.ops.reads;
                t.writes += outcome.stats.writes;
                t.applies += outcome.stats.applies;
                for (f, n) in &outcome.stats.faults {
                    *t.faults.entry(f.name().to_string()).or_default() += n;
                }
                eprintln!(
                    "{mix} seed {seed}: {} violations in {:.1} s; {}",
                    outcome.violations.len(),
                    run_started.elapsed().as_secs_f64(),
                    outcome.stats
                );
                if !outcome.undecided.is_empty() {
                    t.undecided += 1;
                    eprintln!(
                        "{mix} seed {seed}: UNDECIDED (linearizability search limit): {}",
                        outcome.undecided.join("; ")
                    );
                    t.failures.push(format!(
                        "seed {seed}: undecided ({}); replay: {}",
                        outcome.undecided.join("; "),
                        spec.replay()
                    ));
                }
                if !outcome.violations.is_empty() {
                    eprintln!("{}", outcome.report);
                    t.failures.push(format!(
                        "seed {seed}: {} violations; replay: {}",
                        outcome.violations.len(),
                        spec.replay()
                    ));
                }
            }
            Err(e) => {
                t.stuck += 1;
                eprintln!("{mix} seed {seed}: STUCK: {e}");
                t.failures.push(format!(
                    "seed {seed}: stuck ({e}); replay: {}",
                    spec.replay()
                ));
            }
        }
    }
    t
}

/// `--jobs N`: the seeds split into N disjoint runs of consecutive seeds, each in a child process
/// of this binary (`--tally`), all at once; their tallies added up. Each child has its own
/// tracing layer, and its runs' lines go to the same stderr.
async fn jobs(mix: Mix, parsed: &RunArgs) -> Result<Tally, String> {
    let exe = std::env::current_exe().map_err(|e| format!("cannot find this binary: {e}"))?;
    let n = parsed.jobs.min(parsed.runs.max(1));
    let per = parsed.runs.div_ceil(n);
    let mut children = Vec::new();
    for k in 0..n {
        let first = parsed.seed.saturating_add(k * per);
        let runs = per.min(parsed.runs.saturating_sub(k * per));
        if runs == 0 {
            continue;
        }
        let mut cmd = tokio::process::Command::new(&exe);
        cmd.arg("--runs")
            .arg(runs.to_string())
            .arg("--seed")
            .arg(first.to_string())
            .arg("--mix")
            .arg(mix.name())
            .arg("--chaos-ms")
            .arg(parsed.chaos_ms.to_string())
            .arg("--tally")
            .arg("1")
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::inherit())
            .kill_on_drop(true);
        if let Some(m) = parsed.minutes {
            cmd.arg("--minutes").arg(m.to_string());
        }
        let child = cmd
            .spawn()
            .map_err(|e| format!("cannot start child {k} ({}): {e}", exe.display()))?;
        children.push((k, first, runs, child));
    }
    let mut total = Tally::default();
    let mut errors = Vec::new();
    for (k, first, runs, child) in children {
        // No wait of its own: a child's runs end by their own deadlines (and --minutes).
        let out = child
            .wait_with_output()
            .await
            .map_err(|e| format!("child {k} (seeds {first}..{}) : {e}", first + runs))?;
        let text = String::from_utf8_lossy(&out.stdout);
        let mut seen = false;
        for line in text.lines() {
            if line.starts_with(tally_tag) {
                total.add(Tally::parse(line)?);
                seen = true;
            } else if let Some(rest) = line
                .strip_prefix(failed_tag)
                .and_then(|r| r.trim_start().strip_prefix(mix.name()))
            {
                total.failures.push(rest.trim_start().to_string());
            }
        }
        if !seen {
            errors.push(format!(
                "child {k} (seeds {first}..{}) printed no tally and exited {:?}",
                first + runs,
                out.status.code()
            ));
        }
    }
    if errors.is_empty() {
        Ok(total)
    } else {
        Err(errors.join("; "))
    }
}

fn fuzz_main(args: &[String]) -> ExitCode {
    let fuzz_usage = "usage: mesh-chaos fuzz --seconds N [--seed S]";
    let mut seconds: Option<u64> = None;
    let mut seed: u64 = 1;
    let mut rest = args.iter();
    while let Some(flag) = rest.next() {
        let value = rest.next().and_then(|v| v.parse::<u64>().ok());
        match (flag.as_str(), value) {
            ("--seconds", Some(v)) => seconds = Some(v),
            ("--seed", Some(v)) => seed = v,
            _ => {
                eprintln!("mesh-chaos: {flag} needs a number; {fuzz_usage}");
                return ExitCode::from(2);
            }
        }
    }
    let Some(seconds) = seconds else {
        eprintln!("mesh-chaos: give --seconds; {fuzz_usage}");
        return ExitCode::from(2);
    };
    CountingAlloc::installed();
    let each = Duration::from_secs(seconds) / targets().len().max(1) as u32;
    let report = fuzz(seed, Budget::Time(each));
    println!("seed {seed}, {} s per decoder", each.as_secs_f64());
    println!(
        "{:<50} {:>11} {:>10} {:>10} {:>12}",
        "decoder", "executions", "arbitrary", "mutated", "peak alloc"
    );
    for (name, t) in &report.tallies {
        println!(
            "{name:<50} {:>11} {:>10} {:>10} {:>12}",
            t.executions, t.arbitrary, t.mutated, t.peak_alloc
        );
    }
    for f in &report.findings {
        println!(
            "FINDING {}: {} ({} bytes: {})",
            f.target, f.what, f.input_len, f.input
        );
    }
    println!("{} findings", report.findings.len());
    if report.findings.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    }
}

/// `mesh-chaos sim [--seed S] [--seeds N] [--calm] [--trace] [--jobs J]`: the deterministic
/// simulator (`mesh_chaos::sim`), seeds `S..S+N`, one line per seed with its trace hash, in seed
/// order; `--calm` without faults; `--trace` writes each trace to
/// `$TMPDIR/mesh-sim-seed-<n>.trace`; `--jobs J` runs J seeds at once, each on an OS thread of its
/// own with its own one-thread runtime (a seed's run is the same whichever thread runs it). Exits
/// 1 on any violation or stuck run.
fn sim_main(args: &[String]) -> ExitCode {
    let sim_usage = "usage: mesh-chaos sim [--seed S] [--seeds N] [--calm] [--trace] [--jobs J]";
    let (mut seed, mut seeds, mut faults, mut write_trace) = (1u64, 1u64, true, false);
    let mut jobs = 1u64;
    let mut rest = args.iter();
    while let Some(flag) = rest.next() {
        match flag.as_str() {
            "--calm" => faults = false,
            "--trace" => write_trace = true,
            "--seed" | "--seeds" | "--jobs" => {
                let Some(n) = rest.next().and_then(|v| v.parse::<u64>().ok()) else {
                    eprintln!("mesh-chaos: {flag} needs a number; {sim_usage}");
                    return ExitCode::from(2);
                };
                match flag.as_str() {
                    "--seed" => seed = n,
                    "--seeds" => seeds = n,
                    _ => jobs = n.clamp(1, sim_jobs_max),
                }
            }
            other => {
                eprintln!("mesh-chaos: unknown argument {other:?}; {sim_usage}");
                return ExitCode::from(2);
            }
        }
    }
    let began = Instant::now();
    let end = seed.saturating_add(seeds);
    let next = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(seed));
    let (tx, rx) = std::sync::mpsc::channel::<(u64, String, bool)>();
    let mut workers = Vec::new();
    for _ in 0..jobs {
        let (next, tx) = (next.clone(), tx.clone());
        workers.push(std::thread::spawn(move || {
            loop {
                let n = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                if n >= end {
                    return;
                }
                let (text, failed) = sim_seed(n, faults, write_trace);
                if tx.send((n, text, failed)).is_err() {
                    return;
                }
            }
        }));
    }
    drop(tx);
    // Printed in seed order whatever order the threads finish in.
    let mut done: BTreeMap<u64, (String, bool)> = BTreeMap::new();
    let mut printed = seed;
    let mut failed = 0u64;
    for (n, text, bad) in rx {
        done.insert(n, (text, bad));
        while let Some((text, bad)) = done.remove(&printed) {
            print!("{text}");
            failed += u64::from(bad);
            printed += 1;
        }
    }
    for worker in workers {
        if worker.join().is_err() {
            failed += 1;
            println!("FAILED sim: a worker thread panicked");
        }
    }
    eprintln!(
        "{seeds} seeds in {:.1} s, {failed} failed",
        began.elapsed().as_secs_f64()
    );
    if failed > 0 {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    }
}

/// Most `--jobs` of `mesh-chaos sim`.
const sim_jobs_max: u64 = 64;

/// Runs seed `n` and says what it printed and whether it failed.
fn sim_seed(n: u64, faults: bool, write_trace: bool) -> (String, bool) {
    use std::fmt::Write;
    let one = Instant::now();
    let mut out = String::new();
    match mesh_chaos::sim::simulate(mesh_chaos::sim::SimSpec { seed: n, faults }) {
        Ok(outcome) => {
            let _ = writeln!(
                out,
                "seed {} trace {} steps {} simulated {} ms wall {} ms faults {} pushes applied {} datagrams {} dropped {} duplicated {} cut {} held {} silenced {} violations {}",
                outcome.seed,
                outcome.trace_hash,
                outcome.steps,
                outcome.simulated_ms,
                one.elapsed().as_millis(),
                outcome.faults,
                outcome.pushes_applied,
                outcome.net.sent,
                outcome.net.dropped,
                outcome.net.duplicated,
                outcome.net.cut,
                outcome.net.held,
                outcome.net.silenced,
                outcome.violations.len()
            );
            if write_trace {
                let path = mesh_chaos::sim::trace_path(n);
                if let Err(e) = std::fs::write(&path, mesh_chaos::sim::trace_text(&outcome.trace)) {
                    eprintln!("mesh-chaos: cannot write {}: {e}", path.display());
                }
            }
            if outcome.violations.is_empty() {
                return (out, false);
            }
            for v in &outcome.violations {
                let _ = writeln!(out, "  VIOLATION {v}");
            }
            let _ = writeln!(
                out,
                "FAILED sim seed {n}; replay: mesh-chaos sim --seed {n}"
            );
            (out, true)
        }
        Err(e) => {
            let _ = writeln!(out, "FAILED sim seed {n}: {e}");
            (out, true)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Tally;

    #[test]
    fn a_jobs_childs_tally_line_reads_back_as_the_same_counts() {
        // --jobs adds up what its children print: a count lost or misread there would make a
        // pass's table wrong.
        let mut t = Tally {
            done: 7,
            checks: 84,
            violations: 2,
            undecided: 1,
            stuck: 1,
            requests: 300,
            acked: 250,
            writes: 90,
            applies: 88,
            ..Tally::default()
        };
        t.faults.insert("isolate-leader".into(), 9);
        t.faults.insert("crash-mid-snapshot".into(), 3);
        let back = Tally::parse(&t.line()).expect("reads back");
        assert_eq!(back.line(), t.line());
        assert_eq!(back.faults.get("crash-mid-snapshot"), Some(&3));
        let mut sum = Tally::default();
        sum.add(back);
        sum.add(Tally::parse(&t.line()).expect("reads back"));
        assert_eq!((sum.done, sum.violations, sum.stuck), (14, 4, 2));
        assert!(Tally::parse("TALLY done=x").is_err());
    }
}
