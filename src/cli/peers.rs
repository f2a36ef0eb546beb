//! `peers rm`: forgetting a peer. Listing peers is `sync.rs`'s, beside the sync that
//! records them.

use serde_json::json;

use super::{Failure, Global, Status, exit};

/// `precedent peers rm URL`.
pub fn rm(g: &Global, url: &str) -> anyhow::Result<Status> {
    let store = g.open(false)?;
    if !store.remove_peer(url)? {
        return Err(Failure::error(
            exit::NOT_FOUND,
            format!("no peer {url:?}: `precedent peers` lists the known ones"),
        ));
    }
    if g.json {
        say!("{}", json!({"removed": url}));
    } else {
        say!("forgot peer {url}: its bookmarks, last sync and last error (no fact changed)");
    }
    Ok(Status::Ok)
}
