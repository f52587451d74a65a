//! Shared fixtures for the host tests: a temp state directory, a signing replica, sealed envelopes,
//! a report sink that can be switched off, and starting the mesh-host binary. The PKI, the waits,
//! the process guards and the declared modules come from mesh-testkit.
#![allow(dead_code)]

use ed25519_dalek::SigningKey;
use std::future::Future;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use mesh::core::declaration::{Declaration, DeclaredModule};
use mesh::core::envelope::{Envelope, seal};
use mesh::core::report::{ModuleState, ModuleStatus, Report};
use mesh::host::config::encode_hex;
use mesh::host::{Agent, HostConfig, ReportSink, SinkError, SinkFuture};
#[allow(unused_imports)] // each test binary uses some of them
pub use mesh_testkit::declared::{shell, sleeper};
#[allow(unused_imports)]
pub use mesh_testkit::{ChildGuard, GroupGuard, Pki, alive, wait_until, wait_value};
use mesh_transport::Principal;

pub const machine: &str = "ace";

/// A replica's signing key, by seed.
pub fn replica_key(seed: u8) -> SigningKey {
    SigningKey::from_bytes(&[seed; 32])
}

/// A temp directory holding a host's state and mounts, trusting replica 1.
pub struct Fixture {
    pub dir: tempfile::TempDir,
    pub key: SigningKey,
    pub sink: Arc<MemorySink>,
}

impl Fixture {
    pub fn new() -> Fixture {
        Fixture {
            dir: tempfile::tempdir().expect("tempdir"),
            key: replica_key(1),
            sink: Arc::new(MemorySink::default()),
        }
    }

    pub fn root(&self) -> PathBuf {
        self.dir.path().join("root")
    }

    pub fn mounts(&self) -> PathBuf {
        self.dir.path().join("mounts")
    }

    pub fn config_text(&self) -> String {
        self.config_text_with("", "")
    }

    /// The config with `top` among the top-level keys and `tables` after `[trusted_keys]`.
    pub fn config_text_with(&self, top: &str, tables: &str) -> String {
        format!(
            "name = \"{machine}\"\nroot = \"{}\"\nmounts_root = \"{}\"\nlisten = \"127.0.0.1:0\"\nreconcile_interval_ms = 100\n{top}\n[trusted_keys]\n1 = \"{}\"\n{tables}\n",
            self.root().display(),
            self.mounts().display(),
            encode_hex(self.key.verifying_key().as_bytes())
        )
    }

    /// Writes host.toml for the mesh-host process: this host's certificate from `pki` and
    /// `replicas` to report to. Returns its path.
    pub fn write_process_config(&self, pki: &Pki, replicas: &[SocketAddr]) -> PathBuf {
        let list: Vec<String> = replicas.iter().map(|a| format!("\"{a}\"")).collect();
        let top = format!("replicas = [{}]", list.join(", "));
        // Under the fixture's directory: the host reads them after the test's PKI may be gone.
        let files = pki.write_to(&self.dir.path().join("pki"), &host_principal());
        let tls = format!(
            "[tls]\nca = \"{}\"\ncert = \"{}\"\nkey = \"{}\"\n",
            files.ca.display(),
            files.cert.display(),
            files.key.display()
        );
        let path = self.dir.path().join("host.toml");
        std::fs::write(&path, self.config_text_with(&top, &tls)).expect("write host.toml");
        path
    }

    /// The config of [`Fixture::write_process_config`], for an in-process agent and listener.
    pub fn process_config(&self, pki: &Pki, replicas: &[SocketAddr]) -> HostConfig {
        let path = self.write_process_config(pki, replicas);
        HostConfig::load(&path).expect("config")
    }

    pub fn config(&self) -> HostConfig {
        let file = self.dir.path().join("host.toml");
        HostConfig::parse(&self.config_text(), &file, self.dir.path()).expect("config")
    }

    /// A new agent over this fixture's state, as after a restart.
    pub fn agent(&self) -> Agent {
        Agent::open(self.config(), self.sink.clone()).expect("agent opens")
    }

    /// Envelope bytes for `modules` at `(epoch, sequence)`, signed by replica 1.
    pub fn seal(&self, epoch: u64, sequence: u64, modules: Vec<DeclaredModule>) -> Vec<u8> {
        self.seal_with(epoch, sequence, modules, vec![])
    }

    pub fn seal_with(
        &self,
        epoch: u64,
        sequence: u64,
        modules: Vec<DeclaredModule>,
        moves: Vec<String>,
    ) -> Vec<u8> {
        seal(&envelope(epoch, sequence, modules, moves), &self.key).expect("seal")
    }

    pub fn module_dir(&self, name: &str) -> PathBuf {
        self.root().join("modules").join(name)
    }
}

pub fn envelope(
    epoch: u64,
    sequence: u64,
    modules: Vec<DeclaredModule>,
    moves: Vec<String>,
) -> Envelope {
    Envelope {
        machine: machine.into(),
        epoch,
        sequence,
        signer: 1,
        moves,
        declaration: Declaration {
            machine: machine.into(),
            modules,
            revoked: Default::default(),
            signers: Default::default(),
        },
    }
}

/// Records delivered reports; refuses them with `Unavailable` while switched off.
#[derive(Default)]
pub struct MemorySink {
    pub down: AtomicBool,
    pub delivered: Mutex<Vec<Report>>,
}

impl MemorySink {
    pub fn set_down(&self, down: bool) {
        self.down.store(down, Ordering::SeqCst);
    }

    pub fn reports(&self) -> Vec<Report> {
        self.delivered.lock().expect("sink lock").clone()
    }
}

impl ReportSink for MemorySink {
    fn deliver<'a>(&'a self, report: &'a Report) -> SinkFuture<'a> {
        Box::pin(async move {
            if self.down.load(Ordering::SeqCst) {
                return Err(SinkError::Unavailable("switched off by the test".into()));
            }
            self.delivered
                .lock()
                .expect("sink lock")
                .push(report.clone());
            Ok(())
        })
    }
}

pub fn find<'a>(status: &'a [ModuleStatus], name: &str) -> Option<&'a ModuleStatus> {
    status.iter().find(|s| s.name == name)
}

/// Waits until `name` is ready with a pid, and returns the pid.
pub async fn ready_pid(agent: &Agent, name: &str) -> u32 {
    wait_value(&format!("{name} to be ready with a pid"), || async {
        let status = agent.status().await;
        let ready = find(&status, name).filter(|s| s.state == ModuleState::Ready);
        ready.and_then(|s| s.pid)
    })
    .await
}

pub fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_default()
}

/// This host's principal.
pub fn host_principal() -> Principal {
    Principal::Host(machine.to_string())
}

/// A mesh-host process, stopped on drop like every [`ChildGuard`] (SIGTERM, so it stops its
/// modules, then SIGKILL).
pub type HostProcess = ChildGuard;

/// Starting mesh-host and waiting for it to listen.
pub trait MeshHost {
    /// Starts mesh-host on `config`, its output going to `log`.
    fn spawn(config: &Path, log: &Path) -> HostProcess;
    /// Waits for the process to write the address it listens on under `root`.
    fn listening(&mut self, root: &Path) -> impl Future<Output = SocketAddr>;
}

impl MeshHost for HostProcess {
    fn spawn(config: &Path, log: &Path) -> HostProcess {
        let out = std::fs::File::create(log).expect("log file");
        let err = out.try_clone().expect("log file");
        let child = Command::new(env!("CARGO_BIN_EXE_mesh-host"))
            .arg("--config")
            .arg(config)
            .stdout(Stdio::from(out))
            .stderr(Stdio::from(err))
            .spawn()
            .expect("spawn mesh-host");
        ChildGuard(child)
    }

    async fn listening(&mut self, root: &Path) -> SocketAddr {
        let file = mesh::host::listener::listen_path(root);
        wait_value("mesh-host to start listening", || {
            if let Some(status) = self.try_exited() {
                panic!("mesh-host exited with {status} before listening");
            }
            std::future::ready(read(&file).trim().parse::<SocketAddr>().ok())
        })
        .await
    }
}
