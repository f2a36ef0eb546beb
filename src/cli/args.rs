//! The command line grammar (clap derive).

use std::path::PathBuf;

use clap::{Parser, Subcommand, ValueEnum};

/// A historical-modeling fact store: immutable, content-addressed facts whose
/// predecessors form a DAG. Facts that arrive before their ancestors are held until
/// the ancestors arrive, then released in order.
#[derive(Parser, Debug)]
#[command(name = "precedent", version, about, max_term_width = 100)]
pub struct Cli {
    /// The database file.
    #[arg(
        long,
        global = true,
        env = "PRECEDENT_DB",
        default_value = "./precedent.db",
        value_name = "PATH"
    )]
    pub db: PathBuf,

    /// Machine-readable output (JSON) on commands a script would parse.
    #[arg(long, global = true)]
    pub json: bool,

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
    /// inline fact objects (stored first). Example:
    /// precedent add '{"type":"Shop.Order","fields":{"id":7},"predecessors":{"shop":"0f3c2a9b"}}'
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
        /// Input format; by default `{` as the first non-blank byte means JSON Lines,
        /// anything else a CBOR sequence.
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
    /// List held facts and the hashes each waits for.
    Held {
        /// Show at most N held facts, oldest first.
        #[arg(long, value_name = "N", default_value_t = 100)]
        limit: usize,
    },
    /// Check every stored fact, edge and held record; exit 1 naming each problem.
    Verify,
    /// Counts per type, released, held, edges, and the database size.
    Stats,
    /// Build a small shop in the database, delivered out of order, and narrate it.
    Demo,
    /// Run a query (docs/queries.md) and print its results: a table, or JSON Lines with
    /// --json. Example:
    /// precedent query 'given s: Shop match o: Shop.Order where o->shop = s select o.id' --given s=3f9a0c1d
    Query(crate::cli::query::QueryArgs),
    /// Print a query's results, then each change as facts arrive (from any process), as
    /// JSON Lines: {"change":"added"|"removed","key":[...],"result":...}; until interrupted.
    Watch(crate::cli::query::WatchArgs),
    /// Serve this database to other nodes over HTTP (sync protocol v1) until SIGINT/SIGTERM.
    Serve(crate::cli::sync::ServeArgs),
    /// Sync with a node served by `precedent serve`: pull, fetch missing ancestors, push.
    Sync(crate::cli::sync::SyncArgs),
    /// List the nodes this database syncs with: bookmarks, last sync, lag, last error.
    Peers,
    /// Poison: records refused at the door by sync (failed decoding or hashing), and
    /// (`poison queue ...`) inputs of a work queue that no retry can fix.
    #[command(subcommand)]
    Poison(crate::cli::queue::PoisonGroup),
    /// Work queues: declare, list, show, remove; counts, Prometheus metrics, alert checks.
    #[command(subcommand)]
    Queue(crate::cli::queue::QueueCommand),
    /// Dead-lettered inputs of a work queue: list, show, redrive, discard.
    #[command(subcommand)]
    Dlq(crate::cli::queue::EntryCommand),
    /// Run a command once per ready input of a queue: the fact as JSON on stdin, facts to
    /// store with the completion as JSON Lines on stdout; exit 0 done, 75 retry, 65 poison.
    Work(crate::cli::work::WorkArgs),
    /// Print a shell completion script: bash, zsh, fish, elvish or powershell.
    /// Example: precedent completions bash > ~/.local/share/bash-completion/completions/precedent
    Completions(crate::cli::complete::CompletionsArgs),
    /// Print the man page (roff) to stdout, or write one page per command with --dir.
    /// Example: precedent man | man -l -
    Man(crate::cli::complete::ManArgs),
}

/// A fact stream format.
#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// JSON Lines: one fact in the JSON form per line.
    Json,
    /// A CBOR sequence (RFC 8742): the canonical bytes of each fact, back to back.
    Cbor,
}
