//! Read back and roll back (issue 25 items 1 and 2, decisions 0302 and 0303): `model show` (the
//! model in force, or a kept revision's, with the settings layers in force that name it),
//! `rollback` (a kept revision's model stored again as a new revision, through every check an
//! apply makes) and `settings rollback` (one settings write that makes a layer what a history
//! entry left it). Nothing here sends: the push does, as for any change.

use super::api::{ApiError, ApplyError, Body, ModelError, ModelView, RequestId, SettingsError};
use super::ops::{settings_refused, storage};
use super::service::Service;
use crate::core::model::Mesh;
use crate::core::settings::{Layer, Scope};
use crate::core::validate::scope_problem;
use crate::store::app::MeshApp;
use crate::store::command::{Command, SettingsChange};
use crate::store::state::{DomainState, model_revisions_bytes_max, model_revisions_kept_max};

impl Service {
    /// `Request::ModelShow`.
    pub(crate) fn model_show(&self, revision: Option<u64>) -> Result<Body, ApiError> {
        let state = self.state()?;
        let db = self.replica.database();
        let last = MeshApp::last_model_revision(db).map_err(|e| storage("model history", &e))?;
        let (model_revision, model) = match revision {
            None => (last, stored_model(&state)),
            Some(r) => (Some(r), self.kept_model(&state, r)?),
        };
        let (mesh, settings_left_out) = with_settings_in_force(&state, model);
        let change = match model_revision {
            Some(r) => MeshApp::model_change(db, r).map_err(|e| storage("model history", &e))?,
            None => None,
        };
        Ok(Body::Model(ModelView {
            model_revision,
            store_revision: state.revision,
            current: revision.is_none() || revision == last,
            mesh,
            settings_left_out,
            change,
        }))
    }

    /// The model kept for model revision `revision`, or why there is none.
    fn kept_model(&self, state: &DomainState, revision: u64) -> Result<Mesh, ApiError> {
        let db = self.replica.database();
        let kept = match revision <= state.revision {
            true => {
                MeshApp::model_revision(db, revision).map_err(|e| storage("kept models", &e))?
            }
            false => None,
        };
        let was_model = kept.is_none()
            && MeshApp::model_change(db, revision)
                .map_err(|e| storage("model history", &e))?
                .is_some();
        let oldest_kept = state.model_revisions.keys().next().copied();
        Ok(kept_or_why(
            revision,
            state.revision,
            kept,
            was_model,
            oldest_kept,
        )?)
    }

    /// `Request::Rollback`: revision `to`'s model, with the settings layers in force that name
    /// it, applied as `apply` would apply it (validated, the drain rule, composed, unchanged
    /// when it is the model in force). Sends nothing.
    pub(crate) async fn rollback(
        &self,
        actor: &str,
        id: RequestId,
        to: u64,
        why: String,
        drain: bool,
    ) -> Result<Body, ApiError> {
        let mesh = {
            let state = self.state()?;
            let model = self.kept_model(&state, to)?;
            with_settings_in_force(&state, model).0
        };
        super::upload::check_inline(&mesh).map_err(|e| match e {
            ApiError::Apply(ApplyError::TooLarge { bytes, limit }) => ModelError::TooLarge {
                revision: to,
                bytes,
                limit,
            }
            .into(),
            other => other,
        })?;
        let why = format!("rollback to revision {to}: {why}");
        self.apply_model(actor, id, mesh, why, drain, None).await
    }

    /// `Request::SettingsRollback`: `scope`'s layer made what settings history entry `to` left
    /// it (its `after` side, decision 0303), in one settings write that keeps history (G6);
    /// nothing written when the layer already is that.
    pub(crate) async fn settings_rollback(
        &self,
        actor: &str,
        id: RequestId,
        scope: Scope,
        to: u64,
        why: String,
    ) -> Result<Body, ApiError> {
        let term = self.leading_term()?;
        let state = self.state()?;
        let db = self.replica.database();
        let entry = MeshApp::settings_change(db, to)
            .map_err(|e| storage("settings history", &e))?
            .ok_or(ModelError::NoSuchSettingsEntry {
                scope: scope.clone(),
                to,
                newest: state.next_history_id,
            })?;
        if entry.scope != scope {
            return Err(ModelError::OtherScope {
                scope,
                to,
                entry_scope: entry.scope,
            }
            .into());
        }
        let why = format!("settings rollback to #{to}: {why}");
        let current = state.mesh.settings.layers.get(&scope);
        let Some(command) = settings_rollback_command(current, &entry, why) else {
            return Ok(Body::SettingsUnchanged { scope, to });
        };
        if matches!(command, Command::SetSettings { .. }) {
            state
                .check_scope(&scope)
                .map_err(|e| SettingsError::UnknownScope {
                    scope: scope.clone(),
                    reason: e.to_string(),
                })?;
        }
        drop(state);
        let command = Command::Once {
            request: id,
            command: Box::new(command),
        };
        let applied = self
            .propose(term, None, actor, command)
            .await
            .map_err(|e| settings_refused(&scope, e))?;
        super::ops::settings_answer(scope, applied)
    }
}

/// `revision`'s kept model, or why there is none, never an empty model (decision 0302): past
/// the store's revision (`newest`), a revision that stored no model (`was_model` false: a
/// settings write or a mint), or a model revision whose model is pruned or came before models
/// were kept.
fn kept_or_why(
    revision: u64,
    newest: u64,
    kept: Option<Mesh>,
    was_model: bool,
    oldest_kept: Option<u64>,
) -> Result<Mesh, ModelError> {
    if revision > newest {
        return Err(ModelError::NoSuchRevision { revision, newest });
    }
    match (kept, was_model) {
        (Some(mesh), _) => Ok(mesh),
        (None, false) => Err(ModelError::NotAModelRevision { revision }),
        (None, true) => Err(ModelError::NotKept {
            revision,
            oldest_kept,
            kept_max: model_revisions_kept_max as u64,
            bytes_max: model_revisions_bytes_max,
        }),
    }
}

/// The model in force as the `model` table keeps it: machines and modules, settings apart.
fn stored_model(state: &DomainState) -> Mesh {
    Mesh {
        settings: Default::default(),
        ..state.mesh.clone()
    }
}

/// `model` with every settings layer in force whose scope names it; the scopes of the layers
/// left out (they name a machine or module `model` lacks).
fn with_settings_in_force(state: &DomainState, mut model: Mesh) -> (Mesh, Vec<Scope>) {
    let mut left_out = Vec::new();
    for (scope, layer) in &state.mesh.settings.layers {
        if scope_problem(&model, scope).is_none() {
            model.settings.layers.insert(scope.clone(), layer.clone());
        } else {
            left_out.push(scope.clone());
        }
    }
    (model, left_out)
}

/// The one settings write that makes a layer now `current` what history entry `entry` left it
/// (decision 0303: the entry's `after`, the layer as that write made it): the whole layer set
/// with `replace`, or cleared when the entry cleared it. `None` when the layer already is that.
pub(crate) fn settings_rollback_command(
    current: Option<&Layer>,
    entry: &SettingsChange,
    why: String,
) -> Option<Command> {
    let scope = entry.scope.clone();
    match (&entry.after, current) {
        (None, None) => None,
        (None, Some(_)) => Some(Command::ClearSettings { scope, why }),
        (Some(target), Some(now)) if target == now => None,
        (Some(target), _) => Some(Command::SetSettings {
            scope,
            set: target.clone(),
            remove: Default::default(),
            replace: true,
            why,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layer(kv: &[(&str, &str)]) -> Layer {
        kv.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn entry(before: Option<Layer>, after: Option<Layer>) -> SettingsChange {
        SettingsChange {
            id: 4,
            scope: Scope::Mesh,
            before,
            after,
            why: "w".into(),
            actor: "operator:op".into(),
            epoch: 2,
            time_ms: 1,
        }
    }

    #[test]
    fn a_revision_whose_model_is_not_kept_is_refused_by_name_never_answered_empty() {
        // Issue 25 item 1, decision 0302: a pruned revision (or one from before models were
        // kept) names the limit and the oldest kept; a settings revision says it stored no
        // model; a future one names the newest; only a kept one answers its model.
        let kept = Mesh::default();
        assert_eq!(
            kept_or_why(7, 9, Some(kept.clone()), true, Some(7)),
            Ok(kept)
        );
        let gone = kept_or_why(3, 9, None, true, Some(7)).expect_err("pruned");
        assert_eq!(gone.cause(), "model.not_kept");
        let text = gone.to_string();
        assert!(text.starts_with("revision 3 is no longer kept"), "{text}");
        assert!(text.contains("the newest 50 model revisions"), "{text}");
        assert!(text.contains("the oldest kept is revision 7"), "{text}");
        let settings = kept_or_why(8, 9, None, false, Some(7)).expect_err("settings");
        assert_eq!(settings.cause(), "model.not_a_model_revision");
        let future = kept_or_why(10, 9, None, false, Some(7)).expect_err("future");
        assert_eq!(
            future,
            ModelError::NoSuchRevision {
                revision: 10,
                newest: 9
            }
        );
    }

    #[test]
    fn a_settings_rollback_to_entry_n_makes_the_layer_what_entry_n_left_it() {
        // Issue 25 item 2, decision 0303: `--to N` is the layer as write #N made it (its
        // `after`), set whole with `replace` so keys added since are removed; a cleared layer
        // is cleared again; a layer already so is not written.
        let old = layer(&[("a", "1")]);
        let new = layer(&[("a", "2"), ("b", "3")]);
        let e = entry(Some(new.clone()), Some(old.clone()));
        let Some(Command::SetSettings {
            set,
            remove,
            replace,
            ..
        }) = settings_rollback_command(Some(&new), &e, "w".into())
        else {
            panic!("a set");
        };
        assert_eq!(set, old, "the entry's after side, not its before");
        assert!(replace && remove.is_empty());
        assert_eq!(settings_rollback_command(Some(&old), &e, "w".into()), None);
        let cleared = entry(Some(old.clone()), None);
        assert!(matches!(
            settings_rollback_command(Some(&new), &cleared, "w".into()),
            Some(Command::ClearSettings { .. })
        ));
        assert_eq!(settings_rollback_command(None, &cleared, "w".into()), None);
        // A layer gone since the entry comes back whole.
        assert!(matches!(
            settings_rollback_command(None, &e, "w".into()),
            Some(Command::SetSettings { replace: true, .. })
        ));
    }
}
