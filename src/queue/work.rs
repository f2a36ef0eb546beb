//! The queue API on [`Store`] and [`Writer`]: declare, claim, extend, complete, fail,
//! release, redrive, discard, list, stats and alert checks, through the store's seam.

use std::collections::HashMap;
use std::sync::Arc;

use super::controls::{allowance, charge};
use super::index::{
    Count, Ix, QueueCache, QueueDef, QueueDefs, QueueTx, count, defs_for, load_defs, uncheck,
};
use crate::args;
use crate::error::{Error, Result};
use crate::fact::{Fact, FactBuilder};
use crate::hash::FactHash;
use crate::queue::{
    Breach, FailOutcome, Failure, ItemInfo, ItemState, Lease, QueueSpec, QueueStats, Semantics,
    state_code, system,
};
use crate::store::{Dialect, HeldHere, ReadTx, SqlExt, Store, Writer};

pub(super) fn unknown(name: &str) -> Error {
    Error::UnknownQueue {
        name: name.to_string(),
    }
}

/// A claimable item as a claim reads it: its input's seq, state, attempts, first attempt,
/// claimable time (for an expired lease: when it expired) and, when the input is
/// released, its hash and canonical bytes.
type ClaimRow = (i64, i64, i64, Option<i64>, i64, Option<(FactHash, Vec<u8>)>);

/// The state an item row shows as of time `$now` (SQL text): an expired lease is ready,
/// as a claim sees it and as [`QueueStats::ready`] counts it.
macro_rules! shown_state {
    ($t:literal, $now:literal) => {
        concat!(
            "(CASE WHEN ",
            $t,
            "state = ",
            state_code!(Leased),
            " AND ",
            $t,
            "claimable_at <= ",
            $now,
            " THEN ",
            state_code!(Ready),
            " ELSE ",
            $t,
            "state END)"
        )
    };
}

/// Runs `f` on the queue index in `w`'s transaction, then inserts the facts it asked for;
/// the index told the sequence number and type id of each predecessor of the fact it
/// works on (`known`), as the store tells it when it releases a fact.
fn with_index_known<T>(
    w: &mut Writer<'_>,
    known: &dyn Fn(&FactHash) -> Option<(i64, i64)>,
    f: impl FnOnce(&mut Ix<'_>) -> Result<T>,
) -> Result<T> {
    let cache = w.store().extension::<QueueCache>();
    let now = w.now_ms();
    let (tx, state) = w.split();
    let mut ix = Ix {
        tx,
        now,
        state,
        cache: &cache,
        later: Vec::new(),
        known,
        replay: false,
    };
    let value = f(&mut ix)?;
    for fact in std::mem::take(&mut ix.later) {
        w.insert(&fact)?;
    }
    Ok(value)
}

/// A random lease token or jitter source, from the store's queue state.
fn rng<T>(w: &Writer<'_>, f: impl FnOnce(&mut fastrand::Rng) -> T) -> T {
    let cache = w.store().extension::<QueueCache>();
    let mut rng = cache.rng.lock().unwrap_or_else(|e| e.into_inner());
    f(&mut rng)
}

impl Writer<'_> {
    /// The queue declarations for this transaction.
    pub(super) fn queue_defs(&mut self) -> Result<Arc<QueueDefs>> {
        let cache = self.store().extension::<QueueCache>();
        let (tx, state) = self.split();
        defs_for(tx, state, &cache)
    }

    /// The declarations, and the index of queue `name` in them.
    fn queue(&mut self, name: &str) -> Result<(Arc<QueueDefs>, usize)> {
        let defs = self.queue_defs()?;
        let at = defs.queues.iter().position(|q| q.spec.name == name);
        let at = at.ok_or_else(|| unknown(name))?;
        Ok((defs, at))
    }

    /// Checks that `lease` is still the live lease on its input. On PostgreSQL the check
    /// locks the item row until the transaction ends: a claim running at the same time
    /// skips the row, and one that took it first (the lease had expired) commits before
    /// the check reads the row again and finds another token.
    fn check_lease(&mut self, lease: &Lease) -> Result<()> {
        self.flush_item_deletes()?;
        macro_rules! check {
            ($($lock:literal)?) => {
                concat!(
                    "SELECT 1 FROM queue_item
                         WHERE queue_id = ?1 AND input = ?2 AND lease_token = ?3 AND state = ",
                    state_code!(Leased)
                    $(, $lock)?
                )
            };
        }
        let sql = match self.sql().dialect() {
            Dialect::Postgres => check!(" FOR UPDATE"),
            _ => check!(),
        };
        let held = self
            .sql()
            .exists(sql, args![lease.queue_id, lease.seq, lease.token])?;
        if held {
            if self.sql().dialect() == Dialect::Postgres {
                let row = (lease.queue_id, lease.seq);
                self.state::<QueueTx>().locked.insert(row);
            }
            Ok(())
        } else {
            Err(Error::LeaseLost {
                queue: lease.queue.clone(),
                input: lease.input.hash(),
            })
        }
    }

    /// Writes what the queue index keeps for later ([`super::index::flush_pending`]): the
    /// new item rows and the deferred deletes, first thing in every statement of this
    /// file that reads or writes item rows in a write transaction.
    fn flush_item_deletes(&mut self) -> Result<()> {
        let (tx, state) = self.split();
        super::index::flush_pending(tx, state)
    }

    fn dead_letter(
        &mut self,
        q: &QueueDef,
        input: &Fact,
        reason: &str,
        attempts: i64,
        first: Option<i64>,
    ) -> Result<FactHash> {
        let now = self.now_ms();
        self.insert_entry(|| {
            Fact::builder(system::DEAD_LETTER)
                .field("queue", q.spec.name.as_str())
                .field("reason", reason)
                .field("attempts", attempts)
                .field("first_attempt_at", first.unwrap_or(now))
                .field("dead_at", now)
                .predecessor(system::INPUT_ROLE, input.hash())
        })
    }

    fn poison(&mut self, q: &QueueDef, input: &Fact, reason: &str) -> Result<FactHash> {
        let now = self.now_ms();
        self.insert_entry(|| {
            Fact::builder(system::POISON)
                .field("queue", q.spec.name.as_str())
                .field("reason", reason)
                .field("at", now)
                .predecessor(system::INPUT_ROLE, input.hash())
        })
    }

    /// Stores a new dead letter or poison entry. An input redriven and failed again within
    /// the same millisecond, with the same reason and attempts, would build the very fact
    /// of its first entry: stored already, so it would end nothing (the input would stay
    /// leased while `fail` answered dead-lettered). Such a repeat carries a `repeat`
    /// field (1, 2, ...), which first entries lack, so their hashes are unchanged.
    fn insert_entry(&mut self, build: impl Fn() -> FactBuilder) -> Result<FactHash> {
        let mut repeat = 0i64;
        loop {
            let mut b = build();
            if repeat > 0 {
                b = b.field("repeat", repeat);
            }
            let fact = b.build()?;
            if !self.insert(&fact)?.is_duplicate() {
                return Ok(fact.hash());
            }
            repeat += 1;
        }
    }

    /// Claims up to `n` ready inputs of `queue` (see [`Store::claim`]).
    ///
    /// # Errors
    /// [`Error::UnknownQueue`], [`Error::Backend`].
    pub fn claim(&mut self, queue: &str, n: usize) -> Result<Vec<Lease>> {
        self.claim_counted(queue, n).map(|(leases, _)| leases)
    }

    /// [`Writer::claim`], and whether it wrote anything (a lease, a dead letter).
    fn claim_counted(&mut self, queue: &str, n: usize) -> Result<(Vec<Lease>, bool)> {
        let mut dead_letters = 0;
        let (defs, at) = self.queue(queue)?;
        let q = &defs.queues[at];
        let now = self.now_ms();
        // The limits count live leases in the item rows: the deferred deletes go first.
        self.flush_item_deletes()?;
        let (n, window) = allowance(self, &q.spec, q.id, n, now)?;
        let mut leases = Vec::new();
        let completion = Arc::new(q.spec.completions[0].clone());
        let sql = claim_sql(self.sql().dialect(), q.spec.priority_field.is_some());
        while leases.len() < n {
            // The input's bytes come with its item row: one statement per claim, not one
            // per claimed input.
            let rows: Vec<ClaimRow> =
                self.sql()
                    .query_vec(sql, args![q.id, now, (n - leases.len()) as i64], |r| {
                        let fact = match r.value(4)? {
                            crate::store::ValueRef::Null => None,
                            _ => Some((r.hash(4)?, r.get(5)?)),
                        };
                        Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(6)?, fact))
                    })?;
            if rows.is_empty() {
                break;
            }
            // On PostgreSQL the leases of one read are written by one statement, a round
            // trip for the read's rows instead of one per row (SQLite runs each in
            // process). Not for at-most-once queues, where each lease's delivery fact is
            // written right after its lease.
            let together = self.sql().dialect() == Dialect::Postgres
                && q.spec.semantics == Semantics::AtLeastOnce;
            let mut batch: Vec<(i64, i64)> = Vec::new();
            for (seq, state, attempts, first, claimable_at, fact) in rows {
                let input = input_from(q, seq, fact)?;
                let expired = state == ItemState::Leased.code();
                let out_of_attempts = attempts >= q.spec.retry.max_attempts as i64;
                // The age budget is judged when a failure happens: a failure reported
                // inside it was given its retry then, so a ready input is not judged
                // again here. An expired lease failed when it expired.
                let too_old =
                    expired && first.is_some_and(|f| claimable_at - f >= q.spec.retry.max_age_ms);
                if out_of_attempts || too_old {
                    let why = if expired {
                        "lease expired"
                    } else {
                        "retry budget exhausted"
                    };
                    let reason = format!("{why} after {attempts} attempts");
                    self.dead_letter(q, &input, &reason, attempts, first)?;
                    dead_letters += 1;
                    continue;
                }
                if expired {
                    count(self.split().1, q.id, Count::Redelivered);
                }
                let token = rng(self, |r| r.i64(..));
                let expires = now + q.spec.lease_ms;
                self.state::<QueueTx>().item_updates += 1;
                if together {
                    batch.push((seq, token));
                } else {
                    self.sql().execute(
                        concat!("UPDATE queue_item SET state = ", state_code!(Leased), ", attempts = attempts + 1,
                             first_attempt_at = coalesce(first_attempt_at, ?3), lease_token = ?4, claimable_at = ?5
                         WHERE queue_id = ?1 AND input = ?2"),
                        args![q.id, seq, now, token, expires],
                    )?;
                }
                let completion = completion.clone();
                if q.spec.semantics == Semantics::AtMostOnce {
                    let delivered = Fact::builder(system::DELIVERED)
                        .field("queue", q.spec.name.as_str())
                        .field("at", now)
                        .predecessor(system::INPUT_ROLE, input.hash())
                        .build()?;
                    self.insert(&delivered)?;
                }
                leases.push(Lease {
                    queue: q.spec.name.clone(),
                    claimed: input.clone(),
                    input,
                    attempt: attempts as u32 + 1,
                    expires_at_ms: expires,
                    queue_id: q.id,
                    seq,
                    token,
                    completion,
                });
            }
            if !batch.is_empty() {
                let (inputs, tokens): (Vec<i64>, Vec<i64>) = batch.into_iter().unzip();
                let json = |v: &[i64]| serde_json::to_string(v).expect("integers serialise");
                self.sql().execute(
                    concat!("UPDATE queue_item SET state = ", state_code!(Leased), ", attempts = attempts + 1,
                         first_attempt_at = coalesce(first_attempt_at, ?2), lease_token = u.token,
                         claimable_at = ?3
                     FROM (SELECT CAST(i.value AS BIGINT) AS input, CAST(t.value AS BIGINT) AS token
                           FROM jsonb_array_elements_text(CAST(?4 AS jsonb)) WITH ORDINALITY AS i(value, n)
                           JOIN jsonb_array_elements_text(CAST(?5 AS jsonb)) WITH ORDINALITY AS t(value, n)
                             ON t.n = i.n) AS u
                     WHERE queue_id = ?1 AND queue_item.input = u.input"),
                    args![q.id, now, now + q.spec.lease_ms, &json(&inputs), &json(&tokens)],
                )?;
            }
        }
        if let Some(start) = window.filter(|_| !leases.is_empty()) {
            charge(self, q.id, start, leases.len())?;
        }
        let wrote = !leases.is_empty() || dead_letters > 0;
        Ok((leases, wrote))
    }

    /// Completes a leased input inside this transaction, in a savepoint: on any error
    /// (lease lost, no completing fact written, the handler's own error) everything the
    /// handler wrote is rolled back and the rest of the transaction is kept. See
    /// [`Store::complete`] and [`Store::complete_batch`].
    ///
    /// # Errors
    /// [`Error::UnknownQueue`], [`Error::LeaseLost`], [`Error::NotCompleted`], or the
    /// handler's error.
    pub fn complete<T>(
        &mut self,
        lease: &Lease,
        handler: impl FnOnce(&mut Writer<'_>) -> Result<T>,
    ) -> Result<T> {
        let (defs, at) = self.queue(&lease.queue)?;
        let semantics = defs.queues[at].spec.semantics;
        self.savepoint(|w| w.complete_in_savepoint(lease, semantics, handler))
    }

    /// Completes `lease` in the savepoint the caller opened.
    pub(super) fn complete_in_savepoint<T>(
        &mut self,
        lease: &Lease,
        semantics: Semantics,
        handler: impl FnOnce(&mut Writer<'_>) -> Result<T>,
    ) -> Result<T> {
        self.lease_ready(lease, semantics)?;
        self.run_completion(lease, semantics, handler)
    }

    /// Checks, before its handler runs, that `lease` still holds. Writes nothing.
    pub(super) fn lease_ready(&mut self, lease: &Lease, semantics: Semantics) -> Result<()> {
        self.lease_ready_after(lease, semantics, None)
    }

    /// As [`Writer::lease_ready`], where `checked` may already know that the lease holds:
    /// then it is not looked up again.
    pub(super) fn lease_ready_after(
        &mut self,
        lease: &Lease,
        semantics: Semantics,
        checked: Option<(&LeaseCheck, usize)>,
    ) -> Result<()> {
        if semantics == Semantics::AtLeastOnce {
            let known = checked.is_some_and(|(c, at)| c.still_holds(self, lease, at));
            if !known {
                self.check_lease(lease)?;
            }
            // The lease holds, so its input is released as `lease.seq`: the completing
            // fact the handler writes names it, and its insert need not look it up.
            self.assume_released(&lease.claimed, lease.seq)?;
        }
        Ok(())
    }

    /// Runs the handler of a lease that [`Writer::lease_ready`] passed, and checks that it
    /// completed the input. On an error the caller rolls back what it wrote.
    pub(super) fn run_completion<T>(
        &mut self,
        lease: &Lease,
        semantics: Semantics,
        handler: impl FnOnce(&mut Writer<'_>) -> Result<T>,
    ) -> Result<T> {
        let ended_before = self.state::<QueueTx>().ended.len();
        let held_before = {
            let held = self.state::<HeldHere>();
            (held.facts.len(), held.in_batches)
        };
        let value = handler(self)?;
        self.refuse_held(lease, held_before)?;
        // An item row goes only when its input ends, and the index notes every ending (a
        // rolled-back one is forgotten with its savepoint), so the handler completed the
        // input if it ended since the handler began. An at-most-once input ended when it
        // was claimed: the handler owes it no completion. The completions the index keeps
        // for later are ended first.
        if self.state::<QueueTx>().ends_pending() {
            self.flush_item_deletes()?;
        }
        let ended = &self.state::<QueueTx>().ended[ended_before..];
        if semantics == Semantics::AtLeastOnce && !ended.contains(&(lease.queue_id, lease.seq)) {
            return Err(Error::NotCompleted {
                queue: lease.queue.clone(),
                input: lease.input.hash(),
            });
        }
        if semantics == Semantics::AtMostOnce {
            // Its delivery ended the input uncounted: the handler's success is counted
            // here (and its failure as dropped, in `fail`).
            let now = self.now_ms();
            super::index::bump_rate(self.split().1, now, lease.queue_id, "completed");
        }
        Ok(value)
    }

    /// Refuses a completion whose handler left an effect held (a fact naming a
    /// predecessor that is not stored): it would be stored but invisible to every read
    /// while the input counted as done. The caller rolls back what the handler wrote.
    fn refuse_held(&mut self, lease: &Lease, (facts, in_batches): (usize, u64)) -> Result<()> {
        let held = self.state::<HeldHere>();
        let batched = held.in_batches - in_batches;
        let singles: Vec<(FactHash, Option<FactHash>)> = held.facts[facts..].to_vec();
        let refuse = |reason: String| Error::Queue {
            queue: lease.queue.clone(),
            reason: format!(
                "completion of input {} refused, nothing of it stored: {reason}",
                lease.input.hash()
            ),
        };
        for (fact, missing) in singles {
            // Released later in the same handler (a successor written before its
            // predecessor) is fine.
            if self.released_seq(&fact)?.is_none() {
                let missing = missing.map_or_else(String::new, |m| format!(" {m}"));
                return Err(refuse(format!(
                    "effect {fact} names missing predecessor{missing}"
                )));
            }
        }
        if batched > 0 {
            return Err(refuse(format!(
                "{batched} effect(s) of a batch name missing predecessors"
            )));
        }
        Ok(())
    }

    /// Fails a leased input, a transient failure retried no sooner than `delay_ms` from
    /// now (see [`Store::fail_not_before`]).
    ///
    /// # Errors
    /// [`Error::LeaseLost`] if the lease is no longer held.
    pub fn fail_not_before(
        &mut self,
        lease: &Lease,
        failure: &Failure,
        delay_ms: i64,
    ) -> Result<FailOutcome> {
        match self.fail(lease, failure)? {
            FailOutcome::Retry { at_ms } => {
                let at_ms = at_ms.max(self.now_ms().saturating_add(delay_ms.max(0)));
                self.sql().execute(
                    "UPDATE queue_item SET claimable_at = ?3 WHERE queue_id = ?1 AND input = ?2",
                    args![lease.queue_id, lease.seq, at_ms],
                )?;
                Ok(FailOutcome::Retry { at_ms })
            }
            other => Ok(other),
        }
    }

    /// Gives a leased input back without counting the attempt (see [`Store::release`]);
    /// an at-most-once input, which ended when it was handed out, is counted dropped.
    ///
    /// # Errors
    /// [`Error::LeaseLost`] if the lease is no longer held; nothing is written then.
    pub fn release(&mut self, lease: &Lease) -> Result<()> {
        let (defs, at) = self.queue(&lease.queue)?;
        let q = &defs.queues[at];
        if q.spec.semantics == Semantics::AtMostOnce {
            // Delivered at most once: the input ended when it was handed out and cannot be
            // offered again, so one given back unstarted is dropped, and counted so, as a
            // failed one is (not lost without a trace).
            let id = q.id;
            count(self.split().1, id, Count::Dropped);
            return Ok(());
        }
        self.check_lease(lease)?;
        let now = self.now_ms();
        self.sql().execute(
            concat!(
                "UPDATE queue_item SET state = ",
                state_code!(Ready),
                ", claimable_at = ?3, lease_token = NULL,
                     attempts = attempts - 1,
                     first_attempt_at = CASE WHEN attempts = 1 THEN NULL ELSE first_attempt_at END
                 WHERE queue_id = ?1 AND input = ?2"
            ),
            args![lease.queue_id, lease.seq, now],
        )?;
        Ok(())
    }

    /// Fails a leased input (see [`Store::fail`]).
    ///
    /// # Errors
    /// [`Error::LeaseLost`] if the lease is no longer held.
    pub fn fail(&mut self, lease: &Lease, failure: &Failure) -> Result<FailOutcome> {
        let (defs, at) = self.queue(&lease.queue)?;
        let q = &defs.queues[at];
        let now = self.now_ms();
        let at_most_once = q.spec.semantics == Semantics::AtMostOnce;
        // An at-most-once input ended when it was delivered: there is no lease to check.
        if !at_most_once {
            self.check_lease(lease)?;
        }
        let counts = [
            Some(Count::Failed),
            matches!(failure, Failure::TimedOut { .. }).then_some(Count::TimedOut),
            at_most_once.then_some(Count::Dropped),
        ];
        let state = self.split().1;
        super::index::bump_rate(state, now, q.id, "failed");
        for c in counts.into_iter().flatten() {
            count(state, q.id, c);
        }
        if at_most_once {
            return Ok(FailOutcome::Dropped);
        }
        let (attempts, first): (i64, Option<i64>) = self.sql().query_one(
            "SELECT attempts, first_attempt_at FROM queue_item WHERE queue_id = ?1 AND input = ?2",
            args![q.id, lease.seq],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )?;
        let now = self.now_ms();
        match failure {
            Failure::Permanent(reason) => Ok(FailOutcome::DeadLettered(self.dead_letter(
                q,
                &lease.input,
                reason,
                attempts,
                first,
            )?)),
            Failure::Poison(reason) => Ok(FailOutcome::Poisoned(self.poison(
                q,
                &lease.input,
                reason,
            )?)),
            Failure::Transient(reason) | Failure::TimedOut { reason } => {
                let budget_left = attempts < q.spec.retry.max_attempts as i64
                    && first.is_none_or(|f| now - f < q.spec.retry.max_age_ms);
                if !budget_left {
                    let reason = format!("gave up after {attempts} attempts: {reason}");
                    return Ok(FailOutcome::DeadLettered(self.dead_letter(
                        q,
                        &lease.input,
                        &reason,
                        attempts,
                        first,
                    )?));
                }
                let at = now + q.spec.backoff_ms(attempts as u32, rng(self, |r| r.f64()));
                count(self.split().1, q.id, Count::Retried);
                self.state::<QueueTx>().item_updates += 1;
                self.sql().execute(
                    concat!(
                        "UPDATE queue_item SET state = ",
                        state_code!(Ready),
                        ", claimable_at = ?3, lease_token = NULL, last_error = ?4
                         WHERE queue_id = ?1 AND input = ?2"
                    ),
                    args![q.id, lease.seq, at, reason],
                )?;
                Ok(FailOutcome::Retry { at_ms: at })
            }
        }
    }
}

/// The leases of a batch, checked together before the first handler runs: one statement
/// per queue instead of one per lease.
///
/// A lease found held then still holds when its turn comes unless this transaction has
/// since changed an item row other than by ending an input (a claim, a failure, a dead
/// letter: `QueueTx::item_updates` moved) or ended the lease's own input. In either case,
/// and for a lease the statement did not reach, the lease is looked up on its own, so a
/// handler never runs for a lease that was lost.
pub(super) struct LeaseCheck {
    held: Vec<bool>,
    item_updates: u64,
    ended: usize,
}

impl LeaseCheck {
    /// How many item rows the statement may read per lease checked: the rows between the
    /// lowest and highest input of a batch are mostly the batch's own (a claim takes the
    /// oldest ready inputs), and past this bound the rest are looked up one by one.
    const ROWS_PER_LEASE: usize = 4;

    /// Checks `leases` of at-least-once queues (the others are never looked up).
    pub(super) fn new(
        w: &mut Writer<'_>,
        defs: &QueueDefs,
        leases: &[Lease],
    ) -> Result<LeaseCheck> {
        let mut held = vec![false; leases.len()];
        w.flush_item_deletes()?;
        let at_least_once = |l: &Lease| {
            defs.by_name(&l.queue)
                .is_some_and(|q| q.id == l.queue_id && q.spec.semantics == Semantics::AtLeastOnce)
        };
        let mut queues: Vec<i64> = leases
            .iter()
            .filter(|l| at_least_once(l))
            .map(|l| l.queue_id)
            .collect();
        queues.sort_unstable();
        queues.dedup();
        for queue in queues {
            let mine = || {
                leases
                    .iter()
                    .filter(|l| l.queue_id == queue && at_least_once(l))
            };
            if w.sql().dialect() == Dialect::Postgres {
                // Claims in other transactions run beside this one there, and a read of
                // the batch's whole range would wait on their rows: the batch's own rows
                // are read by input, and locked (`FOR UPDATE`, in input order) until the
                // commit, so that what this finds holds to the end of the batch. One
                // round trip for the batch instead of one per lease.
                let mut inputs: Vec<i64> = mine().map(|l| l.seq).collect();
                inputs.sort_unstable();
                inputs.dedup();
                let list = serde_json::to_string(&inputs).expect("integers serialise");
                let rows: Vec<(i64, i64, Option<i64>)> = w.sql().query_vec(
                    "SELECT input, state, lease_token FROM queue_item
                     WHERE queue_id = ?1 AND input IN (
                         SELECT CAST(value AS BIGINT)
                         FROM jsonb_array_elements_text(CAST(?2 AS jsonb)))
                     ORDER BY input FOR UPDATE",
                    args![queue, &list],
                    |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
                )?;
                for (at, l) in leases.iter().enumerate() {
                    if l.queue_id == queue && at_least_once(l) {
                        held[at] = rows.binary_search_by_key(&l.seq, |r| r.0).is_ok_and(|i| {
                            rows[i].1 == ItemState::Leased.code() && rows[i].2 == Some(l.token)
                        });
                    }
                }
                // Locked to the commit and leased: the index may defer their deletes.
                let locked = &mut w.state::<QueueTx>().locked;
                for (input, state, _) in rows {
                    if state == ItemState::Leased.code() {
                        locked.insert((queue, input));
                    }
                }
                continue;
            }
            let (count, low, high) = mine().fold((0, i64::MAX, i64::MIN), |(n, lo, hi), l| {
                (n + 1, lo.min(l.seq), hi.max(l.seq))
            });
            let limit = count * Self::ROWS_PER_LEASE + 16;
            // The parameters are hidden from the planner (`?N + 0`), which would otherwise
            // prepare the statement again at every batch.
            let rows: Vec<(i64, i64, Option<i64>)> = w.sql().query_vec(
                "SELECT input, state, lease_token FROM queue_item
                 WHERE queue_id = ?1 + 0 AND input >= ?2 + 0 AND input <= ?3 + 0
                 ORDER BY input LIMIT ?4 + 0",
                args![queue, low, high, limit as i64],
                |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
            )?;
            // Past the last row read, when the limit cut the statement short, nothing is
            // known.
            let reached = if rows.len() < limit {
                high
            } else {
                rows.last().map_or(i64::MIN, |r| r.0)
            };
            for (at, l) in leases.iter().enumerate() {
                if l.queue_id != queue || l.seq > reached || !at_least_once(l) {
                    continue;
                }
                held[at] = rows.binary_search_by_key(&l.seq, |r| r.0).is_ok_and(|i| {
                    rows[i].1 == ItemState::Leased.code() && rows[i].2 == Some(l.token)
                });
            }
        }
        let qtx = w.state::<QueueTx>();
        Ok(LeaseCheck {
            held,
            item_updates: qtx.item_updates,
            ended: qtx.ended.len(),
        })
    }

    /// Whether lease `at` of the batch is known to hold now, without a lookup.
    fn still_holds(&self, w: &mut Writer<'_>, lease: &Lease, at: usize) -> bool {
        if !self.held.get(at).copied().unwrap_or(false) {
            return false;
        }
        let qtx = w.state::<QueueTx>();
        qtx.item_updates == self.item_updates
            && qtx.ended.len() >= self.ended
            && !qtx.ended[self.ended..].contains(&(lease.queue_id, lease.seq))
            && !qtx.ending(lease.queue_id, lease.seq)
    }
}

/// The statement a claim reads its next items with. On PostgreSQL, where workers in other
/// transactions claim from the same queue at once, it locks the item rows it returns and
/// skips those another claim has locked (`FOR UPDATE ... SKIP LOCKED`): the lease is
/// written under that lock, and a row whose lease committed meanwhile is read again and
/// no longer claimable, so no input has two live leases. SQLite has one writer at a time;
/// there the parameters are hidden from the planner (`?N + 0`; it looks through `+?N`),
/// which would otherwise prepare the statement again at every claim.
///
/// A queue with a priority field orders by priority first (higher first), walking the
/// index `queue_item_priority` in that order; the others walk `queue_item_claimable`.
/// Either way a claim reads about the rows it takes, whatever the backlog
/// (`docs/performance.md`, "Queue controls").
fn claim_sql(dialect: Dialect, prioritized: bool) -> &'static str {
    macro_rules! pg {
        ($($order:literal)?) => {
            concat!("SELECT i.input, i.state, i.attempts, i.first_attempt_at, f.hash, f.bytes, i.claimable_at
                 FROM queue_item i LEFT JOIN fact f ON f.seq = i.input
                 WHERE i.queue_id = ?1 AND i.claimable_at <= ?2
                 ORDER BY ", $($order,)? "i.claimable_at, i.input LIMIT ?3 FOR UPDATE OF i SKIP LOCKED")
        };
    }
    macro_rules! sqlite {
        ($($index:literal, $order:literal)?) => {
            concat!("SELECT i.input, i.state, i.attempts, i.first_attempt_at, f.hash, f.bytes, i.claimable_at
                 FROM queue_item i ", $($index,)? "LEFT JOIN fact f ON f.seq = i.input
                 WHERE i.queue_id = ?1 + 0 AND i.claimable_at <= ?2 + 0
                 ORDER BY ", $($order,)? "i.claimable_at, i.input LIMIT ?3 + 0")
        };
    }
    match (dialect, prioritized) {
        (Dialect::Postgres, false) => pg!(),
        (Dialect::Postgres, true) => pg!("i.priority DESC, "),
        (_, false) => sqlite!(),
        // Named: without statistics SQLite prefers the claimable index's range and
        // sorts the whole backlog.
        (_, true) => sqlite!("INDEXED BY queue_item_priority ", "i.priority DESC, "),
    }
}

/// The input of queue item `seq` from its fact row's hash and bytes (`None`: no row).
fn input_from(q: &QueueDef, seq: i64, row: Option<(FactHash, Vec<u8>)>) -> Result<Fact> {
    let (hash, bytes) = row.ok_or_else(|| Error::Queue {
        queue: q.spec.name.clone(),
        reason: format!("queue item names seq {seq}, which is not a released fact"),
    })?;
    crate::encoding::decode_fact(&bytes, Some(hash)).map_err(|e| Error::Corrupt {
        hash,
        reason: e.to_string(),
    })
}

/// The input a hash names in queue `id`: the hash itself if it is an unfinished input, or
/// the input of a dead letter / poison entry.
fn input_of(r: &dyn ReadTx, id: i64, hash: &FactHash) -> Result<Option<FactHash>> {
    r.query_opt(
        "SELECT f.hash FROM queue_item i JOIN fact f ON f.seq = i.input
         LEFT JOIN fact e ON e.seq = i.entry
         WHERE i.queue_id = ?1 AND (f.hash = ?2 OR e.hash = ?2)",
        args![id, hash],
        |r| r.hash(0),
    )
}

impl Store {
    /// Declares a queue, or changes an existing one's policy. A new queue, or one whose
    /// input type, scope or completion rules change, is back-filled: every stored fact
    /// that is an unfinished input is indexed, in release order. It holds the store's
    /// write lock throughout, so writers in other processes wait for the back-fill (up
    /// to their busy timeout) and every fact they release is either back-filled or an
    /// input of its own transaction.
    ///
    /// # Errors
    /// [`Error::Queue`] for an invalid spec; [`Error::Backend`].
    pub fn declare_queue(&self, spec: &QueueSpec) -> Result<()> {
        spec.check().map_err(|reason| Error::Queue {
            queue: spec.name.clone(),
            reason,
        })?;
        self.write(|w| {
            // A release reads in its own transaction whether there are queues: under the
            // write lock it comes wholly before this declaration (and is back-filled) or
            // after it (and sees the queue). Without it, facts released by another
            // process while the back-fill ran were in neither.
            w.lock_writers()?;
            let defs = w.queue_defs()?;
            let old = defs.by_name(&spec.name);
            // A plain re-declaration keeps the limit a `from now` declaration set.
            let mut spec = spec.clone();
            spec.after_seq = spec.after_seq.or(old.and_then(|o| o.spec.after_seq));
            let spec = &spec;
            let config = serde_json::to_string(spec).expect("a spec serialises");
            let rebuild = old.is_none_or(|o| {
                o.spec.input_type != spec.input_type
                    || o.spec.scope != spec.scope
                    || o.spec.completions != spec.completions
                    || o.spec.ordering != spec.ordering
            });
            let now = w.now_ms();
            let tx = w.sql();
            let id: i64 = match old {
                Some(o) => {
                    tx.execute(
                        "UPDATE queue SET config = ?2 WHERE id = ?1",
                        args![o.id, &config],
                    )?;
                    o.id
                }
                None => tx.query_one(
                    "INSERT INTO queue (name, config, created_at) VALUES (?1, ?2, ?3) RETURNING id",
                    args![&spec.name, &config, now],
                    |r| r.get(0),
                )?,
            };
            // What a rebuild must not lose of the inputs in flight: live leases (their
            // workers are handling them) and the attempts, backoff and last error of the
            // inputs retried (their budget).
            let mut in_flight: Vec<InFlight> = Vec::new();
            if rebuild {
                // Read as they are deleted: on PostgreSQL a claim, heartbeat or failure
                // takes no writer lock, and one that commits while the delete waits for
                // its row is read as it committed.
                w.flush_item_deletes()?;
                let rows: Vec<InFlight> = w.sql().query_vec(
                    "DELETE FROM queue_item WHERE queue_id = ?1
                     RETURNING input, state, claimable_at, attempts, first_attempt_at,
                               lease_token, last_error",
                    args![id],
                    |r| {
                        Ok(InFlight {
                            input: r.get(0)?,
                            leased: r.get::<i64>(1)? == ItemState::Leased.code(),
                            claimable_at: r.get(2)?,
                            attempts: r.get(3)?,
                            first_attempt_at: r.get(4)?,
                            lease_token: r.get(5)?,
                            last_error: r.get(6)?,
                        })
                    },
                )?;
                in_flight = rows
                    .into_iter()
                    .filter(|f| f.leased || f.attempts > 0)
                    .collect();
                let tx = w.sql();
                tx.execute("DELETE FROM queue_block WHERE queue_id = ?1", args![id])?;
            }
            let tx = w.sql();
            tx.execute(
                "UPDATE counter SET value = value + 1 WHERE name = 'queues'",
                args![],
            )?;
            uncheck(w.split().1);
            if rebuild {
                backfill(w, spec, id)?;
                w.flush_item_deletes()?;
                for f in &in_flight {
                    f.put_back(w, id)?;
                }
            }
            Ok(())
        })
    }

    /// Declares a queue as [`Store::declare_queue`] does, but without back-filling: only
    /// facts released after the declaration are its inputs (by release order, so an input
    /// that arrives later by sync or import is one even if it is older in the DAG).
    ///
    /// # Errors
    /// As [`Store::declare_queue`].
    pub fn declare_queue_from_now(&self, spec: &QueueSpec) -> Result<()> {
        let last: i64 = self.read(|r| {
            r.query_one("SELECT coalesce(max(seq), 0) FROM fact", args![], |r| {
                r.get(0)
            })
        })?;
        let mut spec = spec.clone();
        spec.after_seq = Some(last);
        self.declare_queue(&spec)
    }

    /// Removes a queue and its local state (leases, attempts). Its facts stay.
    ///
    /// # Errors
    /// [`Error::UnknownQueue`].
    pub fn drop_queue(&self, name: &str) -> Result<()> {
        self.write(|w| {
            // As for a declaration: a release comes wholly before (its items are deleted
            // here) or after (it does not see the queue).
            w.lock_writers()?;
            let tx = w.sql();
            let id: i64 = tx
                .query_opt("SELECT id FROM queue WHERE name = ?1", args![name], |r| {
                    r.get(0)
                })?
                .ok_or_else(|| unknown(name))?;
            for sql in [
                "DELETE FROM queue_item WHERE queue_id = ?1",
                "DELETE FROM queue_block WHERE queue_id = ?1",
                "DELETE FROM queue_rate WHERE queue_id = ?1",
                "DELETE FROM queue WHERE id = ?1",
            ] {
                tx.execute(sql, args![id])?;
            }
            tx.execute(
                "UPDATE counter SET value = value + 1 WHERE name = 'queues'",
                args![],
            )?;
            uncheck(w.split().1);
            Ok(())
        })
    }

    /// The declared queues.
    ///
    /// # Errors
    /// [`Error::Backend`].
    pub fn queues(&self) -> Result<Vec<QueueSpec>> {
        let defs = self.read(|r| self.defs(r))?;
        Ok(defs.queues.iter().map(|q| q.spec.clone()).collect())
    }

    fn defs(&self, r: &dyn ReadTx) -> Result<Arc<QueueDefs>> {
        load_defs(r, &self.extension::<QueueCache>())
    }

    pub(super) fn def(&self, name: &str) -> Result<(i64, QueueSpec)> {
        let defs = self.read(|r| self.defs(r))?;
        defs.by_name(name)
            .map(|q| (q.id, q.spec.clone()))
            .ok_or_else(|| unknown(name))
    }

    /// Claims up to `n` ready inputs, oldest first, each under a lease of the queue's
    /// duration. No two live leases exist on one input, also across processes. An input
    /// whose expired lease exhausted the retry budget is dead-lettered instead.
    ///
    /// # Errors
    /// [`Error::UnknownQueue`], [`Error::Backend`].
    pub fn claim(&self, queue: &str, n: usize) -> Result<Vec<Lease>> {
        self.write(|w| {
            let (leases, wrote) = w.claim_counted(queue, n)?;
            if !wrote {
                // Nothing to hand out, nothing written: a waiter that claims and then
                // waits for a wake-up is not woken by its own claim.
                w.quiet();
            }
            Ok(leases)
        })
    }

    /// Extends a lease by the queue's lease duration from now (a heartbeat).
    ///
    /// # Errors
    /// [`Error::LeaseLost`] if it expired and another worker claimed the input, or if it
    /// expired on a queue with `max_leased` whose limit is reached: an expired lease
    /// does not count as live, so others may have been handed its place.
    pub fn extend(&self, lease: &Lease) -> Result<Lease> {
        let (_, spec) = self.def(&lease.queue)?;
        self.write(|w| {
            let now = w.now_ms();
            // The item's row first, then (with a limit) the queue's, the order a discard,
            // a failure and a completion take them in. A claim takes the queue's first
            // but skips locked item rows (`SKIP LOCKED`), so it never waits for this one.
            w.check_lease(lease)?;
            let room = match spec.max_leased {
                Some(_) => {
                    let live_only = QueueSpec {
                        rate: None,
                        ..spec.clone()
                    };
                    Some(allowance(w, &live_only, lease.queue_id, 1, now)?.0 > 0)
                }
                None => None,
            };
            if room == Some(false) {
                let live = w.sql().exists(
                    "SELECT 1 FROM queue_item WHERE queue_id = ?1 AND input = ?2 AND claimable_at > ?3",
                    args![lease.queue_id, lease.seq, now],
                )?;
                if !live {
                    return Err(Error::LeaseLost {
                        queue: lease.queue.clone(),
                        input: lease.input.hash(),
                    });
                }
            }
            let expires = now + spec.lease_ms;
            w.sql().execute(
                "UPDATE queue_item SET claimable_at = ?3 WHERE queue_id = ?1 AND input = ?2",
                args![lease.queue_id, lease.seq, expires],
            )?;
            Ok(Lease {
                expires_at_ms: expires,
                ..lease.clone()
            })
        })
    }

    /// Completes a leased input: `handler` receives the write transaction, writes the
    /// application's own rows and a fact that completes the input (see
    /// [`Lease::completion`]), and everything commits together or not at all.
    ///
    /// ```
    /// use precedent::queue::{Completion, QueueSpec};
    /// use precedent::store::SqlExt;
    /// use precedent::{Error, Fact, Store, args};
    ///
    /// let store = Store::open_in_memory()?;
    /// let done = Completion { type_name: "Shipment".into(), role: "order".into() };
    /// store.declare_queue(&QueueSpec::new("ship", "Order", vec![done]))?;
    /// store.write(|w| w.sql().batch("CREATE TABLE label (input BLOB PRIMARY KEY)"))?;
    /// store.insert(&Fact::builder("Order").field("id", 1).build()?)?;
    ///
    /// let lease = store.claim("ship", 10)?.pop().expect("one order");
    /// // A handler that forgets the completion: refused, and its row is rolled back.
    /// let forgot = store.complete(&lease, |w| {
    ///     w.sql().execute("INSERT INTO label VALUES (?1)", args![&lease.input.hash()])?;
    ///     Ok(())
    /// });
    /// assert!(matches!(forgot, Err(Error::NotCompleted { .. })));
    /// // The row and the completion commit together.
    /// store.complete(&lease, |w| {
    ///     w.sql().execute("INSERT INTO label VALUES (?1)", args![&lease.input.hash()])?;
    ///     w.insert(&lease.completion().field("carrier", "post").build()?)?;
    ///     Ok(())
    /// })?;
    /// let labels: i64 = store.read(|r| r.query_one("SELECT count(*) FROM label", args![], |r| r.get(0)))?;
    /// assert_eq!(labels, 1);
    /// assert!(store.claim("ship", 10)?.is_empty());
    /// # Ok::<(), precedent::Error>(())
    /// ```
    ///
    /// # Errors
    /// [`Error::LeaseLost`] if the lease expired and another worker claimed the input;
    /// [`Error::NotCompleted`] if the handler wrote no completing fact; whatever the
    /// handler returns. In every error case nothing is written.
    pub fn complete<T>(
        &self,
        lease: &Lease,
        handler: impl FnOnce(&mut Writer<'_>) -> Result<T>,
    ) -> Result<T> {
        self.write(|w| w.complete(lease, handler))
    }

    /// One queue's declaration.
    ///
    /// # Errors
    /// [`Error::UnknownQueue`].
    pub fn queue(&self, name: &str) -> Result<QueueSpec> {
        Ok(self.def(name)?.1)
    }

    /// Records a failed attempt: transient failures retry after backoff until the retry
    /// budget (attempts or age) runs out and then dead-letter; permanent failures
    /// dead-letter now; poison goes to the poison list. Dead letters and poison entries
    /// are facts, successors of the input.
    ///
    /// # Errors
    /// [`Error::LeaseLost`] if the lease is no longer held.
    pub fn fail(&self, lease: &Lease, failure: Failure) -> Result<FailOutcome> {
        self.write(|w| w.fail(lease, &failure))
    }

    /// [`Store::fail`], with a transient failure retried no sooner than `delay_ms` from
    /// now (a delay the handler chose), or after the backoff if that is later.
    ///
    /// # Errors
    /// [`Error::LeaseLost`] if the lease is no longer held.
    pub fn fail_not_before(
        &self,
        lease: &Lease,
        failure: Failure,
        delay_ms: i64,
    ) -> Result<FailOutcome> {
        self.write(|w| w.fail_not_before(lease, &failure, delay_ms))
    }

    /// Gives a leased input back without counting the attempt (a worker shutting down
    /// before it started the work). An input of an at-most-once queue ended when it was
    /// handed out and cannot be offered again: it is counted `dropped`, as a failed one is.
    ///
    /// # Errors
    /// [`Error::LeaseLost`] if the lease is no longer held.
    pub fn release(&self, lease: Lease) -> Result<()> {
        self.write(|w| w.release(&lease))
    }

    /// Sends a dead-lettered or poison input back to its queue with a fresh retry budget,
    /// by storing a redrive fact (a successor of the entry). `entry` is the dead letter or
    /// poison fact, or the input itself.
    ///
    /// # Errors
    /// [`Error::Queue`] if the input is not dead-lettered or poison in `queue`.
    pub fn redrive(&self, queue: &str, entry_or_input: &FactHash) -> Result<FactHash> {
        let (id, spec) = self.def(queue)?;
        let entry = self
            .entry_of(id, entry_or_input)?
            .ok_or_else(|| Error::Queue {
                queue: queue.to_string(),
                reason: format!(
                    "{entry_or_input} is not a dead-lettered or poison input of this queue"
                ),
            })?;
        let now = self.options().clock.now_ms();
        let fact = Fact::builder(system::REDRIVE)
            .field("queue", spec.name.as_str())
            .field("at", now)
            .predecessor(system::ENTRY_ROLE, entry)
            .build()?;
        self.insert(&fact)?;
        Ok(fact.hash())
    }

    /// Ends an input for good, by storing a discard fact with `reason`.
    ///
    /// # Errors
    /// [`Error::Queue`] if the input is not an unfinished input of `queue`.
    pub fn discard(&self, queue: &str, input: &FactHash, reason: &str) -> Result<FactHash> {
        let (id, spec) = self.def(queue)?;
        let input = self.input_of(id, input)?.ok_or_else(|| Error::Queue {
            queue: queue.to_string(),
            reason: format!("{input} is not an unfinished input of this queue"),
        })?;
        let now = self.options().clock.now_ms();
        let fact = Fact::builder(system::DISCARD)
            .field("queue", spec.name.as_str())
            .field("reason", reason)
            .field("at", now)
            .predecessor(system::INPUT_ROLE, input)
            .build()?;
        self.insert(&fact)?;
        Ok(fact.hash())
    }

    /// The input a hash names in queue `id`: the hash itself if it is an unfinished input,
    /// or the input of a dead letter / poison entry.
    fn input_of(&self, id: i64, hash: &FactHash) -> Result<Option<FactHash>> {
        self.read(|r| input_of(r, id, hash))
    }

    fn entry_of(&self, id: i64, hash: &FactHash) -> Result<Option<FactHash>> {
        self.read(|r| {
            r.query_opt(concat!("SELECT e.hash FROM queue_item i JOIN fact f ON f.seq = i.input JOIN fact e ON e.seq = i.entry
                 WHERE i.queue_id = ?1 AND i.state IN (", state_code!(Dead), ", ", state_code!(Poison), ") AND (f.hash = ?2 OR e.hash = ?2)"), args![id, hash], |r| r.hash(0))
        })
    }

    /// Unfinished inputs of a queue in one state (or all), oldest first, up to `limit`.
    ///
    /// # Errors
    /// [`Error::UnknownQueue`], [`Error::Backend`].
    pub fn queue_items(
        &self,
        queue: &str,
        state: Option<ItemState>,
        limit: usize,
    ) -> Result<Vec<ItemInfo>> {
        let (id, _) = self.def(queue)?;
        let now = self.options().clock.now_ms();
        self.read(|r| {
            let seqs: Vec<i64> = r.query_vec(
                concat!(
                    "SELECT input FROM queue_item
                     WHERE queue_id = ?1 AND (CAST(?2 AS BIGINT) IS NULL OR ",
                    shown_state!("", "?3"),
                    " = ?2) ORDER BY input LIMIT ?4"
                ),
                args![id, state.map(ItemState::code), now, limit as i64],
                |r| r.get(0),
            )?;
            seqs.into_iter().map(|s| item_info(r, id, s, now)).collect()
        })
    }

    /// One input's state in a queue, or `None` if it is not an unfinished input there
    /// (`hash` may also be its dead letter or poison entry).
    ///
    /// # Errors
    /// [`Error::UnknownQueue`], [`Error::Backend`].
    pub fn queue_item(&self, queue: &str, hash: &FactHash) -> Result<Option<ItemInfo>> {
        let (id, _) = self.def(queue)?;
        let now = self.options().clock.now_ms();
        self.read(|r| {
            let Some(input) = input_of(r, id, hash)? else {
                return Ok(None);
            };
            let seq = r.seq_of(&input)?.ok_or_else(|| Error::Corrupt {
                hash: input,
                reason: format!("an input of queue {queue} that is not released"),
            })?;
            item_info(r, id, seq, now).map(Some)
        })
    }

    /// Counts, ages and rates for a queue.
    ///
    /// # Errors
    /// [`Error::UnknownQueue`], [`Error::Backend`].
    pub fn queue_stats(&self, queue: &str) -> Result<QueueStats> {
        let (id, spec) = self.def(queue)?;
        let now = self.options().clock.now_ms();
        self.read(|r| queue_stats(r, id, spec, now))
    }

    /// The alert thresholds of every queue (or one) that are breached now.
    ///
    /// # Errors
    /// [`Error::UnknownQueue`], [`Error::Backend`].
    pub fn queue_check(&self, only: Option<&str>) -> Result<Vec<Breach>> {
        let specs: Vec<QueueSpec> = match only {
            Some(name) => vec![self.def(name)?.1],
            None => self.queues()?,
        };
        let mut out = Vec::new();
        for spec in specs {
            let s = self.queue_stats(&spec.name)?;
            out.extend(breaches(&spec, &s));
        }
        Ok(out)
    }
}

/// The alert thresholds of `spec` that `s` breaches.
pub(crate) fn breaches(spec: &QueueSpec, s: &QueueStats) -> Vec<Breach> {
    let a = &spec.alerts;
    let mut out = Vec::new();
    let mut breach = |alert, value: i64, threshold: i64| {
        if value > threshold {
            out.push(Breach {
                queue: spec.name.clone(),
                alert,
                value,
                threshold,
            });
        }
    };
    breach("dead", s.dead as i64, a.max_dead as i64);
    breach("poison", s.poison as i64, a.max_poison as i64);
    breach("ready-age", s.oldest_ready_ms, a.max_ready_age_ms);
    if let Some(max) = a.max_depth {
        breach("depth", s.depth as i64, max as i64);
    }
    out
}

/// One input's state in queue `id` at time `now`.
pub(super) fn item_info(r: &dyn ReadTx, id: i64, seq: i64, now: i64) -> Result<ItemInfo> {
    let mut info = r.query_one(
        concat!(
            "SELECT f.hash, ",
            shown_state!("i.", "?3"),
            ", i.attempts, i.first_attempt_at, i.claimable_at, i.last_error, e.hash
             FROM queue_item i JOIN fact f ON f.seq = i.input LEFT JOIN fact e ON e.seq = i.entry
             WHERE i.queue_id = ?1 AND i.input = ?2"
        ),
        args![id, seq, now],
        |r| {
            Ok(ItemInfo {
                input: r.hash(0)?,
                state: state_of(r.get(1)?)?,
                attempts: r.get::<i64>(2)? as u32,
                first_attempt_at_ms: r.get(3)?,
                available_at_ms: r.get(4)?,
                last_error: r.get(5)?,
                entry: match r.value(6)? {
                    crate::store::ValueRef::Null => None,
                    _ => Some(r.hash(6)?),
                },
                blocked_by: Vec::new(),
            })
        },
    )?;
    info.blocked_by = r.query_vec(
        "SELECT f.hash, i.state FROM queue_block b
         JOIN queue_item i ON i.queue_id = b.queue_id AND i.input = b.blocker
         JOIN fact f ON f.seq = b.blocker WHERE b.queue_id = ?1 AND b.blocked = ?2 ORDER BY b.blocker",
        args![id, seq],
        |r| Ok((r.hash(0)?, state_of(r.get(1)?)?)),
    )?;
    Ok(info)
}

/// A stored state code; an unknown one is damage, not a state to guess.
fn state_of(code: i64) -> Result<ItemState> {
    ItemState::from_code(code).ok_or_else(|| Error::Queue {
        queue: String::new(),
        reason: format!("stored item state {code} is not a known state"),
    })
}

/// Counts, ages and rates for queue `id`.
fn queue_stats(r: &dyn ReadTx, id: i64, spec: QueueSpec, now: i64) -> Result<QueueStats> {
    let mut s = QueueStats {
        queue: spec.name.clone(),
        ..QueueStats::default()
    };
    // Ready and leased inputs are told apart by their time, read from the table; the
    // other states are counted from the index `queue_item_state` alone, so that a queue
    // with many dead letters costs an index range, not a table lookup per entry.
    let mut rows: Vec<(i64, Option<i64>, i64, Option<i64>)> = r.query_vec(
        concat!(
            "SELECT state, CASE WHEN claimable_at <= ?2 THEN 1 WHEN claimable_at > ?2 THEN 0 END,
                count(*), min(claimable_at) FROM queue_item
         WHERE queue_id = ?1 AND state IN (",
            state_code!(Ready),
            ", ",
            state_code!(Leased),
            ") GROUP BY 1, 2"
        ),
        args![id, now],
        |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)),
    )?;
    rows.extend(r.query_vec(
        concat!(
            "SELECT state, count(*) FROM queue_item WHERE queue_id = ?1 AND state IN (",
            state_code!(Blocked),
            ", ",
            state_code!(Dead),
            ", ",
            state_code!(Poison),
            ") GROUP BY state"
        ),
        args![id],
        |r| Ok((r.get(0)?, None, r.get(1)?, None)),
    )?);
    let mut oldest: Option<i64> = None;
    for (state, due, n, min_at) in rows {
        let n = n as u64;
        match (ItemState::from_code(state), due.map(|d| d != 0)) {
            (Some(ItemState::Ready | ItemState::Leased), Some(true)) => {
                s.ready += n;
                oldest = oldest.min(min_at).or(min_at);
            }
            (Some(ItemState::Ready), _) => s.delayed += n,
            (Some(ItemState::Leased), _) => s.leased += n,
            (Some(ItemState::Blocked), _) => s.blocked += n,
            (Some(ItemState::Dead), _) => s.dead += n,
            (Some(ItemState::Poison), _) => s.poison += n,
            (None, _) => {}
        }
    }
    s.oldest_ready_ms = oldest.map_or(0, |o| (now - o).max(0));
    s.depth = s.ready + s.delayed + s.leased + s.blocked;
    s.depth_alert = spec.alerts.max_depth;
    let counters: [i64; 7] = r.query_one(
        "SELECT completed, discarded, dropped, failed, retried, redelivered, timed_out
         FROM queue WHERE id = ?1",
        args![id],
        |r| {
            let mut c = [0; 7];
            for (at, v) in c.iter_mut().enumerate() {
                *v = r.get(at)?;
            }
            Ok(c)
        },
    )?;
    [
        &mut s.completed,
        &mut s.discarded,
        &mut s.dropped,
        &mut s.failed,
        &mut s.retried,
        &mut s.redelivered,
        &mut s.timed_out,
    ]
    .into_iter()
    .zip(counters)
    .for_each(|(field, v)| *field = v.max(0) as u64);
    let (c5, f5): (i64, i64) = r.query_one(
        "SELECT CAST(coalesce(sum(completed), 0) AS BIGINT),
                CAST(coalesce(sum(failed), 0) AS BIGINT) FROM queue_rate
         WHERE queue_id = ?1 AND minute > ?2",
        args![id, now / 60_000 - 5],
        |r| Ok((r.get(0)?, r.get(1)?)),
    )?;
    s.completed_5m = c5 as u64;
    s.failed_5m = f5 as u64;
    Ok(s)
}

/// Indexes the stored facts that bear on a new declaration, replaying them in release
/// order: inputs, completing facts and the queue's own system facts.
fn backfill(w: &mut Writer<'_>, spec: &QueueSpec, id: i64) -> Result<()> {
    let mut types: Vec<&str> = vec![spec.input_type.as_str()];
    types.extend(spec.completions.iter().map(|c| c.type_name.as_str()));
    types.extend([
        system::DEAD_LETTER,
        system::POISON,
        system::REDRIVE,
        system::DISCARD,
        system::DELIVERED,
    ]);
    let mut type_ids = Vec::new();
    for t in types {
        if let Some(tid) = w.sql().name_id(false, t)? {
            type_ids.push(tid);
        }
    }
    type_ids.sort_unstable();
    type_ids.dedup();
    if type_ids.is_empty() {
        // No fact of these types yet: nothing to back-fill (and PostgreSQL refuses an
        // empty `IN ()`, which SQLite takes as matching nothing).
        return Ok(());
    }
    let list = type_ids
        .iter()
        .map(|t| t.to_string())
        .collect::<Vec<_>>()
        .join(",");
    // The ids are integers read from our own table, so building the IN list is safe.
    let after = spec.after_seq.unwrap_or(0);
    let sql =
        format!("SELECT seq FROM fact WHERE type_id IN ({list}) AND seq > {after} ORDER BY seq");
    let seqs: Vec<i64> = w.sql().query_vec(&sql, args![], |r| r.get(0))?;
    // A page of facts and their edges toward predecessors read at once (two statements
    // for each, where a fact and the walk up from it were read one by one), then
    // replayed one by one in release order.
    for page in seqs.chunks(BACKFILL_PAGE) {
        let list = page
            .iter()
            .map(|s| s.to_string())
            .collect::<Vec<_>>()
            .join(",");
        let mut facts: HashMap<i64, Fact> = HashMap::with_capacity(page.len());
        for (seq, hash, bytes) in w.sql().query_vec(
            &format!("SELECT seq, hash, bytes FROM fact WHERE seq IN ({list})"),
            args![],
            |r| Ok((r.get::<i64>(0)?, r.hash(1)?, r.get::<Vec<u8>>(2)?)),
        )? {
            facts.insert(seq, crate::encoding::decode_fact(&bytes, Some(hash))?);
        }
        let mut preds: HashMap<i64, Vec<(FactHash, i64, i64)>> = HashMap::new();
        for (succ, hash, pred, pred_type) in w.sql().query_vec(
            &format!(
                "SELECT e.successor, f.hash, e.predecessor, e.predecessor_type
                 FROM edge e JOIN fact f ON f.seq = e.predecessor
                 WHERE e.successor IN ({list})"
            ),
            args![],
            |r| Ok((r.get::<i64>(0)?, r.hash(1)?, r.get(2)?, r.get(3)?)),
        )? {
            preds.entry(succ).or_default().push((hash, pred, pred_type));
        }
        for &seq in page {
            let fact = facts.remove(&seq).ok_or_else(|| Error::Queue {
                queue: spec.name.clone(),
                reason: format!("released fact {seq} vanished during the back-fill"),
            })?;
            let edges = preds.remove(&seq).unwrap_or_default();
            let known = |h: &FactHash| {
                edges
                    .iter()
                    .find(|(p, _, _)| p == h)
                    .map(|&(_, seq, ty)| (seq, ty))
            };
            with_index_known(w, &known, |ix| ix.queue_on_release(&fact, seq, Some(id)))?;
        }
    }
    // The inputs that fail the queue's requirements and that nothing replayed ended.
    let waiting = std::mem::take(&mut w.state::<QueueTx>().replay_poison);
    for (_, _, poison) in waiting {
        w.insert(&poison)?;
    }
    Ok(())
}

/// Facts a queue's back-fill reads at once.
const BACKFILL_PAGE: usize = 1_000;

/// An input in flight when a re-declaration rebuilt its queue's index: leased, or retried
/// (attempts made). The rebuild recreates its item row from the stored facts, as ready;
/// [`InFlight::put_back`] gives it back its lease and its retry state.
struct InFlight {
    input: i64,
    leased: bool,
    claimable_at: Option<i64>,
    attempts: i64,
    first_attempt_at: Option<i64>,
    lease_token: Option<i64>,
    last_error: Option<String>,
}

impl InFlight {
    /// Puts the lease (same token and expiry: its worker's heartbeat and completion still
    /// hold) and the attempts, first attempt and last error back on the rebuilt row, if
    /// the input is still open and ready to hand out. One the new rules block or end
    /// keeps only its attempts: its lease, if any, is lost, as a completion then says.
    fn put_back(&self, w: &mut Writer<'_>, queue: i64) -> Result<()> {
        w.state::<QueueTx>().item_updates += 1;
        w.sql().execute(
            concat!(
                "UPDATE queue_item SET attempts = ?3, first_attempt_at = ?4, last_error = ?5
                 WHERE queue_id = ?1 AND input = ?2 AND state IN (",
                state_code!(Ready),
                ", ",
                state_code!(Blocked),
                ")"
            ),
            args![
                queue,
                self.input,
                self.attempts,
                self.first_attempt_at,
                self.last_error.as_deref()
            ],
        )?;
        // A ready input keeps when it may be handed out: its lease's expiry, or the end
        // of its backoff (never earlier than the rebuild made it).
        let Some(at) = self.claimable_at else {
            return Ok(());
        };
        if self.leased {
            w.sql().execute(
                concat!(
                    "UPDATE queue_item SET state = ",
                    state_code!(Leased),
                    ", lease_token = ?3, claimable_at = ?4
                     WHERE queue_id = ?1 AND input = ?2 AND state = ",
                    state_code!(Ready)
                ),
                args![queue, self.input, self.lease_token, at],
            )?;
        } else {
            w.sql().execute(
                concat!(
                    "UPDATE queue_item SET claimable_at = ?3
                     WHERE queue_id = ?1 AND input = ?2 AND state = ",
                    state_code!(Ready),
                    " AND claimable_at < ?3"
                ),
                args![queue, self.input, at],
            )?;
        }
        Ok(())
    }
}
