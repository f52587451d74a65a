//! Commit benchmark: committed commands per second and latency with 1, 64 and 500 concurrent
//! proposers on three in-process replicas over the router, real redb files with fsync; beside it the
//! machine's fsync floor (small write + fdatasync in a loop). Run with `cargo bench -p mesh-raft`.

use std::collections::BTreeMap;
use std::io::Write;
use std::sync::Arc;
use std::time::{Duration, Instant};

use openraft::ServerState;

use mesh_raft::kv::{KvApp, Set};
use mesh_raft::router::Router;
use mesh_raft::{BasicNode, RaftSettings, Replica, ReplicaSpec};

const replicas: u64 = 3;
const value_bytes: usize = 256;
const fsync_rounds: usize = 500;
const warmup: Duration = Duration::from_secs(1);
const measure: Duration = Duration::from_secs(5);
const leader_deadline: Duration = Duration::from_secs(30);

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let at = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[at]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

fn fsync_floor(dir: &std::path::Path) -> anyhow::Result<()> {
    let mut file = std::fs::File::create(dir.join("fsync-probe"))?;
    let block = [7u8; 64];
    let mut times = Vec::with_capacity(fsync_rounds);
    for _ in 0..fsync_rounds {
        let start = Instant::now();
        file.write_all(&block)?;
        file.sync_data()?;
        times.push(start.elapsed());
    }
    times.sort();
    let total: Duration = times.iter().sum();
    println!(
        "fsync floor: {fsync_rounds} × (64 B write + fdatasync): {:.0}/s, p50 {:.3} ms, p99 {:.3} ms",
        fsync_rounds as f64 / total.as_secs_f64(),
        ms(percentile(&times, 0.5)),
        ms(percentile(&times, 0.99))
    );
    Ok(())
}

struct Bench {
    _root: tempfile::TempDir,
    replicas: Vec<Replica<KvApp>>,
}

async fn start_cluster() -> anyhow::Result<Bench> {
    // On the real disk (the target dir), not a tmpfs: fsync must cost what it costs.
    let root = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR"))?;
    let router = Router::new(1);
    let config = RaftSettings::default().validate()?;
    let nodes: BTreeMap<u64, BasicNode> = (1..=replicas)
        .map(|id| (id, BasicNode::new(format!("replica-{id}"))))
        .collect();
    let mut started = Vec::new();
    for id in 1..=replicas {
        let spec = ReplicaSpec {
            id,
            dir: root.path().join(format!("replica-{id}")),
            config: config.clone(),
            term_floor: 0,
            bootstrap: Some(nodes.clone()),
        };
        let replica = Replica::start(spec, router.network(id), Arc::new(KvApp)).await?;
        router.add(id, replica.raft().clone());
        started.push(replica);
    }
    Ok(Bench {
        _root: root,
        replicas: started,
    })
}

async fn leader(bench: &Bench) -> anyhow::Result<usize> {
    let deadline = Instant::now() + leader_deadline;
    loop {
        for (i, r) in bench.replicas.iter().enumerate() {
            if r.metrics().borrow().state == ServerState::Leader {
                return Ok(i);
            }
        }
        anyhow::ensure!(Instant::now() < deadline, "no leader elected");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn proposer(
    replica: &Replica<KvApp>,
    worker: usize,
    until: Instant,
) -> anyhow::Result<Vec<Duration>> {
    let mut latencies = Vec::new();
    let mut n = 0u64;
    while Instant::now() < until {
        let command = Set {
            key: format!("w{worker}-{n}"),
            value: vec![b'x'; value_bytes],
        }
        .encode()?;
        let start = Instant::now();
        replica.propose(command).await?;
        latencies.push(start.elapsed());
        n += 1;
    }
    Ok(latencies)
}

async fn run_level(replica: &Replica<KvApp>, clients: usize) -> anyhow::Result<()> {
    let warm_until = Instant::now() + warmup;
    let warm = (0..clients).map(|w| proposer(replica, w, warm_until));
    futures::future::try_join_all(warm).await?;
    let entries_before = replica.metrics().borrow().last_log_index.unwrap_or(0);
    let start = Instant::now();
    let until = start + measure;
    let runs = (0..clients).map(|w| proposer(replica, w + clients, until));
    let results = futures::future::try_join_all(runs).await?;
    let elapsed = start.elapsed();
    let entries = replica.metrics().borrow().last_log_index.unwrap_or(0) - entries_before;
    let mut all: Vec<Duration> = results.into_iter().flatten().collect();
    all.sort();
    println!(
        "clients {clients:>3}: {:>7.0} commits/s, p50 {:>7.2} ms, p99 {:>7.2} ms ({} commits in {} entries, {:.1} per entry)",
        all.len() as f64 / elapsed.as_secs_f64(),
        ms(percentile(&all, 0.5)),
        ms(percentile(&all, 0.99)),
        all.len(),
        entries,
        all.len() as f64 / entries.max(1) as f64
    );
    Ok(())
}

fn main() -> anyhow::Result<()> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async {
        let probe = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR"))?;
        fsync_floor(probe.path())?;
        let bench = start_cluster().await?;
        let leader = leader(&bench).await?;
        let replica = &bench.replicas[leader];
        println!(
            "3 replicas over the in-memory router, {value_bytes} B values, {}s per level after {}s warm-up",
            measure.as_secs(),
            warmup.as_secs()
        );
        for clients in [1, 64, 500] {
            run_level(replica, clients).await?;
        }
        for r in bench.replicas {
            r.shutdown().await?;
        }
        Ok(())
    })
}
