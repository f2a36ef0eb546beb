//! The backend seam: what a database must offer the fact core and its clients.
//!
//! A backend opens transactions. A read transaction ([`ReadTx`]) sees one snapshot; a
//! write transaction ([`WriteTx`]) is the only writer while it lives, and commits or rolls
//! back as a whole. Both run SQL for the core's clients (queues, sync, queries) through
//! [`Sql`], with backend-neutral values ([`Arg`] in, [`Row`] out) and errors
//! ([`crate::Error::Backend`]); the SQL text follows the backend's [`Dialect`].
//!
//! The contract every backend keeps is in `docs/design.md` ("The backend contract"):
//! sequence numbers follow commit order, a read sees a committed snapshot, a commit is
//! durable as [`super::Durability`] says, and "busy" means the caller may retry.

use crate::error::{BackendError, BackendErrorKind, Error, Result};
use crate::fact::Fact;
use crate::hash::{FactHash, HashPrefix};

use super::{BatchReport, HeldFact, InsertOutcome, Stats, StoredFact, VerifyReport};

/// The SQL dialect a backend speaks: the query compiler and the clients' SQL follow it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Dialect {
    /// SQLite 3.45 or later: `?N` parameters, `pq_test` / `pq_field` functions.
    Sqlite,
    /// PostgreSQL 13 or later: `$N` parameters (the backend also takes the `?N` of
    /// portable client SQL and rewrites it), `pq_test` / `pq_field` as SQL functions the
    /// schema defines.
    Postgres,
}

impl Dialect {
    /// The text of parameter `n` (1-based) hidden from the planner's look at its value,
    /// so that a statement stays prepared whatever is bound (`+?N` in SQLite).
    pub fn steady_param(self, n: usize) -> String {
        match self {
            Dialect::Sqlite => format!("+?{n}"),
            Dialect::Postgres => format!("${n}"),
        }
    }

    /// The function testing a field of a fact's canonical bytes against a predicate:
    /// `(bytes, field, op, values) -> 0 | 1` (see [`crate::predicate`]).
    pub fn field_test(self) -> &'static str {
        match self {
            Dialect::Sqlite | Dialect::Postgres => "pq_test",
        }
    }

    /// Statements to run before and after a recursive walk of the `edge` table (ancestors,
    /// descendants, a sync scope), or `None` where none are needed.
    ///
    /// Each step of such a walk starts from a few rows, so the right plan is an index
    /// lookup per row. SQLite always plans it so. PostgreSQL plans the recursive step
    /// once for the whole walk from the table's statistics, and with none yet (a table
    /// just loaded, before autovacuum has analysed it) it picks a merge or hash join that
    /// reads all of `edge` at every step: a chain of 100,000 facts then takes hours. The
    /// settings make it look rows up by index for this transaction only, and put back the
    /// server's own after the walk. JIT compilation is turned off with them: it cost more
    /// than the walk itself on every size measured (docs/design.md, "Recursive walks").
    pub fn recursive_walk(self) -> Option<(&'static str, &'static str)> {
        match self {
            Dialect::Sqlite => None,
            Dialect::Postgres => Some((
                "SET LOCAL enable_mergejoin = off; SET LOCAL enable_hashjoin = off; \
                 SET LOCAL jit = off",
                "RESET enable_mergejoin; RESET enable_hashjoin; RESET jit",
            )),
        }
    }

    /// The function reading a field of a fact's canonical bytes as a sortable value:
    /// `(bytes, field) -> value`.
    pub fn field_value(self) -> &'static str {
        match self {
            Dialect::Sqlite | Dialect::Postgres => "pq_field",
        }
    }
}

/// A value bound to a statement parameter: a borrowed SQL value, the same type a row's
/// columns are read as ([`ValueRef`]).
pub type Arg<'a> = ValueRef<'a>;

impl From<i64> for Arg<'_> {
    fn from(v: i64) -> Self {
        Arg::Int(v)
    }
}

impl From<&i64> for Arg<'_> {
    fn from(v: &i64) -> Self {
        Arg::Int(*v)
    }
}

impl From<u32> for Arg<'_> {
    fn from(v: u32) -> Self {
        Arg::Int(v.into())
    }
}

impl From<bool> for Arg<'_> {
    fn from(v: bool) -> Self {
        Arg::Int(v.into())
    }
}

impl<'a> From<&'a str> for Arg<'a> {
    fn from(v: &'a str) -> Self {
        Arg::Text(v)
    }
}

impl<'a> From<&'a String> for Arg<'a> {
    fn from(v: &'a String) -> Self {
        Arg::Text(v)
    }
}

impl<'a> From<&'a [u8]> for Arg<'a> {
    fn from(v: &'a [u8]) -> Self {
        Arg::Blob(v)
    }
}

impl<'a> From<&'a Vec<u8>> for Arg<'a> {
    fn from(v: &'a Vec<u8>) -> Self {
        Arg::Blob(v)
    }
}

impl<'a> From<&'a FactHash> for Arg<'a> {
    fn from(v: &'a FactHash) -> Self {
        Arg::Blob(&v.0)
    }
}

impl<'a, T: Into<Arg<'a>>> From<Option<T>> for Arg<'a> {
    fn from(v: Option<T>) -> Self {
        v.map_or(Arg::Null, Into::into)
    }
}

impl<'a> From<&'a SqlValue> for Arg<'a> {
    fn from(v: &'a SqlValue) -> Self {
        match v {
            SqlValue::Null => Arg::Null,
            SqlValue::Int(i) => Arg::Int(*i),
            SqlValue::Real(f) => Arg::Real(*f),
            SqlValue::Text(s) => Arg::Text(s),
            SqlValue::Blob(b) => Arg::Blob(b),
        }
    }
}

/// A borrowed SQL value: a parameter ([`Arg`]) or a column as a row holds it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum ValueRef<'a> {
    /// SQL NULL.
    Null,
    /// A 64-bit integer.
    Int(i64),
    /// A double.
    Real(f64),
    /// Text.
    Text(&'a str),
    /// Bytes.
    Blob(&'a [u8]),
}

/// An owned SQL value: a parameter kept between runs of a statement, or a value read.
#[derive(Clone, Debug, PartialEq)]
pub enum SqlValue {
    /// SQL NULL.
    Null,
    /// A 64-bit integer.
    Int(i64),
    /// A double.
    Real(f64),
    /// Text.
    Text(String),
    /// Bytes.
    Blob(Vec<u8>),
}

/// Builds a `&[Arg]` from values that convert into [`Arg`]: the parameters of a statement
/// run through [`Sql`].
///
/// ```
/// use precedent::args;
/// use precedent::store::{Sql, SqlExt};
/// let store = precedent::Store::open_in_memory()?;
/// let n: i64 = store.write(|w| {
///     w.sql().batch("CREATE TABLE seen (id INTEGER PRIMARY KEY, what TEXT)")?;
///     w.sql().execute("INSERT INTO seen (what) VALUES (?1)", args!["first"])?;
///     w.sql().query_one("SELECT count(*) FROM seen WHERE what = ?1", args!["first"], |r| r.get(0))
/// })?;
/// assert_eq!(n, 1);
/// # Ok::<(), precedent::Error>(())
/// ```
#[macro_export]
macro_rules! args {
    ($($v:expr),* $(,)?) => {
        &[$($crate::store::Arg::from($v)),*][..]
    };
}

/// What a backend's row offers: its columns, by index.
pub trait RowSource {
    /// Column `i` (0-based).
    ///
    /// # Errors
    /// [`Error::Backend`] for a column that does not exist or cannot be read.
    fn value(&self, i: usize) -> Result<ValueRef<'_>>;
}

/// One row of a result, handed to the caller's closure.
pub struct Row<'r>(pub(crate) &'r dyn RowSource);

impl<'r> Row<'r> {
    /// Wraps a backend's row.
    pub fn new(source: &'r dyn RowSource) -> Row<'r> {
        Row(source)
    }

    /// Column `i` as a `T`.
    ///
    /// # Errors
    /// [`Error::Backend`] when the column holds another kind of value;
    /// [`Error::Corrupt`] for a hash column that does not hold 32 bytes.
    pub fn get<T: FromSql>(&self, i: usize) -> Result<T> {
        T::from_sql(self.0.value(i)?).map_err(|what| {
            Error::Backend(BackendError::new(
                BackendErrorKind::Other,
                format!("column {i}: {what}"),
            ))
        })
    }

    /// Column `i` as it is stored.
    ///
    /// # Errors
    /// [`Error::Backend`] for a column that does not exist.
    pub fn value(&self, i: usize) -> Result<ValueRef<'_>> {
        self.0.value(i)
    }

    /// Column `i` as a fact hash (see [`FactHash::from_stored`]): a value that is not 32
    /// bytes is an error, never a made-up hash.
    ///
    /// # Errors
    /// [`Error::Corrupt`].
    pub fn hash(&self, i: usize) -> Result<FactHash> {
        match self.0.value(i)? {
            ValueRef::Blob(b) => FactHash::from_stored(b),
            ValueRef::Text(t) => FactHash::from_stored(t.as_bytes()),
            _ => FactHash::from_stored(&[]),
        }
    }
}

/// A Rust value a column converts to.
pub trait FromSql: Sized {
    /// Converts, or says what was found instead.
    ///
    /// # Errors
    /// A short description of the value that does not fit.
    fn from_sql(v: ValueRef<'_>) -> std::result::Result<Self, String>;
}

fn kind(v: ValueRef<'_>) -> String {
    match v {
        ValueRef::Null => "null".into(),
        ValueRef::Int(i) => format!("integer {i}"),
        ValueRef::Real(f) => format!("real {f}"),
        ValueRef::Text(_) => "text".into(),
        ValueRef::Blob(b) => format!("{} bytes", b.len()),
    }
}

impl FromSql for i64 {
    fn from_sql(v: ValueRef<'_>) -> std::result::Result<Self, String> {
        match v {
            ValueRef::Int(i) => Ok(i),
            other => Err(format!("expected an integer, found {}", kind(other))),
        }
    }
}

impl FromSql for f64 {
    fn from_sql(v: ValueRef<'_>) -> std::result::Result<Self, String> {
        match v {
            ValueRef::Real(f) => Ok(f),
            ValueRef::Int(i) => Ok(i as f64),
            other => Err(format!("expected a real, found {}", kind(other))),
        }
    }
}

impl FromSql for String {
    fn from_sql(v: ValueRef<'_>) -> std::result::Result<Self, String> {
        match v {
            ValueRef::Text(s) => Ok(s.to_string()),
            other => Err(format!("expected text, found {}", kind(other))),
        }
    }
}

impl FromSql for Vec<u8> {
    fn from_sql(v: ValueRef<'_>) -> std::result::Result<Self, String> {
        match v {
            ValueRef::Blob(b) => Ok(b.to_vec()),
            other => Err(format!("expected bytes, found {}", kind(other))),
        }
    }
}

impl FromSql for SqlValue {
    fn from_sql(v: ValueRef<'_>) -> std::result::Result<Self, String> {
        Ok(match v {
            ValueRef::Null => SqlValue::Null,
            ValueRef::Int(i) => SqlValue::Int(i),
            ValueRef::Real(f) => SqlValue::Real(f),
            ValueRef::Text(s) => SqlValue::Text(s.to_string()),
            ValueRef::Blob(b) => SqlValue::Blob(b.to_vec()),
        })
    }
}

impl<T: FromSql> FromSql for Option<T> {
    fn from_sql(v: ValueRef<'_>) -> std::result::Result<Self, String> {
        match v {
            ValueRef::Null => Ok(None),
            other => T::from_sql(other).map(Some),
        }
    }
}

/// SQL run inside a transaction, for the core's clients and for an application's own
/// tables written in the same commit as its facts.
pub trait Sql {
    /// The dialect the SQL text must follow.
    fn dialect(&self) -> Dialect;

    /// Runs a statement that returns no rows; returns how many rows it changed.
    ///
    /// # Errors
    /// [`Error::Backend`].
    fn execute(&self, sql: &str, args: &[Arg<'_>]) -> Result<u64>;

    /// Runs a query, calling `f` for each row in order; stops at the first error.
    ///
    /// # Errors
    /// [`Error::Backend`], or whatever `f` returns.
    fn query(
        &self,
        sql: &str,
        args: &[Arg<'_>],
        f: &mut dyn FnMut(&Row<'_>) -> Result<()>,
    ) -> Result<()>;

    /// Runs several statements without parameters (a savepoint, a migration).
    ///
    /// # Errors
    /// [`Error::Backend`].
    fn batch(&self, sql: &str) -> Result<()>;

    /// As [`Sql::query`], handing each row to `f` as it arrives, so that the caller's
    /// work on one row overlaps the database's on the next. `f` must run no statement
    /// of its own on this transaction: on PostgreSQL that is an error. By default the
    /// same as [`Sql::query`].
    ///
    /// # Errors
    /// As [`Sql::query`].
    fn query_streamed(
        &self,
        sql: &str,
        args: &[Arg<'_>],
        f: &mut dyn FnMut(&Row<'_>) -> Result<()>,
    ) -> Result<()> {
        self.query(sql, args, f)
    }
}

/// Conveniences over [`Sql`], for every implementation.
pub trait SqlExt: Sql {
    /// The first row mapped by `f`, or `None` when there is none.
    ///
    /// # Errors
    /// As [`Sql::query`].
    fn query_opt<T>(
        &self,
        sql: &str,
        args: &[Arg<'_>],
        f: impl FnOnce(&Row<'_>) -> Result<T>,
    ) -> Result<Option<T>> {
        let mut f = Some(f);
        let mut out = None;
        self.query(sql, args, &mut |r| {
            if let Some(f) = f.take() {
                out = Some(f(r)?);
            }
            Ok(())
        })?;
        Ok(out)
    }

    /// The first row mapped by `f`; no row is [`Error::Backend`] of kind
    /// [`BackendErrorKind::NoRow`].
    ///
    /// # Errors
    /// As [`Sql::query`].
    fn query_one<T>(
        &self,
        sql: &str,
        args: &[Arg<'_>],
        f: impl FnOnce(&Row<'_>) -> Result<T>,
    ) -> Result<T> {
        self.query_opt(sql, args, f)?.ok_or_else(|| {
            Error::Backend(BackendError::new(
                BackendErrorKind::NoRow,
                format!(
                    "no row from: {}",
                    sql.split_whitespace().collect::<Vec<_>>().join(" ")
                ),
            ))
        })
    }

    /// Every row mapped by `f`.
    ///
    /// # Errors
    /// As [`Sql::query`].
    fn query_vec<T>(
        &self,
        sql: &str,
        args: &[Arg<'_>],
        mut f: impl FnMut(&Row<'_>) -> Result<T>,
    ) -> Result<Vec<T>> {
        let mut out = Vec::new();
        self.query(sql, args, &mut |r| {
            out.push(f(r)?);
            Ok(())
        })?;
        Ok(out)
    }

    /// Whether the query returns any row.
    ///
    /// # Errors
    /// As [`Sql::query`].
    fn exists(&self, sql: &str, args: &[Arg<'_>]) -> Result<bool> {
        Ok(self.query_opt(sql, args, |_| Ok(()))?.is_some())
    }
}

impl<S: Sql + ?Sized> SqlExt for S {}

/// What [`ReadTx::for_each_released`] calls with each fact: its sequence number, hash and
/// canonical bytes.
pub type EachReleased<'a> = dyn FnMut(i64, FactHash, &[u8]) -> Result<()> + 'a;

/// The fact core's reads, inside one read (or write) transaction.
pub trait ReadTx: Sql {
    /// A released fact by hash.
    ///
    /// # Errors
    /// [`Error::Corrupt`] if the stored bytes do not re-hash to the key.
    fn get(&self, hash: &FactHash) -> Result<Option<Fact>>;

    /// A fact by hash, released or held.
    ///
    /// # Errors
    /// [`Error::Corrupt`].
    fn lookup(&self, hash: &FactHash) -> Result<Option<StoredFact>>;

    /// A released fact by sequence number, with its hash.
    ///
    /// # Errors
    /// [`Error::Corrupt`].
    fn fact_at(&self, seq: i64) -> Result<Option<Fact>>;

    /// The release sequence number of a fact, if released.
    ///
    /// # Errors
    /// [`Error::Backend`].
    fn seq_of(&self, hash: &FactHash) -> Result<Option<i64>>;

    /// Resolves a prefix against released and held facts.
    ///
    /// # Errors
    /// [`Error::UnknownPrefix`], [`Error::AmbiguousPrefix`].
    fn resolve_prefix(&self, prefix: &HashPrefix) -> Result<FactHash>;

    /// The id of a fact type name (`role == false`) or role name, if any fact uses it.
    ///
    /// # Errors
    /// [`Error::Backend`].
    fn name_id(&self, role: bool, name: &str) -> Result<Option<i64>>;

    /// Every fact type name (`role == false`) or role name that some released fact uses,
    /// sorted: what a query's names are checked against (`query::QueryCheck`).
    ///
    /// # Errors
    /// [`Error::Backend`].
    fn names(&self, role: bool) -> Result<Vec<String>>;

    /// Released successors of the fact at `seq`, optionally through one role id and of one
    /// type id, in release order.
    ///
    /// # Errors
    /// [`Error::Corrupt`], [`Error::Backend`].
    fn successors(&self, seq: i64, role: Option<i64>, type_id: Option<i64>) -> Result<Vec<Fact>>;

    /// Released ancestors (`up`) or descendants of the fact at `seq`, in release order.
    ///
    /// # Errors
    /// [`Error::Backend`].
    fn walk(&self, seq: i64, up: bool) -> Result<Vec<FactHash>>;

    /// Released facts of one type id, in release order, calling `f` for each.
    ///
    /// # Errors
    /// [`Error::Corrupt`], or whatever `f` returns.
    fn for_each_of_type(&self, type_id: i64, f: &mut dyn FnMut(Fact) -> Result<()>) -> Result<()>;

    /// Held facts, oldest first, up to `limit`.
    ///
    /// # Errors
    /// [`Error::Corrupt`].
    fn held(&self, limit: usize) -> Result<Vec<HeldFact>>;

    /// The number of held facts.
    ///
    /// # Errors
    /// [`Error::Backend`].
    fn held_count(&self) -> Result<u64>;

    /// Each released fact with `after < seq <= upto`, in release order: sequence number,
    /// hash and canonical bytes, which are checked to hash to the key first.
    ///
    /// # Errors
    /// [`Error::Corrupt`], or whatever `f` returns.
    fn for_each_released(&self, after: i64, upto: i64, f: &mut EachReleased<'_>) -> Result<()>;

    /// The sequence number and type id of each fact released after `after`, in release
    /// order (what a watch reads at each poll).
    ///
    /// # Errors
    /// [`Error::Backend`].
    fn released_types(&self, after: i64) -> Result<Vec<(i64, i64)>>;

    /// The plan the database chooses for a statement, one line per step.
    ///
    /// # Errors
    /// [`Error::Backend`].
    fn plan(&self, sql: &str, args: &[Arg<'_>]) -> Result<Vec<String>>;

    /// The highest release sequence number, 0 when empty.
    ///
    /// # Errors
    /// [`Error::Backend`].
    fn last_seq(&self) -> Result<i64>;

    /// The value the row `name` of the `counter` table had when this transaction took
    /// the write lock, if the backend read it then (on PostgreSQL a write transaction
    /// reads them all with the lock, in the lock's round trip), and `None` otherwise: a
    /// client whose counter only moves under the write lock may take it for a statement
    /// of its own, unless it moved the counter itself since.
    fn counter_at_lock(&self, name: &str) -> Option<i64> {
        let _ = name;
        None
    }

    /// Counts per type, held and edges, and the database size.
    ///
    /// # Errors
    /// [`Error::Backend`].
    fn stats(&self) -> Result<Stats>;

    /// Checks every stored fact and the release order; see [`super::Store::verify`].
    ///
    /// # Errors
    /// [`Error::Backend`].
    fn verify(&self, progress: &mut dyn FnMut(u64)) -> Result<VerifyReport>;
}

/// Called in the transaction that releases each fact, after its row and edges are
/// written and, unless the hook says it may be called after a run
/// ([`ReleaseHook::in_runs`]), before anything released after it: the seam through which
/// indexes outside the core (the queue index) stay in step with releases, in the same
/// commit.
pub trait ReleaseHook: Send + Sync {
    /// `fact` was released as `seq`. Facts the hook needs stored in response go to
    /// [`HookCtx::insert_later`], inserted once the current insert returns.
    ///
    /// # Errors
    /// Any error aborts the write transaction.
    fn on_release(&self, ctx: &mut HookCtx<'_>, fact: &Fact, seq: i64) -> Result<()>;

    /// Whether [`ReleaseHook::on_release`] does nothing in this transaction, whatever
    /// facts its current insert releases (the queue index of a store with no queue): a
    /// backend may then write a run of released facts at once and call the hook after
    /// the run, as nothing can tell. The default says no, so that each fact is written
    /// and hooked before the next.
    ///
    /// # Errors
    /// Any error aborts the write transaction.
    fn idle(&self, ctx: &mut HookCtx<'_>) -> Result<bool> {
        let _ = ctx;
        Ok(false)
    }

    /// Whether the hook may be called for a fact after the facts released after it in
    /// the same run are written too (still in release order, each fact once, before the
    /// insert returns): true when [`ReleaseHook::on_release`] reads nothing of a fact's
    /// descendants, only its ancestors and the hook's own tables. A backend may then
    /// write a batch's released facts in runs, as for an idle hook, and call the hook
    /// after each run. The default says no: each fact is written and hooked before the
    /// next.
    fn in_runs(&self) -> bool {
        false
    }

    /// Called once before the transaction commits.
    ///
    /// # Errors
    /// Any error aborts the commit.
    fn before_commit(&self, ctx: &mut HookCtx<'_>) -> Result<()> {
        let _ = ctx;
        Ok(())
    }

    /// A savepoint ([`super::Writer::savepoint`]) was opened: state the hook keeps in
    /// [`super::TxState`] can note where it stands, to go back there if the savepoint is
    /// rolled back.
    fn savepoint_opened(&self, state: &mut super::TxState) {
        let _ = state;
    }

    /// The savepoint opened last was closed: kept (`rolled_back` false) or rolled back,
    /// when what was written in it is gone and so should be what the hook gathered in it.
    fn savepoint_closed(&self, state: &mut super::TxState, rolled_back: bool) {
        let _ = (state, rolled_back);
    }
}

/// What a release hook sees: the transaction's SQL and reads, its per-transaction state,
/// the store, and a list of facts to insert next.
pub struct HookCtx<'a> {
    /// The write transaction's reads and SQL.
    pub tx: &'a dyn ReadTx,
    /// State kept for this transaction by the core's clients.
    pub state: &'a mut super::TxState,
    pub(crate) store: &'a super::Store,
    pub(crate) later: &'a mut Vec<Fact>,
    pub(crate) predecessors: &'a dyn Fn(&FactHash) -> Option<(i64, i64)>,
}

impl HookCtx<'_> {
    /// The sequence number of a predecessor of the fact being released, which the
    /// backend has just read to write its edge; `None` for a hash that is not one of its
    /// predecessors (and in [`ReleaseHook::before_commit`]). Saves a hook a lookup.
    pub fn predecessor_seq(&self, hash: &FactHash) -> Option<i64> {
        (self.predecessors)(hash).map(|(seq, _)| seq)
    }

    /// The store's clock, in milliseconds since the Unix epoch.
    pub fn now_ms(&self) -> i64 {
        self.store.options().clock.now_ms()
    }

    /// The store being written.
    pub fn store(&self) -> &super::Store {
        self.store
    }

    /// Stores `fact` in this transaction once the insert that released the current fact
    /// returns. Only from [`ReleaseHook::on_release`]: in `before_commit` there is no
    /// insert to follow, and a fact asked for there is not stored.
    pub fn insert_later(&mut self, fact: Fact) {
        self.later.push(fact);
    }
}

/// The fact core's writes, inside one write transaction.
pub trait WriteTx: ReadTx {
    /// Inserts one fact, holding or releasing it; calls `hooks` for each fact released.
    ///
    /// # Errors
    /// [`Error::HeldLimit`], [`Error::Backend`], or a hook's error.
    fn insert(&mut self, fact: &Fact, hooks: &mut HookRunner<'_>) -> Result<InsertOutcome>;

    /// Inserts facts given in any order; see [`super::Writer::insert_batch`].
    ///
    /// # Errors
    /// [`Error::Backend`], or a hook's error.
    fn insert_batch(&mut self, facts: Vec<Fact>, hooks: &mut HookRunner<'_>)
    -> Result<BatchReport>;

    /// Inserts the facts `facts` yields as [`WriteTx::insert_batch`] inserts them
    /// collected; `hint` is about how many it will yield. A backend may store the first
    /// while the last are still being made (on PostgreSQL, by a `COPY` fed as they come);
    /// by default they are collected first.
    ///
    /// # Errors
    /// As [`WriteTx::insert_batch`].
    fn insert_streamed(
        &mut self,
        facts: &mut dyn Iterator<Item = Fact>,
        hint: usize,
        hooks: &mut HookRunner<'_>,
    ) -> Result<BatchReport> {
        let _ = hint;
        self.insert_batch(facts.collect(), hooks)
    }

    /// The highest release sequence, read under the write lock as [`ReadTx::last_seq`]
    /// reads it, by a transaction whose next insert is [`WriteTx::insert_streamed`] of
    /// about `hint` facts: a backend may make ready for it in the same round trip (on
    /// PostgreSQL, the savepoint of a stream guessed new goes with the lock's statement).
    ///
    /// # Errors
    /// As [`ReadTx::last_seq`].
    fn last_seq_before_stream(&mut self, hint: usize) -> Result<i64> {
        let _ = hint;
        self.as_read().last_seq()
    }

    /// Drops the held facts `hashes` and every held fact waiting for one of them,
    /// directly or through other held facts, with their wait records; returns the hashes
    /// dropped, `hashes` first. Released facts are never dropped.
    ///
    /// # Errors
    /// [`Error::NotHeld`] for a hash that is released, [`Error::NotFound`] for one that
    /// is not stored; nothing is dropped then.
    fn drop_held(&mut self, hashes: &[FactHash]) -> Result<Vec<FactHash>>;

    /// As [`WriteTx::drop_held`] for every held fact first held at or before `held_at_ms`
    /// (ms since the Unix epoch), oldest first, and what waits for them.
    ///
    /// # Errors
    /// [`Error::Backend`].
    fn drop_held_before(&mut self, held_at_ms: i64) -> Result<Vec<FactHash>>;

    /// Starts a savepoint that [`WriteTx::rollback_savepoint`] can undo.
    ///
    /// # Errors
    /// [`Error::Backend`].
    fn savepoint(&mut self) -> Result<()>;

    /// Keeps what was written since [`WriteTx::savepoint`].
    ///
    /// # Errors
    /// [`Error::Backend`].
    fn release_savepoint(&mut self) -> Result<()>;

    /// Undoes what was written since [`WriteTx::savepoint`].
    ///
    /// # Errors
    /// [`Error::Backend`].
    fn rollback_savepoint(&mut self) -> Result<()>;

    /// Tells the transaction that `fact` is released as `seq`, as the caller read in this
    /// transaction: an insert that names it as a predecessor may then skip looking it up.
    /// Every such note is forgotten when a savepoint rolls back (it may have undone the
    /// release). The default ignores the note.
    ///
    /// # Errors
    /// [`Error::Backend`].
    fn assume_released(&mut self, fact: &Fact, seq: i64) -> Result<()> {
        let _ = (fact, seq);
        Ok(())
    }

    /// Turns on (or off) writing released facts ahead: each is taken to be new, given its
    /// release number and hooks at once, and its row is written with the next statement,
    /// several in one. Should one prove stored already, that statement and every later one
    /// fails ([`WriteTx::ahead_lost`]) and the transaction must be rolled back. Turning it
    /// off writes those waiting. Returns whether the backend does it (the default does
    /// not: SQLite writes in process).
    ///
    /// # Errors
    /// [`Error::Backend`].
    fn write_ahead(&mut self, on: bool) -> Result<bool> {
        let _ = on;
        Ok(false)
    }

    /// Whether a fact written ahead ([`WriteTx::write_ahead`]) proved stored already.
    fn ahead_lost(&self) -> bool {
        false
    }

    /// The read side of this transaction, as a trait object.
    fn as_read(&self) -> &dyn ReadTx;

    /// Commits.
    ///
    /// # Errors
    /// [`Error::Backend`] (busy, I/O); nothing is committed then.
    fn commit(self: Box<Self>) -> Result<()>;
}

/// Runs the release hooks for a backend's write: the backend calls
/// [`HookRunner::released`] for each fact it releases.
pub struct HookRunner<'a> {
    pub(crate) store: &'a super::Store,
    pub(crate) state: &'a mut super::TxState,
    pub(crate) later: &'a mut Vec<Fact>,
    /// How many facts `later` held when each open savepoint was opened: a savepoint
    /// rolled back takes back what hooks asked for in it, as it takes back their writes.
    #[cfg(feature = "postgres")]
    pub(crate) later_marks: Vec<usize>,
}

impl HookRunner<'_> {
    /// `fact` was just released as `seq` in `tx`; `predecessors` gives the sequence
    /// number of each of its predecessors by hash.
    ///
    /// # Errors
    /// A hook's error.
    pub fn released(
        &mut self,
        tx: &dyn ReadTx,
        fact: &Fact,
        seq: i64,
        predecessors: &dyn Fn(&FactHash) -> Option<(i64, i64)>,
    ) -> Result<()> {
        let hooks = &self.store.options().release_hooks;
        if hooks.is_empty() {
            return Ok(());
        }
        let mut ctx = HookCtx {
            tx,
            state: self.state,
            store: self.store,
            later: self.later,
            predecessors,
        };
        for hook in hooks {
            hook.on_release(&mut ctx, fact, seq)?;
        }
        Ok(())
    }

    /// A savepoint of the backend's own was opened: as [`super::Writer::savepoint`] tells
    /// the hooks.
    #[cfg(feature = "postgres")]
    pub(crate) fn savepoint_opened(&mut self) {
        self.later_marks.push(self.later.len());
        for hook in &self.store.options().release_hooks {
            hook.savepoint_opened(self.state);
        }
    }

    /// The savepoint opened last by [`HookRunner::savepoint_opened`] was kept or rolled
    /// back.
    #[cfg(feature = "postgres")]
    pub(crate) fn savepoint_closed(&mut self, rolled_back: bool) {
        if let Some(mark) = self.later_marks.pop()
            && rolled_back
        {
            self.later.truncate(mark);
        }
        for hook in &self.store.options().release_hooks {
            hook.savepoint_closed(self.state, rolled_back);
        }
    }

    /// Whether every hook is [`ReleaseHook::idle`] in `tx` now.
    ///
    /// # Errors
    /// A hook's error.
    pub fn idle(&mut self, tx: &dyn ReadTx) -> Result<bool> {
        let hooks = &self.store.options().release_hooks;
        let mut ctx = HookCtx {
            tx,
            state: self.state,
            store: self.store,
            later: self.later,
            predecessors: &|_| None,
        };
        for hook in hooks {
            if !hook.idle(&mut ctx)? {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// Whether every hook may be called after a run ([`ReleaseHook::in_runs`]).
    pub fn in_runs(&self) -> bool {
        self.store
            .options()
            .release_hooks
            .iter()
            .all(|h| h.in_runs())
    }
}

/// A database the store runs on.
pub trait Backend: Send + Sync {
    /// Starts a read transaction: one snapshot until it is dropped.
    ///
    /// # Errors
    /// [`Error::Backend`].
    fn read(&self) -> Result<Box<dyn ReadTx + '_>>;

    /// Starts a read transaction known to be short (a watch's poll), which the backend may
    /// run where the last write left its cache warm; by default as [`Backend::read`].
    ///
    /// # Errors
    /// [`Error::Backend`].
    fn read_brief(&self) -> Result<Box<dyn ReadTx + '_>> {
        self.read()
    }

    /// Starts the write transaction, waiting for other writers up to the busy timeout.
    /// Dropping it without [`WriteTx::commit`] rolls back.
    ///
    /// # Errors
    /// [`Error::Backend`] of kind [`BackendErrorKind::Busy`] when another writer kept the
    /// lock past the timeout.
    fn write(&self) -> Result<Box<dyn WriteTx + '_>>;

    /// The SQL dialect of this backend: what the query compiler and the clients write.
    fn dialect(&self) -> Dialect;

    /// How many times, since it was opened, the backend had to prepare a statement run
    /// through [`Sql`] again (for tests that statements stay prepared).
    fn reprepares(&self) -> u64 {
        0
    }

    /// The database's file, if it has one.
    fn path(&self) -> Option<&std::path::Path>;

    /// Called before each wait for a wake-up ([`super::Store::wait_for_wake`]): a backend
    /// that can learn of other processes' commits starts doing so here, bumping `wake`
    /// for each (the PostgreSQL backend starts its `LISTEN` thread on the first call). By
    /// default nothing: the store's own commits bump it, and waiters poll for the rest.
    fn listen(&self, wake: &std::sync::Arc<super::Wake>) {
        let _ = wake;
    }

    /// Readies a long-running process for its first write, so that the first request
    /// a server answers is not the one that pays for cold caches. Leaves nothing behind.
    /// By default nothing (SQLite's first write costs what the others do).
    fn warm(&self) -> Result<()> {
        Ok(())
    }
}

impl super::Store {
    /// Begins a read transaction that outlives a closure: one snapshot, taken at its
    /// first read, until the value is dropped. For readers that hand out results between
    /// calls (a query's result iterator); everything else reads through
    /// [`super::Store::read`].
    ///
    /// # Errors
    /// [`Error::Backend`].
    pub(crate) fn begin_read(&self) -> Result<Box<dyn ReadTx + '_>> {
        self.backend.read()
    }
}
