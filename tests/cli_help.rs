//! Shell habits (issue 13 part 6): every option of every meshctl command is described, no help
//! text shows an internal label such as "(G6)", `meshctl help exit-codes` and `meshctl help
//! context` say what the code does, and `meshctl completions` writes scripts that know the
//! commands and their options.

use clap::{CommandFactory, Parser};
use mesh::cli::Cli;
use mesh::cli::help::{self, HelpArgs, Shell};

/// Every command, with the path of names that leads to it.
fn commands() -> Vec<(String, clap::Command)> {
    let mut root = Cli::command();
    root.build();
    let mut out = Vec::new();
    let mut stack = vec![("meshctl".to_string(), root)];
    while let Some((path, cmd)) = stack.pop() {
        for sub in cmd.get_subcommands() {
            stack.push((format!("{path} {}", sub.get_name()), sub.clone()));
        }
        out.push((path, cmd));
    }
    out
}

/// `G6`, `(G13)`: a guarantee's label belongs in the code and the tests, not in the help.
fn internal_label(text: &str) -> Option<String> {
    let words = text.split(|c: char| !c.is_ascii_alphanumeric());
    for w in words {
        let mut chars = w.chars();
        if chars.next() == Some('G') && w.len() > 1 && chars.all(|c| c.is_ascii_digit()) {
            return Some(w.to_string());
        }
    }
    None
}

#[test]
fn every_option_and_argument_of_every_command_is_described() {
    let mut missing = Vec::new();
    for (path, cmd) in commands() {
        if cmd.get_about().is_none() && path != "meshctl" {
            missing.push(format!("{path}: the command itself"));
        }
        for arg in cmd.get_arguments() {
            let id = arg.get_id().as_str();
            if matches!(id, "help" | "version") {
                continue;
            }
            if arg.get_help().is_none() && arg.get_long_help().is_none() {
                missing.push(format!("{path}: {id}"));
            }
        }
    }
    assert!(missing.is_empty(), "undescribed: {missing:#?}");
}

#[test]
fn no_help_text_shows_an_internal_label() {
    let mut found = Vec::new();
    for (path, mut cmd) in commands() {
        let text = cmd.render_long_help().to_string();
        if let Some(label) = internal_label(&text) {
            found.push(format!("{path}: {label}"));
        }
    }
    assert!(found.is_empty(), "labels in help: {found:?}");
    assert_eq!(internal_label("layers (G6)"), Some("G6".into()));
    assert_eq!(internal_label("G14 GiB"), Some("G14".into()));
    assert_eq!(internal_label("machine g14, 4 GiB"), None);
}

#[test]
fn help_exit_codes_lists_every_exit_code_meshctl_uses() {
    let text = help::help(&HelpArgs {
        words: vec!["exit-codes".into()],
    })
    .expect("topic");
    let codes = [
        mesh::cli::exit_done,
        mesh::cli::exit_failed,
        mesh::cli::exit_bad_input,
        mesh::cli::exit_held,
        mesh::cli::exit_module_failed,
        mesh::cli::exit_wait_timeout,
        mesh::cli::plan::exit_changes,
    ];
    for code in codes {
        let line = format!("\n  {code}  ");
        assert!(text.contains(&line), "exit code {code} missing:\n{text}");
    }
}

#[test]
fn help_context_gives_the_lookup_order_flag_then_env_then_default() {
    let text = help::help(&HelpArgs {
        words: vec!["context".into()],
    })
    .expect("topic");
    let flag = text.find("--context FILE").expect("flag");
    let env = text.find(mesh::cli::context::context_env).expect("env");
    let default = text
        .find(mesh::cli::context::context_default_path)
        .expect("default path");
    assert!(flag < env && env < default, "{text}");
}

#[test]
fn help_of_a_command_is_its_long_help_and_the_overview_lists_the_topics() {
    let push = help::help(&HelpArgs {
        words: vec!["settings".into(), "set".into()],
    })
    .expect("settings set");
    assert!(push.contains("Usage: meshctl settings set"), "{push}");
    let overview = help::help(&HelpArgs { words: vec![] }).expect("overview");
    assert!(
        overview.contains("exit-codes") && overview.contains("context"),
        "{overview}"
    );
    // `meshctl help <topic>` parses as the help command, not as clap's own.
    let cli = Cli::try_parse_from(["meshctl", "help", "exit-codes"]).expect("parses");
    let out = mesh::cli::run(cli).expect("runs");
    assert_eq!(out.code, 0);
    assert!(
        out.text.starts_with("Exit codes of meshctl"),
        "{}",
        out.text
    );
}

#[test]
fn completion_scripts_know_the_commands_and_their_options() {
    for shell in [Shell::Bash, Shell::Zsh, Shell::Fish] {
        let script = help::completions(shell).expect("script");
        for word in [
            "push",
            "settings",
            "completions",
            "detailed-exitcode",
            "behind",
        ] {
            assert!(script.contains(word), "{shell:?} lacks {word}");
        }
    }
    let cli = Cli::try_parse_from(["meshctl", "completions", "fish"]).expect("parses");
    let out = mesh::cli::run(cli).expect("runs");
    assert!(out.text.contains("complete -c meshctl"), "{}", out.text);
    assert!(Cli::try_parse_from(["meshctl", "completions", "tcsh"]).is_err());
}

#[test]
fn every_binary_prints_the_crate_version_with_version() {
    // Issue 25 item 7: an operator can ask meshd and mesh-host which build they run.
    let binaries = [
        env!("CARGO_BIN_EXE_meshd"),
        env!("CARGO_BIN_EXE_mesh-host"),
        env!("CARGO_BIN_EXE_meshctl"),
    ];
    for binary in binaries {
        let out = std::process::Command::new(binary)
            .arg("--version")
            .output()
            .expect("run the binary");
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert_eq!(out.status.code(), Some(0), "{binary}: {stdout}");
        assert!(
            stdout.trim_end().ends_with(env!("CARGO_PKG_VERSION")),
            "{binary}: {stdout}"
        );
    }
}
