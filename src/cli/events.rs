//! `meshctl events [--follow] [--machine M] [--limit N] [--json]`: what happened to the fleet, from
//! the leader's event log (decision 0308), through any replica (a follower forwards, G13). Without
//! `--follow` it prints every event the leader keeps (or the newest N), paged, and says how many it
//! left out; with `--follow` it then asks for the events after the last one it printed, each ask
//! waiting on the leader up to [`events_wait_ms_max`] for the next event (a long poll: an event is
//! printed as soon as the leader notes it). A follow outlives a leader change: an ask that fails is
//! asked again of the replicas (all dialled at once, decision 0314) every [`follow_retry_ms`], and a
//! new leader's first page says that events between may have been lost. It runs until Ctrl-C,
//! which ends it with exit 0.

use std::io::Write as _;
use std::path::Path;
use std::time::Duration;

use super::context::{self, Context};
use super::json::{self, EventFollowJson, EventJson, EventsJson, GapJson};
use super::render::{self, Via};
use super::{CliError, Output, client};
use crate::controller::api::{Body, Request};
use crate::controller::events::{
    Event, EventCursor, EventsFrom, EventsGap, EventsPage, EventsQuery, events_kept_max,
    events_page_max, events_wait_ms_max,
};

/// Pause before asking again when an ask of `--follow` failed (no leader, a replica down).
pub const follow_retry_ms: u64 = 500;
/// Longest one ask of `--follow` may take beyond the leader's wait before it is given up and asked
/// again, starting with another replica: a leader that died while it held the ask is noticed in
/// this long, not at QUIC's idle timeout. Asking again is harmless (a read).
pub const follow_answer_slack_ms: u64 = 2_000;

#[derive(Debug, Clone, clap::Args)]
pub struct EventsArgs {
    /// Keep printing events as they happen, until Ctrl-C; carries on across a leader change.
    #[arg(long)]
    pub follow: bool,
    /// Only this machine's events.
    #[arg(long, value_name = "MACHINE")]
    pub machine: Option<String>,
    /// Print only the newest N events (1 to 1000, the most the leader keeps); says how many
    /// earlier ones it left out.
    #[arg(long, value_name = "N")]
    pub limit: Option<u32>,
    /// Print JSON: one document (with `--follow`, one document a line per event or gap).
    #[arg(long)]
    pub json: bool,
}

pub fn run(ctx: Option<&Path>, args: &EventsArgs) -> Result<Output, CliError> {
    if let Some(n) = args.limit
        && (n == 0 || n as usize > events_kept_max)
    {
        return Err(CliError::Usage(format!(
            "--limit {n} is out of range; give 1 to {events_kept_max} (the most events the leader keeps)"
        )));
    }
    let context = context::resolve(ctx)?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| CliError::Client(client::ClientError::Runtime(e)))?;
    runtime.block_on(async {
        if args.follow {
            tokio::select! {
                ended = follow(context, args) => ended,
                // Ctrl-C is how a follow is meant to end: done, exit 0.
                _ = tokio::signal::ctrl_c() => Ok(Output::done(String::new())),
            }
        } else {
            list(&context, args).await
        }
    })
}

/// Where the first page starts: the newest N with `--limit`, else the oldest kept.
fn first_from(args: &EventsArgs) -> EventsFrom {
    match args.limit {
        Some(n) => EventsFrom::Newest(n),
        None => EventsFrom::Oldest,
    }
}

fn query(args: &EventsArgs, from: EventsFrom, wait_ms: u64) -> EventsQuery {
    EventsQuery {
        from,
        machine: args.machine.clone(),
        limit: events_page_max,
        wait_ms,
    }
}

/// One ask through the context's replicas.
async fn ask(context: &Context, query: EventsQuery) -> Result<(Via, EventsPage), CliError> {
    let answer = client::ask_async(context, &Request::Events { query }).await?;
    let (via, body) = render::split(answer)?;
    match body {
        Body::Events(page) => Ok((via, page)),
        other => Err(render::unexpected(via, "events", &other)),
    }
}

/// Every event kept (or the newest N), page after page, then printed at once.
async fn list(context: &Context, args: &EventsArgs) -> Result<Output, CliError> {
    // Read again from the start when the leader changed while paging, a few times at most.
    for _ in 0..list_attempts_max {
        if let Some(output) = list_once(context, args).await? {
            return Ok(output);
        }
    }
    Err(CliError::Api(crate::controller::api::ApiError::Timeout {
        what: format!(
            "reading the events ({list_attempts_max} times, the leader changed each time)"
        ),
        waited_ms: 0,
    }))
}

/// How many times `events` reads the log from its start when the leader changes while it pages.
const list_attempts_max: usize = 3;

/// One read of the whole log; `None` when the leader changed while paging.
async fn list_once(context: &Context, args: &EventsArgs) -> Result<Option<Output>, CliError> {
    let (mut via, first) = ask(context, query(args, first_from(args), 0)).await?;
    let (term, earlier) = (first.term, first.earlier);
    let mut events = first.events;
    let mut page = (first.more, first.next);
    // The log holds at most `events_kept_max`: a bounded number of pages, plus one.
    let pages_max = events_kept_max / events_page_max as usize + 2;
    for _ in 0..pages_max {
        let (more, next) = page;
        if !more {
            break;
        }
        let (v, p) = ask(context, query(args, EventsFrom::After(next), 0)).await?;
        if p.term != term {
            // The leader changed while paging: never mix two terms' logs.
            return Ok(None);
        }
        via = v;
        events.extend(p.events);
        page = (p.more, p.next);
    }
    if args.json {
        let answer = EventsJson {
            term,
            earlier,
            events: events.iter().map(|e| EventJson::new(term, e)).collect(),
        };
        return json::output(Some(via), answer, super::exit_done).map(Some);
    }
    let mut text = String::new();
    if events.is_empty() {
        let of = match &args.machine {
            Some(m) => format!(" of {m}"),
            None => String::new(),
        };
        text.push_str(&format!(
            "no events{of} kept by the leader in term {term}\n"
        ));
    } else {
        text.push_str(&header());
        for e in &events {
            text.push_str(&event_line(e));
        }
    }
    if earlier > 0 {
        text.push_str(&format!(
            "({earlier} earlier events kept by the leader are not shown; a larger --limit shows them)\n"
        ));
    }
    text.push_str(&format!(
        "(the leader, replica {}, keeps the events of its term {term} in memory, at most {events_kept_max}: earlier terms' are not kept)\n",
        via.replica
    ));
    text.push_str(&via.note());
    Ok(Some(Output::done(text)))
}

/// `--follow`: prints the first page, then every event after it as it comes, until Ctrl-C or a
/// closed stdout. Fails only on a refusal the operator must fix (a bad machine, a role).
async fn follow(context: Context, args: &EventsArgs) -> Result<Output, CliError> {
    let mut out = std::io::stdout();
    let mut cursor: Option<EventCursor> = None;
    let mut first = true;
    let wait = Duration::from_millis(events_wait_ms_max + follow_answer_slack_ms);
    loop {
        let from = match cursor {
            Some(c) => EventsFrom::After(c),
            None => first_from(args),
        };
        let asked =
            tokio::time::timeout(wait, ask(&context, query(args, from, events_wait_ms_max)));
        let (via, page) = match asked.await {
            Ok(Ok(answer)) => answer,
            Ok(Err(e)) if e.exit_code() == super::exit_bad_input || refused(&e) => return Err(e),
            Ok(Err(e)) => {
                eprintln!("meshctl events: {e}; asking again in {follow_retry_ms} ms");
                tokio::time::sleep(Duration::from_millis(follow_retry_ms)).await;
                continue;
            }
            Err(_) => {
                eprintln!(
                    "meshctl events: no answer within {} ms; asking again",
                    wait.as_millis()
                );
                continue;
            }
        };
        let text = follow_text(args.json, via, &page, first)?;
        first = false;
        // A closed stdout (piped into `head`) ends the follow.
        if out.write_all(text.as_bytes()).is_err() || out.flush().is_err() {
            return Ok(Output::done(String::new()));
        }
        cursor = Some(page.next);
    }
}

/// Whether an error is a refusal that asking again cannot cure (a role too low).
fn refused(e: &CliError) -> bool {
    matches!(e, CliError::Api(api) if api.cause() == "forbidden")
        || matches!(e, CliError::Client(client::ClientError::Refused { .. }))
}

/// What one page of `--follow` prints.
fn follow_text(json: bool, via: Via, page: &EventsPage, first: bool) -> Result<String, CliError> {
    let mut text = String::new();
    if json {
        if let Some(gap) = &page.gap {
            let gap = GapJson::new(page.term, gap);
            text.push_str(&json::document(Some(via), EventFollowJson::Gap { gap })?);
        }
        for e in &page.events {
            let event = EventJson::new(page.term, e);
            text.push_str(&json::document(
                Some(via),
                EventFollowJson::Event { event },
            )?);
        }
        return Ok(text);
    }
    if first {
        text.push_str(&header());
        if page.earlier > 0 {
            text.push_str(&format!(
                "({} earlier events kept by the leader are not shown)\n",
                page.earlier
            ));
        }
    }
    if let Some(gap) = &page.gap {
        text.push_str(&gap_line(page.term, gap));
    }
    for e in &page.events {
        text.push_str(&event_line(e));
    }
    Ok(text)
}

fn header() -> String {
    format!("{:20}  {:16}  {:16}  WHAT\n", "TIME (UTC)", "KIND", "WHERE")
}

/// One event as a line: time, kind, machine[/module], text.
pub fn event_line(e: &Event) -> String {
    let place = match (&e.machine, &e.module) {
        (Some(m), Some(module)) => format!("{m}/{module}"),
        (Some(m), None) => m.clone(),
        _ => "-".to_string(),
    };
    format!(
        "{:20}  {:16}  {:16}  {}\n",
        render::time_ms(e.at_ms),
        e.kind.word(),
        place,
        e.text
    )
}

/// What a follow prints where it could not see everything.
pub fn gap_line(now_term: u64, gap: &EventsGap) -> String {
    match gap {
        EventsGap::OlderTerm { term } => format!(
            "-- the leader changed (term {term} to {now_term}): events between the last one shown and the new leader taking office may be lost --\n"
        ),
        EventsGap::Dropped { count } => format!(
            "-- {count} events were dropped from the leader's bounded log before they were read --\n"
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controller::events::EventKind;

    #[test]
    fn an_event_line_names_its_place_and_a_gap_says_events_may_be_lost() {
        // Issue 25 item 5: `events` prints time, kind, machine/module and the line; a follow
        // across a leader change says what it may have missed rather than skip it silently.
        let crash = Event {
            index: 4,
            at_ms: 1_764_770_000_000,
            kind: EventKind::ModuleFailed,
            machine: Some("g14".into()),
            module: Some("broker".into()),
            text: "broker failed (signal 9): killed by signal 9".into(),
        };
        let line = event_line(&crash);
        assert!(
            line.starts_with("2025-12-03 13:53:20Z  module-failed"),
            "{line}"
        );
        assert!(line.contains("  g14/broker  "), "{line}");
        assert!(line.ends_with("killed by signal 9\n"), "{line}");
        let office = Event {
            machine: None,
            module: None,
            kind: EventKind::TookOffice,
            ..crash
        };
        assert!(
            event_line(&office).contains("  -  "),
            "{}",
            event_line(&office)
        );
        let gap = gap_line(5, &EventsGap::OlderTerm { term: 4 });
        assert!(
            gap.contains("term 4 to 5") && gap.contains("may be lost"),
            "{gap}"
        );
        let dropped = gap_line(5, &EventsGap::Dropped { count: 7 });
        assert!(dropped.contains("7 events were dropped"), "{dropped}");
    }
}
