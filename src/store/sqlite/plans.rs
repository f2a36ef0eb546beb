//! A check that every statement the store runs on the held set finds its rows through an
//! index, not by scanning: the held set can hold a million facts, and one statement that
//! scans it per fact turns a load into hours (this happened once, in `verify`).

use std::collections::BTreeSet;
use std::sync::Mutex;

use super::SqliteBackend;
use crate::fact::Fact;
use crate::hash::{FactHash, HashPrefix};
use crate::store::{Store, StoreOptions};

/// Statements that read a whole held-set table on purpose, found by a piece of their text:
/// `verify`'s passes and counts, the held listing (in arrival order, with a limit), and the
/// absent ancestors (every wait, to find the hashes no row holds).
const WHOLE_TABLE: &[&str] = &[
    "FROM held ORDER BY id",
    "SELECT count(*)",
    "GROUP BY hash",
    "SELECT DISTINCT w.missing FROM held_wait w",
];

fn fact(n: i64, preds: &[FactHash]) -> Fact {
    let mut b = Fact::builder("Plan.Link").field("n", n);
    for p in preds {
        b = b.predecessor("p", *p);
    }
    b.build().unwrap()
}

#[test]
fn statements_on_the_held_set_search_indexes() {
    // Statements seen, from every connection of the store (a `fn` tracer: one test).
    static SEEN: Mutex<BTreeSet<String>> = Mutex::new(BTreeSet::new());
    let dir = std::env::temp_dir().join(format!("precedent-plans-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("plans.db");
    let backend = SqliteBackend::open(&path, StoreOptions::default()).unwrap();
    backend.trace(|sql| {
        SEEN.lock().unwrap().insert(sql.to_string());
    });
    let store = Store::with_backend(Box::new(backend), StoreOptions::default());

    // A chain with fan-in, children first: in one batch (waits by row id), then one fact
    // at a time (waits by hash), so both kinds of wait are written, read and released.
    let mut facts: Vec<Fact> = Vec::new();
    for i in 0..40 {
        let preds: Vec<FactHash> = facts.iter().rev().take(2).map(Fact::hash).collect();
        facts.push(fact(i, &preds));
    }
    let mut batch = facts[20..].to_vec();
    batch.reverse();
    store.insert_batch(batch).unwrap();
    for f in facts[1..20].iter().rev() {
        assert!(store.insert(f).unwrap().is_held());
    }
    let held = facts[5].hash();
    let prefix = HashPrefix::parse(&held.to_string()[..10]).unwrap();
    store.write(|w| w.resolve_prefix(&prefix)).unwrap();
    assert!(store.lookup(&held).unwrap().is_some());
    assert_eq!(store.held(100).unwrap().len(), 39);
    assert_eq!(store.fetch_bytes(&[held]).unwrap().len(), 1);
    assert_eq!(store.absent_ancestors(10).unwrap(), vec![facts[0].hash()]);
    store
        .write(|w| w.note_held_origin("https://peer.example", &[held]))
        .unwrap();
    assert!(store.verify(|_| {}).unwrap().is_clean());
    assert_eq!(store.insert(&facts[0]).unwrap().released(), 40);
    store
        .write(|w| w.note_held_origin("https://peer.example", &[held]))
        .unwrap();
    assert!(store.verify(|_| {}).unwrap().is_clean());

    let statements: Vec<String> = SEEN
        .lock()
        .unwrap()
        .iter()
        .filter(|sql| sql.contains("held"))
        .filter(|sql| !WHOLE_TABLE.iter().any(|w| sql.contains(w)))
        .cloned()
        .collect();
    assert!(
        statements.len() >= 15,
        "too few statements seen: {statements:#?}"
    );
    let raw = rusqlite::Connection::open(&path).unwrap();
    for sql in statements {
        let mut explain = raw.prepare(&format!("EXPLAIN QUERY PLAN {sql}")).unwrap();
        // Parameters left unbound are NULL: the plan does not depend on them.
        let mut rows = explain.raw_query();
        let mut plan: Vec<String> = Vec::new();
        while let Some(row) = rows.next().unwrap() {
            plan.push(row.get(3).unwrap());
        }
        assert!(
            !plan.iter().any(|step| step.starts_with("SCAN")),
            "{sql}\nscans: {plan:?}"
        );
    }
    drop(store);
    let _ = std::fs::remove_dir_all(&dir);
}
