//! `QueryCheck`: the names of a query that no stored fact, declared queue or registered
//! type has, with the nearest known ones (`docs/queries.md`, "Names no stored fact has").

use precedent::query::{FactType, Query, QueryCheck, Ref, Unknown};
use precedent::queue::{Completion, QueueSpec};
use precedent::{Error, Fact, Store};
use serde::{Deserialize, Serialize};

/// A shop, two orders with an `id` (role `shop`), the second with a `note`, and a
/// shipment of the first (role `order`).
fn shop_store() -> Store {
    let store = Store::open_in_memory().unwrap();
    let shop = Fact::builder("Shop")
        .field("name", "corner")
        .build()
        .unwrap();
    let order = |id: i64| {
        Fact::builder("Shop.Order")
            .field("id", id)
            .predecessor("shop", shop.hash())
    };
    let first = order(1).build().unwrap();
    let second = order(2).field("note", "gift").build().unwrap();
    let shipment = Fact::builder("Shop.Shipment").predecessor("order", first.hash());
    store
        .insert_batch(vec![shop.clone(), first, second, shipment.build().unwrap()])
        .unwrap();
    store
}

fn warnings(store: &Store, text: &str) -> Vec<String> {
    let q = Query::parse(text).unwrap();
    store
        .check_query(&q)
        .unwrap()
        .iter()
        .map(|w| w.to_string())
        .collect()
}

#[test]
fn names_the_store_has_give_no_warning() {
    let store = shop_store();
    let text = "given s: Shop
            match o: Shop.Order where o->shop = s and o.note = \"gift\"
              and not exists (match sh: Shop.Shipment where sh->order = o)
            order by o.id
            select {id: o.id, shop: s.name, carriers: [match x: Shop.Shipment where x->order = o select hash(x)]}";
    assert_eq!(warnings(&store, text), Vec::<String>::new());
}

#[test]
fn each_unknown_name_is_reported_once_with_the_nearest_known_one() {
    let store = shop_store();
    let text = "given s: Shop
match o: Shop.Order where o->shp = s and o.nte = 1
  and not exists (match sh: Shop.Shipmnt where sh->order = o)
order by o.idd
select {a: o.idd, b: [match c: Invoice where c->order = o select c]}";
    assert_eq!(
        warnings(&store, text),
        [
            "query at line 3, column 25: no fact of type Shop.Shipmnt is stored; did you mean Shop.Shipment?",
            "query at line 5, column 29: no fact of type Invoice is stored",
            "query at line 2, column 27: no stored fact has the role shp; did you mean shop?",
            "query at line 2, column 42: no stored fact of type Shop.Order has the field nte; did you mean note?",
            "query at line 4, column 10: no stored fact of type Shop.Order has the field idd; did you mean id?",
        ]
    );
}

#[test]
fn strict_makes_the_first_unknown_name_an_error() {
    let store = shop_store();
    let q = Query::parse("match o: Shop.Ordr where o.idd = 1 select o").unwrap();
    assert_eq!(QueryCheck::new().run(&store, &q).unwrap().len(), 1);
    let err = QueryCheck::new().strict(true).run(&store, &q).unwrap_err();
    assert!(matches!(err, Error::Query(_)), "{err:?}");
    assert_eq!(
        err.to_string(),
        "query at line 1, column 7: no fact of type Shop.Ordr is stored; did you mean Shop.Order?"
    );
    let q = Query::parse("match o: Shop.Ordr match p: Shop.Shp where o->a = p select o").unwrap();
    let err = QueryCheck::new().strict(true).run(&store, &q).unwrap_err();
    assert!(
        err.to_string().ends_with("(and 2 more unknown names)"),
        "{err}"
    );
    let fine = Query::parse("match o: Shop.Order select o.id").unwrap();
    assert!(
        QueryCheck::new()
            .strict(true)
            .run(&store, &fine)
            .unwrap()
            .is_empty()
    );
}

/// A field that only an old fact has is found however many facts came after it: the
/// check reads past its first page (256 facts) rather than guess from a sample.
#[test]
fn a_field_only_an_old_fact_has_is_known() {
    let store = Store::open_in_memory().unwrap();
    let mut facts = vec![Fact::builder("Log").field("rare", 1).build().unwrap()];
    let n = 2 * 256 + 3;
    facts.extend((0..n).map(|i| Fact::builder("Log").field("i", i).build().unwrap()));
    store.insert_batch(facts).unwrap();
    assert!(warnings(&store, "match l: Log where l.rare = 1 select l.i").is_empty());
    assert_eq!(
        warnings(&store, "match l: Log select l.rar"),
        [
            "query at line 1, column 21: no stored fact of type Log has the field rar; did you mean rare?"
        ]
    );
}

#[derive(Serialize, Deserialize, FactType)]
#[fact(type = "Shop.Refund")]
struct Refund {
    order: Ref<Refund>,
    amount: u64,
}

#[test]
fn registered_types_and_declared_queues_are_known_before_any_fact() {
    let store = shop_store();
    let text = "match o: Shop.Order
            where exists (match r: Shop.Refund where r->order = o and r.amount > 1)
              and exists (match d: Shop.Done where d->done_for = o)
            select o";
    assert_eq!(warnings(&store, text).len(), 3);
    let check = QueryCheck::new().fact_type::<Refund>();
    let q = Query::parse(text).unwrap();
    let left: Vec<Unknown> = check
        .run(&store, &q)
        .unwrap()
        .into_iter()
        .map(|w| w.unknown)
        .collect();
    assert_eq!(
        left,
        [
            Unknown::Type("Shop.Done".into()),
            Unknown::Role("done_for".into())
        ]
    );
    let spec = QueueSpec::new(
        "ship",
        "Shop.Order",
        vec![Completion {
            type_name: "Shop.Done".into(),
            role: "done_for".into(),
        }],
    );
    store.declare_queue(&spec).unwrap();
    assert!(check.run(&store, &q).unwrap().is_empty());
    // A registered type's fields are all its fields: a misspelled one is reported.
    let q = Query::parse("match r: Shop.Refund select r.amout").unwrap();
    let w = check.run(&store, &q).unwrap();
    assert_eq!(w[0].suggestions, ["amount"]);
}
