//! Writes on PostgreSQL: idempotent insert, holding facts whose ancestors are missing,
//! and releasing them (cascading) in the transaction that completes their ancestry; the
//! same steps as the SQLite backend's, under the write lock.
//!
//! The transaction runs READ COMMITTED. Before its first fact insert or held-set change,
//! or when it first reads the highest seq, it takes the advisory lock
//! [`super::WRITE_LOCK`] (to its commit) and reads the `held` and `seq` counters: every
//! statement after it sees every write committed before, so
//! "is this predecessor released?" and "who waits for this fact?" are answered for the
//! one writer at a time, and release numbers continue the last committed one. A
//! transaction that writes only client tables (a queue claim) never takes it.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;

use super::conn::Tx;
use super::names::Fresh;
use super::read::hash_at;
use super::{PgBackend, WRITE_LOCK};
use crate::error::{BackendError, BackendErrorKind, Error, Result};
use crate::fact::Fact;
use crate::hash::FactHash;
use crate::store::backend::{HookRunner, ReadTx, WriteTx};
use crate::store::steps::{
    Assumed, BatchHeld, Missing, Pred, held_fact, released_predecessors, split_predecessors,
};
use crate::store::{BatchReport, InsertOutcome};

/// What the write lock guards, read when it is taken.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct Locked {
    /// Held facts now.
    pub(super) held: i64,
    /// The last release sequence number given.
    pub(super) seq: i64,
}

/// What rolling back to a savepoint restores: the counters (a lock taken inside it is
/// given back with it) and how many facts the transaction had released.
pub(super) type Mark = (Option<Locked>, usize);

/// The write transaction of a PostgreSQL store.
pub(crate) struct PgWrite<'a> {
    pub(super) tx: Tx<'a>,
    pub(super) names: Fresh,
    /// The counters under the write lock, once it is taken (a cell: reading the highest
    /// seq takes the lock, through a shared reference).
    pub(super) locked: Cell<Option<Locked>>,
    /// The counters when the lock was taken, to write back only a change.
    pub(super) at_lock: Cell<Locked>,
    /// The other rows of `counter` when the lock was taken ([`ReadTx::counter_at_lock`]).
    others_at_lock: RefCell<Vec<(String, i64)>>,
    /// The mark of each open savepoint of the caller's.
    savepoints: Vec<Mark>,
    /// The savepoint of a batch guessed new ([`PgWrite::insert_many`]) is open: it is
    /// released by the next one, by a savepoint of the caller's, or by the commit.
    pub(super) guess_open: bool,
    /// The savepoint of a stream guessed new went with the lock's statement
    /// ([`WriteTx::last_seq_before_stream`]): what rolling back to it restores, and the
    /// transaction's statements then. A stream that follows with no statement in between
    /// takes it as its own.
    pub(super) guess_at_lock: Option<(Mark, u64)>,
    /// A batch guessed new is being written ([`PgWrite::flush`]).
    pub(super) guessing: bool,
    /// A fact of the batch guessed new was stored already.
    pub(super) guess_failed: bool,
    /// What this transaction released, as (seq, type id), for [`super::recent`] once it
    /// commits.
    pub(super) released: Vec<(FactHash, (i64, i64))>,
    /// During a batch, its facts that are held, with their `held` row ids.
    pub(super) batch_held: Option<BatchHeld>,
    /// Facts the caller said are released, as (seq, type id).
    pub(super) assumed: Assumed,
    /// During a batch, the facts it released, as (seq, type id): a later fact of the
    /// batch naming one needs no lookup (a round trip each on PostgreSQL).
    pub(super) batch_released: Option<Assumed>,
}

crate::store::shared::forward_to_tx!(sql PgWrite<'_>);

impl ReadTx for PgWrite<'_> {
    crate::store::shared::forward_to_tx!(reads);

    fn counter_at_lock(&self, name: &str) -> Option<i64> {
        // A lock rolled back with a savepoint is taken again, and the rows read again.
        self.locked.get()?;
        let others = self.others_at_lock.borrow();
        others.iter().find(|(n, _)| n == name).map(|&(_, v)| v)
    }

    fn held_count(&self) -> Result<u64> {
        match self.locked.get() {
            Some(l) => Ok(l.held as u64),
            None => self.tx.held_count(),
        }
    }

    /// Under the write lock the counter read with it, plus what this transaction
    /// released, is the highest seq: no round trip. Before it, the lock is taken: a write
    /// transaction asks for the highest seq to tell what it then writes from what was
    /// there (a push, a pull), which only the lock keeps apart, and it takes the lock
    /// to write anyway; on SQLite a write transaction holds the one writer from its start.
    fn last_seq(&self) -> Result<i64> {
        Ok(self.lock()?.seq)
    }
}

impl WriteTx for PgWrite<'_> {
    fn insert(&mut self, fact: &Fact, hooks: &mut HookRunner<'_>) -> Result<InsertOutcome> {
        self.lock()?;
        self.insert_one(fact, hooks)
    }

    fn insert_batch(
        &mut self,
        facts: Vec<Fact>,
        hooks: &mut HookRunner<'_>,
    ) -> Result<BatchReport> {
        self.lock()?;
        self.insert_many(facts, hooks)
    }

    fn insert_streamed(
        &mut self,
        facts: &mut dyn Iterator<Item = Fact>,
        hint: usize,
        hooks: &mut HookRunner<'_>,
    ) -> Result<BatchReport> {
        self.lock()?;
        self.insert_stream(facts, hint, hooks)
    }

    fn last_seq_before_stream(&mut self, hint: usize) -> Result<i64> {
        if self.locked.get().is_some() || !self.may_stream(hint) {
            return Ok(self.lock()?.seq);
        }
        // The stream's savepoint, after the lock and the counters, in their round trip.
        let savepoint = if self.guess_open {
            "RELEASE SAVEPOINT precedent_guess; SAVEPOINT precedent_guess"
        } else {
            "SAVEPOINT precedent_guess"
        };
        let locked = self.lock_then(Some(savepoint))?;
        self.guess_open = true;
        self.guess_at_lock = Some((self.mark(), self.tx.statements()));
        Ok(locked.seq)
    }

    fn drop_held(&mut self, hashes: &[FactHash]) -> Result<Vec<FactHash>> {
        self.lock()?;
        self.drop_held_hashes(hashes)
    }

    fn drop_held_before(&mut self, held_at_ms: i64) -> Result<Vec<FactHash>> {
        self.lock()?;
        self.drop_held_older(held_at_ms)
    }

    fn savepoint(&mut self) -> Result<()> {
        // A batch's savepoint is never left open under one of the caller's.
        if std::mem::take(&mut self.guess_open) {
            self.tx
                .simple("RELEASE SAVEPOINT precedent_guess; SAVEPOINT precedent")?;
        } else {
            self.tx.simple("SAVEPOINT precedent")?;
        }
        let mark = self.mark();
        self.savepoints.push(mark);
        Ok(())
    }

    fn release_savepoint(&mut self) -> Result<()> {
        // Releases a batch's savepoint opened inside it too.
        self.tx.simple("RELEASE SAVEPOINT precedent")?;
        self.guess_open = false;
        self.savepoints.pop();
        Ok(())
    }

    fn rollback_savepoint(&mut self) -> Result<()> {
        self.tx
            .simple("ROLLBACK TO SAVEPOINT precedent; RELEASE SAVEPOINT precedent")?;
        self.guess_open = false;
        if let Some(mark) = self.savepoints.pop() {
            self.back_to(mark);
        }
        self.names.forget();
        self.assumed.clear();
        if let Some(batch) = &mut self.batch_released {
            batch.clear();
        }
        Ok(())
    }

    fn assume_released(&mut self, fact: &Fact, seq: i64) -> Result<()> {
        self.lock()?;
        let type_id = self.names.id(&self.tx, false, fact.type_name())?;
        self.assumed.insert(fact.hash(), (seq, type_id));
        Ok(())
    }

    fn as_read(&self) -> &dyn ReadTx {
        self
    }

    fn write_ahead(&mut self, on: bool) -> Result<bool> {
        if !on {
            self.tx.send_ahead()?;
        }
        self.tx.ahead.borrow_mut().on = on;
        Ok(true)
    }

    fn ahead_lost(&self) -> bool {
        self.tx.ahead.borrow().lost
    }

    fn commit(mut self: Box<Self>) -> Result<()> {
        // The counters, the notice and the `COMMIT` in one round trip: numbers and the
        // channel's fixed name written into the text (a simple query takes no parameters).
        let at_lock = self.at_lock.get();
        if let Some(now) = self.locked.get().filter(|now| now.seq != at_lock.seq) {
            // Facts were released: both counters (`held` rewritten only if it changed)
            // and the notice. The notice is delivered at the commit, in commit order, to
            // every store listening on this database (`notify.rs`); nothing if the
            // commit fails.
            let (held, seq) = (now.held, now.seq);
            self.tx.finish_after(&format!(
                "WITH h AS (UPDATE counter SET value = {held} WHERE name = 'held' AND value <> {held}),
                 s AS (UPDATE counter SET value = {seq} WHERE name = 'seq')
                 SELECT pg_notify('{}', '{seq}')",
                crate::store::NOTIFY_CHANNEL
            ))?;
        } else if let Some(now) = self.locked.get().filter(|now| now.held != at_lock.held) {
            self.tx.finish_after(&format!(
                "UPDATE counter SET value = {} WHERE name = 'held'",
                now.held
            ))?;
        } else {
            self.tx.commit()?;
        }
        let names = std::mem::take(&mut self.names);
        let shared = &self.tx.backend.shared;
        shared.names.commit(names);
        shared.recent.add(std::mem::take(&mut self.released));
        Ok(())
    }
}

impl<'a> PgWrite<'a> {
    /// Begins a write transaction (READ COMMITTED; the lock is taken at the first write
    /// of facts).
    pub(super) fn begin(backend: &'a PgBackend) -> Result<PgWrite<'a>> {
        Ok(PgWrite {
            tx: Tx::begin_with_first(backend, "BEGIN ISOLATION LEVEL READ COMMITTED")?,
            names: Fresh::default(),
            locked: Cell::new(None),
            at_lock: Cell::new(Locked::default()),
            others_at_lock: RefCell::default(),
            savepoints: Vec::new(),
            guess_open: false,
            guess_at_lock: None,
            guessing: false,
            guess_failed: false,
            released: Vec::new(),
            batch_held: None,
            assumed: HashMap::default(),
            batch_released: None,
        })
    }

    /// Takes the write lock, if this transaction has not, and reads the counters it
    /// guards. Waits up to the busy timeout (`lock_timeout`), then fails as busy.
    pub(super) fn lock(&self) -> Result<Locked> {
        self.lock_then(None)
    }

    /// [`PgWrite::lock`], with `then` (statements without parameters and rows) after it
    /// in the same round trip if the lock is taken now.
    fn lock_then(&self, then: Option<&str>) -> Result<Locked> {
        if let Some(l) = self.locked.get() {
            return Ok(l);
        }
        // The counters in a statement of their own, so that their snapshot is taken
        // after the lock is granted; both statements in one round trip.
        let mut l = Locked::default();
        let mut sql = format!(
            "SELECT pg_advisory_xact_lock({WRITE_LOCK});
             SELECT name, value FROM counter"
        );
        if let Some(then) = then {
            sql = format!("{sql}; {then}");
        }
        let mut others = Vec::new();
        for row in self.tx.simple_rows(&sql)? {
            if row.columns().len() != 2 {
                // The lock's own row (`pg_advisory_xact_lock` returns void).
                continue;
            }
            let value = || -> Result<i64> {
                row.get(1).and_then(|v| v.parse().ok()).ok_or_else(|| {
                    Error::Backend(BackendError::new(
                        BackendErrorKind::Other,
                        format!("postgres: counter {:?} reads {:?}", row.get(0), row.get(1)),
                    ))
                })
            };
            match row.get(0) {
                Some("held") => l.held = value()?,
                Some("seq") => l.seq = value()?,
                Some(name) => others.push((name.to_string(), value()?)),
                None => {}
            }
        }
        *self.others_at_lock.borrow_mut() = others;
        let shared = &self.tx.backend.shared;
        if shared.recent.database_at(l.seq) {
            // A restore of an older backup takes the type and role ids made since with it,
            // and its identity sequences hand them out again, to other names.
            shared.names.forget();
            // And the `edge_more` partitions made since.
            shared
                .partitions
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .clear();
        }
        self.locked.set(Some(l));
        self.at_lock.set(l);
        Ok(l)
    }

    /// Where the transaction stands, for a savepoint opened now.
    pub(super) fn mark(&self) -> Mark {
        (self.locked.get(), self.released.len())
    }

    /// What rolling back to the savepoint of `mark` undid, undone here too: the counters
    /// and the releases since.
    pub(super) fn back_to(&mut self, (locked, released): Mark) {
        self.locked.set(locked);
        self.released.truncate(released);
    }

    pub(super) fn counters(&mut self) -> &mut Locked {
        self.locked
            .get_mut()
            .as_mut()
            .expect("the write lock is taken first")
    }

    pub(super) fn add_held(&mut self, n: i64) {
        self.counters().held += n;
    }

    /// See [`crate::Store::insert`]: as on SQLite, a new fact is not looked up first.
    fn insert_one(&mut self, fact: &Fact, hooks: &mut HookRunner<'_>) -> Result<InsertOutcome> {
        let (preds, missing) = split_predecessors(
            fact,
            self.batch_held.as_ref(),
            &self.assumed,
            &mut |h| match self.batch_released.as_ref().and_then(|b| b.get(h)) {
                Some(&known) => Ok(Some(known)),
                None => self.released(h),
            },
        )?;
        if !missing.is_empty() {
            return self.hold(fact, missing);
        }
        match self.write_released(fact, &preds, hooks)? {
            None => Ok(InsertOutcome::Duplicate {
                seq: self.tx.seq_of(&fact.hash())?,
            }),
            Some((seq, ty)) => {
                let released = 1 + self.cascade(fact.hash(), (seq, ty), hooks)?;
                Ok(InsertOutcome::Inserted { seq, released })
            }
        }
    }

    /// The seq and type id of `hash`, if released.
    fn released(&self, hash: &FactHash) -> Result<Option<(i64, i64)>> {
        let row = self.tx.row(
            "SELECT seq, type_id FROM fact WHERE hash = $1",
            &[&&hash.0[..]],
        )?;
        Ok(row.map(|r| (r.get(0), r.get(1))))
    }

    /// The held row id of `hash`, if it is held.
    pub(super) fn held_id(&self, hash: &FactHash) -> Result<Option<(i64, Vec<u8>)>> {
        let row = self.tx.row(
            "SELECT id, bytes FROM held WHERE substr(hash, 1, 8) = substr($1::bytea, 1, 8) AND hash = $1",
            &[&&hash.0[..]],
        )?;
        Ok(row.map(|r| (r.get(0), r.get(1))))
    }

    /// Holds `fact` waiting for `missing` (with the held row id of each that is held in
    /// this batch: that wait goes to `held_child`; the others to `held_wait`).
    pub(super) fn hold(&mut self, fact: &Fact, missing: Vec<Missing>) -> Result<InsertOutcome> {
        let hash = fact.hash();
        if self.held_id(&hash)?.is_some() {
            return Ok(InsertOutcome::Duplicate { seq: None });
        }
        let max = self.tx.backend.shared.options.max_held;
        if self.counters().held as u64 >= max {
            return Err(Error::HeldLimit { limit: max, hash });
        }
        let now = self.tx.backend.shared.options.clock.now_ms();
        let id: i64 = self.tx.rows(
            "INSERT INTO held (hash, bytes, missing, held_at) VALUES ($1, $2, $3, $4) RETURNING id",
            &[
                &&hash.0[..],
                &fact.canonical_bytes(),
                &(missing.len() as i64),
                &now,
            ],
        )?[0]
            .get(0);
        if let Some(batch) = &mut self.batch_held {
            batch.insert(hash, id);
        }
        for (m, parent) in &missing {
            match parent {
                Some(parent) => self.tx.exec(
                    "INSERT INTO held_child (parent, waiter) VALUES ($1, $2)",
                    &[parent, &id],
                )?,
                None => self.tx.exec(
                    "INSERT INTO held_wait (missing, waiter) VALUES ($1, $2)",
                    &[&&m.0[..], &id],
                )?,
            };
        }
        self.add_held(1);
        Ok(InsertOutcome::Held {
            missing: missing.into_iter().map(|(m, _)| m).collect(),
        })
    }

    /// Writes a fact whose predecessors are all released, with the next sequence number,
    /// its edges, and calls the release hooks; `None` if it was released already.
    fn write_released(
        &mut self,
        fact: &Fact,
        preds: &[Pred<'_>],
        hooks: &mut HookRunner<'_>,
    ) -> Result<Option<(i64, i64)>> {
        let type_id = self.names.id(&self.tx, false, fact.type_name())?;
        let seq = self.counters().seq + 1;
        let (mut pred_seqs, mut roles, mut pred_types) = (vec![], vec![], vec![]);
        for (role, _, pred_seq, pred_type) in preds {
            pred_seqs.push(*pred_seq);
            roles.push(self.names.id(&self.tx, true, role)?);
            pred_types.push(*pred_type);
        }
        let hash = fact.hash();
        let ahead = {
            let a = self.tx.ahead.borrow();
            a.on && !a.hashes.contains(&hash)
        };
        if ahead {
            // Taken to be new; sent with the next statement (`conn::Ahead`).
            let edges: Vec<(i64, FactHash, i64, i64)> = preds
                .iter()
                .zip(&roles)
                .map(|(p, &role)| (role, p.1, p.2, p.3))
                .collect();
            let full = {
                let mut a = self.tx.ahead.borrow_mut();
                a.run.push(fact.clone(), seq, type_id, &edges);
                a.hashes.insert(hash);
                a.run.len() >= super::batch::RUN
            };
            if full {
                self.tx.send_ahead()?;
            }
        } else if !self.write_row(fact, seq, type_id, (&pred_seqs, &roles, &pred_types))? {
            return Ok(None);
        }
        self.counters().seq = seq;
        if let Some(batch) = &mut self.batch_released {
            batch.insert(fact.hash(), (seq, type_id));
        }
        self.released.push((hash, (seq, type_id)));
        let known = |h: &FactHash| preds.iter().find(|p| p.1 == *h).map(|p| (p.2, p.3));
        // The transaction itself, not its connection: hooks read what it knows, such as the
        // counters read with the write lock (`ReadTx::counter_at_lock`).
        hooks.released(&*self, fact, seq, &known)?;
        Ok(Some((seq, type_id)))
    }

    /// Writes a released fact's row and edges in one statement (one round trip, not one
    /// per edge); `false` if it was stored already.
    fn write_row(
        &self,
        fact: &Fact,
        seq: i64,
        type_id: i64,
        (pred_seqs, roles, pred_types): (&[i64], &[i64], &[i64]),
    ) -> Result<bool> {
        // The first edge in the fact's row, the others in `edge_more` (schema version 7),
        // whose partitions for their roles are made first.
        let more = |v: &[i64]| v.get(1..).unwrap_or_default().to_vec();
        let (more_seqs, more_roles, more_types) = (more(pred_seqs), more(roles), more(pred_types));
        self.tx.more_partitions(&more_roles)?;
        let added: i64 = self.tx.rows(
            "WITH f AS (
                 INSERT INTO fact (seq, hash, type_id, bytes, p1, p1_role, p1_type)
                 VALUES ($1, $2, $3, $4, $5, $6, $7)
                 ON CONFLICT (hash) DO NOTHING RETURNING seq),
             e AS (
                 INSERT INTO edge_more (predecessor, role_id, successor_type, successor, predecessor_type, successor_hash)
                 SELECT u.p, u.r, $3, f.seq, u.t, $2
                 FROM f, unnest($8::bigint[], $9::bigint[], $10::bigint[]) AS u(p, r, t))
             SELECT count(*) FROM f",
            &[
                &seq,
                &&fact.hash().0[..],
                &type_id,
                &fact.canonical_bytes(),
                &pred_seqs.first(),
                &roles.first(),
                &pred_types.first(),
                &more_seqs,
                &more_roles,
                &more_types,
            ],
        )?[0]
            .get(0);
        Ok(added != 0)
    }

    /// Releases every held fact that waited only for `first` or for facts this releases,
    /// depth first, removing their held rows and waits as it goes; returns how many.
    pub(super) fn cascade(
        &mut self,
        first: FactHash,
        first_at: (i64, i64),
        hooks: &mut HookRunner<'_>,
    ) -> Result<u64> {
        if self.counters().held == 0 {
            return Ok(0);
        }
        let mut released = 0;
        let mut stack = vec![(first, first_at, None::<i64>)];
        while let Some((arrived, at, held_id)) = stack.pop() {
            let mut waiters: Vec<i64> = self
                .tx
                .rows(
                    "DELETE FROM held_wait WHERE missing = $1 RETURNING waiter",
                    &[&&arrived.0[..]],
                )?
                .iter()
                .map(|r| r.get(0))
                .collect();
            // In key order, as SQLite reads them: waits by hash, then by held parent.
            waiters.sort_unstable();
            if let Some(parent) = held_id {
                let mut children: Vec<i64> = self
                    .tx
                    .rows(
                        "DELETE FROM held_child WHERE parent = $1 RETURNING waiter",
                        &[&parent],
                    )?
                    .iter()
                    .map(|r| r.get(0))
                    .collect();
                children.sort_unstable();
                waiters.extend(children);
            }
            for waiter in waiters {
                // One arrival less to wait for; at zero the row goes and the fact is
                // released.
                let row = self.tx.row(
                    "UPDATE held SET missing = missing - 1 WHERE id = $1 AND missing > 1
                         RETURNING id",
                    &[&waiter],
                )?;
                if row.is_some() {
                    continue;
                }
                let Some(row) = self.tx.row(
                    "DELETE FROM held WHERE id = $1 RETURNING hash, bytes",
                    &[&waiter],
                )?
                else {
                    return Err(Error::Corrupt {
                        hash: arrived,
                        reason: format!("a wait record names held row {waiter}, which is absent"),
                    });
                };
                let hash = hash_at(&row, 0)?;
                let at = self.release_held(&hash, row.get(1), (arrived, at), hooks)?;
                released += 1;
                stack.push((hash, at, Some(waiter)));
            }
        }
        Ok(released)
    }

    /// Moves a held fact whose ancestors are all released into the fact table; `arrived`
    /// is the predecessor whose release completed it, with its seq and type id.
    fn release_held(
        &mut self,
        hash: &FactHash,
        bytes: &[u8],
        arrived: (FactHash, (i64, i64)),
        hooks: &mut HookRunner<'_>,
    ) -> Result<(i64, i64)> {
        let fact = held_fact(hash, bytes)?;
        let preds = released_predecessors(hash, &fact, arrived, &mut |p| self.released(p))?;
        self.add_held(-1);
        if let Some(batch) = &mut self.batch_held {
            batch.remove(hash);
        }
        match self.write_released(&fact, &preds, hooks)? {
            Some(at) => Ok(at),
            None => self.released(hash)?.ok_or_else(|| Error::Corrupt {
                hash: *hash,
                reason: "neither inserted nor found released".into(),
            }),
        }
    }
}
