//! precedent: a historical-modeling fact store.
//!
//! A *fact* is an immutable record: a type name, fields, and named sets of predecessor
//! facts. Its identity is the BLAKE3 hash of its canonical CBOR encoding, so the same
//! fact written twice is one fact. Predecessors form a DAG; a fact is *released*
//! (visible, numbered, exported) only once all its ancestors are present, and a fact that
//! arrives early is *held* durably until they are. The store doubles as a work queue:
//! pending work is the facts of a type with no completing successor.
//!
//! # A tour
//!
//! ```
//! use precedent::{Fact, Store};
//! use precedent::queue::{Completion, QueueSpec};
//!
//! // One store, shared by every thread of the app (`Store` is `Send + Sync`).
//! let store = std::sync::Arc::new(Store::open_in_memory()?);
//! let shop = Fact::builder("Shop").field("name", "corner").build()?;
//! let order = Fact::builder("Shop.Order")
//!     .field("id", 1)
//!     .predecessor("shop", shop.hash())
//!     .build()?;
//!
//! // Children may arrive first: the order is held until its shop arrives.
//! assert!(store.insert(&order)?.is_held());
//! assert_eq!(store.insert(&shop)?.released(), 2);
//!
//! // A query: the orders of a shop that nothing has shipped yet.
//! let pending = store
//!     .prepare("given s: Shop
//!               match o: Shop.Order where o->shop = s
//!                 and not exists (match sh: Shop.Shipment where sh->order = o)
//!               select o.id")?
//!     .given("s", &shop)?
//!     .rows()?;
//! assert_eq!(pending.len(), 1);
//!
//! // A queue of the same work: completing an order means storing its shipment, in the
//! // same transaction as the handler's own writes.
//! let shipped = Completion { type_name: "Shop.Shipment".into(), role: "order".into() };
//! store.declare_queue(&QueueSpec::new("ship", "Shop.Order", vec![shipped]))?;
//! let lease = store.claim("ship", 1)?.pop().expect("one order is pending");
//! store.complete(&lease, |w| {
//!     w.insert(&lease.completion().field("carrier", "post").build()?)?;
//!     Ok(())
//! })?;
//! assert!(store.claim("ship", 1)?.is_empty());
//! # Ok::<(), precedent::Error>(())
//! ```
//!
//! # Layout
//! Dependencies point one way: the pure modules know nothing of storage; the fact core
//! (`store`) knows nothing of what is built on it; queues, sync and queries reach the
//! database only through the core's seam (`docs/design.md`).
//! - [`error`]: the one [`Error`] type.
//! - [`hash`]: [`FactHash`] and hash prefixes.
//! - [`fact`]: [`Fact`], [`Value`], the fact model and its limits. Plain data.
//! - [`encoding`]: canonical CBOR encode and strict decode; the only code that reads or
//!   writes fact bytes.
//! - [`predicate`]: how field predicates compare values and how fields sort. Pure.
//! - [`ingest`]: decoding a body of received records on every core, in order (import
//!   and both receiving sides of sync).
//! - [`json`]: the JSON form of facts, for people and the command line.
//! - [`dag`]: ordering a batch of facts so parents come before children (petgraph).
//! - [`clock`]: the time source for leases and backoff ([`clock::ManualClock`] in tests).
//! - [`store`]: the fact core: [`Store`], [`Writer`], the backend seam
//!   ([`store::Backend`], [`store::ReadTx`], [`store::WriteTx`], [`store::Sql`],
//!   [`store::ReleaseHook`]) and the SQLite backend ([`store::SqliteBackend`]).
//! - [`query`]: queries (text syntax, builder) compiled to SQL and run through the seam,
//!   results streamed or collected; typed facts; live watches, polled, iterated, on a
//!   thread of their own ([`query::WatchHandle`]) or as an async stream (feature
//!   `server`).
//! - [`queue`]: work queues on the store: declarations, the pending index (a release
//!   hook), leases, failures, stats.
//! - [`graph`]: a fact's neighbourhood in the DAG (ancestors above, descendants below)
//!   as Graphviz dot, SVG or JSON (`precedent graph`, `GET /v1/graph/HASH`).
//! - [`sync`]: replication between nodes over HTTP: wire format, server, client, and
//!   bookmarks and peers kept in the store.

#![deny(missing_docs)]
#![cfg_attr(docsrs, feature(doc_cfg))]

pub mod clock;
pub mod dag;
pub mod encoding;
pub mod error;
pub mod fact;
pub mod graph;
pub mod hash;
pub mod ingest;
pub mod json;
pub mod predicate;
pub mod query;
pub mod queue;
pub mod store;
pub mod sync;

pub use error::{Error, Result};
pub use fact::{Fact, FactBuilder, Fields, Predecessors, Value};
pub use hash::{FactHash, HashPrefix};
pub use store::{BatchReport, InsertOutcome, Store, StoreOptions, Writer};
