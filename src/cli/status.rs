//! `meshctl status`: each replica as it answered just now (role, its own epoch, its log) or
//! unreachable, and per machine the last send, the last report (and how long ago the leader filed
//! it), whether it is behind, its holds, and each module's state from that report: a machine whose
//! modules fail, whose host the leader has not heard lately (`SILENT`, decision 0301), or whose
//! host runs other than its declaration (`DRIFTED`, decision 0305), never reads "up to date".

use std::path::Path;

use super::json::{self, role_name};
use super::render;
use super::{CliError, Output};
use crate::controller::api::{Body, MachineView, Request, StatusView};
use crate::core::plan::drifted_reason;
use crate::core::report::{Health, ModuleState, ModuleStatus};

#[derive(Debug, Clone, clap::Args)]
pub struct StatusArgs {
    /// Show only these machines (every machine when none is named); the replicas are always
    /// shown.
    #[arg(value_name = "MACHINE")]
    pub machines: Vec<String>,
    /// Print the answer as JSON instead of lines.
    #[arg(long)]
    pub json: bool,
    /// Draw the status again every `--interval-ms` until Ctrl-C (which ends it with exit 0);
    /// the screen is cleared between drawings only on a terminal. A failed ask is shown and
    /// asked again, never fatal.
    #[arg(long)]
    pub watch: bool,
    /// How often `--watch` draws, in ms (500 to 60000).
    #[arg(long, value_name = "MS", default_value_t = watch_interval_ms_default, requires = "watch")]
    pub interval_ms: u64,
}

pub fn run(ctx: Option<&Path>, args: &StatusArgs) -> Result<Output, CliError> {
    if args.watch {
        return watch::run(ctx, args);
    }
    let (via, body) = render::ask(ctx, &Request::Status)?;
    let Body::Status(mut view) = body else {
        return Err(render::unexpected(via, "status", &body));
    };
    keep_only(&mut view, &args.machines)?;
    if args.json {
        return json::output(Some(via), json::StatusJson::from(&view), super::exit_done);
    }
    Ok(Output::done(format!(
        "{}{}",
        render_text(&view),
        via.note()
    )))
}

/// `status --watch` (issue 25 item 5).
mod watch;
pub use watch::{watch_interval_ms_default, watch_interval_ms_max, watch_interval_ms_min};

/// Narrows `view` to the machines `names` (all when empty), in the answer's order; a name the
/// answer does not have is refused, naming it and the machines there are.
pub fn keep_only(view: &mut StatusView, names: &[String]) -> Result<(), CliError> {
    if names.is_empty() {
        return Ok(());
    }
    let unknown: Vec<&String> = names
        .iter()
        .filter(|n| !view.machines.iter().any(|m| &m.name == *n))
        .collect();
    if !unknown.is_empty() {
        let known: Vec<&str> = view.machines.iter().map(|m| m.name.as_str()).collect();
        let them = if known.is_empty() {
            "the mesh has no machines".to_string()
        } else {
            format!("its machines are {}", render::list_capped(&known))
        };
        let which = if unknown.len() == 1 {
            format!("there is no machine {} in the mesh", unknown[0])
        } else {
            format!(
                "there are no machines {} in the mesh",
                render::list(&unknown)
            )
        };
        return Err(CliError::Usage(format!(
            "{which}; {them}; name one of them, or none for every machine"
        )));
    }
    view.machines.retain(|m| names.contains(&m.name));
    Ok(())
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
    let now = (time::OffsetDateTime::now_utc().unix_timestamp_nanos() / 1_000_000) as i64;
    for c in &v.certs_expiring {
        out.push_str(&super::certs::expiry_line(c, now));
        out.push('\n');
    }
    out.push_str("replicas:\n");
    for r in &v.replicas {
        let line = match &r.said {
            Some(said) => {
                let log = said
                    .log_index
                    .map_or("log empty".to_string(), |i| format!("log {i}"));
                format!(
                    "{:9}  epoch {}  {log} (lag {})  answered in {} ms",
                    role_name(said.role),
                    r.epoch,
                    said.lag,
                    said.answered_in_ms
                )
            }
            None => "UNREACHABLE: did not answer just now".to_string(),
        };
        out.push_str(&format!("  {}  {:21}  {line}\n", r.id, r.addr));
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
    let age = match (m.report_age_ms, m.heard_ago_ms) {
        (Some(ms), Some(heard)) => format!(" (filed {}, heard {})", age(ms), age(heard)),
        (Some(ms), None) => format!(
            " (filed {}, not heard since the leader took office)",
            age(ms)
        ),
        (None, _) => String::new(),
    };
    let state = machine_state(m);
    let mut line = format!("  {:width$}  {sent}  {report}{age}  {state}", m.name);
    if m.refused_reports > 0 {
        line.push_str(&format!("  ({} reports refused)", m.refused_reports));
    }
    line.push('\n');
    if let Some(refusal) = &m.unproven_refusal {
        line.push_str(&format!(
            "  {:width$}  UNPROVEN REFUSAL: the host refused the leader's envelope as older, but nothing signed shows it holding a newer one ({refusal}); its mark on disk may be edited or corrupt: check the host's state directory\n",
            ""
        ));
    }
    if let Some(refusal) = &m.report_refusal {
        line.push_str(&format!("  {:width$}  REPORTS REFUSED: {refusal}\n", ""));
    }
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

/// "up to date" only when the last send is confirmed, every module is ready and the leader heard
/// the host within its silence threshold; otherwise says what is wrong: `BEHIND`, `applied, 1
/// module failing`, `applied, 2 modules not ready`, `SILENT for 50s (applied)` (decision 0301),
/// `applied, not heard yet` (a leader that took office less than the threshold ago, or an answer
/// that is not a leader's: nobody can say the host is there).
pub fn machine_state(m: &MachineView) -> String {
    let last = last_known_state(m);
    match (m.silent_for_ms, m.heard_ago_ms) {
        (Some(ms), _) => {
            let last = if last == up_to_date { "applied" } else { &last };
            format!("SILENT for {} ({last})", span(ms))
        }
        (None, None) if last == up_to_date => "applied, not heard yet".to_string(),
        (None, _) => last,
    }
}

/// What a heard, not silent, machine reads when nothing is wrong.
const up_to_date: &str = "up to date";

/// The machine's state from its send and its last report alone.
fn last_known_state(m: &MachineView) -> String {
    // Drift is one of the reasons a machine is behind; it is named on its own (decision 0305).
    let others: Vec<&str> = m
        .behind_why
        .iter()
        .map(String::as_str)
        .filter(|r| !r.starts_with(drifted_reason))
        .collect();
    let behind = match (m.behind, others.is_empty()) {
        (false, _) => None,
        (true, true) if !m.drifted.is_empty() => None,
        (true, true) => Some("BEHIND".to_string()),
        (true, false) => Some(format!("BEHIND ({})", others.join(", "))),
    };
    let drifted = (!m.drifted.is_empty()).then(|| format!("DRIFTED {}", m.drifted.join(", ")));
    let first = match (behind, drifted) {
        (None, None) => "applied".to_string(),
        (Some(b), None) => b,
        (None, Some(d)) => d,
        (Some(b), Some(d)) => format!("{b}, {d}"),
    };
    match &m.health {
        Some(Health::Failing { modules }) => format!("{first}, {} failing", count(modules.len())),
        Some(Health::Settling { modules }) => {
            format!("{first}, {} not ready", count(modules.len()))
        }
        Some(Health::Ready) | None if m.behind || !m.drifted.is_empty() => first,
        Some(Health::Ready) | None => up_to_date.to_string(),
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
    if !m.drift.is_empty() {
        text.push_str(&format!(", DRIFTED: {}", m.drift.join(", ")));
    }
    text
}

/// `0.4s ago`, `12s ago`, `3m ago`, `5h ago`, `2d ago`.
pub fn age(ms: u64) -> String {
    format!("{} ago", span(ms))
}

/// `0.4s`, `12s`, `3m`, `5h`, `2d`.
pub fn span(ms: u64) -> String {
    let s = ms / 1000;
    match s {
        0..10 => format!("{}.{}s", s, (ms % 1000) / 100),
        10..120 => format!("{s}s"),
        120..7200 => format!("{}m", s / 60),
        7200..172_800 => format!("{}h", s / 3600),
        _ => format!("{}d", s / 86_400),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn applied(heard_ago_ms: Option<u64>, silent_for_ms: Option<u64>) -> MachineView {
        MachineView {
            name: "g14".into(),
            health: Some(Health::Ready),
            report_filed_ms: Some(1),
            report_age_ms: Some(50_000),
            heard_ago_ms,
            silent_for_ms,
            ..MachineView::default()
        }
    }

    #[test]
    fn a_silent_host_reads_silent_and_never_up_to_date() {
        // Decision 0301 (issue 25 item 4): g14's mesh-host stopped 50 s ago; its last report
        // said everything applied and ready.
        let silent = machine_state(&applied(Some(50_000), Some(50_000)));
        assert_eq!(silent, "SILENT for 50s (applied)");
        let mut behind = applied(Some(50_000), Some(50_000));
        behind.behind = true;
        behind.behind_why = vec!["declaration changed".into()];
        assert_eq!(
            machine_state(&behind),
            "SILENT for 50s (BEHIND (declaration changed))"
        );
        let line = machine_line(&applied(Some(50_000), Some(50_000)), 3);
        assert!(
            line.contains("SILENT") && !line.contains("up to date"),
            "{line}"
        );
    }

    #[test]
    fn a_drifted_machine_reads_drifted_with_what_differs_and_never_up_to_date() {
        // Issue 25 item 3 (decision 0305): drift alone reads DRIFTED, not BEHIND (drifted...).
        let mut m = applied(Some(800), None);
        m.behind = true;
        m.drifted = vec!["broker: conf/broker.conf changed".into()];
        m.behind_why = vec![format!("{drifted_reason}broker: conf/broker.conf changed")];
        assert_eq!(
            machine_state(&m),
            "DRIFTED broker: conf/broker.conf changed"
        );
        m.behind_why.insert(0, "declaration changed".into());
        assert_eq!(
            machine_state(&m),
            "BEHIND (declaration changed), DRIFTED broker: conf/broker.conf changed"
        );
        // Drifted reads DRIFTED even from an answer that does not count it behind.
        m.behind = false;
        m.behind_why.clear();
        assert_eq!(
            machine_state(&m),
            "DRIFTED broker: conf/broker.conf changed"
        );
        m.behind = true;
        m.silent_for_ms = Some(50_000);
        assert_eq!(
            machine_state(&m),
            "SILENT for 50s (DRIFTED broker: conf/broker.conf changed)"
        );
    }

    #[test]
    fn up_to_date_needs_the_host_heard() {
        // Heard within the threshold: up to date.
        assert_eq!(machine_state(&applied(Some(800), None)), "up to date");
        // Not heard by the answering replica (a new leader, or a follower's answer): not claimed.
        assert_eq!(
            machine_state(&applied(None, None)),
            "applied, not heard yet"
        );
    }

    #[test]
    fn the_leaders_up_to_date_gauge_counts_exactly_the_machines_status_calls_up_to_date() {
        // Issue 25 item 6: `mesh_hosts_up_to_date` on /metrics and the words of `meshctl status`
        // are one rule; an alert and the operator's screen never disagree.
        let mut cases = Vec::new();
        for heard in [None, Some(800)] {
            for silent in [None, Some(50_000)] {
                for (behind, drifted) in
                    [(false, false), (true, false), (false, true), (true, true)]
                {
                    for health in [
                        None,
                        Some(Health::Ready),
                        Some(Health::Settling {
                            modules: vec!["web".into()],
                        }),
                        Some(Health::Failing {
                            modules: vec!["web".into()],
                        }),
                    ] {
                        let mut m = applied(heard, silent);
                        m.behind = behind;
                        if drifted {
                            m.drifted = vec!["broker: conf/broker.conf changed".into()];
                        }
                        m.health = health;
                        cases.push(m);
                    }
                }
            }
        }
        for m in cases {
            let counted = crate::controller::fleet::FleetCounts::of(
                std::slice::from_ref(&m),
                std::time::Duration::ZERO,
            );
            assert_eq!(
                counted.up_to_date == 1,
                machine_state(&m) == up_to_date,
                "{m:?} reads {:?}",
                machine_state(&m)
            );
        }
    }
}
