//! The fact core on PostgreSQL, on a real cluster started by `tests/common/pg.rs`: the
//! same behaviour as on SQLite (insert, hold, release, cascades, duplicates, the held
//! bound, verify, dropping held facts, migrations), sequence numbers in commit order with
//! writers in several threads and processes, the held-cascade race, and clear errors.

mod common;

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use common::pg::{self, PgDb};
use common::{chain, fact};
use precedent::query::{Givens, Projected, Query};
use precedent::store::{Dialect, PG_SCHEMA_VERSION, SqlExt};
use precedent::{Error, FactHash, InsertOutcome, Store, StoreOptions};

fn open(db: &PgDb) -> Store {
    Store::open_with(&db.url, StoreOptions::default()).unwrap()
}

fn open_with(db: &PgDb, options: StoreOptions) -> Store {
    Store::open_with(&db.url, options).unwrap()
}

#[test]
fn the_harness_gives_each_test_a_fresh_database() {
    let Some(a) = pg::db() else { return };
    let Some(b) = pg::db() else { return };
    assert_ne!(a.name, b.name);
    a.psql("CREATE TABLE only_here (x BIGINT)");
    let count = "SELECT count(*) FROM pg_tables WHERE tablename = 'only_here'";
    assert_eq!(a.psql(count), "1");
    assert_eq!(b.psql(count), "0");
}

#[test]
fn insert_get_hold_release_and_cascade() {
    let Some(db) = pg::db() else { return };
    let store = open(&db);
    assert_eq!(store.dialect(), Dialect::Postgres);
    assert!(store.path().is_none());
    let links = chain(4);
    // The last two arrive first: held, the last behind the third.
    assert!(store.insert(&links[3]).unwrap().is_held());
    assert!(store.insert(&links[2]).unwrap().is_held());
    assert_eq!(store.held_count().unwrap(), 2);
    assert_eq!(store.seq_of(&links[2].hash()).unwrap(), None);
    let held = store.held(10).unwrap();
    assert_eq!(held.len(), 2);
    assert_eq!(held[0].fact.hash(), links[3].hash());
    assert_eq!(held[0].missing, vec![links[2].hash()]);
    // A held fact again is a duplicate.
    assert_eq!(
        store.insert(&links[2]).unwrap(),
        InsertOutcome::Duplicate { seq: None }
    );
    assert_eq!(
        store.insert(&links[0]).unwrap(),
        InsertOutcome::Inserted {
            seq: 1,
            released: 1
        }
    );
    // The second releases the two held behind it, in order.
    assert_eq!(
        store.insert(&links[1]).unwrap(),
        InsertOutcome::Inserted {
            seq: 2,
            released: 3
        }
    );
    assert_eq!(store.held_count().unwrap(), 0);
    for (i, l) in links.iter().enumerate() {
        assert_eq!(store.seq_of(&l.hash()).unwrap(), Some(i as i64 + 1));
        assert_eq!(store.get(&l.hash()).unwrap().unwrap(), *l);
    }
    assert_eq!(
        store.insert(&links[1]).unwrap(),
        InsertOutcome::Duplicate { seq: Some(2) }
    );
    assert_eq!(store.ancestors(&links[3].hash()).unwrap().len(), 3);
    assert_eq!(store.descendants(&links[0].hash()).unwrap().len(), 3);
    assert_eq!(store.facts_of_type("Link").unwrap(), links);
    let prefix = &links[2].hash().to_string()[..12];
    assert_eq!(store.resolve(prefix).unwrap(), links[2].hash());
    let stats = store.stats().unwrap();
    assert_eq!(stats.released, 4);
    assert_eq!(stats.edges, 3);
    assert_eq!(stats.per_type["Link"], 4);
    assert!(stats.db_bytes > 0);
    common::assert_topological(&store);
    assert!(store.verify(|_| {}).unwrap().is_clean());
}

#[test]
fn a_batch_in_any_order_collapses_duplicates_and_releases_all() {
    let Some(db) = pg::db() else { return };
    let store = open(&db);
    let links = chain(50);
    let mut shuffled = links.clone();
    shuffled.reverse();
    shuffled.push(links[10].clone());
    let report = store.insert_batch(shuffled).unwrap();
    assert_eq!(report.inserted, 50);
    assert_eq!(report.released, 50);
    assert_eq!(report.duplicates, 1);
    // Held behind a fact outside the batch, then released by it.
    let root = fact("Root", 1, &[]);
    let kids: Vec<_> = (0..5).map(|i| fact("Kid", i, &[root.hash()])).collect();
    let grandkid = fact("Grandkid", 0, &[kids[0].hash(), kids[4].hash()]);
    let mut batch = vec![grandkid.clone()];
    batch.extend(kids.iter().cloned());
    let report = store.insert_batch(batch).unwrap();
    assert_eq!((report.held, report.inserted), (6, 0));
    assert_eq!(store.insert(&root).unwrap().released(), 7);
    assert_eq!(store.seq_of(&grandkid.hash()).unwrap(), Some(57));
    let again = store.insert_batch(links).unwrap();
    assert_eq!(again.duplicates, 50);
    common::assert_topological(&store);
    assert!(store.verify(|_| {}).unwrap().is_clean());
}

#[test]
fn the_held_bound_refuses_past_max_held() {
    let Some(db) = pg::db() else { return };
    let options = StoreOptions {
        max_held: 2,
        ..StoreOptions::default()
    };
    let store = open_with(&db, options);
    for i in 0..2 {
        store.insert(&fact("F", i, &[FactHash([9; 32])])).unwrap();
    }
    let third = fact("F", 3, &[FactHash([9; 32])]);
    match store.insert(&third) {
        Err(Error::HeldLimit { limit: 2, hash }) => assert_eq!(hash, third.hash()),
        other => panic!("{other:?}"),
    }
    let report = store.insert_batch(vec![third.clone()]).unwrap();
    assert_eq!(report.refused, vec![third.hash()]);
    assert_eq!(store.held_count().unwrap(), 2);
}

#[test]
fn dropping_held_facts_takes_what_waits_for_them() {
    let Some(db) = pg::db() else { return };
    let store = open(&db);
    let typo = FactHash([7; 32]);
    let a = fact("A", 1, &[typo]);
    let b = fact("B", 1, &[a.hash()]);
    let c = fact("C", 1, &[b.hash()]);
    let other = fact("Other", 1, &[FactHash([8; 32])]);
    store.insert(&a).unwrap();
    store.insert_batch(vec![c.clone(), b.clone()]).unwrap();
    store.insert(&other).unwrap();
    let released = fact("R", 1, &[]);
    store.insert(&released).unwrap();
    assert!(matches!(
        store.drop_held(&[released.hash()]),
        Err(Error::NotHeld { .. })
    ));
    assert!(matches!(
        store.drop_held(&[FactHash([1; 32])]),
        Err(Error::NotFound { .. })
    ));
    assert_eq!(
        store.drop_held(&[a.hash()]).unwrap(),
        vec![a.hash(), b.hash(), c.hash()]
    );
    assert_eq!(store.held_count().unwrap(), 1);
    assert!(store.verify(|_| {}).unwrap().is_clean());
    // Expiring everything held up to now takes the rest.
    assert_eq!(
        store.expire_held(Duration::ZERO).unwrap(),
        vec![other.hash()]
    );
    assert_eq!(store.held_count().unwrap(), 0);
    assert!(store.verify(|_| {}).unwrap().is_clean());
}

#[test]
fn a_savepoint_rolled_back_undoes_its_facts_and_numbers() {
    let Some(db) = pg::db() else { return };
    let store = open(&db);
    let (a, b) = (fact("A", 1, &[]), fact("B", 1, &[]));
    store
        .write(|w| {
            w.insert(&a)?;
            let undone: precedent::Result<()> = w.savepoint(|w| {
                w.insert(&b)?;
                Err(Error::InvalidFact {
                    reason: "undo".into(),
                })
            });
            assert!(undone.is_err());
            Ok(())
        })
        .unwrap();
    assert_eq!(store.seq_of(&b.hash()).unwrap(), None);
    assert_eq!(store.insert(&b).unwrap().released(), 1);
    assert_eq!(store.seq_of(&b.hash()).unwrap(), Some(2));
    assert!(store.verify(|_| {}).unwrap().is_clean());
}

#[test]
fn warming_a_store_leaves_nothing_behind_and_the_next_writes_go_on() {
    let Some(db) = pg::db() else { return };
    let store = open(&db);
    let root = fact("T.Root", 1, &[]);
    store.insert(&root).unwrap();
    let state = || {
        db.psql(
            "SELECT (SELECT count(*) FROM fact)
                || ' ' || (SELECT count(*) FROM edge WHERE predecessor IS NOT NULL)
                || ' ' || (SELECT count(*) FROM edge_more)
                || ' ' || (SELECT count(*) FROM pg_inherits WHERE inhparent = 'edge_more'::regclass)
                || ' ' || (SELECT count(*) FROM fact_type) || ' ' || (SELECT count(*) FROM role)
                || ' ' || (SELECT string_agg(name || '=' || value, ',' ORDER BY name) FROM counter)
                || ' ' || (SELECT last_value FROM fact_type_id_seq)
                || ' ' || (SELECT count(*) FROM pg_stat_activity
                           WHERE datname = current_database() AND state LIKE 'idle in%')",
        )
    };
    let before = state();
    store.warm().unwrap();
    store.warm().unwrap();
    // No row, no counter, no name id drawn, no partition of `edge_more` created, and no
    // connection left inside a transaction.
    assert_eq!(state(), before);
    assert!(before.ends_with(" 0"), "{before}");
    // The warmed connection takes the next writes: a new type and role, then a batch
    // long enough for the `COPY`s.
    let child = fact("T.Child", 2, &[root.hash()]);
    assert!(matches!(
        store.insert(&child).unwrap(),
        InsertOutcome::Inserted { .. }
    ));
    let many: Vec<_> = (0..300)
        .map(|i| fact("T.Child", 10 + i, &[root.hash()]))
        .collect();
    let report = store.insert_batch(many).unwrap();
    assert_eq!(report.inserted, 300);
    assert_eq!(
        db.psql("SELECT count(*) || ' ' || max(seq) FROM fact"),
        "302 302"
    );
    // A read-only store has nothing to warm.
    let read_only = open_with(
        &db,
        StoreOptions {
            read_only: true,
            ..StoreOptions::default()
        },
    );
    read_only.warm().unwrap();
}

/// A `COPY` that PostgreSQL refuses as it begins (here a role that may only read) fails
/// its write, and the statements after it, on whatever connection, get their own answers:
/// the driver leaves a stray answer on such a connection, which is therefore closed, not
/// given back to the pool (the next read failed with "unexpected message from server").
#[test]
fn a_copy_refused_as_it_begins_leaves_no_stray_answer_behind() {
    let Some(db) = pg::db() else { return };
    let owner = open(&db);
    let root = fact("T.Root", 1, &[]);
    owner.insert(&root).unwrap();
    let role = format!("reader_{}", db.name);
    db.psql(&format!(
        "CREATE ROLE {role} LOGIN; GRANT USAGE ON SCHEMA public TO {role};
         GRANT SELECT ON ALL TABLES IN SCHEMA public TO {role}"
    ));
    let url = db
        .url
        .replacen("postgres://postgres@", &format!("postgres://{role}@"), 1);
    assert_ne!(url, db.url);
    let reader = Store::open_with(&url, StoreOptions::default()).unwrap();
    let err = reader.warm().unwrap_err();
    assert!(err.to_string().contains("permission denied"), "{err}");
    assert_eq!(reader.max_seq().unwrap(), 1);
    assert_eq!(reader.max_seq().unwrap(), 1);
    // A batch long enough for the `COPY`s, refused the same way.
    let many: Vec<_> = (0..300)
        .map(|i| fact("T.Child", 10 + i, &[root.hash()]))
        .collect();
    let err = reader.insert_batch(many).unwrap_err();
    assert!(err.to_string().contains("permission denied"), "{err}");
    for _ in 0..3 {
        assert_eq!(reader.max_seq().unwrap(), 1);
        assert!(reader.get(&root.hash()).unwrap().is_some());
    }
}

/// A `COPY` that waits past the busy timeout for a lock on the fact table fails as busy,
/// and so does what its transaction tries after it: a caller retries it, as it retries
/// any busy write, on a connection of its own.
#[test]
fn a_copy_that_waits_out_the_busy_timeout_stays_busy_for_its_transaction() {
    let Some(db) = pg::db() else { return };
    let store = open_with(
        &db,
        StoreOptions {
            busy_timeout: Duration::from_millis(200),
            ..StoreOptions::default()
        },
    );
    let root = fact("T.Root", 1, &[]);
    store.insert(&root).unwrap();
    let mut holder = postgres::Client::connect(&db.url, postgres::NoTls).unwrap();
    let mut lock = holder.transaction().unwrap();
    lock.batch_execute("LOCK TABLE fact IN ACCESS EXCLUSIVE MODE")
        .unwrap();
    let many: Vec<_> = (0..300)
        .map(|i| fact("T.Child", 10 + i, &[root.hash()]))
        .collect();
    let after = store.write(|w| {
        let err = w.insert_batch(many.clone()).unwrap_err();
        assert!(err.is_busy(), "{err}");
        w.savepoint(|_| Ok(()))
    });
    let err = after.unwrap_err();
    assert!(err.is_busy(), "{err}");
    lock.rollback().unwrap();
    // Retried once the lock is gone, it goes through.
    assert_eq!(store.insert_batch(many).unwrap().inserted, 300);
    assert_eq!(store.max_seq().unwrap(), 301);
}

#[test]
fn a_type_id_seen_only_by_a_rolled_back_writer_is_not_remembered() {
    let Some(db) = pg::db() else { return };
    let (a, b) = (open(&db), open(&db));
    let first = fact("T.New", 1, &[]);
    // A writes a fact of a new type and looks its id up, then rolls back: the id it saw
    // was never committed.
    let seen: precedent::Result<()> = a.write(|w| {
        w.insert(&first)?;
        assert!(w.sql().name_id(false, "T.New")?.is_some());
        Err(Error::InvalidFact {
            reason: "roll back".into(),
        })
    });
    assert!(seen.is_err());
    // B makes the type again (a new id: identities are not given back), and A's reads,
    // which remember ids they find, must find B's.
    let second = fact("T.New", 2, &[]);
    b.insert(&second).unwrap();
    let found = a
        .query_text("match t: T.New select hash(t)", &Default::default())
        .unwrap();
    assert_eq!(
        found.len(),
        1,
        "A's query used the id of the rolled-back type"
    );
    // Found by a read, the id is remembered; the next query answers the same.
    let again = a
        .query_text("match t: T.New select hash(t)", &Default::default())
        .unwrap();
    assert_eq!(again.len(), 1);
}

#[test]
fn verify_rehashes_every_row() {
    let Some(db) = pg::db() else { return };
    let store = open(&db);
    store.insert_batch(chain(20)).unwrap();
    let report = store.verify(|_| {}).unwrap();
    assert!(report.is_clean(), "{:?}", report.problems);
    assert_eq!(report.released, 20);
    // One flipped byte in one fact's bytes.
    db.psql(
        "UPDATE fact SET bytes = overlay(bytes placing '\\x00'::bytea from 3 for 1) WHERE seq = 7",
    );
    let report = store.verify(|_| {}).unwrap();
    assert_eq!(report.problems.len(), 1, "{:?}", report.problems);
    let bad = store.read(|r| r.fact_at(7));
    assert!(matches!(bad, Err(Error::Corrupt { .. })), "{bad:?}");
}

/// Since schema version 7 a fact's first edge is in its own row, and the successor hash
/// the view `edge` gives for it is the row's own `hash`: only an edge of `edge_more` (a
/// fact's second edge and on) carries a hash of its own, which can be wrong.
#[test]
fn verify_checks_the_successor_hash_each_edge_carries() {
    let Some(db) = pg::db() else { return };
    let store = open(&db);
    let links = chain(5);
    // A sixth fact naming the third and the fourth: one edge in its row, one in `edge_more`.
    let both = fact("Both", 0, &[links[2].hash(), links[3].hash()]);
    let mut facts = links.clone();
    facts.push(both.clone());
    store.insert_batch(facts).unwrap();
    assert!(store.verify(|_| {}).unwrap().is_clean());
    let carried = "SELECT count(*) FROM edge e JOIN fact f ON f.seq = e.successor
                   WHERE e.predecessor IS NOT NULL AND e.successor_hash = f.hash";
    assert_eq!(
        db.psql(carried),
        "6",
        "every edge carries its successor's hash"
    );
    assert_eq!(
        db.psql("SELECT count(*) || ' ' || min(successor) FROM edge_more"),
        "1 6"
    );
    // The sixth fact's edge in `edge_more` says it leads to the second.
    db.psql(
        "UPDATE edge_more SET successor_hash = (SELECT hash FROM fact WHERE seq = 2)
         WHERE successor = 6",
    );
    let report = store.verify(|_| {}).unwrap();
    assert_eq!(report.problems.len(), 1, "{:?}", report.problems);
    let text = report.problems[0].to_string();
    assert!(
        text.contains(&both.hash().to_string())
            && text.contains(&links[1].hash().to_string())
            && text.contains("carries successor hash"),
        "{text}"
    );
}

/// The hashes a query of `select hash(..)` answers, sorted.
fn query_hashes(store: &Store, q: &Query, givens: &Givens) -> Vec<FactHash> {
    let mut out: Vec<FactHash> = store
        .query(q, givens)
        .unwrap()
        .into_iter()
        .map(|r| match r.value {
            Projected::Hash(h) => h,
            other => panic!("not a hash: {other:?}"),
        })
        .collect();
    out.sort();
    out
}

/// The edges of a PostgreSQL database as `(predecessor, role_id, successor_type,
/// successor, predecessor_type)`, sorted, one a line: through the view of schema version 7
/// (without its rows of NULLs for facts with no predecessor) or the table of older ones.
fn edge_rows(db: &PgDb) -> String {
    db.psql(
        "SELECT predecessor || ',' || role_id || ',' || successor_type || ',' || successor
                || ',' || predecessor_type
         FROM edge WHERE predecessor IS NOT NULL
         ORDER BY successor, role_id, predecessor",
    )
}

#[test]
fn a_version_4_database_gains_the_successor_hash_of_its_edges_and_loses_the_type_key() {
    let Some(db) = pg::db() else { return };
    let links = chain(6);
    // Besides the chain (one edge a fact): a fact of two roles, and one naming three facts
    // in one role, whose edges other than the first the migration to version 7 puts in
    // `edge_more`.
    let pair = precedent::Fact::builder("Pair")
        .field("n", 0)
        .predecessor("left", links[1].hash())
        .predecessor("right", links[4].hash())
        .build()
        .unwrap();
    let many = fact(
        "Many",
        0,
        &[links[0].hash(), links[2].hash(), links[5].hash()],
    );
    let mut facts = links.clone();
    facts.extend([pair.clone(), many.clone()]);
    open(&db).insert_batch(facts).unwrap();
    // The tables as version 4 had them: `edge` a table (version 7 made it a view over the
    // fact rows' first edges and `edge_more`), with no successor hash in its rows, and the
    // fact table's foreign key to its type (dropped by version 6).
    db.psql(
        "CREATE TABLE edge_v4 (
             predecessor      BIGINT NOT NULL,
             role_id          BIGINT NOT NULL,
             successor_type   BIGINT NOT NULL,
             successor        BIGINT NOT NULL,
             predecessor_type BIGINT NOT NULL,
             CONSTRAINT edge_pkey PRIMARY KEY (predecessor, role_id, successor_type, successor)
         );
         INSERT INTO edge_v4
             SELECT predecessor, role_id, successor_type, successor, predecessor_type
             FROM edge WHERE predecessor IS NOT NULL;
         DROP VIEW edge;
         DROP TABLE edge_more;
         DROP FUNCTION IF EXISTS pq_edge_more_partitions(BIGINT[]);
         DROP INDEX fact_by_first;
         ALTER TABLE fact DROP COLUMN p1, DROP COLUMN p1_role, DROP COLUMN p1_type;
         ALTER TABLE edge_v4 RENAME TO edge;
         CREATE INDEX edge_by_successor ON edge (successor, role_id, predecessor_type, predecessor);
         ALTER TABLE fact ADD FOREIGN KEY (type_id) REFERENCES fact_type (id);
         UPDATE schema_version SET version = 4",
    );
    assert_eq!(
        db.psql("SELECT count(*) FROM pg_tables WHERE tablename = 'edge'"),
        "1"
    );
    let before = edge_rows(&db);
    assert_eq!(before.lines().count(), 5 + 2 + 3, "{before}");
    let foreign_keys =
        "SELECT count(*) FROM pg_constraint WHERE conrelid = 'fact'::regclass AND contype = 'f'";
    assert_eq!(db.psql(foreign_keys), "1");
    let store = open(&db);
    assert_eq!(
        db.psql("SELECT version FROM schema_version"),
        PG_SCHEMA_VERSION.to_string()
    );
    assert_eq!(db.psql(foreign_keys), "0");
    assert_eq!(
        db.psql(
            "SELECT count(*) FROM edge e JOIN fact f ON f.seq = e.successor
             WHERE e.predecessor IS NOT NULL AND e.successor_hash = f.hash"
        ),
        "10"
    );
    // Version 7: the same edges, now a view; each fact's first edge in its row and only
    // the others in `edge_more`, in a partition of their role.
    assert_eq!(edge_rows(&db), before);
    assert_eq!(
        db.psql("SELECT count(*) FROM pg_views WHERE viewname = 'edge'"),
        "1"
    );
    assert_eq!(
        db.psql("SELECT count(p1) || ' ' || count(*) FROM fact"),
        "7 8",
        "every fact with a predecessor has its first edge in its row"
    );
    assert_eq!(db.psql("SELECT count(*) FROM edge_more"), "3");
    let pair_seq: i64 = store.seq_of(&pair.hash()).unwrap().unwrap();
    let many_seq: i64 = store.seq_of(&many.hash()).unwrap().unwrap();
    assert_eq!(
        db.psql("SELECT string_agg(successor::text, ',' ORDER BY successor) FROM edge_more"),
        format!("{pair_seq},{many_seq},{many_seq}"),
    );
    assert_eq!(
        db.psql(
            "SELECT count(*) FROM edge_more m JOIN fact f ON f.seq = m.successor
             WHERE f.p1 IS NULL OR (f.p1 = m.predecessor AND f.p1_role = m.role_id)"
        ),
        "0",
        "edge_more holds only edges other than their fact's first"
    );
    assert_eq!(
        db.psql("SELECT count(*) FROM pg_inherits WHERE inhparent = 'edge_more'::regclass"),
        db.psql("SELECT count(DISTINCT role_id) FROM edge_more"),
        "a partition only for a role with edges in edge_more"
    );
    assert!(store.verify(|_| {}).unwrap().is_clean());
    // And a query answered from those edges gives the facts' hashes.
    let q = Query::parse("given a: Link match b: Link where b->p = a select hash(b)").unwrap();
    let givens = Givens::from([("a".to_string(), links[2].hash())]);
    let (sql, _) = store.compiled_sql(&q, &givens).unwrap();
    assert!(sql.contains("successor_hash"), "{sql}");
    let got = store.query(&q, &givens).unwrap();
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].value, Projected::Hash(links[3].hash()));
    // Through a migrated second edge too, toward successors and toward predecessors.
    let q = Query::parse("given a: Link match m: Many where m->p = a select hash(m)").unwrap();
    let givens = Givens::from([("a".to_string(), links[5].hash())]);
    let got = store.query(&q, &givens).unwrap();
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].value, Projected::Hash(many.hash()));
    let q = Query::parse("given m: Many match a: Link where m->p = a select hash(a)").unwrap();
    let givens = Givens::from([("m".to_string(), many.hash())]);
    let mut want = vec![links[0].hash(), links[2].hash(), links[5].hash()];
    want.sort();
    assert_eq!(query_hashes(&store, &q, &givens), want);
    // The migrated store writes the new layout: a second pair in the same roles.
    let pair2 = precedent::Fact::builder("Pair")
        .field("n", 1)
        .predecessor("left", links[2].hash())
        .predecessor("right", links[3].hash())
        .build()
        .unwrap();
    store.insert(&pair2).unwrap();
    assert_eq!(db.psql("SELECT count(*) FROM edge_more"), "4");
    assert!(store.verify(|_| {}).unwrap().is_clean());
}

/// Schema version 7: a fact of two roles and a fact naming two facts in one role (a list)
/// keep one edge each in their own row and the other in `edge_more`, in a partition of its
/// role; a fact of one predecessor has its edge in its row alone, and its role no
/// partition. The view `edge` gives every edge once, and queries walk both places in both
/// directions.
#[test]
fn several_predecessors_keep_the_first_edge_in_the_fact_row_and_the_others_in_edge_more() {
    let Some(db) = pg::db() else { return };
    let store = open(&db);
    let named = |t: &str, n: i64| precedent::Fact::builder(t).field("n", n).build().unwrap();
    let (left, right) = (named("Pg.Left", 1), named("Pg.Right", 2));
    let (item1, item2) = (named("Pg.Item", 1), named("Pg.Item", 2));
    // Two predecessors in two roles.
    let pair = precedent::Fact::builder("Pg.Pair")
        .field("n", 0)
        .predecessor("left", left.hash())
        .predecessor("right", right.hash())
        .build()
        .unwrap();
    // Two predecessors in one role.
    let list = precedent::Fact::builder("Pg.List")
        .field("n", 0)
        .predecessor("items", item1.hash())
        .predecessor("items", item2.hash())
        .build()
        .unwrap();
    // One predecessor: the common case.
    let note = precedent::Fact::builder("Pg.Note")
        .field("n", 0)
        .predecessor("about", left.hash())
        .build()
        .unwrap();
    store
        .insert_batch(vec![
            list.clone(),
            pair.clone(),
            note.clone(),
            left.clone(),
            right.clone(),
            item1.clone(),
            item2.clone(),
        ])
        .unwrap();
    assert_eq!(store.stats().unwrap().released, 7);

    // Edges as "predecessor role successor" (hashes), sorted, one a line.
    let line = |p: &precedent::Fact, role: &str, s: &precedent::Fact| {
        format!("{} {role} {}", p.hash(), s.hash())
    };
    let edges_of = |from: &str, pred: &str, role: &str| {
        db.psql(&format!(
            "SELECT encode(p.hash, 'hex') || ' ' || r.name || ' ' || encode(s.hash, 'hex')
             FROM {from} JOIN fact p ON p.seq = {pred} JOIN role r ON r.id = {role}
             ORDER BY 1"
        ))
        .lines()
        .map(str::to_string)
        .collect::<Vec<_>>()
    };
    let mut want = vec![
        line(&left, "left", &pair),
        line(&right, "right", &pair),
        line(&item1, "items", &list),
        line(&item2, "items", &list),
        line(&left, "about", &note),
    ];
    want.sort();
    // The view: exactly these edges, each once, and one row of NULLs for each fact of no
    // predecessor, which readers skip.
    assert_eq!(
        db.psql("SELECT count(*) FROM edge WHERE predecessor IS NOT NULL"),
        "5"
    );
    assert_eq!(
        db.psql("SELECT count(*) FROM edge WHERE predecessor IS NULL"),
        "4"
    );
    assert_eq!(
        edges_of(
            "edge e JOIN fact s ON s.seq = e.successor",
            "e.predecessor",
            "e.role_id"
        ),
        want
    );
    // The fact rows: one edge each of the three facts with predecessors.
    let first = edges_of("fact s", "s.p1", "s.p1_role");
    assert_eq!(first.len(), 3, "{first:?}");
    assert!(first.contains(&line(&left, "about", &note)), "{first:?}");
    assert_eq!(
        db.psql(
            "SELECT count(*) FROM fact WHERE p1 IS NULL AND p1_role IS NULL AND p1_type IS NULL"
        ),
        "4"
    );
    assert_eq!(
        db.psql(
            "SELECT count(*) FROM fact s JOIN fact p ON p.seq = s.p1 WHERE s.p1_type = p.type_id"
        ),
        "3",
        "a first edge's type is its predecessor's"
    );
    // `edge_more`: exactly the others, one of the pair and one of the list.
    let more = edges_of(
        "edge_more e JOIN fact s ON s.seq = e.successor",
        "e.predecessor",
        "e.role_id",
    );
    assert_eq!(more.len(), 2, "{more:?}");
    assert!(
        more.iter().all(|e| !first.contains(e)),
        "first {first:?}, more {more:?}"
    );
    let mut both: Vec<String> = first.iter().chain(&more).cloned().collect();
    both.sort();
    assert_eq!(both, want);
    assert!(
        more.iter().any(|e| e.ends_with(&pair.hash().to_string()))
            && more.iter().any(|e| e.ends_with(&list.hash().to_string())),
        "{more:?}"
    );
    assert_eq!(
        db.psql(
            "SELECT count(*) FROM edge_more e JOIN fact s ON s.seq = e.successor
             JOIN fact p ON p.seq = e.predecessor
             WHERE e.successor_type = s.type_id AND e.predecessor_type = p.type_id
               AND e.successor_hash = s.hash"
        ),
        "2"
    );
    // A partition of `edge_more` only for the roles of its rows: "items" and one of
    // "left" and "right"; none for "about".
    let partitions = db.psql(
        "SELECT string_agg(c.relname, ',' ORDER BY c.relname) FROM pg_inherits i
         JOIN pg_class c ON c.oid = i.inhrelid WHERE i.inhparent = 'edge_more'::regclass",
    );
    let roles_in_more =
        db.psql("SELECT string_agg(DISTINCT 'edge_more_' || role_id, ',') FROM edge_more");
    let mut partitions: Vec<&str> = partitions.split(',').collect();
    let mut roles_in_more: Vec<&str> = roles_in_more.split(',').collect();
    partitions.sort();
    roles_in_more.sort();
    assert_eq!(partitions, roles_in_more);
    assert_eq!(partitions.len(), 2, "{partitions:?}");
    let about = db.psql("SELECT id FROM role WHERE name = 'about'");
    assert!(!partitions.contains(&format!("edge_more_{about}").as_str()));

    // Queries through each role, toward successors and toward predecessors.
    let ask = |text: &str, given: &str, of: &precedent::Fact| {
        let q = Query::parse(text).unwrap_or_else(|e| panic!("{text}\n{e}"));
        query_hashes(&store, &q, &Givens::from([(given.to_string(), of.hash())]))
    };
    let sorted = |mut v: Vec<FactHash>| {
        v.sort();
        v
    };
    for (role, pred, ty) in [("left", &left, "Pg.Left"), ("right", &right, "Pg.Right")] {
        assert_eq!(
            ask(
                &format!("given x: {ty} match p: Pg.Pair where p->{role} = x select hash(p)"),
                "x",
                pred
            ),
            vec![pair.hash()],
            "{role} toward successors"
        );
        assert_eq!(
            ask(
                &format!("given p: Pg.Pair match x: {ty} where p->{role} = x select hash(x)"),
                "p",
                &pair
            ),
            vec![pred.hash()],
            "{role} toward predecessors"
        );
    }
    for item in [&item1, &item2] {
        assert_eq!(
            ask(
                "given i: Pg.Item match l: Pg.List where l->items = i select hash(l)",
                "i",
                item
            ),
            vec![list.hash()]
        );
    }
    assert_eq!(
        ask(
            "given l: Pg.List match i: Pg.Item where l->items = i select hash(i)",
            "l",
            &list
        ),
        sorted(vec![item1.hash(), item2.hash()])
    );
    assert_eq!(
        ask(
            "given x: Pg.Left match n: Pg.Note where n->about = x select hash(n)",
            "x",
            &left
        ),
        vec![note.hash()]
    );
    // A query through both of the pair's roles at once.
    assert_eq!(
        ask(
            "given x: Pg.Left match p: Pg.Pair where p->left = x
             match y: Pg.Right where p->right = y select hash(y)",
            "x",
            &left
        ),
        vec![right.hash()]
    );
    // The store's own reads see both places too.
    let hashes = |v: Vec<precedent::Fact>| sorted(v.iter().map(|f| f.hash()).collect());
    assert_eq!(
        hashes(
            store
                .successors(&right.hash(), Some("right"), None)
                .unwrap()
        ),
        vec![pair.hash()]
    );
    assert_eq!(
        hashes(store.successors(&left.hash(), None, None).unwrap()),
        sorted(vec![pair.hash(), note.hash()])
    );
    assert_eq!(store.predecessors(&pair.hash()).unwrap().len(), 2);
    assert_eq!(store.predecessors(&list.hash()).unwrap().len(), 2);
    assert_eq!(
        sorted(store.ancestors(&list.hash()).unwrap()),
        sorted(vec![item1.hash(), item2.hash()])
    );
    assert_eq!(store.stats().unwrap().edges, 5);
    let report = store.verify(|_| {}).unwrap();
    assert!(report.is_clean(), "{:?}", report.problems);
}

#[test]
fn a_read_only_store_refuses_writes() {
    let Some(db) = pg::db() else { return };
    let options = StoreOptions {
        read_only: true,
        ..StoreOptions::default()
    };
    // An empty database: nothing to read, and nothing is created.
    let err = Store::open_with(&db.url, options.clone())
        .map(|_| ())
        .unwrap_err();
    assert!(matches!(err, Error::Open { .. }), "{err:?}");
    assert!(err.to_string().contains("precedent init"), "{err}");
    assert_eq!(
        db.psql("SELECT count(*) FROM pg_tables WHERE schemaname = 'public'"),
        "0"
    );
    drop(open(&db));
    let store = open_with(&db, options);
    assert_eq!(store.stats().unwrap().released, 0);
    assert!(matches!(
        store.insert(&fact("A", 1, &[])),
        Err(Error::ReadOnly { .. })
    ));
}

#[test]
fn migrations_stamp_the_version_and_refuse_a_newer_database() {
    let Some(db) = pg::db() else { return };
    // Two processes' worth of opens at once migrate once.
    let opened: Vec<_> = (0..4)
        .map(|_| {
            let url = db.url.clone();
            std::thread::spawn(move || Store::open_with(&url, StoreOptions::default()).map(drop))
        })
        .collect();
    for t in opened {
        t.join().unwrap().unwrap();
    }
    assert_eq!(
        db.psql("SELECT version FROM schema_version"),
        PG_SCHEMA_VERSION.to_string()
    );
    assert_eq!(
        db.psql("SELECT count(*) FROM store_meta WHERE length(value) = 16"),
        "1"
    );
    db.psql("UPDATE schema_version SET version = 99");
    match Store::open_with(&db.url, StoreOptions::default()) {
        Err(e @ Error::SchemaTooNew { found: 99, .. }) => {
            assert!(e.to_string().contains("upgrade precedent"), "{e}")
        }
        other => panic!("{:?}", other.map(|_| ())),
    }
}

/// Two processes opening an empty database at once migrate it once, whatever the
/// database's default isolation: the one that waited for the other's migration sees it.
#[test]
fn two_opens_at_once_migrate_once_under_repeatable_read() {
    let Some(db) = pg::db() else { return };
    db.psql(&format!(
        "ALTER DATABASE {} SET default_transaction_isolation = 'repeatable read'",
        db.name
    ));
    // Both opens wait behind a migration lock held here, then go at once.
    let mut holder = postgres::Client::connect(&db.url, postgres::NoTls).unwrap();
    holder
        .execute("SELECT pg_advisory_lock($1)", &[&0x7072_6563_6d69_6772_i64])
        .unwrap();
    let opens: Vec<_> = (0..2)
        .map(|_| {
            let url = db.url.clone();
            std::thread::spawn(move || Store::open_with(&url, StoreOptions::default()).map(|_| ()))
        })
        .collect();
    let until = Instant::now() + Duration::from_secs(30);
    while db.psql("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted")
        != "2"
    {
        assert!(
            Instant::now() < until,
            "the opens never waited for the lock"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    holder
        .execute(
            "SELECT pg_advisory_unlock($1)",
            &[&0x7072_6563_6d69_6772_i64],
        )
        .unwrap();
    for open in opens {
        open.join().unwrap().unwrap();
    }
    assert_eq!(
        db.psql("SELECT max(version) FROM schema_version"),
        PG_SCHEMA_VERSION.to_string()
    );
}

/// An open that finds another process migrating waits for that migration up to 15
/// minutes, not only the busy timeout, and then opens the migrated database (it failed
/// as busy after the busy timeout).
#[test]
fn an_open_waits_for_a_migration_longer_than_the_busy_timeout() {
    let Some(db) = pg::db() else { return };
    let mut holder = postgres::Client::connect(&db.url, postgres::NoTls).unwrap();
    holder
        .execute("SELECT pg_advisory_lock($1)", &[&0x7072_6563_6d69_6772_i64])
        .unwrap();
    let url = db.url.clone();
    let open = std::thread::spawn(move || {
        let options = StoreOptions {
            busy_timeout: Duration::from_millis(200),
            ..StoreOptions::default()
        };
        Store::open_with(&url, options)
    });
    let until = Instant::now() + Duration::from_secs(30);
    while db.psql("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted")
        != "1"
    {
        assert!(Instant::now() < until, "the open never waited for the lock");
        std::thread::sleep(Duration::from_millis(20));
    }
    // Five busy timeouts.
    std::thread::sleep(Duration::from_millis(1000));
    holder
        .execute(
            "SELECT pg_advisory_unlock($1)",
            &[&0x7072_6563_6d69_6772_i64],
        )
        .unwrap();
    let store = open.join().unwrap().unwrap();
    assert_eq!(
        db.psql("SELECT max(version) FROM schema_version"),
        PG_SCHEMA_VERSION.to_string()
    );
    store.insert(&fact("T.After", 1, &[])).unwrap();
    // The store's own waits keep the busy timeout: a write behind another's write lock
    // fails as busy.
    holder
        .execute("SELECT pg_advisory_lock($1)", &[&0x7072_6563_6465_6e74_i64])
        .unwrap();
    let err = store.insert(&fact("T.After", 2, &[])).unwrap_err();
    assert!(err.is_busy(), "{err}");
}

#[test]
fn a_server_that_is_down_says_so() {
    if pg::cluster().is_none() {
        return;
    }
    let err = Store::open_with(pg::down_url(), StoreOptions::default())
        .map(|_| ())
        .unwrap_err();
    let text = err.to_string();
    assert!(matches!(err, Error::Open { .. }), "{err:?}");
    assert!(text.contains("server down"), "{text}");
    assert!(text.contains("connection refused"), "{text}");
    assert!(!text.contains('\n'), "{text}");
}

/// A URL the driver cannot read is refused before connecting, saying which of its
/// options is wrong (no server needed).
#[test]
fn a_bad_url_option_is_named() {
    for (query, says) in [
        ("bogus=1", "unknown option `bogus`"),
        (
            "connect_timeout=soon",
            "invalid value for option `connect_timeout`",
        ),
    ] {
        let url = format!("postgres://someone@127.0.0.1:1/db?{query}");
        let err = Store::open_with(&url, StoreOptions::default())
            .map(|_| ())
            .unwrap_err();
        let text = err.to_string();
        assert!(matches!(err, Error::Open { .. }), "{err:?}");
        assert!(text.contains("not a postgresql url"), "{text}");
        assert!(text.contains(says), "{text}");
        assert!(!text.contains('\n'), "{text}");
    }
}

#[test]
fn a_wrong_password_says_so_and_is_not_shown() {
    let Some(db) = pg::db() else { return };
    let err = Store::open_with(db.url_with_password("wrong"), StoreOptions::default())
        .map(|_| ())
        .unwrap_err();
    let text = err.to_string();
    assert!(text.contains("password refused"), "{text}");
    assert!(!text.contains("wrong"), "{text}");
    // The right one opens.
    let store = Store::open_with(db.url_with_password(pg::PASSWORD), StoreOptions::default());
    assert!(store.is_ok(), "{:?}", store.err());
}

#[test]
fn a_url_without_the_scheme_of_postgres_is_a_file() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path().join("postgres.db")).unwrap();
    assert_eq!(store.dialect(), Dialect::Sqlite);
}

/// The held-cascade race: one writer inserts a child while another inserts its parent,
/// through two stores as two processes would. The child must end released.
#[test]
fn a_child_and_its_parent_written_at_once_end_released() {
    let Some(db) = pg::db() else { return };
    let (s1, s2) = (Arc::new(open(&db)), Arc::new(open(&db)));
    for round in 0..40 {
        let parent = fact("Parent", round, &[]);
        let child = fact("Child", round, &[parent.hash()]);
        let gate = Arc::new(Barrier::new(2));
        let t = {
            let (s, gate, child) = (s1.clone(), gate.clone(), child.clone());
            std::thread::spawn(move || {
                gate.wait();
                s.insert(&child).unwrap();
            })
        };
        gate.wait();
        s2.insert(&parent).unwrap();
        t.join().unwrap();
        assert!(
            s2.seq_of(&child.hash()).unwrap().is_some(),
            "round {round}: child still held"
        );
    }
    assert_eq!(s1.held_count().unwrap(), 0);
    assert!(s1.verify(|_| {}).unwrap().is_clean());
}

/// What the child process of [`sequence_numbers_follow_commit_order`] runs: inserts
/// facts in many small transactions on the database of `PRECEDENT_PG_CHILD`.
#[test]
fn child_writer_process() {
    let Ok(url) = std::env::var("PRECEDENT_PG_CHILD") else {
        return;
    };
    let store = Store::open_with(&url, StoreOptions::default()).unwrap();
    for i in 0..150 {
        let f = fact("Child", i, &[]);
        store
            .insert_batch(vec![f, fact("ChildToo", i, &[])])
            .unwrap();
    }
}

/// Writers in three threads and a second process insert at once while a reader polls
/// for facts after the last it saw: it must never see a number appear below one it has
/// seen (the numbers it sees continue where it left off, with no gap), and in the end it
/// has seen every fact once.
#[test]
fn sequence_numbers_follow_commit_order() {
    let Some(db) = pg::db() else { return };
    drop(open(&db));
    let child = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "child_writer_process",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("PRECEDENT_PG_CHILD", &db.url)
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let done = Arc::new(AtomicBool::new(false));
    let reader = {
        let (store, done) = (open(&db), done.clone());
        std::thread::spawn(move || {
            let mut last = 0i64;
            let mut seen = HashSet::new();
            let mut polls = 0u64;
            loop {
                let finished = done.load(Ordering::SeqCst);
                store
                    .for_each_released(last, |seq, hash, _| {
                        assert_eq!(
                            seq,
                            last + 1,
                            "saw {seq} after {last}: a number was skipped"
                        );
                        assert!(seen.insert(hash));
                        last = seq;
                        Ok(())
                    })
                    .unwrap();
                polls += 1;
                if finished {
                    return (last, seen.len(), polls);
                }
            }
        })
    };
    let writers: Vec<_> = (0..3)
        .map(|w| {
            let store = open(&db);
            std::thread::spawn(move || {
                for i in 0..100 {
                    let root = fact(&format!("W{w}"), i, &[]);
                    let kid = fact(&format!("W{w}Kid"), i, &[root.hash()]);
                    if i % 2 == 0 {
                        store.insert(&root).unwrap();
                        store.insert(&kid).unwrap();
                    } else {
                        // Child first, in a transaction of its own: held, then released
                        // by its parent's.
                        assert!(store.insert(&kid).unwrap().is_held());
                        assert_eq!(store.insert(&root).unwrap().released(), 2);
                    }
                }
            })
        })
        .collect();
    let start = Instant::now();
    for w in writers {
        w.join().unwrap();
    }
    let status = {
        let mut child = child;
        child.wait().unwrap()
    };
    assert!(status.success(), "child writer failed: {status}");
    let elapsed = start.elapsed();
    done.store(true, Ordering::SeqCst);
    let (last, seen, polls) = reader.join().unwrap();
    let total = 3 * 200 + 300;
    assert_eq!((last, seen), (total as i64, total));
    eprintln!(
        "{total} facts by 3 threads and a process in {elapsed:?}; the reader polled {polls} times"
    );
    let store = open(&db);
    assert_eq!(store.held_count().unwrap(), 0);
    assert!(store.verify(|_| {}).unwrap().is_clean());
}

/// A store on `db` that waits 200 ms for the write lock.
fn impatient(db: &PgDb) -> Store {
    open_with(
        db,
        StoreOptions {
            busy_timeout: Duration::from_millis(200),
            ..StoreOptions::default()
        },
    )
}

/// A writer waiting for another's lock past the busy timeout fails as busy, having
/// written nothing; the same insert succeeds once the lock is free.
#[test]
fn a_writer_held_off_past_the_busy_timeout_is_busy() {
    let Some(db) = pg::db() else { return };
    let holder = open(&db);
    let waiter = impatient(&db);
    let late = fact("Late", 1, &[]);
    holder
        .write(|w| {
            w.insert(&fact("First", 1, &[]))?;
            let err = waiter.insert(&late).unwrap_err();
            assert!(err.is_busy(), "{err}");
            assert!(err.to_string().contains("busy timeout"), "{err}");
            Ok(())
        })
        .unwrap();
    assert_eq!(waiter.insert(&late).unwrap().released(), 1);
    assert_eq!(waiter.seq_of(&late.hash()).unwrap(), Some(2));
}

/// A write transaction reads the highest seq under the write lock, taking it: a push
/// tells the facts it releases from those there before by that number, which another
/// writer committing in between would blur. Other writers wait for it meanwhile.
#[test]
fn the_highest_seq_read_in_a_write_is_read_under_the_write_lock() {
    let Some(db) = pg::db() else { return };
    let holder = open(&db);
    let waiter = impatient(&db);
    holder.insert(&fact("Before", 1, &[])).unwrap();
    let late = fact("Late", 1, &[]);
    holder
        .write(|w| {
            assert_eq!(w.max_seq()?, 1);
            let err = waiter.insert(&late).unwrap_err();
            assert!(err.is_busy(), "{err}");
            assert_eq!(w.max_seq()?, 1);
            Ok(())
        })
        .unwrap();
    assert_eq!(waiter.insert(&late).unwrap().released(), 1);
    assert_eq!(waiter.seq_of(&late.hash()).unwrap(), Some(2));
}

/// The counters' statement and the `COMMIT` go to the server in one round trip: when the
/// statement fails, the `COMMIT` does not run, the write fails and commits nothing, and
/// the connection goes back to the pool with its transaction rolled back (left open and
/// aborted, the next write on it would fail).
#[test]
fn a_failed_statement_before_the_commit_commits_nothing_and_the_next_write_runs() {
    let Some(db) = pg::db() else { return };
    let store = open(&db);
    let links = chain(3);
    assert_eq!(store.insert(&links[0]).unwrap().released(), 1);
    db.psql(
        "CREATE FUNCTION refuse() RETURNS trigger LANGUAGE plpgsql
           AS $$ BEGIN RAISE EXCEPTION 'counter refused by the test'; END $$;
         CREATE TRIGGER refuse BEFORE UPDATE ON counter
           FOR EACH ROW EXECUTE FUNCTION refuse()",
    );
    let err = store.insert(&links[1]).unwrap_err();
    assert!(
        err.to_string().contains("counter refused by the test"),
        "{err}"
    );
    db.psql("DROP TRIGGER refuse ON counter");
    assert_eq!(store.seq_of(&links[1].hash()).unwrap(), None);
    assert_eq!(store.insert(&links[1]).unwrap().released(), 1);
    assert_eq!(store.insert(&links[2]).unwrap().released(), 1);
    assert_eq!(store.seq_of(&links[2].hash()).unwrap(), Some(3));
    assert!(store.verify(|_| {}).unwrap().is_clean());
}

/// Connections cut by the server (as a restart would): the transaction that was open
/// fails saying so and commits nothing; the next one runs on a new connection.
#[test]
fn a_connection_dropped_mid_transaction_says_so_and_the_next_reconnects() {
    let Some(db) = pg::db() else { return };
    let store = open(&db);
    let (a, b) = (fact("A", 1, &[]), fact("B", 1, &[]));
    store.insert(&fact("Before", 1, &[])).unwrap();
    let kill = "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
                WHERE datname = current_database() AND pid <> pg_backend_pid()";
    let err = store
        .write(|w| {
            w.insert(&a)?;
            db.psql(kill);
            w.insert(&b)
        })
        .unwrap_err();
    let text = err.to_string();
    assert!(
        matches!(&err, Error::Backend(e) if e.kind == precedent::error::BackendErrorKind::Unavailable),
        "{err:?}"
    );
    assert!(
        text.contains("nothing of this transaction was committed"),
        "{text}"
    );
    assert!(!text.contains('\n'), "{text}");
    // Idle connections were cut too: the next transactions reconnect.
    db.psql(kill);
    assert_eq!(store.seq_of(&a.hash()).unwrap(), None);
    assert_eq!(store.insert(&a).unwrap().released(), 1);
    assert_eq!(store.insert(&b).unwrap().released(), 1);
    // A write whose `BEGIN` meets a cut connection begins again on a new one (a read
    // did it for the inserts above).
    db.psql(kill);
    let c = fact("C", 1, &[]);
    assert_eq!(store.insert(&c).unwrap().released(), 1);
    assert!(store.verify(|_| {}).unwrap().is_clean());
}

/// Not a check: how fast a batch is stored on PostgreSQL beside SQLite, on this machine
/// (`cargo test --test pg_store ingest -- --ignored --nocapture`).
#[test]
#[ignore]
fn ingest_rate() {
    let Some(db) = pg::db() else { return };
    let facts = chain(20_000);
    let dir = tempfile::tempdir().unwrap();
    let sqlite = Store::open(dir.path().join("s.db")).unwrap();
    let Some(bare) = pg::db() else { return };
    let runs = [
        ("postgres", open(&db)),
        (
            "postgres, no queue hook",
            open_with(&bare, StoreOptions::bare()),
        ),
        ("sqlite", sqlite),
    ];
    for (name, store) in runs {
        let start = Instant::now();
        for part in facts.chunks(1000) {
            store.insert_batch(part.to_vec()).unwrap();
        }
        let s = start.elapsed().as_secs_f64();
        eprintln!(
            "{name}: {} facts in {s:.2} s, {:.0}/s",
            facts.len(),
            facts.len() as f64 / s
        );
    }
}

/// A root and 400 leaves naming it, stored in one batch (seqs 1 to 401).
fn root_and_leaves(store: &Store) -> (precedent::Fact, Vec<precedent::Fact>) {
    let root = fact("Root", 0, &[]);
    let leaves: Vec<_> = (0..400).map(|i| fact("Leaf", i, &[root.hash()])).collect();
    let mut batch = vec![root.clone()];
    batch.extend(leaves.iter().cloned());
    assert_eq!(store.insert_batch(batch).unwrap().inserted, 401);
    (root, leaves)
}

/// The database of [`root_and_leaves`] as it was after the root alone (a restore of an
/// older backup), and `then`.
fn put_back_to_the_root(db: &PgDb, then: &str) {
    // A fact's first edge goes with its row (schema version 7); its others are in `edge_more`.
    db.psql(&format!(
        "DELETE FROM edge_more WHERE successor > 1; DELETE FROM fact WHERE seq > 1;
         UPDATE counter SET value = 1 WHERE name = 'seq'; {then}"
    ));
}

/// A store remembers the facts it saw released, with their seqs. A database put back to
/// an earlier state under it, as a restore of an older backup does, shows as a `seq`
/// counter below what it remembers: it forgets them, and the facts the restore lost are
/// written again, not taken for duplicates.
#[test]
fn a_database_put_back_under_a_store_loses_no_fact_pushed_again() {
    let Some(db) = pg::db() else { return };
    let store = open(&db);
    let (_, leaves) = root_and_leaves(&store);
    put_back_to_the_root(&db, "");
    let r = store.insert_batch(leaves.clone()).unwrap();
    assert_eq!((r.inserted, r.duplicates), (400, 0));
    assert!(
        leaves
            .iter()
            .all(|f| store.get(&f.hash()).unwrap().is_some())
    );
    assert!(store.verify(|_| {}).unwrap().is_clean());
}

/// A restore of an older backup under a running store takes with it the type ids made
/// since, and the type table's identity sequence hands them out again, to other names:
/// the store forgets the ids it cached when it sees the database put back, so a fact it
/// writes again is filed under its own type, not under the one that now has its old id.
#[test]
fn a_database_put_back_under_a_store_files_facts_under_their_own_types() {
    let Some(db) = pg::db() else { return };
    let store = open(&db);
    let (root, leaves) = root_and_leaves(&store);
    // Before the type Leaf existed, too.
    put_back_to_the_root(
        &db,
        "DELETE FROM fact_type WHERE name = 'Leaf';
         SELECT setval(pg_get_serial_sequence('fact_type', 'id'), 1);",
    );
    // Another process makes a new type, which gets Leaf's old id.
    open(&db).insert(&fact("Other", 0, &[root.hash()])).unwrap();
    store.insert_batch(leaves.clone()).unwrap();
    assert!(store.verify(|_| {}).unwrap().is_clean());
    let q = Query::parse("match l: Leaf select l").unwrap();
    assert_eq!(store.query(&q, &Givens::new()).unwrap().len(), 400);
}

/// A walk's step reads `edge_more` only for a role that has a partition there, which the
/// planner decides from the catalog (schema version 7): a statement prepared and planned
/// while the role had none, run again after a fact gave it one, finds the edge there
/// (making the partition invalidates the cached plans), and its plan now reads it.
#[test]
fn a_cached_query_finds_an_edge_of_a_role_that_gained_its_partition_since() {
    let Some(db) = pg::db() else { return };
    let store = open(&db);
    let named = |t: &str, n: i64| precedent::Fact::builder(t).field("n", n).build().unwrap();
    let (boxed, other) = (named("Pg.Box", 1), named("Pg.Other", 1));
    let item = |n: i64| {
        precedent::Fact::builder("Pg.Item")
            .field("n", n)
            .predecessor("box", boxed.hash())
            .build()
            .unwrap()
    };
    let mut facts = vec![boxed.clone(), other.clone()];
    facts.extend((0..3).map(item));
    store.insert_batch(facts).unwrap();
    let q =
        Query::parse("given b: Pg.Box match i: Pg.Item where i->box = b select hash(i)").unwrap();
    let g = Givens::from([("b".to_string(), boxed.hash())]);
    // More runs than PostgreSQL makes custom plans for (5): the generic plan is cached.
    for _ in 0..8 {
        assert_eq!(store.query(&q, &g).unwrap().len(), 3);
    }
    let plan = store.explain(&q, &g).unwrap().join("\n");
    assert!(
        !plan.contains("edge_more"),
        "no partition yet, none read:\n{plan}"
    );
    // Its edges in role order: `a_first` comes first, so `box` goes to `edge_more`.
    let late = precedent::Fact::builder("Pg.Item")
        .field("n", 9)
        .predecessor("a_first", other.hash())
        .predecessor("box", boxed.hash())
        .build()
        .unwrap();
    store.insert(&late).unwrap();
    let in_more = db.psql("SELECT count(*) FROM edge_more");
    assert_eq!(in_more.trim(), "1", "the second edge is in edge_more");
    let found: Vec<FactHash> = query_hashes(&store, &q, &g);
    assert_eq!(
        found.len(),
        4,
        "the cached query sees the new partition's edge"
    );
    assert!(found.contains(&late.hash()));
    let plan = store.explain(&q, &g).unwrap().join("\n");
    assert!(
        plan.contains("edge_more"),
        "the role's partition is read now:\n{plan}"
    );
}

/// A role's first second edge makes its `edge_more` partition while a read transaction
/// that read the `edge` view is still open: attaching a partition does not wait for
/// readers (creating one `PARTITION OF` would lock the table until the reader ends, and
/// the write would fail as busy, with every later reader queued behind it).
#[test]
fn making_a_partition_does_not_wait_for_an_open_reader() {
    let Some(db) = pg::db() else { return };
    let reader = open(&db);
    let writer = open_with(
        &db,
        StoreOptions {
            busy_timeout: Duration::from_secs(2),
            ..StoreOptions::default()
        },
    );
    let named = |t: &str, n: i64| precedent::Fact::builder(t).field("n", n).build().unwrap();
    let (a, b) = (named("Pg.A", 1), named("Pg.B", 1));
    writer.insert_batch(vec![a.clone(), b.clone()]).unwrap();
    let both = precedent::Fact::builder("Pg.Both")
        .predecessor("first", a.hash())
        .predecessor("second", b.hash())
        .build()
        .unwrap();
    let (read_tx, read_rx) = std::sync::mpsc::channel();
    let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
    let reader = &reader;
    std::thread::scope(|scope| {
        scope.spawn(move || {
            reader
                .read(|r| {
                    let n: i64 = r.query_one(
                        "SELECT count(*) FROM edge WHERE predecessor IS NOT NULL",
                        precedent::args![],
                        |row| row.get(0),
                    )?;
                    read_tx.send(n).unwrap();
                    // Open until the write is done, or long past its busy timeout.
                    let _ = done_rx.recv_timeout(Duration::from_secs(10));
                    Ok(())
                })
                .unwrap();
        });
        assert_eq!(read_rx.recv().unwrap(), 0);
        // A write that waited for the reader would fail as busy after 2 s.
        let written = writer.insert(&both);
        done_tx.send(()).unwrap();
        written.unwrap();
    });
    assert_eq!(db.psql("SELECT count(*) FROM edge_more").trim(), "1");
}

/// `verify` reports an edge kept both in its fact's row and in `edge_more` (a query
/// would answer its successor twice), and the schema refuses a first edge that is not
/// whole (its three columns are read together).
#[test]
fn verify_finds_a_first_edge_kept_twice_and_the_schema_refuses_half_a_first_edge() {
    let Some(db) = pg::db() else { return };
    let store = open(&db);
    let shop = precedent::Fact::builder("Pg.Shop")
        .field("n", 1)
        .build()
        .unwrap();
    let order = precedent::Fact::builder("Pg.Order")
        .predecessor("shop", shop.hash())
        .build()
        .unwrap();
    store.insert_batch(vec![shop, order]).unwrap();
    assert!(store.verify(|_| {}).unwrap().is_clean());
    db.psql(
        "SELECT pq_edge_more_partitions(ARRAY[p1_role]) FROM fact WHERE p1 IS NOT NULL;
         INSERT INTO edge_more SELECT * FROM edge WHERE predecessor IS NOT NULL",
    );
    let problems: Vec<String> = store
        .verify(|_| {})
        .unwrap()
        .problems
        .iter()
        .map(|p| p.to_string())
        .collect();
    assert!(
        problems
            .iter()
            .any(|p| p.contains("repeat their fact's first edge")),
        "{problems:?}"
    );
    let mut c = postgres::Client::connect(&db.url, postgres::NoTls).unwrap();
    let refused = c
        .batch_execute("UPDATE fact SET p1_type = NULL WHERE p1 IS NOT NULL")
        .unwrap_err();
    let constraint = refused.as_db_error().and_then(|e| e.constraint());
    assert_eq!(constraint, Some("fact_first_edge_whole"), "{refused}");
}
