-- precedent schema version 1. See docs/design.md for the meaning of every column.

-- Fact type names, numbered so that rows and indexes carry a small integer.
CREATE TABLE fact_type (
    id   INTEGER PRIMARY KEY,
    name TEXT NOT NULL UNIQUE
);

-- Predecessor role names, numbered likewise.
CREATE TABLE role (
    id   INTEGER PRIMARY KEY,
    name TEXT NOT NULL UNIQUE
);

-- Released facts. seq is the local release sequence: every fact's seq is greater than
-- the seq of each of its predecessors. Rows are never updated or deleted.
CREATE TABLE fact (
    seq     INTEGER PRIMARY KEY,
    hash    BLOB NOT NULL UNIQUE,
    type_id INTEGER NOT NULL REFERENCES fact_type (id),
    bytes   BLOB NOT NULL
);
CREATE INDEX fact_by_type ON fact (type_id, seq);

-- Predecessor edges between released facts, by seq.
CREATE TABLE edge (
    predecessor INTEGER NOT NULL,
    role_id     INTEGER NOT NULL,
    successor   INTEGER NOT NULL,
    PRIMARY KEY (predecessor, role_id, successor)
) WITHOUT ROWID;
CREATE INDEX edge_by_successor ON edge (successor, role_id, predecessor);

-- Facts waiting for ancestors. Rows are appended in id order; only the 32-byte hash index
-- is keyed randomly, which keeps the randomly-written part small. missing counts the rows
-- of held_wait naming this fact.
CREATE TABLE held (
    id      INTEGER PRIMARY KEY,
    hash    BLOB NOT NULL UNIQUE,
    bytes   BLOB NOT NULL,
    missing INTEGER NOT NULL CHECK (missing > 0),
    held_at INTEGER NOT NULL
);

-- One row per (absent predecessor, held fact waiting for it).
CREATE TABLE held_wait (
    missing BLOB NOT NULL,
    waiter  INTEGER NOT NULL,
    PRIMARY KEY (missing, waiter)
) WITHOUT ROWID;

-- Counters kept in step with the tables, so that bounds are checked without a scan.
CREATE TABLE counter (
    name  TEXT PRIMARY KEY,
    value INTEGER NOT NULL
) WITHOUT ROWID;
INSERT INTO counter (name, value) VALUES ('held', 0);
