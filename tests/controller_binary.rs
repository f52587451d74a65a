//! The `meshd` binary: starts from a `replica.toml`, answers an operator over QUIC, saves a snapshot,
//! exits 0 on SIGTERM, and `meshd restore` makes a fresh store from the snapshot and says so loudly.

mod controller_common;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use controller_common::*;
use mesh::controller::api::{Body, Request};
use mesh::controller::config::{ReplicaConfigFile, TlsFile, write_signing_key};
use mesh_testkit::ChildGuard;
use mesh_transport::{Endpoint, MessageKind, Peer, Principal, TransportConfig};

fn free_port() -> SocketAddr {
    let s = std::net::UdpSocket::bind("127.0.0.1:0").expect("bind");
    s.local_addr().expect("addr")
}

fn write_config(dir: &Path, pki: &Pki, addr: SocketAddr, data_dir: &str) -> PathBuf {
    let (cert, key) = pki.write(data_dir, &Principal::Replica(1));
    let signing = dir.join("signing.key");
    if !signing.exists() {
        let k = ed25519_dalek::SigningKey::from_bytes(&[5; 32]);
        write_signing_key(&signing, &k).expect("signing key");
    }
    let file = ReplicaConfigFile {
        id: 1,
        listen: addr.to_string(),
        data_dir: data_dir.into(),
        signing_key: "signing.key".into(),
        tls: TlsFile {
            ca: pki.ca_path(),
            cert,
            key,
        },
        peers: [("1".to_string(), addr.to_string())].into(),
        hosts: Default::default(),
        raft: Some(fast_raft()),
        transport: None,
        http: None,
        silent_after_ms: None,
        trusted_keys: Default::default(),
        join: false,
    };
    let path = dir.join(format!("{data_dir}.toml"));
    std::fs::write(&path, file.to_toml().expect("toml")).expect("write config");
    path
}

async fn ask(operator: &Endpoint, addr: SocketAddr, request: &Request) -> Option<Body> {
    let call = mesh::controller::api::Call::new(request.clone()).expect("a request id");
    let body = mesh_codec::encode("request", &call).expect("encode");
    let peer = Peer::expecting(addr, Principal::Replica(1));
    let bytes = operator
        .request(peer, MessageKind::Command, body, Duration::from_secs(5))
        .await
        .ok()?;
    let answer: mesh::controller::api::Answer =
        mesh_codec::decode("answer", &bytes).expect("answer");
    answer.body.ok()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn meshd_serves_saves_a_snapshot_stops_on_sigterm_and_restores_loudly() {
    // Processes (G9): meshd runs from its config, exits 0 on SIGTERM, and restore says what it did.
    let dir = tempfile::tempdir().expect("tempdir");
    let pki = Pki::in_dir(&dir.path().join("pki"));
    let addr = free_port();
    let config = write_config(dir.path(), &pki, addr, "replica-1");
    let log = std::fs::File::create(dir.path().join("meshd.log")).expect("log");
    let mut meshd = ChildGuard(
        Command::new(env!("CARGO_BIN_EXE_meshd"))
            .arg("--config")
            .arg(&config)
            .stderr(Stdio::from(log))
            .spawn()
            .expect("meshd starts"),
    );
    let operator = Endpoint::bind(
        "127.0.0.1:0".parse().expect("addr"),
        &pki.identity(&Principal::Operator("alice".into())),
        TransportConfig::default().check().expect("transport"),
    )
    .expect("operator binds");
    wait_until("meshd leads and answers status", || {
        let operator = operator.clone();
        async move {
            matches!(
                ask(&operator, addr, &Request::Status).await,
                Some(Body::Status(s)) if s.replicas.iter().any(|r| r.leader)
            )
        }
    })
    .await;
    let first = Request::SnapshotChunk {
        snapshot: None,
        offset: 0,
    };
    let Some(Body::SnapshotChunk { bytes, total, .. }) = ask(&operator, addr, &first).await else {
        panic!("snapshot")
    };
    assert_eq!(total, bytes.len() as u64, "a small store is one chunk");
    let snapshot = dir.path().join("backup.snapshot");
    std::fs::write(&snapshot, bytes).expect("write snapshot");
    let pid = nix::unistd::Pid::from_raw(meshd.0.id() as i32);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).expect("SIGTERM");
    let status = meshd.exited().await;
    assert!(status.success(), "meshd exit: {status}");
    let restored = write_config(dir.path(), &pki, addr, "replica-1-restored");
    let out = Command::new(env!("CARGO_BIN_EXE_meshd"))
        .arg("restore")
        .arg("--config")
        .arg(&restored)
        .arg("--from")
        .arg(&snapshot)
        .output()
        .expect("meshd restore runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(stderr.contains("STORE RESTORED"), "{stderr}");
    assert!(dir.path().join("replica-1-restored/epoch-floor").exists());
    operator.close().await;
}
