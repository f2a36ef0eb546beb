-- precedent schema version 7: queue controls and counters. See docs/design.md and
-- docs/queues.md ("Controls").

-- Counters since the queue was declared: inputs an at-most-once queue dropped after a
-- failure, failed attempts (every kind), transient failures given a retry, claims of an
-- input whose earlier lease expired, and attempts that timed out.
ALTER TABLE queue ADD COLUMN dropped     INTEGER NOT NULL DEFAULT 0;
ALTER TABLE queue ADD COLUMN failed      INTEGER NOT NULL DEFAULT 0;
ALTER TABLE queue ADD COLUMN retried     INTEGER NOT NULL DEFAULT 0;
ALTER TABLE queue ADD COLUMN redelivered INTEGER NOT NULL DEFAULT 0;
ALTER TABLE queue ADD COLUMN timed_out   INTEGER NOT NULL DEFAULT 0;
-- The rate limit's current window (its start, ms since the epoch) and the claims handed
-- out in it.
ALTER TABLE queue ADD COLUMN rate_window INTEGER NOT NULL DEFAULT 0;
ALTER TABLE queue ADD COLUMN rate_count  INTEGER NOT NULL DEFAULT 0;

-- An input's priority (its declared priority field; 0 without one) and the time before
-- which it is not handed out (its declared not-before field; NULL without one).
ALTER TABLE queue_item ADD COLUMN priority   INTEGER NOT NULL DEFAULT 0;
ALTER TABLE queue_item ADD COLUMN not_before INTEGER;
