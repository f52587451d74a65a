//! Push planning (G1, G8): which machines one push sends, which provisions it mints, which machines
//! it holds because a running module's mount would move. Pure: the controller passes what it knows
//! and a secret source, and commits the mints and send records the plan returns.

use std::collections::{BTreeMap, BTreeSet};

use super::compose::{ComposeError, MintRequest, Pending, World, compose_with, digest, mint};
use super::declaration::{Declaration, Digest};
use super::model::Provision;

/// Backstop on cascade rounds. Each round sends at least one machine not yet planned, so a correct
/// plan never needs more rounds than the mesh has machines; this catches a broken invariant.
pub const cascade_rounds_max: u32 = 100_000;

/// The should-be digest of every machine, built once for the whole mesh and refreshed only for the
/// machines a change touches.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DigestCache {
    digests: BTreeMap<String, Digest>,
}

impl DigestCache {
    /// Composes every machine of the world.
    pub fn build(world: &World) -> Result<DigestCache, ComposeError> {
        let mut cache = DigestCache::default();
        cache.refresh(world, world.machine_names())?;
        Ok(cache)
    }

    /// Recomposes `machines` (those a model change or a commit of mints touched); a machine no
    /// longer in the mesh is dropped.
    pub fn refresh<I, S>(&mut self, world: &World, machines: I) -> Result<(), ComposeError>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        for m in machines {
            let m = m.as_ref();
            if world.machine(m).is_none() {
                self.digests.remove(m);
                continue;
            }
            let composed = compose_with(world, &Pending::default(), m)?;
            self.digests
                .insert(m.to_string(), digest(&composed.declaration));
        }
        Ok(())
    }

    /// Records the should-be digests a plan computed, once its mints are committed.
    pub fn apply(&mut self, plan: &PushPlan) {
        for (m, d) in &plan.digests {
            self.digests.insert(m.clone(), *d);
        }
    }

    pub fn get(&self, machine: &str) -> Option<Digest> {
        self.digests.get(machine).copied()
    }

    pub fn iter(&self) -> impl Iterator<Item = (&String, &Digest)> {
        self.digests.iter()
    }
}

/// What the controller knows of one machine. A machine missing from the map was never sent to.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Known {
    pub last_sent: Option<Digest>,
    /// Whether a report confirmed the last send was applied.
    pub confirmed: bool,
    /// Running modules → mount name → host_dir, from the last send summary and the account.
    pub running_mounts: BTreeMap<String, BTreeMap<String, String>>,
}

/// Which machines a push starts from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Target {
    /// `push <machine>`
    Machine(String),
    /// `push --behind`: every machine whose should-be digest is not the last sent, or whose last
    /// send is unconfirmed.
    Behind,
    /// `push --all`
    All,
}

/// Why a machine is in a push.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Reason {
    Named,
    /// A mint made while composing `because` changed this machine's declaration (G1).
    Cascaded {
        because: String,
    },
    Behind,
    All,
}

impl std::fmt::Display for Reason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Reason::Named => write!(f, "named"),
            Reason::Cascaded { because } => write!(f, "cascaded from {because}"),
            Reason::Behind => write!(f, "behind"),
            Reason::All => write!(f, "all"),
        }
    }
}

/// One machine to send to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PlannedSend {
    pub machine: String,
    pub reason: Reason,
    pub declaration: Declaration,
    pub digest: Digest,
}

/// A machine not sent because a running module's mount would get another host directory (G8).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Hold {
    pub machine: String,
    pub module: String,
    pub mount: String,
    pub old_dir: String,
    pub new_dir: String,
}

impl std::fmt::Display for Hold {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "push held on {m}: module {module} mount {mount} would move from {old} to {new}; run `meshctl push {m} --move {module}` to accept",
            m = self.machine,
            module = self.module,
            mount = self.mount,
            old = self.old_dir,
            new = self.new_dir,
        )
    }
}

/// Everything one push does: sends in plan order (targets first, then each cascade round), the
/// provisions to commit before any send, every hold, and the cascade rounds it took.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PushPlan {
    pub sends: Vec<PlannedSend>,
    pub mints: Vec<Provision>,
    /// Sorted by machine, module, mount.
    pub holds: Vec<Hold>,
    pub rounds: u32,
    /// Should-be digest of every machine the plan composed (sent or held), for [`DigestCache::apply`].
    pub digests: BTreeMap<String, Digest>,
}

/// Why a push cannot be planned.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PlanError {
    #[error(transparent)]
    Compose(#[from] ComposeError),
    #[error(
        "`--move {module}` cannot take effect: {reason}; drop the flag or name the right module"
    )]
    MoveNotApplicable { module: String, reason: String },
    #[error(
        "push cascaded for {rounds} rounds over {machines} machines, past its limit; this is a bug in planning, report it"
    )]
    TooManyRounds { rounds: u32, machines: usize },
    #[error(
        "machine {machine} still wants provisions after every round; this is a bug in planning, report it"
    )]
    Unminted { machine: String },
}

/// Everything a plan needs, as arguments.
pub struct PlanInput<'a> {
    pub world: &'a World,
    pub cache: &'a DigestCache,
    pub known: &'a BTreeMap<String, Known>,
    pub target: &'a Target,
    /// Modules whose mounts may move (`--move`).
    pub moves: &'a BTreeSet<String>,
    /// Gives the secret for each provision minted; core never generates one.
    pub secret: &'a mut dyn FnMut(&MintRequest) -> String,
}

/// Plans one push: compose the targets (minting what they want), then cascade to every machine whose
/// should-be digest those mints changed, round after round, then hold what would move a mount.
pub fn plan(input: PlanInput<'_>) -> Result<PushPlan, PlanError> {
    let PlanInput {
        world,
        cache,
        known,
        target,
        moves,
        secret,
    } = input;
    let mut order: Vec<(String, Reason)> = targets(world, cache, known, target)?;
    let mut planned: BTreeSet<String> = order.iter().map(|(m, _)| m.clone()).collect();
    let mut pending = Pending::default();
    let mut frontier: Vec<String> = planned.iter().cloned().collect();
    let mut rounds = 0u32;
    let machines = world.machine_count();
    while !frontier.is_empty() {
        rounds += 1;
        if rounds > cascade_rounds_max || rounds as usize > machines {
            return Err(PlanError::TooManyRounds { rounds, machines });
        }
        let touched = mint_round(world, &mut pending, &frontier, secret)?;
        frontier.clear();
        for (machine, because) in touched {
            if planned.contains(&machine) {
                continue;
            }
            let d = digest(&compose_with(world, &pending, &machine)?.declaration);
            if cache.get(&machine) != Some(d) {
                planned.insert(machine.clone());
                order.push((machine.clone(), Reason::Cascaded { because }));
                frontier.push(machine);
            }
        }
    }
    finish(world, known, moves, order, pending, rounds)
}

/// The machines a push starts from, in name order.
fn targets(
    world: &World,
    cache: &DigestCache,
    known: &BTreeMap<String, Known>,
    target: &Target,
) -> Result<Vec<(String, Reason)>, PlanError> {
    let out = match target {
        Target::Machine(m) if world.machine(m).is_some() => vec![(m.clone(), Reason::Named)],
        Target::Machine(m) => return Err(ComposeError::UnknownMachine(m.clone()).into()),
        Target::All => world
            .machine_names()
            .map(|m| (m.clone(), Reason::All))
            .collect(),
        Target::Behind => world
            .machine_names()
            .filter(|m| is_behind(cache, known.get(*m), m))
            .map(|m| (m.clone(), Reason::Behind))
            .collect(),
    };
    Ok(out)
}

fn is_behind(cache: &DigestCache, known: Option<&Known>, machine: &str) -> bool {
    match known {
        None => true,
        Some(k) => !k.confirmed || k.last_sent != cache.get(machine),
    }
}

/// Composes each frontier machine and mints what it wants. Returns every machine a mint touched
/// (provider and consumer side) with the machine whose compose minted it.
fn mint_round(
    world: &World,
    pending: &mut Pending,
    frontier: &[String],
    secret: &mut dyn FnMut(&MintRequest) -> String,
) -> Result<BTreeMap<String, String>, PlanError> {
    let mut touched = BTreeMap::new();
    for machine in frontier {
        let composed = compose_with(world, pending, machine)?;
        for request in composed.wanted {
            let p = mint(&request, secret(&request));
            for m in [&p.provider.machine, &p.consumer.machine] {
                touched.entry(m.clone()).or_insert_with(|| machine.clone());
            }
            pending.insert(p);
        }
    }
    Ok(touched)
}

/// Composes every planned machine once more with all the push's mints, then splits sends from holds.
fn finish(
    world: &World,
    known: &BTreeMap<String, Known>,
    moves: &BTreeSet<String>,
    order: Vec<(String, Reason)>,
    pending: Pending,
    rounds: u32,
) -> Result<PushPlan, PlanError> {
    let mut sends = Vec::new();
    let mut holds = Vec::new();
    let mut moving = BTreeSet::new();
    let mut digests = BTreeMap::new();
    for (machine, reason) in order {
        let composed = compose_with(world, &pending, &machine)?;
        if !composed.wanted.is_empty() {
            return Err(PlanError::Unminted { machine });
        }
        let declaration = composed.declaration;
        let d = digest(&declaration);
        digests.insert(machine.clone(), d);
        let (held, moved) = mount_moves(&declaration, known.get(&machine), moves);
        moving.extend(moved);
        if held.is_empty() {
            sends.push(PlannedSend {
                machine,
                reason,
                declaration,
                digest: d,
            });
        } else {
            holds.extend(held);
        }
    }
    check_moves(world, moves, &digests, &moving)?;
    holds.sort();
    Ok(PushPlan {
        sends,
        mints: pending.into_provisions(),
        holds,
        rounds,
        digests,
    })
}

/// Every mount of a running module that would get another host_dir: holds for modules not in
/// `moves`, and the names of the modules in `moves` whose mounts do move.
fn mount_moves(
    declaration: &Declaration,
    known: Option<&Known>,
    moves: &BTreeSet<String>,
) -> (Vec<Hold>, BTreeSet<String>) {
    let mut holds = Vec::new();
    let mut moved = BTreeSet::new();
    let Some(known) = known else {
        return (holds, moved);
    };
    for module in &declaration.modules {
        let Some(running) = known.running_mounts.get(&module.name) else {
            continue;
        };
        for mount in &module.mounts {
            let Some(old_dir) = running.get(&mount.name) else {
                continue;
            };
            if *old_dir == mount.host_dir {
                continue;
            }
            if moves.contains(&module.name) {
                moved.insert(module.name.clone());
                continue;
            }
            holds.push(Hold {
                machine: declaration.machine.clone(),
                module: module.name.clone(),
                mount: mount.name.clone(),
                old_dir: old_dir.clone(),
                new_dir: mount.host_dir.clone(),
            });
        }
    }
    (holds, moved)
}

/// A `--move` that cannot take effect is refused rather than ignored.
fn check_moves(
    world: &World,
    moves: &BTreeSet<String>,
    planned: &BTreeMap<String, Digest>,
    moving: &BTreeSet<String>,
) -> Result<(), PlanError> {
    for module in moves {
        let refuse = |reason: String| PlanError::MoveNotApplicable {
            module: module.clone(),
            reason,
        };
        let Some(m) = world.module(module) else {
            return Err(refuse(format!("there is no module {module} in the mesh")));
        };
        if !planned.contains_key(&m.machine) {
            return Err(refuse(format!(
                "its machine {} is not in this push",
                m.machine
            )));
        }
        if !moving.contains(module) {
            return Err(refuse(format!(
                "no mount of {module} on {} moves to another directory",
                m.machine
            )));
        }
    }
    Ok(())
}
