//! `meshctl status`: replicas (leader, epoch, reachable) and per machine the last send, the last
//! report (and how long ago the leader filed it), whether it is behind, its holds, and each
//! module's state from that report: a machine whose modules fail never reads "up to date".

use serde::Serialize;
use std::path::Path;

use super::render;
use super::{CliError, JsonArgs, Output};
use crate::controller::api::{Body, MachineView, Request, StatusView};
use crate::core::report::{Exit, Health, ModuleState, ModuleStatus};
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
    /// The last report's modules summed up; `null` before any report.
    pub health: Option<HealthJson>,
    /// When the leader filed the last report (ms since the Unix epoch), and how long before this
    /// answer that was on the answering replica's clock.
    pub report_filed_ms: Option<u64>,
    pub report_age_ms: Option<u64>,
    pub modules: Vec<ModuleJson>,
}

/// `{"kind": "ready" | "settling" | "failing", "modules": [names not ready]}`.
#[derive(Debug, Serialize)]
pub struct HealthJson {
    pub kind: &'static str,
    pub modules: Vec<String>,
}

/// One module from the last report.
#[derive(Debug, Serialize)]
pub struct ModuleJson {
    pub name: String,
    /// `starting`, `waiting`, `ready`, `running`, `failed` or `stopped`.
    pub state: &'static str,
    /// What a waiting module waits for.
    pub waiting_for: Option<String>,
    /// Why a failed module failed.
    pub error: Option<String>,
    pub restarts: u32,
    /// How its last run ended: `{"code": 3}` or `{"signal": 9}`.
    pub last_exit: Option<Exit>,
    pub pid: Option<u32>,
}

impl From<&Health> for HealthJson {
    fn from(h: &Health) -> HealthJson {
        match h {
            Health::Ready => HealthJson {
                kind: "ready",
                modules: Vec::new(),
            },
            Health::Settling { modules } => HealthJson {
                kind: "settling",
                modules: modules.clone(),
            },
            Health::Failing { modules } => HealthJson {
                kind: "failing",
                modules: modules.clone(),
            },
        }
    }
}

impl From<&ModuleStatus> for ModuleJson {
    fn from(m: &ModuleStatus) -> ModuleJson {
        let (waiting_for, error) = match &m.state {
            ModuleState::Waiting { on } => (Some(on.clone()), None),
            ModuleState::Failed { error } => (None, Some(error.clone())),
            _ => (None, None),
        };
        ModuleJson {
            name: m.name.clone(),
            state: m.state.word(),
            waiting_for,
            error,
            restarts: m.restarts,
            last_exit: m.last_exit,
            pid: m.pid,
        }
    }
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
        health: m.health.as_ref().map(HealthJson::from),
        report_filed_ms: m.report_filed_ms,
        report_age_ms: m.report_age_ms,
        modules: m.modules.iter().map(ModuleJson::from).collect(),
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
    let age = match m.report_age_ms {
        Some(ms) => format!(" ({})", age(ms)),
        None => String::new(),
    };
    let state = machine_state(m);
    let mut line = format!("  {:width$}  {sent}  {report}{age}  {state}", m.name);
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
    let module_width = m.modules.iter().map(|x| x.name.len()).max().unwrap_or(0);
    for module in &m.modules {
        line.push_str(&format!(
            "  {:width$}    {:module_width$}  {}
",
            "",
            module.name,
            module_text(module)
        ));
    }
    line
}

/// "up to date" only when the last send is confirmed and every module is ready; otherwise says
/// what is wrong: `BEHIND`, `applied, 1 module failing`, `applied, 2 modules not ready`.
pub fn machine_state(m: &MachineView) -> String {
    let first = if m.behind { "BEHIND" } else { "applied" };
    match &m.health {
        Some(Health::Failing { modules }) => format!("{first}, {} failing", count(modules.len())),
        Some(Health::Settling { modules }) => {
            format!("{first}, {} not ready", count(modules.len()))
        }
        Some(Health::Ready) | None if m.behind => first.to_string(),
        Some(Health::Ready) | None => "up to date".to_string(),
    }
}

fn count(n: usize) -> String {
    match n {
        1 => "1 module".to_string(),
        n => format!("{n} modules"),
    }
}

/// One module's state in words: `ready`, `waiting for endpoint … of provision …`,
/// `FAILED: exited with code 3, 4 restarts, last exit 3`.
pub fn module_text(m: &ModuleStatus) -> String {
    let mut text = match &m.state {
        ModuleState::Waiting { on } => format!("waiting for {on}"),
        ModuleState::Failed { error } => format!("FAILED: {error}"),
        other => other.word().to_string(),
    };
    match m.restarts {
        0 => {}
        1 => text.push_str(", 1 restart"),
        n => text.push_str(&format!(", {n} restarts")),
    }
    if let Some(exit) = m.last_exit {
        text.push_str(&format!(", last {exit}"));
    }
    text
}

/// `0.4s ago`, `12s ago`, `3m ago`, `5h ago`, `2d ago`.
pub fn age(ms: u64) -> String {
    let s = ms / 1000;
    match s {
        0..10 => format!("{}.{}s ago", s, (ms % 1000) / 100),
        10..120 => format!("{s}s ago"),
        120..7200 => format!("{}m ago", s / 60),
        7200..172_800 => format!("{}h ago", s / 3600),
        _ => format!("{}d ago", s / 86_400),
    }
}
