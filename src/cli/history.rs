//! `meshctl history`: every model apply, send and settings change, oldest first, with why, who,
//! when and epoch.

use std::path::Path;

use super::json;
use super::render::{self, Via};
use super::{CliError, JsonArgs, Output};
use crate::controller::api::{Body, HistoryItem, Request};
use crate::store::command::{ModelChange, SendRecord, SettingsChange};

pub fn run(ctx: Option<&Path>, args: &JsonArgs) -> Result<Output, CliError> {
    let (via, body) = render::ask(ctx, &Request::History)?;
    let Body::History(items) = body else {
        return Err(render::unexpected(via, "history", &body));
    };
    if args.json {
        return json::output(Some(via), json::HistoryJson::new(&items), super::exit_done);
    }
    Ok(Output::done(render_text(via, &items)))
}

/// The lines `history` prints.
pub fn render_text(via: Via, items: &[HistoryItem]) -> String {
    let mut out = String::new();
    if items.is_empty() {
        out.push_str("no model applies, sends or settings changes yet\n");
    }
    for item in items {
        match item {
            HistoryItem::Send(s) => out.push_str(&send_line(s)),
            HistoryItem::Settings(c) => out.push_str(&settings_line(c)),
            HistoryItem::Model(m) => out.push_str(&model_line(m)),
        }
    }
    out.push_str(&via.note());
    out
}

fn send_line(s: &SendRecord) -> String {
    let moves = if s.moves.is_empty() {
        String::new()
    } else {
        format!(" moves {}", s.moves.join(","))
    };
    format!(
        "{}  epoch {}  send {} #{} {}{moves}  by {}: {}\n",
        render::time_ms(s.time_ms),
        s.epoch,
        s.machine,
        s.sequence,
        s.digest.short(),
        s.actor,
        s.why
    )
}

fn model_line(m: &ModelChange) -> String {
    let changed = if m.changes.is_empty() {
        "no machine's should-be changed".to_string()
    } else {
        format!("should-be changed on {}", render::list(&m.changes))
    };
    format!(
        "{}  epoch {}  model revision {} applied ({changed})  by {}: {}\n",
        render::time_ms(m.time_ms),
        m.epoch,
        m.revision,
        m.actor,
        m.why
    )
}

fn settings_line(c: &SettingsChange) -> String {
    let what = match (&c.before, &c.after) {
        (None, _) => "created",
        (Some(_), None) => "cleared",
        (Some(_), Some(_)) => "changed",
    };
    let keys = |l: &Option<crate::core::settings::Layer>| {
        l.as_ref()
            .map(|l| l.keys().cloned().collect::<Vec<_>>())
            .unwrap_or_default()
    };
    format!(
        "{}  epoch {}  settings {} {what} (keys before: {}; after: {})  by {}: {}\n",
        render::time_ms(c.time_ms),
        c.epoch,
        c.scope,
        render::list(&keys(&c.before)),
        render::list(&keys(&c.after)),
        c.actor,
        c.why
    )
}
