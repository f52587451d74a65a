//! Compose: the model and the provisions already minted become one declaration per machine, with its
//! canonical bytes and digest. Pure and deterministic: the same state gives the same bytes whatever
//! order maps were filled in; composing one machine costs in proportion to that machine.

use serde::{Deserialize, Serialize};
use std::collections::hash_map::DefaultHasher;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::hash::BuildHasherDefault;
use std::sync::Arc;

use super::declaration::{Declaration, DeclaredModule, Digest, Grant, ProvisionRef};
use super::model::{Machine, Mesh, Module, Placement, Provision};
use super::settings::{Layer, Scope, Settings, effective};

/// A hash map with a fixed-key hasher: lookups by name cost one or two cache misses instead of a
/// string compare per tree level (which dominated compose at 10,000 machines), and nothing about
/// it is random. Compose never iterates one; every output is sorted.
type Map<V> = HashMap<String, V, BuildHasherDefault<DefaultHasher>>;

/// The model plus every provision minted so far, with the indexes compose needs to touch only one
/// machine's share: modules by machine, provisions by consumer machine and by provider machine.
#[derive(Clone, Debug, Default)]
pub struct World {
    machines: Map<Machine>,
    machine_names: BTreeSet<String>,
    /// Shared with the state the world was built from (decision 0290).
    modules: Map<Arc<Module>>,
    settings: Settings,
    provisions: Map<Provision>,
    /// machine → its modules, sorted.
    modules_on: Map<BTreeSet<String>>,
    /// provider module → modules that consume from it (their endpoint follows the provider).
    consumers_of: Map<BTreeSet<String>>,
    by_consumer_machine: Map<BTreeSet<String>>,
    by_provider_machine: Map<BTreeSet<String>>,
    /// The deny list every declaration carries (decision 0172).
    revoked: BTreeMap<String, String>,
    /// The added replicas' envelope keys every declaration carries (decision 0230).
    signers: BTreeMap<u64, [u8; 32]>,
}

impl World {
    /// Indexes `mesh` and `provisions` (keyed by id; any iteration order gives the same world).
    /// The same world with `revoked` as the deny list every declaration carries.
    pub fn with_revoked(mut self, revoked: BTreeMap<String, String>) -> World {
        self.revoked = revoked;
        self
    }

    /// The same world with `signers` as the added replicas' keys every declaration carries.
    pub fn with_signers(mut self, signers: BTreeMap<u64, [u8; 32]>) -> World {
        self.signers = signers;
        self
    }

    pub fn new(mesh: Mesh, provisions: impl IntoIterator<Item = Provision>) -> World {
        let mut world = World {
            settings: mesh.settings,
            ..World::default()
        };
        for (name, machine) in mesh.machines {
            world.machine_names.insert(name.clone());
            world.machines.insert(name, machine);
        }
        for (name, module) in mesh.modules.into_shared() {
            index_module(&mut world.modules_on, &mut world.consumers_of, &module);
            world.modules.insert(name, module);
        }
        for p in provisions {
            world.insert_provision(p);
        }
        world
    }

    /// The model as a [`Mesh`] (a copy: for storing or printing, not for hot paths).
    pub fn to_mesh(&self) -> Mesh {
        Mesh {
            machines: self
                .machines
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
            modules: self
                .modules
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
            settings: self.settings.clone(),
        }
    }

    pub fn machine(&self, name: &str) -> Option<&Machine> {
        self.machines.get(name)
    }

    /// Machine names, sorted.
    pub fn machine_names(&self) -> impl Iterator<Item = &String> {
        self.machine_names.iter()
    }

    pub fn machine_count(&self) -> usize {
        self.machine_names.len()
    }

    pub fn module(&self, name: &str) -> Option<&Module> {
        self.modules.get(name).map(|m| &**m)
    }

    /// The module as shared, to compare by pointer with a state's copy.
    pub fn module_shared(&self, name: &str) -> Option<&Arc<Module>> {
        self.modules.get(name)
    }

    /// Holds `module` in place of an equal copy: nothing about any declaration changes, so no
    /// machine is touched; only the memory is shared with whoever else holds it. `false` (and
    /// nothing held) when the world has no equal module: that one goes through
    /// [`World::put_module_shared`] instead.
    pub fn share_module(&mut self, module: &Arc<Module>) -> bool {
        match self.modules.get_mut(&module.name) {
            Some(held) if **held == **module => {
                *held = module.clone();
                true
            }
            _ => false,
        }
    }

    pub fn settings(&self) -> &Settings {
        &self.settings
    }

    pub fn provision(&self, id: &str) -> Option<&Provision> {
        self.provisions.get(id)
    }

    /// Every module's name, in no order.
    pub fn module_names(&self) -> impl Iterator<Item = &String> {
        self.modules.keys()
    }

    /// Every provision's id, in no order.
    pub fn provision_ids(&self) -> impl Iterator<Item = &String> {
        self.provisions.keys()
    }

    /// The deny list every declaration carries.
    pub fn revoked(&self) -> &BTreeMap<String, String> {
        &self.revoked
    }

    /// The added replicas' envelope keys every declaration carries.
    pub fn signers(&self) -> &BTreeMap<u64, [u8; 32]> {
        &self.signers
    }

    /// Every provision, sorted by id.
    pub fn provisions_sorted(&self) -> Vec<&Provision> {
        let mut all: Vec<&Provision> = self.provisions.values().collect();
        all.sort_by(|a, b| a.id.cmp(&b.id));
        all
    }

    /// The modules placed on `machine`, sorted by name.
    pub fn modules_on(&self, machine: &str) -> impl Iterator<Item = &Module> {
        self.modules_on
            .get(machine)
            .into_iter()
            .flatten()
            .filter_map(|name| self.modules.get(name).map(|m| &**m))
    }

    /// Provisions whose consumer runs on `machine`, sorted by id.
    pub fn consumed_on(&self, machine: &str) -> impl Iterator<Item = &Provision> {
        self.indexed(&self.by_consumer_machine, machine)
    }

    /// Provisions issued from a provider on `machine`, sorted by id.
    pub fn provided_on(&self, machine: &str) -> impl Iterator<Item = &Provision> {
        self.indexed(&self.by_provider_machine, machine)
    }

    fn indexed<'a>(
        &'a self,
        index: &'a Map<BTreeSet<String>>,
        machine: &str,
    ) -> impl Iterator<Item = &'a Provision> {
        index
            .get(machine)
            .into_iter()
            .flatten()
            .filter_map(|id| self.provisions.get(id))
    }

    /// Adds a committed provision; returns the one it replaced, if the id was taken.
    pub fn insert_provision(&mut self, p: Provision) -> Option<Provision> {
        let old = self.remove_provision(&p.id);
        self.by_consumer_machine
            .entry(p.consumer.machine.clone())
            .or_default()
            .insert(p.id.clone());
        self.by_provider_machine
            .entry(p.provider.machine.clone())
            .or_default()
            .insert(p.id.clone());
        self.provisions.insert(p.id.clone(), p);
        old
    }

    /// Removes a provision (a revoked or stale one); returns it if it existed.
    pub fn remove_provision(&mut self, id: &str) -> Option<Provision> {
        let p = self.provisions.remove(id)?;
        remove_from(&mut self.by_consumer_machine, &p.consumer.machine, id);
        remove_from(&mut self.by_provider_machine, &p.provider.machine, id);
        Some(p)
    }

    /// Adds or replaces a machine; returns the machines whose declaration may change (its own, and
    /// those consuming from it, whose endpoints carry its address).
    pub fn put_machine(&mut self, machine: Machine) -> BTreeSet<String> {
        let mut touched = BTreeSet::from([machine.name.clone()]);
        for module in self.modules_on(&machine.name) {
            touched.extend(self.consumer_machines(&module.name));
        }
        self.machine_names.insert(machine.name.clone());
        self.machines.insert(machine.name.clone(), machine);
        touched
    }

    /// Adds or replaces a module; returns the machines whose declaration may change: its old and
    /// new machine, every machine consuming from it, and the machines of the providers it consumed
    /// from before and consumes from now (a provision kept while it was gone, or while it did not
    /// need that kind, is live again and granted once more on the provider's side).
    pub fn put_module(&mut self, module: Module) -> BTreeSet<String> {
        self.put_module_shared(Arc::new(module))
    }

    /// [`World::put_module`] of a module held elsewhere too (no copy).
    pub fn put_module_shared(&mut self, module: Arc<Module>) -> BTreeSet<String> {
        let mut touched = self.remove_module(&module.name);
        touched.insert(module.machine.clone());
        touched.extend(self.consumer_machines(&module.name));
        for need in &module.consumes {
            if let Some(provider) = self.modules.get(&need.from) {
                touched.insert(provider.machine.clone());
            }
        }
        index_module(&mut self.modules_on, &mut self.consumers_of, &module);
        self.modules.insert(module.name.clone(), module);
        touched
    }

    /// Removes a module; returns the machines whose declaration may change.
    pub fn remove_module(&mut self, name: &str) -> BTreeSet<String> {
        let Some(module) = self.modules.remove(name) else {
            return BTreeSet::new();
        };
        let mut touched = BTreeSet::from([module.machine.clone()]);
        touched.extend(self.consumer_machines(name));
        // Its providers' grants stop listing it.
        for need in &module.consumes {
            if let Some(provider) = self.modules.get(&need.from) {
                touched.insert(provider.machine.clone());
            }
            remove_from(&mut self.consumers_of, &need.from, name);
        }
        remove_from(&mut self.modules_on, &module.machine, name);
        touched
    }

    /// Sets (or with `None` removes) the layer at `scope`; returns the machines it reaches.
    pub fn put_layer(&mut self, scope: Scope, layer: Option<Layer>) -> BTreeSet<String> {
        let touched: BTreeSet<String> = match &scope {
            Scope::Mesh => self.machine_names.clone(),
            Scope::Machine(m) | Scope::Placement { machine: m, .. } => BTreeSet::from([m.clone()]),
            Scope::Module(m) => self
                .modules
                .get(m)
                .map(|module| module.machine.clone())
                .into_iter()
                .collect(),
        };
        match layer {
            Some(layer) => self.settings.layers.insert(scope, layer),
            None => self.settings.layers.remove(&scope),
        };
        touched
    }

    /// Machines linked to `machine` by the model or by a committed provision (live or stale):
    /// those consuming from its modules, those its modules consume from, and the other side of
    /// every provision issued to or from it. Never `machine` itself.
    pub fn linked_machines(&self, machine: &str) -> BTreeSet<String> {
        let mut out = BTreeSet::new();
        for module in self.modules_on(machine) {
            out.extend(self.consumer_machines(&module.name));
            for need in &module.consumes {
                if let Some(provider) = self.modules.get(&need.from) {
                    out.insert(provider.machine.clone());
                }
            }
        }
        for p in self.consumed_on(machine) {
            out.insert(p.provider.machine.clone());
        }
        for p in self.provided_on(machine) {
            out.insert(p.consumer.machine.clone());
        }
        out.remove(machine);
        out
    }

    fn consumer_machines(&self, provider: &str) -> BTreeSet<String> {
        let mut out = BTreeSet::new();
        for consumer in self.consumers_of.get(provider).into_iter().flatten() {
            if let Some(m) = self.modules.get(consumer) {
                out.insert(m.machine.clone());
            }
        }
        out
    }
}

fn index_module(
    modules_on: &mut Map<BTreeSet<String>>,
    consumers_of: &mut Map<BTreeSet<String>>,
    module: &Module,
) {
    modules_on
        .entry(module.machine.clone())
        .or_default()
        .insert(module.name.clone());
    for need in &module.consumes {
        consumers_of
            .entry(need.from.clone())
            .or_default()
            .insert(module.name.clone());
    }
}

fn remove_from(index: &mut Map<BTreeSet<String>>, key: &str, item: &str) {
    if let Some(set) = index.get_mut(key) {
        set.remove(item);
        if set.is_empty() {
            index.remove(key);
        }
    }
}

/// A provision a consumer's machine needs that is not minted yet. The controller mints it (with a
/// secret it generates) and commits it before any send carries it.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct MintRequest {
    pub kind: String,
    pub consumer: Placement,
    pub provider: Placement,
    /// `<consumer-module>-<consumer-machine>`: a name the provider can route by (a vhost, a user).
    pub name: String,
}

impl MintRequest {
    /// The id the minted provision will have.
    pub fn id(&self) -> String {
        provision_id(&self.kind, &self.consumer, &self.provider)
    }
}

/// Provisions minted by a push being planned and not committed yet, indexed like the world's so a
/// cascade composes each machine in proportion to that machine.
#[derive(Clone, Debug, Default)]
pub struct Pending {
    provisions: Map<Provision>,
    by_provider_machine: Map<BTreeSet<String>>,
}

impl Pending {
    pub fn insert(&mut self, p: Provision) {
        self.by_provider_machine
            .entry(p.provider.machine.clone())
            .or_default()
            .insert(p.id.clone());
        self.provisions.insert(p.id.clone(), p);
    }

    pub fn get(&self, id: &str) -> Option<&Provision> {
        self.provisions.get(id)
    }

    pub fn is_empty(&self) -> bool {
        self.provisions.is_empty()
    }

    /// Every pending provision, sorted by id.
    pub fn into_provisions(self) -> Vec<Provision> {
        let mut all: Vec<Provision> = self.provisions.into_values().collect();
        all.sort_by(|a, b| a.id.cmp(&b.id));
        all
    }

    fn provided_on(&self, machine: &str) -> impl Iterator<Item = &Provision> {
        self.by_provider_machine
            .get(machine)
            .into_iter()
            .flatten()
            .filter_map(|id| self.provisions.get(id))
    }
}

/// One machine's declaration and the provisions it still needs minted.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Composed {
    pub declaration: Declaration,
    /// Sorted by id; empty once every need of the machine is minted.
    pub wanted: Vec<MintRequest>,
}

/// Why a machine could not be composed. A validated mesh file never gives these; a model edited
/// some other way can.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ComposeError {
    #[error("machine {0} is not in the mesh; add it under [machines.{0}] or check the name")]
    UnknownMachine(String),
    #[error(
        "module {consumer} consumes {kind} from {from}, which is not a module of the mesh; fix `from` or add the module"
    )]
    UnknownProvider {
        consumer: String,
        kind: String,
        from: String,
    },
    #[error(
        "module {consumer} consumes {kind} from {from}, which does not provide {kind}; add it to {from}'s `provides`"
    )]
    NotProvided {
        consumer: String,
        kind: String,
        from: String,
    },
    #[error(
        "provision id {id} is already taken by another consumer/provider pair; the ids collided, mint it again under another kind or name"
    )]
    IdCollision { id: String },
}

/// The id of the provision of `kind` from `provider` to `consumer`: `p-` and 12 hex digits of
/// blake3 over the three, so re-composing never mints the same need twice.
pub fn provision_id(kind: &str, consumer: &Placement, provider: &Placement) -> String {
    id_of([
        kind,
        &consumer.module,
        &consumer.machine,
        &provider.module,
        &provider.machine,
    ])
}

/// [`provision_id`] from `[kind, consumer module, consumer machine, provider module, provider
/// machine]`, without building placements.
fn id_of(parts: [&str; 5]) -> String {
    let mut h = blake3::Hasher::new();
    // Names are [a-z0-9-], so NUL separators keep the fields apart.
    for part in parts {
        h.update(part.as_bytes());
        h.update(&[0]);
    }
    let hex = h.finalize().to_hex();
    format!("p-{}", &hex.as_str()[..12])
}

/// Characters of a minted secret: the controller draws 32 random bytes and writes them in hex.
/// Sizing a declaration before its provisions are minted counts a secret this long.
pub const minted_secret_chars: usize = 64;

/// Makes a provision from a request and a secret the caller generated; core never generates one.
pub fn mint(request: &MintRequest, secret: String) -> Provision {
    Provision {
        id: request.id(),
        kind: request.kind.clone(),
        consumer: request.consumer.clone(),
        provider: request.provider.clone(),
        name: request.name.clone(),
        secret,
    }
}

/// Composes `machine` from the world alone.
pub fn compose(world: &World, machine: &str) -> Result<Composed, ComposeError> {
    compose_with(world, &Pending::default(), machine)
}

/// Composes `machine` as if the `extra` provisions (minted by a push being planned) were committed.
pub fn compose_with(
    world: &World,
    extra: &Pending,
    machine: &str,
) -> Result<Composed, ComposeError> {
    let node = world
        .machines
        .get(machine)
        .ok_or_else(|| ComposeError::UnknownMachine(machine.to_string()))?;
    let issued = issued_from(world, extra, machine);
    let mut modules = Vec::new();
    let mut wanted = Vec::new();
    for module in world.modules_on(machine) {
        let (provisions, mut wants) = consumed(world, extra, node, module)?;
        wanted.append(&mut wants);
        let grants = issued
            .get(module.name.as_str())
            .cloned()
            // allow(empty-on-error): a module that provides to no one is issued no grants
            .unwrap_or_default();
        modules.push(declare(world, module, provisions, grants));
    }
    wanted.sort();
    Ok(Composed {
        declaration: Declaration {
            machine: machine.to_string(),
            modules,
            revoked: world.revoked.clone(),
            signers: world.signers.clone(),
        },
        wanted,
    })
}

fn declare(
    world: &World,
    module: &Module,
    provisions: Vec<ProvisionRef>,
    grants: Vec<Grant>,
) -> DeclaredModule {
    let mut mounts = module.mounts.clone();
    mounts.sort();
    let mut after = module.after.clone();
    after.sort();
    after.dedup();
    DeclaredModule {
        name: module.name.clone(),
        command: module.command.clone(),
        args: module.args.clone(),
        env: module.env.clone(),
        settings: effective(&world.settings, &module.name, &module.machine),
        files: module.files.clone(),
        mounts,
        ready: module.ready.as_deref().cloned(),
        after,
        provisions,
        grants,
    }
}

/// The provisions `module` consumes that are minted (as refs, sorted by id) and those still wanted.
fn consumed(
    world: &World,
    extra: &Pending,
    node: &Machine,
    module: &Module,
) -> Result<(Vec<ProvisionRef>, Vec<MintRequest>), ComposeError> {
    let mut refs = Vec::new();
    let mut wanted = Vec::new();
    for need in &module.consumes {
        let (provider, port) = provider_of(world, module, &need.kind, &need.from)?;
        let parts = [
            need.kind.as_str(),
            &module.name,
            &node.name,
            &provider.name,
            &provider.machine,
        ];
        let id = id_of(parts);
        let Some(p) = world.provisions.get(&id).or_else(|| extra.get(&id)) else {
            wanted.push(MintRequest {
                kind: need.kind.clone(),
                consumer: placement(&module.name, &node.name),
                provider: placement(&provider.name, &provider.machine),
                name: format!("{}-{}", module.name, node.name),
            });
            continue;
        };
        let found = [
            p.kind.as_str(),
            &p.consumer.module,
            &p.consumer.machine,
            &p.provider.module,
            &p.provider.machine,
        ];
        if found != parts {
            return Err(ComposeError::IdCollision { id });
        }
        let endpoint = port.and_then(|port| {
            let host = world.machines.get(&provider.machine)?;
            Some(endpoint(&host.address, port))
        });
        refs.push(ProvisionRef {
            id,
            kind: p.kind.clone(),
            provider: p.provider.clone(),
            name: p.name.clone(),
            secret: p.secret.clone(),
            endpoint,
        });
    }
    refs.sort_by(|a, b| a.id.cmp(&b.id));
    refs.dedup_by(|a, b| a.id == b.id);
    wanted.sort();
    wanted.dedup();
    Ok((refs, wanted))
}

fn placement(module: &str, machine: &str) -> Placement {
    Placement {
        module: module.to_string(),
        machine: machine.to_string(),
    }
}

fn provider_of<'w>(
    world: &'w World,
    consumer: &Module,
    kind: &str,
    from: &str,
) -> Result<(&'w Module, Option<u16>), ComposeError> {
    let err = |unknown: bool| {
        let (consumer, kind, from) = (consumer.name.clone(), kind.to_string(), from.to_string());
        if unknown {
            ComposeError::UnknownProvider {
                consumer,
                kind,
                from,
            }
        } else {
            ComposeError::NotProvided {
                consumer,
                kind,
                from,
            }
        }
    };
    let provider = world.modules.get(from).ok_or_else(|| err(true))?;
    let provide = provider
        .provides
        .iter()
        .find(|p| p.kind == kind)
        .ok_or_else(|| err(false))?;
    Ok((provider, provide.port))
}

/// Grants per provider module on `machine`, sorted by id: every live provision issued from it.
fn issued_from<'w>(
    world: &'w World,
    extra: &'w Pending,
    machine: &str,
) -> BTreeMap<&'w str, Vec<Grant>> {
    let mut out: BTreeMap<&str, Vec<Grant>> = BTreeMap::new();
    let extra_here = extra.provided_on(machine);
    let mut seen = BTreeSet::new();
    for p in world.provided_on(machine).chain(extra_here) {
        if !is_live(world, p) || !seen.insert(p.id.as_str()) {
            continue;
        }
        out.entry(p.provider.module.as_str())
            .or_default()
            .push(Grant {
                id: p.id.clone(),
                kind: p.kind.clone(),
                consumer: p.consumer.clone(),
                name: p.name.clone(),
                secret_blake3: blake3::hash(p.secret.as_bytes()).to_hex().to_string(),
            });
    }
    for grants in out.values_mut() {
        grants.sort_by(|a, b| a.id.cmp(&b.id));
    }
    out
}

/// A provision is live while its consumer still sits where it did and still needs that kind from
/// that provider, which still provides it there. A stale one is granted to nobody.
fn is_live(world: &World, p: &Provision) -> bool {
    let modules = &world.modules;
    let consumer_needs = modules.get(&p.consumer.module).is_some_and(|m| {
        m.machine == p.consumer.machine
            && m.consumes
                .iter()
                .any(|n| n.kind == p.kind && n.from == p.provider.module)
    });
    let provider_offers = modules.get(&p.provider.module).is_some_and(|m| {
        m.machine == p.provider.machine && m.provides.iter().any(|o| o.kind == p.kind)
    });
    consumer_needs && provider_offers
}

/// The canonical bytes of a declaration: the same declaration always gives the same bytes.
pub fn declaration_bytes(declaration: &Declaration) -> Vec<u8> {
    // Encoding plain structs of strings, vectors and ordered maps into a Vec cannot fail: bincode's
    // size limit applies only to decoding, and every sequence has a known length.
    mesh_codec::encode("declaration", declaration)
        .expect("a declaration always encodes: no size limit on encode, all lengths known")
}

/// blake3 of [`declaration_bytes`]. Covers no epoch: a declaration has none.
pub fn digest(declaration: &Declaration) -> Digest {
    Digest(*blake3::hash(&declaration_bytes(declaration)).as_bytes())
}

/// `address:port` as a consumer dials it; an IPv6 address goes in brackets (`[fd00::5]:5432`), as
/// `host:port` parsers expect, whether the mesh file wrote it with them or not.
pub fn endpoint(address: &str, port: u16) -> String {
    if address.contains(':') && !address.starts_with('[') {
        format!("[{address}]:{port}")
    } else {
        format!("{address}:{port}")
    }
}

#[cfg(test)]
mod tests {
    use super::endpoint;

    #[test]
    fn an_ipv6_machine_address_is_bracketed_in_endpoints() {
        // Issue 15: IPv6 included; `fd00::5:5432` would be one address with no port.
        assert_eq!(endpoint("fd00::5", 5432), "[fd00::5]:5432");
        assert_eq!(endpoint("[fd00::5]", 5432), "[fd00::5]:5432");
        assert_eq!(endpoint("10.0.0.5", 5432), "10.0.0.5:5432");
        assert_eq!(endpoint("db.lan", 5432), "db.lan:5432");
    }
}
