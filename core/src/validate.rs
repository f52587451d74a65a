//! The rules a model keeps wherever it comes from (a mesh file, an operator's request, a committed
//! proposal): no two modules of a machine listen on one address, every settings scope names what the
//! model has, every setting passes the settings rule, and the encoded model is within `model_bytes_max`.
//! `meshctl check` and `meshctl apply` (through the mesh-file parser), the controller before it
//! proposes and the state machine at apply all call [`validate`]: there is one copy of each rule.

use std::collections::BTreeMap;

use super::model::{Mesh, Module, Probe};
use super::settings::{Scope, check_key, check_value, printable};

/// Largest encoded model (machines, modules, settings), in bytes. A model larger than one
/// proposal reaches the store in chunks and is made current by one small commit (decision 0185),
/// so this bounds what every replica holds in memory and in its store, not a proposal.
pub const model_bytes_max: usize = 128 * 1024 * 1024;

/// What a problem is about, so the mesh-file parser can point at where it was written.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Subject {
    /// The port of a module's `provides[index]`.
    Port {
        module: String,
        index: usize,
    },
    /// A module's tcp readiness probe.
    Probe {
        module: String,
    },
    /// A settings scope.
    Scope(Scope),
    SettingKey {
        scope: Scope,
        key: String,
    },
    SettingValue {
        scope: Scope,
        key: String,
    },
    /// The model as a whole.
    Model,
}

/// Names the subject as the mesh file's field path, so an error reads the same from the file and
/// from the controller.
impl std::fmt::Display for Subject {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Subject::Port { module, index } => write!(f, "modules.{module}.provides[{index}].port"),
            Subject::Probe { module } => write!(f, "modules.{module}.ready.tcp"),
            Subject::Scope(scope) => write!(f, "settings.\"{scope}\""),
            Subject::SettingKey { scope, key } | Subject::SettingValue { scope, key } => {
                write!(f, "settings.\"{scope}\".{}", printable(key))
            }
            Subject::Model => write!(f, "model"),
        }
    }
}

/// One broken rule: what it is about, and `what is wrong; what to do`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Problem {
    pub subject: Subject,
    pub message: String,
}

impl std::fmt::Display for Problem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.subject, self.message)
    }
}

/// Every problem [`validate`] found, one line each.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub struct Invalid {
    pub problems: Vec<Problem>,
}

impl std::fmt::Display for Invalid {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for (i, p) in self.problems.iter().enumerate() {
            if i > 0 {
                writeln!(f)?;
            }
            write!(f, "{p}")?;
        }
        Ok(())
    }
}

/// Checks every rule of this file on `mesh` and reports every problem found, not the first.
pub fn validate(mesh: &Mesh) -> Result<(), Invalid> {
    let mut problems = Vec::new();
    listen_conflicts(mesh, &mut problems);
    settings_problems(mesh, &mut problems);
    size_problem(mesh, &mut problems);
    if problems.is_empty() {
        Ok(())
    } else {
        Err(Invalid { problems })
    }
}

/// Why `scope` does not name a machine, module or placement of `mesh`, if it does not: a layer for
/// something that does not exist would silently apply to nothing. The one scope rule, for the mesh
/// file and for `settings show|set|clear`.
pub fn scope_problem(mesh: &Mesh, scope: &Scope) -> Option<String> {
    let machine_missing = |m: &str| {
        (!mesh.machines.contains_key(m)).then(|| format!("machine `{m}` is not declared"))
    };
    match scope {
        Scope::Mesh => None,
        Scope::Machine(m) => machine_missing(m),
        Scope::Module(m) => {
            (!mesh.modules.contains_key(m)).then(|| format!("module `{m}` is not declared"))
        }
        Scope::Placement { module, machine } => match mesh.modules.get(module) {
            None => Some(format!("module `{module}` is not declared")),
            Some(m) if m.machine != *machine => Some(format!(
                "module `{module}` runs on {}, not on {machine}",
                m.machine
            )),
            Some(_) => machine_missing(machine),
        },
    }
}

/// Two modules of one machine that would listen on the same address: the later one (in module
/// order) is named, with the one that listens there first.
fn listen_conflicts(mesh: &Mesh, out: &mut Vec<Problem>) {
    // (machine, host, port) → the first module listening there, and where it says so.
    let mut taken: BTreeMap<(&str, String, u16), (&str, Subject)> = BTreeMap::new();
    for module in mesh.modules.values() {
        let Some(machine) = mesh.machines.get(&module.machine) else {
            continue;
        };
        for (host, port, subject) in listeners(&machine.address, module) {
            let at = (machine.name.as_str(), host.clone(), port);
            match taken.get(&at) {
                None => {
                    taken.insert(at, (module.name.as_str(), subject));
                }
                Some((first, _)) if *first == module.name => {}
                Some((first, first_at)) => out.push(Problem {
                    subject,
                    message: format!(
                        "module `{}` would listen on {host}:{port} on machine {}, where module `{first}` listens too ({first_at}); give one of them another port",
                        module.name, machine.name
                    ),
                }),
            }
        }
    }
}

/// Where a module listens on its machine: each `provides` port at the machine's address, and its
/// tcp readiness probe when the probe connects to this machine (its address or loopback; a probe of
/// another machine listens nowhere here). Hosts are compared as written, `localhost` as 127.0.0.1.
fn listeners(address: &str, module: &Module) -> Vec<(String, u16, Subject)> {
    let mut out = Vec::new();
    for (index, provide) in module.provides.iter().enumerate() {
        if let Some(port) = provide.port.filter(|p| *p > 0) {
            let subject = Subject::Port {
                module: module.name.clone(),
                index,
            };
            out.push((host_key(address), port, subject));
        }
    }
    if let Some(Probe::Tcp { addr, .. }) = &module.ready
        && let Some((host, port)) = addr.rsplit_once(':')
        && let Ok(port) = port.parse::<u16>()
        && port > 0
        && (host == address || is_loopback(host))
    {
        let subject = Subject::Probe {
            module: module.name.clone(),
        };
        out.push((host_key(host), port, subject));
    }
    out
}

fn is_loopback(host: &str) -> bool {
    host == "localhost" || host.starts_with("127.") || host == "[::1]" || host == "::1"
}

fn host_key(host: &str) -> String {
    match host {
        "localhost" => "127.0.0.1".to_string(),
        other => other.to_string(),
    }
}

/// Every layer's scope against [`scope_problem`], and every key and value against the settings rule.
fn settings_problems(mesh: &Mesh, out: &mut Vec<Problem>) {
    for (scope, layer) in &mesh.settings.layers {
        if let Some(problem) = scope_problem(mesh, scope) {
            out.push(Problem {
                subject: Subject::Scope(scope.clone()),
                message: format!(
                    "{problem}; name a declared machine or module (and the machine it runs on)"
                ),
            });
        }
        for (key, value) in layer {
            let (scope, key_owned) = (scope.clone(), key.clone());
            let problem = match (check_key(key), check_value(key, value)) {
                (Err(e), _) => Some((
                    Subject::SettingKey {
                        scope,
                        key: key_owned,
                    },
                    e,
                )),
                (Ok(()), Err(e)) => Some((
                    Subject::SettingValue {
                        scope,
                        key: key_owned,
                    },
                    e,
                )),
                (Ok(()), Ok(())) => None,
            };
            if let Some((subject, e)) = problem {
                out.push(Problem {
                    subject,
                    message: e.to_string(),
                });
            }
        }
    }
}

/// The encoded model against [`model_bytes_max`], with the project's codec (what a proposal carries).
fn size_problem(mesh: &Mesh, out: &mut Vec<Problem>) {
    let message = match mesh_codec::encode("model", mesh) {
        Ok(bytes) if bytes.len() <= model_bytes_max => return,
        Ok(bytes) => format!(
            "the model encodes to {} bytes, over the limit of {model_bytes_max} bytes a model may have (model_bytes_max); make it smaller: move large `files` contents onto a mount the module reads, or split the mesh",
            bytes.len()
        ),
        Err(e) => format!("{e}; make the model smaller"),
    };
    out.push(Problem {
        subject: Subject::Model,
        message,
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Machine, Provide};

    fn module(name: &str, machine: &str, port: Option<u16>, probe: Option<&str>) -> Module {
        Module {
            name: name.into(),
            machine: machine.into(),
            command: "sh".into(),
            args: vec![],
            env: crate::flat::FlatMap::new(),
            files: crate::flat::FlatMap::new(),
            mounts: vec![],
            ready: probe.map(|addr| Probe::Tcp {
                addr: addr.into(),
                timeout_ms: 1000,
            }),
            after: vec![],
            provides: port
                .map(|port| Provide {
                    kind: "k".into(),
                    port: Some(port),
                })
                .into_iter()
                .collect(),
            consumes: vec![],
        }
    }

    fn mesh(modules: Vec<Module>) -> Mesh {
        let mut mesh = Mesh::default();
        for (name, address) in [("ace", "10.0.0.1"), ("g14", "10.0.0.2")] {
            mesh.machines.insert(
                name.into(),
                Machine {
                    name: name.into(),
                    address: address.into(),
                },
            );
        }
        for m in modules {
            mesh.modules.insert(m.name.clone(), m);
        }
        mesh
    }

    fn subjects(mesh: &Mesh) -> Vec<String> {
        match validate(mesh) {
            Ok(()) => vec![],
            Err(e) => e.problems.iter().map(|p| p.subject.to_string()).collect(),
        }
    }

    #[test]
    fn a_listen_address_is_shared_only_within_one_module_and_a_remote_probe_listens_nowhere() {
        // Issue 9: two modules of one machine on one address:port are refused, naming the later.
        let port_and_probe = mesh(vec![
            module("a", "ace", Some(80), None),
            module("b", "ace", None, Some("10.0.0.1:80")),
        ]);
        assert_eq!(subjects(&port_and_probe), ["modules.b.ready.tcp"]);
        let loopback = mesh(vec![
            module("a", "ace", None, Some("localhost:81")),
            module("b", "ace", None, Some("127.0.0.1:81")),
        ]);
        assert_eq!(subjects(&loopback), ["modules.b.ready.tcp"]);
        let fine = mesh(vec![
            // Its own port and probe: one listener.
            module("a", "ace", Some(80), Some("10.0.0.1:80")),
            // Another machine, same port.
            module("b", "g14", Some(80), None),
            // A probe of another machine's address listens nowhere on ace.
            module("c", "ace", None, Some("10.0.0.2:80")),
        ]);
        assert_eq!(subjects(&fine), Vec::<String>::new());
    }
}
