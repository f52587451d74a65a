//! `replica.toml`: the file `meshctl init` writes ([`ReplicaConfigFile`]) and the validated
//! [`ReplicaConfig`] `meshd` runs with. Relative paths are relative to the config file's directory.

use ed25519_dalek::{SigningKey, VerifyingKey};
use mesh_raft::{RaftConfig, RaftSettings};
use mesh_transport::{CheckedConfig, TransportConfig, addr};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::reports::{
    silent_after_intervals, silent_after_ms_default, silent_after_ms_max, silent_after_ms_min,
};

use crate::hex::{decode_hex_32, encode_hex};

/// Most replicas a cluster may list in `[peers]` (three in production, one for dev).
pub const peers_max: usize = 9;
/// Most machines a replica config may list in `[hosts]`.
pub const hosts_max: usize = 100_000;
/// Longest machine name accepted in `[hosts]`, in bytes (as mesh-host accepts).
pub const machine_name_bytes_max: usize = 64;
/// Mode the signing key file must have: readable by its owner only.
pub const signing_key_file_mode: u32 = 0o600;
/// Largest signing key file read, in bytes (64 hex characters and a newline fit easily).
pub const signing_key_file_bytes_max: u64 = 1024;

/// Why `replica.toml` (or the signing key it names) cannot be used. Each names the file, the key
/// and what to do.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read replica config {file}: {source}; check the path given to --config")]
    Read {
        file: PathBuf,
        source: std::io::Error,
    },
    #[error("replica config {file} is not valid TOML for meshd: {reason}")]
    Parse { file: PathBuf, reason: String },
    #[error("replica config {file}, key `{key}`: {problem}")]
    Invalid {
        file: PathBuf,
        key: String,
        problem: String,
    },
    #[error("signing key {file}: {problem}")]
    SigningKey { file: PathBuf, problem: String },
    #[error("cannot write {file}: {source}")]
    Write {
        file: PathBuf,
        source: std::io::Error,
    },
}

/// `replica.toml` as written on disk. `meshctl init` fills one and writes it with
/// [`ReplicaConfigFile::to_toml`]; `meshd` reads it through [`ReplicaConfig::load`].
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReplicaConfigFile {
    /// This replica's id; must be a key of `peers`.
    pub id: u64,
    /// QUIC listen address (`ip:port`): Raft, operator API and host reports. On a real machine the
    /// wildcard (`0.0.0.0:7100`, or `[::]:7100` to reach IPv6 peers too); others dial `peers.<id>`.
    pub listen: String,
    /// Store directory.
    pub data_dir: PathBuf,
    /// ed25519 secret key, 64 hex characters, file mode 0600.
    pub signing_key: PathBuf,
    pub tls: TlsFile,
    /// Every replica including this one: `"<id>" = "ip:port"`, the address the others dial. This
    /// replica's own entry is its advertise address; none may be a wildcard (decision 0094).
    pub peers: BTreeMap<String, String>,
    /// Machine name → the mesh-host address replicas dial (`ip:port`, the host's advertise address).
    #[serde(default)]
    pub hosts: BTreeMap<String, String>,
    /// Overrides of [`RaftSettings`] fields; absent fields keep their defaults.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub raft: Option<RaftSettings>,
    /// Overrides of [`TransportConfig`] fields; absent fields keep their defaults.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub transport: Option<TransportConfig>,
    /// The read-only status page and `/metrics` over HTTP: `"127.0.0.1:9100"`, or a bare port
    /// (`"9100"`) for loopback. Absent: no HTTP server.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub http: Option<String>,
    /// After how long unheard this replica, as leader, calls a host `SILENT` in milliseconds
    /// (decision 0301). Absent: `silent_after_ms_default`, three of mesh-host's default report
    /// intervals; `meshctl init`, which writes hosts that report every 2 s, writes 6000.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub silent_after_ms: Option<u64>,
    /// Replica id → its envelope-signing public key (64 hex), to check the epoch a host proves
    /// it accepted (G9). This replica's own key is trusted without being listed.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub trusted_keys: BTreeMap<String, String>,
    /// This replica joins a running cluster (`meshctl init --add-replica`, decision 0230): its
    /// first start writes no membership from `[peers]` and waits, as a learner, for the leader's
    /// `meshctl replicas add`. Ignored once the store holds a log.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub join: bool,
}

/// `[tls]`: the mesh CA and this replica's certificate (naming `replica:<id>`) and key.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TlsFile {
    pub ca: PathBuf,
    pub cert: PathBuf,
    pub key: PathBuf,
}

impl ReplicaConfigFile {
    /// The TOML text of this config.
    pub fn to_toml(&self) -> Result<String, toml::ser::Error> {
        toml::to_string(self)
    }
}

/// A validated replica configuration: every address parsed, this replica among its peers, Raft
/// and transport settings checked, paths absolute. Only [`ReplicaConfig::load`] and
/// [`ReplicaConfig::parse`] make one.
#[derive(Clone, Debug)]
pub struct ReplicaConfig {
    file: PathBuf,
    id: u64,
    listen: SocketAddr,
    data_dir: PathBuf,
    signing_key: PathBuf,
    tls: TlsFile,
    peers: BTreeMap<u64, SocketAddr>,
    hosts: BTreeMap<String, SocketAddr>,
    raft: RaftConfig,
    transport: CheckedConfig,
    http: Option<SocketAddr>,
    silent_after: Duration,
    trusted_keys: BTreeMap<u64, VerifyingKey>,
    join: bool,
}

impl ReplicaConfig {
    /// Reads and validates the config at `file`; relative paths resolve against its directory.
    pub fn load(file: &Path) -> Result<ReplicaConfig, ConfigError> {
        let text = std::fs::read_to_string(file).map_err(|source| ConfigError::Read {
            file: file.to_path_buf(),
            source,
        })?;
        let base = match file.parent() {
            Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
            _ => PathBuf::from("."),
        };
        ReplicaConfig::parse(&text, file, &base)
    }

    /// Validates config `text`, naming `file` in errors and resolving relative paths against `base`.
    pub fn parse(text: &str, file: &Path, base: &Path) -> Result<ReplicaConfig, ConfigError> {
        let raw: ReplicaConfigFile = toml::from_str(text).map_err(|e| ConfigError::Parse {
            file: file.to_path_buf(),
            reason: e.to_string(),
        })?;
        ReplicaConfig::from_file(raw, file, base)
    }

    /// Validates an already-parsed config (what `meshctl init` is about to write, say).
    pub fn from_file(
        raw: ReplicaConfigFile,
        file: &Path,
        base: &Path,
    ) -> Result<ReplicaConfig, ConfigError> {
        let invalid = |key: &str, problem: String| ConfigError::Invalid {
            file: file.to_path_buf(),
            key: key.to_string(),
            problem,
        };
        let listen = parse_addr(&raw.listen).map_err(|p| invalid("listen", p))?;
        let peers = parse_peers(&raw.peers).map_err(|(k, p)| invalid(&k, p))?;
        if !peers.contains_key(&raw.id) {
            return Err(invalid(
                "id",
                format!(
                    "replica {} is not listed in [peers]; add `{} = \"<its address>\"` there",
                    raw.id, raw.id
                ),
            ));
        }
        let hosts = parse_hosts(&raw.hosts).map_err(|(k, p)| invalid(&k, p))?;
        check_reachable(listen, &peers, &hosts).map_err(|(k, p)| invalid(&k, p))?;
        let raft = raw
            .raft
            // allow(empty-on-error): no [raft] section is the default settings, validated next
            .unwrap_or_default()
            .validate()
            .map_err(|e| invalid("raft", e.to_string()))?;
        let transport = raw
            .transport
            // allow(empty-on-error): no [transport] section is the default settings, checked next
            .unwrap_or_default()
            .check()
            .map_err(|e| invalid("transport", e.to_string()))?;
        crate::limits::check_frame_limit(&transport).map_err(|e| invalid("transport", e))?;
        let http = match &raw.http {
            None => None,
            Some(text) => Some(parse_http(text).map_err(|p| invalid("http", p))?),
        };
        let silent_after_ms = raw.silent_after_ms.unwrap_or(silent_after_ms_default);
        if !(silent_after_ms_min..=silent_after_ms_max).contains(&silent_after_ms) {
            return Err(invalid(
                "silent_after_ms",
                format!(
                    "{silent_after_ms} is outside {silent_after_ms_min}..={silent_after_ms_max}; pick {silent_after_intervals} times the hosts' reconcile_interval_ms"
                ),
            ));
        }
        let trusted_keys =
            parse_trusted(&raw.trusted_keys, &peers).map_err(|(k, p)| invalid(&k, p))?;
        let resolve = |p: PathBuf| if p.is_absolute() { p } else { base.join(p) };
        Ok(ReplicaConfig {
            file: file.to_path_buf(),
            id: raw.id,
            listen,
            data_dir: resolve(raw.data_dir),
            signing_key: resolve(raw.signing_key),
            tls: TlsFile {
                ca: resolve(raw.tls.ca),
                cert: resolve(raw.tls.cert),
                key: resolve(raw.tls.key),
            },
            peers,
            hosts,
            raft,
            transport,
            http,
            silent_after: Duration::from_millis(silent_after_ms),
            trusted_keys,
            join: raw.join,
        })
    }

    /// Whether this replica joins a running cluster instead of founding one from `[peers]`.
    pub fn join(&self) -> bool {
        self.join
    }

    /// The other replicas' envelope keys from `[trusted_keys]` (this replica's own is not here:
    /// read it with [`ReplicaConfig::read_signing_key`]).
    pub fn trusted_keys(&self) -> &BTreeMap<u64, VerifyingKey> {
        &self.trusted_keys
    }

    /// The file this config came from (for messages).
    pub fn file(&self) -> &Path {
        &self.file
    }

    pub fn id(&self) -> u64 {
        self.id
    }

    pub fn listen(&self) -> SocketAddr {
        self.listen
    }

    pub fn data_dir(&self) -> &Path {
        &self.data_dir
    }

    /// Path of the ed25519 signing key; read it with [`read_signing_key`].
    pub fn signing_key_path(&self) -> &Path {
        &self.signing_key
    }

    /// Paths of the CA, this replica's certificate and key, absolute.
    pub fn tls(&self) -> &TlsFile {
        &self.tls
    }

    /// Every replica including this one.
    pub fn peers(&self) -> &BTreeMap<u64, SocketAddr> {
        &self.peers
    }

    /// Machine name → mesh-host address.
    pub fn hosts(&self) -> &BTreeMap<String, SocketAddr> {
        &self.hosts
    }

    pub fn raft(&self) -> &RaftConfig {
        &self.raft
    }

    pub fn transport(&self) -> &CheckedConfig {
        &self.transport
    }

    /// Where the status page and `/metrics` are served, if anywhere.
    pub fn http(&self) -> Option<SocketAddr> {
        self.http
    }

    /// After how long unheard a host is silent (`silent_after_ms`, decision 0301).
    pub fn silent_after(&self) -> Duration {
        self.silent_after
    }

    /// Reads this replica's signing key, checking its mode.
    pub fn read_signing_key(&self) -> Result<SigningKey, ConfigError> {
        read_signing_key(&self.signing_key)
    }
}

fn parse_addr(text: &str) -> Result<SocketAddr, String> {
    text.parse::<SocketAddr>().map_err(|e| {
        format!(
            "`{text}` is not an ip:port address ({e}); write it like `10.0.0.1:7100` or `[fd00::1]:7100`"
        )
    })
}

/// Every address others dial (`[peers]`, this replica's own included, and `[hosts]`) can be
/// dialled from another machine, none is loopback unless all are (a one-machine mesh), and the
/// `listen` socket's family can dial each of them.
fn check_reachable(
    listen: SocketAddr,
    peers: &BTreeMap<u64, SocketAddr>,
    hosts: &BTreeMap<String, SocketAddr>,
) -> Result<(), (String, String)> {
    let mut all: Vec<(String, SocketAddr)> = Vec::new();
    for (id, addr) in peers {
        all.push((format!("peers.{id}"), *addr));
    }
    for (name, addr) in hosts {
        all.push((format!("hosts.{name}"), *addr));
    }
    for (key, addr) in &all {
        if let Some(problem) = addr::advertise_problem(*addr) {
            return Err((key.clone(), problem));
        }
        if let Some(problem) = addr::dial_problem(listen, *addr) {
            return Err((key.clone(), problem));
        }
    }
    let routable = all.iter().find(|(_, a)| !addr::is_loopback(*a));
    let looped = all.iter().find(|(_, a)| addr::is_loopback(*a));
    if let (Some((far_key, far)), Some((key, near))) = (routable, looped) {
        return Err((
            key.clone(),
            format!(
                "`{near}` is loopback while `{far_key}` is `{far}`: other machines cannot reach a loopback address; write the routable address of this process's machine"
            ),
        ));
    }
    Ok(())
}

/// `http`: `ip:port`, or a bare port meaning loopback. Port 0 is refused: the page would move on
/// every start.
fn parse_http(text: &str) -> Result<SocketAddr, String> {
    let addr = match text.parse::<u16>() {
        Ok(port) => SocketAddr::from(([127, 0, 0, 1], port)),
        Err(_) => parse_addr(text)?,
    };
    if addr.port() == 0 {
        return Err(format!(
            "`{text}` has port 0; give the port the status page should listen on, like `127.0.0.1:9100`"
        ));
    }
    Ok(addr)
}

fn parse_peers(
    raw: &BTreeMap<String, String>,
) -> Result<BTreeMap<u64, SocketAddr>, (String, String)> {
    if raw.is_empty() || raw.len() > peers_max {
        return Err((
            "peers".into(),
            format!(
                "{} replicas listed; list every replica of the cluster (1 to {peers_max}), this one included",
                raw.len()
            ),
        ));
    }
    let mut peers = BTreeMap::new();
    for (id, addr) in raw {
        let key = format!("peers.{id}");
        let id: u64 = id
            .parse()
            .map_err(|_| (key.clone(), "a replica id must be a number".to_string()))?;
        let addr = parse_addr(addr).map_err(|p| (key.clone(), p))?;
        peers.insert(id, addr);
    }
    Ok(peers)
}

/// `[trusted_keys]`: every id a replica of `[peers]`, every key 64 hex digits of an ed25519
/// public key.
fn parse_trusted(
    raw: &BTreeMap<String, String>,
    peers: &BTreeMap<u64, SocketAddr>,
) -> Result<BTreeMap<u64, VerifyingKey>, (String, String)> {
    let mut out = BTreeMap::new();
    for (id, hex) in raw {
        let key = format!("trusted_keys.{id}");
        let parsed: u64 = id
            .parse()
            .map_err(|_| (key.clone(), "not a replica id".to_string()))?;
        if !peers.contains_key(&parsed) {
            return Err((key, format!("replica {parsed} is not in [peers]")));
        }
        let public = decode_hex_32(hex)
            .and_then(|b| VerifyingKey::from_bytes(&b).ok())
            .ok_or_else(|| {
                (
                    key.clone(),
                    "not an ed25519 public key (64 hex digits); copy it from the replica's `meshctl init` output".to_string(),
                )
            })?;
        out.insert(parsed, public);
    }
    Ok(out)
}

fn parse_hosts(
    raw: &BTreeMap<String, String>,
) -> Result<BTreeMap<String, SocketAddr>, (String, String)> {
    if raw.len() > hosts_max {
        return Err((
            "hosts".into(),
            format!("{} machines listed, at most {hosts_max}", raw.len()),
        ));
    }
    let mut hosts = BTreeMap::new();
    for (name, addr) in raw {
        let key = format!("hosts.{name}");
        let ok_char = |c: char| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.');
        if name.is_empty() || name.len() > machine_name_bytes_max || !name.chars().all(ok_char) {
            return Err((
                key,
                format!(
                    "not a machine name; use 1 to {machine_name_bytes_max} letters, digits, `-`, `_` or `.`"
                ),
            ));
        }
        let addr = parse_addr(addr).map_err(|p| (key.clone(), p))?;
        hosts.insert(name.clone(), addr);
    }
    Ok(hosts)
}

/// Reads an ed25519 signing key: 64 hex characters in a file only its owner may read (0600).
pub fn read_signing_key(file: &Path) -> Result<SigningKey, ConfigError> {
    use std::io::Read;
    use std::os::unix::fs::PermissionsExt;
    let bad = |problem: String| ConfigError::SigningKey {
        file: file.to_path_buf(),
        problem,
    };
    let f = std::fs::File::open(file).map_err(|e| bad(format!("cannot open it ({e})")))?;
    let meta = f
        .metadata()
        .map_err(|e| bad(format!("cannot stat it ({e})")))?;
    let mode = meta.permissions().mode() & 0o777;
    if mode & 0o077 != 0 {
        return Err(bad(format!(
            "mode is {mode:o}, others may read it; run `chmod 600 {}`",
            file.display()
        )));
    }
    let mut text = String::new();
    f.take(signing_key_file_bytes_max)
        .read_to_string(&mut text)
        .map_err(|e| bad(format!("cannot read it ({e})")))?;
    let bytes = decode_hex_32(&text)
        .ok_or_else(|| bad("expected 64 hex characters (an ed25519 secret key)".into()))?;
    Ok(SigningKey::from_bytes(&bytes))
}

/// Writes an ed25519 signing key as 64 hex characters with mode 0600 (what `meshctl init` does).
pub fn write_signing_key(file: &Path, key: &SigningKey) -> Result<(), ConfigError> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let fail = |source| ConfigError::Write {
        file: file.to_path_buf(),
        source,
    };
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(signing_key_file_mode)
        .open(file)
        .map_err(fail)?;
    f.write_all(format!("{}\n", encode_hex(key.as_bytes())).as_bytes())
        .map_err(fail)?;
    f.sync_all().map_err(fail)
}

#[cfg(test)]
mod tests {
    use super::*;

    const example: &str = r#"
id = 1
listen = "127.0.0.1:7101"
data_dir = "replica-1"
signing_key = "replica-1/signing.key"
[tls]
ca = "ca.pem"
cert = "replica-1/cert.pem"
key = "replica-1/key.pem"
[peers]
1 = "127.0.0.1:7101"
2 = "127.0.0.1:7102"
3 = "127.0.0.1:7103"
[hosts]
ace = "127.0.0.1:7201"
[raft]
heartbeat_ms = 100
"#;

    #[test]
    fn the_documented_example_parses_and_resolves_paths() {
        // Config: the shape meshctl init writes is what meshd reads.
        let c =
            ReplicaConfig::parse(example, Path::new("/m/r.toml"), Path::new("/m")).expect("valid");
        assert_eq!(c.id(), 1);
        assert_eq!(c.peers().len(), 3);
        assert_eq!(c.data_dir(), Path::new("/m/replica-1"));
        assert_eq!(c.tls().ca, PathBuf::from("/m/ca.pem"));
        assert_eq!(c.hosts()["ace"].port(), 7201);
        assert_eq!(c.raft().settings().heartbeat_ms, 100);
    }

    #[test]
    fn silent_after_ms_defaults_to_three_default_intervals_and_is_bounded() {
        // Decision 0301: absent, 30 s; set, kept; outside 300 ms..3 h, refused naming the key.
        let at = |text: &str| ReplicaConfig::parse(text, Path::new("r.toml"), Path::new("."));
        let c = at(example).expect("valid");
        assert_eq!(
            c.silent_after(),
            Duration::from_millis(silent_after_ms_default)
        );
        assert_eq!(c.silent_after(), Duration::from_secs(30));
        let c = at(&format!("silent_after_ms = 6000\n{example}")).expect("valid");
        assert_eq!(c.silent_after(), Duration::from_millis(6_000));
        for bad in [silent_after_ms_min - 1, silent_after_ms_max + 1] {
            let e = at(&format!("silent_after_ms = {bad}\n{example}")).expect_err("refused");
            assert!(e.to_string().contains("`silent_after_ms`"), "{e}");
        }
    }

    #[test]
    fn a_written_file_reads_back_the_same() {
        // Config: ReplicaConfigFile round-trips through TOML, so meshctl and meshd agree.
        let raw: ReplicaConfigFile = toml::from_str(example).expect("parses");
        let text = raw.to_toml().expect("serialises");
        let back: ReplicaConfigFile = toml::from_str(&text).expect("parses again");
        assert_eq!(raw, back);
    }

    #[test]
    fn errors_name_the_key() {
        // Config: every refusal names the key at fault.
        let f = Path::new("r.toml");
        let b = Path::new(".");
        let cases = [
            (example.replace("id = 1", "id = 4"), "`id`"),
            (
                example.replace("\"127.0.0.1:7102\"", "\"nowhere\""),
                "peers.2",
            ),
            (example.replace("ace =", "\"a/b\" ="), "hosts.a/b"),
            (
                example.replace("heartbeat_ms = 100", "heartbeat_ms = 900"),
                "raft",
            ),
            (
                example.replace("listen = \"127.0.0.1:7101\"", "listen = \"x\""),
                "listen",
            ),
        ];
        for (text, key) in cases {
            let e = ReplicaConfig::parse(&text, f, b).expect_err("refused");
            assert!(e.to_string().contains(key), "{key}: {e}");
        }
    }

    #[test]
    fn a_frame_limit_too_small_for_the_largest_envelope_is_refused_at_load() {
        // Issue 23: a replica whose frames could not carry every envelope a valid model gives
        // a host does not start, saying what it needs; the needed limit itself is fine.
        let f = Path::new("r.toml");
        let b = Path::new(".");
        let need = crate::limits::envelope_frame_bytes_max;
        let small = format!("{example}[transport]\nframe_bytes_max = {}\n", need - 1);
        let e = ReplicaConfig::parse(&small, f, b).expect_err("refused");
        assert!(
            e.to_string().contains(&format!(
                "frame_bytes_max = {} is under the {need} bytes",
                need - 1
            )),
            "{e}"
        );
        let enough = format!("{example}[transport]\nframe_bytes_max = {need}\n");
        ReplicaConfig::parse(&enough, f, b).expect("the needed limit is enough");
    }

    #[test]
    fn an_advertised_wildcard_loopback_among_routable_or_ipv6_from_an_ipv4_socket_is_refused() {
        // Issue 15: what others dial must be routable; the error names the file and the key.
        let f = Path::new("/etc/mesh/replica-1.toml");
        let b = Path::new("/etc/mesh");
        let routable = example
            .replace("listen = \"127.0.0.1:7101\"", "listen = \"0.0.0.0:7100\"")
            .replace("\"127.0.0.1:7101\"", "\"10.0.0.1:7100\"")
            .replace("127.0.0.1:7102", "10.0.0.2:7100")
            .replace("127.0.0.1:7103", "10.0.0.3:7100")
            .replace("127.0.0.1:7201", "10.0.0.5:7200");
        let c = ReplicaConfig::parse(&routable, f, b).expect("routable addresses pass");
        assert_eq!(c.listen(), "0.0.0.0:7100".parse().expect("addr"));
        let cases = [
            (
                routable.replace("10.0.0.2:7100", "0.0.0.0:7100"),
                "peers.2",
                "wildcard",
            ),
            (
                routable.replace("10.0.0.2:7100", "[::]:7100"),
                "peers.2",
                "wildcard",
            ),
            (
                routable.replace("10.0.0.5:7200", "10.0.0.5:0"),
                "hosts.ace",
                "port 0",
            ),
            (
                routable.replace("10.0.0.5:7200", "255.255.255.255:7200"),
                "hosts.ace",
                "broadcast",
            ),
            (
                routable.replace("10.0.0.3:7100", "127.0.0.1:7103"),
                "peers.3",
                "loopback",
            ),
            (
                routable.replace("10.0.0.5:7200", "[fd00::5]:7200"),
                "hosts.ace",
                "[::]:7100",
            ),
        ];
        for (text, key, what) in cases {
            let e = ReplicaConfig::parse(&text, f, b)
                .expect_err("refused")
                .to_string();
            assert!(
                e.contains("/etc/mesh/replica-1.toml") && e.contains(&format!("`{key}`")),
                "{e}"
            );
            assert!(e.contains(what), "{what}: {e}");
            assert_eq!(e.lines().count(), 1, "{e}");
        }
        let dual = routable
            .replace("listen = \"0.0.0.0:7100\"", "listen = \"[::]:7100\"")
            .replace("10.0.0.5:7200", "[fd00::5]:7200");
        let c = ReplicaConfig::parse(&dual, f, b).expect("a dual-stack listen dials both");
        assert!(c.hosts()["ace"].is_ipv6());
    }

    #[test]
    fn http_is_loopback_for_a_bare_port_and_refuses_port_0() {
        // Config: the status page listens where `http` says, loopback when only a port is given.
        let f = Path::new("r.toml");
        let b = Path::new(".");
        let c = ReplicaConfig::parse(example, f, b).expect("valid");
        assert_eq!(c.http(), None);
        let c = ReplicaConfig::parse(&format!("http = \"9100\"\n{example}"), f, b).expect("valid");
        assert_eq!(c.http(), Some(SocketAddr::from(([127, 0, 0, 1], 9100))));
        let text = format!("http = \"10.0.0.1:9100\"\n{example}");
        let c = ReplicaConfig::parse(&text, f, b).expect("valid");
        assert_eq!(c.http(), Some(SocketAddr::from(([10, 0, 0, 1], 9100))));
        for bad in ["0", "127.0.0.1:0", "somewhere"] {
            let text = format!("http = \"{bad}\"\n{example}");
            let e = ReplicaConfig::parse(&text, f, b).expect_err("refused");
            assert!(e.to_string().contains("`http`"), "{bad}: {e}");
        }
    }

    #[test]
    fn signing_key_readable_by_others_is_refused() {
        // Config: the signing key file is secret (mode 0600).
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("signing.key");
        let key = SigningKey::from_bytes(&[9; 32]);
        write_signing_key(&path, &key).expect("written");
        assert_eq!(read_signing_key(&path).expect("read").to_bytes(), [9; 32]);
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).expect("chmod");
        let e = read_signing_key(&path).expect_err("refused");
        assert!(e.to_string().contains("chmod 600"), "{e}");
    }
}
