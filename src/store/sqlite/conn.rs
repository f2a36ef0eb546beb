//! Transactions over rusqlite connections, the [`Sql`] seam in SQLite, and the mapping of
//! SQLite's errors to backend-neutral ones.

use std::ops::Deref;

use rusqlite::types::{ToSqlOutput, ValueRef as SqliteRef};
use rusqlite::{Connection, StatementStatus, ToSql};

use super::{Shared, SqliteBackend};
use crate::error::{BackendError, BackendErrorKind, Error, Result};
use crate::store::backend::{Arg, Dialect, Row, RowSource, Sql, ValueRef};

/// A read connection borrowed from the pool, given back on drop.
pub(crate) struct Pooled<'a> {
    pub(crate) conn: Option<Connection>,
    pub(crate) backend: &'a SqliteBackend,
}

impl Deref for Pooled<'_> {
    type Target = Connection;
    fn deref(&self) -> &Connection {
        self.conn.as_ref().expect("present until drop")
    }
}

impl Drop for Pooled<'_> {
    fn drop(&mut self) {
        if let Some(c) = self.conn.take() {
            self.backend.give_back(c);
        }
    }
}

/// A transaction on a connection `C` (a pooled reader or the guarded writer): begun when
/// made, rolled back when dropped unless [`Tx::finish`] ended it, so a panic or an early
/// return never leaves a transaction open.
pub(crate) struct Tx<'a, C: Deref<Target = Connection>> {
    pub(crate) conn: C,
    pub(crate) shared: &'a Shared,
    open: bool,
    /// For a brief read on the write connection: this process's turn to write, held so
    /// that no writer uses the connection meanwhile (dropped after `conn`).
    pub(crate) turn: Option<super::Turn<'a>>,
}

impl<'a, C: Deref<Target = Connection>> Tx<'a, C> {
    /// Begins a read transaction (`BEGIN DEFERRED`: the snapshot is taken at the first
    /// read).
    pub(crate) fn begin_read(conn: C, shared: &'a Shared) -> Result<Self> {
        Tx::begin(conn, shared, "BEGIN DEFERRED")
    }

    /// Begins with `begin` (`BEGIN IMMEDIATE` for a write: the write lock is taken now,
    /// so a busy database fails here, before any work).
    pub(crate) fn begin(conn: C, shared: &'a Shared, begin: &str) -> Result<Self> {
        conn.prepare_cached(begin)?.execute([])?;
        Ok(Tx {
            conn,
            shared,
            open: true,
            turn: None,
        })
    }

    /// Ends the transaction with `end` (`COMMIT` or `ROLLBACK`).
    pub(crate) fn finish(&mut self, end: &str) -> Result<()> {
        if end != "ROLLBACK" {
            self.alive()?;
        }
        self.conn.prepare_cached(end)?.execute([])?;
        self.open = false;
        Ok(())
    }

    /// Fails if SQLite rolled the whole transaction back under it: after an I/O error, a
    /// full disk or an interrupt it may undo the transaction, not just the statement, and
    /// leave the connection in autocommit mode, where each statement that followed would
    /// commit on its own. Checked before every statement and savepoint, so that nothing
    /// of a transaction is committed but by its `COMMIT`.
    pub(crate) fn alive(&self) -> Result<()> {
        if self.open && self.conn.is_autocommit() {
            return Err(Error::Backend(BackendError::new(
                BackendErrorKind::Other,
                "sqlite: the transaction was rolled back under it by an earlier error (an \
                 I/O error, a full disk or an interrupt); nothing of it was committed"
                    .to_string(),
            )));
        }
        Ok(())
    }
}

impl<C: Deref<Target = Connection>> Drop for Tx<'_, C> {
    fn drop(&mut self) {
        if self.open {
            // A read ends the same either way; a write is undone. Every read transaction
            // ends here, so the statement is kept prepared (a watch polls many times a
            // second). If it cannot run (the connection is broken), fall back to parsing
            // it afresh, which still ends the transaction when anything can.
            let ended = match self.conn.prepare_cached("ROLLBACK") {
                Ok(mut stmt) => stmt.execute([]).is_ok(),
                Err(_) => false,
            };
            if !ended {
                let _ = self.conn.execute_batch("ROLLBACK");
            }
        }
    }
}

impl ToSql for Arg<'_> {
    fn to_sql(&self) -> rusqlite::Result<ToSqlOutput<'_>> {
        Ok(ToSqlOutput::Borrowed(match *self {
            Arg::Null => SqliteRef::Null,
            Arg::Int(i) => SqliteRef::Integer(i),
            Arg::Real(f) => SqliteRef::Real(f),
            Arg::Text(t) => SqliteRef::Text(t.as_bytes()),
            Arg::Blob(b) => SqliteRef::Blob(b),
        }))
    }
}

struct SqliteRow<'a, 'b>(&'a rusqlite::Row<'b>);

impl RowSource for SqliteRow<'_, '_> {
    fn value(&self, i: usize) -> Result<ValueRef<'_>> {
        Ok(match self.0.get_ref(i)? {
            SqliteRef::Null => ValueRef::Null,
            SqliteRef::Integer(i) => ValueRef::Int(i),
            SqliteRef::Real(f) => ValueRef::Real(f),
            SqliteRef::Text(t) => ValueRef::Text(std::str::from_utf8(t).map_err(|e| {
                Error::Backend(BackendError::new(
                    BackendErrorKind::Corrupt,
                    format!("column {i}: text is not utf-8: {e}"),
                ))
            })?),
            SqliteRef::Blob(b) => ValueRef::Blob(b),
        })
    }
}

/// Runs `sql` on `conn` (the [`Sql`] implementation every transaction shares).
pub(crate) fn query(
    conn: &Connection,
    shared: &Shared,
    sql: &str,
    args: &[Arg<'_>],
    f: &mut dyn FnMut(&Row<'_>) -> Result<()>,
) -> Result<()> {
    let mut stmt = conn.prepare_cached(sql)?;
    let mut rows = stmt.query(rusqlite::params_from_iter(args))?;
    while let Some(row) = rows.next()? {
        f(&Row::new(&SqliteRow(row)))?;
    }
    drop(rows);
    let again = stmt.reset_status(StatementStatus::RePrepare);
    shared
        .reprepares
        .fetch_add(again.max(0) as u64, std::sync::atomic::Ordering::Relaxed);
    Ok(())
}

impl<C: Deref<Target = Connection>> Sql for Tx<'_, C> {
    fn dialect(&self) -> Dialect {
        Dialect::Sqlite
    }

    fn execute(&self, sql: &str, args: &[Arg<'_>]) -> Result<u64> {
        self.alive()?;
        Ok(self
            .conn
            .prepare_cached(sql)?
            .execute(rusqlite::params_from_iter(args))? as u64)
    }

    fn query(
        &self,
        sql: &str,
        args: &[Arg<'_>],
        f: &mut dyn FnMut(&Row<'_>) -> Result<()>,
    ) -> Result<()> {
        self.alive()?;
        query(&self.conn, self.shared, sql, args, f)
    }

    fn batch(&self, sql: &str) -> Result<()> {
        self.alive()?;
        Ok(self.conn.execute_batch(sql)?)
    }
}

// Not part of the public API (hidden from the docs): it lets `?` turn SQLite's errors into
// backend-neutral ones inside this module. Callers see only `Error::Backend`.
#[doc(hidden)]
impl From<rusqlite::Error> for Error {
    fn from(e: rusqlite::Error) -> Error {
        use rusqlite::ErrorCode as C;
        let kind = match &e {
            rusqlite::Error::SqliteFailure(f, _) => match f.code {
                C::DatabaseBusy | C::DatabaseLocked => BackendErrorKind::Busy,
                C::DatabaseCorrupt | C::NotADatabase => BackendErrorKind::Corrupt,
                C::SystemIoFailure | C::DiskFull | C::CannotOpen | C::ReadOnly => {
                    BackendErrorKind::Io
                }
                C::ConstraintViolation => BackendErrorKind::Constraint,
                _ => BackendErrorKind::Other,
            },
            rusqlite::Error::QueryReturnedNoRows => BackendErrorKind::NoRow,
            _ => BackendErrorKind::Other,
        };
        Error::Backend(BackendError::new(kind, format!("sqlite: {e}")))
    }
}
