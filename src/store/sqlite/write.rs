//! Writes: idempotent insert, holding facts whose ancestors are missing, and releasing
//! them (cascading) in the transaction that completes their ancestry.

use std::collections::HashMap;
use std::sync::MutexGuard;

use rusqlite::{Connection, OptionalExtension, params};

use super::names::{Kind, PendingNames};
use super::{Shared, Turn, Tx};
use crate::dag;
use crate::error::{Error, Result};
use crate::fact::Fact;
use crate::hash::FactHash;
use crate::store::backend::{HookRunner, ReadTx, WriteTx};
use crate::store::steps::{
    Assumed, BatchHeld, Missing, Pred, batch_order, held_fact, released_predecessors, settle_held,
    split_predecessors, tally,
};
use crate::store::{BatchReport, InsertOutcome};

/// Held-set rows a cascade has used up, removed or updated together (see
/// [`SqliteWrite::release_waiters`]).
#[derive(Default)]
struct Cleanup {
    /// Facts released by the cascade whose `held_wait` rows are to be deleted.
    waits: Vec<FactHash>,
    /// Held rows released by the cascade whose `held_child` rows are to be deleted.
    children: Vec<i64>,
    /// Held rows released by the cascade, to be deleted.
    rows: Vec<i64>,
    /// Held rows still missing something: how many of their missing ancestors arrived
    /// since their `missing` count was last written.
    arrivals: HashMap<i64, i64>,
}

impl Cleanup {
    /// Entries gathered before they are written: bounds the memory of a long cascade.
    const BATCH: usize = 65_536;

    fn len(&self) -> usize {
        self.waits.len() + self.children.len() + self.rows.len() + self.arrivals.len()
    }
}

/// The write transaction of a SQLite store: the write connection, locked for its life.
pub(crate) struct SqliteWrite<'a> {
    tx: Tx<'a, MutexGuard<'a, Connection>>,
    /// This process's turn to write, held until the transaction ends (declared after
    /// `tx`, so it is given back after the transaction is rolled back on drop).
    _turn: Turn<'a>,
    names: PendingNames,
    /// The held count as of this transaction, read lazily from the counter table.
    held: Option<i64>,
    /// The held count when first read, to write back only a change.
    held_at_start: i64,
    /// The held count at each open savepoint, to go back to if it is rolled back.
    savepoints: Vec<Option<i64>>,
    /// During [`SqliteWrite::insert_batch`], the facts of the batch that are held (and not
    /// released since), with their `held` row ids: a fact naming one of them as a
    /// predecessor is held without looking that predecessor up, and waits for it in
    /// `held_child` by row id. `None` outside a batch.
    batch_held: Option<BatchHeld>,
    /// Facts the caller said are released, as (seq, type id) (see
    /// [`WriteTx::assume_released`]): an insert naming one skips its lookup.
    assumed: Assumed,
}

crate::store::shared::forward_to_tx!(sql SqliteWrite<'_>);

impl ReadTx for SqliteWrite<'_> {
    crate::store::shared::forward_to_tx!(reads);

    fn held_count(&self) -> Result<u64> {
        match self.held {
            Some(n) => Ok(n as u64),
            None => self.tx.held_count(),
        }
    }

    fn last_seq(&self) -> Result<i64> {
        self.tx.last_seq()
    }
}

impl WriteTx for SqliteWrite<'_> {
    fn insert(&mut self, fact: &Fact, hooks: &mut HookRunner<'_>) -> Result<InsertOutcome> {
        self.tx.alive()?;
        SqliteWrite::insert(self, fact, hooks)
    }

    fn insert_batch(
        &mut self,
        facts: Vec<Fact>,
        hooks: &mut HookRunner<'_>,
    ) -> Result<BatchReport> {
        self.tx.alive()?;
        SqliteWrite::insert_batch(self, facts, hooks)
    }

    fn drop_held(&mut self, hashes: &[FactHash]) -> Result<Vec<FactHash>> {
        self.tx.alive()?;
        SqliteWrite::drop_held(self, hashes)
    }

    fn drop_held_before(&mut self, held_at_ms: i64) -> Result<Vec<FactHash>> {
        self.tx.alive()?;
        SqliteWrite::drop_held_before(self, held_at_ms)
    }

    fn savepoint(&mut self) -> Result<()> {
        self.tx.alive()?;
        self.tx
            .conn
            .prepare_cached("SAVEPOINT precedent")?
            .execute([])?;
        self.savepoints.push(self.held);
        Ok(())
    }

    fn release_savepoint(&mut self) -> Result<()> {
        self.tx.alive()?;
        self.tx
            .conn
            .prepare_cached("RELEASE precedent")?
            .execute([])?;
        self.savepoints.pop();
        Ok(())
    }

    fn rollback_savepoint(&mut self) -> Result<()> {
        self.tx.alive()?;
        self.c()
            .execute_batch("ROLLBACK TO precedent; RELEASE precedent")?;
        if let Some(held) = self.savepoints.pop() {
            self.held = held;
        }
        // Names numbered inside the savepoint are gone with it, and a release the caller
        // told of may be: forget them all, they are looked up again.
        self.names.forget();
        self.assumed.clear();
        Ok(())
    }

    fn assume_released(&mut self, fact: &Fact, seq: i64) -> Result<()> {
        self.tx.alive()?;
        let type_id = self.type_id(fact.type_name())?;
        self.assumed.insert(fact.hash(), (seq, type_id));
        Ok(())
    }

    fn as_read(&self) -> &dyn ReadTx {
        self
    }

    fn commit(mut self: Box<Self>) -> Result<()> {
        self.tx.alive()?;
        if let Some(held) = self.held
            && held != self.held_at_start
        {
            self.c()
                .prepare_cached("UPDATE counter SET value = ?1 WHERE name = 'held'")?
                .execute([held])?;
        }
        self.tx.finish("COMMIT")?;
        let names = std::mem::take(&mut self.names);
        self.tx.shared.names.commit(names);
        Ok(())
    }
}

impl<'a> SqliteWrite<'a> {
    /// Begins the write transaction on the locked write connection.
    pub(crate) fn begin(
        turn: Turn<'a>,
        conn: MutexGuard<'a, Connection>,
        shared: &'a Shared,
    ) -> Result<SqliteWrite<'a>> {
        Ok(SqliteWrite {
            tx: Tx::begin(conn, shared, "BEGIN IMMEDIATE")?,
            _turn: turn,
            names: PendingNames::default(),
            held: None,
            held_at_start: 0,
            savepoints: Vec::new(),
            batch_held: None,
            assumed: HashMap::default(),
        })
    }

    /// The id of a type name, numbered in this transaction if it is new.
    fn type_id(&mut self, name: &str) -> Result<i64> {
        self.names
            .id(&self.tx.shared.names, &self.tx.conn, Kind::Type, name)
    }

    pub(super) fn c(&self) -> &Connection {
        &self.tx.conn
    }

    /// Sets the held count, written to the counter at commit.
    pub(super) fn set_held(&mut self, n: i64) {
        self.held = Some(n);
    }

    pub(super) fn held_now(&mut self) -> Result<i64> {
        if let Some(n) = self.held {
            return Ok(n);
        }
        let n = self.tx.held_count()? as i64;
        self.held = Some(n);
        self.held_at_start = n;
        Ok(n)
    }

    /// Inserts one fact (see [`crate::Store::insert`]).
    ///
    /// # Errors
    /// [`Error::HeldLimit`] if the fact would be held past the bound; [`Error::Backend`].
    ///
    /// A new fact is not looked up first: a released duplicate has every predecessor
    /// released, so it reaches the fact table's unique hash, which tells it at insertion,
    /// and a held one is found by the hold. So a new fact (a queue completion, an effect)
    /// costs one index search less, and a duplicate one per predecessor more.
    fn insert(&mut self, fact: &Fact, hooks: &mut HookRunner<'_>) -> Result<InsertOutcome> {
        self.insert_unreleased(fact, hooks)
    }

    /// Inserts a fact that may be stored already: held (the held row says so) or
    /// released (the fact table's unique hash says so, when the fact is inserted); either
    /// way it is a duplicate and nothing changes.
    fn insert_unreleased(
        &mut self,
        fact: &Fact,
        hooks: &mut HookRunner<'_>,
    ) -> Result<InsertOutcome> {
        let (preds, missing) =
            split_predecessors(fact, self.batch_held.as_ref(), &self.assumed, &mut |h| {
                self.released(h)
            })?;
        if !missing.is_empty() {
            return self.hold(fact, missing);
        }
        let Some((seq, type_id)) = self.insert_released(fact, &preds, hooks)? else {
            // Stored already: a fact whose ancestors are all released may be released
            // itself, which the fact table's unique hash tells at no extra cost.
            return Ok(InsertOutcome::Duplicate {
                seq: self.released_seq(&fact.hash())?,
            });
        };
        let released = 1 + self.release_waiters(fact.hash(), seq, type_id, hooks)?;
        Ok(InsertOutcome::Inserted { seq, released })
    }

    /// Inserts facts given in any order, in this one transaction: duplicates collapse,
    /// facts are put in parent-before-child order, and every fact whose ancestry is
    /// complete is released.
    ///
    /// # Errors
    /// [`Error::Backend`]; a fact refused by the held bound is listed in
    /// [`BatchReport::refused`] instead of failing the batch.
    fn insert_batch(
        &mut self,
        facts: Vec<Fact>,
        hooks: &mut HookRunner<'_>,
    ) -> Result<BatchReport> {
        let mut report = BatchReport::default();
        let ordered = batch_order(facts, &mut report, &mut |h| {
            Ok(self.released_seq(h)?.is_some())
        })?;
        self.batch_held = Some(HashMap::with_hasher(dag::BuildFactHasher));
        let outcome = self.insert_ordered(&ordered, &mut report, hooks);
        let still_held = self.batch_held.take();
        outcome?;
        if let Some(still_held) = still_held {
            settle_held(&mut report, &still_held);
        }
        Ok(report)
    }

    /// Inserts a parents-first batch, adding the outcomes to `report`.
    fn insert_ordered(
        &mut self,
        ordered: &[Fact],
        report: &mut BatchReport,
        hooks: &mut HookRunner<'_>,
    ) -> Result<()> {
        for fact in ordered {
            let outcome = self.insert_unreleased(fact, hooks);
            tally(report, outcome)?;
        }
        Ok(())
    }

    /// The release sequence and type id of `hash`, if it is released: what an edge from a
    /// new fact to it records.
    fn released(&self, hash: &FactHash) -> Result<Option<(i64, i64)>> {
        Ok(self
            .c()
            .prepare_cached("SELECT seq, type_id FROM fact WHERE hash = ?1")?
            .query_row([&hash.0[..]], |r| Ok((r.get(0)?, r.get(1)?)))
            .optional()?)
    }

    /// The release sequence of `hash`, if it is released.
    pub(crate) fn released_seq(&self, hash: &FactHash) -> Result<Option<i64>> {
        Ok(self
            .c()
            .prepare_cached("SELECT seq FROM fact WHERE hash = ?1")?
            .query_row([&hash.0[..]], |r| r.get(0))
            .optional()?)
    }

    fn is_held(&self, hash: &FactHash) -> Result<bool> {
        Ok(self
            .c()
            .prepare_cached(
                "SELECT 1 FROM held WHERE substr(hash, 1, 8) = substr(?1, 1, 8) AND hash = ?1",
            )?
            .exists([&hash.0[..]])?)
    }

    /// Holds `fact`, waiting for the predecessors in `missing` (each with its `held` row
    /// id when it is known to be held: those waits go to `held_child`, keyed by that id,
    /// and the others to `held_wait`, keyed by hash).
    fn hold(&mut self, fact: &Fact, missing: Vec<Missing>) -> Result<InsertOutcome> {
        let hash = fact.hash();
        // Held hashes are unique by this check: the index on their first 8 bytes is not.
        if self.is_held(&hash)? {
            return Ok(InsertOutcome::Duplicate { seq: None });
        }
        let held = self.held_now()?;
        if held as u64 >= self.tx.shared.options.max_held {
            return Err(Error::HeldLimit {
                limit: self.tx.shared.options.max_held,
                hash,
            });
        }
        self.c()
            .prepare_cached(
                "INSERT INTO held (hash, bytes, missing, held_at) VALUES (?1, ?2, ?3, ?4)",
            )?
            .execute(params![
                &hash.0[..],
                fact.canonical_bytes(),
                missing.len() as i64,
                self.tx.shared.options.clock.now_ms()
            ])?;
        let id = self.c().last_insert_rowid();
        if let Some(batch) = &mut self.batch_held {
            batch.insert(hash, id);
        }
        for (m, parent) in &missing {
            match parent {
                Some(parent) => self
                    .c()
                    .prepare_cached("INSERT INTO held_child (parent, waiter) VALUES (?1, ?2)")?
                    .execute([parent, &id])?,
                None => self
                    .c()
                    .prepare_cached("INSERT INTO held_wait (missing, waiter) VALUES (?1, ?2)")?
                    .execute(params![&m.0[..], id])?,
            };
        }
        self.held = Some(held + 1);
        Ok(InsertOutcome::Held {
            missing: missing.into_iter().map(|(m, _)| m).collect(),
        })
    }

    /// Writes a fact whose predecessors (role, seq, type id) are all released; returns its
    /// sequence number and type id, or `None` if it was released already (and nothing was
    /// written).
    fn insert_released(
        &mut self,
        fact: &Fact,
        preds: &[Pred<'_>],
        hooks: &mut HookRunner<'_>,
    ) -> Result<Option<(i64, i64)>> {
        let type_id = self.type_id(fact.type_name())?;
        let added = self
            .c()
            .prepare_cached(
                "INSERT INTO fact (hash, type_id, bytes) VALUES (?1, ?2, ?3)
                 ON CONFLICT (hash) DO NOTHING",
            )?
            .execute(params![&fact.hash().0[..], type_id, fact.canonical_bytes()])?;
        if added == 0 {
            return Ok(None);
        }
        let seq = self.c().last_insert_rowid();
        for (role, _, pred, pred_type) in preds {
            let role_id = self
                .names
                .id(&self.tx.shared.names, &self.tx.conn, Kind::Role, role)?;
            self.c()
                .prepare_cached(
                    "INSERT INTO edge (predecessor, role_id, successor_type, successor, predecessor_type)
                     VALUES (?1, ?2, ?3, ?4, ?5)",
                )?
                .execute(params![pred, role_id, type_id, seq, pred_type])?;
        }
        let known = |h: &FactHash| preds.iter().find(|p| p.1 == *h).map(|p| (p.2, p.3));
        hooks.released(&self.tx, fact, seq, &known)?;
        Ok(Some((seq, type_id)))
    }

    /// Releases every held fact that was waiting only for `first` or for facts this call
    /// releases, depth first; returns how many it released.
    ///
    /// The rows the cascade uses up (the waits of each released fact, the held rows
    /// released, the counts of waiters still missing something) are removed or updated in
    /// key order every [`Cleanup::BATCH`] entries and at the end, not one at a time: a
    /// cascade reads each of them once, and writes in key order touch each page once.
    fn release_waiters(
        &mut self,
        first: FactHash,
        first_seq: i64,
        first_type: i64,
        hooks: &mut HookRunner<'_>,
    ) -> Result<u64> {
        if self.held_now()? == 0 {
            return Ok(0);
        }
        let mut released = 0;
        let mut cleanup = Cleanup::default();
        // Each released fact with its seq, its type id and, if it was held, its former
        // `held` row id.
        let mut stack = vec![(first, (first_seq, first_type), None)];
        while let Some((arrived, arrived_at, held_id)) = stack.pop() {
            let mut waiters = self.waiters(&arrived)?;
            if !waiters.is_empty() {
                cleanup.waits.push(arrived);
            }
            if let Some(parent) = held_id {
                let children = self.children(parent)?;
                if !children.is_empty() {
                    cleanup.children.push(parent);
                    waiters.extend(children);
                }
            }
            for waiter in waiters {
                let (hash, missing, bytes): (Vec<u8>, i64, Vec<u8>) = self
                    .c()
                    .prepare_cached("SELECT hash, missing, bytes FROM held WHERE id = ?1")?
                    .query_row([waiter], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
                    .optional()?
                    .ok_or_else(|| Error::Corrupt {
                        hash: arrived,
                        reason: format!("held_wait names held row {waiter}, which is absent"),
                    })?;
                let arrivals = cleanup.arrivals.entry(waiter).or_insert(0);
                *arrivals += 1;
                if missing > *arrivals {
                    continue;
                }
                cleanup.arrivals.remove(&waiter);
                cleanup.rows.push(waiter);
                let hash = FactHash::from_slice(&hash).ok_or_else(|| Error::Corrupt {
                    hash: arrived,
                    reason: format!("held row {waiter} has a hash that is not 32 bytes"),
                })?;
                let at = self.release_held(&hash, &bytes, (arrived, arrived_at), hooks)?;
                released += 1;
                stack.push((hash, at, Some(waiter)));
            }
            if cleanup.len() >= Cleanup::BATCH {
                self.apply_cleanup(&mut cleanup)?;
            }
        }
        self.apply_cleanup(&mut cleanup)?;
        Ok(released)
    }

    /// The held rows (ids) recorded as waiting for `arrived`.
    fn waiters(&mut self, arrived: &FactHash) -> Result<Vec<i64>> {
        Ok(self
            .c()
            .prepare_cached("SELECT waiter FROM held_wait WHERE missing = ?1")?
            .query_map([&arrived.0[..]], |r| r.get(0))?
            .collect::<rusqlite::Result<Vec<i64>>>()?)
    }

    /// The held rows (ids) recorded as waiting for the held row `parent`.
    fn children(&mut self, parent: i64) -> Result<Vec<i64>> {
        Ok(self
            .c()
            .prepare_cached("SELECT waiter FROM held_child WHERE parent = ?1")?
            .query_map([parent], |r| r.get(0))?
            .collect::<rusqlite::Result<Vec<i64>>>()?)
    }

    /// Writes what a cascade deferred, in key order, and empties `cleanup`.
    fn apply_cleanup(&mut self, cleanup: &mut Cleanup) -> Result<()> {
        cleanup.waits.sort_unstable();
        let mut delete = self
            .c()
            .prepare_cached("DELETE FROM held_wait WHERE missing = ?1")?;
        for arrived in cleanup.waits.drain(..) {
            delete.execute([&arrived.0[..]])?;
        }
        drop(delete);
        cleanup.children.sort_unstable();
        let mut delete = self
            .c()
            .prepare_cached("DELETE FROM held_child WHERE parent = ?1")?;
        for parent in cleanup.children.drain(..) {
            delete.execute([parent])?;
        }
        drop(delete);
        cleanup.rows.sort_unstable();
        let mut delete = self.c().prepare_cached("DELETE FROM held WHERE id = ?1")?;
        for id in cleanup.rows.drain(..) {
            delete.execute([id])?;
        }
        drop(delete);
        let mut arrivals: Vec<(i64, i64)> = cleanup.arrivals.drain().collect();
        arrivals.sort_unstable();
        let mut update = self
            .c()
            .prepare_cached("UPDATE held SET missing = missing - ?2 WHERE id = ?1")?;
        for (id, n) in arrivals {
            update.execute([id, n])?;
        }
        Ok(())
    }

    /// Moves a held fact whose ancestors are now all released into the fact table.
    /// `arrived` is the fact whose release completed this one's ancestry, with its
    /// sequence number and type id, so that predecessor is not looked up again.
    /// The caller removes its held row.
    fn release_held(
        &mut self,
        hash: &FactHash,
        bytes: &[u8],
        arrived: (FactHash, (i64, i64)),
        hooks: &mut HookRunner<'_>,
    ) -> Result<(i64, i64)> {
        let fact = held_fact(hash, bytes)?;
        let preds = released_predecessors(hash, &fact, arrived, &mut |p| self.released(p))?;
        self.held = Some(self.held_now()? - 1);
        if let Some(batch) = &mut self.batch_held {
            batch.remove(hash);
        }
        match self.insert_released(&fact, &preds, hooks)? {
            Some(at) => Ok(at),
            // A held row for a fact that is released already is stale: it is gone now,
            // and the fact's waiters follow it as they would have.
            None => self.released(hash)?.ok_or_else(|| Error::Corrupt {
                hash: *hash,
                reason: "neither inserted nor found released".into(),
            }),
        }
    }
}
