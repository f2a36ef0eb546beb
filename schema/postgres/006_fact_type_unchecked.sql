-- precedent PostgreSQL schema version 6: no foreign key from fact.type_id to fact_type.
-- PostgreSQL checked it for every fact row written, with a look-up and a row lock on the
-- type's row by a trigger: about a third of PostgreSQL's cost of a pushed request of
-- 1,000 facts (docs/performance.md, "Against Jinaga's server on PostgreSQL"). A type's
-- row is written in the same transaction as the first fact of that type, and never
-- deleted, as on SQLite (whose foreign keys are off); `verify` reports a fact whose type
-- id names no type, or another type than its bytes. See docs/design.md ("Schema").
ALTER TABLE fact DROP CONSTRAINT fact_type_id_fkey;
