//! Writes: idempotent insert, holding facts whose ancestors are missing, and releasing
//! them (cascading) in the transaction that completes their ancestry.

use rusqlite::{OptionalExtension, Transaction, params};

use super::names::Kind;
use super::{Ctx, StoreOptions};
use crate::clock::Clock;
use crate::dag;
use crate::error::{Error, Result};
use crate::fact::Fact;
use crate::hash::{FactHash, HashPrefix};
use std::collections::HashMap;
use std::sync::Arc;

/// What became of one inserted fact.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum InsertOutcome {
    /// The fact was new and is released with sequence number `seq`. `released` counts it
    /// and every held fact its arrival released (cascading), so it is at least 1.
    Inserted {
        /// The fact's release sequence number.
        seq: i64,
        /// Facts released by this insert, the fact itself included.
        released: u64,
    },
    /// The fact was already stored; nothing changed. `seq` is `None` when it is held.
    Duplicate {
        /// Its release sequence number, if it is released.
        seq: Option<i64>,
    },
    /// The fact is new but some ancestors are absent: it is held, durably, until they arrive.
    Held {
        /// The predecessors that are not released yet.
        missing: Vec<FactHash>,
    },
}

impl InsertOutcome {
    /// Whether the fact is now held.
    pub fn is_held(&self) -> bool {
        matches!(self, InsertOutcome::Held { .. })
    }

    /// Whether the fact was already stored.
    pub fn is_duplicate(&self) -> bool {
        matches!(self, InsertOutcome::Duplicate { .. })
    }

    /// How many facts this insert released (the fact itself and any it unblocked).
    pub fn released(&self) -> u64 {
        match self {
            InsertOutcome::Inserted { released, .. } => *released,
            _ => 0,
        }
    }
}

/// Counts for a batch of inserts.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct BatchReport {
    /// Facts in the batch that were new and released on arrival.
    pub inserted: u64,
    /// Facts already stored (released or held), or given twice in the batch.
    pub duplicates: u64,
    /// New facts now held for missing ancestors (at the end of the batch).
    pub held: u64,
    /// Facts released, counting new facts released on arrival and held facts (from this
    /// batch or earlier ones) that the batch released.
    pub released: u64,
    /// Facts refused because the held-fact bound was reached; nothing else of them stored.
    pub refused: Vec<FactHash>,
}

impl BatchReport {
    /// Adds another report's counts to this one.
    pub fn merge(&mut self, other: BatchReport) {
        self.inserted += other.inserted;
        self.duplicates += other.duplicates;
        self.held += other.held;
        self.released += other.released;
        self.refused.extend(other.refused);
    }
}

/// Held-set rows a cascade has used up, removed or updated together (see
/// [`Writer::release_waiters`]).
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

/// A write transaction on a store. Everything written through it commits together when
/// the closure given to [`crate::Store::write`] returns `Ok`; dropping it rolls back.
pub struct Writer<'a> {
    pub(crate) tx: Transaction<'a>,
    pub(crate) ctx: &'a mut Ctx,
    pub(crate) clock: Arc<dyn Clock>,
    max_held: u64,
    /// Whether the queue declarations were checked for this transaction.
    pub(crate) queues_checked: bool,
    /// Completions and failures to add to the per-minute rates at commit:
    /// (queue id, minute, completed, failed).
    pub(crate) rates: Vec<(i64, i64, i64, i64)>,
    /// The held count as of this transaction, read lazily from the counter table.
    held: Option<i64>,
    /// The held count when first read, to write back only a change.
    held_at_start: i64,
    /// During [`Writer::insert_batch`], the facts of the batch that are held (and not
    /// released since), with their `held` row ids: a fact naming one of them as a
    /// predecessor is held without looking that predecessor up, and waits for it in
    /// `held_child` by row id. `None` outside a batch.
    batch_held: Option<HashMap<FactHash, i64, dag::BuildFactHasher>>,
}

impl<'a> Writer<'a> {
    pub(crate) fn new(tx: Transaction<'a>, ctx: &'a mut Ctx, options: &StoreOptions) -> Writer<'a> {
        Writer {
            tx,
            ctx,
            clock: options.clock.clone(),
            max_held: options.max_held,
            queues_checked: false,
            rates: Vec::new(),
            held: None,
            held_at_start: 0,
            batch_held: None,
        }
    }

    pub(crate) fn commit(mut self) -> Result<()> {
        self.flush_rates()?;
        if let Some(held) = self.held
            && held != self.held_at_start
        {
            self.tx
                .prepare_cached("UPDATE counter SET value = ?1 WHERE name = 'held'")?
                .execute([held])?;
        }
        self.tx.commit()?;
        Ok(())
    }

    /// The underlying SQLite transaction, for an application's own tables written in the
    /// same commit as its facts. Do not write precedent's tables through it.
    pub fn connection(&self) -> &rusqlite::Connection {
        &self.tx
    }

    /// The in-memory state a savepoint may change: the held count and the number of rate
    /// counts gathered, to restore if the savepoint is rolled back.
    pub(crate) fn held_snapshot(&self) -> (Option<i64>, usize) {
        (self.held, self.rates.len())
    }

    /// Forgets in-memory state that a rolled-back savepoint may have made wrong: the held
    /// count goes back to `held`, names numbered since are forgotten (they will be looked
    /// up again), and queue declarations are re-read.
    pub(crate) fn restore_after_rollback(&mut self, (held, rates): (Option<i64>, usize)) {
        self.held = held;
        self.rates.truncate(rates);
        self.ctx.names.rollback();
        self.queues_checked = false;
    }

    fn held_count(&mut self) -> Result<i64> {
        if let Some(n) = self.held {
            return Ok(n);
        }
        let n: i64 = self
            .tx
            .prepare_cached("SELECT value FROM counter WHERE name = 'held'")?
            .query_row([], |r| r.get(0))?;
        self.held = Some(n);
        self.held_at_start = n;
        Ok(n)
    }

    /// Inserts one fact (see [`crate::Store::insert`]).
    ///
    /// # Errors
    /// [`Error::HeldLimit`] if the fact would be held past the bound; [`Error::Sqlite`].
    pub fn insert(&mut self, fact: &Fact) -> Result<InsertOutcome> {
        if let Some(seq) = self.released_seq(&fact.hash())? {
            return Ok(InsertOutcome::Duplicate { seq: Some(seq) });
        }
        self.insert_unreleased(fact)
    }

    /// Inserts a fact that may be stored already: held (the held row says so) or
    /// released (the fact table's unique hash says so, when the fact is inserted); either
    /// way it is a duplicate and nothing changes.
    fn insert_unreleased(&mut self, fact: &Fact) -> Result<InsertOutcome> {
        let mut preds = Vec::with_capacity(4);
        let mut missing = Vec::new();
        for (role, set) in fact.predecessors() {
            for hash in set {
                if let Some(&id) = self.batch_held.as_ref().and_then(|b| b.get(hash)) {
                    missing.push((*hash, Some(id)));
                    continue;
                }
                match self.released(hash)? {
                    Some((seq, type_id)) => preds.push((role.as_str(), seq, type_id)),
                    None => missing.push((*hash, None)),
                }
            }
        }
        if !missing.is_empty() {
            missing.sort_unstable();
            missing.dedup_by_key(|(m, _)| *m);
            return self.hold(fact, missing);
        }
        let Some((seq, type_id)) = self.insert_released(fact, &preds)? else {
            // Stored already: a fact whose ancestors are all released may be released
            // itself, which the fact table's unique hash tells at no extra cost.
            return Ok(InsertOutcome::Duplicate {
                seq: self.released_seq(&fact.hash())?,
            });
        };
        let released = 1 + self.release_waiters(fact.hash(), seq, type_id)?;
        Ok(InsertOutcome::Inserted { seq, released })
    }

    /// Inserts facts given in any order, in this one transaction: duplicates collapse,
    /// facts are put in parent-before-child order, and every fact whose ancestry is
    /// complete is released.
    ///
    /// # Errors
    /// [`Error::Sqlite`]; a fact refused by the held bound is listed in
    /// [`BatchReport::refused`] instead of failing the batch.
    pub fn insert_batch(&mut self, facts: Vec<Fact>) -> Result<BatchReport> {
        let mut report = BatchReport::default();
        // A batch that starts with stored facts is probably a re-delivery: its released
        // facts are dropped first, a lookup each, so it costs no ordering and no
        // predecessor lookups. Otherwise facts go straight to insertion, where the unique
        // hash of the fact table tells a duplicate apart without a lookup of its own.
        let fresh = if self.starts_with_released(&facts)? {
            let mut fresh = Vec::with_capacity(facts.len());
            for fact in facts {
                if self.released_seq(&fact.hash())?.is_some() {
                    report.duplicates += 1;
                } else {
                    fresh.push(fact);
                }
            }
            fresh
        } else {
            facts
        };
        let given = fresh.len() as u64;
        let ordered = if dag::is_release_ordered(&fresh) {
            fresh
        } else {
            dag::release_order(fresh)
        };
        report.duplicates += given - ordered.len() as u64;
        self.batch_held = Some(HashMap::with_hasher(dag::BuildFactHasher));
        let outcome = self.insert_ordered(&ordered, &mut report);
        self.batch_held = None;
        outcome?;
        Ok(report)
    }

    /// How many leading facts of a batch [`Writer::insert_batch`] looks up to tell a
    /// re-delivered batch from a new one.
    const PROBE: usize = 8;

    /// Whether any of the first [`Writer::PROBE`] facts of `facts` is released.
    fn starts_with_released(&self, facts: &[Fact]) -> Result<bool> {
        for fact in facts.iter().take(Self::PROBE) {
            if self.released_seq(&fact.hash())?.is_some() {
                return Ok(true);
            }
        }
        Ok(false)
    }

    /// Inserts a parents-first batch, adding the outcomes to `report`.
    fn insert_ordered(&mut self, ordered: &[Fact], report: &mut BatchReport) -> Result<()> {
        for fact in ordered {
            match self.insert_unreleased(fact) {
                Ok(InsertOutcome::Inserted { released, .. }) => {
                    report.inserted += 1;
                    report.released += released;
                }
                Ok(InsertOutcome::Duplicate { .. }) => report.duplicates += 1,
                // The batch is parents-first, so nothing later in it can release this
                // fact: its missing ancestors are outside the batch.
                Ok(InsertOutcome::Held { .. }) => report.held += 1,
                Err(Error::HeldLimit { hash, .. }) => report.refused.push(hash),
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// The release sequence and type id of `hash`, if it is released: what an edge from a
    /// new fact to it records.
    fn released(&self, hash: &FactHash) -> Result<Option<(i64, i64)>> {
        Ok(self
            .tx
            .prepare_cached("SELECT seq, type_id FROM fact WHERE hash = ?1")?
            .query_row([&hash.0[..]], |r| Ok((r.get(0)?, r.get(1)?)))
            .optional()?)
    }

    /// The release sequence of `hash`, if it is released.
    pub fn released_seq(&self, hash: &FactHash) -> Result<Option<i64>> {
        Ok(self
            .tx
            .prepare_cached("SELECT seq FROM fact WHERE hash = ?1")?
            .query_row([&hash.0[..]], |r| r.get(0))
            .optional()?)
    }

    fn is_held(&self, hash: &FactHash) -> Result<bool> {
        Ok(self
            .tx
            .prepare_cached(
                "SELECT 1 FROM held WHERE substr(hash, 1, 8) = substr(?1, 1, 8) AND hash = ?1",
            )?
            .exists([&hash.0[..]])?)
    }

    /// Holds `fact`, waiting for the predecessors in `missing` (each with its `held` row
    /// id when it is known to be held: those waits go to `held_child`, keyed by that id,
    /// and the others to `held_wait`, keyed by hash).
    fn hold(
        &mut self,
        fact: &Fact,
        missing: Vec<(FactHash, Option<i64>)>,
    ) -> Result<InsertOutcome> {
        let hash = fact.hash();
        // Held hashes are unique by this check: the index on their first 8 bytes is not.
        if self.is_held(&hash)? {
            return Ok(InsertOutcome::Duplicate { seq: None });
        }
        let held = self.held_count()?;
        if held as u64 >= self.max_held {
            return Err(Error::HeldLimit {
                limit: self.max_held,
                hash,
            });
        }
        self.tx
            .prepare_cached(
                "INSERT INTO held (hash, bytes, missing, held_at) VALUES (?1, ?2, ?3, ?4)",
            )?
            .execute(params![
                &hash.0[..],
                fact.canonical_bytes(),
                missing.len() as i64,
                self.clock.now_ms()
            ])?;
        let id = self.tx.last_insert_rowid();
        if let Some(batch) = &mut self.batch_held {
            batch.insert(hash, id);
        }
        for (m, parent) in &missing {
            match parent {
                Some(parent) => self
                    .tx
                    .prepare_cached("INSERT INTO held_child (parent, waiter) VALUES (?1, ?2)")?
                    .execute([parent, &id])?,
                None => self
                    .tx
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
        preds: &[(&str, i64, i64)],
    ) -> Result<Option<(i64, i64)>> {
        let type_id = self.ctx.names.id(&self.tx, Kind::Type, fact.type_name())?;
        let added = self
            .tx
            .prepare_cached(
                "INSERT INTO fact (hash, type_id, bytes) VALUES (?1, ?2, ?3)
                 ON CONFLICT (hash) DO NOTHING",
            )?
            .execute(params![&fact.hash().0[..], type_id, fact.canonical_bytes()])?;
        if added == 0 {
            return Ok(None);
        }
        let seq = self.tx.last_insert_rowid();
        for (role, pred, pred_type) in preds {
            let role_id = self.ctx.names.id(&self.tx, Kind::Role, role)?;
            self.tx
                .prepare_cached(
                    "INSERT INTO edge (predecessor, role_id, successor_type, successor, predecessor_type)
                     VALUES (?1, ?2, ?3, ?4, ?5)",
                )?
                .execute(params![pred, role_id, type_id, seq, pred_type])?;
        }
        self.queue_on_release(fact, seq, None)?;
        Ok(Some((seq, type_id)))
    }

    /// Releases every held fact that was waiting only for `first` or for facts this call
    /// releases, depth first; returns how many it released.
    ///
    /// The rows the cascade uses up (the waits of each released fact, the held rows
    /// released, the counts of waiters still missing something) are removed or updated in
    /// key order every [`Cleanup::BATCH`] entries and at the end, not one at a time: a
    /// cascade reads each of them once, and writes in key order touch each page once.
    fn release_waiters(&mut self, first: FactHash, first_seq: i64, first_type: i64) -> Result<u64> {
        if self.held_count()? == 0 {
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
                    .tx
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
                let at = self.release_held(&hash, &bytes, (arrived, arrived_at))?;
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
            .tx
            .prepare_cached("SELECT waiter FROM held_wait WHERE missing = ?1")?
            .query_map([&arrived.0[..]], |r| r.get(0))?
            .collect::<rusqlite::Result<Vec<i64>>>()?)
    }

    /// The held rows (ids) recorded as waiting for the held row `parent`.
    fn children(&mut self, parent: i64) -> Result<Vec<i64>> {
        Ok(self
            .tx
            .prepare_cached("SELECT waiter FROM held_child WHERE parent = ?1")?
            .query_map([parent], |r| r.get(0))?
            .collect::<rusqlite::Result<Vec<i64>>>()?)
    }

    /// Writes what a cascade deferred, in key order, and empties `cleanup`.
    fn apply_cleanup(&mut self, cleanup: &mut Cleanup) -> Result<()> {
        cleanup.waits.sort_unstable();
        let mut delete = self
            .tx
            .prepare_cached("DELETE FROM held_wait WHERE missing = ?1")?;
        for arrived in cleanup.waits.drain(..) {
            delete.execute([&arrived.0[..]])?;
        }
        drop(delete);
        cleanup.children.sort_unstable();
        let mut delete = self
            .tx
            .prepare_cached("DELETE FROM held_child WHERE parent = ?1")?;
        for parent in cleanup.children.drain(..) {
            delete.execute([parent])?;
        }
        drop(delete);
        cleanup.rows.sort_unstable();
        let mut delete = self.tx.prepare_cached("DELETE FROM held WHERE id = ?1")?;
        for id in cleanup.rows.drain(..) {
            delete.execute([id])?;
        }
        drop(delete);
        let mut arrivals: Vec<(i64, i64)> = cleanup.arrivals.drain().collect();
        arrivals.sort_unstable();
        let mut update = self
            .tx
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
    ) -> Result<(i64, i64)> {
        let fact =
            crate::encoding::decode_fact(bytes, Some(*hash)).map_err(|e| Error::Corrupt {
                hash: *hash,
                reason: format!("held bytes do not decode: {e}"),
            })?;
        let mut preds = Vec::new();
        for (role, set) in fact.predecessors() {
            for p in set {
                let (seq, type_id) = if *p == arrived.0 {
                    arrived.1
                } else {
                    self.released(p)?.ok_or_else(|| Error::Corrupt {
                        hash: *hash,
                        reason: format!("released while predecessor {p} is absent"),
                    })?
                };
                preds.push((role.as_str(), seq, type_id));
            }
        }
        self.held = Some(self.held_count()? - 1);
        if let Some(batch) = &mut self.batch_held {
            batch.remove(hash);
        }
        match self.insert_released(&fact, &preds)? {
            Some(at) => Ok(at),
            // A held row for a fact that is released already is stale: it is gone now,
            // and the fact's waiters follow it as they would have.
            None => self.released(hash)?.ok_or_else(|| Error::Corrupt {
                hash: *hash,
                reason: "neither inserted nor found released".into(),
            }),
        }
    }

    /// Resolves a hash prefix against released and held facts.
    ///
    /// # Errors
    /// [`Error::UnknownPrefix`] or [`Error::AmbiguousPrefix`].
    pub fn resolve_prefix(&self, prefix: &HashPrefix) -> Result<FactHash> {
        super::read::resolve_prefix(&self.tx, prefix)
    }
}
