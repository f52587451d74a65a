//! Model fixtures: machines and modules as an operator's mesh file declares them.

use mesh_core::model::{Machine, Mesh, Module, Mount, Need, Provide};

/// Machine `name` at 127.0.0.1.
pub fn machine(name: &str) -> Machine {
    Machine {
        name: name.into(),
        address: "127.0.0.1".into(),
    }
}

/// A module on `machine` running `sleep 600` (exec'd by sh, so the pid is the sleeper's).
pub fn sleeper(name: &str, machine: &str) -> Module {
    Module {
        name: name.into(),
        machine: machine.into(),
        command: "sh".into(),
        args: vec!["-c".into(), "exec sleep 600".into()],
        env: Default::default(),
        files: Default::default(),
        mounts: vec![],
        ready: None,
        after: vec![],
        provides: vec![],
        consumes: vec![],
    }
}

/// `db` on ace provides `pg` on a port; `app` on g14 consumes it (a cross-machine provision).
pub fn provider_consumer_mesh() -> Mesh {
    let mut db = sleeper("db", "ace");
    db.provides.push(Provide {
        kind: "pg".into(),
        port: Some(5999),
    });
    let mut app = sleeper("app", "g14");
    app.consumes.push(Need {
        kind: "pg".into(),
        from: "db".into(),
    });
    let mut mesh = Mesh::default();
    for m in ["ace", "g14"] {
        mesh.machines.insert(m.into(), machine(m));
    }
    mesh.modules.insert("db".into(), db);
    mesh.modules.insert("app".into(), app);
    mesh
}

/// `broker` on ace with a mount `data` at `host_dir`.
pub fn mount_mesh(host_dir: &str) -> Mesh {
    let mut broker = sleeper("broker", "ace");
    broker.mounts.push(Mount {
        name: "data".into(),
        host_dir: host_dir.into(),
        target: "data".into(),
    });
    let mut mesh = Mesh::default();
    mesh.machines.insert("ace".into(), machine("ace"));
    mesh.modules.insert("broker".into(), broker);
    mesh
}
