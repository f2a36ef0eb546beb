//! Numbering of type and role names, cached in memory.
//!
//! Ids are assigned inside write transactions and never change once committed, so a cache
//! of committed ids is always right, also with other processes writing. Ids assigned in a
//! transaction that has not committed yet are kept apart and dropped on rollback: another
//! writer could reuse those numbers for other names.

use std::collections::HashMap;

use rusqlite::{Connection, OptionalExtension};

use crate::error::Result;

/// Which name table.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Kind {
    Type,
    Role,
}

#[derive(Default)]
pub(crate) struct Names {
    committed: [HashMap<String, i64>; 2],
    pending: [HashMap<String, i64>; 2],
}

impl Names {
    /// The id of `name`, creating it (in the caller's transaction) when absent.
    pub(crate) fn id(&mut self, conn: &Connection, kind: Kind, name: &str) -> Result<i64> {
        let k = kind as usize;
        if let Some(&id) = self.committed[k]
            .get(name)
            .or_else(|| self.pending[k].get(name))
        {
            return Ok(id);
        }
        let (select, insert) = sql(kind);
        let found: Option<i64> = conn
            .prepare_cached(select)?
            .query_row([name], |r| r.get(0))
            .optional()?;
        let id = match found {
            Some(id) => id,
            None => {
                conn.prepare_cached(insert)?.execute([name])?;
                conn.last_insert_rowid()
            }
        };
        self.pending[k].insert(name.to_string(), id);
        Ok(id)
    }

    /// The id of `name` if it exists; never creates one.
    pub(crate) fn lookup(&self, conn: &Connection, kind: Kind, name: &str) -> Result<Option<i64>> {
        if let Some(&id) = self.committed[kind as usize].get(name) {
            return Ok(Some(id));
        }
        Ok(conn
            .prepare_cached(sql(kind).0)?
            .query_row([name], |r| r.get(0))
            .optional()?)
    }

    pub(crate) fn commit(&mut self) {
        for k in 0..2 {
            let pending = std::mem::take(&mut self.pending[k]);
            self.committed[k].extend(pending);
        }
    }

    pub(crate) fn rollback(&mut self) {
        for p in &mut self.pending {
            p.clear();
        }
    }
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
