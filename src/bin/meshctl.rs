//! `meshctl`: the operator command line. Parses, runs one command, prints its output; errors go
//! to stderr as one line and set the exit code (see `meshctl --help`).

use clap::Parser;
use std::process::ExitCode;

fn main() -> ExitCode {
    let cli = mesh::cli::Cli::parse();
    match mesh::cli::run(cli) {
        Ok(out) => {
            print!("{}", out.text);
            ExitCode::from(out.code)
        }
        Err(e) => {
            eprintln!("meshctl: {e}");
            ExitCode::from(e.exit_code())
        }
    }
}
