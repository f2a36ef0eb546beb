//! Reads: by hash or prefix, along predecessor edges, by type, held facts, export, stats.

use std::ops::Deref;

use rusqlite::{Connection, OptionalExtension, params};

use super::Tx;
use super::names::Kind;
use crate::error::{Error, Result};
use crate::fact::Fact;
use crate::hash::{FactHash, HashPrefix};
use crate::store::backend::{Arg, EachReleased, ReadTx};
use crate::store::{HeldFact, Stats, StoredFact, VerifyReport};

/// Decodes stored bytes and checks that they re-hash to their key.
pub(crate) fn fact_from_row(hash: &FactHash, bytes: &[u8]) -> Result<Fact> {
    crate::encoding::decode_fact(bytes, Some(*hash)).map_err(|e| Error::Corrupt {
        hash: *hash,
        reason: e.to_string(),
    })
}

/// Resolves a prefix against released and held facts.
pub(crate) fn resolve_prefix(conn: &Connection, prefix: &HashPrefix) -> Result<FactHash> {
    if let Some(h) = prefix.full() {
        let known = conn
            .prepare_cached(
                "SELECT 1 FROM fact WHERE hash = ?1
                 UNION ALL SELECT 1 FROM held WHERE substr(hash, 1, 8) = substr(?1, 1, 8) AND hash = ?1",
            )?
            .exists([&h.0[..]])?;
        return if known {
            Ok(h)
        } else {
            Err(Error::UnknownPrefix {
                prefix: h.to_string(),
            })
        };
    }
    let mut found = Vec::new();
    for sql in [
        "SELECT hash FROM fact WHERE hash BETWEEN ?1 AND ?2 LIMIT 11",
        "SELECT hash FROM held
         WHERE substr(hash, 1, 8) BETWEEN substr(?1, 1, 8) AND substr(?2, 1, 8)
           AND hash BETWEEN ?1 AND ?2 LIMIT 11",
    ] {
        let mut stmt = conn.prepare_cached(sql)?;
        let mut rows = stmt.query(params![&prefix.lowest()[..], &prefix.highest()[..]])?;
        while let Some(row) = rows.next()? {
            found.push(FactHash::from_stored(&row.get::<_, Vec<u8>>(0)?)?);
        }
    }
    crate::store::shared::resolved(prefix, found)
}

impl<C: Deref<Target = Connection>> ReadTx for Tx<'_, C> {
    fn get(&self, hash: &FactHash) -> Result<Option<Fact>> {
        let bytes: Option<Vec<u8>> = self
            .conn
            .prepare_cached("SELECT bytes FROM fact WHERE hash = ?1")?
            .query_row([&hash.0[..]], |r| r.get(0))
            .optional()?;
        bytes.map(|b| fact_from_row(hash, &b)).transpose()
    }

    fn lookup(&self, hash: &FactHash) -> Result<Option<StoredFact>> {
        let row: Option<(Vec<u8>, Option<i64>)> = self
            .conn
            .prepare_cached(
                "SELECT bytes, seq FROM fact WHERE hash = ?1
                 UNION ALL SELECT bytes, NULL FROM held WHERE substr(hash, 1, 8) = substr(?1, 1, 8) AND hash = ?1 LIMIT 1",
            )?
            .query_row([&hash.0[..]], |r| Ok((r.get(0)?, r.get(1)?)))
            .optional()?;
        row.map(|(b, seq)| {
            Ok(StoredFact {
                fact: fact_from_row(hash, &b)?,
                seq,
            })
        })
        .transpose()
    }

    fn fact_at(&self, seq: i64) -> Result<Option<Fact>> {
        let row: Option<(Vec<u8>, Vec<u8>)> = self
            .conn
            .prepare_cached("SELECT hash, bytes FROM fact WHERE seq = ?1")?
            .query_row([seq], |r| Ok((r.get(0)?, r.get(1)?)))
            .optional()?;
        row.map(|(h, b)| fact_from_row(&FactHash::from_stored(&h)?, &b))
            .transpose()
    }

    fn seq_of(&self, hash: &FactHash) -> Result<Option<i64>> {
        Ok(self
            .conn
            .prepare_cached("SELECT seq FROM fact WHERE hash = ?1")?
            .query_row([&hash.0[..]], |r| r.get(0))
            .optional()?)
    }

    fn resolve_prefix(&self, prefix: &HashPrefix) -> Result<FactHash> {
        resolve_prefix(&self.conn, prefix)
    }

    fn name_id(&self, role: bool, name: &str) -> Result<Option<i64>> {
        self.shared.names.lookup(&self.conn, Kind::of(role), name)
    }

    fn names(&self, role: bool) -> Result<Vec<String>> {
        super::names::all(&self.conn, Kind::of(role))
    }

    fn successors(&self, seq: i64, role: Option<i64>, type_id: Option<i64>) -> Result<Vec<Fact>> {
        // The edge carries the successor's type, so with a role and a type the successors
        // are one range of the edge primary key `(predecessor, role_id, successor_type,
        // successor)`. Through one role a fact is a successor once; through any role it
        // may be one several times, hence DISTINCT.
        let mut out = Vec::new();
        let mut push = |f| {
            out.push(f);
            Ok(())
        };
        match (role, type_id) {
            (Some(role_id), Some(type_id)) => self.facts_where(
                "SELECT f.hash, f.bytes FROM edge e JOIN fact f ON f.seq = e.successor
                 WHERE e.predecessor = ?1 AND e.role_id = ?2 AND e.successor_type = ?3
                 ORDER BY f.seq",
                params![seq, role_id, type_id],
                &mut push,
            )?,
            (Some(role_id), None) => self.facts_where(
                "SELECT f.hash, f.bytes FROM edge e JOIN fact f ON f.seq = e.successor
                 WHERE e.predecessor = ?1 AND e.role_id = ?2
                 ORDER BY f.seq",
                params![seq, role_id],
                &mut push,
            )?,
            (None, type_id) => self.facts_where(
                "SELECT DISTINCT f.hash, f.bytes FROM edge e JOIN fact f ON f.seq = e.successor
                 WHERE e.predecessor = ?1 AND (?2 IS NULL OR e.successor_type = ?2)
                 ORDER BY f.seq",
                params![seq, type_id],
                &mut push,
            )?,
        }
        Ok(out)
    }

    fn walk(&self, seq: i64, up: bool) -> Result<Vec<FactHash>> {
        // Iterative in SQLite, so a chain of any length works.
        let sql = if up {
            "WITH RECURSIVE up(seq) AS (
                 SELECT predecessor FROM edge WHERE successor = ?1
                 UNION SELECT e.predecessor FROM edge e JOIN up ON e.successor = up.seq)
             SELECT f.hash FROM up JOIN fact f ON f.seq = up.seq ORDER BY f.seq"
        } else {
            "WITH RECURSIVE down(seq) AS (
                 SELECT successor FROM edge WHERE predecessor = ?1
                 UNION SELECT e.successor FROM edge e JOIN down ON e.predecessor = down.seq)
             SELECT f.hash FROM down JOIN fact f ON f.seq = down.seq ORDER BY f.seq"
        };
        let mut stmt = self.conn.prepare_cached(sql)?;
        let mut rows = stmt.query([seq])?;
        let mut out = Vec::new();
        while let Some(row) = rows.next()? {
            out.push(FactHash::from_stored(&row.get::<_, Vec<u8>>(0)?)?);
        }
        Ok(out)
    }

    fn for_each_of_type(&self, type_id: i64, f: &mut dyn FnMut(Fact) -> Result<()>) -> Result<()> {
        self.facts_where(
            "SELECT hash, bytes FROM fact WHERE type_id = ?1 ORDER BY seq",
            params![type_id],
            f,
        )
    }

    fn held(&self, limit: usize) -> Result<Vec<HeldFact>> {
        let mut stmt = self
            .conn
            .prepare_cached("SELECT hash, bytes, held_at FROM held ORDER BY id LIMIT ?1")?;
        let mut rows = stmt.query([limit as i64])?;
        let mut out = Vec::new();
        while let Some(row) = rows.next()? {
            let hash = FactHash::from_stored(&row.get::<_, Vec<u8>>(0)?)?;
            let bytes: Vec<u8> = row.get(1)?;
            let held_at_ms: i64 = row.get(2)?;
            let fact = fact_from_row(&hash, &bytes)?;
            let mut missing = Vec::new();
            for p in fact.predecessor_hashes() {
                if self.seq_of(&p)?.is_none() {
                    missing.push(p);
                }
            }
            out.push(HeldFact {
                missing,
                fact,
                held_at_ms,
            });
        }
        Ok(out)
    }

    fn held_count(&self) -> Result<u64> {
        Ok(self
            .conn
            .prepare_cached("SELECT value FROM counter WHERE name = 'held'")?
            .query_row([], |r| r.get::<_, i64>(0))? as u64)
    }

    fn for_each_released(&self, after: i64, upto: i64, f: &mut EachReleased<'_>) -> Result<()> {
        let mut stmt = self.conn.prepare_cached(
            "SELECT seq, hash, bytes FROM fact WHERE seq > ?1 AND seq <= ?2 ORDER BY seq",
        )?;
        let mut rows = stmt.query([after, upto])?;
        while let Some(row) = rows.next()? {
            let hash = FactHash::from_stored(&row.get::<_, Vec<u8>>(1)?)?;
            let bytes = row.get_ref(2)?.as_blob().map_err(rusqlite::Error::from)?;
            hash.check_stored(bytes)?;
            f(row.get(0)?, hash, bytes)?;
        }
        Ok(())
    }

    fn released_types(&self, after: i64) -> Result<Vec<(i64, i64)>> {
        // `+?1`: the planner must not look at the value, so the statement stays prepared
        // from one poll to the next (see `steady` in `src/query/watch/inverse.rs`).
        let mut stmt = self
            .conn
            .prepare_cached("SELECT seq, type_id FROM fact WHERE seq > +?1 ORDER BY seq")?;
        let rows = stmt.query_map([after], |r| Ok((r.get(0)?, r.get(1)?)))?;
        Ok(rows.collect::<rusqlite::Result<_>>()?)
    }

    fn plan(&self, sql: &str, args: &[Arg<'_>]) -> Result<Vec<String>> {
        let explain = format!("EXPLAIN QUERY PLAN {sql}");
        let mut stmt = self.conn.prepare_cached(&explain)?;
        let rows = stmt.query_map(rusqlite::params_from_iter(args), |r| r.get::<_, String>(3))?;
        Ok(rows.collect::<rusqlite::Result<_>>()?)
    }

    fn last_seq(&self) -> Result<i64> {
        // `coalesce(max(seq), 0)` would scan the table: SQLite's min/max shortcut needs
        // the bare aggregate, so the end of the primary key is read instead.
        Ok(self
            .conn
            .prepare_cached("SELECT seq FROM fact ORDER BY seq DESC LIMIT 1")?
            .query_row([], |r| r.get(0))
            .optional()?
            .unwrap_or(0))
    }

    fn stats(&self) -> Result<Stats> {
        let mut stats = Stats::default();
        let mut stmt = self.conn.prepare_cached(
            "SELECT t.name, count(*) FROM fact f JOIN fact_type t ON t.id = f.type_id GROUP BY f.type_id",
        )?;
        for row in stmt.query_map([], |r| Ok((r.get::<_, String>(0)?, r.get::<_, i64>(1)?)))? {
            let (name, n) = row?;
            stats.released += n as u64;
            stats.per_type.insert(name, n as u64);
        }
        stats.held = self.held_count()?;
        stats.edges = self
            .conn
            .query_row("SELECT count(*) FROM edge", [], |r| r.get::<_, i64>(0))?
            as u64;
        let pragma = |name| {
            self.conn
                .pragma_query_value(None, name, |r| r.get::<_, i64>(0))
        };
        let (pages, free, size) = (
            pragma("page_count")?,
            pragma("freelist_count")?,
            pragma("page_size")?,
        );
        stats.db_bytes = ((pages - free) * size) as u64;
        Ok(stats)
    }

    fn verify(&self, progress: &mut dyn FnMut(u64)) -> Result<VerifyReport> {
        self.verify_all(progress)
    }
}

impl<C: Deref<Target = Connection>> Tx<'_, C> {
    fn facts_where(
        &self,
        sql: &str,
        args: impl rusqlite::Params,
        f: &mut dyn FnMut(Fact) -> Result<()>,
    ) -> Result<()> {
        let mut stmt = self.conn.prepare_cached(sql)?;
        let mut rows = stmt.query(args)?;
        while let Some(row) = rows.next()? {
            let hash = FactHash::from_stored(&row.get::<_, Vec<u8>>(0)?)?;
            let bytes = row.get_ref(1)?.as_blob().map_err(rusqlite::Error::from)?;
            f(fact_from_row(&hash, bytes)?)?;
        }
        Ok(())
    }
}
