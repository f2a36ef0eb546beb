//! The `Sql` seam on PostgreSQL (a real cluster, `tests/common/pg.rs`): client SQL in the
//! portable `?N` form, arguments bound to whatever type the server inferred, and columns
//! read back as the seam's values.

mod common;

use common::pg;
use precedent::store::{Arg, Dialect, SqlExt, SqlValue, ValueRef};
use precedent::{Store, StoreOptions, args};

#[test]
fn arguments_bind_to_the_inferred_types_and_columns_read_back() {
    let Some(db) = pg::db() else { return };
    let store = Store::open_with(&db.url, StoreOptions::default()).unwrap();
    let rows: Vec<Vec<SqlValue>> = store
        .write(|w| {
            let sql = w.sql();
            assert_eq!(sql.dialect(), Dialect::Postgres);
            sql.batch(
                "CREATE TABLE kinds (i2 smallint, i4 integer, i8 bigint, f4 real, f8 double precision,
                     n numeric, b boolean, t text, v varchar(10), bytes bytea, j jsonb)",
            )?;
            // No casts: every parameter takes the column's type.
            let n = sql.execute(
                "INSERT INTO kinds VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11)",
                &[
                    Arg::Int(7),
                    Arg::Int(70_000),
                    Arg::Int(1 << 40),
                    Arg::Real(1.5),
                    Arg::Real(2.25),
                    Arg::Int(12_345_678),
                    Arg::from(true),
                    Arg::Text("text ?1"),
                    Arg::Text("short"),
                    Arg::Blob(b"\x00\xff"),
                    Arg::Text(r#"{"a": 1}"#),
                ],
            )?;
            assert_eq!(n, 1);
            sql.execute(
                "INSERT INTO kinds (i8, n, t) VALUES (+?1, ?2, ?3)",
                &[Arg::Int(-5), Arg::Real(3.0), Arg::Null],
            )?;
            sql.query_vec(
                "SELECT i2, i4, i8, f4, f8, n, b, t, v, bytes, j FROM kinds
                 WHERE t = '?1 stays' OR i8 > +?1 OR t IS NULL ORDER BY i8 DESC",
                args![-10i64],
                |r| (0..11).map(|i| r.get::<SqlValue>(i)).collect(),
            )
        })
        .unwrap();
    use SqlValue::*;
    assert_eq!(
        rows[0],
        vec![
            Int(7),
            Int(70_000),
            Int(1 << 40),
            Real(1.5),
            Real(2.25),
            Int(12_345_678),
            Int(1),
            Text("text ?1".into()),
            Text("short".into()),
            Blob(vec![0, 255]),
            Text(r#"{"a": 1}"#.into()),
        ]
    );
    assert_eq!(rows[1][2], Int(-5));
    assert_eq!(rows[1][5], Int(3));
    assert_eq!(rows[1][7], Null);
    // A numeric with a fraction is a real; a count is an integer.
    let (frac, count) = store
        .read(|r| {
            let frac = r.query_one("SELECT 1.25::numeric", &[], |r| r.get::<f64>(0))?;
            let count = r.query_one(
                "SELECT count(*) FROM pg_class WHERE relname = ?1",
                args!["kinds"],
                |r| r.get::<i64>(0),
            )?;
            Ok((frac, count))
        })
        .unwrap();
    assert_eq!((frac, count), (1.25, 1));
    // The infinities of a numeric (PostgreSQL 14 on), which carry no digits.
    let (inf, minus) = store
        .read(|r| {
            let inf = r.query_one("SELECT 'Infinity'::numeric", &[], |r| r.get::<f64>(0))?;
            let minus = r.query_one("SELECT '-Infinity'::numeric", &[], |r| r.get::<f64>(0))?;
            Ok((inf, minus))
        })
        .unwrap();
    assert_eq!((inf, minus), (f64::INFINITY, f64::NEG_INFINITY));
    // A value that does not fit its parameter is an error, not a wrong value.
    let err = store
        .write(|w| {
            w.sql()
                .execute("INSERT INTO kinds (i2) VALUES (?1)", args![100_000i64])
        })
        .unwrap_err();
    assert!(matches!(err, precedent::Error::Backend(_)), "{err:?}");
    let plan = store
        .read(|r| r.plan("SELECT * FROM kinds WHERE i8 = ?1", args![1i64]))
        .unwrap();
    assert!(plan.iter().any(|l| l.contains("kinds")), "{plan:?}");
    assert!(matches!(
        store.read(|r| r.query_one("SELECT NULL", &[], |r| r
            .value(0)
            .map(|v| v == ValueRef::Null))),
        Ok(true)
    ));
    // A parameter the server cannot type takes its argument's type; a statement that
    // does not parse leaves the transaction usable, as on SQLite.
    let (n, s, after_typo) = store
        .read(|r| {
            // `?1 IS NULL` alone says nothing of ?1's type (sqlstate 42P18 on its own).
            let n = r.query_one("SELECT ?1 IS NULL", args![41i64], |r| r.get::<i64>(0))?;
            let s = r.query_one("SELECT ?1 || 'b'", args!["a"], |r| r.get::<String>(0))?;
            assert!(r.query_one("SELEC 1", &[], |r| r.get::<i64>(0)).is_err());
            let after = r.query_one("SELECT count(*) FROM kinds", &[], |r| r.get::<i64>(0))?;
            Ok((n, s, after))
        })
        .unwrap();
    assert_eq!((n, s.as_str(), after_typo), (0, "ab", 2));
    // The first statement of a read is parsed without a savepoint (a failed parse begins
    // the read again): a statement that does not parse leaves it usable there too.
    let after_first_typo = store
        .read(|r| {
            assert!(r.query_one("SELEC 1", &[], |r| r.get::<i64>(0)).is_err());
            r.query_one(
                "SELECT count(*) FROM kinds WHERE i8 IS NULL OR i8 <> ?1",
                args![-1i64],
                |r| r.get::<i64>(0),
            )
        })
        .unwrap();
    assert_eq!(after_first_typo, 2);
}

#[test]
fn a_result_row_is_read_after_the_conditions_that_need_no_row() {
    use precedent::Fact;
    use precedent::query::{Givens, Query};
    let Some(db) = pg::db() else { return };
    let store = Store::open_with(&db.url, StoreOptions::default()).unwrap();
    let shop = Fact::builder("Shop").field("name", "s").build().unwrap();
    let mut facts = vec![shop.clone()];
    for i in 0..300i64 {
        let o = Fact::builder("Shop.Order")
            .field("id", i)
            .predecessor("shop", shop.hash())
            .build()
            .unwrap();
        if i % 10 != 0 {
            facts.push(
                Fact::builder("Shop.Shipment")
                    .predecessor("order", o.hash())
                    .build()
                    .unwrap(),
            );
        }
        facts.push(o);
    }
    store.insert_batch(facts).unwrap();
    let pending = |select: &str| {
        Query::parse(&format!(
            "given s: Shop
             match o: Shop.Order where o->shop = s
               and not exists (match sh: Shop.Shipment where sh->order = o)
             select {select}"
        ))
        .unwrap()
    };
    let g = Givens::from([("s".to_string(), shop.hash())]);
    // Selecting only the hashes reads no order row at all: each comes with the edge from
    // the shop (PostgreSQL schema version 5).
    let hashes = pending("hash(o)");
    assert_eq!(store.query(&hashes, &g).unwrap().len(), 30);
    let plan = store.explain(&hashes, &g).unwrap();
    assert!(
        !plan.iter().any(|l| l.contains("fact_pkey")),
        "an order row is read for its hash:\n{}",
        plan.join("\n")
    );
    let q = pending("o");
    assert_eq!(store.query(&q, &g).unwrap().len(), 30);
    // The shipment test reads edges alone; the orders' rows are read after it, for the
    // 30 results only. EXPLAIN lists a join's outer side before its inner one, so the
    // order rows' lookup (`fact_pkey`) comes after every edge scan; a plan that read all
    // 300 order rows before testing them lists it before the shipment edges.
    let plan = store.explain(&q, &g).unwrap();
    let at = |found: Option<usize>, what: &str| {
        found.unwrap_or_else(|| panic!("no {what} in the plan:\n{}", plan.join("\n")))
    };
    // An edge is a fact's first, in its own row (`fact_by_first`), or one of its others
    // (`edge_more`, schema version 7).
    let last_edge = at(
        plan.iter()
            .rposition(|l| l.contains("using fact_by_first") || l.contains(" on edge_more")),
        "edge scan",
    );
    let order_rows = at(
        plan.iter().position(|l| l.contains("fact_pkey")),
        "fact_pkey",
    );
    assert!(
        order_rows > last_edge,
        "the order rows are read before the shipment test:\n{}",
        plan.join("\n")
    );
}

/// On PostgreSQL a failed statement aborts its whole transaction (SQLite's does not). A
/// write closure that catches such an error and returns `Ok` is not told that it
/// committed: its commit fails with a line that says why, and nothing of it is kept.
#[test]
fn a_commit_after_a_caught_statement_error_fails_and_keeps_nothing() {
    let Some(db) = pg::db() else { return };
    let store = Store::open_with(&db.url, StoreOptions::default()).unwrap();
    store
        .write(|w| w.sql().batch("CREATE TABLE once (k bigint PRIMARY KEY)"))
        .unwrap();
    let insert = "INSERT INTO once VALUES (?1)";
    let result = store.write(|w| {
        let sql = w.sql();
        sql.execute(insert, args![1_i64])?;
        // A second row with the same key: the error is caught, the closure goes on.
        assert!(sql.execute(insert, args![1_i64]).is_err());
        Ok(())
    });
    let err = result.expect_err("a transaction PostgreSQL aborted was reported committed");
    let text = err.to_string();
    assert!(
        text.contains("aborted") && text.contains("nothing"),
        "{text}"
    );
    assert!(!text.contains('\n'), "{text}");
    let rows: i64 = store
        .read(|r| r.query_one("SELECT count(*) FROM once", args![], |row| row.get(0)))
        .unwrap();
    assert_eq!(rows, 0);
    // The store goes on; a statement that may fail, run in a savepoint, leaves the rest.
    store
        .write(|w| {
            w.sql().execute(insert, args![2_i64])?;
            let dup = w.savepoint(|w| w.sql().execute(insert, args![2_i64]));
            assert!(dup.is_err());
            Ok(())
        })
        .unwrap();
    let rows: i64 = store
        .read(|r| r.query_one("SELECT count(*) FROM once", args![], |row| row.get(0)))
        .unwrap();
    assert_eq!(rows, 1);
}
