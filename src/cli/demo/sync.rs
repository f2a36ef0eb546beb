//! The demo's third part: a sync between two databases. A second node's database, in a
//! temporary directory, is served by this process on 127.0.0.1 (a port the system picks),
//! and the demo database syncs with it over HTTP, as `precedent sync` does.

use std::net::SocketAddr;
use std::path::PathBuf;

use precedent::sync::client::{Client, ClientOptions, SyncOptions, SyncReport};
use precedent::sync::server::{Running, ServerConfig};
use precedent::{Fact, Store};

/// A directory of its own under the system's temporary directory, removed when dropped.
struct TempDir(PathBuf);

impl TempDir {
    fn new() -> std::io::Result<TempDir> {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0);
        let dir =
            std::env::temp_dir().join(format!("precedent-demo-{}-{nanos}", std::process::id()));
        std::fs::create_dir(&dir)?;
        Ok(TempDir(dir))
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Runs the third part: `store` syncs with a new, empty branch node; the branch records
/// `delivered` (a successor of a fact it received); the next sync brings it back.
pub fn run(store: &Store, delivered: &Fact) -> anyhow::Result<()> {
    say!("A second node, the branch office, has a database of its own (a temporary file),");
    say!("served here over HTTP on 127.0.0.1; this database syncs with it both ways.");
    let dir = TempDir::new()?;
    let branch_db = dir.0.join("branch.db");
    let branch = Store::open(&branch_db)?;
    let mut config = ServerConfig::new(&branch_db);
    config.listen = SocketAddr::from(([127, 0, 0, 1], 0));
    let server = Running::start(config)?;
    let result = exchange(store, &branch, &server, delivered);
    // The branch's address is gone with the demo: it is not left listed among the peers.
    let forgotten = store.remove_peer(&server.url());
    // Stopped whatever the exchange did, before its files are removed.
    let stopped = server.stop();
    result?;
    forgotten?;
    stopped?;
    Ok(())
}

fn exchange(
    store: &Store,
    branch: &Store,
    server: &Running,
    delivered: &Fact,
) -> anyhow::Result<()> {
    let client = Client::new(&server.url(), ClientOptions::default())?;
    let first = client.sync(store, &SyncOptions::default(), &mut |_| {})?;
    say!("  sync with {}: {}", server.url(), counts(&first));
    branch.insert(delivered)?;
    say!("  the branch records that Grace signed for PP-1004");
    let second = client.sync(store, &SyncOptions::default(), &mut |_| {})?;
    say!("  sync again: {}", counts(&second));
    say!(
        "  the branch holds {} facts, this database {}; the server stops now",
        branch.stats()?.released,
        store.stats()?.released
    );
    Ok(())
}

fn counts(r: &SyncReport) -> String {
    format!(
        "pushed {}, pulled {}, of which {} new here",
        r.pushed, r.pulled, r.inserted
    )
}
