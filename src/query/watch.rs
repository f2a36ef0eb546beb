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
//! Edges are never removed, so a connection found now held when the fact arrived; and
//! each check reads the current state, so the results after a poll are exactly the
//! query's results at that moment, however many facts a poll covers. A given that is not
//! released when the watch starts makes the query empty until it is; the poll that sees it
//! runs the whole query once. Facts released from the held set, or written by another
//! process on the same file, get sequence numbers like any other and are seen by the next
//! poll: [`Watch::wait`] polls every [`Watch::interval`] (default 50 ms), which bounds the
//! delay. Child collections in the projection are evaluated when a result is added and
//! not followed afterwards.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use super::QueryError;
use super::model::*;
use super::run::{Givens, QueryRow, top_plan};
use super::sql::{self, Bind, Node, Plan, Shape};
use crate::error::Result;
use crate::store::Store;

/// A change to a watched query's results.
#[derive(Clone, Debug, PartialEq)]
pub enum Change {
    /// A new result.
    Added(QueryRow),
    /// A result that no longer holds, as it was when added.
    Removed(QueryRow),
}

/// Where a fact type occurs in the query.
#[derive(Clone, Debug)]
enum Occurrence {
    /// A top-level match.
    Top { label: String, type_name: String },
    /// Inside exists conditions: the matches of each exists block on the path, outermost
    /// first, and the pinned label.
    Inner {
        blocks: Vec<Vec<Match>>,
        label: String,
        type_name: String,
    },
}

/// A query's results, kept current by [`Watch::poll`].
#[derive(Debug)]
pub struct Watch {
    query: Query,
    givens: Givens,
    after: i64,
    results: HashMap<Vec<i64>, QueryRow>,
    occurrences: Vec<Occurrence>,
    givens_released: bool,
    /// How often [`Watch::wait`] polls.
    pub interval: Duration,
}

impl Store {
    /// Starts watching a query: its current results are in [`Watch::results`], and each
    /// [`Watch::poll`] reports what changed since.
    ///
    /// # Errors
    /// [`crate::Error::Query`] for a query with `limit` (a watch follows every result) or
    /// an unbound given; as [`Store::query`].
    pub fn watch(&self, query: &Query, givens: &Givens) -> Result<Watch> {
        if query.limit.is_some() {
            return Err(QueryError {
                line: 0,
                column: 0,
                message: "a watch follows every result: remove limit".into(),
            }
            .into());
        }
        let mut occurrences = Vec::new();
        for m in &query.matches {
            occurrences.push(Occurrence::Top {
                label: m.label.name.clone(),
                type_name: m.type_name.clone(),
            });
            collect_inner(&m.conditions, &mut Vec::new(), &mut occurrences);
        }
        let mut w = Watch {
            query: query.clone(),
            givens: givens.clone(),
            after: 0,
            results: HashMap::new(),
            occurrences,
            givens_released: false,
            interval: Duration::from_millis(50),
        };
        w.after = self.last_seq()?;
        w.refresh_givens(self)?;
        if w.givens_released {
            for row in self.query(&w.query, &w.givens)? {
                w.results.insert(row.key.clone(), row);
            }
        }
        Ok(w)
    }
}

/// The conditions of `matches` other than exists conditions.
fn without_exists<'a>(matches: &'a [Match], conds: &mut Vec<&'a Condition>) {
    for m in matches {
        conds.extend(
            m.conditions
                .iter()
                .filter(|c| !matches!(c, Condition::Exists { .. })),
        );
    }
}

fn collect_inner(conds: &[Condition], path: &mut Vec<Vec<Match>>, out: &mut Vec<Occurrence>) {
    for c in conds {
        if let Condition::Exists { matches, .. } = c {
            path.push(matches.clone());
            for m in matches {
                out.push(Occurrence::Inner {
                    blocks: path.clone(),
                    label: m.label.name.clone(),
                    type_name: m.type_name.clone(),
                });
                collect_inner(&m.conditions, path, out);
            }
            path.pop();
        }
    }
}

impl Watch {
    /// The current results, in key order.
    pub fn results(&self) -> Vec<&QueryRow> {
        let mut rows: Vec<&QueryRow> = self.results.values().collect();
        rows.sort_by(|a, b| a.key.cmp(&b.key));
        rows
    }

    /// The release sequence number up to which facts have been taken into account.
    pub fn position(&self) -> i64 {
        self.after
    }

    fn refresh_givens(&mut self, store: &Store) -> Result<()> {
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

    /// Takes the facts released since the last poll into account and returns the changes,
    /// additions and removals in the order found.
    ///
    /// # Errors
    /// [`crate::Error::Sqlite`], [`crate::Error::Corrupt`].
    pub fn poll(&mut self, store: &Store) -> Result<Vec<Change>> {
        let upto = store.last_seq()?;
        if upto <= self.after {
            return Ok(Vec::new());
        }
        let (after, mut changes) = (self.after, Vec::new());
        if !self.givens_released {
            self.refresh_givens(store)?;
            if self.givens_released {
                for row in store.query(&self.query, &self.givens)? {
                    self.results.insert(row.key.clone(), row.clone());
                    changes.push(Change::Added(row));
                }
            }
            self.after = upto;
            return Ok(changes);
        }
        for occ in self.occurrences.clone() {
            match occ {
                Occurrence::Top { label, type_name } => {
                    if store.name_id(false, &type_name)?.is_none() {
                        continue;
                    }
                    let pins = HashMap::from([(label, Bind::Range(after, upto))]);
                    let plan = top_plan(&self.query, &self.givens, Some(&pins))?;
                    for env in store.rows(&plan, &super::run::decode_set(&self.query.select))? {
                        let row = store.row(&self.query, &env)?;
                        if !self.results.contains_key(&row.key) {
                            self.results.insert(row.key.clone(), row.clone());
                            changes.push(Change::Added(row));
                        }
                    }
                }
                Occurrence::Inner {
                    blocks,
                    label,
                    type_name,
                } => {
                    if store.name_id(false, &type_name)?.is_none() {
                        continue;
                    }
                    for key in self.candidates(store, &blocks, &label, after, upto)? {
                        self.recheck(store, key, &mut changes)?;
                    }
                }
            }
        }
        self.after = upto;
        Ok(changes)
    }

    /// The statement finding top-level results connected to new facts at an inner
    /// occurrence.
    fn candidate_plan(
        &self,
        blocks: &[Vec<Match>],
        label: &str,
        after: i64,
        upto: i64,
    ) -> Result<Plan> {
        let mut nodes = super::run::top_nodes(&self.query, &self.givens, None)?;
        let mut conds: Vec<&Condition> = Vec::new();
        without_exists(&self.query.matches, &mut conds);
        for block in blocks {
            without_exists(block, &mut conds);
            nodes.extend(sql::free_nodes(block));
        }
        for n in &mut nodes {
            if n.label == label {
                n.bind = Bind::Range(after, upto);
            }
        }
        let output: Vec<String> = self
            .query
            .top_labels()
            .iter()
            .map(|s| s.to_string())
            .collect();
        Ok(sql::compile(
            &nodes,
            &conds,
            &Shape {
                output,
                order: &[],
                limit: None,
                distinct: true,
            },
        )?)
    }

    /// Top-level results connected to the new facts at an inner occurrence.
    fn candidates(
        &self,
        store: &Store,
        blocks: &[Vec<Match>],
        label: &str,
        after: i64,
        upto: i64,
    ) -> Result<Vec<Vec<i64>>> {
        let plan = self.candidate_plan(blocks, label, after, upto)?;
        let mut keys = Vec::new();
        store.run_query(&plan.sql, &store.bind(&plan.params)?, |r| {
            let key = (0..plan.labels.len())
                .map(|i| r.get(i * 3))
                .collect::<rusqlite::Result<Vec<i64>>>()?;
            keys.push(key);
            Ok(())
        })?;
        Ok(keys)
    }

    /// The statement evaluating the query for one result key.
    fn recheck_plan(&self, key: &[i64]) -> Result<Plan> {
        let labels = self.query.top_labels();
        let pins: HashMap<String, Bind> = labels
            .iter()
            .zip(key)
            .map(|(l, s)| (l.to_string(), Bind::Seq(*s)))
            .collect();
        let nodes: Vec<Node> = super::run::top_nodes(&self.query, &self.givens, Some(&pins))?;
        let conds: Vec<&Condition> = self
            .query
            .matches
            .iter()
            .flat_map(|m| m.conditions.iter())
            .collect();
        let output = labels.iter().map(|s| s.to_string()).collect();
        Ok(sql::compile(
            &nodes,
            &conds,
            &Shape {
                output,
                order: &[],
                limit: Some(1),
                distinct: false,
            },
        )?)
    }

    /// `EXPLAIN QUERY PLAN` of every statement a poll may run (for tests of index use).
    ///
    /// # Errors
    /// As [`Watch::poll`].
    pub fn explain(&self, store: &Store) -> Result<Vec<Vec<String>>> {
        let mut plans = Vec::new();
        for occ in &self.occurrences {
            let plan = match occ {
                Occurrence::Top { label, .. } => {
                    let pins = HashMap::from([(label.clone(), Bind::Range(0, 1))]);
                    top_plan(&self.query, &self.givens, Some(&pins))?
                }
                Occurrence::Inner { blocks, label, .. } => {
                    self.candidate_plan(blocks, label, 0, 1)?
                }
            };
            plans.push(store.query_plan(&plan.sql, &store.bind(&plan.params)?)?);
        }
        let key = vec![1; self.query.top_labels().len()];
        let plan = self.recheck_plan(&key)?;
        plans.push(store.query_plan(&plan.sql, &store.bind(&plan.params)?)?);
        Ok(plans)
    }

    /// Evaluates the query for one result key and records the change, if any.
    fn recheck(&mut self, store: &Store, key: Vec<i64>, changes: &mut Vec<Change>) -> Result<()> {
        let plan = self.recheck_plan(&key)?;
        let now = store
            .rows(&plan, &super::run::decode_set(&self.query.select))?
            .into_iter()
            .next();
        match (now, self.results.contains_key(&key)) {
            (Some(env), false) => {
                let row = store.row(&self.query, &env)?;
                self.results.insert(key, row.clone());
                changes.push(Change::Added(row));
            }
            (None, true) => {
                if let Some(row) = self.results.remove(&key) {
                    changes.push(Change::Removed(row));
                }
            }
            _ => {}
        }
        Ok(())
    }

    /// Polls every [`Watch::interval`] until there are changes or `timeout` has passed.
    ///
    /// # Errors
    /// As [`Watch::poll`].
    pub fn wait(&mut self, store: &Store, timeout: Duration) -> Result<Vec<Change>> {
        let deadline = Instant::now() + timeout;
        loop {
            let changes = self.poll(store)?;
            if !changes.is_empty() || Instant::now() >= deadline {
                return Ok(changes);
            }
            std::thread::sleep(self.interval.min(deadline - Instant::now()));
        }
    }
}
