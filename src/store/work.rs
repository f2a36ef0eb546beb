//! The queue API on [`Store`]: declare, claim, extend, complete, fail, release, redrive,
//! discard, list, stats and alert checks.

use rusqlite::{OptionalExtension, params};

use super::Store;
use super::queue::{QueueDef, load_defs};
use super::write::Writer;
use crate::error::{Error, Result};
use crate::fact::Fact;
use crate::hash::FactHash;
use crate::queue::{
    Breach, FailOutcome, Failure, ItemInfo, ItemState, Lease, QueueSpec, QueueStats, Semantics,
    system,
};

fn unknown(name: &str) -> Error {
    Error::UnknownQueue {
        name: name.to_string(),
    }
}

fn hash_of(bytes: Vec<u8>) -> rusqlite::Result<FactHash> {
    FactHash::from_slice(&bytes).ok_or_else(|| {
        rusqlite::Error::FromSqlConversionFailure(
            bytes.len(),
            rusqlite::types::Type::Blob,
            "hash is not 32 bytes".into(),
        )
    })
}

impl Writer<'_> {
    fn queue(&mut self, name: &str) -> Result<std::sync::Arc<super::queue::QueueDefs>> {
        let defs = self.queue_defs()?;
        if defs.by_name(name).is_none() {
            return Err(unknown(name));
        }
        Ok(defs)
    }

    /// Checks that `lease` is still the live lease on its input.
    fn check_lease(&self, lease: &Lease) -> Result<()> {
        let held = self
            .tx
            .prepare_cached("SELECT 1 FROM queue_item WHERE queue_id = ?1 AND input = ?2 AND lease_token = ?3 AND state = 1")?
            .exists(params![lease.queue_id, lease.seq, lease.token])?;
        if held {
            Ok(())
        } else {
            Err(Error::LeaseLost {
                queue: lease.queue.clone(),
                input: lease.input.hash(),
            })
        }
    }

    fn dead_letter(
        &mut self,
        q: &QueueDef,
        input: &Fact,
        reason: &str,
        attempts: i64,
        first: Option<i64>,
    ) -> Result<FactHash> {
        let now = self.clock.now_ms();
        let fact = Fact::builder(system::DEAD_LETTER)
            .field("queue", q.spec.name.as_str())
            .field("reason", reason)
            .field("attempts", attempts)
            .field("first_attempt_at", first.unwrap_or(now))
            .field("dead_at", now)
            .predecessor(system::INPUT_ROLE, input.hash())
            .build()?;
        self.insert(&fact)?;
        Ok(fact.hash())
    }

    fn poison(&mut self, q: &QueueDef, input: &Fact, reason: &str) -> Result<FactHash> {
        let fact = Fact::builder(system::POISON)
            .field("queue", q.spec.name.as_str())
            .field("reason", reason)
            .field("at", self.clock.now_ms())
            .predecessor(system::INPUT_ROLE, input.hash())
            .build()?;
        self.insert(&fact)?;
        Ok(fact.hash())
    }

    fn input_at(&self, seq: i64) -> Result<Fact> {
        let (hash, bytes): (Vec<u8>, Vec<u8>) = self
            .tx
            .prepare_cached("SELECT hash, bytes FROM fact WHERE seq = ?1")?
            .query_row([seq], |r| Ok((r.get(0)?, r.get(1)?)))?;
        let hash = hash_of(hash)?;
        super::read::fact_from_row(&hash, &bytes)
    }

    /// Claims up to `n` ready inputs of `queue` (see [`Store::claim`]).
    ///
    /// # Errors
    /// [`Error::UnknownQueue`], [`Error::Sqlite`].
    pub fn claim(&mut self, queue: &str, n: usize) -> Result<Vec<Lease>> {
        let defs = self.queue(queue)?;
        let q = defs.by_name(queue).expect("checked");
        let now = self.clock.now_ms();
        let mut leases = Vec::new();
        while leases.len() < n {
            let rows: Vec<(i64, i64, i64, Option<i64>)> = self
                .tx
                .prepare_cached(
                    "SELECT input, state, attempts, first_attempt_at FROM queue_item
                     WHERE queue_id = ?1 AND claimable_at <= ?2 ORDER BY claimable_at, input LIMIT ?3",
                )?
                .query_map(params![q.id, now, (n - leases.len()) as i64], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)))?
                .collect::<rusqlite::Result<_>>()?;
            if rows.is_empty() {
                break;
            }
            for (seq, state, attempts, first) in rows {
                let input = self.input_at(seq)?;
                let out_of_attempts = attempts >= q.spec.retry.max_attempts as i64;
                let too_old = first.is_some_and(|f| now - f >= q.spec.retry.max_age_ms);
                if out_of_attempts || too_old {
                    let why = if state == ItemState::Leased.code() {
                        "lease expired"
                    } else {
                        "retry budget exhausted"
                    };
                    let reason = format!("{why} after {attempts} attempts");
                    self.dead_letter(q, &input, &reason, attempts, first)?;
                    continue;
                }
                let token = self.ctx.rng.i64(..);
                let expires = now + q.spec.lease_ms;
                self.tx
                    .prepare_cached(
                        "UPDATE queue_item SET state = 1, attempts = attempts + 1,
                             first_attempt_at = coalesce(first_attempt_at, ?3), lease_token = ?4, claimable_at = ?5
                         WHERE queue_id = ?1 AND input = ?2",
                    )?
                    .execute(params![q.id, seq, now, token, expires])?;
                let completion = q.spec.completions[0].clone();
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
                    input,
                    attempt: attempts as u32 + 1,
                    expires_at_ms: expires,
                    queue_id: q.id,
                    seq,
                    token,
                    completion,
                });
            }
        }
        Ok(leases)
    }

    /// Completes a leased input inside this transaction, in a savepoint: on any error
    /// (lease lost, no completing fact written, the handler's own error) everything the
    /// handler wrote is rolled back and the rest of the transaction is kept. See
    /// [`Store::complete`] and [`Store::complete_batch`].
    ///
    /// # Errors
    /// [`Error::LeaseLost`], [`Error::NotCompleted`], or the handler's error.
    pub fn complete<T>(
        &mut self,
        lease: &Lease,
        handler: impl FnOnce(&mut Writer<'_>) -> Result<T>,
    ) -> Result<T> {
        self.tx
            .prepare_cached("SAVEPOINT precedent_complete")?
            .execute([])?;
        let held_before = self.held_snapshot();
        let result = self.complete_in_savepoint(lease, handler);
        match result {
            Ok(v) => {
                self.tx
                    .prepare_cached("RELEASE precedent_complete")?
                    .execute([])?;
                Ok(v)
            }
            Err(e) => {
                self.tx
                    .execute_batch("ROLLBACK TO precedent_complete; RELEASE precedent_complete")?;
                self.restore_after_rollback(held_before);
                Err(e)
            }
        }
    }

    fn complete_in_savepoint<T>(
        &mut self,
        lease: &Lease,
        handler: impl FnOnce(&mut Writer<'_>) -> Result<T>,
    ) -> Result<T> {
        let defs = self.queue(&lease.queue)?;
        let q = defs.by_name(&lease.queue).expect("checked");
        if q.spec.semantics == Semantics::AtLeastOnce {
            self.check_lease(lease)?;
        }
        let value = handler(self)?;
        let pending = self
            .tx
            .prepare_cached("SELECT 1 FROM queue_item WHERE queue_id = ?1 AND input = ?2")?
            .exists(params![lease.queue_id, lease.seq])?;
        if pending {
            return Err(Error::NotCompleted {
                queue: lease.queue.clone(),
                input: lease.input.hash(),
            });
        }
        Ok(value)
    }

    /// Fails a leased input (see [`Store::fail`]).
    ///
    /// # Errors
    /// [`Error::LeaseLost`] if the lease is no longer held.
    pub fn fail(&mut self, lease: &Lease, failure: &Failure) -> Result<FailOutcome> {
        let defs = self.queue(&lease.queue)?;
        let q = defs.by_name(&lease.queue).expect("checked");
        if q.spec.semantics == Semantics::AtMostOnce {
            return Ok(FailOutcome::Dropped);
        }
        self.check_lease(lease)?;
        self.bump_rate(q.id, "failed")?;
        let (attempts, first): (i64, Option<i64>) = self
            .tx
            .prepare_cached("SELECT attempts, first_attempt_at FROM queue_item WHERE queue_id = ?1 AND input = ?2")?
            .query_row(params![q.id, lease.seq], |r| Ok((r.get(0)?, r.get(1)?)))?;
        let now = self.clock.now_ms();
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
            Failure::Transient(reason) => {
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
                let at = now + q.spec.backoff_ms(attempts as u32, self.ctx.rng.f64());
                self.tx
                    .prepare_cached(
                        "UPDATE queue_item SET state = 0, claimable_at = ?3, lease_token = NULL, last_error = ?4
                         WHERE queue_id = ?1 AND input = ?2",
                    )?
                    .execute(params![q.id, lease.seq, at, reason])?;
                Ok(FailOutcome::Retry { at_ms: at })
            }
        }
    }
}

impl Store {
    /// Declares a queue, or changes an existing one's policy. A new queue, or one whose
    /// input type, scope or completion rules change, is back-filled: every stored fact
    /// that is an unfinished input is indexed, in release order.
    ///
    /// # Errors
    /// [`Error::Queue`] for an invalid spec; [`Error::Sqlite`].
    pub fn declare_queue(&mut self, spec: &QueueSpec) -> Result<()> {
        spec.check().map_err(|reason| Error::Queue {
            queue: spec.name.clone(),
            reason,
        })?;
        let config = serde_json::to_string(spec).expect("a spec serialises");
        self.write(|w| {
            let defs = w.queue_defs()?;
            let old = defs.by_name(&spec.name);
            let rebuild = old.is_none_or(|o| {
                o.spec.input_type != spec.input_type
                    || o.spec.scope != spec.scope
                    || o.spec.completions != spec.completions
                    || o.spec.ordering != spec.ordering
            });
            let now = w.clock.now_ms();
            let id: i64 = match old {
                Some(o) => {
                    w.tx.execute(
                        "UPDATE queue SET config = ?2 WHERE id = ?1",
                        params![o.id, config],
                    )?;
                    o.id
                }
                None => w.tx.query_row(
                    "INSERT INTO queue (name, config, created_at) VALUES (?1, ?2, ?3) RETURNING id",
                    params![spec.name, config, now],
                    |r| r.get(0),
                )?,
            };
            if rebuild {
                w.tx.execute("DELETE FROM queue_item WHERE queue_id = ?1", [id])?;
                w.tx.execute("DELETE FROM queue_block WHERE queue_id = ?1", [id])?;
            }
            w.tx.execute(
                "UPDATE counter SET value = value + 1 WHERE name = 'queues'",
                [],
            )?;
            w.queues_checked = false;
            if rebuild {
                backfill(w, spec, id)?;
            }
            Ok(())
        })
    }

    /// Removes a queue and its local state (leases, attempts). Its facts stay.
    ///
    /// # Errors
    /// [`Error::UnknownQueue`].
    pub fn drop_queue(&mut self, name: &str) -> Result<()> {
        self.write(|w| {
            let id: i64 =
                w.tx.query_row("SELECT id FROM queue WHERE name = ?1", [name], |r| r.get(0))
                    .optional()?
                    .ok_or_else(|| unknown(name))?;
            for sql in [
                "DELETE FROM queue_item WHERE queue_id = ?1",
                "DELETE FROM queue_block WHERE queue_id = ?1",
                "DELETE FROM queue_rate WHERE queue_id = ?1",
                "DELETE FROM queue WHERE id = ?1",
            ] {
                w.tx.execute(sql, [id])?;
            }
            w.tx.execute(
                "UPDATE counter SET value = value + 1 WHERE name = 'queues'",
                [],
            )?;
            Ok(())
        })
    }

    /// The declared queues.
    ///
    /// # Errors
    /// [`Error::Sqlite`].
    pub fn queues(&mut self) -> Result<Vec<QueueSpec>> {
        let defs = load_defs(&self.conn, &self.ctx.queues)?;
        self.ctx.queues = Some(defs.clone());
        Ok(defs.queues.iter().map(|q| q.spec.clone()).collect())
    }

    fn def(&mut self, name: &str) -> Result<(i64, QueueSpec)> {
        let defs = load_defs(&self.conn, &self.ctx.queues)?;
        self.ctx.queues = Some(defs.clone());
        defs.by_name(name)
            .map(|q| (q.id, q.spec.clone()))
            .ok_or_else(|| unknown(name))
    }

    /// Claims up to `n` ready inputs, oldest first, each under a lease of the queue's
    /// duration. No two live leases exist on one input, also across processes. An input
    /// whose expired lease exhausted the retry budget is dead-lettered instead.
    ///
    /// # Errors
    /// [`Error::UnknownQueue`], [`Error::Sqlite`].
    pub fn claim(&mut self, queue: &str, n: usize) -> Result<Vec<Lease>> {
        self.write(|w| w.claim(queue, n))
    }

    /// Extends a lease by the queue's lease duration from now (a heartbeat).
    ///
    /// # Errors
    /// [`Error::LeaseLost`] if it expired and another worker claimed the input.
    pub fn extend(&mut self, lease: &Lease) -> Result<Lease> {
        let (_, spec) = self.def(&lease.queue)?;
        self.write(|w| {
            w.check_lease(lease)?;
            let expires = w.clock.now_ms() + spec.lease_ms;
            w.tx.prepare_cached(
                "UPDATE queue_item SET claimable_at = ?3 WHERE queue_id = ?1 AND input = ?2",
            )?
            .execute(params![lease.queue_id, lease.seq, expires])?;
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
    /// # Errors
    /// [`Error::LeaseLost`] if the lease expired and another worker claimed the input;
    /// [`Error::NotCompleted`] if the handler wrote no completing fact; whatever the
    /// handler returns. In every error case nothing is written.
    pub fn complete<T>(
        &mut self,
        lease: &Lease,
        handler: impl FnOnce(&mut Writer<'_>) -> Result<T>,
    ) -> Result<T> {
        self.write(|w| w.complete(lease, handler))
    }

    /// Completes many leased inputs in one transaction (one commit, one fsync): each lease
    /// runs `handler` in a savepoint of its own, exactly as [`Store::complete`] would, and a
    /// lease whose handler fails (or is lost, or writes no completion) leaves nothing
    /// behind while the others still commit. Returns one result per lease, in order.
    ///
    /// # Errors
    /// The outer error is for the transaction itself ([`Error::Sqlite`]); per-lease
    /// failures are in the returned list.
    pub fn complete_batch(
        &mut self,
        leases: &[Lease],
        mut handler: impl FnMut(&mut Writer<'_>, &Lease) -> Result<()>,
    ) -> Result<Vec<Result<()>>> {
        self.write(|w| {
            Ok(leases
                .iter()
                .map(|lease| w.complete(lease, |w| handler(w, lease)))
                .collect())
        })
    }

    /// One queue's declaration.
    ///
    /// # Errors
    /// [`Error::UnknownQueue`].
    pub fn queue(&mut self, name: &str) -> Result<QueueSpec> {
        Ok(self.def(name)?.1)
    }

    /// Records a failed attempt: transient failures retry after backoff until the retry
    /// budget (attempts or age) runs out and then dead-letter; permanent failures
    /// dead-letter now; poison goes to the poison list. Dead letters and poison entries
    /// are facts, successors of the input.
    ///
    /// # Errors
    /// [`Error::LeaseLost`] if the lease is no longer held.
    pub fn fail(&mut self, lease: &Lease, failure: Failure) -> Result<FailOutcome> {
        self.write(|w| w.fail(lease, &failure))
    }

    /// Gives a leased input back without counting the attempt (a worker shutting down
    /// before it started the work).
    ///
    /// # Errors
    /// [`Error::LeaseLost`] if the lease is no longer held.
    pub fn release(&mut self, lease: Lease) -> Result<()> {
        self.write(|w| {
            w.check_lease(&lease)?;
            let now = w.clock.now_ms();
            w.tx
                .prepare_cached(
                    "UPDATE queue_item SET state = 0, claimable_at = ?3, lease_token = NULL,
                         attempts = attempts - 1,
                         first_attempt_at = CASE WHEN attempts = 1 THEN NULL ELSE first_attempt_at END
                     WHERE queue_id = ?1 AND input = ?2",
                )?
                .execute(params![lease.queue_id, lease.seq, now])?;
            Ok(())
        })
    }

    /// Sends a dead-lettered or poison input back to its queue with a fresh retry budget,
    /// by storing a redrive fact (a successor of the entry). `entry` is the dead letter or
    /// poison fact, or the input itself.
    ///
    /// # Errors
    /// [`Error::Queue`] if the input is not dead-lettered or poison in `queue`.
    pub fn redrive(&mut self, queue: &str, entry_or_input: &FactHash) -> Result<FactHash> {
        let (id, spec) = self.def(queue)?;
        let entry = self
            .entry_of(id, entry_or_input)?
            .ok_or_else(|| Error::Queue {
                queue: queue.to_string(),
                reason: format!(
                    "{entry_or_input} is not a dead-lettered or poison input of this queue"
                ),
            })?;
        let now = self.options.clock.now_ms();
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
    pub fn discard(&mut self, queue: &str, input: &FactHash, reason: &str) -> Result<FactHash> {
        let (id, spec) = self.def(queue)?;
        let input = self.input_of(id, input)?.ok_or_else(|| Error::Queue {
            queue: queue.to_string(),
            reason: format!("{input} is not an unfinished input of this queue"),
        })?;
        let now = self.options.clock.now_ms();
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
        Ok(self
            .conn
            .prepare_cached(
                "SELECT f.hash FROM queue_item i JOIN fact f ON f.seq = i.input
                 LEFT JOIN fact e ON e.seq = i.entry
                 WHERE i.queue_id = ?1 AND (f.hash = ?2 OR e.hash = ?2)",
            )?
            .query_row(params![id, &hash.0[..]], |r| hash_of(r.get(0)?))
            .optional()?)
    }

    fn entry_of(&self, id: i64, hash: &FactHash) -> Result<Option<FactHash>> {
        Ok(self
            .conn
            .prepare_cached(
                "SELECT e.hash FROM queue_item i JOIN fact f ON f.seq = i.input JOIN fact e ON e.seq = i.entry
                 WHERE i.queue_id = ?1 AND i.state IN (3, 4) AND (f.hash = ?2 OR e.hash = ?2)",
            )?
            .query_row(params![id, &hash.0[..]], |r| hash_of(r.get(0)?))
            .optional()?)
    }

    /// Unfinished inputs of a queue in one state (or all), oldest first, up to `limit`.
    ///
    /// # Errors
    /// [`Error::UnknownQueue`], [`Error::Sqlite`].
    pub fn queue_items(
        &mut self,
        queue: &str,
        state: Option<ItemState>,
        limit: usize,
    ) -> Result<Vec<ItemInfo>> {
        let (id, _) = self.def(queue)?;
        let seqs: Vec<i64> = self
            .conn
            .prepare_cached("SELECT input FROM queue_item WHERE queue_id = ?1 AND (?2 IS NULL OR state = ?2) ORDER BY input LIMIT ?3")?
            .query_map(params![id, state.map(ItemState::code), limit as i64], |r| r.get(0))?
            .collect::<rusqlite::Result<_>>()?;
        seqs.into_iter().map(|s| self.item_info(id, s)).collect()
    }

    /// One input's state in a queue, or `None` if it is not an unfinished input there
    /// (`hash` may also be its dead letter or poison entry).
    ///
    /// # Errors
    /// [`Error::UnknownQueue`], [`Error::Sqlite`].
    pub fn queue_item(&mut self, queue: &str, hash: &FactHash) -> Result<Option<ItemInfo>> {
        let (id, _) = self.def(queue)?;
        let Some(input) = self.input_of(id, hash)? else {
            return Ok(None);
        };
        let seq = self.seq_of(&input)?.expect("an item's input is released");
        self.item_info(id, seq).map(Some)
    }

    fn item_info(&self, id: i64, seq: i64) -> Result<ItemInfo> {
        let mut info = self.conn.prepare_cached(
            "SELECT f.hash, i.state, i.attempts, i.first_attempt_at, i.claimable_at, i.last_error, e.hash
             FROM queue_item i JOIN fact f ON f.seq = i.input LEFT JOIN fact e ON e.seq = i.entry
             WHERE i.queue_id = ?1 AND i.input = ?2",
        )?
        .query_row(params![id, seq], |r| {
            Ok(ItemInfo {
                input: hash_of(r.get(0)?)?,
                state: ItemState::from_code(r.get(1)?).unwrap_or(ItemState::Ready),
                attempts: r.get::<_, i64>(2)? as u32,
                first_attempt_at_ms: r.get(3)?,
                available_at_ms: r.get(4)?,
                last_error: r.get(5)?,
                entry: r.get::<_, Option<Vec<u8>>>(6)?.map(hash_of).transpose()?,
                blocked_by: Vec::new(),
            })
        })?;
        let mut stmt = self.conn.prepare_cached(
            "SELECT f.hash, i.state FROM queue_block b JOIN queue_item i ON i.queue_id = b.queue_id AND i.input = b.blocker
             JOIN fact f ON f.seq = b.blocker WHERE b.queue_id = ?1 AND b.blocked = ?2 ORDER BY b.blocker",
        )?;
        for row in stmt.query_map(params![id, seq], |r| {
            Ok((hash_of(r.get(0)?)?, r.get::<_, i64>(1)?))
        })? {
            let (h, s) = row?;
            info.blocked_by
                .push((h, ItemState::from_code(s).unwrap_or(ItemState::Ready)));
        }
        Ok(info)
    }

    /// Counts, ages and rates for a queue.
    ///
    /// # Errors
    /// [`Error::UnknownQueue`], [`Error::Sqlite`].
    pub fn queue_stats(&mut self, queue: &str) -> Result<QueueStats> {
        let (id, spec) = self.def(queue)?;
        let now = self.options.clock.now_ms();
        let mut s = QueueStats {
            queue: spec.name.clone(),
            ..QueueStats::default()
        };
        let mut stmt = self.conn.prepare_cached(
            "SELECT state, claimable_at <= ?2, count(*), min(claimable_at) FROM queue_item WHERE queue_id = ?1 GROUP BY 1, 2",
        )?;
        let rows = stmt.query_map(params![id, now], |r| {
            Ok((
                r.get::<_, i64>(0)?,
                r.get::<_, Option<bool>>(1)?,
                r.get::<_, i64>(2)?,
                r.get::<_, Option<i64>>(3)?,
            ))
        })?;
        let mut oldest: Option<i64> = None;
        for row in rows {
            let (state, due, n, min_at) = row?;
            let n = n as u64;
            match (ItemState::from_code(state), due) {
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
        let (completed, discarded): (i64, i64) = self.conn.query_row(
            "SELECT completed, discarded FROM queue WHERE id = ?1",
            [id],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )?;
        s.completed = completed as u64;
        s.discarded = discarded as u64;
        let (c5, f5): (i64, i64) = self.conn.query_row(
            "SELECT coalesce(sum(completed), 0), coalesce(sum(failed), 0) FROM queue_rate WHERE queue_id = ?1 AND minute > ?2",
            params![id, now / 60_000 - 5],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )?;
        s.completed_5m = c5 as u64;
        s.failed_5m = f5 as u64;
        Ok(s)
    }

    /// The alert thresholds of every queue (or one) that are breached now.
    ///
    /// # Errors
    /// [`Error::UnknownQueue`], [`Error::Sqlite`].
    pub fn queue_check(&mut self, only: Option<&str>) -> Result<Vec<Breach>> {
        let specs: Vec<QueueSpec> = match only {
            Some(name) => vec![self.def(name)?.1],
            None => self.queues()?,
        };
        let mut out = Vec::new();
        for spec in specs {
            let s = self.queue_stats(&spec.name)?;
            let a = &spec.alerts;
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
        }
        Ok(out)
    }
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
        if let Some(tid) = w.ctx.names.lookup(&w.tx, super::names::Kind::Type, t)? {
            type_ids.push(tid);
        }
    }
    type_ids.sort_unstable();
    type_ids.dedup();
    let list = type_ids
        .iter()
        .map(|t| t.to_string())
        .collect::<Vec<_>>()
        .join(",");
    // The ids are integers read from our own table, so building the IN list is safe.
    let sql = format!("SELECT seq, hash, bytes FROM fact WHERE type_id IN ({list}) ORDER BY seq");
    let rows: Vec<(i64, Vec<u8>, Vec<u8>)> =
        w.tx.prepare(&sql)?
            .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))?
            .collect::<rusqlite::Result<_>>()?;
    for (seq, hash, bytes) in rows {
        let hash = hash_of(hash)?;
        let fact = super::read::fact_from_row(&hash, &bytes)?;
        w.queue_on_release(&fact, seq, Some(id))?;
    }
    Ok(())
}
