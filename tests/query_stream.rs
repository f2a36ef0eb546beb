//! Results as they are read: `Store::query_each`, `Store::query_iter` / `query_pages` and
//! `Store::watch_each` against `Store::query` on random stores and queries; one snapshot
//! per iterator while others write; `precedent query` printing before it has read
//! everything.

mod common;

use precedent::query::{Givens, Query, QueryRow};
use precedent::{Fact, FactHash, Store, Value};
use proptest::prelude::*;

/// A random shop store: a few shops, orders naming one each with an `n` field of mixed
/// kinds (or none), shipments for some orders. Returns the shops' hashes.
fn shop_store(store: &Store, rng: &mut fastrand::Rng) -> Vec<FactHash> {
    let shops: Vec<Fact> = (0..rng.usize(1..4))
        .map(|i| Fact::builder("Shop").field("name", format!("shop-{i}")))
        .map(|b| b.build().unwrap())
        .collect();
    let mut facts = shops.clone();
    for i in 0..rng.usize(0..80) {
        let mut b = Fact::builder("Shop.Order")
            .field("id", i as i64)
            .predecessor("shop", shops[rng.usize(0..shops.len())].hash());
        b = match rng.u8(0..5) {
            0 => b,
            1 => b.field("n", Value::Text(["a", "b", "B"][rng.usize(0..3)].into())),
            2 => b.field("n", Value::Float(rng.i64(-2..3) as f64 + 0.5)),
            _ => b.field("n", rng.i64(-3..4)),
        };
        let order = b.build().unwrap();
        if rng.bool() {
            let ship = Fact::builder("Shop.Shipment").field("k", rng.i64(0..3));
            facts.push(ship.predecessor("order", order.hash()).build().unwrap());
        }
        facts.push(order);
    }
    rng.shuffle(&mut facts);
    store.insert_batch(facts).unwrap();
    shops.iter().map(Fact::hash).collect()
}

/// A random query over that store: with or without a given shop, a shipment test, a
/// child collection, `order by` keys and a `limit`.
fn shop_query(rng: &mut fastrand::Rng, with_given: bool) -> String {
    let mut q = String::new();
    if with_given {
        q.push_str("given s: Shop match o: Shop.Order where o->shop = s");
    } else {
        q.push_str("match o: Shop.Order where o.id >= 0");
    }
    match rng.u8(0..3) {
        0 => q.push_str(" and not exists (match sh: Shop.Shipment where sh->order = o)"),
        1 => q.push_str(" and o.n > 0"),
        _ => {}
    }
    let orders = [
        "",
        " order by o.n",
        " order by o.n desc",
        " order by o.n, seq(o) desc",
    ];
    q.push_str(orders[rng.usize(0..orders.len())]);
    if rng.bool() {
        q.push_str(&format!(" limit {}", rng.usize(0..30)));
    }
    let selects = [
        " select o",
        " select o.n",
        " select {id: o.id, ships: [match c: Shop.Shipment where c->order = o select c.k]}",
    ];
    q.push_str(selects[rng.usize(0..selects.len())]);
    q
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    /// Every streaming form yields `Store::query`'s results, in its order, whatever the
    /// page size, and a query's own `limit` holds across pages.
    #[test]
    fn streamed_results_equal_the_collected_ones(seed in any::<u64>(), with_given in any::<bool>()) {
        let mut rng = fastrand::Rng::with_seed(seed);
        let store = Store::open_in_memory().unwrap();
        let shops = shop_store(&store, &mut rng);
        let text = shop_query(&mut rng, with_given);
        let q = Query::parse(&text).unwrap();
        let givens = if with_given {
            Givens::from([("s".to_string(), shops[rng.usize(0..shops.len())])])
        } else {
            Givens::new()
        };
        let all = store.query(&q, &givens).unwrap();
        if let Some(n) = q.limit {
            prop_assert!(all.len() as u64 <= n, "{text}");
        }

        let mut each = Vec::new();
        store.query_each(&q, &givens, |row| { each.push(row); Ok(()) }).unwrap();
        prop_assert_eq!(&each, &all, "query_each: {}", text);

        let page = rng.usize(1..7);
        let paged: Vec<QueryRow> =
            store.query_pages(&q, &givens, page).unwrap().collect::<Result<_, _>>().unwrap();
        prop_assert_eq!(&paged, &all, "pages of {}: {}", page, text);

        let iter: Vec<QueryRow> =
            store.query_iter(&q, &givens).unwrap().collect::<Result<_, _>>().unwrap();
        prop_assert_eq!(&iter, &all, "query_iter: {}", text);

        let mut initial = Vec::new();
        let watch = store.watch_each(&q, &givens, |row| { initial.push(row.clone()); Ok(()) }).unwrap();
        prop_assert_eq!(&initial, &all, "watch_each: {}", text);
        let kept: Vec<QueryRow> = watch.results().into_iter().cloned().collect();
        prop_assert_eq!(&kept, &all, "watch results: {}", text);
    }
}

/// Stores a shop and its orders with ids `0..orders`; returns the shop.
fn shop_with_orders(store: &Store, orders: i64) -> Fact {
    let shop = common::shop::shop("c");
    store.insert(&shop).unwrap();
    store
        .insert_batch((0..orders).map(|i| order(&shop, i)).collect())
        .unwrap();
    shop
}

fn order(shop: &Fact, id: i64) -> Fact {
    common::shop::order(shop, "id", id)
}

#[test]
fn an_iterator_reads_one_snapshot_while_others_write() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.db");
    let store = Store::open(&path).unwrap();
    let shop = shop_with_orders(&store, 2_500);
    let q = Query::parse("match o: Shop.Order select o.id").unwrap();

    let mut it = store.query_pages(&q, &Givens::new(), 100).unwrap();
    let first = it.next().unwrap().unwrap();
    // Another connection on the same file, and this store's own writer, add orders
    // that sort after and before the results still to be read.
    let other = Store::open(&path).unwrap();
    other
        .insert_batch((2_500..3_000).map(|i| order(&shop, i)).collect())
        .unwrap();
    std::thread::scope(|t| {
        t.spawn(|| store.insert(&order(&shop, -1)).unwrap());
    });
    let rest: Vec<QueryRow> = it.collect::<Result<_, _>>().unwrap();

    let ids: Vec<i64> = std::iter::once(&first)
        .chain(&rest)
        .map(|r| r.value.to_json().as_i64().unwrap())
        .collect();
    assert_eq!(ids, (0..2_500).collect::<Vec<_>>());
    assert_eq!(store.query(&q, &Givens::new()).unwrap().len(), 3_001);
}

#[test]
fn a_limit_holds_across_pages_and_an_iterator_stops_early() {
    let store = Store::open_in_memory().unwrap();
    shop_with_orders(&store, 50);
    let q = Query::parse("match o: Shop.Order order by o.id desc limit 17 select o.id").unwrap();
    let ids: Vec<i64> = store
        .query_pages(&q, &Givens::new(), 5)
        .unwrap()
        .map(|r| r.unwrap().value.to_json().as_i64().unwrap())
        .collect();
    assert_eq!(ids, (33..50).rev().collect::<Vec<_>>());

    // A callback's error ends the run and is returned.
    let mut seen = 0;
    let err = store
        .query_each(&q, &Givens::new(), |_| {
            seen += 1;
            if seen == 3 {
                Err(precedent::Error::Io(std::io::Error::other("enough")))
            } else {
                Ok(())
            }
        })
        .unwrap_err();
    assert_eq!(seen, 3);
    assert!(err.to_string().contains("enough"), "{err}");
}

/// `precedent query --json` prints its first result while it is still computing the
/// others. The query's output is small (it fits in the pipe, so the child is never held
/// up by an unread pipe) and each result's child collection is costly, so a command that
/// held every result before printing would have exited by the time its first line came.
#[cfg(feature = "cli")]
#[test]
fn the_query_command_prints_its_first_result_before_it_has_read_the_last() {
    use std::io::{BufRead, BufReader, Read};
    use std::process::{Command, Stdio};

    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("q.db");
    let store = Store::open(&db).unwrap();
    let orders = 2_000;
    shop_with_orders(&store, orders);
    drop(store);
    // Each result's collection tests every order of the shop, and matches none.
    let text = "match o: Shop.Order match p: Shop where o->shop = p
        select [match x: Shop.Order where x->shop = p and x.id < 0 select x.id]";
    let mut child = Command::new(env!("CARGO_BIN_EXE_precedent"))
        .arg("--db")
        .arg(&db)
        .args(["--json", "query", text])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut first = String::new();
    out.read_line(&mut first).unwrap();
    assert_eq!(first.trim(), "[]");
    // Long enough for a command that had finished computing to exit.
    std::thread::sleep(std::time::Duration::from_millis(300));
    assert!(
        child.try_wait().unwrap().is_none(),
        "the command had finished by the time its first result was read"
    );

    let mut rest = String::new();
    out.read_to_string(&mut rest).unwrap();
    let mut err = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    assert!(child.wait().unwrap().success(), "{err}");
    assert_eq!(1 + rest.lines().count(), orders as usize);
    assert_eq!(err.trim(), format!("{orders} results"));
}
