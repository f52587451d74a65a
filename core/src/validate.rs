//! The rules a model keeps wherever it comes from (a mesh file, an operator's request, a committed
//! proposal): no two modules of a machine listen on one address, every settings scope names what the
//! model has, every setting passes the settings rule, the encoded model is within `model_bytes_max`
//! and every machine's composed declaration within `declaration_bytes_max`.
//! `meshctl check` and `meshctl apply` (through the mesh-file parser), the controller before it
//! proposes and the state machine at apply all call [`validate`]: there is one copy of each rule.

use std::collections::BTreeMap;

use super::compose::{Pending, World, compose, compose_with, mint, minted_secret_chars};
use super::model::{Mesh, Module, Probe};
use super::settings::{Scope, check_key, check_value, printable};

/// Largest encoded model (machines, modules, settings), in bytes. A model larger than one
/// proposal reaches the store in chunks and is made current by one small commit (decision 0185),
/// so this bounds what every replica holds in memory and in its store, not a proposal. At it a
/// model is accepted; over it `check`, `apply`, the controller and the state machine refuse it.
/// Measured (decision 0298, docs/benchmarks.md): three debug-build replicas on the shared 2-core
/// machine applied 8 MiB in the term they started in, and 16 MiB with four elections; 128 MiB
/// before issue 23 was never carried.
pub const model_bytes_max: usize = 8 * 1024 * 1024;

/// Largest declaration a model may compose for one machine, in bytes as encoded: its modules with
/// their effective settings, the provisions they consume (each secret counted at its minted
/// length) and the grants they issue. At it a model is still accepted; one byte over and `check`,
/// `apply`, the controller and the state machine refuse the model, naming the machine and its
/// largest module. Its envelope adds the deny list and signers every declaration carries, the
/// header and two signatures: the root crate's `envelope_frame_bytes_max`, which every replica's
/// and host's `frame_bytes_max` must allow, and which stays well under the default 16 MiB frame.
/// Half of [`model_bytes_max`], so that one machine cannot take the whole model and a model
/// refused for one is refused for that reason alone (decision 0298).
pub const declaration_bytes_max: usize = 4 * 1024 * 1024;

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
    /// A module as a whole.
    Module {
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
            Subject::Module { module } => write!(f, "modules.{module}"),
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
    declaration_problems(mesh, &mut problems);
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
    if let Some(Probe::Tcp { addr, .. }) = module.ready.as_deref()
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

/// What one machine's declaration weighs as composed, and its heaviest module.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeclarationSize {
    pub machine: String,
    /// The encoded declaration, without the deny list and signers (not part of the model).
    pub bytes: usize,
    /// The module whose part of the declaration is largest, and that part's encoded bytes.
    pub largest: Option<(String, usize)>,
}

/// Every machine's declaration as compose gives it from `mesh`, sized without holding its bytes.
/// Provisions not minted yet are counted as minted (a secret of [`minted_secret_chars`]), so the
/// size is what the push will send, whatever has been minted so far; settings are the effective
/// values compose resolves from the model. A machine that does not compose is left out: compose
/// names that problem where it runs.
pub fn declaration_sizes(mesh: &Mesh) -> Vec<DeclarationSize> {
    let world = World::new(mesh.clone(), []);
    let placeholder = "0".repeat(minted_secret_chars);
    let mut pending = Pending::default();
    for machine in world.machine_names() {
        // A machine that does not compose is left out (see above): compose names its problem.
        let Ok(composed) = compose(&world, machine) else {
            continue;
        };
        for request in &composed.wanted {
            pending.insert(mint(request, placeholder.clone()));
        }
    }
    let mut out = Vec::new();
    for machine in world.machine_names() {
        let Ok(composed) = compose_with(&world, &pending, machine) else {
            continue;
        };
        let declaration = composed.declaration;
        let mut largest: Option<(String, usize)> = None;
        for module in &declaration.modules {
            let bytes = encoded_len("declared module", module);
            if largest.as_ref().is_none_or(|(_, most)| bytes > *most) {
                largest = Some((module.name.clone(), bytes));
            }
        }
        out.push(DeclarationSize {
            machine: machine.clone(),
            bytes: encoded_len("declaration", &declaration),
            largest,
        });
    }
    out
}

/// A declaration is plain strings, vectors and ordered maps: counting its encoding cannot fail
/// (bincode limits only decoding). Counted as too large to send if it ever did.
fn encoded_len<T: serde::Serialize>(what: &'static str, value: &T) -> usize {
    mesh_codec::encoded_len(what, value).unwrap_or(usize::MAX)
}

/// Every machine's composed declaration against [`declaration_bytes_max`]: a model the push could
/// never deliver is refused before it is stored (issue 23).
fn declaration_problems(mesh: &Mesh, out: &mut Vec<Problem>) {
    for size in declaration_sizes(mesh) {
        if size.bytes <= declaration_bytes_max {
            continue;
        }
        let (subject, largest) = match &size.largest {
            Some((module, bytes)) => (
                Subject::Module {
                    module: module.clone(),
                },
                format!("module `{module}` is its largest part ({bytes} bytes)"),
            ),
            None => (Subject::Model, "it has no module".to_string()),
        };
        out.push(Problem {
            subject,
            message: format!(
                "the declaration of machine {} would encode to {} bytes, over the limit of {declaration_bytes_max} bytes one machine's declaration may have (declaration_bytes_max), so its envelope could not be delivered; {largest}: move large `files` contents onto a mount the module reads, or place modules on other machines",
                size.machine, size.bytes
            ),
        });
    }
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
            ready: probe.map(|addr| {
                Box::new(Probe::Tcp {
                    addr: addr.into(),
                    timeout_ms: 1000,
                })
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

    fn with_file(mut m: Module, bytes: usize) -> Module {
        m.files.insert("blob".into(), "x".repeat(bytes));
        m
    }

    fn size_of(mesh: &Mesh, machine: &str) -> usize {
        declaration_sizes(mesh)
            .into_iter()
            .find(|s| s.machine == machine)
            .map(|s| s.bytes)
            .expect("the machine is sized")
    }

    #[test]
    fn a_declaration_over_declaration_bytes_max_is_refused_naming_machine_module_size_and_limit() {
        // Issue 23: a model whose declaration for g14 could not be delivered is refused, naming
        // the machine, its largest module, the size and the limit; ace's small one is fine.
        let big = mesh(vec![
            with_file(module("big", "g14", None, None), declaration_bytes_max),
            with_file(module("small", "g14", None, None), 1000),
            module("other", "ace", None, None),
        ]);
        let size = size_of(&big, "g14");
        let err = validate(&big).expect_err("refused");
        assert_eq!(err.problems.len(), 1, "{err}");
        let p = &err.problems[0];
        assert_eq!(p.subject.to_string(), "modules.big");
        let want = format!(
            "the declaration of machine g14 would encode to {size} bytes, over the limit of {declaration_bytes_max} bytes one machine's declaration may have (declaration_bytes_max), so its envelope could not be delivered; module `big` is its largest part ("
        );
        assert!(p.message.starts_with(&want), "{}", p.message);
        assert!(p.message.ends_with("move large `files` contents onto a mount the module reads, or place modules on other machines"), "{}", p.message);
    }

    #[test]
    fn a_declaration_of_exactly_declaration_bytes_max_is_accepted_and_one_byte_more_is_not() {
        // Issue 23: the limit is inclusive, and what is counted moves byte for byte with the
        // content (the length prefix of a file this large does not change width).
        let sized = |bytes: usize| mesh(vec![with_file(module("big", "g14", None, None), bytes)]);
        let probe = declaration_bytes_max - 4096;
        let overhead = size_of(&sized(probe), "g14") - probe;
        let exact = declaration_bytes_max - overhead;
        assert_eq!(size_of(&sized(exact), "g14"), declaration_bytes_max);
        assert_eq!(validate(&sized(exact)), Ok(()));
        let over = validate(&sized(exact + 1)).expect_err("one byte over");
        assert_eq!(over.problems[0].subject.to_string(), "modules.big");
    }

    #[test]
    fn a_declaration_is_sized_as_the_push_composes_it_with_minted_secrets_and_grants() {
        // Issue 23: the size counted before anything is minted is the size of the declaration
        // the push sends once it is: provisions with their secrets, grants with their hashes,
        // effective settings.
        use crate::compose::{World, compose, compose_with, declaration_bytes, mint};
        use crate::model::Need;
        let mut provider = module("db", "ace", Some(5432), None);
        provider.provides[0].kind = "sql".into();
        let mut consumer = module("app", "g14", None, None);
        consumer.consumes.push(Need {
            kind: "sql".into(),
            from: "db".into(),
        });
        let mut model = mesh(vec![provider, consumer]);
        model.settings.layers.insert(
            Scope::Mesh,
            [("region".to_string(), "eu".to_string())].into(),
        );
        let world = World::new(model.clone(), []);
        let wanted = compose(&world, "g14").expect("composes").wanted;
        assert_eq!(wanted.len(), 1);
        let minted = mint(&wanted[0], "f".repeat(minted_secret_chars));
        let world = World::new(model.clone(), [minted]);
        for machine in ["ace", "g14"] {
            let sent = compose_with(&world, &Pending::default(), machine).expect("composes");
            assert_eq!(
                size_of(&model, machine),
                declaration_bytes(&sent.declaration).len(),
                "{machine}"
            );
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
