//! Declarations a verified envelope may still not apply: a running module's mount moved without
//! `--move` (G8), and paths that would escape the module's directory. Nothing of a refused
//! declaration is applied and the mark does not move.

mod host_common;

use host_common::*;
use mesh::core::declaration::ProvisionRef;
use mesh::core::envelope::Position;
use mesh::core::model::{Mount, Placement};
use mesh::host::HostError;
use mesh::host::validate::DeclarationRefusal;

fn with_mount(host_dir: &str) -> mesh::core::declaration::DeclaredModule {
    let mut db = sleeper("db");
    db.mounts.push(Mount {
        name: "data".into(),
        host_dir: host_dir.into(),
        target: "data".into(),
    });
    db
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn g8_a_moved_mount_is_refused_without_the_move_flag_and_applied_with_it() {
    // G8 (second line of defence): a running module's mount gets another host directory only
    // when the envelope's `moves` names that module.
    let fx = Fixture::new();
    let agent = fx.agent();
    agent
        .receive(&fx.seal(1, 1, vec![with_mount("/srv/a")]))
        .await
        .expect("applied");
    let pid = ready_pid(&agent, "db").await;
    let _guard = GroupGuard(vec![pid]);

    let refused = agent
        .receive(&fx.seal(1, 2, vec![with_mount("/srv/b")]))
        .await;
    match refused {
        Err(HostError::Declaration {
            refusal: DeclarationRefusal::MountMoves(moves),
            ..
        }) => {
            assert_eq!(moves[0].from, "/srv/a");
            assert_eq!(moves[0].to, "/srv/b");
        }
        other => panic!("expected a mount move refusal, got {other:?}"),
    }
    assert_eq!(
        ready_pid(&agent, "db").await,
        pid,
        "a refused move touched db"
    );
    assert!(!fx.mounts().join("srv/b").exists());
    let mark = Position {
        epoch: 1,
        sequence: 1,
    };
    assert_eq!(agent.high_water().await, Some(mark));
    let report = agent.report_now().await.expect("report");
    assert!(report.last_refusal.is_some_and(|r| r.contains("--move db")));

    let moved = fx.seal_with(1, 3, vec![with_mount("/srv/b")], vec!["db".into()]);
    agent.receive(&moved).await.expect("applied with --move");
    let new_pid = ready_pid(&agent, "db").await;
    let _guard2 = GroupGuard(vec![new_pid]);
    assert_ne!(new_pid, pid);
    assert!(fx.mounts().join("srv/b").is_dir());
    let link = std::fs::read_link(fx.module_dir("db").join("data")).expect("link");
    assert_eq!(link, fx.mounts().join("srv/b"));
    agent.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn path_escapes_are_refused_and_nothing_is_applied() {
    // Paths from a declaration never leave the module's directory: `..`, absolute paths, a file
    // under a mount link, a provision id that is a path. Each is refused whole.
    let fx = Fixture::new();
    let agent = fx.agent();
    let mut dotdot = sleeper("web");
    dotdot.files.insert("../../escaped".into(), "x".into());
    let mut absolute = sleeper("web");
    absolute
        .files
        .insert("/tmp/mesh-escaped".into(), "x".into());
    let mut target = with_mount("/srv/a");
    target.mounts[0].target = "../../outside".into();
    let mut through_mount = with_mount("/srv/a");
    through_mount
        .files
        .insert("data/planted".into(), "x".into());
    let mut relative_host = with_mount("srv/a");
    relative_host.name = "db2".into();
    let mut provision = sleeper("web");
    provision.provisions.push(ProvisionRef {
        id: "../../stolen".into(),
        kind: "http".into(),
        provider: Placement {
            module: "broker".into(),
            machine: "g14".into(),
        },
        name: "x".into(),
        secret: "s".into(),
        endpoint: None,
    });
    let cases = [
        dotdot,
        absolute,
        target,
        through_mount,
        relative_host,
        provision,
    ];
    for (i, module) in cases.into_iter().enumerate() {
        let name = module.name.clone();
        let wire = fx.seal(1, i as u64 + 1, vec![module, sleeper("bystander")]);
        let got = agent.receive(&wire).await;
        assert!(
            matches!(got, Err(HostError::Declaration { .. })),
            "case {i} ({name}) was not refused: {got:?}"
        );
    }
    assert_eq!(agent.high_water().await, None);
    assert!(agent.status().await.is_empty());
    assert!(!fx.root().join("modules").exists());
    assert!(!fx.root().join("escaped").exists());
    assert!(!std::path::Path::new("/tmp/mesh-escaped").exists());
    assert_eq!(agent.refusals().await.total, 6);
}
