-- precedent schema version 4. See docs/design.md for the meaning of every column.

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
