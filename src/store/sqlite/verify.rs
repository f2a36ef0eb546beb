//! `verify`: re-hash every stored fact, check edges (with the types they carry) and release
//! order, check the held set and its counter, and run SQLite's own integrity check.

use std::ops::Deref;

use rusqlite::{Connection, params};

use super::Tx;
use super::read::fact_from_row;
use crate::error::Result;
use crate::hash::FactHash;
use crate::store::VerifyReport;
use crate::store::backend::ReadTx;
use crate::store::shared::{
    EdgeRow, HeldTotals, check_edges, check_held, check_held_totals, check_type, orphan_edges,
};

impl<C: Deref<Target = Connection>> Tx<'_, C> {
    /// Checks the whole store. `progress` is called with the number of facts checked so far.
    ///
    /// Checks that every stored row re-hashes to its key and decodes strictly; that every
    /// released fact's predecessors are released with a lower sequence number and its edge
    /// rows match its predecessors, with both facts' types; that every held fact waits for exactly its absent
    /// predecessors and the held counter is right; and SQLite's `integrity_check`.
    ///
    /// # Errors
    /// [`crate::Error::Backend`] if the database cannot be read at all; damage it can read
    /// past is reported in [`VerifyReport::problems`].
    pub(crate) fn verify_all(&self, progress: &mut dyn FnMut(u64)) -> Result<VerifyReport> {
        let mut report = VerifyReport::default();
        self.verify_integrity(&mut report)?;
        self.verify_released(&mut report, progress)?;
        self.verify_orphan_edges(&mut report)?;
        self.verify_held(&mut report)?;
        Ok(report)
    }

    /// Edge rows are read from their successor's fact: one whose successor is no fact is
    /// found only here (a query walking it would answer with a fact not stored).
    fn verify_orphan_edges(&self, report: &mut VerifyReport) -> Result<()> {
        let (orphans, first): (i64, Option<i64>) = self.conn.query_row(
            "SELECT count(*), min(successor) FROM edge e
             WHERE NOT EXISTS (SELECT 1 FROM fact f WHERE f.seq = e.successor)",
            [],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )?;
        if orphans > 0 {
            report.problem(None, orphan_edges(orphans, first));
        }
        Ok(())
    }

    fn verify_integrity(&self, report: &mut VerifyReport) -> Result<()> {
        let mut stmt = self.conn.prepare("PRAGMA integrity_check")?;
        for line in stmt.query_map([], |r| r.get::<_, String>(0))? {
            let line = line?;
            if line != "ok" {
                report.problem(None, format!("sqlite integrity check: {line}"));
            }
        }
        Ok(())
    }

    fn verify_released(
        &self,
        report: &mut VerifyReport,
        progress: &mut dyn FnMut(u64),
    ) -> Result<()> {
        let mut rows_stmt = self.conn.prepare(
            "SELECT f.seq, f.hash, f.bytes, t.name, f.type_id FROM fact f
             LEFT JOIN fact_type t ON t.id = f.type_id ORDER BY f.seq",
        )?;
        let mut edges_stmt = self.conn.prepare(
            "SELECT r.name, p.hash, p.seq, e.predecessor_type, p.type_id, e.successor_type
             FROM edge e
             JOIN role r ON r.id = e.role_id JOIN fact p ON p.seq = e.predecessor
             WHERE e.successor = ?1",
        )?;
        let mut rows = rows_stmt.query([])?;
        while let Some(row) = rows.next()? {
            report.released += 1;
            if report.released.is_multiple_of(10_000) {
                progress(report.released);
            }
            let seq: i64 = row.get(0)?;
            let raw: Vec<u8> = row.get(1)?;
            let Some(hash) = FactHash::from_slice(&raw) else {
                report.problem(
                    None,
                    format!("row seq {seq}: hash is {} bytes, not 32", raw.len()),
                );
                continue;
            };
            let bytes: Vec<u8> = row.get(2)?;
            let fact = match fact_from_row(&hash, &bytes) {
                Ok(f) => f,
                Err(e) => {
                    report.problem(Some(hash), e.to_string());
                    continue;
                }
            };
            let type_name: Option<String> = row.get(3)?;
            check_type(report, hash, &fact, type_name.as_deref());
            let type_id: i64 = row.get(4)?;
            let edges = edges_stmt
                .query_map(params![seq], |r| {
                    Ok(EdgeRow {
                        role: r.get(0)?,
                        predecessor: r.get(1)?,
                        predecessor_seq: r.get(2)?,
                        types: [r.get(3)?, r.get(4)?, r.get(5)?],
                    })
                })?
                .collect::<rusqlite::Result<Vec<_>>>()?;
            check_edges(report, hash, &fact, (seq, type_id), edges);
        }
        progress(report.released);
        Ok(())
    }

    fn verify_held(&self, report: &mut VerifyReport) -> Result<()> {
        let mut stmt = self
            .conn
            .prepare("SELECT hash, bytes, missing, id FROM held ORDER BY id")?;
        let mut waits = self
            .conn
            .prepare("SELECT 1 FROM held_wait WHERE missing = ?1 AND waiter = ?2")?;
        let mut child_waits = self.conn.prepare(
            "SELECT 1 FROM held_child c JOIN held h ON h.id = c.parent
             WHERE substr(h.hash, 1, 8) = substr(?1, 1, 8) AND h.hash = ?1 AND c.waiter = ?2",
        )?;
        let mut wait_rows: i64 = 0;
        let mut rows = stmt.query([])?;
        while let Some(row) = rows.next()? {
            report.held += 1;
            let raw: Vec<u8> = row.get(0)?;
            let Some(hash) = FactHash::from_slice(&raw) else {
                report.problem(None, "held row with a hash that is not 32 bytes");
                continue;
            };
            let bytes: Vec<u8> = row.get(1)?;
            let fact = match fact_from_row(&hash, &bytes) {
                Ok(f) => f,
                Err(e) => {
                    report.problem(Some(hash), format!("held: {e}"));
                    continue;
                }
            };
            let id: i64 = row.get(3)?;
            let missing = check_held(
                report,
                hash,
                &fact,
                row.get(2)?,
                &mut |h| Ok(self.seq_of(h)?.is_some()),
                &mut |p| {
                    Ok(waits.exists(params![&p.0[..], id])?
                        || child_waits.exists(params![&p.0[..], id])?)
                },
            )?;
            wait_rows += missing;
        }
        let counter: i64 =
            self.conn
                .query_row("SELECT value FROM counter WHERE name = 'held'", [], |r| {
                    r.get(0)
                })?;
        let twice: i64 = self.conn.query_row(
            "SELECT count(*) FROM (SELECT 1 FROM held GROUP BY hash HAVING count(*) > 1)",
            [],
            |r| r.get(0),
        )?;
        let (by_hash, orphans_by_hash): (i64, i64) = self.conn.query_row(
            "SELECT count(*), count(*) FILTER (WHERE NOT EXISTS (SELECT 1 FROM held h WHERE h.id = w.waiter))
             FROM held_wait w",
            [],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )?;
        let (by_parent, orphans_by_parent): (i64, i64) = self.conn.query_row(
            "SELECT count(*), count(*) FILTER (
                 WHERE NOT EXISTS (SELECT 1 FROM held h WHERE h.id = c.waiter)
                    OR NOT EXISTS (SELECT 1 FROM held h WHERE h.id = c.parent))
             FROM held_child c",
            [],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )?;
        check_held_totals(
            report,
            HeldTotals {
                counter,
                twice,
                rows: by_hash + by_parent,
                orphans: orphans_by_hash + orphans_by_parent,
                missing: wait_rows,
            },
        );
        Ok(())
    }
}
