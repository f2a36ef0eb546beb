//! The SQLite store: schema migrations, writes with held-fact release, reads, verify.
//!
//! All SQL of the fact core lives under this module, so that another backend can slot in
//! beside SQLite without touching callers.

mod names;
#[cfg(test)]
mod plans;
mod query;
mod queue;
mod read;
mod sync;
mod verify;
mod work;
mod write;

use std::path::{Path, PathBuf};
use std::time::Duration;

use rusqlite::{Connection, OpenFlags};

use crate::clock::{Clock, SystemClock};
use crate::error::{Error, Result};
use names::Names;
use std::sync::Arc;

pub use read::{HeldFact, Stats, StoredFact};
pub use sync::{PeerState, Quarantined, SetDigest};
pub use verify::{Problem, VerifyReport};
pub use write::{BatchReport, InsertOutcome, Writer};

/// Schema migrations, applied in order. `PRAGMA user_version` records how many ran.
const MIGRATIONS: &[&str] = &[
    include_str!("../../schema/001_initial.sql"),
    include_str!("../../schema/002_queues.sql"),
    include_str!("../../schema/003_sync.sql"),
    include_str!("../../schema/004_held_set.sql"),
    include_str!("../../schema/005_edge_types.sql"),
    include_str!("../../schema/006_store_identity.sql"),
];

/// The schema version this binary writes.
pub const SCHEMA_VERSION: u32 = MIGRATIONS.len() as u32;

/// How hard a commit tries to reach the disk (see `docs/semantics.md`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Durability {
    /// `synchronous=FULL`: a committed write survives a process crash and a power loss.
    #[default]
    Full,
    /// `synchronous=NORMAL`: a committed write survives a process crash; a power loss may
    /// undo the last commits, never leaving a half-written one.
    Normal,
}

/// Settings for [`Store::open_with`].
#[derive(Clone, Debug)]
pub struct StoreOptions {
    /// Most facts that may be held waiting for ancestors at once. Past it, inserting a
    /// fact that would be held fails with [`Error::HeldLimit`]. Default 1,000,000.
    pub max_held: u64,
    /// Commit durability. Default [`Durability::Full`].
    pub durability: Durability,
    /// SQLite page cache, in MiB. Default 64.
    pub cache_mib: u32,
    /// How long a write waits for another process's write lock. Default 5 s.
    pub busy_timeout: Duration,
    /// The clock for leases, backoff and timestamps. Default the system clock.
    pub clock: Arc<dyn Clock>,
}

impl Default for StoreOptions {
    fn default() -> StoreOptions {
        StoreOptions {
            max_held: 1_000_000,
            durability: Durability::Full,
            cache_mib: 64,
            busy_timeout: Duration::from_secs(5),
            clock: Arc::new(SystemClock),
        }
    }
}

/// A fact store over one SQLite database.
///
/// Several `Store`s, in one process or many, may open the same file: SQLite's locks
/// serialise their writes, and each public write is one transaction.
pub struct Store {
    conn: Connection,
    options: StoreOptions,
    ctx: Ctx,
    path: Option<PathBuf>,
}

/// State a store keeps between transactions.
pub(crate) struct Ctx {
    /// Type and role ids.
    pub(crate) names: Names,
    /// Queue declarations, as of the `queues` counter they were read at.
    pub(crate) queues: Option<Arc<queue::QueueDefs>>,
    /// Randomness for lease tokens and backoff jitter.
    pub(crate) rng: fastrand::Rng,
    /// How many times SQLite prepared a compiled query statement again (see
    /// [`Store::query_reprepares`]).
    pub(crate) reprepares: std::cell::Cell<u64>,
}

impl Store {
    /// Opens (creating if needed) the store at `path` with default options.
    ///
    /// # Errors
    /// [`Error::SchemaTooNew`] for a database written by a newer precedent, or
    /// [`Error::Sqlite`] if the file cannot be opened as a database.
    pub fn open(path: impl AsRef<Path>) -> Result<Store> {
        Store::open_with(path, StoreOptions::default())
    }

    /// Opens the store at `path` with `options`.
    ///
    /// # Errors
    /// As [`Store::open`].
    pub fn open_with(path: impl AsRef<Path>, options: StoreOptions) -> Result<Store> {
        let path = path.as_ref();
        let conn = Connection::open_with_flags(
            path,
            OpenFlags::SQLITE_OPEN_READ_WRITE
                | OpenFlags::SQLITE_OPEN_CREATE
                | OpenFlags::SQLITE_OPEN_NO_MUTEX,
        )?;
        Store::setup(conn, options, Some(path.to_path_buf()))
    }

    /// A private in-memory store, for tests and examples.
    ///
    /// # Errors
    /// [`Error::Sqlite`] if SQLite cannot allocate it.
    pub fn open_in_memory() -> Result<Store> {
        Store::setup(Connection::open_in_memory()?, StoreOptions::default(), None)
    }

    /// An in-memory store with `options` (for tests of bounds).
    ///
    /// # Errors
    /// As [`Store::open_in_memory`].
    pub fn open_in_memory_with(options: StoreOptions) -> Result<Store> {
        Store::setup(Connection::open_in_memory()?, options, None)
    }

    fn setup(conn: Connection, options: StoreOptions, path: Option<PathBuf>) -> Result<Store> {
        conn.busy_timeout(options.busy_timeout)?;
        if path.is_some() {
            // WAL lets readers in other processes proceed while one writer commits.
            conn.pragma_update(None, "journal_mode", "WAL")?;
        }
        let sync = match options.durability {
            Durability::Full => "FULL",
            Durability::Normal => "NORMAL",
        };
        conn.pragma_update(None, "synchronous", sync)?;
        conn.pragma_update(None, "cache_size", -(options.cache_mib as i64) * 1024)?;
        conn.pragma_update(None, "foreign_keys", "OFF")?;
        conn.set_prepared_statement_cache_capacity(64);
        migrate(&conn)?;
        Ok(Store {
            conn,
            options,
            ctx: Ctx {
                names: Names::default(),
                queues: None,
                rng: fastrand::Rng::new(),
                reprepares: std::cell::Cell::new(0),
            },
            path,
        })
    }

    /// The options the store was opened with.
    pub fn options(&self) -> &StoreOptions {
        &self.options
    }

    /// The database file, or `None` for an in-memory store.
    pub fn path(&self) -> Option<&Path> {
        self.path.as_deref()
    }

    /// Runs `f` in one write transaction: everything it writes commits together when it
    /// returns `Ok`, and nothing is written when it returns `Err` (or panics).
    ///
    /// # Errors
    /// Whatever `f` returns, or [`Error::Sqlite`] if the transaction cannot begin or commit
    /// (for example when another process holds the write lock past the busy timeout).
    pub fn write<T>(&mut self, f: impl FnOnce(&mut Writer<'_>) -> Result<T>) -> Result<T> {
        // Names numbered by a transaction that never committed (an error or a panic in
        // an earlier `f`) must not be reused.
        self.ctx.names.rollback();
        let result = (|| {
            let tx = rusqlite::Transaction::new(
                &mut self.conn,
                rusqlite::TransactionBehavior::Immediate,
            )?;
            let mut writer = Writer::new(tx, &mut self.ctx, &self.options);
            let value = f(&mut writer)?;
            writer.commit()?;
            Ok(value)
        })();
        match result {
            Ok(_) => self.ctx.names.commit(),
            Err(_) => {
                self.ctx.names.rollback();
                // Declarations read inside a rolled-back transaction may be wrong.
                self.ctx.queues = None;
            }
        }
        result
    }
}

/// Applies the migrations the database lacks; refuses a database newer than the binary.
fn migrate(conn: &Connection) -> Result<()> {
    let found: u32 = conn.pragma_query_value(None, "user_version", |r| r.get(0))?;
    if found > SCHEMA_VERSION {
        return Err(Error::SchemaTooNew {
            supported: SCHEMA_VERSION,
            found,
        });
    }
    if found == SCHEMA_VERSION {
        return Ok(());
    }
    conn.execute_batch("BEGIN IMMEDIATE")?;
    let result = (|| -> Result<()> {
        // Re-read under the write lock: another process may have migrated meanwhile.
        let now: u32 = conn.pragma_query_value(None, "user_version", |r| r.get(0))?;
        for (i, sql) in MIGRATIONS.iter().enumerate().skip(now as usize) {
            conn.execute_batch(sql)?;
            conn.pragma_update(None, "user_version", i as u32 + 1)?;
        }
        Ok(())
    })();
    match result {
        Ok(()) => conn.execute_batch("COMMIT")?,
        Err(e) => {
            let _ = conn.execute_batch("ROLLBACK");
            return Err(e);
        }
    }
    Ok(())
}
