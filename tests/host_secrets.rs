//! Provision secrets: written 0600 under `secrets/<id>` in a 0700 directory, and never in the
//! host's own logs (all tracing output is captured here), in reports, or in the provisions file.

mod host_common;

use host_common::*;
use mesh::core::declaration::ProvisionRef;
use mesh::core::model::Placement;
use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::sync::{Arc, Mutex};

const secret: &str = "s3cr3t-never-to-be-seen-9f2c";

#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().expect("log lock").extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn mode(path: &std::path::Path) -> u32 {
    std::fs::metadata(path)
        .expect("metadata")
        .permissions()
        .mode()
        & 0o777
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn secrets_are_0600_and_never_appear_in_logs_or_reports() {
    // Secrets: tight permissions from creation; never logged, never reported.
    let logs = Captured::default();
    let writer = logs.clone();
    tracing_subscriber::fmt()
        .with_max_level(tracing::Level::TRACE)
        .with_writer(move || writer.clone())
        .init();
    let fx = Fixture::new();
    let agent = fx.agent();
    let mut web = shell(
        "web",
        "cat secrets/p1 > /dev/null && touch read-ok; exec sleep 600",
    );
    web.provisions.push(ProvisionRef {
        id: "p1".into(),
        kind: "http".into(),
        provider: Placement {
            module: "broker".into(),
            machine: "g14".into(),
        },
        name: "web.example".into(),
        secret: secret.into(),
        endpoint: None,
    });
    let mut broken = web.clone();
    broken.name = "broken".into();
    broken.command = "/nonexistent/mesh-secret-test".into();
    let applied = agent.receive(&fx.seal(1, 1, vec![web, broken])).await;
    applied.expect("applied");
    let pid = ready_pid(&agent, "web").await;
    let _guard = GroupGuard(vec![pid]);
    let dir = fx.module_dir("web");
    wait_until("the module to read its secret", || async {
        dir.join("read-ok").exists()
    })
    .await;
    assert_eq!(read(&dir.join("secrets/p1")), secret);
    assert_eq!(mode(&dir.join("secrets/p1")), 0o600);
    assert_eq!(mode(&dir.join("secrets")), 0o700);
    // Issue 27 part 7: the host's state (the declaration with its secrets, the mark) is 0600 in
    // the root the agent created 0700.
    assert_eq!(mode(&fx.root()), 0o700);
    assert_eq!(mode(&fx.root().join("applied")), 0o600);
    assert_eq!(mode(&fx.root().join("high_water")), 0o600);
    let provisions = read(&dir.join("provisions.toml"));
    assert!(provisions.contains("secrets/p1") && !provisions.contains(secret));

    let reported = agent.report_now().await.expect("report");
    let text = format!("{reported:?}");
    assert!(!text.contains(secret), "secret in a report");
    agent.shutdown().await;
    let logged = String::from_utf8_lossy(&logs.0.lock().expect("log lock")).to_string();
    assert!(
        logged.contains("module started"),
        "log capture is not working"
    );
    assert!(!logged.contains(secret), "secret in the host's log");
    for stream in ["stdout", "stderr"] {
        let log = fx.root().join("logs").join(format!("web.{stream}.log"));
        assert!(!read(&log).contains(secret));
    }
}
