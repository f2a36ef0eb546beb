//! Streaming benchmark: a query with many results, read as it streams, against the same
//! SQL statement stepped by raw rusqlite (the floor).
//!
//! `cargo bench --bench stream` builds (once, kept in `target/`) a store of `SHOPS` shops
//! with `ORDERS` orders each, every order with one shipment and every other order with a
//! second: 1,000 x 400 gives 1,001,000 facts. Then each side runs in a child process of
//! its own and writes one line per result to a pipe that this process reads. A child's
//! peak resident memory (`ru_maxrss`, from `wait4`) starts from that of the process that
//! spawned it, so the store is built by a child too and this process stays small:
//! - `cli`: `precedent --json query` (each result decoded, projected and printed as JSON);
//! - `iter`: `Store::query_iter`, each result rendered as JSON;
//! - `floor`: the statement `Store::compiled_sql` gives, stepped by rusqlite, each row's
//!   sequence number printed.
//!
//! For each: the time to the first line, the total time, the peak RSS, the number of
//! results; and the ratios to the floor.
//!
//! Settings, from the environment: `PRECEDENT_BENCH_SHOPS` (default 1,000),
//! `PRECEDENT_BENCH_ORDERS` (orders per shop, default 400).
//!
//! See `docs/performance.md` (`## Streaming query results`) for the figures.

use std::io::{BufRead, BufReader, BufWriter, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

use precedent::query::{Givens, Query};
use precedent::store::Durability;
use precedent::{Fact, Store, StoreOptions};

/// 400,000 results with the default sizes: every order, two fields of each.
const QUERY: &str = "match o: Shop.Order select {id: o.id, total: o.total}";

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.replace('_', "").parse().ok())
        .unwrap_or(default)
}

/// Builds the store unless a complete one is already there.
fn build(path: &Path, shops: usize, orders: usize) {
    let done = path.with_extension("done");
    if done.exists() {
        return;
    }
    let _ = std::fs::remove_file(path);
    let options = StoreOptions {
        durability: Durability::Normal,
        ..StoreOptions::default()
    };
    let store = Store::open_with(path, options).unwrap();
    let started = Instant::now();
    let shops: Vec<Fact> = (0..shops)
        .map(|i| Fact::builder("Shop").field("name", format!("shop-{i}")))
        .map(|b| b.build().unwrap())
        .collect();
    store.insert_batch(shops.clone()).unwrap();
    let (mut chunk, mut total) = (Vec::with_capacity(50_000), shops.len());
    for o in 0..orders {
        for (i, s) in shops.iter().enumerate() {
            let id = (o * shops.len() + i) as i64;
            let order = Fact::builder("Shop.Order")
                .field("id", id)
                .field("total", (id % 97) as f64 + 0.5)
                .predecessor("shop", s.hash())
                .build()
                .unwrap();
            for carrier in ["post", "courier"].iter().take(1 + (id % 2) as usize) {
                let ship = Fact::builder("Shop.Shipment").field("carrier", *carrier);
                chunk.push(ship.predecessor("order", order.hash()).build().unwrap());
            }
            chunk.push(order);
            if chunk.len() >= 50_000 {
                total += chunk.len();
                store.insert_batch(std::mem::take(&mut chunk)).unwrap();
            }
        }
    }
    total += chunk.len();
    store.insert_batch(chunk).unwrap();
    eprintln!(
        "built {total} facts in {:.1} s",
        started.elapsed().as_secs_f64()
    );
    std::fs::write(&done, "").unwrap();
}

/// What a child process measured from outside.
struct Run {
    first_s: f64,
    total_s: f64,
    peak_mib: f64,
    results: u64,
}

/// Runs `cmd`, reading its stdout a line at a time.
// The child is reaped by `wait4` below, which also gives its peak memory.
#[allow(clippy::zombie_processes)]
fn measure(mut cmd: Command) -> Run {
    let started = Instant::now();
    let mut child = cmd.stdout(Stdio::piped()).spawn().unwrap();
    let mut out = BufReader::with_capacity(1 << 16, child.stdout.take().unwrap());
    let (mut line, mut first_s, mut results) = (Vec::new(), 0.0, 0u64);
    while out.read_until(b'\n', &mut line).unwrap() > 0 {
        if results == 0 {
            first_s = started.elapsed().as_secs_f64();
        }
        results += 1;
        line.clear();
    }
    let (mut status, mut usage) = (0, unsafe { std::mem::zeroed::<libc::rusage>() });
    // SAFETY: wait4 writes the status and the usage into the pointers it is given; the
    // child is not waited for elsewhere.
    let pid = unsafe { libc::wait4(child.id() as i32, &mut status, 0, &mut usage) };
    assert!(pid > 0 && libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0);
    Run {
        first_s,
        total_s: started.elapsed().as_secs_f64(),
        // Linux reports ru_maxrss in KiB.
        peak_mib: usage.ru_maxrss as f64 / 1024.0,
        results,
    }
}

/// The child side of `iter`: the library's iterator, each result printed as JSON.
fn child_iter(db: &Path) {
    let store = Store::open(db).unwrap();
    let q = Query::parse(QUERY).unwrap();
    let mut out = BufWriter::with_capacity(1 << 16, std::io::stdout().lock());
    for (i, row) in store.query_iter(&q, &Givens::new()).unwrap().enumerate() {
        serde_json::to_writer(&mut out, &row.unwrap().value.to_json()).unwrap();
        out.write_all(b"\n").unwrap();
        if i == 0 {
            out.flush().unwrap();
        }
    }
    out.flush().unwrap();
}

/// The child side of `floor`: the compiled statement stepped by rusqlite.
fn child_floor(db: &Path) {
    let store = Store::open(db).unwrap();
    let (sql, params) = store
        .compiled_sql(&Query::parse(QUERY).unwrap(), &Givens::new())
        .unwrap();
    drop(store);
    // Without givens or field tests the parameters are type ids: `Int(n)`.
    let params: Vec<i64> = params
        .iter()
        .map(|p| p.trim_start_matches("Int(").trim_end_matches(')').parse())
        .collect::<Result<_, _>>()
        .expect("integer parameters");
    let flags = rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY;
    let conn = rusqlite::Connection::open_with_flags(db, flags).unwrap();
    let mut stmt = conn.prepare(&sql).unwrap();
    let mut rows = stmt.query(rusqlite::params_from_iter(params)).unwrap();
    let mut out = BufWriter::with_capacity(1 << 16, std::io::stdout().lock());
    let mut first = true;
    while let Some(row) = rows.next().unwrap() {
        // The row's values are read, as the query reads them, and one number printed.
        let seq: i64 = row.get(0).unwrap();
        let (_hash, _bytes) = (row.get_ref(1).unwrap(), row.get_ref(2).unwrap());
        writeln!(out, "{seq}").unwrap();
        if std::mem::take(&mut first) {
            out.flush().unwrap();
        }
    }
    out.flush().unwrap();
}

fn main() {
    if let Ok(db) = std::env::var("PRECEDENT_STREAM_DB") {
        let db = Path::new(&db);
        if let Ok(size) = std::env::var("PRECEDENT_STREAM_BUILD") {
            let (shops, orders) = size.split_once('x').unwrap();
            return build(db, shops.parse().unwrap(), orders.parse().unwrap());
        }
        return match std::env::var("PRECEDENT_STREAM_CHILD").as_deref() {
            Ok("iter") => child_iter(db),
            _ => child_floor(db),
        };
    }
    let (shops, orders) = (
        env_usize("PRECEDENT_BENCH_SHOPS", 1_000),
        env_usize("PRECEDENT_BENCH_ORDERS", 400),
    );
    let name = format!("bench-stream-{shops}x{orders}.db");
    let db = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(name);
    // Built by a child, so that this process stays small (see above).
    let built = Command::new(std::env::current_exe().unwrap())
        .env("PRECEDENT_STREAM_DB", &db)
        .env("PRECEDENT_STREAM_BUILD", format!("{shops}x{orders}"))
        .status()
        .unwrap();
    assert!(built.success());

    let child = |mode: &str| {
        let mut c = Command::new(std::env::current_exe().unwrap());
        c.env("PRECEDENT_STREAM_CHILD", mode)
            .env("PRECEDENT_STREAM_DB", &db);
        c
    };
    let floor = measure(child("floor"));
    let mut cli = Command::new(env!("CARGO_BIN_EXE_precedent"));
    cli.arg("--db").arg(&db).args(["--json", "query", QUERY]);
    cli.stderr(Stdio::null());
    let ours = [("cli", measure(cli)), ("iter", measure(child("iter")))];

    println!("query: {QUERY}");
    println!(
        "floor (rusqlite, streaming): {} results, first {:.3} s, total {:.2} s, peak {:.1} MiB",
        floor.results, floor.first_s, floor.total_s, floor.peak_mib
    );
    for (name, run) in &ours {
        assert_eq!(
            run.results, floor.results,
            "{name}: not the floor's results"
        );
        println!(
            "{name}: {} results, first {:.3} s ({:.1}% of its total), total {:.2} s \
             (floor {:.2} s, ratio {:.1}), peak {:.1} MiB (floor {:.1} MiB, ratio {:.1})",
            run.results,
            run.first_s,
            100.0 * run.first_s / run.total_s,
            run.total_s,
            floor.total_s,
            run.total_s / floor.total_s,
            run.peak_mib,
            floor.peak_mib,
            run.peak_mib / floor.peak_mib,
        );
    }
}
