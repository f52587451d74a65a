//! Measures what model sizes a bed of three real `meshd` carries without an election (issue 23,
//! decision 0298): applies models of growing size and prints, for each, how long `apply` took,
//! the term before and after and the highest term seen while watching `status` for a few
//! seconds after. Figures in docs/benchmarks.md. Run after `cargo build --bins`:
//!
//! ```text
//! MESH_BED_MESHD=target/debug/meshd MESH_BED_HOST=target/debug/mesh-host \
//!   MESH_BED_MESHCTL=target/debug/meshctl cargo run -p mesh-beds --example model_sizes -- 4 8 16 32
//! ```

use std::time::{Duration, Instant};

use anyhow::{Context, anyhow};
use mesh_beds::{Bed, Binaries, sized_model};

const pair: &str = include_str!("../meshes/pair.toml");

/// How long `status` is watched after each apply, in milliseconds.
const watch_ms: u64 = 5_000;

fn main() -> anyhow::Result<()> {
    let sizes: Vec<usize> = std::env::args()
        .skip(1)
        .map(|a| a.parse::<usize>().context("sizes in MiB"))
        .collect::<anyhow::Result<_>>()?;
    let bins = Binaries {
        meshd: "meshd".into(),
        host: "mesh-host".into(),
        meshctl: "meshctl".into(),
    }
    .overridden();
    let bed = Bed::start(bins, 3, pair)?;
    bed.leader_other_than(None)?;
    bed.apply(pair, "first model")?;
    for mib in sizes {
        let text = sized_model(pair, mib * 1024 * 1024);
        let before = terms(&bed)?;
        let started = Instant::now();
        let file = bed.dir.join("sized.toml");
        std::fs::write(&file, &text).context("write model")?;
        let run = bed.meshctl(&["apply", "-f", &file.display().to_string(), "--why", "size"])?;
        let took = started.elapsed();
        let mut highest = before;
        let mut failed_reads = 0;
        let watch = Instant::now();
        while watch.elapsed() < Duration::from_millis(watch_ms) {
            match terms(&bed) {
                Ok(t) => highest = highest.max(t),
                Err(_) => failed_reads += 1,
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        let revision = bed.status()?["revision"].as_u64().unwrap_or(0);
        println!(
            "model {mib} MiB ({} bytes of mesh file): apply exit {:?} in {} ms, term {before} -> {highest} (watched {watch_ms} ms after), status failures {failed_reads}, revision {revision}{}",
            text.len(),
            run.code,
            took.as_millis(),
            if run.code == Some(0) {
                String::new()
            } else {
                format!(": {}", run.stderr.trim())
            }
        );
    }
    Ok(())
}

/// The highest term any replica reports.
fn terms(bed: &Bed) -> anyhow::Result<u64> {
    let status = bed.status()?;
    let replicas = status["replicas"]
        .as_array()
        .ok_or_else(|| anyhow!("no replicas in {status}"))?;
    Ok(replicas
        .iter()
        .filter_map(|r| r["epoch"].as_u64())
        .max()
        .unwrap_or(0))
}
