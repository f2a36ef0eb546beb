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

-- A first edge is whole or absent: `verify` reads its three columns together.
ALTER TABLE fact ADD CONSTRAINT fact_first_edge_whole
    CHECK ((p1 IS NULL) = (p1_role IS NULL) AND (p1 IS NULL) = (p1_type IS NULL));

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

-- Makes the partition of edge_more of each role of `roles` that has none yet, in the
-- caller's transaction, and returns the roles it made (a writer calls it before its first
-- edge_more row of a role). A partition is made as a table of its own in edge_more's
-- schema, then attached: ATTACH PARTITION locks edge_more in SHARE UPDATE EXCLUSIVE mode,
-- which its readers and writers do not wait for nor make wait, where CREATE TABLE ...
-- PARTITION OF would lock it ACCESS EXCLUSIVE until the caller commits, behind every
-- open transaction that read the edge view. Attaching makes the partition's primary key
-- and index from edge_more's.
CREATE FUNCTION pq_edge_more_partitions(roles BIGINT[]) RETURNS BIGINT[]
LANGUAGE plpgsql AS $fn$
DECLARE
    parent regclass := 'edge_more'::regclass;
    ns TEXT;
    r BIGINT;
    made BIGINT[] := '{}';
BEGIN
    SELECT n.nspname INTO ns FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
    WHERE c.oid = parent;
    FOREACH r IN ARRAY roles LOOP
        IF NOT EXISTS (SELECT 1 FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
                       WHERE i.inhparent = parent AND c.relname = 'edge_more_' || r) THEN
            EXECUTE format('CREATE TABLE %I.%I (LIKE %s INCLUDING DEFAULTS)', ns,
                           'edge_more_' || r, parent);
            EXECUTE format('ALTER TABLE %s ATTACH PARTITION %I.%I FOR VALUES IN (%s)', parent,
                           ns, 'edge_more_' || r, r);
            made := made || r;
        END IF;
    END LOOP;
    RETURN made;
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

