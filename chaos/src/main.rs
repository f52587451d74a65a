//! `cargo run -p mesh-chaos -- fuzz --seconds N [--seed S]`: fuzzes every decoder a peer can
//! reach for about N seconds in all (split evenly between the targets), counting each input's
//! allocations, and prints executions and findings per decoder. Exits 1 on any finding.

use std::process::ExitCode;
use std::time::Duration;

use mesh_chaos::fuzz::{Budget, CountingAlloc, fuzz, targets};

#[global_allocator]
static allocator: CountingAlloc = CountingAlloc;

const usage: &str = "usage: mesh-chaos fuzz --seconds N [--seed S]";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut seconds: Option<u64> = None;
    let mut seed: u64 = 1;
    let mut rest = args.iter();
    if rest.next().map(String::as_str) != Some("fuzz") {
        eprintln!("{usage}");
        return ExitCode::from(2);
    }
    while let Some(flag) = rest.next() {
        let value = rest.next().and_then(|v| v.parse::<u64>().ok());
        match (flag.as_str(), value) {
            ("--seconds", Some(v)) => seconds = Some(v),
            ("--seed", Some(v)) => seed = v,
            _ => {
                eprintln!("mesh-chaos: {flag} needs a number; {usage}");
                return ExitCode::from(2);
            }
        }
    }
    let Some(seconds) = seconds else {
        eprintln!("mesh-chaos: give --seconds; {usage}");
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
