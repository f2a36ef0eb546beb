//! `completions` and `man`: shell completion scripts and man pages, generated from the
//! clap grammar itself (`args.rs`), so they never fall behind the commands.

use std::io::{self, Write};
use std::path::PathBuf;

use anyhow::Context;
use clap::{Args, CommandFactory};
use clap_complete::Shell;

use super::Status;
use super::args::Cli;

/// `precedent completions SHELL`.
#[derive(Args, Debug)]
pub struct CompletionsArgs {
    /// The shell to complete for.
    #[arg(value_enum)]
    pub shell: Shell,
}

/// `precedent man [--dir DIR]`.
#[derive(Args, Debug)]
pub struct ManArgs {
    /// Write one page per command into DIR (precedent.1, precedent-queue-add.1, ...)
    /// instead of printing precedent.1 to stdout.
    #[arg(long, value_name = "DIR")]
    pub dir: Option<PathBuf>,
}

/// Prints the completion script for `shell` to stdout.
pub fn completions(a: &CompletionsArgs) -> anyhow::Result<Status> {
    let mut cmd = Cli::command();
    let mut out = Vec::new();
    clap_complete::generate(a.shell, &mut cmd, "precedent", &mut out);
    io::stdout().write_all(&out)?;
    Ok(Status::Ok)
}

/// Prints the top page to stdout, or writes every page into `--dir` and lists them.
pub fn man(a: &ManArgs) -> anyhow::Result<Status> {
    let mut cmd = Cli::command();
    // Built as `generate_to` builds it, so the page lists `help` as the written one does.
    cmd.build();
    let Some(dir) = &a.dir else {
        let mut out = Vec::new();
        clap_mangen::Man::new(cmd).render(&mut out)?;
        io::stdout().write_all(&out)?;
        return Ok(Status::Ok);
    };
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    clap_mangen::generate_to(cmd, dir)
        .with_context(|| format!("cannot write man pages into {}", dir.display()))?;
    let mut pages: Vec<_> = std::fs::read_dir(dir)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "1"))
        .filter(|p| {
            p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("precedent"))
        })
        .collect();
    pages.sort();
    for p in pages {
        say!("{}", p.display());
    }
    Ok(Status::Ok)
}
