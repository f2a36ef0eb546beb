//! Dropping held facts on PostgreSQL, with what waits for them (the rule is in
//! `docs/semantics.md`, "Dropping held facts"), under the write lock.

use std::collections::HashSet;

use super::read::hash_at;
use super::write::PgWrite;
use crate::error::{Error, Result};
use crate::hash::FactHash;
use crate::store::backend::ReadTx;

impl PgWrite<'_> {
    /// See [`crate::store::WriteTx::drop_held`].
    pub(super) fn drop_held_hashes(&mut self, hashes: &[FactHash]) -> Result<Vec<FactHash>> {
        let mut roots = Vec::with_capacity(hashes.len());
        for hash in hashes {
            match self.held_id(hash)? {
                Some((id, _)) => roots.push((id, *hash)),
                None if self.tx.seq_of(hash)?.is_some() => {
                    return Err(Error::NotHeld { hash: *hash });
                }
                None => return Err(Error::NotFound { hash: *hash }),
            }
        }
        self.drop_all(roots)
    }

    /// See [`crate::store::WriteTx::drop_held_before`].
    pub(super) fn drop_held_older(&mut self, held_at_ms: i64) -> Result<Vec<FactHash>> {
        let roots = self
            .tx
            .rows(
                "SELECT id, hash FROM held WHERE held_at <= $1 ORDER BY id",
                &[&held_at_ms],
            )?
            .iter()
            .map(|r| Ok((r.get(0), hash_at(r, 1)?)))
            .collect::<Result<Vec<(i64, FactHash)>>>()?;
        self.drop_all(roots)
    }

    /// Drops `roots` and, transitively, every held fact waiting for one of them.
    fn drop_all(&mut self, roots: Vec<(i64, FactHash)>) -> Result<Vec<FactHash>> {
        let mut seen = HashSet::new();
        let mut doomed: Vec<(i64, FactHash)> = roots
            .into_iter()
            .filter(|(id, _)| seen.insert(*id))
            .collect();
        let mut next = 0;
        while next < doomed.len() {
            let (id, hash) = doomed[next];
            next += 1;
            let waiters = self.tx.rows(
                "SELECT waiter FROM held_wait WHERE missing = $1
                 UNION ALL SELECT waiter FROM held_child WHERE parent = $2",
                &[&&hash.0[..], &id],
            )?;
            for w in waiters {
                let waiter: i64 = w.get(0);
                if !seen.insert(waiter) {
                    continue;
                }
                let row = self
                    .tx
                    .row("SELECT hash FROM held WHERE id = $1", &[&waiter])?
                    .ok_or_else(|| Error::Corrupt {
                        hash,
                        reason: format!("a wait record names held row {waiter}, which is absent"),
                    })?;
                doomed.push((waiter, hash_at(&row, 0)?));
            }
        }
        let ids: Vec<i64> = doomed.iter().map(|d| d.0).collect();
        let hashes: Vec<&[u8]> = doomed.iter().map(|d| &d.1.0[..]).collect();
        // Every wait record of a dropped row, as waiter or as waited for: a dropped fact
        // never waits for one that stays in a way that changes the other's count.
        self.tx.exec(
            "DELETE FROM held_wait WHERE waiter = ANY($1) OR missing = ANY($2)",
            &[&ids, &hashes],
        )?;
        self.tx.exec(
            "DELETE FROM held_child WHERE waiter = ANY($1) OR parent = ANY($1)",
            &[&ids],
        )?;
        self.tx
            .exec("DELETE FROM held WHERE id = ANY($1)", &[&ids])?;
        self.add_held(-(doomed.len() as i64));
        Ok(doomed.into_iter().map(|d| d.1).collect())
    }
}
