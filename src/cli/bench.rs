//! `meshctl bench`: write load through the operator API, shaped like `etcdctl check perf` (same
//! loads, same pass/fail rules), against the cluster of the context, so a reader can run it on
//! `meshctl dev` or a real cluster and compare it with etcd on the same machine (decision 0120).
//!
//! Each client holds its own QUIC connection (mutual TLS, the operator's certificate) to one
//! replica of the context, and writes `Request::SettingsSet` of one key of its own,
//! `meshctl-bench-<client>`, with a 1,024-byte value, on a machine layer (clients spread over the
//! model's machines). A generator offers writes at the load's rate into a channel as deep as the
//! clients, as etcd's does; the bench then removes every key it wrote, leaving each layer as it
//! found it (the settings history keeps the writes, as it keeps every write).

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use mesh_transport::{Endpoint, MessageKind, Peer, Principal, TransportConfig};
use tokio::sync::{Mutex, mpsc};

use super::client::{self, ClientError, answer_what, request_what};
use super::context::{self, Context};
use super::render;
use super::{CliError, Output, exit_done, exit_failed};
use crate::controller::api::{Answer, Body, Call, Request};
use crate::core::settings::{Layer, Scope};

pub mod reports;

/// Every key the bench writes starts with this; a layer holding one when a run starts is a run
/// that was interrupted (`meshctl bench --clean` removes them).
pub const key_prefix: &str = "meshctl-bench-";
/// Bytes of each value written: etcd's `check perf` writes 1,024-byte values.
pub const value_bytes: usize = 1024;
/// Most clients a run may have (etcd's `xl`).
pub const clients_max: u32 = 1000;
/// Highest write rate a run may offer, in writes per second (etcd's `xl` offers 15,000).
pub const rate_max: u32 = 20_000;
/// Longest run, in seconds.
pub const duration_s_max: u64 = 600;
/// How long one write may take before it counts as failed (etcd's check has no limit).
pub const write_timeout_ms: u64 = 30_000;
/// How long the writes still in flight when the run ends may take to finish.
pub const drain_ms_max: u64 = write_timeout_ms + 5_000;
/// How many clients dial at once while the bench sets up.
pub const dials_in_flight_max: usize = 32;
/// How far the generator may catch up after a late wake, in milliseconds of writes: a burst
/// of at most this much, so a blocked generator does not flood the clients afterwards.
pub const catch_up_ms_max: u64 = 10;
/// etcd's rules: throughput above this share of the offered rate...
pub const rate_share_min: f64 = 0.9;
/// ...the slowest write at most this long...
pub const slowest_ms_max: f64 = 500.0;
/// ...and a standard deviation of the latencies at most this.
pub const stddev_ms_max: f64 = 100.0;
/// Longest error text kept per kind of failure.
pub const error_chars_max: usize = 160;

/// A load of `etcdctl check perf --load` (`etcdctl/ctlv3/command/check.go`, `checkPerfCfgMap`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Load {
    /// 50 clients, 150 writes/s offered, 60 s.
    S,
    /// 200 clients, 1,000 writes/s, 60 s.
    M,
    /// 500 clients, 8,000 writes/s, 60 s.
    L,
    /// 1,000 clients, 15,000 writes/s, 60 s.
    Xl,
}

/// Clients, offered rate and duration of a run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LoadSpec {
    pub clients: u32,
    pub rate: u32,
    pub duration_s: u64,
}

impl Load {
    /// etcd's numbers for this load.
    pub fn spec(self) -> LoadSpec {
        let (clients, rate) = match self {
            Load::S => (50, 150),
            Load::M => (200, 1000),
            Load::L => (500, 8000),
            Load::Xl => (1000, 15_000),
        };
        LoadSpec {
            clients,
            rate,
            duration_s: 60,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Load::S => "s",
            Load::M => "m",
            Load::L => "l",
            Load::Xl => "xl",
        }
    }
}

#[derive(Debug, Clone, clap::Args)]
pub struct BenchArgs {
    /// The load, as etcd's `check perf`: s (50 clients, 150 writes/s), m (200, 1,000),
    /// l (500, 8,000), xl (1,000, 15,000), each for 60 s.
    #[arg(long, value_enum, default_value = "s")]
    pub load: Load,
    /// Override the load's clients (1 to 1,000).
    #[arg(long)]
    pub clients: Option<u32>,
    /// Override the load's offered rate, in writes per second (1 to 20,000).
    #[arg(long)]
    pub rate: Option<u32>,
    /// Override the load's duration, in seconds (1 to 600).
    #[arg(long = "duration", value_name = "SECONDS")]
    pub duration_s: Option<u64>,
    /// Only remove keys an interrupted run left behind, then stop.
    #[arg(long)]
    pub clean: bool,
    /// Instead of writes: N simulated hosts (1 to 10,000) file reports with the leader, with
    /// real host certificates and report frames, at --rate reports/s in all (default 1,000).
    #[arg(long, value_name = "HOSTS")]
    pub reports: Option<u32>,
    /// With --reports: module states in each report (0 to 64).
    #[arg(long, default_value_t = 10)]
    pub modules: u32,
    /// With --reports: percent of reports that differ from the host's one before (0 to 100).
    #[arg(long, value_name = "PERCENT", default_value_t = 0)]
    pub changing: u32,
    /// With --reports: the directory `meshctl init` wrote, with ca.pem and ca.key to issue the
    /// hosts' certificates from (default: the context file's directory).
    #[arg(long)]
    pub dir: Option<std::path::PathBuf>,
}

/// The run the arguments ask for, or why not (bad usage, exit 2).
pub fn spec(args: &BenchArgs) -> Result<LoadSpec, CliError> {
    let base = args.load.spec();
    let spec = LoadSpec {
        clients: args.clients.unwrap_or(base.clients),
        rate: args.rate.unwrap_or(base.rate),
        duration_s: args.duration_s.unwrap_or(base.duration_s),
    };
    let bad = |what: &str, value: u64, max: u64| {
        CliError::Usage(format!(
            "bench: {what} {value} is out of range 1..={max}; give a value within it"
        ))
    };
    if spec.clients == 0 || spec.clients > clients_max {
        return Err(bad("--clients", spec.clients.into(), clients_max.into()));
    }
    if spec.rate == 0 || spec.rate > rate_max {
        return Err(bad("--rate", spec.rate.into(), rate_max.into()));
    }
    if spec.duration_s == 0 || spec.duration_s > duration_s_max {
        return Err(bad("--duration", spec.duration_s, duration_s_max));
    }
    Ok(spec)
}

/// What a run measured.
#[derive(Clone, Debug, PartialEq)]
pub struct Figures {
    pub ok: u64,
    /// Failed writes by what went wrong.
    pub errors: BTreeMap<String, u64>,
    pub elapsed: Duration,
    pub writes_per_s: f64,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub slowest_ms: f64,
    pub mean_ms: f64,
    pub stddev_ms: f64,
}

/// Figures from the latencies (microseconds) of the writes that succeeded. Throughput is as
/// etcd's report counts it: successful writes over the whole run, first start to last answer.
pub fn figures(mut lat_us: Vec<u32>, errors: BTreeMap<String, u64>, elapsed: Duration) -> Figures {
    lat_us.sort_unstable();
    let n = lat_us.len();
    let ms = |us: u32| f64::from(us) / 1000.0;
    let rank = |q: f64| -> f64 {
        if n == 0 {
            return 0.0;
        }
        // Nearest rank: the smallest value with at least q of the samples at or below it.
        let i = ((q * n as f64).ceil() as usize).clamp(1, n) - 1;
        ms(lat_us[i])
    };
    let mean_ms = if n == 0 {
        0.0
    } else {
        lat_us.iter().map(|&l| ms(l)).sum::<f64>() / n as f64
    };
    let var = if n == 0 {
        0.0
    } else {
        lat_us
            .iter()
            .map(|&l| (ms(l) - mean_ms).powi(2))
            .sum::<f64>()
            / n as f64
    };
    let secs = elapsed.as_secs_f64();
    Figures {
        ok: n as u64,
        errors,
        elapsed,
        writes_per_s: if secs > 0.0 { n as f64 / secs } else { 0.0 },
        p50_ms: rank(0.50),
        p99_ms: rank(0.99),
        slowest_ms: lat_us.last().map_or(0.0, |&l| ms(l)),
        mean_ms,
        stddev_ms: var.sqrt(),
    }
}

/// etcd's verdict lines and whether all passed: no failed write, throughput above 90 % of the
/// offered rate, slowest write at most 0.5 s, standard deviation at most 0.1 s.
pub fn verdict(f: &Figures, spec: &LoadSpec) -> (Vec<String>, bool) {
    let mut lines = Vec::new();
    let mut pass = true;
    if !f.errors.is_empty() {
        lines.push("FAIL: too many errors".to_string());
        for (what, count) in &f.errors {
            lines.push(format!("FAIL: ERROR({what}) -> {count}"));
        }
        pass = false;
    }
    let floor = f64::from(spec.rate) * rate_share_min;
    if f.writes_per_s <= floor {
        lines.push(format!(
            "FAIL: Throughput too low: {:.0} writes/s (needs above {floor:.0}: 90% of the {} offered)",
            f.writes_per_s, spec.rate
        ));
        pass = false;
    } else {
        lines.push(format!(
            "PASS: Throughput is {:.0} writes/s",
            f.writes_per_s
        ));
    }
    if f.slowest_ms > slowest_ms_max {
        lines.push(format!(
            "FAIL: Slowest request took too long: {:.6}s (at most 0.5 s)",
            f.slowest_ms / 1000.0
        ));
        pass = false;
    } else {
        lines.push(format!(
            "PASS: Slowest request took {:.6}s",
            f.slowest_ms / 1000.0
        ));
    }
    if f.stddev_ms > stddev_ms_max {
        lines.push(format!(
            "FAIL: Stddev too high: {:.6}s (at most 0.1 s)",
            f.stddev_ms / 1000.0
        ));
        pass = false;
    } else {
        lines.push(format!("PASS: Stddev is {:.6}s", f.stddev_ms / 1000.0));
    }
    lines.push(if pass { "PASS" } else { "FAIL" }.to_string());
    (lines, pass)
}

/// The figures line, one line a script can read.
pub fn render_figures(f: &Figures) -> String {
    render_figures_as(f, "writes/s", "ok")
}

/// The figures line with its own words for the rate (`writes/s`, `reports/s`) and for the
/// requests that succeeded (`ok`, `filed`).
pub fn render_figures_as(f: &Figures, rate: &str, done: &str) -> String {
    let failed: u64 = f.errors.values().sum();
    format!(
        "{rate} {:.1}  p50 {:.1} ms  p99 {:.1} ms  slowest {:.1} ms  stddev {:.1} ms  mean {:.1} ms  ({} {done}, {} failed in {:.1} s)\n",
        f.writes_per_s,
        f.p50_ms,
        f.p99_ms,
        f.slowest_ms,
        f.stddev_ms,
        f.mean_ms,
        f.ok,
        failed,
        f.elapsed.as_secs_f64()
    )
}

/// Which layer and key client `i` writes: machine layers in turn, one key per client.
pub fn placement(machines: &[String], i: u32) -> Option<(Scope, String)> {
    if machines.is_empty() {
        return None;
    }
    let m = &machines[i as usize % machines.len()];
    Some((Scope::Machine(m.clone()), format!("{key_prefix}{i}")))
}

/// The value of write `seq`: unique per write (so every write changes the layer), one printable
/// line of [`value_bytes`].
pub fn value(seq: u64) -> String {
    let mut v = format!("{seq:020}-");
    while v.len() < value_bytes {
        v.push('x');
    }
    v.truncate(value_bytes);
    v
}

/// The writes that undo the bench's keys: per layer holding one, a replace with the other keys
/// (as they are now), or a clear when no other key is left.
pub fn cleanup_requests(layers: &[(Scope, Layer)], why: &str) -> Vec<Request> {
    let mut out = Vec::new();
    for (scope, layer) in layers {
        let ours: BTreeSet<String> = layer
            .keys()
            .filter(|k| k.starts_with(key_prefix))
            .cloned()
            .collect();
        if ours.is_empty() {
            continue;
        }
        let rest: Layer = layer
            .iter()
            .filter(|(k, _)| !ours.contains(*k))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        if rest.is_empty() {
            out.push(Request::SettingsClear {
                scope: scope.clone(),
                why: why.to_string(),
            });
        } else {
            out.push(Request::SettingsSet {
                scope: scope.clone(),
                layer: rest,
                remove: ours,
                replace: true,
                why: why.to_string(),
            });
        }
    }
    out
}

pub fn run(ctx: Option<&Path>, args: &BenchArgs) -> Result<Output, CliError> {
    if let Some(hosts) = args.reports {
        let spec = reports::spec(args, hosts)?;
        let context = context::resolve(ctx)?;
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()
            .map_err(ClientError::Runtime)?;
        return runtime.block_on(reports::run(&context, &spec));
    }
    let spec = spec(args)?;
    let context = context::resolve(ctx)?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(ClientError::Runtime)?;
    if args.clean {
        return runtime.block_on(clean_only(&context));
    }
    runtime.block_on(bench(&context, args.load, &spec))
}

async fn ask(context: &Context, request: &Request) -> Result<Body, CliError> {
    let answer = client::ask_async(context, request).await?;
    let (_, body) = render::split(answer)?;
    Ok(body)
}

async fn layers(context: &Context) -> Result<Vec<(Scope, Layer)>, CliError> {
    let request = Request::SettingsShow {
        scope: None,
        history: false,
    };
    match client::ask_async(context, &request)
        .await
        .map(render::split)?
    {
        Ok((_, Body::Settings(view))) => Ok(view.layers),
        Ok((via, body)) => Err(render::unexpected(via, "settings show", &body)),
        Err(e) => Err(e),
    }
}

/// Removes every bench key; says how many layers it touched.
async fn clean(context: &Context) -> Result<usize, CliError> {
    let requests = cleanup_requests(&layers(context).await?, "meshctl bench: remove its keys");
    for request in &requests {
        ask(context, request).await?;
    }
    Ok(requests.len())
}

async fn clean_only(context: &Context) -> Result<Output, CliError> {
    let n = clean(context).await?;
    Ok(Output::done(format!(
        "removed the bench's keys from {n} layers\n"
    )))
}

async fn bench(context: &Context, load: Load, spec: &LoadSpec) -> Result<Output, CliError> {
    // As etcd refuses a prefix that holds keys: a layer with a bench key is an interrupted run.
    let left: Vec<String> = layers(context)
        .await?
        .iter()
        .filter(|(_, l)| l.keys().any(|k| k.starts_with(key_prefix)))
        .map(|(s, _)| s.to_string())
        .collect();
    if !left.is_empty() {
        return Err(CliError::Usage(format!(
            "bench: {} still hold {key_prefix}* keys from an interrupted run; remove them with `meshctl bench --clean` first",
            left.join(", ")
        )));
    }
    let machines = match ask(context, &Request::Status).await? {
        Body::Status(view) => view
            .machines
            .into_iter()
            .map(|m| m.name)
            .collect::<Vec<_>>(),
        other => {
            return Err(CliError::Render(format!(
                "status answered {:?}",
                format!("{other:?}").chars().take(40).collect::<String>()
            )));
        }
    };
    if machines.is_empty() {
        return Err(CliError::Usage(
            "bench: the model has no machines to write settings on; `meshctl apply` a mesh first"
                .into(),
        ));
    }
    let layers_used = machines.len().min(spec.clients as usize);
    let mut text = format!(
        "meshctl bench: load {} ({} clients, {} writes/s offered, {} s, {value_bytes}-byte values) over {} replicas, {} machine layers\n",
        load.name(),
        spec.clients,
        spec.rate,
        spec.duration_s,
        context.replicas.len(),
        layers_used,
    );
    eprintln!(
        "meshctl bench: running for {} s; Ctrl-C stops it early and removes its keys",
        spec.duration_s
    );
    let clients = connect(context, &machines, spec.clients).await?;
    let run = drive(clients, spec).await;
    let figures = figures(run.lat_us, run.errors, run.elapsed);
    text.push_str(&render_figures(&figures));
    let (lines, pass) = verdict(&figures, spec);
    for l in lines {
        text.push_str(&l);
        text.push('\n');
    }
    if run.interrupted {
        text.push_str("interrupted: the run stopped early at Ctrl-C\n");
    }
    match clean(context).await {
        Ok(n) => text.push_str(&format!(
            "cleaned up: the bench's keys removed from {n} layers\n"
        )),
        Err(e) => {
            text.push_str(&format!(
                "cleanup failed: {e}; run `meshctl bench --clean` to remove the bench's keys\n"
            ));
            return Ok(Output {
                text,
                code: exit_failed,
            });
        }
    }
    Ok(Output {
        text,
        code: if pass && !run.interrupted {
            exit_done
        } else {
            exit_failed
        },
    })
}

/// One client: its own endpoint and connection, the replica it writes to, its layer and key.
struct BenchClient {
    endpoint: Endpoint,
    peer: (u64, SocketAddr),
    scope: Scope,
    key: String,
}

/// Binds and dials every client before the clock starts (a handshake is not a write), at most
/// [`dials_in_flight_max`] at once; client `i` dials replica `i mod n` first, then the others.
async fn connect(
    context: &Context,
    machines: &[String],
    clients: u32,
) -> Result<Vec<BenchClient>, CliError> {
    let ctx_name = context.path.display().to_string();
    let identity = Arc::new(client::load_identity(context)?);
    let config = TransportConfig::default()
        .check()
        .map_err(|e| ClientError::Bind(e.to_string()))?;
    let bind_addr = client::any_addr(&context.replicas);
    let mut out = Vec::with_capacity(clients as usize);
    let mut start = 0u32;
    while start < clients {
        let end = (start + dials_in_flight_max as u32).min(clients);
        let mut dials = Vec::new();
        for i in start..end {
            let Some((scope, key)) = placement(machines, i) else {
                continue;
            };
            let endpoint = Endpoint::bind(bind_addr, &identity, config.clone())
                .map_err(|e| ClientError::Bind(e.to_string()))?;
            let replicas = context.replicas.clone();
            dials.push(async move {
                let n = replicas.len();
                let mut tried = Vec::new();
                for k in 0..n {
                    let (id, addr) = replicas[(i as usize + k) % n];
                    let dial = Duration::from_millis(client::dial_timeout_ms);
                    match endpoint.peer_principal(addr, dial).await {
                        Ok(_) => {
                            return Ok(BenchClient {
                                endpoint,
                                peer: (id, addr),
                                scope,
                                key,
                            });
                        }
                        Err(e) => tried.push(format!("replica {id} at {addr}: {e}")),
                    }
                }
                endpoint.close().await;
                Err(tried.join("; "))
            });
        }
        for dialled in futures::future::join_all(dials).await {
            match dialled {
                Ok(c) => out.push(c),
                Err(tried) => {
                    close_endpoints(out.iter().map(|c| &c.endpoint)).await;
                    return Err(ClientError::Unreachable {
                        context: ctx_name,
                        tried,
                    }
                    .into());
                }
            }
        }
        start = end;
    }
    Ok(out)
}

/// Closes the bench's endpoints at once (its write clients, or the report bench's hosts).
pub(crate) async fn close_endpoints<'a>(endpoints: impl IntoIterator<Item = &'a Endpoint>) {
    let closes: Vec<_> = endpoints.into_iter().map(|e| e.close()).collect();
    futures::future::join_all(closes).await;
}

/// What the clients saw.
struct RunResult {
    lat_us: Vec<u32>,
    errors: BTreeMap<String, u64>,
    elapsed: Duration,
    interrupted: bool,
}

/// Runs the load: a generator offers write numbers at the rate into a channel as deep as the
/// clients (so at most that many wait and at most one write per client is in flight), the
/// clients take them in turn, and the run ends when the duration is over and the last write
/// answered (or after [`drain_ms_max`]).
async fn drive(clients: Vec<BenchClient>, spec: &LoadSpec) -> RunResult {
    let depth = clients.len().max(1);
    let (tx, rx) = mpsc::channel::<u64>(depth);
    let rx = Arc::new(Mutex::new(rx));
    let start = Instant::now();
    let mut workers = Vec::with_capacity(clients.len());
    for c in clients {
        let rx = rx.clone();
        workers.push(tokio::spawn(async move { worker(c, rx).await }));
    }
    let interrupted = generate(tx, spec, start).await;
    let drain_until = tokio::time::Instant::now() + Duration::from_millis(drain_ms_max);
    let mut lat_us = Vec::new();
    let mut errors: BTreeMap<String, u64> = BTreeMap::new();
    let mut last = start;
    for w in workers {
        let abort = w.abort_handle();
        match tokio::time::timeout_at(drain_until, w).await {
            Ok(Ok(done)) => {
                lat_us.extend(done.lat_us);
                for (k, v) in done.errors {
                    *errors.entry(k).or_default() += v;
                }
                last = last.max(done.last);
            }
            Ok(Err(e)) => *errors.entry(format!("client task: {e}")).or_default() += 1,
            Err(_) => {
                abort.abort();
                *errors
                    .entry(format!("still in flight {drain_ms_max} ms after the run"))
                    .or_default() += 1;
                last = Instant::now();
            }
        }
    }
    RunResult {
        lat_us,
        errors,
        elapsed: last.duration_since(start),
        interrupted,
    }
}

/// Offers write numbers at `spec.rate` until the duration is over or Ctrl-C; says whether it was
/// Ctrl-C. Waits on a full channel like etcd's (the clients are the bound), and catches up at
/// most [`catch_up_ms_max`] of writes after a late wake.
async fn generate(tx: mpsc::Sender<u64>, spec: &LoadSpec, start: Instant) -> bool {
    let interval = Duration::from_secs_f64(1.0 / f64::from(spec.rate));
    let end = tokio::time::Instant::from_std(start) + Duration::from_secs(spec.duration_s);
    let catch_up = Duration::from_millis(catch_up_ms_max);
    let mut next = tokio::time::Instant::from_std(start);
    let mut seq = 0u64;
    let ctrl_c = tokio::signal::ctrl_c();
    tokio::pin!(ctrl_c);
    loop {
        if next >= end {
            return false;
        }
        tokio::select! {
            _ = &mut ctrl_c => return true,
            _ = tokio::time::sleep_until(next) => {}
        }
        tokio::select! {
            _ = &mut ctrl_c => return true,
            _ = tokio::time::sleep_until(end) => return false,
            sent = tx.send(seq) => if sent.is_err() { return false },
        }
        seq += 1;
        let now = tokio::time::Instant::now();
        next = (next + interval).max(now.checked_sub(catch_up).unwrap_or(now));
    }
}

/// One client's results.
struct WorkerDone {
    lat_us: Vec<u32>,
    errors: BTreeMap<String, u64>,
    last: Instant,
}

async fn worker(c: BenchClient, rx: Arc<Mutex<mpsc::Receiver<u64>>>) -> WorkerDone {
    let mut done = WorkerDone {
        lat_us: Vec::new(),
        errors: BTreeMap::new(),
        last: Instant::now(),
    };
    let timeout = Duration::from_millis(write_timeout_ms);
    let (id, addr) = c.peer;
    loop {
        let next = rx.lock().await.recv().await;
        let Some(seq) = next else { break };
        let mut layer = Layer::new();
        layer.insert(c.key.clone(), value(seq));
        let request = Request::SettingsSet {
            scope: c.scope.clone(),
            layer,
            remove: BTreeSet::new(),
            replace: false,
            why: "meshctl bench".into(),
        };
        let began = Instant::now();
        let outcome = write_once(&c.endpoint, id, addr, &request, timeout).await;
        done.last = Instant::now();
        match outcome {
            Ok(()) => {
                let us = done.last.duration_since(began).as_micros();
                done.lat_us.push(u32::try_from(us).unwrap_or(u32::MAX));
            }
            Err(what) => {
                let what: String = what.chars().take(error_chars_max).collect();
                *done.errors.entry(what).or_default() += 1;
            }
        }
    }
    c.endpoint.close().await;
    done
}

/// One write and its answer; an error is said in words.
async fn write_once(
    ep: &Endpoint,
    id: u64,
    addr: SocketAddr,
    request: &Request,
    timeout: Duration,
) -> Result<(), String> {
    let call = Call::new(request.clone()).ok_or("the OS random source failed")?;
    let body = mesh_codec::encode(request_what, &call).map_err(|e| e.to_string())?;
    let peer = Peer::expecting(addr, Principal::Replica(id));
    let bytes = ep
        .request(peer, MessageKind::Command, body, timeout)
        .await
        .map_err(|e| e.to_string())?;
    let answer: Answer = mesh_codec::decode(answer_what, &bytes).map_err(|e| e.to_string())?;
    match answer.body {
        Ok(Body::SettingsSet { .. }) => Ok(()),
        Ok(other) => Err(format!(
            "unexpected answer {}",
            format!("{other:?}").chars().take(40).collect::<String>()
        )),
        Err(e) => Err(e.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loads_are_etcds_check_perf_loads() {
        assert_eq!(
            Load::L.spec(),
            LoadSpec {
                clients: 500,
                rate: 8000,
                duration_s: 60
            }
        );
        assert_eq!(Load::Xl.spec().clients, 1000);
    }

    #[test]
    fn verdict_fails_below_ninety_percent_of_the_offered_rate() {
        let spec = Load::S.spec();
        let fast = figures(vec![1000; 9000], BTreeMap::new(), Duration::from_secs(60));
        assert!(verdict(&fast, &spec).1, "{fast:?}");
        let slow = figures(vec![1000; 8000], BTreeMap::new(), Duration::from_secs(60));
        assert!(!verdict(&slow, &spec).1, "{slow:?}");
    }

    #[test]
    fn cleanup_keeps_the_operators_keys_and_clears_a_layer_only_the_bench_made() {
        let mine: Layer = [(format!("{key_prefix}0"), "v".to_string())].into();
        let mut shared = mine.clone();
        shared.insert("log_level".into(), "debug".into());
        let layers = vec![
            (Scope::Machine("a".into()), mine),
            (Scope::Machine("b".into()), shared),
        ];
        let reqs = cleanup_requests(&layers, "why");
        assert!(matches!(&reqs[0], Request::SettingsClear { .. }));
        match &reqs[1] {
            Request::SettingsSet { layer, replace, .. } => {
                assert!(*replace);
                assert_eq!(layer.keys().collect::<Vec<_>>(), ["log_level"]);
            }
            other => panic!("{other:?}"),
        }
    }
}
