//! `meshctl apply -f mesh.toml --why W`: parse the file locally (a bad file is refused with line and
//! column, and nothing is sent), then store it as a new model revision. Sends nothing.

use std::path::{Path, PathBuf};

use super::json;
use super::render::{self, Via};
use super::{CliError, Output};
use crate::controller::api::{Body, Request};
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
    let request = Request::Apply {
        mesh,
        why,
        drain: args.drain,
    };
    let (via, body) = render::ask(ctx, &request)?;
    let Body::Applied {
        revision,
        changes,
        settings_ignored,
        draining,
    } = &body
    else {
        return Err(render::unexpected(via, "apply", &body));
    };
    if args.json {
        let answer = json::ApplyJson {
            revision: *revision,
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
            render::list(changes)
        ));
    }
    for scope in *ignored {
        out.push_str(&format!(
            "settings [{scope}] in the file differ from the store and were NOT applied; settings change only with `meshctl settings set {scope} ...`\n"
        ));
    }
    for machine in *draining {
        out.push_str(&format!(
            "draining {machine}: kept with no modules; `meshctl push {machine} --why ...` stops them, then apply the file again to remove it\n"
        ));
    }
    out.push_str(&via.note());
    out
}
