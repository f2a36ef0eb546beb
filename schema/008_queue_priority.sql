-- precedent schema version 8: an index for the claims of a queue with a priority field.
-- See docs/queues.md ("Controls") and docs/performance.md ("Queue controls").

-- A prioritized queue's claim orders its claimable rows by priority (higher first), then
-- by claimable time and release order. Without this index it read every claimable row of
-- the queue and sorted them (a backlog of 200,000 took 0.8 s a claim); with it the claim
-- walks the index in that order and stops after the rows it takes. A queue without a
-- priority field keeps using queue_item_claimable.
CREATE INDEX queue_item_priority ON queue_item (queue_id, priority DESC, claimable_at, input)
    WHERE claimable_at IS NOT NULL;
