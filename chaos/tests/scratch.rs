//! scratch
use mesh_chaos::{Mix, RunSpec, run};
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scratch() {
    let mix = match std::env::var("MIX").as_deref() { Ok("stale") => Mix::StaleLeaders, Ok("all") => Mix::Everything, _ => Mix::Partitions };
    let outcome = run(RunSpec::new(7, mix)).await;
    eprintln!("{}", outcome.history);
    eprintln!("seed {}: {}", outcome.seed, outcome.stats);
}
