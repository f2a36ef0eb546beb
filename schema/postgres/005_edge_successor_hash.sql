-- precedent PostgreSQL schema version 5: each edge carries its successor's hash, so that a
-- query that reaches a fact through an edge toward its successors and reads only its hash
-- (`select hash(o)`) answers from the edge rows it walks, with no lookup of the fact's
-- row per result. Written with the edge in the fact's own insert; `verify` checks it
-- against the fact. See docs/design.md ("The PostgreSQL backend", "Schema").
ALTER TABLE edge ADD COLUMN successor_hash BYTEA;
UPDATE edge SET successor_hash = f.hash FROM fact f WHERE f.seq = edge.successor;
ALTER TABLE edge ALTER COLUMN successor_hash SET NOT NULL;
