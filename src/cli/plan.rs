//! `meshctl plan <machine> --diff`: what a push of the machine would send (diffed against its last
//! send, G7), the machines it would cascade to, the provisions it would mint and every hold.

use std::path::Path;

use super::render::{self, Via};
use super::{CliError, Output};
use crate::controller::api::{Body, PlanView, Request};

#[derive(Debug, clap::Args)]
pub struct PlanArgs {
    /// The machine a push would name.
    pub machine: String,
    /// Show the diff lines (the default output; kept for the documented spelling).
    #[arg(long)]
    pub diff: bool,
    /// Print the answer as JSON.
    #[arg(long)]
    pub json: bool,
}

pub fn run(ctx: Option<&Path>, args: &PlanArgs) -> Result<Output, CliError> {
    let request = Request::Plan {
        machine: args.machine.clone(),
    };
    let (via, body) = render::ask(ctx, &request)?;
    let Body::Plan(view) = body else {
        return Err(render::unexpected(via, "plan", &body));
    };
    if args.json {
        return render::json(via, &view, super::exit_done);
    }
    Ok(Output::done(render_text(via, &view)))
}

/// The lines `plan` prints.
pub fn render_text(via: Via, v: &PlanView) -> String {
    let mut out = String::new();
    if v.diff.is_empty() {
        out.push_str(&format!("{}: no change from the last send\n", v.machine));
    } else {
        out.push_str(&format!(
            "{}: {} change(s) from the last send\n",
            v.machine,
            v.diff.len()
        ));
        for line in &v.diff {
            out.push_str(&format!("  {line}\n"));
        }
    }
    for (machine, reason) in &v.sends {
        out.push_str(&format!("would send {machine} ({reason})\n"));
    }
    if !v.mints.is_empty() {
        out.push_str(&format!("would mint {}\n", render::list(&v.mints)));
    }
    for (machine, h) in &v.holds {
        out.push_str(&format!(
            "would hold {machine}: module {} mount {} would move from {} to {}; push with `--move {}` to accept\n",
            h.module, h.mount, h.old_dir, h.new_dir, h.module
        ));
    }
    out.push_str(&via.note());
    out
}
