//! `meshctl status`: replicas (leader, epoch, reachable) and per machine the last send, the last
//! report, whether it is behind, and its holds.

use serde::Serialize;
use std::path::Path;

use super::render;
use super::{CliError, JsonArgs, Output};
use crate::controller::api::{Body, MachineView, Request, StatusView};
use crate::store::command::HeldMount;

pub fn run(ctx: Option<&Path>, args: &JsonArgs) -> Result<Output, CliError> {
    let (via, body) = render::ask(ctx, &Request::Status)?;
    let Body::Status(view) = body else {
        return Err(render::unexpected(via, "status", &body));
    };
    if args.json {
        return render::json(via, &StatusJson::from(&view), super::exit_done);
    }
    Ok(Output::done(format!(
        "{}{}",
        render_text(&view),
        via.note()
    )))
}

/// `status --json`: the view with digests as hex, so scripts can compare them with `plan` and files.
#[derive(Debug, Serialize)]
pub struct StatusJson {
    pub revision: u64,
    pub epoch_floor: u64,
    pub store_reset: Option<String>,
    pub leader: Option<u64>,
    pub replicas: Vec<crate::controller::api::ReplicaView>,
    pub machines: Vec<MachineJson>,
}

#[derive(Debug, Serialize)]
pub struct MachineJson {
    pub name: String,
    pub last_send: Option<SendJson>,
    pub last_report: Option<ReportJson>,
    pub behind: bool,
    pub holds: Vec<HeldMount>,
    pub refused_reports: u64,
}

#[derive(Debug, Serialize)]
pub struct SendJson {
    pub epoch: u64,
    pub sequence: u64,
    pub digest: String,
}

#[derive(Debug, Serialize)]
pub struct ReportJson {
    pub epoch: u64,
    pub sequence: u64,
    pub report_sequence: u64,
    pub applied: Option<String>,
}

impl From<&StatusView> for StatusJson {
    fn from(v: &StatusView) -> StatusJson {
        StatusJson {
            revision: v.revision,
            epoch_floor: v.epoch_floor,
            store_reset: v.store_reset.clone(),
            leader: v.replicas.iter().find(|r| r.leader).map(|r| r.id),
            replicas: v.replicas.clone(),
            machines: v.machines.iter().map(machine_json).collect(),
        }
    }
}

fn machine_json(m: &MachineView) -> MachineJson {
    MachineJson {
        name: m.name.clone(),
        last_send: m.last_send.map(|(epoch, sequence, digest)| SendJson {
            epoch,
            sequence,
            digest: digest.to_string(),
        }),
        last_report: m
            .last_report
            .map(|(epoch, sequence, report_sequence, applied)| ReportJson {
                epoch,
                sequence,
                report_sequence,
                applied: applied.map(|d| d.to_string()),
            }),
        behind: m.behind,
        holds: m.holds.clone(),
        refused_reports: m.refused_reports,
    }
}

/// The lines `status` prints.
pub fn render_text(v: &StatusView) -> String {
    let mut out = format!(
        "model revision {}, epoch floor {}\n",
        v.revision, v.epoch_floor
    );
    if let Some(reset) = &v.store_reset {
        out.push_str(&format!("STORE RESET: {reset}\n"));
    }
    out.push_str("replicas:\n");
    for r in &v.replicas {
        let role = if r.leader { "leader" } else { "follower" };
        let reach = if r.reachable {
            "reachable"
        } else {
            "UNREACHABLE"
        };
        out.push_str(&format!(
            "  {}  {:21}  {:8}  epoch {}  {reach}\n",
            r.id, r.addr, role, r.epoch
        ));
    }
    out.push_str("machines:\n");
    let width = v.machines.iter().map(|m| m.name.len()).max().unwrap_or(0);
    for m in &v.machines {
        out.push_str(&machine_line(m, width));
    }
    out
}

fn machine_line(m: &MachineView, width: usize) -> String {
    let sent = match m.last_send {
        Some((e, s, d)) => format!("sent e{e} s{s} {}", d.short()),
        None => "never sent".to_string(),
    };
    let report = match m.last_report {
        Some((e, s, r, Some(d))) => format!("report e{e} s{s} #{r} applied {}", d.short()),
        Some((e, s, r, None)) => format!("report e{e} s{s} #{r} nothing applied"),
        None => "no report".to_string(),
    };
    let state = if m.behind { "BEHIND" } else { "up to date" };
    let mut line = format!("  {:width$}  {sent}  {report}  {state}", m.name);
    if m.refused_reports > 0 {
        line.push_str(&format!("  ({} reports refused)", m.refused_reports));
    }
    line.push('\n');
    for h in &m.holds {
        line.push_str(&format!(
            "  {:width$}  HELD: module {} mount {} would move from {} to {}; run `meshctl push {} --move {} --why ...`\n",
            "", h.module, h.mount, h.old_dir, h.new_dir, m.name, h.module
        ));
    }
    line
}
