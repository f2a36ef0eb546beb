//! A batch of inserts on PostgreSQL in a few round trips: the SQLite backend's steps
//! (`insert_batch`), with what they read looked up for the whole batch at once and the
//! facts they release written in runs.
//!
//! Under the write lock nothing else changes the fact table or the held set, so one
//! statement at the start reads which of the batch's facts and predecessors are released
//! (the others are not, unless this batch releases them, which it records as it goes),
//! and, when something is held, one more reads which of its facts are waited for. The
//! batch is then walked in parents-first order as the one-fact path walks it, giving
//! sequence numbers in Rust: each fact whose predecessors are all released joins a
//! pending run, written with its edges by one statement ([`Run::flush`]) before anything
//! else touches the database (a hold, a cascade) and at the end. Hooks that were all
//! [`crate::store::ReleaseHook::idle`] as the batch began are not called for its facts
//! (idle says they would do nothing); hooks that may be called after a run
//! ([`crate::store::ReleaseHook::in_runs`], the queue index) are called for each fact of
//! a run once the run is written, in release order; any other hook gets each fact
//! written and hooked before the next, as the one-fact path does.

use std::collections::{HashMap, HashSet};

use super::conn::EdgeColumns;
use super::read::hash_at;
use super::write::{Mark, PgWrite};
use crate::dag::{self, BuildFactHasher};
use crate::error::{Error, Result};
use crate::fact::Fact;
use crate::hash::FactHash;
use crate::store::backend::HookRunner;
use crate::store::steps::{Pred, batch_order, settle_held, split_predecessors, tally};
use crate::store::{BatchReport, InsertOutcome};

/// The look-up of facts by hash: seq and type id of those stored.
pub(super) const LOOK_UP: &str =
    "SELECT hash, seq, type_id FROM fact WHERE hash = ANY($1::bytea[])";

/// Facts written by one statement at most: bounds its arrays.
pub(super) const RUN: usize = 8_192;

/// Batches of at least this many facts are guessed new ([`PgWrite::insert_many`]): below
/// it, the savepoint's round trip costs about what the look-up of their own hashes does.
pub(super) const GUESS_FROM: usize = 256;

/// Released facts of a batch not yet written, in release order, with their edges.
#[derive(Default)]
pub(crate) struct Run {
    facts: Vec<Fact>,
    seq: Vec<i64>,
    type_id: Vec<i64>,
    /// Each fact's edges are `edges[ends[i - 1]..ends[i]]`.
    ends: Vec<usize>,
    /// Edges: predecessor seq, role id, predecessor type, predecessor hash (for hooks).
    pred: Vec<i64>,
    role: Vec<i64>,
    pred_type: Vec<i64>,
    pred_hash: Vec<FactHash>,
}

impl Run {
    pub(super) fn len(&self) -> usize {
        self.facts.len()
    }

    /// Adds a released fact with its edges (predecessors: role id, hash, seq, type id).
    pub(super) fn push(
        &mut self,
        fact: Fact,
        seq: i64,
        type_id: i64,
        preds: &[(i64, FactHash, i64, i64)],
    ) {
        for &(role, hash, pred_seq, pred_type) in preds {
            self.role.push(role);
            self.pred_hash.push(hash);
            self.pred.push(pred_seq);
            self.pred_type.push(pred_type);
        }
        self.ends.push(self.pred.len());
        self.facts.push(fact);
        self.seq.push(seq);
        self.type_id.push(type_id);
    }

    /// The statement of [`Run::write_rows`].
    pub(super) const WRITE_ROWS: &'static str = "WITH f AS (
             INSERT INTO fact (seq, hash, type_id, bytes, p1, p1_role, p1_type)
             SELECT * FROM unnest($1::bigint[], $2::bytea[], $3::bigint[], $4::bytea[],
                                  $11::bigint[], $12::bigint[], $13::bigint[])
             ON CONFLICT (hash) DO NOTHING RETURNING 1),
         e AS (
             INSERT INTO edge_more (predecessor, role_id, successor_type, successor, predecessor_type, successor_hash)
             SELECT * FROM unnest($5::bigint[], $6::bigint[], $7::bigint[], $8::bigint[], $9::bigint[], $10::bytea[]))
         SELECT count(*) FROM f";

    /// Writes the run's facts and edges in one statement ([`Run::WRITE_ROWS`], run by
    /// `query` with its parameters, after it made the partitions of the `edge_more` rows
    /// it is given); returns how many facts were new.
    pub(super) fn write_rows(
        &self,
        query: impl FnOnce(&EdgeColumns, super::conn::Params<'_>) -> Result<i64>,
    ) -> Result<i64> {
        self.with_columns(|c| {
            query(
                &c.more,
                &[
                    c.seq,
                    &c.hash,
                    c.type_id,
                    &c.bytes,
                    &c.more.pred,
                    &c.more.role,
                    &c.more.succ_type,
                    &c.more.succ,
                    &c.more.pred_type,
                    &c.more_hash(),
                    &c.p1,
                    &c.p1_role,
                    &c.p1_type,
                ],
            )
        })
    }

    /// Calls `f` with the run's rows as columns: the fact rows (each with its first edge),
    /// then the other edges (schema version 7).
    pub(super) fn with_columns<T>(&self, f: impl FnOnce(&Columns<'_>) -> Result<T>) -> Result<T> {
        let hashes: Vec<FactHash> = self.facts.iter().map(|f| f.hash()).collect();
        let hash: Vec<&[u8]> = hashes.iter().map(|h| &h.0[..]).collect();
        let bytes: Vec<&[u8]> = self.facts.iter().map(|f| f.canonical_bytes()).collect();
        let n = self.facts.len();
        let (mut p1, mut p1_role, mut p1_type) = (
            Vec::with_capacity(n),
            Vec::with_capacity(n),
            Vec::with_capacity(n),
        );
        let mut more = EdgeColumns::default();
        let mut start = 0;
        for (i, &end) in self.ends.iter().enumerate() {
            let first = (start < end).then_some(start);
            p1.push(first.map(|k| self.pred[k]));
            p1_role.push(first.map(|k| self.role[k]));
            p1_type.push(first.map(|k| self.pred_type[k]));
            for k in (start + 1).min(end)..end {
                more.push(
                    (self.pred[k], self.role[k], self.pred_type[k]),
                    (self.seq[i], self.type_id[i], hashes[i]),
                );
            }
            start = end;
        }
        f(&Columns {
            seq: &self.seq,
            hash,
            type_id: &self.type_id,
            bytes,
            p1,
            p1_role,
            p1_type,
            more,
        })
    }

    pub(super) fn clear(&mut self) {
        self.facts.clear();
        self.seq.clear();
        self.type_id.clear();
        self.ends.clear();
        self.pred.clear();
        self.role.clear();
        self.pred_type.clear();
        self.pred_hash.clear();
    }
}

/// A run's rows as columns ([`Run::with_columns`]): `fact (seq, hash, type_id, bytes,
/// p1, p1_role, p1_type)`, a fact's first edge in its own row, and its other edges as
/// `edge_more` rows.
pub(super) struct Columns<'r> {
    pub(super) seq: &'r Vec<i64>,
    pub(super) hash: Vec<&'r [u8]>,
    pub(super) type_id: &'r Vec<i64>,
    pub(super) bytes: Vec<&'r [u8]>,
    pub(super) p1: Vec<Option<i64>>,
    pub(super) p1_role: Vec<Option<i64>>,
    pub(super) p1_type: Vec<Option<i64>>,
    pub(super) more: EdgeColumns,
}

impl Columns<'_> {
    /// The other edges' successor hashes, as the statement binds them.
    pub(super) fn more_hash(&self) -> Vec<&[u8]> {
        self.more.succ_hash.iter().map(|h| &h.0[..]).collect()
    }
}

/// The batch's view of the released facts: those released before it, as read at its
/// start (`before`), and those it released (`PgWrite::batch_released`).
pub(super) type Known = HashMap<FactHash, (i64, i64), BuildFactHasher>;

/// What a batch read at its start and what it has not written yet.
pub(super) struct Batch {
    /// Its facts and their predecessors that were released when it began.
    pub(super) before: Known,
    /// Its facts that held facts waited for by hash when it began.
    waited: HashSet<FactHash, BuildFactHasher>,
    /// Its facts that were held when it began.
    held_before: HashSet<FactHash, BuildFactHasher>,
    /// How the batch's released facts meet the hooks.
    pub(super) hooking: Hooking,
    /// Released facts not written yet.
    pub(super) run: Run,
    /// Held facts not written yet.
    held: HeldRun,
    /// `held` row ids drawn from its sequence and not used yet, last first.
    ids: Vec<i64>,
    /// Facts of the batch not inserted yet (how many ids a hold may still need).
    left: usize,
}

/// Held facts of a batch not yet written, with their waits.
#[derive(Default)]
struct HeldRun {
    id: Vec<i64>,
    hash: Vec<FactHash>,
    bytes: Vec<Fact>,
    missing: Vec<i64>,
    held_at: Vec<i64>,
    /// `held_wait` rows: missing hash, waiter.
    wait: (Vec<FactHash>, Vec<i64>),
    /// `held_child` rows: parent, waiter.
    child: (Vec<i64>, Vec<i64>),
}

/// How a batch calls the release hooks, decided as it begins.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Hooking {
    /// Every hook is idle: none is called, and facts are written in runs.
    Idle,
    /// Facts are written in runs, and the hooks called for each fact of a run after it
    /// is written, in release order ([`crate::store::ReleaseHook::in_runs`]).
    InRuns,
    /// Each fact is written and hooked before the next.
    Each,
}

impl Hooking {
    /// How a batch beginning now calls `hooks`.
    pub(super) fn of(hooks: &mut HookRunner<'_>, tx: &PgWrite<'_>) -> Result<Hooking> {
        Ok(if hooks.idle(tx)? {
            Hooking::Idle
        } else if hooks.in_runs() {
            Hooking::InRuns
        } else {
            Hooking::Each
        })
    }

    /// Whether the hooks are called.
    pub(super) fn hooked(self) -> bool {
        self != Hooking::Idle
    }

    /// Whether each fact is written and hooked before the next.
    pub(super) fn each(self) -> bool {
        self == Hooking::Each
    }
}

fn slices(hashes: &[FactHash]) -> Vec<&[u8]> {
    hashes.iter().map(|h| &h.0[..]).collect()
}

impl PgWrite<'_> {
    /// See [`crate::Writer::insert_batch`]: the SQLite backend's steps, in a few round
    /// trips per batch.
    ///
    /// A batch of at least [`GUESS_FROM`] facts, with no hook that must see each fact
    /// before the next is written and nothing written ahead, is first written on the
    /// guess that those of its facts that [`super::recent`] does not know of are new: its
    /// look-up then asks only for predecessors from outside the batch. The guess is
    /// checked by the unique hash of the fact table as the rows are written, under a
    /// savepoint of its own; if a fact was stored already, the savepoint is rolled back
    /// (with the counters, names and releases it saw, and what the hooks kept) and the
    /// batch is written again, its own hashes looked up.
    pub(super) fn insert_many(
        &mut self,
        facts: Vec<Fact>,
        hooks: &mut HookRunner<'_>,
    ) -> Result<BatchReport> {
        let hooking = Hooking::of(hooks, self)?;
        self.insert_many_idle(facts, hooks, hooking)
    }

    /// [`PgWrite::insert_many`], the hooks found as `hooking` says.
    pub(super) fn insert_many_idle(
        &mut self,
        facts: Vec<Fact>,
        hooks: &mut HookRunner<'_>,
        hooking: Hooking,
    ) -> Result<BatchReport> {
        let recent = &self.tx.backend.shared.recent;
        if facts.len() >= GUESS_FROM
            && !hooking.each()
            && !self.tx.ahead.borrow().on
            && recent.may_guess()
        {
            let mark = self.open_guess()?;
            hooks.savepoint_opened();
            self.guessing = true;
            let guessed = self.insert_many_as(facts.clone(), hooks, hooking, true);
            self.guessing = false;
            let failed = std::mem::take(&mut self.guess_failed);
            if failed {
                recent.guess_failed();
                self.back_to_guess(mark)?;
            }
            hooks.savepoint_closed(failed);
            if !failed {
                return guessed;
            }
        }
        self.insert_many_as(facts, hooks, hooking, false)
    }

    /// Opens the savepoint of a batch guessed new, releasing the last one; returns what
    /// rolling back to it restores.
    pub(super) fn open_guess(&mut self) -> Result<Mark> {
        if self.guess_open {
            self.tx
                .simple("RELEASE SAVEPOINT precedent_guess; SAVEPOINT precedent_guess")?;
        } else {
            self.tx.simple("SAVEPOINT precedent_guess")?;
        }
        self.guess_open = true;
        Ok(self.mark())
    }

    /// Rolls back to the savepoint of a batch whose guess failed.
    pub(super) fn back_to_guess(&mut self, mark: Mark) -> Result<()> {
        self.tx
            .simple("ROLLBACK TO SAVEPOINT precedent_guess; RELEASE SAVEPOINT precedent_guess")?;
        self.guess_open = false;
        self.back_to(mark);
        // Names made in the savepoint are gone with it.
        self.names.forget();
        Ok(())
    }

    /// [`PgWrite::insert_many`], with its facts guessed new or looked up.
    pub(super) fn insert_many_as(
        &mut self,
        facts: Vec<Fact>,
        hooks: &mut HookRunner<'_>,
        hooking: Hooking,
        guess: bool,
    ) -> Result<BatchReport> {
        let before = self.released_among(&facts, guess)?;
        let mut report = BatchReport::default();
        let ordered = batch_order(facts, &mut report, &mut |h| Ok(before.contains_key(h)))?;
        let (waited, held_before) = self.held_among(&ordered)?;
        let mut b = Batch {
            before,
            waited,
            held_before,
            hooking,
            run: Run::default(),
            held: HeldRun::default(),
            ids: Vec::new(),
            left: ordered.len(),
        };
        self.batch_held = Some(HashMap::with_hasher(dag::BuildFactHasher));
        self.batch_released = Some(HashMap::with_hasher(dag::BuildFactHasher));
        let mut outcome = Ok(());
        for fact in &ordered {
            let mut one = self.insert_in_batch(fact, &mut b, hooks);
            b.left -= 1;
            if one.is_ok() && (b.hooking.each() || b.run.len() >= RUN) {
                one = self.flush(&mut b.run, b.hooking.hooked(), hooks).and(one);
            }
            outcome = tally(&mut report, one);
            if outcome.is_err() {
                break;
            }
        }
        if outcome.is_ok() {
            outcome = self.write_pending(&mut b, hooks);
        }
        let still_held = self.batch_held.take();
        self.batch_released = None;
        if let (Ok(()), Some(still_held)) = (&outcome, &still_held) {
            settle_held(&mut report, still_held);
        }
        outcome.map(|()| report)
    }

    /// Writes what the batch has not written yet.
    pub(super) fn write_pending(
        &mut self,
        b: &mut Batch,
        hooks: &mut HookRunner<'_>,
    ) -> Result<()> {
        self.flush(&mut b.run, b.hooking.hooked(), hooks)?;
        self.flush_held(&mut b.held)
    }

    /// One fact of a parents-first batch: a duplicate, held, or released into `run` (and
    /// then what waited for it, after `run` is written).
    fn insert_in_batch(
        &mut self,
        fact: &Fact,
        b: &mut Batch,
        hooks: &mut HookRunner<'_>,
    ) -> Result<InsertOutcome> {
        let hash = fact.hash();
        let batch = self.batch_released.as_ref().expect("in a batch");
        let before = &b.before;
        if let Some(&(seq, _)) = batch.get(&hash).or_else(|| before.get(&hash)) {
            return Ok(InsertOutcome::Duplicate { seq: Some(seq) });
        }
        let (preds, missing) =
            split_predecessors(fact, self.batch_held.as_ref(), &self.assumed, &mut |h| {
                Ok(batch.get(h).or_else(|| before.get(h)).copied())
            })?;
        if !missing.is_empty() {
            return self.hold_in_batch(fact, missing, b);
        }
        let edges = self.run_edges(&preds)?;
        let (seq, type_id) = self.join_run(fact.clone(), &edges, b)?;
        // Only a fact waited for when the batch began can release held facts: one held
        // in this batch waits for a fact that comes before it.
        let released = if b.waited.contains(&hash) {
            self.write_pending(b, hooks)?;
            1 + self.cascade_in_batch(hash, (seq, type_id), b, hooks)?
        } else {
            1
        };
        Ok(InsertOutcome::Inserted { seq, released })
    }

    /// The edges of a fact whose predecessors `preds` are all released, as a run holds
    /// them: role id, predecessor hash, seq and type id.
    pub(super) fn run_edges(
        &mut self,
        preds: &[Pred<'_>],
    ) -> Result<Vec<(i64, FactHash, i64, i64)>> {
        let mut edges = Vec::with_capacity(preds.len());
        for (role, pred, pred_seq, pred_type) in preds {
            edges.push((
                self.names.id(&self.tx, true, role)?,
                *pred,
                *pred_seq,
                *pred_type,
            ));
        }
        Ok(edges)
    }

    /// Gives `fact` the next seq and puts it with its `edges` ([`PgWrite::run_edges`]) in
    /// the batch's run; its seq and type id.
    pub(super) fn join_run(
        &mut self,
        fact: Fact,
        edges: &[(i64, FactHash, i64, i64)],
        b: &mut Batch,
    ) -> Result<(i64, i64)> {
        let type_id = self.names.id(&self.tx, false, fact.type_name())?;
        let seq = self.counters().seq + 1;
        self.counters().seq = seq;
        let hash = fact.hash();
        b.run.push(fact, seq, type_id, edges);
        let batch = self.batch_released.as_mut().expect("in a batch");
        batch.insert(hash, (seq, type_id));
        self.released.push((hash, (seq, type_id)));
        Ok((seq, type_id))
    }

    /// [`PgWrite::hold`] for a fact of the batch: its row and waits join the held run,
    /// with a row id drawn ahead.
    fn hold_in_batch(
        &mut self,
        fact: &Fact,
        missing: Vec<crate::store::steps::Missing>,
        b: &mut Batch,
    ) -> Result<InsertOutcome> {
        let hash = fact.hash();
        if b.held_before.contains(&hash) {
            return Ok(InsertOutcome::Duplicate { seq: None });
        }
        let max = self.tx.backend.shared.options.max_held;
        if self.counters().held as u64 >= max {
            return Err(Error::HeldLimit { limit: max, hash });
        }
        if b.ids.is_empty() {
            b.ids = self.draw_held_ids(b.left.clamp(1, RUN))?;
        }
        let id = b.ids.pop().expect("drawn");
        let now = self.tx.backend.shared.options.clock.now_ms();
        let h = &mut b.held;
        h.id.push(id);
        h.hash.push(hash);
        h.bytes.push(fact.clone());
        h.missing.push(missing.len() as i64);
        h.held_at.push(now);
        for (m, parent) in &missing {
            match parent {
                Some(parent) => {
                    h.child.0.push(*parent);
                    h.child.1.push(id);
                }
                None => {
                    h.wait.0.push(*m);
                    h.wait.1.push(id);
                }
            }
        }
        self.batch_held
            .as_mut()
            .expect("in a batch")
            .insert(hash, id);
        self.add_held(1);
        Ok(InsertOutcome::Held {
            missing: missing.into_iter().map(|(m, _)| m).collect(),
        })
    }

    /// `n` new `held` row ids, in the order the table's own would give them; returned
    /// last first.
    fn draw_held_ids(&self, n: usize) -> Result<Vec<i64>> {
        let mut ids: Vec<i64> = self
            .tx
            .rows(
                "SELECT nextval(pg_get_serial_sequence('held', 'id')) FROM generate_series(1, $1::bigint)",
                &[&(n as i64)],
            )?
            .iter()
            .map(|r| r.get(0))
            .collect();
        ids.sort_unstable_by(|a, b| b.cmp(a));
        Ok(ids)
    }

    /// Writes the held run's rows and waits in one statement.
    fn flush_held(&mut self, h: &mut HeldRun) -> Result<()> {
        if h.id.is_empty() {
            return Ok(());
        }
        let bytes: Vec<&[u8]> = h.bytes.iter().map(Fact::canonical_bytes).collect();
        self.tx.exec(
            "WITH h AS (
                 INSERT INTO held (id, hash, bytes, missing, held_at)
                 SELECT * FROM unnest($1::bigint[], $2::bytea[], $3::bytea[], $4::bigint[], $5::bigint[])),
             w AS (
                 INSERT INTO held_wait (missing, waiter)
                 SELECT * FROM unnest($6::bytea[], $7::bigint[]))
             INSERT INTO held_child (parent, waiter) SELECT * FROM unnest($8::bigint[], $9::bigint[])",
            &[
                &h.id,
                &slices(&h.hash),
                &bytes,
                &h.missing,
                &h.held_at,
                &slices(&h.wait.0),
                &h.wait.1,
                &h.child.0,
                &h.child.1,
            ],
        )?;
        *h = HeldRun::default();
        Ok(())
    }

    /// Writes `run`'s facts and edges in one statement, then calls the release hooks for
    /// each, in order (a run of one fact when a hook must see each fact before the next
    /// is written): unless `hooked` is false, when every hook was
    /// [`crate::store::ReleaseHook::idle`] as the batch began, which says a hook does
    /// nothing for any fact the batch releases (a push of 1,000 facts spent about 50 µs
    /// on the calls).
    pub(super) fn flush(
        &mut self,
        run: &mut Run,
        hooked: bool,
        hooks: &mut HookRunner<'_>,
    ) -> Result<()> {
        if run.facts.is_empty() {
            return Ok(());
        }
        let added = self.tx.write_run(run)?;
        if added != Some(run.facts.len() as i64) {
            // A batch guessed new had a fact stored already; the batch is written again.
            self.guess_failed = self.guessing;
            // Under the write lock, a fact read as absent at the batch's start is absent.
            return Err(Error::Corrupt {
                hash: run.facts[0].hash(),
                reason: match added {
                    Some(added) => format!(
                        "{} of {} facts read as not released were released meanwhile",
                        run.facts.len() as i64 - added,
                        run.facts.len()
                    ),
                    None => format!(
                        "a fact of {} read as not released was released meanwhile",
                        run.facts.len()
                    ),
                },
            });
        }
        if !hooked {
            run.clear();
            return Ok(());
        }
        let mut start = 0;
        for (i, fact) in run.facts.iter().enumerate() {
            let end = run.ends[i];
            let (hashes, seqs, types) = (
                &run.pred_hash[start..end],
                &run.pred[start..end],
                &run.pred_type[start..end],
            );
            let known = |h: &FactHash| {
                hashes
                    .iter()
                    .position(|p| p == h)
                    .map(|k| (seqs[k], types[k]))
            };
            hooks.released(&*self, fact, run.seq[i], &known)?;
            start = end;
        }
        run.clear();
        Ok(())
    }

    /// Which of `facts` and of their predecessors are released, with seq and type id: those
    /// [`super::recent`] knows of, and one statement for the others. With `guess`, a fact
    /// of the batch it does not know of is taken to be new, not looked up.
    fn released_among(&self, facts: &[Fact], guess: bool) -> Result<Known> {
        let own: HashSet<FactHash, BuildFactHasher> = facts.iter().map(Fact::hash).collect();
        let mut preds: HashSet<FactHash, BuildFactHasher> = HashSet::default();
        for fact in facts {
            preds.extend(
                fact.predecessor_hashes()
                    .into_iter()
                    .filter(|p| !own.contains(p) && !self.assumed.contains_key(p)),
            );
        }
        let mut known = Known::default();
        let recent = &self.tx.backend.shared.recent;
        let unknown = recent.lookup(own.iter(), &mut known);
        let mut ask = if guess { Vec::new() } else { unknown };
        ask.extend(recent.lookup(preds.iter(), &mut known));
        if ask.is_empty() {
            return Ok(known);
        }
        let mut found = Vec::new();
        for row in self.tx.rows(LOOK_UP, &[&slices(&ask)])? {
            found.push((hash_at(&row, 0)?, (row.get(1), row.get(2))));
        }
        // Read under the write lock: those numbered before it are committed, true for
        // good; the others this transaction released, and it may yet roll back.
        let committed = self.at_lock.get().seq;
        recent.add(
            found
                .iter()
                .copied()
                .filter(|(_, (seq, _))| *seq <= committed),
        );
        known.extend(found);
        Ok(known)
    }

    /// Which of `facts` held facts wait for by hash (`held_wait`), and which are held;
    /// none when nothing is held.
    fn held_among(
        &mut self,
        facts: &[Fact],
    ) -> Result<(
        HashSet<FactHash, BuildFactHasher>,
        HashSet<FactHash, BuildFactHasher>,
    )> {
        let (mut waited, mut held) = (HashSet::default(), HashSet::default());
        if self.counters().held == 0 {
            return Ok((waited, held));
        }
        let hashes: Vec<FactHash> = facts.iter().map(Fact::hash).collect();
        for row in self.tx.rows(
            "SELECT u.hash, false FROM unnest($1::bytea[]) AS u(hash)
             WHERE EXISTS (SELECT 1 FROM held_wait w WHERE w.missing = u.hash)
             UNION ALL
             SELECT u.hash, true FROM unnest($1::bytea[]) AS u(hash)
             JOIN held h ON substr(h.hash, 1, 8) = substr(u.hash, 1, 8) AND h.hash = u.hash",
            &[&slices(&hashes)],
        )? {
            let hash = hash_at(&row, 0)?;
            if row.get(1) {
                held.insert(hash);
            } else {
                waited.insert(hash);
            }
        }
        Ok((waited, held))
    }
}
