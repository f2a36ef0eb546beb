//! Queries over facts: a text syntax and a builder for one model, compiled to SQL over
//! the store's tables; typed facts; live watches.
//!
//! ```
//! use precedent::{Fact, Store};
//! use precedent::query::{Givens, Query};
//!
//! let store = Store::open_in_memory()?;
//! let shop = Fact::builder("Shop").field("name", "corner").build()?;
//! let order = Fact::builder("Shop.Order").field("id", 1).predecessor("shop", shop.hash()).build()?;
//! store.insert_batch(vec![shop.clone(), order.clone()])?;
//!
//! let q = Query::parse(
//!     "given s: Shop
//!      match o: Shop.Order where o->shop = s
//!        and not exists (match sh: Shop.Shipment where sh->order = o)
//!      select o.id",
//! )?;
//! let givens = Givens::from([("s".to_string(), shop.hash())]);
//! let rows = store.query(&q, &givens)?;
//! assert_eq!(rows.len(), 1);
//! # Ok::<(), precedent::Error>(())
//! ```
//!
//! # Layout
//! - [`model`]: the query model, its checks, the builder.
//! - `parse`: the text syntax (grammar in its docs and in `docs/queries.md`).
//! - [`value`]: how field predicates compare values and how fields sort (the pure
//!   [`crate::predicate`] module, which the backend also runs inside the database).
//! - `sql`: compilation to one SQL statement with bound parameters.
//! - `run`: execution and projections ([`Store::query`](crate::Store::query)).
//! - `stream`: results as they are read, by callback or iterator
//!   ([`Store::query_each`](crate::Store::query_each), [`QueryIter`]).
//! - [`typed`]: typed facts ([`FactType`], [`Ref`]).
//! - `typed_rows`: results read into serde types ([`QueryRow::value_as`]).
//! - `check`: names no stored fact has, with the nearest known ones ([`QueryCheck`],
//!   [`Store::check_query`](crate::Store::check_query)); `nearest`: the edit distance.
//! - `call`: fluent calls ([`Store::prepare`](crate::Store::prepare), [`PreparedQuery`]).
//! - [`watch`]: live watches ([`Watch`]).

mod call;
mod check;
pub mod model;
mod nearest;
mod parse;
mod run;
mod sql;
mod stream;
pub mod typed;
mod typed_rows;
pub use crate::predicate as value;
pub mod watch;

use std::fmt;

pub use call::{IntoGiven, PreparedQuery};
pub use check::{QueryCheck, QueryWarning, Unknown};
pub use model::{
    Cond, Condition, Given, Label, Match, OrderKey, Pos, Projection, Query, QueryBuilder, RolePath,
    SortBy, SubQuery, Test,
};
/// `#[derive(FactType)]`, from the `precedent-derive` crate (see [`typed`]).
pub use precedent_derive::FactType;
#[cfg(feature = "server")]
pub(crate) use run::reads_collection;
pub use run::{Givens, Projected, QueryRow};
#[cfg(feature = "server")]
pub(crate) use stream::check_given_types;
pub use stream::{DEFAULT_PAGE, QueryIter};
pub use typed::{Arity, FactType, Ref};
pub use value::Op;
#[cfg(feature = "server")]
pub use watch::WatchStream;
pub use watch::{Change, Changes, Stop, Watch, WatchHandle};

/// A query that does not parse or does not check.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct QueryError {
    /// Line of the problem, from 1; 0 for a query built in Rust.
    pub line: usize,
    /// Column, from 1, in characters.
    pub column: usize,
    /// What is wrong, and what was expected.
    pub message: String,
}

impl fmt::Display for QueryError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.line == 0 {
            write!(f, "query: {}", self.message)
        } else {
            write!(
                f,
                "query at line {}, column {}: {}",
                self.line, self.column, self.message
            )
        }
    }
}

impl std::error::Error for QueryError {}
