-- precedent schema version 4: a smaller held set. See docs/design.md for the meaning of
-- every column.

-- held loses its UNIQUE 32-byte hash index for an index on the hash's first 8 bytes: a
-- third of the size, which matters because it is written at random once per held fact and
-- once per release. Lookups name both (`substr(hash, 1, 8) = substr(?1, 1, 8) AND hash =
-- ?1`); the store checks before it inserts that a hash is not held already.
CREATE TABLE held_v4 (
    id      INTEGER PRIMARY KEY,
    hash    BLOB NOT NULL,
    bytes   BLOB NOT NULL,
    missing INTEGER NOT NULL CHECK (missing > 0),
    held_at INTEGER NOT NULL
);
INSERT INTO held_v4 (id, hash, bytes, missing, held_at)
    SELECT id, hash, bytes, missing, held_at FROM held ORDER BY id;
DROP TABLE held;
ALTER TABLE held_v4 RENAME TO held;
CREATE INDEX held_by_prefix ON held (substr(hash, 1, 8));

-- One row per (held predecessor, held fact waiting for it), for waits recorded while the
-- predecessor was held already: keyed by the predecessor's held row id instead of its
-- 32-byte hash, so that a batch of facts held behind each other (children given before
-- parents) is recorded in a small, nearly append-only index. Waits for predecessors that
-- were absent when the fact was held stay in held_wait, keyed by hash.
CREATE TABLE held_child (
    parent INTEGER NOT NULL,
    waiter INTEGER NOT NULL,
    PRIMARY KEY (parent, waiter)
) WITHOUT ROWID;
