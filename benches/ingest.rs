//! Ingest benchmark: the store against a raw-SQLite floor on the same schema.
//!
//! `cargo bench --bench ingest` runs every phase in a child process of its own (this
//! binary again, with `PRECEDENT_BENCH_PHASE` naming the phase), so that the peak memory
//! of each phase is its own. Each child prints one line of JSON; the parent prints the
//! table and the ratios and writes them to `target/bench-ingest.json`.
//!
//! Settings, from the environment:
//! - `PRECEDENT_BENCH_N`: facts per phase (default 1,000,000).
//! - `PRECEDENT_BENCH_CHUNK`: facts per batch / transaction (default 50,000).
//! - `PRECEDENT_BENCH_CACHE_MIB`: SQLite page cache for both sides (default: the store's).
//! - `PRECEDENT_BENCH_DURABILITY`: `full` or `normal` for both sides (default: the store's).
//! - `PRECEDENT_BENCH_PHASES`: comma-separated subset of the phases to run.
//! - `PRECEDENT_BENCH_OUT`: where to write the JSON (default `target/bench-ingest.json`).
//!
//! See `docs/performance.md` for the workload, what each side pays for, and the figures.

use std::collections::HashMap;
use std::fs::File;
use std::io::{BufWriter, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use precedent::store::Durability;
use precedent::{BatchReport, Fact, Store, StoreOptions};
use rusqlite::{Connection, OptionalExtension, TransactionBehavior, params};
use serde_json::{Value as Json, json};

/// The phases, in the order they run.
const PHASES: &[&str] = &[
    "ours-in-order",
    "ours-reversed",
    "ours-duplicates",
    "floor-in-order",
    "floor-duplicates",
];

/// Environment variable naming the phase a child process runs.
const PHASE_VAR: &str = "PRECEDENT_BENCH_PHASE";
/// Prefix of the one line of JSON a child prints.
const RESULT_TAG: &str = "precedent-bench-result ";

/// Targets: (ratio name, numerator phase, denominator phase, least acceptable ratio).
const TARGETS: &[(&str, &str, &str, f64)] = &[
    (
        "in-order / floor-in-order",
        "ours-in-order",
        "floor-in-order",
        0.75,
    ),
    (
        "duplicates / floor-duplicates",
        "ours-duplicates",
        "floor-duplicates",
        0.70,
    ),
    (
        "reversed / floor-in-order",
        "ours-reversed",
        "floor-in-order",
        0.25,
    ),
];

/// Peak resident memory every phase must stay under, in MB.
const MEMORY_LIMIT_MB: f64 = 300.0;

// ---------------------------------------------------------------------------------------
// Settings

#[derive(Clone, Debug)]
struct Config {
    n: u64,
    chunk: usize,
    cache_mib: u32,
    durability: Durability,
}

impl Config {
    fn from_env() -> Config {
        let defaults = StoreOptions::default();
        let durability = match env_str("PRECEDENT_BENCH_DURABILITY").as_deref() {
            None => defaults.durability,
            Some("full") | Some("FULL") => Durability::Full,
            Some("normal") | Some("NORMAL") => Durability::Normal,
            Some(other) => panic!("PRECEDENT_BENCH_DURABILITY: {other:?} is not full or normal"),
        };
        Config {
            n: env_num("PRECEDENT_BENCH_N").unwrap_or(1_000_000),
            chunk: env_num("PRECEDENT_BENCH_CHUNK").unwrap_or(50_000) as usize,
            cache_mib: env_num("PRECEDENT_BENCH_CACHE_MIB")
                .map(|v| v as u32)
                .unwrap_or(defaults.cache_mib),
            durability,
        }
    }

    fn store_options(&self) -> StoreOptions {
        StoreOptions {
            max_held: StoreOptions::default().max_held.max(self.n),
            durability: self.durability,
            cache_mib: self.cache_mib,
            ..StoreOptions::default()
        }
    }

    fn synchronous(&self) -> &'static str {
        match self.durability {
            Durability::Full => "FULL",
            Durability::Normal => "NORMAL",
        }
    }

    fn to_json(&self) -> Json {
        json!({
            "n": self.n,
            "chunk": self.chunk,
            "cache_mib": self.cache_mib,
            "synchronous": self.synchronous(),
        })
    }
}

fn env_str(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|s| !s.trim().is_empty())
}

fn env_num(name: &str) -> Option<u64> {
    env_str(name).map(|s| {
        s.trim()
            .replace('_', "")
            .parse()
            .unwrap_or_else(|_| panic!("{name}: {s:?} is not a whole number"))
    })
}

// ---------------------------------------------------------------------------------------
// Workload: benches/common/workload.rs

#[path = "common/workload.rs"]
mod workload;
use workload::Workload;

// ---------------------------------------------------------------------------------------
// Measurement helpers

/// Peak resident set size of this process so far, in MB (VmHWM).
fn peak_rss_mb() -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        .map(|kb| kb / 1024.0)
        .unwrap_or(f64::NAN)
}

/// Size of the database file and its WAL, in MB.
fn db_mb(path: &Path) -> f64 {
    let size = |p: PathBuf| std::fs::metadata(p).map(|m| m.len()).unwrap_or(0);
    let mut wal = path.as_os_str().to_owned();
    wal.push("-wal");
    (size(path.to_path_buf()) + size(PathBuf::from(wal))) as f64 / 1e6
}

/// A measured phase: facts, seconds of the timed work, and extra figures.
fn result(phase: &str, facts: u64, timed: Duration, started: Instant, extra: Json) -> Json {
    let secs = timed.as_secs_f64();
    json!({
        "phase": phase,
        "facts": facts,
        "seconds": secs,
        "facts_per_s": facts as f64 / secs,
        "peak_rss_mb": peak_rss_mb(),
        "wall_seconds": started.elapsed().as_secs_f64(),
        "extra": extra,
    })
}

// ---------------------------------------------------------------------------------------
// Our side: the store's public API

fn open_store(cfg: &Config, path: &Path) -> Store {
    Store::open_with(path, cfg.store_options()).expect("open store")
}

/// Ingests the workload in release order; returns the report, the insert_batch time and,
/// measured apart on copies and not included, the time `dag::release_order` takes on the
/// same chunks (the in-memory ordering step of insert_batch).
fn ours_load(cfg: &Config, store: &mut Store) -> (BatchReport, Duration, Duration) {
    let mut workload = Workload::new(cfg.n);
    let mut total = BatchReport::default();
    let mut timed = Duration::ZERO;
    let mut ordering = Duration::ZERO;
    loop {
        let chunk = workload.chunk(cfg.chunk);
        if chunk.is_empty() {
            break;
        }
        let copy = chunk.clone();
        let t = Instant::now();
        let ordered = precedent::dag::release_order(copy);
        ordering += t.elapsed();
        drop(ordered);
        // insert_batch takes the facts; a second handle on each (a reference count) keeps
        // the freeing of the generated facts out of the timed call, as for the floor.
        let keep = chunk.clone();
        let t = Instant::now();
        let report = store.insert_batch(chunk).expect("insert_batch");
        timed += t.elapsed();
        drop(keep);
        total.merge(report);
    }
    (total, timed, ordering)
}

fn ours_in_order(cfg: &Config) -> Json {
    let started = Instant::now();
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("bench.db");
    let mut store = open_store(cfg, &path);
    let (report, timed, ordering) = ours_load(cfg, &mut store);
    assert_eq!(report.inserted, cfg.n, "every fact released on arrival");
    assert_eq!(report.held, 0);
    result(
        "ours-in-order",
        cfg.n,
        timed,
        started,
        json!({
            "db_mb": db_mb(&path),
            "release_order_seconds": ordering.as_secs_f64(),
        }),
    )
}

fn ours_duplicates(cfg: &Config) -> Json {
    let started = Instant::now();
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("bench.db");
    let mut store = open_store(cfg, &path);
    let (first, first_timed, _) = ours_load(cfg, &mut store);
    assert_eq!(first.inserted, cfg.n);
    let (again, timed, ordering) = ours_load(cfg, &mut store);
    assert_eq!(again.duplicates, cfg.n, "the second pass is all duplicates");
    assert_eq!(again.inserted, 0);
    result(
        "ours-duplicates",
        cfg.n,
        timed,
        started,
        json!({
            "first_pass_seconds": first_timed.as_secs_f64(),
            "release_order_seconds": ordering.as_secs_f64(),
        }),
    )
}

/// The ordered workload's canonical bytes, spooled to a file so that it can be read back
/// a chunk at a time in reverse: `bounds[k]..bounds[k + 1]` is chunk k's byte range.
struct Spool {
    file: File,
    bounds: Vec<u64>,
}

impl Spool {
    fn write(cfg: &Config, path: &Path) -> Spool {
        let mut out = BufWriter::new(File::create(path).expect("create spool"));
        let mut workload = Workload::new(cfg.n);
        let mut bounds = vec![0u64];
        let mut at = 0u64;
        loop {
            let chunk = workload.chunk(cfg.chunk);
            if chunk.is_empty() {
                break;
            }
            for fact in &chunk {
                out.write_all(fact.canonical_bytes()).expect("write spool");
                at += fact.canonical_bytes().len() as u64;
            }
            bounds.push(at);
        }
        out.flush().expect("flush spool");
        drop(out);
        Spool {
            file: File::open(path).expect("open spool"),
            bounds,
        }
    }

    fn chunks(&self) -> usize {
        self.bounds.len() - 1
    }

    /// Chunk `k` of the ordered sequence, decoded, in reversed order.
    fn reversed_chunk(&mut self, k: usize) -> Vec<Fact> {
        let (start, end) = (self.bounds[k], self.bounds[k + 1]);
        let mut buf = vec![0u8; (end - start) as usize];
        self.file.seek(SeekFrom::Start(start)).expect("seek spool");
        self.file.read_exact(&mut buf).expect("read spool");
        let mut facts = Vec::new();
        let mut rest = &buf[..];
        while !rest.is_empty() {
            let len = precedent::encoding::item_len(rest)
                .expect("spooled framing")
                .expect("whole record");
            facts.push(Fact::from_canonical(&rest[..len]).expect("spooled fact"));
            rest = &rest[len..];
        }
        facts.reverse();
        facts
    }
}

fn ours_reversed(cfg: &Config) -> Json {
    let started = Instant::now();
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("bench.db");
    let mut spool = Spool::write(cfg, &dir.path().join("ordered.cbor"));
    let store = open_store(cfg, &path);
    let mut total = BatchReport::default();
    let mut timed = Duration::ZERO;
    let mut last_batch = Duration::ZERO;
    let mut most_held = 0u64;
    for k in (0..spool.chunks()).rev() {
        let chunk = spool.reversed_chunk(k);
        let keep = chunk.clone();
        let t = Instant::now();
        let report = store.insert_batch(chunk).expect("insert_batch");
        last_batch = t.elapsed();
        drop(keep);
        timed += last_batch;
        assert!(report.refused.is_empty(), "max_held >= N refuses nothing");
        most_held = most_held.max(total.held + report.held);
        total.merge(report);
    }
    let stats = store.stats().expect("stats");
    assert_eq!(stats.held, 0, "nothing is left held");
    assert_eq!(stats.released, cfg.n);
    assert_eq!(total.released, cfg.n, "every fact released exactly once");
    result(
        "ours-reversed",
        cfg.n,
        timed,
        started,
        json!({
            "most_held": most_held,
            "last_batch_seconds": last_batch.as_secs_f64(),
            "db_mb": db_mb(&path),
        }),
    )
}

// ---------------------------------------------------------------------------------------
// The floor: raw rusqlite on the same schema, doing only the necessary SQLite work

struct Floor {
    conn: Connection,
    types: HashMap<String, i64>,
    roles: HashMap<String, i64>,
}

impl Floor {
    fn open(cfg: &Config, path: &Path) -> Floor {
        let conn = Connection::open(path).expect("open floor");
        conn.pragma_update(None, "journal_mode", "WAL").unwrap();
        conn.pragma_update(None, "synchronous", cfg.synchronous())
            .unwrap();
        conn.pragma_update(None, "cache_size", -(cfg.cache_mib as i64) * 1024)
            .unwrap();
        conn.pragma_update(None, "foreign_keys", "OFF").unwrap();
        conn.set_prepared_statement_cache_capacity(64);
        conn.execute_batch(include_str!("../schema/001_initial.sql"))
            .expect("schema");
        // The same edge table and index as the store's: both facts' types in each edge.
        conn.execute_batch(include_str!("../schema/005_edge_types.sql"))
            .expect("edge schema");
        Floor {
            conn,
            types: HashMap::new(),
            roles: HashMap::new(),
        }
    }

    /// Inserts facts whose predecessors are all stored, in one transaction: per fact, one
    /// lookup of each predecessor's seq and type by hash, the fact row and its edge rows.
    fn insert_chunk(&mut self, facts: &[Fact]) {
        let Floor { conn, types, roles } = self;
        let tx = conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .unwrap();
        {
            let mut lookup = tx
                .prepare_cached("SELECT seq, type_id FROM fact WHERE hash = ?1")
                .unwrap();
            let mut insert_fact = tx
                .prepare_cached("INSERT INTO fact (hash, type_id, bytes) VALUES (?1, ?2, ?3)")
                .unwrap();
            let mut insert_edge = tx
                .prepare_cached(
                    "INSERT INTO edge (predecessor, role_id, successor_type, successor, predecessor_type)
                     VALUES (?1, ?2, ?3, ?4, ?5)",
                )
                .unwrap();
            let mut preds: Vec<(i64, i64, i64)> = Vec::with_capacity(4);
            for fact in facts {
                let type_id = name_id(&tx, types, "fact_type", fact.type_name());
                preds.clear();
                for (role, set) in fact.predecessors() {
                    let role_id = name_id(&tx, roles, "role", role);
                    for hash in set {
                        let (seq, pred_type): (i64, i64) = lookup
                            .query_row([&hash.0[..]], |r| Ok((r.get(0)?, r.get(1)?)))
                            .expect("predecessor stored");
                        preds.push((role_id, seq, pred_type));
                    }
                }
                insert_fact
                    .execute(params![&fact.hash().0[..], type_id, fact.canonical_bytes()])
                    .unwrap();
                let seq = tx.last_insert_rowid();
                for &(role_id, pred, pred_type) in &preds {
                    insert_edge
                        .execute(params![pred, role_id, type_id, seq, pred_type])
                        .unwrap();
                }
            }
        }
        tx.commit().unwrap();
    }

    /// Looks every fact up by hash and skips those stored; returns how many were found.
    fn skip_chunk(&mut self, facts: &[Fact]) -> u64 {
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .unwrap();
        let mut found = 0;
        {
            let mut lookup = tx
                .prepare_cached("SELECT seq FROM fact WHERE hash = ?1")
                .unwrap();
            for fact in facts {
                let seq: Option<i64> = lookup
                    .query_row([&fact.hash().0[..]], |r| r.get(0))
                    .optional()
                    .unwrap();
                if seq.is_some() {
                    found += 1;
                }
            }
        }
        tx.commit().unwrap();
        found
    }

    fn load(&mut self, cfg: &Config) -> Duration {
        let mut workload = Workload::new(cfg.n);
        let mut timed = Duration::ZERO;
        loop {
            let chunk = workload.chunk(cfg.chunk);
            if chunk.is_empty() {
                break;
            }
            let t = Instant::now();
            self.insert_chunk(&chunk);
            timed += t.elapsed();
        }
        timed
    }
}

/// The id of a type or role name, numbering it on first use (cached in memory).
fn name_id(conn: &Connection, cache: &mut HashMap<String, i64>, table: &str, name: &str) -> i64 {
    if let Some(&id) = cache.get(name) {
        return id;
    }
    conn.execute(
        &format!("INSERT OR IGNORE INTO {table} (name) VALUES (?1)"),
        [name],
    )
    .unwrap();
    let id: i64 = conn
        .query_row(
            &format!("SELECT id FROM {table} WHERE name = ?1"),
            [name],
            |r| r.get(0),
        )
        .unwrap();
    cache.insert(name.to_string(), id);
    id
}

fn floor_in_order(cfg: &Config) -> Json {
    let started = Instant::now();
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("floor.db");
    let mut floor = Floor::open(cfg, &path);
    let timed = floor.load(cfg);
    let count: i64 = floor
        .conn
        .query_row("SELECT count(*) FROM fact", [], |r| r.get(0))
        .unwrap();
    assert_eq!(count as u64, cfg.n);
    result(
        "floor-in-order",
        cfg.n,
        timed,
        started,
        json!({ "db_mb": db_mb(&path) }),
    )
}

fn floor_duplicates(cfg: &Config) -> Json {
    let started = Instant::now();
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("floor.db");
    let mut floor = Floor::open(cfg, &path);
    let first_timed = floor.load(cfg);
    let mut workload = Workload::new(cfg.n);
    let mut timed = Duration::ZERO;
    let mut found = 0;
    loop {
        let chunk = workload.chunk(cfg.chunk);
        if chunk.is_empty() {
            break;
        }
        let t = Instant::now();
        found += floor.skip_chunk(&chunk);
        timed += t.elapsed();
    }
    assert_eq!(found, cfg.n, "the second pass is all duplicates");
    result(
        "floor-duplicates",
        cfg.n,
        timed,
        started,
        json!({ "first_pass_seconds": first_timed.as_secs_f64() }),
    )
}

/// Workload shape, for the record: average canonical bytes and predecessors per fact.
fn workload_shape(n: u64) -> Json {
    let sample = n.min(100_000);
    let (mut bytes, mut preds, mut fan_in) = (0u64, 0u64, 0u64);
    for fact in Workload::new(sample) {
        bytes += fact.canonical_bytes().len() as u64;
        let p = fact.predecessor_hashes().len() as u64;
        preds += p;
        fan_in += u64::from(p >= 2);
    }
    json!({
        "sampled_facts": sample,
        "avg_canonical_bytes": bytes as f64 / sample as f64,
        "avg_predecessors": preds as f64 / sample as f64,
        "fan_in_share": fan_in as f64 / sample as f64,
    })
}

// ---------------------------------------------------------------------------------------
// Driver

fn run_phase(phase: &str, cfg: &Config) -> Json {
    match phase {
        "ours-in-order" => ours_in_order(cfg),
        "ours-reversed" => ours_reversed(cfg),
        "ours-duplicates" => ours_duplicates(cfg),
        "floor-in-order" => floor_in_order(cfg),
        "floor-duplicates" => floor_duplicates(cfg),
        other => panic!("unknown phase {other:?}; phases are {PHASES:?}"),
    }
}

/// Runs one phase in a child process of this binary and returns its figures.
fn run_child(phase: &str) -> Json {
    let exe = std::env::current_exe().expect("current exe");
    let output = Command::new(exe)
        .env(PHASE_VAR, phase)
        .stdin(Stdio::null())
        .stderr(Stdio::inherit())
        .output()
        .expect("run phase");
    let stdout = String::from_utf8_lossy(&output.stdout);
    if !output.status.success() {
        panic!("phase {phase} failed ({}):\n{stdout}", output.status);
    }
    let line = stdout
        .lines()
        .find_map(|l| l.strip_prefix(RESULT_TAG))
        .unwrap_or_else(|| panic!("phase {phase} printed no result:\n{stdout}"));
    serde_json::from_str(line).expect("phase result is JSON")
}

fn main() {
    let cfg = Config::from_env();
    if let Some(phase) = env_str(PHASE_VAR) {
        let figures = run_phase(&phase, &cfg);
        println!("{RESULT_TAG}{figures}");
        return;
    }

    let phases: Vec<String> = match env_str("PRECEDENT_BENCH_PHASES") {
        Some(list) => list.split(',').map(|p| p.trim().to_string()).collect(),
        None => PHASES.iter().map(|p| p.to_string()).collect(),
    };
    let shape = workload_shape(cfg.n);
    println!(
        "ingest benchmark: N = {}, chunk = {}, cache = {} MiB, synchronous = {}",
        cfg.n,
        cfg.chunk,
        cfg.cache_mib,
        cfg.synchronous()
    );
    println!("workload: {shape}");

    let mut results: Vec<Json> = Vec::new();
    for phase in &phases {
        let r = run_child(phase);
        println!(
            "  {:<17} {:>10.0} facts/s  {:>8.2} s  peak {:>6.1} MB",
            phase,
            r["facts_per_s"].as_f64().unwrap_or(f64::NAN),
            r["seconds"].as_f64().unwrap_or(f64::NAN),
            r["peak_rss_mb"].as_f64().unwrap_or(f64::NAN),
        );
        results.push(r);
    }
    let rate = |phase: &str| {
        results
            .iter()
            .find(|r| r["phase"] == phase)
            .and_then(|r| r["facts_per_s"].as_f64())
    };

    println!();
    println!(
        "| {:<17} | {:>9} | {:>9} | {:>11} | {:>12} |",
        "phase", "facts", "seconds", "facts/s", "peak RSS MB"
    );
    println!(
        "|{:-<19}|{:->11}|{:->11}|{:->13}|{:->14}|",
        "", "", "", "", ""
    );
    for r in &results {
        println!(
            "| {:<17} | {:>9} | {:>9.2} | {:>11.0} | {:>12.1} |",
            r["phase"].as_str().unwrap_or("?"),
            r["facts"].as_u64().unwrap_or(0),
            r["seconds"].as_f64().unwrap_or(f64::NAN),
            r["facts_per_s"].as_f64().unwrap_or(f64::NAN),
            r["peak_rss_mb"].as_f64().unwrap_or(f64::NAN),
        );
    }
    println!();

    let mut ratios = Vec::new();
    for &(name, ours, floor, target) in TARGETS {
        if let (Some(a), Some(b)) = (rate(ours), rate(floor)) {
            let ratio = a / b;
            let met = ratio >= target;
            println!(
                "{name:<31} {ratio:>6.3}  (target >= {target:.2}: {})",
                if met { "met" } else { "MISSED" }
            );
            ratios.push(json!({ "name": name, "ratio": ratio, "target": target, "met": met }));
        }
    }
    let peak = results
        .iter()
        .filter_map(|r| r["peak_rss_mb"].as_f64())
        .fold(0.0f64, f64::max);
    let memory_met = peak < MEMORY_LIMIT_MB;
    println!(
        "{:<31} {peak:>6.1}  (target < {MEMORY_LIMIT_MB:.0} MB: {})",
        "highest peak RSS (MB)",
        if memory_met { "met" } else { "MISSED" }
    );

    let report = json!({
        "config": cfg.to_json(),
        "workload": shape,
        "unix_time": SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0),
        "cpus": std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0),
        "phases": results,
        "ratios": ratios,
        "peak_rss_mb": peak,
        "memory_limit_mb": MEMORY_LIMIT_MB,
        "memory_met": memory_met,
    });
    let out = env_str("PRECEDENT_BENCH_OUT")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            let target = env_str("CARGO_TARGET_DIR")
                .map(PathBuf::from)
                .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("target"));
            target.join("bench-ingest.json")
        });
    if let Some(dir) = out.parent() {
        let _ = std::fs::create_dir_all(dir);
    }
    match std::fs::write(
        &out,
        serde_json::to_string_pretty(&report).expect("json") + "\n",
    ) {
        Ok(()) => println!("\nwritten to {}", out.display()),
        Err(e) => eprintln!("could not write {}: {e}", out.display()),
    }
}
