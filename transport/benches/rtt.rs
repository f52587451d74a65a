//! Transport benchmark: request round trips per second over mesh QUIC on loopback with 1 and 64
//! concurrent streams, bulk throughput of 1 MiB requests, and a plain std UDP ping-pong measured
//! in the same run as the floor. Run with `cargo bench -p mesh-transport --bench rtt`.

use std::net::{SocketAddr, UdpSocket};
use std::sync::Arc;
use std::time::{Duration, Instant};

use mesh_transport::{
    BoxFuture, Ca, Endpoint, Handler, Identity, MessageKind, Principal, TransportConfig, Validity,
};

/// How long each measurement runs.
const measure_ms: u64 = 3000;
/// Body of a small request (about a Raft heartbeat).
const small_body_bytes: usize = 64;
/// Body of a bulk request.
const bulk_body_bytes: usize = 1024 * 1024;
/// Concurrent callers for the parallel measurement.
const concurrent_streams: usize = 64;
/// Deadline for one benchmark request.
const request_timeout_ms: u64 = 10_000;

/// Echoes small bodies; answers bulk bodies with their length only.
struct Echo;

impl Handler for Echo {
    fn request(
        &self,
        _from: Principal,
        _kind: MessageKind,
        body: Vec<u8>,
    ) -> BoxFuture<'_, Result<Vec<u8>, String>> {
        Box::pin(async move {
            if body.len() > small_body_bytes {
                Ok((body.len() as u64).to_le_bytes().to_vec())
            } else {
                Ok(body)
            }
        })
    }

    fn one_way(&self, _from: Principal, _kind: MessageKind, _body: Vec<u8>) -> BoxFuture<'_, ()> {
        Box::pin(async {})
    }
}

fn identity(ca: &Ca, principal: &Principal) -> anyhow::Result<Identity> {
    let issued = ca.issue(principal, Validity::days_from_now(1))?;
    Ok(Identity::from_pem(
        ca.cert_pem(),
        issued.cert_pem(),
        issued.key_pem(),
    )?)
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let at = ((sorted.len() - 1) as f64 * p).round() as usize;
    sorted[at.min(sorted.len() - 1)]
}

async fn sequential(client: &Endpoint, server: SocketAddr) -> anyhow::Result<()> {
    let timeout = Duration::from_millis(request_timeout_ms);
    let body = vec![7u8; small_body_bytes];
    let mut latencies = Vec::new();
    let started = Instant::now();
    while started.elapsed() < Duration::from_millis(measure_ms) {
        let one = Instant::now();
        client
            .request(server, MessageKind::Raft, body.clone(), timeout)
            .await?;
        latencies.push(one.elapsed());
    }
    let secs = started.elapsed().as_secs_f64();
    latencies.sort();
    println!(
        "quic 1 stream:    {:>9.0} round trips/s  p50 {:>5} us  p99 {:>5} us",
        latencies.len() as f64 / secs,
        percentile(&latencies, 0.50).as_micros(),
        percentile(&latencies, 0.99).as_micros()
    );
    Ok(())
}

async fn concurrent(client: &Endpoint, server: SocketAddr) -> anyhow::Result<()> {
    let started = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..concurrent_streams {
        let client = client.clone();
        tasks.push(tokio::spawn(async move {
            let timeout = Duration::from_millis(request_timeout_ms);
            let body = vec![7u8; small_body_bytes];
            let mut count = 0u64;
            while started.elapsed() < Duration::from_millis(measure_ms) {
                client
                    .request(server, MessageKind::Raft, body.clone(), timeout)
                    .await?;
                count += 1;
            }
            Ok::<u64, mesh_transport::TransportError>(count)
        }));
    }
    let mut total = 0;
    for task in tasks {
        total += task.await??;
    }
    let secs = started.elapsed().as_secs_f64();
    println!(
        "quic {concurrent_streams} streams:   {:>9.0} round trips/s",
        total as f64 / secs
    );
    Ok(())
}

async fn bulk(client: &Endpoint, server: SocketAddr) -> anyhow::Result<()> {
    let timeout = Duration::from_millis(request_timeout_ms);
    let body = vec![7u8; bulk_body_bytes];
    let mut count = 0u64;
    let started = Instant::now();
    while started.elapsed() < Duration::from_millis(measure_ms) {
        client
            .request(server, MessageKind::Raft, body.clone(), timeout)
            .await?;
        count += 1;
    }
    let secs = started.elapsed().as_secs_f64();
    // One request carries one MiB, so requests per second is MiB per second.
    println!("quic bulk 1 MiB:  {:>9.1} MiB/s", count as f64 / secs);
    Ok(())
}

/// The floor: the same loopback, no QUIC, no TLS, no framing.
fn udp_ping_pong() -> anyhow::Result<()> {
    let server = UdpSocket::bind("127.0.0.1:0")?;
    let client = UdpSocket::bind("127.0.0.1:0")?;
    let wait = Some(Duration::from_millis(request_timeout_ms));
    server.set_read_timeout(Some(Duration::from_millis(200)))?;
    client.set_read_timeout(wait)?;
    let server_addr = server.local_addr()?;
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let stop_echo = stop.clone();
    let echo = std::thread::spawn(move || {
        let mut buf = [0u8; 2048];
        while !stop_echo.load(std::sync::atomic::Ordering::Relaxed) {
            if let Ok((len, from)) = server.recv_from(&mut buf) {
                let _ = server.send_to(&buf[..len], from);
            }
        }
    });
    let body = [7u8; small_body_bytes];
    let mut buf = [0u8; 2048];
    let mut latencies = Vec::new();
    let started = Instant::now();
    while started.elapsed() < Duration::from_millis(measure_ms) {
        let one = Instant::now();
        client.send_to(&body, server_addr)?;
        client.recv_from(&mut buf)?;
        latencies.push(one.elapsed());
    }
    let secs = started.elapsed().as_secs_f64();
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let _ = echo.join();
    latencies.sort();
    println!(
        "udp ping-pong:    {:>9.0} round trips/s  p50 {:>5} us  p99 {:>5} us",
        latencies.len() as f64 / secs,
        percentile(&latencies, 0.50).as_micros(),
        percentile(&latencies, 0.99).as_micros()
    );
    Ok(())
}

fn machine() -> String {
    let cpus = std::thread::available_parallelism().map_or(0, |n| n.get());
    let model = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|text| {
            text.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|m| m.trim().to_string())
        })
        .unwrap_or_else(|| "unknown CPU".to_string());
    format!("{cpus} CPUs, {model}")
}

fn main() -> anyhow::Result<()> {
    println!("machine: {}", machine());
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async {
        let ca = Ca::create(Validity::days_from_now(1))?;
        let config = TransportConfig::default().check()?;
        let any: SocketAddr = "127.0.0.1:0".parse()?;
        let server = Endpoint::bind(any, &identity(&ca, &Principal::Replica(1))?, config.clone())?;
        server.serve(Arc::new(Echo));
        let client = Endpoint::bind(any, &identity(&ca, &Principal::Replica(2))?, config)?;
        let addr = server.local_addr();
        sequential(&client, addr).await?;
        concurrent(&client, addr).await?;
        bulk(&client, addr).await?;
        anyhow::Ok(())
    })?;
    udp_ping_pong()
}
