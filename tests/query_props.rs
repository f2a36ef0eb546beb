//! Property tests: query results against a naive in-memory evaluator of the query model
//! over random fact graphs, and watches against re-running the query after each insert.

mod common;

use std::collections::{BTreeMap, BTreeSet, HashMap};

use common::backend::Backend;
use common::shop::{givens, order, shipment, shop};
use precedent::query::value::{Number, SortKey, sort_key};
use precedent::query::{Change, Condition, Givens, Match, Projection, Query, QueryRow, SortBy};
use precedent::{Fact, FactHash, Store, Value};
use proptest::prelude::*;

/// A random graph: A roots; B names A (`a`); C names B (`b`); D names C (`c`). Fields `n`
/// of mixed kinds (or none). Returned parents first.
fn graph(rng: &mut fastrand::Rng) -> Vec<Fact> {
    let value = |rng: &mut fastrand::Rng| match rng.u8(0..9) {
        0 => None,
        1 => Some(Value::Null),
        2 => Some(Value::Bool(rng.bool())),
        3 | 4 => Some(Value::Integer(rng.i64(-3..4) as i128)),
        5 => Some(Value::Float([-1.5, 0.0, 2.0, 2.5][rng.usize(0..4)])),
        6 | 7 => Some(Value::Text(["a", "b", "B", ""][rng.usize(0..4)].into())),
        _ => Some(Value::Bytes(vec![rng.u8(0..3)])),
    };
    let mut sizer = fastrand::Rng::with_seed(rng.u64(..));
    let mut seed_size = |n: usize| sizer.usize(0..n);
    let mut out: Vec<Fact> = Vec::new();
    let mut layer = |out: &mut Vec<Fact>, ty: &str, role: &str, parents: &[Fact], n: usize| {
        let mut made = Vec::new();
        for i in 0..n {
            let mut b = Fact::builder(ty).field("i", i as i64);
            if let Some(v) = value(rng) {
                b = b.field("n", v);
            }
            if !parents.is_empty() {
                for _ in 0..rng.usize(1..3) {
                    b = b.predecessor(role, parents[rng.usize(0..parents.len())].hash());
                }
            }
            made.push(b.build().unwrap());
        }
        out.extend(made.iter().cloned());
        made
    };
    let sizes = [1 + seed_size(4), seed_size(9), seed_size(9), seed_size(7)];
    let a = layer(&mut out, "A", "", &[], sizes[0]);
    let b = layer(&mut out, "B", "a", &a, sizes[1]);
    let c = layer(&mut out, "C", "b", &b, sizes[2]);
    layer(
        &mut out,
        "D",
        "c",
        &c,
        if c.is_empty() { 0 } else { sizes[3] },
    );
    out
}

/// A random query over that graph, in the text syntax.
fn query_text(rng: &mut fastrand::Rng, with_given: bool) -> String {
    let lit = |rng: &mut fastrand::Rng| {
        [
            "1", "-1", "2.0", "2.5", "0", "\"a\"", "\"B\"", "true", "null", "x\"01\"",
        ][rng.usize(0..10)]
        .to_string()
    };
    let ordered_lit = |rng: &mut fastrand::Rng| {
        ["1", "-1", "2.0", "2.5", "0", "\"a\"", "\"B\"", "x\"01\""][rng.usize(0..8)].to_string()
    };
    let pred = |rng: &mut fastrand::Rng, l: &str| match rng.u8(0..4) {
        0 => format!(" and {l}.n = {}", lit(rng)),
        1 => format!(" and {l}.n != {}", lit(rng)),
        2 => format!(
            " and {l}.n {} {}",
            ["<", "<=", ">", ">="][rng.usize(0..4)],
            ordered_lit(rng)
        ),
        _ => format!(" and {l}.n in [{}, {}]", lit(rng), lit(rng)),
    };
    let mut q = String::new();
    let mut top = vec![];
    if with_given {
        q.push_str("given a: A\nmatch b: B where b->a = a");
        top.push("a");
    } else {
        q.push_str("match b: B where b.i >= 0");
    }
    top.push("b");
    if rng.bool() {
        q.push_str(&pred(rng, "b"));
    }
    match rng.u8(0..5) {
        0 => {
            q.push_str("\nmatch c: C where c->b = b");
            top.push("c");
            if rng.bool() {
                q.push_str(&pred(rng, "c"));
            }
        }
        1 => {
            q.push_str("\nmatch d: D where d->c->b = b");
            top.push("d");
        }
        2 if with_given => {
            q.push_str("\nmatch a2: A where b->a = a2");
            top.push("a2");
        }
        _ => {}
    }
    match rng.u8(0..4) {
        0 => q.push_str("\n  and not exists (match x: C where x->b = b)"),
        1 => {
            let inner = if rng.bool() {
                pred(rng, "x")
            } else {
                String::new()
            };
            q.push_str(&format!(
                "\n  and {}exists (match x: C where x->b = b{inner} and not exists (match y: D where y->c = x))",
                if rng.bool() { "not " } else { "" }
            ));
        }
        2 => q.push_str("\n  and exists (match x: D where x->c->b = b)"),
        _ => {}
    }
    let order = match rng.u8(0..3) {
        0 => "\norder by b.n".to_string(),
        1 => "\norder by b.n desc, seq(b) desc".to_string(),
        _ => String::new(),
    };
    q.push_str(&order);
    if !order.is_empty() && rng.bool() {
        q.push_str(&format!("\nlimit {}", rng.usize(0..4)));
    }
    let mut items: Vec<String> = top.iter().map(|l| format!("{l}: hash({l})")).collect();
    // Child collections, which watches follow too.
    match rng.u8(0..4) {
        0 => items.push("kids: [match c9: C where c9->b = b select hash(c9)]".into()),
        1 => items.push(
            "kids: [match c9: C where c9->b = b
               and not exists (match d9: D where d9->c = c9)
               order by c9.n desc limit 2
               select {c: hash(c9), ds: [match d8: D where d8->c = c9 select hash(d8)]}]"
                .into(),
        ),
        2 => items.push("kids: [match d9: D where d9->c->b = b select d9.n]".into()),
        _ => {}
    }
    q.push_str(&format!("\nselect {{{}}}", items.join(", ")));
    q
}

/// The naive evaluator: the query model interpreted over facts in memory.
struct Naive<'a> {
    facts: &'a [Fact],
    by_hash: HashMap<FactHash, &'a Fact>,
    seq: HashMap<FactHash, usize>,
}

type Env<'a> = Vec<(String, &'a Fact)>;

impl<'a> Naive<'a> {
    fn new(facts: &'a [Fact]) -> Naive<'a> {
        Naive {
            facts,
            by_hash: facts.iter().map(|f| (f.hash(), f)).collect(),
            seq: facts
                .iter()
                .enumerate()
                .map(|(i, f)| (f.hash(), i))
                .collect(),
        }
    }

    fn get(env: &Env<'a>, label: &str) -> &'a Fact {
        env.iter().rev().find(|(l, _)| l == label).unwrap().1
    }

    fn reach(&self, from: &'a Fact, roles: &[String]) -> BTreeSet<FactHash> {
        let mut cur = BTreeSet::from([from.hash()]);
        for role in roles {
            let mut next = BTreeSet::new();
            for h in &cur {
                if let Some(set) = self.by_hash[h].predecessors().get(role) {
                    next.extend(set.iter().filter(|p| self.by_hash.contains_key(p)));
                }
            }
            cur = next;
        }
        cur
    }

    fn holds(&self, c: &Condition, env: &Env<'a>) -> bool {
        match c {
            Condition::Join { left, right } => {
                let l = self.reach(Self::get(env, &left.label.name), &left.roles);
                let r = self.reach(Self::get(env, &right.label.name), &right.roles);
                !l.is_disjoint(&r)
            }
            Condition::Field {
                label, field, test, ..
            } => test.passes(Self::get(env, &label.name).field(field)),
            Condition::Exists {
                negated, matches, ..
            } => self.block(matches, env.clone()).is_empty() == *negated,
        }
    }

    fn block(&self, matches: &[Match], start: Env<'a>) -> Vec<Env<'a>> {
        let mut envs = vec![start];
        for m in matches {
            let mut next = Vec::new();
            for env in &envs {
                for f in self.facts.iter().filter(|f| f.type_name() == m.type_name) {
                    let mut e = env.clone();
                    e.push((m.label.name.clone(), f));
                    if m.conditions.iter().all(|c| self.holds(c, &e)) {
                        next.push(e);
                    }
                }
            }
            envs = next;
        }
        envs
    }

    /// Result keys (hashes of the top-level facts) in result order.
    fn run(&self, q: &Query, givens: &Givens) -> Vec<Vec<FactHash>> {
        let mut env = Env::new();
        for g in &q.givens {
            match self.by_hash.get(&givens[&g.label.name]) {
                Some(f) if f.type_name() == g.type_name => env.push((g.label.name.clone(), *f)),
                _ => return Vec::new(),
            }
        }
        let mut rows = self.block(&q.matches, env);
        let labels = q.top_labels();
        let seqs = |e: &Env<'a>| -> Vec<usize> {
            labels
                .iter()
                .map(|l| self.seq[&Self::get(e, l).hash()])
                .collect()
        };
        rows.sort_by(|x, y| {
            for k in &q.order {
                let (a, b) = match &k.by {
                    SortBy::Field(l, f) => (
                        sort_key(Self::get(x, &l.name).field(f)),
                        sort_key(Self::get(y, &l.name).field(f)),
                    ),
                    SortBy::Seq(l) => {
                        let s = |e: &Env<'a>| {
                            SortKey::Number(Number::Int(
                                self.seq[&Self::get(e, &l.name).hash()] as i64,
                            ))
                        };
                        (s(x), s(y))
                    }
                };
                let o = a.partial_cmp(&b).unwrap();
                let o = if k.descending { o.reverse() } else { o };
                if o.is_ne() {
                    return o;
                }
            }
            seqs(x).cmp(&seqs(y))
        });
        if let Some(n) = q.limit {
            rows.truncate(n as usize);
        }
        rows.iter()
            .map(|e| labels.iter().map(|l| Self::get(e, l).hash()).collect())
            .collect()
    }
}

fn keys_of(rows: &[precedent::query::QueryRow], q: &Query) -> Vec<Vec<FactHash>> {
    let labels = q.top_labels();
    rows.iter()
        .map(|r| {
            let json = r.value.to_json();
            labels
                .iter()
                .map(|l| json[*l].as_str().unwrap().parse().unwrap())
                .collect()
        })
        .collect()
}

fn release_order(store: &Store) -> Vec<Fact> {
    let mut out = Vec::new();
    store
        .for_each_released(0, |_, _, bytes| {
            out.push(Fact::from_canonical(bytes).unwrap());
            Ok(())
        })
        .unwrap();
    out
}

conformance! {
    /// Compiled SQL and the naive evaluator agree on every random query and graph,
    /// including order and limit.
    /// The cases share one database, emptied before each.
    fn queries_match_the_naive_evaluator(b: Backend) {
        let db = b.db();
        proptest!(ProptestConfig::with_cases(300), |(seed in any::<u64>(), with_given in any::<bool>())| {
            let mut rng = fastrand::Rng::with_seed(seed);
            let facts = graph(&mut rng);
            db.reset();
            let store = db.store();
            store.insert_batch(facts.clone()).unwrap();
            let released = release_order(&store);
            let naive = Naive::new(&released);
            let text = query_text(&mut rng, with_given);
            let q = Query::parse(&text).unwrap();
            let roots: Vec<&Fact> = facts.iter().filter(|f| f.type_name() == "A").collect();
            let givens = Givens::from([("a".to_string(), roots[rng.usize(0..roots.len())].hash())]);
            let got = keys_of(&store.query(&q, &givens).unwrap(), &q);
            let want = naive.run(&q, &givens);
            prop_assert_eq!(got, want, "query:\n{}", text);
            // SQLite only: the steps of SQLite's query plans.
            if b == Backend::Sqlite {
                for step in store.explain(&q, &givens).unwrap() {
                    prop_assert!(!step.starts_with("SCAN"), "{}: {}", text, step);
                }
            }
        });
    }
}

conformance! {
    /// A watch's results, kept by its changes, equal the query re-run after each insert,
    /// in the query's order and within its limit, with facts arriving in random order (so
    /// some are held and released later, and the given may arrive after the watch
    /// started). Beside it, a watch that forgot its results (when its query's results can
    /// only be added) reports the same additions, and its snapshot is the results as of its
    /// last poll, also when facts arrived since.
    /// The cases share one database, emptied before each.
    fn watches_match_rerunning_the_query(b: Backend) {
        let db = b.db();
        proptest!(ProptestConfig::with_cases(300), |(seed in any::<u64>(), with_given in any::<bool>())| {
            let mut rng = fastrand::Rng::with_seed(seed);
            let mut facts = graph(&mut rng);
            let text = query_text(&mut rng, with_given);
            let q = Query::parse(&text).unwrap();
            let roots: Vec<Fact> = facts.iter().filter(|f| f.type_name() == "A").cloned().collect();
            let givens = Givens::from([("a".to_string(), roots[rng.usize(0..roots.len())].hash())]);
            rng.shuffle(&mut facts);
            db.reset();
            let store = db.store();
            let start = rng.usize(0..=facts.len());
            store.insert_batch(facts[..start].to_vec()).unwrap();
            let mut watch = store.watch(&q, &givens).unwrap();
            let mut mine: BTreeMap<Vec<i64>, QueryRow> =
                watch.results().into_iter().map(|r| (r.key.clone(), r.clone())).collect();
            // The same query without what can remove or update a result: its results only
            // grow, and a watch of it forgets them.
            let appends = q.limit.is_none()
                && !has_exists(&q.matches)
                && !has_collection(&q.select);
            prop_assert_eq!(watch.appends_only(), appends, "appends only?\n{}", text);
            let lq = appending(&q);
            let mut lean = store.watch(&lq, &givens).unwrap();
            prop_assert!(lean.forget_results(), "{:?}", lq);
            prop_assert!(lean.results().is_empty());
            let mut rest = &facts[start..];
            while !rest.is_empty() {
                let n = rng.usize(1..=rest.len().min(3));
                let before = store.query(&lq, &givens).unwrap();
                store.insert_batch(rest[..n].to_vec()).unwrap();
                rest = &rest[n..];
                // Facts arrived since its last poll: the snapshot is still of then.
                let mut snap = Vec::new();
                lean.snapshot(&store, |r| { snap.push(r.clone()); Ok(()) }).unwrap();
                prop_assert_eq!(&snap, &before, "snapshot before the poll\n{:?}", lq);
                let mut added: Vec<QueryRow> = Vec::new();
                for change in lean.poll(&store).unwrap() {
                    match change {
                        Change::Added(r) => added.push(r),
                        other => prop_assert!(false, "{:?} from a lean watch\n{:?}", other, lq),
                    }
                }
                added.sort_by(|a, b| a.cmp_in(b, &lq));
                let grown = store.query(&lq, &givens).unwrap();
                let new: Vec<QueryRow> =
                    grown.iter().filter(|r| !before.contains(r)).cloned().collect();
                prop_assert_eq!(&added, &new, "lean additions\n{:?}", lq);
                prop_assert!(lean.results().is_empty());
                let mut snap = Vec::new();
                lean.snapshot(&store, |r| { snap.push(r.clone()); Ok(()) }).unwrap();
                prop_assert_eq!(&snap, &grown, "snapshot after the poll\n{:?}", lq);
                for change in watch.poll(&store).unwrap() {
                    match change {
                        Change::Added(r) => prop_assert!(mine.insert(r.key.clone(), r).is_none(), "added twice\n{}", text),
                        Change::Removed(r) => prop_assert!(mine.remove(&r.key).is_some(), "removed absent\n{}", text),
                        Change::Updated(r) => {
                            let old = mine.insert(r.key.clone(), r.clone());
                            prop_assert!(old.is_some_and(|o| o.value != r.value), "updated absent or unchanged\n{}", text);
                        }
                    }
                }
                let mut kept: Vec<&QueryRow> = mine.values().collect();
                kept.sort_by(|a, b| a.cmp_in(b, &q));
                let now = store.query(&q, &givens).unwrap();
                prop_assert_eq!(&kept.into_iter().cloned().collect::<Vec<_>>(), &now, "query:\n{}", text);
                let listed: Vec<QueryRow> = watch.results().into_iter().cloned().collect();
                prop_assert_eq!(&listed, &now, "query:\n{}", text);
            }
        });
    }
}

/// `q` without its `exists` conditions, its limit and its child collections (each
/// replaced by the hash of the query's last label): a query whose results only grow.
fn appending(q: &Query) -> Query {
    fn strip(p: &Projection, label: &str) -> Projection {
        match p {
            Projection::Collection(_) => Projection::Hash(label.into()),
            Projection::Record(items) => Projection::Record(
                items
                    .iter()
                    .map(|(k, v)| (k.clone(), strip(v, label)))
                    .collect(),
            ),
            other => other.clone(),
        }
    }
    let mut lq = q.clone();
    lq.limit = None;
    for m in &mut lq.matches {
        m.conditions
            .retain(|c| !matches!(c, Condition::Exists { .. }));
    }
    let last = lq.matches.last().expect("a match").label.name.clone();
    lq.select = strip(&q.select, &last);
    lq
}

/// Whether any match among `matches` has an `exists` or `not exists`.
fn has_exists(matches: &[Match]) -> bool {
    matches.iter().any(|m| {
        m.conditions
            .iter()
            .any(|c| matches!(c, Condition::Exists { .. }))
    })
}

/// Whether a projection reads a child collection.
fn has_collection(p: &Projection) -> bool {
    match p {
        Projection::Collection(_) => true,
        Projection::Record(items) => items.iter().any(|(_, v)| has_collection(v)),
        _ => false,
    }
}

conformance! {
    fn a_watch_sees_an_order_arrive_and_leave_when_shipped(b: Backend) {
        let store = b.store();
        let shop = shop("corner");
        let q = Query::parse(
            "given s: Shop match o: Shop.Order where o->shop = s
               and not exists (match sh: Shop.Shipment where sh->order = o) select o",
        )
        .unwrap();
        let givens = givens(&shop);
        // The given is not there yet.
        let mut watch = store.watch(&q, &givens).unwrap();
        assert!(watch.results().is_empty());
        let order = order(&shop, "id", 1);
        let ship = shipment(&order);
        // The order arrives before its shop: held, then released with it.
        store.insert(&order).unwrap();
        assert!(watch.poll(&store).unwrap().is_empty());
        store.insert(&shop).unwrap();
        let changes = watch.poll(&store).unwrap();
        assert!(
            matches!(&changes[..], [Change::Added(r)] if r.value == precedent::query::Projected::Fact(order.clone()))
        );
        store.insert(&ship).unwrap();
        let changes = watch.poll(&store).unwrap();
        assert!(matches!(&changes[..], [Change::Removed(_)]), "{changes:?}");
        assert!(watch.results().is_empty());
        let _ = Projection::Fact("o".into());
    }
}

conformance! {
    /// A watch of an ordered, limited query keeps exactly its first results: an order that
    /// sorts among them pushes the last one out; one that leaves lets the next one in, read
    /// after the last one kept. Each result carries its `order by` values.
    fn a_limited_watch_keeps_the_first_results(b: Backend) {
        let store = b.store();
        let shop = shop("corner");
        let order = |total: i64| order(&shop, "total", total);
        let ship = shipment;
        let (o5, o12, o30) = (order(5), order(12), order(30));
        store
            .insert_batch(vec![shop.clone(), o5.clone(), o12.clone(), o30.clone()])
            .unwrap();
        let q = Query::parse(
            "given s: Shop match o: Shop.Order where o->shop = s
               and not exists (match sh: Shop.Shipment where sh->order = o)
             order by o.total desc limit 2 select o.total",
        )
        .unwrap();
        let givens = givens(&shop);
        let mut watch = store.watch(&q, &givens).unwrap();
        let totals = |w: &precedent::query::Watch| -> Vec<String> {
            w.results()
                .iter()
                .map(|r| r.value.to_json().to_string())
                .collect()
        };
        assert_eq!(totals(&watch), ["30", "12"]);
        let described = |changes: &[Change]| -> Vec<String> {
            changes
                .iter()
                .map(|c| match c {
                    Change::Added(r) => format!("+{}", r.value.to_json()),
                    Change::Removed(r) => format!("-{}", r.value.to_json()),
                    Change::Updated(r) => format!("~{}", r.value.to_json()),
                })
                .collect()
        };
        // 20 sorts between 30 and 12: 12 leaves.
        let o20 = order(20);
        store.insert(&o20).unwrap();
        let changes = watch.poll(&store).unwrap();
        assert_eq!(described(&changes), ["+20", "-12"]);
        assert!(
            matches!(&changes[0], Change::Added(r) if r.order == [SortKey::Number(Number::Int(20))])
        );
        assert_eq!(totals(&watch), ["30", "20"]);
        // 1 sorts after both: nothing changes.
        store.insert(&order(1)).unwrap();
        assert!(watch.poll(&store).unwrap().is_empty());
        // 30 is shipped: 12, the next one, comes back.
        store.insert(&ship(&o30)).unwrap();
        assert_eq!(described(&watch.poll(&store).unwrap()), ["-30", "+12"]);
        // 20 and 12 shipped at once: 5 and 1 follow.
        store.insert_batch(vec![ship(&o20), ship(&o12)]).unwrap();
        let changes = watch.poll(&store).unwrap();
        assert_eq!(changes.len(), 4, "{changes:?}");
        assert_eq!(totals(&watch), ["5", "1"]);
        assert_eq!(
            watch.results().into_iter().cloned().collect::<Vec<_>>(),
            store.query(&q, &givens).unwrap()
        );
    }
}

conformance! {
    /// Integers past 2^53 are ordered exactly, as SQLite orders them, not as floats (which
    /// would tie 2^53 and 2^53 + 1 and keep the older result).
    fn a_limited_watch_orders_large_integers_exactly(b: Backend) {
        let store = b.store();
        let shop = shop("corner");
        let order = |total: i64| order(&shop, "total", total);
        let big = 1i64 << 53;
        store
            .insert_batch(vec![shop.clone(), order(big + 1)])
            .unwrap();
        let q = Query::parse(
            "given s: Shop match o: Shop.Order where o->shop = s order by o.total limit 1
             select o.total",
        )
        .unwrap();
        let givens = givens(&shop);
        let mut watch = store.watch(&q, &givens).unwrap();
        store.insert(&order(big)).unwrap();
        let changes = watch.poll(&store).unwrap();
        assert_eq!(changes.len(), 2, "{changes:?}");
        let kept: Vec<_> = watch.results().into_iter().cloned().collect();
        assert_eq!(kept, store.query(&q, &givens).unwrap());
        assert_eq!(kept[0].value.to_json().to_string(), big.to_string());
    }
}

conformance! {
    /// A fact that joins a child collection of a kept result updates that result, with its
    /// new value and the same key; other results are left alone.
    fn a_watch_updates_a_result_whose_child_collection_changed(b: Backend) {
        let store = b.store();
        let shop = shop("corner");
        let order = |id: i64| order(&shop, "id", id);
        let (o1, o2) = (order(1), order(2));
        store
            .insert_batch(vec![shop.clone(), o1.clone(), o2.clone()])
            .unwrap();
        let q = Query::parse(
            "given s: Shop match o: Shop.Order where o->shop = s
             select {id: o.id, notes: [match n: Shop.Note where n->order = o select n.text]}",
        )
        .unwrap();
        let givens = givens(&shop);
        let mut watch = store.watch(&q, &givens).unwrap();
        let note = Fact::builder("Shop.Note")
            .field("text", "fragile")
            .predecessor("order", o2.hash())
            .build()
            .unwrap();
        store.insert(&note).unwrap();
        let changes = watch.poll(&store).unwrap();
        let [Change::Updated(row)] = &changes[..] else {
            panic!("{changes:?}")
        };
        assert_eq!(row.key, store.query(&q, &givens).unwrap()[1].key);
        assert_eq!(
            row.value.to_json(),
            serde_json::json!({"id": 2, "notes": ["fragile"]})
        );
        assert_eq!(
            watch.results().into_iter().cloned().collect::<Vec<_>>(),
            store.query(&q, &givens).unwrap()
        );
    }
}

conformance! {
    /// A poll's statements stay prepared: re-binding the new facts' range, a result key or a
    /// given does not make SQLite prepare them again (it did once per statement per poll,
    /// most of a poll's cost when one fact arrives).
    fn polls_prepare_no_statement_again(b: Backend) {
        let store = b.store();
        let shop = shop("corner");
        store.insert(&shop).unwrap();
        let q = Query::parse(
            "given s: Shop match o: Shop.Order where o->shop = s and o.id >= 0
               and not exists (match sh: Shop.Shipment where sh->order = o) select o.id",
        )
        .unwrap();
        let givens = givens(&shop);
        let mut watch = store.watch(&q, &givens).unwrap();
        let before = store.query_reprepares();
        let mut changes = 0;
        for id in 0..5 {
            let order = order(&shop, "id", id);
            store.insert(&order).unwrap();
            changes += watch.poll(&store).unwrap().len();
            let ship = shipment(&order);
            store.insert(&ship).unwrap();
            changes += watch.poll(&store).unwrap().len();
        }
        assert_eq!(changes, 10);
        assert_eq!(store.query_reprepares() - before, 0);
    }
}

conformance! {
    fn a_watch_sees_facts_written_by_another_process_within_its_interval(b: Backend) {
        let db = b.db();
        let shop = shop("corner");
        let writer = db.store();
        writer.insert(&shop).unwrap();
        let reader = db.store();
        let q =
            Query::parse("given s: Shop match o: Shop.Order where o->shop = s select o.id").unwrap();
        let givens = givens(&shop);
        let mut watch = reader.watch(&q, &givens).unwrap();
        // Another process: the test binary's own child would do; a second connection on the
        // file is what SQLite sees either way.
        let handle = std::thread::spawn(move || {
            std::thread::sleep(std::time::Duration::from_millis(100));
            let order = order(&shop, "id", 9);
            writer.insert(&order).unwrap();
            std::time::Instant::now()
        });
        let changes = watch
            .wait(&reader, std::time::Duration::from_secs(5))
            .unwrap();
        let seen = std::time::Instant::now();
        let written = handle.join().unwrap();
        assert_eq!(changes.len(), 1);
        let delay = seen.duration_since(written);
        assert!(
            delay <= watch.interval + std::time::Duration::from_millis(50),
            "{delay:?}"
        );
    }
}
