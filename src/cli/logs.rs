//! `meshctl logs <machine> [<module>] [--follow] [--lines N]`: module output, read by the machine's
//! mesh-host and relayed by a replica (operators never dial hosts; `MessageKind::Logs` only
//! replicas may send, G10). Without `--follow` it prints the last N lines of each stream of each
//! module asked for, stdout then stderr (the two files carry no common clock, so they are not
//! interleaved); with `--follow` it then asks again from where each stream ended, every
//! [`follow_poll_ms`] (at once while the host says more is waiting), until interrupted. Every
//! answer is bounded by the host in lines and bytes. Each ask is one request (a fresh connection
//! to a replica of the context, as every meshctl command), so a follow survives a replica
//! restarting.

use std::io::Write as _;
use std::path::Path;
use std::time::Duration;

use super::context::{self, Context};
use super::render::{self, Via};
use super::{CliError, Output, client};
use crate::controller::api::{Body, Request};
use crate::core::wire::{LogChunk, LogCursor, LogStream, LogsAnswer, LogsAsk, log_lines_max};

/// Lines per stream when `--lines` is not given.
pub const lines_default: u32 = 100;
/// Pause between two asks of `--follow` when nothing more is waiting.
pub const follow_poll_ms: u64 = 1_000;

#[derive(Debug, clap::Args)]
pub struct LogsArgs {
    /// The machine whose modules to read.
    pub machine: String,
    /// One module (default: every module of the machine's declaration in force).
    pub module: Option<String>,
    /// Keep printing new lines as the modules write them, until Ctrl-C.
    #[arg(long, short = 'f')]
    pub follow: bool,
    /// How many of the last lines of each stream to print first (1 to 10000).
    #[arg(long, short = 'n', value_name = "N", default_value_t = lines_default)]
    pub lines: u32,
    /// Print one JSON document per line of output (`{"kind": "line", "module", "stream",
    /// "line"}` as its answer), as JSON lines.
    #[arg(long)]
    pub json: bool,
}

pub fn run(ctx: Option<&Path>, args: &LogsArgs) -> Result<Output, CliError> {
    if args.lines == 0 || args.lines > log_lines_max {
        return Err(CliError::Usage(format!(
            "--lines {} is out of range; give 1 to {log_lines_max}",
            args.lines
        )));
    }
    let context = context::resolve(ctx)?;
    let mut ask = LogsAsk {
        module: args.module.clone(),
        lines: args.lines,
        from: Vec::new(),
    };
    let (mut via, first) = read(&context, &args.machine, &ask)?;
    if !args.follow {
        let mut text = String::new();
        for chunk in &first.chunks {
            text.push_str(&shown(args.json, via, chunk, false)?);
        }
        return Ok(Output::done(text));
    }
    let mut out = std::io::stdout().lock();
    let mut answer = first;
    // `--lines` is how far back to start; after that every new line is wanted, each answer
    // still bounded by the host's byte budget.
    ask.lines = log_lines_max;
    loop {
        for chunk in &answer.chunks {
            if chunk.rotated && !args.json {
                eprintln!(
                    "meshctl logs: {} {} was rotated; lines written before the rotation since the last read are not shown",
                    chunk.module,
                    chunk.stream.word()
                );
            }
            // A closed stdout (piped into `head`) ends the follow.
            let text = shown(args.json, via, chunk, true)?;
            if out.write_all(text.as_bytes()).is_err() || out.flush().is_err() {
                return Ok(Output::done(String::new()));
            }
        }
        let more = answer.chunks.iter().any(|c| c.more);
        ask.from = cursors(&answer);
        if !more {
            std::thread::sleep(Duration::from_millis(follow_poll_ms));
        }
        (via, answer) = read(&context, &args.machine, &ask)?;
    }
}

/// A chunk as printed: lines of text, or with `--json` one document per line (and, following,
/// one for a rotation, which the text form says on stderr).
fn shown(json: bool, via: Via, chunk: &LogChunk, following: bool) -> Result<String, CliError> {
    if json {
        return super::json::log_documents(via, chunk, following);
    }
    Ok(render_chunk(chunk))
}

/// One ask of the machine's logs through any replica of the context.
fn read(context: &Context, machine: &str, ask: &LogsAsk) -> Result<(Via, LogsAnswer), CliError> {
    let request = Request::Logs {
        machine: machine.to_string(),
        ask: ask.clone(),
    };
    let (via, body) = render::split(client::ask(context, &request)?)?;
    match body {
        Body::Logs(answer) => Ok((via, answer)),
        other => Err(render::unexpected(via, "logs", &other)),
    }
}

/// Where each stream of `answer` ended: the next ask starts there.
pub fn cursors(answer: &LogsAnswer) -> Vec<LogCursor> {
    answer
        .chunks
        .iter()
        .map(|c| LogCursor {
            module: c.module.clone(),
            stream: c.stream,
            offset: c.end,
        })
        .collect()
}

/// A chunk's lines, each as `[module] line` (stdout) or `[module stderr] line`.
pub fn render_chunk(chunk: &LogChunk) -> String {
    let prefix = match chunk.stream {
        LogStream::Stdout => format!("[{}]", chunk.module),
        LogStream::Stderr => format!("[{} stderr]", chunk.module),
    };
    let mut text = String::new();
    for line in &chunk.lines {
        text.push_str(&prefix);
        text.push(' ');
        text.push_str(line);
        text.push('\n');
    }
    text
}
