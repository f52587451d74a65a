//! `host.toml`: read once, validated into a [`HostConfig`] that cannot be invalid.
//!
//! Relative paths are taken relative to the directory holding the config file, so a config and its
//! state directory can move together.

use ed25519_dalek::VerifyingKey;
use mesh_transport::{CheckedConfig, TransportConfig, addr};
use serde::Deserialize;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Shortest reconcile interval accepted: faster would spend the disk on report counters.
pub const reconcile_interval_ms_min: u64 = 100;
/// Longest reconcile interval accepted: a controller should hear from a host at least hourly.
pub const reconcile_interval_ms_max: u64 = 3_600_000;
/// Used when `reconcile_interval_ms` is not set.
pub const reconcile_interval_ms_default: u64 = 10_000;
/// Longest machine name accepted, in bytes.
pub const machine_name_bytes_max: usize = 64;
/// Most replica addresses a host may list: each is tried in turn when reports cannot be filed.
pub const replicas_max: usize = 16;

/// Why `host.toml` could not be used. Each names the file, the key and what to do.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read host config {file}: {source}; check the path given to --config")]
    Read {
        file: PathBuf,
        source: std::io::Error,
    },
    #[error("host config {file} is not valid TOML for mesh-host: {reason}")]
    Parse { file: PathBuf, reason: String },
    #[error("host config {file}, key `{key}`: {problem}")]
    Invalid {
        file: PathBuf,
        key: String,
        problem: String,
    },
}

/// Paths of the host's TLS identity: the mesh CA, this host's certificate (naming `host:<name>`)
/// and its private key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TlsPaths {
    pub ca: PathBuf,
    pub cert: PathBuf,
    pub key: PathBuf,
}

/// A validated host configuration. Its fields are private: the only way to get one is
/// [`HostConfig::load`] or [`HostConfig::parse`], so every one in hand is valid.
#[derive(Clone, Debug)]
pub struct HostConfig {
    /// This machine's name; envelopes for any other machine are refused.
    name: String,
    /// State directory: high-water mark, report counter, last declaration, report queue, modules.
    root: PathBuf,
    /// Mount `host_dir`s (absolute in the model) are created under this directory.
    mounts_root: PathBuf,
    listen: SocketAddr,
    /// Where replicas reach this host (`hosts.<name>` in their configs), when the config says.
    advertise: Option<SocketAddr>,
    /// Where `/metrics` is served over HTTP; off when absent.
    http: Option<SocketAddr>,
    /// Controller replica addresses, `host:port`.
    replicas: Vec<String>,
    reconcile_interval: Duration,
    tls: Option<TlsPaths>,
    /// QUIC limits and timeouts, checked.
    transport: CheckedConfig,
    /// Replica id → the key its envelopes must verify against.
    trusted: BTreeMap<u64, VerifyingKey>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawConfig {
    name: String,
    root: PathBuf,
    mounts_root: Option<PathBuf>,
    listen: String,
    advertise: Option<String>,
    http: Option<String>,
    #[serde(default)]
    replicas: Vec<String>,
    reconcile_interval_ms: Option<u64>,
    tls: Option<RawTls>,
    transport: Option<TransportConfig>,
    #[serde(default)]
    trusted_keys: BTreeMap<String, String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTls {
    ca: PathBuf,
    cert: PathBuf,
    key: PathBuf,
}

impl HostConfig {
    /// Reads and validates the config at `file`.
    pub fn load(file: &Path) -> Result<HostConfig, ConfigError> {
        let text = std::fs::read_to_string(file).map_err(|source| ConfigError::Read {
            file: file.to_path_buf(),
            source,
        })?;
        let base = file.parent().unwrap_or(Path::new("."));
        HostConfig::parse(&text, file, base)
    }

    /// Validates config `text`, naming `file` in errors and resolving relative paths against `base`.
    pub fn parse(text: &str, file: &Path, base: &Path) -> Result<HostConfig, ConfigError> {
        let raw: RawConfig = toml::from_str(text).map_err(|e| ConfigError::Parse {
            file: file.to_path_buf(),
            reason: e.to_string(),
        })?;
        let invalid = |key: &str, problem: String| ConfigError::Invalid {
            file: file.to_path_buf(),
            key: key.to_string(),
            problem,
        };
        check_machine_name(&raw.name).map_err(|p| invalid("name", p))?;
        let listen = raw.listen.parse::<SocketAddr>().map_err(|e| {
            invalid(
                "listen",
                format!("`{}` is not an ip:port address ({e})", raw.listen),
            )
        })?;
        let advertise = match &raw.advertise {
            Some(text) => Some(check_advertise(text).map_err(|p| invalid("advertise", p))?),
            None => None,
        };
        let http = match &raw.http {
            Some(text) => Some(parse_http(text).map_err(|p| invalid("http", p))?),
            None => None,
        };
        if raw.replicas.len() > replicas_max {
            return Err(invalid(
                "replicas",
                format!(
                    "{} addresses listed, at most {replicas_max} are tried; list the controller replicas only",
                    raw.replicas.len()
                ),
            ));
        }
        for (i, replica) in raw.replicas.iter().enumerate() {
            check_replica(listen, replica).map_err(|p| invalid(&format!("replicas[{i}]"), p))?;
        }
        let interval_ms = raw
            .reconcile_interval_ms
            .unwrap_or(reconcile_interval_ms_default);
        if !(reconcile_interval_ms_min..=reconcile_interval_ms_max).contains(&interval_ms) {
            return Err(invalid(
                "reconcile_interval_ms",
                format!(
                    "{interval_ms} is outside {reconcile_interval_ms_min}..={reconcile_interval_ms_max}; pick a value in that range"
                ),
            ));
        }
        let trusted = parse_trusted(&raw.trusted_keys).map_err(|(k, p)| invalid(&k, p))?;
        let transport = raw
            .transport
            // allow(empty-on-error): no [transport] section is the default settings, checked next
            .unwrap_or_default()
            .check()
            .map_err(|e| invalid("transport", e.to_string()))?;
        crate::limits::check_frame_limit(&transport).map_err(|e| invalid("transport", e))?;
        let resolve = |p: PathBuf| if p.is_absolute() { p } else { base.join(p) };
        Ok(HostConfig {
            name: raw.name,
            root: resolve(raw.root),
            mounts_root: resolve(raw.mounts_root.unwrap_or_else(|| PathBuf::from("/"))),
            listen,
            advertise,
            http,
            replicas: raw.replicas,
            reconcile_interval: Duration::from_millis(interval_ms),
            tls: raw.tls.map(|t| TlsPaths {
                ca: resolve(t.ca),
                cert: resolve(t.cert),
                key: resolve(t.key),
            }),
            transport,
            trusted,
        })
    }
}

impl HostConfig {
    /// This machine's name; envelopes for any other machine are refused.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The state directory.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Where mount `host_dir`s are created.
    pub fn mounts_root(&self) -> &Path {
        &self.mounts_root
    }

    /// Where the endpoint binds (a wildcard on a real machine).
    pub fn listen(&self) -> SocketAddr {
        self.listen
    }

    /// Where replicas reach this host, when the config says (for the log and the operator).
    pub fn advertise(&self) -> Option<SocketAddr> {
        self.advertise
    }

    /// Where `/metrics` is served over HTTP (`http` in host.toml), if anywhere.
    pub fn http(&self) -> Option<SocketAddr> {
        self.http
    }

    /// Controller replica addresses, `host:port`.
    pub fn replicas(&self) -> &[String] {
        &self.replicas
    }

    pub fn reconcile_interval(&self) -> Duration {
        self.reconcile_interval
    }

    pub fn tls(&self) -> Option<&TlsPaths> {
        self.tls.as_ref()
    }

    /// QUIC limits and timeouts (`[transport]`, defaults when absent).
    pub fn transport(&self) -> &CheckedConfig {
        &self.transport
    }

    /// Replica id → the key its envelopes must verify against.
    pub fn trusted(&self) -> &BTreeMap<u64, VerifyingKey> {
        &self.trusted
    }
}

fn check_machine_name(name: &str) -> Result<(), String> {
    let ok_char = |c: char| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.');
    if name.is_empty() || name.len() > machine_name_bytes_max || !name.chars().all(ok_char) {
        return Err(format!(
            "`{name}` is not a machine name; use 1 to {machine_name_bytes_max} letters, digits, `-`, `_` or `.`"
        ));
    }
    Ok(())
}

/// A replica address is `ip:port` or `name:port`; a literal one must be dialable, and dialable
/// from the `listen` socket's family (names are resolved when dialled).
fn check_replica(listen: SocketAddr, address: &str) -> Result<(), String> {
    let bad = || format!("`{address}` is not a host:port address; write it like `10.0.0.1:7100`");
    let (host, port) = address.rsplit_once(':').ok_or_else(bad)?;
    if host.is_empty() || port.parse::<u16>().is_err() {
        return Err(bad());
    }
    if let Ok(ip) = address.parse::<SocketAddr>() {
        if let Some(problem) = addr::advertise_problem(ip) {
            return Err(problem);
        }
        if let Some(problem) = addr::dial_problem(listen, ip) {
            return Err(problem);
        }
    }
    Ok(())
}

/// `http`: `ip:port`, or a bare port meaning loopback (metrics stay on the machine unless an
/// address says otherwise). Port 0 is refused: a scraper could not know where to look.
fn parse_http(text: &str) -> Result<SocketAddr, String> {
    let addr = match text.parse::<u16>() {
        Ok(port) => SocketAddr::from(([127, 0, 0, 1], port)),
        Err(_) => text.parse::<SocketAddr>().map_err(|e| {
            format!("`{text}` is not a port or an ip:port address ({e}); write `9200` (loopback) or `10.0.0.5:9200`")
        })?,
    };
    if addr.port() == 0 {
        return Err(format!(
            "`{text}` has port 0, which would move on every start; pick a fixed port"
        ));
    }
    Ok(addr)
}

fn check_advertise(text: &str) -> Result<SocketAddr, String> {
    let advertise = text.parse::<SocketAddr>().map_err(|e| {
        format!("`{text}` is not an ip:port address ({e}); write it like `10.0.0.5:7200`")
    })?;
    match addr::advertise_problem(advertise) {
        Some(problem) => Err(problem),
        None => Ok(advertise),
    }
}

fn parse_trusted(
    raw: &BTreeMap<String, String>,
) -> Result<BTreeMap<u64, VerifyingKey>, (String, String)> {
    if raw.is_empty() {
        return Err((
            "trusted_keys".into(),
            "no replica key is trusted, so every envelope would be refused; add `<replica id> = \"<ed25519 public key hex>\"`".into(),
        ));
    }
    let mut trusted = BTreeMap::new();
    for (id, hex) in raw {
        let key = format!("trusted_keys.{id}");
        let id: u64 = id
            .parse()
            .map_err(|_| (key.clone(), "a replica id must be a number".to_string()))?;
        let bytes = decode_hex_32(hex).ok_or_else(|| {
            (
                key.clone(),
                "expected 64 hex characters (an ed25519 public key)".to_string(),
            )
        })?;
        let verifying = VerifyingKey::from_bytes(&bytes)
            .map_err(|e| (key.clone(), format!("not a valid ed25519 public key ({e})")))?;
        trusted.insert(id, verifying);
    }
    Ok(trusted)
}

pub use crate::hex::{decode_hex_32, encode_hex};

#[cfg(test)]
mod tests {
    use super::*;
    use ed25519_dalek::SigningKey;

    fn key_hex() -> String {
        encode_hex(SigningKey::from_bytes(&[7; 32]).verifying_key().as_bytes())
    }

    fn text(extra: &str) -> String {
        format!(
            "name = \"ace\"\nroot = \"state\"\nlisten = \"127.0.0.1:0\"\n{extra}\n[trusted_keys]\n1 = \"{}\"\n",
            key_hex()
        )
    }

    #[test]
    fn a_minimal_config_resolves_paths_and_defaults() {
        let c = HostConfig::parse(&text(""), Path::new("/etc/h.toml"), Path::new("/etc"))
            .expect("valid");
        assert_eq!(c.root, PathBuf::from("/etc/state"));
        assert_eq!(c.mounts_root, PathBuf::from("/"));
        assert_eq!(c.reconcile_interval, Duration::from_millis(10_000));
        assert_eq!(c.trusted.len(), 1);
    }

    #[test]
    fn http_is_off_by_default_loopback_for_a_bare_port_and_refuses_port_0() {
        // Issue 13 part 4: mesh-host's /metrics listens only when `http` says, on loopback
        // unless an address is given.
        let f = Path::new("h.toml");
        let b = Path::new(".");
        let c = HostConfig::parse(&text(""), f, b).expect("valid");
        assert_eq!(c.http(), None);
        let c = HostConfig::parse(&text("http = \"9200\""), f, b).expect("valid");
        assert_eq!(c.http(), Some(SocketAddr::from(([127, 0, 0, 1], 9200))));
        let c = HostConfig::parse(&text("http = \"10.0.0.5:9200\""), f, b).expect("valid");
        assert_eq!(c.http(), Some(SocketAddr::from(([10, 0, 0, 5], 9200))));
        for bad in ["0", "127.0.0.1:0", "nine", "10.0.0.5"] {
            let e = HostConfig::parse(&text(&format!("http = \"{bad}\"")), f, b)
                .expect_err("refused")
                .to_string();
            assert!(e.contains("`http`") && e.contains("h.toml"), "{bad}: {e}");
        }
    }

    #[test]
    fn errors_name_the_key() {
        let f = Path::new("h.toml");
        let bad_interval = text("reconcile_interval_ms = 5");
        let e = HostConfig::parse(&bad_interval, f, Path::new(".")).expect_err("refused");
        assert!(e.to_string().contains("reconcile_interval_ms"), "{e}");
        let no_keys = "name = \"ace\"\nroot = \"s\"\nlisten = \"127.0.0.1:0\"\n";
        let e = HostConfig::parse(no_keys, f, Path::new(".")).expect_err("refused");
        assert!(e.to_string().contains("trusted_keys"), "{e}");
        let bad_key = text("").replace(&key_hex(), "zz");
        let e = HostConfig::parse(&bad_key, f, Path::new(".")).expect_err("refused");
        assert!(e.to_string().contains("trusted_keys.1"), "{e}");
        let bad_transport = text("[transport]\nframe_bytes_max = 1");
        let e = HostConfig::parse(&bad_transport, f, Path::new(".")).expect_err("refused");
        assert!(e.to_string().contains("frame_bytes_max"), "{e}");
        // Issue 23: in the transport's range, but too small for the largest envelope.
        let need = crate::limits::envelope_frame_bytes_max;
        let small = text(&format!("[transport]\nframe_bytes_max = {}", need - 1));
        let e = HostConfig::parse(&small, f, Path::new(".")).expect_err("refused");
        assert!(e.to_string().contains("envelope_frame_bytes_max"), "{e}");
        let bad_name = text("").replace("\"ace\"", "\"a/b\"");
        let e = HostConfig::parse(&bad_name, f, Path::new(".")).expect_err("refused");
        assert!(e.to_string().contains("`name`"), "{e}");
    }

    #[test]
    fn a_wildcard_advertise_or_replica_address_is_refused_naming_the_file_and_key() {
        // Issue 15: listen on the wildcard, advertise (and dial) routable addresses only.
        let f = Path::new("/etc/mesh/host.toml");
        let b = Path::new("/etc/mesh");
        let real = text("replicas = [\"10.0.0.1:7100\", \"[fd00::2]:7100\", \"r3.lan:7100\"]")
            .replace("127.0.0.1:0", "[::]:7200")
            .replace("listen =", "advertise = \"10.0.0.5:7200\"\nlisten =");
        let c = HostConfig::parse(&real, f, b).expect("routable addresses pass");
        assert_eq!(c.advertise(), Some("10.0.0.5:7200".parse().expect("addr")));
        let cases = [
            (
                real.replace("10.0.0.5:7200", "0.0.0.0:7200"),
                "advertise",
                "wildcard",
            ),
            (
                real.replace("10.0.0.5:7200", "[::]:7200"),
                "advertise",
                "wildcard",
            ),
            (
                real.replace("10.0.0.1:7100", "0.0.0.0:7100"),
                "replicas[0]",
                "wildcard",
            ),
            (
                real.replace("[fd00::2]:7100", "[ff02::1]:7100"),
                "replicas[1]",
                "multicast",
            ),
            (
                real.replace("[::]:7200", "0.0.0.0:7200"),
                "replicas[1]",
                "[::]:7200",
            ),
        ];
        for (text, key, what) in cases {
            let e = HostConfig::parse(&text, f, b)
                .expect_err("refused")
                .to_string();
            assert!(
                e.contains("/etc/mesh/host.toml") && e.contains(&format!("`{key}`")),
                "{e}"
            );
            assert!(e.contains(what), "{what}: {e}");
        }
    }
}
