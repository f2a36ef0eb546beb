//! Store behaviour: idempotence, held facts and their release, reopening, bounds, reads,
//! verify, and a property test over random DAGs delivered in random order. Each test runs
//! on SQLite and on PostgreSQL (`tests/common/backend.rs`) but for the ones about SQLite's
//! own files and migrations.

mod common;

use common::db::Db;
use common::shop::{order, shipment, shop};
use common::{assert_topological, chain, fact};
use precedent::store::Durability;
use precedent::{Error, Fact, FactHash, InsertOutcome, Store, StoreOptions};
use proptest::prelude::*;

conformance! {
    fn same_fact_twice_is_one_fact(b: Backend) {
        let s = b.store();
        let f = fact("A", 1, &[]);
        let first = s.insert(&f).unwrap();
        assert!(matches!(
            first,
            InsertOutcome::Inserted {
                seq: 1,
                released: 1
            }
        ));
        assert_eq!(
            s.insert(&f).unwrap(),
            InsertOutcome::Duplicate { seq: Some(1) }
        );
        assert_eq!(s.stats().unwrap().released, 1);
    }
}

conformance! {
    fn a_child_is_held_until_its_parent_arrives_and_the_release_cascades(b: Backend) {
        let s = b.store();
        let facts = chain(4);
        for f in facts[1..].iter().rev() {
            assert!(s.insert(f).unwrap().is_held());
        }
        // A held fact given again is a duplicate, not a second held row.
        assert_eq!(
            s.insert(&facts[3]).unwrap(),
            InsertOutcome::Duplicate { seq: None }
        );
        assert_eq!(s.stats().unwrap().held, 3);
        let held = s.held(10).unwrap();
        let waiting_for_root = held
            .iter()
            .find(|h| h.fact.hash() == facts[1].hash())
            .unwrap();
        assert_eq!(waiting_for_root.missing, vec![facts[0].hash()]);
        assert!(s.get(&facts[3].hash()).unwrap().is_none());
        assert!(s.lookup(&facts[3].hash()).unwrap().unwrap().seq.is_none());

        let out = s.insert(&facts[0]).unwrap();
        assert_eq!(out.released(), 4);
        assert_eq!(s.stats().unwrap().held, 0);
        assert!(s.held(10).unwrap().is_empty());
        assert_topological(&s);
        assert!(s.verify(|_| {}).unwrap().is_clean());
    }
}

conformance! {
    fn a_fact_with_two_missing_parents_waits_for_both(b: Backend) {
        let s = b.store();
        let (a, b) = (fact("A", 1, &[]), fact("B", 2, &[]));
        let c = fact("C", 3, &[a.hash(), b.hash()]);
        assert_eq!(
            s.insert(&c).unwrap(),
            InsertOutcome::Held {
                missing: {
                    let mut m = vec![a.hash(), b.hash()];
                    m.sort();
                    m
                }
            }
        );
        assert_eq!(s.insert(&a).unwrap().released(), 1);
        assert!(s.get(&c.hash()).unwrap().is_none());
        assert_eq!(s.held(10).unwrap()[0].missing, vec![b.hash()]);
        assert_eq!(s.insert(&b).unwrap().released(), 2);
        assert!(s.get(&c.hash()).unwrap().is_some());
    }
}

conformance! {
    fn held_facts_survive_a_restart_and_release_later(b: Backend) {
        let db = b.db();
        let facts = chain(5);
        {
            let s = db.store();
            let report = s.insert_batch(facts[2..].to_vec()).unwrap();
            assert_eq!(report.held, 3);
            assert_eq!(report.released, 0);
        }
        {
            let s = db.store();
            assert_eq!(s.stats().unwrap().held, 3);
            s.insert(&facts[1]).unwrap();
        }
        let s = db.store();
        assert_eq!(s.stats().unwrap().held, 4);
        assert_eq!(s.insert(&facts[0]).unwrap().released(), 5);
        drop(s);
        let s = db.store();
        assert_eq!(s.stats().unwrap().released, 5);
        assert_eq!(s.stats().unwrap().held, 0);
        assert_topological(&s);
        assert!(s.verify(|_| {}).unwrap().is_clean());
    }
}

conformance! {
    fn reversed_and_shuffled_batches_release_everything(b: Backend) {
        use rand::seq::SliceRandom;
        let facts = chain(300);
        let mut reversed = facts.clone();
        reversed.reverse();
        let s = b.store();
        let r = s.insert_batch(reversed).unwrap();
        assert_eq!((r.inserted, r.held, r.released), (300, 0, 300));

        let mut shuffled = facts.clone();
        shuffled.extend(facts[..50].iter().cloned());
        shuffled.shuffle(&mut rand::rng());
        let s2 = b.store();
        let mut total = precedent::BatchReport::default();
        for chunk in shuffled.chunks(37) {
            total.merge(s2.insert_batch(chunk.to_vec()).unwrap());
        }
        assert_eq!(total.released, 300);
        assert_eq!(total.duplicates, 50);
        assert_eq!(s2.stats().unwrap().held, 0);
        assert_topological(&s2);
    }
}

conformance! {
    fn the_held_bound_refuses_new_held_facts_and_keeps_the_rest(b: Backend) {
        let opts = StoreOptions {
            max_held: 2,
            ..StoreOptions::default()
        };
        let s = b.store_with(opts);
        let facts = chain(5);
        assert!(s.insert(&facts[4]).unwrap().is_held());
        assert!(s.insert(&facts[3]).unwrap().is_held());
        let err = s.insert(&facts[2]).unwrap_err();
        assert!(matches!(err, Error::HeldLimit { limit: 2, hash } if hash == facts[2].hash()));
        assert!(err.to_string().contains("held-fact limit of 2"));
        // A batch reports refusals and stores the rest.
        let r = s
            .insert_batch(vec![facts[2].clone(), fact("Other", 1, &[])])
            .unwrap();
        assert_eq!(r.refused, vec![facts[2].hash()]);
        assert_eq!(r.inserted, 1);
        assert_eq!(s.stats().unwrap().held, 2);
        // Once ancestors arrive in order, the held ones release and the bound frees up.
        s.insert_batch(facts[..3].to_vec()).unwrap();
        assert_eq!(s.stats().unwrap().released, 6);
        assert_eq!(s.stats().unwrap().held, 0);
    }
}

conformance! {
    fn a_failed_write_leaves_nothing_behind(b: Backend) {
        let s = b.store();
        let a = fact("NewType", 1, &[]);
        let r: Result<(), Error> = s.write(|w| {
            w.insert(&a)?;
            Err(Error::InvalidFact {
                reason: "application gave up".into(),
            })
        });
        assert!(r.is_err());
        assert!(s.get(&a.hash()).unwrap().is_none());
        assert!(s.facts_of_type("NewType").unwrap().is_empty());
        // The type id numbered by the rolled-back transaction is not reused wrongly.
        s.insert(&fact("Other", 1, &[])).unwrap();
        s.insert(&a).unwrap();
        assert_eq!(s.facts_of_type("NewType").unwrap().len(), 1);
        assert_eq!(s.facts_of_type("Other").unwrap().len(), 1);
        assert!(s.verify(|_| {}).unwrap().is_clean());
    }
}

conformance! {
    fn reads_follow_edges_by_role_and_type(b: Backend) {
        let s = b.store();
        let shop = shop("corner");
        let order = order(&shop, "id", 1);
        let other = Fact::builder("Review")
            .predecessor("about", shop.hash())
            .build()
            .unwrap();
        let ship = shipment(&order);
        s.insert_batch(vec![
            ship.clone(),
            other.clone(),
            order.clone(),
            shop.clone(),
        ])
        .unwrap();
        let hashes = |v: Vec<Fact>| v.iter().map(Fact::hash).collect::<Vec<_>>();
        assert_eq!(
            hashes(s.successors(&shop.hash(), Some("shop"), None).unwrap()),
            vec![order.hash()]
        );
        assert_eq!(
            hashes(s.successors(&shop.hash(), None, Some("Review")).unwrap()),
            vec![other.hash()]
        );
        assert_eq!(s.successors(&shop.hash(), None, None).unwrap().len(), 2);
        assert!(
            s.successors(&shop.hash(), Some("nope"), None)
                .unwrap()
                .is_empty()
        );
        let preds = s.predecessors(&ship.hash()).unwrap();
        assert_eq!(preds.len(), 1);
        assert_eq!(preds[0].0, "order");
        assert_eq!(
            s.ancestors(&ship.hash()).unwrap(),
            vec![shop.hash(), order.hash()]
        );
        let mut down = s.descendants(&shop.hash()).unwrap();
        down.sort();
        let mut want = vec![order.hash(), other.hash(), ship.hash()];
        want.sort();
        assert_eq!(down, want);
        assert_eq!(
            hashes(s.facts_of_type("Shop.Order").unwrap()),
            vec![order.hash()]
        );
    }
}

conformance! {
    // FIXME(postgres): a_long_cascade_with_fan_in_releases_everything_once passes on
    // PostgreSQL now that batches hold and cascade in a few statements
    // (src/store/postgres/batch.rs, cascade.rs) and verify's held-child check uses the
    // prefix index, but takes 190 to 290 s on a loaded 2-core machine, over a test
    // binary's budget; which step costs most (the 80,000-row verify walks a round trip
    // per held row) is not yet measured.
    @sqlite_only
    /// A cascade longer than the rows a release writes back at once (65,536), through facts
    /// that wait for two parents, so that counts of arrivals are written back while their
    /// waiters still wait: every fact is released exactly once, in topological order.
    fn a_long_cascade_with_fan_in_releases_everything_once(b: Backend) {
        let n = 80_000;
        let mut facts: Vec<Fact> = Vec::with_capacity(n);
        for i in 0..n {
            let preds: Vec<FactHash> = match i {
                0 => vec![],
                1 => vec![facts[0].hash()],
                _ => vec![facts[i - 1].hash(), facts[i - 2].hash()],
            };
            facts.push(fact("Braid", i as i64, &preds));
        }
        let s = b.store();
        // Children first, in batches: each batch is held behind itself and the next one.
        let mut held = 0;
        for batch in facts[1..].chunks(7_000).rev() {
            held += s.insert_batch(batch.to_vec()).unwrap().held;
        }
        assert_eq!(held, n as u64 - 1);
        assert_eq!(s.stats().unwrap().held, n as u64 - 1);
        assert!(s.verify(|_| {}).unwrap().is_clean());
        let r = s.insert_batch(vec![facts[0].clone()]).unwrap();
        assert_eq!((r.inserted, r.released), (1, n as u64));
        assert_eq!(s.stats().unwrap().held, 0);
        assert_eq!(s.stats().unwrap().released, n as u64);
        assert!(s.verify(|_| {}).unwrap().is_clean());
        assert_topological(&s);
    }
}

conformance! {
    /// A cascade releases held facts in the same order on every backend as on SQLite:
    /// depth first, the waiters of each fact in the order they were held; here through
    /// waits by hash, two levels deep.
    fn a_cascade_releases_in_the_same_order_as_on_sqlite(b: Backend) {
        let root = fact("Root", 0, &[]);
        let kids: Vec<Fact> = (1..5).map(|i| fact("Kid", i, &[root.hash()])).collect();
        let grandkids: Vec<Fact> = kids
            .iter()
            .enumerate()
            .map(|(i, k)| fact("Grandkid", i as i64, &[k.hash()]))
            .collect();
        let load = |s: &Store| {
            for k in &kids {
                s.insert_batch(vec![k.clone()]).unwrap();
            }
            s.insert_batch(grandkids.iter().rev().cloned().collect()).unwrap();
            let r = s.insert_batch(vec![root.clone()]).unwrap();
            assert_eq!(r.released, 9);
            let mut all: Vec<&Fact> = kids.iter().chain(&grandkids).collect();
            all.sort_by_key(|f| s.seq_of(&f.hash()).unwrap().unwrap());
            all.iter().map(|f| f.hash()).collect::<Vec<_>>()
        };
        let reference = load(&Store::open_in_memory().unwrap());
        assert_eq!(load(&b.store()), reference);
    }
}

/// A database written by schema version 3 (held facts waiting in `held_wait` only) opens
/// at the current version and its held facts release as before.
/// The tables of schema version 3 as today's first three migrations write them (the
/// databases version 3 itself wrote are in `fixtures/schemas/`), with no rows.
fn version_3_tables(db: &Db) -> rusqlite::Connection {
    let raw = db.raw();
    for sql in [
        include_str!("../schema/001_initial.sql"),
        include_str!("../schema/002_queues.sql"),
        include_str!("../schema/003_sync.sql"),
    ] {
        raw.execute_batch(sql).unwrap();
    }
    raw
}

/// SQLite only: a migration of SQLite's own older schema.
#[test]
fn held_facts_of_a_version_3_database_release_after_migration() {
    let db = Db::new();
    let facts = chain(5);
    {
        // Version 3 as its migrations wrote it, holding facts 1 to 4 of the chain, each
        // waiting for the one before it by hash.
        let conn = version_3_tables(&db);
        for (i, f) in facts.iter().enumerate().skip(1) {
            conn.execute(
                "INSERT INTO held (id, hash, bytes, missing, held_at) VALUES (?1, ?2, ?3, 1, 0)",
                rusqlite::params![i as i64, &f.hash().0[..], f.canonical_bytes()],
            )
            .unwrap();
            conn.execute(
                "INSERT INTO held_wait (missing, waiter) VALUES (?1, ?2)",
                rusqlite::params![&facts[i - 1].hash().0[..], i as i64],
            )
            .unwrap();
        }
        conn.execute_batch(
            "UPDATE counter SET value = 4 WHERE name = 'held'; PRAGMA user_version = 3;",
        )
        .unwrap();
    }
    let s = db.store();
    assert_eq!(s.stats().unwrap().held, 4);
    assert!(s.verify(|_| {}).unwrap().is_clean());
    assert_eq!(s.insert(&facts[0]).unwrap().released(), 5);
    assert_eq!(s.stats().unwrap().held, 0);
    assert!(s.verify(|_| {}).unwrap().is_clean());
    assert_topological(&s);
}

conformance! {
    fn ancestors_of_a_chain_of_100_000_facts(b: Backend) {
        let s = b.store();
        let facts = chain(100_000);
        let last = facts.last().unwrap().hash();
        let first = facts[0].hash();
        s.insert_batch(facts).unwrap();
        let up = s.ancestors(&last).unwrap();
        assert_eq!(up.len(), 99_999);
        assert_eq!(up[0], first);
        assert_eq!(s.descendants(&first).unwrap().len(), 99_999);
    }
}

conformance! {
    fn prefixes_resolve_when_unique_and_fail_clearly_otherwise(b: Backend) {
        let db = b.db();
        let s = db.store();
        let f = fact("A", 1, &[]);
        s.insert(&f).unwrap();
        let h = f.hash().to_string();
        assert_eq!(s.resolve(&h[..8]).unwrap(), f.hash());
        assert_eq!(s.resolve(&h[..13].to_uppercase()).unwrap(), f.hash());
        assert!(
            matches!(s.resolve("0000000000"), Err(Error::UnknownPrefix { .. }))
                || h.starts_with("0000000000")
        );
        assert!(matches!(s.resolve(&h[..7]), Err(Error::BadHash { .. })));
        drop(s);
        // Two rows whose hashes share 8 hex digits, written underneath the store.
        for last in [1u8, 2] {
            let mut hash = [0xab; 32];
            hash[31] = last;
            db.exec(&format!(
                "INSERT INTO held (hash, bytes, missing, held_at) VALUES ({}, {}, 1, 0)",
                db.blob(&hash),
                db.blob(&[0])
            ));
        }
        let s = db.store();
        match s.resolve("abababab") {
            Err(Error::AmbiguousPrefix { candidates, .. }) => assert_eq!(candidates.len(), 2),
            other => panic!("{other:?}"),
        }
    }
}

/// SQLite only: the version is SQLite's `user_version` (tests/pg_store.rs has PostgreSQL's).
#[test]
fn a_database_from_a_newer_version_is_refused() {
    let db = Db::new();
    drop(db.store());
    db.raw().pragma_update(None, "user_version", 999).unwrap();
    match Store::open(&db.path) {
        Err(e @ Error::SchemaTooNew { found: 999, .. }) => assert!(e.to_string().contains("newer")),
        Err(e) => panic!("{e}"),
        Ok(_) => panic!("opened a newer database"),
    }
}

conformance! {
    fn verify_finds_damaged_rows(b: Backend) {
        let db = b.db();
        let facts = chain(3);
        let s = db.store_with(StoreOptions {
            durability: Durability::Normal,
            ..StoreOptions::default()
        });
        s.insert_batch(facts.clone()).unwrap();
        s.insert(&fact("Lonely", 1, &[FactHash([7; 32])])).unwrap();
        assert!(s.verify(|_| {}).unwrap().is_clean());
        drop(s);
        let other = fact("Z", 9, &[]);
        db.exec(&format!(
            "UPDATE fact SET bytes = {} WHERE seq = 2",
            db.blob(other.canonical_bytes())
        ));
        // The third fact's edge, gone: from the `edge` table on SQLite; on PostgreSQL
        // (schema version 7) a fact's first edge is in its own row and the others in
        // `edge_more`, behind the read-only view `edge`.
        let removed = if b == common::backend::Backend::Postgres {
            db.exec("UPDATE fact SET p1 = NULL, p1_role = NULL, p1_type = NULL WHERE seq = 3")
                + db.exec("DELETE FROM edge_more WHERE successor = 3")
        } else {
            db.exec("DELETE FROM edge WHERE successor = 3")
        };
        assert_eq!(removed, 1);
        db.exec("UPDATE counter SET value = 5 WHERE name = 'held'");
        db.exec("DELETE FROM held_wait");
        // A type id naming no type (neither backend has a foreign key to stop it).
        db.exec("UPDATE fact SET type_id = 999 WHERE seq = 1");
        let s = db.store();
        let report = s.verify(|_| {}).unwrap();
        let text: Vec<String> = report.problems.iter().map(|p| p.to_string()).collect();
        assert!(
            text.iter()
                .any(|t| t.contains(&facts[1].hash().to_string()) && t.contains("hash mismatch")),
            "{text:?}"
        );
        assert!(
            text.iter()
                .any(|t| t.contains(&facts[2].hash().to_string()) && t.contains("not released before")),
            "{text:?}"
        );
        let lonely = fact("Lonely", 1, &[FactHash([7; 32])]).hash().to_string();
        assert!(
            text.iter()
                .any(|t| t.contains(&lonely) && t.contains("does not wait for absent predecessor")),
            "{text:?}"
        );
        assert!(
            text.iter().any(|t| t.contains("held counter says 5")),
            "{text:?}"
        );
        assert!(
            text.iter()
                .any(|t| t.contains(&facts[0].hash().to_string()) && t.contains("type column says None")),
            "{text:?}"
        );
        // Reading the damaged fact is an error, not wrong data.
        assert!(matches!(
            s.get(&facts[1].hash()),
            Err(Error::Corrupt { .. })
        ));
        // Streaming the raw bytes out (export, sync) stops at the damaged row too.
        let streamed = s.for_each_released(0, |_, _, _| Ok(()));
        assert!(matches!(streamed, Err(Error::Corrupt { hash, .. }) if hash == facts[1].hash()));
    }
}

conformance! {
    /// An edge row whose successor is no fact (a query walking it toward successors would
    /// answer with a fact that is not stored) is a problem `verify` reports.
    fn verify_finds_an_edge_whose_successor_is_no_fact(b: Backend) {
        let db = b.db();
        let s = db.store();
        let shop = shop("corner");
        let order = order(&shop, "id", 1);
        s.insert_batch(vec![shop.clone(), order.clone()]).unwrap();
        assert!(s.verify(|_| {}).unwrap().is_clean());
        drop(s);
        // A copy of the order's edge, leading to seq 999999. On PostgreSQL (schema version
        // 7) an edge whose successor is no fact cannot be a fact row's first edge: it is a
        // row of `edge_more`, in its role's partition (`edge` is a view there, whose rows
        // of NULLs stand for the facts without predecessor).
        let added = if b == common::backend::Backend::Postgres {
            let role = db.query_i64("SELECT role_id FROM edge WHERE predecessor IS NOT NULL");
            edge_more_partition(&db, role);
            db.exec(
                "INSERT INTO edge_more (predecessor, role_id, successor_type, successor,
                                        predecessor_type, successor_hash)
                 SELECT predecessor, role_id, successor_type, 999999, predecessor_type,
                        successor_hash
                 FROM edge WHERE predecessor IS NOT NULL",
            )
        } else {
            db.exec(
                "INSERT INTO edge (predecessor, role_id, successor_type, successor, predecessor_type)
                 SELECT predecessor, role_id, successor_type, 999999, predecessor_type FROM edge",
            )
        };
        assert_eq!(added, 1);
        let problems: Vec<String> = db
            .store()
            .verify(|_| {})
            .unwrap()
            .problems
            .iter()
            .map(|p| p.to_string())
            .collect();
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert!(problems[0].contains("seq 999999"), "{problems:?}");
    }
}

conformance! {
    fn verify_finds_an_edge_whose_types_are_not_its_facts_types(b: Backend) {
        let db = b.db();
        let s = db.store();
        let shop = shop("corner");
        let order = order(&shop, "id", 1);
        let ship = shipment(&order);
        s.insert_batch(vec![shop.clone(), order.clone(), ship.clone()])
            .unwrap();
        assert!(s.verify(|_| {}).unwrap().is_clean());
        drop(s);
        // The order's edge says its successor is a Shop.Shipment; the shipment's edge says its
        // predecessor is a Shop. Both type ids exist, so only a comparison with the facts finds it.
        let id = |name: &str| -> i64 {
            db.query_i64(&format!("SELECT id FROM fact_type WHERE name = '{name}'"))
        };
        let (shop_t, order_t, ship_t) = (id("Shop"), id("Shop.Order"), id("Shop.Shipment"));
        if b == common::backend::Backend::Postgres {
            // Schema version 7: each fact's one edge is in its own row, whose successor
            // type is the fact's `type_id` itself. An edge with another successor type can
            // only be a row of `edge_more`: the order's edge is moved there, with the wrong
            // type, and cleared from the order's row. The shipment's edge keeps its place,
            // with the wrong predecessor type.
            let role = id_of_role(&db, "shop");
            edge_more_partition(&db, role);
            let moved = db.exec(&format!(
                "INSERT INTO edge_more (predecessor, role_id, successor_type, successor,
                                        predecessor_type, successor_hash)
                 SELECT p1, p1_role, {ship_t}, seq, p1_type, hash
                 FROM fact WHERE type_id = {order_t}"
            ));
            assert_eq!(moved, 1);
            let cleared = db.exec(&format!(
                "UPDATE fact SET p1 = NULL, p1_role = NULL, p1_type = NULL WHERE type_id = {order_t}"
            ));
            assert_eq!(cleared, 1);
            let changed = db.exec(&format!(
                "UPDATE fact SET p1_type = {shop_t} WHERE p1_type = {order_t}"
            ));
            assert_eq!(changed, 1);
        } else {
            let changed = db.exec(&format!(
                "UPDATE edge SET successor_type = {ship_t} WHERE successor_type = {order_t}"
            ));
            assert_eq!(changed, 1);
            let changed = db.exec(&format!(
                "UPDATE edge SET predecessor_type = {shop_t} WHERE predecessor_type = {order_t}"
            ));
            assert_eq!(changed, 1);
        }
        let s = db.store();
        let text: Vec<String> = s
            .verify(|_| {})
            .unwrap()
            .problems
            .iter()
            .map(|p| p.to_string())
            .collect();
        assert_eq!(text.len(), 2, "{text:?}");
        let names = |f: &Fact, t: String| {
            text.iter()
                .any(|p| p.contains(&f.hash().to_string()) && p.contains(&t))
        };
        assert!(
            names(&order, format!("gives types {shop_t} -> {ship_t}")),
            "{text:?}"
        );
        assert!(
            names(&ship, format!("gives types {shop_t} -> {ship_t}")),
            "{text:?}"
        );
    }
}

/// The id of the role `name`, read underneath the store.
fn id_of_role(db: &common::backend::TestDb, name: &str) -> i64 {
    db.query_i64(&format!("SELECT id FROM role WHERE name = '{name}'"))
}

/// PostgreSQL (schema version 7): the partition of `edge_more` for the role `role`, which
/// the store creates only with a role's first edge that is not its fact's first; a test
/// that writes such an edge underneath the store creates it first.
fn edge_more_partition(db: &common::backend::TestDb, role: i64) {
    let pg = db.pg.as_ref().expect("a PostgreSQL database");
    pg.psql(&format!(
        "CREATE TABLE IF NOT EXISTS edge_more_{role} PARTITION OF edge_more FOR VALUES IN ({role})"
    ));
}

/// SQLite only: a migration of SQLite's own older schema.
#[test]
fn a_version_3_database_gains_edge_types_when_opened() {
    let db = Db::new();
    let shop = shop("corner");
    let orders: Vec<Fact> = (0..3).map(|i| order(&shop, "id", i)).collect();
    let ship = shipment(&orders[1]);
    // The tables and rows as version 3 wrote them: edges without types.
    {
        let raw = version_3_tables(&db);
        raw.pragma_update(None, "user_version", 3).unwrap();
        raw.execute_batch(
            "INSERT INTO fact_type (id, name) VALUES (1, 'Shop'), (2, 'Shop.Order'), (3, 'Shop.Shipment');
             INSERT INTO role (id, name) VALUES (1, 'shop'), (2, 'order');",
        )
        .unwrap();
        let mut all = vec![(&shop, 1)];
        all.extend(orders.iter().map(|o| (o, 2)));
        all.push((&ship, 3));
        for (f, t) in all {
            raw.execute(
                "INSERT INTO fact (hash, type_id, bytes) VALUES (?1, ?2, ?3)",
                rusqlite::params![&f.hash().0[..], t, f.canonical_bytes()],
            )
            .unwrap();
        }
        raw.execute_batch(
            "INSERT INTO edge (predecessor, role_id, successor) VALUES
                 (1, 1, 2), (1, 1, 3), (1, 1, 4), (3, 2, 5);",
        )
        .unwrap();
    }
    let s = db.store();
    assert!(s.verify(|_| {}).unwrap().is_clean());
    let raw = db.raw();
    let edges: Vec<(i64, i64, i64, i64, i64)> = raw
        .prepare(
            "SELECT predecessor, role_id, successor_type, successor, predecessor_type
             FROM edge ORDER BY successor",
        )
        .unwrap()
        .query_map([], |r| {
            Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?))
        })
        .unwrap()
        .collect::<rusqlite::Result<_>>()
        .unwrap();
    assert_eq!(
        edges,
        vec![
            (1, 1, 2, 2, 1),
            (1, 1, 2, 3, 1),
            (1, 1, 2, 4, 1),
            (3, 2, 3, 5, 2)
        ]
    );
    let hashes = |v: Vec<Fact>| v.iter().map(Fact::hash).collect::<Vec<_>>();
    assert_eq!(
        hashes(
            s.successors(&shop.hash(), Some("shop"), Some("Shop.Order"))
                .unwrap()
        ),
        orders.iter().map(Fact::hash).collect::<Vec<_>>()
    );
    // A migrated store keeps writing typed edges.
    let late = shipment(&orders[2]);
    s.insert(&late).unwrap();
    assert_eq!(
        hashes(
            s.successors(&orders[2].hash(), Some("order"), Some("Shop.Shipment"))
                .unwrap()
        ),
        vec![late.hash()]
    );
    assert!(s.verify(|_| {}).unwrap().is_clean());
}

/// A random DAG: fact i names up to three of the facts before it.
fn dag_strategy() -> impl Strategy<Value = Vec<Vec<usize>>> {
    (1usize..60).prop_flat_map(|n| {
        (0..n)
            .map(|i| proptest::collection::vec(0..i.max(1), if i == 0 { 0..1 } else { 0..4 }))
            .collect::<Vec<_>>()
    })
}

fn build_dag(shape: &[Vec<usize>]) -> Vec<Fact> {
    let mut facts: Vec<Fact> = Vec::new();
    for (i, preds) in shape.iter().enumerate() {
        let hashes: Vec<FactHash> = preds.iter().map(|&p| facts[p].hash()).collect();
        facts.push(fact("Node", i as i64, &hashes));
    }
    facts
}

conformance! {
    /// Random DAGs delivered in random order with random duplicates, across several
    /// batches and reopenings, end with exactly that DAG stored, nothing held, and the
    /// release sequence topological. The cases share one database, emptied before each.
    fn any_delivery_order_ends_with_the_whole_dag(b: Backend) {
        let db = b.db();
        proptest!(ProptestConfig::with_cases(48), |(
            shape in dag_strategy(),
            order_seed in any::<u64>(),
            dups in proptest::collection::vec(any::<prop::sample::Index>(), 0..20),
            cuts in proptest::collection::vec(any::<prop::sample::Index>(), 0..5),
            reopen_mask in any::<u8>(),
        )| {
            use rand::{SeedableRng, seq::SliceRandom};
            let facts = build_dag(&shape);
            let mut delivery: Vec<Fact> = facts.clone();
            delivery.extend(dups.iter().map(|d| facts[d.index(facts.len())].clone()));
            delivery.shuffle(&mut rand::rngs::StdRng::seed_from_u64(order_seed));
            let mut bounds: Vec<usize> = cuts.iter().map(|c| c.index(delivery.len() + 1)).collect();
            bounds.push(0);
            bounds.push(delivery.len());
            bounds.sort();
            db.reset();
            let opts = StoreOptions { durability: Durability::Normal, ..StoreOptions::default() };
            let mut store = db.store_with(opts.clone());
            let mut released = 0;
            for (i, w) in bounds.windows(2).enumerate() {
                let batch = delivery[w[0]..w[1]].to_vec();
                if batch.len() == 1 && i % 2 == 0 {
                    released += store.insert(&batch[0]).unwrap().released();
                } else {
                    released += store.insert_batch(batch).unwrap().released;
                }
                if reopen_mask & (1 << (i % 8)) != 0 {
                    drop(store);
                    store = db.store_with(opts.clone());
                }
            }
            let stats = store.stats().unwrap();
            prop_assert_eq!(released, facts.len() as u64);
            prop_assert_eq!(stats.released, facts.len() as u64);
            prop_assert_eq!(stats.held, 0);
            for f in &facts {
                prop_assert!(store.get(&f.hash()).unwrap().is_some());
            }
            assert_topological(&store);
            let report = store.verify(|_| {}).unwrap();
            prop_assert!(report.is_clean(), "{:?}", report.problems);
        });
    }
}

conformance! {
    fn a_batch_with_held_facts_and_their_missing_parent_releases_each_once(b: Backend) {
        let s = b.store();
        let facts = chain(4);
        s.insert_batch(vec![facts[2].clone(), facts[3].clone()])
            .unwrap();
        assert_eq!(s.held_count().unwrap(), 2);
        // The parent comes with copies of the held facts, parents-first.
        let r = s.insert_batch(facts[..4].to_vec()).unwrap();
        assert_eq!((r.inserted, r.duplicates, r.released, r.held), (2, 2, 4, 0));
        assert_eq!(s.stats().unwrap().released, 4);
        assert!(s.verify(|_| {}).unwrap().is_clean());
    }
}

conformance! {
    /// A batch fact held at its turn, waiting for a fact held before the batch, and
    /// released by a later fact of the same batch (the held one's parent) ends released:
    /// the batch's report counts it inserted, not held, for every batch size (the large
    /// ones go another way on PostgreSQL).
    fn a_batch_fact_released_later_in_its_batch_is_not_counted_held(b: Backend) {
        for fillers in [0u64, 300] {
            let db = b.db();
            let s = db.store();
            let p = fact("P", 0, &[]);
            let h = fact("H", 1, &[p.hash()]);
            let y = fact("Y", 2, &[h.hash()]);
            s.insert(&h).unwrap();
            assert_eq!(s.held_count().unwrap(), 1);
            let mut batch = vec![y.clone(), p.clone()];
            batch.extend((0..fillers as i64).map(|i| fact("Filler", i, &[])));
            let r = s.insert_batch(batch).unwrap();
            assert_eq!(s.held_count().unwrap(), 0);
            assert!(s.get(&y.hash()).unwrap().is_some());
            assert_eq!(
                (r.inserted, r.held, r.released),
                (2 + fillers, 0, 3 + fillers),
                "{fillers} fillers: {r:?}"
            );
            assert!(s.verify(|_| {}).unwrap().is_clean());
        }
    }
}

/// A release hook that asks for an `Echo` of each `Trigger` it sees, then fails when the
/// trigger's `fail` field is true.
struct EchoThenFail;

impl precedent::store::ReleaseHook for EchoThenFail {
    fn on_release(
        &self,
        ctx: &mut precedent::store::HookCtx<'_>,
        released: &Fact,
        _seq: i64,
    ) -> precedent::Result<()> {
        if released.type_name() != "Trigger" {
            return Ok(());
        }
        ctx.insert_later(fact("Echo", 0, &[released.hash()]));
        match released.fields().get("fail") {
            Some(precedent::Value::Bool(true)) => Err(precedent::Error::InvalidFact {
                reason: "the hook refuses it".into(),
            }),
            _ => Ok(()),
        }
    }
}

conformance! {
    /// A savepoint rolled back takes back the facts hooks asked for inside it: they are
    /// not stored by the next insert of the transaction.
    fn a_rolled_back_savepoint_drops_what_hooks_asked_for(b: Backend) {
        let s = b.store_with(StoreOptions {
            release_hooks: vec![std::sync::Arc::new(EchoThenFail)],
            ..StoreOptions::default()
        });
        let bad = Fact::builder("Trigger").field("fail", true).build().unwrap();
        let good = Fact::builder("Trigger").field("fail", false).build().unwrap();
        s.write(|w| {
            assert!(w.savepoint(|w| w.insert(&bad)).is_err());
            w.insert(&good)?;
            Ok(())
        })
        .unwrap();
        assert!(s.get(&bad.hash()).unwrap().is_none());
        assert!(s.get(&good.hash()).unwrap().is_some());
        // The good trigger's echo only.
        assert!(s.get(&fact("Echo", 0, &[good.hash()]).hash()).unwrap().is_some());
        assert!(s.lookup(&fact("Echo", 0, &[bad.hash()]).hash()).unwrap().is_none());
        assert_eq!((s.stats().unwrap().released, s.held_count().unwrap()), (2, 0));
    }
}

/// A release hook, called in runs, that asks for a new `Echo` of each `Trigger` at each
/// call (numbered, so that two calls ask for two different facts).
#[cfg(feature = "postgres")]
struct EchoEachCall(std::sync::atomic::AtomicI64);

#[cfg(feature = "postgres")]
impl precedent::store::ReleaseHook for EchoEachCall {
    fn on_release(
        &self,
        ctx: &mut precedent::store::HookCtx<'_>,
        released: &Fact,
        _seq: i64,
    ) -> precedent::Result<()> {
        if released.type_name() == "Trigger" {
            let n = self.0.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            ctx.insert_later(fact("Echo", n, &[released.hash()]));
        }
        Ok(())
    }

    fn in_runs(&self) -> bool {
        true
    }
}

/// On PostgreSQL a large batch is first written as if all new (`docs/design.md`, "The
/// write path of a batch"); when that guess fails on a fact another store wrote, the
/// batch is rolled back and written again. The facts hooks asked for in the failed pass
/// go with it: one `Echo` for the trigger, not two.
#[cfg(feature = "postgres")]
#[test]
fn a_failed_guess_drops_what_hooks_asked_for_in_it() {
    use common::backend::Backend;
    let Some(db) = Backend::Postgres.ready().then(|| Backend::Postgres.db()) else {
        return;
    };
    let s = db.store_with(StoreOptions {
        release_hooks: vec![std::sync::Arc::new(EchoEachCall(0.into()))],
        ..StoreOptions::default()
    });
    let other = db.store();
    let p = fact("P", 0, &[]);
    let h = fact("H", 1, &[p.hash()]);
    s.insert(&h).unwrap();
    let d = fact("D", 2, &[]);
    other.insert(&d).unwrap();
    let trigger = Fact::builder("Trigger").field("n", 1).build().unwrap();
    let mut batch = vec![trigger.clone(), p.clone()];
    batch.extend((0..300).map(|i| fact("Filler", i, &[])));
    batch.push(d.clone());
    s.insert_batch(batch).unwrap();
    let echoes = s.facts_of_type("Echo").unwrap();
    assert_eq!(echoes.len(), 1, "{echoes:?}");
    assert_eq!(s.held_count().unwrap(), 0);
}

/// When SQLite rolls a whole transaction back under the writer (it may, after an I/O
/// error, a full disk or an interrupt: here a `ROLLBACK` run through the writer's SQL
/// stands for it), nothing the writer does afterwards runs outside a transaction: the
/// write fails, and the facts written after it are not committed one by one.
#[test]
fn a_transaction_sqlite_rolled_back_commits_nothing_after_it() {
    let db = Db::init();
    let s = db.store();
    let (a, b) = (fact("A", 1, &[]), fact("B", 2, &[]));
    let result = s.write(|w| {
        w.insert(&a)?;
        let lost = w.savepoint(|w| {
            w.sql().batch("ROLLBACK")?;
            Err::<(), _>(Error::InvalidFact {
                reason: "the handler failed".into(),
            })
        });
        assert!(lost.is_err());
        // A caller that goes on after the failed savepoint.
        let _ = w.insert(&b);
        Ok(())
    });
    assert!(
        s.lookup(&b.hash()).unwrap().is_none(),
        "committed outside the transaction"
    );
    assert!(s.lookup(&a.hash()).unwrap().is_none());
    let err = result.unwrap_err().to_string();
    assert!(err.contains("rolled back under it"), "{err}");
    assert_eq!(s.stats().unwrap().released, 0);
    // The store goes on working.
    s.insert(&b).unwrap();
    assert!(s.verify(|_| {}).unwrap().is_clean());
}

conformance! {
    fn a_large_batch_counts_what_another_store_released_as_duplicates(b: Backend) {
        use rand::seq::SliceRandom;
        // Two stores on one database, as two processes would be: the second knows
        // nothing of what the first released.
        let db = b.db();
        let (first, second) = (db.store(), db.store());
        let root = fact("Root", 0, &[]);
        let leaves: Vec<Fact> = (0..600).map(|i| fact("Leaf", i, &[root.hash()])).collect();
        let mut given = vec![root.clone()];
        given.extend(leaves[..300].iter().cloned());
        let r = first.insert_batch(given).unwrap();
        assert_eq!((r.inserted, r.duplicates), (301, 0));

        // Half of it stored already, in any order.
        let mut all = vec![root.clone()];
        all.extend(leaves.iter().cloned());
        all.shuffle(&mut rand::rng());
        let r = second.insert_batch(all).unwrap();
        assert_eq!(
            (r.inserted, r.duplicates, r.released, r.held),
            (300, 301, 300, 0)
        );

        // Again, with facts held for a parent that is missing.
        let absent = fact("Root", 1, &[]);
        let orphans: Vec<Fact> = (0..300).map(|i| fact("Leaf", i, &[absent.hash()])).collect();
        let more: Vec<Fact> = (600..900).map(|i| fact("Leaf", i, &[root.hash()])).collect();
        let mut mixed: Vec<Fact> = leaves[300..].to_vec();
        mixed.extend(orphans.iter().cloned());
        mixed.extend(more.iter().cloned());
        mixed.shuffle(&mut rand::rng());
        let r = first.insert_batch(mixed).unwrap();
        assert_eq!(
            (r.inserted, r.duplicates, r.released, r.held),
            (300, 300, 300, 300)
        );
        let r = second.insert_batch(vec![absent]).unwrap();
        assert_eq!(r.released, 301);

        let stats = second.stats().unwrap();
        assert_eq!((stats.released, stats.held), (1 + 900 + 1 + 300, 0));
        // No number was lost to a write that was undone.
        let last = second.read(|r| r.last_seq()).unwrap();
        assert_eq!(last, stats.released as i64);
        assert_topological(&second);
        assert!(second.verify(|_| {}).unwrap().is_clean());
    }
}

conformance! {
    fn facts_of_a_write_rolled_back_are_written_by_the_next(b: Backend) {
        let s = b.store();
        let root = fact("Root", 0, &[]);
        let leaves: Vec<Fact> = (0..400).map(|i| fact("Leaf", i, &[root.hash()])).collect();
        let mut batch = vec![root.clone()];
        batch.extend(leaves.iter().cloned());
        let undone = s.write(|w| {
            let r = w.insert_batch(batch.clone())?;
            assert_eq!(r.inserted, 401);
            Err::<(), _>(undone_on_purpose())
        });
        assert!(undone.is_err());
        // A savepoint rolled back inside a transaction that commits.
        s.write(|w| {
            let kept = w.insert_batch(vec![root.clone()])?;
            assert_eq!(kept.inserted, 1);
            let inner = w.savepoint(|w| {
                let r = w.insert_batch(leaves.clone())?;
                assert_eq!(r.inserted, 400);
                Err::<(), _>(undone_on_purpose())
            });
            assert!(inner.is_err());
            Ok(())
        })
        .unwrap();
        assert_eq!(s.stats().unwrap().released, 1);
        let r = s.insert_batch(batch).unwrap();
        assert_eq!((r.inserted, r.duplicates), (400, 1));
        assert_eq!(s.stats().unwrap().released, 401);
        assert!(leaves.iter().all(|f| s.get(&f.hash()).unwrap().is_some()));
        assert_eq!(s.read(|r| r.last_seq()).unwrap(), 401);
        assert!(s.verify(|_| {}).unwrap().is_clean());
    }
}

/// The error a test's write returns to have its transaction or savepoint rolled back.
fn undone_on_purpose() -> Error {
    Error::SyncConfig {
        reason: "undone on purpose".into(),
    }
}
