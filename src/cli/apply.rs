//! `meshctl apply -f mesh.toml --why W`: parse the file locally (a bad file is refused with line and
//! column, and nothing is sent), then store it as a new model revision. Sends nothing to hosts.
//!
//! A model that encodes to more than `apply_inline_bytes_max` goes as an upload (decision 0185):
//! numbered chunks of `upload_chunk_bytes` (64 KiB), each its own request answered once staged,
//! then one `ApplyUpload` naming the upload and the blake3 digest of its bytes, which the leader
//! checks and makes current in one commit. Until then the current model is unchanged; an upload
//! that stops half way is left to expire.

use std::path::{Path, PathBuf};

use super::json;
use super::render::{self, Via};
use super::{CliError, Output};
use crate::controller::api::{
    Body, Chunk, Request, UploadId, apply_inline_bytes_max, upload_chunk_bytes,
};
use crate::core::meshfile::parse_mesh;
use crate::core::model::Mesh;

#[derive(Debug, clap::Args)]
pub struct ApplyArgs {
    /// The mesh file to store.
    #[arg(short = 'f', long = "file")]
    pub file: PathBuf,
    /// Why the model changes; kept with the revision.
    #[arg(long)]
    pub why: Option<String>,
    /// Let the file drop machines that still run modules: they stay in the model with no modules
    /// until a push stops them; apply again afterwards to remove them.
    #[arg(long)]
    pub drain: bool,
    /// Print the answer as JSON.
    #[arg(long)]
    pub json: bool,
}

pub fn run(ctx: Option<&Path>, args: &ApplyArgs) -> Result<Output, CliError> {
    let why = super::require_why("apply", args.why.as_deref())?;
    let mesh = read_mesh(&args.file)?;
    let (via, body) = match requests_for(mesh, why, args.drain)? {
        Sending::Inline(request) => render::ask(ctx, &request)?,
        Sending::Upload {
            upload,
            chunks,
            apply,
        } => {
            let total = chunks.len();
            for (i, chunk) in chunks.iter().enumerate() {
                render::ask(ctx, chunk).map_err(|e| stopped(&upload, i, total, e))?;
            }
            render::ask(ctx, &apply).map_err(|e| stopped(&upload, total, total, e))?
        }
    };
    render_answer(via, &body, args.json, "apply")
}

/// What `apply` and `rollback` print for the store's answer: a new revision, or none stored
/// because the store already has this model (issue 25 item 1).
pub fn render_answer(
    via: Via,
    body: &Body,
    as_json: bool,
    asked: &'static str,
) -> Result<Output, CliError> {
    if let Body::ApplyUnchanged {
        revision,
        settings_ignored,
    } = body
    {
        if as_json {
            let answer = json::ApplyJson {
                revision: *revision,
                unchanged: true,
                behind: Vec::new(),
                settings_ignored: settings_ignored.clone(),
                draining: Vec::new(),
            };
            return json::output(Some(via), answer, super::exit_done);
        }
        let mut out = format!(
            "unchanged: model revision {revision} already has this model; nothing was stored\n"
        );
        for scope in settings_ignored {
            out.push_str(&ignored_line(scope));
        }
        out.push_str(&via.note());
        return Ok(Output::done(out));
    }
    let Body::Applied {
        revision,
        changes,
        settings_ignored,
        draining,
    } = body
    else {
        return Err(render::unexpected(via, asked, body));
    };
    if as_json {
        let answer = json::ApplyJson {
            revision: *revision,
            unchanged: false,
            behind: changes.clone(),
            settings_ignored: settings_ignored.clone(),
            draining: draining.clone(),
        };
        return json::output(Some(via), answer, super::exit_done);
    }
    let lists = Lists {
        changes,
        ignored: settings_ignored,
        draining,
    };
    Ok(Output::done(render_text(via, *revision, &lists)))
}

fn ignored_line(scope: &str) -> String {
    format!(
        "settings [{scope}] in the file differ from the store and were NOT applied; settings change only with `meshctl settings set {scope} ...`\n"
    )
}

/// How `apply` sends a model: in one request, or as an upload.
pub enum Sending {
    Inline(Request),
    /// The chunk requests in order, then the request that applies the upload.
    Upload {
        upload: UploadId,
        chunks: Vec<Request>,
        apply: Request,
    },
}

/// The requests that store `mesh`: one `Apply` when its encoding is within
/// `apply_inline_bytes_max`, else an upload of chunks of `upload_chunk_bytes` under a
/// fresh random id and the `ApplyUpload` naming it with the blake3 digest of the encoded model.
pub fn requests_for(mesh: Mesh, why: String, drain: bool) -> Result<Sending, CliError> {
    let bytes = mesh_codec::encode("model", &mesh)
        .map_err(|e| CliError::Render(format!("cannot encode the model: {e}")))?;
    if bytes.len() <= apply_inline_bytes_max {
        return Ok(Sending::Inline(Request::Apply { mesh, why, drain }));
    }
    drop(mesh);
    let mut id = [0u8; 16];
    getrandom::getrandom(&mut id).map_err(|e| {
        CliError::Usage(format!(
            "the OS random source failed while picking an upload id: {e}"
        ))
    })?;
    let upload = UploadId(id);
    let digest = *blake3::hash(&bytes).as_bytes();
    let pieces: Vec<&[u8]> = bytes.chunks(upload_chunk_bytes).collect();
    let chunks_total = u32::try_from(pieces.len()).map_err(|_| {
        CliError::Usage(format!(
            "the model's {} bytes are too many chunks",
            bytes.len()
        ))
    })?;
    let bytes_total = bytes.len() as u64;
    let chunks = pieces
        .iter()
        .enumerate()
        .map(|(index, piece)| Request::ApplyChunk {
            upload,
            index: index as u32,
            chunks_total,
            bytes_total,
            bytes: Chunk::new(piece.to_vec()),
        })
        .collect();
    let apply = Request::ApplyUpload {
        upload,
        digest,
        why,
        drain,
    };
    Ok(Sending::Upload {
        upload,
        chunks,
        apply,
    })
}

/// An upload that stopped at request `at` (a chunk, or the apply when `at` is `total`): the
/// model is unchanged, and running apply again starts a new upload (which drops this one).
fn stopped(upload: &UploadId, at: usize, total: usize, e: CliError) -> CliError {
    let step = if at < total {
        format!("at chunk {} of {total}", at + 1)
    } else {
        format!("at the apply after all {total} chunks")
    };
    let message = format!(
        "the upload of the model (id {upload}) stopped {step}: {e}\nthe stored model is unchanged; run `meshctl apply` again"
    );
    CliError::UploadStopped {
        message,
        cause: Box::new(e),
    }
}

/// Reads and parses a mesh file; every problem is reported at once with its position.
pub fn read_mesh(path: &Path) -> Result<Mesh, CliError> {
    let name = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|source| CliError::Read {
        path: name.clone(),
        source,
    })?;
    parse_mesh(&name, &text).map_err(CliError::BadFile)
}

/// What `apply` answered besides the revision.
pub struct Lists<'a> {
    pub changes: &'a [String],
    pub ignored: &'a [String],
    pub draining: &'a [String],
}

/// The lines `apply` prints.
pub fn render_text(via: Via, revision: u64, lists: &Lists<'_>) -> String {
    let Lists {
        changes,
        ignored,
        draining,
    } = lists;
    let mut out = format!("stored model revision {revision}\n");
    if changes.is_empty() {
        out.push_str("every machine is up to date with its last send\n");
    } else {
        out.push_str(&format!(
            "behind their last send: {} (nothing sent; `meshctl plan <machine> --diff` shows how, `meshctl push` sends)\n",
            render::list_capped(changes)
        ));
    }
    for scope in *ignored {
        out.push_str(&ignored_line(scope));
    }
    for machine in *draining {
        out.push_str(&format!(
            "draining {machine}: kept with no modules; `meshctl push {machine} --why ...` stops them, then apply the file again to remove it\n"
        ));
    }
    out.push_str(&via.note());
    out
}
