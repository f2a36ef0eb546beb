//! Queries: every example of docs/queries.md runs against the documented data and must
//! print exactly the documented output, and its plan must search indexes, never scan;
//! the documented errors; the builder; typed facts; watch changes delivered one at a time.

mod common;

use std::ops::ControlFlow;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use precedent::query::{Arity, Change, Cond, FactType, Givens, Op, Projection, Query, Ref, Stop};
use precedent::{Error, Fact, FactHash, Store};
use proptest::prelude::*;

use common::backend::Backend;
use serde::{Deserialize, Serialize};

/// The data docs/queries.md describes; returns the store and the givens `s` and `c`.
fn documented_store(b: Backend) -> (Store, Givens) {
    let mut facts = Vec::new();
    let shop = |name: &str| Fact::builder("Shop").field("name", name).build().unwrap();
    let (corner, market) = (shop("corner"), shop("market"));
    facts.extend([corner.clone(), market.clone()]);
    let orders: Vec<Fact> = [
        (1, 5.0f64, "new", &corner),
        (2, 12.5, "open", &corner),
        (3, 30.0, "open", &corner),
        (4, 8.0, "new", &corner),
        (5, 1.0, "new", &market),
    ]
    .iter()
    .map(|(id, total, state, s)| {
        let b = Fact::builder("Shop.Order")
            .field("id", *id)
            .field("state", *state);
        // Whole totals are integers, as a person would write them.
        let b = if total.fract() == 0.0 {
            b.field("total", *total as i64)
        } else {
            b.field("total", *total)
        };
        b.predecessor("shop", s.hash()).build().unwrap()
    })
    .collect();
    facts.extend(orders.iter().cloned());
    let ship = |carrier: &str, o: &Fact| {
        Fact::builder("Shop.Shipment")
            .field("carrier", carrier)
            .predecessor("order", o.hash())
            .build()
            .unwrap()
    };
    let (post, courier) = (ship("post", &orders[1]), ship("courier", &orders[3]));
    let cancel = Fact::builder("Shop.Cancellation")
        .predecessor("shipment", courier.hash())
        .build()
        .unwrap();
    facts.extend([post, courier, cancel]);
    let customer = Fact::builder("Customer")
        .field("email", "ada@example.org")
        .build()
        .unwrap();
    let first = Fact::builder("Customer.Name")
        .field("value", "Ada")
        .predecessor("customer", customer.hash())
        .build()
        .unwrap();
    let second = Fact::builder("Customer.Name")
        .field("value", "Ada L.")
        .predecessor("customer", customer.hash())
        .predecessor("prior", first.hash())
        .build()
        .unwrap();
    facts.extend([customer.clone(), first, second]);
    let store = b.store();
    store.insert_batch(facts).unwrap();
    let givens = Givens::from([
        ("s".to_string(), corner.hash()),
        ("c".to_string(), customer.hash()),
    ]);
    (store, givens)
}

/// The (query, expected output) pairs of docs/queries.md.
fn documented_examples() -> Vec<(String, String)> {
    let doc =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/queries.md")).unwrap();
    let mut blocks = Vec::new();
    let mut lines = doc.lines();
    while let Some(line) = lines.next() {
        if let Some(kind) = line
            .strip_prefix("```")
            .filter(|k| *k == "query" || *k == "output")
        {
            let body: Vec<&str> = lines.by_ref().take_while(|l| *l != "```").collect();
            blocks.push((kind.to_string(), body.join("\n")));
        }
    }
    let mut out = Vec::new();
    for pair in blocks.chunks(2) {
        assert_eq!(pair.len(), 2, "a query block without its output block");
        assert_eq!(
            (pair[0].0.as_str(), pair[1].0.as_str()),
            ("query", "output")
        );
        out.push((pair[0].1.clone(), pair[1].1.clone()));
    }
    assert!(out.len() >= 10, "docs/queries.md lost examples");
    out
}

/// Only the givens a query declares.
fn givens_for(q: &Query, all: &Givens) -> Givens {
    q.givens
        .iter()
        .map(|g| (g.label.name.clone(), all[&g.label.name]))
        .collect()
}

conformance! {
    fn every_documented_example_prints_its_documented_output(b: Backend) {
        let (store, givens) = documented_store(b);
        for (text, expected) in documented_examples() {
            let q = Query::parse(&text).unwrap_or_else(|e| panic!("{text}\n{e}"));
            let rows = store.query(&q, &givens_for(&q, &givens)).unwrap();
            let got: Vec<String> = rows.iter().map(|r| r.value.to_json().to_string()).collect();
            assert_eq!(got.join("\n"), expected, "query:\n{text}");
        }
    }
}

conformance! {
    /// Running the documented examples again prepares no statement again: compiled
    /// statements (child collections' ones included, which run once per result) stay
    /// prepared in the connection's cache from one run to the next.
    fn queries_run_again_prepare_no_statement_again(b: Backend) {
        let (store, givens) = documented_store(b);
        let run_all = || {
            for (text, _) in documented_examples() {
                let q = Query::parse(&text).unwrap();
                store.query(&q, &givens_for(&q, &givens)).unwrap();
            }
        };
        run_all();
        let before = store.query_reprepares();
        for _ in 0..3 {
            run_all();
        }
        assert_eq!(store.query_reprepares() - before, 0);
    }
}

/// SQLite only: the steps of SQLite's query plans (`SCAN`, `(hash=?)`).
#[test]
fn every_documented_example_searches_indexes_and_never_scans() {
    let (store, givens) = documented_store(Backend::Sqlite);
    for (text, _) in documented_examples() {
        let q = Query::parse(&text).unwrap();
        let plan = store.explain(&q, &givens_for(&q, &givens)).unwrap();
        for step in &plan {
            assert!(
                !step.starts_with("SCAN"),
                "query:\n{text}\nscans: {step}\nplan: {plan:#?}"
            );
        }
        let uses = |what: &str| plan.iter().any(|s| s.contains(what));
        if q.givens.is_empty() {
            assert!(uses("fact_by_type"), "{text}\n{plan:#?}");
        } else {
            assert!(
                uses("(hash=?)"),
                "a given is found by hash: {text}\n{plan:#?}"
            );
        }
    }
}

/// The plan of a query over the documented data.
fn plan_of(text: &str) -> Vec<String> {
    let (store, givens) = documented_store(Backend::Sqlite);
    let q = Query::parse(text).unwrap();
    store.explain(&q, &givens_for(&q, &givens)).unwrap()
}

/// SQLite only: SQLite's query plans.
#[test]
fn a_step_through_a_role_checks_the_type_in_the_edge() {
    // Toward successors: the shop's orders, then each order's shipments, are ranges of the
    // edge primary key that include the successor's type; no fact is looked up for its
    // type, and only results are read from `fact` (by seq).
    let plan = plan_of(
        "given s: Shop
         match o: Shop.Order where o->shop = s
           and not exists (match sh: Shop.Shipment where sh->order = o)
         select o.id",
    );
    let typed = "USING PRIMARY KEY (predecessor=? AND role_id=? AND successor_type=?)";
    assert_eq!(
        plan.iter().filter(|s| s.contains(typed)).count(),
        2,
        "{plan:#?}"
    );
    assert!(
        !plan.iter().any(|s| s.contains("fact_by_type")),
        "{plan:#?}"
    );
    // Toward predecessors: `edge_by_successor` includes the predecessor's type.
    let plan = plan_of(
        "match o: Shop.Order
         match p: Shop where o->shop = p
         select p",
    );
    assert!(
        plan.iter()
            .any(|s| s
                .contains("edge_by_successor (successor=? AND role_id=? AND predecessor_type=?)")),
        "{plan:#?}"
    );
}

conformance! {
    /// Facts of several types name the same facts through the same roles, so a match's type
    /// must be told apart in every step (in the documented data each role leads to one type).
    fn facts_of_several_types_through_one_role_are_told_apart(b: Backend) {
        let store = b.store();
        let shop = Fact::builder("Shop")
            .field("name", "corner")
            .build()
            .unwrap();
        let made = |ty: &str, id: i64, role: &str, to: &Fact| {
            Fact::builder(ty)
                .field("id", id)
                .predecessor(role, to.hash())
                .build()
                .unwrap()
        };
        // Orders and reviews both name the shop as `shop`; shipments and cancellations both
        // name an order as `order`; notes name a shop or an order as `about`.
        let (o1, o2, o3) = (
            made("Order", 1, "shop", &shop),
            made("Order", 2, "shop", &shop),
            made("Order", 3, "shop", &shop),
        );
        let review = made("Review", 10, "shop", &shop);
        let shipped = made("Shipment", 20, "order", &o1);
        let cancelled = made("Cancellation", 30, "order", &o2);
        let (on_shop, on_order) = (
            made("Note", 40, "about", &shop),
            made("Note", 41, "about", &o3),
        );
        store
            .insert_batch(vec![
                shop.clone(),
                o1,
                o2,
                o3,
                review,
                shipped,
                cancelled,
                on_shop,
                on_order,
            ])
            .unwrap();
        let givens = Givens::from([("s".to_string(), shop.hash())]);
        let run = |text: &str| -> Vec<String> {
            let q = Query::parse(text).unwrap_or_else(|e| panic!("{text}\n{e}"));
            let g = givens_for(&q, &givens);
            let plan = store.explain(&q, &g).unwrap();
            assert!(!plan.iter().any(|s| s.starts_with("SCAN")), "{plan:#?}");
            store
                .query(&q, &g)
                .unwrap()
                .iter()
                .map(|r| r.value.to_json().to_string())
                .collect()
        };
        let ids = |v: &[i64]| v.iter().map(|i| i.to_string()).collect::<Vec<_>>();
        // Toward successors, at the end of a one-step and a two-step path.
        assert_eq!(
            run("given s: Shop match o: Order where o->shop = s select o.id"),
            ids(&[1, 2, 3])
        );
        assert_eq!(
            run("given s: Shop match r: Review where r->shop = s select r.id"),
            ids(&[10])
        );
        assert_eq!(
            run("given s: Shop match x: Shipment where x->order->shop = s select x.id"),
            ids(&[20])
        );
        // Inside `not exists`, where no fact row is read: a cancellation is not a shipment.
        assert_eq!(
            run("given s: Shop match o: Order where o->shop = s
                   and not exists (match x: Shipment where x->order = o) select o.id"),
            ids(&[2, 3])
        );
        assert_eq!(
            run("given s: Shop match o: Order where o->shop = s
                   and exists (match x: Cancellation where x->order = o) select o.id"),
            ids(&[2])
        );
        // Toward predecessors: a note about an order is not about a shop.
        assert_eq!(
            run("match n: Note match p: Shop where n->about = p select n.id"),
            ids(&[40])
        );
        assert_eq!(
            run("match n: Note where exists (match p: Order where n->about = p) select n.id"),
            ids(&[41])
        );
        // A join with no role on either side checks the type on the fact itself.
        assert_eq!(
            run("given s: Shop match p: Shop where p = s select p.name"),
            vec!["\"corner\"".to_string()]
        );
        assert!(run("given s: Shop match p: Order where p = s select p.id").is_empty());
    }
}

/// SQLite only: the steps of SQLite's query plans (`SCAN`, `(hash=?)`).
#[test]
fn every_statement_a_watch_runs_searches_indexes() {
    let (store, givens) = documented_store(Backend::Sqlite);
    for (text, _) in documented_examples() {
        let q = Query::parse(&text).unwrap();
        let watch = store.watch(&q, &givens_for(&q, &givens)).unwrap();
        for plan in watch.explain(&store).unwrap() {
            for step in &plan {
                assert!(
                    !step.starts_with("SCAN"),
                    "query:\n{text}\nscans: {step}\nplan: {plan:#?}"
                );
            }
        }
    }
}

#[test]
fn documented_errors_point_at_line_and_column() {
    let cases = [
        (
            "given s: Shop match o Shop.Order",
            (1, 23),
            "expected \":\" after the label, found \"Shop\"",
        ),
        (
            "given s: Shop match o: Shop.Order where o->shop = t select o",
            (1, 51),
            "unknown label t (known here: s, o)",
        ),
        (
            "given s: Shop match o: Shop.Order where o->shop = s match p: Shop.Payment where p.total > 1 select o",
            (1, 59),
            "match p is not joined to s, o",
        ),
        (
            "given s: Shop match o: Shop.Order where o->shop = s and o.total < true select o",
            (1, 65),
            "type mismatch: < compares numbers, text or bytes, not a boolean",
        ),
        (
            "given s: Shop match o: Shop.Order where o->shop = 3 select o",
            (1, 51),
            "type mismatch: o is a fact, compared here with 3",
        ),
        (
            "given s: Shop\nmatch o: Shop.Order where o->shop = s\n  and o.id = s select o",
            (3, 14),
            "type mismatch: o.id is a value",
        ),
        (
            "given s: Shop\nmatch o: Shop.Order where o->shop = s\n",
            (3, 1),
            "expected match",
        ),
        (
            "match o: Order where o.n in [] select o",
            (1, 30),
            "expected a value",
        ),
        (
            "given s: Shop given s: Shop select s",
            (1, 21),
            "label s is already used",
        ),
        (
            "given s: Shop select s.name \"x",
            (1, 29),
            "text without its closing",
        ),
        (
            "given s: Shop\nselect {a: s.name,\n  a: s.id}",
            (3, 3),
            "record key a repeated",
        ),
    ];
    for (text, (line, column), fragment) in cases {
        let err = Query::parse(text).unwrap_err();
        let Error::Query(e) = &err else {
            panic!("{text}: {err}")
        };
        assert!(e.message.contains(fragment), "{text}: {e}");
        assert_eq!((e.line, e.column), (line, column), "{text}: {e}");
        assert!(
            err.to_string()
                .starts_with(&format!("query at line {line}, column {column}: "))
        );
    }
}

#[test]
fn nesting_is_bounded_with_a_positioned_error() {
    let deep = |n: usize| {
        format!(
            "match s: Shop where {} s.name = 1 {} select s",
            "exists (match o: Shop.Order where o->shop = s and ".repeat(n),
            ")".repeat(n)
        )
    };
    // Labels repeat at each level, so a legal query of that depth fails the label check,
    // not the depth bound.
    let err = Query::parse(&deep(2)).unwrap_err().to_string();
    assert!(err.contains("label o is already used"), "{err}");
    for text in [
        deep(10_000),
        format!(
            "match s: Shop select {}s{}",
            "{a: ".repeat(10_000),
            "}".repeat(10_000)
        ),
        format!(
            "match s: Shop select {}o{}",
            "[match o: Shop.Order where o->shop = s select ".repeat(10_000),
            "]".repeat(10_000)
        ),
    ] {
        let err = Query::parse(&text).unwrap_err().to_string();
        assert!(err.contains("nesting deeper than 64 levels"), "{err}");
        assert!(err.starts_with("query at line 1, column "), "{err}");
    }
    let ok = format!(
        "given s: Shop select {}s.name{}",
        "{a: ".repeat(64),
        "}".repeat(64)
    );
    assert!(Query::parse(&ok).is_ok());
}

conformance! {
    fn the_builder_makes_the_same_query_as_the_text(b: Backend) {
        let (store, givens) = documented_store(b);
        let built = Query::builder()
            .given("s", "Shop")
            .matching(
                "o",
                "Shop.Order",
                [
                    Cond::join("o", &["shop"], "s", &[]),
                    Cond::not_exists([(
                        "sh",
                        "Shop.Shipment",
                        vec![Cond::join("sh", &["order"], "o", &[])],
                    )]),
                    Cond::field("o", "total", Op::Ge, 1),
                ],
            )
            .order_by_field("o", "id", true)
            .select(Projection::Field("o".into(), "id".into()))
            .unwrap();
        let text = Query::parse(
            "given s: Shop match o: Shop.Order where o->shop = s
               and not exists (match sh: Shop.Shipment where sh->order = o) and o.total >= 1
             order by o.id desc select o.id",
        )
        .unwrap();
        let g = givens_for(&built, &givens);
        assert_eq!(
            store.query(&built, &g).unwrap(),
            store.query(&text, &g).unwrap()
        );
        assert_eq!(store.query(&built, &g).unwrap().len(), 2);
        let disconnected = Query::builder()
            .given("s", "Shop")
            .matching("o", "Shop.Order", [])
            .select(Projection::Fact("o".into()));
        assert!(disconnected.unwrap_err().message.contains("not joined"));
    }
}

conformance! {
    fn a_query_of_givens_alone_selects_them(b: Backend) {
        let (store, givens) = documented_store(b);
        let q = Query::parse("given s: Shop select {name: s.name, hash: hash(s)}").unwrap();
        let rows = store.query(&q, &givens_for(&q, &givens)).unwrap();
        assert_eq!(rows.len(), 1);
        assert_eq!(rows[0].value.to_json()["name"], "corner");
        let empty = Query::builder()
            .given("s", "Shop")
            .matching("o", "Shop.Order", [Cond::exists([])])
            .select(Projection::Fact("o".into()));
        assert!(empty.unwrap_err().message.contains("at least one match"));
    }
}

conformance! {
    fn an_unbound_given_and_an_unknown_type_are_handled(b: Backend) {
        let (store, givens) = documented_store(b);
        let q = Query::parse("given s: Shop match o: Nothing where o->shop = s select o").unwrap();
        assert!(
            store
                .query(&q, &givens_for(&q, &givens))
                .unwrap()
                .is_empty()
        );
        let err = store.query(&q, &Givens::new()).unwrap_err();
        assert!(err.to_string().contains("given s is not bound"), "{err}");
        let absent = Givens::from([("s".to_string(), FactHash([7; 32]))]);
        assert!(store.query(&q, &absent).unwrap().is_empty());
    }
}

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
struct Shop {
    name: String,
}
impl FactType for Shop {
    const TYPE: &'static str = "Shop";
    const PREDECESSORS: &'static [(&'static str, Arity)] = &[];
}

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
struct Order {
    shop: Ref<Shop>,
    id: i64,
    total: f64,
    note: Option<String>,
    tags: Vec<String>,
    replaces: Option<Ref<Order>>,
    bundles: Vec<Ref<Shop>>,
}
impl FactType for Order {
    const TYPE: &'static str = "Shop.Order";
    const PREDECESSORS: &'static [(&'static str, Arity)] = &[
        ("shop", Arity::One),
        ("replaces", Arity::Optional),
        ("bundles", Arity::Many),
    ];
}

conformance! {
    fn typed_facts_save_load_and_query(b: Backend) {
        let store = b.store();
        let shop = store
            .save(&Shop {
                name: "corner".into(),
            })
            .unwrap();
        let order = Order {
            shop,
            id: 7,
            total: 2.0,
            note: None,
            tags: vec!["gift".into()],
            replaces: None,
            bundles: vec![],
        };
        let r = store.save(&order).unwrap();
        assert_eq!(store.load(r).unwrap(), order);
        // The stored fact is what the JSON form would give: 2.0 a float, id an integer.
        let fact = store.get(&r.hash()).unwrap().unwrap();
        assert_eq!(fact.field("total"), Some(&precedent::Value::Float(2.0)));
        assert_eq!(fact.field("id"), Some(&precedent::Value::Integer(7)));
        assert_eq!(fact.predecessors()["shop"].len(), 1);
        let q = Query::parse("given s: Shop match o: Shop.Order where o->shop = s select o").unwrap();
        let rows: Vec<(Ref<Order>, Order)> = store
            .query_as(&q, &Givens::from([("s".to_string(), shop.hash())]))
            .unwrap();
        assert_eq!(rows, vec![(r, order)]);
        let wrong = store.load(Ref::<Shop>::new(r.hash())).unwrap_err();
        assert!(matches!(wrong, Error::WrongType { .. }), "{wrong}");
    }
}

fn order_strategy() -> impl Strategy<Value = (String, Order)> {
    (
        "[a-z]{0,8}",
        any::<i64>(),
        any::<f64>().prop_filter("finite", |f| f.is_finite()),
        proptest::option::of("\\PC{0,12}"),
        proptest::collection::vec("[a-z]{1,4}", 0..3),
        proptest::collection::vec("[a-z]{1,6}", 0..3),
        any::<bool>(),
    )
        .prop_map(|(name, id, total, note, tags, bundle_names, replaces)| {
            let shop_hash = |n: &str| {
                precedent::query::typed::to_fact(&Shop { name: n.into() })
                    .unwrap()
                    .hash()
            };
            let mut bundles: Vec<Ref<Shop>> = bundle_names
                .iter()
                .map(|n| Ref::new(shop_hash(n)))
                .collect();
            bundles.sort_by_key(|r| r.hash());
            bundles.dedup();
            let order = Order {
                shop: Ref::new(shop_hash(&name)),
                id,
                total,
                note,
                tags,
                replaces: replaces.then(|| Ref::new(shop_hash("old"))),
                bundles,
            };
            (name, order)
        })
}

conformance! {
    /// A typed fact survives save and load exactly, and its hash is its content's.
    /// The cases share one database, emptied before each.
    fn typed_facts_round_trip(b: Backend) {
        let db = b.db();
        proptest!(ProptestConfig::with_cases(200), |((_name, order) in order_strategy())| {
            let fact = precedent::query::typed::to_fact(&order).unwrap();
            let back: Order = precedent::query::typed::from_fact(&fact).unwrap();
            prop_assert_eq!(&back, &order);
            let again = Fact::from_canonical(fact.canonical_bytes()).unwrap();
            let back: Order = precedent::query::typed::from_fact(&again).unwrap();
            prop_assert_eq!(&back, &order);
            db.reset();
            let store = db.store();
            let mut shops = vec![Shop { name: _name.clone() }, Shop { name: "old".into() }];
            let _ = &mut shops;
            for s in &shops {
                store.save(s).unwrap();
            }
            let r = store.save(&order).unwrap();
            prop_assert_eq!(r.hash(), fact.hash());
            if store.get(&r.hash()).unwrap().is_some() {
                prop_assert_eq!(store.load(r).unwrap(), order);
            }
        });
    }
}

conformance! {
    /// Queries built in Rust are held to the parser's nesting bound (64 levels of `exists`,
    /// records and collections): the builder refuses a deeper one with a clear message, and so
    /// does every compilation of a query whose fields were filled in directly, before anything
    /// recurses through it.
    fn built_queries_are_bounded_in_depth(b: Backend) {
        let exists = |n: usize| {
            let mut c = Cond::field("s", "name", Op::Eq, "x");
            for k in (1..=n).rev() {
                let o = format!("o{k}");
                c = Cond::exists([(
                    o.as_str(),
                    "Shop.Order",
                    vec![Cond::join(&o, &["shop"], "s", &[]), c],
                )]);
            }
            c
        };
        let record = |n: usize| {
            let mut p = Projection::Hash("s".into());
            for _ in 0..n {
                p = Projection::Record(vec![("a".into(), p)]);
            }
            p
        };
        let collection = |n: usize| {
            let mut p = Projection::Hash("s".into());
            for k in (1..=n).rev() {
                let o = format!("c{k}");
                // A type without facts: 4 orders at each of 64 levels would be 4^64 rows.
                p = Projection::Collection(Box::new(precedent::query::SubQuery {
                    matches: vec![precedent::query::Match {
                        label: o.as_str().into(),
                        type_name: "Shop.Refund".into(),
                        conditions: vec![Cond::join(&o, &["shop"], "s", &[])],
                    }],
                    order: Vec::new(),
                    limit: None,
                    select: p,
                }));
            }
            p
        };
        let build = |conds: Vec<precedent::query::Condition>, select: Projection| {
            Query::builder().matching("s", "Shop", conds).select(select)
        };
        let flat = || Projection::Hash("s".into());
        let (store, _) = documented_store(b);
        let message = "nesting deeper than 64 levels of exists, records and collections";
        for depth in [64, 65, 1_000] {
            let attempts = [
                build(vec![exists(depth)], flat()),
                build(vec![], record(depth)),
                build(vec![], collection(depth)),
            ];
            for built in attempts {
                match built {
                    Ok(q) => {
                        assert_eq!(depth, 64);
                        // (64 nested exists exceed SQLite's own expression depth, an error of
                        // its own; records and collections run.)
                        let ran = store.query(&q, &Givens::new());
                        assert!(!matches!(&ran, Err(Error::Query(_))), "{ran:?}");
                    }
                    Err(e) => {
                        assert!(depth > 64, "{e}");
                        assert_eq!(e.to_string(), format!("query: {message}"));
                    }
                }
            }
            // The same queries with their fields filled in directly, never checked.
            let direct = [
                (vec![exists(depth)], flat()),
                (vec![], record(depth)),
                (vec![], collection(depth)),
            ];
            for (conds, select) in direct {
                let q = Query {
                    givens: Vec::new(),
                    matches: vec![precedent::query::Match {
                        label: "s".into(),
                        type_name: "Shop".into(),
                        conditions: conds,
                    }],
                    order: Vec::new(),
                    limit: None,
                    select,
                };
                let ran = store.query(&q, &Givens::new());
                let watched = store.watch(&q, &Givens::new()).map(|_| ());
                if depth == 64 {
                    assert!(!matches!(&ran, Err(Error::Query(_))), "{ran:?}");
                    assert!(!matches!(&watched, Err(Error::Query(_))), "{watched:?}");
                } else {
                    for got in [ran.map(|_| ()), watched] {
                        assert!(
                            matches!(&got, Err(Error::Query(e)) if e.message == message),
                            "{got:?}"
                        );
                    }
                }
            }
        }
    }
}

fn pending_watch(store: &mut Store) -> (Fact, precedent::query::Watch) {
    let shop = Fact::builder("Shop")
        .field("name", "corner")
        .build()
        .unwrap();
    store.insert(&shop).unwrap();
    let watch = store
        .prepare("given s: Shop match o: Shop.Order where o->shop = s select o.id")
        .unwrap()
        .given("s", &shop)
        .unwrap()
        .watch()
        .unwrap();
    (shop, watch)
}

fn order_of(shop: &Fact, id: i64) -> Fact {
    Fact::builder("Shop.Order")
        .field("id", id)
        .predecessor("shop", shop.hash())
        .build()
        .unwrap()
}

fn added_ids(changes: impl IntoIterator<Item = precedent::Result<Change>>) -> Vec<i64> {
    changes
        .into_iter()
        .map(|c| match c.unwrap() {
            Change::Added(row) => row.value_as::<i64>().unwrap(),
            other => panic!("expected an addition, got {other:?}"),
        })
        .collect()
}

conformance! {
    fn watch_changes_end_at_their_deadline_with_what_came_before(b: Backend) {
        let mut store = b.store();
        let (shop, mut watch) = pending_watch(&mut store);
        store.insert(&order_of(&shop, 1)).unwrap();
        store.insert(&order_of(&shop, 2)).unwrap();
        let started = Instant::now();
        let ids = added_ids(watch.changes(&store, Stop::after(Duration::from_millis(150))));
        assert_eq!(ids, [1, 2]);
        let waited = started.elapsed();
        assert!(waited >= Duration::from_millis(150), "{waited:?}");
        assert!(waited < Duration::from_secs(5), "{waited:?}");
        // Nothing came after: the next delivery polls once and ends.
        assert!(added_ids(watch.changes(&store, Stop::after(Duration::ZERO))).is_empty());
    }
}

conformance! {
    fn watch_changes_bring_facts_of_another_connection_until_a_flag_stops_them(b: Backend) {
        let db = b.db();
        let path = db.location.clone();
        let mut store = db.store();
        let (shop, mut watch) = pending_watch(&mut store);
        let stop = Arc::new(AtomicBool::new(false));
        let writer = {
            let (stop, path, shop) = (stop.clone(), path.clone(), shop.clone());
            std::thread::spawn(move || {
                let other = Store::open(&path).unwrap();
                for id in 1..=3 {
                    std::thread::sleep(Duration::from_millis(20));
                    other.insert(&order_of(&shop, id)).unwrap();
                }
                // The last order is committed before the flag is set: it must be delivered.
                stop.store(true, Ordering::Release);
            })
        };
        let ids = added_ids(watch.changes(&store, Stop::when(stop)));
        writer.join().unwrap();
        assert_eq!(ids, [1, 2, 3]);
    }
}

conformance! {
    fn a_delivery_callback_ends_when_it_breaks(b: Backend) {
        let mut store = b.store();
        let (shop, mut watch) = pending_watch(&mut store);
        store.insert(&order_of(&shop, 1)).unwrap();
        let mut seen = Vec::new();
        watch
            .deliver(&store, Stop::never(), |change| {
                seen.push(change);
                ControlFlow::Break(())
            })
            .unwrap();
        assert_eq!(added_ids(seen.into_iter().map(Ok)), [1]);
        store.insert(&order_of(&shop, 2)).unwrap();
        store.insert(&order_of(&shop, 3)).unwrap();
        let mut calls = 0;
        watch
            .deliver(&store, Stop::after(Duration::from_millis(100)), |_| {
                calls += 1;
                ControlFlow::Continue(())
            })
            .unwrap();
        assert_eq!(calls, 2);
        assert_eq!(watch.results().len(), 3);
    }
}

conformance! {
    /// A given bound by hash finds its successors when it is released and of the declared
    /// type, and nothing when it is of another type or not released (on PostgreSQL a
    /// given whose row nothing reads is bound by its `seq`, looked up with its type).
    /// Results come in the order of the next label's `seq`, with and without a limit, and
    /// a paged read gives the same results.
    fn a_given_binds_only_a_released_fact_of_its_type(b: Backend) {
        let store = b.store();
        let shop = Fact::builder("Shop").field("name", "corner").build().unwrap();
        let other = Fact::builder("Depot").field("name", "corner").build().unwrap();
        let unknown = Fact::builder("Shop").field("name", "never stored").build().unwrap();
        store.insert(&shop).unwrap();
        store.insert(&other).unwrap();
        let mut orders = Vec::new();
        for i in 0..40 {
            let to = if i % 4 == 3 { &other } else { &shop };
            let o = Fact::builder("Order")
                .field("id", i)
                .predecessor("shop", to.hash())
                .build()
                .unwrap();
            store.insert(&o).unwrap();
            if i % 4 != 3 {
                orders.push(o.hash());
            }
        }
        // Shipped: every fifth order of the shop.
        for o in orders.iter().step_by(5) {
            let s = Fact::builder("Shipped").predecessor("order", *o).build().unwrap();
            store.insert(&s).unwrap();
        }
        let pending: Vec<String> = orders
            .iter()
            .enumerate()
            .filter(|(i, _)| i % 5 != 0)
            .map(|(_, h)| format!("\"{h}\""))
            .collect();
        let text = |limit: &str| {
            format!(
                "given s: Shop
                 match o: Order where o->shop = s
                   and not exists (match x: Shipped where x->order = o)
                 {limit} select hash(o)"
            )
        };
        let ask = |text: &str, given: &Fact| -> Vec<String> {
            let q = Query::parse(text).unwrap();
            let mut g = Givens::new();
            g.insert("s".into(), given.hash());
            store
                .query(&q, &g)
                .unwrap()
                .iter()
                .map(|r| r.value.to_json().to_string())
                .collect()
        };
        assert_eq!(ask(&text(""), &shop), pending);
        assert_eq!(ask(&text("limit 7"), &shop), pending[..7]);
        // The given's own hash in every result (on PostgreSQL filled in by the reader).
        let givens_hash = ask(&text("").replace("hash(o)", "hash(s)"), &shop);
        assert_eq!(givens_hash, vec![format!("\"{}\"", shop.hash()); pending.len()]);
        // The depot's orders are not a shop's: a given of another type binds nothing.
        assert_eq!(ask(&text(""), &other), Vec::<String>::new());
        assert_eq!(ask(&text(""), &unknown), Vec::<String>::new());
        // Pages of 4 read the same results in the same order.
        let q = Query::parse(&text("")).unwrap();
        let mut g = Givens::new();
        g.insert("s".into(), shop.hash());
        let paged: Vec<String> = store
            .query_pages(&q, &g, 4)
            .unwrap()
            .map(|r| r.unwrap().value.to_json().to_string())
            .collect();
        assert_eq!(paged, pending);
        if b == Backend::Postgres {
            // Bound by its seq, the given leaves the results in the edge index's order:
            // PostgreSQL sorts nothing.
            let plan = store.explain(&q, &g).unwrap().join("\n");
            assert!(!plan.contains("Sort"), "{plan}");
        }
    }
}

conformance! {
    /// A limited watch that filled its `n` results by polls does not report a result that
    /// sorts after them: no addition and removal of it in one poll.
    fn a_full_limited_watch_does_not_report_a_result_past_its_last(b: Backend) {
        let store = b.store();
        let q = Query::parse("match o: Order order by o.n limit 1 select o.n").unwrap();
        let mut watch = store.watch(&q, &Givens::new()).unwrap();
        assert!(watch.poll(&store).unwrap().is_empty());
        let order = |n: i64| Fact::builder("Order").field("n", n).build().unwrap();
        store.insert(&order(1)).unwrap();
        let changes = watch.poll(&store).unwrap();
        assert!(matches!(changes.as_slice(), [Change::Added(_)]), "{changes:?}");
        store.insert(&order(2)).unwrap();
        let changes = watch.poll(&store).unwrap();
        assert!(changes.is_empty(), "{changes:?}");
        // One that sorts first still takes the place.
        store.insert(&order(0)).unwrap();
        let changes = watch.poll(&store).unwrap();
        assert_eq!(changes.len(), 2, "{changes:?}");
        let got: Vec<i64> = watch.results().iter().map(|r| r.value_as::<i64>().unwrap()).collect();
        assert_eq!(got, vec![0]);
    }
}
