//! The core's clients on PostgreSQL: the query functions of
//! `schema/postgres/002_query_functions.sql` against `precedent::predicate`, on a real
//! cluster started by `tests/common/pg.rs` (the test returns early, after a loud
//! `SKIPPED` line, where PostgreSQL is not installed; under CI that is a failure).
//! The tests on a store need the `postgres` feature (the backend).

mod common;

use std::cmp::Ordering;
use std::collections::BTreeMap;
use std::sync::OnceLock;

use common::pg::{self, PgDb};
use precedent::predicate::{self, Op, SortKey};
use precedent::{Fact, Value};
use proptest::prelude::*;
use proptest::test_runner::TestCaseError;

const FUNCTIONS: &str = include_str!("../schema/postgres/002_query_functions.sql");

/// One database with the query functions, shared by the cases of a property.
fn functions_db() -> Option<&'static PgDb> {
    static DB: OnceLock<Option<PgDb>> = OnceLock::new();
    DB.get_or_init(|| {
        let db = pg::db()?;
        db.psql(FUNCTIONS);
        Some(db)
    })
    .as_ref()
}

/// Integers where conversions to binary64 and the 64-bit limits bite.
fn special_ints() -> Vec<i128> {
    let two53 = 1i128 << 53;
    vec![
        0,
        1,
        -1,
        2,
        two53,
        two53 + 1,
        two53 - 1,
        -two53 - 1,
        i64::MAX as i128,
        i64::MIN as i128,
        i64::MAX as i128 - 1,
        1i128 << 63,
        (1i128 << 63) + 1,
        u64::MAX as i128,
        -(1i128 << 64),
        -(1i128 << 64) + 1,
    ]
}

fn special_floats() -> Vec<f64> {
    vec![
        0.0,
        -0.0,
        1.0,
        -1.0,
        0.5,
        1.5,
        -1.5,
        2.0,
        1.1,
        65504.0,
        100000.0,
        f64::INFINITY,
        f64::NEG_INFINITY,
        f64::MAX,
        f64::MIN,
        f64::MIN_POSITIVE,
        5e-324,
        -5e-324,
        f64::from_bits(0x000f_ffff_ffff_ffff),
        9_007_199_254_740_992.0,
        9_007_199_254_740_994.0,
        9_223_372_036_854_775_808.0,
        -9_223_372_036_854_775_808.0,
        18_446_744_073_709_551_616.0,
        -18_446_744_073_709_551_616.0,
        1.7014118346046923e38,
        -1.7014118346046923e38,
        1e300,
        5.960464477539063e-8,
        1.401298464324817e-45,
    ]
}

fn leaf() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        (-4i128..4).prop_map(Value::Integer),
        any::<i64>().prop_map(|i| Value::Integer(i.into())),
        (-(1i128 << 64)..(1i128 << 64)).prop_map(Value::Integer),
        prop::sample::select(special_ints()).prop_map(Value::Integer),
        (-8i32..8).prop_map(|n| Value::Float(f64::from(n) / 2.0)),
        any::<f64>()
            .prop_filter("NaN is not a value", |f| !f.is_nan())
            .prop_map(Value::Float),
        prop::sample::select(special_floats()).prop_map(Value::Float),
        "[ab\u{e9}\u{20ac}\u{1f600}]{0,3}".prop_map(Value::Text),
        // Long enough for a length byte after the head (24 bytes and more).
        "[a\u{e9}]{20,40}".prop_map(Value::Text),
        prop::collection::vec(any::<u8>(), 22..40).prop_map(Value::Bytes),
        prop::collection::vec(prop::sample::select(vec![0u8, 1, 0x61, 0xc3, 0xff]), 0..3)
            .prop_map(Value::Bytes),
    ]
}

fn value() -> impl Strategy<Value = Value> {
    leaf().prop_recursive(2, 8, 3, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..3).prop_map(Value::Array),
            prop::collection::btree_map("[ab]{1,2}", inner, 0..3).prop_map(Value::Map),
        ]
    })
}

/// A value near `v`: itself, the same number as the other kind, a neighbour, or any.
fn near(v: Value) -> impl Strategy<Value = Value> {
    let twin = match &v {
        Value::Integer(i) => Value::Float(*i as f64),
        Value::Float(f) if f.fract() == 0.0 && f.abs() < 1.8e19 => Value::Integer(*f as i128),
        Value::Float(f) => Value::Float(-f),
        Value::Array(items) => Value::Array(items.iter().rev().cloned().collect()),
        Value::Text(t) => Value::Text(format!("{t}a")),
        other => other.clone(),
    };
    let bump = match &v {
        Value::Integer(i) => Value::Integer((i + 1).min(u64::MAX as i128)),
        Value::Float(f) => Value::Float(f64::from_bits(f.to_bits() + 1)),
        other => other.clone(),
    };
    let bump = match bump {
        Value::Float(f) if f.is_nan() => Value::Float(0.0),
        other => other,
    };
    prop_oneof![Just(v), Just(twin), Just(bump), value()]
}

/// A field name whose head takes two bytes.
const LONG_NAME: &str = "a field name longer than 24 bytes";

/// A fact of type `T` with the field `name` set to `v` (absent: `None`) among others.
fn fact(name: &str, v: Option<&Value>) -> Fact {
    let mut b = Fact::builder("T")
        .field("c", 1)
        .field("zzzz", Value::Array(vec![Value::Text("x".into())]))
        .field(LONG_NAME.replace('e', "f"), Value::Text("y".repeat(30)));
    if let Some(v) = v {
        b = b.field(name, v.clone());
    }
    b.build().expect("a valid fact")
}

/// The predicate values as the query compiler binds them: a carrier fact `{"v": [..]}`.
fn carrier(values: &[Value]) -> Vec<u8> {
    Fact::builder("q")
        .field("v", Value::Array(values.to_vec()))
        .build()
        .expect("a valid carrier")
        .canonical_bytes()
        .to_vec()
}

fn lit(bytes: &[u8]) -> String {
    format!("'\\x{}'::bytea", hex::encode(bytes))
}

fn name_lit(name: &str) -> String {
    format!("'{}'", name.replace('\'', "''"))
}

const OPS: [Op; 6] = [Op::Eq, Op::Ne, Op::Lt, Op::Le, Op::Gt, Op::Ge];

/// One checked expression: its SQL and what `predicate` says.
struct Check {
    sql: String,
    want: String,
    what: String,
}

fn tests_for(name: &str, field: Option<&Value>, value: &Value, checks: &mut Vec<Check>) {
    let f = fact(name, field);
    for op in OPS {
        let sql = format!(
            "pq_test({}, {}, {}, {})::int",
            lit(f.canonical_bytes()),
            name_lit(name),
            op as i64,
            lit(&carrier(std::slice::from_ref(value)))
        );
        let want = i32::from(predicate::test(field, op, value)).to_string();
        checks.push(Check {
            sql,
            want,
            what: format!("{field:?} {} {value:?}", op.text()),
        });
    }
}

fn in_for(name: &str, field: Option<&Value>, values: &[Value], checks: &mut Vec<Check>) {
    let f = fact(name, field);
    checks.push(Check {
        sql: format!(
            "pq_test({}, {}, 6, {})::int",
            lit(f.canonical_bytes()),
            name_lit(name),
            lit(&carrier(values))
        ),
        want: i32::from(predicate::test_in(field, values)).to_string(),
        what: format!("{field:?} in {values:?}"),
    });
}

/// The order of two sort keys as `-1`, `0`, `1`; `n` when either is SQL NULL.
fn order_of(a: &SortKey, b: &SortKey) -> String {
    if *a == SortKey::Null || *b == SortKey::Null {
        return if a == b { "0" } else { "n" }.into();
    }
    match a.partial_cmp(b) {
        Some(Ordering::Less) => "-1",
        Some(Ordering::Equal) => "0",
        Some(Ordering::Greater) => "1",
        None => "?",
    }
    .into()
}

fn order_check(name: &str, a: Option<&Value>, b: Option<&Value>, checks: &mut Vec<Check>) {
    let (fa, fb) = (fact(name, a), fact(name, b));
    let (ka, kb) = (
        format!(
            "pq_field({}, {})",
            lit(fa.canonical_bytes()),
            name_lit(name)
        ),
        format!(
            "pq_field({}, {})",
            lit(fb.canonical_bytes()),
            name_lit(name)
        ),
    );
    checks.push(Check {
        sql: format!(
            "CASE WHEN {ka} IS NULL AND {kb} IS NULL THEN '0' \
                  WHEN {ka} IS NULL OR {kb} IS NULL THEN 'n' \
                  WHEN {ka} < {kb} THEN '-1' WHEN {ka} = {kb} THEN '0' ELSE '1' END"
        ),
        want: order_of(&predicate::sort_key(a), &predicate::sort_key(b)),
        what: format!("order of {a:?} against {b:?}"),
    });
}

/// Runs the checks in one statement and compares each column.
fn run(db: &PgDb, checks: &[Check]) -> Result<(), TestCaseError> {
    let sql = format!(
        "SELECT {}",
        checks
            .iter()
            .map(|c| c.sql.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    );
    let out = db.psql(&sql);
    let got: Vec<&str> = out.split('|').collect();
    prop_assert_eq!(got.len(), checks.len(), "columns of {}", out);
    for (c, g) in checks.iter().zip(got) {
        prop_assert_eq!(g, c.want.as_str(), "{}", c.what);
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]

    /// `pq_test` and `pq_field` on PostgreSQL agree with `predicate::test`, `test_in` and
    /// `sort_key` for every operator, both ways round, a field present or missing, and
    /// values of every kind (numbers of both kinds and at their limits, multibyte text,
    /// bytes, null, booleans, arrays, maps).
    #[test]
    fn query_functions_agree_with_predicate(
        (a, b) in value().prop_flat_map(|a| (Just(a.clone()), near(a))),
        c in value(),
        name in prop::sample::select(vec!["a", "\u{e9}t\u{e9}", "b", LONG_NAME]),
        missing in prop::bool::weighted(0.1),
    ) {
        let Some(db) = functions_db() else { return Ok(()) };
        let field = (!missing).then_some(&a);
        let mut checks = Vec::new();
        tests_for(name, field, &b, &mut checks);
        tests_for(name, Some(&b), &a, &mut checks);
        tests_for(name, Some(&a), &a, &mut checks);
        in_for(name, field, &[c.clone(), b.clone()], &mut checks);
        in_for(name, Some(&b), std::slice::from_ref(&a), &mut checks);
        in_for(name, Some(&c), &[], &mut checks);
        order_check(name, field, Some(&b), &mut checks);
        order_check(name, Some(&b), field, &mut checks);
        order_check(name, Some(&c), Some(&a), &mut checks);
        run(db, &checks)?;
    }
}

/// Cases that once needed care, checked every run: exact integer and float comparison
/// at 2^53 and the 64-bit limits, -0.0, infinities, bytewise text, kinds apart.
#[test]
fn query_functions_on_known_cases() {
    let Some(db) = functions_db() else { return };
    let two53 = 1i128 << 53;
    let pairs: Vec<(Value, Value)> = vec![
        (Value::Integer(two53 + 1), Value::Float(two53 as f64)),
        (Value::Integer(two53), Value::Float(two53 as f64)),
        (
            Value::Integer(i64::MAX.into()),
            Value::Float(i64::MAX as f64),
        ),
        (
            Value::Integer(u64::MAX.into()),
            Value::Float(18_446_744_073_709_551_616.0),
        ),
        (
            Value::Integer(-(1i128 << 64)),
            Value::Float(-18_446_744_073_709_551_616.0),
        ),
        (Value::Integer(-1), Value::Float(-1.5)),
        (Value::Integer(0), Value::Float(-0.0)),
        (Value::Float(0.0), Value::Float(-0.0)),
        (
            Value::Integer(i64::MIN.into()),
            Value::Float(f64::NEG_INFINITY),
        ),
        (Value::Float(f64::INFINITY), Value::Integer(u64::MAX.into())),
        (Value::Text("B".into()), Value::Text("a".into())),
        (Value::Text("\u{e9}".into()), Value::Text("z".into())),
        (Value::Text("a".into()), Value::Bytes(b"a".to_vec())),
        (Value::Bool(true), Value::Bool(false)),
        (Value::Null, Value::Null),
        (
            Value::Array(vec![Value::Float(-0.0)]),
            Value::Array(vec![Value::Float(0.0)]),
        ),
        (
            Value::Array(vec![Value::Integer(1)]),
            Value::Array(vec![Value::Float(1.0)]),
        ),
        (
            Value::Map(BTreeMap::from([("k".to_string(), Value::Integer(1))])),
            Value::Map(BTreeMap::from([("k".to_string(), Value::Integer(1))])),
        ),
    ];
    let mut checks = Vec::new();
    for (a, b) in &pairs {
        tests_for("a", Some(a), b, &mut checks);
        tests_for("a", Some(b), a, &mut checks);
        in_for("a", Some(a), std::slice::from_ref(b), &mut checks);
        order_check("a", Some(a), Some(b), &mut checks);
        order_check("a", Some(b), Some(a), &mut checks);
    }
    tests_for("a", None, &Value::Integer(1), &mut checks);
    in_for("a", None, &[Value::Null], &mut checks);
    order_check("a", None, Some(&Value::Integer(1)), &mut checks);
    for chunk in checks.chunks(40) {
        if let Err(e) = run(db, chunk) {
            panic!("{e}");
        }
    }
}

/// The clients on a PostgreSQL store, each run on SQLite too and compared: what they
/// print must be the same on both backends.
#[cfg(feature = "postgres")]
mod on_a_store {
    use std::collections::HashSet;
    use std::sync::{Arc, Mutex};

    use precedent::clock::ManualClock;
    use precedent::query::Givens;
    use precedent::queue::{Completion, FailOutcome, Failure, QueueSpec};
    use precedent::{Fact, FactHash, Store, StoreOptions, Value};

    use super::pg;

    /// Runs `f` on a new SQLite store and a new PostgreSQL store, each with a clock that
    /// stands still (backoffs and leases do not depend on how fast a backend is);
    /// returns both outputs.
    fn on_both(f: impl Fn(&Store) -> String) -> Option<(String, String)> {
        let still = || StoreOptions {
            clock: ManualClock::starting_at(1_700_000_000_000),
            ..StoreOptions::default()
        };
        let db = pg::db()?;
        let pg = Store::open_postgres(&db.url, still()).expect("open on PostgreSQL");
        let sqlite = Store::open_in_memory_with(still()).expect("open SQLite");
        Some((f(&sqlite), f(&pg)))
    }

    fn order(shop: &Fact, id: i64, total: Value, state: Option<&str>) -> Fact {
        let mut b = Fact::builder("Shop.Order")
            .field("id", id)
            .field("total", total)
            .predecessor("shop", shop.hash());
        if let Some(s) = state {
            b = b.field("state", s);
        }
        b.build().unwrap()
    }

    /// A shop with orders whose totals mix integers, floats, text, null and missing.
    fn shop_data(store: &Store) -> Fact {
        let shop = Fact::builder("Shop")
            .field("name", "corner")
            .build()
            .unwrap();
        let totals = [
            Value::Integer(8),
            Value::Float(12.5),
            Value::Integer(30),
            Value::Float(8.0),
            Value::Integer((1i128 << 53) + 1),
            Value::Float((1u64 << 53) as f64),
            Value::Text("ten".into()),
            Value::Null,
            Value::Float(-0.0),
            Value::Integer(-3),
            Value::Bytes(vec![1, 2]),
            Value::Float(f64::INFINITY),
        ];
        let mut facts = vec![shop.clone()];
        for (i, t) in totals.into_iter().enumerate() {
            let state = ["new", "open", "closed"].get(i % 4).copied();
            facts.push(order(&shop, i as i64, t, state));
        }
        for f in &facts {
            store.insert(f).unwrap();
        }
        let ship = Fact::builder("Shop.Shipment")
            .field("carrier", "post")
            .predecessor("order", facts[2].hash())
            .build()
            .unwrap();
        store.insert(&ship).unwrap();
        shop
    }

    const QUERIES: &[&str] = &[
        "given s: Shop match o: Shop.Order where o->shop = s and o.total >= 8 \
         and o.state in [\"new\", \"open\"] order by o.total desc limit 2 \
         select {id: o.id, total: o.total}",
        "given s: Shop match o: Shop.Order where o->shop = s order by o.total select o.id",
        "given s: Shop match o: Shop.Order where o->shop = s order by o.total desc, o.state \
         select o.id",
        "given s: Shop match o: Shop.Order where o->shop = s and o.total != 8 select o.id",
        "given s: Shop match o: Shop.Order where o->shop = s and o.total < \"z\" select o.id",
        "given s: Shop match o: Shop.Order where o->shop = s \
         and not exists (match sh: Shop.Shipment where sh->order = o) order by o.state \
         select o.id",
        "given s: Shop match sh: Shop.Shipment where sh->order->shop = s \
         order by sh.carrier select sh.carrier",
        "match o: Shop.Order where o.state = \"new\" order by o.id desc select o.id",
    ];

    #[test]
    fn queries_give_what_they_give_on_sqlite() {
        let Some((sqlite, pg)) = on_both(|store| {
            let shop = shop_data(store);
            let givens = Givens::from([("s".to_string(), shop.hash())]);
            let mut out = String::new();
            for q in QUERIES {
                let rows = store.query_text(q, &givens).unwrap_or_else(|e| {
                    let q = precedent::query::Query::parse(q).unwrap();
                    panic!("{e}: {:?}", store.compiled_sql(&q, &givens))
                });
                let q = precedent::query::Query::parse(q).unwrap();
                out.push_str(&format!("{q:?}\n"));
                for r in rows {
                    out.push_str(&format!("{}\n", r.value.to_json()));
                }
                // A page at a time: each page starts after the last row's keys.
                for page in [1, 2, 5] {
                    let paged: Vec<String> = store
                        .query_pages(&q, &givens, page)
                        .unwrap()
                        .map(|r| r.unwrap().value.to_json().to_string())
                        .collect();
                    out.push_str(&format!("pages of {page}: {}\n", paged.join(" ")));
                }
            }
            out
        }) else {
            return;
        };
        assert_eq!(pg, sqlite);
    }

    fn ship_queue(store: &Store, max_attempts: u32) {
        let done = Completion {
            type_name: "Shipment".into(),
            role: "order".into(),
        };
        let mut spec = QueueSpec::new("ship", "Order", vec![done]);
        spec.retry.max_attempts = max_attempts;
        store.declare_queue(&spec).unwrap();
    }

    fn plain_order(id: i64) -> Fact {
        Fact::builder("Order").field("id", id).build().unwrap()
    }

    fn stats_line(store: &Store) -> String {
        let s = store.queue_stats("ship").unwrap();
        format!(
            "ready {} leased {} delayed {} blocked {} dead {} poison {} completed {} discarded {}",
            s.ready, s.leased, s.delayed, s.blocked, s.dead, s.poison, s.completed, s.discarded
        )
    }

    #[test]
    fn queue_claims_complete_fail_and_dead_letter_as_on_sqlite() {
        let Some((sqlite, pg)) = on_both(|store| {
            let mut out = Vec::new();
            ship_queue(store, 2);
            let orders: Vec<Fact> = (0..5).map(plain_order).collect();
            for o in &orders {
                store.insert(o).unwrap();
            }
            out.push(stats_line(store));
            let leases = store.claim("ship", 10).unwrap();
            out.push(format!("claimed {}", leases.len()));
            out.push(stats_line(store));
            // Completed with a shipment, in the handler's transaction.
            store
                .complete(&leases[0], |w| {
                    w.insert(&leases[0].completion().field("carrier", "post").build()?)?;
                    Ok(())
                })
                .unwrap();
            // A handler that forgets the completion writes nothing.
            let forgot = store.complete(&leases[1], |_| Ok(()));
            out.push(format!("forgot: {}", forgot.is_err()));
            let outcomes = [
                store.fail(&leases[1], Failure::Transient("try again".into())),
                store.fail(&leases[2], Failure::Permanent("no such street".into())),
                store.fail(&leases[3], Failure::Poison("bad order".into())),
            ];
            for o in outcomes {
                out.push(match o.unwrap() {
                    FailOutcome::Retry { .. } => "retry".to_string(),
                    FailOutcome::DeadLettered(_) => "dead letter".to_string(),
                    FailOutcome::Poisoned(_) => "poison".to_string(),
                    other => format!("{other:?}"),
                });
            }
            store.release(leases[4].clone()).unwrap();
            out.push(stats_line(store));
            // A completion under a lease that ended is refused.
            let late = store.complete(&leases[0], |_| Ok(()));
            out.push(format!("late: {}", late.is_err()));
            let dead = store
                .queue_items("ship", Some(precedent::queue::ItemState::Dead), 10)
                .unwrap();
            out.push(format!("dead items {}", dead.len()));
            store.redrive("ship", &orders[2].hash()).unwrap();
            let poison = store
                .queue_items("ship", Some(precedent::queue::ItemState::Poison), 10)
                .unwrap();
            out.push(format!("poison items {}", poison.len()));
            store
                .discard("ship", &orders[3].hash(), "not ours")
                .unwrap();
            out.push(stats_line(store));
            let all = store.queue_items("ship", None, 10).unwrap();
            out.push(format!("items {}", all.len()));
            let again = store.claim("ship", 10).unwrap();
            out.push(format!("claimed again {}", again.len()));
            out.push(format!("{:?}", store.queue_check(None).unwrap()));
            let extended = store.extend(&again[0]).unwrap();
            out.push(format!(
                "extended by {}",
                extended.expires_at_ms - again[0].expires_at_ms
            ));
            let item = store
                .queue_item("ship", &again[0].input.hash())
                .unwrap()
                .unwrap();
            out.push(format!("{:?} attempts {}", item.state, item.attempts));
            // A queue declared over stored facts is back-filled from them.
            let audit = QueueSpec::new(
                "audit",
                "Order",
                vec![Completion {
                    type_name: "Audited".into(),
                    role: "order".into(),
                }],
            );
            store.declare_queue(&audit).unwrap();
            let s = store.queue_stats("audit").unwrap();
            out.push(format!("audit ready {}", s.ready));
            store.drop_queue("audit").unwrap();
            out.push(format!("queues {}", store.queues().unwrap().len()));
            out.join("\n")
        }) else {
            return;
        };
        assert_eq!(pg, sqlite);
    }

    /// Two stores (two connections, as two processes would have) claim from one queue at
    /// once: no input is ever held by both, and each is completed once.
    #[test]
    fn two_claimers_never_hold_one_input() {
        let Some(db) = pg::db() else { return };
        let open = || Store::open_postgres(&db.url, StoreOptions::default()).unwrap();
        let first = open();
        ship_queue(&first, 5);
        const N: i64 = 300;
        for i in 0..N {
            first.insert(&plain_order(i)).unwrap();
        }
        let live: Arc<Mutex<HashSet<FactHash>>> = Arc::default();
        let done: Arc<Mutex<Vec<FactHash>>> = Arc::default();
        let workers: Vec<_> = (0..2)
            .map(|_| {
                let (store, live, done) = (open(), live.clone(), done.clone());
                std::thread::spawn(move || {
                    loop {
                        let leases = store.claim("ship", 3).unwrap();
                        if leases.is_empty() {
                            break;
                        }
                        for l in &leases {
                            let h = l.input.hash();
                            assert!(live.lock().unwrap().insert(h), "{h} has two live leases");
                        }
                        for l in leases {
                            let h = l.input.hash();
                            store
                                .complete(&l, |w| {
                                    w.insert(&l.completion().build()?)?;
                                    Ok(())
                                })
                                .unwrap();
                            live.lock().unwrap().remove(&h);
                            done.lock().unwrap().push(h);
                        }
                    }
                })
            })
            .collect();
        for w in workers {
            w.join().expect("a worker panicked");
        }
        let done = done.lock().unwrap();
        let distinct: HashSet<&FactHash> = done.iter().collect();
        assert_eq!(done.len() as i64, N, "each input completed once");
        assert_eq!(distinct.len() as i64, N);
        assert_eq!(first.queue_stats("ship").unwrap().completed, N as u64);
    }

    #[test]
    fn causal_order_batches_at_most_once_and_watches_as_on_sqlite() {
        let Some((sqlite, pg)) = on_both(|store| {
            let mut out = Vec::new();
            ship_queue(store, 3);
            let mut once = QueueSpec::new(
                "notify",
                "Order",
                vec![Completion {
                    type_name: "Notified".into(),
                    role: "order".into(),
                }],
            );
            once.semantics = precedent::queue::Semantics::AtMostOnce;
            // Unordered: an input unblocked inside a claim is offered in that claim only
            // if the clock has not moved on, on either backend.
            once.ordering = precedent::queue::Ordering::None;
            store.declare_queue(&once).unwrap();
            let q = precedent::query::Query::parse(
                "match o: Order where o.id >= 1 order by o.id desc select o.id",
            )
            .unwrap();
            let mut watch = store.watch(&q, &Givens::new()).unwrap();
            // A follow-up order waits for the order it follows (causal ordering).
            let first = plain_order(1);
            let follow = Fact::builder("Order")
                .field("id", 2)
                .predecessor("after", first.hash())
                .build()
                .unwrap();
            let other = plain_order(3);
            for f in [&first, &follow, &other] {
                store.insert(f).unwrap();
            }
            out.push(format!("{:?}", watch.poll(store).unwrap().len()));
            out.push(stats_line(store));
            let leases = store.claim("ship", 10).unwrap();
            out.push(format!("claimed {}", leases.len()));
            let results = store
                .complete_batch(&leases, |w, l| {
                    if l.input.field("id") == Some(&Value::Integer(3)) {
                        return Err(precedent::Error::Queue {
                            queue: "ship".into(),
                            reason: "handler failed".into(),
                        });
                    }
                    w.insert(&l.completion().build()?)?;
                    Ok(())
                })
                .unwrap();
            out.push(format!(
                "{:?}",
                results.iter().map(Result::is_ok).collect::<Vec<_>>()
            ));
            out.push(stats_line(store));
            let next = store.claim("ship", 10).unwrap();
            out.push(format!(
                "then {:?}",
                next.iter()
                    .map(|l| l.input.field("id").cloned())
                    .collect::<Vec<_>>()
            ));
            let delivered = store.claim("notify", 10).unwrap();
            out.push(format!("delivered {}", delivered.len()));
            out.push(format!(
                "again {}",
                store.claim("notify", 10).unwrap().len()
            ));
            out.push(format!(
                "{:?}",
                store.queue_stats("notify").unwrap().completed
            ));
            out.push(format!(
                "{}",
                store.query(&q, &Givens::new()).unwrap().len()
            ));
            out.join("\n")
        }) else {
            return;
        };
        assert_eq!(pg, sqlite);
    }

    /// A lease that expired and was claimed again by another store is lost: its late
    /// completion is refused and writes nothing; the new lease completes.
    #[test]
    fn an_expired_lease_claimed_elsewhere_is_lost() {
        let Some(db) = pg::db() else { return };
        let clock = ManualClock::starting_at(1_700_000_000_000);
        let open = || {
            let options = StoreOptions {
                clock: clock.clone(),
                ..StoreOptions::default()
            };
            Store::open_postgres(&db.url, options).unwrap()
        };
        let (a, b) = (open(), open());
        ship_queue(&a, 5);
        a.insert(&plain_order(1)).unwrap();
        let first = a.claim("ship", 1).unwrap().pop().unwrap();
        assert!(b.claim("ship", 1).unwrap().is_empty(), "the lease is live");
        clock.advance(first.expires_at_ms - 1_700_000_000_000 + 1);
        let second = b.claim("ship", 1).unwrap().pop().expect("claimed again");
        let late = a.complete(&first, |w| {
            w.insert(&first.completion().field("by", "a").build()?)?;
            Ok(())
        });
        assert!(
            matches!(late, Err(precedent::Error::LeaseLost { .. })),
            "{late:?}"
        );
        b.complete(&second, |w| {
            w.insert(&second.completion().field("by", "b").build()?)?;
            Ok(())
        })
        .unwrap();
        let s = a.queue_stats("ship").unwrap();
        assert_eq!((s.completed, s.ready, s.leased), (1, 0, 0));
    }

    #[test]
    fn sync_state_as_on_sqlite() {
        let Some((sqlite, pg)) = on_both(|store| {
            let mut out = Vec::new();
            let shop = shop_data(store);
            out.push(format!(
                "id is {} hex digits",
                store.store_id().unwrap().len()
            ));
            out.push(format!("{:?}", store.count_and_max_seq().unwrap()));
            out.push(format!("{:?}", store.release_page(2, 3).unwrap()));
            out.push(format!("{:?}", store.release_page(100, 3).unwrap()));
            out.push(format!(
                "{:?}",
                store.scope_page(&[shop.hash()], 0, i64::MAX, 100).unwrap()
            ));
            out.push(format!(
                "{:?}",
                store.scope_page(&[shop.hash()], 3, 9, 4).unwrap()
            ));
            let url = "http://peer.example";
            store.record_peer_error(url, "refused").unwrap();
            store
                .write(|w| {
                    w.set_pull_bookmark(url, 5, 9)?;
                    w.set_pull_bookmark(url, 3, 7)?;
                    w.set_push_bookmark(url, 4)?;
                    w.set_push_bookmark(url, 2)?;
                    w.record_peer_success(url, 8)?;
                    w.quarantine(url, "bad bytes", &[1, 2, 3])?;
                    let changed = w.note_peer_store(url, "aa")?;
                    let changed_again = w.note_peer_store(url, "bb")?;
                    Ok((changed, changed_again))
                })
                .map(|c| out.push(format!("{c:?}")))
                .unwrap();
            let p = store.peer(url).unwrap().unwrap();
            out.push(format!(
                "{} {} {} {} {:?}",
                p.url, p.pull_after, p.push_after, p.remote_seq, p.last_error
            ));
            out.push(format!("peers {}", store.peers().unwrap().len()));
            out.push(format!("quarantined {}", store.quarantine_count().unwrap()));
            // A held fact pushed by the peer counts against it until released.
            let missing = Fact::builder("Shop").field("name", "far").build().unwrap();
            let waits = Fact::builder("Shop.Order")
                .field("id", 99)
                .predecessor("shop", missing.hash())
                .build()
                .unwrap();
            store.insert(&waits).unwrap();
            let held = store
                .write(|w| w.note_held_origin(url, &[waits.hash(), shop.hash()]))
                .unwrap();
            out.push(format!("held from peer {held}"));
            out.push(format!("absent {:?}", store.absent_ancestors(10).unwrap()));
            store.insert(&missing).unwrap();
            let held = store.write(|w| w.note_held_origin(url, &[])).unwrap();
            out.push(format!("held from peer {held}"));
            out.push(format!("removed {}", store.remove_peer(url).unwrap()));
            out.push(format!("peers {}", store.peers().unwrap().len()));
            out.join("\n")
        }) else {
            return;
        };
        assert_eq!(pg, sqlite);
    }
    /// The released set as count and XOR of hashes (`digest_since`, on the store's
    /// own backend): equal sets, equal pairs.
    #[cfg(all(feature = "server", feature = "client"))]
    fn released(store: &Store) -> (u64, [u8; 32]) {
        let d = store
            .digest_since(precedent::sync::SetDigest::default())
            .unwrap();
        (d.count, d.xor)
    }

    /// `n` facts of type `t` below `root`, each naming the root or an earlier one.
    #[cfg(all(feature = "server", feature = "client"))]
    fn tree(t: &str, root: &Fact, n: usize) -> Vec<Fact> {
        let mut out: Vec<Fact> = Vec::new();
        for i in 0..n {
            let parent = if i == 0 {
                root.hash()
            } else {
                out[i / 2].hash()
            };
            out.push(
                Fact::builder(t)
                    .field("i", i as i64)
                    .predecessor("up", parent)
                    .build()
                    .unwrap(),
            );
        }
        out
    }

    /// A PostgreSQL store syncs as a client with an SQLite node's server, in both
    /// directions, again with nothing to move, and scoped: sync's store side (bookmarks,
    /// digests, pages, held facts pushed) on PostgreSQL. (A sync server on a PostgreSQL
    /// store does not start yet: the blocking driver refuses to run inside the server's
    /// runtime.)
    #[cfg(all(feature = "server", feature = "client"))]
    #[test]
    fn a_postgres_store_syncs_with_an_sqlite_node() {
        use precedent::sync::client::{Client, ClientOptions, SyncOptions};
        use precedent::sync::server::{Running, ServerConfig};

        let Some(db) = pg::db() else { return };
        let hub = Store::open_postgres(&db.url, StoreOptions::default()).unwrap();
        let root = Fact::builder("Root").field("n", 1).build().unwrap();
        let other = Fact::builder("Root").field("n", 2).build().unwrap();
        hub.insert(&root).unwrap();
        for f in tree("Hub", &root, 40) {
            hub.insert(&f).unwrap();
        }
        let sync = |store: &Store, url: &str, roots: Vec<FactHash>| {
            let client = Client::new(url, ClientOptions::default()).unwrap();
            let options = SyncOptions {
                roots,
                ..SyncOptions::default()
            };
            let r = client.sync(store, &options, &mut |_| {}).unwrap();
            assert_eq!(r.quarantined, 0);
        };
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("edge.db");
        let edge = Store::open(&path).unwrap();
        for f in [&root, &other] {
            edge.insert(f).unwrap();
        }
        for f in tree("Edge", &root, 25)
            .iter()
            .chain(&tree("Far", &other, 10))
        {
            edge.insert(f).unwrap();
        }
        let mut config = ServerConfig::new(&path);
        config.listen = "127.0.0.1:0".parse().unwrap();
        let server = Running::start(config).unwrap();
        let url = server.url();
        sync(&hub, &url, Vec::new());
        assert_eq!(released(&hub), released(&edge));
        let peer = hub.peer(&url).unwrap().unwrap();
        assert_eq!(peer.remote_seq, edge.max_seq().unwrap());
        assert!(peer.pull_after > 0 && peer.push_after > 0, "{peer:?}");
        assert_eq!(peer.last_error, None);
        // Again: nothing moves, the bookmarks stand.
        sync(&hub, &url, Vec::new());
        assert_eq!(hub.peer(&url).unwrap().unwrap().pull_after, peer.pull_after);
        // A scoped PostgreSQL store gets the root's descendants and their ancestors only.
        let Some(db) = pg::db() else { return };
        let scoped = Store::open_postgres(&db.url, StoreOptions::default()).unwrap();
        sync(&scoped, &url, vec![root.hash()]);
        assert_eq!(released(&scoped).0, released(&edge).0 - 11);
        assert_eq!(scoped.peers().unwrap().len(), 1);
        server.stop().unwrap();
    }
}
