-- precedent schema version 2: work queues. See docs/design.md.

-- Queue declarations. config is the QueueSpec as JSON.
CREATE TABLE queue (
    id         INTEGER PRIMARY KEY,
    name       TEXT NOT NULL UNIQUE,
    config     TEXT NOT NULL,
    created_at INTEGER NOT NULL,
    completed  INTEGER NOT NULL DEFAULT 0,
    discarded  INTEGER NOT NULL DEFAULT 0
);

-- Unfinished inputs only: a row is deleted when its input ends (completed, discarded, or
-- delivered by an at-most-once queue), so nothing here grows with completed history.
-- state: 0 ready, 1 leased, 2 blocked, 3 dead, 4 poison.
-- claimable_at: when a ready input may be claimed (after backoff), or when a lease
-- expires; NULL for blocked, dead and poison inputs.
CREATE TABLE queue_item (
    queue_id         INTEGER NOT NULL,
    input            INTEGER NOT NULL,
    state            INTEGER NOT NULL,
    claimable_at     INTEGER,
    attempts         INTEGER NOT NULL DEFAULT 0,
    first_attempt_at INTEGER,
    lease_token      INTEGER,
    blockers         INTEGER NOT NULL DEFAULT 0,
    last_error       TEXT,
    entry            INTEGER,
    PRIMARY KEY (queue_id, input)
) WITHOUT ROWID;
CREATE INDEX queue_item_claimable ON queue_item (queue_id, claimable_at, input)
    WHERE claimable_at IS NOT NULL;
CREATE INDEX queue_item_state ON queue_item (queue_id, state);

-- Causal ordering: blocked waits for the unfinished ancestor input blocker.
CREATE TABLE queue_block (
    queue_id INTEGER NOT NULL,
    blocker  INTEGER NOT NULL,
    blocked  INTEGER NOT NULL,
    PRIMARY KEY (queue_id, blocker, blocked)
) WITHOUT ROWID;
CREATE INDEX queue_block_by_blocked ON queue_block (queue_id, blocked);

-- Per-minute completion and failure counts, kept for one hour, for rates.
CREATE TABLE queue_rate (
    queue_id  INTEGER NOT NULL,
    minute    INTEGER NOT NULL,
    completed INTEGER NOT NULL DEFAULT 0,
    failed    INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (queue_id, minute)
) WITHOUT ROWID;

-- Bumped whenever a queue is declared, changed or dropped, so that every process reloads
-- its cached declarations.
INSERT INTO counter (name, value) VALUES ('queues', 0);
