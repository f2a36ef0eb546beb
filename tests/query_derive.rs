//! `#[derive(FactType)]`: the declared type name and roles, with arities from the field
//! types, and typed round trips through a store; typed writes, fluent givens and results
//! read into serde types.

use std::collections::BTreeSet;

use precedent::query::{Arity, FactType, Givens, Projected, Query, Ref};
use precedent::{Error, FactHash, Store, Value};
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
    let store = Store::open_in_memory().unwrap();
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

/// A line of an order, with no `#[fact(role)]` on its references.
#[derive(Serialize, Deserialize, FactType, Debug, Clone, PartialEq)]
#[fact(type = "Shop.Order.Line")]
struct Line {
    order: Ref<Order>,
    after: Option<Ref<Line>>,
    shops: BTreeSet<Ref<Shop>>,
    sku: String,
}

/// A reference kept a fact field on purpose.
#[derive(Serialize, Deserialize, FactType, Debug, Clone, PartialEq)]
#[fact(type = "Shop.Note")]
struct Note {
    #[fact(field)]
    about: Ref<Shop>,
    text: String,
}

fn shop_and_order(store: &mut Store) -> (Ref<Shop>, Ref<Order>) {
    let shop = store
        .save(&Shop {
            name: "corner".into(),
        })
        .unwrap();
    let order = store
        .save(&Order {
            shop,
            replaces: None,
            lines: vec![],
            id: 1,
            total: 2.5,
        })
        .unwrap();
    (shop, order)
}

#[test]
fn a_ref_field_is_a_role_without_the_attribute() {
    assert_eq!(
        Line::PREDECESSORS,
        &[
            ("order", Arity::One),
            ("after", Arity::Optional),
            ("shops", Arity::Many)
        ]
    );
    let mut store = Store::open_in_memory().unwrap();
    let (shop, order) = shop_and_order(&mut store);
    let line = Line {
        order,
        after: None,
        shops: BTreeSet::from([shop]),
        sku: "tea".into(),
    };
    let r = store.save(&line).unwrap();
    assert_eq!(store.load(r).unwrap(), line);

    // Stored as edges, not as text.
    let fact = store.get(&r.hash()).unwrap().unwrap();
    assert!(fact.field("order").is_none());
    assert!(fact.field("shops").is_none());
    assert_eq!(fact.fields().len(), 1);
    let preds: Vec<(String, FactHash)> = store
        .predecessors(&r.hash())
        .unwrap()
        .into_iter()
        .map(|(role, f)| (role, f.hash()))
        .collect();
    assert_eq!(
        preds,
        vec![
            ("order".to_string(), order.hash()),
            ("shops".to_string(), shop.hash())
        ]
    );
    let succ = store
        .successors(&order.hash(), Some("order"), Some("Shop.Order.Line"))
        .unwrap();
    assert_eq!(succ.len(), 1);
    assert_eq!(succ[0].hash(), r.hash());

    // A query walks them.
    let lines: Vec<(Ref<Line>, Line)> = store
        .prepare("given s: Shop match l: Shop.Order.Line where l->order->shop = s select l")
        .unwrap()
        .given("s", shop)
        .unwrap()
        .facts()
        .unwrap();
    assert_eq!(lines, vec![(r, line)]);
}

#[test]
fn a_ref_marked_field_stays_a_fact_field() {
    assert!(Note::PREDECESSORS.is_empty());
    let mut store = Store::open_in_memory().unwrap();
    let (shop, _) = shop_and_order(&mut store);
    let note = Note {
        about: shop,
        text: "closed on sundays".into(),
    };
    let r = store.save(&note).unwrap();
    let fact = store.get(&r.hash()).unwrap().unwrap();
    assert_eq!(
        fact.field("about"),
        Some(&Value::Text(shop.hash().to_string()))
    );
    assert!(fact.predecessors().is_empty());
    assert_eq!(store.load(r).unwrap(), note);
}

/// A role renamed for serde only: the role the type declares is missing from its
/// serialised form.
#[derive(Serialize, Deserialize, Debug)]
struct Misnamed {
    #[serde(rename = "store")]
    shop: Ref<Shop>,
}
impl FactType for Misnamed {
    const TYPE: &'static str = "Shop.Misnamed";
    const PREDECESSORS: &'static [(&'static str, Arity)] = &[("shop", Arity::One)];
}

#[test]
fn a_role_missing_from_the_serialised_form_is_refused() {
    let mut store = Store::open_in_memory().unwrap();
    let (shop, _) = shop_and_order(&mut store);
    let err = store.save(&Misnamed { shop }).unwrap_err();
    assert!(matches!(&err, Error::InvalidFact { reason } if reason.contains("role shop")));
}

#[test]
fn a_writer_saves_typed_facts_in_one_transaction() {
    let mut store = Store::open_in_memory().unwrap();
    let (shop, order) = shop_and_order(&mut store);
    let line = Line {
        order,
        after: None,
        shops: BTreeSet::new(),
        sku: "tea".into(),
    };
    let r = store.write(|w| w.save(&line)).unwrap();
    assert_eq!(store.load(r).unwrap(), line);

    // An error after a save rolls the save back.
    let second = Line {
        sku: "milk".into(),
        ..line.clone()
    };
    let err = store
        .write(|w| {
            w.save(&second)?;
            w.save(&Misnamed { shop })
        })
        .unwrap_err();
    assert!(matches!(err, Error::InvalidFact { .. }));
    let stored = store
        .successors(&order.hash(), Some("order"), None)
        .unwrap();
    assert_eq!(stored.len(), 1);
}

#[test]
fn givens_bind_by_hash_ref_or_fact() {
    let mut store = Store::open_in_memory().unwrap();
    let (shop, order) = shop_and_order(&mut store);
    let shop_fact = store.get(&shop.hash()).unwrap().unwrap();
    let text = "given s: Shop match o: Shop.Order where o->shop = s select o";
    let by_ref = store
        .prepare(text)
        .unwrap()
        .given("s", shop)
        .unwrap()
        .rows();
    let by_hash = store
        .prepare(text)
        .unwrap()
        .given("s", shop.hash())
        .unwrap()
        .rows();
    let by_fact = store
        .prepare(text)
        .unwrap()
        .given("s", &shop_fact)
        .unwrap()
        .rows();
    let old = store.query_text(text, &Givens::from([("s".to_string(), shop.hash())]));
    let by_ref = by_ref.unwrap();
    assert_eq!(by_ref.len(), 1);
    assert!(matches!(&by_ref[0].value, Projected::Fact(f) if f.hash() == order.hash()));
    assert_eq!(by_hash.unwrap(), by_ref);
    assert_eq!(by_fact.unwrap(), by_ref);
    assert_eq!(old.unwrap(), by_ref);

    let unknown = store
        .prepare(text)
        .unwrap()
        .given("shop", shop)
        .unwrap_err();
    assert_eq!(
        unknown.to_string(),
        "query: no given shop in this query (its givens: s)"
    );
    let none = store
        .prepare("match o: Shop.Order select o")
        .unwrap()
        .given("s", shop)
        .unwrap_err();
    assert!(none.to_string().contains("(it has none)"));
    let unbound = store.prepare(text).unwrap().rows().unwrap_err();
    assert!(unbound.to_string().contains("given s is not bound"));
}

#[derive(Deserialize, Debug, PartialEq)]
struct OrderView {
    id: u64,
    total: f64,
    shop: String,
    lines: Vec<String>,
}

#[test]
fn projections_read_into_serde_types() {
    let mut store = Store::open_in_memory().unwrap();
    let (shop, order) = shop_and_order(&mut store);
    store
        .save(&Line {
            order,
            after: None,
            shops: BTreeSet::new(),
            sku: "tea".into(),
        })
        .unwrap();
    let views: Vec<OrderView> = store
        .prepare(
            "given s: Shop match o: Shop.Order where o->shop = s
             select {id: o.id, total: o.total, shop: s.name,
                     lines: [match l: Shop.Order.Line where l->order = o select l.sku]}",
        )
        .unwrap()
        .given("s", shop)
        .unwrap()
        .rows_as()
        .unwrap();
    assert_eq!(
        views,
        vec![OrderView {
            id: 1,
            total: 2.5,
            shop: "corner".into(),
            lines: vec!["tea".into()]
        }]
    );

    // `shop` is a text field, not a number: the error names the result and the field.
    let err = store
        .prepare("given s: Shop match o: Shop.Order where o->shop = s select {id: s.name, total: o.total, shop: s.name, lines: [match l: Shop.Order.Line where l->order = o select l.sku]}")
        .unwrap()
        .given("s", shop)
        .unwrap()
        .rows_as::<OrderView>()
        .unwrap_err();
    let Error::ResultType {
        key,
        type_name,
        field,
        reason,
    } = &err
    else {
        panic!("expected a result type error, got {err}");
    };
    assert_eq!(key, &vec![1, 2]);
    assert!(type_name.ends_with("OrderView"), "{type_name}");
    assert_eq!(field.as_deref(), Some("id"));
    assert!(reason.contains("expected u64"), "{reason}");
    assert!(err.to_string().contains("at field id"), "{err}");
}
