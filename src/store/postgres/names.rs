//! Type and role ids on PostgreSQL. Ids never change once committed, so committed ones
//! are cached for every transaction of the backend; ids a write transaction made are
//! kept in it ([`Fresh`]) until it commits, as another writer could otherwise reuse them.

use std::collections::HashMap;
use std::sync::RwLock;

use super::conn::Tx;
use crate::error::Result;

/// The name table: `fact_type` (false) or `role` (true).
pub(crate) type IsRole = bool;

/// The statements of this file, for [`super::PgBackend::warm`].
pub(crate) const STATEMENTS: [&str; 4] = [
    "SELECT id FROM role WHERE name = $1",
    "SELECT id FROM fact_type WHERE name = $1",
    "INSERT INTO role (name) VALUES ($1) RETURNING id",
    "INSERT INTO fact_type (name) VALUES ($1) RETURNING id",
];

fn select(role: IsRole) -> &'static str {
    if role { STATEMENTS[0] } else { STATEMENTS[1] }
}

/// Committed ids, by table.
#[derive(Default)]
pub(crate) struct NameCache(RwLock<[HashMap<String, i64>; 2]>);

/// Ids a write transaction met, added to the cache when it commits.
#[derive(Default)]
pub(crate) struct Fresh([HashMap<String, i64>; 2]);

impl NameCache {
    fn get(&self, role: IsRole, name: &str) -> Option<i64> {
        let m = self.0.read().unwrap_or_else(|e| e.into_inner());
        m[role as usize].get(name).copied()
    }

    /// The id of `name` if some fact uses it; never makes one. An id a read-only
    /// transaction finds was committed, so it is cached: a process that only reads (a
    /// query server) asks for each name once, not at every query. A write transaction
    /// may find an id it made itself and has not committed, which is not cached here.
    pub(crate) fn find(&self, tx: &Tx<'_>, role: IsRole, name: &str) -> Result<Option<i64>> {
        if let Some(id) = self.get(role, name) {
            return Ok(Some(id));
        }
        let id: Option<i64> = tx.row(select(role), &[&name])?.map(|r| r.get(0));
        if let (Some(id), true) = (id, tx.read_only) {
            let mut m = self.0.write().unwrap_or_else(|e| e.into_inner());
            m[role as usize].insert(name.to_string(), id);
        }
        Ok(id)
    }

    /// Forgets every id: the database was put back to an earlier state under this store
    /// (see [`super::recent::Recent::database_at`]).
    pub(crate) fn forget(&self) {
        let mut m = self.0.write().unwrap_or_else(|e| e.into_inner());
        m.iter_mut().for_each(HashMap::clear);
    }

    pub(crate) fn commit(&self, fresh: Fresh) {
        let mut m = self.0.write().unwrap_or_else(|e| e.into_inner());
        for (k, f) in fresh.0.into_iter().enumerate() {
            m[k].extend(f);
        }
    }
}

impl Fresh {
    /// The id of `name`, made in `tx` if it has none.
    pub(crate) fn id(&mut self, tx: &Tx<'_>, role: IsRole, name: &str) -> Result<i64> {
        if let Some(&id) = self.0[role as usize].get(name) {
            return Ok(id);
        }
        let id = match tx.backend.shared.names.get(role, name) {
            Some(id) => id,
            None => match tx.row(select(role), &[&name])? {
                Some(r) => r.get(0),
                None => {
                    let insert = if role { STATEMENTS[2] } else { STATEMENTS[3] };
                    tx.rows(insert, &[&name])?[0].get(0)
                }
            },
        };
        self.0[role as usize].insert(name.to_string(), id);
        Ok(id)
    }

    /// The id of `name` if this transaction or the cache knows it: no statement.
    pub(crate) fn known(&self, cache: &NameCache, role: IsRole, name: &str) -> Option<i64> {
        self.0[role as usize]
            .get(name)
            .copied()
            .or_else(|| cache.get(role, name))
    }

    /// Forgets every id (a savepoint rolled back may have undone some).
    pub(crate) fn forget(&mut self) {
        self.0.iter_mut().for_each(HashMap::clear);
    }
}

/// Every name of a table, sorted.
pub(crate) fn all(tx: &Tx<'_>, role: IsRole) -> Result<Vec<String>> {
    let sql = if role {
        "SELECT name FROM role ORDER BY name COLLATE \"C\""
    } else {
        "SELECT name FROM fact_type ORDER BY name COLLATE \"C\""
    };
    Ok(tx.rows(sql, &[])?.iter().map(|r| r.get(0)).collect())
}
