//! The process runtime: turns a validated declaration into supervised modules, changing only what
//! changed. Identical modules keep running untouched; removed ones stop; changed ones restart; a
//! module whose grants alone changed gets its grants file rewritten without a restart.

use std::collections::BTreeMap;
use std::path::Path;

use super::board::Board;
use super::drift::{self, ExpectedFile, ExpectedMount, ProgramSeen};
use super::layout::Layout;
use super::probe::Check;
use super::supervise::{Spec, Supervisor, kill_group};
use super::validate::{mount_var, setting_var};
use crate::core::declaration::{Declaration, DeclaredModule};
use crate::core::report::{ModuleState, ModuleStatus};

/// `PATH` given to modules when the host itself has none.
const default_path: &str = "/usr/local/bin:/usr/bin:/bin";

/// What one apply did, by module name.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ApplyOutcome {
    pub started: Vec<String>,
    pub restarted: Vec<String>,
    pub stopped: Vec<String>,
    /// Grants file rewritten, process untouched.
    pub regranted: Vec<String>,
    pub unchanged: Vec<String>,
    /// Modules whose directory could not be prepared, with why; they are reported failed.
    pub failed: Vec<(String, String)>,
}

struct Running {
    module: DeclaredModule,
    supervisor: Option<Supervisor>,
    /// The board generation its supervisor writes under.
    generation: u64,
    /// What its directory holds as written (decision 0305), computed once at start.
    expected: Option<(Vec<ExpectedFile>, Vec<ExpectedMount>)>,
}

/// The modules this host runs now.
pub struct Runtime {
    layout: Layout,
    machine: String,
    board: Board,
    running: BTreeMap<String, Running>,
    generation: u64,
}

enum Change {
    Added,
    Same,
    GrantsOnly,
    Changed,
}

impl Runtime {
    pub fn new(layout: Layout, machine: &str) -> Runtime {
        Runtime {
            layout,
            machine: machine.to_string(),
            board: Board::new(),
            running: BTreeMap::new(),
            generation: 0,
        }
    }

    /// Every module's status, sorted by name.
    pub fn status(&self) -> Vec<ModuleStatus> {
        self.board.snapshot()
    }

    /// The board the supervisors write to, for watching module states change.
    pub fn board(&self) -> Board {
        self.board.clone()
    }

    /// Makes the machine run `decl` (already validated), touching only what changed.
    pub async fn apply(&mut self, decl: &Declaration) -> ApplyOutcome {
        let mut outcome = ApplyOutcome::default();
        let next: BTreeMap<&str, &DeclaredModule> =
            decl.modules.iter().map(|m| (m.name.as_str(), m)).collect();
        let removed: Vec<String> = self
            .running
            .keys()
            .filter(|name| !next.contains_key(name.as_str()))
            .cloned()
            .collect();
        let mut to_start: Vec<(&DeclaredModule, Option<DeclaredModule>)> = Vec::new();
        let mut to_stop = Vec::new();
        for (name, module) in &next {
            match self.classify(module) {
                Change::Same => outcome.unchanged.push(name.to_string()),
                Change::GrantsOnly => self.regrant(module, &mut outcome),
                Change::Added => to_start.push((module, None)),
                Change::Changed => {
                    if let Some(old) = self.running.remove(*name) {
                        to_stop.extend(old.supervisor);
                        to_start.push((module, Some(old.module)));
                    }
                }
            }
        }
        for name in &removed {
            if let Some(old) = self.running.remove(name) {
                to_stop.extend(old.supervisor);
            }
        }
        // Stop everything that goes in parallel: each may take the whole grace period.
        futures::future::join_all(to_stop.into_iter().map(Supervisor::stop)).await;
        for name in removed {
            self.forget(&name);
            outcome.stopped.push(name);
        }
        for (module, previous) in to_start {
            let restarted = previous.is_some();
            if let Err(e) = self.start(module, previous.as_ref()) {
                outcome.failed.push((module.name.clone(), e));
            }
            let list = match restarted {
                true => &mut outcome.restarted,
                false => &mut outcome.started,
            };
            list.push(module.name.clone());
        }
        outcome
    }

    /// Stops every module; nothing of this runtime keeps running afterwards.
    pub async fn shutdown(&mut self) {
        let running = std::mem::take(&mut self.running);
        let stops = running.into_values().filter_map(|r| r.supervisor);
        futures::future::join_all(stops.map(Supervisor::stop)).await;
    }

    fn classify(&self, module: &DeclaredModule) -> Change {
        let Some(running) = self.running.get(&module.name) else {
            return Change::Added;
        };
        if self.drifted(&module.name) {
            // A push repairs drift (decision 0305): the directory written again, the process
            // started again from its declaration, whatever else changed or did not.
            return Change::Changed;
        }
        if running.module == *module {
            return Change::Same;
        }
        let mut without_grants = running.module.clone();
        without_grants.grants = module.grants.clone();
        // A module that failed to prepare has no process to spare; give it a full restart.
        if without_grants == *module && running.supervisor.is_some() {
            Change::GrantsOnly
        } else {
            Change::Changed
        }
    }

    /// Whether the last drift check found `name` running other than declared.
    fn drifted(&self, name: &str) -> bool {
        self.board
            .snapshot()
            .iter()
            .any(|m| m.name == name && !m.drift.is_empty())
    }

    /// Compares every running module with what was written and started for it, and puts what
    /// differs on the board, where the next report reads it (decision 0305). Reads files; the
    /// cost is bounded by the declaration (see [`drift`]).
    pub fn check_drift(&self) {
        for (name, running) in &self.running {
            let Some(supervisor) = &running.supervisor else {
                // Never prepared: it is reported failed, with why.
                continue;
            };
            let dir = self.layout.module_dir(name);
            let Some((files, mounts)) = &running.expected else {
                continue;
            };
            let files: Vec<_> = files
                .iter()
                .map(|f| (f.clone(), drift::see_file(&dir, f)))
                .collect();
            let mounts: Vec<_> = mounts
                .iter()
                .map(|m| (m.clone(), drift::see_mount(&dir, m)))
                .collect();
            let started = supervisor.started();
            let known = started.running.as_ref().or(started.applied.as_ref());
            let program = ProgramSeen {
                command: running.module.command.clone(),
                now: started.path.as_ref().map(|p| drift::fingerprint(p, known)),
                applied: started.applied,
                running: started.running,
            };
            let found = drift::differs(&files, &mounts, &program);
            self.board
                .update(name, running.generation, |s| s.drift = found);
        }
    }

    fn regrant(&mut self, module: &DeclaredModule, outcome: &mut ApplyOutcome) {
        match self.layout.write_grants(module) {
            Ok(()) => outcome.regranted.push(module.name.clone()),
            Err(e) => {
                tracing::error!(module = %module.name, error = %e, "cannot rewrite grants");
                outcome.failed.push((module.name.clone(), e.to_string()));
            }
        }
        let expected = self.expected_of(module);
        if let Some(running) = self.running.get_mut(&module.name) {
            running.module = module.clone();
            running.expected = expected;
        }
    }

    /// Prepares the module's directory and starts its supervisor; a failure leaves the module on
    /// the board as failed, with the reason.
    fn start(
        &mut self,
        module: &DeclaredModule,
        previous: Option<&DeclaredModule>,
    ) -> Result<(), String> {
        self.generation += 1;
        let generation = self.generation;
        let prepared = self.layout.prepare(module, previous);
        let supervisor = match prepared {
            Ok(()) => Some(Supervisor::start(
                self.spec(module),
                self.board.clone(),
                generation,
            )),
            Err(ref e) => {
                tracing::error!(module = %module.name, error = %e, "cannot prepare module");
                self.board.claim(&module.name, generation);
                let error = e.to_string();
                self.board.update(&module.name, generation, |s| {
                    s.state = ModuleState::Failed { error }
                });
                None
            }
        };
        let expected = self.expected_of(module);
        self.running.insert(
            module.name.clone(),
            Running {
                module: module.clone(),
                supervisor,
                generation,
                expected,
            },
        );
        prepared.map_err(|e| e.to_string())
    }

    /// What the drift check expects of `module`'s directory. `None` (logged) only when its
    /// provisions or grants cannot be encoded, which `prepare` would have failed on first.
    fn expected_of(
        &self,
        module: &DeclaredModule,
    ) -> Option<(Vec<ExpectedFile>, Vec<ExpectedMount>)> {
        match self.layout.expected(module) {
            Ok(expected) => Some(expected),
            Err(e) => {
                tracing::warn!(module = %module.name, error = %e, "cannot compute what to check for drift");
                None
            }
        }
    }

    fn forget(&mut self, name: &str) {
        self.board.release_any(name);
        if let Err(e) = self.layout.remove(name) {
            tracing::warn!(module = name, error = %e, "cannot remove a removed module's directory");
        }
    }

    fn spec(&self, module: &DeclaredModule) -> Spec {
        let dir = self.layout.module_dir(&module.name);
        let env = self.module_env(module, &dir);
        let ready = module.ready.clone().map(|probe| Check::Probe {
            probe,
            dir: dir.clone(),
            env: env.clone(),
        });
        let endpoints = module
            .provisions
            .iter()
            .filter_map(|p| p.endpoint.clone().map(|e| (p.id.clone(), e)))
            .collect();
        Spec {
            name: module.name.clone(),
            command: module.command.clone(),
            args: module.args.clone(),
            stdout_log: self.layout.log_path(&module.name, "stdout"),
            stderr_log: self.layout.log_path(&module.name, "stderr"),
            group_record: self.layout.group_record(&module.name),
            after: module.after.clone(),
            endpoints,
            ready,
            env,
            dir,
        }
    }

    /// The module's whole environment: `PATH`, its declared env, its settings, its mounts, and
    /// the host's own `MESH_*` names last so nothing declared can shadow them.
    fn module_env(&self, module: &DeclaredModule, dir: &Path) -> BTreeMap<String, String> {
        let mut env = BTreeMap::new();
        let path = std::env::var("PATH").unwrap_or_else(|_| default_path.to_string());
        env.insert("PATH".to_string(), path);
        for (key, value) in &module.env {
            env.insert(key.clone(), value.clone());
        }
        for (key, value) in &module.settings {
            env.insert(setting_var(key), value.clone());
        }
        for mount in &module.mounts {
            let host = self.layout.mount_dir(&mount.host_dir);
            env.insert(mount_var(&mount.name), host.display().to_string());
        }
        env.insert("MESH_MODULE".into(), module.name.clone());
        env.insert("MESH_MACHINE".into(), self.machine.clone());
        env.insert("MESH_DIR".into(), dir.display().to_string());
        env
    }
}

impl Drop for Runtime {
    /// Last resort when the runtime goes away without [`Runtime::shutdown`] (a panic, a test that
    /// failed): no module's process group outlives it.
    fn drop(&mut self) {
        for running in self.running.values() {
            if let Some(supervisor) = &running.supervisor {
                supervisor.signal_stop();
            }
        }
        for pid in self.board.pids() {
            kill_group(pid, nix::sys::signal::Signal::SIGKILL);
        }
    }
}
