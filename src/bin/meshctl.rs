//! `meshctl`: the operator command line. Parses, runs one command, prints its output; errors go
//! to stderr and set the exit code (2: bad input, 1: the command failed).

use clap::Parser;
use std::process::ExitCode;

fn main() -> ExitCode {
    let cli = mesh::cli::Cli::parse();
    match mesh::cli::run(cli) {
        Ok(out) => {
            print!("{out}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("{e}");
            ExitCode::from(e.exit_code())
        }
    }
}
