//! Reads on PostgreSQL: by hash or prefix, along edges, by type, held facts, export in
//! pages, stats, plans.

use super::conn::Tx;
use crate::error::{Error, Result};
use crate::fact::Fact;
use crate::hash::{FactHash, HashPrefix};
use crate::store::backend::{Arg, Dialect, EachReleased, ReadTx};
use crate::store::{HeldFact, Stats, StoredFact, VerifyReport};

/// Rows read per statement by the reads that walk the whole table (export, by type), so
/// that memory stays flat whatever the store's size.
const PAGE: i64 = 4096;

/// A stored fact from its key and bytes, checked to re-hash to the key.
pub(crate) fn decode(hash: &FactHash, bytes: &[u8]) -> Result<Fact> {
    crate::encoding::decode_fact(bytes, Some(*hash)).map_err(|e| Error::Corrupt {
        hash: *hash,
        reason: e.to_string(),
    })
}

/// Column `i` of `row`, a 32-byte hash.
pub(crate) fn hash_at(row: &postgres::Row, i: usize) -> Result<FactHash> {
    FactHash::from_stored(row.get::<_, &[u8]>(i))
}

/// The fact in columns `(hash, bytes)` starting at `i`.
fn fact_at_col(row: &postgres::Row, i: usize) -> Result<Fact> {
    decode(&hash_at(row, i)?, row.get(i + 1))
}

impl ReadTx for Tx<'_> {
    fn get(&self, hash: &FactHash) -> Result<Option<Fact>> {
        let row = self.row("SELECT bytes FROM fact WHERE hash = $1", &[&&hash.0[..]])?;
        row.map(|r| decode(hash, r.get(0))).transpose()
    }

    fn lookup(&self, hash: &FactHash) -> Result<Option<StoredFact>> {
        let row = self.row(
            "SELECT bytes, seq FROM fact WHERE hash = $1
             UNION ALL SELECT bytes, NULL FROM held
             WHERE substr(hash, 1, 8) = substr($1::bytea, 1, 8) AND hash = $1 LIMIT 1",
            &[&&hash.0[..]],
        )?;
        row.map(|r| {
            Ok(StoredFact {
                fact: decode(hash, r.get(0))?,
                seq: r.get(1),
            })
        })
        .transpose()
    }

    fn fact_at(&self, seq: i64) -> Result<Option<Fact>> {
        let row = self.row("SELECT hash, bytes FROM fact WHERE seq = $1", &[&seq])?;
        row.map(|r| fact_at_col(&r, 0)).transpose()
    }

    fn seq_of(&self, hash: &FactHash) -> Result<Option<i64>> {
        let row = self.row("SELECT seq FROM fact WHERE hash = $1", &[&&hash.0[..]])?;
        Ok(row.map(|r| r.get(0)))
    }

    fn resolve_prefix(&self, prefix: &HashPrefix) -> Result<FactHash> {
        if let Some(h) = prefix.full() {
            return match self.lookup(&h)? {
                Some(_) => Ok(h),
                None => Err(Error::UnknownPrefix {
                    prefix: h.to_string(),
                }),
            };
        }
        let (low, high) = (&prefix.lowest()[..], &prefix.highest()[..]);
        let mut found = Vec::new();
        for sql in [
            "SELECT hash FROM fact WHERE hash BETWEEN $1 AND $2 LIMIT 11",
            "SELECT hash FROM held
             WHERE substr(hash, 1, 8) BETWEEN substr($1::bytea, 1, 8) AND substr($2::bytea, 1, 8)
               AND hash BETWEEN $1 AND $2 LIMIT 11",
        ] {
            for row in self.rows(sql, &[&low, &high])? {
                found.push(hash_at(&row, 0)?);
            }
        }
        crate::store::shared::resolved(prefix, found)
    }

    fn name_id(&self, role: bool, name: &str) -> Result<Option<i64>> {
        self.backend.shared.names.find(self, role, name)
    }

    fn names(&self, role: bool) -> Result<Vec<String>> {
        super::names::all(self, role)
    }

    fn successors(&self, seq: i64, role: Option<i64>, type_id: Option<i64>) -> Result<Vec<Fact>> {
        // With a role, one range of the edge key; through any role a fact may be a
        // successor several times, hence `IN`.
        let rows = match (role, type_id) {
            (Some(role), Some(ty)) => self.rows(
                "SELECT f.hash, f.bytes FROM edge e JOIN fact f ON f.seq = e.successor
                 WHERE e.predecessor = $1 AND e.role_id = $2 AND e.successor_type = $3
                 ORDER BY f.seq",
                &[&seq, &role, &ty],
            )?,
            (Some(role), None) => self.rows(
                "SELECT f.hash, f.bytes FROM edge e JOIN fact f ON f.seq = e.successor
                 WHERE e.predecessor = $1 AND e.role_id = $2 ORDER BY f.seq",
                &[&seq, &role],
            )?,
            (None, ty) => self.rows(
                "SELECT f.hash, f.bytes FROM fact f WHERE f.seq IN (
                     SELECT e.successor FROM edge e WHERE e.predecessor = $1
                       AND ($2::bigint IS NULL OR e.successor_type = $2))
                 ORDER BY f.seq",
                &[&seq, &ty],
            )?,
        };
        rows.iter().map(|r| fact_at_col(r, 0)).collect()
    }

    fn walk(&self, seq: i64, up: bool) -> Result<Vec<FactHash>> {
        let sql = if up {
            "WITH RECURSIVE up(seq) AS (
                 SELECT predecessor FROM edge WHERE successor = $1 AND predecessor IS NOT NULL
                 UNION SELECT e.predecessor FROM edge e JOIN up ON e.successor = up.seq
                     WHERE e.predecessor IS NOT NULL)
             SELECT f.hash FROM up JOIN fact f ON f.seq = up.seq ORDER BY f.seq"
        } else {
            "WITH RECURSIVE down(seq) AS (
                 SELECT successor FROM edge WHERE predecessor = $1
                 UNION SELECT e.successor FROM edge e JOIN down ON e.predecessor = down.seq)
             SELECT f.hash FROM down JOIN fact f ON f.seq = down.seq ORDER BY f.seq"
        };
        let (before, after) = Dialect::Postgres
            .recursive_walk()
            .expect("PostgreSQL walks with settings");
        self.simple(before)?;
        let hashes = self
            .rows(sql, &[&seq])?
            .iter()
            .map(|r| hash_at(r, 0))
            .collect();
        self.simple(after)?;
        hashes
    }

    fn for_each_of_type(&self, type_id: i64, f: &mut dyn FnMut(Fact) -> Result<()>) -> Result<()> {
        let mut after = 0i64;
        loop {
            let rows = self.rows(
                "SELECT seq, hash, bytes FROM fact WHERE type_id = $1 AND seq > $2
                 ORDER BY seq LIMIT $3",
                &[&type_id, &after, &PAGE],
            )?;
            for row in &rows {
                after = row.get(0);
                f(fact_at_col(row, 1)?)?;
            }
            if (rows.len() as i64) < PAGE {
                return Ok(());
            }
        }
    }

    fn held(&self, limit: usize) -> Result<Vec<HeldFact>> {
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let mut out = Vec::new();
        for row in self.rows(
            "SELECT hash, bytes, held_at FROM held ORDER BY id LIMIT $1",
            &[&limit],
        )? {
            let fact = fact_at_col(&row, 0)?;
            let mut missing = Vec::new();
            for p in fact.predecessor_hashes() {
                if self.seq_of(&p)?.is_none() {
                    missing.push(p);
                }
            }
            out.push(HeldFact {
                missing,
                fact,
                held_at_ms: row.get(2),
            });
        }
        Ok(out)
    }

    fn held_count(&self) -> Result<u64> {
        let row = self.row("SELECT value FROM counter WHERE name = 'held'", &[])?;
        Ok(row.map_or(0, |r| r.get::<_, i64>(0)) as u64)
    }

    fn for_each_released(&self, after: i64, upto: i64, f: &mut EachReleased<'_>) -> Result<()> {
        let mut after = after;
        loop {
            let rows = self.rows(
                "SELECT seq, hash, bytes FROM fact WHERE seq > $1 AND seq <= $2
                 ORDER BY seq LIMIT $3",
                &[&after, &upto, &PAGE],
            )?;
            for row in &rows {
                after = row.get(0);
                let hash = hash_at(row, 1)?;
                let bytes: &[u8] = row.get(2);
                hash.check_stored(bytes)?;
                f(after, hash, bytes)?;
            }
            if (rows.len() as i64) < PAGE {
                return Ok(());
            }
        }
    }

    fn released_types(&self, after: i64) -> Result<Vec<(i64, i64)>> {
        Ok(self
            .rows(
                "SELECT seq, type_id FROM fact WHERE seq > $1 ORDER BY seq",
                &[&after],
            )?
            .iter()
            .map(|r| (r.get(0), r.get(1)))
            .collect())
    }

    fn plan(&self, sql: &str, args: &[Arg<'_>]) -> Result<Vec<String>> {
        Ok(self
            .client_rows(&format!("EXPLAIN {sql}"), args)?
            .iter()
            .map(|r| r.get::<_, String>(0).trim().to_string())
            .collect())
    }

    fn last_seq(&self) -> Result<i64> {
        let row = self.row("SELECT coalesce(max(seq), 0) FROM fact", &[])?;
        Ok(row.map_or(0, |r| r.get(0)))
    }

    fn stats(&self) -> Result<Stats> {
        let mut stats = Stats::default();
        for row in self.rows(
            "SELECT t.name, count(*) FROM fact f JOIN fact_type t ON t.id = f.type_id
             GROUP BY t.name",
            &[],
        )? {
            let n = row.get::<_, i64>(1) as u64;
            stats.released += n;
            stats.per_type.insert(row.get(0), n);
        }
        stats.held = self.held_count()?;
        let row = self.rows(
            "SELECT (SELECT count(p1) FROM fact) + (SELECT count(*) FROM edge_more),
                    pg_database_size(current_database())",
            &[],
        )?;
        stats.edges = row[0].get::<_, i64>(0) as u64;
        stats.db_bytes = row[0].get::<_, i64>(1) as u64;
        Ok(stats)
    }

    fn verify(&self, progress: &mut dyn FnMut(u64)) -> Result<VerifyReport> {
        self.verify_all(progress)
    }
}
