-- precedent schema version 6: an identity for each database. See docs/design.md
-- ("store_meta") and docs/protocol.md ("Store identity").

-- Facts about this database itself. 'id': 16 random bytes drawn when the database is
-- created (or migrated to this version), never changed: a sync server reports it, so that
-- a client notices when the database behind a URL is replaced by another.
CREATE TABLE store_meta (
    name  TEXT PRIMARY KEY,
    value BLOB NOT NULL
) WITHOUT ROWID;
INSERT INTO store_meta (name, value) VALUES ('id', randomblob(16));

-- The identity of the peer's database when its bookmarks were last valid (lowercase hex),
-- NULL until the peer first reports one.
ALTER TABLE sync_peer ADD COLUMN remote_store TEXT;
