//! Rendering shared by the commands that ask a replica: who answered, times, lists (the JSON
//! views are in `json.rs`).

use serde::Serialize;
use std::path::Path;

use super::{CliError, client, context};
use crate::controller::api::{Answer, Body, Request};

/// Who answered a request: the replica that did the work and the one that forwarded it, if any.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Via {
    pub replica: u64,
    pub forwarded_by: Option<u64>,
}

impl Via {
    /// The line a command ends with when a follower forwarded it (G13).
    pub fn note(&self) -> String {
        match self.forwarded_by {
            Some(f) => format!("(forwarded by replica {f})\n"),
            None => String::new(),
        }
    }
}

/// Resolves the context, asks, and splits the answer into who answered and the body; an API error
/// becomes a [`CliError::Api`] with its exit code.
pub fn ask(ctx: Option<&Path>, request: &Request) -> Result<(Via, Body), CliError> {
    let context = context::resolve(ctx)?;
    let answer = client::ask(&context, request)?;
    split(answer)
}

/// Splits an answer into who answered and the body.
pub fn split(answer: Answer) -> Result<(Via, Body), CliError> {
    let via = Via {
        replica: answer.replica,
        forwarded_by: answer.forwarded_by,
    };
    match answer.body {
        Ok(body) => Ok((via, body)),
        Err(e) => Err(CliError::Api(e)),
    }
}

/// The error for a body of the wrong kind.
pub fn unexpected(via: Via, asked: &'static str, got: &Body) -> CliError {
    let got = format!("{got:?}");
    let got: String = got.chars().take(40).collect();
    CliError::Client(client::ClientError::Unexpected {
        replica: via.replica,
        asked,
        got,
    })
}

/// A time in milliseconds since the Unix epoch as `2026-11-30 09:42:57Z`.
pub fn time_ms(ms: u64) -> String {
    let text = crate::timefmt::utc_seconds(ms);
    if text.ends_with(" ms") {
        text
    } else {
        text + "Z"
    }
}

/// `-` for an empty list, else the items joined with `, `.
pub fn list<S: AsRef<str>>(items: &[S]) -> String {
    if items.is_empty() {
        return "-".into();
    }
    items
        .iter()
        .map(|s| s.as_ref())
        .collect::<Vec<_>>()
        .join(", ")
}

/// Most names a one-line list prints before it says how many more there are (`--json` and
/// `meshctl status` carry them all): an apply that puts 5,000 machines behind is one readable line.
pub const names_on_a_line: usize = 20;

/// [`list`] of at most [`names_on_a_line`] items, then "and N more".
pub fn list_capped<S: AsRef<str>>(items: &[S]) -> String {
    if items.len() <= names_on_a_line {
        return list(items);
    }
    format!(
        "{} and {} more",
        list(&items[..names_on_a_line]),
        items.len() - names_on_a_line
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_long_list_of_names_is_capped_and_says_how_many_more() {
        let few: Vec<String> = (0..names_on_a_line).map(|i| format!("m{i}")).collect();
        assert_eq!(list_capped(&few), list(&few));
        let many: Vec<String> = (0..500).map(|i| format!("m{i}")).collect();
        let line = list_capped(&many);
        assert!(line.starts_with("m0, m1, "), "{line}");
        assert!(line.ends_with(", m19 and 480 more"), "{line}");
    }

    #[test]
    fn forwarded_answer_says_which_replica_forwarded() {
        // G13: a follower forwards to the leader and the output says so.
        let via = Via {
            replica: 1,
            forwarded_by: Some(2),
        };
        assert_eq!(via.note(), "(forwarded by replica 2)\n");
        let direct = Via {
            replica: 1,
            forwarded_by: None,
        };
        assert_eq!(direct.note(), "");
    }

    #[test]
    fn times_render_in_utc() {
        assert_eq!(time_ms(0), "1970-01-01 00:00:00Z");
        assert_eq!(time_ms(1_000_061_000), "1970-01-12 13:47:41Z");
    }
}
