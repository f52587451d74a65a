//! Core benchmark (plain `Instant`, prints figures): compose + digest of 10,000 machines × 10
//! modules (target < 1 s on one core) and planning a push that changes one machine in that mesh
//! (target < 50 ms). Run with `cargo bench --bench core`; figures go to docs/benchmarks.md.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use mesh::core::compose::{MintRequest, World};
use mesh::core::model::{Machine, Mesh, Module, Mount, Need, Provide};
use mesh::core::plan::{DigestCache, Known, PlanInput, PushPlan, Target, plan};
use mesh::core::settings::Scope;

const machines: usize = 10_000;
const modules_per_machine: usize = 10;
const runs: usize = 7;

fn module(machine: usize, slot: usize) -> Module {
    let name = format!("m{machine}-s{slot}");
    // Each module provides a kind and consumes one from the same slot on the previous machine,
    // so provider chains run across the whole mesh.
    let consumes = if machine == 0 {
        vec![]
    } else {
        vec![Need {
            kind: format!("k{slot}"),
            from: format!("m{}-s{slot}", machine - 1),
        }]
    };
    Module {
        name: name.clone(),
        machine: format!("n{machine}"),
        command: "sh".into(),
        args: vec!["-c".into(), "exec sleep infinity".into()],
        env: From::from([
            ("SLOT".into(), slot.to_string()),
            ("LOG".into(), "1".into()),
        ]),
        files: From::from([(
            "conf/app.conf".into(),
            format!("name {name}\nport {slot}\n"),
        )]),
        mounts: vec![Mount {
            name: "data".into(),
            host_dir: format!("/srv/{name}/data"),
            target: "data".into(),
        }],
        ready: None,
        after: if slot == 0 {
            vec![]
        } else {
            vec![format!("m{machine}-s{}", slot - 1)]
        },
        provides: vec![Provide {
            kind: format!("k{slot}"),
            port: Some(47100 + slot as u16),
        }],
        consumes,
    }
}

fn mesh() -> Mesh {
    let mut mesh = Mesh::default();
    for i in 0..machines {
        let name = format!("n{i}");
        mesh.machines.insert(
            name.clone(),
            Machine {
                name,
                address: format!("10.{}.{}.1", i / 256, i % 256),
            },
        );
        for s in 0..modules_per_machine {
            let m = module(i, s);
            mesh.modules.insert(m.name.clone(), m);
        }
    }
    let layer = |k: &str, v: &str| BTreeMap::from([(k.to_string(), v.to_string())]);
    mesh.settings
        .layers
        .insert(Scope::Mesh, layer("log_level", "info"));
    mesh.settings
        .layers
        .insert(Scope::Machine("n7".into()), layer("log_level", "debug"));
    mesh.settings
        .layers
        .insert(Scope::Module("m7-s1".into()), layer("pool", "8"));
    mesh
}

fn secret(r: &MintRequest) -> String {
    format!("s-{}", r.id())
}

fn plan_target(
    world: &World,
    cache: &DigestCache,
    known: &BTreeMap<String, Known>,
    target: Target,
) -> PushPlan {
    let mut secret = secret;
    plan(PlanInput {
        world,
        cache,
        known,
        target: &target,
        moves: &BTreeSet::new(),
        secret: &mut secret,
    })
    .expect("plan")
}

/// Median and minimum: the machine is shared, so the minimum is the best estimate of the cost
/// without contention and the median says how noisy the run was.
fn median(mut times: Vec<Duration>) -> String {
    times.sort();
    format!(
        "median {}, min {}",
        ms(times[times.len() / 2]),
        ms(times[0])
    )
}

fn ms(d: Duration) -> String {
    format!("{:.2} ms", d.as_secs_f64() * 1e3)
}

fn main() {
    let t = Instant::now();
    let mut world = World::new(mesh(), []);
    println!(
        "build world ({machines} machines x {modules_per_machine} modules): {}",
        ms(t.elapsed())
    );

    let t = Instant::now();
    let cache = DigestCache::build(&world).expect("cache");
    println!(
        "compose + digest of every machine (no provisions yet): {}",
        ms(t.elapsed())
    );

    let t = Instant::now();
    let all = plan_target(&world, &cache, &BTreeMap::new(), Target::All);
    println!(
        "plan push --all (mints {} provisions): {}",
        all.mints.len(),
        ms(t.elapsed())
    );
    for p in all.mints {
        world.insert_provision(p);
    }

    let mut times = Vec::new();
    let mut cache = DigestCache::default();
    for _ in 0..runs {
        let t = Instant::now();
        cache = DigestCache::build(&world).expect("cache");
        times.push(t.elapsed());
    }
    println!(
        "compose + digest of every machine, all provisions minted ({runs} runs): {}",
        median(times)
    );

    let known: BTreeMap<String, Known> = cache
        .iter()
        .map(|(m, d)| {
            (
                m.clone(),
                Known {
                    last_sent: Some(*d),
                    confirmed: true,
                    running_mounts: BTreeMap::new(),
                    last_summary: None,
                    drifted: Vec::new(),
                },
            )
        })
        .collect();

    // A model change on one machine: an env value of one module.
    let mut changed = world.module("m5000-s3").expect("module").clone();
    changed.env.insert("LOG".into(), "2".into());
    let mut times = Vec::new();
    let mut sends = 0;
    for _ in 0..runs {
        let mut w = world.clone();
        let mut c = cache.clone();
        let t = Instant::now();
        let touched = w.put_module(changed.clone());
        c.refresh(&w, &touched).expect("refresh");
        let p = plan_target(&w, &c, &known, Target::Machine("n5000".into()));
        times.push(t.elapsed());
        sends = p.sends.len();
    }
    println!(
        "push n5000 after an env change (refresh + plan, {sends} send, {runs} runs): {}",
        median(times)
    );

    // A change that mints: a new need on n5000 from a module on n9000, cascading to n9000.
    let mut needy = world.module("m5000-s4").expect("module").clone();
    needy.consumes.push(Need {
        kind: "k4".into(),
        from: "m9000-s4".into(),
    });
    let mut times = Vec::new();
    let mut shape = String::new();
    for _ in 0..runs {
        let mut w = world.clone();
        let mut c = cache.clone();
        let t = Instant::now();
        let touched = w.put_module(needy.clone());
        c.refresh(&w, &touched).expect("refresh");
        let p = plan_target(&w, &c, &known, Target::Machine("n5000".into()));
        times.push(t.elapsed());
        shape = format!(
            "{} sends, {} mint, {} rounds",
            p.sends.len(),
            p.mints.len(),
            p.rounds
        );
    }
    println!(
        "push n5000 after a new need (refresh + plan, {shape}, {runs} runs): {}",
        median(times)
    );
}
