//! `verify` on PostgreSQL: every stored row re-hashed and decoded strictly, edges (with
//! their types and the successor hash they carry) against the facts' bytes and the
//! release order, the held set against its waits and counter, and the `seq` counter
//! against the facts. PostgreSQL has no
//! `integrity_check`; its own page checksums (`initdb -k`) and `amcheck` are the
//! operator's.

use super::conn::Tx;
use super::read::decode;
use crate::error::Result;
use crate::hash::FactHash;
use crate::store::VerifyReport;
use crate::store::backend::ReadTx;
use crate::store::shared::{
    EdgeRow, HeldTotals, check_edges, check_held, check_held_totals, check_type, orphan_edges,
};

/// Facts checked per statement.
const PAGE: i64 = 2048;

impl Tx<'_> {
    pub(crate) fn verify_all(&self, progress: &mut dyn FnMut(u64)) -> Result<VerifyReport> {
        let mut report = VerifyReport::default();
        let mut after = 0i64;
        loop {
            let rows = self.rows(
                "SELECT f.seq, f.hash, f.bytes, t.name, f.type_id FROM fact f
                 LEFT JOIN fact_type t ON t.id = f.type_id
                 WHERE f.seq > $1 ORDER BY f.seq LIMIT $2",
                &[&after, &PAGE],
            )?;
            for row in &rows {
                after = row.get(0);
                self.check_released(row, &mut report)?;
                report.released += 1;
                if report.released.is_multiple_of(10_000) {
                    progress(report.released);
                }
            }
            if (rows.len() as i64) < PAGE {
                break;
            }
        }
        progress(report.released);
        self.check_counters(&mut report, after)?;
        self.check_held(&mut report)?;
        Ok(report)
    }

    fn check_released(&self, row: &postgres::Row, report: &mut VerifyReport) -> Result<()> {
        let seq: i64 = row.get(0);
        let raw: &[u8] = row.get(1);
        let Some(hash) = FactHash::from_slice(raw) else {
            report.problem(
                None,
                format!("row seq {seq}: hash is {} bytes, not 32", raw.len()),
            );
            return Ok(());
        };
        let fact = match decode(&hash, row.get(2)) {
            Ok(f) => f,
            Err(e) => {
                report.problem(Some(hash), e.to_string());
                return Ok(());
            }
        };
        check_type(report, hash, &fact, row.get(3));
        let edges = self.rows(
            "SELECT r.name, p.hash, p.seq, e.predecessor_type, p.type_id, e.successor_type,
                    e.successor_hash
             FROM edge e JOIN role r ON r.id = e.role_id JOIN fact p ON p.seq = e.predecessor
             WHERE e.successor = $1",
            &[&seq],
        )?;
        // The successor's hash an edge carries (PostgreSQL schema version 5) is the fact's own.
        for e in &edges {
            let carried: &[u8] = e.get(6);
            if carried != &hash.0[..] {
                let role: String = e.get(0);
                report.problem(
                    Some(hash),
                    format!(
                        "edge {role} (seq {seq}) carries successor hash {}, not the fact's",
                        FactHash::from_slice(carried).map_or_else(
                            || format!("of {} bytes", carried.len()),
                            |h| h.to_string()
                        )
                    ),
                );
            }
        }
        let edges = edges
            .iter()
            .map(|e| EdgeRow {
                role: e.get(0),
                predecessor: e.get(1),
                predecessor_seq: e.get(2),
                types: [e.get(3), e.get(4), e.get(5)],
            })
            .collect();
        check_edges(report, hash, &fact, (seq, row.get(4)), edges);
        Ok(())
    }

    /// The `seq` counter names the last released fact, and numbers have no gaps.
    fn check_counters(&self, report: &mut VerifyReport, last: i64) -> Result<()> {
        let row = self.rows(
            "SELECT (SELECT value FROM counter WHERE name = 'seq'), count(*) FROM fact",
            &[],
        )?;
        let (counter, count): (Option<i64>, i64) = (row[0].get(0), row[0].get(1));
        if counter != Some(last) {
            report.problem(
                None,
                format!("seq counter says {counter:?}, the last released fact has seq {last}"),
            );
        }
        if count != last {
            report.problem(
                None,
                format!("{count} released facts but the last seq is {last}: numbers have gaps"),
            );
        }
        // Edge rows are read from their successor's fact: one whose successor is no fact
        // is found only here (a query walking it would answer with a fact not stored).
        // A fact's first edge is in its own row (schema version 7): only the others can be.
        let row = self.rows(
            "SELECT count(*), min(successor) FROM edge_more e
             WHERE NOT EXISTS (SELECT 1 FROM fact f WHERE f.seq = e.successor)",
            &[],
        )?;
        let (orphans, first): (i64, Option<i64>) = (row[0].get(0), row[0].get(1));
        if orphans > 0 {
            report.problem(None, orphan_edges(orphans, first));
        }
        // A fact's edges are read as a set, so one written both in its row and in
        // `edge_more` is found only here (a query would answer its successor twice).
        let row = self.rows(
            "SELECT count(*), min(e.successor) FROM edge_more e
             JOIN fact f ON f.seq = e.successor AND f.p1 = e.predecessor AND f.p1_role = e.role_id",
            &[],
        )?;
        let (twice, first): (i64, Option<i64>) = (row[0].get(0), row[0].get(1));
        if twice > 0 {
            report.problem(
                None,
                format!(
                    "{twice} edge row(s) of edge_more repeat their fact's first edge (the first: seq {})",
                    first.unwrap_or_default()
                ),
            );
        }
        Ok(())
    }

    fn check_held(&self, report: &mut VerifyReport) -> Result<()> {
        let mut wait_rows = 0i64;
        for row in self.rows("SELECT hash, bytes, missing, id FROM held ORDER BY id", &[])? {
            report.held += 1;
            let Some(hash) = FactHash::from_slice(row.get::<_, &[u8]>(0)) else {
                report.problem(None, "held row with a hash that is not 32 bytes");
                continue;
            };
            let fact = match decode(&hash, row.get(1)) {
                Ok(f) => f,
                Err(e) => {
                    report.problem(Some(hash), format!("held: {e}"));
                    continue;
                }
            };
            let id: i64 = row.get(3);
            let missing = check_held(
                report,
                hash,
                &fact,
                row.get(2),
                &mut |h| Ok(self.seq_of(h)?.is_some()),
                &mut |p| {
                    Ok(self
                        .row(
                            "SELECT 1 FROM held_wait WHERE missing = $1 AND waiter = $2
                             UNION ALL SELECT 1 FROM held_child c JOIN held h ON h.id = c.parent
                             WHERE substr(h.hash, 1, 8) = substr($1::bytea, 1, 8)
                               AND h.hash = $1 AND c.waiter = $2",
                            &[&&p.0[..], &id],
                        )?
                        .is_some())
                },
            )?;
            wait_rows += missing;
        }
        let row = self.rows(
            "SELECT
               (SELECT count(*) FROM (SELECT 1 FROM held GROUP BY hash HAVING count(*) > 1) d),
               (SELECT count(*) FROM held_wait) + (SELECT count(*) FROM held_child),
               (SELECT count(*) FROM held_wait w WHERE NOT EXISTS (SELECT 1 FROM held h WHERE h.id = w.waiter))
               + (SELECT count(*) FROM held_child c
                  WHERE NOT EXISTS (SELECT 1 FROM held h WHERE h.id = c.waiter)
                     OR NOT EXISTS (SELECT 1 FROM held h WHERE h.id = c.parent))",
            &[],
        )?;
        check_held_totals(
            report,
            HeldTotals {
                counter: self.held_count()? as i64,
                twice: row[0].get(0),
                rows: row[0].get(1),
                orphans: row[0].get(2),
                missing: wait_rows,
            },
        );
        Ok(())
    }
}
