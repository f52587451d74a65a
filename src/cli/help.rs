//! `meshctl help [TOPIC|COMMAND...]` and `meshctl completions SHELL`: help topics that are not a
//! command (exit codes, the context file) and shell completion scripts generated from the same
//! clap definition the parser uses, so they cannot drift from the real options.

use clap::CommandFactory;

use super::context::{
    context_default_path, context_env, context_file_bytes_max, context_replicas_max,
};
use super::{
    Cli, CliError, exit_bad_input, exit_diff_failed, exit_done, exit_failed, exit_held,
    exit_module_failed, exit_wait_timeout,
};

/// The help topics, with a one-line summary each.
pub const topics: [(&str, &str); 2] = [
    ("exit-codes", "what each exit code of meshctl means"),
    (
        "context",
        "where meshctl finds the replicas and the operator's identity",
    ),
];

#[derive(Debug, Clone, clap::Args)]
pub struct HelpArgs {
    /// A topic (`exit-codes`, `context`) or a command, e.g. `push` or `settings set`; none
    /// prints the overview.
    #[arg(value_name = "TOPIC|COMMAND")]
    pub words: Vec<String>,
}

#[derive(Debug, Clone, clap::Args)]
pub struct CompletionsArgs {
    /// The shell to write a completion script for.
    #[arg(value_enum)]
    pub shell: Shell,
}

/// The shells `meshctl completions` writes scripts for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Shell {
    Bash,
    Zsh,
    Fish,
}

/// The completion script for `shell`, for `meshctl` as the command name.
pub fn completions(shell: Shell) -> Result<String, CliError> {
    let shell = match shell {
        Shell::Bash => clap_complete::Shell::Bash,
        Shell::Zsh => clap_complete::Shell::Zsh,
        Shell::Fish => clap_complete::Shell::Fish,
    };
    let mut out = Vec::new();
    clap_complete::generate(shell, &mut Cli::command(), "meshctl", &mut out);
    String::from_utf8(out)
        .map_err(|e| CliError::Render(format!("the completion script is not UTF-8: {e}")))
}

/// What `meshctl help WORDS` prints: a topic, a command's long help, or the overview.
pub fn help(args: &HelpArgs) -> Result<String, CliError> {
    match args.words.first().map(String::as_str) {
        Some("exit-codes") if args.words.len() == 1 => return Ok(exit_codes_text()),
        Some("context") if args.words.len() == 1 => return Ok(context_text()),
        _ => {}
    }
    let mut root = Cli::command();
    root.build();
    let mut command = &mut root;
    for word in &args.words {
        let known: Vec<String> = command
            .get_subcommands()
            .map(|c| c.get_name().to_string())
            .collect();
        let Some(sub) = command.find_subcommand_mut(word) else {
            let names: Vec<&str> = topics.iter().map(|(t, _)| *t).collect();
            return Err(CliError::Usage(format!(
                "no help topic or command `{}`; topics: {}; commands: {}",
                args.words.join(" "),
                names.join(", "),
                known.join(", ")
            )));
        };
        command = sub;
    }
    let mut text = command.render_long_help().to_string();
    if args.words.is_empty() {
        text.push_str("\nHelp topics (`meshctl help <topic>`):\n");
        for (topic, about) in topics {
            text.push_str(&format!("  {topic:12}  {about}\n"));
        }
    }
    Ok(text)
}

/// `meshctl help exit-codes`.
pub fn exit_codes_text() -> String {
    let changes = super::plan::exit_changes;
    format!(
        "Exit codes of meshctl

  {exit_done}  done: the command did what it was asked.
  {exit_failed}  failed: a replica, a host or the network failed; for push, a send was not
     confirmed applied (failed, refused by the host, or sent without a readable answer).
  {exit_bad_input}  bad usage or input: arguments, a file, a context, or a request a replica found
     invalid (unknown machine, module or scope). Nothing was changed.
  {exit_held}  held: a machine was not sent because a running module's mount would move; run
     `meshctl push <machine> --move <module> --why ...` to accept the move.
  {exit_module_failed}  push --wait: a module failed on a machine the push sent to.
  {exit_wait_timeout}  push --wait: a machine did not report its modules ready before the timeout.
  {changes}  plan --detailed-exitcode: the push would change something (0 when it would not).

`meshctl diff -f FILE` exits as `kubectl diff` does: {exit_done} when an apply of the file would store
nothing, {exit_failed} when it would store a new model (the differences are printed), {exit_diff_failed} on any error
(a bad file, no replica, a refusal). `meshctl apply` of a file the store already has exits {exit_done}
and says `unchanged`: no revision is stored.

When several apply to one push, the first of {exit_failed}, {exit_module_failed}, {exit_wait_timeout}, {exit_held} wins.
status --watch and events --follow run until Ctrl-C, which ends them with {exit_done}; they go on
through a cluster unreachable for a while (saying so), and end early only on bad usage
({exit_bad_input}) or, for events, a certificate whose role may not ask ({exit_failed}).
With --json the exit code is the same, and an error is printed on stdout as
{{\"schema\": \"mesh/v1\", \"error\": {{\"kind\", \"cause\", \"exit_code\", \"message\"}}}} (see docs/json.md).
"
    )
}

/// `meshctl help context`.
pub fn context_text() -> String {
    format!(
        "The context file

A context tells meshctl which replicas to ask and who the operator is. meshctl uses the
first of:
  1. --context FILE
  2. the file named by the environment variable {context_env}
  3. ./{context_default_path} (relative to the current directory)

`meshctl init` and `meshctl dev` write one. It looks like this:

  [replicas]
  1 = \"127.0.0.1:7101\"
  2 = \"127.0.0.1:7102\"

  [tls]
  ca = \"ca.pem\"
  cert = \"operator/cert.pem\"
  key = \"operator/key.pem\"

Every replica is dialled at once and asked in the order their handshakes complete, until
one answers; any replica will do, a follower forwards to the leader. `--timeout` (default 60s)
bounds each request, handshakes included. The certificate must name the operator (operator:<name>). Relative paths are
relative to the directory of the context file, so a context moves with its certificates.
A context lists at most {context_replicas_max} replicas and is at most {context_file_bytes_max} bytes.
"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn help_names_an_unknown_topic_and_lists_the_real_ones() {
        let args = HelpArgs {
            words: vec!["nosuch".into()],
        };
        let e = help(&args).expect_err("unknown topic");
        assert_eq!(e.exit_code(), exit_bad_input);
        let line = e.to_string();
        assert!(
            line.contains("exit-codes") && line.contains("push"),
            "{line}"
        );
    }
}
