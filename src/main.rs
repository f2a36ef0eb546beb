//! The `precedent` command line: parse the arguments, call the library, print.
//!
//! Each command group lives in its own file under `src/cli/`; exit codes and error
//! messages are decided in one place, `cli::run`.

mod cli;

fn main() -> std::process::ExitCode {
    // The command line, with what it left to defaults filled in from precedent.toml.
    match cli::config::parse() {
        Ok(cli) => cli::run(cli),
        Err(code) => code,
    }
}
