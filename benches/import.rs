//! Import benchmark: `precedent import` (the optimised binary, as a child process) of N
//! shop facts, against `insert_batch` of the same facts already decoded, encoded and
//! hashed (the store's own rate: the floor).
//!
//! In one run, each in a fresh database and a process of its own:
//! 1. `precedent import` of JSON Lines, in release order and children first (reversed);
//! 2. the same as a CBOR sequence;
//! 3. the floor: a child of this bench that reads the CBOR sequence, decodes a batch
//!    (untimed) and times `insert_batch` alone, in order and reversed.
//!
//! It prints each time, the floor, the ratio and whether the targets hold: at least 0.8
//! of the floor in order, 0.4 children first, and peak resident memory (`VmHWM` of the
//! child, watched while it runs) of every import under 300 MB.
//!
//! Settings, from the environment:
//! - `PRECEDENT_BENCH_IMPORT_N`: facts (default 1,000,000).
//! - `PRECEDENT_IMPORT_BATCH`: records per batch, passed on to `import` and used by the
//!   floor (default 50,000, as `import`'s own default).
//! - `PRECEDENT_IMPORT_THREADS`: passed on to `import` (default: one per core).
//! - `PRECEDENT_BENCH_OUT`: where to write the JSON (default `target/bench-import.json`).
//! - `PRECEDENT_BENCH_IMPORT_DIR`: keep the input files in this directory, and reuse
//!   them when they are there for the same N (default: a temporary directory).
//! - `PRECEDENT_BENCH_IMPORT_PHASES`: a comma-separated list of the import phases to run
//!   (`jsonl-in-order`, `jsonl-reversed`, `cbor-in-order`, `cbor-reversed`; default all);
//!   the floors run whenever a phase of their order does.
//!
//! See `docs/performance.md`, "Import", for the method and the figures.

use std::fs::File;
use std::io::{BufWriter, Read, Write};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use precedent::store::StoreOptions;
use precedent::{Fact, FactHash, Store, encoding, json};
use serde_json::json;

mod common;

use common::{BIN, env_num, reap, watch_peak};

/// `import`'s default batch (`src/cli/import.rs`, `CHUNK_RECORDS`).
const DEFAULT_BATCH: u64 = 50_000;
const MEMORY_LIMIT_MB: f64 = 300.0;
const IN_ORDER_TARGET: f64 = 0.8;
const REVERSED_TARGET: f64 = 0.4;

/// A seeded xorshift generator.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

/// The shop, in release order: 20 stores and 2,000 products first, then customers (one
/// fact in 20, naming a store), orders (naming a customer and a store), order lines
/// (naming an order among the last 4,096 and a product), payments and shipments (naming
/// a recent order). Fields as a shop writes them: ids, names, amounts, times, notes.
fn shop(n: u64, mut emit: impl FnMut(&Fact)) {
    let mut rng = Rng(0x5EED_5409_2026_0001);
    let mut stores = Vec::new();
    let mut products = Vec::new();
    let mut customers: Vec<FactHash> = Vec::new();
    let mut orders: Vec<FactHash> = Vec::with_capacity(4096);
    let at = |i: u64| 1_796_000_000_000i64 + i as i64 * 1_000;
    for i in 0..n {
        let b = if stores.len() < 20 {
            Fact::builder("Shop.Store")
                .field("code", format!("S{:03}", stores.len()))
                .field("city", ["Lyon", "Porto", "Gent", "Turku"][i as usize % 4])
                .field("opened_at", at(i))
        } else if products.len() < 2_000 {
            Fact::builder("Shop.Product")
                .field("sku", format!("SKU-{:06}", products.len()))
                .field(
                    "name",
                    format!("product {} of the catalogue", products.len()),
                )
                .field("price", (rng.below(20_000) as f64) / 100.0)
        } else {
            let r = rng.below(100);
            if customers.is_empty() || r < 5 {
                Fact::builder("Shop.Customer")
                    .field("id", customers.len() as i64)
                    .field("email", format!("customer{}@example.com", customers.len()))
                    .field("joined_at", at(i))
                    .predecessor("store", stores[rng.below(stores.len())])
            } else if orders.is_empty() || r < 30 {
                Fact::builder("Shop.Order")
                    .field("id", i as i64)
                    .field("placed_at", at(i))
                    .field("channel", ["web", "app", "till"][rng.below(3)])
                    .predecessor("customer", customers[rng.below(customers.len())])
                    .predecessor("store", stores[rng.below(stores.len())])
            } else if r < 80 {
                Fact::builder("Shop.OrderLine")
                    .field("qty", 1 + rng.below(5) as i64)
                    .field("unit_price", (rng.below(20_000) as f64) / 100.0)
                    .predecessor("order", orders[rng.below(orders.len())])
                    .predecessor("product", products[rng.below(products.len())])
            } else if r < 92 {
                Fact::builder("Shop.Payment")
                    .field("amount", (rng.below(100_000) as f64) / 100.0)
                    .field("method", ["card", "cash", "transfer"][rng.below(3)])
                    .field("paid_at", at(i))
                    .predecessor("order", orders[rng.below(orders.len())])
            } else {
                Fact::builder("Shop.Shipment")
                    .field("carrier", ["post", "courier"][rng.below(2)])
                    .field(
                        "tracking",
                        format!("TRK{:012}", rng.next() % 1_000_000_000_000),
                    )
                    .field("note", "leave with the neighbour if nobody is in")
                    .predecessor("order", orders[rng.below(orders.len())])
            }
        };
        let f = b.build().unwrap();
        match f.type_name() {
            "Shop.Store" => stores.push(f.hash()),
            "Shop.Product" => products.push(f.hash()),
            "Shop.Customer" => customers.push(f.hash()),
            "Shop.Order" if orders.len() < 4096 => orders.push(f.hash()),
            "Shop.Order" => orders[i as usize % 4096] = f.hash(),
            _ => {}
        }
        emit(&f);
    }
}

/// Writes the four inputs: JSON Lines and CBOR, in order and reversed. The in-order files
/// are written as generated; the reversed ones from them, record by record, last first.
fn write_inputs(dir: &Path, n: u64) {
    let mut jsonl = BufWriter::new(File::create(dir.join("in-order.jsonl")).unwrap());
    let mut cbor = BufWriter::new(File::create(dir.join("in-order.cbor")).unwrap());
    let (mut json_ends, mut cbor_ends) = (Vec::new(), Vec::new());
    let (mut json_at, mut cbor_at) = (0u64, 0u64);
    shop(n, |f| {
        let mut line = json::to_json(f).to_string();
        line.push('\n');
        jsonl.write_all(line.as_bytes()).unwrap();
        json_at += line.len() as u64;
        json_ends.push(json_at);
        cbor.write_all(f.canonical_bytes()).unwrap();
        cbor_at += f.canonical_bytes().len() as u64;
        cbor_ends.push(cbor_at);
    });
    jsonl.flush().unwrap();
    cbor.flush().unwrap();
    drop((jsonl, cbor));
    for (name, ends) in [("jsonl", json_ends), ("cbor", cbor_ends)] {
        let all = std::fs::read(dir.join(format!("in-order.{name}"))).unwrap();
        let mut out = BufWriter::new(File::create(dir.join(format!("reversed.{name}"))).unwrap());
        for i in (0..ends.len()).rev() {
            let start = if i == 0 { 0 } else { ends[i - 1] as usize };
            out.write_all(&all[start..ends[i] as usize]).unwrap();
        }
        out.flush().unwrap();
    }
}

/// A child run to its end: what it printed, whether it exited 0, its CPU seconds and its
/// peak memory (`VmHWM`, watched while it runs: `ru_maxrss` would carry this process's
/// own resident size, which holds the input files just written, across `exec`).
struct Ran {
    out: String,
    ok: bool,
    cpu: f64,
    peak_mb: f64,
}

fn run(cmd: &mut Command) -> Ran {
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let peak = watch_peak(child.id());
    let mut out = String::new();
    child
        .stdout
        .take()
        .unwrap()
        .read_to_string(&mut out)
        .unwrap();
    let exit = reap(child);
    Ran {
        out,
        ok: exit.ok,
        cpu: exit.cpu_secs,
        peak_mb: peak.join().unwrap(),
    }
}

struct Measured {
    secs: f64,
    peak_mb: f64,
    cpu: f64,
    report: serde_json::Value,
}

/// `precedent --json --db DB --max-held N import FILE`, timed.
fn import(dir: &Path, file: &str, n: u64, batch: u64) -> Measured {
    let db = dir.join(format!("{file}.db"));
    let start = Instant::now();
    let ran = run(Command::new(BIN)
        .env("PRECEDENT_IMPORT_BATCH", batch.to_string())
        .arg("--json")
        .arg("--db")
        .arg(&db)
        .args(["--max-held", &n.max(1).to_string(), "import"])
        .arg(dir.join(file)));
    let secs = start.elapsed().as_secs_f64();
    assert!(ran.ok, "precedent import {file} failed");
    let report: serde_json::Value = serde_json::from_str(&ran.out).unwrap();
    assert_eq!(report["released"], n, "{file}: {report}");
    remove_db(&db);
    Measured {
        secs,
        peak_mb: ran.peak_mb,
        cpu: ran.cpu,
        report,
    }
}

fn remove_db(db: &Path) {
    for suffix in ["", "-wal", "-shm"] {
        let mut p = db.as_os_str().to_owned();
        p.push(suffix);
        let _ = std::fs::remove_file(p);
    }
}

/// The floor, in a child of this bench: `insert_batch` of each batch of the CBOR file,
/// decoded before the timer starts.
fn floor(dir: &Path, file: &str, n: u64, batch: u64) -> Measured {
    let start = Instant::now();
    let ran = run(Command::new(std::env::current_exe().unwrap())
        .env("PRECEDENT_BENCH_IMPORT_FLOOR", dir.join(file))
        .env("PRECEDENT_BENCH_IMPORT_N", n.to_string())
        .env("PRECEDENT_IMPORT_BATCH", batch.to_string()));
    let wall = start.elapsed().as_secs_f64();
    assert!(ran.ok, "floor {file} failed");
    let report: serde_json::Value = serde_json::from_str(&ran.out).unwrap();
    Measured {
        secs: report["secs"].as_f64().unwrap(),
        peak_mb: ran.peak_mb,
        cpu: ran.cpu,
        report: json!({"child": report, "wall_secs": wall}),
    }
}

/// The floor's child: times `insert_batch` alone.
fn floor_child(file: &Path, n: u64, batch: u64) {
    let all = std::fs::read(file).unwrap();
    let db = file.with_extension("floor.db");
    let options = StoreOptions {
        max_held: n.max(1),
        ..StoreOptions::default()
    };
    let store = Store::open_with(&db, options).unwrap();
    let mut pos = 0;
    let mut timed = Duration::ZERO;
    let mut released = 0;
    while pos < all.len() {
        let mut facts = Vec::with_capacity(batch as usize);
        while pos < all.len() && facts.len() < batch as usize {
            let len = encoding::item_len(&all[pos..]).unwrap().unwrap();
            facts.push(Fact::from_canonical(&all[pos..pos + len]).unwrap());
            pos += len;
        }
        let start = Instant::now();
        let report = store.insert_batch(facts).unwrap();
        timed += start.elapsed();
        released += report.released;
    }
    drop(store);
    remove_db(&db);
    assert_eq!(released, n);
    println!(
        "{}",
        json!({"secs": timed.as_secs_f64(), "released": released})
    );
}

fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

fn main() {
    let n = env_num("PRECEDENT_BENCH_IMPORT_N").unwrap_or(1_000_000);
    let batch = env_num("PRECEDENT_IMPORT_BATCH").unwrap_or(DEFAULT_BATCH);
    if let Ok(file) = std::env::var("PRECEDENT_BENCH_IMPORT_FLOOR") {
        floor_child(Path::new(&file), n, batch);
        return;
    }
    let threads = std::env::var("PRECEDENT_IMPORT_THREADS").unwrap_or_else(|_| {
        std::thread::available_parallelism()
            .map_or(1, |n| n.get())
            .to_string()
    });
    let temp = tempfile::tempdir().unwrap();
    let kept = std::env::var_os("PRECEDENT_BENCH_IMPORT_DIR").map(std::path::PathBuf::from);
    let dir = kept.as_deref().unwrap_or(temp.path());
    let started = Instant::now();
    let stamp = dir.join("inputs-n");
    if kept.is_none() || std::fs::read_to_string(&stamp).ok() != Some(n.to_string()) {
        std::fs::create_dir_all(dir).unwrap();
        write_inputs(dir, n);
        std::fs::write(&stamp, n.to_string()).unwrap();
    }
    let phases = std::env::var("PRECEDENT_BENCH_IMPORT_PHASES").ok();
    let wanted = |phase: &str| {
        phases
            .as_deref()
            .is_none_or(|p| p.split(',').any(|w| w.trim() == phase))
    };
    let size = |f: &str| std::fs::metadata(dir.join(f)).unwrap().len() as f64 / 1e6;
    println!(
        "import bench: N = {n}, batch {batch}, threads {threads}; JSON Lines {:.0} MB, CBOR {:.0} MB (written in {:.1} s); load average {}",
        size("in-order.jsonl"),
        size("in-order.cbor"),
        started.elapsed().as_secs_f64(),
        load_average()
    );
    let mut results = serde_json::Map::new();
    let mut floors = std::collections::HashMap::new();
    for order in ["in-order", "reversed"] {
        if !wanted(&format!("jsonl-{order}")) && !wanted(&format!("cbor-{order}")) {
            continue;
        }
        let m = floor(dir, &format!("{order}.cbor"), n, batch);
        println!(
            "floor {order:<9} insert_batch {:>7.2} s  {:>9.0} facts/s  (cpu {:.1} s)",
            m.secs,
            n as f64 / m.secs,
            m.cpu
        );
        floors.insert(order, m.secs);
        results.insert(
            format!("floor-{order}"),
            json!({"secs": m.secs, "peak_mb": m.peak_mb, "cpu_secs": m.cpu, "detail": m.report}),
        );
    }
    let mut all_met = true;
    for format in ["jsonl", "cbor"] {
        for order in ["in-order", "reversed"] {
            if !wanted(&format!("{format}-{order}")) {
                continue;
            }
            let m = import(dir, &format!("{order}.{format}"), n, batch);
            let ratio = floors[order] / m.secs;
            let target = if order == "in-order" {
                IN_ORDER_TARGET
            } else {
                REVERSED_TARGET
            };
            let met = ratio >= target && m.peak_mb < MEMORY_LIMIT_MB;
            all_met &= met;
            println!(
                "import {format:<5} {order:<9} {:>7.2} s  {:>9.0} facts/s  floor {:>6.2} s  ratio {:.3} (target >= {target}: {})  peak {:>5.1} MB (< {MEMORY_LIMIT_MB}: {})  cpu {:.1} s",
                m.secs,
                n as f64 / m.secs,
                floors[order],
                ratio,
                if ratio >= target { "met" } else { "MISSED" },
                m.peak_mb,
                if m.peak_mb < MEMORY_LIMIT_MB {
                    "met"
                } else {
                    "MISSED"
                },
                m.cpu,
            );
            results.insert(
                format!("import-{format}-{order}"),
                json!({"secs": m.secs, "peak_mb": m.peak_mb, "cpu_secs": m.cpu, "ratio": ratio,
                       "target": target, "met": met, "report": m.report}),
            );
        }
    }
    println!(
        "all targets {}; load average {}",
        if all_met { "met" } else { "NOT met" },
        load_average()
    );
    let out = std::env::var("PRECEDENT_BENCH_OUT").unwrap_or_else(|_| {
        let target = std::env::var("CARGO_TARGET_DIR").unwrap_or_else(|_| "target".into());
        format!("{target}/bench-import.json")
    });
    let doc = json!({"n": n, "batch": batch, "threads": threads, "results": results,
                     "load_average": load_average()});
    if let Err(e) = std::fs::write(&out, serde_json::to_string_pretty(&doc).unwrap()) {
        eprintln!("cannot write {out}: {e}");
    }
}
