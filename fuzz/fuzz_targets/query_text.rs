//! Query text: `Query::parse` on arbitrary UTF-8, and a query that parses run against a
//! small store with every given bound.
//!
//! Properties: no panic in the parser, the checker, the SQL compiler or the run; field
//! values and labels never reach SQL as text (a run either answers or returns an error,
//! and the store's fact count and `verify` are unchanged).

#![no_main]

use std::cell::RefCell;

use libfuzzer_sys::fuzz_target;
use precedent::query::{Givens, Query};
use precedent::{Fact, Store};

thread_local! {
    static STORE: RefCell<(Store, Vec<Fact>)> = RefCell::new(small_store());
}

fn small_store() -> (Store, Vec<Fact>) {
    let store = Store::open_in_memory().unwrap();
    let shop = Fact::builder("Shop")
        .field("name", "corner")
        .build()
        .unwrap();
    let order = Fact::builder("Shop.Order")
        .field("id", 1)
        .field("note", "'; DROP TABLE fact; --")
        .predecessor("shop", shop.hash())
        .build()
        .unwrap();
    let paid = Fact::builder("Shop.Order.Paid")
        .field("amount", 2.5)
        .predecessor("order", order.hash())
        .build()
        .unwrap();
    let facts = vec![shop, order, paid];
    store.insert_batch(facts.clone()).unwrap();
    (store, facts)
}

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(query) = Query::parse(text) else {
        return;
    };
    STORE.with(|cell| {
        let (store, facts) = &mut *cell.borrow_mut();
        let givens: Givens = query
            .givens
            .iter()
            .enumerate()
            .map(|(i, g)| (g.label.name.clone(), facts[i % facts.len()].hash()))
            .collect();
        let _ = store.query(&query, &givens);
        assert_eq!(
            store.count_and_max_seq().unwrap().0,
            3,
            "a query changed the store"
        );
    });
});
