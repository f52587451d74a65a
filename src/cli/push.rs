//! `meshctl push`: send declarations to one machine (and what it cascades to, G1), to every machine
//! that is `--behind`, or to `--all`. One line per machine, printed the moment the replica streams
//! it (decision 0190; a progress line on stderr when it is a terminal), then a summary; exit 1 if
//! any send was not confirmed applied (failed, refused, or sent without an answer), else 3 if
//! anything was held. A bare push and a push without `--why` are refused here (G7). With `--wait`,
//! meshctl then polls `status` until every machine sent reports its modules for that send ready,
//! or any failing (exit 4), or the timeout passes (exit 5); it judges nothing itself: the replica
//! sums up each report's health.

use std::collections::BTreeSet;
use std::io::{IsTerminal, Write};
use std::path::Path;
use std::time::{Duration, Instant};

use super::json;
use super::render::{self, Via};
use super::status::module_text;
use super::{
    CliError, Output, exit_done, exit_failed, exit_held, exit_module_failed, exit_wait_timeout,
};
use crate::controller::api::{
    Body, MachineView, PushEvent, PushLine, PushOutcome, PushTarget, PushView, Request, StatusView,
};
use crate::core::report::{Settled, settled};

/// `--wait` without a value waits this long.
pub const wait_ms_default: u64 = 60_000;
/// The longest `--wait=TIMEOUT` accepted.
pub const wait_ms_max: u64 = 3_600_000;
/// Pause between two `status` polls while waiting.
pub const wait_poll_ms: u64 = 250;
/// A push to at least this many machines shows a progress line on a terminal (stderr).
pub const progress_machines_min: usize = 5;

const push_help: &str = "Exit codes: 0 every machine sent applied it (and with --wait, reported \
its modules ready); 1 a send was not confirmed applied: failed (no [hosts] address, the push \
stopped), refused by the host, or sent without a readable answer (host down, timeout); 2 bad \
usage or input, nothing sent; 3 a machine was held (a mount move waits for --move); 4 with \
--wait, a module failed on a machine sent to; 5 with --wait, a machine did not report its modules \
ready before the timeout. When several apply, the first of 1, 4, 5, 3 wins. With --wave or \
--canary, the same codes over every wave sent; the push stops at the first wave that would exit \
1, 4 or 5.";

#[derive(Debug, clap::Args)]
#[command(after_help = push_help)]
pub struct PushArgs {
    /// The machine to push (its cascade follows it).
    pub machine: Option<String>,
    /// Push every machine that is behind.
    #[arg(long, conflicts_with_all = ["machine", "all"])]
    pub behind: bool,
    /// Push every machine.
    #[arg(long, conflicts_with_all = ["machine", "behind"])]
    pub all: bool,
    /// Why; kept with every send record.
    #[arg(long)]
    pub why: Option<String>,
    /// Release a held mount move of this module (repeat for several).
    #[arg(long = "move", value_name = "MODULE")]
    pub moves: Vec<String>,
    /// Send exactly the plan `meshctl plan ... --out FILE` wrote (its machine, `--behind`/`--all`
    /// and `--move`); refused, naming what moved, if the store changed since.
    #[arg(long, value_name = "FILE", conflicts_with_all = ["machine", "behind", "all", "moves"])]
    pub plan: Option<std::path::PathBuf>,
    /// After the push, wait until every machine sent reports its modules ready (or any failed),
    /// printing one line per machine as it settles. TIMEOUT: `90s`, `500ms`, `2m` or seconds;
    /// 60s when left out.
    #[arg(long, value_name = "TIMEOUT", num_args = 0..=1, require_equals = true,
        default_missing_value = "60s", value_parser = parse_wait)]
    pub wait: Option<Duration>,
    #[command(flatten)]
    pub waves: super::waves::WaveArgs,
    /// Print the answer as JSON.
    #[arg(long)]
    pub json: bool,
}

/// `90s`, `500ms`, `2m`, or a bare number of seconds; at most [`wait_ms_max`] (`--wait` and
/// meshctl's `--timeout`).
pub fn parse_wait(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let (number, unit_ms) = if let Some(n) = text.strip_suffix("ms") {
        (n, 1)
    } else if let Some(n) = text.strip_suffix('s') {
        (n, 1000)
    } else if let Some(n) = text.strip_suffix('m') {
        (n, 60_000)
    } else {
        (text, 1000)
    };
    let n: u64 = number
        .parse()
        .map_err(|_| format!("`{text}` is not a timeout; write e.g. 90s, 500ms or 2m"))?;
    let ms = n.saturating_mul(unit_ms);
    if ms == 0 || ms > wait_ms_max {
        return Err(format!(
            "`{text}` is out of range: write from 1ms to {}m",
            wait_ms_max / 60_000
        ));
    }
    Ok(Duration::from_millis(ms))
}

/// The request a push's arguments make, or why they are refused before anything is sent.
pub fn request(args: &PushArgs) -> Result<Request, CliError> {
    let why = || super::require_why("push", args.why.as_deref());
    if let Some(path) = &args.plan {
        let saved = super::plan::read_plan(path)?;
        return Ok(Request::Push {
            target: saved.target.clone(),
            why: why()?,
            moves: saved.moves.clone(),
            plan: Some(Box::new(saved)),
        });
    }
    let target = match (&args.machine, args.behind, args.all) {
        (None, false, false) => {
            return Err(CliError::Usage(
                "push needs a machine, --behind or --all: a bare push would send everything unseen; run `meshctl plan <machine> --diff` first".into(),
            ));
        }
        (m, behind, all) => super::plan::target(m.as_ref(), behind, all, "push")?,
    };
    if !args.moves.is_empty() && !matches!(target, PushTarget::Machine(_)) {
        return Err(CliError::Usage(
            "--move releases a hold on one machine; name the machine: `meshctl push <machine> --move <module>`".into(),
        ));
    }
    Ok(Request::Push {
        target,
        why: why()?,
        moves: args.moves.clone(),
        plan: None,
    })
}

pub fn run(ctx: Option<&Path>, args: &PushArgs) -> Result<Output, CliError> {
    let request = request(args)?;
    if args.waves.any() {
        let Request::Push {
            target, why, plan, ..
        } = request
        else {
            return Err(CliError::Render(
                "push made no push request; this is a bug in meshctl, report it".into(),
            ));
        };
        if plan.is_some() {
            return Err(CliError::Usage(
                "push --plan sends one reviewed plan at once; --wave and --canary take --behind or --all".into(),
            ));
        }
        return super::waves::run_push(ctx, &target, why, args.wait, &args.waves, args.json);
    }
    let context = super::context::resolve(ctx)?;
    // Each machine's line is printed the moment the replica sends it (decision 0190).
    let mut live = Live::new(args.json, std::io::stderr().is_terminal());
    let answer = {
        let mut events = |event: PushEvent| live.event(event, &mut std::io::stdout());
        super::client::ask_streamed(&context, &request, &mut events)
    };
    live.clear_progress();
    let (via, body) = render::split(answer?)?;
    let Body::Push(view) = body else {
        return Err(render::unexpected(via, "push", &body));
    };
    let rest = live.rest(via, &view);
    let Some(timeout) = args.wait else {
        let code = exit_code(&view, None);
        if args.json {
            return json::output(Some(via), json::PushJson::new(&view, None), code);
        }
        return Ok(Output { text: rest, code });
    };
    let waited = if args.json {
        wait(ctx, &view, timeout, &mut std::io::sink())
    } else {
        let mut stdout = std::io::stdout().lock();
        // The push's own lines first: the wait may take a while.
        let _ = stdout.write_all(rest.as_bytes());
        let _ = stdout.flush();
        wait(ctx, &view, timeout, &mut stdout)
    };
    let code = exit_code(&view, Some(&waited));
    if args.json {
        let answer = json::PushJson::new(&view, Some(&waited));
        return json::output(Some(via), answer, code);
    }
    Ok(Output {
        text: String::new(),
        code,
    })
}

/// The exit code: 1 if any send was not confirmed applied (failed, refused, or sent without an
/// answer that `--wait` did not confirm either), else 4 if `--wait` saw a module fail, else 5 if
/// it timed out, else 3 if anything was held, else 0.
pub fn exit_code(view: &PushView, waited: Option<&[Waited]>) -> u8 {
    let confirmed_later = |machine: &str| {
        waited.is_some_and(|w| {
            w.iter()
                .any(|x| x.machine == machine && !matches!(x.outcome, WaitOutcome::TimedOut { .. }))
        })
    };
    let failed = view.lines.iter().any(|l| match l.outcome {
        PushOutcome::Failed { .. } | PushOutcome::Refused { .. } => true,
        PushOutcome::Sent { .. } => !confirmed_later(&l.machine),
        PushOutcome::Applied { .. } | PushOutcome::Held { .. } => false,
    });
    // allow(empty-on-error): no wait asked for (`None`) is no module waited on
    let waited = waited.unwrap_or_default();
    let module_failed = waited
        .iter()
        .any(|w| matches!(w.outcome, WaitOutcome::Failing { .. }));
    let timed_out = waited
        .iter()
        .any(|w| matches!(w.outcome, WaitOutcome::TimedOut { .. }));
    let held = view
        .lines
        .iter()
        .any(|l| matches!(l.outcome, PushOutcome::Held { .. }));
    if failed {
        exit_failed
    } else if module_failed {
        exit_module_failed
    } else if timed_out {
        exit_wait_timeout
    } else if held {
        exit_held
    } else {
        exit_done
    }
}

/// How one machine sent by the push settled.
#[derive(Clone, Debug, PartialEq)]
pub struct Waited {
    pub machine: String,
    /// The sequence the push sent it.
    pub sequence: u64,
    pub outcome: WaitOutcome,
    /// Its modules as the last report seen showed them.
    pub view: Option<MachineView>,
}

#[derive(Clone, Debug, PartialEq)]
pub enum WaitOutcome {
    /// Its report for this send shows every module ready.
    Ready,
    /// Its report for this send shows these modules failing.
    Failing { modules: Vec<String> },
    /// No settled report within the timeout; `last` says what was seen last.
    TimedOut { last: String },
}

/// Polls `status` until every machine the push sent (applied, or sent without an answer) has
/// settled or `timeout` passes, writing one line to `out` per machine as it settles.
pub fn wait(
    ctx: Option<&Path>,
    view: &PushView,
    timeout: Duration,
    out: &mut dyn Write,
) -> Vec<Waited> {
    let mut pending: Vec<(String, u64)> = view
        .lines
        .iter()
        .filter_map(|l| match l.outcome {
            PushOutcome::Applied { sequence, .. } | PushOutcome::Sent { sequence, .. } => {
                Some((l.machine.clone(), sequence))
            }
            _ => None,
        })
        .collect();
    let mut done = Vec::new();
    if pending.is_empty() {
        return done;
    }
    let width = pending.iter().map(|(m, _)| m.len()).max().unwrap_or(0);
    let _ = writeln!(
        out,
        "waiting up to {} for {} machine(s) to report their modules",
        seconds(timeout),
        pending.len()
    );
    let _ = out.flush();
    let deadline = Instant::now() + timeout;
    let mut last_seen: Option<StatusView> = None;
    let mut last_error: Option<String>;
    loop {
        match render::ask(ctx, &Request::Status) {
            Ok((_, Body::Status(status))) => {
                last_error = None;
                pending.retain(|(machine, sequence)| {
                    let Some(m) = status.machines.iter().find(|m| m.name == *machine) else {
                        return true;
                    };
                    let Some(outcome) = settle(m, *sequence) else {
                        return true;
                    };
                    let waited = Waited {
                        machine: machine.clone(),
                        sequence: *sequence,
                        outcome,
                        view: Some(m.clone()),
                    };
                    let _ = out.write_all(wait_line(&waited, width).as_bytes());
                    let _ = out.flush();
                    done.push(waited);
                    false
                });
                last_seen = Some(status);
            }
            Ok((via, body)) => {
                last_error = Some(render::unexpected(via, "status", &body).to_string())
            }
            Err(e) => last_error = Some(e.to_string()),
        }
        if pending.is_empty() || Instant::now() >= deadline {
            break;
        }
        std::thread::sleep(Duration::from_millis(wait_poll_ms).min(deadline - Instant::now()));
    }
    for (machine, sequence) in pending {
        let seen = last_seen
            .as_ref()
            .and_then(|s| s.machines.iter().find(|m| m.name == machine))
            .cloned();
        let last = match (&last_error, &seen) {
            (Some(e), _) => format!("status failed: {e}"),
            (None, Some(m)) => not_settled(m, sequence),
            (None, None) => "no status answer".into(),
        };
        let waited = Waited {
            machine,
            sequence,
            outcome: WaitOutcome::TimedOut { last },
            view: seen,
        };
        let _ = out.write_all(wait_line(&waited, width).as_bytes());
        done.push(waited);
    }
    let _ = out.flush();
    done
}

/// The replica's verdict on the machine's last report, for the send of `sequence`.
fn settle(m: &MachineView, sequence: u64) -> Option<WaitOutcome> {
    let reported = m.last_report.map(|(_, s, _, _)| s);
    let health = m.health.as_ref()?;
    match settled(sequence, reported, health) {
        Settled::Pending => None,
        Settled::Ready => Some(WaitOutcome::Ready),
        Settled::Failing(modules) => Some(WaitOutcome::Failing { modules }),
    }
}

/// What a machine that did not settle showed last.
fn not_settled(m: &MachineView, sequence: u64) -> String {
    match m.last_report {
        Some((_, s, _, _)) if s >= sequence => {
            let waiting: Vec<String> = m
                .modules
                .iter()
                .filter(|x| !matches!(x.state, crate::core::report::ModuleState::Ready))
                .map(|x| format!("{} {}", x.name, module_text(x)))
                .collect();
            format!("its modules are not ready: {}", render::list(&waiting))
        }
        Some((_, s, _, _)) => format!("its last report is for #{s}, not yet for #{sequence}"),
        None => "no report from it yet".into(),
    }
}

pub(super) fn seconds(d: Duration) -> String {
    let ms = d.as_millis();
    if ms.is_multiple_of(1000) {
        format!("{}s", ms / 1000)
    } else {
        format!("{ms}ms")
    }
}

/// One line per settled machine: `ace  ready    #3`, `g14  FAILING  #2 crash FAILED: …`.
pub(super) fn wait_line(w: &Waited, width: usize) -> String {
    let m = &w.machine;
    let sequence = w.sequence;
    match &w.outcome {
        WaitOutcome::Ready => format!("{m:width$}  ready    #{sequence}: every module ready\n"),
        WaitOutcome::Failing { modules } => {
            let detail: Vec<String> = w
                .view
                .iter()
                .flat_map(|v| v.modules.iter())
                .filter(|x| modules.contains(&x.name))
                .map(|x| format!("module {} {}", x.name, module_text(x)))
                .collect();
            format!("{m:width$}  FAILING  #{sequence}: {}\n", detail.join("; "))
        }
        WaitOutcome::TimedOut { last } => {
            format!("{m:width$}  TIMEOUT  #{sequence}: not settled in time; {last}\n")
        }
    }
}

/// The lines `push` prints: one per machine, holds with the command that releases them, then
/// the summary line.
pub fn render_text(via: Via, v: &PushView) -> String {
    let mut out = format!("push at epoch {}\n", v.epoch);
    if v.lines.is_empty() {
        out.push_str("nothing to send: every machine named is up to date\n");
    }
    let width = v.lines.iter().map(|l| l.machine.len()).max().unwrap_or(0);
    for line in &v.lines {
        out.push_str(&push_line(line, width));
    }
    out.push_str(&summary_line(v));
    out.push_str(&via.note());
    out
}

/// `pushed 3 machines: 2 applied, 1 held`.
pub fn summary_line(v: &PushView) -> String {
    let mut counts = [0usize; 5];
    for l in &v.lines {
        counts[kind_index(&l.outcome)] += 1;
    }
    let names = [
        "applied",
        "sent, not confirmed",
        "held",
        "refused",
        "failed",
    ];
    let parts: Vec<String> = counts
        .iter()
        .zip(names)
        .filter(|(n, _)| **n > 0)
        .map(|(n, name)| format!("{n} {name}"))
        .collect();
    if parts.is_empty() {
        return "pushed 0 machines\n".into();
    }
    let n = v.lines.len();
    let machines = if n == 1 { "machine" } else { "machines" };
    format!("pushed {n} {machines}: {}\n", parts.join(", "))
}

fn kind_index(o: &PushOutcome) -> usize {
    match o {
        PushOutcome::Applied { .. } => 0,
        PushOutcome::Sent { .. } => 1,
        PushOutcome::Held { .. } => 2,
        PushOutcome::Refused { .. } => 3,
        PushOutcome::Failed { .. } => 4,
    }
}

/// What a streamed push has printed so far: the header and each machine's line as it came (or,
/// with `--json`, one event document per line), and a progress line on a terminal.
pub struct Live {
    json: bool,
    /// Where the progress line goes: stderr when it is a terminal, else nowhere.
    progress: Option<Box<dyn Write + Send>>,
    header: bool,
    width: usize,
    total: usize,
    printed: BTreeSet<String>,
    counts: [usize; 5],
    progress_shown: bool,
}

impl Live {
    /// `terminal`: stderr is one, so a push to many machines shows its progress there.
    pub fn new(json: bool, terminal: bool) -> Live {
        let progress: Option<Box<dyn Write + Send>> = match terminal {
            true => Some(Box::new(std::io::stderr())),
            false => None,
        };
        Live::with_progress(json, progress)
    }

    /// [`Live::new`] with the progress line written to `progress`.
    pub fn with_progress(json: bool, progress: Option<Box<dyn Write + Send>>) -> Live {
        Live {
            json,
            progress,
            header: false,
            width: 0,
            total: 0,
            printed: BTreeSet::new(),
            counts: [0; 5],
            progress_shown: false,
        }
    }

    /// Pads machine names to at least `width` (every target of a waved push).
    pub fn widen(&mut self, width: usize) {
        self.width = self.width.max(width);
    }

    /// Prints one event to `out` (stdout) as it arrives.
    pub fn event(&mut self, event: PushEvent, out: &mut dyn Write) {
        self.clear_progress();
        if self.json
            && let Ok(line) = json::push_event_document(&event)
        {
            let _ = out.write_all(line.as_bytes());
        }
        match event {
            PushEvent::Begin { epoch, machines } => {
                // At least as wide as asked (`widen`): a waved push's lines line up across pushes.
                let widest = machines.iter().map(String::len).max().unwrap_or(0);
                self.width = self.width.max(widest);
                self.total = machines.len();
                if !self.json && !self.header {
                    let _ = writeln!(out, "push at epoch {epoch}");
                }
                self.header = true;
            }
            PushEvent::Line(line) => {
                if !self.printed.insert(line.machine.clone()) {
                    return;
                }
                self.counts[kind_index(&line.outcome)] += 1;
                if !self.json {
                    let _ = out.write_all(push_line(&line, self.width).as_bytes());
                }
            }
        }
        let _ = out.flush();
        self.show_progress();
    }

    fn show_progress(&mut self) {
        if self.total < progress_machines_min {
            return;
        }
        let [applied, sent, held, refused, failed] = self.counts;
        let done = self.printed.len();
        let total = self.total;
        let Some(err) = self.progress.as_mut() else {
            return;
        };
        let _ = write!(
            err,
            "\r[{done}/{total}] {applied} applied, {sent} sent, {held} held, {refused} refused, {failed} failed"
        );
        let _ = err.flush();
        self.progress_shown = true;
    }

    /// Takes the progress line off the terminal (before a line, and at the end).
    pub fn clear_progress(&mut self) {
        if self.progress_shown
            && let Some(err) = self.progress.as_mut()
        {
            let _ = write!(err, "\r\x1b[2K");
            let _ = err.flush();
            self.progress_shown = false;
        }
    }

    /// What is left to print once the answer came: the header if no event came (an older
    /// replica answers once), the lines the stream skipped, the summary line and who answered.
    /// Empty with `--json` (the answer document follows).
    pub fn rest(&self, via: Via, v: &PushView) -> String {
        if self.json {
            return String::new();
        }
        if !self.header && self.printed.is_empty() {
            return render_text(via, v);
        }
        let mut out = String::new();
        if v.lines.is_empty() {
            out.push_str("nothing to send: every machine named is up to date\n");
        }
        out.push_str(&self.missed(v));
        out.push_str(&summary_line(v));
        out.push_str(&via.note());
        out
    }

    /// The lines of `v` the stream skipped, printed from the answer (none twice).
    pub fn missed(&self, v: &PushView) -> String {
        let mut out = String::new();
        let width = self
            .width
            .max(v.lines.iter().map(|l| l.machine.len()).max().unwrap_or(0));
        let missed: Vec<&PushLine> = v
            .lines
            .iter()
            .filter(|l| !self.printed.contains(&l.machine))
            .collect();
        if !missed.is_empty() && !self.printed.is_empty() {
            out.push_str(&format!(
                "({} line(s) not streamed in time, from the answer:)\n",
                missed.len()
            ));
        }
        for line in missed {
            out.push_str(&push_line(line, width));
        }
        out
    }
}

fn push_line(l: &PushLine, width: usize) -> String {
    let m = &l.machine;
    match &l.outcome {
        PushOutcome::Applied {
            reason,
            sequence,
            digest,
        } => format!(
            "{m:width$}  applied  #{sequence} {} ({reason})\n",
            digest.short()
        ),
        PushOutcome::Sent {
            reason,
            sequence,
            digest,
            error,
        } => format!(
            "{m:width$}  sent     #{sequence} {} ({reason}); not confirmed yet: {error}\n",
            digest.short()
        ),
        PushOutcome::Held { reason, holds } => {
            let mut s = String::new();
            if holds.is_empty() {
                // A hold of the whole machine (an unproven epoch floor, decision 0274).
                s.push_str(&format!("{m:width$}  held     {reason}\n"));
            }
            for h in holds {
                s.push_str(&format!(
                    "{m:width$}  held     ({reason}) module {} mount {} would move from {} to {}; run `meshctl push {m} --move {} --why ...` to accept\n",
                    h.module, h.mount, h.old_dir, h.new_dir, h.module
                ));
            }
            s
        }
        PushOutcome::Refused { reason, refusal } => {
            format!("{m:width$}  refused  ({reason}) by the host: {refusal}\n")
        }
        PushOutcome::Failed { reason, error } => {
            format!("{m:width$}  failed   ({reason}): {error}\n")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::declaration::Digest;
    use crate::store::command::HeldMount;

    fn args(machine: Option<&str>, behind: bool, all: bool, why: Option<&str>) -> PushArgs {
        PushArgs {
            machine: machine.map(String::from),
            behind,
            all,
            why: why.map(String::from),
            moves: Vec::new(),
            plan: None,
            wait: None,
            waves: Default::default(),
            json: false,
        }
    }

    #[test]
    fn bare_push_is_refused_before_anything_is_sent() {
        // G7: push with no machine is refused unless --all or --behind.
        let e = request(&args(None, false, false, Some("w"))).expect_err("bare push");
        assert_eq!(e.exit_code(), 2);
        assert!(e.to_string().contains("--behind or --all"), "{e}");
    }

    #[test]
    fn push_without_why_is_refused() {
        // G7: every push needs --why, kept with the send record.
        for why in [None, Some(""), Some("   ")] {
            let e = request(&args(Some("ace"), false, false, why)).expect_err("no why");
            assert_eq!(e.exit_code(), 2);
            assert!(e.to_string().contains("--why"), "{e}");
        }
        let ok = request(&args(None, true, false, Some("catch up"))).expect("behind is fine");
        assert!(matches!(
            ok,
            Request::Push {
                target: PushTarget::Behind,
                ..
            }
        ));
    }

    #[test]
    fn push_exit_code_is_3_when_held_and_1_when_anything_failed() {
        // G8: a held push exits 3 and names the release command; a failure outranks a hold.
        let d = Digest([1; 32]);
        let applied = PushLine {
            machine: "ace".into(),
            outcome: PushOutcome::Applied {
                reason: "named".into(),
                sequence: 1,
                digest: d,
            },
        };
        let held = PushLine {
            machine: "g14".into(),
            outcome: PushOutcome::Held {
                reason: "cascaded from ace".into(),
                holds: vec![HeldMount {
                    module: "broker".into(),
                    mount: "queue".into(),
                    old_dir: "/a".into(),
                    new_dir: "/b".into(),
                }],
            },
        };
        let failed = PushLine {
            machine: "novox".into(),
            outcome: PushOutcome::Failed {
                reason: "named".into(),
                error: "lease lost".into(),
            },
        };
        let view = |lines: Vec<PushLine>| PushView { epoch: 2, lines };
        assert_eq!(exit_code(&view(vec![applied.clone()]), None), 0);
        assert_eq!(
            exit_code(&view(vec![applied.clone(), held.clone()]), None),
            3
        );
        assert_eq!(exit_code(&view(vec![held.clone(), failed]), None), 1);
        let via = Via {
            replica: 1,
            forwarded_by: None,
        };
        let text = render_text(via, &view(vec![applied, held]));
        assert!(text.contains("meshctl push g14 --move broker"), "{text}");
    }

    #[test]
    fn g9_a_machine_held_by_an_unproven_floor_prints_the_reason_and_exits_3() {
        // Decision 0274: a hold with no mount (the whole machine held after a restore without
        // the floor file) still gets its line, with the reason and what to do.
        let held = PushLine {
            machine: "ace".into(),
            outcome: PushOutcome::Held {
                reason: "floor unproven: not heard yet in term 2: ace".into(),
                holds: vec![],
            },
        };
        let view = PushView {
            epoch: 2,
            lines: vec![held],
        };
        assert_eq!(exit_code(&view, None), 3);
        let via = Via {
            replica: 1,
            forwarded_by: None,
        };
        let text = render_text(via, &view);
        assert!(
            text.contains("ace  held     floor unproven: not heard yet in term 2: ace"),
            "{text}"
        );
    }

    #[test]
    fn a_send_not_confirmed_applied_exits_1_unless_wait_sees_its_report() {
        // Issue 9 part 6: `Sent` (host down, no answer, unreadable answer) is not "applied"; a
        // report for that send seen by --wait confirms it. Part 5: a failing module exits 4, a
        // machine that did not settle exits 5.
        let sent = PushLine {
            machine: "ace".into(),
            outcome: PushOutcome::Sent {
                reason: "named".into(),
                sequence: 4,
                digest: Digest([2; 32]),
                error: "no answer".into(),
            },
        };
        let view = PushView {
            epoch: 2,
            lines: vec![sent],
        };
        let waited = |outcome| Waited {
            machine: "ace".into(),
            sequence: 4,
            outcome,
            view: None,
        };
        assert_eq!(exit_code(&view, None), 1);
        assert_eq!(exit_code(&view, Some(&[waited(WaitOutcome::Ready)])), 0);
        let failing = WaitOutcome::Failing {
            modules: vec!["crash".into()],
        };
        assert_eq!(exit_code(&view, Some(&[waited(failing)])), 4);
        let late = WaitOutcome::TimedOut {
            last: "no report".into(),
        };
        assert_eq!(exit_code(&view, Some(&[waited(late)])), 1);
    }

    #[test]
    fn streamed_text_prints_each_line_once_as_it_comes_then_the_skipped_ones_and_the_summary() {
        // Issue 13: each line is printed the moment it arrives; a line the stream skipped is
        // printed from the answer, none twice, then the summary line.
        let d = Digest([3; 32]);
        let line = |m: &str| PushLine {
            machine: m.into(),
            outcome: PushOutcome::Applied {
                reason: "named".into(),
                sequence: 1,
                digest: d,
            },
        };
        let view = PushView {
            epoch: 4,
            lines: vec![line("ace"), line("g14"), line("novox")],
        };
        let via = Via {
            replica: 2,
            forwarded_by: None,
        };
        let mut live = Live::new(false, false);
        let mut out = Vec::new();
        let machines = vec!["ace".into(), "g14".into(), "novox".into()];
        live.event(PushEvent::Begin { epoch: 4, machines }, &mut out);
        live.event(PushEvent::Line(line("g14")), &mut out);
        live.event(PushEvent::Line(line("g14")), &mut out);
        let streamed = String::from_utf8(out).expect("utf-8");
        assert_eq!(
            streamed,
            format!("push at epoch 4\n{}", push_line(&line("g14"), 5))
        );
        let rest = live.rest(via, &view);
        assert!(rest.contains("2 line(s) not streamed in time"), "{rest}");
        assert!(!rest.contains("g14"), "printed twice: {rest}");
        assert!(rest.contains("ace ") && rest.contains("novox"), "{rest}");
        assert!(rest.contains("pushed 3 machines: 3 applied\n"), "{rest}");
        // An older replica sends no events: everything comes from the answer.
        let old = Live::new(false, false).rest(via, &view);
        assert_eq!(old, render_text(via, &view));
    }

    /// A writer tests read back.
    #[derive(Clone, Default)]
    struct Shared(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

    impl Write for Shared {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().expect("lock").extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn a_push_to_many_machines_keeps_a_progress_line_cleared_before_each_line_and_at_the_end() {
        // Issue 13: the progress line is only for pushes to many machines, on the terminal
        // (stderr), and never left mixed into a line on stdout.
        let line = |m: &str| PushLine {
            machine: m.into(),
            outcome: PushOutcome::Failed {
                reason: "named".into(),
                error: "no address".into(),
            },
        };
        let err = Shared::default();
        let mut live = Live::with_progress(false, Some(Box::new(err.clone())));
        let mut out = Vec::new();
        let machines: Vec<String> = (0..progress_machines_min)
            .map(|i| format!("m{i}"))
            .collect();
        live.event(PushEvent::Begin { epoch: 1, machines }, &mut out);
        live.event(PushEvent::Line(line("m0")), &mut out);
        live.clear_progress();
        let shown = String::from_utf8(err.0.lock().expect("lock").clone()).expect("utf-8");
        let clear = "\r\x1b[2K";
        assert_eq!(
            shown,
            format!(
                "\r[0/5] 0 applied, 0 sent, 0 held, 0 refused, 0 failed{clear}\r[1/5] 0 applied, 0 sent, 0 held, 0 refused, 1 failed{clear}"
            )
        );
        // Fewer machines: no progress line at all.
        let err = Shared::default();
        let mut live = Live::with_progress(false, Some(Box::new(err.clone())));
        let few = vec!["m0".to_string()];
        live.event(
            PushEvent::Begin {
                epoch: 1,
                machines: few,
            },
            &mut out,
        );
        live.event(PushEvent::Line(line("m0")), &mut out);
        assert!(err.0.lock().expect("lock").is_empty());
    }

    #[test]
    fn wait_timeouts_parse_with_units_and_refuse_zero_and_too_long() {
        assert_eq!(parse_wait("90s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_wait("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_wait("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_wait("7"), Ok(Duration::from_secs(7)));
        assert!(parse_wait("0s").is_err());
        assert!(parse_wait("2h").is_err());
        assert!(parse_wait("61m").is_err());
    }
}
