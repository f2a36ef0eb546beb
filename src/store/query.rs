//! The store side of queries: running a statement compiled by `crate::query`, with the
//! query functions registered on the connection, and looking up name ids.
//!
//! The SQL itself is built in `src/query/sql.rs`; this file only runs it.

use rusqlite::types::Value as Sql;
use rusqlite::{OptionalExtension, Row, StatementStatus};

use super::Store;
use super::names::Kind;
use crate::error::Result;

impl Store {
    /// Runs a compiled read-only statement, calling `f` for each row. The query functions
    /// (`pq_test`, `pq_field`) are registered the first time a statement needs them.
    pub(crate) fn run_query(
        &self,
        sql: &str,
        params: &[Sql],
        mut f: impl FnMut(&Row<'_>) -> Result<()>,
    ) -> Result<()> {
        let mut stmt = match self.conn.prepare_cached(sql) {
            Ok(s) => s,
            Err(e) if e.to_string().contains("no such function: pq_") => {
                crate::query::functions::register(&self.conn)?;
                self.conn.prepare_cached(sql)?
            }
            Err(e) => return Err(e.into()),
        };
        let mut rows = stmt.query(rusqlite::params_from_iter(params))?;
        while let Some(row) = rows.next()? {
            f(row)?;
        }
        drop(rows);
        let again = stmt.reset_status(StatementStatus::RePrepare);
        let total = &self.ctx.reprepares;
        total.set(total.get() + again.max(0) as u64);
        Ok(())
    }

    /// How many times, since the store was opened, SQLite had to prepare a compiled query
    /// statement again before running it (`SQLITE_STMTSTATUS_REPREPARE`), for example
    /// because re-binding a parameter the planner had looked at expired the statement.
    /// For tests and benchmarks of [`crate::query::Watch::poll`], whose statements are
    /// meant to stay prepared.
    pub fn query_reprepares(&self) -> u64 {
        self.ctx.reprepares.get()
    }

    /// The query plan SQLite chooses for a compiled statement (`EXPLAIN QUERY PLAN`), one
    /// line per step.
    pub(crate) fn query_plan(&self, sql: &str, params: &[Sql]) -> Result<Vec<String>> {
        let explain = format!("EXPLAIN QUERY PLAN {sql}");
        let mut out = Vec::new();
        self.run_query(&explain, params, |r| {
            out.push(r.get::<_, String>(3)?);
            Ok(())
        })?;
        Ok(out)
    }

    /// The id of a fact type (`role == false`) or role name, if any fact uses it.
    pub(crate) fn name_id(&self, role: bool, name: &str) -> Result<Option<i64>> {
        let kind = if role { Kind::Role } else { Kind::Type };
        self.ctx.names.lookup(&self.conn, kind, name)
    }

    /// Runs `f` in one read transaction: every statement it runs sees the same snapshot,
    /// and the database's read lock is taken once instead of once per statement.
    pub(crate) fn read<T>(&self, f: impl FnOnce() -> Result<T>) -> Result<T> {
        self.conn.prepare_cached("BEGIN DEFERRED")?.execute([])?;
        let out = f();
        let end = if out.is_ok() { "COMMIT" } else { "ROLLBACK" };
        self.conn.prepare_cached(end)?.execute([])?;
        out
    }

    /// The release sequence number and type id of each fact released after `after`, in
    /// release order. (`+?1`: see `steady` in `src/query/watch.rs`.)
    pub(crate) fn released_types(&self, after: i64) -> Result<Vec<(i64, i64)>> {
        let mut stmt = self
            .conn
            .prepare_cached("SELECT seq, type_id FROM fact WHERE seq > +?1 ORDER BY seq")?;
        let rows = stmt.query_map([after], |r| Ok((r.get(0)?, r.get(1)?)))?;
        Ok(rows.collect::<rusqlite::Result<_>>()?)
    }

    /// The highest release sequence number (0 when empty), read from the end of the
    /// primary key. (`coalesce(max(seq), 0)` would scan the table: SQLite's min/max
    /// shortcut needs the bare aggregate.)
    pub(crate) fn last_seq(&self) -> Result<i64> {
        Ok(self
            .conn
            .prepare_cached("SELECT seq FROM fact ORDER BY seq DESC LIMIT 1")?
            .query_row([], |r| r.get(0))
            .optional()?
            .unwrap_or(0))
    }
}
