//! Dropping held facts (`Store::drop_held`, `Store::expire_held`): what goes, what stays,
//! and that the held set stays consistent (`verify` clean, the counter right) across a
//! reopen. The rule is in docs/semantics.md, "Dropping held facts".

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::db::Db;
use common::fact;
use precedent::clock::ManualClock;
use precedent::{Error, FactHash, Store, StoreOptions};

const TYPO: FactHash = FactHash([7; 32]);

fn held_hashes(store: &Store) -> Vec<FactHash> {
    store
        .held(1000)
        .unwrap()
        .into_iter()
        .map(|h| h.fact.hash())
        .collect()
}

/// A fact held behind a typo, a child held behind it (in another transaction, so the wait
/// is by hash) and a grandchild held in the same batch as the child (a wait by row id).
#[test]
fn dropping_a_held_fact_drops_what_waits_for_it() {
    let db = Db::init();
    let store = db.store();
    let a = fact("A", 1, &[TYPO]);
    let b = fact("B", 1, &[a.hash()]);
    let c = fact("C", 1, &[b.hash()]);
    store.insert(&a).unwrap();
    store.insert_batch(vec![c.clone(), b.clone()]).unwrap();
    let other = fact("Other", 1, &[FactHash([8; 32])]);
    store.insert(&other).unwrap();
    assert_eq!(store.held_count().unwrap(), 4);

    let dropped = store.drop_held(&[a.hash()]).unwrap();
    assert_eq!(dropped[0], a.hash());
    let mut rest = dropped[1..].to_vec();
    rest.sort();
    let mut want = vec![b.hash(), c.hash()];
    want.sort();
    assert_eq!(rest, want);
    drop(store);

    // Durable, and the held set is what it would be had they never come.
    let store = db.store();
    assert_eq!(held_hashes(&store), vec![other.hash()]);
    assert_eq!(store.held_count().unwrap(), 1);
    db.assert_clean();
    let rows = |table: &str| -> i64 {
        let sql = format!("SELECT count(*) FROM {table}");
        db.raw().query_row(&sql, [], |r| r.get(0)).unwrap()
    };
    assert_eq!((rows("held_wait"), rows("held_child")), (1, 0));
}

/// A held fact that waits for a held fact which stays: only the named one goes, and the
/// one it waited for keeps its own wait and loses the record of its waiter.
#[test]
fn dropping_a_child_leaves_its_held_parent() {
    let db = Db::init();
    let store = db.store();
    let a = fact("A", 1, &[TYPO]);
    let b = fact("B", 1, &[a.hash()]);
    let b2 = fact("B", 2, &[a.hash()]);
    store
        .insert_batch(vec![a.clone(), b.clone(), b2.clone()])
        .unwrap();
    assert_eq!(store.drop_held(&[b.hash()]).unwrap(), vec![b.hash()]);
    let mut held = held_hashes(&store);
    held.sort();
    let mut want = vec![a.hash(), b2.hash()];
    want.sort();
    assert_eq!(held, want);
    db.assert_clean();

    // What stays is still released by its ancestors' arrival: the typo was not one.
    let root = fact("Root", 1, &[]);
    let a = fact("A", 1, &[root.hash()]);
    let b = fact("B", 1, &[a.hash()]);
    store.insert(&b).unwrap();
    store.insert(&a).unwrap();
    store.drop_held(&[b.hash()]).unwrap();
    store.insert(&root).unwrap();
    assert!(store.seq_of(&a.hash()).unwrap().is_some());
    assert_eq!(store.seq_of(&b.hash()).unwrap(), None);
    db.assert_clean();
}

/// A fact waiting for two held facts goes when either is dropped; a dropped fact that
/// arrives again is stored anew and released with its ancestors.
#[test]
fn a_dropped_fact_can_come_again() {
    let db = Db::init();
    let store = db.store();
    let root = fact("Root", 1, &[]);
    let a = fact("A", 1, &[root.hash()]);
    let x = fact("X", 1, &[FactHash([9; 32])]);
    let both = fact("Both", 1, &[a.hash(), x.hash()]);
    store
        .insert_batch(vec![a.clone(), x.clone(), both.clone()])
        .unwrap();
    let dropped = store.drop_held(&[x.hash()]).unwrap();
    assert_eq!(dropped, vec![x.hash(), both.hash()]);
    assert_eq!(held_hashes(&store), vec![a.hash()]);
    db.assert_clean();

    let again = fact("Again", 1, &[a.hash()]);
    store.insert(&again).unwrap();
    store.drop_held(&[a.hash()]).unwrap();
    assert_eq!(store.held_count().unwrap(), 0);
    store
        .insert_batch(vec![again.clone(), a.clone(), root.clone()])
        .unwrap();
    assert!(store.seq_of(&again.hash()).unwrap().is_some());
    assert_eq!(store.held_count().unwrap(), 0);
    db.assert_clean();
}

/// A released or unknown hash among those given drops nothing at all.
#[test]
fn released_or_unknown_hashes_drop_nothing() {
    let store = Store::open_in_memory().unwrap();
    let root = fact("Root", 1, &[]);
    let a = fact("A", 1, &[TYPO]);
    store.insert(&root).unwrap();
    store.insert(&a).unwrap();
    let err = store.drop_held(&[a.hash(), root.hash()]).unwrap_err();
    assert!(
        matches!(err, Error::NotHeld { hash } if hash == root.hash()),
        "{err}"
    );
    let err = store.drop_held(&[a.hash(), TYPO]).unwrap_err();
    assert!(
        matches!(err, Error::NotFound { hash } if hash == TYPO),
        "{err}"
    );
    assert_eq!(held_hashes(&store), vec![a.hash()]);
    assert!(store.seq_of(&root.hash()).unwrap().is_some());
}

/// Expiry goes by the store's clock: facts held at least the given time ago go, with
/// what waits for them however young; younger ones stay.
#[test]
fn expiry_drops_old_held_facts_and_their_waiters() {
    let clock = ManualClock::starting_at(1_800_000_000_000);
    let store = Store::open_in_memory_with(StoreOptions {
        clock: clock.clone() as Arc<_>,
        ..StoreOptions::default()
    })
    .unwrap();
    let old = fact("Old", 1, &[TYPO]);
    store.insert(&old).unwrap();
    clock.advance(3_600_000);
    let young_child = fact("Child", 1, &[old.hash()]);
    let young = fact("Young", 1, &[TYPO]);
    store.insert(&young_child).unwrap();
    store.insert(&young).unwrap();
    clock.advance(60_000);

    assert!(
        store
            .expire_held(Duration::from_secs(7200))
            .unwrap()
            .is_empty()
    );
    let dropped = store.expire_held(Duration::from_secs(3600)).unwrap();
    assert_eq!(dropped, vec![old.hash(), young_child.hash()]);
    assert_eq!(held_hashes(&store), vec![young.hash()]);
    assert!(store.verify(|_| {}).unwrap().is_clean());
}
