//! The short, fixed-seed fuzz run of every decoder a peer can reach (issue 11 part 7, decision
//! 0201); the long one is `cargo run -p mesh-chaos -- fuzz --seconds N`.

use mesh_chaos::fuzz::{Budget, CountingAlloc, fuzz};

#[global_allocator]
static allocator: CountingAlloc = CountingAlloc;

/// Inputs per decoder: a second or two for all of them in a debug build.
const executions: u64 = 20_000;

#[test]
fn no_decoder_a_peer_reaches_panics_overallocates_or_accepts_a_changed_envelope() {
    CountingAlloc::installed();
    let report = fuzz(0x6d65_7368, Budget::Executions(executions));
    for (name, tally) in &report.tallies {
        assert_eq!(tally.executions, executions, "{name}");
        assert!(tally.mutated > executions / 2, "{name}: {tally:?}");
    }
    assert_eq!(report.tallies.len(), 9);
    let shown: Vec<String> = report
        .findings
        .iter()
        .take(5)
        .map(|f| {
            format!(
                "{}: {} ({} bytes: {})",
                f.target, f.what, f.input_len, f.input
            )
        })
        .collect();
    assert!(
        report.findings.is_empty(),
        "{} findings with seed {}, first: {shown:#?}",
        report.findings.len(),
        report.seed
    );
}
