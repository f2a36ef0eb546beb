//! Logging and colour: the `-v`/`-q`/`--color` flags, `RUST_LOG`, `NO_COLOR`.
//!
//! Logs go to stderr through `tracing`, so stdout stays what a script parses. The level
//! comes from, in order: `-q` (errors only) or `-v` (`-v` info, `-vv` debug, `-vvv`
//! trace); else `RUST_LOG` (any `tracing-subscriber` filter, e.g.
//! `RUST_LOG=precedent::access=info`); else the config file's `log`; else the command's
//! default: `info` for `serve`
//! (its access log, one line per request) and `warn` for every other command.

use std::io::{self, IsTerminal};

use clap::{Args, ValueEnum};
use tracing_subscriber::EnvFilter;

/// The flags every command shares for logs and colour.
#[derive(Args, Debug, Clone, Default)]
pub struct LogArgs {
    /// More log lines on stderr: -v info, -vv debug, -vvv trace (overrides RUST_LOG).
    #[arg(short, long, global = true, action = clap::ArgAction::Count, conflicts_with = "quiet")]
    pub verbose: u8,
    /// Only errors on stderr (overrides RUST_LOG).
    #[arg(short, long, global = true)]
    pub quiet: bool,
    /// Colour in logs and progress bars: `auto` (only on a terminal, and not when NO_COLOR
    /// is set), `always` or `never`.
    #[arg(long, global = true, value_enum, value_name = "WHEN", default_value_t = ColorWhen::Auto)]
    pub color: ColorWhen,
    /// The config file's `log` filter: used when neither a flag nor `RUST_LOG` is given.
    #[arg(skip)]
    pub config_filter: Option<String>,
}

/// When to colour.
#[derive(ValueEnum, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ColorWhen {
    /// Only when stderr is a terminal and `NO_COLOR` is unset or empty.
    #[default]
    Auto,
    /// Always, even into a pipe.
    Always,
    /// Never.
    Never,
}

impl ColorWhen {
    /// Whether stderr gets colour.
    pub fn enabled(self) -> bool {
        match self {
            ColorWhen::Always => true,
            ColorWhen::Never => false,
            ColorWhen::Auto => no_color_unset() && io::stderr().is_terminal(),
        }
    }
}

/// `NO_COLOR` is honoured when set to anything but the empty string (no-color.org).
fn no_color_unset() -> bool {
    std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty())
}

/// The filter the flags, `RUST_LOG` and the command's default give.
fn filter(args: &LogArgs, default: &str) -> EnvFilter {
    let level = match (args.quiet, args.verbose) {
        (true, _) => Some("error"),
        (false, 0) => None,
        (false, 1) => Some("info"),
        (false, 2) => Some("debug"),
        (false, _) => Some("trace"),
    };
    if let Some(level) = level {
        return EnvFilter::new(level);
    }
    match std::env::var("RUST_LOG") {
        Ok(text) if !text.trim().is_empty() => EnvFilter::try_new(&text).unwrap_or_else(|e| {
            eprintln!("warning: RUST_LOG={text:?} is not a log filter ({e}); using {default:?}");
            EnvFilter::new(default)
        }),
        _ => match &args.config_filter {
            Some(text) => EnvFilter::try_new(text).unwrap_or_else(|e| {
                eprintln!("warning: log = {text:?} in the config file is not a log filter ({e})");
                EnvFilter::new(default)
            }),
            None => EnvFilter::new(default),
        },
    }
}

/// Installs the stderr logger; `default` is the level used without flags or `RUST_LOG`.
pub fn init(args: &LogArgs, default: &str) {
    QUIET.store(args.quiet, std::sync::atomic::Ordering::Relaxed);
    let subscriber = tracing_subscriber::fmt()
        .with_env_filter(filter(args, default))
        .with_writer(io::stderr)
        .with_ansi(args.color.enabled())
        .with_target(true)
        .finish();
    // Only fails if a logger is already installed, which only a second call would do.
    let _ = tracing::subscriber::set_global_default(subscriber);
}

/// The level a command logs at without `-v`, `-q` or `RUST_LOG`.
pub fn default_level(command: &super::args::Command) -> &'static str {
    match command {
        super::args::Command::Serve(_) => "info",
        _ => "warn",
    }
}

static QUIET: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Whether `-q` was given: progress bars stay hidden too.
pub fn quiet() -> bool {
    QUIET.load(std::sync::atomic::Ordering::Relaxed)
}
