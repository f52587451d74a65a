//! `meshctl model show`, `meshctl diff` and `meshctl rollback` (issue 25 items 1 and 2, decision
//! 0302): the stored model read back as `mesh.toml` (current, or a kept revision's), a file
//! compared with the stored model before anything is stored (exit codes as `kubectl diff`), and
//! a kept revision's model stored again as a new revision. None of them sends anything.

use std::path::{Path, PathBuf};

use super::json;
use super::render::{self, Via};
use super::{CliError, Output};
use crate::controller::api::{Body, ModelView, Request};
use crate::core::meshdiff::{ModelDiff, diff_models};
use crate::core::meshwrite::write_mesh;
use crate::core::model::Mesh;

#[derive(Debug, clap::Subcommand)]
pub enum ModelCommand {
    /// Print the stored model as a mesh.toml: the model in force, or with `--revision N` the
    /// model as it was at model revision N (the newest 50 are kept). Settings: the layers in
    /// force now that name the model (settings are not part of a model revision); an apply of
    /// the output stores nothing new.
    Show(ShowArgs),
}

#[derive(Debug, clap::Args)]
pub struct ShowArgs {
    /// A model revision (`meshctl history` lists them); default: the model in force.
    #[arg(long)]
    pub revision: Option<u64>,
    /// Print the answer as JSON (the file's text in `text`).
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, clap::Args)]
pub struct DiffArgs {
    /// The mesh file to compare with the stored model.
    #[arg(short = 'f', long = "file")]
    pub file: PathBuf,
    /// Print the answer as JSON.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, clap::Args)]
pub struct RollbackArgs {
    /// The model revision whose model to store again (`meshctl history` lists them).
    #[arg(long = "to-revision")]
    pub to_revision: u64,
    /// Why; kept with the new revision (as `rollback to revision N: <why>`).
    #[arg(long)]
    pub why: Option<String>,
    /// As for apply: let it drop machines that still run modules (kept with none until pushed).
    #[arg(long)]
    pub drain: bool,
    /// Print the answer as JSON.
    #[arg(long)]
    pub json: bool,
}

/// The digest `apply` names for a model: blake3 over its encoded bytes, as hex.
pub fn model_digest(mesh: &Mesh) -> Result<String, CliError> {
    let bytes = mesh_codec::encode("model", mesh)
        .map_err(|e| CliError::Render(format!("cannot encode the model: {e}")))?;
    Ok(blake3::hash(&bytes).to_hex().to_string())
}

fn show_view(ctx: Option<&Path>, revision: Option<u64>) -> Result<(Via, ModelView), CliError> {
    let (via, body) = render::ask(ctx, &Request::ModelShow { revision })?;
    match body {
        Body::Model(view) => Ok((via, view)),
        other => Err(render::unexpected(via, "model show", &other)),
    }
}

pub fn run(ctx: Option<&Path>, cmd: &ModelCommand) -> Result<Output, CliError> {
    let ModelCommand::Show(args) = cmd;
    let (via, view) = show_view(ctx, args.revision)?;
    let digest = model_digest(&view.mesh)?;
    let text = format!("{}{}", header(&view, &digest), write_mesh(&view.mesh));
    if args.json {
        let answer = json::ModelShowJson::new(&view, digest, text);
        return json::output(Some(via), answer, super::exit_done);
    }
    // The note goes to stderr: stdout stays a file `apply -f` reads.
    let note = via.note();
    if !note.is_empty() {
        eprint!("{note}");
    }
    Ok(Output::done(text))
}

/// The comment lines `model show` starts its file with: which revision, and what the settings
/// in it are (decision 0302).
pub fn header(view: &ModelView, digest: &str) -> String {
    let mut out = String::new();
    let which = match (view.model_revision, view.current) {
        (Some(r), true) => format!("model revision {r}, in force"),
        (Some(r), false) => format!("model revision {r}, not in force"),
        (None, _) => "the model in force (applied before model history was kept)".to_string(),
    };
    out.push_str(&format!(
        "# mesh.toml of {which}; the store is at revision {}\n",
        view.store_revision
    ));
    if let Some(c) = &view.change {
        let why = crate::core::settings::printable(&c.why);
        out.push_str(&format!(
            "# applied {} by {}: {why}\n",
            render::time_ms(c.time_ms),
            c.actor
        ));
    }
    out.push_str(
        "# settings: the layers in force now that name this model. Settings are not part of a model\n\
         # revision (they change with `meshctl settings`, which keeps their history); an apply of\n\
         # this file leaves the store's layers as they are.\n",
    );
    for scope in &view.settings_left_out {
        out.push_str(&format!(
            "# left out: settings [{scope}] names a machine or module this model lacks\n"
        ));
    }
    out.push_str(&format!(
        "# digest (blake3 of the encoded model, as apply names it): {digest}\n\n"
    ));
    out
}

/// `meshctl diff -f FILE`: exit 0 when an apply of the file would store nothing, 1 when it
/// would store a new model, 2 on any error (as `kubectl diff`: above 1 is an error).
pub fn diff(ctx: Option<&Path>, args: &DiffArgs) -> Result<Output, CliError> {
    let file = super::apply::read_mesh(&args.file)?;
    let (via, view) = show_view(ctx, None)?;
    let d = diff_models(&view.mesh, &file);
    let code = if d.is_empty() {
        super::exit_done
    } else {
        super::exit_failed
    };
    if args.json {
        let answer = json::DiffJson::new(&view, &d);
        return json::output(Some(via), answer, code);
    }
    Ok(Output {
        text: render_diff(via, &args.file, &view, &d),
        code,
    })
}

/// The lines `diff` prints: per machine and module, `~ module web` then each item's change.
pub fn render_diff(via: Via, file: &Path, view: &ModelView, d: &ModelDiff) -> String {
    let mut out = String::new();
    let at = match view.model_revision {
        Some(r) => format!("model revision {r}"),
        None => "the stored model".to_string(),
    };
    if d.is_empty() {
        out.push_str(&format!(
            "no differences: {} has the model of {at}; an apply would store nothing\n",
            file.display()
        ));
    } else {
        out.push_str(&format!(
            "{} against {at} (- stored, + file):\n",
            file.display()
        ));
        let mut subject = "";
        for line in &d.lines {
            if line.subject != subject {
                subject = &line.subject;
                out.push_str(&format!("~ {subject}\n"));
            }
            let show = |v: &Option<String>| {
                v.as_deref()
                    .map(crate::core::settings::printable)
                    .unwrap_or_else(|| "(none)".into())
            };
            out.push_str(&format!(
                "    {}: {} => {}\n",
                line.item,
                show(&line.was),
                show(&line.now)
            ));
        }
    }
    for scope in &d.settings_differ {
        out.push_str(&format!(
            "settings [{scope}] in the file differ from the store; an apply leaves them (`meshctl settings set {scope} ...` changes them)\n"
        ));
    }
    out.push_str(&via.note());
    out
}

/// `meshctl rollback --to-revision N --why W`.
pub fn rollback(ctx: Option<&Path>, args: &RollbackArgs) -> Result<Output, CliError> {
    let why = super::require_why("rollback", args.why.as_deref())?;
    let request = Request::Rollback {
        to_revision: args.to_revision,
        why,
        drain: args.drain,
    };
    let (via, body) = render::ask(ctx, &request)?;
    super::apply::render_answer(via, &body, args.json, "rollback")
}
