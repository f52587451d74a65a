//! Who may ask what (G10, decision 0295): the one table of the role each operator request needs,
//! and the check the replica holding the operator's connection makes before it answers or
//! forwards the request (so a forward carries nothing new: the leader trusts the replica that
//! checked).

use mesh_transport::Role;

use super::api::ApiError;
use super::api::Request;

/// The role of an operator certificate that states none: one issued before roles existed. It
/// could ask everything until now, so it still may; a cluster upgraded to roles keeps its
/// operators (decision 0295).
pub const role_unstated: Role = Role::Admin;

/// The role an operator holds with a certificate stating `stated`.
pub fn role_held(stated: Option<Role>) -> Role {
    stated.unwrap_or(role_unstated)
}

/// The role a request needs. The match names every request with no wildcard, so a new request
/// does not compile until someone decides its row.
pub fn role_needed(request: &Request) -> Role {
    match request {
        // Reads: they change nothing and show no minted secret.
        Request::Status
        | Request::Plan { .. }
        | Request::History { .. }
        | Request::SettingsShow { .. }
        | Request::Logs { .. }
        | Request::CertsList
        | Request::ReplicasList
        | Request::Events { .. }
        | Request::ModelShow { .. } => Role::Viewer,
        // Changes to the model, its settings and what runs on its hosts.
        Request::Apply { .. }
        | Request::ApplyChunk { .. }
        | Request::ApplyUpload { .. }
        | Request::SettingsSet { .. }
        | Request::SettingsClear { .. }
        | Request::Push { .. }
        | Request::Genesis { .. }
        | Request::Rollback { .. }
        | Request::SettingsRollback { .. } => Role::Operator,
        // Who is trusted, who votes, and the backup that holds every minted secret.
        Request::CertsReload
        | Request::CertsRevoke { .. }
        | Request::ReplicasAdd { .. }
        | Request::ReplicasRemove { .. }
        | Request::SnapshotChunk { .. } => Role::Admin,
    }
}

/// The meshctl command that sends `request`, as an operator types it.
pub fn command_name(request: &Request) -> &'static str {
    match request {
        Request::Status => "status",
        Request::Apply { .. } | Request::ApplyChunk { .. } | Request::ApplyUpload { .. } => "apply",
        Request::Plan { .. } => "plan",
        Request::Push { .. } => "push",
        Request::SettingsShow { .. } => "settings show",
        Request::SettingsSet { .. } => "settings set",
        Request::SettingsClear { .. } => "settings clear",
        Request::History { .. } => "history",
        Request::SnapshotChunk { .. } => "snapshot save",
        Request::Genesis { .. } => "machines add",
        Request::CertsReload => "certs reload",
        Request::CertsList => "certs list",
        Request::CertsRevoke { .. } => "certs revoke",
        Request::Logs { .. } => "logs",
        Request::ReplicasList => "replicas list",
        Request::ReplicasAdd { .. } => "replicas add",
        Request::ReplicasRemove { .. } => "replicas remove",
        Request::Events { .. } => "events",
        Request::ModelShow { .. } => "model show",
        Request::Rollback { .. } => "rollback",
        Request::SettingsRollback { .. } => "settings rollback",
    }
}

/// Whether `operator`, whose certificate states `stated`, may ask `request`; the refusal names
/// both roles and the way to the one needed.
pub fn check(operator: &str, stated: Option<Role>, request: &Request) -> Result<(), ApiError> {
    let needed = role_needed(request);
    let held = role_held(stated);
    if held >= needed {
        return Ok(());
    }
    Err(ApiError::Forbidden {
        operator: operator.to_string(),
        command: command_name(request).to_string(),
        needed,
        held,
    })
}

#[cfg(test)]
#[path = "roles_tests.rs"]
mod tests;
