//! A query called fluently: prepared from text or a [`Query`], its givens bound one label
//! at a time to a hash, a [`Ref`] or a fact, then run for rows, typed facts or serde
//! values, or watched.
//!
//! ```
//! use precedent::Store;
//! use precedent::query::{FactType, Ref};
//! use serde::{Deserialize, Serialize};
//!
//! #[derive(Serialize, Deserialize, FactType, Debug, PartialEq)]
//! #[fact(type = "Shop")]
//! struct Shop { name: String }
//!
//! #[derive(Serialize, Deserialize, FactType, Debug, PartialEq)]
//! #[fact(type = "Shop.Order")]
//! struct Order { shop: Ref<Shop>, id: u64 }
//!
//! let store = Store::open_in_memory()?;
//! let shop = store.save(&Shop { name: "corner".into() })?;
//! let order = store.save(&Order { shop, id: 7 })?;
//!
//! let orders = store
//!     .prepare("given s: Shop match o: Shop.Order where o->shop = s select o")?
//!     .given("s", shop)?
//!     .facts::<Order>()?;
//! assert_eq!(orders, vec![(order, Order { shop, id: 7 })]);
//! # Ok::<(), precedent::Error>(())
//! ```

use serde::de::DeserializeOwned;

use super::check::{QueryCheck, QueryWarning};
use super::run::{Givens, QueryRow};
use super::stream::QueryIter;
use super::typed::{FactType, Ref};
use super::watch::Watch;
use super::{Query, QueryError};
use crate::error::Result;
use crate::fact::Fact;
use crate::hash::FactHash;
use crate::store::Store;

/// What a given can be bound to: anything that names one fact.
pub trait IntoGiven {
    /// The hash of the fact.
    fn given_hash(&self) -> FactHash;
}

impl IntoGiven for FactHash {
    fn given_hash(&self) -> FactHash {
        *self
    }
}

impl<T> IntoGiven for Ref<T> {
    fn given_hash(&self) -> FactHash {
        self.hash()
    }
}

impl IntoGiven for Fact {
    fn given_hash(&self) -> FactHash {
        self.hash()
    }
}

impl<G: IntoGiven + ?Sized> IntoGiven for &G {
    fn given_hash(&self) -> FactHash {
        (**self).given_hash()
    }
}

/// A query with the store to run it on and the givens bound so far
/// ([`Store::prepare`], [`Store::prepare_query`]).
#[must_use = "a prepared query does nothing until it is run"]
pub struct PreparedQuery<'s> {
    store: &'s Store,
    query: Query,
    givens: Givens,
}

impl std::fmt::Debug for PreparedQuery<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PreparedQuery")
            .field("query", &self.query)
            .field("givens", &self.givens)
            .finish_non_exhaustive()
    }
}

impl Store {
    /// Parses a query in the text syntax, to bind its givens with
    /// [`PreparedQuery::given`] and run it.
    ///
    /// # Errors
    /// As [`Query::parse`].
    pub fn prepare(&self, text: &str) -> Result<PreparedQuery<'_>> {
        Ok(self.prepare_query(&Query::parse(text)?))
    }

    /// A query built in Rust, to bind its givens with [`PreparedQuery::given`] and run it.
    pub fn prepare_query(&self, query: &Query) -> PreparedQuery<'_> {
        PreparedQuery {
            store: self,
            query: query.clone(),
            givens: Givens::new(),
        }
    }
}

impl<'s> PreparedQuery<'s> {
    /// Binds the given `label` to a fact: a [`FactHash`], a [`Ref`] or a [`Fact`] (or a
    /// reference to one). Binding a label again replaces its fact.
    ///
    /// ```
    /// # use precedent::{Fact, Store};
    /// # let store = Store::open_in_memory()?;
    /// let shop = Fact::builder("Shop").field("name", "corner").build()?;
    /// store.insert(&shop)?;
    /// let q = store.prepare("given s: Shop match o: Shop.Order where o->shop = s select o")?;
    /// let err = q.given("t", &shop).unwrap_err();
    /// assert_eq!(err.to_string(), "query: no given t in this query (its givens: s)");
    /// # Ok::<(), precedent::Error>(())
    /// ```
    ///
    /// # Errors
    /// [`crate::Error::Query`] if the query has no given of that label.
    pub fn given(mut self, label: &str, fact: impl IntoGiven) -> Result<PreparedQuery<'s>> {
        if !self.query.givens.iter().any(|g| g.label.name == label) {
            let known: Vec<&str> = self
                .query
                .givens
                .iter()
                .map(|g| g.label.name.as_str())
                .collect();
            let known = if known.is_empty() {
                "it has none".to_string()
            } else {
                format!("its givens: {}", known.join(", "))
            };
            return Err(QueryError {
                line: 0,
                column: 0,
                message: format!("no given {label} in this query ({known})"),
            }
            .into());
        }
        self.givens.insert(label.to_string(), fact.given_hash());
        Ok(self)
    }

    /// The names the query uses that no stored fact, declared queue or type registered
    /// with `check` has ([`QueryCheck::run`]).
    ///
    /// ```
    /// # use precedent::{Fact, Store};
    /// use precedent::query::QueryCheck;
    /// # let store = Store::open_in_memory()?;
    /// store.insert(&Fact::builder("Shop").field("name", "corner").build()?)?;
    /// let q = store.prepare("match s: Shop select s.nmae")?;
    /// let warnings = q.check(&QueryCheck::new())?;
    /// assert_eq!(warnings[0].suggestions, ["name"]);
    /// assert!(q.check(&QueryCheck::new().strict(true)).is_err());
    /// # Ok::<(), precedent::Error>(())
    /// ```
    ///
    /// # Errors
    /// As [`QueryCheck::run`].
    pub fn check(&self, check: &QueryCheck) -> Result<Vec<QueryWarning>> {
        check.run(self.store, &self.query)
    }

    /// The query.
    pub fn query(&self) -> &Query {
        &self.query
    }

    /// The givens bound so far.
    pub fn givens(&self) -> &Givens {
        &self.givens
    }

    /// Runs the query: its results, as [`Store::query`] returns them.
    ///
    /// ```
    /// # use precedent::{Fact, Store};
    /// # let store = Store::open_in_memory()?;
    /// let shop = Fact::builder("Shop").field("name", "corner").build()?;
    /// let order = Fact::builder("Shop.Order").field("id", 1).predecessor("shop", shop.hash()).build()?;
    /// store.insert_batch(vec![shop.clone(), order])?;
    /// let rows = store
    ///     .prepare("given s: Shop match o: Shop.Order where o->shop = s select o.id")?
    ///     .given("s", shop.hash())?
    ///     .rows()?;
    /// assert_eq!(rows[0].value.to_json(), 1);
    /// # Ok::<(), precedent::Error>(())
    /// ```
    ///
    /// # Errors
    /// As [`Store::query`]: [`crate::Error::Query`] names a given left unbound.
    pub fn rows(&self) -> Result<Vec<QueryRow>> {
        self.store.query(&self.query, &self.givens)
    }

    /// Runs the query and calls `f` with each result as it is read, as
    /// [`Store::query_each`] does: one result held at a time.
    ///
    /// # Errors
    /// As [`Store::query_each`].
    pub fn each(&self, f: impl FnMut(QueryRow) -> Result<()>) -> Result<()> {
        self.store.query_each(&self.query, &self.givens, f)
    }

    /// Runs the query and returns its results as an iterator over one snapshot, read a
    /// page at a time, as [`Store::query_iter`] does.
    ///
    /// ```
    /// # use precedent::{Fact, Store};
    /// # let store = Store::open_in_memory()?;
    /// let shop = Fact::builder("Shop").field("name", "corner").build()?;
    /// let orders: Vec<Fact> = (0..5)
    ///     .map(|i| Fact::builder("Shop.Order").field("id", i).predecessor("shop", shop.hash()).build())
    ///     .collect::<Result<_, _>>()?;
    /// store.insert(&shop)?;
    /// store.insert_batch(orders)?;
    /// let ids: Vec<_> = store
    ///     .prepare("given s: Shop match o: Shop.Order where o->shop = s order by o.id desc select o.id")?
    ///     .given("s", &shop)?
    ///     .iter()?
    ///     .take(2)
    ///     .map(|r| r.map(|r| r.value.to_json()))
    ///     .collect::<Result<_, _>>()?;
    /// assert_eq!(ids, vec![4, 3]);
    /// # Ok::<(), precedent::Error>(())
    /// ```
    ///
    /// # Errors
    /// As [`Store::query_iter`].
    pub fn iter(&self) -> Result<QueryIter<'s>> {
        self.store.query_iter(&self.query, &self.givens)
    }

    /// Runs the query and deserialises each result into `T`, as
    /// [`QueryRow::value_as`] does: a record into a struct with the same field names.
    ///
    /// ```
    /// # use precedent::{Fact, Store};
    /// use serde::Deserialize;
    ///
    /// #[derive(Deserialize, Debug, PartialEq)]
    /// struct OrderView { id: u64, shop: String }
    ///
    /// # let store = Store::open_in_memory()?;
    /// let shop = Fact::builder("Shop").field("name", "corner").build()?;
    /// let order = Fact::builder("Shop.Order").field("id", 1).predecessor("shop", shop.hash()).build()?;
    /// store.insert_batch(vec![shop.clone(), order])?;
    /// let views: Vec<OrderView> = store
    ///     .prepare("given s: Shop match o: Shop.Order where o->shop = s select {id: o.id, shop: s.name}")?
    ///     .given("s", &shop)?
    ///     .rows_as()?;
    /// assert_eq!(views, vec![OrderView { id: 1, shop: "corner".into() }]);
    /// # Ok::<(), precedent::Error>(())
    /// ```
    ///
    /// # Errors
    /// As [`PreparedQuery::rows`]; [`crate::Error::ResultType`] for the first result that
    /// does not fit `T`, with its key and the field at fault.
    pub fn rows_as<T: DeserializeOwned>(&self) -> Result<Vec<T>> {
        super::typed_rows::rows_as(&self.rows()?)
    }

    /// Runs a query that selects facts (`select o`) and reads each as a `T`, as
    /// [`Store::query_as`] does.
    ///
    /// # Errors
    /// As [`Store::query_as`].
    pub fn facts<T: FactType>(&self) -> Result<Vec<(Ref<T>, T)>> {
        self.store.query_as(&self.query, &self.givens)
    }

    /// Starts watching the query, as [`Store::watch`] does.
    ///
    /// ```
    /// # use precedent::{Fact, Store};
    /// # let store = Store::open_in_memory()?;
    /// let shop = Fact::builder("Shop").field("name", "corner").build()?;
    /// store.insert(&shop)?;
    /// let mut watch = store
    ///     .prepare("given s: Shop match o: Shop.Order where o->shop = s select o.id")?
    ///     .given("s", &shop)?
    ///     .watch()?;
    /// assert!(watch.results().is_empty());
    /// store.insert(&Fact::builder("Shop.Order").field("id", 1).predecessor("shop", shop.hash()).build()?)?;
    /// assert_eq!(watch.poll(&store)?.len(), 1);
    /// # Ok::<(), precedent::Error>(())
    /// ```
    ///
    /// # Errors
    /// As [`Store::watch`].
    pub fn watch(&self) -> Result<Watch> {
        self.store.watch(&self.query, &self.givens)
    }
}
