-- precedent PostgreSQL schema version 7: a fact's first edge in its own row. A fact with
-- predecessors keeps one of its edges (its first as written; here the least role id,
-- then predecessor) in three columns of its row, p1 (the predecessor's seq), p1_role and
-- p1_type (the predecessor's type), found by the partial index fact_by_first; its other
-- edges are rows of edge_more, partitioned by role, with a partition only for a role
-- that has such an edge. A fact of one predecessor, the common case, is then one heap row
-- and four index entries where it was two rows and five entries: about a fifth of
-- PostgreSQL's work a push. `edge` becomes a view over both places with the columns of
-- the table it was; its rows from `fact` include one of NULLs for each fact with no
-- predecessor (a view flattened into its reader's plan may have no WHERE), which every
-- reader skips by its join or by `predecessor IS NOT NULL`. A compiled query writes role
-- and type ids into its text, so the planner prunes the partitions of roles that have
-- none: a step over a role with no second edges reads the fact rows alone. See
-- docs/design.md ("Schema") and docs/performance.md ("The gate, measured").
ALTER TABLE fact ADD COLUMN p1 BIGINT, ADD COLUMN p1_role BIGINT, ADD COLUMN p1_type BIGINT;

UPDATE fact f SET p1 = e.predecessor, p1_role = e.role_id, p1_type = e.predecessor_type
FROM (SELECT DISTINCT ON (successor) successor, role_id, predecessor, predecessor_type
      FROM edge ORDER BY successor, role_id, predecessor) e
WHERE f.seq = e.successor;

CREATE TABLE edge_more (
    predecessor      BIGINT NOT NULL,
    role_id          BIGINT NOT NULL,
    successor_type   BIGINT NOT NULL,
    successor        BIGINT NOT NULL,
    predecessor_type BIGINT NOT NULL,
    successor_hash   BYTEA NOT NULL,
    PRIMARY KEY (predecessor, role_id, successor_type, successor)
) PARTITION BY LIST (role_id);
CREATE INDEX edge_more_by_successor ON edge_more (successor, role_id, predecessor_type, predecessor);

-- Creates the partition of edge_more of each role of `roles` that has none yet, in the
-- caller's transaction (a writer calls it before its first edge_more row of a role).
CREATE FUNCTION pq_edge_more_partitions(roles BIGINT[]) RETURNS void
LANGUAGE plpgsql AS $fn$
DECLARE
    r BIGINT;
BEGIN
    FOREACH r IN ARRAY roles LOOP
        IF to_regclass(format('edge_more_%s', r)) IS NULL THEN
            EXECUTE format('CREATE TABLE edge_more_%s PARTITION OF edge_more FOR VALUES IN (%s)', r, r);
        END IF;
    END LOOP;
END
$fn$;

SELECT pq_edge_more_partitions(array_agg(DISTINCT e.role_id))
FROM edge e JOIN fact f ON f.seq = e.successor
WHERE NOT (f.p1 = e.predecessor AND f.p1_role = e.role_id)
HAVING count(*) > 0;

INSERT INTO edge_more (predecessor, role_id, successor_type, successor, predecessor_type, successor_hash)
SELECT e.predecessor, e.role_id, e.successor_type, e.successor, e.predecessor_type, e.successor_hash
FROM edge e JOIN fact f ON f.seq = e.successor
WHERE NOT (f.p1 = e.predecessor AND f.p1_role = e.role_id);

DROP TABLE edge;

CREATE INDEX fact_by_first ON fact (p1, p1_role, type_id, seq) WHERE p1 IS NOT NULL;

CREATE VIEW edge AS
    SELECT p1 AS predecessor, p1_role AS role_id, type_id AS successor_type, seq AS successor,
           p1_type AS predecessor_type, hash AS successor_hash
    FROM fact
    UNION ALL
    SELECT predecessor, role_id, successor_type, successor, predecessor_type, successor_hash
    FROM edge_more;

