//! Dropping held facts (`precedent held drop`, `precedent held expire`): the one way rows
//! leave the held set other than by release.
//!
//! A held fact was never released, so dropping it takes nothing from the released history.
//! Every held fact that waits for a dropped one, directly or through other held facts, is
//! dropped with it: it could be released only after the dropped fact, which is no longer
//! stored (`docs/semantics.md`, "Dropping held facts"). So nothing left in the held set
//! waits for a dropped fact, and no `missing` count of a fact that stays changes.

use std::collections::HashSet;

use rusqlite::{OptionalExtension, params};

use super::write::SqliteWrite;
use crate::error::{Error, Result};
use crate::hash::FactHash;

/// A held row about to be dropped.
struct Doomed {
    id: i64,
    hash: FactHash,
    bytes: Vec<u8>,
}

impl SqliteWrite<'_> {
    /// See [`crate::store::WriteTx::drop_held`].
    pub(super) fn drop_held(&mut self, hashes: &[FactHash]) -> Result<Vec<FactHash>> {
        let mut roots = Vec::with_capacity(hashes.len());
        for hash in hashes {
            match self.held_row(hash)? {
                Some(row) => roots.push(row),
                None if self.released_seq(hash)?.is_some() => {
                    return Err(Error::NotHeld { hash: *hash });
                }
                None => return Err(Error::NotFound { hash: *hash }),
            }
        }
        self.drop_rows(roots)
    }

    /// See [`crate::store::WriteTx::drop_held_before`].
    pub(super) fn drop_held_before(&mut self, held_at_ms: i64) -> Result<Vec<FactHash>> {
        // A scan of `held`: expiry is occasional maintenance, not worth an index that
        // every hold would write.
        let roots = self
            .c()
            .prepare_cached("SELECT id, hash, bytes FROM held WHERE held_at <= ?1 ORDER BY id")?
            .query_map([held_at_ms], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))?
            .collect::<rusqlite::Result<Vec<(i64, Vec<u8>, Vec<u8>)>>>()?;
        let roots = roots
            .into_iter()
            .map(|(id, hash, bytes)| doomed(id, &hash, bytes))
            .collect::<Result<Vec<_>>>()?;
        self.drop_rows(roots)
    }

    /// The held row of `hash`, if it is held.
    fn held_row(&self, hash: &FactHash) -> Result<Option<Doomed>> {
        let row = self
            .c()
            .prepare_cached(
                "SELECT id, bytes FROM held
                 WHERE substr(hash, 1, 8) = substr(?1, 1, 8) AND hash = ?1",
            )?
            .query_row([&hash.0[..]], |r| Ok((r.get(0)?, r.get(1)?)))
            .optional()?;
        Ok(row.map(|(id, bytes)| Doomed {
            id,
            hash: *hash,
            bytes,
        }))
    }

    /// Drops `roots` and every held fact waiting for them, transitively.
    fn drop_rows(&mut self, roots: Vec<Doomed>) -> Result<Vec<FactHash>> {
        let doomed = self.with_waiters(roots)?;
        let ids: HashSet<i64> = doomed.iter().map(|d| d.id).collect();
        for d in &doomed {
            self.drop_waits(d, &ids)?;
        }
        let mut delete = self.c().prepare_cached("DELETE FROM held WHERE id = ?1")?;
        for d in &doomed {
            delete.execute([d.id])?;
        }
        drop(delete);
        let held = self.held_now()?;
        self.set_held(held - doomed.len() as i64);
        Ok(doomed.into_iter().map(|d| d.hash).collect())
    }

    /// `roots` followed by every held fact that waits for one of them, transitively, each
    /// once. A waiter is found in `held_wait` by the hash it waits for and in `held_child`
    /// by the row id of the held fact it waits for.
    fn with_waiters(&self, roots: Vec<Doomed>) -> Result<Vec<Doomed>> {
        let mut seen: HashSet<i64> = HashSet::new();
        let mut out: Vec<Doomed> = roots.into_iter().filter(|d| seen.insert(d.id)).collect();
        let mut next = 0;
        while next < out.len() {
            let (id, hash) = (out[next].id, out[next].hash);
            next += 1;
            let mut waiters = self.ids(
                "SELECT waiter FROM held_wait WHERE missing = ?1",
                &hash.0[..],
            )?;
            waiters.extend(self.ids("SELECT waiter FROM held_child WHERE parent = ?1", id)?);
            for waiter in waiters {
                if seen.insert(waiter) {
                    out.push(self.held_by_id(waiter, &hash)?);
                }
            }
        }
        Ok(out)
    }

    fn ids(&self, sql: &str, key: impl rusqlite::ToSql) -> Result<Vec<i64>> {
        Ok(self
            .c()
            .prepare_cached(sql)?
            .query_map([key], |r| r.get(0))?
            .collect::<rusqlite::Result<Vec<i64>>>()?)
    }

    /// The held row `id`, named as a waiter of `parent`.
    fn held_by_id(&self, id: i64, parent: &FactHash) -> Result<Doomed> {
        let (hash, bytes): (Vec<u8>, Vec<u8>) = self
            .c()
            .prepare_cached("SELECT hash, bytes FROM held WHERE id = ?1")?
            .query_row([id], |r| Ok((r.get(0)?, r.get(1)?)))
            .optional()?
            .ok_or_else(|| Error::Corrupt {
                hash: *parent,
                reason: format!("a wait record names held row {id}, which is absent"),
            })?;
        doomed(id, &hash, bytes)
    }

    /// Deletes the wait records naming `d`, as waiter or as what is waited for. `doomed`
    /// holds the ids of every row being dropped: a wait of `d` for one of them goes with
    /// that row's waits; a wait for a held fact that stays is looked up by its row id.
    fn drop_waits(&self, d: &Doomed, doomed: &HashSet<i64>) -> Result<()> {
        let c = self.c();
        // What waited for `d` is being dropped with it.
        c.prepare_cached("DELETE FROM held_wait WHERE missing = ?1")?
            .execute([&d.hash.0[..]])?;
        c.prepare_cached("DELETE FROM held_child WHERE parent = ?1")?
            .execute([d.id])?;
        // What `d` waited for: its predecessors, read from its bytes (no index by waiter).
        let fact =
            crate::encoding::decode_fact(&d.bytes, Some(d.hash)).map_err(|e| Error::Corrupt {
                hash: d.hash,
                reason: format!("held bytes do not decode: {e}"),
            })?;
        for p in fact.predecessor_hashes() {
            c.prepare_cached("DELETE FROM held_wait WHERE missing = ?1 AND waiter = ?2")?
                .execute(params![&p.0[..], d.id])?;
            if let Some(parent) = self.held_row(&p)?
                && !doomed.contains(&parent.id)
            {
                c.prepare_cached("DELETE FROM held_child WHERE parent = ?1 AND waiter = ?2")?
                    .execute([parent.id, d.id])?;
            }
        }
        Ok(())
    }
}

fn doomed(id: i64, hash: &[u8], bytes: Vec<u8>) -> Result<Doomed> {
    Ok(Doomed {
        id,
        hash: FactHash::from_stored(hash)?,
        bytes,
    })
}
