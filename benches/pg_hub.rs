//! Hub benchmark on PostgreSQL: what a hub's readers and workers get from it, each against
//! hand-written SQL on the same tables in the same run.
//!
//! In one run, on one PostgreSQL cluster:
//! 1. **Pending query.** A store of `STORES x ORDERS` orders, each naming its shop, 90% of
//!    them shipped (1,008,000 facts by default), written with `insert_batch` in chunks of
//!    50,000. "Pending orders of one store" on 200 random shops, ours (`Store::query`)
//!    against the floor (the same question written by hand, `FLOOR_ONE`, prepared once),
//!    each shop asked of both in turn, ours first on every other shop (the first to ask
//!    reads the shop's pages into shared buffers), first right after the load (the tables not yet analysed: what the first minutes
//!    after a bulk load get) and again after `ANALYZE`. Target: our median under 5 ms.
//! 2. **Claim latency against history.** One claim of one input at a time, timed, from a
//!    queue with no history and from one with `HISTORY` completed inputs, each after
//!    `VACUUM ANALYZE` as autovacuum would run it (`PRECEDENT_BENCH_PG_VACUUM=0`: only
//!    `ANALYZE`, as right after the history was written). Target: the median with
//!    history within 20% of the one without.
//! 3. **Batched claim+complete, 4 workers in 2 processes.** `N` orders and a queue; two
//!    child processes of this bench, two threads each, claim 100 at a time and complete
//!    the batch in one transaction (`Store::complete_batch`, writing a `Shop.Shipped`
//!    fact per input). The floor runs the same in two processes by hand: a claim with
//!    `FOR UPDATE SKIP LOCKED`, and a completion writing the fact rows, each with its one
//!    edge in its own row (`p1`, `p1_role`, `p1_type`, schema version 7), and their
//!    release numbers under the same advisory lock, and deleting the queue rows.
//!    Target: at least 10,000 inputs/s.
//! 4. **Memory.** Peak resident memory (`VmHWM`) of this process and of every child.
//!    Target: each under 300 MB.
//!
//! The cluster: `PRECEDENT_BENCH_PG_URL` names a database on a server of your own (it
//! is emptied); otherwise the bench starts a throwaway cluster as the tests do
//! (`tests/common/pg.rs`), but with initdb's settings (fsync and synchronous commit on)
//! instead of the tests' (both off).
//!
//! Settings, from the environment: `PRECEDENT_BENCH_STORES` (1,000),
//! `PRECEDENT_BENCH_ORDERS` (orders per store, 530), `PRECEDENT_BENCH_PG_HISTORY`
//! (200,000), `PRECEDENT_BENCH_PG_QUEUE_N` (40,000), `PRECEDENT_BENCH_PG_PHASES`
//! (`query,latency,throughput`), `PRECEDENT_BENCH_OUT` (`target/bench-pg-hub.json`).
//!
//! See `docs/performance.md`, "A hub on PostgreSQL".

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use postgres::{Client, NoTls};
use precedent::query::{Givens, Query};
use precedent::store::Durability;
use precedent::{Fact, FactHash, Store, StoreOptions};
use serde_json::{Value as Json, json};

#[allow(dead_code)]
#[path = "../tests/common/pg.rs"]
mod pg;
#[path = "common/shop.rs"]
mod shop_facts;

use shop_facts::{order, shipped, shop, spec, store_shop_orders};

const QUERY_TARGET_MS: f64 = 5.0;
const THROUGHPUT_TARGET: f64 = 10_000.0;
const LATENCY_TARGET: f64 = 1.2;
const MEMORY_LIMIT_MB: f64 = 300.0;
/// The store's write lock (`src/store/postgres/mod.rs`): the floor takes the same one.
const WRITE_LOCK: i64 = 0x7072_6563_6465_6e74;
const BATCH: usize = 100;

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.replace('_', "").parse().ok())
        .unwrap_or(default)
}

fn options() -> StoreOptions {
    StoreOptions {
        busy_timeout: Duration::from_secs(60),
        ..StoreOptions::default()
    }
}

const ONE_STORE: &str = "given s: Shop
match o: Shop.Order where o->shop = s
  and not exists (match sh: Shop.Shipment where sh->order = o)
select hash(o)";

/// The floor: the question asked by hand, as `benches/query.rs` asks it of SQLite, of
/// the fact rows alone: an order's shop and a shipment's order are each its fact's first
/// (and only) edge, in the fact's row (schema version 7), found by the partial index
/// `fact_by_first`.
const FLOOR_ONE: &str = "SELECT o.hash FROM fact s
  JOIN fact o ON o.p1 = s.seq AND o.p1_role = $2 AND o.type_id = $3
  WHERE s.hash = $1
    AND NOT EXISTS (
      SELECT 1 FROM fact sh
      WHERE sh.p1 = o.seq AND sh.p1_role = $4 AND sh.type_id = $5)
  ORDER BY o.seq";

/// A database for one phase: on the server of `PRECEDENT_BENCH_PG_URL` (a database of
/// that name with a suffix), or on a throwaway cluster.
struct Db {
    url: String,
}

fn new_db(name: &str) -> Db {
    match std::env::var("PRECEDENT_BENCH_PG_URL") {
        Ok(base) => {
            let mut c = Client::connect(&base, NoTls).unwrap();
            let db = format!("bench_{name}");
            c.batch_execute(&format!("DROP DATABASE IF EXISTS {db}"))
                .unwrap();
            c.batch_execute(&format!("CREATE DATABASE {db}")).unwrap();
            let at = base.rfind('/').unwrap();
            Db {
                url: format!("{}/{db}", &base[..at]),
            }
        }
        Err(_) => {
            // initdb's settings: fsync and synchronous commit on, as a durable server has.
            pg::use_settings(&[]);
            Db {
                url: pg::db().expect("PostgreSQL is installed").url,
            }
        }
    }
}

fn percentile(mut v: Vec<Duration>, p: f64) -> f64 {
    v.sort();
    let i = ((v.len() as f64 - 1.0) * p).round() as usize;
    v[i].as_secs_f64() * 1e3
}

fn own_peak_mb() -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        .unwrap()
        / 1024.0
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

fn name_id(c: &mut Client, table: &str, name: &str) -> i64 {
    c.query_one(&format!("SELECT id FROM {table} WHERE name = $1"), &[&name])
        .unwrap()
        .get(0)
}

// ---------------------------------------------------------------------------------------
// 1. Pending query

fn query_phase(stores: usize, orders: usize) -> Json {
    let db = new_db("query");
    let load_options = StoreOptions {
        durability: Durability::Normal,
        ..options()
    };
    let store = Store::open_with(&db.url, load_options).unwrap();
    let shops: Vec<Fact> = (0..stores).map(shop).collect();
    let started = Instant::now();
    let total = store_shop_orders(&store, &shops, orders);
    let load_secs = started.elapsed().as_secs_f64();
    eprintln!(
        "loaded {total} facts in {load_secs:.1} s ({:.0} facts/s)",
        total as f64 / load_secs
    );
    drop(store);

    let store = Store::open_with(&db.url, options()).unwrap();
    let mut floor = Client::connect(&db.url, NoTls).unwrap();
    let (role_shop, role_order) = (
        name_id(&mut floor, "role", "shop"),
        name_id(&mut floor, "role", "order"),
    );
    let (t_order, t_ship) = (
        name_id(&mut floor, "fact_type", "Shop.Order"),
        name_id(&mut floor, "fact_type", "Shop.Shipment"),
    );
    let floor_stmt = floor.prepare(FLOOR_ONE).unwrap();
    let one = Query::parse(ONE_STORE).unwrap();
    let mut rng = fastrand::Rng::with_seed(7);
    let picks: Vec<FactHash> = (0..200)
        .map(|_| shops[rng.usize(0..shops.len())].hash())
        .collect();

    let mut out = serde_json::Map::new();
    for stats in ["unanalysed", "analysed"] {
        if stats == "analysed" {
            floor.batch_execute("ANALYZE").unwrap();
        }
        let mut run_floor = |h: &FactHash| {
            floor
                .query(
                    &floor_stmt,
                    &[&&h.0[..], &role_shop, &t_order, &role_order, &t_ship],
                )
                .unwrap()
                .len()
        };
        let run_ours = |h: &FactHash| {
            let g = Givens::from([("s".to_string(), *h)]);
            store.query(&one, &g).unwrap().len()
        };
        for h in picks.iter().take(20) {
            assert_eq!(run_ours(h), run_floor(h), "ours and the floor agree");
        }
        let (mut ours_t, mut floor_t) = (Vec::new(), Vec::new());
        // Each pick's first reader meets its pages cold (read from the OS into shared
        // buffers) and the second finds them there: ours goes first on every other pick.
        for (i, h) in picks.iter().enumerate() {
            for ours_turn in [i % 2 == 0, i % 2 != 0] {
                let t = Instant::now();
                if ours_turn {
                    run_ours(h);
                    ours_t.push(t.elapsed());
                } else {
                    run_floor(h);
                    floor_t.push(t.elapsed());
                }
            }
        }
        let results = run_ours(&picks[0]);
        let (ours_med, floor_med) = (
            percentile(ours_t.clone(), 0.5),
            percentile(floor_t.clone(), 0.5),
        );
        let (ours_p99, floor_p99) = (percentile(ours_t, 0.99), percentile(floor_t, 0.99));
        let met = ours_med < QUERY_TARGET_MS;
        println!(
            "pending orders of one store ({stats}, {results} results): ours {ours_med:.3} ms (p99 {ours_p99:.3}), floor {floor_med:.3} ms (p99 {floor_p99:.3}), ratio {:.2}; target < {QUERY_TARGET_MS} ms: {}",
            ours_med / floor_med,
            if met { "met" } else { "missed" }
        );
        out.insert(
            stats.into(),
            json!({"results": results, "ours_median_ms": ours_med, "ours_p99_ms": ours_p99,
                   "floor_median_ms": floor_med, "floor_p99_ms": floor_p99,
                   "ratio": ours_med / floor_med, "met": met}),
        );
    }
    json!({"facts": total, "load_secs": load_secs, "load_facts_per_s": total as f64 / load_secs,
           "one_store": out})
}

// ---------------------------------------------------------------------------------------
// 2. Claim latency against completed history

/// Stores a shop and orders `from..to` (with `done`, each with its completion).
fn load_orders(store: &Store, from: usize, to: usize, done: bool) {
    let shop = shop(0);
    store.insert(&shop).unwrap();
    let mut i = from;
    while i < to {
        let end = (i + 50_000).min(to);
        let mut facts = Vec::with_capacity((end - i) * 2);
        for k in i..end {
            let o = order(&shop, 0, k);
            if done {
                facts.push(shipped(&o.hash()));
            }
            facts.push(o);
        }
        store.insert_batch(facts).unwrap();
        i = end;
    }
}

fn claim_latency(name: &str, history: usize, probe: usize) -> (f64, f64) {
    let db = new_db(name);
    let store = Store::open_with(&db.url, options()).unwrap();
    // Declared first, so the history goes through the queue index as it is stored: a
    // declaration over a stored history back-fills it one fact at a time, a round trip
    // or more each on PostgreSQL (docs/performance.md, "A hub on PostgreSQL").
    store.declare_queue(&spec()).unwrap();
    load_orders(&store, 0, history, true);
    load_orders(&store, history, history + probe, false);
    // What autovacuum does after this many deletions (a completed input's item row is
    // deleted): without it the claim's index walks past the dead entries of the history.
    let mut c = Client::connect(&db.url, NoTls).unwrap();
    let vacuum = std::env::var("PRECEDENT_BENCH_PG_VACUUM").as_deref() != Ok("0");
    c.batch_execute(if vacuum { "VACUUM ANALYZE" } else { "ANALYZE" })
        .unwrap();
    let mut times = Vec::with_capacity(probe);
    for _ in 0..probe {
        let t = Instant::now();
        let leases = store.claim("ship", 1).unwrap();
        times.push(t.elapsed());
        assert_eq!(leases.len(), 1);
        store
            .complete(&leases[0], |w| {
                w.insert(&leases[0].completion().field("by", "bench").build()?)
            })
            .unwrap();
    }
    let mean = times.iter().sum::<Duration>().as_secs_f64() * 1e3 / probe as f64;
    (percentile(times, 0.5), mean)
}

fn latency_phase(history: usize) -> Json {
    let probe = 1_000;
    let (empty_p50, empty_mean) = claim_latency("claim_empty", 0, probe);
    let (full_p50, full_mean) = claim_latency("claim_history", history, probe);
    let ratio = full_p50 / empty_p50;
    let met = ratio <= LATENCY_TARGET;
    println!(
        "claim latency: p50 {empty_p50:.3} ms with no history, {full_p50:.3} ms with {history} completed (ratio {ratio:.2}; mean {empty_mean:.3} / {full_mean:.3} ms); target <= {LATENCY_TARGET}: {}",
        if met { "met" } else { "missed" }
    );
    json!({"history": history, "probe": probe, "empty_p50_ms": empty_p50, "history_p50_ms": full_p50,
           "empty_mean_ms": empty_mean, "history_mean_ms": full_mean, "ratio": ratio, "met": met})
}

// ---------------------------------------------------------------------------------------
// 3. Claim+complete, 4 workers in 2 processes

const CHILD_ENV: &str = "PRECEDENT_BENCH_PG_CHILD";

/// A worker process: `threads` threads claiming and completing until the queue is empty,
/// started when a line arrives on stdin; prints how many it completed and its peak.
fn child(side: &str, url: &str, threads: usize) {
    let ready: Vec<_> = (0..threads)
        .map(|_| {
            let url = url.to_string();
            let side = side.to_string();
            let (go_tx, go_rx) = std::sync::mpsc::channel::<()>();
            let done = Arc::new(AtomicU64::new(0));
            let d = done.clone();
            let h = std::thread::spawn(move || {
                if side == "ours" {
                    let store = Store::open_with(&url, options()).unwrap();
                    // The first connection opened before the start.
                    store.stats().unwrap();
                    go_rx.recv().unwrap();
                    ours_worker(&store, &d);
                } else {
                    let mut c = Client::connect(&url, NoTls).unwrap();
                    go_rx.recv().unwrap();
                    floor_worker(&mut c, &d);
                }
            });
            (go_tx, done, h)
        })
        .collect();
    println!("ready");
    std::io::stdout().flush().unwrap();
    let mut line = String::new();
    std::io::stdin().read_line(&mut line).unwrap();
    for (go, ..) in &ready {
        go.send(()).unwrap();
    }
    let mut total = 0;
    for (_, done, h) in ready {
        h.join().unwrap();
        total += done.load(Ordering::Relaxed);
    }
    println!("{total} {:.1}", own_peak_mb());
}

fn ours_worker(store: &Store, done: &AtomicU64) {
    loop {
        let leases = store.claim("ship", BATCH).unwrap();
        if leases.is_empty() {
            return;
        }
        let results = store
            .complete_batch(&leases, |w, lease| {
                w.insert(&lease.completion().field("by", "bench").build()?)
                    .map(|_| ())
            })
            .unwrap();
        assert!(results.iter().all(|r| r.is_ok()));
        done.fetch_add(leases.len() as u64, Ordering::Relaxed);
    }
}

fn floor_worker(c: &mut Client, done: &AtomicU64) {
    let claim = c
        .prepare(
            "WITH c AS (
                 SELECT input FROM queue_item
                 WHERE queue_id = 1 AND claimable_at <= $1
                 ORDER BY claimable_at, input LIMIT $2 FOR UPDATE SKIP LOCKED)
             UPDATE queue_item i SET state = 1, attempts = attempts + 1,
                 first_attempt_at = coalesce(first_attempt_at, $1),
                 lease_token = i.input * 7919, claimable_at = $1 + 30000
             FROM c WHERE i.queue_id = 1 AND i.input = c.input
             RETURNING i.input, (SELECT hash FROM fact WHERE seq = i.input)",
        )
        .unwrap();
    // A completion's one edge (to its order) in its own row: no `edge_more` row.
    let facts = c
        .prepare(
            "INSERT INTO fact (seq, hash, type_id, bytes, p1, p1_role, p1_type)
             SELECT s, h, t, b, p, $6::bigint, $7::bigint
             FROM unnest($1::bigint[], $2::bytea[], $3::bigint[], $4::bytea[], $5::bigint[])
                 AS u(s, h, t, b, p)",
        )
        .unwrap();
    let delete = c
        .prepare("DELETE FROM queue_item WHERE queue_id = 1 AND input = ANY($1)")
        .unwrap();
    // The completion's type and role are named by the first completion (ours names it the same way).
    c.execute(
        "INSERT INTO fact_type (name) VALUES ('Shop.Shipped') ON CONFLICT (name) DO NOTHING",
        &[],
    )
    .unwrap();
    c.execute(
        "INSERT INTO role (name) VALUES ('order') ON CONFLICT (name) DO NOTHING",
        &[],
    )
    .unwrap();
    let (t_shipped, r_order, t_order) = (
        name_id(c, "fact_type", "Shop.Shipped"),
        name_id(c, "role", "order"),
        name_id(c, "fact_type", "Shop.Order"),
    );
    loop {
        let mut tx = c.transaction().unwrap();
        let claimed: Vec<(i64, FactHash)> = tx
            .query(&claim, &[&now_ms(), &(BATCH as i64)])
            .unwrap()
            .iter()
            .map(|r| {
                (
                    r.get(0),
                    FactHash::from_slice(r.get::<_, &[u8]>(1)).unwrap(),
                )
            })
            .collect();
        tx.commit().unwrap();
        if claimed.is_empty() {
            return;
        }
        let mut tx = c.transaction().unwrap();
        tx.execute("SELECT pg_advisory_xact_lock($1)", &[&WRITE_LOCK])
            .unwrap();
        let last: i64 = tx
            .query_one("SELECT value FROM counter WHERE name = 'seq'", &[])
            .unwrap()
            .get(0);
        let n = claimed.len() as i64;
        let seqs: Vec<i64> = (last + 1..=last + n).collect();
        let made: Vec<Fact> = claimed.iter().map(|(_, h)| shipped(h)).collect();
        let hashes: Vec<Vec<u8>> = made.iter().map(|f| f.hash().0.to_vec()).collect();
        let bytes: Vec<&[u8]> = made.iter().map(|f| f.canonical_bytes()).collect();
        let types = vec![t_shipped; made.len()];
        let inputs: Vec<i64> = claimed.iter().map(|(s, _)| *s).collect();
        tx.execute(
            &facts,
            &[&seqs, &hashes, &types, &bytes, &inputs, &r_order, &t_order],
        )
        .unwrap();
        tx.execute(&delete, &[&inputs]).unwrap();
        tx.execute(
            "UPDATE counter SET value = $1 WHERE name = 'seq'",
            &[&(last + n)],
        )
        .unwrap();
        tx.commit().unwrap();
        done.fetch_add(claimed.len() as u64, Ordering::Relaxed);
    }
}

/// Runs two worker processes of two threads on `url`; returns inputs/s and each
/// process's peak memory.
fn two_processes(side: &str, url: &str, n: usize) -> (f64, Vec<f64>) {
    let exe = std::env::current_exe().unwrap();
    let mut children: Vec<_> = (0..2)
        .map(|_| {
            Command::new(&exe)
                .env(CHILD_ENV, format!("{side} 2 {url}"))
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    let mut outs: Vec<_> = children
        .iter_mut()
        .map(|c| BufReader::new(c.stdout.take().unwrap()))
        .collect();
    for o in &mut outs {
        let mut line = String::new();
        o.read_line(&mut line).unwrap();
        assert_eq!(line.trim(), "ready");
    }
    let started = Instant::now();
    for c in &mut children {
        writeln!(c.stdin.as_mut().unwrap(), "go").unwrap();
    }
    let (mut total, mut peaks) = (0u64, Vec::new());
    for (mut c, mut o) in children.into_iter().zip(outs) {
        let mut line = String::new();
        o.read_line(&mut line).unwrap();
        assert!(c.wait().unwrap().success(), "worker process failed");
        let mut parts = line.split_whitespace();
        total += parts.next().unwrap().parse::<u64>().unwrap();
        peaks.push(parts.next().unwrap().parse::<f64>().unwrap());
    }
    let secs = started.elapsed().as_secs_f64();
    assert_eq!(total, n as u64, "every input completed once");
    (n as f64 / secs, peaks)
}

fn throughput_phase(n: usize) -> Json {
    let mut out = serde_json::Map::new();
    for side in ["floor", "ours"] {
        let db = new_db(&format!("throughput_{side}"));
        let store = Store::open_with(&db.url, options()).unwrap();
        store.declare_queue(&spec()).unwrap();
        load_orders(&store, 0, n, false);
        drop(store);
        let mut c = Client::connect(&db.url, NoTls).unwrap();
        c.batch_execute("ANALYZE").unwrap();
        let queue_id: i64 = c
            .query_one("SELECT id FROM queue WHERE name = 'ship'", &[])
            .unwrap()
            .get(0);
        assert_eq!(queue_id, 1, "the floor's statements name queue 1");
        let (rate, peaks) = two_processes(side, &db.url, n);
        let done: i64 = c
            .query_one(
                "SELECT count(*) FROM fact f JOIN fact_type t ON t.id = f.type_id
                 WHERE t.name = 'Shop.Shipped'",
                &[],
            )
            .unwrap()
            .get(0);
        assert_eq!(done, n as i64, "{side}: one completion fact per input");
        println!(
            "claim+complete, 4 workers in 2 processes, {side}: {rate:.0} inputs/s, peaks {peaks:?} MB"
        );
        out.insert(side.into(), json!({"per_second": rate, "peak_mb": peaks}));
    }
    let (ours, floor) = (
        out["ours"]["per_second"].as_f64().unwrap(),
        out["floor"]["per_second"].as_f64().unwrap(),
    );
    let met = ours >= THROUGHPUT_TARGET;
    println!(
        "claim+complete, 4 workers in 2 processes: ours / floor {:.2}; target >= {THROUGHPUT_TARGET} inputs/s: {}",
        ours / floor,
        if met { "met" } else { "missed" }
    );
    out.insert("inputs".into(), json!(n));
    out.insert("ratio".into(), json!(ours / floor));
    out.insert("met".into(), json!(met));
    Json::Object(out)
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        println!("pg_hub: benchmark");
        return;
    }
    if let Ok(args) = std::env::var(CHILD_ENV) {
        let mut a = args.splitn(3, ' ');
        let (side, threads, url) = (a.next().unwrap(), a.next().unwrap(), a.next().unwrap());
        child(side, url, threads.parse().unwrap());
        return;
    }
    let stores = env_usize("PRECEDENT_BENCH_STORES", 1_000);
    let orders = env_usize("PRECEDENT_BENCH_ORDERS", 530);
    let history = env_usize("PRECEDENT_BENCH_PG_HISTORY", 200_000);
    let n = env_usize("PRECEDENT_BENCH_PG_QUEUE_N", 40_000);
    let phases = std::env::var("PRECEDENT_BENCH_PG_PHASES")
        .unwrap_or_else(|_| "query,latency,throughput".into());
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    eprintln!(
        "pg_hub bench: {stores} x {orders} orders, history {history}, queue {n}; load average {}",
        load.trim()
    );
    let mut report = serde_json::Map::new();
    report.insert("load_average_start".into(), json!(load.trim()));
    if phases.contains("query") {
        report.insert("query".into(), query_phase(stores, orders));
    }
    if phases.contains("latency") {
        report.insert("latency".into(), latency_phase(history));
    }
    if phases.contains("throughput") {
        report.insert("throughput".into(), throughput_phase(n));
    }
    let peak = own_peak_mb();
    let mut peaks = vec![peak];
    if let Some(t) = report.get("throughput") {
        for side in ["ours"] {
            for p in t[side]["peak_mb"].as_array().unwrap() {
                peaks.push(p.as_f64().unwrap());
            }
        }
    }
    let worst = peaks.iter().cloned().fold(0.0, f64::max);
    let met = worst < MEMORY_LIMIT_MB;
    println!(
        "memory: this process {peak:.1} MB, our worker processes {:?} MB; target < {MEMORY_LIMIT_MB} MB each: {}",
        &peaks[1..],
        if met { "met" } else { "missed" }
    );
    report.insert(
        "peak_mb".into(),
        json!({"bench": peak, "all": peaks, "met": met}),
    );
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    report.insert("load_average_end".into(), json!(load.trim()));
    let out = std::env::var("PRECEDENT_BENCH_OUT")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|_| {
            std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/bench-pg-hub.json")
        });
    std::fs::write(
        out,
        serde_json::to_string_pretty(&Json::Object(report)).unwrap(),
    )
    .unwrap();
}
