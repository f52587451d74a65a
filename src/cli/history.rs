//! `meshctl history`: model applies, sends and settings changes, oldest first, with why, who,
//! when and epoch; `--limit`, `--since` and `--machine` narrow it. Read page by page, so no
//! answer outgrows a frame however long the history is.

use std::path::Path;

use super::json;
use super::render::{self, Via};
use super::{CliError, Output};
use crate::controller::api::{
    Body, HistoryItem, HistoryPage, HistoryQuery, Request, history_page_items_max,
};
use crate::store::command::{ModelChange, SendRecord, SettingsChange};

/// Most pages one `history` reads: with full pages, ten million entries.
pub const history_pages_max: u64 = 10_000;

#[derive(Debug, clap::Args)]
pub struct HistoryArgs {
    /// Show only the newest N entries.
    #[arg(long, value_name = "N")]
    pub limit: Option<u64>,
    /// Show only entries at or after TIME: RFC 3339 (`2026-12-01T07:00:00Z`) or an age
    /// (`90s`, `30m`, `2h`, `3d`).
    #[arg(long, value_name = "TIME", value_parser = parse_since)]
    pub since: Option<u64>,
    /// Show only the sends to this machine.
    #[arg(long, value_name = "MACHINE")]
    pub machine: Option<String>,
    /// Print the answer as JSON.
    #[arg(long)]
    pub json: bool,
}

pub fn run(ctx: Option<&Path>, args: &HistoryArgs) -> Result<Output, CliError> {
    if args.limit == Some(0) {
        // "Nothing yet" for `--limit 0` would read as an empty history.
        return Err(CliError::Usage(
            "--limit 0 would show no entry; give --limit 1 or more, or leave it out for the whole history".to_string(),
        ));
    }
    let query = HistoryQuery {
        since_ms: args.since,
        machine: args.machine.clone(),
        ..Default::default()
    };
    let (via, items) = newest_pages(ctx, query, args.limit)?;
    if let (Some(machine), true) = (&args.machine, items.is_empty()) {
        machine_known(ctx, machine)?;
    }
    if args.json {
        return json::output(Some(via), json::HistoryJson::new(&items), super::exit_done);
    }
    Ok(Output::done(render_text(via, &items)))
}

/// `--machine M` with nothing to show: fine for a machine of the model (never sent yet) or one
/// that had sends once (since removed); any other name is a typo, refused naming the known ones.
fn machine_known(ctx: Option<&Path>, machine: &str) -> Result<(), CliError> {
    let ever = HistoryQuery {
        machine: Some(machine.to_string()),
        ..Default::default()
    };
    let (_, sends) = page(ctx, &ever)?;
    if sends.total > 0 {
        return Ok(());
    }
    let (via, body) = render::ask(ctx, &Request::Status)?;
    let Body::Status(view) = body else {
        return Err(render::unexpected(via, "status", &body));
    };
    let known: Vec<String> = view.machines.iter().map(|m| m.name.clone()).collect();
    if known.iter().any(|k| k == machine) {
        return Ok(());
    }
    Err(unknown_machine(machine, &known))
}

/// A machine name neither in the model nor in the history: the known names and where to see them.
pub fn unknown_machine(machine: &str, known: &[String]) -> CliError {
    let known = if known.is_empty() {
        "the mesh has no machines".to_string()
    } else {
        format!("the machines are {}", render::list_capped(known))
    };
    CliError::Usage(format!(
        "there is no machine {machine} in the mesh and none of that name was ever sent to; {known}; `meshctl status` lists them"
    ))
}

/// Every item `query` matches, oldest first, read page by page.
pub fn all_pages(
    ctx: Option<&Path>,
    query: HistoryQuery,
) -> Result<(Via, Vec<HistoryItem>), CliError> {
    newest_pages(ctx, query, None)
}

/// The newest `newest` items `query` matches (all without it), oldest first, page by page.
fn newest_pages(
    ctx: Option<&Path>,
    mut query: HistoryQuery,
    newest: Option<u64>,
) -> Result<(Via, Vec<HistoryItem>), CliError> {
    query.offset = 0;
    query.limit = 0;
    let (mut via, first) = page(ctx, &query)?;
    let total = first.total;
    query.offset = match newest {
        Some(n) => total.saturating_sub(n),
        None => 0,
    };
    query.limit = history_page_items_max;
    let mut items: Vec<HistoryItem> = Vec::new();
    // Page by page: every answer stays under a frame however long the history is.
    let mut read_all = false;
    for _ in 0..history_pages_max {
        if query.offset >= total {
            read_all = true;
            break;
        }
        let (answered, got) = page(ctx, &query)?;
        via = answered;
        if got.items.is_empty() {
            read_all = true;
            break;
        }
        query.offset += got.items.len() as u64;
        items.extend(got.items);
    }
    if !read_all && query.offset < total {
        // Never a silent part of the answer: ten million entries is past what one read prints.
        return Err(CliError::Usage(format!(
            "the history has {total} entries matching, more than {history_pages_max} pages of {history_page_items_max} (history_pages_max); narrow it with --since, --machine or --limit"
        )));
    }
    Ok((via, items))
}

fn page(ctx: Option<&Path>, query: &HistoryQuery) -> Result<(Via, HistoryPage), CliError> {
    let request = Request::History {
        query: query.clone(),
    };
    let (via, body) = render::ask(ctx, &request)?;
    match body {
        Body::History(page) => Ok((via, page)),
        other => Err(render::unexpected(via, "history", &other)),
    }
}

/// `--since`: RFC 3339, or an age before now, as milliseconds since the Unix epoch.
pub fn parse_since(text: &str) -> Result<u64, String> {
    let text = text.trim();
    let bad = || {
        format!(
            "`{text}` is neither an RFC 3339 time (2026-12-01T07:00:00Z) nor an age (90s, 30m, 2h, 3d)"
        )
    };
    if let Ok(t) = time::OffsetDateTime::parse(text, &time::format_description::well_known::Rfc3339)
    {
        let ms = t.unix_timestamp_nanos() / 1_000_000;
        return u64::try_from(ms).map_err(|_| bad());
    }
    let split = text.find(|c: char| !c.is_ascii_digit()).ok_or_else(bad)?;
    let (digits, unit) = text.split_at(split);
    let n: u64 = digits.parse().map_err(|_| bad())?;
    let unit_ms: u64 = match unit {
        "s" => 1_000,
        "m" => 60_000,
        "h" => 3_600_000,
        "d" => 86_400_000,
        _ => return Err(bad()),
    };
    let age = n.checked_mul(unit_ms).ok_or_else(bad)?;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_err(|e| format!("the system clock is before 1970: {e}"))?;
    Ok((now.as_millis() as u64).saturating_sub(age))
}

/// The lines `history` prints.
pub fn render_text(via: Via, items: &[HistoryItem]) -> String {
    let mut out = String::new();
    if items.is_empty() {
        out.push_str("no model applies, sends, settings changes or revocations yet\n");
    }
    for item in items {
        match item {
            HistoryItem::Send(s) => out.push_str(&send_line(s)),
            HistoryItem::Settings(c) => out.push_str(&settings_line(c)),
            HistoryItem::Model(m) => out.push_str(&model_line(m)),
            HistoryItem::Revocation(r) => out.push_str(&revocation_line(r)),
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

fn revocation_line(r: &crate::store::revoked::DenyEntry) -> String {
    let what = match crate::store::revoked::retired_replica(&r.target) {
        Some(id) => format!("replica {id} retired (its key and certificate)"),
        None => format!("{} revoked", r.target),
    };
    format!(
        "{}  epoch {}  {what}  by {}: {}\n",
        render::time_ms(r.time_ms),
        r.epoch,
        r.actor,
        r.why
    )
}

fn model_line(m: &ModelChange) -> String {
    let changed = if m.changes.is_empty() {
        "no machine's should-be changed".to_string()
    } else {
        format!("should-be changed on {}", render::list_capped(&m.changes))
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
            // allow(empty-on-error): a layer that did not exist has no keys
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
