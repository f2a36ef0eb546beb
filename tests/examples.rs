//! The examples run as tests: each one's `run` is called on a store of the test's, which
//! then checks what it printed and what it left in the store.

use std::sync::Arc;

use precedent::Store;
use precedent::store::SqlExt;

// `main` is the example's own entry point, not called here.
#[allow(dead_code)]
#[path = "../examples/shop.rs"]
mod shop;

#[test]
fn the_shop_example_ships_every_order_once_with_its_label() {
    let store = Arc::new(Store::open_in_memory().unwrap());
    let mut out = Vec::new();
    shop::run(&store, &mut out).unwrap();
    let out = String::from_utf8(out).unwrap();
    assert_eq!(
        out.lines().collect::<Vec<_>>(),
        [
            "pending: #1 teapot, #2 kettle",
            "watch: #3 mug is pending",
            "worker: shipped 3 orders",
            "watch: #1 teapot shipped",
            "watch: #2 kettle shipped",
            "watch: #3 mug shipped",
            "watch: 0 pending",
            "labels: #1 by courier, #2 by courier, #3 by post",
        ]
    );

    // Each order has one shipment and one label, and the queue has nothing left.
    assert_eq!(store.facts_of_type("Shop.Order").unwrap().len(), 3);
    assert_eq!(store.facts_of_type("Shop.Shipment").unwrap().len(), 3);
    let labels: i64 = store
        .read(|r| r.query_one("SELECT count(*) FROM shipping_label", &[], |row| row.get(0)))
        .unwrap();
    assert_eq!(labels, 3);
    let stats = store.queue_stats("ship").unwrap();
    assert_eq!((stats.ready, stats.leased, stats.completed), (0, 0, 3));
    assert!(store.claim("ship", 10).unwrap().is_empty());
    // The watch thread has given its share of the store back.
    assert_eq!(Arc::strong_count(&store), 1);
}
