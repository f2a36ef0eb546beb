//! The queue index: which inputs of which queue are unfinished, kept up to date in the
//! transaction that releases each fact. All queue SQL lives here and in `work.rs`.

use std::collections::HashSet;
use std::sync::Arc;

use rusqlite::{Connection, OptionalExtension, params};

use super::names::Kind;
use super::write::Writer;
use crate::error::{Error, Result};
use crate::fact::{Fact, Value};
use crate::hash::FactHash;
use crate::queue::{ItemState, Ordering, QueueSpec, system};

/// One declared queue.
#[derive(Debug)]
pub(crate) struct QueueDef {
    pub(crate) id: i64,
    pub(crate) spec: QueueSpec,
}

/// All declared queues, as of a value of the `queues` counter.
#[derive(Debug)]
pub(crate) struct QueueDefs {
    pub(crate) generation: i64,
    pub(crate) queues: Vec<QueueDef>,
}

impl QueueDefs {
    pub(crate) fn by_name(&self, name: &str) -> Option<&QueueDef> {
        self.queues.iter().find(|q| q.spec.name == name)
    }
}

/// Reads the declarations unless `cached` is still current.
pub(crate) fn load_defs(
    conn: &Connection,
    cached: &Option<Arc<QueueDefs>>,
) -> Result<Arc<QueueDefs>> {
    let generation: i64 = conn
        .prepare_cached("SELECT value FROM counter WHERE name = 'queues'")?
        .query_row([], |r| r.get(0))?;
    if let Some(c) = cached
        && c.generation == generation
    {
        return Ok(c.clone());
    }
    let mut stmt = conn.prepare_cached("SELECT id, name, config FROM queue ORDER BY id")?;
    let rows = stmt.query_map([], |r| {
        Ok((
            r.get::<_, i64>(0)?,
            r.get::<_, String>(1)?,
            r.get::<_, String>(2)?,
        ))
    })?;
    let mut queues = Vec::new();
    for row in rows {
        let (id, name, config) = row?;
        let spec: QueueSpec = serde_json::from_str(&config).map_err(|e| Error::Queue {
            queue: name,
            reason: format!("stored declaration does not parse: {e}"),
        })?;
        queues.push(QueueDef { id, spec });
    }
    Ok(Arc::new(QueueDefs { generation, queues }))
}

fn text_field(fact: &Fact, name: &str) -> Option<String> {
    match fact.field(name) {
        Some(Value::Text(s)) => Some(s.clone()),
        _ => None,
    }
}

fn one_pred(fact: &Fact, role: &str) -> Option<FactHash> {
    fact.predecessors()
        .get(role)
        .and_then(|s| s.iter().next().copied())
}

impl Writer<'_> {
    /// The queue declarations for this transaction.
    pub(crate) fn queue_defs(&mut self) -> Result<Arc<QueueDefs>> {
        if !self.queues_checked || self.ctx.queues.is_none() {
            let defs = load_defs(&self.tx, &self.ctx.queues)?;
            self.ctx.queues = Some(defs);
            self.queues_checked = true;
        }
        Ok(self.ctx.queues.clone().expect("loaded above"))
    }

    /// Keeps the queue index in step with a fact just released as `seq`. `only` limits the
    /// work to one queue (used when back-filling a new declaration).
    pub(crate) fn queue_on_release(
        &mut self,
        fact: &Fact,
        seq: i64,
        only: Option<i64>,
    ) -> Result<()> {
        let defs = self.queue_defs()?;
        if defs.queues.is_empty() {
            return Ok(());
        }
        for q in defs
            .queues
            .iter()
            .filter(|q| only.is_none_or(|id| id == q.id))
        {
            if q.spec.is_input(fact) {
                self.new_input(q, fact, seq)?;
            }
            for c in q
                .spec
                .completions
                .iter()
                .filter(|c| c.type_name == fact.type_name())
            {
                for input in fact.predecessors().get(&c.role).into_iter().flatten() {
                    self.end_input(q, input, End::Completed)?;
                }
            }
        }
        if fact.type_name().starts_with("precedent.") {
            self.system_fact(&defs, fact, seq, only)?;
        }
        Ok(())
    }

    fn system_fact(
        &mut self,
        defs: &QueueDefs,
        fact: &Fact,
        seq: i64,
        only: Option<i64>,
    ) -> Result<()> {
        let Some(q) = text_field(fact, "queue").and_then(|n| defs.by_name(&n)) else {
            return Ok(());
        };
        if only.is_some_and(|id| id != q.id) {
            return Ok(());
        }
        match fact.type_name() {
            system::DEAD_LETTER | system::POISON => {
                let Some(input) = one_pred(fact, system::INPUT_ROLE) else {
                    return Ok(());
                };
                let state = if fact.type_name() == system::DEAD_LETTER {
                    ItemState::Dead
                } else {
                    ItemState::Poison
                };
                let reason = text_field(fact, "reason");
                if let Some(input_seq) = self.released_seq(&input)? {
                    self.tx
                        .prepare_cached(
                            "UPDATE queue_item SET state = ?3, claimable_at = NULL, lease_token = NULL,
                                    last_error = ?4, entry = ?5
                             WHERE queue_id = ?1 AND input = ?2",
                        )?
                        .execute(params![q.id, input_seq, state.code(), reason, seq])?;
                }
            }
            system::REDRIVE => {
                let Some(entry) = one_pred(fact, system::ENTRY_ROLE) else {
                    return Ok(());
                };
                let Some(entry_fact) = self.fact_by_hash(&entry)? else {
                    return Ok(());
                };
                let Some(input) = one_pred(&entry_fact, system::INPUT_ROLE) else {
                    return Ok(());
                };
                let Some(input_seq) = self.released_seq(&input)? else {
                    return Ok(());
                };
                let Some(entry_seq) = self.released_seq(&entry)? else {
                    return Ok(());
                };
                let now = self.clock.now_ms();
                self.tx
                    .prepare_cached(
                        "UPDATE queue_item SET
                             state = CASE WHEN blockers > 0 THEN 2 ELSE 0 END,
                             claimable_at = CASE WHEN blockers > 0 THEN NULL ELSE ?4 END,
                             attempts = 0, first_attempt_at = NULL, lease_token = NULL,
                             last_error = NULL, entry = NULL
                         WHERE queue_id = ?1 AND input = ?2 AND entry = ?3 AND state IN (3, 4)",
                    )?
                    .execute(params![q.id, input_seq, entry_seq, now])?;
            }
            system::DISCARD => {
                if let Some(input) = one_pred(fact, system::INPUT_ROLE) {
                    self.end_input(q, &input, End::Discarded)?;
                }
            }
            system::DELIVERED => {
                if let Some(input) = one_pred(fact, system::INPUT_ROLE) {
                    self.end_input(q, &input, End::Completed)?;
                }
            }
            _ => {}
        }
        Ok(())
    }

    pub(crate) fn fact_by_hash(&self, hash: &FactHash) -> Result<Option<Fact>> {
        let bytes: Option<Vec<u8>> = self
            .tx
            .prepare_cached("SELECT bytes FROM fact WHERE hash = ?1")?
            .query_row([&hash.0[..]], |r| r.get(0))
            .optional()?;
        bytes
            .map(|b| super::read::fact_from_row(hash, &b))
            .transpose()
    }

    /// Records a new input: blocked behind unfinished ancestor inputs (causal ordering),
    /// poison if it fails the field requirements, ready otherwise.
    fn new_input(&mut self, q: &QueueDef, fact: &Fact, seq: i64) -> Result<()> {
        let blockers = match q.spec.ordering {
            Ordering::Causal => self.unfinished_ancestor_inputs(q, seq)?,
            Ordering::None => Vec::new(),
        };
        let now = self.clock.now_ms();
        let (state, claimable) = if blockers.is_empty() {
            (ItemState::Ready, Some(now))
        } else {
            (ItemState::Blocked, None)
        };
        let added = self
            .tx
            .prepare_cached(
                "INSERT OR IGNORE INTO queue_item (queue_id, input, state, claimable_at, blockers)
                 VALUES (?1, ?2, ?3, ?4, ?5)",
            )?
            .execute(params![
                q.id,
                seq,
                state.code(),
                claimable,
                blockers.len() as i64
            ])?;
        if added == 0 {
            return Ok(());
        }
        let mut block = self.tx.prepare_cached(
            "INSERT INTO queue_block (queue_id, blocker, blocked) VALUES (?1, ?2, ?3)",
        )?;
        for b in &blockers {
            block.execute(params![q.id, b, seq])?;
        }
        drop(block);
        if let Some(reason) = q.spec.unmet_requirement(fact) {
            let poison = Fact::builder(system::POISON)
                .field("queue", q.spec.name.as_str())
                .field("reason", reason)
                .field("at", now)
                .predecessor(system::INPUT_ROLE, fact.hash())
                .build()?;
            self.insert(&poison)?;
        }
        Ok(())
    }

    /// The nearest unfinished inputs of `q` among the ancestors of `seq`: a walk up the
    /// predecessor edges that stops at every input of the queue, finished or not.
    fn unfinished_ancestor_inputs(&mut self, q: &QueueDef, seq: i64) -> Result<Vec<i64>> {
        let Some(input_type) = self
            .ctx
            .names
            .lookup(&self.tx, Kind::Type, &q.spec.input_type)?
        else {
            return Ok(Vec::new());
        };
        let scope = match &q.spec.scope {
            Some(h) => self.released_seq(h)?,
            None => None,
        };
        // The edge carries the predecessor's type: the walk reads `edge_by_successor` alone.
        let mut up = self.tx.prepare_cached(
            "SELECT predecessor, predecessor_type FROM edge WHERE successor = ?1",
        )?;
        let mut in_scope = self
            .tx
            .prepare_cached("SELECT 1 FROM edge WHERE successor = ?1 AND predecessor = ?2")?;
        let mut unfinished = self
            .tx
            .prepare_cached("SELECT 1 FROM queue_item WHERE queue_id = ?1 AND input = ?2")?;
        let mut seen = HashSet::new();
        let mut stack = vec![seq];
        let mut found = Vec::new();
        while let Some(s) = stack.pop() {
            let parents: Vec<(i64, i64)> = up
                .query_map([s], |r| Ok((r.get(0)?, r.get(1)?)))?
                .collect::<rusqlite::Result<_>>()?;
            for (p, type_id) in parents {
                if !seen.insert(p) {
                    continue;
                }
                let is_input = type_id == input_type
                    && match (q.spec.scope, scope) {
                        (None, _) => true,
                        (Some(_), Some(sc)) => in_scope.exists(params![p, sc])?,
                        (Some(_), None) => false,
                    };
                if !is_input {
                    stack.push(p);
                } else if unfinished.exists(params![q.id, p])? {
                    found.push(p);
                }
            }
        }
        found.sort_unstable();
        Ok(found)
    }

    /// Ends an input: drops its local state and unblocks the inputs that waited for it.
    pub(crate) fn end_input(&mut self, q: &QueueDef, input: &FactHash, how: End) -> Result<()> {
        let Some(seq) = self.released_seq(input)? else {
            return Ok(());
        };
        let removed = self
            .tx
            .prepare_cached("DELETE FROM queue_item WHERE queue_id = ?1 AND input = ?2")?
            .execute(params![q.id, seq])?;
        if removed == 0 {
            return Ok(());
        }
        self.tx
            .prepare_cached("DELETE FROM queue_block WHERE queue_id = ?1 AND blocked = ?2")?
            .execute(params![q.id, seq])?;
        let waiting: Vec<i64> = self
            .tx
            .prepare_cached(
                "DELETE FROM queue_block WHERE queue_id = ?1 AND blocker = ?2 RETURNING blocked",
            )?
            .query_map(params![q.id, seq], |r| r.get(0))?
            .collect::<rusqlite::Result<_>>()?;
        let now = self.clock.now_ms();
        for blocked in waiting {
            self.tx
                .prepare_cached(
                    "UPDATE queue_item SET blockers = blockers - 1,
                         state = CASE WHEN blockers = 1 AND state = 2 THEN 0 ELSE state END,
                         claimable_at = CASE WHEN blockers = 1 AND state = 2 THEN ?3 ELSE claimable_at END
                     WHERE queue_id = ?1 AND input = ?2",
                )?
                .execute(params![q.id, blocked, now])?;
        }
        let column = match how {
            End::Completed => "UPDATE queue SET completed = completed + 1 WHERE id = ?1",
            End::Discarded => "UPDATE queue SET discarded = discarded + 1 WHERE id = ?1",
        };
        self.tx.prepare_cached(column)?.execute([q.id])?;
        if how == End::Completed {
            self.bump_rate(q.id, "completed")?;
        }
        Ok(())
    }

    /// Counts a completion or failure for the per-minute rates. Kept in memory and
    /// written once at commit ([`Writer::flush_rates`]), not per input.
    pub(crate) fn bump_rate(&mut self, queue_id: i64, what: &str) -> Result<()> {
        let minute = self.clock.now_ms() / 60_000;
        let completed = i64::from(what == "completed");
        self.rates
            .push((queue_id, minute, completed, 1 - completed));
        Ok(())
    }

    /// Writes the rate counts gathered in this transaction and drops buckets older than an
    /// hour.
    pub(crate) fn flush_rates(&mut self) -> Result<()> {
        if self.rates.is_empty() {
            return Ok(());
        }
        let mut sums: std::collections::BTreeMap<(i64, i64), (i64, i64)> = Default::default();
        for (q, minute, c, f) in self.rates.drain(..) {
            let e = sums.entry((q, minute)).or_default();
            e.0 += c;
            e.1 += f;
        }
        for ((q, minute), (c, f)) in &sums {
            self.tx
                .prepare_cached(
                    "INSERT INTO queue_rate (queue_id, minute, completed, failed) VALUES (?1, ?2, ?3, ?4)
                     ON CONFLICT (queue_id, minute)
                     DO UPDATE SET completed = completed + ?3, failed = failed + ?4",
                )?
                .execute(params![q, minute, c, f])?;
            self.tx
                .prepare_cached("DELETE FROM queue_rate WHERE queue_id = ?1 AND minute < ?2")?
                .execute(params![q, minute - 60])?;
        }
        Ok(())
    }
}

/// How an input ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum End {
    Completed,
    Discarded,
}
