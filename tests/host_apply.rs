//! Applying declarations with real child processes: only what changed restarts, dependencies wait
//! for readiness (G12), a module that cannot start fails alone, removed modules stop with their
//! whole process group, crashed ones restart, and mounts are created and handed over.

mod host_common;

use host_common::*;
use mesh::core::declaration::Grant;
use mesh::core::model::{Placement, Probe};
use mesh::core::report::ModuleState;
use std::os::unix::fs::PermissionsExt;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn applying_a_changed_declaration_restarts_only_the_changed_module() {
    // Applying changes only what changed: identical modules keep their pid, a changed one gets a
    // new process, a removed one stops, a new one starts.
    let fx = Fixture::new();
    let agent = fx.agent();
    let first = vec![sleeper("keep"), sleeper("change"), sleeper("remove")];
    agent.receive(&fx.seal(1, 1, first)).await.expect("applied");
    let keep = ready_pid(&agent, "keep").await;
    let change = ready_pid(&agent, "change").await;
    let remove = ready_pid(&agent, "remove").await;
    let _guard = GroupGuard(vec![keep, change, remove]);

    let mut changed = sleeper("change");
    changed.args = vec!["-c".into(), "exec sleep 599".into()];
    let second = vec![sleeper("keep"), changed, sleeper("add")];
    let applied = agent
        .receive(&fx.seal(1, 2, second))
        .await
        .expect("applied");
    assert_eq!(applied.outcome.unchanged, vec!["keep".to_string()]);
    assert_eq!(applied.outcome.restarted, vec!["change".to_string()]);
    assert_eq!(applied.outcome.stopped, vec!["remove".to_string()]);
    assert_eq!(applied.outcome.started, vec!["add".to_string()]);

    assert_eq!(ready_pid(&agent, "keep").await, keep);
    assert_ne!(ready_pid(&agent, "change").await, change);
    ready_pid(&agent, "add").await;
    assert!(alive(keep));
    assert!(
        !alive(change),
        "the changed module's old process still runs"
    );
    assert!(!alive(remove), "the removed module still runs");
    assert!(find(&agent.status().await, "remove").is_none());
    assert!(!fx.module_dir("remove").exists());
    agent.shutdown().await;
    assert!(!alive(keep));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grants_only_change_rewrites_the_grants_file_without_a_restart() {
    // A provider whose grants alone changed keeps its process and reloads grants.toml.
    let fx = Fixture::new();
    let agent = fx.agent();
    let grant = |id: &str| Grant {
        id: id.into(),
        kind: "http".into(),
        consumer: Placement {
            module: "web".into(),
            machine: "g14".into(),
        },
        name: format!("{id}.example"),
        secret_blake3: "ab".repeat(32),
    };
    let mut broker = sleeper("broker");
    broker.grants = vec![grant("p1")];
    agent
        .receive(&fx.seal(1, 1, vec![broker.clone()]))
        .await
        .expect("applied");
    let pid = ready_pid(&agent, "broker").await;
    let _guard = GroupGuard(vec![pid]);
    let grants = fx.module_dir("broker").join("grants.toml");
    assert!(read(&grants).contains("p1.example"));

    broker.grants.push(grant("p2"));
    let applied = agent
        .receive(&fx.seal(1, 2, vec![broker]))
        .await
        .expect("applied");
    assert_eq!(applied.outcome.regranted, vec!["broker".to_string()]);
    assert!(read(&grants).contains("p2.example"));
    assert_eq!(ready_pid(&agent, "broker").await, pid);
    assert!(alive(pid));
    agent.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn g12_a_dependent_starts_only_after_its_dependency_passes_its_file_probe() {
    // G12: `web` is after `db`; db is ready only once its file probe passes, which happens only
    // when the test says so. Until then web waits (and says on what), and has not run at all.
    let fx = Fixture::new();
    let agent = fx.agent();
    let mut db = shell(
        "db",
        "while [ ! -f go ]; do sleep 0.02; done; touch ready.flag; exec sleep 600",
    );
    db.ready = Some(Probe::File {
        path: "ready.flag".into(),
        timeout_ms: 1000,
    });
    let mut web = shell(
        "web",
        "if [ -f ../db/ready.flag ]; then echo ready > saw; else echo early > saw; fi; exec sleep 600",
    );
    web.after = vec!["db".into()];
    agent
        .receive(&fx.seal(1, 1, vec![db, web]))
        .await
        .expect("applied");
    wait_until("web to wait on db", || async {
        let status = agent.status().await;
        matches!(find(&status, "web").map(|s| &s.state),
            Some(ModuleState::Waiting { on }) if on.contains("db"))
    })
    .await;
    wait_until("db to run", || async {
        let status = agent.status().await;
        find(&status, "db").is_some_and(|s| s.state == ModuleState::Running)
    })
    .await;
    assert!(!fx.module_dir("web").join("saw").exists(), "web ran early");
    std::fs::write(fx.module_dir("db").join("go"), b"").expect("go");
    let web_pid = ready_pid(&agent, "web").await;
    let _guard = GroupGuard(vec![web_pid]);
    let saw = fx.module_dir("web").join("saw");
    wait_until("web to look", || async { !read(&saw).is_empty() }).await;
    assert_eq!(read(&saw).trim(), "ready");
    agent.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_that_does_not_exist_is_reported_failed_while_others_run() {
    // A module whose command cannot start is Failed with the reason; the host and the other
    // modules carry on.
    let fx = Fixture::new();
    let agent = fx.agent();
    let mut broken = sleeper("broken");
    broken.command = "/nonexistent/mesh-no-such-command".into();
    agent
        .receive(&fx.seal(1, 1, vec![broken, sleeper("fine")]))
        .await
        .expect("applied");
    let pid = ready_pid(&agent, "fine").await;
    let _guard = GroupGuard(vec![pid]);
    wait_until("broken to be failed", || async {
        let status = agent.status().await;
        matches!(find(&status, "broken").map(|s| &s.state),
            Some(ModuleState::Failed { error }) if error.contains("mesh-no-such-command"))
    })
    .await;
    let report = agent.report_now().await.expect("report");
    assert!(
        report
            .modules
            .iter()
            .any(|m| m.name == "fine" && m.state == ModuleState::Ready)
    );
    assert!(alive(pid));
    agent.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_removed_module_is_stopped_with_its_whole_process_group() {
    // Stopping a module signals its process group: a background child it left goes too.
    let fx = Fixture::new();
    let agent = fx.agent();
    let forks = shell("forks", "sleep 600 & echo $! > child; wait");
    agent
        .receive(&fx.seal(1, 1, vec![forks]))
        .await
        .expect("applied");
    let leader = ready_pid(&agent, "forks").await;
    let child_file = fx.module_dir("forks").join("child");
    wait_until("the background child", || async {
        read(&child_file).trim().parse::<u32>().is_ok()
    })
    .await;
    let child: u32 = read(&child_file).trim().parse().expect("pid");
    let _guard = GroupGuard(vec![leader]);
    assert!(alive(child));
    agent
        .receive(&fx.seal(1, 2, vec![]))
        .await
        .expect("applied");
    wait_until("the whole group to stop", || async {
        !alive(leader) && !alive(child)
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_module_that_exits_is_restarted_with_backoff() {
    // Supervision: an exited module is started again, and its restarts are counted.
    let fx = Fixture::new();
    let agent = fx.agent();
    let flaky = shell("flaky", "echo run >> runs; exit 3");
    agent
        .receive(&fx.seal(1, 1, vec![flaky]))
        .await
        .expect("applied");
    let runs = fx.module_dir("flaky").join("runs");
    wait_until("three runs", || async { read(&runs).lines().count() >= 3 }).await;
    let status = agent.status().await;
    let flaky = find(&status, "flaky").expect("flaky on the board");
    assert!(flaky.restarts >= 2, "{flaky:?}");
    agent.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mounts_settings_and_identity_reach_the_module() {
    // Mounts are created (0700) under mounts_root, linked at their target and named in
    // MESH_MOUNT_<NAME>; settings arrive as MESH_SETTING_<KEY>; the module runs in its directory.
    let fx = Fixture::new();
    let agent = fx.agent();
    let mut db = shell(
        "db",
        "echo \"$MESH_MOUNT_DATA|$MESH_SETTING_LOG_LEVEL|$MESH_MODULE|$MESH_MACHINE|$(pwd)\" > env.txt; echo hi > data/hello; exec sleep 600",
    );
    db.mounts.push(mesh::core::model::Mount {
        name: "data".into(),
        host_dir: "/srv/db".into(),
        target: "data".into(),
    });
    db.settings.insert("log.level".into(), "debug".into());
    agent
        .receive(&fx.seal(1, 1, vec![db]))
        .await
        .expect("applied");
    let pid = ready_pid(&agent, "db").await;
    let _guard = GroupGuard(vec![pid]);
    let mount = fx.mounts().join("srv/db");
    wait_until("the module to write into its mount", || async {
        read(&mount.join("hello")).trim() == "hi"
    })
    .await;
    let mode = std::fs::metadata(&mount)
        .expect("mount")
        .permissions()
        .mode()
        & 0o777;
    assert_eq!(mode, 0o700);
    let dir = fx.module_dir("db");
    let expected = format!(
        "{}|debug|db|ace|{}",
        mount.display(),
        dir.canonicalize().expect("dir").display()
    );
    assert_eq!(read(&dir.join("env.txt")).trim(), expected);
    agent.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn g12_a_consumer_waits_for_its_providers_endpoint() {
    // G12: a consumer of a provision whose endpoint is set starts only once a TCP connect to it
    // succeeds. The port is bound but not listening until the test says so.
    let fx = Fixture::new();
    let agent = fx.agent();
    let socket = tokio::net::TcpSocket::new_v4().expect("socket");
    socket
        .bind("127.0.0.1:0".parse().expect("addr"))
        .expect("bind");
    let endpoint = socket.local_addr().expect("addr").to_string();
    let mut web = sleeper("web");
    web.provisions.push(mesh::core::declaration::ProvisionRef {
        id: "p1".into(),
        kind: "http".into(),
        provider: Placement {
            module: "broker".into(),
            machine: "g14".into(),
        },
        name: "web.example".into(),
        secret: "s".into(),
        endpoint: Some(endpoint.clone()),
    });
    agent
        .receive(&fx.seal(1, 1, vec![web]))
        .await
        .expect("applied");
    wait_until("web to wait on the endpoint", || async {
        let status = agent.status().await;
        matches!(find(&status, "web").map(|s| &s.state),
            Some(ModuleState::Waiting { on }) if on.contains(&endpoint))
    })
    .await;
    assert!(find(&agent.status().await, "web").is_some_and(|s| s.pid.is_none()));
    let _listener = socket.listen(16).expect("listen");
    let pid = ready_pid(&agent, "web").await;
    let _guard = GroupGuard(vec![pid]);
    agent.shutdown().await;
}
