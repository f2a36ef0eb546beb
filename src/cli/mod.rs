//! The command line, one file per command group. This file decides exit codes and how
//! errors are printed; the commands only parse, call the library and print.

/// `println!` that returns an error instead of panicking when stdout is closed (a reader
/// such as `head` that went away), so the command can stop quietly.
macro_rules! say {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        writeln!(std::io::stdout(), $($arg)*)?
    }};
}

pub mod args;
mod complete;
pub mod config;
mod demo;
mod export;
mod facts;
mod graph;
mod import;
mod inspect;
mod log;
mod peers;
mod pipeline;
mod query;
mod queue;
mod records;
mod sync;
mod time;
mod work;
mod work_remote;

use std::fmt;
use std::io::{self, IsTerminal};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use indicatif::{ProgressBar, ProgressStyle};
use precedent::{Error, Store, StoreOptions};

use args::{Cli, Command};

/// Exit codes. Usage errors (2) are reported by clap itself.
pub mod exit {
    /// Success.
    pub const OK: u8 = 0;
    /// Invalid input (a bad fact, record or hash), or `verify` found problems.
    pub const INVALID: u8 = 1;
    /// Usage error: bad arguments (clap's default), or arguments that do not go together.
    pub const USAGE: u8 = 2;
    /// Not found: an unknown (or ambiguous) hash or prefix.
    pub const NOT_FOUND: u8 = 3;
    /// Database error: schema too new, SQLite, corruption, i/o.
    pub const DATABASE: u8 = 4;
    /// Sync error: a peer unreachable, refusing (401, 403, a limit) or off-protocol.
    pub const PEER: u8 = 5;
}

/// The exit code for each library error. The one place where this mapping lives.
pub fn exit_code(err: &Error) -> u8 {
    match err {
        Error::Decode { .. }
        | Error::InvalidFact { .. }
        | Error::Json { .. }
        | Error::HashMismatch { .. }
        | Error::BadHash { .. }
        | Error::HeldLimit { .. }
        | Error::NotHeld { .. }
        | Error::Query(_)
        | Error::WrongType { .. } => exit::INVALID,
        Error::NotFound { .. } | Error::UnknownPrefix { .. } | Error::AmbiguousPrefix { .. } => {
            exit::NOT_FOUND
        }
        Error::Transport { .. } | Error::Remote { .. } | Error::Protocol { .. } => exit::PEER,
        Error::SyncConfig { .. } => exit::INVALID,
        Error::UnknownQueue { .. } => exit::NOT_FOUND,
        Error::Queue { .. } | Error::LeaseLost { .. } | Error::NotCompleted { .. } => exit::INVALID,
        Error::SchemaTooNew { .. }
        | Error::Open { .. }
        | Error::NeedsMigration { .. }
        | Error::ReadOnly { .. }
        | Error::Corrupt { .. }
        | Error::Backend(_)
        | Error::Io(_) => exit::DATABASE,
        _ => exit::DATABASE,
    }
}

/// How a command that ran to its end went.
#[derive(Debug, PartialEq, Eq)]
pub enum Status {
    /// Everything was fine.
    Ok,
    /// Data problems (invalid records, verify findings), already reported: exit 1.
    Problems,
}

/// An error of the command line itself, with its exit code.
#[derive(Debug)]
pub struct Failure {
    code: u8,
    message: String,
}

impl Failure {
    /// A failure exiting with `code`.
    pub fn error(code: u8, message: impl Into<String>) -> anyhow::Error {
        anyhow::Error::new(Failure {
            code,
            message: message.into(),
        })
    }
}

/// A file the command line names as input that cannot be read (missing, a directory,
/// not permitted): invalid input (exit 1), as an unreadable config, token or certificate
/// file is, not a database error (exit 4). `what` says which file, as "cannot open X".
pub fn unreadable(what: String, e: &dyn fmt::Display) -> anyhow::Error {
    Failure::error(exit::INVALID, format!("{what}: {e}"))
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for Failure {}

/// Whether a command writes to the database.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Access {
    /// It only reads: the database is opened read-only, so that it can be read where it
    /// cannot be written (a read-only directory, a file of someone else's).
    Read,
    /// It may write.
    Write,
}

impl Access {
    /// What `command` does to the database: the one list of the commands that only read.
    fn of(command: &Command) -> Access {
        use queue::{EntryCommand as E, PoisonGroup as P, QueueCommand as Q};
        let reads = match command {
            Command::Get { .. }
            | Command::Export { .. }
            | Command::Verify
            | Command::Stats
            | Command::Query(_)
            | Command::Graph(_)
            | Command::Watch(_) => true,
            Command::Held { action, .. } => action.is_none(),
            Command::Peers { action } => action.is_none(),
            Command::Poison(P::Sync(_)) => true,
            Command::Poison(P::Queue(e)) | Command::Dlq(e) => {
                matches!(e, E::List { .. } | E::Show { .. })
            }
            Command::Queue(q) => !matches!(q, Q::Add(_) | Q::Rm { .. }),
            _ => false,
        };
        if reads { Access::Read } else { Access::Write }
    }
}

/// The options every command shares.
#[derive(Clone)]
pub struct Global {
    pub db: PathBuf,
    pub json: bool,
    pub max_held: Option<u64>,
    /// `--read-only`: refuse any command that writes.
    pub read_only: bool,
    /// What the command being run does to the database.
    pub access: Access,
}

impl Global {
    /// Opens the store: read-only for a command that only reads, and then without
    /// creating or migrating anything, unless the database needs migrating and
    /// `--read-only` was not given. Commands that do not create (`create == false`)
    /// refuse a missing file rather than creating an empty database at a mistyped path.
    pub fn open(&self, create: bool) -> anyhow::Result<Store> {
        if self.read_only && self.access == Access::Write {
            return Err(Failure::error(
                exit::USAGE,
                format!(
                    "--read-only: this command writes to {}; run it without --read-only",
                    self.shown_db()
                ),
            ));
        }
        // In a directory that does not exist, `init` cannot help: the store says so. A
        // PostgreSQL URL names no file: the server says whether the database is there.
        let url = precedent::store::is_postgres_url(&self.db);
        let dir_exists = url
            || self
                .db
                .parent()
                .is_none_or(|d| d.as_os_str().is_empty() || d.is_dir());
        if !create && !url && dir_exists && !self.db.exists() {
            return Err(Failure::error(
                exit::DATABASE,
                format!(
                    "no database at {} (create one with `precedent init`)",
                    self.db.display()
                ),
            ));
        }
        tracing::debug!(db = %self.shown_db(), create, "opening the database");
        let mut options = StoreOptions::default();
        if let Some(n) = self.max_held {
            options.max_held = n;
        }
        options.read_only = self.access == Access::Read;
        let opened = match Store::open_with(&self.db, options.clone()) {
            // A command that only reads, on a database an older precedent wrote: it is
            // migrated, as every command did before reads opened read-only, unless the
            // user asked for nothing to be written.
            Err(Error::NeedsMigration { .. }) if !self.read_only => {
                options.read_only = false;
                Store::open_with(&self.db, options)
            }
            Err(e @ Error::NeedsMigration { .. }) => {
                return Err(Failure::error(
                    exit::DATABASE,
                    format!("{e}; run `precedent init` once without --read-only to migrate it"),
                ));
            }
            other => other,
        };
        opened.map_err(|e| match e {
            // These name the path already.
            Error::Open { .. } | Error::ReadOnly { .. } => anyhow::Error::new(e),
            e => anyhow::Error::new(e).context(format!("cannot open database {}", self.shown_db())),
        })
    }

    /// `--db` as messages may show it: a PostgreSQL URL without its password.
    pub fn shown_db(&self) -> String {
        precedent::store::shown_path(&self.db)
    }

    /// The held-fact bound the store is opened with.
    pub fn max_held(&self) -> u64 {
        self.max_held
            .unwrap_or_else(|| StoreOptions::default().max_held)
    }
}

/// Runs a parsed command line and turns its outcome into an exit code.
pub fn run(cli: Cli) -> ExitCode {
    // `serve` logs each request at info level; other commands only warnings by default.
    log::init(&cli.log, log::default_level(&cli.command));
    if let Some(path) = &cli.config.used {
        tracing::debug!(file = %path.display(), "read the config file");
    }
    let global = Global {
        access: Access::of(&cli.command),
        db: cli.db,
        json: cli.json,
        max_held: cli.max_held,
        read_only: cli.read_only,
    };
    // A testing aid (docs/robustness.md): a skewed clock must be what was asked for.
    if let Err(e) = precedent::clock::offset_from_env() {
        eprintln!("error: {e}");
        return ExitCode::from(exit::USAGE);
    }
    let result = match cli.command {
        Command::Init => facts::init(&global),
        Command::Add { fact } => facts::add(&global, fact),
        Command::Get { hash, cbor } => facts::get(&global, &hash, cbor),
        Command::Import {
            file,
            format,
            atomic,
        } => import::import(&global, &file, format, atomic),
        Command::Export {
            format,
            after,
            output,
        } => export::export(&global, format, after, output.as_deref()),
        Command::Held {
            action: None,
            limit,
        } => inspect::held(&global, limit),
        Command::Held {
            action: Some(args::HeldCommand::Drop { hashes }),
            ..
        } => inspect::held_drop(&global, &hashes),
        Command::Held {
            action: Some(args::HeldCommand::Expire { older_than }),
            ..
        } => inspect::held_expire(&global, older_than),
        Command::Verify => inspect::verify(&global),
        Command::Stats => inspect::stats(&global),
        Command::Demo => demo::demo(&global),
        Command::Query(a) => query::query(&global, a),
        Command::Watch(a) => query::watch(&global, a),
        Command::Graph(a) => graph::graph(&global, a),
        Command::Serve(a) => sync::serve(&global, a),
        Command::Sync(a) => sync::sync(&global, a),
        Command::Peers { action: None } => sync::peers(&global),
        Command::Peers {
            action: Some(args::PeersCommand::Rm { url }),
        } => peers::rm(&global, &url),
        Command::Poison(queue::PoisonGroup::Sync(c)) => sync::poison(&global, c),
        Command::Poison(queue::PoisonGroup::Queue(c)) => {
            queue::entries(&global, c, precedent::queue::ItemState::Poison)
        }
        Command::Queue(c) => queue::queue(&global, c),
        Command::Dlq(c) => queue::entries(&global, c, precedent::queue::ItemState::Dead),
        Command::Work(a) => work::work(&global, a),
        Command::Completions(a) => complete::completions(&a),
        Command::Man(a) => complete::man(&a),
    };
    match result {
        Ok(Status::Ok) => ExitCode::from(exit::OK),
        Ok(Status::Problems) => ExitCode::from(exit::INVALID),
        // A reader that went away (`precedent export | head`) is not an error.
        Err(e) if is_broken_pipe(&e) => ExitCode::from(exit::OK),
        Err(e) => {
            eprintln!("error: {}", message(&e));
            ExitCode::from(code_of(&e))
        }
    }
}

fn code_of(err: &anyhow::Error) -> u8 {
    for cause in err.chain() {
        if let Some(f) = cause.downcast_ref::<Failure>() {
            return f.code;
        }
        if let Some(e) = cause.downcast_ref::<Error>() {
            return exit_code(e);
        }
        if cause.downcast_ref::<io::Error>().is_some() {
            return exit::DATABASE;
        }
    }
    exit::INVALID
}

fn is_broken_pipe(err: &anyhow::Error) -> bool {
    err.chain().any(|c| {
        c.downcast_ref::<io::Error>()
            .is_some_and(|e| e.kind() == io::ErrorKind::BrokenPipe)
    })
}

/// One line: the context chain joined by `: `, causes already quoted by their wrapper
/// left out, each part starting lowercase.
fn message(err: &anyhow::Error) -> String {
    let mut out = String::new();
    for cause in err.chain() {
        let text = cause.to_string();
        if out.contains(&text) {
            continue;
        }
        if !out.is_empty() {
            out.push_str(": ");
        }
        out.push_str(&text);
    }
    let parts: Vec<String> = out.split(": ").map(lowercase_first).collect();
    parts.join(": ").replace(['\n', '\r'], " ")
}

/// Lowercases the first letter of a sentence-like part ("No such file" but not "SQLite").
fn lowercase_first(part: &str) -> String {
    // Only an ordinary capitalised word ("Invalid") is lowered; a name such as "NaN" or
    // "SQLite" keeps its case.
    let word: Vec<char> = part.chars().take_while(|c| c.is_alphanumeric()).collect();
    match word.split_first() {
        Some((a, rest))
            if a.is_uppercase() && !rest.is_empty() && rest.iter().all(|c| c.is_lowercase()) =>
        {
            let mut s: String = a.to_lowercase().collect();
            s.push_str(&part[a.len_utf8()..]);
            s
        }
        _ => part.to_string(),
    }
}

/// A progress bar on stderr, or a hidden one when stderr is not a terminal.
/// `len` is the total in bytes when known; otherwise a spinner counts.
pub fn progress(len: Option<u64>, what: &str) -> ProgressBar {
    if !io::stderr().is_terminal() || log::quiet() {
        return ProgressBar::hidden();
    }
    let pb = match len {
        Some(n) => {
            let pb = ProgressBar::new(n);
            pb.set_style(
                ProgressStyle::with_template(
                    "{spinner} {prefix} [{bar:30}] {bytes}/{total_bytes} {msg}",
                )
                .expect("valid template")
                .progress_chars("=> "),
            );
            pb
        }
        None => {
            let pb = ProgressBar::new_spinner();
            pb.set_style(
                ProgressStyle::with_template("{spinner} {prefix} {msg}").expect("valid template"),
            );
            pb
        }
    };
    pb.set_prefix(what.to_string());
    pb.enable_steady_tick(std::time::Duration::from_millis(120));
    pb
}

/// A path for messages: `-` is stdin.
pub fn source_name(path: &Path) -> String {
    if path == Path::new("-") {
        "stdin".to_string()
    } else {
        path.display().to_string()
    }
}

/// Calls `then` on a thread of its own when the process gets SIGINT or SIGTERM; commands
/// that run until interrupted (`sync --follow`, `work`) use it to stop cleanly. tokio is
/// already a dependency (for sync), so its signal handling is used rather than another crate.
pub fn on_stop_signal(then: impl FnOnce() + Send + 'static) {
    std::thread::spawn(move || {
        let Ok(rt) = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
        else {
            return;
        };
        let received = rt.block_on(async {
            use tokio::signal::unix::{SignalKind, signal};
            let (Ok(mut int), Ok(mut term)) = (
                signal(SignalKind::interrupt()),
                signal(SignalKind::terminate()),
            ) else {
                return false;
            };
            tokio::select! {
                _ = int.recv() => {}
                _ = term.recv() => {}
            }
            true
        });
        if received {
            then();
        }
    });
}

#[cfg(test)]
mod tests {
    use super::lowercase_first;

    #[test]
    fn only_ordinary_capitalised_words_are_lowered() {
        assert_eq!(lowercase_first("Invalid fact"), "invalid fact");
        assert_eq!(lowercase_first("NaN is not allowed"), "NaN is not allowed");
        assert_eq!(lowercase_first("SQLite says no"), "SQLite says no");
        assert_eq!(lowercase_first("already lower"), "already lower");
    }
}
