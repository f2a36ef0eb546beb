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

    /// Inserts a fact known not to be released (it may be held already).
    fn insert_unreleased(&mut self, fact: &Fact) -> Result<InsertOutcome> {
        let mut preds = Vec::with_capacity(4);
        let mut missing = Vec::new();
        for (role, set) in fact.predecessors() {
            for hash in set {
                match self.released_seq(hash)? {
                    Some(seq) => preds.push((role.as_str(), seq)),
                    None => missing.push(*hash),
                }
            }
        }
        if !missing.is_empty() {
            missing.sort_unstable();
            missing.dedup();
            return self.hold(fact, missing);
        }
        let seq = self.insert_released(fact, &preds)?;
        let released = 1 + self.release_waiters(fact.hash(), seq)?;
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
        // Facts already released are dropped first, so a re-delivered batch costs one
        // lookup per fact and no ordering work.
        let mut fresh = Vec::with_capacity(facts.len());
        for fact in facts {
            if self.released_seq(&fact.hash())?.is_some() {
                report.duplicates += 1;
            } else {
                fresh.push(fact);
            }
        }
        let given = fresh.len() as u64;
        let ordered = if dag::is_release_ordered(&fresh) {
            fresh
        } else {
            dag::release_order(fresh)
        };
        report.duplicates += given - ordered.len() as u64;
        // A fact checked above can only have been released since by a cascade, and a
        // cascade needs held facts: while there are none, the check need not be repeated.
        let mut may_cascade = self.held_count()? > 0;
        for fact in &ordered {
            let outcome = if may_cascade {
                self.insert(fact)
            } else {
                self.insert_unreleased(fact)
            };
            match outcome {
                Ok(InsertOutcome::Inserted { released, .. }) => {
                    report.inserted += 1;
                    report.released += released;
                }
                Ok(InsertOutcome::Duplicate { .. }) => report.duplicates += 1,
                // The batch is parents-first, so nothing later in it can release this
                // fact: its missing ancestors are outside the batch.
                Ok(InsertOutcome::Held { .. }) => {
                    report.held += 1;
                    may_cascade = true;
                }
                Err(Error::HeldLimit { hash, .. }) => report.refused.push(hash),
                Err(e) => return Err(e),
            }
        }
        Ok(report)
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
            .prepare_cached("SELECT 1 FROM held WHERE hash = ?1")?
            .exists([&hash.0[..]])?)
    }

    fn hold(&mut self, fact: &Fact, missing: Vec<FactHash>) -> Result<InsertOutcome> {
        let hash = fact.hash();
        let held = self.held_count()?;
        if held as u64 >= self.max_held {
            if self.is_held(&hash)? {
                return Ok(InsertOutcome::Duplicate { seq: None });
            }
            return Err(Error::HeldLimit {
                limit: self.max_held,
                hash,
            });
        }
        let added = self
            .tx
            .prepare_cached(
                "INSERT INTO held (hash, bytes, missing, held_at) VALUES (?1, ?2, ?3, ?4)
                 ON CONFLICT (hash) DO NOTHING",
            )?
            .execute(params![
                &hash.0[..],
                fact.canonical_bytes(),
                missing.len() as i64,
                self.clock.now_ms()
            ])?;
        if added == 0 {
            return Ok(InsertOutcome::Duplicate { seq: None });
        }
        let id = self.tx.last_insert_rowid();
        let mut wait = self
            .tx
            .prepare_cached("INSERT INTO held_wait (missing, waiter) VALUES (?1, ?2)")?;
        for m in &missing {
            wait.execute(params![&m.0[..], id])?;
        }
        drop(wait);
        self.held = Some(held + 1);
        Ok(InsertOutcome::Held { missing })
    }

    /// Writes a fact whose predecessors are all released; returns its sequence number.
    fn insert_released(&mut self, fact: &Fact, preds: &[(&str, i64)]) -> Result<i64> {
        let type_id = self.ctx.names.id(&self.tx, Kind::Type, fact.type_name())?;
        self.tx
            .prepare_cached("INSERT INTO fact (hash, type_id, bytes) VALUES (?1, ?2, ?3)")?
            .execute(params![&fact.hash().0[..], type_id, fact.canonical_bytes()])?;
        let seq = self.tx.last_insert_rowid();
        for (role, pred) in preds {
            let role_id = self.ctx.names.id(&self.tx, Kind::Role, role)?;
            // The edge carries both facts' types; the predecessor's is read from its row.
            // (One `INSERT ... SELECT ... FROM fact` instead cost 10 to 20% more CPU per
            // in-order insert in `benches/ingest.rs`.)
            let pred_type: i64 = self
                .tx
                .prepare_cached("SELECT type_id FROM fact WHERE seq = ?1")?
                .query_row([pred], |r| r.get(0))
                .optional()?
                .ok_or_else(|| Error::Corrupt {
                    hash: fact.hash(),
                    reason: format!("predecessor seq {pred} has no fact row"),
                })?;
            self.tx
                .prepare_cached(
                    "INSERT INTO edge (predecessor, role_id, successor_type, successor, predecessor_type)
                     VALUES (?1, ?2, ?3, ?4, ?5)",
                )?
                .execute(params![pred, role_id, type_id, seq, pred_type])?;
        }
        self.queue_on_release(fact, seq, None)?;
        Ok(seq)
    }

    /// Releases every held fact that was waiting only for `first` or for facts this call
    /// releases, depth first; returns how many it released.
    fn release_waiters(&mut self, first: FactHash, first_seq: i64) -> Result<u64> {
        if self.held_count()? == 0 {
            return Ok(0);
        }
        let mut released = 0;
        let mut stack = vec![(first, first_seq)];
        while let Some((arrived, arrived_seq)) = stack.pop() {
            for waiter in self.take_waiters(&arrived)? {
                let (hash, missing, bytes): (Vec<u8>, i64, Vec<u8>) = self
                    .tx
                    .prepare_cached("SELECT hash, missing, bytes FROM held WHERE id = ?1")?
                    .query_row([waiter], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
                    .optional()?
                    .ok_or_else(|| Error::Corrupt {
                        hash: arrived,
                        reason: format!("held_wait names held row {waiter}, which is absent"),
                    })?;
                if missing > 1 {
                    self.tx
                        .prepare_cached("UPDATE held SET missing = missing - 1 WHERE id = ?1")?
                        .execute([waiter])?;
                } else {
                    let hash = FactHash::from_slice(&hash).ok_or_else(|| Error::Corrupt {
                        hash: arrived,
                        reason: format!("held row {waiter} has a hash that is not 32 bytes"),
                    })?;
                    let seq = self.release_held(waiter, &hash, &bytes, (arrived, arrived_seq))?;
                    released += 1;
                    stack.push((hash, seq));
                }
            }
        }
        Ok(released)
    }

    /// Removes and returns the held rows (ids) recorded as waiting for `arrived`.
    fn take_waiters(&mut self, arrived: &FactHash) -> Result<Vec<i64>> {
        let waiters = self
            .tx
            .prepare_cached("SELECT waiter FROM held_wait WHERE missing = ?1")?
            .query_map([&arrived.0[..]], |r| r.get(0))?
            .collect::<rusqlite::Result<Vec<i64>>>()?;
        if !waiters.is_empty() {
            self.tx
                .prepare_cached("DELETE FROM held_wait WHERE missing = ?1")?
                .execute([&arrived.0[..]])?;
        }
        Ok(waiters)
    }

    /// Moves a held fact whose ancestors are now all released into the fact table.
    /// `arrived` is the fact whose release completed this one's ancestry, with its
    /// sequence number, so that predecessor is not looked up again.
    fn release_held(
        &mut self,
        id: i64,
        hash: &FactHash,
        bytes: &[u8],
        arrived: (FactHash, i64),
    ) -> Result<i64> {
        self.tx
            .prepare_cached("DELETE FROM held WHERE id = ?1")?
            .execute([id])?;
        let fact =
            crate::encoding::decode_fact(bytes, Some(*hash)).map_err(|e| Error::Corrupt {
                hash: *hash,
                reason: format!("held bytes do not decode: {e}"),
            })?;
        let mut preds = Vec::new();
        for (role, set) in fact.predecessors() {
            for p in set {
                let seq = if *p == arrived.0 {
                    arrived.1
                } else {
                    self.released_seq(p)?.ok_or_else(|| Error::Corrupt {
                        hash: *hash,
                        reason: format!("released while predecessor {p} is absent"),
                    })?
                };
                preds.push((role.as_str(), seq));
            }
        }
        let seq = self.insert_released(&fact, &preds)?;
        self.held = Some(self.held_count()? - 1);
        Ok(seq)
    }

    /// Resolves a hash prefix against released and held facts.
    ///
    /// # Errors
    /// [`Error::UnknownPrefix`] or [`Error::AmbiguousPrefix`].
    pub fn resolve_prefix(&self, prefix: &HashPrefix) -> Result<FactHash> {
        super::read::resolve_prefix(&self.tx, prefix)
    }
}
