//! precedent: a historical-modeling fact store.
//!
//! A *fact* is an immutable record: a type name, fields, and named sets of predecessor
//! facts. Its identity is the BLAKE3 hash of its canonical CBOR encoding, so the same
//! fact written twice is one fact. Predecessors form a DAG; a fact is *released*
//! (visible, numbered, exported) only once all its ancestors are present, and a fact that
//! arrives early is *held* durably until they are.
//!
//! ```
//! use precedent::{Fact, Store};
//!
//! let mut store = Store::open_in_memory()?;
//! let shop = Fact::builder("Shop").field("name", "corner").build()?;
//! let order = Fact::builder("Shop.Order")
//!     .field("id", 1)
//!     .predecessor("shop", shop.hash())
//!     .build()?;
//!
//! // Children may arrive first: the order is held until its shop arrives.
//! assert!(store.insert(&order)?.is_held());
//! let outcome = store.insert(&shop)?;
//! assert_eq!(outcome.released(), 2);
//! assert_eq!(store.get(&order.hash())?.unwrap().hash(), order.hash());
//! # Ok::<(), precedent::Error>(())
//! ```
//!
//! # Layout
//! - [`error`]: the one [`Error`] type.
//! - [`hash`]: [`FactHash`] and hash prefixes.
//! - [`fact`]: [`Fact`], [`Value`], the fact model and its limits. Plain data.
//! - [`encoding`]: canonical CBOR encode and strict decode; the only code that reads or
//!   writes fact bytes.
//! - [`json`]: the JSON form of facts, for people and the command line.
//! - [`dag`]: ordering a batch of facts so parents come before children (petgraph).
//! - [`clock`]: the time source for leases and backoff ([`clock::ManualClock`] in tests).
//! - [`query`]: queries (text syntax, builder), compiled to SQL; typed facts; live
//!   watches.
//! - [`queue`]: work queue declarations, leases, failures, stats (the SQL is in `store`).
//! - [`store`]: the SQLite store: schema migrations, inserts, held facts, reads, verify,
//!   and the queue index kept up to date as facts are released.
//! - [`sync`]: replication between nodes over HTTP: wire format, server, client.

#![deny(missing_docs)]
#![cfg_attr(docsrs, feature(doc_cfg))]

pub mod clock;
pub mod dag;
pub mod encoding;
pub mod error;
pub mod fact;
pub mod hash;
pub mod json;
pub mod query;
pub mod queue;
pub mod store;
pub mod sync;

pub use error::{Error, Result};
pub use fact::{Fact, FactBuilder, Fields, Predecessors, Value};
pub use hash::{FactHash, HashPrefix};
pub use store::{BatchReport, InsertOutcome, Store, StoreOptions};
