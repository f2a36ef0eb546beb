//! Server memory under concurrent pushes: the peak resident memory (`VmHWM` in
//! `/proc/PID/status`, read just before the server is stopped) of a `precedent serve` process that receives one push of 100,000 facts, and
//! of another that receives four such pushes at once (each its own facts), each over its
//! own connection. A measurement, not a timed test: the figures go to
//! `docs/performance.md`, "Sync: server memory under pushes".
//!
//! Settings, from the environment:
//! - `PRECEDENT_BENCH_PUSH_FACTS`: facts per push (default 100,000).
//! - `PRECEDENT_BENCH_PUSHES`: concurrent pushes of the second run (default 4).
//! - `PRECEDENT_BENCH_OUT`: where to write the JSON (default `target/bench-sync-memory.json`).

use std::path::{Path, PathBuf};
use std::time::Instant;

use precedent::Fact;
use precedent::sync::client::{Client, ClientOptions};
use serde_json::json;

mod common;

use common::{env_num, reap};

const MEMORY_LIMIT_MB: f64 = 300.0;

/// `n` facts of the sync bench's size (about 127 bytes) in chains of 64, as one push body.
fn body(push: u64, n: u64) -> Vec<u8> {
    let mut out = Vec::with_capacity(n as usize * 130);
    let mut heads: Vec<Option<precedent::FactHash>> = vec![None; 64];
    for i in 0..n {
        let chain = (i % 64) as usize;
        let mut b = Fact::builder("Bench.Push").field("n", i as i64).field(
            "note",
            format!("push {push} event {i} on chain {chain}, by the bench"),
        );
        if let Some(h) = heads[chain] {
            b = b.predecessor("prev", h);
        }
        let f = b.build().unwrap();
        out.extend_from_slice(f.canonical_bytes());
        heads[chain] = Some(f.hash());
    }
    out
}

/// Serves a fresh database, sends `bodies` at once (one thread and connection each),
/// stops the server: (seconds, peak MB of the server, facts stored).
fn run(dir: &Path, name: &str, bodies: &[Vec<u8>]) -> (f64, f64, u64) {
    let db = dir.join(format!("{name}.db"));
    let (child, url) = common::serve(&db);
    let start = Instant::now();
    std::thread::scope(|s| {
        for b in bodies {
            let url = &url;
            s.spawn(move || {
                let client = Client::new(url, ClientOptions::default()).unwrap();
                // A push the server's budget makes wait past half its request timeout is
                // answered 503 busy: retry, as a client should.
                for _ in 0..20 {
                    match client.push_records(b) {
                        Ok(r) => {
                            assert!(r.rejected.is_empty() && r.refused.is_empty());
                            return;
                        }
                        Err(precedent::Error::Remote { status: 503, .. }) => {
                            std::thread::sleep(std::time::Duration::from_secs(1));
                        }
                        Err(e) => panic!("push failed: {e}"),
                    }
                }
                panic!("push never accepted");
            });
        }
    });
    let secs = start.elapsed().as_secs_f64();
    // Read before the server stops: `ru_maxrss` would carry this process's own size.
    let mb = common::peak_mb(child.id()).expect("VmHWM of the running server");
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let ok = reap(child).ok;
    assert!(ok, "server did not stop cleanly");
    let stored = precedent::Store::open(&db)
        .unwrap()
        .count_and_max_seq()
        .unwrap()
        .0;
    (secs, mb, stored)
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return; // `cargo test --benches` asks for the list of benchmarks
    }
    let n = env_num("PRECEDENT_BENCH_PUSH_FACTS").unwrap_or(100_000);
    let k = env_num("PRECEDENT_BENCH_PUSHES").unwrap_or(4).max(1);
    let out_path = std::env::var("PRECEDENT_BENCH_OUT")
        .map(PathBuf::from)
        .unwrap_or_else(|_| PathBuf::from("target/bench-sync-memory.json"));
    let dir = tempfile::tempdir().unwrap();
    eprintln!("building {k} push bodies of {n} facts");
    let bodies: Vec<Vec<u8>> = (0..k).map(|p| body(p, n)).collect();
    let body_mb = bodies[0].len() as f64 / (1 << 20) as f64;

    eprintln!("one push");
    let (one_s, one_mb, one_stored) = run(dir.path(), "one", &bodies[..1]);
    assert_eq!(one_stored, n);
    eprintln!("{k} pushes at once");
    let (all_s, all_mb, all_stored) = run(dir.path(), "many", &bodies);
    assert_eq!(all_stored, n * k);

    let report = json!({
        "facts_per_push": n,
        "body_mb": body_mb,
        "one_push": {"seconds": one_s, "server_peak_mb": one_mb},
        "concurrent_pushes": k,
        "concurrent": {"seconds": all_s, "server_peak_mb": all_mb},
    });
    println!("{}", serde_json::to_string_pretty(&report).unwrap());
    let ok = one_mb < MEMORY_LIMIT_MB && all_mb < MEMORY_LIMIT_MB;
    println!(
        "{} server peak memory < {MEMORY_LIMIT_MB} MB under 1 and {k} concurrent pushes",
        if ok { "met   " } else { "MISSED" }
    );
    if let Some(parent) = out_path.parent() {
        let _ = std::fs::create_dir_all(parent);
    }
    std::fs::write(&out_path, serde_json::to_vec_pretty(&report).unwrap()).unwrap();
}
