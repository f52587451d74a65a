//! `meshctl init` run as the real binary: what it writes (PKI, keys 0600, configs the host agent
//! accepts, a context meshctl accepts), genesis declarations equal to compose (G11), and refusals.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use mesh::controller::config::ReplicaConfig;
use mesh::core::compose::{World, compose, digest};
use mesh::core::declaration::Declaration;
use mesh::core::meshfile::parse_mesh;
use mesh::host::HostConfig;

fn example() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/mesh.toml")
}

fn meshctl(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_meshctl"))
        .args(args)
        .env_remove("MESH_CONTEXT")
        .output()
        .expect("run meshctl")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn mode(path: &Path) -> u32 {
    std::fs::metadata(path).expect("stat").permissions().mode() & 0o777
}

fn init(dir: &Path, extra: &[&str]) -> Output {
    let mut args = vec!["init", "--dir", dir.to_str().expect("utf-8 path")];
    args.extend_from_slice(extra);
    meshctl(&args)
}

#[test]
fn init_writes_every_key_0600_and_configs_each_process_accepts() {
    // Keys are private (0600), certificates and configs public; host configs pass mesh-host's own
    // validation; the context passes meshctl's.
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().join("mesh");
    let out = init(&dir, &["--replicas", "3", "--machines", "ace,g14"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    for key in [
        "ca.key",
        "replica-1/key.pem",
        "replica-1/signing.key",
        "replica-3/signing.key",
        "host-ace/key.pem",
        "operator/key.pem",
    ] {
        assert_eq!(mode(&dir.join(key)), 0o600, "{key}");
    }
    for public in [
        "ca.pem",
        "replica-2/cert.pem",
        "replica-2.toml",
        "host-g14.toml",
    ] {
        assert_eq!(mode(&dir.join(public)), 0o644, "{public}");
    }
    let host = HostConfig::load(&dir.join("host-ace.toml")).expect("mesh-host accepts it");
    assert_eq!(host.name(), "ace");
    assert_eq!(host.trusted().len(), 3);
    assert_eq!(host.replicas().len(), 3);
    let context = mesh::cli::context::load(&dir.join("context.toml"), "--context")
        .expect("meshctl accepts the context");
    assert_eq!(context.replicas.len(), 3);
    let replica = ReplicaConfig::load(&dir.join("replica-2.toml")).expect("meshd accepts it");
    assert_eq!(replica.id(), 2);
    assert_eq!(replica.peers().len(), 3);
    assert_eq!(replica.hosts().len(), 2);
    let key = replica
        .read_signing_key()
        .expect("signing key readable, 0600");
    // G2: hosts trust exactly the replicas' signing keys.
    assert_eq!(host.trusted().get(&2), Some(&key.verifying_key()));
    let stdout = text(&out.stdout);
    assert!(stdout.contains("MESH_CONTEXT="), "{stdout}");
}

#[test]
fn g11_genesis_declaration_equals_compose_of_that_machine() {
    // G11: the first declaration a machine gets at install time is what compose makes of it.
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().join("mesh");
    let file = example();
    let out = init(&dir, &["-f", file.to_str().expect("utf-8")]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let mesh_text = std::fs::read_to_string(&file).expect("read example");
    let mesh = parse_mesh("mesh.toml", &mesh_text).expect("example parses");
    let world = World::new(mesh.clone(), []);
    for machine in mesh.machines.keys() {
        let bytes = std::fs::read(dir.join(format!("host-{machine}/genesis.declaration")))
            .expect("genesis written");
        let genesis: Declaration =
            mesh_codec::decode("declaration", &bytes).expect("genesis decodes");
        let composed = compose(&world, machine).expect("compose").declaration;
        assert_eq!(genesis, composed, "{machine}");
        assert_eq!(digest(&genesis), digest(&composed));
        let stdout = text(&out.stdout);
        assert!(
            stdout.contains(&format!("genesis {}", digest(&composed).short())),
            "{stdout}"
        );
    }
}

#[test]
fn init_refuses_an_existing_mesh_bad_names_and_machines_missing_from_the_file() {
    // Bad input: one line, exit 2, and nothing overwritten.
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().join("mesh");
    assert!(init(&dir, &["--machines", "ace"]).status.success());
    let ca_before = std::fs::read(dir.join("ca.key")).expect("ca key");
    let file = example();
    let file = file.to_str().expect("utf-8");
    let other = tmp.path().join("other");
    let cases: Vec<(PathBuf, Vec<&str>)> = vec![
        (dir.clone(), vec!["--machines", "ace"]),
        (other.clone(), vec!["--machines", "Not_Valid"]),
        (other.clone(), vec!["--machines", "ace,ace"]),
        (other.clone(), vec!["--machines", "zz", "-f", file]),
        (other.clone(), vec!["--replicas", "0", "--machines", "ace"]),
        (other.clone(), vec![]),
    ];
    for (d, args) in cases {
        let out = init(&d, &args);
        assert_eq!(
            out.status.code(),
            Some(2),
            "{args:?}: {}",
            text(&out.stderr)
        );
        let stderr = text(&out.stderr);
        assert_eq!(stderr.trim_end().lines().count(), 1, "{stderr}");
    }
    assert_eq!(
        std::fs::read(dir.join("ca.key")).expect("ca key"),
        ca_before
    );
    assert!(!other.join("context.toml").exists());
}
