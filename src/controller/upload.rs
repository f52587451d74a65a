//! The leader's side of a model too large for one proposal (issue 10 item 2, decision 0185): each
//! `Request::ApplyChunk` becomes one `Command::StageChunk` proposal into the staging record every
//! replica keeps (no lease round: it only changes the replicated state); `Request::ApplyUpload`
//! reads the staged model from this leader's state, checks its digest, runs every check an inline
//! `apply` runs (the model rules, machines that still run modules, the compose check) and proposes
//! one small `Command::ApplyUpload` naming the upload, which the state machine checks again and
//! makes current in one commit. Until that commit the current model is untouched.

use super::api::{
    ApiError, ApplyError, Body, Chunk, RequestId, UploadId, apply_inline_bytes_max,
    upload_chunk_bytes_max,
};
use super::service::{Service, now_ms};
use crate::core::model::Mesh;
use crate::store::command::{Applied, Command};
use crate::store::staging::staged_model;

/// An apply of a staged model: the upload and the digest its request named.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Staged {
    pub upload: UploadId,
    pub digest: [u8; 32],
}

/// What one chunk request asks, as the service routes it.
pub(crate) struct ChunkRequest {
    pub upload: UploadId,
    pub index: u32,
    pub chunks_total: u32,
    pub bytes_total: u64,
    pub bytes: Chunk,
}

/// An inline `Apply` carries the model in one proposal: larger ones come as an upload.
pub(crate) fn check_inline(mesh: &Mesh) -> Result<(), ApiError> {
    let bytes = mesh_codec::encode("model", mesh)
        .map_err(|e| ApplyError::Unencodable {
            reason: e.to_string(),
        })?
        .len();
    if bytes > apply_inline_bytes_max {
        return Err(ApplyError::TooLarge {
            bytes: bytes as u64,
            limit: apply_inline_bytes_max as u64,
        }
        .into());
    }
    Ok(())
}

/// The command an apply proposes (inside `Command::Once`): the model itself, or the upload that
/// holds it with the machines a drain keeps (`draining`, as `mesh` now has them).
pub(crate) fn apply_command(
    staged: Option<Staged>,
    mesh: Mesh,
    draining: &[String],
    why: String,
    changes: Vec<String>,
) -> Command {
    match staged {
        None => Command::ApplyModel { mesh, why, changes },
        Some(Staged { upload, digest }) => Command::ApplyUpload {
            upload,
            digest,
            why,
            changes,
            keep: draining
                .iter()
                .filter_map(|m| mesh.machines.get(m).cloned())
                .collect(),
        },
    }
}

/// A chunk Raft took no proposal of (its batch limit is below the chunk's) names the chunk and
/// the setting to raise; any other error passes as it is.
pub(crate) fn chunk_refused(upload: UploadId, index: u32, e: ApiError) -> ApiError {
    match e {
        ApiError::ProposalTooLarge { .. } => ApplyError::ChunkNotStaged {
            upload,
            index,
            reason: e.to_string(),
            limit: upload_chunk_bytes_max as u64,
        }
        .into(),
        other => other,
    }
}

impl Service {
    /// `Request::ApplyChunk`: one proposal, refused by the state machine (with nothing staged)
    /// past the staging limits.
    pub(crate) async fn apply_chunk(
        &self,
        actor: &str,
        chunk: ChunkRequest,
    ) -> Result<Body, ApiError> {
        let ChunkRequest {
            upload,
            index,
            chunks_total,
            bytes_total,
            bytes,
        } = chunk;
        if bytes.len() > upload_chunk_bytes_max {
            return Err(ApplyError::ChunkTooLarge {
                upload,
                index,
                bytes: bytes.len() as u64,
                limit: upload_chunk_bytes_max as u64,
            }
            .into());
        }
        let term = self.leading_term()?;
        let command = Command::StageChunk {
            upload,
            index,
            chunks_total,
            bytes_total,
            bytes,
        };
        match self.propose(term, None, actor, command).await {
            Ok(Applied::Staged {
                upload,
                received,
                chunks_total,
            }) => Ok(Body::ChunkStaged {
                upload,
                received,
                chunks_total,
            }),
            Ok(other) => Err(ApiError::internal(format!(
                "the store answered a staged chunk with {other:?}"
            ))),
            Err(e) => Err(chunk_refused(upload, index, e)),
        }
    }

    /// `Request::ApplyUpload`: the staged model, digest checked here first (so a mismatch costs
    /// no proposal), then the inline apply's checks and loop with a proposal that names the
    /// upload instead of carrying the model.
    pub(crate) async fn apply_upload(
        &self,
        actor: &str,
        id: RequestId,
        upload: UploadId,
        digest: [u8; 32],
        why: String,
        drain: bool,
    ) -> Result<Body, ApiError> {
        let mesh = {
            let state = self.state()?;
            staged_model(&state, actor, now_ms(), &upload, &digest)
                .map_err(|reason| ApplyError::UploadUnusable { upload, reason })?
        };
        let staged = Staged { upload, digest };
        self.apply_model(actor, id, mesh, why, drain, Some(staged))
            .await
    }
}
