//! Query benchmark: compiled queries against hand-written SQL over the same tables (the
//! floor), and the cost of a watch per inserted fact.
//!
//! `cargo bench --bench query` builds (once, kept in `target/`) a store of
//! `STORES x ORDERS` orders, each naming its shop, and a shipment for 90% of them, written
//! parents first with `insert_batch` in chunks of 50,000. Then, on a warm cache:
//! - "pending orders of one store": the query and the floor on the same random shops;
//! - "all pending orders": the query (no given: read by type) and the floor;
//! - the same asks of ours with SQLite's memory limited to `serve`'s default
//!   (`precedent::store::set_sqlite_memory_limit`), against ours without it;
//! - watch cost: new orders and shipments inserted one per transaction, and in batches
//!   of 100, without a watch and with a watch of one store's pending orders polled after
//!   each transaction, with the number of statements SQLite had to prepare again per
//!   poll.
//!
//! Settings, from the environment:
//! - `PRECEDENT_BENCH_STORES` (default 1,000) and `PRECEDENT_BENCH_ORDERS` (orders per
//!   store, default 1,000);
//! - `PRECEDENT_BENCH_OUT`: where to write the JSON (default `target/bench-query.json`).
//!
//! See `docs/performance.md` (`## Queries`) for the figures.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use precedent::query::{Givens, Query};
use precedent::store::Durability;
use precedent::{Fact, FactHash, Store, StoreOptions};
use rusqlite::{Connection, OpenFlags, params};
use serde_json::json;

#[path = "common/shop.rs"]
mod shop_facts;

use shop_facts::{order, shipment, shop, store_shop_orders};

/// `precedent serve`'s default `--sqlite-memory`, in MiB (src/cli/sync.rs): the query
/// bench measures what it costs reads.
const LIMIT_MIB: u64 = 16;

/// Ours, "pending orders of one store": how many results.
fn one_store(store: &Store, one: &Query, shop: &FactHash) -> usize {
    let g = Givens::from([("s".to_string(), *shop)]);
    store.query(one, &g).unwrap().len()
}

/// Ours, "all pending orders": how many results.
fn every_store(store: &Store, all: &Query) -> usize {
    store.query(all, &Givens::new()).unwrap().len()
}

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.replace('_', "").parse().ok())
        .unwrap_or(default)
}

/// Builds the store unless a complete one is already there; returns the shops' hashes.
fn build(path: &PathBuf, stores: usize, orders: usize) -> Vec<FactHash> {
    let shops: Vec<Fact> = (0..stores).map(shop).collect();
    let done = path.with_extension("done");
    if done.exists() {
        return shops.iter().map(Fact::hash).collect();
    }
    let _ = std::fs::remove_file(path);
    let options = StoreOptions {
        durability: Durability::Normal,
        ..StoreOptions::default()
    };
    let store = Store::open_with(path, options).unwrap();
    let started = Instant::now();
    let total = store_shop_orders(&store, &shops, orders);
    eprintln!(
        "built {total} facts in {:.1} s",
        started.elapsed().as_secs_f64()
    );
    std::fs::write(&done, "").unwrap();
    shops.iter().map(Fact::hash).collect()
}

const ONE_STORE: &str = "given s: Shop
match o: Shop.Order where o->shop = s
  and not exists (match sh: Shop.Shipment where sh->order = o)
select hash(o)";

const ALL: &str = "match o: Shop.Order
  where not exists (match sh: Shop.Shipment where sh->order = o)
select hash(o)";

/// The floor: the same questions asked by hand.
/// `CROSS JOIN` fixes the join order a person would choose: shop by hash, its order
/// edges, each order (left to itself, SQLite may start from the orders by type). Each
/// edge carries its facts' types, so the orders of the shop and the shipments of an order
/// are each one range of the edge primary key, and the shipment test reads the order's
/// seq from its edge: an order's row is read only when it is a result.
const FLOOR_ONE: &str = "SELECT o.hash FROM fact s
  CROSS JOIN edge e CROSS JOIN fact o
  WHERE s.hash = ?1 AND e.predecessor = s.seq AND e.role_id = ?2 AND e.successor_type = ?3
    AND o.seq = e.successor
    AND NOT EXISTS (
      SELECT 1 FROM edge e2
      WHERE e2.predecessor = e.successor AND e2.role_id = ?4 AND e2.successor_type = ?5)
  ORDER BY o.seq";

const FLOOR_ALL: &str = "SELECT o.hash FROM fact o
  WHERE o.type_id = ?1 AND NOT EXISTS (
    SELECT 1 FROM edge e2
    WHERE e2.predecessor = o.seq AND e2.role_id = ?2 AND e2.successor_type = ?3)
  ORDER BY o.seq";

fn id(conn: &Connection, table: &str, name: &str) -> i64 {
    conn.query_row(
        &format!("SELECT id FROM {table} WHERE name = ?1"),
        [name],
        |r| r.get(0),
    )
    .unwrap()
}

/// CPU time of this thread: what a query costs without the time spent waiting for a
/// processor (the machine the figures come from runs other builds at the same time).
fn thread_cpu() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec into the pointer it is given.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

fn percentile(mut v: Vec<Duration>, p: f64) -> f64 {
    v.sort();
    let i = ((v.len() as f64 - 1.0) * p).round() as usize;
    v[i].as_secs_f64() * 1e3
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        println!("query: benchmark");
        return;
    }
    let stores = env_usize("PRECEDENT_BENCH_STORES", 1_000);
    let orders = env_usize("PRECEDENT_BENCH_ORDERS", 1_000);
    let target = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target");
    std::fs::create_dir_all(&target).unwrap();
    let path = target.join(format!("bench-query-{stores}x{orders}.db"));
    let shops = build(&path, stores, orders);

    let store = Store::open(&path).unwrap();
    let floor = Connection::open_with_flags(&path, OpenFlags::SQLITE_OPEN_READ_ONLY).unwrap();
    floor.pragma_update(None, "cache_size", -64 * 1024).unwrap();
    let (role_shop, role_order) = (id(&floor, "role", "shop"), id(&floor, "role", "order"));
    let (t_order, t_ship) = (
        id(&floor, "fact_type", "Shop.Order"),
        id(&floor, "fact_type", "Shop.Shipment"),
    );
    let one = Query::parse(ONE_STORE).unwrap();
    let all = Query::parse(ALL).unwrap();

    // Pending orders of one store, on 200 random shops, each side warmed first.
    let mut rng = fastrand::Rng::with_seed(7);
    let picks: Vec<FactHash> = (0..200).map(|_| shops[rng.usize(0..shops.len())]).collect();
    let run_ours = |h: &FactHash| one_store(&store, &one, h);
    let run_floor = |h: &FactHash| {
        let mut stmt = floor.prepare_cached(FLOOR_ONE).unwrap();
        let rows = stmt
            .query_map(
                params![&h.0[..], role_shop, t_order, role_order, t_ship],
                |r| r.get::<_, Vec<u8>>(0),
            )
            .unwrap();
        rows.map(|r| FactHash::from_slice(&r.unwrap()).unwrap())
            .collect::<Vec<FactHash>>()
            .len()
    };
    for h in &picks {
        assert_eq!(run_ours(h), run_floor(h));
    }
    let (mut ours_t, mut floor_t) = (Vec::new(), Vec::new());
    for h in &picks {
        let t = Instant::now();
        run_ours(h);
        ours_t.push(t.elapsed());
        let t = Instant::now();
        run_floor(h);
        floor_t.push(t.elapsed());
    }
    // The same on a warm cache: each of 20 shops asked 10 times, the first ask not timed.
    let (mut ours_w, mut floor_w) = (Vec::new(), Vec::new());
    for h in picks.iter().take(20) {
        run_ours(h);
        run_floor(h);
        for _ in 0..9 {
            let t = Instant::now();
            run_ours(h);
            ours_w.push(t.elapsed());
            let t = Instant::now();
            run_floor(h);
            floor_w.push(t.elapsed());
        }
    }
    let (ours_warm, floor_warm) = (percentile(ours_w, 0.5), percentile(floor_w, 0.5));
    // The same warm asks in CPU time.
    let (mut ours_c, mut floor_c) = (Vec::new(), Vec::new());
    for h in picks.iter().take(20) {
        for _ in 0..9 {
            let t = thread_cpu();
            run_ours(h);
            ours_c.push(thread_cpu() - t);
            let t = thread_cpu();
            run_floor(h);
            floor_c.push(thread_cpu() - t);
        }
    }
    let (ours_cpu, floor_cpu) = (percentile(ours_c, 0.5), percentile(floor_c, 0.5));
    let one_results = run_ours(&picks[0]);
    let (ours_med, floor_med) = (
        percentile(ours_t.clone(), 0.5),
        percentile(floor_t.clone(), 0.5),
    );
    let (ours_p99, floor_p99) = (percentile(ours_t, 0.99), percentile(floor_t, 0.99));

    // All pending orders: 3 runs each after a warm-up, median.
    let all_ours = || every_store(&store, &all);
    let all_floor = || {
        let mut stmt = floor.prepare_cached(FLOOR_ALL).unwrap();
        let rows = stmt
            .query_map(params![t_order, role_order, t_ship], |r| {
                r.get::<_, Vec<u8>>(0)
            })
            .unwrap();
        rows.map(|r| FactHash::from_slice(&r.unwrap()).unwrap())
            .collect::<Vec<FactHash>>()
            .len()
    };
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let all_results = all_ours();
    assert_eq!(all_results, all_floor());
    let time3 = |f: &dyn Fn() -> usize| {
        let v: Vec<Duration> = (0..3)
            .map(|_| {
                let t = Instant::now();
                f();
                t.elapsed()
            })
            .collect();
        percentile(v, 0.5)
    };
    let all_ours_ms = time3(&all_ours);
    let all_floor_ms = time3(&all_floor);

    drop(store);
    drop(floor);

    // The same asks of ours with SQLite's memory held to `serve`'s default limit, on a
    // store opened under it (the limit stops caches growing; it does not empty them):
    // SQLite reuses cached pages past the limit and reads them again from the file.
    precedent::store::set_sqlite_memory_limit(LIMIT_MIB << 20);
    let store = Store::open(&path).unwrap();
    let run_ours = |h: &FactHash| one_store(&store, &one, h);
    for h in &picks {
        run_ours(h);
    }
    let limited_t: Vec<Duration> = picks
        .iter()
        .map(|h| {
            let t = Instant::now();
            run_ours(h);
            t.elapsed()
        })
        .collect();
    let limited_med = percentile(limited_t, 0.5);
    let limited_all_ms = time3(&|| every_store(&store, &all));
    let limited_sqlite_mib = precedent::store::sqlite_memory_used() as f64 / (1 << 20) as f64;
    drop(store);
    precedent::store::set_sqlite_memory_limit(0);

    // Watch cost per inserted fact.
    let watch = watch_costs(&path, &shops);

    let report = json!({
        "stores": stores, "orders_per_store": orders,
        "load_average": load.split_whitespace().next().unwrap_or(""),
        "facts": stores + stores * orders + (stores * orders) - (stores * orders).div_ceil(10),
        "one_store": {"results": one_results, "ours_median_ms": ours_med, "floor_median_ms": floor_med,
                      "ours_p99_ms": ours_p99, "floor_p99_ms": floor_p99, "ratio": ours_med / floor_med,
                      "warm_ours_median_ms": ours_warm, "warm_floor_median_ms": floor_warm,
                      "warm_ratio": ours_warm / floor_warm,
                      "warm_ours_cpu_median_ms": ours_cpu, "warm_floor_cpu_median_ms": floor_cpu,
                      "warm_cpu_ratio": ours_cpu / floor_cpu},
        "all_pending": {"results": all_results, "ours_ms": all_ours_ms, "floor_ms": all_floor_ms,
                        "ratio": all_ours_ms / all_floor_ms},
        "sqlite_memory_limit": {"mib": LIMIT_MIB, "sqlite_mib_after": limited_sqlite_mib,
                                "one_store_median_ms": limited_med,
                                "one_store_vs_unlimited": limited_med / ours_med,
                                "all_pending_ms": limited_all_ms,
                                "all_pending_vs_unlimited": limited_all_ms / all_ours_ms},
        "watch": watch,
    });
    println!("{}", serde_json::to_string_pretty(&report).unwrap());
    println!(
        "pending orders of one store: ours {ours_med:.3} ms, floor {floor_med:.3} ms, ratio {:.2} (target <= 2 and < 5 ms)",
        ours_med / floor_med
    );
    println!(
        "pending orders of one store, warm cache: ours {ours_warm:.3} ms, floor {floor_warm:.3} ms, ratio {:.2}",
        ours_warm / floor_warm
    );
    println!(
        "pending orders of one store, warm cache, CPU time: ours {ours_cpu:.3} ms, floor {floor_cpu:.3} ms, ratio {:.2}",
        ours_cpu / floor_cpu
    );
    println!(
        "all pending orders ({all_results}): ours {all_ours_ms:.1} ms, floor {all_floor_ms:.1} ms, ratio {:.2}",
        all_ours_ms / all_floor_ms
    );
    println!(
        "with SQLite's memory limited to {LIMIT_MIB} MiB (serve's default; SQLite then held {limited_sqlite_mib:.1} MiB): \
         one store {limited_med:.3} ms ({:.2} of unlimited), all pending {limited_all_ms:.1} ms ({:.2} of unlimited)",
        limited_med / ours_med,
        limited_all_ms / all_ours_ms
    );
    let out = std::env::var("PRECEDENT_BENCH_OUT")
        .map(PathBuf::from)
        .unwrap_or_else(|_| target.join("bench-query.json"));
    std::fs::write(out, serde_json::to_string_pretty(&report).unwrap()).unwrap();
}

/// Inserts new orders (90% followed by their shipment) into copies of the store, one per
/// transaction and in batches of 100, without and with a watch of one shop's pending
/// orders polled after each transaction. The watch's cost is the time spent in `poll`,
/// measured on its own, against the insert time of the same run.
fn watch_costs(path: &PathBuf, shops: &[FactHash]) -> serde_json::Value {
    let dir = tempfile::tempdir_in(path.parent().unwrap()).unwrap();
    let mut out = serde_json::Map::new();
    for (mode, batch) in [("single", 1usize), ("batch100", 100)] {
        let mut m = serde_json::Map::new();
        for watched in [false, true] {
            let copy = dir.path().join(format!("{mode}-{watched}.db"));
            std::fs::copy(path, &copy).unwrap();
            let store = Store::open(&copy).unwrap();
            let g = Givens::from([("s".to_string(), shops[0])]);
            let q = Query::parse(ONE_STORE).unwrap();
            let mut w = watched.then(|| store.watch(&q, &g).unwrap());
            // New facts: orders spread over 10 shops, the watched one among them.
            let mut facts = Vec::new();
            for k in 0..2_000usize {
                let i = k % 10;
                let o = order(&shop(i), i, 10_000_000 + k);
                facts.push(o.clone());
                if !k.is_multiple_of(10) {
                    facts.push(shipment(&o));
                }
            }
            let (mut changes, n) = (0usize, facts.len() as f64);
            let (reprepared, mut polls) = (store.query_reprepares(), 0u64);
            let (mut insert, mut poll) = (Duration::ZERO, Duration::ZERO);
            let (mut insert_cpu, mut poll_cpu) = (Duration::ZERO, Duration::ZERO);
            for chunk in facts.chunks(batch) {
                let (t, c) = (Instant::now(), thread_cpu());
                store.insert_batch(chunk.to_vec()).unwrap();
                insert += t.elapsed();
                insert_cpu += thread_cpu() - c;
                if let Some(w) = w.as_mut() {
                    let (t, c) = (Instant::now(), thread_cpu());
                    changes += w.poll(&store).unwrap().len();
                    poll += t.elapsed();
                    poll_cpu += thread_cpu() - c;
                    polls += 1;
                }
            }
            let us = |d: Duration| d.as_secs_f64() * 1e6 / n;
            if let Some(w) = &w {
                // The watch ends where the query is.
                assert!(changes > 0);
                assert_eq!(w.results().len(), store.query(&q, &g).unwrap().len());
                m.insert("watched_insert_us_per_fact".into(), json!(us(insert)));
                m.insert("poll_us_per_fact".into(), json!(us(poll)));
                m.insert("insert_cpu_us_per_fact".into(), json!(us(insert_cpu)));
                m.insert("poll_cpu_us_per_fact".into(), json!(us(poll_cpu)));
                let again = store.query_reprepares() - reprepared;
                m.insert(
                    "reprepares_per_poll".into(),
                    json!(again as f64 / polls as f64),
                );
                m.insert(
                    "overhead_percent".into(),
                    json!(poll.as_secs_f64() / insert.as_secs_f64() * 100.0),
                );
            } else {
                m.insert("insert_us_per_fact".into(), json!(us(insert)));
            }
        }
        println!(
            "watch, {mode}, CPU time: insert {:.1} us/fact, poll {:.2} us/fact ({:.1}%), statements prepared again per poll {:.2}",
            m["insert_cpu_us_per_fact"].as_f64().unwrap(),
            m["poll_cpu_us_per_fact"].as_f64().unwrap(),
            m["poll_cpu_us_per_fact"].as_f64().unwrap()
                / m["insert_cpu_us_per_fact"].as_f64().unwrap()
                * 100.0,
            m["reprepares_per_poll"].as_f64().unwrap(),
        );
        println!(
            "watch, {mode}: insert {:.1} us/fact (unwatched run {:.1}), poll {:.2} us/fact, overhead {:.1}% (target < 20%)",
            m["watched_insert_us_per_fact"].as_f64().unwrap(),
            m["insert_us_per_fact"].as_f64().unwrap(),
            m["poll_us_per_fact"].as_f64().unwrap(),
            m["overhead_percent"].as_f64().unwrap(),
        );
        out.insert(mode.into(), serde_json::Value::Object(m));
    }
    serde_json::Value::Object(out)
}
