//! `#[derive(FactType)]`: the declared type name and roles, with arities from the field
//! types, and typed round trips through a store.

use precedent::Store;
use precedent::query::{Arity, FactType, Givens, Query, Ref};
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize, FactType, Debug, Clone, PartialEq)]
#[fact(type = "Shop")]
struct Shop {
    name: String,
}

#[derive(Serialize, Deserialize, FactType, Debug, Clone, PartialEq)]
#[fact(type = "Shop.Order")]
struct Order {
    #[fact(role)]
    shop: Ref<Shop>,
    #[fact(role)]
    replaces: Option<Ref<Order>>,
    #[fact(role = "items")]
    #[serde(rename = "items")]
    lines: Vec<Ref<Shop>>,
    id: u64,
    total: f64,
}

#[test]
fn the_derive_declares_type_and_roles() {
    assert_eq!(Shop::TYPE, "Shop");
    assert!(Shop::PREDECESSORS.is_empty());
    assert_eq!(Order::TYPE, "Shop.Order");
    assert_eq!(
        Order::PREDECESSORS,
        &[
            ("shop", Arity::One),
            ("replaces", Arity::Optional),
            ("items", Arity::Many)
        ]
    );
}

#[test]
fn derived_facts_save_load_and_query() {
    let mut store = Store::open_in_memory().unwrap();
    let shop = store
        .save(&Shop {
            name: "corner".into(),
        })
        .unwrap();
    let other = store
        .save(&Shop {
            name: "market".into(),
        })
        .unwrap();
    let first = Order {
        shop,
        replaces: None,
        lines: vec![other],
        id: 1,
        total: 2.5,
    };
    let r1 = store.save(&first).unwrap();
    let second = Order {
        replaces: Some(r1),
        id: 2,
        ..first.clone()
    };
    let r2 = store.save(&second).unwrap();
    assert_eq!(store.load(r1).unwrap(), first);
    assert_eq!(store.load(r2).unwrap(), second);
    let fact = store.get(&r2.hash()).unwrap().unwrap();
    assert_eq!(fact.predecessors()["items"].len(), 1);
    assert!(fact.field("items").is_none());
    let latest = Query::parse(
        "given s: Shop
         match o: Shop.Order where o->shop = s
           and not exists (match n: Shop.Order where n->replaces = o)
         select o",
    )
    .unwrap();
    let rows: Vec<(Ref<Order>, Order)> = store
        .query_as(&latest, &Givens::from([("s".to_string(), shop.hash())]))
        .unwrap();
    assert_eq!(rows, vec![(r2, second)]);
}
