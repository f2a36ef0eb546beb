-- precedent schema version 5: the types of both facts in every edge. See docs/design.md
-- ("edge").
--
-- A step through a role that wants facts of one type (the orders of a shop, a shipment of
-- an order) then finds them in one range of one index, instead of looking each candidate
-- up in fact_by_type. The types are copies of fact.type_id, which never changes.

CREATE TABLE edge_typed (
    predecessor      INTEGER NOT NULL,
    role_id          INTEGER NOT NULL,
    successor_type   INTEGER NOT NULL,
    successor        INTEGER NOT NULL,
    predecessor_type INTEGER NOT NULL,
    PRIMARY KEY (predecessor, role_id, successor_type, successor)
) WITHOUT ROWID;

-- Every existing edge, with its facts' types. An edge naming a fact that is not in fact
-- (possible only in a damaged file) is kept, with type 0, which names no type.
INSERT INTO edge_typed (predecessor, role_id, successor_type, successor, predecessor_type)
SELECT e.predecessor, e.role_id, coalesce(s.type_id, 0), e.successor, coalesce(p.type_id, 0)
FROM edge e
LEFT JOIN fact s ON s.seq = e.successor
LEFT JOIN fact p ON p.seq = e.predecessor;

DROP TABLE edge;
ALTER TABLE edge_typed RENAME TO edge;
CREATE INDEX edge_by_successor ON edge (successor, role_id, predecessor_type, predecessor);
