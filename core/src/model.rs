//! The model an operator declares: machines, modules placed on them, and what they provide and need.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

use super::flat::FlatMap;
use super::settings::Settings;

/// Everything an operator declared, at one model revision.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Mesh {
    pub machines: BTreeMap<String, Machine>,
    /// Module names are unique across the mesh; each module is placed on exactly one machine.
    pub modules: ModuleMap,
    pub settings: Settings,
}

/// A host in the mesh, running `mesh-host`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Machine {
    pub name: String,
    /// Where other machines reach this one's provided endpoints (`127.0.0.1` in `meshctl dev`).
    pub address: String,
}

/// A unit that runs on one machine as a supervised process.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Module {
    pub name: String,
    pub machine: String,
    pub command: String,
    pub args: Vec<String>,
    pub env: FlatMap<String, String>,
    /// Relative path under the module's directory → content.
    pub files: FlatMap<String, String>,
    pub mounts: Vec<Mount>,
    /// Boxed: most modules have none, and inline it would be 56 of the bytes of each of the
    /// model's modules, 100,000 at the fleet's size (decision 0337).
    pub ready: Option<Box<Probe>>,
    /// Modules on the same machine that must be ready before this one starts (G12).
    pub after: Vec<String>,
    pub provides: Vec<Provide>,
    pub consumes: Vec<Need>,
}

/// A host directory handed to a module: `host_dir` is absolute, `target` is relative to the module's
/// directory (a link there points at `host_dir`).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Mount {
    pub name: String,
    pub host_dir: String,
    pub target: String,
}

/// How a host decides a module is ready. Every probe has a timeout.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Probe {
    /// A TCP connect to `addr` (`host:port`) succeeds.
    Tcp { addr: String, timeout_ms: u64 },
    /// A file exists at `path`, relative to the module's directory.
    File { path: String, timeout_ms: u64 },
    /// A command exits 0.
    Command {
        command: String,
        args: Vec<String>,
        timeout_ms: u64,
    },
}

/// A kind of service a module offers, and the port it listens on (on its machine's address).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Provide {
    pub kind: String,
    pub port: Option<u16>,
}

/// A need for a kind of service from a named provider module (possibly on another machine).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Need {
    pub kind: String,
    pub from: String,
}

/// `module@machine`: one placement of a module.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Placement {
    pub module: String,
    pub machine: String,
}

impl std::fmt::Display for Placement {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}@{}", self.module, self.machine)
    }
}

/// A secret handed to a consumer, minted by the controller while composing the consumer's machine and
/// committed to the store before any send carries it. The core never generates the secret.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Provision {
    pub id: String,
    pub kind: String,
    pub consumer: Placement,
    pub provider: Placement,
    /// A name the provider can route by, e.g. a vhost.
    pub name: String,
    pub secret: String,
}

/// A mesh's modules by name, each behind an `Arc` so that the store's state and the compose
/// cache's world hold one copy between them (decision 0290). It reads and writes as a map of
/// `Module`s (a write to a shared module copies that one module) and serializes as one, so the
/// bytes of a model are what they were.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct ModuleMap(BTreeMap<String, Arc<Module>>);

impl ModuleMap {
    pub fn new() -> ModuleMap {
        ModuleMap::default()
    }

    /// Sets `name` to `module`; the module it replaced, if any.
    pub fn insert(&mut self, name: String, module: Module) -> Option<Arc<Module>> {
        self.0.insert(name, Arc::new(module))
    }

    /// Sets `name` to a module held elsewhere too (no copy).
    pub fn insert_shared(&mut self, name: String, module: Arc<Module>) -> Option<Arc<Module>> {
        self.0.insert(name, module)
    }

    pub fn get(&self, name: &str) -> Option<&Module> {
        self.0.get(name).map(|m| &**m)
    }

    /// The module as shared: another holder can keep the same copy.
    pub fn get_shared(&self, name: &str) -> Option<&Arc<Module>> {
        self.0.get(name)
    }

    /// The module to change; copied first if another holder shares it.
    pub fn get_mut(&mut self, name: &str) -> Option<&mut Module> {
        self.0.get_mut(name).map(Arc::make_mut)
    }

    pub fn contains_key(&self, name: &str) -> bool {
        self.0.contains_key(name)
    }

    pub fn remove(&mut self, name: &str) -> Option<Arc<Module>> {
        self.0.remove(name)
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Name and module, by name.
    pub fn iter(&self) -> impl DoubleEndedIterator<Item = (&String, &Module)> + ExactSizeIterator {
        self.0.iter().map(|(k, m)| (k, &**m))
    }

    /// Name and shared module, by name.
    pub fn iter_shared(
        &self,
    ) -> impl DoubleEndedIterator<Item = (&String, &Arc<Module>)> + ExactSizeIterator {
        self.0.iter()
    }

    pub fn keys(&self) -> impl DoubleEndedIterator<Item = &String> + ExactSizeIterator {
        self.0.keys()
    }

    pub fn values(&self) -> impl DoubleEndedIterator<Item = &Module> + ExactSizeIterator {
        self.0.values().map(|m| &**m)
    }

    /// Every module to change, each copied first if another holder shares it.
    pub fn values_mut(
        &mut self,
    ) -> impl DoubleEndedIterator<Item = &mut Module> + ExactSizeIterator {
        self.0.values_mut().map(Arc::make_mut)
    }

    /// The modules as shared, by name, for a holder that keeps them.
    pub fn into_shared(self) -> std::collections::btree_map::IntoIter<String, Arc<Module>> {
        self.0.into_iter()
    }
}

impl std::ops::Index<&str> for ModuleMap {
    type Output = Module;

    /// As `BTreeMap`'s: panics when there is no such module (tests; code uses `get`).
    fn index(&self, name: &str) -> &Module {
        match self.get(name) {
            Some(m) => m,
            None => panic!("no module named {name} in the map"),
        }
    }
}

impl fmt::Debug for ModuleMap {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_map().entries(self.iter()).finish()
    }
}

impl FromIterator<(String, Module)> for ModuleMap {
    fn from_iter<I: IntoIterator<Item = (String, Module)>>(pairs: I) -> ModuleMap {
        ModuleMap(pairs.into_iter().map(|(k, m)| (k, Arc::new(m))).collect())
    }
}

impl FromIterator<(String, Arc<Module>)> for ModuleMap {
    /// Modules held elsewhere too, not copied.
    fn from_iter<I: IntoIterator<Item = (String, Arc<Module>)>>(pairs: I) -> ModuleMap {
        ModuleMap(pairs.into_iter().collect())
    }
}

impl<const N: usize> From<[(String, Module); N]> for ModuleMap {
    fn from(pairs: [(String, Module); N]) -> ModuleMap {
        pairs.into_iter().collect()
    }
}

impl Extend<(String, Module)> for ModuleMap {
    fn extend<I: IntoIterator<Item = (String, Module)>>(&mut self, pairs: I) {
        self.0
            .extend(pairs.into_iter().map(|(k, m)| (k, Arc::new(m))));
    }
}

impl<'a> IntoIterator for &'a ModuleMap {
    type Item = (&'a String, &'a Module);
    type IntoIter = std::iter::Map<
        std::collections::btree_map::Iter<'a, String, Arc<Module>>,
        fn((&'a String, &'a Arc<Module>)) -> (&'a String, &'a Module),
    >;

    fn into_iter(self) -> Self::IntoIter {
        fn unshared<'a>((k, m): (&'a String, &'a Arc<Module>)) -> (&'a String, &'a Module) {
            (k, m)
        }
        self.0.iter().map(unshared)
    }
}

impl IntoIterator for ModuleMap {
    type Item = (String, Module);
    type IntoIter = std::iter::Map<
        std::collections::btree_map::IntoIter<String, Arc<Module>>,
        fn((String, Arc<Module>)) -> (String, Module),
    >;

    /// Each module taken out of its `Arc`, copied only if another holder still shares it.
    fn into_iter(self) -> Self::IntoIter {
        fn owned((k, m): (String, Arc<Module>)) -> (String, Module) {
            (k, Arc::unwrap_or_clone(m))
        }
        self.0.into_iter().map(owned)
    }
}

impl Serialize for ModuleMap {
    /// As the `BTreeMap<String, Module>` it replaced: a map in name order.
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_map(self.iter())
    }
}

impl<'de> Deserialize<'de> for ModuleMap {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<ModuleMap, D::Error> {
        let modules = BTreeMap::<String, Module>::deserialize(deserializer)?;
        Ok(modules.into_iter().collect())
    }
}

#[cfg(test)]
mod tests {
    use super::Module;

    #[test]
    fn a_shared_module_of_the_model_fits_in_256_bytes() {
        // Issue 24 item 4 (decision 0337): the leader holds the model's modules as `Arc<Module>`,
        // 100,000 at the fleet's size; the allocator rounds 257 to 320 bytes, so each byte over
        // 256 (the module and the Arc's two counts) costs 64 per module, 6 MiB in all.
        let shared = std::mem::size_of::<Module>() + 2 * std::mem::size_of::<usize>();
        assert!(shared <= 256, "an Arc<Module> takes {shared} bytes");
    }
}
