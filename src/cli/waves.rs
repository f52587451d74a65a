//! `push --behind|--all --wave N|N%` and `--canary` (decision 0315): meshctl sends the targets a
//! `plan --behind|--all` names in waves, each target as one `push <machine>` so the leader
//! cascades it (G1) exactly as it would alone, waits after each wave until its machines report
//! their modules ready (`push --wait`'s own wait), and stops at the first wave with a failure,
//! saying which and how to continue. `plan --wave` walks the same waves with `plan <machine>`.
//! A machine a wave sent (a target or its cascade) is never sent again by a later wave.

use std::collections::BTreeSet;
use std::io::{IsTerminal, Write};
use std::path::Path;
use std::time::Duration;

use super::push::{self, Live, WaitOutcome, Waited};
use super::render::{self, Via};
use super::{CliError, exit_failed, exit_module_failed, exit_wait_timeout};
use crate::controller::api::{
    Body, PlanView, PushEvent, PushLine, PushOutcome, PushTarget, PushView, Request,
};

/// How big each wave is: `--wave 3` (machines) or `--wave 25%` (of the targets).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WaveSize {
    Machines(usize),
    Percent(u8),
}

/// `3` or `25%`: at least one machine, a percentage from 1 to 100.
pub fn parse_wave(text: &str) -> Result<WaveSize, String> {
    let text = text.trim();
    if let Some(p) = text.strip_suffix('%') {
        return match p.trim().parse::<u8>() {
            Ok(p) if (1..=100).contains(&p) => Ok(WaveSize::Percent(p)),
            _ => Err(format!(
                "`{text}` is not a wave size: write a percentage from 1% to 100%, or a number of machines"
            )),
        };
    }
    match text.parse::<usize>() {
        Ok(n) if n >= 1 => Ok(WaveSize::Machines(n)),
        _ => Err(format!(
            "`{text}` is not a wave size: write a number of machines (at least 1) or a percentage like 25%"
        )),
    }
}

impl WaveSize {
    /// Machines per wave for `total` targets: a percentage rounds down, and is at least 1.
    pub fn of(self, total: usize) -> usize {
        let n = match self {
            WaveSize::Machines(n) => n,
            WaveSize::Percent(p) => total.saturating_mul(usize::from(p)) / 100,
        };
        n.max(1)
    }
}

/// Which machine goes first as a wave of its own.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Canary {
    None,
    /// `--canary`: the first target in plan order.
    First,
    /// `--canary=MACHINE`.
    Named(String),
}

/// Splits `targets` (in plan order) into waves: the canary alone first, then waves of
/// `size.of(targets.len())` in order (the last may be smaller); without a size the rest is one
/// wave. Refused when the named canary is not a target.
pub fn split(
    targets: &[String],
    size: Option<WaveSize>,
    canary: &Canary,
) -> Result<Vec<Vec<String>>, CliError> {
    let mut rest: Vec<String> = targets.to_vec();
    let mut waves = Vec::new();
    let first = match canary {
        Canary::None => None,
        Canary::First => rest.first().cloned(),
        Canary::Named(m) => {
            if !rest.contains(m) {
                return Err(CliError::Usage(format!(
                    "--canary={m}: {m} is not one of the machines this push would send ({}); name one of them or leave the machine out to take the first",
                    render::list(targets)
                )));
            }
            Some(m.clone())
        }
    };
    if let Some(c) = first {
        rest.retain(|m| *m != c);
        waves.push(vec![c]);
    }
    let per = match size {
        Some(s) => s.of(targets.len()),
        None => rest.len().max(1),
    };
    for chunk in rest.chunks(per) {
        waves.push(chunk.to_vec());
    }
    Ok(waves)
}

/// The machines a `plan --behind|--all` names as targets, in plan order. A machine it shows only
/// as cascaded from another is not a target: it goes with the push of the machine it cascades from.
pub fn targets_of(plan: &PlanView) -> Vec<String> {
    plan.machines
        .iter()
        .filter(|m| !m.reason.starts_with("cascaded from"))
        .map(|m| m.machine.clone())
        .collect()
}

/// What one wave did.
#[derive(Clone, Debug, PartialEq)]
pub struct WaveRun {
    /// 1-based.
    pub number: usize,
    /// The targets of the wave, as split.
    pub targets: Vec<String>,
    /// Targets an earlier wave already sent (as a cascade), not sent again.
    pub skipped: Vec<String>,
    /// Every line of the wave's pushes: its targets and their cascade.
    pub lines: Vec<PushLine>,
    pub waited: Vec<Waited>,
    /// The push request that failed, if one did (then the wave stopped there).
    pub error: Option<String>,
}

impl WaveRun {
    /// The wave's lines as one push view, for the wait and the exit code.
    pub fn view(&self, epoch: u64) -> PushView {
        PushView {
            epoch,
            lines: self.lines.clone(),
        }
    }

    /// The machines that make this wave a failure: a line failed or refused, a send not confirmed
    /// by the wait, a module failing or not ready in time. Empty when the wave may be followed.
    pub fn failed(&self) -> Vec<String> {
        let mut out = Vec::new();
        for l in &self.lines {
            let bad = match l.outcome {
                PushOutcome::Failed { .. } | PushOutcome::Refused { .. } => true,
                PushOutcome::Sent { .. } => !self.waited.iter().any(|w| {
                    w.machine == l.machine && !matches!(w.outcome, WaitOutcome::TimedOut { .. })
                }),
                PushOutcome::Applied { .. } | PushOutcome::Held { .. } => false,
            };
            if bad {
                out.push(l.machine.clone());
            }
        }
        for w in &self.waited {
            if !matches!(w.outcome, WaitOutcome::Ready) && !out.contains(&w.machine) {
                out.push(w.machine.clone());
            }
        }
        out
    }

    /// The wave stops the walk: a machine failed or a push request did.
    pub fn stops(&self) -> bool {
        self.error.is_some() || !self.failed().is_empty()
    }
}

/// The leader's side of a walk, as the walk sees it; meshctl's requests in [`run_push`], a
/// scripted leader in the tests.
pub trait Fleet {
    /// `push <machine>` (its cascade follows it): every line, printed as it streams.
    fn push(&mut self, machine: &str) -> Result<PushView, CliError>;
    /// `push --wait`'s wait for the machines `view` sent.
    fn wait(&mut self, view: &PushView) -> Vec<Waited>;
    /// A wave begins or ends (its text line).
    fn say(&mut self, line: &str);
}

/// Walks `waves` in order: every target not yet sent by this walk is pushed (bringing its
/// cascade), then the wave's sends are waited for; stops after the first wave that [`WaveRun::stops`].
pub fn walk(waves: &[Vec<String>], fleet: &mut dyn Fleet) -> Vec<WaveRun> {
    let total = waves.len();
    let mut sent: BTreeSet<String> = BTreeSet::new();
    let mut runs = Vec::new();
    for (i, targets) in waves.iter().enumerate() {
        let number = i + 1;
        let mut run = WaveRun {
            number,
            targets: targets.clone(),
            skipped: Vec::new(),
            lines: Vec::new(),
            waited: Vec::new(),
            error: None,
        };
        fleet.say(&begin_line(number, total, targets));
        let mut epoch = 0;
        for m in targets {
            if sent.contains(m) {
                run.skipped.push(m.clone());
                continue;
            }
            match fleet.push(m) {
                Ok(view) => {
                    epoch = view.epoch;
                    for l in view.lines {
                        // A machine is recorded as sent by the line the leader gave it; a held
                        // or failed one stays behind, and a later wave's push may send it.
                        if was_sent(&l.outcome) {
                            sent.insert(l.machine.clone());
                        }
                        run.lines.push(l);
                    }
                }
                Err(e) => {
                    run.error = Some(format!("push {m}: {e}"));
                    break;
                }
            }
        }
        if run.error.is_none() {
            run.waited = fleet.wait(&run.view(epoch));
        }
        fleet.say(&end_line(&run, total));
        let stop = run.stops();
        runs.push(run);
        if stop {
            break;
        }
    }
    runs
}

fn was_sent(o: &PushOutcome) -> bool {
    matches!(o, PushOutcome::Applied { .. } | PushOutcome::Sent { .. })
}

/// `wave 2/3: 2 machines: g14, novox`.
pub fn begin_line(number: usize, total: usize, targets: &[String]) -> String {
    let n = targets.len();
    let machines = if n == 1 { "machine" } else { "machines" };
    format!(
        "wave {number}/{total}: {n} {machines}: {}\n",
        render::list(targets)
    )
}

/// `wave 2/3 done: 2 applied, 1 ready, 1 failing` (with the cascade and skipped counted).
pub fn end_line(run: &WaveRun, total: usize) -> String {
    let count =
        |f: &dyn Fn(&PushOutcome) -> bool| run.lines.iter().filter(|l| f(&l.outcome)).count();
    let mut parts: Vec<String> = Vec::new();
    let mut part = |n: usize, what: &str| {
        if n > 0 {
            parts.push(format!("{n} {what}"));
        }
    };
    part(
        count(&|o| matches!(o, PushOutcome::Applied { .. })),
        "applied",
    );
    part(
        count(&|o| matches!(o, PushOutcome::Sent { .. })),
        "sent, not confirmed",
    );
    part(count(&|o| matches!(o, PushOutcome::Held { .. })), "held");
    part(
        count(&|o| matches!(o, PushOutcome::Refused { .. })),
        "refused",
    );
    part(
        count(&|o| matches!(o, PushOutcome::Failed { .. })),
        "failed",
    );
    let waited =
        |f: &dyn Fn(&WaitOutcome) -> bool| run.waited.iter().filter(|w| f(&w.outcome)).count();
    part(waited(&|o| matches!(o, WaitOutcome::Ready)), "ready");
    part(
        waited(&|o| matches!(o, WaitOutcome::Failing { .. })),
        "failing",
    );
    part(
        waited(&|o| matches!(o, WaitOutcome::TimedOut { .. })),
        "not ready in time",
    );
    let cascade = run
        .lines
        .iter()
        .filter(|l| !run.targets.contains(&l.machine))
        .count();
    part(cascade, "of them by cascade");
    part(run.skipped.len(), "already sent by an earlier wave");
    if parts.is_empty() {
        parts.push("nothing to send".into());
    }
    let verdict = if run.stops() { "FAILED" } else { "done" };
    let mut line = format!(
        "wave {}/{total} {verdict}: {}\n",
        run.number,
        parts.join(", ")
    );
    if let Some(e) = &run.error {
        line = format!("wave {}/{total} FAILED: {e}\n", run.number);
    }
    line
}

/// What the walk says at its end when it stopped: which wave and machines failed, what was not
/// sent, and how to continue. `None` when every wave was sent.
pub fn stop_text(waves: &[Vec<String>], runs: &[WaveRun], args: &WaveArgs) -> Option<String> {
    let last = runs.last()?;
    if !last.stops() {
        return None;
    }
    let sent: BTreeSet<&String> = runs
        .iter()
        .flat_map(|r| r.lines.iter())
        .filter(|l| was_sent(&l.outcome))
        .map(|l| &l.machine)
        .collect();
    let not_sent: Vec<String> = waves[last.number..]
        .iter()
        .flatten()
        .filter(|m| !sent.contains(m))
        .cloned()
        .collect();
    let total = waves.len();
    let what = match &last.error {
        Some(e) => e.clone(),
        None => format!("{} failed", render::list(&last.failed())),
    };
    let mut out = format!(
        "stopped at wave {}/{total}: {what}; not sent: {}\n",
        last.number,
        match not_sent.is_empty() {
            true => "none".to_string(),
            false => render::list(&not_sent),
        }
    );
    let wave = args.continue_flags();
    out.push_str(&format!(
        "to continue: fix what failed — change the model and `meshctl apply` it (a machine whose declaration changes is behind again), or fix the machine and `meshctl push <machine> --why ...` — then `meshctl push --behind{wave} --why ...` sends the machines not sent yet: they are still behind\n"
    ));
    Some(out)
}

/// The exit code of a walk: that of every line and wait of every wave, as `push --wait` decides
/// it; a push request that failed is a failed send.
pub fn exit_code(runs: &[WaveRun]) -> u8 {
    if runs.iter().any(|r| r.error.is_some()) {
        return exit_failed;
    }
    let lines: Vec<PushLine> = runs.iter().flat_map(|r| r.lines.clone()).collect();
    let waited: Vec<Waited> = runs.iter().flat_map(|r| r.waited.clone()).collect();
    let code = push::exit_code(&PushView { epoch: 0, lines }, Some(&waited));
    debug_assert!(
        !runs.iter().any(WaveRun::stops)
            || [exit_failed, exit_module_failed, exit_wait_timeout].contains(&code),
        "a stopped walk exits as a failure"
    );
    code
}

/// The wave options of `push` and `plan`.
#[derive(Clone, Debug, Default, clap::Args)]
pub struct WaveArgs {
    /// With --behind or --all: send in waves of N machines, or N% of the machines (at least 1),
    /// waiting after each wave until its machines report their modules ready (as --wait), and
    /// stopping at the first wave with a failure.
    #[arg(long, value_name = "N|N%", value_parser = parse_wave)]
    pub wave: Option<WaveSize>,
    /// With --behind or --all: send one machine first as a wave of its own (the first in plan
    /// order, or MACHINE), then the rest in waves.
    #[arg(long, value_name = "MACHINE", num_args = 0..=1, require_equals = true,
        default_missing_value = "")]
    pub canary: Option<String>,
}

impl WaveArgs {
    /// Whether waves were asked for.
    pub fn any(&self) -> bool {
        self.wave.is_some() || self.canary.is_some()
    }

    pub fn canary(&self) -> Canary {
        match self.canary.as_deref() {
            None => Canary::None,
            Some("") => Canary::First,
            Some(m) => Canary::Named(m.to_string()),
        }
    }

    /// ` --wave 25%` for the how-to-continue line (no canary: it already went).
    fn continue_flags(&self) -> String {
        match self.wave {
            Some(WaveSize::Machines(n)) => format!(" --wave {n}"),
            Some(WaveSize::Percent(p)) => format!(" --wave {p}%"),
            None => String::new(),
        }
    }

    /// The target waves need, or why the arguments cannot have waves.
    pub fn target(&self, target: &PushTarget, command: &str) -> Result<(), CliError> {
        match target {
            PushTarget::Behind | PushTarget::All => Ok(()),
            PushTarget::Machine(m) => Err(CliError::Usage(format!(
                "{command} {m}: --wave and --canary split --behind or --all into waves; one machine is one push (its cascade goes with it): drop the option or use --behind"
            ))),
        }
    }
}

/// Asks `plan --behind|--all` for the targets and splits them.
fn plan_waves(
    ctx: Option<&Path>,
    target: &PushTarget,
    args: &WaveArgs,
) -> Result<(Via, Vec<Vec<String>>), CliError> {
    let request = Request::Plan {
        target: target.clone(),
        moves: Vec::new(),
    };
    let (via, body) = render::ask(ctx, &request)?;
    let Body::Plan(plan) = body else {
        return Err(render::unexpected(via, "plan", &body));
    };
    let targets = targets_of(&plan);
    Ok((via, split(&targets, args.wave, &args.canary())?))
}

/// meshctl's [`Fleet`]: streamed pushes printed as they come, `push --wait`'s wait.
struct Meshctl<'a> {
    ctx: Option<&'a Path>,
    context: super::context::Context,
    why: String,
    timeout: Duration,
    live: Live,
    json: bool,
    via: Option<Via>,
    /// The longest target name, so every line of the walk lines up.
    width: usize,
}

impl Meshctl<'_> {
    fn print(&self, text: &str) {
        if self.json {
            return;
        }
        let mut stdout = std::io::stdout().lock();
        let _ = stdout.write_all(text.as_bytes());
        let _ = stdout.flush();
    }
}

impl Fleet for Meshctl<'_> {
    fn push(&mut self, machine: &str) -> Result<PushView, CliError> {
        let request = Request::Push {
            target: PushTarget::Machine(machine.to_string()),
            why: self.why.clone(),
            moves: Vec::new(),
            plan: None,
        };
        let json = self.json;
        let answer = {
            let live = &mut self.live;
            let mut events = |event: PushEvent| {
                if json {
                    live.event(event, &mut std::io::sink());
                } else {
                    live.event(event, &mut std::io::stdout());
                }
            };
            super::client::ask_streamed(&self.context, &request, &mut events)
        };
        self.live.clear_progress();
        let (via, body) = render::split(answer?)?;
        let Body::Push(view) = body else {
            return Err(render::unexpected(via, "push", &body));
        };
        self.via = Some(via);
        let missed = self.live.missed(&view);
        self.print(&missed);
        Ok(view)
    }

    fn wait(&mut self, view: &PushView) -> Vec<Waited> {
        let waited = push::wait(self.ctx, view, self.timeout, &mut std::io::sink());
        // One line per machine: the push's. Only a machine that did not get ready says more.
        let width = waited
            .iter()
            .map(|w| w.machine.len())
            .max()
            .unwrap_or(0)
            .max(self.width);
        for w in &waited {
            if !matches!(w.outcome, WaitOutcome::Ready) {
                self.print(&push::wait_line(w, width));
            }
        }
        waited
    }

    fn say(&mut self, line: &str) {
        self.print(line);
    }
}

/// `push --behind|--all --wave N|N% [--canary[=MACHINE]]`.
pub fn run_push(
    ctx: Option<&Path>,
    target: &PushTarget,
    why: String,
    wait: Option<Duration>,
    args: &WaveArgs,
    json: bool,
) -> Result<super::Output, CliError> {
    args.target(target, "push")?;
    let (plan_via, waves) = plan_waves(ctx, target, args)?;
    let timeout = wait.unwrap_or(Duration::from_millis(push::wait_ms_default));
    let mut fleet = Meshctl {
        ctx,
        context: super::context::resolve(ctx)?,
        why,
        timeout,
        live: Live::new(json, std::io::stderr().is_terminal()),
        json,
        via: None,
        width: 0,
    };
    let n: usize = waves.iter().map(Vec::len).sum();
    let widest = waves.iter().flatten().map(String::len).max().unwrap_or(0);
    fleet.live.widen(widest);
    fleet.width = widest;
    fleet.print(&format!(
        "push of {n} machine(s) {} in {} wave(s), waiting up to {} after each for its modules\n",
        match target {
            PushTarget::All => "(--all)",
            _ => "behind",
        },
        waves.len(),
        push::seconds(timeout)
    ));
    let runs = walk(&waves, &mut fleet);
    let code = exit_code(&runs);
    let via = fleet.via.unwrap_or(plan_via);
    if json {
        let doc = super::json::PushWavesJson::new(&waves, &runs, stop_text(&waves, &runs, args));
        return super::json::output(Some(via), doc, code);
    }
    let lines: Vec<PushLine> = runs.iter().flat_map(|r| r.lines.clone()).collect();
    let mut text = String::new();
    if waves.is_empty() {
        text.push_str("nothing to send: every machine named is up to date\n");
    }
    text.push_str(&push::summary_line(&PushView { epoch: 0, lines }));
    if let Some(stop) = stop_text(&waves, &runs, args) {
        text.push_str(&stop);
    }
    text.push_str(&via.note());
    Ok(super::Output { text, code })
}

/// One planned wave: its targets with their cascade, and targets an earlier wave's cascade takes.
#[derive(Clone, Debug, PartialEq)]
pub struct PlannedWave {
    /// Every machine the wave would send, with why (`named`, `cascaded from ace`, …), in order.
    pub machines: Vec<(String, String)>,
    /// Targets an earlier wave's cascade would already send.
    pub skipped: Vec<String>,
}

/// The waves `plan --wave` shows: each target planned as the push would send it (`plan
/// <machine>`), a machine taken by an earlier wave left out of later ones.
pub fn plan_walk(
    waves: &[Vec<String>],
    plan_one: &mut dyn FnMut(&str) -> Result<PlanView, CliError>,
) -> Result<Vec<PlannedWave>, CliError> {
    let mut taken: BTreeSet<String> = BTreeSet::new();
    let mut out = Vec::new();
    for targets in waves {
        let mut wave = PlannedWave {
            machines: Vec::new(),
            skipped: Vec::new(),
        };
        for m in targets {
            if taken.contains(m) {
                wave.skipped.push(m.clone());
                continue;
            }
            let plan = plan_one(m)?;
            for pm in plan.machines {
                if taken.insert(pm.machine.clone()) {
                    wave.machines.push((pm.machine, pm.reason));
                }
            }
        }
        out.push(wave);
    }
    Ok(out)
}

/// `plan --behind|--all --wave N|N% [--canary[=MACHINE]]`.
pub fn run_plan(
    ctx: Option<&Path>,
    target: &PushTarget,
    args: &WaveArgs,
    json: bool,
) -> Result<super::Output, CliError> {
    args.target(target, "plan")?;
    let (mut via, waves) = plan_waves(ctx, target, args)?;
    let mut plan_one = |m: &str| {
        let request = Request::Plan {
            target: PushTarget::Machine(m.to_string()),
            moves: Vec::new(),
        };
        let (v, body) = render::ask(ctx, &request)?;
        via = v;
        match body {
            Body::Plan(plan) => Ok(plan),
            other => Err(render::unexpected(v, "plan", &other)),
        }
    };
    let planned = plan_walk(&waves, &mut plan_one)?;
    if json {
        let doc = super::json::PlanWavesJson::new(&waves, &planned);
        return super::json::output(Some(via), doc, super::exit_done);
    }
    Ok(super::Output {
        text: plan_text(via, &waves, &planned),
        code: super::exit_done,
    })
}

/// The lines `plan --wave` prints: a line per wave, a line per machine it would send.
pub fn plan_text(via: Via, waves: &[Vec<String>], planned: &[PlannedWave]) -> String {
    let total = waves.len();
    let mut out = String::new();
    if total == 0 {
        out.push_str("nothing to send: every machine planned is up to date with its last send\n");
    }
    let width = planned
        .iter()
        .flat_map(|w| w.machines.iter())
        .map(|(m, _)| m.len())
        .max()
        .unwrap_or(0);
    for (i, (targets, wave)) in waves.iter().zip(planned).enumerate() {
        out.push_str(&begin_line(i + 1, total, targets));
        for (m, reason) in &wave.machines {
            out.push_str(&format!("  would send {m:width$}  ({reason})\n"));
        }
        for m in &wave.skipped {
            out.push_str(&format!(
                "  would skip {m:width$}  (already sent by an earlier wave's cascade)\n"
            ));
        }
    }
    out.push_str("each wave waits until its machines report their modules ready; the first wave with a failure stops the push\n");
    out.push_str(&via.note());
    out
}

#[cfg(test)]
mod tests;
