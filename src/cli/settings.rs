//! `meshctl settings show|set|clear` (G6): set answers every key it adds, changes and removes; a
//! removal needs `--replace`; the replaced or cleared layer stays in the history.

use std::path::Path;

use super::json;
use super::render::{self, Via};
use super::{CliError, Output};
use crate::controller::api::{Body, Request, SettingsView};
use crate::core::settings::{Scope, parse_assignments};

#[derive(Debug, clap::Subcommand)]
pub enum SettingsCommand {
    /// Show every layer (or one scope's), with `--history` the replaced and cleared layers.
    Show {
        /// `mesh`, `machine/<m>`, `module/<mod>` or `module/<mod>@<m>`.
        scope: Option<String>,
        /// Also show every earlier write: the layers replaced and cleared, with why, who and when.
        #[arg(long)]
        history: bool,
        /// Print the answer as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Set keys (`k=v`) on a scope; `-k` removes a key and needs `--replace`.
    Set {
        /// `mesh`, `machine/<m>`, `module/<mod>` or `module/<mod>@<m>`.
        scope: String,
        /// `key=value` to set, `-key` to remove.
        #[arg(required = true, allow_hyphen_values = true, value_name = "k=v|-k")]
        assignments: Vec<String>,
        /// Why; kept in the settings history.
        #[arg(long)]
        why: Option<String>,
        /// The given keys become the whole layer; keys not given are removed (and listed).
        #[arg(long)]
        replace: bool,
        /// Print the answer as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Make a scope's layer what settings history entry N left it: the `after` side of write #N
    /// as `settings show <scope> --history` lists it (cleared, if #N cleared it), in one write
    /// kept in the history like any other. Sends nothing; `plan` shows what a push would send.
    Rollback {
        /// `mesh`, `machine/<m>`, `module/<mod>` or `module/<mod>@<m>`.
        scope: String,
        /// The history entry id (`#N` in `settings show <scope> --history`).
        #[arg(long = "to", value_name = "N")]
        to: u64,
        /// Why; kept in the settings history (as `settings rollback to #N: <why>`).
        #[arg(long)]
        why: Option<String>,
        /// Print the answer as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Remove a scope's whole layer (kept in the history).
    Clear {
        /// `mesh`, `machine/<m>`, `module/<mod>` or `module/<mod>@<m>`.
        scope: String,
        /// Why; kept in the settings history.
        #[arg(long)]
        why: Option<String>,
        /// Print the answer as JSON.
        #[arg(long)]
        json: bool,
    },
}

/// Parses a scope argument; a bad one is bad input.
pub fn parse_scope(text: &str) -> Result<Scope, CliError> {
    text.parse::<Scope>()
        .map_err(|e| CliError::Usage(e.to_string()))
}

/// The request a settings command makes, or why it is refused before anything is sent.
pub fn request(cmd: &SettingsCommand) -> Result<Request, CliError> {
    match cmd {
        // The history comes page by page afterwards (see `run`).
        SettingsCommand::Show { scope, .. } => Ok(Request::SettingsShow {
            scope: scope.as_deref().map(parse_scope).transpose()?,
            history: false,
        }),
        SettingsCommand::Set {
            scope,
            assignments,
            why,
            replace,
            ..
        } => {
            let scope = parse_scope(scope)?;
            let (assignments, late) = split_flags(assignments)?;
            let replace = &(*replace || late.replace);
            let why = &why.clone().or(late.why);
            let edit =
                parse_assignments(&assignments).map_err(|e| CliError::Usage(e.to_string()))?;
            if !edit.remove.is_empty() && !replace {
                let keys: Vec<String> = edit.remove.iter().cloned().collect();
                return Err(CliError::Usage(format!(
                    "removing {} needs --replace: without it a write only adds and changes keys; add --replace and list every key to keep",
                    keys.join(", ")
                )));
            }
            let why = super::require_why("settings set", why.as_deref())?;
            Ok(Request::SettingsSet {
                scope,
                layer: edit.set,
                remove: edit.remove,
                replace: *replace,
                why,
            })
        }
        SettingsCommand::Rollback { scope, to, why, .. } => Ok(Request::SettingsRollback {
            scope: parse_scope(scope)?,
            to: *to,
            why: super::require_why("settings rollback", why.as_deref())?,
        }),
        SettingsCommand::Clear { scope, why, .. } => Ok(Request::SettingsClear {
            scope: parse_scope(scope)?,
            why: super::require_why("settings clear", why.as_deref())?,
        }),
    }
}

/// Flags written after the assignments: `-key` words make clap take every later word as an
/// assignment, so `--why`, `--replace` and `--json` are picked out of them here.
#[derive(Debug, Default)]
pub struct LateFlags {
    pub why: Option<String>,
    pub replace: bool,
    pub json: bool,
}

/// Splits the assignment words from flags written among them.
pub fn split_flags(words: &[String]) -> Result<(Vec<String>, LateFlags), CliError> {
    let mut out = Vec::new();
    let mut late = LateFlags::default();
    let mut iter = words.iter();
    while let Some(w) = iter.next() {
        match w.as_str() {
            "--replace" => late.replace = true,
            "--json" => late.json = true,
            "--why" => match iter.next() {
                Some(v) => late.why = Some(v.clone()),
                None => {
                    return Err(CliError::Usage(
                        "--why needs a value: --why \"<reason>\"".into(),
                    ));
                }
            },
            _ => match w.strip_prefix("--why=") {
                Some(v) => late.why = Some(v.to_string()),
                None => out.push(w.clone()),
            },
        }
    }
    Ok((out, late))
}

impl SettingsCommand {
    /// Whether `--json` was given, also among the assignments of `set`.
    pub fn wants_json(&self) -> bool {
        match self {
            SettingsCommand::Show { json, .. }
            | SettingsCommand::Clear { json, .. }
            | SettingsCommand::Rollback { json, .. } => *json,
            SettingsCommand::Set {
                json, assignments, ..
            } => *json || split_flags(assignments).is_ok_and(|(_, late)| late.json),
        }
    }
}

/// Every settings change (of `scope`, if given), oldest first, read page by page.
fn settings_history(
    ctx: Option<&Path>,
    scope: Option<crate::core::settings::Scope>,
) -> Result<Vec<crate::store::command::SettingsChange>, CliError> {
    let query = crate::controller::api::HistoryQuery {
        settings_only: true,
        scope,
        ..Default::default()
    };
    let items = super::history::all_pages(ctx, query)?.1;
    Ok(items
        .into_iter()
        .filter_map(|i| match i {
            crate::controller::api::HistoryItem::Settings(c) => Some(c),
            _ => None,
        })
        .collect())
}

pub fn run(ctx: Option<&Path>, cmd: &SettingsCommand) -> Result<Output, CliError> {
    let as_json = cmd.wants_json();
    let request = request(cmd)?;
    let (via, mut body) = render::ask(ctx, &request)?;
    if let (SettingsCommand::Show { history: true, .. }, Request::SettingsShow { scope, .. }) =
        (cmd, &request)
        && let Body::Settings(view) = &mut body
    {
        view.history = settings_history(ctx, scope.clone())?;
    }
    match &body {
        Body::Settings(view) if as_json => json::output(
            Some(via),
            json::SettingsShowJson::from(view),
            super::exit_done,
        ),
        Body::Settings(view) => Ok(Output::done(render_show(via, view))),
        Body::SettingsSet {
            scope,
            added,
            changed,
            removed,
        } if as_json => json::output(
            Some(via),
            json::SettingsSetJson::new(scope, added, changed, removed),
            super::exit_done,
        ),
        Body::SettingsSet {
            scope,
            added,
            changed,
            removed,
        } => Ok(Output::done(render_set(
            via, scope, added, changed, removed,
        ))),
        Body::SettingsUnchanged { scope, .. } if as_json => json::output(
            Some(via),
            json::SettingsSetJson::new(scope, &[], &[], &[]),
            super::exit_done,
        ),
        Body::SettingsUnchanged { scope, to } => Ok(Output::done(format!(
            "{scope}: unchanged: the layer already is what #{to} left it; nothing was written\n{}",
            via.note()
        ))),
        _ => Err(render::unexpected(via, "settings", &body)),
    }
}

/// The lines `settings show` prints.
pub fn render_show(via: Via, v: &SettingsView) -> String {
    let mut out = String::new();
    if v.layers.is_empty() {
        out.push_str("no settings layers\n");
    }
    for (scope, layer) in &v.layers {
        out.push_str(&format!("[{scope}]\n"));
        for (k, val) in layer {
            out.push_str(&format!("  {k} = {val}\n"));
        }
    }
    if !v.history.is_empty() {
        out.push_str("history:\n");
        for c in &v.history {
            let before = c.before.as_ref().map(layer_line).unwrap_or("(none)".into());
            let after = c
                .after
                .as_ref()
                .map(layer_line)
                .unwrap_or("(cleared)".into());
            out.push_str(&format!(
                "  #{} {}  epoch {}  {}  by {}: {}\n    before: {before}\n    after:  {after}\n",
                c.id,
                render::time_ms(c.time_ms),
                c.epoch,
                c.scope,
                c.actor,
                c.why
            ));
        }
        if let Some(oldest) = v.history.first().map(|c| c.id).filter(|id| *id > 1) {
            out.push_str(&format!(
                "  (#1–#{} not shown: a scope's view shows its own changes, and the store keeps only the newest {} settings changes of all scopes)\n",
                oldest - 1,
                crate::store::state::settings_history_kept_max
            ));
        }
    }
    out.push_str(&via.note());
    out
}

/// A layer on one line: `k=v, k=v`.
fn layer_line(layer: &crate::core::settings::Layer) -> String {
    let pairs: Vec<String> = layer.iter().map(|(k, v)| format!("{k}={v}")).collect();
    render::list(&pairs)
}

/// The lines `settings set` and `clear` print: every key added, changed and removed (G6).
pub fn render_set(
    via: Via,
    scope: &Scope,
    added: &[String],
    changed: &[String],
    removed: &[String],
) -> String {
    let mut out = String::new();
    if added.is_empty() && changed.is_empty() && removed.is_empty() {
        out.push_str(&format!("{scope}: nothing changed\n"));
    }
    for k in added {
        out.push_str(&format!("{scope}: added {k}\n"));
    }
    for k in changed {
        out.push_str(&format!("{scope}: changed {k}\n"));
    }
    for k in removed {
        out.push_str(&format!("{scope}: removed {k}\n"));
    }
    out.push_str(&via.note());
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(words: &[&str], replace: bool, why: Option<&str>) -> Result<Request, CliError> {
        request(&SettingsCommand::Set {
            scope: "module/broker@g14".into(),
            assignments: words.iter().map(|w| w.to_string()).collect(),
            why: why.map(String::from),
            replace,
            json: false,
        })
    }

    #[test]
    fn g6_removal_without_replace_is_refused_before_sending() {
        // G6: a removal is refused unless --replace.
        let e = set(&["a=1", "-b"], false, Some("w")).expect_err("removal without replace");
        assert_eq!(e.exit_code(), 2);
        assert!(e.to_string().contains("--replace"), "{e}");
        let ok = set(&["a=1", "-b"], true, Some("w")).expect("with --replace");
        assert!(matches!(ok, Request::SettingsSet { replace: true, .. }));
        // Flags written after a `-key` word still count.
        let late = set(&["a=1", "-b", "--replace", "--why", "late"], false, None).expect("late");
        assert!(
            matches!(late, Request::SettingsSet { replace: true, ref why, .. } if why == "late")
        );
    }

    #[test]
    fn settings_bad_scope_assignment_or_missing_why_is_bad_input() {
        // Bad input: unknown scope shape, malformed assignment, missing --why; all exit 2.
        assert_eq!(
            set(&["=1"], false, Some("w")).expect_err("bad").exit_code(),
            2
        );
        assert_eq!(
            set(&["a="], false, Some("w"))
                .expect_err("empty")
                .exit_code(),
            2
        );
        assert_eq!(
            set(&["a=1"], false, None).expect_err("no why").exit_code(),
            2
        );
        let bad_scope = request(&SettingsCommand::Clear {
            scope: "machines/ace".into(),
            why: Some("w".into()),
            json: false,
        });
        assert_eq!(bad_scope.expect_err("bad scope").exit_code(), 2);
    }

    #[test]
    fn g6_settings_set_with_a_repeated_key_or_a_control_character_is_refused_before_sending() {
        // Issue 9: `settings set mesh a=1 a=2` does not let the last win, and a tab, newline or
        // ESC never reaches a replica; each is bad input (exit 2) in one line naming the key.
        for (words, names) in [
            (&["a=1", "a=2"][..], "`a` is given twice"),
            (&["a=x\ny"], "control character (U+000A)"),
            (&["a=\u{1b}[31m"], "control character (U+001B)"),
            (&["k\tey=1"], "`k\\tey`"),
        ] {
            let e = set(words, false, Some("w")).expect_err("refused");
            assert_eq!(e.exit_code(), 2, "{words:?}");
            let line = e.to_string();
            assert!(line.contains(names), "{line}");
            assert_eq!(line.lines().count(), 1, "{line}");
        }
    }
}
