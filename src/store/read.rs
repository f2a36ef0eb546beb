//! Reads: by hash or prefix, along predecessor edges, by type, held facts, export, stats.

use std::collections::BTreeMap;

use rusqlite::{Connection, OptionalExtension, params};

use super::Store;
use super::names::Kind;
use crate::error::{Error, Result};
use crate::fact::Fact;
use crate::hash::{FactHash, HashPrefix};
use crate::store::write::{BatchReport, InsertOutcome};

/// A stored fact and where it stands.
#[derive(Clone, Debug)]
pub struct StoredFact {
    /// The fact.
    pub fact: Fact,
    /// Its release sequence number, or `None` while it is held.
    pub seq: Option<i64>,
}

/// A held fact and the ancestors it waits for.
#[derive(Clone, Debug)]
pub struct HeldFact {
    /// The fact.
    pub fact: Fact,
    /// Its predecessors that are not released yet.
    pub missing: Vec<FactHash>,
    /// When it was first held, in milliseconds since the Unix epoch.
    pub held_at_ms: i64,
}

/// Store-wide counts.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    /// Released facts per type name.
    pub per_type: BTreeMap<String, u64>,
    /// Released facts in all.
    pub released: u64,
    /// Held facts.
    pub held: u64,
    /// Predecessor edges between released facts.
    pub edges: u64,
    /// Database size in bytes (pages in use times page size).
    pub db_bytes: u64,
}

fn hash_from_row(bytes: Vec<u8>) -> rusqlite::Result<FactHash> {
    FactHash::from_slice(&bytes).ok_or_else(|| {
        rusqlite::Error::FromSqlConversionFailure(
            bytes.len(),
            rusqlite::types::Type::Blob,
            "stored hash is not 32 bytes".into(),
        )
    })
}

/// Decodes stored bytes and checks that they re-hash to their key.
pub(crate) fn fact_from_row(hash: &FactHash, bytes: &[u8]) -> Result<Fact> {
    crate::encoding::decode_fact(bytes, Some(*hash)).map_err(|e| Error::Corrupt {
        hash: *hash,
        reason: e.to_string(),
    })
}

/// Checks that stored bytes hash to their key, without decoding them: what every path that
/// hands raw stored bytes to the outside (export, sync) runs, so that damage is reported,
/// never passed on.
pub(crate) fn check_bytes(hash: &FactHash, bytes: &[u8]) -> Result<()> {
    let actual = FactHash::of_canonical(bytes);
    if actual != *hash {
        return Err(Error::Corrupt {
            hash: *hash,
            reason: format!("stored bytes hash to {actual}"),
        });
    }
    Ok(())
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
        let rows = stmt.query_map(params![&prefix.lowest()[..], &prefix.highest()[..]], |r| {
            hash_from_row(r.get(0)?)
        })?;
        for h in rows {
            found.push(h?);
        }
    }
    found.sort();
    found.dedup();
    match found.len() {
        0 => Err(Error::UnknownPrefix {
            prefix: prefix.text(),
        }),
        1 => Ok(found[0]),
        _ => {
            found.truncate(10);
            Err(Error::AmbiguousPrefix {
                prefix: prefix.text(),
                candidates: found,
            })
        }
    }
}

impl Store {
    /// Inserts one fact in its own transaction.
    ///
    /// The same fact again is [`InsertOutcome::Duplicate`] and changes nothing. A fact with
    /// absent predecessors is [`InsertOutcome::Held`]; it is released, in the transaction
    /// that brings its last missing ancestor, together with everything waiting on it.
    ///
    /// # Errors
    /// [`Error::HeldLimit`] if the fact would be held past [`super::StoreOptions::max_held`];
    /// [`Error::Sqlite`].
    pub fn insert(&mut self, fact: &Fact) -> Result<InsertOutcome> {
        self.write(|w| w.insert(fact))
    }

    /// Inserts a batch of facts in any order in one transaction (see
    /// [`super::Writer::insert_batch`]).
    ///
    /// # Errors
    /// [`Error::Sqlite`]; nothing of the batch is written then.
    pub fn insert_batch(&mut self, facts: Vec<Fact>) -> Result<BatchReport> {
        self.write(|w| w.insert_batch(facts))
    }

    /// A released fact by hash; `None` if it is absent or held.
    ///
    /// # Errors
    /// [`Error::Corrupt`] if the stored bytes do not re-hash to the key.
    pub fn get(&self, hash: &FactHash) -> Result<Option<Fact>> {
        let bytes: Option<Vec<u8>> = self
            .conn
            .prepare_cached("SELECT bytes FROM fact WHERE hash = ?1")?
            .query_row([&hash.0[..]], |r| r.get(0))
            .optional()?;
        bytes.map(|b| fact_from_row(hash, &b)).transpose()
    }

    /// A fact by hash, released or held.
    ///
    /// # Errors
    /// [`Error::Corrupt`] if the stored bytes do not re-hash to the key.
    pub fn lookup(&self, hash: &FactHash) -> Result<Option<StoredFact>> {
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

    /// Resolves a full hash or a prefix of at least 8 hex digits to the one stored fact
    /// (released or held) it names.
    ///
    /// # Errors
    /// [`Error::BadHash`], [`Error::UnknownPrefix`] or [`Error::AmbiguousPrefix`].
    pub fn resolve(&self, text: &str) -> Result<FactHash> {
        resolve_prefix(&self.conn, &HashPrefix::parse(text)?)
    }

    /// The release sequence number of a fact, if released.
    ///
    /// # Errors
    /// [`Error::Sqlite`].
    pub fn seq_of(&self, hash: &FactHash) -> Result<Option<i64>> {
        Ok(self
            .conn
            .prepare_cached("SELECT seq FROM fact WHERE hash = ?1")?
            .query_row([&hash.0[..]], |r| r.get(0))
            .optional()?)
    }

    /// Released facts that name `hash` as a predecessor, optionally only through `role`
    /// and only of `type_name`, in release order.
    ///
    /// # Errors
    /// [`Error::Corrupt`], [`Error::Sqlite`].
    pub fn successors(
        &self,
        hash: &FactHash,
        role: Option<&str>,
        type_name: Option<&str>,
    ) -> Result<Vec<Fact>> {
        let Some(seq) = self.seq_of(hash)? else {
            return Ok(Vec::new());
        };
        let role_id = match role {
            Some(r) => match self.ctx.names.lookup(&self.conn, Kind::Role, r)? {
                Some(id) => Some(id),
                None => return Ok(Vec::new()),
            },
            None => None,
        };
        let type_id = match type_name {
            Some(t) => match self.ctx.names.lookup(&self.conn, Kind::Type, t)? {
                Some(id) => Some(id),
                None => return Ok(Vec::new()),
            },
            None => None,
        };
        // The edge carries the successor's type, so with a role and a type the successors
        // are one range of the edge primary key `(predecessor, role_id, successor_type,
        // successor)`. Through one role a fact is a successor once; through any role it
        // may be one several times, hence DISTINCT.
        match (role_id, type_id) {
            (Some(role_id), Some(type_id)) => self.facts_where(
                "SELECT f.hash, f.bytes FROM edge e JOIN fact f ON f.seq = e.successor
                 WHERE e.predecessor = ?1 AND e.role_id = ?2 AND e.successor_type = ?3
                 ORDER BY f.seq",
                params![seq, role_id, type_id],
            ),
            (Some(role_id), None) => self.facts_where(
                "SELECT f.hash, f.bytes FROM edge e JOIN fact f ON f.seq = e.successor
                 WHERE e.predecessor = ?1 AND e.role_id = ?2
                 ORDER BY f.seq",
                params![seq, role_id],
            ),
            (None, type_id) => self.facts_where(
                "SELECT DISTINCT f.hash, f.bytes FROM edge e JOIN fact f ON f.seq = e.successor
                 WHERE e.predecessor = ?1 AND (?2 IS NULL OR e.successor_type = ?2)
                 ORDER BY f.seq",
                params![seq, type_id],
            ),
        }
    }

    /// The direct predecessors of a released fact, as (role, fact), by role then hash.
    ///
    /// # Errors
    /// [`Error::NotFound`] if the fact is not stored; [`Error::Corrupt`].
    pub fn predecessors(&self, hash: &FactHash) -> Result<Vec<(String, Fact)>> {
        let stored = self.lookup(hash)?.ok_or(Error::NotFound { hash: *hash })?;
        let mut out = Vec::new();
        for (role, set) in stored.fact.predecessors() {
            for p in set {
                if let Some(f) = self.get(p)? {
                    out.push((role.clone(), f));
                }
            }
        }
        Ok(out)
    }

    /// Every released ancestor of a released fact (transitively), in release order.
    /// Iterative in SQLite, so a chain of any length works.
    ///
    /// # Errors
    /// [`Error::Sqlite`].
    pub fn ancestors(&self, hash: &FactHash) -> Result<Vec<FactHash>> {
        self.walk(
            hash,
            "WITH RECURSIVE up(seq) AS (
                 SELECT predecessor FROM edge WHERE successor = ?1
                 UNION SELECT e.predecessor FROM edge e JOIN up ON e.successor = up.seq)
             SELECT f.hash FROM up JOIN fact f ON f.seq = up.seq ORDER BY f.seq",
        )
    }

    /// Every released descendant of a released fact (transitively), in release order.
    ///
    /// # Errors
    /// [`Error::Sqlite`].
    pub fn descendants(&self, hash: &FactHash) -> Result<Vec<FactHash>> {
        self.walk(
            hash,
            "WITH RECURSIVE down(seq) AS (
                 SELECT successor FROM edge WHERE predecessor = ?1
                 UNION SELECT e.successor FROM edge e JOIN down ON e.predecessor = down.seq)
             SELECT f.hash FROM down JOIN fact f ON f.seq = down.seq ORDER BY f.seq",
        )
    }

    fn walk(&self, hash: &FactHash, sql: &str) -> Result<Vec<FactHash>> {
        let Some(seq) = self.seq_of(hash)? else {
            return Ok(Vec::new());
        };
        let mut stmt = self.conn.prepare_cached(sql)?;
        let rows = stmt.query_map([seq], |r| hash_from_row(r.get(0)?))?;
        Ok(rows.collect::<rusqlite::Result<_>>()?)
    }

    /// Released facts of one type, in release order.
    ///
    /// # Errors
    /// [`Error::Corrupt`], [`Error::Sqlite`].
    pub fn facts_of_type(&self, type_name: &str) -> Result<Vec<Fact>> {
        let Some(type_id) = self.ctx.names.lookup(&self.conn, Kind::Type, type_name)? else {
            return Ok(Vec::new());
        };
        self.facts_where(
            "SELECT hash, bytes FROM fact WHERE type_id = ?1 ORDER BY seq",
            params![type_id],
        )
    }

    fn facts_where(&self, sql: &str, args: impl rusqlite::Params) -> Result<Vec<Fact>> {
        let mut stmt = self.conn.prepare_cached(sql)?;
        let mut rows = stmt.query(args)?;
        let mut out = Vec::new();
        while let Some(row) = rows.next()? {
            let hash = hash_from_row(row.get(0)?)?;
            let bytes: Vec<u8> = row.get(1)?;
            out.push(fact_from_row(&hash, &bytes)?);
        }
        Ok(out)
    }

    /// Held facts with the predecessors each waits for, oldest first (up to `limit`).
    ///
    /// # Errors
    /// [`Error::Corrupt`], [`Error::Sqlite`].
    pub fn held(&self, limit: usize) -> Result<Vec<HeldFact>> {
        let mut stmt = self
            .conn
            .prepare_cached("SELECT hash, bytes, held_at FROM held ORDER BY id LIMIT ?1")?;
        let mut rows = stmt.query([limit as i64])?;
        let mut out = Vec::new();
        while let Some(row) = rows.next()? {
            let hash = hash_from_row(row.get(0)?)?;
            let bytes: Vec<u8> = row.get(1)?;
            let held_at_ms: i64 = row.get(2)?;
            let fact = fact_from_row(&hash, &bytes)?;
            out.push(HeldFact {
                missing: self.held_missing(&fact)?,
                fact,
                held_at_ms,
            });
        }
        Ok(out)
    }

    /// The predecessors of a held fact that are not released.
    pub(crate) fn held_missing(&self, fact: &Fact) -> Result<Vec<FactHash>> {
        let mut out = Vec::new();
        for p in fact.predecessor_hashes() {
            if self.seq_of(&p)?.is_none() {
                out.push(p);
            }
        }
        Ok(out)
    }

    /// Calls `f` with each released fact's sequence number, hash and canonical bytes, in
    /// release order, for facts with `seq > after`. Streams: one row in memory at a time.
    /// Stops early if `f` returns an error, which is passed on.
    ///
    /// # Errors
    /// Whatever `f` returns; [`Error::Corrupt`] at a row whose bytes do not hash to its
    /// key; [`Error::Sqlite`].
    pub fn for_each_released(
        &self,
        after: i64,
        mut f: impl FnMut(i64, FactHash, &[u8]) -> Result<()>,
    ) -> Result<()> {
        let mut stmt = self
            .conn
            .prepare_cached("SELECT seq, hash, bytes FROM fact WHERE seq > ?1 ORDER BY seq")?;
        let mut rows = stmt.query([after])?;
        while let Some(row) = rows.next()? {
            let hash = hash_from_row(row.get(1)?)?;
            let bytes = row.get_ref(2)?.as_blob().map_err(rusqlite::Error::from)?;
            check_bytes(&hash, bytes)?;
            f(row.get(0)?, hash, bytes)?;
        }
        Ok(())
    }

    /// The number of held facts (read from a counter, without a scan).
    ///
    /// # Errors
    /// [`Error::Sqlite`].
    pub fn held_count(&self) -> Result<u64> {
        Ok(self
            .conn
            .query_row("SELECT value FROM counter WHERE name = 'held'", [], |r| {
                r.get::<_, i64>(0)
            })? as u64)
    }

    /// Counts per type, held and edges, and the database size.
    ///
    /// # Errors
    /// [`Error::Sqlite`].
    pub fn stats(&self) -> Result<Stats> {
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
        let pages: i64 = self
            .conn
            .pragma_query_value(None, "page_count", |r| r.get(0))?;
        let free: i64 = self
            .conn
            .pragma_query_value(None, "freelist_count", |r| r.get(0))?;
        let size: i64 = self
            .conn
            .pragma_query_value(None, "page_size", |r| r.get(0))?;
        stats.db_bytes = ((pages - free) * size) as u64;
        Ok(stats)
    }
}
