//! How `meshd` and `mesh-host` write their own log lines: text for a person, with ANSI colours only
//! when stderr is a terminal (a log file never gets escape codes), or one JSON object per line
//! (`--log-format json`) for a log collector. The level comes from `RUST_LOG` (default `info`).

use std::io::IsTerminal;

/// The `--log-format` of `meshd` and `mesh-host`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// One line per event for a person; coloured only on a terminal.
    #[default]
    Text,
    /// One JSON object per line: `timestamp`, `level`, `target`, `fields` (the message and the
    /// structured fields) and the current `span`.
    Json,
}

/// Installs the process's log subscriber, writing to stderr in `format`.
pub fn init(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(filter);
    match format {
        LogFormat::Text => builder.with_ansi(colour_wanted()).init(),
        LogFormat::Json => builder.json().with_current_span(true).init(),
    }
}

/// Colours only for a person at a terminal, and never when `NO_COLOR` is set (no-color.org).
fn colour_wanted() -> bool {
    std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty())
}
