//! The SQLite backend: one write connection and a pool of read connections on one
//! database file in WAL mode, the schema migrations, and all SQL of the fact core.
//!
//! - `conn.rs`: transactions ([`Tx`]), the [`Sql`](crate::store::Sql) seam over rusqlite,
//!   errors.
//! - `names.rs`: type and role ids, cached.
//! - `write.rs`: inserts, the held set and its cascades, release.
//! - `held.rs`: dropping held facts (and what waits for them) from the held set.
//! - `read.rs`: reads; `verify.rs`: the whole-store check.
//! - `functions.rs`: the scalar functions compiled queries call.
//!
//! Concurrency: writes take the one write connection (a mutex in this process, SQLite's
//! write lock across processes); reads take a connection of their own from the pool, so
//! they run beside the writer and beside each other, each on a snapshot (WAL).

mod conn;
mod functions;
mod held;
mod names;
#[cfg(test)]
mod plans;
mod read;
mod verify;
mod write;

use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicU64;
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

use rusqlite::{Connection, OpenFlags};

use super::backend::{Backend, ReadTx, WriteTx};
use super::{Durability, StoreOptions};
use crate::error::{BackendError, BackendErrorKind, Error, Result};
pub(crate) use conn::Tx;
use names::NameCache;

/// Schema migrations, applied in order. `PRAGMA user_version` records how many ran.
const MIGRATIONS: &[&str] = &[
    include_str!("../../../schema/001_initial.sql"),
    include_str!("../../../schema/002_queues.sql"),
    include_str!("../../../schema/003_sync.sql"),
    include_str!("../../../schema/004_held_set.sql"),
    include_str!("../../../schema/005_edge_types.sql"),
    include_str!("../../../schema/006_store_identity.sql"),
    include_str!("../../../schema/007_queue_controls.sql"),
    include_str!("../../../schema/008_queue_priority.sql"),
];

/// Brings a `held` set written before `001_initial.sql` gained row ids (databases of
/// versions 1 and 2, and 3 as first released: `held` keyed by hash, `held_wait.waiter` a
/// hash) to the layout migration 4 starts from: rows numbered in the order they were
/// held, waiters by row id.
const HELD_ROW_IDS: &str = "
    CREATE TABLE held_ids (
        id      INTEGER PRIMARY KEY,
        hash    BLOB NOT NULL UNIQUE,
        bytes   BLOB NOT NULL,
        missing INTEGER NOT NULL CHECK (missing > 0),
        held_at INTEGER NOT NULL
    );
    INSERT INTO held_ids (hash, bytes, missing, held_at)
        SELECT hash, bytes, missing, held_at FROM held ORDER BY held_at, hash;
    CREATE TABLE held_wait_ids (
        missing BLOB NOT NULL,
        waiter  INTEGER NOT NULL,
        PRIMARY KEY (missing, waiter)
    ) WITHOUT ROWID;
    INSERT INTO held_wait_ids (missing, waiter)
        SELECT w.missing, h.id FROM held_wait w JOIN held_ids h ON h.hash = w.waiter;
    DROP TABLE held_wait;
    DROP TABLE held;
    ALTER TABLE held_ids RENAME TO held;
    ALTER TABLE held_wait_ids RENAME TO held_wait;
";

/// The schema version this binary writes.
pub const SCHEMA_VERSION: u32 = MIGRATIONS.len() as u32;

/// Read connections kept open between reads.
const IDLE_READERS: usize = 4;

/// The bytes SQLite has allocated in this process and not freed: the page caches of every
/// open connection (each up to [`StoreOptions::cache_mib`]), prepared statements and
/// schemas, of every SQLite store the process has open (`sqlite3_memory_used`).
pub fn sqlite_memory_used() -> u64 {
    // SAFETY: sqlite3_memory_used takes no arguments and is thread-safe; it reads the
    // counters of SQLite's allocator, which the bundled build keeps (memstatus on).
    let n = unsafe { rusqlite::ffi::sqlite3_memory_used() };
    n.max(0) as u64
}

/// Sets a soft limit on the bytes SQLite may allocate in this process, for every SQLite
/// connection it has open (this store's, other stores', and an application's own, which
/// share the bundled library); 0 removes the limit. Returns the limit it replaces.
///
/// Past the limit SQLite frees pages from the page caches of the connection that asks
/// for memory before it allocates more, so the caches of all connections together stay
/// near the limit instead of growing to [`StoreOptions::cache_mib`](crate::StoreOptions)
/// each; pages it drops are read again from the file (usually from the operating
/// system's cache). It is soft: an allocation that cannot be met by freeing cache still
/// succeeds. `precedent serve` sets it (`--sqlite-memory`, default 16 MiB) because it
/// opens up to `--store-threads` connections; a library does not set it on its own.
pub fn set_sqlite_memory_limit(bytes: u64) -> u64 {
    let n = i64::try_from(bytes).unwrap_or(i64::MAX);
    // SAFETY: sqlite3_soft_heap_limit64 takes a plain integer and is thread-safe (it
    // takes SQLite's memory mutex); a negative argument would only read the limit.
    let before = unsafe { rusqlite::ffi::sqlite3_soft_heap_limit64(n) };
    before.max(0) as u64
}

/// What every transaction of one backend shares.
pub(crate) struct Shared {
    pub(crate) names: NameCache,
    /// The options the store was opened with (the held bound, the clock, the timeouts).
    pub(crate) options: StoreOptions,
    /// How many times SQLite prepared a statement run through [`crate::store::Sql`] again.
    pub(crate) reprepares: AtomicU64,
}

/// A store's database in SQLite.
pub struct SqliteBackend {
    /// Taken before `writer`, with the busy timeout: in-process writers wait for each
    /// other as long as SQLite would make writers in other processes wait.
    write_lock: WriteLock,
    writer: Mutex<Connection>,
    readers: Mutex<Vec<Connection>>,
    shared: Shared,
    path: PathBuf,
    /// The private directory of a store opened with [`crate::Store::open_in_memory`],
    /// removed when the store is dropped.
    temp: Option<PathBuf>,
    /// Whether connections open the file as immutable (see [`first_connection`]).
    immutable: bool,
    /// Called with the text of every statement run, on every connection (tests only).
    #[cfg(test)]
    tracer: Mutex<Option<fn(&str)>>,
}

impl SqliteBackend {
    /// Opens (creating if needed) the database at `path` and migrates it.
    ///
    /// # Errors
    /// [`Error::SchemaTooNew`]; [`Error::Backend`] if the file cannot be opened.
    pub fn open(path: &Path, options: StoreOptions) -> Result<SqliteBackend> {
        SqliteBackend::open_at(path.to_path_buf(), options, None)
    }

    /// A private database in a fresh temporary directory, removed on drop: a real file,
    /// so that its readers run beside its writer as in any other store.
    ///
    /// # Errors
    /// [`Error::Io`] if the directory cannot be made.
    pub fn temporary(options: StoreOptions) -> Result<SqliteBackend> {
        static COUNT: AtomicU64 = AtomicU64::new(0);
        let n = COUNT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!(
            "precedent-{}-{n}-{:x}",
            std::process::id(),
            fastrand::u64(..)
        ));
        std::fs::create_dir_all(&dir)?;
        let result = SqliteBackend::open_at(dir.join("store.db"), options, Some(dir.clone()));
        if result.is_err() {
            let _ = std::fs::remove_dir_all(&dir);
        }
        result
    }

    fn open_at(path: PathBuf, options: StoreOptions, temp: Option<PathBuf>) -> Result<Self> {
        check_path(&path, options.read_only)?;
        let (writer, immutable) = first_connection(&path, &options, temp.is_some())
            .map_err(|e| explain_open(e, &path))?;
        Ok(SqliteBackend {
            immutable,
            write_lock: WriteLock::default(),
            writer: Mutex::new(writer),
            readers: Mutex::new(Vec::new()),
            shared: Shared {
                names: NameCache::default(),
                options,
                reprepares: AtomicU64::new(0),
            },
            path,
            temp,
            #[cfg(test)]
            tracer: Mutex::new(None),
        })
    }

    /// Calls `f` with the text of every statement the backend runs from now on, on the
    /// write connection and on every read connection (tests only).
    #[cfg(test)]
    pub(crate) fn trace(&self, f: fn(&str)) {
        *lock(&self.tracer) = Some(f);
        lock(&self.readers).clear();
        install_trace(&mut lock(&self.writer), f);
    }

    fn reader(&self) -> Result<Connection> {
        if let Some(c) = lock(&self.readers).pop() {
            return Ok(c);
        }
        #[allow(unused_mut)]
        let mut c = connect(
            &self.path,
            &self.shared.options,
            self.temp.is_some(),
            self.immutable,
        )?;
        // A read transaction must not write: SQLite refuses it instead of us trusting it.
        c.pragma_update(None, "query_only", true)?;
        #[cfg(test)]
        if let Some(f) = *lock(&self.tracer) {
            install_trace(&mut c, f);
        }
        Ok(c)
    }

    fn give_back(&self, conn: Connection) {
        let mut idle = lock(&self.readers);
        if idle.len() < IDLE_READERS {
            idle.push(conn);
        }
    }
}

#[cfg(test)]
fn install_trace(conn: &mut Connection, f: fn(&str)) {
    use rusqlite::trace::{TraceEvent, TraceEventCodes};
    let _ = conn.trace_v2(
        TraceEventCodes::SQLITE_TRACE_STMT,
        Some(move |e: TraceEvent<'_>| {
            if let TraceEvent::Stmt(stmt, _) = e {
                f(&stmt.sql());
            }
        }),
    );
}

/// The in-process turn to write: a flag and a condition variable, so that a writer waits
/// at most the busy timeout (a plain mutex would wait for ever) and is woken, not polled,
/// when the writer before it finishes.
#[derive(Default)]
struct WriteLock {
    /// The thread whose write transaction is open, if any.
    taken: Mutex<Option<std::thread::ThreadId>>,
    freed: Condvar,
}

/// A writer's turn, given back on drop.
pub(crate) struct Turn<'a>(&'a WriteLock);

impl WriteLock {
    /// The turn if no writer holds it now; never waits.
    fn try_acquire(&self) -> Option<Turn<'_>> {
        let mut taken = lock(&self.taken);
        if taken.is_some() {
            return None;
        }
        *taken = Some(std::thread::current().id());
        Some(Turn(self))
    }

    fn acquire(&self, timeout: Duration) -> Result<Turn<'_>> {
        let deadline = Instant::now() + timeout;
        let me = std::thread::current().id();
        let mut taken = lock(&self.taken);
        if *taken == Some(me) {
            // Waiting would wait for ourselves until the timeout: say what is wrong now.
            return Err(Error::Backend(BackendError::new(
                BackendErrorKind::Other,
                "a write transaction is already open on this thread: write through its Writer \
                 instead of calling Store::write (or insert, claim, ...) inside it",
            )));
        }
        while taken.is_some() {
            let now = Instant::now();
            if now >= deadline {
                return Err(Error::Backend(BackendError::new(
                    BackendErrorKind::Busy,
                    format!(
                        "sqlite: database is busy: another writer in this process held it past the {} ms busy timeout",
                        timeout.as_millis()
                    ),
                )));
            }
            taken = self
                .freed
                .wait_timeout(taken, deadline - now)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
        *taken = Some(me);
        Ok(Turn(self))
    }
}

impl Drop for Turn<'_> {
    fn drop(&mut self) {
        *lock(&self.0.taken) = None;
        self.0.freed.notify_one();
    }
}

/// Locks a mutex whose holder may have panicked: every holder here ends its transaction
/// on drop (rollback), so the data behind a poisoned lock is as good as any.
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Says what is wrong with `path` before SQLite does: SQLite's own answer for a missing
/// directory or (read-only) a missing file is "unable to open database file", at every
/// step that touches it.
fn check_path(path: &Path, read_only: bool) -> Result<()> {
    let open = |reason: String| Error::Open {
        path: path.to_path_buf(),
        reason,
    };
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty())
        && !dir.is_dir()
    {
        return Err(open(if dir.exists() {
            format!("{} is not a directory", dir.display())
        } else {
            format!("directory {} does not exist", dir.display())
        }));
    }
    if read_only && !path.exists() {
        return Err(open(
            "no database there, and a read-only open creates none".into(),
        ));
    }
    Ok(())
}

/// An I/O failure while opening, said with the path and what usually causes it.
fn explain_open(err: Error, path: &Path) -> Error {
    let Error::Backend(b) = &err else {
        return err;
    };
    if b.kind != BackendErrorKind::Io {
        return err;
    }
    let dir = path
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let name = path.file_name().unwrap_or_default().to_string_lossy();
    let said = b.message.trim_start_matches("sqlite: ");
    let reason = if said.contains("readonly") || said.contains("unable to open") {
        format!(
            "{said}: the file or its directory {} is not writable, or the file not readable \
             (SQLite keeps {name}-wal and {name}-shm beside the database, also to read it)",
            dir.display()
        )
    } else {
        said.to_string()
    };
    Error::Open {
        path: path.to_path_buf(),
        reason,
    }
}

/// The first connection, migrated, and whether it reads the file as immutable.
///
/// NOTE: a read-only open of a database in WAL mode needs its `-shm` file, which SQLite
/// cannot create in a directory it may not write ("attempt to write a readonly
/// database"). When there is no `-wal` file either, no connection to the database is
/// open anywhere (SQLite removes it when the last one closes), so the file holds every
/// commit, and it is opened as immutable: read without locks or a `-shm`. A writer that
/// starts meanwhile is not seen, which is why this is only for `read_only`.
fn first_connection(
    path: &Path,
    options: &StoreOptions,
    temporary: bool,
) -> Result<(Connection, bool)> {
    let open = |immutable| {
        let c = connect(path, options, temporary, immutable)?;
        migrate(&c, path, options.read_only)?;
        Ok::<_, Error>(c)
    };
    match open(false) {
        Err(Error::Backend(b))
            if options.read_only
                && b.kind == BackendErrorKind::Io
                && !sibling(path, "-wal").exists() =>
        {
            open(true).map(|c| (c, true)).map_err(|_| Error::Backend(b))
        }
        other => other.map(|c| (c, false)),
    }
}

/// `path` with `suffix` appended to its file name (`x.db-wal`).
fn sibling(path: &Path, suffix: &str) -> PathBuf {
    let mut s = path.as_os_str().to_owned();
    s.push(suffix);
    PathBuf::from(s)
}

/// `file:` URI for `path` read as immutable, with the characters a URI gives a meaning
/// to escaped.
fn immutable_uri(path: &Path) -> Option<String> {
    let mut uri = String::from("file:");
    for c in path.to_str()?.chars() {
        match c {
            '%' | '?' | '#' => uri.push_str(&format!("%{:02X}", c as u32)),
            c => uri.push(c),
        }
    }
    uri.push_str("?immutable=1");
    Some(uri)
}

fn connect(
    path: &Path,
    options: &StoreOptions,
    temporary: bool,
    immutable: bool,
) -> Result<Connection> {
    let access = if options.read_only {
        OpenFlags::SQLITE_OPEN_READ_ONLY
    } else {
        OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_CREATE
    };
    let flags = access | OpenFlags::SQLITE_OPEN_NO_MUTEX;
    let conn = match immutable_uri(path).filter(|_| immutable) {
        Some(uri) => Connection::open_with_flags(uri, flags | OpenFlags::SQLITE_OPEN_URI)?,
        None => Connection::open_with_flags(path, flags)?,
    };
    conn.busy_timeout(options.busy_timeout)?;
    // WAL lets readers, in this process and others, proceed while one writer commits.
    // A read-only connection cannot change the mode; the database's is WAL already
    // (it was set by the open that created it).
    if !options.read_only {
        use_wal(&conn)?;
    }
    let sync = match (temporary, options.durability) {
        // A temporary store is gone with the process: no commit needs to reach the disk.
        (true, _) => "OFF",
        (false, Durability::Full) => "FULL",
        (false, Durability::Normal) => "NORMAL",
    };
    conn.pragma_update(None, "synchronous", sync)?;
    conn.pragma_update(None, "cache_size", -(options.cache_mib as i64) * 1024)?;
    conn.pragma_update(None, "foreign_keys", "OFF")?;
    conn.set_prepared_statement_cache_capacity(64);
    functions::register(&conn)?;
    Ok(conn)
}

/// Switches the database to WAL (once per file; a no-op after that), and says so if it
/// could not.
///
/// IMPORTANT: SQLite returns the pragma's row before it commits the switch, which happens
/// when the statement runs to its end. `pragma_update` stops at the row and finalizes,
/// where an error (a failed read, write or sync, found by tests/io_faults.rs) is dropped:
/// the open would then succeed on a database left in rollback mode. So the statement is
/// stepped to its end here, and the mode it reports is checked.
fn use_wal(conn: &Connection) -> Result<()> {
    let mut stmt = conn.prepare("PRAGMA journal_mode = WAL")?;
    let mut rows = stmt.query([])?;
    let mut mode = String::new();
    while let Some(row) = rows.next()? {
        mode = row.get(0)?;
    }
    if !mode.eq_ignore_ascii_case("wal") {
        return Err(Error::Backend(BackendError::new(
            BackendErrorKind::Io,
            format!("sqlite: could not switch the database to WAL: journal mode is {mode:?}"),
        )));
    }
    Ok(())
}

impl Backend for SqliteBackend {
    fn read(&self) -> Result<Box<dyn ReadTx + '_>> {
        let conn = self.reader()?;
        Ok(Box::new(Tx::begin_read(
            conn::Pooled {
                conn: Some(conn),
                backend: self,
            },
            &self.shared,
        )?))
    }

    fn read_brief(&self) -> Result<Box<dyn ReadTx + '_>> {
        // The write connection's page cache holds what the last write touched, which a
        // pooled reader would have to read again: a short read right after a write (a
        // watch's poll) is cheaper there. Only when no writer holds it, and without
        // waiting: a writer that comes meanwhile waits for the read, as for a write.
        let Some(turn) = self.write_lock.try_acquire() else {
            return self.read();
        };
        let guard = lock(&self.writer);
        let mut tx = Tx::begin_read(guard, &self.shared)?;
        tx.turn = Some(turn);
        Ok(Box::new(tx))
    }

    fn write(&self) -> Result<Box<dyn WriteTx + '_>> {
        if self.shared.options.read_only {
            return Err(Error::ReadOnly {
                path: self.path.clone(),
            });
        }
        let turn = self.write_lock.acquire(self.shared.options.busy_timeout)?;
        let guard = lock(&self.writer);
        Ok(Box::new(write::SqliteWrite::begin(
            turn,
            guard,
            &self.shared,
        )?))
    }

    fn dialect(&self) -> crate::store::Dialect {
        crate::store::Dialect::Sqlite
    }

    fn reprepares(&self) -> u64 {
        self.shared
            .reprepares
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    fn path(&self) -> Option<&Path> {
        if self.temp.is_some() {
            None
        } else {
            Some(&self.path)
        }
    }
}

impl Drop for SqliteBackend {
    fn drop(&mut self) {
        if let Some(dir) = &self.temp {
            lock(&self.readers).clear();
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

fn has_column(conn: &Connection, table: &str, column: &str) -> Result<bool> {
    Ok(conn
        .prepare("SELECT 1 FROM pragma_table_info(?1) WHERE name = ?2")?
        .exists([table, column])?)
}

/// Applies the migrations the database lacks; refuses a database newer than the binary,
/// and, when `read_only`, one that lacks migrations.
fn migrate(conn: &Connection, path: &Path, read_only: bool) -> Result<()> {
    let found: u32 = conn.pragma_query_value(None, "user_version", |r| r.get(0))?;
    if !super::shared::needs_migration(found, SCHEMA_VERSION, read_only, path)? {
        return Ok(());
    }
    conn.execute_batch("BEGIN IMMEDIATE")?;
    let result = (|| -> Result<()> {
        // Re-read under the write lock: another process may have migrated meanwhile.
        let now: u32 = conn.pragma_query_value(None, "user_version", |r| r.get(0))?;
        for (i, sql) in MIGRATIONS.iter().enumerate().skip(now as usize) {
            // Migration 4 (index 3) copies `held.id`, which early databases lack.
            if i == 3 && !has_column(conn, "held", "id")? {
                conn.execute_batch(HELD_ROW_IDS)?;
            }
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
