//! The queue index: which inputs of which queue are unfinished, kept up to date in the
//! transaction that releases each fact by a release hook ([`QueueIndex`]), through the
//! store's seam. All queue SQL lives here and in `work.rs`.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};

use crate::args;
use crate::error::{Error, Result};
use crate::fact::{Fact, Value};
use crate::hash::FactHash;
use crate::queue::{ItemState, Ordering, QueueSpec, state_code, system};
use crate::store::{Dialect, HookCtx, ReadTx, ReleaseHook, SqlExt, StoreOptions, TxState};

/// The release hook that keeps the queue index.
#[derive(Debug, Default)]
pub(crate) struct QueueIndex;

impl Default for StoreOptions {
    /// The defaults: at most 1,000,000 held facts, [`crate::store::Durability::Full`],
    /// a 64 MiB cache, a 5 s busy timeout, the system clock, and the queue index as the
    /// release hook. (Written here, beside the index, since the core knows no queue.)
    fn default() -> StoreOptions {
        StoreOptions {
            release_hooks: vec![Arc::new(QueueIndex)],
            ..StoreOptions::bare()
        }
    }
}

impl ReleaseHook for QueueIndex {
    fn on_release(&self, ctx: &mut HookCtx<'_>, fact: &Fact, seq: i64) -> Result<()> {
        // A store with no queue pays one lookup per released fact once the transaction
        // has read the declarations (a load of a million facts releases a million).
        if ctx
            .state
            .get::<QueueTx>()
            .defs
            .as_ref()
            .is_some_and(|d| d.queues.is_empty())
        {
            return Ok(());
        }
        let cache = ctx.store().extension::<QueueCache>();
        let now = ctx.now_ms();
        let mut q = Ix {
            tx: ctx.tx,
            now,
            state: ctx.state,
            cache: &cache,
            later: Vec::new(),
            known: ctx.predecessors,
            replay: false,
        };
        q.queue_on_release(fact, seq, None)?;
        for f in q.later {
            ctx.insert_later(f);
        }
        Ok(())
    }

    fn idle(&self, ctx: &mut HookCtx<'_>) -> Result<bool> {
        // Declarations change only through the queue API, never by a release.
        let cache = ctx.store().extension::<QueueCache>();
        Ok(defs_for(ctx.tx, ctx.state, &cache)?.queues.is_empty())
    }

    fn before_commit(&self, ctx: &mut HookCtx<'_>) -> Result<()> {
        flush_pending(ctx.tx, ctx.state)?;
        flush_rates(ctx.tx, ctx.state)
    }

    // A fact's inputs and completions are looked up through its ancestors (the walk for
    // unfinished ancestor inputs, the inputs it ends) and the queue's own tables, never
    // through its descendants: a later fact of the same run written first changes
    // nothing the hook reads for this one.
    fn in_runs(&self) -> bool {
        true
    }

    fn savepoint_opened(&self, state: &mut TxState) {
        let qtx = state.get::<QueueTx>();
        let mark = Mark {
            rates: qtx.rates.len(),
            ended: qtx.ended.len(),
            counts: qtx.counts.len(),
            deferred: qtx.deferred.len(),
            flushed: qtx.flushed,
            new: qtx.new.clone(),
        };
        qtx.savepoints.push(mark);
    }

    fn savepoint_closed(&self, state: &mut TxState, rolled_back: bool) {
        let qtx = state.get::<QueueTx>();
        let Some(mark) = qtx.savepoints.pop() else {
            return;
        };
        if rolled_back {
            // What the savepoint wrote is gone: so are the counts and endings it gathered,
            // and the declarations it may have read are read again.
            qtx.rates.truncate(mark.rates);
            qtx.ended.truncate(mark.ended);
            qtx.counts.truncate(mark.counts);
            qtx.defs = None;
            qtx.has_blocks.clear();
            // Deletes deferred in it are forgotten; those deferred before it and flushed
            // in it were undone with it, and are pending again. The row locks taken in
            // it were given back (PostgreSQL releases a rolled-back subtransaction's).
            qtx.deferred.truncate(mark.deferred);
            qtx.flushed = qtx.flushed.min(mark.flushed);
            qtx.locked.clear();
            // The rows not written when it began are not written again; those written
            // in it were undone with it, and are pending again. Facts released in it
            // are gone, and their seqs may be given again.
            qtx.new = mark.new;
            qtx.parents.clear();
        }
    }
}

/// The store's queue declarations, as of the `queues` counter they were read at, and the
/// randomness for lease tokens and backoff jitter.
#[derive(Default)]
pub(crate) struct QueueCache {
    defs: Mutex<Option<Arc<QueueDefs>>>,
    pub(crate) rng: Mutex<fastrand::Rng>,
}

/// What the queue code keeps for one write transaction.
#[derive(Default)]
pub(crate) struct QueueTx {
    /// The declarations as this transaction read them: `None` until they are read, and
    /// again after a declaration changes or a savepoint rolls back.
    pub(crate) defs: Option<Arc<QueueDefs>>,
    /// The `queues` counter may have moved in this transaction (a queue declared or
    /// dropped in it): the value read with the write lock is not taken for it.
    pub(crate) moved: bool,
    /// `defs` were read with the write lock held (with the counter read as it was
    /// taken): no other transaction can have changed them since. Declarations read
    /// before the lock (on PostgreSQL a claim takes none) are checked against that counter
    /// once the lock is held, as another process may have declared or dropped a queue
    /// and committed in between.
    pub(crate) defs_locked: bool,
    /// Completions and failures to add to the per-minute rates (and completions to the
    /// queue's counter) at commit: (queue id, minute, completed, failed).
    pub(crate) rates: Vec<(i64, i64, i64, i64)>,
    /// The inputs ended in this transaction, as (queue id, seq), in order: whether a
    /// handler completed its input is read here rather than from the database.
    pub(crate) ended: Vec<(i64, i64)>,
    /// Events to add to the queue's counters at commit (see [`Count`]).
    pub(crate) counts: Vec<(i64, Count)>,
    /// Poison entries a back-fill asked for, as (queue id, input, entry), written when it
    /// ends for the inputs that no fact it replayed ended (`Ix::poison_later`).
    pub(crate) replay_poison: Vec<(i64, FactHash, Fact)>,
    /// Where each open savepoint began.
    savepoints: Vec<Mark>,
    /// On PostgreSQL: item rows this transaction has locked (`FOR UPDATE`) and found
    /// leased, as (queue id, input). Such a row exists, with no blockers (a leased item
    /// had none when it was claimed, and an item only ever loses blockers), and no other
    /// transaction can delete it before this one commits: ending its input may defer the
    /// row's delete (`deferred`). Cleared when a savepoint rolls back.
    pub(crate) locked: HashSet<(i64, i64)>,
    /// Item rows of ended inputs whose delete is deferred, as (queue id, input): written
    /// in one statement ([`flush_deletes`]) before the commit and before any statement of
    /// the queue code that reads or writes item rows, instead of one round trip each
    /// under the write lock. `deferred[..flushed]` are deleted already.
    pub(crate) deferred: Vec<(i64, i64)>,
    pub(crate) flushed: usize,
    /// Whether each queue looked at has causal blocks in this transaction (`true`, or not
    /// known to have none) or none (`false`): an input of a queue with none ends without
    /// looking for the inputs it blocks. Forgotten when a savepoint rolls back, which may
    /// bring deleted blocks back.
    has_blocks: Vec<(i64, bool)>,
    /// How many times this transaction changed the state or lease token of an item row
    /// other than by ending its input (which `ended` records): a claim, a failure, a dead
    /// letter or poison entry. Only ever goes up, also across a rolled-back savepoint, so
    /// a lease checked when it stood at some value still holds while it stands there and
    /// its input is not among the inputs ended since (see [`super::work::LeaseCheck`]).
    pub(crate) item_updates: u64,
    /// On PostgreSQL: the item rows and blocks of inputs indexed in this transaction, not
    /// written yet (see [`NewItems`]).
    new: NewItems,
    /// The edges toward predecessors of facts the walk for unfinished ancestor inputs
    /// has read, as (predecessor, predecessor type) by successor: facts never change,
    /// so each is read once per transaction (every order of a shop walks up through
    /// the shop), up to [`PARENTS`] of them. Forgotten when a savepoint rolls back,
    /// whose facts are gone.
    parents: HashMap<i64, Vec<(i64, i64)>>,
}

impl QueueTx {
    /// Whether completions wait in [`NewItems`] to be ended.
    pub(crate) fn ends_pending(&self) -> bool {
        !self.new.ends.is_empty()
    }

    /// Whether a completion of input `seq` of queue `queue` waits in [`NewItems`].
    pub(crate) fn ending(&self, queue: i64, seq: i64) -> bool {
        self.new.ending.contains(&(queue, seq))
    }
}

/// What [`QueueTx`] held when a savepoint began.
#[derive(Clone)]
struct Mark {
    rates: usize,
    ended: usize,
    counts: usize,
    deferred: usize,
    flushed: usize,
    new: NewItems,
}

/// On PostgreSQL, the item rows and blocks of inputs indexed in this transaction and the
/// completions of inputs indexed before it, not written yet: one statement writes the
/// rows and blocks and one more deletes the completed rows ([`flush_new`]), before the
/// commit, before any other statement of the queue code that reads or writes item rows,
/// and when [`NEW_ITEMS`] are waiting. A round trip each under the write lock made a
/// store with a queue ingest at a thirtieth of the speed of one without. The walk for
/// unfinished ancestor inputs looks here before it looks at the table (a row here is
/// unfinished, a completion here finished); an input ended in the transaction that
/// indexed it is taken out of here (with its blocks, the inputs it blocked unblocked),
/// as its row would have been deleted; a completion of an input that a row here waits
/// for writes them first, and is ended at once.
#[derive(Clone, Debug, Default)]
pub(crate) struct NewItems {
    /// Rows in the order they were indexed; `None` once ended.
    rows: Vec<Option<NewItem>>,
    /// Where each row not ended is in `rows`, by (queue id, input).
    at: HashMap<(i64, i64), usize>,
    /// Blocks: (queue id, blocker, blocked).
    blocks: Vec<(i64, i64, i64)>,
    /// Inputs with a row in the table completed in this transaction, as (queue id,
    /// input, when, counted: false for a back-fill's replayed completion), their rows
    /// deleted by one statement too (those that wait for another input, or that another
    /// waits for, the careful way); and the same as a set, so that the walk takes them as
    /// finished and a second completion does nothing.
    ends: Vec<(i64, i64, i64, bool)>,
    ending: HashSet<(i64, i64)>,
}

impl NewItems {
    /// Whether input `input` of queue `queue` has a new row, not ended.
    fn pending(&self, queue: i64, input: i64) -> bool {
        self.at.contains_key(&(queue, input))
    }

    /// Whether a new row waits for input `input` of queue `queue` (a block here names it).
    fn waits_for(&self, queue: i64, input: i64) -> bool {
        self.blocks
            .iter()
            .any(|&(q, blocker, _)| q == queue && blocker == input)
    }
}

/// An item row of [`NewItems`]: its columns.
#[derive(Clone, Debug)]
struct NewItem {
    queue_id: i64,
    input: i64,
    state: i64,
    claimable: Option<i64>,
    blockers: i64,
    priority: i64,
    not_before: Option<i64>,
}

/// Facts whose predecessors the walk for unfinished ancestor inputs keeps at most
/// (`QueueTx::parents`); past it the cache starts again.
const PARENTS: usize = 65_536;

/// Item rows, and completions, waiting in [`NewItems`] at most: the transaction writes
/// them when one more would be kept.
const NEW_ITEMS: usize = 8_192;

/// Writes the item rows and blocks of [`NewItems`] in one statement, then deletes the
/// rows of the inputs it ended in one more. Each row is of an input released (or
/// back-filled) once, so none is there already; one that is means the bookkeeping is
/// wrong, and the transaction fails. An ended input whose row the delete leaves (one
/// that waits for another input, or that another waits for) is ended the careful way,
/// as [`Ix::end_input`] ends it.
fn flush_new(tx: &dyn ReadTx, state: &mut TxState) -> Result<()> {
    let new = std::mem::take(&mut state.get::<QueueTx>().new);
    if !new.at.is_empty() {
        let rows: Vec<_> = new
            .rows
            .iter()
            .flatten()
            .map(|i| {
                (
                    i.queue_id,
                    i.input,
                    i.state,
                    i.claimable,
                    i.blockers,
                    i.priority,
                    i.not_before,
                )
            })
            .collect();
        let rows_json = serde_json::to_string(&rows).expect("integers serialise");
        let blocks_json = serde_json::to_string(&new.blocks).expect("integers serialise");
        // Only PostgreSQL keeps rows for later (`Ix::new_input`): the statements are in
        // its dialect.
        let added: i64 = tx.query_one(
            "WITH i AS (
                 INSERT INTO queue_item (queue_id, input, state, claimable_at, blockers, priority, not_before)
                 SELECT CAST(p->>0 AS BIGINT), CAST(p->>1 AS BIGINT), CAST(p->>2 AS BIGINT),
                        CAST(p->>3 AS BIGINT), CAST(p->>4 AS BIGINT), CAST(p->>5 AS BIGINT),
                        CAST(p->>6 AS BIGINT)
                 FROM jsonb_array_elements(CAST(?1 AS jsonb)) AS p
                 ON CONFLICT DO NOTHING RETURNING 1),
             b AS (
                 INSERT INTO queue_block (queue_id, blocker, blocked)
                 SELECT CAST(p->>0 AS BIGINT), CAST(p->>1 AS BIGINT), CAST(p->>2 AS BIGINT)
                 FROM jsonb_array_elements(CAST(?2 AS jsonb)) AS p)
             SELECT count(*) FROM i",
            args![&rows_json, &blocks_json],
            |r| r.get(0),
        )?;
        if added != rows.len() as i64 {
            return Err(Error::Queue {
                queue: format!("id {}", rows[0].0),
                reason: format!(
                    "{} of the {} item rows of inputs indexed in this transaction were there already",
                    rows.len() as i64 - added,
                    rows.len()
                ),
            });
        }
    }
    if new.ends.is_empty() {
        return Ok(());
    }
    let pairs: Vec<(i64, i64)> = new.ends.iter().map(|&(q, seq, _, _)| (q, seq)).collect();
    let pairs = serde_json::to_string(&pairs).expect("integers serialise");
    let gone: HashSet<(i64, i64)> = tx
        .query_vec(
            "DELETE FROM queue_item i
             USING (SELECT CAST(p->>0 AS BIGINT) AS queue_id, CAST(p->>1 AS BIGINT) AS input
                    FROM jsonb_array_elements(CAST(?1 AS jsonb)) AS p) AS d
             WHERE i.queue_id = d.queue_id AND i.input = d.input AND i.blockers = 0
               AND NOT EXISTS (SELECT 1 FROM queue_block b
                               WHERE b.queue_id = i.queue_id AND b.blocker = i.input)
             RETURNING i.queue_id, i.input",
            args![&pairs],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )?
        .into_iter()
        .collect();
    // The rows the delete left: those that wait for another input or that another waits
    // for, read in one statement (none, for completions of inputs that had none).
    let left: Vec<(i64, i64)> = new
        .ends
        .iter()
        .map(|&(q, seq, _, _)| (q, seq))
        .filter(|end| !gone.contains(end))
        .collect();
    let mut blockers: HashMap<(i64, i64), i64> = HashMap::new();
    if !left.is_empty() {
        let pairs = serde_json::to_string(&left).expect("integers serialise");
        for (queue_id, input, b) in tx.query_vec(
            "SELECT i.queue_id, i.input, i.blockers FROM queue_item i
             JOIN (SELECT CAST(p->>0 AS BIGINT) AS queue_id, CAST(p->>1 AS BIGINT) AS input
                   FROM jsonb_array_elements(CAST(?1 AS jsonb)) AS p) AS d
               ON i.queue_id = d.queue_id AND i.input = d.input",
            args![&pairs],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
        )? {
            blockers.insert((queue_id, input), b);
        }
    }
    for (queue_id, seq, now, counted) in new.ends {
        if gone.contains(&(queue_id, seq)) {
            note_ended(tx, state, now, (queue_id, seq), End::Completed, counted)?;
        } else if let Some(&b) = blockers.get(&(queue_id, seq)) {
            // An ending before this one may have unblocked it (blockers only go down):
            // the blocks it waited for are then gone, and deleting them again does
            // nothing.
            end_row(tx, state, now, (queue_id, seq, b), End::Completed, counted)?;
        }
    }
    Ok(())
}

/// Writes what the queue index keeps for later in this transaction (the deferred deletes,
/// then [`NewItems`]): before the commit and before any statement of the queue code that
/// reads or writes item rows.
pub(crate) fn flush_pending(tx: &dyn ReadTx, state: &mut TxState) -> Result<()> {
    // The deferred deletes first: an input completed by its handler and again by a later
    // fact is ended by the first, and the second then finds no row.
    flush_deletes(tx, state)?;
    flush_new(tx, state)
}

/// Deletes the item rows whose delete [`Ix::end_input`] deferred, in one statement.
///
/// Each is a row this transaction locked and found leased (`QueueTx::locked`), so each is
/// there to delete; a row that is not means the bookkeeping is wrong, and the transaction
/// fails rather than commit endings that did not happen.
pub(crate) fn flush_deletes(tx: &dyn ReadTx, state: &mut TxState) -> Result<()> {
    let qtx = state.get::<QueueTx>();
    let pending = &qtx.deferred[qtx.flushed..];
    if pending.is_empty() {
        return Ok(());
    }
    let pairs = serde_json::to_string(pending).expect("integers serialise");
    // Only PostgreSQL defers (`Ix::may_defer`): the statement is in its dialect.
    let gone = tx.execute(
        "DELETE FROM queue_item i
         USING (SELECT CAST(p->>0 AS BIGINT) AS queue_id, CAST(p->>1 AS BIGINT) AS input
                FROM jsonb_array_elements(CAST(?1 AS jsonb)) AS p) AS d
         WHERE i.queue_id = d.queue_id AND i.input = d.input AND i.blockers = 0",
        args![&pairs],
    )?;
    if gone != pending.len() as u64 {
        return Err(Error::Queue {
            queue: format!("id {}", pending[0].0),
            reason: format!(
                "{gone} of the {} item rows of inputs ended in this transaction were found to delete",
                pending.len()
            ),
        });
    }
    qtx.flushed = qtx.deferred.len();
    Ok(())
}

/// The queue index at work in one transaction: its reads and SQL, the clock reading, the
/// transaction's queue state, and the facts to insert once the current insert returns.
pub(crate) struct Ix<'a> {
    pub(crate) tx: &'a dyn ReadTx,
    pub(crate) now: i64,
    pub(crate) state: &'a mut TxState,
    pub(crate) cache: &'a QueueCache,
    pub(crate) later: Vec<Fact>,
    /// The sequence numbers and type ids of the released fact's predecessors, as the store
    /// read them to write its edges: an ending names its input by hash, and this spares
    /// the lookup (and tells a predecessor not of the input type); the walk for
    /// unfinished ancestor inputs starts from them.
    pub(crate) known: &'a dyn Fn(&FactHash) -> Option<(i64, i64)>,
    /// The fact is a stored one replayed by a back-fill, not a new release: the inputs it
    /// ends are not counted (the counters and rates count what happens after the
    /// declaration, and a re-declaration that back-fills again would count them twice).
    pub(crate) replay: bool,
}

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

/// Reads the declarations unless the cached ones are still current.
pub(crate) fn load_defs(tx: &dyn ReadTx, cache: &QueueCache) -> Result<Arc<QueueDefs>> {
    load_defs_at(tx, cache, None)
}

/// [`load_defs`], with the `queues` counter given when it is known.
fn load_defs_at(
    tx: &dyn ReadTx,
    cache: &QueueCache,
    generation: Option<i64>,
) -> Result<Arc<QueueDefs>> {
    let generation: i64 = match generation {
        Some(g) => g,
        None => tx.query_one(
            "SELECT value FROM counter WHERE name = 'queues'",
            args![],
            |r| r.get(0),
        )?,
    };
    let mut cached = cache.defs.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(c) = &*cached
        && c.generation == generation
    {
        return Ok(c.clone());
    }
    let rows: Vec<(i64, String, String)> = tx.query_vec(
        "SELECT id, name, config FROM queue ORDER BY id",
        args![],
        |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
    )?;
    let mut queues = Vec::new();
    for (id, name, config) in rows {
        let spec: QueueSpec = serde_json::from_str(&config).map_err(|e| Error::Queue {
            queue: name,
            reason: format!("stored declaration does not parse: {e}"),
        })?;
        queues.push(QueueDef { id, spec });
    }
    let defs = Arc::new(QueueDefs { generation, queues });
    *cached = Some(defs.clone());
    Ok(defs)
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

/// The queue declarations for this transaction: read once per transaction (a cheap
/// counter check when the cache is current).
pub(crate) fn defs_for(
    tx: &dyn ReadTx,
    state: &mut TxState,
    cache: &QueueCache,
) -> Result<Arc<QueueDefs>> {
    let qtx = state.get::<QueueTx>();
    // Declarations move the counter only under the write lock: read with it, it is
    // current unless this transaction moved it since.
    let at_lock = (!qtx.moved).then(|| tx.counter_at_lock("queues")).flatten();
    if let Some(d) = &qtx.defs {
        match at_lock {
            // Read under the lock, by this transaction's own declarations, or with no
            // lock yet to check them by (SQLite's writer holds it from its start).
            _ if qtx.defs_locked || qtx.moved => return Ok(d.clone()),
            None => return Ok(d.clone()),
            // Read before the lock, and no declaration came between.
            Some(g) if g == d.generation => {
                qtx.defs_locked = true;
                return Ok(d.clone());
            }
            // Another process declared or dropped a queue before this transaction took
            // the lock: what it releases now is indexed by the new declarations.
            Some(_) => {}
        }
    }
    let defs = load_defs_at(tx, cache, at_lock)?;
    let qtx = state.get::<QueueTx>();
    qtx.defs = Some(defs.clone());
    qtx.defs_locked = at_lock.is_some();
    Ok(defs)
}

/// Forgets that this transaction checked the declarations (after a declaration changed,
/// or a savepoint rolled back).
pub(crate) fn uncheck(state: &mut TxState) {
    let qtx = state.get::<QueueTx>();
    qtx.defs = None;
    qtx.moved = true;
}

impl Ix<'_> {
    /// The queue declarations for this transaction.
    pub(crate) fn queue_defs(&mut self) -> Result<Arc<QueueDefs>> {
        defs_for(self.tx, self.state, self.cache)
    }

    /// The release sequence of `hash`, if released.
    pub(crate) fn released_seq(&self, hash: &FactHash) -> Result<Option<i64>> {
        self.tx.seq_of(hash)
    }

    /// Keeps the queue index in step with a fact just released as `seq`. `only` limits the
    /// work to one queue (used when back-filling a new declaration).
    pub(crate) fn queue_on_release(
        &mut self,
        fact: &Fact,
        seq: i64,
        only: Option<i64>,
    ) -> Result<()> {
        self.replay = only.is_some();
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
        flush_pending(self.tx, self.state)?;
        match fact.type_name() {
            system::DEAD_LETTER | system::POISON => {
                let Some(input) = one_pred(fact, system::INPUT_ROLE) else {
                    return Ok(());
                };
                if self.replay {
                    // Judged before: listed as it was, with no second entry.
                    let waiting = &mut self.state.get::<QueueTx>().replay_poison;
                    waiting.retain(|(queue, i, _)| !(*queue == q.id && *i == input));
                }
                let state = if fact.type_name() == system::DEAD_LETTER {
                    ItemState::Dead
                } else {
                    ItemState::Poison
                };
                let reason = text_field(fact, "reason");
                if let Some(input_seq) = self.released_seq(&input)? {
                    self.state.get::<QueueTx>().item_updates += 1;
                    self.tx.execute(
                        "UPDATE queue_item SET state = ?3, claimable_at = NULL, lease_token = NULL,
                                    last_error = ?4, entry = ?5
                             WHERE queue_id = ?1 AND input = ?2",
                        args![q.id, input_seq, state.code(), reason.as_deref(), seq],
                    )?;
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
                let now = self.now;
                let reopened = self.tx.execute(
                    concat!(
                        "UPDATE queue_item SET state = CASE WHEN blockers > 0 THEN ",
                        state_code!(Blocked),
                        " ELSE ",
                        state_code!(Ready),
                        " END,
                             claimable_at = CASE WHEN blockers > 0 THEN NULL
                                 WHEN not_before > CAST(?4 AS BIGINT) THEN not_before
                                 ELSE CAST(?4 AS BIGINT) END,
                             attempts = 0, first_attempt_at = NULL, lease_token = NULL,
                             last_error = NULL, entry = NULL
                         WHERE queue_id = ?1 AND input = ?2 AND entry = ?3 AND state IN (",
                        state_code!(Dead),
                        ", ",
                        state_code!(Poison),
                        ")"
                    ),
                    args![q.id, input_seq, entry_seq, now],
                )?;
                if reopened == 0 {
                    // Not this queue's current entry for the input (a redrive sent twice,
                    // or of an input that is no longer one): nothing reopened, nothing to
                    // judge.
                    return Ok(());
                }
                // A redriven input is judged again: one that still fails the queue's
                // field requirements goes back to poison, never to a handler. The new
                // entry names the redrive, so it differs from the first one.
                let Some(input_fact) = self.fact_by_hash(&input)? else {
                    return Ok(());
                };
                if let Some(reason) = q.spec.poison_reason(&input_fact) {
                    let poison = Fact::builder(system::POISON)
                        .field("queue", q.spec.name.as_str())
                        .field("reason", reason)
                        .field("at", now)
                        .predecessor(system::INPUT_ROLE, input)
                        .predecessor("redrive", fact.hash())
                        .build()?;
                    self.poison_later(q.id, input, poison);
                }
            }
            system::DISCARD => {
                if let Some(input) = one_pred(fact, system::INPUT_ROLE) {
                    self.end_input(q, &input, End::Discarded)?;
                }
            }
            system::DELIVERED => {
                if let Some(input) = one_pred(fact, system::INPUT_ROLE) {
                    self.end_input(q, &input, End::Delivered)?;
                }
            }
            _ => {}
        }
        Ok(())
    }

    pub(crate) fn fact_by_hash(&self, hash: &FactHash) -> Result<Option<Fact>> {
        self.tx.get(hash)
    }

    /// Records a new input: blocked behind unfinished ancestor inputs (causal ordering),
    /// poison if it fails the field requirements, ready otherwise.
    fn new_input(&mut self, q: &QueueDef, fact: &Fact, seq: i64) -> Result<()> {
        let blockers = match q.spec.ordering {
            Ordering::Causal => {
                // The walk for unfinished ancestors reads item rows (and looks at the
                // new ones first).
                flush_deletes(self.tx, self.state)?;
                self.unfinished_ancestor_inputs(q, fact, seq)?
            }
            Ordering::None => Vec::new(),
        };
        let now = self.now;
        // A field that does not parse makes the input poison below; until then it has
        // no priority and no schedule.
        let priority = q.spec.priority_of(fact).unwrap_or(0);
        let not_before = q.spec.not_before_of(fact).unwrap_or(None);
        let (state, claimable) = if blockers.is_empty() {
            (
                ItemState::Ready,
                Some(not_before.map_or(now, |t| t.max(now))),
            )
        } else {
            (ItemState::Blocked, None)
        };
        if self.tx.dialect() == Dialect::Postgres {
            if self.state.get::<QueueTx>().new.at.len() >= NEW_ITEMS {
                flush_pending(self.tx, self.state)?;
            }
            let new = &mut self.state.get::<QueueTx>().new;
            new.at.insert((q.id, seq), new.rows.len());
            new.rows.push(Some(NewItem {
                queue_id: q.id,
                input: seq,
                state: state.code(),
                claimable,
                blockers: blockers.len() as i64,
                priority,
                not_before,
            }));
            new.blocks.extend(blockers.iter().map(|&b| (q.id, b, seq)));
            if !blockers.is_empty() {
                self.note_blocks(q.id, true);
            }
            return self.poison_if_unfit(q, fact);
        }
        let added = if q.spec.priority_field.is_none() && q.spec.not_before_field.is_none() {
            self.tx.execute(
                "INSERT INTO queue_item (queue_id, input, state, claimable_at, blockers)
                     VALUES (?1, ?2, ?3, ?4, ?5) ON CONFLICT DO NOTHING",
                args![q.id, seq, state.code(), claimable, blockers.len() as i64],
            )?
        } else {
            self.tx.execute(
                "INSERT INTO queue_item (queue_id, input, state, claimable_at, blockers,
                                         priority, not_before)
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7) ON CONFLICT DO NOTHING",
                args![
                    q.id,
                    seq,
                    state.code(),
                    claimable,
                    blockers.len() as i64,
                    priority,
                    not_before
                ],
            )?
        };
        if added == 0 {
            return Ok(());
        }
        if !blockers.is_empty() {
            self.note_blocks(q.id, true);
        }
        for b in &blockers {
            self.tx.execute(
                "INSERT INTO queue_block (queue_id, blocker, blocked) VALUES (?1, ?2, ?3)",
                args![q.id, b, seq],
            )?;
        }
        self.poison_if_unfit(q, fact)
    }

    /// Asks for a poison entry for a new input that fails the queue's field
    /// requirements.
    fn poison_if_unfit(&mut self, q: &QueueDef, fact: &Fact) -> Result<()> {
        let now = self.now;
        if let Some(reason) = q.spec.poison_reason(fact) {
            let poison = Fact::builder(system::POISON)
                .field("queue", q.spec.name.as_str())
                .field("reason", reason)
                .field("at", now)
                .predecessor(system::INPUT_ROLE, fact.hash())
                .build()?;
            self.poison_later(q.id, fact.hash(), poison);
        }
        Ok(())
    }

    /// Asks for `poison`, the poison entry of `input` of queue `queue`: inserted once
    /// the current insert returns; in a back-fill, when it ends, and only if no fact it
    /// replays after this one ends or lists the input (a completion, a discard, a dead
    /// letter, the poison entry written when the input was first judged): a
    /// re-declaration judges again only the inputs still open, and writes no second entry
    /// for one poisoned before.
    fn poison_later(&mut self, queue: i64, input: FactHash, poison: Fact) {
        if self.replay {
            let waiting = &mut self.state.get::<QueueTx>().replay_poison;
            waiting.push((queue, input, poison));
        } else {
            self.later.push(poison);
        }
    }

    /// The nearest unfinished inputs of `q` among the ancestors of `fact`, released as
    /// `seq`: a walk up the predecessor edges that stops at every input of the queue,
    /// finished or not.
    fn unfinished_ancestor_inputs(
        &mut self,
        q: &QueueDef,
        fact: &Fact,
        seq: i64,
    ) -> Result<Vec<i64>> {
        let Some(input_type) = self.tx.name_id(false, &q.spec.input_type)? else {
            return Ok(Vec::new());
        };
        let scope = match &q.spec.scope {
            Some(h) => self.released_seq(h)?,
            None => None,
        };
        // The edge carries the predecessor's type: the walk reads `edge_by_successor` alone.
        let mut seen = HashSet::new();
        let mut stack = vec![seq];
        let mut found = Vec::new();
        while let Some(s) = stack.pop() {
            let parents = self.parents(fact, seq, s)?;
            for (p, type_id) in parents {
                if !seen.insert(p) {
                    continue;
                }
                let is_input = type_id == input_type
                    && match (q.spec.scope, scope) {
                        (None, _) => true,
                        (Some(_), Some(sc)) => self.tx.exists(
                            "SELECT 1 FROM edge WHERE successor = ?1 AND predecessor = ?2",
                            args![p, sc],
                        )?,
                        (Some(_), None) => false,
                    };
                if !is_input {
                    stack.push(p);
                    continue;
                }
                // Unfinished: a row kept for later, or one in the table that no kept
                // completion ends.
                let new = &self.state.get::<QueueTx>().new;
                let unfinished = new.pending(q.id, p)
                    || (!new.ending.contains(&(q.id, p))
                        && self.tx.exists(
                            "SELECT 1 FROM queue_item WHERE queue_id = ?1 AND input = ?2",
                            args![q.id, p],
                        )?);
                if unfinished {
                    found.push(p);
                }
            }
        }
        found.sort_unstable();
        Ok(found)
    }

    /// The predecessors of fact `s` as (seq, type id): for `fact` itself (released as
    /// `seq`), those the store just wrote its edges from, when it gave them; else read
    /// once per transaction.
    fn parents(&mut self, fact: &Fact, seq: i64, s: i64) -> Result<Vec<(i64, i64)>> {
        if s == seq {
            let hashes = fact.predecessor_hashes();
            let given: Vec<(i64, i64)> = hashes.iter().filter_map(|p| (self.known)(p)).collect();
            if given.len() == hashes.len() {
                return Ok(given);
            }
        }
        if let Some(p) = self.state.get::<QueueTx>().parents.get(&s) {
            return Ok(p.clone());
        }
        let parents: Vec<(i64, i64)> = self.tx.query_vec(
            "SELECT predecessor, predecessor_type FROM edge WHERE successor = ?1 AND predecessor IS NOT NULL",
            args![s],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )?;
        let cache = &mut self.state.get::<QueueTx>().parents;
        if cache.len() >= PARENTS {
            // A long transaction walks up through many facts: its memory stays bounded.
            cache.clear();
        }
        cache.insert(s, parents.clone());
        Ok(parents)
    }

    /// Ends input `seq` of `q` if this transaction indexed it and has not written its
    /// row ([`NewItems`]): as the row's delete would, it takes the row and its blocks
    /// out and unblocks the inputs that waited for it. Whether it did.
    fn end_new(&mut self, q: &QueueDef, seq: i64, how: End) -> Result<bool> {
        let now = self.now;
        let new = &mut self.state.get::<QueueTx>().new;
        let Some(i) = new.at.remove(&(q.id, seq)) else {
            return Ok(false);
        };
        let item = new.rows[i].take().expect("a row not ended");
        let mut waiting = Vec::new();
        new.blocks.retain(|&(queue, blocker, blocked)| {
            if queue != q.id {
                return true;
            }
            if blocker == seq {
                waiting.push(blocked);
                return false;
            }
            !(item.blockers > 0 && blocked == seq)
        });
        for blocked in waiting {
            let row = new
                .at
                .get(&(q.id, blocked))
                .and_then(|&j| new.rows[j].as_mut())
                .ok_or_else(|| Error::Queue {
                    queue: q.spec.name.clone(),
                    reason: format!(
                        "input {blocked} is blocked by input {seq}, indexed in this transaction, but was not"
                    ),
                })?;
            row.blockers -= 1;
            if row.blockers == 0 && row.state == ItemState::Blocked.code() {
                row.state = ItemState::Ready.code();
                row.claimable = Some(row.not_before.map_or(now, |t| t.max(now)));
            }
        }
        self.ended(q, seq, how)?;
        Ok(true)
    }

    /// Ends an input: drops its local state and unblocks the inputs that waited for it.
    ///
    /// This runs for every completing fact, so it pays only for what the input needs. A
    /// predecessor not of the input type ends nothing; an input indexed in this
    /// transaction is ended in [`NewItems`]; on PostgreSQL a completion of an input with
    /// its seq known is kept there for [`flush_new`], unless a new row waits for it. The
    /// common input (its seq known from the completing fact's edge, waiting for no other
    /// input and blocking none) goes in one statement. Otherwise one probe finds its seq
    /// and item row together, the blocks it waits for are deleted only if it has any
    /// (`blockers` counts them), and those it imposes are read before they are deleted (a
    /// `DELETE .. RETURNING` costs SQLite a temporary table every time, several times the
    /// probe). The completed counter is added up at commit.
    pub(crate) fn end_input(&mut self, q: &QueueDef, input: &FactHash, how: End) -> Result<()> {
        if self.replay {
            // Ended by a replayed fact: the poison entry a back-fill asked for goes.
            let waiting = &mut self.state.get::<QueueTx>().replay_poison;
            waiting.retain(|(queue, i, _)| !(*queue == q.id && i == input));
        }
        let known = (self.known)(input);
        if let Some((_, type_id)) = known
            && let Some(input_type) = self.tx.name_id(false, &q.spec.input_type)?
            && type_id != input_type
        {
            // Not of the queue's input type: no row of the queue is this fact's.
            return Ok(());
        }
        let known = known.map(|(seq, _)| seq);
        if let Some(seq) = known
            && self.end_new(q, seq, how)?
        {
            return Ok(());
        }
        if let Some(seq) = known
            && self.may_defer(q.id, seq)?
        {
            self.state.get::<QueueTx>().deferred.push((q.id, seq));
            return self.ended(q, seq, how);
        }
        if let Some(seq) = known
            && how == End::Completed
            && self.tx.dialect() == Dialect::Postgres
        {
            let new = &self.state.get::<QueueTx>().new;
            if new.ending.contains(&(q.id, seq)) {
                // Ended already in this transaction: a second completion finds no row.
                return Ok(());
            }
            // Ended with the new rows' statement, unless a new row waits for it (whose
            // block its ending must see written).
            if !new.waits_for(q.id, seq) {
                if new.ends.len() >= NEW_ITEMS {
                    flush_pending(self.tx, self.state)?;
                }
                let new = &mut self.state.get::<QueueTx>().new;
                new.ending.insert((q.id, seq));
                new.ends.push((q.id, seq, self.now, !self.replay));
                return Ok(());
            }
        }
        // What follows reads item rows: the deferred deletes go first, and the new rows
        // too when one of them is blocked by this input (the delete below looks for its
        // blocks); all before the reads past it.
        if known.is_some_and(|seq| self.state.get::<QueueTx>().new.waits_for(q.id, seq)) {
            flush_pending(self.tx, self.state)?;
        } else {
            flush_deletes(self.tx, self.state)?;
        }
        if let Some(seq) = known {
            let sql = if self.has_blocks(q.id)? {
                "DELETE FROM queue_item WHERE queue_id = ?1 AND input = ?2 AND blockers = 0
                     AND NOT EXISTS (SELECT 1 FROM queue_block WHERE queue_id = ?1 AND blocker = ?2)"
            } else {
                "DELETE FROM queue_item WHERE queue_id = ?1 AND input = ?2 AND blockers = 0"
            };
            let gone = self.tx.execute(sql, args![q.id, seq])?;
            if gone == 1 {
                return self.ended(q, seq, how);
            }
        }
        flush_pending(self.tx, self.state)?;
        let item: Option<(i64, i64)> = match known {
            Some(seq) => item_row(self.tx, q.id, seq)?.map(|b| (seq, b)),
            // CROSS JOIN keeps the hash probe outermost.
            None => self.tx.query_opt(
                "SELECT i.input, i.blockers FROM fact f CROSS JOIN queue_item i
                 WHERE f.hash = +?2 AND i.queue_id = +?1 AND i.input = f.seq",
                args![q.id, input],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )?,
        };
        let Some((seq, blockers)) = item else {
            return Ok(());
        };
        let counted = !self.replay;
        end_row(
            self.tx,
            self.state,
            self.now,
            (q.id, seq, blockers),
            how,
            counted,
        )
    }

    /// Whether the item row of input `seq` of queue `id` may be deleted later, in one
    /// statement with others ([`flush_deletes`]): on PostgreSQL, when this transaction
    /// holds the row's lock and found it leased (`QueueTx::locked`), and the queue has no
    /// causal blocks, so that the input unblocks nothing. The row is then taken out of
    /// `locked`: a second ending of the same input in this transaction finds it gone.
    fn may_defer(&mut self, id: i64, seq: i64) -> Result<bool> {
        if self.tx.dialect() != Dialect::Postgres
            || !self.state.get::<QueueTx>().locked.contains(&(id, seq))
            || self.has_blocks(id)?
        {
            return Ok(false);
        }
        Ok(self.state.get::<QueueTx>().locked.remove(&(id, seq)))
    }

    /// Whether queue `id` may have causal blocks (see [`QueueTx::has_blocks`]): looked up
    /// once per transaction.
    fn has_blocks(&mut self, id: i64) -> Result<bool> {
        let known = self
            .state
            .get::<QueueTx>()
            .has_blocks
            .iter()
            .find(|(q, _)| *q == id);
        if let Some(&(_, any)) = known {
            return Ok(any);
        }
        let any = self.tx.exists(
            "SELECT 1 FROM queue_block WHERE queue_id = ?1 LIMIT 1",
            args![id],
        )?;
        self.note_blocks(id, any);
        Ok(any)
    }

    fn note_blocks(&mut self, id: i64, any: bool) {
        let known = &mut self.state.get::<QueueTx>().has_blocks;
        match known.iter_mut().find(|(q, _)| *q == id) {
            Some(entry) => entry.1 |= any,
            None => known.push((id, any)),
        }
    }

    /// Notes that `seq` ended in queue `q` (for the handler's check and the counters).
    fn ended(&mut self, q: &QueueDef, seq: i64, how: End) -> Result<()> {
        let counted = !self.replay;
        note_ended(self.tx, self.state, self.now, (q.id, seq), how, counted)
    }
}

/// Notes that `seq` ended in queue `queue_id` at `now` (for the handler's check and, if
/// `counted`, the counters and rates; a back-fill's replayed ending is not counted).
fn note_ended(
    tx: &dyn ReadTx,
    state: &mut TxState,
    now: i64,
    (queue_id, seq): (i64, i64),
    how: End,
    counted: bool,
) -> Result<()> {
    state.get::<QueueTx>().ended.push((queue_id, seq));
    if !counted {
        return Ok(());
    }
    match how {
        End::Completed => bump_rate(state, now, queue_id, "completed"),
        End::Discarded => {
            tx.execute(
                "UPDATE queue SET discarded = discarded + 1 WHERE id = ?1",
                args![queue_id],
            )?;
        }
        // Counted when the handler's completion or failure is known.
        End::Delivered => {}
    }
    Ok(())
}

/// The item row of input `seq` of queue `queue_id`, if there is one: its blockers.
fn item_row(tx: &dyn ReadTx, queue_id: i64, seq: i64) -> Result<Option<i64>> {
    // The parameters are hidden from the planner (`+?N`): when it looks at their values
    // (to tell whether the partial claimable index applies) the statement is prepared
    // again on every run.
    tx.query_opt(
        "SELECT blockers FROM queue_item WHERE queue_id = +?1 AND input = +?2",
        args![queue_id, seq],
        |r| r.get(0),
    )
}

/// Ends input `seq` of queue `queue_id` at `now`, whose item row is there with
/// `blockers`: deletes the row and the blocks it waits for, and unblocks the inputs that
/// waited for it. The ending is counted if `counted` (see [`note_ended`]).
fn end_row(
    tx: &dyn ReadTx,
    state: &mut TxState,
    now: i64,
    (queue_id, seq, blockers): (i64, i64, i64),
    how: End,
    counted: bool,
) -> Result<()> {
    tx.execute(
        "DELETE FROM queue_item WHERE queue_id = ?1 AND input = ?2",
        args![queue_id, seq],
    )?;
    if blockers > 0 {
        tx.execute(
            "DELETE FROM queue_block WHERE queue_id = ?1 AND blocked = ?2",
            args![queue_id, seq],
        )?;
    }
    let waiting: Vec<i64> = tx.query_vec(
        "SELECT blocked FROM queue_block WHERE queue_id = ?1 AND blocker = ?2",
        args![queue_id, seq],
        |r| r.get(0),
    )?;
    if !waiting.is_empty() {
        tx.execute(
            "DELETE FROM queue_block WHERE queue_id = ?1 AND blocker = ?2",
            args![queue_id, seq],
        )?;
    }
    for blocked in waiting {
        tx.execute(
            concat!(
                "UPDATE queue_item SET blockers = blockers - 1,
                     state = CASE WHEN blockers = 1 AND state = ",
                state_code!(Blocked),
                " THEN ",
                state_code!(Ready),
                " ELSE state END,
                     claimable_at = CASE WHEN blockers = 1 AND state = ",
                state_code!(Blocked),
                " THEN (CASE WHEN not_before > CAST(?3 AS BIGINT) THEN not_before
                              ELSE CAST(?3 AS BIGINT) END) ELSE claimable_at END
                 WHERE queue_id = ?1 AND input = ?2"
            ),
            args![queue_id, blocked, now],
        )?;
    }
    note_ended(tx, state, now, (queue_id, seq), how, counted)
}

/// Counts a completion or failure for the per-minute rates. Kept in memory and written
/// once at commit ([`flush_rates`]), not per input.
pub(crate) fn bump_rate(state: &mut TxState, now: i64, queue_id: i64, what: &str) {
    let minute = now / 60_000;
    let completed = i64::from(what == "completed");
    state
        .get::<QueueTx>()
        .rates
        .push((queue_id, minute, completed, 1 - completed));
}

/// An event a queue counts since its declaration (a column of `queue`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Count {
    /// An at-most-once input whose handler failed.
    Dropped,
    /// A failed attempt, of any kind.
    Failed,
    /// A transient failure or timeout given another attempt.
    Retried,
    /// A claim of an input whose earlier lease expired.
    Redelivered,
    /// An attempt that timed out.
    TimedOut,
}

impl Count {
    /// The statement that adds to this counter: static text, prepared once.
    fn sql(self) -> &'static str {
        match self {
            Count::Dropped => "UPDATE queue SET dropped = dropped + ?2 WHERE id = ?1",
            Count::Failed => "UPDATE queue SET failed = failed + ?2 WHERE id = ?1",
            Count::Retried => "UPDATE queue SET retried = retried + ?2 WHERE id = ?1",
            Count::Redelivered => "UPDATE queue SET redelivered = redelivered + ?2 WHERE id = ?1",
            Count::TimedOut => "UPDATE queue SET timed_out = timed_out + ?2 WHERE id = ?1",
        }
    }
}

/// Counts `what` for queue `queue_id`, written once at commit ([`flush_rates`]).
pub(crate) fn count(state: &mut TxState, queue_id: i64, what: Count) {
    state.get::<QueueTx>().counts.push((queue_id, what));
}

/// Writes the rate counts gathered in this transaction, adds its completions and other
/// events to each queue's counters, and drops buckets older than an hour.
fn flush_rates(tx: &dyn ReadTx, state: &mut TxState) -> Result<()> {
    let counts = std::mem::take(&mut state.get::<QueueTx>().counts);
    if !counts.is_empty() {
        let mut sums: std::collections::BTreeMap<(i64, Count), i64> = Default::default();
        for c in counts {
            *sums.entry(c).or_default() += 1;
        }
        for ((q, what), n) in sums {
            tx.execute(what.sql(), args![q, n])?;
        }
    }
    let rates = std::mem::take(&mut state.get::<QueueTx>().rates);
    if rates.is_empty() {
        return Ok(());
    }
    let mut sums: std::collections::BTreeMap<(i64, i64), (i64, i64)> = Default::default();
    for (q, minute, c, f) in rates {
        let e = sums.entry((q, minute)).or_default();
        e.0 += c;
        e.1 += f;
    }
    let mut completed: std::collections::BTreeMap<i64, i64> = Default::default();
    for (&(q, _), &(c, _)) in &sums {
        *completed.entry(q).or_default() += c;
    }
    for (q, c) in completed.into_iter().filter(|&(_, c)| c > 0) {
        tx.execute(
            "UPDATE queue SET completed = completed + ?2 WHERE id = ?1",
            args![q, c],
        )?;
    }
    for (&(q, minute), &(c, f)) in &sums {
        tx.execute(
            "INSERT INTO queue_rate (queue_id, minute, completed, failed) VALUES (?1, ?2, ?3, ?4)
             ON CONFLICT (queue_id, minute)
             DO UPDATE SET completed = queue_rate.completed + excluded.completed,
                           failed = queue_rate.failed + excluded.failed",
            args![q, minute, c, f],
        )?;
        tx.execute(
            "DELETE FROM queue_rate WHERE queue_id = ?1 AND minute < ?2",
            args![q, minute - 60],
        )?;
    }
    Ok(())
}

/// How an input ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum End {
    Completed,
    Discarded,
    /// An at-most-once input handed out: its handler's outcome is counted later.
    Delivered,
}
