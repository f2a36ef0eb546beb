-- precedent PostgreSQL schema version 2: the functions compiled queries call, over the
-- canonical CBOR bytes of a fact (docs/format.md). They keep the rules of
-- src/predicate.rs, which the SQLite backend registers as Rust functions
-- (src/store/sqlite/functions.rs); docs/design.md ("Client SQL on PostgreSQL") says how.
--
-- pq_test(bytes, field, op, vals): whether the field passes the test. op is 0 '=',
-- 1 '!=', 2 '<', 3 '<=', 4 '>', 5 '>=', 6 'in'; vals are the canonical bytes of a carrier
-- fact whose field 'v' is the array of the predicate's values. A boolean, for WHERE.
--
-- pq_field(bytes, field): the field's sort key as bytea, NULL for a missing field and for
-- null, booleans, arrays and maps. Keys compare bytewise in the order of
-- predicate::sort_key: numbers (tag 01), then text (tag 02), then bytes (tag 03). A
-- number is the binary64 nearest to it (8 bytes, order-preserving) and what is left
-- (2 bytes, offset by 32768): exact across integers and floats. src/query/sql.rs builds
-- the same keys in Rust for the keyset bounds it binds.
--
-- Every function is IMMUTABLE and PARALLEL SAFE; none reads a table.

-- The head of the CBOR item at pos (0-based): its major type, additional information,
-- argument (a 64-bit argument as its bits, two's complement) and where its content starts.
CREATE OR REPLACE FUNCTION pq_cbor_head(b bytea, pos integer,
    OUT major integer, OUT info integer, OUT arg bigint, OUT body integer)
LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE AS $fn$
DECLARE
    ib integer := get_byte(b, pos);
BEGIN
    major := ib >> 5;
    info := ib & 31;
    IF info < 24 THEN
        arg := info;
        body := pos + 1;
    ELSIF info = 24 THEN
        arg := get_byte(b, pos + 1);
        body := pos + 2;
    ELSIF info = 25 THEN
        arg := (get_byte(b, pos + 1) << 8) | get_byte(b, pos + 2);
        body := pos + 3;
    ELSIF info = 26 THEN
        arg := (get_byte(b, pos + 1)::bigint << 24) | (get_byte(b, pos + 2) << 16)
             | (get_byte(b, pos + 3) << 8) | get_byte(b, pos + 4);
        body := pos + 5;
    ELSIF info = 27 THEN
        arg := ('x' || encode(substr(b, pos + 2, 8), 'hex'))::bit(64)::bigint;
        body := pos + 9;
    ELSE
        RAISE EXCEPTION 'pq: CBOR head with additional information % at byte %', info, pos;
    END IF;
END
$fn$;

-- Where the CBOR item at pos ends (the position just after it).
CREATE OR REPLACE FUNCTION pq_cbor_skip(b bytea, pos integer) RETURNS integer
LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE AS $fn$
DECLARE
    ib integer := get_byte(b, pos);
    h record;
    p integer;
BEGIN
    -- Without a call for what needs none: numbers, simple values, short text and bytes.
    IF ib < 64 OR ib >= 224 THEN
        RETURN pos + 1 + CASE ib & 31 WHEN 24 THEN 1 WHEN 25 THEN 2 WHEN 26 THEN 4
            WHEN 27 THEN 8 ELSE 0 END;
    ELSIF ib < 128 AND (ib & 31) < 24 THEN
        RETURN pos + 1 + (ib & 31);
    END IF;
    h := pq_cbor_head(b, pos);
    p := h.body;
    IF h.major IN (2, 3) THEN
        RETURN h.body + h.arg::integer;
    ELSIF h.major = 4 THEN
        FOR i IN 1 .. h.arg LOOP
            p := pq_cbor_skip(b, p);
        END LOOP;
        RETURN p;
    ELSIF h.major = 5 THEN
        FOR i IN 1 .. 2 * h.arg LOOP
            p := pq_cbor_skip(b, p);
        END LOOP;
        RETURN p;
    ELSE
        RETURN h.body;
    END IF;
END
$fn$;

-- Where the value of field `name` starts in the canonical bytes of a fact, NULL when the
-- fact has no such field. A fact is [1, type, fields, predecessors].
CREATE OR REPLACE FUNCTION pq_cbor_field(b bytea, name text) RETURNS integer
LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE AS $fn$
DECLARE
    key bytea := convert_to(name, 'UTF8');
    klen integer := length(key);
    h record;
    n bigint;
    p integer;
    kl bigint;
    body integer;
BEGIN
    IF length(b) < 4 OR get_byte(b, 0) <> 132 OR get_byte(b, 1) <> 1 THEN
        RETURN NULL;
    END IF;
    h := pq_cbor_head(b, pq_cbor_skip(b, 2));
    IF h.major <> 5 THEN
        RETURN NULL;
    END IF;
    n := h.arg;
    p := h.body;
    FOR i IN 1 .. n LOOP
        -- A key is text; one shorter than 24 bytes has its length in its first byte.
        kl := get_byte(b, p) - 96;
        IF kl < 24 THEN
            body := p + 1;
        ELSE
            h := pq_cbor_head(b, p);
            kl := h.arg;
            body := h.body;
        END IF;
        p := body + kl;
        IF kl = klen AND substr(b, body + 1, klen) = key THEN
            RETURN p;
        END IF;
        -- Keys are in canonical order (shorter first): past the length, no key matches.
        IF kl > klen THEN
            RETURN NULL;
        END IF;
        p := pq_cbor_skip(b, p);
    END LOOP;
    RETURN NULL;
END
$fn$;

-- The kind of the value at pos: 'null', 'bool', 'int', 'float', 'text', 'bytes',
-- 'array' or 'map'.
CREATE OR REPLACE FUNCTION pq_cbor_kind(b bytea, pos integer) RETURNS text
LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE AS $fn$
DECLARE
    ib integer := get_byte(b, pos);
BEGIN
    RETURN CASE ib >> 5
        WHEN 0 THEN 'int' WHEN 1 THEN 'int' WHEN 2 THEN 'bytes' WHEN 3 THEN 'text'
        WHEN 4 THEN 'array' WHEN 5 THEN 'map'
        ELSE CASE ib WHEN 244 THEN 'bool' WHEN 245 THEN 'bool' WHEN 246 THEN 'null'
            ELSE 'float' END
        END;
END
$fn$;

-- The integer at pos, exactly (-2^64 .. 2^64-1).
CREATE OR REPLACE FUNCTION pq_cbor_int(b bytea, pos integer) RETURNS numeric
LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE AS $fn$
DECLARE
    h record := pq_cbor_head(b, pos);
    n numeric := h.arg;
BEGIN
    IF h.arg < 0 THEN
        n := n + 18446744073709551616;
    END IF;
    IF h.major = 1 THEN
        RETURN -1 - n;
    END IF;
    RETURN n;
END
$fn$;

-- The float at pos (half, single or double precision), exactly: from its bits, with
-- `ebits` exponent and `mbits` mantissa bits.
CREATE OR REPLACE FUNCTION pq_cbor_float(b bytea, pos integer) RETURNS double precision
LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE AS $fn$
DECLARE
    h record := pq_cbor_head(b, pos);
    ebits integer := CASE h.info WHEN 25 THEN 5 WHEN 26 THEN 8 ELSE 11 END;
    mbits integer := CASE h.info WHEN 25 THEN 10 WHEN 26 THEN 23 ELSE 52 END;
    bias integer := (1 << (ebits - 1)) - 1;
    e integer := (h.arg >> mbits) & ((1 << ebits) - 1);
    m bigint := h.arg & ((1::bigint << mbits) - 1);
    one double precision := 2::double precision ^ mbits;
    v double precision;
BEGIN
    -- Powers of two are built only in the normal range (PostgreSQL's ^ refuses a
    -- subnormal result); a subnormal is a normal times 2^-mbits, which multiplies exactly.
    IF e = 0 THEN
        v := (m * 2::double precision ^ (1 - bias)) / one;
    ELSIF e = (1 << ebits) - 1 THEN
        v := 'Infinity';
    ELSE
        v := (1 + m / one) * 2::double precision ^ (e - bias);
    END IF;
    IF ((h.arg >> (ebits + mbits)) & 1) = 1 THEN
        RETURN -v;
    END IF;
    RETURN v;
END
$fn$;

-- An integral binary64 below 2^127 in magnitude as an exact numeric (a cast goes through
-- 15 decimal digits). Each step splits off bits that a binary64 holds exactly.
CREATE OR REPLACE FUNCTION pq_float_whole(x double precision) RETURNS numeric
LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE AS $fn$
DECLARE
    q1 double precision := trunc(x / 18446744073709551616::double precision);
    r1 double precision := x - q1 * 18446744073709551616::double precision;
    q2 double precision := trunc(r1 / 4294967296::double precision);
    r2 double precision := r1 - q2 * 4294967296::double precision;
BEGIN
    RETURN q1::bigint::numeric * 18446744073709551616 + q2::bigint::numeric * 4294967296
        + r2::bigint::numeric;
END
$fn$;

-- Where the integer i sorts against the float f, exactly (predicate.rs, integer_float):
-- -1, 0 or 1.
CREATE OR REPLACE FUNCTION pq_int_float(i numeric, f double precision) RETURNS integer
LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE AS $fn$
DECLARE
    whole double precision;
    w numeric;
BEGIN
    -- 2^127: every float at or beyond it exceeds every field integer.
    IF f >= 170141183460469231731687303715884105728::double precision THEN
        RETURN -1;
    ELSIF f < -170141183460469231731687303715884105728::double precision THEN
        RETURN 1;
    END IF;
    whole := trunc(f);
    w := pq_float_whole(whole);
    IF i < w THEN
        RETURN -1;
    ELSIF i > w THEN
        RETURN 1;
    ELSIF f > whole THEN
        RETURN -1;
    ELSIF f < whole THEN
        RETURN 1;
    END IF;
    RETURN 0;
END
$fn$;

-- predicate::compare: -1, 0 or 1 for values of comparable kinds (numbers, text with
-- text, bytes with bytes), NULL otherwise.
CREATE OR REPLACE FUNCTION pq_compare(a bytea, ap integer, b bytea, bp integer) RETURNS integer
LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE AS $fn$
DECLARE
    ka text := pq_cbor_kind(a, ap);
    kb text := pq_cbor_kind(b, bp);
    x numeric;
    y numeric;
    fx double precision;
    fy double precision;
    sa bytea;
    sb bytea;
    h record;
BEGIN
    IF ka = 'int' AND kb = 'int' THEN
        x := pq_cbor_int(a, ap);
        y := pq_cbor_int(b, bp);
        RETURN CASE WHEN x < y THEN -1 WHEN x > y THEN 1 ELSE 0 END;
    ELSIF ka = 'float' AND kb = 'float' THEN
        fx := pq_cbor_float(a, ap);
        fy := pq_cbor_float(b, bp);
        RETURN CASE WHEN fx < fy THEN -1 WHEN fx > fy THEN 1 ELSE 0 END;
    ELSIF ka = 'int' AND kb = 'float' THEN
        RETURN pq_int_float(pq_cbor_int(a, ap), pq_cbor_float(b, bp));
    ELSIF ka = 'float' AND kb = 'int' THEN
        RETURN -pq_int_float(pq_cbor_int(b, bp), pq_cbor_float(a, ap));
    ELSIF ka = kb AND ka IN ('text', 'bytes') THEN
        h := pq_cbor_head(a, ap);
        sa := substr(a, h.body + 1, h.arg::integer);
        h := pq_cbor_head(b, bp);
        sb := substr(b, h.body + 1, h.arg::integer);
        RETURN CASE WHEN sa < sb THEN -1 WHEN sa > sb THEN 1 ELSE 0 END;
    END IF;
    RETURN NULL;
END
$fn$;

-- Structural equality (Value's PartialEq): kinds must match, floats compare as numbers
-- (-0.0 equals 0.0), arrays and maps item by item; for the rest the canonical encoding
-- is unique, so equal values have equal bytes.
CREATE OR REPLACE FUNCTION pq_same(a bytea, ap integer, b bytea, bp integer) RETURNS boolean
LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE AS $fn$
DECLARE
    ka text := pq_cbor_kind(a, ap);
    ha record;
    hb record;
    pa integer;
    pb integer;
    ea integer := pq_cbor_skip(a, ap);
    eb integer := pq_cbor_skip(b, bp);
BEGIN
    IF ka <> pq_cbor_kind(b, bp) THEN
        RETURN false;
    END IF;
    IF substr(a, ap + 1, ea - ap) = substr(b, bp + 1, eb - bp) THEN
        RETURN true;
    END IF;
    IF ka = 'float' THEN
        RETURN pq_cbor_float(a, ap) = pq_cbor_float(b, bp);
    ELSIF ka IN ('array', 'map') THEN
        ha := pq_cbor_head(a, ap);
        hb := pq_cbor_head(b, bp);
        IF ha.arg <> hb.arg THEN
            RETURN false;
        END IF;
        pa := ha.body;
        pb := hb.body;
        FOR i IN 1 .. ha.arg LOOP
            IF ka = 'map' THEN
                -- Keys are text: equal keys have equal bytes.
                ea := pq_cbor_skip(a, pa);
                eb := pq_cbor_skip(b, pb);
                IF substr(a, pa + 1, ea - pa) <> substr(b, pb + 1, eb - pb) THEN
                    RETURN false;
                END IF;
                pa := ea;
                pb := eb;
            END IF;
            IF NOT pq_same(a, pa, b, pb) THEN
                RETURN false;
            END IF;
            pa := pq_cbor_skip(a, pa);
            pb := pq_cbor_skip(b, pb);
        END LOOP;
        RETURN true;
    END IF;
    RETURN false;
END
$fn$;

-- predicate::equal: numeric across integers and floats, otherwise structural.
CREATE OR REPLACE FUNCTION pq_equal(a bytea, ap integer, b bytea, bp integer) RETURNS boolean
LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE AS $fn$
DECLARE
    c integer := pq_compare(a, ap, b, bp);
BEGIN
    IF c IS NOT NULL THEN
        RETURN c = 0;
    END IF;
    RETURN pq_same(a, ap, b, bp);
END
$fn$;

-- predicate::test and predicate::test_in.
CREATE OR REPLACE FUNCTION pq_test(bytes bytea, field text, op bigint, vals bytea)
RETURNS boolean
LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE AS $fn$
DECLARE
    fp integer := pq_cbor_field(bytes, field);
    vp integer := pq_cbor_field(vals, 'v');
    h record;
    p integer;
    c integer;
    kf text;
    kv text;
BEGIN
    IF fp IS NULL OR vp IS NULL THEN
        RETURN false;
    END IF;
    h := pq_cbor_head(vals, vp);
    IF h.major <> 4 THEN
        RAISE EXCEPTION 'pq: bad predicate values';
    END IF;
    p := h.body;
    IF op = 6 THEN
        FOR i IN 1 .. h.arg LOOP
            IF pq_equal(bytes, fp, vals, p) THEN
                RETURN true;
            END IF;
            p := pq_cbor_skip(vals, p);
        END LOOP;
        RETURN false;
    END IF;
    IF h.arg = 0 OR op < 0 OR op > 5 THEN
        RETURN false;
    END IF;
    IF op = 0 THEN
        RETURN pq_equal(bytes, fp, vals, p);
    ELSIF op = 1 THEN
        kf := pq_cbor_kind(bytes, fp);
        kv := pq_cbor_kind(vals, p);
        RETURN (kf = kv OR (kf IN ('int', 'float') AND kv IN ('int', 'float')))
            AND NOT pq_equal(bytes, fp, vals, p);
    END IF;
    c := pq_compare(bytes, fp, vals, p);
    IF c IS NULL THEN
        RETURN false;
    END IF;
    RETURN CASE op WHEN 2 THEN c < 0 WHEN 3 THEN c <= 0 WHEN 4 THEN c > 0 ELSE c >= 0 END;
END
$fn$;

-- The sort key of a binary64: its bits, flipped so that bytewise order is numeric order
-- (-0.0 as 0.0).
CREATE OR REPLACE FUNCTION pq_float_key(x double precision) RETURNS bytea
LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE AS $fn$
DECLARE
    bits bigint;
BEGIN
    IF x = 0 THEN
        x := 0;
    END IF;
    bits := ('x' || encode(float8send(x), 'hex'))::bit(64)::bigint;
    IF bits < 0 THEN
        RETURN int8send(~bits);
    END IF;
    RETURN int8send(bits | x'8000000000000000'::bit(64)::bigint);
END
$fn$;

-- The sort key of a number: tag 01, the key of the nearest binary64 d, and n - d
-- (within 2^10 for a 64-bit integer) offset by 32768 in two bytes. Integers beyond
-- 64 bits sort as their nearest binary64, as in predicate::sort_key.
CREATE OR REPLACE FUNCTION pq_number_key(d double precision, rest integer) RETURNS bytea
LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE AS $fn$
BEGIN
    RETURN '\x01'::bytea || pq_float_key(d) || substr(int4send(rest + 32768), 3, 2);
END
$fn$;

-- predicate::sort_key as bytea (see the head of this file).
CREATE OR REPLACE FUNCTION pq_field(bytes bytea, field text) RETURNS bytea
LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE AS $fn$
DECLARE
    fp integer := pq_cbor_field(bytes, field);
    k text;
    h record;
    i numeric;
    d double precision;
BEGIN
    IF fp IS NULL THEN
        RETURN NULL;
    END IF;
    k := pq_cbor_kind(bytes, fp);
    IF k = 'int' THEN
        i := pq_cbor_int(bytes, fp);
        d := i::double precision;
        IF i >= -9223372036854775808 AND i <= 9223372036854775807 THEN
            RETURN pq_number_key(d, (i - pq_float_whole(d))::integer);
        END IF;
        RETURN pq_number_key(d, 0);
    ELSIF k = 'float' THEN
        RETURN pq_number_key(pq_cbor_float(bytes, fp), 0);
    ELSIF k IN ('text', 'bytes') THEN
        h := pq_cbor_head(bytes, fp);
        RETURN CASE k WHEN 'text' THEN '\x02'::bytea ELSE '\x03'::bytea END
            || substr(bytes, h.body + 1, h.arg::integer);
    END IF;
    RETURN NULL;
END
$fn$;
