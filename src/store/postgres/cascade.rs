//! A cascade of a batch on PostgreSQL in a few statements: the held facts reachable from
//! the released fact are read at once (a recursive query), released in memory in the
//! order of the one-fact cascade (`PgWrite::cascade`, depth first, waiters in key order),
//! and written back at once: their fact rows and edges in runs, the waits and held rows
//! they used up deleted and the counts of the rest updated by one statement.
//!
//! The held rows are read as the cascade reaches them, each read taking the rows
//! reachable from the fact being released, breadth first, up to a bound that starts small
//! and grows with each read of one cascade (most cascades release few facts; a long one
//! reads up to [`MOST`] rows at a time).

use std::collections::{HashMap, HashSet};

use super::batch::{Batch, Known, RUN};
use super::read::hash_at;
use super::write::PgWrite;
use crate::dag::BuildFactHasher;
use crate::error::{Error, Result};
use crate::fact::Fact;
use crate::hash::FactHash;
use crate::store::backend::HookRunner;
use crate::store::steps::{held_fact, released_predecessors};

/// Held rows a cascade reads at once: at first, and at most.
const FIRST: i64 = 64;
const MOST: i64 = 16_384;

/// A held row a cascade may release: hash, fact, missing count.
type HeldRow = (FactHash, Fact, i64);

/// The held set around a cascade, as read so far (the cascade writes it back at its end).
#[derive(Default)]
struct Reach {
    /// Rows read and not released.
    rows: HashMap<i64, HeldRow>,
    /// Rows released by the cascade.
    gone: HashSet<i64>,
    /// Hashes and held rows whose waiters are read.
    expanded: (HashSet<FactHash, BuildFactHasher>, HashSet<i64>),
    /// Released facts the rows read name, as read with them.
    known: Known,
    /// Rows the next read takes at most.
    limit: i64,
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
        if b.hooking.each() {
            return self.cascade(first, first_at, hooks);
        }
        let mut reach = Reach {
            limit: FIRST,
            ..Reach::default()
        };
        let mut used = Used::default();
        let mut released = 0;
        let mut stack = vec![(first, first_at, None::<i64>)];
        while let Some((arrived, at, held_id)) = stack.pop() {
            self.expand(&mut reach, &arrived, held_id)?;
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
            let absent: Vec<i64> = waiters
                .iter()
                .filter(|w| !reach.rows.contains_key(w) && !reach.gone.contains(w))
                .copied()
                .collect();
            if !absent.is_empty() {
                self.read_rows(&mut reach, &absent)?;
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
                reach.gone.insert(waiter);
                let at = self.release_in_memory(hash, fact, (arrived, at), &reach.known, b)?;
                released += 1;
                stack.push((hash, at, Some(waiter)));
                if b.run.len() >= RUN {
                    self.flush(&mut b.run, b.hooking.hooked(), hooks)?;
                }
            }
        }
        self.flush(&mut b.run, b.hooking.hooked(), hooks)?;
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
        let edges = self.run_edges(&preds)?;
        self.join_run(fact, &edges, b)
    }

    /// Reads the waiters of `hash` (and of held row `id`) unless read, with the rows
    /// reachable from them up to the cascade's bound and the waiters of those.
    fn expand(&self, reach: &mut Reach, hash: &FactHash, id: Option<i64>) -> Result<()> {
        if reach.expanded.0.contains(hash) && id.is_none_or(|i| reach.expanded.1.contains(&i)) {
            return Ok(());
        }
        let rows = self.tx.rows(
            "WITH RECURSIVE r(id) AS (
                 SELECT waiter FROM held_wait WHERE missing = $1
                 UNION SELECT waiter FROM held_child WHERE parent = $2
               UNION
                 SELECT x.waiter FROM r JOIN held h ON h.id = r.id
                 CROSS JOIN LATERAL (
                     SELECT waiter FROM held_wait WHERE missing = h.hash
                     UNION ALL SELECT waiter FROM held_child WHERE parent = h.id) x)
             SELECT h.id, h.hash, h.bytes, h.missing FROM (SELECT id FROM r LIMIT $3) r
             JOIN held h ON h.id = r.id",
            &[&&hash.0[..], &id, &reach.limit],
        )?;
        reach.limit = (reach.limit * 4).min(MOST);
        let mut hashes = vec![*hash];
        let mut ids: Vec<i64> = id.into_iter().collect();
        for (id, h) in self.take_rows(reach, &rows)? {
            hashes.push(h);
            ids.push(id);
        }
        hashes.retain(|h| reach.expanded.0.insert(*h));
        ids.retain(|i| reach.expanded.1.insert(*i));
        let hashes: Vec<&[u8]> = hashes.iter().map(|h| &h.0[..]).collect();
        for row in self.tx.rows(
            "SELECT missing, NULL::bigint, waiter FROM held_wait WHERE missing = ANY($1)
             UNION ALL SELECT NULL::bytea, parent, waiter FROM held_child WHERE parent = ANY($2)",
            &[&hashes, &ids],
        )? {
            let waiter: i64 = row.get(2);
            let list = match row.get::<_, Option<i64>>(1) {
                Some(parent) => reach.children.entry(parent).or_default(),
                None => reach.waits.entry(hash_at(&row, 0)?).or_default(),
            };
            // In key order, as SQLite reads them.
            let at = list.partition_point(|w| *w < waiter);
            list.insert(at, waiter);
        }
        Ok(())
    }

    /// Reads held rows `ids` (waiters beyond the last read's bound).
    fn read_rows(&self, reach: &mut Reach, ids: &[i64]) -> Result<()> {
        let rows = self.tx.rows(
            "SELECT id, hash, bytes, missing FROM held WHERE id = ANY($1)",
            &[&ids],
        )?;
        self.take_rows(reach, &rows)?;
        Ok(())
    }

    /// Keeps the held rows read that the cascade has not met, with the released facts
    /// they name; returns their ids and hashes.
    fn take_rows(&self, reach: &mut Reach, rows: &[postgres::Row]) -> Result<Vec<(i64, FactHash)>> {
        let mut new = Vec::new();
        let mut wanted: Vec<FactHash> = Vec::new();
        for row in rows {
            let id: i64 = row.get(0);
            if reach.gone.contains(&id) || reach.rows.contains_key(&id) {
                continue;
            }
            let hash = hash_at(row, 1)?;
            let fact = held_fact(&hash, row.get(2))?;
            wanted.push(hash);
            wanted.extend(fact.predecessor_hashes());
            reach.rows.insert(id, (hash, fact, row.get(3)));
            new.push((id, hash));
        }
        wanted.sort_unstable();
        wanted.dedup();
        wanted.retain(|h| !reach.known.contains_key(h));
        if wanted.is_empty() {
            return Ok(new);
        }
        let wanted: Vec<&[u8]> = wanted.iter().map(|h| &h.0[..]).collect();
        for row in self.tx.rows(super::batch::LOOK_UP, &[&wanted])? {
            reach
                .known
                .insert(hash_at(&row, 0)?, (row.get(1), row.get(2)));
        }
        Ok(new)
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
