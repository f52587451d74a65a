//! `meshctl push`: send declarations to one machine (and what it cascades to, G1), to every machine
//! that is `--behind`, or to `--all`. One line per machine; exit 3 if anything was held, 1 if
//! anything failed or was refused. A bare push and a push without `--why` are refused here (G7).

use std::path::Path;

use super::render::{self, Via};
use super::{CliError, Output, exit_done, exit_failed, exit_held};
use crate::controller::api::{Body, PushLine, PushOutcome, PushTarget, PushView, Request};

#[derive(Debug, clap::Args)]
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
    /// Print the answer as JSON.
    #[arg(long)]
    pub json: bool,
}

/// The request a push's arguments make, or why they are refused before anything is sent.
pub fn request(args: &PushArgs) -> Result<Request, CliError> {
    let target = match (&args.machine, args.behind, args.all) {
        (Some(m), false, false) => PushTarget::Machine(m.clone()),
        (None, true, false) => PushTarget::Behind,
        (None, false, true) => PushTarget::All,
        (None, false, false) => {
            return Err(CliError::Usage(
                "push needs a machine, --behind or --all: a bare push would send everything unseen; run `meshctl plan <machine> --diff` first".into(),
            ));
        }
        _ => {
            return Err(CliError::Usage(
                "push takes one of a machine, --behind or --all, not several".into(),
            ));
        }
    };
    if !args.moves.is_empty() && !matches!(target, PushTarget::Machine(_)) {
        return Err(CliError::Usage(
            "--move releases a hold on one machine; name the machine: `meshctl push <machine> --move <module>`".into(),
        ));
    }
    let why = super::require_why("push", args.why.as_deref())?;
    Ok(Request::Push {
        target,
        why,
        moves: args.moves.clone(),
    })
}

pub fn run(ctx: Option<&Path>, args: &PushArgs) -> Result<Output, CliError> {
    let request = request(args)?;
    let (via, body) = render::ask(ctx, &request)?;
    let Body::Push(view) = body else {
        return Err(render::unexpected(via, "push", &body));
    };
    let code = exit_code(&view);
    if args.json {
        return render::json(via, &view, code);
    }
    Ok(Output {
        text: render_text(via, &view),
        code,
    })
}

/// 1 if anything failed or was refused, else 3 if anything was held, else 0.
pub fn exit_code(view: &PushView) -> u8 {
    let failed = view.lines.iter().any(|l| {
        matches!(
            l.outcome,
            PushOutcome::Failed { .. } | PushOutcome::Refused { .. }
        )
    });
    let held = view
        .lines
        .iter()
        .any(|l| matches!(l.outcome, PushOutcome::Held { .. }));
    if failed {
        exit_failed
    } else if held {
        exit_held
    } else {
        exit_done
    }
}

/// The lines `push` prints: one per machine, holds with the command that releases them.
pub fn render_text(via: Via, v: &PushView) -> String {
    let mut out = format!("push at epoch {}\n", v.epoch);
    if v.lines.is_empty() {
        out.push_str("nothing to send: every machine named is up to date\n");
    }
    let width = v.lines.iter().map(|l| l.machine.len()).max().unwrap_or(0);
    for line in &v.lines {
        out.push_str(&push_line(line, width));
    }
    out.push_str(&via.note());
    out
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
        assert_eq!(exit_code(&view(vec![applied.clone()])), 0);
        assert_eq!(exit_code(&view(vec![applied.clone(), held.clone()])), 3);
        assert_eq!(exit_code(&view(vec![held.clone(), failed])), 1);
        let via = Via {
            replica: 1,
            forwarded_by: None,
        };
        let text = render_text(via, &view(vec![applied, held]));
        assert!(text.contains("meshctl push g14 --move broker"), "{text}");
    }
}
