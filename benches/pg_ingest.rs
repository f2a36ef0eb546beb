//! Ingest on PostgreSQL: the store against a hand-written PostgreSQL floor on the same
//! schema, and the SQLite backend on the same workload, in one run.
//!
//! `cargo bench --bench pg_ingest` starts a throwaway cluster (`tests/common/pg.rs`) with
//! the durable settings of [`SETTINGS`], then runs each phase in a child process of this
//! binary (`PRECEDENT_BENCH_PHASE`) on a fresh database, so that each phase's peak memory
//! (VmHWM) is its own:
//! - `floor-copy`, `floor-unnest`: facts of `benches/common/workload.rs`, encoded and
//!   hashed before the clock starts, written in batches with what a correct loader of the
//!   schema ours writes (every migration of `schema/postgres/`, made by opening a store)
//!   must do: per batch, one lookup of the
//!   predecessors outside the batch (`hash = ANY`), the fact rows, each with its first
//!   edge in its own row (`p1`, `p1_role`, `p1_type`, schema version 7), and a row of
//!   `edge_more` for each other edge (`COPY ... BINARY`, or `INSERT ... SELECT FROM
//!   unnest(...)`), one commit; a role's partition of `edge_more` is created the first
//!   time a batch has such an edge of that role. The faster is the floor.
//! - `ours`: `Store::open_with(url)` and `insert_batch` of the same facts in the same
//!   batches, each its own transaction.
//! - `ours-reversed` (only when named in `PRECEDENT_BENCH_PHASES`): the same batches,
//!   last first, each reversed (children first): reported, no target.
//! - `ours-queue`: as `ours`, on a store with a queue declared first ([`queue`]: each
//!   chain's opening fact is an input, completed by the chain's first event), so that
//!   the queue index is kept as the facts are stored; its ratio to `ours` is what a
//!   queue costs ingest.
//! - `sqlite`, `sqlite-queue`: the SQLite backend (a temporary file, default options) on
//!   the same batches, without and with the queue.
//!
//! Settings, from the environment: `PRECEDENT_BENCH_PG_N` (facts, default 1,000,000),
//! `PRECEDENT_BENCH_CHUNK` (facts per batch, default 50,000), `PRECEDENT_BENCH_PHASES`
//! (a comma-separated subset), `PRECEDENT_BENCH_OUT` (default
//! `target/bench-pg-ingest.json`). See `docs/performance.md`, "Ingest on PostgreSQL".

#[path = "../tests/common/pg.rs"]
#[allow(dead_code)] // the bench uses only part of the test harness
mod pg;
#[path = "common/workload.rs"]
mod workload;

use std::collections::{HashMap, HashSet};
use std::io::Write as _;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use postgres::binary_copy::BinaryCopyInWriter;
use postgres::types::{ToSql, Type};
use postgres::{Client, NoTls};
use precedent::{Fact, FactHash, Store, StoreOptions};
use serde_json::{Value as Json, json};
use workload::Workload;

/// The phases, in the order they run. `ours-reversed` runs only when named
/// (`PRECEDENT_BENCH_PHASES`): its cascades go fact by fact (docs/performance.md).
const PHASES: &[&str] = &[
    "floor-copy",
    "floor-unnest",
    "ours",
    "ours-queue",
    "sqlite",
    "sqlite-queue",
];
/// The least acceptable ours / floor.
const TARGET: f64 = 0.6;
/// Peak resident memory of each of our phases must stay under this, in MB.
const MEMORY_LIMIT_MB: f64 = 300.0;

/// The cluster's settings, the same for every phase: durable (`fsync`, synchronous
/// commit and full page writes on, as shipped), with room for a bulk load (a larger
/// buffer pool and WAL, so that checkpoints do not come every few seconds).
const SETTINGS: &[&str] = &[
    "fsync=on",
    "synchronous_commit=on",
    "full_page_writes=on",
    "shared_buffers=256MB",
    "max_wal_size=8GB",
    "checkpoint_timeout=30min",
    "max_connections=50",
];

const PHASE_VAR: &str = "PRECEDENT_BENCH_PHASE";
const URL_VAR: &str = "PRECEDENT_BENCH_PG_URL";
const RESULT_TAG: &str = "precedent-bench-result ";

fn env_num(name: &str) -> Option<u64> {
    std::env::var(name)
        .ok()
        .filter(|s| !s.trim().is_empty())
        .map(|s| {
            s.trim()
                .replace('_', "")
                .parse()
                .unwrap_or_else(|_| panic!("{name}: {s:?} is not a whole number"))
        })
}

fn n() -> u64 {
    env_num("PRECEDENT_BENCH_PG_N").unwrap_or(1_000_000)
}

fn chunk() -> usize {
    env_num("PRECEDENT_BENCH_CHUNK").unwrap_or(50_000) as usize
}

/// Peak resident set size of this process so far, in MB (VmHWM).
fn peak_rss_mb() -> f64 {
    std::fs::read_to_string("/proc/self/status")
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        .map_or(f64::NAN, |kb| kb / 1024.0)
}

/// The workload's batches, all at once (for the reversed phase).
fn batches() -> Vec<Vec<Fact>> {
    let mut workload = Workload::new(n());
    let mut out = Vec::new();
    loop {
        let c = workload.chunk(chunk());
        if c.is_empty() {
            return out;
        }
        out.push(c);
    }
}

// ---------------------------------------------------------------------------------------
// The floor

/// How the floor writes rows.
#[derive(Clone, Copy, PartialEq)]
enum Method {
    Copy,
    Unnest,
}

/// A hand-written loader: the schema's rows, nothing else.
struct Floor {
    client: Client,
    names: [HashMap<String, i64>; 2],
    seq: i64,
    /// The roles whose partition of `edge_more` exists.
    partitions: HashSet<i64>,
}

/// Facts' rows and their other edges, ready to write.
#[derive(Default)]
struct Rows {
    seq: Vec<i64>,
    hash: Vec<Vec<u8>>,
    type_id: Vec<i64>,
    bytes: Vec<Vec<u8>>,
    /// Each fact's first edge (schema version 7): predecessor, role, predecessor type;
    /// `None` for a fact with no predecessor.
    p1: [Vec<Option<i64>>; 3],
    /// The other edges, rows of `edge_more`: predecessor, role, successor type,
    /// successor, predecessor type.
    edges: [Vec<i64>; 5],
    /// Each other edge's successor hash.
    edge_hash: Vec<Vec<u8>>,
}

impl Floor {
    fn open(url: &str) -> Floor {
        // The schema at the version ours writes (every migration of schema/postgres/),
        // made by opening a store once: the same tables, indexes and constraints.
        drop(Store::open_with(url, options()).expect("schema"));
        let client = Client::connect(url, NoTls).expect("connect");
        Floor {
            client,
            names: Default::default(),
            seq: 0,
            partitions: HashSet::new(),
        }
    }

    fn name_id(&mut self, role: bool, name: &str) -> i64 {
        if let Some(&id) = self.names[role as usize].get(name) {
            return id;
        }
        let table = if role { "role" } else { "fact_type" };
        let id: i64 = self
            .client
            .query_one(
                &format!("INSERT INTO {table} (name) VALUES ($1) RETURNING id"),
                &[&name],
            )
            .expect("name")
            .get(0);
        self.names[role as usize].insert(name.to_string(), id);
        id
    }

    /// One batch, parents first, in one transaction.
    fn write(&mut self, facts: &[Fact], method: Method) {
        // Type and role ids (a few, cached), then the transaction.
        let mut ids = Vec::with_capacity(facts.len());
        for fact in facts {
            let type_id = self.name_id(false, fact.type_name());
            let roles: Vec<i64> = fact
                .predecessors()
                .iter()
                .flat_map(|(role, set)| std::iter::repeat_n(role, set.len()))
                .map(|role| self.name_id(true, role))
                .collect();
            ids.push((type_id, roles));
        }
        // A fact's first edge goes in its row, the others in `edge_more`: the partition
        // of each of their roles, created once, before the batch's transaction.
        for (_, roles) in &ids {
            for &role in roles.iter().skip(1) {
                if self.partitions.insert(role) {
                    self.client
                        .batch_execute(&format!(
                            "CREATE TABLE IF NOT EXISTS edge_more_{role} PARTITION OF edge_more \
                             FOR VALUES IN ({role})"
                        ))
                        .expect("partition");
                }
            }
        }
        let mut tx = self.client.transaction().expect("begin");
        // The predecessors outside the batch, looked up at once.
        let batch: HashSet<FactHash> = facts.iter().map(Fact::hash).collect();
        let mut outside: Vec<FactHash> = facts
            .iter()
            .flat_map(Fact::predecessor_hashes)
            .filter(|p| !batch.contains(p))
            .collect();
        outside.sort_unstable();
        outside.dedup();
        let outside: Vec<&[u8]> = outside.iter().map(|h| &h.0[..]).collect();
        let mut known: HashMap<FactHash, (i64, i64)> = HashMap::new();
        for row in tx
            .query(
                "SELECT hash, seq, type_id FROM fact WHERE hash = ANY($1)",
                &[&outside],
            )
            .expect("lookup")
        {
            let hash = FactHash::from_slice(row.get(0)).expect("32 bytes");
            known.insert(hash, (row.get(1), row.get(2)));
        }
        let mut rows = Rows::default();
        for (fact, (type_id, roles)) in facts.iter().zip(ids) {
            self.seq += 1;
            let seq = self.seq;
            let preds = fact.predecessors().values().flat_map(|set| set.iter());
            let mut first = [None; 3];
            for (k, (p, role_id)) in preds.zip(roles).enumerate() {
                let (pseq, ptype) = known[p];
                if k == 0 {
                    first = [Some(pseq), Some(role_id), Some(ptype)];
                    continue;
                }
                for (col, v) in rows
                    .edges
                    .iter_mut()
                    .zip([pseq, role_id, type_id, seq, ptype])
                {
                    col.push(v);
                }
                rows.edge_hash.push(fact.hash().0.to_vec());
            }
            for (col, v) in rows.p1.iter_mut().zip(first) {
                col.push(v);
            }
            known.insert(fact.hash(), (seq, type_id));
            rows.seq.push(seq);
            rows.hash.push(fact.hash().0.to_vec());
            rows.type_id.push(type_id);
            rows.bytes.push(fact.canonical_bytes().to_vec());
        }
        match method {
            Method::Copy => copy(&mut tx, &rows),
            Method::Unnest => unnest(&mut tx, &rows),
        }
        tx.commit().expect("commit");
    }
}

fn copy(tx: &mut postgres::Transaction<'_>, rows: &Rows) {
    let sink = tx
        .copy_in("COPY fact (seq, hash, type_id, bytes, p1, p1_role, p1_type) FROM STDIN BINARY")
        .expect("copy fact");
    let types = [
        Type::INT8,
        Type::BYTEA,
        Type::INT8,
        Type::BYTEA,
        Type::INT8,
        Type::INT8,
        Type::INT8,
    ];
    let mut w = BinaryCopyInWriter::new(sink, &types);
    let p1 = &rows.p1;
    for (i, seq) in rows.seq.iter().enumerate() {
        w.write(&[
            seq,
            &rows.hash[i],
            &rows.type_id[i],
            &rows.bytes[i],
            &p1[0][i],
            &p1[1][i],
            &p1[2][i],
        ])
        .expect("copy row");
    }
    w.finish().expect("copy fact end");
    if rows.edge_hash.is_empty() {
        return;
    }
    let sink = tx
        .copy_in(
            "COPY edge_more (predecessor, role_id, successor_type, successor, predecessor_type, \
             successor_hash) FROM STDIN BINARY",
        )
        .expect("copy edge_more");
    let types = [
        Type::INT8,
        Type::INT8,
        Type::INT8,
        Type::INT8,
        Type::INT8,
        Type::BYTEA,
    ];
    let mut w = BinaryCopyInWriter::new(sink, &types);
    for i in 0..rows.edges[0].len() {
        let e = &rows.edges;
        w.write(&[
            &e[0][i],
            &e[1][i],
            &e[2][i],
            &e[3][i],
            &e[4][i],
            &rows.edge_hash[i],
        ])
        .expect("copy edge_more row");
    }
    w.finish().expect("copy edge_more end");
}

fn unnest(tx: &mut postgres::Transaction<'_>, rows: &Rows) {
    let p1 = &rows.p1;
    tx.execute(
        "INSERT INTO fact (seq, hash, type_id, bytes, p1, p1_role, p1_type)
         SELECT * FROM unnest($1::bigint[], $2::bytea[], $3::bigint[], $4::bytea[],
                              $5::bigint[], $6::bigint[], $7::bigint[])",
        &[
            &rows.seq,
            &rows.hash,
            &rows.type_id,
            &rows.bytes,
            &p1[0],
            &p1[1],
            &p1[2],
        ],
    )
    .expect("insert facts");
    if rows.edge_hash.is_empty() {
        return;
    }
    let e = &rows.edges;
    let mut args: Vec<&(dyn ToSql + Sync)> = e.iter().map(|c| c as &(dyn ToSql + Sync)).collect();
    args.push(&rows.edge_hash);
    tx.execute(
        "INSERT INTO edge_more (predecessor, role_id, successor_type, successor, predecessor_type, successor_hash)
         SELECT * FROM unnest($1::bigint[], $2::bigint[], $3::bigint[], $4::bigint[], $5::bigint[], $6::bytea[])",
        &args,
    )
    .expect("insert edges");
}

fn floor(url: &str, method: Method) -> (Duration, u64) {
    let mut floor = Floor::open(url);
    let mut workload = Workload::new(n());
    let mut timed = Duration::ZERO;
    loop {
        let batch = workload.chunk(chunk());
        if batch.is_empty() {
            break;
        }
        let t = Instant::now();
        floor.write(&batch, method);
        timed += t.elapsed();
    }
    let count: i64 = floor
        .client
        .query_one("SELECT count(*) FROM fact", &[])
        .unwrap()
        .get(0);
    (timed, count as u64)
}

// ---------------------------------------------------------------------------------------
// Ours

fn options() -> StoreOptions {
    StoreOptions {
        max_held: StoreOptions::default().max_held.max(n()),
        ..StoreOptions::default()
    }
}

/// `insert_batch` of every batch, each generated before its clock starts (all of them
/// first, last first and each reversed, when `reversed`: that phase's memory is not ours).
fn ours(store: &Store, reversed: bool) -> (Duration, u64) {
    let mut workload = Workload::new(n());
    let mut reversed_batches = if reversed { batches() } else { Vec::new() };
    let mut timed = Duration::ZERO;
    let mut released = 0;
    loop {
        let batch = match reversed {
            true => match reversed_batches.pop() {
                Some(mut b) => {
                    b.reverse();
                    b
                }
                None => break,
            },
            false => workload.chunk(chunk()),
        };
        if batch.is_empty() {
            break;
        }
        let t = Instant::now();
        let r = store.insert_batch(batch).expect("insert_batch");
        timed += t.elapsed();
        assert!(r.refused.is_empty());
        released += r.released;
    }
    let stats = store.stats().expect("stats");
    assert_eq!((stats.released, stats.held), (n(), 0));
    assert_eq!(released, n(), "every fact released once");
    (timed, stats.released)
}

/// The queue of the `-queue` phases: each chain's `Bench.Open` is an input, completed by
/// the chain's first `Bench.Event` (which names it as `prev`); causal ordering, as a
/// declared queue has by default.
fn queue() -> precedent::queue::QueueSpec {
    precedent::queue::QueueSpec::new(
        "chains",
        "Bench.Open",
        vec![precedent::queue::Completion {
            type_name: "Bench.Event".into(),
            role: "prev".into(),
        }],
    )
}

/// [`ours`] on a store with [`queue`] declared first; checks that every chain opened
/// is an input of it, completed or pending.
fn ours_queued(store: &Store) -> (Duration, u64) {
    store.declare_queue(&queue()).expect("declare the queue");
    let result = ours(store, false);
    let s = store.queue_stats("chains").expect("queue stats");
    let pending = s.ready + s.delayed + s.blocked + s.leased + s.dead + s.poison;
    let opened = store
        .read(|r| {
            use precedent::store::SqlExt;
            r.query_one(
                "SELECT count(*) FROM fact f JOIN fact_type t ON t.id = f.type_id
                 WHERE t.name = 'Bench.Open'",
                precedent::args![],
                |row| row.get::<i64>(0),
            )
        })
        .expect("count the opened chains");
    assert!(s.completed > 0, "chains were completed: {s:?}");
    assert_eq!(
        s.completed + pending,
        opened as u64,
        "every opened chain is an input, completed or pending"
    );
    result
}

fn run_phase(phase: &str) -> Json {
    let url = std::env::var(URL_VAR).unwrap_or_default();
    let (timed, stored) = match phase {
        "floor-copy" => floor(&url, Method::Copy),
        "floor-unnest" => floor(&url, Method::Unnest),
        "ours" | "ours-reversed" => {
            let store = Store::open_with(&url, options()).expect("open on PostgreSQL");
            ours(&store, phase == "ours-reversed")
        }
        "ours-queue" => {
            let store = Store::open_with(&url, options()).expect("open on PostgreSQL");
            ours_queued(&store)
        }
        "sqlite" | "sqlite-queue" => {
            let dir = tempfile::tempdir().expect("temp dir");
            let store = Store::open_with(dir.path().join("bench.db"), options()).expect("open");
            if phase == "sqlite-queue" {
                ours_queued(&store)
            } else {
                ours(&store, false)
            }
        }
        other => panic!("unknown phase {other:?}; phases are {PHASES:?}"),
    };
    assert_eq!(stored, n(), "{phase} stored every fact");
    let secs = timed.as_secs_f64();
    json!({
        "phase": phase,
        "facts": n(),
        "seconds": secs,
        "facts_per_s": n() as f64 / secs,
        "peak_rss_mb": peak_rss_mb(),
    })
}

// ---------------------------------------------------------------------------------------
// Driver

fn run_child(phase: &str, url: &str) -> Json {
    let out = Command::new(std::env::current_exe().expect("current exe"))
        .env(PHASE_VAR, phase)
        .env(URL_VAR, url)
        .stdin(Stdio::null())
        .stderr(Stdio::inherit())
        .output()
        .expect("run phase");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "phase {phase} failed:\n{stdout}");
    let line = stdout
        .lines()
        .find_map(|l| l.strip_prefix(RESULT_TAG))
        .unwrap_or_else(|| panic!("phase {phase} printed no result:\n{stdout}"));
    serde_json::from_str(line).expect("JSON")
}

fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

fn main() {
    if let Ok(phase) = std::env::var(PHASE_VAR) {
        println!("{RESULT_TAG}{}", run_phase(&phase));
        return;
    }
    assert!(
        pg::use_settings(SETTINGS),
        "settings before the cluster starts"
    );
    let phases: Vec<String> = match std::env::var("PRECEDENT_BENCH_PHASES") {
        Ok(list) if !list.trim().is_empty() => {
            list.split(',').map(|p| p.trim().to_string()).collect()
        }
        _ => PHASES.iter().map(|p| p.to_string()).collect(),
    };
    let load_before = load_average();
    println!(
        "PostgreSQL ingest: N = {}, chunk = {}, load average {load_before}",
        n(),
        chunk()
    );
    println!("cluster settings: {}", SETTINGS.join(" "));
    let mut results = Vec::new();
    for phase in &phases {
        let url = match phase.as_str() {
            "sqlite" | "sqlite-queue" => String::new(),
            _ => pg::db().expect("PostgreSQL is installed").url,
        };
        let r = run_child(phase, &url);
        println!(
            "  {:<14} {:>10.0} facts/s  {:>8.2} s  peak {:>6.1} MB",
            phase,
            r["facts_per_s"].as_f64().unwrap_or(f64::NAN),
            r["seconds"].as_f64().unwrap_or(f64::NAN),
            r["peak_rss_mb"].as_f64().unwrap_or(f64::NAN),
        );
        let _ = std::io::stdout().flush();
        results.push(r);
    }
    let rate = |p: &str| {
        results
            .iter()
            .find(|r| r["phase"] == p)
            .and_then(|r| r["facts_per_s"].as_f64())
    };
    let floor = match (rate("floor-copy"), rate("floor-unnest")) {
        (Some(a), Some(b)) => Some(a.max(b)),
        (a, b) => a.or(b),
    };
    let mut ratios = json!({});
    if let (Some(ours), Some(floor)) = (rate("ours"), floor) {
        let ratio = ours / floor;
        let met = ratio >= TARGET;
        println!(
            "ours / floor            {ratio:>6.3}  (target >= {TARGET}: {})",
            if met { "met" } else { "missed" }
        );
        ratios["ours_over_floor"] = json!({ "ratio": ratio, "target": TARGET, "met": met });
    }
    if let (Some(r), Some(floor)) = (rate("ours-reversed"), floor) {
        println!("ours-reversed / floor   {:>6.3}  (no target)", r / floor);
        ratios["reversed_over_floor"] = json!(r / floor);
    }
    if let (Some(s), Some(floor)) = (rate("sqlite"), floor) {
        println!("sqlite / floor          {:>6.3}", s / floor);
        ratios["sqlite_over_floor"] = json!(s / floor);
    }
    if let (Some(s), Some(o)) = (rate("sqlite"), rate("ours")) {
        println!("ours / sqlite           {:>6.3}", o / s);
        ratios["ours_over_sqlite"] = json!(o / s);
    }
    // What a declared queue costs ingest: with it against without, each backend.
    if let (Some(q), Some(o)) = (rate("ours-queue"), rate("ours")) {
        println!("ours-queue / ours       {:>6.3}  (no target)", q / o);
        ratios["queue_over_ours"] = json!(q / o);
    }
    if let (Some(q), Some(floor)) = (rate("ours-queue"), floor) {
        println!("ours-queue / floor      {:>6.3}  (no target)", q / floor);
        ratios["queue_over_floor"] = json!(q / floor);
    }
    if let (Some(q), Some(s)) = (rate("sqlite-queue"), rate("sqlite")) {
        println!("sqlite-queue / sqlite   {:>6.3}", q / s);
        ratios["sqlite_queue_over_sqlite"] = json!(q / s);
    }
    let peak = results
        .iter()
        .filter(|r| {
            ["ours", "ours-queue", "sqlite", "sqlite-queue"]
                .contains(&r["phase"].as_str().unwrap_or(""))
        })
        .filter_map(|r| r["peak_rss_mb"].as_f64())
        .fold(0.0f64, f64::max);
    let memory_met = peak < MEMORY_LIMIT_MB;
    println!(
        "highest peak RSS of ours {peak:>6.1} MB  (target < {MEMORY_LIMIT_MB} MB: {})",
        if memory_met { "met" } else { "missed" }
    );
    let load_after = load_average();
    println!("load average after: {load_after}");
    let report = json!({
        "n": n(),
        "chunk": chunk(),
        "settings": SETTINGS,
        "load_average": [load_before, load_after],
        "phases": results,
        "ratios": ratios,
        "peak_rss_mb": { "max": peak, "limit": MEMORY_LIMIT_MB, "met": memory_met },
    });
    let out = std::env::var("PRECEDENT_BENCH_OUT").unwrap_or_else(|_| {
        let target = std::env::var("CARGO_TARGET_DIR").unwrap_or_else(|_| "target".into());
        format!("{target}/bench-pg-ingest.json")
    });
    std::fs::write(&out, serde_json::to_string_pretty(&report).unwrap()).expect("write JSON");
    println!("wrote {out}");
}
