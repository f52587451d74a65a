//! `meshctl check`: parse a mesh file and compose every machine, as a merge gate; with
//! `--against`, list the machines whose declaration a change alters and how. Works offline:
//! provisions are minted with a placeholder secret, so digests are comparable between two files
//! but are not the digests a controller (with real secrets) would send.

use std::collections::BTreeSet;
use std::path::PathBuf;

use super::CliError;
use crate::core::compose::{MintRequest, World};
use crate::core::declaration::Digest;
use crate::core::meshfile::parse_mesh;
use crate::core::model::{Mesh, Provision};
use crate::core::plan::{DigestCache, PlanInput, PlannedSend, Target, plan};
use crate::core::summary::{Summary, SummaryDiff, diff, summarize};

/// The secret `check` mints with: fixed, so two files compose to comparable digests.
const placeholder_secret: &str = "meshctl-check-placeholder";

#[derive(Debug, clap::Args)]
pub struct CheckArgs {
    /// The mesh file to check.
    #[arg(short = 'f', long = "file")]
    pub file: PathBuf,
    /// An older mesh file: show which machines' declarations change from it to `--file`.
    #[arg(long)]
    pub against: Option<PathBuf>,
    /// Print the answer as JSON.
    #[arg(long)]
    pub json: bool,
}

/// One machine as `check` composed it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MachineCheck {
    pub machine: String,
    pub digest: Digest,
    pub modules: Vec<String>,
    /// Provisions this machine's consumers would have minted.
    pub mints: Vec<Provision>,
    /// Ids of provisions granted from this machine's providers.
    pub grants: Vec<String>,
    pub summary: Summary,
}

/// What `check` found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CheckOutcome {
    Composed(Vec<MachineCheck>),
    /// Per machine whose declaration changes: its diff (a removed machine has no new summary).
    Against {
        changed: Vec<MachineChange>,
        unchanged: usize,
    },
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MachineChange {
    Changed(SummaryDiff),
    Removed(String),
}

pub fn run(args: &CheckArgs) -> Result<String, CliError> {
    let outcome = check(args)?;
    if args.json {
        return super::json::document(None, super::json::CheckJson::from(&outcome));
    }
    Ok(render(&outcome))
}

/// Parses, composes and (with `--against`) compares; no rendering.
pub fn check(args: &CheckArgs) -> Result<CheckOutcome, CliError> {
    let new = compose_file(&args.file)?;
    let Some(against) = &args.against else {
        return Ok(CheckOutcome::Composed(new));
    };
    let old = compose_file(against)?;
    let mut changed = Vec::new();
    let mut unchanged = 0;
    for n in &new {
        let before = old.iter().find(|o| o.machine == n.machine);
        if before.is_some_and(|o| o.digest == n.digest) {
            unchanged += 1;
            continue;
        }
        changed.push(MachineChange::Changed(diff(
            before.map(|o| &o.summary),
            &n.summary,
        )));
    }
    for o in &old {
        if !new.iter().any(|n| n.machine == o.machine) {
            changed.push(MachineChange::Removed(o.machine.clone()));
        }
    }
    Ok(CheckOutcome::Against { changed, unchanged })
}

fn read_mesh(path: &PathBuf) -> Result<Mesh, CliError> {
    let name = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|source| CliError::Read {
        path: name.clone(),
        source,
    })?;
    parse_mesh(&name, &text).map_err(CliError::BadFile)
}

/// Composes every machine of the file as `push --all` would on an empty store.
fn compose_file(path: &PathBuf) -> Result<Vec<MachineCheck>, CliError> {
    let mesh = read_mesh(path)?;
    let plan_error = |source| CliError::Plan {
        file: path.display().to_string(),
        source,
    };
    let world = World::new(mesh, []);
    let cache = DigestCache::build(&world).map_err(|e| plan_error(e.into()))?;
    let mut secret = |_: &MintRequest| placeholder_secret.to_string();
    let planned = plan(PlanInput {
        world: &world,
        cache: &cache,
        known: &Default::default(),
        target: &Target::All,
        moves: &BTreeSet::new(),
        secret: &mut secret,
    })
    .map_err(plan_error)?;
    let mut out: Vec<MachineCheck> = planned
        .sends
        .iter()
        .map(|send| machine_check(send, &planned.mints))
        .collect();
    out.sort_by(|a, b| a.machine.cmp(&b.machine));
    Ok(out)
}

fn machine_check(send: &PlannedSend, mints: &[Provision]) -> MachineCheck {
    let modules = &send.declaration.modules;
    MachineCheck {
        machine: send.machine.clone(),
        digest: send.digest,
        modules: modules.iter().map(|m| m.name.clone()).collect(),
        mints: mints
            .iter()
            .filter(|p| p.consumer.machine == send.machine)
            .cloned()
            .collect(),
        grants: modules
            .iter()
            .flat_map(|m| m.grants.iter().map(|g| g.id.clone()))
            .collect(),
        summary: summarize(&send.declaration),
    }
}

/// The lines `check` prints.
pub fn render(outcome: &CheckOutcome) -> String {
    let mut out = String::new();
    match outcome {
        CheckOutcome::Composed(machines) => {
            let width = machines.iter().map(|m| m.machine.len()).max().unwrap_or(0);
            for m in machines {
                out.push_str(&machine_line(m, width));
                out.push('\n');
            }
        }
        CheckOutcome::Against { changed, unchanged } => {
            if changed.is_empty() {
                out.push_str("no machine's declaration changes\n");
            }
            for c in changed {
                render_change(c, &mut out);
            }
            out.push_str(&format!(
                "{} changed, {unchanged} unchanged\n",
                changed.len()
            ));
        }
    }
    out
}

fn machine_line(m: &MachineCheck, width: usize) -> String {
    let list = |items: Vec<String>| {
        if items.is_empty() {
            "-".to_string()
        } else {
            items.join(", ")
        }
    };
    let mints = m
        .mints
        .iter()
        .map(|p| format!("{} {} {}<-{}", p.id, p.kind, p.consumer, p.provider))
        .collect();
    format!(
        "{:width$}  {}  modules: {}  mints: {}  grants: {}",
        m.machine,
        m.digest.short(),
        list(m.modules.clone()),
        list(mints),
        list(m.grants.clone()),
    )
}

fn render_change(change: &MachineChange, out: &mut String) {
    match change {
        MachineChange::Removed(machine) => {
            out.push_str(&format!("{machine}: removed\n"));
        }
        MachineChange::Changed(d) => {
            let n = d.changes.len();
            let plural = if n == 1 { "" } else { "s" };
            out.push_str(&format!("{}: {n} change{plural}\n", d.machine));
            for c in &d.changes {
                out.push_str(&format!("  {c}\n"));
            }
        }
    }
}
