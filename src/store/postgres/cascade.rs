//! A cascade of a batch on PostgreSQL in a few statements: the held facts reachable from
//! the released fact are read at once (a recursive query), released in memory in the
//! order of the one-fact cascade (`PgWrite::cascade`, depth first, waiters in key order),
//! and written back at once: their fact rows and edges in runs, the waits and held rows
//! they used up deleted and the counts of the rest updated by one statement.
//!
//! What is read is bounded ([`REACH`] held rows): a larger cascade goes the one-fact way,
//! so memory stays bounded whatever the held set.

use std::collections::HashMap;

use super::batch::{Batch, Known, RUN};
use super::read::hash_at;
use super::write::PgWrite;
use crate::dag::BuildFactHasher;
use crate::error::{Error, Result};
use crate::fact::Fact;
use crate::hash::FactHash;
use crate::store::backend::HookRunner;
use crate::store::steps::{held_fact, released_predecessors};

/// Held rows a cascade reads at once at most.
const REACH: i64 = 200_000;

/// A held row a cascade may release: hash, fact, missing count.
type HeldRow = (FactHash, Fact, i64);

/// The held set around a cascade, as read at its start.
struct Reach {
    rows: HashMap<i64, HeldRow>,
    /// Waiters by the hash they wait for, in key order.
    waits: HashMap<FactHash, Vec<i64>, BuildFactHasher>,
    /// Waiters by the held row they wait for, in key order.
    children: HashMap<i64, Vec<i64>>,
}

/// The writes a cascade gathered (as `Cleanup` of the SQLite backend).
#[derive(Default)]
struct Used {
    waits: Vec<FactHash>,
    children: Vec<i64>,
    rows: Vec<i64>,
    arrivals: HashMap<i64, i64>,
}

impl PgWrite<'_> {
    /// Releases what waited for `first` (released as `first_at`, and written), as
    /// [`PgWrite::cascade`] does; returns how many.
    pub(super) fn cascade_in_batch(
        &mut self,
        first: FactHash,
        first_at: (i64, i64),
        b: &mut Batch,
        hooks: &mut HookRunner<'_>,
    ) -> Result<u64> {
        if b.one_by_one {
            return self.cascade(first, first_at, hooks);
        }
        let Some(mut reach) = self.reach(&first)? else {
            return self.cascade(first, first_at, hooks);
        };
        let known = self.released_around(&reach)?;
        let mut used = Used::default();
        let mut released = 0;
        let mut stack = vec![(first, first_at, None::<i64>)];
        while let Some((arrived, at, held_id)) = stack.pop() {
            let mut waiters = reach.waits.remove(&arrived).unwrap_or_default();
            if !waiters.is_empty() {
                used.waits.push(arrived);
            }
            if let Some(parent) = held_id
                && let Some(children) = reach.children.remove(&parent)
            {
                used.children.push(parent);
                waiters.extend(children);
            }
            for waiter in waiters {
                let Some(row) = reach.rows.get(&waiter) else {
                    return Err(Error::Corrupt {
                        hash: arrived,
                        reason: format!("a wait record names held row {waiter}, which is absent"),
                    });
                };
                let arrivals = used.arrivals.entry(waiter).or_insert(0);
                *arrivals += 1;
                if row.2 > *arrivals {
                    continue;
                }
                used.arrivals.remove(&waiter);
                used.rows.push(waiter);
                let (hash, fact, _) = reach.rows.remove(&waiter).expect("present");
                let at = self.release_in_memory(hash, fact, (arrived, at), &known, b)?;
                released += 1;
                stack.push((hash, at, Some(waiter)));
                if b.run.len() >= RUN {
                    self.flush(&mut b.run, hooks)?;
                }
            }
        }
        self.flush(&mut b.run, hooks)?;
        self.write_used(used)?;
        Ok(released)
    }

    /// A held fact all of whose predecessors are now released, given its seq and put in
    /// the batch's run (or, released already, left as it is); its seq and type id.
    fn release_in_memory(
        &mut self,
        hash: FactHash,
        fact: Fact,
        arrived: (FactHash, (i64, i64)),
        known: &Known,
        b: &mut Batch,
    ) -> Result<(i64, i64)> {
        let batch = self.batch_released.as_ref().expect("in a batch");
        let find = |h: &FactHash| {
            batch
                .get(h)
                .or_else(|| known.get(h))
                .or_else(|| b.before.get(h))
                .or_else(|| self.assumed.get(h))
                .copied()
        };
        let preds = released_predecessors(&hash, &fact, arrived, &mut |p| Ok(find(p)))?;
        let stale = find(&hash);
        self.add_held(-1);
        self.batch_held.as_mut().expect("in a batch").remove(&hash);
        if let Some(at) = stale {
            // A held row of a fact released already: gone now, its waiters follow.
            return Ok(at);
        }
        let type_id = self.names.id(&self.tx, false, fact.type_name())?;
        let mut edges = Vec::with_capacity(preds.len());
        for (role, pred, pred_seq, pred_type) in &preds {
            edges.push((
                self.names.id(&self.tx, true, role)?,
                *pred,
                *pred_seq,
                *pred_type,
            ));
        }
        let seq = self.counters().seq + 1;
        self.counters().seq = seq;
        b.run.push(fact, seq, type_id, &edges);
        let batch = self.batch_released.as_mut().expect("in a batch");
        batch.insert(hash, (seq, type_id));
        Ok((seq, type_id))
    }

    /// The held rows reachable from `first` through waits, with the waits out of them
    /// and of `first`; `None` if there are more than [`REACH`].
    fn reach(&self, first: &FactHash) -> Result<Option<Reach>> {
        let rows = self.tx.rows(
            "WITH RECURSIVE r(id) AS (
                 SELECT waiter FROM held_wait WHERE missing = $1
               UNION
                 SELECT x.waiter FROM r JOIN held h ON h.id = r.id
                 CROSS JOIN LATERAL (
                     SELECT waiter FROM held_wait WHERE missing = h.hash
                     UNION ALL SELECT waiter FROM held_child WHERE parent = h.id) x)
             SELECT h.id, h.hash, h.bytes, h.missing FROM (SELECT id FROM r LIMIT $2) r
             JOIN held h ON h.id = r.id",
            &[&&first.0[..], &(REACH + 1)],
        )?;
        if rows.len() as i64 > REACH {
            return Ok(None);
        }
        let mut reach = Reach {
            rows: HashMap::with_capacity(rows.len()),
            waits: HashMap::default(),
            children: HashMap::new(),
        };
        let mut hashes = vec![first.0.to_vec()];
        let mut ids = Vec::with_capacity(rows.len());
        for row in &rows {
            let (id, hash): (i64, FactHash) = (row.get(0), hash_at(row, 1)?);
            let fact = held_fact(&hash, row.get(2))?;
            reach.rows.insert(id, (hash, fact, row.get(3)));
            hashes.push(hash.0.to_vec());
            ids.push(id);
        }
        drop(rows);
        for row in self.tx.rows(
            "SELECT missing, NULL::bigint, waiter FROM held_wait WHERE missing = ANY($1)
             UNION ALL SELECT NULL::bytea, parent, waiter FROM held_child WHERE parent = ANY($2)",
            &[&hashes, &ids],
        )? {
            let waiter: i64 = row.get(2);
            match row.get::<_, Option<i64>>(1) {
                Some(parent) => reach.children.entry(parent).or_default().push(waiter),
                None => reach
                    .waits
                    .entry(hash_at(&row, 0)?)
                    .or_default()
                    .push(waiter),
            }
        }
        reach.waits.values_mut().for_each(|w| w.sort_unstable());
        reach.children.values_mut().for_each(|w| w.sort_unstable());
        Ok(Some(reach))
    }

    /// Which of the reachable facts and their predecessors are released, read at once.
    fn released_around(&self, reach: &Reach) -> Result<Known> {
        let mut wanted: Vec<&[u8]> = Vec::new();
        for (hash, fact, _) in reach.rows.values() {
            wanted.push(&hash.0[..]);
            for (_, set) in fact.predecessors() {
                wanted.extend(set.iter().map(|p| &p.0[..]));
            }
        }
        wanted.sort_unstable();
        wanted.dedup();
        let mut known = Known::default();
        for row in self.tx.rows(
            "SELECT hash, seq, type_id FROM fact WHERE hash = ANY($1::bytea[])",
            &[&wanted],
        )? {
            known.insert(hash_at(&row, 0)?, (row.get(1), row.get(2)));
        }
        Ok(known)
    }

    /// Deletes the waits and held rows a cascade used up and updates the counts of the
    /// held rows still waiting, in one statement.
    fn write_used(&mut self, used: Used) -> Result<()> {
        let waits: Vec<&[u8]> = used.waits.iter().map(|h| &h.0[..]).collect();
        let (ids, n): (Vec<i64>, Vec<i64>) = used.arrivals.into_iter().unzip();
        self.tx.exec(
            "WITH w AS (DELETE FROM held_wait WHERE missing = ANY($1)),
                  c AS (DELETE FROM held_child WHERE parent = ANY($2)),
                  h AS (DELETE FROM held WHERE id = ANY($3))
             UPDATE held SET missing = held.missing - u.n
             FROM unnest($4::bigint[], $5::bigint[]) AS u(id, n) WHERE held.id = u.id",
            &[&waits, &used.children, &used.rows, &ids, &n],
        )?;
        Ok(())
    }
}
