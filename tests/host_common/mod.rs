//! Shared fixtures for the host tests: a temp state directory, a signing replica, sealed envelopes,
//! a report sink that can be switched off, a mesh PKI on disk, a mesh-host process that is stopped
//! on drop, and condition waits with deadlines.
#![allow(dead_code)]

use ed25519_dalek::SigningKey;
use std::collections::BTreeMap;
use std::future::Future;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use mesh::core::declaration::{Declaration, DeclaredModule};
use mesh::core::envelope::{Envelope, seal};
use mesh::core::report::{ModuleState, ModuleStatus, Report};
use mesh::host::config::encode_hex;
use mesh::host::{Agent, HostConfig, ReportSink, SinkError, SinkFuture};
use mesh_transport::{Ca, Identity, Principal, Validity};

pub const machine: &str = "ace";
/// Longest any condition in these tests may take to come true.
pub const wait_s: u64 = 20;

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
        let tls = pki.write_tls(&self.dir.path().join("pki"), &host_principal());
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
        },
    }
}

/// A module running `sh -c <script>`.
pub fn shell(name: &str, script: &str) -> DeclaredModule {
    DeclaredModule {
        name: name.into(),
        command: "sh".into(),
        args: vec!["-c".into(), script.into()],
        env: BTreeMap::new(),
        settings: BTreeMap::new(),
        files: BTreeMap::new(),
        mounts: vec![],
        ready: None,
        after: vec![],
        provisions: vec![],
        grants: vec![],
    }
}

/// A module that sleeps for a long time (exec'd, so its pid is the sleeper's).
pub fn sleeper(name: &str) -> DeclaredModule {
    shell(name, "exec sleep 600")
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

/// Polls `check` until it returns true; panics with `what` after [`wait_s`].
pub async fn wait_for<F, Fut>(what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = Instant::now() + Duration::from_secs(wait_s);
    while !check().await {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

pub fn find<'a>(status: &'a [ModuleStatus], name: &str) -> Option<&'a ModuleStatus> {
    status.iter().find(|s| s.name == name)
}

/// Waits until `name` is ready with a pid, and returns the pid.
pub async fn ready_pid(agent: &Agent, name: &str) -> u32 {
    let deadline = Instant::now() + Duration::from_secs(wait_s);
    loop {
        let status = agent.status().await;
        let ready = find(&status, name).filter(|s| s.state == ModuleState::Ready);
        if let Some(pid) = ready.and_then(|s| s.pid) {
            return pid;
        }
        assert!(
            Instant::now() < deadline,
            "timed out waiting for {name} to be ready: {status:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// True while a process with `pid` exists (a zombie counts as gone).
pub fn alive(pid: u32) -> bool {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"));
    match stat {
        Ok(text) => !text
            .rsplit(')')
            .next()
            .is_some_and(|rest| rest.trim_start().starts_with('Z')),
        Err(_) => false,
    }
}

/// Kills the listed process groups on drop, whatever the test did.
pub struct GroupGuard(pub Vec<u32>);

impl Drop for GroupGuard {
    fn drop(&mut self) {
        for pid in &self.0 {
            let _ = nix::sys::signal::killpg(
                nix::unistd::Pid::from_raw(*pid as i32),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
    }
}

pub fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_default()
}

/// This host's principal.
pub fn host_principal() -> Principal {
    Principal::Host(machine.to_string())
}

/// A mesh CA in memory, issuing identities and certificate files.
pub struct Pki {
    pub ca: Ca,
}

impl Pki {
    pub fn new() -> Pki {
        Pki {
            ca: Ca::create(Validity::days_from_now(1)).expect("create CA"),
        }
    }

    pub fn identity(&self, principal: &Principal) -> Identity {
        let issued = self
            .ca
            .issue(principal, Validity::days_from_now(1))
            .expect("issue");
        Identity::from_pem(self.ca.cert_pem(), issued.cert_pem(), issued.key_pem())
            .expect("identity")
    }

    /// Writes the CA and a certificate for `principal` under `dir`; returns host.toml's `[tls]`.
    pub fn write_tls(&self, dir: &Path, principal: &Principal) -> String {
        std::fs::create_dir_all(dir).expect("pki dir");
        let (ca, ca_key) = (dir.join("ca.crt"), dir.join("ca.key"));
        let (cert, key) = (dir.join("self.crt"), dir.join("self.key"));
        self.ca.write(&ca, &ca_key).expect("write CA");
        let issued = self
            .ca
            .issue(principal, Validity::days_from_now(1))
            .expect("issue");
        issued.write(&cert, &key).expect("write certificate");
        format!(
            "[tls]\nca = \"{}\"\ncert = \"{}\"\nkey = \"{}\"\n",
            ca.display(),
            cert.display(),
            key.display()
        )
    }
}

/// A mesh-host process. On drop it gets SIGTERM (so it stops its modules) and, if it has not
/// exited by the deadline, SIGKILL.
pub struct HostProcess(pub Child);

impl HostProcess {
    /// Starts mesh-host on `config`, its output going to `log`.
    pub fn spawn(config: &Path, log: &Path) -> HostProcess {
        let out = std::fs::File::create(log).expect("log file");
        let err = out.try_clone().expect("log file");
        let child = Command::new(env!("CARGO_BIN_EXE_mesh-host"))
            .arg("--config")
            .arg(config)
            .stdout(Stdio::from(out))
            .stderr(Stdio::from(err))
            .spawn()
            .expect("spawn mesh-host");
        HostProcess(child)
    }

    /// Waits for the process to exit on its own; panics after [`wait_s`].
    pub async fn exited(&mut self) -> std::process::ExitStatus {
        let deadline = Instant::now() + Duration::from_secs(wait_s);
        loop {
            if let Some(status) = self.0.try_wait().expect("try_wait") {
                return status;
            }
            assert!(Instant::now() < deadline, "mesh-host did not exit");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Waits for the process to write the address it listens on under `root`.
    pub async fn listening(&mut self, root: &Path) -> SocketAddr {
        let file = mesh::host::listener::listen_path(root);
        let deadline = Instant::now() + Duration::from_secs(wait_s);
        loop {
            if let Ok(addr) = read(&file).trim().parse::<SocketAddr>() {
                return addr;
            }
            if let Some(status) = self.0.try_wait().expect("try_wait") {
                panic!("mesh-host exited with {status} before listening");
            }
            assert!(
                Instant::now() < deadline,
                "mesh-host did not start listening"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

impl Drop for HostProcess {
    fn drop(&mut self) {
        if let Ok(Some(_)) = self.0.try_wait() {
            return;
        }
        let pid = nix::unistd::Pid::from_raw(self.0.id() as i32);
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
        let deadline = Instant::now() + Duration::from_secs(wait_s);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.0.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}
