//! The `mesh-host` binary: resumes the last applied declaration from its state directory, and on
//! SIGTERM stops every module before it exits, leaving no orphan process. After a mesh-host that
//! was killed outright, the next start stops what it left running before starting anything.

mod host_common;

use host_common::*;

/// Applies one module that writes its pid, through the library, and writes host.toml; returns
/// the config path and the pid file (removed, so the next start is seen).
async fn prepared(fx: &Fixture) -> (std::path::PathBuf, std::path::PathBuf) {
    let agent = fx.agent();
    let module = shell("web", "echo $$ > pid; exec sleep 600");
    agent
        .receive(&fx.seal(1, 1, vec![module]))
        .await
        .expect("applied");
    ready_pid(&agent, "web").await;
    let pid_file = fx.module_dir("web").join("pid");
    // The module is "ready" once started, which can be before its shell has written the file.
    module_pid(&pid_file).await;
    agent.shutdown().await;
    std::fs::remove_file(&pid_file).expect("remove pid file");
    // Nothing listens at the replica address: reports wait on disk, which these tests ignore.
    let nowhere = "127.0.0.1:9".parse().expect("address");
    let config = fx.write_process_config(&Pki::new(), &[nowhere]);
    (config, pid_file)
}

fn spawn_host(fx: &Fixture, config: &std::path::Path) -> HostProcess {
    HostProcess::spawn(config, &fx.dir.path().join("mesh-host.log"))
}

async fn module_pid(pid_file: &std::path::Path) -> u32 {
    wait_until("the module to start", || async {
        read(pid_file).trim().parse::<u32>().is_ok()
    })
    .await;
    read(pid_file).trim().parse().expect("pid")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_module_left_by_a_killed_mesh_host_is_stopped_before_the_next_start() {
    // No duplicates: mesh-host killed with SIGKILL cannot stop its modules; the next agent over
    // the same root stops the leftover group before it starts the module again.
    let fx = Fixture::new();
    let (config, pid_file) = prepared(&fx).await;
    let mut host = spawn_host(&fx, &config);
    let leftover = module_pid(&pid_file).await;
    let _guard = GroupGuard(vec![leftover]);
    host.0.kill().expect("SIGKILL mesh-host");
    host.0.wait().expect("reap mesh-host");
    assert!(
        alive(leftover),
        "the module should outlive a SIGKILLed mesh-host"
    );
    std::fs::remove_file(&pid_file).expect("remove pid file");

    let agent = fx.agent();
    agent.start().await.expect("start");
    let fresh = module_pid(&pid_file).await;
    let _guard2 = GroupGuard(vec![fresh]);
    assert_ne!(fresh, leftover);
    wait_until("the leftover to be stopped", || async { !alive(leftover) }).await;
    agent.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mesh_host_resumes_its_declaration_and_stops_every_module_on_sigterm() {
    // No orphans: the agent's modules end with it; a restart runs the last applied declaration.
    let fx = Fixture::new();
    let (config, pid_file) = prepared(&fx).await;
    let mut agent = spawn_host(&fx, &config);
    let module = module_pid(&pid_file).await;
    let _guard = GroupGuard(vec![module]);
    assert!(alive(module));

    let agent_pid = nix::unistd::Pid::from_raw(agent.0.id() as i32);
    nix::sys::signal::kill(agent_pid, nix::sys::signal::Signal::SIGTERM).expect("SIGTERM");
    let status = agent.exited().await;
    assert!(status.success(), "mesh-host exited with {status}");
    assert!(!alive(module), "module {module} outlived mesh-host");
}
