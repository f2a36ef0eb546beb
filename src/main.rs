//! The `precedent` command line: parse the arguments, call the library, print.
//!
//! Each command group lives in its own file under `src/cli/`; exit codes and error
//! messages are decided in one place, `cli::run`.

mod cli;

use clap::Parser;

fn main() -> std::process::ExitCode {
    cli::run(cli::args::Cli::parse())
}
