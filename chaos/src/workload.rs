//! The operator workload of a run: real requests through real replicas (any replica; followers
//! forward). Three operators, each sequential, drawn from the seed: operator 0 applies models (the
//! consumer `app` added on `bex` or `cor`, moved, removed; the mount-holding `cache` moved between
//! machines), reads settings and pushes; operator 1 sets the keys of module `db` only it writes
//! ([`setting_keys`]) and the keys it shares with operator 2 ([`contended_keys`]), reads them and
//! pushes; operator 2 sets the shared keys and reads. Pushes are named, `--behind`, `--all`, with
//! or without `--move cache`. A read is `settings show module/db`, the request `meshctl` sends;
//! operators 0 and 2 also read the model back with `plan cor` (the revision it plans from).
//! Every request is recorded with its answer.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use mesh::controller::api::{ApiError, Body, ErrorClass, PushOutcome, PushTarget, Request};
use mesh::core::model::{Mesh, Mount, Need, Provide};
use mesh::core::settings::Scope;
use mesh_testkit::model::{machine, sleeper};
use tokio::sync::{RwLock, watch};

use crate::bed::{Cluster, machines, replicas_n};
use crate::history::{Answered, Event, Op};
use crate::rng::Rng;

/// Keys of `module/db` only operator 1 writes (one writer per key).
pub const setting_keys: [&str; 3] = ["pool", "mode", "level"];
/// Keys of `module/db` operators 1 and 2 both write: concurrent writes of one key.
pub const contended_keys: [&str; 2] = ["shared", "owner"];
/// Operators in a run.
pub const operators_n: u64 = 3;
/// Longest pause between two requests of one operator.
pub const think_ms_max: u64 = 150;

/// The model of apply number `tag`: `db` on ace provides `pg`; `app` consumes it from bex or cor
/// or is absent; `cache` with a mount on bex or cor; `worker` on cor carries the tag.
pub fn model(tag: u64, rng: &mut Rng) -> Mesh {
    let mut mesh = Mesh::default();
    for m in machines {
        mesh.machines.insert(m.into(), machine(m));
    }
    let mut db = sleeper("db", "ace");
    db.provides.push(Provide {
        kind: "pg".into(),
        port: Some(5999),
    });
    mesh.modules.insert("db".into(), db);
    match rng.below(3) {
        0 => {}
        n => {
            let mut app = sleeper("app", if n == 1 { "bex" } else { "cor" });
            app.consumes.push(Need {
                kind: "pg".into(),
                from: "db".into(),
            });
            mesh.modules.insert("app".into(), app);
        }
    }
    let mut cache = sleeper("cache", if rng.chance(500) { "bex" } else { "cor" });
    cache.mounts.push(Mount {
        name: "data".into(),
        host_dir: "/srv/cache".into(),
        target: "data".into(),
    });
    mesh.modules.insert("cache".into(), cache);
    let mut worker = sleeper("worker", "cor");
    worker.env.insert("CHAOS_APPLY".into(), tag.to_string());
    mesh.modules.insert("worker".into(), worker);
    mesh
}

/// Counts of what the operators did.
#[derive(Clone, Debug, Default)]
pub struct Tally {
    pub requests: u64,
    pub acked: u64,
    pub unknown: u64,
    pub refused: u64,
    /// Reads among the requests, and how many of them were answered with values.
    pub reads: u64,
    pub reads_answered: u64,
}

/// Runs the operators until `stop`; returns what they did.
pub async fn operate(
    cluster: Arc<RwLock<Cluster>>,
    seed: u64,
    stop: watch::Receiver<bool>,
) -> Tally {
    let mut running = Vec::new();
    for who in 0..operators_n {
        running.push(tokio::spawn(one_operator(
            cluster.clone(),
            seed,
            who,
            stop.clone(),
        )));
    }
    let mut tally = Tally::default();
    for t in running {
        let Ok(t) = t.await else { continue };
        tally.requests += t.requests;
        tally.acked += t.acked;
        tally.unknown += t.unknown;
        tally.refused += t.refused;
        tally.reads += t.reads;
        tally.reads_answered += t.reads_answered;
    }
    tally
}

/// A `settings set module/db key=value` of apply number `tag`.
fn set(key: &str, tag: u64) -> (Op, Request) {
    let value = format!("v{tag}");
    let layer = BTreeMap::from([(key.to_string(), value.clone())]);
    (
        Op::Set {
            key: key.to_string(),
            value,
        },
        Request::SettingsSet {
            scope: Scope::Module("db".into()),
            layer,
            remove: BTreeSet::new(),
            replace: false,
            why: format!("chaos set {tag}"),
        },
    )
}

/// `plan cor`, as `meshctl plan cor` asks it: a read of the model the leader plans from.
fn read_model() -> (Op, Request) {
    (
        Op::ReadModel,
        Request::Plan {
            target: PushTarget::Machine("cor".into()),
            moves: vec![],
        },
    )
}

/// `settings show module/db`, as `meshctl settings show module/db` asks it.
fn read() -> (Op, Request) {
    (
        Op::Read,
        Request::SettingsShow {
            scope: Some(Scope::Module("db".into())),
            history: false,
        },
    )
}

async fn one_operator(
    cluster: Arc<RwLock<Cluster>>,
    seed: u64,
    who: u64,
    stop: watch::Receiver<bool>,
) -> Tally {
    let mut rng = Rng::new(seed, 0x0e_0000 + who);
    let mut tally = Tally::default();
    let mut n: u64 = 0;
    while !*stop.borrow() {
        n += 1;
        let tag = who * 1_000_000 + n;
        let (op, request) = match (who, rng.below(10)) {
            (0, 0..=3) => (
                Op::Apply { tag },
                Request::Apply {
                    mesh: model(tag, &mut rng),
                    why: format!("chaos apply {tag}"),
                    drain: false,
                },
            ),
            (0, 4) | (2, 9) => read_model(),
            (1, 5..=6) | (2, 6..=8) => read(),
            (1, 0..=2) => set(
                setting_keys[rng.below(setting_keys.len() as u64) as usize],
                tag,
            ),
            (1, 3..=4) | (2, 0..=5) => set(
                contended_keys[rng.below(contended_keys.len() as u64) as usize],
                tag,
            ),
            _ => {
                let target = match rng.below(4) {
                    0 => PushTarget::All,
                    1 => PushTarget::Behind,
                    _ => PushTarget::Machine(machines[rng.below(3) as usize].to_string()),
                };
                let moves = if rng.chance(400) {
                    vec!["cache".to_string()]
                } else {
                    vec![]
                };
                let why = format!("chaos push {tag}");
                let shown = match &target {
                    PushTarget::All => "--all".to_string(),
                    PushTarget::Behind => "--behind".to_string(),
                    PushTarget::Machine(m) => m.clone(),
                };
                (
                    Op::Push {
                        why: why.clone(),
                        target: shown,
                        moves: moves.clone(),
                    },
                    Request::Push {
                        target,
                        why,
                        moves,
                        plan: None,
                    },
                )
            }
        };
        let via = 1 + rng.below(replicas_n);
        let think = rng.below(think_ms_max);
        let is_read = matches!(op, Op::Read | Op::ReadModel);
        let answered = ask_recorded(&cluster, via, op, request).await;
        tally.requests += 1;
        if is_read {
            tally.reads += 1;
        }
        match answered {
            Answered::Read { .. } | Answered::Model { .. } => {
                tally.acked += 1;
                tally.reads_answered += 1;
            }
            Answered::Ok { .. } => tally.acked += 1,
            Answered::Refused(_) => tally.refused += 1,
            Answered::Unknown(_) => tally.unknown += 1,
        }
        tokio::time::sleep(Duration::from_millis(think)).await;
    }
    tally
}

/// Sends one request to `via` and records it and its answer.
pub async fn ask_recorded(
    cluster: &Arc<RwLock<Cluster>>,
    via: u64,
    what: Op,
    request: Request,
) -> Answered {
    let guard = cluster.read().await;
    let recorder = guard.recorder.clone();
    let op = recorder.next_op();
    recorder.record(Event::Invoked { op, via, what });
    let answered = match Cluster::call(request) {
        Err(e) => Answered::Unknown(e),
        Ok(call) => match guard.ask(via, &call).await {
            Err(e) => Answered::Unknown(e),
            Ok(answer) => {
                if let Ok(Body::Push(view)) = &answer.body {
                    for line in &view.lines {
                        if let PushOutcome::Failed { error, .. } = &line.outcome {
                            recorder.record(Event::Note {
                                what: format!("op {op}: {} not sent: {error}", line.machine),
                            });
                        }
                    }
                }
                answered(answer.replica, answer.body)
            }
        },
    };
    drop(guard);
    recorder.record(Event::Done {
        op,
        answer: answered.clone(),
    });
    answered
}

fn answered(replica: u64, body: Result<Body, ApiError>) -> Answered {
    match body {
        Ok(Body::Settings(view)) => Answered::Read {
            replica,
            values: view
                .layers
                .into_iter()
                .find(|(scope, _)| *scope == Scope::Module("db".into()))
                .map(|(_, layer)| layer.into_iter().collect())
                .unwrap_or_default(),
        },
        Ok(Body::Plan(view)) => Answered::Model {
            replica,
            revision: view.revision,
        },
        Ok(Body::Push(view)) => Answered::Ok {
            lines: view
                .lines
                .iter()
                .map(|l| {
                    let sent = match &l.outcome {
                        PushOutcome::Applied {
                            sequence, digest, ..
                        }
                        | PushOutcome::Sent {
                            sequence, digest, ..
                        } => Some((*sequence, digest.short())),
                        // Sent and refused by the host: its record has no sequence on the line.
                        PushOutcome::Refused { .. } => Some((0, String::new())),
                        PushOutcome::Held { .. } | PushOutcome::Failed { .. } => None,
                    };
                    (l.machine.clone(), sent)
                })
                .collect(),
        },
        Ok(_) => Answered::Ok { lines: vec![] },
        // The API's promise: an invalid or refused request wrote nothing. Of the unavailable
        // ones, three are answered before anything is proposed or forwarded: not the leader
        // (a forward to a replica that stopped leading), no leader found (nothing was forwarded)
        // and no lease. `NotCommitted` is not among them: it also covers a Raft core that
        // stopped after the entry was appended, which a later leader may still commit.
        Err(e) => match (e.class(), &e) {
            (ErrorClass::Invalid | ErrorClass::Refused, _)
            | (
                ErrorClass::Unavailable,
                ApiError::NotLeader { .. } | ApiError::NoLeader { .. } | ApiError::NoLease { .. },
            ) => Answered::Refused(e.to_string()),
            (ErrorClass::Unavailable | ErrorClass::Failed, _) => Answered::Unknown(e.to_string()),
        },
    }
}
