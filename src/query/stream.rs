//! Results as they are read, without holding them all: a callback over one statement
//! ([`Store::query_each`]) and an iterator that reads pages ([`Store::query_iter`]).
//!
//! Both read every result from one snapshot. They differ in how the database is stepped:
//! - `query_each` runs the query's statement once and hands each result to the caller
//!   at its row, so it costs what [`Store::query`] costs (which is built on it) and
//!   holds one result at a time;
//! - `query_iter` cannot keep a statement open between calls to `next` (the seam hands
//!   rows to a callback), so it keeps its read transaction open instead and reads a page
//!   of results at a time with a keyset statement: the first `page` results sorting after
//!   the last one read, in the query's order, the statement a limited watch refills with.
//!   Each page is one statement: without `order by`, a range of release order; with an
//!   `order by` on a field, the database finds and sorts the results after the last one
//!   again for each page, so for a large ordered result set `query_each` is the cheaper
//!   form.

use std::collections::{HashSet, VecDeque};

use super::model::Query;
use super::run::{
    Givens, QueryRow, Reader, decode_top, reads_collection, top_plan, top_plan_after_key,
};
use crate::error::{Error, Result};
use crate::predicate::SortKey;
use crate::store::{ReadTx, Store};

/// How many results [`Store::query_iter`] reads per statement.
pub const DEFAULT_PAGE: usize = 1_000;

impl Store {
    /// Runs a query and calls `f` with each result, in the query's order, as it is read:
    /// the first result arrives before the last is computed, and only one is held at a
    /// time. Every result is read from one snapshot. Stops at the first error, from the
    /// store or from `f`, and returns it.
    ///
    /// ```
    /// # use precedent::{Fact, Store};
    /// # use precedent::query::{Givens, Query};
    /// # let store = Store::open_in_memory()?;
    /// let shop = Fact::builder("Shop").field("name", "corner").build()?;
    /// store.insert(&shop)?;
    /// let q = Query::parse("match s: Shop select s.name")?;
    /// let mut names = Vec::new();
    /// store.query_each(&q, &Givens::new(), |row| {
    ///     names.push(row.value.to_json());
    ///     Ok(())
    /// })?;
    /// assert_eq!(names, vec!["corner"]);
    /// # Ok::<(), precedent::Error>(())
    /// ```
    ///
    /// # Errors
    /// As [`Store::query`], or whatever `f` returns.
    pub fn query_each(
        &self,
        query: &Query,
        givens: &Givens,
        mut f: impl FnMut(QueryRow) -> Result<()>,
    ) -> Result<()> {
        self.read(|r| Reader(r).query_each(query, givens, &mut f))
    }

    /// As [`Store::query_each`], for one page of a keyset paging: only the results that
    /// sort after `after` (an earlier result's `order` and `key`, as [`QueryRow`] carries
    /// them), and at most `limit` of them, which replaces the query's own `limit` (a
    /// caller paging a limited query carries what is left of it). One statement, one
    /// snapshot; a cursor kept between calls sees the writes made between them.
    ///
    /// ```
    /// # use precedent::{Fact, Store};
    /// # use precedent::query::{Givens, Query, QueryRow};
    /// # let store = Store::open_in_memory()?;
    /// for i in 0..5 {
    ///     store.insert(&Fact::builder("Shop").field("n", i).build()?)?;
    /// }
    /// let q = Query::parse("match s: Shop order by s.n desc select s.n")?;
    /// let (mut seen, mut last): (Vec<String>, Option<QueryRow>) = (Vec::new(), None);
    /// loop {
    ///     let after = last.as_ref().map(|r| (&r.order[..], &r.key[..]));
    ///     let mut page = Vec::new();
    ///     store.query_each_after(&q, &Givens::new(), after, Some(2), |row| {
    ///         page.push(row);
    ///         Ok(())
    ///     })?;
    ///     seen.extend(page.iter().map(|r| r.value.to_json().to_string()));
    ///     match page.pop() {
    ///         Some(r) => last = Some(r),
    ///         None => break,
    ///     }
    /// }
    /// assert_eq!(seen, ["4", "3", "2", "1", "0"]);
    /// # Ok::<(), precedent::Error>(())
    /// ```
    ///
    /// # Errors
    /// As [`Store::query_each`].
    pub fn query_each_after(
        &self,
        query: &Query,
        givens: &Givens,
        after: Option<(&[SortKey], &[i64])>,
        limit: Option<u64>,
        f: impl FnMut(QueryRow) -> Result<()>,
    ) -> Result<()> {
        self.query_each_after_in(query, givens, false, after, limit, f)
    }

    /// As [`Store::query_each_after`]; with `typed`, [`check_given_types`] in the same
    /// read transaction when the statement found nothing (a given of another type
    /// finds nothing, so a result proves the types right).
    pub(crate) fn query_each_after_in(
        &self,
        query: &Query,
        givens: &Givens,
        typed: bool,
        after: Option<(&[SortKey], &[i64])>,
        limit: Option<u64>,
        mut f: impl FnMut(QueryRow) -> Result<()>,
    ) -> Result<()> {
        self.read(|tx| {
            let plan = match after {
                None => {
                    let q = Query {
                        limit,
                        ..query.clone()
                    };
                    top_plan(tx.dialect(), &q, givens, None)?
                }
                Some(k) => top_plan_after_key(
                    tx.dialect(),
                    query,
                    givens,
                    k,
                    limit.unwrap_or(i64::MAX as u64),
                )?,
            };
            let r = Reader(tx);
            let decode = decode_top(query);
            let streamed = !reads_collection(&query.select);
            let mut found = false;
            r.each_row(
                &plan,
                &r.bind(&plan.params)?,
                &decode,
                streamed,
                &mut |env| {
                    found = true;
                    f(r.row(query, &env)?)
                },
            )?;
            if typed && !found {
                check_given_types(tx, query, givens)?;
            }
            Ok(())
        })
    }

    /// Runs a query and returns its results as an iterator, read [`DEFAULT_PAGE`] at a
    /// time (see [`Store::query_pages`]).
    ///
    /// ```
    /// # use precedent::{Fact, Store};
    /// # use precedent::query::{Givens, Query};
    /// # let store = Store::open_in_memory()?;
    /// for i in 0..3 {
    ///     store.insert(&Fact::builder("Shop").field("name", format!("shop-{i}")).build()?)?;
    /// }
    /// let q = Query::parse("match s: Shop select s.name")?;
    /// let first = store.query_iter(&q, &Givens::new())?.next().transpose()?;
    /// assert_eq!(first.map(|r| r.value.to_json()), Some("shop-0".into()));
    /// # Ok::<(), precedent::Error>(())
    /// ```
    ///
    /// # Errors
    /// As [`Store::query`], for the first page; later pages' errors are items.
    pub fn query_iter(&self, query: &Query, givens: &Givens) -> Result<QueryIter<'_>> {
        self.query_pages(query, givens, DEFAULT_PAGE)
    }

    /// Runs a query and returns its results as an iterator that holds one read
    /// transaction, so that every result comes from one snapshot however long it is
    /// kept, and reads `page` results (at least 1) per statement: smaller pages hold
    /// less, larger ones run fewer statements. The first page is read here, which takes
    /// the snapshot. A query's own `limit` holds across pages.
    ///
    /// Keeping the iterator keeps its snapshot: the database cannot reclaim what later
    /// writes replace until it is dropped.
    ///
    /// # Errors
    /// As [`Store::query`], for the first page; later pages' errors are items.
    pub fn query_pages(
        &self,
        query: &Query,
        givens: &Givens,
        page: usize,
    ) -> Result<QueryIter<'_>> {
        self.query_pages_in(query, givens, false, page)
    }

    /// As [`Store::query_pages`]; with `typed`, [`check_given_types`] in the iterator's
    /// read transaction when the first page is empty (see
    /// [`Store::query_each_after_in`]).
    pub(crate) fn query_pages_in(
        &self,
        query: &Query,
        givens: &Givens,
        typed: bool,
        page: usize,
    ) -> Result<QueryIter<'_>> {
        let mut it = QueryIter {
            tx: self.begin_read()?,
            query: query.clone(),
            givens: givens.clone(),
            decode: decode_top(query),
            page: page.max(1) as u64,
            read: VecDeque::new(),
            left: query.limit,
            last: None,
            done: false,
        };
        it.read_page()?;
        if typed && it.read.is_empty() {
            check_given_types(&*it.tx, query, givens)?;
        }
        Ok(it)
    }
}

/// A given bound to a released fact of another type than the query declares is a
/// mistake, not a query with no results: [`Error::WrongType`] (a given not released
/// passes; the query then finds nothing).
///
/// # Errors
/// [`Error::WrongType`]; store errors.
pub(crate) fn check_given_types(tx: &dyn ReadTx, query: &Query, givens: &Givens) -> Result<()> {
    for g in &query.givens {
        let Some(hash) = givens.get(&g.label.name) else {
            continue;
        };
        if let Some(f) = tx.get(hash)?
            && f.type_name() != g.type_name
        {
            return Err(Error::WrongType {
                hash: *hash,
                expected: g.type_name.clone(),
                found: f.type_name().to_string(),
            });
        }
    }
    Ok(())
}

/// The results of a query, read a page at a time in one read transaction
/// ([`Store::query_pages`]).
#[must_use = "an iterator reads nothing until it is advanced"]
pub struct QueryIter<'s> {
    tx: Box<dyn ReadTx + 's>,
    query: Query,
    givens: Givens,
    decode: HashSet<String>,
    page: u64,
    /// Results read and not yet handed out.
    read: VecDeque<QueryRow>,
    /// How many more results the query's `limit` allows.
    left: Option<u64>,
    /// The `order by` values and key of the last result read: the next page starts
    /// after it.
    last: Option<(Vec<crate::query::value::SortKey>, Vec<i64>)>,
    /// Whether the last page read was short: nothing is left to read.
    done: bool,
}

impl std::fmt::Debug for QueryIter<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QueryIter")
            .field("query", &self.query)
            .field("page", &self.page)
            .field("buffered", &self.read.len())
            .field("done", &self.done)
            .finish_non_exhaustive()
    }
}

impl QueryIter<'_> {
    /// Reads the next page into `read`, or marks the iterator done.
    fn read_page(&mut self) -> Result<()> {
        let want = self.left.map_or(self.page, |n| n.min(self.page));
        if want == 0 {
            self.done = true;
            return Ok(());
        }
        let plan = match &self.last {
            None => {
                // The query's own limit is `left` here; the page's is `want`.
                let first = Query {
                    limit: Some(want),
                    ..self.query.clone()
                };
                top_plan(self.tx.dialect(), &first, &self.givens, None)?
            }
            Some((order, key)) => top_plan_after_key(
                self.tx.dialect(),
                &self.query,
                &self.givens,
                (order, key),
                want,
            )?,
        };
        let r = Reader(&*self.tx);
        let mut got = 0;
        let streamed = !reads_collection(&self.query.select);
        r.each_row(
            &plan,
            &r.bind(&plan.params)?,
            &self.decode,
            streamed,
            &mut |env| {
                let row = r.row(&self.query, &env)?;
                got += 1;
                self.read.push_back(row);
                Ok(())
            },
        )?;
        if let Some(row) = self.read.back() {
            self.last = Some((row.order.clone(), row.key.clone()));
        }
        if let Some(n) = &mut self.left {
            *n -= got;
        }
        self.done = got < want;
        Ok(())
    }
}

impl Iterator for QueryIter<'_> {
    type Item = Result<QueryRow>;

    fn next(&mut self) -> Option<Result<QueryRow>> {
        if self.read.is_empty()
            && !self.done
            && let Err(e) = self.read_page()
        {
            // Nothing after an error: the caller sees it once.
            self.done = true;
            return Some(Err(e));
        }
        self.read.pop_front().map(Ok)
    }
}
