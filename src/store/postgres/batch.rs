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
//! else touches the database (a hold, a cascade) and at the end, and only then hooked,
//! in order. A hook that is not [`crate::store::ReleaseHook::idle`] gets each fact
//! written and hooked before the next, as the one-fact path does.

use std::collections::{HashMap, HashSet};

use super::read::hash_at;
use super::write::PgWrite;
use crate::dag::{self, BuildFactHasher};
use crate::error::{Error, Result};
use crate::fact::Fact;
use crate::hash::FactHash;
use crate::store::backend::HookRunner;
use crate::store::steps::{batch_order, split_predecessors, tally};
use crate::store::{BatchReport, InsertOutcome};

/// Facts written by one statement at most: bounds its arrays.
const RUN: usize = 8_192;

/// Released facts of a batch not yet written, in release order, with their edges.
#[derive(Default)]
struct Run<'f> {
    facts: Vec<&'f Fact>,
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

impl Run<'_> {
    fn clear(&mut self) {
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

/// The batch's view of the released facts: those released before it, as read at its
/// start (`before`), and those it released (`PgWrite::batch_released`).
type Known = HashMap<FactHash, (i64, i64), BuildFactHasher>;

impl PgWrite<'_> {
    /// See [`crate::Writer::insert_batch`]: the SQLite backend's steps, in a few round
    /// trips per batch.
    pub(super) fn insert_many(
        &mut self,
        facts: Vec<Fact>,
        hooks: &mut HookRunner<'_>,
    ) -> Result<BatchReport> {
        let before = self.released_among(&facts)?;
        let mut report = BatchReport::default();
        let ordered = batch_order(facts, &mut report, &mut |h| Ok(before.contains_key(h)))?;
        let waited = self.waited_among(&ordered)?;
        let one_by_one = !hooks.idle(&*self)?;
        self.batch_held = Some(HashMap::with_hasher(dag::BuildFactHasher));
        self.batch_released = Some(HashMap::with_hasher(dag::BuildFactHasher));
        let mut run = Run::default();
        let mut outcome = Ok(());
        for fact in &ordered {
            let one = self.insert_in_batch(fact, &before, &waited, &mut run, hooks);
            let one = match one {
                Ok(o) if one_by_one || run.facts.len() >= RUN => {
                    self.flush(&mut run, hooks).map(|()| o)
                }
                o => o,
            };
            outcome = tally(&mut report, one);
            if outcome.is_err() {
                break;
            }
        }
        if outcome.is_ok() {
            outcome = self.flush(&mut run, hooks);
        }
        self.batch_held = None;
        self.batch_released = None;
        outcome.map(|()| report)
    }

    /// One fact of a parents-first batch: a duplicate, held, or released into `run` (and
    /// then what waited for it, after `run` is written).
    fn insert_in_batch<'f>(
        &mut self,
        fact: &'f Fact,
        before: &Known,
        waited: &HashSet<FactHash, BuildFactHasher>,
        run: &mut Run<'f>,
        hooks: &mut HookRunner<'_>,
    ) -> Result<InsertOutcome> {
        let hash = fact.hash();
        let batch = self.batch_released.as_ref().expect("in a batch");
        if let Some(&(seq, _)) = batch.get(&hash).or_else(|| before.get(&hash)) {
            return Ok(InsertOutcome::Duplicate { seq: Some(seq) });
        }
        let (preds, missing) =
            split_predecessors(fact, self.batch_held.as_ref(), &self.assumed, &mut |h| {
                Ok(batch.get(h).or_else(|| before.get(h)).copied())
            })?;
        if !missing.is_empty() {
            self.flush(run, hooks)?;
            return self.hold(fact, missing);
        }
        let type_id = self.names.id(&self.tx, false, fact.type_name())?;
        for (role, _, pred_seq, pred_type) in &preds {
            run.role.push(self.names.id(&self.tx, true, role)?);
            run.pred.push(*pred_seq);
            run.pred_type.push(*pred_type);
        }
        run.pred_hash.extend(preds.iter().map(|p| p.1));
        run.ends.push(run.pred.len());
        let seq = self.counters().seq + 1;
        self.counters().seq = seq;
        run.facts.push(fact);
        run.seq.push(seq);
        run.type_id.push(type_id);
        let batch = self.batch_released.as_mut().expect("in a batch");
        batch.insert(hash, (seq, type_id));
        // Only a fact waited for when the batch began can release held facts: one held
        // in this batch waits for a fact that comes before it.
        let released = if waited.contains(&hash) {
            self.flush(run, hooks)?;
            1 + self.cascade(hash, (seq, type_id), hooks)?
        } else {
            1
        };
        Ok(InsertOutcome::Inserted { seq, released })
    }

    /// Writes `run`'s facts and edges in one statement, then calls the release hooks for
    /// each, in order.
    fn flush(&mut self, run: &mut Run<'_>, hooks: &mut HookRunner<'_>) -> Result<()> {
        if run.facts.is_empty() {
            return Ok(());
        }
        let hashes: Vec<FactHash> = run.facts.iter().map(|f| f.hash()).collect();
        let hashes: Vec<&[u8]> = hashes.iter().map(|h| &h.0[..]).collect();
        let bytes: Vec<&[u8]> = run.facts.iter().map(|f| f.canonical_bytes()).collect();
        let (mut succ, mut succ_type) = (Vec::new(), Vec::new());
        let mut start = 0;
        for (i, &end) in run.ends.iter().enumerate() {
            succ.extend(std::iter::repeat_n(run.seq[i], end - start));
            succ_type.extend(std::iter::repeat_n(run.type_id[i], end - start));
            start = end;
        }
        let added: i64 = self.tx.rows(
            "WITH f AS (
                 INSERT INTO fact (seq, hash, type_id, bytes)
                 SELECT * FROM unnest($1::bigint[], $2::bytea[], $3::bigint[], $4::bytea[])
                 ON CONFLICT (hash) DO NOTHING RETURNING 1),
             e AS (
                 INSERT INTO edge (predecessor, role_id, successor_type, successor, predecessor_type)
                 SELECT * FROM unnest($5::bigint[], $6::bigint[], $7::bigint[], $8::bigint[], $9::bigint[]))
             SELECT count(*) FROM f",
            &[
                &run.seq,
                &hashes,
                &run.type_id,
                &bytes,
                &run.pred,
                &run.role,
                &succ_type,
                &succ,
                &run.pred_type,
            ],
        )?[0]
            .get(0);
        if added != run.facts.len() as i64 {
            // Under the write lock, a fact read as absent at the batch's start is absent.
            return Err(Error::Corrupt {
                hash: run.facts[0].hash(),
                reason: format!(
                    "{} of {} facts read as not released were released meanwhile",
                    run.facts.len() as i64 - added,
                    run.facts.len()
                ),
            });
        }
        let mut start = 0;
        for (i, fact) in run.facts.iter().enumerate() {
            let end = run.ends[i];
            let (hashes, seqs) = (&run.pred_hash[start..end], &run.pred[start..end]);
            let known = |h: &FactHash| hashes.iter().position(|p| p == h).map(|k| seqs[k]);
            hooks.released(&self.tx, fact, run.seq[i], &known)?;
            start = end;
        }
        run.clear();
        Ok(())
    }

    /// Which of `facts` and of their predecessors are released, with seq and type id:
    /// one statement.
    fn released_among(&self, facts: &[Fact]) -> Result<Known> {
        let mut wanted: HashSet<FactHash, BuildFactHasher> = HashSet::default();
        for fact in facts {
            wanted.insert(fact.hash());
            wanted.extend(
                fact.predecessor_hashes()
                    .into_iter()
                    .filter(|p| !self.assumed.contains_key(p)),
            );
        }
        let wanted: Vec<&[u8]> = wanted.iter().map(|h| &h.0[..]).collect();
        let mut known = Known::default();
        for row in self.tx.rows(
            "SELECT hash, seq, type_id FROM fact WHERE hash = ANY($1::bytea[])",
            &[&wanted],
        )? {
            known.insert(hash_at(&row, 0)?, (row.get(1), row.get(2)));
        }
        Ok(known)
    }

    /// Which of `facts` held facts wait for by hash (`held_wait`); none are when nothing
    /// is held.
    fn waited_among(&mut self, facts: &[Fact]) -> Result<HashSet<FactHash, BuildFactHasher>> {
        let mut waited = HashSet::default();
        if self.counters().held == 0 {
            return Ok(waited);
        }
        let hashes: Vec<FactHash> = facts.iter().map(Fact::hash).collect();
        let hashes: Vec<&[u8]> = hashes.iter().map(|h| &h.0[..]).collect();
        for row in self.tx.rows(
            "SELECT DISTINCT missing FROM held_wait WHERE missing = ANY($1::bytea[])",
            &[&hashes],
        )? {
            waited.insert(hash_at(&row, 0)?);
        }
        Ok(waited)
    }
}
