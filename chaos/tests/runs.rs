//! Seeded chaos runs: three replicas, clients, leader actors and simulated hosts under a nemesis,
//! each checked for lost writes (G4), stale epochs applied (G2) or sent (G3) and regressing
//! accounts (G5). A failure prints its seed; `CHAOS_SEED=<n>` replays it.

use mesh_chaos::{Mix, RunSpec, run};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_acknowledged_write_is_lost_under_partitions() {
    // Replication under partitions: isolation, one-way cuts, drops, delays, held messages.
    let outcome = run(RunSpec::new(0x5eed_0001, Mix::Partitions)).await;
    eprintln!("seed {}: {}", outcome.seed, outcome.stats);
    assert!(outcome.stats.writes_acked > 0, "the run acknowledged writes");
}
