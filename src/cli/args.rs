//! The command line grammar (clap derive).

use std::path::PathBuf;
use std::time::Duration;

use clap::{Parser, Subcommand, ValueEnum};

/// A historical-modeling fact store: immutable, content-addressed facts whose
/// predecessors form a DAG. Facts that arrive before their ancestors are held until
/// the ancestors arrive, then released in order.
#[derive(Parser, Debug)]
#[command(name = "precedent", version, about, max_term_width = 100)]
pub struct Cli {
    /// The database file, or a PostgreSQL database as a URL
    /// (postgres://USER:PASSWORD@HOST:PORT/DB?sslmode=prefer).
    #[arg(
        long,
        global = true,
        env = "PRECEDENT_DB",
        hide_env_values = true,
        default_value = "./precedent.db",
        value_name = "PATH"
    )]
    pub db: PathBuf,

    /// Machine-readable output (JSON) on commands a script would parse.
    #[arg(long, global = true)]
    pub json: bool,

    /// Open the database read-only, as sqlite3's -readonly: a command that writes is
    /// refused, and nothing is created or migrated. (Commands that only read open it
    /// read-only anyway.)
    #[arg(long, global = true)]
    pub read_only: bool,

    /// Most facts that may be held waiting for ancestors at once (default 1,000,000).
    #[arg(long, global = true, value_name = "N")]
    pub max_held: Option<u64>,

    #[command(flatten)]
    pub log: crate::cli::log::LogArgs,

    #[command(flatten)]
    pub config: crate::cli::config::ConfigArgs,

    #[command(subcommand)]
    pub command: Command,
}

/// The commands.
#[derive(Subcommand, Debug)]
pub enum Command {
    /// Create the database (or migrate it to this version's schema) and print its path.
    Init,
    /// Add one fact, given in the JSON form as an argument or on stdin; print its hash.
    ///
    /// Predecessors may be full hashes, unique prefixes of at least 8 hex digits, or
    /// inline fact objects (stored first).
    ///
    /// Example: precedent add '{"type":"Shop.Order","fields":{"number":7},"predecessors":{"shop":"1d1b48e0"}}'
    Add {
        /// The fact as JSON; read from stdin when absent or `-`.
        #[arg(value_name = "JSON")]
        fact: Option<String>,
    },
    /// Show one fact (released or held) by hash or unique prefix (>= 8 hex digits).
    Get {
        /// A full hash or a prefix of at least 8 hex digits.
        hash: String,
        /// Write the raw canonical CBOR bytes to stdout instead of JSON.
        #[arg(long)]
        cbor: bool,
    },
    /// Import facts from JSON Lines or a CBOR sequence, in any order.
    ///
    /// Invalid records are listed on stderr (`line N: reason`); every valid record is
    /// stored and the exit code is 1 if any record was invalid.
    Import {
        /// The input file, or `-` for stdin.
        file: PathBuf,
        /// Input format; by default a CBOR sequence if the first non-blank byte is a
        /// fact's array head (0x84), else JSON Lines (a UTF-8 byte order mark skipped).
        #[arg(long, value_enum)]
        format: Option<Format>,
        /// All or nothing: one transaction, and nothing is stored if any record is invalid.
        #[arg(long)]
        atomic: bool,
    },
    /// Export released facts in release order (JSON Lines or a CBOR sequence).
    Export {
        /// Output format.
        #[arg(long, value_enum, default_value_t = Format::Json)]
        format: Format,
        /// Only facts released after this sequence number.
        #[arg(long, value_name = "SEQ", default_value_t = 0)]
        after: i64,
        /// Write to FILE instead of stdout.
        #[arg(short, long, value_name = "FILE")]
        output: Option<PathBuf>,
    },
    /// List held facts and the hashes each waits for; `held drop` and `held expire` remove
    /// held facts that will never be released (released facts are never removed).
    Held {
        /// Show at most N held facts, oldest first.
        #[arg(long, value_name = "N", default_value_t = 100)]
        limit: usize,
        #[command(subcommand)]
        action: Option<HeldCommand>,
    },
    /// Check every stored fact, edge and held record; exit 1 naming each problem.
    Verify,
    /// Counts per type, released, held, edges, and the database size.
    Stats,
    /// Build a small shop and narrate it: facts held and released, queue work, a watch, a sync.
    Demo,
    /// Run a query (docs/queries.md) and print its results: a table, or JSON Lines with
    /// --json.
    ///
    /// Example: precedent query 'given s: Shop match o: Shop.Order where o->shop = s select o.number' --given s=1d1b48e0
    Query(crate::cli::query::QueryArgs),
    /// Print a query's results, then each change as facts arrive (from any process), as
    /// JSON Lines: {"change":"added"|"removed","key":[...],"result":...}; until interrupted.
    ///
    /// Example: precedent watch 'match o: Shop.Order select o.number'
    Watch(crate::cli::query::WatchArgs),
    /// Print a fact's neighbourhood in the DAG (ancestors above, descendants below) as
    /// Graphviz dot, SVG or JSON.
    ///
    /// Example: precedent graph 592a3a2d --depth 3 --format svg > fact.svg
    Graph(crate::cli::graph::GraphArgs),
    /// Serve this database to other nodes over HTTP (sync protocol v1) until SIGINT/SIGTERM.
    Serve(crate::cli::sync::ServeArgs),
    /// Sync with a node served by `precedent serve`: pull, fetch missing ancestors, push.
    Sync(crate::cli::sync::SyncArgs),
    /// List the nodes this database syncs with: bookmarks, last sync, lag, last error;
    /// `peers rm URL` forgets one (a mistyped URL, say).
    Peers {
        #[command(subcommand)]
        action: Option<PeersCommand>,
    },
    /// Poison: records refused at the door by sync (failed decoding or hashing), and
    /// (`poison queue ...`) inputs of a work queue that no retry can fix.
    #[command(subcommand)]
    Poison(crate::cli::queue::PoisonGroup),
    /// Work queues: declare, list, show, remove; counts, Prometheus metrics, alert checks.
    #[command(subcommand)]
    Queue(crate::cli::queue::QueueCommand),
    /// Dead-lettered inputs of a work queue: list, show, redrive, discard.
    ///
    /// Example: precedent dlq show ship 592a3a2d
    #[command(subcommand)]
    Dlq(crate::cli::queue::EntryCommand),
    /// Run a command once per ready input of a queue: the fact as JSON on stdin, facts to
    /// store with the completion as JSON Lines on stdout; exit 0 done, 75 retry, 65 poison.
    ///
    /// Example: precedent work ship --once -- true
    Work(crate::cli::work::WorkArgs),
    /// Print a shell completion script: bash, zsh, fish, elvish or powershell. For bash,
    /// save it as ~/.local/share/bash-completion/completions/precedent to load it in
    /// every new shell (docs/cli.md has the other shells).
    ///
    /// Example: precedent completions bash
    Completions(crate::cli::complete::CompletionsArgs),
    /// Print the man page (roff) to stdout, or write one page per command with --dir.
    /// Example: precedent man | man -l -
    Man(crate::cli::complete::ManArgs),
}

/// `precedent held ...`: removing held facts. A held fact was never released, so this
/// takes nothing from the released history.
#[derive(Subcommand, Debug)]
pub enum HeldCommand {
    /// Drop held facts (a fact held behind a mistyped hash, say), and every held fact
    /// waiting for them, which could never be released without them; print each hash
    /// dropped. Refuses a released fact, and drops nothing then.
    Drop {
        /// Full hashes or unique prefixes (>= 8 hex digits) of held facts.
        #[arg(required = true, value_name = "HASH")]
        hashes: Vec<String>,
    },
    /// Drop every fact held for longer than DUR, and every held fact waiting for them;
    /// print each hash dropped.
    Expire {
        /// How long a fact may stay held: `90s`, `1h30m`, `7d`, `2w`.
        #[arg(long, value_name = "DUR", value_parser = parse_duration)]
        older_than: Duration,
    },
}

/// `precedent peers ...`.
#[derive(Subcommand, Debug)]
pub enum PeersCommand {
    /// Forget a peer: its bookmarks, last sync and last error (no fact is touched). A
    /// later sync with it starts from the beginning.
    Rm {
        /// The peer's URL exactly as `precedent peers` lists it.
        url: String,
    },
}

/// A duration in humantime's syntax (`1h30m`, `7d`), for clap.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    humantime::parse_duration(text)
        .map_err(|e| format!("bad duration {text:?}: {e} (examples: 90s, 1h30m, 7d)"))
}

/// A fact stream format.
#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// JSON Lines: one fact in the JSON form per line.
    Json,
    /// A CBOR sequence (RFC 8742): the canonical bytes of each fact, back to back.
    Cbor,
}
