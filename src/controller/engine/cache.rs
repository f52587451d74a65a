//! The compose cache (G1): the world and every machine's should-be digest, built from one
//! snapshot of the domain state and brought to any later snapshot by diffing that snapshot against
//! the world itself, so a write nobody told the cache about (a settings write, another leader's
//! mints) costs only the machines it touches. Pure: the caller hands in the snapshots.
//!
//! The cache keeps no snapshot (decision 0283): a snapshot held here made every later store write
//! copy the whole domain state (`Arc::make_mut` in the state machine), and kept the copy alive
//! until the next refresh: a second model in memory (100+ MiB at 10,000 machines x 10 modules).

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};

use crate::controller::api::ApiError;
use crate::core::compose::World;
use crate::core::plan::DigestCache;
use crate::core::settings::Scope;
use crate::store::state::DomainState;

/// The world and should-be digests, current for one revision of the domain state.
#[derive(Default)]
pub(crate) struct Work {
    /// The revision the world and digests are current for; `None` before the first build.
    built_at: Option<u64>,
    world: World,
    cache: DigestCache,
}

impl Work {
    /// The revision the cache is current for; `None` before the first refresh.
    #[cfg(test)]
    pub(crate) fn revision(&self) -> Option<u64> {
        self.built_at
    }

    pub(crate) fn world(&self) -> &World {
        &self.world
    }

    pub(crate) fn cache(&self) -> &DigestCache {
        &self.cache
    }

    /// Makes the world and digests current for `state`: nothing when the revision is the same
    /// (the revision bumps with every change that can alter a declaration), else the machines the
    /// change between the world and `state` touches are recomposed. A change the diff cannot place
    /// (a machine removed, a module moved to another machine) rebuilds everything.
    pub(crate) fn refresh(&mut self, state: &Arc<DomainState>) -> Result<(), ApiError> {
        let Some(built_at) = self.built_at else {
            return self.rebuild(state);
        };
        if built_at == state.revision {
            return Ok(());
        }
        match self.diff(state) {
            Some(touched) => {
                let refreshed = self.cache.refresh(&self.world, &touched);
                if let Err(e) = refreshed {
                    self.built_at = None;
                    return Err(not_composing(state.revision, &e));
                }
                self.built_at = Some(state.revision);
                Ok(())
            }
            None => self.rebuild(state),
        }
    }

    fn rebuild(&mut self, state: &Arc<DomainState>) -> Result<(), ApiError> {
        self.built_at = None;
        let world = World::new(state.mesh.clone(), state.provisions.values().cloned())
            .with_revoked(crate::store::revoked::declared(&state.revoked))
            .with_signers(state.signers.clone());
        let cache = DigestCache::build(&world).map_err(|e| not_composing(state.revision, &e))?;
        self.world = world;
        self.cache = cache;
        self.built_at = Some(state.revision);
        Ok(())
    }

    /// Brings the world to `new` and returns the machines to recompose; `None` (world untouched)
    /// when only a rebuild is right. The world holds what the last build or diff put in it, so it
    /// is the "before" of the diff.
    fn diff(&mut self, new: &DomainState) -> Option<BTreeSet<String>> {
        // The deny list is in every declaration: a change to it recomposes everything.
        if crate::store::revoked::declared(&new.revoked) != *self.world.revoked()
            || new.signers != *self.world.signers()
        {
            return None;
        }
        let machine_gone = self
            .world
            .machine_names()
            .any(|m| !new.mesh.machines.contains_key(m));
        let module_moved = new.mesh.modules.iter().any(|(name, m)| {
            self.world
                .module(name)
                .is_some_and(|o| o.machine != m.machine)
        });
        if machine_gone || module_moved {
            return None;
        }
        let mut touched = BTreeSet::new();
        for (name, machine) in &new.mesh.machines {
            if self.world.machine(name) != Some(machine) {
                touched.extend(self.world.put_machine(machine.clone()));
            }
        }
        let gone: Vec<String> = self
            .world
            .module_names()
            .filter(|name| !new.mesh.modules.contains_key(name))
            .cloned()
            .collect();
        for name in gone {
            touched.extend(self.world.remove_module(&name));
        }
        for (name, module) in new.mesh.modules.iter_shared() {
            if self
                .world
                .module_shared(name)
                .is_some_and(|held| Arc::ptr_eq(held, module))
            {
                continue;
            }
            // The state decoded its own copy of an unchanged module (a model apply): hold that
            // one, so the two share it again (decision 0290). A changed module is put.
            if !self.world.share_module(module) {
                touched.extend(self.world.put_module_shared(module.clone()));
            }
        }
        let new_layers = &new.mesh.settings.layers;
        let scopes: BTreeSet<Scope> = self
            .world
            .settings()
            .layers
            .keys()
            .chain(new_layers.keys())
            .cloned()
            .collect();
        for scope in scopes {
            if self.world.settings().layers.get(&scope) != new_layers.get(&scope) {
                let layer = new_layers.get(&scope).cloned();
                touched.extend(self.world.put_layer(scope, layer));
            }
        }
        // A provision changes the compose of exactly its two sides: the consumer's machine (its
        // provision and endpoint, or a want once it is gone) and the provider's (its grant).
        let changed: Vec<String> = self
            .world
            .provision_ids()
            .filter(|id| new.provisions.get(*id) != self.world.provision(id))
            .cloned()
            .collect();
        for id in changed {
            if let Some(p) = self.world.remove_provision(&id) {
                touched.insert(p.consumer.machine.clone());
                touched.insert(p.provider.machine.clone());
            }
        }
        for (id, p) in &new.provisions {
            if self.world.provision(id) != Some(p) {
                self.world.insert_provision(p.clone());
                touched.insert(p.consumer.machine.clone());
                touched.insert(p.provider.machine.clone());
            }
        }
        Some(touched)
    }
}

fn not_composing(revision: u64, e: &dyn std::fmt::Display) -> ApiError {
    ApiError::internal(format!(
        "the stored model does not compose at revision {revision}: {e}"
    ))
}

/// The leader's one compose cache, shared by push, plan, status and apply. Its lock is held only
/// while computing — never across a network wait — so no reader waits for a push.
#[derive(Default)]
pub(crate) struct Cache {
    work: Mutex<Work>,
}

impl Cache {
    /// Runs `f` on the cache made current for `state`.
    pub(crate) fn with<R>(
        &self,
        state: &Arc<DomainState>,
        f: impl FnOnce(&Work) -> R,
    ) -> Result<R, ApiError> {
        let mut work = self.work.lock().unwrap_or_else(|poisoned| {
            // A panic mid-refresh may have left the world half-changed: start over.
            let mut work = poisoned.into_inner();
            work.built_at = None;
            work
        });
        work.refresh(state)?;
        Ok(f(&work))
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::core::compose::{Pending, compose_with, mint};
    use crate::core::model::{Machine, Mesh, Module, Need, Provide};

    pub(crate) fn module(name: &str, machine: &str) -> Module {
        Module {
            name: name.into(),
            machine: machine.into(),
            command: "sleep".into(),
            args: vec!["600".into()],
            env: Default::default(),
            files: Default::default(),
            mounts: vec![],
            ready: None,
            after: vec![],
            provides: vec![],
            consumes: vec![],
        }
    }

    fn state(revision: u64, mesh: Mesh) -> DomainState {
        DomainState {
            revision,
            mesh,
            ..DomainState::default()
        }
    }

    fn mesh() -> Mesh {
        let mut mesh = Mesh::default();
        for m in ["a", "b", "c"] {
            mesh.machines.insert(
                m.into(),
                Machine {
                    name: m.into(),
                    address: "127.0.0.1".into(),
                },
            );
        }
        let mut db = module("db", "a");
        db.provides.push(Provide {
            kind: "pg".into(),
            port: Some(5432),
        });
        let mut app = module("app", "b");
        app.consumes.push(Need {
            kind: "pg".into(),
            from: "db".into(),
        });
        mesh.modules.insert("db".into(), db);
        mesh.modules.insert("app".into(), app);
        mesh.modules.insert("cron".into(), module("cron", "c"));
        mesh
    }

    fn rebuilt(state: &DomainState) -> DigestCache {
        let world = World::new(state.mesh.clone(), state.provisions.values().cloned())
            .with_revoked(crate::store::revoked::declared(&state.revoked))
            .with_signers(state.signers.clone());
        DigestCache::build(&world).expect("composes")
    }

    /// The provisions `state`'s wants would mint, each with secret `secret`.
    fn minted(
        state: &DomainState,
        secret: &str,
    ) -> BTreeMap<String, crate::core::model::Provision> {
        let world = World::new(state.mesh.clone(), state.provisions.values().cloned())
            .with_revoked(crate::store::revoked::declared(&state.revoked))
            .with_signers(state.signers.clone());
        let mut out = BTreeMap::new();
        for m in world.machine_names() {
            let composed = compose_with(&world, &Pending::default(), m).expect("composes");
            for w in composed.wanted {
                let p = mint(&w, secret.to_string());
                out.insert(p.id.clone(), p);
            }
        }
        out
    }

    #[test]
    fn g1_cache_advanced_after_a_write_equals_a_full_rebuild() {
        // G1: the should-be digests the leader keeps after a write are exactly what a full compose
        // gives, so a push cascades from the right baseline.
        let old = Arc::new(state(1, mesh()));
        let mut changed = mesh();
        if let Some(db) = changed.modules.get_mut("db") {
            db.env.insert("LOG".into(), "debug".into());
        }
        changed.modules.remove("cron");
        changed.modules.insert("web".into(), module("web", "c"));
        changed.settings.layers.insert(
            Scope::Module("app".into()),
            BTreeMap::from([("k".to_string(), "v".to_string())]),
        );
        if let Some(b) = changed.machines.get_mut("b") {
            b.address = "10.0.0.2".into();
        }
        let new = Arc::new(state(2, changed));
        let mut work = Work::default();
        work.refresh(&old).expect("old composes");
        let before = work.cache.clone();
        work.refresh(&new).expect("advances");
        assert_eq!(work.cache, rebuilt(&new));
        assert_ne!(work.cache, before);
        assert_eq!(work.revision(), Some(2));
    }

    #[test]
    fn the_cache_holds_no_second_copy_of_a_module_the_state_holds() {
        // Decision 0290: the world shares each module with the state it was brought to, also
        // after a model apply decoded fresh copies of unchanged modules, so the model is held
        // once. A changed module is the state's copy too.
        let first = Arc::new(state(1, mesh()));
        let mut work = Work::default();
        work.refresh(&first).expect("composes");
        let shared = |work: &Work, state: &DomainState| {
            state.mesh.modules.iter_shared().all(|(name, module)| {
                work.world()
                    .module_shared(name)
                    .is_some_and(|held| Arc::ptr_eq(held, module))
            })
        };
        assert!(shared(&work, &first), "built from the state: shared");
        // As the state machine holds a model it applied: decoded, every module a new copy.
        let bytes = mesh_codec::encode("mesh", &first.mesh).expect("encode");
        let mut decoded: Mesh = mesh_codec::decode("mesh", &bytes).expect("decode");
        if let Some(cron) = decoded.modules.get_mut("cron") {
            cron.args = vec!["700".into()];
        }
        let applied = Arc::new(state(2, decoded));
        assert!(!shared(&work, &applied), "fresh copies before the refresh");
        work.refresh(&applied).expect("advances");
        assert!(shared(&work, &applied), "after it, one copy of each module");
        assert_eq!(work.cache, rebuilt(&applied));
    }

    #[test]
    fn g1_cache_caught_up_over_several_revisions_of_mints_and_revocations_equals_a_rebuild() {
        // G1: the cache is not told about writes any more; it diffs its snapshot against the new
        // one, whatever the jump: mints committed (revisions 1 → 5), then a consumer dropped and a
        // provision revoked with a settings write in between (5 → 9), must equal a full compose.
        let first = Arc::new(state(1, mesh()));
        let mut work = Work::default();
        work.refresh(&first).expect("composes");
        let mut with_mints = state(5, mesh());
        with_mints.provisions = minted(&with_mints, "s1");
        assert!(
            !with_mints.provisions.is_empty(),
            "app wants a pg provision"
        );
        let with_mints = Arc::new(with_mints);
        work.refresh(&with_mints).expect("advances");
        assert_eq!(work.cache, rebuilt(&with_mints));
        let mut dropped = (*with_mints).clone();
        dropped.revision = 9;
        dropped.mesh.modules.remove("app");
        dropped.provisions.clear();
        dropped.mesh.settings.layers.insert(
            Scope::Mesh,
            BTreeMap::from([("k".to_string(), "v".to_string())]),
        );
        let dropped = Arc::new(dropped);
        work.refresh(&dropped).expect("advances");
        assert_eq!(work.cache, rebuilt(&dropped));
        // A re-mint with another secret changes both sides' digests, in place.
        let mut reminted = (*with_mints).clone();
        reminted.revision = 10;
        reminted.provisions = minted(&reminted, "s2");
        let reminted = Arc::new(reminted);
        work.refresh(&with_mints)
            .expect("a lower revision is a jump too");
        work.refresh(&reminted).expect("advances");
        assert_eq!(work.cache, rebuilt(&reminted));
    }

    #[test]
    fn g1_provider_recomposed_when_a_consumer_comes_back_to_a_kept_provision() {
        // G1 (chaos partitions seed 1107): app consumes pg from db (on a) and its provision is
        // minted; app leaves the model, the provision stays (stale, granted to nobody); app comes
        // back where it was, so the provision is live again and db's machine carries the grant
        // once more. The provider's should-be must follow, or status calls a forever behind
        // after every push (the push composes from the world, status reads the cache).
        let mut minted_state = state(1, mesh());
        minted_state.provisions = minted(&minted_state, "s1");
        assert!(
            !minted_state.provisions.is_empty(),
            "app wants a pg provision"
        );
        let with_app = Arc::new(minted_state);
        let mut gone = (*with_app).clone();
        gone.revision = 2;
        gone.mesh.modules.remove("app");
        let gone = Arc::new(gone);
        let mut back = (*with_app).clone();
        back.revision = 3;
        let back = Arc::new(back);
        let mut work = Work::default();
        work.refresh(&with_app).expect("composes");
        work.refresh(&gone).expect("advances");
        assert_eq!(work.cache, rebuilt(&gone));
        work.refresh(&back).expect("advances");
        assert_eq!(
            work.cache.get("a"),
            rebuilt(&back).get("a"),
            "the provider's digest"
        );
        assert_eq!(work.cache, rebuilt(&back));
        // A consumer that newly needs a provider it did not before touches that provider too.
        let mut fresh = Work::default();
        fresh.refresh(&gone).expect("composes");
        let mut needs_again = (*gone).clone();
        needs_again.revision = 4;
        let mut app = module("app", "b");
        app.consumes.push(Need {
            kind: "pg".into(),
            from: "db".into(),
        });
        needs_again.mesh.modules.insert("app".into(), app);
        let needs_again = Arc::new(needs_again);
        fresh.refresh(&needs_again).expect("advances");
        assert_eq!(fresh.cache, rebuilt(&needs_again));
    }

    /// One step of the walk below: a change an operator or a push makes to the stored state.
    fn step(prev: &DomainState, what: usize, n: u64) -> DomainState {
        let mut next = prev.clone();
        next.revision = prev.revision + 1;
        let app_on = |machine: &str, needs: bool| {
            let mut app = module("app", machine);
            if needs {
                app.consumes.push(Need {
                    kind: "pg".into(),
                    from: "db".into(),
                });
            }
            app
        };
        match what {
            0 => {
                next.mesh.modules.remove("app");
            }
            1 => {
                next.mesh.modules.insert("app".into(), app_on("b", true));
            }
            2 => {
                next.mesh.modules.insert("app".into(), app_on("c", true));
            }
            3 => {
                next.mesh.modules.insert("app".into(), app_on("b", false));
            }
            4 => {
                next.mesh.settings.layers.insert(
                    Scope::Module("db".into()),
                    BTreeMap::from([("mode".to_string(), format!("v{n}"))]),
                );
            }
            _ => {
                let more = minted(&next, &format!("s{n}"));
                next.provisions.extend(more);
            }
        }
        next
    }

    #[test]
    fn g1_cache_walked_through_every_short_sequence_of_changes_equals_a_rebuild_at_each_step() {
        // G1: every sequence of four changes the chaos workload makes (the consumer gone, back,
        // moved, not needing; a settings write on the provider; mints) leaves the cache equal to
        // a full compose after each step, whatever came before.
        let changes = 6usize;
        for walk in 0..changes.pow(4) {
            let mut current = Arc::new(state(1, mesh()));
            let mut work = Work::default();
            work.refresh(&current).expect("composes");
            let mut rest = walk;
            for n in 0..4u64 {
                let what = rest % changes;
                rest /= changes;
                let next = Arc::new(step(&current, what, n));
                work.refresh(&next).expect("advances");
                assert_eq!(
                    work.cache,
                    rebuilt(&next),
                    "walk {walk}: step {n} (change {what})"
                );
                current = next;
            }
        }
    }

    #[test]
    fn cache_rebuilds_when_a_machine_leaves_or_a_module_moves() {
        let old = Arc::new(state(1, mesh()));
        let mut moved = mesh();
        if let Some(cron) = moved.modules.get_mut("cron") {
            cron.machine = "a".into();
        }
        moved.machines.remove("c");
        let new = Arc::new(state(2, moved));
        let cache = Cache::default();
        cache.with(&old, |_| ()).expect("composes");
        let got = cache.with(&new, |w| w.cache().clone()).expect("composes");
        assert_eq!(got, rebuilt(&new));
    }
}
