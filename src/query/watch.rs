//! Live watches: the results of a query kept up to date as facts are released, reported
//! as added and removed results.
//!
//! A watch does not re-run its query on each new fact. At each poll it reads the facts
//! released since the last one (`seq` in `(after, upto]`) and evaluates the *inverse* of
//! the query, one statement per place a fact type occurs in it:
//! - where the type is a top-level match, the query runs with that label pinned to the new
//!   facts' range: every row is a result containing a new fact, so an addition;
//! - where the type is inside `exists` / `not exists`, the path from the top level down to
//!   it is flattened into joins, with the inner label pinned to the range: every row names
//!   a top-level result the new facts are connected to, and only those results are
//!   checked again (the query with all top-level labels pinned), giving additions (an
//!   `exists` now true) and removals (a `not exists` now false).
//!
//! A poll runs in one read transaction: it reads the new facts' sequence numbers and
//! types, and runs only the statements of the types that arrived. Edges are never
//! removed, so a connection found now held when the fact arrived; and each check reads
//! the same snapshot, so the results after a poll are exactly the query's results at that
//! moment, however many facts a poll covers.
//!
//! Cost: the statements are compiled once, when the watch starts (`inverse.rs`), with
//! slots for the per-poll values (`Compiled`), and their parameters are hidden from
//! SQLite's planner (`steady`) so that they stay prepared from one poll to the next.
//!
//! With `limit n` the watch keeps the query's first `n` results in its order, and knows
//! whether they are all the results (`complete`). When not, every other result sorts after
//! the last one kept, so a result that starts to hold enters only if it sorts before that
//! one (which it then pushes out), and when results leave, the missing ones are read with
//! a keyset query: the first results sorting after the last one kept.
//!
//! A given that is not released when the watch starts makes the query empty until it is;
//! the poll that sees it runs the whole query once. Facts released from the held set, or
//! written by another process, get sequence numbers like any other and are seen by the
//! next poll. [`Watch::wait`] (and the iterator, the thread and the stream built on it)
//! polls again when the store wakes it ([`Store::wait_for_wake`]): at once after a commit
//! through the same `Store` and, on PostgreSQL, after a commit that released facts in any
//! process on any host (`LISTEN`/`NOTIFY`). [`Watch::interval`] (default 50 ms) is the
//! fallback: the longest wait between two polls, which bounds the delay for what nothing
//! announces (another process's write to a SQLite file; a write while the PostgreSQL
//! listener is reconnecting).
//!
//! Child collections of the projection are followed the same way: each place a fact type
//! occurs in a collection (or in an exists inside one) has a statement finding the kept
//! results the new facts are connected to through the collection's joins; those results
//! are projected again, and reported as [`Change::Updated`] when their value changed.

mod channel;
mod deliver;
mod inverse;

use std::collections::{BTreeSet, HashMap, HashSet};
use std::time::{Duration, Instant};

use super::model::*;
use super::run::{Givens, QueryRow, top_plan};
use super::run::{RawRow, Reader, reads_collection, row_plain};
use crate::error::Result;
use crate::store::Store;
#[cfg(feature = "server")]
pub use channel::WatchStream;
pub use channel::{CHANNEL_CAPACITY, WatchHandle};
pub use deliver::{Changes, Stop};
use inverse::{Compiled, Finds, Inverse, steady};

/// A change to a watched query's results.
#[derive(Clone, Debug, PartialEq)]
pub enum Change {
    /// A new result.
    Added(QueryRow),
    /// A result that no longer holds, with its last value.
    Removed(QueryRow),
    /// A result that still holds whose child collections changed: the same key, its new
    /// value. (A result keeps its place in the query's order: that depends on its
    /// top-level facts only.)
    Updated(QueryRow),
}

/// What the statements of a poll found: the rows of new results (each with the index of
/// the inverse that read it), the keys of results whose membership may have changed, and
/// those whose child collections may have.
type Found = (Vec<(usize, RawRow)>, BTreeSet<Vec<i64>>, BTreeSet<Vec<i64>>);

/// New results read in a poll's transaction and built after it: their rows and the
/// position the poll reached.
struct Later {
    rows: Vec<(usize, RawRow)>,
    upto: i64,
}

/// A query's results, kept current by [`Watch::poll`].
#[derive(Debug)]
pub struct Watch {
    query: Query,
    givens: Givens,
    after: i64,
    /// The current results; with `limit n`, the first `n` in the query's order. Empty
    /// when `keep` is false.
    results: HashMap<Vec<i64>, QueryRow>,
    /// Whether `results` is kept: always, but for a watch whose results can only be added
    /// after [`Watch::forget_results`].
    keep: bool,
    /// Whether `results` holds every result of the query (always without `limit`). When
    /// not, every result outside `results` sorts after all of them.
    complete: bool,
    inverses: Vec<Inverse>,
    /// The query for one result key (slots: the key).
    recheck: Compiled,
    givens_released: bool,
    /// What the poll under way changed in `results`: each key with its value before,
    /// so that a poll that fails part way is undone ([`Watch::poll`]).
    undo: Vec<(Vec<i64>, Option<QueryRow>)>,
    /// The longest [`Watch::wait`] waits for a wake-up before it polls anyway: the delay
    /// for changes nothing announces (another process's write to a SQLite file).
    pub interval: Duration,
}
impl Store {
    /// Starts watching a query: its current results are in [`Watch::results`], and each
    /// [`Watch::poll`] reports what changed since. A query with `limit n` keeps the first
    /// `n` results in its order: a result that enters them pushes out the last one, and
    /// one that leaves lets the next one in.
    ///
    /// ```
    /// use precedent::{Fact, Store};
    /// use precedent::query::{Change, Givens, Query};
    ///
    /// let store = Store::open_in_memory()?;
    /// let shop = Fact::builder("Shop").field("name", "corner").build()?;
    /// store.insert(&shop)?;
    /// let q = Query::parse("given s: Shop match o: Shop.Order where o->shop = s select o.id")?;
    /// let mut watch = store.watch(&q, &Givens::from([("s".to_string(), shop.hash())]))?;
    /// assert!(watch.results().is_empty());
    ///
    /// let order = Fact::builder("Shop.Order").field("id", 1).predecessor("shop", shop.hash()).build()?;
    /// store.insert(&order)?;
    /// let changes = watch.poll(&store)?;
    /// assert!(matches!(&changes[..], [Change::Added(_)]));
    /// assert_eq!(watch.results().len(), 1);
    /// # Ok::<(), precedent::Error>(())
    /// ```
    ///
    /// # Errors
    /// [`crate::Error::Query`] for an unbound given or a query nested too deep; as
    /// [`Store::query`].
    pub fn watch(&self, query: &Query, givens: &Givens) -> Result<Watch> {
        self.watch_each(query, givens, |_| Ok(()))
    }

    /// Starts watching a query, as [`Store::watch`] does, calling `f` with each current
    /// result as it is read, in the query's order (what [`Watch::results`] returns
    /// after): a consumer that shows the results need not wait for the last one, nor
    /// copy them.
    ///
    /// ```
    /// # use precedent::{Fact, Store};
    /// # use precedent::query::{Givens, Query};
    /// # let store = Store::open_in_memory()?;
    /// store.insert(&Fact::builder("Shop").field("name", "corner").build()?)?;
    /// let q = Query::parse("match s: Shop select s.name")?;
    /// let mut shown = Vec::new();
    /// let watch = store.watch_each(&q, &Givens::new(), |row| {
    ///     shown.push(row.value.to_json());
    ///     Ok(())
    /// })?;
    /// assert_eq!(shown, vec!["corner"]);
    /// assert_eq!(watch.results().len(), 1);
    /// # Ok::<(), precedent::Error>(())
    /// ```
    ///
    /// # Errors
    /// As [`Store::watch`], or whatever `f` returns.
    pub fn watch_each(
        &self,
        query: &Query,
        givens: &Givens,
        mut f: impl FnMut(&QueryRow) -> Result<()>,
    ) -> Result<Watch> {
        query.check_depth()?;
        let mut w = Watch {
            query: query.clone(),
            givens: givens.clone(),
            after: 0,
            results: HashMap::new(),
            keep: true,
            complete: true,
            inverses: inverse::inverses(self.dialect(), query, givens)?,
            recheck: inverse::recheck_plan(self.dialect(), query, givens)?,
            givens_released: false,
            undo: Vec::new(),
            interval: Duration::from_millis(50),
        };
        self.read(|r| {
            let r = Reader(r);
            w.after = r.last_seq()?;
            w.refresh_givens(&r)?;
            if w.givens_released {
                w.start(&r, &mut f)?;
            }
            Ok(w)
        })
    }
}

impl Watch {
    /// The current results, in the query's order (its `order by`, then release order: see
    /// [`QueryRow::cmp_in`]); with `limit n`, the first `n`. Empty after
    /// [`Watch::forget_results`]: [`Watch::snapshot`] reads them then.
    pub fn results(&self) -> Vec<&QueryRow> {
        let mut rows: Vec<&QueryRow> = self.results.values().collect();
        rows.sort_by(|a, b| a.cmp_in(b, &self.query));
        rows
    }

    /// The release sequence number up to which facts have been taken into account.
    pub fn position(&self) -> i64 {
        self.after
    }

    /// Whether the query's results can only be added, never removed or updated: it has no
    /// `exists` or `not exists`, no `limit` and no child collection in its projection. Such
    /// a result depends only on its own facts and their ancestors, which never change.
    pub fn appends_only(&self) -> bool {
        self.query.limit.is_none()
            && !reads_collection(&self.query.select)
            && self.inverses.iter().all(|i| i.finds == Finds::Results)
    }

    /// Stops keeping the current results in memory, for a watch whose results can only
    /// be added ([`Watch::appends_only`]); `false`, and nothing changes, for any other.
    ///
    /// A watch keeps each current result (its key, value and sort keys) to tell what
    /// changed; one whose results only grow does not need them to, so without them its
    /// memory stays the same however many results it reports. [`Watch::results`] is then
    /// empty, and [`Watch::snapshot`] reads the results from the store.
    ///
    /// ```
    /// # use precedent::{Fact, Store};
    /// # use precedent::query::{Change, Givens, Query};
    /// let store = Store::open_in_memory()?;
    /// let q = Query::parse("match s: Shop select s.name")?;
    /// let mut watch = store.watch(&q, &Givens::new())?;
    /// assert!(watch.forget_results());
    /// store.insert(&Fact::builder("Shop").field("name", "corner").build()?)?;
    /// assert!(matches!(&watch.poll(&store)?[..], [Change::Added(_)]));
    /// assert!(watch.results().is_empty());
    /// let mut names = Vec::new();
    /// watch.snapshot(&store, |row| Ok(names.push(row.value.to_json())))?;
    /// assert_eq!(names, vec!["corner"]);
    /// # Ok::<(), precedent::Error>(())
    /// ```
    pub fn forget_results(&mut self) -> bool {
        if !self.appends_only() {
            return false;
        }
        self.keep = false;
        self.results = HashMap::new();
        true
    }

    /// Calls `f` with each current result (as of [`Watch::position`]) in the query's
    /// order: from [`Watch::results`], or, after [`Watch::forget_results`], read from
    /// `store`: the query's results now whose facts were all released by the watch's
    /// position (for such a query, exactly its results then).
    ///
    /// # Errors
    /// As [`Watch::poll`], or whatever `f` returns.
    pub fn snapshot(
        &self,
        store: &Store,
        mut f: impl FnMut(&QueryRow) -> Result<()>,
    ) -> Result<()> {
        if self.keep {
            return self.results().into_iter().try_for_each(f);
        }
        if !self.givens_released {
            return Ok(());
        }
        let upto = self.after;
        store.read(|r| {
            Reader(r).query_each(&self.query, &self.givens, &mut |row| {
                if row.key.iter().all(|&s| s <= upto) {
                    f(&row)?;
                }
                Ok(())
            })
        })
    }

    fn refresh_givens(&mut self, store: &Reader<'_>) -> Result<()> {
        let mut all = true;
        for g in &self.query.givens {
            // An unbound given fails when the query runs, with its name.
            if let Some(h) = self.givens.get(&g.label.name) {
                all &= store.seq_of(h)?.is_some();
            }
        }
        self.givens_released = all;
        Ok(())
    }

    /// Takes the facts released since the last poll into account and returns the changes
    /// in the order found: additions and removals (with `limit`, an addition that pushes a
    /// result out is followed by that result's removal), then updates.
    ///
    /// # Errors
    /// [`crate::Error::Backend`], [`crate::Error::Corrupt`].
    pub fn poll(&mut self, store: &Store) -> Result<Vec<Change>> {
        // A poll that fails part way (a statement's error, a dropped connection) is undone:
        // the changes it made to the kept results were never reported, so the next poll,
        // which reads the same facts again, must find them to do again.
        let before = (self.after, self.complete, self.givens_released);
        self.undo.clear();
        let polled = self.poll_once(store);
        let undo = std::mem::take(&mut self.undo);
        if polled.is_err() {
            for (key, was) in undo.into_iter().rev() {
                match was {
                    Some(row) => self.results.insert(key, row),
                    None => self.results.remove(&key),
                };
            }
            if !before.2 {
                // The results a poll read when the givens arrived (`start`): none before.
                self.results.clear();
            }
            (self.after, self.complete, self.givens_released) = before;
        }
        polled
    }

    fn poll_once(&mut self, store: &Store) -> Result<Vec<Change>> {
        // The read transaction may hold the write connection (`Store::read_brief`), so
        // what needs no statement (decoding the new results' facts and building them) is
        // done after it, whenever the poll found nothing else to do.
        let (mut changes, later) = store.read_brief(|r| self.poll_in(&Reader(r)))?;
        if let Some(Later { rows, upto }) = later {
            // Without kept results (only additions: every poll of such a watch ends
            // here), a result holding a fact of this range was not reported before, but
            // two statements of this poll may find the same one.
            let mut fresh = HashSet::new();
            for (i, raw) in rows {
                let env = raw.env(&self.inverses[i].compiled.plan)?;
                let row = row_plain(&self.query, &env)?;
                if self.keep {
                    self.admit(row, &mut changes);
                } else if self.inverses.len() < 2 || fresh.insert(row.key.clone()) {
                    changes.push(Change::Added(row));
                }
            }
            self.after = upto;
        }
        Ok(changes)
    }

    fn poll_in(&mut self, store: &Reader<'_>) -> Result<(Vec<Change>, Option<Later>)> {
        let released = store.released_types(self.after)?;
        let Some(&(upto, _)) = released.last() else {
            return Ok((Vec::new(), None));
        };
        let (after, mut changes) = (self.after, Vec::new());
        if !self.givens_released {
            self.refresh_givens(store)?;
            if self.givens_released {
                self.start(store, &mut |row| {
                    changes.push(Change::Added(row.clone()));
                    Ok(())
                })?;
            }
            self.after = upto;
            return Ok((changes, None));
        }
        let types: HashSet<i64> = released.iter().map(|&(_, t)| t).collect();
        let decode = super::run::decode_top(&self.query);
        let (rows, keys, children) = self.run_inverses(store, &types, &decode, [after, upto])?;
        // Only additions, with no limit to keep and no collection to read: nothing left
        // that needs the transaction.
        if keys.is_empty()
            && children.is_empty()
            && self.query.limit.is_none()
            && !reads_collection(&self.query.select)
        {
            return Ok((changes, Some(Later { rows, upto })));
        }
        for (i, raw) in rows {
            let env = raw.env(&self.inverses[i].compiled.plan)?;
            let row = store.row(&self.query, &env)?;
            self.admit(row, &mut changes);
        }
        for key in keys {
            self.recheck(store, key, &mut changes)?;
        }
        self.refill(store, &mut changes)?;
        self.update(store, children, &mut changes)?;
        self.after = upto;
        Ok((changes, None))
    }

    /// Runs the statement of every occurrence whose type is among the new facts' `types`:
    /// the rows of results containing a new fact, the keys of results whose membership
    /// they may change, and the keys of results whose child collections they may change
    /// (each key once).
    fn run_inverses(
        &self,
        store: &Reader<'_>,
        types: &HashSet<i64>,
        decode: &HashSet<String>,
        range: [i64; 2],
    ) -> Result<Found> {
        let (mut rows, mut keys, mut children) = (Vec::new(), BTreeSet::new(), BTreeSet::new());
        for (i, inv) in self.inverses.iter().enumerate() {
            match store.name_id(false, &inv.type_name)? {
                Some(id) if types.contains(&id) => {}
                _ => continue,
            }
            let (plan, params) = (&inv.compiled.plan, inv.compiled.bind(store, &range)?);
            let into = match inv.finds {
                Finds::Results => {
                    let found = store.raw_rows_bound(plan, &params, decode)?;
                    rows.extend(found.into_iter().map(|raw| (i, raw)));
                    continue;
                }
                Finds::Members => &mut keys,
                Finds::Children => &mut children,
            };
            store.run_query(&plan.sql, &params, true, |r| {
                let key = (0..plan.labels.len())
                    .map(|i| r.get(i * 3))
                    .collect::<Result<Vec<i64>>>()?;
                into.insert(key);
                Ok(())
            })?;
        }
        Ok((rows, keys, children))
    }

    /// Projects again each kept result among `keys` that was not added by this poll, and
    /// reports it as updated when its value (its child collections) changed.
    fn update(
        &mut self,
        store: &Reader<'_>,
        keys: BTreeSet<Vec<i64>>,
        changes: &mut Vec<Change>,
    ) -> Result<()> {
        let added: HashSet<&Vec<i64>> = changes
            .iter()
            .filter_map(|c| match c {
                Change::Added(r) => Some(&r.key),
                _ => None,
            })
            .collect();
        let keys: Vec<Vec<i64>> = keys
            .into_iter()
            .filter(|k| self.results.contains_key(k) && !added.contains(k))
            .collect();
        let decode = super::run::decode_top(&self.query);
        for key in keys {
            let params = self.recheck.bind(store, &key)?;
            let envs = store.rows_bound(&self.recheck.plan, &params, &decode)?;
            let Some(env) = envs.first() else { continue };
            let row = store.row(&self.query, env)?;
            if self
                .results
                .get(&key)
                .is_some_and(|old| old.value != row.value)
            {
                self.put(row.clone());
                changes.push(Change::Updated(row));
            }
        }
        Ok(())
    }

    /// `EXPLAIN QUERY PLAN` of every statement a poll may run (for tests of index use).
    ///
    /// # Errors
    /// As [`Watch::poll`].
    pub fn explain(&self, store: &Store) -> Result<Vec<Vec<String>>> {
        store.read(|r| self.explain_in(&Reader(r)))
    }

    fn explain_in(&self, store: &Reader<'_>) -> Result<Vec<Vec<String>>> {
        let mut plans = Vec::new();
        let key = vec![1; self.query.top_labels().len()];
        let statements = self
            .inverses
            .iter()
            .map(|inv| (&inv.compiled, vec![0, 1]))
            .chain([(&self.recheck, key.clone())]);
        for (c, values) in statements {
            plans.push(store.query_plan(&c.plan.sql, &c.bind(store, &values)?)?);
        }
        if self.query.limit.is_some() {
            // The keyset query that refills the kept results, after a made-up result.
            let row = QueryRow {
                key,
                value: super::run::Projected::Seq(0),
                order: vec![
                    super::value::SortKey::Number(super::value::Number::Int(0));
                    self.query.order.len()
                ],
            };
            let plan = steady(super::run::top_plan_after(
                store.dialect(),
                &self.query,
                &self.givens,
                &row,
                1,
            )?);
            plans.push(store.query_plan(&plan.sql, &store.bind(&plan.params)?)?);
        }
        Ok(plans)
    }

    /// Evaluates the query for one result key and records the change, if any.
    fn recheck(
        &mut self,
        store: &Reader<'_>,
        key: Vec<i64>,
        changes: &mut Vec<Change>,
    ) -> Result<()> {
        let params = self.recheck.bind(store, &key)?;
        let decode = super::run::decode_top(&self.query);
        let now = store
            .rows_bound(&self.recheck.plan, &params, &decode)?
            .into_iter()
            .next();
        match (now, self.results.contains_key(&key)) {
            (Some(env), false) => {
                let row = store.row(&self.query, &env)?;
                self.admit(row, changes);
            }
            (None, true) => {
                if let Some(row) = self.take(&key) {
                    changes.push(Change::Removed(row));
                }
            }
            _ => {}
        }
        Ok(())
    }

    /// Reads the query's current results (the first `n` with `limit n`) into `results`,
    /// calling `seen` with each as it is read, in the query's order.
    fn start(
        &mut self,
        store: &Reader<'_>,
        seen: &mut dyn FnMut(&QueryRow) -> Result<()>,
    ) -> Result<()> {
        let (query, givens, results) = (&self.query, &self.givens, &mut self.results);
        let keep = self.keep;
        let mut found = 0u64;
        store.query_each(query, givens, &mut |row| {
            seen(&row)?;
            found += 1;
            if keep {
                results.insert(row.key.clone(), row);
            }
            Ok(())
        })?;
        self.complete = self.query.limit.is_none_or(|n| found < n);
        Ok(())
    }

    /// The result that sorts last among `results`.
    fn last(&self) -> Option<&QueryRow> {
        self.results
            .values()
            .max_by(|a, b| a.cmp_in(b, &self.query))
    }

    /// Takes a result that holds now into `results` unless it is there already or, with
    /// `limit`, sorts after the results kept while others are left out. A result pushed
    /// past the limit by it is removed. Only for a watch that keeps its results.
    fn admit(&mut self, row: QueryRow, changes: &mut Vec<Change>) {
        debug_assert!(
            self.keep,
            "a watch without kept results only adds in `poll`"
        );
        if self.results.contains_key(&row.key) {
            return;
        }
        let Some(n) = self.query.limit else {
            self.put(row.clone());
            changes.push(Change::Added(row));
            return;
        };
        // With others left out, or no room left, it is taken only if it sorts before the
        // last kept; one that sorts after is left out (and the results are no longer all).
        let full = self.results.len() as u64 >= n;
        if !self.complete || full {
            let before_last = self
                .last()
                .is_some_and(|last| row.cmp_in(last, &self.query).is_lt());
            if !before_last {
                if full {
                    self.complete = false;
                }
                return;
            }
        }
        self.put(row.clone());
        changes.push(Change::Added(row));
        if self.results.len() as u64 > n {
            let key = self.last().map(|r| r.key.clone()).unwrap_or_default();
            if let Some(out) = self.take(&key) {
                changes.push(Change::Removed(out));
            }
            self.complete = false;
        }
    }

    /// With `limit n` and fewer than `n` results kept while others are left out, reads the
    /// next results in order after the last one kept (a keyset query) and adds them.
    fn refill(&mut self, store: &Reader<'_>, changes: &mut Vec<Change>) -> Result<()> {
        let Some(n) = self.query.limit else {
            return Ok(());
        };
        let have = self.results.len() as u64;
        if self.complete || have >= n {
            return Ok(());
        }
        let want = n - have;
        let plan = match self.last() {
            Some(last) => {
                super::run::top_plan_after(store.dialect(), &self.query, &self.givens, last, want)?
            }
            None => {
                let first = Query {
                    limit: Some(want),
                    ..self.query.clone()
                };
                top_plan(store.dialect(), &first, &self.givens, None)?
            }
        };
        let envs = store.rows(&steady(plan), &super::run::decode_top(&self.query))?;
        self.complete = (envs.len() as u64) < want;
        for env in envs {
            let row = store.row(&self.query, &env)?;
            self.put(row.clone());
            changes.push(Change::Added(row));
        }
        Ok(())
    }

    /// Sets the result of `row`'s key, remembering its value before for [`Watch::poll`]'s
    /// undo.
    fn put(&mut self, row: QueryRow) {
        let key = row.key.clone();
        let was = self.results.insert(key.clone(), row);
        self.undo.push((key, was));
    }

    /// Removes the result of `key`, remembering it for [`Watch::poll`]'s undo.
    fn take(&mut self, key: &[i64]) -> Option<QueryRow> {
        let out = self.results.remove(key)?;
        self.undo.push((key.to_vec(), Some(out.clone())));
        Some(out)
    }

    /// Polls until there are changes or `timeout` has passed: again at each wake-up of
    /// the store ([`Store::wait_for_wake`]: a commit through it and, on PostgreSQL, a
    /// commit from anywhere), and at least every [`Watch::interval`].
    ///
    /// # Errors
    /// As [`Watch::poll`].
    pub fn wait(&mut self, store: &Store, timeout: Duration) -> Result<Vec<Change>> {
        let deadline = Instant::now() + timeout;
        loop {
            // Taken before the poll: a commit after it ends the wait below at once.
            let mark = store.wake_mark();
            let changes = self.poll(store)?;
            let now = Instant::now();
            if !changes.is_empty() || now >= deadline {
                return Ok(changes);
            }
            store.wait_for_wake(mark, self.interval.min(deadline - now));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Fact;
    use crate::query::Query;

    fn order(n: i64) -> Fact {
        Fact::builder("Order").field("n", n).build().unwrap()
    }

    /// A poll that fails part way, after it took a new result in and before it rechecked
    /// another, is undone: the next poll reads the same facts and reports both changes.
    /// Before, the new result stayed in the kept results, unreported, and the next poll
    /// found it there and said nothing of it.
    #[test]
    fn a_poll_that_fails_part_way_is_undone_and_done_again() {
        let store = Store::open_in_memory().unwrap();
        let q = Query::parse(
            "match o: Order where not exists (match s: Shipped where s->order = o) select o.n",
        )
        .unwrap();
        let mut watch = store.watch(&q, &Givens::new()).unwrap();
        let a = order(1);
        store.insert(&a).unwrap();
        assert_eq!(watch.poll(&store).unwrap().len(), 1);
        let shipped = Fact::builder("Shipped")
            .predecessor("order", a.hash())
            .build()
            .unwrap();
        store.insert_batch(vec![order(2), shipped]).unwrap();
        let position = watch.position();
        // The recheck of order 1 (after order 2 was taken in) fails.
        super::super::run::FAIL_NEXT_ROWS_BOUND.with(|f| f.set(true));
        assert!(watch.poll(&store).is_err());
        assert_eq!(watch.position(), position);
        assert_eq!(
            watch.results().len(),
            1,
            "order 1 alone, as before the poll"
        );
        let changes = watch.poll(&store).unwrap();
        let added = changes
            .iter()
            .filter(|c| matches!(c, Change::Added(_)))
            .count();
        let removed = changes
            .iter()
            .filter(|c| matches!(c, Change::Removed(_)))
            .count();
        assert_eq!((added, removed), (1, 1), "{changes:?}");
        assert_eq!(watch.results().len(), 1, "order 2 alone");
    }
}
