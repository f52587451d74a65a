//! `meshctl status --watch [--interval-ms N]`: `status` drawn again every interval until Ctrl-C
//! (issue 25 item 5). On a terminal each drawing clears the screen first; piped, drawings follow
//! each other (with `--json`, one document a line). A failed ask (the cluster unreachable for a
//! moment, an election) is drawn as an error line with its time and asked again at the next
//! interval: a watch is never ended by the cluster, only by Ctrl-C (exit 0) or a closed stdout.
//! An argument that cannot work (an interval out of bounds, a machine not in the mesh) ends it
//! with exit 2 like any usage error.

use std::io::{IsTerminal, Write as _};
use std::path::Path;
use std::time::Duration;

use super::{StatusArgs, keep_only, render_text};
use crate::cli::context::{self, Context};
use crate::cli::json::{self, StatusJson};
use crate::cli::render::{self, Via};
use crate::cli::{CliError, Output, client, exit_bad_input, exit_done};
use crate::controller::api::{Body, Request, StatusView};

/// `--interval-ms` when not given.
pub const watch_interval_ms_default: u64 = 2_000;
/// Shortest `--interval-ms`: each drawing asks a replica, which probes its peers.
pub const watch_interval_ms_min: u64 = 500;
/// Longest `--interval-ms`.
pub const watch_interval_ms_max: u64 = 60_000;
/// Longest one ask of a drawing may take before it is drawn as an error (the client dials every
/// replica at once, decision 0314, so a dead one costs nothing while another answers).
pub const watch_ask_ms_max: u64 = 10_000;

/// Clears a terminal and puts the cursor top left (ANSI: cursor home, erase display).
const clear_screen: &str = "\x1b[H\x1b[2J";

pub fn run(ctx: Option<&Path>, args: &StatusArgs) -> Result<Output, CliError> {
    if !(watch_interval_ms_min..=watch_interval_ms_max).contains(&args.interval_ms) {
        return Err(CliError::Usage(format!(
            "--interval-ms {} is out of range; give {watch_interval_ms_min} to {watch_interval_ms_max}",
            args.interval_ms
        )));
    }
    let context = context::resolve(ctx)?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| CliError::Client(client::ClientError::Runtime(e)))?;
    runtime.block_on(async {
        tokio::select! {
            ended = draw_until_closed(context, args) => ended,
            // Ctrl-C is how a watch is meant to end: done, exit 0.
            _ = tokio::signal::ctrl_c() => Ok(Output::done(String::new())),
        }
    })
}

/// Draws every interval until stdout closes (or a usage error).
async fn draw_until_closed(context: Context, args: &StatusArgs) -> Result<Output, CliError> {
    let terminal = std::io::stdout().is_terminal() && !args.json;
    let interval = Duration::from_millis(args.interval_ms);
    let mut tick = tokio::time::interval(interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let asked = tokio::time::timeout(
            Duration::from_millis(watch_ask_ms_max),
            ask(&context, &args.machines),
        )
        .await;
        let now_ms = crate::controller::service::now_ms();
        let body = match asked {
            Ok(Ok((via, view))) if args.json => json::document(Some(via), StatusJson::from(&view))?,
            Ok(Ok((via, view))) => format!("{}{}", render_text(&view), via.note()),
            Ok(Err(e)) if e.exit_code() == exit_bad_input => return Err(e),
            Ok(Err(e)) if args.json => json::error_document(&e),
            Ok(Err(e)) => format!("meshctl: {e}\n"),
            Err(_) if args.json => {
                json::error_document(&CliError::Api(crate::controller::api::ApiError::Timeout {
                    what: "status".into(),
                    waited_ms: watch_ask_ms_max,
                }))
            }
            Err(_) => format!("meshctl: no answer to status within {watch_ask_ms_max} ms\n"),
        };
        let text = frame(&body, now_ms, args.interval_ms, terminal, args.json);
        let mut out = std::io::stdout();
        if out.write_all(text.as_bytes()).is_err() || out.flush().is_err() {
            return Ok(Output {
                text: String::new(),
                code: exit_done,
            });
        }
    }
}

async fn ask(context: &Context, machines: &[String]) -> Result<(Via, StatusView), CliError> {
    let answer = client::ask_async(context, &Request::Status).await?;
    let (via, body) = render::split(answer)?;
    let Body::Status(mut view) = body else {
        return Err(render::unexpected(via, "status", &body));
    };
    keep_only(&mut view, machines)?;
    Ok((via, view))
}

/// One drawing: on a terminal the screen cleared first, then a line saying when it was drawn and
/// how often, then `body`; piped, a blank line between drawings instead of the clearing; with
/// `--json` the document alone (one a line).
pub fn frame(body: &str, now_ms: u64, interval_ms: u64, terminal: bool, json: bool) -> String {
    if json {
        return body.to_string();
    }
    let head = format!(
        "{} · every {:.1} s · Ctrl-C ends\n",
        render::time_ms(now_ms),
        interval_ms as f64 / 1000.0
    );
    if terminal {
        format!("{clear_screen}{head}{body}")
    } else {
        format!("\n{head}{body}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_watch_clears_the_screen_only_on_a_terminal_and_says_when_it_drew() {
        // Issue 25 item 5: `status --watch` redraws; escape codes only where a terminal reads them.
        let body = "model revision 3, epoch floor 2\n";
        let on_terminal = frame(body, 1_764_770_000_000, 2_000, true, false);
        assert!(on_terminal.starts_with(clear_screen), "{on_terminal:?}");
        assert!(on_terminal.contains("every 2.0 s"), "{on_terminal:?}");
        assert!(on_terminal.contains("2025-12-03"), "{on_terminal:?}");
        assert!(on_terminal.ends_with(body), "{on_terminal:?}");
        let piped = frame(body, 1_764_770_000_000, 2_000, false, false);
        assert!(!piped.contains('\x1b'), "{piped:?}");
        assert!(piped.ends_with(body), "{piped:?}");
        let json = frame("{}\n", 1, 2_000, false, true);
        assert_eq!(json, "{}\n");
    }
}
