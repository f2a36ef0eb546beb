//! `verify` on PostgreSQL: every stored row re-hashed and decoded strictly, edges (with
//! their types) against the facts' bytes and the release order, the held set against its
//! waits and counter, and the `seq` counter against the facts. PostgreSQL has no
//! `integrity_check`; its own page checksums (`initdb -k`) and `amcheck` are the
//! operator's.

use std::collections::BTreeSet;

use super::conn::Tx;
use super::read::decode;
use crate::error::Result;
use crate::hash::FactHash;
use crate::store::VerifyReport;
use crate::store::backend::ReadTx;

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
        let type_name: Option<&str> = row.get(3);
        if type_name != Some(fact.type_name()) {
            report.problem(
                Some(hash),
                format!(
                    "type column says {type_name:?}, bytes say {:?}",
                    fact.type_name()
                ),
            );
        }
        let type_id: i64 = row.get(4);
        let mut edges = BTreeSet::new();
        for e in self.rows(
            "SELECT r.name, p.hash, p.seq, e.predecessor_type, p.type_id, e.successor_type
             FROM edge e JOIN role r ON r.id = e.role_id JOIN fact p ON p.seq = e.predecessor
             WHERE e.successor = $1",
            &[&seq],
        )? {
            let (role, pred): (String, Vec<u8>) = (e.get(0), e.get(1));
            let pseq: i64 = e.get(2);
            if pseq >= seq {
                report.problem(
                    Some(hash),
                    format!("predecessor seq {pseq} is not below its own seq {seq}"),
                );
            }
            let (edge_pred, pred_type, edge_succ): (i64, i64, i64) = (e.get(3), e.get(4), e.get(5));
            if edge_pred != pred_type || edge_succ != type_id {
                report.problem(
                    Some(hash),
                    format!(
                        "edge to {} (role {role}) gives types {edge_pred} -> {edge_succ}, \
                         the facts have {pred_type} -> {type_id}",
                        hex::encode(&pred)
                    ),
                );
            }
            edges.insert((role, pred));
        }
        let named: BTreeSet<(String, Vec<u8>)> = fact
            .predecessors()
            .iter()
            .flat_map(|(role, set)| set.iter().map(move |h| (role.clone(), h.0.to_vec())))
            .collect();
        for (role, p) in named.difference(&edges) {
            report.problem(
                Some(hash),
                format!(
                    "predecessor {} (role {role}) is not released before it",
                    hex::encode(p)
                ),
            );
        }
        for (role, p) in edges.difference(&named) {
            report.problem(
                Some(hash),
                format!(
                    "edge to {} (role {role}) that its bytes do not name",
                    hex::encode(p)
                ),
            );
        }
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
            if self.seq_of(&hash)?.is_some() {
                report.problem(Some(hash), "both held and released");
            }
            let mut absent = BTreeSet::new();
            for p in fact.predecessor_hashes() {
                if self.seq_of(&p)?.is_none() {
                    absent.insert(p);
                }
            }
            if absent.is_empty() {
                report.problem(Some(hash), "held although every predecessor is released");
            }
            let id: i64 = row.get(3);
            for p in &absent {
                let waits = self.row(
                    "SELECT 1 FROM held_wait WHERE missing = $1 AND waiter = $2
                     UNION ALL SELECT 1 FROM held_child c JOIN held h ON h.id = c.parent
                     WHERE h.hash = $1 AND c.waiter = $2",
                    &[&&p.0[..], &id],
                )?;
                if waits.is_none() {
                    report.problem(
                        Some(hash),
                        format!("does not wait for absent predecessor {p}"),
                    );
                }
            }
            let missing: i64 = row.get(2);
            if missing != absent.len() as i64 {
                report.problem(
                    Some(hash),
                    format!(
                        "missing count {missing} but {} predecessors are absent",
                        absent.len()
                    ),
                );
            }
            wait_rows += missing;
        }
        let counter = self.held_count()? as i64;
        if counter != report.held as i64 {
            report.problem(
                None,
                format!("held counter says {counter}, table has {}", report.held),
            );
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
        let (twice, rows, orphans): (i64, i64, i64) = (row[0].get(0), row[0].get(1), row[0].get(2));
        if twice > 0 {
            report.problem(None, format!("{twice} hashes are held more than once"));
        }
        if orphans > 0 {
            report.problem(None, format!("{orphans} wait rows name no held fact"));
        }
        if rows != wait_rows {
            report.problem(
                None,
                format!("{rows} wait rows, but held facts miss {wait_rows} predecessors"),
            );
        }
        Ok(())
    }
}
