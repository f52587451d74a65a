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

/// Three machines on their own addresses: ace and g14 on IPv4, novox on IPv6.
fn real_mesh(novox: &str) -> String {
    format!(
        "[machines.ace]\naddress = \"10.0.0.5\"\n\n[machines.g14]\naddress = \"10.0.0.6\"\n\n\
         [machines.novox]\naddress = \"{novox}\"\n\n[modules.db]\nmachine = \"ace\"\ncommand = \"sleep\"\n\
         args = [\"600\"]\nprovides = [{{ kind = \"sql\", port = 5432 }}]\n"
    )
}

fn toml_of(path: &Path) -> toml::Table {
    let text = std::fs::read_to_string(path).expect("read config");
    toml::from_str(&text).expect("toml")
}

#[test]
fn init_with_replica_addresses_listens_on_the_wildcard_and_advertises_the_routable_address() {
    // Issue 15: --replica and the mesh file's machine addresses; listen and advertise kept apart,
    // IPv6 included, and each config passes its own process's checks.
    let tmp = tempfile::tempdir().expect("tempdir");
    for (novox, listen) in [("10.0.0.7", "0.0.0.0"), ("fd00::7", "[::]")] {
        let file = tmp.path().join(format!("mesh-{listen}.toml"));
        std::fs::write(&file, real_mesh(novox)).expect("write mesh");
        let dir = tmp.path().join(format!("mesh-{listen}"));
        let out = init(
            &dir,
            &[
                "-f",
                file.to_str().expect("utf-8"),
                "--replica",
                "1=10.0.0.1:7100",
                "--replica",
                "2=10.0.0.2",
                "--replica",
                "3=10.0.0.3:7300",
            ],
        );
        assert!(out.status.success(), "{}", text(&out.stderr));
        let replica = toml_of(&dir.join("replica-3.toml"));
        assert_eq!(
            replica["listen"].as_str(),
            Some(format!("{listen}:7300").as_str())
        );
        assert_eq!(replica["peers"]["2"].as_str(), Some("10.0.0.2:7100"));
        assert_eq!(replica["peers"]["3"].as_str(), Some("10.0.0.3:7300"));
        assert_eq!(replica["hosts"]["ace"].as_str(), Some("10.0.0.5:7200"));
        let novox_at = if novox.contains(':') {
            format!("[{novox}]:7200")
        } else {
            format!("{novox}:7200")
        };
        assert_eq!(replica["hosts"]["novox"].as_str(), Some(novox_at.as_str()));
        ReplicaConfig::load(&dir.join("replica-3.toml")).expect("meshd accepts it");
        let host = toml_of(&dir.join("host-novox.toml"));
        assert_eq!(
            host["listen"].as_str(),
            Some(format!("{listen}:7200").as_str())
        );
        assert_eq!(host["advertise"].as_str(), Some(novox_at.as_str()));
        let loaded = HostConfig::load(&dir.join("host-novox.toml")).expect("mesh-host accepts it");
        assert_eq!(
            loaded.replicas(),
            ["10.0.0.1:7100", "10.0.0.2:7100", "10.0.0.3:7300"]
        );
        let context = mesh::cli::context::load(&dir.join("context.toml"), "--context")
            .expect("meshctl accepts the context");
        assert_eq!(
            context.replicas[0].1,
            "10.0.0.1:7100".parse().expect("addr")
        );
    }
}

#[test]
fn init_refuses_wildcard_unroutable_shared_and_mixed_loopback_addresses_and_writes_nothing() {
    // Issue 15: an address no other machine can dial is refused in one line naming it, exit 2,
    // before anything is written.
    let tmp = tempfile::tempdir().expect("tempdir");
    let good = tmp.path().join("good.toml");
    std::fs::write(&good, real_mesh("10.0.0.7")).expect("write");
    let variant = |name: &str, novox: &str| {
        let path = tmp.path().join(name);
        std::fs::write(&path, real_mesh(novox)).expect("write");
        path.display().to_string()
    };
    let wildcard = variant("wildcard.toml", "0.0.0.0");
    let named = variant("named.toml", "novox.lan");
    let shared = variant("shared.toml", "10.0.0.5");
    let looped = variant("looped.toml", "127.0.0.1");
    let linked = variant("linked.toml", "fe80::7");
    let good = good.display().to_string();
    let r = [
        "--replica",
        "1=10.0.0.1:7100",
        "--replica",
        "2=10.0.0.2:7100",
    ];
    let with = |file: &str, extra: &[&'static str]| -> Vec<String> {
        let mut v: Vec<String> = vec!["-f".into(), file.into()];
        v.extend(extra.iter().map(|s| s.to_string()));
        v
    };
    let cases: Vec<(Vec<String>, &str)> = vec![
        (with(&good, &["--replica", "1=0.0.0.0:7100"]), "wildcard"),
        (with(&good, &["--replica", "1=[::]:7100"]), "wildcard"),
        (with(&good, &["--replica", "1=10.0.0.1:0"]), "port 0"),
        (with(&good, &["--replica", "1=224.0.0.9:7100"]), "multicast"),
        (with(&good, &["--replica", "1=nowhere"]), "ID=ADDR"),
        (
            with(
                &good,
                &["--replica", "1=10.0.0.1", "--replica", "1=10.0.0.2"],
            ),
            "twice",
        ),
        (with(&good, &["--replica", "1=127.0.0.1:7101"]), "loopback"),
        (
            with(&good, &["--replica", "1=10.0.0.5:7200"]),
            "both listen",
        ),
        (with(&wildcard, &r), "wildcard"),
        (with(&named, &r), "not an IP address"),
        (with(&shared, &r), "both listen at 10.0.0.5:7200"),
        (with(&looped, &r), "loopback"),
        (with(&linked, &r), "link-local"),
        (
            with(&good, &["--replica", "1=10.0.0.1", "--replicas", "3"]),
            "--replicas",
        ),
        (
            vec![
                "--machines".into(),
                "ace".into(),
                "--replica".into(),
                "1=10.0.0.1".into(),
            ],
            "--file",
        ),
    ];
    for (i, (args, what)) in cases.iter().enumerate() {
        let dir = tmp.path().join(format!("out-{i}"));
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let out = init(&dir, &args);
        let stderr = text(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains(what), "{args:?}: want {what}: {stderr}");
        if !what.starts_with("--") {
            assert_eq!(stderr.trim_end().lines().count(), 1, "{stderr}");
        }
        assert!(!dir.join("ca.key").exists(), "{args:?} wrote a CA");
    }
}

fn role_of(dir: &Path, sub: &str) -> (mesh_transport::Principal, Option<mesh_transport::Role>) {
    let identity = mesh_transport::Identity::load(
        &dir.join("ca.pem"),
        &dir.join(sub).join("cert.pem"),
        &dir.join(sub).join("key.pem"),
    )
    .expect("identity");
    (identity.principal().clone(), identity.role())
}

#[test]
fn g10_init_issues_an_admin_and_certs_issue_and_renew_state_the_role_asked() {
    // G10, decision 0295: init's operator is admin; `certs issue` needs --role and writes a
    // certificate stating it with a context that uses it; `certs renew` keeps the role unless
    // --role changes it.
    use mesh_transport::{Principal, Role};
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().join("mesh");
    let out = init(&dir, &["--replicas", "1", "--machines", "ace"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let admin = Principal::Operator("admin".into());
    assert_eq!(role_of(&dir, "operator"), (admin, Some(Role::Admin)));
    let context = dir.join("context.toml");
    let context = context.to_str().expect("utf-8 path");
    let issue = |extra: &[&str]| {
        let mut args = vec!["--context", context, "certs", "issue", "operator:monitor"];
        args.extend_from_slice(extra);
        meshctl(&args)
    };
    let no_role = issue(&[]);
    assert!(!no_role.status.success(), "a new operator's role is chosen");
    assert!(
        text(&no_role.stderr).contains("--role"),
        "{}",
        text(&no_role.stderr)
    );
    let bad = issue(&["--role", "root"]);
    assert!(!bad.status.success());
    assert!(
        text(&bad.stderr).contains("viewer, operator, admin"),
        "{}",
        text(&bad.stderr)
    );
    let out = issue(&["--role", "viewer"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let monitor = Principal::Operator("monitor".into());
    assert_eq!(
        role_of(&dir, "operator-monitor"),
        (monitor.clone(), Some(Role::Viewer))
    );
    assert_eq!(mode(&dir.join("operator-monitor/key.pem")), 0o600);
    let path = dir.join("context-monitor.toml");
    mesh::cli::context::load(&path, "test").expect("the new context loads");
    let again = issue(&["--role", "admin"]);
    assert!(!again.status.success(), "issue never overwrites");
    assert!(
        text(&again.stderr).contains("certs renew operator:monitor"),
        "{}",
        text(&again.stderr)
    );
    let renew = |extra: &[&str]| {
        let mut args = vec!["--context", context, "certs", "renew", "operator:monitor"];
        args.extend_from_slice(extra);
        let out = meshctl(&args);
        assert!(out.status.success(), "{}", text(&out.stderr));
        role_of(&dir, "operator-monitor").1
    };
    assert_eq!(renew(&[]), Some(Role::Viewer), "a renewal keeps the role");
    assert_eq!(renew(&["--role", "operator"]), Some(Role::Operator));
    let host = meshctl(&[
        "--context",
        context,
        "certs",
        "renew",
        "host:ace",
        "--role",
        "admin",
    ]);
    assert!(!host.status.success(), "a host states no role");
}

#[test]
fn secrets_on_disk_are_0600_in_0700_directories_after_init() {
    // Issue 27 part 7: every directory init creates is 0700, every key in it 0600; a directory the
    // operator made beforehand keeps its mode, and init says how to close it (decision 0296).
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().join("mesh");
    let out = init(&dir, &["--replicas", "3", "--machines", "ace"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    for sub in ["", "replica-1", "replica-3", "host-ace", "operator"] {
        assert_eq!(mode(&dir.join(sub)), 0o700, "{sub}/");
    }
    for key in [
        "ca.key",
        "replica-2/key.pem",
        "replica-2/signing.key",
        "host-ace/key.pem",
        "operator/key.pem",
    ] {
        assert_eq!(mode(&dir.join(key)), 0o600, "{key}");
    }
    let hidden: Vec<_> = walk(&dir)
        .into_iter()
        .filter(|p| p.to_string_lossy().contains(".mesh-tmp"))
        .collect();
    assert!(hidden.is_empty(), "temp files left: {hidden:?}");
    let made = tmp.path().join("made-before");
    std::fs::create_dir(&made).expect("mkdir");
    std::fs::set_permissions(&made, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let out = init(&made, &["--replicas", "1", "--machines", "ace"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(
        mode(&made),
        0o755,
        "a directory init did not create keeps its mode"
    );
    assert!(
        text(&out.stderr).contains(&format!("chmod 700 {}", made.display())),
        "{}",
        text(&out.stderr)
    );
    assert_eq!(mode(&made.join("replica-1")), 0o700);
    assert_eq!(mode(&made.join("ca.key")), 0o600);
}

fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).expect("list") {
        let path = entry.expect("entry").path();
        if path.is_dir() {
            out.extend(walk(&path));
        }
        out.push(path);
    }
    out
}
