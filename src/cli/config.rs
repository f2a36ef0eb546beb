//! `precedent.toml`: defaults for the global options, `serve` and `sync`.
//!
//! The first file found is used, and only that one (`docs/cli.md`, "Config file"):
//! `--config FILE` or `PRECEDENT_CONFIG` (which must exist), else `./precedent.toml`,
//! else `$XDG_CONFIG_HOME/precedent/precedent.toml` (`~/.config/...` when unset).
//!
//! A setting only fills in what neither a flag nor an environment variable gave: flag >
//! environment variable > config file > built-in default. clap knows where each value
//! came from (`ArgMatches::value_source`), so the config is applied after parsing to the
//! values that came from clap's defaults or nowhere.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use clap::parser::ValueSource;
use clap::{ArgMatches, Args, CommandFactory, FromArgMatches};
use serde::Deserialize;

use super::args::{Cli, Command};
use super::exit;
use super::log::ColorWhen;

/// The config file's name, in the current directory and in the XDG directory.
pub const FILE_NAME: &str = "precedent.toml";

/// `--config FILE`.
#[derive(Args, Debug, Clone, Default)]
pub struct ConfigArgs {
    /// The config file to read instead of looking for precedent.toml (docs/cli.md).
    #[arg(
        id = "config_file",
        long = "config",
        global = true,
        env = "PRECEDENT_CONFIG",
        value_name = "FILE"
    )]
    pub file: Option<PathBuf>,
    /// The file that was read, once one was.
    #[arg(skip)]
    pub used: Option<PathBuf>,
}

/// What `precedent.toml` may say. Unknown keys are refused, so a typo is an error rather
/// than a setting silently ignored.
#[derive(Deserialize, Debug, Default)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// `--db`.
    pub db: Option<PathBuf>,
    /// `--json`.
    pub json: Option<bool>,
    /// `--max-held`.
    pub max_held: Option<u64>,
    /// `--color`.
    pub color: Option<ColorName>,
    /// The log filter when neither `-v`/`-q` nor `RUST_LOG` is given.
    pub log: Option<String>,
    /// `serve`'s flags.
    #[serde(default)]
    pub serve: ServeConfig,
    /// `sync`'s flags.
    #[serde(default)]
    pub sync: SyncConfig,
}

/// `[serve]`.
#[derive(Deserialize, Debug, Default)]
#[serde(deny_unknown_fields)]
pub struct ServeConfig {
    pub listen: Option<SocketAddr>,
    pub tokens: Option<PathBuf>,
    pub tls_cert: Option<PathBuf>,
    pub tls_key: Option<PathBuf>,
    pub max_body_bytes: Option<usize>,
    pub max_facts_per_request: Option<u64>,
    pub max_held_per_peer: Option<u64>,
    /// A duration, `"60s"` or `"1m30s"`, or a number of seconds.
    #[serde(default, deserialize_with = "secs_or_duration")]
    pub request_timeout: Option<Duration>,
    pub max_connections: Option<usize>,
    /// A duration, as `request_timeout`.
    #[serde(default, deserialize_with = "secs_or_duration")]
    pub sse_stall: Option<Duration>,
    /// A duration, as `request_timeout`.
    #[serde(default, deserialize_with = "secs_or_duration")]
    pub poll_interval: Option<Duration>,
    pub store_threads: Option<usize>,
    pub sqlite_memory: Option<u64>,
}

/// `[sync]`.
#[derive(Deserialize, Debug, Default)]
#[serde(deny_unknown_fields)]
pub struct SyncConfig {
    /// The bearer token (`--token`, `PRECEDENT_TOKEN`).
    pub token: Option<String>,
    pub ca_cert: Option<PathBuf>,
    pub batch: Option<u64>,
}

/// A duration as the command line takes it (`"1m30s"`), or a TOML integer of seconds.
fn secs_or_duration<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
    struct Form;
    impl serde::de::Visitor<'_> for Form {
        type Value = Duration;
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("a duration such as \"90s\" or \"1m30s\", or a number of seconds")
        }
        fn visit_i64<E: serde::de::Error>(self, n: i64) -> Result<Duration, E> {
            u64::try_from(n)
                .map(Duration::from_secs)
                .map_err(|_| E::custom("a duration cannot be negative"))
        }
        fn visit_u64<E: serde::de::Error>(self, n: u64) -> Result<Duration, E> {
            Ok(Duration::from_secs(n))
        }
        fn visit_str<E: serde::de::Error>(self, text: &str) -> Result<Duration, E> {
            super::time::parse_secs_or_duration(text).map_err(E::custom)
        }
    }
    d.deserialize_any(Form).map(Some)
}

/// `color = "auto" | "always" | "never"`.
#[derive(Deserialize, Debug, Clone, Copy)]
#[serde(rename_all = "lowercase")]
pub enum ColorName {
    Auto,
    Always,
    Never,
}

/// A config file that could not be used: printed as one line, exit 1.
#[derive(Debug)]
pub struct ConfigError(pub String);

/// Parses the command line, then fills in what it left to defaults from the config file.
/// On a bad config file prints one `error:` line and returns the exit code.
pub fn parse() -> Result<Cli, ExitCode> {
    let matches = with_color(Cli::command()).get_matches();
    let mut cli = match Cli::from_arg_matches(&matches) {
        Ok(cli) => cli,
        Err(e) => e.exit(),
    };
    match load(cli.config.file.as_deref()).and_then(|found| match found {
        Some((path, config)) => apply(&mut cli, &matches, &path, config),
        None => Ok(()),
    }) {
        Ok(()) => Ok(cli),
        Err(ConfigError(message)) => {
            eprintln!("error: {message}");
            Err(ExitCode::from(exit::INVALID))
        }
    }
}

/// clap colours its own help and usage errors by the same `--color` as the logs; it is
/// needed before parsing, so it is looked for in the raw arguments (`NO_COLOR` and the
/// terminal test are clap's own for `auto`).
fn with_color(cmd: clap::Command) -> clap::Command {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut value = None;
    for (i, a) in args.iter().enumerate() {
        if a == "--" {
            break;
        }
        if let Some(v) = a.strip_prefix("--color=") {
            value = Some(v.to_string());
        } else if a == "--color" {
            value = args.get(i + 1).cloned();
        }
    }
    match value.as_deref() {
        Some("always") => cmd.color(clap::ColorChoice::Always),
        Some("never") => cmd.color(clap::ColorChoice::Never),
        _ => cmd,
    }
}

/// The config file to read: the one named, or the first of the search order that exists.
fn locate(named: Option<&Path>) -> Result<Option<PathBuf>, ConfigError> {
    if let Some(p) = named {
        if !p.is_file() {
            return Err(ConfigError(format!(
                "config file {} (from --config or PRECEDENT_CONFIG) does not exist",
                p.display()
            )));
        }
        return Ok(Some(p.to_path_buf()));
    }
    let here = PathBuf::from(FILE_NAME);
    if here.is_file() {
        return Ok(Some(here));
    }
    let xdg = std::env::var_os("XDG_CONFIG_HOME")
        .map(PathBuf::from)
        .filter(|p| p.is_absolute())
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".config")));
    Ok(xdg
        .map(|d| d.join("precedent").join(FILE_NAME))
        .filter(|p| p.is_file()))
}

/// Finds and reads the config file, if there is one.
fn load(named: Option<&Path>) -> Result<Option<(PathBuf, Config)>, ConfigError> {
    let Some(path) = locate(named)? else {
        return Ok(None);
    };
    let text = std::fs::read_to_string(&path)
        .map_err(|e| ConfigError(format!("cannot read config file {}: {e}", path.display())))?;
    let config = read(&path, &text)?;
    Ok(Some((path, config)))
}

/// Parses a config file's text; an error names the file, line and column, on one line.
pub fn read(path: &Path, text: &str) -> Result<Config, ConfigError> {
    toml::from_str(text).map_err(|e| {
        let at = match e.span() {
            Some(span) => {
                let before = &text[..span.start.min(text.len())];
                let line = before.matches('\n').count() + 1;
                let column = before.len() - before.rfind('\n').map_or(0, |i| i + 1) + 1;
                format!(":{line}:{column}")
            }
            None => String::new(),
        };
        let message = e.message().trim().replace('\n', " ");
        ConfigError(format!("config file {}{at}: {message}", path.display()))
    })
}

/// Whether clap's value for `id` came from neither the command line nor the environment.
fn unset(m: &ArgMatches, id: &str) -> bool {
    !matches!(
        m.value_source(id),
        Some(ValueSource::CommandLine | ValueSource::EnvVariable)
    )
}

/// A path of the config file, relative to the file's own directory.
fn beside(config: &Path, p: PathBuf) -> PathBuf {
    match config.parent() {
        Some(dir) if p.is_relative() && !precedent::store::is_postgres_url(&p) => dir.join(p),
        _ => p,
    }
}

/// Fills in `cli` from `config` wherever the command line and environment left a default.
fn apply(cli: &mut Cli, m: &ArgMatches, path: &Path, c: Config) -> Result<(), ConfigError> {
    cli.config.used = Some(path.to_path_buf());
    if let Some(db) = c.db.filter(|_| unset(m, "db")) {
        cli.db = beside(path, db);
    }
    if let Some(json) = c.json.filter(|_| unset(m, "json")) {
        cli.json = json;
    }
    if cli.max_held.is_none() {
        cli.max_held = c.max_held;
    }
    if let Some(color) = c.color.filter(|_| unset(m, "color")) {
        cli.log.color = match color {
            ColorName::Auto => ColorWhen::Auto,
            ColorName::Always => ColorWhen::Always,
            ColorName::Never => ColorWhen::Never,
        };
    }
    cli.log.config_filter = c.log;
    match &mut cli.command {
        Command::Serve(a) => {
            let sub = m.subcommand_matches("serve").unwrap_or(m);
            apply_serve(a, sub, path, c.serve)
        }
        Command::Sync(a) => {
            let sub = m.subcommand_matches("sync").unwrap_or(m);
            apply_sync(a, sub, path, c.sync);
            Ok(())
        }
        _ => Ok(()),
    }
}

fn apply_serve(
    a: &mut super::sync::ServeArgs,
    m: &ArgMatches,
    path: &Path,
    c: ServeConfig,
) -> Result<(), ConfigError> {
    macro_rules! fill {
        ($field:ident) => {
            if let Some(v) = c.$field.filter(|_| unset(m, stringify!($field))) {
                a.$field = v;
            }
        };
    }
    fill!(listen);
    fill!(max_body_bytes);
    fill!(max_facts_per_request);
    fill!(max_held_per_peer);
    fill!(max_connections);
    fill!(request_timeout);
    fill!(sse_stall);
    fill!(poll_interval);
    fill!(store_threads);
    fill!(sqlite_memory);
    if a.tokens.is_none() {
        a.tokens = c.tokens.map(|p| beside(path, p));
    }
    // The certificate and key go together: both from the command line or both from here.
    if a.tls_cert.is_none() && a.tls_key.is_none() {
        match (c.tls_cert, c.tls_key) {
            (Some(cert), Some(key)) => {
                a.tls_cert = Some(beside(path, cert));
                a.tls_key = Some(beside(path, key));
            }
            (None, None) => {}
            _ => {
                return Err(ConfigError(format!(
                    "config file {}: [serve] tls_cert and tls_key go together",
                    path.display()
                )));
            }
        }
    }
    Ok(())
}

fn apply_sync(a: &mut super::sync::SyncArgs, m: &ArgMatches, path: &Path, c: SyncConfig) {
    if a.token.is_none() {
        a.token = c.token;
    }
    if a.ca_cert.is_none() {
        a.ca_cert = c.ca_cert.map(|p| beside(path, p));
    }
    if let Some(b) = c.batch.filter(|_| unset(m, "batch")) {
        a.batch = b;
    }
}
