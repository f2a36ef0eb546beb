//! Numbering of type and role names, cached in memory.
//!
//! Ids are assigned inside write transactions and never change once committed, so a cache
//! of committed ids is always right, also with other processes writing: it is shared by
//! every transaction of a backend. Ids assigned in a transaction that has not committed yet
//! are kept apart, in that transaction's [`PendingNames`], and dropped on rollback: another
//! writer could reuse those numbers for other names.

use std::collections::HashMap;
use std::sync::RwLock;

use rusqlite::{Connection, OptionalExtension};

use crate::error::Result;

/// Which name table.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Kind {
    Type,
    Role,
}

impl Kind {
    pub(crate) fn of(role: bool) -> Kind {
        if role { Kind::Role } else { Kind::Type }
    }
}

/// Names to ids. Every insert looks up its type and the role of each edge: a fast seeded
/// hasher rather than SipHash, which cost more than the rest of the lookup.
type Ids = HashMap<String, i64, foldhash::fast::RandomState>;

/// Committed ids, shared by a backend's transactions.
#[derive(Default)]
pub(crate) struct NameCache {
    committed: RwLock<[Ids; 2]>,
}

/// Ids a write transaction assigned or read, to add to the cache once it commits.
#[derive(Default)]
pub(crate) struct PendingNames {
    pending: [Ids; 2],
}

impl NameCache {
    fn cached(&self, kind: Kind, name: &str) -> Option<i64> {
        let committed = self.committed.read().unwrap_or_else(|e| e.into_inner());
        committed[kind as usize].get(name).copied()
    }

    /// The id of `name` if it exists; never creates one.
    pub(crate) fn lookup(&self, conn: &Connection, kind: Kind, name: &str) -> Result<Option<i64>> {
        if let Some(id) = self.cached(kind, name) {
            return Ok(Some(id));
        }
        Ok(conn
            .prepare_cached(sql(kind).0)?
            .query_row([name], |r| r.get(0))
            .optional()?)
    }

    /// Adds a committed transaction's ids.
    pub(crate) fn commit(&self, names: PendingNames) {
        let mut committed = self.committed.write().unwrap_or_else(|e| e.into_inner());
        for (k, pending) in names.pending.into_iter().enumerate() {
            committed[k].extend(pending);
        }
    }
}

impl PendingNames {
    /// The id of `name`, creating it (in the caller's transaction) when absent.
    pub(crate) fn id(
        &mut self,
        cache: &NameCache,
        conn: &Connection,
        kind: Kind,
        name: &str,
    ) -> Result<i64> {
        let k = kind as usize;
        if let Some(&id) = self.pending[k].get(name) {
            return Ok(id);
        }
        // Found in the shared cache, the id is kept here too: the rest of the transaction
        // finds it without taking the cache's lock (an insert looks up a type and a role
        // per edge).
        let id = match cache.cached(kind, name) {
            Some(id) => id,
            None => read_or_create(conn, kind, name)?,
        };
        self.pending[k].insert(name.to_string(), id);
        Ok(id)
    }

    /// Forgets every id assigned since the transaction began (a savepoint rolled back
    /// may have undone some): they will be looked up again.
    pub(crate) fn forget(&mut self) {
        for p in &mut self.pending {
            p.clear();
        }
    }
}

/// Every name in a table, sorted. Read from the table, not the cache: the cache holds only
/// the names this process has met.
pub(crate) fn all(conn: &Connection, kind: Kind) -> Result<Vec<String>> {
    let sql = match kind {
        Kind::Type => "SELECT name FROM fact_type ORDER BY name",
        Kind::Role => "SELECT name FROM role ORDER BY name",
    };
    let mut stmt = conn.prepare_cached(sql)?;
    let names = stmt.query_map([], |r| r.get(0))?;
    Ok(names.collect::<rusqlite::Result<_>>()?)
}

/// The id of `name` in its table, inserted if absent.
fn read_or_create(conn: &Connection, kind: Kind, name: &str) -> Result<i64> {
    let (select, insert) = sql(kind);
    let found: Option<i64> = conn
        .prepare_cached(select)?
        .query_row([name], |r| r.get(0))
        .optional()?;
    Ok(match found {
        Some(id) => id,
        None => {
            conn.prepare_cached(insert)?.execute([name])?;
            conn.last_insert_rowid()
        }
    })
}

fn sql(kind: Kind) -> (&'static str, &'static str) {
    match kind {
        Kind::Type => (
            "SELECT id FROM fact_type WHERE name = ?1",
            "INSERT INTO fact_type (name) VALUES (?1)",
        ),
        Kind::Role => (
            "SELECT id FROM role WHERE name = ?1",
            "INSERT INTO role (name) VALUES (?1)",
        ),
    }
}
