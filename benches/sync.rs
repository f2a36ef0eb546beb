//! Sync benchmark: two nodes over loopback, each a real `precedent` process.
//!
//! `cargo bench --bench sync` measures, in one run:
//! 1. **full sync**: `precedent sync URL --pull` of N facts into an empty store, against
//!    `precedent import` of the same facts from a local CBOR file (the floor);
//! 2. **incremental sync**: 100 new facts pulled into the store of N facts, against the
//!    same 100 facts pulled into an empty store (median of several rounds);
//! 3. **follower delay**: a `precedent sync --follow` process, from a fact's commit on the
//!    server's database to its arrival in the follower's database (median and max);
//! 4. **peak memory** (`ru_maxrss` from `wait4`) of the server and of every client process;
//! 5. **bytes sent**: the first `precedent sync URL` of a store holding facts of its own
//!    (1% of N) against the server of N facts, and the sync after it: the bytes pushed
//!    and pulled against the bytes of the facts the other side lacked.
//!
//! Settings, from the environment:
//! - `PRECEDENT_BENCH_N`: facts (default 1,000,000).
//! - `PRECEDENT_BENCH_ROUNDS`: incremental rounds and follower samples (default 7 and 21).
//! - `PRECEDENT_BENCH_OUT`: where to write the JSON (default `target/bench-sync.json`).
//!
//! See `docs/performance.md`, "Sync", for the method and the figures.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use precedent::{Fact, FactHash, Store};
use serde_json::json;

mod common;

use common::{BIN, env_num, reap};

const MEMORY_LIMIT_MB: f64 = 200.0;

/// The workload: chains that grow side by side, each fact naming the previous one of its
/// chain and, one time in four, a recent fact of another chain.
fn write_workload(path: &Path, n: u64) {
    let mut out = BufWriter::new(File::create(path).unwrap());
    let mut recent: Vec<FactHash> = Vec::with_capacity(1 << 16);
    let mut heads: Vec<Option<FactHash>> = vec![None; 64];
    let mut x: u64 = 0x5EED_0F5C_2024_0001;
    for i in 0..n {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let chain = (x % 64) as usize;
        let mut b = Fact::builder("Bench.Event").field("n", i as i64).field(
            "note",
            format!("event {i} on chain {chain}, recorded by the bench"),
        );
        if let Some(h) = heads[chain] {
            b = b.predecessor("prev", h);
        }
        if x.is_multiple_of(4) && !recent.is_empty() {
            b = b.predecessor("cites", recent[(x >> 20) as usize % recent.len()]);
        }
        let f = b.build().unwrap();
        out.write_all(f.canonical_bytes()).unwrap();
        heads[chain] = Some(f.hash());
        if recent.len() < 1 << 16 {
            recent.push(f.hash());
        } else {
            recent[(i as usize) % (1 << 16)] = f.hash();
        }
    }
    out.flush().unwrap();
}

/// Runs `precedent ARGS` to its end; (seconds, peak MB).
fn run(args: &[&str]) -> (f64, f64) {
    let start = Instant::now();
    let child = Command::new(BIN)
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let exit = reap(child);
    assert!(exit.ok, "precedent {args:?} failed");
    (start.elapsed().as_secs_f64(), exit.maxrss_mb)
}

/// Runs `precedent --json ARGS` to its end; its JSON report.
fn run_json(args: &[&str]) -> serde_json::Value {
    let mut all = vec!["--json"];
    all.extend_from_slice(args);
    let out = Command::new(BIN)
        .args(&all)
        .stderr(Stdio::inherit())
        .output()
        .unwrap();
    assert!(out.status.success(), "precedent {all:?} failed");
    serde_json::from_slice(&out.stdout).unwrap()
}

struct Served {
    child: Child,
    url: String,
}

fn serve(db: &Path) -> Served {
    let (child, url) = common::serve(db);
    Served { child, url }
}

fn stop(s: Served) -> f64 {
    unsafe { libc::kill(s.child.id() as i32, libc::SIGTERM) };
    let exit = reap(s.child);
    assert!(exit.ok, "server did not stop cleanly");
    exit.maxrss_mb
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

/// `k` new facts in a chain of their own (no predecessor outside it), so the same facts
/// can be synced into a full store and into an empty one.
fn new_facts(round: u64, k: u64) -> Vec<Fact> {
    let mut out: Vec<Fact> = Vec::new();
    for i in 0..k {
        let mut b = Fact::builder("Bench.New")
            .field("round", round as i64)
            .field("n", i as i64);
        if let Some(p) = out.last() {
            b = b.predecessor("prev", p.hash());
        }
        out.push(b.build().unwrap());
    }
    out
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return; // `cargo test --benches` asks for the list of benchmarks
    }
    let n = env_num("PRECEDENT_BENCH_N").unwrap_or(1_000_000);
    let rounds = env_num("PRECEDENT_BENCH_ROUNDS").unwrap_or(7).max(1);
    let out_path = std::env::var("PRECEDENT_BENCH_OUT")
        .map(PathBuf::from)
        .unwrap_or_else(|_| PathBuf::from("target/bench-sync.json"));
    let dir = tempfile::tempdir().unwrap();
    let p = |name: &str| dir.path().join(name);
    let s = |path: &PathBuf| path.to_str().unwrap().to_string();
    let (facts, src, dst, follow_db) = (p("facts.cbor"), p("src.db"), p("dst.db"), p("follow.db"));

    eprintln!("writing {n} facts");
    write_workload(&facts, n);
    let bytes = std::fs::metadata(&facts).unwrap().len();

    eprintln!("floor: import");
    let (import_s, import_mb) = run(&["--db", &s(&src), "import", &s(&facts)]);

    eprintln!("full sync over loopback");
    let server = serve(&src);
    let (sync_s, sync_mb) = run(&["--db", &s(&dst), "sync", &server.url, "--pull"]);
    let (a, b) = (Store::open(&src).unwrap(), Store::open(&dst).unwrap());
    assert_eq!(a.max_seq().unwrap() as u64, n);
    assert_eq!(b.count_and_max_seq().unwrap().0, n, "full sync incomplete");
    drop((a, b));

    eprintln!("bytes: a store with facts of its own syncs with the server of N");
    let mixed = p("mixed.db");
    let own = new_facts(1_000_000, (n / 100).max(1));
    let own_bytes: u64 = own.iter().map(|f| f.canonical_bytes().len() as u64).sum();
    Store::open(&mixed).unwrap().insert_batch(own).unwrap();
    let first = run_json(&["--db", &s(&mixed), "sync", &server.url]);
    let second = run_json(&["--db", &s(&mixed), "sync", &server.url]);
    let num = |v: &serde_json::Value, k: &str| v[k].as_u64().unwrap();
    let push_ratio = num(&first, "bytes_pushed") as f64 / own_bytes as f64;
    let pull_ratio = num(&first, "bytes_pulled") as f64 / bytes as f64;
    // Converged: it received all N. (No count here: reading the databases would raise
    // this process's resident size, which Linux carries into the children it spawns next.)
    assert_eq!(num(&first, "pulled"), n);

    eprintln!("incremental: 100 new facts into the full store and into an empty one");
    let (mut big_t, mut empty_t, mut inc_mb, mut small_mb) = (Vec::new(), Vec::new(), 0f64, 0f64);
    for round in 0..rounds {
        let batch = new_facts(round, 100);
        Store::open(&src)
            .unwrap()
            .insert_batch(batch.clone())
            .unwrap();
        let (t, mb) = run(&["--db", &s(&dst), "sync", &server.url]);
        big_t.push(t);
        inc_mb = inc_mb.max(mb);
        // Into an empty store, from a server holding just these 100 facts.
        let small_src = p(&format!("small-src-{round}.db"));
        Store::open(&small_src)
            .unwrap()
            .insert_batch(batch)
            .unwrap();
        let small = serve(&small_src);
        let fresh = p(&format!("empty-{round}.db"));
        let (t, mb) = run(&["--db", &s(&fresh), "sync", &small.url]);
        empty_t.push(t);
        inc_mb = inc_mb.max(mb);
        small_mb = small_mb.max(stop(small));
    }
    let (big_inc, empty_inc) = (median(&mut big_t), median(&mut empty_t));

    eprintln!("follower delay");
    let follower = Command::new(BIN)
        .args(["--db", &s(&follow_db), "sync", &server.url, "--follow"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let fstore = Store::open(&follow_db).unwrap();
    // Wait for the follower's first full pull to finish before sampling.
    while fstore.count_and_max_seq().unwrap().0 < n {
        std::thread::sleep(Duration::from_millis(200));
    }
    let src_store = Store::open(&src).unwrap();
    let mut delays = Vec::new();
    for i in 0..rounds * 3 {
        let f = Fact::builder("Bench.Live")
            .field("i", i as i64)
            .build()
            .unwrap();
        std::thread::sleep(Duration::from_millis(137));
        let t0 = Instant::now();
        src_store.insert(&f).unwrap();
        while fstore.get(&f.hash()).unwrap().is_none() {
            std::thread::sleep(Duration::from_micros(500));
            assert!(
                t0.elapsed() < Duration::from_secs(30),
                "follower never got the fact"
            );
        }
        delays.push(t0.elapsed().as_secs_f64() * 1000.0);
    }
    unsafe { libc::kill(follower.id() as i32, libc::SIGTERM) };
    let follow_mb = reap(follower).maxrss_mb;
    let max_delay = delays.iter().cloned().fold(0.0, f64::max);
    let med_delay = median(&mut delays);
    let server_mb = stop(server);

    let full_ratio = import_s / sync_s;
    let inc_ratio = big_inc / empty_inc;
    let peak = [import_mb, sync_mb, inc_mb, follow_mb, server_mb, small_mb]
        .into_iter()
        .fold(0.0, f64::max);
    let report = json!({
        "n": n,
        "bytes": bytes,
        "import_s": import_s,
        "full_sync_s": sync_s,
        "full_sync_facts_per_s": n as f64 / sync_s,
        "import_facts_per_s": n as f64 / import_s,
        "full_ratio": full_ratio,
        "incremental_full_store_ms": big_inc * 1000.0,
        "incremental_empty_store_ms": empty_inc * 1000.0,
        "incremental_ratio": inc_ratio,
        "mixed_first_sync": {
            "own_facts": (n / 100).max(1), "own_bytes": own_bytes,
            "pushed": num(&first, "pushed"), "bytes_pushed": num(&first, "bytes_pushed"),
            "pulled": num(&first, "pulled"), "bytes_pulled": num(&first, "bytes_pulled"),
            "push_bytes_per_missing_byte": push_ratio,
            "pull_bytes_per_missing_byte": pull_ratio,
        },
        "mixed_second_sync": {"pulled": num(&second, "pulled"), "pushed": num(&second, "pushed")},
        "follower_delay_median_ms": med_delay,
        "follower_delay_max_ms": max_delay,
        "peak_mb": {
            "import": import_mb, "full_sync_client": sync_mb, "incremental_clients": inc_mb,
            "follower": follow_mb, "server": server_mb, "small_server": small_mb,
        },
    });
    println!("{}", serde_json::to_string_pretty(&report).unwrap());
    let targets = [
        ("full sync / import speed >= 0.50", full_ratio >= 0.5),
        ("incremental full / empty store <= 2.0", inc_ratio <= 2.0),
        ("follower delay max < 1000 ms", max_delay < 1000.0),
        ("peak memory < 200 MB", peak < MEMORY_LIMIT_MB),
        (
            "bytes pushed and pulled <= 1.1 x the facts the other side lacked",
            push_ratio <= 1.1 && pull_ratio <= 1.1,
        ),
        (
            "the sync after it moves nothing",
            num(&second, "pulled") + num(&second, "pushed") == 0,
        ),
    ];
    for (what, ok) in targets {
        println!("{} {what}", if ok { "met   " } else { "MISSED" });
    }
    if let Some(parent) = out_path.parent() {
        let _ = std::fs::create_dir_all(parent);
    }
    std::fs::write(&out_path, serde_json::to_vec_pretty(&report).unwrap()).unwrap();
}
