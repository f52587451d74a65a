//! Fuzzing every decoder a peer can reach (issue 11 part 7, decision 0201): frame headers and
//! responses, sealed envelopes (`open`), host reports, operator calls, forwarded requests, Raft
//! requests (snapshot chunks among them), snapshot files and the mesh file parser.
//!
//! No coverage-guided engine: each target gets arbitrary bytes and, structure-aware, mutations of
//! valid encodings of its own type (bit flips, byte overwrites, bincode varint markers with huge
//! lengths, truncations, insertions, splices), all from one seed. Every input runs under
//! `catch_unwind`; a panic, an allocation past the target's limit (when the binary counts
//! allocations with [`CountingAlloc`]) or a broken invariant of the target (an envelope that opens
//! after its bytes changed, a mesh-file error without `file:line:col`) is a finding. The decoders
//! are pure functions of their bytes, so an input cannot change state; `open` is also checked to
//! refuse the seed again at its own position (no replay).

use std::alloc::{GlobalAlloc, Layout, System};
use std::collections::BTreeMap;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use ed25519_dalek::SigningKey;
use openraft::raft::{InstallSnapshotRequest, VoteRequest};
use openraft::{CommittedLeaderId, SnapshotMeta, StoredMembership, Vote};

use mesh::controller::api::{Call, Forwarded, Request, RequestId};
use mesh::core::declaration::Declaration;
use mesh::core::envelope::{Envelope, Position, open, seal};
use mesh::core::meshfile::parse_mesh;
use mesh::core::report::{ModuleState, ModuleStatus, Report};
use mesh_raft::network::{RaftCall, RaftRequest};
use mesh_raft::{LogId, SnapshotFile};
use mesh_transport::frame::{Header, decode_header, decode_response, encode_header};
use mesh_transport::writers::MessageKind;

use crate::rng::Rng;

/// Largest arbitrary input, in bytes.
pub const arbitrary_bytes_max: u64 = 4096;
/// Bytes an input may allocate at its peak beyond this many per input byte...
pub const alloc_bytes_per_input_byte: usize = 64;
/// ...and this many in all (serde reserves up to 1 MiB for a container on its claimed length).
pub const alloc_bytes_base: usize = 2 << 20;

/// A global allocator that keeps the bytes live now and the peak since the last reset, so a run
/// can tell what one input allocated. Install it with `#[global_allocator]` in a binary that
/// fuzzes on one thread.
pub struct CountingAlloc;

static live: AtomicUsize = AtomicUsize::new(0);
static peak: AtomicUsize = AtomicUsize::new(0);
static counting: AtomicBool = AtomicBool::new(false);

// SAFETY: every call goes to `System` with the same layout; the counters only observe.
unsafe impl GlobalAlloc for CountingAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: forwarded unchanged.
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            let now = live.fetch_add(layout.size(), Ordering::Relaxed) + layout.size();
            peak.fetch_max(now, Ordering::Relaxed);
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: forwarded unchanged.
        unsafe { System.dealloc(ptr, layout) };
        live.fetch_sub(layout.size(), Ordering::Relaxed);
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: forwarded unchanged.
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            let now = if new_size >= layout.size() {
                live.fetch_add(new_size - layout.size(), Ordering::Relaxed)
                    + (new_size - layout.size())
            } else {
                live.fetch_sub(layout.size() - new_size, Ordering::Relaxed)
                    - (layout.size() - new_size)
            };
            peak.fetch_max(now, Ordering::Relaxed);
        }
        p
    }
}

impl CountingAlloc {
    /// Says that this process's global allocator is a `CountingAlloc`, so peaks mean something.
    pub fn installed() {
        counting.store(true, Ordering::Relaxed);
    }
}

/// What one target checks beyond "no panic, no allocation past the limit".
type Check = Box<dyn Fn(&[u8]) -> Result<(), String>>;

/// One decoder under fuzz, with valid encodings of its type to mutate.
pub struct Target {
    pub name: &'static str,
    pub seeds: Vec<Vec<u8>>,
    pub check: Check,
}

/// Something a target did that it must not.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Finding {
    pub target: &'static str,
    pub what: String,
    /// The input, first 64 bytes in hex.
    pub input: String,
    pub input_len: usize,
}

/// One target's tally.
#[derive(Clone, Debug, Default)]
pub struct Tally {
    pub executions: u64,
    pub arbitrary: u64,
    pub mutated: u64,
    /// Largest peak allocation of one input, in bytes (0 without [`CountingAlloc`]).
    pub peak_alloc: usize,
}

/// How long to fuzz each target.
#[derive(Clone, Copy, Debug)]
pub enum Budget {
    Executions(u64),
    Time(Duration),
}

/// What a fuzz run did.
#[derive(Clone, Debug, Default)]
pub struct FuzzReport {
    pub seed: u64,
    pub tallies: Vec<(&'static str, Tally)>,
    pub findings: Vec<Finding>,
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().take(64).map(|b| format!("{b:02x}")).collect()
}

fn log_id(term: u64, index: u64) -> LogId {
    LogId::new(CommittedLeaderId::new(term, 1), index)
}

/// The signing key of the fuzzed envelopes (a fixed key: the fuzzer is not testing ed25519).
fn fuzz_key() -> SigningKey {
    SigningKey::from_bytes(&[7u8; 32])
}

const fuzz_machine: &str = "ace";

fn envelope(sequence: u64) -> Envelope {
    let mut revoked = BTreeMap::new();
    revoked.insert("principal:operator:old".to_string(), "left".to_string());
    Envelope {
        machine: fuzz_machine.into(),
        epoch: 3,
        sequence,
        signer: 1,
        moves: vec!["db".into()],
        declaration: Declaration {
            machine: fuzz_machine.into(),
            modules: vec![
                mesh_testkit::declared::sleeper("db"),
                mesh_testkit::declared::shell("app", "echo hi"),
            ],
            revoked,
            signers: Default::default(),
        },
    }
}

fn report() -> Report {
    Report {
        machine: fuzz_machine.into(),
        epoch: 3,
        sequence: 9,
        report_sequence: 41,
        applied: None,
        modules: vec![ModuleStatus {
            name: "db".into(),
            state: ModuleState::Running,
            restarts: 2,
            pid: Some(4242),
            last_exit: Some(mesh::core::report::Exit::Code(1)),
            drift: Vec::new(),
        }],
        refused_older: 1,
        last_refusal: Some("older envelope".into()),
        proof: None,
    }
}

fn requests() -> Vec<Request> {
    vec![
        Request::Status,
        Request::Apply {
            mesh: mesh_testkit::model::provider_consumer_mesh(),
            why: "fuzz".into(),
            drain: false,
        },
    ]
}

fn raft_requests() -> Vec<RaftRequest> {
    let timings = mesh_raft::RaftConfig::default().timings();
    let membership = StoredMembership::default();
    let snapshot = SnapshotFile {
        format: SnapshotFile::format_current,
        last_applied: Some(log_id(2, 9)),
        last_membership: membership.clone(),
        app: vec![1, 2, 3, 4],
    };
    // allow(empty-on-error): a seed that does not encode is a seed less, not a wrong input
    let data = snapshot.encode().unwrap_or_default();
    vec![
        RaftRequest {
            from: 2,
            timings,
            call: RaftCall::Vote(VoteRequest::new(Vote::new(4, 2), Some(log_id(3, 12)))),
        },
        RaftRequest {
            from: 2,
            timings,
            call: RaftCall::InstallSnapshot(InstallSnapshotRequest {
                vote: Vote::new_committed(4, 2),
                meta: SnapshotMeta {
                    last_log_id: Some(log_id(2, 9)),
                    last_membership: membership,
                    snapshot_id: "2-9-0".into(),
                },
                offset: 0,
                data,
                done: true,
            }),
        },
        RaftRequest {
            from: 3,
            timings,
            call: RaftCall::Probe,
        },
    ]
}

fn encoded<T: serde::Serialize>(what: &'static str, values: &[T]) -> Vec<Vec<u8>> {
    values
        .iter()
        .filter_map(|v| mesh_codec::encode(what, v).ok())
        .collect()
}

/// Every decoder a peer can reach, each with its seeds and checks.
pub fn targets() -> Vec<Target> {
    let key = fuzz_key();
    let sealed: Vec<Vec<u8>> = [1, 2]
        .iter()
        .filter_map(|s| seal(&envelope(*s), &key).ok())
        .collect();
    let mut trusted = BTreeMap::new();
    trusted.insert(1u64, key.verifying_key());
    let valid = sealed.clone();
    let calls: Vec<Call> = requests()
        .into_iter()
        .map(|request| Call {
            id: RequestId([5; 16]),
            request,
        })
        .collect();
    let forwarded: Vec<Forwarded> = requests()
        .into_iter()
        .map(|request| Forwarded {
            actor: "operator:fuzz".into(),
            via: 2,
            id: RequestId([6; 16]),
            request,
        })
        .collect();
    let headers: Vec<Vec<u8>> = [
        Header::new(MessageKind::Raft, vec![0; 8]),
        Header::new(
            MessageKind::Report {
                machine: fuzz_machine.into(),
            },
            b"body".to_vec(),
        ),
    ]
    .iter()
    .filter_map(|h| encode_header(h).ok())
    .collect();
    let responses: Vec<Vec<u8>> = [Ok(vec![1, 2, 3])]
        .iter()
        .filter_map(|r| mesh_transport::frame::encode_response(r).ok())
        .collect();
    let snapshot_files: Vec<Vec<u8>> = raft_requests()
        .into_iter()
        .filter_map(|r| match r.call {
            RaftCall::InstallSnapshot(s) => Some(s.data),
            _ => None,
        })
        .collect();
    let meshes: Vec<Vec<u8>> = [
        include_str!("../../beds/meshes/pair.toml"),
        include_str!("../../beds/meshes/consumer.toml"),
        include_str!("../../examples/mesh.toml"),
    ]
    .iter()
    .map(|t| t.as_bytes().to_vec())
    .collect();
    vec![
        Target {
            name: "frame header (decode_header)",
            seeds: headers,
            check: Box::new(|b| {
                let _ = decode_header(b);
                Ok(())
            }),
        },
        Target {
            name: "frame response (decode_response)",
            seeds: responses,
            check: Box::new(|b| {
                let _ = decode_response(b);
                Ok(())
            }),
        },
        Target {
            name: "sealed envelope (open)",
            seeds: sealed,
            check: Box::new(move |b| {
                let opened = open(b, &trusted, fuzz_machine, None);
                if opened.is_ok() && !valid.iter().any(|v| v.as_slice() == b) {
                    return Err("open accepted bytes that are not a sealed envelope's".into());
                }
                // The same bytes at their own position are a replay: always refused.
                if let Ok(env) = opened
                    && open(b, &trusted, fuzz_machine, Some(env.position())).is_ok()
                {
                    return Err("open accepted a replay at its own position".into());
                }
                let _ = Position::default();
                Ok(())
            }),
        },
        Target {
            name: "host report (Report, decode_bounded)",
            seeds: encoded("report", &[report()]),
            check: Box::new(|b| {
                let _ = mesh_codec::decode::<Report>("report", b);
                // What the leader decodes (decision 0299): never more module entries than the
                // bound, whatever count the bytes claim.
                if let Ok(Ok(report)) = mesh::core::report::decode_bounded(b) {
                    let bound = mesh::core::report::report_modules_max;
                    if report.modules.len() > bound {
                        return Err(format!(
                            "decode_bounded kept {} modules",
                            report.modules.len()
                        ));
                    }
                    let _ = report.check_bounds(bound, "report_modules_max");
                }
                Ok(())
            }),
        },
        Target {
            name: "operator call (Call)",
            seeds: encoded("call", &calls),
            check: Box::new(|b| {
                let _ = mesh_codec::decode::<Call>("call", b);
                Ok(())
            }),
        },
        Target {
            name: "forwarded request (Forwarded)",
            seeds: encoded("forwarded", &forwarded),
            check: Box::new(|b| {
                let _ = mesh_codec::decode::<Forwarded>("forwarded", b);
                Ok(())
            }),
        },
        Target {
            name: "raft request, snapshot chunks too (RaftRequest)",
            seeds: encoded("raft request", &raft_requests()),
            check: Box::new(|b| {
                let _ = mesh_codec::decode::<RaftRequest>("raft request", b);
                Ok(())
            }),
        },
        Target {
            name: "snapshot file (SnapshotFile::decode)",
            seeds: snapshot_files,
            check: Box::new(|b| {
                let _ = SnapshotFile::decode(b);
                Ok(())
            }),
        },
        Target {
            name: "mesh file (parse_mesh)",
            seeds: meshes,
            check: Box::new(|b| {
                let text = String::from_utf8_lossy(b);
                match parse_mesh("fuzz.toml", &text) {
                    Ok(_) => Ok(()),
                    Err(e) => {
                        let said = e.to_string();
                        if said.starts_with("fuzz.toml") {
                            Ok(())
                        } else {
                            Err(format!("an error that does not name the file: {said}"))
                        }
                    }
                }
            }),
        },
    ]
}

/// A random input: arbitrary bytes, or a seed with a few mutations.
fn input(rng: &mut Rng, seeds: &[Vec<u8>], tally: &mut Tally) -> Vec<u8> {
    if seeds.is_empty() || rng.chance(150) {
        tally.arbitrary += 1;
        let len = rng.below(arbitrary_bytes_max + 1) as usize;
        return (0..len).map(|_| rng.next_u64() as u8).collect();
    }
    tally.mutated += 1;
    let mut bytes = seeds[rng.below(seeds.len() as u64) as usize].clone();
    for _ in 0..rng.between(1, 6) {
        mutate(rng, &mut bytes, seeds);
    }
    bytes
}

fn mutate(rng: &mut Rng, bytes: &mut Vec<u8>, seeds: &[Vec<u8>]) {
    let at = |rng: &mut Rng, len: usize| rng.below(len as u64 + 1) as usize;
    match rng.below(8) {
        0 if !bytes.is_empty() => {
            let i = at(rng, bytes.len() - 1);
            bytes[i] ^= 1 << rng.below(8);
        }
        1 if !bytes.is_empty() => {
            let i = at(rng, bytes.len() - 1);
            bytes[i] = [
                0x00,
                0xff,
                0x7f,
                0x80,
                0xfb,
                0xfc,
                0xfd,
                rng.next_u64() as u8,
            ][rng.below(8) as usize];
        }
        2 => {
            // A bincode varint marker with a huge value: a claimed length or count.
            let i = at(rng, bytes.len());
            let mut huge = vec![0xfd];
            huge.extend_from_slice(&(rng.next_u64() >> rng.below(40)).to_le_bytes());
            if rng.chance(500) {
                huge = vec![0xfc];
                huge.extend_from_slice(&(rng.next_u64() as u32).to_le_bytes());
            }
            bytes.splice(i..i, huge);
        }
        3 => {
            let len = at(rng, bytes.len());
            bytes.truncate(len);
        }
        4 => {
            let i = at(rng, bytes.len());
            let n = rng.between(1, 16) as usize;
            let add: Vec<u8> = (0..n).map(|_| rng.next_u64() as u8).collect();
            bytes.splice(i..i, add);
        }
        5 if !bytes.is_empty() => {
            let i = at(rng, bytes.len() - 1);
            let end = (i + rng.between(1, 32) as usize).min(bytes.len());
            bytes.drain(i..end);
        }
        6 if !bytes.is_empty() => {
            let i = at(rng, bytes.len() - 1);
            let end = (i + rng.between(1, 64) as usize).min(bytes.len());
            let chunk = bytes[i..end].to_vec();
            let j = at(rng, bytes.len());
            bytes.splice(j..j, chunk);
        }
        _ => {
            // Splice: this input's head, another seed's tail.
            let other = &seeds[rng.below(seeds.len() as u64) as usize];
            let cut = at(rng, bytes.len());
            let from = at(rng, other.len());
            bytes.truncate(cut);
            bytes.extend_from_slice(&other[from..]);
        }
    }
}

static panic_said: Mutex<Option<String>> = Mutex::new(None);

/// Runs every target for `budget` from `seed`.
pub fn fuzz(seed: u64, budget: Budget) -> FuzzReport {
    let targets = targets();
    let previous = std::panic::take_hook();
    std::panic::set_hook(Box::new(|info| {
        let at = info
            .location()
            .map(|l| format!(" at {}:{}", l.file(), l.line()))
            .unwrap_or_default();
        if let Ok(mut said) = panic_said.lock() {
            *said = Some(format!("{info}{at}"));
        }
    }));
    let mut report = FuzzReport {
        seed,
        ..FuzzReport::default()
    };
    for (n, target) in targets.iter().enumerate() {
        let mut rng = Rng::new(seed, n as u64 + 1);
        let mut tally = Tally::default();
        let started = Instant::now();
        loop {
            let more = match budget {
                Budget::Executions(max) => tally.executions < max,
                Budget::Time(within) => started.elapsed() < within,
            };
            if !more {
                break;
            }
            let bytes = input(&mut rng, &target.seeds, &mut tally);
            tally.executions += 1;
            let base = live.load(Ordering::Relaxed);
            peak.store(base, Ordering::Relaxed);
            let outcome = catch_unwind(AssertUnwindSafe(|| (target.check)(&bytes)));
            let used = peak.load(Ordering::Relaxed).saturating_sub(base);
            tally.peak_alloc = tally.peak_alloc.max(used);
            let limit = alloc_bytes_base + alloc_bytes_per_input_byte * bytes.len();
            let what = match outcome {
                Err(_) => Some(format!(
                    "panicked: {}",
                    // allow(empty-on-error): the hook's message is a nicety; the panic is the finding
                    panic_said
                        .lock()
                        .ok()
                        .and_then(|mut s| s.take())
                        .unwrap_or_default()
                )),
                Ok(Err(broken)) => Some(broken),
                Ok(Ok(())) if counting.load(Ordering::Relaxed) && used > limit => Some(format!(
                    "allocated {used} bytes for a {}-byte input, over its limit of {limit}",
                    bytes.len()
                )),
                Ok(Ok(())) => None,
            };
            if let Some(what) = what
                && report.findings.len() < 100
            {
                report.findings.push(Finding {
                    target: target.name,
                    what,
                    input: hex(&bytes),
                    input_len: bytes.len(),
                });
            }
        }
        report.tallies.push((target.name, tally));
    }
    std::panic::set_hook(previous);
    report
}
