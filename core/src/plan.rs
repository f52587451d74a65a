//! Push planning (G1, G8): which machines one push sends, which provisions it mints, which machines
//! it holds because a running module's mount would move. Pure: the controller passes what it knows
//! and a secret source, and commits the mints and send records the plan returns.

use std::collections::{BTreeMap, BTreeSet};

use super::compose::{ComposeError, MintRequest, Pending, World, compose_with, digest, mint};
use super::declaration::{Declaration, Digest};
use super::model::Provision;
use super::summary::{Summary, summarize};

/// Backstop on cascade rounds. Each round sends at least one machine not yet planned, so a correct
/// plan never needs more rounds than the mesh has machines; this catches a broken invariant.
pub const cascade_rounds_max: u32 = 100_000;

/// What a push would leave one machine as, composed from the model and the committed provisions:
/// its digest, and the mints its compose still wants (a push of it mints them first).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ShouldBe {
    pub digest: Digest,
    /// Sorted; empty once every need of the machine is minted.
    pub wanted: Vec<MintRequest>,
}

/// The should-be of every machine, built once for the whole mesh and refreshed only for the
/// machines a change touches. `status`, `apply`, `plan`, `push` and `push --behind` all read it
/// through [`lags`]: there is no second definition of "behind".
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DigestCache {
    entries: BTreeMap<String, ShouldBe>,
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
                self.entries.remove(m);
                continue;
            }
            let composed = compose_with(world, &Pending::default(), m)?;
            let entry = ShouldBe {
                digest: digest(&composed.declaration),
                wanted: composed.wanted,
            };
            self.entries.insert(m.to_string(), entry);
        }
        Ok(())
    }

    /// Records the should-be digests a plan computed, once its mints are committed: every machine
    /// the plan composed had all its wants minted.
    pub fn apply(&mut self, plan: &PushPlan) {
        for (m, d) in &plan.digests {
            let entry = ShouldBe {
                digest: *d,
                wanted: Vec::new(),
            };
            self.entries.insert(m.clone(), entry);
        }
    }

    /// The should-be digest of `machine`, as composed from what is committed.
    pub fn get(&self, machine: &str) -> Option<Digest> {
        self.entries.get(machine).map(|e| e.digest)
    }

    pub fn should_be(&self, machine: &str) -> Option<&ShouldBe> {
        self.entries.get(machine)
    }

    pub fn iter(&self) -> impl Iterator<Item = (&String, &Digest)> {
        self.entries.iter().map(|(m, e)| (m, &e.digest))
    }
}

/// Why a machine is behind: what a push would still change on it. Empty when it is up to date.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Lag {
    /// Nothing was ever sent to it.
    pub never_sent: bool,
    /// The last send is not confirmed applied by a report.
    pub unconfirmed: bool,
    /// Its should-be declaration differs from the last send (new settings, endpoints, revoked
    /// grants, modules...).
    pub changed: bool,
    /// Ids of provisions its modules consume that are not minted yet.
    pub mints: Vec<String>,
    /// Ids of provisions that would be issued from its modules once their consumers are pushed.
    pub grants: Vec<String>,
    /// What its last report says differs from the declaration it runs, as `module: what`
    /// (decision 0305); a push restores it.
    pub drifted: Vec<String>,
}

impl Lag {
    pub fn is_behind(&self) -> bool {
        self.never_sent
            || self.unconfirmed
            || self.changed
            || !self.mints.is_empty()
            || !self.grants.is_empty()
            || !self.drifted.is_empty()
    }

    /// Short words for one status line: `never sent`, `changed`, `2 mints pending`...
    pub fn reasons(&self) -> Vec<String> {
        let mut out = Vec::new();
        if self.never_sent {
            out.push("never sent".to_string());
        } else if self.unconfirmed {
            out.push("last send unconfirmed".to_string());
        }
        if self.changed && !self.never_sent {
            out.push("declaration changed".to_string());
        }
        let count = |n: usize, what: &str| {
            let plural = if n == 1 { "" } else { "s" };
            format!("{n} {what}{plural} pending")
        };
        if !self.mints.is_empty() {
            out.push(count(self.mints.len(), "mint"));
        }
        if !self.grants.is_empty() {
            out.push(count(self.grants.len(), "grant"));
        }
        if !self.drifted.is_empty() {
            out.push(format!("{drifted_reason}{}", self.drifted.join(", ")));
        }
        out
    }
}

/// How [`Lag::reasons`] names drift: `drifted: broker: conf/broker.conf changed`.
pub const drifted_reason: &str = "drifted: ";

/// How far every machine of the cache is from its should-be: the one definition of "behind".
pub fn lags(cache: &DigestCache, known: &BTreeMap<String, Known>) -> BTreeMap<String, Lag> {
    let mut out: BTreeMap<String, Lag> = BTreeMap::new();
    for (machine, should_be) in &cache.entries {
        let lag = out.entry(machine.clone()).or_default();
        match known.get(machine) {
            None => {
                lag.never_sent = true;
                lag.changed = true;
            }
            Some(k) => {
                lag.unconfirmed = !k.confirmed;
                lag.changed = k.last_sent != Some(should_be.digest);
                lag.drifted = k.drifted.clone();
            }
        }
        lag.mints = should_be.wanted.iter().map(|w| w.id()).collect();
        for w in &should_be.wanted {
            let provider = out.entry(w.provider.machine.clone()).or_default();
            provider.grants.push(w.id());
        }
    }
    // A provider entry made before its own machine's turn, or for a machine not in the cache.
    out.retain(|m, _| cache.entries.contains_key(m));
    for lag in out.values_mut() {
        lag.grants.sort();
        lag.grants.dedup();
    }
    out
}

/// What the controller knows of one machine. A machine missing from the map was never sent to.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Known {
    pub last_sent: Option<Digest>,
    /// Whether a report confirmed the last send was applied.
    pub confirmed: bool,
    /// Running modules → mount name → host_dir, from the last send summary and the account.
    pub running_mounts: BTreeMap<String, BTreeMap<String, String>>,
    /// The summary of the last send, for the cascade's links (G1). Shared with the store's send
    /// record: a plan over 10,000 machines copies no summary (decision 0287).
    pub last_summary: Option<std::sync::Arc<Summary>>,
    /// What the last report says differs from the declaration the host runs, as `module: what`
    /// (decision 0305): a drifted machine is behind until a push restores it.
    pub drifted: Vec<String>,
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
    /// A module moved between this machine and `because` (G1: both machines in one push).
    Moved {
        module: String,
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
            Reason::Moved { module, because } => {
                write!(f, "cascaded from {because}: module {module} moved")
            }
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
    /// Machines held (see `holds`), with what they would have been sent, in plan order.
    pub held: Vec<PlannedSend>,
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

/// Plans one push: compose the targets (minting what they want), then cascade (G1) to every machine
/// whose declaration differs from its last send because of a target's part of the model — its links
/// to a target (provisions from it, grants to it, endpoints) or a module that moved between them —
/// and, round after round, to every machine the push's mints change; then hold what would move a
/// mount. Machines behind for other reasons are not swept in.
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
    let targets: Vec<String> = planned.iter().cloned().collect();
    let mut frontier = targets.clone();
    let mut rounds = 0u32;
    let machines = world.machine_count();
    while !frontier.is_empty() {
        rounds += 1;
        if rounds > cascade_rounds_max || rounds as usize > machines {
            return Err(PlanError::TooManyRounds { rounds, machines });
        }
        let touched = mint_round(world, &mut pending, &frontier, secret)?;
        let mut next = Vec::new();
        if rounds == 1 {
            for (machine, reason) in dependents(world, &pending, known, &targets)? {
                if planned.insert(machine.clone()) {
                    order.push((machine.clone(), reason));
                    next.push(machine);
                }
            }
        }
        for (machine, because) in touched {
            if planned.contains(&machine) {
                continue;
            }
            let d = digest(&compose_with(world, &pending, &machine)?.declaration);
            if cache.get(&machine) != Some(d) {
                planned.insert(machine.clone());
                order.push((machine.clone(), Reason::Cascaded { because }));
                next.push(machine);
            }
        }
        frontier = next;
    }
    finish(world, known, moves, order, pending, rounds)
}

/// Machines outside `targets` whose declaration differs from their last send because of a target's
/// part of the model: a module moved between them, or their links to the target changed (a new or
/// re-minted provision, a moved endpoint, a grant added or revoked). In target order, then name.
fn dependents(
    world: &World,
    pending: &Pending,
    known: &BTreeMap<String, Known>,
    targets: &[String],
) -> Result<Vec<(String, Reason)>, PlanError> {
    let is_target: BTreeSet<&String> = targets.iter().collect();
    let mut out: Vec<(String, Reason)> = Vec::new();
    let mut seen: BTreeSet<String> = BTreeSet::new();
    for x in targets {
        let last = known.get(x).and_then(|k| k.last_summary.as_deref());
        for (y, module) in moved_between(world, known, x, last) {
            if !is_target.contains(&y) && seen.insert(y.clone()) {
                let reason = Reason::Moved {
                    module,
                    because: x.clone(),
                };
                out.push((y, reason));
            }
        }
        let mut providers: BTreeSet<String> = world.modules_on(x).map(|m| m.name.clone()).collect();
        let mut candidates = world.linked_machines(x);
        if let Some(last) = last {
            providers.extend(last.modules.keys().cloned());
            candidates.extend(last.linked_machines());
        }
        for y in candidates {
            if is_target.contains(&y) || seen.contains(&y) || world.machine(&y).is_none() {
                continue;
            }
            let composed = compose_with(world, pending, &y)?;
            let mut now = summarize(&composed.declaration).links(&providers, x);
            for w in &composed.wanted {
                if providers.contains(&w.provider.module) {
                    let key = format!(
                        "{} consumes {} from {}",
                        w.consumer.module, w.kind, w.provider.module
                    );
                    now.consumed.insert(
                        key,
                        format!("{} from {} (to be minted)", w.kind, w.provider),
                    );
                }
            }
            let was = known
                .get(&y)
                .and_then(|k| k.last_summary.as_ref())
                .map(|s| s.links(&providers, x))
                // allow(empty-on-error): a machine never sent had no links
                .unwrap_or_default();
            if was.moved_by_other(&now) {
                seen.insert(y.clone());
                let reason = Reason::Cascaded { because: x.clone() };
                out.push((y, reason));
            }
        }
    }
    Ok(out)
}

/// Machines a module moved to or from `machine` since its last send, with the module: modules it
/// last ran that the model now places elsewhere, and modules now placed on it that another
/// machine last ran.
fn moved_between(
    world: &World,
    known: &BTreeMap<String, Known>,
    machine: &str,
    last: Option<&Summary>,
) -> Vec<(String, String)> {
    let mut out = Vec::new();
    if let Some(last) = last {
        for module in last.modules.keys() {
            if let Some(now) = world.module(module)
                && now.machine != machine
            {
                out.push((now.machine.clone(), module.clone()));
            }
        }
    }
    let arrived: Vec<&str> = world
        .modules_on(machine)
        .map(|m| m.name.as_str())
        .filter(|m| last.is_none_or(|s| !s.modules.contains_key(*m)))
        .collect();
    if arrived.is_empty() {
        return out;
    }
    for (other, k) in known {
        if other == machine {
            continue;
        }
        let Some(summary) = &k.last_summary else {
            continue;
        };
        for module in &arrived {
            if summary.modules.contains_key(*module) {
                out.push((other.clone(), module.to_string()));
            }
        }
    }
    out
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
        Target::Behind => {
            let lags = lags(cache, known);
            world
                .machine_names()
                .filter(|m| lags.get(*m).is_some_and(Lag::is_behind))
                .map(|m| (m.clone(), Reason::Behind))
                .collect()
        }
    };
    Ok(out)
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
    let mut held_sends = Vec::new();
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
            held_sends.push(PlannedSend {
                machine,
                reason,
                declaration,
                digest: d,
            });
        }
    }
    check_moves(world, moves, &digests, &moving)?;
    holds.sort();
    Ok(PushPlan {
        sends,
        held: held_sends,
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
