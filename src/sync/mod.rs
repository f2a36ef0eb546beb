//! Sync between nodes over HTTP: the wire format, a server and a client.
//!
//! A node serves its store with [`server::Server`]; another node runs a
//! [`client::Client`] against it, which pulls the facts it has not seen (in the server's
//! release order, after a per-peer bookmark), pushes its own, and fetches the ancestors
//! of anything left held. Every record received is strictly decoded and re-hashed; a
//! record that fails goes to the quarantine ([`crate::Store::quarantine`]), never to the
//! fact tables. The protocol is specified in `docs/protocol.md`.
//!
//! ```no_run
//! # #[cfg(feature = "client")] {
//! use precedent::Store;
//! use precedent::sync::client::{Client, ClientOptions, SyncOptions};
//!
//! let store = Store::open("laptop.db")?;
//! let client = Client::new("http://127.0.0.1:7341", ClientOptions::default())?;
//! let report = client.sync(&store, &SyncOptions::default(), &mut |_| {})?;
//! println!("pulled {} facts, pushed {}", report.pulled, report.pushed);
//! # }
//! # Ok::<(), precedent::Error>(())
//! ```
//!
//! # Layout
//! - [`wire`]: paths, headers, JSON bodies and the CBOR-sequence record reader shared by
//!   both sides.
//! - [`queue_wire`]: the JSON bodies of the queue endpoints, for remote workers.
//! - [`auth`]: the token file and what each token may do.
//! - [`server`]: the axum/hyper server, its limits, metrics and graceful shutdown.
//! - [`client`]: the blocking client and the sync loop with its bookmarks.

pub mod auth;
#[cfg(feature = "client")]
pub mod client;
#[cfg(feature = "server")]
mod metrics;
pub mod queue_wire;
#[cfg(feature = "server")]
pub mod server;
mod state;
pub mod wire;

pub use state::{PeerState, Quarantined, SetDigest};
