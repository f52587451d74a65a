//! `meshctl plan`: what a push would do (G7), like `terraform plan`: every machine it would send —
//! named and cascaded — with its own diff against its last send, the provisions it would mint, the
//! grants it would revoke and every hold. `--behind` and `--all` plan the whole fleet; `--out FILE`
//! keeps the reviewed plan for `meshctl push --plan FILE`.

use std::path::{Path, PathBuf};

use super::json;
use super::render::{self, Via};
use super::{CliError, Output, exit_done};
use crate::controller::api::{Body, PlanView, PlannedChange, PushTarget, Request, drift_item};

/// Exit code of `plan --detailed-exitcode` when the push would change something. Terraform's 2
/// is meshctl's "bad input", so a script could not tell the two apart (decision 0092).
pub const exit_changes: u8 = 6;

/// Largest plan file `push --plan` reads.
pub const plan_file_bytes_max: u64 = 64 * 1024 * 1024;

#[derive(Debug, clap::Args)]
pub struct PlanArgs {
    /// The machine a push would name (its cascade is planned with it).
    pub machine: Option<String>,
    /// Plan a `push --behind`: every machine a push would still change.
    #[arg(long, conflicts_with_all = ["machine", "all"])]
    pub behind: bool,
    /// Plan a `push --all`.
    #[arg(long, conflicts_with_all = ["machine", "behind"])]
    pub all: bool,
    /// Plan as if this module's held mount move were released (repeat for several).
    #[arg(long = "move", value_name = "MODULE")]
    pub moves: Vec<String>,
    /// Show the diff lines (the default output; kept for the documented spelling).
    #[arg(long)]
    pub diff: bool,
    /// Exit 0 when the push would change nothing, 6 when it would change something.
    #[arg(long)]
    pub detailed_exitcode: bool,
    /// Write the plan to FILE; `meshctl push --plan FILE --why ...` sends exactly this plan, or
    /// is refused if the store moved since.
    #[arg(long, value_name = "FILE")]
    pub out: Option<PathBuf>,
    #[command(flatten)]
    pub waves: super::waves::WaveArgs,
    /// Print the answer as JSON.
    #[arg(long)]
    pub json: bool,
}

/// What the arguments aim at, or why they are refused before anything is asked.
pub fn target(
    machine: Option<&String>,
    behind: bool,
    all: bool,
    command: &str,
) -> Result<PushTarget, CliError> {
    match (machine, behind, all) {
        (Some(m), false, false) => Ok(PushTarget::Machine(m.clone())),
        (None, true, false) => Ok(PushTarget::Behind),
        (None, false, true) => Ok(PushTarget::All),
        (None, false, false) => Err(CliError::Usage(format!(
            "{command} needs a machine, --behind or --all; `meshctl status` lists the machines and which are behind"
        ))),
        _ => Err(CliError::Usage(format!(
            "{command} takes one of a machine, --behind or --all, not several"
        ))),
    }
}

pub fn run(ctx: Option<&Path>, args: &PlanArgs) -> Result<Output, CliError> {
    let target = target(args.machine.as_ref(), args.behind, args.all, "plan")?;
    if args.waves.any() {
        if args.out.is_some() || !args.moves.is_empty() || args.detailed_exitcode {
            return Err(CliError::Usage(
                "plan --wave shows which machines go in which wave; --out, --move and --detailed-exitcode plan one push: run them without --wave".into(),
            ));
        }
        return super::waves::run_plan(ctx, &target, &args.waves, args.json);
    }
    let request = Request::Plan {
        target,
        moves: args.moves.clone(),
    };
    let (via, body) = render::ask(ctx, &request)?;
    let Body::Plan(view) = body else {
        return Err(render::unexpected(via, "plan", &body));
    };
    if let Some(path) = &args.out {
        write_plan(path, &view)?;
    }
    let code = match args.detailed_exitcode && view.changes_anything() {
        true => exit_changes,
        false => exit_done,
    };
    if args.json {
        return json::output(Some(via), json::PlanJson::from(&view), code);
    }
    let mut text = render_text(via, &view);
    if let Some(path) = &args.out {
        text.push_str(&format!(
            "plan written to {}; `meshctl push --plan {} --why \"...\"` sends exactly this\n",
            path.display(),
            path.display()
        ));
    }
    Ok(Output { text, code })
}

fn write_plan(path: &Path, view: &PlanView) -> Result<(), CliError> {
    let text = serde_json::to_string_pretty(view)
        .map_err(|e| CliError::Render(format!("the plan as JSON: {e}")))?;
    // It reveals settings and env values: 0600, written whole (decision 0296).
    super::snapshot::warn_if_loose(super::snapshot::parent_of(path))?;
    crate::durable::write_atomic(
        path,
        (text + "\n").as_bytes(),
        crate::durable::secret_file_mode,
    )
    .map_err(|e| CliError::Write {
        path: e.path.display().to_string(),
        source: e.source,
    })
}

/// Reads a plan `plan --out` wrote.
pub fn read_plan(path: &Path) -> Result<PlanView, CliError> {
    let name = path.display().to_string();
    let read = |source| CliError::Read {
        path: name.clone(),
        source,
    };
    let size = std::fs::metadata(path).map_err(read)?.len();
    if size > plan_file_bytes_max {
        return Err(CliError::Usage(format!(
            "{name} is {size} bytes, over the {plan_file_bytes_max}-byte limit of a plan file; is it a plan `meshctl plan --out` wrote?"
        )));
    }
    let text = std::fs::read_to_string(path).map_err(read)?;
    serde_json::from_str(&text).map_err(|e| {
        CliError::Usage(format!(
            "{name} is not a plan `meshctl plan --out` wrote ({e}); write it again with `meshctl plan ... --out {name}`"
        ))
    })
}

/// The lines `plan` prints.
pub fn render_text(via: Via, v: &PlanView) -> String {
    let mut out = String::new();
    if v.machines.is_empty() {
        out.push_str("nothing to send: every machine planned is up to date with its last send\n");
    }
    for m in &v.machines {
        let verb = if m.holds.is_empty() { "send" } else { "hold" };
        let drift = m.changes.iter().filter(|c| c.item == drift_item).count();
        let n = m.changes.len() - drift;
        let plural = if n == 1 { "" } else { "s" };
        // Drift is no change of the declaration: it is counted apart (decision 0305).
        let restores = match drift {
            0 => String::new(),
            1 => ", and restores 1 difference on the host".to_string(),
            d => format!(", and restores {d} differences on the host"),
        };
        out.push_str(&format!(
            "would {verb} {} ({}): {n} change{plural} from the last send{restores}\n",
            m.machine, m.reason
        ));
        for c in &m.changes {
            out.push_str(&format!("  {}\n", change_line(c)));
        }
        for h in &m.holds {
            out.push_str(&format!(
                "  held: module {} mount {} would move from {} to {}; push with `--move {}` to accept\n",
                h.module, h.mount, h.old_dir, h.new_dir, h.module
            ));
        }
    }
    for p in &v.mints {
        out.push_str(&format!(
            "would mint {} {} for {} from {}\n",
            p.id, p.kind, p.consumer, p.provider
        ));
    }
    for (machine, c) in revocations(v) {
        out.push_str(&format!(
            "would revoke {} on {machine}: {}\n",
            c.item.trim_start_matches("grant "),
            c.was.as_deref().unwrap_or("")
        ));
    }
    out.push_str(&format!(
        "plan {} at model revision {}\n",
        v.token, v.revision
    ));
    out.push_str(&via.note());
    out
}

/// Grants the push would take away, by machine.
fn revocations(v: &PlanView) -> Vec<(&str, &PlannedChange)> {
    let mut out = Vec::new();
    for m in &v.machines {
        for c in &m.changes {
            if c.item.starts_with("grant ") && c.now.is_none() {
                out.push((m.machine.as_str(), c));
            }
        }
    }
    out
}

/// `+ db: setting x: "1"`, `- db: grant p-…`, `~ db: setting x: "1" => "2"`, `+ module db: perl`.
pub fn change_line(c: &PlannedChange) -> String {
    let (m, i) = (&c.module, &c.item);
    let value = |v: &Option<String>| match v {
        Some(v) if !v.is_empty() => format!(": {v}"),
        _ => String::new(),
    };
    match (&c.was, &c.now) {
        (None, now) if i == "module" => format!("+ module {m}{}", value(now)),
        (was, None) if i == "module" => format!("- module {m}{}", value(was)),
        (Some(was), Some(now)) => format!("~ {m}: {i}: {was} => {now}"),
        (None, now) => format!("+ {m}: {i}{}", value(now)),
        (was, None) => format!("- {m}: {i}{}", value(was)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn a_saved_plan_is_0600_and_replaced_whole() {
        // Issue 27 part 7: a plan reveals settings and env values.
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("plan.json");
        std::fs::write(&path, "old").expect("an older plan");
        let view = PlanView {
            target: PushTarget::All,
            moves: Vec::new(),
            revision: 4,
            machines: Vec::new(),
            mints: Vec::new(),
            token: "t".into(),
        };
        write_plan(&path, &view).expect("written");
        let mode = std::fs::metadata(&path).expect("stat").permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        assert_eq!(read_plan(&path).expect("read back").revision, 4);
    }
}
