//! Issue 23, limits that agree end to end, on real `meshd` and `mesh-host` processes: a 50 MB
//! model is refused by `check` and `apply` before anything is stored, and the largest model the
//! limits accept applies with no leader change. One bed for both: it is the setup that costs.

use std::time::Instant;

use mesh::core::validate::model_bytes_max;
use mesh_beds::{Bed, binaries, sized_model};

const pair: &str = include_str!("../beds/meshes/pair.toml");

/// The highest term any replica reports in `status`.
fn term(bed: &Bed) -> anyhow::Result<u64> {
    let status = bed.status()?;
    let replicas = status["replicas"].as_array().cloned().unwrap_or_default();
    Ok(replicas
        .iter()
        .filter_map(|r| r["epoch"].as_u64())
        .max()
        .unwrap_or(0))
}

fn revision(bed: &Bed) -> anyhow::Result<u64> {
    bed.status()?["revision"]
        .as_u64()
        .ok_or_else(|| anyhow::anyhow!("status has no revision"))
}

#[test]
fn a_50_mb_model_is_refused_at_once_and_the_largest_accepted_model_applies_without_an_election()
-> anyhow::Result<()> {
    // Issue 23: the user's 50 MB mesh.toml (one module with a 50 MB file on g14) was accepted,
    // took 80 s to apply, caused five elections and a send that could never be delivered. Now
    // check and apply refuse it naming machine, module, size and limit, and the store is
    // unchanged; a model of model_bytes_max, every declaration deliverable, applies in the
    // term it started in.
    let bed = Bed::start(binaries!(), 3, pair)?;
    bed.leader_other_than(None)?;
    bed.apply(pair, "first model")?;
    let before = revision(&bed)?;

    let blob = "x".repeat(50 * 1000 * 1000);
    let huge = format!(
        "{pair}\n[modules.big]\nmachine = \"g14\"\ncommand = \"sleep\"\nargs = [\"600\"]\nfiles = {{ \"blob\" = \"{blob}\" }}\n"
    );
    let file = bed.dir.join("huge.toml");
    std::fs::write(&file, &huge)?;
    let file = file.display().to_string();
    for args in [
        vec!["check", "-f", &file],
        vec!["apply", "-f", &file, "--why", "50 MB"],
    ] {
        let started = Instant::now();
        let run = bed.meshctl(&args)?;
        println!(
            "{} of a 50 MB model refused after {} ms",
            args[0],
            started.elapsed().as_millis()
        );
        assert_eq!(
            run.code,
            Some(2),
            "{}: {}{}",
            args[0],
            run.stdout,
            run.stderr
        );
        let limit = mesh::core::validate::declaration_bytes_max;
        assert!(
            run.stderr.contains("modules.big: the declaration of machine g14 would encode to ")
                && run.stderr.contains(&format!("over the limit of {limit} bytes one machine's declaration may have (declaration_bytes_max)"))
                && run.stderr.contains("module `big` is its largest part"),
            "{}: {}",
            args[0],
            run.stderr
        );
    }
    assert_eq!(revision(&bed)?, before, "nothing was stored");

    let largest = sized_model(pair, model_bytes_max - 64 * 1024);
    let term_before = term(&bed)?;
    let started = Instant::now();
    bed.apply(&largest, "the largest model")?;
    println!(
        "a model of {} bytes of mesh file applied in {} ms",
        largest.len(),
        started.elapsed().as_millis()
    );
    assert!(revision(&bed)? > before);
    assert_eq!(term(&bed)?, term_before, "no election during the apply");
    bed.no_replica_panicked()
}
