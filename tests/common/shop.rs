//! The shop example of the query tests: a shop, its orders and their shipments.

use precedent::{Fact, Store};

/// A shop named `name`.
pub fn shop(name: &str) -> Fact {
    Fact::builder("Shop").field("name", name).build().unwrap()
}

/// A `Shop.Order` of `shop` with one integer field (an `id` or a `total`).
pub fn order(shop: &Fact, field: &str, value: i64) -> Fact {
    Fact::builder("Shop.Order")
        .field(field, value)
        .predecessor("shop", shop.hash())
        .build()
        .unwrap()
}

/// The `Shop.Shipment` of `order`.
pub fn shipment(order: &Fact) -> Fact {
    Fact::builder("Shop.Shipment")
        .predecessor("order", order.hash())
        .build()
        .unwrap()
}

/// The shop "corner" with orders 1 to 3, the second one shipped, written to `store`.
/// Returns the shop and its orders.
pub fn three_orders(store: &mut Store) -> (Fact, Vec<Fact>) {
    let shop = shop("corner");
    let orders: Vec<Fact> = (1..=3).map(|id| order(&shop, "id", id)).collect();
    let mut facts = vec![shop.clone()];
    facts.extend(orders.iter().cloned());
    facts.push(shipment(&orders[1]));
    store.insert_batch(facts).unwrap();
    (shop, orders)
}

/// The givens of a query of one shop `s`.
pub fn givens(shop: &Fact) -> precedent::query::Givens {
    precedent::query::Givens::from([("s".to_string(), shop.hash())])
}
