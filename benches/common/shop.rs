//! The shop facts of the query and queue benchmarks: shops, orders naming their shop,
//! shipments and completions naming an order, and the queue of orders to ship.
#![allow(dead_code)] // each benchmark uses only some of them

use precedent::queue::{Completion, QueueSpec};
use precedent::{Fact, FactHash, Store};

pub fn shop(i: usize) -> Fact {
    Fact::builder("Shop")
        .field("name", format!("shop-{i}"))
        .build()
        .unwrap()
}

pub fn order(shop: &Fact, i: usize, id: usize) -> Fact {
    Fact::builder("Shop.Order")
        .field("id", id as i64)
        .field("total", (id % 97) as f64 + 0.5)
        .predecessor("shop", shop.hash())
        .field("shop_index", i as i64)
        .build()
        .unwrap()
}

pub fn shipment(order: &Fact) -> Fact {
    Fact::builder("Shop.Shipment")
        .field("carrier", "post")
        .predecessor("order", order.hash())
        .build()
        .unwrap()
}

/// The completion a queue worker writes for an order.
pub fn shipped(order: &FactHash) -> Fact {
    Fact::builder("Shop.Shipped")
        .field("by", "bench")
        .predecessor("order", *order)
        .build()
        .unwrap()
}

/// Queue `ship`: orders, each completed by a `Shop.Shipped` naming it.
pub fn spec() -> QueueSpec {
    QueueSpec::new(
        "ship",
        "Shop.Order",
        vec![Completion {
            type_name: "Shop.Shipped".into(),
            role: "order".into(),
        }],
    )
}

/// Stores `shops`, then `orders` orders for each shop in turn (90% shipped: in every shop,
/// all but each tenth order), with `insert_batch` in chunks of 50,000; returns how many
/// facts that was.
pub fn store_shop_orders(store: &Store, shops: &[Fact], orders: usize) -> usize {
    store.insert_batch(shops.to_vec()).unwrap();
    let (mut chunk, mut total) = (Vec::with_capacity(50_000), shops.len());
    for o in 0..orders {
        for (i, s) in shops.iter().enumerate() {
            let ord = order(s, i, o * shops.len() + i);
            chunk.push(ord.clone());
            if !o.is_multiple_of(10) {
                chunk.push(shipment(&ord));
            }
            if chunk.len() >= 50_000 {
                total += chunk.len();
                store.insert_batch(std::mem::take(&mut chunk)).unwrap();
            }
        }
    }
    total += chunk.len();
    store.insert_batch(chunk).unwrap();
    total
}
