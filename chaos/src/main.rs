//! `cargo run --release -p mesh-chaos -- --runs N [--mix NAME] [--seed S] [--chaos-ms MS] [--minutes M]`: seeded
//! chaos runs over the real controller, a table per mix (runs, faults by kind, checks,
//! violations); exits 1 on any violation or stuck run, printing its seed and replay command.
//!
//! `cargo run -p mesh-chaos -- fuzz --seconds N [--seed S]`: fuzzes every decoder a peer can
//! reach for about N seconds in all (split evenly between the targets), counting each input's
//! allocations, and prints executions and findings per decoder. Exits 1 on any finding.

use std::collections::BTreeMap;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use mesh_chaos::fuzz::{Budget, CountingAlloc, fuzz, targets};
use mesh_chaos::nemesis::{Fault, Mix};
use mesh_chaos::run::{RunSpec, run};

#[global_allocator]
static allocator: CountingAlloc = CountingAlloc;

const usage: &str = "usage: mesh-chaos --runs N [--mix partitions|stale-leaders|processes|stores|new-disks|everything] [--seed S] [--chaos-ms MS] [--minutes M]\n       mesh-chaos fuzz --seconds N [--seed S]";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("fuzz") {
        return fuzz_main(&args[1..]);
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
}

fn parse_runs(args: &[String]) -> Result<RunArgs, String> {
    let mut out = RunArgs {
        runs: 0,
        mixes: Mix::all.to_vec(),
        seed: 1,
        chaos_ms: RunSpec::new(0, Mix::Everything).chaos_ms,
        minutes: None,
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
            "--mix" => {
                let mix = Mix::named(value).ok_or_else(|| {
                    format!("no mix {value:?}; the mixes are partitions, stale-leaders, processes, stores, new-disks, everything")
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

/// Runs one mix and prints its table; true when a run failed.
async fn one_mix(mix: Mix, parsed: &RunArgs) -> bool {
    let started = Instant::now();
    let mut faults: BTreeMap<Fault, u64> = BTreeMap::new();
    let (mut done, mut checks, mut violations, mut stuck) = (0u64, 0u64, 0u64, 0u64);
    let (mut requests, mut acked, mut writes, mut applies) = (0u64, 0u64, 0u64, 0u64);
    let mut failures = Vec::new();
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
                done += 1;
                checks += outcome.checks as u64;
                violations += outcome.violations.len() as u64;
                requests += outcome.stats.ops.requests;
                acked += outcome.stats.ops.acked;
                writes += outcome.stats.writes;
                applies += outcome.stats.applies;
                for (f, n) in &outcome.stats.faults {
                    *faults.entry(*f).or_default() += n;
                }
                eprintln!(
                    "{mix} seed {seed}: {} violations in {:.1} s; {}",
                    outcome.violations.len(),
                    run_started.elapsed().as_secs_f64(),
                    outcome.stats
                );
                if !outcome.violations.is_empty() {
                    eprintln!("{}", outcome.report);
                    failures.push(format!(
                        "seed {seed}: {} violations; replay: {}",
                        outcome.violations.len(),
                        spec.replay()
                    ));
                }
            }
            Err(e) => {
                stuck += 1;
                eprintln!("{mix} seed {seed}: STUCK: {e}");
                failures.push(format!(
                    "seed {seed}: stuck ({e}); replay: {}",
                    spec.replay()
                ));
            }
        }
    }
    println!();
    println!(
        "mix {mix}: {done} runs checked, {stuck} stuck, in {:.0} s",
        started.elapsed().as_secs_f64()
    );
    println!("{:<22} {:>8}", "fault", "injected");
    for (f, n) in &faults {
        println!("{:<22} {n:>8}", f.name());
    }
    println!("{:<22} {requests:>8}", "operator requests");
    println!("{:<22} {acked:>8}", "  acknowledged");
    println!("{:<22} {writes:>8}", "envelope writes");
    println!("{:<22} {applies:>8}", "host applies");
    println!("{:<22} {checks:>8}", "checks");
    println!("{:<22} {violations:>8}", "violations");
    for f in &failures {
        println!("FAILED {mix} {f}");
    }
    !failures.is_empty()
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
