//! Connections with their prepared statements, transactions over them, and the
//! [`Sql`] seam on PostgreSQL.

use std::cell::RefCell;
use std::collections::HashMap;

use postgres::fallible_iterator::FallibleIterator;
use postgres::types::{ToSql, Type};
use postgres::{Client, Statement};

use super::PgBackend;
use super::batch::Run;
use super::errors::backend;
use super::params::{PgArg, Raw, rewrite_used, value};
use crate::error::{BackendError, BackendErrorKind, Error, Result};
use crate::store::backend::{Arg, Dialect, Row, RowSource, Sql, ValueRef};

/// Parameters of a statement the core runs.
pub(crate) type Params<'a> = &'a [&'a (dyn ToSql + Sync)];

/// A connection and the statements prepared on it, by SQL text.
pub(crate) struct PgConn {
    pub(crate) client: Client,
    statements: HashMap<String, Statement>,
    /// Set when a `COPY` failed as it began (refused by a permission, a lock timeout),
    /// to that failure's kind. The driver then leaves a stray `ReadyForQuery` on the
    /// connection, which the next statement would take for its own answer ("unexpected
    /// message from server", or the answers of the statements after it shifted by one).
    /// So the statements after it are refused with the same kind (busy for a lock
    /// timeout, so that a caller retries what it would have retried), and the connection
    /// is closed, never given back to the pool.
    pub(crate) broken: Option<BackendErrorKind>,
}

/// Statements kept prepared per connection; past it the cache starts again.
const STATEMENTS: usize = 256;

impl PgConn {
    pub(crate) fn new(client: Client) -> PgConn {
        PgConn {
            client,
            statements: HashMap::new(),
            broken: None,
        }
    }

    /// Begins `COPY ... FROM STDIN` of `statement`; if it fails as it begins, the
    /// connection is marked broken (see [`PgConn::broken`]).
    fn copy_in(
        &mut self,
        statement: &Statement,
    ) -> std::result::Result<postgres::CopyInWriter<'_>, postgres::Error> {
        match self.client.copy_in(statement) {
            Ok(sink) => Ok(sink),
            Err(e) => {
                self.broken = Some(super::errors::describe(&e).0);
                Err(e)
            }
        }
    }

    /// The statement for `sql` (PostgreSQL's `$N` text), prepared once per connection.
    /// A client's statement (`client` holds its arguments) is parsed inside a savepoint,
    /// so that a statement that does not parse leaves the transaction usable, as on
    /// SQLite; and a parameter whose type the server cannot infer (`SELECT ?1`, sqlstate
    /// 42P18) is given its argument's type (integer, real, text, bytes).
    /// `restart`: the transaction's `BEGIN` when it is a read transaction that has run
    /// nothing yet, which a client statement's parse may then restart instead of
    /// guarding itself with a savepoint (see [`PgConn::parse_restarting`]).
    fn prepared(
        &mut self,
        sql: &str,
        client: Option<&[Arg<'_>]>,
        restart: Option<&str>,
        reprepares: &std::sync::atomic::AtomicU64,
    ) -> Result<Statement> {
        if let Some(s) = self.statements.get(sql) {
            return Ok(s.clone());
        }
        if self.statements.len() >= STATEMENTS {
            self.statements.clear();
            reprepares.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        let s = match (client, restart) {
            (None, _) => self.client.prepare(sql).map_err(backend)?,
            (Some(args), Some(begin)) => self.parse_restarting(sql, args, begin)?,
            (Some(args), None) => self.parse_guarded(sql, args)?,
        };
        self.statements.insert(sql.to_string(), s.clone());
        Ok(s)
    }

    /// As [`PgConn::parse_guarded`], in a read transaction that has run nothing yet:
    /// no savepoint (two round trips) around the parse, because a failed parse is undone
    /// by beginning the transaction again, which loses nothing (its snapshot is taken
    /// by its first statement). Then the typed parse, as there; any other failure leaves
    /// the transaction begun again and usable, as the savepoint would.
    fn parse_restarting(&mut self, sql: &str, args: &[Arg<'_>], begin: &str) -> Result<Statement> {
        let c = &mut self.client;
        match c.prepare(sql) {
            Ok(s) => Ok(s),
            Err(e) => {
                c.batch_execute(&format!("ROLLBACK; {begin}"))
                    .map_err(backend)?;
                if e.code().is_some_and(|s| s.code() == "42P18") {
                    let types: Vec<Type> = args.iter().map(arg_type).collect();
                    return c.prepare_typed(sql, &types).map_err(backend);
                }
                Err(backend(e))
            }
        }
    }

    fn parse_guarded(&mut self, sql: &str, args: &[Arg<'_>]) -> Result<Statement> {
        let c = &mut self.client;
        c.batch_execute("SAVEPOINT precedent_parse")
            .map_err(backend)?;
        let parsed = match c.prepare(sql) {
            Err(e) if e.code().is_some_and(|s| s.code() == "42P18") => {
                c.batch_execute("ROLLBACK TO SAVEPOINT precedent_parse")
                    .map_err(backend)?;
                let types: Vec<Type> = args.iter().map(arg_type).collect();
                c.prepare_typed(sql, &types)
            }
            other => other,
        };
        match parsed {
            Ok(s) => {
                c.batch_execute("RELEASE SAVEPOINT precedent_parse")
                    .map_err(backend)?;
                Ok(s)
            }
            Err(e) => {
                let _ = c.batch_execute(
                    "ROLLBACK TO SAVEPOINT precedent_parse; RELEASE SAVEPOINT precedent_parse",
                );
                Err(backend(e))
            }
        }
    }
}

/// The type a parameter takes from its argument when the server cannot infer one.
fn arg_type(a: &Arg<'_>) -> Type {
    match a {
        Arg::Int(_) | Arg::Null => Type::INT8,
        Arg::Real(_) => Type::FLOAT8,
        Arg::Text(_) => Type::TEXT,
        Arg::Blob(_) => Type::BYTEA,
    }
}

/// A transaction on a pooled connection: begun when made, rolled back on drop unless
/// [`Tx::finish`] ended it; the connection goes back to the pool unless it broke.
pub(crate) struct Tx<'a> {
    conn: RefCell<Option<PgConn>>,
    pub(crate) backend: &'a PgBackend,
    open: bool,
    /// A read transaction (`READ ONLY`, set by `Backend::read`): every row it reads was
    /// committed before it began.
    pub(crate) read_only: bool,
    /// Released facts written ahead ([`Ahead`]), sent before the next statement.
    pub(crate) ahead: RefCell<Ahead>,
    /// The statement that began it.
    begin: &'static str,
    /// It has run no statement since `begin`.
    fresh: std::cell::Cell<bool>,
    /// `begin` is yet to be sent, with the first statement ([`Tx::begin_with_first`]).
    unbegun: std::cell::Cell<bool>,
    /// Statements run so far ([`Tx::statements`]).
    statements: std::cell::Cell<u64>,
    /// The `edge_more` partitions this transaction made ([`Tx::partitions_on`]).
    made_partitions: RefCell<std::collections::HashSet<i64>>,
}

/// Released facts whose rows are sent with the next statement of the transaction rather
/// than each in a round trip of its own (`PgWrite::write_ahead`, turned on by
/// `Store::complete_batch`).
///
/// A fact written ahead is taken to be new: it gets its release number and its hooks run
/// at once, and any later statement of the transaction, a read or the commit, first
/// writes the facts waiting (one statement, `Run::write_rows`), so nothing reads around
/// them. If one of them was stored already, that guess was wrong: the statement fails,
/// as does every later one of the transaction, which is rolled back
/// ([`Ahead::lost`]); the caller runs its work again without writing ahead.
#[derive(Default)]
pub(crate) struct Ahead {
    /// Whether released facts are written ahead now.
    pub(crate) on: bool,
    /// The facts waiting, in release order.
    pub(crate) run: Run,
    /// Their hashes: a fact written twice is written the ordinary way the second time.
    pub(crate) hashes: std::collections::HashSet<crate::hash::FactHash>,
    /// A fact written ahead was found stored already (or their write failed).
    pub(crate) lost: bool,
}

/// Writes `run`'s rows on `conn` ([`Run::write_rows`]); returns how many facts were new.
fn run_rows(conn: &mut PgConn, run: &Run, tx: &Tx<'_>) -> Result<i64> {
    let s = conn.prepared(Run::WRITE_ROWS, None, None, &tx.backend.shared.reprepares)?;
    run.write_rows(|more, params| {
        tx.partitions_on(conn, &more.role)?;
        let rows = conn.client.query(&s, params).map_err(backend)?;
        Ok(rows[0].get(0))
    })
}

/// Runs of at least this many facts are written by `COPY` ([`copy_rows`]), smaller ones
/// by [`Run::WRITE_ROWS`]: two `COPY`s take four round trips where the statement takes
/// one, and save about a microsecond a fact (`docs/performance.md`, "Against Jinaga's
/// server on PostgreSQL").
const COPY_FROM: usize = 256;

/// `COPY` of a run's fact rows.
/// `COPY` of a run's fact rows, each with its first edge (schema version 7).
const COPY_FACTS: &str =
    "COPY fact (seq, hash, type_id, bytes, p1, p1_role, p1_type) FROM STDIN (FORMAT binary)";
/// `COPY` of a run's other edge rows.
const COPY_EDGES: &str = "COPY edge_more (predecessor, role_id, successor_type, successor, \
     predecessor_type, successor_hash) FROM STDIN (FORMAT binary)";

/// The column types of [`COPY_FACTS`]' rows.
const FACT_TYPES: [Type; 7] = [
    Type::INT8,
    Type::BYTEA,
    Type::INT8,
    Type::BYTEA,
    Type::INT8,
    Type::INT8,
    Type::INT8,
];
/// The column types of [`COPY_EDGES`]' rows.
const EDGE_TYPES: [Type; 6] = [
    Type::INT8,
    Type::INT8,
    Type::INT8,
    Type::INT8,
    Type::INT8,
    Type::BYTEA,
];

/// Writes `run`'s rows on `conn` by `COPY`, the facts then their edges; returns how many
/// facts were written, or `None` if one of them is stored already. A run's facts were
/// read as not released or taken to be new (`PgWrite::insert_many`): one that is there
/// fails the `COPY` on the unique hash, and with it the transaction (to its last
/// savepoint), where the statement's `ON CONFLICT` would count it.
fn copy_rows(conn: &mut PgConn, run: &Run, tx: &Tx<'_>) -> Result<Option<i64>> {
    let there = std::cell::Cell::new(false);
    let fail = |e: postgres::Error| {
        there.set(there.get() || stored_already(&e));
        backend(e)
    };
    match copy_all(conn, run, tx, &fail) {
        Ok(n) => Ok(Some(n)),
        Err(_) if there.get() => Ok(None),
        Err(e) => Err(e),
    }
}

/// Whether `e` is the unique hash of the fact table refusing a row.
fn stored_already(e: &postgres::Error) -> bool {
    e.as_db_error().is_some_and(|db| {
        *db.code() == postgres::error::SqlState::UNIQUE_VIOLATION
            && db.constraint() == Some("fact_hash_key")
    })
}

/// [`copy_rows`]' two `COPY`s.
fn copy_all(
    conn: &mut PgConn,
    run: &Run,
    tx: &Tx<'_>,
    fail: &dyn Fn(postgres::Error) -> Error,
) -> Result<i64> {
    let reprepares = &tx.backend.shared.reprepares;
    use postgres::binary_copy::BinaryCopyInWriter;
    let facts = conn.prepared(COPY_FACTS, None, None, reprepares)?;
    run.with_columns(|c| {
        let sink = conn.copy_in(&facts).map_err(fail)?;
        let mut w = BinaryCopyInWriter::new(sink, &FACT_TYPES);
        for i in 0..c.seq.len() {
            w.write(&[
                &c.seq[i],
                &c.hash[i],
                &c.type_id[i],
                &c.bytes[i],
                &c.p1[i],
                &c.p1_role[i],
                &c.p1_type[i],
            ])
            .map_err(fail)?;
        }
        let written = w.finish().map_err(fail)?;
        let more = &c.more;
        let hashes = c.more_hash();
        tx.partitions_on(conn, &more.role)?;
        copy_edge_rows(conn, reprepares, more.pred.len(), fail, |i| {
            [
                &more.pred[i],
                &more.role[i],
                &more.succ_type[i],
                &more.succ[i],
                &more.pred_type[i],
                &hashes[i],
            ]
        })?;
        Ok(written as i64)
    })
}

/// `COPY` of `n` edge rows of `edge_more`, the `i`th given by `row(i)` (predecessor, role id,
/// successor type, successor, predecessor type, successor hash); nothing when `n` is 0.
fn copy_edge_rows<'a>(
    conn: &mut PgConn,
    reprepares: &std::sync::atomic::AtomicU64,
    n: usize,
    fail: &dyn Fn(postgres::Error) -> Error,
    row: impl Fn(usize) -> [&'a (dyn ToSql + Sync); 6],
) -> Result<()> {
    use postgres::binary_copy::BinaryCopyInWriter;
    if n == 0 {
        return Ok(());
    }
    let edges = conn.prepared(COPY_EDGES, None, None, reprepares)?;
    let sink = conn.copy_in(&edges).map_err(fail)?;
    let mut w = BinaryCopyInWriter::new(sink, &EDGE_TYPES);
    for i in 0..n {
        w.write(&row(i)).map_err(fail)?;
    }
    w.finish().map_err(fail)?;
    Ok(())
}

/// Fact rows written by one `COPY` as they come ([`Tx::copy_facts_streamed`]).
pub(crate) struct FactSink<'c> {
    writer: Option<postgres::binary_copy::BinaryCopyInWriter<'c>>,
    /// The first error a row met: the rows after it are not sent, and the `COPY` fails.
    failed: Option<postgres::Error>,
}

impl FactSink<'_> {
    /// Sends one fact row: seq, hash, type id, canonical bytes, and its first edge
    /// (predecessor seq, role id, predecessor type). An error is kept for the end of the
    /// `COPY`, so that the caller goes on taking its facts.
    pub(crate) fn row(
        &mut self,
        seq: i64,
        hash: &[u8],
        type_id: i64,
        bytes: &[u8],
        first: Option<(i64, i64, i64)>,
    ) {
        if self.failed.is_some() {
            return;
        }
        let (p1, p1_role, p1_type) = (first.map(|f| f.0), first.map(|f| f.1), first.map(|f| f.2));
        if let Some(w) = self.writer.as_mut()
            && let Err(e) = w.write(&[&seq, &hash, &type_id, &bytes, &p1, &p1_role, &p1_type])
        {
            self.failed = Some(e);
        }
    }
}

/// Edge rows of `edge_more` (a fact's edges but its first) as columns: predecessor, role
/// id, successor type, successor, predecessor type, successor hash.
#[derive(Default)]
pub(crate) struct EdgeColumns {
    pub(crate) pred: Vec<i64>,
    pub(crate) role: Vec<i64>,
    pub(crate) succ_type: Vec<i64>,
    pub(crate) succ: Vec<i64>,
    pub(crate) pred_type: Vec<i64>,
    pub(crate) succ_hash: Vec<crate::hash::FactHash>,
}

impl EdgeColumns {
    /// Adds an edge: (predecessor seq, role id, predecessor type) of the successor (seq,
    /// type id, hash).
    pub(crate) fn push(&mut self, pred: (i64, i64, i64), succ: (i64, i64, crate::hash::FactHash)) {
        self.pred.push(pred.0);
        self.role.push(pred.1);
        self.pred_type.push(pred.2);
        self.succ.push(succ.0);
        self.succ_type.push(succ.1);
        self.succ_hash.push(succ.2);
    }
}

/// The error of every statement after a fact written ahead was found stored already.
fn ahead_lost() -> Error {
    Error::Backend(BackendError::new(
        BackendErrorKind::Constraint,
        "postgres: a fact written ahead in this transaction was stored already; it is rolled back",
    ))
}

impl<'a> Tx<'a> {
    /// Begins a transaction with `begin` on a connection from the pool.
    ///
    /// An idle connection the server closed meanwhile (a restart, an idle timeout, a
    /// terminated backend) is known only when it is used: if `begin` fails on one for a
    /// lost connection, it is dropped and `begin` runs once on a new connection, as
    /// nothing had happened yet.
    pub(crate) fn begin(pg: &'a PgBackend, begin: &'static str) -> Result<Tx<'a>> {
        let mut conn = pg.connection()?;
        if let Err(e) = conn.client.batch_execute(begin) {
            if !super::errors::is_lost(&e) {
                return Err(backend(e));
            }
            conn = pg.fresh_connection()?;
            conn.client.batch_execute(begin).map_err(backend)?;
        }
        Ok(Tx::on(pg, conn, begin, false))
    }

    /// A transaction begun by `begin` sent with its first statement, a round trip fewer:
    /// with it when that statement is a simple query ([`Tx::simple_rows`], as the write
    /// lock is), else just before it. A transaction that runs no statement sends
    /// nothing.
    pub(crate) fn begin_with_first(pg: &'a PgBackend, begin: &'static str) -> Result<Tx<'a>> {
        Ok(Tx::on(pg, pg.connection()?, begin, true))
    }

    /// A transaction on `conn` begun by `begin`, sent already or (`unbegun`) not yet.
    fn on(pg: &'a PgBackend, conn: PgConn, begin: &'static str, unbegun: bool) -> Tx<'a> {
        Tx {
            conn: RefCell::new(Some(conn)),
            backend: pg,
            open: true,
            read_only: false,
            ahead: RefCell::default(),
            begin,
            fresh: std::cell::Cell::new(true),
            statements: std::cell::Cell::new(0),
            made_partitions: RefCell::default(),
            unbegun: std::cell::Cell::new(unbegun),
        }
    }

    /// Sends `begin` on the transaction's connection if it is yet to be, with `first`
    /// (a simple query) when there is one, and returns what `first` gave. Nothing has
    /// happened in the transaction yet, so a connection the server closed meanwhile is
    /// replaced and the statements sent again once.
    fn send_begin(
        &self,
        slot: &mut Option<PgConn>,
        first: Option<&str>,
    ) -> Result<Option<Vec<postgres::SimpleQueryMessage>>> {
        if !self.unbegun.get() {
            return Ok(None);
        }
        let sql = match first {
            Some(first) => format!("{}; {first}", self.begin),
            None => self.begin.to_string(),
        };
        // Sent from here on: if `first` fails the transaction is aborted, and rolled
        // back when this is dropped; a connection that fails is not given back.
        self.unbegun.set(false);
        let conn = slot.as_mut().expect("present until drop");
        let sent = match conn.client.simple_query(&sql) {
            Err(e) if super::errors::is_lost(&e) => {
                let fresh = self.backend.fresh_connection()?;
                slot.insert(fresh).client.simple_query(&sql)
            }
            other => other,
        };
        let messages = sent.map_err(backend)?;
        Ok(first.map(|_| messages))
    }

    /// Commits. PostgreSQL answers the `COMMIT` of a transaction that an earlier
    /// statement's error aborted with a rollback, not an error: a statement sent before it
    /// in the same round trip fails then instead (SQLSTATE 25P02), so such a transaction is
    /// never taken as committed (a caller that caught the statement's error and went on
    /// would otherwise be told its writes were kept).
    pub(crate) fn commit(&mut self) -> Result<()> {
        if self.unbegun.get() {
            // Nothing was sent: nothing to end.
            self.open = false;
            return Ok(());
        }
        self.finish_after("SELECT 1")
    }

    /// Runs `last` (statements without parameters) and then `COMMIT`, in one round trip.
    /// If either fails the transaction is still taken as open, so that dropping this
    /// rolls it back: a failed statement before the `COMMIT` leaves it open and aborted
    /// (the server skips the rest of the string), and a `ROLLBACK` after a failed `COMMIT`
    /// only draws a warning.
    pub(crate) fn finish_after(&mut self, last: &str) -> Result<()> {
        let sql = format!("{last}; COMMIT");
        self.with(|c| c.client.batch_execute(&sql).map_err(backend))?;
        self.open = false;
        Ok(())
    }

    fn with<T>(&self, f: impl FnOnce(&mut PgConn) -> Result<T>) -> Result<T> {
        let mut conn = self.conn.try_borrow_mut().map_err(|_| {
            Error::Backend(BackendError::new(
                BackendErrorKind::Other,
                "postgres: a statement ran inside another's row callback on one connection",
            ))
        })?;
        self.send_begin(&mut conn, None)?;
        let conn = conn.as_mut().expect("present until drop");
        if let Some(kind) = conn.broken {
            // Its answers would no longer match its statements: the transaction is over.
            return Err(Error::Backend(BackendError::new(
                kind,
                "postgres: the connection was closed after a COPY that failed as it began; \
                 the transaction is rolled back",
            )));
        }
        self.statements.set(self.statements.get() + 1);
        self.write_ahead_rows(conn)?;
        self.fresh.set(false);
        f(conn)
    }

    /// How many times the transaction has gone to the server (a statement, a `COPY`,
    /// facts written ahead sent): the same count means nothing ran in between.
    pub(crate) fn statements(&self) -> u64 {
        self.statements.get()
    }

    /// Makes sure `edge_more` has a partition for each of `roles` (the roles of edges
    /// about to be written there) on `conn`, the transaction's connection: those this
    /// store knows to be committed need nothing; for the others
    /// `pq_edge_more_partitions` makes what is missing, in this transaction, and says
    /// which it made. One it found there and did not make was committed by a writer
    /// before (writers are serialised) and is remembered; one it made is not, until
    /// another transaction finds it: this one may still roll it back. Nothing is sent
    /// for facts of one predecessor (`roles` empty).
    pub(crate) fn partitions_on(&self, conn: &mut PgConn, roles: &[i64]) -> Result<()> {
        let known = &self.backend.shared.partitions;
        let mut missing: Vec<i64> = {
            let known = known
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            roles
                .iter()
                .filter(|r| !known.contains(r))
                .copied()
                .collect()
        };
        if missing.is_empty() {
            return Ok(());
        }
        missing.sort_unstable();
        missing.dedup();
        let s = conn.prepared(
            "SELECT pq_edge_more_partitions($1)",
            None,
            None,
            &self.backend.shared.reprepares,
        )?;
        let made: Vec<i64> = conn
            .client
            .query_one(&s, &[&missing])
            .map_err(backend)?
            .get(0);
        let mut mine = self.made_partitions.borrow_mut();
        mine.extend(made);
        let mut known = known
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        known.extend(missing.into_iter().filter(|r| !mine.contains(r)));
        Ok(())
    }

    /// [`Tx::partitions_on`] on the transaction's connection; for a fact of one
    /// predecessor (`roles` empty) nothing, not even the connection's turn (which would
    /// send a `BEGIN` not yet sent in a round trip of its own).
    pub(crate) fn more_partitions(&self, roles: &[i64]) -> Result<()> {
        if roles.is_empty() {
            return Ok(());
        }
        self.with(|c| self.partitions_on(c, roles))
    }

    /// Writes the facts written ahead, before any other statement runs.
    fn write_ahead_rows(&self, conn: &mut PgConn) -> Result<()> {
        let mut ahead = self.ahead.borrow_mut();
        if ahead.lost {
            return Err(ahead_lost());
        }
        if ahead.run.len() == 0 {
            return Ok(());
        }
        let added = run_rows(conn, &ahead.run, self);
        let written = ahead.run.len() as i64;
        ahead.run.clear();
        ahead.hashes.clear();
        // A failed write is lost too: the work runs again the ordinary way, where the
        // same failure (if it recurs) meets the insert that caused it.
        ahead.lost = added.as_ref().map_or(true, |&n| n != written);
        match added {
            Err(e) => Err(e),
            Ok(_) if ahead.lost => Err(ahead_lost()),
            Ok(_) => Ok(()),
        }
    }

    /// Writes `run`'s facts and edges; returns how many facts were new, or `None` if
    /// one was stored already and the write failed on it (see [`copy_rows`]).
    pub(crate) fn write_run(&self, run: &Run) -> Result<Option<i64>> {
        self.with(|c| {
            if run.len() >= COPY_FROM {
                copy_rows(c, run, self)
            } else {
                run_rows(c, run, self).map(Some)
            }
        })
    }

    /// Writes fact rows by one `COPY` while `produce` makes them: it is given the sink
    /// at once, so that the server stores the first rows while the last are still being
    /// made. Returns `false` if one of them is stored already (the unique hash refused
    /// it, which fails the transaction to its last savepoint).
    pub(crate) fn copy_facts_streamed(
        &self,
        produce: impl FnOnce(&mut FactSink<'_>) -> Result<()>,
    ) -> Result<bool> {
        use postgres::binary_copy::BinaryCopyInWriter;
        let reprepares = &self.backend.shared.reprepares;
        self.with(|c| {
            let statement = c.prepared(COPY_FACTS, None, None, reprepares)?;
            let sink = c.copy_in(&statement).map_err(backend)?;
            let mut sink = FactSink {
                writer: Some(BinaryCopyInWriter::new(sink, &FACT_TYPES)),
                failed: None,
            };
            // An error of `produce` drops the writer unfinished, which aborts the `COPY`.
            produce(&mut sink)?;
            let finished = match (sink.failed.take(), sink.writer.take()) {
                (Some(e), _) => Err(e),
                (None, Some(w)) => w.finish(),
                (None, None) => unreachable!("the writer is taken only here"),
            };
            match finished {
                Ok(_) => Ok(true),
                Err(e) if stored_already(&e) => Ok(false),
                Err(e) => Err(backend(e)),
            }
        })
    }

    /// Readies this connection for a push: the fact and edge `COPY`s prepared and run
    /// with no rows (PostgreSQL opens both tables and their five indexes), and `prepare`
    /// (statements of the core) prepared, each kept in the connection's cache. Writes
    /// nothing; the caller rolls back.
    pub(crate) fn warm(&self, prepare: &[&str]) -> Result<()> {
        use postgres::binary_copy::BinaryCopyInWriter;
        let reprepares = &self.backend.shared.reprepares;
        self.with(|c| {
            let copies: [(&str, &[Type]); 2] =
                [(COPY_FACTS, &FACT_TYPES), (COPY_EDGES, &EDGE_TYPES)];
            for (sql, types) in copies {
                let statement = c.prepared(sql, None, None, reprepares)?;
                let sink = c.copy_in(&statement).map_err(backend)?;
                BinaryCopyInWriter::new(sink, types)
                    .finish()
                    .map_err(backend)?;
            }
            for sql in prepare {
                c.prepared(sql, None, None, reprepares)?;
            }
            Ok(())
        })
    }

    /// Writes `edge_more` rows by `COPY`, their roles' partitions made first (none:
    /// nothing is sent).
    pub(crate) fn copy_edges(&self, e: &EdgeColumns) -> Result<()> {
        let reprepares = &self.backend.shared.reprepares;
        let hashes: Vec<&[u8]> = e.succ_hash.iter().map(|h| &h.0[..]).collect();
        self.with(|c| {
            self.partitions_on(c, &e.role)?;
            copy_edge_rows(c, reprepares, e.pred.len(), &backend, |i| {
                [
                    &e.pred[i],
                    &e.role[i],
                    &e.succ_type[i],
                    &e.succ[i],
                    &e.pred_type[i],
                    &hashes[i],
                ]
            })
        })
    }

    /// Sends the facts written ahead now (a statement with nothing else to do).
    pub(crate) fn send_ahead(&self) -> Result<()> {
        self.with(|_| Ok(()))
    }

    /// Runs a statement of the core (`$N` text) and returns its rows.
    pub(crate) fn rows(&self, sql: &str, params: Params<'_>) -> Result<Vec<postgres::Row>> {
        self.run(sql, None, params, |c, s, p| c.query(s, p))
    }

    /// The first row of a statement of the core, if any.
    pub(crate) fn row(&self, sql: &str, params: Params<'_>) -> Result<Option<postgres::Row>> {
        Ok(self.rows(sql, params)?.into_iter().next())
    }

    /// Runs a statement of the core that returns no rows; returns the rows it changed.
    pub(crate) fn exec(&self, sql: &str, params: Params<'_>) -> Result<u64> {
        self.run(sql, None, params, |c, s, p| c.execute(s, p))
    }

    /// Prepares `sql` (for a client's statement, `client` holds its arguments) and runs
    /// it with `f`.
    fn run<T>(
        &self,
        sql: &str,
        client: Option<&[Arg<'_>]>,
        params: Params<'_>,
        f: impl FnOnce(&mut Client, &Statement, Params<'_>) -> Result<T, postgres::Error>,
    ) -> Result<T> {
        let reprepares = &self.backend.shared.reprepares;
        let restart = (self.read_only && self.fresh.get()).then_some(self.begin);
        self.with(|c| {
            let s = c.prepared(sql, client, restart, reprepares)?;
            f(&mut c.client, &s, params).map_err(backend)
        })
    }

    /// Runs statements without parameters.
    pub(crate) fn simple(&self, sql: &str) -> Result<()> {
        self.with(|c| c.client.batch_execute(sql).map_err(backend))
    }

    /// Runs statements without parameters in one round trip (each its own statement, so
    /// at READ COMMITTED each reads with a snapshot taken when it starts) and returns the
    /// rows they give, as text.
    pub(crate) fn simple_rows(&self, sql: &str) -> Result<Vec<postgres::SimpleQueryRow>> {
        let begun = match self.conn.try_borrow_mut() {
            // Nothing is written ahead before the first statement.
            Ok(mut slot) => self.send_begin(&mut slot, Some(sql))?,
            Err(_) => None,
        };
        self.with(|c| {
            let messages = match begun {
                Some(m) => m,
                None => c.client.simple_query(sql).map_err(backend)?,
            };
            Ok(messages
                .into_iter()
                .filter_map(|m| match m {
                    postgres::SimpleQueryMessage::Row(r) => Some(r),
                    _ => None,
                })
                .collect())
        })
    }
}

impl Drop for Tx<'_> {
    fn drop(&mut self) {
        let Some(mut conn) = self.conn.get_mut().take() else {
            return;
        };
        if conn.broken.is_some() {
            // Closed: the server rolls the transaction back.
            return;
        }
        if self.open && !self.unbegun.get() && conn.client.batch_execute("ROLLBACK").is_err() {
            return;
        }
        self.backend.give_back(conn);
    }
}

/// A row of a client's query, read as the seam's values.
struct PgRow<'a>(&'a postgres::Row);

impl RowSource for PgRow<'_> {
    fn value(&self, i: usize) -> Result<ValueRef<'_>> {
        let other = |what: String| {
            Error::Backend(BackendError::new(
                BackendErrorKind::Other,
                format!("column {i}: {what}"),
            ))
        };
        let column = self
            .0
            .columns()
            .get(i)
            .ok_or_else(|| other(format!("no such column (the row has {})", self.0.len())))?;
        let raw: Option<Raw<'_>> = self.0.try_get(i).map_err(backend)?;
        value(column.type_(), raw.map(|r| r.0)).map_err(other)
    }
}

/// Calls `f` with the seam's arguments as the driver's parameters.
fn with_args<T>(args: &[Arg<'_>], f: impl FnOnce(Params<'_>) -> T) -> T {
    let args: Vec<PgArg<'_>> = args.iter().map(|a| PgArg(*a)).collect();
    let params: Vec<&(dyn ToSql + Sync)> = args.iter().map(|a| a as &(dyn ToSql + Sync)).collect();
    f(&params)
}

/// Client SQL (portable `?N` text) as PostgreSQL's, with the arguments of the
/// parameters it uses, renumbered (see [`rewrite_used`]).
fn used_args<'a>(sql: &str, args: &[Arg<'a>]) -> (String, Vec<Arg<'a>>) {
    let (text, order) = rewrite_used(sql);
    let used = order
        .iter()
        .map(|&n| args.get(n - 1).copied().unwrap_or(Arg::Null))
        .collect();
    (text, used)
}

impl Tx<'_> {
    /// Runs client SQL (portable `?N` text) with the seam's arguments.
    pub(crate) fn client_rows(&self, sql: &str, args: &[Arg<'_>]) -> Result<Vec<postgres::Row>> {
        let (text, args) = used_args(sql, args);
        with_args(&args, |p| {
            self.run(&text, Some(&args), p, |c, s, p| c.query(s, p))
        })
    }
}

impl Sql for Tx<'_> {
    fn dialect(&self) -> Dialect {
        Dialect::Postgres
    }

    fn execute(&self, sql: &str, args: &[Arg<'_>]) -> Result<u64> {
        let (text, args) = used_args(sql, args);
        with_args(&args, |p| {
            self.run(&text, Some(&args), p, |c, s, p| c.execute(s, p))
        })
    }

    fn query(
        &self,
        sql: &str,
        args: &[Arg<'_>],
        f: &mut dyn FnMut(&Row<'_>) -> Result<()>,
    ) -> Result<()> {
        // The rows are read whole before `f` sees them, so `f` may run statements of its
        // own on this transaction.
        for row in self.client_rows(sql, args)? {
            f(&Row::new(&PgRow(&row)))?;
        }
        Ok(())
    }

    fn batch(&self, sql: &str) -> Result<()> {
        self.simple(sql)
    }

    fn query_streamed(
        &self,
        sql: &str,
        args: &[Arg<'_>],
        f: &mut dyn FnMut(&Row<'_>) -> Result<()>,
    ) -> Result<()> {
        let (text, args) = used_args(sql, args);
        // The first error `f` returns; the rows after it are not read (the driver
        // discards them).
        let mut failed = None;
        with_args(&args, |p| {
            self.run(&text, Some(&args), p, |c, s, p| {
                let mut rows = c.query_raw(s, p.iter().copied())?;
                while let Some(row) = rows.next()? {
                    if let Err(e) = f(&Row::new(&PgRow(&row))) {
                        failed = Some(e);
                        break;
                    }
                }
                Ok(())
            })
        })?;
        failed.map_or(Ok(()), Err)
    }
}
