-- precedent schema for PostgreSQL, version 2: the functions compiled queries call
-- (src/store/sqlite/functions.rs has SQLite's): pq_test(bytes, field, op, values) -> 0 | 1
-- and pq_field(bytes, field) -> a sortable value. Stubs until the real ones land here.

CREATE FUNCTION pq_test(bytes bytea, field text, op bigint, vals bytea) RETURNS bigint
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    RAISE EXCEPTION 'not yet';
END
$$;

CREATE FUNCTION pq_field(bytes bytea, field text) RETURNS bytea
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    RAISE EXCEPTION 'not yet';
END
$$;
