//! The one error type of the library.
//!
//! Display messages are short, lowercase and carry the values a person needs to act:
//! the hash, the field path, the byte offset.

use crate::hash::FactHash;

/// Everything that can go wrong in precedent.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// Bytes that are not the canonical encoding of a fact.
    #[error("invalid canonical cbor at byte {offset}: {reason}")]
    Decode {
        /// Offset of the first byte that broke the rule.
        offset: usize,
        /// What rule was broken.
        reason: String,
    },
    /// A fact that breaks the fact model (NaN, integer out of range, a limit).
    #[error("invalid fact: {reason}")]
    InvalidFact {
        /// What is wrong, with the field path where there is one.
        reason: String,
    },
    /// A JSON document that is not a fact in the JSON form.
    #[error("invalid json fact: {reason}")]
    Json {
        /// What is wrong, with the JSON path where there is one.
        reason: String,
    },
    /// A record that claims a hash its content does not have.
    #[error("hash mismatch: record says {claimed}, content hashes to {actual}")]
    HashMismatch {
        /// The hash the record carried.
        claimed: FactHash,
        /// The hash of the record's content.
        actual: FactHash,
    },
    /// No fact with this hash is stored (neither released nor held).
    #[error("no fact {hash}")]
    NotFound {
        /// The hash asked for.
        hash: FactHash,
    },
    /// A hash prefix that is not 8 to 64 lowercase or uppercase hex digits.
    #[error("bad hash {prefix:?}: {reason}")]
    BadHash {
        /// The text given.
        prefix: String,
        /// Why it is not a hash or prefix.
        reason: &'static str,
    },
    /// A fact asked to be dropped from the held set that is released: released facts
    /// are immutable and are never dropped.
    #[error(
        "fact {hash} is released, not held: released facts are immutable and cannot be dropped"
    )]
    NotHeld {
        /// The released fact.
        hash: FactHash,
    },
    /// A prefix that matches no stored fact.
    #[error("no fact matches prefix {prefix}")]
    UnknownPrefix {
        /// The prefix given.
        prefix: String,
    },
    /// A prefix that matches more than one stored fact.
    #[error("prefix {prefix} is ambiguous: matches {}", list_hashes(candidates))]
    AmbiguousPrefix {
        /// The prefix given.
        prefix: String,
        /// Some of the facts it matches (at most ten).
        candidates: Vec<FactHash>,
    },
    /// Holding this fact would exceed the configured bound on held facts.
    #[error("held-fact limit of {limit} reached: fact {hash} not stored")]
    HeldLimit {
        /// The configured bound.
        limit: u64,
        /// The fact that was refused.
        hash: FactHash,
    },
    /// The database was written by a newer precedent.
    #[error(
        "database schema version {found} is newer than this binary supports ({supported}); upgrade precedent"
    )]
    SchemaTooNew {
        /// The newest schema version this binary knows.
        supported: u32,
        /// The version recorded in the database.
        found: u32,
    },
    /// The database cannot be opened at `path`: its directory does not exist, it is not
    /// there (a read-only open creates nothing), or it or its directory is not writable.
    #[error("cannot open {}: {reason}", path.display())]
    Open {
        /// The database file.
        path: std::path::PathBuf,
        /// Why, in words a person can act on.
        reason: String,
    },
    /// A read-only open ([`crate::StoreOptions::read_only`]) of a database written at an
    /// older schema version: migrating it would write, so it is not opened.
    #[error(
        "cannot open {} read-only: its schema version {found} must first be migrated to {supported}, which writes to it",
        path.display()
    )]
    NeedsMigration {
        /// The database file.
        path: std::path::PathBuf,
        /// The version recorded in the database.
        found: u32,
        /// The version this binary writes.
        supported: u32,
    },
    /// A write to a store opened read-only ([`crate::StoreOptions::read_only`]).
    #[error("database {} is open read-only: nothing can be written to it", path.display())]
    ReadOnly {
        /// The database file.
        path: std::path::PathBuf,
    },
    /// A stored row that does not match what was written.
    #[error("corrupt fact {hash}: {reason}")]
    Corrupt {
        /// Key of the damaged row.
        hash: FactHash,
        /// What is wrong with it.
        reason: String,
    },
    /// No queue of this name is declared.
    #[error("no queue named {name:?}")]
    UnknownQueue {
        /// The name asked for.
        name: String,
    },
    /// A queue operation that cannot be done (a bad declaration, redriving an input that is
    /// not dead-lettered, ...).
    #[error("queue {queue}: {reason}")]
    Queue {
        /// The queue's name.
        queue: String,
        /// What is wrong.
        reason: String,
    },
    /// The lease is no longer held: it expired and another worker claimed the input, or the
    /// input ended meanwhile. Nothing was written.
    #[error(
        "queue {queue}: lease on input {input} is lost (expired and claimed again, or the input ended)"
    )]
    LeaseLost {
        /// The queue's name.
        queue: String,
        /// The input fact.
        input: FactHash,
    },
    /// A completion closure returned without writing a fact that completes the input.
    /// Nothing was written.
    #[error("queue {queue}: input {input} is not completed by what the handler wrote")]
    NotCompleted {
        /// The queue's name.
        queue: String,
        /// The input fact.
        input: FactHash,
    },
    /// A peer could not be reached, or the connection broke mid-exchange.
    #[error("sync with {url}: {reason}")]
    Transport {
        /// The peer's URL.
        url: String,
        /// What went wrong (connection refused, reset, timed out).
        reason: String,
    },
    /// A peer answered a sync request with an error status.
    #[error("sync with {url}: http {status} {code}: {message}")]
    Remote {
        /// The peer's URL.
        url: String,
        /// The HTTP status.
        status: u16,
        /// The error code from the JSON body (`unauthorized`, `too_many_facts`, ...).
        code: String,
        /// The message from the JSON body.
        message: String,
    },
    /// A peer's answer that breaks the protocol (a missing header, a short stream).
    #[error("sync with {url}: protocol error: {reason}")]
    Protocol {
        /// The peer's URL.
        url: String,
        /// What was wrong with the answer.
        reason: String,
    },
    /// A sync configuration that cannot be used (a token file, a certificate, an address).
    #[error("sync configuration: {reason}")]
    SyncConfig {
        /// What is wrong, with the file where there is one.
        reason: String,
    },
    /// A query that does not parse or does not check: with its line and column when it
    /// came from text.
    #[error("{0}")]
    Query(#[from] crate::query::QueryError),
    /// A stored fact that is not of the type a typed read expects.
    #[error("fact {hash} is a {found}, not a {expected}")]
    WrongType {
        /// The fact.
        hash: FactHash,
        /// The type asked for.
        expected: String,
        /// Its type.
        found: String,
    },
    /// An error from the database backend: busy, corrupt, I/O or other (see
    /// [`BackendError::kind`]).
    #[error("{0}")]
    Backend(BackendError),
    /// An I/O error (reading an import file, writing an export).
    #[error("i/o: {0}")]
    Io(#[from] std::io::Error),
    /// A query result that does not deserialise into the Rust type asked for.
    #[error(
        "query result {key:?} is not a {type_name}{}: {reason}",
        at_field(field)
    )]
    ResultType {
        /// The result's key ([`crate::query::QueryRow::key`]).
        key: Vec<i64>,
        /// The Rust type asked for.
        type_name: &'static str,
        /// Where in the result's JSON form the value did not fit (`total`, `shop.name`),
        /// when it can be told.
        field: Option<String>,
        /// What serde said.
        reason: String,
    },
}

fn at_field(field: &Option<String>) -> String {
    field
        .as_ref()
        .map_or(String::new(), |f| format!(" at field {f}"))
}

impl Error {
    /// Whether this is the backend saying another writer held the database past the busy
    /// timeout: nothing was written, and the same call may succeed if tried again.
    pub fn is_busy(&self) -> bool {
        matches!(self, Error::Backend(b) if b.kind == BackendErrorKind::Busy)
    }

    /// Whether this is the backend saying its database server cannot be reached or ended
    /// the connection ([`BackendErrorKind::Unavailable`]): a caller that runs for long
    /// (a worker, a server, a follower) retries after a pause, as the store reconnects.
    pub fn is_unavailable(&self) -> bool {
        matches!(self, Error::Backend(b) if b.kind == BackendErrorKind::Unavailable)
    }
}

/// What kind of database failure a [`BackendError`] is: what a caller branches on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum BackendErrorKind {
    /// Another writer held the database past the busy timeout; retrying may succeed.
    Busy,
    /// The database file is damaged or is not a database.
    Corrupt,
    /// The operating system failed a read or write (disk full, permissions, I/O error).
    Io,
    /// A constraint of the schema refused a write.
    Constraint,
    /// A statement that must return a row returned none.
    NoRow,
    /// The database server cannot be reached or ended the connection (it is down, it
    /// restarted, the backend was terminated): nothing of the transaction was committed
    /// (unless the connection dropped during the commit itself), and the same call may
    /// succeed once the server is back. Only a database server's backend (PostgreSQL)
    /// reports it.
    Unavailable,
    /// Anything else (a malformed statement, a type mismatch).
    Other,
}

/// A failure of the database backend, with the backend's own message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BackendError {
    /// What kind of failure.
    pub kind: BackendErrorKind,
    /// The backend's message (for SQLite, prefixed `sqlite:`).
    pub message: String,
}

impl BackendError {
    /// A failure of `kind` described by `message`.
    pub fn new(kind: BackendErrorKind, message: impl Into<String>) -> BackendError {
        BackendError {
            kind,
            message: message.into(),
        }
    }
}

impl std::fmt::Display for BackendError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

fn list_hashes(hashes: &[FactHash]) -> String {
    hashes
        .iter()
        .map(|h| h.to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

/// Result with the library's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
