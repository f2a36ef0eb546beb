-- precedent schema version 3: sync between nodes. See docs/design.md ("Sync tables").

-- One row per remote node this store syncs with, keyed by its base URL.
-- pull_after: the remote's release sequence up to which every remote fact has been
-- committed here; push_after: the local release sequence up to which every local fact has
-- been accepted by the remote. Both move only in the transaction that commits what they cover.
CREATE TABLE sync_peer (
    url          TEXT PRIMARY KEY,
    pull_after   INTEGER NOT NULL DEFAULT 0,
    push_after   INTEGER NOT NULL DEFAULT 0,
    remote_seq   INTEGER NOT NULL DEFAULT 0,
    last_sync_ms INTEGER,
    last_error   TEXT
) WITHOUT ROWID;

-- Records received from a peer (by push or pull) that failed strict decoding or hashing.
-- They are never facts; they are kept here for a person to look at.
CREATE TABLE sync_quarantine (
    id          INTEGER PRIMARY KEY,
    peer        TEXT NOT NULL,
    received_ms INTEGER NOT NULL,
    reason      TEXT NOT NULL,
    bytes       BLOB NOT NULL
);

-- Which peer pushed each fact that is held on a server, for the per-peer held bound.
-- Rows whose fact has since been released are removed lazily.
CREATE TABLE sync_held_origin (
    hash BLOB PRIMARY KEY,
    peer TEXT NOT NULL
) WITHOUT ROWID;
CREATE INDEX sync_held_origin_by_peer ON sync_held_origin (peer);
