//! The fact core: fact rows, edges, the held set and its cascades, release with sequence
//! numbers, reads, verify, migrations, behind a backend seam.
//!
//! - `backend.rs`: the seam: [`Backend`], [`ReadTx`], [`WriteTx`], [`Sql`] with neutral
//!   values, and the [`ReleaseHook`] through which indexes outside the core (the queue
//!   index) are kept in the transaction that releases each fact.
//! - `sqlite/`: the SQLite backend; all of the core's SQL.
//! - `postgres/`: the PostgreSQL backend (feature `postgres`), the same behaviour with
//!   concurrent writers on many hosts.
//! - `types.rs`: the values the core hands out.
//! - `steps.rs`, `shared.rs`: what the backends share beyond the seam (the steps of an
//!   insert, the rules of `verify`, prefixes and schema versions).
//! - `held.rs`: dropping held facts that will never be released.
//! - `wake.rs`: wake-ups for threads waiting for new facts ([`Store::wait_for_wake`]).
//!
//! The core knows nothing of what is built on it: queues (`src/queue/`), sync
//! (`src/sync/`) and queries (`src/query/`) reach the database through this module's
//! public seam only. `tests/layering.rs` checks it.
//!
//! # Concurrency
//! A [`Store`] is `Send + Sync`: share one `Arc<Store>` across threads and tasks. Reads
//! run concurrently, each in a read transaction of its own that sees one committed
//! snapshot; writes are serialised, one [`Writer`] at a time in a process and one across
//! processes (the database's write lock, waited for up to
//! [`StoreOptions::busy_timeout`]). A read started inside a write transaction does not see
//! that transaction's uncommitted writes: read through the [`Writer`] for those.

mod backend;
mod held;
#[cfg(feature = "postgres")]
mod postgres;
pub(crate) mod shared;
mod sqlite;
pub(crate) mod steps;
mod types;
mod wake;

use std::any::{Any, TypeId};
use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::clock::{Clock, SystemClock};
use crate::error::{Error, Result};
use crate::fact::Fact;
use crate::hash::{FactHash, HashPrefix};

#[cfg(feature = "postgres")]
pub use self::postgres::{MIN_SERVER_VERSION, PG_SCHEMA_VERSION, PostgresBackend};
pub use backend::{
    Arg, Backend, Dialect, EachReleased, FromSql, HookCtx, HookRunner, ReadTx, ReleaseHook, Row,
    RowSource, Sql, SqlExt, SqlValue, ValueRef, WriteTx,
};
pub use sqlite::{SCHEMA_VERSION, SqliteBackend, set_sqlite_memory_limit, sqlite_memory_used};
pub use wake::{CHANNEL as NOTIFY_CHANNEL, Wake, WakeMark};

/// A store path as messages and logs may show it: a PostgreSQL URL with its password
/// (`user:password@`, `password=`) replaced by `***`; a file path as it is.
pub fn shown_path(path: &Path) -> String {
    let text = path.to_string_lossy();
    if !is_postgres_url(path) {
        return text.into_owned();
    }
    let mut out = text.into_owned();
    if let Some(scheme) = out.find("://") {
        let rest = scheme + 3;
        if let Some(at) = url_userinfo(&out[rest..])
            && let Some(colon) = out[rest..rest + at].find(':')
        {
            out.replace_range(rest + colon + 1..rest + at, "***");
        }
    }
    // Every `password=` in the query, `sslpassword=` among them.
    let mut from = 0;
    while let Some(p) = out[from..].find("password=") {
        let start = from + p + "password=".len();
        let end = out[start..].find('&').map_or(out.len(), |n| start + n);
        out.replace_range(start..end, "***");
        from = start + "***".len();
    }
    out
}

/// The length of a PostgreSQL URL's credentials (`USER[:PASSWORD]`), given the text after
/// its `://`: up to the first `@`, as the driver reads it, so that a password holding a
/// `?` or a `/` is taken whole; `None` without credentials.
pub(crate) fn url_userinfo(rest: &str) -> Option<usize> {
    rest.find('@')
}

/// Whether a store path names a PostgreSQL database: its text starts with `postgres://`
/// or `postgresql://` (what [`Store::open_with`] opens on PostgreSQL).
pub fn is_postgres_url(path: &Path) -> bool {
    path.to_str()
        .is_some_and(|p| p.starts_with("postgres://") || p.starts_with("postgresql://"))
}
pub use types::{BatchReport, HeldFact, InsertOutcome, Problem, Stats, StoredFact, VerifyReport};

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
///
/// `StoreOptions::default()` carries the queue index as its release hook (it is written
/// beside that index, in `src/queue/index.rs`, since the core knows no queue).
#[derive(Clone)]
pub struct StoreOptions {
    /// Most facts that may be held waiting for ancestors at once. Past it, inserting a
    /// fact that would be held fails with [`Error::HeldLimit`]. Default 1,000,000.
    pub max_held: u64,
    /// Commit durability. Default [`Durability::Full`].
    pub durability: Durability,
    /// SQLite page cache, in MiB, per connection. Default 64.
    pub cache_mib: u32,
    /// How long a write waits for another process's write lock. Default 5 s.
    pub busy_timeout: Duration,
    /// The clock for leases, backoff and timestamps. Default the system clock.
    pub clock: Arc<dyn Clock>,
    /// Called in the transaction that releases each fact, in order. Default: the queue
    /// index. An application may add its own (see [`ReleaseHook`]).
    pub release_hooks: Vec<Arc<dyn ReleaseHook>>,
    /// Open the database for reading only. Nothing is created or migrated: a missing
    /// file is [`Error::Open`], one at an older schema version [`Error::NeedsMigration`],
    /// and every write fails with [`Error::ReadOnly`]. Default `false`.
    pub read_only: bool,
}

impl std::fmt::Debug for StoreOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StoreOptions")
            .field("max_held", &self.max_held)
            .field("durability", &self.durability)
            .field("cache_mib", &self.cache_mib)
            .field("busy_timeout", &self.busy_timeout)
            .field("release_hooks", &self.release_hooks.len())
            .field("read_only", &self.read_only)
            .finish_non_exhaustive()
    }
}

impl StoreOptions {
    /// The defaults, without any release hook: for a store that holds no queues.
    pub fn bare() -> StoreOptions {
        StoreOptions {
            max_held: 1_000_000,
            durability: Durability::Full,
            cache_mib: 64,
            busy_timeout: Duration::from_secs(5),
            clock: Arc::new(SystemClock),
            release_hooks: Vec::new(),
            read_only: false,
        }
    }
}

/// Values the core's clients keep per store (a queue declaration cache, say), one per
/// type, made on first use.
#[derive(Default)]
struct Extensions(Mutex<HashMap<TypeId, Arc<dyn Any + Send + Sync>>>);

/// Values the core's clients keep for one write transaction, one per type, made on
/// first use and dropped with the transaction.
///
/// A list, not a map: a transaction holds a value or two, and a completion looks its
/// queue state up several times, where hashing the type's id cost more than the scan.
#[derive(Default)]
pub struct TxState(Vec<(TypeId, Box<dyn Any + Send>)>);

impl TxState {
    /// This transaction's `T`, made with `T::default()` on first use.
    pub fn get<T: Default + Send + 'static>(&mut self) -> &mut T {
        let id = TypeId::of::<T>();
        let at = match self.0.iter().position(|(t, _)| *t == id) {
            Some(at) => at,
            None => {
                self.0.push((id, Box::new(T::default())));
                self.0.len() - 1
            }
        };
        self.0[at].1.downcast_mut().expect("kept with its type")
    }
}

/// The facts this transaction's inserts left held, in order: a client that must not
/// leave a fact invisible (a queue completion's effects) compares it before and after.
#[derive(Default)]
pub(crate) struct HeldHere {
    /// Each fact held by [`Writer::insert`], with one predecessor it waited for.
    pub(crate) facts: Vec<(FactHash, Option<FactHash>)>,
    /// How many facts [`Writer::insert_batch`] calls left held.
    pub(crate) in_batches: u64,
}

/// A fact store over one database.
///
/// Several `Store`s, in one process or many, may open the same file: the database's locks
/// serialise their writes, and each public write is one transaction.
pub struct Store {
    backend: Box<dyn Backend>,
    options: StoreOptions,
    extensions: Extensions,
    /// Bumped by each commit of this store and, on PostgreSQL, by the listener.
    wake: Arc<Wake>,
}

impl Store {
    /// Opens (creating if needed) the store at `path` with default options.
    ///
    /// ```
    /// let dir = tempfile::tempdir()?;
    /// let store = precedent::Store::open(dir.path().join("facts.db"))?;
    /// assert_eq!(store.stats()?.released, 0);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// # Errors
    /// [`Error::SchemaTooNew`] for a database written by a newer precedent;
    /// [`Error::Open`] if its directory does not exist or the file or directory is not
    /// writable; [`Error::Backend`] if the file cannot be opened as a database.
    pub fn open(path: impl AsRef<Path>) -> Result<Store> {
        Store::open_with(path, StoreOptions::default())
    }

    /// Opens the store at `path` with `options`.
    ///
    /// A path whose text starts with `postgres://` or `postgresql://` opens that
    /// PostgreSQL database instead (`Store::open_postgres`, feature `postgres`); in a
    /// build without the feature that is [`Error::Open`] saying so.
    ///
    /// ```
    /// # use precedent::{Error, Store, StoreOptions};
    /// let dir = tempfile::tempdir()?;
    /// let path = dir.path().join("facts.db");
    /// let read_only = StoreOptions { read_only: true, ..StoreOptions::default() };
    /// // A read-only open creates nothing.
    /// assert!(matches!(Store::open_with(&path, read_only.clone()), Err(Error::Open { .. })));
    /// drop(Store::open(&path)?);
    /// let store = Store::open_with(&path, read_only)?;
    /// assert_eq!(store.stats()?.released, 0);
    /// let fact = precedent::Fact::builder("Shop").build()?;
    /// assert!(matches!(store.insert(&fact), Err(Error::ReadOnly { .. })));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// # Errors
    /// As [`Store::open`]; with [`StoreOptions::read_only`], [`Error::Open`] for a missing
    /// file and [`Error::NeedsMigration`] for a database at an older schema version.
    pub fn open_with(path: impl AsRef<Path>, options: StoreOptions) -> Result<Store> {
        let path = path.as_ref();
        if is_postgres_url(path) {
            #[cfg(feature = "postgres")]
            return Store::open_postgres(path.to_str().unwrap_or_default(), options);
            #[cfg(not(feature = "postgres"))]
            return Err(Error::Open {
                path: path.to_path_buf(),
                reason: "this build of precedent has no postgresql support (build it with the \
                         `postgres` feature)"
                    .into(),
            });
        }
        let backend = SqliteBackend::open(path, options.clone())?;
        Ok(Store::with_backend(Box::new(backend), options))
    }

    /// Opens (creating the schema if needed) the store in the PostgreSQL database at
    /// `url`, a libpq URL (`postgres://user:password@host:port/db?sslmode=prefer`):
    /// see `docs/design.md`, "The PostgreSQL backend".
    ///
    /// # Errors
    /// [`Error::Open`] saying why it cannot connect (the server is down, the password was
    /// refused, the server is older than [`MIN_SERVER_VERSION`]);
    /// [`Error::SchemaTooNew`]; with [`StoreOptions::read_only`],
    /// [`Error::NeedsMigration`] for a database at an older schema version.
    #[cfg(feature = "postgres")]
    pub fn open_postgres(url: &str, options: StoreOptions) -> Result<Store> {
        let backend = PostgresBackend::open(url, options.clone())?;
        Ok(Store::with_backend(Box::new(backend), options))
    }

    /// A private store that lives as long as the value, for tests and examples: a
    /// database in a temporary directory, removed on drop, so that it behaves like any
    /// other store (readers beside the writer).
    ///
    /// # Errors
    /// [`Error::Io`] if the temporary directory cannot be made.
    pub fn open_in_memory() -> Result<Store> {
        Store::open_in_memory_with(StoreOptions::default())
    }

    /// A private store with `options` (for tests of bounds).
    ///
    /// # Errors
    /// As [`Store::open_in_memory`].
    pub fn open_in_memory_with(options: StoreOptions) -> Result<Store> {
        let backend = SqliteBackend::temporary(options.clone())?;
        Ok(Store::with_backend(Box::new(backend), options))
    }

    /// A store over any backend.
    pub fn with_backend(backend: Box<dyn Backend>, options: StoreOptions) -> Store {
        Store {
            backend,
            options,
            extensions: Extensions::default(),
            wake: Arc::new(Wake::default()),
        }
    }

    /// The store's wake-ups so far: take a mark *before* reading, then
    /// [`Store::wait_for_wake`] after the read found nothing new.
    pub fn wake_mark(&self) -> WakeMark {
        self.wake.mark()
    }

    /// Waits until something may have been released after `mark`, or until `timeout` has
    /// passed; `true` when woken (read again: a wake-up may find nothing new). Woken by
    /// every commit through this `Store` and, on PostgreSQL, by every commit that
    /// released facts from any process or host (`LISTEN`/`NOTIFY`). Commits by other
    /// processes on SQLite wake nothing: bound the wait by a poll interval.
    ///
    /// ```
    /// # use std::time::Duration;
    /// # use precedent::{Fact, Store};
    /// let store = Store::open_in_memory()?;
    /// let mark = store.wake_mark();
    /// assert!(!store.wait_for_wake(mark, Duration::from_millis(1)));
    /// store.insert(&Fact::builder("Shop").build()?)?;
    /// assert!(store.wait_for_wake(mark, Duration::from_secs(3600)));
    /// # Ok::<(), precedent::Error>(())
    /// ```
    pub fn wait_for_wake(&self, mark: WakeMark, timeout: Duration) -> bool {
        self.backend.listen(&self.wake);
        self.wake.wait(mark, timeout)
    }

    /// Readies the store for a long-running process's first write, so that the first
    /// request a server answers does not pay for cold caches: on PostgreSQL, a push's
    /// first statements run once on an idle connection with no rows, in a transaction
    /// rolled back (its first push of 1,000 facts about 4 ms shorter); on SQLite,
    /// nothing. Writes nothing. `precedent serve` calls it before it listens.
    ///
    /// # Errors
    /// Backend errors (the database unreachable).
    pub fn warm(&self) -> Result<()> {
        self.backend.warm()
    }

    /// The options the store was opened with.
    pub fn options(&self) -> &StoreOptions {
        &self.options
    }

    /// The SQL dialect of the store's backend.
    pub fn dialect(&self) -> Dialect {
        self.backend.dialect()
    }

    /// The database file, or `None` for a private store.
    pub fn path(&self) -> Option<&Path> {
        self.backend.path()
    }

    /// The store's `T`, made with `T::default()` on first use: state a client of the core
    /// (the queue index, an application's own release hook) keeps between transactions.
    pub fn extension<T: Default + Send + Sync + 'static>(&self) -> Arc<T> {
        let mut map = self.extensions.0.lock().unwrap_or_else(|e| e.into_inner());
        map.entry(TypeId::of::<T>())
            .or_insert_with(|| Arc::new(T::default()))
            .clone()
            .downcast()
            .expect("keyed by its type")
    }

    /// Runs `f` in one write transaction: everything it writes commits together when it
    /// returns `Ok`, and nothing is written when it returns `Err` or panics.
    ///
    /// ```
    /// # use precedent::{Fact, Store};
    /// let store = Store::open_in_memory()?;
    /// let shop = Fact::builder("Shop").field("name", "corner").build()?;
    /// let order = Fact::builder("Shop.Order").field("id", 1).predecessor("shop", shop.hash()).build()?;
    /// store.write(|w| {
    ///     w.insert(&order)?; // held: its shop is not stored yet
    ///     w.insert(&shop)?;  // releases both
    ///     Ok(())
    /// })?;
    /// assert_eq!(store.held_count()?, 0);
    /// # Ok::<(), precedent::Error>(())
    /// ```
    ///
    /// # Errors
    /// Whatever `f` returns, or [`Error::Backend`] if the transaction cannot begin or
    /// commit (for example when another process holds the write lock past the busy
    /// timeout: [`Error::is_busy`]).
    pub fn write<T>(&self, f: impl FnOnce(&mut Writer<'_>) -> Result<T>) -> Result<T> {
        let tx = self.backend.write()?;
        let mut writer = Writer {
            tx,
            store: self,
            state: TxState::default(),
            later: Vec::new(),
            wakes: true,
        };
        f(&mut writer).and_then(|value| writer.commit().map(|()| value))
    }

    /// Runs `f` in one read transaction: everything it reads sees the same committed
    /// snapshot. The transaction ends when `f` returns, also by a panic.
    ///
    /// ```
    /// # use precedent::{Fact, Store};
    /// let store = Store::open_in_memory()?;
    /// let shop = Fact::builder("Shop").field("name", "corner").build()?;
    /// store.insert(&shop)?;
    /// // Two reads, one snapshot: nothing committed in between can come between them.
    /// let (seq, last) = store.read(|r| Ok((r.seq_of(&shop.hash())?, r.last_seq()?)))?;
    /// assert_eq!(seq, Some(last));
    /// # Ok::<(), precedent::Error>(())
    /// ```
    ///
    /// # Errors
    /// Whatever `f` returns, or [`Error::Backend`].
    pub fn read<T>(&self, f: impl FnOnce(&dyn ReadTx) -> Result<T>) -> Result<T> {
        let tx = self.backend.read()?;
        f(&*tx)
    }

    /// As [`Store::read`], for a read known to be short (a watch's poll): the backend may
    /// run it on its write connection, whose cache the last write left warm, when no
    /// writer holds it.
    pub(crate) fn read_brief<T>(&self, f: impl FnOnce(&dyn ReadTx) -> Result<T>) -> Result<T> {
        let tx = self.backend.read_brief()?;
        f(&*tx)
    }

    /// How many times, since the store was opened, the database prepared a statement run
    /// through [`Sql`] again (for tests that a watch's polls keep theirs prepared).
    pub fn query_reprepares(&self) -> u64 {
        self.backend.reprepares()
    }

    /// Inserts one fact in its own transaction.
    ///
    /// The same fact again is [`InsertOutcome::Duplicate`] and changes nothing. A fact with
    /// absent predecessors is [`InsertOutcome::Held`]; it is released, in the transaction
    /// that brings its last missing ancestor, together with everything waiting on it.
    ///
    /// # Errors
    /// [`Error::HeldLimit`] if the fact would be held past [`StoreOptions::max_held`];
    /// [`Error::Backend`].
    pub fn insert(&self, fact: &Fact) -> Result<InsertOutcome> {
        self.write(|w| w.insert(fact))
    }

    /// Inserts a batch of facts in any order in one transaction (see
    /// [`Writer::insert_batch`]).
    ///
    /// ```
    /// # use precedent::{Fact, Store};
    /// let store = Store::open_in_memory()?;
    /// let shop = Fact::builder("Shop").field("name", "corner").build()?;
    /// let order = Fact::builder("Shop.Order").field("id", 1).predecessor("shop", shop.hash()).build()?;
    /// // Children first, and a duplicate: stored parents first, once each.
    /// let report = store.insert_batch(vec![order.clone(), shop.clone(), order.clone()])?;
    /// assert_eq!((report.inserted, report.duplicates, report.held), (2, 1, 0));
    /// assert!(store.seq_of(&shop.hash())? < store.seq_of(&order.hash())?);
    /// # Ok::<(), precedent::Error>(())
    /// ```
    ///
    /// # Errors
    /// [`Error::Backend`]; nothing of the batch is written then.
    pub fn insert_batch(&self, facts: Vec<Fact>) -> Result<BatchReport> {
        self.write(|w| w.insert_batch(facts))
    }

    /// A released fact by hash; `None` if it is absent or held.
    ///
    /// # Errors
    /// [`Error::Corrupt`] if the stored bytes do not re-hash to the key.
    pub fn get(&self, hash: &FactHash) -> Result<Option<Fact>> {
        self.read(|r| r.get(hash))
    }

    /// A fact by hash, released or held.
    ///
    /// # Errors
    /// [`Error::Corrupt`] if the stored bytes do not re-hash to the key.
    pub fn lookup(&self, hash: &FactHash) -> Result<Option<StoredFact>> {
        self.read(|r| r.lookup(hash))
    }

    /// Resolves a full hash or a prefix of at least 8 hex digits to the one stored fact
    /// (released or held) it names.
    ///
    /// # Errors
    /// [`Error::BadHash`], [`Error::UnknownPrefix`] or [`Error::AmbiguousPrefix`].
    pub fn resolve(&self, text: &str) -> Result<FactHash> {
        let prefix = HashPrefix::parse(text)?;
        self.read(|r| r.resolve_prefix(&prefix))
    }

    /// The release sequence number of a fact, if released.
    ///
    /// # Errors
    /// [`Error::Backend`].
    pub fn seq_of(&self, hash: &FactHash) -> Result<Option<i64>> {
        self.read(|r| r.seq_of(hash))
    }

    /// Released facts that name `hash` as a predecessor, optionally only through `role`
    /// and only of `type_name`, in release order.
    ///
    /// ```
    /// # use precedent::{Fact, Store};
    /// let store = Store::open_in_memory()?;
    /// let shop = Fact::builder("Shop").field("name", "corner").build()?;
    /// let order = Fact::builder("Shop.Order").field("id", 1).predecessor("shop", shop.hash()).build()?;
    /// store.insert_batch(vec![shop.clone(), order.clone()])?;
    /// let orders = store.successors(&shop.hash(), Some("shop"), Some("Shop.Order"))?;
    /// assert_eq!(orders, vec![order]);
    /// assert!(store.successors(&shop.hash(), Some("owner"), None)?.is_empty());
    /// # Ok::<(), precedent::Error>(())
    /// ```
    ///
    /// # Errors
    /// [`Error::Corrupt`], [`Error::Backend`].
    pub fn successors(
        &self,
        hash: &FactHash,
        role: Option<&str>,
        type_name: Option<&str>,
    ) -> Result<Vec<Fact>> {
        self.read(|r| {
            let Some(seq) = r.seq_of(hash)? else {
                return Ok(Vec::new());
            };
            let id = |role: bool, name: Option<&str>| match name {
                Some(n) => r.name_id(role, n).map(|id| id.map(Some)),
                None => Ok(Some(None)),
            };
            // A role or type no fact uses: nothing can match.
            let (Some(role_id), Some(type_id)) = (id(true, role)?, id(false, type_name)?) else {
                return Ok(Vec::new());
            };
            r.successors(seq, role_id, type_id)
        })
    }

    /// The direct predecessors of a released fact, as (role, fact), by role then hash.
    ///
    /// # Errors
    /// [`Error::NotFound`] if the fact is not stored; [`Error::Corrupt`].
    pub fn predecessors(&self, hash: &FactHash) -> Result<Vec<(String, Fact)>> {
        self.read(|r| {
            let stored = r.lookup(hash)?.ok_or(Error::NotFound { hash: *hash })?;
            let mut out = Vec::new();
            for (role, set) in stored.fact.predecessors() {
                for p in set {
                    if let Some(f) = r.get(p)? {
                        out.push((role.clone(), f));
                    }
                }
            }
            Ok(out)
        })
    }

    /// Every released ancestor of a released fact (transitively), in release order.
    ///
    /// # Errors
    /// [`Error::Backend`].
    pub fn ancestors(&self, hash: &FactHash) -> Result<Vec<FactHash>> {
        self.walk(hash, true)
    }

    /// Every released descendant of a released fact (transitively), in release order.
    ///
    /// # Errors
    /// [`Error::Backend`].
    pub fn descendants(&self, hash: &FactHash) -> Result<Vec<FactHash>> {
        self.walk(hash, false)
    }

    fn walk(&self, hash: &FactHash, up: bool) -> Result<Vec<FactHash>> {
        self.read(|r| match r.seq_of(hash)? {
            Some(seq) => r.walk(seq, up),
            None => Ok(Vec::new()),
        })
    }

    /// Released facts of one type, in release order.
    ///
    /// # Errors
    /// [`Error::Corrupt`], [`Error::Backend`].
    pub fn facts_of_type(&self, type_name: &str) -> Result<Vec<Fact>> {
        self.read(|r| {
            let mut out = Vec::new();
            if let Some(type_id) = r.name_id(false, type_name)? {
                r.for_each_of_type(type_id, &mut |f| {
                    out.push(f);
                    Ok(())
                })?;
            }
            Ok(out)
        })
    }

    /// Held facts with the predecessors each waits for, oldest first (up to `limit`).
    ///
    /// ```
    /// # use precedent::{Fact, Store};
    /// let store = Store::open_in_memory()?;
    /// let shop = Fact::builder("Shop").field("name", "corner").build()?;
    /// let order = Fact::builder("Shop.Order").field("id", 1).predecessor("shop", shop.hash()).build()?;
    /// store.insert(&order)?;
    /// let held = store.held(10)?;
    /// assert_eq!(held[0].missing, vec![shop.hash()]);
    /// assert_eq!(store.get(&order.hash())?, None); // not visible until released
    /// # Ok::<(), precedent::Error>(())
    /// ```
    ///
    /// # Errors
    /// [`Error::Corrupt`], [`Error::Backend`].
    pub fn held(&self, limit: usize) -> Result<Vec<HeldFact>> {
        self.read(|r| r.held(limit))
    }

    /// Calls `f` with each released fact's sequence number, hash and canonical bytes, in
    /// release order, for facts with `seq > after`. Streams: one row in memory at a time,
    /// all from one snapshot. Stops early if `f` returns an error, which is passed on.
    ///
    /// # Errors
    /// Whatever `f` returns; [`Error::Corrupt`] at a row whose bytes do not hash to its
    /// key; [`Error::Backend`].
    pub fn for_each_released(
        &self,
        after: i64,
        mut f: impl FnMut(i64, FactHash, &[u8]) -> Result<()>,
    ) -> Result<()> {
        self.read(|r| r.for_each_released(after, i64::MAX, &mut f))
    }

    /// The number of held facts (read from a counter, without a scan).
    ///
    /// # Errors
    /// [`Error::Backend`].
    pub fn held_count(&self) -> Result<u64> {
        self.read(|r| r.held_count())
    }

    /// Counts per type, held and edges, and the database size.
    ///
    /// # Errors
    /// [`Error::Backend`].
    pub fn stats(&self) -> Result<Stats> {
        self.read(|r| r.stats())
    }

    /// Checks the whole store. `progress` is called with the number of facts checked so
    /// far.
    ///
    /// Checks that every stored row re-hashes to its key and decodes strictly; that every
    /// released fact's predecessors are released with a lower sequence number and its
    /// edge rows match its predecessors, with both facts' types; that every held fact
    /// waits for exactly its absent predecessors and the held counter is right; and the
    /// database's own integrity check.
    ///
    /// # Errors
    /// [`Error::Backend`] if the database cannot be read at all; damage it can read past
    /// is reported in [`VerifyReport::problems`].
    pub fn verify(&self, mut progress: impl FnMut(u64)) -> Result<VerifyReport> {
        self.read(|r| r.verify(&mut progress))
    }
}

/// A write transaction on a store. Everything written through it commits together when
/// the closure given to [`Store::write`] returns `Ok`; dropping it rolls back.
pub struct Writer<'a> {
    tx: Box<dyn WriteTx + 'a>,
    store: &'a Store,
    state: TxState,
    /// Facts release hooks asked for, inserted once the current insert returns.
    later: Vec<Fact>,
    /// The commit wakes the store's waiters ([`Store::wait_for_wake`]); not when the
    /// transaction is known to have changed nothing they wait for ([`Writer::quiet`]).
    wakes: bool,
}

impl<'a> Writer<'a> {
    /// Inserts one fact (see [`Store::insert`]).
    ///
    /// # Errors
    /// [`Error::HeldLimit`] if the fact would be held past the bound; [`Error::Backend`].
    pub fn insert(&mut self, fact: &Fact) -> Result<InsertOutcome> {
        let outcome = self.tx.insert(
            fact,
            &mut runner(self.store, &mut self.state, &mut self.later),
        )?;
        if let InsertOutcome::Held { missing } = &outcome {
            let held = self.state.get::<HeldHere>();
            held.facts.push((fact.hash(), missing.first().copied()));
        }
        self.insert_later()?;
        Ok(outcome)
    }

    /// Inserts facts given in any order, in this one transaction: duplicates collapse,
    /// facts are put in parent-before-child order, and every fact whose ancestry is
    /// complete is released.
    ///
    /// # Errors
    /// [`Error::Backend`]; a fact refused by the held bound is listed in
    /// [`BatchReport::refused`] instead of failing the batch.
    pub fn insert_batch(&mut self, facts: Vec<Fact>) -> Result<BatchReport> {
        let report = self.tx.insert_batch(
            facts,
            &mut runner(self.store, &mut self.state, &mut self.later),
        )?;
        self.batch_done(report)
    }

    /// What follows a batch: its held facts counted, and what its hooks asked for
    /// inserted.
    fn batch_done(&mut self, report: BatchReport) -> Result<BatchReport> {
        self.state.get::<HeldHere>().in_batches += report.held;
        self.insert_later()?;
        Ok(report)
    }

    /// [`Writer::insert_batch`] of the facts `facts` yields, about `hint` of them: a
    /// backend may store the first while the last are still being made (a push's facts
    /// as they are decoded).
    #[cfg(feature = "server")]
    pub(crate) fn insert_streamed(
        &mut self,
        facts: &mut dyn Iterator<Item = Fact>,
        hint: usize,
    ) -> Result<BatchReport> {
        let report = self.tx.insert_streamed(
            facts,
            hint,
            &mut runner(self.store, &mut self.state, &mut self.later),
        )?;
        self.batch_done(report)
    }

    /// The highest release sequence, under the write lock, before an
    /// [`Writer::insert_streamed`] of about `hint` facts
    /// ([`WriteTx::last_seq_before_stream`]).
    #[cfg(feature = "server")]
    pub(crate) fn last_seq_before_stream(&mut self, hint: usize) -> Result<i64> {
        self.tx.last_seq_before_stream(hint)
    }

    /// Inserts what release hooks asked for, and what those inserts ask for in turn.
    fn insert_later(&mut self) -> Result<()> {
        while !self.later.is_empty() {
            let facts = std::mem::take(&mut self.later);
            for fact in facts {
                self.tx.insert(
                    &fact,
                    &mut runner(self.store, &mut self.state, &mut self.later),
                )?;
            }
        }
        Ok(())
    }

    /// The release sequence of `hash`, if it is released (in this transaction too).
    ///
    /// # Errors
    /// [`Error::Backend`].
    pub fn released_seq(&self, hash: &FactHash) -> Result<Option<i64>> {
        self.tx.seq_of(hash)
    }

    /// Notes that `fact` is released as `seq`, as the caller read in this transaction, so
    /// that an insert naming it skips its lookup (see [`WriteTx::assume_released`]).
    ///
    /// # Errors
    /// [`Error::Backend`].
    pub(crate) fn assume_released(&mut self, fact: &Fact, seq: i64) -> Result<()> {
        self.tx.assume_released(fact, seq)
    }

    /// See [`WriteTx::write_ahead`].
    pub(crate) fn write_ahead(&mut self, on: bool) -> Result<bool> {
        self.tx.write_ahead(on)
    }

    /// See [`WriteTx::ahead_lost`].
    pub(crate) fn ahead_lost(&self) -> bool {
        self.tx.ahead_lost()
    }

    /// Resolves a hash prefix against released and held facts.
    ///
    /// # Errors
    /// [`Error::UnknownPrefix`] or [`Error::AmbiguousPrefix`].
    pub fn resolve_prefix(&self, prefix: &HashPrefix) -> Result<FactHash> {
        self.tx.resolve_prefix(prefix)
    }

    /// This transaction's reads and SQL: for an application's own tables, written in the
    /// same commit as its facts (in the backend's [`Sql::dialect`]). Do not write
    /// precedent's tables through it.
    pub fn sql(&self) -> &dyn ReadTx {
        self.tx.as_read()
    }

    /// The store this transaction writes to.
    pub fn store(&self) -> &'a Store {
        self.store
    }

    /// Takes the store's write lock now, if this transaction has not: from here on no
    /// other writer releases a fact before this transaction ends. SQLite's write
    /// transaction holds the one writer from its start; PostgreSQL's takes its lock as
    /// reading the highest seq does (`ReadTx::last_seq` on a write transaction).
    pub(crate) fn lock_writers(&self) -> Result<()> {
        self.sql().last_seq().map(drop)
    }

    /// The store's clock, in milliseconds since the Unix epoch.
    pub fn now_ms(&self) -> i64 {
        self.store.options.clock.now_ms()
    }

    /// This transaction's reads and SQL beside its [`TxState`], for a client that needs
    /// both at once.
    pub fn split(&mut self) -> (&dyn ReadTx, &mut TxState) {
        (self.tx.as_read(), &mut self.state)
    }

    /// This transaction's `T`, made on first use (see [`TxState`]).
    pub fn state<T: Default + Send + 'static>(&mut self) -> &mut T {
        self.state.get()
    }

    /// Runs `f` in a savepoint: when it fails, what it wrote is undone and the rest of the
    /// transaction is kept.
    ///
    /// # Errors
    /// Whatever `f` returns; [`Error::Backend`].
    pub fn savepoint<T>(&mut self, f: impl FnOnce(&mut Writer<'a>) -> Result<T>) -> Result<T> {
        self.tx.savepoint()?;
        let hooks = &self.store.options.release_hooks;
        for hook in hooks {
            hook.savepoint_opened(&mut self.state);
        }
        // What hooks ask to insert next goes with the savepoint's writes.
        let later = self.later.len();
        let result = f(self);
        match &result {
            Ok(_) => self.tx.release_savepoint()?,
            Err(_) => {
                self.tx.rollback_savepoint()?;
                self.later.truncate(later);
            }
        }
        // Told after the database, so that a hook sees the savepoint's fate as it is.
        for hook in hooks {
            hook.savepoint_closed(&mut self.state, result.is_err());
        }
        result
    }

    fn commit(mut self) -> Result<()> {
        let hooks = &self.store.options.release_hooks;
        if !hooks.is_empty() {
            let mut later = Vec::new();
            let mut ctx = HookCtx {
                tx: self.tx.as_read(),
                state: &mut self.state,
                store: self.store,
                later: &mut later,
                predecessors: &|_| None,
            };
            for hook in hooks {
                hook.before_commit(&mut ctx)?;
            }
        }
        self.tx.commit()?;
        if self.wakes {
            self.store.wake.wake_all();
        }
        Ok(())
    }

    /// This transaction changed nothing a waiter waits for (a claim that found nothing to
    /// hand out): its commit wakes no one. Without it a waiter that claims and then waits
    /// (a remote worker's long-poll) was woken by its own empty claim and claimed again at
    /// once, for as long as it waited, and two such waiters woke each other.
    pub(crate) fn quiet(&mut self) {
        self.wakes = false;
    }
}

fn runner<'r>(
    store: &'r Store,
    state: &'r mut TxState,
    later: &'r mut Vec<Fact>,
) -> HookRunner<'r> {
    HookRunner {
        store,
        state,
        later,
        #[cfg(feature = "postgres")]
        later_marks: Vec::new(),
    }
}
