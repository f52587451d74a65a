//! Declaration fixtures: modules as a host receives them in an envelope.

use std::collections::BTreeMap;

use mesh_core::declaration::DeclaredModule;

/// A module running `sh -c <script>`.
pub fn shell(name: &str, script: &str) -> DeclaredModule {
    DeclaredModule {
        name: name.into(),
        command: "sh".into(),
        args: vec!["-c".into(), script.into()],
        env: Default::default(),
        settings: BTreeMap::new(),
        files: Default::default(),
        mounts: vec![],
        ready: None,
        after: vec![],
        provisions: vec![],
        grants: vec![],
    }
}

/// A module that sleeps for a long time (exec'd, so its pid is the sleeper's).
pub fn sleeper(name: &str) -> DeclaredModule {
    shell(name, "exec sleep 600")
}
